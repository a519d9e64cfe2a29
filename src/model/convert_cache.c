/* convert_cache.c — convert_cached (convert.h): convert an HF checkpoint once
 * into a cache directory keyed by the source files' identity and reuse it. */
#include "convert.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The files of a checkpoint whose (name, size, mtime) key its conversion: the weights, the config, and every side file
 * that df_convert copies beside the native files (convert.c's side_files), the model card README.md included (its
 * copy is the conversion's card: `run` on the conversion reads its trained_positions): a changed card gives a fresh
 * conversion, never a stale copy. */
static int relevant(const char *n) {
    size_t L = strlen(n);
    if (L > 12 && !strcmp(n + L - 12, ".safetensors")) return 1;
    static const char *const names[] = {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                                        "tiktoken.model", "chat_template.jinja", "special_tokens_map.json", "generation_config.json",
                                        "README.md"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(n, names[i])) return 1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static uint64_t source_key(const char *abs, df_spine_mode spine);

/* The progress callback of a cached conversion: the caller's, and a stop when SIGINT / SIGTERM / SIGHUP arrived. */
typedef struct {
    df_progress_fn fn;
    void *user;
} cache_progress;

static int cache_progress_cb(void *user, const char *what, uint64_t done, uint64_t total) {
    const cache_progress *p = user;
    if (df_interrupted()) return 1;
    return p->fn ? p->fn(p->user, what, done, total) : 0;
}

/* Bytes of the regular files directly in dir; -1 when it holds anything else (then it is not removed). */
static int64_t conversion_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int64_t total = 0;
    struct dirent *de;
    char p[4700];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        struct stat st;
        snprintf(p, sizeof p, "%.4400s/%.255s", dir, de->d_name);
        if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) { total = -1; break; }
        total += (int64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* Remove the regular files of dir (manifest.json first, so that no reader takes it for a model meanwhile), then
 * dir itself. */
static void remove_conversion(const char *dir) {
    char p[4700];
    snprintf(p, sizeof p, "%.4600s/manifest.json", dir);
    unlink(p);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%.4400s/%.255s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* A process using a conversion holds a shared flock on its directory until it ends, so that no other process
 * removes the conversion under it (prune_stale takes an exclusive one first). Best effort: a failure only loses that
 * protection. */
static void hold_reader(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) close(fd);
    /* else the descriptor stays open (and locked) for the life of the process */
}

/* Once the checkpoint at abs has its conversion root/name in spine mode spine (a new one, or one found complete; key
 * still current: its files did not change again meanwhile), the cache's other conversions of it are stale in every
 * spine mode (no run can ask for their key):
 *   - complete ones whose manifest.json names abs as "source"."dir", in the same spine mode (any other key than
 *     name's), or in another mode with a key other than that mode's key of abs's current files (a conversion whose key
 *     is still current stays, whatever its mode): made before its files changed;
 *   - partial ones (no manifest.json) of a checkpoint with the same directory name, in any spine mode, left by a
 *     killed run (no process holds their lock file).
 * A checkpoint moved elsewhere names another "source"."dir": its old conversions stay. Each stale one is removed and
 * reported on stderr unless a process is using it (a shared lock on the directory: hold_reader; a complete one is
 * then reported as kept, and a later run removes it once unused), is writing it (its lock file), or it holds anything
 * but regular files. */
static void prune_stale(const char *root, const char *name, const char *abs, const char *base, df_spine_mode spine) {
    DIR *d = opendir(root);
    if (!d) return;
    static const df_spine_mode modes[] = {DF_SPINE_SOURCE, DF_SPINE_BF16, DF_SPINE_INT8};
    enum { NMODES = sizeof modes / sizeof modes[0] };
    /* the current key of abs in each other mode, computed when first needed ("" when its files cannot be read: then
     * no conversion of that mode counts as stale) */
    char cur[NMODES][17];
    int have[NMODES] = {0};
    const size_t bl = strlen(base);
    struct dirent *de;
    char dir[4700], man[4800], lock[4800];
    while ((de = readdir(d))) {
        const size_t l = strlen(de->d_name);
        if (!strcmp(de->d_name, name)) continue;
        /* <base>-<16 hex digits>-<mode>: which mode (if any) the name ends with */
        int k = -1;
        size_t ml = 0;
        for (int i = 0; i < NMODES && k < 0; i++) {
            const char *mn = convert_spine_mode_name(modes[i]);
            ml = strlen(mn);
            if (l >= ml + 19 && de->d_name[l - ml - 1] == '-' && !strcmp(de->d_name + l - ml, mn)) k = i;
        }
        if (k < 0) continue;
        const char *mode = convert_spine_mode_name(modes[k]);
        const int own = modes[k] == spine;
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        snprintf(man, sizeof man, "%s/manifest.json", dir);
        int same = 0, partial = 0;
        char *buf = NULL;
        size_t len = 0;
        if (df_read_file(man, &buf, &len, NULL, 0) == 0) {
            cJSON *m = cJSON_ParseWithLength(buf, len);
            const cJSON *src = cJSON_GetObjectItemCaseSensitive(m, "source");
            const cJSON *sd = cJSON_GetObjectItemCaseSensitive(src, "dir");
            const cJSON *sm = cJSON_GetObjectItemCaseSensitive(m, "spine_mode");
            same = cJSON_IsString(sd) && !strcmp(sd->valuestring, abs) && cJSON_IsString(sm) && !strcmp(sm->valuestring, mode);
            cJSON_Delete(m);
            if (same && !own) { /* another mode: stale only when its key is not that mode's current one */
                if (!have[k]) {
                    const uint64_t key = source_key(abs, modes[k]);
                    if (key) df_xxh64_hex(key, cur[k]);
                    else cur[k][0] = 0;
                    have[k] = 1;
                }
                const char *hx = de->d_name + l - ml - 17;
                int named = hx[-1] == '-'; /* <base>-<16 lowercase hex digits>-<mode>, as convert_cached names it */
                for (int i = 0; i < 16 && named; i++) named = strchr("0123456789abcdef", hx[i]) && hx[i];
                same = named && cur[k][0] && strncmp(hx, cur[k], 16) != 0;
            }
        } else if (df_is_dir(dir)) {
            partial = l == bl + 1 + 16 + 1 + ml && !strncmp(de->d_name, base, bl) && de->d_name[bl] == '-';
        }
        free(buf);
        if (!same && !partial) continue;
        const int64_t bytes = conversion_bytes(dir);
        if (bytes < 0) continue;
        snprintf(lock, sizeof lock, "%s.lock", dir);
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) continue;
        int dfd = -1;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) { /* nobody is writing it */
            if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0 && flock(dfd, LOCK_EX | LOCK_NB) == 0) {
                remove_conversion(dir);
                fprintf(stderr, "deltafin: removed %s (%.2f GB), %s\n", dir, (double)bytes / 1e9,
                        same ? "a conversion made before the checkpoint's files changed"
                             : "a conversion that a killed run left unfinished");
            } else if (dfd >= 0 && same) {
                fprintf(stderr,
                        "deltafin: kept %s (%.2f GB), a conversion made before the checkpoint's files changed: a "
                        "process is still using it; a later run of this model removes it once that process ends\n",
                        dir, (double)bytes / 1e9);
            }
            unlink(lock); /* held: no writer waits on it */
        }
        if (dfd >= 0) close(dfd);
        close(fd);
    }
    closedir(d);
}

/* The cache key of the checkpoint at abs (absolute): XXH64 of the layout version, the path, the spine mode and the
 * (name, size, mtime) of each source file, names in order. */
static uint64_t source_key(const char *abs, df_spine_mode spine) {
    char path[4600];
    /* key: absolute path + (name, size, mtime) of each source file + spine mode */
    DIR *d = opendir(abs);
    if (!d) return 0; /* unreadable: the conversion reports it */
    char **names = NULL;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!relevant(de->d_name)) continue;
        char **nn = realloc(names, sizeof(char *) * (size_t)(n + 1));
        if (!nn) break;
        names = nn;
        if (!(names[n] = strdup(de->d_name))) break;
        n++;
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof(char *), cmp_str);
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    static const char layout_version[] = "deltafin-native-1"; /* bump when convert's output changes */
    XXH64_update(h, layout_version, sizeof layout_version);
    XXH64_update(h, abs, strlen(abs) + 1);
    int mode = (int)spine;
    XXH64_update(h, &mode, sizeof mode);
    for (int i = 0; i < n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", abs, names[i]);
        if (stat(path, &st) == 0) {
            int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
            XXH64_update(h, names[i], strlen(names[i]) + 1);
            XXH64_update(h, v, sizeof v);
        }
        free(names[i]);
    }
    free(names);
    const uint64_t key = XXH64_digest(h);
    XXH64_freeState(h);
    return key;
}

/* The part of convert_cached that writes, run under the handlers of df_interrupt_install: the cache root and the
 * lock file of path, then the conversion into path (unless the process that held the lock made it meanwhile), then
 * the lock file removed, and the stale conversions pruned after a new one. A signal seen before the conversion begins
 * stops it there (DF_ECANCELLED, *started 0, the lock file removed when this process holds it); one during the
 * conversion stops it (DF_ECANCELLED, *started 1), and the conversion removes what it wrote. */
static int convert_locked(const char *abs, const char *root, const char *name, const char *base, const char *path,
                          df_spine_mode spine, df_progress_fn progress, void *user, uint64_t key, int *started, char *err,
                          size_t errlen) {
    if (df_interrupted()) return DF_ECANCELLED;
    int rc = df_mkdir_p(root, err, errlen);
    if (rc) {
        /* name the setting that chose this directory */
        size_t l = err ? strlen(err) : 0;
        if (err && l + 1 < errlen)
            snprintf(err + l, errlen - l, " (the conversion cache root; choose another with --cache-dir or XDG_CACHE_HOME)");
        return rc;
    }
    char lock[4700], man[4700];
    snprintf(lock, sizeof lock, "%s.lock", path);
    snprintf(man, sizeof man, "%s/manifest.json", path);
    /* The lock file serialises conversions of this key. Its holder removes it when done, so a process that waited
     * on a lock file no longer at that path takes the new one. The wait polls (a blocking flock would be restarted
     * after a signal's handler, SA_RESTART), so that a signal ends it. */
    int fd = -1, waited = 0;
    for (;;) {
        if (df_interrupted()) return DF_ECANCELLED;
        fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return df_set_errc(err, errlen, DF_EIO, "cannot create the lock file %s: %s (convert into a writable cache with "
                               "--cache-dir DIR)", lock, strerror(errno));
        while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EINTR) continue;
            if (errno != EWOULDBLOCK) {
                rc = df_set_errc(err, errlen, DF_EIO, "cannot lock %s: %s", lock, strerror(errno));
                close(fd);
                return rc;
            }
            if (!waited++)
                fprintf(stderr, "deltafin: waiting for another process converting %s into %s (lock %s)\n", abs, path, lock);
            if (df_interrupted()) { /* the lock file is the holder's: it removes it */
                close(fd);
                return DF_ECANCELLED;
            }
            nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(lock, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) break;
        close(fd);
    }
    int converted = 0;
    if (df_interrupted()) {
        rc = DF_ECANCELLED;
    } else if (!df_path_exists(man)) {
        df_convert_opts o;
        df_convert_opts_default(&o);
        o.spine = spine;
        cache_progress cp = {progress, user};
        o.progress = cache_progress_cb;
        o.progress_user = &cp;
        *started = 1;
        rc = df_convert(abs, path, &o, err, errlen);
        converted = rc == DF_OK;
        if (rc) rmdir(path); /* df_convert removed its files; the directory too when nothing else is in it */
    }
    /* held before the lock file goes, so that no pruning run (which takes the lock file first) removes it in between */
    if (rc == DF_OK) hold_reader(path);
    unlink(lock);
    close(fd);
    /* only while the checkpoint's files are still those of this conversion (a run of older files that finishes after
     * a newer one must not remove the newer one) */
    if (converted && source_key(abs, spine) == key) prune_stale(root, name, abs, base, spine);
    return rc;
}

/* The cache root (root), the absolute checkpoint path (abs), its key in spine mode spine, the conversion's name
 * (<base>-<key>-<mode>) and path, and base (the checkpoint directory's name, in abs): convert_cached's and
 * convert_cache_lookup's. */
static int cache_names(const char *hf_dir, const char *cache_root, df_spine_mode spine, char abs[4096], char root[3000],
                       char name[512], char path[4600], const char **base_out, uint64_t *key_out, char *err, size_t errlen) {
    if (!realpath(hf_dir, abs)) return df_set_errc(err, errlen, DF_EIO, "model directory %s: %s", hf_dir, strerror(errno));
    /* XDG_CACHE_HOME only when absolute (the XDG base directory specification: a relative one is ignored) */
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache_root && *cache_root) snprintf(root, 3000, "%s", cache_root);
    else if (xdg && xdg[0] == '/') snprintf(root, 3000, "%s/deltafin", xdg);
    else if (xdg && xdg[0] && home && *home) {
        snprintf(root, 3000, "%s/.cache/deltafin", home);
        /* said once per process (a command may look the cache up more than once) */
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "deltafin: note: XDG_CACHE_HOME=\"%s\" is not an absolute path, so it is ignored (the XDG base "
                            "directory specification); the conversion cache is %s (set XDG_CACHE_HOME to an absolute path, "
                            "or pass --cache-dir DIR)\n", xdg, root);
    }
    else if (home && *home) snprintf(root, 3000, "%s/.cache/deltafin", home);
    else
        return df_set_errc(err, errlen, DF_EINVAL,
                           "no directory for the conversion cache: pass --cache-dir DIR, or set HOME or XDG_CACHE_HOME "
                           "(an absolute path)");
    const uint64_t key = source_key(abs, spine);
    char hx[17];
    df_xxh64_hex(key, hx);
    const char *base = strrchr(abs, '/');
    base = base && base[1] ? base + 1 : "model";
    snprintf(name, 512, "%.200s-%s-%s", base, hx, convert_spine_mode_name(spine));

    snprintf(path, 4600, "%.3000s/%.512s", root, name);
    *base_out = base;
    *key_out = key;
    return DF_OK;
}

int convert_cache_lookup(const char *hf_dir, const char *cache_root, df_spine_mode spine, char *out_dir, size_t out_len,
                         char *err, size_t errlen) {
    char abs[4096], root[3000], name[512], path[4600], man[4700];
    const char *base;
    uint64_t key;
    int rc = cache_names(hf_dir, cache_root, spine, abs, root, name, path, &base, &key, err, errlen);
    if (rc) return rc;
    if (strlen(path) + 1 > out_len) return df_set_errc(err, errlen, DF_EINVAL, "cache path too long: %s", path);
    snprintf(out_dir, out_len, "%s", path);
    snprintf(man, sizeof man, "%s/manifest.json", path);
    return df_path_exists(man) ? 1 : 0;
}

int convert_cached(const char *hf_dir, const char *cache_root, df_spine_mode spine, df_progress_fn progress, void *user,
                   char *out_dir, size_t out_len, char *err, size_t errlen) {
    char abs[4096], root[3000], name[512], path[4600];
    const char *base;
    uint64_t key;
    int rc0 = cache_names(hf_dir, cache_root, spine, abs, root, name, path, &base, &key, err, errlen);
    if (rc0) return rc0;
    if (strlen(path) + 1 > out_len) return df_set_errc(err, errlen, DF_EINVAL, "cache path too long: %s", path);
    snprintf(out_dir, out_len, "%s", path);
    char man[4700];
    snprintf(man, sizeof man, "%s/manifest.json", path);
    /* a complete conversion (its manifest is written last) is only read: no lock, nothing written (a cache the
     * user can read but not write still serves it) */
    if (df_path_exists(man)) {
        hold_reader(path);
        /* conversions of older files kept while a process used them go once unused */
        prune_stale(root, name, abs, base, spine);
        return DF_OK;
    }

    /* SIGINT / SIGTERM / SIGHUP stop the conversion, which then removes what it wrote. The handlers are installed
     * before anything here creates a file (the cache root, the lock file) and the previous ones come back only after
     * the lock file is gone, so that no signal ends the process with one of them left behind; a signal that arrived is
     * then raised again under the previous handlers. */
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction old[3];
    for (int i = 0; i < 3; i++) sigaction(sigs[i], NULL, &old[i]);
    /* a caller that blocks these signals (the server, which takes them in a thread of its own) still gets this
     * conversion stopped by them: unblocked in this thread meanwhile */
    sigset_t ss, old_mask;
    sigemptyset(&ss);
    for (int i = 0; i < 3; i++) sigaddset(&ss, sigs[i]);
    df_interrupt_install(); /* first: one pending while blocked is then taken by this handler at the unblock */
    pthread_sigmask(SIG_UNBLOCK, &ss, &old_mask);
    int started = 0;
    const int root_existed = df_path_exists(root);
    int rc = convert_locked(abs, root, name, base, path, spine, progress, user, key, &started, err, errlen);
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    const int sig = df_interrupted();
    df_interrupt_clear();
    if (!sig) return rc;
    /* stopped (its files removed), stopped before it began (nothing written), or too late to stop: the conversion is
     * complete and kept */
    /* a cache root this run created goes too when nothing else is in it (rmdir refuses a non-empty one) */
    const int root_gone = rc == DF_ECANCELLED && !root_existed && rmdir(root) == 0;
    if (rc == DF_ECANCELLED && started)
        rc = df_set_errc(err, errlen, DF_ECANCELLED, "interrupted by %s: the conversion into %s stopped and removed "
                         "every file it had written%s", df_signal_name(sig), path,
                         root_gone ? " (and the cache directory, which it had created)" : "");
    else if (rc == DF_ECANCELLED)
        rc = df_set_errc(err, errlen, DF_ECANCELLED, "interrupted by %s before the conversion into %s started: nothing "
                         "was written", df_signal_name(sig), path);
    else if (rc == DF_OK)
        rc = df_set_errc(err, errlen, DF_ECANCELLED, "interrupted by %s after the conversion into %s had finished: "
                         "it is complete and was kept", df_signal_name(sig), path);
    if (rc == DF_ECANCELLED) {
        fprintf(stderr, "deltafin: %s\n", err ? err : "interrupted");
        raise(sig); /* under the caller's disposition (by default: the process ends as by the signal) */
    }
    return rc; /* DF_ECANCELLED when the caller's handler returned, or the conversion's own error */
}

void convert_cache_hint(const char *cache_dir, char *err, size_t errlen) {
    static const char rerun[] = "re-run `deltafin convert`", again[] = "convert again";
    if (!cache_dir || !cache_dir[0] || !err || !errlen || !err[0]) return;
    char hint[4400], tmp[8192];
    snprintf(hint, sizeof hint, "delete the conversion cache %s and run again to re-convert", cache_dir);
    char *p = strstr(err, rerun);
    size_t pl = sizeof rerun - 1;
    if (!p && (p = strstr(err, again))) pl = sizeof again - 1;
    if (p) {
        snprintf(tmp, sizeof tmp, "%s", p + pl);
        *p = 0;
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, "%s%s", hint, tmp);
    } else if (strstr(err, cache_dir)) { /* only for errors about the cache's own files (not --events, --expert-dirs...) */
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, " (the model was converted into the cache: if its files are damaged, %s)", hint);
    }
}
