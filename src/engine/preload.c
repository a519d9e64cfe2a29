/*
 * preload.c — reading the routed experts into memory before the first token (`run`, `serve` and `bench decode`
 * with --preload): a model held in memory then decodes without first-use reads. Every MoE layer's experts, layer
 * by layer in ascending id, go through the expert source (the store: O_DIRECT reads, the next chunk requested
 * while the current one is taken, so the drive keeps several reads in flight); with a backend that has a device
 * tier (df_backend.dev_load, the GPU), each is uploaded into device memory and its host copy is only staging.
 * Nothing is evicted to make room: preloading stops at the first expert that does not fit the device tier (then
 * goes on into the host cache) or, without a device tier or once it is full, when the host cache's slots are
 * all used. Never changes results: it only decides where weights already exact are held.
 */
#include "engine.h"
#include "model/config.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

enum { PRELOAD_CHUNK_MAX = 16 };

/* The next chunk (at most `chunk`) of layer l's experts from *x on, into out; experts already in device memory
 * (dev) are counted in *on_device and skipped. Returns the chunk's size. */
static int next_chunk(const df_engine *e, int l, int E, int chunk, int dev, int *x, int *out, int *on_device) {
    int n = 0;
    for (; *x < E && n < chunk; (*x)++) {
        const int k = *x;
        if (dev && eng_dev_resident(e, l, k)) {
            (*on_device)++;
            continue;
        }
        out[n++] = k;
    }
    return n;
}

int eng_preload(df_engine *e, int host_slots, df_progress_fn progress, void *user, eng_preload_result *res, char *err,
                size_t errlen) {
    memset(res, 0, sizeof *res);
    const df_config *cfg = e->cfg;
    const int L = cfg->num_hidden_layers, E = cfg->n_routed_experts;
    if (!e->experts.acquire || E <= 0) return DF_OK;
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += config_layer_is_moe(cfg, l);
    res->total = n_moe * E;
    int chunk = e->max_acquire > 0 ? e->max_acquire : cfg->num_experts_per_tok;
    if (chunk > PRELOAD_CHUNK_MAX) chunk = PRELOAD_CHUNK_MAX;
    if (chunk < 1) chunk = 1;
    int dev = e->be->dev_load != NULL; /* cleared when the device tier is full */
    df_expert views[PRELOAD_CHUNK_MAX];
    int ids[PRELOAD_CHUNK_MAX], nxt[PRELOAD_CHUNK_MAX];
    int rc = DF_OK;
    for (int l = 0; l < L && rc == DF_OK; l++) {
        if (!config_layer_is_moe(cfg, l)) continue;
        /* the experts still to read, in chunks; chunk c + 1 is requested before chunk c is taken */
        int x = 0, nn = 0;
        int n = next_chunk(e, l, E, chunk, dev, &x, ids, &res->on_device);
        if (n) e->experts.request(e->experts.ctx, l, ids, n, STORE_DEMAND);
        while (n > 0) {
            if (!dev && res->in_host + n > host_slots) n = host_slots - res->in_host; /* what the host cache holds */
            if (n <= 0) { res->stopped = 1; break; }
            nn = next_chunk(e, l, E, chunk, dev, &x, nxt, &res->on_device);
            if (nn && (dev || res->in_host + n + nn <= host_slots)) e->experts.request(e->experts.ctx, l, nxt, nn, STORE_DEMAND);
            rc = e->experts.acquire(e->experts.ctx, l, ids, n, views, err, errlen);
            if (rc) break;
            for (int i = 0; i < n && rc == DF_OK; i++) {
                df_weight *w[3] = {&views[i].gate, &views[i].up, &views[i].down};
                for (int p = 0; p < 3 && dev; p++) {
                    w[p]->dev_key = DF_DEVKEY(e->dev_tag, l, ids[i], p);
                    const int r = e->be->dev_load(w[p]);
                    if (r < 0) {
                        rc = DF_EIO;
                        if (err && errlen)
                            snprintf(err, errlen, "preload: cannot copy layer %d expert %d into device memory", l, ids[i]);
                        break;
                    }
                    if (r == 1) dev = 0; /* the device tier is full: this one and the rest stay in the host cache */
                }
                if (rc) break;
                if (dev) res->on_device++;
                else res->in_host++;
            }
            e->experts.release(e->experts.ctx, l, ids, n);
            if (rc) break;
            for (int i = 0; i < n; i++)
                res->bytes += df_weight_bytes(&views[i].gate) + df_weight_bytes(&views[i].up) + df_weight_bytes(&views[i].down);
            if (progress && progress(user, "preload", (uint64_t)(res->on_device + res->in_host), (uint64_t)res->total)) {
                rc = DF_ECANCELLED;
                if (err && errlen) snprintf(err, errlen, "preload cancelled");
                break;
            }
            memcpy(ids, nxt, sizeof(int) * (size_t)nn);
            n = nn;
        }
        if (res->stopped) break;
    }
    return rc;
}
