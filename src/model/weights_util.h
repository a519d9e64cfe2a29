/*
 * weights_util.h — helpers over df_weight (weights.h) implemented in
 * src/model/weights.c: shape validity and a scalar reference dequantizer.
 */
#ifndef DF_MODEL_WEIGHTS_UTIL_H
#define DF_MODEL_WEIGHTS_UTIL_H

#include "weights.h"

/* 1 if (rows, cols) is a valid shape for encoding t (int4/mxfp4: cols % 32 == 0). */
int df_weight_shape_ok(df_wtype t, int64_t rows, int64_t cols);
/* Exact f32 values of row r of w (cols floats into out). Scalar reference:
 * f32/bf16/f16 widen; fp8_b128: e4m3(q) * scale[r/128][c/128]; int4_g32:
 * (nibble-8) * bf16 scale[r][c/32]; mxfp4: e2m1 * 2^(e-127); int8_row: q * scale[r].
 * (Each product is one f32 multiply of exact operands, as the kernels do it.) */
void df_weight_dequant_row(const df_weight *w, int64_t r, float *out);

#endif
