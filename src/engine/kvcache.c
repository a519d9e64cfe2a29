/*
 * kvcache.c — the sequence state of one session (engine.h df_kvcache).
 * MLA layers: per position the normalized latent c_kv [kv_lora_rank] and the
 * shared key part k_pe [qk_rope_head_dim], fp32; grows by doubling up to n_ctx,
 * so a session with a large context limit only pays for the positions it uses.
 * Each cache has a process-unique uid, the identity of its device mirrors (engine.h).
 * KDA layers: a fixed-size recurrent state S [heads, K, K] and the short-conv
 * state (the last W-1 pre-conv projections of q, k, v), fp32, for position n_past; on a GPU backend the
 * current state may be its device copy (kda_be, kda_dev), fetched by kv_kda_host before the host's is read.
 */
#include "engine.h"
#include "deltafin.h"
#include "kernels/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t kda_S_floats(const df_kvcache *kv) { return (size_t)kv->kda_H * kv->kda_K * kv->kda_K; }
static size_t kda_conv_floats(const df_kvcache *kv) {
    return (size_t)3 * (kv->kda_W > 1 ? kv->kda_W - 1 : 0) * kv->kda_H * kv->kda_K;
}

uint64_t kv_new_uid(void) {
    static uint64_t last;
    return __atomic_add_fetch(&last, 1, __ATOMIC_RELAXED);
}

int kv_init(df_kvcache *kv, const df_config *cfg, int n_ctx) {
    memset(kv, 0, sizeof *kv);
    kv->uid = kv_new_uid();
    kv->n_layers = cfg->num_hidden_layers;
    kv->kv_lora = cfg->kv_lora_rank;
    kv->rope = cfg->qk_rope_head_dim;
    kv->n_ctx = n_ctx;
    memcpy(kv->mixer, cfg->mixer, sizeof kv->mixer);
    kv->kda_H = cfg->kda_heads;
    kv->kda_K = cfg->kda_head_dim;
    kv->kda_W = cfg->kda_conv;
    kv->c = calloc((size_t)kv->n_layers, sizeof(float *));
    kv->kpe = calloc((size_t)kv->n_layers, sizeof(float *));
    kv->kda_S = calloc((size_t)kv->n_layers, sizeof(float *));
    kv->kda_conv = calloc((size_t)kv->n_layers, sizeof(float *));
    if (!kv->c || !kv->kpe || !kv->kda_S || !kv->kda_conv) { kv_free(kv); return DF_ENOMEM; }
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->mixer[l] != DF_MIXER_KDA) continue;
        kv->kda_S[l] = calloc(kda_S_floats(kv), sizeof(float));
        kv->kda_conv[l] = calloc(kda_conv_floats(kv) + 1, sizeof(float));
        if (!kv->kda_S[l] || !kv->kda_conv[l]) { kv_free(kv); return DF_ENOMEM; }
    }
    return DF_OK;
}

int kv_reserve(df_kvcache *kv, int n) {
    if (n > kv->n_ctx) return DF_ECONTEXT;
    if (n <= kv->cap) return DF_OK;
    int cap = kv->cap ? kv->cap : 64;
    while (cap < n) cap *= 2;
    if (cap > kv->n_ctx) cap = kv->n_ctx;
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->mixer[l] == DF_MIXER_KDA) continue;
        float *c = realloc(kv->c[l], sizeof(float) * (size_t)cap * kv->kv_lora);
        if (!c) return DF_ENOMEM;
        kv->c[l] = c;
        float *k = realloc(kv->kpe[l], sizeof(float) * (size_t)cap * kv->rope);
        if (!k) return DF_ENOMEM;
        kv->kpe[l] = k;
    }
    kv->cap = cap;
    return DF_OK;
}

void kv_free(df_kvcache *kv) {
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->c) free(kv->c[l]);
        if (kv->kpe) free(kv->kpe[l]);
        if (kv->kda_S) free(kv->kda_S[l]);
        if (kv->kda_conv) free(kv->kda_conv[l]);
    }
    free(kv->c);
    free(kv->kpe);
    free(kv->kda_S);
    free(kv->kda_conv);
    kv->c = kv->kpe = kv->kda_S = kv->kda_conv = NULL;
    kv->cap = 0;
}

uint64_t kv_recurrent_bytes(const df_kvcache *kv) {
    uint64_t n = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->mixer[l] == DF_MIXER_KDA) n += (kda_S_floats(kv) + kda_conv_floats(kv)) * sizeof(float);
    return n;
}

/* Layer l's part of a snapshot buffer: S then the conv state, after the KDA layers before it */
static float *snap_part(const df_kvcache *kv, float *buf, int l) {
    size_t off = 0;
    for (int i = 0; i < l; i++)
        if (kv->mixer[i] == DF_MIXER_KDA) off += kda_S_floats(kv) + kda_conv_floats(kv);
    return buf + off;
}

/* Layer l's device copy forgotten; a snapshot it holds (KV_KDA_SNAP) first written into its part of kda_snap (lost,
 * kda_snap_lost, when that copy fails). */
static void kda_drop(df_kvcache *kv, int l) {
    if (!(kv->kda_dev[l] & KV_KDA_COPY)) { kv->kda_dev[l] = 0; return; }
    const uint64_t key = kv_layer_key(kv, l);
    if (kv->kda_dev[l] & KV_KDA_SNAP) {
        float *p = snap_part(kv, kv->kda_snap, l);
        if (kv->kda_be->kda_state(key, p + kda_S_floats(kv), p, DF_KDA_FETCH_SNAP)) kv->kda_snap_lost = 1;
    }
    kv->kda_be->kda_state(key, NULL, NULL, DF_KDA_DROP);
    kv->kda_dev[l] = 0;
}

int kv_kda_host(df_kvcache *kv, int l, int drop, char *err, size_t errlen) {
    if (!kv->kda_be || !(kv->kda_dev[l] & KV_KDA_COPY)) return DF_OK;
    const uint64_t key = kv_layer_key(kv, l);
    if ((kv->kda_dev[l] & KV_KDA_NEWER) && kv->kda_be->kda_state(key, kv->kda_conv[l], kv->kda_S[l], DF_KDA_FETCH)) {
        if (err)
            snprintf(err, errlen, "KDA layer %d: the state could not be copied back from the GPU (%s)", l,
                     df_cuda_last_error());
        return DF_EUNSUPPORTED;
    }
    kv->kda_dev[l] &= (unsigned char)~KV_KDA_NEWER;
    if (drop) kda_drop(kv, l);
    return DF_OK;
}

/* every device copy forgotten (the host's state is about to be overwritten) */
static void kda_forget_copies(df_kvcache *kv) {
    if (!kv->kda_be) return;
    for (int l = 0; l < kv->n_layers; l++) kda_drop(kv, l);
    kv->kda_be = NULL;
}

void kv_recurrent_drop_snapshot(df_kvcache *kv) {
    for (int l = 0; l < kv->n_layers; l++) kv->kda_dev[l] &= (unsigned char)~KV_KDA_SNAP;
    kv->kda_snap_lost = 1;
}

int kv_recurrent_save(df_kvcache *kv, float *buf, int dev, char *err, size_t errlen) {
    kv_recurrent_drop_snapshot(kv); /* an earlier snapshot's device parts: the new one replaces it */
    kv->kda_snap = buf;
    kv->kda_snap_lost = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->mixer[l] != DF_MIXER_KDA) continue;
        float *p = snap_part(kv, buf, l);
        if (dev && (kv->kda_dev[l] & KV_KDA_COPY) &&
            kv->kda_be->kda_state(kv_layer_key(kv, l), NULL, NULL, DF_KDA_SNAP) == 0) {
            kv->kda_dev[l] |= KV_KDA_SNAP; /* kept on the device: p is written only if the copy is dropped */
            continue;
        }
        const int rc = kv_kda_host(kv, l, 0, err, errlen);
        if (rc) {
            kv->kda_snap_lost = 1;
            return rc;
        }
        memcpy(p, kv->kda_S[l], kda_S_floats(kv) * sizeof(float));
        memcpy(p + kda_S_floats(kv), kv->kda_conv[l], kda_conv_floats(kv) * sizeof(float));
    }
    return DF_OK;
}

int kv_recurrent_load(df_kvcache *kv, const float *buf, char *err, size_t errlen) {
    const int own = buf == kv->kda_snap;
    if (own && kv->kda_snap_lost) {
        kv_recurrent_drop_snapshot(kv); /* nothing of it to fetch as the copies go */
        kv_recurrent_reset(kv);
        if (err) snprintf(err, errlen, "the recurrent-state snapshot was lost (a copy back from the GPU failed)");
        return DF_EUNSUPPORTED;
    }
    int keep = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->mixer[l] != DF_MIXER_KDA) continue;
        if (own && (kv->kda_dev[l] & KV_KDA_SNAP)) { /* the device's snapshot becomes its current state */
            if (kv->kda_be->kda_state(kv_layer_key(kv, l), NULL, NULL, DF_KDA_RESTORE) == 0) {
                kv->kda_dev[l] = KV_KDA_COPY | KV_KDA_NEWER | KV_KDA_SNAP;
                keep = 1;
                continue;
            }
            kv_recurrent_drop_snapshot(kv); /* not expected: restore never fails on a held snapshot */
            kv_recurrent_reset(kv);
            if (err) snprintf(err, errlen, "KDA layer %d: the GPU's snapshot of the state could not be restored (%s)", l,
                              df_cuda_last_error());
            return DF_EUNSUPPORTED;
        }
        kda_drop(kv, l);
        const float *p = snap_part(kv, (float *)buf, l);
        memcpy(kv->kda_S[l], p, kda_S_floats(kv) * sizeof(float));
        memcpy(kv->kda_conv[l], p + kda_S_floats(kv), kda_conv_floats(kv) * sizeof(float));
    }
    if (!keep) kv->kda_be = NULL;
    return DF_OK;
}

void kv_recurrent_reset(df_kvcache *kv) {
    kda_forget_copies(kv);
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->mixer[l] != DF_MIXER_KDA) continue;
        memset(kv->kda_S[l], 0, kda_S_floats(kv) * sizeof(float));
        memset(kv->kda_conv[l], 0, kda_conv_floats(kv) * sizeof(float));
    }
}

uint64_t kv_bytes(const df_kvcache *kv) {
    int n_mla = 0;
    for (int l = 0; l < kv->n_layers; l++) n_mla += kv->mixer[l] != DF_MIXER_KDA;
    return (uint64_t)kv->cap * n_mla * (uint64_t)(kv->kv_lora + kv->rope) * sizeof(float) + kv_recurrent_bytes(kv);
}
