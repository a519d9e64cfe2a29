/* stream.c — the remote expert source of streamed installs (stream.h). */
#define _GNU_SOURCE
#include "stream.h"
#include "hub.h"
#include "deltafin.h"
#include "model/hf_encodings.h"
#include "model/native.h"
#include "model/safetensors.h"
#include "store/store.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAGIC "DFSTRM1"
#define STATE_HDR 16

typedef struct req {
    int layer, expert;
    void *token;
    struct req *next;
} req;

struct stream_src {
    char dir[2048];
    hub_ctx h;
    df_native *nat;
    st_set *st;
    hf_quant q;
    char prefix[32], blk[24];
    int w123;
    int n_layers, n_experts;
    int state_fd;
    uint8_t *present;
    uint64_t *xxh;
    char (*sha)[65];            /* [st->n_files] */
    int *shard_fd;              /* [st->n_files] O_RDWR */
    int **pack_fd;              /* [n_layers][files of the layer] O_WRONLY, -1 until used */
    store_remote remote;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *head, *tail;
    pthread_t th[16];
    int nth, stop;
    stream_stats stats;
    /* bounded disk cache: at most disk_budget bytes of fetched extents (0 = unbounded); the victim is the present
     * expert with the lowest heat (store heat.bin prior + this run's uses) not used in the last `protect` uses */
    uint64_t disk_budget, clock, protect;
    float *heat;                /* [n_layers * n_experts] */
    uint64_t *last_use;         /* [n_layers * n_experts] clock of the last use */
    uint64_t n_present;
};

int stream_is_streamed(const char *model_dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/stream.json", model_dir);
    return df_path_exists(p);
}

static uint64_t state_size(int L, int E) { return STATE_HDR + (uint64_t)L * (uint64_t)E * 9u; }

int stream_init_files(const char *model_dir, const char *json_text, char *err, size_t errlen) {
    df_native *nat = NULL;
    int rc = native_open(&nat, model_dir, err, errlen);
    if (rc) return rc;
    int layers = nat->cfg.num_hidden_layers, experts = nat->n_experts;
    for (int i = 0; i < nat->n_moe_layers && !rc; i++)
        for (int k = 0; k < nat->moe_layers[i].n_files && !rc; k++) {
            const char *f = nat->moe_layers[i].files[k];
            int fd = open(f, O_WRONLY | O_CLOEXEC);
            off_t end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
            if (fd < 0 || end < 0 || (end > 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, end) != 0 &&
                                      errno != EOPNOTSUPP))
                rc = df_set_errc(err, errlen, DF_EIO, "cannot make %s sparse: %s", f, strerror(errno));
            if (fd >= 0) close(fd);
        }
    native_close(nat);
    if (rc) return rc;
    char p[4200];
    snprintf(p, sizeof p, "%s/stream-state.bin", model_dir);
    uint64_t n = state_size(layers, experts);
    uint8_t *b = calloc(1, n);
    if (!b) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    memcpy(b, STATE_MAGIC, 8);
    uint32_t l = (uint32_t)layers, e = (uint32_t)experts;
    memcpy(b + 8, &l, 4);
    memcpy(b + 12, &e, 4);
    rc = df_write_file_atomic(p, b, n, err, errlen);
    free(b);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s/stream.json", model_dir);
    return df_write_file_atomic(p, json_text, strlen(json_text), err, errlen);
}

/* "...experts.N..." (a routed expert; shared_experts has no ".experts.N") */
static int routed_expert_name(const char *n) {
    const char *p = strstr(n, ".experts.");
    return p && p[9] >= '0' && p[9] <= '9';
}

typedef struct { uint64_t b, e; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b;
}

typedef struct {
    const hub_ctx *h;
    const char *file, *path, *sha256;
    int fd;
    span *pieces;
    uint64_t n, next, fetched;
    int rc;
    char err[1024];
    pthread_mutex_t mu;
} spine_job;

static void *spine_worker(void *arg) {
    spine_job *J = arg;
    uint8_t *buf = malloc((size_t)4 << 20);
    for (;;) {
        pthread_mutex_lock(&J->mu);
        int stop = J->rc || J->next >= J->n || !buf;
        if (!buf && !J->rc) { J->rc = DF_ENOMEM; snprintf(J->err, sizeof J->err, "out of memory"); }
        if (!stop && df_interrupted()) { J->rc = DF_ECANCELLED; snprintf(J->err, sizeof J->err, "interrupted; run the same setup again to resume"); stop = 1; }
        span p = stop ? (span){0, 0} : J->pieces[J->next++];
        pthread_mutex_unlock(&J->mu);
        if (stop) break;
        char e[1024];
        uint64_t len = p.e - p.b;
        int rc = hub_get_range(J->h, J->file, p.b, len, buf, J->sha256, e, sizeof e);
        if (!rc && df_pwrite_all(J->fd, buf, len, p.b)) rc = df_set_errc(e, sizeof e, DF_EIO, "cannot write %s: %s", J->path, strerror(errno));
        pthread_mutex_lock(&J->mu);
        if (rc && !J->rc) { J->rc = rc; snprintf(J->err, sizeof J->err, "%s", e); }
        if (!rc) J->fetched += len;
        pthread_mutex_unlock(&J->mu);
    }
    free(buf);
    return NULL;
}

int stream_fetch_spine(const void *hub, const char *dir, const char *file, uint64_t size, const char *sha256, int connections,
                       uint64_t *fetched, char *err, size_t errlen) {
    const hub_ctx *h = hub;
    char path[4200], mark[4300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(mark, sizeof mark, "%s.spine-ok", path);
    *fetched = 0;
    if (df_path_exists(mark)) return 0;
    uint64_t hlen = 0;
    int rc = hub_get_range(h, file, 0, 8, &hlen, sha256, err, errlen);
    if (rc) return rc;
    if (hlen < 2 || hlen > ((uint64_t)100 << 20) || 8 + hlen > size)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s on %s: header length %llu is not a safetensors header", file, h->mirror,
                           (unsigned long long)hlen);
    char *hdr = malloc(hlen + 1);
    if (!hdr) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    if ((rc = hub_get_range(h, file, 8, hlen, hdr, sha256, err, errlen))) { free(hdr); return rc; }
    hdr[hlen] = 0;
    *fetched += 8 + hlen;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || df_pwrite_all(fd, &hlen, 8, 0) || df_pwrite_all(fd, hdr, hlen, 8)) {
        rc = df_set_errc(err, errlen, DF_EIO, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        free(hdr);
        return rc;
    }
    cJSON *j = cJSON_Parse(hdr);
    free(hdr);
    if (!cJSON_IsObject(j)) { close(fd); cJSON_Delete(j); return df_set_errc(err, errlen, DF_EFORMAT, "%s: safetensors header is not JSON", file); }
    int n = cJSON_GetArraySize(j), k = 0;
    span *sp = calloc((size_t)(n ? n : 1), sizeof(span));
    const cJSON *t;
    cJSON_ArrayForEach(t, j) {
        if (!t->string || !strcmp(t->string, "__metadata__") || routed_expert_name(t->string)) continue;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        if (cJSON_GetArraySize(o) != 2) continue;
        uint64_t b = (uint64_t)cJSON_GetArrayItem(o, 0)->valuedouble, e = (uint64_t)cJSON_GetArrayItem(o, 1)->valuedouble;
        if (e > b && sp) { sp[k].b = 8 + hlen + b; sp[k].e = 8 + hlen + e; k++; }
    }
    cJSON_Delete(j);
    if (!sp) { close(fd); return df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); }
    qsort(sp, (size_t)k, sizeof(span), cmp_span);
    /* merged spans (adjacent tensors: one range), cut into pieces of at most 4 MiB, fetched by `connections` threads */
    int m = 0;
    for (int i = 0; i < k; i++) {
        if (m && sp[i].b <= sp[m - 1].e) { if (sp[i].e > sp[m - 1].e) sp[m - 1].e = sp[i].e; }
        else sp[m++] = sp[i];
    }
    spine_job J = {h, file, path, sha256, fd, NULL, 0, 0, 0, 0, "", PTHREAD_MUTEX_INITIALIZER};
    const uint64_t piece = (uint64_t)4 << 20;
    uint64_t np = 0;
    for (int i = 0; i < m; i++) {
        if (sp[i].e > size) { rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: a tensor ends past the file (%llu > %llu)", file,
                                               (unsigned long long)sp[i].e, (unsigned long long)size); break; }
        np += (sp[i].e - sp[i].b + piece - 1) / piece;
    }
    if (!rc && np) {
        J.pieces = malloc(sizeof(span) * np);
        if (!J.pieces) rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        for (int i = 0; i < m && J.pieces; i++)
            for (uint64_t o = sp[i].b; o < sp[i].e; o += piece) J.pieces[J.n++] = (span){o, o + piece < sp[i].e ? o + piece : sp[i].e};
    }
    if (!rc && J.n) {
        int nt = connections < 1 ? 1 : connections > 32 ? 32 : connections;
        if ((uint64_t)nt > J.n) nt = (int)J.n;
        df_run_workers(nt, spine_worker, &J);
        if (J.rc) rc = df_set_errc(err, errlen, J.rc, "%s", J.err);
        *fetched += J.fetched;
    }
    free(J.pieces);
    free(sp);
    if (!rc && fdatasync(fd) != 0) rc = df_set_errc(err, errlen, DF_EIO, "cannot sync %s: %s", path, strerror(errno));
    close(fd);
    if (!rc) rc = df_write_file_atomic(mark, "", 0, err, errlen);
    return rc;
}

static int load_state(const char *dir, int L, int E, int *fd, uint8_t **present, uint64_t **xxh, char *err, size_t errlen) {
    char p[4200];
    snprintf(p, sizeof p, "%s/stream-state.bin", dir);
    *fd = open(p, O_RDWR | O_CLOEXEC);
    if (*fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s (run `deltafin setup --stream` again)", p, strerror(errno));
    uint8_t hdr[STATE_HDR];
    uint32_t l = 0, e = 0;
    if (df_pread_all(*fd, hdr, STATE_HDR, 0) == 0) { memcpy(&l, hdr + 8, 4); memcpy(&e, hdr + 12, 4); }
    if (memcmp(hdr, STATE_MAGIC, 8) || (int)l != L || (int)e != E)
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: not the stream state of this model (%u x %u experts, the manifest has %d x %d)",
                           p, l, e, L, E);
    size_t n = (size_t)L * (size_t)E;
    *present = malloc(n ? n : 1);
    *xxh = malloc(8 * (n ? n : 1));
    if (!*present || !*xxh) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    if (df_pread_all(*fd, *present, n, STATE_HDR) || df_pread_all(*fd, *xxh, 8 * n, STATE_HDR + n))
        return df_set_errc(err, errlen, DF_EFORMAT, "%s: truncated", p);
    return 0;
}

double stream_local_percent(const char *model_dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/stream-state.bin", model_dir);
    char *b = NULL;
    size_t len = 0;
    if (df_read_file(p, &b, &len, NULL, 0)) return -1;
    uint32_t l = 0, e = 0;
    double f = -1;
    if (len >= STATE_HDR && !memcmp(b, STATE_MAGIC, 8)) {
        memcpy(&l, b + 8, 4);
        memcpy(&e, b + 12, 4);
        uint64_t n = (uint64_t)l * e, have = 0, all = 0;
        if (len >= state_size((int)l, (int)e)) {
            for (uint64_t i = 0; i < n; i++) have += (uint8_t)b[STATE_HDR + i];
            all = n;
        }
        /* only MoE layers count: dense layers' entries stay 0 */
        (void)all;
        char man[4200];
        snprintf(man, sizeof man, "%s", model_dir);
        df_native *nat = NULL;
        if (native_open(&nat, man, NULL, 0) == 0) {
            uint64_t tot = (uint64_t)nat->n_moe_layers * (uint64_t)nat->n_experts;
            f = tot ? 100.0 * (double)have / (double)tot : 100.0; /* as stream_print_stats computes it: the same rounding */
            native_close(nat);
        }
    }
    free(b);
    return f;
}

/* The checkpoint's base name of routed expert `e`, part p (0 gate, 1 up, 2 down), of layer l. */
static void expert_base(const stream_src *s, int l, int e, int p, char *out, size_t cap) {
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"}, *const pw[3] = {"w1", "w3", "w2"};
    snprintf(out, cap, "%smodel.layers.%d.%s.experts.%d.%s", s->prefix, l, s->blk, e, s->w123 ? pw[p] : pn[p]);
}

static int file_of(const stream_src *s, const uint8_t *ptr) {
    for (int i = 0; i < s->st->n_files; i++) {
        const uint8_t *m = s->st->files[i].map;
        if (ptr >= m && ptr < m + s->st->files[i].size) return i;
    }
    return -1;
}

/* Fetch the byte span [ptr, ptr + len) of the mapped checkpoint from the mirror into the sparse shard. */
static int fetch_span(stream_src *s, const uint8_t *ptr, uint64_t len, char *err, size_t errlen) {
    int fi = file_of(s, ptr);
    if (fi < 0) return df_set_errc(err, errlen, DF_EFORMAT, "expert tensor outside every shard");
    uint64_t off = (uint64_t)(ptr - (const uint8_t *)s->st->files[fi].map);
    uint8_t *tmp = malloc(len ? len : 1);
    if (!tmp) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    const char *path = s->st->files[fi].path, *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int rc = hub_get_range(&s->h, base, off, len, tmp, s->sha[fi], err, errlen);
    if (!rc && df_pwrite_all(s->shard_fd[fi], tmp, len, off))
        rc = df_set_errc(err, errlen, DF_EIO, "cannot write %s: %s", path, strerror(errno));
    free(tmp);
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        s->stats.net_bytes += len;
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* Make room for one more extent under disk_budget: evict the coldest present experts (state first, then a hole
 * punched over every stripe). mu held. Experts used in the last `protect` uses are kept (a store may be about to
 * read them); when nothing else is left the budget is exceeded rather than failing the fetch. */
static void make_room(stream_src *s) {
    if (!s->disk_budget) return;
    size_t N = (size_t)s->n_layers * (size_t)s->n_experts;
    while ((s->n_present + 1) * s->nat->stride > s->disk_budget) {
        size_t victim = N;
        for (size_t i = 0; i < N; i++) {
            if (!s->present[i] || s->last_use[i] + s->protect > s->clock) continue;
            if (victim == N || s->heat[i] < s->heat[victim] || (s->heat[i] == s->heat[victim] && s->last_use[i] < s->last_use[victim]))
                victim = i;
        }
        if (victim == N) return;
        int layer = (int)(victim / (size_t)s->n_experts), e = (int)(victim % (size_t)s->n_experts);
        uint8_t zero = 0;
        s->present[victim] = 0;
        s->n_present--;
        s->stats.evictions++;
        df_pwrite_all(s->state_fd, &zero, 1, STATE_HDR + victim);
        const native_expert_layer *L = s->nat->by_layer[layer];
        for (int k = 0; L && k < L->n_files; k++) {
            if (s->pack_fd[layer][k] < 0) s->pack_fd[layer][k] = open(L->files[k], O_WRONLY | O_CLOEXEC);
            uint64_t sz = native_stripe_size(L, k);
            if (s->pack_fd[layer][k] >= 0)
                fallocate(s->pack_fd[layer][k], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((uint64_t)e * sz), (off_t)sz);
        }
    }
}

/* Fetch, assemble, write and record one expert; *xxh_out its extent checksum. buf: the extent buffer. */
static int fetch_expert(stream_src *s, int layer, int e, uint8_t *buf, uint64_t *xxh_out, char *err, size_t errlen) {
    const df_native *n = s->nat;
    native_expert_layer *L = layer >= 0 && layer < n->cfg.num_hidden_layers ? n->by_layer[layer] : NULL;
    if (!L) return df_set_errc(err, errlen, DF_EINVAL, "layer %d has no routed experts", layer);
    double t0 = df_now();
    hf_weight w[3];
    char base[256];
    for (int p = 0; p < 3; p++) {
        expert_base(s, layer, e, p, base, sizeof base);
        int rc = hf_weight_get(s->st, &s->q, base, &w[p], err, errlen);
        if (rc) return rc;
        const native_expert_part *P = &n->parts[p];
        if (w[p].rows != P->rows || w[p].cols != P->cols || hf_data_bytes(&w[p]) != P->bytes || hf_scale_bytes(&w[p]) != P->scale_bytes)
            return df_set_errc(err, errlen, DF_EFORMAT, "routed expert %s: shape or size differs from the manifest's %s part", base, P->name);
        rc = fetch_span(s, w[p].data, (w[p].data_rows - 1) * w[p].data_row_stride + w[p].data_row_bytes, err, errlen);
        if (!rc && w[p].scale_rows)
            rc = fetch_span(s, w[p].scale, (w[p].scale_rows - 1) * w[p].scale_row_stride + w[p].scale_row_bytes, err, errlen);
        if (rc) return rc;
    }
    uint64_t bufsz = native_extent_buf_bytes(n, layer);
    memset(buf, 0, bufsz);
    for (int p = 0; p < 3; p++) {
        const native_expert_part *P = &n->parts[p];
        hf_weight_copy(&w[p], buf + P->offset, P->scale_bytes ? buf + P->scale_offset : NULL);
    }
    uint64_t x = df_xxh64(buf, n->stride);
    pthread_mutex_lock(&s->mu);
    make_room(s);
    pthread_mutex_unlock(&s->mu);
    uint64_t begin = 0;
    for (int k = 0; k < L->n_files; k++) {
        uint64_t sz = native_stripe_size(L, k);
        pthread_mutex_lock(&s->mu);
        if (s->pack_fd[layer][k] < 0) s->pack_fd[layer][k] = open(L->files[k], O_WRONLY | O_CLOEXEC);
        int fd = s->pack_fd[layer][k];
        pthread_mutex_unlock(&s->mu);
        if (fd < 0 || df_pwrite_all(fd, buf + begin, sz, (uint64_t)e * sz) || fdatasync(fd))
            return df_set_errc(err, errlen, DF_EIO, "cannot write expert %d of layer %d into %s: %s", e, layer, L->files[k], strerror(errno));
        begin += sz;
    }
    size_t idx = (size_t)layer * (size_t)s->n_experts + (size_t)e, N = (size_t)s->n_layers * (size_t)s->n_experts;
    uint8_t one = 1;
    pthread_mutex_lock(&s->mu);
    s->xxh[idx] = x;
    if (!s->present[idx]) s->n_present++;
    s->present[idx] = 1;
    s->last_use[idx] = ++s->clock;
    int r = df_pwrite_all(s->state_fd, &x, 8, STATE_HDR + N + 8 * idx);
    if (!r) r = df_pwrite_all(s->state_fd, &one, 1, STATE_HDR + idx);
    double dt = df_now() - t0;
    s->stats.fetches++;
    s->stats.fetch_s += dt;
    if (dt > s->stats.fetch_max_s) s->stats.fetch_max_s = dt;
    pthread_mutex_unlock(&s->mu);
    if (r) return df_set_errc(err, errlen, DF_EIO, "cannot write %s/stream-state.bin: %s", s->dir, strerror(-r));
    *xxh_out = x;
    return 0;
}

static uint64_t max_extent(const stream_src *s) {
    uint64_t m = 0;
    for (int i = 0; i < s->nat->n_moe_layers; i++) {
        uint64_t b = native_extent_buf_bytes(s->nat, s->nat->moe_layers[i].layer);
        if (b > m) m = b;
    }
    return m;
}

static void *worker(void *arg) {
    stream_src *s = arg;
    uint8_t *buf = df_aligned_alloc(4096, max_extent(s));
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) { pthread_mutex_unlock(&s->mu); break; }
        req *r = s->head;
        s->head = r->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        char err[1024] = "";
        uint64_t x = 0;
        int rc = buf ? fetch_expert(s, r->layer, r->expert, buf, &x, err, sizeof err) : DF_ENOMEM;
        if (rc && !err[0]) snprintf(err, sizeof err, "out of memory");
        if (rc) {
            char msg[1200];
            snprintf(msg, sizeof msg, "streaming expert %d of layer %d from %s: %s", r->expert, r->layer, s->h.mirror, err);
            store_remote_done(r->token, rc, msg, 0);
        } else store_remote_done(r->token, 0, NULL, x);
        free(r);
    }
    df_aligned_free(buf);
    return NULL;
}

static int cb_lookup(void *user, int layer, int expert, uint64_t *xxh) {
    stream_src *s = user;
    size_t idx = (size_t)layer * (size_t)s->n_experts + (size_t)expert;
    pthread_mutex_lock(&s->mu);
    int missing = !s->present[idx];
    if (!missing) { *xxh = s->xxh[idx]; s->stats.local_hits++; }
    s->heat[idx] += 1.0f;
    s->last_use[idx] = ++s->clock;
    pthread_mutex_unlock(&s->mu);
    return missing;
}

static void cb_fetch(void *user, int layer, int expert, void *token) {
    stream_src *s = user;
    req *r = calloc(1, sizeof *r);
    if (!r) { store_remote_done(token, DF_ENOMEM, "out of memory", 0); return; }
    r->layer = layer; r->expert = expert; r->token = token;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = r; else s->head = r;
    s->tail = r;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int stream_open(stream_src **out, const char *model_dir, int threads, char *err, size_t errlen) {
    *out = NULL;
    stream_src *s = calloc(1, sizeof *s);
    if (!s) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    s->state_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    snprintf(s->dir, sizeof s->dir, "%s", model_dir);
    char p[4200], *txt = NULL;
    int rc;
    cJSON *j = NULL;
    snprintf(p, sizeof p, "%s/stream.json", model_dir);
    if ((rc = df_read_file(p, &txt, NULL, err, errlen))) goto fail;
    j = cJSON_Parse(txt);
    free(txt);
    const cJSON *repo = cJSON_GetObjectItemCaseSensitive(j, "repo"), *rev = cJSON_GetObjectItemCaseSensitive(j, "revision"),
                *mir = cJSON_GetObjectItemCaseSensitive(j, "mirror"), *ck = cJSON_GetObjectItemCaseSensitive(j, "checkpoint"),
                *sh = cJSON_GetObjectItemCaseSensitive(j, "shards");
    if (!cJSON_IsString(repo) || !cJSON_IsString(rev) || !cJSON_IsString(mir) || !cJSON_IsString(ck) || !cJSON_IsObject(sh)) {
        rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: expected {\"repo\", \"revision\", \"mirror\", \"checkpoint\", \"shards\"}", p);
        goto fail;
    }
    if ((rc = hub_init(&s->h, mir->valuestring, repo->valuestring, rev->valuestring, err, errlen))) goto fail;
    snprintf(s->h.streamed, sizeof s->h.streamed, "%s", model_dir); /* the fetch errors say what to do with a streamed install */
    if ((rc = native_open(&s->nat, model_dir, err, errlen))) goto fail;
    if ((rc = st_open_dir(&s->st, ck->valuestring, err, errlen))) goto fail;
    snprintf(p, sizeof p, "%s/config.json", ck->valuestring);
    if ((rc = df_read_file(p, &txt, NULL, err, errlen))) goto fail;
    cJSON *cfg = cJSON_Parse(txt);
    free(txt);
    rc = cfg ? hf_quant_parse(cfg, &s->q, p, err, errlen) : df_set_errc(err, errlen, DF_EFORMAT, "%s: not JSON", p);
    cJSON_Delete(cfg);
    if (rc) goto fail;
    s->n_layers = s->nat->cfg.num_hidden_layers;
    s->n_experts = s->nat->n_experts;
    if ((rc = load_state(model_dir, s->n_layers, s->n_experts, &s->state_fd, &s->present, &s->xxh, err, errlen))) goto fail;
    size_t NN = (size_t)s->n_layers * (size_t)s->n_experts;
    s->heat = calloc(NN ? NN : 1, sizeof(float));
    s->last_use = calloc(NN ? NN : 1, sizeof(uint64_t));
    if (!s->heat || !s->last_use) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
    for (size_t i = 0; i < NN; i++) s->n_present += s->present[i];
    const cJSON *db = cJSON_GetObjectItemCaseSensitive(j, "disk_budget");
    if (cJSON_IsNumber(db) && db->valuedouble > 0) s->disk_budget = (uint64_t)db->valuedouble;
    s->protect = 2u * (uint64_t)(s->nat->cfg.num_experts_per_tok > 0 ? s->nat->cfg.num_experts_per_tok : 8) * (uint64_t)s->nat->n_moe_layers;
    {
        /* heat prior: the store's persistent histogram (heat.bin: "DFHEAT1", u32 layers, u32 experts, u64 id, f64, f32[]) */
        char hp[4200], *hb = NULL;
        size_t hl = 0;
        snprintf(hp, sizeof hp, "%s/heat.bin", model_dir);
        if (df_read_file(hp, &hb, &hl, NULL, 0) == 0 && hl >= 32 + 4 * NN && !memcmp(hb, "DFHEAT1", 7)) {
            uint32_t hL, hE;
            memcpy(&hL, hb + 8, 4);
            memcpy(&hE, hb + 12, 4);
            if ((int)hL == s->n_layers && (int)hE == s->n_experts) memcpy(s->heat, hb + 32, 4 * NN);
        }
        free(hb);
    }
    s->sha = calloc((size_t)s->st->n_files, sizeof *s->sha);
    s->shard_fd = calloc((size_t)s->st->n_files, sizeof(int));
    s->pack_fd = calloc((size_t)s->n_layers, sizeof(int *));
    if (!s->sha || !s->shard_fd || !s->pack_fd) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < s->st->n_files; i++) {
        const char *path = s->st->files[i].path, *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(sh, b);
        if (cJSON_IsString(h)) snprintf(s->sha[i], 65, "%s", h->valuestring);
        s->shard_fd[i] = open(path, O_RDWR | O_CLOEXEC);
        if (s->shard_fd[i] < 0) { rc = df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s", path, strerror(errno)); goto fail; }
    }
    for (int l = 0; l < s->n_layers; l++) {
        const native_expert_layer *L = s->nat->by_layer[l];
        if (!L) continue;
        s->pack_fd[l] = malloc(sizeof(int) * (size_t)L->n_files);
        if (!s->pack_fd[l]) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
        for (int k = 0; k < L->n_files; k++) s->pack_fd[l][k] = -1;
    }
    /* the checkpoint's names of routed experts: probe the first MoE layer's expert 0 */
    int first = s->nat->n_moe_layers ? s->nat->moe_layers[0].layer : -1;
    static const char *const prefixes[] = {"", "language_model."}, *const blks[] = {"mlp", "block_sparse_moe"};
    int found = first < 0;
    for (int a = 0; a < 2 && !found; a++)
        for (int b = 0; b < 2 && !found; b++)
            for (int c = 0; c < 2 && !found; c++) {
                snprintf(s->prefix, sizeof s->prefix, "%s", prefixes[a]);
                snprintf(s->blk, sizeof s->blk, "%s", blks[b]);
                s->w123 = c;
                char base[256];
                hf_weight w;
                expert_base(s, first, 0, 0, base, sizeof base);
                found = hf_weight_get(s->st, &s->q, base, &w, NULL, 0) == 0;
            }
    if (!found) {
        rc = df_set_errc(err, errlen, DF_EUNSUPPORTED, "streamed install %s: routed experts of layer %d not found by name in %s "
                         "(this checkpoint's expert layout cannot be streamed; use `deltafin setup --full`)", model_dir, first, ck->valuestring);
        goto fail;
    }
    cJSON_Delete(j);
    j = NULL;
    s->remote.lookup = cb_lookup;
    s->remote.fetch = cb_fetch;
    s->remote.user = s;
    s->nth = threads > 0 ? (threads > 16 ? 16 : threads) : 4;
    for (int i = 0; i < s->nth; i++)
        if (pthread_create(&s->th[i], NULL, worker, s) != 0) { s->nth = i; break; }
    *out = s;
    return 0;
fail:
    cJSON_Delete(j);
    stream_close(s);
    return rc;
}

const void *stream_remote(stream_src *s) { return &s->remote; }

void stream_get_stats(stream_src *s, stream_stats *o) {
    pthread_mutex_lock(&s->mu);
    *o = s->stats;
    uint64_t have = 0;
    size_t N = (size_t)s->n_layers * (size_t)s->n_experts;
    for (size_t i = 0; i < N; i++) have += s->present[i];
    o->present = have;
    o->total = (uint64_t)s->nat->n_moe_layers * (uint64_t)s->n_experts;
    pthread_mutex_unlock(&s->mu);
}

void stream_print_stats(stream_src *s, FILE *f) {
    stream_stats t;
    stream_get_stats(s, &t);
    char cache[96] = "unbounded";
    if (s->disk_budget)
        snprintf(cache, sizeof cache, "%.2f MB (%llu extents)", s->disk_budget / 1e6, (unsigned long long)(s->disk_budget / s->nat->stride));
    fprintf(f, "stream: network %.2f MB in %llu expert fetches (mean %.1f ms, worst %.1f ms), local hits %llu, "
               "experts present %llu / %llu (%.1f%%), disk cache %s, %llu evicted\n", t.net_bytes / 1e6, (unsigned long long)t.fetches,
            t.fetches ? 1e3 * t.fetch_s / (double)t.fetches : 0.0, 1e3 * t.fetch_max_s, (unsigned long long)t.local_hits,
            (unsigned long long)t.present, (unsigned long long)t.total, t.total ? 100.0 * (double)t.present / (double)t.total : 100.0,
            cache, (unsigned long long)t.evictions);
}

int stream_fetch_now(stream_src *s, int layer, int expert, char *err, size_t errlen) {
    if (layer < 0 || layer >= s->n_layers || expert < 0 || expert >= s->n_experts || !s->nat->by_layer[layer])
        return df_set_errc(err, errlen, DF_EINVAL, "no routed expert %d in layer %d", expert, layer);
    size_t idx = (size_t)layer * (size_t)s->n_experts + (size_t)expert;
    pthread_mutex_lock(&s->mu);
    int have = s->present[idx];
    pthread_mutex_unlock(&s->mu);
    if (have) return 1;
    uint8_t *buf = df_aligned_alloc(4096, max_extent(s));
    if (!buf) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    uint64_t x;
    int rc = fetch_expert(s, layer, expert, buf, &x, err, errlen);
    df_aligned_free(buf);
    return rc;
}

/* "...layers.L.<block>.experts.E...." -> L, E; 0 when the name is no routed expert's. */
static int expert_of(const char *n, int *layer, int *expert) {
    const char *p = strstr(n, "layers."), *q = strstr(n, ".experts.");
    if (!p || !q || q[9] < '0' || q[9] > '9') return 0;
    *layer = atoi(p + 7);
    *expert = atoi(q + 9);
    return 1;
}

int stream_drop_spine(const char *dir, const char *file, uint64_t *dropped, char *err, size_t errlen) {
    char path[4200], mark[4300], mark2[4300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(mark, sizeof mark, "%s.spine-ok", path);
    snprintf(mark2, sizeof mark2, "%s.experts-only", path);
    *dropped = 0;
    if (!df_path_exists(mark)) return 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint64_t hlen = 0;
    struct stat st;
    char *hdr = NULL;
    int rc = 0;
    if (fd < 0 || fstat(fd, &st) || df_pread_all(fd, &hlen, 8, 0) || hlen > ((uint64_t)100 << 20) || 8 + hlen > (uint64_t)st.st_size ||
        !(hdr = malloc(hlen + 1)) || df_pread_all(fd, hdr, hlen, 8))
        rc = df_set_errc(err, errlen, DF_EIO, "%s: cannot read its safetensors header", path);
    cJSON *j = NULL;
    if (!rc) { hdr[hlen] = 0; j = cJSON_Parse(hdr); }
    free(hdr);
    const cJSON *t;
    if (!rc)
        cJSON_ArrayForEach(t, j) {
            if (!t->string || !strcmp(t->string, "__metadata__") || routed_expert_name(t->string)) continue;
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
            if (cJSON_GetArraySize(o) != 2) continue;
            /* whole pages only: a partial page is shared with the header or an expert tensor */
            uint64_t b = df_round_up(8 + hlen + (uint64_t)cJSON_GetArrayItem(o, 0)->valuedouble, 4096);
            uint64_t e = (8 + hlen + (uint64_t)cJSON_GetArrayItem(o, 1)->valuedouble) / 4096 * 4096;
            if (e > b && e <= (uint64_t)st.st_size && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b, (off_t)(e - b)) == 0)
                *dropped += e - b;
        }
    cJSON_Delete(j);
    if (fd >= 0) close(fd);
    if (!rc) rc = df_write_file_atomic(mark2, "", 0, err, errlen);
    if (!rc) unlink(mark);
    return rc;
}

int stream_seed_full(const char *model_dir, const char *dir, const char *file, uint64_t size, const char *sha256,
                     uint64_t chunk, uint64_t *kept, char *err, size_t errlen) {
    char path[4200], mark[4300], mark2[4300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(mark, sizeof mark, "%s.spine-ok", path);
    snprintf(mark2, sizeof mark2, "%s.experts-only", path);
    *kept = 0;
    int spine_held = df_path_exists(mark);
    if (!spine_held && !df_path_exists(mark2)) return 0;
    int fdp = -1;
    uint8_t *present = NULL;
    uint64_t *xxh = NULL;
    df_native *nat = NULL;
    int rc = native_open(&nat, model_dir, err, errlen);
    if (!rc) rc = load_state(model_dir, nat->cfg.num_hidden_layers, nat->n_experts, &fdp, &present, &xxh, err, errlen);
    int L = nat ? nat->cfg.num_hidden_layers : 0, E = nat ? nat->n_experts : 0;
    if (nat) native_close(nat);
    if (fdp >= 0) close(fdp);
    free(xxh);
    char *hdr = NULL;
    uint64_t hlen = 0;
    int fd = rc ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    if (!rc && (fd < 0 || df_pread_all(fd, &hlen, 8, 0) || hlen > ((uint64_t)100 << 20) || 8 + hlen > size ||
                !(hdr = malloc(hlen + 1)) || df_pread_all(fd, hdr, hlen, 8)))
        rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: cannot read its safetensors header", path);
    if (fd >= 0) close(fd);
    cJSON *j = NULL;
    if (!rc) { hdr[hlen] = 0; j = cJSON_Parse(hdr); }
    free(hdr);
    if (!rc && !cJSON_IsObject(j)) rc = df_set_errc(err, errlen, DF_EFORMAT, "%s: safetensors header is not JSON", path);
    span *sp = NULL;
    int k = 0;
    if (!rc) {
        sp = calloc((size_t)cJSON_GetArraySize(j) + 1, sizeof(span));
        if (!sp) rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    }
    if (!rc) {
        sp[k++] = (span){0, 8 + hlen};
        const cJSON *t;
        cJSON_ArrayForEach(t, j) {
            if (!t->string || !strcmp(t->string, "__metadata__")) continue;
            int l, e, is_expert = expert_of(t->string, &l, &e);
            if (is_expert && !(l >= 0 && l < L && e >= 0 && e < E && present[(size_t)l * (size_t)E + (size_t)e])) continue;
            if (!is_expert && !spine_held) continue; /* the spine was dropped after the conversion */
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
            if (cJSON_GetArraySize(o) != 2) continue;
            uint64_t b = 8 + hlen + (uint64_t)cJSON_GetArrayItem(o, 0)->valuedouble, en = 8 + hlen + (uint64_t)cJSON_GetArrayItem(o, 1)->valuedouble;
            if (en > b && en <= size) sp[k++] = (span){b, en};
        }
        qsort(sp, (size_t)k, sizeof(span), cmp_span);
    }
    cJSON_Delete(j);
    free(present);
    uint64_t nch = (size + chunk - 1) / chunk;
    uint64_t *done = rc ? NULL : calloc(nch ? nch : 1, 8);
    if (!rc && !done) rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
    if (!rc) {
        /* merged spans, then per chunk the covered prefix from its start */
        int m = 0;
        for (int i = 0; i < k; i++) {
            if (m && sp[i].b <= sp[m - 1].e) { if (sp[i].e > sp[m - 1].e) sp[m - 1].e = sp[i].e; }
            else sp[m++] = sp[i];
        }
        int si = 0;
        for (uint64_t c = 0; c < nch; c++) {
            uint64_t c0 = c * chunk, c1 = c0 + chunk < size ? c0 + chunk : size;
            while (si < m && sp[si].e <= c0) si++;
            if (si < m && sp[si].b <= c0) done[c] = (sp[si].e < c1 ? sp[si].e : c1) - c0;
            *kept += done[c];
        }
        rc = hub_seed_partial(path, size, sha256, chunk, done, nch, err, errlen);
        if (!rc) { unlink(mark); unlink(mark2); }
    }
    free(done);
    free(sp);
    return rc;
}

int stream_verify_local(stream_src *s, uint64_t *n_ok, uint64_t *n_bad, FILE *f) {
    *n_ok = *n_bad = 0;
    uint8_t *buf = df_aligned_alloc(4096, max_extent(s));
    if (!buf) return DF_ENOMEM;
    for (int l = 0; l < s->n_layers; l++) {
        if (!s->nat->by_layer[l]) continue;
        for (int e = 0; e < s->n_experts; e++) {
            size_t idx = (size_t)l * (size_t)s->n_experts + (size_t)e;
            if (!s->present[idx]) continue;
            char err[1024];
            int rc = native_read_expert(s->nat, l, e, buf, err, sizeof err);
            uint64_t x = rc ? 0 : df_xxh64(buf, s->nat->stride);
            if (rc || x != s->xxh[idx]) {
                (*n_bad)++;
                if (rc) fprintf(f, "deltafin doctor: streamed expert layer %d expert %d: %s\n", l, e, err);
                else fprintf(f, "deltafin doctor: streamed expert layer %d expert %d in %s: XXH64 %016llx, recorded at fetch %016llx\n",
                             l, e, s->nat->by_layer[l]->files[0], (unsigned long long)x, (unsigned long long)s->xxh[idx]);
            } else (*n_ok)++;
        }
    }
    df_aligned_free(buf);
    return (int)(*n_bad > 0x7fffffff ? 0x7fffffff : *n_bad);
}

uint64_t stream_expert_bytes(stream_src *s, int layer) {
    if (layer < 0 || layer >= s->n_layers || !s->nat->by_layer[layer]) return 0;
    return s->nat->stride;
}

void stream_close(stream_src *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nth; i++) pthread_join(s->th[i], NULL);
    while (s->head) { req *r = s->head; s->head = r->next; free(r); }
    if (s->pack_fd) {
        for (int l = 0; l < s->n_layers; l++) {
            const native_expert_layer *L = s->nat ? s->nat->by_layer[l] : NULL;
            for (int k = 0; L && s->pack_fd[l] && k < L->n_files; k++)
                if (s->pack_fd[l][k] >= 0) close(s->pack_fd[l][k]);
            free(s->pack_fd[l]);
        }
        free(s->pack_fd);
    }
    for (int i = 0; s->shard_fd && s->st && i < s->st->n_files; i++)
        if (s->shard_fd[i] > 0) close(s->shard_fd[i]);
    free(s->shard_fd);
    free(s->sha);
    if (s->state_fd >= 0) close(s->state_fd);
    free(s->present);
    free(s->xxh);
    free(s->heat);
    free(s->last_use);
    if (s->st) st_close(s->st);
    if (s->nat) native_close(s->nat);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
