/* test_kimi_load.c — loading Kimi Linear / Kimi K3 checkpoints:
 *  - config.json parsing for kimi_k3 (text_config) and kimi_linear (Moonshot and transformers 5.17
 *    spellings): mixer pattern from 1-based layer lists or layer_types, every new df_config field,
 *    key aliases, error messages naming file/field/value; DeepSeek parsing unchanged;
 *  - a tiny K3-layout checkpoint written here (language_model. prefix, vision tensors, 3 shards + index,
 *    block_sparse_moe + experts.E.w1/w2/w3 in MXFP4, a weight_packed latent projection, F32 A_log with a
 *    zero tail, F32 dt_bias and [D,1,W] conv, [1,H] AttnRes projections) converted to the native layout:
 *    canonical names, vision skipped, conv flattened, A_log narrowed, latent expert parts, every stored
 *    byte round-trips, spine_build / spine_layer_wrefs cover the new layers;
 *  - a kimi_linear checkpoint with transformers' in-memory / later names (packed conv1d, forget_gate.*,
 *    forget_gate_down/up, beta_proj, output_gate_down/up, q_conv.conv1d) mapped to the same names;
 *  - tests/golden/k3_* and kl_* (when present) convert, open and build. */
#include "test_util.h"
#include "test_model_stwrite.h"

#include "deltafin.h"
#include "model/config.h"
#include "model/native.h"
#include "model/spine.h"
#include "model/weights_util.h"
#include "util/util.h"

#include <dirent.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* ------------------------------------------------------------------ config */

static const char *K3_TEXT =
    "{\"model_type\":\"kimi_linear\",\"architectures\":[\"KimiLinearForCausalLM\"],\"vocab_size\":64,\"hidden_size\":64,"
    "\"intermediate_size\":64,\"moe_intermediate_size\":32,\"num_hidden_layers\":4,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":2,\"num_experts\":4,\"num_experts_per_token\":2,\"num_shared_experts\":2,\"num_expert_group\":1,"
    "\"topk_group\":1,\"topk_method\":\"noaux_tc\",\"moe_renormalize\":true,\"moe_router_activation_func\":\"sigmoid\","
    "\"routed_scaling_factor\":1.0,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,\"q_lora_rank\":16,\"kv_lora_rank\":16,"
    "\"qk_nope_head_dim\":8,\"qk_rope_head_dim\":8,\"v_head_dim\":8,\"mla_use_nope\":true,\"mla_use_output_gate\":true,"
    "\"hidden_act\":\"situ\",\"activation_situ_beta\":4.0,\"activation_situ_linear_beta\":25.0,\"attn_res_block_size\":2,"
    "\"routed_expert_hidden_size\":32,\"latent_moe_use_norm\":true,\"rms_norm_eps\":1e-05,\"max_position_embeddings\":1048576,"
    "\"bos_token_id\":60,\"eos_token_id\":61,\"pad_token_id\":63,\"tie_word_embeddings\":false,"
    "\"linear_attn_config\":{\"full_attn_layers\":[2,4],\"kda_layers\":[1,3],\"num_heads\":2,\"head_dim\":16,"
    "\"short_conv_kernel_size\":4,\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true},"
    "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"mxfp4-pack-quantized\","
    "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":32,"
    "\"symmetric\":true,\"scale_dtype\":\"torch.uint8\"}}},\"ignore\":[\"re:.*self_attn.*\",\"re:.*shared_experts.*\","
    "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\",\"re:.*lm_head.*\",\"re:.*vision_tower.*\",\"re:.*mm_projector.*\"]}}";

static char *k3_config_text(const char *text_config) {
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("KimiK3ForConditionalGeneration"));
    cJSON_AddStringToObject(root, "model_type", "kimi_k3");
    cJSON_AddItemToObject(root, "text_config", cJSON_Parse(text_config));
    cJSON *vc = cJSON_AddObjectToObject(root, "vision_config");
    cJSON_AddNumberToObject(vc, "vt_hidden_size", 8);
    char *t = cJSON_Print(root);
    cJSON_Delete(root);
    return t;
}

/* K3_TEXT with one key replaced (value NULL: removed) */
static char *k3_with(const char *key, const char *value_json) {
    cJSON *tc = cJSON_Parse(K3_TEXT);
    if (strchr(key, '.')) {
        cJSON *lac = cJSON_GetObjectItemCaseSensitive(tc, "linear_attn_config");
        key = strchr(key, '.') + 1;
        cJSON_DeleteItemFromObjectCaseSensitive(lac, key);
        if (value_json) cJSON_AddItemToObject(lac, key, cJSON_Parse(value_json));
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(tc, key);
        if (value_json) cJSON_AddItemToObject(tc, key, cJSON_Parse(value_json));
    }
    char *t = cJSON_PrintUnformatted(tc);
    cJSON_Delete(tc);
    char *r = k3_config_text(t);
    free(t);
    return r;
}

static int parse_err(char *txt, char *err, size_t errlen) {
    df_config c;
    int rc = config_parse(txt, &c, "m/config.json", err, errlen);
    free(txt);
    return rc;
}

static void test_config(void) {
    df_config c;
    char err[512], d[256];
    char *txt = k3_config_text(K3_TEXT);
    int rc = config_parse(txt, &c, "k3/config.json", err, sizeof err);
    free(txt);
    CHECK(rc == 0, "k3 parse: %s", err);
    CHECK(!strcmp(c.model_type, "kimi_k3") && c.arch == DF_ARCH_KIMI_K3, "k3 model_type %s arch %d", c.model_type, c.arch);
    CHECK(c.mixer[0] == DF_MIXER_KDA && c.mixer[1] == DF_MIXER_MLA && c.mixer[2] == DF_MIXER_KDA && c.mixer[3] == DF_MIXER_MLA,
          "k3 mixers (1-based full_attn_layers 2,4)");
    CHECK(c.hidden_size == 64 && c.vocab_size == 64 && c.intermediate_size == 64 && c.moe_intermediate_size == 32 &&
              c.num_hidden_layers == 4 && c.num_attention_heads == 2,
          "k3 sizes");
    CHECK(c.n_routed_experts == 4 && c.num_experts_per_tok == 2 && c.n_shared_experts == 2 && c.n_group == 1 && c.topk_group == 1 &&
              c.norm_topk_prob == 1 && c.routed_scaling_factor == 1.0f && c.first_k_dense_replace == 1,
          "k3 MoE aliases (num_experts, num_experts_per_token, num_shared_experts, num_expert_group, moe_renormalize)");
    CHECK(!strcmp(c.scoring_func, "sigmoid") && !strcmp(c.topk_method, "noaux_tc"), "k3 router");
    CHECK(c.q_lora_rank == 16 && c.kv_lora_rank == 16 && c.qk_nope_head_dim == 8 && c.qk_rope_head_dim == 8 && c.v_head_dim == 8,
          "k3 MLA dims");
    CHECK(c.mla_use_nope == 1 && c.mla_output_gate == 1 && c.mla_norm_eps == 1e-6f, "k3 MLA nope/gate/eps");
    CHECK(c.kda_heads == 2 && c.kda_head_dim == 16 && c.kda_conv == 4 && c.kda_has_lower_bound == 1 && c.kda_lower_bound == -5.0f &&
              c.kda_full_rank_gate == 1 && c.kda_out_gate_act == DF_ACT_SIGMOID,
          "k3 KDA fields");
    CHECK(c.latent_dim == 32 && c.latent_norm == 1, "k3 latent MoE");
    CHECK(c.act == DF_ACT_SITU && c.situ_beta == 4.0f && c.situ_linear_beta == 25.0f, "k3 SiTU");
    CHECK(c.attn_res_block == 2, "k3 AttnRes block");
    CHECK(c.rms_norm_eps == 1e-5f && c.max_position_embeddings == 1048576 && c.bos_token_id == 60 && c.eos_token_id == 61 &&
              c.tie_word_embeddings == 0,
          "k3 misc");
    int n = config_describe(&c, d, sizeof d);
    CHECK(n > 0 && !strcmp(d, "kimi_k3: 4 layers (2 KDA, 2 MLA), 1 dense + 3 MoE, 4 experts top-2, latent MoE 32, MLA no RoPE, "
                               "MLA output gate, SiTU, AttnRes block 2"),
          "describe: %s", d);
    char small[12];
    n = config_describe(&c, small, sizeof small);
    CHECK(n == 11 && !strcmp(small, "kimi_k3: 4 "), "describe truncates: %d \"%s\"", n, small);

    /* defaults and nulls */
    txt = k3_with("activation_situ_linear_beta", "null");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.situ_linear_beta == 0, "linear beta null -> 0");
    free(txt);
    txt = k3_with("activation_situ_beta", NULL);
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.situ_beta == 4.0f, "situ beta default 4");
    free(txt);
    txt = k3_with("attn_res_block_size", "null");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.attn_res_block == 0, "attn_res null -> 0");
    free(txt);
    txt = k3_with("routed_expert_hidden_size", "0");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.latent_dim == 0 && c.latent_norm == 0, "latent 0: no latent MoE");
    free(txt);
    txt = k3_with("linear_attn_config.gate_lower_bound", "null");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.kda_has_lower_bound == 0, "lower bound null");
    free(txt);
    txt = k3_with("linear_attn_config.use_full_rank_gate", NULL);
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.kda_full_rank_gate == 0, "full rank gate default false");
    free(txt);
    txt = k3_with("q_lora_rank", "null");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.q_lora_rank == 0, "q_lora null -> q_proj");
    free(txt);
    /* NoPE: absent / odd / weird rope keys do not matter */
    txt = k3_with("rope_scaling", "{\"type\":\"longrope\"}");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0, "nope ignores rope keys: %s", err);
    free(txt);
    txt = k3_with("hidden_act", "\"silu\"");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.act == DF_ACT_SILU, "silu");
    free(txt);

    /* errors name file, field and value */
    CHECK(parse_err(k3_with("hidden_act", "\"gelu\""), err, sizeof err) == DF_EUNSUPPORTED && strstr(err, "m/config.json") &&
              strstr(err, "hidden_act") && strstr(err, "gelu"),
          "bad act: %s", err);
    CHECK(parse_err(k3_with("linear_attn_config.kda_layers", "[1]"), err, sizeof err) == DF_EFORMAT && strstr(err, "layer 3") &&
              strstr(err, "neither"),
          "layer in neither: %s", err);
    CHECK(parse_err(k3_with("linear_attn_config.kda_layers", "[1,2,3]"), err, sizeof err) == DF_EFORMAT && strstr(err, "layer 2") &&
              strstr(err, "both"),
          "layer in both: %s", err);
    CHECK(parse_err(k3_with("linear_attn_config.kda_layers", "[0,1,3]"), err, sizeof err) == DF_EFORMAT &&
              strstr(err, "kda_layers") && strstr(err, "= 0"),
          "layer 0 (1-based lists): %s", err);
    CHECK(parse_err(k3_with("linear_attn_config.full_attn_layers", "[2,5]"), err, sizeof err) == DF_EFORMAT && strstr(err, "= 5"),
          "layer beyond num_hidden_layers: %s", err);
    CHECK(parse_err(k3_with("num_hidden_layers", "300"), err, sizeof err) == DF_EUNSUPPORTED && strstr(err, "300"),
          "too many layers: %s", err);
    CHECK(parse_err(k3_with("linear_attn_config", NULL), err, sizeof err) == DF_EFORMAT && strstr(err, "linear_attn_config"),
          "no layer pattern: %s", err);
    CHECK(parse_err(k3_with("moe_router_activation_func", "\"softmax\""), err, sizeof err) == DF_EUNSUPPORTED &&
              strstr(err, "moe_router_activation_func") && strstr(err, "softmax"),
          "softmax router: %s", err);
    CHECK(parse_err(k3_with("n_routed_experts", "8"), err, sizeof err) == DF_EFORMAT && strstr(err, "n_routed_experts") &&
              strstr(err, "num_experts") && strstr(err, "disagree"),
          "disagreeing aliases: %s", err);
    CHECK(parse_err(k3_with("n_routed_experts", "4"), err, sizeof err) == 0, "agreeing aliases: %s", err);
    CHECK(parse_err(k3_with("linear_attn_config.num_heads", "\"two\""), err, sizeof err) == DF_EFORMAT &&
              strstr(err, "linear_attn_config.num_heads") && strstr(err, "two"),
          "non-integer: %s", err);
    {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "model_type", "kimi_k3");
        char *t = cJSON_Print(r);
        cJSON_Delete(r);
        CHECK(parse_err(t, err, sizeof err) == DF_EFORMAT && strstr(err, "text_config"), "k3 without text_config: %s", err);
        txt = k3_config_text("{\"model_type\":\"qwen3\"}");
        CHECK(parse_err(txt, err, sizeof err) == DF_EUNSUPPORTED && strstr(err, "qwen3"), "k3 text model_type: %s", err);
    }

    /* kimi_linear, Moonshot's published spellings (flat), no lower bound, low-rank gate */
    const char *kl =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":256,\"hidden_size\":128,\"intermediate_size\":128,\"moe_intermediate_size\":32,"
        "\"num_hidden_layers\":5,\"num_attention_heads\":4,\"num_experts\":16,\"num_experts_per_token\":4,\"num_shared_experts\":1,"
        "\"moe_renormalize\":true,\"moe_router_activation_func\":\"sigmoid\",\"num_expert_group\":1,\"topk_group\":1,"
        "\"first_k_dense_replace\":1,\"q_lora_rank\":null,\"kv_lora_rank\":48,\"qk_nope_head_dim\":32,\"qk_rope_head_dim\":16,"
        "\"v_head_dim\":16,\"mla_use_nope\":true,\"model_max_length\":4096,\"rope_scaling\":null,\"rope_theta\":10000.0,"
        "\"routed_scaling_factor\":2.446,\"rms_norm_eps\":1e-5,\"hidden_act\":\"silu\",\"bos_token_id\":252,\"eos_token_id\":253,"
        "\"linear_attn_config\":{\"full_attn_layers\":[2,5],\"kda_layers\":[1,3,4],\"num_heads\":4,\"head_dim\":16,"
        "\"short_conv_kernel_size\":4}}";
    rc = config_parse(kl, &c, "kl/config.json", err, sizeof err);
    CHECK(rc == 0, "kimi_linear parse: %s", err);
    CHECK(c.arch == DF_ARCH_KIMI_LINEAR && !strcmp(c.model_type, "kimi_linear"), "kl arch");
    CHECK(c.mixer[0] == DF_MIXER_KDA && c.mixer[1] == DF_MIXER_MLA && c.mixer[2] == DF_MIXER_KDA && c.mixer[3] == DF_MIXER_KDA &&
              c.mixer[4] == DF_MIXER_MLA,
          "kl mixers");
    CHECK(c.kda_heads == 4 && c.kda_head_dim == 16 && c.kda_conv == 4 && !c.kda_has_lower_bound && !c.kda_full_rank_gate, "kl KDA");
    CHECK(c.n_routed_experts == 16 && c.num_experts_per_tok == 4 && c.q_lora_rank == 0 && c.max_position_embeddings == 4096 &&
              c.act == DF_ACT_SILU && c.latent_dim == 0 && c.attn_res_block == 0 && c.mla_use_nope && !c.mla_output_gate,
          "kl fields");
    config_describe(&c, d, sizeof d);
    CHECK(!strcmp(d, "kimi_linear: 5 layers (3 KDA, 2 MLA), 1 dense + 4 MoE, 16 experts top-4, MLA no RoPE"), "kl describe: %s", d);

    /* kimi_linear as transformers 5.17 saves it: layer_types, linear_* at top level, no mla_use_nope (never rotates) */
    const char *kl5 =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":64,\"hidden_size\":64,\"intermediate_size\":96,\"moe_intermediate_size\":16,"
        "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_token\":2,\"num_shared_experts\":1,"
        "\"num_expert_group\":1,\"topk_group\":1,\"moe_renormalize\":true,\"model_max_length\":1048576,\"q_lora_rank\":24,"
        "\"kv_lora_rank\":16,\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"head_dim\":8,\"first_k_dense_replace\":1,"
        "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"],"
        "\"linear_head_dim\":16,\"linear_num_heads\":2,\"linear_conv_kernel_dim\":4,\"hidden_act\":\"silu\",\"rms_norm_eps\":1e-05}";
    rc = config_parse(kl5, &c, "kl5/config.json", err, sizeof err);
    CHECK(rc == 0, "kimi_linear 5.17 parse: %s", err);
    CHECK(c.mixer[0] == DF_MIXER_KDA && c.mixer[2] == DF_MIXER_KDA && c.mixer[3] == DF_MIXER_MLA && c.kda_heads == 2 &&
              c.kda_head_dim == 16 && c.kda_conv == 4 && c.mla_use_nope == 1 && c.n_routed_experts == 4 && c.q_lora_rank == 24,
          "kl 5.17 spellings");
    /* later transformers spellings */
    const char *klt =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":64,\"hidden_size\":64,\"intermediate_size\":96,\"moe_intermediate_size\":16,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_local_experts\":4,\"num_experts_per_tok\":2,\"n_shared_experts\":1,"
        "\"kv_lora_rank\":16,\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":0,\"v_head_dim\":16,"
        "\"layer_types\":[\"linear_attention\",\"full_attention\"],\"linear_attn_key_heads\":2,\"linear_attn_key_head_dim\":8,"
        "\"linear_attn_value_heads\":2,\"linear_attn_value_head_dim\":8,\"linear_conv_kernel_dim\":3,"
        "\"forget_gate_lower_bound\":-4.0,\"use_full_rank_output_gate\":true,\"mla_use_nope\":false}";
    rc = config_parse(klt, &c, "klt/config.json", err, sizeof err);
    CHECK(rc == 0 && c.kda_heads == 2 && c.kda_head_dim == 8 && c.kda_conv == 3 && c.kda_has_lower_bound && c.kda_lower_bound == -4.0f &&
              c.kda_full_rank_gate && c.n_routed_experts == 4 && c.mla_use_nope == 1,
          "kl later spellings (rope 0 -> nope): %s", err);
    txt = k3_with("mlp_layer_types", "[\"dense\",\"sparse\",\"sparse\",\"sparse\"]");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.first_k_dense_replace == 1, "mlp_layer_types agrees: %s", err);
    free(txt);
    CHECK(parse_err(k3_with("mlp_layer_types", "[\"dense\",\"dense\",\"sparse\",\"sparse\"]"), err, sizeof err) == DF_EFORMAT &&
              strstr(err, "first_k_dense_replace"),
          "mlp_layer_types disagrees: %s", err);
    txt = k3_with("dense_ffn_hidden", "96");
    CHECK(config_parse(txt, &c, "x", err, sizeof err) == 0 && c.intermediate_size == 96, "dense_ffn_hidden: %s", err);
    free(txt);
    CHECK(parse_err(strdup("{\"model_type\":\"kimi_linear\",\"num_hidden_layers\":2,\"layer_types\":[\"linear_attention\",\"sliding\"]}"),
                    err, sizeof err) == DF_EUNSUPPORTED &&
              strstr(err, "sliding"),
          "layer_types value: %s", err);

    /* DeepSeek parsing: unchanged, new fields at their DeepSeek values */
    const char *k2 = "{\"model_type\":\"kimi_k2\",\"hidden_size\":7168,\"num_hidden_layers\":61,\"n_routed_experts\":384,"
                     "\"first_k_dense_replace\":1,\"n_group\":1,\"topk_group\":1,\"rms_norm_eps\":1e-6,\"rope_scaling\":{\"type\":\"yarn\","
                     "\"factor\":32,\"original_max_position_embeddings\":4096,\"beta_fast\":1,\"beta_slow\":1,\"mscale\":1.0,"
                     "\"mscale_all_dim\":1.0},\"rope_theta\":50000}";
    rc = config_parse(k2, &c, "k2/config.json", err, sizeof err);
    int all_mla = 1;
    for (int l = 0; l < DF_MAX_LAYERS; l++) all_mla &= c.mixer[l] == DF_MIXER_MLA;
    CHECK(rc == 0 && c.arch == DF_ARCH_DEEPSEEK && all_mla && c.act == DF_ACT_SILU && c.latent_dim == 0 && c.attn_res_block == 0 &&
              !c.mla_use_nope && !c.mla_output_gate && c.mla_norm_eps == 1e-6f && c.rope_yarn && c.rope_factor == 32,
          "k2 parse: %s", err);
    config_describe(&c, d, sizeof d);
    CHECK(!strcmp(d, "kimi_k2: 61 layers (MLA), 1 dense + 60 MoE, 384 experts top-8"), "k2 describe: %s", d);
    CHECK(parse_err(strdup("{\"model_type\":\"deepseek_v3\",\"hidden_act\":\"situ\"}"), err, sizeof err) == DF_EUNSUPPORTED,
          "deepseek stays silu-only: %s", err);
    CHECK(parse_err(strdup("{\"model_type\":\"deepseek_v3\",\"num_experts\":8,\"n_routed_experts\":256}"), err, sizeof err) == 0,
          "deepseek does not read kimi aliases: %s", err);
}

/* ------------------------------------------------------------------ synthetic K3 checkpoint */

#define H 64
#define VOC 64
#define NL 4
#define NH 2
#define QL 16
#define KVL 16
#define NOPE 8
#define ROPE 8
#define VD 8
#define INTER 64
#define MI 32
#define NE 4
#define NSH 2
#define LAT 32
#define KH 2
#define KD 16
#define KDIM (KH * KD)
#define CW 4

static void add_bf16(stw *w, const char *name, int64_t r, int64_t c) { stw_add_bf16(w, name, 2, r, c, 0.5f); }
static void add_bf16v(stw *w, const char *name, int64_t n) { stw_add_bf16(w, name, 1, n, 1, 0); }
static float *add_f32(stw *w, const char *name, int nd, const int64_t *sh) {
    float *d = stw_add(w, name, "F32", nd, sh, NULL);
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)sh[i];
    for (size_t i = 0; i < n; i++) d[i] = stw_randf(0.7f);
    return d;
}
static void add_mxfp4(stw *w, const char *base, int64_t r, int64_t c) {
    char nm[256];
    int64_t sh[2] = {r, c / 2}, ssh[2] = {r, c / 32};
    snprintf(nm, sizeof nm, "%s.weight_packed", base);
    uint8_t *q = stw_add(w, nm, "U8", 2, sh, NULL);
    for (int64_t i = 0; i < r * c / 2; i++) q[i] = (uint8_t)stw_rand();
    snprintf(nm, sizeof nm, "%s.weight_scale", base);
    uint8_t *s = stw_add(w, nm, "U8", 2, ssh, NULL);
    for (int64_t i = 0; i < r * c / 32; i++) s[i] = (uint8_t)(120 + stw_rand() % 8);
}

/* Write w's tensors into `shards` files named model-0000k-of-0000n.safetensors + the index. */
static int write_sharded(const char *dir, const stw *w, int shards) {
    char p[700], fn[8][64];
    cJSON *idx = cJSON_CreateObject(), *wm;
    cJSON_AddObjectToObject(idx, "metadata");
    wm = cJSON_AddObjectToObject(idx, "weight_map");
    int per = (w->n + shards - 1) / shards;
    for (int k = 0; k < shards; k++) {
        snprintf(fn[k], sizeof fn[k], "model-%05d-of-%05d.safetensors", k + 1, shards);
        snprintf(p, sizeof p, "%s/%s", dir, fn[k]);
        int a = k * per, b = (k + 1) * per < w->n ? (k + 1) * per : w->n;
        if (stw_write_range(w, a, b, p)) return -1;
        for (int i = a; i < b; i++) cJSON_AddStringToObject(wm, w->e[i].name, fn[k]);
    }
    char *txt = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    int rc = stw_write_text(p, txt);
    free(txt);
    cJSON_Delete(idx);
    return rc;
}

static int build_k3(const char *dir, stw *w) {
    char p[700], nm[256], err[256];
    if (df_mkdir_p(dir, err, sizeof err)) return -1;
    char *cfg = k3_config_text(K3_TEXT);
    snprintf(p, sizeof p, "%s/config.json", dir);
    stw_write_text(p, cfg);
    free(cfg);
    int64_t vsh[4] = {4, 3, 2, 2};
    add_f32(w, "vision_tower.patch_embed.proj.weight", 4, vsh);
    add_bf16(w, "mm_projector.proj.0.weight", 8, 8);
#define T(s) "language_model." s
    add_bf16(w, T("model.embed_tokens.weight"), VOC, H);
    add_bf16v(w, T("model.norm.weight"), H);
    add_bf16v(w, T("model.output_attn_res_norm.weight"), H);
    add_bf16(w, T("model.output_attn_res_proj.weight"), 1, H);
    add_bf16(w, T("lm_head.weight"), VOC, H);
    for (int l = 0; l < NL; l++) {
#define N(s) (snprintf(nm, sizeof nm, "language_model.model.layers.%d.%s", l, s), nm)
        add_bf16v(w, N("input_layernorm.weight"), H);
        add_bf16v(w, N("post_attention_layernorm.weight"), H);
        add_bf16v(w, N("self_attention_res_norm.weight"), H);
        add_bf16(w, N("self_attention_res_proj.weight"), 1, H);
        add_bf16v(w, N("mlp_res_norm.weight"), H);
        add_bf16(w, N("mlp_res_proj.weight"), 1, H);
        if (l % 2 == 0) { /* KDA */
            add_bf16(w, N("self_attn.q_proj.weight"), KDIM, H);
            add_bf16(w, N("self_attn.k_proj.weight"), KDIM, H);
            add_bf16(w, N("self_attn.v_proj.weight"), KDIM, H);
            int64_t csh[3] = {KDIM, 1, CW};
            add_f32(w, N("self_attn.q_conv1d.weight"), 3, csh);
            add_f32(w, N("self_attn.k_conv1d.weight"), 3, csh);
            add_f32(w, N("self_attn.v_conv1d.weight"), 3, csh);
            add_bf16(w, N("self_attn.f_a_proj.weight"), KD, H);
            add_bf16(w, N("self_attn.f_b_proj.weight"), KDIM, KD);
            add_bf16(w, N("self_attn.b_proj.weight"), KH, H);
            int64_t ash[1] = {KD}, dsh[1] = {KDIM};
            float *a = add_f32(w, N("self_attn.A_log"), 1, ash);
            for (int i = KH; i < KD; i++) a[i] = 0; /* live heads first, zero tail (as K3 stores it) */
            add_f32(w, N("self_attn.dt_bias"), 1, dsh);
            add_bf16(w, N("self_attn.g_proj.weight"), KDIM, H);
            add_bf16v(w, N("self_attn.o_norm.weight"), KD);
            add_bf16(w, N("self_attn.o_proj.weight"), H, KDIM);
        } else { /* MLA, NoPE, output gate */
            add_bf16(w, N("self_attn.q_a_proj.weight"), QL, H);
            add_bf16v(w, N("self_attn.q_a_layernorm.weight"), QL);
            add_bf16(w, N("self_attn.q_b_proj.weight"), NH * (NOPE + ROPE), QL);
            add_bf16(w, N("self_attn.kv_a_proj_with_mqa.weight"), KVL + ROPE, H);
            add_bf16v(w, N("self_attn.kv_a_layernorm.weight"), KVL);
            add_bf16(w, N("self_attn.kv_b_proj.weight"), NH * (NOPE + VD), KVL);
            add_bf16(w, N("self_attn.g_proj.weight"), NH * VD, H);
            add_bf16(w, N("self_attn.o_proj.weight"), H, NH * VD);
        }
        if (l == 0) {
            add_bf16(w, N("mlp.gate_proj.weight"), INTER, H);
            add_bf16(w, N("mlp.up_proj.weight"), INTER, H);
            add_bf16(w, N("mlp.down_proj.weight"), H, INTER);
        } else {
            add_bf16(w, N("block_sparse_moe.gate.weight"), NE, H);
            int64_t bsh[1] = {NE};
            add_f32(w, N("block_sparse_moe.gate.e_score_correction_bias"), 1, bsh);
            add_bf16(w, N("block_sparse_moe.shared_experts.gate_proj.weight"), MI * NSH, H);
            add_bf16(w, N("block_sparse_moe.shared_experts.up_proj.weight"), MI * NSH, H);
            add_bf16(w, N("block_sparse_moe.shared_experts.down_proj.weight"), H, MI * NSH);
            add_mxfp4(w, N("block_sparse_moe.routed_expert_down_proj"), LAT, H);  /* a weight_packed outside the experts */
            add_bf16v(w, N("block_sparse_moe.routed_expert_norm.weight"), LAT);
            add_bf16(w, N("block_sparse_moe.routed_expert_up_proj.weight"), H, LAT);
            for (int e = 0; e < NE; e++) {
                char b[200];
                snprintf(b, sizeof b, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w1", l, e);
                add_mxfp4(w, b, MI, LAT);
                snprintf(b, sizeof b, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w2", l, e);
                add_mxfp4(w, b, LAT, MI);
                snprintf(b, sizeof b, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w3", l, e);
                add_mxfp4(w, b, MI, LAT);
            }
        }
#undef N
    }
#undef T
    return write_sharded(dir, w, 3);
}

static void *load_spine(const df_native *n) {
    char *buf;
    size_t len;
    char err[256];
    if (df_read_file(n->spine_path, &buf, &len, err, sizeof err)) return NULL;
    void *a = df_aligned_alloc(64, len);
    memcpy(a, buf, len);
    free(buf);
    return a;
}

/* the native name a checkpoint tensor should get (K3: no prefix, block_sparse_moe -> mlp) */
static void native_name_of(const char *src, char *out, size_t cap) {
    const char *s = strncmp(src, "language_model.", 15) ? src : src + 15;
    const char *b = strstr(s, "block_sparse_moe.");
    if (b) snprintf(out, cap, "%.*smlp.%s", (int)(b - s), s, b + 17);
    else snprintf(out, cap, "%s", s);
    size_t n = strlen(out);
    if (n > 14 && !strcmp(out + n - 14, ".weight_packed")) out[n - 7] = 0;            /* -> .weight */
    else if (n > 13 && !strcmp(out + n - 13, ".weight_scale")) snprintf(out + n - 13, cap - (n - 13), ".weight#scale");
}

/* Every 2-D spine weight of layer l (except the conv, converted at build time) is in spine_layer_wrefs, paired
 * with the df_layer_weights field that views it. */
static void check_wrefs(const df_native *n, df_spine *sp, const void *sb, int l) {
    spine_wref refs[SPINE_MAX_WREFS];
    int k = spine_layer_wrefs(n, l, &sp->layers[l], refs);
    char pre[64];
    snprintf(pre, sizeof pre, "model.layers.%d.", l);
    int want = 0, missing = 0, badptr = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        const native_tensor *t = &n->tensors[i];
        if (strncmp(t->name, pre, strlen(pre)) || t->ndim != 2 || strstr(t->name, "_conv1d.weight")) continue;
        want++;
        int found = 0;
        for (int j = 0; j < k; j++)
            if (refs[j].t == t) found = 1;
        if (!found) { missing++; fprintf(stderr, "  layer %d: %s not in wrefs\n", l, t->name); }
    }
    for (int j = 0; j < k; j++)
        if (!refs[j].w || refs[j].w->data != (const uint8_t *)sb + refs[j].t->offset || refs[j].w->rows != refs[j].t->shape[0]) badptr++;
    CHECK(k == want && !missing && !badptr, "layer %d wrefs: %d listed, %d 2-D weights, %d missing, %d mispaired", l, k, want, missing,
          badptr);
}

static void test_k3_convert(void) {
    char hf[512], out[600], err[1024];
    snprintf(hf, sizeof hf, "%s/hf_k3", tmpdir);
    snprintf(out, sizeof out, "%s/native_k3", tmpdir);
    static stw w;
    w.n = 0;
    CHECK(build_k3(hf, &w) == 0, "write K3 checkpoint");
    int rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == 0, "k3 convert: %s", err);
    df_native *n = NULL;
    if (rc || (rc = native_open(&n, out, err, sizeof err))) {
        CHECK(0, "k3 open: %s", err);
        stw_free(&w);
        return;
    }
    const df_config *g = &n->cfg;
    CHECK(g->arch == DF_ARCH_KIMI_K3 && !strcmp(g->model_type, "kimi_k3") && g->latent_dim == LAT && g->attn_res_block == 2 &&
              g->mixer[0] == DF_MIXER_KDA && g->mixer[1] == DF_MIXER_MLA,
          "manifest config is K3");
    /* names: canonical, no prefix, no vision, no block_sparse_moe */
    int bad = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        const char *nm = n->tensors[i].name;
        if (strstr(nm, "language_model") || strstr(nm, "vision") || strstr(nm, "mm_projector") || strstr(nm, "block_sparse_moe") ||
            strstr(nm, ".experts."))
            bad++, fprintf(stderr, "  unexpected native name %s\n", nm);
    }
    CHECK(bad == 0, "canonical names only (%d bad)", bad);
    CHECK(native_find(n, "model.layers.1.mlp.gate.weight") && native_find(n, "model.layers.1.mlp.gate.e_score_correction_bias") &&
              native_find(n, "model.layers.1.mlp.shared_experts.down_proj.weight") &&
              native_find(n, "model.layers.1.mlp.routed_expert_norm.weight") && native_find(n, "model.layers.0.mlp.gate_proj.weight") &&
              native_find(n, "model.output_attn_res_proj.weight") && native_find(n, "lm_head.weight"),
          "canonical names present");
    const native_tensor *t = native_find(n, "model.layers.0.self_attn.q_conv1d.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == KDIM && t->shape[1] == CW && t->type == DF_W_F32, "conv flattened to [D, W] f32");
    t = native_find(n, "model.layers.2.self_attn.A_log");
    CHECK(t && t->ndim == 1 && t->shape[0] == KD && t->type == DF_W_F32, "A_log stored whole (narrowed at spine build)");
    t = native_find(n, "model.layers.2.self_attn.dt_bias");
    CHECK(t && t->ndim == 1 && t->shape[0] == KDIM, "dt_bias vector");
    t = native_find(n, "model.layers.3.self_attention_res_proj.weight");
    CHECK(t && t->ndim == 1 && t->shape[0] == H && t->type == DF_W_BF16, "res_proj [1,H] -> vector [H] bf16");
    t = native_find(n, "model.layers.1.mlp.routed_expert_down_proj.weight");
    CHECK(t && t->type == DF_W_MXFP4 && t->shape[0] == LAT && t->shape[1] == H && t->scale_bytes == LAT * H / 32,
          "latent down-projection stored as mxfp4 (weight_packed outside the experts)");
    /* expert parts at the latent width */
    CHECK(n->expert_type == DF_W_MXFP4 && n->n_experts == NE && n->n_moe_layers == NL - 1, "experts mxfp4, %d layers", n->n_moe_layers);
    CHECK(n->parts[0].rows == MI && n->parts[0].cols == LAT && n->parts[1].rows == MI && n->parts[1].cols == LAT &&
              n->parts[2].rows == LAT && n->parts[2].cols == MI,
          "expert parts latent: gate [%lld,%lld] down [%lld,%lld]", (long long)n->parts[0].rows, (long long)n->parts[0].cols,
          (long long)n->parts[2].rows, (long long)n->parts[2].cols);
    /* every stored byte round-trips: spine tensors (bf16, f32, mxfp4) */
    void *sb = load_spine(n);
    int mism = 0, checked = 0;
    for (int i = 0; i < w.n; i++) {
        const stw_entry *e = &w.e[i];
        if (strncmp(e->name, "language_model.", 15) || strstr(e->name, ".experts.")) continue;
        char nm[300];
        native_name_of(e->name, nm, sizeof nm);
        char *hash = strchr(nm, '#');
        int scale = hash != NULL;
        if (hash) *hash = 0;
        t = native_find(n, nm);
        if (!t) { mism++; fprintf(stderr, "  %s -> %s missing\n", e->name, nm); continue; }
        uint64_t off = scale ? t->scale_offset : t->offset, bytes = scale ? t->scale_bytes : t->bytes;
        if (bytes != e->nbytes || memcmp((uint8_t *)sb + off, e->data, bytes)) { mism++; fprintf(stderr, "  %s bytes differ\n", nm); }
        checked++;
    }
    CHECK(mism == 0 && checked > 60, "spine bytes round-trip exactly (%d tensors, %d mismatches)", checked, mism);
    /* experts: extent bytes == source w1 (gate), w3 (up), w2 (down) */
    uint8_t *buf = df_aligned_alloc(4096, native_extent_buf_bytes(n, 1));
    int emism = 0;
    for (int l = 1; l < NL; l++)
        for (int e = 0; e < NE; e++) {
            if (native_read_expert(n, l, e, buf, err, sizeof err)) { emism++; continue; }
            df_expert v;
            native_expert_views(n, buf, &v);
            const df_weight *pw[3] = {&v.gate, &v.up, &v.down};
            static const char *const wn[3] = {"w1", "w3", "w2"};
            for (int p = 0; p < 3; p++) {
                char nm[256];
                snprintf(nm, sizeof nm, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s.weight_packed", l, e, wn[p]);
                const stw_entry *d = stw_get(&w, nm);
                snprintf(nm, sizeof nm, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s.weight_scale", l, e, wn[p]);
                const stw_entry *s = stw_get(&w, nm);
                if (!d || !s || memcmp(pw[p]->data, d->data, d->nbytes) || memcmp(pw[p]->scale, s->data, s->nbytes) ||
                    pw[p]->type != DF_W_MXFP4 || pw[p]->rows != d->shape[0] || pw[p]->cols != d->shape[1] * 2)
                    emism++;
            }
        }
    df_aligned_free(buf);
    CHECK(emism == 0, "expert extents hold w1/w3/w2 bit for bit at latent shapes (%d mismatches)", emism);
    CHECK(native_verify(n, NULL, NULL, err, sizeof err) == 0, "k3 verify: %s", err);

    /* spine */
    df_spine sp;
    rc = spine_build(n, sb, &sp, err, sizeof err);
    CHECK(rc == 0, "k3 spine_build: %s", err);
    if (!rc) {
        df_layer_weights *L0 = &sp.layers[0], *L1 = &sp.layers[1], *L2 = &sp.layers[2];
        CHECK(L0->mixer == DF_MIXER_KDA && L1->mixer == DF_MIXER_MLA && L2->mixer == DF_MIXER_KDA && sp.layers[3].mixer == DF_MIXER_MLA,
              "layer mixers");
        const stw_entry *cq = stw_get(&w, "language_model.model.layers.2.self_attn.k_conv1d.weight");
        CHECK(L2->conv_k && cq && !memcmp(L2->conv_k, cq->data, cq->nbytes), "conv_k f32 [D, W] equals the source [D,1,W]");
        const stw_entry *al = stw_get(&w, "language_model.model.layers.2.self_attn.A_log");
        CHECK(L2->A_log && al && L2->A_log[0] == ((float *)al->data)[0] && L2->A_log[1] == ((float *)al->data)[1] &&
                  L2->A_log[0] != 0 && L2->A_log[1] != 0,
              "A_log narrowed to the first kda_heads entries");
        const stw_entry *db = stw_get(&w, "language_model.model.layers.0.self_attn.dt_bias");
        CHECK(L0->dt_bias && !memcmp(L0->dt_bias, db->data, db->nbytes), "dt_bias f32");
        CHECK(L0->kda_q.rows == KDIM && L0->kda_q.cols == H && L0->f_a.rows == KD && L0->f_b.rows == KDIM && L0->f_b.cols == KD &&
                  L0->beta.rows == KH && L0->g.rows == KDIM && L0->g.cols == H && !L0->g_a.data && L0->o.rows == H &&
                  L0->o.cols == KDIM && L0->o_norm && !L0->q_a.data && !L0->kv_a.data,
              "KDA views");
        CHECK(L1->attn_gate.rows == NH * VD && L1->attn_gate.cols == H && L1->attn_gate.data && L1->q_a.data && L1->kv_b.data &&
                  !L1->kda_q.data && !L1->conv_q,
              "MLA views with the output gate");
        const stw_entry *rp = stw_get(&w, "language_model.model.layers.1.mlp_res_proj.weight");
        int same = L1->mlp_res_proj != NULL;
        for (int i = 0; same && i < H; i++) same = L1->mlp_res_proj[i] == df_bf16_to_f32(((uint16_t *)rp->data)[i]);
        CHECK(same && L0->attn_res_norm && L0->attn_res_proj && L0->mlp_res_norm && sp.out_res_norm && sp.out_res_proj,
              "AttnRes vectors (bf16 values exact)");
        CHECK(L1->is_moe && L1->lat_down.type == DF_W_MXFP4 && L1->lat_down.rows == LAT && L1->lat_down.cols == H && L1->lat_down.scale &&
                  L1->lat_up.type == DF_W_BF16 && L1->lat_up.rows == H && L1->lat_up.cols == LAT && L1->lat_norm &&
                  L1->gate.rows == MI * NSH && L1->down.cols == MI * NSH && L1->router.rows == NE && L1->router_bias,
              "latent MoE + shared experts (width moe_inter * n_shared)");
        CHECK(!L0->is_moe && L0->gate.rows == INTER && !L0->lat_down.data, "dense layer 0");
        for (int l = 0; l < NL; l++) check_wrefs(n, &sp, sb, l);
        spine_free(&sp);
        CHECK(sp.layers == NULL && sp.final_norm == NULL, "spine_free");
    }
    /* spine modes keep the conv (not a linear) in its source type; the latent mxfp4 projection is kept too */
    df_convert_opts o;
    df_convert_opts_default(&o);
    char out2[700];
    for (int m = 1; m <= 2; m++) {
        o.spine = m == 1 ? DF_SPINE_BF16 : DF_SPINE_INT8;
        snprintf(out2, sizeof out2, "%s_%d", out, m);
        rc = df_convert(hf, out2, &o, err, sizeof err);
        df_native *n2;
        CHECK(rc == 0 && native_open(&n2, out2, err, sizeof err) == 0, "k3 spine mode %d: %s", m, err);
        if (rc == 0) {
            const native_tensor *c = native_find(n2, "model.layers.0.self_attn.v_conv1d.weight");
            const native_tensor *q = native_find(n2, "model.layers.0.self_attn.q_proj.weight");
            CHECK(c && c->type == DF_W_F32 && q && q->type == (m == 1 ? DF_W_BF16 : DF_W_INT8_ROW), "spine mode %d: conv kept f32", m);
            void *sb2 = load_spine(n2);
            df_spine sp2;
            CHECK(spine_build(n2, sb2, &sp2, err, sizeof err) == 0, "spine mode %d builds: %s", m, err);
            spine_free(&sp2);
            df_aligned_free(sb2);
            native_close(n2);
        }
    }
    /* the manifest names the architecture */
    char p[700], *man = NULL;
    snprintf(p, sizeof p, "%s/manifest.json", out);
    df_read_file(p, &man, NULL, err, sizeof err);
    cJSON *mj = man ? cJSON_Parse(man) : NULL;
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(mj, "architecture");
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(ar, "family"), *mix = cJSON_GetObjectItemCaseSensitive(ar, "mixers");
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mj, "experts"), "latent_dim");
    CHECK(cJSON_IsString(fam) && !strcmp(fam->valuestring, "kimi_k3") && cJSON_IsString(mix) && !strcmp(mix->valuestring, "KMKM") &&
              cJSON_IsNumber(ld) && ld->valueint == LAT,
          "manifest architecture / experts.latent_dim");
    cJSON_Delete(mj);
    free(man);
    df_aligned_free(sb);
    native_close(n);
    stw_free(&w);
}

/* ------------------------------------------------------------------ kimi_linear, transformers' names */

static void test_kl_transformers_names(void) {
    char hf[512], out[600], err[1024], nm[256], p[700];
    snprintf(hf, sizeof hf, "%s/hf_klt", tmpdir);
    snprintf(out, sizeof out, "%s/native_klt", tmpdir);
    df_mkdir_p(hf, err, sizeof err);
    const char *cfg =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":64,\"hidden_size\":64,\"intermediate_size\":64,\"moe_intermediate_size\":32,"
        "\"num_hidden_layers\":3,\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_token\":2,\"num_shared_experts\":1,"
        "\"num_expert_group\":1,\"topk_group\":1,\"moe_renormalize\":true,\"first_k_dense_replace\":1,\"q_lora_rank\":null,"
        "\"kv_lora_rank\":16,\"qk_nope_head_dim\":8,\"qk_rope_head_dim\":8,\"v_head_dim\":8,\"model_max_length\":4096,"
        "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"full_attention\"],\"linear_num_heads\":2,\"linear_head_dim\":16,"
        "\"linear_conv_kernel_dim\":4,\"hidden_act\":\"silu\",\"rms_norm_eps\":1e-05,\"bos_token_id\":1,\"eos_token_id\":2}";
    snprintf(p, sizeof p, "%s/config.json", hf);
    stw_write_text(p, cfg);
    static stw w;
    w.n = 0;
    add_bf16(&w, "model.embed_tokens.weight", VOC, H);
    add_bf16v(&w, "model.norm.weight", H);
    add_bf16(&w, "lm_head.weight", VOC, H);
    for (int l = 0; l < 3; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        add_bf16v(&w, N("input_layernorm.weight"), H);
        add_bf16v(&w, N("post_attention_layernorm.weight"), H);
        if (l == 0) { /* transformers 5.17 in-memory names: packed conv, forget_gate.* */
            add_bf16(&w, N("self_attn.q_proj.weight"), KDIM, H);
            add_bf16(&w, N("self_attn.k_proj.weight"), KDIM, H);
            add_bf16(&w, N("self_attn.v_proj.weight"), KDIM, H);
            int64_t csh[3] = {3 * KDIM, 1, CW}, ash[4] = {1, 1, KH, 1}, dsh[2] = {KH, KD};
            add_f32(&w, N("self_attn.conv1d.weight"), 3, csh);
            add_f32(&w, N("self_attn.forget_gate.A_log"), 4, ash);
            add_f32(&w, N("self_attn.forget_gate.dt_bias"), 2, dsh);
            add_bf16(&w, N("self_attn.forget_gate.f_a_proj.weight"), KD, H);
            add_bf16(&w, N("self_attn.forget_gate.f_b_proj.weight"), KDIM, KD);
            add_bf16(&w, N("self_attn.b_proj.weight"), KH, H);
            add_bf16(&w, N("self_attn.g_a_proj.weight"), KD, H);
            add_bf16(&w, N("self_attn.g_b_proj.weight"), KDIM, KD);
            add_bf16v(&w, N("self_attn.o_norm.weight"), KD);
            add_bf16(&w, N("self_attn.o_proj.weight"), H, KDIM);
        } else if (l == 1) { /* later transformers names */
            add_bf16(&w, N("self_attn.q_proj.weight"), KDIM, H);
            add_bf16(&w, N("self_attn.k_proj.weight"), KDIM, H);
            add_bf16(&w, N("self_attn.v_proj.weight"), KDIM, H);
            int64_t csh[3] = {KDIM, 1, CW}, ash[2] = {KH, 1}, dsh[2] = {KH, KD};
            add_f32(&w, N("self_attn.q_conv.conv1d.weight"), 3, csh);
            add_f32(&w, N("self_attn.k_conv.conv1d.weight"), 3, csh);
            add_f32(&w, N("self_attn.v_conv.conv1d.weight"), 3, csh);
            add_f32(&w, N("self_attn.A_log"), 2, ash);
            add_f32(&w, N("self_attn.dt_bias"), 2, dsh);
            add_bf16(&w, N("self_attn.forget_gate_down.weight"), KD, H);
            add_bf16(&w, N("self_attn.forget_gate_up.weight"), KDIM, KD);
            add_bf16(&w, N("self_attn.beta_proj.weight"), KH, H);
            add_bf16(&w, N("self_attn.output_gate_down.weight"), KD, H);
            add_bf16(&w, N("self_attn.output_gate_up.weight"), KDIM, KD);
            add_bf16v(&w, N("self_attn.o_norm.weight"), KD);
            add_bf16(&w, N("self_attn.o_proj.weight"), H, KDIM);
        } else {
            add_bf16(&w, N("self_attn.q_proj.weight"), NH * (NOPE + ROPE), H);
            add_bf16(&w, N("self_attn.kv_a_proj_with_mqa.weight"), KVL + ROPE, H);
            add_bf16v(&w, N("self_attn.kv_a_layernorm.weight"), KVL);
            add_bf16(&w, N("self_attn.kv_b_proj.weight"), NH * (NOPE + VD), KVL);
            add_bf16(&w, N("self_attn.o_proj.weight"), H, NH * VD);
        }
        if (l == 0) { /* transformers 5.17 writes the dense MLP under block_sparse_moe too */
            add_bf16(&w, N("block_sparse_moe.gate_proj.weight"), INTER, H);
            add_bf16(&w, N("block_sparse_moe.up_proj.weight"), INTER, H);
            add_bf16(&w, N("block_sparse_moe.down_proj.weight"), H, INTER);
        } else {
            add_bf16(&w, N("mlp.gate.weight"), NE, H);
            int64_t bsh[1] = {NE};
            add_f32(&w, N("mlp.gate.e_score_correction_bias"), 1, bsh);
            add_bf16(&w, N("mlp.shared_experts.gate_proj.weight"), MI, H);
            add_bf16(&w, N("mlp.shared_experts.up_proj.weight"), MI, H);
            add_bf16(&w, N("mlp.shared_experts.down_proj.weight"), H, MI);
            for (int e = 0; e < NE; e++) {
                char b[200];
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                add_bf16(&w, b, MI, H);
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                add_bf16(&w, b, MI, H);
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
                add_bf16(&w, b, H, MI);
            }
        }
#undef N
    }
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    stw_write_range(&w, 0, w.n, p);
    int rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == 0, "kimi_linear (transformers names) convert: %s", err);
    df_native *n;
    if (rc || native_open(&n, out, err, sizeof err)) { CHECK(0, "open: %s", err); stw_free(&w); return; }
    void *sb = load_spine(n);
    static const char *const want[] = {
        "model.layers.0.self_attn.q_conv1d.weight", "model.layers.0.self_attn.k_conv1d.weight", "model.layers.0.self_attn.v_conv1d.weight",
        "model.layers.0.self_attn.A_log", "model.layers.0.self_attn.dt_bias", "model.layers.0.self_attn.f_a_proj.weight",
        "model.layers.0.self_attn.f_b_proj.weight", "model.layers.1.self_attn.q_conv1d.weight", "model.layers.1.self_attn.f_a_proj.weight",
        "model.layers.1.self_attn.f_b_proj.weight", "model.layers.1.self_attn.b_proj.weight", "model.layers.1.self_attn.g_a_proj.weight",
        "model.layers.1.self_attn.g_b_proj.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight"};
    int miss = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!native_find(n, want[i])) miss++, fprintf(stderr, "  missing %s\n", want[i]);
    CHECK(miss == 0 && !native_find(n, "model.layers.0.self_attn.conv1d.weight"), "transformers names mapped (%d missing)", miss);
    /* packed conv rows split q | k | v */
    const stw_entry *pk = stw_get(&w, "model.layers.0.self_attn.conv1d.weight");
    static const char *const qkv[3] = {"q", "k", "v"};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        snprintf(nm, sizeof nm, "model.layers.0.self_attn.%s_conv1d.weight", qkv[i]);
        const native_tensor *t = native_find(n, nm);
        ok &= t && t->shape[0] == KDIM && t->shape[1] == CW &&
              !memcmp((uint8_t *)sb + t->offset, (const float *)pk->data + (size_t)i * KDIM * CW, (size_t)KDIM * CW * 4);
    }
    CHECK(ok, "packed conv1d [3D,1,W] split into q/k/v rows");
    const native_tensor *a = native_find(n, "model.layers.0.self_attn.A_log"), *db = native_find(n, "model.layers.1.self_attn.dt_bias");
    CHECK(a && a->ndim == 1 && a->shape[0] == KH && db && db->ndim == 1 && db->shape[0] == KDIM, "A_log [1,1,H,1] and dt_bias [H,K] flattened");
    CHECK(n->parts[0].cols == H && n->parts[2].rows == H && n->expert_type == DF_W_BF16, "no latent: experts at hidden width");
    df_spine sp;
    rc = spine_build(n, sb, &sp, err, sizeof err);
    CHECK(rc == 0, "kimi_linear spine_build: %s", err);
    if (!rc) {
        const stw_entry *al = stw_get(&w, "model.layers.0.self_attn.forget_gate.A_log");
        CHECK(sp.layers[0].A_log[0] == ((float *)al->data)[0] && sp.layers[0].A_log[1] == ((float *)al->data)[1], "A_log values");
        CHECK(sp.layers[1].g_a.rows == KD && sp.layers[1].g_b.rows == KDIM && !sp.layers[1].g.data && !sp.layers[0].attn_res_norm &&
                  !sp.out_res_norm && sp.layers[2].mixer == DF_MIXER_MLA && sp.layers[2].q.data && !sp.layers[2].attn_gate.data,
              "low-rank gate, no AttnRes, MLA q_proj without gate");
        for (int l = 0; l < 3; l++) check_wrefs(n, &sp, sb, l);
        spine_free(&sp);
    }
    df_aligned_free(sb);
    native_close(n);

    /* two source names for one native name, and experts named two ways, are refused */
    stw_entry *e = (stw_entry *)stw_get(&w, "model.layers.1.mlp.shared_experts.gate_proj.weight");
    snprintf(e->name, sizeof e->name, "model.layers.1.block_sparse_moe.gate.weight");   /* collides with mlp.gate.weight */
    stw_write_range(&w, 0, w.n, p);
    rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "both become") && strstr(err, "model.layers.1.mlp.gate.weight"), "name collision: %s", err);
    snprintf(e->name, sizeof e->name, "model.layers.1.mlp.shared_experts.gate_proj.weight");
    e = (stw_entry *)stw_get(&w, "model.layers.2.mlp.experts.3.up_proj.weight");
    snprintf(e->name, sizeof e->name, "model.layers.2.block_sparse_moe.experts.3.w3.weight");
    stw_write_range(&w, 0, w.n, p);
    rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "two ways"), "mixed expert naming: %s", err);
    stw_free(&w);
}

/* ------------------------------------------------------------------ goldens (when present) */

static void test_goldens(void) {
    DIR *d = opendir("tests/golden");
    if (!d) { printf("no tests/golden directory (run from the repo root)\n"); return; }
    struct dirent *de;
    int cnt = 0;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "k3_", 3) && strncmp(de->d_name, "kl_", 3)) continue;
        char hf[600], cfgp[700], out[800], err[1024];
        snprintf(hf, sizeof hf, "tests/golden/%s", de->d_name);
        snprintf(cfgp, sizeof cfgp, "%s/config.json", hf);
        if (!df_path_exists(cfgp)) continue;
        snprintf(out, sizeof out, "%s/golden_%s", tmpdir, de->d_name);
        int rc = df_convert(hf, out, NULL, err, sizeof err);
        CHECK(rc == 0, "golden %s converts: %s", de->d_name, err);
        df_native *n;
        if (rc || (rc = native_open(&n, out, err, sizeof err))) {
            CHECK(rc == 0, "golden %s opens: %s", de->d_name, err);
            continue;
        }
        const df_config *g = &n->cfg;
        CHECK(g->arch == (de->d_name[0] == 'k' && de->d_name[1] == '3' ? DF_ARCH_KIMI_K3 : DF_ARCH_KIMI_LINEAR), "golden %s arch",
              de->d_name);
        int bad = 0;
        for (int i = 0; i < n->n_tensors; i++) {
            const native_tensor *t = &n->tensors[i];
            if (strstr(t->name, "language_model") || strstr(t->name, "vision") || strstr(t->name, "mm_projector") ||
                strstr(t->name, "block_sparse_moe") || (strstr(t->name, "_conv1d") && t->ndim != 2) ||
                (strstr(t->name, "A_log") && (t->ndim != 1 || t->shape[0] < g->kda_heads)))
                bad++, fprintf(stderr, "  %s: %s\n", de->d_name, t->name);
        }
        CHECK(bad == 0, "golden %s: canonical names and shapes (%d bad)", de->d_name, bad);
        int64_t W = g->latent_dim > 0 ? g->latent_dim : g->hidden_size;
        CHECK(n->parts[0].cols == W && n->parts[2].rows == W, "golden %s: expert width %lld", de->d_name, (long long)W);
        void *sb = load_spine(n);
        df_spine sp;
        rc = spine_build(n, sb, &sp, err, sizeof err);
        CHECK(rc == 0, "golden %s spine: %s", de->d_name, err);
        if (!rc) {
            for (int l = 0; l < g->num_hidden_layers; l++) check_wrefs(n, &sp, sb, l);
            spine_free(&sp);
        }
        CHECK(native_verify(n, NULL, NULL, err, sizeof err) == 0, "golden %s verify: %s", de->d_name, err);
        char desc[256];
        config_describe(g, desc, sizeof desc);
        printf("  %s: %s\n", de->d_name, desc);
        df_aligned_free(sb);
        native_close(n);
        cnt++;
    }
    closedir(d);
    printf("kimi golden checkpoints converted: %d\n", cnt);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_kimi_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_config();
    test_k3_convert();
    test_kl_transformers_names();
    test_goldens();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (getenv("DF_KEEP_TMP")) printf("kept %s\n", tmpdir);
    else if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
