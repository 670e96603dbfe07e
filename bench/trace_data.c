/*
 * trace_data.c — loading, writing and synthesizing request traces, and their
 * block-level view (see trace_data.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "trace_data.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(trace *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    return -1;
}

void trace_free(trace *t) {
    free(t->req);
    free(t->ids);
    free(t->node);
    memset(t, 0, sizeof *t);
}

static int grow_req(trace *t) {
    if (t->n < t->req_cap) return 0;
    size_t cap = t->req_cap ? t->req_cap * 2 : 1024;
    trace_req *nr = realloc(t->req, cap * sizeof *nr);
    if (!nr) return fail(t, "out of memory (%zu requests)", cap);
    t->req = nr;
    t->req_cap = cap;
    return 0;
}

static int push_id(trace *t, uint64_t id) {
    if (t->nids == t->ids_cap) {
        size_t cap = t->ids_cap ? t->ids_cap * 2 : 16384;
        uint64_t *ni = realloc(t->ids, cap * sizeof *ni);
        if (!ni) return fail(t, "out of memory (%zu hash ids)", cap);
        t->ids = ni;
        t->ids_cap = cap;
    }
    t->ids[t->nids++] = id;
    return 0;
}

/* ---- Prefix nodes: a trie over (parent node, hash id) ---------------------- */

typedef struct trie_slot {
    uint64_t id;
    uint32_t parent; /* parent node + 1 (0: root) */
    uint32_t node;   /* UINT32_MAX: empty */
} trie_slot;

static int build_nodes(trace *t) {
    free(t->node);
    t->node = NULL;
    t->nnodes = 0;
    t->distinct_ids = 0;
    t->prompt_tokens = t->output_tokens = 0;
    t->max_in = 0;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)t->nids + 16) size <<= 1;
    trie_slot *tab = malloc(size * sizeof *tab);
    uint64_t *idset = malloc(size * sizeof *idset); /* distinct raw ids, +1 (0: empty) */
    t->node = malloc((t->nids ? t->nids : 1) * sizeof *t->node);
    if (!tab || !idset || !t->node) {
        free(tab);
        free(idset);
        return fail(t, "out of memory (prefix table of %" PRIu64 " slots)", size);
    }
    for (uint64_t i = 0; i < size; i++) {
        tab[i].node = UINT32_MAX;
        idset[i] = 0;
    }
    uint64_t mask = size - 1;
    for (size_t r = 0; r < t->n; r++) {
        const trace_req *q = &t->req[r];
        t->prompt_tokens += q->in_len;
        t->output_tokens += q->out_len;
        if (q->in_len > t->max_in) t->max_in = q->in_len;
        uint32_t parent = 0;
        for (uint32_t k = 0; k < q->nh; k++) {
            uint64_t id = t->ids[q->h0 + k];
            uint64_t h = trace_mix64(id * 0x9E3779B97F4A7C15ull ^ parent) & mask;
            while (tab[h].node != UINT32_MAX && (tab[h].id != id || tab[h].parent != parent))
                h = (h + 1) & mask;
            if (tab[h].node == UINT32_MAX) {
                tab[h].id = id;
                tab[h].parent = parent;
                tab[h].node = t->nnodes++;
                uint64_t g = trace_mix64(id + 0x51ED27u) & mask;
                while (idset[g] && idset[g] != id + 1) g = (g + 1) & mask;
                if (!idset[g]) {
                    idset[g] = id + 1;
                    t->distinct_ids++;
                }
            }
            t->node[q->h0 + k] = tab[h].node;
            parent = tab[h].node + 1;
        }
    }
    free(tab);
    free(idset);
    return 0;
}

/* ---- JSONL ---------------------------------------------------------------- */

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static bool parse_u64(cursor *c, uint64_t *out) {
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return false;
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        uint64_t d = (uint64_t)(*c->p - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
        c->p++;
    }
    /* Tolerate a fractional part ("12.0") but not an exponent. */
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    }
    *out = v;
    return true;
}

static bool expect(cursor *c, char ch) {
    skip_ws(c);
    if (c->p >= c->end || *c->p != ch) return false;
    c->p++;
    return true;
}

/* Skip any scalar or array of scalars (unknown keys). */
static bool skip_value(cursor *c) {
    skip_ws(c);
    if (c->p >= c->end) return false;
    if (*c->p == '"') {
        for (c->p++; c->p < c->end && *c->p != '"'; c->p++)
            if (*c->p == '\\') c->p++;
        return c->p < c->end && c->p++;
    }
    if (*c->p == '[') {
        int depth = 0;
        for (; c->p < c->end; c->p++) {
            if (*c->p == '[') depth++;
            else if (*c->p == ']' && --depth == 0) {
                c->p++;
                return true;
            }
        }
        return false;
    }
    while (c->p < c->end && *c->p != ',' && *c->p != '}') c->p++;
    return true;
}

static int parse_line(trace *t, cursor *c, const char *path, size_t line) {
    uint64_t ts = 0, in = UINT64_MAX, out = UINT64_MAX;
    bool have_ids = false;
    size_t first = t->nids;
    if (!expect(c, '{')) return fail(t, "%s:%zu: expected '{'", path, line);
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') return fail(t, "%s:%zu: empty object", path, line);
    for (;;) {
        if (!expect(c, '"')) return fail(t, "%s:%zu: expected a key", path, line);
        const char *k = c->p;
        while (c->p < c->end && *c->p != '"') c->p++;
        if (c->p >= c->end) return fail(t, "%s:%zu: unterminated key", path, line);
        size_t klen = (size_t)(c->p - k);
        c->p++;
        if (!expect(c, ':')) return fail(t, "%s:%zu: expected ':'", path, line);
#define KEY(s) (klen == sizeof(s) - 1 && memcmp(k, s, klen) == 0)
        if (KEY("timestamp")) {
            if (!parse_u64(c, &ts)) return fail(t, "%s:%zu: bad timestamp", path, line);
        } else if (KEY("input_length")) {
            if (!parse_u64(c, &in) || in > UINT32_MAX)
                return fail(t, "%s:%zu: bad input_length", path, line);
        } else if (KEY("output_length")) {
            if (!parse_u64(c, &out) || out > UINT32_MAX)
                return fail(t, "%s:%zu: bad output_length", path, line);
        } else if (KEY("hash_ids")) {
            if (have_ids) return fail(t, "%s:%zu: hash_ids twice", path, line);
            have_ids = true;
            if (!expect(c, '[')) return fail(t, "%s:%zu: hash_ids is not an array", path, line);
            skip_ws(c);
            if (c->p < c->end && *c->p == ']') {
                c->p++;
            } else {
                for (;;) {
                    uint64_t id;
                    if (!parse_u64(c, &id))
                        return fail(t, "%s:%zu: bad hash id (non-negative integers only)",
                                    path, line);
                    if (push_id(t, id)) return -1;
                    skip_ws(c);
                    if (c->p < c->end && *c->p == ',') {
                        c->p++;
                        continue;
                    }
                    if (!expect(c, ']')) return fail(t, "%s:%zu: expected ']'", path, line);
                    break;
                }
            }
        } else if (!skip_value(c)) {
            return fail(t, "%s:%zu: bad value for key %.*s", path, line, (int)klen, k);
        }
#undef KEY
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (!expect(c, '}')) return fail(t, "%s:%zu: expected ',' or '}'", path, line);
        break;
    }
    skip_ws(c);
    if (c->p < c->end) return fail(t, "%s:%zu: trailing characters", path, line);
    if (in == UINT64_MAX || out == UINT64_MAX || !have_ids)
        return fail(t, "%s:%zu: input_length, output_length and hash_ids are required",
                    path, line);
    uint64_t nh = t->nids - first;
    uint64_t want = (in + TRACE_HASH_TOKENS - 1) / TRACE_HASH_TOKENS;
    if (nh != want)
        return fail(t, "%s:%zu: %" PRIu64 " hash ids for input_length %" PRIu64
                       " (want ceil(input_length/512) = %" PRIu64 ")",
                    path, line, nh, in, want);
    if (grow_req(t)) return -1;
    trace_req *q = &t->req[t->n++];
    q->ts = ts;
    q->in_len = (uint32_t)in;
    q->out_len = (uint32_t)out;
    q->nh = (uint32_t)nh;
    q->h0 = first;
    return 0;
}

int trace_load(trace *t, const char *path) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(t, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 1 << 20) {
            cap = cap ? cap * 2 : 4 << 20;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return fail(t, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (k == 0) break;
    }
    int ferr = ferror(f);
    fclose(f);
    if (ferr) {
        free(buf);
        return fail(t, "%s: read error", path);
    }
    int rc = 0;
    size_t line = 0;
    for (const char *p = buf, *end = buf + len; p < end && !rc;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line++;
        cursor c = {p, le};
        skip_ws(&c);
        if (c.p < c.end) rc = parse_line(t, &c, path, line);
        p = nl ? nl + 1 : end;
    }
    free(buf);
    if (!rc && t->n == 0) rc = fail(t, "%s: no requests", path);
    if (!rc) rc = build_nodes(t);
    if (rc) {
        char err[sizeof t->err];
        memcpy(err, t->err, sizeof err);
        trace_free(t);
        memcpy(t->err, err, sizeof err);
    }
    return rc;
}

int trace_write(const trace *t, const char *path) {
    trace *mt = (trace *)t; /* only err is written */
    FILE *f = fopen(path, "w");
    if (!f) return fail(mt, "%s: %s", path, strerror(errno));
    for (size_t r = 0; r < t->n; r++) {
        const trace_req *q = &t->req[r];
        fprintf(f, "{\"timestamp\": %" PRIu64 ", \"input_length\": %" PRIu32
                   ", \"output_length\": %" PRIu32 ", \"hash_ids\": [",
                q->ts, q->in_len, q->out_len);
        for (uint32_t k = 0; k < q->nh; k++)
            fprintf(f, k ? ", %" PRIu64 : "%" PRIu64, t->ids[q->h0 + k]);
        fputs("]}\n", f);
    }
    if (fclose(f) != 0) return fail(mt, "%s: write error", path);
    return 0;
}

int trace_truncate(trace *t, size_t n) {
    if (n >= t->n) return 0;
    t->n = n;
    t->nids = n ? t->req[n - 1].h0 + t->req[n - 1].nh : 0;
    return build_nodes(t);
}

void trace_prompt(const trace *t, uint64_t seed, size_t r, uint32_t *out) {
    const trace_req *q = &t->req[r];
    uint32_t left = q->in_len;
    for (uint32_t k = 0; k < q->nh && left; k++) {
        uint64_t id = t->ids[q->h0 + k];
        uint32_t m = left < TRACE_HASH_TOKENS ? left : TRACE_HASH_TOKENS;
        uint64_t x = trace_mix64(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
        uint64_t base = id * TRACE_HASH_TOKENS;
        for (uint32_t j = 0; j < m; j++) out[j] = (uint32_t)(trace_mix64(x ^ (base + j)) >> 32);
        out += m;
        left -= m;
    }
}

void trace_output(uint64_t seed, size_t r, uint64_t from, size_t n, uint32_t *out) {
    for (size_t j = 0; j < n; j++) out[j] = trace_output_token(seed, r, from + j);
}

/* ---- Synthetic traces ------------------------------------------------------ */

void trace_synth_defaults(trace_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->requests = 12000;
    o->sys_prompts = 64;
    o->zipf_s = 1.1;
    o->sys_min = 512;
    o->sys_max = 8192;
    o->user_min = 16;
    o->user_max = 2048;
    o->out_min = 16;
    o->out_max = 1024;
    o->mean_turns = 6.0;
    o->max_prompt = 65536;
    o->doc_share = 0.15;
    o->doc_min = 8192;
    o->doc_max = 65536;
    o->concurrency = 512;
    o->mean_gap_ms = 300.0;
}

typedef struct srng {
    uint64_t s;
} srng;

static inline uint64_t srng_next(srng *g) {
    g->s += 0x9E3779B97F4A7C15ull;
    return trace_mix64(g->s);
}
static inline double srng_unit(srng *g) { /* [0, 1) */
    return (double)(srng_next(g) >> 11) * (1.0 / 9007199254740992.0);
}
static inline uint32_t srng_below(srng *g, uint32_t n) {
    return (uint32_t)(((srng_next(g) >> 32) * (uint64_t)n) >> 32);
}
static uint32_t log_uniform(srng *g, uint32_t lo, uint32_t hi) {
    if (hi <= lo) return lo;
    double v = exp(log((double)lo) + srng_unit(g) * (log((double)hi + 1) - log((double)lo)));
    uint32_t x = (uint32_t)v;
    return x < lo ? lo : x > hi ? hi : x;
}

typedef struct sess {
    uint64_t *ids;  /* ids of the full 512-token blocks of the last prompt */
    uint32_t nids, cap;
    uint32_t len;   /* tokens of the history (last prompt + its answer) */
    uint32_t turns_left;
    bool doc;
} sess;

static int sess_reserve(trace *t, sess *s, uint32_t n) {
    if (n <= s->cap) return 0;
    uint32_t cap = s->cap ? s->cap : 16;
    while (cap < n) cap *= 2;
    uint64_t *ni = realloc(s->ids, cap * sizeof *ni);
    if (!ni) return fail(t, "out of memory");
    s->ids = ni;
    s->cap = cap;
    return 0;
}

int trace_synthesize(trace *t, const trace_synth_opts *o) {
    memset(t, 0, sizeof *t);
    if (!o->requests || !o->sys_prompts || !o->concurrency || o->sys_min > o->sys_max ||
        o->user_min > o->user_max || o->out_min > o->out_max || o->doc_min > o->doc_max ||
        o->user_min == 0 || o->out_min == 0 || o->doc_min == 0 || o->mean_turns < 1.0)
        return fail(t, "bad synthetic trace options");
    srng g = {o->seed * 0xA24BAED4963EE407ull + 0x9FB21C651E98DF25ull};
    uint64_t next_id = 0;
    /* System prompts: lengths, ids of their full blocks, Zipf CDF. */
    uint32_t ns = o->sys_prompts;
    uint32_t *sys_len = malloc(ns * sizeof *sys_len);
    uint64_t **sys_ids = calloc(ns, sizeof *sys_ids);
    double *cdf = malloc(ns * sizeof *cdf);
    sess *ss = calloc(o->concurrency, sizeof *ss);
    int rc = 0;
    if (!sys_len || !sys_ids || !cdf || !ss) {
        rc = fail(t, "out of memory");
        goto out;
    }
    double sum = 0;
    for (uint32_t i = 0; i < ns; i++) {
        sys_len[i] = o->sys_min + srng_below(&g, o->sys_max - o->sys_min + 1);
        uint32_t full = sys_len[i] / TRACE_HASH_TOKENS;
        sys_ids[i] = malloc((full ? full : 1) * sizeof **sys_ids);
        if (!sys_ids[i]) {
            rc = fail(t, "out of memory");
            goto out;
        }
        for (uint32_t k = 0; k < full; k++) sys_ids[i][k] = next_id++;
        sum += 1.0 / pow((double)(i + 1), o->zipf_s);
        cdf[i] = sum;
    }
    for (uint32_t i = 0; i < ns; i++) cdf[i] /= sum;
    double p_more = 1.0 - 1.0 / o->mean_turns;
    double ts = 0;
    while (t->n < o->requests && !rc) {
        sess *s = &ss[srng_below(&g, o->concurrency)];
        uint32_t add;
        bool fresh = s->turns_left == 0;
        if (fresh) { /* start a new session in this slot */
            double u = srng_unit(&g);
            uint32_t lo = 0, hi = ns - 1;
            while (lo < hi) {
                uint32_t mid = (lo + hi) / 2;
                if (cdf[mid] < u) lo = mid + 1;
                else hi = mid;
            }
            uint32_t full = sys_len[lo] / TRACE_HASH_TOKENS;
            if ((rc = sess_reserve(t, s, full))) break;
            memcpy(s->ids, sys_ids[lo], full * sizeof *s->ids);
            s->nids = full;
            s->len = sys_len[lo];
            s->doc = srng_unit(&g) < o->doc_share;
            s->turns_left = 1;
            if (!s->doc)
                while (s->turns_left < 1000 && srng_unit(&g) < p_more) s->turns_left++;
            add = s->doc ? log_uniform(&g, o->doc_min, o->doc_max)
                         : log_uniform(&g, o->user_min, o->user_max);
        } else {
            add = log_uniform(&g, o->user_min, o->user_max);
        }
        uint32_t n = s->len + add;
        if (n > o->max_prompt && !fresh) {
            /* Too long: the session ends; a new one takes its slot. */
            s->turns_left = 0;
            continue;
        }
        uint32_t nh = (n + TRACE_HASH_TOKENS - 1) / TRACE_HASH_TOKENS;
        if ((rc = grow_req(t))) break;
        trace_req *q = &t->req[t->n++];
        q->ts = (uint64_t)ts;
        q->in_len = n;
        q->out_len = log_uniform(&g, o->out_min, o->out_max);
        q->nh = nh;
        q->h0 = t->nids;
        for (uint32_t k = 0; k < nh && !rc; k++)
            rc = push_id(t, k < s->nids ? s->ids[k] : next_id++);
        if (rc) break;
        /* The history now holds this prompt and its answer; the full blocks of
         * this prompt keep their ids in the next turn. */
        uint32_t full = n / TRACE_HASH_TOKENS;
        if ((rc = sess_reserve(t, s, full))) break;
        memcpy(s->ids, t->ids + q->h0, full * sizeof *s->ids);
        s->nids = full;
        s->len = n + q->out_len;
        s->turns_left--;
        ts += -log(1.0 - srng_unit(&g)) * o->mean_gap_ms;
    }
    if (!rc) rc = build_nodes(t);
out:
    if (sys_ids)
        for (uint32_t i = 0; i < ns; i++) free(sys_ids[i]);
    free(sys_ids);
    free(sys_len);
    free(cdf);
    if (ss)
        for (uint32_t i = 0; i < o->concurrency; i++) free(ss[i].ids);
    free(ss);
    if (rc) {
        char err[sizeof t->err];
        memcpy(err, t->err, sizeof err);
        trace_free(t);
        memcpy(t->err, err, sizeof err);
    }
    return rc;
}

/* ---- Block view ------------------------------------------------------------ */

void trace_blocks_free(trace_blocks *tb) {
    free(tb->off);
    free(tb->nu);
    memset(tb, 0, sizeof *tb);
}

int trace_blocks_build(const trace *t, uint32_t bs, trace_blocks *tb, char *err,
                       size_t errlen) {
    memset(tb, 0, sizeof *tb);
    if (bs == 0 || TRACE_HASH_TOKENS % bs != 0) {
        snprintf(err, errlen, "block size %u does not divide %u", bs, TRACE_HASH_TOKENS);
        return -1;
    }
    tb->bs = bs;
    tb->sub = TRACE_HASH_TOKENS / bs;
    tb->prompt_ids = (uint64_t)t->nnodes * tb->sub;
    tb->off = malloc((t->n + 1) * sizeof *tb->off);
    uint64_t total = 0;
    if (tb->off) {
        for (size_t r = 0; r < t->n; r++) {
            const trace_req *q = &t->req[r];
            tb->off[r] = total;
            total += q->in_len / bs;
            uint64_t all = (uint64_t)q->in_len + q->out_len;
            tb->unique_blocks += all / bs - q->in_len / bs;
            uint64_t held = (all + bs - 1) / bs;
            if (held > tb->max_req_blocks) tb->max_req_blocks = held;
            uint64_t maxb = q->in_len ? (q->in_len - 1) / bs : 0;
            tb->candidate_refs += maxb;
            tb->candidate_tokens += maxb * bs;
        }
        tb->off[t->n] = total;
    }
    tb->nu = malloc((total ? total : 1) * sizeof *tb->nu);
    uint32_t *last = malloc((tb->prompt_ids ? tb->prompt_ids : 1) * sizeof *last);
    if (!tb->off || !tb->nu || !last) {
        free(last);
        trace_blocks_free(tb);
        snprintf(err, errlen, "out of memory (block view of %" PRIu64 " blocks)", total);
        return -1;
    }
    /* Forward: distinct contents and first references ("seen" = sealed by an earlier
     * request, which is what even an infinite cache needs for a hit). */
    for (uint64_t i = 0; i < tb->prompt_ids; i++) last[i] = TRACE_NEVER;
    for (size_t r = 0; r < t->n; r++) {
        const trace_req *q = &t->req[r];
        uint64_t nfull = q->in_len / bs, maxb = q->in_len ? (q->in_len - 1) / bs : 0;
        for (uint64_t i = 0; i < maxb; i++)
            if (last[trace_pnode(t, tb, r, i)] == TRACE_NEVER) tb->cold_candidate_refs++;
        for (uint64_t i = 0; i < nfull; i++) {
            uint32_t *l = &last[trace_pnode(t, tb, r, i)];
            if (*l == TRACE_NEVER) {
                tb->distinct_prompt++;
                *l = (uint32_t)r;
            }
        }
    }
    /* Backward: next use among hit candidates. */
    for (uint64_t i = 0; i < tb->prompt_ids; i++) last[i] = TRACE_NEVER;
    for (size_t r = t->n; r-- > 0;) {
        const trace_req *q = &t->req[r];
        uint64_t nfull = q->in_len / bs, maxb = q->in_len ? (q->in_len - 1) / bs : 0;
        uint32_t *nu = tb->nu + tb->off[r];
        for (uint64_t i = 0; i < nfull; i++) nu[i] = last[trace_pnode(t, tb, r, i)];
        for (uint64_t i = 0; i < maxb; i++) last[trace_pnode(t, tb, r, i)] = (uint32_t)r;
    }
    free(last);
    return 0;
}
