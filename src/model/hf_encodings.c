/* hf_encodings.c — resolve checkpoint tensors to df_weight encodings
 * (see hf_encodings.h). Formats: ../shared/notes/formats.md. */
#include "hf_encodings.h"
#include "deltafin.h"
#include "util/util.h"

#include <stdio.h>
#include <string.h>

static int json_int(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : dflt;
}

int hf_quant_parse(const cJSON *root, hf_quant *q, const char *path, char *err, size_t errlen) {
    memset(q, 0, sizeof *q);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!qc) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (tc) qc = cJSON_GetObjectItemCaseSensitive(tc, "quantization_config");
    }
    if (!qc || cJSON_IsNull(qc)) return DF_OK;
    if (!cJSON_IsObject(qc)) return df_set_errc(err, errlen, DF_EFORMAT, "%s: quantization_config must be an object", path);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    const char *ms = cJSON_IsString(m) ? m->valuestring : "";
    if (!strcmp(ms, "fp8")) {
        q->method = HF_Q_FP8;
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(qc, "fmt");
        if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "e4m3"))
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: quantization_config.fmt \"%s\" is not supported (only e4m3)", path,
                               fmt->valuestring);
        const cJSON *bs = cJSON_GetObjectItemCaseSensitive(qc, "weight_block_size");
        q->fp8_block_r = q->fp8_block_c = 128;
        if (cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2) {
            q->fp8_block_r = (int)cJSON_GetArrayItem(bs, 0)->valuedouble;
            q->fp8_block_c = (int)cJSON_GetArrayItem(bs, 1)->valuedouble;
        }
        if (q->fp8_block_r != 128 || q->fp8_block_c != 128)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: fp8 weight_block_size [%d, %d] is not supported (only [128, 128])",
                               path, q->fp8_block_r, q->fp8_block_c);
        const cJSON *am = cJSON_GetObjectItemCaseSensitive(qc, "activation_scheme");
        (void)am; /* dynamic activation quantization is not part of the weights; we compute in f32 */
        return DF_OK;
    }
    if (!strcmp(ms, "compressed-tensors")) {
        q->method = HF_Q_COMPRESSED;
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(qc, "format");
        if (cJSON_IsString(fmt)) snprintf(q->format, sizeof q->format, "%s", fmt->valuestring);
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
        for (const cJSON *g = groups ? groups->child : NULL; g; g = g->next) {
            const cJSON *gf = cJSON_GetObjectItemCaseSensitive(g, "format");
            const char *f = cJSON_IsString(gf) ? gf->valuestring : q->format;
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
            if (!cJSON_IsObject(w)) continue;
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(w, "type");
            const char *tys = cJSON_IsString(ty) ? ty->valuestring : "int";
            int bits = json_int(w, "num_bits", 0), gs = json_int(w, "group_size", 0);
            if (!strcmp(f, "pack-quantized")) {
                if (bits != 4 || strcmp(tys, "int"))
                    return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                       "%s: compressed-tensors group \"%s\": pack-quantized %s %d-bit is not supported (only int 4-bit)",
                                       path, g->string, tys, bits);
                q->has_int4 = 1;
                q->int4_group = gs;
                q->int4_symmetric = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(w, "symmetric"));
                if (gs != 32 || !q->int4_symmetric)
                    return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                       "%s: compressed-tensors group \"%s\": int4 group_size %d%s is not supported (only symmetric, group 32)",
                                       path, g->string, gs, q->int4_symmetric ? "" : " asymmetric");
            } else if (!strcmp(f, "mxfp4-pack-quantized")) {
                q->has_mxfp4 = 1;
                q->mxfp4_group = gs ? gs : 32;
                if (q->mxfp4_group != 32 || (bits && bits != 4))
                    return df_set_errc(err, errlen, DF_EUNSUPPORTED, "%s: compressed-tensors group \"%s\": mxfp4 group_size %d is not supported",
                                       path, g->string, gs);
            } else if (!strcmp(f, "dense") || !f[0]) {
                /* nothing quantized by this group */
            } else {
                return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                   "%s: compressed-tensors format \"%s\" (group \"%s\") is not supported (pack-quantized, mxfp4-pack-quantized)",
                                   path, f, g->string);
            }
        }
        return DF_OK;
    }
    if (!strcmp(ms, "mxfp4")) return DF_OK; /* gpt-oss: _blocks/_scales decide it */
    return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                       "%s: quantization_config.quant_method \"%s\" is not supported (fp8, compressed-tensors)", path, ms);
}

int hf_base_len(const char *name) {
    static const char *const suf[] = {".weight", ".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suf / sizeof suf[0]; i++) {
        size_t L = strlen(suf[i]);
        if (n > L && !strcmp(name + n - L, suf[i])) return (int)(n - L);
    }
    return -1;
}

static const st_tensor *find2(const st_set *s, const char *base, const char *suffix) {
    char nm[512];
    snprintf(nm, sizeof nm, "%s%s", base, suffix);
    return st_find(s, nm);
}

static void set_contig(hf_weight *w, const st_tensor *d, uint64_t drows, const st_tensor *sc, uint64_t srows) {
    w->data = d->data;
    w->data_rows = drows;
    w->data_row_bytes = drows ? d->nbytes / drows : 0;
    w->data_row_stride = w->data_row_bytes;
    if (sc) {
        w->scale = sc->data;
        w->scale_rows = srows;
        w->scale_row_bytes = srows ? sc->nbytes / srows : 0;
        w->scale_row_stride = w->scale_row_bytes;
    }
}

#define SHP(t) (long long)(t)->shape[0], (long long)((t)->ndim > 1 ? (t)->shape[1] : 0)

int hf_weight_get(const st_set *s, const hf_quant *q, const char *base, hf_weight *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    const st_tensor *t = find2(s, base, ".weight");
    const st_tensor *pk = find2(s, base, ".weight_packed");
    static const char *const bad_suffix[] = {".weight_zero_point", ".weight_global_scale", ".input_scale", ".weight_g_idx"};
    for (size_t i = 0; i < sizeof bad_suffix / sizeof bad_suffix[0]; i++) {
        const st_tensor *b = find2(s, base, bad_suffix[i]);
        if (b)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                               "tensor %s%s (%s) in %s: this quantization (zero points / global scales / activation scales) is not supported",
                               base, bad_suffix[i], st_dtype_name(b->dtype), st_path(s, b));
    }
    if (t) {
        w->src = t;
        if (t->ndim == 1) {
            w->ndim = 1;
            w->rows = t->shape[0];
            w->cols = 1;
            switch (t->dtype) {
            case ST_F32: w->type = DF_W_F32; break;
            case ST_BF16: w->type = DF_W_BF16; break;
            case ST_F16: w->type = DF_W_F16; break;
            default:
                return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight: 1-D dtype %s in %s is not supported (F32, BF16, F16)",
                                   base, st_dtype_name(t->dtype), st_path(s, t));
            }
            set_contig(w, t, 1, NULL, 0);
            return DF_OK;
        }
        if (t->ndim != 2)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight in %s has %d dimensions (a linear weight needs 2)", base,
                               st_path(s, t), t->ndim);
        w->ndim = 2;
        w->rows = t->shape[0];
        w->cols = t->shape[1];
        switch (t->dtype) {
        case ST_F32: w->type = DF_W_F32; set_contig(w, t, (uint64_t)w->rows, NULL, 0); return DF_OK;
        case ST_BF16: w->type = DF_W_BF16; set_contig(w, t, (uint64_t)w->rows, NULL, 0); return DF_OK;
        case ST_F16: w->type = DF_W_F16; set_contig(w, t, (uint64_t)w->rows, NULL, 0); return DF_OK;
        case ST_F8_E4M3: {
            const st_tensor *sc = find2(s, base, ".weight_scale_inv");
            if (!sc)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                   "tensor %s.weight is F8_E4M3 in %s but has no %s.weight_scale_inv (only DeepSeek-V3 128x128 block FP8 is supported)",
                                   base, st_path(s, t), base);
            if (q->method == HF_Q_COMPRESSED)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight: F8_E4M3 in a compressed-tensors checkpoint (%s) is not supported",
                                   base, st_path(s, t));
            int64_t br = (w->rows + 127) / 128, bc = (w->cols + 127) / 128;
            if (sc->dtype != ST_F32)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight_scale_inv: dtype %s in %s is not supported (F32)", base,
                                   st_dtype_name(sc->dtype), st_path(s, sc));
            if (sc->ndim != 2 || sc->shape[0] != br || sc->shape[1] != bc)
                return df_set_errc(err, errlen, DF_EFORMAT,
                                   "tensor %s.weight_scale_inv in %s: shape [%lld, %lld], expected [%lld, %lld] (128x128 blocks of [%lld, %lld])",
                                   base, st_path(s, sc), SHP(sc), (long long)br, (long long)bc, (long long)w->rows, (long long)w->cols);
            w->type = DF_W_FP8_B128;
            set_contig(w, t, (uint64_t)w->rows, sc, (uint64_t)br);
            return DF_OK;
        }
        default:
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight: dtype %s in %s is not a weight encoding deltafin runs",
                               base, st_dtype_name(t->dtype), st_path(s, t));
        }
    }
    if (pk) {
        w->src = pk;
        const st_tensor *sc = find2(s, base, ".weight_scale");
        const st_tensor *shp = find2(s, base, ".weight_shape");
        if (!sc)
            return df_set_errc(err, errlen, DF_EFORMAT, "tensor %s.weight_packed in %s has no %s.weight_scale", base, st_path(s, pk), base);
        if (pk->ndim != 2 || sc->ndim != 2)
            return df_set_errc(err, errlen, DF_EFORMAT, "tensors %s.weight_packed / .weight_scale in %s must be 2-D", base, st_path(s, pk));
        int64_t rows = pk->shape[0], cols;
        if (pk->dtype == ST_I32) {
            if (q->method != HF_Q_COMPRESSED || !q->has_int4)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                   "tensor %s.weight_packed (I32) in %s: config.json has no compressed-tensors pack-quantized int4 group", base,
                                   st_path(s, pk));
            cols = pk->shape[1] * 8;
            w->type = DF_W_INT4_G32;
            if (sc->dtype != ST_BF16)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight_scale: dtype %s in %s is not supported for int4 (BF16)",
                                   base, st_dtype_name(sc->dtype), st_path(s, sc));
        } else if (pk->dtype == ST_U8) {
            if (q->method != HF_Q_COMPRESSED || !q->has_mxfp4)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                                   "tensor %s.weight_packed (U8) in %s: config.json has no compressed-tensors mxfp4-pack-quantized group", base,
                                   st_path(s, pk));
            cols = pk->shape[1] * 2;
            w->type = DF_W_MXFP4;
            if (sc->dtype != ST_U8)
                return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight_scale: dtype %s in %s is not supported for mxfp4 (U8 E8M0)",
                                   base, st_dtype_name(sc->dtype), st_path(s, sc));
        } else {
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight_packed: dtype %s in %s is not supported (I32 int4, U8 mxfp4)",
                               base, st_dtype_name(pk->dtype), st_path(s, pk));
        }
        if (shp) {
            int64_t v[2];
            if (shp->numel != 2 || (shp->dtype != ST_I32 && shp->dtype != ST_I64))
                return df_set_errc(err, errlen, DF_EFORMAT, "tensor %s.weight_shape in %s must be 2 integers", base, st_path(s, shp));
            for (int i = 0; i < 2; i++) {
                if (shp->dtype == ST_I32) { int32_t x; memcpy(&x, shp->data + 4 * i, 4); v[i] = x; }
                else memcpy(&v[i], shp->data + 8 * i, 8);
            }
            if (v[0] != rows || v[1] != cols)
                return df_set_errc(err, errlen, DF_EFORMAT,
                                   "tensor %s.weight_shape in %s is [%lld, %lld] but weight_packed holds [%lld, %lld]", base, st_path(s, shp),
                                   (long long)v[0], (long long)v[1], (long long)rows, (long long)cols);
        }
        if (cols % 32)
            return df_set_errc(err, errlen, DF_EUNSUPPORTED, "tensor %s.weight_packed in %s: %lld columns is not a multiple of the group (32)",
                               base, st_path(s, pk), (long long)cols);
        if (sc->shape[0] != rows || sc->shape[1] != cols / 32)
            return df_set_errc(err, errlen, DF_EFORMAT, "tensor %s.weight_scale in %s: shape [%lld, %lld], expected [%lld, %lld]", base,
                               st_path(s, sc), SHP(sc), (long long)rows, (long long)(cols / 32));
        w->ndim = 2;
        w->rows = rows;
        w->cols = cols;
        set_contig(w, pk, (uint64_t)rows, sc, (uint64_t)rows);
        return DF_OK;
    }
    return df_set_errc(err, errlen, DF_EFORMAT, "tensor %s.weight (or .weight_packed) not found in the checkpoint", base);
}

int hf_gptoss_expert(const st_set *s, const char *p, int expert, int rows_sel, hf_weight *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    const st_tensor *b = find2(s, p, "_blocks"), *sc = find2(s, p, "_scales");
    if (!b || !sc) return df_set_errc(err, errlen, DF_EFORMAT, "tensors %s_blocks / %s_scales not found", p, p);
    if (b->dtype != ST_U8 || sc->dtype != ST_U8 || b->ndim != 4 || sc->ndim != 3 || b->shape[3] != 16 ||
        sc->shape[0] != b->shape[0] || sc->shape[1] != b->shape[1] || sc->shape[2] != b->shape[2])
        return df_set_errc(err, errlen, DF_EUNSUPPORTED,
                           "tensors %s_blocks (%s, %dD) / %s_scales (%s, %dD) in %s: expected U8 [E, R, C/32, 16] and U8 [E, R, C/32]", p,
                           st_dtype_name(b->dtype), b->ndim, p, st_dtype_name(sc->dtype), sc->ndim, st_path(s, b));
    int64_t E = b->shape[0], R = b->shape[1], G = b->shape[2];
    if (expert < 0 || expert >= E) return df_set_errc(err, errlen, DF_EINVAL, "%s: expert %d out of range (%lld)", p, expert, (long long)E);
    if (rows_sel && R % 2) return df_set_errc(err, errlen, DF_EFORMAT, "%s: %lld rows cannot be split into gate/up pairs", p, (long long)R);
    uint64_t drb = (uint64_t)G * 16, srb = (uint64_t)G;
    w->src = b;
    w->type = DF_W_MXFP4;
    w->ndim = 2;
    w->rows = rows_sel ? R / 2 : R;
    w->cols = G * 32;
    w->data = b->data + (uint64_t)expert * (uint64_t)R * drb + (rows_sel == 2 ? drb : 0);
    w->data_rows = (uint64_t)w->rows;
    w->data_row_bytes = drb;
    w->data_row_stride = rows_sel ? 2 * drb : drb;
    w->scale = sc->data + (uint64_t)expert * (uint64_t)R * srb + (rows_sel == 2 ? srb : 0);
    w->scale_rows = (uint64_t)w->rows;
    w->scale_row_bytes = srb;
    w->scale_row_stride = rows_sel ? 2 * srb : srb;
    return DF_OK;
}

void hf_weight_copy(const hf_weight *w, void *dst_data, void *dst_scale) {
    uint8_t *d = dst_data;
    if (w->data_row_stride == w->data_row_bytes) memcpy(d, w->data, hf_data_bytes(w));
    else
        for (uint64_t r = 0; r < w->data_rows; r++) memcpy(d + r * w->data_row_bytes, w->data + r * w->data_row_stride, w->data_row_bytes);
    if (!dst_scale || !w->scale_rows) return;
    uint8_t *sd = dst_scale;
    if (w->scale_row_stride == w->scale_row_bytes) memcpy(sd, w->scale, hf_scale_bytes(w));
    else
        for (uint64_t r = 0; r < w->scale_rows; r++)
            memcpy(sd + r * w->scale_row_bytes, w->scale + r * w->scale_row_stride, w->scale_row_bytes);
}

int hf_weight_view(const hf_weight *w, df_weight *out) {
    if (w->data_row_stride != w->data_row_bytes || w->scale_row_stride != w->scale_row_bytes) return -1;
    out->type = w->type;
    out->rows = w->rows;
    out->cols = w->cols;
    out->data = w->data;
    out->scale = w->scale_rows ? w->scale : NULL;
    return 0;
}
