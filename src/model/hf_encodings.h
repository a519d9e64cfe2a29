/*
 * hf_encodings.h — how a linear weight (or a 1-D vector) of a Hugging Face
 * checkpoint maps to a df_weight encoding (weights.h), decided from the
 * tensors present and checked against config.json's quantization_config.
 *
 * Accepted (tensor names relative to a base such as
 * "model.layers.3.mlp.experts.7.gate_proj"; docs/formats.md has the table):
 *   base.weight  F32 | BF16 | F16                               -> f32 | bf16 | f16
 *   base.weight  F8_E4M3 + base.weight_scale_inv F32 [ceil(r/128), ceil(c/128)]
 *                (quant_method "fp8", weight_block_size [128,128])  -> fp8_b128
 *   base.weight_packed I32 [r, c/8] + base.weight_scale BF16 [r, c/32] (+ base.weight_shape [2])
 *                (compressed-tensors "pack-quantized", int 4-bit symmetric, group 32) -> int4_g32
 *   base.weight_packed U8 [r, c/2] + base.weight_scale U8 [r, c/32]
 *                (compressed-tensors "mxfp4-pack-quantized")        -> mxfp4
 *   gpt-oss: P_blocks U8 [E, R, c/32, 16] + P_scales U8 [E, R, c/32] -> mxfp4 per expert
 *                (hf_gptoss_expert; gate/up of gate_up_proj interleaved by rows)
 * Anything else is DF_EUNSUPPORTED naming the tensor, its dtype and its file.
 */
#ifndef DF_MODEL_HF_ENCODINGS_H
#define DF_MODEL_HF_ENCODINGS_H

#include "safetensors.h"
#include "weights.h"
#include <cjson/cJSON.h>

typedef enum { HF_Q_NONE = 0, HF_Q_FP8 = 1, HF_Q_COMPRESSED = 2 } hf_qmethod;

/* What config.json's quantization_config says. */
typedef struct {
    hf_qmethod method;
    int fp8_block_r, fp8_block_c;  /* weight_block_size (fp8); 128,128 */
    int has_int4;                   /* a config group is pack-quantized int4 */
    int int4_group, int4_symmetric;
    int has_mxfp4;                  /* a config group is mxfp4-pack-quantized */
    int mxfp4_group;
    char format[48];                /* top-level compressed-tensors "format" */
} hf_quant;

/* Parse quantization_config from a config.json root (top level, or inside
 * text_config). Unknown quant_method -> DF_EUNSUPPORTED naming it. */
int hf_quant_parse(const cJSON *config_root, hf_quant *q, const char *path, char *err, size_t errlen);

/* A weight as found in the checkpoint: `data_rows` rows of `data_row_bytes`,
 * row i at data + i*data_row_stride (stride == row bytes when contiguous);
 * the scale likewise (scale_rows == 0 when none). */
typedef struct {
    df_wtype type;
    int ndim;                       /* 1 (vector, rows = n, cols = 1) or 2 */
    int64_t rows, cols;
    const uint8_t *data;
    uint64_t data_rows, data_row_bytes, data_row_stride;
    const uint8_t *scale;
    uint64_t scale_rows, scale_row_bytes, scale_row_stride;
    const st_tensor *src;           /* main tensor, for messages */
} hf_weight;

/* Resolve `base` (see above) to an hf_weight. DF_EFORMAT for a missing tensor or
 * inconsistent shapes; DF_EUNSUPPORTED for an encoding we cannot run. */
int hf_weight_get(const st_set *s, const hf_quant *q, const char *base, hf_weight *w, char *err, size_t errlen);
/* One expert of a gpt-oss style fused tensor P_blocks/P_scales (P without the
 * suffix). rows_sel: 0 = all rows, 1 = even rows (gate of gate_up_proj), 2 = odd rows (up). */
int hf_gptoss_expert(const st_set *s, const char *p, int expert, int rows_sel, hf_weight *w, char *err, size_t errlen);

static inline uint64_t hf_data_bytes(const hf_weight *w) { return w->data_rows * w->data_row_bytes; }
static inline uint64_t hf_scale_bytes(const hf_weight *w) { return w->scale_rows * w->scale_row_bytes; }
/* Copy the bytes, unchanged, into contiguous dst arrays (dst_scale may be NULL when there is no scale). */
void hf_weight_copy(const hf_weight *w, void *dst_data, void *dst_scale);
/* A df_weight view when the source is contiguous (returns 0), else -1. */
int hf_weight_view(const hf_weight *w, df_weight *out);

/* The suffixes that belong to a weight base: ".weight", ".weight_scale_inv",
 * ".weight_packed", ".weight_scale", ".weight_shape". Returns the base length
 * of `name` if it ends with one of them, else -1. */
int hf_base_len(const char *name);

#endif
