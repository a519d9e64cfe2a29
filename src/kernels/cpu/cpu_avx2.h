/*
 * cpu_avx2.h — what the AVX2 backend's files share (cpu_avx2.c, cpu_avx2_q4.c, cpu_avx2_fp8.c, cpu_avx2_dense.c):
 * the target attributes, the canonical 8-lane reduction and the exact e4m3 value table. x86-64 only; include after
 * <immintrin.h>.
 */
#ifndef DF_KERNELS_CPU_AVX2_H
#define DF_KERNELS_CPU_AVX2_H

#include <immintrin.h>

/* Function-level targets, so the binary still runs on CPUs without AVX2 (df_backend_get checks at runtime). */
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* The AVX2 backend's canonical reduction of an 8-lane accumulator (lanes in natural column order): (lo 4 + hi 4),
 * then + its upper pair, then lane 0 + lane 1. Every matmul path of the backend ends each (row, token) with it. */
AVX2_INLINE float avx2_hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* An accumulator in the q4 kernels' staged lane order (0 2 4 6 1 3 5 7) put back in natural order (cpu_avx2_q4.c) */
__attribute__((target("avx2,fma,f16c"))) __m256 avx2_q4_unstage(__m256 acc);

/* e4m3 byte -> its exact fp32 value (df_fp8e4m3_to_f32; filled at load time by cpu_avx2.c) */
extern float avx2_fp8_table[256];

#endif
