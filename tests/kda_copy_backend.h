/* kda_copy_backend.h — a test backend: the CPU's, plus the optional entry points with which the CUDA backend keeps
 * KDA states on the device (df_backend.kda_block, kda_recur, kda_state, seq_forget; kernels/backend.h), emulated on
 * the host the way src/kernels/cuda/cuda_kda.cu keeps them: a copy per key (df_kvcache.uid << 8 | layer) with a
 * current slot, a snapshot slot (a third slot once there is one) and a newer-than-the-host flag; each block call
 * starts from the copy when there is one and keeps the state after it there (kept = 1) while there is room. So the
 * engine's protocol for such states (engine/kda.c marks, kvcache.c fetch / drop / snapshot / restore, api.c
 * rollbacks) runs on any machine: a GPU backend's path, without a GPU.
 * Knobs (set before use): kcb_fail_every = N > 0 makes every Nth block call fail (-1, every state as it was: the
 * engine then fetches and runs its steps); kcb_max_copies bounds the copies (the rest through the host, as a full
 * device); kcb_no_snap refuses DF_KDA_SNAP (no room for snapshots). Register with kcb_register(); the name is
 * "cpu-kdacopy". Single-threaded use (the engine calls it under the model's lock). */
#ifndef DF_TEST_KDA_COPY_BACKEND_H
#define DF_TEST_KDA_COPY_BACKEND_H

#include "engine/engine.h"
#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

enum { KCB_MAX = 256 };
typedef struct {
    uint64_t key;
    float *S[3], *C[3]; /* slots: S [H*K*K], conv state [3*(W-1)*H*K] */
    size_t sn, cn;      /* floats of S and of the conv state (this copy's layer shapes) */
    int cur, snap, dirty, used;
} kcb_copy;
static kcb_copy kcb_tab[KCB_MAX];
static df_backend kcb_be;
static int kcb_fail_every, kcb_max_copies = KCB_MAX, kcb_no_snap, kcb_calls;
static unsigned long long kcb_n_snap, kcb_n_restore, kcb_n_fetch, kcb_n_fetch_snap, kcb_n_kept, kcb_n_failed;

static kcb_copy *kcb_find(uint64_t key) {
    for (int i = 0; i < KCB_MAX; i++)
        if (kcb_tab[i].used && kcb_tab[i].key == key) return &kcb_tab[i];
    return NULL;
}
static void kcb_drop(kcb_copy *c) {
    for (int i = 0; i < 3; i++) { free(c->S[i]); free(c->C[i]); }
    memset(c, 0, sizeof *c);
}
static int kcb_live(void) {
    int n = 0;
    for (int i = 0; i < KCB_MAX; i++) n += kcb_tab[i].used;
    return n;
}
static int kcb_slot(kcb_copy *c, int i) { /* allocate slot i; 0 or -1 */
    if (!c->S[i]) c->S[i] = malloc(sizeof(float) * c->sn);
    if (!c->C[i]) c->C[i] = malloc(sizeof(float) * (c->cn + 1));
    return c->S[i] && c->C[i] ? 0 : -1;
}
static int kcb_next(const kcb_copy *c) {
    for (int i = 0;; i++)
        if (i != c->cur && i != c->snap) return i;
}

/* The mixer of T rows (engine/kda.c's expressions with the CPU's matmuls), from and into Sw / Cw. */
static void kcb_mixer(const df_kda_block *b, int T, const float *h, float *Sw, float *Cw, float *out) {
    const df_backend *cpu = df_backend_get("cpu");
    const int H = b->H, K = b->K, W = b->W, D = H * K, P = W - 1;
    const size_t rows = (size_t)T * D;
    float *q = malloc(4 * rows), *k = malloc(4 * rows), *v = malloc(4 * rows), *graw = malloc(4 * rows),
          *gate = malloc(4 * rows), *o = malloc(4 * rows), *bl = malloc(4 * (size_t)T * H),
          *fa = malloc(4 * (size_t)T * (size_t)(b->f_a->rows > (b->g_a ? b->g_a->rows : 0) ? b->f_a->rows : b->g_a->rows)),
          *tmp = malloc(4 * (size_t)(P + 1) * D);
    cpu->matmul(NULL, b->q, h, T, q);
    cpu->matmul(NULL, b->k, h, T, k);
    cpu->matmul(NULL, b->v, h, T, v);
    kda_short_conv(NULL, q, Cw, b->conv_q, T, D, W, tmp);
    kda_short_conv(NULL, k, Cw + (size_t)P * D, b->conv_k, T, D, W, tmp);
    kda_short_conv(NULL, v, Cw + 2 * (size_t)P * D, b->conv_v, T, D, W, tmp);
    cpu->matmul(NULL, b->f_a, h, T, fa);
    cpu->matmul(NULL, b->f_b, fa, T, graw);
    cpu->matmul(NULL, b->beta, h, T, bl);
    if (b->g) {
        cpu->matmul(NULL, b->g, h, T, gate);
    } else {
        cpu->matmul(NULL, b->g_a, h, T, fa);
        cpu->matmul(NULL, b->g_b, fa, T, gate);
    }
    const df_kda_args a = {H, K, T, q, k, v, graw, bl, gate, b->A_log, b->dt_bias, b->o_norm, b->has_lb, b->silu_gate,
                           b->lb, b->eps, Sw, o};
    for (int hh = 0; hh < H; hh++) kda_recur_head(&a, hh);
    cpu->matmul(NULL, b->o, o, T, out);
    free(q); free(k); free(v); free(graw); free(gate); free(o); free(bl); free(fa); free(tmp);
}

static int kcb_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                     float *const *conv, float *const *S, float *out, unsigned char *kept) {
    if (kcb_fail_every > 0 && ++kcb_calls % kcb_fail_every == 0) { kcb_n_failed++; return -1; }
    const int D = b->H * b->K, P = b->W - 1;
    const size_t kcb_sn = (size_t)b->H * b->K * b->K, kcb_cn = (size_t)3 * P * D;
    float *Sw = malloc(sizeof(float) * kcb_sn), *Cw = malloc(sizeof(float) * (kcb_cn + 1));
    int64_t r = 0;
    for (int s = 0; s < n_seq; s++) {
        kept[s] = 0;
        kcb_copy *c = key[s] ? kcb_find(key[s]) : NULL;
        if (c && (c->sn != kcb_sn || c->cn != kcb_cn)) abort(); /* a key's copy of other shapes (CUDA: an error) */
        if (!c && key[s] && kcb_live() < kcb_max_copies) { /* a new copy of the host's state */
            for (int i = 0; i < KCB_MAX && !c; i++)
                if (!kcb_tab[i].used) c = &kcb_tab[i];
            c->used = 1;
            c->key = key[s];
            c->snap = -1;
            c->sn = kcb_sn;
            c->cn = kcb_cn;
            if (kcb_slot(c, 0) || kcb_slot(c, 1)) abort();
            memcpy(c->S[0], S[s], sizeof(float) * kcb_sn);
            memcpy(c->C[0], conv[s], sizeof(float) * kcb_cn);
        }
        memcpy(Sw, c ? c->S[c->cur] : S[s], sizeof(float) * kcb_sn);
        memcpy(Cw, c ? c->C[c->cur] : conv[s], sizeof(float) * kcb_cn);
        if (Ts[s] > 0) kcb_mixer(b, Ts[s], h + r * b->q->cols, Sw, Cw, out + r * b->o->rows);
        if (c) {
            const int nx = kcb_next(c);
            if (kcb_slot(c, nx)) abort();
            memcpy(c->S[nx], Sw, sizeof(float) * kcb_sn);
            memcpy(c->C[nx], Cw, sizeof(float) * kcb_cn);
            c->cur = nx;
            c->dirty = 1;
            kept[s] = 1;
            kcb_n_kept++;
        } else {
            memcpy(S[s], Sw, sizeof(float) * kcb_sn);
            memcpy(conv[s], Cw, sizeof(float) * kcb_cn);
        }
        r += Ts[s];
    }
    free(Sw);
    free(Cw);
    return 0;
}

static int kcb_recur(const df_kda_args *a) {
    for (int hh = 0; hh < a->H; hh++) kda_recur_head(a, hh);
    return 0;
}

static int kcb_state(uint64_t key, float *conv, float *S, int op) {
    kcb_copy *c = kcb_find(key);
    if (op == DF_KDA_DROP) {
        if (c) kcb_drop(c);
        return 0;
    }
    if (!c) return -1;
    switch (op) {
    case DF_KDA_FETCH:
        if (c->dirty) {
            memcpy(S, c->S[c->cur], sizeof(float) * c->sn);
            memcpy(conv, c->C[c->cur], sizeof(float) * c->cn);
            c->dirty = 0;
            kcb_n_fetch++;
        }
        return 0;
    case DF_KDA_SNAP:
        if (kcb_no_snap || kcb_slot(c, 2)) return -1;
        c->snap = c->cur;
        kcb_n_snap++;
        return 0;
    case DF_KDA_RESTORE:
        if (c->snap < 0) return -1;
        c->cur = c->snap;
        c->dirty = 1;
        kcb_n_restore++;
        return 0;
    case DF_KDA_FETCH_SNAP:
        if (c->snap < 0) return -1;
        memcpy(S, c->S[c->snap], sizeof(float) * c->sn);
        memcpy(conv, c->C[c->snap], sizeof(float) * c->cn);
        kcb_n_fetch_snap++;
        return 0;
    default: return -1;
    }
}

static void kcb_forget(uint64_t uid) {
    if (uid == 0) return; /* as the CUDA backend: a model opened or closed keeps the sessions' states */
    for (int i = 0; i < KCB_MAX; i++)
        if (kcb_tab[i].used && kcb_tab[i].key >> 8 == uid) kcb_drop(&kcb_tab[i]);
}

static void kcb_register(void) {
    kcb_be = *df_backend_get("cpu");
    kcb_be.name = "cpu-kdacopy";
    kcb_be.kda_block = kcb_block;
    kcb_be.kda_recur = kcb_recur;
    kcb_be.kda_state = kcb_state;
    kcb_be.seq_forget = kcb_forget;
    df_backend_register(&kcb_be);
}

#endif
