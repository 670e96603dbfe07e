/*
 * A minimal stand-in for <criterion/criterion.h>, used only by the
 * ThreadSanitizer build (meson -Db_sanitize=thread, scripts/test.sh --tsan).
 *
 * Criterion cannot start under TSan: its BoxFort arena fails with "Could not
 * initialize inheritable arena: Resource temporarily unavailable"
 * (Snaipe/Criterion#274, open). The thread tests (test_threads.c,
 * test_stress.c) and tests/pkv_test.c only need TestSuite/Test with
 * .init/.fini/.timeout, cr_assert, cr_assert_eq/neq/null/not_null/str_eq and
 * cr_log_info (and test_lock.c cr_skip_test), so this header provides exactly those, and tests/nocriterion/
 * runner.c runs every registered test in its own fork()ed process, as Criterion
 * does, and prints Criterion's summary line.
 */
#ifndef PKV_NOCRITERION_H
#define PKV_NOCRITERION_H

#include <stddef.h>
#include <string.h>

struct pts_opts {
    void (*init)(void);
    void (*fini)(void);
    double timeout; /* seconds; 0: the runner's default */
};

void pts_register(const char *suite, const char *name, void (*fn)(void),
                  const struct pts_opts *suite_opts, const struct pts_opts *opts);
_Noreturn void pts_fail(const char *file, int line, const char *expr, const char *fmt, ...);
void pts_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TestSuite(suite, ...) static const struct pts_opts pts_suite_##suite = {__VA_ARGS__}

#define Test(suite, name, ...)                                                          \
    static void pts_test_##suite##_##name(void);                                        \
    __attribute__((constructor)) static void pts_reg_##suite##_##name(void)             \
    {                                                                                   \
        static const struct pts_opts o_ = {__VA_ARGS__};                                \
        pts_register(#suite, #name, pts_test_##suite##_##name, &pts_suite_##suite, &o_); \
    }                                                                                   \
    static void pts_test_##suite##_##name(void)

/* The message arguments are optional, as in Criterion: cr_assert(x) or
 * cr_assert(x, "fmt", args...). */
#define cr_assert(cond, ...)                                                            \
    do {                                                                                \
        if (!(cond))                                                                    \
            pts_fail(__FILE__, __LINE__, #cond, "" __VA_ARGS__);                        \
    } while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_log_info(...) pts_log(__VA_ARGS__)
/* Skip the rest of the test: the runner counts it as skipped, with the message. */
_Noreturn void pts_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define cr_skip_test(...) pts_skip(__VA_ARGS__)

#endif
