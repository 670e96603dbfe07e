/*
 * lock.c — the cache lock and its condition variables, on Linux futexes, with a
 * bias to the thread that uses the lock most.
 *
 * Every pkv_* call takes the cache lock once, and a decoding engine makes two
 * calls per token, so the uncontended lock and unlock are on the hottest path
 * there is. glibc's pthread_mutex_lock/unlock spend tens of instructions a pair
 * on type, owner and elision bookkeeping around the one atomic operation each
 * needs; a plain futex mutex takes just the two atomic operations, and even those
 * are a visible share of a decode token, since each drains the store buffer. A
 * biased lock takes none (docs/benchmarks-history.md has the figures).
 *
 * The futex mutex, v ("Futexes Are Tricky", U. Drepper, mutex 2): 0 free, 1 held,
 * 2 held and perhaps waited on. Lock: CAS 0 -> 1, else spin briefly, then swap in
 * 2 and sleep on v while the old value was not 0. Unlock: swap in 0; if it was 2,
 * wake one sleeper.
 *
 * The bias: `bias` names one thread, by its record (struct pkv_lockrec,
 * internal.h): a cache line of the thread's own whose `busy` word only that
 * thread ever writes. The holder takes the lock by storing its busy = 1 and
 * checking that bias still names it, and releases it by storing busy = 0: plain
 * stores and loads, no atomic read-modify-write, no fence. Every other thread
 * takes v, then revokes the bias: it reads the record b that bias names, stores
 * bias = 0, runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which runs a full
 * memory barrier on every CPU that runs one of this process's threads, and waits
 * for b->busy == 0. That barrier stands in for the fence the holder's fast path
 * leaves out (asymmetric Dekker, as in liburcu and in JVM biased locking):
 * either the holder stored busy = 1 before its barrier point, and the revoker
 * sees it and waits, or the holder loads bias after it, sees 0 and queues on v
 * like everyone else. The word is per thread, not per lock, because every thread
 * that tries the fast path writes it: a former holder that loaded bias, was
 * preempted, and resumes after the bias moved on stores its own busy = 1, sees
 * bias name another thread, and clears only its own word, never the one a
 * revoker will wait on (with one shared word it cleared the new holder's mark
 * and then walked in beside it; tests/test_lock.c stalls a thread there).
 * A revoker that must wait long sleeps on b->busy: it counts itself in
 * b->waiting, runs a second membarrier (so a busy = 0 stored before it is seen,
 * and one stored after it is followed by a load of waiting != 0, which wakes the
 * revoker), then futex-waits; waiting is a count, since revokers of two locks
 * biased to one thread may both wait on it. Records are made at a thread's
 * first grant and passed on at its exit, never freed, since a revoker may read
 * one at any time. busy does not say which lock its thread is in, so a thread
 * may be inside only one pkv_mutex at a time while it holds any by the fast
 * path; the cache's one lock per call keeps that (pkv_assert checks it).
 * tools/model/lock.pml is this protocol in Promela, every load, store, atomic
 * operation, futex call and membarrier in this file's order, on x86-TSO store
 * buffers; spin checks it exhaustively (scripts/check-lock-model.sh, in
 * scripts/test.sh): one thread inside at a time, the holder's writes seen by
 * the next, and no thread left asleep, for three threads the bias moves among.
 * The same model with one shared busy word (the protocol before) lets two
 * threads in.
 *
 * Who gets the bias: a thread that took v 256 times in a row (no other thread in
 * between) is granted it when it releases v. A bias revoked after fewer than 4096
 * fast acquisitions (a membarrier costs microseconds, a fast acquisition saves
 * nanoseconds) doubles the streak the next grant needs, up to 2^20; one that paid
 * for itself halves it again, and 50 ms without a revocation reset it. So a
 * decoding thread holds the bias between the log flusher's visits (one
 * revocation per group commit), and threads that take turns pay for a few
 * unpaid membarriers per 50 ms (after each reset the back-off builds up again:
 * about log2(burst / 256) + 1 of them, at most ~5, for bursts of up to ~4,350
 * acquisitions; longer bursts pay for themselves). Without membarrier (kernels before 4.14,
 * seccomp filters, valgrind) nothing is ever biased: the plain futex mutex.
 *
 * Memory order: the fast path's acquire load of bias and release store of busy,
 * v's acquire and release, and the revoker's acquire load of busy == 0 order the
 * state the lock protects (ThreadSanitizer sees these atomics).
 *
 * pkv_cond: a sequence number and a count of waiters. A waiter reads seq with the
 * lock held, counts itself, unlocks, and sleeps while seq is unchanged; signal and
 * broadcast bump seq and make the futex call only when someone is counted. A
 * signal sent after the waiter read seq changes it, so the futex wait returns at
 * once: no wake-up is lost. Wake-ups may be spurious (every waiter re-checks its
 * condition, as with pthread_cond_wait); waiters re-take v in state 2, since others
 * may be asleep on it. Not for use across processes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
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

/* ---- The bias ------------------------------------------------------------ */

#define BIAS_STREAK     256u      /* v acquisitions in a row that earn the bias */
#define BIAS_SHIFT_MAX  12u       /* ... at most 256 << 12 = 2^20 */
#define BIAS_PAID       4096u     /* fast acquisitions that pay for a revocation */
#define BIAS_FORGET_NS  (50ull * 1000 * 1000) /* grant_shift resets 50 ms after
                                                 the latest revocation */
#define REVOKE_SPINS    200       /* polls of busy before sleeping on it */

static bool membarrier_ok; /* registered and working; set once (pthread_once) */
static bool rec_ok;       /* the thread-exit key for records exists (pthread_once) */
static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;

static long sys_membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

static void membarrier_init(void) {
    if (getenv("PKV_LOCK_NO_BIAS")) return; /* for comparisons: the plain mutex */
    long q = sys_membarrier(MEMBARRIER_CMD_QUERY);
    if (q < 0 || !(q & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return;
    if (sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) return;
    if (sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) return;
    membarrier_ok = true;
}

/* Called at pkv_open and at a grant (rare): pthread_once orders the read. */
bool pkv_mutex_bias_available(void) {
    pthread_once(&membarrier_once, membarrier_init);
    return membarrier_ok;
}

/* Every thread of the process executes a full memory barrier. Registered and
 * tried at init, so it cannot fail short of a kernel bug, and then mutual
 * exclusion can no longer be promised: stop. */
static void barrier_all(void) {
    if (sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
        fprintf(stderr, "pagedkv: membarrier failed after it was registered (errno %d); "
                        "the cache lock cannot be revoked safely\n", errno);
        abort();
    }
}

/* ---- Thread records ------------------------------------------------------- */

_Thread_local uintptr_t pkv_lock_me __attribute__((tls_model("initial-exec"))) = PKV_NO_LOCKREC;

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER; /* guards rec_free */
static pkv_lockrec *rec_free;
static pthread_key_t rec_key;
static pthread_once_t rec_once = PTHREAD_ONCE_INIT;

/* At thread exit: the record goes to the next thread that needs one. Its thread is
 * inside no lock (busy is 0), so that thread may inherit the biases it names. This
 * thread forgets it, in case a later destructor takes a lock. */
static void rec_release(void *p) {
    pkv_lockrec *r = p;
    pkv_assert(atomic_load_explicit(&r->busy, memory_order_relaxed) == 0);
    pkv_lock_me = PKV_NO_LOCKREC;
    pthread_mutex_lock(&rec_lock);
    r->next = rec_free;
    rec_free = r;
    pthread_mutex_unlock(&rec_lock);
}

/* fork() while another thread holds rec_lock would leave the child's copy locked
 * for ever: hold it across the fork, so both sides find it free. */
static void rec_fork_prepare(void) { pthread_mutex_lock(&rec_lock); }
static void rec_fork_done(void) { pthread_mutex_unlock(&rec_lock); }

static void rec_init(void) {
    rec_ok = pthread_key_create(&rec_key, rec_release) == 0;
    pthread_atfork(rec_fork_prepare, rec_fork_done, rec_fork_done);
}

/* The calling thread's record, made or reused on its first grant; NULL when it
 * cannot be had (then the lock is not biased to this thread). */
static pkv_lockrec *rec_self(void) {
    if (pkv_lock_me != PKV_NO_LOCKREC) return (pkv_lockrec *)pkv_lock_me;
    pthread_once(&rec_once, rec_init);
    if (!rec_ok) return NULL;
    pthread_mutex_lock(&rec_lock);
    pkv_lockrec *r = rec_free;
    if (r) rec_free = r->next;
    pthread_mutex_unlock(&rec_lock);
    if (!r) {
        r = aligned_alloc(64, sizeof *r);
        if (!r) return NULL;
        memset(r, 0, sizeof *r);
    }
    if (pthread_setspecific(rec_key, r) != 0) {
        rec_release(r);
        return NULL;
    }
    pkv_lock_me = (uintptr_t)r;
    return r;
}

void pkv_lockrec_wake(pkv_lockrec *r) { futex(&r->busy, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, 0); }

/* Holding v: take the bias away from the thread whose record is b, and wait until
 * that thread is out of the fast path. */
static void revoke_bias(pkv_mutex *m, pkv_lockrec *b) {
    atomic_store_explicit(&m->bias, 0, memory_order_relaxed);
    barrier_all();
    for (int i = 0; atomic_load_explicit(&b->busy, memory_order_acquire); i++) {
        if (i < REVOKE_SPINS) {
            cpu_relax();
            continue;
        }
        /* a count: revokers of other locks may wait on the same thread */
        atomic_fetch_add_explicit(&b->waiting, 1, memory_order_relaxed);
        barrier_all();
        if (atomic_load_explicit(&b->busy, memory_order_acquire))
            futex(&b->busy, FUTEX_WAIT_PRIVATE, 1, NULL, 0);
        atomic_fetch_sub_explicit(&b->waiting, 1, memory_order_relaxed);
    }
    m->revocations++;
    m->revoked_ns = pkv_now_ns();
    if (m->fast_uses < BIAS_PAID) {
        if (m->grant_shift < BIAS_SHIFT_MAX) m->grant_shift++;
    } else if (m->grant_shift > 0) {
        m->grant_shift--;
    }
}

void pkv_mutex_took_v_slow(pkv_mutex *m, uintptr_t me) {
    uintptr_t b = atomic_load_explicit(&m->bias, memory_order_relaxed);
    if (b != 0 && b != pkv_lock_me) revoke_bias(m, (pkv_lockrec *)b);
    if (m->last == me) {
        if (m->streak < UINT32_MAX) m->streak++;
    } else {
        m->last = me;
        m->streak = 1;
    }
}

/* Holding v at the end of a streak that earns the bias: grant it to this thread
 * (m->last), unless it has it already (it took v again after a condition wait;
 * any other thread's bias was revoked when v was taken) or it cannot be had. */
static void grant(pkv_mutex *m) {
    m->streak = 0; /* asked again after another streak, not on every unlock */
    pkv_assert(m->last == pkv_self());
    if (atomic_load_explicit(&m->bias, memory_order_relaxed) != 0 || !pkv_mutex_bias_available())
        return;
    pkv_lockrec *r = rec_self();
    if (!r) return;
    m->fast_uses = 0;
    atomic_store_explicit(&m->bias, (uintptr_t)r, memory_order_release);
}

/* Holding v, after each 256 acquisitions of a streak (pkv_mutex_unlock). A long
 * enough streak earns the bias. The back-off that early revocations built up is
 * forgotten once no revocation came for BIAS_FORGET_NS: otherwise a burst of
 * them (the checkpoint thread's slices, say) could leave the streak a decoding
 * thread needs longer than the gaps between the flusher's visits, and it would
 * never get the bias back. Threads that take turns revoke far more often than
 * that, so the back-off builds up again at once: a few (at most ~5) unpaid
 * membarriers per BIAS_FORGET_NS. */
void pkv_mutex_streak(pkv_mutex *m) {
    if (m->grant_shift > 0) {
        uint64_t forget = m->forget_ns ? m->forget_ns : BIAS_FORGET_NS;
        if (pkv_now_ns() - m->revoked_ns >= forget) m->grant_shift = 0;
    }
    if (m->streak >= (BIAS_STREAK << m->grant_shift)) grant(m);
}

void pkv_mutex_wake(pkv_mutex *m) { futex(&m->v, FUTEX_WAKE_PRIVATE, 1, NULL, 0); }

/* ---- The futex mutex ------------------------------------------------------ */

/* Take v in state 2 (perhaps waited on), sleeping while it is held. */
static void lock_contended(pkv_mutex *m) {
    while (atomic_exchange_explicit(&m->v, 2, memory_order_acquire) != 0)
        futex(&m->v, FUTEX_WAIT_PRIVATE, 2, NULL, 0);
}

static void lock_v(pkv_mutex *m) {
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

void pkv_mutex_lock_slow(pkv_mutex *m) {
    /* Not inside another pkv_mutex by its fast path: a revoker of this one may be
     * waiting for this thread's busy to drop (internal.h, pkv_lockrec). */
    pkv_assert(pkv_lock_me == PKV_NO_LOCKREC ||
               atomic_load_explicit(&((pkv_lockrec *)pkv_lock_me)->busy, memory_order_relaxed) == 0);
    lock_v(m);
    pkv_mutex_took_v(m, pkv_self());
}

int pkv_cond_timedwait(pkv_cond *cv, pkv_mutex *m, const struct timespec *abs) {
    uint32_t seq = atomic_load_explicit(&cv->seq, memory_order_relaxed);
    atomic_fetch_add_explicit(&cv->waiters, 1, memory_order_seq_cst);
    /* released without granting the bias: this thread is about to sleep */
    uintptr_t fast = m->fast;
    if (fast) {
        m->fast = 0;
        pkv_lockrec_leave((pkv_lockrec *)fast);
    } else {
        pkv_mutex_unlock_v(m);
    }
    long r;
    if (abs)
        r = futex(&cv->seq, FUTEX_WAIT_BITSET_PRIVATE | FUTEX_CLOCK_REALTIME, seq, abs,
                  FUTEX_BITSET_MATCH_ANY);
    else
        r = futex(&cv->seq, FUTEX_WAIT_PRIVATE, seq, NULL, 0);
    int e = r < 0 ? errno : 0;
    atomic_fetch_sub_explicit(&cv->waiters, 1, memory_order_relaxed);
    lock_contended(m);
    pkv_mutex_took_v(m, pkv_self());
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
