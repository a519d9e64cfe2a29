/* native.c — reader of deltafin's native layout (docs/native-format.md):
 * manifest.json parsing with full validation (types, shapes vs config, sizes vs
 * files, alignment), expert views, expert reads and checksum verification. */
#include "native.h"
#include "config.h"
#include "weights_util.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

void native_close(df_native *n) {
    if (!n) return;
    free(n->tensors);
    for (int i = 0; i < n->n_moe_layers; i++) {
        native_expert_layer *L = &n->moe_layers[i];
        for (int f = 0; L->files && f < L->n_files; f++) free(L->files[f]);  /* files is NULL when parsing stopped early */
        free(L->files);
        free(L->xxh64);
        free(L->stripe_sizes);
    }
    free(n->moe_layers);
    free(n->by_layer);
    free(n);
}

static int j_u64(const cJSON *o, const char *k, uint64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 || x->valuedouble != (double)(uint64_t)x->valuedouble) return -1;
    *v = (uint64_t)x->valuedouble;
    return 0;
}

static int64_t file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Validate one array (data or scale) of a weight. */
static int check_range(const char *mf, const char *what, const char *name, uint64_t off, uint64_t bytes, uint64_t expect,
                       uint64_t limit, char *err, size_t errlen) {
    if (bytes != expect)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: %s \"%s\": %llu bytes, its type and shape need %llu", mf, what, name,
                           (unsigned long long)bytes, (unsigned long long)expect);
    if (off % 64)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: %s \"%s\": offset %llu is not 64-byte aligned", mf, what, name,
                           (unsigned long long)off);
    if (off > limit || bytes > limit - off)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: %s \"%s\": bytes [%llu, %llu) lie outside its %llu-byte container", mf, what,
                           name, (unsigned long long)off, (unsigned long long)(off + bytes), (unsigned long long)limit);
    return DF_OK;
}

static int parse_shape(const cJSON *sh, int *ndim, int64_t shape[2]) {
    int nd = cJSON_GetArraySize(sh);
    if (!cJSON_IsArray(sh) || nd < 1 || nd > 2) return -1;
    shape[1] = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *x = cJSON_GetArrayItem(sh, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > 4.0e12) return -1;
        shape[i] = (int64_t)x->valuedouble;
    }
    if (shape[1] > (INT64_C(1) << 50) / shape[0]) return -1; /* keeps byte counts far from overflow */
    *ndim = nd;
    return 0;
}

static int parse_spine(df_native *n, const cJSON *sp, const char *mf, char *err, size_t errlen) {
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(sp, "file");
    const cJSON *xx = cJSON_GetObjectItemCaseSensitive(sp, "xxh64");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(sp, "tensors");
    if (!cJSON_IsString(file) || strchr(file->valuestring, '/') || j_u64(sp, "bytes", &n->spine_bytes) || !cJSON_IsString(xx) ||
        df_xxh64_parse(xx->valuestring, &n->spine_xxh64) || !cJSON_IsArray(ts))
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"spine\" needs file, bytes, xxh64 (16 hex digits) and tensors", mf);
    if (df_path_join(n->spine_path, sizeof n->spine_path, n->dir, file->valuestring))
        return df_set_errc(err, errlen, DF_EINVAL, "%s: path too long", mf);
    int64_t fs = file_size(n->spine_path);
    if (fs < 0)
        return df_set_errc(err, errlen, DF_EIO, "%s: spine file %s: %s%s", mf, n->spine_path, strerror(errno),
                           errno == ENOENT ? " (the converted model is incomplete; convert again)" : "");
    if ((uint64_t)fs != n->spine_bytes)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s is %lld bytes but the manifest says %llu (truncated or replaced; convert again)",
                           n->spine_path, (long long)fs, (unsigned long long)n->spine_bytes);
    n->n_tensors = cJSON_GetArraySize(ts);
    n->tensors = calloc((size_t)n->n_tensors + 1, sizeof(native_tensor));
    if (!n->tensors) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    int i = 0;
    for (const cJSON *t = ts->child; t; t = t->next, i++) {
        native_tensor *nt = &n->tensors[i];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsString(nm) || strlen(nm->valuestring) >= sizeof nt->name || !cJSON_IsString(ty))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor #%d needs a name (< %zu chars) and a type", mf, i, sizeof nt->name);
        snprintf(nt->name, sizeof nt->name, "%s", nm->valuestring);
        int tt = df_wtype_from_name(ty->valuestring);
        if (tt < 0)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: spine tensor \"%s\": unknown type \"%s\"", mf, nt->name, ty->valuestring);
        nt->type = (df_wtype)tt;
        if (parse_shape(cJSON_GetObjectItemCaseSensitive(t, "shape"), &nt->ndim, nt->shape))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\": bad shape", mf, nt->name);
        if (nt->ndim == 1 && nt->type != DF_W_F32 && nt->type != DF_W_BF16 && nt->type != DF_W_F16)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\": 1-D tensors must be f32, bf16 or f16", mf, nt->name);
        if (!df_weight_shape_ok(nt->type, nt->shape[0], nt->shape[1]))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\": shape [%lld, %lld] invalid for %s", mf, nt->name,
                               (long long)nt->shape[0], (long long)nt->shape[1], ty->valuestring);
        if (j_u64(t, "offset", &nt->offset) || j_u64(t, "bytes", &nt->bytes))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\": offset/bytes missing", mf, nt->name);
        int rc = check_range(mf, "spine tensor", nt->name, nt->offset, nt->bytes,
                             df_weight_data_bytes(nt->type, nt->shape[0], nt->shape[1]), n->spine_bytes, err, errlen);
        if (rc) return rc;
        uint64_t sb = df_weight_scale_bytes(nt->type, nt->shape[0], nt->shape[1]);
        if (sb) {
            if (j_u64(t, "scale_offset", &nt->scale_offset) || j_u64(t, "scale_bytes", &nt->scale_bytes))
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\" (%s) needs scale_offset and scale_bytes", mf, nt->name,
                                   ty->valuestring);
            if ((rc = check_range(mf, "spine tensor scale", nt->name, nt->scale_offset, nt->scale_bytes, sb, n->spine_bytes, err, errlen)))
                return rc;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(n->tensors[j].name, nt->name))
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: spine tensor \"%s\" listed twice", mf, nt->name);
    }
    return DF_OK;
}

static int parse_experts(df_native *n, const cJSON *ex, const char *mf, char *err, size_t errlen) {
    const df_config *c = &n->cfg;
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += config_layer_is_moe(c, l);
    n->by_layer = calloc((size_t)c->num_hidden_layers + 1, sizeof(native_expert_layer *));
    if (!n->by_layer) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    if (n_moe == 0) {
        if (ex && !cJSON_IsNull(ex) && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ex, "layers")) > 0)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: expert packs listed but the config has no MoE layer", mf);
        return DF_OK;
    }
    if (!cJSON_IsObject(ex)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: \"experts\" missing (the config has %d MoE layers)", mf, n_moe);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(ex, "type");
    int tt = cJSON_IsString(ty) ? df_wtype_from_name(ty->valuestring) : -1;
    if (tt < 0 || tt == DF_W_INT8_ROW)
        return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: experts.type \"%s\" is not supported", mf,
                           cJSON_IsString(ty) ? ty->valuestring : "?");
    n->expert_type = (df_wtype)tt;
    uint64_t ne, I, H;
    if (j_u64(ex, "n_experts", &ne) || j_u64(ex, "moe_intermediate_size", &I) || j_u64(ex, "hidden_size", &H) ||
        j_u64(ex, "extent_bytes", &n->extent_bytes) || j_u64(ex, "stride", &n->stride))
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts needs n_experts, moe_intermediate_size, hidden_size, extent_bytes, stride", mf);
    if ((int)ne != c->n_routed_experts || (int)I != c->moe_intermediate_size || (int)H != c->hidden_size)
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "%s: experts are %llu x [%llu, %llu] but the config says %d x [moe_intermediate_size %d, hidden_size %d]", mf,
                           (unsigned long long)ne, (unsigned long long)I, (unsigned long long)H, c->n_routed_experts,
                           c->moe_intermediate_size, c->hidden_size);
    /* latent MoE: experts run at routed_expert_hidden_size instead of hidden_size */
    uint64_t W = c->latent_dim > 0 ? (uint64_t)c->latent_dim : H;
    if (cJSON_GetObjectItemCaseSensitive(ex, "latent_dim")) {
        uint64_t ld;
        if (j_u64(ex, "latent_dim", &ld) || (int)ld != c->latent_dim)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.latent_dim does not match the config's routed_expert_hidden_size %d", mf,
                               c->latent_dim);
    }
    n->n_experts = (int)ne;
    if (n->stride == 0 || n->stride % 4096 || n->extent_bytes > n->stride)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.stride %llu must be a multiple of 4096 and >= extent_bytes %llu", mf,
                           (unsigned long long)n->stride, (unsigned long long)n->extent_bytes);
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(ex, "parts");
    static const char *const pn[3] = {"gate", "up", "down"};
    if (cJSON_GetArraySize(parts) != 3) return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.parts must list gate, up, down", mf);
    for (int p = 0; p < 3; p++) {
        const cJSON *pj = cJSON_GetArrayItem(parts, p);
        native_expert_part *P = &n->parts[p];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(pj, "name");
        int nd;
        int64_t shp[2];
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, pn[p]) || parse_shape(cJSON_GetObjectItemCaseSensitive(pj, "shape"), &nd, shp) ||
            nd != 2 || j_u64(pj, "offset", &P->offset) || j_u64(pj, "bytes", &P->bytes))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.parts[%d] must be \"%s\" with shape, offset, bytes", mf, p, pn[p]);
        snprintf(P->name, sizeof P->name, "%s", pn[p]);
        P->rows = shp[0];
        P->cols = shp[1];
        int64_t er = p == 2 ? (int64_t)W : (int64_t)I, ec = p == 2 ? (int64_t)I : (int64_t)W;
        if (P->rows != er || P->cols != ec)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts part %s has shape [%lld, %lld], expected [%lld, %lld]", mf, pn[p],
                               (long long)P->rows, (long long)P->cols, (long long)er, (long long)ec);
        if (!df_weight_shape_ok(n->expert_type, P->rows, P->cols))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts part %s: shape invalid for %s", mf, pn[p], df_wtype_name(n->expert_type));
        int rc = check_range(mf, "expert part", pn[p], P->offset, P->bytes, df_weight_data_bytes(n->expert_type, P->rows, P->cols),
                             n->extent_bytes, err, errlen);
        if (rc) return rc;
        uint64_t sb = df_weight_scale_bytes(n->expert_type, P->rows, P->cols);
        if (sb) {
            if (j_u64(pj, "scale_offset", &P->scale_offset) || j_u64(pj, "scale_bytes", &P->scale_bytes))
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts part %s needs scale_offset, scale_bytes", mf, pn[p]);
            if ((rc = check_range(mf, "expert part scale", pn[p], P->scale_offset, P->scale_bytes, sb, n->extent_bytes, err, errlen)))
                return rc;
        }
    }
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(ex, "layers");
    if (cJSON_GetArraySize(layers) != n_moe)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.layers lists %d layers, the config has %d MoE layers", mf,
                           cJSON_GetArraySize(layers), n_moe);
    n->moe_layers = calloc((size_t)n_moe, sizeof(native_expert_layer));
    if (!n->moe_layers) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    for (const cJSON *lj = layers->child; lj; lj = lj->next) {
        native_expert_layer *L = &n->moe_layers[n->n_moe_layers++];
        uint64_t li;
        if (j_u64(lj, "layer", &li) || li >= (uint64_t)c->num_hidden_layers || !config_layer_is_moe(c, (int)li))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.layers entry %d: \"layer\" missing or not a MoE layer", mf,
                               n->n_moe_layers - 1);
        L->layer = (int)li;
        if (n->by_layer[li]) return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d listed twice", mf, L->layer);
        if (n->n_moe_layers > 1 && L->layer < n->moe_layers[n->n_moe_layers - 2].layer)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts.layers must be in ascending order", mf);
        n->by_layer[li] = L;
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(lj, "files");
        const cJSON *xx = cJSON_GetObjectItemCaseSensitive(lj, "xxh64");
        L->n_files = cJSON_GetArraySize(files);
        if (!cJSON_IsArray(files) || L->n_files < 1 || L->n_files > 64)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: \"files\" must list 1..64 pack files", mf, L->layer);
        const cJSON *ss = cJSON_GetObjectItemCaseSensitive(lj, "stripe_sizes");
        if (ss) {
            /* unequal (proportional) stripes: one size per file, each a multiple of 4 KiB, summing to >= stride */
            if (!cJSON_IsArray(ss) || cJSON_GetArraySize(ss) != L->n_files)
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: \"stripe_sizes\" must list one size per file (%d)", mf,
                                   L->layer, L->n_files);
            L->stripe_sizes = calloc((size_t)L->n_files, sizeof(uint64_t));
            if (!L->stripe_sizes) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
            uint64_t sum = 0, mx = 0;
            int k = 0;
            for (const cJSON *x = ss->child; x; x = x->next, k++) {
                uint64_t v = 0;
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
                    x->valuedouble != (double)(uint64_t)x->valuedouble || (v = (uint64_t)x->valuedouble) == 0 || v % 4096)
                    return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: stripe_sizes[%d] must be a positive multiple of 4096",
                                       mf, L->layer, k);
                L->stripe_sizes[k] = v;
                sum += v;
                if (v > mx) mx = v;
            }
            if (sum < n->stride)
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: stripe_sizes sum to %llu, less than stride %llu", mf,
                                   L->layer, (unsigned long long)sum, (unsigned long long)n->stride);
            uint64_t sb;
            if (!j_u64(lj, "stripe_bytes", &sb) && sb != mx)
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: stripe_bytes %llu disagrees with stripe_sizes (largest %llu)",
                                   mf, L->layer, (unsigned long long)sb, (unsigned long long)mx);
            L->stripe_bytes = mx;
        } else if (j_u64(lj, "stripe_bytes", &L->stripe_bytes)) L->stripe_bytes = n->stride;
        if (L->n_files == 1 && L->stripe_bytes != n->stride)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: one file, so stripe_bytes must equal stride", mf, L->layer);
        if (!L->stripe_sizes && (L->stripe_bytes % 4096 || L->stripe_bytes * (uint64_t)L->n_files < n->stride))
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: stripe_bytes %llu x %d files does not cover stride %llu", mf,
                               L->layer, (unsigned long long)L->stripe_bytes, L->n_files, (unsigned long long)n->stride);
        L->files = calloc((size_t)L->n_files, sizeof(char *));
        if (!L->files) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        int f = 0;
        for (const cJSON *fj = files->child; fj; fj = fj->next, f++) {
            if (!cJSON_IsString(fj) || !fj->valuestring[0])
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: files[%d] is not a path", mf, L->layer, f);
            char p[4096];
            if (fj->valuestring[0] == '/') snprintf(p, sizeof p, "%s", fj->valuestring);
            else df_path_join(p, sizeof p, n->dir, fj->valuestring);
            L->files[f] = strdup(p);
            if (!L->files[f]) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
            int64_t fs = file_size(p);
            uint64_t need = (uint64_t)n->n_experts * native_stripe_size(L, f);
            if (fs < 0 && errno == ENOENT) {
                /* deferred: the packs may have moved (df_model_opts.expert_dirs points at them) */
                if (!n->pack_error[0])
                    snprintf(n->pack_error, sizeof n->pack_error, "expert pack %.1200s (layer %d): %s (moved? pass --expert-dirs)", p,
                             L->layer, strerror(ENOENT));
                continue;
            }
            if (fs < 0) return df_set_errc(err, errlen, DF_EIO, "%s: expert pack %s (layer %d): %s", mf, p, L->layer, strerror(errno));
            if ((uint64_t)fs != need)
                return df_set_errc(err, errlen, DF_EFORMAT, "expert pack %s (layer %d) is %lld bytes, needs %llu (%s; convert again)", p,
                                   L->layer, (long long)fs, (unsigned long long)need, native_pack_size_cause((uint64_t)fs, need));
        }
        if (!cJSON_IsArray(xx) || cJSON_GetArraySize(xx) != n->n_experts)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: xxh64 must list %d checksums", mf, L->layer, n->n_experts);
        L->xxh64 = calloc((size_t)n->n_experts, sizeof(uint64_t));
        if (!L->xxh64) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        int e = 0;
        for (const cJSON *x = xx->child; x; x = x->next, e++)
            if (!cJSON_IsString(x) || df_xxh64_parse(x->valuestring, &L->xxh64[e]))
                return df_set_errc(err, errlen, DF_EFORMAT, "%s: experts layer %d: xxh64[%d] is not 16 hex digits", mf, L->layer, e);
    }
    return DF_OK;
}

int native_open(df_native **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    df_native *n = calloc(1, sizeof *n);
    if (!n) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    char mf[1200], *txt = NULL;
    cJSON *root = NULL;
    int rc;
    if (!realpath(dir, n->dir)) {
        rc = df_set_errc(err, errlen, DF_EIO, "model directory %s: %s", dir, strerror(errno));
        goto done;
    }
    snprintf(mf, sizeof mf, "%s/manifest.json", n->dir);
    if ((rc = df_read_file(mf, &txt, NULL, err, errlen))) {
        if (!df_path_exists(mf))
            df_set_err(err, errlen, "%s has no manifest.json: not a deltafin model directory (or an interrupted conversion; run deltafin convert)", dir);
        goto done;
    }
    root = cJSON_Parse(txt);
    if (!cJSON_IsObject(root)) { rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: not valid JSON", mf); goto done; }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "deltafin-native")) {
        rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: \"format\" is not \"deltafin-native\"", mf);
        goto done;
    }
    if (!cJSON_IsNumber(ver) || ver->valueint != 1) {
        rc = df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: version %d is not supported (this build reads version 1; convert again)", mf,
                         cJSON_IsNumber(ver) ? ver->valueint : -1);
        goto done;
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    const char *base = strrchr(n->dir, '/');
    snprintf(n->name, sizeof n->name, "%.127s", cJSON_IsString(nm) && nm->valuestring[0] ? nm->valuestring : (base ? base + 1 : n->dir));
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(root, "spine_mode");
    if (!cJSON_IsString(sm) || (strcmp(sm->valuestring, "source") && strcmp(sm->valuestring, "bf16") && strcmp(sm->valuestring, "int8"))) {
        rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: spine_mode must be source, bf16 or int8", mf);
        goto done;
    }
    snprintf(n->spine_mode, sizeof n->spine_mode, "%s", sm->valuestring);
    n->exact = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "exact"));
    if ((rc = config_parse_obj(cJSON_GetObjectItemCaseSensitive(root, "config"), &n->cfg, mf, err, errlen))) goto done;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "spine");
    if (!cJSON_IsObject(sp)) { rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: \"spine\" missing", mf); goto done; }
    if ((rc = parse_spine(n, sp, mf, err, errlen))) goto done;
    if ((rc = parse_experts(n, cJSON_GetObjectItemCaseSensitive(root, "experts"), mf, err, errlen))) goto done;
done:
    free(txt);
    cJSON_Delete(root);
    if (rc) { native_close(n); return rc; }
    *out = n;
    return DF_OK;
}

const native_tensor *native_find(const df_native *n, const char *name) {
    for (int i = 0; i < n->n_tensors; i++)
        if (!strcmp(n->tensors[i].name, name)) return &n->tensors[i];
    return NULL;
}

void native_expert_views(const df_native *n, const void *extent, df_expert *out) {
    const uint8_t *b = extent;
    df_weight *w[3] = {&out->gate, &out->up, &out->down};
    for (int p = 0; p < 3; p++) {
        const native_expert_part *P = &n->parts[p];
        w[p]->type = n->expert_type;
        w[p]->rows = P->rows;
        w[p]->cols = P->cols;
        w[p]->data = b + P->offset;
        w[p]->scale = P->scale_bytes ? b + P->scale_offset : NULL;
    }
}

uint64_t native_extent_buf_bytes(const df_native *n, int layer) {
    if (layer < 0 || layer >= n->cfg.num_hidden_layers || !n->by_layer || !n->by_layer[layer]) return 0;
    const native_expert_layer *L = n->by_layer[layer];
    return native_stripe_begin(L, L->n_files);
}

int native_read_expert(const df_native *n, int layer, int expert, void *buf, char *err, size_t errlen) {
    if (!native_extent_buf_bytes(n, layer) || expert < 0 || expert >= n->n_experts)
        return df_set_errc(err, errlen, DF_EINVAL, "layer %d expert %d: no such routed expert", layer, expert);
    const native_expert_layer *L = n->by_layer[layer];
    uint64_t begin = 0;
    for (int f = 0; f < L->n_files; f++) {
        uint64_t sz = native_stripe_size(L, f);
        int fd = open(L->files[f], O_RDONLY | O_CLOEXEC);
        if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open expert pack %s (layer %d): %s", L->files[f], layer, strerror(errno));
        int rc = df_pread_all(fd, (uint8_t *)buf + begin, sz, (uint64_t)expert * sz);
        begin += sz;
        close(fd);
        if (rc)
            return df_set_errc(err, errlen, rc == -EIO ? DF_EFORMAT : DF_EIO, "expert pack %s: layer %d expert %d: %s", L->files[f], layer,
                               expert, rc == -EIO ? "short read (truncated file)" : strerror(-rc));
    }
    return DF_OK;
}

int native_verify_expert(const df_native *n, int layer, int expert, const void *extent, char *err, size_t errlen) {
    if (!native_extent_buf_bytes(n, layer) || expert < 0 || expert >= n->n_experts)
        return df_set_errc(err, errlen, DF_EINVAL, "layer %d expert %d: no such routed expert", layer, expert);
    const native_expert_layer *L = n->by_layer[layer];
    uint64_t h = df_xxh64(extent, n->stride);
    if (h != L->xxh64[expert]) {
        char a[17], b[17], where[2400];
        df_xxh64_hex(h, a);
        df_xxh64_hex(L->xxh64[expert], b);
        /* every stripe: file k holds the expert's stripe k at expert * size_k */
        size_t w = 0;
        where[0] = 0;
        for (int f = 0; f < L->n_files && w < sizeof where; f++)
            w += (size_t)snprintf(where + w, sizeof where - w, "%s%s at offset %llu (%llu bytes)", f ? " + " : "", L->files[f],
                                  (unsigned long long)((uint64_t)expert * native_stripe_size(L, f)),
                                  (unsigned long long)native_stripe_size(L, f));
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "checksum mismatch: layer %d expert %d in %s%s (xxh64 %s, manifest %s): the pack is corrupt; convert again",
                           layer, expert, where, L->n_files > 1 ? " (striped)" : "", a, b);
    }
    return DF_OK;
}

int native_verify(const df_native *n, df_progress_fn progress, void *user, char *err, size_t errlen) {
    uint64_t total = n->spine_bytes, done = 0;
    for (int i = 0; i < n->n_moe_layers; i++) total += (uint64_t)n->n_experts * n->stride;
    size_t chunk = 8u << 20;
    uint64_t maxbuf = chunk;
    for (int i = 0; i < n->n_moe_layers; i++)
        if (native_extent_buf_bytes(n, n->moe_layers[i].layer) > maxbuf) maxbuf = native_extent_buf_bytes(n, n->moe_layers[i].layer);
    uint8_t *buf = malloc(maxbuf);
    if (!buf) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    int rc = DF_OK;
    int fd = open(n->spine_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { rc = df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s", n->spine_path, strerror(errno)); goto out; }
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    for (uint64_t off = 0; off < n->spine_bytes && !rc; off += chunk) {
        size_t len = (size_t)(n->spine_bytes - off < chunk ? n->spine_bytes - off : chunk);
        int r = df_pread_all(fd, buf, len, off);
        if (r) rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: read failed at %llu: %s", n->spine_path, (unsigned long long)off,
                                r == -EIO ? "unexpected end of file" : strerror(-r));
        else XXH64_update(st, buf, len);
        done += len;
        if (!rc && progress && progress(user, "bytes", done, total)) rc = df_set_errc(err, errlen, DF_ECANCELLED, "verify cancelled");
    }
    close(fd);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    if (!rc && h != n->spine_xxh64) {
        char a[17], b[17];
        df_xxh64_hex(h, a);
        df_xxh64_hex(n->spine_xxh64, b);
        rc = df_set_errc(err, errlen, DF_EFORMAT, "checksum mismatch: %s (xxh64 %s, manifest %s): the spine is corrupt; convert again",
                         n->spine_path, a, b);
    }
    for (int i = 0; i < n->n_moe_layers && !rc; i++) {
        int l = n->moe_layers[i].layer;
        for (int e = 0; e < n->n_experts && !rc; e++) {
            if ((rc = native_read_expert(n, l, e, buf, err, errlen))) break;
            if ((rc = native_verify_expert(n, l, e, buf, err, errlen))) break;
            done += n->stride;
            if (progress && progress(user, "bytes", done, total)) rc = df_set_errc(err, errlen, DF_ECANCELLED, "verify cancelled");
        }
    }
out:
    free(buf);
    return rc;
}

int native_set_expert_dirs(df_native *n, const char *dirs, char *err, size_t errlen) {
    if (!dirs || !*dirs || !n->n_moe_layers) return DF_OK;
    int nd = 1;
    for (const char *p = dirs; *p; p++) nd += *p == ',';
    if (nd != n->moe_layers[0].n_files)
        return df_set_errc(err, errlen, DF_EINVAL, "expert dirs \"%s\": %d directories, but the packs of %s are striped over %d", dirs, nd,
                           n->dir, n->moe_layers[0].n_files);
    /* build all new paths first, then swap */
    int total = n->n_moe_layers * nd, k = 0;
    char **np = calloc((size_t)total, sizeof(char *));
    if (!np) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    int rc = DF_OK;
    for (int i = 0; i < n->n_moe_layers && !rc; i++) {
        native_expert_layer *L = &n->moe_layers[i];
        const char *p = dirs;
        for (int f = 0; f < L->n_files; f++) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            const char *base = strrchr(L->files[f], '/');
            base = base ? base + 1 : L->files[f];
            char path[4096];
            snprintf(path, sizeof path, "%.*s/%s", (int)len, p, base);
            int64_t fs = file_size(path);
            if (fs < 0) { rc = df_set_errc(err, errlen, DF_EIO, "expert pack %s (layer %d): %s", path, L->layer, strerror(errno)); break; }
            const uint64_t need = (uint64_t)n->n_experts * native_stripe_size(L, f);
            if ((uint64_t)fs != need) {
                rc = df_set_errc(err, errlen, DF_EFORMAT, "expert pack %s (layer %d) is %lld bytes, needs %llu (%s)", path, L->layer,
                                 (long long)fs, (unsigned long long)need, native_pack_size_cause((uint64_t)fs, need));
                break;
            }
            np[k++] = strdup(path);
            p = e ? e + 1 : p + len;
        }
    }
    if (rc) {
        for (int i = 0; i < k; i++) free(np[i]);
        free(np);
        return rc;
    }
    k = 0;
    for (int i = 0; i < n->n_moe_layers; i++)
        for (int f = 0; f < n->moe_layers[i].n_files; f++) {
            free(n->moe_layers[i].files[f]);
            n->moe_layers[i].files[f] = np[k++];
        }
    free(np);
    n->pack_error[0] = 0;
    return DF_OK;
}

int native_require_packs(const df_native *n, char *err, size_t errlen) {
    if (n->pack_error[0]) return df_set_errc(err, errlen, DF_EIO, "%s", n->pack_error);
    return DF_OK;
}

int native_stripe_plan(uint64_t stride, int n, const char *weights, uint64_t *sizes, int *unequal, char *err, size_t errlen) {
    *unequal = 0;
    if (n < 1 || n > 64) return df_set_errc(err, errlen, DF_EINVAL, "stripes: %d files (1..64)", n);
    uint64_t eq = n == 1 ? stride : (stride + (uint64_t)n - 1) / (uint64_t)n;
    eq = (eq + 4095) / 4096 * 4096;
    for (int k = 0; k < n; k++) sizes[k] = eq;
    if (!weights || !*weights) return DF_OK;
    double w[64], sum = 0;
    int m = 0;
    const char *p = weights;
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v > 0) || v > 1e9 || (*end && *end != ','))
            return df_set_errc(err, errlen, DF_EINVAL, "--stripe-weights \"%s\": expected positive numbers separated by commas", weights);
        if (m >= 64) return df_set_errc(err, errlen, DF_EINVAL, "--stripe-weights \"%s\": too many entries", weights);
        w[m++] = v;
        sum += v;
        if (!*end) break;
        p = end + 1;
    }
    if (m != n)
        return df_set_errc(err, errlen, DF_EINVAL, "--stripe-weights \"%s\" has %d entries, but there are %d expert directories", weights, m, n);
    int all_eq = 1;
    for (int k = 1; k < n; k++) all_eq &= w[k] == w[0];
    if (all_eq) return DF_OK;
    /* stripe k gets stride * w_k / sum(w), rounded up to whole 4 KiB pages (so the sizes sum to
     * >= stride, and bytes_k / bandwidth_k is the same for every drive to within a page) */
    uint64_t pages = (stride + 4095) / 4096;
    for (int k = 0; k < n; k++) {
        double share = (double)pages * w[k] / sum;
        uint64_t f = (uint64_t)share;
        if ((double)f < share - 1e-9) f++;
        sizes[k] = (f ? f : 1) * 4096;
    }
    for (int k = 1; k < n; k++) *unequal |= sizes[k] != sizes[0];
    if (!*unequal) /* proportional split came out equal: record it like the equal case */
        for (int k = 0; k < n; k++) sizes[k] = eq > sizes[0] ? eq : sizes[0];
    return DF_OK;
}
