/*
 * store.h — the expert store: the ONE asynchronous interface through which the
 * engine gets routed experts, for demand and prefetch alike.
 *
 * Usage per MoE layer (engine):
 *   store_request(st, L, ids, n, STORE_DEMAND);        // start reads for misses (non-blocking)
 *   store_acquire(st, L, ids, n, views, err, errlen);   // wait; views[i] valid until release
 *   ... compute ...
 *   store_release(st, L, ids, n);
 * Prefetch is store_request(..., STORE_PREFETCH) for a later layer; demand reads
 * always go ahead of prefetch reads, and store_cancel_prefetch drops guesses that
 * were not started. Caching and prediction only change where bytes come from.
 */
#ifndef DF_STORE_H
#define DF_STORE_H

#include "../model/weights.h"
#include <stdint.h>

struct df_native; /* src/model/native.h */

typedef struct df_store df_store;

typedef enum { STORE_DEMAND = 0, STORE_PREFETCH = 1 } store_prio;

typedef struct {
    uint64_t cache_bytes;      /* bytes for expert slots; 0 = everything fits (cache all) */
    const char *expert_dirs;   /* comma-separated override of the manifest's pack directories; NULL = manifest */
    int io_depth;              /* queue depth per drive; 0 = default */
    int use_uring;             /* 1 = io_uring if available (default), 0 = pread pool */
    int verify;                /* verify XXH64 of an extent on its first read (default 1) */
    const char *heat_path;     /* persistent heat histogram file; NULL = none */
    const char *events_path;   /* JSONL events; NULL = none */
} store_opts;

typedef struct {
    uint64_t bytes_demand, bytes_prefetch;
    uint64_t hits, misses;
    uint64_t prefetch_issued, prefetch_useful, prefetch_cancelled;
    double stall_s;
    uint64_t resident_bytes;
    char io_engine[16];        /* "io_uring" | "pread" */
} store_stats;

void store_opts_default(store_opts *o);
int store_open(df_store **out, const struct df_native *nat, const store_opts *o, char *err, size_t errlen);
void store_close(df_store *st);

int store_request(df_store *st, int layer, const int *experts, int n, store_prio prio);
/* Blocks until every listed expert is resident and pinned; fills views[0..n-1].
 * Errors: DF_EIO (read failed), DF_EFORMAT (checksum mismatch: message names layer, expert, file). */
int store_acquire(df_store *st, int layer, const int *experts, int n, df_expert *views,
                  char *err, size_t errlen);
void store_release(df_store *st, int layer, const int *experts, int n);
void store_cancel_prefetch(df_store *st);
void store_get_stats(const df_store *st, store_stats *out);
void store_reset_stats(df_store *st);

#endif
