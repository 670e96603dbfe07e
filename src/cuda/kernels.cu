/*
 * kernels.cu — device code of the CUDA layer: paged decode attention
 * (Flash-Decoding: the context is split across thread blocks, partial results are
 * combined by a second kernel), the block gather used for paging when
 * cudaMemcpyBatchAsync is not available, and the row packer of the write-back.
 *
 * Attention, fast variant (head_dim 64/128/256, 16-byte aligned rows). A thread
 * block (4 warps) handles one sequence, one kv head, HT of its query heads (GQA:
 * each K/V row is read once for all of them) and one split of the context.
 * LPT lanes share a token row, each owning 16 contiguous bytes (a "token group";
 * a warp covers 32 / LPT rows at a time). The split is walked in sub-chunks of
 * SUB tokens, each in two passes like the CPU reference:
 *   - the byte offset of every row of the sub-chunk is computed once per block
 *     (one division per token, block table lookups included) into shared memory;
 *   - rows stream through a per-lane ring in shared memory filled by cp.async
 *     (S stages of U rows per group in flight; a lane reads back only what it
 *     copied, so the ring needs no barrier); the V prologue is issued before the
 *     softmax barrier and the next K prologue before the end of the sub-chunk;
 *   - pass 1: partial dot products for the HT heads, then a reduce-scatter over
 *     the group's lanes (HT - 1 + log2(LPT / HT) shuffles per row, not
 *     HT * log2(LPT)); scores in the log2 domain (q pre-scaled by scale * log2 e);
 *   - per head: the sub-chunk maximum, p = exp2(s - m) and their sum; the running
 *     accumulator is rescaled once per sub-chunk (online softmax);
 *   - pass 2: acc += p * v.
 * Arithmetic is f32 throughout; K/V are converted from their storage type exactly.
 * On an H200 this reads K/V at about 90% of the device-to-device copy traffic
 * at 4 query heads per kv head, 53% at 8 (docs/cuda.md). For f16/bf16 K/V at
 * head_dim 64/128 with 2-8 query heads per kv head a tensor-core variant
 * (attn_mma, below) replaces it. A generic variant (any head_dim <= 1024, any
 * alignment, one head per block, scalar loads) covers the rest.
 *
 * Only the `len` rows of a sequence are read; a block id >= num_blocks in a
 * table, or a length of 0 or beyond max_len, makes that sequence's output NaN
 * instead of reading out of bounds.
 */
#include "cuda/kernels.h"

#include "cuda/attn_plan.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

namespace {

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int S_SUB = 512;  /* scores of one sub-chunk, per head, in shared memory */
constexpr unsigned FULL = 0xffffffffu;

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

struct F32 {
    static constexpr int SIZE = 4, VEC = 4;
    __device__ static __forceinline__ float one(const uint8_t *p) {
        return __ldg(reinterpret_cast<const float *>(p));
    }
    __device__ static __forceinline__ void cvt(const uint4 &v, float *o) {
        o[0] = __uint_as_float(v.x);
        o[1] = __uint_as_float(v.y);
        o[2] = __uint_as_float(v.z);
        o[3] = __uint_as_float(v.w);
    }
};

__device__ __forceinline__ float2 h2f(uint32_t w) {
    __half2 h;
    memcpy(&h, &w, 4);
    return __half22float2(h);
}

struct F16 {
    static constexpr int SIZE = 2, VEC = 8;
    __device__ static __forceinline__ float one(const uint8_t *p) {
        return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(p))));
    }
    __device__ static __forceinline__ void cvt(const uint4 &v, float *o) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = h2f(w[i]);
            o[2 * i] = f.x;
            o[2 * i + 1] = f.y;
        }
    }
};

struct BF16 {
    static constexpr int SIZE = 2, VEC = 8;
    __device__ static __forceinline__ float one(const uint8_t *p) {
        return __uint_as_float((uint32_t)__ldg(reinterpret_cast<const unsigned short *>(p)) << 16);
    }
    __device__ static __forceinline__ void cvt(const uint4 &v, float *o) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[2 * i] = __uint_as_float(w[i] << 16);
            o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

/* Output rows [h0, h0 + nh) of `seq` := NaN (bad length). */
__device__ void poison(const pkv_cuk_attn &a, uint32_t seq, uint32_t h0, int nh) {
    const size_t first = ((size_t)seq * a.num_q_heads + h0) * a.head_dim;
    for (size_t i = threadIdx.x; i < (size_t)nh * a.head_dim; i += blockDim.x) a.out[first + i] = NAN;
}

/* What a thread block of the attention grid (attn_plan.h) covers: sequence,
 * split, kv head, its HT-head tile (query heads h0 .. h0 + nh - 1) and the
 * split's tokens [t0, t1) of nsp splits. False when it has nothing to do: the
 * sequence's length is invalid (split 0 then writes NaN rows) or the split
 * starts past the sequence's end. */
struct Span {
    uint32_t seq, sp, kvh, h0, t0, t1, nsp;
    int nh;
};
template <int HT>
__device__ __forceinline__ bool block_span(const pkv_cuk_attn &a, Span *s) {
    s->seq = blockIdx.x / a.n_splits;
    s->sp = blockIdx.x % a.n_splits;
    s->kvh = blockIdx.y / a.tiles;
    const uint32_t tile = blockIdx.y % a.tiles;
    s->h0 = s->kvh * a.g + tile * HT;
    s->nh = min(HT, (int)(a.g - tile * HT));
    const uint32_t len = a.lens[s->seq];
    if (len == 0 || len > a.max_len) {
        if (s->sp == 0) poison(a, s->seq, s->h0, s->nh);
        return false;
    }
    s->t0 = s->sp * a.split_len;
    if (s->t0 >= len) return false;
    s->t1 = min(len, s->t0 + a.split_len);
    s->nsp = (len + a.split_len - 1) / a.split_len;
    return true;
}

/* Per head: the sub-chunk's scores sc[h][0..n) become p = exp2(s - m_new); the
 * running max, sum and the accumulator rescale factor are updated. */
template <int HT, int SUB, int W>
__device__ __forceinline__ void softmax_step(float (*sc)[SUB], int n, int nh, float *m_run,
                                             float *l_run, float *fac) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int h = warp; h < nh; h += W) {
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sc[h][j]);
        mx = warp_max(mx);
        const float mo = m_run[h], mn = fmaxf(mo, mx);
        float sum = 0.f;
        for (int j = lane; j < n; j += 32) {
            const float p = exp2f(sc[h][j] - mn);
            sc[h][j] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            const float f = mo == -INFINITY ? 0.f : exp2f(mo - mn);
            fac[h] = f;
            l_run[h] = l_run[h] * f + sum;
            m_run[h] = mn;
        }
    }
}

/* Final value v (sum over the block) of (row, d): normalized output when the
 * sequence has one split, else a partial result in the workspace. */
__device__ __forceinline__ void emit(const pkv_cuk_attn &a, size_t row, uint32_t sp, uint32_t nsp,
                                     int d, float v, float m, float l) {
    const uint32_t D = a.head_dim;
    if (nsp == 1) {
        a.out[row * D + d] = v / l;
    } else {
        const size_t pr = row * a.n_splits + sp;
        a.ws[pr * D + d] = v;
        if (d == 0) {
            a.ws[a.ws_acc_floats + 2 * pr] = m;
            a.ws[a.ws_acc_floats + 2 * pr + 1] = l;
        }
    }
}

/* Configuration of the fast kernel: W warps, U rows per token group per
 * pipeline stage, S stages of cp.async copies in flight (a per-lane ring in
 * shared memory: each lane reads back only the 16-byte chunks it copied, so the
 * ring needs no barrier), SUB tokens per sub-chunk. */
template <int W_, int U_, int S_, int SUB_>
struct Cfg {
    static constexpr int W = W_, U = U_, S = S_, SUB = SUB_;
};

/* Sum v[0..HT) over the LPT lanes of a token group, reduce-scatter style: at each
 * of the first log2(HT) levels a lane keeps half of its heads and trades the
 * other half with its partner (HT-1 shuffles in all, not HT per level); the
 * remaining levels are plain butterflies. On return v[0] is the full sum of head
 * *head. */
template <int M, int O, int HT>
struct GroupReduce {
    __device__ static __forceinline__ void run(float (&v)[HT], int li, int &hsel) {
        if constexpr (O >= 1) {
            if constexpr (M > 1) {
                const bool up = (li & O) != 0;
#pragma unroll
                for (int i = 0; i < M / 2; i++) {
                    const float send = up ? v[i] : v[i + M / 2];
                    const float keep = up ? v[i + M / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(FULL, send, O);
                }
                if (up) hsel += M / 2;
                GroupReduce<M / 2, O / 2, HT>::run(v, li, hsel);
            } else {
                v[0] += __shfl_xor_sync(FULL, v[0], O);
                GroupReduce<1, O / 2, HT>::run(v, li, hsel);
            }
        }
    }
};

template <int HT, int LPT>
__device__ __forceinline__ void group_reduce(float (&v)[HT], int li, int *head) {
    int hsel = 0;
    GroupReduce<HT, LPT / 2, HT>::run(v, li, hsel);
    *head = hsel;
}

template <typename T, int D, int HT, typename C>
__global__ void __launch_bounds__(C::W * 32) attn_fast(const pkv_cuk_attn a) {
    constexpr int W = C::W, U = C::U, S = C::S, SUB = C::SUB, NT = W * 32;
    constexpr int VEC = T::VEC;
    constexpr int LPT = (D / VEC) < 32 ? (D / VEC) : 32; /* lanes per token row */
    constexpr int CH = D / (LPT * VEC);                  /* 16-byte chunks per lane */
    constexpr int TPW = 32 / LPT;                        /* tokens per warp step */
    constexpr int NG = W * TPW;                          /* token groups per block */
    constexpr int E = CH * VEC;                          /* elements per lane */
    constexpr int STEP = NG * U;                         /* tokens per pipeline stage */
    constexpr int RING = S * U * NT * CH * 16;           /* bytes */
    constexpr int SCB = HT * SUB * 4, ROFF = 2 * SUB * 8;
    constexpr int RED = W * HT * D * 4;                  /* aliases everything at the end */
    constexpr int TOTAL = (RING + SCB + ROFF) > RED ? (RING + SCB + ROFF) : RED;
    static_assert(HT <= LPT, "a token group must have a lane per head");
    __shared__ __align__(16) unsigned char smem[TOTAL];
    __shared__ float m_run[HT], l_run[HT], fac[HT];
    uint4 *ring = reinterpret_cast<uint4 *>(smem);
    float(*sc)[SUB] = reinterpret_cast<float(*)[SUB]>(smem + RING);
    long long(*roff)[SUB] = reinterpret_cast<long long(*)[SUB]>(smem + RING + SCB);

    Span span;
    if (!block_span<HT>(a, &span)) return;
    const uint32_t seq = span.seq, sp = span.sp, kvh = span.kvh, h0 = span.h0;
    const uint32_t t0 = span.t0, t1 = span.t1, nsp = span.nsp;
    const int nh = span.nh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = warp * TPW + lane / LPT, li = lane % LPT;

    float q[HT][E], acc[HT][E];
#pragma unroll
    for (int h = 0; h < HT; h++)
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int d = (c * LPT + li) * VEC + e;
                q[h][c * VEC + e] =
                    h < nh ? a.q[((size_t)seq * a.num_q_heads + h0 + h) * D + d] * a.scale_log2 : 0.f;
                acc[h][c * VEC + e] = 0.f;
            }
    if (tid < HT) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.f;
    }
    const uint8_t *kb = static_cast<const uint8_t *>(a.base) + a.layer_off + (size_t)kvh * a.head_stride +
                        (size_t)li * VEC * T::SIZE;
    const uint8_t *vb = kb + a.kind_stride;
    const uint32_t *tab = a.tables + (size_t)seq * a.table_stride;

    /* Byte offsets of the rows of the sub-chunk at u0 (-1: block id out of range),
     * one division per token for the whole block. */
    auto offsets = [&](int buf, uint32_t u0, int n) {
        for (int j = tid; j < n; j += NT) {
            const uint32_t t = u0 + j, bi = t / a.block_size;
            const uint32_t blk = tab[bi];
            roff[buf][j] = blk < a.num_blocks
                               ? (long long)((size_t)blk * a.block_stride +
                                             (size_t)(t - bi * a.block_size) * a.token_stride)
                               : -1ll;
        }
    };
    /* Issue pipeline stage st of the K (base kb) or V (vb) rows; always commit. */
    auto issue = [&](const uint8_t *base, int buf, int n, int st) {
        const int rb = st % S;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = st * STEP + u * NG + grp;
            if (j < n) {
                const long long off = roff[buf][j];
                if (off >= 0) {
#pragma unroll
                    for (int c = 0; c < CH; c++)
                        __pipeline_memcpy_async(&ring[((rb * U + u) * NT + tid) * CH + c],
                                                base + off + (size_t)c * LPT * VEC * T::SIZE, 16);
                }
            }
        }
        __pipeline_commit();
    };
    auto prologue = [&](const uint8_t *base, int buf, int n) {
        const int nit = (n + STEP - 1) / STEP;
#pragma unroll
        for (int st = 0; st < S - 1; st++) {
            if (st < nit) issue(base, buf, n, st);
            else __pipeline_commit();
        }
    };

    int cur = 0;
    offsets(cur, t0, (int)min((uint32_t)SUB, t1 - t0));
    __syncthreads();
    prologue(kb, cur, (int)min((uint32_t)SUB, t1 - t0));
    for (uint32_t u0 = t0; u0 < t1; u0 += SUB, cur ^= 1) {
        const int n = (int)min((uint32_t)SUB, t1 - u0);
        const int nit = (n + STEP - 1) / STEP;
        /* Pass 1: scores. Loop bounds are uniform over the block (shuffles). */
        for (int it = 0; it < nit; it++) {
            if (it + S - 1 < nit) issue(kb, cur, n, it + S - 1);
            else __pipeline_commit();
            __pipeline_wait_prior(S - 1);
            const int rb = it % S;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = it * STEP + u * NG + grp;
                float k[E];
#pragma unroll
                for (int c = 0; c < CH; c++) T::cvt(ring[((rb * U + u) * NT + tid) * CH + c], k + c * VEC);
                float sv[HT];
#pragma unroll
                for (int h = 0; h < HT; h++) {
                    float s = 0.f;
#pragma unroll
                    for (int e = 0; e < E; e++) s = fmaf(q[h][e], k[e], s);
                    sv[h] = s;
                }
                int hs;
                group_reduce<HT, LPT>(sv, li, &hs);
                if (j < n && (li & (LPT / HT - 1)) == 0 && hs < nh)
                    sc[hs][j] = roff[cur][j] >= 0 ? sv[0] : NAN;
            }
        }
        prologue(vb, cur, n); /* V rows fly while the softmax runs */
        if (u0 + SUB < t1) offsets(cur ^ 1, u0 + SUB, (int)min((uint32_t)SUB, t1 - u0 - SUB));
        __syncthreads();
        softmax_step<HT, SUB, W>(sc, n, nh, m_run, l_run, fac);
        __syncthreads();
#pragma unroll
        for (int h = 0; h < HT; h++) {
            const float f = h < nh ? fac[h] : 0.f;
#pragma unroll
            for (int e = 0; e < E; e++) acc[h][e] *= f;
        }
        /* Pass 2: acc += p * v (a row out of range has p = NaN). */
        for (int it = 0; it < nit; it++) {
            if (it + S - 1 < nit) issue(vb, cur, n, it + S - 1);
            else __pipeline_commit();
            __pipeline_wait_prior(S - 1);
            const int rb = it % S;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = it * STEP + u * NG + grp;
                if (j >= n) continue;
                float v[E];
#pragma unroll
                for (int c = 0; c < CH; c++) T::cvt(ring[((rb * U + u) * NT + tid) * CH + c], v + c * VEC);
#pragma unroll
                for (int h = 0; h < HT; h++) {
                    if (h >= nh) break;
                    const float p = sc[h][j];
#pragma unroll
                    for (int e = 0; e < E; e++) acc[h][e] = fmaf(p, v[e], acc[h][e]);
                }
            }
        }
        if (u0 + SUB < t1) prologue(kb, cur ^ 1, (int)min((uint32_t)SUB, t1 - u0 - SUB));
        __syncthreads();
    }
    __pipeline_wait_prior(0);

    /* Sum the token groups of a warp, then the warps. */
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < HT; h++)
#pragma unroll
            for (int e = 0; e < E; e++) acc[h][e] += __shfl_xor_sync(FULL, acc[h][e], o);
    __syncthreads();
    float(*red)[HT][D] = reinterpret_cast<float(*)[HT][D]>(smem);
    if (lane < LPT)
#pragma unroll
        for (int h = 0; h < HT; h++)
#pragma unroll
            for (int c = 0; c < CH; c++)
#pragma unroll
                for (int e = 0; e < VEC; e++) red[warp][h][(c * LPT + li) * VEC + e] = acc[h][c * VEC + e];
    __syncthreads();
    for (int i = tid; i < nh * D; i += NT) {
        const int h = i / D, d = i % D;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) v += red[w][h][d];
        emit(a, (size_t)seq * a.num_q_heads + h0 + h, sp, nsp, d, v, m_run[h], l_run[h]);
    }
}

/* ---- Tensor-core variant: 2 to 8 query heads per kv head (GQA) -------------
 *
 * With several query heads per kv head the CUDA-core kernel above issues 2 HT
 * FMAs per K/V element; at 8 heads it runs out of issue slots (53% of the copy
 * bandwidth on an H200). This variant (f16/bf16 K/V, head_dim 64/128, 16-byte
 * aligned rows, up to 8 query heads per thread block) does the two products
 * with mma.sync m16n8k16 and f32 accumulators. A's rows 0-7 are the high halves
 * and rows 8-15 the low halves of the block's query heads (see below); heads a
 * block lacks (g < 8) are zero rows.
 *   S = Q K^T: B = 8 token rows of K, read as 16-byte words; the head_dim
 *     elements are assigned to the k slots in a permuted order (a dot product
 *     does not care), the same for Q, so that one 16-byte word of a K row feeds
 *     two k steps without a transpose;
 *   O += P V: A = P straight from the S accumulators (the m16n8 accumulator
 *     layout is the A layout), B = V via ldmatrix.trans.
 * Exactness: Q (in f32) and P are each split into a high and a low half of the
 * storage type (x = hi + lo, both f16 or both bf16); one mma multiplies both
 * halves (rows 0-7 and 8-15) and the two result rows are added, so the products
 * carry ~22 (f16) / ~16 (bf16) bits of Q and P; K and V are exact in their
 * storage type. Q is first scaled per head by a power of two into [-1, 1] (f16
 * range), and the scores scaled back. Accumulation is f32.
 *
 * Each warp walks its own 16-token tiles of the split (warp w: tiles w, w + 4,
 * ...) with its own online softmax and its own cp.async ring of MMA_STAGES
 * tiles (K rows padded to 2D + 64 bytes, V rows to 2D + 16, so that neither
 * the 16-byte K reads nor ldmatrix conflict on banks). A copy instruction moves
 * whole rows (2 at head_dim 128), whose offsets the 16 row-owning lanes compute
 * from block ids read one tile ahead; rows past the split's end or with a block
 * id out of range are zero-filled, their scores -inf or NaN. The warps' (max,
 * sum, accumulator) are merged through shared memory at the end. On an H200
 * this reads K/V at 92-100% of the device-to-device copy traffic at 4k-128k
 * context, GQA 4:1 and 8:1 (docs/cuda.md). PKV_CUDA_ATTN_NO_MMA=1 in the
 * environment selects the CUDA-core kernel instead (tests, comparisons). */
template <typename H2>
__device__ __forceinline__ uint32_t bits32(H2 h) {
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}
/* c += a b on one m16n8k16 tile; TYPE is the PTX name of the input type. */
#define PKV_MMA_16816(TYPE, c, a, b0, b1)                                                          \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, "    \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                        \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

/* Per storage type: two floats rounded into one 32-bit register (the lower
 * index in the low half), a float rounded to the type, and the mma. */
template <typename T> struct Mma;
template <> struct Mma<F16> {
    __device__ static __forceinline__ uint32_t pack(float a, float b) { return bits32(__floats2half2_rn(a, b)); }
    __device__ static __forceinline__ float round(float x) { return __half2float(__float2half_rn(x)); }
    __device__ static __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        PKV_MMA_16816("f16", c, a, b0, b1);
    }
};
template <> struct Mma<BF16> {
    __device__ static __forceinline__ uint32_t pack(float a, float b) { return bits32(__floats2bfloat162_rn(a, b)); }
    __device__ static __forceinline__ float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
    __device__ static __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        PKV_MMA_16816("bf16", c, a, b0, b1);
    }
};

template <int D, int S_>
struct MmaCfg {
    static constexpr int W = 4, STAGES = S_, TILE = 16;
    static constexpr int SK = 2 * D + 64, SV = 2 * D + 16;       /* padded row bytes */
    static constexpr int STAGE_BYTES = TILE * (SK + SV);
    static constexpr int WARP_BYTES = STAGES * STAGE_BYTES;
    static constexpr int RED_BYTES = W * 8 * D * 4;
    static constexpr int SMEM = W * WARP_BYTES > RED_BYTES ? W * WARP_BYTES : RED_BYTES;
    static constexpr int STATIC_SMEM = W * 8 * 2 * 4 + W * STAGES * 4; /* m_w, l_w, bad_w */
};

template <typename T, int D, int S>
__global__ void __launch_bounds__(MmaCfg<D, S>::W * 32) attn_mma(const pkv_cuk_attn a) {
    using C = MmaCfg<D, S>;
    using M = Mma<T>;
    constexpr int W = C::W, NT = W * 32, KS = D / 16, NV = D / 8;
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ float m_w[W][8], l_w[W][8];
    __shared__ uint32_t bad_w[W][S]; /* per stage: bit r = row r has a bad block id */

    Span span;
    if (!block_span<8>(a, &span)) return;
    const uint32_t seq = span.seq, sp = span.sp, kvh = span.kvh, h0 = span.h0;
    const uint32_t t0 = span.t0, t1 = span.t1, nsp = span.nsp;
    const int nh = span.nh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3; /* mma fragment coordinates */

    /* Q fragments (head g), scaled per head by a power of two into [-1, 1]. */
    float qv[D / 4];
    float qmax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 32; j++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int d = 32 * j + tig * 8 + e;
            const float x = g < nh ? a.q[((size_t)seq * a.num_q_heads + h0 + g) * D + d] * a.scale_log2 : 0.f;
            qv[8 * j + e] = x;
            qmax = fmaxf(qmax, fabsf(x));
        }
    qmax = fmaxf(qmax, __shfl_xor_sync(FULL, qmax, 1));
    qmax = fmaxf(qmax, __shfl_xor_sync(FULL, qmax, 2));
    int qexp = 0;
    if (qmax > 0.f && qmax <= 3.0e38f) frexpf(qmax, &qexp);
    const float qscale = ldexpf(1.f, -qexp), sback = ldexpf(1.f, qexp);
    /* A fragments of Q: rows 0-7 the high halves of the 8 heads, rows 8-15 the
     * low halves (so one mma gives both products; S = rows g + rows g + 8). */
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* k step ks = 2j + hh: slots 2 tig + {0,1} <- dims 32j + 8 tig + 4hh + {0,1},
             * slots 2 tig + 8 + {0,1} <- dims ... + 2 + {0,1} (r = 0, 1). */
            const int base = 8 * (ks / 2) + 4 * (ks % 2) + 2 * r;
            const float x = qv[base] * qscale, y = qv[base + 1] * qscale;
            qa[ks][2 * r] = M::pack(x, y);
            qa[ks][2 * r + 1] = M::pack(x - M::round(x), y - M::round(y));
        }

    const uint8_t *kb = static_cast<const uint8_t *>(a.base) + a.layer_off + (size_t)kvh * a.head_stride;
    const uint8_t *vb = kb + a.kind_stride;
    const uint32_t *tab = a.tables + (size_t)seq * a.table_stride;
    unsigned char *wk = dsm + warp * C::WARP_BYTES;            /* [STAGES][TILE][SK] */
    unsigned char *wv = wk + C::STAGES * C::TILE * C::SK;      /* [STAGES][TILE][SV] */
    const uint32_t ntiles = (t1 - t0 + C::TILE - 1) / C::TILE;

    /* Lane l looks after row l % 16 of a tile: its block id is read one tile
     * ahead of the copy, so that the table load's latency is hidden
     * (UINT32_MAX: past the split's end), and its byte offset is computed at
     * the copy and handed to the lanes that copy the row (-1: zero-fill). */
    const int r = lane & 15;
    auto lookup = [&](uint32_t tl) -> uint32_t {
        if (tl >= ntiles || (uint32_t)r >= t1 - t0 - tl * C::TILE) return UINT32_MAX; /* no wrap-around */
        return __ldg(tab + (t0 + tl * C::TILE + r) / a.block_size);
    };
    /* Copy tile tl into stage st: each instruction moves RPI whole rows (CPR
     * 16-byte chunks each), so a warp's request touches few cache lines. Notes
     * the rows with a block id out of range in bad_w. */
    constexpr int CPR = D / 8, RPI = 32 / CPR;
    auto issue = [&](uint32_t tl, uint32_t blk, int st) {
        const uint32_t t = t0 + tl * C::TILE + r;
        const bool past = (uint32_t)r >= t1 - t0 - tl * C::TILE;
        const bool bad = !past && blk >= a.num_blocks;
        const long long off = past || bad ? -1ll
                                          : (long long)((size_t)blk * a.block_stride +
                                                        (size_t)(t % a.block_size) * a.token_stride);
        const int chunk = lane % CPR, sub = lane / CPR;
#pragma unroll
        for (int i = 0; i < C::TILE / RPI; i++) {
            const int row = i * RPI + sub;
            const long long ro = __shfl_sync(FULL, off, row);
            const size_t src = ro < 0 ? 0 : (size_t)ro + chunk * 16;
            __pipeline_memcpy_async(wk + (st * C::TILE + row) * C::SK + chunk * 16, kb + src, 16, ro < 0 ? 16 : 0);
            __pipeline_memcpy_async(wv + (st * C::TILE + row) * C::SV + chunk * 16, vb + src, 16, ro < 0 ? 16 : 0);
        }
        __pipeline_commit();
        const uint32_t bm = __ballot_sync(FULL, bad && lane < 16); /* bit r: row r */
        if (lane == 0) bad_w[warp][st] = bm;
    };

    float o[NV][4];
#pragma unroll
    for (int i = 0; i < NV; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;
    /* ldmatrix.x4.trans row address of this lane within a V stage (matrix
     * lane / 8: tokens 0-7 or 8-15, dims +0 or +8). */
    const int vm = lane >> 3, vr = lane & 7;
    const int v_lane_off = ((vm & 1) * 8 + vr) * C::SV + (vm >> 1) * 16;

#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        const uint32_t tl = (uint32_t)(warp + i * W);
        if (tl < ntiles) issue(tl, lookup(tl), i);
        else __pipeline_commit();
    }
    uint32_t blk_next = lookup((uint32_t)(warp + (S - 1) * W));
    int st = 0, sn = S - 1; /* stage computed now, stage filled now */
    for (uint32_t tl = (uint32_t)warp; tl < ntiles; tl += W) {
        const uint32_t tn = tl + (S - 1) * W;
        if (tn < ntiles) {
            issue(tn, blk_next, sn);
            blk_next = lookup(tn + W);
        } else {
            __pipeline_commit();
        }
        __pipeline_wait_prior(S - 1);
        __syncwarp();
        const uint32_t bad_cur = bad_w[warp][st];

        /* S = Q K^T for tokens 0-7 (s[0]) and 8-15 (s[1]) of the tile. */
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            const unsigned char *row = wk + (st * C::TILE + nt * 8 + g) * C::SK + tig * 16;
#pragma unroll
            for (int j = 0; j < D / 32; j++) {
                const uint4 kw = *reinterpret_cast<const uint4 *>(row + 64 * j);
                M::mma(s[nt], qa[2 * j], kw.x, kw.y);
                M::mma(s[nt], qa[2 * j + 1], kw.z, kw.w);
            }
        }
        /* Scores of head g, tokens 2 tig + {0, 1} and 8 + 2 tig + {0, 1}. */
        const uint32_t rem = t1 - t0 - tl * C::TILE; /* rows of the tile in the split */
        float p[4];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = (i >> 1) * 8 + tig * 2 + (i & 1);
            float x = (s[i >> 1][i & 1] + s[i >> 1][(i & 1) + 2]) * sback;
            if ((uint32_t)tok >= rem) x = -INFINITY;
            else if ((bad_cur >> tok) & 1u) x = NAN;
            p[i] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
        const float mn = fmaxf(m_run, mx);
        const float f = m_run == -INFINITY ? 0.f : exp2f(m_run - mn);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p[i] = exp2f(p[i] - mn);
            sum += p[i];
        }
        sum += __shfl_xor_sync(FULL, sum, 1);
        sum += __shfl_xor_sync(FULL, sum, 2);
        l_run = l_run * f + sum;
        m_run = mn;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            o[i][0] *= f;
            o[i][1] *= f;
            o[i][2] *= f;
            o[i][3] *= f;
        }
        /* O += P V: rows 0-7 of A are the high halves of P, rows 8-15 the low
         * halves; the output rows g and g + 8 are summed at the end. */
        const uint32_t pa[4] = {M::pack(p[0], p[1]), M::pack(p[0] - M::round(p[0]), p[1] - M::round(p[1])),
                                M::pack(p[2], p[3]), M::pack(p[2] - M::round(p[2]), p[3] - M::round(p[3]))};
        const uint32_t vaddr =
            (uint32_t)__cvta_generic_to_shared(wv + st * C::TILE * C::SV + v_lane_off);
#pragma unroll
        for (int qd = 0; qd < D / 16; qd++) {
            uint32_t r0, r1, r2, r3;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                         : "r"(vaddr + qd * 32));
            M::mma(o[2 * qd], pa, r0, r1);
            M::mma(o[2 * qd + 1], pa, r2, r3);
        }
        st = st + 1 == S ? 0 : st + 1;
        sn = sn + 1 == S ? 0 : sn + 1;
        __syncwarp(); /* every lane is done with stage st before it is refilled */
    }
    __pipeline_wait_prior(0);
    __syncthreads(); /* the rings are reused for the merge below */

    if (tig == 0) {
        m_w[warp][g] = m_run;
        l_w[warp][g] = l_run;
    }
    __syncthreads();
    float mg = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; w++) mg = fmaxf(mg, m_w[w][g]);
    const float fw = m_run == -INFINITY ? 0.f : exp2f(m_run - mg);
    float *red = reinterpret_cast<float *>(dsm); /* [W][8][D] */
#pragma unroll
    for (int i = 0; i < NV; i++) {
        red[(warp * 8 + g) * D + i * 8 + tig * 2] = (o[i][0] + o[i][2]) * fw;
        red[(warp * 8 + g) * D + i * 8 + tig * 2 + 1] = (o[i][1] + o[i][3]) * fw;
    }
    __syncthreads();
    for (int i = tid; i < nh * D; i += NT) {
        const int h = i / D, d = i % D;
        float mh = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) mh = fmaxf(mh, m_w[w][h]);
        float l = 0.f, v = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float fh = m_w[w][h] == -INFINITY ? 0.f : exp2f(m_w[w][h] - mh);
            l += l_w[w][h] * fh;
            v += red[(w * 8 + h) * D + d];
        }
        emit(a, (size_t)seq * a.num_q_heads + h0 + h, sp, nsp, d, v, mh, l);
    }
}

/* Any head_dim <= PKV_ATTN_GENERIC_MAX_D, any alignment: one query head per block,
 * one warp per token, lanes over head_dim, scalar loads; q and the per-warp
 * accumulators in shared memory. Correct rather than fast. */
template <typename T>
__global__ void __launch_bounds__(THREADS) attn_generic(const pkv_cuk_attn a) {
    extern __shared__ float dyn[];
    const uint32_t D = a.head_dim;
    float *qs = dyn;                 /* [D] */
    float *accs = qs + D;            /* [WARPS][D] */
    float *scs = accs + WARPS * D;   /* [S_SUB] */
    __shared__ float m_run[1], l_run[1], fac[1];
    Span span;
    if (!block_span<1>(a, &span)) return;
    const uint32_t seq = span.seq, sp = span.sp, kvh = span.kvh, h = span.h0;
    const uint32_t t0 = span.t0, t1 = span.t1, nsp = span.nsp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t row = (size_t)seq * a.num_q_heads + h;
    for (uint32_t d = threadIdx.x; d < D; d += THREADS) qs[d] = a.q[row * D + d] * a.scale_log2;
    for (uint32_t i = threadIdx.x; i < WARPS * D; i += THREADS) accs[i] = 0.f;
    if (threadIdx.x == 0) {
        m_run[0] = -INFINITY;
        l_run[0] = 0.f;
    }
    __syncthreads();
    const uint8_t *kb = static_cast<const uint8_t *>(a.base) + a.layer_off + (size_t)kvh * a.head_stride;
    const uint8_t *vb = kb + a.kind_stride;
    const uint32_t *tab = a.tables + (size_t)seq * a.table_stride;
    const uint32_t bs = a.block_size;
    float *acc = accs + warp * D;
    float(*sc)[S_SUB] = reinterpret_cast<float(*)[S_SUB]>(scs);
    for (uint32_t u0 = t0; u0 < t1; u0 += S_SUB) {
        const int n = (int)min((uint32_t)S_SUB, t1 - u0);
        for (int j = warp; j < n; j += WARPS) {
            const uint32_t t = u0 + j;
            const uint32_t blk = tab[t / bs];
            float s = 0.f;
            if (blk < a.num_blocks) {
                const uint8_t *r = kb + (size_t)blk * a.block_stride + (size_t)(t % bs) * a.token_stride;
                for (uint32_t d = lane; d < D; d += 32) s = fmaf(qs[d], T::one(r + (size_t)d * T::SIZE), s);
            }
            s = warp_sum(s);
            if (lane == 0) sc[0][j] = blk < a.num_blocks ? s : NAN;
        }
        __syncthreads();
        softmax_step<1, S_SUB, WARPS>(sc, n, 1, m_run, l_run, fac);
        __syncthreads();
        const float f = fac[0];
        for (uint32_t d = lane; d < D; d += 32) acc[d] *= f;
        for (int j = warp; j < n; j += WARPS) {
            const uint32_t t = u0 + j;
            const uint32_t blk = tab[t / bs];
            if (blk >= a.num_blocks) continue;
            const uint8_t *r = vb + (size_t)blk * a.block_stride + (size_t)(t % bs) * a.token_stride;
            const float p = sc[0][j];
            for (uint32_t d = lane; d < D; d += 32) acc[d] = fmaf(p, T::one(r + (size_t)d * T::SIZE), acc[d]);
        }
        __syncthreads();
    }
    for (uint32_t d = threadIdx.x; d < D; d += THREADS) {
        float v = 0.f;
        for (int w = 0; w < WARPS; w++) v += accs[w * D + d];
        emit(a, row, sp, nsp, (int)d, v, m_run[0], l_run[0]);
    }
}

/* Combine the splits of one (sequence, query head) row. */
__global__ void __launch_bounds__(THREADS) attn_combine(const pkv_cuk_attn a) {
    const size_t row = blockIdx.x;
    const uint32_t seq = (uint32_t)(row / a.num_q_heads);
    const uint32_t len = a.lens[seq];
    if (len == 0 || len > a.max_len) return;
    const uint32_t nsp = (len + a.split_len - 1) / a.split_len;
    if (nsp <= 1) return;
    const float *ml = a.ws + a.ws_acc_floats + row * a.n_splits * 2;
    float m = -INFINITY;
    for (uint32_t i = 0; i < nsp; i++) m = fmaxf(m, ml[2 * i]);
    float l = 0.f;
    for (uint32_t i = 0; i < nsp; i++) l += ml[2 * i + 1] * exp2f(ml[2 * i] - m);
    const uint32_t D = a.head_dim;
    const float *acc = a.ws + row * a.n_splits * D;
    for (uint32_t d = threadIdx.x; d < D; d += THREADS) {
        float v = 0.f;
        for (uint32_t i = 0; i < nsp; i++) v = fmaf(acc[(size_t)i * D + d], exp2f(ml[2 * i] - m), v);
        a.out[row * D + d] = v / l;
    }
}

/* Launch, or with occ != NULL only report how many blocks of it an SM holds. */
static thread_local int *g_occ; /* set by pkv_cuk_attn_blocks_per_sm around a dry dispatch */

template <typename T, int D, int HT, typename C>
cudaError_t launch_cfg(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    if (g_occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(g_occ, attn_fast<T, D, HT, C>, C::W * 32, 0);
    attn_fast<T, D, HT, C><<<grid, C::W * 32, 0, st>>>(a);
    return cudaGetLastError();
}

/* One configuration per (type, head_dim, HT): 4 warps, a 24 KiB ring (3 stages
 * of 4 rows per token group; 2 rows for 32-byte lanes), 512-token sub-chunks
 * (256 at HT 8): the configuration that measured fastest on an H200 (docs/cuda.md
 * has the comparison). */
template <typename T, int D, int HT>
cudaError_t launch_fast_h(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    constexpr int CH = D * T::SIZE / 16 > 32 ? D * T::SIZE / 16 / 32 : 1;
    constexpr int SUB = HT == 8 ? 256 : 512;
    return launch_cfg<T, D, HT, Cfg<4, 4 / CH, 3, SUB>>(a, grid, st);
}

/* The tensor-core kernel (f16/bf16, head_dim 64/128, 2-8 query heads per kv
 * head). Four stages per warp measured best on an H200 (docs/cuda.md). Its shared memory (148 KiB at head_dim 128) is above
 * the 48 KiB default, so the limit is raised before every launch or occupancy
 * query (cheap, and needs no once-only state). */
constexpr int MMA_STAGES = 4;
template <typename T, int D>
cudaError_t launch_mma(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    using C = MmaCfg<D, MMA_STAGES>;
    cudaError_t e = cudaFuncSetAttribute(attn_mma<T, D, MMA_STAGES>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    if (g_occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(g_occ, attn_mma<T, D, MMA_STAGES>, C::W * 32, C::SMEM);
    attn_mma<T, D, MMA_STAGES><<<grid, C::W * 32, C::SMEM, st>>>(a);
    return cudaGetLastError();
}

template <typename T> struct HasMma { static constexpr bool value = false; };
template <> struct HasMma<F16> { static constexpr bool value = true; };
template <> struct HasMma<BF16> { static constexpr bool value = true; };

/* Whether the tensor-core kernel runs: not with PKV_CUDA_ATTN_NO_MMA set (a
 * test and comparison switch), and not on a device whose shared memory per
 * block cannot hold its rings (Hopper has 227 KiB; the PTX fallback may run
 * on smaller parts). The CUDA-core kernel computes the same result. */
template <int D>
static bool use_mma() {
    const char *e = getenv("PKV_CUDA_ATTN_NO_MMA");
    if (e && *e && *e != '0') return false;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return false;
    return optin >= MmaCfg<D, MMA_STAGES>::SMEM + MmaCfg<D, MMA_STAGES>::STATIC_SMEM;
}

template <typename T, int D>
cudaError_t launch_fast_d(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    switch (a.ht) {
    case 1: return launch_fast_h<T, D, 1>(a, grid, st);
    case 4:
        if constexpr (HasMma<T>::value && (D == 64 || D == 128))
            if (use_mma<D>()) return launch_mma<T, D>(a, grid, st);
        return launch_fast_h<T, D, 4>(a, grid, st);
    case 8:
        if constexpr (HasMma<T>::value && (D == 64 || D == 128))
            if (use_mma<D>()) return launch_mma<T, D>(a, grid, st);
        return launch_fast_h<T, D, 8>(a, grid, st);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t launch_fast(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    switch (a.head_dim) {
    case 64: return launch_fast_d<T, 64>(a, grid, st);
    case 128: return launch_fast_d<T, 128>(a, grid, st);
    case 256: return launch_fast_d<T, 256>(a, grid, st);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t launch_generic(const pkv_cuk_attn &a, dim3 grid, cudaStream_t st) {
    const size_t smem = ((size_t)a.head_dim * (1 + WARPS) + S_SUB) * sizeof(float);
    if (g_occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(g_occ, attn_generic<T>, THREADS, smem);
    attn_generic<T><<<grid, THREADS, smem, st>>>(a);
    return cudaGetLastError();
}

constexpr uint64_t PIECE = 64u << 10; /* bytes of a block one gather thread block copies */

__global__ void __launch_bounds__(256) gather(const pkv_cuk_copy *descs, uint64_t bytes, uint32_t pieces) {
    const pkv_cuk_copy dsc = descs[blockIdx.x / pieces];
    const uint64_t off = (uint64_t)(blockIdx.x % pieces) * PIECE;
    const uint64_t end = off + PIECE < bytes ? off + PIECE : bytes;
    const uint8_t *__restrict__ s = static_cast<const uint8_t *>(dsc.src);
    uint8_t *__restrict__ t = static_cast<uint8_t *>(dsc.dst);
    uint64_t i = off;
    if ((((uintptr_t)s | (uintptr_t)t) & 15) == 0) {
        const uint64_t vend = off + ((end - off) & ~(uint64_t)15);
        constexpr int U = 4;
        uint64_t v = off + (uint64_t)threadIdx.x * 16;
        for (; v + (uint64_t)(U - 1) * blockDim.x * 16 < vend; v += (uint64_t)U * blockDim.x * 16) {
            uint4 x[U];
#pragma unroll
            for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4 *>(s + v + (uint64_t)u * blockDim.x * 16);
#pragma unroll
            for (int u = 0; u < U; u++) *reinterpret_cast<uint4 *>(t + v + (uint64_t)u * blockDim.x * 16) = x[u];
        }
        for (; v < vend; v += (uint64_t)blockDim.x * 16)
            *reinterpret_cast<uint4 *>(t + v) = *reinterpret_cast<const uint4 *>(s + v);
        i = vend;
    }
    for (uint64_t b = i + threadIdx.x; b < end; b += blockDim.x) t[b] = s[b];
}

__global__ void __launch_bounds__(256) pack(const uint8_t *pool, size_t slot_bytes, const pkv_cuk_tok *toks,
                                            uint32_t runs, size_t run_bytes, size_t row_bytes, uint8_t *out) {
    const pkv_cuk_tok tk = toks[blockIdx.x];
    const uint8_t *blk = pool + (size_t)tk.slot * slot_bytes + (size_t)tk.offset * row_bytes;
    uint8_t *o = out + (size_t)blockIdx.x * runs * row_bytes;
    if (((row_bytes | run_bytes | slot_bytes | (uintptr_t)pool | (uintptr_t)out) & 3) == 0) {
        const size_t w = row_bytes / 4, total = (size_t)runs * w;
        for (size_t i = threadIdx.x; i < total; i += blockDim.x) {
            const size_t r = i / w, k = i % w;
            reinterpret_cast<uint32_t *>(o)[i] =
                *reinterpret_cast<const uint32_t *>(blk + r * run_bytes + k * 4);
        }
    } else {
        const size_t total = (size_t)runs * row_bytes;
        for (size_t i = threadIdx.x; i < total; i += blockDim.x)
            o[i] = blk[(i / row_bytes) * run_bytes + i % row_bytes];
    }
}

} // namespace

static cudaError_t dispatch(const pkv_cuk_attn *a, void *stream);

extern "C" int pkv_cuk_attn_blocks_per_sm(const pkv_cuk_attn *a, int *blocks) {
    *blocks = 0;
    g_occ = blocks; /* thread-local: launches on other threads are unaffected */
    const cudaError_t e = dispatch(a, NULL);
    g_occ = NULL;
    return e;
}

extern "C" int pkv_cuk_attn_launch(const pkv_cuk_attn *a, void *stream) { return dispatch(a, stream); }

static cudaError_t dispatch(const pkv_cuk_attn *a, void *stream) {
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const dim3 grid((unsigned)(a->n_seqs * a->n_splits), a->num_kv_heads * a->tiles);
    cudaError_t e;
    if (a->variant == PKV_ATTN_VARIANT_FAST) {
        switch (a->dtype) {
        case DT_F32: e = launch_fast<F32>(*a, grid, st); break;
        case DT_F16: e = launch_fast<F16>(*a, grid, st); break;
        case DT_BF16: e = launch_fast<BF16>(*a, grid, st); break;
        default: return cudaErrorInvalidValue;
        }
    } else {
        switch (a->dtype) {
        case DT_F32: e = launch_generic<F32>(*a, grid, st); break;
        case DT_F16: e = launch_generic<F16>(*a, grid, st); break;
        case DT_BF16: e = launch_generic<BF16>(*a, grid, st); break;
        default: return cudaErrorInvalidValue;
        }
    }
    if (e != cudaSuccess || a->n_splits <= 1 || g_occ) return e;
    attn_combine<<<(unsigned)(a->n_seqs * a->num_q_heads), THREADS, 0, st>>>(*a);
    return cudaGetLastError();
}

extern "C" int pkv_cuk_gather_launch(const pkv_cuk_copy *descs, uint32_t n, uint64_t bytes, void *stream) {
    if (!n || !bytes) return cudaSuccess;
    const uint64_t pieces = (bytes + PIECE - 1) / PIECE;
    if (pieces * n > 0x7fffffffull) return cudaErrorInvalidValue;
    gather<<<(unsigned)(pieces * n), 256, 0, static_cast<cudaStream_t>(stream)>>>(descs, bytes, (uint32_t)pieces);
    return cudaGetLastError();
}

extern "C" int pkv_cuk_pack_launch(const void *pool, size_t slot_bytes, const pkv_cuk_tok *toks, uint32_t n,
                                   uint32_t runs, size_t run_bytes, size_t row_bytes, void *out, void *stream) {
    if (!n) return cudaSuccess;
    if (n > 0x7fffffffu) return cudaErrorInvalidValue;
    pack<<<n, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const uint8_t *>(pool), slot_bytes, toks,
                                                          runs, run_bytes, row_bytes, static_cast<uint8_t *>(out));
    return cudaGetLastError();
}
