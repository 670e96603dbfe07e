/*
 * test_metrics.c — pkv_metrics_text and the /metrics endpoint (src/metrics.c,
 * src/metrics_http.c, docs/metrics.md).
 *
 * Specifications: the text is valid exposition format 0.0.4 as a strict reader
 * (prom_text.c) sees it and as promtool sees it; every value equals what
 * pkv_get_stats / pkv_get_recovery say after a known workload; the histograms
 * count what they claim (one group-commit observation per group commit, one
 * checkpoint observation per checkpoint); a short buffer gets PKV_ERANGE and the
 * exact size; the call allocates nothing; label values are escaped; the endpoint
 * serves GET /metrics and nothing else.
 */
#include "http_get.h"
#include "pkv_config.h"
#include "pkv_test.h"
#include "prom_text.h"

#include <errno.h>
#include <iconv.h>
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(metrics, .init = pt_setup, .fini = pt_teardown);

/* Allocation counting: this executable's malloc family interposes the process's
 * (the library's calls included) and forwards to glibc's, counting the calls of
 * a thread that asked for it. Not in sanitizer builds, which replace malloc
 * themselves; render_allocates_nothing probes that counting works and skips
 * where it does not (e.g. a tool that intercepts these symbols too). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PKV_NO_MALLOC_COUNT 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PKV_NO_MALLOC_COUNT 1
#endif
static _Thread_local volatile int counting; /* volatile: the compiler assumes malloc
                                               touches no user memory */
static _Thread_local volatile unsigned long allocs;
#ifndef PKV_NO_MALLOC_COUNT
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t k);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t a, size_t n);
void *malloc(size_t n) {
    allocs += counting;
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t k) {
    allocs += counting;
    return __libc_calloc(n, k);
}
void *realloc(void *p, size_t n) {
    allocs += counting;
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t a, size_t n) {
    allocs += counting;
    return __libc_memalign(a, n);
}
int posix_memalign(void **out, size_t a, size_t n) {
    allocs += counting;
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif

static char text[1 << 16];

/* Render and parse strictly (asserting both). */
static void render(pkv_cache *c, pm_doc *d) {
    size_t need = 0;
    PT_OK(pkv_metrics_text(c, text, sizeof text, &need));
    cr_assert_eq(need, strlen(text) + 1, "needed %zu for %zu bytes of text", need, strlen(text));
    int rc = pm_parse(text, d);
    cr_assert_eq(rc, 0, "invalid exposition text: %s\n%s", d->err, text);
}

static double val(const pm_doc *d, const char *name, const char *labels) {
    const pm_sample *s = pm_find(d, name, labels);
    cr_assert_not_null(s, "no sample %s{%s}", name, labels ? labels : "");
    return s->v;
}

static void expect_at(int line, const pm_doc *d, const char *name, const char *labels,
                      uint64_t want) {
    double v = val(d, name, labels);
    cr_assert_eq(v, (double)want, "line %d: %s{%s} = %.17g, expected %llu", line, name,
                 labels ? labels : "", v, (unsigned long long)want);
}
#define EXPECT(d, name, labels, want) expect_at(__LINE__, (d), (name), (labels), (want))

/* A workload that moves every counter: prefix hits, a fork (shared blocks),
 * copy-on-write, closes, evictions, a checkpoint. Returns tokens appended. */
static uint64_t workload(pkv_cache *c) {
    uint32_t a[64], b[64];
    for (uint32_t i = 0; i < 64; i++) a[i] = b[i] = 100 + i;
    uint64_t appended = 0;
    PT_SEQ_OPEN(c, 1, 0, a, 13);
    PT_APPEND(c, 1, 0, a, 0, 13);
    appended += 13;
    PT_OK(pkv_seq_commit(c, 1, 13));
    PT_OK(pkv_seq_close(c, 1));
    size_t hit = PT_SEQ_OPEN(c, 2, 0, a, 13); /* 12 tokens, 3 blocks hit */
    cr_assert_eq(hit, 12);
    PT_APPEND(c, 2, 0, a, 12, 1);
    appended += 1;
    PT_OK(pkv_seq_commit(c, 2, 1));
    PT_OK(pkv_seq_fork(c, 2, 3));
    b[13] = 7;
    PT_APPEND(c, 3, 0, b, 13, 1); /* the shared partial block is copied */
    appended += 1;
    PT_OK(pkv_seq_commit(c, 3, 1));
    PT_OK(pkv_seq_close(c, 2));
    PT_OK(pkv_seq_close(c, 3)); /* its 3 sealed blocks are cached */
    /* a long sequence of other tokens (15 of the 16 blocks): evicts cached ones */
    uint32_t big[64];
    for (uint32_t i = 0; i < 64; i++) big[i] = 5000 + i;
    PT_SEQ_OPEN(c, 4, 9, big, 60);
    PT_APPEND(c, 4, 9, big, 0, 60);
    appended += 60;
    PT_OK(pkv_seq_commit(c, 4, 60));
    PT_OK(pkv_sync(c));
    PT_OK(pkv_checkpoint(c));
    return appended;
}

Test(metrics, values_equal_stats_after_a_known_workload) {
    pkv_cache *c = pt_open(4, 16);
    uint64_t appended = workload(c);
    pkv_stats st = pt_stats(c);
    pm_doc d;
    render(c, &d);
    cr_assert(st.evictions > 0 && st.cow_copies > 0 && st.hit_tokens > 0 && st.checkpoints > 0,
              "the workload moves the counters: evictions %llu cow %llu hits %llu ckpts %llu",
              (unsigned long long)st.evictions, (unsigned long long)st.cow_copies,
              (unsigned long long)st.hit_tokens, (unsigned long long)st.checkpoints);
    EXPECT(&d, "pagedkv_capacity_blocks", NULL, st.capacity);
    EXPECT(&d, "pagedkv_blocks", "state=free", st.blocks_free);
    EXPECT(&d, "pagedkv_blocks", "state=cached", st.blocks_cached);
    EXPECT(&d, "pagedkv_blocks", "state=used", st.blocks_used);
    EXPECT(&d, "pagedkv_sealed_blocks", NULL, st.blocks_sealed);
    EXPECT(&d, "pagedkv_sequences", NULL, st.sequences);
    EXPECT(&d, "pagedkv_prefix_cache_queries_total", NULL, st.hit_tokens + st.miss_tokens);
    EXPECT(&d, "pagedkv_prefix_cache_hits_total", NULL, st.hit_tokens);
    EXPECT(&d, "pagedkv_prefix_cache_block_queries_total", NULL, st.hit_blocks + st.miss_blocks);
    EXPECT(&d, "pagedkv_prefix_cache_block_hits_total", NULL, st.hit_blocks);
    EXPECT(&d, "pagedkv_tokens_appended_total", NULL, appended);
    EXPECT(&d, "pagedkv_evictions_total", NULL, st.evictions);
    EXPECT(&d, "pagedkv_cow_copies_total", NULL, st.cow_copies);
    EXPECT(&d, "pagedkv_dedupes_total", NULL, st.dedupes);
    EXPECT(&d, "pagedkv_seals_total", NULL, st.seals);
    EXPECT(&d, "pagedkv_verify_failures_total", NULL, st.verify_failures);
    EXPECT(&d, "pagedkv_wal_records_total", NULL, st.wal_records);
    EXPECT(&d, "pagedkv_wal_bytes_total", NULL, st.wal_bytes);
    EXPECT(&d, "pagedkv_wal_frames_total", NULL, st.wal_frames);
    EXPECT(&d, "pagedkv_wal_syncs_total", NULL, st.wal_syncs);
    EXPECT(&d, "pagedkv_log_waits_total", "reason=limbo", st.waits_limbo);
    EXPECT(&d, "pagedkv_log_waits_total", "reason=seal", st.waits_seal);
    EXPECT(&d, "pagedkv_log_waits_total", "reason=backlog", st.waits_backlog);
    EXPECT(&d, "pagedkv_limbo_blocks", NULL, st.blocks_limbo);
    EXPECT(&d, "pagedkv_wal_last_lsn", NULL, st.last_lsn);
    EXPECT(&d, "pagedkv_wal_durable_lsn", NULL, st.durable_lsn);
    EXPECT(&d, "pagedkv_checkpoints_total", NULL, st.checkpoints);
    EXPECT(&d, "pagedkv_checkpoint_deltas_total", NULL, st.checkpoint_deltas);
    EXPECT(&d, "pagedkv_checkpoint_lsn", NULL, st.checkpoint_lsn);
    EXPECT(&d, "pagedkv_failed", NULL, 0);
    EXPECT(&d, "pagedkv_gpu_handles", NULL, 0);
    EXPECT(&d, "pagedkv_gpu_mode", "mode=none", 1);
    EXPECT(&d, "pagedkv_gpu_mode", "mode=registered", 0);
    /* the refcount total is the number of block-table entries */
    uint64_t ids[8];
    size_t n = 0, refs = 0;
    PT_OK(pkv_seq_list(c, ids, 8, &n));
    for (size_t i = 0; i < n; i++) refs += PT_SEQ_INFO(c, ids[i]).n_blocks;
    EXPECT(&d, "pagedkv_block_refs", NULL, refs);
    /* GROUP mode: every frame is one synced group commit, observed once */
    EXPECT(&d, "pagedkv_wal_group_commit_delay_seconds_count", NULL, st.wal_frames);
    EXPECT(&d, "pagedkv_checkpoint_duration_seconds_count", NULL, st.checkpoints);
    double syncs = val(&d, "pagedkv_wal_sync_duration_seconds_count", NULL);
    cr_assert(syncs >= (double)st.wal_frames && syncs <= (double)st.wal_syncs,
              "log syncs timed %g: between frames %llu and syncs %llu", syncs,
              (unsigned long long)st.wal_frames, (unsigned long long)st.wal_syncs);
    /* the largest delay lies in the bucket range the histogram puts it in */
    double maxd = val(&d, "pagedkv_wal_group_commit_delay_max_seconds", NULL);
    cr_assert(fabs(maxd - st.wal_max_delay_us / 1e6) < 1e-9);
    cr_assert(val(&d, "pagedkv_wal_group_commit_delay_seconds_sum", NULL) <=
              maxd * (double)st.wal_frames + 1e-6);
    cr_assert(val(&d, "pagedkv_checkpoint_written_bytes_total", NULL) > 64,
              "a checkpoint file has a 64-byte header and a body");
    pm_free(&d);
}

Test(metrics, recovery_gauges_describe_the_last_open) {
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    PT_OK(pkv_seq_close(c, 4));
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    PT_SEQ_OPEN(c, 50, 0, t, 8); /* records after the checkpoint: replayed */
    PT_APPEND(c, 50, 0, t, 0, 8);
    PT_OK(pkv_seq_commit(c, 50, 8));
    pt_close(c);
    c = pt_open(4, 16);
    pkv_recovery r;
    PT_OK(pkv_get_recovery(c, &r));
    cr_assert(r.records_replayed > 0 && r.blocks_sealed > 0);
    pm_doc d;
    render(c, &d);
    EXPECT(&d, "pagedkv_recovery_records_replayed", NULL, r.records_replayed);
    EXPECT(&d, "pagedkv_recovery_blocks_recovered", NULL, r.blocks_sealed);
    EXPECT(&d, "pagedkv_recovery_sequences_recovered", NULL, r.sequences);
    EXPECT(&d, "pagedkv_recovery_repaired", NULL, r.repaired ? 1 : 0);
    /* the refcount total, rebuilt by recovery: the recovered tables' entries */
    uint64_t ids[8];
    size_t nseq = 0, refs = 0;
    PT_OK(pkv_seq_list(c, ids, 8, &nseq));
    cr_assert(nseq > 0, "sequences were recovered");
    for (size_t i = 0; i < nseq; i++) refs += PT_SEQ_INFO(c, ids[i]).n_blocks;
    cr_assert(refs > 0);
    EXPECT(&d, "pagedkv_block_refs", NULL, refs);
    const char *ph[4] = {"phase=checkpoint", "phase=replay", "phase=rebuild", "phase=verify"};
    double ms[4] = {r.ms_checkpoint, r.ms_replay, r.ms_rebuild, r.ms_verify};
    for (int i = 0; i < 4; i++) {
        double v = val(&d, "pagedkv_recovery_duration_seconds", ph[i]);
        cr_assert(fabs(v - ms[i] / 1e3) < 1e-8, "%s: %.9f s vs %.6f ms", ph[i], v, ms[i]);
    }
    /* counters restart at the open; the carried totals are pkv_stats' values */
    pkv_stats st = pt_stats(c);
    cr_assert(st.seals > 0 && st.hit_tokens > 0, "a checkpoint carried the counters");
    EXPECT(&d, "pagedkv_seals_total", NULL, 0);
    EXPECT(&d, "pagedkv_prefix_cache_hits_total", NULL, 0);
    EXPECT(&d, "pagedkv_prefix_cache_queries_total", NULL, 0);
    EXPECT(&d, "pagedkv_evictions_total", NULL, 0);
    EXPECT(&d, "pagedkv_tokens_appended_total", NULL, 0);
    EXPECT(&d, "pagedkv_since_creation_seals", NULL, st.seals);
    EXPECT(&d, "pagedkv_since_creation_prefix_cache_hits", NULL, st.hit_tokens);
    EXPECT(&d, "pagedkv_since_creation_prefix_cache_queries", NULL, st.hit_tokens + st.miss_tokens);
    EXPECT(&d, "pagedkv_since_creation_evictions", NULL, st.evictions);
    EXPECT(&d, "pagedkv_since_creation_cow_copies", NULL, st.cow_copies);
    /* and count from there */
    uint32_t u[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    PT_SEQ_OPEN(c, 60, 0, u, 9); /* 8 tokens hit (seq 50's blocks) */
    pm_free(&d);
    render(c, &d);
    EXPECT(&d, "pagedkv_prefix_cache_hits_total", NULL, 8);
    EXPECT(&d, "pagedkv_prefix_cache_queries_total", NULL, 9);
    EXPECT(&d, "pagedkv_since_creation_prefix_cache_hits", NULL, st.hit_tokens + 8);
    pm_free(&d);
}

Test(metrics, short_buffer_gets_erange_and_the_exact_size) {
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    size_t need = 0, need2 = 0;
    PT_ERR(pkv_metrics_text(c, NULL, 0, &need), PKV_ERANGE);
    cr_assert(need > 1000, "needed %zu", need);
    char *b = malloc(need);
    PT_ERR(pkv_metrics_text(c, b, need - 1, &need2), PKV_ERANGE);
    cr_assert_eq(need2, need);
    cr_assert_eq(b[0], '\0', "a refused buffer holds an empty string");
    PT_OK(pkv_metrics_text(c, b, need, &need2));
    cr_assert_eq(need2, need);
    cr_assert_eq(strlen(b) + 1, need);
    PT_OK(pkv_metrics_text(c, b, need, NULL));
    free(b);
    PT_ERR(pkv_metrics_text(NULL, text, sizeof text, &need), PKV_EINVAL);
    PT_ERR(pkv_metrics_text(c, NULL, 10, &need), PKV_EINVAL);
}

Test(metrics, render_allocates_nothing) {
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    PT_OK(pkv_metrics_text(c, text, sizeof text, NULL));
    /* count this thread's malloc-family calls, freed or not */
    counting = 1;
    allocs = 0;
    void *volatile probe = malloc(16); /* the probe (volatile: not elided) */
    free(probe);
    unsigned long probe_allocs = allocs;
    allocs = 0;
    int bad = 0; /* no assertion inside: Criterion allocates for each one */
    for (int i = 0; i < 200; i++) bad |= pkv_metrics_text(c, text, sizeof text, NULL);
    counting = 0;
    unsigned long n = allocs;
    cr_assert_eq(bad, 0);
    if (probe_allocs != 1) {
        cr_skip_test("malloc calls cannot be counted in this build (sanitizer or tool)");
        return;
    }
    cr_assert_eq(n, 0ul, "pkv_metrics_text made %lu allocations in 200 calls", n);
}

Test(metrics, label_values_are_escaped) {
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, 4, PKV_F32, 8);
    const char *id = "we\"ird\\model\nv2";
    o.model_id = id;
    pkv_cache *c = pt_open_sub("esc", &o);
    pm_doc d;
    render(c, &d);
    cr_assert_not_null(strstr(text, "model_id=\"we\\\"ird\\\\model\\nv2\""), "%s", text);
    char want[256];
    snprintf(want, sizeof want,
             "version=" PKV_VERSION_STRING ",model_id=%s,durability=group,read_only=false", id);
    EXPECT(&d, "pagedkv_info", want, 1);
    pm_free(&d);
}

Test(metrics, failed_cache_shows_failed_gauge) {
    pt_syncio io;
    pt_syncio_init(&io);
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, 4, PKV_F32, 8);
    o.io = &io.ops;
    pkv_cache *c = pt_open_sub("fail", &o);
    pm_doc d;
    render(c, &d);
    EXPECT(&d, "pagedkv_failed", NULL, 0);
    pm_free(&d);
    uint32_t t[4] = {1, 2, 3, 4};
    PT_SEQ_OPEN(c, 1, 0, t, 4);
    pt_syncio_fail(&io, EIO);
    PT_ERR(pkv_sync(c), PKV_EFAILED);
    render(c, &d);
    EXPECT(&d, "pagedkv_failed", NULL, 1);
    pm_free(&d);
    pt_syncio_fail(&io, 0);
    pt_close(c); /* before io goes out of scope */
}

/* The strict reader itself: it must refuse what the format forbids, or the
 * tests above prove nothing. */
Test(metrics, strict_reader_refuses_invalid_text) {
    static const char *const bad[] = {
        "# HELP a_total x\n# TYPE a_total counter\na_total 1", /* no final newline */
        "# HELP a x\n# TYPE a gauge\na 1\n# HELP a x\n# TYPE a gauge\na 2\n", /* family twice */
        "# TYPE a gauge\na 1\n",                                 /* no HELP */
        "# HELP a_total x\n# TYPE a_total counter\na 1\n",        /* sample of another name */
        "# HELP a x\n# TYPE a counter\na 1\n",                    /* counter without _total */
        "# HELP a x\n# TYPE a gauge\na{l=\"\\t\"} 1\n",            /* bad escape */
        "# HELP a x\n# TYPE a gauge\na 1x\n",                     /* bad value */
        "# HELP a x\n# TYPE a gauge\na 1\na 2\n",                 /* duplicate sample */
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
        "h_sum 1\nh_count 1\n",                                   /* not cumulative */
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
        "h_sum 1\nh_count 3\n",                                   /* count != +Inf */
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", /* no +Inf */
        "# HELP a x\n# TYPE a gauge\n\na 1\n",                    /* blank line */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pm_doc d;
        cr_assert_neq(pm_parse(bad[i], &d), 0, "accepted invalid text %zu:\n%s", i, bad[i]);
    }
    pm_doc d;
    cr_assert_eq(pm_parse("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                          "h_bucket{le=\"+Inf\"} 2\nh_sum 1.5\nh_count 2\n", &d), 0, "%s", d.err);
    pm_free(&d);
}

/* promtool (Debian's prometheus package) checks the text too; required in CI. */
/* Whether s is well-formed UTF-8, by iconv (glibc's decoder, not ours). */
static bool valid_utf8(const char *s) {
    iconv_t cd = iconv_open("UTF-8", "UTF-8");
    cr_assert(cd != (iconv_t)-1);
    char out[1 << 16];
    char *in = (char *)s, *o = out;
    size_t nin = strlen(s), nout = sizeof out;
    size_t r = iconv(cd, &in, &nin, &o, &nout);
    iconv_close(cd);
    return r != (size_t)-1 && nin == 0;
}

/* The exposition format requires UTF-8 label values (Prometheus and promtool
 * refuse the whole text otherwise) and has no escape for other bytes, while a
 * model_id is any bytes: each byte that is not part of a well-formed sequence is
 * rendered as U+FFFD, well-formed multi-byte characters as they are. */
Test(metrics, label_values_are_valid_utf8) {
    static const struct {
        const char *id, *want;
    } cases[] = {
        {"caf\xC3\xA9-\xF0\x9F\x98\x80", "caf\xC3\xA9-\xF0\x9F\x98\x80"},
        {"bad\xFF\xFEid", "bad\xEF\xBF\xBD\xEF\xBF\xBDid"},
        {"over\xC0\xAFlong", "over\xEF\xBF\xBD\xEF\xBF\xBDlong"},
        {"sur\xED\xA0\x80", "sur\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"big\xF4\x90\x80\x80", "big\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"cut\xE2\x82", "cut\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"q\"\xE2\x82\\", "q\\\"\xEF\xBF\xBD\xEF\xBF\xBD\\\\"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pkv_options o;
        pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, 4, PKV_F32, 8);
        o.model_id = cases[i].id;
        char sub[32];
        snprintf(sub, sizeof sub, "utf8-%zu", i);
        pkv_cache *c = pt_open_sub(sub, &o);
        pm_doc d;
        render(c, &d);
        pm_free(&d);
        cr_assert(valid_utf8(text), "case %zu: the text is not UTF-8", i);
        char want[128];
        snprintf(want, sizeof want, "model_id=\"%s\",", cases[i].want);
        cr_assert_not_null(strstr(text, want), "case %zu: no %s in\n%s", i, want, text);
        pt_close(c);
    }
}

Test(metrics, promtool_accepts_the_text) {
    bool ci = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
    if (system("promtool --version >/dev/null 2>&1") != 0) {
        cr_assert(!ci, "promtool is required in CI (Debian package prometheus)");
        cr_skip_test("promtool not installed (Debian package prometheus)");
        return;
    }
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    PT_OK(pkv_metrics_text(c, text, sizeof text, NULL));
    char path[512], cmd[1200];
    pt_path(path, sizeof path, "metrics.txt");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0 && n == 0, "promtool: %s", out);
}

Test(metrics, endpoint_serves_get_metrics_only) {
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    pkv_metrics_server *srv = NULL;
    int rc = pkv_metrics_serve(c, "127.0.0.1:0", &srv);
    if (rc == PKV_ENOTSUP) {
        cr_skip_test("built without libmicrohttpd: %s", pkv_last_error());
        return;
    }
    PT_OK(rc);
    int port = pkv_metrics_port(srv);
    cr_assert(port > 0 && port < 65536);
    static char body[1 << 16];
    size_t blen = 0;
    cr_assert_eq(ht_request(port, "GET", "/metrics", body, sizeof body, &blen, 10000), 200);
    /* the cache is idle: the served text is the text */
    PT_OK(pkv_metrics_text(c, text, sizeof text, NULL));
    cr_assert_str_eq(body, text);
    cr_assert_eq(blen, strlen(text));
    cr_assert_eq(ht_request(port, "GET", "/", body, sizeof body, NULL, 10000), 404);
    cr_assert_eq(ht_request(port, "GET", "/metrics/x", body, sizeof body, NULL, 10000), 404);
    cr_assert_eq(ht_request(port, "POST", "/metrics", body, sizeof body, NULL, 10000), 405);
    cr_assert_eq(ht_request(port, "HEAD", "/metrics", body, sizeof body, &blen, 10000), 200);
    cr_assert_eq(blen, 0u, "HEAD has no body");
    /* the port is taken */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pkv_metrics_server *two = (pkv_metrics_server *)1;
    PT_ERR(pkv_metrics_serve(c, addr, &two), PKV_EIO);
    cr_assert_null(two);
    pkv_metrics_stop(srv);
    cr_assert_eq(ht_request(port, "GET", "/metrics", body, sizeof body, NULL, 2000), -1,
                 "stopped: nothing listens");
}

/* A server still running when its cache is closed answers 503 and never reads
 * the freed cache (without the detach in pkv_close, ASan reports a
 * use-after-free here and a plain build serves garbage or crashes); two
 * servers, one stopped before the close, one after. */
Test(metrics, a_server_outliving_its_cache_answers_503) {
    pkv_cache *c = pt_open(4, 16);
    (void)workload(c);
    pkv_metrics_server *a = NULL, *b = NULL;
    int rc = pkv_metrics_serve(c, "127.0.0.1:0", &a);
    if (rc == PKV_ENOTSUP) {
        cr_skip_test("built without libmicrohttpd: %s", pkv_last_error());
        return;
    }
    PT_OK(rc);
    PT_OK(pkv_metrics_serve(c, "127.0.0.1:0", &b));
    static char body[1 << 16];
    const int pa = pkv_metrics_port(a), pb = pkv_metrics_port(b);
    cr_assert_eq(ht_request(pb, "GET", "/metrics", body, sizeof body, NULL, 10000), 200);
    pkv_metrics_stop(a); /* unlinks itself from the cache */
    cr_assert_eq(ht_request(pa, "GET", "/metrics", body, sizeof body, NULL, 2000), -1);
    pt_close(c);
    cr_assert_eq(ht_request(pb, "GET", "/metrics", body, sizeof body, NULL, 10000), 503,
                 "a request after pkv_close");
    cr_assert(strstr(body, "closed") != NULL, "body: %s", body);
    pkv_metrics_stop(b);
}

/* libmicrohttpd's default select() loop refuses sockets numbered 1024
 * (FD_SETSIZE) or above; a server process may well hold that many files. */
Test(metrics, endpoint_serves_with_more_than_1024_files_open) {
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 1200) {
        cr_skip_test("RLIMIT_NOFILE hard limit %llu < 1200", (unsigned long long)rl.rlim_max);
        return;
    }
    struct rlimit old = rl;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1200) {
        rl.rlim_cur = 1200;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    pkv_cache *c = pt_open(4, 16);
    static int fds[1100];
    int nfd = 0;
    while (nfd < 1100) {
        int fd = dup(2);
        cr_assert(fd >= 0);
        fds[nfd++] = fd;
        if (fd >= 1100) break;
    }
    pkv_metrics_server *srv = NULL;
    int rc = pkv_metrics_serve(c, "127.0.0.1:0", &srv);
    if (rc == PKV_ENOTSUP) {
        for (int i = 0; i < nfd; i++) close(fds[i]);
        cr_skip_test("built without libmicrohttpd: %s", pkv_last_error());
        return;
    }
    cr_assert_eq(rc, 0, "%s", pkv_last_error());
    static char body[1 << 16];
    cr_assert_eq(ht_request(pkv_metrics_port(srv), "GET", "/metrics", body, sizeof body, NULL,
                            10000),
                 200);
    pkv_metrics_stop(srv);
    for (int i = 0; i < nfd; i++) close(fds[i]);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
}

Test(metrics, serve_refuses_bad_addresses) {
    pkv_cache *c = pt_open(4, 16);
    static const char *const bad[] = {"", "127.0.0.1", ":80", "127.0.0.1:", "127.0.0.1:x",
                                      "127.0.0.1:70000", "localhost:80", "1.2.3:80",
                                      "127.0.0.1:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pkv_metrics_server *s = (pkv_metrics_server *)1;
        PT_ERR(pkv_metrics_serve(c, bad[i], &s), PKV_EINVAL);
        cr_assert_null(s, "%s", bad[i]);
    }
    pkv_metrics_server *s = NULL;
    PT_ERR(pkv_metrics_serve(NULL, "127.0.0.1:0", &s), PKV_EINVAL);
    PT_ERR(pkv_metrics_serve(c, NULL, &s), PKV_EINVAL);
    PT_ERR(pkv_metrics_serve(c, "127.0.0.1:0", NULL), PKV_EINVAL);
    PT_ERR(pkv_metrics_port(NULL), PKV_EINVAL);
    PT_ERR(pkv_metrics_serve_cuda(NULL, NULL), PKV_EINVAL);
    pkv_metrics_stop(NULL);
}

Test(metrics, cuda_text_needs_a_handle) {
    /* as every CUDA-layer call: ENOTSUP whatever the arguments without the layer */
    PT_ERR(pkv_cuda_metrics_text(NULL, text, sizeof text, NULL),
           PKV_WITH_CUDA ? PKV_EINVAL : PKV_ENOTSUP);
}

/* docs/metrics.md names every family the text has, and every pagedkv_* name the
 * dashboard and the plot script use is one it names (so neither refers to a
 * metric that does not exist). */
static char *slurp_src(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", PKV_SOURCE_DIR, rel);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* `name` in backquotes in the doc, alone or as the start of a `name{labels}` or
 * of a `name`, `_suffix` list (the doc abbreviates families sharing a prefix). */
static bool doc_names(const char *doc, const char *name) {
    char pat[256];
    snprintf(pat, sizeof pat, "`%s`", name);
    if (strstr(doc, pat)) return true;
    snprintf(pat, sizeof pat, "`%s{", name);
    if (strstr(doc, pat)) return true;
    /* abbreviated: "`pagedkv_since_creation_prefix_cache_queries`, `_hits`" */
    for (const char *u = strchr(name, '_'); u; u = strchr(u + 1, '_')) {
        snprintf(pat, sizeof pat, "`%s`", u);
        const char *hit = strstr(doc, pat);
        if (!hit) continue;
        /* the line must also name the prefix */
        const char *ls = hit;
        while (ls > doc && ls[-1] != '\n') ls--;
        size_t plen = (size_t)(u - name);
        for (const char *q = ls; q < hit; q++)
            if (*q == '`' && strncmp(q + 1, name, plen) == 0) return true;
    }
    return false;
}

static void names_documented(const char *doc, const char *src, const char *what) {
    for (const char *p = strstr(src, "pagedkv_"); p; p = strstr(p + 1, "pagedkv_")) {
        if (p > src && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'))) continue;
        char name[128];
        size_t n = 0;
        while (n + 1 < sizeof name && ((p[n] >= 'a' && p[n] <= 'z') || p[n] == '_' ||
                                       (p[n] >= '0' && p[n] <= '9')))
            name[n] = p[n], n++;
        name[n] = '\0';
        if (strcmp(name, "pagedkv_") == 0 || strcmp(name, "pagedkv_job") == 0) continue;
        /* histogram parts name their family */
        static const char *const parts[] = {"_bucket", "_sum", "_count"};
        for (int i = 0; i < 3; i++) {
            size_t l = strlen(parts[i]);
            if (n > l && strcmp(name + n - l, parts[i]) == 0 && !doc_names(doc, name)) {
                name[n - l] = '\0';
                break;
            }
        }
        cr_assert(doc_names(doc, name), "%s uses %s, which docs/metrics.md does not list", what,
                  name);
    }
}

Test(metrics, docs_list_every_metric_the_text_dashboard_and_plots_use) {
    char *doc = slurp_src("docs/metrics.md");
    pkv_cache *c = pt_open(4, 16);
    pm_doc d;
    render(c, &d);
    for (size_t i = 0; i < d.n; i++) {
        char fam[128];
        snprintf(fam, sizeof fam, "%s", d.s[i].name);
        static const char *const parts[] = {"_bucket", "_sum", "_count"};
        for (int k = 0; k < 3; k++) {
            size_t l = strlen(parts[k]), n = strlen(fam);
            if (n > l && strcmp(fam + n - l, parts[k]) == 0 && !doc_names(doc, fam)) {
                fam[n - l] = '\0';
                break;
            }
        }
        cr_assert(doc_names(doc, fam), "docs/metrics.md does not list %s", fam);
    }
    pm_free(&d);
    char *dash = slurp_src("docs/grafana/pagedkv.json");
    names_documented(doc, dash, "docs/grafana/pagedkv.json");
    char *plot = slurp_src("scripts/metrics-plot.sh");
    names_documented(doc, plot, "scripts/metrics-plot.sh");
    free(dash);
    free(plot);
    free(doc);
}
