/*
 * moe.c — the FFN of a layer: dense SwiGLU MLP below first_k_dense_replace,
 * otherwise noaux_tc routed experts + shared experts (transformers
 * DeepseekV3MoE / DeepseekV3TopkRouter):
 *   s = sigmoid(x W_r^T) (fp32, kernels/route_math.h); choice = s + e_score_correction_bias (selection only);
 *   n_group > 1: group score = sum of its top-2 choice scores, keep topk_group groups,
 *   the rest -inf; top-k of choice; weights = s at those ids, / (sum + 1e-20) if
 *   norm_topk_prob, * routed_scaling_factor.
 * The T rows are grouped by expert: every needed expert of the layer is requested
 * from the store first (STORE_DEMAND), then each is acquired, applied to all of its
 * rows at once, and released — one read per expert per layer per df_eval call.
 */
#include "engine.h"
#include "deltafin.h"
#include "kernels/route_math.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PREFILL_CHUNK_T = 4 }; /* calls of more tokens than this acquire experts in small chunks */
/* calls of at most this many tokens (decode steps, decode batches, draft verification) use the backend's grouped
 * MLP; a 512-token prompt's experts phase on the H200 was 3.24 s grouped vs 2.11 s one expert per round trip
 * (bench/RESULTS.md), so prompts keep the per-item path (both give the same bits) */
enum { GROUP_MAX_T = 16 };

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
            s[x] = df_route_sigmoid(lg[x]); /* the bits the GPU's own routing (cuda_moe.cu) gets */
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
        /* Moonshot's KimiMoEGate renormalizes only when top-k > 1 */
        const int renorm = cfg->norm_topk_prob && (cfg->arch == DF_ARCH_DEEPSEEK || K > 1);
        for (int k = 0; k < K; k++) {
            if (renorm) w[k] = w[k] / (sum + 1e-20f);
            w[k] *= cfg->routed_scaling_factor;
        }
    }
    free(s);
}

void eng_act(const df_engine *e, float *g, const float *u, int64_t n) {
    const df_config *cfg = e->cfg;
    if (cfg->act != DF_ACT_SITU) {
        e->be->silu_mul(g, g, u, n);
        return;
    }
    /* SiTU (Moonshot's SituAndMul): beta*tanh(g/beta)*sigmoid(g) * (lb*tanh(u/lb) if lb set, else u) */
    const float b = cfg->situ_beta, lb = cfg->situ_linear_beta;
    for (int64_t i = 0; i < n; i++) {
        const float gv = g[i], uv = lb != 0.0f ? lb * tanhf(u[i] / lb) : u[i];
        g[i] = b * tanhf(gv / b) * (1.0f / (1.0f + expf(-gv))) * uv;
    }
}

/* Routed expert x of a layer resident in device memory (the backend's first tier, df_backend.dev_pin):
 * pin its three matrices and describe them in *v (no host data), 1; else 0 (nothing pinned). */
static int dev_pin_expert(const df_engine *e, int layer, int x, df_expert *v) {
    if (!e->be->dev_pin) return 0;
    if (!e->be->dev_pin(DF_DEVKEY(e->dev_tag, layer, x, 0), &v->gate)) return 0;
    if (!e->be->dev_pin(DF_DEVKEY(e->dev_tag, layer, x, 1), &v->up)) {
        e->be->dev_unpin(DF_DEVKEY(e->dev_tag, layer, x, 0));
        return 0;
    }
    if (!e->be->dev_pin(DF_DEVKEY(e->dev_tag, layer, x, 2), &v->down)) {
        e->be->dev_unpin(DF_DEVKEY(e->dev_tag, layer, x, 0));
        e->be->dev_unpin(DF_DEVKEY(e->dev_tag, layer, x, 1));
        return 0;
    }
    return 1;
}

static void dev_unpin_expert(const df_engine *e, int layer, int x) {
    for (int p = 0; p < 3; p++) e->be->dev_unpin(DF_DEVKEY(e->dev_tag, layer, x, p));
}

/* 1 when expert x of the layer is resident in device memory now (an I/O hint: it may be evicted later); asked
 * without pinning it or counting a use (dev_has). */
int eng_dev_resident(const df_engine *e, int layer, int x) {
    return e->be->dev_has && e->be->dev_has(DF_DEVKEY(e->dev_tag, layer, x, 0)) && e->be->dev_has(DF_DEVKEY(e->dev_tag, layer, x, 1)) &&
           e->be->dev_has(DF_DEVKEY(e->dev_tag, layer, x, 2));
}

/* out = down(act(gate x, up x)) for T rows (act: SwiGLU or SiTU, eng_act). pool NULL = on the calling thread (inside a pool task);
 * the weight bytes touched are added to *bytes. */
static int mlp(df_engine *e, df_pool *pool, const df_weight *gate, const df_weight *up, const df_weight *down,
               const float *x, int T, float *out, uint64_t *bytes) {
    const int64_t I = gate->rows;
    if (e->be->mlp) {
        const int situ = e->cfg->act == DF_ACT_SITU;
        if (e->be->mlp(gate, up, down, situ, e->cfg->situ_beta, e->cfg->situ_linear_beta, x, T, out) == 0) {
            *bytes += df_weight_bytes(gate) + df_weight_bytes(up) + df_weight_bytes(down);
            return DF_OK;
        }
        if (!gate->data) return DF_EINVAL; /* GPU-resident weights: no host copy to compute on */
    }
    float *g = malloc(sizeof(float) * (size_t)(T * I)), *u = malloc(sizeof(float) * (size_t)(T * I));
    if (!g || !u) { free(g); free(u); return DF_ENOMEM; }
    e->be->matmul(pool, gate, x, T, g);
    e->be->matmul(pool, up, x, T, u);
    eng_act(e, g, u, (int64_t)T * I);
    e->be->matmul(pool, down, g, T, out);
    *bytes += df_weight_bytes(gate) + df_weight_bytes(up) + df_weight_bytes(down);
    free(g);
    free(u);
    return DF_OK;
}

/* One chunk of acquired experts (+ the shared expert when `shared` is set), computed as
 * independent items: item i < n is expert xs[i] on its grouped rows, item n is the shared
 * expert on all T rows. Each item's arithmetic is the same whichever thread runs it; the
 * caller accumulates the outputs in ascending expert order afterwards. */
typedef struct {
    df_engine *e;
    df_pool *pool;               /* for the matmuls: NULL when the items themselves run in parallel */
    const df_layer_weights *lw;
    const float *h;              /* [T, D] layer input (the shared expert's) */
    const float *hx;             /* [T, Wd] routed experts' input (h, or its latent projection) */
    int T, D, Wd, n, shared;
    const int *xs, *count, *start, *rows;
    const df_expert *views;
    float **ye;                  /* [n] outputs [count[xs[i]], Wd] */
    float *sh;                   /* shared expert output [T, D] */
    uint64_t *bytes;             /* [n + 1] weight bytes per item */
    int *rc;                     /* [n + 1] */
} ex_job;

static void ex_task(void *ctx, int64_t i0, int64_t i1, int tid) {
    ex_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        if (i == j->n) { /* the shared expert */
            j->rc[i] = mlp(j->e, j->pool, &j->lw->gate, &j->lw->up, &j->lw->down, j->h, j->T, j->sh, &j->bytes[i]);
            continue;
        }
        const int x = j->xs[i], n = j->count[x];
        float *xe = malloc(sizeof(float) * (size_t)n * j->Wd);
        if (!xe) { j->rc[i] = DF_ENOMEM; continue; }
        for (int r = 0; r < n; r++)
            memcpy(xe + (int64_t)r * j->Wd, j->hx + (int64_t)j->rows[j->start[x] + r] * j->Wd, sizeof(float) * j->Wd);
        j->rc[i] = mlp(j->e, j->pool, &j->views[i].gate, &j->views[i].up, &j->views[i].down, xe, n, j->ye[i], &j->bytes[i]);
        free(xe);
    }
}

/* The weights of a chunk's items in ex_task's order: item i < n is expert xs[i] (its view), item n the shared expert
 * when the chunk carries it. */
static void item_weights(const ex_job *j, const df_weight **wg, const df_weight **wu, const df_weight **wdn) {
    for (int i = 0; i < j->n; i++) {
        wg[i] = &j->views[i].gate;
        wu[i] = &j->views[i].up;
        wdn[i] = &j->views[i].down;
    }
    if (j->shared) {
        wg[j->n] = &j->lw->gate;
        wu[j->n] = &j->lw->up;
        wdn[j->n] = &j->lw->down;
    }
}

/* The items were computed by one backend call: their weight bytes and status, as ex_task fills them. */
static void items_done(ex_job *j, int items, const df_weight *const *wg, const df_weight *const *wu,
                       const df_weight *const *wdn) {
    for (int i = 0; i < items; i++) {
        j->bytes[i] = df_weight_bytes(wg[i]) + df_weight_bytes(wu[i]) + df_weight_bytes(wdn[i]);
        j->rc[i] = DF_OK;
    }
}

/* The chunk's items (as ex_task computes them) in one df_backend.mlp_group call from the calling thread: one
 * copy of every item's input to the device, the items' kernels back to back, one copy back, one synchronisation.
 * The routed experts' rows of hx are gathered into one buffer (item i's input: its count[xs[i]] rows, width Wd),
 * except for an expert that all T rows route to, whose input is hx itself (mlp_group stages an input shared by
 * several items once);
 * the outputs land where ex_task puts them (ye[i], sh), with the same bits (mlp_group gives each item mlp's bits),
 * and bytes[] / rc[] are filled as ex_task fills them. 0, or -1 when it cannot (nothing usable was computed: the
 * caller runs ex_task). */
static int ex_group(ex_job *j, int items) {
    df_engine *e = j->e;
    const df_config *cfg = e->cfg;
    int64_t tot = 0;
    for (int i = 0; i < j->n; i++) tot += j->count[j->xs[i]];
    const df_weight **wg = malloc(sizeof(df_weight *) * (size_t)items * 3);
    const float **xin = malloc(sizeof(float *) * (size_t)items);
    float **outs = malloc(sizeof(float *) * (size_t)items);
    int *Ts = malloc(sizeof(int) * (size_t)items);
    float *xg = malloc(sizeof(float) * (size_t)(tot > 0 ? tot : 1) * j->Wd);
    int rc = -1;
    if (wg && xin && outs && Ts && xg) {
        const df_weight **wu = wg + items, **wdn = wg + 2 * items;
        int64_t off = 0;
        for (int i = 0; i < j->n; i++) {
            const int x = j->xs[i], n = j->count[x];
            /* an expert that every row routes to, in order (always so for one token): hx itself, so that the backend
             * sees one input shared by these items (and the shared expert when hx is h) and stages it once */
            int all = n == j->T;
            for (int r = 0; r < n && all; r++) all = j->rows[j->start[x] + r] == r;
            float *xe = xg + off * j->Wd;
            if (!all)
                for (int r = 0; r < n; r++)
                    memcpy(xe + (int64_t)r * j->Wd, j->hx + (int64_t)j->rows[j->start[x] + r] * j->Wd, sizeof(float) * j->Wd);
            off += n;
            xin[i] = all ? j->hx : xe;
            Ts[i] = n;
            outs[i] = j->ye[i];
        }
        item_weights(j, wg, wu, wdn);
        if (j->shared) { /* item n: the shared expert on all T rows of h */
            xin[j->n] = j->h;
            Ts[j->n] = j->T;
            outs[j->n] = j->sh;
        }
        const int situ = cfg->act == DF_ACT_SITU;
        rc = e->be->mlp_group(items, wg, wu, wdn, situ, cfg->situ_beta, cfg->situ_linear_beta, xin, Ts, outs);
        if (rc == 0) items_done(j, items, wg, wu, wdn);
    }
    free(wg); free(xin); free(outs); free(Ts); free(xg);
    return rc == 0 ? 0 : -1;
}

/* The chunk's items (every routed expert of a one-token layer, in ascending expert order as the combine below takes
 * them, then the shared expert) in one df_backend.moe_resid call: their weighted sum and the shared expert's output
 * added into the device residual (the bits of the host combine and forward's residual add), nothing copied back.
 * bytes[] / rc[] as ex_group fills them. 0, or -1 when it cannot (nothing was added: the caller runs ex_group). */
static int resid_group(ex_job *j, int items, const int *used, const int *start, const float *rw) {
    df_engine *e = j->e;
    const df_config *cfg = e->cfg;
    if (items > 33) return -1;
    for (int i = 0; i < j->n; i++)
        if (j->xs[i] != used[i]) return -1; /* the combine's order: ascending expert ids */
    const df_weight *wg[33], *wu[33], *wdn[33];
    float w[33];
    item_weights(j, wg, wu, wdn);
    for (int i = 0; i < j->n; i++) w[i] = rw[start[used[i]]];
    const int situ = cfg->act == DF_ACT_SITU;
    if (e->be->moe_resid(items, wg, wu, wdn, situ, cfg->situ_beta, cfg->situ_linear_beta, j->h, w, j->shared,
                         (uint64_t)(uintptr_t)e) != 0)
        return -1;
    items_done(j, items, wg, wu, wdn);
    return 0;
}

/* The n experts ids of layer count as touched (engine.h touched, touched_n). */
static void mark_touched(df_engine *e, int layer, const int *ids, int n) {
    if (!e->touched) return;
    const int E = e->cfg->n_routed_experts;
    for (int i = 0; i < n; i++) {
        unsigned char *t = &e->touched[(int64_t)layer * E + ids[i]];
        if (!*t) { *t = 1; e->touched_n++; }
    }
}

void eng_moe_settle(df_engine *e) {
    if (!e->mr_npend || !e->be->moe_routed) return;
    const int L = e->cfg->num_hidden_layers, K = e->cfg->num_experts_per_tok;
    int ids[64];
    for (int l = 0; l < L && l < DF_MAX_LAYERS && e->mr_npend; l++) {
        if (!e->mr_pend[l] || !e->be->moe_routed((uint64_t)(uintptr_t)e, l, ids)) continue;
        e->mr_pend[l] = 0;
        e->mr_npend--;
        mark_touched(e, l, ids, K < 64 ? K : 64);
    }
}

int ffn_forward(df_engine *e, int layer, const float *h, int T, float *out, char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int D = cfg->hidden_size;
    eng_moe_settle(e);
    if (e->moe_queued) { /* routed, computed and added into the device residual by the layer's block */
        e->moe_queued = 0;
        e->weight_bytes += e->moe_bytes + (lw->has_shared || !lw->is_moe ? df_weight_bytes(&lw->gate) +
                                                                               df_weight_bytes(&lw->up) +
                                                                               df_weight_bytes(&lw->down)
                                                                         : 0);
        e->ffn_deferred = 1;
        if (!lw->is_moe) return DF_OK; /* the dense MLP */
        e->routed_picks += (uint64_t)cfg->num_experts_per_tok;
        e->routed_union += (uint64_t)cfg->num_experts_per_tok;
        if (layer < DF_MAX_LAYERS && !e->mr_pend[layer]) {
            e->mr_pend[layer] = 1;
            e->mr_npend++;
        }
        return DF_OK;
    }
    if (!lw->is_moe) {
        uint64_t b = 0;
        int rc = mlp(e, e->pool, &lw->gate, &lw->up, &lw->down, h, T, out, &b);
        e->weight_bytes += b;
        if (rc && err) snprintf(err, errlen, "dense MLP layer %d: out of memory", layer);
        return rc;
    }
    const int E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    /* latent MoE (K3): experts run at width Wd on routed_expert_down_proj(h); their weighted sum goes
     * through routed_expert_norm and routed_expert_up_proj; the shared experts see h itself */
    const int latent = cfg->latent_dim > 0, Wd = latent ? cfg->latent_dim : D;
    /* experts pinned at once: what the source allows (the store's budget), at least top-k */
    const int max_pin = e->max_acquire > 0 ? e->max_acquire : (K > 0 ? K : 1);
    /* Prompt-sized calls (experts with many rows each, row-parallel matmuls): acquire a few experts at a time,
     * so compute starts when the first ones arrive while the rest of the layer's reads (all requested above)
     * continue; decode-sized calls take as many as may be pinned (item-parallel over small experts). The sums
     * are the same whatever the chunking (accumulated in ascending expert order). */
    int maxc = T > PREFILL_CHUNK_T && df_pool_threads(e->pool) < max_pin ? df_pool_threads(e->pool) : max_pin;
    const int nthreads = df_pool_threads(e->pool);
    int rc = DF_OK;
    float *logits = malloc(sizeof(float) * (size_t)T * E);
    int *ids = malloc(sizeof(int) * (size_t)T * K);
    float *wts = malloc(sizeof(float) * (size_t)T * K);
    int *count = calloc((size_t)E, sizeof(int));
    int *used = malloc(sizeof(int) * (size_t)E);
    int *rows = malloc(sizeof(int) * (size_t)T * K);      /* token of each (expert, slot), grouped */
    float *rw = malloc(sizeof(float) * (size_t)T * K);    /* its weight */
    int *start = malloc(sizeof(int) * (size_t)(E + 1));
    float *yall = malloc(sizeof(float) * (size_t)T * K * Wd); /* expert outputs, grouped like rows */
    float *hx = latent ? malloc(sizeof(float) * (size_t)T * Wd) : NULL;   /* latent input */
    float *acc = latent ? malloc(sizeof(float) * (size_t)T * Wd) : out;   /* routed sum */
    float **ye = malloc(sizeof(float *) * (size_t)(E + 1));
    df_expert *views = malloc(sizeof(df_expert) * (size_t)(E + 1));
    uint64_t *bytes = calloc((size_t)E + 2, sizeof(uint64_t));
    int *rcs = calloc((size_t)E + 2, sizeof(int));
    float *sh = lw->has_shared ? malloc(sizeof(float) * (size_t)T * D) : NULL;
    int *guess = NULL, n_guess = 0; /* lookahead guesses for layer + 1 (prompt-sized calls) */
    int *rows_req = malloc(sizeof(int) * (size_t)E), *acq_ids = malloc(sizeof(int) * (size_t)(E + 1));
    int *pinned = calloc((size_t)E + 1, sizeof(int));
    int *xo = malloc(sizeof(int) * (size_t)(E + 1)); /* the experts in the order of the chunks */
    df_expert *aviews = malloc(sizeof(df_expert) * (size_t)(E + 1));
    if (!xo || !rows_req || !acq_ids || !pinned || !aviews || !logits || !ids || !wts || !count || !used || !rows || !rw || !start || !yall || !ye || !views || !bytes ||
        !rcs || (lw->has_shared && !sh) || (latent && (!hx || !acc))) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "MoE layer %d: out of memory for %d tokens", layer, T);
        goto done;
    }
    double tr = df_now();
    if (e->ffn_logits) memcpy(logits, e->ffn_logits, sizeof(float) * (size_t)T * E); /* from the layer's MLA block */
    else eng_matmul(e, &lw->router, h, T, logits);
    moe_route(cfg, logits, lw->router_bias, T, ids, wts);
    e->phase_s[DF_PHASE_ROUTER] += df_now() - tr;
    /* group rows by expert (ascending expert id; tokens ascending within an expert) */
    for (int i = 0; i < T * K; i++) count[ids[i]]++;
    int n_used = 0;
    start[0] = 0;
    for (int x = 0; x < E; x++) {
        start[x + 1] = start[x] + count[x];
        if (count[x]) used[n_used++] = x;
    }
    e->routed_picks += (uint64_t)T * (uint64_t)K;
    e->routed_union += (uint64_t)n_used;
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
    moe_guess_score(e, layer, count);
    mark_touched(e, layer, used, n_used);
    if (e->experts.request) {
        /* experts resident in device memory (the backend's first tier) are not read from the store */
        int n_req = 0;
        for (int i = 0; i < n_used; i++)
            if (!eng_dev_resident(e, layer, used[i])) rows_req[n_req++] = used[i];
        if (n_req) e->experts.request(e->experts.ctx, layer, rows_req, n_req, STORE_DEMAND);
    }
    /* prompt-sized lookahead: the next layer's likely experts, queued behind this layer's demand reads so
     * the drive keeps reading while this layer computes. The store gives a guess only a slot no pending
     * or unused expert holds, so no guess evicts anything needed; a guess that got no slot is asked again
     * after each chunk of this layer is released (its slots become free) when this layer's set fits the
     * cache, and guesses the next layer does not need are dropped by its demand request. */
    if (e->la_x && e->la_layer == layer + 1 && e->experts.request && (guess = malloc(sizeof(int) * (size_t)E))) {
        const double tg = df_now();
        n_guess = moe_guess_prompt(e, layer + 1, e->la_x, T, guess);
        /* a next layer whose set does not fit the cache: its surest max_pin guesses only (they take the slots this
         * layer releases once all its members have one; the next layer computes its members with a slot first, so
         * a right guess is not evicted before its use) */
        if (n_guess > max_pin) n_guess = max_pin;
        if (n_guess > 0) {
            e->experts.request(e->experts.ctx, layer + 1, guess, n_guess, STORE_PREFETCH);
            e->prefetch_issued += (uint64_t)n_guess;
        }
        e->phase_s[DF_PHASE_ROUTER] += df_now() - tg; /* router work (the caller books it apart from the experts') */
    }
    if (latent) eng_matmul(e, &lw->lat_down, h, T, hx);
    memset(acc, 0, sizeof(float) * (size_t)T * Wd);
    /* The order of the chunks: when the layer's set did not all get a slot at its request (a set larger than
     * the cache), the members that have one (read or being read) come first, then the rest in ascending
     * order, each group requested as the slots of the computed ones are released, so every member is read
     * once and the next group is read while the current one computes; a member with a slot never waits
     * behind one without (whose load could otherwise evict it unused). */
    int n_missing = 0, n_loading = 0, n_ready = 0;
    if (e->experts.present && n_used > 0) {
        unsigned char *pres = malloc((size_t)n_used);
        if (!pres) { rc = DF_ENOMEM; goto done; }
        e->experts.present(e->experts.ctx, layer, used, n_used, pres);
        for (int i = 0; i < n_used; i++) {
            if (eng_dev_resident(e, layer, used[i])) pres[i] = 2;
            n_missing += !pres[i];
            n_loading += pres[i] == 1;
            n_ready += pres[i] == 2;
        }
        /* in memory first, then those being read (in the order of their requests), then those without a slot */
        int k = 0;
        for (int want = 2; want >= 0; want--)
            for (int i = 0; i < n_used; i++) if (pres[i] == want) xo[k++] = used[i];
        free(pres);
    } else {
        memcpy(xo, used, sizeof(int) * (size_t)n_used);
    }
    /* A decode step whose members are still being read: the members in memory first, as one chunk, then the others
     * in small chunks (one per thread on the CPU; two with a grouped device op, whose cost is mostly copying the
     * weights in), so each computes while the rest are read (acquire waits only for its chunk). A prompt on a
     * device: chunks of 4, so slots are released (and the next reads start) sooner. */
    int first_nc = 0;
    if (n_loading && T <= PREFILL_CHUNK_T) {
        const int step = e->be->mlp_group ? 2 : nthreads;
        if (step < maxc) {
            first_nc = n_ready < maxc ? n_ready : maxc;
            maxc = step;
        }
    } else if (T > PREFILL_CHUNK_T && e->be->mlp_group && maxc > 4) {
        maxc = 4;
    }
    /* chunks of experts: acquire, compute (items in parallel across the pool when there are enough of
     * them and each is small; else one at a time with row-parallel matmuls), release; the outputs are
     * accumulated afterwards in ascending expert order (the same additions in the same order whatever the
     * chunking and the order of the chunks) */
    for (int u0 = 0, nc = 0; u0 < n_used || (u0 == 0 && lw->has_shared); u0 += nc) {
        const int want = u0 == 0 && first_nc > 0 ? first_nc : maxc;
        nc = n_used - u0 < want ? n_used - u0 : want;
        const int with_shared = lw->has_shared && u0 + nc >= n_used; /* the last chunk carries the shared expert */
        int n_acq = 0; /* experts of the chunk taken from the store (the rest are pinned in device memory) */
        if (nc > 0) {
            for (int i = 0; i < nc; i++) {
                pinned[i] = dev_pin_expert(e, layer, xo[u0 + i], &views[i]);
                if (!pinned[i]) acq_ids[n_acq++] = xo[u0 + i];
            }
            if (n_acq > 0) {
                double t0 = now_s();
                rc = e->experts.acquire(e->experts.ctx, layer, acq_ids, n_acq, aviews, err, errlen);
                e->io_wait_s += now_s() - t0;
                if (rc) {
                    for (int i = 0; i < nc; i++) if (pinned[i]) dev_unpin_expert(e, layer, xo[u0 + i]);
                    goto done;
                }
            }
            for (int i = 0, a = 0; i < nc; i++) {
                if (pinned[i]) continue;
                views[i] = aviews[a++];
                /* identities for device caches (the views' buffers are reused) */
                views[i].gate.dev_key = DF_DEVKEY(e->dev_tag, layer, xo[u0 + i], 0);
                views[i].up.dev_key = DF_DEVKEY(e->dev_tag, layer, xo[u0 + i], 1);
                views[i].down.dev_key = DF_DEVKEY(e->dev_tag, layer, xo[u0 + i], 2);
            }
        }
        int64_t biggest = 0;
        for (int i = 0; i < nc; i++) {
            ye[i] = yall + (int64_t)start[xo[u0 + i]] * Wd;
            int64_t w = (int64_t)count[xo[u0 + i]] * views[i].gate.rows * views[i].gate.cols;
            if (w > biggest) biggest = w;
        }
        if (with_shared && (int64_t)T * lw->gate.rows * lw->gate.cols > biggest) biggest = (int64_t)T * lw->gate.rows * lw->gate.cols;
        const int items = nc + with_shared;
        /* item-parallel when the matmuls would run on one thread anyway (the driver's threshold) or there are
         * items enough that whole items balance the threads: a decode step's 8 experts + a shared one (twice an
         * expert's bytes with an fp8 spine) on 2 threads left one thread idle a sixth of the time (experts 74-78 ms
         * per token item-parallel, 67-69 ms with each matmul split over the threads; bench/RESULTS.md) */
        const int par = nthreads > 1 && items > 1 && (biggest < 131072 || items >= 8 * nthreads);
        ex_job j = {e, par ? NULL : e->pool, lw, h, latent ? hx : h, T, D, Wd, nc, with_shared, xo + u0, count, start,
                    rows, views, ye, sh, bytes, rcs};
        memset(rcs, 0, sizeof(int) * (size_t)(items + 1));
        memset(bytes, 0, sizeof(uint64_t) * (size_t)(items + 1));
        /* one token's whole layer, every expert in device memory, with the next layer's block continuing on the
         * device (forward's defer_ok): the MoE output goes into the device residual, no round trip */
        if (e->defer_ok && T == 1 && !latent && u0 == 0 && nc == n_used && with_shared == lw->has_shared && n_acq == 0 &&
            resid_group(&j, items, used, start, rw) == 0) {
            e->ffn_deferred = 1;
        } else if (!e->be->mlp_group || T > GROUP_MAX_T || ex_group(&j, items)) {
            if (par) df_pool_run(e->pool, items, 1, ex_task, &j);
            else ex_task(&j, 0, items, 0);
        }
        if (n_acq > 0) e->experts.release(e->experts.ctx, layer, acq_ids, n_acq);
        for (int i = 0; i < nc; i++) if (pinned[i]) dev_unpin_expert(e, layer, xo[u0 + i]);
        /* members still without a slot: the released slots go to them, in chunk order (read while the
         * next chunk computes); once every member has one, n_missing = 0 */
        if (n_missing && nc > 0 && u0 + nc < n_used) {
            int n_rest = 0;
            for (int i = u0 + nc; i < n_used; i++)
                if (!eng_dev_resident(e, layer, xo[i])) rows_req[n_rest++] = xo[i];
            if (n_rest) {
                e->experts.request(e->experts.ctx, layer, rows_req, n_rest, STORE_DEMAND);
                unsigned char pres[64];
                n_missing = 0;
                for (int i0 = 0; i0 < n_rest; i0 += 64) {
                    const int m = n_rest - i0 < 64 ? n_rest - i0 : 64;
                    e->experts.present(e->experts.ctx, layer, rows_req + i0, m, pres);
                    for (int i = 0; i < m; i++) n_missing += !pres[i];
                }
            } else n_missing = 0;
        }
        /* only when every member of this layer has a slot: else a released slot is for this layer's members
         * still to be read, not for a guess. After the last chunk too: the guesses then read during the next
         * layer's attention */
        if (n_guess > 0 && nc > 0 && !n_missing)
            e->experts.request(e->experts.ctx, layer + 1, guess, n_guess, STORE_PREFETCH);
        for (int i = 0; i < items; i++) {
            e->weight_bytes += bytes[i];
            if (rcs[i] && !rc) rc = rcs[i];
        }
        if (rc) {
            if (err) snprintf(err, errlen, "MoE layer %d: out of memory for %d tokens", layer, T);
            goto done;
        }
        if (nc == 0) break;
        if (u0 + nc < n_used && eng_tick(e)) {
            rc = eng_cancelled(layer, err, errlen);
            goto done;
        }
    }
    if (e->ffn_deferred) goto done; /* added into the device residual */
    for (int i = 0; i < n_used; i++) {
        const int x = used[i];
        const float *y = yall + (int64_t)start[x] * Wd;
        for (int r = 0; r < count[x]; r++)
            e->be->axpy(acc + (int64_t)rows[start[x] + r] * Wd, rw[start[x] + r], y + (int64_t)r * Wd, Wd);
    }
    if (latent) {
        if (cfg->latent_norm)
            for (int t = 0; t < T; t++)
                e->be->rmsnorm(acc + (int64_t)t * Wd, acc + (int64_t)t * Wd, lw->lat_norm, Wd, cfg->rms_norm_eps);
        eng_matmul(e, &lw->lat_up, acc, T, out);
    }
    if (lw->has_shared)
        for (int64_t i = 0; i < (int64_t)T * D; i++) out[i] += sh[i];
done:
    free(logits); free(ids); free(wts); free(count); free(used); free(rows); free(rw); free(start);
    free(yall); free(ye); free(views); free(bytes); free(rcs); free(sh); free(hx); free(guess);
    free(rows_req); free(acq_ids); free(pinned); free(aviews); free(xo);
    if (latent) free(acc);
    return rc;
}

/* moe_guess, with each expert's vote count (rows that picked it) in votes_out[E] when not NULL */
static int guess_votes(df_engine *e, int layer, const float *x_resid, int T, int *used, int *votes_out) {
    const df_config *cfg = e->cfg;
    if (layer >= cfg->num_hidden_layers) return 0;
    const df_layer_weights *lw = &e->spine->layers[layer];
    if (!lw->is_moe) return 0;
    const int D = cfg->hidden_size, E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    float *h = malloc(sizeof(float) * (size_t)T * D), *logits = malloc(sizeof(float) * (size_t)T * E);
    int *ids = malloc(sizeof(int) * (size_t)T * K);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    int *votes = calloc((size_t)E, sizeof(int));
    float *wsum = calloc((size_t)E, sizeof(float));
    int n = 0;
    if (h && logits && ids && w && votes && wsum) {
        for (int t = 0; t < T; t++)
            e->be->rmsnorm(h + (int64_t)t * D, x_resid + (int64_t)t * D, lw->ffn_norm, D, cfg->rms_norm_eps);
        eng_matmul(e, &lw->router, h, T, logits);
        moe_route(cfg, logits, lw->router_bias, T, ids, w);
        for (int i = 0; i < T * K; i++) { votes[ids[i]]++; wsum[ids[i]] += w[i]; }
        for (int x = 0; x < E; x++) if (votes[x]) used[n++] = x;
        if (votes_out) memcpy(votes_out, votes, sizeof(int) * (size_t)E);
        /* most-voted first, then by summed routing weight (stable: ascending id among equals): the surest
         * guesses are read first, and the least sure are the likeliest to be still unread (dropped at no
         * cost) when the layer's real set comes */
        for (int i = 1; i < n; i++) {
            const int x = used[i];
            int k = i;
            for (; k > 0 && (votes[used[k - 1]] < votes[x] || (votes[used[k - 1]] == votes[x] && wsum[used[k - 1]] < wsum[x])); k--)
                used[k] = used[k - 1];
            used[k] = x;
        }
    }
    free(h); free(logits); free(ids); free(w); free(votes); free(wsum);
    return n;
}

int moe_guess(df_engine *e, int layer, const float *x_resid, int T, int *used) {
    return guess_votes(e, layer, x_resid, T, used, NULL);
}

/* measured precision of a guess that v rows voted for; prior 1 - 0.3 / v (0.7 for one vote, 0.96 for 8 or more:
 * about the random synthetic models' measured precision, the least predictable routing) worth GUESS_PRIOR_N
 * guesses */
enum { GUESS_PRIOR_N = 5 };
#define DF_GUESS_WASTE 0.02
static double guess_precision(const df_engine *e, int v) {
    const int b = v < DF_GUESS_VOTES ? v : DF_GUESS_VOTES;
    return (e->gs_needed[b] + (1.0 - 0.3 / b) * GUESS_PRIOR_N) / (e->gs_made[b] + GUESS_PRIOR_N);
}

int moe_guess_prompt(df_engine *e, int layer, const float *x_resid, int T, int *used) {
    const int E = e->cfg->n_routed_experts;
    if (!e->gs_votes && !(e->gs_votes = malloc(sizeof(int) * (size_t)E))) return 0;
    const int n = guess_votes(e, layer, x_resid, T, used, e->gs_votes);
    e->gs_layer = n > 0 ? layer : -1;
    /* used[] is most-voted first: keep a prefix whose expected wrong guesses stay within DF_GUESS_WASTE of
     * the expected needed experts of all the guesses */
    double need = 0, waste = 0;
    for (int i = 0; i < n; i++) need += guess_precision(e, e->gs_votes[used[i]]);
    int keep = 0;
    for (; keep < n; keep++) {
        const double w = 1.0 - guess_precision(e, e->gs_votes[used[keep]]);
        if (waste + w > DF_GUESS_WASTE * need) break;
        waste += w;
    }
    return keep;
}

void moe_guess_score(df_engine *e, int layer, const int *count) {
    if (!e->gs_votes || e->gs_layer != layer) return;
    for (int x = 0; x < e->cfg->n_routed_experts; x++) {
        const int v = e->gs_votes[x];
        if (v <= 0) continue;
        const int b = v < DF_GUESS_VOTES ? v : DF_GUESS_VOTES;
        e->gs_made[b]++;
        e->gs_needed[b] += count[x] > 0;
    }
    e->gs_layer = -1;
}

/* Decode lookahead: guess layer `layer`'s experts from the residual stream and request those a read would
 * bring in (not in GPU memory, not already in or on its way to a slot), surest first. */
void moe_prefetch(df_engine *e, int layer, const float *x_resid, int T, int max_n) {
    if (layer >= e->cfg->num_hidden_layers || !e->experts.request) return;
    const int E = e->cfg->n_routed_experts;
    int *used = malloc(sizeof(int) * (size_t)E);
    unsigned char *pres = malloc((size_t)E);
    if (!used || !pres) { free(used); free(pres); return; }
    const int n = moe_guess(e, layer, x_resid, T, used);
    if (n > 0 && (max_n <= 0 || n <= max_n)) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (!eng_dev_resident(e, layer, used[i])) used[m++] = used[i];
        if (m > 0 && e->experts.present) {
            e->experts.present(e->experts.ctx, layer, used, m, pres);
            int k = 0;
            for (int i = 0; i < m; i++)
                if (!pres[i]) used[k++] = used[i];
            m = k;
        }
        if (m > 0) {
            e->experts.request(e->experts.ctx, layer, used, m, STORE_PREFETCH);
            e->prefetch_issued += (uint64_t)m;
        }
    }
    free(used); free(pres);
}
