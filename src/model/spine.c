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

/* The first n values of tensor t as a malloc'd f32 array (f32, bf16 or f16 stored; `what` names the role
 * in the type error). */
static int read_f32(ctx *c, const native_tensor *t, const char *name, const char *what, size_t n, float **out) {
    if (t->type != DF_W_F32 && t->type != DF_W_BF16 && t->type != DF_W_F16)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": type %s, %s must be f32, bf16 or f16", name,
                           df_wtype_name(t->type), what);
    const uint8_t *p = c->map(c->user, t, 0);
    if (!p) return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": not resident (internal: spine map)", name);
    float *v = malloc(sizeof(float) * (n ? n : 1));
    if (!v) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->type) {
        case DF_W_F32: memcpy(&v[i], p + 4 * i, 4); break;
        case DF_W_BF16: memcpy(&h, p + 2 * i, 2); v[i] = df_bf16_to_f32(h); break;
        default: memcpy(&h, p + 2 * i, 2); v[i] = df_f16_to_f32(h); break;
        }
    }
    *out = v;
    return DF_OK;
}

/* A 1-D vector of exactly `len` values (optional: absent -> *out NULL, DF_OK). */
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
    return read_f32(c, t, name, "a vector", (size_t)len, out);
}

/* A small 2-D tensor [rows, cols] (KDA short conv) as a malloc'd f32 array, row-major. */
static int get_mat_f32(ctx *c, const char *name, int64_t rows, int64_t cols, float **out) {
    *out = NULL;
    const native_tensor *t = native_find(c->n, name);
    if (!t) return df_set_errc(c->err, c->errlen, DF_EFORMAT, "%s/manifest.json: spine tensor \"%s\" missing", c->n->dir, name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": shape [%lld%s%lld], the config needs [%lld, %lld]", name,
                           (long long)t->shape[0], t->ndim == 2 ? ", " : "", t->ndim == 2 ? (long long)t->shape[1] : 0LL,
                           (long long)rows, (long long)cols);
    return read_f32(c, t, name, "a conv weight", (size_t)rows * (size_t)cols, out);
}

/* A_log: the first `len` entries of a stored vector that may be longer (K3 stores head_dim entries, the
 * live num_heads first, a zero tail after). */
static int get_v_prefix(ctx *c, const char *name, int64_t len, float **out) {
    *out = NULL;
    const native_tensor *t = native_find(c->n, name);
    if (!t) return df_set_errc(c->err, c->errlen, DF_EFORMAT, "%s/manifest.json: spine tensor \"%s\" missing", c->n->dir, name);
    if (t->ndim != 1 || t->shape[0] < len)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "spine tensor \"%s\": shape [%lld%s], the config needs at least [%lld]", name,
                           (long long)t->shape[0], t->ndim == 2 ? ", ..." : "", (long long)len);
    return read_f32(c, t, name, "a vector", (size_t)len, out);
}

/* The zeroed element after the last layer carries this in `mixer` (spine_free counts layers by it). */
#define SPINE_SENTINEL 0x5E9711E

static int layer_has_alloc(const df_layer_weights *L) {
    return L->attn_norm || L->ffn_norm || L->kv_a_norm || L->q_a_norm || L->router_bias || L->conv_q || L->conv_k || L->conv_v ||
           L->A_log || L->dt_bias || L->o_norm || L->attn_res_norm || L->attn_res_proj || L->mlp_res_norm || L->mlp_res_proj ||
           L->lat_norm;
}

void spine_free(df_spine *s) {
    if (!s) return;
    free(s->final_norm);
    free(s->out_res_norm);
    free(s->out_res_proj);
    if (s->layers) {
        /* layer count is not stored in df_spine: spine_build marks the element after the last layer with
         * SPINE_SENTINEL; a spine built elsewhere ends at the first layer without any allocated vector */
        for (df_layer_weights *L = s->layers; L->mixer != SPINE_SENTINEL && layer_has_alloc(L); L++) {
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_a_norm);
            free(L->kv_a_norm);
            free(L->router_bias);
            free(L->conv_q);
            free(L->conv_k);
            free(L->conv_v);
            free(L->A_log);
            free(L->dt_bias);
            free(L->o_norm);
            free(L->attn_res_norm);
            free(L->attn_res_proj);
            free(L->mlp_res_norm);
            free(L->mlp_res_proj);
            free(L->lat_norm);
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
    /* +1: sentinel for spine_free */
    out->layers = calloc((size_t)g->num_hidden_layers + 1, sizeof(df_layer_weights));
    if (!out->layers) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    out->layers[g->num_hidden_layers].mixer = SPINE_SENTINEL;
    if ((rc = get_w(&c, "model.embed_tokens.weight", V, H, &out->embed))) goto fail;
    if ((rc = get_v(&c, "model.norm.weight", H, 0, &out->final_norm))) goto fail;
    if (native_find(n, "lm_head.weight") || !g->tie_word_embeddings) {
        if ((rc = get_w(&c, "lm_head.weight", V, H, &out->lm_head))) goto fail;
    } else {
        out->lm_head = out->embed;
    }
    if (g->attn_res_block > 0) {
        if ((rc = get_v(&c, "model.output_attn_res_norm.weight", H, 0, &out->out_res_norm))) goto fail;
        if ((rc = get_v(&c, "model.output_attn_res_proj.weight", H, 0, &out->out_res_proj))) goto fail;
    }
    const int64_t KH = g->kda_heads, KD = g->kda_head_dim, D = KH * KD, CW = g->kda_conv;
    for (int l = 0; l < g->num_hidden_layers; l++) {
        df_layer_weights *L = &out->layers[l];
#define P(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        L->mixer = g->mixer[l];
        if ((rc = get_v(&c, P("input_layernorm.weight"), H, 0, &L->attn_norm))) goto fail;
        if ((rc = get_v(&c, P("post_attention_layernorm.weight"), H, 0, &L->ffn_norm))) goto fail;
        if (L->mixer == DF_MIXER_KDA) {
            if ((rc = get_w(&c, P("self_attn.q_proj.weight"), D, H, &L->kda_q))) goto fail;
            if ((rc = get_w(&c, P("self_attn.k_proj.weight"), D, H, &L->kda_k))) goto fail;
            if ((rc = get_w(&c, P("self_attn.v_proj.weight"), D, H, &L->kda_v))) goto fail;
            if ((rc = get_mat_f32(&c, P("self_attn.q_conv1d.weight"), D, CW, &L->conv_q))) goto fail;
            if ((rc = get_mat_f32(&c, P("self_attn.k_conv1d.weight"), D, CW, &L->conv_k))) goto fail;
            if ((rc = get_mat_f32(&c, P("self_attn.v_conv1d.weight"), D, CW, &L->conv_v))) goto fail;
            if ((rc = get_w(&c, P("self_attn.f_a_proj.weight"), KD, H, &L->f_a))) goto fail;
            if ((rc = get_w(&c, P("self_attn.f_b_proj.weight"), D, KD, &L->f_b))) goto fail;
            if ((rc = get_w(&c, P("self_attn.b_proj.weight"), KH, H, &L->beta))) goto fail;
            if ((rc = get_v_prefix(&c, P("self_attn.A_log"), KH, &L->A_log))) goto fail;
            if ((rc = get_v(&c, P("self_attn.dt_bias"), D, 0, &L->dt_bias))) goto fail;
            if (g->kda_full_rank_gate) {
                if ((rc = get_w(&c, P("self_attn.g_proj.weight"), D, H, &L->g))) goto fail;
            } else {
                if ((rc = get_w(&c, P("self_attn.g_a_proj.weight"), KD, H, &L->g_a))) goto fail;
                if ((rc = get_w(&c, P("self_attn.g_b_proj.weight"), D, KD, &L->g_b))) goto fail;
            }
            if ((rc = get_v(&c, P("self_attn.o_norm.weight"), KD, 0, &L->o_norm))) goto fail;
            if ((rc = get_w(&c, P("self_attn.o_proj.weight"), H, D, &L->o))) goto fail;
        } else {
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
            if (g->mla_output_gate && (rc = get_w(&c, P("self_attn.g_proj.weight"), NH * g->v_head_dim, H, &L->attn_gate))) goto fail;
        }
        if (g->attn_res_block > 0) {
            if ((rc = get_v(&c, P("self_attention_res_norm.weight"), H, 0, &L->attn_res_norm))) goto fail;
            if ((rc = get_v(&c, P("self_attention_res_proj.weight"), H, 0, &L->attn_res_proj))) goto fail;
            if ((rc = get_v(&c, P("mlp_res_norm.weight"), H, 0, &L->mlp_res_norm))) goto fail;
            if ((rc = get_v(&c, P("mlp_res_proj.weight"), H, 0, &L->mlp_res_proj))) goto fail;
        }
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
            if (g->latent_dim > 0) {
                int64_t LD = g->latent_dim;
                if ((rc = get_w(&c, P("mlp.routed_expert_down_proj.weight"), LD, H, &L->lat_down))) goto fail;
                if ((rc = get_w(&c, P("mlp.routed_expert_up_proj.weight"), H, LD, &L->lat_up))) goto fail;
                if (g->latent_norm && (rc = get_v(&c, P("mlp.routed_expert_norm.weight"), LD, 0, &L->lat_norm))) goto fail;
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
    if (g->mixer[l] == DF_MIXER_KDA) {
        R(kda_q, "self_attn.q_proj.weight");
        R(kda_k, "self_attn.k_proj.weight");
        R(kda_v, "self_attn.v_proj.weight");
        R(f_a, "self_attn.f_a_proj.weight");
        R(f_b, "self_attn.f_b_proj.weight");
        R(beta, "self_attn.b_proj.weight");
        if (g->kda_full_rank_gate) {
            R(g, "self_attn.g_proj.weight");
        } else {
            R(g_a, "self_attn.g_a_proj.weight");
            R(g_b, "self_attn.g_b_proj.weight");
        }
        R(o, "self_attn.o_proj.weight");
        /* {q,k,v}_conv1d are 2-D in spine.bin but converted to f32 arrays at build time: always resident */
    } else {
        if (g->q_lora_rank > 0) {
            R(q_a, "self_attn.q_a_proj.weight");
            R(q_b, "self_attn.q_b_proj.weight");
        } else {
            R(q, "self_attn.q_proj.weight");
        }
        R(kv_a, "self_attn.kv_a_proj_with_mqa.weight");
        R(kv_b, "self_attn.kv_b_proj.weight");
        R(o, "self_attn.o_proj.weight");
        if (g->mla_output_gate) R(attn_gate, "self_attn.g_proj.weight");
    }
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
        if (g->latent_dim > 0) {
            R(lat_down, "mlp.routed_expert_down_proj.weight");
            R(lat_up, "mlp.routed_expert_up_proj.weight");
        }
    }
#undef R
    return k;
}
