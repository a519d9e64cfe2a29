/*
 * cpu_scalar.c — the scalar reference backend ("cpu-scalar"): plain C decoding
 * of every df_wtype element by element and fp32 dot products. The SIMD
 * backends are tested against it (tests/test_kernels.c).
 * Encodings: src/model/weights.h, shared/notes/formats.md.
 */
#include "cpu_internal.h"
#include "kernels/dtype.h"
#include "kernels/expf_math.h"

#include <math.h>
#include <string.h>

void cpu_scalar_decode_range(const df_weight *w, int64_t r, int64_t c0, int64_t c1, float *out) {
    const int64_t cols = w->cols;
    switch (w->type) {
    case DF_W_F32: {
        const float *d = (const float *)w->data + r * cols;
        for (int64_t c = c0; c < c1; c++) out[c] = d[c];
        break;
    }
    case DF_W_BF16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (int64_t c = c0; c < c1; c++) out[c] = df_bf16_to_f32(d[c]);
        break;
    }
    case DF_W_F16: {
        const uint16_t *d = (const uint16_t *)w->data + r * cols;
        for (int64_t c = c0; c < c1; c++) out[c] = df_f16_to_f32(d[c]);
        break;
    }
    case DF_W_FP8_B128: {
        const uint8_t *d = (const uint8_t *)w->data + r * cols;
        const int64_t sc = (cols + 127) / 128;
        const float *s = (const float *)w->scale + (r / 128) * sc;
        for (int64_t c = c0; c < c1; c++) out[c] = df_fp8e4m3_to_f32(d[c]) * s[c / 128];
        break;
    }
    case DF_W_INT4_G32: {
        const uint32_t *d = (const uint32_t *)w->data + r * (cols / 8);
        const uint16_t *s = (const uint16_t *)w->scale + r * (cols / 32);
        for (int64_t c = c0; c < c1; c++) {
            int q = (int)((d[c / 8] >> (4 * (c % 8))) & 15) - 8;
            out[c] = (float)q * df_bf16_to_f32(s[c / 32]);
        }
        break;
    }
    case DF_W_MXFP4: {
        const uint8_t *d = (const uint8_t *)w->data + r * (cols / 2);
        const uint8_t *s = (const uint8_t *)w->scale + r * (cols / 32);
        for (int64_t c = c0; c < c1; c++) {
            uint8_t b = d[c / 2];
            int code = (c & 1) ? (b >> 4) : (b & 15);
            out[c] = df_e2m1_values[code] * df_e8m0_to_f32(s[c / 32]);
        }
        break;
    }
    case DF_W_INT8_ROW: {
        const int8_t *d = (const int8_t *)w->data + r * cols;
        const float s = ((const float *)w->scale)[r];
        for (int64_t c = c0; c < c1; c++) out[c] = (float)d[c] * s;
        break;
    }
    default:
        for (int64_t c = c0; c < c1; c++) out[c] = NAN;
    }
}

void cpu_scalar_decode_row(const df_weight *w, int64_t row, float *out) {
    cpu_scalar_decode_range(w, row, 0, w->cols, out);
}

float cpu_scalar_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void cpu_scalar_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_scalar_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

void cpu_scalar_silu_mul(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* 2^(i/32) as a double, minus i << 47 (so that adding k << 47 for k = 32 q + i multiplies it by 2^q). */
const uint64_t cpu_exp2_tab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

float cpu_expf(float x) { return df_expf(x); }

void cpu_scalar_softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) if (x[i] > m) m = x[i];
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) { x[i] = cpu_expf(x[i] - m); s += x[i]; }
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

static void scalar_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    cpu_matmul_driver(pool, w, x, T, y, cpu_scalar_decode_row, cpu_scalar_dot, NULL, NULL, NULL);
}

const df_backend df_backend_cpu_scalar = {
    .name = "cpu-scalar",
    .matmul = scalar_matmul,
    .decode_row = cpu_scalar_decode_row,
    .dot = cpu_scalar_dot,
    .axpy = cpu_scalar_axpy,
    .rmsnorm = cpu_scalar_rmsnorm,
    .silu_mul = cpu_scalar_silu_mul,
    .softmax = cpu_scalar_softmax,
};
