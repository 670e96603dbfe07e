/*
 * trace_replay.h — replay a trace through a pagedkv cache (pkv-trace and
 * tests/test_trace.c share this loop, so the test checks what the tool runs).
 *
 * Request r, sequentially: pkv_seq_open(id r, salt 0, its prompt), then the rest of
 * the prompt and then its output tokens are appended and committed `batch` tokens
 * at a time (the prompt and the output in separate batches), then pkv_seq_close.
 * Token ids come from trace_prompt() / trace_output(). With `payload`, K and V of
 * every appended token are written through pkv_kv() before the commit.
 */
#ifndef PKV_TRACE_REPLAY_H
#define PKV_TRACE_REPLAY_H

#include "pagedkv.h"
#include "trace_data.h"

#include <signal.h>

typedef struct trace_replay_opts {
    uint64_t seed;
    uint32_t batch;   /* tokens per append + commit; 0 = 8192 */
    bool payload;
    size_t limit;     /* first `limit` requests only (0 = all) */
    volatile sig_atomic_t *stop; /* checked between requests; may be NULL */
} trace_replay_opts;

typedef struct trace_replay_stats {
    uint64_t requests, calls, appended; /* requests done, pkv_* calls, tokens appended */
    double seconds, gen_seconds;        /* the loop; of which generating token ids */
    double cpu_seconds;                 /* the loop's CPU time on the calling thread
                                           (wall less waits and preemption) */
    const char *failed_call;            /* on failure: which call ... */
    size_t failed_request;              /* ... for which request */
    char error[512];                    /* pkv_last_error() of the failure */
} trace_replay_stats;

/* 0, a negative PKV_E* code (failed_call / failed_request / error say more), or 1
 * if *stop was set. */
int trace_replay(pkv_cache *c, const trace *t, const trace_replay_opts *o,
                 trace_replay_stats *st);

#endif /* PKV_TRACE_REPLAY_H */
