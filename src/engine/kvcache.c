/*
 * kvcache.c — the MLA KV cache of one session: per layer, the normalized
 * latent c_kv [kv_lora_rank] and the roped shared key k_pe [qk_rope_head_dim]
 * of every position, fp32. Grows by doubling up to n_ctx, so a session with a
 * large context limit only pays for the positions it uses.
 */
#include "engine.h"
#include "deltafin.h"

#include <stdlib.h>
#include <string.h>

int kv_init(df_kvcache *kv, const df_config *cfg, int n_ctx) {
    memset(kv, 0, sizeof *kv);
    kv->n_layers = cfg->num_hidden_layers;
    kv->kv_lora = cfg->kv_lora_rank;
    kv->rope = cfg->qk_rope_head_dim;
    kv->n_ctx = n_ctx;
    kv->c = calloc((size_t)kv->n_layers, sizeof(float *));
    kv->kpe = calloc((size_t)kv->n_layers, sizeof(float *));
    if (!kv->c || !kv->kpe) { kv_free(kv); return DF_ENOMEM; }
    return DF_OK;
}

int kv_reserve(df_kvcache *kv, int n) {
    if (n > kv->n_ctx) return DF_ECONTEXT;
    if (n <= kv->cap) return DF_OK;
    int cap = kv->cap ? kv->cap : 64;
    while (cap < n) cap *= 2;
    if (cap > kv->n_ctx) cap = kv->n_ctx;
    for (int l = 0; l < kv->n_layers; l++) {
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
    if (kv->c) for (int l = 0; l < kv->n_layers; l++) free(kv->c[l]);
    if (kv->kpe) for (int l = 0; l < kv->n_layers; l++) free(kv->kpe[l]);
    free(kv->c);
    free(kv->kpe);
    kv->c = kv->kpe = NULL;
    kv->cap = 0;
}

uint64_t kv_bytes(const df_kvcache *kv) {
    return (uint64_t)kv->cap * kv->n_layers * (uint64_t)(kv->kv_lora + kv->rope) * sizeof(float);
}
