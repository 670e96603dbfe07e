/* pkv-demo (tools/pkv-demo.c), run as a program on a tiny workload: which cache
 * directory it uses, that it never empties one another process holds, that a
 * cache of another model is refused, and the real chat on the GGUF model named by
 * PKV_MODEL (skipped without it): identical answers cold and warm. */
#include "http_get.h"
#include "pkv_test.h"
#include "prom_text.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(demo, .init = pt_setup, .fini = pt_teardown, .timeout = 240);

extern char **environ;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    cr_assert_not_null(b);
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            b = realloc(b, cap);
            cr_assert_not_null(b);
        }
    }
    b[n] = '\0';
    fclose(f);
    return b;
}

typedef struct demo_run {
    pid_t pid;
    char out[600], err[600];
} demo_run;

static const char *const TINY[] = {"--preset", "tiny", "--users", "1", "--turns", "1",
                                   "--samples", "1", "--system-tokens", "64",
                                   "--message-tokens", "16-32", "--answer-tokens", "4",
                                   "--quiet", NULL};

/* Start pkv-demo with the `base` arguments then the `extra` ones, and TMPDIR=tmpdir
 * (when not NULL); `tag` names its output files. */
static void demo_start_with(demo_run *d, const char *tag, const char *tmpdir,
                            const char *const *base, const char *const *extra)
{
    const char *demo = getenv("PKV_DEMO");
    cr_assert(demo && *demo, "PKV_DEMO is not set (meson sets it to the built tools/pkv-demo)");
    const char *argv[48] = {demo};
    size_t n = 1;
    for (size_t i = 0; base[i] && n < 47; i++) argv[n++] = base[i];
    for (size_t i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    char tmpenv[600];
    const char *envp[256];
    size_t ne = 0;
    for (char **e = environ; *e && ne < 254; e++)
        if (strncmp(*e, "TMPDIR=", 7)) envp[ne++] = *e;
    if (tmpdir) {
        snprintf(tmpenv, sizeof tmpenv, "TMPDIR=%s", tmpdir);
        envp[ne++] = tmpenv;
    }
    envp[ne] = NULL;
    char name[64];
    snprintf(name, sizeof name, "%s.out", tag);
    pt_path(d->out, sizeof d->out, name);
    snprintf(name, sizeof name, "%s.err", tag);
    pt_path(d->err, sizeof d->err, name);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, d->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, d->err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = posix_spawn(&d->pid, demo, &fa, NULL, (char *const *)argv, (char *const *)envp);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(e, 0, "spawn %s: %s", demo, strerror(e));
}

/* The seeded tiny workload. */
static void demo_start(demo_run *d, const char *tag, const char *tmpdir, const char *const *extra)
{
    demo_start_with(d, tag, tmpdir, TINY, extra);
}

/* Wait for it: its exit status; *out and *err receive its output (malloc'd). */
static int demo_wait(demo_run *d, char **out, char **err)
{
    int st = 0;
    cr_assert_eq(waitpid(d->pid, &st, 0), d->pid);
    *out = slurp(d->out);
    *err = slurp(d->err);
    cr_assert(WIFEXITED(st), "pkv-demo died of signal %d; stderr:\n%s", WTERMSIG(st), *err);
    return WEXITSTATUS(st);
}

/* The directory named on the "cache directory: " line of the demo's output. */
static void cache_dir_of(const char *out, char *dir, size_t n)
{
    const char *p = strstr(out, "cache directory: ");
    cr_assert_not_null(p, "no 'cache directory:' line in:\n%s", out);
    p += strlen("cache directory: ");
    size_t k = strcspn(p, " \n");
    cr_assert(k < n);
    memcpy(dir, p, k);
    dir[k] = '\0';
}

static void write_exec(const char *path, const char *text);

static ino_t ino_of(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
    return st.st_ino;
}

Test(demo, refuses_to_empty_a_directory_another_process_holds)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, 4, PKV_F32, 16);
    pkv_cache *c = pt_open_sub("held", &o);
    char dir[512], arena[600], lock[600];
    pt_path(dir, sizeof dir, "held");
    snprintf(arena, sizeof arena, "%s/arena", dir);
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    const ino_t ia = ino_of(arena), il = ino_of(lock);
    demo_run d;
    demo_start(&d, "held", NULL, (const char *const[]){"--cache-dir", dir, NULL});
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 1, "exit %d\nstdout:\n%s\nstderr:\n%s", code, out, err);
    cr_assert(strstr(err, dir) && strstr(err, "in use") && strstr(err, "PKV_EBUSY"),
              "the refusal does not name the directory and PKV_EBUSY:\n%s", err);
    /* The holder's files are untouched, and it carries on. */
    cr_assert_eq(ino_of(arena), ia, "the holder's arena was replaced");
    cr_assert_eq(ino_of(lock), il, "the holder's LOCK was replaced");
    PT_CHECK(c);
    PT_SEQ_OPEN(c, 1, 0, NULL, 0);
    free(out);
    free(err);
}

Test(demo, each_run_gets_its_own_new_directory)
{
    char tmp[512];
    pt_path(tmp, sizeof tmp, "tmp");
    cr_assert_eq(mkdir(tmp, 0700), 0);
    /* Two demos at once, neither given --cache-dir: each its own directory under
     * TMPDIR, both succeed, and each removes its directory when done. */
    demo_run d[2];
    demo_start(&d[0], "a", tmp, NULL);
    demo_start(&d[1], "b", tmp, NULL);
    char dirs[2][512];
    for (int i = 0; i < 2; i++) {
        char *out, *err;
        int code = demo_wait(&d[i], &out, &err);
        cr_assert_eq(code, 0, "run %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, code, out, err);
        cache_dir_of(out, dirs[i], sizeof dirs[i]);
        cr_assert(!strncmp(dirs[i], tmp, strlen(tmp)) && strstr(dirs[i], "/pkv-demo-"),
                  "run %d used %s, not a new directory under TMPDIR %s", i, dirs[i], tmp);
        struct stat st;
        cr_assert(stat(dirs[i], &st) && errno == ENOENT, "run %d left %s behind", i, dirs[i]);
        free(out);
        free(err);
    }
    cr_assert_str_neq(dirs[0], dirs[1]);
    DIR *dp = opendir(tmp);
    cr_assert_not_null(dp);
    struct dirent *e;
    while ((e = readdir(dp)))
        cr_assert(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."), "left in TMPDIR: %s",
                  e->d_name);
    closedir(dp);
}

/* A run that fails leaves no empty directory behind in TMPDIR. */
Test(demo, a_failed_run_leaves_no_empty_directory)
{
    char tmp[512], file[512];
    pt_path(tmp, sizeof tmp, "tmp");
    cr_assert_eq(mkdir(tmp, 0700), 0);
    pt_path(file, sizeof file, "not-a-dir");
    write_exec(file, "x");
    demo_run d;
    demo_start(&d, "fail", tmp, (const char *const[]){"--arena-dir", file, NULL});
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 1, "exit %d\nstderr:\n%s", code, err);
    cr_assert(strstr(err, "is not a directory"), "%s", err);
    DIR *dp = opendir(tmp);
    cr_assert_not_null(dp);
    struct dirent *e;
    while ((e = readdir(dp)))
        cr_assert(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."), "left in TMPDIR: %s",
                  e->d_name);
    closedir(dp);
    free(out);
    free(err);
}

Test(demo, a_warm_run_alone_needs_a_cache_dir)
{
    demo_run d;
    demo_start(&d, "warm", NULL, (const char *const[]){"--run", "warm", NULL});
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 2, "exit %d\nstderr:\n%s", code, err);
    cr_assert(strstr(err, "--run warm needs --cache-dir"), "%s", err);
    free(out);
    free(err);
}

/* A cache is refused, not served, when the model differs: PKV_EMODEL named, with
 * the directory, even when the other model also has other sizes. */
static void expect_refused(const char *dir, const char *const *base, const char *const *extra)
{
    demo_run d;
    demo_start_with(&d, "refused", NULL, base, extra);
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 1, "exit %d\nstdout:\n%s\nstderr:\n%s", code, out, err);
    cr_assert(strstr(err, "PKV_EMODEL") && strstr(err, "another model") && strstr(err, dir),
              "the refusal does not say PKV_EMODEL, another model and the directory:\n%s", err);
    free(out);
    free(err);
}

static void cold_tiny(const char *dir)
{
    demo_run d;
    demo_start(&d, "cold", NULL, (const char *const[]){"--run", "cold", "--cache-dir", dir, NULL});
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 0, "exit %d\nstderr:\n%s", code, err);
    free(out);
    free(err);
}

/* A port nothing listens on right now (http_get.c). */
static int free_port(void)
{
    const int port = ht_free_port();
    cr_assert(port > 0, "no free loopback port");
    return port;
}

Test(demo, metrics_are_served_during_each_run)
{
    pkv_cache *probe = pt_open(4, 4);
    pkv_metrics_server *srv = NULL;
    if (pkv_metrics_serve(probe, "127.0.0.1:0", &srv) == PKV_ENOTSUP) {
        cr_skip_test("built without libmicrohttpd");
        return;
    }
    pkv_metrics_stop(srv);
    const int port = free_port();
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    demo_run d;
    demo_start(&d, "metrics", NULL,
               (const char *const[]){"--metrics", addr, "--metrics-linger", "2", NULL});
    /* Poll until a scrape shows a finished cold run's prompt lookups (each run
     * lingers 2 s with its final values), then until the warm run's hits. */
    static char body[1 << 16];
    bool cold_seen = false, warm_seen = false;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (ht_request(port, "GET", "/metrics", body, sizeof body, NULL, 2000) == 200) {
            pm_doc doc;
            cr_assert_eq(pm_parse(body, &doc), 0, "%s", doc.err);
            const pm_sample *q = pm_find(&doc, "pagedkv_prefix_cache_queries_total", NULL);
            const pm_sample *h = pm_find(&doc, "pagedkv_prefix_cache_hits_total", NULL);
            const pm_sample *r = pm_find(&doc, "pagedkv_recovery_blocks_recovered", NULL);
            cr_assert(q && h && r);
            if (q->v > 0 && r->v == 0) cold_seen = true;
            if (h->v > 0 && r->v > 0) warm_seen = true;
            pm_free(&doc);
        }
        usleep(100000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (!(cold_seen && warm_seen) && t.tv_sec - t0.tv_sec < 120);
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 0, "exit %d\nstderr:\n%s", code, err);
    cr_assert(cold_seen, "no scrape saw the cold run");
    cr_assert(warm_seen, "no scrape saw the warm run's hits on recovered blocks");
    free(out);
    free(err);
}

Test(demo, a_cache_of_another_preset_is_refused_with_PKV_EMODEL)
{
    char dir[512];
    pt_path(dir, sizeof dir, "tinycache");
    cold_tiny(dir);
    expect_refused(dir, TINY,
                   (const char *const[]){"--preset", "small", "--run", "warm", "--cache-dir", dir,
                                         NULL});
}

/* Without the model file the demo says how to get it, or how to do without. */
Test(demo, a_missing_model_file_says_how_to_get_it)
{
    char missing[512];
    pt_path(missing, sizeof missing, "no-such-model.gguf");
    demo_run d;
    demo_start_with(&d, "missing", NULL, (const char *const[]){"--model", missing, "--quiet", NULL},
                    NULL);
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 1, "exit %d\nstderr:\n%s", code, err);
    cr_assert(strstr(err, missing) && strstr(err, "scripts/get-model.sh") && strstr(err, "--preset"),
              "the message does not name the file, get-model.sh and --preset:\n%s", err);
    free(out);
    free(err);
}

/* The GGUF model file named by PKV_MODEL, or skip. */
static const char *real_model(void)
{
    const char *p = getenv("PKV_MODEL");
    struct stat st;
    if (!p || !*p || stat(p, &st))
        cr_skip_test("PKV_MODEL %s: the real-model demo tests need the GGUF file "
                     "(scripts/test.sh sets PKV_MODEL from scripts/get-model.sh)",
                     p && *p ? "names no file" : "is not set");
    return p;
}

Test(demo, a_seeded_cache_is_refused_by_the_real_model_with_PKV_EMODEL)
{
    const char *model = real_model();
    char dir[512];
    pt_path(dir, sizeof dir, "tinycache");
    cold_tiny(dir);
    expect_refused(dir, (const char *const[]){"--model", model, "--quiet", NULL},
                   (const char *const[]){"--run", "warm", "--cache-dir", dir, NULL});
}

/* The kernel is part of the model identity: K/V computed with f32 activations
 * is not served to a process computing with 8-bit ones (nor the other way). */
Test(demo, a_cache_of_the_other_kernel_is_refused_with_PKV_EMODEL)
{
    const char *model = real_model();
    char dir[512], sys[512], q[512];
    pt_path(dir, sizeof dir, "exactcache");
    pt_path(sys, sizeof sys, "system.txt");
    pt_path(q, sizeof q, "questions.txt");
    FILE *f = fopen(sys, "w");
    cr_assert_not_null(f);
    fputs("You are the support assistant of pagedkv. Answer in one short sentence.", f);
    cr_assert_eq(fclose(f), 0);
    f = fopen(q, "w");
    cr_assert_not_null(f);
    fputs("What does pagedkv keep on disk?\n", f);
    cr_assert_eq(fclose(f), 0);
    const char *const base[] = {"--model", model, "--prompt-file", sys, "--questions-file", q,
                                "--users", "1", "--turns", "1", "--samples", "1",
                                "--answer-tokens", "2", "--quiet", NULL};
    demo_run d;
    demo_start_with(&d, "exact", NULL, base,
                    (const char *const[]){"--kernel", "exact", "--run", "cold", "--cache-dir",
                                          dir, NULL});
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 0, "exit %d\nstderr:\n%s", code, err);
    free(out);
    free(err);
    expect_refused(dir, base,
                   (const char *const[]){"--kernel", "q8", "--run", "warm", "--cache-dir", dir,
                                         NULL});
}

/* "  prompt tokens       N computed" of the section starting at `title`. */
static long computed_in(const char *out, const char *title)
{
    const char *p = strstr(out, title);
    cr_assert_not_null(p, "no '%s' in:\n%s", title, out);
    p = strstr(p, "prompt tokens");
    cr_assert_not_null(p, "no prompt tokens line after '%s'", title);
    p += strlen("prompt tokens");
    long v = 0;
    for (; *p == ' ' || (*p >= '0' && *p <= '9') || *p == ','; p++)
        if (*p >= '0' && *p <= '9') v = v * 10 + (*p - '0');
    return v;
}

/* The real chat, short: a system prompt of a few hundred tokens, 2 users x 2 turns
 * with a forked request; the warm restart computes fewer prompt tokens and answers
 * token for token as the cold run did, and the answers are printed as text. */
Test(demo, real_model_answers_identically_after_a_warm_restart)
{
    const char *model = real_model();
    char sys[512], q[512];
    pt_path(sys, sizeof sys, "system.txt");
    pt_path(q, sizeof q, "questions.txt");
    FILE *f = fopen(sys, "w");
    cr_assert_not_null(f);
    fputs("You are the support assistant of pagedkv, a persistent KV cache for language "
          "model inference. pagedkv keeps the keys and values that a model computes for a "
          "prompt in a file on disk, in blocks of sixteen tokens. A new prompt that starts "
          "like an earlier one reuses its blocks, so the model computes only the new "
          "tokens, and the first answer token comes much sooner. The cache survives a "
          "restart of the server: the blocks are found again after the write-ahead log is "
          "replayed. A cache filled by another model is refused with the error PKV_EMODEL. "
          "Answer in one short sentence.", f);
    cr_assert_eq(fclose(f), 0);
    f = fopen(q, "w");
    cr_assert_not_null(f);
    fputs("# test questions\nWhat does pagedkv keep on disk?\nWhat happens after a restart?\n"
          "Which error refuses a cache of another model?\nWhy is the first token faster?\n", f);
    cr_assert_eq(fclose(f), 0);
    demo_run d;
    demo_start_with(&d, "real", NULL,
                    (const char *const[]){"--model", model, "--prompt-file", sys,
                                          "--questions-file", q, "--users", "2", "--turns", "2",
                                          "--samples", "2", "--answer-tokens", "8", "--quiet",
                                          NULL},
                    NULL);
    char *out, *err;
    int code = demo_wait(&d, &out, &err);
    cr_assert_eq(code, 0, "exit %d\nstdout:\n%s\nstderr:\n%s", code, out, err);
    cr_assert(strstr(out, "identical in both runs: yes"), "answers differ:\n%s", out);
    const long cold = computed_in(out, "cold run:"), warm = computed_in(out, "warm run:");
    cr_assert(cold > 100 && warm > 0 && warm < cold / 4,
              "prompt tokens computed: cold %ld, warm %ld:\n%s", cold, warm, out);
    cr_assert(strstr(out, "Q1: What does pagedkv keep on disk?") && strstr(out, "A2: ") &&
                  strstr(out, "sample 1"),
              "the questions and answers are not printed:\n%s", out);
    free(out);
    free(err);
}

/* ---- scripts/demo.sh ---------------------------------------------------------------- */

static void write_exec(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "create %s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(chmod(path, 0700), 0);
}

/* Run a copy of scripts/demo.sh in a tree of its own (bootstrap.sh a no-op,
 * get-model.sh printing /models/m.gguf) with the stub meson and ninja given and
 * `arg` as its argument; its exit status, stderr in *err. */
static int demo_sh_arg(const char *meson, const char *ninja, const char *arg, char **err)
{
    const char *src = getenv("DEMO_SH");
    cr_assert(src && *src, "DEMO_SH is not set (meson sets it to scripts/demo.sh)");
    char repo[512], p[700], bin[512], pathenv[4096];
    pt_path(repo, sizeof repo, "repo");
    pt_path(bin, sizeof bin, "bin");
    snprintf(p, sizeof p, "%s/scripts", repo);
    mkdir(repo, 0700);
    mkdir(p, 0700);
    mkdir(bin, 0700);
    char *script = slurp(src);
    snprintf(p, sizeof p, "%s/scripts/demo.sh", repo);
    write_exec(p, script);
    free(script);
    snprintf(p, sizeof p, "%s/scripts/bootstrap.sh", repo);
    write_exec(p, "#!/bin/sh\nexit 0\n");
    snprintf(p, sizeof p, "%s/scripts/get-model.sh", repo);
    write_exec(p, "#!/bin/sh\necho /models/m.gguf\n");
    snprintf(p, sizeof p, "%s/meson", bin);
    write_exec(p, meson);
    snprintf(p, sizeof p, "%s/ninja", bin);
    write_exec(p, ninja);
    const char *path = getenv("PATH");
    snprintf(pathenv, sizeof pathenv, "PATH=%s:%s", bin, path ? path : "/usr/bin:/bin");
    const char *envp[256];
    size_t ne = 0;
    for (char **e = environ; *e && ne < 254; e++)
        if (strncmp(*e, "PATH=", 5)) envp[ne++] = *e;
    envp[ne++] = pathenv;
    envp[ne] = NULL;
    char out[600], errp[600];
    pt_path(out, sizeof out, "sh.out");
    pt_path(errp, sizeof errp, "sh.err");
    snprintf(p, sizeof p, "%s/scripts/demo.sh", repo);
    const char *argv[] = {"bash", p, arg, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int e = posix_spawnp(&pid, "bash", &fa, NULL, (char *const *)argv, (char *const *)envp);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(e, 0, "spawn bash: %s", strerror(e));
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    *err = slurp(errp);
    cr_assert(WIFEXITED(st), "demo.sh died of signal %d", WTERMSIG(st));
    return WEXITSTATUS(st);
}

static int demo_sh(const char *meson, const char *ninja, char **err)
{
    return demo_sh_arg(meson, ninja, "--help", err);
}

/* demo.sh runs the real model that get-model.sh fetched, unless --preset asks for
 * the seeded one (then nothing is fetched). The stub pkv-demo prints its arguments. */
Test(demo, demo_sh_runs_the_real_model_unless_a_preset_is_asked_for)
{
    const char *meson = "#!/bin/sh\nmkdir -p build-release/tools && touch build-release/build.ninja"
                        " && printf '#!/bin/sh\\necho \"pkv-demo $*\" >&2\\n' > "
                        "build-release/tools/pkv-demo && chmod +x build-release/tools/pkv-demo\n";
    const char *ninja = "#!/bin/sh\necho 'ninja: no work to do.'\n";
    char *err;
    int code = demo_sh_arg(meson, ninja, "--quiet", &err);
    cr_assert_eq(code, 0, "exit %d, stderr:\n%s", code, err);
    cr_assert(strstr(err, "pkv-demo --model /models/m.gguf --quiet"),
              "demo.sh does not run the fetched model:\n%s", err);
    free(err);
    code = demo_sh_arg(meson, ninja, "--preset", &err);
    cr_assert_eq(code, 0, "exit %d, stderr:\n%s", code, err);
    cr_assert(strstr(err, "pkv-demo --preset") && !strstr(err, "--model"),
              "demo.sh --preset does not run the seeded model alone:\n%s", err);
    free(err);
}

/* A new user's first run builds for a minute or two: demo.sh says so on stderr,
 * and when a build step fails it shows what the step printed (meson and ninja
 * print their errors on stdout, which demo.sh used to discard). */
Test(demo, demo_sh_shows_its_build_and_why_a_build_failed)
{
    char *err;
    int code = demo_sh("#!/bin/sh\necho 'ERROR: Dependency \"liblz4\" not found'\nexit 1\n",
                       "#!/bin/sh\nexit 1\n", &err);
    cr_assert_eq(code, 1, "exit %d, stderr:\n%s", code, err);
    cr_assert(strstr(err, "configuring") && strstr(err, "Dependency \"liblz4\" not found"),
              "a failed meson setup is not shown:\n%s", err);
    free(err);
    /* meson works (writes build.ninja); ninja's compile fails. */
    code = demo_sh("#!/bin/sh\nmkdir -p build-release && touch build-release/build.ninja\n",
                   "#!/bin/sh\ncase \" $* \" in *' -n '*) echo '[1/1] cc x.c'; exit 0;; esac\n"
                   "echo 'x.c:1:1: error: boom'\nexit 1\n", &err);
    cr_assert_eq(code, 1, "exit %d, stderr:\n%s", code, err);
    cr_assert(strstr(err, "building tools/pkv-demo") && strstr(err, "x.c:1:1: error: boom"),
              "a failed build is not shown:\n%s", err);
    free(err);
}
