/*
 * lock.pml — the biased cache lock of src/lock.c and src/internal.h, in Promela,
 * for spin (scripts/check-lock-model.sh runs it; README.md here has the command
 * and its output).
 *
 * Three threads take and release the lock: T0 and T1 twice, T2 once (ITER0..2),
 * and T0 may, once, wait on a condition variable while it holds it (release
 * without a grant, then re-take v in state 2, as pkv_cond_timedwait does). Every
 * load, store, atomic operation, futex call and membarrier of the C code is here,
 * in the C code's order, on x86-TSO memory: each thread's plain stores go to a
 * FIFO store buffer of its own (3 entries), drained to memory one entry at a time
 * at any moment (the flusher process); its loads see its own newest buffered
 * store of that word, else memory. An atomic read-modify-write (CAS, exchange,
 * add) and a system call (futex) drain the caller's buffer first (a locked
 * instruction; the kernel's futex takes a spinlock); membarrier drains every
 * thread's buffer, one thread at a time, in any order (the kernel's IPIs), before
 * it returns. A store whose thread's next step drains its buffer anyway is one
 * step (store_drained): no other thread can tell the difference.
 *
 * Checked: mutual exclusion (asserts: no one else inside on entry; the data the
 * previous holder stored is what the next one loads), and that every thread
 * finishes: a lost wake-up leaves a thread asleep in a futex wait, which spin
 * reports as an invalid end state. Who is granted the bias is chosen freely at
 * every release of v (the 256-acquisition streak, the back-off and its reset
 * decide only when a grant comes, never whether one may), so the bias moves
 * among the threads in every order; a revoker's polls are "one poll sees busy
 * clear" or "out of spins: the sleep path". Not modelled (argued in src/lock.c
 * instead): spurious futex wake-ups; a thread's exit (its record is handed on, at
 * busy == 0, under rec_lock); a second lock biased to the same record (why
 * `waiting` is a count) and the rule that a thread holds one cache lock at a
 * time; m->fast holding the holder's record (written and cleared inside the
 * critical section, before busy = 0); the counters (fast_uses, grant_shift).
 *
 * Switches, each a broken protocol spin must refute (check-lock-model.sh):
 * -DSHARED_BUSY, the protocol before the per-thread record (one busy and one
 * waiting word in the lock, waiting stored 1 and 0, FUTEX_WAKE 1): two threads
 * inside. -DNO_MB1: revocation without its membarrier. -DNO_MB2: the sleep path
 * without its second membarrier (a revoker asleep for ever). -DTRACE: the
 * threads narrate (for replaying a counterexample; it adds steps).
 */

#ifndef ITER0        /* lock/unlock pairs of each thread, and whether it may wait */
#define ITER0 2
#endif
#ifndef ITER1
#define ITER1 2
#endif
#ifndef ITER2
#define ITER2 1
#endif
#ifndef WAIT0
#define WAIT0 1
#endif
#ifndef WAIT1
#define WAIT1 0
#endif
#ifndef WAIT2
#define WAIT2 0
#endif
#define N 3         /* threads */
#define SB 3        /* store buffer entries per thread */

/* memory words */
#define V 0         /* the futex mutex: 0 free, 1 held, 2 held and perhaps waited on */
#define BIAS 1      /* the record (1..N: thread t's is t + 1) the lock is biased to, or 0 */
#define DATA 2      /* what the lock protects */
#ifdef SHARED_BUSY
#define BUSYW(r) 3          /* the lock's one busy word */
#define WAITW(r) 6          /* the lock's one waiting word */
#else
#define BUSYW(r) (2 + (r))  /* record r's busy: 3..5 */
#define WAITW(r) (5 + (r))  /* record r's waiting count: 6..8 */
#endif
#define NV 9

byte mem[NV];
byte sb_a[N * SB], sb_v[N * SB], sb_n[N]; /* store buffers: address, value; count */
byte sleep_on[N];   /* 0: awake; a + 1: futex-waiting on word a */
byte cs;            /* threads inside the critical section (ghost) */
byte written;       /* the value of DATA the latest holder stored (ghost) */

/* With -DTRACE (counterexample replays only: the steps it adds change the state
 * space), the threads narrate what they do. */
#ifdef TRACE
#define EV(x) printf x;
#else
#define EV(x)
#endif

/* ---- x86-TSO ---------------------------------------------------------------- */

/* Thread t's oldest buffered store to memory (inside a d_step). */
inline flush1(t) {
    mem[sb_a[t * SB]] = sb_v[t * SB];
    k = 1;
    do
    :: k < sb_n[t] -> sb_a[t * SB + k - 1] = sb_a[t * SB + k];
                      sb_v[t * SB + k - 1] = sb_v[t * SB + k]; k++
    :: else -> break
    od;
    sb_n[t]--;
    sb_a[t * SB + sb_n[t]] = 0; sb_v[t * SB + sb_n[t]] = 0;
    k = 0
}

inline drain(t) {
    do
    :: sb_n[t] > 0 -> flush1(t)
    :: else -> break
    od
}

/* A plain store: into the buffer (waits while it is full). */
inline store_body(t, a, x) {
    assert(sb_n[t] < SB);
    sb_a[t * SB + sb_n[t]] = a; sb_v[t * SB + sb_n[t]] = x; sb_n[t]++
}
inline store(t, a, x) { d_step { sb_n[t] < SB -> store_body(t, a, x) } }

/* A plain store that the thread's next step drains anyway (membarrier, an atomic
 * operation): buffered or not, others see it at the same points, so one step. */
inline store_drained(t, a, x) { d_step { drain(t); mem[a] = x } }

/* A plain load: its own newest buffered store to a, else memory. */
inline load_body(t, a, r) {
    r = mem[a];
    k = 0;
    do
    :: k < sb_n[t] -> if :: sb_a[t * SB + k] == a -> r = sb_v[t * SB + k] :: else -> skip fi; k++
    :: else -> break
    od;
    k = 0
}
inline load(t, a, r) { d_step { load_body(t, a, r) } }

inline xchg(t, a, x, o) { d_step { drain(t); o = mem[a]; mem[a] = x } }
inline cas0(t, a, x, o) { d_step { drain(t); o = mem[a]; if :: o == 0 -> mem[a] = x :: else -> skip fi } }
inline fadd(t, a) { d_step { drain(t); mem[a] = mem[a] + 1 } }
inline fsub(t, a) { d_step { drain(t); mem[a] = mem[a] - 1 } }

/* membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED): every thread's buffer drained, one
 * at a time, in any order, the caller's first. */
inline membarrier(t) {
    d_step { drain(t); mb = 7 & ~(1 << t) };
    do
    :: d_step { (mb & 1) -> drain(0); mb = mb & 6 }
    :: d_step { (mb & 2) -> drain(1); mb = mb & 5 }
    :: d_step { (mb & 4) -> drain(2); mb = mb & 3 }
    :: mb == 0 -> break
    od
}

/* ---- futex ------------------------------------------------------------------ */

/* FUTEX_WAIT: sleep while word a holds x (compared in memory, atomically with
 * wakes); returns when woken. */
inline futex_wait(t, a, x) {
    d_step { drain(t); if :: mem[a] == x -> sleep_on[t] = a + 1 :: else -> skip fi };
    sleep_on[t] == 0
}

/* FUTEX_WAKE 1: any one thread asleep on a. */
inline futex_wake1(t, a) {
    d_step { drain(t) };
    atomic {
        if
        :: sleep_on[0] == a + 1 -> sleep_on[0] = 0
        :: sleep_on[1] == a + 1 -> sleep_on[1] = 0
        :: sleep_on[2] == a + 1 -> sleep_on[2] = 0
        :: else -> skip
        fi
    }
}

/* FUTEX_WAKE INT32_MAX: every thread asleep on a. */
inline futex_wake_all(t, a) {
    d_step {
        drain(t);
        if :: sleep_on[0] == a + 1 -> sleep_on[0] = 0 :: else -> skip fi;
        if :: sleep_on[1] == a + 1 -> sleep_on[1] = 0 :: else -> skip fi;
        if :: sleep_on[2] == a + 1 -> sleep_on[2] = 0 :: else -> skip fi
    }
}

/* ---- The lock --------------------------------------------------------------- */

/* pkv_lockrec_leave (before: pkv_mutex_fast_exit): busy = 0 (release), load
 * waiting, wake whoever sleeps on busy. */
inline leave(t) {
    store(t, BUSYW(me), 0);
    EV(("T%d: busy[%d] = 0 (buffered)\n", t, BUSYW(me) - 3))
    load(t, WAITW(me), r);
#ifdef SHARED_BUSY
    if :: r != 0 -> futex_wake1(t, BUSYW(me)) :: else -> skip fi
#else
    if :: r != 0 -> futex_wake_all(t, BUSYW(me)) :: else -> skip fi
#endif
}

/* lock_contended: swap in 2, sleep on v while the old value was not 0. */
inline lock_contended(t) {
    do
    :: xchg(t, V, 2, o);
       if
       :: o == 0 -> break
       :: else -> futex_wait(t, V, 2)
       fi
    od
}

/* pkv_mutex_lock's CAS, then lock_v: spins whose CAS may win, or lock_contended. */
inline lock_v(t) {
    cas0(t, V, 1, o);
    if
    :: o == 0 -> skip
    :: else ->
       if
       :: d_step { mem[V] == 0 -> drain(t); mem[V] = 1 }
       :: true -> lock_contended(t)
       fi
    fi;
    EV(("T%d: takes v\n", t))
}

/* revoke_bias(m, b): bias = 0, membarrier, then wait for record b's busy == 0:
 * polls (one that sees it clear), or, past REVOKE_SPINS, the sleep path. */
inline revoke(t, b) {
    store_drained(t, BIAS, 0);
#ifndef NO_MB1
    membarrier(t);
#endif
    EV(("T%d: revokes T%d's bias: bias = 0, membarrier; waits for busy[%d] == 0\n", t, b - 1, BUSYW(b) - 3))
    if
    :: mem[BUSYW(b)] == 0 -> skip
    :: true ->
       do
       :: load(t, BUSYW(b), r);
          if
          :: r == 0 -> break
          :: else ->
#ifdef SHARED_BUSY
             store_drained(t, WAITW(b), 1);
#else
             fadd(t, WAITW(b));
#endif
#ifndef NO_MB2
             membarrier(t);
#endif
             load(t, BUSYW(b), r);
             if :: r != 0 -> futex_wait(t, BUSYW(b), 1) :: else -> skip fi;
#ifdef SHARED_BUSY
             store(t, WAITW(b), 0)
#else
             fsub(t, WAITW(b))
#endif
          fi
       od
    fi;
    EV(("T%d: sees busy[%d] == 0\n", t, BUSYW(b) - 3))
}

/* pkv_mutex_took_v: revoke another thread's bias. */
inline took_v(t) {
    load(t, BIAS, b);
    if
    :: b != 0 && b != me -> revoke(t, b)
    :: else -> skip
    fi
}

/* The critical section: no one else inside; the data the previous holder stored
 * is what this thread loads; it stores new data (buffered, like any store). Two
 * steps: entering (and the section's load and store), leaving. */
inline critical_enter(t) {
    EV(("T%d: enters (fast path: %d)\n", t, fast))
    d_step {
        assert(cs == 0);
        cs = 1;
        load_body(t, DATA, r);
        assert(r == written);
        written++;
        store_body(t, DATA, written)
    }
}
#define critical_leave() EV(("T%d: leaves\n", t)) d_step { cs = 0 }

/* pkv_mutex_unlock_v */
inline unlock_v(t) {
    xchg(t, V, 0, o);
    EV(("T%d: releases v\n", t))
    if :: o == 2 -> futex_wake1(t, V) :: else -> skip fi
}

proctype T(byte t; byte iters; bool may_wait) {
    byte me = t + 1;
    byte r, o, b, k, n, mb;
    bool fast, waited;
    do
    :: n < iters ->
       /* pkv_mutex_lock */
       fast = false;
       load(t, BIAS, r);
       if
       :: r == me ->
          EV(("T%d: loads bias == T%d (itself)\n", t, r - 1))
          store(t, BUSYW(me), 1);
          EV(("T%d: busy[%d] = 1 (buffered)\n", t, BUSYW(me) - 3))
          load(t, BIAS, r);
          if
          :: r == me -> fast = true
          :: else -> EV(("T%d: loads bias again: %d (not itself)\n", t, r)) leave(t)
          fi
       :: else -> skip
       fi;
       if
       :: !fast -> lock_v(t); took_v(t)
       :: else -> skip
       fi;
       critical_enter(t);
       critical_leave();
       /* pkv_cond_timedwait, once: release without a grant, re-take v in state 2 */
       if
       :: may_wait && !waited ->
          waited = true;
          EV(("T%d: waits on a condition variable\n", t))
          if
          :: fast -> fast = false; leave(t)
          :: else -> unlock_v(t)
          fi;
          lock_contended(t);
          took_v(t);
          critical_enter(t);
          critical_leave()
       :: true -> skip
       fi;
       /* pkv_mutex_unlock */
       if
       :: fast -> fast = false; leave(t)
       :: else ->
          if
          :: true -> /* a streak earned the bias: grant() */
             load(t, BIAS, r);
             if :: r == 0 -> store_drained(t, BIAS, me); EV(("T%d: grants itself the bias\n", t)) :: else -> skip fi
          :: true -> skip
          fi;
          unlock_v(t)
       fi;
       n++
    :: else -> break
    od
}

/* Drains buffered stores, oldest first, at any moment. */
active proctype flusher() {
    byte k;
end:
    do
    :: d_step { sb_n[0] > 0 -> flush1(0) } EV(("   T0's oldest buffered store reaches memory\n"))
    :: d_step { sb_n[1] > 0 -> flush1(1) } EV(("   T1's oldest buffered store reaches memory\n"))
    :: d_step { sb_n[2] > 0 -> flush1(2) } EV(("   T2's oldest buffered store reaches memory\n"))
    od
}

init {
    atomic { run T(0, ITER0, WAIT0); run T(1, ITER1, WAIT1); run T(2, ITER2, WAIT2) }
}
