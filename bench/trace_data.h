/*
 * trace_data.h — request traces for pkv-trace: loading and writing the Mooncake
 * JSONL format, a seeded synthetic generator, the mapping of hash ids to token
 * ids, and the block-level view (content ids and clairvoyant next uses) that the
 * simulator (trace_sim.h) and the engine replay (pkv-trace.c) share.
 *
 * Format (../shared/traces/README.md): one JSON object a line,
 *     {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}
 * with one hash id per 512-token block of the prompt (the last one partial when
 * input_length is not a multiple of 512). Ids are prefix-chained: equal ids mean
 * equal prefixes. We do not trust the chaining blindly: every (parent prefix, id)
 * pair gets its own dense "prefix node" (a trie), so a trace that reused an id
 * under another parent would still be replayed with the sharing the engine sees.
 *
 * Token ids: hash id X maps to the run tok(X, 0..511) of a seeded generator; a
 * prompt of n tokens is the concatenation of the runs of its ids, cut at n (so the
 * partial last 512-token block holds n mod 512 tokens). Output tokens are drawn
 * from a separate generator keyed by the request index, so they are unique.
 */
#ifndef PKV_TRACE_DATA_H
#define PKV_TRACE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_HASH_TOKENS 512u      /* tokens per hash id in the format */
#define TRACE_NEVER       UINT32_MAX /* "no next use" */

typedef struct trace_req {
    uint64_t ts;      /* arrival, ms */
    uint32_t in_len;  /* prompt tokens */
    uint32_t out_len; /* generated tokens */
    uint32_t nh;      /* hash ids (ceil(in_len / 512)) */
    uint64_t h0;      /* index of the first one in trace.ids / trace.node */
} trace_req;

typedef struct trace {
    trace_req *req;
    size_t n, req_cap;
    uint64_t *ids;     /* raw hash ids, all requests concatenated */
    uint32_t *node;    /* per entry of ids: dense id of its prefix node */
    size_t nids, ids_cap;
    uint32_t nnodes;       /* distinct prefix nodes (512-token blocks) */
    uint64_t distinct_ids; /* distinct raw hash ids (== nnodes for a chained trace) */
    uint64_t prompt_tokens, output_tokens;
    uint32_t max_in;
    char err[256];
} trace;

/* Load a JSONL trace. 0, or -1 with t->err set ("file:line: what"). */
int trace_load(trace *t, const char *path);
/* Write the trace as JSONL (the same format). 0 or -1 with t->err. */
int trace_write(const trace *t, const char *path);
void trace_free(trace *t);

/* Synthetic traces: shared system prompts picked with Zipf popularity, multi-turn
 * sessions whose every turn re-sends the whole history (previous prompt, previous
 * answer, new user message), and a share of one-off long documents. */
typedef struct trace_synth_opts {
    uint64_t seed;
    uint32_t requests;      /* total requests */
    uint32_t sys_prompts;   /* distinct system prompts */
    double zipf_s;          /* popularity exponent of the system prompts */
    uint32_t sys_min, sys_max;   /* system prompt tokens */
    uint32_t user_min, user_max; /* user message tokens (log-uniform) */
    uint32_t out_min, out_max;   /* answer tokens (log-uniform) */
    double mean_turns;      /* geometric number of turns per session */
    uint32_t max_prompt;    /* a session ends when its next prompt would exceed this */
    double doc_share;       /* share of sessions that are one long document */
    uint32_t doc_min, doc_max;   /* document tokens (log-uniform) */
    uint32_t concurrency;   /* sessions in flight; each request continues a random one */
    double mean_gap_ms;     /* mean inter-arrival time (exponential) */
} trace_synth_opts;

void trace_synth_defaults(trace_synth_opts *o);
int trace_synthesize(trace *t, const trace_synth_opts *o);

/* Keep only the first n requests (n <= t->n); prefix nodes are renumbered. */
int trace_truncate(trace *t, size_t n);

/* ---- Token ids ----------------------------------------------------------- */

static inline uint64_t trace_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Token k (< 512) of the run of hash id `id`. */
static inline uint32_t trace_prompt_token(uint64_t seed, uint64_t id, uint32_t k) {
    uint64_t x = trace_mix64(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
    return (uint32_t)(trace_mix64(x ^ (id * TRACE_HASH_TOKENS + k)) >> 32);
}

/* Output token k of request r: a different stream, unique per request. */
static inline uint32_t trace_output_token(uint64_t seed, uint64_t r, uint64_t k) {
    uint64_t x = trace_mix64(seed * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
    return (uint32_t)(trace_mix64(x ^ ((r << 32) | (k & 0xffffffffu))) >> 32);
}

/* The prompt of request r: out[0 .. in_len). */
void trace_prompt(const trace *t, uint64_t seed, size_t r, uint32_t *out);
/* Output tokens [from, from + n) of request r. */
void trace_output(uint64_t seed, size_t r, uint64_t from, size_t n, uint32_t *out);

/* ---- Block view ---------------------------------------------------------- */

/* The trace cut into blocks of bs tokens (bs divides 512). Full prompt block i of
 * request r has the content id trace_pnode(); a prompt block is a hit candidate
 * only below maxb = (in_len - 1) / bs (the engine computes the last prompt token).
 * nu[] holds, for each full prompt block of each request, the index of the next
 * request that has the same content id among its hit candidates (TRACE_NEVER if
 * none): the clairvoyant pre-pass that Belady's policy needs. */
typedef struct trace_blocks {
    uint32_t bs, sub;           /* sub = 512 / bs */
    uint64_t *off;              /* n + 1: first full prompt block of request r in nu */
    uint32_t *nu;               /* next use of each full prompt block reference */
    uint64_t prompt_ids;        /* content-id space of prompt blocks: nnodes * sub */
    uint64_t distinct_prompt;   /* distinct full prompt blocks */
    uint64_t unique_blocks;     /* sealed blocks holding output tokens (never shared) */
    uint64_t candidate_refs;    /* hit-candidate block references in all */
    uint64_t candidate_tokens;  /* tokens of those */
    uint64_t cold_candidate_refs; /* of those, first references of their content */
    uint64_t max_req_blocks;    /* most blocks one request holds at once */
} trace_blocks;

int trace_blocks_build(const trace *t, uint32_t bs, trace_blocks *tb, char *err, size_t errlen);
void trace_blocks_free(trace_blocks *tb);

static inline uint64_t trace_pnode(const trace *t, const trace_blocks *tb, size_t r,
                                   uint64_t i) {
    return (uint64_t)t->node[t->req[r].h0 + i / tb->sub] * tb->sub + i % tb->sub;
}

/* Distinct sealed blocks of the whole trace: what an infinite cache would hold. */
static inline uint64_t trace_distinct_blocks(const trace_blocks *tb) {
    return tb->distinct_prompt + tb->unique_blocks;
}

#endif /* PKV_TRACE_DATA_H */
