/*
 * pkvd-example — a small pkv_connect client (docs/pkvd.md, "Starting it"): the
 * least an engine does with a connected handle.
 *
 * Usage: pkvd-example SOCKET [user]
 * Owns nothing but its connection. It sends a fixed 200-token "system prompt"
 * plus a few tokens of its own (from `user`, default "1"): it asks how much is
 * cached (pkv_prefix_lookup), opens the sequence, checks that every attached
 * token's K/V in its own mapping of the arena is the K/V of its exact prefix,
 * computes and writes the K/V of the rest (a pure function of the prefix,
 * standing in for a model), commits, and closes. Run twice, or by two users,
 * the second run attaches the system prompt the first one wrote. Prints one
 * line; exit status 0, or 1 with the error (a wrong K/V included).
 */
#include "pagedkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYS 200

/* The K/V "model": element e of a token's row is a function of its prefix hash. */
static float val(uint64_t h, uint32_t layer, uint32_t kind, uint32_t head, uint32_t e) {
    uint64_t x = h ^ ((uint64_t)layer << 48 | (uint64_t)kind << 40 | (uint64_t)head << 24 | e);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (float)(x & 0xFFFF);
}

/* Write (or check) the K/V of token `off` of `block` for prefix hash h. */
static int kv(pkv_cache *c, const pkv_cache_info *inf, uint32_t block, uint32_t off, uint64_t h,
              int check) {
    for (uint32_t l = 0; l < inf->num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hd = 0; hd < inf->num_kv_heads; hd++) {
                uint8_t *run = pkv_kv(c, block, l, (pkv_kind)k, hd);
                if (!run) return -1;
                uint8_t *row = run + (size_t)off * inf->head_dim * inf->elem_size;
                for (uint32_t e = 0; e < inf->head_dim; e++) {
                    float v = val(h, l, k, hd, e);
                    if (inf->dtype == PKV_F32) {
                        float *f = (float *)row + e;
                        if (check && *f != v) return -1;
                        if (!check) *f = v;
                    } else {
                        uint16_t w = inf->dtype == PKV_F16 ? pkv_f32_to_f16(v) : pkv_f32_to_bf16(v);
                        uint16_t *u = (uint16_t *)row + e;
                        if (check && *u != w) return -1;
                        if (!check) *u = w;
                    }
                }
            }
    return 0;
}

static uint64_t step(uint64_t h, uint32_t tok) {
    h ^= tok + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0x100000001B3ull;
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "pkvd-example: %s: %s (%s)\n", what, pkv_strerror(rc), pkv_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pkvd-example SOCKET [user]\n");
        return 2;
    }
    uint32_t user = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 1;
    uint32_t p[SYS + 8];
    for (uint32_t i = 0; i < SYS; i++) p[i] = 1000 + i * 31 % 997;
    for (uint32_t i = 0; i < 8; i++) p[SYS + i] = 50000 + user * 8 + i;
    size_t n = SYS + 8;
    pkv_cache *c = NULL;
    int rc = pkv_connect(argv[1], &c);
    if (rc) return fail("pkv_connect", rc);
    pkv_cache_info inf;
    size_t looked = 0, nc = 0, nb = 0;
    uint32_t *tab = malloc((n / 1 + 1) * sizeof *tab);
    pkv_slot *slots = malloc(n * sizeof *slots);
    if (!tab || !slots) return fail("memory", PKV_ENOMEM);
    if ((rc = pkv_info(c, &inf)) || (rc = pkv_prefix_lookup(c, 0, p, n, &looked)) ||
        (rc = pkv_seq_open(c, 1, 0, p, n, &nc)) || (rc = pkv_seq_blocks(c, 1, tab, n, &nb)))
        return fail("open", rc);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t t = 0; t < nc; t++) {
        h = step(h, p[t]);
        if (kv(c, &inf, tab[t / inf.block_size], (uint32_t)(t % inf.block_size), h, 1)) {
            fprintf(stderr, "pkvd-example: wrong K/V at attached token %zu\n", t);
            return 1;
        }
    }
    if ((rc = pkv_seq_append(c, 1, p + nc, n - nc, slots))) return fail("append", rc);
    for (size_t i = 0; i < n - nc; i++) {
        h = step(h, p[nc + i]);
        if (kv(c, &inf, slots[i].block, slots[i].offset, h, 0)) return fail("kv", PKV_ERANGE);
    }
    if ((rc = pkv_seq_commit(c, 1, n - nc)) || (rc = pkv_seq_close(c, 1)))
        return fail("commit", rc);
    printf("user %u: %zu of %zu prompt tokens cached (lookup said %zu), their K/V read in "
           "place and correct; %zu computed and written\n",
           user, nc, n, looked, n - nc);
    free(tab);
    free(slots);
    pkv_close(c);
    return 0;
}
