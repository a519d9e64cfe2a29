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
    uint64_t stripe_bytes;         /* bytes of one expert in each file (== stride when n_files == 1) */
    uint64_t *xxh64;               /* [n_experts] checksum of the full extent (stride bytes) */
} native_expert_layer;

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
} df_native;

/* Parse MODEL_DIR/manifest.json; validates offsets against file sizes. */
int native_open(df_native **out, const char *dir, char *err, size_t errlen);
void native_close(df_native *n);
const native_tensor *native_find(const df_native *n, const char *name);
/* Build views of one expert inside a buffer holding its whole extent (stride bytes). */
void native_expert_views(const df_native *n, const void *extent, df_expert *out);

/* Parse a config.json text (HF) into cfg; accepts rope_scaling and rope_parameters. */
int config_parse(const char *json_text, df_config *cfg, const char *path_for_errors, char *err, size_t errlen);

#endif
