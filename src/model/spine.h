/*
 * spine.h — build the in-memory df_spine (weights.h) from a native model whose
 * spine.bin has been loaded into RAM. Implemented in src/model/spine.c.
 */
#ifndef DF_MODEL_SPINE_H
#define DF_MODEL_SPINE_H

#include "native.h"

/* Fill `out` from n's tensor table: df_weight views point into spine_buf
 * (the whole spine.bin, n->spine_bytes bytes, kept alive by the caller); 1-D
 * vectors (norms, router bias) are converted to malloc'd f32 arrays. Shapes are
 * checked against n->cfg (DF_EFORMAT naming the tensor, its shape and the
 * expected one). Layers < first_k_dense_replace get the dense MLP
 * (mlp.{gate,up,down}_proj), others the router (mlp.gate.weight), its
 * e_score_correction_bias (NULL if absent) and the shared experts
 * (mlp.shared_experts.*, width moe_intermediate_size * n_shared_experts).
 * lm_head.weight absent + tie_word_embeddings -> lm_head = embed.
 * Kimi Linear / K3 (cfg->mixer[l], native names in docs/native-format.md): KDA layers get
 * kda_q/k/v, f_a/f_b, beta, g | g_a/g_b, o as views and conv_q/k/v ([D, kda_conv] f32), A_log (the first
 * kda_heads entries of the stored vector), dt_bias [D], o_norm [head_dim] as malloc'd f32; MLA layers also
 * attn_gate (self_attn.g_proj) when mla_output_gate; attn_res_block > 0 adds the per-layer and output
 * AttnRes vectors; latent_dim > 0 adds lat_down/lat_up views and lat_norm (latent_norm). */
int spine_build(const df_native *n, const void *spine_buf, df_spine *out, char *err, size_t errlen);
/* Free what spine_build allocated (not spine_buf). Safe on a zeroed spine. */
void spine_free(df_spine *s);

/* ---- added for spine streaming (issue 4; append-only) ---- */
/* Where the bytes of a spine tensor are in memory: scale = 0 -> its data array,
 * 1 -> its scale array. Return NULL for a 2-D weight that is not resident (the
 * weight's data/scale stay NULL until the caller points them at a staging
 * buffer); 1-D vectors must always be mapped (they are converted to f32 here). */
typedef const void *(*spine_map_fn)(void *user, const native_tensor *t, int scale);
/* spine_build with spine.bin's arrays wherever `map` says (spine_build = identity map over spine_buf). */
int spine_build_mapped(const df_native *n, spine_map_fn map, void *user, df_spine *out, char *err, size_t errlen);

/* The 2-D weights of layer l (attention matrices, dense MLP or router + shared
 * experts): the df_weight field of L (NULL entries when L is NULL) and its
 * tensor in n's table. Returns how many (<= SPINE_MAX_WREFS); 0 for a bad l.
 * A streamed layer's weights are re-pointed with this into a staging buffer. */
#define SPINE_MAX_WREFS 24
typedef struct {
    df_weight *w;
    const native_tensor *t;
} spine_wref;
int spine_layer_wrefs(const df_native *n, int l, df_layer_weights *L, spine_wref *out);

#endif
