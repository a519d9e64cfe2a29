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
#include "cuda_launch.cuh"
#include "cuda_decode.cuh"

#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace {

constexpr int WARPS = 8; /* rows per block */

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
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 4 + g));
        w[0] = __uint_as_float(v.x); w[1] = __uint_as_float(v.y); w[2] = __uint_as_float(v.z); w[3] = __uint_as_float(v.w);
    } else if constexpr (ENC == DF_W_BF16 || ENC == DF_W_F16) {
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 8 + g));
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
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 16 + g));
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
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 16 + g));
        const float s = reinterpret_cast<const float *>(scale)[r];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 16; k++) w[k] = (float)(int8_t)(uint8_t)(u[k / 4] >> (8 * (k % 4))) * s;
    } else if constexpr (ENC == DF_W_INT4_G32) {
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 32 + g));
        const float s = bf16_f32(reinterpret_cast<const uint16_t *>(scale)[r * (cols / 32) + g]);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) Unroll<0, 8>::run([&](auto K) { constexpr int k = decltype(K)::value; w[8 * q + k] = int4_val<k>(u[q]) * s; });
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint4 v = ld_stream(reinterpret_cast<const uint4 *>(data) + ((r * cols) / 32 + g));
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
    pdl_enter();
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

/* ---- Small matrices: rows split over K (every T) ----
 * A matrix of at most SPLIT_ROWS rows has too few rows to keep the GPU's memory busy with one warp per row (a 64-row
 * router: 64 warps; a 576-row kv_a: 576), so its rows are walked by KS warps each, for every T (the order below is
 * the canonical one of such a matrix, whatever T, the token tile or the grid). Block = row r x TT tokens, KS warps;
 * the nr = ceil(ng / 32) rounds of 32 groups are cut into KS runs, warp s taking rounds [s nr / KS, (s + 1) nr / KS):
 * lane l the group 32 rd + l of each round in order (fma chain from 0, as mm_kernel), the 32 lane sums combined by
 * the xor butterfly (16, 8, 4, 2, 1), then the KS warp sums added in warp order (((w0 + w1) + w2) + ...). KS depends
 * only on (rows, cols): split_ks. */
constexpr int SPLIT_ROWS = 2048, SPLIT_KS = 16;

int split_ks(int64_t rows, int64_t cols, int G) {
    const int64_t nr = (cols / G + 31) / 32;
    int64_t ks = (8192 + rows - 1) / rows; /* about 8192 warps in all: 64 per SM */
    if (ks > SPLIT_KS) ks = SPLIT_KS;
    if (ks > nr) ks = nr;
    return ks < 1 ? 1 : (int)ks;
}

/* Row r of a split matrix, the block's TT tokens from blockIdx.y (mm_split_kernel, mm_split2_kernel). */
template <int ENC, int G, int TT>
__device__ __forceinline__ void mm_split_row(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                                             int64_t rows, int64_t cols, const float *__restrict__ x, int T,
                                             float *__restrict__ y, int ks, int64_t r) {
    __shared__ float part[SPLIT_KS][TT];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int t0 = blockIdx.y * TT;
    const int64_t ng = cols / G, nr = (ng + 31) / 32;
    const int64_t rb = wp * nr / ks, re = (wp + 1) * nr / ks;
    float acc[TT];
#pragma unroll
    for (int k = 0; k < TT; k++) acc[k] = 0.0f;
#pragma unroll 2
    for (int64_t rd = rb; rd < re; rd++) {
        const int64_t g = rd * 32 + lane;
        if (g >= ng) break;
        float w[G];
        decode_group<ENC>(data, scale, cols, r, g, w);
#pragma unroll
        for (int k = 0; k < TT; k++) {
            if (t0 + k >= T) break;
            const float *xp = x + (int64_t)(t0 + k) * cols + g * G;
#pragma unroll
            for (int j = 0; j < G; j += 4) {
                const float4 xv = *reinterpret_cast<const float4 *>(xp + j);
                acc[k] = fmaf(w[j], xv.x, acc[k]);
                acc[k] = fmaf(w[j + 1], xv.y, acc[k]);
                acc[k] = fmaf(w[j + 2], xv.z, acc[k]);
                acc[k] = fmaf(w[j + 3], xv.w, acc[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < TT; k++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
        if (lane == 0) part[wp][k] = acc[k];
    }
    __syncthreads();
    if (threadIdx.x < TT && t0 + (int)threadIdx.x < T) {
        float v = part[0][threadIdx.x];
        for (int i = 1; i < ks; i++) v = __fadd_rn(v, part[i][threadIdx.x]);
        y[(int64_t)(t0 + threadIdx.x) * rows + r] = v;
    }
}

template <int ENC, int G, int TT>
__global__ void __launch_bounds__(SPLIT_KS * 32)
mm_split_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows, int64_t cols,
                const float *__restrict__ x, int T, float *__restrict__ y, int ks) {
    pdl_enter();
    mm_split_row<ENC, G, TT>(data, scale, rows, cols, x, T, y, ks, blockIdx.x);
}

/* One matrix of a two-matrix launch (mm_split2_kernel): data / scale, output, rows, its K split ks (split_ks) and
 * per, the rows a block holds (ks warps each). */
struct M2 {
    const uint8_t *d, *s;
    float *y;
    int64_t rows;
    int ks, per;
};

/* Two matrices of one encoding on one input, one token (cu_matmul2_launch): blocks [0, nb1) hold rows of the first,
 * the others rows of the second, per rows a block; each row walked by its matrix's ks warps exactly as mm_split_kernel
 * walks it (the same rounds per warp, fma chains from 0, butterfly, warp sums added in warp order): the same bits as
 * that matrix alone. A block's warps beyond per x ks add nothing. */
template <int ENC, int G>
__global__ void __launch_bounds__(SPLIT_KS * 32)
mm_split2_kernel(const M2 a, const M2 b, int64_t cols, const float *__restrict__ x, unsigned nb1) {
    pdl_enter();
    __shared__ float part[SPLIT_KS];
    const bool first = blockIdx.x < nb1;
    const uint8_t *__restrict__ d = first ? a.d : b.d;
    const uint8_t *__restrict__ sc = first ? a.s : b.s;
    const int ks = first ? a.ks : b.ks, per = first ? a.per : b.per;
    const int64_t rows = first ? a.rows : b.rows;
    const int64_t r0 = (int64_t)(first ? blockIdx.x : blockIdx.x - nb1) * per;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, ri = wp / ks, w = wp - ri * ks;
    const int64_t r = r0 + ri, ng = cols / G, nr = (ng + 31) / 32;
    float acc = 0.0f;
    if (ri < per && r < rows) {
        const int64_t rb = w * nr / ks, re = (w + 1) * nr / ks;
#pragma unroll 2
        for (int64_t rd = rb; rd < re; rd++) {
            const int64_t g = rd * 32 + lane;
            if (g >= ng) break;
            float wv[G];
            decode_group<ENC>(d, sc, cols, r, g, wv);
            const float *xp = x + g * G;
#pragma unroll
            for (int j = 0; j < G; j += 4) {
                const float4 xv = *reinterpret_cast<const float4 *>(xp + j);
                acc = fmaf(wv[j], xv.x, acc);
                acc = fmaf(wv[j + 1], xv.y, acc);
                acc = fmaf(wv[j + 2], xv.z, acc);
                acc = fmaf(wv[j + 3], xv.w, acc);
            }
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) part[wp] = acc;
    __syncthreads();
    if ((int)threadIdx.x < per && r0 + threadIdx.x < rows) {
        const float *pp = part + threadIdx.x * ks;
        float v = pp[0];
        for (int i = 1; i < ks; i++) v = __fadd_rn(v, pp[i]);
        (first ? a.y : b.y)[r0 + threadIdx.x] = v;
    }
}

/* ---- The tiled kernel (every T) ----
 * The same additions in the same order as mm_kernel, computed with a register tile: a warp holds RM rows x RT
 * tokens, lane l still owns the groups l, l+32, ... of each of its rows (partial sum chain per (row, token),
 * elements in order, fma; the same butterfly at the end), so its outputs are bitwise those of mm_kernel and do
 * not depend on T, the tile shape or the grid. What changes is the data movement:
 *   - the activations of the block's RT tokens are staged in shared memory (a chunk of NRC rounds of 32 groups
 *     at a time, each group padded by 4 floats so that the lanes' 16-byte reads hit distinct banks), read once
 *     per block from global memory and then shared by the NW warps and, per lane, by its RM rows;
 *   - each weight group is loaded once per block with one 16-byte load (plus its scale) one round ahead of its
 *     use (registers), and decoded 4 elements at a time, each decoded element serving RT tokens;
 *   - the decoding of a round is switched per warp between the fast path (exact bit placement and one multiply)
 *     and the element-wise path (NaN codes, scales that overflow when rescaled); both give the same bits where
 *     both apply, so the switch only costs time. */

/* The raw data of one group of one row: the 16-byte load and the multipliers of its decoding. */
struct Raw {
    uint4 v;
    float fs; /* fast path: the scale, rescaled by the power of two of the bit placement */
    float ss; /* element-wise path: the scale */
};

template <int Q> __device__ __forceinline__ uint32_t word(const uint4 &v) {
    if constexpr (Q == 0) return v.x;
    else if constexpr (Q == 1) return v.y;
    else if constexpr (Q == 2) return v.z;
    else return v.w;
}

/* Load group g of row r; returns whether the fast decoding path applies (as decode_group decides). */
template <int ENC>
__device__ __forceinline__ bool load_raw(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                                         int64_t cols, int64_t r, int64_t g, Raw &o) {
    constexpr int G = Grp<ENC>::G;
    o.v = reinterpret_cast<const uint4 *>(data)[(r * cols) / G + g];
    o.fs = 1.0f;
    o.ss = 1.0f;
    if constexpr (ENC == DF_W_FP8_B128) {
        const int64_t sc = (cols + 127) / 128;
        const float s = reinterpret_cast<const float *>(scale)[(r / 128) * sc + (g * 16) / 128];
        const uint32_t u[4] = {o.v.x, o.v.y, o.v.z, o.v.w};
        uint32_t nan = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) nan |= ((u[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        o.ss = s;
        o.fs = s * 0x1p120f;
        return nan == 0 && o.fs <= 3.0e38f && o.fs >= -3.0e38f;
    } else if constexpr (ENC == DF_W_INT8_ROW) {
        o.fs = reinterpret_cast<const float *>(scale)[r];
    } else if constexpr (ENC == DF_W_INT4_G32) {
        o.fs = bf16_f32(reinterpret_cast<const uint16_t *>(scale)[r * (cols / 32) + g]);
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint32_t e = scale[r * (cols / 32) + g];
        o.fs = e == 0 ? 0.5f : __uint_as_float((e + 126u) << 23); /* meaningful for e <= 128 */
        o.ss = e8m0_f32(e);
        return e <= 128;
    }
    return true;
}

/* Elements 4*JC .. 4*JC+3 of a loaded group, bitwise as decode_group gives them. */
template <int ENC, int JC, bool FAST>
__device__ __forceinline__ void decode4(const Raw &a, float *w) {
    if constexpr (ENC == DF_W_F32) {
        w[0] = __uint_as_float(a.v.x); w[1] = __uint_as_float(a.v.y);
        w[2] = __uint_as_float(a.v.z); w[3] = __uint_as_float(a.v.w);
    } else if constexpr (ENC == DF_W_BF16 || ENC == DF_W_F16) {
        const uint32_t u0 = word<2 * JC>(a.v), u1 = word<2 * JC + 1>(a.v);
        if constexpr (ENC == DF_W_BF16) {
            w[0] = __uint_as_float(u0 << 16); w[1] = __uint_as_float(u0 & 0xffff0000u);
            w[2] = __uint_as_float(u1 << 16); w[3] = __uint_as_float(u1 & 0xffff0000u);
        } else {
            w[0] = __half2float(__ushort_as_half((unsigned short)(u0 & 0xffffu)));
            w[1] = __half2float(__ushort_as_half((unsigned short)(u0 >> 16)));
            w[2] = __half2float(__ushort_as_half((unsigned short)(u1 & 0xffffu)));
            w[3] = __half2float(__ushort_as_half((unsigned short)(u1 >> 16)));
        }
    } else if constexpr (ENC == DF_W_FP8_B128) {
        const uint32_t u = word<JC>(a.v);
        if constexpr (FAST) {
            w[0] = e4m3_x2m120<0>(u) * a.fs; w[1] = e4m3_x2m120<1>(u) * a.fs;
            w[2] = e4m3_x2m120<2>(u) * a.fs; w[3] = e4m3_x2m120<3>(u) * a.fs;
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) w[k] = fp8_f32(u >> (8 * k)) * a.ss;
        }
    } else if constexpr (ENC == DF_W_INT8_ROW) {
        const uint32_t u = word<JC>(a.v);
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = (float)(int8_t)(uint8_t)(u >> (8 * k)) * a.fs;
    } else if constexpr (ENC == DF_W_INT4_G32) {
        const uint32_t u = word<JC / 2>(a.v);
        constexpr int K = (JC % 2) * 4;
        w[0] = int4_val<K>(u) * a.fs; w[1] = int4_val<K + 1>(u) * a.fs;
        w[2] = int4_val<K + 2>(u) * a.fs; w[3] = int4_val<K + 3>(u) * a.fs;
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint32_t u = word<JC / 2>(a.v);
        constexpr int K = (JC % 2) * 4;
        if constexpr (FAST) {
            w[0] = e2m1_x2m126<K>(u) * a.fs; w[1] = e2m1_x2m126<K + 1>(u) * a.fs;
            w[2] = e2m1_x2m126<K + 2>(u) * a.fs; w[3] = e2m1_x2m126<K + 3>(u) * a.fs;
        } else {
            w[0] = (e2m1_x2m126<K>(u) * 0x1p126f) * a.ss; w[1] = (e2m1_x2m126<K + 1>(u) * 0x1p126f) * a.ss;
            w[2] = (e2m1_x2m126<K + 2>(u) * 0x1p126f) * a.ss; w[3] = (e2m1_x2m126<K + 3>(u) * 0x1p126f) * a.ss;
        }
    }
}

/* Padded floats per group in shared memory: 16-byte reads of 8 consecutive lanes at a stride of G + 4
 * floats fall on distinct banks (G = 4: contiguous, already conflict-free). */
template <int G> struct Gp { static constexpr int V = G >= 8 ? G + 4 : G; };

/* One round of a lane: its group of each of the RM rows against RT tokens (xp: the lane's padded group of
 * token 0 in shared memory; token t at xp + t * tstride). */
template <int ENC, int G, int RM, int RT, bool FAST>
__device__ __forceinline__ void tile_round(const Raw (&a)[RM], const float *xp, int tstride, float (&acc)[RM][RT]) {
    Unroll<0, G / 4>::run([&](auto JCc) {
        constexpr int JC = decltype(JCc)::value;
        float4 xv[RT];
#pragma unroll
        for (int t = 0; t < RT; t++) xv[t] = *reinterpret_cast<const float4 *>(xp + t * tstride + 4 * JC);
#pragma unroll
        for (int k = 0; k < RM; k++) {
            float w[4];
            decode4<ENC, JC, FAST>(a[k], w);
#pragma unroll
            for (int t = 0; t < RT; t++) {
                acc[k][t] = fmaf(w[0], xv[t].x, acc[k][t]);
                acc[k][t] = fmaf(w[1], xv[t].y, acc[k][t]);
                acc[k][t] = fmaf(w[2], xv[t].z, acc[k][t]);
                acc[k][t] = fmaf(w[3], xv[t].w, acc[k][t]);
            }
        }
    });
}

/* 16-byte asynchronous copy global -> shared (cp.async, sm_80+); live == false writes zeros. */
__device__ __forceinline__ void cp16(void *sdst, const void *gsrc, bool live) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(sdst);
    const int n = live ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gsrc), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* Block: NW warps x RM rows, RT tokens (blockIdx.y); nrc rounds of activations per shared-memory chunk, two
 * chunk buffers when there are several chunks (the next chunk's copy overlaps the current chunk's work);
 * weights loaded PF (1 or 2) rounds ahead; MINB: blocks per SM the register allocation must allow. */
template <int ENC, int G, int RM, int RT, int NW, int MINB, int PF>
__global__ void __launch_bounds__(NW * 32, MINB)
tile_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows, int64_t cols,
            const float *__restrict__ x, int T, float *__restrict__ y, int nrc) {
    pdl_enter();
    constexpr int GP = Gp<G>::V;
    extern __shared__ float4 tile_smem[];
    float *xs = reinterpret_cast<float *>(tile_smem);
    const int lane = threadIdx.x & 31;
    const int64_t rbase = ((int64_t)blockIdx.x * NW + (threadIdx.x >> 5)) * RM;
    const int t0 = blockIdx.y * RT;
    const int64_t ng = cols / G, nrounds = (ng + 31) / 32;
    const int tstride = nrc * 32 * GP, bstride = RT * tstride; /* token / chunk-buffer strides (floats) */
    int64_t rr[RM];
#pragma unroll
    for (int k = 0; k < RM; k++) rr[k] = rbase + k < rows ? rbase + k : rows - 1; /* clamped: loads only */
    float acc[RM][RT];
#pragma unroll
    for (int k = 0; k < RM; k++)
#pragma unroll
        for (int t = 0; t < RT; t++) acc[k][t] = 0.0f;
    Raw pa[RM], pb[RM];
    bool fa = true, fb = true;
    auto load_round = [&](int64_t rd, Raw (&o)[RM], bool &f) {
        const int64_t g = rd * 32 + lane;
        f = true;
#pragma unroll
        for (int k = 0; k < RM; k++) {
            if (g < ng) f &= load_raw<ENC>(data, scale, cols, rr[k], g, o[k]);
            else o[k].v = make_uint4(0, 0, 0, 0), o[k].fs = o[k].ss = 0.0f;
        }
    };
    /* the copy of chunk c (rounds c*nrc ..) into buffer c & 1: one commit group per call */
    auto fill = [&](int64_t c) {
        if (c * nrc < nrounds) {
            const int64_t gfirst = c * nrc * 32, gend = (c + 1) * nrc * 32 < ng ? (c + 1) * nrc * 32 : ng;
            const int n4 = (int)(gend - gfirst) * (G / 4);
            float *buf = xs + (c & 1) * bstride;
#pragma unroll
            for (int t = 0; t < RT; t++) {
                const bool live = t0 + t < T;
                const float *src = x + (int64_t)(live ? t0 + t : 0) * cols + gfirst * G;
                float *dst = buf + t * tstride;
#pragma unroll 1
                for (int i = threadIdx.x; i < n4; i += NW * 32)
                    cp16(dst + (i / (G / 4)) * GP + 4 * (i % (G / 4)), src + 4 * (int64_t)i, live);
            }
        }
        cp_commit();
    };
    load_round(0, pa, fa);
    if (PF == 2 && nrounds > 1) load_round(1, pb, fb);
    fill(0);
    const int64_t nchunks = (nrounds + nrc - 1) / nrc;
#pragma unroll 1
    for (int64_t c = 0; c < nchunks; c++) {
        fill(c + 1); /* into the other buffer, read last in chunk c - 1 (the barrier below) */
        cp_wait1();  /* chunk c's copies (this thread's) are done */
        __syncthreads();
        const float *buf = xs + (c & 1) * bstride;
        const int64_t c0 = c * nrc, c1 = c0 + nrc < nrounds ? c0 + nrc : nrounds;
#pragma unroll 1
        for (int64_t rd = c0; rd < c1; rd++) {
            Raw cur[RM];
#pragma unroll
            for (int k = 0; k < RM; k++) cur[k] = pa[k];
            const bool cfast = fa;
            if constexpr (PF == 2) {
#pragma unroll
                for (int k = 0; k < RM; k++) pa[k] = pb[k];
                fa = fb;
                if (rd + 2 < nrounds) load_round(rd + 2, pb, fb);
            } else {
                if (rd + 1 < nrounds) load_round(rd + 1, pa, fa);
            }
            const bool allfast = __all_sync(0xffffffffu, cfast);
            if (rd * 32 + lane < ng) {
                const float *xp = buf + (int)((rd - c0) * 32 + lane) * GP;
                if (allfast) tile_round<ENC, G, RM, RT, true>(cur, xp, tstride, acc);
                else tile_round<ENC, G, RM, RT, false>(cur, xp, tstride, acc);
            }
        }
        __syncthreads(); /* buffer c & 1 is refilled by the next iteration's fill(c + 2) */
    }
#pragma unroll
    for (int k = 0; k < RM; k++)
#pragma unroll
        for (int t = 0; t < RT; t++)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[k][t] += __shfl_xor_sync(0xffffffffu, acc[k][t], off);
    /* every lane holds the same sums (the butterfly's additions commute): spread the stores */
#pragma unroll
    for (int k = 0; k < RM; k++)
#pragma unroll
        for (int t = 0; t < RT; t++)
            if (lane == ((k * RT + t) & 31) && rbase + k < rows && t0 + t < T)
                y[(int64_t)(t0 + t) * rows + rbase + k] = acc[k][t];
}

/* Kernel choice (cu_set_matvec_rows / cu_set_tile, cuda_internal.h): 0 = automatic; 1 = mm_kernel; others
 * force a tile shape. All give the same bits. For the encodings on the tensor-core kernel (g_mma) the same
 * numbers choose its tile shapes (cuda_mma.cu). */
int g_mv_rows = 0, g_tile = 0, g_mma = 1 << DF_W_MXFP4, g_split = 1;
constexpr int SMEM_CAP = 48 * 1024;

template <int ENC, int G, int RM, int RT, int NW, int MINB = 1, int PF = 1>
cudaError_t launch_tile(const uint8_t *d, const uint8_t *s, int64_t rows, int64_t cols, const float *x, int T, float *y,
                        cudaStream_t st) {
    constexpr int GP = Gp<G>::V;
    const int64_t nrounds = (cols / G + 31) / 32;
    const int64_t per_round = (int64_t)RT * 32 * GP * sizeof(float);
    /* one chunk buffer: up to 48 KB for one token (usually every round at once), 36 KB for 8 tokens (two buffers
     * of a 4-bit round, 74 KB, leave room for three blocks per SM) */
    int64_t nrc = (RT == 1 ? SMEM_CAP : 36 * 1024) / per_round;
    if (nrc < 1) nrc = 1;
    if (nrc > nrounds) nrc = nrounds;
    const int64_t nchunks = (nrounds + nrc - 1) / nrc;
    const size_t smem = (size_t)(nrc * per_round * (nchunks > 1 ? 2 : 1));
    if (smem > 48 * 1024) {
        static size_t raised = 0; /* per instantiation */
        if (smem > raised) {
            cudaError_t e = cudaFuncSetAttribute(tile_kernel<ENC, G, RM, RT, NW, MINB, PF>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(2 * SMEM_CAP));
            if (e != cudaSuccess) return e;
            raised = 2 * SMEM_CAP;
        }
    }
    const dim3 grid((unsigned)((rows + NW * RM - 1) / (NW * RM)), (unsigned)((T + RT - 1) / RT));
    cu_launch(tile_kernel<ENC, G, RM, RT, NW, MINB, PF>, grid, NW * 32, smem, st, d, s, rows, cols, x, T, y, (int)nrc);
    return cudaGetLastError();
}

template <int ENC, int G>
cudaError_t launch_g(const uint8_t *d, const uint8_t *s, int64_t rows, int64_t cols, const float *x, int T, float *y,
                     cudaStream_t st) {
    const dim3 blk(WARPS * 32);
    const unsigned gx = (unsigned)((rows + WARPS - 1) / WARPS);
    if constexpr (G >= 4) {
        /* the variants are compiled for the encodings of routed experts and the spine (not f16 / int8_row) */
        constexpr bool var = ENC != DF_W_F16 && ENC != DF_W_INT8_ROW;
        /* Automatic choice, from the H200 measurements (bench/RESULTS.md, all variants give the same bits):
         * one token: 16/32-bit weights carry few elements per byte, so the one-row-per-warp kernel reading its
         * activations through L1 keeps up with HBM (85-102%); 4-bit and fp8 weights: the tiled kernel, two rows
         * per warp, 8 warps per block below 16384 rows (more blocks in flight), else 4.
         * T >= 2: 16/32-bit: 32 rows x 8 tokens per block (8 warps); 4-bit / fp8: 16 x 8 (4 warps, registers for
         * three blocks per SM) for long prompts and large matrices, else 8 x 8 below 4096 rows, 32 x 8 between. */
        if (T == 1) {
            int v = g_mv_rows;
            if (v == 0) v = G <= 8 ? 1 : rows >= 16384 ? 2 : 8;
            if (v == 1) cu_launch(mm_kernel<ENC, G, 1>, dim3(gx, 1), blk, 0, st, d, s, rows, cols, x, T, y);
            else if (var && v == 4) return launch_tile<ENC, G, 4, 1, 4, 4, 2>(d, s, rows, cols, x, T, y, st);
            else if (var && v == 8) return launch_tile<ENC, G, 2, 1, 8, 2, 2>(d, s, rows, cols, x, T, y, st);
            else return launch_tile<ENC, G, 2, 1, 4, 6, 2>(d, s, rows, cols, x, T, y, st);
        } else {
            int v = g_tile;
            if (v == 0) v = G <= 8 ? 4 : (T >= 64 || rows >= 16384) ? 8 : rows < 4096 ? 2 : 4;
            if (v == 1) cu_launch(mm_kernel<ENC, G, 8>, dim3(gx, (T + 7) / 8), blk, 0, st, d, s, rows, cols, x, T, y);
            else if (v == 2) return launch_tile<ENC, G, 2, 8, 4, 3>(d, s, rows, cols, x, T, y, st);
            else if (var && v == 8) return launch_tile<ENC, G, 4, 8, 4, 3>(d, s, rows, cols, x, T, y, st);
            else return launch_tile<ENC, G, 4, 8, 8>(d, s, rows, cols, x, T, y, st);
        }
        return cudaGetLastError();
    }
    /* cols not a multiple of G: the one-row-per-warp kernel element by element (the token tile only changes
     * how many tokens share a decoded element, never a sum's order) */
    if (T >= 2) cu_launch(mm_kernel<ENC, G, 8>, dim3(gx, (T + 7) / 8), blk, 0, st, d, s, rows, cols, x, T, y);
    else cu_launch(mm_kernel<ENC, G, 1>, dim3(gx, T), blk, 0, st, d, s, rows, cols, x, T, y);
    return cudaGetLastError();
}

template <int ENC>
cudaError_t launch(const uint8_t *d, const uint8_t *s, int64_t rows, int64_t cols, const float *x, int T, float *y,
                   cudaStream_t st) {
    constexpr int G = Grp<ENC>::G;
    /* the tensor-core kernel (cuda_mma.cu) for every T where chosen: its own canonical order */
    if constexpr (ENC == DF_W_MXFP4 || ENC == DF_W_BF16)
        if (((g_mma >> ENC) & 1) && cols % 32 == 0)
            return cu_mma_launch((df_wtype)ENC, d, s, rows, cols, x, T, y, T == 1 ? g_mv_rows : g_tile, st);
    if constexpr (G > 1) {
        if (g_split && rows <= SPLIT_ROWS && cols % G == 0) {
            const int ks = split_ks(rows, cols, G);
            if (T == 1) cu_launch(mm_split_kernel<ENC, G, 1>, dim3((unsigned)rows, 1), ks * 32, 0, st, d, s, rows, cols, x, T, y, ks);
            else cu_launch(mm_split_kernel<ENC, G, 8>, dim3((unsigned)rows, (unsigned)((T + 7) / 8)), ks * 32, 0, st, d, s, rows, cols, x, T, y, ks);
            return cudaGetLastError();
        }
        if (cols % G == 0) return launch_g<ENC, G>(d, s, rows, cols, x, T, y, st);
    }
    if constexpr (ENC == DF_W_INT4_G32 || ENC == DF_W_MXFP4) return cudaErrorInvalidValue;
    else /* cols % 32 != 0: not a valid weight */
    return launch_g<ENC, 1>(d, s, rows, cols, x, T, y, st);
}

} // namespace

void cu_set_matvec_rows(int n) { g_mv_rows = n == 1 || n == 2 || n == 4 || n == 8 ? n : 0; }
void cu_set_tile(int n) { g_tile = n == 1 || n == 2 || n == 4 || n == 8 ? n : 0; }
int cu_get_variant(int T) { return T == 1 ? g_mv_rows : g_tile; }
void cu_set_split(int on) { g_split = on != 0; }
void cu_set_mma(unsigned mask) { g_mma = (int)(mask & ((1u << DF_W_MXFP4) | (1u << DF_W_BF16))); }
unsigned cu_get_mma(void) { return (unsigned)g_mma; }

cudaError_t cu_matmul_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                             const float *x, int T, float *y, cudaStream_t st) {
    if (T <= 0 || rows <= 0) return cudaSuccess;
    if (T > 65535 * 8) return cudaErrorInvalidValue;
    const uint8_t *d = static_cast<const uint8_t *>(data), *s = static_cast<const uint8_t *>(scale);
/* DF_CUDA_ENCS: a bit mask of the encodings to compile (tools/device/cuda_kernels_check.cu builds a subset
 * to save compile time on the accelerator machine); the product compiles all. */
#ifndef DF_CUDA_ENCS
#define DF_CUDA_ENCS 0x7f
#endif
#define ENC_CASE(E)                                                                                                    \
    case E:                                                                                                            \
        if constexpr ((DF_CUDA_ENCS >> E) & 1) return launch<E>(d, s, rows, cols, x, T, y, st);                        \
        else return cudaErrorInvalidValue;
    switch (type) {
        ENC_CASE(DF_W_F32)
        ENC_CASE(DF_W_BF16)
        ENC_CASE(DF_W_F16)
        ENC_CASE(DF_W_FP8_B128)
        ENC_CASE(DF_W_INT4_G32)
        ENC_CASE(DF_W_MXFP4)
        ENC_CASE(DF_W_INT8_ROW)
    default: return cudaErrorInvalidValue;
    }
#undef ENC_CASE
}

namespace {
template <int ENC>
cudaError_t launch2(const uint8_t *d1, const uint8_t *s1, int64_t rows1, const uint8_t *d2, const uint8_t *s2,
                    int64_t rows2, int64_t cols, const float *x, float *y1, float *y2, cudaStream_t st) {
    constexpr int G = Grp<ENC>::G;
    if (!g_split || rows1 > SPLIT_ROWS || rows2 > SPLIT_ROWS || cols % G != 0 || ((g_mma >> ENC) & 1))
        return cudaErrorNotSupported;
    const int k1 = split_ks(rows1, cols, G), k2 = split_ks(rows2, cols, G), km = k1 > k2 ? k1 : k2;
    const M2 a = {d1, s1, y1, rows1, k1, km / k1}, b = {d2, s2, y2, rows2, k2, km / k2};
    const unsigned nb1 = (unsigned)((rows1 + a.per - 1) / a.per), nb2 = (unsigned)((rows2 + b.per - 1) / b.per);
    cu_launch(mm_split2_kernel<ENC, G>, dim3(nb1 + nb2), km * 32, 0, st, a, b, cols, x, nb1);
    return cudaGetLastError();
}
} // namespace

cudaError_t cu_matmul2_launch(df_wtype type, const void *d1, const void *s1, int64_t rows1, const void *d2,
                              const void *s2, int64_t rows2, int64_t cols, const float *x, float *y1, float *y2,
                              cudaStream_t st) {
    const uint8_t *a = static_cast<const uint8_t *>(d1), *as = static_cast<const uint8_t *>(s1);
    const uint8_t *b = static_cast<const uint8_t *>(d2), *bs = static_cast<const uint8_t *>(s2);
    if (rows1 <= 0 || rows2 <= 0) return cudaErrorNotSupported;
    switch (type) {
    case DF_W_BF16: return launch2<DF_W_BF16>(a, as, rows1, b, bs, rows2, cols, x, y1, y2, st);
    case DF_W_FP8_B128: return launch2<DF_W_FP8_B128>(a, as, rows1, b, bs, rows2, cols, x, y1, y2, st);
    default: return cudaErrorNotSupported;
    }
}
