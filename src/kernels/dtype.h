/*
 * dtype.h — scalar conversions of the checkpoint number formats to fp32
 * (bf16, IEEE half, float8 e4m3fn, E8M0 scales, FP4 E2M1). Shared by the
 * scalar reference and the tails of the SIMD kernels. Facts: shared/notes/formats.md.
 */
#ifndef DF_KERNELS_DTYPE_H
#define DF_KERNELS_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float df_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float df_bf16_to_f32(uint16_t h) { return df_bits_f32((uint32_t)h << 16); }

/* IEEE binary16 -> fp32 (subnormals, inf, NaN). */
static inline float df_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 0x3ff;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
        return s ? -v : v;
    }
    if (e == 31) return df_bits_f32(s | 0x7f800000u | (m << 13));
    return df_bits_f32(s | ((e + 112) << 23) | (m << 13));
}

/* float8 e4m3fn: bias 7, no inf, S.1111.111 = NaN; subnormals m/8 * 2^-6. */
static inline float df_fp8e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = (float)m * (1.0f / 512.0f);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

/* E8M0 scale byte: 2^(e-127); 255 = NaN. */
static inline float df_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    if (e == 0) return df_bits_f32(0x00400000u); /* 2^-127 (subnormal) */
    return df_bits_f32((uint32_t)e << 23);
}

/* FP4 E2M1 code -> value; codes 8..15 are the negatives. */
static const float df_e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

#endif
