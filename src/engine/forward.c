/*
 * forward.c — T tokens through the whole model (transformers DeepseekV3Model):
 *   x = embed(ids); per layer: x += MLA(RMSNorm(x)); x += FFN(RMSNorm(x));
 *   logits = lm_head(RMSNorm(x)) for the last (or every) position.
 * Also the weight-byte-counting matmul wrapper and the router prefetch hook.
 */
#include "engine.h"
#include "deltafin.h"
#include "spine_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eng_matmul(df_engine *e, const df_weight *w, const float *x, int T, float *y) {
    e->be->matmul(e->pool, w, x, T, y);
    e->weight_bytes += df_weight_bytes(w);
}

int forward(df_engine *e, df_kvcache *kv, int n_past, const int32_t *ids, int T, float *logits, int all_logits,
            int (*progress)(void *, const char *, uint64_t, uint64_t), void *user, char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_spine *sp = e->spine;
    const int D = cfg->hidden_size, L = cfg->num_hidden_layers;
    if (T <= 0) return DF_OK;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= sp->embed.rows) {
            if (err) snprintf(err, errlen, "token id %d at index %d is outside the vocabulary [0, %lld)", ids[t], t,
                              (long long)sp->embed.rows);
            return DF_EINVAL;
        }
    if (n_past + T > kv->n_ctx) {
        if (err) snprintf(err, errlen, "context full: %d + %d tokens exceed the session's %d positions", n_past, T,
                          kv->n_ctx);
        return DF_ECONTEXT;
    }
    int rc = DF_OK;
    float *x = malloc(sizeof(float) * (size_t)T * D), *h = malloc(sizeof(float) * (size_t)T * D),
          *a = malloc(sizeof(float) * (size_t)T * D);
    if (!x || !h || !a) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "forward: out of memory for %d tokens", T);
        goto done;
    }
    if (e->stream) sst_start(e->stream, sst_first_streamed(e->stream)); /* usually already read after the last call */
    for (int t = 0; t < T; t++) e->be->decode_row(&sp->embed, ids[t], x + (int64_t)t * D);
    e->weight_bytes += df_weight_bytes(&sp->embed) / (uint64_t)sp->embed.rows * (uint64_t)T;
    for (int l = 0; l < L; l++) {
        if (e->stream) {
            /* streamed layer: wait for its staging buffer, then read layer l+1 into the other one meanwhile */
            rc = sst_layer(e->stream, l, &e->io_wait_s, err, errlen);
            if (rc) goto done;
            if (l + 1 < L) sst_start(e->stream, l + 1);
        }
        const df_layer_weights *lw = &sp->layers[l];
        for (int t = 0; t < T; t++)
            e->be->rmsnorm(h + (int64_t)t * D, x + (int64_t)t * D, lw->attn_norm, D, cfg->rms_norm_eps);
        rc = attn_forward(e, l, kv, n_past, h, T, a, err, errlen);
        if (rc) goto done;
        for (int64_t i = 0; i < (int64_t)T * D; i++) x[i] += a[i];
        if (e->prefetch && l + 1 < L) {
            /* the router of a streamed layer l+1 is in its staging buffer (read since layer l began) */
            if (e->stream && (rc = sst_layer(e->stream, l + 1, &e->io_wait_s, err, errlen))) goto done;
            moe_prefetch(e, l + 1, x, T);
        }
        for (int t = 0; t < T; t++)
            e->be->rmsnorm(h + (int64_t)t * D, x + (int64_t)t * D, lw->ffn_norm, D, cfg->rms_norm_eps);
        rc = ffn_forward(e, l, h, T, a, err, errlen);
        if (rc) goto done;
        for (int64_t i = 0; i < (int64_t)T * D; i++) x[i] += a[i];
        if (progress && progress(user, "layers", (uint64_t)l + 1, (uint64_t)L)) {
            rc = DF_ECANCELLED;
            if (err) snprintf(err, errlen, "evaluation cancelled at layer %d", l);
            goto done;
        }
    }
    if (logits) {
        int first = all_logits ? 0 : T - 1, n = T - first;
        for (int t = first; t < T; t++)
            e->be->rmsnorm(h + (int64_t)(t - first) * D, x + (int64_t)t * D, sp->final_norm, D, cfg->rms_norm_eps);
        eng_matmul(e, &sp->lm_head, h, n, logits);
    }
done:
    /* the next call's first streamed layer is read while the caller samples */
    if (e->stream) sst_start(e->stream, sst_first_streamed(e->stream));
    free(x);
    free(h);
    free(a);
    return rc;
}
