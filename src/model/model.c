/*
 * model.c — the reference Llama-style model (see model.h).
 *
 * Determinism is the design constraint: the paged and the from-scratch paths must
 * produce the same bits. Every value a row (token) computes is a function of that
 * row and of the K/V of earlier positions only:
 *  - matrix products (src/model/matmul.c, either kernel) compute each output
 *    element with one fixed sequence of operations, whatever tile of the batch it
 *    falls in and whichever thread computes it; the q8 kernel quantizes each
 *    activation row on its own;
 *  - norms, RoPE and SwiGLU are per row;
 *  - attention (pkv_attn_decode) is independent of block layout, batch and threads.
 * The CPU feature dispatch (AVX2+FMA or portable) is decided once per process.
 * The kernel (pkvm_set_kernel) changes the bits, so it is part of the identity a
 * cache is built under (the callers append it to the model id).
 */
#include "model.h"

#include "gguf.h"
#include "matmul.h"

#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- Errors ------------------------------------------------------------------ */

static _Thread_local char model_err[512];

const char *pkvm_last_error(void) { return model_err; }

__attribute__((format(printf, 2, 3))) static int merr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(model_err, sizeof model_err, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- Presets ----------------------------------------------------------------- */

int pkvm_preset(const char *name, pkvm_config *out) {
    if (!name || !out) return merr(PKV_EINVAL, "name or out is NULL");
    pkvm_config c;
    memset(&c, 0, sizeof c);
    c.vocab = PKVM_VOCAB;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    c.seed = 1;
    if (!strcmp(name, "tiny")) {
        c.n_layers = 2, c.dim = 64, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
        c.ffn_dim = 176;
    } else if (!strcmp(name, "small")) {
        c.n_layers = 4, c.dim = 256, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64;
        c.ffn_dim = 704;
    } else if (!strcmp(name, "default")) {
        c.n_layers = 8, c.dim = 512, c.n_heads = 8, c.n_kv_heads = 2, c.head_dim = 64;
        c.ffn_dim = 1408;
    } else {
        return merr(PKV_EINVAL, "unknown preset '%s' (%s)", name, pkvm_preset_names());
    }
    snprintf(c.name, sizeof c.name, "%s", name);
    *out = c;
    return 0;
}

const char *pkvm_preset_names(void) { return "tiny, small, default"; }

/* ---- Thread pool (for matrix products) --------------------------------------- */

typedef void (*pool_fn)(void *arg, unsigned idx, unsigned n);

typedef struct pool {
    unsigned n; /* workers, besides the caller */
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    unsigned pending;
    int stop;
    pool_fn fn;
    void *arg;
} pool;

typedef struct pool_worker {
    pool *p;
    unsigned idx;
} pool_worker;

static void *pool_main(void *a) {
    pool_worker *w = a;
    pool *p = w->p;
    const unsigned idx = w->idx;
    free(w);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, idx, p->n + 1);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_stop(pool *p) {
    if (!p->tid) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++) pthread_join(p->tid[i], NULL);
    free(p->tid);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    memset(p, 0, sizeof *p);
}

/* Start n workers; on failure the pool keeps the ones that started. */
static void pool_start(pool *p, unsigned n) {
    memset(p, 0, sizeof *p);
    if (!n) return;
    p->tid = calloc(n, sizeof *p->tid);
    if (!p->tid) return;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (unsigned i = 0; i < n; i++) {
        pool_worker *w = malloc(sizeof *w);
        if (!w) break;
        *w = (pool_worker){p, i + 1};
        if (pthread_create(&p->tid[i], NULL, pool_main, w)) {
            free(w);
            break;
        }
        p->n++;
    }
}

static void pool_run(pool *p, pool_fn fn, void *arg) {
    if (!p->n) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n + 1);
    pthread_mutex_lock(&p->mu);
    while (p->pending) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* ---- The model ----------------------------------------------------------------- */

typedef struct layer_w {
    float *attn_norm; /* [dim] */
    pkvm_wmat wqkv;   /* [(nh + 2 nkv) hd][dim] */
    pkvm_wmat wo;     /* [dim][nh hd] */
    float *ffn_norm;  /* [dim] */
    pkvm_wmat w13;    /* [2 ffn][dim]: gate rows, then up rows */
    pkvm_wmat w2;     /* [dim][ffn] */
} layer_w;

/* The storage type of every matrix, decided before the one allocation. */
typedef struct wplan {
    pkvm_wtype emb, wout;
    bool tied; /* wout is emb (same storage) */
    pkvm_wtype *qkv, *wo, *w13, *w2; /* [n_layers] each, or NULL: all f32 */
} wplan;

struct pkvm_model {
    pkvm_config cfg;
    unsigned char *mem; /* every weight, one allocation */
    uint64_t n_params;
    pkvm_wmat emb;     /* [vocab][dim] */
    float *final_norm; /* [dim] */
    pkvm_wmat wout;    /* [vocab][dim] */
    layer_w *layers;
    double *inv_freq; /* [hd / 2] */
    unsigned threads;
    uint32_t attn_flags;
    pkvm_kernel kernel;
    int avx;
    float *scratch;          /* per pool thread: scratch_floats (exact kernel's panel) */
    size_t scratch_floats;
    size_t max_cols;         /* widest matrix input */
    pool pool;
};

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a). */
static void fill_uniform(float *w, size_t n, float a, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        const double u = (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
        w[i] = (float)((2.0 * u - 1.0) * a);
    }
}

static void fill_norm(float *w, size_t n, uint64_t *s) {
    fill_uniform(w, n, 0.1f, s);
    for (size_t i = 0; i < n; i++) w[i] += 1.0f;
}

static int config_check(const pkvm_config *c) {
    if (!c->n_layers || c->n_layers > 4096) return merr(PKV_EINVAL, "n_layers %u", c->n_layers);
    if (!c->dim || c->dim > 65536) return merr(PKV_EINVAL, "dim %u", c->dim);
    if (!c->n_kv_heads || !c->n_heads || c->n_heads % c->n_kv_heads || c->n_heads > 4096)
        return merr(PKV_EINVAL, "n_heads %u is not a multiple of n_kv_heads %u", c->n_heads,
                    c->n_kv_heads);
    if (!c->head_dim || c->head_dim % 2 || c->head_dim > 65536)
        return merr(PKV_EINVAL, "head_dim %u must be even", c->head_dim);
    if (!c->ffn_dim || c->ffn_dim > 1u << 20) return merr(PKV_EINVAL, "ffn_dim %u", c->ffn_dim);
    if (c->vocab < PKVM_VOCAB || c->vocab > 1u << 20)
        return merr(PKV_EINVAL, "vocab %u < %u", c->vocab, PKVM_VOCAB);
    if (!(c->rope_theta > 1.0f) || !(c->norm_eps > 0.0f))
        return merr(PKV_EINVAL, "rope_theta or norm_eps out of range");
    return 0;
}

/* Per-thread scratch for m->threads threads. */
static int scratch_alloc(pkvm_model *m) {
    free(m->scratch);
    m->scratch = NULL;
    if (!m->scratch_floats) return 0;
    m->scratch = aligned_alloc(64, m->threads * m->scratch_floats * sizeof(float));
    return m->scratch ? 0 : merr(PKV_ENOMEM, "matmul scratch");
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* Lay out matrix w (rows x cols of type t) at *off of the allocation. */
static void plan_mat(pkvm_wmat *w, pkvm_wtype t, size_t rows, size_t cols, size_t *off) {
    w->type = t;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = pkvm_wmat_row_bytes(t, cols);
    w->data = (unsigned char *)(uintptr_t)*off; /* made a pointer once allocated */
    *off += align64(rows * w->row_bytes);
}

static void place_mat(pkvm_wmat *w, unsigned char *base) { w->data = base + (uintptr_t)w->data; }

static float *place_floats(unsigned char *base, size_t *off, size_t n) {
    float *p = (float *)(void *)(base + *off);
    *off += align64(n * sizeof(float));
    return p;
}

/* The model with its weight memory allocated and laid out (matrix storage types
 * from `plan`, NULL: all f32), values unset. */
static int model_alloc(const pkvm_config *cfg, const wplan *plan, pkvm_model **out) {
    int rc = config_check(cfg);
    if (rc) return rc;
    pkvm_model *m = calloc(1, sizeof *m);
    if (!m) return merr(PKV_ENOMEM, "model");
    m->cfg = *cfg;
    m->cfg.name[sizeof m->cfg.name - 1] = '\0';
    m->threads = 1;
    const pkvm_config *c = &m->cfg;
    const size_t D = c->dim, L = c->n_layers, hd = c->head_dim, nh = c->n_heads,
                 nkv = c->n_kv_heads, F = c->ffn_dim, V = c->vocab;
    const size_t per_layer = D + (nh + 2 * nkv) * hd * D + D * nh * hd + D + 2 * F * D + D * F;
    m->n_params = V * D + D + V * D + L * per_layer;
    m->layers = calloc(L, sizeof *m->layers);
    m->inv_freq = malloc(hd / 2 * sizeof(double));
    if (!m->layers || !m->inv_freq) {
        pkvm_free(m);
        return merr(PKV_ENOMEM, "model");
    }
    /* Offsets first (embedding, output norm, output, then per layer: attention
     * norm, QKV, output projection, FFN norm, gate+up, down), then one allocation. */
    size_t off = 0, fn_off, an_off = 0, fnn_off = 0;
    plan_mat(&m->emb, plan ? plan->emb : PKVM_W_F32, V, D, &off);
    fn_off = off;
    off += align64(D * sizeof(float));
    if (plan && plan->tied) m->wout = m->emb;
    else plan_mat(&m->wout, plan ? plan->wout : PKVM_W_F32, V, D, &off);
    size_t *norm_off = malloc(2 * L * sizeof *norm_off);
    if (!norm_off) {
        pkvm_free(m);
        return merr(PKV_ENOMEM, "model");
    }
    for (size_t l = 0; l < L; l++) {
        layer_w *w = &m->layers[l];
        norm_off[2 * l] = off;
        off += align64(D * sizeof(float));
        plan_mat(&w->wqkv, plan ? plan->qkv[l] : PKVM_W_F32, (nh + 2 * nkv) * hd, D, &off);
        plan_mat(&w->wo, plan ? plan->wo[l] : PKVM_W_F32, D, nh * hd, &off);
        norm_off[2 * l + 1] = off;
        off += align64(D * sizeof(float));
        plan_mat(&w->w13, plan ? plan->w13[l] : PKVM_W_F32, 2 * F, D, &off);
        plan_mat(&w->w2, plan ? plan->w2[l] : PKVM_W_F32, D, F, &off);
    }
    m->mem = aligned_alloc(64, off);
    if (!m->mem) {
        free(norm_off);
        pkvm_free(m);
        return merr(PKV_ENOMEM, "model weights (%zu bytes)", off);
    }
    place_mat(&m->emb, m->mem);
    if (plan && plan->tied) m->wout = m->emb;
    else place_mat(&m->wout, m->mem);
    m->final_norm = place_floats(m->mem, &fn_off, D);
    for (size_t l = 0; l < L; l++) {
        layer_w *w = &m->layers[l];
        an_off = norm_off[2 * l];
        fnn_off = norm_off[2 * l + 1];
        w->attn_norm = place_floats(m->mem, &an_off, D);
        w->ffn_norm = place_floats(m->mem, &fnn_off, D);
        place_mat(&w->wqkv, m->mem);
        place_mat(&w->wo, m->mem);
        place_mat(&w->w13, m->mem);
        place_mat(&w->w2, m->mem);
        const pkvm_wmat *mats[4] = {&w->wqkv, &w->wo, &w->w13, &w->w2};
        for (int k = 0; k < 4; k++) {
            const size_t sf = pkvm_mm_scratch_floats(mats[k]);
            if (sf > m->scratch_floats) m->scratch_floats = sf;
        }
    }
    free(norm_off);
    {
        const size_t sf = pkvm_mm_scratch_floats(&m->wout);
        if (sf > m->scratch_floats) m->scratch_floats = sf;
    }
    m->max_cols = D > nh * hd ? D : nh * hd;
    if (F > m->max_cols) m->max_cols = F;
    for (size_t i = 0; i < hd / 2; i++)
        m->inv_freq[i] = pow((double)c->rope_theta, -2.0 * (double)i / (double)hd);
    m->avx = pkvm_mm_cpu_avx();
    if ((rc = scratch_alloc(m))) {
        pkvm_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The floats of an f32 matrix. */
#define F32(w) ((float *)(void *)(w).data)

int pkvm_create(const pkvm_config *cfg, pkvm_model **out) {
    if (!cfg || !out) return merr(PKV_EINVAL, "cfg or out is NULL");
    *out = NULL;
    pkvm_model *m;
    int rc = model_alloc(cfg, NULL, &m);
    if (rc) return rc;
    const pkvm_config *c = &m->cfg;
    const size_t D = c->dim, L = c->n_layers, hd = c->head_dim, nh = c->n_heads,
                 nkv = c->n_kv_heads, F = c->ffn_dim, V = c->vocab;
    uint64_t s = c->seed ^ 0x706b762d6d6f64ull; /* "pkv-mod" */
    fill_uniform(F32(m->emb), V * D, 1.0f, &s);
    fill_norm(m->final_norm, D, &s);
    /* Logits with a standard deviation of about 3: decisive greedy choices. */
    fill_uniform(F32(m->wout), V * D, 3.0f * sqrtf(3.0f / (float)D), &s);
    for (size_t l = 0; l < L; l++) {
        layer_w *w = &m->layers[l];
        fill_norm(w->attn_norm, D, &s);
        fill_uniform(F32(w->wqkv), (nh + 2 * nkv) * hd * D, sqrtf(3.0f / (float)D), &s);
        fill_uniform(F32(w->wo), D * nh * hd, sqrtf(3.0f / (float)(nh * hd)), &s);
        fill_norm(w->ffn_norm, D, &s);
        fill_uniform(F32(w->w13), 2 * F * D, sqrtf(3.0f / (float)D), &s);
        fill_uniform(F32(w->w2), D * F, sqrtf(3.0f / (float)F), &s);
    }
    *out = m;
    return 0;
}

/* ---- Weights from a GGUF (architecture "llama") ------------------------------ */

static int gguf_req_u32(const pkv_gguf *g, const char *key, uint32_t *v) {
    if (pkv_gguf_get_u32(g, key, v)) return merr(PKV_EINVAL, "%s", pkv_gguf_last_error());
    return 0;
}

int pkvm_config_from_gguf(const pkv_gguf *g, pkvm_config *out) {
    if (!g || !out) return merr(PKV_EINVAL, "gguf or out is NULL");
    pkv_gguf_str arch;
    if (pkv_gguf_get_str(g, "general.architecture", &arch))
        return merr(PKV_EINVAL, "%s", pkv_gguf_last_error());
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5))
        return merr(PKV_ENOTSUP, "architecture '%.*s': only llama is supported", (int)arch.len,
                    arch.ptr);
    pkvm_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "gguf");
    int rc = gguf_req_u32(g, "llama.block_count", &c.n_layers);
    if (!rc) rc = gguf_req_u32(g, "llama.embedding_length", &c.dim);
    if (!rc) rc = gguf_req_u32(g, "llama.attention.head_count", &c.n_heads);
    if (!rc) rc = gguf_req_u32(g, "llama.attention.head_count_kv", &c.n_kv_heads);
    if (!rc) rc = gguf_req_u32(g, "llama.feed_forward_length", &c.ffn_dim);
    if (rc) return rc;
    pkv_gguf_arr toks;
    if (pkv_gguf_get_arr(g, "tokenizer.ggml.tokens", PKV_GGUF_STRING, &toks))
        return merr(PKV_EINVAL, "%s", pkv_gguf_last_error());
    c.vocab = toks.n <= UINT32_MAX ? (uint32_t)toks.n : 0;
    if (!c.n_heads || c.dim % c.n_heads) return merr(PKV_EINVAL, "width %u, %u heads", c.dim, c.n_heads);
    c.head_dim = c.dim / c.n_heads;
    uint32_t rot;
    if (pkv_gguf_find(g, "llama.rope.dimension_count") >= 0 &&
        (rc = gguf_req_u32(g, "llama.rope.dimension_count", &rot)) == 0 && rot != c.head_dim)
        return merr(PKV_ENOTSUP, "partial rotary embedding (%u of %u)", rot, c.head_dim);
    if (rc) return rc;
    c.rope_theta = 10000.0f;
    if (pkv_gguf_find(g, "llama.rope.freq_base") >= 0 &&
        pkv_gguf_get_f32(g, "llama.rope.freq_base", &c.rope_theta))
        return merr(PKV_EINVAL, "%s", pkv_gguf_last_error());
    if (pkv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c.norm_eps))
        return merr(PKV_EINVAL, "%s", pkv_gguf_last_error());
    *out = c;
    return config_check(&c);
}

/* Tensor `name`, checked to be rows x cols (GGUF: ne[0] = cols, the input width). */
static int find_tensor(const pkv_gguf *g, const char *name, size_t rows, size_t cols,
                       const pkv_gguf_tensor **out) {
    const pkv_gguf_tensor *t = pkv_gguf_tensor_find(g, name);
    if (!t) return merr(PKV_EINVAL, "tensor %s is missing", name);
    if (t->ne[0] != cols || t->n_rows != rows)
        return merr(PKV_EINVAL, "tensor %s is [%llu x %llu], expected [%zu x %zu]", name,
                    (unsigned long long)t->n_rows, (unsigned long long)t->ne[0], rows, cols);
    if (!pkv_gguf_type_supported(t->type))
        return merr(PKV_ENOTSUP, "tensor %s: unsupported tensor type %s", name,
                    pkv_gguf_type_name(t->type));
    *out = t;
    return 0;
}

/* The storage a tensor keeps: its own blocks for Q8_0 and Q4_1 (with a width of
 * whole blocks), f32 for anything else. */
static pkvm_wtype tensor_wtype(const pkv_gguf_tensor *t) {
    if (t->ne[0] % 32 == 0 && t->type == PKV_GGUF_T_Q8_0) return PKVM_W_Q8_0;
    if (t->ne[0] % 32 == 0 && t->type == PKV_GGUF_T_Q4_1) return PKVM_W_Q4_1;
    return PKVM_W_F32;
}

/* Tensor `name` into rows [row0, row0 + rows) of w (whose type was planned from
 * the tensor's: the blocks repacked, or rows converted to f32). */
static int load_mat(const pkv_gguf *g, const char *name, size_t rows, size_t row0,
                    pkvm_wmat *w) {
    const pkv_gguf_tensor *t = NULL;
    int rc = find_tensor(g, name, rows, w->cols, &t);
    if (rc) return rc;
    for (size_t r = 0; r < rows; r++) {
        if (w->type != PKVM_W_F32) {
            pkvm_wmat_pack_row(w, row0 + r, (const unsigned char *)t->data + r * t->row_bytes);
        } else if ((rc = pkv_gguf_row_f32(t, r, F32(*w) + (row0 + r) * w->cols))) {
            return merr(rc, "%s", pkv_gguf_last_error());
        }
    }
    return 0;
}

static int load_floats(const pkv_gguf *g, const char *name, size_t n, float *dst) {
    const pkv_gguf_tensor *t = NULL;
    int rc = find_tensor(g, name, 1, n, &t);
    if (!rc && (rc = pkv_gguf_row_f32(t, 0, dst))) rc = merr(rc, "%s", pkv_gguf_last_error());
    return rc;
}

/* llama.cpp's converter interleaves each Q/K head's two rotary halves (row 2i + j
 * of a head holds the half-split row j * hd/2 + i); undo it for the half-split
 * RoPE of pkvm_forward. Rows are moved whole, whatever their storage. */
static int unpermute_heads(pkvm_wmat *w, size_t row0, size_t heads, size_t hd) {
    const size_t rb = w->row_bytes;
    unsigned char *tmp = malloc(hd * rb);
    if (!tmp) return merr(PKV_ENOMEM, "unpermute");
    for (size_t h = 0; h < heads; h++) {
        unsigned char *head = w->data + (row0 + h * hd) * rb;
        for (size_t i = 0; i < hd / 2; i++)
            for (size_t j = 0; j < 2; j++)
                memcpy(tmp + (j * hd / 2 + i) * rb, head + (2 * i + j) * rb, rb);
        memcpy(head, tmp, hd * rb);
    }
    free(tmp);
    return 0;
}

/* The common storage of tensors that are fused into one matrix: their type when
 * they all share it, else f32. */
static int plan_fused(const pkv_gguf *g, size_t l, const char *const *suffix,
                      const size_t *rows, size_t n, size_t cols, pkvm_wtype *out) {
    char name[64];
    for (size_t k = 0; k < n; k++) {
        snprintf(name, sizeof name, "blk.%zu.%s.weight", l, suffix[k]);
        const pkv_gguf_tensor *t = NULL;
        int rc = find_tensor(g, name, rows[k], cols, &t);
        if (rc) return rc;
        const pkvm_wtype wt = tensor_wtype(t);
        if (k == 0) *out = wt;
        else if (wt != *out) *out = PKVM_W_F32;
    }
    return 0;
}

static int load_layer(const pkv_gguf *g, const pkvm_config *c, size_t l, layer_w *w) {
    const size_t D = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads,
                 F = c->ffn_dim;
    char name[64];
#define LOAD(suffix, rows, row0, mat)                                                  \
    do {                                                                                \
        snprintf(name, sizeof name, "blk.%zu." suffix ".weight", l);                   \
        int rc_ = load_mat(g, name, rows, row0, mat);                                   \
        if (rc_) return rc_;                                                            \
    } while (0)
#define NORM(suffix, dst)                                                              \
    do {                                                                                \
        snprintf(name, sizeof name, "blk.%zu." suffix ".weight", l);                   \
        int rc_ = load_floats(g, name, D, dst);                                         \
        if (rc_) return rc_;                                                            \
    } while (0)
    NORM("attn_norm", w->attn_norm);
    LOAD("attn_q", nh * hd, 0, &w->wqkv);
    LOAD("attn_k", nkv * hd, nh * hd, &w->wqkv);
    LOAD("attn_v", nkv * hd, (nh + nkv) * hd, &w->wqkv);
    LOAD("attn_output", D, 0, &w->wo);
    NORM("ffn_norm", w->ffn_norm);
    LOAD("ffn_gate", F, 0, &w->w13);
    LOAD("ffn_up", F, F, &w->w13);
    LOAD("ffn_down", D, 0, &w->w2);
#undef LOAD
#undef NORM
    int rc = unpermute_heads(&w->wqkv, 0, nh, hd);
    return rc ? rc : unpermute_heads(&w->wqkv, nh * hd, nkv, hd);
}

int pkvm_create_gguf(const pkv_gguf *g, pkvm_model **out) {
    if (!g || !out) return merr(PKV_EINVAL, "gguf or out is NULL");
    *out = NULL;
    pkvm_config cfg;
    int rc = pkvm_config_from_gguf(g, &cfg);
    if (rc) return rc;
    /* Every tensor is checked (name, shape, type) and its storage planned before
     * the weights are allocated: their sizes come from the file's header, and only
     * tensors present in the file bound them. */
    const size_t D = cfg.dim, hd = cfg.head_dim, nh = cfg.n_heads, nkv = cfg.n_kv_heads,
                 F = cfg.ffn_dim, L = cfg.n_layers;
    wplan plan = {0};
    pkvm_wtype *types = calloc(4 * L, sizeof *types);
    if (!types) return merr(PKV_ENOMEM, "model plan");
    plan.qkv = types, plan.wo = types + L, plan.w13 = types + 2 * L, plan.w2 = types + 3 * L;
    const pkv_gguf_tensor *t = NULL;
    rc = find_tensor(g, "token_embd.weight", cfg.vocab, D, &t);
    if (!rc) plan.emb = tensor_wtype(t);
    if (!rc && (rc = find_tensor(g, "output_norm.weight", 1, D, &t)) == 0) {
        const pkv_gguf_tensor *o = pkv_gguf_tensor_find(g, "output.weight");
        plan.tied = o == NULL; /* tied embeddings when there is no output matrix */
        if (o && (rc = find_tensor(g, "output.weight", cfg.vocab, D, &t)) == 0)
            plan.wout = tensor_wtype(t);
    }
    static const char *const qkv[3] = {"attn_q", "attn_k", "attn_v"}, *const wo[1] = {"attn_output"},
                             *const w13[2] = {"ffn_gate", "ffn_up"}, *const w2[1] = {"ffn_down"};
    const size_t qkv_rows[3] = {nh * hd, nkv * hd, nkv * hd}, wo_rows[1] = {D},
                 w13_rows[2] = {F, F}, w2_rows[1] = {D};
    for (size_t l = 0; l < L && !rc; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%zu.attn_norm.weight", l);
        rc = find_tensor(g, name, 1, D, &t);
        if (!rc) {
            snprintf(name, sizeof name, "blk.%zu.ffn_norm.weight", l);
            rc = find_tensor(g, name, 1, D, &t);
        }
        if (!rc) rc = plan_fused(g, l, qkv, qkv_rows, 3, D, &plan.qkv[l]);
        if (!rc) rc = plan_fused(g, l, wo, wo_rows, 1, nh * hd, &plan.wo[l]);
        if (!rc) rc = plan_fused(g, l, w13, w13_rows, 2, D, &plan.w13[l]);
        if (!rc) rc = plan_fused(g, l, w2, w2_rows, 1, F, &plan.w2[l]);
    }
    pkvm_model *m = NULL;
    if (!rc) rc = model_alloc(&cfg, &plan, &m);
    free(types);
    if (rc) return rc;
    const pkvm_config *c = &m->cfg;
    rc = load_mat(g, "token_embd.weight", c->vocab, 0, &m->emb);
    if (!rc) rc = load_floats(g, "output_norm.weight", c->dim, m->final_norm);
    if (!rc && !plan.tied) rc = load_mat(g, "output.weight", c->vocab, 0, &m->wout);
    for (size_t l = 0; l < c->n_layers && !rc; l++) rc = load_layer(g, c, l, &m->layers[l]);
    if (rc) {
        pkvm_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void pkvm_free(pkvm_model *m) {
    if (!m) return;
    pool_stop(&m->pool);
    free(m->scratch);
    free(m->mem);
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

const pkvm_config *pkvm_config_of(const pkvm_model *m) { return m ? &m->cfg : NULL; }
uint64_t pkvm_params(const pkvm_model *m) { return m ? m->n_params : 0; }

void pkvm_set_threads(pkvm_model *m, unsigned n) {
    if (!m) return;
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    /* Scratch for n threads first: without it the thread count stays as it is. */
    if (m->scratch_floats && n > m->threads) {
        float *s = aligned_alloc(64, n * m->scratch_floats * sizeof(float));
        if (!s) return;
        free(m->scratch);
        m->scratch = s;
    }
    pool_stop(&m->pool);
    pool_start(&m->pool, n - 1);
    m->threads = m->pool.n + 1;
}

int pkvm_set_kernel(pkvm_model *m, pkvm_kernel k) {
    if (!m) return merr(PKV_EINVAL, "model is NULL");
    if (k != PKVM_KERNEL_EXACT && k != PKVM_KERNEL_Q8)
        return merr(PKV_EINVAL, "unknown kernel %d", (int)k);
    m->kernel = k;
    return 0;
}

pkvm_kernel pkvm_kernel_of(const pkvm_model *m) { return m ? m->kernel : PKVM_KERNEL_EXACT; }

const char *pkvm_kernel_name(pkvm_kernel k) {
    return k == PKVM_KERNEL_EXACT ? "exact" : k == PKVM_KERNEL_Q8 ? "q8" : "?";
}

void pkvm_set_attn_flags(pkvm_model *m, uint32_t flags) {
    if (m) m->attn_flags = flags;
}

static const char *dtype_name(pkv_dtype dt) {
    return dt == PKV_F32 ? "f32" : dt == PKV_F16 ? "f16" : dt == PKV_BF16 ? "bf16" : "?";
}

void pkvm_model_id(const pkvm_model *m, pkv_dtype kv, char *buf, size_t cap) {
    if (!m || !buf || !cap) return;
    const pkvm_config *c = &m->cfg;
    snprintf(buf, cap,
             "pkvm-llama/%s/L%u-d%u-h%u-kv%u-hd%u-ffn%u-v%u-theta%g-eps%g/seed%llu/kv-%s",
             c->name, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
             c->vocab, (double)c->rope_theta, (double)c->norm_eps,
             (unsigned long long)c->seed, dtype_name(kv));
}

void pkvm_cache_geometry(const pkvm_model *m, pkv_options *o) {
    if (!m || !o) return;
    o->num_layers = m->cfg.n_layers;
    o->num_kv_heads = m->cfg.n_kv_heads;
    o->head_dim = m->cfg.head_dim;
}

/* ---- Matrix products ------------------------------------------------------------ */

typedef struct mm_job {
    const pkvm_model *m;
    const pkvm_wmat *W;
    const float *x;
    const void *xq;
    float *y;
    size_t n;
} mm_job;

static void mm_part(void *arg, unsigned idx, unsigned nt) {
    const mm_job *j = arg;
    const size_t out = j->W->rows;
    /* Split the outputs in multiples of 3 (the f32 tile width). */
    const size_t tiles = (out + 2) / 3;
    size_t j0 = tiles * idx / nt * 3, j1 = tiles * (idx + 1) / nt * 3;
    if (j1 > out) j1 = out;
    pkvm_mm_range(j->W, j->x, j->xq, j->n, j0, j1, j->y, out,
                  j->m->scratch ? j->m->scratch + idx * j->m->scratch_floats : NULL, j->m->avx);
}

/* y[n][W.rows] = x[n][W.cols] . W^T; xq_buf holds n rows of the widest input
 * quantized (pkvm_act_q8_bytes), used by the q8 kernel. */
static void matmul(pkvm_model *m, const float *x, size_t n, const pkvm_wmat *W, float *y,
                   void *xq_buf) {
    const void *xq = NULL;
    if (m->kernel == PKVM_KERNEL_Q8 && W->type != PKVM_W_F32) {
        pkvm_act_quantize(x, n, W->cols, xq_buf, m->avx);
        xq = xq_buf;
    }
    mm_job j = {m, W, x, xq, y, n};
    if (n * W->cols * W->rows < (size_t)1 << 16) mm_part(&j, 0, 1);
    else pool_run(&m->pool, mm_part, &j);
}

/* ---- Per-row operations ------------------------------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *w, size_t D, float eps) {
    float ss = 0.0f;
    for (size_t i = 0; i < D; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (size_t i = 0; i < D; i++) o[i] = x[i] * r * w[i];
}

/* Half-split rotation of one head vector by the angles of one position. */
static void rope(float *v, const float *cs, const float *sn, size_t hd) {
    const size_t h = hd / 2;
    for (size_t i = 0; i < h; i++) {
        const float a = v[i], b = v[i + h];
        v[i] = a * cs[i] - b * sn[i];
        v[i + h] = a * sn[i] + b * cs[i];
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- The forward pass ----------------------------------------------------------------- */

#define ATTN_THREADS_MIN 32768u /* attended positions per call worth a thread */

int pkvm_forward(pkvm_model *m, const pkv_kv_view *v, const pkvm_row *rows, size_t n) {
    if (!m || !v || (n && !rows)) return merr(PKV_EINVAL, "model, view or rows is NULL");
    if (!n) return 0;
    const pkvm_config *c = &m->cfg;
    if (v->num_layers != c->n_layers || v->num_kv_heads != c->n_kv_heads ||
        v->head_dim != c->head_dim)
        return merr(PKV_EGEOMETRY, "view geometry %u/%u/%u differs from the model's %u/%u/%u",
                    v->num_layers, v->num_kv_heads, v->head_dim, c->n_layers, c->n_kv_heads,
                    c->head_dim);
    if (!v->base) return merr(PKV_EINVAL, "view->base is NULL");
    for (size_t i = 0; i < n; i++) {
        const pkvm_row *r = &rows[i];
        if (r->token >= c->vocab)
            return merr(PKV_EINVAL, "row %zu: token %u >= vocab %u", i, r->token, c->vocab);
        if (r->slot.block >= v->num_blocks || r->slot.offset >= v->block_size)
            return merr(PKV_ERANGE, "row %zu: slot (%u, %u) outside the view", i,
                        r->slot.block, r->slot.offset);
        if (!r->table || r->n_table <= r->pos / v->block_size ||
            r->table[r->pos / v->block_size] != r->slot.block ||
            r->pos % v->block_size != r->slot.offset)
            return merr(PKV_ERANGE, "row %zu: position %u is not slot (%u, %u) of its table", i,
                        r->pos, r->slot.block, r->slot.offset);
    }
    const size_t D = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads,
                 F = c->ffn_dim, V = c->vocab, L = c->n_layers;
    const size_t qkv_w = (nh + 2 * nkv) * hd, half = hd / 2;

    /* Scratch: x, xn [n][D]; qkv [n][qkv_w]; q, att [n][nh hd]; gu [n][2F];
     * h [n][F]; cos, sin [n][hd/2]; seqs. */
    const size_t floats = n * (2 * D + qkv_w + 2 * nh * hd + 2 * F + F + 2 * half);
    float *mem = malloc(floats * sizeof(float));
    pkv_attn_seq *seqs = malloc(n * sizeof *seqs);
    void *xq = malloc(pkvm_act_q8_bytes(n, m->max_cols) + 1);
    if (!mem || !seqs || !xq) {
        free(mem);
        free(seqs);
        free(xq);
        return merr(PKV_ENOMEM, "forward scratch for %zu rows", n);
    }
    float *x = mem, *xn = x + n * D, *qkv = xn + n * D, *q = qkv + n * qkv_w,
          *att = q + n * nh * hd, *gu = att + n * nh * hd, *hb = gu + n * 2 * F,
          *cs = hb + n * F, *sn = cs + n * half;
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        pkvm_wmat_row_f32(&m->emb, rows[i].token, x + i * D);
        for (size_t k = 0; k < half; k++) {
            const double a = (double)rows[i].pos * m->inv_freq[k];
            cs[i * half + k] = (float)cos(a);
            sn[i * half + k] = (float)sin(a);
        }
        seqs[i] = (pkv_attn_seq){rows[i].table, rows[i].n_table, (size_t)rows[i].pos + 1};
    }
    /* pkv_attn_decode starts its threads per call (per layer): below about 32k
     * attended positions that costs more than it saves (a decode step at a few
     * thousand tokens of context). Its result does not depend on the count. */
    size_t attended = 0;
    for (size_t i = 0; i < n; i++) attended += (size_t)rows[i].pos + 1;
    pkv_attn_params ap = {.layer = 0,
                          .num_q_heads = (uint32_t)nh,
                          .scale = 1.0f / sqrtf((float)hd),
                          .num_threads = attended < ATTN_THREADS_MIN ? 1 : m->threads,
                          .flags = m->attn_flags};

    for (size_t l = 0; l < L && !rc; l++) {
        const layer_w *w = &m->layers[l];
        for (size_t i = 0; i < n; i++)
            rmsnorm(xn + i * D, x + i * D, w->attn_norm, D, c->norm_eps);
        matmul(m, xn, n, &w->wqkv, qkv, xq);
        for (size_t i = 0; i < n; i++) {
            float *r = qkv + i * qkv_w;
            for (size_t h = 0; h < nh + nkv; h++) /* q heads, then k heads */
                rope(r + h * hd, cs + i * half, sn + i * half, hd);
            memcpy(q + i * nh * hd, r, nh * hd * sizeof(float));
            uint8_t *base = (uint8_t *)(uintptr_t)v->base +
                            (size_t)rows[i].slot.block * v->block_stride + l * v->layer_stride +
                            (size_t)rows[i].slot.offset * v->token_stride;
            for (size_t h = 0; h < nkv; h++) {
                pkv_kv_store(v->dtype, base + h * v->head_stride, r + (nh + h) * hd, hd);
                pkv_kv_store(v->dtype, base + v->kind_stride + h * v->head_stride,
                             r + (nh + nkv + h) * hd, hd);
            }
        }
        ap.layer = (uint32_t)l;
        rc = pkv_attn_decode(v, &ap, seqs, n, q, att);
        if (rc) {
            rc = merr(rc, "pkv_attn_decode: %s", pkv_last_error());
            break;
        }
        matmul(m, att, n, &w->wo, xn, xq);
        for (size_t i = 0; i < n * D; i++) x[i] += xn[i];
        for (size_t i = 0; i < n; i++)
            rmsnorm(xn + i * D, x + i * D, w->ffn_norm, D, c->norm_eps);
        matmul(m, xn, n, &w->w13, gu, xq);
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < F; k++)
                hb[i * F + k] = silu(gu[i * 2 * F + k]) * gu[i * 2 * F + F + k];
        matmul(m, hb, n, &w->w2, xn, xq);
        for (size_t i = 0; i < n * D; i++) x[i] += xn[i];
    }

    if (!rc) {
        /* Logits for the rows that want them: gather, norm, project, scatter. */
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (rows[i].logits) rmsnorm(xn + k++ * D, x + i * D, m->final_norm, D, c->norm_eps);
        if (k) {
            float *lg = malloc(k * V * sizeof(float));
            if (!lg) {
                rc = merr(PKV_ENOMEM, "logits");
            } else {
                matmul(m, xn, k, &m->wout, lg, xq);
                k = 0;
                for (size_t i = 0; i < n; i++)
                    if (rows[i].logits)
                        memcpy(rows[i].logits, lg + k++ * V, V * sizeof(float));
                free(lg);
            }
        }
    }
    free(mem);
    free(seqs);
    free(xq);
    return rc;
}

uint32_t pkvm_argmax(const float *logits, uint32_t vocab) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Whether token a comes before token b in the order (logit descending, index
 * ascending). */
static inline bool rank_before(const float *logits, uint32_t a, uint32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

uint32_t pkvm_rank(const float *logits, uint32_t vocab, uint32_t k) {
    /* The k-th element of the order, by k + 1 passes that each take the first
     * token after the previous one: O(vocab * k), for the small k samplers use. */
    if (k >= vocab) k = vocab - 1;
    uint32_t prev = UINT32_MAX;
    for (uint32_t r = 0; r <= k; r++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < vocab; i++) {
            if (prev != UINT32_MAX && !rank_before(logits, prev, i)) continue;
            if (best == UINT32_MAX || rank_before(logits, i, best)) best = i;
        }
        if (best == UINT32_MAX) return 0; /* NaN logits: no order */
        prev = best;
    }
    return prev;
}

/* ---- Paged path --------------------------------------------------------------------- */

struct pkvm_engine {
    pkvm_model *m;
    pkv_cache *c;
    pkv_kv_view view;
    size_t chunk;
    void (*progress)(void *, size_t, size_t);
    void *parg;
    pkv_slot *slots;
    size_t slots_cap;
    pkvm_row *rows;
    size_t rows_cap;
    uint32_t **tables; /* one per batch row */
    size_t *tcap, *tlen;
    size_t ntables;
};

/* Grow *p (an array of `elem`-byte entries with *cap entries) to >= need entries. */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return merr(PKV_ENOMEM, "engine buffers");
    *p = q;
    *cap = nc;
    return 0;
}

#define GROW(rc, ptr, cap, need)                                                   \
    do {                                                                           \
        void *tmp_ = (ptr);                                                        \
        (rc) = grow(&tmp_, &(cap), (need), sizeof *(ptr));                         \
        (ptr) = tmp_;                                                              \
    } while (0)

int pkvm_engine_create(pkvm_model *m, pkv_cache *cache, pkvm_engine **out) {
    if (!m || !cache || !out) return merr(PKV_EINVAL, "model, cache or out is NULL");
    *out = NULL;
    pkvm_engine *e = calloc(1, sizeof *e);
    if (!e) return merr(PKV_ENOMEM, "engine");
    int rc = pkv_kv_view_of(cache, &e->view);
    if (rc) {
        free(e);
        return merr(rc, "pkv_kv_view_of: %s", pkv_last_error());
    }
    const pkvm_config *c = &m->cfg;
    if (e->view.num_layers != c->n_layers || e->view.num_kv_heads != c->n_kv_heads ||
        e->view.head_dim != c->head_dim) {
        free(e);
        return merr(PKV_EGEOMETRY, "cache geometry does not match the model");
    }
    e->m = m;
    e->c = cache;
    e->chunk = 256;
    *out = e;
    return 0;
}

void pkvm_engine_free(pkvm_engine *e) {
    if (!e) return;
    for (size_t i = 0; i < e->ntables; i++) free(e->tables[i]);
    free(e->tables);
    free(e->tcap);
    free(e->tlen);
    free(e->slots);
    free(e->rows);
    free(e);
}

void pkvm_engine_set_chunk(pkvm_engine *e, size_t chunk) {
    if (e) e->chunk = chunk ? chunk : 256;
}

void pkvm_engine_set_progress(pkvm_engine *e, void (*fn)(void *, size_t, size_t), void *arg) {
    if (!e) return;
    e->progress = fn;
    e->parg = arg;
}

static int ensure_tables(pkvm_engine *e, size_t n) {
    if (n <= e->ntables) return 0;
    uint32_t **t = realloc(e->tables, n * sizeof *t);
    if (!t) return merr(PKV_ENOMEM, "engine tables");
    e->tables = t;
    size_t *c = realloc(e->tcap, n * sizeof *c);
    if (!c) return merr(PKV_ENOMEM, "engine tables");
    e->tcap = c;
    size_t *l = realloc(e->tlen, n * sizeof *l);
    if (!l) return merr(PKV_ENOMEM, "engine tables");
    e->tlen = l;
    for (size_t i = e->ntables; i < n; i++) e->tables[i] = NULL, e->tcap[i] = 0, e->tlen[i] = 0;
    e->ntables = n;
    return 0;
}

/* Block table of id into table slot k. */
static int fetch_table(pkvm_engine *e, size_t k, uint64_t id) {
    for (;;) {
        size_t n = 0;
        int rc = pkv_seq_blocks(e->c, id, e->tables[k], e->tcap[k], &n);
        if (rc == 0) {
            e->tlen[k] = n;
            return 0;
        }
        if (rc != PKV_ERANGE) return merr(rc, "pkv_seq_blocks: %s", pkv_last_error());
        GROW(rc, e->tables[k], e->tcap[k], n);
        if (rc) return rc;
    }
}

int pkvm_extend(pkvm_engine *e, uint64_t id, const uint32_t *tokens, size_t n,
                float *logits) {
    if (!e || !tokens || !n) return merr(PKV_EINVAL, "engine or tokens is NULL, or n is 0");
    pkv_seq_info inf;
    int rc = pkv_seq_get_info(e->c, id, &inf);
    if (rc) return merr(rc, "pkv_seq_get_info: %s", pkv_last_error());
    if (inf.len != inf.committed) return merr(PKV_ESTATE, "sequence has pending tokens");
    if (inf.len + n > UINT32_MAX) return merr(PKV_ERANGE, "position overflows");
    const size_t base = (size_t)inf.len;
    const size_t chunk = e->chunk;
    const size_t most = chunk < n ? chunk : n;
    if ((rc = ensure_tables(e, 1))) return rc;
    GROW(rc, e->slots, e->slots_cap, most);
    if (rc) return rc;
    GROW(rc, e->rows, e->rows_cap, most);
    if (rc) return rc;
    size_t done = 0;
    while (done < n) {
        const size_t k = n - done < chunk ? n - done : chunk;
        rc = pkv_seq_append(e->c, id, tokens + done, k, e->slots);
        if (rc) {
            rc = merr(rc, "pkv_seq_append: %s", pkv_last_error());
            break;
        }
        if ((rc = fetch_table(e, 0, id))) break;
        for (size_t i = 0; i < k; i++)
            e->rows[i] = (pkvm_row){.token = tokens[done + i],
                                    .pos = (uint32_t)(base + done + i),
                                    .slot = e->slots[i],
                                    .table = e->tables[0],
                                    .n_table = e->tlen[0],
                                    .logits = (done + k == n && i == k - 1) ? logits : NULL};
        if ((rc = pkvm_forward(e->m, &e->view, e->rows, k))) break;
        rc = pkv_seq_commit(e->c, id, k);
        if (rc) {
            rc = merr(rc, "pkv_seq_commit: %s", pkv_last_error());
            break;
        }
        done += k;
        if (e->progress) e->progress(e->parg, done, n);
    }
    if (rc) pkv_seq_truncate(e->c, id, base); /* best effort: drop what this call added */
    return rc;
}

int pkvm_prefill(pkvm_engine *e, uint64_t id, uint64_t salt, const uint32_t *prompt,
                 size_t n, float *logits, size_t *n_cached) {
    if (!e || !prompt || !n) return merr(PKV_EINVAL, "engine or prompt is NULL, or n is 0");
    size_t nc = 0;
    int rc = pkv_seq_open(e->c, id, salt, prompt, n, &nc);
    if (rc) return merr(rc, "pkv_seq_open: %s", pkv_last_error());
    rc = pkvm_extend(e, id, prompt + nc, n - nc, logits);
    if (rc) {
        pkv_seq_close(e->c, id);
        return rc;
    }
    if (n_cached) *n_cached = nc;
    return 0;
}

int pkvm_step(pkvm_engine *e, const uint64_t *ids, const uint32_t *toks, size_t n,
              float *logits) {
    if (!e || (n && (!ids || !toks || !logits)))
        return merr(PKV_EINVAL, "engine, ids, toks or logits is NULL");
    if (!n) return 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (ids[i] == ids[j]) return merr(PKV_EINVAL, "sequence id repeated in a step");
    int rc;
    if ((rc = ensure_tables(e, n))) return rc;
    GROW(rc, e->slots, e->slots_cap, n);
    if (rc) return rc;
    GROW(rc, e->rows, e->rows_cap, n);
    if (rc) return rc;
    size_t appended = 0;
    for (size_t i = 0; i < n; i++) {
        pkv_seq_info inf;
        rc = pkv_seq_get_info(e->c, ids[i], &inf);
        if (rc) {
            rc = merr(rc, "pkv_seq_get_info: %s", pkv_last_error());
            break;
        }
        if (inf.len != inf.committed || inf.len >= UINT32_MAX) {
            rc = merr(PKV_ESTATE, "sequence has pending tokens or is too long");
            break;
        }
        rc = pkv_seq_append(e->c, ids[i], &toks[i], 1, &e->slots[i]);
        if (rc) {
            rc = merr(rc, "pkv_seq_append: %s", pkv_last_error());
            break;
        }
        appended++;
        e->rows[i] = (pkvm_row){.token = toks[i],
                                .pos = (uint32_t)inf.len,
                                .slot = e->slots[i],
                                .logits = logits + i * (size_t)e->m->cfg.vocab};
    }
    for (size_t i = 0; !rc && i < n; i++) {
        if ((rc = fetch_table(e, i, ids[i]))) break;
        e->rows[i].table = e->tables[i];
        e->rows[i].n_table = e->tlen[i];
    }
    if (!rc) rc = pkvm_forward(e->m, &e->view, e->rows, n);
    size_t committed = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = pkv_seq_commit(e->c, ids[i], 1);
        if (rc) rc = merr(rc, "pkv_seq_commit: %s", pkv_last_error());
        else committed++;
    }
    if (rc) /* best effort: drop the tokens this call added */
        for (size_t i = committed; i < appended; i++)
            pkv_seq_truncate(e->c, ids[i], e->rows[i].pos);
    return rc;
}

/* ---- From scratch ------------------------------------------------------------------- */

struct pkvm_scratch {
    pkvm_model *m;
    pkv_kv_view view;
    void *buf;
    size_t max_ctx;
    uint32_t table[1];
    pkvm_row *rows;
};

#define SCRATCH_CHUNK 256u

int pkvm_scratch_create(pkvm_model *m, pkv_dtype kv, size_t max_ctx, pkvm_scratch **out) {
    if (!m || !out) return merr(PKV_EINVAL, "model or out is NULL");
    *out = NULL;
    if (kv != PKV_F32 && kv != PKV_F16 && kv != PKV_BF16)
        return merr(PKV_EINVAL, "unknown KV dtype %d", (int)kv);
    if (!max_ctx || max_ctx > UINT32_MAX) return merr(PKV_EINVAL, "max_ctx %zu", max_ctx);
    const pkvm_config *c = &m->cfg;
    const size_t es = kv == PKV_F32 ? 4 : 2;
    const size_t row = (size_t)c->head_dim * es;
    const size_t head = max_ctx * row, kind = head * c->n_kv_heads, layer = 2 * kind;
    const size_t bytes = layer * c->n_layers;
    pkvm_scratch *s = calloc(1, sizeof *s);
    if (!s) return merr(PKV_ENOMEM, "scratch");
    s->buf = malloc(bytes);
    s->rows = malloc(SCRATCH_CHUNK * sizeof *s->rows);
    if (!s->buf || !s->rows) {
        pkvm_scratch_free(s);
        return merr(PKV_ENOMEM, "scratch KV buffer of %zu bytes", bytes);
    }
    /* Poison: NaN everywhere, so a read of an unwritten position shows. */
    const uint32_t nan32 = 0x7fc00000u;
    const uint16_t nan16 = kv == PKV_F16 ? 0x7e00u : 0x7fc0u;
    for (size_t i = 0; i < bytes; i += es) {
        if (es == 4) memcpy((uint8_t *)s->buf + i, &nan32, 4);
        else memcpy((uint8_t *)s->buf + i, &nan16, 2);
    }
    s->m = m;
    s->max_ctx = max_ctx;
    s->view = (pkv_kv_view){.base = s->buf,
                            .dtype = kv,
                            .num_layers = c->n_layers,
                            .num_kv_heads = c->n_kv_heads,
                            .head_dim = c->head_dim,
                            .block_size = (uint32_t)max_ctx,
                            .num_blocks = 1,
                            .block_stride = bytes,
                            .layer_stride = layer,
                            .kind_stride = kind,
                            .head_stride = head,
                            .token_stride = row};
    s->table[0] = 0;
    *out = s;
    return 0;
}

void pkvm_scratch_free(pkvm_scratch *s) {
    if (!s) return;
    free(s->buf);
    free(s->rows);
    free(s);
}

int pkvm_scratch_run(pkvm_scratch *s, const uint32_t *tokens, size_t n, float *logits,
                     float *all_logits) {
    if (!s || !tokens || !logits) return merr(PKV_EINVAL, "scratch, tokens or logits is NULL");
    if (!n || n > s->max_ctx) return merr(PKV_ERANGE, "n %zu not in 1..%zu", n, s->max_ctx);
    const size_t V = s->m->cfg.vocab;
    for (size_t p0 = 0; p0 < n; p0 += SCRATCH_CHUNK) {
        const size_t k = n - p0 < SCRATCH_CHUNK ? n - p0 : SCRATCH_CHUNK;
        for (size_t i = 0; i < k; i++) {
            const size_t p = p0 + i;
            float *lg = all_logits ? all_logits + p * V : p == n - 1 ? logits : NULL;
            s->rows[i] = (pkvm_row){.token = tokens[p],
                                    .pos = (uint32_t)p,
                                    .slot = {0, (uint32_t)p},
                                    .table = s->table,
                                    .n_table = 1,
                                    .logits = lg};
        }
        int rc = pkvm_forward(s->m, &s->view, s->rows, k);
        if (rc) return rc;
    }
    if (all_logits) memcpy(logits, all_logits + (n - 1) * V, V * sizeof(float));
    return 0;
}
