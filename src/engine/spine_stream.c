/*
 * spine_stream.c — spine streaming (see spine_stream.h): a layout of
 * spine.bin's arrays into resident memory and per-layer staging reads, one
 * reader thread, two staging buffers (layer l uses buffer (l - n_res) % 2).
 * Reads: pread with O_DIRECT on 4 KiB-aligned runs (buffered pread where the
 * filesystem refuses O_DIRECT, e.g. tmpfs).
 */
#define _GNU_SOURCE
#include "spine_stream.h"
#include "deltafin.h"
#include "model/spine.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define SST_ALIGN 4096ull
#define SST_GAP (64ull * 1024) /* arrays closer than this are read in one run (the gap holds vectors) */
#define NONE UINT64_MAX

static uint64_t up64(uint64_t x) { return (x + 63) & ~63ull; }
static uint64_t up4k(uint64_t x) { return (x + SST_ALIGN - 1) & ~(SST_ALIGN - 1); }
static uint64_t dn4k(uint64_t x) { return x & ~(SST_ALIGN - 1); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    uint64_t off, bytes;     /* in spine.bin */
    int tensor, scale;       /* tensor index, 1 = its scale array */
} sst_array;

typedef struct {
    uint64_t a_start, a_end; /* 4 KiB-aligned file range */
    uint64_t need_end;       /* last byte actually needed (a short read at EOF may stop there) */
    uint64_t buf_off;        /* where a_start lands in the staging buffer */
} sst_run;

typedef struct {
    int n_runs;
    sst_run *runs;
    uint64_t span;
    int n_refs;
    spine_wref refs[SPINE_MAX_WREFS];
} sst_layer_plan;

enum { S_EMPTY, S_QUEUED, S_LOADING, S_READY, S_ERROR };

typedef struct {
    uint8_t *buf;
    int layer, state, rc;
    uint64_t seq;
    char err[512];
} sst_slot;

struct spine_stream {
    const df_native *n;
    df_spine *spine;
    int L, n_res;
    int *tensor_layer;        /* [n_tensors] layer whose 2-D weight it is, or -1 */
    uint64_t *res_data, *res_scale;     /* [n_tensors] offset in res_buf, or NONE */
    uint64_t *stg_data, *stg_scale;     /* [n_tensors] offset in a staging buffer, or NONE */
    sst_layer_plan *lp;       /* [L] */
    uint8_t *res_buf;
    uint64_t res_bytes;
    uint8_t *stage_mem;       /* 2 * stage_bytes, 4 KiB-aligned */
    uint64_t stage_bytes;
    int fd, fd_direct, direct_ok;
    pthread_t thread;
    int thread_started, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sst_slot slot[2];
    uint64_t seq;
    uint64_t bytes_read;
};

/* ------------------------------------------------------------------ plan */

/* tensor_layer[i] for every tensor (the 2-D weights spine_layer_wrefs names), and the layers' refs. */
static int classify(const df_native *n, int *tensor_layer, sst_layer_plan *lp) {
    for (int i = 0; i < n->n_tensors; i++) tensor_layer[i] = -1;
    for (int l = 0; l < n->cfg.num_hidden_layers; l++) {
        spine_wref refs[SPINE_MAX_WREFS];
        int k = spine_layer_wrefs(n, l, NULL, refs);
        for (int j = 0; j < k; j++) tensor_layer[refs[j].t - n->tensors] = l;
        if (lp) lp[l].n_refs = k;
    }
    return 0;
}

static int cmp_array(const void *a, const void *b) {
    const sst_array *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Runs of layer l's arrays (sorted, merged across small gaps, 4 KiB-aligned); stg_* offsets when given. */
static int layer_runs(const df_native *n, const int *tensor_layer, int l, sst_layer_plan *out, uint64_t *stg_data,
                      uint64_t *stg_scale) {
    int cnt = 0;
    for (int i = 0; i < n->n_tensors; i++)
        if (tensor_layer[i] == l) cnt += 1 + (n->tensors[i].scale_bytes > 0);
    sst_array *a = malloc(sizeof *a * (size_t)(cnt ? cnt : 1));
    sst_run *r = malloc(sizeof *r * (size_t)(cnt ? cnt : 1));
    if (!a || !r) { free(a); free(r); return DF_ENOMEM; }
    int k = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        if (tensor_layer[i] != l) continue;
        a[k++] = (sst_array){n->tensors[i].offset, n->tensors[i].bytes, i, 0};
        if (n->tensors[i].scale_bytes) a[k++] = (sst_array){n->tensors[i].scale_offset, n->tensors[i].scale_bytes, i, 1};
    }
    qsort(a, (size_t)k, sizeof *a, cmp_array);
    int nr = 0;
    uint64_t pos = 0;
    for (int j = 0; j < k; j++) {
        uint64_t end = a[j].off + a[j].bytes;
        if (nr == 0 || a[j].off > r[nr - 1].need_end + SST_GAP) {
            if (nr) pos += r[nr - 1].a_end - r[nr - 1].a_start;
            r[nr++] = (sst_run){dn4k(a[j].off), up4k(end), end, pos};
        } else if (end > r[nr - 1].need_end) {
            r[nr - 1].need_end = end;
            r[nr - 1].a_end = up4k(end);
        }
        const sst_run *cur = &r[nr - 1];
        uint64_t at = cur->buf_off + (a[j].off - cur->a_start);
        if (a[j].scale) { if (stg_scale) stg_scale[a[j].tensor] = at; }
        else if (stg_data) stg_data[a[j].tensor] = at;
    }
    if (nr) pos += r[nr - 1].a_end - r[nr - 1].a_start;
    free(a);
    out->n_runs = nr;
    out->runs = r;
    out->span = pos;
    return 0;
}

int sst_plan_make(const df_native *n, sst_plan *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    int L = n->cfg.num_hidden_layers;
    p->n_layers = L;
    int *tl = malloc(sizeof(int) * (size_t)(n->n_tensors ? n->n_tensors : 1));
    p->layer_bytes = calloc((size_t)L + 1, sizeof(uint64_t));
    p->layer_span = calloc((size_t)L + 1, sizeof(uint64_t));
    if (!tl || !p->layer_bytes || !p->layer_span) {
        free(tl);
        sst_plan_free(p);
        return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    }
    classify(n, tl, NULL);
    for (int i = 0; i < n->n_tensors; i++) {
        uint64_t b = up64(n->tensors[i].bytes) + up64(n->tensors[i].scale_bytes);
        if (tl[i] >= 0) p->layer_bytes[tl[i]] += b;
        else p->global_bytes += b;
    }
    for (int l = 0; l < L; l++) {
        sst_layer_plan lp;
        if (layer_runs(n, tl, l, &lp, NULL, NULL)) {
            free(tl);
            sst_plan_free(p);
            return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        }
        p->layer_span[l] = lp.span;
        free(lp.runs);
    }
    free(tl);
    return DF_OK;
}

void sst_plan_free(sst_plan *p) {
    free(p->layer_bytes);
    free(p->layer_span);
    memset(p, 0, sizeof *p);
}

uint64_t sst_plan_resident(const sst_plan *p, int n_res) {
    uint64_t b = p->global_bytes;
    for (int l = 0; l < n_res && l < p->n_layers; l++) b += p->layer_bytes[l];
    return b;
}

uint64_t sst_plan_stage(const sst_plan *p, int n_res) {
    uint64_t m = 0;
    for (int l = n_res < 0 ? 0 : n_res; l < p->n_layers; l++)
        if (p->layer_span[l] > m) m = p->layer_span[l];
    return m;
}

/* ------------------------------------------------------------------ reads */

/* pread all of [off, off+len) (or up to EOF, at least `need` bytes) into buf. */
static int read_range(spine_stream *s, uint8_t *buf, uint64_t off, uint64_t len, uint64_t need, char *err, size_t errlen) {
    uint64_t got = 0;
    while (got < len) {
        int fd = s->direct_ok ? s->fd_direct : s->fd;
        size_t chunk = len - got > (1u << 30) ? (1u << 30) : (size_t)(len - got);
        ssize_t r = pread(fd, buf + got, chunk, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL && s->direct_ok) { s->direct_ok = 0; continue; } /* O_DIRECT refused */
        if (r < 0)
            return df_set_errc(err, errlen, DF_EIO, "%s: read failed at offset %llu (%s)", s->n->spine_path,
                               (unsigned long long)(off + got), strerror(errno));
        if (r == 0) break;
        got += (uint64_t)r;
    }
    if (got < need)
        return df_set_errc(err, errlen, DF_EIO, "%s: unexpected end of file at offset %llu (truncated?); re-run `deltafin convert`",
                           s->n->spine_path, (unsigned long long)(off + got));
    return DF_OK;
}

static int read_layer(spine_stream *s, int l, uint8_t *buf, char *err, size_t errlen) {
    const sst_layer_plan *lp = &s->lp[l];
    for (int j = 0; j < lp->n_runs; j++) {
        const sst_run *r = &lp->runs[j];
        int rc = read_range(s, buf + r->buf_off, r->a_start, r->a_end - r->a_start, r->need_end - r->a_start, err, errlen);
        if (rc) return rc;
        __atomic_add_fetch(&s->bytes_read, r->a_end - r->a_start, __ATOMIC_RELAXED);
    }
    return DF_OK;
}

static void *reader_main(void *arg) {
    spine_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sst_slot *pick = NULL;
        while (!s->quit) {
            for (int i = 0; i < 2; i++)
                if (s->slot[i].state == S_QUEUED && (!pick || s->slot[i].seq < pick->seq)) pick = &s->slot[i];
            if (pick) break;
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->quit) break;
        pick->state = S_LOADING;
        int l = pick->layer;
        pthread_mutex_unlock(&s->mu);
        char e[512] = "";
        int rc = read_layer(s, l, pick->buf, e, sizeof e);
        pthread_mutex_lock(&s->mu);
        pick->rc = rc;
        if (rc) snprintf(pick->err, sizeof pick->err, "spine layer %d: %s", l, e);
        pick->state = rc ? S_ERROR : S_READY;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------------ open / close */

static const void *map_resident(void *user, const native_tensor *t, int scale) {
    spine_stream *s = user;
    size_t i = (size_t)(t - s->n->tensors);
    uint64_t o = scale ? s->res_scale[i] : s->res_data[i];
    return o == NONE ? NULL : s->res_buf + o;
}

/* One sequential pass over spine.bin through the staging memory: XXH64 and the resident copies. */
static int initial_pass(spine_stream *s, char *err, size_t errlen) {
    const df_native *n = s->n;
    struct stat st;
    if (fstat(s->fd, &st) != 0 || (uint64_t)st.st_size != n->spine_bytes)
        return df_set_errc(err, errlen, DF_EFORMAT,
                           "%s: size %lld bytes, manifest says %llu (truncated or replaced); re-run `deltafin convert`",
                           n->spine_path, (long long)st.st_size, (unsigned long long)n->spine_bytes);
    /* resident arrays sorted by file offset */
    int cnt = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        if (s->res_data[i] != NONE) cnt++;
        if (s->res_scale[i] != NONE) cnt++;
    }
    sst_array *a = malloc(sizeof *a * (size_t)(cnt ? cnt : 1));
    XXH64_state_t *h = XXH64_createState();
    if (!a || !h) { free(a); if (h) XXH64_freeState(h); return df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); }
    int k = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        if (s->res_data[i] != NONE) a[k++] = (sst_array){n->tensors[i].offset, n->tensors[i].bytes, i, 0};
        if (s->res_scale[i] != NONE) a[k++] = (sst_array){n->tensors[i].scale_offset, n->tensors[i].scale_bytes, i, 1};
    }
    qsort(a, (size_t)k, sizeof *a, cmp_array);
    XXH64_reset(h, 0);
    uint64_t chunk = 2 * s->stage_bytes, pos = 0;
    int cur = 0, rc = DF_OK;
    while (pos < n->spine_bytes) {
        uint64_t len = n->spine_bytes - pos < chunk ? up4k(n->spine_bytes - pos) : chunk;
        uint64_t need = n->spine_bytes - pos < len ? n->spine_bytes - pos : len;
        rc = read_range(s, s->stage_mem, pos, len, need, err, errlen);
        if (rc) break;
        XXH64_update(h, s->stage_mem, (size_t)need);
        uint64_t end = pos + need;
        while (cur < k && a[cur].off < end) {
            uint64_t lo = a[cur].off > pos ? a[cur].off : pos;
            uint64_t ae = a[cur].off + a[cur].bytes, hi = ae < end ? ae : end;
            uint64_t dst = (a[cur].scale ? s->res_scale[a[cur].tensor] : s->res_data[a[cur].tensor]) + (lo - a[cur].off);
            if (hi > lo) memcpy(s->res_buf + dst, s->stage_mem + (lo - pos), (size_t)(hi - lo));
            if (ae <= end) cur++;
            else break;
        }
        pos = end;
    }
    free(a);
    if (!rc) {
        uint64_t d = XXH64_digest(h);
        if (d != n->spine_xxh64)
            rc = df_set_errc(err, errlen, DF_EFORMAT,
                             "%s: checksum mismatch (xxh64 %016llx, manifest %016llx): the file is corrupt; re-run `deltafin convert`",
                             n->spine_path, (unsigned long long)d, (unsigned long long)n->spine_xxh64);
    }
    XXH64_freeState(h);
    return rc;
}

int sst_open(spine_stream **out, const df_native *n, int n_res, df_spine *spine, char *err, size_t errlen) {
    *out = NULL;
    int L = n->cfg.num_hidden_layers, NT = n->n_tensors ? n->n_tensors : 1;
    if (n_res < 0 || n_res >= L) return df_set_errc(err, errlen, DF_EINVAL, "spine streaming: %d resident layers of %d", n_res, L);
    spine_stream *s = calloc(1, sizeof *s);
    if (!s) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    s->n = n;
    s->spine = spine;
    s->L = L;
    s->n_res = n_res;
    s->fd = s->fd_direct = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int i = 0; i < 2; i++) s->slot[i].layer = -1;
    int rc = DF_OK;
    s->tensor_layer = malloc(sizeof(int) * (size_t)NT);
    s->res_data = malloc(sizeof(uint64_t) * (size_t)NT);
    s->res_scale = malloc(sizeof(uint64_t) * (size_t)NT);
    s->stg_data = malloc(sizeof(uint64_t) * (size_t)NT);
    s->stg_scale = malloc(sizeof(uint64_t) * (size_t)NT);
    s->lp = calloc((size_t)L, sizeof *s->lp);
    if (!s->tensor_layer || !s->res_data || !s->res_scale || !s->stg_data || !s->stg_scale || !s->lp) {
        rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        goto fail;
    }
    classify(n, s->tensor_layer, NULL);
    /* resident layout: globals, vectors and layers < n_res, 64-byte packed */
    uint64_t pos = 0;
    for (int i = 0; i < n->n_tensors; i++) {
        s->res_data[i] = s->res_scale[i] = s->stg_data[i] = s->stg_scale[i] = NONE;
        if (s->tensor_layer[i] >= n_res) continue;
        s->res_data[i] = pos;
        pos += up64(n->tensors[i].bytes);
        if (n->tensors[i].scale_bytes) {
            s->res_scale[i] = pos;
            pos += up64(n->tensors[i].scale_bytes);
        }
    }
    s->res_bytes = pos;
    for (int l = n_res; l < L; l++) {
        if (layer_runs(n, s->tensor_layer, l, &s->lp[l], s->stg_data, s->stg_scale)) {
            rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
            goto fail;
        }
        if (s->lp[l].span > s->stage_bytes) s->stage_bytes = s->lp[l].span;
    }
    if (s->stage_bytes < SST_ALIGN) s->stage_bytes = SST_ALIGN;
    if (posix_memalign((void **)&s->res_buf, 4096, s->res_bytes ? s->res_bytes : 64)) {
        s->res_buf = NULL;
        rc = df_set_errc(err, errlen, DF_ENOMEM, "cannot allocate %llu bytes for the resident spine", (unsigned long long)s->res_bytes);
        goto fail;
    }
    if (posix_memalign((void **)&s->stage_mem, SST_ALIGN, 2 * s->stage_bytes)) {
        s->stage_mem = NULL;
        rc = df_set_errc(err, errlen, DF_ENOMEM, "cannot allocate 2 x %llu bytes of spine staging buffers",
                         (unsigned long long)s->stage_bytes);
        goto fail;
    }
    s->slot[0].buf = s->stage_mem;
    s->slot[1].buf = s->stage_mem + s->stage_bytes;
    s->fd = open(n->spine_path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        rc = df_set_errc(err, errlen, DF_EIO, "%s: cannot open (%s); re-run `deltafin convert`", n->spine_path, strerror(errno));
        goto fail;
    }
    s->fd_direct = open(n->spine_path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    s->direct_ok = s->fd_direct >= 0;
    if ((rc = initial_pass(s, err, errlen))) goto fail;
    if ((rc = spine_build_mapped(n, map_resident, s, spine, err, errlen))) goto fail;
    for (int l = n_res; l < L; l++) s->lp[l].n_refs = spine_layer_wrefs(n, l, &spine->layers[l], s->lp[l].refs);
    if (pthread_create(&s->thread, NULL, reader_main, s)) {
        spine_free(spine);
        rc = df_set_errc(err, errlen, DF_ENOMEM, "cannot start the spine reader thread");
        goto fail;
    }
    s->thread_started = 1;
    s->bytes_read = 0;
    *out = s;
    return DF_OK;
fail:
    sst_close(s);
    return rc;
}

void sst_close(spine_stream *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->fd_direct >= 0) close(s->fd_direct);
    if (s->fd >= 0) close(s->fd);
    if (s->lp)
        for (int l = 0; l < s->L; l++) free(s->lp[l].runs);
    free(s->lp);
    free(s->tensor_layer);
    free(s->res_data);
    free(s->res_scale);
    free(s->stg_data);
    free(s->stg_scale);
    free(s->res_buf);
    free(s->stage_mem);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* ------------------------------------------------------------------ use */

static void start_locked(spine_stream *s, int l) {
    sst_slot *sl = &s->slot[(l - s->n_res) & 1];
    if (sl->layer == l && (sl->state == S_QUEUED || sl->state == S_LOADING || sl->state == S_READY)) return;
    while (sl->state == S_LOADING) pthread_cond_wait(&s->cv, &s->mu);
    sl->layer = l;
    sl->state = S_QUEUED;
    sl->rc = 0;
    sl->seq = ++s->seq;
    pthread_cond_broadcast(&s->cv);
}

void sst_start(spine_stream *s, int l) {
    if (!s || l < s->n_res || l >= s->L) return;
    pthread_mutex_lock(&s->mu);
    start_locked(s, l);
    pthread_mutex_unlock(&s->mu);
}

int sst_layer(spine_stream *s, int l, double *wait_s, char *err, size_t errlen) {
    if (!s || l < s->n_res || l >= s->L) return DF_OK;
    pthread_mutex_lock(&s->mu);
    start_locked(s, l);
    sst_slot *sl = &s->slot[(l - s->n_res) & 1];
    if (sl->state != S_READY && sl->state != S_ERROR) {
        double t0 = now_s();
        while (sl->layer == l && (sl->state == S_QUEUED || sl->state == S_LOADING)) pthread_cond_wait(&s->cv, &s->mu);
        if (wait_s) *wait_s += now_s() - t0;
    }
    int rc = DF_OK;
    if (sl->layer != l || sl->state != S_READY) {
        rc = sl->state == S_ERROR && sl->rc ? sl->rc : DF_EIO;
        df_set_errc(err, errlen, rc, "%s", sl->state == S_ERROR ? sl->err : "spine streaming: staging buffer lost its layer (internal)");
        sl->state = S_EMPTY;
        sl->layer = -1;
    } else {
        const sst_layer_plan *lp = &s->lp[l];
        for (int j = 0; j < lp->n_refs; j++) {
            size_t i = (size_t)(lp->refs[j].t - s->n->tensors);
            lp->refs[j].w->data = sl->buf + s->stg_data[i];
            lp->refs[j].w->scale = lp->refs[j].t->scale_bytes ? sl->buf + s->stg_scale[i] : NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sst_n_resident(const spine_stream *s) { return s ? s->n_res : 0; }
int sst_first_streamed(const spine_stream *s) { return s ? s->n_res : 0; }
uint64_t sst_memory_bytes(const spine_stream *s) { return s ? s->res_bytes + 2 * s->stage_bytes : 0; }
uint64_t sst_stage_bytes(const spine_stream *s) { return s ? s->stage_bytes : 0; }
uint64_t sst_bytes_read(const spine_stream *s) { return s ? __atomic_load_n(&s->bytes_read, __ATOMIC_RELAXED) : 0; }
