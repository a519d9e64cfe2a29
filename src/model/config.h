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
 * root["text_config"] for kimi_k25. Never NULL for a non-NULL root. */
const cJSON *config_text_obj(const cJSON *root);
/* 1 if layer `l` is a MoE layer (HF DeepseekV3: l >= first_k_dense_replace). */
int config_layer_is_moe(const df_config *cfg, int l);

#endif
