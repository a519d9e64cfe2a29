/*
 * cpu_avx2.c — the AVX2+FMA(+F16C) backend: SIMD row decoders for every
 * df_wtype, the matmul dispatch (avx2_matmul: fused kernels for up to 8 tokens
 * in cpu_avx2_q4.c / _fp8.c / _dense.c, the blocked matmul of cpu_avx2_gemm.c
 * for more tokens, the shared driver for one token of an encoding without a
 * fused kernel), and 8-wide dot/axpy. Compiled with function-level target attributes so the
 * binary still runs on CPUs without AVX2 (df_backend_get checks at runtime).
 * Numerics: same encodings as cpu_scalar.c; only fp32 summation order differs.
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include "cpu_avx2.h"
#include <stdlib.h>

float avx2_fp8_table[256];
__attribute__((constructor)) static void fp8_table_init(void) {
    for (int i = 0; i < 256; i++) avx2_fp8_table[i] = df_fp8e4m3_to_f32((uint8_t)i);
}

/* The backend's dot product: four 8-lane chains over 32-column groups, 8-column chunks into the first (dot_acc: the
 * chains' sum before the reduction, over the first n / 8 * 8 columns), one horizontal sum (avx2_hsum256), a scalar
 * tail. */
AVX2_INLINE __m256 dot_acc(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
}
AVX2_INLINE float dot_impl(const float *a, const float *b, int64_t n) {
    float s = avx2_hsum256(dot_acc(a, b, n));
    for (int64_t i = n / 8 * 8; i < n; i++) s += a[i] * b[i];
    return s;
}
/* avx2_hsum256 of 8 vectors at once: lane m of the result is avx2_hsum256(v[2 * (m % 4) + m / 4]) (the same
 * additions: lo + hi, then lanes 0 + 2 and 1 + 3, then those two). */
AVX2_INLINE __m256 hsum256x8(const __m256 *v) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) /* 128-bit lane 0: lo + hi of v[2i]; lane 1: of v[2i+1] */
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20), _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) /* lane L: (x0 + x2, x1 + x3) of a[2i] then of a[2i + 1] */
        b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane L: the sums of v[L], v[2 + L], v[4 + L], v[6 + L] */
    return _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
AVX2 static float avx2_dot(const float *a, const float *b, int64_t n) { return dot_impl(a, b, n); }

/* The canonical per-(row, token) summation order of every matmul path of this backend:
 * one 8-lane accumulator over 8-column chunks, avx2_hsum256, then the tail with fmaf in column
 * order. Every matmul kernel of the backend (cpu_avx2_*.c) follows it exactly, so a token's result does
 * not depend on how many tokens share the call (T=1 decode == batched prefill, bit for bit). */
AVX2 static float avx2_dot_canon(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = avx2_hsum256(s0);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

AVX2 static void avx2_axpy(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Scores of one head at 8 positions [s, s + 8) (n1 % 8 == n2 % 8 == 0: no scalar tail): their dot_acc sums reduced
 * together by hsum256x8 (for each, avx2_hsum256's additions). Inlined with constant widths for the common shapes. */
AVX2_INLINE void scores8(const float *ql, const float *qp, const float *c, int64_t n1, const float *kpe, int64_t n2,
                         int64_t s, __m256 vs, float *out) {
    __m256 v1[8], v2[8];
    for (int m = 0; m < 8; m++) {
        const int64_t q = s + 4 * (m % 2) + m / 2;
        v1[m] = dot_acc(ql, c + q * n1, n1);
        v2[m] = dot_acc(qp, kpe + q * n2, n2);
    }
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_add_ps(hsum256x8(v1), hsum256x8(v2)), vs));
}
#define SCORES8_BLOCKS(N1, N2)                                                                                        \
    for (; s + 8 <= npos; s += 8)                                                                                     \
        for (int h = 0; h < H; h++) scores8(ql + h * ldql, qp + h * ldqp, c, N1, kpe, N2, s, vs, p + h * ldp + s)

/* df_backend.attn_scores: 8 positions at a time per head when the widths are multiples of 8 (scores8), the rest by
 * dot_impl (each cached row loaded once for the H heads). */
AVX2 static int avx2_attn_scores(const float *ql, int64_t ldql, const float *qp, int64_t ldqp, int H, const float *c,
                                 int64_t n1, const float *kpe, int64_t n2, int64_t npos, float scale, float *p, int64_t ldp) {
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t s = 0;
    if (n1 == 512 && n2 == 64) SCORES8_BLOCKS(512, 64); /* DeepSeek-V3 / Kimi K2 MLA */
    else if (n1 == 64 && n2 == 16) SCORES8_BLOCKS(64, 16); /* kimi-mini */
    else if (n1 % 8 == 0 && n2 % 8 == 0) SCORES8_BLOCKS(n1, n2);
    for (; s < npos; s++) {
        const float *cs = c + s * n1, *ks = kpe + s * n2;
        for (int h = 0; h < H; h++)
            p[h * ldp + s] = (dot_impl(ql + h * ldql, cs, n1) + dot_impl(qp + h * ldqp, ks, n2)) * scale;
    }
    return 0;
}

/* df_backend.attn_values for n1 % 8 == 0 (avx2_axpy without its scalar tail): 2 heads x 4 chunks of 8 columns
 * accumulated in registers over all positions (each element's FMAs in ascending s, as the axpy calls make them). */
AVX2 static int avx2_attn_values(const float *p, int64_t ldp, int H, const float *c, int64_t n1, int64_t npos, float *o,
                                 int64_t ldo) {
    if (n1 % 8) return -1;
    for (int h0 = 0; h0 < H; h0 += 2) {
        const int hn = H - h0 < 2 ? H - h0 : 2;
        for (int64_t c0 = 0; c0 < n1; c0 += 32) {
            const int cn = (int)((n1 - c0) / 8 < 4 ? (n1 - c0) / 8 : 4);
            __m256 a[2][4];
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++) a[h][k] = h < hn && k < cn ? _mm256_loadu_ps(o + (h0 + h) * ldo + c0 + 8 * k) : _mm256_setzero_ps();
            for (int64_t s = 0; s < npos; s++) {
                const float *cs = c + s * n1 + c0;
                for (int h = 0; h < 2; h++) {
                    if (h >= hn) break;
                    const __m256 va = _mm256_set1_ps(p[(h0 + h) * ldp + s]);
                    for (int k = 0; k < 4; k++)
                        if (k < cn) a[h][k] = _mm256_fmadd_ps(va, _mm256_loadu_ps(cs + 8 * k), a[h][k]);
                }
            }
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++)
                    if (h < hn && k < cn) _mm256_storeu_ps(o + (h0 + h) * ldo + c0 + 8 * k, a[h][k]);
        }
    }
    return 0;
}

/* 16 bytes of packed E2M1 (32 values, low nibble first) -> 32 int8 of 2*value. */
AVX2 static inline void mxfp4_block_i8(const uint8_t *p, __m128i *lo16, __m128i *hi16) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(15);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *lo16 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)); /* elements 0..15 */
    *hi16 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)); /* elements 16..31 */
}

AVX2 static inline __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

AVX2 void avx2_decode_row(const df_weight *w, int64_t r, float *out) {
    const int64_t cols = w->cols;
    int64_t c = 0;
    switch (w->type) {
    case DF_W_F32: {
        const float *d = (const float *)w->data + r * cols;
        for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(out + c, _mm256_loadu_ps(d + c));
        break;
    }
    case DF_W_BF16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (; c + 8 <= cols; c += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(d + c)));
            _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        break;
    }
    case DF_W_F16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + c))));
        break;
    }
    case DF_W_FP8_B128: {
        /* e4m3 bits placed in an IEEE half are the value * 2^-8 exactly (subnormals too), so
         * half -> fp32 (F16C) times scale * 2^8 is the scalar table value times the scale, the
         * same single rounding */
        const uint8_t *d = (const uint8_t *)w->data + r * cols;
        const float *s = (const float *)w->scale + (r / 128) * ((cols + 127) / 128);
        const __m128i keep = _mm_set1_epi16((short)0xbfff);
        for (; c + 8 <= cols; c += 8) {
            const float sc = s[c >> 7] * 256.0f;
            if (!isfinite(sc)) {
                for (int k = 0; k < 8; k++) out[c + k] = avx2_fp8_table[d[c + k]] * s[c >> 7];
                continue;
            }
            __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(d + c))), 8);
            h = _mm_and_si128(_mm_srai_epi16(h, 1), keep);
            _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(sc)));
        }
        for (; c < cols; c++) out[c] = avx2_fp8_table[d[c]] * s[c >> 7];
        break;
    }
    case DF_W_INT4_G32: {
        const uint32_t *d = (const uint32_t *)w->data + r * (cols / 8);
        const uint16_t *s = (const uint16_t *)w->scale + r * (cols / 32);
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), m = _mm256_set1_epi32(15),
                      eight = _mm256_set1_epi32(8);
        for (; c + 8 <= cols; c += 8) {
            __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)d[c / 8]), sh), m);
            __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight));
            _mm256_storeu_ps(out + c, _mm256_mul_ps(v, _mm256_set1_ps(df_bf16_to_f32(s[c / 32]))));
        }
        break;
    }
    case DF_W_MXFP4: {
        const uint8_t *d = (const uint8_t *)w->data + r * (cols / 2);
        const uint8_t *s = (const uint8_t *)w->scale + r * (cols / 32);
        for (; c + 32 <= cols; c += 32) {
            __m128i a, b;
            mxfp4_block_i8(d + c / 2, &a, &b);
            __m256 sc = _mm256_set1_ps(0.5f * df_e8m0_to_f32(s[c / 32]));
            _mm256_storeu_ps(out + c, _mm256_mul_ps(i8x8_to_ps(a), sc));
            _mm256_storeu_ps(out + c + 8, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(a, 8)), sc));
            _mm256_storeu_ps(out + c + 16, _mm256_mul_ps(i8x8_to_ps(b), sc));
            _mm256_storeu_ps(out + c + 24, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(b, 8)), sc));
        }
        break;
    }
    case DF_W_INT8_ROW: {
        const int8_t *d = (const int8_t *)w->data + r * cols;
        __m256 sc = _mm256_set1_ps(((const float *)w->scale)[r]);
        for (; c + 8 <= cols; c += 8)
            _mm256_storeu_ps(out + c, _mm256_mul_ps(i8x8_to_ps(_mm_loadl_epi64((const __m128i *)(d + c))), sc));
        break;
    }
    default:
        break;
    }
    if (c < cols) cpu_scalar_decode_range(w, r, c, cols, out);
}

/* Four rows (already decoded) dotted with one x, each in the canonical order (four chains). */
AVX2 static void avx2_dot_rows4(const float *a0, const float *a1, const float *a2, const float *a3, const float *x, int64_t n,
                                float *out) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + i), xv, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + i), xv, s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + i), xv, s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + i), xv, s3);
    }
    float o0 = avx2_hsum256(s0), o1 = avx2_hsum256(s1), o2 = avx2_hsum256(s2), o3 = avx2_hsum256(s3);
    for (; i < n; i++) { o0 = fmaf(a0[i], x[i], o0); o1 = fmaf(a1[i], x[i], o1); o2 = fmaf(a2[i], x[i], o2); o3 = fmaf(a3[i], x[i], o3); }
    out[0] = o0; out[1] = o1; out[2] = o2; out[3] = o3;
}

/* One token, encodings without a fused kernel (INT8 rows, INT4 / MXFP4 with cols % 32 != 0): decode four rows,
 * then four independent chains (one chain per row is latency-bound). */
AVX2 static int avx2_matvec_rows4(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, st = (cols + 15) / 16 * 16;
    float *b = cpu_scratch(CPU_SCRATCH_W, sizeof(float) * (size_t)(4 * st));
    if (!b) return 0;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        for (int k = 0; k < 4; k++) avx2_decode_row(w, r + k, b + k * st);
        avx2_dot_rows4(b, b + st, b + 2 * st, b + 3 * st, x, cols, y + r);
    }
    for (; r < r1; r++) {
        avx2_decode_row(w, r, b);
        y[r] = avx2_dot_canon(b, x, cols);
    }
    return 1;
}

/* The fused kernel a call runs (avx2_matmul), chosen once per call. */
typedef enum { AK_Q4, AK_FP8, AK_DENSE, AK_GEMM } avx2_kernel;
typedef struct {
    const df_weight *w;
    const float *x; /* 4-bit: x staged by avx2_q4_stage */
    float *xk;      /* AK_GEMM: x packed by avx2_gemm_pack_x */
    float *y;
    int T;
    avx2_kernel k;
} avx2_job;

static void avx2_task(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const avx2_job *j = ctx;
    switch (j->k) {
    case AK_Q4: avx2_q4_mm(j->w, j->x, j->T, j->y, r0, r1); return;
    case AK_FP8: avx2_fp8_mm(j->w, j->x, j->T, j->y, r0, r1); return;
    case AK_DENSE: avx2_dense_mm(j->w, j->x, j->T, j->y, r0, r1); return;
    case AK_GEMM: avx2_gemm_mm(j->w, j->x, j->xk, j->T, j->y, r0, r1); return;
    }
}

/* y [T, rows] = x [T, cols] . W^T: the fused kernels of cpu_avx2_*.c for T <= 8 where one handles the encoding,
 * else for T > 1 the blocked matmul (cpu_avx2_gemm.c), else (one token: INT8 rows, 4-bit with cols % 32 != 0) the
 * shared driver with four decoded rows per dot. Chunks: cpu_chunk_rows. */
AVX2 static void avx2_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    if (T <= 0 || w->rows <= 0) return;
    avx2_job j = {w, x, NULL, y, T, AK_Q4};
    int rb = 0;
    if ((rb = avx2_q4_rows(w, T)) > 0) {
        float *xs = cpu_scratch(CPU_SCRATCH_X, sizeof(float) * (size_t)T * (size_t)w->cols);
        if (!xs) abort(); /* nothing sensible to do without it */
        avx2_q4_stage(x, T, w->cols, xs);
        j.x = xs;
    } else if ((rb = avx2_fp8_rows(w, T)) > 0) j.k = AK_FP8;
    else if ((rb = avx2_dense_rows(w, T)) > 0) j.k = AK_DENSE;
    else if (T > 1 && (rb = avx2_gemm_rows()) > 0) {
        j.k = AK_GEMM;
        j.xk = cpu_scratch(CPU_SCRATCH_X, sizeof(float) * (size_t)(avx2_gemm_xk_floats(w, T) + 8)); /* > 0 bytes */
        if (!j.xk) abort(); /* nothing sensible to do without it */
        avx2_gemm_pack_x(w, x, T, j.xk);
    }
    else {
        cpu_matmul_driver(pool, w, x, T, y, avx2_decode_row, avx2_dot_canon, avx2_matvec_rows4, NULL, NULL);
        return;
    }
    df_pool_run(pool, w->rows, cpu_chunk_rows(pool, w, T, rb), avx2_task, &j);
}

const df_backend df_backend_cpu_avx2 = {
    .name = "cpu-avx2",
    .matmul = avx2_matmul,
    .decode_row = avx2_decode_row,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .rmsnorm = cpu_scalar_rmsnorm,
    .silu_mul = cpu_scalar_silu_mul,
    .softmax = cpu_avx2_softmax,
    .attn_scores = avx2_attn_scores,
    .attn_values = avx2_attn_values,
};

#else
const df_backend df_backend_cpu_avx2 = {0};
#endif
