/*
 * safetensors.h — bounds-checked reader of Hugging Face safetensors
 * checkpoints: one file, or shards listed by model.safetensors.index.json.
 * Files are mmap'd read-only; tensor data pointers point into the maps.
 * Format: 8-byte LE header length N, N bytes of JSON {name: {dtype, shape,
 * data_offsets: [begin, end]}, "__metadata__": {...}}, then data (offsets
 * relative to the end of the header). See ../shared/notes/formats.md.
 */
#ifndef DF_MODEL_SAFETENSORS_H
#define DF_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ST_F32, ST_BF16, ST_F16, ST_F8_E4M3, ST_I32, ST_U8, ST_I8, ST_I64,
    /* parsed (sizes known) but no encoding of ours uses them: */
    ST_F64, ST_I16, ST_U16, ST_U32, ST_U64, ST_BOOL, ST_F8_E5M2,
    ST__COUNT
} st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[8];
    uint64_t numel;
    uint64_t nbytes;
    const uint8_t *data;     /* into the file's mmap */
    int file;                /* index into st_set.files */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
} st_file;

typedef struct {
    int n_files;
    st_file *files;
    int n;                   /* tensors, sorted by name */
    st_tensor *t;
} st_set;

/* Open one .safetensors file. */
int st_open_file(st_set **out, const char *path, char *err, size_t errlen);
/* Open a checkpoint directory: model.safetensors.index.json (every shard it
 * names; every tensor must be in the shard the weight_map says), else
 * model.safetensors, else every *.safetensors file in the directory. A tensor
 * name in two files is DF_EFORMAT. */
int st_open_dir(st_set **out, const char *dir, char *err, size_t errlen);
void st_close(st_set *s);
/* Binary search by exact name; NULL if absent. */
const st_tensor *st_find(const st_set *s, const char *name);
const char *st_dtype_name(st_dtype d);   /* "F32", "BF16", ... */
size_t st_dtype_size(st_dtype d);
/* Path of the file holding t. */
static inline const char *st_path(const st_set *s, const st_tensor *t) { return s->files[t->file].path; }

#endif
