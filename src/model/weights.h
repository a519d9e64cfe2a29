/*
 * weights.h — the in-memory contract between model loading (src/model), the
 * expert store (src/store) and the engine/kernels (src/engine, src/kernels).
 *
 * A df_weight is a 2-D linear weight W [rows = out_features, cols = in_features]
 * in one of the checkpoint encodings; kernels compute y = W x with fp32
 * accumulation directly on that encoding (nothing is re-quantized).
 * Math of each encoding: ../shared/notes/formats.md, docs/native-format.md.
 */
#ifndef DF_MODEL_WEIGHTS_H
#define DF_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the CUDA sources (C++) call its functions too */
#endif

typedef enum {
    DF_W_F32 = 0,     /* data: float  [rows, cols]                                         */
    DF_W_BF16 = 1,    /* data: uint16 [rows, cols] bfloat16                                 */
    DF_W_F16 = 2,     /* data: uint16 [rows, cols] IEEE half                                */
    DF_W_FP8_B128 = 3,/* data: uint8  [rows, cols] float8 e4m3fn;
                         scale: float [ceil(rows/128), ceil(cols/128)] (weight_scale_inv: w = q * s) */
    DF_W_INT4_G32 = 4,/* data: int32  [rows, cols/8], nibble j of a word = element 8k+j (LSB first), value = nibble-8;
                         scale: uint16 bf16 [rows, cols/32]  (compressed-tensors pack-quantized, symmetric)   */
    DF_W_MXFP4 = 5,   /* data: uint8  [rows, cols/2] E2M1, low nibble = even element;
                         scale: uint8 E8M0 [rows, cols/32], 2^(e-127)                         */
    DF_W_INT8_ROW = 6,/* data: int8   [rows, cols]; scale: float [rows] (absmax/127). LOSSY mode only */
    DF_W__COUNT
} df_wtype;

typedef struct {
    df_wtype type;
    int64_t rows, cols;
    const void *data;
    const void *scale;   /* NULL for F32/BF16/F16 */
    /* Identity of the weight for device caches (src/kernels/cuda.h): 0 = the host address `data`
     * (valid while the model is open); else DF_DEVKEY(...) set by whoever hands out the view. */
    uint64_t dev_key;
} df_weight;
/* A routed expert's device-cache key: tag = the model's device tag (engine.h df_engine.dev_tag: models open on one
 * device at once never share a key), layer < 256, expert < 2^32, part 0 = gate, 1 = up, 2 = down; bit 63 marks
 * explicit keys (0: the host address is the key). */
#define DF_DEV_TAGS 16
#define DF_DEVKEY(tag, layer, expert, part)                                                                            \
    ((1ull << 63) | ((uint64_t)(tag) << 48) | ((uint64_t)(layer) << 40) | ((uint64_t)(expert) << 8) | (uint64_t)(part))
#define DF_DEVKEY_TAG(key) ((int)(((key) >> 48) & 0x7FFFu))
#define DF_DEVKEY_LAYER(key) ((int)(((key) >> 40) & 0xFFu))

/* Bytes of data / scale arrays of a weight of this type and shape. */
size_t df_weight_data_bytes(df_wtype t, int64_t rows, int64_t cols);
size_t df_weight_scale_bytes(df_wtype t, int64_t rows, int64_t cols);
const char *df_wtype_name(df_wtype t);          /* "f32","bf16","f16","fp8_b128","int4_g32","mxfp4","int8_row" */
int df_wtype_from_name(const char *name);       /* -1 if unknown */

#define DF_MAX_LAYERS 256
enum { DF_ARCH_DEEPSEEK = 0, DF_ARCH_KIMI_LINEAR = 1, DF_ARCH_KIMI_K3 = 2 };
enum { DF_MIXER_MLA = 0, DF_MIXER_KDA = 1 };
enum { DF_ACT_SILU = 0, DF_ACT_SITU = 1, DF_ACT_SIGMOID = 2 };

/* Hyperparameters (config.json, or its text_config for multimodal wrappers). */
typedef struct {
    char model_type[32];          /* deepseek_v3 | kimi_k2 | kimi_k25 (text) */
    int vocab_size;
    int hidden_size;
    int intermediate_size;        /* dense MLP width */
    int moe_intermediate_size;    /* routed / shared expert width */
    int num_hidden_layers;
    int num_attention_heads;
    int n_routed_experts;
    int n_shared_experts;
    int num_experts_per_tok;      /* top-k */
    int n_group, topk_group;
    int first_k_dense_replace;
    int moe_layer_freq;           /* 1 */
    int norm_topk_prob;
    float routed_scaling_factor;
    int q_lora_rank;              /* 0 = plain q_proj */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    double rope_theta;
    int rope_yarn;                /* 1 if rope_scaling/rope_parameters type is yarn */
    double rope_factor;
    int rope_original_max_pos;
    double rope_beta_fast, rope_beta_slow;
    double rope_mscale, rope_mscale_all_dim;
    float rms_norm_eps;
    int max_position_embeddings;
    int bos_token_id, eos_token_id;   /* -1 if absent */
    int tie_word_embeddings;
    char scoring_func[16];        /* "sigmoid" */
    char topk_method[16];         /* "noaux_tc" */
    /* added by the model owner (append-only): */
    double rope_attention_factor; /* yarn "attention_factor" if given, else 0 (absent) */
    int rope_truncate;            /* yarn "truncate" (transformers v5; default 1 = floor/ceil low/high) */
    int rope_has_original_max;    /* 1 if rope params carry original_max_position_embeddings
                                     (transformers then uses factor = max_pos / original_max for mscale) */

    /* ---- the per-layer description (one forward pass for every supported family) ----
     * DeepSeek-V3 / K2: every layer MLA with RoPE, SwiGLU, plain residual, no latent MoE.
     * kimi_linear (Kimi Linear) and kimi_k3 (the text model of Kimi K3): KDA layers mixed with
     * MLA layers (linear_attn_config), MLA without RoPE (mla_use_nope), optional MLA output gate,
     * latent MoE, SiTU activation, block attention residuals (AttnRes).
     * Math: shared/notes/kimi-k3.md; tools/reference/README.md (what the goldens verified). */
    int arch;                     /* DF_ARCH_* */
    unsigned char mixer[DF_MAX_LAYERS]; /* DF_MIXER_MLA or DF_MIXER_KDA for each layer */
    int mla_use_nope;             /* 1: no rotary embedding anywhere in MLA (k_pe used unrotated) */
    int mla_output_gate;          /* 1: MLA output = o_proj(attn * sigmoid(g_proj(x))) */
    int kda_heads, kda_head_dim;  /* linear_attn_config num_heads, head_dim (K = V = head_dim) */
    int kda_conv;                 /* short_conv_kernel_size (causal depthwise conv on q, k, v) */
    int kda_has_lower_bound;      /* gate_lower_bound given: log-decay = lb * sigmoid(exp(A_log) * raw) */
    float kda_lower_bound;        /*   else log-decay = -exp(A_log) * softplus(raw) */
    int kda_full_rank_gate;       /* 1: output gate g_proj [H*K, hidden]; 0: g_a_proj/g_b_proj */
    int kda_out_gate_act;         /* DF_ACT_SIGMOID (Moonshot/fla FusedRMSNormGated) or DF_ACT_SILU */
    int latent_dim;               /* routed_expert_hidden_size: experts run at this width (0 = no latent MoE) */
    int latent_norm;              /* latent_moe_use_norm: routed_expert_norm after the weighted sum */
    int act;                      /* DF_ACT_SILU (SwiGLU) or DF_ACT_SITU, for every MLP (dense, shared, routed) */
    float situ_beta;              /* activation_situ_beta: gate' = beta*tanh(g/beta)*sigmoid(g) */
    float situ_linear_beta;       /* activation_situ_linear_beta: up' = lb*tanh(u/lb); 0 = unset (up' = u) */
    int attn_res_block;           /* attn_res_block_size (0 = plain residual) */
    float mla_norm_eps;           /* eps of q_a_layernorm / kv_a_layernorm (1e-6: built without eps) */
} df_config;

/* One transformer block's resident (spine) weights. Small vectors are f32. */
typedef struct {
    float *attn_norm;             /* [hidden]  input_layernorm */
    float *ffn_norm;              /* [hidden]  post_attention_layernorm */
    /* MLA */
    df_weight q_a;                /* [q_lora, hidden]              (q_lora_rank > 0) */
    float *q_a_norm;              /* [q_lora]                      (q_lora_rank > 0) */
    df_weight q_b;                /* [heads*(nope+rope), q_lora]   (q_lora_rank > 0) */
    df_weight q;                  /* [heads*(nope+rope), hidden]   (q_lora_rank == 0) */
    df_weight kv_a;               /* [kv_lora + rope, hidden]      kv_a_proj_with_mqa */
    float *kv_a_norm;             /* [kv_lora] */
    df_weight kv_b;               /* [heads*(nope+v), kv_lora] */
    df_weight o;                  /* [hidden, heads*v] */
    /* FFN */
    int is_moe;
    df_weight gate, up, down;     /* dense MLP (is_moe == 0) or shared experts (is_moe, n_shared > 0) */
    int has_shared;
    df_weight router;             /* [n_routed, hidden]            mlp.gate.weight */
    float *router_bias;           /* [n_routed] e_score_correction_bias, or NULL */
    /* mixer kind (cfg->mixer[l]) */
    int mixer;                    /* DF_MIXER_MLA | DF_MIXER_KDA */
    df_weight attn_gate;          /* MLA output gate g_proj [heads*v, hidden]  (mla_output_gate) */
    /* KDA (Kimi Delta Attention); D = kda_heads * kda_head_dim, K = kda_head_dim */
    df_weight kda_q, kda_k, kda_v;/* q_proj / k_proj / v_proj [D, hidden] */
    float *conv_q, *conv_k, *conv_v; /* {q,k,v}_conv1d [D, kda_conv] f32 (tap j multiplies input t-(W-1)+j) */
    df_weight f_a, f_b;           /* forget gate: f_a_proj [K, hidden], f_b_proj [D, K] */
    df_weight beta;               /* b_proj [heads, hidden] */
    float *A_log;                 /* [heads] (live entries only) */
    float *dt_bias;               /* [D] */
    df_weight g;                  /* output gate g_proj [D, hidden] (kda_full_rank_gate) */
    df_weight g_a, g_b;           /* or g_a_proj [K, hidden], g_b_proj [D, K] */
    float *o_norm;                /* [K] gated RMSNorm weight (eps rms_norm_eps) */
    /* o_proj [hidden, D] is `o` above */
    /* AttnRes (attn_res_block > 0): [hidden] each */
    float *attn_res_norm, *attn_res_proj, *mlp_res_norm, *mlp_res_proj;
    /* latent MoE (latent_dim > 0) */
    df_weight lat_down;           /* routed_expert_down_proj [latent, hidden] */
    df_weight lat_up;             /* routed_expert_up_proj [hidden, latent] */
    float *lat_norm;              /* routed_expert_norm [latent] (latent_norm), eps rms_norm_eps */
} df_layer_weights;

/* The resident spine. */
typedef struct {
    df_weight embed;              /* [vocab, hidden] (row lookup) */
    float *final_norm;            /* [hidden] */
    df_weight lm_head;            /* [vocab, hidden] */
    df_layer_weights *layers;     /* [num_hidden_layers] */
    float *out_res_norm, *out_res_proj; /* output_attn_res_{norm,proj} [hidden] (attn_res_block > 0) */
} df_spine;

/* One routed expert as handed out by the store (views into a store buffer). */
typedef struct {
    df_weight gate;               /* [moe_inter, W] (W = latent_dim for latent MoE, else hidden) */
    df_weight up;                 /* [moe_inter, W] */
    df_weight down;               /* [W, moe_inter] */
} df_expert;

#ifdef __cplusplus
}
#endif

#endif
