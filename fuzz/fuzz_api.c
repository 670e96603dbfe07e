/*
 * fuzz_api.c — API-sequence fuzzer: the input becomes a series of public calls
 * (pkv_seq_open with a prompt, append, commit, fork, truncate, close,
 * pkv_checkpoint, pkv_sync, and close + reopen of the cache) on a small cache
 * whose capacity forces eviction, copy-on-write and dedupe. After every call:
 * pkv_check, and a comparison of every sequence with a reference model kept by
 * the harness (length, committed length, token ids, and the K/V bytes of every
 * position, which the harness writes as a function of the salt and the token
 * prefix, so a block served for the wrong prefix shows as wrong K/V). A prefix
 * hit in pkv_seq_open must be a multiple of the block size, below the prompt
 * length, equal to what pkv_prefix_lookup said just before, and every hit
 * position must hold the K/V of its prefix. A reopen must
 * recover every open sequence with exactly its committed tokens and their K/V
 * (docs/api.md: pending tokens are dropped, committed ones survive a close).
 *
 * Input: byte 0 selects block size and capacity; then one op per byte, followed
 * by that op's argument bytes (see the switch). At most 96 ops per input.
 * Links libpagedkv_fuzz like the other targets (its checksum bypass changes
 * nothing here: every file read is one the library wrote).
 */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIDS 6
#define MAXTOK 4096
#define MAXOPS 96
#define HD 2 /* head_dim */

typedef struct mseq {
    bool open;
    uint64_t salt;
    size_t len, committed;
    uint32_t tok[MAXTOK];
} mseq;

static mseq model[NIDS];
static uint32_t bs;
static uint64_t cap;

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

/* K/V of position p of a sequence (salt, tokens): K = two u32 of the prefix hash,
 * V = their complements. */
static void expected_kv(uint64_t salt, const uint32_t *tok, size_t p, uint32_t k[HD],
                        uint32_t v[HD]) {
    uint64_t h = mix(0x1234, salt);
    for (size_t i = 0; i <= p; i++) h = mix(h, tok[i]);
    k[0] = (uint32_t)h;
    k[1] = (uint32_t)(h >> 32);
    v[0] = ~k[0];
    v[1] = ~k[1];
}

static void write_kv(pkv_cache *c, pkv_slot s, uint64_t salt, const uint32_t *tok, size_t p) {
    uint32_t k[HD], v[HD];
    expected_kv(salt, tok, p, k, v);
    uint8_t *kp = pkv_kv(c, s.block, 0, PKV_K, 0), *vp = pkv_kv(c, s.block, 0, PKV_V, 0);
    FZ_ASSERT(kp && vp, "pkv_kv(%u) is NULL for an appended slot", s.block);
    memcpy(kp + (size_t)s.offset * HD * 4, k, sizeof k);
    memcpy(vp + (size_t)s.offset * HD * 4, v, sizeof v);
}

/* Every model sequence against the cache: info, tokens, block table, K/V. */
static void compare(pkv_cache *c, const char *when) {
    fz_check(c, when);
    size_t nopen = 0, nlist = 0;
    for (int i = 0; i < NIDS; i++) nopen += model[i].open;
    int rc = pkv_seq_list(c, NULL, 0, &nlist);
    FZ_ASSERT((rc == 0 || rc == PKV_ERANGE) && nlist == nopen,
              "after %s: %zu sequences listed, model has %zu", when, nlist, nopen);
    static uint32_t tok[MAXTOK + 1], blk[MAXTOK + 1];
    for (int i = 0; i < NIDS; i++) {
        const mseq *m = &model[i];
        pkv_seq_info si;
        rc = pkv_seq_get_info(c, (uint64_t)i + 1, &si);
        if (!m->open) {
            FZ_ASSERT(rc == PKV_ENOSEQ, "after %s: closed sequence %d: info -> %d", when, i + 1, rc);
            continue;
        }
        FZ_ASSERT(rc == 0, "after %s: sequence %d missing (%d)", when, i + 1, rc);
        FZ_ASSERT(si.len == m->len && si.committed == m->committed && si.salt == m->salt,
                  "after %s: sequence %d: len %llu committed %llu salt %llu, model %zu %zu %llu",
                  when, i + 1, (unsigned long long)si.len, (unsigned long long)si.committed,
                  (unsigned long long)si.salt, m->len, m->committed,
                  (unsigned long long)m->salt);
        size_t n = 0, nb = 0;
        FZ_ASSERT(pkv_seq_tokens(c, (uint64_t)i + 1, tok, MAXTOK + 1, &n) == 0 && n == m->len,
                  "after %s: pkv_seq_tokens of %d", when, i + 1);
        FZ_ASSERT(!memcmp(tok, m->tok, n * sizeof *tok), "after %s: sequence %d: tokens differ",
                  when, i + 1);
        FZ_ASSERT(pkv_seq_blocks(c, (uint64_t)i + 1, blk, MAXTOK + 1, &nb) == 0 &&
                      nb == (m->len + bs - 1) / bs, "after %s: pkv_seq_blocks of %d", when, i + 1);
        for (size_t p = 0; p < m->len; p++) {
            uint32_t k[HD], v[HD];
            expected_kv(m->salt, m->tok, p, k, v);
            const uint8_t *kp = pkv_kv(c, blk[p / bs], 0, PKV_K, 0);
            const uint8_t *vp = pkv_kv(c, blk[p / bs], 0, PKV_V, 0);
            FZ_ASSERT(kp && vp, "pkv_kv NULL for block %u", blk[p / bs]);
            size_t o = (p % bs) * HD * 4;
            FZ_ASSERT(!memcmp(kp + o, k, sizeof k) && !memcmp(vp + o, v, sizeof v),
                      "after %s: sequence %d position %zu (block %u) holds wrong K/V", when,
                      i + 1, p, blk[p / bs]);
        }
    }
}

static pkv_cache *open_cache(const char *dir, const pkv_options *o) {
    pkv_cache *c = NULL;
    int rc = pkv_open(dir, o, &c);
    FZ_ASSERT(rc == 0, "pkv_open: %d %s", rc, pkv_last_error());
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    static const uint32_t bss[4] = {1, 2, 4, 3};
    static const uint64_t caps[4] = {4, 6, 8, 16};
    uint8_t g = fz_u8(&in);
    bs = bss[g & 3];
    cap = caps[(g >> 2) & 3];
    memset(model, 0, sizeof model);
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = HD;
    o.dtype = PKV_F32;
    o.block_size = bs;
    o.capacity = cap;
    o.model_id = "fuzz-api";
    o.io = fz_io();
    o.durability = (g >> 4) & 1 ? PKV_DURABLE_GROUP : PKV_DURABLE_NONE;
    o.group_commit_us = 200;
    o.checkpoint_bytes = (g >> 5) & 1 ? 4096 : 0; /* small: automatic checkpoints */
    if ((g >> 6) & 1) o.flags |= PKV_OPEN_LIMBO_WAIT; /* wait for limbo before evicting */
    const char *dir = fz_dir("api");
    pkv_cache *c = open_cache(dir, &o);
    static uint32_t buf[MAXTOK];
    static pkv_slot slots[64];
    char when[64];
    for (int op = 0; op < MAXOPS && fz_more(&in); op++) {
        uint8_t code = fz_u8(&in);
        int id = (code >> 4) % NIDS;
        mseq *m = &model[id];
        uint64_t sid = (uint64_t)id + 1;
        int rc;
        switch (code & 15) {
        case 0: case 1: { /* seq_open with a prompt of tokens from a small alphabet */
            uint64_t salt = (code & 1);
            size_t n = fz_u8(&in) % 24;
            for (size_t i = 0; i < n; i++) buf[i] = fz_u8(&in) & 3;
            /* the side-effect-free lookup predicts the open's hit exactly */
            size_t looked = 0;
            int lrc = pkv_prefix_lookup(c, salt, buf, n, &looked);
            size_t hit = 12345;
            rc = pkv_seq_open(c, sid, salt, buf, n, &hit);
            snprintf(when, sizeof when, "open %d (%zu tokens)", id + 1, n);
            FZ_ASSERT(n == 0 ? lrc == PKV_EINVAL : lrc == 0, "%s: lookup gave %d", when, lrc);
            FZ_ASSERT(rc != 0 || n == 0 || looked == hit, "%s: lookup %zu, open attached %zu",
                      when, looked, hit);
            if (m->open) {
                FZ_ASSERT(rc == PKV_EEXIST, "%s: existing id gave %d", when, rc);
                break;
            }
            FZ_ASSERT(rc == 0, "%s: %d %s", when, rc, pkv_last_error());
            FZ_ASSERT(hit % bs == 0 && (n == 0 ? hit == 0 : hit <= n - 1),
                      "%s: %zu cached tokens", when, hit);
            m->open = true;
            m->salt = salt;
            m->len = m->committed = hit;
            memcpy(m->tok, buf, hit * sizeof *buf);
            break;
        }
        case 2: case 3: case 4: { /* append n tokens and write their K/V */
            size_t n = 1 + fz_u8(&in) % 12;
            for (size_t i = 0; i < n; i++) buf[i] = fz_u8(&in) & 3;
            snprintf(when, sizeof when, "append %d (%zu)", id + 1, n);
            if (m->open && m->len + n > MAXTOK) break;
            rc = pkv_seq_append(c, sid, buf, n, slots);
            if (!m->open) {
                FZ_ASSERT(rc == PKV_ENOSEQ, "%s: unknown id gave %d", when, rc);
                break;
            }
            FZ_ASSERT(rc == 0 || rc == PKV_EFULL, "%s: %d %s", when, rc, pkv_last_error());
            if (rc) break;
            memcpy(m->tok + m->len, buf, n * sizeof *buf);
            for (size_t i = 0; i < n; i++) {
                FZ_ASSERT(slots[i].block < cap && slots[i].offset == (m->len + i) % bs,
                          "%s: slot %zu = (%u, %u)", when, i, slots[i].block, slots[i].offset);
                write_kv(c, slots[i], m->salt, m->tok, m->len + i);
            }
            m->len += n;
            break;
        }
        case 5: case 6: { /* commit; sometimes more than pending */
            size_t pend = m->open ? m->len - m->committed : 0;
            size_t n = 1 + fz_u8(&in) % (pend + 2);
            snprintf(when, sizeof when, "commit %d (%zu)", id + 1, n);
            rc = pkv_seq_commit(c, sid, n);
            if (!m->open) FZ_ASSERT(rc == PKV_ENOSEQ, "%s: unknown id gave %d", when, rc);
            else if (n > pend) FZ_ASSERT(rc == PKV_ESTATE, "%s: %zu pending gave %d", when, pend, rc);
            else {
                FZ_ASSERT(rc == 0, "%s: %d %s", when, rc, pkv_last_error());
                m->committed += n;
            }
            break;
        }
        case 7: { /* fork */
            int cid = fz_u8(&in) % NIDS;
            mseq *ch = &model[cid];
            snprintf(when, sizeof when, "fork %d -> %d", id + 1, cid + 1);
            rc = pkv_seq_fork(c, sid, (uint64_t)cid + 1);
            if (!m->open) FZ_ASSERT(rc == PKV_ENOSEQ, "%s: gave %d", when, rc);
            else if (ch->open) FZ_ASSERT(rc == PKV_EEXIST, "%s: gave %d", when, rc);
            else if (m->len != m->committed) FZ_ASSERT(rc == PKV_ESTATE, "%s: gave %d", when, rc);
            else {
                FZ_ASSERT(rc == 0, "%s: %d %s", when, rc, pkv_last_error());
                *ch = *m;
            }
            break;
        }
        case 8: case 9: { /* truncate, sometimes beyond the length */
            size_t len = m->open ? m->len : 0;
            size_t nl = fz_u8(&in) % (len + 2);
            snprintf(when, sizeof when, "truncate %d to %zu", id + 1, nl);
            rc = pkv_seq_truncate(c, sid, nl);
            if (!m->open) FZ_ASSERT(rc == PKV_ENOSEQ, "%s: gave %d", when, rc);
            else if (nl > len) FZ_ASSERT(rc == PKV_ERANGE, "%s: gave %d", when, rc);
            else {
                FZ_ASSERT(rc == 0 || rc == PKV_EFULL, "%s: %d %s", when, rc, pkv_last_error());
                if (rc == 0) {
                    m->len = nl;
                    if (m->committed > nl) m->committed = nl;
                }
            }
            break;
        }
        case 10: case 11:
            snprintf(when, sizeof when, "close %d", id + 1);
            rc = pkv_seq_close(c, sid);
            FZ_ASSERT(m->open ? rc == 0 : rc == PKV_ENOSEQ, "%s: gave %d", when, rc);
            m->open = false;
            break;
        case 12:
            snprintf(when, sizeof when, "checkpoint");
            rc = pkv_checkpoint(c);
            FZ_ASSERT(rc == 0, "pkv_checkpoint: %d %s", rc, pkv_last_error());
            break;
        case 13:
            snprintf(when, sizeof when, "sync");
            rc = pkv_sync(c);
            FZ_ASSERT(rc == 0, "pkv_sync: %d %s", rc, pkv_last_error());
            break;
        case 14: { /* a batched decode step over distinct ids (id NIDS+1: unknown) */
            pkv_step st[NIDS + 1];
            size_t n = 0, done = 99;
            uint8_t mask = fz_u8(&in);
            bool room = true;
            for (int k = 0; k <= NIDS; k++) {
                if (!(mask >> k & 1) && !(k == id && (mask & 0x80))) continue;
                room = room && (k == NIDS || model[k].len + 1 < MAXTOK);
                st[n++] = (pkv_step){.id = (uint64_t)k + 1, .n_commit = fz_u8(&in) % 3u,
                                     .token = fz_u8(&in) & 3u};
            }
            if (n == 0 || !room) break;
            snprintf(when, sizeof when, "step batch of %zu", n);
            rc = pkv_seq_step_batch(c, st, n, &done);
            FZ_ASSERT(done <= n && (rc == 0) == (done == n), "%s: rc %d, done %zu", when, rc,
                      done);
            for (size_t i = 0; i < done; i++) { /* steps [0, done) took effect */
                mseq *x = &model[st[i].id - 1];
                FZ_ASSERT(st[i].id <= NIDS && x->open && st[i].n_commit <= x->len - x->committed,
                          "%s: step %zu should have failed", when, i);
                FZ_ASSERT(st[i].slot.block < cap && st[i].slot.offset == x->len % bs,
                          "%s: step %zu slot (%u, %u)", when, i, st[i].slot.block,
                          st[i].slot.offset);
                x->committed += st[i].n_commit;
                x->tok[x->len] = st[i].token;
                write_kv(c, st[i].slot, x->salt, x->tok, x->len);
                x->len++;
            }
            if (done < n) { /* the failing step: the error names why */
                mseq *x = st[done].id <= NIDS ? &model[st[done].id - 1] : NULL;
                if (!x || !x->open) FZ_ASSERT(rc == PKV_ENOSEQ, "%s: unknown id gave %d", when, rc);
                else if (st[done].n_commit > x->len - x->committed)
                    FZ_ASSERT(rc == PKV_ESTATE, "%s: gave %d", when, rc);
                else FZ_ASSERT(rc == PKV_EFULL, "%s: %d %s", when, rc, pkv_last_error());
            }
            break;
        }
        default: /* close and reopen: committed tokens of open sequences survive */
            snprintf(when, sizeof when, "reopen");
            pkv_close(c);
            pkv_options r = o;
            r.capacity = code & 1 ? 0 : cap;
            c = open_cache(dir, &r);
            for (int i = 0; i < NIDS; i++) model[i].len = model[i].committed;
            break;
        }
        compare(c, when);
    }
    /* A last read-only look after close must agree as well. */
    pkv_close(c);
    for (int i = 0; i < NIDS; i++) model[i].len = model[i].committed;
    pkv_options r = o;
    r.flags = PKV_OPEN_RDONLY;
    c = open_cache(dir, &r);
    compare(c, "read-only reopen");
    pkv_close(c);
    return 0;
}
