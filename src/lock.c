/*
 * lock.c — the cache lock and its condition variables, on Linux futexes.
 *
 * Every pkv_* call takes the cache lock once, and a decoding engine makes two
 * calls per token, so the uncontended lock and unlock are on the hottest path
 * there is. glibc's pthread_mutex_lock/unlock spend ~60 instructions a pair on
 * type, owner and elision bookkeeping around the one atomic operation each needs;
 * these take the atomic operation and a branch (measured: 9-11 ns a pair for
 * glibc, 6 ns for this, on the development VM; see docs/benchmarks.md).
 *
 * pkv_mutex ("Futexes Are Tricky", U. Drepper, mutex 2): v is 0 free, 1 held,
 * 2 held and perhaps waited on. Lock: CAS 0 -> 1, else spin briefly, then swap in
 * 2 and sleep on v while the old value was not 0. Unlock: swap in 0; if it was 2,
 * wake one sleeper. Acquire on lock and release on unlock order the state the
 * lock protects (ThreadSanitizer sees these atomics).
 *
 * pkv_cond: a sequence number and a count of waiters. A waiter reads seq with the
 * lock held, counts itself, unlocks, and sleeps while seq is unchanged; signal and
 * broadcast bump seq and make the futex call only when someone is counted. A
 * signal sent after the waiter read seq changes it, so the futex wait returns at
 * once: no wake-up is lost. Wake-ups may be spurious (every waiter re-checks its
 * condition, as with pthread_cond_wait); waiters re-take the lock in state 2,
 * since others may be asleep on it. Not for use across processes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts,
                  uint32_t val3) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, val3);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Take the lock in state 2 (perhaps waited on), sleeping while it is held. */
static void lock_contended(pkv_mutex *m) {
    while (atomic_exchange_explicit(&m->v, 2, memory_order_acquire) != 0)
        futex(&m->v, FUTEX_WAIT_PRIVATE, 2, NULL, 0);
}

void pkv_mutex_lock_slow(pkv_mutex *m) {
    /* A holder usually leaves within a few hundred ns: spin that long first. */
    for (int i = 0; i < 100; i++) {
        uint32_t v = atomic_load_explicit(&m->v, memory_order_relaxed);
        if (v == 2) break; /* others already sleep: queue behind them */
        if (v == 0 && atomic_compare_exchange_weak_explicit(&m->v, &v, 1, memory_order_acquire,
                                                            memory_order_relaxed))
            return;
        cpu_relax();
    }
    lock_contended(m);
}

void pkv_mutex_wake(pkv_mutex *m) { futex(&m->v, FUTEX_WAKE_PRIVATE, 1, NULL, 0); }

int pkv_cond_timedwait(pkv_cond *cv, pkv_mutex *m, const struct timespec *abs) {
    uint32_t seq = atomic_load_explicit(&cv->seq, memory_order_relaxed);
    atomic_fetch_add_explicit(&cv->waiters, 1, memory_order_seq_cst);
    pkv_mutex_unlock(m);
    long r;
    if (abs)
        r = futex(&cv->seq, FUTEX_WAIT_BITSET_PRIVATE | FUTEX_CLOCK_REALTIME, seq, abs,
                  FUTEX_BITSET_MATCH_ANY);
    else
        r = futex(&cv->seq, FUTEX_WAIT_PRIVATE, seq, NULL, 0);
    int e = r < 0 ? errno : 0;
    atomic_fetch_sub_explicit(&cv->waiters, 1, memory_order_relaxed);
    lock_contended(m);
    return e == ETIMEDOUT ? ETIMEDOUT : 0;
}

void pkv_cond_wait(pkv_cond *cv, pkv_mutex *m) { (void)pkv_cond_timedwait(cv, m, NULL); }

static void cond_wake(pkv_cond *cv, int n) {
    atomic_fetch_add_explicit(&cv->seq, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&cv->waiters, memory_order_seq_cst))
        futex(&cv->seq, FUTEX_WAKE_PRIVATE, (uint32_t)n, NULL, 0);
}

void pkv_cond_signal(pkv_cond *cv) { cond_wake(cv, 1); }
void pkv_cond_broadcast(pkv_cond *cv) { cond_wake(cv, INT32_MAX); }
