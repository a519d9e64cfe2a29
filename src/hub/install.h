/*
 * install.h — checks of a model `deltafin setup` installed, shared by `setup` run again over an install (which
 * repairs what they find), `list` (which marks the install DAMAGED) and the commands that use or check an installed
 * model (run, serve, bench, doctor: which name setup's repair command).
 *
 * A full install is DIR/native (the native model: manifest.json, spine.bin, expert packs, and the side files convert
 * copies from the checkpoint: tokenizer, chat template, ...) beside DIR/NAME (the checkpoint as downloaded; the
 * shards are removed after the conversion unless --keep-download, the small files stay). The side files' reference
 * is the checkpoint's copy in DIR/NAME: the manifest does not list them.
 */
#ifndef DF_HUB_INSTALL_H
#define DF_HUB_INSTALL_H

#include <stddef.h>
#include <stdint.h>

/* The files convert copies beside the native files when the checkpoint has them (src/model/convert.c); NULL-ended. */
extern const char *const install_side_files[];

/* The checkpoint directory of the install directory dir of repo OWNER/NAME: DIR/NAME (where setup downloads). */
void install_checkpoint_dir(const char *dir, const char *repo, char *out, size_t cap);

/* One side file of an install that is not the checkpoint's copy. */
typedef struct {
    const char *name;        /* "tokenizer.json" */
    const char *installed;   /* its path in the native directory */
    const char *checkpoint;  /* the checkpoint's copy (the reference) */
    int missing;             /* 1: `installed` does not exist; 0: its bytes differ from the checkpoint's copy */
} install_side_problem;
typedef void (*install_side_fn)(void *user, const install_side_problem *p);

/* Compare every side file the checkpoint directory ck_dir holds with its copy in nat_dir (whole files: they are
 * small); fn (may be NULL) is called for each one missing or different. Returns how many there are (0: every side
 * file matches; a ck_dir without side files, or without any file at all, has nothing to compare). */
int install_check_side_files(const char *nat_dir, const char *ck_dir, install_side_fn fn, void *user);

/* spine.bin's checksum is part of the quick check up to this size (read at the drive's speed, about 0.1 s); a larger
 * spine is checked by its size only (`deltafin doctor` and `deltafin setup` run again check every checksum). */
#define INSTALL_QUICK_SPINE_BYTES ((uint64_t)256 << 20)

/* The quick check of a full install (`list`; run / serve / bench on the installed default model): what native_open
 * checks (manifest.json readable, spine.bin and every expert pack present at their sizes), the side files against
 * the checkpoint's copies in ck_dir (NULL: not compared), and spine.bin's XXH64 (df_model_verify_all, the verifier of
 * doctor and setup, stopped after the spine) when spine.bin is at most INSTALL_QUICK_SPINE_BYTES. The experts'
 * contents are not read. 0 when nothing is wrong; 1 when the install is damaged, why (cap bytes) naming the first
 * problem found (the file and what is wrong with it; without the engine's advice to convert again: the callers name
 * the setup command that repairs the install). */
int install_quick_check(const char *nat_dir, const char *ck_dir, char *why, size_t cap);

/* The files of a full install that stop it from opening, each as a phrase for a message ("spine.bin (missing)",
 * "experts-L002.pack (layer 2, truncated: 1000 of 3407872 bytes)", "experts-L002.pack (layer 2, too large: ...)",
 * "manifest.json (not valid JSON)") given to fn: manifest.json that cannot be read, spine.bin and each expert pack
 * missing or not the size the manifest says. Returns how many. `deltafin setup` names them in its repair messages. */
typedef void (*install_damage_fn)(void *user, const char *what);
int install_file_damage(const char *nat_dir, install_damage_fn fn, void *user);

#endif
