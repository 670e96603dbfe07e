/*
 * gpu_attention.c — the paged decode-attention kernel (pkv_cuda_attn_decode)
 * against the CPU reference (pkv_attn_decode), on fresh random inputs each run
 * (PKV_SEED repeats one).
 *
 * K/V live in a synthetic paged buffer with random block tables; every byte no
 * sequence owns -- unused blocks, the slots past a sequence's length in its last
 * block, the other layer, the padding of padded rows -- holds NaN, so a stray
 * read makes the output NaN and fails. Lengths cover 1, B-1, B, B+1, split
 * boundaries (forced split lengths), the kernel's 512-token sub-chunk boundaries
 * and long contexts (auto split). Tolerances (design-notes section 4): the
 * largest |gpu - cpu| of a (sequence, query head) row over the largest |cpu| of
 * the row must stay below f32 1e-4, f16 1e-3, bf16 1.6e-2.
 *
 * Exit 77 without the CUDA layer, a driver or a device.
 */
#include "gpu_util.h"

#if !PKV_WITH_CUDA
int main(void) {
    gpu_start("gpu_attention"); /* exits 77 */
    return GPU_SKIP;
}
#else

typedef struct acase {
    pkv_dtype dt;
    uint32_t D, nkv, g, bs;
    uint32_t n;          /* sequences */
    uint32_t lens[16];
    uint32_t split_len;  /* 0: auto */
    int pad_rows;        /* token_stride = row + one element: unaligned rows */
    int alias;           /* out == q */
    int bad_block;       /* sequence 1 gets an out-of-range block id */
    int long_max;        /* max_len given above every len */
    const char *what;
} acase;

static double worst[3];
static int cases_run;

static void run_case(const acase *c) {
    const uint32_t layers = 2, layer = 1, nq = c->nkv * c->g, D = c->D, bs = c->bs;
    const size_t es = gu_esize(c->dt), row = (size_t)D * es;
    const size_t ts = c->pad_rows ? row + es : row;
    const size_t head_stride = bs * ts, kind_stride = c->nkv * head_stride;
    const size_t layer_stride = 2 * kind_stride;
    size_t block_stride = layers * layer_stride;
    block_stride = (block_stride + 255) / 256 * 256;
    uint32_t max_len = 0, need = 0, stride = 1;
    for (uint32_t s = 0; s < c->n; s++) {
        const uint32_t nb = (c->lens[s] + bs - 1) / bs;
        need += nb;
        if (nb > stride) stride = nb;
        if (c->lens[s] > max_len) max_len = c->lens[s];
    }
    if (c->long_max) {
        max_len += 1000;
        stride = (max_len + bs - 1) / bs;
    }
    const uint32_t nblocks = need + 3;
    const size_t bytes = (size_t)nblocks * block_stride;
    uint8_t *h = malloc(bytes);
    uint32_t *perm = malloc(nblocks * sizeof *perm), *tab = malloc((size_t)c->n * stride * 4);
    float *q = malloc((size_t)c->n * nq * D * 4), *ref = malloc((size_t)c->n * nq * D * 4),
          *got = malloc((size_t)c->n * nq * D * 4), *rowf = malloc(D * 4);
    if (!h || !perm || !tab || !q || !ref || !got || !rowf) {
        gu_fail("%s: host allocation", c->what);
        goto done;
    }
    gu_nan_fill(h, c->dt, bytes / es);
    for (uint32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (uint32_t i = nblocks; i > 1; i--) {
        const uint32_t j = gu_below(i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    pkv_attn_seq *as = calloc(c->n, sizeof *as);
    uint32_t *lens = malloc(c->n * 4);
    uint32_t at = 0;
    for (uint32_t s = 0; s < c->n; s++) {
        const uint32_t nb = (c->lens[s] + bs - 1) / bs;
        for (uint32_t i = 0; i < stride; i++) tab[(size_t)s * stride + i] = i < nb ? perm[at + i] : UINT32_MAX;
        as[s] = (pkv_attn_seq){tab + (size_t)s * stride, nb, c->lens[s]};
        lens[s] = c->lens[s];
        for (uint32_t t = 0; t < c->lens[s]; t++) {
            const uint32_t b = tab[(size_t)s * stride + t / bs];
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t hd = 0; hd < c->nkv; hd++) {
                    for (uint32_t d = 0; d < D; d++) rowf[d] = gu_frand(1.0f);
                    pkv_kv_store(c->dt, h + b * block_stride + layer * layer_stride + k * kind_stride +
                                            hd * head_stride + (t % bs) * ts,
                                 rowf, D);
                }
        }
        at += nb;
    }
    for (size_t i = 0; i < (size_t)c->n * nq * D; i++) q[i] = gu_frand(1.0f);
    const float scale = (float)((gu_below(2) ? 4.0 : 0.5) / sqrt((double)D));
    pkv_kv_view v = {.base = h, .dtype = c->dt, .num_layers = layers, .num_kv_heads = c->nkv,
                     .head_dim = D, .block_size = bs, .num_blocks = nblocks,
                     .block_stride = block_stride, .layer_stride = layer_stride,
                     .kind_stride = kind_stride, .head_stride = head_stride, .token_stride = ts};
    pkv_attn_params ap = {.layer = layer, .num_q_heads = nq, .scale = scale, .num_threads = 16};
    int rc = pkv_attn_decode(&v, &ap, as, c->n, q, ref);
    if (rc) {
        gu_fail("%s: CPU reference -> %d (%s)", c->what, rc, pkv_last_error());
        goto done2;
    }
    if (c->bad_block && c->n > 1) tab[(size_t)1 * stride] = nblocks + 5;

    void *d_kv = NULL, *d_work = NULL;
    uint32_t *d_tab = NULL, *d_len = NULL;
    float *d_q = NULL, *d_out = NULL;
    const size_t qb = (size_t)c->n * nq * D * 4;
    cudaError_t e = cudaMalloc(&d_kv, bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_tab, (size_t)c->n * stride * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_len, c->n * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_q, qb);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_out, qb);
    if (e == cudaSuccess) e = cudaMemcpy(d_kv, h, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(d_tab, tab, (size_t)c->n * stride * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(d_len, lens, c->n * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(d_q, q, qb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(d_out, 0xff, qb); /* NaN */
    if (e != cudaSuccess) {
        gu_fail("%s: device setup: %s", c->what, cudaGetErrorString(e));
        goto done3;
    }
    v.base = d_kv;
    pkv_cuda_seqs sq = {.tables = d_tab, .table_stride = stride, .lens = d_len, .n_seqs = c->n,
                        .max_len = max_len, .split_len = c->split_len};
    size_t wb = 0;
    rc = pkv_cuda_attn_workspace(&v, &ap, &sq, &wb);
    if (!rc && wb) e = cudaMalloc(&d_work, wb);
    if (rc || e != cudaSuccess) {
        gu_fail("%s: workspace -> %d (%s) %s", c->what, rc, pkv_last_error(), cudaGetErrorString(e));
        goto done3;
    }
    float *qin = d_q;
    if (c->alias) {
        cudaMemcpy(d_out, d_q, qb, cudaMemcpyDeviceToDevice);
        qin = d_out;
    }
    rc = pkv_cuda_attn_decode(&v, &ap, &sq, qin, d_out, d_work, wb, NULL);
    if (rc) {
        gu_fail("%s: pkv_cuda_attn_decode -> %d (%s)", c->what, rc, pkv_last_error());
        goto done3;
    }
    e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(got, d_out, qb, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        gu_fail("%s: kernel: %s", c->what, cudaGetErrorString(e));
        goto done3;
    }
    cases_run++;
    for (uint32_t s = 0; s < c->n; s++) {
        const float *gs = got + (size_t)s * nq * D, *rs = ref + (size_t)s * nq * D;
        if (c->bad_block && s == 1) {
            int all_nan = 1;
            for (size_t i = 0; i < (size_t)nq * D; i++) all_nan &= isnan(gs[i]);
            GU_CHECK(all_nan, "%s: a bad block id must give NaN for its sequence", c->what);
            continue;
        }
        size_t bad = 0;
        const double err = gu_compare(gs, rs, nq, D, &bad);
        if (err > worst[c->dt] && isfinite(err)) worst[c->dt] = err;
        GU_CHECK(err <= gu_tol(c->dt),
                 "%s: %s D=%u g=%u kv=%u B=%u seq %u len %u split %u: error %.3g > %.3g "
                 "(head %zu: gpu %g cpu %g)",
                 c->what, gu_dname(c->dt), D, c->g, c->nkv, bs, s, c->lens[s], c->split_len, err,
                 gu_tol(c->dt), bad, (double)gs[bad * D], (double)rs[bad * D]);
    }
done3:
    cudaFree(d_kv);
    cudaFree(d_tab);
    cudaFree(d_len);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_work);
done2:
    free(as);
    free(lens);
done:
    free(h);
    free(perm);
    free(tab);
    free(q);
    free(ref);
    free(got);
    free(rowf);
}

static void bad_length_gives_nan(void) {
    /* len 0 and len > max_len: NaN, never a read past the table. */
    const uint32_t D = 128, nkv = 1, bs = 16;
    const size_t es = 2, row = D * es, bstride = (2 * bs * row + 255) / 256 * 256;
    void *d_kv = NULL;
    uint32_t *d_tab = NULL, *d_len = NULL;
    float *d_q = NULL, *d_out = NULL;
    GU_CUDA(cudaMalloc(&d_kv, 4 * bstride));
    GU_CUDA(cudaMemset(d_kv, 0, 4 * bstride));
    GU_CUDA(cudaMalloc((void **)&d_tab, 2 * 2 * 4));
    GU_CUDA(cudaMalloc((void **)&d_len, 2 * 4));
    GU_CUDA(cudaMalloc((void **)&d_q, 2 * D * 4));
    GU_CUDA(cudaMalloc((void **)&d_out, 2 * D * 4));
    const uint32_t tab[4] = {0, 1, 2, 3}, lens[2] = {0, 40};
    GU_CUDA(cudaMemcpy(d_tab, tab, sizeof tab, cudaMemcpyHostToDevice));
    GU_CUDA(cudaMemcpy(d_len, lens, sizeof lens, cudaMemcpyHostToDevice));
    GU_CUDA(cudaMemset(d_q, 0, 2 * D * 4));
    pkv_kv_view v = {.base = d_kv, .dtype = PKV_F16, .num_layers = 1, .num_kv_heads = nkv,
                     .head_dim = D, .block_size = bs, .num_blocks = 4, .block_stride = bstride,
                     .layer_stride = 2 * bs * row, .kind_stride = bs * row, .head_stride = bs * row,
                     .token_stride = row};
    pkv_attn_params ap = {.layer = 0, .num_q_heads = 1, .scale = 1.0f};
    pkv_cuda_seqs sq = {.tables = d_tab, .table_stride = 2, .lens = d_len, .n_seqs = 2,
                        .max_len = 32};
    GU_OK(pkv_cuda_attn_decode(&v, &ap, &sq, d_q, d_out, NULL, 0, NULL));
    float out[2 * 128];
    GU_CUDA(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    int nan0 = 1, nan1 = 1;
    for (uint32_t d = 0; d < D; d++) {
        nan0 &= isnan(out[d]);
        nan1 &= isnan(out[D + d]);
    }
    GU_CHECK(nan0 && nan1, "len 0 and len > max_len must give NaN rows");
    /* Argument checks. */
    pkv_cuda_seqs bad = sq;
    bad.table_stride = 1;
    GU_CHECK(pkv_cuda_attn_decode(&v, &ap, &bad, d_q, d_out, NULL, 0, NULL) == PKV_ERANGE,
             "table_stride too small must be PKV_ERANGE");
    pkv_attn_params bp = ap;
    bp.num_q_heads = 3;
    v.num_kv_heads = 2;
    GU_CHECK(pkv_cuda_attn_decode(&v, &bp, &sq, d_q, d_out, NULL, 0, NULL) == PKV_EINVAL,
             "num_q_heads not a multiple of num_kv_heads must be PKV_EINVAL");
    cudaFree(d_kv);
    cudaFree(d_tab);
    cudaFree(d_len);
    cudaFree(d_q);
    cudaFree(d_out);
}

int main(void) {
    gpu_start("gpu_attention");
    gu_seed();
    const pkv_dtype dts[3] = {PKV_F32, PKV_F16, PKV_BF16};
    for (int k = 0; k < 3; k++) {
        const pkv_dtype dt = dts[k];
        const acase cs[] = {
            {dt, 128, 2, 4, 16, 6, {1, 15, 16, 17, 100, 1000}, 0, 0, 0, 0, 0, "lengths around B"},
            {dt, 128, 2, 4, 16, 6, {63, 64, 65, 128, 129, 1}, 64, 0, 0, 0, 0, "split boundaries"},
            {dt, 128, 2, 4, 16, 6, {511, 512, 513, 999, 1000, 1001}, 1000, 0, 0, 0, 0, "sub-chunk boundaries"},
            {dt, 64, 4, 1, 7, 4, {6, 7, 8, 50}, 0, 0, 0, 0, 0, "D64 MHA B7"},
            {dt, 256, 1, 8, 32, 4, {31, 32, 33, 700}, 100, 0, 0, 0, 0, "D256 g8"},
            {dt, 128, 2, 16, 16, 2, {200, 3}, 0, 0, 0, 0, 0, "g16 two tiles"},
            {dt, 128, 3, 5, 16, 2, {77, 300}, 0, 0, 0, 0, 0, "g5 partial tile"},
            {dt, 64, 2, 2, 16, 2, {40, 5}, 0, 0, 0, 0, 0, "g2"},
            {dt, 96, 2, 3, 5, 5, {1, 4, 5, 6, 300}, 0, 0, 0, 0, 0, "generic D96"},
            {dt, 5, 1, 2, 3, 2, {9, 1}, 0, 0, 0, 0, 0, "generic D5"},
            {dt, 128, 2, 4, 16, 2, {33, 700}, 200, 1, 0, 0, 0, "unaligned rows"},
            {dt, 128, 2, 4, 16, 3, {33, 700, 64}, 0, 0, 1, 0, 0, "out aliases q"},
            {dt, 128, 2, 4, 16, 3, {33, 700, 64}, 0, 0, 0, 1, 0, "bad block id"},
            {dt, 128, 2, 4, 16, 2, {100, 3000}, 0, 0, 0, 0, 1, "max_len above every len"},
            {dt, 128, 8, 4, 16, 2, {32771, 5}, 0, 0, 0, 0, 0, "32k context"},
        };
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
    }
    /* GQA: f16/bf16 at head_dim 64 and 128 with 2+ query heads per kv head run
     * the tensor-core kernel (f32, head_dim 256 and g = 1 the CUDA-core one).
     * These cases, then again on the CUDA-core kernel (PKV_CUDA_ATTN_NO_MMA),
     * which f16/bf16 reach only that way (the list above covers g = 4 on the
     * tensor-core kernel). */
    for (int pass = 0; pass < 2; pass++) {
        if (pass) setenv("PKV_CUDA_ATTN_NO_MMA", "1", 1);
        for (int k = pass; k < 3; k++) {
            const pkv_dtype dt = dts[k];
            const acase g8[] = {
                {dt, 128, 2, 8, 16, 6, {1, 15, 16, 17, 100, 1000}, 0, 0, 0, 0, 0, "g8 lengths around B"},
                {dt, 64, 2, 8, 16, 6, {63, 64, 65, 128, 129, 1}, 64, 0, 0, 0, 0, "g8 D64 split boundaries"},
                {dt, 128, 1, 8, 7, 4, {5, 63, 64, 2001}, 0, 0, 0, 0, 0, "g8 B7"},
                {dt, 128, 2, 8, 16, 3, {33, 700, 64}, 0, 0, 1, 0, 0, "g8 out aliases q"},
                {dt, 128, 2, 8, 16, 3, {33, 700, 64}, 0, 0, 0, 1, 0, "g8 bad block id"},
                {dt, 64, 3, 7, 1, 3, {1, 2, 333}, 100, 0, 0, 0, 0, "g7 D64 B1"},
                {dt, 128, 1, 24, 32, 2, {4099, 17}, 0, 0, 0, 0, 0, "g24 three tiles"},
                {dt, 128, 8, 8, 16, 2, {32771, 5}, 0, 0, 0, 0, 0, "g8 32k context"},
                {dt, 128, 2, 4, 16, 6, {1, 15, 16, 17, 100, 1000}, 0, 0, 0, 0, 0, "g4 lengths around B"},
                {dt, 128, 2, 4, 16, 6, {511, 512, 513, 999, 1000, 1001}, 1000, 0, 0, 0, 0, "g4 sub-chunk boundaries"},
                {dt, 64, 2, 3, 16, 3, {33, 700, 64}, 0, 0, 0, 1, 0, "g3 D64 bad block id"},
                {dt, 128, 2, 2, 9, 2, {100, 3000}, 0, 0, 0, 0, 1, "g2 B9 max_len above every len"},
            };
            for (size_t i = 0; i < sizeof g8 / sizeof g8[0]; i++) {
                acase c = g8[i];
                char what[64];
                snprintf(what, sizeof what, "%s%s", c.what, pass ? " (CUDA cores)" : "");
                c.what = what;
                run_case(&c);
            }
        }
        if (pass) unsetenv("PKV_CUDA_ATTN_NO_MMA");
    }
    /* Long context, f16 and bf16. */
    const acase lc[] = {
        {PKV_F16, 128, 8, 4, 16, 1, {131072}, 0, 0, 0, 0, 0, "128k context"},
        {PKV_BF16, 128, 8, 8, 16, 1, {131071}, 0, 0, 0, 0, 0, "128k context"},
    };
    for (size_t i = 0; i < 2; i++) run_case(&lc[i]);
    /* Random configurations. */
    const uint32_t dims[] = {64, 128, 256, 80};
    for (int r = 0; r < 24; r++) {
        acase c;
        memset(&c, 0, sizeof c);
        c.dt = dts[gu_below(3)];
        c.D = dims[gu_below(4)];
        c.nkv = 1 + gu_below(4);
        c.g = 1 + gu_below(8);
        c.bs = 1 + gu_below(32);
        c.n = 1 + gu_below(8);
        for (uint32_t s = 0; s < c.n; s++) c.lens[s] = 1 + gu_below(gu_below(4) ? 600 : 6000);
        c.split_len = gu_below(2) ? 0 : 1 + gu_below(700);
        c.what = "random";
        run_case(&c);
    }
    bad_length_gives_nan();
    printf("# %d cases; worst relative error f32 %.3g, f16 %.3g, bf16 %.3g\n", cases_run, worst[0],
           worst[1], worst[2]);
    printf("RESULT attention_cases %d\n", cases_run);
    printf("RESULT attention_err_f32 %.3g\nRESULT attention_err_f16 %.3g\nRESULT attention_err_bf16 %.3g\n",
           worst[0], worst[1], worst[2]);
    return gpu_finish();
}
#endif
