/* config.c — config.json -> df_config for the DeepSeek-V3 family (model_type
 * deepseek_v3, kimi_k2, and kimi_k25 whose text model sits under
 * "text_config"; defaults of transformers' DeepseekV3Config) and for Kimi
 * Linear / Kimi K3 (model_type kimi_linear, and kimi_k3 whose text model sits
 * under "text_config"; defaults of transformers' KimiLinearConfig, Moonshot's
 * and transformers' key spellings both accepted). RoPE parameters come from
 * "rope_scaling" (published checkpoints) or "rope_parameters" (transformers
 * v5, which may also carry rope_theta). */
#include "config.h"
#include "native.h"
#include "deltafin.h"
#include "util/util.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const cJSON *config_text_obj(const cJSON *root) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    return cJSON_IsObject(tc) ? tc : root;
}

int config_layer_is_moe(const df_config *cfg, int l) {
    return cfg->n_routed_experts > 0 && l >= cfg->first_k_dense_replace && l < cfg->num_hidden_layers;
}

/* The least value an integer field may hold (key as spelled in the file, aliases included): 1 for the sizes every
 * model needs (and, for deepseek_v3 / kimi_k2 / kimi_k25, where every layer is MLA with RoPE, the MLA sizes), 0 for
 * the other sizes and counts (checked > 0 below where the layers that use them exist), else INT_MIN (token ids, flags,
 * and fields range-checked where they are used). */
static long long int_field_min(const char *key, int arch) {
    static const char *const positive[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "max_position_embeddings", "model_max_length", NULL};
    static const char *const positive_dsv3[] = {"kv_lora_rank", "qk_rope_head_dim", "v_head_dim", NULL};
    static const char *const nonneg[] = {
        "intermediate_size", "dense_ffn_hidden", "moe_intermediate_size", "n_routed_experts", "num_experts",
        "num_local_experts", "n_shared_experts", "num_shared_experts", "num_experts_per_tok", "num_experts_per_token",
        "n_group", "num_expert_group", "topk_group", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "routed_expert_hidden_size", "attn_res_block_size",
        "linear_attn_config.num_heads", "linear_num_heads", "linear_attn_key_heads", "linear_attn_config.head_dim",
        "linear_head_dim", "linear_attn_key_head_dim", "linear_attn_config.short_conv_kernel_size", "linear_conv_kernel_dim",
        "conv_kernel_size", "linear_attn_value_heads", "linear_attn_value_head_dim", NULL};
    for (int i = 0; positive[i]; i++)
        if (!strcmp(key, positive[i])) return 1;
    if (arch == DF_ARCH_DEEPSEEK)
        for (int i = 0; positive_dsv3[i]; i++)
            if (!strcmp(key, positive_dsv3[i])) return 1;
    for (int i = 0; nonneg[i]; i++)
        if (!strcmp(key, nonneg[i])) return 0;
    return INT_MIN;
}

/* A JSON value as the file wrote it, as near as cJSON keeps it (it keeps only the double): an integral number of
 * 2^53 or more in magnitude is printed in full (9223372036854775808, not 9.2233720368547758e+18); the rest as cJSON
 * prints them. Returns buf. */
static const char *value_text(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble) &&
        fabs(v->valuedouble) >= 9007199254740992.0 && fabs(v->valuedouble) < 1e39) {
        snprintf(buf, cap, "%.0f", v->valuedouble);
        return buf;
    }
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, cap, "%.40s", t ? t : "?");
    free(t);
    return buf;
}

/* A config integer v (a JSON number, bool, or [first, ...] as eos_token_id may be) -> *out. Errors (DF_EFORMAT),
 * naming path, key and the value: not an integer ("must be an integer (got X)"), or an integer below the field's
 * least value (int_field_min) or above what an int holds ("X is out of range: expected an integer from LO to
 * 2147483647"). */
static int item_int(const cJSON *v, const char *key, int arch, int *out, const char *path, char *err, size_t errlen) {
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) v = cJSON_GetArrayItem(v, 0); /* eos_token_id: [a, b] */
    if (cJSON_IsBool(v)) { *out = cJSON_IsTrue(v); return 0; }
    const long long lo = int_field_min(key, arch);
    const int integral = cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
    if (!integral || v->valuedouble > (double)INT_MAX || v->valuedouble < (double)lo) {
        char t[48];
        value_text(v, t, sizeof t);
        return integral ? df_set_errc(err, errlen, DF_EFORMAT,
                                      "%s: field \"%s\" = %s is out of range: expected an integer from %lld to %d; "
                                      "fix the value in the file",
                                      path, key, t, lo, INT_MAX)
                        : df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be an integer (got %s)", path, key, t);
    }
    *out = (int)v->valuedouble;
    return 0;
}

/* Reads an integer key; absent or null -> dflt; not an integer, or out of the field's range -> error (item_int). */
static int get_int(const cJSON *o, const char *key, int arch, int dflt, int *out, const char *path, char *err,
                   size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    return item_int(v, key, arch, out, path, err, errlen);
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

#define GI(o, k, d, dst) do { int v_ = 0; if ((rc = get_int(o, k, c->arch, d, &v_, path, err, errlen))) return rc; dst = v_; } while (0)
#define GN(o, k, d, dst) do { double v_ = 0; if ((rc = get_num(o, k, d, &v_, path, err, errlen))) return rc; dst = v_; } while (0)

/* RoPE: rope_parameters (v5) wins over rope_scaling; rope_theta at top level or inside. */
static int parse_rope(const cJSON *o, df_config *c, const char *path, char *err, size_t errlen) {
    int rc;
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

    return DF_OK;
}

/* first_k_dense_replace counts the leading dense layers (the rest are MoE): more than num_hidden_layers is a
 * mistake in the file (equal is a dense model with no MoE layer, as models/kimi-mini-draft). Only a value the file
 * writes is checked: deepseek_v3's default 3 with fewer layers means every layer dense, as in transformers. */
static int check_dense_layers(const cJSON *o, const df_config *c, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "first_k_dense_replace");
    if (!v || cJSON_IsNull(v) || c->first_k_dense_replace <= c->num_hidden_layers) return DF_OK;
    return df_set_errc(err, errlen, DF_EFORMAT,
                       "%s: first_k_dense_replace %d > num_hidden_layers %d: first_k_dense_replace is the number of leading "
                       "dense layers, so it can be at most num_hidden_layers (equal: a dense model with no MoE layer and no "
                       "routed expert tensors); fix the value in the file",
                       path, c->first_k_dense_replace, c->num_hidden_layers);
}

/* ------------------------------------------------------------------ kimi_linear / kimi_k3 */

/* A key may be spelled several ways ("a|b|c"; "linear_attn_config.x" looks inside that object). The first
 * present, non-null spelling is used; two present spellings with different values are an error. */
static const cJSON *lookup(const cJSON *o, const char *name) {
    const char *dot = strchr(name, '.');
    if (!dot) return cJSON_GetObjectItemCaseSensitive(o, name);
    char head[64];
    snprintf(head, sizeof head, "%.*s", (int)(dot - name), name);
    const cJSON *sub = cJSON_GetObjectItemCaseSensitive(o, head);
    return cJSON_IsObject(sub) ? cJSON_GetObjectItemCaseSensitive(sub, dot + 1) : NULL;
}

static int find_alias(const cJSON *o, const char *names, const cJSON **out, char *used, size_t ucap, const char *path, char *err,
                      size_t errlen) {
    *out = NULL;
    used[0] = 0;
    const char *p = names;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char nm[96];
        snprintf(nm, sizeof nm, "%.*s", (int)n, p);
        const cJSON *v = lookup(o, nm);
        if (v && !cJSON_IsNull(v)) {
            if (!*out) {
                *out = v;
                snprintf(used, ucap, "%s", nm);
            } else if (!cJSON_Compare(*out, v, 1)) {
                char *a = cJSON_PrintUnformatted(*out), *b = cJSON_PrintUnformatted(v);
                int rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: fields \"%s\" (%.40s) and \"%s\" (%.40s) name the same setting but disagree",
                                     path, used, a ? a : "?", nm, b ? b : "?");
                free(a);
                free(b);
                return rc;
            }
        }
        p = e ? e + 1 : p + n;
    }
    return DF_OK;
}

static int kint(const cJSON *o, const char *names, int arch, int dflt, int *out, const char *path, char *err, size_t errlen) {
    const cJSON *v;
    char used[96];
    int rc = find_alias(o, names, &v, used, sizeof used, path, err, errlen);
    if (rc) return rc;
    if (!v) { *out = dflt; return 0; }
    return item_int(v, used, arch, out, path, err, errlen);
}

static int knum(const cJSON *o, const char *names, double dflt, double *out, int *present, const char *path, char *err, size_t errlen) {
    const cJSON *v;
    char used[96];
    int rc = find_alias(o, names, &v, used, sizeof used, path, err, errlen);
    if (rc) return rc;
    if (present) *present = v != NULL;
    if (!v) { *out = dflt; return 0; }
    if (!cJSON_IsNumber(v)) {
        char *t = cJSON_PrintUnformatted(v);
        rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a number (got %.40s)", path, used, t ? t : "?");
        free(t);
        return rc;
    }
    *out = v->valuedouble;
    return 0;
}

static int kstr(const cJSON *o, const char *names, const char *dflt, char *out, size_t cap, char *used, size_t ucap, const char *path,
                char *err, size_t errlen) {
    const cJSON *v;
    int rc = find_alias(o, names, &v, used, ucap, path, err, errlen);
    if (rc) return rc;
    if (!v) {
        snprintf(out, cap, "%s", dflt);
        snprintf(used, ucap, "%.*s", (int)strcspn(names, "|"), names);
        return 0;
    }
    if (!cJSON_IsString(v)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a string", path, used);
    if (strlen(v->valuestring) >= cap)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: field \"%s\" value \"%.40s\" is not supported", path, used, v->valuestring);
    snprintf(out, cap, "%s", v->valuestring);
    return 0;
}

/* Layer l (0-based) of `list` (1-based layer numbers) -> mark[l] |= bit. */
static int mark_layers(const cJSON *list, const char *what, int n_layers, unsigned char *mark, int bit, const char *path, char *err,
                       size_t errlen) {
    if (!list || cJSON_IsNull(list)) return DF_OK;
    if (!cJSON_IsArray(list)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a list of layer numbers", path, what);
    int i = 0;
    for (const cJSON *x = list->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 1 || x->valuedouble > n_layers) {
            char *t = cJSON_PrintUnformatted(x);
            int rc = df_set_errc(err, errlen, DF_EFORMAT,
                                 "%s: field \"%s\"[%d] = %.40s is not a layer number (1-based, 1..num_hidden_layers %d)", path, what, i,
                                 t ? t : "?", n_layers);
            free(t);
            return rc;
        }
        mark[(int)x->valuedouble - 1] |= (unsigned char)bit;
    }
    return DF_OK;
}

#define KI(names, d, dst) do { int v_; if ((rc = kint(o, names, c->arch, d, &v_, path, err, errlen))) return rc; dst = v_; } while (0)
#define KN(names, d, dst) do { double v_; if ((rc = knum(o, names, d, &v_, NULL, path, err, errlen))) return rc; dst = v_; } while (0)

/* kimi_linear (top level) and kimi_k3 (text model in text_config). Defaults are transformers' KimiLinearConfig's. */
static int parse_kimi(const cJSON *root, df_config *c, const char *path, char *err, size_t errlen) {
    int rc;
    const char *mts = cJSON_GetObjectItemCaseSensitive(root, "model_type")->valuestring;
    snprintf(c->model_type, sizeof c->model_type, "%s", mts);
    const cJSON *o = root;
    if (!strcmp(mts, "kimi_k3")) {
        c->arch = DF_ARCH_KIMI_K3;
        o = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!cJSON_IsObject(o))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: model_type kimi_k3 needs a \"text_config\" object (the text model)", path);
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
        if (cJSON_IsString(tmt) && strcmp(tmt->valuestring, "kimi_linear") && strcmp(tmt->valuestring, "kimi_k3") &&
            strcmp(tmt->valuestring, "kimi_k3_text"))
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: text_config.model_type \"%s\" is not supported (expected kimi_linear)",
                               path, tmt->valuestring);
    } else {
        c->arch = DF_ARCH_KIMI_LINEAR;
    }

    KI("vocab_size", 163840, c->vocab_size);
    KI("hidden_size", 2304, c->hidden_size);
    KI("intermediate_size", 9216, c->intermediate_size);
    KI("dense_ffn_hidden", c->intermediate_size, c->intermediate_size);   /* transformers: dense MLP width, else intermediate_size */
    KI("moe_intermediate_size", 1024, c->moe_intermediate_size);
    KI("num_hidden_layers", 27, c->num_hidden_layers);
    KI("num_attention_heads", 32, c->num_attention_heads);
    KI("n_routed_experts|num_experts|num_local_experts", 256, c->n_routed_experts);
    KI("n_shared_experts|num_shared_experts", 1, c->n_shared_experts);
    KI("num_experts_per_tok|num_experts_per_token", 8, c->num_experts_per_tok);
    KI("n_group|num_expert_group", 1, c->n_group);
    KI("topk_group", 1, c->topk_group);
    KI("first_k_dense_replace", 1, c->first_k_dense_replace);
    {   /* transformers' mlp_layer_types ["dense", ..., "sparse", ...]: dense layers first, then MoE */
        const cJSON *mlt = cJSON_GetObjectItemCaseSensitive(o, "mlp_layer_types");
        if (cJSON_IsArray(mlt)) {
            int nd = 0, i = 0, seen_sparse = 0;
            for (const cJSON *x = mlt->child; x; x = x->next, i++) {
                const char *v = cJSON_IsString(x) ? x->valuestring : "?";
                if (!strcmp(v, "dense") && !seen_sparse) nd++;
                else if (!strcmp(v, "sparse")) seen_sparse = 1;
                else
                    return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                       "%s: mlp_layer_types[%d] \"%.40s\" is not supported (dense layers first, then sparse)", path, i, v);
            }
            if (!cJSON_GetObjectItemCaseSensitive(o, "first_k_dense_replace")) c->first_k_dense_replace = nd;
            else if (nd != c->first_k_dense_replace)
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: mlp_layer_types has %d dense layers but first_k_dense_replace is %d", path,
                                   nd, c->first_k_dense_replace);
        }
    }
    KI("moe_layer_freq", 1, c->moe_layer_freq);
    KI("norm_topk_prob|moe_renormalize", 1, c->norm_topk_prob);
    double d;
    KN("routed_scaling_factor", 2.446, d); c->routed_scaling_factor = (float)d;
    KI("q_lora_rank", 0, c->q_lora_rank);                       /* absent or null -> plain q_proj */
    KI("kv_lora_rank", 512, c->kv_lora_rank);
    KI("qk_nope_head_dim", 128, c->qk_nope_head_dim);
    KI("qk_rope_head_dim", 64, c->qk_rope_head_dim);
    KI("v_head_dim", 128, c->v_head_dim);
    KN("rms_norm_eps", 1e-5, d); c->rms_norm_eps = (float)d;
    KI("max_position_embeddings|model_max_length", 1048576, c->max_position_embeddings);
    KI("bos_token_id", 163584, c->bos_token_id);
    KI("eos_token_id", 163586, c->eos_token_id);
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "bos_token_id"))) c->bos_token_id = -1;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "eos_token_id"))) c->eos_token_id = -1;
    KI("tie_word_embeddings", 0, c->tie_word_embeddings);
    char used[96];
    if ((rc = kstr(o, "scoring_func|moe_router_activation_func", "sigmoid", c->scoring_func, sizeof c->scoring_func, used, sizeof used,
                   path, err, errlen)))
        return rc;
    if (strcmp(c->scoring_func, "sigmoid"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: %s \"%s\" is not supported (only \"sigmoid\")", path, used, c->scoring_func);
    if ((rc = kstr(o, "topk_method", "noaux_tc", c->topk_method, sizeof c->topk_method, used, sizeof used, path, err, errlen))) return rc;
    if (strcmp(c->topk_method, "noaux_tc"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported (only \"noaux_tc\")", path,
                           c->topk_method);
    char act[16];
    if ((rc = kstr(o, "hidden_act", "silu", act, sizeof act, used, sizeof used, path, err, errlen))) return rc;
    if (!strcmp(act, "silu")) c->act = DF_ACT_SILU;
    else if (!strcmp(act, "situ")) c->act = DF_ACT_SITU;
    else return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu, situ)", path, act);
    KN("activation_situ_beta", 4.0, d); c->situ_beta = (float)d;
    KN("activation_situ_linear_beta", 0.0, d); c->situ_linear_beta = (float)d;
    KI("attn_res_block_size", 0, c->attn_res_block);
    KI("routed_expert_hidden_size", 0, c->latent_dim);
    KI("latent_moe_use_norm", c->latent_dim > 0, c->latent_norm);  /* transformers' K3 always norms the latent sum */
    if (c->latent_dim <= 0) c->latent_norm = 0;
    KI("mla_use_output_gate", 0, c->mla_output_gate);
    /* MLA without RoPE: transformers' kimi_linear never rotates (and writes no mla_use_nope key); Moonshot's
     * configs say mla_use_nope explicitly. qk_rope_head_dim 0 implies it. */
    KI("mla_use_nope", 1, c->mla_use_nope);
    if (c->qk_rope_head_dim == 0) c->mla_use_nope = 1;
    c->kda_out_gate_act = DF_ACT_SIGMOID;
    c->mla_norm_eps = 1e-6f;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "attention_bias")))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: attention_bias true is not supported", path);

    /* KDA hyper-parameters: linear_attn_config (Moonshot) or transformers' top-level spellings */
    KI("linear_attn_config.num_heads|linear_num_heads|linear_attn_key_heads", 32, c->kda_heads);
    KI("linear_attn_config.head_dim|linear_head_dim|linear_attn_key_head_dim", 128, c->kda_head_dim);
    KI("linear_attn_config.short_conv_kernel_size|linear_conv_kernel_dim|conv_kernel_size", 4, c->kda_conv);
    {
        int vh = 0, vd = 0;
        KI("linear_attn_value_heads", c->kda_heads, vh);
        KI("linear_attn_value_head_dim", c->kda_head_dim, vd);
        if (vh != c->kda_heads || vd != c->kda_head_dim)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                               "%s: KDA value heads %d x %d differ from key heads %d x %d (not supported: K = V = head_dim)", path, vh, vd,
                               c->kda_heads, c->kda_head_dim);
    }
    {
        double lb;
        int present;
        if ((rc = knum(o, "linear_attn_config.gate_lower_bound|forget_gate_lower_bound", 0.0, &lb, &present, path, err, errlen))) return rc;
        c->kda_has_lower_bound = present;
        c->kda_lower_bound = present ? (float)lb : 0.0f;
        if (present && !(lb < 0))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: gate_lower_bound %g must be negative (a log-decay bound)", path, lb);
    }
    KI("linear_attn_config.use_full_rank_gate|use_full_rank_output_gate", 0, c->kda_full_rank_gate);

    if (c->num_hidden_layers <= 0)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"num_hidden_layers\" must be > 0 (got %d)", path, c->num_hidden_layers);
    if (c->num_hidden_layers > DF_MAX_LAYERS)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: num_hidden_layers %d is more than deltafin supports (%d)", path,
                           c->num_hidden_layers, DF_MAX_LAYERS);
    /* the mixer of every layer */
    const int NL = c->num_hidden_layers;
    const cJSON *lac = cJSON_GetObjectItemCaseSensitive(o, "linear_attn_config");
    const cJSON *fa = cJSON_IsObject(lac) ? cJSON_GetObjectItemCaseSensitive(lac, "full_attn_layers") : NULL;
    const cJSON *kl = cJSON_IsObject(lac) ? cJSON_GetObjectItemCaseSensitive(lac, "kda_layers") : NULL;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    unsigned char mark[DF_MAX_LAYERS];
    memset(mark, 0, sizeof mark);
    if ((fa && !cJSON_IsNull(fa)) || (kl && !cJSON_IsNull(kl))) {
        if ((rc = mark_layers(fa, "linear_attn_config.full_attn_layers", NL, mark, 1, path, err, errlen))) return rc;
        if ((rc = mark_layers(kl, "linear_attn_config.kda_layers", NL, mark, 2, path, err, errlen))) return rc;
        for (int l = 0; l < NL; l++) {
            if (mark[l] == 3)
                return df_set_errc(err, errlen, DF_EFORMAT,
                                   "%s: layer %d (1-based) is in both linear_attn_config.full_attn_layers and kda_layers", path, l + 1);
            if (mark[l] == 0)
                return df_set_errc(err, errlen, DF_EFORMAT,
                                   "%s: layer %d (1-based) is in neither linear_attn_config.full_attn_layers nor kda_layers", path, l + 1);
            c->mixer[l] = mark[l] == 1 ? DF_MIXER_MLA : DF_MIXER_KDA;
        }
    } else if (cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) != NL)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: layer_types lists %d layers, num_hidden_layers is %d", path,
                               cJSON_GetArraySize(lt), NL);
        int l = 0;
        for (const cJSON *x = lt->child; x; x = x->next, l++) {
            const char *v = cJSON_IsString(x) ? x->valuestring : "?";
            if (!strcmp(v, "full_attention")) c->mixer[l] = DF_MIXER_MLA;
            else if (!strcmp(v, "linear_attention")) c->mixer[l] = DF_MIXER_KDA;
            else
                return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                   "%s: layer_types[%d] \"%.40s\" is not supported (full_attention, linear_attention)", path, l, v);
        }
    } else {
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "%s: %s needs linear_attn_config.full_attn_layers and kda_layers (or layer_types) to know which layers are KDA",
                           path, mts);
    }
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < NL; l++) if (c->mixer[l] == DF_MIXER_KDA) n_kda++; else n_mla++;

    /* RoPE only matters for MLA layers that rotate */
    if (n_mla > 0 && !c->mla_use_nope) {
        if ((rc = parse_rope(o, c, path, err, errlen))) return rc;
    } else {
        c->rope_theta = 10000.0;
        c->rope_original_max_pos = c->max_position_embeddings;
        c->rope_factor = 1.0;
        c->rope_beta_fast = 32.0;
        c->rope_beta_slow = 1.0;
        c->rope_truncate = 1;
    }

    /* sanity */
#define KPOS(f) if (c->f <= 0) return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"%s\" must be > 0 (got %d)", path, #f, c->f)
    KPOS(vocab_size); KPOS(hidden_size); KPOS(num_attention_heads); KPOS(max_position_embeddings);
    /* sizes and counts below 0 were refused as read (item_int names the field and the value) */
    if ((rc = check_dense_layers(o, c, path, err, errlen))) return rc;
    if (n_mla > 0) {
        KPOS(kv_lora_rank); KPOS(v_head_dim);
        if (c->qk_nope_head_dim + c->qk_rope_head_dim <= 0)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: qk_nope_head_dim + qk_rope_head_dim must be > 0", path);
        if (!c->mla_use_nope) {
            KPOS(qk_rope_head_dim);
            if (c->qk_rope_head_dim % 2) return df_set_errc(err, errlen, DF_EFORMAT, "%s: qk_rope_head_dim must be even", path);
            if (c->rope_yarn && c->rope_factor <= 0) return df_set_errc(err, errlen, DF_EFORMAT, "%s: rope factor must be > 0", path);
        }
    }
    if (n_kda > 0) {
        KPOS(kda_heads); KPOS(kda_head_dim); KPOS(kda_conv);
        if (c->kda_conv > 64)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: short_conv_kernel_size %d is not supported (at most 64)", path, c->kda_conv);
    }
    if (c->first_k_dense_replace < c->num_hidden_layers) {
        KPOS(moe_intermediate_size);
        KPOS(n_routed_experts);
        KPOS(num_experts_per_tok);
        if (c->num_experts_per_tok > c->n_routed_experts)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: num_experts_per_tok %d > n_routed_experts %d", path, c->num_experts_per_tok,
                               c->n_routed_experts);
        if (c->n_group <= 0 || c->n_routed_experts % c->n_group || c->topk_group <= 0 || c->topk_group > c->n_group)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: n_group %d / topk_group %d do not divide n_routed_experts %d", path, c->n_group,
                               c->topk_group, c->n_routed_experts);
    }
    if (c->first_k_dense_replace > 0) KPOS(intermediate_size);
    if (c->moe_layer_freq != 1)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: moe_layer_freq %d is not supported (transformers uses 1)", path,
                           c->moe_layer_freq);
    if (c->act == DF_ACT_SITU && !(c->situ_beta > 0))
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: activation_situ_beta %g must be > 0", path, (double)c->situ_beta);
    if (c->situ_linear_beta < 0)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: activation_situ_linear_beta %g must be >= 0", path, (double)c->situ_linear_beta);
#undef KPOS
    return DF_OK;
}
#undef KI
#undef KN

int config_describe(const df_config *c, char *buf, size_t cap) {
    if (!buf || !cap) return 0;
    int n_kda = 0, n_mla = 0, n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers && l < DF_MAX_LAYERS; l++) {
        if (c->mixer[l] == DF_MIXER_KDA) n_kda++; else n_mla++;
        n_moe += config_layer_is_moe(c, l);
    }
    size_t k = 0;
#define ADD(...) do { if (k < cap) { int w_ = snprintf(buf + k, cap - k, __VA_ARGS__); if (w_ > 0) k += (size_t)w_; } } while (0)
    ADD("%s: %d layers", c->model_type[0] ? c->model_type : "?", c->num_hidden_layers);
    if (n_kda) ADD(" (%d KDA, %d MLA)", n_kda, n_mla);
    else ADD(" (MLA)");
    if (n_moe) ADD(", %d dense + %d MoE, %d experts top-%d", c->num_hidden_layers - n_moe, n_moe, c->n_routed_experts,
                   c->num_experts_per_tok);
    if (c->latent_dim > 0) ADD(", latent MoE %d", c->latent_dim);
    if (c->arch != DF_ARCH_DEEPSEEK && n_mla) {
        if (c->mla_use_nope) ADD(", MLA no RoPE");
        if (c->mla_output_gate) ADD(", MLA output gate");
    }
    if (c->act == DF_ACT_SITU) ADD(", SiTU");
    if (c->attn_res_block > 0) ADD(", AttnRes block %d", c->attn_res_block);
#undef ADD
    if (k >= cap) k = cap - 1;
    return (int)k;
}

int config_parse_obj(const cJSON *root, df_config *c, const char *path, char *err, size_t errlen) {
    int rc;
    if (!path) path = "config.json";
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: not a JSON object", path);

    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "%s: field \"model_type\" missing (expected deepseek_v3, kimi_k2, kimi_k25, kimi_linear or kimi_k3)", path);
    const char *mts = mt->valuestring;
    if (!strcmp(mts, "kimi_linear") || !strcmp(mts, "kimi_k3")) return parse_kimi(root, c, path, err, errlen);
    if (strcmp(mts, "deepseek_v3") && strcmp(mts, "kimi_k2") && strcmp(mts, "kimi_k25"))
        return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                           "%s: model_type \"%s\" is not supported (deltafin runs deepseek_v3, kimi_k2, kimi_k25, kimi_linear, kimi_k3)",
                           path, mts);
    snprintf(c->model_type, sizeof c->model_type, "%s", mts);
    c->arch = DF_ARCH_DEEPSEEK;       /* every layer MLA with RoPE, SwiGLU, plain residual (memset: mixer[] = MLA) */
    c->act = DF_ACT_SILU;
    c->kda_out_gate_act = DF_ACT_SIGMOID;
    c->mla_norm_eps = 1e-6f;
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

    if ((rc = parse_rope(o, c, path, err, errlen))) return rc;

    /* sanity */
#define POS(f) if (c->f <= 0) return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"%s\" must be > 0 (got %d)", path, #f, c->f)
    POS(vocab_size); POS(hidden_size); POS(num_hidden_layers); POS(num_attention_heads); POS(kv_lora_rank);
    POS(qk_rope_head_dim); POS(v_head_dim); POS(max_position_embeddings);
    if (c->num_hidden_layers > DF_MAX_LAYERS)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: num_hidden_layers %d is more than deltafin supports (%d)", path,
                           c->num_hidden_layers, DF_MAX_LAYERS);
    /* sizes and counts below 0 were refused as read (item_int names the field and the value) */
    if ((rc = check_dense_layers(o, c, path, err, errlen))) return rc;
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
