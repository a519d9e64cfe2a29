/*
 * store_internal.h — private structures of the expert store (src/store/).
 *
 * Model: a fixed set of slots (one expert extent each) indexed by key
 * (layer, expert); a list of pending load jobs (demand list, prefetch list);
 * one I/O queue per drive (= per expert directory), served by an io_uring
 * thread or a pool of pread threads. One mutex guards all of it; the data
 * copies (reads, checksums) happen outside it.
 */
#ifndef DF_STORE_INTERNAL_H
#define DF_STORE_INTERNAL_H

#include "store.h"
#include "../model/native.h"
#include <pthread.h>
#include <stdio.h>

#define STORE_MAX_DRIVES 16
#define STORE_PREFAULT_THREADS 2

typedef enum { SLOT_FREE = 0, SLOT_LOADING, SLOT_READY, SLOT_ERROR } slot_state;

struct store_job;

typedef struct {
    uint8_t *buf;           /* aligned, slot_bytes; NULL until first use */
    int key;                /* layer * n_experts + expert, -1 when free */
    slot_state state;
    int pins;               /* acquire pins */
    int demand_hold;        /* requested on demand, not yet acquired: not evictable */
    int fresh;              /* loaded (or upgraded) by a demand read since the last acquire: a miss */
    int prefetched;         /* brought in by a prefetch and not yet acquired */
    int prefaulted;         /* buffer faulted in by a prefault thread, slot not taken by a load yet (mu) */
    uint64_t last_use;      /* clock of the last acquire */
    struct store_job *job;  /* while LOADING */
    int err;                /* DF_E* when SLOT_ERROR */
    char *errmsg;
} store_slot;

/* One expert read, split into one piece per stripe file; each piece is read in
 * chunks of io_bytes by the queue of the drive that holds that file. */
typedef struct store_job {
    int slot, layer, expert;
    store_prio prio;
    int started;                    /* some chunk was handed to a drive */
    int abandoned;                  /* a wrong guess stopped mid-read: its slot is freed when in-flight chunks end */
    int n_pieces;
    int piece_drive[STORE_MAX_DRIVES];
    int piece_fd[STORE_MAX_DRIVES];      /* O_DIRECT fd (or buffered if O_DIRECT unavailable) */
    int piece_fd_buf[STORE_MAX_DRIVES];  /* buffered fd (fallback for unaligned / EINVAL) */
    int piece_file[STORE_MAX_DRIVES];    /* index into layer's files (for messages) */
    uint64_t piece_off[STORE_MAX_DRIVES];   /* file offset of the piece */
    uint64_t piece_len[STORE_MAX_DRIVES];   /* bytes of the piece */
    uint64_t piece_next[STORE_MAX_DRIVES];  /* bytes of the piece handed out so far */
    int chunks_out;                 /* chunks handed out and not completed */
    int err;
    char errmsg[512];
    struct store_job *next, *prev;  /* in a pending list while it has unissued chunks */
    int in_list;                    /* 0 none, 1 demand, 2 prefetch */
    struct df_store *st;            /* for store_remote_done */
    int remote;                     /* 1 while a remote fetch of the extent is under way (not in a list) */
    double t_start;
} store_job;

typedef struct {
    store_job *job;
    int piece;
    int fd, fd_buf;
    uint64_t off, len;      /* file offset, bytes */
    uint8_t *dst;
} store_chunk;

typedef struct store_drive {
    struct df_store *st;
    int id;
    char dir[1024];
    pthread_t *threads;
    int n_threads;
    pthread_cond_t cv;      /* work available */
    uint64_t bytes;         /* completed */
    double busy_s;          /* time with >= 1 read in flight */
    int inflight;
    double busy_since;
    int use_uring;
} store_drive;

typedef struct {
    int n_files;
    int *fd, *fd_buf;       /* [n_files] */
    int *drive;             /* [n_files] */
    char **files;
    uint64_t stripe_bytes;  /* largest stripe */
    uint64_t stripe_size[STORE_MAX_DRIVES];        /* stripe k's bytes (file k holds it at expert * size) */
    uint64_t stripe_begin[STORE_MAX_DRIVES + 1];   /* stripe k's offset in the slot; [n_files] = slot bytes */
    uint64_t *xxh64;        /* [n_experts] */
} store_layer;

struct df_store {
    const df_native *nat;
    store_opts o;
    int n_layers, n_experts, top_k;
    uint64_t stride, slot_bytes, io_bytes;
    store_layer *layers;        /* [n_layers], n_files == 0 for dense layers */
    int n_slots, n_slots_alloc; /* slots usable / slots whose buffer was allocated */
    int n_slots_pinned;         /* buffers page-locked by o.pin (atomic: the prefault threads allocate too) */
    store_slot *slots;
    int *free_stack, n_free;    /* slots never used or freed */
    int *slot_of;               /* [n_layers * n_experts] -> slot or -1 */
    uint8_t *verified;          /* [n_layers * n_experts] */
    uint8_t *hot;               /* [n_layers * n_experts] pinned hot tier membership */
    float *freq;                /* [n_layers * n_experts] recency-weighted access count at t_last */
    uint32_t *t_last;           /* [n_layers * n_experts] layer clock of the last access */
    uint32_t *lclock;           /* [n_layers] visits of each layer (~ tokens) */
    int last_layer;
    float decay_pow[64];        /* decay^k */
    float *heat;                /* [n_layers * n_experts] persistent heat (loaded), NULL if none */
    double *count_run;          /* [n_layers * n_experts] acquisitions this run */
    uint64_t acq_total, clock;
    int no_heat;                /* store_set_heat_counting(st, 0): acquisitions update recency only */
    int heat_keep;              /* heat_path holds something other than this model's heat file: never written */
    uint32_t *pf_issued, *pf_useful; /* [n_layers] prefetch guesses issued / later acquired */
    int hot_limit, hot_loaded;

    pthread_mutex_t mu;
    pthread_cond_t done_cv;     /* some job finished */
    store_job *dem_head, *dem_tail, *pre_head, *pre_tail;
    int n_drives;
    store_drive drives[STORE_MAX_DRIVES];
    int stopping;
    /* checksum queue: jobs whose bytes are all read and still need XXH64, verified and published by
     * n_verifiers threads, so a drive's queue is refilled while a finished expert is hashed */
    store_job *ver_head, *ver_tail;
    pthread_cond_t ver_cv;
    pthread_t verifiers[STORE_MAX_DRIVES];
    int n_verifiers, ver_stop;

    /* prefault threads (a RAM budget only): allocate and touch the slot buffers ahead of their first read
     * (store.c slot_alloc / prefault_main) */
    pthread_t prefault[STORE_PREFAULT_THREADS];
    int prefault_on, prefault_stop;   /* threads started; stop asked (mu) */
    int prefault_next;                /* next slot to prefault (mu) */
    /* Without a budget (every expert has a slot) the threads stay only prefault_ahead slots ahead of the loads:
     * prefault_ready = prefaulted slots not taken yet (mu); they wait on prefault_cv while it is >= ahead. */
    int prefault_ahead, prefault_ready;
    pthread_cond_t prefault_cv;

    store_stats stats;
    store_stats last_tok;       /* stats at the previous store_token_event */
    FILE *events;
    double t0;
    int uring_ok;
};

double store_now(void);
static inline uint64_t df_round_up_4k(uint64_t x) { return (x + 4095) / 4096 * 4096; }
/* store_io.c */
int store_io_start(df_store *st, char *err, size_t errlen);
void store_io_stop(df_store *st);
/* Hand out the next chunk for drive d (demand first); mu held. Returns 1 if one was taken. */
int store_take_chunk(df_store *st, int d, store_chunk *c);
/* Called (mu NOT held) when a chunk finished with res = 0 or negative DF_E* and message. */
void store_chunk_done(df_store *st, int d, store_chunk *c, int res, const char *msg);
/* store.c: job finished (mu NOT held); verifies and publishes. */
void store_job_finish(df_store *st, store_job *j);
/* store_heat.c */
/* Loads o.heat_path at open: this model's heat file seeds the eviction score and forms the hot tier; a missing or
 * empty file is created at close. Anything else there (not a regular file, unreadable, not a heat file, another
 * model's, damaged) is not used and never written (heat_keep): one "deltafin: warning:" line on stderr says so.
 * Returns 0 (no case is an error). */
int store_heat_load(df_store *st);
/* Saves this run's acquisitions into o.heat_path at close (decayed old heat + counts; tmp + fsync + rename). Not
 * when heat_keep is set, or when the file has become something other than this model's heat file since (a warning,
 * as at load). A failed write, fsync or rename prints one warning naming the path and strerror and removes the
 * temporary file; the old file stays as it was. */
void store_heat_save(df_store *st);
void store_event(df_store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
