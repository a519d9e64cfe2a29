/*
 * cuda_kda.cu — Kimi Delta Attention on the GPU: the recurrence of one sequence (df_backend.kda_recur; engine/kda.c
 * computes the projections, the short convolution and o_proj around it), and a KDA layer's whole mixer in one call
 * (df_backend.kda_block: projections, convolutions with their state, recurrence, gated RMSNorm and o_proj; h in, out
 * back), whose state stays in a device copy between calls (df_backend.kda_state fetches or forgets it), so a decode
 * step moves only its rows. The arithmetic is kernels/kda_math.h's, shared with the
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
#include <iterator>
#include <unordered_map>

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

/* The sequences of a call: sequence s has rows [row0[s], row0[s + 1]) of the call's arrays; its state is read from
 * Sin[s] and written into S[s] (they may be one array), its conv state [3][W-1][H*K] read from cin[s] and the next
 * one written into cout[s]. By value (kernel parameters). */
struct KSeqs {
    int n;
    int row0[DF_KDA_BLOCK_SEQS + 1];
    const float *Sin[DF_KDA_BLOCK_SEQS];
    float *S[DF_KDA_BLOCK_SEQS];
    const float *cin[DF_KDA_BLOCK_SEQS];
    float *cout[DF_KDA_BLOCK_SEQS];
};

/* the sequence of row t */
__device__ __forceinline__ int seq_of(const KSeqs &q, int t) {
    int s = 0;
    while (s + 1 < q.n && t >= q.row0[s + 1]) s++;
    return s;
}

/* block (h, s), K threads: head h of sequence s, its state [K][K] from Sin[s] in shared memory for all the sequence's
 * tokens, then into S[s] */
__global__ void kda_recur_kernel(KSeqs sq, int H, int K, const float *q, const float *k, const float *v,
                                 const float *decay, const float *beta, float *o) {
    pdl_enter();
    extern __shared__ float kda_sm[]; /* [K][K] state, then k, q, decay of the token [3][K] */
    float *st = kda_sm, *kt = kda_sm + (size_t)K * K, *qt = kt + K, *dt = qt + K;
    const int h = blockIdx.x, sid = blockIdx.y, c = threadIdx.x;
    const float *Si = sq.Sin[sid] + (size_t)h * K * K;
    float *Sh = sq.S[sid] + (size_t)h * K * K;
    for (int r = 0; r < K; r++) st[(size_t)r * K + c] = Si[(size_t)r * K + c];
    const int64_t D = (int64_t)H * K;
    for (int t = sq.row0[sid]; t < sq.row0[sid + 1]; t++) {
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

/* The short convolution of projection `which` (0 q, 1 k, 2 v) over the call's T rows: y[t, c] = silu(sum_j w[c, j] *
 * in(t - P + j, c)), P = W - 1, where in(i) is row i of the row's sequence in x for i >= 0, else row P + i of that
 * sequence's conv state cin (projection `which`); engine/kda.c conv_task's expression. */
__global__ void kda_conv_kernel(KSeqs sq, int T, int64_t D, int W, int which, const float *x, const float *w, float *y) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int t = (int)(i / D), P = W - 1, s = seq_of(sq, t), r0 = sq.row0[s];
    const int64_t c = i % D;
    const float *st = sq.cin[s] + (size_t)which * P * D;
    float acc = 0.0f;
    for (int j = 0; j < W; j++) {
        const int r = t - r0 - P + j;
        acc = DF_HM_ADD(acc, DF_HM_MUL(w[c * W + j], r >= 0 ? x[(int64_t)(r0 + r) * D + c] : st[(int64_t)(P + r) * D + c]));
    }
    y[i] = df_kda_silu(acc);
}

/* The convolutions' next states, projection `which`: row r of sequence s's = row T_s + r of [its state cin (P rows);
 * its rows of x (T_s rows)], into cout[s] */
__global__ void kda_conv_state_kernel(KSeqs sq, int64_t D, int P, int which, const float *x) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)sq.n * P * D) return;
    const int s = (int)(i / ((int64_t)P * D));
    const int64_t j = i % ((int64_t)P * D);
    const int Ts = sq.row0[s + 1] - sq.row0[s], src = Ts + (int)(j / D) - P;
    const int64_t c = j % D, off = (int64_t)which * P * D;
    sq.cout[s][off + j] = src >= 0 ? x[(int64_t)(sq.row0[s] + src) * D + c] : sq.cin[s][off + (int64_t)(P + src) * D + c];
}

char *g_buf;          /* device scratch for a call's rows and state */
size_t g_buf_bytes;
float *g_s_host;      /* host copy of the state (and, for a block, the conv state after it) on its way back */
size_t g_s_host_bytes;
int g_tab_ready;
int g_smem_set;       /* the recur kernel's dynamic shared memory limit raised to this many bytes */

/* g_buf at least need bytes (the stream synchronised first when it moves): 0, or -1 */
int grow_buf(size_t need, cudaStream_t st) {
    if (g_buf_bytes >= need) return 0;
    if (g_buf) cudaStreamSynchronize(st), cudaFree(g_buf);
    g_buf = nullptr;
    g_buf_bytes = 0;
    if (cudaMalloc(&g_buf, need) != cudaSuccess) {
        g_buf = nullptr;
        cudaGetLastError(); /* not sticky: clear it, or the next matmul launch's check would report it */
        return -1;
    }
    g_buf_bytes = need;
    return 0;
}

/* g_s_host at least need bytes: 0, or -1 */
int grow_s_host(size_t need) {
    if (g_s_host_bytes >= need) return 0;
    free(g_s_host);
    g_s_host_bytes = 0;
    if (!(g_s_host = (float *)malloc(need))) return -1;
    g_s_host_bytes = need;
    return 0;
}

/* The expf table on the device (once) and the recur kernel's shared memory limit at least smem bytes: 0, or -1 */
int kda_setup(size_t smem) {
    if (!g_tab_ready) {
        if (cudaMemcpyToSymbol(df_expf_tab_dev, cpu_exp2_tab, sizeof(uint64_t) * 32) != cudaSuccess) return -1;
        g_tab_ready = 1;
    }
    if ((size_t)g_smem_set < smem) {
        if (cudaFuncSetAttribute(kda_recur_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
            return -1;
        g_smem_set = (int)smem;
    }
    return 0;
}

/* 256-byte aligned carving of g_buf */
struct Carve {
    char *p;
    float *take(size_t bytes) { char *r = p; p += (bytes + 255) / 256 * 256; return (float *)r; }
};
size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* The largest K whose state and staging fit a block's shared memory (227 KB on compute capability 9.0). */
constexpr int KDA_MAX_K = 224;

/* The recur kernel's dynamic shared memory: the [K][K] state and the token's k, q, decay */
size_t recur_smem(int K) { return sizeof(float) * ((size_t)K * K + 3 * (size_t)K); }

/* -1 (recorded, naming op) when K is above KDA_MAX_K, else 0 */
int head_refusal(const char *op, int K) {
    if (K <= KDA_MAX_K) return 0;
    char m[160];
    snprintf(m, sizeof m, "%s: head size %d above %d (a head's state must fit a block's shared memory)", op, K,
             KDA_MAX_K);
    return cu_rt_error(m);
}

struct HostCopy {
    void *d;
    const void *h;
    size_t n;
};

/* n host arrays into device memory, queued on st: 0, or -1 */
int copy_in(const HostCopy *in, size_t n, cudaStream_t st) {
    for (size_t i = 0; i < n; i++)
        if (cudaMemcpyAsync(in[i].d, in[i].h, in[i].n, cudaMemcpyHostToDevice, st) != cudaSuccess) return -1;
    return 0;
}

/* prep, recurrence and gated RMSNorm of the T rows of the sequences sq (df_kda_args' meaning; q, k normalized in place,
 * decay [T, H*K] and beta [T, H] scratch, each sequence's state read from sq.Sin and written into sq.S, o written),
 * queued on st after kda_setup(recur_smem(K)). vec(0) and vec(1) give dt_bias and o_norm on the device (NULL:
 * failed), each looked up just before the launch that reads it. */
template <class Vec>
cudaError_t launch_recurrence(cudaStream_t st, const KSeqs &sq, int T, int H, int K, float *q, float *k, const float *v,
                              const float *graw, const float *bl, const float *gate, const float *A_log, Vec vec,
                              int has_lb, float lb, float eps, int silu_gate, float *decay, float *beta, float *o) {
    const int nb = (int)(((int64_t)T * H + 127) / 128);
    const float qscale = 1.0f / sqrtf((float)K);
    const float *dt_bias = vec(0);
    if (!dt_bias) return cudaErrorInvalidValue;
    cudaError_t e = cu_launch(kda_prep_kernel, nb, 128, 0, st, T, H, K, q, k, graw, bl, A_log, dt_bias, has_lb, lb,
                              qscale, decay, beta);
    if (e == cudaSuccess)
        e = cu_launch(kda_recur_kernel, dim3((unsigned)H, (unsigned)sq.n), K, recur_smem(K), st, sq, H, K,
                      (const float *)q, (const float *)k, v, (const float *)decay, (const float *)beta, o);
    if (e != cudaSuccess) return e;
    const float *o_norm = vec(1);
    if (!o_norm) return cudaErrorInvalidValue;
    return cu_launch(kda_out_kernel, nb, 128, 0, st, T, H, K, o, gate, o_norm, eps, silu_gate);
}

/* An entry point's end, the mutex held: a failure recorded as msg and CUDA's error cleared (it is not sticky: the
 * caller's next launch, its steps, would report it), the stream drained, the mutex released; returns rc. */
int finish(int rc, const char *msg, cudaStream_t st) {
    if (rc) cu_rt_error(msg);
    cudaStreamSynchronize(st);
    if (rc) cudaGetLastError();
    cu_rt_unlock();
    return rc;
}

} // namespace

extern "C" int df_cuda_kda_recur(const df_kda_args *a) {
    if (!a || a->H < 1 || a->K < 1 || a->T < 0) return cu_rt_error("KDA recurrence: no heads, rows or head size");
    if (head_refusal("KDA recurrence", a->K)) return -1;
    if (a->T == 0) return 0;
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    const int H = a->H, K = a->K, T = a->T;
    const size_t f = sizeof(float), D = (size_t)H * K, rows = f * (size_t)T * D, sb = f * (size_t)H * K * K;
    /* q, k, v, graw, gate, decay, o [T, D]; bl, beta [T, H]; S; A_log [H], dt_bias [D], o_norm [K] */
    const size_t need = 7 * up256(rows) + 2 * up256(f * (size_t)T * H) + up256(sb) + up256(f * H) + up256(f * D) +
                        up256(f * K);
    int rc = -1;
    do {
        if (kda_setup(recur_smem(K)) || grow_buf(need, st) || grow_s_host(sb)) break;
        Carve cv{g_buf};
        float *q = cv.take(rows), *k = cv.take(rows), *v = cv.take(rows), *graw = cv.take(rows), *gate = cv.take(rows),
              *decay = cv.take(rows), *o = cv.take(rows), *bl = cv.take(f * (size_t)T * H),
              *beta = cv.take(f * (size_t)T * H), *S = cv.take(sb), *A_log = cv.take(f * H), *dt_bias = cv.take(f * D),
              *o_norm = cv.take(f * K);
        const HostCopy in[] = {{q, a->q, rows},         {k, a->k, rows},         {v, a->v, rows},
                               {graw, a->graw, rows},   {gate, a->gate, rows},   {bl, a->bl, f * (size_t)T * H},
                               {S, a->S, sb},           {A_log, a->A_log, f * H}, {dt_bias, a->dt_bias, f * D},
                               {o_norm, a->o_norm, f * K}};
        if (copy_in(in, sizeof in / sizeof *in, st)) break;
        auto vec = [&](int i) -> const float * { return i == 0 ? dt_bias : o_norm; };
        KSeqs sq = {};
        sq.n = 1;
        sq.row0[1] = T;
        sq.Sin[0] = sq.S[0] = S;
        if (launch_recurrence(st, sq, T, H, K, q, k, v, graw, bl, gate, A_log, vec, a->has_lb, a->lb, a->eps,
                              a->silu_gate, decay, beta, o) != cudaSuccess)
            break;
        /* the state through a host copy: a failed call leaves the caller's state as it was */
        if (cudaMemcpyAsync(g_s_host, S, sb, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cudaMemcpyAsync(a->o, o, rows, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cu_rt_sync("kda") != cudaSuccess) break;
        memcpy(a->S, g_s_host, sb);
        rc = 0;
    } while (0);
    return finish(rc, "KDA recurrence: a CUDA call failed", st);
}

namespace {

/* y [T, w.rows] = x [T, w.cols] W^T on the device, queued on st (the weight looked up just before its launch) */
int mm_dev(const df_weight *w, const float *x, int T, float *y, cudaStream_t st) {
    const void *d = nullptr, *s = nullptr;
    if (cu_rt_weight(w, &d, &s)) return -1;
    return cu_matmul_launch(w->type, d, s, w->rows, w->cols, x, T, y, st) == cudaSuccess ? 0 : -1;
}

/* why the block's weights do not chain, or NULL */
const char *block_shapes(const df_kda_block *b, int64_t D) {
    if (!b->q || !b->k || !b->v || !b->f_a || !b->f_b || !b->beta || !b->o || (!b->g && (!b->g_a || !b->g_b)))
        return "a projection is missing";
    const int64_t Dm = b->q->cols;
    if (b->q->rows != D || b->k->rows != D || b->v->rows != D || b->k->cols != Dm || b->v->cols != Dm)
        return "q / k / v are not [heads x head size, hidden]";
    if (b->f_a->cols != Dm || b->f_b->cols != b->f_a->rows || b->f_b->rows != D) return "f_a / f_b do not chain";
    if (b->beta->rows != b->H || b->beta->cols != Dm) return "beta is not [heads, hidden]";
    if (b->g ? (b->g->rows != D || b->g->cols != Dm)
             : (b->g_a->cols != Dm || b->g_b->cols != b->g_a->rows || b->g_b->rows != D))
        return "the output gate's projection does not chain";
    if (b->o->cols != D) return "o_proj's width is not heads x head size";
    if (b->W < 1 || b->W > 64) return "the convolution's width is not 1..64";
    return nullptr;
}

/* ---- Device copies of KDA states (df_kda_block's key), under the runtime's mutex.
 * A copy holds two slots of [S | conv state] (256-byte aligned), three once it has a snapshot: slot cur is the state;
 * a block writes the state after it into a slot that is neither cur nor snap and makes it cur once the call has
 * succeeded, so a failed call leaves the state (and the snapshot) as they were. snap (-1: none) is the slot of the
 * snapshot (kda_state DF_KDA_SNAP: snap = cur, no copying; DF_KDA_RESTORE: cur = snap). dirty: cur is newer than
 * the host's (kda_state fetches it). All copies together hold at most DF_CUDA_KV_MIRROR's cap (a budget of that size
 * of their own, as the latent caches' mirrors have; off: no copies, every call copies the state in and back); a
 * state with no room is copied in and back for that call, a snapshot with no room stays on the host. Nothing is
 * evicted: a dirty copy is the only current state of its sequence until fetched. */
struct KCopy {
    char *mem;      /* slots 0 and 1 */
    char *mem2;     /* slot 2 (NULL until a snapshot needs it) */
    size_t sb, cb;  /* S and conv state bytes */
    size_t slot;    /* bytes of a slot: up256(sb) + up256(cb) */
    int cur, snap, dirty;
};
std::unordered_map<uint64_t, KCopy> g_kc;
size_t g_kc_bytes, g_kc_cap;
int g_kc_init, g_kc_on, g_kc_live;
constexpr size_t KC_RESERVE = (size_t)1 << 30; /* device memory a new copy leaves free (scratch, context) */

char *kc_slot(const KCopy &c, int slot) { return slot < 2 ? c.mem + (size_t)slot * c.slot : c.mem2; }
float *kc_S(const KCopy &c, int slot) { return (float *)kc_slot(c, slot); }
float *kc_conv(const KCopy &c, int slot) { return (float *)(kc_slot(c, slot) + up256(c.sb)); }
/* the slot a block writes: neither the state's nor the snapshot's (slot 2 exists whenever a snapshot does) */
int kc_next(const KCopy &c) {
    for (int i = 0;; i++)
        if (i != c.cur && i != c.snap) return i;
}
size_t kc_bytes(const KCopy &c) { return (2 + (c.mem2 != nullptr)) * c.slot; }

/* DF_CUDA_KV_MIRROR (cuda_env.h) on the first call: the cap, default 1/8 of the device's memory; invalid: off (the
 * attention core's first call reports it) */
void kc_setup() {
    if (g_kc_init) return;
    g_kc_init = 1;
    g_kc_on = cu_kv_mirror_cap(&g_kc_cap, NULL, 0) > 0 && g_kc_cap > 0;
}

void kc_drop(std::unordered_map<uint64_t, KCopy>::iterator it) {
    if (cudaFreeAsync(it->second.mem, cu_rt_stream()) != cudaSuccess) cudaGetLastError();
    if (it->second.mem2 && cudaFreeAsync(it->second.mem2, cu_rt_stream()) != cudaSuccess) cudaGetLastError();
    g_kc_bytes -= kc_bytes(it->second);
    g_kc.erase(it);
    __atomic_store_n(&g_kc_live, (int)g_kc.size(), __ATOMIC_RELAXED);
}

/* A new copy for key of sb + cb bytes, its slot 0 the host's S and conv (queued on st), or NULL: no room, or the
 * allocation or copy failed (nothing kept) */
KCopy *kc_add(uint64_t key, size_t sb, size_t cb, const float *S, const float *conv, cudaStream_t st) {
    kc_setup();
    const size_t slot = up256(sb) + up256(cb);
    if (!g_kc_on || g_kc_bytes + 2 * slot > g_kc_cap) return nullptr;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    if (fr < 2 * slot + KC_RESERVE) return nullptr;
    char *mem = nullptr;
    if (cudaMallocAsync((void **)&mem, 2 * slot, st) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    KCopy c = {mem, nullptr, sb, cb, slot, 0, -1, 0};
    if (cudaMemcpyAsync(kc_S(c, 0), S, sb, cudaMemcpyHostToDevice, st) != cudaSuccess ||
        (cb && cudaMemcpyAsync(kc_conv(c, 0), conv, cb, cudaMemcpyHostToDevice, st) != cudaSuccess)) {
        cudaGetLastError();
        if (cudaFreeAsync(mem, st) != cudaSuccess) cudaGetLastError();
        return nullptr;
    }
    g_kc_bytes += 2 * slot;
    KCopy &r = g_kc[key] = c;
    __atomic_store_n(&g_kc_live, (int)g_kc.size(), __ATOMIC_RELAXED);
    return &r;
}

/* slot's S and conv state copied into the host's S and conv, waited for; false when that failed */
bool kc_copy_back(const KCopy &c, int slot, float *conv, float *S, cudaStream_t st, const char *what) {
    return S && (!c.cb || conv) && cudaMemcpyAsync(S, kc_S(c, slot), c.sb, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
           (!c.cb || cudaMemcpyAsync(conv, kc_conv(c, slot), c.cb, cudaMemcpyDeviceToHost, st) == cudaSuccess) &&
           cu_rt_sync(what) == cudaSuccess;
}

/* c's third slot (for a snapshot), or -1: no room (nothing changed) */
int kc_grow(KCopy &c, cudaStream_t st) {
    if (c.mem2) return 0;
    if (g_kc_bytes + c.slot > g_kc_cap) return -1;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { cudaGetLastError(); return -1; }
    if (fr < c.slot + KC_RESERVE) return -1;
    if (cudaMallocAsync((void **)&c.mem2, c.slot, st) != cudaSuccess) {
        cudaGetLastError();
        c.mem2 = nullptr;
        return -1;
    }
    g_kc_bytes += c.slot;
    return 0;
}

} // namespace

/* uid 0 (every mirror: a model opened or closed) keeps them: a copy is its sequence's current state, and its session
 * (of another model, perhaps) forgets it by its own uid when freed */
void cu_kda_forget(uint64_t uid) {
    if (uid == 0) return;
    for (auto it = g_kc.begin(); it != g_kc.end();) {
        auto nx = std::next(it);
        if (it->first >> 8 == uid) kc_drop(it);
        it = nx;
    }
}

int cu_kda_live(void) { return __atomic_load_n(&g_kc_live, __ATOMIC_RELAXED) > 0; }

extern "C" void df_cuda_kda_copies(int *n, uint64_t *bytes) {
    *n = 0;
    *bytes = 0;
    if (cu_rt_lock()) return;
    *n = (int)g_kc.size();
    *bytes = g_kc_bytes;
    cu_rt_unlock();
}

extern "C" int df_cuda_kda_state(uint64_t key, float *conv, float *S, int op) {
    if (op == DF_KDA_DROP && !cu_kda_live()) return 0;
    if (cu_rt_lock()) return -1;
    auto it = g_kc.find(key);
    if (op == DF_KDA_DROP) { /* stream-ordered free: nothing to wait for */
        if (it != g_kc.end()) kc_drop(it);
        cu_rt_unlock();
        return 0;
    }
    KCopy *c = it == g_kc.end() ? nullptr : &it->second;
    if (c && (op == DF_KDA_RESTORE ? c->snap >= 0 : op == DF_KDA_SNAP && c->mem2)) { /* no bytes move: no sync */
        if (op == DF_KDA_RESTORE) {
            c->cur = c->snap;
            c->dirty = 1;
        } else {
            c->snap = c->cur;
        }
        cu_rt_unlock();
        return 0;
    }
    cudaStream_t st = cu_rt_stream();
    int rc = -1;
    const char *msg = "KDA state: copying the device's state back failed";
    if (!c) { /* asked for as newer than the host's, or to snapshot: it was lost */
        msg = "KDA state: the device holds no copy of this state";
    } else if (op == DF_KDA_SNAP) {
        msg = "KDA state: no room on the device for a snapshot";
        if (kc_grow(*c, st) == 0) {
            c->snap = c->cur;
            rc = 0;
        }
    } else if (op == DF_KDA_RESTORE || op == DF_KDA_FETCH_SNAP) { /* a RESTORE here: no snapshot */
        msg = "KDA state: the device holds no snapshot of this state";
        if (c->snap >= 0 && op == DF_KDA_FETCH_SNAP) {
            msg = "KDA state: copying the device's snapshot back failed";
            if (kc_copy_back(*c, c->snap, conv, S, st, "kda snapshot")) rc = 0;
        }
    } else if (op != DF_KDA_FETCH) {
        msg = "KDA state: unknown operation";
    } else if (!c->dirty) {
        rc = 0;
    } else if (kc_copy_back(*c, c->cur, conv, S, st, "kda state")) {
        c->dirty = 0;
        rc = 0;
    }
    return finish(rc, msg, st);
}

extern "C" int df_cuda_kda_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                                 float *const *conv, float *const *S, float *out, unsigned char *kept) {
    if (!b || b->H < 1 || b->K < 1 || n_seq < 1 || n_seq > DF_KDA_BLOCK_SEQS || !Ts || !h || !key || !conv || !S ||
        !out || !kept)
        return cu_rt_error("KDA block: no heads, sequences (1..32), rows, state or output");
    if (head_refusal("KDA block", b->K)) return -1;
    const int H = b->H, K = b->K, P = b->W - 1;
    const int64_t D = (int64_t)H * K;
    if (const char *why = block_shapes(b, D)) {
        char m[200];
        snprintf(m, sizeof m, "KDA block: %s", why);
        return cu_rt_error(m);
    }
    int64_t T64 = 0;
    for (int s = 0; s < n_seq; s++) {
        if (Ts[s] < 0 || !conv[s] || !S[s]) return cu_rt_error("KDA block: a sequence without rows or state");
        T64 += Ts[s];
    }
    if (T64 > 0x7fffffff / (D > 0 ? D : 1)) return cu_rt_error("KDA block: too many rows");
    const int T = (int)T64;
    for (int s = 0; s < n_seq; s++) kept[s] = 0;
    if (T == 0) return 0;
    const int64_t Dm = b->q->cols, Do = b->o->rows;
    int64_t Ra = b->f_a->rows; /* fa holds f_a's rows, then g_a's */
    if (!b->g && b->g_a->rows > Ra) Ra = b->g_a->rows;
    const size_t f = sizeof(float), rows = f * (size_t)T * D, sb = f * (size_t)H * K * K, cb = f * (size_t)3 * P * D;
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    int rc = -1;
    const char *msg = "KDA block: a CUDA call failed";
    KCopy *kc[DF_KDA_BLOCK_SEQS] = {};
    unsigned char fresh[DF_KDA_BLOCK_SEQS] = {};
    do {
        if (kda_setup(recur_smem(K))) break;
        int nhost = 0, bad = 0; /* sequences whose state comes from and goes back to the host */
        for (int s = 0; s < n_seq && !bad; s++) {
            for (int s2 = 0; s2 < s && key[s]; s2++) bad |= key[s2] == key[s];
            if (bad) { msg = "KDA block: two sequences of the call share a key"; break; }
            if (!key[s]) { nhost++; continue; }
            auto it = g_kc.find(key[s]);
            if (it != g_kc.end()) {
                kc[s] = &it->second;
                if (kc[s]->sb != sb || kc[s]->cb != cb) {
                    msg = "KDA block: the device's copy of a state has other shapes";
                    bad = 1;
                }
            } else if ((kc[s] = kc_add(key[s], sb, cb, S[s], conv[s], st))) {
                fresh[s] = 1;
            } else {
                nhost++;
            }
        }
        /* h [T, Dm]; raw, q, k, v, graw, gate, decay, o [T, D]; fa [T, Ra]; bl, beta [T, H]; A_log [H]; out [T, Do];
         * per sequence without a device copy: S, conv state in and out */
        const size_t need = up256(f * (size_t)T * Dm) + 8 * up256(rows) + up256(f * (size_t)T * Ra) +
                            2 * up256(f * (size_t)T * H) + up256(f * H) + up256(f * (size_t)T * Do) +
                            (size_t)nhost * (up256(sb) + 2 * up256(cb));
        if (bad || grow_buf(need, st) || (nhost && grow_s_host((size_t)nhost * (sb + cb)))) break;
        Carve cv{g_buf};
        float *dh = cv.take(f * (size_t)T * Dm), *raw = cv.take(rows), *q = cv.take(rows), *k = cv.take(rows),
              *v = cv.take(rows), *graw = cv.take(rows), *gate = cv.take(rows), *decay = cv.take(rows),
              *o = cv.take(rows), *fa = cv.take(f * (size_t)T * Ra), *bl = cv.take(f * (size_t)T * H),
              *beta = cv.take(f * (size_t)T * H), *A_log = cv.take(f * H), *dout = cv.take(f * (size_t)T * Do);
        /* each sequence's state: from and into its device copy's slots, or copied in here and back at the end */
        KSeqs sq = {};
        sq.n = n_seq;
        float *hS[DF_KDA_BLOCK_SEQS] = {}, *hC[DF_KDA_BLOCK_SEQS] = {};
        int ok = cudaMemcpyAsync(dh, h, f * (size_t)T * Dm, cudaMemcpyHostToDevice, st) == cudaSuccess;
        for (int s = 0; s < n_seq && ok; s++) {
            sq.row0[s + 1] = sq.row0[s] + Ts[s];
            if (kc[s]) {
                const int nx = kc_next(*kc[s]);
                sq.Sin[s] = kc_S(*kc[s], kc[s]->cur);
                sq.S[s] = kc_S(*kc[s], nx);
                sq.cin[s] = kc_conv(*kc[s], kc[s]->cur);
                sq.cout[s] = kc_conv(*kc[s], nx);
            } else {
                hS[s] = cv.take(sb);
                float *ci = cv.take(cb);
                hC[s] = cv.take(cb);
                sq.Sin[s] = sq.S[s] = hS[s];
                sq.cin[s] = ci;
                sq.cout[s] = hC[s];
                ok = cudaMemcpyAsync(hS[s], S[s], sb, cudaMemcpyHostToDevice, st) == cudaSuccess &&
                     (!cb || cudaMemcpyAsync(ci, conv[s], cb, cudaMemcpyHostToDevice, st) == cudaSuccess);
            }
        }
        if (!ok) break;
        /* the layer's constants from the weight cache (each used before the next lookup: an uncached one is uploaded
         * into a scratch buffer the next reuses); A_log copied aside, as the prep launch reads it with dt_bias */
        const float *dv = nullptr;
        if (cu_rt_vec(b->A_log, H, &dv) || cu_copy_launch(A_log, dv, f * H, cudaMemcpyDeviceToDevice, st) != cudaSuccess)
            break;
        /* q, k, v: projection into raw, the next conv states from raw, the convolution into q / k / v */
        const df_weight *pw[3] = {b->q, b->k, b->v};
        const float *cw[3] = {b->conv_q, b->conv_k, b->conv_v};
        float *po[3] = {q, k, v};
        const int nbc = (int)(((int64_t)T * D + 255) / 256), nbs = (int)(((int64_t)n_seq * P * D + 255) / 256);
        for (int i = 0; i < 3 && ok; i++)
            ok = mm_dev(pw[i], dh, T, raw, st) == 0 &&
                 (P == 0 ||
                  cu_launch(kda_conv_state_kernel, nbs, 256, 0, st, sq, D, P, i, (const float *)raw) == cudaSuccess) &&
                 cu_rt_vec(cw[i], D * b->W, &dv) == 0 &&
                 cu_launch(kda_conv_kernel, nbc, 256, 0, st, sq, T, D, b->W, i, (const float *)raw, dv, po[i]) ==
                     cudaSuccess;
        if (!ok) break;
        if (mm_dev(b->f_a, dh, T, fa, st) || mm_dev(b->f_b, fa, T, graw, st) || mm_dev(b->beta, dh, T, bl, st)) break;
        if (b->g ? mm_dev(b->g, dh, T, gate, st) : (mm_dev(b->g_a, dh, T, fa, st) || mm_dev(b->g_b, fa, T, gate, st)))
            break;
        auto vec = [&](int i) -> const float * {
            const float *p = nullptr;
            return cu_rt_vec(i == 0 ? b->dt_bias : b->o_norm, i == 0 ? D : K, &p) ? nullptr : p;
        };
        if (launch_recurrence(st, sq, T, H, K, q, k, v, graw, bl, gate, A_log, vec, b->has_lb, b->lb, b->eps,
                              b->silu_gate, decay, beta, o) != cudaSuccess)
            break;
        if (mm_dev(b->o, o, T, dout, st)) break;
        /* the states without a device copy through a host buffer: a failed call leaves the caller's as they were */
        size_t ho = 0;
        for (int s = 0; s < n_seq && ok; s++) {
            if (kc[s]) continue;
            ok = cudaMemcpyAsync((char *)g_s_host + ho, hS[s], sb, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
                 (!cb || cudaMemcpyAsync((char *)g_s_host + ho + sb, hC[s], cb, cudaMemcpyDeviceToHost, st) == cudaSuccess);
            ho += sb + cb;
        }
        if (!ok || cudaMemcpyAsync(out, dout, f * (size_t)T * Do, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cu_rt_sync("kda block") != cudaSuccess) break;
        ho = 0;
        for (int s = 0; s < n_seq; s++) {
            if (kc[s]) {
                kc[s]->cur = kc_next(*kc[s]);
                kc[s]->dirty = 1;
                kept[s] = 1;
            } else {
                memcpy(S[s], (char *)g_s_host + ho, sb);
                memcpy(conv[s], (char *)g_s_host + ho + sb, cb);
                ho += sb + cb;
            }
        }
        rc = 0;
    } while (0);
    if (rc < 0) /* a new copy's slot may not hold the host's state, the current one */
        for (int s = 0; s < n_seq; s++)
            if (fresh[s]) kc_drop(g_kc.find(key[s]));
    return finish(rc, msg, st);
}
