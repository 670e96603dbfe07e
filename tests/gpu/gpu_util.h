/*
 * gpu_util.h — shared by the GPU tests and the GPU benchmark (tests/gpu/).
 *
 * Every GPU program starts with gpu_start(): without the CUDA layer, a CUDA
 * driver or a device it prints "SKIP: <why>" and exits 77, which meson reports
 * as skipped (never as passed). A failed check prints "FAIL ..." and the program
 * exits 1 at the end; the last line is always "PASS <name>" or "FAIL <name>".
 */
#ifndef PKV_GPU_UTIL_H
#define PKV_GPU_UTIL_H

#include "pagedkv.h"
#include "pkv_config.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if PKV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define GPU_SKIP 77

static int gu_failures;
static const char *gu_name = "gpu";

static inline void gu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void gu_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    gu_failures++;
}

#define GU_CHECK(cond, ...)                                                          \
    do {                                                                             \
        if (!(cond)) {                                                               \
            gu_fail(__VA_ARGS__);                                                    \
        }                                                                            \
    } while (0)

/* A pagedkv call that must succeed; on failure the enclosing function returns. */
#define GU_OK(expr)                                                                  \
    do {                                                                             \
        int r_ = (expr);                                                             \
        if (r_) {                                                                    \
            gu_fail("%s:%d: %s -> %d (%s: %s)", __FILE__, __LINE__, #expr, r_,       \
                    pkv_strerror(r_), pkv_last_error());                             \
            return;                                                                  \
        }                                                                            \
    } while (0)

#if PKV_WITH_CUDA
#define GU_CUDA(expr)                                                                \
    do {                                                                             \
        cudaError_t e_ = (expr);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            gu_fail("%s:%d: %s -> %s", __FILE__, __LINE__, #expr,                    \
                    cudaGetErrorString(e_));                                         \
            return;                                                                  \
        }                                                                            \
    } while (0)
#endif

/* Skip (exit 77) unless a device is usable; print what runs. */
static inline void gpu_start(const char *name) {
    gu_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0);
    char why[256] = "";
    if (pkv_cuda_probe(0, why, sizeof why)) {
        printf("SKIP: %s: %s\n", name, why);
        exit(GPU_SKIP);
    }
#if PKV_WITH_CUDA
    struct cudaDeviceProp p;
    int drv = 0, rt = 0;
    cudaGetDeviceProperties(&p, 0);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("# %s on %s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, runtime %d.%d\n", name, p.name,
           p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30),
           drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
#endif
}

static inline int gpu_finish(void) {
    printf("%s %s (%d failure%s)\n", gu_failures ? "FAIL" : "PASS", gu_name, gu_failures,
           gu_failures == 1 ? "" : "s");
    return gu_failures ? 1 : 0;
}

/* ---- Random numbers (fresh seed per run unless PKV_SEED is set) ---------------- */

static uint64_t gu_rs;
static inline void gu_seed(void) {
    const char *e = getenv("PKV_SEED");
    if (e) {
        gu_rs = strtoull(e, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        gu_rs = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    printf("# seed %llu (set PKV_SEED to repeat)\n", (unsigned long long)gu_rs);
}
static inline uint64_t gu_rnd(void) {
    uint64_t z = (gu_rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint32_t gu_below(uint32_t n) { return (uint32_t)(gu_rnd() % n); }
static inline float gu_frand(float a) {
    return (float)((2.0 * (double)(gu_rnd() >> 11) * (1.0 / 9007199254740992.0) - 1.0) * a);
}

static inline double gu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline size_t gu_esize(pkv_dtype dt) { return dt == PKV_F32 ? 4 : 2; }
static inline const char *gu_dname(pkv_dtype dt) {
    return dt == PKV_F32 ? "f32" : dt == PKV_F16 ? "f16" : "bf16";
}
/* Tolerance of design-notes section 4 per storage type (f32: the kernel's own). */
static inline double gu_tol(pkv_dtype dt) { return dt == PKV_F32 ? 1e-4 : dt == PKV_F16 ? 1e-3 : 1.6e-2; }

/* Fill n elements of dtype storage with quiet NaN. */
static inline void gu_nan_fill(void *p, pkv_dtype dt, size_t n) {
    if (dt == PKV_F32) {
        float *f = p;
        for (size_t i = 0; i < n; i++) f[i] = NAN;
    } else {
        uint16_t *h = p, v = dt == PKV_F16 ? 0x7e00 : 0x7fc0;
        for (size_t i = 0; i < n; i++) h[i] = v;
    }
}

/* Compare out against ref, rows of D: the largest |out - ref| of a row divided by
 * the largest |ref| of that row. NaN anywhere is an error. Returns the worst
 * ratio (INFINITY for NaN). */
static inline double gu_compare(const float *out, const float *ref, size_t rows, uint32_t D,
                         size_t *bad_row) {
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++) {
        double mref = 0.0, merr = 0.0;
        for (uint32_t d = 0; d < D; d++) {
            const double a = out[r * D + d], b = ref[r * D + d];
            if (isnan(a) || isnan(b)) {
                if (bad_row) *bad_row = r;
                return INFINITY;
            }
            mref = fabs(b) > mref ? fabs(b) : mref;
            merr = fabs(a - b) > merr ? fabs(a - b) : merr;
        }
        const double rel = merr / (mref > 1e-30 ? mref : 1e-30);
        if (rel > worst) {
            worst = rel;
            if (bad_row) *bad_row = r;
        }
    }
    return worst;
}

#endif /* PKV_GPU_UTIL_H */
