/* convert.c — df_convert: a Hugging Face checkpoint directory -> deltafin's
 * native layout (docs/native-format.md): spine.bin (every non-routed tensor,
 * 64-byte aligned, source encoding or re-encoded per the spine mode),
 * experts-LNNN.pack (each routed expert one 4 KiB-aligned extent, bytes copied
 * bit for bit, optionally striped over several directories), XXH64 checksums,
 * tokenizer files, and manifest.json written last, atomically. Tensor names are
 * made canonical (language_model. prefix dropped, block_sparse_moe. -> mlp.,
 * Moonshot / transformers KDA spellings unified, conv [D,1,W] -> [D,W], A_log /
 * dt_bias / AttnRes projections as vectors; docs/native-format.md). Every file is
 * written as *.tmp and renamed only when all of them are complete; on error or
 * cancellation (the progress callback; `deltafin convert` on SIGINT / SIGTERM) every
 * file of the conversion is removed, the .tmp files and any already renamed. */
#define _GNU_SOURCE /* O_DIRECT */
#include "convert.h"
#include "config.h"
#include "hf_encodings.h"
#include "native.h"
#include "safetensors.h"
#include "weights_util.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define ALIGN_ARRAY 64u
#define ALIGN_EXTENT 4096u

const char *convert_spine_mode_name(df_spine_mode m) {
    return m == DF_SPINE_BF16 ? "bf16" : m == DF_SPINE_INT8 ? "int8" : "source";
}

int convert_spine_mode_from_name(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "source")) return DF_SPINE_SOURCE;
    if (!strcmp(s, "bf16")) return DF_SPINE_BF16;
    if (!strcmp(s, "int8")) return DF_SPINE_INT8;
    return -1;
}

void df_convert_opts_default(df_convert_opts *o) {
    memset(o, 0, sizeof *o);
    o->spine = DF_SPINE_SOURCE;
}

/* ------------------------------------------------------------------ state */

typedef struct {
    char name[160];       /* native (HF text-model) name */
    hf_weight w;
    df_wtype out_type;
    uint64_t off, bytes, soff, sbytes;
} sp_item;

typedef struct {
    int layer;
    int n_files;
    char **tmp, **final, **rel;   /* [n_files] */
    uint64_t stripe_bytes;        /* largest stripe */
    uint64_t sizes[64];           /* [n_files] stripe k's bytes per expert */
    int unequal;                  /* sizes differ: manifest records "stripe_sizes" */
    uint64_t *xxh;                /* [n_experts] */
} ex_layer;

typedef struct {
    const char *hf_dir;
    char out_dir[3072];
    const df_convert_opts *opts;
    cJSON *config_root;
    df_config cfg;
    hf_quant q;
    st_set *st;
    char prefix[32];              /* "" or "language_model." */
    /* spine */
    sp_item *sp;
    int n_sp, cap_sp;
    uint64_t spine_bytes, spine_xxh;
    int spine_lossless;           /* bf16 mode: every re-encoding exact */
    int n_lossy;
    /* experts */
    int n_moe;
    ex_layer *ex;
    df_wtype ex_type;
    int ex_type_set;
    native_expert_part parts[3];
    char ex_blk[24];              /* source block of routed experts: "mlp" or "block_sparse_moe" */
    int ex_w123;                  /* source part names w1/w3/w2 (Moonshot) instead of gate/up/down_proj */
    int ex_style_set;
    uint64_t extent_bytes, stride;
    int n_dirs;
    char **dirs;                  /* absolute */
    /* progress + errors (shared by threads) */
    pthread_mutex_t mu;
    uint64_t done, total;
    int rc;
    char *err;
    size_t errlen;
    int next_layer;
    int encodings_seen[DF_W__COUNT];
} conv;

static int progress_add(conv *c, uint64_t bytes) {
    pthread_mutex_lock(&c->mu);
    c->done += bytes;
    int stop = 0;
    if (c->opts->progress && c->rc == DF_OK) stop = c->opts->progress(c->opts->progress_user, "bytes", c->done, c->total);
    if (stop && c->rc == DF_OK) c->rc = df_set_errc(c->err, c->errlen, DF_ECANCELLED, "conversion cancelled");
    int rc = c->rc;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int set_rc(conv *c, int rc, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (c->rc == DF_OK) {
        c->rc = rc;
        df_set_err(c->err, c->errlen, "%s", msg);
    }
    rc = c->rc;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ------------------------------------------------------- classification */

/* "model.layers.N.rest" -> N and pointer to rest; -1 if not a layer tensor. */
static int layer_of(const char *name, const char **rest) {
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1)) return -1;
    const char *p = name + sizeof pre - 1;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || *end != '.' || v < 0 || v > 100000) return -1;
    *rest = end + 1;
    return (int)v;
}

static int add_spine(conv *c, const char *name, const hf_weight *w) {
    if (c->n_sp == c->cap_sp) {
        int nc = c->cap_sp ? 2 * c->cap_sp : 256;
        sp_item *ns = realloc(c->sp, sizeof(sp_item) * (size_t)nc);
        if (!ns) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
        c->sp = ns;
        c->cap_sp = nc;
    }
    sp_item *it = &c->sp[c->n_sp++];
    memset(it, 0, sizeof *it);
    if (strlen(name) >= sizeof it->name) return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor name too long: %s", name);
    snprintf(it->name, sizeof it->name, "%s", name);
    it->w = *w;
    return DF_OK;
}

/* Canonical (native) name of a checkpoint tensor name (prefix already removed): Moonshot's
 * `block_sparse_moe.` is `mlp.`, and transformers' in-memory/later spellings of the Kimi KDA, MLA gate and
 * AttnRes tensors map to Moonshot's names (docs/native-format.md "Canonical names"). */
static const char *const canon_map[][2] = {
    {".block_sparse_moe.", ".mlp."},
    {".self_attn.forget_gate.f_a_proj.", ".self_attn.f_a_proj."},
    {".self_attn.forget_gate.f_b_proj.", ".self_attn.f_b_proj."},
    {".self_attn.forget_gate.A_log", ".self_attn.A_log"},
    {".self_attn.forget_gate.dt_bias", ".self_attn.dt_bias"},
    {".self_attn.forget_gate_down.", ".self_attn.f_a_proj."},
    {".self_attn.forget_gate_up.", ".self_attn.f_b_proj."},
    {".self_attn.beta_proj.", ".self_attn.b_proj."},
    {".self_attn.output_gate_down.", ".self_attn.g_a_proj."},
    {".self_attn.output_gate_up.", ".self_attn.g_b_proj."},
    {".self_attn.output_gate.", ".self_attn.g_proj."},
    {".self_attn.output_gate_proj.", ".self_attn.g_proj."},
    {".self_attn.q_conv.conv1d.", ".self_attn.q_conv1d."},
    {".self_attn.k_conv.conv1d.", ".self_attn.k_conv1d."},
    {".self_attn.v_conv.conv1d.", ".self_attn.v_conv1d."},
    {".pre_attn_residual.pseudo_queries.", ".self_attention_res_proj."},
    {".pre_attn_residual.attn_residual_norm.", ".self_attention_res_norm."},
    {".post_attn_residual.pseudo_queries.", ".mlp_res_proj."},
    {".post_attn_residual.attn_residual_norm.", ".mlp_res_norm."},
};

static int canon_name(const char *in, char *out, size_t cap) {
    char a[512], b[512];
    if (strlen(in) >= sizeof a) return -1;
    snprintf(a, sizeof a, "%s", in);
    for (size_t i = 0; i < sizeof canon_map / sizeof canon_map[0]; i++) {
        const char *hit = strstr(a, canon_map[i][0]);
        if (!hit) continue;
        size_t pre = (size_t)(hit - a);
        if ((size_t)snprintf(b, sizeof b, "%.*s%s%s", (int)pre, a, canon_map[i][1], hit + strlen(canon_map[i][0])) >= sizeof b) return -1;
        memcpy(a, b, strlen(b) + 1);
    }
    if (strlen(a) >= cap) return -1;
    memcpy(out, a, strlen(a) + 1);
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static int plain_dtype(st_dtype d, df_wtype *t) {
    switch (d) {
    case ST_F32: *t = DF_W_F32; return 1;
    case ST_BF16: *t = DF_W_BF16; return 1;
    case ST_F16: *t = DF_W_F16; return 1;
    default: return 0;
    }
}

/* A plain (f32/bf16/f16) tensor viewed as a vector [n] (ndim 1) or a matrix [rows, cols] starting at row `row0`. */
static void plain_view(hf_weight *w, const st_tensor *t, df_wtype ty, int ndim, int64_t rows, int64_t cols, int64_t row0) {
    memset(w, 0, sizeof *w);
    size_t es = st_dtype_size(t->dtype);
    w->type = ty;
    w->ndim = ndim;
    w->rows = rows;
    w->cols = ndim == 1 ? 1 : cols;
    w->data = t->data + (uint64_t)row0 * (uint64_t)cols * es;
    w->data_rows = ndim == 1 ? 1 : (uint64_t)rows;
    w->data_row_bytes = w->data_row_stride = ndim == 1 ? (uint64_t)rows * es : (uint64_t)cols * es;
    w->src = t;
}

/* KDA short-conv weights: [D, 1, W] (nn.Conv1d, depthwise) or [D, W] -> native 2-D [D, W] in the source dtype.
 * A packed transformers conv1d [2Dk + Dv, 1, W] is split into q, k, v rows in that order. */
static int add_conv(conv *c, const st_tensor *t, const char *native_name, int packed) {
    df_wtype ty;
    int ok = plain_dtype(t->dtype, &ty) && ((t->ndim == 3 && t->shape[1] == 1) || t->ndim == 2);
    if (!ok)
        return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED,
                           "tensor %s (%s, %d-D) in %s: a KDA short-conv weight must be F32/BF16/F16 [D, 1, W] or [D, W]", t->name,
                           st_dtype_name(t->dtype), t->ndim, st_path(c->st, t));
    int64_t rows = t->shape[0], W = t->shape[t->ndim - 1];
    hf_weight w;
    if (!packed) {
        plain_view(&w, t, ty, 2, rows, W, 0);
        return add_spine(c, native_name, &w);
    }
    int64_t D = (int64_t)c->cfg.kda_heads * c->cfg.kda_head_dim;
    if (rows != 3 * D)
        return df_set_errc(c->err, c->errlen, DF_EFORMAT, "tensor %s in %s: %lld rows, a packed q/k/v conv needs 3 x %lld (kda heads x head_dim)",
                           t->name, st_path(c->st, t), (long long)rows, (long long)D);
    static const char *const qkv[3] = {"q", "k", "v"};
    char nm[512];
    size_t base = strlen(native_name) - strlen("conv1d.weight");
    for (int i = 0; i < 3; i++) {
        snprintf(nm, sizeof nm, "%.*s%s_conv1d.weight", (int)base, native_name, qkv[i]);
        plain_view(&w, t, ty, 2, D, W, (int64_t)i * D);
        int rc = add_spine(c, nm, &w);
        if (rc) return rc;
    }
    return DF_OK;
}

static int cmp_sp_name(const void *a, const void *b) {
    return strcmp((*(const sp_item *const *)a)->name, (*(const sp_item *const *)b)->name);
}

/* Walk every tensor of the checkpoint: spine tensors are resolved now,
 * routed experts are only validated by name (resolved per layer later). */
static int classify(conv *c) {
    const st_set *s = c->st;
    const df_config *g = &c->cfg;
    if (st_find(s, "language_model.model.embed_tokens.weight") && !st_find(s, "model.embed_tokens.weight"))
        snprintf(c->prefix, sizeof c->prefix, "language_model.");
    size_t pl = strlen(c->prefix);
    char last_base[512] = "";
    for (int i = 0; i < s->n; i++) {
        const st_tensor *t = &s->t[i];
        if (strncmp(t->name, c->prefix, pl)) continue;          /* vision tower, mm_projector etc. */
        const char *raw = t->name + pl;
        if (strncmp(raw, "model.", 6) && strncmp(raw, "lm_head.", 8)) continue;
        char nm[512];
        if (canon_name(raw, nm, sizeof nm))
            return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor name too long: %s", t->name);
        const char *rest = NULL, *raw_rest = NULL;
        int l = layer_of(nm, &rest);
        layer_of(raw, &raw_rest);
        if (l >= g->num_hidden_layers) continue;                 /* MTP layers: not used by transformers */
        if (l >= 0 && !strncmp(rest, "mlp.experts.", 12)) {
            const char *p = rest + 12;
            char *end;
            long e = strtol(p, &end, 10);
            int ok = end != p && *end == '.' && e >= 0 && e < g->n_routed_experts && config_layer_is_moe(g, l);
            int w123 = -1;
            if (ok) {
                const char *part = end + 1;
                if (!strncmp(part, "gate_proj.", 10) || !strncmp(part, "up_proj.", 8) || !strncmp(part, "down_proj.", 10)) w123 = 0;
                else if (!strncmp(part, "w1.", 3) || !strncmp(part, "w2.", 3) || !strncmp(part, "w3.", 3)) w123 = 1;
                ok = w123 >= 0 && hf_base_len(t->name) > 0 && strchr(strchr(part, '.') + 1, '.') == NULL;
            }
            if (!config_layer_is_moe(g, l))
                return df_set_errc(c->err, c->errlen, DF_EFORMAT,
                                   "tensor %s in %s: layer %d holds routed expert tensors, but config.json makes it a "
                                   "dense layer (first_k_dense_replace %d, num_hidden_layers %d%s): fix config.json",
                                   t->name, st_path(s, t), l, g->first_k_dense_replace, g->num_hidden_layers,
                                   g->n_routed_experts > 0 ? "" : ", no routed experts");
            if (!ok)
                return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED,
                                   "tensor %s (%s) in %s: not a routed expert weight deltafin understands "
                                   "(expected mlp.experts.E.{gate,up,down}_proj.* or block_sparse_moe.experts.E.w{1,3,2}.* with E < %d in a MoE layer; fused/gpt-oss expert tensors are not used by this model family)",
                                   t->name, st_dtype_name(t->dtype), st_path(s, t), g->n_routed_experts);
            const char *xp = strstr(raw_rest, ".experts.");
            char blk[24];
            snprintf(blk, sizeof blk, "%.*s", xp ? (int)(xp - raw_rest) : 0, raw_rest);
            if (!c->ex_style_set) {
                snprintf(c->ex_blk, sizeof c->ex_blk, "%s", blk);
                c->ex_w123 = w123;
                c->ex_style_set = 1;
            } else if (strcmp(blk, c->ex_blk) || w123 != c->ex_w123) {
                return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED,
                                   "tensor %s in %s: routed experts named two ways in one checkpoint (%s.experts.E.%s and this one)", t->name,
                                   st_path(s, t), c->ex_blk, c->ex_w123 ? "w1/w3/w2" : "gate_proj/up_proj/down_proj");
            }
            continue;
        }
        /* KDA shapes that are not linear weights: conv [D,1,W] -> [D,W]; A_log / dt_bias (any shape) -> vector */
        if (l >= 0 && !strcmp(rest, "self_attn.conv1d.weight")) {
            int rc = add_conv(c, t, nm, 1);
            if (rc) return rc;
            continue;
        }
        if (l >= 0 && (!strcmp(rest, "self_attn.q_conv1d.weight") || !strcmp(rest, "self_attn.k_conv1d.weight") ||
                       !strcmp(rest, "self_attn.v_conv1d.weight"))) {
            int rc = add_conv(c, t, nm, 0);
            if (rc) return rc;
            continue;
        }
        if (l >= 0 && (!strcmp(rest, "self_attn.A_log") || !strcmp(rest, "self_attn.dt_bias"))) {
            df_wtype ty;
            if (!plain_dtype(t->dtype, &ty))
                return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor %s (%s) in %s: must be F32, BF16 or F16", t->name,
                                   st_dtype_name(t->dtype), st_path(s, t));
            hf_weight w;
            plain_view(&w, t, ty, 1, (int64_t)t->numel, 1, 0);
            int rc = add_spine(c, nm, &w);
            if (rc) return rc;
            continue;
        }
        int bl = hf_base_len(raw);
        if (bl < 0) {
            if (t->dtype == ST_I64 || strstr(nm, "rotary_emb.inv_freq")) continue;  /* ignorable buffers */
            if (t->ndim == 1 && (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16)) {
                hf_weight w;
                memset(&w, 0, sizeof w);
                w.type = t->dtype == ST_F32 ? DF_W_F32 : t->dtype == ST_BF16 ? DF_W_BF16 : DF_W_F16;
                w.ndim = 1;
                w.rows = t->shape[0];
                w.cols = 1;
                w.data = t->data;
                w.data_rows = 1;
                w.data_row_bytes = w.data_row_stride = t->nbytes;
                w.src = t;
                int rc = add_spine(c, nm, &w);
                if (rc) return rc;
                continue;
            }
            return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor %s (%s, %d-D) in %s: not a tensor deltafin knows how to use",
                               t->name, st_dtype_name(t->dtype), t->ndim, st_path(s, t));
        }
        char base[512];
        snprintf(base, sizeof base, "%.*s", (int)(bl + pl), t->name);
        if (!strcmp(base, last_base)) continue;
        snprintf(last_base, sizeof last_base, "%s", base);
        hf_weight w;
        int rc = hf_weight_get(s, &c->q, base, &w, c->err, c->errlen);
        if (rc) return rc;
        char native_name[512], rb[512];
        snprintf(rb, sizeof rb, "%s.weight", base + pl);
        if (canon_name(rb, native_name, sizeof native_name))
            return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor name too long: %s", t->name);
        /* AttnRes projections [1, hidden] are vectors */
        if (ends_with(native_name, "_res_proj.weight") && w.ndim == 2 && w.rows == 1 &&
            (w.type == DF_W_F32 || w.type == DF_W_BF16 || w.type == DF_W_F16)) {
            w.ndim = 1;
            w.rows = w.cols;
            w.cols = 1;
            w.data_rows = 1;
            w.data_row_stride = w.data_row_bytes;   /* one row: contiguous */
        }
        if ((rc = add_spine(c, native_name, &w))) return rc;
    }
    /* two checkpoint names that map to one native name */
    if (c->n_sp > 1) {
        sp_item **ix = malloc(sizeof(sp_item *) * (size_t)c->n_sp);
        if (!ix) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
        for (int i = 0; i < c->n_sp; i++) ix[i] = &c->sp[i];
        qsort(ix, (size_t)c->n_sp, sizeof *ix, cmp_sp_name);
        int rc = DF_OK;
        for (int i = 1; i < c->n_sp && !rc; i++)
            if (!strcmp(ix[i]->name, ix[i - 1]->name))
                rc = df_set_errc(c->err, c->errlen, DF_EFORMAT, "tensors %s and %s (in %s) both become \"%s\" in deltafin's names", ix[i - 1]->w.src->name,
                                 ix[i]->w.src->name, st_path(s, ix[i]->w.src), ix[i]->name);
        free(ix);
        if (rc) return rc;
    }
    return DF_OK;
}

/* ------------------------------------------------------------ spine write */

typedef struct {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t cap, len;
    uint64_t pos;
    XXH64_state_t *h;
} seqw;

static int sw_flush(seqw *w) {
    if (!w->len) return 0;
    int rc = df_pwrite_all(w->fd, w->buf, w->len, w->pos - w->len);
    w->len = 0;
    return rc;
}

static int sw_write(seqw *w, const void *data, size_t n) {
    const uint8_t *p = data;
    XXH64_update(w->h, p, n);
    while (n) {
        size_t k = w->cap - w->len < n ? w->cap - w->len : n;
        memcpy(w->buf + w->len, p, k);
        w->len += k;
        w->pos += k;
        p += k;
        n -= k;
        if (w->len == w->cap) {
            int rc = sw_flush(w);
            if (rc) return rc;
        }
    }
    return 0;
}

static int sw_pad_to(seqw *w, uint64_t off) {
    static const uint8_t zeros[ALIGN_ARRAY];
    while (w->pos < off) {
        size_t k = off - w->pos < sizeof zeros ? (size_t)(off - w->pos) : sizeof zeros;
        int rc = sw_write(w, zeros, k);
        if (rc) return rc;
    }
    return 0;
}

/* Output type of a spine tensor under the spine mode. */
static df_wtype spine_out_type(const conv *c, const sp_item *it) {
    df_wtype t = it->w.type;
    if (it->w.ndim == 1) return t;
    if (ends_with(it->name, "_conv1d.weight")) return t;   /* KDA short conv: not a linear, kept like a vector */
    if (c->opts->spine == DF_SPINE_BF16 && (t == DF_W_F32 || t == DF_W_F16 || t == DF_W_FP8_B128)) return DF_W_BF16;
    if (c->opts->spine == DF_SPINE_INT8 && strcmp(it->name, "model.embed_tokens.weight")) return DF_W_INT8_ROW;
    return t;
}

static void layout_spine(conv *c) {
    uint64_t cur = 0;
    for (int i = 0; i < c->n_sp; i++) {
        sp_item *it = &c->sp[i];
        it->out_type = spine_out_type(c, it);
        it->off = df_round_up(cur, ALIGN_ARRAY);
        if (it->out_type == it->w.type) {
            it->bytes = hf_data_bytes(&it->w);
            it->sbytes = hf_scale_bytes(&it->w);
        } else {
            it->bytes = df_weight_data_bytes(it->out_type, it->w.rows, it->w.cols);
            it->sbytes = df_weight_scale_bytes(it->out_type, it->w.rows, it->w.cols);
        }
        cur = it->off + it->bytes;
        if (it->sbytes) {
            it->soff = df_round_up(cur, ALIGN_ARRAY);
            cur = it->soff + it->sbytes;
        }
    }
    c->spine_bytes = cur;
}

/* Re-encode one 2-D spine tensor (bf16 or int8_row) into data/scale. */
static int reencode(conv *c, sp_item *it, uint8_t *data, uint8_t *scale) {
    df_weight src;
    if (hf_weight_view(&it->w, &src)) return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "tensor %s: non-contiguous source", it->name);
    float *row = malloc(sizeof(float) * (size_t)it->w.cols);
    if (!row) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    int lossless = 1;
    for (int64_t r = 0; r < it->w.rows; r++) {
        df_weight_dequant_row(&src, r, row);
        if (it->out_type == DF_W_BF16) {
            uint16_t *o = (uint16_t *)data + r * it->w.cols;
            for (int64_t j = 0; j < it->w.cols; j++) {
                o[j] = df_f32_to_bf16(row[j]);
                if (!df_f32_is_bf16_exact(row[j])) lossless = 0;
            }
        } else { /* DF_W_INT8_ROW: per-row absmax/127, round half to even */
            float amax = 0;
            for (int64_t j = 0; j < it->w.cols; j++) amax = fmaxf(amax, fabsf(row[j]));
            float s = amax / 127.0f;
            int8_t *o = (int8_t *)data + r * it->w.cols;
            for (int64_t j = 0; j < it->w.cols; j++) {
                float v = s > 0 ? nearbyintf(row[j] / s) : 0.0f;
                if (v > 127) v = 127;
                if (v < -127) v = -127;
                o[j] = (int8_t)v;
            }
            memcpy(scale + 4 * r, &s, 4);
        }
    }
    free(row);
    if (!lossless) {
        c->spine_lossless = 0;
        c->n_lossy++;
    }
    return DF_OK;
}

static int write_spine(conv *c, const char *tmp) {
    seqw w = {0};
    w.path = tmp;
    w.cap = 8u << 20;
    w.buf = malloc(w.cap);
    w.h = XXH64_createState();
    if (!w.buf || !w.h) {
        free(w.buf);
        XXH64_freeState(w.h);
        return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    }
    XXH64_reset(w.h, 0);
    int rc = DF_OK;
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        rc = df_set_errc(c->err, c->errlen, DF_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    c->spine_lossless = 1;
    for (int i = 0; i < c->n_sp && rc == DF_OK; i++) {
        sp_item *it = &c->sp[i];
        int e;
        if ((e = sw_pad_to(&w, it->off))) goto ioerr;
        if (it->out_type == it->w.type && it->w.data_row_stride == it->w.data_row_bytes &&
            it->w.scale_row_stride == it->w.scale_row_bytes) {
            /* contiguous source: straight from the mmap */
            e = sw_write(&w, it->w.data, it->bytes);
            if (!e && it->sbytes) e = sw_pad_to(&w, it->soff);
            if (!e && it->sbytes) e = sw_write(&w, it->w.scale, it->sbytes);
            if (e) goto ioerr;
        } else if (it->out_type == it->w.type) {
            uint8_t *d = malloc(it->bytes + it->sbytes + 1);
            if (!d) { rc = df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory"); break; }
            hf_weight_copy(&it->w, d, it->sbytes ? d + it->bytes : NULL);
            e = sw_write(&w, d, it->bytes);
            if (!e && it->sbytes) e = sw_pad_to(&w, it->soff);
            if (!e && it->sbytes) e = sw_write(&w, d + it->bytes, it->sbytes);
            free(d);
            if (e) goto ioerr;
        } else {
            uint8_t *d = calloc(1, it->bytes + it->sbytes + 1);
            if (!d) { rc = df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory"); break; }
            rc = reencode(c, it, d, d + it->bytes);
            if (!rc) {
                e = sw_write(&w, d, it->bytes);
                if (!e && it->sbytes) e = sw_pad_to(&w, it->soff);
                if (!e && it->sbytes) e = sw_write(&w, d + it->bytes, it->sbytes);
            }
            free(d);
            if (rc) break;
            if (e) goto ioerr;
        }
        rc = progress_add(c, (i + 1 < c->n_sp ? c->sp[i + 1].off : c->spine_bytes) - it->off);
        continue;
    ioerr:
        rc = df_set_errc(c->err, c->errlen, DF_EIO, "cannot write %s: %s", tmp, strerror(-e));
    }
    if (rc == DF_OK) {
        int e = sw_flush(&w);
        if (!e && fsync(w.fd) != 0) e = -errno;
        if (e) rc = df_set_errc(c->err, c->errlen, DF_EIO, "cannot write %s: %s", tmp, strerror(-e));
    }
    if (close(w.fd) != 0 && rc == DF_OK) rc = df_set_errc(c->err, c->errlen, DF_EIO, "cannot close %s: %s", tmp, strerror(errno));
    c->spine_xxh = XXH64_digest(w.h);
out:
    free(w.buf);
    XXH64_freeState(w.h);
    return rc;
}

/* ----------------------------------------------------------- expert write */

static int expert_get(conv *c, int l, int e, int p, hf_weight *w, char *err, size_t errlen) {
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const pw[3] = {"w1", "w3", "w2"};   /* Moonshot: w1 gate, w3 up, w2 down */
    char base[256];
    snprintf(base, sizeof base, "%smodel.layers.%d.%s.experts.%d.%s", c->prefix, l, c->ex_blk[0] ? c->ex_blk : "mlp", e,
             c->ex_w123 ? pw[p] : pn[p]);
    int rc = hf_weight_get(c->st, &c->q, base, w, err, errlen);
    if (rc == DF_EFORMAT && !w->src)
        return df_set_errc(err, errlen, DF_EFORMAT, "routed expert tensor %s.weight missing from the checkpoint (layer %d, expert %d)", base, l, e);
    if (rc) return rc;
    if (w->ndim != 2) return df_set_errc(err, errlen, DF_EFORMAT, "routed expert tensor %s must be 2-D", base);
    return DF_OK;
}

/* Decide the expert encoding and extent layout from layer L0 expert 0. */
static int layout_experts(conv *c) {
    const df_config *g = &c->cfg;
    int first = -1;
    for (int l = 0; l < g->num_hidden_layers; l++)
        if (config_layer_is_moe(g, l)) { c->n_moe++; if (first < 0) first = l; }
    if (!c->n_moe) return DF_OK;
    static const char *const pn[3] = {"gate", "up", "down"};
    uint64_t cur = 0;
    for (int p = 0; p < 3; p++) {
        hf_weight w;
        int rc = expert_get(c, first, 0, p, &w, c->err, c->errlen);
        if (rc) return rc;
        /* experts run at the latent width for latent MoE (routed_expert_hidden_size), else at hidden_size */
        int64_t W = g->latent_dim > 0 ? g->latent_dim : g->hidden_size;
        int64_t er = p == 2 ? W : g->moe_intermediate_size, ec = p == 2 ? g->moe_intermediate_size : W;
        if (w.rows != er || w.cols != ec)
            return df_set_errc(c->err, c->errlen, DF_EFORMAT, "routed expert %s (%s) of layer %d: shape [%lld, %lld], the config needs [%lld, %lld]%s",
                               pn[p], w.src ? w.src->name : "?", first, (long long)w.rows, (long long)w.cols, (long long)er, (long long)ec,
                               g->latent_dim > 0 ? " (latent MoE: routed_expert_hidden_size)" : "");
        if (p == 0) c->ex_type = w.type;
        else if (w.type != c->ex_type)
            return df_set_errc(c->err, c->errlen, DF_EUNSUPPORTED, "routed experts mix encodings (%s and %s): not supported",
                               df_wtype_name(c->ex_type), df_wtype_name(w.type));
        native_expert_part *P = &c->parts[p];
        snprintf(P->name, sizeof P->name, "%s", pn[p]);
        P->rows = w.rows;
        P->cols = w.cols;
        P->offset = df_round_up(cur, ALIGN_ARRAY);
        P->bytes = hf_data_bytes(&w);
        cur = P->offset + P->bytes;
        P->scale_bytes = hf_scale_bytes(&w);
        if (P->scale_bytes) {
            P->scale_offset = df_round_up(cur, ALIGN_ARRAY);
            cur = P->scale_offset + P->scale_bytes;
        }
    }
    c->extent_bytes = cur;
    c->stride = df_round_up(cur, ALIGN_EXTENT);
    c->ex = calloc((size_t)c->n_moe, sizeof(ex_layer));
    if (!c->ex) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    uint64_t stripe = c->n_dirs == 1 ? c->stride : df_round_up((c->stride + (uint64_t)c->n_dirs - 1) / (uint64_t)c->n_dirs, ALIGN_EXTENT);
    uint64_t sizes[64];
    int unequal = 0;
    if (c->opts->stripe_weights && *c->opts->stripe_weights) {
        if (c->n_dirs < 2)
            return df_set_errc(c->err, c->errlen, DF_EINVAL, "--stripe-weights needs --expert-dirs with at least two directories");
        int r = native_stripe_plan(c->stride, c->n_dirs, c->opts->stripe_weights, sizes, &unequal, c->err, c->errlen);
        if (r) return r;
    }
    if (!unequal)
        for (int d = 0; d < c->n_dirs; d++) sizes[d] = stripe;
    else {
        stripe = 0;
        for (int d = 0; d < c->n_dirs; d++)
            if (sizes[d] > stripe) stripe = sizes[d];
    }
    int k = 0;
    for (int l = 0; l < g->num_hidden_layers; l++) {
        if (!config_layer_is_moe(g, l)) continue;
        ex_layer *L = &c->ex[k++];
        L->layer = l;
        L->n_files = c->n_dirs;
        L->stripe_bytes = stripe;
        L->unequal = unequal;
        memcpy(L->sizes, sizes, sizeof sizes);
        L->tmp = calloc((size_t)c->n_dirs, sizeof(char *));
        L->final = calloc((size_t)c->n_dirs, sizeof(char *));
        L->rel = calloc((size_t)c->n_dirs, sizeof(char *));
        L->xxh = calloc((size_t)g->n_routed_experts, sizeof(uint64_t));
        if (!L->tmp || !L->final || !L->rel || !L->xxh) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
        for (int d = 0; d < c->n_dirs; d++) {
            char fn[64], p[4200];
            if (c->n_dirs == 1) snprintf(fn, sizeof fn, "experts-L%03d.pack", l);
            else snprintf(fn, sizeof fn, "experts-L%03d.s%d.pack", l, d);
            snprintf(p, sizeof p, "%s/%s", c->dirs[d], fn);
            L->final[d] = strdup(p);
            snprintf(p, sizeof p, "%s/%s.tmp", c->dirs[d], fn);
            L->tmp[d] = strdup(p);
            L->rel[d] = strcmp(c->dirs[d], c->out_dir) ? strdup(L->final[d]) : strdup(fn);
            if (!L->final[d] || !L->tmp[d] || !L->rel[d]) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
        }
    }
    c->encodings_seen[c->ex_type] = 1;
    return DF_OK;
}

static int write_layer(conv *c, ex_layer *L, uint8_t *buf) {
    const df_config *g = &c->cfg;
    char msg[1024];
    int fds[64], rc = DF_OK;
    for (int d = 0; d < L->n_files; d++) fds[d] = -1;
    for (int d = 0; d < L->n_files; d++) {
        /* O_DIRECT when the filesystem allows it: extents are 4 KiB multiples at 4 KiB
         * offsets from a 4 KiB-aligned buffer, and the page cache is left alone */
        fds[d] = open(L->tmp[d], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
        if (fds[d] < 0 && errno == EINVAL) fds[d] = open(L->tmp[d], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fds[d] < 0) {
            snprintf(msg, sizeof msg, "cannot create %s: %s", L->tmp[d], strerror(errno));
            rc = set_rc(c, DF_EIO, msg);
            goto out;
        }
    }
    uint64_t bufsz = 0;
    for (int d = 0; d < L->n_files; d++) bufsz += L->sizes[d];
    for (int e = 0; e < g->n_routed_experts; e++) {
        memset(buf, 0, bufsz);
        for (int p = 0; p < 3; p++) {
            hf_weight w;
            int r = expert_get(c, L->layer, e, p, &w, msg, sizeof msg);
            const native_expert_part *P = &c->parts[p];
            if (!r && (w.type != c->ex_type || w.rows != P->rows || w.cols != P->cols)) {
                snprintf(msg, sizeof msg, "routed expert %d of layer %d (%s): %s [%lld, %lld] differs from expert 0 of the first MoE layer (%s [%lld, %lld])",
                         e, L->layer, P->name, df_wtype_name(w.type), (long long)w.rows, (long long)w.cols, df_wtype_name(c->ex_type),
                         (long long)P->rows, (long long)P->cols);
                r = DF_EUNSUPPORTED;
            }
            if (r) { rc = set_rc(c, r, msg); goto out; }
            hf_weight_copy(&w, buf + P->offset, P->scale_bytes ? buf + P->scale_offset : NULL);
        }
        L->xxh[e] = df_xxh64(buf, c->stride);
        if (c->opts->sparse_experts) { /* an all-zero extent stays a hole (opts.sparse_experts) */
            uint64_t z = 0;
            for (uint64_t i = 0; i < bufsz / 8 && !z; i++) z |= ((const uint64_t *)buf)[i];
            if (!z) {
                if ((rc = progress_add(c, c->stride))) goto out;
                continue;
            }
        }
        uint64_t begin = 0;
        for (int d = 0; d < L->n_files; d++) {
            uint64_t sz = L->sizes[d];
            int r = df_pwrite_all(fds[d], buf + begin, sz, (uint64_t)e * sz);
            if (r == -EINVAL) { /* O_DIRECT refused after all: continue buffered */
                int fl = fcntl(fds[d], F_GETFL);
                if (fl != -1 && (fl & O_DIRECT) && fcntl(fds[d], F_SETFL, fl & ~O_DIRECT) == 0)
                    r = df_pwrite_all(fds[d], buf + begin, sz, (uint64_t)e * sz);
            }
            begin += sz;
            if (r) {
                snprintf(msg, sizeof msg, "cannot write %s: %s", L->tmp[d], strerror(-r));
                rc = set_rc(c, DF_EIO, msg);
                goto out;
            }
        }
        if ((rc = progress_add(c, c->stride))) goto out;
    }
    for (int d = 0; d < L->n_files; d++)
        if (ftruncate(fds[d], (off_t)((uint64_t)g->n_routed_experts * L->sizes[d])) != 0 || fsync(fds[d]) != 0) {
            snprintf(msg, sizeof msg, "cannot fsync %s: %s", L->tmp[d], strerror(errno));
            rc = set_rc(c, DF_EIO, msg);
            goto out;
        }
out:
    for (int d = 0; d < L->n_files; d++)
        if (fds[d] >= 0 && close(fds[d]) != 0 && rc == DF_OK) {
            snprintf(msg, sizeof msg, "cannot close %s: %s", L->tmp[d], strerror(errno));
            rc = set_rc(c, DF_EIO, msg);
        }
    return rc;
}

static void *expert_worker(void *arg) {
    conv *c = arg;
    uint64_t bufsz = 0;
    for (int d = 0; c->n_moe && d < c->ex[0].n_files; d++) bufsz += c->ex[0].sizes[d];
    uint8_t *buf = df_aligned_alloc(ALIGN_EXTENT, bufsz);
    if (!buf) {
        set_rc(c, DF_ENOMEM, "out of memory (expert buffer)");
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int i = c->rc == DF_OK ? c->next_layer++ : c->n_moe;
        pthread_mutex_unlock(&c->mu);
        if (i >= c->n_moe) break;
        if (write_layer(c, &c->ex[i], buf)) break;
    }
    df_aligned_free(buf);
    return NULL;
}

static int write_experts(conv *c) {
    if (!c->n_moe) return DF_OK;
    int nt = c->opts->threads > 0 ? c->opts->threads : df_n_cpus();
    if (nt > c->n_moe) nt = c->n_moe;
    if (nt > 16) nt = 16;
    pthread_t th[16];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[i], NULL, expert_worker, c) != 0) break;
        started = i;
    }
    expert_worker(c);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    return c->rc;
}

/* --------------------------------------------------------------- manifest */

static cJSON *shape_json(int ndim, int64_t r, int64_t cc) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)r));
    if (ndim == 2) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)cc));
    return a;
}

static char *build_manifest(conv *c) {
    char hx[17];
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", "deltafin-native");
    cJSON_AddNumberToObject(m, "version", 1);
    char absd[4096];
    if (!realpath(c->hf_dir, absd)) snprintf(absd, sizeof absd, "%s", c->hf_dir);
    const char *b = strrchr(absd, '/');
    cJSON_AddStringToObject(m, "name", b && b[1] ? b + 1 : absd);
    cJSON *src = cJSON_AddObjectToObject(m, "source");
    cJSON_AddStringToObject(src, "dir", absd);
    cJSON *enc = cJSON_AddArrayToObject(src, "encodings");
    for (int i = 0; i < c->n_sp; i++) c->encodings_seen[c->sp[i].w.type] = 1;
    for (int t = 0; t < DF_W__COUNT; t++)
        if (c->encodings_seen[t]) cJSON_AddItemToArray(enc, cJSON_CreateString(df_wtype_name((df_wtype)t)));
    cJSON_AddStringToObject(m, "spine_mode", convert_spine_mode_name(c->opts->spine));
    int exact = c->opts->spine == DF_SPINE_INT8 ? 0 : c->opts->spine == DF_SPINE_BF16 ? c->spine_lossless : 1;
    cJSON_AddBoolToObject(m, "exact", exact);
    if (c->opts->spine == DF_SPINE_BF16) {
        cJSON_AddBoolToObject(m, "spine_bf16_lossless", c->spine_lossless);
        cJSON_AddNumberToObject(m, "spine_lossy_tensors", c->n_lossy);
    }
    cJSON_AddItemToObject(m, "config", cJSON_Duplicate(c->config_root, 1));
    {   /* informational (readers re-derive it from "config") */
        cJSON *ar = cJSON_AddObjectToObject(m, "architecture");
        const df_config *g = &c->cfg;
        cJSON_AddStringToObject(ar, "family", g->arch == DF_ARCH_KIMI_K3 ? "kimi_k3" : g->arch == DF_ARCH_KIMI_LINEAR ? "kimi_linear" : "deepseek");
        char desc[256], mix[DF_MAX_LAYERS + 1];
        config_describe(g, desc, sizeof desc);
        cJSON_AddStringToObject(ar, "description", desc);
        int nl = g->num_hidden_layers < DF_MAX_LAYERS ? g->num_hidden_layers : DF_MAX_LAYERS;
        for (int l = 0; l < nl; l++) mix[l] = g->mixer[l] == DF_MIXER_KDA ? 'K' : 'M';
        mix[nl] = 0;
        cJSON_AddStringToObject(ar, "mixers", mix);   /* one letter per layer: K = KDA, M = MLA */
    }
    cJSON *sp = cJSON_AddObjectToObject(m, "spine");
    cJSON_AddStringToObject(sp, "file", "spine.bin");
    cJSON_AddNumberToObject(sp, "bytes", (double)c->spine_bytes);
    df_xxh64_hex(c->spine_xxh, hx);
    cJSON_AddStringToObject(sp, "xxh64", hx);
    cJSON *ts = cJSON_AddArrayToObject(sp, "tensors");
    for (int i = 0; i < c->n_sp; i++) {
        const sp_item *it = &c->sp[i];
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", it->name);
        cJSON_AddStringToObject(t, "type", df_wtype_name(it->out_type));
        cJSON_AddItemToObject(t, "shape", shape_json(it->w.ndim, it->w.rows, it->w.cols));
        cJSON_AddNumberToObject(t, "offset", (double)it->off);
        cJSON_AddNumberToObject(t, "bytes", (double)it->bytes);
        if (it->sbytes) {
            cJSON_AddNumberToObject(t, "scale_offset", (double)it->soff);
            cJSON_AddNumberToObject(t, "scale_bytes", (double)it->sbytes);
        }
        cJSON_AddItemToArray(ts, t);
    }
    if (c->n_moe) {
        cJSON *ex = cJSON_AddObjectToObject(m, "experts");
        cJSON_AddStringToObject(ex, "type", df_wtype_name(c->ex_type));
        cJSON_AddNumberToObject(ex, "n_experts", c->cfg.n_routed_experts);
        cJSON_AddNumberToObject(ex, "moe_intermediate_size", c->cfg.moe_intermediate_size);
        cJSON_AddNumberToObject(ex, "hidden_size", c->cfg.hidden_size);
        if (c->cfg.latent_dim > 0) cJSON_AddNumberToObject(ex, "latent_dim", c->cfg.latent_dim);
        cJSON_AddNumberToObject(ex, "extent_bytes", (double)c->extent_bytes);
        cJSON_AddNumberToObject(ex, "stride", (double)c->stride);
        cJSON *parts = cJSON_AddArrayToObject(ex, "parts");
        for (int p = 0; p < 3; p++) {
            const native_expert_part *P = &c->parts[p];
            cJSON *pj = cJSON_CreateObject();
            cJSON_AddStringToObject(pj, "name", P->name);
            cJSON_AddItemToObject(pj, "shape", shape_json(2, P->rows, P->cols));
            cJSON_AddNumberToObject(pj, "offset", (double)P->offset);
            cJSON_AddNumberToObject(pj, "bytes", (double)P->bytes);
            if (P->scale_bytes) {
                cJSON_AddNumberToObject(pj, "scale_offset", (double)P->scale_offset);
                cJSON_AddNumberToObject(pj, "scale_bytes", (double)P->scale_bytes);
            }
            cJSON_AddItemToArray(parts, pj);
        }
        cJSON *layers = cJSON_AddArrayToObject(ex, "layers");
        for (int i = 0; i < c->n_moe; i++) {
            const ex_layer *L = &c->ex[i];
            cJSON *lj = cJSON_CreateObject();
            cJSON_AddNumberToObject(lj, "layer", L->layer);
            cJSON *files = cJSON_AddArrayToObject(lj, "files");
            for (int d = 0; d < L->n_files; d++) cJSON_AddItemToArray(files, cJSON_CreateString(L->rel[d]));
            cJSON_AddNumberToObject(lj, "stripe_bytes", (double)L->stripe_bytes);
            if (L->unequal) {
                cJSON *ss = cJSON_AddArrayToObject(lj, "stripe_sizes");
                for (int d = 0; d < L->n_files; d++) cJSON_AddItemToArray(ss, cJSON_CreateNumber((double)L->sizes[d]));
            }
            cJSON *xx = cJSON_AddArrayToObject(lj, "xxh64");
            for (int e = 0; e < c->cfg.n_routed_experts; e++) {
                df_xxh64_hex(L->xxh[e], hx);
                cJSON_AddItemToArray(xx, cJSON_CreateString(hx));
            }
            cJSON_AddItemToArray(layers, lj);
        }
    }
    char *txt = cJSON_Print(m);
    cJSON_Delete(m);
    return txt;
}

/* ----------------------------------------------------------------- driver */

/* copied beside the native files when the checkpoint has them: the tokenizer's, the generation config, and the model
 * card (README.md: `run` reads its trained_positions) */
static const char *const side_files[] = {"tokenizer.json", "tokenizer_config.json", "tiktoken.model", "chat_template.jinja",
                                        "special_tokens_map.json", "generation_config.json", "README.md"};

/* After a failure or cancellation: remove every file this conversion wrote, the *.tmp files
 * and those it already gave their final names (copied side files, renamed spine / packs:
 * without a manifest they are not a model), so that nothing of it is left behind. */
static void cleanup_tmp(conv *c, const char *spine_tmp, const int *side_copied, int spine_renamed, int packs_renamed) {
    char p[4200];
    if (spine_tmp) unlink(spine_tmp);
    if (spine_renamed) {
        snprintf(p, sizeof p, "%s/spine.bin", c->out_dir);
        unlink(p);
    }
    int k = 0;
    for (int i = 0; c->ex && i < c->n_moe; i++)
        for (int d = 0; d < c->ex[i].n_files; d++, k++) {
            if (c->ex[i].tmp && c->ex[i].tmp[d]) unlink(c->ex[i].tmp[d]);
            if (k < packs_renamed && c->ex[i].final && c->ex[i].final[d]) unlink(c->ex[i].final[d]);
        }
    for (size_t i = 0; i < sizeof side_files / sizeof side_files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s.tmp", c->out_dir, side_files[i]);
        unlink(p);
        if (side_copied[i]) {
            snprintf(p, sizeof p, "%s/%s", c->out_dir, side_files[i]);
            unlink(p);
        }
    }
    snprintf(p, sizeof p, "%s/manifest.json.tmp", c->out_dir);
    unlink(p);
}

static void free_conv(conv *c) {
    for (int i = 0; c->ex && i < c->n_moe; i++) {
        ex_layer *L = &c->ex[i];
        for (int d = 0; d < L->n_files; d++) {
            if (L->tmp) free(L->tmp[d]);
            if (L->final) free(L->final[d]);
            if (L->rel) free(L->rel[d]);
        }
        free(L->tmp);
        free(L->final);
        free(L->rel);
        free(L->xxh);
    }
    free(c->ex);
    free(c->sp);
    for (int d = 0; d < c->n_dirs; d++) free(c->dirs[d]);
    free(c->dirs);
    st_close(c->st);
    cJSON_Delete(c->config_root);
    pthread_mutex_destroy(&c->mu);
}

static int setup_dirs(conv *c, const char *expert_dirs) {
    int rc;
    if ((rc = df_mkdir_p(c->out_dir, c->err, c->errlen))) return rc;
    char tmp[4096];
    if (!realpath(c->out_dir, tmp)) return df_set_errc(c->err, c->errlen, DF_EIO, "%s: %s", c->out_dir, strerror(errno));
    if (strlen(tmp) >= sizeof c->out_dir) return df_set_errc(c->err, c->errlen, DF_EINVAL, "output path too long: %s", tmp);
    memcpy(c->out_dir, tmp, strlen(tmp) + 1);
    const char *s = expert_dirs && *expert_dirs ? expert_dirs : c->out_dir;
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    if (n > 64) return df_set_errc(c->err, c->errlen, DF_EINVAL, "--expert-dirs: %d directories (at most 64)", n);
    c->dirs = calloc((size_t)n, sizeof(char *));
    if (!c->dirs) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
    const char *p = s;
    for (int i = 0; i < n; i++) {
        const char *e = strchr(p, ',');
        size_t L = e ? (size_t)(e - p) : strlen(p);
        if (!L || L >= sizeof tmp) return df_set_errc(c->err, c->errlen, DF_EINVAL, "--expert-dirs \"%s\": empty or too long entry", s);
        char d[4096];
        memcpy(d, p, L);
        d[L] = 0;
        if ((rc = df_mkdir_p(d, c->err, c->errlen))) return rc;
        if (!realpath(d, tmp)) return df_set_errc(c->err, c->errlen, DF_EIO, "%s: %s", d, strerror(errno));
        c->dirs[i] = strdup(tmp);
        c->n_dirs++;
        if (!c->dirs[i]) return df_set_errc(c->err, c->errlen, DF_ENOMEM, "out of memory");
        p = e ? e + 1 : p + L;
    }
    return DF_OK;
}

int df_convert(const char *hf_dir, const char *out_dir, const df_convert_opts *opts_in, char *err, size_t errlen) {
    df_convert_opts defo;
    if (!opts_in) { df_convert_opts_default(&defo); opts_in = &defo; }
    if (!hf_dir || !out_dir) return df_set_errc(err, errlen, DF_EINVAL, "df_convert: hf_dir and out_dir are required");
    if (opts_in->spine < DF_SPINE_SOURCE || opts_in->spine > DF_SPINE_INT8)
        return df_set_errc(err, errlen, DF_EINVAL, "df_convert: unknown spine mode %d", (int)opts_in->spine);
    conv cv, *c = &cv;
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->hf_dir = hf_dir;
    c->opts = opts_in;
    c->err = err;
    c->errlen = errlen;
    snprintf(c->out_dir, sizeof c->out_dir, "%s", out_dir);
    char cfg_path[4200], spine_tmp[4200] = "", p[4200];
    char *txt = NULL, *man = NULL;
    int rc;
    int wrote = 0;
    int side_copied[sizeof side_files / sizeof side_files[0]] = {0}, spine_renamed = 0, packs_renamed = 0;

    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", hf_dir);
    if ((rc = df_read_file(cfg_path, &txt, NULL, err, errlen))) {
        if (!df_path_exists(cfg_path)) df_set_err(err, errlen, "%s has no config.json: not a Hugging Face checkpoint directory", hf_dir);
        goto done;
    }
    c->config_root = cJSON_Parse(txt);
    if (!c->config_root) { rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: invalid JSON", cfg_path); goto done; }
    if ((rc = config_parse_obj(c->config_root, &c->cfg, cfg_path, err, errlen))) goto done;
    if ((rc = hf_quant_parse(c->config_root, &c->q, cfg_path, err, errlen))) goto done;
    if ((rc = st_open_dir(&c->st, hf_dir, err, errlen))) goto done;
    if ((rc = classify(c))) goto done;
    if ((rc = setup_dirs(c, opts_in->expert_dirs))) goto done;
    wrote = 1;
    /* an old manifest must not describe the files we are about to replace */
    snprintf(p, sizeof p, "%s/manifest.json", c->out_dir);
    if (df_path_exists(p) && unlink(p) != 0) {
        rc = df_set_errc(err, errlen, DF_EIO, "cannot remove the old %s: %s", p, strerror(errno));
        goto done;
    }
    if ((rc = layout_experts(c))) goto done;
    layout_spine(c);
    c->total = c->spine_bytes + (uint64_t)c->n_moe * (uint64_t)c->cfg.n_routed_experts * c->stride;
    snprintf(spine_tmp, sizeof spine_tmp, "%s/spine.bin.tmp", c->out_dir);
    if ((rc = write_spine(c, spine_tmp))) goto done;
    if ((rc = write_experts(c))) goto done;
    /* the last point where the progress callback can cancel (SIGINT in `deltafin convert`):
     * nothing has its final name yet */
    if ((rc = progress_add(c, 0))) goto done;
    /* tokenizer files, generation config, model card (atomic copies) */
    for (size_t i = 0; i < sizeof side_files / sizeof side_files[0]; i++) {
        char s[4200];
        snprintf(s, sizeof s, "%s/%s", hf_dir, side_files[i]);
        if (!df_path_exists(s)) continue;
        snprintf(p, sizeof p, "%s/%s", c->out_dir, side_files[i]);
        if ((rc = df_copy_file_atomic(s, p, err, errlen))) goto done;
        side_copied[i] = 1;
    }
    /* every data file complete and fsynced: rename into place, then the manifest */
    snprintf(p, sizeof p, "%s/spine.bin", c->out_dir);
    if (rename(spine_tmp, p) != 0) { rc = df_set_errc(err, errlen, DF_EIO, "cannot rename %s: %s", spine_tmp, strerror(errno)); goto done; }
    spine_renamed = 1;
    for (int i = 0; i < c->n_moe; i++)
        for (int d = 0; d < c->ex[i].n_files; d++) {
            if (rename(c->ex[i].tmp[d], c->ex[i].final[d]) != 0) {
                rc = df_set_errc(err, errlen, DF_EIO, "cannot rename %s: %s", c->ex[i].tmp[d], strerror(errno));
                goto done;
            }
            packs_renamed++;
        }
    for (int d = 0; d < c->n_dirs; d++)
        if ((rc = df_fsync_dir_of(c->dirs[d], err, errlen))) goto done;
    if ((rc = df_fsync_dir_of(c->out_dir, err, errlen))) goto done;
    man = build_manifest(c);
    if (!man) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory (manifest)"); goto done; }
    snprintf(p, sizeof p, "%s/manifest.json", c->out_dir);
    rc = df_write_file_atomic(p, man, strlen(man), err, errlen);
    if (!rc && c->opts->progress) c->opts->progress(c->opts->progress_user, "bytes", c->total, c->total);
done:
    if (rc && wrote) cleanup_tmp(c, spine_tmp[0] ? spine_tmp : NULL, side_copied, spine_renamed, packs_renamed);
    free(txt);
    free(man);
    free_conv(c);
    return rc;
}
