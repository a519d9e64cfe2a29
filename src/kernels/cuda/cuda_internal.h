/*
 * cuda_internal.h — pieces shared by the CUDA sources: the kernel launchers
 * (cuda_matmul.cu, cuda_ops.cu) used by the runtime (cuda_runtime.cu).
 */
#ifndef DF_KERNELS_CUDA_INTERNAL_H
#define DF_KERNELS_CUDA_INTERNAL_H

#include "kernels/cuda.h"

#include <cuda_runtime.h>

/* y [T, rows] = x [T, cols] W^T with W's data/scale arrays, x and y in device memory (cuda_matmul.cu). */
cudaError_t cu_matmul_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                             const float *x, int T, float *y, cudaStream_t st);

/* One token's y1 = W1 x and y2 = W2 x for two matrices of one encoding on one input, W1 [rows1, cols] and W2
 * [rows2, cols] (a shared expert's gate and up; an MLA layer's q_a and kv_a), in one launch, each with the bits
 * cu_matmul_launch gives it (the K-split kernel's code and its own split per row); cudaErrorNotSupported (nothing
 * launched) where cu_matmul_launch would not take the K-split kernel for both, or for encodings other than BF16 and
 * FP8_B128: then launch them one by one. */
cudaError_t cu_matmul2_launch(df_wtype type, const void *d1, const void *s1, int64_t rows1, const void *d2,
                              const void *s2, int64_t rows2, int64_t cols, const float *x, float *y1, float *y2,
                              cudaStream_t st);

/* Kernel choice (cuda_matmul.cu; every choice gives the same bits; 0 = automatic, 1 = the one-row-per-warp
 * kernel): one token: 2 = tiled, 2 rows per warp, 4 warps; 4 = 4 rows per warp, 4 warps; 8 = 2 rows per warp,
 * 8 warps. T >= 2: the block tile, 2 = 8 rows x 8 tokens, 4 = 32 x 8 (8 warps), 8 = 16 x 8 (registers for
 * three blocks per SM). */
void cu_set_matvec_rows(int n);
void cu_set_tile(int n);
/* The variant chosen for T rows (cu_set_matvec_rows for T = 1, cu_set_tile else); 0 = automatic. */
int cu_get_variant(int T);

/* Matrices of at most 2048 rows (not on the tensor-core kernel) walk each row with several warps, K split in a
 * canonical order of their own for every T (cuda_matmul.cu mm_split_kernel); off (env DF_CUDA_SPLIT=0): the kernels
 * above, whose order differs, so the switch changes bits (for every T alike). Default on. */
void cu_set_split(int on);

/* MXFP4 or BF16 weights (cols % 32 == 0) on the tensor cores (cuda_mma.cu): exact bf16 operands (the weights;
 * the activations split into three bf16 parts), fp32 accumulation in a canonical order of its own. variant
 * (0 = automatic; 1, 2, 4, 8 = tile shapes, the same bits): 1 = 16 rows x 2 tokens per warp, 2 = 32 x 8,
 * 4 = 16 x 8, 8 = 32 x 2 (automatic: 1 up to 2 tokens, 4 up to 8, else 2). */
cudaError_t cu_mma_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                          const float *x, int T, float *y, int variant, cudaStream_t st);
/* The encodings (bit mask 1 << df_wtype; only MXFP4 and BF16 count) whose matmuls run on the tensor-core kernel;
 * the others run on the fp32-FMA kernels of cuda_matmul.cu (other bits). Default: MXFP4. */
void cu_set_mma(unsigned mask);
unsigned cu_get_mma(void);
/* The most K slices of the tensor-core kernel (1, 2 = the default, 4 or 8; env DF_CUDA_MMA_KS): part of its
 * canonical order, so a different value gives different bits (for every T alike). */
void cu_set_mma_ks(int n);
/* One weight of a grouped tensor-core launch: data / scale [rows, cols] (device), input x [T, cols] (device fp32),
 * output y [T, rows] (device); u (NULL: none) [T, cols] beside x: the input is the launch's activation of (x, u). */
typedef struct {
    const void *data, *scale;
    const float *x;
    float *y;
    int T;
    const float *u;
} cu_mma_item;
/* n matmuls of one encoding (MXFP4 or BF16) and one shape [rows, cols] (cols % 32 == 0, T <= 256 each) in a few
 * launches: the distinct inputs (items sharing an x pointer must share T) split once, then one kernel over every
 * item's tiles (32 items per launch). Each y is bitwise what cu_mma_launch gives for that item alone (the same tile
 * code and K slices; the grouping only changes which block computes a tile). Items with u set take act(x, u) as
 * their input (act 0 = SwiGLU, 1 = SiTU with beta / lb; cuda_act.cuh), computed as the input is split: the bits of
 * the activation kernel followed by this launch on its output. */
cudaError_t cu_mma_group_launch(df_wtype type, int64_t rows, int64_t cols, int n, const cu_mma_item *items,
                                cudaStream_t st, int act = 0, float beta = 0.0f, float lb = 0.0f);
/* A grouped launch's items as the kernel reads them: weights d / s [rows, cols], input rows from xrow[i] of the split
 * input, T[i] tokens, output y[i] [T[i], rows]; at most CU_MMA_MAXG items. */
#define CU_MMA_MAXG 32
typedef struct {
    const uint8_t *d[CU_MMA_MAXG], *s[CU_MMA_MAXG];
    float *y[CU_MMA_MAXG];
    int xrow[CU_MMA_MAXG], T[CU_MMA_MAXG];
} cu_mma_group;
/* cu_mma_group_launch with the items in device memory (dg, written by an earlier kernel on st; n items, every T[i]
 * <= tmax <= 256): x [xT, cols] (device fp32) split once, the items' xrow[] indexing its rows. The same tile code and
 * K slices as cu_mma_launch: each y has its bits. u (NULL: none) [xT, cols]: the input is act(x, u) as in
 * cu_mma_group_launch. */
/* xs_in (NULL: none): x's split already (cuda_split.cuh, xT rows, written earlier on st): no split is launched. */
cudaError_t cu_mma_group_dev_launch(df_wtype type, int64_t rows, int64_t cols, const float *x, int xT, int n, int tmax,
                                    const cu_mma_group *dg, cudaStream_t st, const float *u = NULL, int act = 0,
                                    float beta = 0.0f, float lb = 0.0f, const void *xs_in = NULL);

/* Element-wise / per-row ops on device arrays (cuda_ops.cu); contracts as in kernels/cuda.h. */
cudaError_t cu_rmsnorm_launch(float *out, const float *x, const float *w, int T, int64_t n, float eps, cudaStream_t st);
cudaError_t cu_silu_mul_launch(float *out, const float *g, const float *u, int64_t n, cudaStream_t st);
cudaError_t cu_situ_mul_launch(float *out, const float *g, const float *u, int64_t n, float beta, float lb,
                               cudaStream_t st);
cudaError_t cu_softmax_launch(float *x, int T, int64_t n, cudaStream_t st);
cudaError_t cu_rope_launch(float *out, const float *x, int T, int dim, const float *inv_freq, float attention_factor,
                           const int64_t *pos, cudaStream_t st);
/* df_backend.mla_block's row steps (cuda_ops.cu), T rows each: x_out = x + a, h = rmsnorm(x_out) * w (n per row; x_out
 * may be x; x_out2, when not NULL, gets x_out too and may be x); and the latent KV rows: c_new = rmsnorm(kva[t][:kvl]) * kv_norm into dst_c[t] and ret_c [T, kvl],
 * kpe_new = rope(kva[t][kvl:], cs[t]) into dst_p[t] and ret_p [T, dr] (cs [T, dr] cos/sin pairs; NULL: no rotary),
 * q [T, H, dn + dr] = q_raw with each head's rope part roped by cs[t]. dst_c / dst_p: device arrays of T device
 * pointers. add_rmsnorm's xs (NULL: none; n a multiple of 32): h's split for the tensor-core kernels (cuda_split.cuh,
 * n * 6 bytes a row) written there too. */
cudaError_t cu_add_rmsnorm_launch(float *x_out, const float *x, const float *a, const float *w, int T, int64_t n,
                                  float eps, float *h, cudaStream_t st, float *x_out2 = NULL, void *xs = NULL);
cudaError_t cu_kv_rows_launch(const float *kva, int T, int kvl, int dr, const float *kv_norm, float eps, const float *cs,
                              float *const *dst_c, float *const *dst_p, float *ret_c, float *ret_p, const float *q_raw,
                              float *q, int H, int dn, cudaStream_t st);
/* One row's latent cache by value, for a one-token call whose arguments need no upload: c [npos, kvl] and k_pe
 * [npos, dr] in device memory (a mirror), the row's own entries at position npos - 1. */
struct cu_row1 {
    float *c, *p;
    int npos;
};
/* A row's RoPE cos / sin pairs by value ([dr] floats, dr <= CU_CS1_MAX) */
#define CU_CS1_MAX 256
struct cu_cs1 {
    float v[CU_CS1_MAX];
};
/* cu_kv_rows_launch for T = 1 with the destinations and cs by value (has_cs 0: no rotary): the same bits. ret_c /
 * ret_p may be pinned host memory (the kernel writes it). */
cudaError_t cu_kv_row1_launch(const float *kva, int kvl, int dr, const float *kv_norm, float eps, const cu_row1 &r1,
                              const cu_cs1 &cs, int has_cs, float *ret_c, float *ret_p, const float *q_raw, float *q,
                              int H, int dn, cudaStream_t st);
/* resid[d] += (sum over i < n of fma chains w[i] y[i][d] from 0, in order) + sh[d] (sh NULL: nothing) for d < D: the
 * host's MoE combine (moe.c: axpy per expert in ascending order, then the shared expert, then the residual add) with
 * fused multiply-adds as the AVX2 / AVX-512 axpy does them; n = 0: resid[d] += sh[d] (a dense MLP's output, as
 * forward adds it). n <= CU_COMBINE_MAX. */
#define CU_COMBINE_MAX 32
cudaError_t cu_combine_resid_launch(float *resid, int64_t D, int n, const float *const *y, const float *w, const float *sh,
                                    cudaStream_t st);
/* The same combine with its arguments in device memory (written by an earlier kernel on st): y[i], w[i] for i < n,
 * sh (NULL: none). */
typedef struct {
    const float *y[CU_COMBINE_MAX];
    float w[CU_COMBINE_MAX];
    const float *sh;
    int n;
} cu_combine_args;
cudaError_t cu_combine_resid_dev_launch(float *resid, int64_t D, const cu_combine_args *da, cudaStream_t st);
/* Device routing of one token's MoE (cuda_moe.cu): at most CU_ROUTE_MAXE routed experts, CU_ROUTE_MAXG groups and
 * top-CU_ROUTE_MAXK (2 K items per grouped launch). The route kernel's output in device memory: the grouped launches'
 * items (gate, up of pick i as items 2i, 2i + 1 into rows i of g, u; down of pick i from row i of g into row i of y),
 * the combine's arguments, and the picks in ascending id order with their weights. */
#define CU_ROUTE_MAXE 1024
#define CU_ROUTE_MAXG 64
#define CU_ROUTE_MAXK 16
typedef struct {
    cu_mma_group gu, dn;
    cu_combine_args cb;
    alignas(16) int ids[CU_ROUTE_MAXK]; /* aligned: cu_copy_launch copies them out */
    float w[CU_ROUTE_MAXK];
} cu_moe_route_out;
/* The routing alone (engine/moe.c moe_route's picks and weights, bitwise): logits [E], bias [E] or NULL (device);
 * G groups (<= 1: none), topk_group kept; tab [E][6] the experts' device arrays (gate data, scale, up data, scale,
 * down data, scale; NULL entries allowed when nothing runs them); g, u [K, I], y [K, D] the MLPs' scratch, sh the
 * shared expert's output or NULL; into o (device); ids_out (NULL: none; device or pinned host memory): the picks' ids
 * written there too. */
cudaError_t cu_route_launch(const float *logits, const float *bias, int E, int K, int G, int topk_group, int renorm,
                            float scale, const void *const *tab, float *g, float *u, float *y, int64_t I, int64_t D,
                            const float *sh, cu_moe_route_out *o, cudaStream_t st, int *ids_out = NULL);
/* The routing, then the picks' MLPs on h2 [D] (grouped tensor-core launches: gate / up of encoding tgu [I, D], down
 * of tdn [D, I]; act / beta / lb as moe_resid's), then resid [D] += combine (cu_combine_resid: ascending ids, then
 * sh): the bits of moe_route + moe_resid on the same logits and h2. Queued on st; join (NULL: none): an event st waits
 * for before the combine (sh written on another stream). h2xs (NULL: none): h2's split (cuda_split.cuh) written
 * earlier on st, used instead of splitting h2 here. */
cudaError_t cu_moe_dev_launch(const float *logits, const float *bias, int E, int K, int G, int topk_group, int renorm,
                              float scale, const void *const *tab, df_wtype tgu, df_wtype tdn, int64_t I, int64_t D,
                              const float *h2, float *g, float *u, float *y, const float *sh, int act, float beta, float lb,
                              float *resid, cu_moe_route_out *o, cudaEvent_t join, cudaStream_t st, int *ids_out = NULL,
                              const void *h2xs = NULL);
/* With the mutex held, in an mla_block call after cu_rt_shared_start: m's device routing and MoE (m->K = 0: only the
 * started dense MLP, added as forward adds it) for the caller key
 * (df_mla_block.moe) on logits [E] and h2 [D] (device), into that key's residual; bias_dev: m->bias on the device or
 * NULL. 1: queued (m->bytes set; the picks reach moe_routed once a later call synchronises), 0: declined (a layer
 * not wholly resident on the tensor-core path, no started shared expert where the layer has one, shapes past the
 * limits, DF_CUDA_TRACE=1), -1: a CUDA error (recorded). h2xs (NULL: none): h2's split (cuda_split.cuh) written
 * earlier on the stream. */
int cu_rt_moe_route(uint64_t key, df_moe_dev *m, const float *bias_dev, const float *logits, const float *h2,
                    const void *h2xs = NULL);

/* dst = src, n bytes, queued on st (kind as cudaMemcpyAsync's). Copies of at most CU_COPY_KERNEL_MAX bytes between
 * device memory and pinned host memory from cudaHostAlloc (addressable from kernels under unified addressing, CUDA
 * programming guide "Unified Virtual Address Space"), both 16-byte aligned, run as a kernel: a copy-engine operation
 * between two kernels of the stream costs ~5 us of device idle on each side and ends a chain of programmatic
 * dependent launches; others, and all with g_cu_copy_kernel = 0 (DF_CUDA_COPY_KERNEL=0), by cudaMemcpyAsync.
 * Never for pageable host memory. */
#define CU_COPY_KERNEL_MAX ((size_t)256 << 10)
extern int g_cu_copy_kernel;
cudaError_t cu_copy_launch(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t st);

/* Fill n bytes with a fixed pseudo-random pattern (benchmark weights); AND every 32-bit word with mask. */
cudaError_t cu_fill_random(void *p, size_t n, uint32_t seed, cudaStream_t st);
cudaError_t cu_and_words(void *p, size_t n, uint32_t mask, cudaStream_t st);

/* The runtime (cuda_runtime.cu) for the other sources' entry points (cuda_attn.cu): cu_rt_lock = 0 when a device is
 * ready and the one mutex is now held (every entry point takes turns on it), -1 without a device (the reason in
 * df_cuda_last_error); cu_rt_unlock releases it. With the mutex held: cu_rt_stream, the one stream; cu_rt_weight,
 * the device copy of w's data / scale arrays from the weight cache (as matmul finds them: cached by dev_key or host
 * address, else copied into a scratch buffer for this call, which the next uncached weight reuses in stream order:
 * use each weight, its kernels queued, before looking up the next; 0, or -1 with the error recorded); cu_rt_error records
 * msg for df_cuda_last_error and returns -1. */
int cu_rt_lock(void);
void cu_rt_unlock(void);
cudaStream_t cu_rt_stream(void);
/* An entry point's closing synchronisation of the stream; with DF_CUDA_TRACE, an event recorded first, ending the
 * stage `stage` (a string literal) and the entry point's device time. cu_rt_mark: a stage of the current entry point
 * ends here (DF_CUDA_TRACE only; string literal). */
cudaError_t cu_rt_sync(const char *stage);
/* cuda_attn.cu, with the mutex held: the cache rows of the MLA blocks that returned without waiting (df_mla_block.moe)
 * whose copies have completed, written into the host caches now (cu_rt_sync_event calls it after every wait, so a
 * call that waits for the whole stream leaves none pending). */
void cu_attn_settle(void);
/* cuda_attn.cu, with the mutex held: the device copy of the last one-row MLA block's h2 when host is the array that
 * block returned it in (and no attention call came since), else NULL. The same values: moe_resid takes it instead of
 * copying the host's h2 in. */
const float *cu_attn_h2(const float *host);
/* cuda_attn.cu: DF_CUDA_KV_MIRROR (cuda_env.h) as a byte cap, for the latent caches' mirrors and the KDA states'
 * copies alike: df_cuda_env_kv_mirror's return (1 on, 0 off, -1 invalid with the reason in why), *cap the size given,
 * for on without one 1/8 of the device's memory (0 when off, invalid or that cannot be read). */
int cu_kv_mirror_cap(size_t *cap, char *why, size_t whylen);
/* cuda_attn.cu: the device memory the KV mirrors may still take (DF_CUDA_KV_MIRROR's cap less their bytes); mutex held. */
size_t cu_attn_mirror_room(void);
void cu_rt_mark(const char *name);
int cu_rt_weight(const df_weight *w, const void **data, const void **scale);
/* With the mutex held: the device copy of an fp32 vector of n values (a norm's weight, a KDA layer's constants), found
 * and kept like a spine weight by cu_rt_weight (the same rule: use it, its kernels queued, before the next lookup). */
int cu_rt_vec(const float *v, int64_t n, const float **dv);
/* cuda_kda.cu, with the mutex held: forget the device copies of the KDA states of sequence uid (keys k with
 * k >> 8 == uid; 0: all); cu_kda_live: whether any exists (read without the mutex). */
void cu_kda_forget(uint64_t uid);
int cu_kda_live(void);
/* With the mutex held: one token's ya = A x and yb = B x (x, ya, yb device arrays) in one launch (cu_matmul2_launch,
 * the bits of each matmul alone) when A and B share encoding and width and both are in the weight cache already
 * (looking both up then uploads and evicts nothing): 1 = queued on st; 0 = not (nothing queued: launch them one by
 * one); -1 = a CUDA error (recorded). */
int cu_rt_matmul2(const df_weight *a, const df_weight *b, const float *x, float *ya, float *yb, cudaStream_t st);
/* With the mutex held: the device residual stream of the caller with this key (an engine), at least n floats, or
 * NULL (error recorded). need_valid: it must exist, hold n floats and have been written by an mla_block call (its
 * x_out), else NULL; otherwise it is made or grown as needed (then not valid) and *valid (when not NULL) points at
 * its flag, which the caller sets once it has queued the write. mla_block writes each call's x_out there and reads
 * its x from there when given none; moe_resid adds a token's MoE output into it. At most 16 callers' streams are
 * kept (the least recently used one goes). */
float *cu_rt_resid(uint64_t key, size_t n, int need_valid, int **valid);
/* With the mutex held, in an mla_block call after its copy-out is queued: the shared expert of the moe_resid call
 * that follows (gate, up, down, act / beta / lb as moe_resid's) on h2 [gate.cols] (device), queued after an event
 * recorded now (on the side stream when its three weights are cached, unless DF_CUDA_SIDE_STREAM=0; the consumers
 * call cu_rt_sh_join first), its output kept with the key's residual until that call takes it. 1: started, *ev the event (the
 * call's closing synchronisation waits for it, not for the shared expert); 0: not (no residual for the key, or
 * DF_CUDA_TRACE=1); -1: a CUDA error (recorded). cu_rt_shared_drop: the key's next moe_resid has no started one. */
int cu_rt_shared_start(uint64_t key, const df_weight *g, const df_weight *u, const df_weight *d, int act, float beta,
                       float lb, const float *h2, cudaEvent_t *ev);
void cu_rt_shared_drop(uint64_t key);
/* With the mutex held: the main stream waits (on the device) for a started shared expert's side-stream kernels, when
 * any are queued and it has not yet. Called before anything on the main stream reads that output or overwrites what
 * those kernels read (its h2 in the attention staging, a weight the cache drops). */
void cu_rt_sh_join(void);
/* cu_rt_sync, waiting for the event ev (recorded on the stream) instead of the whole stream; ev NULL: cu_rt_sync. */
cudaError_t cu_rt_sync_event(const char *stage, cudaEvent_t ev);
/* With the mutex held: the number of the current entry point's call (each cu_rt_lock or entry point begins a new one),
 * and cu_rt_sync_event for an event recorded by call `upto` or later: the device routings queued by calls up to
 * `upto` count as arrived (those of later calls may not have). */
uint64_t cu_rt_call(void);
cudaError_t cu_rt_sync_upto(const char *stage, cudaEvent_t ev, uint64_t upto);
int cu_rt_error(const char *msg);

#endif
