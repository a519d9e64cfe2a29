/* weights.c — sizes and names of the df_weight encodings, and a scalar
 * reference dequantizer (one row to f32) used by convert (int8/bf16 spine
 * modes), tests and any code that needs exact f32 values of a weight.
 * Math: ../shared/notes/formats.md and the comments of weights.h. */
#include "weights_util.h"
#include "util/util.h"

#include <string.h>

static const char *const wtype_names[DF_W__COUNT] = {"f32", "bf16", "f16", "fp8_b128", "int4_g32", "mxfp4", "int8_row"};

const char *df_wtype_name(df_wtype t) { return (t >= 0 && t < DF_W__COUNT) ? wtype_names[t] : "?"; }

int df_wtype_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < DF_W__COUNT; i++)
        if (!strcmp(name, wtype_names[i])) return i;
    return -1;
}

size_t df_weight_data_bytes(df_wtype t, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)cols;
    switch (t) {
    case DF_W_F32: return n * 4;
    case DF_W_BF16: case DF_W_F16: return n * 2;
    case DF_W_FP8_B128: case DF_W_INT8_ROW: return n;
    case DF_W_INT4_G32: return n / 2;   /* cols % 8 == 0 */
    case DF_W_MXFP4: return n / 2;      /* cols % 32 == 0 */
    default: return 0;
    }
}

size_t df_weight_scale_bytes(df_wtype t, int64_t rows, int64_t cols) {
    switch (t) {
    case DF_W_FP8_B128: return (size_t)((rows + 127) / 128) * (size_t)((cols + 127) / 128) * 4;
    case DF_W_INT4_G32: return (size_t)rows * (size_t)(cols / 32) * 2;
    case DF_W_MXFP4: return (size_t)rows * (size_t)(cols / 32);
    case DF_W_INT8_ROW: return (size_t)rows * 4;
    default: return 0;
    }
}

int df_weight_shape_ok(df_wtype t, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return 0;
    if (t == DF_W_INT4_G32 || t == DF_W_MXFP4) return cols % 32 == 0;
    return t >= 0 && t < DF_W__COUNT;
}

void df_weight_dequant_row(const df_weight *w, int64_t r, float *out) {
    const int64_t C = w->cols;
    switch (w->type) {
    case DF_W_F32:
        memcpy(out, (const float *)w->data + r * C, (size_t)C * 4);
        break;
    case DF_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * C;
        for (int64_t j = 0; j < C; j++) out[j] = df_bf16_to_f32(p[j]);
        break;
    }
    case DF_W_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * C;
        for (int64_t j = 0; j < C; j++) out[j] = df_f16_to_f32(p[j]);
        break;
    }
    case DF_W_FP8_B128: {
        const uint8_t *p = (const uint8_t *)w->data + r * C;
        const float *s = (const float *)w->scale + (r / 128) * ((C + 127) / 128);
        for (int64_t j = 0; j < C; j++) out[j] = df_fp8_e4m3_to_f32(p[j]) * s[j / 128];
        break;
    }
    case DF_W_INT4_G32: {
        const uint32_t *p = (const uint32_t *)w->data + r * (C / 8);
        const uint16_t *s = (const uint16_t *)w->scale + r * (C / 32);
        for (int64_t j = 0; j < C; j++) {
            int q = (int)((p[j / 8] >> (4 * (j % 8))) & 15) - 8;
            out[j] = (float)q * df_bf16_to_f32(s[j / 32]);
        }
        break;
    }
    case DF_W_MXFP4: {
        const uint8_t *p = (const uint8_t *)w->data + r * (C / 2);
        const uint8_t *s = (const uint8_t *)w->scale + r * (C / 32);
        for (int64_t j = 0; j < C; j++) {
            uint8_t b = p[j / 2];
            out[j] = df_e2m1_to_f32((j & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15)) * df_e8m0_to_f32(s[j / 32]);
        }
        break;
    }
    case DF_W_INT8_ROW: {
        const int8_t *p = (const int8_t *)w->data + r * C;
        float s = ((const float *)w->scale)[r];
        for (int64_t j = 0; j < C; j++) out[j] = (float)p[j] * s;
        break;
    }
    default:
        memset(out, 0, (size_t)C * 4);
    }
}
