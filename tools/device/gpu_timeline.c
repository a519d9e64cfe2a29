/*
 * gpu_timeline.c — where a process's GPU is busy and where it idles, from CUPTI's activity records (kernels,
 * memcpys, memsets); a developer tool for the accelerator machine, which has no Nsight Systems.
 *
 * Built as a preload library (tools/device/build_timeline.sh; links libcupti from the CUDA toolkit) and used as
 *   GT_LAST_MS=150 LD_PRELOAD=.../libgpu_timeline.so deltafin run ...
 * At exit it prints, on stderr, for the last GT_LAST_MS milliseconds (default 150) of the recorded timeline: the
 * span, the time some activity ran (the union over streams), the idle time, a histogram of the idle gaps, the gaps
 * summed by (activity before -> activity after), and each activity's count and summed duration.
 * Records reach it through CUPTI's buffer callbacks (flushed every 20 ms and when a context is destroyed).
 */
#define _GNU_SOURCE
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

typedef struct {
    uint64_t start, end;
    int name; /* index into g_names */
    uint32_t stream, corr;
} Act;
/* host-side runtime API calls: start, end, name, correlation id (the GPU activity it launched, if any) */
static Act *g_api;
static size_t g_napi, g_capi;

static Act *g_act;
static size_t g_n, g_cap;
static char **g_names;
static int g_nnames;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static CUpti_SubscriberHandle g_sub;

static int intern(const char *s) {
    for (int i = 0; i < g_nnames; i++)
        if (!strcmp(g_names[i], s)) return i;
    g_names = realloc(g_names, sizeof(char *) * (size_t)(g_nnames + 1));
    g_names[g_nnames] = strdup(s);
    return g_nnames++;
}

static void add_api(uint64_t s, uint64_t e, const char *name, uint32_t corr) {
    if (g_napi == g_capi) {
        g_capi = g_capi ? 2 * g_capi : 1 << 16;
        g_api = realloc(g_api, sizeof(Act) * g_capi);
    }
    g_api[g_napi++] = (Act){s, e, intern(name), 0, corr};
}

static void add(uint64_t s, uint64_t e, const char *name, uint32_t stream, uint32_t corr) {
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 1 << 16;
        g_act = realloc(g_act, sizeof(Act) * g_cap);
    }
    char buf[96];
    snprintf(buf, sizeof buf, "%.80s", name);
    char *p = strchr(buf, '(');
    if (p) *p = 0;
    g_act[g_n++] = (Act){s, e, intern(buf), stream, corr};
}

static void CUPTIAPI buf_req(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buffer = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx; (void)stream_id; (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&g_mu);
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            add(k->start, k->end, k->name ? k->name : "?", k->streamId, k->correlationId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            const char *kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "memcpy HtoD"
                               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "memcpy DtoH"
                               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "memcpy DtoD"
                                                                                : "memcpy other";
            add(m->start, m->end, kind, m->streamId, m->correlationId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            add(m->start, m->end, "memset", m->streamId, m->correlationId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *nm = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &nm);
            add_api(a->start, a->end, nm ? nm : "?", a->correlationId);
        }
    }
    pthread_mutex_unlock(&g_mu);
    free(buffer);
}

static void CUPTIAPI on_resource(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *data) {
    (void)ud; (void)data;
    if (dom == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) cuptiActivityFlushAll(1);
}

static int by_start(const void *a, const void *b) {
    const Act *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

typedef struct {
    int a, b;
    double ns;
    long n;
} Pair;

/* The `top` pairs with the most time, largest first, one line each: "gpu_timeline: LABEL <ms> in <n> gaps (mean <us>)
 * SEP <before> -> <after>"; each printed pair's count is cleared. */
static void print_pairs(Pair *p, size_t np, int top, const char *label, const char *sep) {
    for (int k = 0; k < top; k++) {
        size_t best = np;
        for (size_t j = 0; j < np; j++) if (p[j].n && (best == np || p[j].ns > p[best].ns)) best = j;
        if (best == np) break;
        fprintf(stderr, "gpu_timeline: %s %8.3f ms in %6ld gaps (mean %7.2f us)%s %.44s -> %.44s\n", label, p[best].ns / 1e6,
                p[best].n, p[best].ns / p[best].n / 1e3, sep, g_names[p[best].a], g_names[p[best].b]);
        p[best].n = 0;
    }
}

/* The `top` names with the most time (dur, ns) of those counted (cnt), largest first: "gpu_timeline: LABEL <ms> <n> x
 * <us>: <name>"; each printed name's count is cleared. */
static void print_names(const double *dur, long *cnt, int top, const char *label) {
    for (int k = 0; k < top; k++) {
        int best = -1;
        for (int j = 0; j < g_nnames; j++) if (cnt[j] && (best < 0 || dur[j] > dur[best])) best = j;
        if (best < 0) break;
        fprintf(stderr, "gpu_timeline: %s %8.3f ms %6ld x %7.2f us: %s\n", label, dur[best] / 1e6, cnt[best],
                dur[best] / cnt[best] / 1e3, g_names[best]);
        cnt[best] = 0;
    }
}

static void report(void) {
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&g_mu);
    if (!g_n) { fprintf(stderr, "gpu_timeline: no activity recorded\n"); pthread_mutex_unlock(&g_mu); return; }
    qsort(g_act, g_n, sizeof(Act), by_start);
    uint64_t last = 0;
    for (size_t i = 0; i < g_n; i++) if (g_act[i].end > last) last = g_act[i].end;
    const char *lm = getenv("GT_LAST_MS");
    const double win = (lm ? atof(lm) : 150.0) * 1e6;
    const uint64_t from = (double)last > win ? last - (uint64_t)win : 0;
    size_t i0 = 0;
    while (i0 < g_n && g_act[i0].start < from) i0++;
    if (i0 == g_n) { pthread_mutex_unlock(&g_mu); return; }
    double busy = 0, idle = 0;
    double hist[7] = {0};
    long hn[7] = {0};
    const double edge[6] = {1e3, 2e3, 5e3, 10e3, 50e3, 200e3};
    Pair *pairs = calloc((size_t)g_nnames * g_nnames, sizeof(Pair));
    double *dur = calloc((size_t)g_nnames, sizeof(double));
    long *cnt = calloc((size_t)g_nnames, sizeof(long));
    uint64_t cur_end = g_act[i0].start;
    int cur_name = g_act[i0].name;
    for (size_t i = i0; i < g_n; i++) {
        const Act *a = &g_act[i];
        dur[a->name] += (double)(a->end - a->start);
        cnt[a->name]++;
        if (a->start > cur_end) {
            const double gap = (double)(a->start - cur_end);
            idle += gap;
            int h = 0;
            while (h < 6 && gap >= edge[h]) h++;
            hist[h] += gap;
            hn[h]++;
            Pair *p = &pairs[cur_name * g_nnames + a->name];
            p->a = cur_name; p->b = a->name; p->ns += gap; p->n++;
            busy += (double)(a->end - a->start);
            cur_end = a->end;
            cur_name = a->name;
        } else if (a->end > cur_end) {
            busy += (double)(a->end - cur_end);
            cur_end = a->end;
            cur_name = a->name;
        }
    }
    const double span = (double)(cur_end - g_act[i0].start);
    fprintf(stderr, "gpu_timeline: last %.1f ms: span %.3f ms, busy %.3f ms (%.1f%%), idle %.3f ms, %zu activities\n",
            win / 1e6, span / 1e6, busy / 1e6, 100 * busy / span, idle / 1e6, g_n - i0);
    const char *hl[7] = {"<1us", "1-2us", "2-5us", "5-10us", "10-50us", "50-200us", ">=200us"};
    for (int h = 0; h < 7; h++)
        fprintf(stderr, "gpu_timeline: gaps %-8s %7ld  %8.3f ms\n", hl[h], hn[h], hist[h] / 1e6);
    const size_t np = (size_t)g_nnames * g_nnames;
    print_pairs(pairs, np, 24, "idle", ":");
    print_names(dur, cnt, 40, "ran");
    /* host side: each runtime call's count and time in the window; then, for every gap before a GPU activity, whether
     * the call that queued that activity returned after the GPU went idle (the host was late) */
    qsort(g_api, g_napi, sizeof(Act), by_start);
    double *adur = calloc((size_t)g_nnames, sizeof(double));
    long *acnt = calloc((size_t)g_nnames, sizeof(long));
    double in_api = 0;
    uint64_t api_end = 0;
    for (size_t i = 0; i < g_napi; i++) {
        const Act *a = &g_api[i];
        if (a->start < from || a->start > last) continue; /* not the exit's teardown after the GPU's last activity */
        adur[a->name] += (double)(a->end - a->start);
        acnt[a->name]++;
        if (a->end > api_end) { in_api += (double)(a->end - (a->start > api_end ? a->start : api_end)); api_end = a->end; }
    }
    fprintf(stderr, "gpu_timeline: host in CUDA runtime calls %.3f ms of the %.3f ms span\n", in_api / 1e6, span / 1e6);
    /* the host's time between runtime calls (outside CUDA), summed by (call before -> call after), gaps >= 10 us */
    {
        Pair *hp = calloc(np, sizeof(Pair));
        uint64_t pe = 0;
        int pn = -1;
        double out = 0;
        for (size_t i = 0; i < g_napi; i++) {
            const Act *a = &g_api[i];
            if (a->start < from || a->start > last) continue;
            if (pn >= 0 && a->start > pe && a->start - pe >= 10000) {
                Pair *p = &hp[pn * g_nnames + a->name];
                p->a = pn; p->b = a->name; p->ns += (double)(a->start - pe); p->n++;
                out += (double)(a->start - pe);
            }
            if (a->end > pe) { pe = a->end; pn = a->name; }
        }
        fprintf(stderr, "gpu_timeline: host outside runtime calls in gaps >= 10 us: %.3f ms\n", out / 1e6);
        print_pairs(hp, np, 8, "host", " between");
        free(hp);
    }
    print_names(adur, acnt, 16, "host");
    /* correlation id -> the API record (ids grow; a direct table) */
    uint32_t cmax = 0;
    for (size_t i = 0; i < g_napi; i++) if (g_api[i].corr > cmax) cmax = g_api[i].corr;
    int64_t *cix = malloc(sizeof(int64_t) * ((size_t)cmax + 1));
    for (size_t i = 0; i <= cmax; i++) cix[i] = -1;
    for (size_t i = 0; i < g_napi; i++) cix[g_api[i].corr] = (int64_t)i;
    double late = 0, dev = 0;
    long nlate = 0, ndev = 0;
    uint64_t ce = g_act[i0].start;
    for (size_t i = i0; i < g_n; i++) {
        const Act *a = &g_act[i];
        if (a->start > ce) {
            const double gap = (double)(a->start - ce);
            const int64_t j = a->corr <= cmax ? cix[a->corr] : -1;
            if (j >= 0 && g_api[j].end > ce) { late += gap; nlate++; }
            else { dev += gap; ndev++; }
        }
        if (a->end > ce) ce = a->end;
    }
    fprintf(stderr, "gpu_timeline: idle with the host late (the next activity queued after the GPU went idle) %.3f ms in "
            "%ld gaps; idle with it queued before %.3f ms in %ld gaps\n", late / 1e6, nlate, dev / 1e6, ndev);
    free(cix); free(adur); free(acnt);
    free(pairs); free(dur); free(cnt);
    pthread_mutex_unlock(&g_mu);
}

__attribute__((constructor)) static void gt_init(void) {
    cuptiActivityRegisterCallbacks(buf_req, buf_done);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityFlushPeriod(20);
    if (cuptiSubscribe(&g_sub, (CUpti_CallbackFunc)on_resource, NULL) == CUPTI_SUCCESS)
        cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
    atexit(report);
}
