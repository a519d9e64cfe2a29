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
#include <stddef.h>
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
    /* --- added by the store owner (issue 4) --- */
    uint64_t io_bytes;         /* size of one read request (bytes, multiple of 4096); 0 = default 1 MiB */
    double hot_fraction;       /* share of the slots that may be pinned for the learned hot tier; <0 = default 0.1 */
    double heat_half_life;     /* half-life of the persistent heat, in expert acquisitions; 0 = default 2^20 */
    int policy;                /* eviction: 0 = recency-weighted frequency + heat (default), 1 = plain LRU (for comparison) */
    double decay;              /* policy 0: weight of an access per token of age (0 < decay <= 1; 1 = pure frequency);
                                  0 = default 0.8 */
    const struct store_remote_s *remote; /* experts not on local disk yet (see store_remote below); NULL = none */
    int no_prefault;           /* 1 = slot buffers are not faulted in ahead of their first read (default 0: they are) */
    /* Optional: page-lock each slot buffer for a device's DMA (the CUDA backend: copies from it to the GPU run at
     * the bus's speed and asynchronously); pin returns 0 when done (a buffer it refuses stays pageable: same
     * bytes, slower copies); unpin before the buffer is freed. NULL = none. */
    int (*pin)(void *p, size_t n);
    void (*unpin)(void *p);
} store_opts;

typedef struct {
    uint64_t bytes_demand, bytes_prefetch;
    uint64_t hits, misses;
    uint64_t prefetch_issued, prefetch_useful, prefetch_cancelled;
    double stall_s;
    uint64_t resident_bytes;
    char io_engine[16];        /* "io_uring" | "pread" */
    /* --- added by the store owner (issue 4) --- */
    int n_slots;               /* expert slots in the cache */
    int n_drives;              /* I/O queues (one per expert directory) */
    uint64_t drive_bytes[16];  /* bytes read per drive */
    double drive_busy_s[16];   /* seconds with >= 1 read in flight per drive; GB/s = bytes / busy */
    uint64_t bytes_verified;   /* bytes checksummed on first read */
    int n_slots_pinned;        /* slot buffers page-locked by store_opts.pin */
    uint64_t slot_bytes;       /* bytes of one slot buffer */
    int io_depth;              /* reads in flight per drive (store_opts.io_depth resolved) */
    uint64_t io_bytes;         /* bytes of one read request (store_opts.io_bytes resolved) */
} store_stats;

void store_opts_default(store_opts *o);
int store_open(df_store **out, const struct df_native *nat, const store_opts *o, char *err, size_t errlen);
void store_close(df_store *st);

int store_request(df_store *st, int layer, const int *experts, int n, store_prio prio);
/* (added note, store owner) A DEMAND request for layer L is taken as L's complete set for this forward: guesses for
 * layers <= L still queued are dropped (unstarted) or stopped after their in-flight chunks. Never blocks; experts
 * that find no free slot now are loaded by store_acquire. */
/* Blocks until every listed expert is resident and pinned; fills views[0..n-1].
 * Errors: DF_EIO (read failed), DF_EFORMAT (checksum mismatch: message names layer, expert, file). */
int store_acquire(df_store *st, int layer, const int *experts, int n, df_expert *views,
                  char *err, size_t errlen);
void store_release(df_store *st, int layer, const int *experts, int n);
void store_cancel_prefetch(df_store *st);
void store_get_stats(const df_store *st, store_stats *out);
void store_reset_stats(df_store *st);
/* on = 0: acquisitions from now on update only recency, not the eviction frequency nor the heat histogram saved at
 * close (e.g. a preload that touches every expert once); on = 1 (the default): counted again. */
void store_set_heat_counting(df_store *st, int on);

/* --- added by the store owner (issue 4) --- */

/* How many experts one store_acquire may pin at once (the engine chunks bigger
 * sets: acquire, compute, release, next chunk). Asking for more is DF_EBUDGET. */
int store_max_acquire(const df_store *st);

/* Bytes one expert slot takes in RAM for this model (stride, or n_files * stripe when striped). */
uint64_t store_slot_bytes(const struct df_native *nat);

/* --ram-budget: given the whole budget, the resident spine bytes, the KV cache
 * bytes and other engine overhead (activations, staging), returns in *cache_bytes
 * what store_opts.cache_bytes should be. budget 0 = unlimited -> *cache_bytes 0.
 * Also reserved: the store's own tables (64 KiB + 22 bytes per expert). Code,
 * libraries and thread stacks (~9 MiB of RSS) are not counted.
 * Minimum: spine + kv + other + that + 2 * top_k slots (one layer computing,
 * one loading). Below it: DF_EBUDGET with a message that states the minimum. */
int store_budget(const struct df_native *nat, uint64_t budget, uint64_t spine_bytes, uint64_t kv_bytes,
                 uint64_t other_bytes, uint64_t *cache_bytes, char *err, size_t errlen);

/* present[i] = 2 when expert experts[i] of the layer is in memory now, 1 when it has a slot and is being read,
 * else 0. A hint for the order of acquires (a set larger than the cache: its members with a slot first; a decode
 * step computes the members in memory while the rest are read); no side effect. */
void store_present(df_store *st, int layer, const int *experts, int n, unsigned char *present);

/* The tiers of every expert of one (MoE) layer at this moment, for a live view: state[e] = 2 in memory, 1 being read,
 * 0 on the drives only; heat[e] (optional) = its eviction score (recency-weighted use count, plus the heat tier's
 * weight when one is loaded: higher stays longer). n_experts entries each; no side effect. */
void store_map(df_store *st, int layer, unsigned char *state, float *heat);

/* Measured prefetch recall of one layer: guesses for `layer` later acquired /
 * guesses issued for it (since open), or -1 when fewer than min_issued guesses
 * were made. The engine can stop predicting layers whose recall is low. */
double store_layer_recall(const df_store *st, int layer, int min_issued);

/* Writes one JSONL line {"ev":"token","pos":pos,...} with the counters since the
 * previous call (bytes demand/prefetch, hits, misses, stall) to events_path. */
void store_token_event(df_store *st, int64_t pos);

/* --- remote source (streamed installs: src/hub/stream.c) ---
 * store_opts.remote, when set, is asked on every miss: lookup() returns 1 when the expert is not on local disk
 * yet (the store then calls fetch() instead of reading; fetch starts getting the extent into the pack files and
 * must not block; whoever completes it calls store_remote_done with the token, and the store then reads the
 * extent locally like any other), or 0 when it is local, setting *xxh64 to the checksum of the local extent
 * (used for the first-read verification instead of the manifest's). */
typedef struct store_remote_s {
    int (*lookup)(void *user, int layer, int expert, uint64_t *xxh64);
    void (*fetch)(void *user, int layer, int expert, void *token);
    void *user;
} store_remote;
/* Completion of a fetch: rc 0 = the extent is in the packs with checksum xxh64; else DF_E* and a message
 * (the acquire waiting for it fails with them). Any thread; mu not held by the caller. */
void store_remote_done(void *token, int rc, const char *msg, uint64_t xxh64);

#endif
