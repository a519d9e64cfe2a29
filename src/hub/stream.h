/*
 * stream.h — streamed installs (`deltafin setup --stream`): routed experts fetched on demand.
 *
 * A streamed install is a native model directory (DIR/native) converted from a sparse copy of
 * the checkpoint (DIR/NAME: every shard at its full size, its safetensors header and every
 * non-expert tensor downloaded, routed-expert tensors left as holes), with sparse packs and two
 * more files:
 *   stream.json        {"repo", "revision", "mirror", "checkpoint": DIR/NAME, "shards": {FILE: sha256},
 *                      "disk_budget": bytes of fetched extents kept (0/absent = unbounded)}
 *   stream-state.bin   "DFSTRM1\0", u32 layers, u32 experts, u8 present[layers x experts],
 *                      u64 xxh64[layers x experts] (checksum of each fetched extent)
 * The source (a store_remote for df_model_opts.remote_source) answers the store's misses: an expert
 * not present is fetched by HTTP Range from the shard(s) holding its tensors (the safetensors header
 * gives the byte ranges; each answer's ETag must still be the shard's sha256), written into the
 * sparse checkpoint, assembled into its native extent exactly as `convert` does (hf_weight_copy),
 * written into the pack(s), fsynced, recorded in stream-state.bin, and from then on read locally.
 * Fetches run on `threads` worker threads. With a disk budget, the coldest present expert (heat = the store's
 * heat.bin prior + this run's uses; ties: least recently used) is evicted (a hole punched over it) before a
 * fetch would exceed it; experts used in the last 2 x top-k x MoE-layers uses are never evicted.
 */
#ifndef DF_HUB_STREAM_H
#define DF_HUB_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct stream_src stream_src;

typedef struct {
    uint64_t net_bytes;        /* body bytes fetched from the mirror */
    uint64_t fetches;          /* experts fetched */
    double fetch_s, fetch_max_s; /* summed and worst wall time of one expert fetch (request to pack written) */
    uint64_t local_hits;       /* store misses served from local disk (the expert was present) */
    uint64_t present, total;   /* experts present locally / all routed experts */
    uint64_t evictions;        /* fetched experts dropped to stay under the disk budget */
} stream_stats;

/* 1 when model_dir is a streamed install (has stream.json). */
int stream_is_streamed(const char *model_dir);
/* Open the source of a streamed install; threads 0 = 4. DF_E* with a message naming the file. */
int stream_open(stream_src **out, const char *model_dir, int threads, char *err, size_t errlen);
/* The store_remote (src/store/store.h) to put in df_model_opts.remote_source. */
const void *stream_remote(stream_src *s);
void stream_get_stats(stream_src *s, stream_stats *out);
/* One line: network bytes, fetches, mean / worst fetch latency, local hits, experts present. */
void stream_print_stats(stream_src *s, FILE *f);
/* Fetch one expert now (blocking), unless present: 0 fetched, 1 already present, <0 DF_E*. */
int stream_fetch_now(stream_src *s, int layer, int expert, char *err, size_t errlen);
/* Bytes one expert extent of `layer` takes in the packs (0 for a dense layer or a bad index). */
uint64_t stream_expert_bytes(stream_src *s, int layer);
/* `setup --full` on a streamed install: make the sparse shard DIR/FILE a resumable partial download that
 * keeps what is there (header, spine tensors, the tensors of every expert fetched so far; from the shard's
 * header and model_dir's stream-state.bin), in chunks of `chunk` bytes. *kept gets the bytes kept. The spine
 * counts only while FILE.spine-ok is there (FILE.experts-only: dropped). A shard with neither is left alone. */
int stream_seed_full(const char *model_dir, const char *dir, const char *file, uint64_t size, const char *sha256,
                     uint64_t chunk, uint64_t *kept, char *err, size_t errlen);

/* After `setup --stream` converted the sparse checkpoint: punch holes over the spine tensors of the sparse
 * shard DIR/FILE (native/spine.bin holds them now; whole 4 KiB pages only), so a streamed install holds its
 * spine once. FILE.spine-ok becomes FILE.experts-only. *dropped gets the bytes freed. */
int stream_drop_spine(const char *dir, const char *file, uint64_t *dropped, char *err, size_t errlen);

/* Re-read every expert present locally and compare its XXH64 with the one recorded when it was fetched
 * (`deltafin doctor`). *n_ok / *n_bad get the counts; each mismatch or read error is printed to `f` naming
 * layer, expert and pack. Returns n_bad, or <0 DF_E* when nothing could be checked. */
int stream_verify_local(stream_src *s, uint64_t *n_ok, uint64_t *n_bad, FILE *f);
/* Close (after the model that used it is closed). */
void stream_close(stream_src *s);
/* Percentage of routed experts present locally (100 x present / all, as stream_print_stats prints it, so both round
 * alike), from stream-state.bin; -1 when unreadable. */
double stream_local_percent(const char *model_dir);

/* Used by `setup --stream` after converting the sparse checkpoint: punch holes over the packs (no
 * expert is local yet) and write stream.json (json_text) and an all-missing stream-state.bin. */
int stream_init_files(const char *model_dir, const char *json_text, char *err, size_t errlen);

/* `setup --stream`: make DIR/FILE the sparse copy of shard FILE (size bytes, sha256): its header and
 * every tensor that is not a routed expert fetched by range (pieces of at most 4 MiB on `connections`
 * threads), the rest left as holes. Resumable per shard
 * (FILE.spine-ok marks a finished one). *fetched gets the bytes downloaded. */
int stream_fetch_spine(const void *hub, const char *dir, const char *file, uint64_t size, const char *sha256, int connections,
                       uint64_t *fetched, char *err, size_t errlen);

#endif
