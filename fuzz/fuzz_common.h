/*
 * fuzz_common.h — helpers shared by the fuzz harnesses in fuzz/ (scratch
 * directories on tmpfs, file writing, a cheap I/O backend, a byte reader) and
 * the libFuzzer entry points every harness defines.
 */
#ifndef PKV_FUZZ_COMMON_H
#define PKV_FUZZ_COMMON_H

#include "pagedkv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Abort with a message: a harness-level check failed (wrong result, broken
 * invariant). libFuzzer and the replay tests report the abort as a crash. */
_Noreturn void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define FZ_ASSERT(cond, ...)                                                         \
    do {                                                                             \
        if (!(cond)) fz_fail(__VA_ARGS__);                                           \
    } while (0)

/* The per-process scratch directory (on /dev/shm when it exists, else /tmp),
 * created on first use and removed at exit. */
const char *fz_base(void);
/* A fresh empty directory fz_base()/name (removed first if present). */
const char *fz_dir(const char *name);
/* Remove a directory and the files in it (one level). */
void fz_rmdir(const char *dir);
/* Write dir/name with the given bytes; 0 or -1. */
int fz_write(const char *dir, const char *name, const void *p, size_t n);

/* The default I/O backend, except that preallocation only sets the file size
 * (sparse on tmpfs), so creating a log segment costs nothing. */
const pkv_io_ops *fz_io(void);

/* pkv_check, aborting with its message when an invariant is broken. */
void fz_check(pkv_cache *c, const char *when);

/* Sequential reader of fuzz input; past the end it returns zeros. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n, off;
} fz_in;
static inline uint8_t fz_u8(fz_in *in) { return in->off < in->n ? in->p[in->off++] : 0; }
static inline uint32_t fz_u16(fz_in *in) {
    uint32_t v = fz_u8(in);
    return v | (uint32_t)fz_u8(in) << 8;
}
static inline uint32_t fz_u32(fz_in *in) {
    uint32_t v = fz_u16(in);
    return v | fz_u16(in) << 16;
}
static inline bool fz_more(const fz_in *in) { return in->off < in->n; }

/* Split data at every occurrence of the 8-byte separator FZ_SEP; fills at most
 * max parts (the last part takes the rest); returns the number of parts. */
#define FZ_SEP "PKVFZSEP"
size_t fz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len,
                size_t max);

#endif
