/*
 * cpu_avx2_q4.c — AVX2 fused MXFP4 / INT4 g32 matmul kernels for 1 <= T <= 8 tokens (interface: cpu_internal.h).
 *
 * Weights: rows of cols / 2 bytes, column 2j in the low nibble of byte j and 2j + 1 in the high nibble; one scale
 * per 32-column block (MXFP4: an E8M0 byte, w = E2M1(code) x 2^(e-127); INT4 g32: a bf16 s, w = (q - 8) x s;
 * shared/notes/formats.md). The weights are exactly those of avx2_decode_row (cpu_avx2.c) and each (row, token) is
 * summed in the AVX2 canonical order, so results are bitwise those of the decode_row + dot path for any T.
 *
 * Decoding a 32-column block in registers, without cross-lane shuffles (Zen 3 runs vpshufb / vpunpck / shifts two
 * per cycle, but vpermps only one, and that one competes with the FMAs):
 *  - every MXFP4 weight E2M1 x 2^(e-127), and every INT4 (q - 8) before its scale, is a bfloat16 (at most 2 or 4
 *    significant bits): its fp32 bits are a high byte H and a second byte L over 16 zero bits. Two 16-entry byte
 *    tables per scale (q4_th / q4_tl: H and L of every code's fp32 value, made by the same fp32 multiply as the
 *    scalar decoder) turn 32 codes into 32 H and 32 L bytes with two vpshufb;
 *  - the block's 16 bytes, broadcast to both 128-bit lanes, are first put in the order (0 4 1 5 2 6 3 7 8 12 9 13
 *    10 14 11 15) (one vpshufb); the low lane keeps the low nibbles (even columns), the high lane the high nibbles
 *    (odd columns: one vpsrlvd), masked to 4 bits;
 *  - vpunpck{l,h}bw(L, H) pairs each code's bytes into its bf16 word; the even words shifted up 16 bits and the odd
 *    words masked are the fp32 weights of chunks 0, 1 (from the low unpack) and 2, 3 (high): each vector holds the 8
 *    columns of one chunk in lane order (0 2 4 6 1 3 5 7);
 *  - INT4 multiplies each vector by its block's scale (exact: 4 x 8 significant bits).
 * The activations are staged once per call in that lane order, block-interleaved (avx2_q4_stage), so accumulator
 * lane l takes exactly the products of canonical lane (0 2 4 6 1 3 5 7)[l], chunk after chunk; it is put back in
 * natural lane order before hsum256. 8 shuffle-class operations per 32 weights (plus the table loads, which are
 * free broadcasts): on a Zen 3 VM 1.5-2.2x the T = 1 speed of decoding to int8 and converting (bench/RESULTS.md).
 *
 * Order of work: T = 1, 2 in passes of R rows (4) x T tokens, each block of each row decoded once and FMA'd against
 * the T tokens, the next pass's bytes prefetched; T = 3..8 in K tiles (q4_ktile), where the activations of a tile
 * stay in L1 while every row of the chunk goes over them. Every block of every row is decoded once per call.
 * The ~11 vector operations of a block's decode run at ~2.7 per cycle on Zen 3 with the FMAs; the T = 1 kernel is
 * bound by them (~6 cycles per row-block), not by its 4 FMA chains (bench/RESULTS.md).
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include "cpu_avx2.h"
#include <stdlib.h>
#include <string.h>


/* [e][code]: the high byte and the second byte of the fp32 bits of MXFP4 code x 2^(e-127) (e = 255: NaN) */
static uint8_t q4_th[256][16] __attribute__((aligned(16))), q4_tl[256][16] __attribute__((aligned(16)));
/* the same for INT4's (code - 8) */
static uint8_t i4_th[16] __attribute__((aligned(16))), i4_tl[16] __attribute__((aligned(16)));

/* E2M1 values by code (code 8 = +0, as the scalar and AVX2 decoders) */
static const float e2m1_vals[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void split_bf16(float v, uint8_t *hi, uint8_t *lo) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (u & 0xffffu) abort(); /* every entry is a bfloat16 (see the header) */
    *hi = (uint8_t)(u >> 24);
    *lo = (uint8_t)(u >> 16);
}

__attribute__((constructor)) static void q4_tables_init(void) {
    for (int e = 0; e < 256; e++)
        for (int n = 0; n < 16; n++) split_bf16(e2m1_vals[n] * df_e8m0_to_f32((uint8_t)e), &q4_th[e][n], &q4_tl[e][n]);
    for (int n = 0; n < 16; n++) split_bf16((float)(n - 8), &i4_th[n], &i4_tl[n]);
}

/* Build-time knobs of the measurements in bench/RESULTS.md: rows per pass for T = 1 (Q4_R1); the one- and
 * two-token passes' software prefetch, bytes past the next pass's block (Q4_PF: the hardware prefetcher alone left
 * the one-token kernel at 5-6 GB/s per core on 7168x2048 from DRAM, 8 with it); T >= 3: blocks per K tile (Q4_KT),
 * rows per chunk (Q4_KT_ROWS), rows interleaved up to T = Q4_KT_R2 (else 1), prefetch distance in those row steps
 * (Q4_KT_PF). */
#ifndef Q4_R1
#define Q4_R1 4
#endif
#ifndef Q4_PF
#define Q4_PF 64
#endif
#ifndef Q4_KT
#define Q4_KT 16
#endif
#ifndef Q4_KT_ROWS
#define Q4_KT_ROWS 16
#endif
#ifndef Q4_KT_R2
#define Q4_KT_R2 4
#endif
#ifndef Q4_KT_PF
#define Q4_KT_PF 1
#endif
/* Staged lane l of a chunk holds (and its accumulator lane sums) column (0 2 4 6 1 3 5 7)[l] of the chunk. */
static const int32_t q4_from_nat[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* staged[l] = natural[q4_from_nat[l]] */
static const int32_t q4_to_nat[8] = {0, 4, 1, 5, 2, 6, 3, 7};   /* natural[c] = staged[q4_to_nat[c]] */

int avx2_q4_rows(const df_weight *w, int T) {
    if ((w->type != DF_W_MXFP4 && w->type != DF_W_INT4_G32) || w->cols % 32 != 0 || T < 1 || T > 8) return 0;
    return T == 1 ? Q4_R1 : T == 2 ? 4 : Q4_KT_ROWS;
}

/* xs = x (T rows, cols % 32 == 0) block-interleaved, each 8-column chunk in staged lane order: the 32 columns of
 * block b of token u at xs + (b * T + u) * 32, so a block's T x 32 activations are one contiguous run (token rows
 * cols floats apart, often a multiple of 4 KiB, would all fall in the same L1 sets). */
AVX2 void avx2_q4_stage(const float *x, int T, int64_t cols, float *xs) {
    const __m256i idx = _mm256_loadu_si256((const __m256i *)q4_from_nat);
    const int64_t nb = cols / 32;
    for (int u = 0; u < T; u++)
        for (int64_t b = 0; b < nb; b++)
            for (int q = 0; q < 4; q++)
                _mm256_storeu_ps(xs + (b * T + u) * 32 + 8 * q,
                                 _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + u * cols + 32 * b + 8 * q), idx));
}

/* The decoder's constants. */
typedef struct {
    __m256i order, shift, nib, hi16;
} q4_consts;

/* The four fp32 weight vectors (chunks 0..3, staged lane order) of the 16 code bytes at p with the tables th / tl
 * (16 bytes each). */
AVX2_INLINE void q4_block(const uint8_t *p, const uint8_t *th, const uint8_t *tl, const q4_consts *k, __m256 *w0,
                          __m256 *w1, __m256 *w2, __m256 *w3) {
    const __m256i tabh = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)th));
    const __m256i tabl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)tl));
    const __m256i b = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), k->order);
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(b, k->shift), k->nib);
    const __m256i h = _mm256_shuffle_epi8(tabh, idx), l = _mm256_shuffle_epi8(tabl, idx);
    const __m256i lo = _mm256_unpacklo_epi8(l, h), hi = _mm256_unpackhi_epi8(l, h);
    *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
    *w1 = _mm256_castsi256_ps(_mm256_and_si256(lo, k->hi16));
    *w2 = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
    *w3 = _mm256_castsi256_ps(_mm256_and_si256(hi, k->hi16));
}

/* One pass (T = 1, 2): rows r .. r + nr - 1 (nr <= R; missing rows repeat row r and are not stored) x T tokens. */
AVX2_INLINE void q4_pass(const df_weight *w, const float *xs, float *y, int64_t r, int nr, const int R, const int T,
                         const int mx, const q4_consts *k) {
    const int64_t cols = w->cols, rows = w->rows, nb = cols / 32, rowb = cols / 2;
    const uint8_t *d = (const uint8_t *)w->data + r * rowb;
    const uint8_t *s8 = (const uint8_t *)w->scale + r * nb;       /* MXFP4 */
    const uint16_t *s16 = (const uint16_t *)w->scale + r * nb;    /* INT4 */
    int64_t ro[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) ro[i] = i < nr ? i : 0;
    __m256 acc[8][8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int u = 0; u < T; u++) acc[i][u] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = xs + 32 * T * b;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 w0, w1, w2, w3;
            /* the same bytes of the next pass's row, once per cache line (prefetch never faults past the end) */
            if ((b & 3) == 0) _mm_prefetch((const char *)(d + (ro[i] + R) * rowb + 16 * b) + Q4_PF, _MM_HINT_T0);
            if (mx) {
                const unsigned e = s8[ro[i] * nb + b];
                q4_block(d + ro[i] * rowb + 16 * b, q4_th[e], q4_tl[e], k, &w0, &w1, &w2, &w3);
            } else {
                q4_block(d + ro[i] * rowb + 16 * b, i4_th, i4_tl, k, &w0, &w1, &w2, &w3);
                const __m256 sc = _mm256_set1_ps(df_bf16_to_f32(s16[ro[i] * nb + b]));
                w0 = _mm256_mul_ps(w0, sc);
                w1 = _mm256_mul_ps(w1, sc);
                w2 = _mm256_mul_ps(w2, sc);
                w3 = _mm256_mul_ps(w3, sc);
            }
#pragma GCC unroll 8
            for (int u = 0; u < T; u++) {
                const float *xu = xb + 32 * u;
                acc[i][u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xu), acc[i][u]);
                acc[i][u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xu + 8), acc[i][u]);
                acc[i][u] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xu + 16), acc[i][u]);
                acc[i][u] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xu + 24), acc[i][u]);
            }
        }
    }
    const __m256i back = _mm256_loadu_si256((const __m256i *)q4_to_nat);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        if (i < nr)
#pragma GCC unroll 8
            for (int u = 0; u < T; u++) {
                y[(int64_t)u * rows + r + i] = avx2_hsum256(_mm256_permutevar8x32_ps(acc[i][u], back));
            }
}

AVX2_INLINE q4_consts q4_consts_make(void) {
    q4_consts k;
    k.order = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13,
                               10, 14, 11, 15);
    k.shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    k.nib = _mm256_set1_epi8(15);
    k.hi16 = _mm256_set1_epi32((int)0xffff0000u);
    return k;
}

/* T = 3..8: K tiles of Q4_KT blocks. For each tile, each row of [r0, r1) in turn loads its T accumulators
 * (from acc, zero on the first tile), decodes the tile's blocks once and FMAs each against all T tokens, and stores
 * them back; the tile's staged activations (T x 32 x Q4_KT floats, 16 KiB at T = 8) stay in L1 for every row, where
 * passes of rows would stream them from L2 once per pass. Two rows interleaved up to T = 4 (2 x T accumulator chains
 * in flight), one above. The next row step's bytes of the tile are prefetched. MXFP4 T = 5..8 at 2 threads: 77-101 ->
 * 95-131 GFLOP/s against passes of 2 rows x up to 4 tokens (bench/RESULTS.md). Same canonical order: one
 * accumulator per (row, token), chunks in column order. */
AVX2_INLINE void q4_ktile(const df_weight *w, const float *xs, float *y, int64_t r0, int64_t r1, const int R,
                          const int T, const int mx, const q4_consts *k) {
    const int64_t cols = w->cols, rows = w->rows, nb = cols / 32, rowb = cols / 2;
    __m256 *acc = cpu_scratch(CPU_SCRATCH_ACC, sizeof(__m256) * (size_t)((r1 - r0 + R) * T));
    if (!acc) abort(); /* (r1 - r0) x T x 32 bytes; nothing sensible to do without it */
    for (int64_t b0 = 0; b0 < nb; b0 += Q4_KT) {
        const int64_t b1 = nb - b0 < Q4_KT ? nb : b0 + Q4_KT;
        for (int64_t r = r0; r < r1; r += R) {
            const int nr = r1 - r < R ? (int)(r1 - r) : R;
            int64_t ro[2];
            __m256 a[2][8];
#pragma GCC unroll 2
            for (int i = 0; i < R; i++) {
                ro[i] = r + (i < nr ? i : 0); /* a missing row repeats row r and is not stored */
#pragma GCC unroll 8
                for (int u = 0; u < T; u++) a[i][u] = b0 ? acc[(r - r0 + i) * T + u] : _mm256_setzero_ps();
            }
            for (int64_t b = b0; b < b1; b++) {
                const float *xb = xs + 32 * T * b;
#pragma GCC unroll 2
                for (int i = 0; i < R; i++) {
                    __m256 w0, w1, w2, w3;
                    const uint8_t *d = (const uint8_t *)w->data + ro[i] * rowb + 16 * b;
                    if (Q4_KT_PF && (b & 3) == 0) _mm_prefetch((const char *)(d + Q4_KT_PF * R * rowb), _MM_HINT_T0);
                    if (mx) {
                        const unsigned e = ((const uint8_t *)w->scale)[ro[i] * nb + b];
                        q4_block(d, q4_th[e], q4_tl[e], k, &w0, &w1, &w2, &w3);
                    } else {
                        q4_block(d, i4_th, i4_tl, k, &w0, &w1, &w2, &w3);
                        const __m256 sc = _mm256_set1_ps(df_bf16_to_f32(((const uint16_t *)w->scale)[ro[i] * nb + b]));
                        w0 = _mm256_mul_ps(w0, sc);
                        w1 = _mm256_mul_ps(w1, sc);
                        w2 = _mm256_mul_ps(w2, sc);
                        w3 = _mm256_mul_ps(w3, sc);
                    }
#pragma GCC unroll 8
                    for (int u = 0; u < T; u++) {
                        a[i][u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb + 32 * u), a[i][u]);
                        a[i][u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 32 * u + 8), a[i][u]);
                        a[i][u] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 32 * u + 16), a[i][u]);
                        a[i][u] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 32 * u + 24), a[i][u]);
                    }
                }
            }
            const __m256i back = _mm256_loadu_si256((const __m256i *)q4_to_nat);
#pragma GCC unroll 2
            for (int i = 0; i < R; i++)
                if (i < nr) {
#pragma GCC unroll 8
                    for (int u = 0; u < T; u++) {
                        if (b1 < nb) acc[(r - r0 + i) * T + u] = a[i][u];
                        else y[(int64_t)u * rows + r + i] = avx2_hsum256(_mm256_permutevar8x32_ps(a[i][u], back));
                    }
                }
        }
    }
}

/* Rows [r0, r1) of one encoding, T tokens: passes of R rows for T = 1, 2, K tiles for T = 3..8. */
AVX2_INLINE void q4_run(const df_weight *w, const float *xs, float *y, int64_t r0, int64_t r1, const int T, const int mx) {
    const q4_consts k = q4_consts_make();
    if (T >= 3) {
        q4_ktile(w, xs, y, r0, r1, T <= Q4_KT_R2 ? 2 : 1, T, mx, &k);
        return;
    }
    const int R = T == 1 ? Q4_R1 : 4;
    for (int64_t r = r0; r < r1; r += R) q4_pass(w, xs, y, r, r1 - r < R ? (int)(r1 - r) : R, R, T, mx, &k);
}

#define Q4_KERNEL(T)                                                                                                   \
    AVX2 static void q4_mx_##T(const df_weight *w, const float *xs, float *y, int64_t r0, int64_t r1) {            \
        q4_run(w, xs, y, r0, r1, T, 1);                                                                           \
    }                                                                                                             \
    AVX2 static void q4_i4_##T(const df_weight *w, const float *xs, float *y, int64_t r0, int64_t r1) {            \
        q4_run(w, xs, y, r0, r1, T, 0);                                                                           \
    }
Q4_KERNEL(1)
Q4_KERNEL(2)
Q4_KERNEL(3)
Q4_KERNEL(4)
Q4_KERNEL(5)
Q4_KERNEL(6)
Q4_KERNEL(7)
Q4_KERNEL(8)

typedef void (*q4_fn)(const df_weight *, const float *, float *, int64_t, int64_t);
static const q4_fn q4_mx[9] = {NULL, q4_mx_1, q4_mx_2, q4_mx_3, q4_mx_4, q4_mx_5, q4_mx_6, q4_mx_7, q4_mx_8};
static const q4_fn q4_i4[9] = {NULL, q4_i4_1, q4_i4_2, q4_i4_3, q4_i4_4, q4_i4_5, q4_i4_6, q4_i4_7, q4_i4_8};

void avx2_q4_mm(const df_weight *w, const float *xs, int T, float *y, int64_t r0, int64_t r1) {
    (w->type == DF_W_MXFP4 ? q4_mx : q4_i4)[T](w, xs, y, r0, r1);
}

/* Row r of an MXFP4 / INT4 g32 weight (cols % 32 == 0) as fp32, each 8-column chunk in staged lane order: the
 * decoder of the fused kernels, for the T > 8 matmul (cpu_avx2_gemm.c). */
AVX2 void avx2_q4_decode_row_staged(const df_weight *w, int64_t r, float *out) {
    const q4_consts k = q4_consts_make();
    const int64_t nb = w->cols / 32;
    const uint8_t *d = (const uint8_t *)w->data + r * (w->cols / 2);
    for (int64_t b = 0; b < nb; b++) {
        __m256 w0, w1, w2, w3;
        if (w->type == DF_W_MXFP4) {
            const unsigned e = ((const uint8_t *)w->scale)[r * nb + b];
            q4_block(d + 16 * b, q4_th[e], q4_tl[e], &k, &w0, &w1, &w2, &w3);
        } else {
            q4_block(d + 16 * b, i4_th, i4_tl, &k, &w0, &w1, &w2, &w3);
            const __m256 sc = _mm256_set1_ps(df_bf16_to_f32(((const uint16_t *)w->scale)[r * nb + b]));
            w0 = _mm256_mul_ps(w0, sc);
            w1 = _mm256_mul_ps(w1, sc);
            w2 = _mm256_mul_ps(w2, sc);
            w3 = _mm256_mul_ps(w3, sc);
        }
        _mm256_storeu_ps(out + 32 * b, w0);
        _mm256_storeu_ps(out + 32 * b + 8, w1);
        _mm256_storeu_ps(out + 32 * b + 16, w2);
        _mm256_storeu_ps(out + 32 * b + 24, w3);
    }
}

/* An accumulator in staged lane order, put back in natural lane order. */
AVX2 __m256 avx2_q4_unstage(__m256 acc) {
    return _mm256_permutevar8x32_ps(acc, _mm256_loadu_si256((const __m256i *)q4_to_nat));
}

#else
void avx2_q4_decode_row_staged(const df_weight *w, int64_t r, float *out) { (void)w; (void)r; (void)out; }
int avx2_q4_rows(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_q4_stage(const float *x, int T, int64_t cols, float *xs) { (void)x; (void)T; (void)cols; (void)xs; }
void avx2_q4_mm(const df_weight *w, const float *xs, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)xs; (void)T; (void)y; (void)r0; (void)r1;
}
#endif
