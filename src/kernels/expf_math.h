/*
 * expf_math.h — single IEEE float / double operations written once for the host (C) and the device (CUDA), and e^x
 * from them: df_expf, glibc's expf algorithm (kernels/cpu/cpu_internal.h: CPU_EXPF_*, cpu_exp2_tab), equal to glibc's
 * expf on every non-NaN float. cpu_expf (the scalar softmax's) and the KDA recurrence on both sides
 * (kernels/kda_math.h) use it, so the host's and the device's values have the same bits.
 * On the C side the caller must be compiled with -ffp-contract=off (the operations are as written); on the CUDA side
 * the _rn intrinsics are never fused. A .cu file including it defines `__device__ uint64_t df_expf_tab_dev[32]` first
 * and copies cpu_exp2_tab into it before a kernel calls df_expf.
 */
#ifndef DF_KERNELS_EXPF_MATH_H
#define DF_KERNELS_EXPF_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DF_HM_FN static __device__ __forceinline__
#define DF_HM_MUL(a, b) __fmul_rn((a), (b))
#define DF_HM_ADD(a, b) __fadd_rn((a), (b))
#define DF_HM_SUB(a, b) __fsub_rn((a), (b))
#define DF_HM_DIV(a, b) __fdiv_rn((a), (b))
#define DF_HM_SQRT(a) __fsqrt_rn(a)
#define DF_HM_DFMA(a, b, c) __fma_rn((a), (b), (c))
#define DF_HM_DMUL(a, b) __dmul_rn((a), (b))
#define DF_HM_DSUB(a, b) __dsub_rn((a), (b))
#define DF_HM_D2F(a) __double2float_rn(a)
#define DF_HM_BITS_F(x) ((uint32_t)__float_as_uint(x))
#define DF_HM_BITS_D(x) ((uint64_t)__double_as_longlong(x))
#define DF_HM_D_BITS(u) __longlong_as_double((long long)(u))
#define DF_HM_EXP2_TAB df_expf_tab_dev /* the including .cu file's device copy of cpu_exp2_tab */
#else
#define DF_HM_FN static inline
#define DF_HM_MUL(a, b) ((a) * (b))
#define DF_HM_ADD(a, b) ((a) + (b))
#define DF_HM_SUB(a, b) ((a) - (b))
#define DF_HM_DIV(a, b) ((a) / (b))
#define DF_HM_SQRT(a) sqrtf(a)
#define DF_HM_DFMA(a, b, c) fma((a), (b), (c))
#define DF_HM_DMUL(a, b) ((a) * (b))
#define DF_HM_DSUB(a, b) ((a) - (b))
#define DF_HM_D2F(a) ((float)(a))
static inline uint32_t df_hm_bits_f(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline uint64_t df_hm_bits_d(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double df_hm_d_bits(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }
#define DF_HM_BITS_F(x) df_hm_bits_f(x)
#define DF_HM_BITS_D(x) df_hm_bits_d(x)
#define DF_HM_D_BITS(u) df_hm_d_bits(u)
#define DF_HM_EXP2_TAB cpu_exp2_tab
#endif

/* cpu_expf's constants (CPU_EXPF_*) and its table cpu_exp2_tab (whose device copy the CUDA side reads) */
#ifdef __CUDACC__
extern "C" {
#endif
#include "kernels/cpu/cpu_internal.h"
#ifdef __CUDACC__
}
#endif

/* e^x by glibc's expf algorithm (cpu_internal.h); cpu_expf is this function */
DF_HM_FN float df_expf(float x) {
    const uint32_t ux = DF_HM_BITS_F(x);
    if (((ux >> 20) & 0x7ff) >= CPU_EXPF_BIG) { /* |x| >= 88, inf, NaN */
        if (ux == 0xff800000u) return 0.0f;
        if (((ux >> 20) & 0x7ff) >= 0x7f8) return DF_HM_ADD(x, x);
        if (x > 0x1.62e42ep6f) return INFINITY;
        if (x < -0x1.9fe368p6f) return 0.0f;
    }
    /* k = round(x * 32 / ln 2) and r = x * 32 / ln 2 - k, each product fused into its addition (as glibc's build
     * has them) */
    const double xd = (double)x;
    double kd = DF_HM_DFMA(CPU_EXPF_INVLN2N, xd, CPU_EXPF_SHIFT);
    const uint64_t ki = DF_HM_BITS_D(kd);
    kd = DF_HM_DSUB(kd, CPU_EXPF_SHIFT);
    const double r = DF_HM_DFMA(CPU_EXPF_INVLN2N, xd, -kd);
    const double sc = DF_HM_D_BITS(DF_HM_EXP2_TAB[ki % 32] + (ki << 47));
    const double zz = DF_HM_DFMA(CPU_EXPF_C0, r, CPU_EXPF_C1), r2 = DF_HM_DMUL(r, r);
    double y = DF_HM_DFMA(CPU_EXPF_C2, r, 1.0);
    y = DF_HM_DFMA(zz, r2, y);
    return DF_HM_D2F(DF_HM_DMUL(y, sc));
}

#endif
