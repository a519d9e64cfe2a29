/*
 * cuda_decode.cuh — exact element decoders of the weight encodings on the device, the same values as the
 * CPU's kernels/dtype.h (df_f16_to_f32, df_fp8e4m3_to_f32, df_e8m0_to_f32, df_e2m1_values). Shared by the
 * matmul kernels (cuda_matmul.cu), the attention core's kv_b decoding (cuda_attn.cu) and the device's embedding
 * rows (cuda_greedy.cu); wdec decodes one element of any encoding.
 */
#ifndef DF_KERNELS_CUDA_DECODE_CUH
#define DF_KERNELS_CUDA_DECODE_CUH

#include <stdint.h>

namespace {

__device__ __forceinline__ float bits_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ float bf16_f32(uint32_t h) { return bits_f32((h & 0xffffu) << 16); }
/* IEEE binary16 -> fp32, as df_f16_to_f32 */
__device__ __forceinline__ float f16_f32(uint32_t h) {
    h &= 0xffffu;
    const uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    if (e == 31) return bits_f32(s | 0x7f800000u | (m << 13));
    return bits_f32(s | ((e + 112u) << 23) | (m << 13));
}
/* float8 e4m3fn -> fp32, as df_fp8e4m3_to_f32 (bias 7, S.1111.111 = NaN, subnormals m/8 * 2^-6) */
__device__ __forceinline__ float fp8_f32(uint32_t b) {
    b &= 0xffu;
    const uint32_t s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    const float v = e == 0 ? (float)m * (1.0f / 512.0f) : bits_f32(((e + 120u) << 23) | (m << 20));
    return s ? -v : v;
}
/* E8M0 -> 2^(e-127); 255 = NaN; 0 = 2^-127, as df_e8m0_to_f32 */
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
    e &= 0xffu;
    if (e == 255) return __int_as_float(0x7fc00000);
    if (e == 0) return bits_f32(0x00400000u);
    return bits_f32(e << 23);
}
/* E2M1 code (low 4 bits) -> its value, as df_e2m1_values */
__device__ __forceinline__ float e2m1_f32(uint32_t code) {
    const uint32_t m = code & 7u;
    const float v = m < 2 ? 0.5f * (float)m : m < 4 ? 1.0f + 0.5f * (float)(m - 2) : m < 6 ? (float)(m - 2) : m == 6 ? 4.0f : 6.0f;
    return (code & 8u) ? -v : v;
}

/* 16 bytes of streamed weights, read past L1 (ld.global.nc.L1::no_allocate): a weight is read once per call, while
 * the activations that every warp reads again stay in L1 */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* Element (r, c) of a weight [rows, cols] of encoding ENC, exactly as the CPU's cpu_scalar_decode_range (the
 * element decoders: cuda_decode.cuh). */
template <int ENC>
__device__ __forceinline__ float wdec(const uint8_t *__restrict__ d, const uint8_t *__restrict__ s, int64_t cols,
                                      int64_t r, int64_t c) {
    if constexpr (ENC == DF_W_F32) return reinterpret_cast<const float *>(d)[r * cols + c];
    else if constexpr (ENC == DF_W_BF16) return bf16_f32(reinterpret_cast<const uint16_t *>(d)[r * cols + c]);
    else if constexpr (ENC == DF_W_F16) return f16_f32(reinterpret_cast<const uint16_t *>(d)[r * cols + c]);
    else if constexpr (ENC == DF_W_FP8_B128)
        return __fmul_rn(fp8_f32(d[r * cols + c]), reinterpret_cast<const float *>(s)[(r / 128) * ((cols + 127) / 128) + c / 128]);
    else if constexpr (ENC == DF_W_INT4_G32) {
        const uint32_t wd = reinterpret_cast<const uint32_t *>(d)[r * (cols / 8) + c / 8];
        const int q = (int)((wd >> (4 * (c % 8))) & 15u) - 8;
        return __fmul_rn((float)q, bf16_f32(reinterpret_cast<const uint16_t *>(s)[r * (cols / 32) + c / 32]));
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint32_t b = d[r * (cols / 2) + c / 2];
        return __fmul_rn(e2m1_f32((c & 1) ? b >> 4 : b & 15u), e8m0_f32(s[r * (cols / 32) + c / 32]));
    } else if constexpr (ENC == DF_W_INT8_ROW)
        return __fmul_rn((float)(int8_t)d[r * cols + c], reinterpret_cast<const float *>(s)[r]);
    else return __int_as_float(0x7fc00000);
}

/* Elements (r, c .. c + 7) of a weight [rows, cols] of encoding ENC into w[0..7], each exactly wdec<ENC>(.., r, c + j),
 * read as whole vectors (16 bytes for bf16 / f16, 8 for fp8 / int8, 4 for int4 / mxfp4, 2 x 16 for f32). Requires
 * c % 8 == 0, cols % 8 == 0 and data aligned to 16 bytes (then every such vector is aligned). */
template <int ENC>
__device__ __forceinline__ void wdec8(const uint8_t *__restrict__ d, const uint8_t *__restrict__ s, int64_t cols,
                                      int64_t r, int64_t c, float (&w)[8]) {
    if constexpr (ENC == DF_W_F32) {
        const uint4 *p = reinterpret_cast<const uint4 *>(reinterpret_cast<const float *>(d) + r * cols + c);
        const uint4 a = ld_stream(p), b = ld_stream(p + 1);
        w[0] = bits_f32(a.x); w[1] = bits_f32(a.y); w[2] = bits_f32(a.z); w[3] = bits_f32(a.w);
        w[4] = bits_f32(b.x); w[5] = bits_f32(b.y); w[6] = bits_f32(b.z); w[7] = bits_f32(b.w);
    } else if constexpr (ENC == DF_W_BF16 || ENC == DF_W_F16) {
        const uint4 a = ld_stream(reinterpret_cast<const uint4 *>(reinterpret_cast<const uint16_t *>(d) + r * cols + c));
        const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if constexpr (ENC == DF_W_BF16) {
                w[2 * j] = bf16_f32(u[j]);
                w[2 * j + 1] = bf16_f32(u[j] >> 16);
            } else {
                w[2 * j] = f16_f32(u[j]);
                w[2 * j + 1] = f16_f32(u[j] >> 16);
            }
        }
    } else if constexpr (ENC == DF_W_FP8_B128 || ENC == DF_W_INT8_ROW) {
        const uint2 a = __ldg(reinterpret_cast<const uint2 *>(d + r * cols + c));
        const float sc = ENC == DF_W_FP8_B128 ? reinterpret_cast<const float *>(s)[(r / 128) * ((cols + 127) / 128) + c / 128]
                                              : reinterpret_cast<const float *>(s)[r];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t b = ((j < 4 ? a.x : a.y) >> (8 * (j & 3))) & 0xffu;
            if constexpr (ENC == DF_W_FP8_B128) w[j] = __fmul_rn(fp8_f32(b), sc);
            else w[j] = __fmul_rn((float)(int8_t)b, sc);
        }
    } else if constexpr (ENC == DF_W_INT4_G32) {
        const uint32_t wd = __ldg(reinterpret_cast<const uint32_t *>(d) + r * (cols / 8) + c / 8);
        const float sc = bf16_f32(reinterpret_cast<const uint16_t *>(s)[r * (cols / 32) + c / 32]);
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fmul_rn((float)((int)((wd >> (4 * j)) & 15u) - 8), sc);
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint32_t wd = __ldg(reinterpret_cast<const uint32_t *>(d + r * (cols / 2) + c / 2));
        const float sc = e8m0_f32(s[r * (cols / 32) + c / 32]);
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fmul_rn(e2m1_f32(wd >> (4 * j)), sc);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __int_as_float(0x7fc00000);
    }
}

} // namespace

#endif
