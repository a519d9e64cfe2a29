/*
 * cuda_backend.c — the "cuda" backend table: matmul, whole MLPs, the MLA
 * attention core and whole MLA blocks on the GPU (kernels/cuda.h, src/kernels/cuda/), the small
 * per-row ops (dot, axpy, RMSNorm, SwiGLU, softmax, embedding rows) on the best
 * CPU backend, where a GPU launch per call would cost more than the work.
 * Design: docs/cuda.md.
 */
#ifdef DF_HAVE_CUDA
#include "kernels/cuda.h"
#include "kernels/cuda_env.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static df_backend g_cuda_be;
static const df_backend *g_cpu;
static pthread_once_t g_init = PTHREAD_ONCE_INIT;
static int g_warned;

/* On a CUDA error (device lost, out of memory for activations) the call is computed on the CPU
 * instead and the error is reported once on stderr. */
static void cuda_be_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    if (df_cuda_matmul(w, x, T, y) == 0) return;
    if (!w->data) { /* a weight pinned in GPU memory has no host copy to fall back on */
        fprintf(stderr, "deltafin: CUDA error on a GPU-resident expert weight: %s\n", df_cuda_last_error());
        abort();
    }
    if (!__atomic_exchange_n(&g_warned, 1, __ATOMIC_SEQ_CST))
        fprintf(stderr, "deltafin: CUDA error (%s); matmuls that fail on the GPU are computed on the CPU\n",
                df_cuda_last_error());
    g_cpu->matmul(pool, w, x, T, y);
}

/* The MLA attention core on the GPU; on failure (a shape or encoding it does not support, a CUDA error) -1, and the
 * caller computes it on the CPU: reported once on stderr. */
static int g_attn_warned;
static int cuda_be_mla_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale,
                              const float *q, const float *const *c, const float *const *kpe, const int *npos,
                              const uint64_t *seq_key, float *o_v) {
    if (df_cuda_mla_attend(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, o_v) == 0) return 0;
    if (!__atomic_exchange_n(&g_attn_warned, 1, __ATOMIC_SEQ_CST))
        fprintf(stderr, "deltafin: attention core not on the GPU (%s); computed on the CPU\n", df_cuda_last_error());
    return -1;
}

/* The whole MLA block on the GPU; on failure -1 (the engine then runs its steps as separate calls): reported once. */
static int g_block_warned;
static int cuda_be_mla_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c,
                             float *const *kpe, const int *npos, const uint64_t *seq_key, float *x_out, float *h2,
                             float *logits) {
    if (df_cuda_mla_block(b, T, x, cs, c, kpe, npos, seq_key, x_out, h2, logits) == 0) return 0;
    if (!__atomic_exchange_n(&g_block_warned, 1, __ATOMIC_SEQ_CST))
        fprintf(stderr, "deltafin: MLA block not in one GPU call (%s); its steps run as separate calls\n",
                df_cuda_last_error());
    return -1;
}

/* The KDA recurrence on the GPU; on failure -1 (the engine runs it on the CPU: the same bits with a lower-bound
 * gate, softplus's log1pf otherwise): reported once. */
static int g_kda_warned;
static int cuda_be_kda_recur(const df_kda_args *a) {
    if (df_cuda_kda_recur(a) == 0) return 0;
    if (!__atomic_exchange_n(&g_kda_warned, 1, __ATOMIC_SEQ_CST))
        fprintf(stderr, "deltafin: KDA recurrence not on the GPU (%s); computed on the CPU\n", df_cuda_last_error());
    return -1;
}

/* A KDA state's device copy (cuda_kda.cu df_cuda_kda_state); with DF_CUDA_KDA_SNAP=0 no snapshot is kept there (the
 * engine then fetches the state to the host for it) */
static int g_kda_snap = 1;
static int cuda_be_kda_state(uint64_t key, float *conv, float *S, int op) {
    if (op == DF_KDA_SNAP && !g_kda_snap) return -1;
    return df_cuda_kda_state(key, conv, S, op);
}

/* The KDA mixer in one GPU call; on failure -1 (the engine runs its steps as separate calls): reported once. */
static int g_kda_block_warned;
static int cuda_be_kda_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                             float *const *conv, float *const *S, float *out, unsigned char *kept) {
    if (df_cuda_kda_block(b, n_seq, Ts, h, key, conv, S, out, kept) == 0) return 0;
    if (!__atomic_exchange_n(&g_kda_block_warned, 1, __ATOMIC_SEQ_CST))
        fprintf(stderr, "deltafin: KDA mixer not in one GPU call (%s); its steps run as separate calls\n",
                df_cuda_last_error());
    return -1;
}

static int g_attn_on;

static void init_table(void) {
    g_cpu = df_backend_get("cpu");
    g_cuda_be = *g_cpu;
    g_cuda_be.name = "cuda";
    g_cuda_be.matmul = cuda_be_matmul;
    g_cuda_be.dev_pin = df_cuda_pin;
    g_cuda_be.dev_unpin = df_cuda_unpin;
    g_cuda_be.dev_has = df_cuda_has;
    g_cuda_be.dev_load = df_cuda_dev_load;
    g_cuda_be.mlp = df_cuda_mlp;
    g_cuda_be.host_pin = df_cuda_host_pin;
    g_cuda_be.host_unpin = df_cuda_host_unpin;
    /* developer knobs for A/B timing (docs/cuda.md; an invalid value never gets here: backend.c refuses it):
     * DF_CUDA_MLP_GROUP=0, one round trip per expert MLP; DF_CUDA_ATTN=0, the MLA attention core on the CPU;
     * DF_CUDA_MLA_PROJECT=0, the MLA projections one matmul (round trip) at a time and o_proj after the core */
    g_cuda_be.mlp_group = df_cuda_env_switch("DF_CUDA_MLP_GROUP", NULL, 0) != 0 ? df_cuda_mlp_group : NULL;
    g_attn_on = df_cuda_env_switch("DF_CUDA_ATTN", NULL, 0) != 0;
    const int fuse_mla = df_cuda_env_switch("DF_CUDA_MLA_PROJECT", NULL, 0) != 0;
    g_cuda_be.mla_project = fuse_mla ? df_cuda_mla_project : NULL;
    g_cuda_be.mla_attend = g_attn_on ? cuda_be_mla_attend : NULL;
    g_cuda_be.mla_attend_o = g_attn_on && fuse_mla ? df_cuda_mla_attend_o : NULL;
    /* DF_CUDA_MLA_BLOCK=0: the layer's MLA mixer as mla_project + mla_attend_o with the norms, RoPE, residual and
     * router between them on the host (mla_block fuses them into one round trip) */
    g_cuda_be.mla_block = g_attn_on && fuse_mla && df_cuda_env_switch("DF_CUDA_MLA_BLOCK", NULL, 0) != 0 ? cuda_be_mla_block
                                                                                                        : NULL;
    /* one token's MoE into the device residual: with the block, and only where the host's axpy (the combine it
     * replaces) uses fused multiply-adds, as the device's does */
    g_cuda_be.moe_resid = g_cuda_be.mla_block && g_cuda_be.mlp_group && strncmp(g_cpu->name, "cpu-avx", 7) == 0 &&
                                  df_cuda_env_switch("DF_CUDA_MOE_RESID", NULL, 0) != 0
                              ? df_cuda_moe_resid
                              : NULL;
    /* a decode step's MoE (and a dense layer's MLP) routed and run on the device by the block (df_mla_block.moe),
     * the picks back through moe_routed; DF_CUDA_MOE_ROUTE=0 routes on the host (bench/RESULTS.md: 1-2% slower on the
     * H200 since small copies run as kernels) */
    g_cuda_be.moe_routed = g_cuda_be.moe_resid && df_cuda_env_switch("DF_CUDA_MOE_ROUTE", NULL, 0) == 1
                               ? df_cuda_moe_routed
                               : NULL;
    /* the final norm and lm_head from the device residual (with the block: every row's logits this way) */
    g_cuda_be.final_logits = g_cuda_be.mla_block ? df_cuda_final_logits : NULL;
    /* greedy decoding on the device (cuda_greedy.cu): with final_logits; DF_CUDA_GREEDY=0 keeps the token on the
     * host (the same tokens: a developer comparison) */
    const int greedy = g_cuda_be.final_logits && df_cuda_env_switch("DF_CUDA_GREEDY", NULL, 0) != 0;
    g_cuda_be.final_argmax = greedy ? df_cuda_final_argmax : NULL;
    g_cuda_be.token_wait = greedy ? df_cuda_token_wait : NULL;
    g_cuda_be.embed_dev = greedy ? df_cuda_embed_dev : NULL;
    /* Kimi Linear / K3's KDA recurrence (cuda_kda.cu); DF_CUDA_KDA=0 runs it on the CPU (a developer comparison) */
    g_cuda_be.kda_recur = df_cuda_env_switch("DF_CUDA_KDA", NULL, 0) != 0 ? cuda_be_kda_recur : NULL;
    /* a KDA layer's whole mixer in one call (cuda_kda.cu df_cuda_kda_block); DF_CUDA_KDA_BLOCK=0 runs it step by step */
    g_cuda_be.kda_block = g_cuda_be.kda_recur && df_cuda_env_switch("DF_CUDA_KDA_BLOCK", NULL, 0) != 0
                              ? cuda_be_kda_block : NULL;
    /* DF_CUDA_KDA_SNAP=0: a rollback snapshot of a KDA state fetched to the host (a developer comparison) */
    g_kda_snap = df_cuda_env_switch("DF_CUDA_KDA_SNAP", NULL, 0) != 0;
    g_cuda_be.kda_state = g_cuda_be.kda_block ? cuda_be_kda_state : NULL;
    /* a freed session's latent-cache mirrors (cuda_attn.cu) and KDA states (cuda_kda.cu) leave GPU memory with it */
    g_cuda_be.seq_forget = g_attn_on || g_cuda_be.kda_block ? df_cuda_seq_forget : NULL;
    /* DF_CUDA_TRACE=1 or 2: every GPU call's wall time, a table on stderr at exit (cuda_trace.c); off when unset */
    if (df_cuda_env_trace(NULL, 0) > 0) df_cuda_trace_wrap(&g_cuda_be);
}

uint64_t df_cuda_preload_spine(const df_spine *sp, int n_layers, int *all) {
    uint64_t bytes = 0;
    *all = 0;
    pthread_once(&g_init, init_table); /* kv_b only when the attention core runs on the GPU (DF_CUDA_ATTN) */
    for (int l = 0; l < n_layers; l++) {
        const df_layer_weights *lw = &sp->layers[l];
        const df_weight *ws[] = {&lw->q_a, &lw->q_b, &lw->q, &lw->kv_a, g_attn_on ? &lw->kv_b : NULL, &lw->o,
                                 &lw->gate, &lw->up, &lw->down,
                                 &lw->router, &lw->attn_gate, &lw->kda_q, &lw->kda_k, &lw->kda_v, &lw->f_a, &lw->f_b,
                                 &lw->beta, &lw->g, &lw->g_a, &lw->g_b, &lw->lat_down, &lw->lat_up};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (!ws[i] || !ws[i]->data) continue;
            if (df_cuda_preload(ws[i])) return bytes;
            bytes += df_weight_bytes(ws[i]);
        }
    }
    if (sp->lm_head.data) {
        if (df_cuda_preload(&sp->lm_head)) return bytes;
        bytes += df_weight_bytes(&sp->lm_head);
    }
    *all = 1;
    /* the embedding table for greedy decoding on the device (embed_dev; else it is uploaded at the first greedy
     * generation): when there is room; without it the host picks the tokens */
    if (g_cuda_be.embed_dev && sp->embed.data && df_cuda_preload(&sp->embed) == 0) bytes += df_weight_bytes(&sp->embed);
    return bytes;
}

const df_backend *df_cuda_backend(void) {
    if (!df_cuda_probe(NULL, 0)) return NULL;
    pthread_once(&g_init, init_table);
    return &g_cuda_be;
}
#endif
