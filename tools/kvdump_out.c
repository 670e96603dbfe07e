/*
 * kvdump_out.c — what every kvdump command shares: the JSON writer, error
 * reporting, command-line parsing, reading the arena header, the read-only open
 * of a cache directory (with retries while a live writer renames files), and
 * what the commands read of the opened cache (kd_state: every block's metadata
 * and depth, every sequence's table) through pagedkv.h and pagedkv_inspect.h.
 */
#include "kvdump.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- JSON writer ----------------------------------------------------------- */

void kj_init(kj *j, FILE *f) {
    memset(j, 0, sizeof *j);
    j->f = f;
    j->first[0] = true;
}

static bool kj_inline(const kj *j) { return j->inline_from && j->depth >= j->inline_from; }

static void kj_indent(kj *j) {
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++) fputs("  ", j->f);
}

static void kj_strraw(kj *j, const char *s) {
    fputc('"', j->f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", j->f); break;
        case '\\': fputs("\\\\", j->f); break;
        case '\n': fputs("\\n", j->f); break;
        case '\r': fputs("\\r", j->f); break;
        case '\t': fputs("\\t", j->f); break;
        default:
            if (*p < 0x20 || *p == 0x7f) fprintf(j->f, "\\u%04x", *p);
            else if (*p < 0x80) fputc(*p, j->f);
            else {
                /* Pass valid UTF-8 through; escape anything else byte by byte. */
                int n = (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2 : (*p & 0xf8) == 0xf0 ? 3 : -1;
                bool ok = n > 0;
                for (int k = 1; ok && k <= n; k++) ok = (p[k] & 0xc0) == 0x80;
                if (ok) {
                    fwrite(p, 1, (size_t)n + 1, j->f);
                    p += n;
                } else {
                    fprintf(j->f, "\\u%04x", *p);
                }
            }
        }
    }
    fputc('"', j->f);
}

static void kj_key(kj *j, const char *key) {
    if (!j->first[j->depth]) fputc(',', j->f);
    if (kj_inline(j)) {
        if (!j->first[j->depth]) fputc(' ', j->f);
    } else {
        kj_indent(j);
    }
    j->first[j->depth] = false;
    if (key) {
        kj_strraw(j, key);
        fputs(": ", j->f);
    }
}

static void kj_open(kj *j, const char *key, bool inl, char c) {
    kj_key(j, key);
    fputc(c, j->f);
    if (j->depth < 63) j->depth++;
    j->first[j->depth] = true;
    if (inl && !j->inline_from) j->inline_from = j->depth;
}

static void kj_close(kj *j, char c) {
    bool empty = j->first[j->depth];
    bool inl = kj_inline(j);
    if (j->inline_from == j->depth) j->inline_from = 0;
    if (j->depth > 0) j->depth--;
    if (!empty && !inl) kj_indent(j);
    fputc(c, j->f);
}

void kj_obj(kj *j, const char *key, bool inl) { kj_open(j, key, inl, '{'); }
void kj_arr(kj *j, const char *key, bool inl) { kj_open(j, key, inl, '['); }
void kj_end_obj(kj *j) { kj_close(j, '}'); }
void kj_end_arr(kj *j) { kj_close(j, ']'); }

void kj_u64(kj *j, const char *key, uint64_t v) {
    kj_key(j, key);
    fprintf(j->f, "%llu", (unsigned long long)v);
}
void kj_i64(kj *j, const char *key, int64_t v) {
    kj_key(j, key);
    fprintf(j->f, "%lld", (long long)v);
}
void kj_dbl(kj *j, const char *key, double v) {
    kj_key(j, key);
    if (isfinite(v)) fprintf(j->f, "%.9g", v);
    else fputs("null", j->f);
}
void kj_bool(kj *j, const char *key, bool v) {
    kj_key(j, key);
    fputs(v ? "true" : "false", j->f);
}
void kj_null(kj *j, const char *key) {
    kj_key(j, key);
    fputs("null", j->f);
}
void kj_str(kj *j, const char *key, const char *s) {
    kj_key(j, key);
    if (s) kj_strraw(j, s);
    else fputs("null", j->f);
}
void kj_strf(kj *j, const char *key, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kj_str(j, key, buf);
}
void kj_hex64(kj *j, const char *key, uint64_t v) {
    kj_strf(j, key, "0x%016llx", (unsigned long long)v);
}
void kj_block(kj *j, const char *key, uint32_t b) {
    if (b == PKV_NO_BLOCK) kj_null(j, key);
    else kj_u64(j, key, b);
}

void kj_begin_doc(kj *j, const char *cmd) {
    j->depth = 0;
    j->first[0] = true;
    fputc('{', j->f);
    j->depth = 1;
    j->first[1] = true;
    kj_u64(j, "kvdump", KD_SCHEMA);
    kj_str(j, "command", cmd);
}

void kj_end_doc(kj *j) {
    j->inline_from = 0;
    while (j->depth > 1) kj_close(j, '}'); /* only after an error mid-document */
    kj_close(j, '}');
    fputc('\n', j->f);
    fflush(j->f);
}

/* ---- Errors --------------------------------------------------------------- */

int kd_fail(kd_ctx *x, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "kvdump%s%s: error: %s\n", x->cmd ? " " : "", x->cmd ? x->cmd : "", msg);
    if (x->json && !x->doc_open) {
        kj_init(&x->j, stdout);
        kj_begin_doc(&x->j, x->cmd ? x->cmd : "");
        kj_obj(&x->j, "error", false);
        kj_i64(&x->j, "exit", code);
        kj_str(&x->j, "message", msg);
        kj_end_obj(&x->j);
        kj_end_doc(&x->j);
        x->doc_open = true;
    }
    return code;
}

void kd_warn(kd_ctx *x, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "kvdump%s%s: warning: %s\n", x->cmd ? " " : "", x->cmd ? x->cmd : "", msg);
}

static void on_sigbus(int sig) {
    (void)sig;
    static const char m[] = "kvdump: error: a mapped file shrank while it was being read "
                            "(truncated by another process?)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(KD_USAGE);
}

void kd_install_sigbus(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* ---- Small helpers ------------------------------------------------------------ */

const char *kd_dtype_name(uint32_t d) {
    switch (d) {
    case PKV_F32:  return "f32";
    case PKV_F16:  return "f16";
    case PKV_BF16: return "bf16";
    default:       return "unknown";
    }
}

const char *kd_bytes(char *buf, size_t n, uint64_t v) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (v < 1024) {
        snprintf(buf, n, "%llu B", (unsigned long long)v);
        return buf;
    }
    double d = (double)v;
    int i = 0;
    while (d >= 1024 && i < 5) {
        d /= 1024;
        i++;
    }
    snprintf(buf, n, "%.1f %s", d, u[i]);
    return buf;
}

const char *kd_time(char *buf, size_t n, uint64_t ns) {
    time_t t = (time_t)(ns / 1000000000ull);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(buf, n, "?");
    return buf;
}

const char *kd_printable(const char *s, char *buf, size_t n) {
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++) buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    buf[i] = '\0';
    return buf;
}

bool kd_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10);
    if (errno || !end || *end || end == s) return false;
    *out = v;
    return true;
}

const char *kd_block_state(const pkv_block_info *x) {
    if (x->ref > 0) return "used";
    if (x->state == PKV_BLOCK_SEALED) return "cached";
    return "free";
}

const char *kd_block_kind(const pkv_block_info *x) {
    return x->state == PKV_BLOCK_SEALED ? "sealed" : x->state == PKV_BLOCK_OPEN ? "open" : "free";
}

/* ---- What the commands read of an opened cache ------------------------------- */

static int cmp_seqv(const void *a, const void *b) {
    uint64_t x = ((const kd_seqv *)a)->id, y = ((const kd_seqv *)b)->id;
    return x < y ? -1 : x > y;
}

/* Every sequence of c with its block table, sorted by id. */
static int load_seqs(pkv_cache *c, kd_state *s) {
    size_t n = 0;
    int rc = pkv_seq_list(c, NULL, 0, &n);
    if (rc && rc != PKV_ERANGE) return rc;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    s->seq = calloc(n ? n : 1, sizeof *s->seq);
    if (!ids || !s->seq) {
        free(ids);
        return PKV_ENOMEM;
    }
    rc = pkv_seq_list(c, ids, n, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        kd_seqv *q = &s->seq[s->nseq];
        q->id = ids[i];
        if ((rc = pkv_seq_get_info(c, q->id, &q->inf))) break;
        q->blocks = malloc((q->inf.n_blocks ? q->inf.n_blocks : 1) * sizeof *q->blocks);
        if (!q->blocks) rc = PKV_ENOMEM;
        else rc = pkv_seq_blocks(c, q->id, q->blocks, q->inf.n_blocks, NULL);
        s->nseq++; /* its table is freed with the others */
    }
    free(ids);
    if (!rc) qsort(s->seq, s->nseq, sizeof *s->seq, cmp_seqv);
    return rc;
}

/* The tokens each block holds as far as the tables say (kd_state.ntok). */
static void count_tokens(kd_state *s) {
    const uint32_t bs = s->inf.block_size;
    for (uint32_t b = 0; b < s->cap; b++)
        s->ntok[b] = s->blk[b].state == PKV_BLOCK_SEALED ? bs : 0;
    for (size_t i = 0; i < s->nseq; i++) {
        const kd_seqv *q = &s->seq[i];
        for (uint64_t k = 0; k < q->inf.n_blocks; k++) {
            uint32_t b = q->blocks[k];
            if (b >= s->cap || s->blk[b].state == PKV_BLOCK_SEALED) continue;
            uint64_t start = k * bs;
            uint64_t t = q->inf.committed > start ? q->inf.committed - start : 0;
            if (t > bs) t = bs;
            if (t > s->ntok[b]) s->ntok[b] = (uint32_t)t;
        }
    }
}

int kd_state_load(pkv_cache *c, kd_state *s) {
    memset(s, 0, sizeof *s);
    int rc = pkv_info(c, &s->inf);
    if (!rc) rc = pkv_inspect_arena(c, &s->arena);
    if (rc) return rc;
    s->cap = (uint32_t)s->inf.capacity;
    size_t n = s->cap ? s->cap : 1;
    s->blk = malloc(n * sizeof *s->blk);
    s->depth = malloc(n * sizeof *s->depth);
    s->ntok = malloc(n * sizeof *s->ntok);
    if (!s->blk || !s->depth || !s->ntok) rc = PKV_ENOMEM;
    for (uint32_t b = 0; !rc && b < s->cap; b++) {
        rc = pkv_inspect_block(c, b, &s->blk[b]);
        s->sealed += s->blk[b].state == PKV_BLOCK_SEALED;
    }
    if (!rc) rc = pkv_inspect_depths(c, s->depth, s->cap);
    if (!rc) rc = load_seqs(c, s);
    if (rc) {
        kd_state_free(s);
        return rc;
    }
    count_tokens(s);
    return 0;
}

void kd_state_free(kd_state *s) {
    for (size_t i = 0; i < s->nseq; i++) free(s->seq[i].blocks);
    free(s->seq);
    free(s->blk);
    free(s->depth);
    free(s->ntok);
    memset(s, 0, sizeof *s);
}

const kd_seqv *kd_state_seq(const kd_state *s, uint64_t id) {
    kd_seqv key = {.id = id};
    return bsearch(&key, s->seq, s->nseq, sizeof *s->seq, cmp_seqv);
}

float kd_elem(const uint8_t *p, uint32_t dtype) {
    if (dtype == PKV_F32) {
        uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    if (dtype == PKV_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /* IEEE half. */
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- Command line ------------------------------------------------------------ */

const char *kd_optval(const kd_opt *opts, const char *name) {
    for (const kd_opt *o = opts; o && o->name; o++)
        if (!strcmp(o->name, name)) return o->val;
    return NULL;
}

int kd_parse(kd_ctx *x, int argc, char **argv, int first, kd_opt *opts, const char **pos,
             int maxpos, const char *usage) {
    int npos = 0;
    bool dashdash = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash || a[0] != '-' || a[1] == '\0') {
            if (npos >= maxpos) {
                kd_fail(x, KD_USAGE, "unexpected argument '%s' (see kvdump %s --help)", a, x->cmd);
                return -2;
            }
            pos[npos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            dashdash = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (!strcmp(a, "--json")) {
            x->json = true;
            continue;
        }
        if (!strcmp(a, "--point-in-time")) {
            x->pit = true;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        kd_opt *o = NULL;
        for (kd_opt *p = opts; p && p->name; p++)
            if (strlen(p->name) == nl && !strncmp(p->name, a, nl)) o = p;
        if (!o) {
            kd_fail(x, KD_USAGE, "unknown option '%.*s' (see kvdump %s --help)", (int)nl, a, x->cmd);
            return -2;
        }
        if (!o->has_arg) {
            if (eq) {
                kd_fail(x, KD_USAGE, "option %s takes no value", o->name);
                return -2;
            }
            o->val = "";
            continue;
        }
        if (eq) {
            o->val = eq + 1;
        } else if (i + 1 < argc) {
            o->val = argv[++i];
        } else {
            kd_fail(x, KD_USAGE, "option %s needs a value", o->name);
            return -2;
        }
    }
    return npos;
}

/* ---- The arena header ---------------------------------------------------------- */

int kd_read_header(const char *dir, kd_hdr *h, char *why, size_t wl) {
    memset(h, 0, sizeof *h);
    struct stat st;
    if (stat(dir, &st)) {
        snprintf(why, wl, "%s: %s", dir, strerror(errno));
        return KD_USAGE;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, wl, "%s is not a directory", dir);
        return KD_USAGE;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/arena", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            snprintf(why, wl, "%s: no arena file: not a pagedkv cache directory", dir);
        else
            snprintf(why, wl, "%s: %s", path, strerror(errno));
        return KD_USAGE;
    }
    uint8_t b[KD_PAGE];
    int rc = 0;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(why, wl, "%s is not a regular file", path);
        rc = KD_USAGE;
        goto out;
    }
    h->file_size = (uint64_t)st.st_size;
    if (st.st_size < (off_t)KD_PAGE) {
        snprintf(why, wl, "%s: %lld bytes, shorter than its %u-byte header (truncated)", path,
                 (long long)st.st_size, KD_PAGE);
        rc = st.st_size >= 8 ? KD_PROBLEMS : KD_USAGE;
        if (st.st_size >= 8 && (pread(fd, b, 8, 0) != 8 || memcmp(b, "PAGEDKV\0", 8)))
            rc = KD_USAGE;
        goto out;
    }
    ssize_t r = pread(fd, b, KD_PAGE, 0);
    if (r != (ssize_t)KD_PAGE) {
        snprintf(why, wl, "%s: cannot read the header: %s", path, r < 0 ? strerror(errno) : "short read");
        rc = KD_USAGE;
        goto out;
    }
    if (memcmp(b, "PAGEDKV\0", 8)) {
        snprintf(why, wl, "%s: not a pagedkv arena (bad magic)", path);
        rc = KD_USAGE;
        goto out;
    }
    h->version = kd_get_u32(b + 8);
    if (h->version != 1 && h->version != 2) {
        snprintf(why, wl, "%s: format version %u is not supported (kvdump reads versions 1 and 2)",
                 path, h->version);
        rc = KD_USAGE;
        goto out;
    }
    if (!kd_sum_ok(kd_get_u64(b + 4088), XXH3_64bits(b, 4088))) {
        snprintf(why, wl, "%s: header checksum mismatch (the header is damaged)", path);
        rc = KD_PROBLEMS;
        goto out;
    }
    h->header_bytes = kd_get_u32(b + 12);
    h->num_layers = kd_get_u32(b + 16);
    h->num_kv_heads = kd_get_u32(b + 20);
    h->head_dim = kd_get_u32(b + 24);
    h->block_size = kd_get_u32(b + 28);
    h->dtype = kd_get_u32(b + 32);
    h->elem_size = kd_get_u32(b + 36);
    h->capacity = kd_get_u64(b + 40);
    h->block_bytes = kd_get_u64(b + 48);
    h->slot_bytes = kd_get_u64(b + 56);
    h->data_offset = kd_get_u64(b + 64);
    h->secret = kd_get_u64(b + 72);
    h->created_ns = kd_get_u64(b + 80);
    h->model_len = kd_get_u32(b + 88);
    pkv_options o;
    memset(&o, 0, sizeof o);
    o.num_layers = h->num_layers;
    o.num_kv_heads = h->num_kv_heads;
    o.head_dim = h->head_dim;
    o.block_size = h->block_size;
    o.dtype = (pkv_dtype)h->dtype;
    o.capacity = h->capacity;
    pkv_cache_info g;
    memset(&g, 0, sizeof g); /* read below even when the geometry is invalid */
    /* The stride: whole pages in version 1; in version 2 the dense stride a new
     * arena gets (pkv_inspect_geometry's), which differs from the page one. */
    int geo_rc = pkv_inspect_geometry(&o, &g);
    uint64_t page_stride = (g.block_bytes + KD_PAGE - 1) / KD_PAGE * KD_PAGE;
    bool stride_ok = h->version == 1 ? h->slot_bytes == page_stride
                                     : h->slot_bytes == g.slot_bytes && g.slot_bytes != page_stride;
    if (geo_rc || h->capacity == 0 || h->header_bytes != KD_PAGE ||
        h->data_offset != KD_PAGE || h->elem_size != g.elem_size ||
        h->block_bytes != g.block_bytes || !stride_ok ||
        h->model_len == 0 || h->model_len > PKV_MODEL_ID_MAX ||
        memchr(b + 92, 0, h->model_len)) {
        snprintf(why, wl, "%s: inconsistent header fields (geometry %u x %u x %u, block %u, "
                 "dtype %u, capacity %llu, model id length %u)", path, h->num_layers,
                 h->num_kv_heads, h->head_dim, h->block_size, h->dtype,
                 (unsigned long long)h->capacity, h->model_len);
        rc = KD_PROBLEMS;
        goto out;
    }
    memcpy(h->model_id, b + 92, h->model_len);
    h->model_id[h->model_len] = '\0';
out:
    close(fd);
    return rc;
}

/* A fingerprint of the directory's checkpoint (ckpt-*, delta-*) and log files
 * (names, sizes, modification times), to notice a live writer renaming, removing
 * or writing files while recovery read them. */
static uint64_t dir_sig(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sig = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "wal-", 4) && strncmp(e->d_name, "ckpt-", 5) &&
            strncmp(e->d_name, "delta-", 6))
            continue;
        uint64_t v[3] = {XXH3_64bits(e->d_name, strlen(e->d_name)), 0, 0};
        struct stat st;
        if (!fstatat(dirfd(d), e->d_name, &st, 0)) {
            v[1] = (uint64_t)st.st_size;
            v[2] = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
        }
        sig += XXH3_64bits(v, sizeof v); /* order-independent */
    }
    closedir(d);
    return sig;
}

/* The library keeps per-block metadata for the whole capacity in memory: 64
 * bytes, 4 * B bytes of token ids and 16 bytes or more of prefix index per block.
 * A forged header could ask for more than the machine has (the file itself may
 * be short); refuse that instead of letting the allocation fail halfway or the
 * kernel kill the process. */
int kd_check_memory(uint64_t capacity, uint32_t block_size, char *why, size_t wl) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return 0;
    double need = (double)capacity * (64.0 + 4.0 * block_size + 32.0);
    double have = (double)pages * (double)psz;
    if (need <= have / 2) return 0;
    snprintf(why, wl, "%llu blocks of %u tokens need %.1f GiB of metadata in memory, more than "
             "half of this machine's (%.1f GiB)", (unsigned long long)capacity, block_size,
             need / (1 << 30), have / (1 << 30));
    return PKV_ENOMEM;
}

int kd_open_quiet(kd_ctx *x, uint32_t extra, char *why, size_t wl) {
    int mrc = kd_check_memory(x->hdr.capacity, x->hdr.block_size, why, wl);
    if (mrc) return mrc;
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = x->hdr.num_layers;
    o.num_kv_heads = x->hdr.num_kv_heads;
    o.head_dim = x->hdr.head_dim;
    o.block_size = x->hdr.block_size;
    o.dtype = (pkv_dtype)x->hdr.dtype;
    o.capacity = 0; /* as stored */
    o.model_id = x->hdr.model_id;
    o.flags = PKV_OPEN_RDONLY | extra | (x->pit ? PKV_OPEN_POINT_IN_TIME : 0);
    int rc = 0;
    for (int attempt = 0; attempt < 50; attempt++) {
        uint64_t before = dir_sig(x->dir);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = pkv_open(x->dir, &o, &x->c);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        x->open_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (!rc) return 0;
        snprintf(why, wl, "%s", pkv_last_error());
        if (dir_sig(x->dir) == before) break;
        x->retries++; /* a writer changed the directory under us: read it again */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    x->c = NULL;
    return rc;
}

int kd_open(kd_ctx *x) {
    char why[1024];
    int rc = kd_read_header(x->dir, &x->hdr, why, sizeof why);
    if (rc) return kd_fail(x, KD_USAGE, "%s", why);
    rc = kd_open_quiet(x, 0, why, sizeof why);
    if (rc) {
        const char *hint = strstr(why, "POINT_IN_TIME") ? " (kvdump: add --point-in-time to "
                                                          "inspect the state up to it)" : "";
        return kd_fail(x, KD_USAGE, "cannot read %s: %s: %s%s", x->dir, pkv_strerror(rc), why, hint);
    }
    return 0;
}

void kd_close(kd_ctx *x) {
    if (x->c) pkv_close(x->c);
    x->c = NULL;
}
