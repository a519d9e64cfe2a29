/*
 * cuda_matmul.cu — y [T, rows] = x [T, cols] · W^T on the GPU for every
 * checkpoint encoding (src/model/weights.h; math: shared/notes/formats.md),
 * with fp32 accumulation of the exactly decoded weights.
 *
 * One warp per output row r and a tile of TT tokens. Lane l decodes the groups
 * g = l, l+32, l+64, ... of G consecutive elements of row r (one 16-byte load of
 * weight data per group, or one element when cols is not a multiple of G) and
 * adds w[j] * x[t][g*G + j] for j = 0..G-1 into its own fp32 partial sum (fma),
 * group after group; the 32 partial sums are then combined by a fixed xor
 * butterfly (__shfl_xor_sync 16, 8, 4, 2, 1). The additions of an output
 * element depend only on (encoding, cols), never on T, the token tile or the
 * grid, so row t of a T-row call is bitwise equal to a 1-row call (batch
 * invariance).
 */
#include "cuda_internal.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace {

constexpr int WARPS = 8; /* rows per block */

__device__ __forceinline__ float bits_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ float bf16_f32(uint32_t h) { return bits_f32((h & 0xffffu) << 16); }
/* IEEE binary16 -> fp32, as kernels/dtype.h df_f16_to_f32 */
__device__ __forceinline__ float f16_f32(uint32_t h) {
    h &= 0xffffu;
    uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    if (e == 31) return bits_f32(s | 0x7f800000u | (m << 13));
    return bits_f32(s | ((e + 112u) << 23) | (m << 13));
}
/* float8 e4m3fn -> fp32, as df_fp8e4m3_to_f32 (bias 7, S.1111.111 = NaN, subnormals m/8 * 2^-6) */
__device__ __forceinline__ float fp8_f32(uint32_t b) {
    b &= 0xffu;
    uint32_t s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    float v = e == 0 ? (float)m * (1.0f / 512.0f) : bits_f32(((e + 120u) << 23) | (m << 20));
    return s ? -v : v;
}
/* E8M0 -> 2^(e-127); 255 = NaN; 0 = 2^-127 */
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
    e &= 0xffu;
    if (e == 255) return __int_as_float(0x7fc00000);
    if (e == 0) return bits_f32(0x00400000u);
    return bits_f32(e << 23);
}
/* Fast exact decoding of a packed element K of a 32-bit word (the whole group shares one scale):
 * the code's exponent and mantissa bits are placed at the top of an fp32 mantissa/exponent, which
 * gives value x 2^-126 (E2M1) or value x 2^-120 (E4M3) exactly, subnormal codes included; one
 * multiply by scale x 2^126 (2^120), a power-of-two rescaling of the scale, then gives the same
 * fp32 product as decoding first (kernels/dtype.h) and multiplying by the scale. */
template <int K> __device__ __forceinline__ float e2m1_x2m126(uint32_t u) {
    const uint32_t mag = 4 * K <= 22 ? u << (22 - 4 * K) : u >> (4 * K - 22);
    return __uint_as_float((mag & 0x01C00000u) | ((u << (28 - 4 * K)) & 0x80000000u));
}
template <int K> __device__ __forceinline__ float e4m3_x2m120(uint32_t u) {
    const uint32_t w = u << (24 - 8 * K);
    return __uint_as_float(((w >> 4) & 0x07F00000u) | (w & 0x80000000u));
}
/* nibble K of u minus 8, exactly: the float 2^23 + nibble, minus 2^23 + 8 */
template <int K> __device__ __forceinline__ float int4_val(uint32_t u) {
    return __uint_as_float(((u >> (4 * K)) & 0xFu) | 0x4B000000u) - 8388616.0f;
}
template <int K, int N> struct Unroll {
    template <class F> __device__ __forceinline__ static void run(F &&f) {
        f(std::integral_constant<int, K>());
        Unroll<K + 1, N>::run(f);
    }
};
template <int N> struct Unroll<N, N> {
    template <class F> __device__ __forceinline__ static void run(F &&) {}
};

/* Elements per group of the vector path. */
template <int ENC> struct Grp { static constexpr int G = 1; };
template <> struct Grp<DF_W_F32> { static constexpr int G = 4; };
template <> struct Grp<DF_W_BF16> { static constexpr int G = 8; };
template <> struct Grp<DF_W_F16> { static constexpr int G = 8; };
template <> struct Grp<DF_W_FP8_B128> { static constexpr int G = 16; };
template <> struct Grp<DF_W_INT4_G32> { static constexpr int G = 32; };
template <> struct Grp<DF_W_MXFP4> { static constexpr int G = 32; };
template <> struct Grp<DF_W_INT8_ROW> { static constexpr int G = 16; };

/* Decode group g (elements g*G .. g*G+G-1) of row r into w[G]; G = Grp<ENC>::G, cols % G == 0. */
template <int ENC>
__device__ __forceinline__ void decode_group(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                                             int64_t cols, int64_t r, int64_t g, float *w) {
    if constexpr (ENC == DF_W_F32) {
        const float4 v = reinterpret_cast<const float4 *>(data)[(r * cols) / 4 + g];
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if constexpr (ENC == DF_W_BF16 || ENC == DF_W_F16) {
        const uint4 v = reinterpret_cast<const uint4 *>(data)[(r * cols) / 8 + g];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if constexpr (ENC == DF_W_BF16) {
                w[2 * k] = __uint_as_float(u[k] << 16);
                w[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
            } else { /* the hardware conversion is exact (subnormals too) */
                w[2 * k] = __half2float(__ushort_as_half((unsigned short)(u[k] & 0xffffu)));
                w[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(u[k] >> 16)));
            }
        }
    } else if constexpr (ENC == DF_W_FP8_B128) {
        const uint4 v = reinterpret_cast<const uint4 *>(data)[(r * cols) / 16 + g];
        const int64_t sc = (cols + 127) / 128;
        const float s = reinterpret_cast<const float *>(scale)[(r / 128) * sc + (g * 16) / 128];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
        /* NaN codes (S.1111.111) anywhere in the group, or a scale that overflows when rescaled: element-wise */
        uint32_t nan = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) nan |= ((u[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        const float s2 = s * 0x1p120f;
        if (nan == 0 && s2 <= 3.0e38f && s2 >= -3.0e38f) {
#pragma unroll
            for (int q = 0; q < 4; q++)
                Unroll<0, 4>::run([&](auto K) { constexpr int k = decltype(K)::value; w[4 * q + k] = e4m3_x2m120<k>(u[q]) * s2; });
        } else {
#pragma unroll
            for (int k = 0; k < 16; k++) w[k] = fp8_f32(u[k / 4] >> (8 * (k % 4))) * s;
        }
    } else if constexpr (ENC == DF_W_INT8_ROW) {
        const uint4 v = reinterpret_cast<const uint4 *>(data)[(r * cols) / 16 + g];
        const float s = reinterpret_cast<const float *>(scale)[r];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 16; k++) w[k] = (float)(int8_t)(uint8_t)(u[k / 4] >> (8 * (k % 4))) * s;
    } else if constexpr (ENC == DF_W_INT4_G32) {
        const uint4 v = reinterpret_cast<const uint4 *>(data)[(r * cols) / 32 + g];
        const float s = bf16_f32(reinterpret_cast<const uint16_t *>(scale)[r * (cols / 32) + g]);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) Unroll<0, 8>::run([&](auto K) { constexpr int k = decltype(K)::value; w[8 * q + k] = int4_val<k>(u[q]) * s; });
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint4 v = reinterpret_cast<const uint4 *>(data)[(r * cols) / 32 + g];
        const uint32_t e = scale[r * (cols / 32) + g];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
        if (e <= 128) { /* scale x 2^126 = 2^(e-1) is a normal float (e = 0: 2^-127 x 2^126) */
            const float f = e == 0 ? 0.5f : __uint_as_float((e + 126u) << 23);
#pragma unroll
            for (int q = 0; q < 4; q++) Unroll<0, 8>::run([&](auto K) { constexpr int k = decltype(K)::value; w[8 * q + k] = e2m1_x2m126<k>(u[q]) * f; });
        } else {
            const float s = e8m0_f32(e);
#pragma unroll
            for (int q = 0; q < 4; q++)
                Unroll<0, 8>::run([&](auto K) {
                    constexpr int k = decltype(K)::value;
                    w[8 * q + k] = (e2m1_x2m126<k>(u[q]) * 0x1p126f) * s;
                });
        }
    }
}

/* One element (the path for cols not a multiple of G; only the element-wise encodings get here). */
template <int ENC>
__device__ __forceinline__ float decode_one(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                                            int64_t cols, int64_t r, int64_t c) {
    const int64_t i = r * cols + c;
    if (ENC == DF_W_F32) return reinterpret_cast<const float *>(data)[i];
    if (ENC == DF_W_BF16) return bf16_f32(reinterpret_cast<const uint16_t *>(data)[i]);
    if (ENC == DF_W_F16) return f16_f32(reinterpret_cast<const uint16_t *>(data)[i]);
    if (ENC == DF_W_FP8_B128)
        return fp8_f32(data[i]) * reinterpret_cast<const float *>(scale)[(r / 128) * ((cols + 127) / 128) + c / 128];
    if (ENC == DF_W_INT8_ROW) return (float)(int8_t)data[i] * reinterpret_cast<const float *>(scale)[r];
    return __int_as_float(0x7fc00000);
}

template <int ENC, int G, int TT>
__global__ void __launch_bounds__(WARPS * 32)
mm_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows, int64_t cols,
          const float *__restrict__ x, int T, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * TT;
    if (r >= rows) return;
    float acc[TT];
#pragma unroll
    for (int k = 0; k < TT; k++) acc[k] = 0.0f;
    const int64_t ng = cols / G;
#pragma unroll 2
    for (int64_t g = lane; g < ng; g += 32) {
        float w[G];
        if constexpr (G == 1) w[0] = decode_one<ENC>(data, scale, cols, r, g);
        else decode_group<ENC>(data, scale, cols, r, g, w);
#pragma unroll
        for (int k = 0; k < TT; k++) {
            if (t0 + k >= T) break;
            const float *xp = x + (int64_t)(t0 + k) * cols + g * G;
            if constexpr (G % 4 == 0) {
#pragma unroll
                for (int j = 0; j < G; j += 4) {
                    const float4 xv = *reinterpret_cast<const float4 *>(xp + j);
                    acc[k] = fmaf(w[j], xv.x, acc[k]);
                    acc[k] = fmaf(w[j + 1], xv.y, acc[k]);
                    acc[k] = fmaf(w[j + 2], xv.z, acc[k]);
                    acc[k] = fmaf(w[j + 3], xv.w, acc[k]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < G; j++) acc[k] = fmaf(w[j], xp[j], acc[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < TT; k++)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < TT; k++)
            if (t0 + k < T) y[(int64_t)(t0 + k) * rows + r] = acc[k];
}

/* One-token variant with RPW rows per warp: each lane loads its group of x once and applies it to RPW rows,
 * so activation loads from L1 are shared by RPW rows (the one-row-per-warp kernel reads x again for every
 * row, which bounds the 4-bit encodings by L1, not HBM). Every row's additions are those of mm_kernel with
 * TT = 1 in the same order (lane l: groups l, l+32, ..., elements in order, fma; the same butterfly), so its
 * outputs are bitwise equal to it and to every row of a T-row call. */
constexpr int MV_WARPS = 4;
int g_mv_rows = 1; /* 1 = mm_kernel for T = 1; 4 = mv_kernel<.., 4> (cu_set_matvec_rows) */

template <int ENC, int G, int RPW>
__global__ void __launch_bounds__(MV_WARPS * 32)
mv_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows, int64_t cols,
          const float *__restrict__ x, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * RPW;
    if (r0 >= rows) return; /* warp-uniform */
    const int nr = rows - r0 < RPW ? (int)(rows - r0) : RPW;
    float acc[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) acc[k] = 0.0f;
    const int64_t ng = cols / G;
    for (int64_t g = lane; g < ng; g += 32) {
        float xv[G];
#pragma unroll
        for (int j = 0; j < G; j += 4) {
            const float4 v = *reinterpret_cast<const float4 *>(x + g * G + j);
            xv[j] = v.x; xv[j + 1] = v.y; xv[j + 2] = v.z; xv[j + 3] = v.w;
        }
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            if (k < nr) {
                float w[G];
                decode_group<ENC>(data, scale, cols, r0 + k, g, w);
#pragma unroll
                for (int j = 0; j < G; j++) acc[k] = fmaf(w[j], xv[j], acc[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < RPW; k++)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < RPW; k++)
            if (k < nr) y[r0 + k] = acc[k];
}

template <int ENC, int G>
cudaError_t launch_g(const uint8_t *d, const uint8_t *s, int64_t rows, int64_t cols, const float *x, int T, float *y,
                     cudaStream_t st) {
    const dim3 blk(WARPS * 32);
    const unsigned gx = (unsigned)((rows + WARPS - 1) / WARPS);
    /* the token tile only changes how many tokens share a decoded group, never a sum's order */
    if (T >= 2) mm_kernel<ENC, G, 8><<<dim3(gx, (T + 7) / 8), blk, 0, st>>>(d, s, rows, cols, x, T, y);
    else if constexpr (G % 4 == 0) {
        if (g_mv_rows == 4)
            mv_kernel<ENC, G, 4><<<(unsigned)((rows + 4 * MV_WARPS - 1) / (4 * MV_WARPS)), MV_WARPS * 32, 0, st>>>(
                d, s, rows, cols, x, y);
        else mm_kernel<ENC, G, 1><<<dim3(gx, T), blk, 0, st>>>(d, s, rows, cols, x, T, y);
    } else mm_kernel<ENC, G, 1><<<dim3(gx, T), blk, 0, st>>>(d, s, rows, cols, x, T, y);
    return cudaGetLastError();
}

template <int ENC>
cudaError_t launch(const uint8_t *d, const uint8_t *s, int64_t rows, int64_t cols, const float *x, int T, float *y,
                   cudaStream_t st) {
    constexpr int G = Grp<ENC>::G;
    if constexpr (G > 1) if (cols % G == 0) return launch_g<ENC, G>(d, s, rows, cols, x, T, y, st);
    if constexpr (ENC == DF_W_INT4_G32 || ENC == DF_W_MXFP4) return cudaErrorInvalidValue;
    else /* cols % 32 != 0: not a valid weight */
    return launch_g<ENC, 1>(d, s, rows, cols, x, T, y, st);
}

} // namespace

void cu_set_matvec_rows(int n) { g_mv_rows = n == 4 ? 4 : 1; }

cudaError_t cu_matmul_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                             const float *x, int T, float *y, cudaStream_t st) {
    if (T <= 0 || rows <= 0) return cudaSuccess;
    if (T > 65535 * 8) return cudaErrorInvalidValue;
    const uint8_t *d = static_cast<const uint8_t *>(data), *s = static_cast<const uint8_t *>(scale);
    switch (type) {
    case DF_W_F32: return launch<DF_W_F32>(d, s, rows, cols, x, T, y, st);
    case DF_W_BF16: return launch<DF_W_BF16>(d, s, rows, cols, x, T, y, st);
    case DF_W_F16: return launch<DF_W_F16>(d, s, rows, cols, x, T, y, st);
    case DF_W_FP8_B128: return launch<DF_W_FP8_B128>(d, s, rows, cols, x, T, y, st);
    case DF_W_INT4_G32: return launch<DF_W_INT4_G32>(d, s, rows, cols, x, T, y, st);
    case DF_W_MXFP4: return launch<DF_W_MXFP4>(d, s, rows, cols, x, T, y, st);
    case DF_W_INT8_ROW: return launch<DF_W_INT8_ROW>(d, s, rows, cols, x, T, y, st);
    default: return cudaErrorInvalidValue;
    }
}
