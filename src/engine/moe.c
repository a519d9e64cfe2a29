/*
 * moe.c — the FFN of a layer: dense SwiGLU MLP below first_k_dense_replace,
 * otherwise noaux_tc routed experts + shared experts (transformers
 * DeepseekV3MoE / DeepseekV3TopkRouter):
 *   s = sigmoid(x W_r^T) (fp32); choice = s + e_score_correction_bias (selection only);
 *   n_group > 1: group score = sum of its top-2 choice scores, keep topk_group groups,
 *   the rest -inf; top-k of choice; weights = s at those ids, / (sum + 1e-20) if
 *   norm_topk_prob, * routed_scaling_factor.
 * The T rows are grouped by expert: every needed expert of the layer is requested
 * from the store first (STORE_DEMAND), then each is acquired, applied to all of its
 * rows at once, and released — one read per expert per layer per df_eval call.
 */
#include "engine.h"
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void moe_route(const df_config *cfg, const float *logits, const float *bias, int T, int *ids, float *weights) {
    const int E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    const int G = cfg->n_group > 0 ? cfg->n_group : 1, per = E / G;
    float *s = malloc(sizeof(float) * (size_t)E * 2);
    float *choice = s + E;
    float gscore[G > 0 ? G : 1];
    int gkeep[G > 0 ? G : 1];
    for (int t = 0; t < T; t++) {
        const float *lg = logits + (int64_t)t * E;
        for (int x = 0; x < E; x++) {
            s[x] = 1.0f / (1.0f + expf(-lg[x]));
            choice[x] = s[x] + (bias ? bias[x] : 0.0f);
        }
        if (G > 1) {
            for (int g = 0; g < G; g++) {
                float a = -INFINITY, b = -INFINITY; /* top-2 of the group */
                for (int x = g * per; x < (g + 1) * per; x++) {
                    if (choice[x] > a) { b = a; a = choice[x]; }
                    else if (choice[x] > b) b = choice[x];
                }
                gscore[g] = per >= 2 ? a + b : a;
                gkeep[g] = 0;
            }
            for (int k = 0; k < cfg->topk_group && k < G; k++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
                gkeep[best] = 1;
            }
            for (int g = 0; g < G; g++)
                if (!gkeep[g]) for (int x = g * per; x < (g + 1) * per; x++) choice[x] = -INFINITY;
        }
        int *id = ids + (int64_t)t * K;
        float *w = weights + (int64_t)t * K;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int x = 0; x < E; x++) {
                int taken = 0;
                for (int q = 0; q < k; q++) if (id[q] == x) { taken = 1; break; }
                if (taken) continue;
                if (best < 0 || choice[x] > choice[best]) best = x;
            }
            id[k] = best;
        }
        float sum = 0.0f;
        for (int k = 0; k < K; k++) { w[k] = s[id[k]]; sum += w[k]; }
        for (int k = 0; k < K; k++) {
            if (cfg->norm_topk_prob) w[k] = w[k] / (sum + 1e-20f);
            w[k] *= cfg->routed_scaling_factor;
        }
    }
    free(s);
}

/* out = down(silu(gate x) * up x) for T rows */
static int mlp(df_engine *e, const df_weight *gate, const df_weight *up, const df_weight *down, const float *x, int T,
               float *out) {
    const int64_t I = gate->rows;
    float *g = malloc(sizeof(float) * (size_t)(T * I)), *u = malloc(sizeof(float) * (size_t)(T * I));
    if (!g || !u) { free(g); free(u); return DF_ENOMEM; }
    eng_matmul(e, gate, x, T, g);
    eng_matmul(e, up, x, T, u);
    e->be->silu_mul(g, g, u, T * I);
    eng_matmul(e, down, g, T, out);
    free(g);
    free(u);
    return DF_OK;
}

int ffn_forward(df_engine *e, int layer, const float *h, int T, float *out, char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int D = cfg->hidden_size;
    if (!lw->is_moe) {
        int rc = mlp(e, &lw->gate, &lw->up, &lw->down, h, T, out);
        if (rc && err) snprintf(err, errlen, "dense MLP layer %d: out of memory", layer);
        return rc;
    }
    const int E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    int rc = DF_OK;
    float *logits = malloc(sizeof(float) * (size_t)T * E);
    int *ids = malloc(sizeof(int) * (size_t)T * K);
    float *wts = malloc(sizeof(float) * (size_t)T * K);
    int *count = calloc((size_t)E, sizeof(int));
    int *used = malloc(sizeof(int) * (size_t)E);
    int *rows = malloc(sizeof(int) * (size_t)T * K);      /* token of each (expert, slot), grouped */
    float *rw = malloc(sizeof(float) * (size_t)T * K);    /* its weight */
    int *start = malloc(sizeof(int) * (size_t)(E + 1));
    float *xe = malloc(sizeof(float) * (size_t)T * D), *ye = malloc(sizeof(float) * (size_t)T * D);
    float *sh = lw->has_shared ? malloc(sizeof(float) * (size_t)T * D) : NULL;
    if (!logits || !ids || !wts || !count || !used || !rows || !rw || !start || !xe || !ye || (lw->has_shared && !sh)) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "MoE layer %d: out of memory for %d tokens", layer, T);
        goto done;
    }
    eng_matmul(e, &lw->router, h, T, logits);
    moe_route(cfg, logits, lw->router_bias, T, ids, wts);
    /* group rows by expert (ascending expert id; tokens ascending within an expert) */
    for (int i = 0; i < T * K; i++) count[ids[i]]++;
    int n_used = 0;
    start[0] = 0;
    for (int x = 0; x < E; x++) {
        start[x + 1] = start[x] + count[x];
        if (count[x]) used[n_used++] = x;
    }
    {
        int *fill = calloc((size_t)E, sizeof(int));
        if (!fill) { rc = DF_ENOMEM; goto done; }
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                int x = ids[t * K + k], at = start[x] + fill[x]++;
                rows[at] = t;
                rw[at] = wts[t * K + k];
            }
        free(fill);
    }
    if (e->experts.request) e->experts.request(e->experts.ctx, layer, used, n_used, STORE_DEMAND);
    memset(out, 0, sizeof(float) * (size_t)T * D);
    for (int u = 0; u < n_used; u++) {
        int x = used[u], n = count[x];
        df_expert ex;
        double t0 = now_s();
        rc = e->experts.acquire(e->experts.ctx, layer, &x, 1, &ex, err, errlen);
        e->io_wait_s += now_s() - t0;
        if (rc) goto done;
        for (int i = 0; i < n; i++) memcpy(xe + (int64_t)i * D, h + (int64_t)rows[start[x] + i] * D, sizeof(float) * D);
        rc = mlp(e, &ex.gate, &ex.up, &ex.down, xe, n, ye);
        e->experts.release(e->experts.ctx, layer, &x, 1);
        if (rc) {
            if (err) snprintf(err, errlen, "MoE layer %d expert %d: out of memory", layer, x);
            goto done;
        }
        for (int i = 0; i < n; i++)
            e->be->axpy(out + (int64_t)rows[start[x] + i] * D, rw[start[x] + i], ye + (int64_t)i * D, D);
    }
    if (lw->has_shared) {
        rc = mlp(e, &lw->gate, &lw->up, &lw->down, h, T, sh);
        if (rc) goto done;
        for (int64_t i = 0; i < (int64_t)T * D; i++) out[i] += sh[i];
    }
done:
    free(logits); free(ids); free(wts); free(count); free(used); free(rows); free(rw); free(start);
    free(xe); free(ye); free(sh);
    return rc;
}

void moe_prefetch(df_engine *e, int layer, const float *x_resid, int T) {
    const df_config *cfg = e->cfg;
    if (layer >= cfg->num_hidden_layers || !e->experts.request) return;
    const df_layer_weights *lw = &e->spine->layers[layer];
    if (!lw->is_moe) return;
    const int D = cfg->hidden_size, E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    float *h = malloc(sizeof(float) * (size_t)T * D), *logits = malloc(sizeof(float) * (size_t)T * E);
    int *ids = malloc(sizeof(int) * (size_t)T * K), *used = malloc(sizeof(int) * (size_t)E);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    char *mark = calloc((size_t)E, 1);
    if (h && logits && ids && used && w && mark) {
        for (int t = 0; t < T; t++)
            e->be->rmsnorm(h + (int64_t)t * D, x_resid + (int64_t)t * D, lw->ffn_norm, D, cfg->rms_norm_eps);
        eng_matmul(e, &lw->router, h, T, logits);
        moe_route(cfg, logits, lw->router_bias, T, ids, w);
        int n = 0;
        for (int i = 0; i < T * K; i++) if (!mark[ids[i]]) { mark[ids[i]] = 1; }
        for (int x = 0; x < E; x++) if (mark[x]) used[n++] = x;
        e->experts.request(e->experts.ctx, layer, used, n, STORE_PREFETCH);
        e->prefetch_issued += (uint64_t)n;
    }
    free(h); free(logits); free(ids); free(used); free(w); free(mark);
}
