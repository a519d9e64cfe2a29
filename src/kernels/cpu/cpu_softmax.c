/*
 * cpu_softmax.c — the softmax of the AVX-512 and AVX2 backends, with the bits of cpu_scalar_softmax
 * (cpu_scalar.c): the same largest value, every e^(x - m) by cpu_expf's operations evaluated 8 (AVX-512) or 4
 * (AVX2) lanes at a time in double, the same sum in order, the same final scaling.
 *
 * Built with -ffp-contract=off (CMakeLists.txt), like cpu_scalar.c: GCC writes most arithmetic intrinsics as plain
 * vector operators, so with contraction it could fuse a product into a following addition that cpu_expf keeps
 * apart. The FMAs that cpu_expf makes are explicit here too.
 *
 * The largest value: lanes keep their own maximum (vmaxps returns its second operand, the running maximum, when
 * the new value is NaN, so NaN is skipped as the scalar loop skips it), then the lanes' maximum. Which zero wins a
 * tie between +0 and -0 may differ from the scalar loop's; x - m then differs only for x = +-0, where e^(+-0) = 1
 * either way, so the results do not.
 */
#include "cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#define SM512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define SM512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) static inline
#define SM2 __attribute__((target("avx2,fma")))
#define SM2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* The running sum and the scaling, as cpu_scalar_softmax has them. */
static void sum_and_scale(float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    const float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* ------------------------------------------------------------ AVX-512 */

/* cpu_expf's normal path (|d| < 88) on 8 lanes; tab: cpu_exp2_tab in four registers. */
SM512_INLINE __m256 expf8_512(__m256 d, const __m512i *tab) {
    const __m512d xd = _mm512_cvtps_pd(d);
    __m512d kd = _mm512_fmadd_pd(_mm512_set1_pd(CPU_EXPF_INVLN2N), xd, _mm512_set1_pd(CPU_EXPF_SHIFT));
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, _mm512_set1_pd(CPU_EXPF_SHIFT));
    const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(CPU_EXPF_INVLN2N), xd, kd);
    /* cpu_exp2_tab[ki % 32]: entries 0-15 and 16-31 by two-table permutes (index bits 0-3), bit 4 picks */
    const __m512i lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]), hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    const __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    const __m512d sc = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    const __m512d zz = _mm512_fmadd_pd(_mm512_set1_pd(CPU_EXPF_C0), r, _mm512_set1_pd(CPU_EXPF_C1));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(CPU_EXPF_C2), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(zz, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, sc));
}

SM512 void cpu_avx512_softmax(float *x, int64_t n) {
    int64_t i = 0;
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16) vm = _mm512_max_ps(_mm512_loadu_ps(x + i), vm);
    float m = _mm512_reduce_max_ps(vm);
    for (; i < n; i++) if (x[i] > m) m = x[i];
    const __m512i tab[4] = {_mm512_loadu_si512(cpu_exp2_tab), _mm512_loadu_si512(cpu_exp2_tab + 8),
                            _mm512_loadu_si512(cpu_exp2_tab + 16), _mm512_loadu_si512(cpu_exp2_tab + 24)};
    const __m512 vms = _mm512_set1_ps(m);
    const __m512i big = _mm512_set1_epi32(CPU_EXPF_BIG), m11 = _mm512_set1_epi32(0x7ff);
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vms);
        const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(d), 20), m11);
        if (_mm512_cmpge_epu32_mask(top, big)) { /* a special case among them: the scalar function */
            for (int k = 0; k < 16; k++) x[i + k] = cpu_expf(x[i + k] - m);
            continue;
        }
        const __m256 e0 = expf8_512(_mm512_castps512_ps256(d), tab), e1 = expf8_512(_mm512_extractf32x8_ps(d, 1), tab);
        _mm512_storeu_ps(x + i, _mm512_insertf32x8(_mm512_castps256_ps512(e0), e1, 1));
    }
    for (; i < n; i++) x[i] = cpu_expf(x[i] - m);
    sum_and_scale(x, n);
}

/* ------------------------------------------------------------ AVX2 */

/* cpu_expf's normal path on 4 lanes; the table entry by a gather. */
SM2_INLINE __m128 expf4_avx2(__m128 d) {
    const __m256d xd = _mm256_cvtps_pd(d);
    __m256d kd = _mm256_fmadd_pd(_mm256_set1_pd(CPU_EXPF_INVLN2N), xd, _mm256_set1_pd(CPU_EXPF_SHIFT));
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, _mm256_set1_pd(CPU_EXPF_SHIFT));
    const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(CPU_EXPF_INVLN2N), xd, kd);
    const __m256i t = _mm256_i64gather_epi64((const long long *)cpu_exp2_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256d sc = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    const __m256d zz = _mm256_fmadd_pd(_mm256_set1_pd(CPU_EXPF_C0), r, _mm256_set1_pd(CPU_EXPF_C1));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(CPU_EXPF_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(zz, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, sc));
}

SM2 void cpu_avx2_softmax(float *x, int64_t n) {
    int64_t i = 0;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm);
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, vm);
    for (int k = 0; k < 8; k++) if (lanes[k] > m) m = lanes[k];
    for (; i < n; i++) if (x[i] > m) m = x[i];
    const __m256 vms = _mm256_set1_ps(m);
    const __m256i below_big = _mm256_set1_epi32(CPU_EXPF_BIG - 1), m11 = _mm256_set1_epi32(0x7ff);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vms);
        const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(d), 20), m11);
        /* top >= CPU_EXPF_BIG in any lane (both are below 2^11, so a signed compare is enough) */
        if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(top, below_big))) {
            for (int k = 0; k < 8; k++) x[i + k] = cpu_expf(x[i + k] - m);
            continue;
        }
        const __m128 e0 = expf4_avx2(_mm256_castps256_ps128(d)), e1 = expf4_avx2(_mm256_extractf128_ps(d, 1));
        _mm256_storeu_ps(x + i, _mm256_insertf128_ps(_mm256_castps128_ps256(e0), e1, 1));
    }
    for (; i < n; i++) x[i] = cpu_expf(x[i] - m);
    sum_and_scale(x, n);
}

#endif
