/*
 * cpu_avx2_dense.c — AVX2 (+FMA, +F16C) fused F32 / BF16 / F16 matmul kernels for 1 <= T <= 8 tokens
 * (interface: cpu_internal.h; dispatcher: avx2_matmul in cpu_avx2.c).
 *
 * Numerics. Every output y[t, r] is the AVX2 backend's canonical chain (avx2_dot_canon on the decoded row):
 * ONE 8-lane fp32 accumulator, s = fma(w[c..c+7], x[c..c+7], s) over the 8-column chunks in column order,
 * avx2_hsum256 (cpu_avx2.h), then the cols % 8 tail columns by fmaf in column order. The kernels
 * only change WHERE that accumulator lives and WHEN its FMAs run, never the operands or their order:
 *   - lane j of a chunk vector is always column c + j (no lane permutation anywhere): bf16 is decoded by a
 *     128-bit broadcast load of the chunk's 8 halves + one vpshufb that puts half j into the high 16 bits of
 *     lane j (bits exactly h << 16, the generic decode); f16 by vcvtph2ps (the generic decode's instruction;
 *     subnormal halves included); the tail decodes with df_bf16_to_f32 / df_f16_to_f32 like
 *     cpu_scalar_decode_range;
 *   - columns are processed in tiles; between tiles a (row, token) accumulator is stored to a per-thread
 *     scratch and reloaded (bit-exact), and tiles run in column order, so each chain still sees its chunks
 *     in order; which rows / tokens share a pass, T, the thread split and the tiling do not matter.
 *
 * Register blocking. A pass runs R rows x G tokens = R*G independent accumulator chains (FMA latency 4 x 2
 * per cycle needs >= 8 in flight; R <= 4, R*G <= 12 so all fit the 16 ymm registers with the weights and
 * x): per chunk it decodes each of the R weight vectors once and loads each of the G x vectors once (an
 * empty asm keeps a value in a register, so GCC does not fold the load into R or G memory operands), then
 * R*G FMAs. Tokens beyond G run further passes over the same tile (its weights then come from L1).
 * Per T (DENSE_CFGS, chosen by measurement on the 2-core Zen 3): T=1 4x1, T=2 4x2, T=3 3x3; T=4..8 2xG
 * for bf16/f16 (2x4 twice for T=8) and 4x2 for f32 (whose extra weight reloads are plain loads).
 *
 * Memory. T <= 3: whole rows in blocks of 4 (3x3: 6) rows, x read in place from L2: four long sequential
 * weight streams, which the hardware prefetcher follows. T >= 4: x traffic from L2 would be too high, so
 * columns run in tiles: x is staged once per call (task) into a chunk-interleaved copy, xs[chunk][token][8]
 * (the T token rows are often 4 KiB-multiple strides apart, i.e. in the same L1 sets; the copy is one
 * contiguous stream), and a tile of it (XT floats) stays in L1 while the rows of a block stream through
 * (bf16/f16: 16-row blocks; f32: 4-row blocks whose weight tile stays in L1 instead, x from L2). Row
 * segments that short defeat the hardware prefetcher, so bf16/f16 passes also prefetch the NEXT block of
 * rows (contiguous memory) linearly, at the rate they read their own weights. Rows per dispatcher chunk are
 * large (up to 128) so that x staging and each chunk's unprefetched first block stay a small share.
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include "cpu_avx2.h"
#include <stdlib.h>


enum { TY_F32, TY_BF16, TY_F16 };

/* The 8 weights of row `row` at columns c..c+7 as fp32, lane j = column c + j. */
AVX2_INLINE __m256 dec(int ty, const uint8_t *row, int64_t c) {
    if (ty == TY_F32) return _mm256_loadu_ps((const float *)row + c);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
    if (ty == TY_F16) return _mm256_cvtph_ps(h);
    /* bf16: both 128-bit lanes hold halves 0..7; lane j takes half j (bytes 2j, 2j+1) as its high 16 bits */
    const __m256i ctl = _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7,
                                         -128, -128, 8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), ctl));
}

/* One tail weight, decoded as cpu_scalar_decode_range does. */
AVX2_INLINE float dec1(int ty, const uint8_t *row, int64_t c) {
    if (ty == TY_F32) return ((const float *)row)[c];
    if (ty == TY_BF16) return df_bf16_to_f32(((const uint16_t *)row)[c]);
    return df_f16_to_f32(((const uint16_t *)row)[c]);
}

/* One pass: rows w, w + ws, .. (R of them, ws bytes apart) x G tokens over chunks c0/8 .. c0/8 + n - 1.
 * xs: x of the pass's first token at chunk c0/8 (chunk c0/8 + k, token t at xs + k * xst + t * xtt). acc:
 * row i, token t at acc + i * as + t * 8 (zero-initialized instead of loaded on the first tile). pf: where
 * to prefetch the next block, as many bytes as this pass reads (NULL: none; it may run past the last row:
 * prefetches never fault). R, G, ty are compile-time constants after inlining, so a[] and wv[] are
 * registers (no stack traffic in the loop: checked with gcc -S). */
AVX2_INLINE void pass(int ty, int R, int G, const uint8_t *w, int64_t ws, const float *xs, int64_t xst, int64_t xtt,
                      int64_t c0, int64_t n, float *acc, int64_t as, int first, const uint8_t *pf) {
    const int es = ty == TY_F32 ? 4 : 2;
    __m256 a[16];
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int t = 0; t < G; t++) a[i * G + t] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + i * as + t * 8);
    w += c0 * es;
#define CHUNK(K)                                                                                                       \
    do {                                                                                                               \
        __m256 wv[4];                                                                                                  \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                                          \
            wv[i] = dec(ty, w + i * ws, (K) * 8);                                                                      \
            if (ty == TY_F32 && G > 1) __asm__("" : "+x"(wv[i])); /* one load, not G memory operands */                \
        }                                                                                                              \
        _Pragma("GCC unroll 8") for (int t = 0; t < G; t++) {                                                          \
            __m256 xv = _mm256_loadu_ps(xs + (K) * xst + t * xtt);                                                     \
            if (R > 1) __asm__("" : "+x"(xv)); /* one load shared by the R rows */                                     \
            _Pragma("GCC unroll 4") for (int i = 0; i < R; i++)                                                        \
                a[i * G + t] = _mm256_fmadd_ps(wv[i], xv, a[i * G + t]);                                               \
        }                                                                                                              \
    } while (0)
    if (pf) /* the next block's bytes at the rate this pass reads its own: R * 8 * es per chunk */
        for (int64_t k = 0; k < n; k++) {
#pragma GCC unroll 4
            for (int j = 0; j < (R * es + 7) / 8; j++)
                _mm_prefetch((const char *)pf + k * R * 8 * es + j * 64, _MM_HINT_T0);
            CHUNK(k);
        }
    else
        for (int64_t k = 0; k < n; k++) CHUNK(k);
#undef CHUNK
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int t = 0; t < G; t++) _mm256_store_ps(acc + i * as + t * 8, a[i * G + t]);
}

/* All T tokens of R rows over one tile: passes of G tokens, then one of T % G (same weights, from L1). */
AVX2_INLINE void rows_pass(int ty, int T, int R, int G, const uint8_t *w, int64_t ws, const float *xs, int64_t xst,
                           int64_t xtt, int64_t c0, int64_t n, float *acc, int first, const uint8_t *pf) {
    int t = 0;
    for (; t + G <= T; t += G)
        pass(ty, R, G, w, ws, xs + t * xtt, xst, xtt, c0, n, acc + t * 8, T * 8, first, t ? NULL : pf);
    if (T % G) pass(ty, R, T % G, w, ws, xs + t * xtt, xst, xtt, c0, n, acc + t * 8, T * 8, first, t ? NULL : pf);
}

/* Rows [r0, r1) of y = x W^T for T tokens with R x G passes, blocks of RBI rows, column tiles of XT / T
 * columns (XT = 0: whole rows) and, if PF, the linear prefetch of the next block. */
AVX2_INLINE void mm(int ty, int T, int R, int G, int RBI, int XT, int PF, const df_weight *w, const float *x, float *y,
                    int64_t r0, int64_t r1) {
    const int es = ty == TY_F32 ? 4 : 2;
    const int64_t cols = w->cols, rows = w->rows, nc = cols & ~(int64_t)7, ws = cols * es;
    const int64_t K = XT ? (XT / T) & ~(int64_t)7 : nc + 8;
    /* x as read by the passes: chunk k of token t at xs + k * xst + t * xtt (the tile at column c0: xs + c0 * xcs) */
    const float *xs = x;
    int64_t xst = 8, xtt = cols, xcs = 1;
    if (XT) { /* staged, chunk-interleaved */
        float *st = cpu_scratch(CPU_SCRATCH_W, sizeof(float) * (size_t)(nc * T + 8));
        if (!st) abort(); /* small per-thread buffer; nothing sensible to do without it */
        for (int64_t k = 0; k < nc / 8; k++)
            for (int t = 0; t < T; t++) _mm256_store_ps(st + (k * T + t) * 8, _mm256_loadu_ps(x + t * cols + k * 8));
        xs = st, xst = T * 8, xtt = 8, xcs = T;
    }
    float *acc = cpu_scratch(CPU_SCRATCH_ACC, sizeof(float) * (size_t)(RBI * T * 8));
    if (!acc) abort();
    for (int64_t rb = r0; rb < r1; rb += RBI) {
        const int nb = r1 - rb < RBI ? (int)(r1 - rb) : RBI;
        const uint8_t *wb = (const uint8_t *)w->data + rb * ws;
        const uint8_t *pf = PF && rb + nb < r1 ? wb + nb * ws : NULL; /* the next block, contiguous */
        int64_t c0 = 0;
        do { /* column tiles in column order (once, empty, when cols < 8: the accumulators start at zero) */
            const int64_t c1 = c0 + K < nc ? c0 + K : nc, n = (c1 - c0) / 8;
            int i = 0;
            for (; i + R <= nb; i += R) {
                rows_pass(ty, T, R, G, wb + i * ws, ws, xs + c0 * xcs, xst, xtt, c0, n, acc + i * T * 8, c0 == 0, pf);
                if (pf) pf += R * n * 8 * es;
            }
            for (; i < nb; i++)
                rows_pass(ty, T, 1, G, wb + i * ws, ws, xs + c0 * xcs, xst, xtt, c0, n, acc + i * T * 8, c0 == 0, NULL);
            c0 = c1;
        } while (c0 < nc);
        for (int i = 0; i < nb; i++)
            for (int t = 0; t < T; t++) {
                float s = avx2_hsum256(_mm256_load_ps(acc + (i * T + t) * 8));
                for (int64_t c = nc; c < cols; c++) s = fmaf(dec1(ty, wb + i * ws, c), x[t * cols + c], s);
                y[t * rows + rb + i] = s;
            }
    }
}

/* X(T, f32 config, bf16/f16 config), a config being R, G, RBI, XT, PF (see mm). Measured on the 2-core
 * Zen 3 (bench kernels shapes, cold weights, variants interleaved call by call): whole rows in 4-row
 * blocks win while x traffic from L2 allows (T <= 3: 8-12 B per FMA cycle); beyond, bf16/f16 keep the x
 * tile in L1 (2xG, 16-row blocks, linear prefetch) and f32 keeps a 4-row weight tile in L1 (4x2). */
#define DENSE_CFGS(X)                                                                                                  \
    X(1, (4, 1, 4, 0, 0), (4, 1, 4, 0, 0))                                                                             \
    X(2, (4, 2, 4, 0, 0), (4, 2, 4, 0, 0))                                                                             \
    X(3, (3, 3, 6, 0, 0), (3, 3, 6, 0, 0))                                                                             \
    X(4, (4, 2, 4, 4096, 0), (2, 4, 16, 3072, 1))                                                                      \
    X(5, (4, 2, 4, 4096, 0), (2, 5, 8, 4096, 1))                                                                       \
    X(6, (4, 2, 4, 4096, 0), (2, 6, 8, 4096, 1))                                                                       \
    X(7, (4, 2, 4, 4096, 0), (2, 4, 16, 3072, 1))                                                                      \
    X(8, (4, 2, 4, 4096, 0), (2, 4, 16, 3072, 1))

#define MM_CALL(ty, T, R, G, RBI, XT, PF) mm(ty, T, R, G, RBI, XT, PF, w, x, y, r0, r1)
#define MM_EXPAND(f, args) f args
#define MM_FNS(T, CF32, C16)                                                                                           \
    AVX2 static void mm_f32_##T(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {               \
        MM_EXPAND(MM_CALL, (TY_F32, T, MM_UNPACK CF32));                                                               \
    }                                                                                                                  \
    AVX2 static void mm_bf16_##T(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {              \
        MM_EXPAND(MM_CALL, (TY_BF16, T, MM_UNPACK C16));                                                               \
    }                                                                                                                  \
    AVX2 static void mm_f16_##T(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {               \
        MM_EXPAND(MM_CALL, (TY_F16, T, MM_UNPACK C16));                                                                \
    }
#define MM_UNPACK(R, G, RBI, XT, PF) R, G, RBI, XT, PF
DENSE_CFGS(MM_FNS)

typedef void (*dense_fn)(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1);
#define MM_ROW(T, CF32, C16) {mm_f32_##T, mm_bf16_##T, mm_f16_##T},
static const dense_fn dense_fns[8][3] = {DENSE_CFGS(MM_ROW)};
#define MM_RBI_(R, G, RBI, XT, PF) RBI
#define MM_RBI(T, CF32, C16) {MM_RBI_ CF32, MM_RBI_ C16, MM_RBI_ C16},
static const int dense_rbi[8][3] = {DENSE_CFGS(MM_RBI)};

/* Index of w's encoding in dense_fns' rows, -1 if not a dense encoding. */
static int dense_type(const df_weight *w) {
    return w->type == DF_W_F32 ? TY_F32 : w->type == DF_W_BF16 ? TY_BF16 : w->type == DF_W_F16 ? TY_F16 : -1;
}

/* Rows per pass for (w, T), 0 if not F32 / BF16 / F16 or T outside 1..8: a multiple of the kernel's row block
 * (whole blocks per dispatcher chunk), about rows / 16 and at most 128 (each chunk stages x and starts its
 * first block without prefetch, so chunks should not be tiny; ~16 chunks still balance 2-4 threads). */
int avx2_dense_rows(const df_weight *w, int T) {
    if (T < 1 || T > 8 || dense_type(w) < 0) return 0;
    const int64_t b = dense_rbi[T - 1][dense_type(w)], m = w->rows / (16 * b), mmax = 128 / b;
    return (int)(b * (m < 1 ? 1 : m > mmax ? mmax : m));
}

/* Rows [r0, r1) of y [T, rows] = x [T, cols] . W^T (any r0 <= r1; avx2_dense_rows(w, T) > 0). */
void avx2_dense_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    if (r1 > r0) dense_fns[T - 1][dense_type(w)](w, x, y, r0, r1);
}

#else
int avx2_dense_rows(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_dense_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)x; (void)T; (void)y; (void)r0; (void)r1;
}
#endif
