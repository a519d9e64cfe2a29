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
 * e^x is df_expf (kernels/expf_math.h: glibc's expf algorithm, cpu_expf's), whose double operations are correctly
 * rounded on both sides; sigmoid(x) = 1 / (1 + e^-x); softplus(x) = x above 20,
 * else log1pf(e^x) with each side's log1pf (the one operation whose last bit may differ between glibc and CUDA).
 * Every product and sum is a single IEEE operation (DF_HM_MUL / DF_HM_ADD): the C side is compiled with
 * -ffp-contract=off, and the CUDA side uses the _rn intrinsics, which are never fused.
 */
#ifndef DF_KERNELS_KDA_MATH_H
#define DF_KERNELS_KDA_MATH_H

#include "kernels/expf_math.h"

DF_HM_FN float df_kda_sigmoid(float x) { return DF_HM_DIV(1.0f, DF_HM_ADD(1.0f, df_expf(-x))); }

/* SiLU of the short convolution's sum: s / (1 + e^-s) */
DF_HM_FN float df_kda_silu(float s) { return DF_HM_DIV(s, DF_HM_ADD(1.0f, df_expf(-s))); }

DF_HM_FN float df_kda_softplus(float x) { return x > 20.0f ? x : log1pf(df_expf(x)); }

/* x[0..n) /= sqrt(sum x^2 + 1e-6), the sum in index order */
DF_HM_FN void df_kda_l2norm(float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s = DF_HM_ADD(s, DF_HM_MUL(x[i], x[i]));
    const float r = DF_HM_DIV(1.0f, DF_HM_SQRT(DF_HM_ADD(s, 1e-6f)));
    for (int i = 0; i < n; i++) x[i] = DF_HM_MUL(x[i], r);
}

/* One (token, head)'s inputs: q, k normalized in place (q also scaled by qscale), decay[0..K) and the return value
 * beta. raw, dt_bias: the head's K values; a = e^A_log[h]. */
DF_HM_FN float df_kda_prep(float *q, float *k, const float *raw, const float *dt_bias, float a, int has_lb, float lb,
                           float bl, float qscale, int K, float *decay) {
    df_kda_l2norm(q, K);
    df_kda_l2norm(k, K);
    for (int i = 0; i < K; i++) q[i] = DF_HM_MUL(q[i], qscale);
    for (int i = 0; i < K; i++) {
        const float r = DF_HM_ADD(raw[i], dt_bias[i]);
        const float g = has_lb ? DF_HM_MUL(lb, df_kda_sigmoid(DF_HM_MUL(a, r))) : DF_HM_MUL(-a, df_kda_softplus(r));
        decay[i] = df_expf(g);
    }
    return df_kda_sigmoid(bl);
}

/* One (token, head)'s output: o[0..K) = o / sqrt(mean(o^2) + eps) * o_norm * act(gate) (sum in index order) */
DF_HM_FN void df_kda_out(float *o, const float *gate, const float *o_norm, float eps, int silu_gate, int K) {
    float ss = 0.0f;
    for (int c = 0; c < K; c++) ss = DF_HM_ADD(ss, DF_HM_MUL(o[c], o[c]));
    const float rn = DF_HM_DIV(1.0f, DF_HM_SQRT(DF_HM_ADD(DF_HM_DIV(ss, (float)K), eps)));
    for (int c = 0; c < K; c++) {
        const float gv = silu_gate ? DF_HM_MUL(gate[c], df_kda_sigmoid(gate[c])) : df_kda_sigmoid(gate[c]);
        o[c] = DF_HM_MUL(DF_HM_MUL(DF_HM_MUL(o[c], rn), o_norm[c]), gv);
    }
}

#endif
