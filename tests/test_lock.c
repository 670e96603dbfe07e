/*
 * test_lock.c — the cache lock and its condition variables (src/lock.c).
 *
 * Every other suite runs on this lock; these tests pin down its contract by itself:
 * mutual exclusion under contention (including sleeping waiters), no lost wake-up
 * for signal and broadcast, timed waits that time out and return holding the lock.
 * Built for the ThreadSanitizer pass too (scripts/test.sh --tsan), which checks
 * that the lock orders the memory it protects.
 */
#include <criterion/criterion.h>

#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#define NTHREADS 4

/* a lost wake-up hangs a test: fail it in a minute, not at the suite's limit */
TestSuite(lock, .timeout = 60);

typedef struct shared {
    pkv_mutex mu;
    pkv_cond cv;
    uint64_t counter;        /* plain: the lock is all that protects it */
    _Atomic int inside;      /* threads inside the critical section */
    _Atomic int overlaps;    /* times a thread found another one inside */
    int turn, rounds, ready; /* ping-pong state, under mu */
    bool go;
} shared;

static void *count_worker(void *arg) {
    shared *s = arg;
    for (int i = 0; i < 200000; i++) {
        pkv_mutex_lock(&s->mu);
        if (atomic_fetch_add(&s->inside, 1) != 0) atomic_fetch_add(&s->overlaps, 1);
        s->counter++;
        if ((i & 1023) == 0) sched_yield(); /* get preempted while holding it */
        atomic_fetch_sub(&s->inside, 1);
        pkv_mutex_unlock(&s->mu);
    }
    return NULL;
}

Test(lock, mutual_exclusion_under_contention) {
    static shared s;
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) cr_assert_eq(pthread_create(&t[i], NULL, count_worker, &s), 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    cr_assert_eq(s.counter, (uint64_t)NTHREADS * 200000, "lost updates: %llu",
                 (unsigned long long)s.counter);
    cr_assert_eq(atomic_load(&s.overlaps), 0, "two threads held the lock at once");
    cr_assert_eq(atomic_load(&s.mu.v), 0u, "lock not free after the last unlock");
}

Test(lock, held_lock_blocks_until_released) {
    static shared s;
    pkv_mutex_lock(&s.mu);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, count_worker, &s), 0);
    struct timespec d = {0, 50 * 1000 * 1000};
    nanosleep(&d, NULL); /* the worker spins, then sleeps on the lock */
    cr_assert_eq(s.counter, 0u, "worker ran while the lock was held");
    cr_assert_eq(atomic_load(&s.mu.v), 2u, "a blocked locker marks the lock contended");
    pkv_mutex_unlock(&s.mu);
    pthread_join(t, NULL);
    cr_assert_eq(s.counter, 200000u);
    cr_assert_eq(atomic_load(&s.mu.v), 0u);
}

/* Two threads hand a turn back and forth through one condition variable. */
static void *pong(void *arg) {
    shared *s = arg;
    pkv_mutex_lock(&s->mu);
    while (s->rounds < 20000) {
        while (s->turn != 1 && s->rounds < 20000) pkv_cond_wait(&s->cv, &s->mu);
        if (s->rounds >= 20000) break;
        s->turn = 0;
        s->rounds++;
        pkv_cond_signal(&s->cv);
    }
    pkv_mutex_unlock(&s->mu);
    return NULL;
}

Test(lock, signal_loses_no_wakeup) {
    static shared s;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pong, &s), 0);
    pkv_mutex_lock(&s.mu);
    int mine = 0;
    while (s.rounds < 20000) {
        while (s.turn != 0) pkv_cond_wait(&s.cv, &s.mu);
        if (s.rounds >= 20000) break;
        s.turn = 1;
        mine++;
        pkv_cond_signal(&s.cv);
    }
    pkv_mutex_unlock(&s.mu);
    pthread_join(t, NULL); /* a lost wake-up hangs here (the suite's timeout fails it) */
    cr_assert_eq(s.rounds, 20000);
    cr_assert(mine >= 20000, "handed the turn over %d times", mine);
}

static void *wait_for_go(void *arg) {
    shared *s = arg;
    pkv_mutex_lock(&s->mu);
    s->ready++;
    pkv_cond_broadcast(&s->cv); /* tell the main thread */
    while (!s->go) pkv_cond_wait(&s->cv, &s->mu);
    s->counter++;
    pkv_mutex_unlock(&s->mu);
    return NULL;
}

Test(lock, broadcast_wakes_every_waiter) {
    static shared s;
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) cr_assert_eq(pthread_create(&t[i], NULL, wait_for_go, &s), 0);
    pkv_mutex_lock(&s.mu);
    while (s.ready < NTHREADS) pkv_cond_wait(&s.cv, &s.mu);
    s.go = true;
    pkv_cond_broadcast(&s.cv);
    pkv_mutex_unlock(&s.mu);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    cr_assert_eq(s.counter, (uint64_t)NTHREADS);
    cr_assert_eq(atomic_load(&s.cv.waiters), 0u, "waiters left counted");
}

static uint64_t realtime_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

Test(lock, timedwait_times_out_holding_the_lock) {
    static shared s;
    pkv_mutex_lock(&s.mu);
    uint64_t start = realtime_ns(), due = start + 30 * 1000 * 1000;
    struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
    int rc;
    do rc = pkv_cond_timedwait(&s.cv, &s.mu, &ts); /* spurious wake-ups may return 0 */
    while (rc == 0 && realtime_ns() < due);
    cr_assert_eq(rc, ETIMEDOUT);
    cr_assert(realtime_ns() >= due, "returned before its deadline");
    cr_assert_neq(atomic_load(&s.mu.v), 0u, "returned without the lock");
    pkv_mutex_unlock(&s.mu);
    /* A deadline already past returns at once, still with the lock. */
    pkv_mutex_lock(&s.mu);
    ts.tv_sec -= 10;
    cr_assert_eq(pkv_cond_timedwait(&s.cv, &s.mu, &ts), ETIMEDOUT);
    cr_assert_neq(atomic_load(&s.mu.v), 0u);
    pkv_mutex_unlock(&s.mu);
    cr_assert_eq(atomic_load(&s.mu.v), 0u);
}

/* ---- The bias (lock.c, "The bias") ------------------------------------------ */

#define STREAK 256 /* v acquisitions in a row that earn the bias (lock.c) */

static void lock_unlock_n(pkv_mutex *m, int n) {
    for (int i = 0; i < n; i++) {
        pkv_mutex_lock(m);
        pkv_mutex_unlock(m);
    }
}

static void need_bias(void) {
    if (!pkv_mutex_bias_available())
        cr_skip_test("membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) is not available here: "
                     "the lock is never biased");
}

Test(lock, a_streak_earns_the_bias_and_then_v_is_not_touched) {
    need_bias();
    static pkv_mutex m;
    lock_unlock_n(&m, STREAK - 1);
    cr_assert_eq(atomic_load(&m.bias), 0u, "biased before the streak was long enough");
    lock_unlock_n(&m, 1);
    cr_assert_eq(atomic_load(&m.bias), pkv_self(), "not biased after %d acquisitions", STREAK);
    pkv_mutex_lock(&m);
    cr_assert_eq(m.fast, 1u, "the bias holder did not take the fast path");
    cr_assert_eq(atomic_load(&m.v), 0u, "the fast path took v");
    cr_assert_eq(atomic_load(&m.busy), 1u);
    pkv_mutex_unlock(&m);
    cr_assert_eq(atomic_load(&m.busy), 0u);
    cr_assert_eq(m.fast, 0u);
    cr_assert_eq(m.revocations, 0u);
}

typedef struct revoker_arg {
    pkv_mutex *m;
    _Atomic int entered;
    _Atomic uint64_t *word;
    uint64_t seen;
} revoker_arg;

static void *take_once(void *p) {
    revoker_arg *a = p;
    pkv_mutex_lock(a->m);
    a->seen = atomic_load_explicit(a->word, memory_order_relaxed);
    atomic_store(&a->entered, 1);
    pkv_mutex_unlock(a->m);
    return NULL;
}

/* The bias holder is inside for 50 ms: the other thread must revoke, then wait
 * (asleep on busy, past its spins) until the holder leaves, and see its writes. */
Test(lock, a_revoker_waits_for_the_bias_holder_to_leave) {
    need_bias();
    static pkv_mutex m;
    static _Atomic uint64_t word;
    lock_unlock_n(&m, STREAK);
    cr_assert_eq(atomic_load(&m.bias), pkv_self());
    pkv_mutex_lock(&m);
    cr_assert_eq(m.fast, 1u);
    revoker_arg a = {.m = &m, .word = &word};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, take_once, &a), 0);
    /* Wait (up to 10 s on a slow machine) until it has revoked the bias, then 50
     * ms more: it is past its spins, asleep on busy. */
    struct timespec tick = {0, 1000 * 1000}, d = {0, 50 * 1000 * 1000};
    for (int i = 0; i < 10000 && atomic_load(&m.bias) != 0; i++) nanosleep(&tick, NULL);
    cr_assert_eq(atomic_load(&m.bias), 0u, "the bias was not revoked");
    nanosleep(&d, NULL);
    cr_assert_eq(atomic_load(&a.entered), 0, "the other thread got in past the bias holder");
    atomic_store_explicit(&word, 42, memory_order_relaxed); /* ordered by the lock */
    pkv_mutex_unlock(&m);
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&a.entered), 1);
    cr_assert_eq(a.seen, 42u, "the revoker did not see the holder's write");
    cr_assert_eq(m.revocations, 1u);
    /* the former holder queues on v now, and earns the bias back with a new streak */
    pkv_mutex_lock(&m);
    cr_assert_eq(m.fast, 0u);
    cr_assert_neq(atomic_load(&m.v), 0u);
    pkv_mutex_unlock(&m);
    lock_unlock_n(&m, 2 * STREAK << m.grant_shift);
    cr_assert_eq(atomic_load(&m.bias), pkv_self());
}

/* A bias that is revoked before it paid for its membarrier doubles the streak
 * the next grant needs; so threads taking turns stop paying for revocations. */
Test(lock, early_revocations_make_the_bias_harder_to_get) {
    need_bias();
    static pkv_mutex m;
    static _Atomic uint64_t word;
    m.forget_ns = UINT64_MAX / 2; /* no reset however slow this build runs */
    for (int round = 0; round < 4; round++) {
        lock_unlock_n(&m, STREAK << m.grant_shift);
        cr_assert_eq(atomic_load(&m.bias), pkv_self(), "round %d: not biased", round);
        revoker_arg a = {.m = &m, .word = &word};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, take_once, &a), 0);
        pthread_join(t, NULL);
        cr_assert_eq(m.revocations, (uint64_t)round + 1);
        cr_assert_eq(m.grant_shift, (uint32_t)round + 1, "round %d", round);
    }
    /* one that paid (4096 fast acquisitions or more) halves it again */
    lock_unlock_n(&m, STREAK << m.grant_shift);
    cr_assert_eq(atomic_load(&m.bias), pkv_self());
    lock_unlock_n(&m, 5000);
    revoker_arg a = {.m = &m, .word = &word};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, take_once, &a), 0);
    pthread_join(t, NULL);
    cr_assert_eq(m.grant_shift, 3u);
}

static void revoke_from_another_thread(pkv_mutex *m) {
    static _Atomic uint64_t word;
    revoker_arg a = {.m = m, .word = &word};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, take_once, &a), 0);
    pthread_join(t, NULL);
}

/* The back-off is forgotten once no revocation came for forget_ns: a burst of
 * early revocations must not keep a busy thread from the bias for good. */
Test(lock, the_back_off_is_forgotten_when_revocations_stop) {
    need_bias();
    static pkv_mutex m;
    m.forget_ns = 20 * 1000 * 1000; /* 20 ms */
    for (int round = 0; round < 3; round++) { /* three early revocations */
        lock_unlock_n(&m, STREAK << m.grant_shift);
        cr_assert_eq(atomic_load(&m.bias), pkv_self(), "round %d: not biased", round);
        revoke_from_another_thread(&m);
    }
    cr_assert(m.grant_shift >= 1, "early revocations built no back-off");
    /* Right after them, a plain streak is not enough (unless this build is so slow
     * that forget_ns passed since the latest revocation: then only the reset below
     * is checked). */
    lock_unlock_n(&m, STREAK);
    if (pkv_now_ns() - m.revoked_ns < m.forget_ns)
        cr_assert_eq(atomic_load(&m.bias), 0u, "biased after a plain streak despite back-off");
    struct timespec d = {0, 30 * 1000 * 1000};
    nanosleep(&d, NULL);
    lock_unlock_n(&m, STREAK);
    cr_assert_eq(atomic_load(&m.bias), pkv_self(),
                 "no bias after %d acquisitions, 30 ms after the latest revocation", STREAK);
    cr_assert_eq(m.grant_shift, 0u);
}

/* One thread takes the lock in long runs (it earns the bias), three others now and
 * then (each revokes it): no update lost, never two threads inside. */
static void *hot_worker(void *arg) {
    shared *s = arg;
    for (int i = 0; i < 400000; i++) {
        pkv_mutex_lock(&s->mu);
        if (atomic_fetch_add(&s->inside, 1) != 0) atomic_fetch_add(&s->overlaps, 1);
        s->counter++;
        atomic_fetch_sub(&s->inside, 1);
        pkv_mutex_unlock(&s->mu);
    }
    return NULL;
}

static void *cold_worker(void *arg) {
    shared *s = arg;
    for (int i = 0; i < 2000; i++) {
        pkv_mutex_lock(&s->mu);
        if (atomic_fetch_add(&s->inside, 1) != 0) atomic_fetch_add(&s->overlaps, 1);
        s->counter++;
        atomic_fetch_sub(&s->inside, 1);
        pkv_mutex_unlock(&s->mu);
        struct timespec d = {0, 20 * 1000};
        nanosleep(&d, NULL);
    }
    return NULL;
}

Test(lock, mutual_exclusion_while_the_bias_is_granted_and_revoked) {
    need_bias();
    static shared s;
    pthread_t hot, cold[3];
    cr_assert_eq(pthread_create(&hot, NULL, hot_worker, &s), 0);
    for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&cold[i], NULL, cold_worker, &s), 0);
    pthread_join(hot, NULL);
    for (int i = 0; i < 3; i++) pthread_join(cold[i], NULL);
    cr_assert_eq(s.counter, 400000u + 3 * 2000u, "lost updates: %llu",
                 (unsigned long long)s.counter);
    cr_assert_eq(atomic_load(&s.overlaps), 0, "two threads held the lock at once");
    cr_assert(s.mu.revocations > 0, "the bias was never granted and revoked");
    cr_assert_eq(atomic_load(&s.mu.v), 0u);
    cr_assert_eq(atomic_load(&s.mu.busy), 0u);
}
