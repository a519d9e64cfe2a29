/*
 * cpu_avx512.c — the AVX-512 (F+BW+VL) backend: 16-wide dot/axpy, 16-wide
 * bf16/f16/int8 row decoders and fused one-token kernels for f32, bf16 and
 * MXFP4; other encodings reuse the AVX2 row decoders through the scalar tails.
 * Selected at runtime only where the CPU reports avx512f/bw/vl.
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

AVX512 static float avx512_dot(const float *a, const float *b, int64_t n) {
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
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* Canonical per-(row, token) order of this backend's matmuls: one 16-lane accumulator over
 * 16-column chunks, _mm512_reduce_add_ps, then the tail with fmaf. The fused one-token kernels
 * and dot4 follow it exactly (T=1 decode == batched prefill, bit for bit). */
AVX512 static float avx512_dot_canon(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    float s = _mm512_reduce_add_ps(s0);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

AVX512 static void avx512_dot4(const float *row, const float *x, int64_t stride, int64_t n, float *out) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 r = _mm512_loadu_ps(row + i);
        s0 = _mm512_fmadd_ps(r, _mm512_loadu_ps(x0 + i), s0);
        s1 = _mm512_fmadd_ps(r, _mm512_loadu_ps(x1 + i), s1);
        s2 = _mm512_fmadd_ps(r, _mm512_loadu_ps(x2 + i), s2);
        s3 = _mm512_fmadd_ps(r, _mm512_loadu_ps(x3 + i), s3);
    }
    float o0 = _mm512_reduce_add_ps(s0), o1 = _mm512_reduce_add_ps(s1), o2 = _mm512_reduce_add_ps(s2),
          o3 = _mm512_reduce_add_ps(s3);
    for (; i < n; i++) { o0 = fmaf(row[i], x0[i], o0); o1 = fmaf(row[i], x1[i], o1); o2 = fmaf(row[i], x2[i], o2); o3 = fmaf(row[i], x3[i], o3); }
    out[0] = o0; out[1] = o1; out[2] = o2; out[3] = o3;
}

AVX512 static void avx512_dot4x2(const float *r0, const float *r1, const float *x, int64_t stride, int64_t n, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 u = _mm512_loadu_ps(r0 + i), v = _mm512_loadu_ps(r1 + i), xv;
        xv = _mm512_loadu_ps(x0 + i); a0 = _mm512_fmadd_ps(u, xv, a0); b0 = _mm512_fmadd_ps(v, xv, b0);
        xv = _mm512_loadu_ps(x1 + i); a1 = _mm512_fmadd_ps(u, xv, a1); b1 = _mm512_fmadd_ps(v, xv, b1);
        xv = _mm512_loadu_ps(x2 + i); a2 = _mm512_fmadd_ps(u, xv, a2); b2 = _mm512_fmadd_ps(v, xv, b2);
        xv = _mm512_loadu_ps(x3 + i); a3 = _mm512_fmadd_ps(u, xv, a3); b3 = _mm512_fmadd_ps(v, xv, b3);
    }
    float o[8] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2), _mm512_reduce_add_ps(a3),
                  _mm512_reduce_add_ps(b0), _mm512_reduce_add_ps(b1), _mm512_reduce_add_ps(b2), _mm512_reduce_add_ps(b3)};
    const float *xs[4] = {x0, x1, x2, x3};
    for (; i < n; i++)
        for (int k = 0; k < 4; k++) { o[k] = fmaf(r0[i], xs[k][i], o[k]); o[4 + k] = fmaf(r1[i], xs[k][i], o[4 + k]); }
    for (int k = 0; k < 8; k++) out[k] = o[k];
}

AVX512 static void avx512_axpy(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

AVX512 static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

AVX512 static inline void mxfp4_block(const uint8_t *p, __m512 *v0, __m512 *v1) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(15);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi))));
    *v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi))));
}

AVX512 static void avx512_decode_row(const df_weight *w, int64_t r, float *out) {
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
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + c))));
        break;
    }
    case DF_W_MXFP4: {
        const uint8_t *d = (const uint8_t *)w->data + r * (cols / 2);
        const uint8_t *s = (const uint8_t *)w->scale + r * (cols / 32);
        for (; c + 32 <= cols; c += 32) {
            __m512 v0, v1;
            mxfp4_block(d + c / 2, &v0, &v1);
            __m512 sc = _mm512_set1_ps(0.5f * df_e8m0_to_f32(s[c / 32]));
            _mm512_storeu_ps(out + c, _mm512_mul_ps(v0, sc));
            _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(v1, sc));
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
        df_backend_cpu_avx2.decode_row(w, r, out);
        return;
    }
    if (c < cols) cpu_scalar_decode_range(w, r, c, cols, out);
}

/* Fused one-token kernels in the canonical order, four rows at a time. */
AVX512 static int avx512_matvec(const df_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols;
    if (w->type == DF_W_F32) {
        for (int64_t r = r0; r < r1; r++) y[r] = avx512_dot_canon((const float *)w->data + r * cols, x, cols);
        return 1;
    }
    if (w->type == DF_W_BF16) {
        for (int64_t r = r0; r < r1; r += 4) {
            int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            int64_t c = 0;
            for (; c + 16 <= cols; c += 16) {
                __m512 xv = _mm512_loadu_ps(x + c);
                for (int k = 0; k < nr; k++)
                    acc[k] = _mm512_fmadd_ps(bf16x16((const uint16_t *)w->data + (r + k) * cols + c), xv, acc[k]);
            }
            for (int k = 0; k < nr; k++) {
                const uint16_t *d = (const uint16_t *)w->data + (r + k) * cols;
                float o = _mm512_reduce_add_ps(acc[k]);
                for (int64_t cc = c; cc < cols; cc++) o = fmaf(df_bf16_to_f32(d[cc]), x[cc], o);
                y[r + k] = o;
            }
        }
        return 1;
    }
    if (w->type == DF_W_MXFP4 && cols % 32 == 0) {
        for (int64_t r = r0; r < r1; r += 4) {
            int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t c = 0; c < cols; c += 32) {
                __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
                for (int k = 0; k < nr; k++) {
                    const uint8_t *d = (const uint8_t *)w->data + (r + k) * (cols / 2);
                    const uint8_t *s = (const uint8_t *)w->scale + (r + k) * (cols / 32);
                    __m512 v0, v1;
                    mxfp4_block(d + c / 2, &v0, &v1);
                    __m512 sc = _mm512_set1_ps(0.5f * df_e8m0_to_f32(s[c / 32]));
                    acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(v0, sc), x0, acc[k]);
                    acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(v1, sc), x1, acc[k]);
                }
            }
            for (int k = 0; k < nr; k++) y[r + k] = _mm512_reduce_add_ps(acc[k]);
        }
        return 1;
    }
    return 0;
}

AVX512 static void avx512_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    cpu_matmul_driver(pool, w, x, T, y, avx512_decode_row, avx512_dot_canon, avx512_matvec, avx512_dot4, avx512_dot4x2);
}

const df_backend df_backend_cpu_avx512 = {
    .name = "cpu-avx512",
    .matmul = avx512_matmul,
    .decode_row = avx512_decode_row,
    .dot = avx512_dot,
    .axpy = avx512_axpy,
    .rmsnorm = cpu_scalar_rmsnorm,
    .silu_mul = cpu_scalar_silu_mul,
    .softmax = cpu_scalar_softmax,
};

#else
const df_backend df_backend_cpu_avx512 = {0};
#endif
