/*
 * cuda_runtime.cu — the CUDA backend's runtime: device discovery, the weight
 * cache in GPU memory, and the host-side entry points of kernels/cuda.h.
 *
 * Weight cache: a hash map from a weight's identity (df_weight.dev_key, or its
 * host address when dev_key is 0) to one device allocation holding its data and
 * scale arrays. Spine weights (address keys) stay until df_cuda_cache_clear;
 * routed experts (DF_DEVKEY keys) live under the expert budget and are evicted
 * least recently used first. A weight that cannot be cached (no room, or
 * address caching off during spine streaming) is copied into a scratch buffer
 * for the call. Cached weights are allocated and freed stream-ordered
 * (cudaMallocAsync / cudaFreeAsync on the one stream). Every entry point but
 * df_cuda_host_pin / df_cuda_host_unpin (driver calls only) holds one mutex:
 * calls from several host threads run one after another on one stream.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "kernels/cuda_env.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_pin_off; /* set once by probe_once */
pthread_once_t g_once = PTHREAD_ONCE_INIT;
int g_ndev = 0;
char g_why[256];
char g_err[256];
cudaStream_t g_st;

constexpr uint64_t RESERVE = 1ull << 30; /* device memory left free for scratch and the CUDA context */
constexpr int NBUCKET = 1 << 16;

struct Entry {
    uint64_t key;
    int type;
    int64_t rows, cols;
    void *dev;          /* data, then scale at dev + scale_off */
    size_t bytes, scale_off;
    int expert, has_scale;
    int pins;           /* > 0: in use by a caller of df_cuda_pin (not evicted) */
    uint64_t tick;
    int next;           /* bucket chain; -1 = end; free-list link when unused */
    int used;
};

Entry *g_ent;
int g_nent, g_cap, g_free = -1;
int g_bucket[NBUCKET];
int g_inited_map;
uint64_t g_tick, g_budget;
int g_by_addr = 1;
df_cuda_stats g_stats;

/* scratch: x, y, an uncached weight (device); x and y staging in pinned host memory (asynchronous copies) */
void *g_sx, *g_sy, *g_sw, *g_hx, *g_hy, *g_sg, *g_su;
size_t g_csx, g_csy, g_csw, g_chx, g_chy, g_csg, g_csu;
/* A layer's device routing per caller (Resid.route): the picks' ids copied into pinned host memory (ids), the call that
 * queued that copy (qcall: 0 = none pending) and whether they arrived and are not yet reported (ready). */
struct RouteIds {
    int ids[CU_ROUTE_MAXK];
    int k, ready, tag; /* tag: the experts' DF_DEVKEY tag */
    uint64_t qcall;
};
int g_npend; /* routings queued whose ids have not arrived */
/* The device residual streams (df_backend.moe_resid / mla_block with x NULL), one per caller key (an engine): an
 * engine's rows stay its own when several engines (a target and its draft model) take turns on the device. */
struct Resid {
    uint64_t key, tick;
    void *p;
    size_t cap; /* bytes */
    int valid;  /* an mla_block call wrote it (x_out) */
    /* the shared expert an mla_block started for the next moe_resid (cu_rt_shared_start): its output sh_out and
     * intermediates, the weights and activation it ran with; sh_valid: started, not yet taken */
    void *sh_out, *sh_g, *sh_u;
    size_t sh_oc, sh_gc, sh_uc;
    const df_weight *sh_w[3];
    int sh_act, sh_valid;
    float sh_beta, sh_lb;
    RouteIds *route; /* [DF_MAX_LAYERS], pinned (cu_rt_moe_route) */
};
constexpr int NRESID = 16;
Resid g_resid[NRESID];
uint64_t g_resid_tick;
int g_sh_early_off; /* DF_CUDA_SHARED_EARLY=0: mla_block starts no shared expert (cu_rt_shared_start) */
/* The side stream of a started shared expert (cu_rt_shared_start, DF_CUDA_SIDE_STREAM): its kernels run there beside
 * the routed experts on g_st; g_sh_done is recorded after them, and g_sh_pend says g_st has not yet waited for it. */
int g_side_off;
cudaStream_t g_st2;
cudaEvent_t g_sh_done;
int g_sh_pend;
uint64_t g_call;    /* the entry points' calls, numbered (trace_begin) */

/* Per model tag and layer (DF_DEVKEY's): how many of its routed experts' matrices are cached now, a generation bumped on every
 * insert or drop of one, and the device table of their arrays [E][6] (cu_rt_moe_route) built for generation tgen. */
struct LayerTab {
    int n;
    uint64_t gen, tgen;
    void **dev;
    int E, ok, tgu, tdn;
    int64_t I, D;
};
LayerTab g_lt[DF_DEV_TAGS][DF_MAX_LAYERS];
void layer_count(uint64_t key, int d) {
    if (!(key >> 63)) return;
    const int tag = DF_DEVKEY_TAG(key), l = DF_DEVKEY_LAYER(key);
    if (tag < DF_DEV_TAGS) {
        g_lt[tag][l].n += d;
        g_lt[tag][l].gen++;
    }
}
/* The key's residual entry, or NULL. */
Resid *resid_of(uint64_t key) {
    for (int i = 0; i < NRESID; i++)
        if (g_resid[i].key == key && g_resid[i].p) return &g_resid[i];
    return NULL;
}

int fail(const char *what, cudaError_t e) {
    snprintf(g_err, sizeof g_err, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}
#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return fail(#call, e_); } while (0)

void probe_once() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* "driver version is insufficient" also when there is no driver at all: say so when libcuda cannot load */
        void *drv = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) : NULL;
        if (drv) dlclose(drv);
        snprintf(g_why, sizeof g_why, "no CUDA device (cudaGetDeviceCount: %s)",
                 e == cudaErrorInsufficientDriver && !drv ? "no NVIDIA driver found (libcuda.so.1 not loadable)"
                                                          : cudaGetErrorString(e));
        return;
    }
    if (n <= 0) {
        snprintf(g_why, sizeof g_why, "no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
        snprintf(g_why, sizeof g_why, "no usable CUDA device (cudaGetDeviceProperties: %s)", cudaGetErrorString(e));
        return;
    }
    if (p.major < 9) {
        snprintf(g_why, sizeof g_why, "CUDA device 0 (%s) is sm_%d%d; this build has kernels for sm_90 and later only",
                 p.name, p.major, p.minor);
        return;
    }
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(g_why, sizeof g_why, "CUDA device 0 cannot be used (%s)", cudaGetErrorString(e));
        return;
    }
    g_ndev = n;
    /* the kernel variants (one token: DF_CUDA_MV_ROWS, T >= 2: DF_CUDA_TILE) and DF_CUDA_HOST_PIN=0|off (host
     * buffers stay pageable, a developer comparison), docs/cuda.md, validated in cuda_env.h: an invalid value is no
     * device, with the reason naming the variable (never silently the default) */
    int mv = 0, tl = 0;
    if (df_cuda_env_variant("DF_CUDA_MV_ROWS", &mv, g_why, sizeof g_why) < 0) { g_ndev = 0; return; }
    if (df_cuda_env_variant("DF_CUDA_TILE", &tl, g_why, sizeof g_why) < 0) { g_ndev = 0; return; }
    const int pin = df_cuda_env_switch("DF_CUDA_HOST_PIN", g_why, sizeof g_why);
    if (pin < 0) { g_ndev = 0; return; }
    const int split = df_cuda_env_switch("DF_CUDA_SPLIT", g_why, sizeof g_why);
    if (split < 0) { g_ndev = 0; return; }
    const int early = df_cuda_env_switch("DF_CUDA_SHARED_EARLY", g_why, sizeof g_why);
    if (early < 0) { g_ndev = 0; return; }
    g_sh_early_off = early == 0;
    /* DF_CUDA_SIDE_STREAM=0|off: a started shared expert runs on the main stream */
    const int side = df_cuda_env_switch("DF_CUDA_SIDE_STREAM", g_why, sizeof g_why);
    if (side < 0) { g_ndev = 0; return; }
    g_side_off = side == 0;
    /* DF_CUDA_PDL=0|off: kernels launched without programmatic dependent launch (cuda_launch.cuh) */
    const int pdl = df_cuda_env_switch("DF_CUDA_PDL", g_why, sizeof g_why);
    if (pdl < 0) { g_ndev = 0; return; }
    g_cu_pdl = pdl;
    /* DF_CUDA_COPY_KERNEL=0|off: small host <-> device copies by cudaMemcpyAsync (cu_copy_launch) */
    const int ck = df_cuda_env_switch("DF_CUDA_COPY_KERNEL", g_why, sizeof g_why);
    if (ck < 0) { g_ndev = 0; return; }
    g_cu_copy_kernel = ck;
    if (df_cuda_env_switch("DF_CUDA_MOE_ROUTE", g_why, sizeof g_why) < 0) { g_ndev = 0; return; }
    if (!split) cu_set_split(0);
    if (mv) cu_set_matvec_rows(mv);
    if (tl) cu_set_tile(tl);
    g_pin_off = pin == 0;
    /* DF_CUDA_MMA, encodings on the tensor-core kernel: a mask of 1 << df_wtype, decimal or 0x hex (cuda_env.h);
     * an invalid value is no device, with the reason naming the variable (never silently the default) */
    unsigned mma = 0;
    const int mma_set = df_cuda_env_mma(&mma, g_why, sizeof g_why);
    if (mma_set < 0) { g_ndev = 0; return; }
    if (mma_set) cu_set_mma(mma);
    int ks = 0;
    if (df_cuda_env_ks(&ks, g_why, sizeof g_why) < 0) { g_ndev = 0; return; }
    if (ks) cu_set_mma_ks(ks);
    /* DF_CUDA_KV_MIRROR (the attention core's KV mirror, cuda_attn.cu): validated here too, so an invalid value is no
     * device for every caller */
    unsigned long long kvm = 0;
    if (df_cuda_env_kv_mirror(&kvm, g_why, sizeof g_why) < 0) { g_ndev = 0; return; }
}

int ready() {
    pthread_once(&g_once, probe_once);
    if (!g_ndev) {
        snprintf(g_err, sizeof g_err, "%s", g_why);
        return 0;
    }
    return 1;
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Bytes of a weight's data / scale arrays (model/weights.h layouts). */
size_t data_bytes(df_wtype t, int64_t r, int64_t c) {
    switch (t) {
    case DF_W_F32: return (size_t)(r * c * 4);
    case DF_W_BF16: case DF_W_F16: return (size_t)(r * c * 2);
    case DF_W_FP8_B128: case DF_W_INT8_ROW: return (size_t)(r * c);
    case DF_W_INT4_G32: case DF_W_MXFP4: return (size_t)(r * c / 2);
    default: return 0;
    }
}
size_t scale_bytes(df_wtype t, int64_t r, int64_t c) {
    switch (t) {
    case DF_W_FP8_B128: return (size_t)(((r + 127) / 128) * ((c + 127) / 128) * 4);
    case DF_W_INT4_G32: return (size_t)(r * (c / 32) * 2);
    case DF_W_MXFP4: return (size_t)(r * (c / 32));
    case DF_W_INT8_ROW: return (size_t)(r * 4);
    default: return 0;
    }
}

int grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    if (*p) cudaFree(*p);
    *p = NULL;
    *cap = 0;
    size_t n = round_up(need, 1 << 20);
    const cudaError_t e = cudaMalloc(p, n);
    if (e != cudaSuccess) {
        *p = NULL;
        cudaGetLastError(); /* not sticky: clear it, or the next launch's check would report it */
        return fail("cudaMalloc(p, n)", e);
    }
    *cap = n;
    return 0;
}

int grow_host(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    if (*p) cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    size_t n = round_up(need, 1 << 20);
    CK(cudaHostAlloc(p, n, cudaHostAllocDefault));
    *cap = n;
    return 0;
}

uint64_t key_of(const df_weight *w) { return w->dev_key ? w->dev_key : (uint64_t)(uintptr_t)w->data; }
unsigned bucket_of(uint64_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 48) & (NBUCKET - 1); }

void map_init() {
    if (g_inited_map) return;
    for (int i = 0; i < NBUCKET; i++) g_bucket[i] = -1;
    g_inited_map = 1;
}

Entry *find(uint64_t key) {
    map_init();
    for (int i = g_bucket[bucket_of(key)]; i >= 0; i = g_ent[i].next)
        if (g_ent[i].key == key) return &g_ent[i];
    return NULL;
}

void drop(int idx) {
    cu_rt_sh_join(); /* the side stream may still read it */
    Entry *e = &g_ent[idx];
    int *pp = &g_bucket[bucket_of(e->key)];
    while (*pp != idx) pp = &g_ent[*pp].next;
    *pp = e->next;
    cudaFreeAsync(e->dev, g_st); /* after the work queued on g_st that may still read it */
    (e->expert ? g_stats.expert_bytes : g_stats.spine_bytes) -= e->bytes;
    if (e->expert) layer_count(e->key, -1);
    e->used = 0;
    e->next = g_free;
    g_free = idx;
}

/* Evict the least recently used expert; 0 if there was none. */
int evict_one() {
    int best = -1;
    for (int i = 0; i < g_nent; i++)
        if (g_ent[i].used && g_ent[i].expert && !g_ent[i].pins && (best < 0 || g_ent[i].tick < g_ent[best].tick)) best = i;
    if (best < 0) return 0;
    drop(best);
    return 1;
}

/* Make room for `need` bytes (of an expert when `expert`); 0 = there is room. */
int room_for(size_t need, int expert) {
    int synced = 0;
    for (;;) {
        if (expert && g_budget && g_stats.expert_bytes + need > g_budget) {
            if (!evict_one()) return -1;
            continue;
        }
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
        if (fr >= need + RESERVE) return 0;
        /* a stream-ordered free (cudaFreeAsync) returns its memory at the next synchronisation: make the frees
         * count before evicting (more) or giving up */
        if (!synced) {
            if (cudaStreamSynchronize(g_st) != cudaSuccess) return -1;
            synced = 1;
            continue;
        }
        if (!expert || !evict_one()) return -1;
        synced = 0;
    }
}

/* DF_CUDA_TRACE (cuda_trace.c): the device time of the last entry point's work, from an event recorded when it
 * took the mutex (trace_begin) to one recorded just before its closing synchronisation (cu_rt_sync), with events
 * between its stages (cu_rt_mark); after the synchronisation each stage's time (from the previous mark) is added to
 * a table by stage name (printed at exit by df_cuda_trace_stages). */
enum { TR_MARKS = 16, TR_STAGES = 48 };
int g_trace = -1; /* -1: not yet read from the environment; 1: events and host clocks; 2: host clocks only */
double g_h0, g_h1, g_h2; /* host clock: the mutex taken, the closing synchronisation called, and returned */
int g_hdone;
cudaEvent_t g_tev[TR_MARKS];
const char *g_tname[TR_MARKS];
int g_nmark, g_tev_done;
struct TrStage { const char *name; double s; unsigned long long n; } g_tst[TR_STAGES];
int g_ntst;

double host_now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void trace_begin() {
    if (g_trace < 0) {
        const int v = df_cuda_env_trace(NULL, 0);
        g_trace = v > 0 ? v : 0;
        for (int i = 0; g_trace == 1 && i < TR_MARKS; i++)
            if (cudaEventCreate(&g_tev[i]) != cudaSuccess) g_trace = 2;
    }
    g_call++; /* an entry point begins */
    g_nmark = 0;
    g_tev_done = 0;
    g_hdone = 0;
    if (g_trace > 0) g_h0 = host_now();
    if (g_trace == 1 && cudaEventRecord(g_tev[0], g_st) == cudaSuccess) { g_tname[0] = "start"; g_nmark = 1; }
}

/* The device routings queued by calls up to number upto have arrived (their ids copied to the host): each reported
 * once by df_cuda_moe_routed, and their experts' entries count as used now (recency and hits, as a lookup would). */
void route_settle(uint64_t upto) {
    for (int i = 0; i < NRESID && g_npend > 0; i++) {
        RouteIds *ro = g_resid[i].route;
        if (!ro) continue;
        for (int l = 0; l < DF_MAX_LAYERS; l++) {
            RouteIds *q = &ro[l];
            if (!q->qcall || q->qcall > upto) continue;
            q->qcall = 0;
            q->ready = 1;
            g_npend--;
            for (int k = 0; k < q->k; k++)
                for (int p = 0; p < 3; p++) {
                    Entry *e = find(DF_DEVKEY(q->tag, l, q->ids[k], p));
                    if (!e) continue;
                    e->tick = ++g_tick;
                    g_stats.expert_hits++;
                }
        }
    }
}

} // namespace

/* A stage of the current entry point ends here (DF_CUDA_TRACE; name: a string literal). */
void cu_rt_mark(const char *name) {
    if (g_trace == 1 && g_nmark > 0 && g_nmark < TR_MARKS && cudaEventRecord(g_tev[g_nmark], g_st) == cudaSuccess)
        g_tname[g_nmark++] = name;
}

namespace {

int upload(const df_weight *w, void *dev, size_t dbytes, size_t soff, size_t sbytes) {
    CK(cudaMemcpyAsync(dev, w->data, dbytes, cudaMemcpyHostToDevice, g_st));
    if (sbytes) CK(cudaMemcpyAsync((char *)dev + soff, w->scale, sbytes, cudaMemcpyHostToDevice, g_st));
    g_stats.uploaded_bytes += dbytes + sbytes;
    return 0;
}

/* The device copy of w's arrays: *data, *scale (cached, or in the scratch buffer for this call). */
int weight_on_device(const df_weight *w, const void **data, const void **scale) {
    const size_t db = data_bytes(w->type, w->rows, w->cols);
    const size_t sb = w->scale ? scale_bytes(w->type, w->rows, w->cols) : 0;
    const size_t soff = round_up(db, 256), total = soff + sb;
    const int expert = w->dev_key != 0;
    const int cacheable = expert || g_by_addr;
    const uint64_t key = key_of(w);
    if (cacheable) {
        Entry *e = find(key);
        if (e && !e->pins && (e->type != (int)w->type || e->rows != w->rows || e->cols != w->cols)) {
            drop((int)(e - g_ent));
            e = NULL;
        }
        if (e) {
            e->tick = ++g_tick;
            if (expert) g_stats.expert_hits++;
            *data = e->dev;
            *scale = e->has_scale ? (char *)e->dev + e->scale_off : NULL;
            return 0;
        }
        if (!w->data) {
            snprintf(g_err, sizeof g_err, "weight %llx is neither cached on the GPU nor in host memory", (unsigned long long)key);
            return -1;
        }
        if (expert) g_stats.expert_misses++;
        void *dev = NULL;
        /* stream-ordered: an allocation or an eviction does not wait for the device */
        if (room_for(total, expert) == 0 && cudaMallocAsync(&dev, total, g_st) == cudaSuccess) {
            if (upload(w, dev, db, soff, sb)) { cudaFreeAsync(dev, g_st); return -1; }
            int idx;
            if (g_free >= 0) {
                idx = g_free;
                g_free = g_ent[idx].next;
            } else {
                if (g_nent == g_cap) {
                    int nc = g_cap ? 2 * g_cap : 1024;
                    Entry *ne = (Entry *)realloc(g_ent, sizeof(Entry) * (size_t)nc);
                    if (!ne) { cudaFreeAsync(dev, g_st); snprintf(g_err, sizeof g_err, "out of host memory"); return -1; }
                    g_ent = ne;
                    g_cap = nc;
                }
                idx = g_nent++;
            }
            Entry *n = &g_ent[idx];
            n->key = key; n->type = w->type; n->rows = w->rows; n->cols = w->cols;
            n->dev = dev; n->bytes = total; n->scale_off = soff; n->expert = expert; n->has_scale = sb > 0; n->pins = 0;
            n->tick = ++g_tick; n->used = 1;
            const unsigned b = bucket_of(key);
            n->next = g_bucket[b];
            g_bucket[b] = idx;
            (expert ? g_stats.expert_bytes : g_stats.spine_bytes) += total;
            if (expert) layer_count(key, 1);
            *data = dev;
            *scale = sb ? (char *)dev + soff : NULL;
            return 0;
        }
        cudaGetLastError(); /* a failed cudaMalloc is not sticky; clear it */
    }
    if (grow(&g_sw, &g_csw, total)) return -1;
    if (upload(w, g_sw, db, soff, sb)) return -1;
    *data = g_sw;
    *scale = sb ? (char *)g_sw + soff : NULL;
    return 0;
}

/* x [bytes] into the device scratch g_sx through the pinned staging g_hx (both grown by the caller), queued on g_st. */
int stage_in(const void *x, size_t bytes) {
    memcpy(g_hx, x, bytes);
    CK(cu_copy_launch(g_sx, g_hx, bytes, cudaMemcpyHostToDevice, g_st));
    return 0;
}
/* The first `bytes` of the device scratch g_sy back through the pinned staging g_hy (both grown by the caller): the
 * copy, the call's closing synchronisation (stage: its trace name, a string literal), then into y (NULL: the caller
 * reads g_hy). */
int stage_out(void *y, size_t bytes, const char *stage) {
    CK(cu_copy_launch(g_hy, g_sy, bytes, cudaMemcpyDeviceToHost, g_st));
    CK(cu_rt_sync(stage));
    if (y) memcpy(y, g_hy, bytes);
    return 0;
}

int matmul_locked(const df_weight *w, const float *x, int T, float *y) {
    const void *d, *s;
    if (weight_on_device(w, &d, &s)) return -1;
    const size_t xb = sizeof(float) * (size_t)T * (size_t)w->cols, yb = sizeof(float) * (size_t)T * (size_t)w->rows;
    if (grow(&g_sx, &g_csx, xb) || grow(&g_sy, &g_csy, yb)) return -1;
    if (grow_host(&g_hx, &g_chx, xb) || grow_host(&g_hy, &g_chy, yb)) return -1;
    if (stage_in(x, xb)) return -1;
    cu_rt_mark("matmul: copy in");
    CK(cu_matmul_launch(w->type, d, s, w->rows, w->cols, (const float *)g_sx, T, (float *)g_sy, g_st));
    cu_rt_mark("matmul: kernel");
    return stage_out(y, yb, "matmul: copy out");
}

/* g = act(g, u) over n values: SwiGLU (act 0) or SiTU (act 1, beta, lb), in place on g. */
cudaError_t act_launch(int act, float beta, float lb, float *g, const float *u, int64_t n, cudaStream_t st = NULL) {
    if (!st) st = g_st;
    return act ? cu_situ_mul_launch(g, g, u, n, beta, lb, st) : cu_silu_mul_launch(g, g, u, n, st);
}

/* gate, up, activation, down with x and out in pinned staging: one copy each way, one synchronisation.
 * A weight in the scratch buffer is used before the next upload overwrites it (same stream). */
int mlp_locked(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
               const float *x, int T, float *out) {
    const int64_t D = gate->cols, I = gate->rows, O = down->rows;
    const size_t xb = sizeof(float) * (size_t)T * D, ib = sizeof(float) * (size_t)T * I, ob = sizeof(float) * (size_t)T * O;
    if (grow(&g_sx, &g_csx, xb) || grow(&g_sy, &g_csy, ob) || grow(&g_sg, &g_csg, ib) || grow(&g_su, &g_csu, ib)) return -1;
    if (grow_host(&g_hx, &g_chx, xb) || grow_host(&g_hy, &g_chy, ob)) return -1;
    if (stage_in(x, xb)) return -1;
    cu_rt_mark("mlp: copy in");
    const void *d, *s;
    if (weight_on_device(gate, &d, &s)) return -1;
    CK(cu_matmul_launch(gate->type, d, s, I, D, (const float *)g_sx, T, (float *)g_sg, g_st));
    if (weight_on_device(up, &d, &s)) return -1;
    CK(cu_matmul_launch(up->type, d, s, I, D, (const float *)g_sx, T, (float *)g_su, g_st));
    CK(act_launch(act, beta, lb, (float *)g_sg, (const float *)g_su, (int64_t)T * I));
    if (weight_on_device(down, &d, &s)) return -1;
    CK(cu_matmul_launch(down->type, d, s, O, I, (const float *)g_sg, T, (float *)g_sy, g_st));
    cu_rt_mark("mlp: gate, up, act, down");
    return stage_out(out, ob, "mlp: copy out");
}

/* weight_on_device for an item of a group: the scratch buffer for an uncached weight is grown (cudaFree of the old
 * one) only once the stream is idle, since earlier items' kernels queued on it may still read the old buffer. */
int group_weight(const df_weight *w, const void **data, const void **scale) {
    const size_t total = round_up(data_bytes(w->type, w->rows, w->cols), 256) +
                         (w->scale ? scale_bytes(w->type, w->rows, w->cols) : 0);
    const Entry *e = w->dev_key != 0 || g_by_addr ? find(key_of(w)) : NULL;
    const int cached = e && (e->pins || (e->type == (int)w->type && e->rows == w->rows && e->cols == w->cols));
    if (!cached && total > g_csw) CK(cudaStreamSynchronize(g_st));
    return weight_on_device(w, data, scale);
}

/* The cache entry holding w's arrays now (as weight_on_device would find it), or NULL: no upload, no eviction. */
const Entry *cached_entry(const df_weight *w) {
    if (w->dev_key == 0 && !g_by_addr) return NULL;
    const Entry *e = find(key_of(w));
    return e && (e->pins || (e->type == (int)w->type && e->rows == w->rows && e->cols == w->cols)) ? e : NULL;
}

/* Whether item i of a group can join the grouped tensor-core launches (see mlp_group_locked): T of 1..256, gate and
 * up of one encoding and down of one, both on the tensor-core kernel (DF_CUDA_MMA), widths that are multiples of 32,
 * and all three weights in the device cache already (their addresses then stay valid until the launches are queued:
 * collecting them allocates and evicts nothing). */
int groupable(const df_weight *gate, const df_weight *up, const df_weight *down, int T) {
    const unsigned mma = cu_get_mma();
    return T > 0 && T <= 256 && gate->type == up->type && ((mma >> gate->type) & 1) && ((mma >> down->type) & 1) &&
           gate->cols % 32 == 0 && gate->rows % 32 == 0 && cached_entry(gate) && cached_entry(up) && cached_entry(down);
}

/* df_cuda_mlp_group: every distinct x (items with the same input share it) packed into the pinned staging at
 * 256-byte offsets and copied in at once.
 * Items whose weights are all cached, of the encoding and shape of the first such item, on the tensor-core kernel
 * (groupable), run together: one grouped launch for all their gates and ups (cu_mma_group_launch: each output has
 * the bits of its own launch), one activation over all their rows (element-wise: the same bits), one grouped launch
 * for their downs. Every other item then runs as mlp_locked runs it (gate, up, activation, down: the same kernels
 * with the same weights, shapes and T, so the same bits); their intermediates g, u are sized for the largest item
 * and reused by each in turn (one stream: an item's gate runs after the previous item's down), and each weight is
 * used (its kernel queued) before the next is looked up, as in mlp_locked: an eviction's stream-ordered free or the
 * next upload into the scratch buffer comes after that kernel. The items' outputs are packed at 256-byte offsets
 * and copied out at once; one synchronisation. */
/* Resid mode (rw not NULL; every T[i] = 1, one shared input): instead of copying the outputs back, the combine
 * kernel adds the weighted sum of the first n - shared items' outputs (weights rw, in item order) plus the last
 * item's (shared; else sh_dev, a shared expert's output already on the device, when not NULL) into the device
 * residual row resid; nothing is synchronised (df_cuda_moe_resid). x_dev, when not NULL (resid mode): every item's
 * input already on the device (the block's h2): nothing staged or copied in. */
int mlp_group_locked(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                     int act, float beta, float lb, const float *const *x, const int *T, float *const *out,
                     const float *rw = NULL, int shared = 0, float *resid = NULL, const float *sh_dev = NULL,
                     const float *x_dev = NULL) {
    /* per item: whether it is in the grouped set, and its input's and output's byte offsets in the staging */
    const size_t nn = (size_t)(n > 0 ? n : 1);
    size_t *xoff = (size_t *)malloc(nn * (2 * sizeof(size_t) + 1));
    if (!xoff) { snprintf(g_err, sizeof g_err, "out of host memory"); return -1; }
    size_t *ooff = xoff + nn;
    char *grp = (char *)(ooff + nn);
    memset(grp, 0, nn);
    /* the grouped set: the first groupable item's encodings and shape, and every groupable item that matches them */
    int first = -1, ngrp = 0;
    size_t grows = 0;
    for (int i = 0; i < n; i++) {
        if (!groupable(gate[i], up[i], down[i], T[i])) continue;
        if (first < 0) first = i;
        const df_weight *g0 = gate[first], *d0 = down[first];
        if (gate[i]->type != g0->type || down[i]->type != d0->type || gate[i]->rows != g0->rows ||
            gate[i]->cols != g0->cols || down[i]->rows != d0->rows)
            continue;
        grp[i] = 1;
        ngrp++;
        grows += (size_t)T[i];
    }
    if (ngrp < 2) { /* one item alone: its own launches are as fast */
        memset(grp, 0, nn);
        ngrp = 0;
        grows = 0;
    }
    size_t xall = 0, oall = 0, ib = 0;
    for (int i = 0; i < n; i++) {
        xoff[i] = xall;
        ooff[i] = oall;
        if (T[i] <= 0) continue;
        const size_t t = (size_t)T[i];
        /* an input that an earlier item has too (a decode step's experts and shared expert all read the token's
         * row): staged and copied once, the items share its device copy (and so its split, cu_mma_group_launch) */
        int dup = -1;
        for (int j = 0; j < i && dup < 0; j++)
            if (x[j] == x[i] && T[j] == T[i] && gate[j]->cols == gate[i]->cols) dup = j;
        if (dup >= 0) xoff[i] = xoff[dup];
        else xall += round_up(sizeof(float) * t * (size_t)gate[i]->cols, 256);
        oall += round_up(sizeof(float) * t * (size_t)down[i]->rows, 256);
        const size_t b = sizeof(float) * t * (size_t)gate[i]->rows;
        if (!grp[i] && b > ib) ib = b;
    }
    if (ngrp && sizeof(float) * grows * (size_t)gate[first]->rows > ib) ib = sizeof(float) * grows * (size_t)gate[first]->rows;
    if (!xall) { free(xoff); return 0; }
    cu_mma_item *items = ngrp ? (cu_mma_item *)malloc(sizeof(cu_mma_item) * (size_t)ngrp * 2) : NULL;
    if (ngrp && !items) { free(xoff); snprintf(g_err, sizeof g_err, "out of host memory"); return -1; }
    int rc = -1;
    do {
        if (grow(&g_sx, &g_csx, xall) || grow(&g_sy, &g_csy, oall) || grow(&g_sg, &g_csg, ib) || grow(&g_su, &g_csu, ib))
            break;
        if (grow_host(&g_hx, &g_chx, xall) || grow_host(&g_hy, &g_chy, oall)) break;
        size_t next = 0; /* each distinct input once, in offset order */
        for (int i = 0; i < n && !x_dev; i++)
            if (T[i] > 0 && xoff[i] == next) {
                const size_t b = sizeof(float) * (size_t)T[i] * (size_t)gate[i]->cols;
                memcpy((char *)g_hx + xoff[i], x[i], b);
                next = xoff[i] + round_up(b, 256);
            }
        cudaError_t ce = x_dev ? cudaSuccess : cu_copy_launch(g_sx, g_hx, xall, cudaMemcpyHostToDevice, g_st);
        if (ce != cudaSuccess) { fail("cudaMemcpyAsync", ce); break; }
        cu_rt_mark("group: copy in");
        if (ngrp) {
            /* gates and ups, item by item (an item's pair shares its split input), into rows of g / u */
            const int64_t D = gate[first]->cols, I = gate[first]->rows, O = down[first]->rows;
            size_t r = 0;
            int k = 0;
            for (int i = 0; i < n; i++) {
                if (!grp[i]) continue;
                const float *dx = x_dev ? x_dev : (const float *)((char *)g_sx + xoff[i]);
                const void *d, *s;
                weight_on_device(gate[i], &d, &s); /* cache hits (groupable): no allocation, no error */
                items[k++] = {d, s, dx, (float *)g_sg + r * (size_t)I, T[i]};
                weight_on_device(up[i], &d, &s);
                items[k++] = {d, s, dx, (float *)g_su + r * (size_t)I, T[i]};
                r += (size_t)T[i];
            }
            if ((ce = cu_mma_group_launch(gate[first]->type, I, D, k, items, g_st)) != cudaSuccess) {
                fail("cu_mma_group_launch (gate, up)", ce);
                break;
            }
            cu_rt_mark("group: grouped gate+up");
            /* the downs' input: act(g, u), computed as it is split (the bits of the activation kernel, then the split) */
            k = 0;
            r = 0;
            for (int i = 0; i < n; i++) {
                if (!grp[i]) continue;
                const void *d, *s;
                weight_on_device(down[i], &d, &s);
                items[k++] = {d, s, (const float *)g_sg + r * (size_t)I, (float *)((char *)g_sy + ooff[i]), T[i],
                              (const float *)g_su + r * (size_t)I};
                r += (size_t)T[i];
            }
            if ((ce = cu_mma_group_launch(down[first]->type, O, I, k, items, g_st, act, beta, lb)) != cudaSuccess) {
                fail("cu_mma_group_launch (down)", ce);
                break;
            }
            cu_rt_mark("group: grouped down");
            g_stats.grouped_items += (uint64_t)k;
        }
        int bad = 0;
        for (int i = 0; i < n && !bad; i++) {
            if (T[i] <= 0 || grp[i]) continue;
            const int Ti = T[i];
            const int64_t D = gate[i]->cols, I = gate[i]->rows, O = down[i]->rows;
            const float *dx = x_dev ? x_dev : (const float *)((char *)g_sx + xoff[i]);
            float *dy = (float *)((char *)g_sy + ooff[i]);
            const void *d, *s;
            bad = 1;
            if (group_weight(gate[i], &d, &s)) break;
            if ((ce = cu_matmul_launch(gate[i]->type, d, s, I, D, dx, Ti, (float *)g_sg, g_st)) != cudaSuccess) {
                fail("cu_matmul_launch", ce);
                break;
            }
            if (group_weight(up[i], &d, &s)) break;
            if ((ce = cu_matmul_launch(up[i]->type, d, s, I, D, dx, Ti, (float *)g_su, g_st)) != cudaSuccess) {
                fail("cu_matmul_launch", ce);
                break;
            }
            if ((ce = act_launch(act, beta, lb, (float *)g_sg, (const float *)g_su, (int64_t)Ti * I)) != cudaSuccess) {
                fail("activation", ce);
                break;
            }
            if (group_weight(down[i], &d, &s)) break;
            if ((ce = cu_matmul_launch(down[i]->type, d, s, O, I, (const float *)g_sg, Ti, dy, g_st)) != cudaSuccess) {
                fail("cu_matmul_launch", ce);
                break;
            }
            bad = 0;
        }
        if (bad) break;
        cu_rt_mark("group: other items (shared expert)");
        if (rw) { /* into the device residual: no copy out, no synchronisation */
            const int nr = n - shared;
            const float *ys[CU_COMBINE_MAX];
            for (int i = 0; i < nr; i++) ys[i] = (const float *)((char *)g_sy + ooff[i]);
            const float *sh = shared ? (const float *)((char *)g_sy + ooff[n - 1]) : sh_dev;
            cu_rt_sh_join(); /* sh_dev from the side stream */
            if ((ce = cu_combine_resid_launch(resid, down[0]->rows, nr, ys, rw, sh, g_st)) != cudaSuccess) {
                fail("combine", ce);
                break;
            }
            cu_rt_mark("group: combined into the residual");
            rc = 0;
            break;
        }
        if ((ce = cu_copy_launch(g_hy, g_sy, oall, cudaMemcpyDeviceToHost, g_st)) != cudaSuccess) {
            fail("cudaMemcpyAsync", ce);
            break;
        }
        if ((ce = cu_rt_sync("group: copy out")) != cudaSuccess) { fail("cudaStreamSynchronize", ce); break; }
        for (int i = 0; i < n; i++)
            if (T[i] > 0) memcpy(out[i], (const char *)g_hy + ooff[i], sizeof(float) * (size_t)T[i] * (size_t)down[i]->rows);
        rc = 0;
    } while (0);
    free(items);
    free(xoff);
    return rc;
}

/* df_cuda_mla_project: h in; [q_a, RMSNorm] q_b or q_proj into the output's q part, kv_a into its kva part; one copy
 * out; one synchronisation. The norm's weight is cached like a spine weight (by host address). Each weight is used
 * (its kernel queued) before the next is looked up (group_weight: the scratch buffer for an uncached one is reused in
 * stream order). */
int mla_project_locked(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b,
                       const df_weight *q_proj, const df_weight *kv_a, const float *h, int T, float *q, float *kva) {
    const int64_t D = kv_a->cols, Q = q_a ? q_b->rows : q_proj->rows, K = kv_a->rows, R = q_a ? q_a->rows : 0;
    const size_t hb = sizeof(float) * (size_t)T * D, qb = sizeof(float) * (size_t)T * Q, kb = sizeof(float) * (size_t)T * K;
    const size_t ab = sizeof(float) * (size_t)T * (R > 0 ? R : 1), ko = round_up(qb, 256);
    if (grow(&g_sx, &g_csx, hb) || grow(&g_sy, &g_csy, ko + kb) || grow(&g_sg, &g_csg, ab)) return -1;
    if (grow_host(&g_hx, &g_chx, hb) || grow_host(&g_hy, &g_chy, ko + kb)) return -1;
    if (stage_in(h, hb)) return -1;
    cu_rt_mark("project: copy in");
    const void *d, *s;
    float *dq = (float *)g_sy, *dk = (float *)((char *)g_sy + ko);
    if (q_a) {
        if (group_weight(q_a, &d, &s)) return -1;
        CK(cu_matmul_launch(q_a->type, d, s, R, D, (const float *)g_sx, T, (float *)g_sg, g_st));
        cu_rt_mark("project: q_a");
        const df_weight nw = {DF_W_F32, 1, R, q_a_norm, NULL, 0};
        if (group_weight(&nw, &d, &s)) return -1;
        CK(cu_rmsnorm_launch((float *)g_sg, (const float *)g_sg, (const float *)d, T, R, eps, g_st));
        cu_rt_mark("project: q_a norm");
        if (group_weight(q_b, &d, &s)) return -1;
        CK(cu_matmul_launch(q_b->type, d, s, Q, R, (const float *)g_sg, T, dq, g_st));
        cu_rt_mark("project: q_b");
    } else {
        if (group_weight(q_proj, &d, &s)) return -1;
        CK(cu_matmul_launch(q_proj->type, d, s, Q, D, (const float *)g_sx, T, dq, g_st));
    }
    if (group_weight(kv_a, &d, &s)) return -1;
    CK(cu_matmul_launch(kv_a->type, d, s, K, D, (const float *)g_sx, T, dk, g_st));
    cu_rt_mark("project: kv_a");
    if (stage_out(NULL, ko + kb, "project: copy out")) return -1;
    memcpy(q, g_hy, qb);
    memcpy(kva, (const char *)g_hy + ko, kb);
    return 0;
}

/* Temporary device arrays for the op wrappers. */
struct Tmp {
    void *p[4] = {NULL, NULL, NULL, NULL};
    ~Tmp() { for (void *q : p) if (q) cudaFree(q); }
};

} // namespace

extern "C" int df_cuda_probe(char *why, size_t whylen) {
    pthread_once(&g_once, probe_once);
    if (why && whylen) snprintf(why, whylen, "%s", g_ndev ? "" : g_why);
    return g_ndev;
}

extern "C" void df_cuda_describe(char *buf, size_t len) {
    if (!len) return;
    buf[0] = 0;
    if (!df_cuda_probe(NULL, 0)) return;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return;
    snprintf(buf, len, "%s, %.1f GiB, sm_%d%d", p.name, (double)p.totalGlobalMem / (1 << 30), p.major, p.minor);
}

extern "C" void df_cuda_set_expert_budget(uint64_t bytes) {
    pthread_mutex_lock(&g_mu);
    g_budget = bytes;
    if (g_ndev)
        while (g_budget && g_stats.expert_bytes > g_budget && evict_one()) {}
    if (g_ndev) cudaStreamSynchronize(g_st);
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_set_cache_by_address(int on) {
    pthread_mutex_lock(&g_mu);
    g_by_addr = on != 0;
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_cache_clear(void) {
    df_cuda_seq_forget(0); /* the attention core's KV-cache mirrors (cuda_attn.cu); takes the mutex itself */
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nent; i++)
        if (g_ent[i].used) drop(i);
    if (g_ndev) cudaStreamSynchronize(g_st); /* the stream-ordered frees count as free memory from here */
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_cache_drop_model(int tag) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nent; i++)
        if (g_ent[i].used && (!(g_ent[i].key >> 63) || DF_DEVKEY_TAG(g_ent[i].key) == tag)) drop(i);
    if (g_ndev) cudaStreamSynchronize(g_st);
    pthread_mutex_unlock(&g_mu);
}

extern "C" int df_cuda_pin(uint64_t dev_key, df_weight *w) {
    if (!g_ndev || !dev_key) return 0;
    pthread_mutex_lock(&g_mu);
    Entry *e = find(dev_key);
    if (e) {
        e->pins++;
        e->tick = ++g_tick;
        g_stats.expert_hits++;
        memset(w, 0, sizeof *w);
        w->type = (df_wtype)e->type;
        w->rows = e->rows;
        w->cols = e->cols;
        w->dev_key = dev_key;
    }
    pthread_mutex_unlock(&g_mu);
    return e != NULL;
}

extern "C" int df_cuda_has(uint64_t dev_key) {
    if (!g_ndev || !dev_key) return 0;
    pthread_mutex_lock(&g_mu);
    const int r = find(dev_key) != NULL;
    pthread_mutex_unlock(&g_mu);
    return r;
}

extern "C" void df_cuda_unpin(uint64_t dev_key) {
    pthread_mutex_lock(&g_mu);
    Entry *e = find(dev_key);
    if (e && e->pins > 0) e->pins--;
    pthread_mutex_unlock(&g_mu);
}

/* Called from any thread (the store's prefault threads too); no shared state but the driver's. */
extern "C" int df_cuda_host_pin(void *p, size_t n) {
    if (!ready()) return -1;
    if (g_pin_off) return -1;
    if (cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky; the buffer stays pageable */
        return -1;
    }
    return 0;
}

extern "C" void df_cuda_host_unpin(void *p) {
    if (!ready()) return;
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError(); /* never registered */
}

extern "C" void df_cuda_get_stats(df_cuda_stats *out) {
    pthread_mutex_lock(&g_mu);
    *out = g_stats;
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_set_matvec_rows(int n) {
    pthread_mutex_lock(&g_mu);
    cu_set_matvec_rows(n);
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_set_split(int on) {
    pthread_mutex_lock(&g_mu);
    cu_set_split(on);
    pthread_mutex_unlock(&g_mu);
}

extern "C" void df_cuda_set_tile(int n) {
    pthread_mutex_lock(&g_mu);
    cu_set_tile(n);
    pthread_mutex_unlock(&g_mu);
}

extern "C" const char *df_cuda_last_error(void) { return g_err; }

/* An entry point's body (a *_locked function) with the runtime's mutex held and the trace started; after an error
 * return the stream is drained first, so no queued copy still reads a host buffer the caller may free. */
template <class F> int locked_op(F body) {
    pthread_mutex_lock(&g_mu);
    trace_begin();
    const int rc = body();
    if (rc) cudaStreamSynchronize(g_st);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

extern "C" int df_cuda_matmul(const df_weight *w, const float *x, int T, float *y) {
    if (!ready()) return -1;
    if (T <= 0 || w->rows <= 0) return 0;
    return locked_op([&] { return matmul_locked(w, x, T, y); });
}

extern "C" int df_cuda_matmul2(const df_weight *a, const df_weight *b, const float *x, float *ya, float *yb) {
    if (!ready()) return -1;
    if (a->cols != b->cols || a->rows <= 0 || b->rows <= 0) return -1;
    return locked_op([&] {
        const size_t xb = sizeof(float) * (size_t)a->cols, yab = sizeof(float) * (size_t)a->rows;
        const size_t ybo = (yab + 255) / 256 * 256, yb_b = sizeof(float) * (size_t)b->rows;
        if (grow(&g_sx, &g_csx, xb) || grow(&g_sy, &g_csy, ybo + yb_b)) return -1;
        if (grow_host(&g_hx, &g_chx, xb) || grow_host(&g_hy, &g_chy, ybo + yb_b)) return -1;
        if (stage_in(x, xb)) return -1;
        float *dya = (float *)g_sy, *dyb = (float *)((char *)g_sy + ybo);
        const int one = cu_rt_matmul2(a, b, (const float *)g_sx, dya, dyb, g_st);
        if (one < 0) return -1;
        if (!one) { /* each weight used (its kernel queued) before the next is looked up */
            const void *d, *sc;
            if (weight_on_device(a, &d, &sc)) return -1;
            CK(cu_matmul_launch(a->type, d, sc, a->rows, a->cols, (const float *)g_sx, 1, dya, g_st));
            if (weight_on_device(b, &d, &sc)) return -1;
            CK(cu_matmul_launch(b->type, d, sc, b->rows, b->cols, (const float *)g_sx, 1, dyb, g_st));
        }
        if (stage_out(NULL, ybo + yb_b, "matmul2: copy out")) return -1;
        memcpy(ya, g_hy, yab);
        memcpy(yb, (char *)g_hy + ybo, yb_b);
        return one;
    });
}

extern "C" int df_cuda_preload(const df_weight *w) {
    if (!ready()) return -1;
    if (!w->data || w->rows <= 0 || w->cols <= 0) return 0;
    pthread_mutex_lock(&g_mu);
    const void *d, *s;
    const uint64_t before = g_stats.spine_bytes + g_stats.expert_bytes;
    int rc = weight_on_device(w, &d, &s);
    if (rc == 0 && g_stats.spine_bytes + g_stats.expert_bytes == before && !find(key_of(w))) rc = 1; /* no room */
    if (rc == 0) rc = cudaStreamSynchronize(g_st) == cudaSuccess ? 0 : -1;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

extern "C" int df_cuda_dev_load(const df_weight *w) {
    if (!ready()) return -1;
    if (!w->data || !w->dev_key || w->rows <= 0 || w->cols <= 0) return -1;
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    if (!find(w->dev_key)) {
        const size_t db = data_bytes(w->type, w->rows, w->cols);
        const size_t need = round_up(db, 256) + (w->scale ? scale_bytes(w->type, w->rows, w->cols) : 0);
        size_t fr = 0, tot = 0;
        if (g_budget && g_stats.expert_bytes + need > g_budget) rc = 1;
        /* stream-ordered frees count only after a synchronisation */
        else if (cudaStreamSynchronize(g_st) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) rc = -1;
        /* the KV mirrors' room stays free: a preloaded cache must not leave long contexts without them */
        else if (fr < need + RESERVE + cu_attn_mirror_room()) rc = 1;
        if (rc == 0) {
            const void *d, *sc;
            rc = weight_on_device(w, &d, &sc);
            if (rc == 0) rc = cudaStreamSynchronize(g_st) == cudaSuccess ? 0 : -1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

extern "C" int df_cuda_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta,
                           float lb, const float *x, int T, float *out) {
    if (!ready()) return -1;
    if (T <= 0) return 0;
    if (up->rows != gate->rows || up->cols != gate->cols || down->cols != gate->rows) {
        snprintf(g_err, sizeof g_err, "mlp: gate/up/down shapes do not chain");
        return -1;
    }
    return locked_op([&] { return mlp_locked(gate, up, down, act, beta, lb, x, T, out); });
}

extern "C" int df_cuda_mlp_group(int n, const df_weight *const *gate, const df_weight *const *up,
                                 const df_weight *const *down, int act, float beta, float lb, const float *const *x,
                                 const int *T, float *const *out) {
    if (!ready()) return -1;
    for (int i = 0; i < n; i++) {
        if (T[i] <= 0) continue;
        if (up[i]->rows != gate[i]->rows || up[i]->cols != gate[i]->cols || down[i]->cols != gate[i]->rows) {
            snprintf(g_err, sizeof g_err, "mlp_group: item %d: gate/up/down shapes do not chain", i);
            return -1;
        }
    }
    return locked_op([&] { return mlp_group_locked(n, gate, up, down, act, beta, lb, x, T, out); });
}

extern "C" int df_cuda_moe_resid(int n, const df_weight *const *gate, const df_weight *const *up,
                                 const df_weight *const *down, int act, float beta, float lb, const float *x,
                                 const float *rw, int shared, uint64_t resid_key) {
    if (!ready()) return -1;
    if (!resid_key) { snprintf(g_err, sizeof g_err, "moe_resid: no residual key"); return -1; }
    const int nr = n - (shared ? 1 : 0);
    if (n < 1 || nr > CU_COMBINE_MAX || nr < 0) {
        snprintf(g_err, sizeof g_err, "moe_resid: %d items (at most %d routed ones)", n, CU_COMBINE_MAX);
        return -1;
    }
    const int64_t D = gate[0]->cols;
    for (int i = 0; i < n; i++)
        if (up[i]->rows != gate[i]->rows || up[i]->cols != gate[i]->cols || down[i]->cols != gate[i]->rows ||
            gate[i]->cols != D || down[i]->rows != D) {
            snprintf(g_err, sizeof g_err, "moe_resid: item %d: shapes do not chain into [%lld] rows", i, (long long)D);
            return -1;
        }
    const float **xs = (const float **)malloc(sizeof(float *) * (size_t)n);
    int *T = (int *)malloc(sizeof(int) * (size_t)n);
    if (!xs || !T) { free(xs); free(T); snprintf(g_err, sizeof g_err, "out of host memory"); return -1; }
    for (int i = 0; i < n; i++) { xs[i] = x; T[i] = 1; }
    const int rc = locked_op([&] {
        float *resid = cu_rt_resid(resid_key, (size_t)D, 1, NULL);
        if (!resid) return -1;
        /* the shared expert its mla_block started, when it ran these weights: taken (the same kernels on the same h2) */
        Resid *r = resid_of(resid_key);
        const int took = shared && r && r->sh_valid && r->sh_w[0] == gate[n - 1] && r->sh_w[1] == up[n - 1] &&
                         r->sh_w[2] == down[n - 1] && r->sh_act == act && r->sh_beta == beta && r->sh_lb == lb;
        if (r) r->sh_valid = 0;
        if (took) g_stats.shared_early++;
        /* the input on the device already: the block's h2, of which x is the host copy */
        const float *xd = cu_attn_h2(x);
        return took ? mlp_group_locked(n - 1, gate, up, down, act, beta, lb, xs, T, NULL, rw, 0, resid,
                                       (const float *)r->sh_out, xd)
                    : mlp_group_locked(n, gate, up, down, act, beta, lb, xs, T, NULL, rw, shared ? 1 : 0, resid, NULL, xd);
    });
    free(xs);
    free(T);
    return rc;
}

extern "C" int df_cuda_mla_project(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b,
                                   const df_weight *q_proj, const df_weight *kv_a, const float *h, int T, float *q,
                                   float *kva) {
    if (!ready()) return -1;
    if (T <= 0) return 0;
    if (q_a ? (!q_b || !q_a_norm || q_b->cols != q_a->rows || q_a->cols != kv_a->cols) : (!q_proj || q_proj->cols != kv_a->cols)) {
        snprintf(g_err, sizeof g_err, "mla_project: the projections' shapes do not chain");
        return -1;
    }
    return locked_op([&] { return mla_project_locked(q_a, q_a_norm, eps, q_b, q_proj, kv_a, h, T, q, kva); });
}

#define OP_BEGIN \
    if (!ready()) return -1; \
    pthread_mutex_lock(&g_mu); \
    int rc = op_body(); \
    pthread_mutex_unlock(&g_mu); \
    return rc;

extern "C" int df_cuda_rmsnorm(float *out, const float *x, const float *w, int T, int64_t n, float eps) {
    auto op_body = [&]() -> int {
        Tmp t;
        const size_t b = sizeof(float) * (size_t)T * n;
        CK(cudaMalloc(&t.p[0], b)); CK(cudaMalloc(&t.p[1], b)); CK(cudaMalloc(&t.p[2], sizeof(float) * n));
        CK(cudaMemcpy(t.p[0], x, b, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t.p[2], w, sizeof(float) * n, cudaMemcpyHostToDevice));
        CK(cu_rmsnorm_launch((float *)t.p[1], (const float *)t.p[0], (const float *)t.p[2], T, n, eps, g_st));
        CK(cudaStreamSynchronize(g_st));
        CK(cudaMemcpy(out, t.p[1], b, cudaMemcpyDeviceToHost));
        return 0;
    };
    OP_BEGIN
}

static int act_op(float *out, const float *g, const float *u, int64_t n, int situ, float beta, float lb) {
    Tmp t;
    const size_t b = sizeof(float) * (size_t)n;
    CK(cudaMalloc(&t.p[0], b)); CK(cudaMalloc(&t.p[1], b)); CK(cudaMalloc(&t.p[2], b));
    CK(cudaMemcpy(t.p[0], g, b, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.p[1], u, b, cudaMemcpyHostToDevice));
    if (situ) CK(cu_situ_mul_launch((float *)t.p[2], (const float *)t.p[0], (const float *)t.p[1], n, beta, lb, g_st));
    else CK(cu_silu_mul_launch((float *)t.p[2], (const float *)t.p[0], (const float *)t.p[1], n, g_st));
    CK(cudaStreamSynchronize(g_st));
    CK(cudaMemcpy(out, t.p[2], b, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int df_cuda_silu_mul(float *out, const float *g, const float *u, int64_t n) {
    auto op_body = [&]() -> int { return act_op(out, g, u, n, 0, 0, 0); };
    OP_BEGIN
}

extern "C" int df_cuda_situ_mul(float *out, const float *g, const float *u, int64_t n, float beta, float lb) {
    auto op_body = [&]() -> int { return act_op(out, g, u, n, 1, beta, lb); };
    OP_BEGIN
}

extern "C" int df_cuda_softmax(float *x, int T, int64_t n) {
    auto op_body = [&]() -> int {
        Tmp t;
        const size_t b = sizeof(float) * (size_t)T * n;
        CK(cudaMalloc(&t.p[0], b));
        CK(cudaMemcpy(t.p[0], x, b, cudaMemcpyHostToDevice));
        CK(cu_softmax_launch((float *)t.p[0], T, n, g_st));
        CK(cudaStreamSynchronize(g_st));
        CK(cudaMemcpy(x, t.p[0], b, cudaMemcpyDeviceToHost));
        return 0;
    };
    OP_BEGIN
}

extern "C" int df_cuda_rope(float *x, int T, int dim, const float *inv_freq, float attention_factor, const int64_t *pos) {
    auto op_body = [&]() -> int {
        Tmp t;
        const size_t b = sizeof(float) * (size_t)T * dim;
        CK(cudaMalloc(&t.p[0], b)); CK(cudaMalloc(&t.p[1], b));
        CK(cudaMalloc(&t.p[2], sizeof(float) * (size_t)(dim / 2 > 0 ? dim / 2 : 1)));
        CK(cudaMalloc(&t.p[3], sizeof(int64_t) * (size_t)T));
        CK(cudaMemcpy(t.p[0], x, b, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t.p[1], x, b, cudaMemcpyHostToDevice)); /* odd dim: the last value passes through */
        CK(cudaMemcpy(t.p[2], inv_freq, sizeof(float) * (size_t)(dim / 2), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t.p[3], pos, sizeof(int64_t) * (size_t)T, cudaMemcpyHostToDevice));
        CK(cu_rope_launch((float *)t.p[1], (const float *)t.p[0], T, dim, (const float *)t.p[2], attention_factor,
                          (const int64_t *)t.p[3], g_st));
        CK(cudaStreamSynchronize(g_st));
        CK(cudaMemcpy(x, t.p[1], b, cudaMemcpyDeviceToHost));
        return 0;
    };
    OP_BEGIN
}

/* ---- the runtime's mutex, stream and weight cache for the other CUDA sources (cuda_internal.h) ---- */
int cu_rt_lock(void) {
    if (!ready()) return -1;
    pthread_mutex_lock(&g_mu);
    trace_begin();
    return 0;
}
void cu_rt_unlock(void) { pthread_mutex_unlock(&g_mu); }
cudaStream_t cu_rt_stream(void) { return g_st; }
cudaError_t cu_rt_sync(const char *stage) { return cu_rt_sync_event(stage, nullptr); }
cudaError_t cu_rt_sync_event(const char *stage, cudaEvent_t ev) { return cu_rt_sync_upto(stage, ev, ev ? g_call - 1 : g_call); }
uint64_t cu_rt_call(void) { return g_call; }
cudaError_t cu_rt_sync_upto(const char *stage, cudaEvent_t ev, uint64_t upto) {
    cu_rt_mark(stage);
    if (g_trace > 0) g_h1 = host_now();
    const cudaError_t e = ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(g_st);
    /* the device routings queued before the work waited for: their ids have arrived (an event recorded in this call
     * follows every earlier call's work) */
    if (e == cudaSuccess && g_npend) route_settle(upto);
    if (e == cudaSuccess) cu_attn_settle();
    if (g_trace > 0) {
        g_h2 = host_now();
        g_hdone = e == cudaSuccess;
    }
    /* the stage events are read once the whole stream is idle (an event wait leaves later work queued) */
    if (!ev && e == cudaSuccess && g_trace == 1 && g_nmark > 1) g_tev_done = 1;
    return e;
}
/* With DF_CUDA_TRACE: the host time of the entry point that returned last from taking the mutex to calling its
 * closing synchronisation (*queue: preparing and queueing its work) and inside that synchronisation (*wait); 0 when
 * measured, -1 else. */
extern "C" int df_cuda_last_host_split(double *queue, double *wait) {
    pthread_mutex_lock(&g_mu);
    const int ok = g_trace > 0 && g_hdone;
    if (ok) {
        *queue = g_h1 - g_h0;
        *wait = g_h2 - g_h1;
    }
    g_hdone = 0;
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : -1;
}
/* The device time of the entry point that just returned (its marks recorded, stream idle), else -1; its stages
 * are added to the stage table. */
extern "C" double df_cuda_last_gpu_s(void) {
    pthread_mutex_lock(&g_mu);
    double total = -1;
    if (g_trace > 0 && g_tev_done) {
        total = 0;
        for (int i = 1; i < g_nmark; i++) {
            float ms = 0;
            if (cudaEventElapsedTime(&ms, g_tev[i - 1], g_tev[i]) != cudaSuccess) { total = -1; break; }
            total += ms * 1e-3;
            int k = 0;
            while (k < g_ntst && g_tst[k].name != g_tname[i]) k++;
            if (k == g_ntst && g_ntst < TR_STAGES) g_tst[g_ntst++] = {g_tname[i], 0, 0};
            if (k < TR_STAGES) { g_tst[k].s += ms * 1e-3; g_tst[k].n++; }
        }
    }
    g_tev_done = 0;
    g_nmark = 0;
    pthread_mutex_unlock(&g_mu);
    return total;
}
extern "C" void df_cuda_trace_stages(void) {
    if (g_ntst) fprintf(stderr, "cuda trace: stage (device time from the previous mark)   calls   total ms    mean us\n");
    for (int k = 0; k < g_ntst; k++)
        fprintf(stderr, "cuda trace:   %-40s %9llu %10.3f %10.1f\n", g_tst[k].name, g_tst[k].n, g_tst[k].s * 1e3,
                g_tst[k].s * 1e6 / (double)(g_tst[k].n ? g_tst[k].n : 1));
}
int cu_rt_weight(const df_weight *w, const void **data, const void **scale) { return group_weight(w, data, scale); }
int cu_rt_vec(const float *v, int64_t n, const float **dv) {
    const df_weight w = {DF_W_F32, 1, n, v, NULL, 0};
    const void *d = NULL, *s = NULL;
    if (group_weight(&w, &d, &s)) return -1;
    *dv = (const float *)d;
    return 0;
}
int cu_rt_matmul2(const df_weight *a, const df_weight *b, const float *x, float *ya, float *yb, cudaStream_t st) {
    if (a->type != b->type || a->cols != b->cols || !cached_entry(a) || !cached_entry(b)) return 0;
    const void *ad, *as, *bd, *bs;
    if (weight_on_device(a, &ad, &as) || weight_on_device(b, &bd, &bs)) return -1;
    const cudaError_t e = cu_matmul2_launch(a->type, ad, as, a->rows, bd, bs, b->rows, a->cols, x, ya, yb, st);
    if (e == cudaErrorNotSupported) return 0;
    if (e != cudaSuccess) return fail("cu_matmul2_launch", e);
    return 1;
}
cudaEvent_t g_sh_ev;
void cu_rt_sh_join(void) {
    if (!g_sh_pend) return;
    g_sh_pend = 0;
    if (cudaStreamWaitEvent(g_st, g_sh_done, 0) != cudaSuccess) /* not expected; then wait here */
        cudaStreamSynchronize(g_st2);
}
int cu_rt_shared_start(uint64_t key, const df_weight *g, const df_weight *u, const df_weight *d, int act, float beta,
                       float lb, const float *h2, cudaEvent_t *ev) {
    Resid *r = resid_of(key);
    if (r) r->sh_valid = 0;
    /* not with DF_CUDA_TRACE=1 (it times the entry point's device work up to its synchronisation) */
    if (!r || g_trace == 1 || g_sh_early_off) return 0;
    const int64_t D = g->cols, I = g->rows, O = d->rows;
    if (!g_sh_ev) CK(cudaEventCreateWithFlags(&g_sh_ev, cudaEventDisableTiming));
    if (grow(&r->sh_out, &r->sh_oc, sizeof(float) * (size_t)O) || grow(&r->sh_g, &r->sh_gc, sizeof(float) * (size_t)I) ||
        grow(&r->sh_u, &r->sh_uc, sizeof(float) * (size_t)I))
        return -1;
    CK(cudaEventRecord(g_sh_ev, g_st));
    /* on the side stream when its three weights are cached and none is on the tensor-core kernels (no scratch
     * buffer, whose reuse is ordered on g_st: those kernels split their input into one): it starts once the block's
     * work so far is done and runs beside what g_st queues next */
    const unsigned mma = cu_get_mma();
    const int side = cached_entry(g) && cached_entry(u) && cached_entry(d) && !(mma >> g->type & 1) &&
                       !(mma >> u->type & 1) && !(mma >> d->type & 1);
    cudaStream_t st = g_st;
    if (side && !g_side_off) {
        if (!g_st2) CK(cudaStreamCreateWithFlags(&g_st2, cudaStreamNonBlocking));
        if (!g_sh_done) CK(cudaEventCreateWithFlags(&g_sh_done, cudaEventDisableTiming));
        CK(cudaStreamWaitEvent(g_st2, g_sh_ev, 0));
        st = g_st2;
    }
    /* mlp_group_locked's shared item (gate, up, activation, down; T = 1): the same kernels, the same bits; gate and
     * up in one launch when both are cached (their addresses then stay valid: looking both up evicts nothing) */
    const void *dd, *ss, *ud, *us;
    cudaError_t e2 = cudaErrorNotSupported;
    if (cached_entry(g) && cached_entry(u) && g->type == u->type && u->rows == I && u->cols == D) {
        weight_on_device(g, &dd, &ss);
        weight_on_device(u, &ud, &us);
        e2 = cu_matmul2_launch(g->type, dd, ss, I, ud, us, I, D, h2, (float *)r->sh_g, (float *)r->sh_u, st);
        if (e2 != cudaSuccess && e2 != cudaErrorNotSupported) return fail("cu_matmul2_launch", e2);
    }
    if (e2 == cudaErrorNotSupported) {
        if (group_weight(g, &dd, &ss)) return -1;
        CK(cu_matmul_launch(g->type, dd, ss, I, D, h2, 1, (float *)r->sh_g, st));
        if (group_weight(u, &dd, &ss)) return -1;
        CK(cu_matmul_launch(u->type, dd, ss, I, D, h2, 1, (float *)r->sh_u, st));
    }
    CK(act_launch(act, beta, lb, (float *)r->sh_g, (const float *)r->sh_u, I, st));
    if (group_weight(d, &dd, &ss)) return -1;
    CK(cu_matmul_launch(d->type, dd, ss, O, I, (const float *)r->sh_g, 1, (float *)r->sh_out, st));
    if (st == g_st2) {
        CK(cudaEventRecord(g_sh_done, g_st2));
        g_sh_pend = 1;
    }
    r->sh_w[0] = g;
    r->sh_w[1] = u;
    r->sh_w[2] = d;
    r->sh_act = act;
    r->sh_beta = beta;
    r->sh_lb = lb;
    r->sh_valid = 1;
    *ev = g_sh_ev;
    return 1;
}
/* The layer's device table of its routed experts' arrays, rebuilt when its entries changed: t->ok when every expert
 * < E has its three matrices cached, gate / up [I, D] of one encoding and down [D, I] of one, both on the tensor-core
 * kernel, D and I multiples of 32. */
static int layer_table(int tag, int layer, int E) {
    LayerTab *t = &g_lt[tag][layer];
    if (t->tgen == t->gen && t->E == E && t->dev) return t->ok;
    t->ok = 0;
    const Entry *e0 = find(DF_DEVKEY(tag, layer, 0, 0)), *e2 = find(DF_DEVKEY(tag, layer, 0, 2));
    const unsigned mma = cu_get_mma();
    if (!e0 || !e2 || !((mma >> e0->type) & 1) || !((mma >> e2->type) & 1) || e0->cols % 32 || e0->rows % 32 ||
        e2->rows != e0->cols || e2->cols != e0->rows)
        return 0;
    t->tgu = e0->type;
    t->tdn = e2->type;
    t->I = e0->rows;
    t->D = e0->cols;
    void **h = (void **)malloc(sizeof(void *) * 6 * (size_t)E);
    if (!h) return 0;
    int ok = 1;
    for (int x = 0; x < E && ok; x++)
        for (int p = 0; p < 3 && ok; p++) {
            const Entry *e = find(DF_DEVKEY(tag, layer, x, p));
            const int want = p < 2 ? t->tgu : t->tdn;
            const int64_t rows = p < 2 ? t->I : t->D, cols = p < 2 ? t->D : t->I;
            ok = e && e->type == want && e->rows == rows && e->cols == cols;
            if (ok) {
                h[x * 6 + 2 * p] = e->dev;
                h[x * 6 + 2 * p + 1] = e->has_scale ? (char *)e->dev + e->scale_off : NULL;
            }
        }
    /* pageable source: staged before the call returns, copied in stream order (after the kernels reading the old one) */
    if (ok && !t->dev && cudaMalloc(&t->dev, sizeof(void *) * 6 * CU_ROUTE_MAXE) != cudaSuccess) {
        cudaGetLastError();
        t->dev = NULL;
        ok = 0;
    }
    if (ok && cudaMemcpyAsync(t->dev, h, sizeof(void *) * 6 * (size_t)E, cudaMemcpyHostToDevice, g_st) != cudaSuccess) ok = 0;
    free(h);
    t->tgen = t->gen;
    t->E = E;
    t->ok = ok;
    return ok;
}
static void *g_rg, *g_ru, *g_ry, *g_ro;
static size_t g_crg, g_cru, g_cry, g_cro;
int cu_rt_moe_route(uint64_t key, df_moe_dev *m, const float *bias_dev, const float *logits, const float *h2,
                    const void *h2xs) {
    m->queued = 0;
    m->bytes = 0;
    if (g_trace == 1) return 0;
    Resid *r = resid_of(key);
    if (m->K == 0) { /* a dense MLP: its started output into the residual */
        if (!r || !r->valid || !m->shared || !r->sh_valid || r->cap < sizeof(float) * (size_t)r->sh_w[2]->rows) return 0;
        cu_rt_sh_join();
        CK(cu_combine_resid_launch((float *)r->p, r->sh_w[2]->rows, 0, NULL, NULL, (const float *)r->sh_out, g_st));
        r->sh_valid = 0;
        g_stats.shared_early++;
        g_stats.dev_routed++;
        m->queued = 1;
        return 1;
    }
    const int E = m->E, K = m->K, G = m->n_group > 1 ? m->n_group : 1;
    if (!r || !r->valid || (m->shared && !r->sh_valid) || E < 1 || E > CU_ROUTE_MAXE || K < 2 || K > CU_ROUTE_MAXK ||
        K > E || G > CU_ROUTE_MAXG || m->layer < 0 || m->layer >= DF_MAX_LAYERS || m->tag < 0 || m->tag >= DF_DEV_TAGS)
        return 0;
    LayerTab *t = &g_lt[m->tag][m->layer];
    if (t->n != 3 * E || !layer_table(m->tag, m->layer, E) || r->cap < sizeof(float) * (size_t)t->D) return 0;
    const int64_t I = t->I, D = t->D;
    if (grow(&g_rg, &g_crg, sizeof(float) * (size_t)K * I) || grow(&g_ru, &g_cru, sizeof(float) * (size_t)K * I) ||
        grow(&g_ry, &g_cry, sizeof(float) * (size_t)K * D) || grow(&g_ro, &g_cro, sizeof(cu_moe_route_out)))
        return -1;
    if (!r->route) {
        CK(cudaMallocHost((void **)&r->route, sizeof(RouteIds) * DF_MAX_LAYERS));
        memset(r->route, 0, sizeof(RouteIds) * DF_MAX_LAYERS);
    }
    cu_moe_route_out *o = (cu_moe_route_out *)g_ro;
    RouteIds *q = &r->route[m->layer];
    const cudaEvent_t join = g_sh_pend ? g_sh_done : NULL; /* the shared expert's output, before the combine */
    g_sh_pend = 0;
    CK(cu_moe_dev_launch(logits, bias_dev, E, K, G, m->topk_group, m->renorm, m->scale, (const void *const *)t->dev,
                         (df_wtype)t->tgu, (df_wtype)t->tdn, I, D, h2, (float *)g_rg, (float *)g_ru, (float *)g_ry,
                         m->shared ? (const float *)r->sh_out : NULL, m->act, m->beta, m->lb, (float *)r->p, o, join, g_st,
                         g_cu_copy_kernel ? q->ids : NULL, h2xs)); /* the picks into pinned host memory */
    if (!g_cu_copy_kernel) CK(cudaMemcpyAsync(q->ids, o->ids, sizeof(int) * (size_t)K, cudaMemcpyDeviceToHost, g_st));
    if (!q->qcall) g_npend++;
    q->qcall = g_call;
    q->tag = m->tag;
    q->k = K;
    q->ready = 0;
    if (m->shared) {
        r->sh_valid = 0;
        g_stats.shared_early++;
    }
    g_stats.dev_routed++;
    const uint64_t xb = (uint64_t)(2 * data_bytes((df_wtype)t->tgu, I, D) + data_bytes((df_wtype)t->tdn, D, I));
    const uint64_t sb = (uint64_t)(2 * scale_bytes((df_wtype)t->tgu, I, D) + scale_bytes((df_wtype)t->tdn, D, I));
    m->bytes = (uint64_t)K * (xb + sb);
    m->queued = 1;
    return 1;
}
/* df_cuda_final_logits with the mutex held */
static int final_locked(const float *x, int n, uint64_t key, const float *norm, float eps, const df_weight *lm, float *logits) {
    const int64_t D = lm->cols, V = lm->rows;
    const size_t xb = sizeof(float) * (size_t)n * D, yb = sizeof(float) * (size_t)n * V;
    if (grow(&g_sx, &g_csx, xb) || grow(&g_sg, &g_csg, xb) || grow(&g_sy, &g_csy, yb) || grow_host(&g_hy, &g_chy, yb))
        return -1;
    const float *src;
    if (x) {
        if (grow_host(&g_hx, &g_chx, xb) || stage_in(x, xb)) return -1;
        src = (const float *)g_sx;
    } else if (!(src = cu_rt_resid(key, (size_t)D, 1, NULL))) {
        return -1;
    }
    cu_rt_mark("final: copy in");
    const df_weight nw = {DF_W_F32, 1, D, norm, NULL, 0};
    const void *d, *s;
    if (group_weight(&nw, &d, &s)) return -1;
    CK(cu_rmsnorm_launch((float *)g_sg, src, (const float *)d, n, D, eps, g_st));
    if (group_weight(lm, &d, &s)) return -1;
    CK(cu_matmul_launch(lm->type, d, s, V, D, (const float *)g_sg, n, (float *)g_sy, g_st));
    cu_rt_mark("final: norm, lm_head");
    return stage_out(logits, yb, "final: copy out");
}
extern "C" int df_cuda_final_logits(const float *x, int n, uint64_t key, const float *norm, float eps, const df_weight *lm,
                                    float *logits) {
    if (!ready()) return -1;
    if (n <= 0) return 0;
    if ((!x && (n != 1 || !key)) || !norm || !lm) {
        snprintf(g_err, sizeof g_err, "final_logits: %s", !x ? "the device residual holds one row" : "no norm or lm_head");
        return -1;
    }
    return locked_op([&] { return final_locked(x, n, key, norm, eps, lm, logits); });
}
extern "C" int df_cuda_moe_routed(uint64_t key, int layer, int *ids) {
    if (!ready() || layer < 0 || layer >= DF_MAX_LAYERS) return 0;
    pthread_mutex_lock(&g_mu);
    Resid *r = resid_of(key);
    int n = 0;
    if (r && r->route && r->route[layer].ready) {
        n = r->route[layer].k;
        memcpy(ids, r->route[layer].ids, sizeof(int) * (size_t)n);
        r->route[layer].ready = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return n > 0;
}
void cu_rt_shared_drop(uint64_t key) {
    Resid *r = resid_of(key);
    if (r) r->sh_valid = 0;
}
float *cu_rt_resid(uint64_t key, size_t n, int need_valid, int **valid) {
    Resid *r = NULL;
    for (int i = 0; i < NRESID && !r; i++)
        if (g_resid[i].key == key && g_resid[i].p) r = &g_resid[i];
    if (!r) {
        if (need_valid) { snprintf(g_err, sizeof g_err, "no device residual for this caller (evicted or never written)"); return NULL; }
        r = &g_resid[0]; /* a free entry, else the least recently used one */
        for (int i = 1; i < NRESID && r->p; i++)
            if (!g_resid[i].p || g_resid[i].tick < r->tick) r = &g_resid[i];
        r->key = key;
        r->valid = 0;
        r->sh_valid = 0;
        if (r->route) /* another caller's routings: not reported to this one */
            for (int l = 0; l < DF_MAX_LAYERS; l++) {
                if (r->route[l].qcall) g_npend--;
                r->route[l].qcall = 0;
                r->route[l].ready = 0;
            }
    }
    if (need_valid && !r->valid) { snprintf(g_err, sizeof g_err, "the device residual holds no row yet"); return NULL; }
    if (sizeof(float) * n > r->cap) {
        if (need_valid) { snprintf(g_err, sizeof g_err, "the device residual holds fewer rows than asked for"); return NULL; }
        r->valid = 0;
        if (grow(&r->p, &r->cap, sizeof(float) * n)) return NULL;
    }
    r->tick = ++g_resid_tick;
    if (valid) *valid = &r->valid;
    return (float *)r->p;
}
int cu_rt_error(const char *msg) {
    snprintf(g_err, sizeof g_err, "%s", msg);
    return -1;
}
