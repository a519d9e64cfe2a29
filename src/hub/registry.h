/*
 * registry.h — the registry of installed models (`deltafin setup` writes it; `list` and
 * the default-model lookup of run / serve / bench decode / doctor read it).
 *
 * One JSON file: {"default": "REPO", "models": [{"repo", "revision", "mirror", "dir", "model",
 * "mode": "full"|"stream", "bytes", "installed"}]}; "model" is the native model directory
 * (manifest.json) the engine opens, "dir" the install directory around it, "bytes" the bytes
 * installed. Written with temp file + fsync + rename.
 * Location: the --registry flag, else $DELTAFIN_REGISTRY, else $XDG_DATA_HOME/deltafin/models.json,
 * else $HOME/.local/share/deltafin/models.json.
 */
#ifndef DF_HUB_REGISTRY_H
#define DF_HUB_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char repo[256];
    char revision[128];
    char mirror[512];
    char dir[2048];      /* install directory */
    char model[2048];    /* native model directory (what --model would name) */
    char mode[16];       /* "full" | "stream" */
    uint64_t bytes;      /* bytes installed (downloaded + converted) */
    double installed;    /* unix time of the last setup */
} reg_entry;

/* The registry file: `override` (a --registry value) if non-empty, else the environment as
 * above. DF_EINVAL when neither HOME nor XDG_DATA_HOME is set. */
int registry_path(const char *override, char *out, size_t cap, char *err, size_t errlen);

/* Read the registry: *entries malloc'd (caller frees; NULL when empty), *n their count, the
 * default repo into dflt ("" when none). A missing file is an empty registry (0).
 * DF_EIO (unreadable) / DF_EFORMAT (not the JSON above; message names the file). */
int registry_load(const char *path, reg_entry **entries, int *n, char *dflt, size_t dcap, char *err, size_t errlen);

/* Insert or replace the entry of e->repo; make_default sets "default" to it. Creates the
 * file's directory. Atomic (tmp + fsync + rename). DF_EIO naming the file. */
int registry_record(const char *path, const reg_entry *e, int make_default, char *err, size_t errlen);

/* The default entry (the one "default" names): 1 and *out filled when its model directory has
 * manifest.json, 2 and *out filled when it has not (moved, deleted, unmounted: the caller says so
 * rather than using another model), 3 when "default" names a repo that no entry has (a dangling default: the entry
 * was removed, e.g. by editing the file; only out->repo is filled, and the caller says so rather than using another
 * model), 0 when there is no default, <0 DF_E* when the registry cannot be read. */
int registry_default(const char *path, reg_entry *out, char *err, size_t errlen);

/* The entry whose native model directory ("model") is model_dir, compared by real path (a --model path of another
 * spelling, or through a symlink, is the same install): 1 and *out filled, 0 when none is, <0 DF_E* when the
 * registry cannot be read. */
int registry_find_model(const char *path, const char *model_dir, reg_entry *out, char *err, size_t errlen);

/* The command that verifies and repairs e's install (`deltafin setup` run again over it: from the mirror and revision it
 * came from, into its directory), every word shell-quoted, ready to paste: "deltafin setup REPO --dir DIR" ("REPO
 * --stream --dir DIR" for a streamed install: setup --stream checks its fetched experts and fetches a corrupt one again), then
 * --mirror URL when e's mirror is not the one setup would use by default ($HF_ENDPOINT, else https://huggingface.co),
 * --revision R when it is not main, --registry FILE when `registry` is non-NULL (a registry the user named; NULL: the
 * default location, which setup finds by itself) and --no-default when not_default (a repair keeps another model the
 * default). */
void registry_repair_command(const reg_entry *e, const char *registry, int not_default, char *out, size_t cap);

#endif
