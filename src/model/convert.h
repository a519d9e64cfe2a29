/*
 * convert.h — model-side helpers around df_convert (include/deltafin.h),
 * implemented in src/model/convert.c and convert_cache.c.
 */
#ifndef DF_MODEL_CONVERT_H
#define DF_MODEL_CONVERT_H

#include "deltafin.h"
#include <stddef.h>

/* Convert the HF checkpoint hf_dir once into a directory under cache_root and
 * reuse it afterwards. The directory name is <basename>-<key>-<mode>, key =
 * XXH64 of the absolute source path and the name, size and mtime of every
 * source file (config.json, *.safetensors, the index, the tokenizer and generation
 * files, the model card README.md: every file the conversion copies) and the
 * spine mode; a directory whose manifest.json exists is reused as is, read only
 * (no lock file, nothing written). A lock file <dir>.lock serialises concurrent
 * conversions of the same key (a process that has to wait says so on stderr; the
 * holder removes it when done). SIGINT / SIGTERM / SIGHUP during the conversion
 * (unblocked in the calling thread meanwhile) stop it: every file it wrote and its
 * directory are removed, one line says so on stderr, and the signal is raised again
 * under the caller's previous disposition (DF_ECANCELLED if that returns); one that
 * comes after the last point where it can stop keeps the complete conversion and is
 * raised again the same way. The process then holds a shared flock on the
 * conversion's directory until it ends. After a new conversion (and when a run finds
 * its conversion complete), while the source's key is unchanged, the cache's stale
 * conversions of it are removed, each reported on stderr: complete ones of the same
 * source directory, in any spine mode, made before its files changed (one whose key
 * matches the current files stays), and unfinished ones a killed run left; never one
 * a process holds (that shared flock) or is writing. On success out_dir holds the native model directory.
 * cache_root NULL -> $XDG_CACHE_HOME/deltafin (when absolute) or $HOME/.cache/deltafin. */
int convert_cached(const char *hf_dir, const char *cache_root, df_spine_mode spine, df_progress_fn progress, void *user,
                   char *out_dir, size_t out_len, char *err, size_t errlen);

/* The directory convert_cached uses for hf_dir in spine mode spine (out_dir), found without converting or writing
 * anything: 1 when a complete conversion is there (its manifest.json), 0 when none is, a DF_E* code (err says why)
 * when hf_dir or the cache root cannot be resolved. */
int convert_cache_lookup(const char *hf_dir, const char *cache_root, df_spine_mode spine, char *out_dir, size_t out_len,
                         char *err, size_t errlen);

/* An error about the native files of a model converted into the cache directory cache_dir (err, errlen bytes, a
 * string): the repair is deleting that conversion, not running `deltafin convert`, which the user never did.
 * "re-run `deltafin convert`" or "convert again" in err becomes that hint; else, when err names cache_dir, the hint
 * is appended. cache_dir NULL or empty, or err empty: unchanged. */
void convert_cache_hint(const char *cache_dir, char *err, size_t errlen);

/* Name of a spine mode as written in manifest.json: "source" | "bf16" | "int8". */
const char *convert_spine_mode_name(df_spine_mode m);
/* Parse "source" | "bf16" | "int8"; -1 if unknown. */
int convert_spine_mode_from_name(const char *s);

#endif
