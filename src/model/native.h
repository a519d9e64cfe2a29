/*
 * native.h — reading deltafin's native layout (docs/native-format.md).
 * Implemented in src/model/native.c; written by src/model/convert.c.
 */
#ifndef DF_MODEL_NATIVE_H
#define DF_MODEL_NATIVE_H

#include "weights.h"
#include <stdint.h>

typedef struct {
    char name[160];
    df_wtype type;
    int ndim;
    int64_t shape[2];              /* [rows, cols], or [n, 1] for 1-D tensors */
    uint64_t offset, bytes;        /* in spine.bin */
    uint64_t scale_offset, scale_bytes;
} native_tensor;

typedef struct {
    char name[8];                  /* "gate" | "up" | "down" */
    int64_t rows, cols;
    uint64_t offset, bytes, scale_offset, scale_bytes;  /* inside one expert extent */
} native_expert_part;

typedef struct {
    int layer;
    int n_files;                   /* stripes (drives) */
    char **files;                  /* absolute paths, [n_files] */
    uint64_t stripe_bytes;         /* bytes of one expert in each file (== stride when n_files == 1);
                                      the largest stripe when stripe_sizes is set */
    uint64_t *xxh64;               /* [n_experts] checksum of the full extent (stride bytes) */
    uint64_t *stripe_sizes;        /* [n_files] per-file stripe size (manifest "stripe_sizes"), NULL = all stripe_bytes */
} native_expert_layer;

/* Size of stripe k of one expert (file k holds it at expert * size). */
static inline uint64_t native_stripe_size(const native_expert_layer *L, int k) {
    return L->stripe_sizes ? L->stripe_sizes[k] : L->stripe_bytes;
}
/* Why an expert pack of `have` bytes is not the `need` bytes (n_experts stripes) its manifest describes, for messages:
 * a pack of any other size is damaged. */
static inline const char *native_pack_size_cause(uint64_t have, uint64_t need) {
    return have < need ? "truncated" : "too large: not the pack this manifest describes";
}
/* Offset of stripe k inside the reassembled extent (stripes back to back). */
static inline uint64_t native_stripe_begin(const native_expert_layer *L, int k) {
    uint64_t b = 0;
    for (int j = 0; j < k; j++) b += native_stripe_size(L, j);
    return b;
}

typedef struct df_native {
    char dir[1024];
    char name[128];
    df_config cfg;
    char spine_mode[8];
    int exact;
    char spine_path[1100];
    uint64_t spine_bytes, spine_xxh64;
    int n_tensors;
    native_tensor *tensors;
    /* routed experts */
    df_wtype expert_type;
    int n_experts;
    uint64_t extent_bytes, stride;
    native_expert_part parts[3];   /* gate, up, down */
    int n_moe_layers;
    native_expert_layer *moe_layers;   /* [n_moe_layers], ascending layer */
    native_expert_layer **by_layer;    /* [num_hidden_layers], NULL for dense layers */
    char pack_error[1400];             /* set when a pack file is missing at open (checked by native_require_packs) */
} df_native;

/* Parse MODEL_DIR/manifest.json; validates offsets against file sizes. */
int native_open(df_native **out, const char *dir, char *err, size_t errlen);
void native_close(df_native *n);
const native_tensor *native_find(const df_native *n, const char *name);
/* Build views of one expert inside a buffer holding its whole extent (stride bytes). */
void native_expert_views(const df_native *n, const void *extent, df_expert *out);

/* Parse a config.json text (HF) into cfg; accepts rope_scaling and rope_parameters. */
int config_parse(const char *json_text, df_config *cfg, const char *path_for_errors, char *err, size_t errlen);

/* ---- added by the model owner (append-only) ---- */
#include "deltafin.h"   /* df_progress_fn */

/* Bytes of the buffer one expert of `layer` is read into: the sum of its stripe
 * sizes (n_files * stripe_bytes when equal; >= stride; stripes are placed back to back). 0 for a dense layer. */
uint64_t native_extent_buf_bytes(const df_native *n, int layer);
/* Read expert `expert` of MoE layer `layer` (all stripes, pread) into buf
 * (native_extent_buf_bytes bytes, any alignment). DF_EIO/DF_EFORMAT naming layer, expert, file. */
int native_read_expert(const df_native *n, int layer, int expert, void *buf, char *err, size_t errlen);
/* Check an extent (stride bytes) against the manifest's XXH64; DF_EFORMAT naming
 * layer, expert and file on mismatch. */
int native_verify_expert(const df_native *n, int layer, int expert, const void *extent, char *err, size_t errlen);
/* Verify spine.bin and every expert extent (reads everything once). progress
 * gets "bytes". DF_EFORMAT on the first mismatch. */
int native_verify(const df_native *n, df_progress_fn progress, void *user, char *err, size_t errlen);
/* Point every layer's pack files at other directories (df_model_opts.expert_dirs):
 * `dirs` is comma-separated with as many entries as each layer has stripes;
 * file k becomes dirs[k]/basename(file k). Sizes are re-checked (DF_EIO /
 * DF_EFORMAT naming the file); on error nothing is changed. */
int native_set_expert_dirs(df_native *n, const char *dirs, char *err, size_t errlen);
/* DF_EIO naming the first missing pack file, if native_open found one missing (and no
 * native_set_expert_dirs has re-pointed the packs since). */
int native_require_packs(const df_native *n, char *err, size_t errlen);
/* Stripe sizes for an extent of `stride` bytes over n files. weights (comma-separated
 * positive numbers, e.g. relative GB/s per drive; NULL/"" = equal) make stripe k's size
 * proportional to weights[k], in whole 4 KiB pages summing to >= stride. *unequal is set
 * when the sizes differ (the manifest then needs "stripe_sizes"); otherwise every size
 * is the equal stripe_bytes. DF_EINVAL on a malformed list or a count other than n. */
int native_stripe_plan(uint64_t stride, int n, const char *weights, uint64_t *sizes, int *unequal, char *err, size_t errlen);

#endif
