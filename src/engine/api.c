/*
 * api.c — the public model / session / eval / stats API (include/deltafin.h):
 * opens a native model (or converts an HF directory into the cache first),
 * loads spine.bin into aligned RAM (or, when a RAM budget cannot hold the
 * whole spine, keeps a prefix of layers resident and streams the rest:
 * spine_stream.c), opens the expert store, and runs df_eval (one session) and
 * df_eval_batch (rows of several sessions in one pass) through the forward pass
 * (forward.c). Sampling is in sample.c.
 */
#define _GNU_SOURCE
#include "deltafin.h"
#include "engine.h"
#include "kernels/cuda.h"
#include "spine_stream.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/native.h"
#include "model/spine.h"
#include "store/store.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

struct df_model {
    df_native *nat;
    void *spine_buf;
    df_spine spine;
    int spine_built;
    spine_stream *stream;        /* spine streaming (the spine does not fit the budget); NULL = all resident */
    df_store *store;
    df_pool *pool;
    df_engine eng;
    df_tokenizer *tok;
    int exact;
    uint64_t ram_budget;
    int kv_positions;            /* most positions a session may hold (the budget's KV reserve) */
    char name[128];
    char describe[3072];
    char heat_path[1200];
    char tok_error[512];          /* why the model's tokenizer file could not be opened, or "" */
    char cache_dir[4096];        /* the conversion cache directory when opened from an HF checkpoint, else "" */
    pthread_mutex_t mu;          /* one df_eval at a time per model */
    pthread_mutex_t stats_mu;    /* guards pub */
    df_stats pub;                /* the engine's counters as of the last call that held mu (stats_publish) */
    /* stats */
    int stats_first_done;
    double ttft_s, prefill_s, decode_s;
    uint64_t prefill_tokens, decode_tokens;
    uint64_t weight_bytes_base;
    double io_wait_base;
    double phase_base[DF_PHASES];
    uint64_t spine_stream_base;
    uint64_t kv_bytes;           /* sum over live sessions (approx., updated on eval) */
    int on_gpu;                  /* backend cuda: weights cached in GPU memory (kernels/cuda.h) */
    int dev_tier;                /* the backend has a device tier (dev_pin): the model holds a device tag (dev_attach) */
    uint64_t gpu_spine;          /* spine matmul bytes uploaded to the GPU at open */
    int gpu_spine_all;           /* 1: all of them (else the rest are copied per call) */
    int streamed;                /* routed experts come from a remote source (a `setup --stream` install) */
};

/* A session's tokens [0, n_past). The sequence state (KV cache, KDA recurrent state) holds
 * positions [0, n_eval); tokens [n_eval, n_past) are pending and go through the forward pass
 * in front of the next df_eval's tokens. They exist only for models with recurrent (KDA)
 * layers, whose state cannot be cut back: truncating restores the snapshot taken at the end of
 * the last multi-token evaluation (the prompt) when it is at or before the cut, else the zero
 * state, and re-evaluates the rest. The forward pass gives bit-identical results whatever the
 * chunking, so the re-evaluated state equals the original. */
struct df_session {
    df_model *m;
    df_kvcache kv;
    int32_t *tokens;
    int n_past, tok_cap;
    int n_eval;
    int recurrent;               /* the model has KDA layers */
    float *snap;                 /* recurrent state at position snap_pos (kv_recurrent_bytes) */
    int snap_pos;                /* -1: none */
};

static int set_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int set_err(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void df_model_opts_default(df_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->spine = DF_SPINE_SOURCE;
}

/* expert source = the store */
static int src_request(void *ctx, int layer, const int *ids, int n, store_prio prio) {
    /* gate prediction per layer by its measured recall: after 64 guesses, a layer whose guesses are
     * acquired less than 20% of the time is no longer predicted (wasted reads would slow demand reads) */
    if (prio == STORE_PREFETCH) {
        double r = store_layer_recall(ctx, layer, 64);
        if (r >= 0 && r < 0.20) return 0;
    }
    return store_request(ctx, layer, ids, n, prio);
}
static int src_acquire(void *ctx, int layer, const int *ids, int n, df_expert *v, char *err, size_t errlen) {
    return store_acquire(ctx, layer, ids, n, v, err, errlen);
}
static void src_release(void *ctx, int layer, const int *ids, int n) { store_release(ctx, layer, ids, n); }
static void src_present(void *ctx, int layer, const int *ids, int n, unsigned char *p) { store_present(ctx, layer, ids, n, p); }

static int file_exists(const char *dir, const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Read spine.bin into 4 KiB-aligned memory and check its size and XXH64. */
/* Reading spine.bin: O_DIRECT (page cache bypassed) in chunks of SPINE_CHUNK bytes by SPINE_READERS threads
 * (that many reads in flight, as the drives need to reach their bandwidth) while the calling thread checksums
 * the chunks in order as they arrive, so the XXH64 time hides under the reads. A filesystem without O_DIRECT
 * gets buffered reads (same bytes). Decoding starts only after the whole spine is verified: a mismatch stops
 * the model before any token. */
enum { SPINE_CHUNK = 4 << 20, SPINE_READERS = 8 };

typedef struct {
    int fd;
    uint8_t *buf;
    uint64_t size;           /* file bytes */
    int64_t n_chunks;
    int64_t next;            /* next chunk to read (atomic) */
    unsigned char *done;     /* [n_chunks] 1 when read (guarded by mu) */
    int err;                 /* errno of a failed read, or -1 for a short file (guarded by mu) */
    uint64_t err_off;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} spine_reader;

static void *spine_read_thread(void *arg) {
    spine_reader *r = arg;
    for (;;) {
        int64_t c = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (c >= r->n_chunks) break;
        uint64_t off = (uint64_t)c * SPINE_CHUNK, want = r->size - off < SPINE_CHUNK ? r->size - off : SPINE_CHUNK;
        size_t len = (size_t)((want + 4095) / 4096 * 4096); /* O_DIRECT: whole pages; the last read is short */
        uint64_t got = 0;
        int e = 0;
        while (got < want) {
            ssize_t n = pread(r->fd, r->buf + off + got, len - got, (off_t)(off + got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) { e = n < 0 ? errno : -1; break; }
            got += (uint64_t)n;
            if (got < want && got % 4096) { e = -1; break; } /* a short read that is not page-sized: end of file */
        }
        pthread_mutex_lock(&r->mu);
        if (e && !r->err) { r->err = e; r->err_off = off + got; }
        r->done[c] = 1;
        pthread_cond_broadcast(&r->cv);
        int stop = r->err != 0;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
    }
    return NULL;
}

static int load_spine(df_model *m, char *err, size_t errlen) {
    const df_native *n = m->nat;
    int fd = open(n->spine_path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) fd = open(n->spine_path, O_RDONLY | O_CLOEXEC); /* no O_DIRECT here */
    if (fd < 0) return set_err(err, errlen, DF_EIO, "%s: cannot open (%s); re-run `deltafin convert`", n->spine_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != n->spine_bytes) {
        close(fd);
        return set_err(err, errlen, DF_EFORMAT, "%s: size %lld bytes, manifest says %llu (truncated or replaced); re-run `deltafin convert`",
                       n->spine_path, (long long)st.st_size, (unsigned long long)n->spine_bytes);
    }
    size_t len = n->spine_bytes ? n->spine_bytes : 1;
    /* a spine of 1 GiB or more: 2 MiB-aligned and backed by huge pages where the kernel allows (THP "madvise"), so
     * the reads fault the buffer in a 2 MiB page at a time instead of 512 4 KiB pages (the rounding, under 0.2%
     * of it, is not worth it for a small spine under a tight budget) */
    const int use_huge = len >= ((size_t)1 << 30);
    const size_t align = use_huge ? (size_t)2 << 20 : 4096, alen = (len + align - 1) / align * align;
    if (posix_memalign(&m->spine_buf, align, alen)) {
        close(fd);
        m->spine_buf = NULL;
        return set_err(err, errlen, DF_ENOMEM, "cannot allocate %llu bytes for the spine (%s)", (unsigned long long)len, n->spine_path);
    }
#ifdef MADV_HUGEPAGE
    if (use_huge) madvise(m->spine_buf, alen, MADV_HUGEPAGE); /* a hint: 4 KiB pages when refused */
#endif
    spine_reader r = {.fd = fd, .buf = m->spine_buf, .size = n->spine_bytes};
    r.n_chunks = (int64_t)((n->spine_bytes + SPINE_CHUNK - 1) / SPINE_CHUNK);
    r.done = calloc((size_t)r.n_chunks + 1, 1);
    XXH64_state_t *hs = XXH64_createState();
    if (!r.done || !hs) {
        free(r.done);
        if (hs) XXH64_freeState(hs);
        close(fd);
        return set_err(err, errlen, DF_ENOMEM, "out of memory reading %s", n->spine_path);
    }
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    XXH64_reset(hs, 0);
    pthread_t th[SPINE_READERS];
    int nth = 0;
    for (int i = 0; i < SPINE_READERS && i < r.n_chunks; i++)
        if (pthread_create(&th[nth], NULL, spine_read_thread, &r) == 0) nth++;
    if (nth == 0) spine_read_thread(&r); /* no threads: read everything here first */
    int rerr = 0;
    uint64_t roff = 0;
    for (int64_t c = 0; c < r.n_chunks; c++) {
        pthread_mutex_lock(&r.mu);
        while (!r.done[c] && !r.err) pthread_cond_wait(&r.cv, &r.mu);
        rerr = r.err;
        roff = r.err_off;
        pthread_mutex_unlock(&r.mu);
        if (rerr) break;
        uint64_t off = (uint64_t)c * SPINE_CHUNK;
        XXH64_update(hs, r.buf + off, (size_t)(n->spine_bytes - off < SPINE_CHUNK ? n->spine_bytes - off : SPINE_CHUNK));
    }
    __atomic_store_n(&r.next, r.n_chunks, __ATOMIC_RELAXED); /* stop the readers after an error */
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    free(r.done);
    close(fd);
    uint64_t h = XXH64_digest(hs);
    XXH64_freeState(hs);
    if (rerr)
        return set_err(err, errlen, DF_EIO, "%s: read failed at offset %llu (%s)", n->spine_path, (unsigned long long)roff,
                       rerr > 0 ? strerror(rerr) : "unexpected end of file");
    if (h != n->spine_xxh64)
        return set_err(err, errlen, DF_EFORMAT, "%s: checksum mismatch (xxh64 %016llx, manifest %016llx): the file is corrupt; re-run `deltafin convert`",
                       n->spine_path, (unsigned long long)h, (unsigned long long)n->spine_xxh64);
    return DF_OK;
}

static const char *fmt_bytes(char *out, size_t cap, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(out, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(out, cap, "%.1f MiB", b / 1048576.0);
    else snprintf(out, cap, "%.1f KiB", b / 1024.0);
    return out;
}

static const char *spine_encodings(const df_native *n, char *out, size_t cap) {
    int seen[DF_W__COUNT] = {0};
    for (int i = 0; i < n->n_tensors; i++)
        if (n->tensors[i].ndim == 2 && n->tensors[i].type >= 0 && n->tensors[i].type < DF_W__COUNT) seen[n->tensors[i].type] = 1;
    out[0] = 0;
    for (int t = 0; t < DF_W__COUNT; t++)
        if (seen[t]) {
            size_t l = strlen(out);
            snprintf(out + l, cap - l, "%s%s", l ? "+" : "", df_wtype_name((df_wtype)t));
        }
    return out;
}

/* The spine does not fit the budget (issue 4): keep the largest prefix of layers resident that still leaves
 * the store's minimum expert cache, stream the rest through 2 staging buffers. *n_res = resident layers;
 * DF_EBUDGET stating the minimum (all layers streamed) when even that does not fit. */
static int plan_spine_stream(df_model *m, uint64_t budget, uint64_t kvb, uint64_t other, int *n_res, uint64_t *cache,
                             char *err, size_t errlen) {
    const int L = m->nat->cfg.num_hidden_layers;
    if (L < 1) return DF_EBUDGET;
    sst_plan p;
    int rc = sst_plan_make(m->nat, &p, err, errlen);
    if (rc) return rc;
    rc = DF_EBUDGET;
    for (int r = L - 1; r >= 0; r--) {
        uint64_t sp = sst_plan_resident(&p, r) + 2 * sst_plan_stage(&p, r);
        rc = store_budget(m->nat, budget, sp, kvb, other, cache, err, errlen);
        if (rc == DF_OK) { *n_res = r; break; }
        if (rc != DF_EBUDGET) break;
    }
    if (rc == DF_EBUDGET) {
        /* the minimum: the layout with the smallest spine part (usually all layers streamed) */
        int best = 0;
        uint64_t best_sp = UINT64_MAX;
        for (int r = 0; r < L; r++) {
            uint64_t sp = sst_plan_resident(&p, r) + 2 * sst_plan_stage(&p, r);
            if (sp < best_sp) { best_sp = sp; best = r; }
        }
        if (m->nat->spine_bytes <= best_sp) {
            /* the staging buffers cost more than the layers they keep out of memory: the whole spine resident is the
             * minimum, and its own message (the caller's first try) states it */
            sst_plan_free(&p);
            return store_budget(m->nat, budget, m->nat->spine_bytes, kvb, other, cache, err, errlen);
        }
        rc = store_budget(m->nat, budget, best_sp, kvb, other, cache, err, errlen);
        if (rc == DF_OK) *n_res = best; /* not reached: larger layouts were tried first */
        if (rc != DF_EBUDGET || !err || !errlen) { sst_plan_free(&p); return rc; }
        char b1[32], b2[32], b3[32];
        size_t l = strlen(err);
        snprintf(err + l, errlen - l,
                 " (that spine figure is with spine streaming: resident tensors %s + 2 layer staging buffers of %s; "
                 "the whole spine, %s, would need more)",
                 fmt_bytes(b1, sizeof b1, sst_plan_resident(&p, best)), fmt_bytes(b2, sizeof b2, sst_plan_stage(&p, best)),
                 fmt_bytes(b3, sizeof b3, m->nat->spine_bytes));
    }
    sst_plan_free(&p);
    return rc;
}

/* --heat FILE: a file (created at close when missing) in an existing directory; anything else would be
 * ignored silently when the histogram is loaded and saved, so it is refused at open, naming the flag. */
static int check_heat_path(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return set_err(err, errlen, DF_EINVAL, "--heat %s is a directory: expected a file (e.g. %s/heat.bin; it is "
                           "created when missing), or --heat off", path, path);
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *d = dirname(dir);
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        return set_err(err, errlen, DF_EINVAL, "--heat %s: the directory %s does not exist (create it, or choose another "
                       "file, or --heat off)", path, d);
    return 0;
}

static void stats_publish(df_model *m);
static void model_unlock(df_model *m);

/* Models open on a backend with a device tier (df_backend.dev_pin) in this process. Each holds a device tag while
 * open (its routed experts' DF_DEVKEY tag: a target and its draft model never share an expert's cache entry), and on
 * the GPU the device's process-wide settings follow all of them: weights are cached by host address only while no
 * open model streams its spine (a streamed layer's staging buffer holds other layers' weights at the same address
 * over time), and the expert budget is the first model's unless a later one names its own (a draft model opened with
 * no budget keeps its target's). */
static pthread_mutex_t g_dev_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_dev_tags;   /* bit t: tag t held by an open model */
static int g_gpu_cuda;        /* open models on the CUDA backend */
static int g_gpu_streamed;    /* of those, models whose spine is streamed */
/* df_decode_greedy's device chains, one at a time in the process (the device's token slots are shared) */
static pthread_mutex_t g_greedy_mu = PTHREAD_MUTEX_INITIALIZER;

/* m onto the backend's device tier: a free tag; on the CUDA backend (cuda), the device's settings for the models now
 * open (the first one clears the cache of whatever an earlier process state left). DF_EUNSUPPORTED when DF_DEV_TAGS
 * models are open already. */
static int dev_attach(df_model *m, int cuda, uint64_t gpu_budget, char *err, size_t errlen) {
    pthread_mutex_lock(&g_dev_mu);
    int tag = 0;
    while (tag < DF_DEV_TAGS && (g_dev_tags >> tag & 1u)) tag++;
    if (tag == DF_DEV_TAGS) {
        pthread_mutex_unlock(&g_dev_mu);
        return set_err(err, errlen, DF_EUNSUPPORTED, "%d models are open on the GPU already (the most at once): close one, "
                       "or open this one with --backend cpu", DF_DEV_TAGS);
    }
    g_dev_tags |= 1u << tag;
    m->eng.dev_tag = (unsigned)tag;
    m->dev_tier = 1;
    if (cuda) {
        const int first = g_gpu_cuda == 0;
        if (first) df_cuda_cache_clear();
        g_gpu_cuda++;
        if (m->stream) g_gpu_streamed++;
        df_cuda_set_cache_by_address(g_gpu_streamed == 0);
        if (first || gpu_budget) df_cuda_set_expert_budget(gpu_budget);
        m->on_gpu = 1;
    }
    pthread_mutex_unlock(&g_dev_mu);
    return DF_OK;
}

/* m off the device tier (before its host memory is freed), its tag free again: on the GPU its experts and every
 * address-keyed weight dropped (the whole cache when it was the last model there); another device tier forgets the
 * tag's experts (dev_drop_tag). */
static void dev_detach(df_model *m) {
    pthread_mutex_lock(&g_dev_mu);
    g_dev_tags &= ~(1u << m->eng.dev_tag);
    if (m->on_gpu) {
        g_gpu_cuda--;
        if (m->stream) g_gpu_streamed--;
        if (!g_gpu_cuda) df_cuda_cache_clear();
        else df_cuda_cache_drop_model((int)m->eng.dev_tag);
        df_cuda_set_cache_by_address(g_gpu_streamed == 0);
        m->on_gpu = 0;
    } else if (m->eng.be && m->eng.be->dev_drop_tag) {
        m->eng.be->dev_drop_tag((int)m->eng.dev_tag);
    }
    m->dev_tier = 0;
    pthread_mutex_unlock(&g_dev_mu);
}

int df_model_open(df_model **out, const char *path, const df_model_opts *opts_in, char *err, size_t errlen) {
    *out = NULL;
    df_model_opts opts;
    if (opts_in) opts = *opts_in; else df_model_opts_default(&opts);
    if (!path || !*path) return set_err(err, errlen, DF_EINVAL, "no model directory given");
    struct stat st;
    if (stat(path, &st) != 0) return set_err(err, errlen, DF_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return set_err(err, errlen, DF_EINVAL, "%s: not a directory (expected a model directory with manifest.json or config.json)", path);
    if (opts.io_depth < 0 || opts.io_depth > 1024)
        return set_err(err, errlen, DF_EINVAL, "I/O depth %d: expected 1..1024 expert reads in flight per drive (0 = 16)",
                       opts.io_depth);
    if (opts.io_size && (opts.io_size % 4096 || opts.io_size > (64u << 20)))
        return set_err(err, errlen, DF_EINVAL, "I/O read size %llu bytes: expected a multiple of 4096 up to 64 MiB (0 = 1 MiB)",
                       (unsigned long long)opts.io_size);
    if (!opts.backend && getenv("DF_BACKEND") && *getenv("DF_BACKEND")) opts.backend = getenv("DF_BACKEND");
    const df_backend *be = df_backend_get(opts.backend);
    if (!be) {
        char why[300];
        /* the CLI passes DF_BACKEND's own string when no --backend was given (cli_default_backend), the
         * pointer getenv returns, as does the line above: then the message names the variable as the source */
        const char *env = getenv("DF_BACKEND");
        const int from_env = env && opts.backend == env, cuda = !strcmp(opts.backend, "cuda");
        const char *fix = cuda ? (from_env ? "; unset DF_BACKEND or set DF_BACKEND=cpu (or auto, which picks the CPU here)"
                                           : "; use --backend cpu (or auto, which picks the CPU here)")
                               : (from_env ? "; unset DF_BACKEND or set it to one of those" : "");
        df_backend_why(opts.backend, why, sizeof why);
        if (strstr(why, "DF_CUDA_")) fix = ""; /* a bad CUDA knob: its message says how to fix it (auto refuses too) */
        return set_err(err, errlen, DF_EINVAL, "backend \"%s\"%s: %s%s", opts.backend,
                       from_env ? " (from the environment variable DF_BACKEND)" : "", why, fix);
    }
    const int on_gpu = !strcmp(be->name, "cuda");
    /* settings that have no effect, or a bad one, are said once per process (nothing silently ignored) */
    static int warned_gpu_budget, warned_threads;
    if (opts.gpu_budget && !on_gpu && !warned_gpu_budget) {
        warned_gpu_budget = 1;
        fprintf(stderr, "deltafin: warning: --gpu-budget has no effect with backend %s (it sizes the CUDA backend's "
                        "expert cache)\n", be->name);
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (opts.threads > 0 && online > 0 && opts.threads > online && !warned_threads) {
        warned_threads = 1;
        fprintf(stderr, "deltafin: warning: --threads %d is more than the %ld CPUs online; compute threads beyond the "
                        "cores slow decoding\n", opts.threads, online);
    }

    char dir[4096];
    int converted = 0;
    if (file_exists(path, "manifest.json")) {
        snprintf(dir, sizeof dir, "%s", path);
    } else if (file_exists(path, "config.json")) {
        int rc = convert_cached(path, opts.cache_dir, opts.spine, opts.progress, opts.progress_user, dir, sizeof dir, err, errlen);
        if (rc) return rc;
        converted = 1;
    } else {
        return set_err(err, errlen, DF_EINVAL, "%s: neither manifest.json (native model) nor config.json (Hugging Face checkpoint) found", path);
    }

    df_model *m = calloc(1, sizeof *m);
    if (!m) return set_err(err, errlen, DF_ENOMEM, "out of memory");
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->stats_mu, NULL);
    if (converted) snprintf(m->cache_dir, sizeof m->cache_dir, "%s", dir);
    int n_res = -1;              /* >= 0: spine streaming with that many resident layers */
    int rc = native_open(&m->nat, dir, err, errlen);
    if (!rc) rc = opts.expert_dirs ? native_set_expert_dirs(m->nat, opts.expert_dirs, err, errlen)
                                   : native_require_packs(m->nat, err, errlen);
    if (rc) goto fail;
    const df_config *cfg = &m->nat->cfg;
    m->exact = m->nat->exact;
    /* the name: the HF directory's basename when converted, else the manifest's */
    if (converted || !m->nat->name[0]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", path);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
        snprintf(m->name, sizeof m->name, "%s", basename(tmp));
    } else {
        snprintf(m->name, sizeof m->name, "%s", m->nat->name);
    }

    /* expert store under the RAM budget */
    store_opts so;
    store_opts_default(&so);
    so.expert_dirs = NULL; /* native_set_expert_dirs already re-pointed m->nat at opts.expert_dirs */
    so.events_path = opts.events_path;
    so.remote = opts.remote_source;
    so.io_depth = opts.io_depth;
    so.io_bytes = opts.io_size;
    m->streamed = opts.remote_source != NULL;
    so.pin = be->host_pin; /* the GPU backend: slot buffers page-locked, experts copied to the GPU by DMA */
    so.unpin = be->host_unpin;
    {
        int mode = opts.prefault, env = 0;
        if (mode == 0) { /* the documented alias of --prefault, read only when the flag was not given */
            rc = df_env_switch("DF_PREFAULT", "--prefault", 0, &env, err, errlen);
            if (rc) goto fail;
            mode = env;
        }
        so.no_prefault = mode == 2;
    }
    if (opts.heat_path && strcmp(opts.heat_path, "off") && *opts.heat_path) {
        if ((rc = check_heat_path(opts.heat_path, err, errlen))) goto fail;
        snprintf(m->heat_path, sizeof m->heat_path, "%s", opts.heat_path);
    }
    else if (!opts.heat_path && opts.ram_budget)
        snprintf(m->heat_path, sizeof m->heat_path, "%s/heat.bin", m->nat->dir);
    so.heat_path = m->heat_path[0] ? m->heat_path : NULL;
    m->ram_budget = opts.ram_budget;
    m->kv_positions = cfg->max_position_embeddings;
    if (opts.ram_budget) {
        int ctx = cfg->max_position_embeddings < 4096 ? cfg->max_position_embeddings : 4096;
        if (opts.kv_positions > 0) /* the model's maximum at most (a caller asking for more says so itself) */
            ctx = opts.kv_positions < cfg->max_position_embeddings ? opts.kv_positions : cfg->max_position_embeddings;
        m->kv_positions = ctx;
        /* MLA layers hold a latent row per position; KDA layers a fixed state (+ one prompt snapshot) */
        int n_mla = 0, n_kda = 0;
        for (int l = 0; l < cfg->num_hidden_layers; l++) cfg->mixer[l] == DF_MIXER_KDA ? n_kda++ : n_mla++;
        const uint64_t kda_state = (uint64_t)cfg->kda_heads * cfg->kda_head_dim *
                                   (uint64_t)(cfg->kda_head_dim + 3 * (cfg->kda_conv > 1 ? cfg->kda_conv - 1 : 0)) * 4;
        uint64_t kvb = (uint64_t)ctx * n_mla * (uint64_t)(cfg->kv_lora_rank + cfg->qk_rope_head_dim) * 4 +
                       2 * (uint64_t)n_kda * kda_state;
        kvb *= (uint64_t)(opts.n_seq > 1 ? opts.n_seq : 1); /* one KV cache per session (serve --parallel) */
        uint64_t other = (uint64_t)cfg->vocab_size * 8 + (uint64_t)cfg->hidden_size * 256;
        rc = store_budget(m->nat, opts.ram_budget, m->nat->spine_bytes, kvb, other, &so.cache_bytes, err, errlen);
        if (rc == DF_EBUDGET) {
            rc = plan_spine_stream(m, opts.ram_budget, kvb, other, &n_res, &so.cache_bytes, err, errlen);
            if (rc) goto fail;
        }
        if (rc) goto fail;
    }
    if (n_res >= 0) {
        rc = sst_open(&m->stream, m->nat, n_res, &m->spine, err, errlen);
        if (rc) goto fail;
    } else {
        rc = load_spine(m, err, errlen);
        if (rc) goto fail;
        rc = spine_build(m->nat, m->spine_buf, &m->spine, err, errlen);
        if (rc) goto fail;
    }
    m->spine_built = 1;
    if (m->nat->n_moe_layers > 0) {
        /* a streamed install's packs hold only the experts fetched so far: never read them without their source */
        char sj[1200];
        snprintf(sj, sizeof sj, "%s/stream.json", m->nat->dir);
        if (!opts.remote_source && df_path_exists(sj)) {
            rc = set_err(err, errlen, DF_EUNSUPPORTED, "%s is a streamed install (`deltafin setup --stream`): its routed experts "
                         "are fetched on first use by deltafin run / serve / bench decode; `deltafin setup REPO --full` completes it",
                         m->nat->dir);
            goto fail;
        }
        rc = store_open(&m->store, m->nat, &so, err, errlen);
        if (rc) goto fail;
    }
    m->pool = df_pool_new(opts.threads);
    if (!m->pool) { rc = set_err(err, errlen, DF_ENOMEM, "cannot start the thread pool"); goto fail; }
    m->eng.cfg = cfg;
    m->eng.spine = &m->spine;
    m->eng.stream = m->stream;
    m->eng.be = be;
    if (be->dev_pin) {
        if ((rc = dev_attach(m, on_gpu, opts.gpu_budget, err, errlen))) goto fail;
    }
    if (on_gpu) {
        if (!m->stream) m->gpu_spine = df_cuda_preload_spine(&m->spine, cfg->num_hidden_layers, &m->gpu_spine_all);
    }
    m->eng.pool = m->pool;
    m->eng.experts = (df_expert_src){m->store, src_request, src_acquire, src_release, src_present};
    m->eng.max_acquire = m->store ? store_max_acquire(m->store) : 0;
    m->eng.touched = cfg->n_routed_experts > 0 ? calloc((size_t)cfg->num_hidden_layers * cfg->n_routed_experts, 1) : NULL;
    m->eng.gs_layer = -1;
    /* router prefetch of layer L+1 (issue 4): on when experts can be evicted (a RAM budget);
     * DF_PREFETCH=1/0 forces it on/off (measurements). Without a budget, auto keeps the prompt-sized
     * lookahead only (a prompt's next layer read while this one computes; nothing is evicted, and the
     * guesses are cut to a 2% expected waste). Never changes numerics. */
    {
        int mode = opts.prefetch, env = 0;
        if (mode == 0) { /* the documented alias of --prefetch, read only when the flag was not given */
            rc = df_env_switch("DF_PREFETCH", "--prefetch", 1, &env, err, errlen);
            if (rc) goto fail;
            mode = env;
        }
        m->eng.prefetch = m->store && (mode == 1 || mode == 3 || (mode == 0 && opts.ram_budget > 0));
        m->eng.prefetch_prompt = m->store && mode != 2;
        m->eng.prefetch_ungated = mode == 3; /* always on, without the A/B gate (forward.c) */
    }
    rc = rope_init(&m->eng.rope, cfg, err, errlen);
    if (rc) goto fail;
    /* a broken tokenizer does not stop the model (token ids still work); its error is shown in the
     * configuration line and returned by df_model_tokenizer_error */
    char *terr = m->tok_error;
    const size_t terr_cap = sizeof m->tok_error;
    if (file_exists(dir, "tokenizer.json") || file_exists(dir, "tiktoken.model")) {
        if (df_tokenizer_open(&m->tok, dir, NULL, terr, terr_cap) != DF_OK) {
            m->tok = NULL;
            if (!terr[0]) snprintf(terr, terr_cap, "cannot open");
        } else {
            terr[0] = 0;
        }
    }
    char tdesc[600];
    snprintf(tdesc, sizeof tdesc, "%s%s%s", m->tok ? "yes" : terr[0] ? "ERROR (" : "none", terr, terr[0] ? ")" : "");
    /* the resolved-configuration line */
    char b1[32], encs[64], sdesc[160] = "";
    if (m->stream) {
        char b2[32], b3[32], b4[32];
        const uint64_t stage2 = 2 * sst_stage_bytes(m->stream), mem = sst_memory_bytes(m->stream);
        snprintf(sdesc, sizeof sdesc, ", spine resident %d/%d layers, %s of %s (streaming %d, 2 x %s staging)",
                 sst_n_resident(m->stream), cfg->num_hidden_layers, fmt_bytes(b3, sizeof b3, mem > stage2 ? mem - stage2 : 0),
                 fmt_bytes(b4, sizeof b4, m->nat->spine_bytes), cfg->num_hidden_layers - sst_n_resident(m->stream),
                 fmt_bytes(b2, sizeof b2, sst_stage_bytes(m->stream)));
    }
    store_stats ss;
    memset(&ss, 0, sizeof ss);
    if (m->store) store_get_stats(m->store, &ss);
    /* the expert part: "no routed experts (dense)" when every layer is dense */
    char edesc[160];
    if (m->nat->n_moe_layers > 0)
        snprintf(edesc, sizeof edesc, "%d routed experts top-%d (%d shared, groups %d/%d)", cfg->n_routed_experts,
                 cfg->num_experts_per_tok, cfg->n_shared_experts, cfg->n_group, cfg->topk_group);
    else
        snprintf(edesc, sizeof edesc, "no routed experts (dense)");
    char adesc[320], iodesc[64];
    config_describe(cfg, adesc, sizeof adesc);
    if (m->store) /* the engine, then reads in flight per drive x read size */
        snprintf(iodesc, sizeof iodesc, "%s %d x %llu KiB", ss.io_engine, ss.io_depth, (unsigned long long)(ss.io_bytes / 1024));
    else
        snprintf(iodesc, sizeof iodesc, "none");
    snprintf(m->describe, sizeof m->describe,
             "model %s (%s), hidden %d, %d heads, %s%s, "
             "experts %s, spine %s [%s]%s%s, %d threads, backend %s, budget %s, I/O %s, prefetch %s, prefault %s, heat %s, "
             "tokenizer %s",
             m->name, adesc, cfg->hidden_size, cfg->num_attention_heads, cfg->rope_yarn ? "yarn, " : "", edesc,
             m->nat->n_moe_layers ? df_wtype_name(m->nat->expert_type) : "none", m->nat->spine_mode, spine_encodings(m->nat, encs, sizeof encs),
             m->exact ? "" : (!strcmp(m->nat->spine_mode, "int8") ? " NOT EXACT (int8 spine)" : " NOT EXACT (lossy bf16 re-encoding)"), sdesc,
             df_pool_threads(m->pool), be->name,
             opts.ram_budget ? fmt_bytes(b1, sizeof b1, opts.ram_budget) : "unlimited",
             iodesc, m->eng.prefetch ? (m->eng.prefetch_ungated ? "ungated" : "on") : m->eng.prefetch_prompt ? "prompts" : "off", m->store && !so.no_prefault ? "on" : "off",
             m->heat_path[0] ? m->heat_path : "off", tdesc);
    if (on_gpu) { /* the GPU and its expert tier */
        char gdesc[160], b9[32];
        df_cuda_describe(gdesc, sizeof gdesc);
        size_t l = strlen(m->describe);
        char b10[32];
        snprintf(m->describe + l, sizeof m->describe - l, ", GPU %s, spine on GPU %s%s, gpu-budget %s", gdesc,
                 fmt_bytes(b10, sizeof b10, m->gpu_spine), m->stream ? " (streamed layers copied per call)" :
                 m->gpu_spine_all ? "" : " (the rest copied per call)",
                 opts.gpu_budget ? fmt_bytes(b9, sizeof b9, opts.gpu_budget) : "all free");
    }
    stats_publish(m);
    *out = m;
    return DF_OK;
fail:
    if (converted && (rc == DF_EFORMAT || rc == DF_EIO)) convert_cache_hint(dir, err, errlen);
    df_model_close(m);
    return rc;
}

void df_model_close(df_model *m) {
    if (!m) return;
    if (m->dev_tier) dev_detach(m);
    rope_free(&m->eng.rope);
    free(m->eng.touched);
    free(m->eng.gs_votes);
    free(m->eng.kda_buf);
    if (m->pool) df_pool_free(m->pool);
    if (m->store) store_close(m->store);
    if (m->stream) sst_close(m->stream);
    if (m->spine_built) spine_free(&m->spine);
    free(m->spine_buf);
    if (m->tok) df_tokenizer_free(m->tok);
    if (m->nat) native_close(m->nat);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->stats_mu);
    free(m);
}

const char *df_model_describe(const df_model *m) { return m ? m->describe : ""; }
const char *df_model_name(const df_model *m) { return m ? m->name : ""; }
int df_model_n_vocab(const df_model *m) { return m ? m->nat->cfg.vocab_size : 0; }
/* the most positions one session may hold: max_position_embeddings, or the KV reserve of a RAM budget */
int df_model_n_ctx_max(const df_model *m) { return m ? m->kv_positions : 0; }
int df_model_is_exact(const df_model *m) { return m ? m->exact : 1; }
const char *df_model_tokenizer_error(const df_model *m) { return m && m->tok_error[0] ? m->tok_error : NULL; }

const df_tokenizer *df_model_tokenizer(const df_model *m) { return m ? m->tok : NULL; }

int df_model_verify(df_model *m, df_progress_fn p, void *u, char *err, size_t errlen) {
    if (!m) return set_err(err, errlen, DF_EINVAL, "no model");
    int rc = native_verify(m->nat, p, u, err, errlen);
    if (rc == DF_EFORMAT || rc == DF_EIO) convert_cache_hint(m->cache_dir, err, errlen);
    return rc;
}

/* df_model_verify_all (deltafin doctor): every checksum, every problem reported, the model not loaded. */
int df_model_verify_all(const char *path, const df_model_opts *opts_in, df_verify_report_fn report, void *user,
                        df_verify_summary *sum, char *err, size_t errlen) {
    df_model_opts opts;
    if (opts_in) opts = *opts_in; else df_model_opts_default(&opts);
    df_verify_summary dummy;
    if (!sum) sum = &dummy;
    memset(sum, 0, sizeof *sum);
    if (!path || !*path) return set_err(err, errlen, DF_EINVAL, "no model directory given");
    struct stat st;
    if (stat(path, &st) != 0) return set_err(err, errlen, DF_EIO, "%s: %s", path, strerror(errno));
    char dir[4096];
    int converted = 0, rc;
    if (file_exists(path, "manifest.json")) {
        snprintf(dir, sizeof dir, "%s", path);
    } else if (file_exists(path, "config.json")) {
        rc = convert_cached(path, opts.cache_dir, opts.spine, opts.progress, opts.progress_user, dir, sizeof dir, err, errlen);
        if (rc) return rc;
        converted = 1;
    } else {
        return set_err(err, errlen, DF_EINVAL, "%s: neither manifest.json (native model) nor config.json (Hugging Face checkpoint) found", path);
    }
    df_native *n = NULL;
    rc = native_open(&n, dir, err, errlen);
    /* a missing pack is not fatal here (native_require_packs): it is reported as its layer's problem */
    if (!rc && opts.expert_dirs) rc = native_set_expert_dirs(n, opts.expert_dirs, err, errlen);
    if (rc) {
        if (converted && (rc == DF_EFORMAT || rc == DF_EIO)) convert_cache_hint(dir, err, errlen);
        native_close(n);
        return rc;
    }
    uint64_t total = n->spine_bytes, done = 0;
    for (int i = 0; i < n->n_moe_layers; i++) total += (uint64_t)n->n_experts * n->stride;
    const size_t chunk = 8u << 20;
    uint64_t cap = chunk;
    for (int i = 0; i < n->n_moe_layers; i++)
        if (native_extent_buf_bytes(n, n->moe_layers[i].layer) > cap) cap = native_extent_buf_bytes(n, n->moe_layers[i].layer);
    uint8_t *buf = malloc(cap);
    XXH64_state_t *xs = XXH64_createState();
    if (!buf || !xs) {
        free(buf);
        XXH64_freeState(xs);
        native_close(n);
        return set_err(err, errlen, DF_ENOMEM, "out of memory");
    }
    char msg[4096], first[3][64];
    int n_first = 0, n_events = 0, cancelled = 0; /* the first 3 problems are named in err */
    /* spine.bin: one problem at most (a read error or the checksum) */
    sum->spine_bytes = n->spine_bytes;
    snprintf(sum->spine_file, sizeof sum->spine_file, "%s", n->spine_path);
    msg[0] = 0;
    int fd = open(n->spine_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) snprintf(msg, sizeof msg, "cannot open %s: %s", n->spine_path, strerror(errno));
    XXH64_reset(xs, 0);
    for (uint64_t off = 0; fd >= 0 && off < n->spine_bytes && !msg[0] && !cancelled; off += chunk) {
        size_t len = (size_t)(n->spine_bytes - off < chunk ? n->spine_bytes - off : chunk);
        size_t got = 0;
        int r = 0;
        while (got < len) { /* short reads and EINTR retried; 0 bytes = end of file */
            ssize_t k = pread(fd, buf + got, len - got, (off_t)(off + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) { r = k < 0 ? -errno : 1; break; }
            got += (size_t)k;
        }
        if (r) snprintf(msg, sizeof msg, "%s: read failed at offset %llu: %s", n->spine_path, (unsigned long long)off,
                        r == 1 ? "unexpected end of file" : strerror(-r));
        else XXH64_update(xs, buf, len);
        done += len;
        if (opts.progress && opts.progress(opts.progress_user, "bytes", done, total)) cancelled = 1;
    }
    if (fd >= 0) close(fd);
    if (!msg[0] && !cancelled) {
        uint64_t h = XXH64_digest(xs);
        if (h != n->spine_xxh64)
            snprintf(msg, sizeof msg, "checksum mismatch: %s (%llu bytes; xxh64 %016llx, manifest %016llx): the spine is corrupt",
                     n->spine_path, (unsigned long long)n->spine_bytes, (unsigned long long)h, (unsigned long long)n->spine_xxh64);
    }
    sum->spine_ok = !msg[0] && !cancelled;
    if (msg[0]) {
        if (converted) convert_cache_hint(dir, msg, sizeof msg);
        df_verify_problem p = {-1, -1, n->spine_path, 0, n->spine_bytes, msg};
        if (report) report(user, &p);
        snprintf(first[n_first++], sizeof first[0], "spine.bin");
        n_events++;
    }
    /* every routed expert; a pack file that cannot be opened is one problem for its whole layer */
    sum->n_moe_layers = n->n_moe_layers;
    for (int i = 0; i < n->n_moe_layers && !cancelled; i++) {
        const native_expert_layer *L = &n->moe_layers[i];
        msg[0] = 0;
        for (int f = 0; f < L->n_files && !msg[0]; f++) {
            int tfd = open(L->files[f], O_RDONLY | O_CLOEXEC);
            if (tfd < 0) snprintf(msg, sizeof msg, "cannot open expert pack %s (layer %d): %s; none of its %d experts checked",
                                  L->files[f], L->layer, strerror(errno), n->n_experts);
            else close(tfd);
        }
        if (msg[0]) {
            if (converted) convert_cache_hint(dir, msg, sizeof msg);
            df_verify_problem p = {L->layer, -1, L->files[0], 0, (uint64_t)n->n_experts * L->stripe_bytes, msg};
            if (report) report(user, &p);
            if (n_first < 3) snprintf(first[n_first++], sizeof first[0], "layer %d", L->layer);
            n_events++;
            sum->n_experts += n->n_experts;
            sum->n_bad_experts += n->n_experts;
            sum->n_unreadable_experts += n->n_experts;
            done += (uint64_t)n->n_experts * n->stride;
            continue;
        }
        for (int e = 0; e < n->n_experts && !cancelled; e++) {
            sum->n_experts++;
            int r = native_read_expert(n, L->layer, e, buf, msg, sizeof msg);
            if (!r) r = native_verify_expert(n, L->layer, e, buf, msg, sizeof msg);
            if (r) {
                if (converted) convert_cache_hint(dir, msg, sizeof msg);
                df_verify_problem p = {L->layer, e, L->files[0], (uint64_t)e * native_stripe_size(L, 0), native_stripe_size(L, 0), msg};
                if (report) report(user, &p);
                if (n_first < 3) snprintf(first[n_first++], sizeof first[0], "layer %d expert %d", L->layer, e);
                n_events++;
                sum->n_bad_experts++;
            }
            done += n->stride;
            if (opts.progress && opts.progress(opts.progress_user, "bytes", done, total)) cancelled = 1;
        }
    }
    free(buf);
    XXH64_freeState(xs);
    native_close(n);
    if (cancelled) return set_err(err, errlen, DF_ECANCELLED, "verification cancelled");
    int problems = !sum->spine_ok + sum->n_bad_experts;
    if (problems) {
        char list[256] = "";
        for (int i = 0; i < n_first; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", first[i]);
        set_err(err, errlen, DF_EFORMAT,
                "%s, %d of %d routed experts corrupt or unreadable%s%s%s: the model files are damaged; re-run `deltafin convert`",
                sum->spine_ok ? "spine.bin OK" : "spine.bin CORRUPT", sum->n_bad_experts, sum->n_experts, n_first ? " (" : "", list,
                n_first ? (n_events > n_first ? ", ...)" : ")") : "");
        if (converted) convert_cache_hint(dir, err, errlen);
    }
    return problems;
}

/* ------------------------------------------------------------------ session */

int df_session_new(df_session **out, df_model *m, int n_ctx, char *err, size_t errlen) {
    *out = NULL;
    if (!m) return set_err(err, errlen, DF_EINVAL, "no model");
    int max = m->kv_positions; /* max_position_embeddings, or the KV reserve of a RAM budget */
    if (n_ctx <= 0 || n_ctx > max) n_ctx = max;
    df_session *s = calloc(1, sizeof *s);
    if (!s) return set_err(err, errlen, DF_ENOMEM, "out of memory");
    s->m = m;
    if (kv_init(&s->kv, &m->nat->cfg, n_ctx)) { free(s); return set_err(err, errlen, DF_ENOMEM, "out of memory"); }
    s->recurrent = kv_recurrent_bytes(&s->kv) > 0;
    s->snap_pos = -1;
    *out = s;
    return DF_OK;
}

void df_session_free(df_session *s) {
    if (!s) return;
    const df_backend *be = s->m->eng.be;
    if (be && be->seq_forget) be->seq_forget(s->kv.uid); /* the device's mirrors of this cache */
    kv_free(&s->kv);
    free(s->tokens);
    free(s->snap);
    free(s);
}

int df_session_n_past(const df_session *s) { return s ? s->n_past : 0; }
int df_session_n_ctx(const df_session *s) { return s ? s->kv.n_ctx : 0; }
df_model *df_session_model(const df_session *s) { return s ? s->m : NULL; }
const int32_t *df_session_tokens(const df_session *s) { return s ? s->tokens : NULL; }

/* Roll the recurrent state back to at most position `pos`: the snapshot when it is not past
 * pos, else the zero state (also when the snapshot was lost); the tokens after it become pending. */
static void session_rewind(df_session *s, int pos) {
    if (s->snap && s->snap_pos >= 0 && s->snap_pos <= pos) {
        char why[200] = "";
        if (kv_recurrent_load(&s->kv, s->snap, why, sizeof why) == DF_OK) {
            s->n_eval = s->snap_pos;
        } else { /* the state is reset: recomputed from the first token (the same tokens, later) */
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_SEQ_CST))
                fprintf(stderr, "deltafin: %s; the session's state is recomputed from its first token\n", why);
            s->snap_pos = -1;
            s->n_eval = 0;
        }
    } else {
        if (s->snap_pos >= 0) kv_recurrent_drop_snapshot(&s->kv); /* past pos: never loaded now */
        s->snap_pos = -1;
        kv_recurrent_reset(&s->kv);
        s->n_eval = 0;
    }
}

int df_session_truncate(df_session *s, int n_keep) {
    if (!s || n_keep < 0) return DF_EINVAL;
    if (n_keep >= s->n_past) return DF_OK;
    s->n_past = n_keep;
    if (s->snap_pos > n_keep) { /* it describes tokens that are gone */
        s->snap_pos = -1;
        kv_recurrent_drop_snapshot(&s->kv);
    }
    if (!s->recurrent) s->n_eval = n_keep;
    else if (s->n_eval > n_keep) session_rewind(s, n_keep);
    return DF_OK;
}

/* DF_EVAL_MARK on a recurrent model (m->mu held): evaluate the `pend` pending tokens in their own pass, then
 * take the rollback snapshot at n_past, before the call's tokens. */
static int eval_mark(df_session *s, int pend, char *err, size_t errlen) {
    int rc = DF_OK;
    if (pend > 0) {
        rc = forward(&s->m->eng, &s->kv, s->n_eval, s->tokens + s->n_eval, pend, NULL, 0, NULL, NULL, err, errlen);
        if (rc != DF_OK) return rc;
        s->n_eval = s->n_past;
    }
    if (!s->snap) s->snap = malloc((size_t)kv_recurrent_bytes(&s->kv));
    if (!s->snap) return set_err(err, errlen, DF_ENOMEM, "out of memory for the recurrent-state snapshot");
    s->snap_pos = -1;
    const int rs = kv_recurrent_save(&s->kv, s->snap, 1, err, errlen);
    if (rs) return rs;
    s->snap_pos = s->n_eval;
    return DF_OK;
}

/* Room for `need` tokens in s->tokens (doubling from 256); 0, or -1 out of memory (nothing changed). */
static int session_reserve_tokens(df_session *s, int need) {
    if (need <= s->tok_cap) return 0;
    int cap = s->tok_cap ? s->tok_cap : 256;
    while (cap < need) cap *= 2;
    int32_t *t = realloc(s->tokens, sizeof(int32_t) * (size_t)cap);
    if (!t) return -1;
    s->tokens = t;
    s->tok_cap = cap;
    return 0;
}

int df_eval(df_session *s, const int32_t *ids, int n, float *logits, int flags, df_progress_fn p, void *u, char *err,
            size_t errlen) {
    if (!s || (!ids && n > 0) || n < 0) return set_err(err, errlen, DF_EINVAL, "df_eval: bad arguments");
    if (n == 0) return DF_OK;
    df_model *m = s->m;
    if (s->n_past + n > s->kv.n_ctx)
        return set_err(err, errlen, DF_ECONTEXT, "context full: %d tokens in the session + %d new exceed its %d positions",
                       s->n_past, n, s->kv.n_ctx);
    if (session_reserve_tokens(s, s->n_past + n)) return set_err(err, errlen, DF_ENOMEM, "out of memory");
    /* pending tokens (recurrent models after a truncation) go first */
    int pend = s->n_past - s->n_eval;
    const int all = (flags & DF_EVAL_ALL_LOGITS) != 0;
    const int32_t *run_ids = ids;
    int32_t *joined = NULL;
    float *run_logits = logits;
    if (pend > 0) {
        joined = malloc(sizeof(int32_t) * (size_t)(pend + n));
        run_logits = all && logits ? malloc(sizeof(float) * (size_t)(pend + n) * df_model_n_vocab(m)) : logits;
        if (!joined || !run_logits) {
            free(joined);
            if (run_logits != logits) free(run_logits);
            return set_err(err, errlen, DF_ENOMEM, "out of memory");
        }
        memcpy(joined, s->tokens + s->n_eval, sizeof(int32_t) * (size_t)pend);
        memcpy(joined + pend, ids, sizeof(int32_t) * (size_t)n);
        run_ids = joined;
    }
    pthread_mutex_lock(&m->mu);
    double t0 = now_s();
    const int mark = (flags & DF_EVAL_MARK) && s->recurrent;
    int rc = mark ? eval_mark(s, pend, err, errlen) : DF_OK;
    if (mark && rc == DF_OK && pend > 0) { /* the pending tokens went through; the call's own tokens remain */
        run_ids = ids;
        if (run_logits != logits) free(run_logits);
        run_logits = logits;
        free(joined);
        joined = NULL;
        pend = 0;
    }
    if (rc == DF_OK) rc = forward(&m->eng, &s->kv, s->n_eval, run_ids, pend + n, run_logits, all, p, u, err, errlen);
    double dt = now_s() - t0;
    if (run_logits != logits) {
        if (rc == DF_OK) memcpy(logits, run_logits + (size_t)pend * df_model_n_vocab(m), sizeof(float) * (size_t)n * df_model_n_vocab(m));
        free(run_logits);
    }
    free(joined);
    if (rc != DF_OK && s->recurrent) session_rewind(s, s->n_past); /* a failed pass may have moved the state */
    if (rc == DF_OK) {
        memcpy(s->tokens + s->n_past, ids, sizeof(int32_t) * (size_t)n);
        s->n_past += n;
        s->n_eval = s->n_past;
        if (s->recurrent && pend + n > 1 && !mark) { /* snapshot at the end of a prompt: where a later turn returns to */
            if (!s->snap) s->snap = malloc((size_t)kv_recurrent_bytes(&s->kv));
            if (s->snap) /* without it (out of memory, a failed fetch from the GPU) a later turn recomputes */
                s->snap_pos = kv_recurrent_save(&s->kv, s->snap, 0, NULL, 0) == DF_OK ? s->n_eval : -1;
        }
        if (!m->stats_first_done) { m->ttft_s = dt; m->stats_first_done = 1; }
        /* the prompt's eval is the prefill even when the prompt is one token */
        if ((n > 1 && !(flags & DF_EVAL_MARK)) || s->n_past == n) { m->prefill_s += dt; m->prefill_tokens += (uint64_t)n; }
        else if (n > 1) { m->decode_s += dt; m->decode_tokens += (uint64_t)n; } /* a verification: n positions */
        else { m->decode_s += dt; m->decode_tokens += 1; }
        m->kv_bytes = kv_bytes(&s->kv);
        if (m->store) store_token_event(m->store, s->n_past - 1);
    }
    model_unlock(m);
    if (rc == DF_EFORMAT || rc == DF_EIO) convert_cache_hint(m->cache_dir, err, errlen);
    return rc;
}

/* -------------------------------------------------------- greedy decoding */

/* The tokens of df_decode_greedy so far: the stats and the store's per-token event of each evaluated one. */
static void greedy_account(df_session *s, int64_t base, int steps, double dt) {
    df_model *m = s->m;
    if (steps <= 0) return;
    if (!m->stats_first_done) { m->ttft_s = dt / steps; m->stats_first_done = 1; }
    if (base == 0) { /* the session's first token: the prefill, as df_eval counts it */
        m->prefill_s += dt / steps;
        m->prefill_tokens += 1;
        dt -= dt / steps;
        steps--;
    }
    m->decode_s += dt;
    m->decode_tokens += (uint64_t)steps;
    m->kv_bytes = kv_bytes(&s->kv);
    if (m->store)
        for (int64_t p = s->n_past - steps; p < s->n_past; p++) store_token_event(m->store, p);
}

/* One step of the device chain (m->mu held): the token at position s->n_past (ids[0], or with dev the device's last
 * argmax), its argmax into read-back slot `slot`; queued. On success the session holds the token (its id, when dev,
 * written once read back). */
static int greedy_step(df_session *s, const int32_t *id, int dev, int slot, float *logits, char *err, size_t errlen) {
    df_engine *e = &s->m->eng;
    e->dev_token = dev;
    e->argmax_on = 1;
    e->argmax_slot = slot;
    const int rc = forward(e, &s->kv, s->n_past, id, 1, logits, 0, NULL, NULL, err, errlen);
    e->dev_token = e->argmax_on = e->argmax_slot = 0;
    if (rc == DF_OK) {
        s->tokens[s->n_past] = dev ? 0 : id[0];
        s->n_past++;
        s->n_eval = s->n_past;
    }
    return rc;
}

/* Drop the session's last step of the chain (m->mu held): wait for its token in `slot` (the device is done with it),
 * then forget the token; the row it wrote lies past n_past. 0, or -1 when the wait failed (dropped all the same). */
static int greedy_drop(df_session *s, int slot) {
    int32_t t;
    const int r = s->m->eng.be->token_wait(slot, &t);
    s->n_past = s->n_eval = s->n_past - 1;
    return r ? -1 : 0;
}

int df_decode_greedy(df_session *s, int32_t id, int n, df_token_fn on_token, void *user, int *n_out, char *err,
                     size_t errlen) {
    if (n_out) *n_out = 0;
    if (!s || n < 0 || !on_token) return set_err(err, errlen, DF_EINVAL, "df_decode_greedy: bad arguments");
    if (n == 0) return DF_OK;
    df_model *m = s->m;
    const int V = df_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!logits) return set_err(err, errlen, DF_ENOMEM, "out of memory");
    int rc = DF_OK, got = 0;
    if (s->recurrent || s->n_past != s->n_eval || !eng_greedy_dev(&m->eng) ||
        m->eng.be->embed_dev(0, &m->eng.spine->embed) != 0) {
        /* the host picks each token: df_eval and the argmax, one after the other */
        for (int i = 0; i < n && rc == DF_OK; i++) {
            rc = df_eval(s, &id, 1, logits, 0, NULL, NULL, err, errlen);
            if (rc) break;
            id = df_sample(NULL, logits, V);
            got++;
            if (on_token(user, id)) break;
        }
        free(logits);
        if (n_out) *n_out = got;
        return rc;
    }
    if (session_reserve_tokens(s, s->n_past + n + 1)) {
        free(logits);
        return set_err(err, errlen, DF_ENOMEM, "out of memory");
    }
    /* Step j evaluates the token chosen by step j - 1 (step 0: id) at position base + j and chooses token j on the
     * device; step j + 1 is queued before token j is read back, so the device goes from one step to the next without
     * waiting for the host. A step queued for a token the caller then stops at is waited for and dropped: the
     * session ends as the host loop leaves it (the last token chosen, not evaluated; the row that step wrote lies
     * past n_past, where the next evaluation writes again). Not for recurrent state (no rollback of it here).
     * The device has one token slot and one pair of read-back slots (cuda_greedy.cu), so chains of models open on it
     * at once (a target and its draft model, used from two threads) take turns: g_greedy_mu, after m->mu. */
    pthread_mutex_lock(&m->mu);
    pthread_mutex_lock(&g_greedy_mu);
    const df_backend *be = m->eng.be;
    const int64_t base = s->n_past;
    const double t0 = now_s();
    int done = 0; /* steps whose token was read back */
    if (s->n_past + 1 > s->kv.n_ctx)
        rc = set_err(err, errlen, DF_ECONTEXT, "context full: %d tokens in the session + 1 new exceed its %d positions",
                     s->n_past, s->kv.n_ctx);
    else rc = greedy_step(s, &id, 0, 0, logits, err, errlen);
    for (int j = 0; rc == DF_OK && j < n; j++) {
        /* step j + 1, queued ahead unless it is past n or the context */
        const int ahead = j + 1 < n && s->n_past + 1 <= s->kv.n_ctx;
        int rc_ahead = ahead ? greedy_step(s, NULL, 1, (j + 1) & 1, logits, err, errlen) : DF_OK;
        int32_t tok;
        if (be->token_wait(j & 1, &tok)) {
            rc = set_err(err, errlen, DF_EUNSUPPORTED, "the GPU's greedy token: %s", df_cuda_last_error());
            if (ahead && rc_ahead == DF_OK) (void)greedy_drop(s, (j + 1) & 1); /* the step behind it */
            break;
        }
        done++;
        got++;
        if (ahead && rc_ahead == DF_OK) s->tokens[s->n_past - 1] = tok;
        const int stop = on_token(user, tok) != 0;
        if (rc_ahead != DF_OK) { rc = rc_ahead; break; }
        if (stop || j + 1 == n) {
            /* the step queued for this token is not wanted */
            if (ahead && greedy_drop(s, (j + 1) & 1))
                rc = set_err(err, errlen, DF_EUNSUPPORTED, "the GPU's greedy token: %s", df_cuda_last_error());
            break;
        }
        if (!ahead) {
            rc = set_err(err, errlen, DF_ECONTEXT, "context full: %d tokens in the session + 1 new exceed its %d positions",
                         s->n_past, s->kv.n_ctx);
            break;
        }
    }
    if (rc != DF_OK && done == 0 && s->n_past > base) (void)greedy_drop(s, 0); /* step 0's token never came back */
    greedy_account(s, base, (int)(s->n_past - base), now_s() - t0);
    pthread_mutex_unlock(&g_greedy_mu);
    model_unlock(m);
    free(logits);
    if (n_out) *n_out = got;
    return rc;
}

/* -------------------------------------------------------------------- stats */

/* The engine's counters (everything df_stats holds but the store's) copied into m->pub, with m->mu held: called
 * before every release of m->mu, so df_model_stats reads them without waiting for a running forward pass (a
 * /metrics scrape during a long prompt gets the counters of the last completed call and the store's live ones). */
static void stats_publish(df_model *m) {
    df_stats o;
    memset(&o, 0, sizeof o);
    o.ttft_s = m->ttft_s;
    o.prefill_s = m->prefill_s;
    o.decode_s = m->decode_s;
    o.prefill_tokens = m->prefill_tokens;
    o.decode_tokens = m->decode_tokens;
    o.weight_bytes_read = m->eng.weight_bytes - m->weight_bytes_base;
    o.io_stall_s = m->eng.io_wait_s - m->io_wait_base;
    o.resident_bytes = (m->stream ? sst_memory_bytes(m->stream) : m->nat->spine_bytes) + m->kv_bytes;
    for (int i = 0; i < DF_PHASES && i < 16; i++) o.phase_s[i] = m->eng.phase_s[i] - m->phase_base[i];
    o.expert_union_count = m->eng.touched_n;
    o.spine_bytes_streamed = m->stream ? sst_bytes_read(m->stream) - m->spine_stream_base : 0;
    o.expert_union_bytes = m->eng.touched_n * m->nat->stride;
    o.prefetch_steps_on = m->eng.pf_steps[0];
    o.prefetch_steps_off = m->eng.pf_steps[1];
    o.routed_picks = m->eng.routed_picks;
    o.routed_union = m->eng.routed_union;
    pthread_mutex_lock(&m->stats_mu);
    m->pub = o;
    pthread_mutex_unlock(&m->stats_mu);
}

/* Release m->mu after publishing the counters the holder may have moved. */
static void model_unlock(df_model *m) {
    stats_publish(m);
    pthread_mutex_unlock(&m->mu);
}

void df_model_stats(const df_model *m, df_stats *o) {
    memset(o, 0, sizeof *o);
    if (!m) return;
    pthread_mutex_t *smu = (pthread_mutex_t *)&m->stats_mu;
    pthread_mutex_lock(smu);
    *o = m->pub;
    pthread_mutex_unlock(smu);
    if (m->store) { /* live: the store keeps its own lock */
        store_stats ss;
        store_get_stats(m->store, &ss);
        o->expert_bytes_demand = ss.bytes_demand;
        o->expert_bytes_prefetch = ss.bytes_prefetch;
        o->expert_hits = ss.hits;
        o->expert_misses = ss.misses;
        o->prefetch_useful = ss.prefetch_useful;
        o->prefetch_issued = ss.prefetch_issued;
        o->resident_bytes += ss.resident_bytes;
        o->expert_slots_pinned = ss.n_slots_pinned;
        o->expert_slots = ss.slot_bytes ? (int)(ss.resident_bytes / ss.slot_bytes) : 0;
        o->n_drives = ss.n_drives < 16 ? ss.n_drives : 16;
        for (int d = 0; d < o->n_drives; d++) {
            o->drive_bytes[d] = ss.drive_bytes[d];
            o->drive_busy_s[d] = ss.drive_busy_s[d];
        }
    }
}

int df_model_expert_map(const df_model *m, unsigned char *state, float *heat, int cap, int *moe_layers,
                        int *experts, int *layer_ids) {
    if (!m || !m->nat || m->nat->n_moe_layers <= 0 || m->nat->n_experts <= 0) return -1;
    const int nl = m->nat->n_moe_layers, ne = m->nat->n_experts;
    if (moe_layers) *moe_layers = nl;
    if (experts) *experts = ne;
    if (!state) return nl * ne;
    if (cap < nl * ne) return -1;
    for (int i = 0; i < nl; i++) {
        const int layer = m->nat->moe_layers[i].layer;
        if (layer_ids) layer_ids[i] = layer;
        unsigned char *st = state + (size_t)i * ne;
        float *ht = heat ? heat + (size_t)i * ne : NULL;
        if (m->store) store_map(m->store, layer, st, ht);
        else {
            memset(st, 0, (size_t)ne);
            if (ht) memset(ht, 0, sizeof(float) * (size_t)ne);
        }
        if (m->eng.be && m->eng.be->dev_has) /* the GPU tier: its own flag beside the host state */
            for (int e = 0; e < ne; e++)
                if (eng_dev_resident(&m->eng, layer, e)) st[e] |= 4;
    }
    return nl * ne;
}

void df_model_stats_reset(df_model *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stats_first_done = 0;
    m->ttft_s = m->prefill_s = m->decode_s = 0;
    m->prefill_tokens = m->decode_tokens = 0;
    m->weight_bytes_base = m->eng.weight_bytes;
    m->io_wait_base = m->eng.io_wait_s;
    memcpy(m->phase_base, m->eng.phase_s, sizeof m->phase_base);
    m->spine_stream_base = m->stream ? sst_bytes_read(m->stream) : 0;
    if (m->eng.touched) memset(m->eng.touched, 0, (size_t)m->nat->cfg.num_hidden_layers * m->nat->cfg.n_routed_experts);
    m->eng.touched_n = 0;
    m->eng.pf_steps[0] = m->eng.pf_steps[1] = 0;
    m->eng.routed_picks = m->eng.routed_union = 0;
    if (m->store) store_reset_stats(m->store);
    model_unlock(m);
}

int df_model_preload(df_model *m, df_progress_fn progress, void *user, df_preload_info *info, char *err, size_t errlen) {
    df_preload_info tmp;
    if (!info) info = &tmp;
    memset(info, 0, sizeof *info);
    if (!m) return set_err(err, errlen, DF_EINVAL, "df_model_preload: no model");
    if (!m->store) { info->complete = 1; return DF_OK; } /* no routed experts */
    if (m->streamed)
        return set_err(err, errlen, DF_EUNSUPPORTED, "this is a streamed install: preloading would fetch every routed expert "
                       "over the network (the whole model); complete it with `deltafin setup REPO --full`, or fetch the "
                       "likely ones ahead with `deltafin warm`");
    pthread_mutex_lock(&m->mu);
    store_stats ss;
    store_get_stats(m->store, &ss);
    const double t0 = df_now();
    eng_preload_result r;
    store_set_heat_counting(m->store, 0); /* reading everything once says nothing about which experts are hot */
    const int rc = eng_preload(&m->eng, ss.n_slots, progress, user, &r, err, errlen);
    store_set_heat_counting(m->store, 1);
    model_unlock(m);
    info->experts_total = r.total;
    info->on_device = r.on_device;
    info->in_host = r.in_host;
    info->bytes_read = r.bytes;
    info->seconds = df_now() - t0;
    info->complete = r.on_device + r.in_host >= r.total;
    return rc;
}

const char *df_preload_describe(const df_preload_info *in, char *out, size_t cap) {
    if (in->experts_total == 0)
        snprintf(out, cap, "preload: the model has no routed experts (nothing to read)");
    else
        snprintf(out, cap, "preload: %d of %d routed experts in memory (%d in GPU memory, %d in the host cache)%s, %.2f GB read "
                 "in %.1f s (%.2f GB/s)", in->on_device + in->in_host, in->experts_total, in->on_device, in->in_host,
                 in->complete ? "" : ": the budgets hold no more", in->bytes_read / 1e9, in->seconds,
                 in->seconds > 0 ? in->bytes_read / 1e9 / in->seconds : 0);
    return out;
}

/* ----------------------------------------------------------- architecture */

int df_checkpoint_describe(const char *path, char *buf, size_t cap, char *err, size_t errlen) {
    if (!path || !buf || !cap) return set_err(err, errlen, DF_EINVAL, "df_checkpoint_describe: bad arguments");
    char cp[4200];
    snprintf(cp, sizeof cp, "%s/config.json", path);
    char *txt = NULL;
    int rc = df_read_file(cp, &txt, NULL, err, errlen);
    if (rc) return rc;
    df_config *cfg = malloc(sizeof *cfg);
    if (!cfg) { free(txt); return set_err(err, errlen, DF_ENOMEM, "out of memory"); }
    rc = config_parse(txt, cfg, cp, err, errlen);
    free(txt);
    if (rc == DF_OK) config_describe(cfg, buf, cap);
    free(cfg);
    return rc;
}

const char *df_phase_name(int phase) {
    static const char *const names[DF_PHASES] = {"embed", "norm+residual", "mla", "kda", "router", "experts",
                                                  "dense-mlp", "io-wait", "prefetch", "lm-head", "kda-proj"};
    return phase >= 0 && phase < DF_PHASES ? names[phase] : "?";
}

/* ------------------------------------------------------------ batched eval */

/* Room for n more tokens in s->tokens. */
static int batch_tokens_room(df_session *s, int n) {
    if (s->n_past + n <= s->tok_cap) return DF_OK;
    int cap = s->tok_cap ? s->tok_cap : 256;
    while (cap < s->n_past + n) cap *= 2;
    int32_t *t = realloc(s->tokens, sizeof(int32_t) * (size_t)cap);
    if (!t) return DF_ENOMEM;
    s->tokens = t;
    s->tok_cap = cap;
    return DF_OK;
}

int df_eval_batch(df_session *const *ss, const int32_t *const *ids, const int *n, int n_seq, float *logits, int flags,
                  char *err, size_t errlen) {
    if (!ss || !ids || !n || n_seq < 0) return set_err(err, errlen, DF_EINVAL, "df_eval_batch: bad arguments");
    if (n_seq == 0) return DF_OK;
    df_model *m = ss[0] ? ss[0]->m : NULL;
    int total = 0, any_pend = 0;
    for (int i = 0; i < n_seq; i++) {
        df_session *s = ss[i];
        if (!s || !ids[i] || n[i] < 1)
            return set_err(err, errlen, DF_EINVAL, "df_eval_batch: sequence %d has no session, no ids or %d tokens (at least 1)",
                           i, s && ids[i] ? n[i] : 0);
        if (s->m != m) return set_err(err, errlen, DF_EINVAL, "df_eval_batch: sequence %d's session belongs to another model", i);
        for (int k = 0; k < i; k++)
            if (ss[k] == s) return set_err(err, errlen, DF_EINVAL, "df_eval_batch: sequences %d and %d are the same session", k, i);
        if (s->n_past + n[i] > s->kv.n_ctx)
            return set_err(err, errlen, DF_ECONTEXT,
                           "context full: sequence %d has %d tokens in its session + %d new, more than its %d positions", i,
                           s->n_past, n[i], s->kv.n_ctx);
        if (batch_tokens_room(s, n[i])) return set_err(err, errlen, DF_ENOMEM, "out of memory");
        any_pend |= s->n_past > s->n_eval;
        total += s->n_past - s->n_eval + n[i];
    }
    const int V = df_model_n_vocab(m), all = (flags & DF_EVAL_ALL_LOGITS) != 0;
    /* the rows: per session its pending tokens (recurrent models after a truncation), then the new ones */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)total);
    df_seq_rows *seq = malloc(sizeof(df_seq_rows) * (size_t)n_seq);
    float *run_logits = all && any_pend && logits ? malloc(sizeof(float) * (size_t)total * V) : logits;
    if (!rows || !seq || (all && any_pend && logits && !run_logits)) {
        free(rows);
        free(seq);
        if (run_logits != logits) free(run_logits);
        return set_err(err, errlen, DF_ENOMEM, "out of memory");
    }
    for (int i = 0, r = 0; i < n_seq; i++) {
        df_session *s = ss[i];
        const int pend = s->n_past - s->n_eval;
        memcpy(rows + r, s->tokens + s->n_eval, sizeof(int32_t) * (size_t)pend);
        memcpy(rows + r + pend, ids[i], sizeof(int32_t) * (size_t)n[i]);
        seq[i] = (df_seq_rows){&s->kv, s->n_eval, pend + n[i]};
        r += pend + n[i];
    }
    pthread_mutex_lock(&m->mu);
    const double t0 = now_s();
    int rc = forward_batch(&m->eng, seq, n_seq, rows, run_logits, all, NULL, NULL, err, errlen);
    const double dt = now_s() - t0;
    if (run_logits != logits) {
        if (rc == DF_OK) /* drop the pending rows' logits */
            for (int i = 0, r = 0, o = 0; i < n_seq; i++) {
                const int pend = seq[i].T - n[i];
                memcpy(logits + (size_t)o * V, run_logits + (size_t)(r + pend) * V, sizeof(float) * (size_t)n[i] * V);
                r += seq[i].T;
                o += n[i];
            }
        free(run_logits);
    }
    if (rc == DF_OK) {
        int n_decode = 0;
        uint64_t n_prefill = 0;
        uint64_t kvb = 0;
        for (int i = 0; i < n_seq; i++) {
            df_session *s = ss[i];
            memcpy(s->tokens + s->n_past, ids[i], sizeof(int32_t) * (size_t)n[i]);
            s->n_past += n[i];
            s->n_eval = s->n_past;
            if (s->recurrent && seq[i].T > 1) { /* snapshot at the end of a prompt, as df_eval */
                if (!s->snap) s->snap = malloc((size_t)kv_recurrent_bytes(&s->kv));
                if (s->snap) s->snap_pos = kv_recurrent_save(&s->kv, s->snap, 0, NULL, 0) == DF_OK ? s->n_eval : -1;
            }
            if (n[i] > 1 || s->n_past == n[i]) n_prefill += (uint64_t)n[i];
            else n_decode++;
            kvb += kv_bytes(&s->kv);
            if (m->store) store_token_event(m->store, s->n_past - 1);
        }
        if (!m->stats_first_done) { m->ttft_s = dt; m->stats_first_done = 1; }
        if (n_prefill) { m->prefill_s += dt; m->prefill_tokens += n_prefill + (uint64_t)n_decode; }
        else { m->decode_s += dt; m->decode_tokens += (uint64_t)n_decode; }
        m->kv_bytes = kvb;
    } else {
        for (int i = 0; i < n_seq; i++)
            if (ss[i]->recurrent) session_rewind(ss[i], ss[i]->n_past); /* a failed pass may have moved the state */
    }
    model_unlock(m);
    free(rows);
    free(seq);
    if (rc == DF_EFORMAT || rc == DF_EIO) convert_cache_hint(m->cache_dir, err, errlen);
    return rc;
}

int df_backend_available(const char *name, char *buf, size_t len) {
    char tmp[320];
    if (!buf || !len) { buf = tmp; len = sizeof tmp; }
    const df_backend *be = df_backend_get(name);
    if (!be) {
        df_backend_why(name, buf, len);
        return 0;
    }
    if (!strcmp(be->name, "cuda")) {
        char dev[160];
        df_cuda_describe(dev, sizeof dev);
        snprintf(buf, len, "cuda: %s", dev);
    } else {
        snprintf(buf, len, "%s", be->name);
    }
    return 1;
}
