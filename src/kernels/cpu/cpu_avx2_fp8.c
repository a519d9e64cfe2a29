/*
 * cpu_avx2_fp8.c — AVX2 fused FP8 (E4M3, 128x128 block scales) matmul kernels for 1 <= T <= 8 tokens
 * (interface: cpu_internal.h): rows [r0, r1) of y [T, rows] = x [T, cols] . W^T without a row buffer.
 *
 * Weights: rows of `cols` bytes (sign, 4 exponent bits with bias 7, 3 mantissa bits; 0x7f / 0xff are NaN and do not
 * occur), one fp32 scale per 128x128 block: scale[(r / 128) * ((cols + 127) / 128) + c / 128]. avx2_decode_row
 * (cpu_avx2.c) gives weight = round(value x scale) (the exact fp8 value times the exact scale, rounded once), and
 * each (row, token) is summed in the AVX2 canonical order (one 8-lane accumulator over the 8-column chunks in column
 * order, hsum256, then the cols % 8 tail by fmaf in column order). These kernels give the same bits:
 *
 *  - Decode without F16C: a code's 7 magnitude bits put at fp32 bits 20..26 and its sign at bit 31 are, read as an
 *    fp32, exactly value x 2^-120 (exponent field = e, mantissa = m / 8; e = 0 gives the fp32 subnormal m / 8 x
 *    2^-126 = e4m3's m / 8 x 2^-6 times 2^-120). Times s' = s x 2^120, exact whenever s' is finite (a power-of-2
 *    scaling; a subnormal s only becomes normal), that is the exact product value x s rounded once: the bits of the
 *    F16C decoder and of fp8 table x s. The multiply is vfmadd(raw, s', -0.0), which equals vmulps bit for bit
 *    (signed zeros included): on Zen 3, vmulps of a vector mixing subnormal and normal lanes that was made by
 *    integer instructions runs ~1.6x slower in this loop (e4m3 subnormals are 1/16 of random codes), vfmadd does not.
 *    A block whose s' is not finite (|s| >= 2^8; inf / NaN) is decoded from the exact table (fp8 value x s, as the
 *    decoder's own fallback) for every row of the pass.
 *  - Bit placement, with no cross-lane operation: the 8 codes of a chunk are broadcast to every qword (vpbroadcastq,
 *    a free load); one vpshufb puts code j in the top byte of dword j (low lane: codes 0..3, high lane: 4..7) so each
 *    vector holds the chunk's 8 columns in natural lane order; an arithmetic shift right by 4 moves the code to bits
 *    20..27 and copies the sign into 27..31, and vpand 0x87f00000 keeps bits 20..26 and 31. Accumulator lane l thus
 *    gets exactly the products of canonical lane l, chunk after chunk: no permutation anywhere. The shift is vpsrad
 *    (shift / shuffle pipes), or for T <= 2 vpmulhw by 2^12 in the high words (the same bits: the low words are 0),
 *    which moves it to the multiply pipe while the FMA pipes have room.
 *    Per 8 weights and row: 1 vpshufb + 1 shift + 1 vpand + 1 vfmadd (the scale) + T vfmadd.
 *  - The cols % 8 tail and the per-block fallback use avx2_fp8_table[code] x s (the decoder's fp32 multiply) and
 *    fmaf.
 *
 * Passes: R rows x T tokens of accumulators in registers, each chunk of each row decoded once (the R weight vectors
 * first, then token by token, which keeps GCC from spilling accumulators) and FMA'd against all T tokens: R = 4 at
 * T = 1, 3 at T = 2, 2 for T = 3..4, 1 for T = 5..8 (4 to 8 accumulators: independent FMA chains, no spills).
 * T <= 2 runs whole rows, prefetching the next pass's rows one pass ahead (two lines per row per 128 columns).
 * T >= 3 is FMA-bound, but its T activation vectors per chunk and R rows do not fit L1 for long rows (and with a
 * row stride of cols floats, often a multiple of 4 KiB, the T rows share one L1 set): it runs tiles of 24 rows
 * column block by column block, each block's T x CB activations (<= 16 KiB) first copied to a stack buffer with a
 * padded row stride, the accumulators kept between blocks in a stack array (storing and reloading them changes no
 * bits), prefetching 8 rows ahead in processing order (wrapping to the next block, then the next tile), plus the
 * chunk's first 8 rows at its start.
 * avx2_fp8_rows returns R for T <= 2 and the tile height 24 for T >= 3 (avx2_matmul's chunks are multiples of it).
 * Assumes MXCSR's default DAZ / FTZ off (as does the F16C decoder for fp32-subnormal products).
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include "cpu_avx2.h"
#include <math.h>
#include <string.h>

/* vpshufb control: dword j of the low lane <- byte j, of the high lane <- byte 4 + j, each into the top byte of the
 * dword (0x80: zero) */
#define Z 0x80
static const uint8_t fp8_shuf[32] __attribute__((aligned(32))) = {
    Z, Z, Z, 0, Z, Z, Z, 1, Z, Z, Z, 2, Z, Z, Z, 3, Z, Z, Z, 4, Z, Z, Z, 5, Z, Z, Z, 6, Z, Z, Z, 7};
#undef Z

/* Rows per register pass (R x T accumulators) for T tokens. */
#define FP8_R(T) ((T) == 1 ? 4 : (T) == 2 ? 3 : (T) <= 4 ? 2 : 1)
/* Column block for T >= 3 (its T x CB activations, <= 16 KiB, stay in L1 while a tile of rows goes over them),
 * 0 for T <= 2 (whole rows). */
#define FP8_CB(T) ((T) <= 2 ? 0 : (4096 / (T)) / 128 * 128)
/* Rows of a tile for T >= 3: every column block of the tile is run for all of them before the next. */
#define FP8_RC 24
/* T >= 3: prefetch distance in rows, in the tile's processing order (row by row, block after block) */
#ifndef FP8_DR
#define FP8_DR 8
#endif
/* Floats of the staged activations of a block: T x (CB + 16) <= 8 x 528 for every T (T = 4: 4 x 1040) */
#define FP8_XSN 4224

int avx2_fp8_rows(const df_weight *w, int T) {
    if (w->type != DF_W_FP8_B128 || T < 1 || T > 8 || w->cols <= 0) return 0;
    return T <= 2 ? FP8_R(T) : FP8_RC;
}

/* Codes placed by vpshufb control `m` from the broadcast bytes `b`: value x 2^-120 as fp32 (see the header). The
 * arithmetic shift right by 4 is vpsrad, or (mul) vpmulhw by 2^12 in the high word of each dword: the same bits
 * (the low word is 0 either way), on the multiply pipe instead of the shift / shuffle pipes (faster for T <= 2,
 * where the FMA pipes have room, slower for T >= 3). */
AVX2_INLINE __m256 fp8_raw(__m256i b, __m256i m, __m256i keep, const int mul) {
    const __m256i d = _mm256_shuffle_epi8(b, m);
    const __m256i e = mul ? _mm256_mulhi_epi16(d, _mm256_set1_epi32(0x10000000)) : _mm256_srai_epi32(d, 4);
    return _mm256_castsi256_ps(_mm256_and_si256(e, keep));
}

/* One register pass: rows k < R (bytes p + k * cols, scale rows sr[k]) times T tokens over the 8-column chunks
 * [c0, c1) (c0 a multiple of 128), token t's column c at xb[t * xst + c - xc0]. The accumulators start at zero when
 * c0 == 0, else from part (R x T vectors); if y is given the pass ends the rows (hsum256, the cols % 8 tail from x,
 * y[t * rows + k]), else the accumulators go back to part. pf: prefetched as pf + k * cols + c alongside column c
 * (NULL: none). R and T are compile-time constants of each instance (loops fully unrolled, accumulators in
 * registers). */
AVX2_INLINE void fp8_pass(const uint8_t *p, int64_t cols, const float *const *sr, const float *xb, int64_t xst,
                          int64_t xc0, int64_t c0, int64_t c1, float *part, const float *x, float *y, int64_t rows,
                          const uint8_t *pf, const int R, const int T) {
    const __m256i m0 = _mm256_load_si256((const __m256i *)fp8_shuf);
    const __m256i keep = _mm256_set1_epi32((int)0x87f00000u);
    const __m256 nz = _mm256_set1_ps(-0.0f);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R * T; i++) acc[i] = c0 ? _mm256_loadu_ps(part + 8 * i) : _mm256_setzero_ps();
    for (int64_t cb = c0; cb < c1; cb += 128) {
        const int64_t ce = cb + 128 < c1 ? cb + 128 : c1;
        float sv[4];
        int ok = 1;
#pragma GCC unroll 8
        for (int k = 0; k < R; k++) {
            sv[k] = sr[k][cb >> 7] * 0x1p120f;
            ok &= isfinite(sv[k]);
            if (pf) {
                _mm_prefetch((const char *)(pf + k * cols + cb), _MM_HINT_T0);
                _mm_prefetch((const char *)(pf + k * cols + cb + 64), _MM_HINT_T0);
            }
        }
        if (__builtin_expect(ok, 1)) {
#pragma GCC unroll 2
            for (int64_t c = cb; c < ce; c += 8) {
                /* the chunk's R weight vectors first, then token by token (few live registers: no spills) */
                __m256 wv[4];
#pragma GCC unroll 8
                for (int k = 0; k < R; k++) {
                    int64_t q;
                    memcpy(&q, p + k * cols + c, 8);
                    /* fma(raw, s', -0) == raw * s' bit for bit; vmulps is slow on vectors mixing subnormal and
                     * normal lanes made by integer operations, vfmadd is not */
                    const __m256 raw = fp8_raw(_mm256_set1_epi64x(q), m0, keep, T <= 2);
                    wv[k] = _mm256_fmadd_ps(raw, _mm256_set1_ps(sv[k]), nz);
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const __m256 xv = _mm256_loadu_ps(xb + t * xst + c - xc0);
#pragma GCC unroll 8
                    for (int k = 0; k < R; k++) acc[k * T + t] = _mm256_fmadd_ps(wv[k], xv, acc[k * T + t]);
                }
            }
        } else { /* exact table decode of this block, every row of the pass */
            for (int64_t c = cb; c < ce; c += 8)
                for (int k = 0; k < R; k++) {
                    const float s = sr[k][cb >> 7];
                    float wb[8];
                    for (int j = 0; j < 8; j++) wb[j] = avx2_fp8_table[p[k * cols + c + j]] * s;
                    const __m256 wv = _mm256_loadu_ps(wb);
                    for (int t = 0; t < T; t++)
                        acc[k * T + t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xb + t * xst + c - xc0), acc[k * T + t]);
                }
        }
    }
    if (!y) {
#pragma GCC unroll 8
        for (int i = 0; i < R * T; i++) _mm256_storeu_ps(part + 8 * i, acc[i]);
        return;
    }
    const int64_t c8 = cols & ~(int64_t)7;
#pragma GCC unroll 8
    for (int k = 0; k < R; k++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float o = avx2_hsum256(acc[k * T + t]);
            for (int64_t c = c8; c < cols; c++)
                o = fmaf(avx2_fp8_table[p[k * cols + c]] * sr[k][c >> 7], x[t * cols + c], o);
            y[t * rows + k] = o;
        }
}

/* Prefetch offset for the pass at row r of the tile [s0, s1) in the column block at cb: the bytes DR rows further
 * in processing order, i.e. DR rows down in the same block, or wrapped to the tile's top rows in the next block,
 * or (last block) the next tile's rows at block 0 (column c - cb); INT64_MIN: none (the chunk's end). */
static inline int64_t fp8_pfo(int64_t r, int64_t s0, int64_t s1, int64_t r1, int64_t cb, int last, int64_t DR,
                              int64_t CB, int64_t cols) {
    if (r + DR < s1) return DR * cols;
    if (!last) return (DR - (s1 - s0)) * cols + CB;
    if (s1 < r1) return DR * cols - cb;
    return INT64_MIN;
}

/* Rows [r0, r1) for T tokens. T <= 2: passes of R rows over whole rows, prefetching the next pass's rows. T >= 3:
 * tiles of RC rows, column block after column block; each block's activations are first copied to xs (rows
 * CB + 16 floats apart: a row stride of cols floats is often a multiple of 4 KiB, and the T rows would then share
 * one L1 set), then passes of R rows (then single rows) go over it, prefetching DR rows ahead (fp8_pfo). Stack:
 * xs 17 KiB, part 6 KiB. */
AVX2_INLINE void fp8_rows(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const int R,
                          const int T) {
    const int64_t cols = w->cols, rows = w->rows, nbc = (cols + 127) / 128, c8 = cols & ~(int64_t)7;
    const int blocked = FP8_CB(T) > 0;
    const int64_t CB = blocked ? FP8_CB(T) : (c8 + 127) / 128 * 128, RC = blocked ? FP8_RC : R, XS = FP8_CB(T) + 16;
    const int64_t DR = blocked ? FP8_DR : R; /* prefetch distance in rows of processing order */
    const uint8_t *d = (const uint8_t *)w->data;
    const float *sc = (const float *)w->scale;
    float part[FP8_RC * 8 * 8] __attribute__((aligned(32)));
    float xs[FP8_XSN] __attribute__((aligned(32)));
    for (int64_t s0 = r0; s0 < r1; s0 += RC) {
        const int64_t s1 = s0 + RC < r1 ? s0 + RC : r1;
        for (int64_t cb = 0;; cb += CB) {
            const int64_t ce = cb + CB < c8 ? cb + CB : c8;
            const int last = ce >= c8;
            const float *xb = x;
            int64_t xst = cols, xc0 = 0;
            if (blocked) {
                for (int t = 0; t < T; t++) memcpy(xs + t * XS, x + t * cols + cb, sizeof(float) * (size_t)(ce - cb));
                xb = xs, xst = XS, xc0 = cb;
            }
            if (blocked && s0 == r0 && cb == 0) /* the chunk's first DR rows: nothing before them prefetched them */
                for (int64_t r = r0; r < r1 && r < r0 + DR; r++)
                    for (int64_t c = 0; c < ce; c += 64) _mm_prefetch((const char *)(d + r * cols + c), _MM_HINT_T0);
            int64_t r = s0;
            for (; r + R <= s1; r += R) {
                const float *sr[4];
                for (int k = 0; k < R; k++) sr[k] = sc + ((r + k) >> 7) * nbc;
                const uint8_t *p = d + r * cols;
                const int64_t pfo = fp8_pfo(r, s0, s1, r1, cb, last, DR, CB, cols);
                fp8_pass(p, cols, sr, xb, xst, xc0, cb, ce, part + (r - s0) * T * 8, x, last ? y + r : NULL, rows,
                         pfo != INT64_MIN ? p + pfo : NULL, R, T);
            }
            for (; r < s1; r++) {
                const float *sr[1] = {sc + (r >> 7) * nbc};
                const uint8_t *p = d + r * cols;
                const int64_t pfo = fp8_pfo(r, s0, s1, r1, cb, last, DR, CB, cols);
                fp8_pass(p, cols, sr, xb, xst, xc0, cb, ce, part + (r - s0) * T * 8, x, last ? y + r : NULL, rows,
                         pfo != INT64_MIN ? p + pfo : NULL, 1, T);
            }
            if (last) break;
        }
    }
}

#define FP8_INST(T)                                                                                                    \
    AVX2 __attribute__((noinline)) static void fp8_mm_##T(const df_weight *w, const float *x, float *y, int64_t r0,    \
                                                          int64_t r1) {                                                \
        fp8_rows(w, x, y, r0, r1, FP8_R(T), T);                                                                        \
    }
FP8_INST(1)
FP8_INST(2)
FP8_INST(3)
FP8_INST(4)
FP8_INST(5)
FP8_INST(6)
FP8_INST(7)
FP8_INST(8)

/* Dispatch on T to the instance with its R x T accumulators. */
void avx2_fp8_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    switch (T) {
    case 1: fp8_mm_1(w, x, y, r0, r1); break;
    case 2: fp8_mm_2(w, x, y, r0, r1); break;
    case 3: fp8_mm_3(w, x, y, r0, r1); break;
    case 4: fp8_mm_4(w, x, y, r0, r1); break;
    case 5: fp8_mm_5(w, x, y, r0, r1); break;
    case 6: fp8_mm_6(w, x, y, r0, r1); break;
    case 7: fp8_mm_7(w, x, y, r0, r1); break;
    case 8: fp8_mm_8(w, x, y, r0, r1); break;
    default: break;
    }
}

#else
int avx2_fp8_rows(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_fp8_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)x; (void)T; (void)y; (void)r0; (void)r1;
}
#endif
