/*
 * test_lock.c — the cache lock and its condition variables (src/lock.c).
 *
 * Every other suite runs on this lock; these tests pin down its contract by itself:
 * mutual exclusion under contention (including sleeping waiters), no lost wake-up
 * for signal and broadcast, timed waits that time out and return holding the lock,
 * and mutual exclusion while the bias moves between threads, one of them stalled
 * inside the fast path (at a chosen point by a test hook, and at random points
 * by a signal handler that sleeps).
 * Built for the ThreadSanitizer pass too (scripts/test.sh --tsan), which checks
 * that the lock orders the memory it protects.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

/* The fast path's test hook (internal.h): this file's inlined copy of
 * pkv_mutex_lock calls fast_path_pause between its first load of bias and its
 * store of busy; the library's own copies have nothing there. */
struct pkv_mutex;
static void fast_path_pause(struct pkv_mutex *m);
#define PKV_LOCK_TEST_PAUSE(m) fast_path_pause(m)

#include "internal.h"

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

static bool biased_to_me(pkv_mutex *m) { return pkv_mutex_biased_to_me(m); }

/* The calling thread's busy word (it has a record once it was granted a bias). */
static uint32_t my_busy(void) { return atomic_load(&((pkv_lockrec *)pkv_lock_me)->busy); }

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
    cr_assert(biased_to_me(&m), "not biased after %d acquisitions", STREAK);
    pkv_mutex_lock(&m);
    cr_assert_eq(m.fast, pkv_lock_me, "the bias holder did not take the fast path");
    cr_assert_eq(atomic_load(&m.v), 0u, "the fast path took v");
    cr_assert_eq(my_busy(), 1u);
    pkv_mutex_unlock(&m);
    cr_assert_eq(my_busy(), 0u);
    cr_assert_eq(m.fast, (uintptr_t)0);
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
    cr_assert(biased_to_me(&m));
    pkv_mutex_lock(&m);
    cr_assert_eq(m.fast, pkv_lock_me);
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
    cr_assert_eq(m.fast, (uintptr_t)0);
    cr_assert_neq(atomic_load(&m.v), 0u);
    pkv_mutex_unlock(&m);
    lock_unlock_n(&m, 2 * STREAK << m.grant_shift);
    cr_assert(biased_to_me(&m));
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
        cr_assert(biased_to_me(&m), "round %d: not biased", round);
        revoker_arg a = {.m = &m, .word = &word};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, take_once, &a), 0);
        pthread_join(t, NULL);
        cr_assert_eq(m.revocations, (uint64_t)round + 1);
        cr_assert_eq(m.grant_shift, (uint32_t)round + 1, "round %d", round);
    }
    /* one that paid (4096 fast acquisitions or more) halves it again */
    lock_unlock_n(&m, STREAK << m.grant_shift);
    cr_assert(biased_to_me(&m));
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
        cr_assert(biased_to_me(&m), "round %d: not biased", round);
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
    cr_assert(biased_to_me(&m), "no bias after %d acquisitions, 30 ms after the latest revocation",
              STREAK);
    cr_assert_eq(m.grant_shift, 0u);
}

static void *earn_bias_and_exit(void *p) {
    pkv_mutex *m = p;
    lock_unlock_n(m, STREAK);
    return biased_to_me(m) ? (void *)pkv_lock_me : NULL;
}

/* A thread that holds the bias exits: its record outlives it (a revoker reads
 * it), and goes to the next thread granted a bias. */
Test(lock, a_bias_holder_may_exit) {
    need_bias();
    static pkv_mutex m, m2;
    pthread_t t;
    void *rec, *rec2;
    cr_assert_eq(pthread_create(&t, NULL, earn_bias_and_exit, &m), 0);
    pthread_join(t, &rec);
    cr_assert_not_null(rec, "the thread did not earn the bias");
    cr_assert_eq(atomic_load(&m.bias), (uintptr_t)rec);
    pkv_mutex_lock(&m); /* revokes the bias of a thread that no longer exists */
    cr_assert_eq(atomic_load(&m.bias), 0u);
    pkv_mutex_unlock(&m);
    cr_assert_eq(m.revocations, 1u);
    cr_assert_eq(atomic_load(&((pkv_lockrec *)rec)->busy), 0u);
    cr_assert_eq(pthread_create(&t, NULL, earn_bias_and_exit, &m2), 0);
    pthread_join(t, &rec2);
    cr_assert_eq(rec2, rec, "the exited thread's record was not handed on");
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
    cr_assert_eq(s.mu.fast, (uintptr_t)0);
}

/* ---- A bias holder stalled in its fast path --------------------------------- */

static void enter(_Atomic int *inside, _Atomic int *overlaps) {
    if (atomic_fetch_add(inside, 1) != 0) atomic_fetch_add(overlaps, 1);
}

static void sleep_ns(long ns) {
    struct timespec d = {ns / 1000000000, ns % 1000000000};
    nanosleep(&d, NULL);
}

typedef struct stall {
    pkv_mutex m;
    _Atomic uintptr_t who;   /* the thread to stall once in the window (pkv_self), or 0 */
    _Atomic int stalled;     /* it is stalled there */
    _Atomic int resume;      /* let it go on */
    _Atomic int inside, overlaps;
    _Atomic int x_entered;   /* the stalled thread got in, after it resumed */
} stall;

static stall *the_stall;

static void fast_path_pause(struct pkv_mutex *m) {
    stall *s = the_stall;
    if (!s || m != &s->m || atomic_load(&s->who) != pkv_self()) return;
    atomic_store(&s->who, 0);
    atomic_store(&s->stalled, 1);
    while (!atomic_load(&s->resume)) sleep_ns(100 * 1000);
}

/* X: earn the bias, then take the lock again and stall in the window. */
static void *stalled_holder(void *p) {
    stall *s = p;
    lock_unlock_n(&s->m, STREAK);
    if (!biased_to_me(&s->m)) return (void *)"the first thread did not earn the bias";
    atomic_store(&s->who, pkv_self());
    pkv_mutex_lock(&s->m);
    enter(&s->inside, &s->overlaps);
    atomic_store(&s->x_entered, 1);
    atomic_fetch_sub(&s->inside, 1);
    pkv_mutex_unlock(&s->m);
    return NULL;
}

/* Thread X holds the bias and is stalled after its first load of bias, before its
 * store of busy. Thread R revokes X's bias, earns it, and is inside by the fast
 * path when X resumes: X's try must fail, and X must then wait for R to leave
 * (the lock once let X in at once: X's failed try cleared the busy word R had
 * set, and X's own revocation found it clear). */
Test(lock, a_stalled_fast_path_try_waits_for_the_new_bias_holder) {
    need_bias();
    static stall s;
    the_stall = &s;
    s.m.forget_ns = 1; /* no back-off: the second thread earns the bias at once */
    pthread_t x;
    cr_assert_eq(pthread_create(&x, NULL, stalled_holder, &s), 0);
    for (int i = 0; i < 10000 && !atomic_load(&s.stalled); i++) sleep_ns(1000 * 1000);
    cr_assert(atomic_load(&s.stalled), "the first thread never reached the window");
    /* revoke X's bias (X has not stored busy yet), then earn it */
    lock_unlock_n(&s.m, 2 * STREAK);
    cr_assert(biased_to_me(&s.m), "the second thread did not earn the bias");
    cr_assert_eq(s.m.revocations, 1u);
    pkv_mutex_lock(&s.m);
    cr_assert_eq(s.m.fast, pkv_lock_me, "the second thread did not take the fast path");
    enter(&s.inside, &s.overlaps);
    atomic_store(&s.resume, 1);
    /* stay inside 200 ms, or until X got in beside this thread */
    for (int i = 0; i < 200 && !atomic_load(&s.x_entered); i++) sleep_ns(1000 * 1000);
    bool x_in = atomic_load(&s.x_entered);
    atomic_fetch_sub(&s.inside, 1);
    pkv_mutex_unlock(&s.m);
    void *err;
    pthread_join(x, &err);
    the_stall = NULL;
    cr_assert_null(err, "%s", (const char *)err);
    cr_assert(!x_in, "the stalled thread entered while the bias holder was inside");
    cr_assert_eq(atomic_load(&s.overlaps), 0, "two threads held the lock at once");
    cr_assert_eq(atomic_load(&s.x_entered), 1);
    cr_assert_eq(s.m.revocations, 2u);
    cr_assert_eq(atomic_load(&s.m.v), 0u);
}

/* ---- Preempted anywhere ------------------------------------------------------ */

/* One thread takes the lock in a tight loop, and a SIGUSR1 handler stalls it for
 * 3 ms at whatever instruction the signal lands on; meanwhile two others take the
 * lock, one of them often enough to earn the bias while the first one sleeps. */
typedef struct preempt {
    pkv_mutex m;
    _Atomic int inside, overlaps, stop;
    uint64_t counter; /* plain: the lock is all that protects it */
    uint64_t taken[3];
} preempt;

static void stall_3ms(int sig) {
    (void)sig;
    int e = errno;
    sleep_ns(3 * 1000 * 1000);
    errno = e;
}

static void *preempted_worker(void *p) {
    preempt *s = p;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        pkv_mutex_lock(&s->m);
        enter(&s->inside, &s->overlaps);
        s->counter++;
        s->taken[0]++;
        atomic_fetch_sub(&s->inside, 1);
        pkv_mutex_unlock(&s->m);
    }
    return NULL;
}

/* Inside for a few microseconds, checking that no one else comes in. */
static void take_and_hold(preempt *s, int who) {
    pkv_mutex_lock(&s->m);
    enter(&s->inside, &s->overlaps);
    s->counter++;
    s->taken[who]++;
    for (int i = 0; i < 2000; i++)
        if (atomic_load_explicit(&s->inside, memory_order_relaxed) != 1) {
            atomic_fetch_add(&s->overlaps, 1);
            break;
        }
    atomic_fetch_sub(&s->inside, 1);
    pkv_mutex_unlock(&s->m);
}

static void *hot_taker(void *p) {
    preempt *s = p;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) take_and_hold(s, 1);
    return NULL;
}

static void *cold_taker(void *p) {
    preempt *s = p;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        take_and_hold(s, 2);
        sleep_ns(500 * 1000);
    }
    return NULL;
}

Test(lock, mutual_exclusion_when_threads_stall_at_random_instructions) {
    need_bias();
    static preempt s;
    s.m.forget_ns = 1; /* no back-off: the bias moves as often as streaks allow */
    struct sigaction sa = {.sa_handler = stall_3ms};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    pthread_t w, hot, cold;
    cr_assert_eq(pthread_create(&w, NULL, preempted_worker, &s), 0);
    cr_assert_eq(pthread_create(&hot, NULL, hot_taker, &s), 0);
    cr_assert_eq(pthread_create(&cold, NULL, cold_taker, &s), 0);
    unsigned seed = 12345;
    uint64_t start = pkv_now_ns(), signals = 0;
    /* 3 s: a signal at a random moment every 3-5 ms (the worker is stalled for 3
     * of them), stopping at the first overlap */
    while (pkv_now_ns() - start < 3000000000ull && atomic_load(&s.overlaps) == 0) {
        sleep_ns(3000000 + rand_r(&seed) % 2000000);
        pthread_kill(w, SIGUSR1);
        signals++;
    }
    atomic_store(&s.stop, 1);
    pthread_join(w, NULL);
    pthread_join(hot, NULL);
    pthread_join(cold, NULL);
    cr_log_info("%llu signals, %llu revocations, taken %llu/%llu/%llu",
                (unsigned long long)signals, (unsigned long long)s.m.revocations,
                (unsigned long long)s.taken[0], (unsigned long long)s.taken[1],
                (unsigned long long)s.taken[2]);
    cr_assert_eq(atomic_load(&s.overlaps), 0, "two threads held the lock at once (after %llu signals)",
                 (unsigned long long)signals);
    cr_assert_eq(s.counter, s.taken[0] + s.taken[1] + s.taken[2], "lost updates");
    cr_assert(s.m.revocations > 0, "the bias never moved");
}
