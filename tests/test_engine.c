/* test_engine.c — the forward pass on a tiny hand-built model (f32 / bf16 / mxfp4
 * weights) against an independent, plainly written reference in double
 * (non-absorbed MLA: k_nope and v expanded through kv_b for every position, as
 * transformers does), plus: T=1 decode == batched eval, grouped MoE requests
 * (each expert once per layer per call), routing details, sampler, logprob, and KDA's per-target builds against
 * plain loops. */
#include "engine/engine.h"
#include "deltafin.h"
#include "test_util.h"
#include "kernels/kda_math.h"

#include <string.h>

static uint64_t rs = 0x1234567ull;
static double urand(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) / 9007199254740992.0; }
static float frand(float sc) { return (float)((urand() * 2 - 1) * sc); }

static df_weight wf32(int64_t r, int64_t c, float sc) {
    float *d = malloc(sizeof(float) * r * c);
    for (int64_t i = 0; i < r * c; i++) d[i] = frand(sc);
    return (df_weight){DF_W_F32, r, c, d, NULL, 0};
}
static float *vec(int n, float base, float sc) {
    float *v = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) v[i] = base + frand(sc);
    return v;
}
/* Element (r,c) of an f32 weight */
#define W(w, r, c) (((const float *)(w).data)[(int64_t)(r) * (w).cols + (c)])

typedef struct { df_config cfg; df_spine sp; df_expert *ex; /* [L][E] */ int requests[8][64]; } tiny;

static void tiny_build(tiny *m, int q_lora, int yarn) {
    df_config *c = &m->cfg;
    memset(m, 0, sizeof *m);
    strcpy(c->model_type, "deepseek_v3");
    c->vocab_size = 50; c->hidden_size = 32; c->intermediate_size = 24; c->moe_intermediate_size = 16;
    c->num_hidden_layers = 3; c->num_attention_heads = 2; c->n_routed_experts = 8; c->n_shared_experts = 1;
    c->num_experts_per_tok = 3; c->n_group = 2; c->topk_group = 1; c->first_k_dense_replace = 1; c->moe_layer_freq = 1;
    c->norm_topk_prob = 1; c->routed_scaling_factor = 2.5f; c->q_lora_rank = q_lora; c->kv_lora_rank = 16;
    c->qk_nope_head_dim = 8; c->qk_rope_head_dim = 4; c->v_head_dim = 8; c->rope_theta = 10000;
    c->rope_yarn = yarn; c->rope_factor = 4; c->rope_original_max_pos = 16; c->rope_beta_fast = 32; c->rope_beta_slow = 1;
    c->rope_mscale = yarn ? 1.0 : 0; c->rope_mscale_all_dim = yarn ? 0.7 : 0; c->rope_truncate = 1;
    c->rms_norm_eps = 1e-6f; c->max_position_embeddings = 256;
    int H = 2, qd = 12, D = 32;
    m->sp.embed = wf32(50, D, 1.0f);
    m->sp.final_norm = vec(D, 1.0f, 0.2f);
    m->sp.lm_head = wf32(50, D, 0.4f);
    m->sp.layers = calloc(3, sizeof(df_layer_weights));
    m->ex = calloc(3 * 8, sizeof(df_expert));
    for (int l = 0; l < 3; l++) {
        df_layer_weights *lw = &m->sp.layers[l];
        lw->attn_norm = vec(D, 1.0f, 0.2f);
        lw->ffn_norm = vec(D, 1.0f, 0.2f);
        if (q_lora) { lw->q_a = wf32(q_lora, D, 0.4f); lw->q_a_norm = vec(q_lora, 1.0f, 0.2f); lw->q_b = wf32(H * qd, q_lora, 0.4f); }
        else lw->q = wf32(H * qd, D, 0.4f);
        lw->kv_a = wf32(16 + 4, D, 0.4f);
        lw->kv_a_norm = vec(16, 1.0f, 0.2f);
        lw->kv_b = wf32(H * (8 + 8), 16, 0.4f);
        lw->o = wf32(D, H * 8, 0.4f);
        lw->is_moe = l >= 1;
        if (!lw->is_moe) { lw->gate = wf32(24, D, 0.4f); lw->up = wf32(24, D, 0.4f); lw->down = wf32(D, 24, 0.4f); }
        else {
            lw->has_shared = 1;
            lw->gate = wf32(16, D, 0.4f); lw->up = wf32(16, D, 0.4f); lw->down = wf32(D, 16, 0.4f);
            lw->router = wf32(8, D, 0.6f);
            lw->router_bias = vec(8, 0.0f, 0.1f);
            for (int e = 0; e < 8; e++) {
                m->ex[l * 8 + e].gate = wf32(16, D, 0.4f);
                m->ex[l * 8 + e].up = wf32(16, D, 0.4f);
                m->ex[l * 8 + e].down = wf32(D, 16, 0.4f);
            }
        }
    }
}

static void wfree(df_weight *w) { free((void *)w->data); }
static void tiny_free(tiny *m) {
    wfree(&m->sp.embed); wfree(&m->sp.lm_head); free(m->sp.final_norm);
    for (int l = 0; l < 3; l++) {
        df_layer_weights *lw = &m->sp.layers[l];
        free(lw->attn_norm); free(lw->ffn_norm); free(lw->q_a_norm); free(lw->kv_a_norm); free(lw->router_bias);
        wfree(&lw->q_a); wfree(&lw->q_b); wfree(&lw->q); wfree(&lw->kv_a); wfree(&lw->kv_b); wfree(&lw->o);
        wfree(&lw->gate); wfree(&lw->up); wfree(&lw->down); wfree(&lw->router);
        for (int e = 0; e < 8; e++) { wfree(&m->ex[l * 8 + e].gate); wfree(&m->ex[l * 8 + e].up); wfree(&m->ex[l * 8 + e].down); }
    }
    free(m->sp.layers); free(m->ex);
}

static int t_request(void *ctx, int layer, const int *ids, int n, store_prio prio) {
    tiny *m = ctx;
    if (prio == STORE_DEMAND) for (int i = 0; i < n; i++) m->requests[layer][ids[i]]++;
    return 0;
}
static int t_acquire(void *ctx, int layer, const int *ids, int n, df_expert *v, char *err, size_t errlen) {
    tiny *m = ctx;
    for (int i = 0; i < n; i++) v[i] = m->ex[layer * 8 + ids[i]];
    return 0;
}
static void t_release(void *ctx, int layer, const int *ids, int n) {}

/* ---------------- independent reference in double ---------------- */
static void ref_rmsnorm(double *o, const double *x, const float *w, int n, double eps) {
    double ss = 0; for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * r * w[i];
}
static void ref_mv(double *y, const df_weight *w, const double *x) {
    for (int64_t r = 0; r < w->rows; r++) { double s = 0; for (int64_t c = 0; c < w->cols; c++) s += W(*w, r, c) * x[c]; y[r] = s; }
}
static double silu(double z) { return z / (1 + exp(-z)); }
static void ref_mlp(double *out, const df_weight *g, const df_weight *u, const df_weight *d, const double *x) {
    double a[64], b[64];
    ref_mv(a, g, x); ref_mv(b, u, x);
    for (int i = 0; i < g->rows; i++) a[i] = silu(a[i]) * b[i];
    ref_mv(out, d, a);
}
/* rope in the checkpoint's pair order */
static void ref_rope(double *x, const df_rope *r, int pos) {
    for (int i = 0; i < r->dim / 2; i++) {
        double f = (double)(r->inv_freq[i] * (float)pos), c = cos(f) * r->attention_factor, s = sin(f) * r->attention_factor;
        double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s; x[2 * i + 1] = b * c + a * s;
    }
}

static void ref_forward(const tiny *m, const df_rope *rope, const int32_t *ids, int T, double *logits /* [T,V] */) {
    const df_config *c = &m->cfg;
    const int D = 32, H = 2, dn = 8, dr = 4, dv = 8, kvl = 16, qd = 12;
    double x[16][32], h[32], tmp[64];
    double K[16][2][12], V[16][2][8], Q[16][2][12];
    for (int t = 0; t < T; t++) for (int i = 0; i < D; i++) x[t][i] = W(m->sp.embed, ids[t], i);
    for (int l = 0; l < 3; l++) {
        const df_layer_weights *lw = &m->sp.layers[l];
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(h, x[t], lw->attn_norm, D, c->rms_norm_eps);
            double q[24];
            if (c->q_lora_rank) { double qa[32]; ref_mv(qa, &lw->q_a, h); ref_rmsnorm(qa, qa, lw->q_a_norm, c->q_lora_rank, 1e-6); ref_mv(q, &lw->q_b, qa); }
            else ref_mv(q, &lw->q, h);
            double kva[20], cn[16], kvb[32];
            ref_mv(kva, &lw->kv_a, h);
            ref_rmsnorm(cn, kva, lw->kv_a_norm, kvl, 1e-6);
            ref_mv(kvb, &lw->kv_b, cn);
            double kpe[4]; memcpy(kpe, kva + kvl, sizeof kpe); ref_rope(kpe, rope, t);
            for (int hh = 0; hh < H; hh++) {
                for (int d = 0; d < dn; d++) { K[t][hh][d] = kvb[hh * 16 + d]; Q[t][hh][d] = q[hh * qd + d]; }
                for (int d = 0; d < dr; d++) { K[t][hh][dn + d] = kpe[d]; Q[t][hh][dn + d] = q[hh * qd + dn + d]; }
                ref_rope(&Q[t][hh][dn], rope, t);
                for (int d = 0; d < dv; d++) V[t][hh][d] = kvb[hh * 16 + dn + d];
            }
        }
        for (int t = 0; t < T; t++) {
            double att[16];
            for (int hh = 0; hh < H; hh++) {
                double p[16], mx = -1e300, s = 0;
                for (int j = 0; j <= t; j++) { double d = 0; for (int k = 0; k < qd; k++) d += Q[t][hh][k] * K[j][hh][k]; p[j] = d * rope->softmax_scale; if (p[j] > mx) mx = p[j]; }
                for (int j = 0; j <= t; j++) { p[j] = exp(p[j] - mx); s += p[j]; }
                for (int d = 0; d < dv; d++) { double a = 0; for (int j = 0; j <= t; j++) a += p[j] / s * V[j][hh][d]; att[hh * dv + d] = a; }
            }
            ref_mv(tmp, &lw->o, att);
            for (int i = 0; i < D; i++) x[t][i] += tmp[i];
        }
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(h, x[t], lw->ffn_norm, D, c->rms_norm_eps);
            double out[32] = {0};
            if (!lw->is_moe) ref_mlp(out, &lw->gate, &lw->up, &lw->down, h);
            else {
                double lg[8], s[8], ch[8];
                ref_mv(lg, &lw->router, h);
                for (int e = 0; e < 8; e++) { s[e] = 1 / (1 + exp(-lg[e])); ch[e] = s[e] + lw->router_bias[e]; }
                /* 2 groups of 4: top-2 sum; keep 1 group */
                double gs[2];
                for (int g = 0; g < 2; g++) { double a = -1e300, b = -1e300; for (int e = g * 4; e < g * 4 + 4; e++) { if (ch[e] > a) { b = a; a = ch[e]; } else if (ch[e] > b) b = ch[e]; } gs[g] = a + b; }
                int keep = gs[1] > gs[0];
                for (int e = 0; e < 8; e++) if (e / 4 != keep) ch[e] = -INFINITY;
                int sel[3]; double ws[3], sum = 0;
                for (int k = 0; k < 3; k++) { int b = -1; for (int e = 0; e < 8; e++) { int u = 0; for (int q = 0; q < k; q++) u |= sel[q] == e; if (!u && (b < 0 || ch[e] > ch[b])) b = e; } sel[k] = b; ws[k] = s[b]; sum += s[b]; }
                for (int k = 0; k < 3; k++) {
                    double y[32], w = ws[k] / (sum + 1e-20) * c->routed_scaling_factor;
                    const df_expert *ex = &m->ex[l * 8 + sel[k]];
                    ref_mlp(y, &ex->gate, &ex->up, &ex->down, h);
                    for (int i = 0; i < D; i++) out[i] += w * y[i];
                }
                double y[32]; ref_mlp(y, &lw->gate, &lw->up, &lw->down, h);
                for (int i = 0; i < D; i++) out[i] += y[i];
            }
            for (int i = 0; i < D; i++) x[t][i] += out[i];
        }
    }
    for (int t = 0; t < T; t++) { ref_rmsnorm(h, x[t], m->sp.final_norm, D, c->rms_norm_eps); ref_mv(logits + t * 50, &m->sp.lm_head, h); }
}

static void run_case(int q_lora, int yarn, const char *backend) {
    tiny m;
    tiny_build(&m, q_lora, yarn);
    df_engine e = {0};
    e.cfg = &m.cfg; e.spine = &m.sp; e.be = df_backend_get(backend); e.pool = df_pool_new(2);
    e.experts = (df_expert_src){&m, t_request, t_acquire, t_release, NULL};
    char err[256] = "";
    CHECK(rope_init(&e.rope, &m.cfg, err, sizeof err) == 0, "rope_init %s", err);
    enum { T = 9 };
    int32_t ids[T] = {3, 17, 42, 0, 49, 8, 8, 21, 33};
    double ref[T * 50];
    ref_forward(&m, &e.rope, ids, T, ref);
    df_kvcache kv;
    kv_init(&kv, &m.cfg, 64);
    float lg[T * 50];
    int rc = forward(&e, &kv, 0, ids, T, lg, 1, NULL, NULL, err, sizeof err);
    CHECK(rc == 0, "forward: %s", err);
    double md = 0, mag = 0;
    for (int i = 0; i < T * 50; i++) { md = fmax(md, fabs(lg[i] - ref[i])); mag = fmax(mag, fabs(ref[i])); }
    printf("%s q_lora=%d yarn=%d: max |logit - ref| = %.3g (max |logit| %.3g, scale %.4f, attn factor %.4f)\n", backend, q_lora, yarn, md,
           mag, e.rope.softmax_scale, e.rope.attention_factor);
    CHECK(md < 1e-4 * (1 + mag), "batched logits vs reference: %g", md);
    /* each used expert requested exactly once per layer for the whole batch */
    int multi = 0;
    for (int l = 1; l < 3; l++) for (int x = 0; x < 8; x++) multi |= m.requests[l][x] > 1;
    CHECK(!multi, "an expert was requested more than once in one eval");
    /* decode path: prompt of 4, then one token at a time == batched */
    df_kvcache kv2;
    kv_init(&kv2, &m.cfg, 64);
    float l1[4 * 50], l2[50];
    rc = forward(&e, &kv2, 0, ids, 4, l1, 0, NULL, NULL, err, sizeof err);
    double md2 = 0;
    for (int i = 0; i < 50; i++) md2 = fmax(md2, fabs(l1[i] - lg[3 * 50 + i]));
    for (int t = 4; t < T; t++) {
        rc |= forward(&e, &kv2, t, ids + t, 1, l2, 0, NULL, NULL, err, sizeof err);
        for (int i = 0; i < 50; i++) md2 = fmax(md2, fabs(l2[i] - lg[t * 50 + i]));
    }
    CHECK(rc == 0, "decode: %s", err);
    printf("  decode-vs-batched max diff %.3g\n", md2);
    CHECK(md2 < 1e-5 * (1 + mag), "T=1 decode vs batched: %g", md2);
    /* a long batch (attention runs in chunks of 256) == token-by-token decode, bit for bit */
    {
        enum { LT = 300 };
        int32_t *lid = malloc(sizeof(int32_t) * LT);
        for (int i = 0; i < LT; i++) lid[i] = (int32_t)(urand() * 50);
        float *la = malloc(sizeof(float) * LT * 50), one[50];
        df_kvcache k3, k4;
        kv_init(&k3, &m.cfg, 512);
        kv_init(&k4, &m.cfg, 512);
        int r3 = forward(&e, &k3, 0, lid, LT, la, 1, NULL, NULL, err, sizeof err);
        int same = r3 == 0;
        for (int t = 0; t < LT && same; t++) {
            if (forward(&e, &k4, t, lid + t, 1, one, 0, NULL, NULL, err, sizeof err)) same = 0;
            else same = !memcmp(one, la + (int64_t)t * 50, sizeof one);
        }
        CHECK(same, "300-token batch (chunked attention) differs from token-by-token decode");
        kv_free(&k3); kv_free(&k4); free(la); free(lid);
    }
    /* context limit */
    rc = forward(&e, &kv2, 64, ids, 1, l2, 0, NULL, NULL, err, sizeof err);
    CHECK(rc == DF_ECONTEXT, "context full -> DF_ECONTEXT (%d)", rc);
    int32_t bad = 50;
    rc = forward(&e, &kv2, 0, &bad, 1, l2, 0, NULL, NULL, err, sizeof err);
    CHECK(rc == DF_EINVAL, "bad id -> DF_EINVAL");
    kv_free(&kv); kv_free(&kv2);
    rope_free(&e.rope);
    df_pool_free(e.pool);
    tiny_free(&m);
}

static void test_rope_values(void) {
    /* YaRN constants as transformers computes them (K2-like: dim 64, theta 50000, factor 32, orig 4096, beta 1/1, mscale 1/1) */
    df_config c = {0};
    c.qk_rope_head_dim = 64; c.qk_nope_head_dim = 128; c.rope_theta = 50000; c.rope_yarn = 1; c.rope_factor = 32;
    c.rope_original_max_pos = 4096; c.rope_beta_fast = 1; c.rope_beta_slow = 1; c.rope_mscale = 1; c.rope_mscale_all_dim = 1;
    c.rope_truncate = 1; c.max_position_embeddings = 131072;
    df_rope r;
    rope_init(&r, &c, NULL, 0);
    double m = 0.1 * log(32.0) + 1;
    CHECK_NEAR(r.softmax_scale, m * m / sqrt(192.0), 1e-12, "K2 softmax scale");
    CHECK_NEAR(r.attention_factor, 1.0, 0, "mscale == mscale_all_dim -> cos/sin factor 1");
    /* low = floor(corr(1)) = floor(64 ln(4096/2pi) / (2 ln 50000)) = 19 = high (beta 1/1) -> ramp step at i=19 */
    CHECK_NEAR(r.inv_freq[0], 1.0, 1e-7, "freq 0 extrapolated");
    CHECK_NEAR(r.inv_freq[31], 1.0 / 32 / pow(50000.0, 62.0 / 64), 1e-12, "freq 31 interpolated");
    CHECK_NEAR(r.inv_freq[18], pow(50000.0, -36.0 / 64), 1e-9, "freq 18 extrapolated");
    CHECK_NEAR(r.inv_freq[20], pow(50000.0, -40.0 / 64) / 32, 1e-9, "freq 20 interpolated");
    rope_free(&r);
    c.rope_mscale = 0; c.rope_mscale_all_dim = 0;
    rope_init(&r, &c, NULL, 0);
    CHECK_NEAR(r.attention_factor, m, 1e-6, "no mscale -> cos/sin factor mscale(factor)");
    CHECK_NEAR(r.softmax_scale, 1 / sqrt(192.0), 1e-12, "no mscale_all_dim -> plain scale");
    rope_free(&r);
}

static void test_route(void) {
    df_config c = {0};
    c.n_routed_experts = 8; c.num_experts_per_tok = 2; c.n_group = 4; c.topk_group = 2; c.norm_topk_prob = 0;
    c.routed_scaling_factor = 1.5f;
    /* sigmoid(0)=.5; groups {0,1} {2,3} {4,5} {6,7}; bias pushes group 3 up for selection only */
    float lg[8] = {2.0f, 1.9f, 0.0f, 0.0f, 3.0f, -5.0f, -1.0f, -1.0f};
    float bias[8] = {0, 0, 0, 0, 0, 0, 2.0f, 2.0f};
    int ids[2]; float w[2];
    moe_route(&c, lg, bias, 1, ids, w);
    /* group scores: g0 .88+.87=1.75, g1 1.0, g2 .95+.007=.96, g3 2.27+2.27=4.54 -> keep g3, g0; top-2 of choice: 6, 7 */
    int a = ids[0] < ids[1] ? ids[0] : ids[1], b = ids[0] < ids[1] ? ids[1] : ids[0];
    CHECK(a == 6 && b == 7, "group-limited top-k with bias: %d %d", a, b);
    CHECK_NEAR(w[0], 1.5 / (1 + exp(1.0)), 1e-6, "weight is the unbiased sigmoid * scale");
    c.norm_topk_prob = 1;
    moe_route(&c, lg, NULL, 1, ids, w);
    /* groups: g0 1.75, g1 1.0, g2 .957 (expert 4 alone is the best score, but its group is masked) -> 0, 1 */
    CHECK(((ids[0] == 0 && ids[1] == 1) || (ids[0] == 1 && ids[1] == 0)), "top-2 without bias %d %d", ids[0], ids[1]);
    CHECK_NEAR(w[0] + w[1], 1.5, 1e-6, "normalized weights sum to the scaling factor");
}

/* The sampling distribution as a sort of the whole vocabulary gives it (best first, ties -> lower id; weights
 * exp(v - max) summed in that order; top-k, then the shortest prefix reaching top-p): the reference for
 * df_sampler_probs. */
struct ref_cand { float v; int32_t id; };
static int ref_cmp(const void *a, const void *b) {
    const struct ref_cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
static void ref_probs(const float *l, int n, float temp, int top_k, float top_p, double *probs) {
    struct ref_cand *c = malloc(sizeof *c * (size_t)n);
    for (int i = 0; i < n; i++) { c[i].v = l[i] / temp; c[i].id = i; probs[i] = 0; }
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    int k = top_k > 0 && top_k < n ? top_k : n;
    double m = c[0].v, sum = 0;
    for (int i = 0; i < k; i++) sum += exp((double)c[i].v - m);
    if (top_p > 0 && top_p < 1) {
        double acc = 0;
        for (int i = 0; i < k; i++) {
            acc += exp((double)c[i].v - m) / sum;
            if (acc >= top_p) { k = i + 1; break; }
        }
        sum = 0;
        for (int i = 0; i < k; i++) sum += exp((double)c[i].v - m);
    }
    for (int i = 0; i < k; i++) probs[c[i].id] = exp((double)c[i].v - m) / sum;
    free(c);
}

static void test_sampler_dist(void) {
    enum { N = 6000 };
    static float l[N], pr[N];
    static double want[N];
    static const struct { float temp; int k; float p; int n; } cfg[] = {
        {0.7f, 0, 1.0f, N}, {1.0f, 40, 1.0f, N}, {1.0f, 0, 0.9f, N}, {0.8f, 50, 0.95f, N}, {1.3f, 0, 0.5f, N},
        {1.0f, 0, 0.999f, N}, {2.0f, 3000, 0.7f, N}, {1.0f, 7, 1.0f, 300}, {0.5f, 0, 0.3f, 300}};
    uint64_t x = 99;
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int n = cfg[ci].n;
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((int)(x >> 44) % 4000) / 200.0f - 10.0f; /* ties among 4000 values */
        }
        df_sampler_opts o;
        df_sampler_opts_default(&o);
        o.temperature = cfg[ci].temp; o.top_k = cfg[ci].k; o.top_p = cfg[ci].p; o.seed = 5;
        df_sampler *s = df_sampler_new(&o);
        df_sampler_probs(s, l, n, pr);
        ref_probs(l, n, cfg[ci].temp, cfg[ci].k, cfg[ci].p, want);
        double d = 0;
        int kept = 0, kept_ref = 0, outside = 0;
        for (int i = 0; i < n; i++) {
            d = fmax(d, fabs(pr[i] - want[i]));
            kept += pr[i] > 0;
            kept_ref += want[i] > 0;
        }
        for (int t = 0; t < 200; t++) outside += want[df_sample(s, l, n)] == 0;
        worst = fmax(worst, d);
        CHECK(d < 1e-6 && kept == kept_ref && outside == 0,
              "sampling distribution T=%.1f top_k=%d top_p=%.3f over %d tokens: max |p - reference| %.2g, kept %d / %d, "
              "%d draws outside", cfg[ci].temp, cfg[ci].k, cfg[ci].p, n, d, kept, kept_ref, outside);
        df_sampler_free(s);
    }
    {   /* NaN logits: never drawn, the others still are (top-p and plain temperature) */
        for (int i = 0; i < 600; i++) l[i] = i % 3 == 0 ? NAN : (float)(i % 17) * 0.25f;
        int bad = 0;
        for (int tp = 0; tp < 2; tp++) {
            df_sampler_opts o;
            df_sampler_opts_default(&o);
            o.temperature = 1.0f; o.top_p = tp ? 0.9f : 1.0f; o.seed = 3;
            df_sampler *s = df_sampler_new(&o);
            for (int t = 0; t < 200; t++) {
                const int x = df_sample(s, l, 600);
                bad += x < 0 || x >= 600 || x % 3 == 0;
            }
            df_sampler_free(s);
        }
        CHECK(bad == 0, "NaN logits are never sampled (%d of 400 draws were)", bad);
    }
    /* the draws follow the distribution: 40000 draws over 20 tokens, each frequency within 0.01 of its probability */
    df_sampler_opts o;
    df_sampler_opts_default(&o);
    o.temperature = 1.0f; o.top_p = 0.9f; o.seed = 11;
    for (int i = 0; i < 20; i++) l[i] = (float)(i % 7) * 0.4f;
    df_sampler *s = df_sampler_new(&o);
    df_sampler_probs(s, l, 20, pr);
    int cnt[20] = {0};
    for (int t = 0; t < 40000; t++) cnt[df_sample(s, l, 20)]++;
    double dev = 0;
    for (int i = 0; i < 20; i++) dev = fmax(dev, fabs(cnt[i] / 40000.0 - pr[i]));
    CHECK(dev < 0.01, "top-p draws follow df_sampler_probs (largest frequency error %.4f)", dev);
    df_sampler_free(s);
}

static void test_sampler(void) {
    float l[6] = {1, 3, 3, -1, 2, 0};
    df_sampler_opts o; df_sampler_opts_default(&o);
    df_sampler *s = df_sampler_new(&o);
    CHECK(df_sample(s, l, 6) == 1, "greedy tie -> lowest id");
    df_sampler_free(s);
    {   /* greedy over long vocabularies (chunks of 256 and a tail): the first largest, NaN never wins, all NaN -> 0 */
        enum { N = 1000 };
        static float v[N];
        static const int lens[] = {1, 2, 255, 256, 257, 512, 513, 700, N};
        uint64_t x = 12345;
        int bad = 0, cases = 0;
        for (int rep = 0; rep < 400; rep++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int n = lens[li];
                for (int i = 0; i < n; i++) {
                    x = x * 6364136223846793005ull + 1442695040888963407ull;
                    const int r = (int)(x >> 33) % 12;
                    v[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : (float)((int)(x >> 40) % (rep % 7 + 2));
                }
                int32_t want = 0;
                for (int i = 1; i < n; i++) if (v[i] > v[want]) want = i;
                bad += df_sample(NULL, v, n) != want;
                cases++;
            }
        for (int i = 0; i < N; i++) v[i] = NAN;
        bad += df_sample(NULL, v, N) != 0;
        v[0] = 0.0f;
        v[777] = 1.0f;
        bad += df_sample(NULL, v, N) != 777;
        CHECK(bad == 0, "greedy argmax = the first largest of a one-by-one scan (%d of %d cases differ)", bad, cases + 2);
    }
    o.temperature = 1.0f; o.top_k = 2; o.seed = 7;
    s = df_sampler_new(&o);
    int c1 = 0, c2 = 0, other = 0;
    for (int i = 0; i < 2000; i++) { int x = df_sample(s, l, 6); if (x == 1) c1++; else if (x == 2) c2++; else other++; }
    CHECK(other == 0 && c1 > 800 && c2 > 800, "top-k=2 samples only the two best (%d %d %d)", c1, c2, other);
    df_sampler_free(s);
    df_sampler *s1 = df_sampler_new(&o), *s2 = df_sampler_new(&o);
    int same = 1;
    for (int i = 0; i < 50; i++) same &= df_sample(s1, l, 6) == df_sample(s2, l, 6);
    CHECK(same, "same seed, same draws");
    df_sampler_free(s1); df_sampler_free(s2);
    o.top_k = 0; o.top_p = 0.5f;
    s = df_sampler_new(&o);
    other = 0;
    for (int i = 0; i < 500; i++) { int x = df_sample(s, l, 6); if (x != 1 && x != 2) other++; }
    CHECK(other == 0, "top-p 0.5 keeps the two tied best");
    df_sampler_free(s);
    int32_t ti[3]; float tl[3];
    float lp = df_logprob(l, 6, 4, 3, ti, tl);
    double lse = log(exp(1) + 2 * exp(3) + exp(-1) + exp(2) + exp(0));
    CHECK_NEAR(lp, 2 - lse, 1e-5, "logprob");
    CHECK(ti[0] == 1 && ti[1] == 2 && ti[2] == 4, "top logprobs order %d %d %d", ti[0], ti[1], ti[2]);
    CHECK_NEAR(tl[0], 3 - lse, 1e-5, "top logprob value");
}

/* KDA's recurrence and short convolution (engine/kda.c, built for AVX-512, AVX2 and the baseline and chosen at load
 * time) against plain loops of the same operations (this file is built without contraction, as kda.c): bitwise
 * equal, whichever build this machine runs. */
static void ref_recur_head(const df_kda_args *a, int h) {
    const int K = a->K, D = a->H * a->K;
    float kv_mem[256], decay[256];
    const float qscale = 1.0f / sqrtf((float)K), ea = df_expf(a->A_log[h]);
    float *S = a->S + h * (int64_t)K * K;
    for (int t = 0; t < a->T; t++) {
        float *q = a->q + (int64_t)t * D + h * K, *k = a->k + (int64_t)t * D + h * K;
        const float *v = a->v + (int64_t)t * D + h * K;
        const float beta = df_kda_prep(q, k, a->graw + (int64_t)t * D + h * K, a->dt_bias + h * K, ea, a->has_lb, a->lb,
                                       a->bl[(int64_t)t * a->H + h], qscale, K, decay);
        for (int c = 0; c < K; c++) kv_mem[c] = 0.0f;
        for (int r = 0; r < K; r++)
            for (int c = 0; c < K; c++) {
                S[r * K + c] = S[r * K + c] * decay[r];
                kv_mem[c] = kv_mem[c] + S[r * K + c] * k[r];
            }
        for (int c = 0; c < K; c++) kv_mem[c] = beta * (v[c] - kv_mem[c]);
        float *o = a->o + (int64_t)t * D + h * K;
        for (int c = 0; c < K; c++) o[c] = 0.0f;
        for (int r = 0; r < K; r++)
            for (int c = 0; c < K; c++) {
                S[r * K + c] = S[r * K + c] + k[r] * kv_mem[c];
                o[c] = o[c] + q[r] * S[r * K + c];
            }
        df_kda_out(o, a->gate + (int64_t)t * D + h * K, a->o_norm, a->eps, a->silu_gate, K);
    }
}

static void test_kda_builds(void) {
    static const struct { int H, K, T, lb; } rc[] = {{3, 128, 9, 1}, {2, 100, 5, 0}, {4, 16, 17, 1}};
    int bad = 0;
    for (size_t ci = 0; ci < sizeof rc / sizeof *rc; ci++) {
        const int H = rc[ci].H, K = rc[ci].K, T = rc[ci].T, D = H * K;
        const size_t rows = (size_t)T * D, sn = (size_t)H * K * K;
        float *in[6], *S0 = vec((int)sn, 0, 0.1f), *S1 = malloc(4 * sn), *S2 = malloc(4 * sn), *o1 = malloc(4 * rows),
              *o2 = malloc(4 * rows), *bl = vec(T * H, 0, 2), *A = vec(H, 0, 1), *dt = vec(D, 0, 0.5f), *on = vec(K, 1, 0.2f);
        for (int i = 0; i < 6; i++) in[i] = vec((int)rows, 0, i == 3 ? 3.0f : 1.0f); /* q, k, v, graw, gate; q, k copy */
        memcpy(in[5], in[1], 4 * rows);
        float *q2 = malloc(4 * rows);
        memcpy(q2, in[0], 4 * rows);
        memcpy(S1, S0, 4 * sn); memcpy(S2, S0, 4 * sn);
        df_kda_args a = {H, K, T, in[0], in[1], in[2], in[3], bl, in[4], A, dt, on, rc[ci].lb, 1, -5.0f, 1e-5f, S1, o1};
        for (int h = 0; h < H; h++) kda_recur_head(&a, h);
        df_kda_args b = a;
        b.q = q2; b.k = in[5]; b.S = S2; b.o = o2;
        for (int h = 0; h < H; h++) ref_recur_head(&b, h);
        bad += memcmp(S1, S2, 4 * sn) != 0 || memcmp(o1, o2, 4 * rows) != 0;
        for (int i = 0; i < 6; i++) free(in[i]);
        free(S0); free(S1); free(S2); free(o1); free(o2); free(bl); free(A); free(dt); free(on); free(q2);
    }
    CHECK(bad == 0, "KDA recurrence: %d of 3 cases differ from the plain loops", bad);
    /* the short convolution: out[t, c] = silu(sum_j w[c, j] x[t-P+j, c]) over [state; x], state = last P rows */
    static const struct { int T, D, W; } cc[] = {{1, 40, 4}, {3, 40, 4}, {9, 72, 4}, {5, 33, 1}, {7, 64, 6}};
    bad = 0;
    for (size_t ci = 0; ci < sizeof cc / sizeof *cc; ci++) {
        const int T = cc[ci].T, D = cc[ci].D, W = cc[ci].W, P = W - 1;
        float *x = vec(T * D, 0, 4), *st = vec(P * D + 1, 0, 4), *w = vec(D * W, 0, 1), *tmp = malloc(4 * (size_t)(P + 1) * D);
        float *cat = malloc(4 * (size_t)(P + T) * D), *ref = malloc(4 * (size_t)T * D);
        memcpy(cat, st, 4 * (size_t)P * D);
        memcpy(cat + (size_t)P * D, x, 4 * (size_t)T * D);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < D; c++) {
                float s = 0.0f;
                for (int j = 0; j < W; j++) s = s + w[c * W + j] * cat[(size_t)(t + j) * D + c];
                ref[(size_t)t * D + c] = df_kda_silu(s);
            }
        kda_short_conv(NULL, x, st, w, T, D, W, tmp);
        bad += memcmp(x, ref, 4 * (size_t)T * D) != 0 || memcmp(st, cat + (size_t)T * D, 4 * (size_t)P * D) != 0;
        free(x); free(st); free(w); free(tmp); free(cat); free(ref);
    }
    CHECK(bad == 0, "KDA short convolution: %d of 5 cases differ from the plain loops", bad);
}

/* The KDA state's device-copy protocol of kvcache.c against a backend that records and keeps one fake state
 * (S[0], conv[0]) per copy: a newer copy is fetched before the host's state is read (kv_kda_host), once; a save
 * keeps the snapshot on the device when the backend can (else fetches), a load of that buffer restores it there and
 * forgets other layers' copies; a copy dropped while holding the snapshot writes it into the saved buffer first;
 * reset forgets every copy; a failed fetch is an error that keeps the copy's marks; a lost snapshot resets. */
static int g_fetch, g_drop, g_fail, g_snap, g_restore, g_fetch_snap, g_no_snap;
static uint64_t g_last_key;
static float g_cur = 7.0f, g_snapv = -1.0f; /* the fake device copy's current state and snapshot (S[0]; conv[0] + 1) */
static int fake_kda_state(uint64_t key, float *conv, float *S, int op) {
    g_last_key = key;
    switch (op) {
    case DF_KDA_DROP: g_drop++; g_snapv = -1.0f; return 0;
    case DF_KDA_SNAP: if (g_no_snap) return -1; g_snap++; g_snapv = g_cur; return 0;
    case DF_KDA_RESTORE: if (g_snapv < 0) return -1; g_restore++; g_cur = g_snapv; return 0;
    case DF_KDA_FETCH_SNAP:
        if (g_fail || g_snapv < 0) return -1;
        g_fetch_snap++;
        S[0] = g_snapv;
        conv[0] = g_snapv + 1.0f;
        return 0;
    default:
        if (g_fail) return -1;
        g_fetch++;
        S[0] = g_cur;
        conv[0] = g_cur + 1.0f;
        return 0;
    }
}

static void test_kda_copies(void) {
    df_config c;
    memset(&c, 0, sizeof c);
    c.num_hidden_layers = 3;
    c.mixer[0] = DF_MIXER_MLA;
    c.mixer[1] = DF_MIXER_KDA;
    c.mixer[2] = DF_MIXER_KDA;
    c.kv_lora_rank = 8; c.qk_rope_head_dim = 4;
    c.kda_heads = 2; c.kda_head_dim = 4; c.kda_conv = 3;
    df_kvcache kv;
    CHECK(kv_init(&kv, &c, 16) == DF_OK, "kv_init");
    df_backend fake;
    memset(&fake, 0, sizeof fake);
    fake.name = "fake";
    fake.kda_state = fake_kda_state;
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    const size_t nb = (size_t)kv_recurrent_bytes(&kv), part = 2 * 4 * 4 + 3 * 2 * 2 * 4; /* floats per layer */
    float *buf = malloc(nb);
    for (size_t i = 0; i < nb / 4; i++) buf[i] = -5.0f;
    kv.kda_S[2][0] = 3.0f;
    char err[200] = "";
    g_no_snap = 1; /* a backend without room for snapshots: the save fetches */
    int rc = kv_recurrent_save(&kv, buf, 1, err, sizeof err);
    CHECK(rc == DF_OK && g_fetch == 1 && g_last_key == (kv.uid << 8 | 1) && buf[0] == 7.0f && buf[2 * 4 * 4] == 8.0f &&
              buf[part] == 3.0f && kv.kda_dev[1] == KV_KDA_COPY,
          "save without snapshot room fetches the newer copy once (rc %d, fetches %d, S[0] %g)", rc, g_fetch, buf[0]);
    rc = kv_recurrent_save(&kv, buf, 1, err, sizeof err);
    CHECK(rc == DF_OK && g_fetch == 1, "a second save fetches nothing (the host is current)");
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    g_fail = 1;
    rc = kv_kda_host(&kv, 1, 1, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && kv.kda_dev[1] == (KV_KDA_COPY | KV_KDA_NEWER) && g_drop == 0 &&
              strstr(err, "KDA layer 1") != NULL,
          "a failed fetch is an error naming the layer, the copy kept (rc %d, '%s')", rc, err);
    g_fail = 0;
    rc = kv_kda_host(&kv, 1, 1, err, sizeof err);
    CHECK(rc == DF_OK && g_fetch == 2 && g_drop == 1 && kv.kda_dev[1] == 0, "fetch and drop (the steps path)");
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(rc == DF_OK && g_drop == 2 && g_fetch == 2 && kv.kda_dev[1] == 0 && kv.kda_be == NULL &&
              kv.kda_S[1][0] == 7.0f && kv.kda_S[2][0] == 3.0f,
          "load forgets the copy without fetching it and takes the snapshot");
    /* snapshots kept on the device */
    g_no_snap = 0;
    g_cur = 11.0f;
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    kv.kda_S[2][0] = 4.0f;
    buf[0] = -5.0f;
    rc = kv_recurrent_save(&kv, buf, 1, err, sizeof err);
    CHECK(rc == DF_OK && g_snap == 1 && g_fetch == 2 && buf[0] == -5.0f && buf[part] == 4.0f &&
              kv.kda_dev[1] == (KV_KDA_COPY | KV_KDA_NEWER | KV_KDA_SNAP) && kv.kda_snap == buf,
          "save keeps layer 1's snapshot on the device, fetches nothing, copies layer 2 (dev %d, buf %g %g)",
          kv.kda_dev[1], buf[0], buf[part]);
    g_cur = 12.0f; /* a verification moves the device's state */
    kv.kda_S[2][0] = 5.0f;
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(rc == DF_OK && g_restore == 1 && g_cur == 11.0f && g_fetch == 2 && g_drop == 2 &&
              kv.kda_dev[1] == (KV_KDA_COPY | KV_KDA_NEWER | KV_KDA_SNAP) && kv.kda_be == &fake &&
              kv.kda_S[2][0] == 4.0f,
          "load restores the device's snapshot and copies layer 2 (restores %d, cur %g)", g_restore, g_cur);
    g_cur = 13.0f;
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(rc == DF_OK && g_restore == 2 && g_cur == 11.0f, "the snapshot stays for a second rollback");
    g_cur = 14.0f;
    rc = kv_kda_host(&kv, 1, 1, err, sizeof err); /* the steps path: fetch, the snapshot into buf, drop */
    CHECK(rc == DF_OK && g_fetch == 3 && g_fetch_snap == 1 && g_drop == 3 && kv.kda_S[1][0] == 14.0f &&
              buf[0] == 11.0f && buf[2 * 4 * 4] == 12.0f && kv.kda_dev[1] == 0,
          "dropping a copy writes its snapshot into the saved buffer first (buf %g)", buf[0]);
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(rc == DF_OK && g_restore == 2 && kv.kda_S[1][0] == 11.0f, "then a load takes it from the host");
    /* a snapshot lost in a failed copy back: the load resets and says so */
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    rc = kv_recurrent_save(&kv, buf, 1, err, sizeof err);
    CHECK(rc == DF_OK && g_snap == 2, "snapshot again");
    g_fail = 1;
    kv_recurrent_reset(&kv);
    g_fail = 0;
    CHECK(kv.kda_snap_lost == 1 && kv.kda_dev[1] == 0 && kv.kda_be == NULL && kv.kda_S[1][0] == 0.0f,
          "reset forgets the copy; its snapshot's failed copy back is marked");
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "snapshot") && kv.kda_S[1][0] == 0.0f && kv.kda_S[2][0] == 0.0f,
          "a lost snapshot: load fails and leaves the zero state (rc %d, '%s')", rc, err);
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY;
    kv_recurrent_reset(&kv);
    CHECK(kv.kda_dev[1] == 0 && kv.kda_be == NULL && kv.kda_S[1][0] == 0.0f, "reset forgets the copy");
    /* a save without dev (the end of a prompt) fetches and keeps no device snapshot */
    kv.kda_be = &fake;
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    g_cur = 21.0f;
    const int snaps = g_snap, fetches = g_fetch;
    rc = kv_recurrent_save(&kv, buf, 0, err, sizeof err);
    CHECK(rc == DF_OK && g_snap == snaps && g_fetch == fetches + 1 && buf[0] == 21.0f && kv.kda_dev[1] == KV_KDA_COPY,
          "a save without dev fetches (snapshots %d, fetches %d, buf %g)", g_snap - snaps, g_fetch - fetches, buf[0]);
    /* an abandoned snapshot is never fetched, and its buffer no longer loads */
    kv.kda_dev[1] = KV_KDA_COPY | KV_KDA_NEWER;
    rc = kv_recurrent_save(&kv, buf, 1, err, sizeof err);
    const int fsnaps = g_fetch_snap;
    kv_recurrent_drop_snapshot(&kv);
    kv_recurrent_reset(&kv);
    rc = kv_recurrent_load(&kv, buf, err, sizeof err);
    CHECK(g_fetch_snap == fsnaps && rc == DF_EUNSUPPORTED && kv.kda_dev[1] == 0,
          "a dropped snapshot: nothing fetched at the reset, the load fails (rc %d)", rc);
    free(buf);
    kv_free(&kv);
}

int main(void) {
    test_kda_copies();
    test_kda_builds();
    test_rope_values();
    test_route();
    test_sampler();
    test_sampler_dist();
    run_case(16, 1, "cpu");
    run_case(0, 0, "cpu");
    run_case(16, 0, "cpu-scalar");
    return t_done();
}
