/*
 * gguf.c — the validating GGUF reader (see gguf.h for the invariants it
 * establishes at open).
 *
 * One pass over the file at open: a cursor that refuses to move past the end
 * reads the header, every key/value (recording where each value starts and, for
 * arrays of strings, where every element starts) and every tensor info; then the
 * data section's start is aligned and every tensor's range checked. Lookups later
 * read only what open already checked, so they cannot fail on the file's account.
 * All arithmetic on sizes read from the file goes through overflow-checked helpers.
 */
#include "gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY 65535u

/* ---- Errors ------------------------------------------------------------------ */

static _Thread_local char gguf_err[512];

const char *pkv_gguf_last_error(void) { return gguf_err; }

__attribute__((format(printf, 2, 3))) static int gerr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(gguf_err, sizeof gguf_err, "gguf: ");
    vsnprintf(gguf_err + n, sizeof gguf_err - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- The handle -------------------------------------------------------------- */

typedef struct kv_rec {
    pkv_gguf_str key;
    pkv_gguf_vtype type;
    pkv_gguf_vtype elem; /* arrays: element type */
    uint64_t n;          /* arrays: element count */
    size_t val;          /* offset of the value (arrays: of the first element) */
    uint64_t *str_off;   /* arrays of strings: offset of each element's length */
    size_t at;           /* offset of the record */
} kv_rec;

struct pkv_gguf {
    const unsigned char *base;
    size_t size;
    int mapped; /* munmap at close */
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    kv_rec *kv;
    pkv_gguf_tensor *tensors;
    size_t data_start;
};

/* ---- Overflow-checked arithmetic --------------------------------------------- */

static int add_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static int mul_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* ---- The bounded cursor ------------------------------------------------------- */

typedef struct cursor {
    const unsigned char *base;
    size_t size, pos;
} cursor;

static size_t left(const cursor *c) { return c->size - c->pos; }

/* Take n bytes (or fail naming `what` and the offset). */
static int take(cursor *c, size_t n, const char *what, const unsigned char **p) {
    if (n > left(c))
        return gerr(PKV_ECORRUPT, "%s at offset %zu: needs %zu bytes, file ends after %zu",
                    what, c->pos, n, left(c));
    *p = c->base + c->pos;
    c->pos += n;
    return 0;
}

static int rd_u32(cursor *c, const char *what, uint32_t *v) {
    const unsigned char *p = NULL;
    int rc = take(c, 4, what, &p);
    if (rc) return rc;
    memcpy(v, p, 4);
    return 0;
}

static int rd_u64(cursor *c, const char *what, uint64_t *v) {
    const unsigned char *p = NULL;
    int rc = take(c, 8, what, &p);
    if (rc) return rc;
    memcpy(v, p, 8);
    return 0;
}

/* A length-prefixed string whose length must be in [min, max]. */
static int rd_str(cursor *c, const char *what, uint64_t min, uint64_t max, pkv_gguf_str *s) {
    size_t at = c->pos;
    uint64_t n;
    int rc = rd_u64(c, what, &n);
    if (rc) return rc;
    if (n < min || n > max)
        return gerr(PKV_ECORRUPT, "%s at offset %zu: length %llu outside [%llu, %llu]", what,
                    at, (unsigned long long)n, (unsigned long long)min,
                    (unsigned long long)max);
    if (n > left(c))
        return gerr(PKV_ECORRUPT, "%s at offset %zu: length %llu runs past the end of the "
                    "file (%zu bytes left)", what, at, (unsigned long long)n, left(c));
    s->ptr = (const char *)c->base + c->pos;
    s->len = (size_t)n;
    c->pos += (size_t)n;
    return 0;
}

/* ---- Value types ------------------------------------------------------------- */

/* Bytes of a fixed-size value type; 0 for STRING and ARRAY; -1 if unknown. */
static int vsize(uint32_t t) {
    switch (t) {
    case PKV_GGUF_U8: case PKV_GGUF_I8: case PKV_GGUF_BOOL: return 1;
    case PKV_GGUF_U16: case PKV_GGUF_I16: return 2;
    case PKV_GGUF_U32: case PKV_GGUF_I32: case PKV_GGUF_F32: return 4;
    case PKV_GGUF_U64: case PKV_GGUF_I64: case PKV_GGUF_F64: return 8;
    case PKV_GGUF_STRING: case PKV_GGUF_ARRAY: return 0;
    default: return -1;
    }
}

static const char *vname(uint32_t t) {
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* A bool must be 0 or 1: anything else is a damaged byte, not a truth value. */
static int check_bool(const cursor *c, size_t at, const char *what) {
    unsigned char b = c->base[at];
    if (b > 1) return gerr(PKV_ECORRUPT, "%s at offset %zu: bool value %u", what, at, b);
    return 0;
}

static int rd_array(cursor *c, kv_rec *r) {
    size_t at = c->pos;
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(c, "array element type", &et);
    if (!rc) rc = rd_u64(c, "array length", &n);
    if (rc) return rc;
    if (et == PKV_GGUF_ARRAY)
        return gerr(PKV_ECORRUPT, "key '%.*s': array of arrays at offset %zu (not supported)",
                    (int)r->key.len, r->key.ptr, at);
    int es = vsize(et);
    if (es < 0)
        return gerr(PKV_ECORRUPT, "key '%.*s': unknown array element type %u at offset %zu",
                    (int)r->key.len, r->key.ptr, et, at);
    r->elem = (pkv_gguf_vtype)et;
    r->n = n;
    r->val = c->pos;
    /* A string element takes at least its 8-byte length. */
    uint64_t min_each = es ? (uint64_t)es : 8u;
    if (n > left(c) / min_each)
        return gerr(PKV_ECORRUPT, "key '%.*s': array of %llu %s at offset %zu does not fit in "
                    "the %zu bytes left", (int)r->key.len, r->key.ptr, (unsigned long long)n,
                    vname(et), at, left(c));
    if (es) {
        size_t bytes = (size_t)n * (size_t)es;
        if (et == PKV_GGUF_BOOL)
            for (size_t i = 0; i < (size_t)n; i++)
                if ((rc = check_bool(c, c->pos + i, "bool array element"))) return rc;
        c->pos += bytes;
        return 0;
    }
    r->str_off = malloc((size_t)(n ? n : 1) * sizeof *r->str_off);
    if (!r->str_off) return gerr(PKV_ENOMEM, "no memory for %llu string offsets",
                                 (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        pkv_gguf_str s;
        r->str_off[i] = c->pos;
        if ((rc = rd_str(c, "string array element", 0, UINT64_MAX, &s))) return rc;
    }
    return 0;
}

static int rd_value(cursor *c, kv_rec *r) {
    size_t at = c->pos;
    int es = vsize(r->type);
    if (es < 0)
        return gerr(PKV_ECORRUPT, "key '%.*s': unknown value type %u at offset %zu",
                    (int)r->key.len, r->key.ptr, (unsigned)r->type, at - 4);
    r->val = at;
    if (r->type == PKV_GGUF_ARRAY) return rd_array(c, r);
    if (r->type == PKV_GGUF_STRING) {
        pkv_gguf_str s;
        return rd_str(c, "string value", 0, UINT64_MAX, &s);
    }
    const unsigned char *p = NULL;
    int rc = take(c, (size_t)es, "value", &p);
    if (!rc && r->type == PKV_GGUF_BOOL) rc = check_bool(c, at, "bool value");
    return rc;
}

/* ---- Tensor types ------------------------------------------------------------ */

typedef struct ttype {
    const char *name;
    uint32_t blck;  /* elements per block; 0 = no such type */
    uint32_t bytes; /* bytes per block */
} ttype;

/* ggml's types (types 4 and 5 were removed from ggml and are refused). */
static const ttype ttypes[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},
};

static const ttype *ttype_of(uint32_t t) {
    if (t >= sizeof ttypes / sizeof ttypes[0] || !ttypes[t].blck) return NULL;
    return &ttypes[t];
}

const char *pkv_gguf_type_name(uint32_t type) {
    const ttype *tt = ttype_of(type);
    return tt ? tt->name : "unknown";
}

int pkv_gguf_type_supported(uint32_t type) {
    return type == PKV_GGUF_T_F32 || type == PKV_GGUF_T_F16 || type == PKV_GGUF_T_BF16 ||
           type == PKV_GGUF_T_Q8_0 || type == PKV_GGUF_T_Q4_1 || type == PKV_GGUF_T_Q4_0;
}

/* ---- Open -------------------------------------------------------------------- */

static int same(pkv_gguf_str s, const char *z, size_t zl) {
    return s.len == zl && memcmp(s.ptr, z, zl) == 0;
}

static int64_t find_key(const pkv_gguf *g, const char *key, size_t kl) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (same(g->kv[i].key, key, kl)) return (int64_t)i;
    return -1;
}

static int rd_header(pkv_gguf *g, cursor *c) {
    const unsigned char *p = NULL;
    int rc = take(c, 4, "magic", &p);
    if (rc) return rc;
    if (memcmp(p, "GGUF", 4))
        return gerr(PKV_ECORRUPT, "bad magic at offset 0: %02x %02x %02x %02x (want \"GGUF\")",
                    p[0], p[1], p[2], p[3]);
    if ((rc = rd_u32(c, "version", &g->version))) return rc;
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return gerr(PKV_EVERSION, "big-endian GGUF (version field %08x at offset 4): not "
                    "supported", g->version);
    if (g->version != 2 && g->version != 3)
        return gerr(PKV_EVERSION, "version %u at offset 4: only versions 2 and 3 are read",
                    g->version);
    if ((rc = rd_u64(c, "tensor count", &g->n_tensors))) return rc;
    if ((rc = rd_u64(c, "key/value count", &g->n_kv))) return rc;
    /* Smallest tensor info: name length, n_dims, type, offset (24 bytes); smallest
     * key/value: key length, one key byte, type, one value byte (14 bytes). */
    if (g->n_tensors > left(c) / 24)
        return gerr(PKV_ECORRUPT, "tensor count %llu at offset 8 cannot fit in a %zu-byte "
                    "file", (unsigned long long)g->n_tensors, c->size);
    if (g->n_kv > left(c) / 14)
        return gerr(PKV_ECORRUPT, "key/value count %llu at offset 16 cannot fit in a %zu-byte "
                    "file", (unsigned long long)g->n_kv, c->size);
    return 0;
}

static int rd_kvs(pkv_gguf *g, cursor *c) {
    g->kv = calloc((size_t)(g->n_kv ? g->n_kv : 1), sizeof *g->kv);
    if (!g->kv) return gerr(PKV_ENOMEM, "no memory for %llu key/values",
                            (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_rec *r = &g->kv[i];
        size_t at = c->pos;
        uint32_t t;
        int rc = rd_str(c, "key", 1, GGUF_MAX_KEY, &r->key);
        if (!rc) rc = rd_u32(c, "value type", &t);
        if (rc) return rc;
        r->type = (pkv_gguf_vtype)t;
        if (memchr(r->key.ptr, 0, r->key.len))
            return gerr(PKV_ECORRUPT, "key %llu at offset %zu contains a NUL byte",
                        (unsigned long long)i, at);
        r->at = at;
        if ((rc = rd_value(c, r))) return rc;
    }
    return 0;
}

/* ---- Uniqueness (keys, tensor names): sort, compare neighbours ---------------- */

typedef struct named {
    pkv_gguf_str s;
    size_t at; /* offset of its record, for the message */
} named;

static int named_cmp(const void *a, const void *b) {
    const named *x = a, *y = b;
    size_t n = x->s.len < y->s.len ? x->s.len : y->s.len;
    int c = memcmp(x->s.ptr, y->s.ptr, n);
    if (c) return c;
    if (x->s.len != y->s.len) return x->s.len < y->s.len ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* A name given twice (the later record is named), so that a lookup has one answer. */
static int check_unique(named *v, uint64_t n, const char *what) {
    qsort(v, (size_t)n, sizeof *v, named_cmp);
    for (uint64_t i = 1; i < n; i++)
        if (same(v[i].s, v[i - 1].s.ptr, v[i - 1].s.len))
            return gerr(PKV_ECORRUPT, "duplicate %s '%.*s' at offset %zu", what,
                        (int)v[i].s.len, v[i].s.ptr, v[i].at);
    return 0;
}

static int unique_keys(const pkv_gguf *g) {
    named *v = malloc((size_t)(g->n_kv ? g->n_kv : 1) * sizeof *v);
    if (!v) return gerr(PKV_ENOMEM, "no memory to check %llu keys", (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) v[i] = (named){g->kv[i].key, g->kv[i].at};
    int rc = check_unique(v, g->n_kv, "key");
    free(v);
    return rc;
}

static int unique_tensors(const pkv_gguf *g, const size_t *at) {
    named *v = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *v);
    if (!v) return gerr(PKV_ENOMEM, "no memory to check %llu tensor names",
                        (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) v[i] = (named){g->tensors[i].name, at[i]};
    int rc = check_unique(v, g->n_tensors, "tensor name");
    free(v);
    return rc;
}

static int rd_alignment(pkv_gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = find_key(g, "general.alignment", strlen("general.alignment"));
    if (i < 0) return 0;
    const kv_rec *r = &g->kv[i];
    if (r->type != PKV_GGUF_U32)
        return gerr(PKV_ECORRUPT, "general.alignment at offset %zu is a %s, not a u32",
                    r->val, vname(r->type));
    uint32_t a;
    memcpy(&a, g->base + r->val, 4);
    if (a == 0 || (a & (a - 1)) || a > (1u << 24))
        return gerr(PKV_ECORRUPT, "general.alignment %u at offset %zu is not a power of two "
                    "in [1, 2^24]", a, r->val);
    g->alignment = a;
    return 0;
}

/* Dims, element count, byte size of one tensor info. */
static int check_shape(pkv_gguf_tensor *t, size_t at) {
    const ttype *tt = ttype_of(t->type);
    if (!tt)
        return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): unknown type %u",
                    (int)t->name.len, t->name.ptr, at, t->type);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): dim %u is %llu",
                        (int)t->name.len, t->name.ptr, at, d, (unsigned long long)t->ne[d]);
        if (!mul_ok(nel, t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): element count "
                        "overflows", (int)t->name.len, t->name.ptr, at);
    }
    if (t->ne[0] % tt->blck)
        return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): row length %llu is not "
                    "a multiple of %s's block of %u", (int)t->name.len, t->name.ptr, at,
                    (unsigned long long)t->ne[0], tt->name, tt->blck);
    /* ne[0] * bytes / blck <= nel * bytes, so checking the total suffices. */
    if (!mul_ok(nel / tt->blck, tt->bytes, &t->nbytes))
        return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): byte size overflows",
                    (int)t->name.len, t->name.ptr, at);
    t->row_bytes = t->ne[0] / tt->blck * tt->bytes;
    t->n_rows = nel / t->ne[0];
    return 0;
}

static int rd_tensor_info(pkv_gguf *g, cursor *c, uint64_t i, size_t *info_at) {
    pkv_gguf_tensor *t = &g->tensors[i];
    size_t at = c->pos;
    *info_at = at;
    int rc = rd_str(c, "tensor name", 1, PKV_GGUF_MAX_NAME, &t->name);
    if (!rc) rc = rd_u32(c, "tensor n_dims", &t->n_dims);
    if (rc) return rc;
    if (memchr(t->name.ptr, 0, t->name.len))
        return gerr(PKV_ECORRUPT, "tensor %llu (info at offset %zu): name contains a NUL byte",
                    (unsigned long long)i, at);
    if (t->n_dims < 1 || t->n_dims > PKV_GGUF_MAX_DIMS)
        return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): n_dims %u outside "
                    "[1, %d]", (int)t->name.len, t->name.ptr, at, t->n_dims,
                    PKV_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < PKV_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((rc = rd_u64(c, "tensor dim", &t->ne[d]))) return rc;
    if ((rc = rd_u32(c, "tensor type", &t->type))) return rc;
    if ((rc = rd_u64(c, "tensor offset", &t->offset))) return rc;
    if ((rc = check_shape(t, at))) return rc;
    if (t->offset % g->alignment)
        return gerr(PKV_ECORRUPT, "tensor '%.*s' (info at offset %zu): data offset %llu is "
                    "not a multiple of the alignment %u", (int)t->name.len, t->name.ptr, at,
                    (unsigned long long)t->offset, g->alignment);
    return 0;
}

/* After the infos: the data section starts at the next aligned offset, and every
 * tensor's bytes lie inside the file. */
static int place_tensors(pkv_gguf *g, size_t infos_end) {
    uint64_t start;
    if (!add_ok(infos_end, g->alignment - 1u, &start))
        return gerr(PKV_ECORRUPT, "data section start overflows");
    start -= start % g->alignment;
    if (g->n_tensors && start > g->size)
        return gerr(PKV_ECORRUPT, "data section would start at offset %llu, past the end of "
                    "the %zu-byte file", (unsigned long long)start, g->size);
    g->data_start = (size_t)start;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        pkv_gguf_tensor *t = &g->tensors[i];
        uint64_t beg, end;
        if (!add_ok(start, t->offset, &beg) || !add_ok(beg, t->nbytes, &end) ||
            end > g->size)
            return gerr(PKV_ECORRUPT, "tensor '%.*s': data [%llu, +%llu) relative to the data "
                        "section at %llu runs past the end of the %zu-byte file",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                        (unsigned long long)t->nbytes, (unsigned long long)start, g->size);
        t->data = g->base + beg;
    }
    return 0;
}

static int parse(pkv_gguf *g) {
    cursor c = {g->base, g->size, 0};
    int rc = rd_header(g, &c);
    if (!rc) rc = rd_kvs(g, &c);
    if (!rc) rc = unique_keys(g);
    if (!rc) rc = rd_alignment(g);
    if (rc) return rc;
    size_t n = (size_t)(g->n_tensors ? g->n_tensors : 1);
    g->tensors = calloc(n, sizeof *g->tensors);
    size_t *at = malloc(n * sizeof *at);
    if (!g->tensors || !at) {
        free(at);
        return gerr(PKV_ENOMEM, "no memory for %llu tensor infos",
                    (unsigned long long)g->n_tensors);
    }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) rc = rd_tensor_info(g, &c, i, &at[i]);
    if (!rc) rc = unique_tensors(g, at);
    free(at);
    return rc ? rc : place_tensors(g, c.pos);
}

static int open_common(pkv_gguf *g, pkv_gguf **out) {
    int rc = parse(g);
    if (rc) {
        pkv_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int pkv_gguf_open_mem(const void *buf, size_t len, pkv_gguf **out) {
    if (!out || (!buf && len)) return gerr(PKV_EINVAL, "NULL argument");
    *out = NULL;
    pkv_gguf *g = calloc(1, sizeof *g);
    if (!g) return gerr(PKV_ENOMEM, "no memory for the handle");
    g->base = buf ? buf : (const unsigned char *)"";
    g->size = len;
    return open_common(g, out);
}

int pkv_gguf_open(const char *path, pkv_gguf **out) {
    if (!path || !out) return gerr(PKV_EINVAL, "NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gerr(PKV_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return gerr(PKV_EIO, "%s: not a regular file (%s)", path, strerror(e));
    }
    size_t size = (size_t)st.st_size;
    const void *map = "";
    if (size) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return gerr(PKV_EIO, "cannot map %s: %s", path, strerror(e));
        }
    }
    close(fd);
    pkv_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (size) munmap((void *)map, size);
        return gerr(PKV_ENOMEM, "no memory for the handle");
    }
    g->base = map;
    g->size = size;
    g->mapped = size != 0;
    int rc = open_common(g, out);
    if (rc) {
        /* Name the file: the message so far names only the offset. */
        char msg[sizeof gguf_err];
        snprintf(msg, sizeof msg, "%s", gguf_err + 6);
        gerr(rc, "%s: %s", path, msg);
    }
    return rc;
}

void pkv_gguf_close(pkv_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
    free(g->kv);
    free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g);
}

/* ---- Accessors --------------------------------------------------------------- */

uint32_t pkv_gguf_version(const pkv_gguf *g) { return g->version; }
uint64_t pkv_gguf_n_kv(const pkv_gguf *g) { return g->n_kv; }
uint64_t pkv_gguf_n_tensors(const pkv_gguf *g) { return g->n_tensors; }
uint32_t pkv_gguf_alignment(const pkv_gguf *g) { return g->alignment; }

const void *pkv_gguf_bytes(const pkv_gguf *g, size_t *len) {
    *len = g->size;
    return g->base;
}

int64_t pkv_gguf_find(const pkv_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return find_key(g, key, strlen(key));
}

pkv_gguf_str pkv_gguf_key(const pkv_gguf *g, uint64_t idx) {
    assert(idx < g->n_kv);
    return idx < g->n_kv ? g->kv[idx].key : (pkv_gguf_str){"", 0};
}

pkv_gguf_vtype pkv_gguf_type(const pkv_gguf *g, uint64_t idx) {
    assert(idx < g->n_kv);
    return idx < g->n_kv ? g->kv[idx].type : PKV_GGUF_ARRAY;
}

/* The record of `key`, or an error naming it. */
static int lookup(const pkv_gguf *g, const char *key, const kv_rec **r) {
    if (!g || !key) return gerr(PKV_EINVAL, "NULL argument");
    int64_t i = find_key(g, key, strlen(key));
    if (i < 0) return gerr(PKV_EINVAL, "key '%s' not found", key);
    *r = &g->kv[i];
    return 0;
}

static int wrong_type(const kv_rec *r, const char *want) {
    return gerr(PKV_EINVAL, "key '%.*s' is a %s, not a %s", (int)r->key.len, r->key.ptr,
                vname(r->type), want);
}

/* An integer value of any width as signed 64 (u64 above INT64_MAX saturates,
 * which no u32 accepts either). */
static int int_value(const pkv_gguf *g, const kv_rec *r, int64_t *v) {
    const unsigned char *p = g->base + r->val;
    switch (r->type) {
    case PKV_GGUF_U8: *v = p[0]; return 1;
    case PKV_GGUF_I8: *v = (int8_t)p[0]; return 1;
    case PKV_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case PKV_GGUF_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case PKV_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 1; }
    case PKV_GGUF_I32: { int32_t x; memcpy(&x, p, 4); *v = x; return 1; }
    case PKV_GGUF_U64: { uint64_t x; memcpy(&x, p, 8); *v = x > INT64_MAX ? INT64_MAX : (int64_t)x; return 1; }
    case PKV_GGUF_I64: { int64_t x; memcpy(&x, p, 8); *v = x; return 1; }
    default: return 0;
    }
}

int pkv_gguf_get_u32(const pkv_gguf *g, const char *key, uint32_t *out) {
    const kv_rec *r = NULL;
    int rc = lookup(g, key, &r);
    if (rc) return rc;
    int64_t v;
    if (!int_value(g, r, &v)) return wrong_type(r, "integer");
    if (v < 0 || v > (int64_t)UINT32_MAX)
        return gerr(PKV_EINVAL, "key '%s': value %lld does not fit in a u32", key, (long long)v);
    *out = (uint32_t)v;
    return 0;
}

int pkv_gguf_get_f32(const pkv_gguf *g, const char *key, float *out) {
    const kv_rec *r = NULL;
    int rc = lookup(g, key, &r);
    if (rc) return rc;
    if (r->type == PKV_GGUF_F32) {
        memcpy(out, g->base + r->val, 4);
    } else if (r->type == PKV_GGUF_F64) {
        double d;
        memcpy(&d, g->base + r->val, 8);
        *out = (float)d;
    } else {
        return wrong_type(r, "f32");
    }
    return 0;
}

int pkv_gguf_get_bool(const pkv_gguf *g, const char *key, int *out) {
    const kv_rec *r = NULL;
    int rc = lookup(g, key, &r);
    if (rc) return rc;
    if (r->type != PKV_GGUF_BOOL) return wrong_type(r, "bool");
    *out = g->base[r->val];
    return 0;
}

static pkv_gguf_str str_at(const pkv_gguf *g, size_t off) {
    uint64_t n;
    memcpy(&n, g->base + off, 8);
    return (pkv_gguf_str){(const char *)g->base + off + 8, (size_t)n};
}

int pkv_gguf_get_str(const pkv_gguf *g, const char *key, pkv_gguf_str *out) {
    const kv_rec *r = NULL;
    int rc = lookup(g, key, &r);
    if (rc) return rc;
    if (r->type != PKV_GGUF_STRING) return wrong_type(r, "string");
    *out = str_at(g, r->val);
    return 0;
}

int pkv_gguf_get_arr(const pkv_gguf *g, const char *key, pkv_gguf_vtype elem,
                     pkv_gguf_arr *out) {
    const kv_rec *r = NULL;
    int rc = lookup(g, key, &r);
    if (rc) return rc;
    if (r->type != PKV_GGUF_ARRAY) return wrong_type(r, "array");
    if (r->elem != elem)
        return gerr(PKV_EINVAL, "key '%s' is an array of %s, not of %s", key, vname(r->elem),
                    vname(elem));
    out->g = g;
    out->type = r->elem;
    out->n = r->n;
    out->data = g->base + r->val;
    out->idx = (uint32_t)(r - g->kv);
    return 0;
}

pkv_gguf_str pkv_gguf_arr_str(const pkv_gguf_arr *a, uint64_t i) {
    assert(a->type == PKV_GGUF_STRING && i < a->n);
    if (a->type != PKV_GGUF_STRING || i >= a->n) return (pkv_gguf_str){"", 0};
    return str_at(a->g, a->g->kv[a->idx].str_off[i]);
}

int32_t pkv_gguf_arr_i32(const pkv_gguf_arr *a, uint64_t i) {
    assert(a->type == PKV_GGUF_I32 && i < a->n);
    if (a->type != PKV_GGUF_I32 || i >= a->n) return 0;
    int32_t v;
    memcpy(&v, a->data + i * 4, 4);
    return v;
}

float pkv_gguf_arr_f32(const pkv_gguf_arr *a, uint64_t i) {
    assert(a->type == PKV_GGUF_F32 && i < a->n);
    if (a->type != PKV_GGUF_F32 || i >= a->n) return 0.0f;
    float v;
    memcpy(&v, a->data + i * 4, 4);
    return v;
}

const pkv_gguf_tensor *pkv_gguf_tensor_at(const pkv_gguf *g, uint64_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const pkv_gguf_tensor *pkv_gguf_tensor_find(const pkv_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    size_t nl = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (same(g->tensors[i].name, name, nl)) return &g->tensors[i];
    return NULL;
}

/* ---- Conversion to f32 -------------------------------------------------------- */

float pkv_gguf_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
    } else if (exp) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float pkv_gguf_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t u16_at(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Q8_0 block: f16 scale d, 32 int8 q; x = d * q. */
static void row_q8_0(const unsigned char *p, uint64_t nb, float *out) {
    for (uint64_t b = 0; b < nb; b++, p += 34, out += 32) {
        float d = pkv_gguf_f16(u16_at(p));
        for (int j = 0; j < 32; j++) out[j] = d * (float)(int8_t)p[2 + j];
    }
}

/* Q4_1 block: f16 d, f16 m, 16 bytes; element j (< 16) is the low nibble of byte j,
 * element j + 16 its high nibble; x = d * q + m. */
static void row_q4_1(const unsigned char *p, uint64_t nb, float *out) {
    for (uint64_t b = 0; b < nb; b++, p += 20, out += 32) {
        float d = pkv_gguf_f16(u16_at(p)), m = pkv_gguf_f16(u16_at(p + 2));
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(p[4 + j] & 0x0f) + m;
            out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
        }
    }
}

/* Q4_0 block: f16 d, 16 bytes, nibbles as in Q4_1; x = d * (q - 8). */
static void row_q4_0(const unsigned char *p, uint64_t nb, float *out) {
    for (uint64_t b = 0; b < nb; b++, p += 18, out += 32) {
        float d = pkv_gguf_f16(u16_at(p));
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((p[2 + j] & 0x0f) - 8);
            out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
        }
    }
}

int pkv_gguf_row_f32(const pkv_gguf_tensor *t, uint64_t row, float *out) {
    if (!t || !out) return gerr(PKV_EINVAL, "NULL argument");
    if (row >= t->n_rows)
        return gerr(PKV_ERANGE, "tensor '%.*s': row %llu of %llu", (int)t->name.len,
                    t->name.ptr, (unsigned long long)row, (unsigned long long)t->n_rows);
    const unsigned char *p = (const unsigned char *)t->data + row * t->row_bytes;
    uint64_t n = t->ne[0];
    switch (t->type) {
    case PKV_GGUF_T_F32: memcpy(out, p, n * 4); return 0;
    case PKV_GGUF_T_F16:
        for (uint64_t j = 0; j < n; j++) out[j] = pkv_gguf_f16(u16_at(p + 2 * j));
        return 0;
    case PKV_GGUF_T_BF16:
        for (uint64_t j = 0; j < n; j++) out[j] = pkv_gguf_bf16(u16_at(p + 2 * j));
        return 0;
    case PKV_GGUF_T_Q8_0: row_q8_0(p, n / 32, out); return 0;
    case PKV_GGUF_T_Q4_1: row_q4_1(p, n / 32, out); return 0;
    case PKV_GGUF_T_Q4_0: row_q4_0(p, n / 32, out); return 0;
    default:
        return gerr(PKV_ENOTSUP, "tensor '%.*s': unsupported tensor type %s (%u)",
                    (int)t->name.len, t->name.ptr, pkv_gguf_type_name(t->type), t->type);
    }
}

int pkv_gguf_tensor_f32(const pkv_gguf_tensor *t, float *out) {
    if (!t || !out) return gerr(PKV_EINVAL, "NULL argument");
    for (uint64_t r = 0; r < t->n_rows; r++) {
        int rc = pkv_gguf_row_f32(t, r, out + r * t->ne[0]);
        if (rc) return rc;
    }
    return 0;
}
