/*
 * test_prometheus.c — a real Prometheus server (Debian's prometheus package)
 * scrapes the library's /metrics endpoint while a workload runs; its HTTP API
 * must then report what pkv_get_stats says.
 *
 * The server runs on loopback with a temporary config and storage directory and
 * a 1 s scrape interval, and is stopped (SIGTERM, then SIGKILL) by the fixture
 * whatever the test's outcome. Every wait has a deadline; without a prometheus
 * binary the test skips, except when CI=true (scripts/test.sh), where that is an
 * error, as a missing model file is.
 */
#include "http_get.h"
#include "pkv_test.h"
#include "prom_text.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t prom_pid = -1;
static pkv_metrics_server *srv;

static void fini(void) {
    if (prom_pid > 0) {
        kill(prom_pid, SIGTERM);
        for (int i = 0; i < 100; i++) { /* 5 s for a clean shutdown */
            if (waitpid(prom_pid, NULL, WNOHANG) == prom_pid) {
                prom_pid = -1;
                break;
            }
            usleep(50000);
        }
        if (prom_pid > 0) {
            kill(prom_pid, SIGKILL);
            waitpid(prom_pid, NULL, 0);
            prom_pid = -1;
        }
    }
    pkv_metrics_stop(srv); /* before pt_teardown closes the cache */
    srv = NULL;
    pt_teardown();
}

TestSuite(prometheus, .init = pt_setup, .fini = fini);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A port nothing listens on right now (http_get.c). */
static int free_port(void) {
    const int port = ht_free_port();
    cr_assert(port > 0, "no free loopback port");
    return port;
}

static void print_log(const char *log) {
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[1024];
    fprintf(stderr, "---- prometheus log ----\n");
    while (fgets(line, sizeof line, f)) fputs(line, stderr);
    fclose(f);
}

/* One instant query; true and *v when the result holds exactly one sample. */
static bool query(int port, const char *promql, double *v) {
    char enc[1024], path[1200];
    static char body[1 << 16];
    ht_urlencode(promql, enc, sizeof enc);
    snprintf(path, sizeof path, "/api/v1/query?query=%s", enc);
    if (ht_request(port, "GET", path, body, sizeof body, NULL, 5000) != 200) {
        fprintf(stderr, "query %s: %s\n", promql, body);
        return false;
    }
    if (!strstr(body, "\"status\":\"success\"")) return false;
    const char *a = strstr(body, "\"value\":[");
    if (!a || strstr(a + 1, "\"value\":[")) return false; /* none, or several */
    const char *q = strstr(a, ",\"");
    if (!q) return false;
    char *end;
    *v = strtod(q + 2, &end);
    return end != q + 2 && *end == '"';
}

/* Does Prometheus accept the query (HTTP 200, status success)? *why gets its answer. */
static bool query_valid(int port, const char *promql, char *why, size_t cap) {
    char enc[2048], path[2200];
    ht_urlencode(promql, enc, sizeof enc);
    snprintf(path, sizeof path, "/api/v1/query?query=%s", enc);
    int st = ht_request(port, "GET", path, why, cap, NULL, 5000);
    return st == 200 && strstr(why, "\"status\":\"success\"");
}

/* Every "expr" of docs/grafana/pagedkv.json, unescaped, with Grafana's
 * $__rate_interval replaced by a duration: f(expr) for each; returns the count. */
static int dashboard_exprs(void (*f)(const char *expr, void *arg), void *arg) {
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/grafana/pagedkv.json", PKV_SOURCE_DIR);
    FILE *fp = fopen(path, "r");
    cr_assert_not_null(fp, "cannot read %s", path);
    static char json[1 << 17];
    size_t n = fread(json, 1, sizeof json - 1, fp);
    fclose(fp);
    json[n] = '\0';
    int count = 0;
    for (const char *p = strstr(json, "\"expr\": \""); p; p = strstr(p, "\"expr\": \"")) {
        p += strlen("\"expr\": \"");
        char e[2048];
        size_t k = 0;
        for (; *p && *p != '"' && k + 8 < sizeof e; p++) {
            if (*p == '\\') p++; /* \" and \\ */
            if (*p == '$' && strncmp(p, "$__rate_interval", 16) == 0) {
                memcpy(e + k, "5s", 2);
                k += 2;
                p += 15;
                continue;
            }
            e[k++] = *p;
        }
        e[k] = '\0';
        f(e, arg);
        count++;
    }
    return count;
}

static void expr_valid(const char *expr, void *arg) {
    int port = *(int *)arg;
    static char why[4096];
    cr_assert(query_valid(port, expr, why, sizeof why), "Prometheus refuses the dashboard's %s: %s",
              expr, why);
}

/* Wait until the query returns `want` (the scrape after the workload ended). */
static void expect_eventually(int port, const char *promql, double want, double deadline,
                              const char *log) {
    double v = NAN;
    bool got = false;
    while (now_s() < deadline) {
        got = query(port, promql, &v);
        if (got && v == want) return;
        usleep(200000);
    }
    print_log(log);
    cr_assert(false, "Prometheus: %s = %s%.17g, expected %.17g", promql, got ? "" : "(no result) ",
              v, want);
}

/* histogram_quantile's rule (Prometheus promql/quantile.go) on cumulative buckets. */
static double quantile(double q, const double *le, const double *cum, int n) {
    double count = cum[n - 1], rank = q * count;
    int b = 0;
    while (b < n - 1 && cum[b] < rank) b++;
    if (isinf(le[b])) return le[n - 2];
    double lo = b ? le[b - 1] : 0, below = b ? cum[b - 1] : 0;
    if (b == 0 && le[0] <= 0) return le[0];
    return lo + (le[b] - lo) * (rank - below) / (cum[b] - below);
}

Test(prometheus, scraped_values_equal_pkv_stats) {
    bool ci = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
    if (system("prometheus --version >/dev/null 2>&1") != 0) {
        cr_assert(!ci, "prometheus is required in CI (Debian package prometheus)");
        cr_skip_test("prometheus not installed (Debian package prometheus)");
        return;
    }
    pkv_cache *c = pt_open(16, 256);
    int rc = pkv_metrics_serve(c, "127.0.0.1:0", &srv);
    if (rc == PKV_ENOTSUP) {
        cr_assert(!ci, "CI needs the /metrics endpoint (libmicrohttpd-dev)");
        cr_skip_test("built without libmicrohttpd");
        return;
    }
    PT_OK(rc);
    const int mport = pkv_metrics_port(srv);
    int pport = 0;

    char dir[512], cfg[600], data[600], log[600], listen[64], cfgarg[700];
    pt_path(dir, sizeof dir, "prom");
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(cfg, sizeof cfg, "%s/prometheus.yml", dir);
    snprintf(data, sizeof data, "--storage.tsdb.path=%s/data", dir);
    snprintf(log, sizeof log, "%s/prometheus.log", dir);
    snprintf(cfgarg, sizeof cfgarg, "--config.file=%s", cfg);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: pagedkv\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n",
            mport);
    fclose(f);
    /* Its port is free when chosen but could be taken before it binds: a start
     * that fails is retried on another port, twice. */
    for (int attempt = 0;; attempt++) {
        pport = free_port();
        snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", pport);
        prom_pid = fork();
        cr_assert(prom_pid >= 0);
        if (prom_pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execlp("prometheus", "prometheus", cfgarg, data, listen, "--log.level=warn",
                   "--storage.tsdb.retention.time=1h", (char *)NULL);
            _exit(127);
        }
        const double t0 = now_s();
        static char body[4096];
        int st = 0;
        bool exited = false;
        while (ht_request(pport, "GET", "/-/ready", body, sizeof body, NULL, 1000) != 200) {
            if (waitpid(prom_pid, &st, WNOHANG) == prom_pid) {
                exited = true;
                prom_pid = -1;
                break;
            }
            if (now_s() - t0 > 15) {
                print_log(log);
                cr_assert(false, "prometheus not ready within 15 s");
            }
            usleep(100000);
        }
        if (!exited) break;
        if (attempt == 2) {
            print_log(log);
            cr_assert(!ci, "prometheus exited at start (status %d), 3 times", st);
            cr_skip_test("prometheus could not start (see its log above)");
            return;
        }
    }

    /* Prometheus applies its first target list ~5 s after the start (its
     * discovery updates are throttled): the workload begins after the first
     * scrape, so that the scrapes see it move. */
    expect_eventually(pport, "up{job=\"pagedkv\"}", 1, now_s() + 20, log);

    /* The workload, ~3 s: conversations sharing a
     * system prompt (prefix hits), decoding one token per group commit. */
    uint32_t prompt[96];
    for (uint32_t i = 0; i < 96; i++) prompt[i] = 1000 + i;
    uint64_t id = 1;
    const double t_end = now_s() + 3.0;
    while (now_s() < t_end) {
        prompt[80] = (uint32_t)id; /* each conversation's own part */
        size_t n_cached = 0;
        PT_OK(pkv_seq_open(c, id, 0, prompt, 96, &n_cached));
        pkv_slot slots[96];
        PT_OK(pkv_seq_append(c, id, prompt + n_cached, 96 - n_cached, slots));
        PT_OK(pkv_seq_commit(c, id, 96 - n_cached));
        for (uint32_t t = 0; t < 20; t++) {
            uint32_t tok = 7 + t;
            pkv_slot s;
            PT_OK(pkv_seq_append(c, id, &tok, 1, &s));
            PT_OK(pkv_seq_commit(c, id, 1));
            usleep(2000);
        }
        if (id % 3) PT_OK(pkv_seq_close(c, id)); /* some stay open */
        id++;
    }
    PT_OK(pkv_sync(c));
    PT_OK(pkv_checkpoint(c));
    pkv_stats st = pt_stats(c);
    cr_assert(st.hit_tokens > 0 && st.wal_frames > 10, "hits %llu frames %llu",
              (unsigned long long)st.hit_tokens, (unsigned long long)st.wal_frames);
    /* the buckets as the endpoint serves them now (the cache is idle) */
    static char text[1 << 16];
    PT_OK(pkv_metrics_text(c, text, sizeof text, NULL));
    pm_doc d;
    cr_assert_eq(pm_parse(text, &d), 0, "%s", d.err);
    double le[14], cum[14];
    int nb = 0;
    for (size_t i = 0; i < d.n && nb < 14; i++)
        if (strcmp(d.s[i].name, "pagedkv_wal_group_commit_delay_seconds_bucket") == 0) {
            le[nb] = strtod(d.s[i].labels + 3, NULL);
            cum[nb++] = d.s[i].v;
        }
    pm_free(&d);
    cr_assert_eq(nb, 14);

    const double deadline = now_s() + 20;
    expect_eventually(pport, "pagedkv_prefix_cache_hits_total", (double)st.hit_tokens, deadline, log);
    expect_eventually(pport, "pagedkv_prefix_cache_queries_total",
                      (double)(st.hit_tokens + st.miss_tokens), deadline, log);
    expect_eventually(pport, "pagedkv_blocks{state=\"free\"}", (double)st.blocks_free, deadline, log);
    expect_eventually(pport, "pagedkv_blocks{state=\"cached\"}", (double)st.blocks_cached, deadline, log);
    expect_eventually(pport, "pagedkv_blocks{state=\"used\"}", (double)st.blocks_used, deadline, log);
    expect_eventually(pport, "pagedkv_sealed_blocks", (double)st.blocks_sealed, deadline, log);
    expect_eventually(pport, "pagedkv_checkpoints_total", (double)st.checkpoints, deadline, log);
    /* one observation per group commit (GROUP mode) */
    expect_eventually(pport, "pagedkv_wal_group_commit_delay_seconds_count",
                      (double)st.wal_frames, deadline, log);
    expect_eventually(pport, "pagedkv_wal_frames_total", (double)st.wal_frames, deadline, log);
    /* the quantiles Prometheus computes are those of the buckets served */
    const double p50 = quantile(0.5, le, cum, nb), p99 = quantile(0.99, le, cum, nb);
    double v;
    cr_assert(query(pport, "histogram_quantile(0.5, pagedkv_wal_group_commit_delay_seconds_bucket)", &v));
    cr_assert(fabs(v - p50) <= 1e-9 * fmax(1, p50), "p50: Prometheus %.9g, buckets %.9g", v, p50);
    cr_assert(query(pport, "histogram_quantile(0.99, pagedkv_wal_group_commit_delay_seconds_bucket)", &v));
    cr_assert(fabs(v - p99) <= 1e-9 * fmax(1, p99), "p99: Prometheus %.9g, buckets %.9g", v, p99);
    cr_assert(p50 > 0 && p99 <= 1 && p50 <= p99, "p50 %g p99 %g", p50, p99);
    /* every query of the dashboard is valid PromQL to this Prometheus */
    cr_assert(dashboard_exprs(expr_valid, (void *)&pport) >= 10);
    /* the scrapes saw the workload move: the hits rose over the run */
    cr_assert(query(pport, "count_over_time(pagedkv_prefix_cache_hits_total[1m])", &v));
    cr_assert(v >= 3, "%g scrapes", v);
    cr_assert(query(pport, "increase(pagedkv_prefix_cache_hits_total[1m])", &v));
    cr_assert(v > 0, "increase of hits %g", v);
}
