/*
 * hugemem.c — memory for the large metadata arrays (block records, token ids,
 * prefix index) and recovery scratch: transparent huge pages where the kernel
 * offers them on request.
 *
 * The engine's hot paths make random accesses into arrays of tens to hundreds of
 * MiB (a 2M-block cache: 64 MiB of prefix index, 128 MiB of block records, 128 MiB
 * of token ids). With 4 KiB pages almost every such access is a TLB miss whose
 * page walk misses the cache too; with 2 MiB pages the whole working set fits the
 * second-level TLB. pkv_huge_alloc allocates 2 MiB-aligned and advises
 * MADV_HUGEPAGE *before* the memory is first touched (so the first faults can
 * already be huge pages; the kernel's setting "madvise" is the common default).
 * It is only a hint: where THP is off, this is ordinary memory. Free with free().
 */
#include "internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_SZ ((size_t)2 << 20)

void pkv_hint_huge(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t H = HUGE_SZ;
    uintptr_t a = ((uintptr_t)p + H - 1) & ~(H - 1), e = ((uintptr_t)p + n) & ~(H - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

void *pkv_huge_alloc(size_t n, bool zero) {
    if (n == 0) n = 1;
    if (n < HUGE_SZ) {
        size_t r = (n + 63) / 64 * 64;
        void *p = aligned_alloc(64, r);
        if (p && zero) memset(p, 0, r);
        return p;
    }
    if (n > SIZE_MAX - HUGE_SZ) return NULL;
    size_t r = (n + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
    void *p = aligned_alloc(HUGE_SZ, r);
    if (!p) return NULL;
    pkv_hint_huge(p, r);
    if (zero) memset(p, 0, r);
    return p;
}
