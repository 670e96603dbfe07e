/*
 * stub.c — the CUDA-layer API in a build without the CUDA layer (meson option
 * cuda disabled or nvcc not found): every call fails with PKV_ENOTSUP.
 */
#include "internal.h"

#define NOT_BUILT() pkv_err(PKV_ENOTSUP, "pagedkv was built without the CUDA layer")

int pkv_cuda_probe(int device, char *why, size_t len) {
    (void)device;
    if (why && len) snprintf(why, len, "pagedkv was built without the CUDA layer");
    return NOT_BUILT();
}

int pkv_cuda_open(pkv_cache *cache, const pkv_cuda_options *opt, pkv_cuda **out) {
    (void)cache;
    (void)opt;
    if (out) *out = NULL;
    return NOT_BUILT();
}

void pkv_cuda_close(pkv_cuda *g) { (void)g; }

int pkv_cuda_get_stats(pkv_cuda *g, pkv_cuda_stats *out) {
    (void)g;
    if (out) memset(out, 0, sizeof *out);
    return NOT_BUILT();
}

int pkv_cuda_page_in(pkv_cuda *g, const uint64_t *ids, size_t n, uint32_t flags, void *stream,
                     pkv_cuda_batch **out) {
    (void)g, (void)ids, (void)n, (void)flags, (void)stream;
    if (out) *out = NULL;
    return NOT_BUILT();
}

int pkv_cuda_batch_get_info(const pkv_cuda_batch *b, pkv_cuda_batch_info *out) {
    (void)b;
    if (out) memset(out, 0, sizeof *out);
    return NOT_BUILT();
}

int pkv_cuda_writeback(pkv_cuda *g, pkv_cuda_batch *b, void *stream) {
    (void)g, (void)b, (void)stream;
    return NOT_BUILT();
}

int pkv_cuda_release(pkv_cuda *g, pkv_cuda_batch *b, void *stream) {
    (void)g, (void)b, (void)stream;
    return NOT_BUILT();
}

int pkv_cuda_attn(pkv_cuda *g, pkv_cuda_batch *b, const pkv_attn_params *params,
                  const float *q, float *out, void *stream) {
    (void)g, (void)b, (void)params, (void)q, (void)out, (void)stream;
    return NOT_BUILT();
}

int pkv_cuda_attn_workspace(const pkv_kv_view *view, const pkv_attn_params *params,
                            const pkv_cuda_seqs *seqs, size_t *work_bytes) {
    (void)view, (void)params, (void)seqs;
    if (work_bytes) *work_bytes = 0;
    return NOT_BUILT();
}

int pkv_cuda_attn_decode(const pkv_kv_view *view, const pkv_attn_params *params,
                         const pkv_cuda_seqs *seqs, const float *q, float *out, void *work,
                         size_t work_bytes, void *stream) {
    (void)view, (void)params, (void)seqs, (void)q, (void)out, (void)work, (void)work_bytes,
        (void)stream;
    return NOT_BUILT();
}
