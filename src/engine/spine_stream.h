/*
 * spine_stream.h — spine streaming under a RAM budget (issue 4): when the
 * whole spine.bin does not fit, the global tensors (embed, final norm,
 * lm_head), every 1-D vector and the 2-D weights of layers [0, n_resident)
 * stay resident; the 2-D weights of layers [n_resident, L) are read layer by
 * layer into one of two staging buffers, the next layer's read running on a
 * helper thread while the current layer computes. The kernels see the same
 * bytes as in the resident run, so results are bit-identical.
 * Implemented in src/engine/spine_stream.c.
 */
#ifndef DF_ENGINE_SPINE_STREAM_H
#define DF_ENGINE_SPINE_STREAM_H

#include "model/native.h"
#include "model/weights.h"

#include <stdint.h>

/* Memory a streaming layout needs, per choice of n_resident. */
typedef struct {
    int n_layers;
    uint64_t global_bytes;   /* resident arrays that are not layers' 2-D weights (64-byte packed) */
    uint64_t *layer_bytes;   /* [n_layers] packed size of layer l's 2-D weights when resident */
    uint64_t *layer_span;    /* [n_layers] staging bytes that reading layer l needs (4 KiB-aligned runs) */
} sst_plan;

int sst_plan_make(const df_native *n, sst_plan *p, char *err, size_t errlen);
void sst_plan_free(sst_plan *p);
/* Resident bytes with layers [0, n_res) resident (globals + those layers). */
uint64_t sst_plan_resident(const sst_plan *p, int n_res);
/* One staging buffer: the largest span over the streamed layers [n_res, L) (0 if none). */
uint64_t sst_plan_stage(const sst_plan *p, int n_res);

typedef struct spine_stream spine_stream;

/* Allocate the resident arrays and two staging buffers, read spine.bin once
 * (checking its size and XXH64, copying the resident arrays), build `spine`
 * (spine_build_mapped; streamed layers' 2-D weights NULL until sst_layer) and
 * start the reader thread. 0 <= n_res < num_hidden_layers. DF_EIO / DF_EFORMAT
 * naming spine.bin; DF_ENOMEM. The caller frees `spine` (spine_free) after sst_close. */
int sst_open(spine_stream **out, const df_native *n, int n_res, df_spine *spine, char *err, size_t errlen);
void sst_close(spine_stream *s);
/* Start reading layer l into its staging buffer (no-op if l is resident, already
 * there or on its way). Must not be called for a layer whose buffer (l and l±2
 * share one) is being computed with. */
void sst_start(spine_stream *s, int l);
/* Make layer l's weights usable: wait for its read and point spine->layers[l]'s
 * 2-D weights into the staging buffer. Adds the waiting time to *wait_s. DF_EIO on a read error. */
int sst_layer(spine_stream *s, int l, double *wait_s, char *err, size_t errlen);
int sst_n_resident(const spine_stream *s);
int sst_first_streamed(const spine_stream *s);
/* Weight memory held: resident arrays + 2 staging buffers. */
uint64_t sst_memory_bytes(const spine_stream *s);
uint64_t sst_stage_bytes(const spine_stream *s);
/* Spine bytes read from disk by streaming since open. */
uint64_t sst_bytes_read(const spine_stream *s);

#endif
