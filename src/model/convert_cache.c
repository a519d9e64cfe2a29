/* convert_cache.c — convert_cached (convert.h): convert an HF checkpoint once
 * into a cache directory keyed by the source files' identity and reuse it. */
#include "convert.h"
#include "util/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static int relevant(const char *n) {
    size_t L = strlen(n);
    if (L > 12 && !strcmp(n + L - 12, ".safetensors")) return 1;
    static const char *const names[] = {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                                        "tiktoken.model", "chat_template.jinja", "special_tokens_map.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(n, names[i])) return 1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int convert_cached(const char *hf_dir, const char *cache_root, df_spine_mode spine, df_progress_fn progress, void *user,
                   char *out_dir, size_t out_len, char *err, size_t errlen) {
    char abs[4096], root[3000], name[512], path[4600];
    if (!realpath(hf_dir, abs)) return df_set_errc(err, errlen, DF_EIO, "model directory %s: %s", hf_dir, strerror(errno));
    if (cache_root && *cache_root) snprintf(root, sizeof root, "%s", cache_root);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME")) snprintf(root, sizeof root, "%s/deltafin", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME")) snprintf(root, sizeof root, "%s/.cache/deltafin", getenv("HOME"));
    else return df_set_errc(err, errlen, DF_EINVAL, "no cache directory: set cache_dir, XDG_CACHE_HOME or HOME");

    /* key: absolute path + (name, size, mtime) of each source file + spine mode */
    DIR *d = opendir(abs);
    if (!d) return df_set_errc(err, errlen, DF_EIO, "cannot open directory %s: %s", abs, strerror(errno));
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
    uint64_t key = XXH64_digest(h);
    XXH64_freeState(h);
    char hx[17];
    df_xxh64_hex(key, hx);
    const char *base = strrchr(abs, '/');
    base = base && base[1] ? base + 1 : "model";
    snprintf(name, sizeof name, "%.200s-%s-%s", base, hx, convert_spine_mode_name(spine));

    int rc = df_mkdir_p(root, err, errlen);
    if (rc) {
        /* name the setting that chose this directory */
        size_t l = err ? strlen(err) : 0;
        if (err && l + 1 < errlen)
            snprintf(err + l, errlen - l, " (the conversion cache root; choose another with --cache-dir or XDG_CACHE_HOME)");
        return rc;
    }
    snprintf(path, sizeof path, "%.3000s/%.512s", root, name);
    if (strlen(path) + 1 > out_len) return df_set_errc(err, errlen, DF_EINVAL, "cache path too long: %s", path);
    snprintf(out_dir, out_len, "%s", path);

    char lock[4700], man[4700];
    snprintf(lock, sizeof lock, "%s.lock", path);
    snprintf(man, sizeof man, "%s/manifest.json", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot create lock file %s: %s", lock, strerror(errno));
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    if (!df_path_exists(man)) {
        df_convert_opts o;
        df_convert_opts_default(&o);
        o.spine = spine;
        o.progress = progress;
        o.progress_user = user;
        rc = df_convert(abs, path, &o, err, errlen);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}
