/*
 * config.h — config.json helpers beyond config_parse (native.h), implemented
 * in src/model/config.c.
 */
#ifndef DF_MODEL_CONFIG_H
#define DF_MODEL_CONFIG_H

#include "weights.h"
#include <cjson/cJSON.h>
#include <stddef.h>

/* config_parse on an already parsed cJSON object (the top-level config). */
int config_parse_obj(const cJSON *root, df_config *cfg, const char *path_for_errors, char *err, size_t errlen);
/* The object holding the text model's hyperparameters: root itself, or
 * root["text_config"] for kimi_k25 / kimi_k3. Never NULL for a non-NULL root. */
const cJSON *config_text_obj(const cJSON *root);
/* 1 if layer `l` is a MoE layer (HF DeepseekV3: l >= first_k_dense_replace). */
int config_layer_is_moe(const df_config *cfg, int l);
/* One line describing the architecture, e.g. "kimi_k3: 8 layers (6 KDA, 2 MLA), 1 dense + 7 MoE, 16 experts top-2,
 * latent MoE 64, MLA no RoPE, MLA output gate, SiTU, AttnRes block 4" or "kimi_k2: 61 layers (MLA), 1 dense + 60 MoE,
 * 384 experts top-8". Writes at most cap bytes (NUL included); returns the length written. */
int config_describe(const df_config *c, char *buf, size_t cap);

#endif
