/* safetensors.c — bounds-checked safetensors parsing (single file or shards);
 * see safetensors.h. Every check names the file and the tensor: a malformed
 * header, a data range outside the file, a size that does not match
 * shape x dtype, or two tensors overlapping is DF_EFORMAT. */
#include "safetensors.h"
#include "deltafin.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (256u << 20)  /* 256 MiB: far above any real header */

static const struct { const char *name; size_t size; } dtypes[ST__COUNT] = {
    [ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_I32] = {"I32", 4}, [ST_U8] = {"U8", 1}, [ST_I8] = {"I8", 1}, [ST_I64] = {"I64", 8},
    [ST_F64] = {"F64", 8}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_U32] = {"U32", 4},
    [ST_U64] = {"U64", 8}, [ST_BOOL] = {"BOOL", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype d) { return (d >= 0 && d < ST__COUNT) ? dtypes[d].name : "?"; }
size_t st_dtype_size(st_dtype d) { return (d >= 0 && d < ST__COUNT) ? dtypes[d].size : 0; }

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

typedef struct { uint64_t begin, end; int idx; } range;
static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->t);
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].map && s->files[i].size) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s);
}

/* Parse one file's header and append its tensors to s (file index fi). */
static int parse_file(st_set *s, int fi, char *err, size_t errlen) {
    st_file *f = &s->files[fi];
    const char *path = f->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return df_set_errc(err, errlen, DF_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: truncated safetensors file (%zu bytes, no header length)", path, f->size);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return df_set_errc(err, errlen, DF_EIO, "cannot mmap %s: %s", path, strerror(e));
    }
    const uint8_t *m = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "%s: bad safetensors header length %llu (file is %zu bytes); the file is truncated or not safetensors",
                           path, (unsigned long long)hlen, f->size);
    uint64_t data_start = 8 + hlen, data_len = f->size - data_start;
    cJSON *root = cJSON_ParseWithLength((const char *)m + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: safetensors header is not a well-formed JSON object", path);
    }
    int n_new = 0;
    for (cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__")) n_new++;
    st_tensor *nt = realloc(s->t, sizeof(st_tensor) * (size_t)(s->n + n_new + 1));
    range *rg = malloc(sizeof(range) * (size_t)(n_new + 1));
    if (!nt || !rg) {
        if (nt) s->t = nt;
        free(rg);
        cJSON_Delete(root);
        return df_set_errc(err, errlen, DF_ENOMEM, "out of memory reading %s", path);
    }
    s->t = nt;
    int rc = DF_OK, k = 0;
    for (cJSON *it = root->child; it; it = it->next) {
        const char *name = it->string;
        if (!strcmp(name, "__metadata__")) continue;
        st_tensor *t = &s->t[s->n];
        memset(t, 0, sizeof *t);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
            cJSON_GetArraySize(of) != 2) {
            rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: tensor \"%s\": entry needs dtype, shape and data_offsets [begin, end]",
                             path, name);
            break;
        }
        int d = -1;
        for (int j = 0; j < ST__COUNT; j++)
            if (!strcmp(dt->valuestring, dtypes[j].name)) d = j;
        if (d < 0) {
            rc = df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name, dt->valuestring);
            break;
        }
        t->dtype = (st_dtype)d;
        int nd = cJSON_GetArraySize(sh);
        if (nd > 8) {
            rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: tensor \"%s\": %d dimensions (at most 8)", path, name, nd);
            break;
        }
        t->ndim = nd;
        uint64_t numel = 1;
        int bad = 0;
        for (int j = 0; j < nd; j++) {
            const cJSON *x = cJSON_GetArrayItem(sh, j);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 || x->valuedouble != (double)(int64_t)x->valuedouble) { bad = 1; break; }
            t->shape[j] = (int64_t)x->valuedouble;
            if (t->shape[j] && numel > UINT64_MAX / 16 / (uint64_t)t->shape[j]) { bad = 1; break; }
            numel *= (uint64_t)t->shape[j];
        }
        const cJSON *b0 = cJSON_GetArrayItem(of, 0), *b1 = cJSON_GetArrayItem(of, 1);
        if (bad || !cJSON_IsNumber(b0) || !cJSON_IsNumber(b1) || b0->valuedouble < 0 || b1->valuedouble < b0->valuedouble ||
            b1->valuedouble > 1.8e19 || b0->valuedouble != (double)(uint64_t)b0->valuedouble ||
            b1->valuedouble != (double)(uint64_t)b1->valuedouble) {
            rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: tensor \"%s\": bad shape or data_offsets", path, name);
            break;
        }
        uint64_t beg = (uint64_t)b0->valuedouble, end = (uint64_t)b1->valuedouble;
        t->numel = numel;
        t->nbytes = numel * dtypes[d].size;
        if (end > data_len) {
            rc = df_set_errc(err, errlen, DF_EFORMAT,
                             "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the end of the data (%llu bytes); the file is truncated",
                             path, name, (unsigned long long)beg, (unsigned long long)end, (unsigned long long)data_len);
            break;
        }
        if (end - beg != t->nbytes) {
            rc = df_set_errc(err, errlen, DF_EFORMAT,
                             "%s: tensor \"%s\": %llu data bytes but shape x %s needs %llu", path, name,
                             (unsigned long long)(end - beg), dtypes[d].name, (unsigned long long)t->nbytes);
            break;
        }
        t->data = m + data_start + beg;
        t->file = fi;
        t->name = strdup(name);
        if (!t->name) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); break; }
        rg[k].begin = beg; rg[k].end = end; rg[k].idx = s->n;
        k++;
        s->n++;
    }
    if (rc == DF_OK) {
        qsort(rg, (size_t)k, sizeof(range), cmp_range);
        for (int j = 1; j < k; j++) {
            if (rg[j].begin < rg[j - 1].end && rg[j].end > rg[j].begin) {
                rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: tensors \"%s\" and \"%s\" overlap in the data section", path,
                                 s->t[rg[j - 1].idx].name, s->t[rg[j].idx].name);
                break;
            }
        }
    }
    free(rg);
    cJSON_Delete(root);
    return rc;
}

static int add_file(st_set *s, const char *path) {
    st_file *nf = realloc(s->files, sizeof(st_file) * (size_t)(s->n_files + 1));
    if (!nf) return DF_ENOMEM;
    s->files = nf;
    memset(&s->files[s->n_files], 0, sizeof(st_file));
    s->files[s->n_files].path = strdup(path);
    if (!s->files[s->n_files].path) return DF_ENOMEM;
    s->n_files++;
    return DF_OK;
}

static int finish(st_set *s, char *err, size_t errlen) {
    if (s->n > 1) qsort(s->t, (size_t)s->n, sizeof(st_tensor), cmp_tensor_name);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            return df_set_errc(err, errlen, DF_EFORMAT, "tensor \"%s\" appears twice (%s and %s)", s->t[i].name,
                               s->files[s->t[i - 1].file].path, s->files[s->t[i].file].path);
    return DF_OK;
}

int st_open_file(st_set **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s || add_file(s, path)) { st_close(s); return df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); }
    int rc = parse_file(s, 0, err, errlen);
    if (!rc) rc = finish(s, err, errlen);
    if (rc) { st_close(s); return rc; }
    *out = s;
    return DF_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int st_open_dir(st_set **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    char p[4096];
    st_set *s = calloc(1, sizeof *s);
    if (!s) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    int rc = DF_OK;
    cJSON *idx = NULL;
    df_path_join(p, sizeof p, dir, "model.safetensors.index.json");
    if (df_path_exists(p)) {
        char *txt;
        if ((rc = df_read_file(p, &txt, NULL, err, errlen))) goto fail;
        idx = cJSON_Parse(txt);
        free(txt);
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
        if (!cJSON_IsObject(wm)) {
            rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: not JSON with a \"weight_map\" object", p);
            goto fail;
        }
        /* distinct shard names, sorted */
        int nw = cJSON_GetArraySize(wm), ns = 0;
        char **names = calloc((size_t)nw + 1, sizeof(char *));
        if (!names) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
        for (cJSON *it = wm->child; it; it = it->next) {
            if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || !it->valuestring[0]) {
                free(names);
                rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: weight_map[\"%s\"] must be a file name in the directory", p, it->string);
                goto fail;
            }
            names[ns++] = it->valuestring;
        }
        qsort(names, (size_t)ns, sizeof(char *), cmp_str);
        for (int i = 0; i < ns && rc == DF_OK; i++) {
            if (i && !strcmp(names[i], names[i - 1])) continue;
            char fp[4096];
            df_path_join(fp, sizeof fp, dir, names[i]);
            if (add_file(s, fp)) rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        }
        free(names);
        if (rc) goto fail;
    } else {
        df_path_join(p, sizeof p, dir, "model.safetensors");
        if (df_path_exists(p)) {
            if (add_file(s, p)) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
        } else {
            DIR *d = opendir(dir);
            if (!d) { rc = df_set_errc(err, errlen, DF_EIO, "cannot open directory %s: %s", dir, strerror(errno)); goto fail; }
            struct dirent *de;
            char **names = NULL;
            int ns = 0;
            while ((de = readdir(d))) {
                size_t L = strlen(de->d_name);
                if (L > 12 && !strcmp(de->d_name + L - 12, ".safetensors")) {
                    char **nn = realloc(names, sizeof(char *) * (size_t)(ns + 1));
                    if (!nn) break;
                    names = nn;
                    if (!(names[ns] = strdup(de->d_name))) break;
                    ns++;
                }
            }
            closedir(d);
            if (ns > 1) qsort(names, (size_t)ns, sizeof(char *), cmp_str);
            for (int i = 0; i < ns; i++) {
                char fp[4096];
                df_path_join(fp, sizeof fp, dir, names[i]);
                if (rc == DF_OK && add_file(s, fp)) rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
                free(names[i]);
            }
            free(names);
            if (rc) goto fail;
            if (ns == 0) {
                rc = df_set_errc(err, errlen, DF_EIO, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", dir);
                goto fail;
            }
        }
    }
    for (int i = 0; i < s->n_files; i++)
        if ((rc = parse_file(s, i, err, errlen))) goto fail;
    if ((rc = finish(s, err, errlen))) goto fail;
    if (idx) {
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
        for (cJSON *it = wm->child; it; it = it->next) {
            const st_tensor *t = st_find(s, it->string);
            if (!t) {
                rc = df_set_errc(err, errlen, DF_EFORMAT, "%s/model.safetensors.index.json names tensor \"%s\" in %s, but no shard has it",
                                 dir, it->string, it->valuestring);
                goto fail;
            }
            const char *fp = s->files[t->file].path, *base = strrchr(fp, '/');
            base = base ? base + 1 : fp;
            if (strcmp(base, it->valuestring)) {
                rc = df_set_errc(err, errlen, DF_EFORMAT, "%s/model.safetensors.index.json puts \"%s\" in %s, but it is in %s", dir,
                                 it->string, it->valuestring, base);
                goto fail;
            }
        }
        cJSON_Delete(idx);
    }
    *out = s;
    return DF_OK;
fail:
    cJSON_Delete(idx);
    st_close(s);
    return rc;
}

const st_tensor *st_find(const st_set *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(s->t[mid].name, name);
        if (!c) return &s->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}
