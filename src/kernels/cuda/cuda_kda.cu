/*
 * cuda_kda.cu — the KDA recurrence of one sequence on the GPU (df_backend.kda_recur; engine/kda.c computes the
 * projections, the short convolution and o_proj around it). The arithmetic is kernels/kda_math.h's, shared with the
 * CPU's kda_recur_head (engine/kda.c): the same IEEE operations in the same order, so state and output have the CPU's
 * bits whenever the gate has a lower bound (Kimi K3); without one, softplus's log1pf is CUDA's (its last bit may
 * differ from glibc's).
 *
 * Three launches on the runtime's stream, between one copy in and one copy out of the rows and the state:
 *   prep  (thread per token x head): q, k normalized (q scaled), the K decays and beta (df_kda_prep);
 *   recur (block per head, thread c = column c of the head's K x K state, the state in shared memory): token after
 *         token, S *= decay by rows while c's k^T S sums rows 0..K-1 in order; u_c = beta (v_c - that);
 *         S[:, c] += k u_c while o_c = q^T S[:, c] sums the rows in order (engine/kda.c's loops, column by column);
 *   out   (thread per token x head): the gated RMSNorm (df_kda_out).
 * Each token's arithmetic depends on the tokens before it only through S, so one call of T rows and T calls of one
 * row give the same bits.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__device__ uint64_t df_expf_tab_dev[32]; /* expf_math.h's table: cpu_exp2_tab, copied at first use */

#include "kernels/kda_math.h"

namespace {

/* a [T, H] items: q, k of (t, h) normalized in place; decay [T, H*K]; beta [T, H] */
__global__ void kda_prep_kernel(int T, int H, int K, float *q, float *k, const float *graw, const float *bl,
                                const float *A_log, const float *dt_bias, int has_lb, float lb, float qscale,
                                float *decay, float *beta) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * H) return;
    const int h = (int)(i % H);
    const int64_t o = (i / H) * H * K + (int64_t)h * K;
    beta[i] = df_kda_prep(q + o, k + o, graw + o, dt_bias + (int64_t)h * K, df_expf(A_log[h]), has_lb, lb, bl[i],
                          qscale, K, decay + o);
}

/* block h, K threads: the head's state [K][K] in shared memory for all T tokens, then back to S */
__global__ void kda_recur_kernel(int T, int H, int K, const float *q, const float *k, const float *v,
                                 const float *decay, const float *beta, float *S, float *o) {
    pdl_enter();
    extern __shared__ float kda_sm[]; /* [K][K] state, then k, q, decay of the token [3][K] */
    float *st = kda_sm, *kt = kda_sm + (size_t)K * K, *qt = kt + K, *dt = qt + K;
    const int h = blockIdx.x, c = threadIdx.x;
    float *Sh = S + (size_t)h * K * K;
    for (int r = 0; r < K; r++) st[(size_t)r * K + c] = Sh[(size_t)r * K + c];
    const int64_t D = (int64_t)H * K;
    for (int t = 0; t < T; t++) {
        const int64_t row = t * D + (int64_t)h * K;
        __syncthreads(); /* the last token's reads of kt / qt / dt are done */
        kt[c] = k[row + c];
        qt[c] = q[row + c];
        dt[c] = decay[row + c];
        __syncthreads();
        float m = 0.0f;
        for (int r = 0; r < K; r++) {
            const float s = DF_HM_MUL(st[(size_t)r * K + c], dt[r]);
            st[(size_t)r * K + c] = s;
            m = DF_HM_ADD(m, DF_HM_MUL(s, kt[r]));
        }
        const float u = DF_HM_MUL(beta[(int64_t)t * H + h], DF_HM_SUB(v[row + c], m));
        float acc = 0.0f;
        for (int r = 0; r < K; r++) {
            const float s = DF_HM_ADD(st[(size_t)r * K + c], DF_HM_MUL(kt[r], u));
            st[(size_t)r * K + c] = s;
            acc = DF_HM_ADD(acc, DF_HM_MUL(qt[r], s));
        }
        o[row + c] = acc;
    }
    for (int r = 0; r < K; r++) Sh[(size_t)r * K + c] = st[(size_t)r * K + c];
}

__global__ void kda_out_kernel(int T, int H, int K, float *o, const float *gate, const float *o_norm, float eps,
                               int silu_gate) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * H) return;
    const int64_t off = (i / H) * H * K + (i % H) * K;
    df_kda_out(o + off, gate + off, o_norm, eps, silu_gate, K);
}

char *g_buf;          /* device scratch for a call's rows and state */
float *g_s_host;      /* host copy of the state on its way back */
size_t g_s_host_bytes;
size_t g_buf_bytes;
int g_tab_ready;
int g_smem_set;       /* the recur kernel's dynamic shared memory limit raised to this many bytes */

} // namespace

/* The largest K whose state and staging fit a block's shared memory (227 KB on compute capability 9.0). */
static const int KDA_MAX_K = 224;

extern "C" int df_cuda_kda_recur(const df_kda_args *a) {
    if (!a || a->H < 1 || a->K < 1 || a->T < 0) return cu_rt_error("KDA recurrence: no heads, rows or head size");
    if (a->K > KDA_MAX_K) {
        char m[160];
        snprintf(m, sizeof m, "KDA recurrence: head size %d above %d (a head's state must fit a block's shared memory)",
                 a->K, KDA_MAX_K);
        return cu_rt_error(m);
    }
    if (a->T == 0) return 0;
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    const int H = a->H, K = a->K, T = a->T;
    const size_t D = (size_t)H * K, rows = sizeof(float) * (size_t)T * D, sb = sizeof(float) * (size_t)H * K * K,
                 smem = sizeof(float) * ((size_t)K * K + 3 * (size_t)K);
    /* q, k, v, graw, gate, decay, o [T, D]; bl, beta [T, H]; S; A_log [H], dt_bias [D], o_norm [K] (256-byte aligned) */
    const size_t al = 256, fb = (rows + al - 1) / al * al, hb = (sizeof(float) * (size_t)T * H + al - 1) / al * al,
                 need = 7 * fb + 2 * hb + (sb + al - 1) / al * al + 3 * ((sizeof(float) * D + al - 1) / al * al);
    int rc = -1;
    float *s_host = nullptr;
    do {
        if (!g_tab_ready) {
            if (cudaMemcpyToSymbol(df_expf_tab_dev, cpu_exp2_tab, sizeof(uint64_t) * 32) != cudaSuccess) break;
            g_tab_ready = 1;
        }
        if ((size_t)g_smem_set < smem) {
            if (cudaFuncSetAttribute(kda_recur_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess)
                break;
            g_smem_set = (int)smem;
        }
        if (g_buf_bytes < need) {
            if (g_buf) cudaStreamSynchronize(st), cudaFree(g_buf);
            g_buf = nullptr;
            g_buf_bytes = 0;
            if (cudaMalloc(&g_buf, need) != cudaSuccess) { g_buf = nullptr; break; }
            g_buf_bytes = need;
        }
        char *p = g_buf;
        auto take = [&](size_t n) { char *r = p; p += (n + al - 1) / al * al; return (float *)r; };
        float *q = take(rows), *k = take(rows), *v = take(rows), *graw = take(rows), *gate = take(rows),
              *decay = take(rows), *o = take(rows), *bl = take(sizeof(float) * (size_t)T * H),
              *beta = take(sizeof(float) * (size_t)T * H), *S = take(sb), *A_log = take(sizeof(float) * H),
              *dt_bias = take(sizeof(float) * D), *o_norm = take(sizeof(float) * K);
        const struct { void *d; const void *h; size_t n; } in[] = {
            {q, a->q, rows}, {k, a->k, rows}, {v, a->v, rows}, {graw, a->graw, rows}, {gate, a->gate, rows},
            {bl, a->bl, sizeof(float) * (size_t)T * H}, {S, a->S, sb}, {A_log, a->A_log, sizeof(float) * H},
            {dt_bias, a->dt_bias, sizeof(float) * D}, {o_norm, a->o_norm, sizeof(float) * K}};
        int ok = 1;
        for (const auto &c : in)
            if (cudaMemcpyAsync(c.d, c.h, c.n, cudaMemcpyHostToDevice, st) != cudaSuccess) { ok = 0; break; }
        if (!ok) break;
        const int64_t items = (int64_t)T * H;
        const int nb = (int)((items + 127) / 128);
        const float qscale = 1.0f / sqrtf((float)K);
        if (cu_launch(kda_prep_kernel, nb, 128, 0, st, T, H, K, q, k, (const float *)graw, (const float *)bl,
                      (const float *)A_log, (const float *)dt_bias, a->has_lb, a->lb, qscale, decay, beta) != cudaSuccess)
            break;
        if (cu_launch(kda_recur_kernel, H, K, smem, st, T, H, K, (const float *)q, (const float *)k, (const float *)v,
                      (const float *)decay, (const float *)beta, S, o) != cudaSuccess)
            break;
        if (cu_launch(kda_out_kernel, nb, 128, 0, st, T, H, K, o, (const float *)gate, (const float *)o_norm, a->eps,
                      a->silu_gate) != cudaSuccess)
            break;
        /* the state through a host copy: a failed call leaves the caller's state as it was */
        if (g_s_host_bytes < sb) {
            free(g_s_host);
            g_s_host_bytes = 0;
            if (!(g_s_host = (float *)malloc(sb))) break;
            g_s_host_bytes = sb;
        }
        s_host = g_s_host;
        if (cudaMemcpyAsync(s_host, S, sb, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cudaMemcpyAsync(a->o, o, rows, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cu_rt_sync("kda") != cudaSuccess) break;
        memcpy(a->S, s_host, sb);
        rc = 0;
    } while (0);
    if (rc) cu_rt_error("KDA recurrence: a CUDA call failed");
    cudaStreamSynchronize(st);
    cu_rt_unlock();
    return rc;
}
