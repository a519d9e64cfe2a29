/* config.c — config.json -> df_config for the DeepSeek-V3 family
 * (model_type deepseek_v3, kimi_k2, and kimi_k25 whose text model sits under
 * "text_config"). Defaults are those of transformers' DeepseekV3Config when a
 * key is absent. RoPE parameters come from "rope_scaling" (published
 * checkpoints) or "rope_parameters" (transformers v5, which may also carry
 * rope_theta). */
#include "config.h"
#include "native.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

const cJSON *config_text_obj(const cJSON *root) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    return cJSON_IsObject(tc) ? tc : root;
}

int config_layer_is_moe(const df_config *cfg, int l) {
    return cfg->n_routed_experts > 0 && l >= cfg->first_k_dense_replace && l < cfg->num_hidden_layers;
}

/* Reads an integer key; absent or null -> dflt; non-integer -> error. */
static int get_int(const cJSON *o, const char *key, int dflt, int *out, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) v = cJSON_GetArrayItem(v, 0); /* eos_token_id: [a, b] */
    if (cJSON_IsBool(v)) { *out = cJSON_IsTrue(v); return 0; }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 2147483647.0)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be an integer", path, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_num(const cJSON *o, const char *key, double dflt, double *out, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    if (!cJSON_IsNumber(v)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a number", path, key);
    *out = v->valuedouble;
    return 0;
}

static int get_str(const cJSON *o, const char *key, const char *dflt, char *out, size_t cap, const char *path,
                   char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { snprintf(out, cap, "%s", dflt); return 0; }
    if (!cJSON_IsString(v)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a string", path, key);
    if (strlen(v->valuestring) >= cap)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: field \"%s\" value \"%.40s\" is not supported", path, key, v->valuestring);
    snprintf(out, cap, "%s", v->valuestring);
    return 0;
}

#define GI(o, k, d, dst) do { int v_; if ((rc = get_int(o, k, d, &v_, path, err, errlen))) return rc; dst = v_; } while (0)
#define GN(o, k, d, dst) do { double v_; if ((rc = get_num(o, k, d, &v_, path, err, errlen))) return rc; dst = v_; } while (0)

int config_parse_obj(const cJSON *root, df_config *c, const char *path, char *err, size_t errlen) {
    int rc;
    if (!path) path = "config.json";
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: not a JSON object", path);

    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"model_type\" missing (expected deepseek_v3, kimi_k2 or kimi_k25)", path);
    const char *mts = mt->valuestring;
    if (strcmp(mts, "deepseek_v3") && strcmp(mts, "kimi_k2") && strcmp(mts, "kimi_k25"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                           "%s: model_type \"%s\" is not supported (deltafin runs deepseek_v3, kimi_k2, kimi_k25)", path, mts);
    snprintf(c->model_type, sizeof c->model_type, "%s", mts);
    const cJSON *o = root;
    if (!strcmp(mts, "kimi_k25")) {
        o = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!cJSON_IsObject(o))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: model_type kimi_k25 needs a \"text_config\" object", path);
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
        if (cJSON_IsString(tmt) && strcmp(tmt->valuestring, "deepseek_v3") && strcmp(tmt->valuestring, "kimi_k2"))
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: text_config.model_type \"%s\" is not supported", path,
                               tmt->valuestring);
    }

    /* transformers DeepseekV3Config defaults */
    GI(o, "vocab_size", 129280, c->vocab_size);
    GI(o, "hidden_size", 7168, c->hidden_size);
    GI(o, "intermediate_size", 18432, c->intermediate_size);
    GI(o, "moe_intermediate_size", 2048, c->moe_intermediate_size);
    GI(o, "num_hidden_layers", 61, c->num_hidden_layers);
    GI(o, "num_attention_heads", 128, c->num_attention_heads);
    GI(o, "n_routed_experts", 256, c->n_routed_experts);
    GI(o, "n_shared_experts", 1, c->n_shared_experts);
    GI(o, "num_experts_per_tok", 8, c->num_experts_per_tok);
    GI(o, "n_group", 8, c->n_group);
    GI(o, "topk_group", 4, c->topk_group);
    GI(o, "first_k_dense_replace", 3, c->first_k_dense_replace);
    GI(o, "moe_layer_freq", 1, c->moe_layer_freq);
    GI(o, "norm_topk_prob", 1, c->norm_topk_prob);
    double d;
    GN(o, "routed_scaling_factor", 2.5, d); c->routed_scaling_factor = (float)d;
    GI(o, "q_lora_rank", 0, c->q_lora_rank);                    /* null -> plain q_proj */
    {   /* absent (not null) means the default 1536 */
        if (!cJSON_GetObjectItemCaseSensitive(o, "q_lora_rank")) c->q_lora_rank = 1536;
    }
    GI(o, "kv_lora_rank", 512, c->kv_lora_rank);
    GI(o, "qk_nope_head_dim", 128, c->qk_nope_head_dim);
    GI(o, "qk_rope_head_dim", 64, c->qk_rope_head_dim);
    GI(o, "v_head_dim", 128, c->v_head_dim);
    GN(o, "rms_norm_eps", 1e-6, d); c->rms_norm_eps = (float)d;
    GI(o, "max_position_embeddings", 4096, c->max_position_embeddings);
    GI(o, "bos_token_id", 0, c->bos_token_id);
    GI(o, "eos_token_id", 1, c->eos_token_id);
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "bos_token_id"))) c->bos_token_id = -1;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "eos_token_id"))) c->eos_token_id = -1;
    GI(o, "tie_word_embeddings", 0, c->tie_word_embeddings);
    if ((rc = get_str(o, "scoring_func", "sigmoid", c->scoring_func, sizeof c->scoring_func, path, err, errlen))) return rc;
    if ((rc = get_str(o, "topk_method", "noaux_tc", c->topk_method, sizeof c->topk_method, path, err, errlen))) return rc;
    if (strcmp(c->scoring_func, "sigmoid"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: scoring_func \"%s\" is not supported (only \"sigmoid\")", path,
                           c->scoring_func);
    if (strcmp(c->topk_method, "noaux_tc"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported (only \"noaux_tc\")", path,
                           c->topk_method);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (only \"silu\")", path,
                           act->valuestring);
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(o, "attention_bias");
    if (cJSON_IsTrue(ab))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: attention_bias true is not supported", path);

    /* RoPE: rope_parameters (v5) wins over rope_scaling; rope_theta at top level or inside. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (!cJSON_IsObject(rp)) rp = NULL;
    GN(o, "rope_theta", 10000.0, c->rope_theta);
    c->rope_original_max_pos = c->max_position_embeddings;
    c->rope_factor = 1.0;
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    c->rope_truncate = 1;
    if (rp) {
        if (cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) GN(rp, "rope_theta", 10000.0, c->rope_theta);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rp, "type");
        const char *tys = cJSON_IsString(ty) ? ty->valuestring : "default";
        if (!strcmp(tys, "yarn")) {
            c->rope_yarn = 1;
            GN(rp, "factor", 1.0, c->rope_factor);
            GI(rp, "original_max_position_embeddings", c->max_position_embeddings, c->rope_original_max_pos);
            c->rope_has_original_max = cJSON_GetObjectItemCaseSensitive(rp, "original_max_position_embeddings") != NULL;
            GN(rp, "beta_fast", 32.0, c->rope_beta_fast);
            GN(rp, "beta_slow", 1.0, c->rope_beta_slow);
            GN(rp, "mscale", 0.0, c->rope_mscale);
            GN(rp, "mscale_all_dim", 0.0, c->rope_mscale_all_dim);
            GN(rp, "attention_factor", 0.0, c->rope_attention_factor);
            GI(rp, "truncate", 1, c->rope_truncate);
        } else if (strcmp(tys, "default")) {
            return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                               "%s: rope type \"%s\" is not supported (only default and yarn)", path, tys);
        }
    }

    /* sanity */
#define POS(f) if (c->f <= 0) return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"%s\" must be > 0 (got %d)", path, #f, c->f)
    POS(vocab_size); POS(hidden_size); POS(num_hidden_layers); POS(num_attention_heads); POS(kv_lora_rank);
    POS(qk_rope_head_dim); POS(v_head_dim); POS(max_position_embeddings);
    if (c->qk_nope_head_dim < 0 || c->q_lora_rank < 0 || c->n_routed_experts < 0 || c->n_shared_experts < 0 ||
        c->first_k_dense_replace < 0)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: negative size field", path);
    if (c->qk_rope_head_dim % 2) return df_set_errc(err, errlen, DF_EFORMAT, "%s: qk_rope_head_dim must be even", path);
    if (c->first_k_dense_replace < c->num_hidden_layers) {
        POS(moe_intermediate_size);
        POS(n_routed_experts);
        POS(num_experts_per_tok);
        if (c->num_experts_per_tok > c->n_routed_experts)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: num_experts_per_tok %d > n_routed_experts %d", path,
                               c->num_experts_per_tok, c->n_routed_experts);
        if (c->n_group <= 0 || c->n_routed_experts % c->n_group || c->topk_group <= 0 || c->topk_group > c->n_group)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: n_group %d / topk_group %d do not divide n_routed_experts %d",
                               path, c->n_group, c->topk_group, c->n_routed_experts);
    }
    if (c->first_k_dense_replace > 0) POS(intermediate_size);
    if (c->moe_layer_freq != 1)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: moe_layer_freq %d is not supported (transformers uses 1)", path,
                           c->moe_layer_freq);
    if (c->rope_yarn && c->rope_factor <= 0)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: rope factor must be > 0", path);
    return DF_OK;
}

int config_parse(const char *json_text, df_config *cfg, const char *path_for_errors, char *err, size_t errlen) {
    const char *path = path_for_errors ? path_for_errors : "config.json";
    cJSON *root = cJSON_Parse(json_text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: invalid JSON near \"%.20s\"", path, at ? at : "?");
    }
    int rc = config_parse_obj(root, cfg, path, err, errlen);
    cJSON_Delete(root);
    return rc;
}
