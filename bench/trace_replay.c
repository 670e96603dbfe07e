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
#include <time.h>

static inline double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* One recognizable K row and V row per appended token (every layer and head). */
static int write_payload(pkv_cache *c, const pkv_cache_info *in, const pkv_slot *slots,
                         const uint32_t *tokens, size_t n) {
    uint64_t row = (uint64_t)in->head_dim * in->elem_size;
    uint8_t pat[256];
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < in->num_layers; l++)
            for (int k = 0; k < 2; k++)
                for (uint32_t h = 0; h < in->num_kv_heads; h++) {
                    uint8_t *p = pkv_kv(c, slots[i].block, l, (pkv_kind)k, h);
                    if (!p) return PKV_EINVAL;
                    p += (uint64_t)slots[i].offset * row;
                    for (uint64_t j = 0; j < row; j += sizeof pat) {
                        uint64_t len = row - j < sizeof pat ? row - j : sizeof pat;
                        for (uint64_t b = 0; b < len; b++)
                            pat[b] = (uint8_t)(tokens[i] * 31u + b + (unsigned)k + l + h);
                        memcpy(p + j, pat, len);
                    }
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
    size_t r = 0;
    if (!prompt || !out || !slots) {
        rc = PKV_ENOMEM;
        st->failed_call = "malloc";
        goto out;
    }
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
            if (o->payload) CALL("pkv_kv", write_payload(c, &info, slots, prompt + pos, m));
            CALL("pkv_seq_commit", pkv_seq_commit(c, r, m));
            st->appended += m;
        }
        for (size_t pos = 0; pos < q->out_len; pos += batch) {
            size_t m = q->out_len - pos < batch ? q->out_len - pos : batch;
            g0 = now_s();
            trace_output(o->seed, r, pos, m, out);
            gen += now_s() - g0;
            CALL("pkv_seq_append", pkv_seq_append(c, r, out, m, slots));
            if (o->payload) CALL("pkv_kv", write_payload(c, &info, slots, out, m));
            CALL("pkv_seq_commit", pkv_seq_commit(c, r, m));
            st->appended += m;
        }
        CALL("pkv_seq_close", pkv_seq_close(c, r));
        st->requests++;
    }
    st->seconds = now_s() - t0;
    st->cpu_seconds = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    st->gen_seconds = gen;
out:
    free(prompt);
    free(out);
    free(slots);
    return rc;
}
