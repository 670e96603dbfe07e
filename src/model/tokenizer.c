/*
 * tokenizer.c — byte-level BPE from a GGUF (see tokenizer.h for what it
 * guarantees and which pre-tokenizers it implements).
 *
 * Tables built at load, all pointing into the GGUF mapping for strings: a hash
 * from token text to id, a hash from a merge's (left id, right id) to its rank
 * and result id, the token of each byte's GPT-2 character, the special tokens
 * sorted longest first. Encoding is: split off special tokens, pre-tokenize,
 * then merge each piece with a heap of candidate pairs (O(n log n) per piece, so
 * a long run of one character costs no more than its length).
 */
#include "tokenizer.h"

#include "sha256.h"
#include "unicode_table.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_NORMAL 1
#define TT_CONTROL 3
#define TT_USER_DEFINED 4

/* ---- Errors ------------------------------------------------------------------ */

static _Thread_local char tok_err[512];

const char *pkv_tok_last_error(void) { return tok_err; }

__attribute__((format(printf, 2, 3))) static int terr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(tok_err, sizeof tok_err, "tokenizer: ");
    vsnprintf(tok_err + n, sizeof tok_err - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- Growable arrays ----------------------------------------------------------- */

typedef struct ids_vec {
    uint32_t *v;
    size_t n, cap;
} ids_vec;

static int ids_push(ids_vec *a, uint32_t id) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        uint32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return terr(PKV_ENOMEM, "no memory for %zu token ids", nc);
        a->v = nv, a->cap = nc;
    }
    a->v[a->n++] = id;
    return 0;
}

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const void *s, size_t n) {
    if (b->cap - b->n <= n) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc - b->n <= n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return terr(PKV_ENOMEM, "no memory for %zu bytes of text", nc);
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int buf_puts(buf *b, const char *s) { return buf_put(b, s, strlen(s)); }

/* ---- The tokenizer ------------------------------------------------------------- */

typedef struct merge_slot {
    uint64_t key;    /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    uint32_t result;
} merge_slot;

struct pkv_tok {
    uint32_t n_vocab;
    pkv_gguf_str *text; /* token texts (into the mapping) */
    uint8_t *type;
    uint32_t *vocab_ht; /* open addressing, UINT32_MAX = empty */
    size_t vocab_mask;
    merge_slot *merges;
    size_t merge_mask;
    uint32_t byte_tok[256];
    uint8_t cp_byte[324]; /* GPT-2 character (< 324) -> byte */
    uint8_t cp_is_byte[324];
    uint32_t *specials; /* ids, longest text first */
    size_t n_specials;
    int split_digits;
    char pre[32];
    uint32_t bos, eos, pad;
    char *default_system; /* NULL when the template has none */
    int chatml;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

static uint32_t vocab_get(const pkv_tok *t, const char *s, size_t n) {
    for (size_t i = hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint32_t id = t->vocab_ht[i];
        if (id == UINT32_MAX) return PKV_TOK_NONE;
        if (t->text[id].len == n && memcmp(t->text[id].ptr, s, n) == 0) return id;
    }
}

/* Later duplicates of a text replace earlier ones, as in the reference tokenizers. */
static void vocab_put(pkv_tok *t, uint32_t id) {
    const pkv_gguf_str *s = &t->text[id];
    for (size_t i = hash_bytes(s->ptr, s->len) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint32_t o = t->vocab_ht[i];
        if (o == UINT32_MAX || (t->text[o].len == s->len &&
                                memcmp(t->text[o].ptr, s->ptr, s->len) == 0)) {
            t->vocab_ht[i] = id;
            return;
        }
    }
}

static const merge_slot *merge_get(const pkv_tok *t, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = hash_pair(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *m = &t->merges[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

/* The first occurrence of a pair keeps its (lower) rank. */
static void merge_put(pkv_tok *t, uint32_t a, uint32_t b, uint32_t rank, uint32_t result) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = hash_pair(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        merge_slot *m = &t->merges[i];
        if (m->key == key) return;
        if (m->key == UINT64_MAX) {
            *m = (merge_slot){key, rank, result};
            return;
        }
    }
}

/* ---- UTF-8 and Unicode categories ---------------------------------------------- */

#define CP_INVALID 0xFFFFFFFFu

/* The code point at s[0..n) and its length; an invalid or truncated sequence is
 * one byte of CP_INVALID (a category of its own: not L, N or space). */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    *len = 1;
    if (c < 0x80) return c;
    size_t need;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) need = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) need = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) need = 4, cp = c & 0x07, min = 0x10000;
    else return CP_INVALID;
    if (need > n) return CP_INVALID;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80) return CP_INVALID;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return CP_INVALID;
    *len = need;
    return cp;
}

static int utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* 'L', 'N', 's' (White_Space, as the regex engines' \s) or 0. */
static char category(uint32_t cp) {
    switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x20: case 0x85:
    case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
        return 's';
    default:
        break;
    }
    if (cp >= 0x2000 && cp <= 0x200a) return 's';
    if (cp == CP_INVALID) return 0;
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return 'L';
        return cp >= '0' && cp <= '9' ? 'N' : 0;
    }
    size_t lo = 0, hi = sizeof pkv_uni_ranges / sizeof pkv_uni_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < pkv_uni_ranges[mid].lo) hi = mid;
        else if (cp > pkv_uni_ranges[mid].hi) lo = mid + 1;
        else return pkv_uni_ranges[mid].cat;
    }
    return 0;
}

/* ---- Pre-tokenizer -------------------------------------------------------------- */

typedef int (*piece_fn)(const pkv_tok *t, const char *s, size_t n, ids_vec *out);

typedef struct scan {
    const unsigned char *s;
    size_t n;
} scan;

static uint32_t cp_at(const scan *sc, size_t i, size_t *len) {
    return utf8_at(sc->s + i, sc->n - i, len);
}

/* The end of the run from i of code points whose category is (same ? == : !=) c
 * for every c in `cats` (a NUL-terminated set). */
static size_t run_end(const scan *sc, size_t i, const char *cats, int same) {
    while (i < sc->n) {
        size_t l;
        char c = category(cp_at(sc, i, &l));
        int in = c && strchr(cats, c);
        if (in != same) break;
        i += l;
    }
    return i;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd, lower case) at i, or 0. */
static size_t contraction(const scan *sc, size_t i) {
    const unsigned char *s = sc->s + i;
    size_t n = sc->n - i;
    if (n < 2 || s[0] != '\'') return 0;
    if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd') return 2;
    if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') ||
                   (s[1] == 'l' && s[2] == 'l')))
        return 3;
    return 0;
}

/* The end of the gpt2 regex's match at i (i < n). */
static size_t gpt2_match(const scan *sc, size_t i) {
    size_t c = contraction(sc, i);
    if (c) return i + c;
    size_t l0;
    uint32_t cp = cp_at(sc, i, &l0);
    char cat = category(cp);
    size_t j = i;
    /* " ?X+": an optional single space before a letter, number or other run. */
    if (cp == ' ' && i + 1 < sc->n) {
        size_t l1;
        char next = category(cp_at(sc, i + 1, &l1));
        if (next != 's') j = i + 1, cat = next;
    }
    if (j > i || cat != 's') {
        if (cat == 'L') return run_end(sc, j, "L", 1);
        if (cat == 'N') return run_end(sc, j, "N", 1);
        return run_end(sc, j, "LNs", 0);
    }
    /* Whitespace: "\s+(?!\S)" leaves the last one for the word that follows;
     * a single one before a non-space is "\s+". */
    size_t end = i, last = i;
    while (end < sc->n) {
        size_t l;
        if (category(cp_at(sc, end, &l)) != 's') break;
        last = end;
        end += l;
    }
    if (end == sc->n || last == i) return end;
    return last;
}

static int gpt2_split(const pkv_tok *t, const char *s, size_t n, piece_fn fn, ids_vec *out) {
    scan sc = {(const unsigned char *)s, n};
    for (size_t i = 0; i < n;) {
        size_t e = gpt2_match(&sc, i);
        assert(e > i && e <= n);
        int rc = fn(t, s + i, e - i, out);
        if (rc) return rc;
        i = e;
    }
    return 0;
}

/* Every number code point on its own, the gpt2 regex on the text between. */
static int pre_tokenize(const pkv_tok *t, const char *s, size_t n, piece_fn fn, ids_vec *out) {
    if (!t->split_digits) return gpt2_split(t, s, n, fn, out);
    scan sc = {(const unsigned char *)s, n};
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        if (category(cp_at(&sc, i, &l)) != 'N') {
            i += l;
            continue;
        }
        int rc = gpt2_split(t, s + from, i - from, fn, out);
        if (!rc) rc = fn(t, s + i, l, out);
        if (rc) return rc;
        i += l;
        from = i;
    }
    return gpt2_split(t, s + from, n - from, fn, out);
}

/* ---- BPE ------------------------------------------------------------------------ */

typedef struct sym {
    uint32_t id;
    int32_t prev, next; /* -1 at the ends */
} sym;

typedef struct cand {
    uint32_t rank;
    int32_t left;
    uint32_t lid, rid; /* the pair as it was when pushed */
} cand;

static int cand_less(const cand *a, const cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

typedef struct heap {
    cand *v;
    size_t n;
} heap;

static void heap_push(heap *h, cand c) {
    size_t i = h->n++;
    while (i && cand_less(&c, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = c;
}

static cand heap_pop(heap *h) {
    cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && cand_less(&h->v[c + 1], &h->v[c])) c++;
        if (!cand_less(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void push_pair(const pkv_tok *t, heap *h, const sym *sy, int32_t left) {
    if (left < 0 || sy[left].next < 0) return;
    const merge_slot *m = merge_get(t, sy[left].id, sy[sy[left].next].id);
    if (m) heap_push(h, (cand){m->rank, left, sy[left].id, sy[sy[left].next].id});
}

/* One pre-tokenized piece: its bytes' tokens, merged by rank. */
static int bpe_piece(const pkv_tok *t, const char *s, size_t n, ids_vec *out) {
    if (n == 0) return 0;
    sym *sy = malloc(n * sizeof *sy);
    heap h = {malloc(3 * n * sizeof *h.v), 0};
    int rc = 0;
    if (!sy || !h.v) {
        rc = terr(PKV_ENOMEM, "no memory for a %zu-byte piece", n);
        goto out;
    }
    /* Bytes without a token are dropped, as the reference tokenizer drops them. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = t->byte_tok[(unsigned char)s[i]];
        if (id == PKV_TOK_NONE) continue;
        sy[m] = (sym){id, (int32_t)m - 1, -1};
        if (m) sy[m - 1].next = (int32_t)m;
        m++;
    }
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, &h, sy, (int32_t)i);
    while (h.n) {
        cand c = heap_pop(&h);
        int32_t r = sy[c.left].next;
        /* Stale: the left symbol was merged away or changed since the push. */
        if (sy[c.left].id != c.lid || r < 0 || sy[r].id != c.rid) continue;
        sy[c.left].id = merge_get(t, c.lid, c.rid)->result;
        sy[c.left].next = sy[r].next;
        if (sy[r].next >= 0) sy[sy[r].next].prev = c.left;
        sy[r].id = PKV_TOK_NONE; /* dead: no candidate matches it again */
        push_pair(t, &h, sy, sy[c.left].prev);
        push_pair(t, &h, sy, c.left);
    }
    for (int32_t i = m ? 0 : -1; i >= 0 && !rc; i = sy[i].next) rc = ids_push(out, sy[i].id);
out:
    free(sy);
    free(h.v);
    return rc;
}

/* ---- Encode / decode ------------------------------------------------------------ */

/* The special token that starts at s (longest first), or PKV_TOK_NONE. */
static uint32_t special_at(const pkv_tok *t, const char *s, size_t n) {
    for (size_t k = 0; k < t->n_specials; k++) {
        const pkv_gguf_str *x = &t->text[t->specials[k]];
        if (x->len && x->len <= n && memcmp(s, x->ptr, x->len) == 0) return t->specials[k];
    }
    return PKV_TOK_NONE;
}

int pkv_tok_encode(const pkv_tok *t, const char *text, size_t len, int parse_special,
                   uint32_t **ids, size_t *n) {
    if (!t || (!text && len) || !ids || !n) return terr(PKV_EINVAL, "NULL argument");
    ids_vec out = {0};
    int rc = 0;
    size_t from = 0;
    for (size_t i = 0; i < len && parse_special;) {
        uint32_t sp = special_at(t, text + i, len - i);
        if (sp == PKV_TOK_NONE) {
            i++;
            continue;
        }
        if ((rc = pre_tokenize(t, text + from, i - from, bpe_piece, &out))) goto fail;
        if ((rc = ids_push(&out, sp))) goto fail;
        i += t->text[sp].len;
        from = i;
    }
    if ((rc = pre_tokenize(t, text + from, len - from, bpe_piece, &out))) goto fail;
    if (!out.v && (rc = ids_push(&out, 0)) == 0) out.n = 0; /* a valid pointer for "" */
    if (rc) goto fail;
    *ids = out.v;
    *n = out.n;
    return 0;
fail:
    free(out.v);
    return rc;
}

/* A normal token's text is GPT-2 byte characters; map each back to its byte. */
static int decode_token(const pkv_tok *t, uint32_t id, buf *b) {
    const pkv_gguf_str *x = &t->text[id];
    if (t->type[id] == TT_CONTROL || t->type[id] == TT_USER_DEFINED)
        return buf_put(b, x->ptr, x->len);
    const unsigned char *s = (const unsigned char *)x->ptr;
    for (size_t i = 0; i < x->len;) {
        size_t l;
        uint32_t cp = utf8_at(s + i, x->len - i, &l);
        int rc;
        if (cp < 324 && t->cp_is_byte[cp]) {
            char c = (char)t->cp_byte[cp];
            rc = buf_put(b, &c, 1);
        } else {
            rc = buf_put(b, s + i, l); /* not a byte character: as it is */
        }
        if (rc) return rc;
        i += l;
    }
    return 0;
}

int pkv_tok_decode(const pkv_tok *t, const uint32_t *ids, size_t n, char **text,
                   size_t *len) {
    if (!t || (!ids && n) || !text || !len) return terr(PKV_EINVAL, "NULL argument");
    buf b = {0};
    int rc = buf_put(&b, "", 0);
    for (size_t i = 0; i < n && !rc; i++) {
        if (ids[i] >= t->n_vocab)
            rc = terr(PKV_ERANGE, "token id %u at index %zu is not below the vocabulary "
                      "size %u", ids[i], i, t->n_vocab);
        else
            rc = decode_token(t, ids[i], &b);
    }
    if (rc) {
        free(b.p);
        return rc;
    }
    *text = b.p;
    *len = b.n;
    return 0;
}

/* ---- Load ----------------------------------------------------------------------- */

/* GPT-2's byte characters: printable Latin-1 bytes stand for themselves, the
 * others (controls, space, 0x7f-0xa0, 0xad) for 256, 257, ... in byte order. */
static void byte_chars(uint32_t cp_of[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        cp_of[b] = printable ? b : next++;
    }
}

static int load_vocab(pkv_tok *t, const pkv_gguf *g) {
    pkv_gguf_arr toks, types;
    int rc = pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_STRING, &toks);
    if (rc) return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    if (toks.n == 0 || toks.n >= PKV_TOK_NONE)
        return terr(PKV_ECORRUPT, "vocabulary of %llu tokens", (unsigned long long)toks.n);
    t->n_vocab = (uint32_t)toks.n;
    int have_types = pkv_gguf_get_arr(g, "tokenizer.ggml.token_type", PKV_GGUF_I32, &types) == 0;
    if (have_types && types.n != toks.n)
        return terr(PKV_ECORRUPT, "%llu token types for %u tokens",
                    (unsigned long long)types.n, t->n_vocab);
    t->text = malloc(t->n_vocab * sizeof *t->text);
    t->type = malloc(t->n_vocab);
    t->vocab_mask = pow2_at_least(2 * (size_t)t->n_vocab) - 1;
    t->vocab_ht = malloc((t->vocab_mask + 1) * sizeof *t->vocab_ht);
    if (!t->text || !t->type || !t->vocab_ht)
        return terr(PKV_ENOMEM, "no memory for %u tokens", t->n_vocab);
    memset(t->vocab_ht, 0xff, (t->vocab_mask + 1) * sizeof *t->vocab_ht);
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        t->text[i] = pkv_gguf_arr_str(&toks, i);
        int32_t ty = have_types ? pkv_gguf_arr_i32(&types, i) : TT_NORMAL;
        t->type[i] = ty >= 0 && ty < 256 ? (uint8_t)ty : 0;
        vocab_put(t, i);
    }
    return 0;
}

static int load_bytes(pkv_tok *t) {
    uint32_t cp_of[256];
    byte_chars(cp_of);
    for (uint32_t b = 0; b < 256; b++) {
        char u[4];
        int l = utf8_put(cp_of[b], u);
        t->byte_tok[b] = vocab_get(t, u, (size_t)l);
        t->cp_byte[cp_of[b]] = (uint8_t)b;
        t->cp_is_byte[cp_of[b]] = 1;
    }
    return 0;
}

static int load_merges(pkv_tok *t, const pkv_gguf *g) {
    pkv_gguf_arr m;
    int rc = pkv_gguf_get_arr(g, "tokenizer.ggml.merges", PKV_GGUF_STRING, &m);
    if (rc) return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    if (m.n >= UINT32_MAX / 4) return terr(PKV_ECORRUPT, "%llu merges", (unsigned long long)m.n);
    t->merge_mask = pow2_at_least(2 * (size_t)m.n + 1) - 1;
    t->merges = malloc((t->merge_mask + 1) * sizeof *t->merges);
    buf cat = {0};
    if (!t->merges) return terr(PKV_ENOMEM, "no memory for %llu merges", (unsigned long long)m.n);
    for (size_t i = 0; i <= t->merge_mask; i++) t->merges[i].key = UINT64_MAX;
    for (uint64_t r = 0; r < m.n; r++) {
        pkv_gguf_str s = pkv_gguf_arr_str(&m, r);
        const char *sp = memchr(s.ptr, ' ', s.len);
        if (!sp) {
            rc = terr(PKV_ECORRUPT, "merge %llu ('%.*s') has no space",
                      (unsigned long long)r, (int)s.len, s.ptr);
            break;
        }
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        uint32_t a = vocab_get(t, s.ptr, ll), b = vocab_get(t, sp + 1, rl);
        cat.n = 0;
        if ((rc = buf_put(&cat, s.ptr, ll)) || (rc = buf_put(&cat, sp + 1, rl))) break;
        uint32_t res = vocab_get(t, cat.p, cat.n);
        if (a == PKV_TOK_NONE || b == PKV_TOK_NONE || res == PKV_TOK_NONE) {
            rc = terr(PKV_ECORRUPT, "merge %llu ('%.*s') names a token not in the vocabulary",
                      (unsigned long long)r, (int)s.len, s.ptr);
            break;
        }
        merge_put(t, a, b, (uint32_t)r, res);
    }
    free(cat.p);
    return rc;
}

static int load_id(const pkv_gguf *g, const pkv_tok *t, const char *key, uint32_t *out) {
    *out = PKV_TOK_NONE;
    if (pkv_gguf_find(g, key) < 0) return 0;
    uint32_t v;
    if (pkv_gguf_get_u32(g, key, &v)) return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    if (v >= t->n_vocab)
        return terr(PKV_ECORRUPT, "%s = %u is not below the vocabulary size %u", key, v,
                    t->n_vocab);
    *out = v;
    return 0;
}

static int by_length_desc(const void *a, const void *b, void *arg) {
    const pkv_tok *t = arg;
    size_t la = t->text[*(const uint32_t *)a].len, lb = t->text[*(const uint32_t *)b].len;
    if (la != lb) return la > lb ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static int load_specials(pkv_tok *t) {
    t->specials = malloc(t->n_vocab * sizeof *t->specials);
    if (!t->specials) return terr(PKV_ENOMEM, "no memory for the special tokens");
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER_DEFINED) && t->text[i].len)
            t->specials[t->n_specials++] = i;
    qsort_r(t->specials, t->n_specials, sizeof *t->specials, by_length_desc, t);
    return 0;
}

static int load_pre(pkv_tok *t, const pkv_gguf *g) {
    pkv_gguf_str model, pre = {"gpt2", 4};
    if (pkv_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4))
        return terr(PKV_ENOTSUP, "tokenizer.ggml.model '%.*s': only \"gpt2\" (byte-level BPE) "
                    "is supported", (int)model.len, model.ptr);
    if (pkv_gguf_find(g, "tokenizer.ggml.pre") >= 0 &&
        pkv_gguf_get_str(g, "tokenizer.ggml.pre", &pre))
        return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    static const char *const digits[] = {"smollm", "starcoder", "refact", "codeshell"};
    snprintf(t->pre, sizeof t->pre, "%.*s", (int)(pre.len < 31 ? pre.len : 31), pre.ptr);
    if (!strcmp(t->pre, "gpt2") || !strcmp(t->pre, "default")) return 0;
    for (size_t i = 0; i < sizeof digits / sizeof digits[0]; i++)
        if (!strcmp(t->pre, digits[i]) && pre.len == strlen(digits[i])) {
            t->split_digits = 1;
            return 0;
        }
    return terr(PKV_ENOTSUP, "pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported "
                "(gpt2, smollm, starcoder, refact, codeshell are)", (int)pre.len, pre.ptr);
}

static int load_template(pkv_tok *t, const pkv_gguf *g);

int pkv_tok_load(const pkv_gguf *g, pkv_tok **out) {
    if (!g || !out) return terr(PKV_EINVAL, "NULL argument");
    *out = NULL;
    pkv_tok *t = calloc(1, sizeof *t);
    if (!t) return terr(PKV_ENOMEM, "no memory for the tokenizer");
    int rc = load_pre(t, g);
    if (!rc) rc = load_vocab(t, g);
    if (!rc) rc = load_bytes(t);
    if (!rc) rc = load_merges(t, g);
    if (!rc) rc = load_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos);
    if (!rc) rc = load_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos);
    if (!rc) rc = load_id(g, t, "tokenizer.ggml.padding_token_id", &t->pad);
    if (!rc) rc = load_specials(t);
    if (!rc) rc = load_template(t, g);
    if (rc) {
        pkv_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void pkv_tok_free(pkv_tok *t) {
    if (!t) return;
    free(t->text);
    free(t->type);
    free(t->vocab_ht);
    free(t->merges);
    free(t->specials);
    free(t->default_system);
    free(t);
}

uint32_t pkv_tok_vocab(const pkv_tok *t) { return t->n_vocab; }
uint32_t pkv_tok_bos(const pkv_tok *t) { return t->bos; }
uint32_t pkv_tok_eos(const pkv_tok *t) { return t->eos; }
uint32_t pkv_tok_pad(const pkv_tok *t) { return t->pad; }
const char *pkv_tok_pre(const pkv_tok *t) { return t->pre; }

int pkv_tok_is_special(const pkv_tok *t, uint32_t id) {
    return id < t->n_vocab && (t->type[id] == TT_CONTROL || t->type[id] == TT_USER_DEFINED);
}

uint32_t pkv_tok_find(const pkv_tok *t, const char *text) {
    return t && text ? vocab_get(t, text, strlen(text)) : PKV_TOK_NONE;
}

/* ---- Chat template -------------------------------------------------------------- */

static const char *find_n(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, needle, nn) == 0) return h + i;
    return NULL;
}

/* ChatML if the template uses <|im_start|> and <|im_end|>; the default system
 * message is the literal "<|im_start|>system\n...<|im_end|>" it emits when the
 * first message is not a system one. */
static int load_template(pkv_tok *t, const pkv_gguf *g) {
    pkv_gguf_str tpl;
    if (pkv_gguf_find(g, "tokenizer.chat_template") < 0) {
        t->chatml = 1; /* no template: plain ChatML, no default system message */
        return 0;
    }
    if (pkv_gguf_get_str(g, "tokenizer.chat_template", &tpl))
        return terr(PKV_ECORRUPT, "%s", pkv_gguf_last_error());
    t->chatml = find_n(tpl.ptr, tpl.len, "<|im_start|>") && find_n(tpl.ptr, tpl.len, "<|im_end|>");
    if (!t->chatml || !find_n(tpl.ptr, tpl.len, "!= 'system'")) return 0;
    static const char head[] = "<|im_start|>system\n";
    const char *s = find_n(tpl.ptr, tpl.len, head);
    if (!s) return 0;
    s += strlen(head);
    size_t rest = tpl.len - (size_t)(s - tpl.ptr);
    const char *e = find_n(s, rest, "<|im_end|>");
    /* A literal: no template syntax or quote inside. */
    if (!e || find_n(s, (size_t)(e - s), "'") || find_n(s, (size_t)(e - s), "{")) return 0;
    t->default_system = strndup(s, (size_t)(e - s));
    return t->default_system ? 0 : terr(PKV_ENOMEM, "no memory for the system message");
}

const char *pkv_tok_default_system(const pkv_tok *t) { return t->default_system; }

static int chat_turn(buf *b, const char *role, const char *content) {
    int rc = buf_puts(b, "<|im_start|>");
    if (!rc) rc = buf_puts(b, role);
    if (!rc) rc = buf_puts(b, "\n");
    if (!rc) rc = buf_puts(b, content);
    if (!rc) rc = buf_puts(b, "<|im_end|>\n");
    return rc;
}

int pkv_tok_chat(const pkv_tok *t, const pkv_chat_msg *msgs, size_t n,
                 int add_generation_prompt, char **text, size_t *len) {
    if (!t || (!msgs && n) || !text || !len) return terr(PKV_EINVAL, "NULL argument");
    if (!t->chatml) return terr(PKV_ENOTSUP, "the chat template is not ChatML");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return terr(PKV_EINVAL, "message %zu has a NULL role or content", i);
    buf b = {0};
    int rc = buf_put(&b, "", 0);
    if (!rc && n && t->default_system && strcmp(msgs[0].role, "system"))
        rc = chat_turn(&b, "system", t->default_system);
    for (size_t i = 0; i < n && !rc; i++) rc = chat_turn(&b, msgs[i].role, msgs[i].content);
    if (!rc && add_generation_prompt) rc = buf_puts(&b, "<|im_start|>assistant\n");
    if (rc) {
        free(b.p);
        return rc;
    }
    *text = b.p;
    *len = b.n;
    return 0;
}

/* ---- Identity ------------------------------------------------------------------- */

int pkv_tok_model_id(const pkv_gguf *g, const pkv_tok *t, char *out, size_t cap) {
    if (!g || !t || !out) return terr(PKV_EINVAL, "NULL argument");
    size_t len;
    const void *bytes = pkv_gguf_bytes(g, &len);
    char hex[65];
    pkv_sha256_hex(bytes, len, hex);
    int n = snprintf(out, cap, "gguf-sha256:%s;tok=gpt2/%s/%u", hex, t->pre, t->n_vocab);
    if (n < 0 || (size_t)n >= cap)
        return terr(PKV_ERANGE, "model id needs %d bytes, buffer has %zu", n + 1, cap);
    return 0;
}
