/*
 * cpu_internal.h — pieces shared by the CPU backends: the scalar reference
 * ops (cpu_scalar.c), the row-parallel matmul driver (cpu_matmul.c), and the
 * SIMD variants' entry points (cpu_avx2.c, cpu_avx512.c).
 */
#ifndef DF_KERNELS_CPU_INTERNAL_H
#define DF_KERNELS_CPU_INTERNAL_H

#include "kernels/backend.h"

typedef void (*cpu_decode_fn)(const df_weight *w, int64_t row, float *out);
typedef float (*cpu_dot_fn)(const float *a, const float *b, int64_t n);
/* Optional fused kernel: y[r] for rows [r0, r1) of W times one vector x (T == 1).
 * Returns 0 if it does not handle this weight type (the driver then decodes rows). */
typedef int (*cpu_matvec_fn)(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1);

/* Optional: four dot products of one row with x[0..3] (x rows `stride` floats apart) into out[4]. */
typedef void (*cpu_dot4_fn)(const float *row, const float *x, int64_t stride, int64_t n, float *out);

/* Optional: dot4 for two rows at once: out[0..3] = row0 . x[0..3], out[4..7] = row1 . x[0..3]. */
typedef void (*cpu_dot4x2_fn)(const float *row0, const float *row1, const float *x, int64_t stride, int64_t n, float *out);

/* Row-parallel y = x W^T: decode each row once (thread-local buffer), dot with all T tokens
 * (four at a time with dot4 when given). */
void cpu_matmul_driver(df_pool *pool, const df_weight *w, const float *x, int T, float *y,
                       cpu_decode_fn decode, cpu_dot_fn dot, cpu_matvec_fn matvec, cpu_dot4_fn dot4,
                       cpu_dot4x2_fn dot4x2);

/* Frees the calling thread's matmul row buffer and scratch (pool workers call it when they exit). */
void cpu_matmul_thread_exit(void);

/* Per-thread scratch for the blocked kernels: slot s (0 <= s < CPU_SCRATCH_SLOTS) of the calling
 * thread, at least `bytes` long, 64-byte aligned; contents are kept while the size fits (grown
 * buffers start uninitialized). NULL on allocation failure. Freed when the thread exits. */
enum { CPU_SCRATCH_X = 0,      /* a call's staged activations (the calling thread's, read by all workers) */
       CPU_SCRATCH_W = 1,      /* a task's decoded weight tile */
       CPU_SCRATCH_ACC = 2,    /* a task's partial sums */
       CPU_SCRATCH_PF = 3,     /* a task's prefetch plan */
       CPU_SCRATCH_SLOTS = 4 };
void *cpu_scratch(int slot, size_t bytes);

/* Work size (rows x cols x T) under which a matmul runs on the calling thread: waking the pool
 * costs more than the work. */
#define CPU_SERIAL_WORK 131072

/* Work (weights x min(T, 8) tokens) per pool chunk of a matmul: a chunk's first pass reads bytes its kernel could not
 * prefetch (the kernels prefetch only within their own rows), so a chunk must be long enough for that wait to be a
 * small share of it; but a thread that the machine delays holds a larger share of a call the fewer chunks there are.
 * Measured (bench/RESULTS.md, "Pool chunks of ~4M weights x tokens"): on the Zen 5 dev VM at 2 threads, 4M against the
 * earlier 128K (T > 1) / 512K (T = 1) made MXFP4 T = 2..8 calls 1.15-1.5x faster; on the H100 host's 16 cores, at
 * least 8 chunks per thread was faster than 4 for most kernels and shapes. */
#define CPU_CHUNK_WORK ((int64_t)4 << 20)

/* Rows per pool chunk of a matmul whose kernel runs passes of rb rows (cpu_avx512.c, cpu_avx2.c): all rows below
 * CPU_SERIAL_WORK or with one thread; else ~CPU_CHUNK_WORK weights x tokens per chunk, but >= 8 chunks per thread
 * when the rows allow (balance), rounded up to whole passes. */
int64_t cpu_chunk_rows(df_pool *pool, const df_weight *w, int T, int rb);

/* AVX2 fused kernels for 1 <= T <= 8 tokens (cpu_avx2_q4.c, cpu_avx2_fp8.c, cpu_avx2_dense.c), chosen per call by
 * avx2_matmul (cpu_avx2.c): rows [r0, r1) of y [T, rows] = x [T, cols] . W^T, each weight byte read once per call,
 * each (row, token) summed in the AVX2 backend's canonical order (one 8-lane fp32 accumulator over the 8-column
 * chunks in column order, avx2_hsum256, then the cols % 8 tail by fmaf in column order; cpu_avx2.c, cpu_avx2.h),
 * so every result is bitwise that of the decode_row + dot path. x: T rows `cols` floats apart (4-bit: staged by
 * avx2_q4_stage).
 * *_rows(w, T): the row count avx2_matmul's chunks are whole multiples of (a pass of rows, or a larger tile the
 * kernel wants per chunk), or 0 where the kernel does not handle (w, T); the kernels take any [r0, r1). */
int avx2_q4_rows(const df_weight *w, int T);   /* MXFP4 / INT4 g32 with cols % 32 == 0 */
void avx2_q4_stage(const float *x, int T, int64_t cols, float *xs);
void avx2_q4_mm(const df_weight *w, const float *xs, int T, float *y, int64_t r0, int64_t r1);
int avx2_fp8_rows(const df_weight *w, int T);  /* FP8 block 128 */
void avx2_fp8_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1);
int avx2_dense_rows(const df_weight *w, int T); /* F32 / BF16 / F16 */
void avx2_dense_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1);

/* AVX2, T > 8 tokens, every encoding (cpu_avx2_gemm.c): rows decoded by avx2_decode_row in blocks of
 * avx2_gemm_rows() rows, register tiles of 3 rows x 4 tokens over K tiles; the canonical order as above. The caller
 * packs x once per call (avx2_gemm_pack_x into avx2_gemm_xk_floats(w, T) floats); x itself gives the cols % 8 tail. */
int avx2_gemm_rows(void);
int avx2_gemm_staged(const df_weight *w); /* 1: MXFP4 / INT4 rows decoded in the q4 kernels' staged lane order */
int64_t avx2_gemm_xk_floats(const df_weight *w, int T);
void avx2_gemm_pack_x(const df_weight *w, const float *x, int T, float *xk);
void avx2_gemm_mm(const df_weight *w, const float *x, const float *xk, int T, float *y, int64_t r0, int64_t r1);
void avx2_q4_decode_row_staged(const df_weight *w, int64_t r, float *out); /* cpu_avx2_q4.c */
/* AVX2 row decoder (cpu_avx2.c): row r of W as cols fp32 values, the exact weights of every AVX2 path */
void avx2_decode_row(const df_weight *w, int64_t r, float *out);

/* scalar reference */
void cpu_scalar_decode_row(const df_weight *w, int64_t row, float *out);
float cpu_scalar_dot(const float *a, const float *b, int64_t n);
void cpu_scalar_axpy(float *y, float a, const float *x, int64_t n);
void cpu_scalar_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
void cpu_scalar_silu_mul(float *out, const float *g, const float *u, int64_t n);
/* In-place softmax over n values: m = the largest (NaN skipped), x[i] = cpu_expf(x[i] - m) summed in order in double,
 * then each times (float)(1 / sum). The SIMD backends' softmax give the same bits. */
void cpu_scalar_softmax(float *x, int64_t n);
/* e^x for fp32, evaluated as glibc's expf is (2^(k/32) from a 32-entry table times a cubic in the remainder r, in
 * double; the table below, the constants here): its results equal glibc 2.36's expf on x86-64 for every non-NaN
 * float (checked exhaustively), and they do not depend on the C library. Special cases:
 * -inf -> 0, NaN / +inf -> x + x, x > 88.72 -> inf, x < -103.97 -> 0. The SIMD softmax kernels evaluate the same
 * operations lane by lane (cpu_scalar.c is built without FP contraction, and the FMAs are explicit). */
float cpu_expf(float x);
/* cpu_scalar_softmax with its bits, SIMD (cpu_softmax.c; x86-64, the caller checks the CPU's features) */
void cpu_avx512_softmax(float *x, int64_t n);
void cpu_avx2_softmax(float *x, int64_t n);
extern const uint64_t cpu_exp2_tab[32];
#define CPU_EXPF_BIG 0x42b                           /* top 12 bits of 88.0f: at or above, the special cases */
#define CPU_EXPF_INVLN2N (0x1.71547652b82fep+0 * 32) /* 32 / ln 2 */
#define CPU_EXPF_SHIFT 0x1.8p+52                     /* adding it rounds to an integer in the low mantissa bits */
#define CPU_EXPF_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define CPU_EXPF_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define CPU_EXPF_C2 (0x1.62e42ff0c52d6p-1 / 32)
/* decode elements [c0, c1) of a row (used for SIMD tails; c0, c1 multiples of the block where one applies) */
void cpu_scalar_decode_range(const df_weight *w, int64_t row, int64_t c0, int64_t c1, float *out);

extern const df_backend df_backend_cpu_scalar;
extern const df_backend df_backend_cpu_avx2;
extern const df_backend df_backend_cpu_avx512;

#endif
