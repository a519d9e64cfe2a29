/*
 * bench_common.h — helpers shared by the `deltafin bench` subcommands (implemented in cmd_bench.c).
 */
#ifndef DF_CLI_BENCH_COMMON_H
#define DF_CLI_BENCH_COMMON_H

#include "model/native.h"
#include "store/store_bench.h"

#include <stddef.h>

/* --model DIR of a benchmark that measures a native model's pack files: 0 when DIR holds manifest.json;
 * else a message naming `deltafin bench CMD` and DIR and the exit status: 1 no such directory or no model
 * there, 2 a Hugging Face checkpoint (config.json: convert it first and pass the output). */
int bench_check_native(const char *cmd, const char *model);
/* --model DIR of the benchmarks that open a model (decode, prefill, batch, cache, store): a native model is used as it
 * is; a Hugging Face checkpoint (config.json) is converted once into the conversion cache under cache_dir (--cache-dir;
 * NULL = the default, $XDG_CACHE_HOME/deltafin), as `run` does, and *model points at the converted directory (conv,
 * cap bytes); how (if non-NULL) gets ", DIR converted into the conversion cache (CONVERTED_DIR)" appended. The installed
 * default model (how from cli_default_model: "installed ...") is checked first as `deltafin list` checks it: damaged,
 * the message names it and the setup command that repairs it (cli_default_model_repair). 0, else a message naming
 * `deltafin bench CMD` and the exit status (1). */
int bench_native_model(const char *cmd, const char **model, const char *cache_dir, char *conv, size_t cap, char *how,
                       size_t howcap);
/* Evict a model's files from the page cache, for a cold measurement without touching other processes' cached
 * files and without root: every regular file of the model directory `model` and of each directory of the
 * comma-separated `pack_dirs` (either may be NULL) written back and dropped (posix_fadvise POSIX_FADV_DONTNEED).
 * 1 when every directory could be read, else 0. */
int bench_drop_caches(const char *model, const char *pack_dirs);
/* The directories of the model's expert packs (the stripes of its first MoE layer), comma-separated,
 * in stripe order, into dirs (cap bytes). */
void bench_pack_dirs(const df_native *nat, char *dirs, size_t cap);
/* I/O benchmark options that read like the engine's expert loads: whole extents of `stride` bytes, top_k of
 * them at once, at queue depth qd, over the pack files only (a model directory also holds spine.bin). */
void bench_expert_io_opts(store_bench_opts *bo, const char *dirs, int qd, uint64_t stride, int top_k, double seconds);
/* --io-buffer of bench decode / prefill: 0 (none) or a pool larger than the qd reused 1 MiB buffers of the default
 * B; else prints "deltafin bench CMD: --io-buffer ..." naming the minimum and returns 2. */
int bench_check_io_buffer(const char *cmd, uint64_t io_buffer, int qd);

/* The model an events file (run / bench decode --events) was recorded on: the store's "open" event names it
 * ({"ev":"open","model":"NAME","slots":...,"slot_bytes":B,"drives":D,...}; the name is written unescaped, so it is
 * read up to the ","slots": that follows it). */
typedef struct {
    char model[160];    /* the model's name (its manifest's "name", else its directory's) */
    uint64_t slot_bytes; /* one expert slot: the expert extent, its stripes rounded up to 4 KiB pages; 0 unknown */
    int drives;          /* the expert directories it read from */
} bench_open_ev;
/* 1 with *o filled when line is an "open" event of the store, else 0 */
int bench_open_event(const char *line, bench_open_ev *o);
/* 1 when the open event o has the expert shape of the model nat: an expert slot of its expert size (the stripe layout
 * may differ: slot_bytes within the page rounding of nat's expert stride over the stripes), else 0. The names are not
 * compared: the same checkpoint has another name in a folder of another name (a Hugging Face directory is named by its
 * folder, a converted model by its manifest). */
int bench_open_matches(const bench_open_ev *o, const df_native *nat);
/* The messages of a trace given to `bench CMD` with --model model_arg (the directory as given; nat: that model):
 * bench_trace_foreign: "deltafin bench CMD: FLAG PATH was recorded on another model: "A" (expert slots of B bytes[;
 * why]), not on --model DIR ("B", ...): record a trace with this model (RECORD) or pass --model the model the trace was
 * recorded on", the caller returns 1; why (NULL: none) says how the trace's experts are not the model's;
 * bench_trace_unchecked: one warning line, the trace has no open event (an older events file) so its model cannot be
 * checked. */
void bench_trace_foreign(const char *cmd, const char *flag, const char *path, const bench_open_ev *o, const df_native *nat,
                         const char *model_arg, const char *why);
void bench_trace_unchecked(const char *cmd, const char *flag, const char *path, const df_native *nat);
/* The verdict on a trace with open events (opens: the n distinct ones) for --model model_arg (nat), checked before
 * anything is printed or measured; why: NULL when every expert the trace acquires is a routed expert of nat, else how
 * not (for the message). The trace is of another model, and refused (bench_trace_foreign, 1), when the shapes differ:
 * an open event's expert slot is not nat's (bench_open_matches) or its experts are not nat's. Otherwise it is accepted
 * (0); an open event that names another model (only the name differs) gets one note line on stderr naming both names:
 * "deltafin bench CMD: note: FLAG PATH was recorded on "A", --model is "B": the same expert shapes, taken as the same
 * model". */
int bench_trace_verdict(const char *cmd, const char *flag, const char *path, const bench_open_ev *opens, int n,
                        const char *why, const df_native *nat, const char *model_arg);

#endif
