/*
 * hugemem.c — memory for the large metadata arrays (block records, token ids,
 * prefix index) and recovery scratch: transparent huge pages where the kernel
 * offers them on request.
 *
 * The engine's hot paths make random accesses into arrays of tens to hundreds of
 * MiB (a 2M-block cache: 64 MiB of prefix index, 128 MiB of block records, 128 MiB
 * of token ids). With 4 KiB pages almost every such access is a TLB miss whose
 * page walk misses the cache too; with 2 MiB pages the whole working set fits the
 * second-level TLB. pkv_huge_alloc maps zeroed anonymous memory 2 MiB-aligned
 * and advises MADV_HUGEPAGE *before* it is first touched (so the first faults can
 * already be huge pages; the kernel's setting "madvise" is the common default).
 * It is only a hint: where THP is off, this is ordinary memory. Below 2 MiB it is
 * plain (zeroed, 64-byte aligned) heap memory. Free with pkv_huge_free and the
 * same size.
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

static size_t huge_round(size_t n) { return (n + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ; }

void *pkv_huge_alloc(size_t n) {
    if (n == 0) n = 1;
    if (n < HUGE_SZ) {
        size_t r = (n + 63) / 64 * 64;
        void *p = aligned_alloc(64, r);
        if (p) memset(p, 0, r);
        return p;
    }
    if (n > SIZE_MAX / 2) return NULL;
    /* Fresh anonymous memory: zero without being written (the pages are faulted
     * in on first use, as huge pages where possible), so a cache opened with a
     * large capacity does not pay for touching arrays it has not used yet. Mapped
     * one huge page larger, then trimmed to a 2 MiB-aligned range. */
    size_t r = huge_round(n);
    uint8_t *m = mmap(NULL, r + HUGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (m == MAP_FAILED) return NULL;
    uintptr_t a = ((uintptr_t)m + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1);
    size_t head = (size_t)(a - (uintptr_t)m), tail = HUGE_SZ - head;
    if (head) munmap(m, head);
    if (tail) munmap((uint8_t *)a + r, tail);
    pkv_hint_huge((void *)a, r);
    return (void *)a;
}

void pkv_huge_free(void *p, size_t n) {
    if (!p) return;
    if (n == 0) n = 1;
    if (n < HUGE_SZ) free(p);
    else munmap(p, huge_round(n));
}
