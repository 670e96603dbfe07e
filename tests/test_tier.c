/*
 * test_tier.c — the shared prefix tier on Redis (docs/remote.md).
 *
 * Every test starts its own redis-server processes on free loopback ports in
 * its temp directory (a 3-master cluster made with `redis-cli --cluster create`,
 * or one standalone server) and kills them at the end (and the kernel kills
 * them if the test dies: PR_SET_PDEATHSIG). Without redis-server on PATH the
 * tests skip, except with CI=true, where they fail (scripts/bootstrap.sh
 * installs it).
 *
 * K/V correctness is checked with pkv_test.c's convention (every position's
 * K/V is a pure function of salt and token prefix), so PT_VERIFY on node B
 * proves that what B serves from the tier is byte-identical to what node A
 * computed. Forged records are built with the library's own encoder
 * (tier_record.c, linked from the internal library) so that each one fails
 * exactly one check of rule T1, and an unmodified re-encoding is imported (the
 * positive control that makes the rejections meaningful).
 */
#include "pkv_test.h"
#include "redis_util.h"
#include "http_get.h"
#include "pagedkv_inspect.h"
#include "tier.h"

#include <hiredis/hiredis.h>
#include <lz4.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char SECRET[] = "pagedkv-test-cluster-secret-0123";
/* The caches' geometry (copts), as the tier's keys name it. */
static const pkv_geometry TGEO = {PT_LAYERS, PT_HEADS, PT_HDIM, 16, PKV_F32, 4, 0, 0, 0, 0};

static void tier_fini(void) {
    ru_stop_all();
    pt_teardown();
}
TestSuite(tier, .init = pt_setup, .fini = tier_fini);

#define NEED_REDIS()                                                               \
    do {                                                                           \
        if (!ru_have_redis()) {                                                       \
            cr_skip_test("redis-server not installed (apt-get install redis-server)"); \
            return;                                                                \
        }                                                                          \
    } while (0)

static pkv_tier_options topts(const char *nodes, uint32_t deadline_ms) {
    pkv_tier_options o;
    memset(&o, 0, sizeof o);
    o.nodes = nodes;
    o.secret = SECRET;
    o.secret_len = sizeof SECRET - 1;
    o.fetch_deadline_ms = deadline_ms;
    o.connect_timeout_ms = 200;
    return o;
}

static pkv_options copts(void) {
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, 16, PKV_F32, 1024);
    return o;
}

static uint32_t *prompt_of(size_t n, uint32_t seed) {
    uint32_t *t = malloc(n * sizeof *t);
    cr_assert_not_null(t);
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(pt_mix(seed * 1000003u + i) % 50000u);
    return t;
}

/* Node A: compute the prompt (append, write K/V, commit) and publish it. */
static void node_a(pkv_cache *a, const char *nodes, uint64_t salt, const uint32_t *p, size_t n) {
    pkv_tier_options to = topts(nodes, 2000);
    PT_OK(pkv_tier_attach(a, &to));
    size_t got = 99;
    PT_OK(pkv_seq_open(a, 1, salt, p, n, &got));
    cr_assert_eq(got, 0);
    PT_APPEND(a, 1, salt, p, 0, n);
    PT_OK(pkv_seq_commit(a, 1, n));
    PT_OK(pkv_tier_flush(a, 10000));
    pkv_stats st;
    PT_OK(pkv_get_stats(a, &st));
    cr_assert_eq(st.tier_published, n / 16, "published %llu of %zu (errors %llu, dropped %llu)",
                 (unsigned long long)st.tier_published, n / 16,
                 (unsigned long long)st.tier_publish_errors,
                 (unsigned long long)st.tier_publish_dropped);
}

/* Node A in a separate process (exit status 0 on success). */
static void node_a_process(const char *nodes, uint64_t salt, const uint32_t *p, size_t n) {
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        pkv_options o = copts();
        pkv_cache *a = NULL;
        char dir[512];
        pt_path(dir, sizeof dir, "a");
        if (pkv_open(dir, &o, &a)) _exit(2);
        pkv_tier_options to = topts(nodes, 2000);
        if (pkv_tier_attach(a, &to)) _exit(3);
        size_t got;
        if (pkv_seq_open(a, 1, salt, p, n, &got) || got) _exit(4);
        pkv_cache_info inf;
        pkv_info(a, &inf);
        pkv_slot *sl = calloc(n, sizeof *sl);
        if (!sl || pkv_seq_append(a, 1, p, n, sl)) _exit(5);
        for (size_t i = 0; i < n; i++)
            pt_write_token(a, &inf, sl[i].block, sl[i].offset, pt_hprefix(salt, p, i + 1));
        if (pkv_seq_commit(a, 1, n) || pkv_tier_flush(a, 10000)) _exit(6);
        pkv_stats st;
        pkv_get_stats(a, &st);
        if (st.tier_published != n / 16) _exit(7);
        pkv_close(a);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "node A failed: status %d", status);
}

static pkv_stats stats(pkv_cache *c) {
    pkv_stats st;
    PT_OK(pkv_get_stats(c, &st));
    return st;
}

/* B opens the prompt, checks what it got, computes the rest and checks all. */
static size_t node_b_open(pkv_cache *b, uint64_t id, uint64_t salt, const uint32_t *p, size_t n,
                          uint64_t *open_ns) {
    size_t got = 0;
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    PT_OK(pkv_seq_open(b, id, salt, p, n, &got));
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    if (open_ns)
        *open_ns = (uint64_t)(ts1.tv_sec - ts0.tv_sec) * 1000000000u +
                   (uint64_t)(ts1.tv_nsec - ts0.tv_nsec);
    cr_assert_eq(got % 16, 0);
    PT_VERIFY(b, id, salt, p, got, got);
    PT_APPEND(b, id, salt, p, got, n - got);
    PT_OK(pkv_seq_commit(b, id, n - got));
    PT_VERIFY(b, id, salt, p, n, n);
    PT_CHECK(b);
    return got;
}

Test(tier, node_b_attaches_node_a_prompt_byte_identical, .timeout = 120) {
    NEED_REDIS();
    char nodes[128];
    ru_start_cluster(nodes, sizeof nodes);
    const size_t n = 2048;
    uint32_t *p = prompt_of(n, 1);
    node_a_process(nodes, 7, p, n);
    pkv_options o = copts();
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 2000);
    PT_OK(pkv_tier_attach(b, &to));
    uint64_t ns;
    size_t got = node_b_open(b, 1, 7, p, n, &ns);
    pkv_stats st = stats(b);
    cr_assert_eq(got, (n - 1) / 16 * 16, "B attached %zu tokens (found %llu, rejected %llu, "
                 "errors %llu)", got, (unsigned long long)st.tier_fetch_found,
                 (unsigned long long)st.tier_rejected, (unsigned long long)st.tier_errors);
    cr_assert_eq(st.tier_imported, (n - 1) / 16);
    cr_assert_eq(st.tier_rejected, 0);
    cr_log_info("B attached %zu tokens from the tier in %.2f ms", got, ns / 1e6);
    /* the imported blocks are local now: a second open hits without the tier */
    size_t again = 0;
    PT_OK(pkv_seq_open(b, 2, 7, p, n, &again));
    cr_assert_eq(again, (n - 1) / 16 * 16);
    cr_assert_eq(stats(b).tier_fetches, st.tier_fetches, "a full local hit asks no one");
    PT_VERIFY(b, 2, 7, p, again, again);
    /* imported blocks were sealed and logged like any seal: a reopen keeps them */
    pt_close(b);
    b = pt_open_sub("b", &o);
    again = 0;
    PT_OK(pkv_seq_open(b, 3, 7, p, n, &again));
    cr_assert_eq(again, (n - 1) / 16 * 16, "after a reopen B hits %zu", again);
    PT_VERIFY(b, 3, 7, p, again, again);
    PT_CHECK(b);
    free(p);
}

Test(tier, a_different_salt_or_dtype_never_fetches_their_blocks, .timeout = 120) {
    NEED_REDIS();
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", ru_start_server(false));
    const size_t n = 257;
    uint32_t *p = prompt_of(n, 2);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 1, p, n);
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 2000);
    PT_OK(pkv_tier_attach(b, &to));
    cr_assert_eq(node_b_open(b, 1, 2, p, n, NULL), 0);
    pkv_stats st = stats(b);
    cr_assert_eq(st.tier_fetch_found, 0, "salt 2 must not even find salt 1's keys");
    cr_assert_eq(st.tier_imported, 0);
    /* the same salt does get them: the test is not vacuous */
    cr_assert_eq(node_b_open(b, 2, 1, p, n, NULL), 256);
    /* nor does another geometry of the same model (f16): its keys differ, so it
     * neither finds A's records nor deletes them as bad */
    pkv_options o16;
    pt_opts(&o16, PT_LAYERS, PT_HEADS, PT_HDIM, 16, PKV_F16, 1024);
    pkv_cache *h = pt_open_sub("f16", &o16);
    pkv_tier_options th = topts(nodes, 2000);
    th.flags = PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(h, &th));
    cr_assert_eq(node_b_open(h, 1, 1, p, n, NULL), 0);
    PT_OK(pkv_tier_flush(h, 10000));
    st = stats(h);
    cr_assert_eq(st.tier_fetch_found, 0, "an f16 cache found the f32 cache's records");
    cr_assert_eq(st.tier_deleted, 0);
    free(p);
}

/* ---- Forged and damaged values --------------------------------------------- */

enum forge { F_NONE, F_LZ4, F_FLIP, F_MODEL, F_SALT, F_TOKENS, F_PARENT, F_GEOMETRY,
             F_TRUNCATED, F_OVERSIZED, F_GARBAGE, F_V1, F_LZ4_SHORT, F_LZ4_GARBAGE, F_V3 };
static const char *forge_name[] = {"none", "LZ4", "flipped byte", "wrong model", "wrong salt",
                                   "wrong tokens", "wrong parent hash", "wrong geometry",
                                   "truncated", "oversized", "garbage", "version 1",
                                   "LZ4 stream too short", "LZ4 garbage", "version 3"};

/* The key of block 0 of prompt p under salt. */
static void key_block0(uint64_t salt, const uint32_t *p, char key[PKV_TIER_KEY_LEN + 1]) {
    pkv_tier_keys k;
    pkv_tier_keys_derive(&k, SECRET, sizeof SECRET - 1);
    pkv_h128 root = pkv_hash_root(k.seed, salt), h = pkv_hash_block(k.seed, root, p, 16);
    pkv_tier_key(&k, h, &TGEO, PT_MODEL, key);
}

/* The value at key (malloc'ed, NULL: none); its length into *len. */
static uint8_t *get_value(int port, const char *key, size_t *len) {
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    redisReply *r = redisCommand(x, "GET %s", key);
    cr_assert(r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL));
    uint8_t *v = NULL;
    if (r->type == REDIS_REPLY_STRING) {
        v = malloc(r->len ? r->len : 1);
        cr_assert_not_null(v);
        memcpy(v, r->str, r->len);
        *len = r->len;
    }
    freeReplyObject(r);
    redisFree(x);
    return v;
}

/* Replace the record of block 0 of prompt p (salt) on the server at port. */
static void forge_block0(int port, uint64_t salt, const uint32_t *p, enum forge f) {
    pkv_tier_keys k;
    pkv_tier_keys_derive(&k, SECRET, sizeof SECRET - 1);
    pkv_h128 root = pkv_hash_root(k.seed, salt), h = pkv_hash_block(k.seed, root, p, 16);
    char key[PKV_TIER_KEY_LEN + 1];
    pkv_tier_key(&k, h, &TGEO, PT_MODEL, key);
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    static uint8_t *orig; /* A's record, read once: each forgery starts from it */
    static size_t len;
    redisReply *r;
    if (!orig) {
        r = redisCommand(x, "GET %s", key);
        cr_assert(r && r->type == REDIS_REPLY_STRING, "block 0's record is not on the server");
        len = r->len;
        orig = malloc(len);
        memcpy(orig, r->str, len);
        freeReplyObject(r);
    }
    uint8_t *v = malloc(len + 64);
    memcpy(v, orig, len);
    pkv_tier_rec rec;
    PT_OK(pkv_tier_decode(&k, v, len, &rec));
    uint32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = p[i];
    char wrong_model[] = PT_MODEL "x";
    /* LZ4 forms of the payload, tagged with the secret: only the decompression
     * check (exact length, a well-formed stream) can refuse them */
    int zcap = LZ4_compressBound((int)rec.payload_len);
    uint8_t *z = malloc((size_t)zcap);
    cr_assert_not_null(z);
    int zn = 0;
    if (f == F_LZ4 || f == F_LZ4_SHORT) /* SHORT: a valid stream of all but 8 bytes */
        zn = LZ4_compress_default((const char *)rec.payload, (char *)z,
                                  (int)rec.payload_len - (f == F_LZ4_SHORT ? 8 : 0), zcap);
    if (f == F_LZ4_GARBAGE) memset(z, 0xF3, (size_t)(zn = 64));
    if (zn) {
        cr_assert(zn > 0);
        rec.encoding = PKV_TIER_ENC_LZ4;
        rec.payload = z;
        rec.stored_len = (uint64_t)zn;
    }
    size_t olen = pkv_tier_rec_size(rec.model_len, rec.depth, rec.block_size, rec.stored_len);
    uint8_t *out = malloc(olen + 64);
    switch (f) {
    case F_MODEL: rec.model = wrong_model; rec.model_len++; olen++; break;
    case F_SALT: rec.salt ^= 1; break;
    case F_TOKENS: toks[15] ^= 1; break;
    case F_PARENT: rec.parent.lo ^= 1; break;
    case F_GEOMETRY: rec.head_dim = 2; rec.num_kv_heads = 4; break; /* same bytes */
    default: break;
    }
    pkv_tier_encode(&k, &rec, toks, out);
    switch (f) {
    case F_FLIP: out[len - 40] ^= 0x10; break; /* in the payload */
    case F_TRUNCATED: olen = len - 1; break;
    case F_OVERSIZED: out[olen] = 0; olen += 1; break;
    case F_GARBAGE: memset(out, 0xA5, olen); break;
    /* an older or newer record version: only the version field is looked at
     * before the refusal, so the rest may stay version 2's */
    case F_V1: out[4] = 1; break;
    case F_V3: out[4] = 3; break;
    default: break;
    }
    r = redisCommand(x, "SET %s %b", key, out, olen);
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(x);
    free(z);
    free(v);
    free(out);
}

Test(tier, damaged_or_forged_values_are_rejected_counted_never_served, .timeout = 120) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 33; /* two full blocks before the last token */
    uint32_t *p = prompt_of(n, 3);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 5, p, n);
    char key[PKV_TIER_KEY_LEN + 1];
    key_block0(5, p, key);
    for (int f = F_NONE; f <= F_V3; f++) {
        forge_block0(port, 5, p, (enum forge)f);
        size_t flen = 0;
        uint8_t *forged = get_value(port, key, &flen);
        cr_assert_not_null(forged);
        char sub[32];
        snprintf(sub, sizeof sub, "b%d", f);
        pkv_cache *b = pt_open_sub(sub, &o);
        pkv_tier_options to = topts(nodes, 2000);
        to.flags = PKV_TIER_NO_PUBLISH; /* its own seals would repair the forgery */
        PT_OK(pkv_tier_attach(b, &to));
        snprintf(pt_ctx, sizeof pt_ctx, "[%s] ", forge_name[f]);
        size_t got = node_b_open(b, 1, 5, p, n, NULL);
        pkv_stats st = stats(b);
        PT_OK(pkv_tier_flush(b, 10000)); /* the deletion is sent in the background */
        size_t now_len = 0;
        uint8_t *now = get_value(port, key, &now_len);
        st = stats(b);
        if (f == F_NONE || f == F_LZ4) { /* the re-encoded record is accepted: the forgery is exact */
            cr_assert_eq(got, 32, "%sgot %zu", pt_ctx, got);
            cr_assert_eq(st.tier_imported, 2);
            cr_assert_eq(st.tier_rejected, 0);
            cr_assert_eq(st.tier_deleted, 0);
            cr_assert(now && now_len == flen && !memcmp(now, forged, flen), "%skept", pt_ctx);
        } else { /* block 0 rejected; block 1 is valid but continues nothing */
            cr_assert_eq(got, 0, "%sgot %zu", pt_ctx, got);
            cr_assert_eq(st.tier_imported, 0, "%s", pt_ctx);
            cr_assert_eq(st.tier_rejected, 1, "%srejected %llu", pt_ctx,
                         (unsigned long long)st.tier_rejected);
            cr_assert_eq(st.tier_delete_failed, 0, "%s", pt_ctx);
            if (f == F_V3) { /* a newer node's record is left alone */
                cr_assert_eq(st.tier_deleted, 0, "%s", pt_ctx);
                cr_assert(now && now_len == flen && !memcmp(now, forged, flen), "%skept",
                          pt_ctx);
            } else {
                cr_assert_eq(st.tier_deleted, 1, "%sdeleted %llu", pt_ctx,
                             (unsigned long long)st.tier_deleted);
                cr_assert_null(now, "%sthe bad value is still on the server", pt_ctx);
            }
        }
        free(now);
        free(forged);
        pt_close(b);
    }
    pt_ctx[0] = 0;
    free(p);
}

/* ---- Faults ------------------------------------------------------------------ */

/* With the tier stopped, slow or partly dead, B answers within its deadline (plus
 * slack for a loaded machine) and serves correct K/V. */
#define SLACK_MS 150

Test(tier, cluster_stopped_node_killed_or_slow_b_keeps_its_deadline, .timeout = 120) {
    NEED_REDIS();
    char nodes[128];
    ru_start_cluster(nodes, sizeof nodes);
    const size_t n = 2048;
    uint32_t *p = prompt_of(n, 4);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 9, p, n);
    const uint32_t deadline = 20;

    /* one node sleeping (DEBUG SLEEP) after B connected to all: its records are
     * late (B waits for them until the deadline), the rest arrive */
    pkv_cache *b = pt_open_sub("b1", &o);
    pkv_tier_options to = topts(nodes, deadline);
    PT_OK(pkv_tier_attach(b, &to));
    size_t warm = 0; /* a miss on another prompt connects B to every node */
    uint32_t *q = prompt_of(n, 40);
    PT_OK(pkv_seq_open(b, 99, 9, q, n, &warm));
    cr_assert_eq(warm, 0);
    free(q);
    redisContext *sl = ru_connect(ru_port[1]);
    cr_assert_not_null(sl);
    redisAppendCommand(sl, "DEBUG SLEEP 2");
    int done = 0;
    while (!done) cr_assert_eq(redisBufferWrite(sl, &done), REDIS_OK);
    usleep(50000);
    uint64_t ns;
    size_t got = node_b_open(b, 1, 9, p, n, &ns);
    cr_log_info("slow node: %zu tokens from the tier in %.2f ms", got, ns / 1e6);
    cr_assert(ns < (uint64_t)(deadline + SLACK_MS) * 1000000u, "open took %.2f ms", ns / 1e6);
    cr_assert(got < (n - 1) / 16 * 16, "a third of the blocks sit on the sleeping node");
    cr_assert(stats(b).tier_errors > 0);
    cr_assert(stats(b).tier_deadline_misses > 0, "B waited for the sleeping node");
    cr_assert(ns >= (uint64_t)deadline * 1000000u, "B waited until its deadline");
    redisFree(sl);
    pt_close(b);

    /* a master killed during B's fetch: asleep when B asks, killed 30 ms later,
     * B's reads from it fail at once (connection reset) */
    b = pt_open_sub("b1k", &o);
    pkv_tier_options to2 = topts(nodes, 3000);
    PT_OK(pkv_tier_attach(b, &to2));
    q = prompt_of(n, 41);
    PT_OK(pkv_seq_open(b, 99, 9, q, n, &warm)); /* connect to every node */
    free(q);
    sl = ru_connect(ru_port[2]);
    cr_assert_not_null(sl);
    redisAppendCommand(sl, "DEBUG SLEEP 5");
    done = 0;
    while (!done) cr_assert_eq(redisBufferWrite(sl, &done), REDIS_OK);
    usleep(20000);
    fflush(NULL);
    pid_t killer = fork();
    cr_assert(killer >= 0);
    if (killer == 0) {
        usleep(30000);
        kill(ru_pid[2], SIGKILL);
        _exit(0);
    }
    got = node_b_open(b, 1, 9, p, n, &ns);
    waitpid(killer, NULL, 0);
    waitpid(ru_pid[2], NULL, 0);
    ru_pid[2] = 0;
    redisFree(sl);
    cr_log_info("master killed mid-fetch: %zu tokens from the tier in %.2f ms", got, ns / 1e6);
    /* The killer's 30 ms count from its own start, which the parent's clock
     * may see late (copy-on-write faults after the fork): 10 ms is the floor
     * that still shows B waited on the sleeping master. */
    cr_assert(ns >= 10000000u && ns < 2500000000u, "open took %.2f ms: the kill, not the "
              "deadline, ended the wait", ns / 1e6);
    cr_assert(got < (n - 1) / 16 * 16);
    cr_assert(stats(b).tier_errors > 0);
    pt_close(b);

    /* a master killed: its blocks are errors, B computes from the first gap */
    kill(ru_pid[1], SIGKILL);
    waitpid(ru_pid[1], NULL, 0);
    ru_pid[1] = 0;
    b = pt_open_sub("b2", &o);
    PT_OK(pkv_tier_attach(b, &to));
    got = node_b_open(b, 1, 9, p, n, &ns);
    cr_log_info("killed master: %zu tokens from the tier in %.2f ms", got, ns / 1e6);
    cr_assert(ns < (uint64_t)(deadline + SLACK_MS) * 1000000u, "open took %.2f ms", ns / 1e6);
    cr_assert(got < (n - 1) / 16 * 16);
    pt_close(b);

    /* the whole cluster stopped */
    for (int i = 0; i < ru_n; i++)
        if (ru_pid[i] > 0) {
            kill(ru_pid[i], SIGKILL);
            waitpid(ru_pid[i], NULL, 0);
            ru_pid[i] = 0;
        }
    b = pt_open_sub("b3", &o);
    PT_OK(pkv_tier_attach(b, &to)); /* no node answers: not an error */
    for (uint64_t id = 1; id <= 3; id++) {
        got = node_b_open(b, id, 9 + id, p, n, &ns);
        cr_assert_eq(got, 0);
        cr_assert(ns < (uint64_t)(deadline + SLACK_MS) * 1000000u, "open took %.2f ms",
                  ns / 1e6);
    }
    pkv_stats st = stats(b);
    cr_assert_eq(st.tier_imported, 0);
    free(p);
}

/* A node's id (CLUSTER MYID) into out. */
static void node_id(int port, char *out, size_t cap) {
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    redisReply *r = redisCommand(x, "CLUSTER MYID");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    snprintf(out, cap, "%s", r->str);
    freeReplyObject(r);
    redisFree(x);
}

Test(tier, slots_moved_after_b_read_the_map_are_followed, .timeout = 120) {
    NEED_REDIS();
    char nodes[128];
    ru_start_cluster(nodes, sizeof nodes);
    const size_t n = 1025;
    uint32_t *p = prompt_of(n, 5);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 3, p, n);
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 5000);
    to.flags = PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(b, &to)); /* B's slot map is read now */
    /* move all of the first master's slots, with their keys, to the second */
    char from[64], dest[64], cmd[512];
    node_id(ru_port[0], from, sizeof from);
    node_id(ru_port[1], dest, sizeof dest);
    snprintf(cmd, sizeof cmd,
             "redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s "
             "--cluster-slots 5461 --cluster-yes >%s/reshard.log 2>&1",
             ru_port[0], from, dest, pt_dir);
    cr_assert_eq(system(cmd), 0, "reshard failed (%s/reshard.log)", pt_dir);
    size_t got = node_b_open(b, 1, 3, p, n, NULL);
    pkv_stats st = stats(b);
    cr_assert_eq(got, 1024, "got %zu (errors %llu, redirects %llu)", got,
                 (unsigned long long)st.tier_errors, (unsigned long long)st.tier_redirects);
    cr_assert(st.tier_redirects > 0, "the stale map sent some GETs to the old owner");
    free(p);
}

Test(tier, attach_rejects_bad_options) {
    pkv_options o = copts();
    pkv_cache *c = pt_open_sub("c", &o);
    pkv_tier_options to = topts("127.0.0.1:1", 20);
    PT_ERR(pkv_tier_attach(NULL, &to), PKV_EINVAL);
    PT_ERR(pkv_tier_attach(c, NULL), PKV_EINVAL);
    to.secret_len = 8;
    PT_ERR(pkv_tier_attach(c, &to), PKV_EINVAL);
    to = topts("127.0.0.1", 20);
    PT_ERR(pkv_tier_attach(c, &to), PKV_EINVAL);
    to = topts("", 20);
    PT_ERR(pkv_tier_attach(c, &to), PKV_EINVAL);
    to = topts("127.0.0.1:1", 20);
    to.flags = 32; /* past PKV_TIER_PUBLISH_ON_HIT */
    PT_ERR(pkv_tier_attach(c, &to), PKV_EINVAL);
    PT_ERR(pkv_tier_flush(c, 10), PKV_ESTATE);
    to = topts("127.0.0.1:1", 20); /* nothing listens: attaching still works */
    PT_OK(pkv_tier_attach(c, &to));
    PT_ERR(pkv_tier_attach(c, &to), PKV_EEXIST);
    pkv_tier_detach(c);
    PT_OK(pkv_tier_attach(c, &to));
}

/* The deletion of a rejected value (docs/remote.md, "Faults"): the server
 * deletes it only if it still holds those bytes, so a record another node wrote
 * over the bad one meanwhile is kept. */
Test(tier, a_rejected_value_is_deleted_only_if_still_the_same_bytes, .timeout = 60) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    pkv_rc_conf conf;
    memset(&conf, 0, sizeof conf);
    snprintf(conf.nodes, sizeof conf.nodes, "%s", nodes);
    conf.connect_timeout_ms = 1000;
    int err = 0;
    pkv_rc *rc = pkv_rc_new(&conf, &err);
    cr_assert_not_null(rc, "%d", err);
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    redisReply *r = redisCommand(x, "SET pkv:k %b", "good\0record", (size_t)11);
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    /* the value read earlier differs (in its last byte, after a NUL): kept */
    pkv_rc_cmd c = {.key = "pkv:k", .val = (const uint8_t *)"good\0recorD", .val_len = 11,
                    .del_if_equal = true};
    cr_assert_eq(pkv_rc_run(rc, &c, 1, pkv_now_ns() + 2000000000u, NULL), 1);
    cr_assert_eq(c.status, 0);
    cr_assert_eq(c.integer, 0);
    r = redisCommand(x, "EXISTS pkv:k");
    cr_assert(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1, "a changed value was deleted");
    freeReplyObject(r);
    /* the same bytes: deleted */
    c.val = (const uint8_t *)"good\0record";
    cr_assert_eq(pkv_rc_run(rc, &c, 1, pkv_now_ns() + 2000000000u, NULL), 1);
    cr_assert_eq(c.status, 0);
    cr_assert_eq(c.integer, 1);
    r = redisCommand(x, "EXISTS pkv:k");
    cr_assert(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0, "not deleted");
    freeReplyObject(r);
    /* gone meanwhile: nothing to do, not an error */
    cr_assert_eq(pkv_rc_run(rc, &c, 1, pkv_now_ns() + 2000000000u, NULL), 1);
    cr_assert_eq(c.integer, 0);
    redisFree(x);
    pkv_rc_free(rc);
}

/* PKV_TIER_LZ4: a publisher with compressible K/V stores LZ4 records, smaller
 * than the K/V; a reader without the flag imports them, and its K/V is
 * byte-identical to the publisher's. */
Test(tier, lz4_records_round_trip_byte_identical, .timeout = 60) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 65;
    uint32_t *p = prompt_of(n, 6);
    pkv_options o = copts();
    pkv_cache *a = pt_open_sub("a", &o), *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 2000);
    to.flags = PKV_TIER_LZ4;
    PT_OK(pkv_tier_attach(a, &to));
    size_t got = 0;
    PT_OK(pkv_seq_open(a, 1, 4, p, n, &got));
    pkv_cache_info inf;
    PT_OK(pkv_info(a, &inf));
    pkv_slot *sl = calloc(n, sizeof *sl);
    cr_assert_not_null(sl);
    PT_OK(pkv_seq_append(a, 1, p, n, sl));
    for (size_t i = 0; i < n; i++) /* few distinct values: compressible */
        for (uint32_t l = 0; l < inf.num_layers; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t h = 0; h < inf.num_kv_heads; h++) {
                    float *x = (float *)((uint8_t *)pkv_kv(a, sl[i].block, l, (pkv_kind)k, h) +
                                         (size_t)sl[i].offset * inf.head_dim * 4);
                    for (uint32_t d = 0; d < inf.head_dim; d++)
                        x[d] = (float)((p[i] + l + k + d) % 5);
                }
    PT_OK(pkv_seq_commit(a, 1, n));
    PT_OK(pkv_tier_flush(a, 10000));
    cr_assert_eq(stats(a).tier_published, n / 16);
    /* what the server holds is LZ4 and smaller than the K/V */
    char key[PKV_TIER_KEY_LEN + 1];
    key_block0(4, p, key);
    size_t vlen = 0;
    uint8_t *v = get_value(port, key, &vlen);
    cr_assert_not_null(v);
    pkv_tier_keys tk;
    pkv_tier_keys_derive(&tk, SECRET, sizeof SECRET - 1);
    pkv_tier_rec rec;
    PT_OK(pkv_tier_decode(&tk, v, vlen, &rec));
    cr_assert_eq(rec.encoding, PKV_TIER_ENC_LZ4);
    cr_assert(rec.stored_len < inf.block_bytes / 2, "stored %llu of %llu",
              (unsigned long long)rec.stored_len, (unsigned long long)inf.block_bytes);
    free(v);
    /* B (no LZ4 flag) imports them */
    pkv_tier_options tb = topts(nodes, 2000);
    PT_OK(pkv_tier_attach(b, &tb));
    PT_OK(pkv_seq_open(b, 1, 4, p, n, &got));
    cr_assert_eq(got, 64);
    cr_assert_eq(stats(b).tier_imported, 4);
    uint32_t ba[8], bb[8];
    size_t na = 0, nb = 0;
    PT_OK(pkv_seq_blocks(a, 1, ba, 8, &na));
    PT_OK(pkv_seq_blocks(b, 1, bb, 8, &nb));
    cr_assert(na >= 4 && nb >= 4);
    for (size_t i = 0; i < 4; i++)
        for (uint32_t l = 0; l < inf.num_layers; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t h = 0; h < inf.num_kv_heads; h++)
                    cr_assert(!memcmp(pkv_kv(a, ba[i], l, (pkv_kind)k, h),
                                      pkv_kv(b, bb[i], l, (pkv_kind)k, h), inf.run_bytes),
                              "block %zu layer %u kind %u head %u differs", i, l, k, h);
    PT_CHECK(b);
    free(sl);
    free(p);
}

/* A redis command on port that must answer with status OK. */
static void must_ok(int port, const char *fmt, ...) {
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(x, fmt, ap);
    va_end(ap);
    cr_assert(r && r->type == REDIS_REPLY_STATUS, "port %d: %s -> %s", port, fmt,
              r && r->str ? r->str : "(no reply)");
    freeReplyObject(r);
    redisFree(x);
}

Test(tier, keys_caught_mid_migration_are_followed_through_ask, .timeout = 120) {
    NEED_REDIS();
    char nodes[128];
    ru_start_cluster(nodes, sizeof nodes);
    const size_t n = 1025;
    uint32_t *p = prompt_of(n, 7);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 8, p, n);
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 5000);
    to.flags = PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(b, &to)); /* B's slot map is read now, and stays right */
    /* The first master's slots holding the prompt's records go MIGRATING to the
     * second (IMPORTING there), and every other one of those records moves:
     * the first master answers ASK for those, serves the rest itself. */
    char from[64], dest[64];
    node_id(ru_port[0], from, sizeof from);
    node_id(ru_port[1], dest, sizeof dest);
    pkv_tier_keys k;
    pkv_tier_keys_derive(&k, SECRET, sizeof SECRET - 1);
    pkv_h128 h = pkv_hash_root(k.seed, 8);
    redisContext *src = ru_connect(ru_port[0]);
    cr_assert_not_null(src);
    int owned = 0, moved = 0;
    for (size_t i = 0; i < n / 16; i++) {
        h = pkv_hash_block(k.seed, h, p + i * 16, 16);
        char key[PKV_TIER_KEY_LEN + 1];
        pkv_tier_key(&k, h, &TGEO, PT_MODEL, key);
        redisReply *r = redisCommand(src, "EXISTS %s", key); /* MOVED if not its slot */
        cr_assert_not_null(r);
        bool here = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        if (!here) continue;
        unsigned slot = pkv_rc_slot(key, strlen(key));
        owned++; /* SETSLOT is idempotent: a slot may hold two of them */
        must_ok(ru_port[1], "CLUSTER SETSLOT %u IMPORTING %s", slot, from);
        must_ok(ru_port[0], "CLUSTER SETSLOT %u MIGRATING %s", slot, dest);
        if (owned % 2) {
            must_ok(ru_port[0], "MIGRATE 127.0.0.1 %d %s 0 5000", ru_port[1], key);
            moved++;
        }
    }
    redisFree(src);
    cr_assert(moved > 0 && owned > moved, "owned %d, moved %d", owned, moved);
    size_t got = node_b_open(b, 1, 8, p, n, NULL);
    pkv_stats st = stats(b);
    cr_assert_eq(got, 1024, "got %zu (errors %llu, redirects %llu)", got,
                 (unsigned long long)st.tier_errors, (unsigned long long)st.tier_redirects);
    cr_assert_eq(st.tier_redirects, (uint64_t)moved, "one ASK per moved record");
    cr_assert_eq(st.tier_errors, 0);
    free(p);
}

/* The cluster secret as pkvd reads it: a file of the given mode. */
static void write_secret_file(const char *path, const void *secret, size_t len, mode_t mode) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(fchmod(fd, mode), 0); /* the umask must not decide the test */
    cr_assert_eq(write(fd, secret, len), (ssize_t)len);
    close(fd);
}

/* pkvd on a fresh directory with the tier at nodes (its secret in a 0600 file)
 * and one more flag (or NULL); its directory, socket and secret file paths
 * into dir, sock, sfile (512 bytes each). The caller connects and kills it. */
static pid_t start_pkvd_with_tier(const char *bin, const char *nodes, const char *flag,
                                  char *dir, char *sock, char *sfile) {
    pt_path(sfile, 512, "secret");
    pt_path(dir, 512, "d");
    pt_path(sock, 512, "s");
    write_secret_file(sfile, SECRET, sizeof SECRET - 1, 0600);
    fflush(NULL);
    pid_t d = fork();
    cr_assert(d >= 0);
    if (d == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, "pkvd", "--dir", dir, "--socket", sock, "--layers", "2", "--kv-heads", "2",
              "--head-dim", "4", "--block-size", "16", "--dtype", "f32", "--capacity", "1024",
              "--model-id", PT_MODEL, "--tier-nodes", nodes, "--tier-secret-file", sfile, flag,
              (char *)NULL);
        _exit(127);
    }
    return d;
}

/* pkvd with a tier (--tier-nodes, --tier-secret-file): a client's open on a
 * cold daemon imports node A's blocks through it; the tier's counters reach
 * the client through STATS (protocol version 2) and the operator through
 * pkvd --status. */
Test(tier, pkvd_imports_from_the_tier_and_reports_its_counters, .timeout = 120) {
    NEED_REDIS();
    const char *bin = getenv("PKVD");
    if (!bin) {
        cr_skip_test("PKVD not set (meson test sets it)");
        return;
    }
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", ru_start_server(false));
    const size_t n = 257;
    uint32_t *p = prompt_of(n, 9);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 3, p, n);
    char sfile[512], dir[512], sock[512], cmd[2048];
    pid_t d = start_pkvd_with_tier(bin, nodes, NULL, dir, sock, sfile);
    pkv_cache *c = NULL;
    for (int i = 0; i < 1000 && pkv_connect(sock, &c) != 0; i++) usleep(10000);
    cr_assert_not_null(c, "pkvd did not answer on %s", sock);
    size_t got = 0;
    PT_OK(pkv_seq_open(c, 1, 3, p, n, &got));
    cr_assert_eq(got, 256, "got %zu", got);
    PT_VERIFY(c, 1, 3, p, got, got);
    pkv_stats st = stats(c);
    cr_assert_eq(st.tier_imported, 16, "STATS says %llu imported",
                 (unsigned long long)st.tier_imported);
    cr_assert_eq(st.tier_fetches, 1);
    cr_assert_eq(st.tier_fetch_found, 16);
    snprintf(cmd, sizeof cmd, "%s --status --socket %s", bin, sock);
    FILE *out = popen(cmd, "r");
    cr_assert_not_null(out);
    char line[1024];
    bool seen = false;
    while (fgets(line, sizeof line, out))
        if (strncmp(line, "tier: ", 6) == 0) {
            seen = true;
            cr_assert(strstr(line, " 1 fetches, 16 records asked, 16 found, 16 imported, "
                                   "0 rejected"), "%s", line);
        }
    cr_assert_eq(pclose(out), 0);
    cr_assert(seen, "pkvd --status printed no tier line");
    pkv_close(c);
    kill(d, SIGTERM);
    int status = 0;
    waitpid(d, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pkvd: status 0x%x", status);
    free(p);
}

/* ---- Lookups that ask the tier, publishing on hit (PKV_TIER_LOOKUP, _PUBLISH_ON_HIT) ---- */

static size_t lookup(pkv_cache *c, uint64_t salt, const uint32_t *p, size_t n) {
    size_t got = 99;
    PT_OK(pkv_prefix_lookup(c, salt, p, n, &got));
    return got;
}

/* Compute prompt p[0, n) in sequence id and commit it (its full blocks seal). */
static void compute(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *p, size_t n) {
    size_t got = 99;
    PT_OK(pkv_seq_open(c, id, salt, p, n, &got));
    PT_APPEND(c, id, salt, p, got, n - got);
    PT_OK(pkv_seq_commit(c, id, n - got));
}

/* The record at chain depth j of prompt p (salt), tagged with the secret, its
 * payload `stored` bytes stored with `enc`, put on the server at port. */
static void put_record(int port, uint64_t salt, const uint32_t *p, uint32_t j, uint32_t enc,
                       const uint8_t *stored, uint64_t stored_len, uint64_t block_bytes) {
    pkv_tier_keys k;
    pkv_tier_keys_derive(&k, SECRET, sizeof SECRET - 1);
    pkv_h128 parent = pkv_hash_root(k.seed, salt), h = parent;
    for (uint32_t i = 0; i <= j; i++) {
        parent = h;
        h = pkv_hash_block(k.seed, h, p + (size_t)i * 16, 16);
    }
    pkv_tier_rec r = {PT_LAYERS, PT_HEADS, PT_HDIM, 16, PKV_F32, j, salt, parent, h, PT_MODEL,
                      (uint32_t)strlen(PT_MODEL), NULL, block_bytes, enc, stored, stored_len};
    size_t len = pkv_tier_rec_size(r.model_len, j, 16, stored_len);
    uint8_t *out = malloc(len);
    cr_assert_not_null(out);
    pkv_tier_encode(&k, &r, p, out);
    char key[PKV_TIER_KEY_LEN + 1];
    pkv_tier_key(&k, h, &TGEO, PT_MODEL, key);
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    redisReply *rr = redisCommand(x, "SET %s %b", key, out, len);
    cr_assert(rr && rr->type == REDIS_REPLY_STATUS);
    freeReplyObject(rr);
    redisFree(x);
    free(out);
}

/* What a lookup must leave as it was: every pkv_stats field outside the tier's
 * lookup-side counters, the log's position, each block's state. */
typedef struct cache_image {
    pkv_stats st;
    pkv_block_info blk[1024];
} cache_image;

static void image_take(pkv_cache *c, cache_image *im) {
    memset(im, 0, sizeof *im);
    im->st = stats(c);
    for (uint32_t b = 0; b < 1024; b++) PT_OK(pkv_inspect_block(c, b, &im->blk[b]));
}

static void image_same(pkv_cache *c, const cache_image *a, const char *what) {
    cache_image *b = malloc(sizeof *b);
    cr_assert_not_null(b);
    image_take(c, b);
    PT_STATS_EQ(&a->st, &b->st, what);
    cr_assert(a->st.last_lsn == b->st.last_lsn && a->st.wal_records == b->st.wal_records &&
                  a->st.wal_bytes == b->st.wal_bytes && a->st.verify_failures ==
                  b->st.verify_failures && a->st.tier_imported == b->st.tier_imported &&
                  a->st.tier_fetches == b->st.tier_fetches &&
                  a->st.tier_published == b->st.tier_published,
              "%s: the log or a tier counter of the open moved", what);
    for (uint32_t i = 0; i < 1024; i++)
        cr_assert(!memcmp(&a->blk[i], &b->blk[i], sizeof a->blk[i]), "%s: block %u changed",
                  what, i);
    free(b);
}

Test(tier, lookup_asks_the_tier_only_with_the_flag_and_changes_nothing, .timeout = 120) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 257; /* 16 full blocks, all within the prompt cap */
    uint32_t *p = prompt_of(n, 11);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 1, p, n);

    /* B holds the first 4 blocks locally; the tier has all 16 */
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options to = topts(nodes, 2000);
    to.flags = PKV_TIER_LOOKUP | PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(b, &to));
    compute(b, 50, 1, p, 65);
    PT_OK(pkv_seq_close(b, 50));
    PT_OK(pkv_sync(b));
    cache_image *im = malloc(sizeof *im);
    cr_assert_not_null(im);
    image_take(b, im);
    for (int k = 0; k < 10; k++) cr_assert_eq(lookup(b, 1, p, n), 256, "lookup %d", k);
    cr_assert_eq(lookup(b, 2, p, n), 0, "another salt finds nothing");
    cr_assert_eq(lookup(b, 1, p, 65), 64, "a full local hit asks no one");
    usleep(20000); /* a group commit would have written a record by now */
    image_same(b, im, "11 lookups asking the tier");
    pkv_stats st = stats(b);
    cr_assert_eq(st.tier_lookups, 11);
    cr_assert_eq(st.tier_lookup_blocks, 10 * 12 + 16, "probed %llu",
                 (unsigned long long)st.tier_lookup_blocks);
    cr_assert_eq(st.tier_lookup_found, 10 * 12, "found %llu",
                 (unsigned long long)st.tier_lookup_found);
    cr_assert_eq(st.tier_errors, 0);
    /* the open keeps the promise: it imports what the lookup counted (B's
     * first 4 blocks came from the tier too, when it opened p[0, 65)) */
    size_t got = node_b_open(b, 1, 1, p, n, NULL);
    cr_assert_eq(got, 256);
    cr_assert_eq(stats(b).tier_imported, st.tier_imported + 12);

    /* a promise the open may not keep: a record that exists but fails rule T1
     * (a garbage LZ4 stream, correctly tagged) is counted by the lookup; the
     * open attaches only what verifies before it and computes the rest */
    uint32_t *q = prompt_of(n, 12);
    pkv_cache *a2 = pt_open_sub("a2", &o);
    node_a(a2, nodes, 1, q, n);
    pkv_cache_info inf = pt_info(b);
    uint8_t junk[64];
    memset(junk, 0xF3, sizeof junk);
    put_record(port, 1, q, 2, PKV_TIER_ENC_LZ4, junk, sizeof junk, inf.block_bytes);
    cr_assert_eq(lookup(b, 1, q, n), 256);
    got = node_b_open(b, 2, 1, q, n, NULL); /* PT_VERIFY: only correct K/V served */
    cr_assert_eq(got, 32, "B attached %zu tokens past a bad record", got);
    cr_assert(stats(b).tier_rejected >= 1);

    /* without PKV_TIER_LOOKUP (or with PKV_TIER_NO_FETCH) lookups stay local */
    uint32_t *r = prompt_of(n, 13);
    node_a(pt_open_sub("a3", &o), nodes, 1, r, n);
    const uint32_t local_only[] = {0, PKV_TIER_LOOKUP | PKV_TIER_NO_FETCH};
    for (int i = 0; i < 2; i++) {
        char sub[16];
        snprintf(sub, sizeof sub, "c%d", i);
        pkv_cache *c = pt_open_sub(sub, &o);
        pkv_tier_options tc = topts(nodes, 2000);
        tc.flags = local_only[i] | PKV_TIER_NO_PUBLISH;
        PT_OK(pkv_tier_attach(c, &tc));
        compute(c, 1, 1, r, 33);
        cr_assert_eq(lookup(c, 1, r, n), 32, "flags 0x%x: the lookup asked the tier",
                     tc.flags);
        cr_assert_eq(stats(c).tier_lookups, 0);
        cr_assert_eq(stats(c).tier_lookup_blocks, 0);
        pt_close(c);
    }
    free(im);
    free(p);
    free(q);
    free(r);
}

Test(tier, lookup_keeps_its_deadline_with_a_slow_node, .timeout = 60) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 257;
    uint32_t *p = prompt_of(n, 14);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 1, p, n);
    pkv_cache *b = pt_open_sub("b", &o);
    const uint32_t deadline = 20;
    pkv_tier_options to = topts(nodes, deadline);
    to.flags = PKV_TIER_LOOKUP | PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(b, &to));
    cr_assert_eq(lookup(b, 1, p, n), 256, "the server answers: the test is not vacuous");
    redisContext *sl = ru_connect(port);
    cr_assert_not_null(sl);
    redisAppendCommand(sl, "DEBUG SLEEP 2");
    int done = 0;
    while (!done) cr_assert_eq(redisBufferWrite(sl, &done), REDIS_OK);
    usleep(50000);
    pkv_stats st0 = stats(b);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t got = lookup(b, 1, p, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u +
                  (uint64_t)(t1.tv_nsec - t0.tv_nsec);
    cr_log_info("lookup with the server asleep: %zu tokens in %.2f ms", got, ns / 1e6);
    cr_assert_eq(got, 0, "nothing arrived in time: the local answer");
    cr_assert(ns >= (uint64_t)deadline * 1000000u, "the lookup waited until its deadline");
    cr_assert(ns < (uint64_t)(deadline + SLACK_MS) * 1000000u, "lookup took %.2f ms", ns / 1e6);
    pkv_stats st = stats(b);
    cr_assert_eq(st.tier_lookups, st0.tier_lookups + 1);
    cr_assert(st.tier_deadline_misses > st0.tier_deadline_misses);
    cr_assert_eq(st.tier_errors, st0.tier_errors + 16, "errors %llu",
                 (unsigned long long)(st.tier_errors - st0.tier_errors));
    cr_assert_eq(st.tier_lookup_found, st0.tier_lookup_found);
    /* the open's fetch after it is bounded too, and computes from the first gap */
    size_t opened = node_b_open(b, 1, 1, p, n, &ns);
    cr_assert(opened == 0 && ns < (uint64_t)(deadline + SLACK_MS) * 1000000u,
              "open: %zu tokens in %.2f ms", opened, ns / 1e6);
    redisFree(sl);
    free(p);
}

Test(tier, publish_on_hit_publishes_a_prompt_at_its_first_reuse_only, .timeout = 60) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 257; /* 16 full blocks, all within the prompt cap */
    uint32_t *p = prompt_of(n, 15);
    char key[PKV_TIER_KEY_LEN + 1];
    key_block0(1, p, key);
    pkv_options o = copts();
    pkv_cache *a = pt_open_sub("a", &o);
    pkv_tier_options to = topts(nodes, 2000);
    to.flags = PKV_TIER_PUBLISH_ON_HIT;
    PT_OK(pkv_tier_attach(a, &to));
    compute(a, 1, 1, p, n); /* computed once: 16 seals, nothing published */
    PT_OK(pkv_tier_flush(a, 10000));
    pkv_stats st = stats(a);
    cr_assert_eq(st.seals, 16);
    cr_assert_eq(st.tier_published, 0);
    cr_assert_eq(st.tier_publish_dropped, 0);
    size_t vlen = 0;
    uint8_t *v = get_value(port, key, &vlen);
    cr_assert_null(v, "block 0 reached the tier at its seal");
    size_t got = 0;
    PT_OK(pkv_seq_open(a, 2, 1, p, n, &got)); /* reused: its blocks go out */
    cr_assert_eq(got, 256);
    PT_OK(pkv_tier_flush(a, 10000));
    st = stats(a);
    cr_assert_eq(st.tier_published, 16, "published %llu (dropped %llu)",
                 (unsigned long long)st.tier_published,
                 (unsigned long long)st.tier_publish_dropped);
    v = get_value(port, key, &vlen);
    cr_assert_not_null(v, "block 0 is not on the server after its hit");
    free(v);
    PT_OK(pkv_seq_open(a, 3, 1, p, n, &got)); /* at most once per block */
    PT_OK(pkv_tier_flush(a, 10000));
    cr_assert_eq(stats(a).tier_published, 16);
    /* another attach remembers nothing of the earlier one's offers */
    pkv_tier_detach(a);
    PT_OK(pkv_tier_attach(a, &to));
    PT_OK(pkv_seq_open(a, 4, 1, p, n, &got));
    PT_OK(pkv_tier_flush(a, 10000));
    cr_assert_eq(stats(a).tier_published, 16, "the new attach published them again");

    /* with publish_max_depth, blocks past it are counted once, not at each hit */
    uint32_t *q = prompt_of(n, 16);
    pkv_tier_detach(a);
    to.publish_max_depth = 4;
    PT_OK(pkv_tier_attach(a, &to));
    compute(a, 10, 1, q, n);
    for (uint64_t id = 11; id <= 13; id++) PT_OK(pkv_seq_open(a, id, 1, q, n, &got));
    PT_OK(pkv_tier_flush(a, 10000));
    st = stats(a);
    cr_assert_eq(st.tier_published, 4);
    cr_assert_eq(st.tier_publish_dropped, 12, "dropped %llu",
                 (unsigned long long)st.tier_publish_dropped);
    /* the depth policy at the seal: the same 4 of 16 (the depth is the block's
     * index in the sequence) */
    uint32_t *r = prompt_of(n, 19);
    pkv_tier_detach(a);
    to.flags = 0;
    PT_OK(pkv_tier_attach(a, &to));
    compute(a, 20, 1, r, n);
    PT_OK(pkv_tier_flush(a, 10000));
    st = stats(a);
    cr_assert_eq(st.tier_published, 4, "published %llu at their seals",
                 (unsigned long long)st.tier_published);
    cr_assert_eq(st.tier_publish_dropped, 12);
    free(r);

    /* blocks imported from the tier are not published back at their hits */
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_tier_options tb = topts(nodes, 2000);
    tb.flags = PKV_TIER_PUBLISH_ON_HIT;
    PT_OK(pkv_tier_attach(b, &tb));
    cr_assert_eq(node_b_open(b, 1, 1, p, n, NULL), 256);
    PT_OK(pkv_seq_open(b, 2, 1, p, n, &got));
    cr_assert_eq(got, 256);
    PT_OK(pkv_tier_flush(b, 10000));
    st = stats(b);
    cr_assert_eq(st.tier_imported, 16);
    cr_assert_eq(st.tier_published, 0, "B published %llu imported blocks back",
                 (unsigned long long)st.tier_published);
    cr_assert_eq(st.tier_publish_dropped, 0);
    PT_CHECK(a);
    PT_CHECK(b);
    free(p);
    free(q);
}

/* A bad LZ4 stream in a record past a break in the run (where nothing is
 * imported) is still unpacked, so it is counted and deleted by this reader. */
Test(tier, a_bad_lz4_record_after_a_gap_is_rejected_and_deleted, .timeout = 60) {
    NEED_REDIS();
    int port = ru_start_server(false);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", port);
    const size_t n = 49; /* three full blocks */
    uint32_t *p = prompt_of(n, 17);
    pkv_options o = copts();
    pkv_cache *b = pt_open_sub("b", &o);
    pkv_cache_info inf = pt_info(b);
    /* no block 0 (a gap), a good LZ4 record at 1, a garbage one at 2 */
    uint8_t *kv = calloc(1, inf.block_bytes);
    int zcap = LZ4_compressBound((int)inf.block_bytes);
    uint8_t *z = malloc((size_t)zcap);
    cr_assert(kv && z);
    int zn = LZ4_compress_default((const char *)kv, (char *)z, (int)inf.block_bytes, zcap);
    cr_assert(zn > 0);
    put_record(port, 1, p, 1, PKV_TIER_ENC_LZ4, z, (uint64_t)zn, inf.block_bytes);
    memset(z, 0xF3, 64);
    put_record(port, 1, p, 2, PKV_TIER_ENC_LZ4, z, 64, inf.block_bytes);
    pkv_tier_options to = topts(nodes, 2000);
    to.flags = PKV_TIER_NO_PUBLISH;
    PT_OK(pkv_tier_attach(b, &to));
    cr_assert_eq(node_b_open(b, 1, 1, p, n, NULL), 0);
    PT_OK(pkv_tier_flush(b, 10000));
    pkv_stats st = stats(b);
    cr_assert_eq(st.tier_fetch_found, 2);
    cr_assert_eq(st.tier_rejected, 1, "rejected %llu", (unsigned long long)st.tier_rejected);
    cr_assert_eq(st.tier_deleted, 1);
    cr_assert_eq(st.tier_imported, 0);
    redisContext *x = ru_connect(port);
    cr_assert_not_null(x);
    redisReply *r = redisCommand(x, "DBSIZE");
    cr_assert(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1,
              "the good record stays, the bad one is gone");
    freeReplyObject(r);
    redisFree(x);
    free(z);
    free(kv);
    free(p);
}

/* pkvd --tier-lookup: a pkv_connect client's lookup runs in the daemon, so it
 * asks the daemon's tier like a local handle's; STATS and --status carry the
 * lookup counters. */
Test(tier, pkvd_lookup_asks_the_tier_with_tier_lookup, .timeout = 120) {
    NEED_REDIS();
    const char *bin = getenv("PKVD");
    if (!bin) {
        cr_skip_test("PKVD not set (meson test sets it)");
        return;
    }
    char nodes[64];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", ru_start_server(false));
    const size_t n = 257;
    uint32_t *p = prompt_of(n, 18);
    pkv_options o = copts();
    node_a(pt_open_sub("a", &o), nodes, 3, p, n);
    char sfile[512], dir[512], sock[512], cmd[2048];
    pid_t d = start_pkvd_with_tier(bin, nodes, "--tier-lookup", dir, sock, sfile);
    pkv_cache *c = NULL;
    for (int i = 0; i < 1000 && pkv_connect(sock, &c) != 0; i++) usleep(10000);
    cr_assert_not_null(c, "pkvd did not answer on %s", sock);
    cr_assert_eq(lookup(c, 3, p, n), 256);
    cr_assert_eq(lookup(c, 4, p, n), 0);
    pkv_stats st = stats(c);
    cr_assert_eq(st.tier_lookups, 2);
    cr_assert_eq(st.tier_lookup_blocks, 32);
    cr_assert_eq(st.tier_lookup_found, 16);
    cr_assert_eq(st.tier_fetches, 0, "a lookup fetches nothing");
    cr_assert_eq(st.blocks_sealed, 0, "a lookup imports nothing");
    snprintf(cmd, sizeof cmd, "%s --status --socket %s", bin, sock);
    FILE *out = popen(cmd, "r");
    cr_assert_not_null(out);
    char line[1024];
    bool seen = false;
    while (fgets(line, sizeof line, out))
        if (strncmp(line, "tier: ", 6) == 0) {
            seen = true;
            cr_assert(strstr(line, " 2 lookups (32 keys probed, 16 found)"), "%s", line);
        }
    cr_assert_eq(pclose(out), 0);
    cr_assert(seen, "pkvd --status printed no tier line");
    pkv_close(c);
    kill(d, SIGTERM);
    int status = 0;
    waitpid(d, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pkvd: status 0x%x", status);
    free(p);
}

/* pkvd refuses a cluster secret file that group or others can read (whoever
 * reads the secret can make the deployment serve wrong K/V: remote.md, "Trust
 * model"), one that is too short or too long, and one it cannot read; each
 * with exit 1 and a message naming the file, before the socket listens. */
Test(tier, pkvd_refuses_a_secret_file_others_can_read_or_of_a_bad_length, .timeout = 60) {
    const char *bin = getenv("PKVD");
    if (!bin) {
        cr_skip_test("PKVD not set (meson test sets it)");
        return;
    }
    char sfile[512], dir[512], sock[512], cmd[2048], out[4096];
    pt_path(sfile, sizeof sfile, "secret");
    pt_path(dir, sizeof dir, "d");
    pt_path(sock, sizeof sock, "s");
    char long_secret[300];
    memset(long_secret, 'k', sizeof long_secret);
    const struct {
        size_t len;
        mode_t mode;
        bool create;
        const char *expect;
    } cases[] = {
        {sizeof SECRET - 1, 0644, true, "chmod 600"},
        {sizeof SECRET - 1, 0660, true, "chmod 600"},
        {sizeof SECRET - 1, 0602, true, "chmod 600"},
        {15, 0600, true, "15 bytes, the secret needs 16..256"},
        {257, 0600, true, "longer than 256 bytes"},
        {0, 0600, false, "No such file"},
        {0, 0700, false, "not a regular file"}, /* a directory */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(sfile);
        rmdir(sfile);
        if (cases[i].mode == 0700) cr_assert_eq(mkdir(sfile, 0700), 0);
        if (cases[i].create)
            write_secret_file(sfile, cases[i].len == sizeof SECRET - 1 ? SECRET : long_secret,
                              cases[i].len, cases[i].mode);
        /* timeout: a pkvd that accepted the file would serve until killed */
        snprintf(cmd, sizeof cmd,
                 "timeout 20 '%s' --dir '%s' --socket '%s' --layers 2 --kv-heads 2 --head-dim 4 "
                 "--block-size 16 --dtype f32 --capacity 1024 --model-id %s "
                 "--tier-nodes 127.0.0.1:1 --tier-secret-file '%s' 2>&1",
                 bin, dir, sock, PT_MODEL, sfile);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = 0;
        int st = pclose(p);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "case %zu: pkvd status %d: %s", i,
                  st, out);
        cr_assert(strstr(out, cases[i].expect) && strstr(out, sfile),
                  "case %zu: expected '%s' and the file's name in: %s", i, cases[i].expect, out);
        cr_assert_eq(access(sock, F_OK), -1, "case %zu: the socket was created", i);
    }
    rmdir(sfile);
    /* The same file with mode 0600 and a good length is accepted: the daemon
     * starts (no Redis answers on port 1, which is not an error). */
    pid_t d = start_pkvd_with_tier(bin, "127.0.0.1:1", NULL, dir, sock, sfile);
    bool up = false;
    for (int t = 0; t < 1000 && !up; t++) {
        up = access(sock, F_OK) == 0;
        if (!up) usleep(10000);
        int st;
        if (!up && waitpid(d, &st, WNOHANG) == d) cr_assert_fail("pkvd exited: status %d", st);
    }
    kill(d, SIGTERM);
    waitpid(d, NULL, 0);
    cr_assert(up, "pkvd with a 0600 secret file never listened");
}
