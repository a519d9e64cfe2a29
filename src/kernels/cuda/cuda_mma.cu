/*
 * cuda_mma.cu — y [T, rows] = x [T, cols] · W^T for MXFP4 (and BF16) weights on the tensor cores, with exact
 * operands. MXFP4 matmuls use it by default (cu_set_mma, env DF_CUDA_MMA); BF16 stays on the fp32-FMA kernels,
 * which are faster for one token (bench/RESULTS.md).
 *
 * Math (shared/notes/formats.md): w = E2M1(code) x 2^(e-127) per 32-element group. Every such w is exactly a
 * bfloat16 (2 significant bits, fp32's exponent range), and every fp32 activation x is exactly the sum of
 * three bfloat16 parts (x = hi + mid + lo: hi = x with its low 16 bits cleared, mid the same of x - hi, lo the
 * rest, each step exact). So y = sum_k w_k hi_k + w_k mid_k + w_k lo_k is computed by bf16 tensor-core MMAs
 * (mma.sync m16n8k16, fp32 accumulation) with no rounding of any operand: the products are exact and only the
 * accumulation rounds (in the tensor core's fp32 adder). Limits of the split: an activation below about 2^-109 in
 * magnitude loses the bits of its lo part under bf16's smallest subnormal (2^-133), and an infinite activation
 * gives NaN (inf - inf in the split) where the FMA kernels give inf.
 *
 * Decoding: two codes of a 32-bit word of packed E2M1 (elements k and k+4, 16 bits apart) are placed into the
 * bf16 subnormal range (value x 2^-126, subnormal codes included) of one bf16x2 word, then one bf16x2 multiply
 * by 2^(e-1) (= the scale x 2^126, exact) gives both weights; scales above 2^1 take two multiplies (by 2^126,
 * then by the scale; the same bits, an overflow to inf as in fp32). A word's four pairs share the bit placement:
 * its signs rotated 6 bits up land 9 bits above their codes' magnitudes, and two merges of the word with that
 * rotation (pairs 0, 1 and pairs 2, 3) leave each pair's magnitudes and signs one shift or rotation away from
 * their places: 11 integer operations per 8 weights (e2m1_word).
 *
 * Canonical order (what makes results independent of T and of the launch shape): the columns are cut into
 * rounds of 128 (4 groups); in round r the lane with t = lane & 3 owns group 4r + t, and its 32 elements are
 * the MMA's k slots {2t, 2t+1, 2t+8, 2t+9} of 8 k-steps (pairs of elements (8w+p, 8w+p+4), w = word, p = pair),
 * the activations' parts permuted the same way (split kernel below). Each part of each token is its own MMA
 * column (B operand), so a k-step is one MMA per 8 (token, part) columns and each part has its own fp32
 * accumulator per (row, token): one token costs one MMA per k-step, not three. A K-slice count KS that depends
 * only on cols splits the rounds: slice s takes rounds s, s+KS, ..., accumulating k-step after k-step; the KS
 * partial sums of each part are added in slice order, then y = (hi + mid) + lo. Each output element's additions
 * depend only on (rows' data, cols): a token's result is bitwise the same alone, in a prompt batch or in a served
 * batch, and for every tile shape (variants). The MMA computes each column of its 16 x 8 output from that
 * column's operands only.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_act.cuh"
#include "cuda_decode.cuh"
#include "cuda_split.cuh"

#include <stdint.h>
#include <type_traits>

namespace {

/* a x b per bf16 half, rounded to nearest (exact here); fma with -0 keeps the sign of a zero product */
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

/* (a & ~M) | (b & M) in one LOP3 */
template <uint32_t M> __device__ __forceinline__ uint32_t merge(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xD8;\n" : "=r"(d) : "r"(a), "r"(b), "n"(M));
    return d;
}

/* The four pairs of the 8 E2M1 codes of u (code n at bits 4n..4n+3: m, e0, e1, sign): pair P = codes P (low half)
 * and P + 4 (high half), magnitude bits at bf16 bits 6..8, sign at bit 15, i.e. value x 2^-126. r = u rotated 6
 * up puts the sign of code n (bit 4n + 3) at bit 4n + 9 (mod 32); w01 takes the magnitudes of codes 0, 1, 4, 5 from
 * u and everything else from r, w23 those of codes 2, 3, 6, 7. Then pair 0 = w01 << 6, pair 1 = w01 << 2, pair 2 =
 * w23 rotated 2 down, pair 3 = w23 rotated 6 down, each masked to bits 6..8, 15, 22..24, 31. */
__device__ __forceinline__ void e2m1_word(uint32_t u, uint32_t (&p)[4]) {
    constexpr uint32_t M = 0x81C081C0u;
    const uint32_t r = __funnelshift_l(u, u, 6);
    const uint32_t w01 = merge<0x00770077u>(r, u), w23 = merge<0x77007700u>(r, u);
    p[0] = (w01 << 6) & M;
    p[1] = (w01 << 2) & M;
    p[2] = __funnelshift_r(w23, w23, 2) & M;
    p[3] = __funnelshift_r(w23, w23, 6) & M;
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int Q> __device__ __forceinline__ uint32_t word(const uint4 &v) {
    if constexpr (Q == 0) return v.x;
    else if constexpr (Q == 1) return v.y;
    else if constexpr (Q == 2) return v.z;
    else return v.w;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* Per encoding (BF16 weights are bf16 already: the A registers are their halves, permuted with prmt): one lane's
 * group of 32 consecutive elements of one row (G), its load, the group's multipliers (Mul, computed when the
 * round that uses the group runs), and (frags<Q>) the A registers of k-steps 2Q + H, H = 0, 1: [2H] = elements (8Q + 2H, 8Q + 2H + 4), [2H + 1] = elements (8Q + 2H + 1, 8Q + 2H + 5) of the group. */
template <int ENC> struct Op;

template <> struct Op<DF_W_MXFP4> {
    /* 16 bytes of codes and the group's raw E8M0 scale byte. The scale is decoded into multipliers (Mul) only when
     * the round that uses it runs: decoding it at load time would wait for the byte there, one HBM round trip per
     * load, and leave the prefetch ring nothing to overlap. */
    struct G {
        uint4 v;
        uint32_t e;
    };
    struct Mul { /* the first bf16x2 multiplier (the second, for scales above 2^1, is made by frags<Q, true>) */
        uint32_t m1;
    };
    /* group 4 r + t of row R is group o + 4 r of the weight (a weight's groups: < 2^32, cu_mma_launch) */
    struct Row {
        uint32_t o;
        bool ok; /* R < rows */
    };
    __device__ __forceinline__ static Row row(int64_t rows, int64_t ng, int64_t R, int t) {
        return {(uint32_t)(R * ng + t), R < rows};
    }
    /* group 4 r + t of the row (live: the row exists and the group is within it; else zero codes, scale 2^-127) */
    __device__ __forceinline__ static void load(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                                                const Row &w, uint32_t r, bool live, G &o) {
        const uint32_t ix = w.o + 4 * r;
        o.v = live ? ld_stream(reinterpret_cast<const uint4 *>(data) + ix) : make_uint4(0, 0, 0, 0);
        o.e = live ? (uint32_t)__ldg(scale + ix) : 0u;
    }
    /* 2^(e-1) when e <= 128 (bf16 exponent field e + 126; e = 0 too: 2^-1), else 2^126 (then 2^(e-127), m2) */
    __device__ __forceinline__ static Mul mul(const G &g) {
        const uint32_t e = g.e;
        return {e <= 128 ? ((e + 126u) << 7) * 0x10001u : 0x7E807E80u};
    }
    /* the second multiplier: 2^(e-127) for e > 128 (e = 255: NaN), else 0 (none) */
    __device__ __forceinline__ static uint32_t mul2(uint32_t e) {
        return e > 128 ? (e == 255 ? 0x7FC0u : e << 7) * 0x10001u : 0u;
    }
    __device__ __forceinline__ static bool slow(const G &g) { return g.e > 128; }
    /* the A registers of word Q: k-step 2Q lo, hi, then k-step 2Q + 1 lo, hi (pairs 0..3 of the word) */
    template <int Q, bool SLOW>
    __device__ __forceinline__ static void frags(const G &g, const Mul &m, uint32_t (&a)[4]) {
        uint32_t p[4];
        e2m1_word(word<Q>(g.v), p);
        const uint32_t m2 = SLOW ? mul2(g.e) : 0u;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a[k] = bf16x2_mul(p[k], m.m1);
            if constexpr (SLOW) a[k] = m2 ? bf16x2_mul(a[k], m2) : a[k];
        }
    }
};

template <> struct Op<DF_W_BF16> {
    struct G { /* 64 bytes: elements 8q .. 8q + 7 in v[q] */
        uint4 v[4];
    };
    struct Row {
        uint32_t o;
        bool ok;
    };
    __device__ __forceinline__ static Row row(int64_t rows, int64_t ng, int64_t R, int t) {
        return {(uint32_t)(R * ng + t), R < rows};
    }
    __device__ __forceinline__ static void load(const uint8_t *__restrict__ data, const uint8_t *__restrict__,
                                                const Row &w, uint32_t r, bool live, G &o) {
        const uint4 *p = reinterpret_cast<const uint4 *>(data) + (size_t)(w.o + 4 * r) * 4;
#pragma unroll
        for (int q = 0; q < 4; q++) o.v[q] = live ? ld_stream(p + q) : make_uint4(0, 0, 0, 0);
    }
    struct Mul {};
    __device__ __forceinline__ static Mul mul(const G &) { return {}; }
    __device__ __forceinline__ static bool slow(const G &) { return false; }
    template <int Q, bool>
    __device__ __forceinline__ static void frags(const G &g, const Mul &, uint32_t (&r)[4]) {
#pragma unroll
        for (int H = 0; H < 2; H++) {
            const uint32_t a = H ? g.v[Q].y : g.v[Q].x, b = H ? g.v[Q].w : g.v[Q].z;
            r[2 * H] = prmt(a, b, 0x5410);     /* low halves: elements 8Q + 2H, 8Q + 2H + 4 */
            r[2 * H + 1] = prmt(a, b, 0x7632); /* high halves: elements 8Q + 2H + 1, 8Q + 2H + 5 */
        }
    }
};

template <int K, int N> struct Unroll {
    template <class F> __device__ __forceinline__ static void run(F &&f) {
        f(std::integral_constant<int, K>());
        Unroll<K + 1, N>::run(f);
    }
};
template <int N> struct Unroll<N, N> {
    template <class F> __device__ __forceinline__ static void run(F &&) {}
};

/* The activations' bf16 parts in MMA operand order (cuda_split.cuh): thread i of T * ng * 8 handles item i.
 * The activation applied to the split's input on the fly: x' = act(x, u) elementwise (u [T, cols] beside x; act 0 =
 * SwiGLU, 1 = SiTU with beta / lb, as cuda_act.cuh); u NULL: x itself. */
struct SplitAct {
    const float *u;
    int act;
    float beta, lb;
};
__device__ __forceinline__ float split_in(const float *__restrict__ xp, const SplitAct &a, const float *__restrict__ x,
                                          int o) {
    if (!a.u) return xp[o];
    const float u = a.u[(xp - x) + o];
    return a.act ? act_situ_mul(xp[o], u, a.beta, a.lb) : act_silu_mul(xp[o], u);
}
__device__ __forceinline__ void split_one(const float *__restrict__ x, int T, int64_t cols, uint32_t *__restrict__ xs,
                                          int64_t i, const SplitAct &a = SplitAct{nullptr, 0, 0.0f, 0.0f}) {
    const int64_t ng = cols / 32;
    if (i >= (int64_t)T * ng * 8) return;
    int64_t tg;
    const int64_t e = split_elem(i, ng, &tg);
    const float *xp = x + (tg / ng) * cols + e;
    const float v[4] = {split_in(xp, a, x, 0), split_in(xp, a, x, 4), split_in(xp, a, x, 1),
                        split_in(xp, a, x, 5)}; /* B0 low, B0 high, B1 low, B1 high */
    split_store(v, xs, i);
}

__global__ void split_kernel(const float *__restrict__ x, int T, int64_t cols, uint32_t *__restrict__ xs,
                             const SplitAct a) {
    pdl_enter();
    split_one(x, T, cols, xs, (int64_t)blockIdx.x * blockDim.x + threadIdx.x, a);
}

/* Items of a grouped launch (cu_mma_group_launch) per kernel call: the parameter block stays under 4 KB. */
constexpr int MAXG = CU_MMA_MAXG;

/* The split of up to MAXG separate inputs in one launch: input j (x[j] [T[j], cols], device) into the rows of xs
 * from xrow[j] on; blockIdx.y = j. */
struct SplitGroup {
    const float *x[MAXG], *u[MAXG];
    int T[MAXG], xrow[MAXG];
    int act;
    float beta, lb;
};
__global__ void split_group_kernel(const __grid_constant__ SplitGroup g, int64_t cols, uint32_t *__restrict__ xs) {
    pdl_enter();
    const int j = blockIdx.y;
    split_one(g.x[j], g.T[j], cols, xs + (int64_t)g.xrow[j] * (cols / 32) * 48,
              (int64_t)blockIdx.x * blockDim.x + threadIdx.x, SplitAct{g.u[j], g.act, g.beta, g.lb});
}

/* A grouped launch's items (blockIdx.z = item; cuda_internal.h). */
using MmaGroup = cu_mma_group;

/* Block: KS warps, one per K slice, on the same RM m-tiles (16 rows each) x NT n-tiles (8 columns each). The
 * columns are (token, part) pairs: column 3k + p of the block is part p (0 = hi, 1 = mid, 2 = lo) of its k-th token
 * (TPB = 8 NT / 3 tokens per block, the last 8 NT - 3 TPB columns unused), so each k-step is one MMA per n-tile and
 * each part has its own fp32 accumulator. The slices' accumulators are added in slice order through shared memory,
 * then a token's output is (hi + mid) + lo of its three columns. */
template <int NT> struct Tpb { static constexpr int value = 8 * NT / 3; };

template <int RM, int NT, int KS> constexpr size_t mma_smem() {
    return sizeof(float) * ((KS > 1 ? (size_t)KS * RM * NT * 4 * 32 : 0) + (size_t)16 * RM * 8 * NT);
}

template <int ENC, int RM, int NT, int KS, int PF>
__device__ __forceinline__ void mma_tile(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows,
                                         int64_t cols, const uint4 *__restrict__ xs, int T, float *__restrict__ y,
                                         const int64_t m0, const int tok0) {
    constexpr int TPB = Tpb<NT>::value;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = threadIdx.x >> 5;
    const int64_t ng = cols / 32;
    const int nrounds = (int)((ng + 3) / 4);
    float d[RM][NT][4];
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) d[i][j][c] = 0.0f;
    /* weights PF rounds ahead of their use, in a ring of registers (bytes in flight hide HBM latency) */
    using O = Op<ENC>;
    using Grp = typename O::G;
    Grp buf[PF][RM][2];
    typename O::Row wr[RM][2];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        wr[i][0] = O::row(rows, ng, m0 + 16 * i + g, t);
        wr[i][1] = O::row(rows, ng, m0 + 16 * i + g + 8, t);
    }
    auto load_round = [&](int r, Grp (&o)[RM][2]) {
        const bool gl = (int64_t)r * 4 + t < ng;
#pragma unroll
        for (int i = 0; i < RM; i++) {
            O::load(data, scale, wr[i][0], (uint32_t)r, gl && wr[i][0].ok, o[i][0]);
            O::load(data, scale, wr[i][1], (uint32_t)r, gl && wr[i][1].ok, o[i][1]);
        }
    };
    /* this lane's B column in each n-tile: token tok0 + vc / 3, part vc % 3 (vc = 8 j + g) */
    const uint4 *xbase[NT]; /* its part of group t (round 0) */
    bool xlive[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int vc = 8 * j + g, tk = vc / 3;
        xlive[j] = tk < TPB && tok0 + tk < T;
        xbase[j] = xs + (xlive[j] ? ((int64_t)(tok0 + tk) * ng + t) * 12 + vc % 3 * 4 : 0);
    }
    auto round = [&](int r, const Grp (&cur)[RM][2]) {
        const int64_t gi = (int64_t)r * 4 + t;
        bool slow = false;
#pragma unroll
        for (int i = 0; i < RM; i++) slow |= O::slow(cur[i][0]) | O::slow(cur[i][1]);
        slow = __any_sync(0xffffffffu, slow);
        typename O::Mul mu[RM][2];
#pragma unroll
        for (int i = 0; i < RM; i++) mu[i][0] = O::mul(cur[i][0]), mu[i][1] = O::mul(cur[i][1]);
        const uint4 *xb[NT];
        bool live[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            live[j] = xlive[j] && gi < ng;
            xb[j] = xbase[j] + (live[j] ? (uint32_t)r * 48u : 0u);
        }
        Unroll<0, 4>::run([&](auto Qc) {
            constexpr int Q = decltype(Qc)::value;
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) b[j] = live[j] ? xb[j][Q] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < RM; i++) {
                uint32_t r0[4], r1[4]; /* rows g, g + 8: k-step 2Q + H's k slots {2t, 2t+1} in [2H], {2t+8, 2t+9} in [2H+1] */
                if (slow) {
                    O::template frags<Q, true>(cur[i][0], mu[i][0], r0);
                    O::template frags<Q, true>(cur[i][1], mu[i][1], r1);
                } else {
                    O::template frags<Q, false>(cur[i][0], mu[i][0], r0);
                    O::template frags<Q, false>(cur[i][1], mu[i][1], r1);
                }
#pragma unroll
                for (int H = 0; H < 2; H++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        mma16816(d[i][j], r0[2 * H], r1[2 * H], r0[2 * H + 1], r1[2 * H + 1], H ? b[j].z : b[j].x,
                                 H ? b[j].w : b[j].y);
            }
        });
    };
#pragma unroll
    for (int k = 0; k < PF; k++)
        if (ks + k * KS < nrounds) load_round(ks + k * KS, buf[k]);
#pragma unroll 1
    for (int r0 = ks; r0 < nrounds; r0 += KS * PF) {
        Unroll<0, PF>::run([&](auto Ic) {
            constexpr int I = decltype(Ic)::value;
            const int r = r0 + I * KS;
            if (r < nrounds) {
                Grp cur[RM][2];
#pragma unroll
                for (int i = 0; i < RM; i++) cur[i][0] = buf[I][i][0], cur[i][1] = buf[I][i][1];
                if (r + KS * PF < nrounds) load_round(r + KS * PF, buf[I]);
                round(r, cur);
            }
        });
    }
    extern __shared__ float mma_red[]; /* [KS][RM*NT*4][32] when KS > 1, then the tile [16 RM][8 NT] */
    constexpr int NV = RM * NT * 4;
    if constexpr (KS > 1) {
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) mma_red[(ks * NV + (i * NT + j) * 4 + c) * 32 + lane] = d[i][j][c];
        __syncthreads();
        if (ks != 0) return;
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float s = d[i][j][c];
#pragma unroll 1
                    for (int k = 1; k < KS; k++) s += mma_red[(k * NV + (i * NT + j) * 4 + c) * 32 + lane];
                    d[i][j][c] = s;
                }
    }
    /* D fragment: c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g + 8; into the tile, then each token's parts */
    float *tile = mma_red + (KS > 1 ? KS * NV * 32 : 0);
    constexpr int TW = 8 * NT;
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) tile[(16 * i + g + (c >= 2 ? 8 : 0)) * TW + 8 * j + 2 * t + (c & 1)] = d[i][j][c];
    __syncwarp();
    for (int e = lane; e < 16 * RM * TPB; e += 32) {
        const int rr = e / TPB, k = e % TPB;
        const int64_t row = m0 + rr;
        const int tok = tok0 + k;
        const float *v = tile + rr * TW + 3 * k;
        if (row < rows && tok < T) y[(int64_t)tok * rows + row] = (v[0] + v[1]) + v[2];
    }
}

template <int ENC, int RM, int NT, int KS, int PF>
__global__ void __launch_bounds__(KS * 32)
mma_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale, int64_t rows, int64_t cols,
           const uint4 *__restrict__ xs, int T, float *__restrict__ y) {
    pdl_enter();
    mma_tile<ENC, RM, NT, KS, PF>(data, scale, rows, cols, xs, T, y, (int64_t)blockIdx.x * (16 * RM),
                                  (int)blockIdx.y * Tpb<NT>::value);
}

/* The same tile for item blockIdx.z of a group (every item: the same shape and encoding): the same code on the same
 * values, so each output has the bits of its item's own mma_kernel launch. */
template <int ENC, int RM, int NT, int KS, int PF>
__global__ void __launch_bounds__(KS * 32)
mma_group_kernel(const __grid_constant__ MmaGroup g, int64_t rows, int64_t cols, const uint4 *__restrict__ xs) {
    pdl_enter();
    const int i = blockIdx.z, n0 = (int)blockIdx.y * Tpb<NT>::value;
    if (n0 >= g.T[i]) return; /* the whole block: past this item's tokens */
    mma_tile<ENC, RM, NT, KS, PF>(g.d[i], g.s[i], rows, cols, xs + (int64_t)g.xrow[i] * (cols / 32) * 12, g.T[i], g.y[i],
                                  (int64_t)blockIdx.x * (16 * RM), n0);
}

/* The same from a group in device memory (cu_mma_group_dev_launch). */
template <int ENC, int RM, int NT, int KS, int PF>
__global__ void __launch_bounds__(KS * 32)
mma_group_dev_kernel(const MmaGroup *__restrict__ g, int64_t rows, int64_t cols, const uint4 *__restrict__ xs) {
    pdl_enter();
    const int i = blockIdx.z, n0 = (int)blockIdx.y * Tpb<NT>::value, T = g->T[i];
    if (n0 >= T) return;
    mma_tile<ENC, RM, NT, KS, PF>(g->d[i], g->s[i], rows, cols, xs + (int64_t)g->xrow[i] * (cols / 32) * 12, T, g->y[i],
                                  (int64_t)blockIdx.x * (16 * RM), n0);
}

/* The activations' split for up to TC tokens at a time (device scratch, grown on demand). */
constexpr int TC = 256;
uint32_t *g_xs = nullptr;
size_t g_xs_cap = 0;

cudaError_t xs_reserve(size_t need, cudaStream_t st) {
    if (need <= g_xs_cap) return cudaSuccess;
    cudaError_t e = cudaStreamSynchronize(st); /* the old buffer may still be read */
    if (e != cudaSuccess) return e;
    if (g_xs) cudaFree(g_xs);
    g_xs = nullptr;
    g_xs_cap = 0;
    if ((e = cudaMalloc(&g_xs, need)) != cudaSuccess) return e;
    g_xs_cap = need;
    return cudaSuccess;
}

/* One launch: a single weight (g == gd == NULL: d, s, y, T) or nz items of a group (g in the parameters, or gd in
 * device memory; T = the most tokens of an item). */
struct Launch {
    const uint8_t *d, *s;
    const uint4 *xs;
    float *y;
    int T;
    const MmaGroup *g;
    int nz;
    const MmaGroup *gd;
};

template <int ENC, int RM, int NT, int KS, int PF>
cudaError_t launch_mma(const Launch &a, int64_t rows, int64_t cols, cudaStream_t st) {
    constexpr size_t smem = mma_smem<RM, NT, KS>();
    constexpr int TPB = Tpb<NT>::value;
    const dim3 grid((unsigned)((rows + 16 * RM - 1) / (16 * RM)), (unsigned)((a.T + TPB - 1) / TPB),
                    a.g || a.gd ? (unsigned)a.nz : 1u);
    if (a.gd) cu_launch(mma_group_dev_kernel<ENC, RM, NT, KS, PF>, grid, KS * 32, smem, st, a.gd, rows, cols, a.xs);
    else if (a.g) cu_launch(mma_group_kernel<ENC, RM, NT, KS, PF>, grid, KS * 32, smem, st, *a.g, rows, cols, a.xs);
    else cu_launch(mma_kernel<ENC, RM, NT, KS, PF>, grid, KS * 32, smem, st, a.d, a.s, rows, cols, a.xs, a.T, a.y);
    return cudaGetLastError();
}

/* K slices: from cols only (never T, the variant or the grouping), so that the additions stay the same for every
 * call: 8 from 32 rounds of 128 columns up, 4 from 8, else 1, at most g_ks_max (default 2; DF_CUDA_MMA_KS, a
 * developer knob for timing: it changes the canonical order, so every result's bits, alike for every T). On the
 * H200 (bench/RESULTS.md) 2 slices gave the fastest grouped one-token launches (a decode step's experts: 41-44% of
 * HBM against 36-39% with 8) and 512-token GEMMs (31-36 TFLOP/s against 17-30), while a single one-token
 * 2048-row launch is slower (6% of HBM against 13%: too few warps for the GPU). */
int g_ks_max = 2; /* cu_set_mma_ks */

template <int ENC, int RM, int NT, int PF>
cudaError_t launch_ks(const Launch &a, int64_t rows, int64_t cols, cudaStream_t st) {
    const int64_t nrounds = (cols / 32 + 3) / 4;
    int ks = nrounds >= 32 ? 8 : nrounds >= 8 ? 4 : 1;
    if (ks > g_ks_max) ks = g_ks_max;
    switch (ks) {
    case 8: return launch_mma<ENC, RM, NT, 8, PF>(a, rows, cols, st);
    case 4: return launch_mma<ENC, RM, NT, 4, PF>(a, rows, cols, st);
    case 2: return launch_mma<ENC, RM, NT, 2, PF>(a, rows, cols, st);
    default: return launch_mma<ENC, RM, NT, 1, PF>(a, rows, cols, st);
    }
}

} // namespace

namespace {
/* DF_T1_PF: the one-token tile's prefetch depth (rounds ahead); a build-time knob for timing (tools/device/
 * acceptance.sh part 41: 2 and 3 were 6% slower on the H100's resident decode than 1); no bit depends on it. */
#ifndef DF_T1_PF
#define DF_T1_PF 1
#endif
/* variant -> tile shape (RM m-tiles x NT n-tiles per warp) and prefetch depth (bf16 groups are 4x larger) */
template <int ENC>
cudaError_t launch_v(int v, const Launch &a, int64_t rows, int64_t cols, cudaStream_t st) {
    constexpr int W = ENC == DF_W_BF16 ? 2 : 1;
    switch (v) {
    case 1: return launch_ks<ENC, 1, 1, DF_T1_PF>(a, rows, cols, st); /* 16 rows x 2 tokens */
    case 2: return launch_ks<ENC, 2, 3, 2 / W>(a, rows, cols, st);  /* 32 x 8 */
    case 4: return launch_ks<ENC, 1, 3, 3 / W>(a, rows, cols, st);  /* 16 x 8 */
    default: return launch_ks<ENC, 2 / W, 1, 1>(a, rows, cols, st); /* 32 x 2 */
    }
}

/* The launch of a (one weight, or a group whose T is its most tokens) with the variant asked for, or 0: by tokens
 * (1 up to 2, 4 up to 8, else 2; every variant gives the same bits). */
cudaError_t launch_enc(df_wtype type, int asked, const Launch &a, int64_t rows, int64_t cols, cudaStream_t st) {
    const int v = asked ? asked : a.T <= 2 ? 1 : a.T <= 8 ? 4 : 2;
    return type == DF_W_BF16 ? launch_v<DF_W_BF16>(v, a, rows, cols, st) : launch_v<DF_W_MXFP4>(v, a, rows, cols, st);
}
} // namespace

void cu_set_mma_ks(int n) { g_ks_max = n == 1 || n == 2 || n == 4 || n == 8 ? n : 2; }

cudaError_t cu_mma_launch(df_wtype type, const void *data, const void *scale, int64_t rows, int64_t cols,
                          const float *x, int T, float *y, int variant, cudaStream_t st) {
    if (cols % 32 != 0 || (type != DF_W_MXFP4 && type != DF_W_BF16) || rows * (cols / 32) > (int64_t)UINT32_MAX)
        return cudaErrorInvalidValue;
    const uint8_t *d = static_cast<const uint8_t *>(data), *s = static_cast<const uint8_t *>(scale);
    const int tc = T < TC ? T : TC;
    cudaError_t e = xs_reserve((size_t)tc * (size_t)cols * 6, st);
    if (e != cudaSuccess) return e;
    for (int t0 = 0; t0 < T; t0 += TC) {
        const int n = T - t0 < TC ? T - t0 : TC;
        const int64_t threads = (int64_t)n * (cols / 32) * 8;
        cu_launch(split_kernel, (unsigned)((threads + 255) / 256), 256, 0, st, x + (int64_t)t0 * cols, n, cols, g_xs,
                  SplitAct{nullptr, 0, 0.0f, 0.0f});
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        const Launch a = {d, s, reinterpret_cast<const uint4 *>(g_xs), y + (int64_t)t0 * rows, n, nullptr, 0, nullptr};
        e = launch_enc(type, variant, a, rows, cols, st);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cu_mma_group_launch(df_wtype type, int64_t rows, int64_t cols, int n, const cu_mma_item *items,
                                cudaStream_t st, int act, float beta, float lb) {
    if (cols % 32 != 0 || (type != DF_W_MXFP4 && type != DF_W_BF16) || rows * (cols / 32) > (int64_t)UINT32_MAX)
        return cudaErrorInvalidValue;
    for (int i = 0; i < n; i++)
        if (items[i].T > TC) return cudaErrorInvalidValue;
    const int64_t ng = cols / 32;
    for (int c0 = 0; c0 < n; c0 += MAXG) {
        const int nc = n - c0 < MAXG ? n - c0 : MAXG;
        /* the distinct inputs of the chunk, each split once into consecutive rows of the scratch */
        SplitGroup sg;
        MmaGroup mg;
        int nx = 0, rows_x = 0, tmax = 0, sx_t = 0;
        for (int j = 0; j < nc; j++) {
            const cu_mma_item &it = items[c0 + j];
            int u = 0;
            while (u < nx && sg.x[u] != it.x) u++;
            if (u == nx) {
                sg.x[nx] = it.x;
                sg.u[nx] = it.u;
                sg.T[nx] = it.T;
                sg.xrow[nx] = rows_x;
                rows_x += it.T;
                if (it.T > sx_t) sx_t = it.T;
                nx++;
            } else if (it.T > sg.T[u] || it.u != sg.u[u]) {
                return cudaErrorInvalidValue; /* one input, two token counts */
            }
            mg.d[j] = static_cast<const uint8_t *>(items[c0 + j].data);
            mg.s[j] = static_cast<const uint8_t *>(items[c0 + j].scale);
            mg.y[j] = items[c0 + j].y;
            mg.xrow[j] = sg.xrow[u];
            mg.T[j] = it.T;
            if (it.T > tmax) tmax = it.T;
        }
        if (tmax <= 0) continue;
        sg.act = act;
        sg.beta = beta;
        sg.lb = lb;
        cudaError_t e = xs_reserve((size_t)rows_x * (size_t)cols * 6, st);
        if (e != cudaSuccess) return e;
        const int64_t threads = (int64_t)sx_t * ng * 8;
        cu_launch(split_group_kernel, dim3((unsigned)((threads + 255) / 256), (unsigned)nx), 256, 0, st, sg, cols, g_xs);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        const Launch a = {nullptr, nullptr, reinterpret_cast<const uint4 *>(g_xs), nullptr, tmax, &mg, nc, nullptr};
        e = launch_enc(type, cu_get_variant(tmax), a, rows, cols, st);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cu_mma_group_dev_launch(df_wtype type, int64_t rows, int64_t cols, const float *x, int xT, int n, int tmax,
                                    const cu_mma_group *dg, cudaStream_t st, const float *u, int act, float beta,
                                    float lb, const void *xs_in) {
    if (cols % 32 != 0 || (type != DF_W_MXFP4 && type != DF_W_BF16) || rows * (cols / 32) > (int64_t)UINT32_MAX ||
        n <= 0 || n > MAXG || tmax <= 0 || tmax > TC || xT <= 0 || xT > TC)
        return cudaErrorInvalidValue;
    if (xs_in) { /* split already */
        const Launch a = {nullptr, nullptr, static_cast<const uint4 *>(xs_in), nullptr, tmax, nullptr, n, dg};
        return launch_enc(type, cu_get_variant(tmax), a, rows, cols, st);
    }
    cudaError_t e = xs_reserve((size_t)xT * (size_t)cols * 6, st);
    if (e != cudaSuccess) return e;
    const int64_t threads = (int64_t)xT * (cols / 32) * 8;
    cu_launch(split_kernel, (unsigned)((threads + 255) / 256), 256, 0, st, x, xT, cols, g_xs, SplitAct{u, act, beta, lb});
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const Launch a = {nullptr, nullptr, reinterpret_cast<const uint4 *>(g_xs), nullptr, tmax, nullptr, n, dg};
    return launch_enc(type, cu_get_variant(tmax), a, rows, cols, st);
}
