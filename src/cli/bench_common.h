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
/* --model DIR of `bench decode` / `bench prefill`, which run the engine: a native model is used as it is; a Hugging
 * Face checkpoint (config.json) is converted once into the conversion cache, as `run` does, and *model points at the
 * converted directory (conv, cap bytes); how (if non-NULL) gets ", DIR converted into the conversion cache
 * (CACHE_DIR)" appended. 0, else a message naming `deltafin bench CMD` and the exit status (1). */
int bench_native_model(const char *cmd, const char **model, char *conv, size_t cap, char *how, size_t howcap);
/* Drop the page cache (sync + /proc/sys/vm/drop_caches); 1 if done, 0 when not root or refused. */
int bench_drop_caches(void);
/* The directories of the model's expert packs (the stripes of its first MoE layer), comma-separated,
 * in stripe order, into dirs (cap bytes). */
void bench_pack_dirs(const df_native *nat, char *dirs, size_t cap);
/* I/O benchmark options that read like the engine's expert loads: whole extents of `stride` bytes, top_k of
 * them at once, at queue depth qd, over the pack files only (a model directory also holds spine.bin). */
void bench_expert_io_opts(store_bench_opts *bo, const char *dirs, int qd, uint64_t stride, int top_k, double seconds);

#endif
