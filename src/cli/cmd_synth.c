/*
 * cmd_synth.c — `deltafin synth OUT_DIR ...`: writes a large synthetic model
 * in the native layout (docs/native-format.md) with real expert shapes (Kimi
 * K2: hidden 7168, moe_intermediate 2048, MXFP4 by default), for I/O and
 * streaming work. Weights are random but valid (no NaN/Inf codes, magnitudes
 * ~ 1/sqrt(fan_in) so activations stay finite); the router is a real
 * sigmoid/noaux_tc router whose e_score_correction_bias is skewed so that
 * some experts are popular, as in trained models. Deterministic given --seed.
 * Every file is written as *.tmp, fsynced and renamed; manifest.json last.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "deltafin.h"
#include "model/weights.h"
#include "model/native.h"
#include "util/util.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

typedef struct {
    const char *out, *expert_dirs, *name, *stripe_weights;
    int hidden, moe_inter, inter, experts, layers, dense, top_k, vocab, heads, q_lora, kv_lora, shared;
    int nope, rope, vdim, n_group, topk_group;
    int arch;                         /* SYNTH_K2 (default) or SYNTH_K3 */
    int latent, kda_heads, kda_head_dim, kda_conv; /* kimi_k3: routed_expert_hidden_size, linear_attn_config */
    df_wtype enc, spine_enc;
    uint64_t seed, size;
    double skew;
    int quiet, force, dry_run;
} synth_opts;

enum { SYNTH_K2 = 0, SYNTH_K3 = 1 };

/* Width the routed experts run at: the latent width (K3: routed_expert_hidden_size), else hidden. */
static int expert_width(const synth_opts *o) { return o->arch == SYNTH_K3 ? o->latent : o->hidden; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ random data */

static inline uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t seed_of(uint64_t seed, const char *name, uint64_t salt) {
    uint64_t s = XXH64(name, strlen(name), seed) ^ (salt * 0x9E3779B97F4A7C15ull);
    return s ? s : 1;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* Fill n bytes of element data of a weight of type t, values ~ U(-a, a) scale-wise. */
static void fill_data(uint8_t *p, size_t n, df_wtype t, float a, uint64_t *s) {
    size_t i = 0;
    switch (t) {
    case DF_W_BF16: { /* 4 values per random word: 16-bit uniforms */
        uint16_t *q = (uint16_t *)p;
        size_t m = n / 2, k = 0;
        for (; k + 3 < m; k += 4) {
            uint64_t r = rng_next(s);
            for (int j = 0; j < 4; j++) q[k + j] = f32_to_bf16(((float)((r >> (16 * j)) & 0xFFFF) * (1.0f / 32768.0f) - 1.0f) * a);
        }
        for (; k < m; k++) q[k] = f32_to_bf16(((float)(rng_next(s) & 0xFFFF) * (1.0f / 32768.0f) - 1.0f) * a);
        break;
    }
    case DF_W_F32: {
        float *q = (float *)p;
        for (; i + 3 < n; i += 4) {
            uint64_t r = rng_next(s);
            q[i / 4] = ((float)((r >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f) * a;
        }
        break;
    }
    case DF_W_FP8_B128:
        /* e4m3fn with exponent field 4..11 (|v| in [2^-3, 2^5)): never NaN */
        for (; i < n; i += 8) {
            uint64_t r = rng_next(s);
            for (int j = 0; j < 8 && i + j < n; j++) {
                uint8_t b = (uint8_t)(r >> (8 * j));
                p[i + j] = (uint8_t)((b & 0x80) | ((4 + ((b >> 3) & 7)) << 3) | (b & 7));
            }
        }
        break;
    default: /* mxfp4 nibbles, int4 nibbles, int8: every bit pattern is a valid value */
        for (; i + 7 < n; i += 8) {
            uint64_t r = rng_next(s);
            memcpy(p + i, &r, 8);
        }
        for (; i < n; i++) p[i] = (uint8_t)rng_next(s);
    }
}

/* Scales so that |w| ~ a. */
static void fill_scale(uint8_t *p, size_t n, df_wtype t, float a, uint64_t *s) {
    switch (t) {
    case DF_W_MXFP4: { /* E8M0: mean |e2m1| ~ 2.6 -> 2^(e-127) ~ a / 2.6 */
        int e0 = 127 + (int)floor(log2(a / 2.6));
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(e0 - 1 + (int)(rng_next(s) % 3));
        break;
    }
    case DF_W_INT4_G32: { /* bf16 scale, |nibble-8| ~ 4 */
        uint16_t *q = (uint16_t *)p;
        for (size_t i = 0; i < n / 2; i++) q[i] = f32_to_bf16(a / 4 * (0.75f + 0.5f * (float)(rng_next(s) % 1024) / 1024));
        break;
    }
    case DF_W_FP8_B128: { /* f32 weight_scale_inv, |fp8| ~ 2 */
        float *q = (float *)p;
        for (size_t i = 0; i < n / 4; i++) q[i] = a / 2 * (0.75f + 0.5f * (float)(rng_next(s) % 1024) / 1024);
        break;
    }
    default:
        memset(p, 0, n);
    }
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    int fd;
    char path[2048], tmp[2100];
    uint64_t off;
    XXH64_state_t *h;
} out_file;

/* Every file this run creates, so that an interrupted or failed run removes all of them
 * (docs/cli.md): *.tmp while written, renamed only when every data file is complete. */
typedef struct {
    char tmp[2100], final[2048];
    int renamed;
} owned_file;
static owned_file *g_owned;
static int g_n_owned, g_cap_owned;

static int own(const char *tmp, const char *final) {
    if (g_n_owned == g_cap_owned) {
        int cap = g_cap_owned ? 2 * g_cap_owned : 64;
        owned_file *p = realloc(g_owned, (size_t)cap * sizeof *p);
        if (!p) return -1;
        g_owned = p;
        g_cap_owned = cap;
    }
    owned_file *o = &g_owned[g_n_owned++];
    snprintf(o->tmp, sizeof o->tmp, "%s", tmp);
    snprintf(o->final, sizeof o->final, "%s", final);
    o->renamed = 0;
    return 0;
}

/* Remove every file of this run (a *.tmp, or its final name once renamed); the number removed. */
static int remove_owned(void) {
    int n = 0;
    for (int i = g_n_owned - 1; i >= 0; i--) {
        if (unlink(g_owned[i].tmp) == 0) n++;
        if (g_owned[i].renamed && unlink(g_owned[i].final) == 0) n++;
    }
    return n;
}

static int of_open(out_file *f, const char *path, char *err, size_t errlen) {
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
    f->off = 0;
    f->h = NULL;
    if (own(f->tmp, f->path)) {
        f->fd = -1;
        snprintf(err, errlen, "out of memory");
        return DF_ENOMEM;
    }
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", f->tmp, strerror(errno));
        return DF_EIO;
    }
    f->h = XXH64_createState();
    XXH64_reset(f->h, 0);
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w; len -= (size_t)w; off += (uint64_t)w;
    }
    return 0;
}

static int of_write(out_file *f, const void *buf, size_t len, char *err, size_t errlen) {
    int sig = df_interrupted();
    if (sig) { /* SIGINT / SIGTERM: stop here; cmd_synth removes every file written */
        snprintf(err, errlen, "interrupted by %s", df_signal_name(sig));
        return DF_ECANCELLED;
    }
    int r = pwrite_all(f->fd, buf, len, f->off);
    if (r) {
        snprintf(err, errlen, "write %s: %s (disk full? check df -h)", f->tmp, strerror(-r));
        return DF_EIO;
    }
    XXH64_update(f->h, buf, len);
    f->off += len;
    return 0;
}

static int of_pad(out_file *f, uint64_t align, char *err, size_t errlen) {
    static const uint8_t zeros[4096];
    uint64_t pad = (align - f->off % align) % align;
    return pad ? of_write(f, zeros, pad, err, errlen) : 0;
}

/* fsync and close a complete file; it keeps its *.tmp name until publish_owned. */
static int of_close(out_file *f, char *err, size_t errlen) {
    int rc = 0;
    if (fsync(f->fd) || close(f->fd)) {
        snprintf(err, errlen, "fsync %s: %s", f->tmp, strerror(errno));
        rc = DF_EIO;
    }
    f->fd = -1;
    XXH64_freeState(f->h);
    f->h = NULL;
    return rc;
}

/* A file given up on (an error): closed; its *.tmp is removed with the others. */
static void of_abandon(out_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    XXH64_freeState(f->h);
    f->h = NULL;
}

/* Rename every complete *.tmp of this run to its final name (all data files are written). */
static int publish_owned(char *err, size_t errlen) {
    for (int i = 0; i < g_n_owned; i++) {
        if (g_owned[i].renamed) continue;
        if (rename(g_owned[i].tmp, g_owned[i].final)) {
            snprintf(err, errlen, "rename %s: %s", g_owned[i].tmp, strerror(errno));
            return DF_EIO;
        }
        g_owned[i].renamed = 1;
    }
    return 0;
}

/* close + rename at once (manifest.json, written last). */
static int of_commit(out_file *f, char *err, size_t errlen) {
    int rc = of_close(f, err, errlen);
    if (!rc) rc = publish_owned(err, errlen);
    return rc;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

/* mkdir -p; 0 or -1 with errno */
static int mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static void hex16(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

typedef struct {
    double t0, t_last;
    uint64_t done, total;
    int quiet;
    int open; /* a progress line without its newline is on stderr */
} progress;

static void prog(progress *p, uint64_t add) {
    p->done += add;
    double t = now_s();
    if (p->quiet || ((t - p->t_last < 1.0 || !cli_stderr_tty()) && p->done < p->total)) return;
    p->t_last = t;
    fprintf(stderr, "%ssynth: %.2f / %.2f GB (%.0f%%), %.2f GB/s   ", cli_cr(), p->done / 1e9, p->total / 1e9,
            100.0 * p->done / (p->total ? p->total : 1), p->done / 1e9 / (t - p->t0 + 1e-9));
    p->open = 1;
    if (p->done >= p->total) { fputc('\n', stderr); p->open = 0; }
}

/* One spine tensor: writes data (+scale) 64-aligned; adds it to the manifest. */
static int spine_tensor(out_file *f, cJSON *arr, const synth_opts *o, const char *name, df_wtype t, int64_t rows,
                        int64_t cols, int is_vec, float fill_const, progress *pg, uint8_t *buf, size_t bufcap, char *err,
                        size_t errlen) {
    int rc = of_pad(f, 64, err, errlen);
    if (rc) return rc;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddStringToObject(j, "type", df_wtype_name(t));
    cJSON *shape = cJSON_AddArrayToObject(j, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)rows));
    if (!is_vec) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)cols));
    uint64_t dbytes = df_weight_data_bytes(t, rows, cols), sbytes = df_weight_scale_bytes(t, rows, cols);
    cJSON_AddNumberToObject(j, "offset", (double)f->off);
    cJSON_AddNumberToObject(j, "bytes", (double)dbytes);
    uint64_t s = seed_of(o->seed, name, 0);
    float a = 1.0f / sqrtf((float)cols);
    for (uint64_t done = 0; done < dbytes;) {
        size_t n = dbytes - done < bufcap ? (size_t)(dbytes - done) : bufcap;
        if (is_vec) {
            float *q = (float *)buf; /* f32 vectors */
            for (size_t i = 0; i < n / 4; i++) q[i] = fill_const;
        } else {
            fill_data(buf, n, t, t == DF_W_BF16 || t == DF_W_F32 ? a * 1.7f : a, &s);
        }
        if ((rc = of_write(f, buf, n, err, errlen))) { cJSON_Delete(j); return rc; }
        done += n;
        prog(pg, n);
    }
    if (sbytes) {
        if ((rc = of_pad(f, 64, err, errlen))) { cJSON_Delete(j); return rc; }
        cJSON_AddNumberToObject(j, "scale_offset", (double)f->off);
        cJSON_AddNumberToObject(j, "scale_bytes", (double)sbytes);
        uint8_t *sb = malloc(sbytes);
        if (!sb) { cJSON_Delete(j); snprintf(err, errlen, "out of memory"); return DF_ENOMEM; }
        fill_scale(sb, sbytes, t, a * 1.7f, &s);
        rc = of_write(f, sb, sbytes, err, errlen);
        free(sb);
        if (rc) { cJSON_Delete(j); return rc; }
    }
    cJSON_AddItemToArray(arr, j);
    return 0;
}

/* Router bias: skewed popularity (a few experts are chosen much more often). */
static int spine_router_bias(out_file *f, cJSON *arr, const synth_opts *o, int layer, char *err, size_t errlen) {
    int rc = of_pad(f, 64, err, errlen);
    if (rc) return rc;
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", layer);
    float *b = malloc(sizeof(float) * o->experts);
    uint64_t s = seed_of(o->seed, name, 1);
    for (int e = 0; e < o->experts; e++) {
        /* Box-Muller normal */
        double u1 = ((rng_next(&s) >> 11) + 1.0) / 9007199254740993.0, u2 = (rng_next(&s) >> 11) / 9007199254740992.0;
        double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        b[e] = (float)(o->skew * 0.05 * z);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddStringToObject(j, "type", "f32");
    cJSON *shape = cJSON_AddArrayToObject(j, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(o->experts));
    cJSON_AddNumberToObject(j, "offset", (double)f->off);
    cJSON_AddNumberToObject(j, "bytes", 4.0 * o->experts);
    rc = of_write(f, b, sizeof(float) * o->experts, err, errlen);
    free(b);
    cJSON_AddItemToArray(arr, j);
    return rc;
}

static cJSON *make_config(const synth_opts *o) {
    cJSON *c = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV3ForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "kimi_k2");
    cJSON_AddNumberToObject(c, "vocab_size", o->vocab);
    cJSON_AddNumberToObject(c, "hidden_size", o->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", o->inter);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", o->moe_inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", o->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", o->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", o->heads);
    cJSON_AddNumberToObject(c, "n_routed_experts", o->experts);
    cJSON_AddNumberToObject(c, "n_shared_experts", o->shared);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", o->top_k);
    cJSON_AddNumberToObject(c, "n_group", o->n_group);
    cJSON_AddNumberToObject(c, "topk_group", o->topk_group);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", o->dense);
    cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
    cJSON_AddTrueToObject(c, "norm_topk_prob");
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 2.827);
    if (o->q_lora > 0) cJSON_AddNumberToObject(c, "q_lora_rank", o->q_lora);
    else cJSON_AddNullToObject(c, "q_lora_rank");
    cJSON_AddNumberToObject(c, "kv_lora_rank", o->kv_lora);
    cJSON_AddNumberToObject(c, "qk_nope_head_dim", o->nope);
    cJSON_AddNumberToObject(c, "qk_rope_head_dim", o->rope);
    cJSON_AddNumberToObject(c, "v_head_dim", o->vdim);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "max_position_embeddings", 131072);
    cJSON_AddNumberToObject(c, "rope_theta", 50000.0);
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(rs, "type", "yarn");
    cJSON_AddNumberToObject(rs, "factor", 32.0);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 4096);
    cJSON_AddNumberToObject(rs, "beta_fast", 1.0);
    cJSON_AddNumberToObject(rs, "beta_slow", 1.0);
    cJSON_AddNumberToObject(rs, "mscale", 1.0);
    cJSON_AddNumberToObject(rs, "mscale_all_dim", 1.0);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddFalseToObject(c, "tie_word_embeddings");
    cJSON_AddStringToObject(c, "scoring_func", "sigmoid");
    cJSON_AddStringToObject(c, "topk_method", "noaux_tc");
    cJSON_AddFalseToObject(c, "attention_bias");
    return c;
}

/* ------------------------------------------------------------ kimi_k3 shapes */

/* Kimi K3's attention pattern restricted to o->layers: 1-based layers 4, 8, ... and the last are MLA, the rest KDA. */
static int k3_is_mla(const synth_opts *o, int l) { return (l + 1) % 4 == 0 || l + 1 == o->layers; }

/* config.json of the multimodal wrapper (model_type kimi_k3) with the text model under text_config, as released
 * (shared/notes/kimi-k3.md), with num_hidden_layers and the layer lists cut to the synthetic depth. */
static cJSON *make_config_k3(const synth_opts *o) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "architectures"), cJSON_CreateString("KimiK3ForConditionalGeneration"));
    cJSON_AddStringToObject(c, "model_type", "kimi_k3");
    cJSON *t = cJSON_AddObjectToObject(c, "text_config");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(t, "architectures"), cJSON_CreateString("KimiLinearForCausalLM"));
    cJSON_AddStringToObject(t, "model_type", "kimi_linear");
    cJSON_AddNumberToObject(t, "vocab_size", o->vocab);
    cJSON_AddNumberToObject(t, "hidden_size", o->hidden);
    cJSON_AddNumberToObject(t, "intermediate_size", o->inter);
    cJSON_AddNumberToObject(t, "moe_intermediate_size", o->moe_inter);
    cJSON_AddNumberToObject(t, "routed_expert_hidden_size", o->latent);
    cJSON_AddTrueToObject(t, "latent_moe_use_norm");
    cJSON_AddNumberToObject(t, "num_hidden_layers", o->layers);
    cJSON_AddNumberToObject(t, "num_attention_heads", o->heads);
    cJSON_AddNumberToObject(t, "num_key_value_heads", o->heads);
    if (o->q_lora > 0) cJSON_AddNumberToObject(t, "q_lora_rank", o->q_lora);
    else cJSON_AddNullToObject(t, "q_lora_rank");
    cJSON_AddNumberToObject(t, "kv_lora_rank", o->kv_lora);
    cJSON_AddNumberToObject(t, "qk_nope_head_dim", o->nope);
    cJSON_AddNumberToObject(t, "qk_rope_head_dim", o->rope);
    cJSON_AddNumberToObject(t, "v_head_dim", o->vdim);
    cJSON_AddTrueToObject(t, "mla_use_nope");
    cJSON_AddTrueToObject(t, "mla_use_output_gate");
    cJSON *la = cJSON_AddObjectToObject(t, "linear_attn_config");
    cJSON *full = cJSON_AddArrayToObject(la, "full_attn_layers"), *kda = cJSON_AddArrayToObject(la, "kda_layers");
    for (int l = 0; l < o->layers; l++) cJSON_AddItemToArray(k3_is_mla(o, l) ? full : kda, cJSON_CreateNumber(l + 1));
    cJSON_AddNumberToObject(la, "num_heads", o->kda_heads);
    cJSON_AddNumberToObject(la, "head_dim", o->kda_head_dim);
    cJSON_AddNumberToObject(la, "short_conv_kernel_size", o->kda_conv);
    cJSON_AddNumberToObject(la, "gate_lower_bound", -5.0);
    cJSON_AddTrueToObject(la, "use_full_rank_gate");
    cJSON_AddNumberToObject(t, "num_experts", o->experts);
    cJSON_AddNumberToObject(t, "num_experts_per_token", o->top_k);
    cJSON_AddNumberToObject(t, "num_shared_experts", o->shared);
    cJSON_AddNumberToObject(t, "first_k_dense_replace", o->dense);
    cJSON_AddNumberToObject(t, "moe_layer_freq", 1);
    cJSON_AddStringToObject(t, "moe_router_activation_func", "sigmoid");
    cJSON_AddTrueToObject(t, "moe_renormalize");
    cJSON_AddNumberToObject(t, "routed_scaling_factor", 1.0);
    cJSON_AddStringToObject(t, "topk_method", "noaux_tc");
    cJSON_AddTrueToObject(t, "use_grouped_topk");
    cJSON_AddNumberToObject(t, "num_expert_group", o->n_group);
    cJSON_AddNumberToObject(t, "topk_group", o->topk_group);
    cJSON_AddStringToObject(t, "hidden_act", "situ");
    cJSON_AddNumberToObject(t, "activation_situ_beta", 4.0);
    cJSON_AddNumberToObject(t, "activation_situ_linear_beta", 25.0);
    cJSON_AddNumberToObject(t, "attn_res_block_size", 12);
    cJSON_AddNumberToObject(t, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(t, "max_position_embeddings", 1048576);
    /* the released ids are vocab-256, vocab-254, vocab-1 (163584, 163586, 163839): kept inside a smaller --vocab */
    int V = o->vocab;
    cJSON_AddNumberToObject(t, "bos_token_id", V > 256 ? V - 256 : 0);
    cJSON_AddNumberToObject(t, "eos_token_id", V > 256 ? V - 254 : (V > 1 ? 1 : 0));
    cJSON_AddNumberToObject(t, "pad_token_id", V - 1);
    cJSON_AddFalseToObject(t, "tie_word_embeddings");
    return c;
}

/* Where K3 spine tensors go: written (spine_tensor) or only counted (bytes per layer, for the size report). */
typedef struct {
    out_file *f;                  /* NULL: count only */
    cJSON *arr;
    progress *pg;
    uint8_t *buf;
    size_t bufcap;
    char *err;
    size_t errlen;
    uint64_t off;                 /* counting: the offset spine.bin would reach */
    int layer;                    /* -1: model-level tensors */
    uint64_t *layer_bytes;        /* counting: [layers + 1], the last entry = model-level tensors (embed, norm, head) */
} k3_sink;

static int k3_put(k3_sink *s, const synth_opts *o, const char *name, df_wtype t, int64_t rows, int64_t cols, int is_vec,
                  float fill) {
    if (s->f) return spine_tensor(s->f, s->arr, o, name, t, rows, cols, is_vec, fill, s->pg, s->buf, s->bufcap, s->err, s->errlen);
    uint64_t before = s->off, sb = df_weight_scale_bytes(t, rows, cols);
    s->off = (s->off + 63) / 64 * 64 + df_weight_data_bytes(t, rows, cols);
    if (sb) s->off = (s->off + 63) / 64 * 64 + sb;
    if (s->layer_bytes) s->layer_bytes[s->layer < 0 ? o->layers : s->layer] += s->off - before;
    return 0;
}

static int k3_router_bias(k3_sink *s, const synth_opts *o, int l) {
    if (s->f) return spine_router_bias(s->f, s->arr, o, l, s->err, s->errlen);
    uint64_t before = s->off;
    s->off = (s->off + 63) / 64 * 64 + 4ull * o->experts;
    if (s->layer_bytes) s->layer_bytes[l] += s->off - before;
    return 0;
}

/* Every K3 spine tensor, in file order, with the canonical native names of the loader (src/model/spine.c):
 * model.layers.N. + MLA self_attn.{q_a_proj,q_a_layernorm,q_b_proj,kv_a_proj_with_mqa,kv_a_layernorm,kv_b_proj,
 * o_proj,g_proj}; KDA self_attn.{q,k,v}_proj, {q,k,v}_conv1d [D, W] f32, f_a_proj, f_b_proj, b_proj, g_proj,
 * A_log [heads] f32, dt_bias [D] f32, o_norm [head_dim], o_proj; AttnRes {self_attention,mlp}_res_{norm,proj};
 * MoE mlp.gate (+ e_score_correction_bias), mlp.shared_experts.*, mlp.routed_expert_{down_proj,norm,up_proj};
 * dense mlp.{gate,up,down}_proj; model.embed_tokens, model.norm, model.output_attn_res_{norm,proj}, lm_head. */
static int k3_spine(k3_sink *s, const synth_opts *o) {
    const int64_t H = o->hidden, V = o->vocab, NH = o->heads, qk = o->nope + o->rope;
    const int64_t KH = o->kda_heads, K = o->kda_head_dim, D = KH * K, W = o->kda_conv, LT = o->latent;
    const df_wtype T = o->spine_enc;
    char nm[200];
    int rc;
#define K3W(sfx, r, c) if ((rc = k3_put(s, o, N(sfx), T, r, c, 0, 0))) return rc
#define K3V(sfx, n, v) if ((rc = k3_put(s, o, N(sfx), DF_W_F32, n, 1, 1, v))) return rc
#define N(x) (snprintf(nm, sizeof nm, "%s", x), nm)
    s->layer = -1;
    if ((rc = k3_put(s, o, "model.embed_tokens.weight", DF_W_BF16, V, H, 0, 0))) return rc;
#undef N
    for (int l = 0; l < o->layers; l++) {
        s->layer = l;
#define N(x) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, x), nm)
        K3V("input_layernorm.weight", H, 1.0f);
        K3V("post_attention_layernorm.weight", H, 1.0f);
        K3V("self_attention_res_norm.weight", H, 1.0f);
        K3V("self_attention_res_proj.weight", H, 0.0f);
        K3V("mlp_res_norm.weight", H, 1.0f);
        K3V("mlp_res_proj.weight", H, 0.0f);
        if (k3_is_mla(o, l)) {
            if (o->q_lora > 0) {
                K3W("self_attn.q_a_proj.weight", o->q_lora, H);
                K3V("self_attn.q_a_layernorm.weight", o->q_lora, 1.0f);
                K3W("self_attn.q_b_proj.weight", NH * qk, o->q_lora);
            } else {
                K3W("self_attn.q_proj.weight", NH * qk, H);
            }
            K3W("self_attn.kv_a_proj_with_mqa.weight", o->kv_lora + o->rope, H);
            K3V("self_attn.kv_a_layernorm.weight", o->kv_lora, 1.0f);
            K3W("self_attn.kv_b_proj.weight", NH * (o->nope + o->vdim), o->kv_lora);
            K3W("self_attn.o_proj.weight", H, NH * o->vdim);
            K3W("self_attn.g_proj.weight", NH * o->vdim, H);
        } else {
            K3W("self_attn.q_proj.weight", D, H);
            K3W("self_attn.k_proj.weight", D, H);
            K3W("self_attn.v_proj.weight", D, H);
            if ((rc = k3_put(s, o, N("self_attn.q_conv1d.weight"), DF_W_F32, D, W, 0, 0))) return rc;
            if ((rc = k3_put(s, o, N("self_attn.k_conv1d.weight"), DF_W_F32, D, W, 0, 0))) return rc;
            if ((rc = k3_put(s, o, N("self_attn.v_conv1d.weight"), DF_W_F32, D, W, 0, 0))) return rc;
            K3W("self_attn.f_a_proj.weight", K, H);
            K3W("self_attn.f_b_proj.weight", D, K);
            K3W("self_attn.b_proj.weight", KH, H);
            K3W("self_attn.g_proj.weight", D, H);
            K3V("self_attn.A_log", KH, 0.0f);
            K3V("self_attn.dt_bias", D, 0.0f);
            K3V("self_attn.o_norm.weight", K, 1.0f);
            K3W("self_attn.o_proj.weight", H, D);
        }
        if (l < o->dense) {
            K3W("mlp.gate_proj.weight", o->inter, H);
            K3W("mlp.up_proj.weight", o->inter, H);
            K3W("mlp.down_proj.weight", H, o->inter);
        } else {
            if ((rc = k3_put(s, o, N("mlp.gate.weight"), DF_W_BF16, o->experts, H, 0, 0))) return rc;
            if ((rc = k3_router_bias(s, o, l))) return rc;
            if (o->shared > 0) {
                int64_t I = (int64_t)o->moe_inter * o->shared;
                K3W("mlp.shared_experts.gate_proj.weight", I, H);
                K3W("mlp.shared_experts.up_proj.weight", I, H);
                K3W("mlp.shared_experts.down_proj.weight", H, I);
            }
            K3W("mlp.routed_expert_down_proj.weight", LT, H);
            K3V("mlp.routed_expert_norm.weight", LT, 1.0f);
            K3W("mlp.routed_expert_up_proj.weight", H, LT);
        }
#undef N
    }
    s->layer = -1;
#define N(x) (snprintf(nm, sizeof nm, "%s", x), nm)
    K3V("model.norm.weight", H, 1.0f);
    K3V("model.output_attn_res_norm.weight", H, 1.0f);
    K3V("model.output_attn_res_proj.weight", H, 0.0f);
    if ((rc = k3_put(s, o, "lm_head.weight", DF_W_BF16, V, H, 0, 0))) return rc;
#undef N
#undef K3W
#undef K3V
    return 0;
}

/* spine.bin bytes of a K3 synth; per layer (and model-level in [layers]) into layer_bytes when not NULL. */
static uint64_t k3_spine_bytes(const synth_opts *o, uint64_t *layer_bytes) {
    k3_sink s = {0};
    s.layer_bytes = layer_bytes;
    k3_spine(&s, o);
    return (s.off + 63) / 64 * 64;
}

static int write_spine_k3(const synth_opts *o, cJSON *manifest, progress *pg, uint8_t *buf, size_t bufcap, char *err,
                          size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/spine.bin", o->out);
    out_file f;
    int rc = of_open(&f, path, err, errlen);
    if (rc) return rc;
    cJSON *sp = cJSON_AddObjectToObject(manifest, "spine");
    cJSON *arr = cJSON_CreateArray();
    k3_sink s = {&f, arr, pg, buf, bufcap, err, errlen, 0, -1, NULL};
    if ((rc = k3_spine(&s, o)) || (rc = of_pad(&f, 64, err, errlen))) {
        cJSON_Delete(arr);
        of_abandon(&f);
        return rc;
    }
    uint64_t h = XXH64_digest(f.h), bytes = f.off;
    if ((rc = of_close(&f, err, errlen))) { cJSON_Delete(arr); return rc; }
    char hx[17];
    hex16(h, hx);
    cJSON_AddStringToObject(sp, "file", "spine.bin");
    cJSON_AddNumberToObject(sp, "bytes", (double)bytes);
    cJSON_AddStringToObject(sp, "xxh64", hx);
    cJSON_AddItemToObject(sp, "tensors", arr);
    return 0;
}

static int write_spine(const synth_opts *o, cJSON *manifest, progress *pg, uint8_t *buf, size_t bufcap, char *err,
                       size_t errlen) {
    if (o->arch == SYNTH_K3) return write_spine_k3(o, manifest, pg, buf, bufcap, err, errlen);
    char path[2048], nm[200];
    snprintf(path, sizeof path, "%s/spine.bin", o->out);
    out_file f;
    int rc = of_open(&f, path, err, errlen);
    if (rc) return rc;
    cJSON *sp = cJSON_AddObjectToObject(manifest, "spine");
    cJSON *arr = cJSON_CreateArray();
    const int64_t H = o->hidden, V = o->vocab, NH = o->heads, qk = o->nope + o->rope;
    const df_wtype T = o->spine_enc;
#define TW(name, r, c) if ((rc = spine_tensor(&f, arr, o, name, T, r, c, 0, 0, pg, buf, bufcap, err, errlen))) goto fail
#define TV(name, n) if ((rc = spine_tensor(&f, arr, o, name, DF_W_F32, n, 1, 1, 1.0f, pg, buf, bufcap, err, errlen))) goto fail
    if ((rc = spine_tensor(&f, arr, o, "model.embed_tokens.weight", DF_W_BF16, V, H, 0, 0, pg, buf, bufcap, err, errlen)))
        goto fail;
    for (int l = 0; l < o->layers; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        TV(N("input_layernorm.weight"), H);
        TV(N("post_attention_layernorm.weight"), H);
        if (o->q_lora > 0) {
            TW(N("self_attn.q_a_proj.weight"), o->q_lora, H);
            TV(N("self_attn.q_a_layernorm.weight"), o->q_lora);
            TW(N("self_attn.q_b_proj.weight"), NH * qk, o->q_lora);
        } else {
            TW(N("self_attn.q_proj.weight"), NH * qk, H);
        }
        TW(N("self_attn.kv_a_proj_with_mqa.weight"), o->kv_lora + o->rope, H);
        TV(N("self_attn.kv_a_layernorm.weight"), o->kv_lora);
        TW(N("self_attn.kv_b_proj.weight"), NH * (o->nope + o->vdim), o->kv_lora);
        TW(N("self_attn.o_proj.weight"), H, NH * o->vdim);
        if (l < o->dense) {
            TW(N("mlp.gate_proj.weight"), o->inter, H);
            TW(N("mlp.up_proj.weight"), o->inter, H);
            TW(N("mlp.down_proj.weight"), H, o->inter);
        } else {
            if ((rc = spine_tensor(&f, arr, o, N("mlp.gate.weight"), DF_W_BF16, o->experts, H, 0, 0, pg, buf, bufcap,
                                   err, errlen)))
                goto fail;
            if ((rc = spine_router_bias(&f, arr, o, l, err, errlen))) goto fail;
            if (o->shared > 0) {
                int64_t I = (int64_t)o->moe_inter * o->shared;
                TW(N("mlp.shared_experts.gate_proj.weight"), I, H);
                TW(N("mlp.shared_experts.up_proj.weight"), I, H);
                TW(N("mlp.shared_experts.down_proj.weight"), H, I);
            }
        }
#undef N
    }
    TV("model.norm.weight", H);
    if ((rc = spine_tensor(&f, arr, o, "lm_head.weight", DF_W_BF16, V, H, 0, 0, pg, buf, bufcap, err, errlen))) goto fail;
#undef TW
#undef TV
    if ((rc = of_pad(&f, 64, err, errlen))) goto fail;
    uint64_t h = XXH64_digest(f.h), bytes = f.off;
    if ((rc = of_close(&f, err, errlen))) { cJSON_Delete(arr); return rc; }
    char hx[17];
    hex16(h, hx);
    cJSON_AddStringToObject(sp, "file", "spine.bin");
    cJSON_AddNumberToObject(sp, "bytes", (double)bytes);
    cJSON_AddStringToObject(sp, "xxh64", hx);
    cJSON_AddItemToObject(sp, "tensors", arr);
    return 0;
fail:
    cJSON_Delete(arr);
    of_abandon(&f);
    return rc;
}

/* Bytes of the spine the options produce (for progress and the size estimate). */
static uint64_t spine_estimate(const synth_opts *o) {
    if (o->arch == SYNTH_K3) return k3_spine_bytes(o, NULL);
    const uint64_t H = o->hidden, NH = o->heads, qk = o->nope + o->rope;
    uint64_t e = (uint64_t)df_weight_data_bytes(o->spine_enc, 1, 1);
    uint64_t attn = (o->q_lora > 0 ? o->q_lora * H + NH * qk * o->q_lora : NH * qk * H) +
                    (o->kv_lora + o->rope) * H + NH * (o->nope + o->vdim) * o->kv_lora + H * NH * o->vdim;
    uint64_t dense = 3ull * o->inter * H, moe = 3ull * o->moe_inter * o->shared * H;
    uint64_t per = attn * e;
    return 2ull * 2 * o->vocab * H + o->dense * (per + dense * e) + (o->layers - o->dense) * (per + moe * e + o->experts * H * 2);
}

static int write_experts(const synth_opts *o, cJSON *manifest, progress *pg, char *err, size_t errlen) {
    const int64_t H = expert_width(o), I = o->moe_inter; /* K3: experts run at the latent width */
    const df_wtype T = o->enc;
    cJSON *ex = cJSON_AddObjectToObject(manifest, "experts");
    cJSON_AddStringToObject(ex, "type", df_wtype_name(T));
    cJSON_AddNumberToObject(ex, "n_experts", o->experts);
    cJSON_AddNumberToObject(ex, "moe_intermediate_size", o->moe_inter);
    cJSON_AddNumberToObject(ex, "hidden_size", o->hidden);
    if (o->arch == SYNTH_K3) cJSON_AddNumberToObject(ex, "latent_dim", o->latent); /* parts are [I, latent], [latent, I] */
    const char *pn[3] = {"gate", "up", "down"};
    int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    uint64_t off[3], soff[3], db[3], sb[3], pos = 0;
    for (int p = 0; p < 3; p++) {
        db[p] = df_weight_data_bytes(T, rows[p], cols[p]);
        sb[p] = df_weight_scale_bytes(T, rows[p], cols[p]);
        off[p] = pos;
        pos = (pos + db[p] + 63) / 64 * 64;
        soff[p] = pos;
        pos = (pos + sb[p] + 63) / 64 * 64;
    }
    uint64_t extent = soff[2] + sb[2];
    if (!sb[2]) extent = off[2] + db[2];
    uint64_t stride = (extent + 4095) / 4096 * 4096;
    cJSON_AddNumberToObject(ex, "extent_bytes", (double)extent);
    cJSON_AddNumberToObject(ex, "stride", (double)stride);
    cJSON *parts = cJSON_AddArrayToObject(ex, "parts");
    for (int p = 0; p < 3; p++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", pn[p]);
        cJSON *sh = cJSON_AddArrayToObject(j, "shape");
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)rows[p]));
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)cols[p]));
        cJSON_AddNumberToObject(j, "offset", (double)off[p]);
        cJSON_AddNumberToObject(j, "bytes", (double)db[p]);
        if (sb[p]) {
            cJSON_AddNumberToObject(j, "scale_offset", (double)soff[p]);
            cJSON_AddNumberToObject(j, "scale_bytes", (double)sb[p]);
        }
        cJSON_AddItemToArray(parts, j);
    }
    /* pack directories */
    char *dirs[16];
    int nd = 0;
    if (o->expert_dirs && *o->expert_dirs) {
        char *cp = strdup(o->expert_dirs), *save = NULL;
        for (char *t = strtok_r(cp, ",", &save); t && nd < 16; t = strtok_r(NULL, ",", &save)) dirs[nd++] = strdup(t);
        free(cp);
    } else {
        dirs[nd++] = strdup(o->out);
    }
    for (int k = 0; k < nd; k++) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "%s", dirs[k]);
        if (mkdir_p(cmd)) {
            snprintf(err, errlen, "cannot create expert directory %s: %s", dirs[k], strerror(errno));
            return DF_EIO;
        }
        char *rp = realpath(dirs[k], NULL);
        if (rp) { free(dirs[k]); dirs[k] = rp; }
    }
    uint64_t stripe = nd == 1 ? stride : ((stride / nd + 4095) / 4096 * 4096);
    if (nd > 1 && stride % nd == 0 && (stride / nd) % 4096 == 0) stripe = stride / nd;
    /* stripe k of an expert: sizes[k] bytes at begin[k] of the extent (equal unless --stripe-weights) */
    uint64_t sizes[16], begin[17];
    int unequal = 0;
    if (o->stripe_weights && *o->stripe_weights) {
        int r = native_stripe_plan(stride, nd, o->stripe_weights, sizes, &unequal, err, errlen);
        if (r) return r;
    }
    if (!unequal) for (int k = 0; k < nd; k++) sizes[k] = stripe;
    else {
        stripe = 0;
        for (int k = 0; k < nd; k++) if (sizes[k] > stripe) stripe = sizes[k];
    }
    begin[0] = 0;
    for (int k = 0; k < nd; k++) begin[k + 1] = begin[k] + sizes[k];
    uint8_t *ext = NULL;
    if (posix_memalign((void **)&ext, 4096, begin[nd])) {
        snprintf(err, errlen, "out of memory for one expert (%llu bytes)", (unsigned long long)begin[nd]);
        return DF_ENOMEM;
    }
    memset(ext, 0, begin[nd]);
    cJSON *layers = cJSON_AddArrayToObject(ex, "layers");
    int rc = 0;
    for (int l = o->dense; l < o->layers && !rc; l++) {
        out_file f[16];
        int opened = 0;
        for (int k = 0; k < nd; k++) {
            char p[2100];
            snprintf(p, sizeof p, "%s/experts-L%03d.pack", dirs[k], l);
            if ((rc = of_open(&f[k], p, err, errlen))) break;
            opened++;
        }
        cJSON *lj = cJSON_CreateObject();
        cJSON_AddNumberToObject(lj, "layer", l);
        cJSON *files = cJSON_AddArrayToObject(lj, "files");
        cJSON *xx = cJSON_AddArrayToObject(lj, "xxh64");
        for (int e = 0; e < o->experts && !rc; e++) {
            char name[64];
            snprintf(name, sizeof name, "L%d.E%d", l, e);
            uint64_t s = seed_of(o->seed, name, 2);
            for (int p = 0; p < 3; p++) {
                float a = 1.0f / sqrtf((float)cols[p]);
                fill_data(ext + off[p], db[p], T, T == DF_W_BF16 ? a * 1.7f : a, &s);
                if (sb[p]) fill_scale(ext + soff[p], sb[p], T, a * 1.7f, &s);
            }
            char hx[17];
            hex16(XXH64(ext, stride, 0), hx);
            cJSON_AddItemToArray(xx, cJSON_CreateString(hx));
            for (int k = 0; k < nd && !rc; k++) rc = of_write(&f[k], ext + begin[k], sizes[k], err, errlen);
            prog(pg, stride);
        }
        for (int k = 0; k < opened; k++) {
            if (rc) { of_abandon(&f[k]); continue; }
            rc = of_close(&f[k], err, errlen); /* renamed with the others once every file is complete */
            char rel[2100];
            if (!strcmp(dirs[k], o->out)) snprintf(rel, sizeof rel, "experts-L%03d.pack", l);
            else snprintf(rel, sizeof rel, "%s", f[k].path);
            cJSON_AddItemToArray(files, cJSON_CreateString(rel));
        }
        cJSON_AddNumberToObject(lj, "stripe_bytes", (double)stripe);
        if (unequal) {
            cJSON *ss = cJSON_AddArrayToObject(lj, "stripe_sizes");
            for (int k = 0; k < nd; k++) cJSON_AddItemToArray(ss, cJSON_CreateNumber((double)sizes[k]));
        }
        cJSON_AddItemToArray(layers, lj);
    }
    for (int k = 0; k < nd; k++) free(dirs[k]);
    free(ext);
    return rc;
}

/* kimi_k3: what will be written, layer by layer, to out: stdout for --dry-run (the plan is its output), else stderr
 * before writing (beside the progress). */
static void k3_report(FILE *out, const synth_opts *o, uint64_t per_layer) {
    const int64_t W = o->latent, I = o->moe_inter;
    const df_wtype T = o->enc;
    uint64_t d2 = df_weight_data_bytes(T, I, W), s2 = df_weight_scale_bytes(T, I, W);
    uint64_t d3 = df_weight_data_bytes(T, W, I), s3 = df_weight_scale_bytes(T, W, I);
    uint64_t stride = per_layer / (uint64_t)o->experts;
    uint64_t *lb = calloc((size_t)o->layers + 1, sizeof(uint64_t));
    if (!lb) return;
    uint64_t spine = k3_spine_bytes(o, lb);
    int n_mla = 0;
    for (int l = 0; l < o->layers; l++) n_mla += k3_is_mla(o, l);
    fprintf(out, "synth: %s: kimi_k3, %d layers (%d dense, %d MoE; %d KDA, %d MLA), %d experts x %s, top-%d, %d shared\n",
            o->out, o->layers, o->dense, o->layers - o->dense, o->layers - n_mla, n_mla, o->experts, df_wtype_name(T), o->top_k,
            o->shared);
    fprintf(out, "synth: expert: gate, up [%lld, %lld] + down [%lld, %lld] %s = data %llu + scales %llu = %llu bytes "
                 "(%.2f MB), stride %llu\n",
            (long long)I, (long long)W, (long long)W, (long long)I, df_wtype_name(T), (unsigned long long)(2 * d2 + d3),
            (unsigned long long)(2 * s2 + s3), (unsigned long long)(2 * (d2 + s2) + d3 + s3), (2 * (d2 + s2) + d3 + s3) / 1e6,
            (unsigned long long)stride);
    fprintf(out, "synth: %5s %5s %5s %16s %16s\n", "layer", "mixer", "ffn", "spine bytes", "expert bytes");
    for (int l = 0; l < o->layers; l++)
        fprintf(out, "synth: %5d %5s %5s %16llu %16llu\n", l, k3_is_mla(o, l) ? "MLA" : "KDA", l < o->dense ? "dense" : "MoE",
                (unsigned long long)lb[l], (unsigned long long)(l < o->dense ? 0 : per_layer));
    fprintf(out, "synth: %5s %5s %5s %16llu %16d   (embed_tokens, norm, output AttnRes, lm_head)\n", "model", "-", "-",
            (unsigned long long)lb[o->layers], 0);
    uint64_t experts = per_layer * (uint64_t)(o->layers - o->dense);
    fprintf(out, "synth: total: spine %llu bytes (%.2f GB, %s matrices) + experts %llu bytes (%.2f GB) = %.2f GB\n",
            (unsigned long long)spine, spine / 1e9, df_wtype_name(o->spine_enc), (unsigned long long)experts, experts / 1e9,
            (spine + experts) / 1e9);
    free(lb);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin synth OUT_DIR [options]\n"
            "Writes a synthetic model in the native layout (random but valid weights, real router) for I/O work.\n"
            "With OUT_DIR alone it writes the default model: Kimi K2 shapes (the values in parentheses below),\n"
            "8 layers = 1 dense + 7 MoE x 64 experts of [2048 x 7168] mxfp4, top-8, vocab 32000: about 14.43 GB\n"
            "(experts 10.48 GB, spine 3.95 GB). --dry-run prints the size of any choice; a model larger than the\n"
            "free space is refused before anything is written. A small test model (10 MB): --hidden 512\n"
            "--moe-inter 256 --experts 8 --layers 3 --vocab 512 --heads 4 --inter 512 --q-lora 64 --kv-lora 64\n"
            "  --arch A          kimi_k2 (default: the defaults below) or kimi_k3: K3's shapes (hidden 7168, 96 heads,\n"
            "                    MLA without RoPE + output gate, KDA 96x128, latent MoE 896 experts x [3072, 3584],\n"
            "                    top-16, 2 shared, dense layer 0 of 33792, vocab 163840, AttnRes) with fewer layers\n"
            "                    (--layers, default 2, or --size); 1-based layers 4, 8, ... and the last are MLA, the\n"
            "                    rest KDA; prints the spine and expert bytes of every layer. Every size option below\n"
            "                    still overrides (a small test model, 26 MB: --layers 4 --experts 8 --top-k 4\n"
            "                    --hidden 512 --latent 256 --moe-inter 256 --inter 512 --heads 4 --vocab 512)\n"
            "  --latent N        kimi_k3: routed_expert_hidden_size, the experts' width (3584)\n"
            "  --kda-heads N --kda-head-dim N  kimi_k3: linear_attn_config num_heads (= --heads), head_dim (128)\n"
            "  --hidden N        hidden size (7168)            --moe-inter N   expert width (2048)\n"
            "  --experts N       routed experts per layer (64) --top-k N       experts per token (8)\n"
            "  --layers N        total layers (8)              --dense N       leading dense layers (1)\n"
            "  --size SIZE       choose --layers so the experts take about SIZE (e.g. 40G)\n"
            "  --encoding E      expert encoding: mxfp4 (default), bf16, int4_g32, fp8_b128, f32\n"
            "  --spine-encoding E  bf16 (default) or fp8_b128 for spine matrices\n"
            "  --vocab N (32000) --heads N (64) --q-lora N (1536, 0 = plain q_proj) --kv-lora N (512)\n"
            "  --inter N         dense MLP width (18432)       --shared N      shared experts (1)\n"
            "  --n-group N --topk-group N (1, 1)               --skew X        router popularity skew (1.0)\n"
            "  --nope N --rope N --v-dim N  qk_nope_head_dim, qk_rope_head_dim (even), v_head_dim (128, 64, 128)\n"
            "  --expert-dirs D1,D2  stripe the packs over these directories\n"
            "  --stripe-weights W1,W2  stripe k's size proportional to W_k (GB/s per drive); default equal\n"
            "  --seed N (1) --name NAME --quiet\n"
            "  --dry-run         print what would be written (sizes; kimi_k3: per layer) on stdout and write nothing\n"
            "  --force           OUT_DIR may be non-empty: delete the deltafin model files in it (and old packs in\n"
            "                    --expert-dirs) first; without it OUT_DIR must be new or empty\n"
            "Every file is written as *.tmp and renamed when all are complete; manifest.json last. SIGINT or\n"
            "SIGTERM stops the run, removes every file it wrote and exits with 128 + the signal number. A killed\n"
            "run leaves *.tmp files and no manifest.json: the next run into that directory removes them only when\n"
            "the directory holds nothing but deltafin's model files; when it holds anything else, that run refuses\n"
            "(it names the other entry) and asks for --force, which deletes the deltafin files first.\n");
}

/* Strict integer value of a size flag: an integer in [lo, hi], else a message naming the flag and value. */
static int int_opt(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!*v || *end || errno || n < lo || n > hi) {
        fprintf(stderr, "deltafin synth: %s \"%s\": expected an integer in [%ld, %ld]\n", flag, v, lo, hi);
        return 2;
    }
    *out = (int)n;
    return 0;
}

/* The filesystems of OUT_DIR and the pack directories have room for the model (estimate): 0, or 1 after a message. */
static int check_space(const synth_opts *o, uint64_t spine, uint64_t experts) {
    struct { dev_t dev; const char *dir; uint64_t need, avail; } fs[17];
    int nfs = 0, nd = 0;
    const char *dirs[16];
    char *cp = o->expert_dirs && *o->expert_dirs ? strdup(o->expert_dirs) : NULL, *save = NULL;
    for (char *t = cp ? strtok_r(cp, ",", &save) : NULL; t && nd < 16; t = strtok_r(NULL, ",", &save)) dirs[nd++] = t;
    int rc = 0;
    for (int k = -1; k < (nd ? nd : 1) && !rc; k++) {
        const char *d = k < 0 ? o->out : nd ? dirs[k] : o->out;
        uint64_t need = k < 0 ? spine : experts / (uint64_t)(nd ? nd : 1);
        struct stat st;
        struct statvfs vf;
        if (stat(d, &st) || statvfs(d, &vf)) continue; /* not known: the write reports any error */
        int i = 0;
        while (i < nfs && fs[i].dev != st.st_dev) i++;
        if (i == nfs) {
            fs[nfs].dev = st.st_dev;
            fs[nfs].dir = d;
            fs[nfs].need = 0;
            fs[nfs].avail = (uint64_t)vf.f_bavail * (uint64_t)vf.f_frsize;
            nfs++;
        }
        fs[i].need += need;
    }
    for (int i = 0; i < nfs && !rc; i++)
        if (fs[i].need > fs[i].avail) {
            fprintf(stderr,
                    "deltafin synth: the model needs about %.2f GB on the filesystem of %s, which has %.2f GB free; "
                    "choose a smaller model (--layers, --experts, --size; --dry-run prints the size) or another "
                    "directory\n",
                    fs[i].need / 1e9, fs[i].dir, fs[i].avail / 1e9);
            rc = 1;
        }
    free(cp);
    return rc;
}

/* After a failed or interrupted run: remove every file it wrote and the directories it created
 * (when empty). Returns the number of files removed. */
static int remove_partial(const synth_opts *o, const char *out_arg, int out_existed, const int *dir_existed, int *out_removed) {
    int n = remove_owned();
    if (out_removed) *out_removed = 0;
    if (o->expert_dirs && *o->expert_dirs) {
        char *cp = strdup(o->expert_dirs), *save = NULL;
        int k = 0;
        for (char *t = cp ? strtok_r(cp, ",", &save) : NULL; t && k < 16; t = strtok_r(NULL, ",", &save), k++)
            if (!dir_existed[k]) rmdir(t);
        free(cp);
    }
    if (!out_existed && rmdir(out_arg) == 0 && out_removed) *out_removed = 1;
    return n;
}

/* The smallest --size value (binary units, as cli_parse_size reads them) that is at least `bytes`: "1.40G",
 * "23M" or "5K", rounded up, into out[cap]; *unit gets what its suffix means ("1G = 2^30 bytes"). */
static void size_value_at_least(char *out, size_t cap, uint64_t bytes, const char **unit) {
    const uint64_t G = 1ull << 30, M = 1ull << 20, K = 1ull << 10;
    if (bytes >= G) {
        uint64_t cents = (bytes / G) * 100 + ((bytes % G) * 100 + G - 1) / G; /* ceil(bytes * 100 / G), no overflow */
        snprintf(out, cap, "%llu.%02lluG", (unsigned long long)(cents / 100), (unsigned long long)(cents % 100));
        *unit = "1G = 2^30 bytes";
    } else if (bytes >= M) {
        snprintf(out, cap, "%lluM", (unsigned long long)((bytes + M - 1) / M));
        *unit = "1M = 2^20 bytes";
    } else {
        snprintf(out, cap, "%lluK", (unsigned long long)((bytes + K - 1) / K));
        *unit = "1K = 1024 bytes";
    }
}

/* bytes in decimal units for messages: "3.70 GB", "1.67 MB", "12.3 kB", "512 B", into out[32]. */
static const char *dec_size(char out[32], uint64_t bytes) {
    if (bytes >= 1000000000ull) snprintf(out, 32, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1000000ull) snprintf(out, 32, "%.2f MB", bytes / 1e6);
    else if (bytes >= 1000ull) snprintf(out, 32, "%.1f kB", bytes / 1e3);
    else snprintf(out, 32, "%llu B", (unsigned long long)bytes);
    return out;
}

/* --size SIZE (size_arg as given) is well below the routed experts of one MoE layer (per_layer bytes), the least
 * synth can write with these shapes: the refusal on stderr, naming SIZE, the smallest model (its total and its
 * experts' bytes) and the --size that writes it. */
static void synth_size_too_small(const synth_opts *o, const char *size_arg, uint64_t per_layer) {
    synth_opts min = *o;
    min.layers = o->dense + 1;
    const uint64_t spine = spine_estimate(&min);
    char dense[32] = "", want[32], total_s[32], experts_s[32];
    const char *unit;
    if (o->dense) snprintf(dense, sizeof dense, "%d dense + ", o->dense);
    size_value_at_least(want, sizeof want, per_layer, &unit);
    fprintf(stderr,
            "deltafin synth: --size %s: the smallest model with these shapes is about %s: %s1 MoE layer, whose %d "
            "expert%s x %s [%d x %d] alone take %s (%llu bytes), well over --size %s (it counts the routed experts); "
            "pass --size %s or more (%s), or choose smaller experts (--experts, --moe-inter, --encoding; "
            "--dry-run prints the size)\n",
            size_arg, dec_size(total_s, spine + per_layer), dense, o->experts, o->experts == 1 ? "" : "s",
            df_wtype_name(o->enc), o->moe_inter, expert_width(o), dec_size(experts_s, per_layer), (unsigned long long)per_layer,
            size_arg, want, unit);
}

int cmd_synth(int argc, char **argv) {
    synth_opts o = {0};
    o.hidden = 7168; o.moe_inter = 2048; o.inter = 18432; o.experts = 64; o.layers = 8; o.dense = 1; o.top_k = 8;
    o.vocab = 32000; o.heads = 64; o.q_lora = 1536; o.kv_lora = 512; o.shared = 1; o.nope = 128; o.rope = 64;
    o.vdim = 128; o.n_group = 1; o.topk_group = 1; o.enc = DF_W_MXFP4; o.spine_enc = DF_W_BF16; o.seed = 1;
    o.skew = 1.0;
    /* --arch first: it sets the defaults that the other options override */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        if (strcmp(argv[i], "--arch")) continue;
        if (i + 1 >= argc) { fprintf(stderr, "deltafin synth: --arch needs a value (kimi_k2 or kimi_k3)\n"); return 2; }
        if (!strcmp(argv[i + 1], "kimi_k3")) o.arch = SYNTH_K3;
        else if (!strcmp(argv[i + 1], "kimi_k2")) o.arch = SYNTH_K2;
        else { fprintf(stderr, "deltafin synth: --arch \"%s\" is not supported (kimi_k2, kimi_k3)\n", argv[i + 1]); return 2; }
    }
    if (o.arch == SYNTH_K3) { /* the released K3 text config (shared/notes/kimi-k3.md), 2 layers */
        o.hidden = 7168; o.moe_inter = 3072; o.latent = 3584; o.inter = 33792; o.experts = 896; o.layers = 2; o.dense = 1;
        o.top_k = 16; o.vocab = 163840; o.heads = 96; o.q_lora = 1536; o.kv_lora = 512; o.shared = 2; o.nope = 128;
        o.rope = 64; o.vdim = 128; o.n_group = 1; o.topk_group = 1; o.kda_head_dim = 128; o.kda_conv = 4;
    }
    const char *k3_flag = NULL, *k3_val = NULL; /* a kimi_k3-only option that was given */
    const char *size_arg = NULL;
    int layers_given = 0;
    const struct { const char *flag; int *field; long lo, hi; } ints[] = {
        {"--hidden", &o.hidden, 1, 1 << 20},      {"--moe-inter", &o.moe_inter, 1, 1 << 20},
        {"--inter", &o.inter, 1, 1 << 22},        {"--experts", &o.experts, 1, 1 << 16},
        {"--layers", &o.layers, 1, DF_MAX_LAYERS}, {"--dense", &o.dense, 0, DF_MAX_LAYERS},
        {"--top-k", &o.top_k, 1, 1 << 16},        {"--vocab", &o.vocab, 1, 1 << 24},
        {"--heads", &o.heads, 1, 4096},           {"--q-lora", &o.q_lora, 0, 1 << 20},
        {"--kv-lora", &o.kv_lora, 1, 1 << 20},    {"--shared", &o.shared, 0, 64},
        {"--n-group", &o.n_group, 1, 1 << 16},    {"--topk-group", &o.topk_group, 1, 1 << 16},
        {"--nope", &o.nope, 0, 4096},             {"--rope", &o.rope, 2, 4096},
        {"--v-dim", &o.vdim, 1, 4096},            {"--latent", &o.latent, 1, 1 << 20},
        {"--kda-heads", &o.kda_heads, 1, 4096},   {"--kda-head-dim", &o.kda_head_dim, 1, 4096},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1]) { /* OUT_DIR */
            if (o.out) { fprintf(stderr, "deltafin synth: unexpected argument \"%s\" (OUT_DIR is already %s)\n", a, o.out); return 2; }
            o.out = a;
            continue;
        }
        if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
        if (!strcmp(a, "--force")) { o.force = 1; continue; }
        if (!strcmp(a, "--dry-run")) { o.dry_run = 1; continue; }
        int known = !strcmp(a, "--arch") || !strcmp(a, "--encoding") || !strcmp(a, "--spine-encoding") ||
                    !strcmp(a, "--size") || !strcmp(a, "--expert-dirs") || !strcmp(a, "--stripe-weights") ||
                    !strcmp(a, "--seed") || !strcmp(a, "--skew") || !strcmp(a, "--name");
        int ix = -1;
        for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
            if (!strcmp(a, ints[k].flag)) ix = (int)k;
        if (!known && ix < 0) {
            static const char *const opts[] = {
                "--help", "--quiet", "--force", "--dry-run", "--arch", "--encoding", "--spine-encoding", "--size", "--expert-dirs",
                "--stripe-weights", "--seed", "--skew", "--name", "--hidden", "--moe-inter", "--inter", "--experts", "--layers",
                "--dense", "--top-k", "--vocab", "--heads", "--q-lora", "--kv-lora", "--shared", "--n-group", "--topk-group",
                "--nope", "--rope", "--v-dim", "--latent", "--kda-heads", "--kda-head-dim", NULL};
            return cli_unknown_option("synth", a, opts, NULL);
        }
        if (i + 1 >= argc) { fprintf(stderr, "deltafin synth: %s needs a value\n", a); return 2; }
        static const char *const values[] = {
            "--arch", "--encoding", "--spine-encoding", "--size", "--expert-dirs", "--stripe-weights", "--seed", "--skew", "--name",
            "--hidden", "--moe-inter", "--inter", "--experts", "--layers", "--dense", "--top-k", "--vocab", "--heads", "--q-lora",
            "--kv-lora", "--shared", "--n-group", "--topk-group", "--nope", "--rope", "--v-dim", "--latent", "--kda-heads",
            "--kda-head-dim", NULL};
        if (cli_repeated_at("synth", argc, argv, i, values, NULL)) return 2;
        const char *v = argv[++i];
        if (v[0] == '-' && v[1] == '-') {
            fprintf(stderr, "deltafin synth: %s needs a value (found the option %s after it)\n", a, v);
            return 2;
        }
        if (ix >= 0) {
            if (int_opt(a, v, ints[ix].lo, ints[ix].hi, ints[ix].field)) return 2;
            if (!strcmp(a, "--latent") || !strcmp(a, "--kda-heads") || !strcmp(a, "--kda-head-dim")) k3_flag = a, k3_val = v;
            if (!strcmp(a, "--layers")) layers_given = 1;
            if (!strcmp(a, "--rope") && o.rope % 2) {
                fprintf(stderr, "deltafin synth: --rope \"%s\": expected an even number (rotary pairs)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--arch")) {
            /* read above */
        } else if (!strcmp(a, "--encoding") || !strcmp(a, "--spine-encoding")) {
            int t = df_wtype_from_name(v);
            int spine = a[2] == 's';
            if (t < 0 || t == DF_W_INT8_ROW || t == DF_W_F16 || (spine && t != DF_W_BF16 && t != DF_W_FP8_B128)) {
                fprintf(stderr, "deltafin synth: %s \"%s\" is not supported (%s)\n", a, v,
                        spine ? "bf16 or fp8_b128" : "mxfp4, bf16, int4_g32, fp8_b128, f32");
                return 2;
            }
            if (spine) o.spine_enc = (df_wtype)t; else o.enc = (df_wtype)t;
        } else if (!strcmp(a, "--size")) {
            size_arg = v;
            if (cli_parse_size(v, &o.size) || !o.size) {
                fprintf(stderr, "deltafin synth: --size \"%s\": expected a positive size such as 40G or 512M\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_seed("synth", a, v, &o.seed)) return 2;
        } else if (!strcmp(a, "--skew")) {
            char *end;
            double x = strtod(v, &end);
            if (!*v || *end || !isfinite(x) || x < 0 || x > 100) {
                fprintf(stderr, "deltafin synth: --skew \"%s\": expected a number in [0, 100]\n", v);
                return 2;
            }
            o.skew = x;
        } else if (!*v) {
            fprintf(stderr, "deltafin synth: %s \"\": expected a %s\n", a, !strcmp(a, "--name") ? "name" : "list");
            return 2;
        } else if (!strcmp(a, "--expert-dirs")) o.expert_dirs = v;
        else if (!strcmp(a, "--stripe-weights")) o.stripe_weights = v;
        else o.name = v; /* --name */
    }
    if (!o.out) {
        fprintf(stderr, "deltafin synth: OUT_DIR missing\n\n");
        usage(stderr);
        return 2;
    }
    if (!o.out[0]) {
        fprintf(stderr, "deltafin synth: OUT_DIR \"\": expected a directory (usage: deltafin synth OUT_DIR [options])\n");
        return 2;
    }
    if (k3_flag && o.arch != SYNTH_K3) {
        fprintf(stderr, "deltafin synth: %s %s: the kimi_k3 options (--latent, --kda-heads, --kda-head-dim) need --arch kimi_k3\n",
                k3_flag, k3_val);
        return 2;
    }
    if (o.arch == SYNTH_K3 && !o.kda_heads) o.kda_heads = o.heads;
    /* consistency: each message names the flags and values involved */
    const int quant = o.enc == DF_W_MXFP4 || o.enc == DF_W_INT4_G32;
    const char *wflag = o.arch == SYNTH_K3 ? "--latent" : "--hidden";
    if (o.top_k > o.experts) {
        fprintf(stderr, "deltafin synth: --top-k %d is more than --experts %d\n", o.top_k, o.experts);
        return 2;
    }
    if (o.experts % o.n_group) {
        fprintf(stderr, "deltafin synth: --experts %d is not a multiple of --n-group %d\n", o.experts, o.n_group);
        return 2;
    }
    if (o.topk_group > o.n_group) {
        fprintf(stderr, "deltafin synth: --topk-group %d is more than --n-group %d\n", o.topk_group, o.n_group);
        return 2;
    }
    if (quant && expert_width(&o) % 32) {
        fprintf(stderr, "deltafin synth: %s %d (the experts' input width) must be a multiple of 32 for --encoding %s\n", wflag,
                expert_width(&o), df_wtype_name(o.enc));
        return 2;
    }
    if (quant && o.moe_inter % 32) {
        fprintf(stderr, "deltafin synth: --moe-inter %d must be a multiple of 32 for --encoding %s\n", o.moe_inter,
                df_wtype_name(o.enc));
        return 2;
    }
    uint64_t per_layer;
    {
        int64_t H = expert_width(&o), I = o.moe_inter;
        uint64_t x = 0;
        int64_t r[3] = {I, I, H}, c[3] = {H, H, I};
        for (int p = 0; p < 3; p++)
            x += (df_weight_data_bytes(o.enc, r[p], c[p]) + 63) / 64 * 64 + (df_weight_scale_bytes(o.enc, r[p], c[p]) + 63) / 64 * 64;
        per_layer = (x + 4095) / 4096 * 4096 * (uint64_t)o.experts;
    }
    if (o.size) {
        if (layers_given) {
            fprintf(stderr, "deltafin synth: --size %s and --layers %d both choose the number of layers; give one\n",
                    size_arg, o.layers);
            return 2;
        }
        uint64_t moe = (o.size + per_layer / 2) / per_layer;
        if (moe < 1) moe = 1;
        if (moe == 1 && per_layer > o.size + o.size / 10) { /* even one MoE layer is well over SIZE: refuse, write nothing */
            synth_size_too_small(&o, size_arg, per_layer);
            return 2;
        }
        if (moe + (uint64_t)o.dense > DF_MAX_LAYERS) {
            fprintf(stderr, "deltafin synth: --size %s needs %llu layers, more than %d (use larger experts: --experts, --moe-inter)\n",
                    size_arg, (unsigned long long)(moe + (uint64_t)o.dense), DF_MAX_LAYERS);
            return 2;
        }
        o.layers = o.dense + (int)moe;
    }
    if (o.dense >= o.layers) {
        fprintf(stderr, "deltafin synth: --dense %d leaves no MoE layer with --layers %d\n", o.dense, o.layers);
        return 2;
    }
    if (o.stripe_weights) {
        /* check the list (count = --expert-dirs entries) before anything is written */
        int nd = 1;
        for (const char *q = o.expert_dirs ? o.expert_dirs : ""; *q; q++) nd += *q == ',';
        uint64_t sz[64];
        int uneq;
        char e2[256];
        if (!o.expert_dirs || nd < 2 || nd > 16) {
            fprintf(stderr, "deltafin synth: --stripe-weights \"%s\" needs --expert-dirs with 2..16 directories (%s%s%s)\n",
                    o.stripe_weights, o.expert_dirs ? "given: \"" : "none given", o.expert_dirs ? o.expert_dirs : "",
                    o.expert_dirs ? "\"" : "");
            return 2;
        }
        if (native_stripe_plan(1 << 24, nd, o.stripe_weights, sz, &uneq, e2, sizeof e2)) {
            fprintf(stderr, "deltafin synth: %s\n", e2);
            return 2;
        }
    }
    if (cli_check_expert_dirs("synth", o.expert_dirs)) return 2;
    const uint64_t spine_bytes = spine_estimate(&o), expert_bytes = per_layer * (uint64_t)(o.layers - o.dense);
    if (o.dry_run) { /* the plan only: nothing is written; the plan is the output (stdout), the note stays on stderr */
        uint64_t tot = spine_bytes + expert_bytes;
        if (o.arch == SYNTH_K3) k3_report(stdout, &o, per_layer);
        else
            printf("synth: %s: %d layers (%d dense), %d experts x %s [%d x %d], top-%d, about %.2f GB (experts %.2f GB, spine %.2f GB)\n",
                   o.out, o.layers, o.dense, o.experts, df_wtype_name(o.enc), o.moe_inter, o.hidden, o.top_k, tot / 1e9,
                   expert_bytes / 1e9, spine_bytes / 1e9);
        fflush(stdout); /* in a 2>&1 log the note follows the plan */
        fprintf(stderr, "synth: --dry-run: nothing written\n");
        return 0;
    }
    /* directories that do not exist yet are removed again if the run fails or is interrupted */
    const char *out_arg = o.out;
    int out_existed = df_path_exists(o.out), dir_existed[16] = {0};
    if (o.expert_dirs) {
        char *cp = strdup(o.expert_dirs), *save = NULL;
        int k = 0;
        for (char *t = cp ? strtok_r(cp, ",", &save) : NULL; t && k < 16; t = strtok_r(NULL, ",", &save), k++)
            dir_existed[k] = df_path_exists(t);
        free(cp);
    }
    df_interrupt_install(); /* before the directories are locked: a signal from here on cleans up */
    int crc = cli_check_out_dirs("synth", "OUT_DIR", o.out, o.expert_dirs, o.force, o.quiet);
    if (!crc) crc = check_space(&o, spine_bytes, expert_bytes);
    if (crc) {
        remove_partial(&o, out_arg, out_existed, dir_existed, NULL);
        return crc;
    }
    char *rp = realpath(o.out, NULL); /* freed before returning */
    if (rp) o.out = rp;
    char mpath[2048];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", o.out);
    unlink(mpath); /* an old manifest must not describe half-written files */
    uint64_t total = spine_bytes + expert_bytes;
    if (!o.quiet && o.arch == SYNTH_K3) k3_report(stderr, &o, per_layer);
    else if (!o.quiet)
        fprintf(stderr, "synth: %s: %d layers (%d dense), %d experts x %s [%d x %d], top-%d, about %.2f GB (experts %.2f GB, spine %.2f GB)\n",
                o.out, o.layers, o.dense, o.experts, df_wtype_name(o.enc), o.moe_inter, o.hidden, o.top_k, total / 1e9,
                expert_bytes / 1e9, spine_bytes / 1e9);
    double t_start = now_s();
    progress pg = {t_start, t_start, 0, total, o.quiet, 0};
    char err[4608] = "";
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", "deltafin-native");
    cJSON_AddNumberToObject(m, "version", 1);
    char defname[200];
    if (o.arch == SYNTH_K3) snprintf(defname, sizeof defname, "synth-kimi_k3-%s-%dx%d", df_wtype_name(o.enc), o.layers, o.experts);
    else snprintf(defname, sizeof defname, "synth-%s-%dx%d", df_wtype_name(o.enc), o.layers, o.experts);
    cJSON_AddStringToObject(m, "name", o.name ? o.name : defname);
    cJSON *src = cJSON_AddObjectToObject(m, "source");
    cJSON_AddStringToObject(src, "dir", "synthetic");
    cJSON *encs = cJSON_AddArrayToObject(src, "encodings");
    cJSON_AddItemToArray(encs, cJSON_CreateString(df_wtype_name(o.spine_enc)));
    cJSON_AddItemToArray(encs, cJSON_CreateString(df_wtype_name(o.enc)));
    cJSON_AddStringToObject(m, "spine_mode", "source");
    cJSON_AddTrueToObject(m, "exact");
    cJSON_AddItemToObject(m, "config", o.arch == SYNTH_K3 ? make_config_k3(&o) : make_config(&o));
    size_t bufcap = 8u << 20;
    uint8_t *buf = malloc(bufcap);
    int rc = buf ? write_spine(&o, m, &pg, buf, bufcap, err, sizeof err) : DF_ENOMEM;
    free(buf);
    if (!rc) rc = write_experts(&o, m, &pg, err, sizeof err);
    if (!rc && df_interrupted()) { /* the last chance to stop: from here on the model is completed */
        snprintf(err, sizeof err, "interrupted by %s", df_signal_name(df_interrupted()));
        rc = DF_ECANCELLED;
    }
    if (!rc) rc = publish_owned(err, sizeof err); /* every data file complete: rename into place */
    if (!rc) {
        fsync_dir(o.out);
        if (o.expert_dirs) {
            char *cp = strdup(o.expert_dirs), *save = NULL;
            for (char *t = cp ? strtok_r(cp, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) fsync_dir(t);
            free(cp);
        }
        char *txt = cJSON_Print(m);
        out_file f;
        rc = of_open(&f, mpath, err, sizeof err);
        if (!rc) { /* not interruptible (no of_write): every data file is in place */
            int w = pwrite_all(f.fd, txt, strlen(txt), 0);
            if (w) rc = DF_EIO, snprintf(err, sizeof err, "write %s: %s", f.tmp, strerror(-w));
        }
        if (!rc) rc = of_commit(&f, err, sizeof err);
        else of_abandon(&f);
        free(txt);
        fsync_dir(o.out);
    }
    cJSON_Delete(m);
    if (rc) {
        int sig = df_interrupted();
        if (pg.open) fputc('\n', stderr); /* end the progress line */
        int gone = 0, n = remove_partial(&o, out_arg, out_existed, dir_existed, &gone);
        char what[2400];
        snprintf(what, sizeof what, "removed the %d file%s written so far from %s%s%s", n, n == 1 ? "" : "s", o.out,
                 o.expert_dirs ? " and the expert directories" : "", gone ? " (and the directory, which this run had created)" : "");
        if (rc == DF_ECANCELLED && sig)
            fprintf(stderr, "deltafin synth: interrupted by %s: %s\n", df_signal_name(sig), what);
        else
            fprintf(stderr, "deltafin synth: %s; %s\n", err[0] ? err : df_strerror(rc), what);
        free(rp);
        free(g_owned);
        return rc == DF_ECANCELLED && sig ? 128 + sig : 1;
    }
    free(g_owned);
    if (!o.quiet) fprintf(stderr, "synth: wrote %s in %.1f s\n", mpath, now_s() - pg.t0);
    int sig = df_interrupted();
    if (sig) /* too late to stop: it came while the last file (manifest.json) was written */
        fprintf(stderr, "deltafin synth: interrupted by %s after the model was finished: %s is complete and was kept\n",
                df_signal_name(sig), o.out);
    free(rp);
    return sig ? 128 + sig : 0;
}
