/*
 * kda_math.h — the per-row arithmetic of the KDA recurrence (engine/kda.c on the CPU, cuda/cuda_kda.cu on the GPU),
 * written once with the same operations for both, so that the GPU's state and output have the CPU's bits.
 *
 * Math (engine/kda.c's header; Moonshot's modeling_kimi_linear.py, fla's naive recurrent KDA): per token and head,
 *   q, k   = x / sqrt(sum x^2 + 1e-6) (sum in index order); q *= K^-0.5 (qscale)
 *   decay  = e^g, g = lb * sigmoid(a * (raw + dt_bias)) (has_lb) else -a * softplus(raw + dt_bias), a = e^A_log[h]
 *   beta   = sigmoid(beta logit)
 *   S      = diag(decay) S; u = beta * (v - k^T S); S += k u^T; o = q^T S   (sums over key rows in index order)
 *   out    = o / sqrt(mean(o^2) + eps) * o_norm * act(gate), act = SiLU or sigmoid (FusedRMSNormGated)
 * e^x is df_kda_expf: glibc's expf algorithm (kernels/cpu cpu_expf, equal to glibc's expf on every non-NaN float),
 * whose double operations are correctly rounded on both sides; sigmoid(x) = 1 / (1 + e^-x); softplus(x) = x above 20,
 * else log1pf(e^x) with each side's log1pf (the one operation whose last bit may differ between glibc and CUDA).
 * Every product and sum is a single IEEE operation (DF_KM_MUL / DF_KM_ADD): the C side is compiled with
 * -ffp-contract=off, and the CUDA side uses the _rn intrinsics, which are never fused.
 */
#ifndef DF_KERNELS_KDA_MATH_H
#define DF_KERNELS_KDA_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DF_KM_FN static __device__ __forceinline__
#define DF_KM_MUL(a, b) __fmul_rn((a), (b))
#define DF_KM_ADD(a, b) __fadd_rn((a), (b))
#define DF_KM_SUB(a, b) __fsub_rn((a), (b))
#define DF_KM_DIV(a, b) __fdiv_rn((a), (b))
#define DF_KM_SQRT(a) __fsqrt_rn(a)
#define DF_KM_DFMA(a, b, c) __fma_rn((a), (b), (c))
#define DF_KM_DMUL(a, b) __dmul_rn((a), (b))
#define DF_KM_DSUB(a, b) __dsub_rn((a), (b))
#define DF_KM_D2F(a) __double2float_rn(a)
#define DF_KM_BITS_F(x) ((uint32_t)__float_as_uint(x))
#define DF_KM_BITS_D(x) ((uint64_t)__double_as_longlong(x))
#define DF_KM_D_BITS(u) __longlong_as_double((long long)(u))
#define DF_KM_EXP2_TAB df_kda_exp2_tab_dev /* cuda_kda.cu: cpu_exp2_tab copied to the device */
#else
#define DF_KM_FN static inline
#define DF_KM_MUL(a, b) ((a) * (b))
#define DF_KM_ADD(a, b) ((a) + (b))
#define DF_KM_SUB(a, b) ((a) - (b))
#define DF_KM_DIV(a, b) ((a) / (b))
#define DF_KM_SQRT(a) sqrtf(a)
#define DF_KM_DFMA(a, b, c) fma((a), (b), (c))
#define DF_KM_DMUL(a, b) ((a) * (b))
#define DF_KM_DSUB(a, b) ((a) - (b))
#define DF_KM_D2F(a) ((float)(a))
static inline uint32_t df_km_bits_f(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline uint64_t df_km_bits_d(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double df_km_d_bits(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }
#define DF_KM_BITS_F(x) df_km_bits_f(x)
#define DF_KM_BITS_D(x) df_km_bits_d(x)
#define DF_KM_D_BITS(u) df_km_d_bits(u)
#define DF_KM_EXP2_TAB cpu_exp2_tab
#endif

/* cpu_expf's constants (CPU_EXPF_*) and its table cpu_exp2_tab (whose device copy the CUDA side reads) */
#ifdef __CUDACC__
extern "C" {
#endif
#include "kernels/cpu/cpu_internal.h"
#ifdef __CUDACC__
}
#endif

/* e^x by cpu_expf's operations */
DF_KM_FN float df_kda_expf(float x) {
    const uint32_t ux = DF_KM_BITS_F(x);
    if (((ux >> 20) & 0x7ff) >= CPU_EXPF_BIG) { /* |x| >= 88, inf, NaN */
        if (ux == 0xff800000u) return 0.0f;
        if (((ux >> 20) & 0x7ff) >= 0x7f8) return DF_KM_ADD(x, x);
        if (x > 0x1.62e42ep6f) return INFINITY;
        if (x < -0x1.9fe368p6f) return 0.0f;
    }
    const double xd = (double)x;
    double kd = DF_KM_DFMA(CPU_EXPF_INVLN2N, xd, CPU_EXPF_SHIFT);
    const uint64_t ki = DF_KM_BITS_D(kd);
    kd = DF_KM_DSUB(kd, CPU_EXPF_SHIFT);
    const double r = DF_KM_DFMA(CPU_EXPF_INVLN2N, xd, -kd);
    const double sc = DF_KM_D_BITS(DF_KM_EXP2_TAB[ki % 32] + (ki << 47));
    const double zz = DF_KM_DFMA(CPU_EXPF_C0, r, CPU_EXPF_C1), r2 = DF_KM_DMUL(r, r);
    double y = DF_KM_DFMA(CPU_EXPF_C2, r, 1.0);
    y = DF_KM_DFMA(zz, r2, y);
    return DF_KM_D2F(DF_KM_DMUL(y, sc));
}

DF_KM_FN float df_kda_sigmoid(float x) { return DF_KM_DIV(1.0f, DF_KM_ADD(1.0f, df_kda_expf(-x))); }

DF_KM_FN float df_kda_softplus(float x) { return x > 20.0f ? x : log1pf(df_kda_expf(x)); }

/* x[0..n) /= sqrt(sum x^2 + 1e-6), the sum in index order */
DF_KM_FN void df_kda_l2norm(float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s = DF_KM_ADD(s, DF_KM_MUL(x[i], x[i]));
    const float r = DF_KM_DIV(1.0f, DF_KM_SQRT(DF_KM_ADD(s, 1e-6f)));
    for (int i = 0; i < n; i++) x[i] = DF_KM_MUL(x[i], r);
}

/* One (token, head)'s inputs: q, k normalized in place (q also scaled by qscale), decay[0..K) and the return value
 * beta. raw, dt_bias: the head's K values; a = e^A_log[h]. */
DF_KM_FN float df_kda_prep(float *q, float *k, const float *raw, const float *dt_bias, float a, int has_lb, float lb,
                           float bl, float qscale, int K, float *decay) {
    df_kda_l2norm(q, K);
    df_kda_l2norm(k, K);
    for (int i = 0; i < K; i++) q[i] = DF_KM_MUL(q[i], qscale);
    for (int i = 0; i < K; i++) {
        const float r = DF_KM_ADD(raw[i], dt_bias[i]);
        const float g = has_lb ? DF_KM_MUL(lb, df_kda_sigmoid(DF_KM_MUL(a, r))) : DF_KM_MUL(-a, df_kda_softplus(r));
        decay[i] = df_kda_expf(g);
    }
    return df_kda_sigmoid(bl);
}

/* One (token, head)'s output: o[0..K) = o / sqrt(mean(o^2) + eps) * o_norm * act(gate) (sum in index order) */
DF_KM_FN void df_kda_out(float *o, const float *gate, const float *o_norm, float eps, int silu_gate, int K) {
    float ss = 0.0f;
    for (int c = 0; c < K; c++) ss = DF_KM_ADD(ss, DF_KM_MUL(o[c], o[c]));
    const float rn = DF_KM_DIV(1.0f, DF_KM_SQRT(DF_KM_ADD(DF_KM_DIV(ss, (float)K), eps)));
    for (int c = 0; c < K; c++) {
        const float gv = silu_gate ? DF_KM_MUL(gate[c], df_kda_sigmoid(gate[c])) : df_kda_sigmoid(gate[c]);
        o[c] = DF_KM_MUL(DF_KM_MUL(DF_KM_MUL(o[c], rn), o_norm[c]), gv);
    }
}

#endif
