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
 * lm_head.weight absent + tie_word_embeddings -> lm_head = embed. */
int spine_build(const df_native *n, const void *spine_buf, df_spine *out, char *err, size_t errlen);
/* Free what spine_build allocated (not spine_buf). Safe on a zeroed spine. */
void spine_free(df_spine *s);

#endif
