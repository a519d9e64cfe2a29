/*
 * route_math.h — the router's sigmoid with the same bits on the host (C) and on the device (CUDA), so that a token
 * routed on the GPU (cuda_moe.cu) picks the experts, with the weights, that moe_route (engine/moe.c) picks for it.
 *
 * df_route_expf(x): e^x from correctly rounded float operations only (no library exp, whose last bit differs between
 * glibc and CUDA): n = rint(x log2 e); r = (x - n ln2_hi) - n ln2_lo by fused multiply-adds (Cody-Waite); e^r by the
 * degree-8 Taylor polynomial in Horner form with fused multiply-adds (|r| <= 0.347: truncation < 2^-31 relative);
 * scaled by 2^n with ldexpf (exact, or one rounding into the subnormals). Error <= ~1.5 ulp against e^x. x above
 * 88.7228 gives +inf, below -103.973 gives 0, NaN gives NaN.
 * df_route_sigmoid(x) = 1 / (1 + df_route_expf(-x)) (DeepseekV3TopkRouter's sigmoid on the router logits, fp32).
 *
 * Every multiply-add is written as an explicit fused call and every other operation is a single IEEE operation on
 * floats, so the C side must not contract a * b + c on its own: engine/moe.c is compiled with -ffp-contract=off.
 */
#ifndef DF_KERNELS_ROUTE_MATH_H
#define DF_KERNELS_ROUTE_MATH_H

#include <math.h>

#ifdef __CUDACC__
#define DF_RM_FN static __device__ __forceinline__
#define DF_RM_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define DF_RM_MUL(a, b) __fmul_rn((a), (b))
#define DF_RM_ADD(a, b) __fadd_rn((a), (b))
#define DF_RM_DIV(a, b) __fdiv_rn((a), (b))
#else
#define DF_RM_FN static inline
#define DF_RM_FMA(a, b, c) fmaf((a), (b), (c))
#define DF_RM_MUL(a, b) ((a) * (b))
#define DF_RM_ADD(a, b) ((a) + (b))
#define DF_RM_DIV(a, b) ((a) / (b))
#endif

DF_RM_FN float df_route_expf(float x) {
    if (x != x) return x;
    if (x > 88.72284f) return INFINITY;
    if (x < -103.97208f) return 0.0f;
    const float n = rintf(DF_RM_MUL(x, 1.44269504f));
    float r = DF_RM_FMA(-n, 0.693145751953125f, x); /* ln 2 = 0.693145751953125 (15 bits) + 1.428606765e-6 */
    r = DF_RM_FMA(-n, 1.428606765330187e-6f, r);
    float p = 2.48015873e-5f;                 /* 1 / 8! .. 1 / 1! */
    p = DF_RM_FMA(p, r, 1.98412698e-4f);
    p = DF_RM_FMA(p, r, 1.38888889e-3f);
    p = DF_RM_FMA(p, r, 8.33333333e-3f);
    p = DF_RM_FMA(p, r, 4.16666667e-2f);
    p = DF_RM_FMA(p, r, 1.66666667e-1f);
    p = DF_RM_FMA(p, r, 0.5f);
    p = DF_RM_FMA(p, r, 1.0f);
    p = DF_RM_FMA(p, r, 1.0f);
    return ldexpf(p, (int)n);
}

DF_RM_FN float df_route_sigmoid(float x) { return DF_RM_DIV(1.0f, DF_RM_ADD(1.0f, df_route_expf(-x))); }

#endif
