/*
 * cpu_avx512.c — the AVX-512 (F+BW+VL+DQ) backend. Selected at runtime only where
 * the CPU reports avx512f/bw/vl/dq; the FP8 decoder uses AVX512-VBMI byte tables
 * when present (an exact F16C path otherwise).
 *
 * Canonical order (every matmul path of this backend, any T, any thread count): for
 * each (row, token), ONE 16-lane fp32 accumulator takes w[c..c+15] * x[c..c+15] by
 * FMA for c = 0, 16, 32, ... over the full 16-column chunks, in column order; then
 * _mm512_reduce_add_ps; then the remaining cols % 16 columns with fmaf in column
 * order. w is the exactly decoded weight (fp8 value * block scale rounded once,
 * like the scalar reference; MXFP4 / INT4 / BF16 / F16 decode exactly). This is
 * the order of the earlier row-decode + dot kernels, so results are unchanged.
 *
 * Speed: the weights are decoded in registers (no row buffer) and each weight
 * byte is read once per call for all T tokens:
 *  - T = 1: four rows at a time (four independent accumulator chains);
 *  - MXFP4 / INT4 and F32 / BF16 / F16, 2 <= T <= 8: R rows decoded in registers per 16 columns and
 *    FMA'd against the tokens in groups of up to 8 (R x G accumulators, R = 8..3); FP8 (with VBMI), 2 <= T <= 5: R rows' next 64
 *    columns decoded in registers one row at a time and FMA'd against all T tokens (R = 8..3);
 *  - otherwise T > 1: a task decodes a tile of 8 rows x 512 columns into an L1
 *    buffer once, then FMAs it against the tokens three at a time (24 accumulators
 *    in registers, spilled between tiles: the chain per (row, token) is unchanged);
 *    the next tile's lines are prefetched a few per FMA loop iteration.
 * MXFP4 / INT4 nibbles -> fp32 by a 16-entry table permute (vpermps) whose entries
 * are pre-multiplied by the block scale (exact: E8M0 is a power of two; INT4 times
 * a bf16 scale needs at most 12 significant bits). To avoid a lane-crossing
 * shuffle per 16 weights, lane 2j takes nibble j and lane 2j+1 nibble 8+j of a
 * broadcast 8-byte group (one vpsrlvd); the activations are staged once per call
 * in that lane order and the accumulator is put back in natural lane order before
 * the reduction, so each lane sums exactly the products it did before.
 * FP8 E4M3 -> fp32: every e4m3 value is a bf16, so two 128-entry byte tables
 * (vpermi2b) give the high and low bytes of its bf16 bits for 64 weights at once.
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"), always_inline)) static inline
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))
#define VBMI_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c"), always_inline)) static inline

#define UNROLL _Pragma("GCC unroll 8")

/* ------------------------------------------------------------ constants */

static float e8m0_tab[256];                  /* E8M0 byte -> 2^(e-127) (255: NaN) */
static float mx_tabs[256 * 16] __attribute__((aligned(64))); /* [e][nibble]: E2M1 value * 2^(e-127) */
static float fp8_tab[256];                   /* e4m3fn byte -> fp32 */
static uint8_t fp8_hi[128], fp8_lo[128];     /* bf16 bits of the e4m3 magnitude i: high byte, low byte */
static int have_vbmi;
/* 16-entry value tables (index = nibble): E2M1 (code 8 = +0, like the integer decode before) and INT4 (q - 8) */
static const float mx_vals[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
static const float i4_vals[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
/* nibble lane order: lane 2j = element j, lane 2j+1 = element 8+j */
static const int32_t q4_shift[16] = {0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28};
static const int32_t q4_to_nat[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};  /* nat[l] = perm[idx[l]] */
static const int32_t nat_to_q4[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};  /* perm[m] = nat[idx[m]] */
/* FP8 two-source gather: output byte 4j+2 <- lo byte of code j, 4j+3 <- hi byte (bytes 4j, 4j+1 zeroed by the mask) */
static uint8_t fp8_gather[64];

__attribute__((constructor)) static void avx512_tables_init(void) {
    for (int i = 0; i < 256; i++) {
        e8m0_tab[i] = df_e8m0_to_f32((uint8_t)i);
        for (int n = 0; n < 16; n++) mx_tabs[i * 16 + n] = mx_vals[n] * e8m0_tab[i]; /* the same product as a vmulps */
        fp8_tab[i] = df_fp8e4m3_to_f32((uint8_t)i);
    }
    for (int i = 0; i < 128; i++) {
        float f = df_fp8e4m3_to_f32((uint8_t)i);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (u & 0xffff) abort(); /* every e4m3 value is a bf16 */
        fp8_hi[i] = (uint8_t)(u >> 24);
        fp8_lo[i] = (uint8_t)(u >> 16);
    }
    for (int j = 0; j < 16; j++) {
        fp8_gather[4 * j] = fp8_gather[4 * j + 1] = 0;
        fp8_gather[4 * j + 2] = (uint8_t)j;
        fp8_gather[4 * j + 3] = (uint8_t)(64 + j);
    }
    __builtin_cpu_init();
    have_vbmi = __builtin_cpu_supports("avx512vbmi");
}

/* ------------------------------------------------------------ small ops */

/* The backend's dot product: two 16-lane chains over alternate 16-column chunks and a masked tail (dot_acc: their
 * sum, before the reduction), then hsum512. */
AVX512_INLINE __m512 dot_acc(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s1);
    }
    return _mm512_add_ps(s0, s1);
}
/* The dot product's reduction of 16 lanes v[0..15], written out (GCC's _mm512_reduce_add_ps makes the same
 * additions): u[j] = v[j] + v[j+8], w[j] = u[j] + u[j+4], x[j] = w[j] + w[j+2], x[0] + x[1]. hsum512x16 makes the
 * same additions for 16 vectors at once. */
AVX512_INLINE float hsum512(__m512 v) {
    const __m256 u = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 w = _mm_add_ps(_mm256_extractf128_ps(u, 1), _mm256_castps256_ps128(u));
    const __m128 x = _mm_add_ps(w, _mm_shuffle_ps(w, w, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(x) + _mm_cvtss_f32(_mm_shuffle_ps(x, x, _MM_SHUFFLE(1, 1, 1, 1)));
}
/* hsum512 of 16 vectors: lane m of the result is hsum512(v[4 * (m % 4) + m / 4]) (the order the pairwise shuffles
 * leave; callers put the vector for output lane q in v[4 * (q % 4) + q / 4]). 15 adds and 30 in-register shuffles
 * instead of 16 reductions of 8 dependent steps each. */
AVX512_INLINE __m512 hsum512x16(const __m512 *v) {
    __m512 wv[8], xv[4], yv[2];
    UNROLL for (int i = 0; i < 8; i++) /* u of v[2i] (lanes 0-7) and of v[2i+1] (lanes 8-15) */
        wv[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    UNROLL for (int i = 0; i < 4; i++) /* w of v[4i + L] in 128-bit lane L */
        xv[i] = _mm512_add_ps(_mm512_shuffle_f32x4(wv[2 * i], wv[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(wv[2 * i], wv[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    UNROLL for (int i = 0; i < 2; i++) /* lane L: x of v[8i + L], then of v[8i + 4 + L] */
        yv[i] = _mm512_add_ps(_mm512_shuffle_ps(xv[2 * i], xv[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(xv[2 * i], xv[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane L: the sums of v[L], v[4 + L], v[8 + L], v[12 + L] */
    return _mm512_add_ps(_mm512_shuffle_ps(yv[0], yv[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(yv[0], yv[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
AVX512_INLINE float dot_impl(const float *a, const float *b, int64_t n) { return hsum512(dot_acc(a, b, n)); }
AVX512 static float avx512_dot(const float *a, const float *b, int64_t n) { return dot_impl(a, b, n); }

AVX512 static void avx512_axpy(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Scores of one head at 16 positions [s, s + 16): their dot_acc sums reduced together by hsum512x16 (for each, the
 * additions of dot_impl's hsum512). Inlined with constant widths for the common shapes, so the chunk loops unroll. */
AVX512_INLINE void scores16(const float *ql, const float *qp, const float *c, int64_t n1, const float *kpe, int64_t n2,
                            int64_t s, __m512 vs, float *out) {
    __m512 v1[16], v2[16];
    UNROLL for (int m = 0; m < 16; m++) {
        const int64_t q = s + 4 * (m % 4) + m / 4;
        v1[m] = dot_acc(ql, c + q * n1, n1);
        v2[m] = dot_acc(qp, kpe + q * n2, n2);
    }
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_add_ps(hsum512x16(v1), hsum512x16(v2)), vs));
}
#define SCORES_BLOCKS(N1, N2)                                                                                         \
    for (; s + 16 <= npos; s += 16)                                                                                   \
        for (int h = 0; h < H; h++) scores16(ql + h * ldql, qp + h * ldqp, c, N1, kpe, N2, s, vs, p + h * ldp + s)

/* df_backend.attn_scores: 16 positions at a time per head (scores16; the 16 cached rows stay in L1 for all H
 * heads), the remaining positions by dot_impl. */
AVX512 static int avx512_attn_scores(const float *ql, int64_t ldql, const float *qp, int64_t ldqp, int H, const float *c,
                                     int64_t n1, const float *kpe, int64_t n2, int64_t npos, float scale, float *p,
                                     int64_t ldp) {
    const __m512 vs = _mm512_set1_ps(scale);
    int64_t s = 0;
    if (n1 == 512 && n2 == 64) SCORES_BLOCKS(512, 64); /* DeepSeek-V3 / Kimi K2 MLA */
    else if (n1 == 64 && n2 == 16) SCORES_BLOCKS(64, 16); /* kimi-mini */
    else SCORES_BLOCKS(n1, n2);
    for (; s < npos; s++) {
        const float *cs = c + s * n1, *ks = kpe + s * n2;
        for (int h = 0; h < H; h++)
            p[h * ldp + s] = (dot_impl(ql + h * ldql, cs, n1) + dot_impl(qp + h * ldqp, ks, n2)) * scale;
    }
    return 0;
}

/* df_backend.attn_values for n1 % 16 == 0 (avx512_axpy without its scalar tail): 4 heads x 4 chunks of 16 columns
 * accumulated in registers over all positions (each element's FMAs in ascending s, as the axpy calls make them). */
AVX512 static int avx512_attn_values(const float *p, int64_t ldp, int H, const float *c, int64_t n1, int64_t npos,
                                     float *o, int64_t ldo) {
    if (n1 % 16) return -1;
    for (int h0 = 0; h0 < H; h0 += 4) {
        const int hn = H - h0 < 4 ? H - h0 : 4;
        for (int64_t c0 = 0; c0 < n1; c0 += 64) {
            const int cn = (int)((n1 - c0) / 16 < 4 ? (n1 - c0) / 16 : 4);
            __m512 a[4][4];
            UNROLL for (int h = 0; h < 4; h++) UNROLL for (int k = 0; k < 4; k++)
                a[h][k] = h < hn && k < cn ? _mm512_loadu_ps(o + (h0 + h) * ldo + c0 + 16 * k) : _mm512_setzero_ps();
            if (hn == 4 && cn == 4) {
                for (int64_t s = 0; s < npos; s++) {
                    const float *cs = c + s * n1 + c0;
                    const __m512 x0 = _mm512_loadu_ps(cs), x1 = _mm512_loadu_ps(cs + 16), x2 = _mm512_loadu_ps(cs + 32),
                                 x3 = _mm512_loadu_ps(cs + 48);
                    UNROLL for (int h = 0; h < 4; h++) {
                        const __m512 va = _mm512_set1_ps(p[(h0 + h) * ldp + s]);
                        a[h][0] = _mm512_fmadd_ps(va, x0, a[h][0]);
                        a[h][1] = _mm512_fmadd_ps(va, x1, a[h][1]);
                        a[h][2] = _mm512_fmadd_ps(va, x2, a[h][2]);
                        a[h][3] = _mm512_fmadd_ps(va, x3, a[h][3]);
                    }
                }
            } else {
                for (int64_t s = 0; s < npos; s++) {
                    const float *cs = c + s * n1 + c0;
                    UNROLL for (int h = 0; h < 4; h++) {
                        if (h >= hn) break;
                        const __m512 va = _mm512_set1_ps(p[(h0 + h) * ldp + s]);
                        UNROLL for (int k = 0; k < 4; k++)
                            if (k < cn) a[h][k] = _mm512_fmadd_ps(va, _mm512_loadu_ps(cs + 16 * k), a[h][k]);
                    }
                }
            }
            UNROLL for (int h = 0; h < 4; h++) UNROLL for (int k = 0; k < 4; k++)
                if (h < hn && k < cn) _mm512_storeu_ps(o + (h0 + h) * ldo + c0 + 16 * k, a[h][k]);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ decoders */

AVX512_INLINE __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AVX512_INLINE __m512 f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* The scaled 16-entry table of one MXFP4 / INT4 block (MXFP4: one of the 256 precomputed,
 * a load instead of a multiply). */
AVX512_INLINE __m512 q4_table(df_wtype t, const void *scale, int64_t i) {
    if (t == DF_W_MXFP4) return _mm512_load_ps(mx_tabs + 16 * (size_t)((const uint8_t *)scale)[i]);
    return _mm512_mul_ps(_mm512_loadu_ps(i4_vals), _mm512_set1_ps(df_bf16_to_f32(((const uint16_t *)scale)[i])));
}
/* 16 packed nibbles (8 bytes) -> 16 weights in q4 lane order. */
AVX512_INLINE __m512 q4x16(const uint8_t *p, __m512 tbl, __m512i sh) {
    __m512i q = _mm512_srlv_epi32(_mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p)), sh);
    return _mm512_permutexvar_ps(q, tbl);
}
AVX512_INLINE __m512 q4_to_natural(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_loadu_si512(q4_to_nat), v);
}

/* FP8 decode constants: the 128-entry tables of the bf16 high / low byte of each e4m3 magnitude, the sign bit, and
 * the four gather indices (fp8_gather + 16 q: codes 16q..16q+15). */
typedef struct { __m512i hi0, hi1, lo0, lo1, sign, g[4]; } fp8_consts;
VBMI_INLINE fp8_consts fp8_consts_load(void) {
    const __m512i g = _mm512_loadu_si512(fp8_gather), s16 = _mm512_set1_epi8(16), s32 = _mm512_add_epi8(s16, s16);
    fp8_consts k = {_mm512_loadu_si512(fp8_hi), _mm512_loadu_si512(fp8_hi + 64), _mm512_loadu_si512(fp8_lo),
                    _mm512_loadu_si512(fp8_lo + 64), _mm512_set1_epi8((char)0x80),
                    {g, _mm512_add_epi8(g, s16), _mm512_add_epi8(g, s32), _mm512_add_epi8(g, _mm512_add_epi8(s32, s16))}};
    return k;
}
/* 64 e4m3 bytes -> 4 x 16 fp32 (natural order), unscaled, exact (every e4m3 value is a bf16): the bf16 high and
 * low bytes of every code looked up in natural order (two 128-entry two-source byte permutes; the sign bit or'ed
 * into the high byte), then each 16 codes' byte pairs gathered into the top halves of 16 dwords by one two-source
 * byte permute with zero-masking: 6 byte permutes per 64 weights (an in-lane unpack tree needed 9). */
VBMI_INLINE void fp8x64(const uint8_t *p, const fp8_consts *k, __m512 *v) {
    const __m512i b = _mm512_loadu_si512(p);
    __m512i hi = _mm512_permutex2var_epi8(k->hi0, b, k->hi1);
    const __m512i lo = _mm512_permutex2var_epi8(k->lo0, b, k->lo1);
    hi = _mm512_ternarylogic_epi32(hi, b, k->sign, 0xF8); /* hi | (b & 0x80) */
    const __mmask64 top = 0xCCCCCCCCCCCCCCCCull;          /* bytes 2, 3 of every dword */
    UNROLL for (int q = 0; q < 4; q++) v[q] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(top, lo, k->g[q], hi));
}
/* 16 e4m3 bytes -> 16 fp32 (natural order) without VBMI, exact: the e4m3 bits placed in an
 * IEEE half are value * 2^-8 (subnormals included); the caller folds 2^8 into the scale. */
AVX512_INLINE __m512 fp8x16_f16(const uint8_t *p) {
    __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    w = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(w);
}
/* The fp32 scale of the FP8 block of (row r, col c). */
static inline float fp8_scale(const df_weight *w, int64_t r, int64_t c) {
    return ((const float *)w->scale)[(r / 128) * ((w->cols + 127) / 128) + c / 128];
}

/* ------------------------------------------------------------ decode_row */

AVX512 static void decode_row_generic(const df_weight *w, int64_t r, float *out) {
    const int64_t cols = w->cols;
    int64_t c = 0;
    switch (w->type) {
    case DF_W_F32: {
        const float *d = (const float *)w->data + r * cols;
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, _mm512_loadu_ps(d + c));
        break;
    }
    case DF_W_BF16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, bf16x16(d + c));
        break;
    }
    case DF_W_F16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, f16x16(d + c));
        break;
    }
    case DF_W_FP8_B128: {
        const uint8_t *d = (const uint8_t *)w->data + r * cols;
        for (; c + 16 <= cols; c += 16) {
            const float s = fp8_scale(w, r, c) * 256.0f;
            if (isfinite(s)) _mm512_storeu_ps(out + c, _mm512_mul_ps(fp8x16_f16(d + c), _mm512_set1_ps(s)));
            else cpu_scalar_decode_range(w, r, c, c + 16, out);
        }
        break;
    }
    case DF_W_MXFP4:
    case DF_W_INT4_G32: {
        if (cols % 32) break;
        const uint8_t *d = (const uint8_t *)w->data + r * (cols / 2);
        const __m512i sh = _mm512_loadu_si512(q4_shift);
        for (; c < cols; c += 32) {
            __m512 tbl = q4_table(w->type, w->scale, r * (cols / 32) + c / 32);
            _mm512_storeu_ps(out + c, q4_to_natural(q4x16(d + c / 2, tbl, sh)));
            _mm512_storeu_ps(out + c + 16, q4_to_natural(q4x16(d + c / 2 + 8, tbl, sh)));
        }
        break;
    }
    case DF_W_INT8_ROW: {
        const int8_t *d = (const int8_t *)w->data + r * cols;
        __m512 sc = _mm512_set1_ps(((const float *)w->scale)[r]);
        for (; c + 16 <= cols; c += 16)
            _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(d + c)))), sc));
        break;
    }
    default:
        break;
    }
    if (c < cols) cpu_scalar_decode_range(w, r, c, cols, out);
}

VBMI static void decode_row_fp8_vbmi(const df_weight *w, int64_t r, float *out) {
    const int64_t cols = w->cols;
    const uint8_t *d = (const uint8_t *)w->data + r * cols;
    const fp8_consts k = fp8_consts_load();
    int64_t c = 0;
    for (; c + 64 <= cols; c += 64) {
        __m512 v[4];
        fp8x64(d + c, &k, v);
        __m512 s = _mm512_set1_ps(fp8_scale(w, r, c));
        UNROLL for (int q = 0; q < 4; q++) _mm512_storeu_ps(out + c + 16 * q, _mm512_mul_ps(v[q], s));
    }
    if (c < cols) cpu_scalar_decode_range(w, r, c, cols, out);
}

static void avx512_decode_row(const df_weight *w, int64_t r, float *out) {
    if (w->type == DF_W_FP8_B128 && have_vbmi) decode_row_fp8_vbmi(w, r, out);
    else decode_row_generic(w, r, out);
}

/* ------------------------------------------------------------ T = 1 kernels */

/* Finish one (row, token): reduce the accumulator, then the scalar tail [c, cols) in column
 * order with fmaf on the exactly decoded weights (x in natural order). */
AVX512_INLINE float finish(const df_weight *w, int64_t r, __m512 acc, int64_t c, const float *x) {
    float o = _mm512_reduce_add_ps(acc);
    if (c < w->cols) {
        float t[16];
        cpu_scalar_decode_range(w, r, c, w->cols, t - c);
        for (int64_t i = c; i < w->cols; i++) o = fmaf(t[i - c], x[i], o);
    }
    return o;
}

/* Software prefetch of the T = 1 row streams (distance, cache level), per encoding; measured
 * on cold weights (bench/RESULTS.md): dense rows take it into L1 1 KiB ahead, FP8 512 B ahead,
 * the 4-bit encodings (slow streams, 4 rows + scales) into L2/L3 4 KiB ahead. */
#define PF_DENSE(p) _mm_prefetch((const char *)(p) + 1024, _MM_HINT_T0)
#define PF_FP8(p) _mm_prefetch((const char *)(p) + 512, _MM_HINT_T0)
/* The next pass's rows of a T = 1 dense / FP8 kernel: one contiguous run of bytes [p, end), taken
 * into L2 a line per row-line the current pass reads, so that a pass's first loads do not wait
 * for DRAM while the hardware prefetcher picks up R new streams (short rows gain most: 7168x2048
 * BF16 / FP8 read 20 / 15-17 GB/s without it, 29-30 / 24-26 with it on an AMD EPYC VM, 2 threads). */
typedef struct { const char *p, *end; } next_run;
/* The run of rows [r + R, min(r + 2R, r1)) of an array of `row_bytes`-byte rows at base (a weight's data, or its
 * per-row scales). */
static inline next_run next_run_of(const void *base, int64_t r, int64_t r1, int R, int64_t row_bytes) {
    const int64_t nn = r + R < r1 ? (r1 - r - R < R ? r1 - r - R : R) : 0;
    next_run n = {(const char *)base + (r + R) * row_bytes, NULL};
    n.end = n.p + nn * row_bytes;
    return n;
}
/* Prefetch the next `lines` cache lines of run n (none past its end) with the given hint. */
#define PF_NEXT(n, lines, hint) do { for (int64_t q_ = 0; q_ < (lines) && (n).p < (n).end; q_++, (n).p += 64) _mm_prefetch((n).p, hint); } while (0)
#ifndef Q4_PF_DIST
#define Q4_PF_DIST 4096
#define Q4_PF_HINT _MM_HINT_T2
#endif
#define PF_Q4(p) do { if (Q4_PF_DIST) _mm_prefetch((const char *)(p) + Q4_PF_DIST, Q4_PF_HINT); } while (0)

/* Rows [r0, r1) of an F32/BF16/F16 weight, one token: DENSE_T1_ROWS rows per pass (that many accumulator chains
 * and row streams). */
#ifndef DENSE_T1_ROWS
#define DENSE_T1_ROWS 4
#endif
AVX512 static void mv_dense(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    enum { R = DENSE_T1_ROWS };
    const int64_t cols = w->cols, es = w->type == DF_W_F32 ? 4 : 2;
    const int64_t c16 = cols / 16 * 16;
    for (int64_t r = r0; r < r1; r += R) {
        const int nr = r1 - r < R ? (int)(r1 - r) : R;
        const char *p[R];
        __m512 a[R];
        UNROLL for (int k = 0; k < R; k++) {
            p[k] = (const char *)w->data + (r + (k < nr ? k : 0)) * cols * es;
            a[k] = _mm512_setzero_ps();
        }
        int64_t c = 0;
        next_run nx = next_run_of(w->data, r, r1, R, cols * es);
#define DENSE_LOOP(LOAD)                                                                                  \
    for (; c < c16; c += 16) {                                                                            \
        __m512 xv = _mm512_loadu_ps(x + c);                                                               \
        if (((c * es) & 63) == 0) {                                                                       \
            UNROLL for (int k = 0; k < R; k++) PF_DENSE(p[k] + c * es);                                   \
            PF_NEXT(nx, R, _MM_HINT_T1);                                                                  \
        }                                                                                                 \
        UNROLL for (int k = 0; k < R; k++) a[k] = _mm512_fmadd_ps(LOAD(p[k], c), xv, a[k]);               \
    }
#define LD_F32(q, c) _mm512_loadu_ps((const float *)(q) + (c))
#define LD_BF16(q, c) bf16x16((const uint16_t *)(q) + (c))
#define LD_F16(q, c) f16x16((const uint16_t *)(q) + (c))
        if (w->type == DF_W_F32) { DENSE_LOOP(LD_F32) }
        else if (w->type == DF_W_BF16) { DENSE_LOOP(LD_BF16) }
        else { DENSE_LOOP(LD_F16) }
        for (int k = 0; k < nr; k++) y[r + k] = finish(w, r + k, a[k], c, x);
    }
}

/* Rows [r0, r1) of an MXFP4 / INT4 weight (cols % 32 == 0), one token; xq: x in q4 lane order.
 * R rows per pass (R independent accumulator chains, R row streams). The R rows of the next
 * pass are one contiguous run of bytes (and of scales): while a pass computes, that run is
 * prefetched a line or so per 32-column block (into L1, or L2 when x fills most of L1: q4_far_x),
 * so the loads of every pass but the first of a task hit cache and DRAM streams at a steady rate
 * (nothing past r1 is fetched). */
#ifndef Q4_ROWS
#define Q4_ROWS 4
#endif
/* The next pass's run goes into L1 (_MM_HINT_T0) unless the activations already take most of it: when x (cols
 * fp32 values) is over 3/4 of the L1 data cache, into L2 (_MM_HINT_T1), so that the prefetched run does not evict
 * the x lines every row reads. Measured on an AMD Zen 4 dev VM (32 KiB L1D, bench/RESULTS.md): 2048x7168 (28 KiB of
 * x) 21.5-21.9 GB/s with T0, 24.8-25.0 with T1; 7168x2048 (8 KiB) 25.2-27.1 with T0, 21.8-22.5 with T1. */
static int q4_far_x(int64_t cols) {
    static long l1d = -1;
    if (l1d < 0) {
        const long v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        l1d = v > 0 ? v : 48 * 1024;
    }
    return cols * 4 > l1d * 3 / 4;
}
AVX512_INLINE void mv_q4_impl(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1, const df_wtype t) {
    enum { R = Q4_ROWS };
    const int64_t cols = w->cols, nb = cols / 32, rowb = cols / 2, sclb = t == DF_W_MXFP4 ? nb : 2 * nb;
    const __m512i sh = _mm512_loadu_si512(q4_shift);
    const int far = q4_far_x(cols);
    for (int64_t r = r0; r < r1; r += R) {
        const int nr = r1 - r < R ? (int)(r1 - r) : R;
        const uint8_t *p[R];
        int64_t s[R];
        __m512 a[R];
        UNROLL for (int k = 0; k < R; k++) {
            const int64_t rr = k < nr ? r + k : r;
            p[k] = (const uint8_t *)w->data + rr * rowb;
            s[k] = rr * nb;
            a[k] = _mm512_setzero_ps();
        }
        /* the next pass's bytes and scales, `per` lines of bytes per block */
        next_run nd = next_run_of(w->data, r, r1, R, rowb), ns = next_run_of(w->scale, r, r1, R, sclb);
        const int64_t per = ((nd.end - nd.p) / 64 + nb - 1) / nb;
        for (int64_t b = 0; b < nb; b++) {
            const __m512 x0 = _mm512_loadu_ps(xq + 32 * b), x1 = _mm512_loadu_ps(xq + 32 * b + 16);
            const int64_t o = 16 * b;
            if (far) {
                PF_NEXT(nd, per, _MM_HINT_T1);
                PF_NEXT(ns, 1, _MM_HINT_T1);
            } else {
                PF_NEXT(nd, per, _MM_HINT_T0);
                PF_NEXT(ns, 1, _MM_HINT_T0);
            }
            UNROLL for (int k = 0; k < R; k++) {
                const __m512 tb = q4_table(t, w->scale, s[k] + b);
                a[k] = _mm512_fmadd_ps(q4x16(p[k] + o, tb, sh), x0, a[k]);
                a[k] = _mm512_fmadd_ps(q4x16(p[k] + o + 8, tb, sh), x1, a[k]);
            }
        }
        UNROLL for (int k = 0; k < R; k++) if (k < nr) y[r + k] = _mm512_reduce_add_ps(q4_to_natural(a[k]));
    }
}
AVX512 static void mv_mxfp4(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1) {
    mv_q4_impl(w, xq, y, r0, r1, DF_W_MXFP4);
}
AVX512 static void mv_int4(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1) {
    mv_q4_impl(w, xq, y, r0, r1, DF_W_INT4_G32);
}

/* Rows [r0, r1) of an MXFP4 / INT4 weight, 2 <= T <= 8 tokens (xq: T rows of x in q4 lane
 * order, `cols` apart): R rows decoded in registers once per 16 columns and FMA'd against G
 * tokens at a time (R x G accumulators; no tile buffer; the G-token groups of one row block run
 * back to back, so its weight bytes come from L1 after the first). The chain per (row, token)
 * is the canonical one. */
AVX512_INLINE void mm_q4_small(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1, const df_wtype t,
                               const int T, const int G, const int R) {
    const int64_t cols = w->cols, rows = w->rows, nb = cols / 32;
    const __m512i sh = _mm512_loadu_si512(q4_shift);
    for (int64_t r = r0; r < r1; r += R) {
        const int nr = r1 - r < R ? (int)(r1 - r) : R;
        const uint8_t *p[8];
        int64_t s[8];
        UNROLL for (int k = 0; k < R; k++) {
            const int64_t rr = k < nr ? r + k : r;
            p[k] = (const uint8_t *)w->data + rr * (cols / 2);
            s[k] = rr * nb;
        }
        for (int g = 0; g < T; g += G) {
            const float *xg = xq + (int64_t)g * cols;
            __m512 a[8][8];
            UNROLL for (int k = 0; k < R; k++) UNROLL for (int u = 0; u < G; u++) a[k][u] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const int64_t o = 16 * b;
                if (g == 0 && (b & 3) == 0) UNROLL for (int k = 0; k < R; k++) PF_Q4(p[k] + o);
                UNROLL for (int h = 0; h < 2; h++) {
                    __m512 wv[8];
                    UNROLL for (int k = 0; k < R; k++) wv[k] = q4x16(p[k] + o + 8 * h, q4_table(t, w->scale, s[k] + b), sh);
                    UNROLL for (int u = 0; u < G; u++) {
                        const __m512 xv = _mm512_loadu_ps(xg + u * cols + 32 * b + 16 * h);
                        UNROLL for (int k = 0; k < R; k++) a[k][u] = _mm512_fmadd_ps(wv[k], xv, a[k][u]);
                    }
                }
            }
            UNROLL for (int k = 0; k < R; k++)
                if (k < nr)
                    UNROLL for (int u = 0; u < G; u++)
                        y[(int64_t)(g + u) * rows + r + k] = _mm512_reduce_add_ps(q4_to_natural(a[k][u]));
        }
    }
}
#ifndef Q4_T8_G
#define Q4_T8_G 8
#define Q4_T8_R 3
#endif
#define Q4_SMALL(T, G, R)                                                                                                   \
    AVX512 static void mm_mx_##T(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1) {                \
        mm_q4_small(w, xq, y, r0, r1, DF_W_MXFP4, T, G, R);                                                             \
    }                                                                                                                   \
    AVX512 static void mm_i4_##T(const df_weight *w, const float *xq, float *y, int64_t r0, int64_t r1) {                \
        mm_q4_small(w, xq, y, r0, r1, DF_W_INT4_G32, T, G, R);                                                          \
    }
Q4_SMALL(2, 2, 8)
Q4_SMALL(3, 3, 6)
Q4_SMALL(4, 4, 5)
Q4_SMALL(5, 5, 4)
Q4_SMALL(6, 6, 4)
Q4_SMALL(7, 7, 3)
Q4_SMALL(8, Q4_T8_G, Q4_T8_R)
/* Token counts that take the small-T MXFP4 / INT4 kernels (at most 8), and their rows per pass for
 * T = 0..8 (T = 1: mv_q4; the pool's chunks are a multiple of it). */
#ifndef Q4_SMALL_MAX
#define Q4_SMALL_MAX 8
#endif
static const int q4_small_rows[9] = {Q4_ROWS, Q4_ROWS, 8, 6, 5, 4, 4, 3, Q4_T8_R};
typedef void (*q4_small_fn)(const df_weight *, const float *, float *, int64_t, int64_t);
static const q4_small_fn mm_mx_small[9] = {NULL, NULL, mm_mx_2, mm_mx_3, mm_mx_4, mm_mx_5, mm_mx_6, mm_mx_7, mm_mx_8};
static const q4_small_fn mm_i4_small[9] = {NULL, NULL, mm_i4_2, mm_i4_3, mm_i4_4, mm_i4_5, mm_i4_6, mm_i4_7, mm_i4_8};

/* Rows [r0, r1) of an F32 / BF16 / F16 weight, 2 <= T <= DENSE_SMALL_MAX tokens (x: T rows, `cols` apart): as mm_q4_small, R rows
 * decoded in registers once per 16 columns and FMA'd against G tokens at a time (R x G accumulators, no tile buffer;
 * the token groups of one row block run back to back, so each weight byte is read from DRAM once per call and the
 * later groups' from L1 / L2; the activations come from L1 / L2). The chain per (row, token) is the canonical one:
 * 16-column chunks in order, the reduction, then finish's scalar tail. */
AVX512_INLINE __m512 dense16(const char *row, int64_t c, const df_wtype t) {
    if (t == DF_W_F32) return _mm512_loadu_ps((const float *)row + c);
    if (t == DF_W_BF16) return bf16x16((const uint16_t *)row + c);
    return f16x16((const uint16_t *)row + c);
}
AVX512_INLINE void mm_dense_small(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const df_wtype t,
                                  const int T, const int G, const int R) {
    const int64_t cols = w->cols, rows = w->rows, c16 = cols / 16 * 16, es = t == DF_W_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r += R) {
        const int nr = r1 - r < R ? (int)(r1 - r) : R;
        const char *p[8];
        UNROLL for (int k = 0; k < R; k++) p[k] = (const char *)w->data + (r + (k < nr ? k : 0)) * cols * es;
        next_run nx = next_run_of(w->data, r, r1, R, cols * es);
        for (int g = 0; g < T; g += G) {
            const int gn = T - g < G ? T - g : G; /* tokens in this group */
            const float *xg = x + (int64_t)g * cols;
            float *yg = y + (int64_t)g * rows;
            __m512 a[8][8];
            UNROLL for (int k = 0; k < R; k++) UNROLL for (int u = 0; u < G; u++) a[k][u] = _mm512_setzero_ps();
            for (int64_t c = 0; c < c16; c += 16) {
                if (g == 0 && ((c * es) & 63) == 0) {
                    UNROLL for (int k = 0; k < R; k++) PF_DENSE(p[k] + c * es);
                    PF_NEXT(nx, R, _MM_HINT_T1);
                }
                __m512 wv[8];
                UNROLL for (int k = 0; k < R; k++) wv[k] = dense16(p[k], c, t);
                UNROLL for (int u = 0; u < G; u++) if (u < gn) {
                    const __m512 xv = _mm512_loadu_ps(xg + u * cols + c);
                    UNROLL for (int k = 0; k < R; k++) a[k][u] = _mm512_fmadd_ps(wv[k], xv, a[k][u]);
                }
            }
            UNROLL for (int k = 0; k < R; k++)
                if (k < nr)
                    UNROLL for (int u = 0; u < G; u++) if (u < gn)
                        yg[(int64_t)u * rows + r + k] = finish(w, r + k, a[k][u], c16, xg + (int64_t)u * cols);
        }
    }
}
/* The token counts that take mm_dense_small (up to 6 tokens in one group; 7 and 8 in groups of 4 tokens over 5 rows,
 * the second group's weights from L1: 8 tokens over 3 rows in one group read every activation from L2 for each 3
 * rows and were slower than the tiles of mm_tiles, the groups of 4 faster, on the dev VM: bench/RESULTS.md), and its
 * rows per pass for T = 0..DENSE_SMALL_MAX (R x G accumulators + R weights + 1 activation <= 32 registers; as
 * DENSE_SMALL below). */
#define DENSE_SMALL_MAX 8
static const int dense_small_rows[DENSE_SMALL_MAX + 1] = {4, 4, 8, 6, 5, 4, 4, 5, 5};
#define DENSE_SMALL(T, G, R)                                                                                            \
    AVX512 static void mm_dense_##T(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {             \
        if (w->type == DF_W_F32) mm_dense_small(w, x, y, r0, r1, DF_W_F32, T, G, R);                                    \
        else if (w->type == DF_W_BF16) mm_dense_small(w, x, y, r0, r1, DF_W_BF16, T, G, R);                             \
        else mm_dense_small(w, x, y, r0, r1, DF_W_F16, T, G, R);                                                        \
    }
DENSE_SMALL(2, 2, 8)
DENSE_SMALL(3, 3, 6)
DENSE_SMALL(4, 4, 5)
DENSE_SMALL(5, 5, 4)
DENSE_SMALL(6, 6, 4)
DENSE_SMALL(7, 4, 5)
DENSE_SMALL(8, 4, 5)
static const q4_small_fn mm_dense_smallT[DENSE_SMALL_MAX + 1] = {NULL, NULL, mm_dense_2, mm_dense_3, mm_dense_4, mm_dense_5,
                                                                mm_dense_6, mm_dense_7, mm_dense_8};

/* Rows [r0, r1) of an FP8 weight, one token. */
VBMI_INLINE __m512 fp8_row64(const uint8_t *p, const fp8_consts *K, float s, __m512 x0, __m512 x1, __m512 x2, __m512 x3,
                             __m512 a) {
    __m512 v[4];
    PF_FP8(p);
    fp8x64(p, K, v);
    const __m512 sv = _mm512_set1_ps(s);
    a = _mm512_fmadd_ps(_mm512_mul_ps(v[0], sv), x0, a);
    a = _mm512_fmadd_ps(_mm512_mul_ps(v[1], sv), x1, a);
    a = _mm512_fmadd_ps(_mm512_mul_ps(v[2], sv), x2, a);
    return _mm512_fmadd_ps(_mm512_mul_ps(v[3], sv), x3, a);
}
VBMI static void mv_fp8_vbmi(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, c64 = cols / 64 * 64, c16 = cols / 16 * 16;
    const fp8_consts K = fp8_consts_load();
    for (int64_t r = r0; r < r1; r += 4) {
        const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        const int64_t rr[4] = {r, nr > 1 ? r + 1 : r, nr > 2 ? r + 2 : r, nr > 3 ? r + 3 : r};
        const uint8_t *p0 = (const uint8_t *)w->data + rr[0] * cols, *p1 = (const uint8_t *)w->data + rr[1] * cols,
                      *p2 = (const uint8_t *)w->data + rr[2] * cols, *p3 = (const uint8_t *)w->data + rr[3] * cols;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t c = 0;
        next_run nx = next_run_of(w->data, r, r1, 4, cols);
        for (; c < c64; c += 64) {
            const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16), x2 = _mm512_loadu_ps(x + c + 32),
                         x3 = _mm512_loadu_ps(x + c + 48);
            PF_NEXT(nx, 4, _MM_HINT_T1);
            a0 = fp8_row64(p0 + c, &K, fp8_scale(w, rr[0], c), x0, x1, x2, x3, a0);
            a1 = fp8_row64(p1 + c, &K, fp8_scale(w, rr[1], c), x0, x1, x2, x3, a1);
            a2 = fp8_row64(p2 + c, &K, fp8_scale(w, rr[2], c), x0, x1, x2, x3, a2);
            a3 = fp8_row64(p3 + c, &K, fp8_scale(w, rr[3], c), x0, x1, x2, x3, a3);
        }
        __m512 a[4] = {a0, a1, a2, a3};
        for (; c < c16; c += 16) {
            const __m512 xv = _mm512_loadu_ps(x + c);
            for (int k = 0; k < 4; k++) {
                float t[16];
                cpu_scalar_decode_range(w, rr[k], c, c + 16, t - c);
                a[k] = _mm512_fmadd_ps(_mm512_loadu_ps(t), xv, a[k]);
            }
        }
        for (int k = 0; k < nr; k++) y[r + k] = finish(w, r + k, a[k], c, x);
    }
}

/* Rows [r0, r1) of an FP8 weight, 2 <= T <= FP8_SMALL_MAX tokens (x: T rows, `cols` apart): each row's next 64
 * columns are decoded once in registers (fp8x64, times the block scale: the weights of the T = 1 kernel) and FMA'd
 * against every token, 16 columns at a time in column order (R x T accumulators; the activations come from L1). The
 * chain per (row, token) is the canonical one: 16-column chunks in order, the reduction, then finish's scalar tail. */
VBMI_INLINE void mm_fp8_small(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const int T,
                              const int R) {
    const int64_t cols = w->cols, rows = w->rows, c64 = cols / 64 * 64, c16 = cols / 16 * 16;
    const fp8_consts K = fp8_consts_load();
    for (int64_t r = r0; r < r1; r += R) {
        const int nr = r1 - r < R ? (int)(r1 - r) : R;
        const uint8_t *p[8];
        int64_t rr[8];
        UNROLL for (int k = 0; k < R; k++) {
            rr[k] = k < nr ? r + k : r;
            p[k] = (const uint8_t *)w->data + rr[k] * cols;
        }
        __m512 a[8][8];
        UNROLL for (int k = 0; k < R; k++) UNROLL for (int u = 0; u < T; u++) a[k][u] = _mm512_setzero_ps();
        next_run nx = next_run_of(w->data, r, r1, R, cols);
        int64_t c = 0;
        for (; c < c64; c += 64) {
            PF_NEXT(nx, R, _MM_HINT_T1);
            UNROLL for (int k = 0; k < R; k++) {
                __m512 v[4];
                PF_FP8(p[k] + c);
                fp8x64(p[k] + c, &K, v);
                const __m512 sv = _mm512_set1_ps(fp8_scale(w, rr[k], c));
                UNROLL for (int q = 0; q < 4; q++) {
                    const __m512 wq = _mm512_mul_ps(v[q], sv);
                    UNROLL for (int u = 0; u < T; u++)
                        a[k][u] = _mm512_fmadd_ps(wq, _mm512_loadu_ps(x + (int64_t)u * cols + c + 16 * q), a[k][u]);
                }
            }
        }
        for (; c < c16; c += 16)
            for (int k = 0; k < R; k++) {
                float t[16];
                cpu_scalar_decode_range(w, rr[k], c, c + 16, t - c);
                const __m512 wq = _mm512_loadu_ps(t);
                for (int u = 0; u < T; u++) a[k][u] = _mm512_fmadd_ps(wq, _mm512_loadu_ps(x + (int64_t)u * cols + c), a[k][u]);
            }
        UNROLL for (int k = 0; k < R; k++)
            if (k < nr)
                UNROLL for (int u = 0; u < T; u++)
                    y[(int64_t)u * rows + r + k] = finish(w, r + k, a[k][u], c16, x + (int64_t)u * cols);
    }
}
/* The token counts that take mm_fp8_small (from 6 tokens on, whose R <= 3 rows reload every activation for each
 * row, the tiles of mm_tiles were as fast or faster on the dev VM: bench/RESULTS.md), and its rows per pass for
 * T = 0..FP8_SMALL_MAX (R x T accumulators + the decoded 64 columns + the decoder's tables within 32 registers). */
#define FP8_SMALL_MAX 5
static const int fp8_small_rows[FP8_SMALL_MAX + 1] = {4, 4, 8, 6, 4, 3}; /* as FP8_SMALL below */
#define FP8_SMALL(T, R)                                                                                                 \
    VBMI static void mm_fp8_##T(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {                 \
        mm_fp8_small(w, x, y, r0, r1, T, R);                                                                            \
    }
FP8_SMALL(2, 8)
FP8_SMALL(3, 6)
FP8_SMALL(4, 4)
FP8_SMALL(5, 3)
static const q4_small_fn mm_fp8_smallT[FP8_SMALL_MAX + 1] = {NULL, NULL, mm_fp8_2, mm_fp8_3, mm_fp8_4, mm_fp8_5};

/* ------------------------------------------------------------ T > 1: tiles */

#define TR 8     /* rows per tile */
#define TC 512   /* columns per tile (a multiple of 64) */

/* Decode rows [r, r+nr) x cols [c0, c0+n) (n a multiple of 16, whole chunks) into wb[k*TC + i]
 * (q4 lane order for MXFP4 / INT4); rows nr..TR-1 are zero. */
AVX512 static void tile_decode(const df_weight *w, int64_t r, int nr, int64_t c0, int64_t n, float *wb) {
    const int64_t cols = w->cols;
    for (int k = 0; k < TR; k++) {
        float *o = wb + (int64_t)k * TC;
        if (k >= nr) {
            for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(o + i, _mm512_setzero_ps());
            continue;
        }
        const int64_t rr = r + k;
        switch (w->type) {
        case DF_W_F32: {
            const float *d = (const float *)w->data + rr * cols + c0;
            for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(o + i, _mm512_loadu_ps(d + i));
            break;
        }
        case DF_W_BF16: {
            const uint16_t *d = (const uint16_t *)w->data + rr * cols + c0;
            for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(o + i, bf16x16(d + i));
            break;
        }
        case DF_W_F16: {
            const uint16_t *d = (const uint16_t *)w->data + rr * cols + c0;
            for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(o + i, f16x16(d + i));
            break;
        }
        case DF_W_MXFP4:
        case DF_W_INT4_G32: {
            const uint8_t *d = (const uint8_t *)w->data + rr * (cols / 2) + c0 / 2;
            const __m512i sh = _mm512_loadu_si512(q4_shift);
            const int64_t sb = rr * (cols / 32) + c0 / 32;
            for (int64_t i = 0; i < n; i += 32) {
                __m512 tbl = q4_table(w->type, w->scale, sb + i / 32);
                _mm512_store_ps(o + i, q4x16(d + i / 2, tbl, sh));
                _mm512_store_ps(o + i + 16, q4x16(d + i / 2 + 8, tbl, sh));
            }
            break;
        }
        default:
            break;
        }
    }
}

VBMI static void tile_decode_fp8_vbmi(const df_weight *w, int64_t r, int nr, int64_t c0, int64_t n, float *wb) {
    const fp8_consts K = fp8_consts_load();
    for (int k = 0; k < TR; k++) {
        float *o = wb + (int64_t)k * TC;
        if (k >= nr) {
            for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(o + i, _mm512_setzero_ps());
            continue;
        }
        const uint8_t *d = (const uint8_t *)w->data + (r + k) * w->cols + c0;
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) {
            __m512 v[4];
            fp8x64(d + i, &K, v);
            const __m512 s = _mm512_set1_ps(fp8_scale(w, r + k, c0 + i));
            UNROLL for (int q = 0; q < 4; q++) _mm512_store_ps(o + i + 16 * q, _mm512_mul_ps(v[q], s));
        }
        if (i < n) cpu_scalar_decode_range(w, r + k, c0 + i, c0 + n, o - c0);
    }
}

/* FP8 without VBMI: the exact F16C decoder (scale * 2^8 folded; absurd scales go to the scalar decoder). */
AVX512 static void tile_decode_fp8_f16c(const df_weight *w, int64_t r, int nr, int64_t c0, int64_t n, float *wb) {
    for (int k = 0; k < nr; k++) {
        float *o = wb + (int64_t)k * TC;
        const uint8_t *d = (const uint8_t *)w->data + (r + k) * w->cols + c0;
        for (int64_t i = 0; i < n; i += 16) {
            const float s = fp8_scale(w, r + k, c0 + i) * 256.0f;
            if (isfinite(s)) _mm512_store_ps(o + i, _mm512_mul_ps(fp8x16_f16(d + i), _mm512_set1_ps(s)));
            else cpu_scalar_decode_range(w, r + k, c0 + i, c0 + i + 16, o - c0);
        }
    }
}

/* Decode a tile (rows [r, r+nr) x cols [c0, c0+n), n a multiple of 16) into wb; q4: MXFP4 / INT4
 * in q4 lane order (else every encoding in natural order). Rows nr..TR-1 are zero. */
static void tile_decode_rows(const df_weight *w, int q4, int64_t r, int nr, int64_t c0, int64_t n, float *wb) {
    switch (w->type) {
    case DF_W_F32: case DF_W_BF16: case DF_W_F16:
        tile_decode(w, r, nr, c0, n, wb);
        return;
    case DF_W_MXFP4: case DF_W_INT4_G32:
        if (q4) { tile_decode(w, r, nr, c0, n, wb); return; }
        break;
    case DF_W_FP8_B128:
        if (have_vbmi) tile_decode_fp8_vbmi(w, r, nr, c0, n, wb);
        else tile_decode_fp8_f16c(w, r, nr, c0, n, wb);
        for (int k = nr; k < TR; k++) memset(wb + (int64_t)k * TC, 0, sizeof(float) * (size_t)n);
        return;
    default:
        break;
    }
    /* INT8 rows (lossy mode) and malformed MXFP4 / INT4 shapes: exact scalar decode */
    for (int k = 0; k < TR; k++) {
        float *o = wb + (int64_t)k * TC;
        if (k < nr) cpu_scalar_decode_range(w, r + k, c0, c0 + n, o - c0);
        else memset(o, 0, sizeof(float) * (size_t)n);
    }
}

/* The cache lines of a tile's weight bytes (and scales), to be prefetched a few per FMA loop
 * iteration while the previous tile computes (a burst of prefetches would stall on the line
 * fill buffers). */
typedef struct {
    const char *line[TR * (TC * 4 / 64) + 2 * TR];
    int n, next, per_iter;
} pf_plan;

static void pf_plan_tile(pf_plan *pf, const df_weight *w, int64_t r, int nr, int64_t c0, int64_t n) {
    const int64_t cols = w->cols;
    pf->n = pf->next = 0;
    for (int k = 0; k < nr; k++) {
        const char *d, *sc = NULL;
        int64_t len;
        const int64_t rr = r + k;
        switch (w->type) {
        case DF_W_F32: d = (const char *)w->data + (rr * cols + c0) * 4; len = n * 4; break;
        case DF_W_BF16: case DF_W_F16: d = (const char *)w->data + (rr * cols + c0) * 2; len = n * 2; break;
        case DF_W_FP8_B128: case DF_W_INT8_ROW: d = (const char *)w->data + rr * cols + c0; len = n; break;
        case DF_W_MXFP4:
            d = (const char *)w->data + rr * (cols / 2) + c0 / 2; len = n / 2;
            sc = (const char *)w->scale + rr * (cols / 32) + c0 / 32;
            break;
        case DF_W_INT4_G32:
            d = (const char *)w->data + rr * (cols / 2) + c0 / 2; len = n / 2;
            sc = (const char *)w->scale + (rr * (cols / 32) + c0 / 32) * 2;
            break;
        default: return;
        }
        /* whole lines from the one holding d to the one holding d + len - 1 */
        const char *a = (const char *)((uintptr_t)d & ~(uintptr_t)63);
        for (; a < d + len; a += 64) pf->line[pf->n++] = a;
        if (sc) pf->line[pf->n++] = sc;
    }
}

static inline void pf_step(pf_plan *pf) {
    for (int i = 0; i < pf->per_iter && pf->next < pf->n; i++) _mm_prefetch(pf->line[pf->next++], _MM_HINT_T0);
}

/* acc[k*TT + t] += wb[k][0..n) . x_t[0..n) chunk by chunk, for TR rows x TT tokens (TT <= 3). */
#define MK_DEF(TT)                                                                                            \
    AVX512 static void mk##TT(const float *wb, const float *x, int64_t xstride, int64_t n, __m512 *acc,       \
                              pf_plan *pf) {                                                                  \
        __m512 a[TR][TT];                                                                                     \
        UNROLL for (int k = 0; k < TR; k++)                                                                   \
            UNROLL for (int t = 0; t < TT; t++) a[k][t] = acc[k * TT + t];                                    \
        for (int64_t i = 0; i < n; i += 16) {                                                                 \
            __m512 xv[TT];                                                                                    \
            pf_step(pf);                                                                                      \
            UNROLL for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_ps(x + t * xstride + i);                 \
            UNROLL for (int k = 0; k < TR; k++) {                                                             \
                __m512 wv = _mm512_load_ps(wb + k * TC + i);                                                  \
                __asm__("" : "+v"(wv)); /* one load per row, not one per FMA */                                \
                UNROLL for (int t = 0; t < TT; t++) a[k][t] = _mm512_fmadd_ps(wv, xv[t], a[k][t]);            \
            }                                                                                                 \
        }                                                                                                     \
        UNROLL for (int k = 0; k < TR; k++)                                                                   \
            UNROLL for (int t = 0; t < TT; t++) acc[k * TT + t] = a[k][t];                                    \
    }
MK_DEF(1)
MK_DEF(2)
MK_DEF(3)

/* Rows [r0, r1), any T: xs is x staged in q4 lane order when q4 is set (MXFP4 / INT4), else x. */
AVX512 static void mm_tiles(const df_weight *w, int q4, const float *xs, const float *x, int T, float *y, int64_t r0,
                            int64_t r1) {
    const int64_t cols = w->cols, rows = w->rows, c16 = cols / 16 * 16;
    float *wb = cpu_scratch(CPU_SCRATCH_W, sizeof(float) * TR * TC);
    __m512 *acc = cpu_scratch(CPU_SCRATCH_ACC, sizeof(__m512) * TR * (size_t)T);
    pf_plan *pf = cpu_scratch(CPU_SCRATCH_PF, sizeof(pf_plan));
    if (!wb || !acc || !pf) abort(); /* small allocations; nothing sensible to do without them */
    const int64_t iters_per_tile = (int64_t)((T + 2) / 3) * (TC / 16);
    for (int64_t r = r0; r < r1; r += TR) {
        const int nr = r1 - r < TR ? (int)(r1 - r) : TR;
        for (int64_t i = 0; i < (int64_t)TR * T; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < c16; c0 += TC) {
            const int64_t n = c16 - c0 < TC ? c16 - c0 : TC;
            tile_decode_rows(w, q4, r, nr, c0, n, wb);
            /* the next tile's lines, spread over the first half of this tile's FMA loop */
            if (c0 + TC < c16) pf_plan_tile(pf, w, r, nr, c0 + TC, c16 - c0 - TC < TC ? c16 - c0 - TC : TC);
            else if (r + TR < r1) pf_plan_tile(pf, w, r + TR, r1 - r - TR < TR ? (int)(r1 - r - TR) : TR, 0, c16 < TC ? c16 : TC);
            else pf->n = pf->next = 0;
            pf->per_iter = (int)((2 * pf->n + iters_per_tile - 1) / iters_per_tile);
            int t = 0;
            for (; t + 3 <= T; t += 3) mk3(wb, xs + t * cols + c0, cols, n, acc + (int64_t)TR * t, pf);
            if (T - t == 2) mk2(wb, xs + t * cols + c0, cols, n, acc + (int64_t)TR * t, pf);
            else if (T - t == 1) mk1(wb, xs + t * cols + c0, cols, n, acc + (int64_t)TR * t, pf);
            while (pf->next < pf->n) _mm_prefetch(pf->line[pf->next++], _MM_HINT_T0);
        }
        /* acc for tokens [t, t+TT) is stored as [k][TT] at acc + TR*t */
        for (int t = 0; t < T;) {
            const int tt = T - t >= 3 ? 3 : T - t;
            for (int k = 0; k < nr; k++)
                for (int u = 0; u < tt; u++) {
                    __m512 a = acc[(int64_t)TR * t + k * tt + u];
                    if (q4) a = q4_to_natural(a);
                    y[(int64_t)(t + u) * rows + r + k] = finish(w, r + k, a, c16, x + (int64_t)(t + u) * cols);
                }
            t += tt;
        }
    }
}

/* ------------------------------------------------------------ driver */

static inline int is_dense(df_wtype t) { return t == DF_W_F32 || t == DF_W_BF16 || t == DF_W_F16; }

/* The kernel a call runs, chosen once per call (mm_kernel_of) for the dispatch (mm_task) and the work split
 * (avx512_matmul: chunks of whole passes of its rows). */
typedef enum { MK_MV_DENSE, MK_MV_MXFP4, MK_MV_INT4, MK_MV_FP8, MK_Q4_SMALL, MK_FP8_SMALL, MK_DENSE_SMALL, MK_TILES } mm_kernel;

/* The kernel for T tokens of w (q4: x is staged in q4 lane order, i.e. a 4-bit weight with cols % 32 == 0) and, in
 * *rows, the rows of one of its passes. */
static mm_kernel mm_kernel_of(const df_weight *w, int T, int q4, int *rows) {
    if (T == 1) {
        *rows = 4;
        if (is_dense(w->type)) {
            *rows = DENSE_T1_ROWS;
            return MK_MV_DENSE;
        }
        if (q4) return w->type == DF_W_MXFP4 ? MK_MV_MXFP4 : MK_MV_INT4;
        if (w->type == DF_W_FP8_B128 && have_vbmi) return MK_MV_FP8;
    } else if (q4 && T <= Q4_SMALL_MAX) {
        *rows = q4_small_rows[T];
        return MK_Q4_SMALL;
    } else if (w->type == DF_W_FP8_B128 && have_vbmi && T <= FP8_SMALL_MAX) {
        *rows = fp8_small_rows[T];
        return MK_FP8_SMALL;
    } else if (is_dense(w->type) && T <= DENSE_SMALL_MAX) {
        *rows = dense_small_rows[T];
        return MK_DENSE_SMALL;
    }
    *rows = TR;
    return MK_TILES;
}

typedef struct {
    const df_weight *w;
    const float *x, *xs;   /* xs: x in q4 lane order when q4 */
    float *y;
    int T, q4;
    mm_kernel k;
} mm_job;

static void mm_task(void *ctx, int64_t r0, int64_t r1, int tid) {
    const mm_job *j = ctx;
    const df_weight *w = j->w;
    switch (j->k) {
    case MK_MV_DENSE: mv_dense(w, j->x, j->y, r0, r1); return;
    case MK_MV_MXFP4: mv_mxfp4(w, j->xs, j->y, r0, r1); return;
    case MK_MV_INT4: mv_int4(w, j->xs, j->y, r0, r1); return;
    case MK_MV_FP8: mv_fp8_vbmi(w, j->x, j->y, r0, r1); return;
    case MK_Q4_SMALL: (w->type == DF_W_MXFP4 ? mm_mx_small : mm_i4_small)[j->T](w, j->xs, j->y, r0, r1); return;
    case MK_FP8_SMALL: mm_fp8_smallT[j->T](w, j->x, j->y, r0, r1); return;
    case MK_DENSE_SMALL: mm_dense_smallT[j->T](w, j->x, j->y, r0, r1); return;
    case MK_TILES: mm_tiles(w, j->q4, j->xs, j->x, j->T, j->y, r0, r1); return;
    }
}

AVX512 static void stage_q4(const float *x, int T, int64_t cols, float *xs) {
    const __m512i idx = _mm512_loadu_si512(nat_to_q4);
    for (int64_t i = 0; i < (int64_t)T * cols; i += 16) _mm512_storeu_ps(xs + i, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(x + i)));
}

static void avx512_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    if (T <= 0 || w->rows <= 0) return;
    mm_job j = {w, x, x, y, T, 0, MK_TILES};
    if ((w->type == DF_W_MXFP4 || w->type == DF_W_INT4_G32) && w->cols % 32 == 0) {
        float *xs = cpu_scratch(CPU_SCRATCH_X, sizeof(float) * (size_t)T * (size_t)w->cols);
        if (!xs) abort(); /* nothing sensible to do without it */
        stage_q4(x, T, w->cols, xs);
        j.xs = xs;
        j.q4 = 1;
    }
    int rb;
    j.k = mm_kernel_of(w, T, j.q4, &rb);
    df_pool_run(pool, w->rows, cpu_chunk_rows(pool, w, T, rb), mm_task, &j);
}

const df_backend df_backend_cpu_avx512 = {
    .name = "cpu-avx512",
    .matmul = avx512_matmul,
    .decode_row = avx512_decode_row,
    .dot = avx512_dot,
    .axpy = avx512_axpy,
    .rmsnorm = cpu_scalar_rmsnorm,
    .silu_mul = cpu_scalar_silu_mul,
    .softmax = cpu_avx512_softmax,
    .attn_scores = avx512_attn_scores,
    .attn_values = avx512_attn_values,
};

#else
const df_backend df_backend_cpu_avx512 = {0};
#endif
