/* dev_cache_backend.h — a test backend: the CPU's, plus a device tier of routed experts emulated on the host the way
 * the CUDA backend keeps one (kernels/backend.h dev_pin / dev_unpin / dev_has / dev_load / dev_drop_tag): an expert
 * matrix is cached under its df_weight.dev_key (DF_DEVKEY: the model's tag, layer, expert, part) when the engine
 * computes with it (df_backend.mlp, which caches and then declines, so the engine computes on the host) or preloads
 * it; dev_pin hands out the cached copy. So a model that found another model's experts under its own keys computes
 * with them, as it would on the GPU: tests that compare a model's output with it alone catch it on any machine.
 * Register with dcb_register(); the name is "cpu-devcache". Single-threaded use per model (the engine calls the
 * mlp hook from its pool's threads: a mutex guards the table). */
#ifndef DF_TEST_DEV_CACHE_BACKEND_H
#define DF_TEST_DEV_CACHE_BACKEND_H

#include "kernels/backend.h"
#include "model/weights.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { DCB_MAX = 8192 };
typedef struct {
    uint64_t key;
    df_weight w; /* data / scale: the entry's own copies */
    int pins, used;
} dcb_entry;
static dcb_entry dcb_tab[DCB_MAX];
static df_backend dcb_be;
static pthread_mutex_t dcb_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long dcb_n_cached, dcb_n_pinned;

static dcb_entry *dcb_find(uint64_t key) {
    for (int i = 0; i < DCB_MAX; i++)
        if (dcb_tab[i].used && dcb_tab[i].key == key) return &dcb_tab[i];
    return NULL;
}
/* w (host data, dev_key set) into the table when not there: 0, or -1 (no key, no data, full, out of memory) */
static int dcb_cache(const df_weight *w) {
    if (!w || !w->dev_key || !w->data) return -1;
    pthread_mutex_lock(&dcb_mu);
    int rc = 0;
    if (!dcb_find(w->dev_key)) {
        dcb_entry *e = NULL;
        for (int i = 0; i < DCB_MAX && !e; i++)
            if (!dcb_tab[i].used) e = &dcb_tab[i];
        const size_t db = df_weight_data_bytes(w->type, w->rows, w->cols);
        const size_t sb = w->scale ? df_weight_scale_bytes(w->type, w->rows, w->cols) : 0;
        void *d = e ? malloc(db) : NULL, *sc = e && sb ? malloc(sb) : NULL;
        if (!e || !d || (sb && !sc)) {
            free(d);
            free(sc);
            rc = -1;
        } else {
            memcpy(d, w->data, db);
            if (sb) memcpy(sc, w->scale, sb);
            e->key = w->dev_key;
            e->w = *w;
            e->w.data = d;
            e->w.scale = sc;
            e->pins = 0;
            e->used = 1;
            dcb_n_cached++;
        }
    }
    pthread_mutex_unlock(&dcb_mu);
    return rc;
}
static void dcb_free(dcb_entry *e) {
    free((void *)e->w.data);
    free((void *)e->w.scale);
    memset(e, 0, sizeof *e);
}
static int dcb_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
                   const float *x, int T, float *out) {
    (void)act; (void)beta; (void)lb; (void)x; (void)T; (void)out;
    dcb_cache(gate);
    dcb_cache(up);
    dcb_cache(down);
    return -1; /* the engine computes on the host data (a pinned view's: the cached copy) */
}
static int dcb_pin(uint64_t key, df_weight *w) {
    pthread_mutex_lock(&dcb_mu);
    dcb_entry *e = dcb_find(key);
    if (e) {
        *w = e->w;
        e->pins++;
        dcb_n_pinned++;
    }
    pthread_mutex_unlock(&dcb_mu);
    return e != NULL;
}
static void dcb_unpin(uint64_t key) {
    pthread_mutex_lock(&dcb_mu);
    dcb_entry *e = dcb_find(key);
    if (e && e->pins > 0) e->pins--;
    pthread_mutex_unlock(&dcb_mu);
}
static int dcb_has(uint64_t key) {
    pthread_mutex_lock(&dcb_mu);
    const int r = dcb_find(key) != NULL;
    pthread_mutex_unlock(&dcb_mu);
    return r;
}
static int dcb_load(const df_weight *w) { return dcb_cache(w) ? -1 : 0; }
static void dcb_drop_tag(int tag) {
    pthread_mutex_lock(&dcb_mu);
    for (int i = 0; i < DCB_MAX; i++)
        if (dcb_tab[i].used && DF_DEVKEY_TAG(dcb_tab[i].key) == tag) dcb_free(&dcb_tab[i]);
    pthread_mutex_unlock(&dcb_mu);
}
static int dcb_live(void) {
    int n = 0;
    for (int i = 0; i < DCB_MAX; i++) n += dcb_tab[i].used;
    return n;
}

static void dcb_register(void) {
    dcb_be = *df_backend_get("cpu");
    dcb_be.name = "cpu-devcache";
    dcb_be.mlp = dcb_mlp;
    dcb_be.mlp_group = NULL;
    dcb_be.dev_pin = dcb_pin;
    dcb_be.dev_unpin = dcb_unpin;
    dcb_be.dev_has = dcb_has;
    dcb_be.dev_load = dcb_load;
    dcb_be.dev_drop_tag = dcb_drop_tag;
    df_backend_register(&dcb_be);
}

#endif
