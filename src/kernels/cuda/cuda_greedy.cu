/*
 * cuda_greedy.cu — greedy decoding that stays on the device (df_backend.final_argmax, token_wait, embed_dev;
 * kernels/cuda.h): a decode step's final norm and lm_head, then the first index of the largest logit into a
 * device token slot, and the next step's embedding row read from that slot. So the host can queue step n + 1
 * before step n's token is back: the device never waits at a token boundary for the host to read the logits,
 * pick the token and start the next step (engine/api.c df_decode_greedy).
 *
 * The argmax is sample.c's: the running best starting at logit 0, replaced by a strictly larger one (NaN never
 * wins; logit 0 NaN or all NaN: 0). On the device: each thread the best of its logits (index order, strictly
 * larger), then the block's bests merged (larger value, or on a tie the lower index; none beats one). The final norm
 * and lm_head are df_cuda_final_logits's kernels (the same bits); the embedding row is decoded element by element
 * as the CPU's decode_row (cuda_decode.cuh wdec).
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_decode.cuh"

#include <math.h>
#include <stdio.h>

namespace {

constexpr int AN = 1024; /* argmax: threads of its one block */
constexpr int AU = 8;    /* argmax: logits each thread loads at once */

/* the token into the device slot and into the pinned read-back slot (written from the kernel: no copy after it) */
__global__ void __launch_bounds__(AN) argmax_kernel(const float *__restrict__ l, int n, int32_t *__restrict__ tok,
                                                    int32_t *__restrict__ htok) {
    pdl_enter();
    __shared__ float sv[AN];
    __shared__ int si[AN];
    float bv = 0.0f;
    int bi = -1; /* -1: no non-NaN logit yet */
    for (int i0 = threadIdx.x; i0 < n; i0 += AU * AN) { /* AU loads in flight, then their indices in order */
        float v[AU];
#pragma unroll
        for (int u = 0; u < AU; u++) v[u] = i0 + u * AN < n ? l[i0 + u * AN] : 0.0f;
#pragma unroll
        for (int u = 0; u < AU; u++)
            if (i0 + u * AN < n && v[u] == v[u] && (bi < 0 || v[u] > bv)) bv = v[u], bi = i0 + u * AN;
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = AN / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            const float ov = sv[threadIdx.x + w];
            const int oi = si[threadIdx.x + w];
            const int mi = si[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int32_t t = (l[0] != l[0] || si[0] < 0) ? 0 : si[0];
        *tok = t;
        *htok = t;
    }
}

/* out [cols] = row *tok of a weight [rows, cols] of encoding ENC (a token outside [0, rows): zeros) */
template <int ENC>
__global__ void embed_kernel(const uint8_t *__restrict__ d, const uint8_t *__restrict__ s, int64_t rows, int64_t cols,
                             const int32_t *__restrict__ tok, float *__restrict__ out) {
    pdl_enter();
    const int64_t r = *tok;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x)
        out[c] = r >= 0 && r < rows ? wdec<ENC>(d, s, cols, r, c) : 0.0f;
}

cudaError_t embed_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                         const int32_t *tok, float *out, cudaStream_t st) {
    const uint8_t *d = static_cast<const uint8_t *>(data), *s = static_cast<const uint8_t *>(scale);
    const unsigned grid = (unsigned)((cols + 255) / 256);
    switch (type) {
    case DF_W_F32: cu_launch(embed_kernel<DF_W_F32>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_BF16: cu_launch(embed_kernel<DF_W_BF16>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_F16: cu_launch(embed_kernel<DF_W_F16>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_FP8_B128: cu_launch(embed_kernel<DF_W_FP8_B128>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_INT4_G32: cu_launch(embed_kernel<DF_W_INT4_G32>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_MXFP4: cu_launch(embed_kernel<DF_W_MXFP4>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    case DF_W_INT8_ROW: cu_launch(embed_kernel<DF_W_INT8_ROW>, grid, 256, 0, st, d, s, rows, cols, tok, out); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* The token slot (device), the final norm's and the logits' scratch, and per read-back slot its pinned int and the
 * event recorded behind its copy. Under the runtime's mutex. */
int32_t *g_tok;
float *g_nx, *g_lg;
size_t g_cnx, g_clg;
int32_t *g_htok;
cudaEvent_t g_ev[2];
int g_live[2];
uint64_t g_evcall[2]; /* the call that recorded the slot's event */

int fail(const char *what, cudaError_t e) {
    char b[256];
    snprintf(b, sizeof b, "greedy: %s: %s", what, cudaGetErrorString(e));
    return cu_rt_error(b);
}
#define CKG(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return fail(#call, e_); } while (0)

int grow(float **p, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    if (*p) {
        CKG(cudaStreamSynchronize(cu_rt_stream())); /* queued work may still read the old buffer */
        cudaFree(*p);
    }
    *p = nullptr;
    *cap = 0;
    CKG(cudaMalloc(p, n));
    *cap = n;
    return 0;
}

int setup(void) {
    if (g_tok) return 0;
    CKG(cudaMalloc(&g_tok, sizeof(int32_t)));
    CKG(cudaMemset(g_tok, 0, sizeof(int32_t)));
    CKG(cudaMallocHost(&g_htok, 2 * sizeof(int32_t)));
    for (int i = 0; i < 2; i++) CKG(cudaEventCreateWithFlags(&g_ev[i], cudaEventDisableTiming));
    return 0;
}

int final_argmax_locked(const float *x, uint64_t key, const float *norm, float eps, const df_weight *lm, int slot) {
    const int64_t D = lm->cols, V = lm->rows;
    const cudaStream_t st = cu_rt_stream();
    if (setup() || grow(&g_nx, &g_cnx, sizeof(float) * (size_t)D) || grow(&g_lg, &g_clg, sizeof(float) * (size_t)(V > D ? V : D)))
        return -1;
    const float *src;
    if (x) { /* into the logits' scratch, read before the lm_head writes it; pageable: the copy is staged before the
              * call returns, so x may go */
        CKG(cudaMemcpyAsync(g_lg, x, sizeof(float) * (size_t)D, cudaMemcpyHostToDevice, st));
        src = g_lg;
    } else if (!(src = cu_rt_resid(key, (size_t)D, 1, NULL))) {
        return -1;
    }
    const df_weight nw = {DF_W_F32, 1, D, norm, NULL, 0};
    const void *d, *s;
    if (cu_rt_weight(&nw, &d, &s)) return -1;
    CKG(cu_rmsnorm_launch(g_nx, src, (const float *)d, 1, D, eps, st));
    if (cu_rt_weight(lm, &d, &s)) return -1;
    CKG(cu_matmul_launch(lm->type, d, s, V, D, g_nx, 1, g_lg, st));
    cu_launch(argmax_kernel, 1, AN, 0, st, (const float *)g_lg, (int)V, g_tok, g_htok + slot);
    CKG(cudaGetLastError());
    CKG(cudaEventRecord(g_ev[slot], st)); /* the host reads the pinned slot once the kernel has completed */
    g_live[slot] = 1;
    g_evcall[slot] = cu_rt_call();
    return 0;
}

int token_wait_locked(int slot, int32_t *id) {
    if (!g_live[slot]) return cu_rt_error("greedy: no token queued in this read-back slot");
    g_live[slot] = 0;
    CKG(cu_rt_sync_upto("greedy: token", g_ev[slot], g_evcall[slot]));
    *id = g_htok[slot];
    return 0;
}

int embed_locked(uint64_t key, const df_weight *embed) {
    if (!g_tok) return cu_rt_error("greedy: no token on the device to embed");
    int *valid = NULL;
    float *r = cu_rt_resid(key, (size_t)embed->cols, 0, &valid);
    if (!r) return -1;
    const void *d, *s;
    if (cu_rt_weight(embed, &d, &s)) return -1;
    CKG(embed_launch(embed->type, d, s, embed->rows, embed->cols, g_tok, r, cu_rt_stream()));
    if (valid) *valid = 1;
    return 0;
}

} // namespace

extern "C" int df_cuda_final_argmax(const float *x, uint64_t resid_key, const float *norm, float eps,
                                    const df_weight *lm_head, int slot) {
    if (slot < 0 || slot > 1 || !norm || !lm_head || (!x && !resid_key)) return -1;
    if (cu_rt_lock()) return -1;
    const int rc = final_argmax_locked(x, resid_key, norm, eps, lm_head, slot);
    if (rc) cudaStreamSynchronize(cu_rt_stream()); /* nothing queued still reads what the caller frees */
    cu_rt_unlock();
    return rc;
}

extern "C" int df_cuda_token_wait(int slot, int32_t *id) {
    if (slot < 0 || slot > 1 || !id) return -1;
    if (cu_rt_lock()) return -1;
    const int rc = token_wait_locked(slot, id);
    if (rc) cudaStreamSynchronize(cu_rt_stream()); /* nothing queued still reads what the caller frees */
    cu_rt_unlock();
    return rc;
}

extern "C" int df_cuda_embed_dev(uint64_t resid_key, const df_weight *embed) {
    if (!embed) return -1;
    if (!resid_key) return df_cuda_preload(embed) == 0 ? 0 : -1; /* resident, or not used */
    if (cu_rt_lock()) return -1;
    const int rc = embed_locked(resid_key, embed);
    if (rc) cudaStreamSynchronize(cu_rt_stream()); /* nothing queued still reads what the caller frees */
    cu_rt_unlock();
    return rc;
}
