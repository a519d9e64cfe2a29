/* spine.c — df_spine views over a loaded spine.bin (see spine.h). Tensor
 * names and shapes: ../shared/notes/model-math.md "Tensor names". */
#include "spine.h"
#include "config.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const df_native *n;
    spine_map_fn map;
    void *user;
    char *err;
    size_t errlen;
} ctx;

/* identity map over a whole loaded spine.bin (spine_build) */
static const void *map_whole(void *user, const native_tensor *t, int scale) {
    return (const uint8_t *)user + (scale ? t->scale_offset : t->offset);
}

static int get_w(ctx *c, const char *name, int64_t rows, int64_t cols, df_weight *w) {
    const native_tensor *t = native_find(c->n, name);
    if (!t) return df_set_errc(c->err, c->errlen, DF_EFORMAT, "%s/manifest.json: spine tensor \"%s\" missing", c->n->dir, name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": shape [%lld, %lld], the config needs [%lld, %lld]", name,
                           (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = c->map(c->user, t, 0);
    w->scale = t->scale_bytes ? c->map(c->user, t, 1) : NULL;
    return DF_OK;
}

static int get_v(ctx *c, const char *name, int64_t len, int optional, float **out) {
    *out = NULL;
    const native_tensor *t = native_find(c->n, name);
    if (!t) {
        if (optional) return DF_OK;
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "%s/manifest.json: spine tensor \"%s\" missing", c->n->dir, name);
    }
    if (t->ndim != 1 || t->shape[0] != len)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": shape [%lld%s], the config needs [%lld]", name,
                           (long long)t->shape[0], t->ndim == 2 ? ", ..." : "", (long long)len);
    float *v = malloc(sizeof(float) * (size_t)len);
    if (!v) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    const uint8_t *p = c->map(c->user, t, 0);
    if (!p) {
        free(v);
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": vector not resident (internal: spine map)", name);
    }
    for (int64_t i = 0; i < len; i++) {
        uint16_t h;
        switch (t->type) {
        case DF_W_F32: memcpy(&v[i], p + 4 * i, 4); break;
        case DF_W_BF16: memcpy(&h, p + 2 * i, 2); v[i] = df_bf16_to_f32(h); break;
        case DF_W_F16: memcpy(&h, p + 2 * i, 2); v[i] = df_f16_to_f32(h); break;
        default:
            free(v);
            return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": a vector must be f32, bf16 or f16", name);
        }
    }
    *out = v;
    return DF_OK;
}

void spine_free(df_spine *s) {
    if (!s) return;
    free(s->final_norm);
    if (s->layers) {
        /* layer count is not stored in df_spine: layers end at a zeroed sentinel */
        for (df_layer_weights *L = s->layers; L->attn_norm || L->ffn_norm || L->kv_a_norm || L->q_a_norm || L->router_bias; L++) {
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_a_norm);
            free(L->kv_a_norm);
            free(L->router_bias);
        }
        free(s->layers);
    }
    memset(s, 0, sizeof *s);
}

int spine_build(const df_native *n, const void *spine_buf, df_spine *out, char *err, size_t errlen) {
    return spine_build_mapped(n, map_whole, (void *)spine_buf, out, err, errlen);
}

int spine_build_mapped(const df_native *n, spine_map_fn map, void *user, df_spine *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const df_config *g = &n->cfg;
    ctx c = {n, map, user, err, errlen};
    int rc;
    char nm[256];
    int64_t H = g->hidden_size, V = g->vocab_size, NH = g->num_attention_heads;
    int64_t qk = g->qk_nope_head_dim + g->qk_rope_head_dim;
    /* +1: zeroed sentinel for spine_free */
    out->layers = calloc((size_t)g->num_hidden_layers + 1, sizeof(df_layer_weights));
    if (!out->layers) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    if ((rc = get_w(&c, "model.embed_tokens.weight", V, H, &out->embed))) goto fail;
    if ((rc = get_v(&c, "model.norm.weight", H, 0, &out->final_norm))) goto fail;
    if (native_find(n, "lm_head.weight") || !g->tie_word_embeddings) {
        if ((rc = get_w(&c, "lm_head.weight", V, H, &out->lm_head))) goto fail;
    } else {
        out->lm_head = out->embed;
    }
    for (int l = 0; l < g->num_hidden_layers; l++) {
        df_layer_weights *L = &out->layers[l];
#define P(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        if ((rc = get_v(&c, P("input_layernorm.weight"), H, 0, &L->attn_norm))) goto fail;
        if ((rc = get_v(&c, P("post_attention_layernorm.weight"), H, 0, &L->ffn_norm))) goto fail;
        if (g->q_lora_rank > 0) {
            if ((rc = get_w(&c, P("self_attn.q_a_proj.weight"), g->q_lora_rank, H, &L->q_a))) goto fail;
            if ((rc = get_v(&c, P("self_attn.q_a_layernorm.weight"), g->q_lora_rank, 0, &L->q_a_norm))) goto fail;
            if ((rc = get_w(&c, P("self_attn.q_b_proj.weight"), NH * qk, g->q_lora_rank, &L->q_b))) goto fail;
        } else {
            if ((rc = get_w(&c, P("self_attn.q_proj.weight"), NH * qk, H, &L->q))) goto fail;
        }
        if ((rc = get_w(&c, P("self_attn.kv_a_proj_with_mqa.weight"), g->kv_lora_rank + g->qk_rope_head_dim, H, &L->kv_a))) goto fail;
        if ((rc = get_v(&c, P("self_attn.kv_a_layernorm.weight"), g->kv_lora_rank, 0, &L->kv_a_norm))) goto fail;
        if ((rc = get_w(&c, P("self_attn.kv_b_proj.weight"), NH * (g->qk_nope_head_dim + g->v_head_dim), g->kv_lora_rank, &L->kv_b)))
            goto fail;
        if ((rc = get_w(&c, P("self_attn.o_proj.weight"), H, NH * g->v_head_dim, &L->o))) goto fail;
        L->is_moe = config_layer_is_moe(g, l);
        if (!L->is_moe) {
            int64_t I = g->intermediate_size;
            if ((rc = get_w(&c, P("mlp.gate_proj.weight"), I, H, &L->gate))) goto fail;
            if ((rc = get_w(&c, P("mlp.up_proj.weight"), I, H, &L->up))) goto fail;
            if ((rc = get_w(&c, P("mlp.down_proj.weight"), H, I, &L->down))) goto fail;
        } else {
            if ((rc = get_w(&c, P("mlp.gate.weight"), g->n_routed_experts, H, &L->router))) goto fail;
            if ((rc = get_v(&c, P("mlp.gate.e_score_correction_bias"), g->n_routed_experts, 1, &L->router_bias))) goto fail;
            L->has_shared = g->n_shared_experts > 0;
            if (L->has_shared) {
                int64_t I = (int64_t)g->moe_intermediate_size * g->n_shared_experts;
                if ((rc = get_w(&c, P("mlp.shared_experts.gate_proj.weight"), I, H, &L->gate))) goto fail;
                if ((rc = get_w(&c, P("mlp.shared_experts.up_proj.weight"), I, H, &L->up))) goto fail;
                if ((rc = get_w(&c, P("mlp.shared_experts.down_proj.weight"), H, I, &L->down))) goto fail;
            }
        }
#undef P
    }
    return DF_OK;
fail:
    spine_free(out);
    return rc;
}

int spine_layer_wrefs(const df_native *n, int l, df_layer_weights *L, spine_wref *out) {
    const df_config *g = &n->cfg;
    int k = 0;
    char nm[256];
    if (l < 0 || l >= g->num_hidden_layers) return 0;
    int moe = config_layer_is_moe(g, l);
#define R(field, s)                                                                   \
    do {                                                                              \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s);                           \
        const native_tensor *t_ = native_find(n, nm);                                 \
        if (t_ && t_->ndim == 2 && k < SPINE_MAX_WREFS) out[k++] = (spine_wref){L ? &L->field : NULL, t_}; \
    } while (0)
    if (g->q_lora_rank > 0) {
        R(q_a, "self_attn.q_a_proj.weight");
        R(q_b, "self_attn.q_b_proj.weight");
    } else {
        R(q, "self_attn.q_proj.weight");
    }
    R(kv_a, "self_attn.kv_a_proj_with_mqa.weight");
    R(kv_b, "self_attn.kv_b_proj.weight");
    R(o, "self_attn.o_proj.weight");
    if (!moe) {
        R(gate, "mlp.gate_proj.weight");
        R(up, "mlp.up_proj.weight");
        R(down, "mlp.down_proj.weight");
    } else {
        R(router, "mlp.gate.weight");
        if (g->n_shared_experts > 0) {
            R(gate, "mlp.shared_experts.gate_proj.weight");
            R(up, "mlp.shared_experts.up_proj.weight");
            R(down, "mlp.shared_experts.down_proj.weight");
        }
    }
#undef R
    return k;
}
