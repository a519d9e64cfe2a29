/*
 * attention.c — multi-head latent attention (MLA) in absorbed form.
 * Query: q_b(RMSNorm(q_a(x))) or q_proj(x); per head [nope | rope].
 * KV: kv_a(x) = [c_kv | k_pe]; the cache holds RMSNorm(c_kv) and roped k_pe.
 * Absorption (same math as transformers' kv_b expansion): with kv_b rows per
 * head h = [K_h (nope rows) ; V_h (v rows)] over kv_lora columns,
 *   q_nope . (K_h c_j) = (K_h^T q_nope) . c_j          (q_lat = K_h^T q_nope)
 *   sum_j p_j V_h c_j  = V_h (sum_j p_j c_j)           (o_lat = sum_j p_j c_j)
 * scores = (q_lat.c_j + q_pe.k_pe_j) * softmax_scale, causal, softmax fp32.
 * Kimi Linear / K3 (mla_use_nope): no rotary at all (q_pe and k_pe used as computed), scale
 * (nope+rope)^-0.5; K3 (mla_use_output_gate): the head outputs are multiplied by
 * sigmoid(g_proj(x)) before o_proj (Moonshot's KimiMLAAttention).
 * kv_b rows are decoded on the fly from their encoding (never re-quantized).
 * On a backend with mla_attend (cuda: src/kernels/cuda/cuda_attn.cu) the core (q_lat, scores, softmax, o_lat,
 * o_v) runs there in one call; the tasks below are the CPU's (and the fallback when it returns -1).
 */
#include "engine.h"
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QA_NORM_EPS 1e-6f /* transformers builds q_a_layernorm / kv_a_layernorm with the default eps */
enum { ATTN_CHUNK = 256 }; /* most rows through one attention pass */
_Static_assert(DF_MAX_LAYERS <= 256, "mla_attend's seq_key holds the layer in its low 8 bits");

typedef struct {
    df_engine *e;
    const df_weight *kvb;
    int T, H, dn, dr, dv, kvl;
    const float *q;      /* [T, H*(dn+dr)] */
    float *q_lat;        /* [T, H, kvl] */
    float *o_lat;        /* [T, H, kvl] */
    float *o_v;          /* [T, H*dv] */
    const float *const *c, *const *kpe; /* per row: its sequence's cache of this layer */
    const int *npos;     /* per row: the positions it attends to (causal: its own and the ones before) */
    int max_npos;
    int hb;              /* heads per work item of scores_task (1..ATTN_HEADS) */
} attn_job;

/* q_lat[t,h,:] = sum_d q_nope[t,h,d] * kv_b[h*(dn+dv)+d, :] */
static void absorb_q_task(void *ctx, int64_t h0, int64_t h1, int tid) {
    attn_job *j = ctx;
    const df_backend *be = j->e->be;
    float *row = malloc(sizeof(float) * (size_t)j->kvl);
    if (!row) abort();
    const int qd = j->dn + j->dr;
    for (int64_t h = h0; h < h1; h++) {
        for (int t = 0; t < j->T; t++) memset(j->q_lat + ((int64_t)t * j->H + h) * j->kvl, 0, sizeof(float) * j->kvl);
        for (int d = 0; d < j->dn; d++) {
            be->decode_row(j->kvb, h * (j->dn + j->dv) + d, row);
            for (int t = 0; t < j->T; t++) {
                float a = j->q[(int64_t)t * j->H * qd + h * qd + d];
                be->axpy(j->q_lat + ((int64_t)t * j->H + h) * j->kvl, a, row, j->kvl);
            }
        }
    }
    free(row);
}

/* Most heads per work item of the scores: a cached row loaded once serves this many heads (the backend's
 * attn_scores / attn_values); fewer when the call would otherwise have fewer items than the pool has threads. */
enum { ATTN_HEADS = 4 };

/* scores, softmax and o_lat for items (t, block of up to hb heads): item i is token i / nhb, heads from
 * (i % nhb) * hb. Each (t, h) gets the same values whatever the blocking (the backend ops have the bits of the
 * dot / axpy expressions that the generic loops below evaluate). */
static void scores_task(void *ctx, int64_t i0, int64_t i1, int tid) {
    attn_job *j = ctx;
    const df_backend *be = j->e->be;
    const int qd = j->dn + j->dr, hb = j->hb, nhb = (j->H + hb - 1) / hb;
    const int64_t ldp = j->max_npos;
    float *p = malloc(sizeof(float) * (size_t)ldp * hb);
    if (!p) abort();
    const float scale = (float)j->e->rope.softmax_scale;
    for (int64_t i = i0; i < i1; i++) {
        const int t = (int)(i / nhb), h0 = (int)(i % nhb) * hb;
        const int hn = j->H - h0 < hb ? j->H - h0 : hb;
        const int npos = j->npos[t];
        const float *c = j->c[t], *kpe = j->kpe[t];
        const float *ql = j->q_lat + ((int64_t)t * j->H + h0) * j->kvl;
        const float *qp = j->q + (int64_t)t * j->H * qd + (int64_t)h0 * qd + j->dn;
        if (!be->attn_scores || be->attn_scores(ql, j->kvl, qp, qd, hn, c, j->kvl, kpe, j->dr, npos, scale, p, ldp))
            for (int h = 0; h < hn; h++)
                for (int s = 0; s < npos; s++)
                    p[h * ldp + s] = (be->dot(ql + (int64_t)h * j->kvl, c + (int64_t)s * j->kvl, j->kvl) +
                                      be->dot(qp + (int64_t)h * qd, kpe + (int64_t)s * j->dr, j->dr)) * scale;
        for (int h = 0; h < hn; h++) be->softmax(p + h * ldp, npos);
        float *ol = j->o_lat + ((int64_t)t * j->H + h0) * j->kvl;
        memset(ol, 0, sizeof(float) * j->kvl * hn);
        if (!be->attn_values || be->attn_values(p, ldp, hn, c, j->kvl, npos, ol, j->kvl))
            for (int h = 0; h < hn; h++)
                for (int s = 0; s < npos; s++) be->axpy(ol + (int64_t)h * j->kvl, p[h * ldp + s], c + (int64_t)s * j->kvl, j->kvl);
    }
    free(p);
}

/* o_v[t, h*dv+e] = kv_b[h*(dn+dv)+dn+e, :] . o_lat[t,h,:] */
static void value_task(void *ctx, int64_t h0, int64_t h1, int tid) {
    attn_job *j = ctx;
    const df_backend *be = j->e->be;
    float *row = malloc(sizeof(float) * (size_t)j->kvl);
    if (!row) abort();
    for (int64_t h = h0; h < h1; h++)
        for (int v = 0; v < j->dv; v++) {
            be->decode_row(j->kvb, h * (j->dn + j->dv) + j->dn + v, row);
            for (int t = 0; t < j->T; t++)
                j->o_v[(int64_t)t * j->H * j->dv + h * j->dv + v] =
                    be->dot(row, j->o_lat + ((int64_t)t * j->H + h) * j->kvl, j->kvl);
        }
    free(row);
}

/* Room in each sequence's KV cache for its rows of the call; *T = the rows of all sequences. DF_OK, or the error of
 * kv_reserve with a message. */
static int reserve_rows(const df_seq_rows *seqs, int n_seq, int *T, char *err, size_t errlen) {
    *T = 0;
    for (int s = 0; s < n_seq; s++) {
        const int rc = kv_reserve(seqs[s].kv, seqs[s].n_past + seqs[s].T);
        if (rc) {
            if (err) snprintf(err, errlen, "KV cache: cannot hold %d positions (limit %d)%s", seqs[s].n_past + seqs[s].T,
                              seqs[s].kv->n_ctx, rc == DF_ENOMEM ? ": out of memory" : "");
            return rc;
        }
        *T += seqs[s].T;
    }
    return DF_OK;
}

/* At most ATTN_CHUNK rows at once (bounds the per-head scratch for long prompts): the rows of n_seq
 * sequences (seqs[i].T consecutive rows each), every projection over all rows, each row attending to its
 * own sequence's cache. */
static int attn_chunk(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out,
                      char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int H = cfg->num_attention_heads, dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim,
              dv = cfg->v_head_dim, kvl = cfg->kv_lora_rank, qd = dn + dr;
    int T = 0, rc = reserve_rows(seqs, n_seq, &T, err, errlen);
    if (rc) return rc;
    const float **rcache = malloc(sizeof(float *) * (size_t)T * 2);
    int *npos = malloc(sizeof(int) * (size_t)T);
    uint64_t *seq_key = malloc(sizeof(uint64_t) * (size_t)T);
    int max_npos = 1;
    const size_t qn = (size_t)T * H * qd;
    float *q = malloc(sizeof(float) * qn);
    float *kva = malloc(sizeof(float) * (size_t)T * (kvl + dr));
    float *qa = cfg->q_lora_rank > 0 ? malloc(sizeof(float) * (size_t)T * cfg->q_lora_rank) : NULL;
    float *q_lat = malloc(sizeof(float) * (size_t)T * H * kvl);
    float *o_lat = malloc(sizeof(float) * (size_t)T * H * kvl);
    float *o_v = malloc(sizeof(float) * (size_t)T * H * dv);
    if (!q || !kva || (cfg->q_lora_rank > 0 && !qa) || !q_lat || !o_lat || !o_v || !rcache || !npos || !seq_key) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "attention layer %d: out of memory for %d tokens", layer, T);
        goto done;
    }
    /* queries and the latent KV: on a backend with mla_project (cuda) all four projections in one call; else (and
     * when it cannot) one matmul at a time */
    const int projected = e->be->mla_project &&
                          e->be->mla_project(cfg->q_lora_rank > 0 ? &lw->q_a : NULL, lw->q_a_norm, QA_NORM_EPS,
                                             cfg->q_lora_rank > 0 ? &lw->q_b : NULL, cfg->q_lora_rank > 0 ? NULL : &lw->q,
                                             &lw->kv_a, h, T, q, kva) == 0;
    if (projected)
        e->weight_bytes += (cfg->q_lora_rank > 0 ? df_weight_bytes(&lw->q_a) + df_weight_bytes(&lw->q_b) : df_weight_bytes(&lw->q)) +
                           df_weight_bytes(&lw->kv_a);
    else if (cfg->q_lora_rank > 0) {
        eng_matmul(e, &lw->q_a, h, T, qa);
        for (int t = 0; t < T; t++)
            e->be->rmsnorm(qa + (int64_t)t * cfg->q_lora_rank, qa + (int64_t)t * cfg->q_lora_rank, lw->q_a_norm,
                           cfg->q_lora_rank, QA_NORM_EPS);
        eng_matmul(e, &lw->q_b, qa, T, q);
    } else {
        eng_matmul(e, &lw->q, h, T, q);
    }
    /* latent KV into the cache */
    if (!projected) eng_matmul(e, &lw->kv_a, h, T, kva);
    int64_t score_work = 0;
    for (int s = 0, t = 0; s < n_seq; s++) {
        df_kvcache *kv = seqs[s].kv;
        for (int i = 0; i < seqs[s].T; i++, t++) {
            const int64_t pos = seqs[s].n_past + i;
            const float *row = kva + (int64_t)t * (kvl + dr);
            e->be->rmsnorm(kv->c[layer] + pos * kvl, row, lw->kv_a_norm, kvl, QA_NORM_EPS);
            float *kp = kv->kpe[layer] + pos * dr;
            memcpy(kp, row + kvl, sizeof(float) * dr);
            rcache[t] = kv->c[layer];
            rcache[T + t] = kv->kpe[layer];
            npos[t] = (int)pos + 1; /* causal: positions 0..pos */
            /* the cache's identity for the device's mirror (mla_attend); rows [0, n_past) are unchanged since the
             * calls that read them: only this function writes them, each row at the position it is then read from */
            seq_key[t] = kv_layer_key(kv, layer);
            if (npos[t] > max_npos) max_npos = npos[t];
            score_work += npos[t];
            if (cfg->mla_use_nope) continue; /* Kimi Linear / K3: the shared key part stays unrotated */
            rope_apply(&e->rope, kp, pos);
            for (int hh = 0; hh < H; hh++) rope_apply(&e->rope, q + (int64_t)t * H * qd + hh * qd + dn, pos);
        }
    }
    /* the attention core (absorb, scores + softmax, values) on the backend's device when it has one, for every T
     * alike (a token's result is then the same alone or in a batch); without one, or when it cannot (-1), on the
     * CPU */
    /* without an output gate, the output projection in the same call where the backend can (out written directly) */
    const int fused = !cfg->mla_output_gate && e->be->mla_attend_o &&
                      e->be->mla_attend_o(&lw->kv_b, T, H, dn, dr, dv, kvl, (float)e->rope.softmax_scale, q, rcache,
                                          rcache + T, npos, seq_key, &lw->o, out) == 0;
    int on_device = fused || (e->be->mla_attend &&
                              e->be->mla_attend(&lw->kv_b, T, H, dn, dr, dv, kvl, (float)e->rope.softmax_scale, q, rcache,
                                                rcache + T, npos, seq_key, o_v) == 0);
    /* a batch the device could not take at once (e.g. its caches together do not fit the device's scratch) goes
     * row by row, as each row would alone, so a token does not leave the device only because of its batch */
    if (e->be->mla_attend && !on_device && T > 1) {
        on_device = 1;
        for (int t = 0; t < T && on_device; t++)
            on_device = e->be->mla_attend(&lw->kv_b, 1, H, dn, dr, dv, kvl, (float)e->rope.softmax_scale,
                                          q + (int64_t)t * H * qd, rcache + t, rcache + T + t, npos + t,
                                          seq_key + t, o_v + (int64_t)t * H * dv) == 0;
    }
    if (!on_device) {
        int hb = ATTN_HEADS;
        while (hb > 1 && (int64_t)T * ((H + hb - 1) / hb) < df_pool_threads(e->pool)) hb /= 2;
        attn_job j = {e, &lw->kv_b, T, H, dn, dr, dv, kvl, q, q_lat, o_lat, o_v, rcache, rcache + T, npos, max_npos, hb};
        /* small problems run on the calling thread (waking the pool costs more than the work) */
        const int64_t head_work = (int64_t)(dn + dv) * kvl * T;
        const int64_t hgrain = head_work * H < 131072 ? H : 1;
        const int64_t s_items = (int64_t)T * ((H + hb - 1) / hb);
        const int64_t sgrain = score_work * (kvl + dr) * H < 131072 ? s_items : 1;
        df_pool_run(e->pool, H, hgrain, absorb_q_task, &j);
        df_pool_run(e->pool, s_items, sgrain, scores_task, &j);
        df_pool_run(e->pool, H, hgrain, value_task, &j);
    }
    e->weight_bytes += df_weight_bytes(&lw->kv_b);
    if (cfg->mla_output_gate) {
        /* K3: o_proj(attn * sigmoid(g_proj(x))), x the normalized layer input; q_lat */
        float *g = malloc(sizeof(float) * (size_t)T * H * dv);
        if (!g) {
            rc = DF_ENOMEM;
            if (err) snprintf(err, errlen, "attention layer %d: out of memory for %d tokens", layer, T);
            goto done;
        }
        eng_matmul(e, &lw->attn_gate, h, T, g);
        for (int64_t i = 0; i < (int64_t)T * H * dv; i++) o_v[i] *= 1.0f / (1.0f + expf(-g[i]));
        free(g);
    }
    if (fused) e->weight_bytes += df_weight_bytes(&lw->o);
    else eng_matmul(e, &lw->o, o_v, T, out);
done:
    free(q); free(kva); free(qa); free(q_lat); free(o_lat); free(o_v); free(rcache); free(npos); free(seq_key);
    return rc;
}

/* One chunk of a call's rows: the sequences seqs (their rows [r0, r0 + their rows) of the call's arrays). */
typedef int (*chunk_fn)(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, int64_t r0, void *ctx, char *err,
                        size_t errlen);

/* The rows of n_seq sequences in chunks: all in one when several sequences fit ATTN_CHUNK rows together; else each
 * sequence on its own in chunks of ATTN_CHUNK rows (a long prompt: the cache rows of a chunk are written before the
 * next chunk attends to them, so the result equals one pass), with progress ticks between them. */
static int for_chunks(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, chunk_fn fn, void *ctx, char *err,
                      size_t errlen) {
    int T = 0;
    for (int s = 0; s < n_seq; s++) T += seqs[s].T;
    if (n_seq > 1 && T <= ATTN_CHUNK) return fn(e, layer, seqs, n_seq, 0, ctx, err, errlen);
    for (int s = 0, r0 = 0; s < n_seq; r0 += seqs[s].T, s++)
        for (int t0 = 0; t0 < seqs[s].T; t0 += ATTN_CHUNK) {
            const df_seq_rows one = {seqs[s].kv, seqs[s].n_past + t0, seqs[s].T - t0 < ATTN_CHUNK ? seqs[s].T - t0 : ATTN_CHUNK};
            int rc = fn(e, layer, &one, 1, (int64_t)r0 + t0, ctx, err, errlen);
            if (rc) return rc;
            if (t0 + ATTN_CHUNK < seqs[s].T && eng_tick(e)) return eng_cancelled(layer, err, errlen);
        }
    return DF_OK;
}

typedef struct { const float *h; float *out; } attn_io;

static int attn_chunk_fn(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, int64_t r0, void *ctx, char *err,
                         size_t errlen) {
    const attn_io *io = ctx;
    const int64_t D = e->cfg->hidden_size;
    return attn_chunk(e, layer, seqs, n_seq, io->h + r0 * D, io->out + r0 * D, err, errlen);
}

int attn_forward(df_engine *e, int layer, df_kvcache *kv, int n_past, const float *h, int T, float *out,
                 char *err, size_t errlen) {
    if (T <= 0) return DF_OK;
    const df_seq_rows one = {kv, n_past, T};
    return attn_forward_batch(e, layer, &one, 1, h, out, err, errlen);
}

int attn_forward_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out,
                       char *err, size_t errlen) {
    attn_io io = {h, out};
    return for_chunks(e, layer, seqs, n_seq, attn_chunk_fn, &io, err, errlen);
}

/* One chunk of attn_block_batch (the rows of n_seq sequences, at most ATTN_CHUNK unless one sequence's): the
 * backend's mla_block, or when it cannot (-1; the backend says why), the same steps as separate calls. */
static int block_chunk(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, float *x, float *h2, float *logits,
                       char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int H = cfg->num_attention_heads, dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim,
              dv = cfg->v_head_dim, kvl = cfg->kv_lora_rank, D = cfg->hidden_size, lora = cfg->q_lora_rank > 0;
    const int rope = !cfg->mla_use_nope && dr > 0;
    int T = 0, rc = reserve_rows(seqs, n_seq, &T, err, errlen);
    if (rc) return rc;
    float **cache = malloc(sizeof(float *) * (size_t)T * 2);
    int *npos = malloc(sizeof(int) * (size_t)T);
    uint64_t *seq_key = malloc(sizeof(uint64_t) * (size_t)T);
    float *cs = rope ? malloc(sizeof(float) * (size_t)T * dr) : NULL;
    float *hh = NULL, *a = NULL;
    if (!cache || !npos || !seq_key || (rope && !cs)) goto oom;
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int i = 0; i < seqs[s].T; i++, t++) {
            const int64_t pos = seqs[s].n_past + i;
            cache[t] = seqs[s].kv->c[layer];
            cache[T + t] = seqs[s].kv->kpe[layer];
            npos[t] = (int)pos + 1;
            seq_key[t] = kv_layer_key(seqs[s].kv, layer); /* as attn_chunk keys the caches */
            if (rope) rope_cs(&e->rope, pos, cs + (int64_t)t * dr);
        }
    df_mla_block b = {lw->attn_norm, lw->ffn_norm, cfg->rms_norm_eps, lora ? &lw->q_a : NULL, lora ? &lw->q_b : NULL,
                      lora ? NULL : &lw->q, &lw->kv_a, &lw->kv_b, &lw->o, logits ? &lw->router : NULL,
                      lora ? lw->q_a_norm : NULL, lw->kv_a_norm, QA_NORM_EPS, H, dn, dr, dv, kvl,
                      (float)e->rope.softmax_scale, e->be->moe_resid ? (uint64_t)(uintptr_t)e : 0,
                      NULL, NULL, NULL, 0, 0.0f, 0.0f, NULL};
    if (e->sh_early && T == 1 && (logits || !lw->is_moe) && b.resid_key) {
        /* the FFN's shared expert (a dense layer: its MLP), started by the block (moe.c) */
        b.sh_gate = &lw->gate;
        b.sh_up = &lw->up;
        b.sh_down = &lw->down;
        b.sh_act = cfg->act == DF_ACT_SITU;
        b.sh_beta = cfg->situ_beta;
        b.sh_lb = cfg->situ_linear_beta;
    }
    df_moe_dev md; /* the FFN's MoE routed on the device by the block (moe.c moe_route's routing, its activation) */
    if (e->moe_dev && T == 1 && b.resid_key && lw->is_moe && logits) {
        const int K = cfg->num_experts_per_tok;
        md = (df_moe_dev){(int)e->dev_tag, layer, cfg->n_routed_experts, K, cfg->n_group, cfg->topk_group,
                          cfg->norm_topk_prob && (cfg->arch == DF_ARCH_DEEPSEEK || K > 1), cfg->routed_scaling_factor,
                          lw->router_bias, cfg->act == DF_ACT_SITU, cfg->situ_beta, cfg->situ_linear_beta, lw->has_shared,
                          0, 0};
        b.moe = &md;
    } else if (e->moe_dev && T == 1 && b.resid_key && !lw->is_moe && b.sh_gate) { /* a dense MLP (started above) */
        md = (df_moe_dev){(int)e->dev_tag, layer, 0, 0, 0, 0, 0, 0.0f, NULL, cfg->act == DF_ACT_SITU, cfg->situ_beta,
                          cfg->situ_linear_beta, 1, 0, 0};
        b.moe = &md;
    }
    if (e->be->mla_block(&b, T, e->x_dev ? NULL : x, cs, cache, cache + T, npos, seq_key, x, h2, logits) == 0) {
        e->x_dev = 0;
        if (b.moe && md.queued) {
            e->moe_queued = 1;
            e->moe_bytes = md.bytes;
        }
        e->weight_bytes += (lora ? df_weight_bytes(&lw->q_a) + df_weight_bytes(&lw->q_b) : df_weight_bytes(&lw->q)) +
                           df_weight_bytes(&lw->kv_a) + df_weight_bytes(&lw->kv_b) + df_weight_bytes(&lw->o) +
                           (logits ? df_weight_bytes(&lw->router) : 0);
        goto done;
    }
    if (e->x_dev) { /* the host's x lacks the last MoE output, which only the device holds */
        rc = DF_EUNSUPPORTED;
        if (err) snprintf(err, errlen, "attention layer %d: the GPU call failed with the residual stream on the device", layer);
        goto done;
    }
    /* the steps one by one, as forward_batch runs them for a layer without mla_block */
    hh = malloc(sizeof(float) * (size_t)T * D);
    a = malloc(sizeof(float) * (size_t)T * D);
    if (!hh || !a) goto oom;
    for (int t = 0; t < T; t++) e->be->rmsnorm(hh + (int64_t)t * D, x + (int64_t)t * D, lw->attn_norm, D, cfg->rms_norm_eps);
    rc = attn_chunk(e, layer, seqs, n_seq, hh, a, err, errlen);
    if (rc) goto done;
    for (int64_t i = 0; i < (int64_t)T * D; i++) x[i] += a[i];
    for (int t = 0; t < T; t++) e->be->rmsnorm(h2 + (int64_t)t * D, x + (int64_t)t * D, lw->ffn_norm, D, cfg->rms_norm_eps);
    if (logits) eng_matmul(e, &lw->router, h2, T, logits);
    goto done;
oom:
    rc = DF_ENOMEM;
    if (err) snprintf(err, errlen, "attention layer %d: out of memory for %d tokens", layer, T);
done:
    free(cache); free(npos); free(seq_key); free(cs); free(hh); free(a);
    return rc;
}

typedef struct { float *x, *h2, *logits; } block_io;

static int block_chunk_fn(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, int64_t r0, void *ctx, char *err,
                          size_t errlen) {
    const block_io *io = ctx;
    const int64_t D = e->cfg->hidden_size, E = e->cfg->n_routed_experts;
    return block_chunk(e, layer, seqs, n_seq, io->x + r0 * D, io->h2 + r0 * D, io->logits ? io->logits + r0 * E : NULL,
                       err, errlen);
}

int attn_block_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, float *x, float *h2, float *logits,
                     char *err, size_t errlen) {
    block_io io = {x, h2, logits};
    return for_chunks(e, layer, seqs, n_seq, block_chunk_fn, &io, err, errlen);
}
