/*
 * The test runner behind tests/nocriterion/criterion/criterion.h (ThreadSanitizer
 * builds only; see that header for why). Every registered test runs in its own
 * fork()ed child: suite .init, the test, suite .fini, then exit(0) -- a normal
 * exit, so TSan's end-of-process report and exit code apply. A failed assertion
 * prints its message, runs .fini and exits 1; a signal counts as a crash; a test
 * running past its .timeout (default 300 s) is killed. Arguments that do not start
 * with '-' are substring filters on "suite/name"; others are ignored (Criterion's
 * flags). Exit status 0 when every selected test passed.
 */
#include "criterion/criterion.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { PTS_MAX = 256 };

static struct pts_test {
    const char *suite, *name;
    void (*fn)(void);
    struct pts_opts opts;
} pts_tests[PTS_MAX];
static int pts_n;
static const struct pts_test *pts_current;
static int pts_in_fini;

void pts_register(const char *suite, const char *name, void (*fn)(void),
                  const struct pts_opts *suite_opts, const struct pts_opts *opts)
{
    if (pts_n == PTS_MAX) {
        fprintf(stderr, "nocriterion: more than %d tests\n", PTS_MAX);
        abort();
    }
    struct pts_test *t = &pts_tests[pts_n++];
    t->suite = suite;
    t->name = name;
    t->fn = fn;
    t->opts = *suite_opts;
    if (opts->init)
        t->opts.init = opts->init;
    if (opts->fini)
        t->opts.fini = opts->fini;
    if (opts->timeout > 0)
        t->opts.timeout = opts->timeout;
}

void pts_fail(const char *file, int line, const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "[----] %s:%d: Assertion Failed\n[----]   ", file, line);
    va_list ap;
    va_start(ap, fmt);
    if (fmt[0])
        vfprintf(stderr, fmt, ap);
    else
        fprintf(stderr, "%s", expr);
    va_end(ap);
    fprintf(stderr, "\n");
    if (pts_current && pts_current->opts.fini && !pts_in_fini) {
        pts_in_fini = 1;
        pts_current->opts.fini();
    }
    exit(1);
}

void pts_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[----] ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

#define PTS_SKIPPED 77 /* a test's exit status: it skipped itself (pts_skip) */

void pts_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[SKIP] ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (pts_current && pts_current->opts.fini && !pts_in_fini) {
        pts_in_fini = 1;
        pts_current->opts.fini();
    }
    exit(PTS_SKIPPED);
}

static int selected(const struct pts_test *t, int argc, char **argv)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", t->suite, t->name);
    int filters = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        filters++;
        if (strstr(full, argv[i]))
            return 1;
    }
    return filters == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int tested = 0, passing = 0, failing = 0, crashing = 0, skipped = 0;
    for (int i = 0; i < pts_n; i++) {
        const struct pts_test *t = &pts_tests[i];
        if (!selected(t, argc, argv))
            continue;
        tested++;
        fprintf(stderr, "[RUN ] %s::%s\n", t->suite, t->name);
        fflush(stderr);
        double t0 = now_s();
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            alarm((unsigned)(t->opts.timeout > 0 ? t->opts.timeout : 300));
            pts_current = t;
            if (t->opts.init)
                t->opts.init();
            t->fn();
            if (t->opts.fini) {
                pts_in_fini = 1;
                t->opts.fini();
            }
            exit(0);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0)
            ;
        double dt = now_s() - t0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            passing++;
            fprintf(stderr, "[PASS] %s::%s: (%.2fs)\n", t->suite, t->name, dt);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == PTS_SKIPPED) {
            skipped++;
            fprintf(stderr, "[SKIP] %s::%s: (%.2fs)\n", t->suite, t->name, dt);
        } else if (WIFEXITED(st)) {
            failing++;
            fprintf(stderr, "[FAIL] %s::%s: exit status %d (%.2fs)\n", t->suite, t->name,
                    WEXITSTATUS(st), dt);
        } else {
            crashing++;
            fprintf(stderr, "[FAIL] %s::%s: CRASH, signal %d%s (%.2fs)\n", t->suite, t->name,
                    WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (timeout)" : "", dt);
        }
    }
    fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d "
                    "| Skipped: %d \n", tested, passing, failing, crashing, skipped);
    return failing || crashing ? 1 : 0;
}
