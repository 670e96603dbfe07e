/*
 * fixture_json.c — the recursive-descent JSON reader of fixture_json.h.
 */
#include "fixture_json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct P {
    const char *s;
    size_t n, i;
    const char *err;
} P;

static void ws(P *p) {
    while (p->i < p->n && strchr(" \t\r\n", p->s[p->i])) p->i++;
}

static int fail(P *p, const char *msg) {
    if (!p->err) p->err = msg;
    return -1;
}

static int value(P *p, fj *out, int depth);

static int hex4(P *p, uint32_t *v) {
    if (p->n - p->i < 4) return fail(p, "short \\u escape");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (d < 0) return fail(p, "bad \\u escape");
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int string(P *p, char **out, size_t *len) {
    p->i++; /* the quote */
    char *b = malloc(p->n - p->i + 1); /* escapes only shrink */
    size_t o = 0;
    if (!b) return fail(p, "no memory");
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if (c != '\\') {
            b[o++] = c;
            continue;
        }
        if (p->i >= p->n) break;
        c = p->s[p->i++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *k = strchr(from, c);
        if (c && k) {
            b[o++] = to[k - from];
            continue;
        }
        uint32_t cp, lo;
        if (c != 'u' || hex4(p, &cp)) {
            free(b);
            return fail(p, "bad escape");
        }
        if (cp >= 0xd800 && cp < 0xdc00 && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            p->i += 2;
            if (hex4(p, &lo)) {
                free(b);
                return -1;
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        o += put_utf8(b + o, cp);
    }
    if (p->i >= p->n) {
        free(b);
        return fail(p, "unterminated string");
    }
    p->i++;
    b[o] = 0;
    *out = b;
    *len = o;
    return 0;
}

static int members(P *p, fj *out, int obj, int depth) {
    char close = obj ? '}' : ']';
    size_t cap = 0;
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 0;
    }
    for (;;) {
        if (out->len == cap) {
            cap = cap ? cap * 2 : 8;
            fj *ni = realloc(out->item, cap * sizeof *ni);
            if (!ni) return fail(p, "no memory");
            out->item = ni;
        }
        fj *m = &out->item[out->len];
        memset(m, 0, sizeof *m);
        ws(p);
        char *key = NULL;
        if (obj) {
            size_t kl;
            if (p->i >= p->n || p->s[p->i] != '"' || string(p, &key, &kl)) return fail(p, "expected a key");
            ws(p);
            if (p->i >= p->n || p->s[p->i++] != ':') {
                free(key);
                return fail(p, "expected ':'");
            }
        }
        int rc = value(p, m, depth + 1);
        m->key = key;
        out->len++;
        if (rc) return rc;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return 0;
        }
        return fail(p, "expected ',' or a closing bracket");
    }
}

static int value(P *p, fj *out, int depth) {
    ws(p);
    if (depth > 64) return fail(p, "too deep");
    if (p->i >= p->n) return fail(p, "unexpected end");
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        out->kind = c == '{' ? FJ_OBJ : FJ_ARR;
        return members(p, out, c == '{', depth);
    }
    if (c == '"') {
        out->kind = FJ_STR;
        return string(p, &out->str, &out->len);
    }
    static const struct { const char *w; fj_kind k; double v; } lits[] = {
        {"true", FJ_BOOL, 1}, {"false", FJ_BOOL, 0}, {"null", FJ_NULL, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(lits[k].w);
        if (p->n - p->i >= l && !memcmp(p->s + p->i, lits[k].w, l)) {
            out->kind = lits[k].k, out->num = lits[k].v;
            p->i += l;
            return 0;
        }
    }
    char tmp[64];
    size_t l = 0;
    while (p->i + l < p->n && l < sizeof tmp - 1 && strchr("+-0123456789.eE", p->s[p->i + l])) l++;
    if (!l) return fail(p, "unexpected character");
    memcpy(tmp, p->s + p->i, l);
    tmp[l] = 0;
    out->kind = FJ_NUM;
    out->num = strtod(tmp, NULL);
    p->i += l;
    return 0;
}

static void fj_clear(fj *v) {
    free(v->str);
    free(v->key);
    for (size_t i = 0; (v->kind == FJ_ARR || v->kind == FJ_OBJ) && i < v->len; i++)
        fj_clear(&v->item[i]);
    free(v->item);
}

void fj_free(fj *v) {
    if (!v) return;
    fj_clear(v);
    free(v);
}

fj *fj_parse(const char *text, size_t n, const char **err) {
    P p = {text, n, 0, NULL};
    fj *v = calloc(1, sizeof *v);
    if (!v) {
        if (err) *err = "no memory";
        return NULL;
    }
    if (value(&p, v, 0)) {
        if (err) *err = p.err;
        fj_free(v);
        return NULL;
    }
    return v;
}

fj *fj_load(const char *path, const char **err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err) *err = "cannot open the fixture";
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n > 0 ? (size_t)n : 1);
    fj *v = NULL;
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) v = fj_parse(b, (size_t)n, err);
    else if (err) *err = "cannot read the fixture";
    free(b);
    fclose(f);
    return v;
}

const fj *fj_get(const fj *obj, const char *key) {
    if (!obj || obj->kind != FJ_OBJ) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (obj->item[i].key && !strcmp(obj->item[i].key, key)) return &obj->item[i];
    return NULL;
}
