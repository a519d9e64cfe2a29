/*
 * cpu_avx2_gemm.c — the AVX2 backend's matmul for more tokens than its fused kernels take (T > 8), every encoding
 * (interface: cpu_internal.h).
 *
 * y[T, rows] = x[T, cols] . W^T, rows [r0, r1) per task. Each block of GEMM_RB rows is decoded once into fp32
 * (avx2_decode_row: the exact weights of every other path), then multiplied with every token in register tiles of
 * up to 3 rows x 4 tokens (12 accumulators, 3 weight vectors and 1 activation vector: the 16 ymm registers), over K
 * tiles of GEMM_KC columns: for each K tile, each group of 3 rows (in L1) goes over every token group's activations
 * (the K tile's activations of all tokens, packed contiguous by the caller, in L2). The accumulators go to a per-task
 * buffer between K tiles, so each (row, token) is still one 8-lane accumulator over the 8-column chunks in column
 * order, then avx2_hsum256, then the cols % 8 tail by fmaf in column order: the AVX2 canonical order (cpu_avx2.c),
 * bitwise the result of a one-token call. The tile alone runs at ~98% of one core's FMA peak in L1; the whole call
 * at ~60-72% (T = 16..64, bench kernels); blocking tokens 8-32 at a time or K tiles of 128-1024 measured the same. MXFP4 / INT4 rows (cols % 32 == 0) are decoded by the fused kernels' table decoder
 * into their staged lane order (cpu_avx2_q4.c; ~2x the int8 route of avx2_decode_row), x comes permuted the same
 * way (avx2_gemm_staged: the caller permutes it), and each accumulator is put back in natural lane order before
 * its reduction, so the sums are the same.
 */
#include "cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include "cpu_avx2.h"
#include <math.h>
#include <stdlib.h>

#ifndef GEMM_RB
#define GEMM_RB 12 /* rows decoded per block (a multiple of 3) */
#endif
#ifndef GEMM_KC
#define GEMM_KC 512 /* columns per K tile (a multiple of 8) */
#endif

int avx2_gemm_rows(void) { return GEMM_RB; }

int avx2_gemm_staged(const df_weight *w) {
    return (w->type == DF_W_MXFP4 || w->type == DF_W_INT4_G32) && w->cols % 32 == 0;
}

/* R rows x G tokens over n8 chunks of 8 columns: w rows ws floats apart, x tokens xs floats apart, accumulators
 * acc[r * as + g] (loaded, updated in chunk order, stored back). */
AVX2_INLINE void gemm_tile(const float *w, int64_t ws, const float *x, int64_t xs, int64_t n8, __m256 *acc, int64_t as,
                           const int R, const int G) {
    __m256 a[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) a[r][g] = _mm256_load_ps((const float *)&acc[r * as + g]);
    for (int64_t i = 0; i < n8; i++) {
        __m256 wv[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + r * ws + 8 * i);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const __m256 xv = _mm256_loadu_ps(x + g * xs + 8 * i);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) a[r][g] = _mm256_fmadd_ps(wv[r], xv, a[r][g]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) _mm256_store_ps((float *)&acc[r * as + g], a[r][g]);
}

#define GEMM_TILE(R, G)                                                                                                \
    AVX2 static void gemm_tile_##R##_##G(const float *w, int64_t ws, const float *x, int64_t xs, int64_t n8,         \
                                         __m256 *acc, int64_t as) {                                              \
        gemm_tile(w, ws, x, xs, n8, acc, as, R, G);                                                               \
    }
GEMM_TILE(1, 1) GEMM_TILE(1, 2) GEMM_TILE(1, 3) GEMM_TILE(1, 4)
GEMM_TILE(2, 1) GEMM_TILE(2, 2) GEMM_TILE(2, 3) GEMM_TILE(2, 4)
GEMM_TILE(3, 1) GEMM_TILE(3, 2) GEMM_TILE(3, 3) GEMM_TILE(3, 4)

typedef void (*gemm_tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, __m256 *, int64_t);
static const gemm_tile_fn gemm_tiles[3][4] = {
    {gemm_tile_1_1, gemm_tile_1_2, gemm_tile_1_3, gemm_tile_1_4},
    {gemm_tile_2_1, gemm_tile_2_2, gemm_tile_2_3, gemm_tile_2_4},
    {gemm_tile_3_1, gemm_tile_3_2, gemm_tile_3_3, gemm_tile_3_4},
};

int64_t avx2_gemm_xk_floats(const df_weight *w, int T) {
    const int64_t cols8 = w->cols & ~(int64_t)7;
    return (cols8 + GEMM_KC - 1) / GEMM_KC * GEMM_KC * T;
}

/* xk[(kt * T + t) * GEMM_KC + c] = x[t, kt * GEMM_KC + c] for the cols & ~7 columns, each 8-column chunk in staged lane
 * order where avx2_gemm_staged(w): a K tile's activations for all tokens are one contiguous run, so a token group's
 * rows are GEMM_KC floats apart and not a power-of-two multiple of 4 KiB (rows cols floats apart fell into the same L1
 * sets). */
AVX2 void avx2_gemm_pack_x(const df_weight *w, const float *x, int T, float *xk) {
    const int64_t cols = w->cols, cols8 = cols & ~(int64_t)7;
    const __m256i perm = avx2_gemm_staged(w) ? _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7) : _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t kc = 0, kt = 0; kc < cols8; kc += GEMM_KC, kt++) {
        const int64_t n = cols8 - kc < GEMM_KC ? cols8 - kc : GEMM_KC;
        for (int t = 0; t < T; t++)
            for (int64_t c = 0; c < n; c += 8)
                _mm256_storeu_ps(xk + (kt * T + t) * GEMM_KC + c,
                                 _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + t * cols + kc + c), perm));
    }
}

AVX2 void avx2_gemm_mm(const df_weight *w, const float *x, const float *xk, int T, float *y, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, rows = w->rows, cols8 = cols & ~(int64_t)7;
    /* decoded rows 64 bytes more than a multiple of 64 apart, so the block's rows do not share L1 sets */
    const int64_t st = (cols + 15) / 16 * 16 + 16;
    const int64_t tp = (T + 3) / 4 * 4; /* accumulators per row */
    const int staged = avx2_gemm_staged(w);
    float *wb = cpu_scratch(CPU_SCRATCH_W, sizeof(float) * (size_t)(GEMM_RB * st));
    __m256 *acc = cpu_scratch(CPU_SCRATCH_ACC, sizeof(__m256) * (size_t)(GEMM_RB * tp));
    if (!wb || !acc) abort(); /* a few hundred KiB per thread; nothing sensible to do without them */
    for (int64_t rb = r0; rb < r1; rb += GEMM_RB) {
        const int nr = r1 - rb < GEMM_RB ? (int)(r1 - rb) : GEMM_RB;
        for (int k = 0; k < nr; k++)
            if (staged) avx2_q4_decode_row_staged(w, rb + k, wb + k * st);
            else avx2_decode_row(w, rb + k, wb + k * st);
        for (int64_t i = 0; i < nr * tp; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t kc = 0, kt = 0; kc < cols8; kc += GEMM_KC, kt++) {
            const int64_t n8 = (cols8 - kc < GEMM_KC ? cols8 - kc : GEMM_KC) / 8;
            for (int r = 0; r < nr; r += 3) {
                const int R = nr - r < 3 ? nr - r : 3;
                for (int t = 0; t < T; t += 4) {
                    const int G = T - t < 4 ? T - t : 4;
                    gemm_tiles[R - 1][G - 1](wb + r * st + kc, st, xk + (kt * T + t) * GEMM_KC, GEMM_KC, n8,
                                             acc + r * tp + t, tp);
                }
            }
        }
        for (int k = 0; k < nr; k++)
            for (int t = 0; t < T; t++) {
                float s = avx2_hsum256(staged ? avx2_q4_unstage(acc[k * tp + t]) : acc[k * tp + t]);
                for (int64_t c = cols8; c < cols; c++) s = fmaf(wb[k * st + c], x[t * cols + c], s);
                y[(int64_t)t * rows + rb + k] = s;
            }
    }
}

#else
int avx2_gemm_rows(void) { return 0; }
int avx2_gemm_staged(const df_weight *w) { (void)w; return 0; }
int64_t avx2_gemm_xk_floats(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_gemm_pack_x(const df_weight *w, const float *x, int T, float *xk) { (void)w; (void)x; (void)T; (void)xk; }
void avx2_gemm_mm(const df_weight *w, const float *x, const float *xk, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)x; (void)xk; (void)T; (void)y; (void)r0; (void)r1;
}
#endif
