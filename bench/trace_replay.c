/*
 * trace_replay.c — the engine side of a trace replay (see trace_replay.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "trace_replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static inline double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* Seconds this thread has waited on a run queue (the second field of
 * /proc/thread-self/schedstat), or -1 if the kernel does not say. */
static double runq_s(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return -1;
    unsigned long long run, wait;
    int k = fscanf(f, "%llu %llu", &run, &wait);
    fclose(f);
    return k == 2 ? 1e-9 * (double)wait : -1;
}

/* One recognizable K row and V row per appended token (every layer and head):
 * byte i of a row is (token * 31 + kind + layer + head + i) mod 256, copied out
 * of a ramp (ramp[i] = i mod 256) so that writing it costs a memcpy, and the
 * replay with payload can outrun the disk. */
static int write_payload(pkv_cache *c, const pkv_cache_info *in, const uint8_t *ramp,
                         const pkv_slot *slots, const uint32_t *tokens, size_t n) {
    uint64_t row = (uint64_t)in->head_dim * in->elem_size;
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < in->num_layers; l++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < in->num_kv_heads; h++) {
                    uint8_t *p = pkv_kv(c, slots[i].block, l, (pkv_kind)k, h);
                    if (!p) return PKV_EINVAL;
                    unsigned base = (tokens[i] * 31u + (unsigned)k + l + h) & 255u;
                    memcpy(p + (uint64_t)slots[i].offset * row, ramp + base, row);
                }
    return 0;
}

#define CALL(name, expr)                                                        \
    do {                                                                        \
        int rc_ = (expr);                                                       \
        st->calls += name[4] == 's'; /* pkv_seq_*, not the payload writes */   \
        if (rc_ < 0) {                                                          \
            snprintf(st->error, sizeof st->error, "%s", pkv_last_error());      \
            st->failed_call = name;                                             \
            st->failed_request = r;                                             \
            rc = rc_;                                                           \
            goto out;                                                           \
        }                                                                       \
    } while (0)

int trace_replay(pkv_cache *c, const trace *t, const trace_replay_opts *o,
                 trace_replay_stats *st) {
    memset(st, 0, sizeof *st);
    pkv_cache_info info;
    int rc = pkv_info(c, &info);
    if (rc) return rc;
    size_t batch = o->batch ? o->batch : 8192;
    size_t n = o->limit && o->limit < t->n ? o->limit : t->n;
    uint32_t *prompt = malloc(((size_t)t->max_in + 1) * sizeof *prompt);
    uint32_t *out = malloc(batch * sizeof *out);
    pkv_slot *slots = malloc(batch * sizeof *slots);
    const size_t row = (size_t)info.head_dim * info.elem_size;
    uint8_t *ramp = malloc(256 + row);
    size_t r = 0;
    if (!prompt || !out || !slots || !ramp) {
        rc = PKV_ENOMEM;
        st->failed_call = "malloc";
        goto out;
    }
    for (size_t i = 0; i < 256 + row; i++) ramp[i] = (uint8_t)i;
    const uint64_t token_bytes =
        2ull * info.num_layers * info.num_kv_heads * info.head_dim * info.elem_size;
    struct rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    double q0 = runq_s();
    double t0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), gen = 0;
    for (; r < n; r++) {
        if (o->stop && *o->stop) {
            rc = 1;
            break;
        }
        const trace_req *q = &t->req[r];
        double g0 = now_s();
        trace_prompt(t, o->seed, r, prompt);
        gen += now_s() - g0;
        size_t hit = 0;
        CALL("pkv_seq_open", pkv_seq_open(c, r, 0, q->in_len ? prompt : NULL, q->in_len, &hit));
        for (size_t pos = hit; pos < q->in_len; pos += batch) {
            size_t m = q->in_len - pos < batch ? q->in_len - pos : batch;
            CALL("pkv_seq_append", pkv_seq_append(c, r, prompt + pos, m, slots));
            if (o->payload) {
                CALL("pkv_kv", write_payload(c, &info, ramp, slots, prompt + pos, m));
                st->payload_bytes += m * token_bytes;
            }
            CALL("pkv_seq_commit", pkv_seq_commit(c, r, m));
            st->appended += m;
        }
        for (size_t pos = 0; pos < q->out_len; pos += batch) {
            size_t m = q->out_len - pos < batch ? q->out_len - pos : batch;
            g0 = now_s();
            trace_output(o->seed, r, pos, m, out);
            gen += now_s() - g0;
            CALL("pkv_seq_append", pkv_seq_append(c, r, out, m, slots));
            if (o->payload) {
                CALL("pkv_kv", write_payload(c, &info, ramp, slots, out, m));
                st->payload_bytes += m * token_bytes;
            }
            CALL("pkv_seq_commit", pkv_seq_commit(c, r, m));
            st->appended += m;
        }
        CALL("pkv_seq_close", pkv_seq_close(c, r));
        st->requests++;
    }
    st->seconds = now_s() - t0;
    st->cpu_seconds = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    double q1 = runq_s();
    st->runq_seconds = q0 >= 0 && q1 >= 0 ? q1 - q0 : -1;
    getrusage(RUSAGE_THREAD, &ru1);
    st->major_faults = (uint64_t)(ru1.ru_majflt - ru0.ru_majflt);
    st->vol_switches = (uint64_t)(ru1.ru_nvcsw - ru0.ru_nvcsw);
    st->gen_seconds = gen;
out:
    free(prompt);
    free(out);
    free(slots);
    free(ramp);
    return rc;
}
