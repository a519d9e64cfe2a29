/*
 * cuda_split.cuh — the activations' split for the tensor-core kernels (cuda_mma.cu): an fp32 x is exactly
 * hi + mid + lo, three bfloat16 parts (hi = x with its low 16 bits cleared, mid the same of x - hi, lo the rest, each
 * step exact), stored in MMA operand order. xs[((tok * ng + gi) * 3 + part) * 16 + 2 s + h] (ng = cols / 32) is the
 * bf16x2 B register h (0: k slots 2t, 2t+1; 1: 2t+8, 2t+9) of k-step s of group gi of token tok, part 0 = hi,
 * 1 = mid, 2 = lo. Item (tok, gi, s), i = (tok * ng + gi) * 8 + s, covers elements gi * 32 + (s / 2) * 8 + (s % 2) * 2
 * + {0, 4, 1, 5} of its token (split_elem).
 */
#pragma once

#include <stdint.h>

/* The offset within its token of the first element of item i's four (then + 4, + 1, + 5); *tg = tok * ng + gi. */
__device__ __forceinline__ int64_t split_elem(int64_t i, int64_t ng, int64_t *tg) {
    const int s = (int)(i & 7);
    *tg = i >> 3;
    return (*tg % ng) * 32 + (s >> 1) * 8 + (s & 1) * 2;
}

/* Item i's parts from its values v = elements {e, e + 4, e + 1, e + 5} (B0 low, B0 high, B1 low, B1 high), e =
 * split_elem(i), into xs. */
__device__ __forceinline__ void split_store(const float (&v)[4], uint32_t *__restrict__ xs, int64_t i) {
    const int s = (int)(i & 7);
    const int64_t tg = i >> 3;
    uint32_t p[3][4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t hb = __float_as_uint(v[k]) & 0xffff0000u;
        const float r = v[k] - __uint_as_float(hb); /* exact */
        const uint32_t mb = __float_as_uint(r) & 0xffff0000u;
        const float l = r - __uint_as_float(mb); /* exact, at most 8 significant bits */
        p[0][k] = hb >> 16;
        p[1][k] = mb >> 16;
        p[2][k] = __float_as_uint(l) >> 16;
    }
    uint32_t *o = xs + tg * 48 + s * 2;
#pragma unroll
    for (int q = 0; q < 3; q++) {
        o[q * 16] = p[q][0] | (p[q][1] << 16);
        o[q * 16 + 1] = p[q][2] | (p[q][3] << 16);
    }
}
