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
