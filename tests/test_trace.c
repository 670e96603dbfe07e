/* Trace replay (bench/trace_*.c, used by pkv-trace): the block-level simulator's
 * leaf-first LRU and leaf-first SLRU (no ghosts) reproduce the engine's counters
 * exactly under the engine's policy of the same name, Belady is an upper bound
 * of every simulated policy and reaches the infinite-cache bound, leaf policies
 * never strand a block, and the JSONL reader and writer agree. */
#include "pkv_test.h"
#include "trace_data.h"
#include "trace_replay.h"
#include "trace_sim.h"

#include <stdio.h>
#include <string.h>

TestSuite(trace, .init = pt_setup, .fini = pt_teardown);

#define BS 16u

/* A small synthetic trace: ~400 requests of up to 8k tokens. */
static void small_trace(trace *t, uint64_t seed, uint32_t requests) {
    trace_synth_opts o;
    trace_synth_defaults(&o);
    o.seed = seed;
    o.requests = requests;
    o.sys_prompts = 8;
    o.sys_max = 2048;
    o.user_max = 512;
    o.out_max = 256;
    o.max_prompt = 8192;
    o.doc_min = 1024;
    o.doc_max = 6000;
    o.concurrency = 24;
    cr_assert_eq(trace_synthesize(t, &o), 0, "synthesize: %s", t->err);
}

static void blocks(const trace *t, trace_blocks *tb) {
    char err[256];
    cr_assert_eq(trace_blocks_build(t, BS, tb, err, sizeof err), 0, "%s", err);
}

static sim_result simulate_g(const trace *t, const trace_blocks *tb, uint64_t cap,
                             sim_policy p, uint32_t batch, double ghost) {
    sim_result r;
    sim_params sp = {.capacity = cap, .batch = batch, .policy = p, .protect = 0.5,
                     .ghost = ghost};
    cr_assert_eq(sim_run(t, tb, &sp, &r), 0, "sim %s at capacity %llu failed (request %lld)",
                 sim_policy_name(p), (unsigned long long)cap, (long long)r.failed_request);
    return r;
}

static sim_result simulate(const trace *t, const trace_blocks *tb, uint64_t cap,
                           sim_policy p, uint32_t batch) {
    return simulate_g(t, tb, cap, p, batch, 2);
}

/* Replay through the engine at `cap` blocks under policy p (leaf-lru or leaf-slru,
 * 50% protected) and compare with the simulator's p (no ghosts: the engine keeps
 * none). PKV_OPEN_LIMBO_WAIT: eviction must not depend on flush timing. */
static void engine_vs_sim_p(const trace *t, const trace_blocks *tb, uint64_t cap,
                            uint32_t batch, const char *sub, sim_policy p) {
    pkv_options o;
    pt_opts(&o, 1, 1, 8, BS, PKV_F16, cap);
    o.durability = PKV_DURABLE_NONE;
    o.flags = PKV_OPEN_LIMBO_WAIT;
    o.eviction = p == SIM_LEAF_SLRU ? PKV_EVICT_LEAF_SLRU : PKV_EVICT_LEAF_LRU;
    pkv_cache *c = pt_open_sub(sub, &o);
    trace_replay_opts ro = {.seed = 7, .batch = batch};
    trace_replay_stats rs;
    int rc = trace_replay(c, t, &ro, &rs);
    cr_assert_eq(rc, 0, "capacity %llu: %s failed at request %zu: %s (%s)",
                 (unsigned long long)cap, rs.failed_call ? rs.failed_call : "?",
                 rs.failed_request, pkv_strerror(rc), rs.error);
    PT_CHECK(c);
    pkv_stats st = pt_stats(c);
    sim_result s = simulate_g(t, tb, cap, p, batch, 0);
    cr_expect_eq(st.hit_tokens, s.hit_tokens, "cap %llu: hit tokens engine %llu sim %llu",
                 (unsigned long long)cap, (unsigned long long)st.hit_tokens,
                 (unsigned long long)s.hit_tokens);
    cr_expect_eq(st.miss_tokens, s.miss_tokens, "cap %llu: miss tokens", (unsigned long long)cap);
    cr_expect_eq(st.hit_blocks, s.hit_blocks, "cap %llu: hit blocks", (unsigned long long)cap);
    cr_expect_eq(st.miss_blocks, s.miss_blocks, "cap %llu: miss blocks", (unsigned long long)cap);
    cr_expect_eq(st.evictions, s.evictions, "cap %llu: evictions engine %llu sim %llu",
                 (unsigned long long)cap, (unsigned long long)st.evictions,
                 (unsigned long long)s.evictions);
    cr_expect_eq(st.seals, s.seals, "cap %llu: seals", (unsigned long long)cap);
    cr_expect_eq(st.dedupes, s.dedupes, "cap %llu: dedupes", (unsigned long long)cap);
    cr_expect_eq(s.strands, 0, "%s stranded %llu blocks", sim_policy_name(p),
                 (unsigned long long)s.strands);
    pt_close(c);
}

static void engine_vs_sim(const trace *t, const trace_blocks *tb, uint64_t cap,
                          uint32_t batch, const char *sub) {
    engine_vs_sim_p(t, tb, cap, batch, sub, SIM_LEAF_LRU);
}

Test(trace, simulator_reproduces_engine) {
    trace t;
    trace_blocks tb;
    small_trace(&t, 3, 400);
    blocks(&t, &tb);
    uint64_t distinct = trace_distinct_blocks(&tb);
    /* Tight (just above the largest request), medium, and no eviction at all. */
    uint64_t caps[] = {tb.max_req_blocks + 8, distinct / 10, distinct / 3, distinct + 64};
    uint32_t batches[] = {8192, 100, 512, 8192};
    char sub[32];
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        uint64_t cap = caps[i] > tb.max_req_blocks ? caps[i] : tb.max_req_blocks + 1;
        snprintf(sub, sizeof sub, "c%zu", i);
        engine_vs_sim(&t, &tb, cap, batches[i], sub);
        snprintf(sub, sizeof sub, "s%zu", i);
        engine_vs_sim_p(&t, &tb, cap, batches[i], sub, SIM_LEAF_SLRU);
    }
    trace_blocks_free(&tb);
    trace_free(&t);
}

/* By default an allocation evicts rather than wait for limbo, so which blocks are
 * evicted depends on flush timing. The bound (docs/design.md, "Free list, limbo"):
 * under leaf-LRU the engine's cached blocks are always the newest of those a cache
 * that waits would hold, at most L = limbo_evict_max fewer, so its hits lie between
 * the simulator's at capacity C - L and at C. A slow log (50 ms group commits)
 * makes L large. */
Test(trace, engine_without_limbo_wait_stays_within_the_bound) {
    trace t;
    trace_blocks tb;
    small_trace(&t, 3, 400);
    blocks(&t, &tb);
    uint64_t distinct = trace_distinct_blocks(&tb);
    uint64_t caps[] = {tb.max_req_blocks + 8, distinct / 10, distinct / 3};
    uint64_t most = 0;
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        uint64_t cap = caps[i] > tb.max_req_blocks ? caps[i] : tb.max_req_blocks + 1;
        pkv_options o;
        pt_opts(&o, 1, 1, 8, BS, PKV_F16, cap);
        o.durability = PKV_DURABLE_NONE;
        o.group_commit_us = 50000;
        o.eviction = PKV_EVICT_LEAF_LRU; /* the bound is leaf-LRU's */
        char sub[32];
        snprintf(sub, sizeof sub, "b%zu", i);
        pkv_cache *c = pt_open_sub(sub, &o);
        trace_replay_opts ro = {.seed = 7, .batch = 512};
        trace_replay_stats rs;
        int rc = trace_replay(c, &t, &ro, &rs);
        cr_assert_eq(rc, 0, "capacity %llu: %s failed: %s", (unsigned long long)cap,
                     rs.failed_call ? rs.failed_call : "?", rs.error);
        PT_CHECK(c);
        pkv_stats st = pt_stats(c);
        pt_close(c);
        uint64_t L = st.limbo_evict_max;
        most = L > most ? L : most;
        cr_log_info("capacity %llu: limbo_evict_max %llu, %llu evictions",
                    (unsigned long long)cap, (unsigned long long)L,
                    (unsigned long long)st.evictions);
        cr_assert_eq(st.waits_limbo, 0, "waited for limbo with %llu blocks cached",
                     (unsigned long long)st.blocks_cached);
        sim_result hi = simulate_g(&t, &tb, cap, SIM_LEAF_LRU, 512, 0);
        sim_result lo = simulate_g(&t, &tb, cap - L, SIM_LEAF_LRU, 512, 0);
        cr_expect(lo.hit_tokens <= st.hit_tokens && st.hit_tokens <= hi.hit_tokens,
                  "cap %llu, L %llu: hit tokens %llu outside [%llu, %llu]",
                  (unsigned long long)cap, (unsigned long long)L,
                  (unsigned long long)st.hit_tokens, (unsigned long long)lo.hit_tokens,
                  (unsigned long long)hi.hit_tokens);
        cr_expect(lo.hit_blocks <= st.hit_blocks && st.hit_blocks <= hi.hit_blocks,
                  "cap %llu, L %llu: hit blocks %llu outside [%llu, %llu]",
                  (unsigned long long)cap, (unsigned long long)L,
                  (unsigned long long)st.hit_blocks, (unsigned long long)lo.hit_blocks,
                  (unsigned long long)hi.hit_blocks);
    }
    cr_expect(most > 0, "no allocation evicted while blocks were in limbo: nothing tested");
    trace_blocks_free(&tb);
    trace_free(&t);
}

/* Prompts that are exact multiples of the block size and repeat: the last prompt
 * block is recomputed (the n-1 cap) and deduplicated against its cached copy;
 * partial 512-token blocks and shared prefixes under different parents. */
Test(trace, dedupe_and_partial_blocks) {
    char path[512];
    pt_path(path, sizeof path, "t.jsonl");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 40, \"hash_ids\": [1, 2]}\n"
          "{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 7, \"hash_ids\": [1, 2]}\n"
          "{\"hash_ids\": [1, 2, 3], \"input_length\": 1300, \"output_length\": 0, \"timestamp\": 2}\n"
          "{\"timestamp\": 3, \"input_length\": 1200, \"output_length\": 16, \"hash_ids\": [1, 2, 4]}\n"
          "\n"
          "{\"timestamp\": 4, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n"
          "{\"timestamp\": 5, \"input_length\": 1024, \"output_length\": 3, \"hash_ids\": [9, 2]}\n"
          "{\"timestamp\": 6, \"input_length\": 1, \"output_length\": 5, \"hash_ids\": [1]}\n"
          "{\"timestamp\": 7, \"input_length\": 1024, \"output_length\": 64, \"hash_ids\": [1, 2]}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    trace t;
    cr_assert_eq(trace_load(&t, path), 0, "%s", t.err);
    cr_assert_eq(t.n, 8);
    /* id 2 under parent 9 is another prefix than id 2 under parent 1 */
    cr_expect_eq(t.nnodes, 6, "prefix nodes %u", t.nnodes);
    cr_expect_eq(t.distinct_ids, 5);
    trace_blocks tb;
    blocks(&t, &tb);
    engine_vs_sim(&t, &tb, 400, 100, "big");
    engine_vs_sim(&t, &tb, tb.max_req_blocks + 2, 8192, "tight");
    sim_result s = simulate(&t, &tb, 400, SIM_LEAF_LRU, 100);
    cr_expect_geq(s.dedupes, 3, "dedupes %llu", (unsigned long long)s.dedupes);
    trace_blocks_free(&tb);
    trace_free(&t);
}

Test(trace, belady_bounds_every_policy) {
    trace t;
    trace_blocks tb;
    small_trace(&t, 11, 600);
    blocks(&t, &tb);
    uint64_t distinct = trace_distinct_blocks(&tb);
    uint64_t inf_hits = tb.candidate_refs - tb.cold_candidate_refs;
    for (int step = 0; step < 6; step++) {
        uint64_t cap = tb.max_req_blocks + 1 + (distinct * (uint64_t)step) / 5;
        sim_result b = simulate(&t, &tb, cap, SIM_BELADY, 8192);
        cr_expect_eq(b.strands, 0, "Belady stranded blocks at capacity %llu",
                     (unsigned long long)cap);
        cr_expect_leq(b.hit_blocks, inf_hits);
        for (int p = 0; p < SIM_NPOLICIES; p++) {
            if (p == SIM_BELADY) continue;
            sim_result r = simulate(&t, &tb, cap, (sim_policy)p, 8192);
            cr_expect_geq(b.hit_tokens, r.hit_tokens,
                          "capacity %llu: Belady %llu < %s %llu hit tokens",
                          (unsigned long long)cap, (unsigned long long)b.hit_tokens,
                          sim_policy_name((sim_policy)p), (unsigned long long)r.hit_tokens);
            if (p != SIM_LRU)
                cr_expect_eq(r.strands, 0, "%s stranded %llu blocks",
                             sim_policy_name((sim_policy)p), (unsigned long long)r.strands);
            if (step == 5) /* everything fits: every policy reaches the bound */
                cr_expect_eq(r.hit_blocks, inf_hits, "%s: %llu hits, bound %llu",
                             sim_policy_name((sim_policy)p), (unsigned long long)r.hit_blocks,
                             (unsigned long long)inf_hits);
        }
        if (step == 5) cr_expect_eq(b.hit_blocks, inf_hits);
    }
    trace_blocks_free(&tb);
    trace_free(&t);
}

Test(trace, jsonl_roundtrip) {
    trace a, b;
    small_trace(&a, 5, 300);
    char path[512];
    pt_path(path, sizeof path, "syn.jsonl");
    cr_assert_eq(trace_write(&a, path), 0, "%s", a.err);
    cr_assert_eq(trace_load(&b, path), 0, "%s", b.err);
    cr_assert_eq(a.n, b.n);
    cr_assert_eq(a.nids, b.nids);
    cr_expect_eq(a.nnodes, b.nnodes);
    for (size_t r = 0; r < a.n; r++) {
        cr_assert_eq(a.req[r].ts, b.req[r].ts);
        cr_assert_eq(a.req[r].in_len, b.req[r].in_len);
        cr_assert_eq(a.req[r].out_len, b.req[r].out_len);
        cr_assert_eq(a.req[r].nh, b.req[r].nh);
    }
    cr_expect_eq(memcmp(a.ids, b.ids, a.nids * sizeof *a.ids), 0);
    cr_expect_eq(memcmp(a.node, b.node, a.nids * sizeof *a.node), 0);
    /* Same seed, same trace. */
    trace c;
    small_trace(&c, 5, 300);
    cr_expect_eq(memcmp(a.ids, c.ids, a.nids * sizeof *a.ids), 0);
    trace_free(&a);
    trace_free(&b);
    trace_free(&c);
}

static void expect_load_error(const char *text, const char *needle) {
    char path[512];
    pt_path(path, sizeof path, "bad.jsonl");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    trace t;
    cr_expect_eq(trace_load(&t, path), -1, "loaded: %s", text);
    cr_expect(strstr(t.err, needle) != NULL, "error '%s' lacks '%s'", t.err, needle);
    cr_expect_null(t.req);
}

Test(trace, loader_rejects_bad_input) {
    expect_load_error("{\"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n",
                      "ceil(input_length/512)");
    expect_load_error("{\"input_length\": 10, \"output_length\": 1}\n", "required");
    expect_load_error("{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-1]}\n",
                      "bad hash id");
    expect_load_error("{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]} x\n",
                      "trailing");
    expect_load_error("[1, 2]\n", "expected '{'");
    expect_load_error("\n\n", "no requests");
}
