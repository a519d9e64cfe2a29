/*
 * store.c — the expert store: slots, lookups, demand/prefetch requests,
 * acquire/release, eviction, checksums on first read, stats and events.
 * The reads themselves are done by the drive queues of store_io.c; the
 * persistent heat histogram lives in store_heat.c.
 *
 * Eviction (policy 0): the victim is the unpinned resident expert with the
 * lowest score = recency-weighted access count (each access weighs
 * decay^(visits of its layer since), LRFU) + persistent heat prior, ties going
 * to the least recently used. Plain LRU is a bad fit for MoE decode: layers
 * are visited cyclically, so the least recently used expert belongs to the
 * layer that runs next. policy 1 keeps LRU for comparisons.
 */
#define _GNU_SOURCE
#include "store_internal.h"
#include "deltafin.h"
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static void slot_free(df_store *st, uint8_t *p);
static void *prefault_main(void *arg);

#define KEY(st, l, e) ((l) * (st)->n_experts + (e))

static int seterr(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int seterr(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

double store_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void store_opts_default(store_opts *o) {
    memset(o, 0, sizeof *o);
    o->use_uring = 1;
    o->verify = 1;
    o->io_depth = 0;
    o->hot_fraction = -1;
}

uint64_t store_slot_bytes(const struct df_native *nat) {
    uint64_t b = nat->stride;
    for (int i = 0; i < nat->n_moe_layers; i++) {
        const native_expert_layer *L = &nat->moe_layers[i];
        uint64_t s = native_stripe_begin(L, L->n_files);
        if (s > b) b = s;
    }
    return b;
}

static const char *fmt_size(char out[32], uint64_t b) {
    if (b >= (1ull << 30)) snprintf(out, 32, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(out, 32, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(out, 32, "%.1f KiB", b / 1024.0);
    else snprintf(out, 32, "%llu B", (unsigned long long)b);
    return out;
}

int store_budget(const struct df_native *nat, uint64_t budget, uint64_t spine_bytes, uint64_t kv_bytes,
                 uint64_t other_bytes, uint64_t *cache_bytes, char *err, size_t errlen) {
    *cache_bytes = 0;
    if (budget == 0) return DF_OK;
    uint64_t slot = store_slot_bytes(nat);
    int k = nat->cfg.num_experts_per_tok > 0 ? nat->cfg.num_experts_per_tok : 1;
    uint64_t min_cache = nat->n_moe_layers > 0 ? 2ull * k * slot : 0;
    /* the store's own tables (per-expert index, counters, heat); code, libraries and thread stacks (~9 MiB of RSS
     * for deltafin) are not weight memory and are not counted (issue 4: weights + staging + KV) */
    uint64_t keys = (uint64_t)nat->cfg.num_hidden_layers * (nat->n_experts > 0 ? nat->n_experts : 1);
    uint64_t store_meta = keys * (sizeof(int) + 2 + sizeof(float) * 2 + sizeof(double)) + 64 * 1024;
    uint64_t fixed = spine_bytes + kv_bytes + other_bytes + store_meta;
    uint64_t minimum = fixed + min_cache;
    if (budget < minimum) {
        char b[7][32], cache_term[160] = ""; /* a dense model (no routed experts) has no expert cache to name */
        if (min_cache)
            snprintf(cache_term, sizeof cache_term, " + minimum expert cache %s (2 x top-%d slots of %llu bytes)",
                     fmt_size(b[4], min_cache), k, (unsigned long long)slot);
        return seterr(err, errlen, DF_EBUDGET,
                      "--ram-budget %s is too small for %s: spine %s + KV cache %s + other %s + store tables %s%s "
                      "= %llu bytes (%s); raise --ram-budget to at least that",
                      fmt_size(b[0], budget), nat->name, fmt_size(b[1], spine_bytes), fmt_size(b[2], kv_bytes),
                      fmt_size(b[3], other_bytes), fmt_size(b[6], store_meta), cache_term,
                      (unsigned long long)minimum, fmt_size(b[5], minimum));
    }
    uint64_t c = budget - fixed;
    if (c < slot) c = slot; /* only when the model has no MoE layers */
    *cache_bytes = c;
    return DF_OK;
}

void store_event(df_store *st, const char *fmt, ...) {
    if (!st->events) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(st->events, "{\"t\":%.6f,", store_now() - st->t0);
    vfprintf(st->events, fmt, ap);
    fputs("}\n", st->events);
    va_end(ap);
}

/* ------------------------------------------------------------------ open */

static int open_pack(df_store *st, const char *path, int *fd, int *fd_buf, char *err, size_t errlen) {
    *fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd_buf < 0)
        return seterr(err, errlen, DF_EIO, "cannot open expert pack %s: %s (check --expert-dirs / the model directory)",
                      path, strerror(errno));
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (*fd < 0) *fd = *fd_buf; /* filesystem without O_DIRECT (tmpfs): buffered reads */
    return 0;
}

static int drive_for_dir(df_store *st, const char *dir, char *err, size_t errlen) {
    for (int d = 0; d < st->n_drives; d++)
        if (!strcmp(st->drives[d].dir, dir)) return d;
    if (st->n_drives >= STORE_MAX_DRIVES)
        return seterr(err, errlen, DF_EUNSUPPORTED, "more than %d expert directories (%s)", STORE_MAX_DRIVES, dir);
    store_drive *dr = &st->drives[st->n_drives];
    memset(dr, 0, sizeof *dr);
    dr->st = st;
    dr->id = st->n_drives;
    snprintf(dr->dir, sizeof dr->dir, "%s", dir);
    pthread_cond_init(&dr->cv, NULL);
    return st->n_drives++;
}

/* Split "a,b,c" into dirs (malloc'd copies); returns count or <0. */
static int split_dirs(const char *s, char ***out) {
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    char **v = calloc(n, sizeof *v);
    if (!v) return DF_ENOMEM;
    int k = 0;
    const char *p = s;
    while (1) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        v[k] = strndup(p, len);
        k++;
        if (!c) break;
        p = c + 1;
    }
    *out = v;
    return k;
}

int store_open(df_store **out, const struct df_native *nat, const store_opts *o, char *err, size_t errlen) {
    *out = NULL;
    df_store *st = calloc(1, sizeof *st);
    if (!st) return seterr(err, errlen, DF_ENOMEM, "out of memory opening the expert store");
    if (o) st->o = *o; else store_opts_default(&st->o);
    st->nat = nat;
    st->t0 = store_now();
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->done_cv, NULL);
    pthread_cond_init(&st->prefault_cv, NULL);
    pthread_cond_init(&st->ver_cv, NULL);
    st->n_layers = nat->cfg.num_hidden_layers;
    st->n_experts = nat->n_experts;
    st->top_k = nat->cfg.num_experts_per_tok > 0 ? nat->cfg.num_experts_per_tok : 1;
    st->stride = nat->stride;
    st->slot_bytes = store_slot_bytes(nat);
    st->io_bytes = st->o.io_bytes ? df_round_up_4k(st->o.io_bytes) : (1u << 20);
    if (st->o.io_depth <= 0) st->o.io_depth = 16;
    if (st->o.hot_fraction < 0) st->o.hot_fraction = 0.1;
    if (st->o.heat_half_life <= 0) st->o.heat_half_life = 1048576.0;
    int rc = 0;
    char **dirs = NULL;
    int n_dirs = 0;
    if (st->o.expert_dirs && *st->o.expert_dirs) {
        n_dirs = split_dirs(st->o.expert_dirs, &dirs);
        if (n_dirs < 0) { rc = seterr(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
    }
    if (st->n_layers <= 0 || (nat->n_moe_layers > 0 && (st->n_experts <= 0 || st->stride == 0 || st->stride % 4096))) {
        rc = seterr(err, errlen, DF_EFORMAT,
                    "%s: bad expert table (layers %d, n_experts %d, stride %llu: stride must be a positive multiple of 4096)",
                    nat->dir, st->n_layers, st->n_experts, (unsigned long long)st->stride);
        goto fail;
    }
    st->layers = calloc(st->n_layers, sizeof *st->layers);
    if (!st->layers) { rc = seterr(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
    uint64_t total_experts = 0;
    for (int i = 0; i < nat->n_moe_layers; i++) {
        const native_expert_layer *NL = &nat->moe_layers[i];
        if (NL->layer < 0 || NL->layer >= st->n_layers) {
            rc = seterr(err, errlen, DF_EFORMAT, "%s: expert layer %d out of range [0,%d)", nat->dir, NL->layer,
                        st->n_layers);
            goto fail;
        }
        store_layer *L = &st->layers[NL->layer];
        if (NL->n_files < 1 || NL->n_files > STORE_MAX_DRIVES) {
            rc = seterr(err, errlen, DF_EUNSUPPORTED, "%s: layer %d has %d pack files (1..%d supported)", nat->dir,
                        NL->layer, NL->n_files, STORE_MAX_DRIVES);
            goto fail;
        }
        uint64_t sum = 0;
        int bad_size = 0;
        for (int k = 0; k < NL->n_files; k++) {
            bad_size |= native_stripe_size(NL, k) % 4096 != 0;
            sum += native_stripe_size(NL, k);
        }
        if (bad_size || sum < st->stride) {
            rc = seterr(err, errlen, DF_EFORMAT,
                        "%s: layer %d stripe_bytes %llu must be a multiple of 4096 and n_files * stripe >= stride %llu",
                        nat->dir, NL->layer, (unsigned long long)NL->stripe_bytes, (unsigned long long)st->stride);
            goto fail;
        }
        if (n_dirs && n_dirs != NL->n_files) {
            rc = seterr(err, errlen, DF_EINVAL,
                        "--expert-dirs names %d directories but layer %d of %s is striped over %d files; give one "
                        "directory per stripe, in the manifest's order",
                        n_dirs, NL->layer, nat->dir, NL->n_files);
            goto fail;
        }
        L->n_files = NL->n_files;
        L->stripe_bytes = NL->stripe_bytes;
        L->stripe_begin[0] = 0;
        for (int k = 0; k < L->n_files; k++) {
            L->stripe_size[k] = native_stripe_size(NL, k);
            L->stripe_begin[k + 1] = L->stripe_begin[k] + L->stripe_size[k];
        }
        L->xxh64 = NL->xxh64;
        L->fd = calloc(L->n_files, sizeof(int));
        L->fd_buf = calloc(L->n_files, sizeof(int));
        L->drive = calloc(L->n_files, sizeof(int));
        L->files = calloc(L->n_files, sizeof(char *));
        if (!L->fd || !L->fd_buf || !L->drive || !L->files) { rc = seterr(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
        for (int k = 0; k < L->n_files; k++) L->fd[k] = L->fd_buf[k] = -1;
        for (int k = 0; k < L->n_files; k++) {
            char path[2048], dirbuf[2048];
            if (n_dirs) {
                char tmp[2048];
                snprintf(tmp, sizeof tmp, "%s", NL->files[k]);
                snprintf(path, sizeof path, "%s/%s", dirs[k], basename(tmp));
            } else {
                snprintf(path, sizeof path, "%s", NL->files[k]);
            }
            L->files[k] = strdup(path);
            snprintf(dirbuf, sizeof dirbuf, "%s", path);
            int d = drive_for_dir(st, dirname(dirbuf), err, errlen);
            if (d < 0) { rc = d; goto fail; }
            L->drive[k] = d;
            rc = open_pack(st, path, &L->fd[k], &L->fd_buf[k], err, errlen);
            if (rc) goto fail;
            struct stat sb;
            uint64_t need = (uint64_t)(st->n_experts - 1) * L->stripe_size[k];
            uint64_t last = st->stride > L->stripe_begin[k] ? st->stride - L->stripe_begin[k] : 0;
            if (last > L->stripe_size[k]) last = L->stripe_size[k];
            need += last;
            if (fstat(L->fd_buf[k], &sb) == 0 && (uint64_t)sb.st_size < need) {
                rc = seterr(err, errlen, DF_EFORMAT,
                            "expert pack %s (layer %d) is truncated: %llu bytes, need %llu for %d experts; re-run "
                            "`deltafin convert`",
                            path, NL->layer, (unsigned long long)sb.st_size, (unsigned long long)need, st->n_experts);
                goto fail;
            }
        }
        total_experts += st->n_experts;
    }
    size_t nkeys = (size_t)st->n_layers * (st->n_experts > 0 ? st->n_experts : 1);
    st->slot_of = malloc(nkeys * sizeof(int));
    st->verified = calloc(nkeys, 1);
    st->hot = calloc(nkeys, 1);
    st->freq = calloc(nkeys, sizeof(float));
    st->t_last = calloc(nkeys, sizeof(uint32_t));
    st->lclock = calloc(st->n_layers, sizeof(uint32_t));
    st->count_run = calloc(nkeys, sizeof(double));
    st->pf_issued = calloc(st->n_layers, sizeof(uint32_t));
    st->pf_useful = calloc(st->n_layers, sizeof(uint32_t));
    if (!st->t_last || !st->lclock || !st->pf_issued || !st->pf_useful || !st->slot_of || !st->verified || !st->hot || !st->freq || !st->count_run) {
        rc = seterr(err, errlen, DF_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nkeys; i++) st->slot_of[i] = -1;
    uint64_t n_slots = st->o.cache_bytes == 0 ? total_experts : st->o.cache_bytes / st->slot_bytes;
    if (n_slots > total_experts) n_slots = total_experts;
    if (nat->n_moe_layers > 0 && n_slots < (uint64_t)st->top_k) {
        rc = seterr(err, errlen, DF_EBUDGET,
                    "expert cache of %llu bytes holds %llu slots of %llu bytes but one token needs top-k = %d; "
                    "give at least %llu bytes (raise --ram-budget)",
                    (unsigned long long)st->o.cache_bytes, (unsigned long long)n_slots,
                    (unsigned long long)st->slot_bytes, st->top_k, (unsigned long long)(st->top_k * st->slot_bytes));
        goto fail;
    }
    st->n_slots = (int)n_slots;
    st->slots = calloc(st->n_slots ? st->n_slots : 1, sizeof *st->slots);
    st->free_stack = malloc((st->n_slots ? st->n_slots : 1) * sizeof(int));
    if (!st->slots || !st->free_stack) { rc = seterr(err, errlen, DF_ENOMEM, "out of memory"); goto fail; }
    for (int s = 0; s < st->n_slots; s++) {
        st->slots[s].key = -1;
        st->free_stack[st->n_free++] = st->n_slots - 1 - s;
    }
    if (st->o.decay <= 0 || st->o.decay > 1) st->o.decay = 0.8;
    st->decay_pow[0] = 1;
    for (int i = 1; i < 64; i++) st->decay_pow[i] = st->decay_pow[i - 1] * (float)st->o.decay;
    st->last_layer = -1;
    if (st->o.events_path) {
        st->events = fopen(st->o.events_path, "a");
        if (!st->events) {
            rc = seterr(err, errlen, DF_EIO, "cannot open events file %s: %s", st->o.events_path, strerror(errno));
            goto fail;
        }
        setvbuf(st->events, NULL, _IOFBF, 1 << 16);
    }
    if (st->o.heat_path) store_heat_load(st);
    rc = store_io_start(st, err, errlen);
    if (rc) goto fail;
    /* two threads: on the dev VM one thread first-touches huge pages at 0.5-1.1 GB/s, two at 1.3-2.0. Under a
     * budget they fault in the whole cache (it is within the budget); without one (a slot per expert, most of
     * them never used by a short run) they stay up to ~1 GiB (8..64 slots) ahead of the loads. */
    if (st->o.cache_bytes == 0 && st->slot_bytes > 0) {
        const uint64_t ahead = (1ull << 30) / st->slot_bytes;
        st->prefault_ahead = ahead < 8 ? 8 : ahead > 64 ? 64 : (int)ahead;
    }
    int npf = STORE_PREFAULT_THREADS;
    if (st->prefault_ahead && sysconf(_SC_NPROCESSORS_ONLN) <= 2) npf = 1; /* paced: leave a core to compute */
    if (st->n_slots > 0 && !st->o.no_prefault)
        for (int i = 0; i < npf && i < st->n_slots; i++)
            if (pthread_create(&st->prefault[st->prefault_on], NULL, prefault_main, st) == 0) st->prefault_on++;
    snprintf(st->stats.io_engine, sizeof st->stats.io_engine, "%s", st->uring_ok ? "io_uring" : "pread");
    st->stats.n_slots = st->n_slots;
    st->stats.n_drives = st->n_drives;
    store_event(st, "\"ev\":\"open\",\"model\":\"%s\",\"slots\":%d,\"slot_bytes\":%llu,\"drives\":%d,\"io\":\"%s\","
                    "\"qd\":%d,\"io_bytes\":%llu,\"hot_limit\":%d",
                nat->name, st->n_slots, (unsigned long long)st->slot_bytes, st->n_drives, st->stats.io_engine,
                st->o.io_depth, (unsigned long long)st->io_bytes, st->hot_limit);
    if (dirs) {
        for (int i = 0; i < n_dirs; i++) free(dirs[i]);
        free(dirs);
    }
    *out = st;
    return 0;
fail:
    if (dirs) {
        for (int i = 0; i < n_dirs; i++) free(dirs[i]);
        free(dirs);
    }
    store_close(st);
    return rc;
}

static void job_unlink(df_store *st, store_job *j) {
    if (!j->in_list) return;
    store_job **head = j->in_list == 1 ? &st->dem_head : &st->pre_head;
    store_job **tail = j->in_list == 1 ? &st->dem_tail : &st->pre_tail;
    if (j->prev) j->prev->next = j->next; else *head = j->next;
    if (j->next) j->next->prev = j->prev; else *tail = j->prev;
    j->next = j->prev = NULL;
    j->in_list = 0;
}

static void job_append(df_store *st, store_job *j, int list) {
    store_job **head = list == 1 ? &st->dem_head : &st->pre_head;
    store_job **tail = list == 1 ? &st->dem_tail : &st->pre_tail;
    j->prev = *tail;
    j->next = NULL;
    if (*tail) (*tail)->next = j; else *head = j;
    *tail = j;
    j->in_list = list;
}

void store_close(df_store *st) {
    if (!st) return;
    /* remote fetches under way complete (or fail) first: their tokens are jobs of this store */
    pthread_mutex_lock(&st->mu);
    for (int s = 0; s < st->n_slots && st->slots; s++)
        while (st->slots[s].job && st->slots[s].job->remote) pthread_cond_wait(&st->done_cv, &st->mu);
    st->prefault_stop = 1;
    pthread_cond_broadcast(&st->prefault_cv);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->prefault_on; i++) pthread_join(st->prefault[i], NULL);
    store_io_stop(st);
    if (st->o.heat_path && st->count_run) store_heat_save(st);
    /* jobs that never ran */
    while (st->dem_head) { store_job *j = st->dem_head; job_unlink(st, j); }
    while (st->pre_head) { store_job *j = st->pre_head; job_unlink(st, j); }
    for (int s = 0; s < st->n_slots && st->slots; s++) {
        free(st->slots[s].job);
        free(st->slots[s].errmsg);
        slot_free(st, st->slots[s].buf);
    }
    if (st->layers) {
        for (int l = 0; l < st->n_layers; l++) {
            store_layer *L = &st->layers[l];
            for (int k = 0; k < L->n_files; k++) {
                if (L->fd && L->fd[k] >= 0 && L->fd[k] != L->fd_buf[k]) close(L->fd[k]);
                if (L->fd_buf && L->fd_buf[k] >= 0) close(L->fd_buf[k]);
                if (L->files) free(L->files[k]);
            }
            free(L->fd); free(L->fd_buf); free(L->drive); free(L->files);
        }
    }
    if (st->events) {
        store_event(st, "\"ev\":\"close\",\"hits\":%llu,\"misses\":%llu", (unsigned long long)st->stats.hits,
                    (unsigned long long)st->stats.misses);
        /* a write that failed on the way (a full disk, /dev/full) shows in the stream's error flag or at fclose */
        const int bad = ferror(st->events);
        const int e = errno;
        if (fclose(st->events) != 0 || bad)
            fprintf(stderr, "deltafin: warning: the events file %s is incomplete: %s\n", st->o.events_path,
                    strerror(bad ? e : errno));
    }
    for (int d = 0; d < st->n_drives; d++) pthread_cond_destroy(&st->drives[d].cv);
    free(st->layers); free(st->slots); free(st->free_stack); free(st->slot_of); free(st->verified);
    free(st->hot); free(st->freq); free(st->t_last); free(st->lclock); free(st->heat); free(st->count_run);
    free(st->pf_issued); free(st->pf_useful);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->done_cv);
    pthread_cond_destroy(&st->prefault_cv);
    pthread_cond_destroy(&st->ver_cv);
    free(st);
}

/* ------------------------------------------------------------- eviction */

/* decay^(age in visits of the key's layer) */
static float decay_to(const df_store *st, int key) {
    uint32_t age = st->lclock[key / st->n_experts] - st->t_last[key];
    if (st->o.decay >= 1) return 1;
    return age < 64 ? st->decay_pow[age] : 0;
}

/* An expert's frequency-aware eviction score: its recency-weighted count plus the heat tier (higher stays longer). */
static double key_score(const df_store *st, int key) {
    double sc = st->freq[key] * decay_to(st, key);
    if (st->heat) sc += st->heat[key];
    return sc;
}

static double slot_score(const df_store *st, const store_slot *s) {
    if (st->o.policy == 1) return 0; /* LRU: tie-break on last_use only */
    return key_score(st, s->key);
}

static void slot_reset(df_store *st, int s) {
    store_slot *sl = &st->slots[s];
    if (sl->key >= 0 && st->slot_of[sl->key] == s) st->slot_of[sl->key] = -1;
    if (sl->key >= 0 && st->hot[sl->key] && sl->state == SLOT_READY) st->hot_loaded--;
    sl->key = -1;
    sl->state = SLOT_FREE;
    sl->pins = sl->demand_hold = sl->fresh = sl->prefetched = 0;
    free(sl->errmsg);
    sl->errmsg = NULL;
    sl->err = 0;
}

/* One slot buffer: big slots on transparent huge pages where the system allows (fewer page faults on first
 * use), 4 KiB aligned (O_DIRECT); page-locked by store_opts.pin when `pin` and a pin function is given. Pinning
 * costs about as much as reading the buffer (cudaHostRegister of 23 MB slots on the H200 host: ~1.3 GB/s), so only
 * the prefault threads pin (off the read path, for a cache that is reused); a slot allocated by a load is not.
 * NULL when out of memory. */
static uint8_t *slot_alloc(df_store *st, int pin, int *pinned) {
    const int huge = st->slot_bytes >= (4u << 20);
    void *p = NULL;
    if (posix_memalign(&p, huge ? (2u << 20) : 4096, st->slot_bytes)) return NULL;
    if (huge) madvise(p, st->slot_bytes, MADV_HUGEPAGE);
    *pinned = pin && st->o.pin && st->o.pin(p, st->slot_bytes) == 0;
    if (*pinned) __atomic_add_fetch(&st->n_slots_pinned, 1, __ATOMIC_RELAXED);
    return p;
}

/* Free a slot buffer of slot_alloc (unpinned first when it was pinned: unpin ignores a buffer it never pinned). */
static void slot_free(df_store *st, uint8_t *p) {
    if (!p) return;
    if (st->o.unpin) st->o.unpin(p);
    free(p);
}

/* A slot for a new load, or -1. level 0: only cold victims; 1: may take the hot
 * tier; 2: may also take slots held by a pending demand request. mu held. */
static int find_slot(df_store *st, int level, int for_prefetch) {
    if (st->n_free > 0) return st->free_stack[--st->n_free];
    int best = -1;
    double best_sc = 0;
    uint64_t best_use = 0;
    for (int s = 0; s < st->n_slots; s++) {
        store_slot *sl = &st->slots[s];
        if (sl->pins || sl->state == SLOT_LOADING) continue;
        if (sl->state == SLOT_ERROR && !sl->demand_hold) return s;
        if (sl->state != SLOT_READY) continue;
        if (sl->demand_hold && level < 2) continue;
        if (st->hot[sl->key] && level < 1) continue;
        if (for_prefetch && sl->prefetched) continue; /* do not thrash guesses not yet used */
        double sc = slot_score(st, sl);
        if (best < 0 || sc < best_sc || (sc == best_sc && sl->last_use < best_use)) {
            best = s;
            best_sc = sc;
            best_use = sl->last_use;
        }
    }
    return best;
}

/* may_take_held: a demand load of store_acquire may, as the last resort, take a slot held by a pending demand
 * request (no other slot can be freed: every other is pinned or loading); a request never does, since the
 * held member would then be read twice (e.g. a layer's set larger than the cache: its present members are
 * held, and the members that find no slot now are loaded by acquire as earlier ones are released). */
static int take_slot(df_store *st, int for_prefetch, int may_take_held) {
    int s = find_slot(st, 0, for_prefetch);
    if (s < 0 && !for_prefetch) s = find_slot(st, 1, 0);
    if (s < 0 && !for_prefetch && may_take_held) s = find_slot(st, 2, 0);
    if (s < 0) return -1;
    store_slot *sl = &st->slots[s];
    if (sl->prefaulted) { /* the first load into a prefaulted slot: the threads may go on */
        sl->prefaulted = 0;
        st->prefault_ready--;
        if (st->prefault_ahead) pthread_cond_signal(&st->prefault_cv);
    }
    if (sl->key >= 0) {
        if (sl->prefetched) store_event(st, "\"ev\":\"evict_unused_prefetch\",\"layer\":%d,\"expert\":%d",
                                        sl->key / st->n_experts, sl->key % st->n_experts);
        slot_reset(st, s);
    }
    if (!sl->buf) {
        int pinned;
        if (!(sl->buf = slot_alloc(st, 0, &pinned))) {
            st->free_stack[st->n_free++] = s;
            return -2;
        }
        st->n_slots_alloc++;
    }
    return s;
}

/* The slot buffers' pages are faulted in ahead of their first read by threads started at open (two; one without a
 * budget on a 2-core machine): under a RAM budget the whole cache (it is within the budget, so touching all of it
 * early costs no memory beyond it); without one only prefault_ahead slots ahead of the loads. A read into a
 * fresh buffer otherwise faults its pages in on the drive's thread while the drive waits. On the dev VM that
 * first touch runs at ~1 GB/s and held the first prefill's reads to 0.2-0.7 GB/s (I/O wait 1.6-4.7 s of 5-8 s
 * for 64 tokens on the 5-layer K2 synth at 4G). A prefaulted slot is put on top of the free stack, so loads
 * take prefaulted slots first; the buffer is published only when the slot has none yet, else dropped. */
static void *prefault_main(void *arg) {
    df_store *st = arg;
    const long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (st->prefault_ahead && !st->prefault_stop && st->prefault_ready >= st->prefault_ahead)
            pthread_cond_wait(&st->prefault_cv, &st->mu);
        const int s = st->prefault_next++;
        const int stop = st->prefault_stop || s >= st->n_slots;
        const int skip = !stop && st->slots[s].buf != NULL;
        pthread_mutex_unlock(&st->mu);
        if (stop) break;
        if (skip) continue;
        int pinned;
        uint8_t *p = slot_alloc(st, 1, &pinned);
        if (!p) break;
        for (uint64_t o = 0; o < st->slot_bytes; o += (uint64_t)pg) ((volatile uint8_t *)p)[o] = 0;
        pthread_mutex_lock(&st->mu);
        store_slot *sl = &st->slots[s];
        if (sl->buf) { /* a load allocated this slot first: drop ours */
            pthread_mutex_unlock(&st->mu);
            if (pinned) __atomic_sub_fetch(&st->n_slots_pinned, 1, __ATOMIC_RELAXED);
            slot_free(st, p);
            continue;
        }
        sl->buf = p;
        st->n_slots_alloc++;
        st->prefault_ready++;
        sl->prefaulted = 1;
        for (int i = 0; i < st->n_free; i++) /* on top of the free stack: taken next */
            if (st->free_stack[i] == s) {
                st->free_stack[i] = st->free_stack[st->n_free - 1];
                st->free_stack[st->n_free - 1] = s;
                break;
            }
        pthread_mutex_unlock(&st->mu);
    }
    return NULL;
}

/* Start loading key into a fresh slot; mu held. Returns slot, -1 when no slot
 * can be taken now, or DF_ENOMEM (-5 - 100) on allocation failure. */
static int start_load(df_store *st, int layer, int expert, store_prio prio, int may_take_held) {
    int key = KEY(st, layer, expert);
    int s = take_slot(st, prio == STORE_PREFETCH, may_take_held);
    if (s == -2) return -2;
    if (s < 0) return -1;
    store_job *j = calloc(1, sizeof *j);
    if (!j) { st->free_stack[st->n_free++] = s; return -2; }
    store_layer *L = &st->layers[layer];
    j->slot = s; j->layer = layer; j->expert = expert; j->prio = prio;
    j->n_pieces = L->n_files;
    for (int k = 0; k < L->n_files; k++) {
        uint64_t begin = L->stripe_begin[k];
        uint64_t len = begin < st->stride ? st->stride - begin : 0;
        if (len > L->stripe_size[k]) len = L->stripe_size[k];
        j->piece_drive[k] = L->drive[k];
        j->piece_fd[k] = L->fd[k];
        j->piece_fd_buf[k] = L->fd_buf[k];
        j->piece_file[k] = k;
        j->piece_off[k] = (uint64_t)expert * L->stripe_size[k];
        j->piece_len[k] = len;
        j->piece_next[k] = 0;
    }
    j->t_start = store_now();
    j->st = st;
    store_slot *sl = &st->slots[s];
    sl->key = key;
    sl->state = SLOT_LOADING;
    sl->job = j;
    st->slot_of[key] = s;
    uint64_t xh;
    if (st->o.remote && st->o.remote->lookup(st->o.remote->user, layer, expert, &xh)) {
        j->remote = 1; /* read once store_remote_done has it in the packs */
        st->o.remote->fetch(st->o.remote->user, layer, expert, j);
        return s;
    }
    if (st->o.remote) L->xxh64[expert] = xh;
    job_append(st, j, prio == STORE_DEMAND ? 1 : 2);
    for (int k = 0; k < L->n_files; k++) pthread_cond_broadcast(&st->drives[L->drive[k]].cv);
    return s;
}

static int check_key(const df_store *st, int layer, int expert) {
    return layer >= 0 && layer < st->n_layers && st->layers[layer].n_files > 0 && expert >= 0 &&
           expert < st->n_experts;
}

/* Guesses for layers <= `layer` still queued when layer's demand set arrives
 * are wrong (the demand request moved the right ones to the demand list): drop
 * the unstarted ones, stop the started ones after their in-flight chunks. mu held. */
static void drop_stale_guesses(df_store *st, int layer) {
    store_job *j = st->pre_head;
    while (j) {
        store_job *nx = j->next;
        store_slot *sl = &st->slots[j->slot];
        if (j->layer <= layer && !sl->demand_hold && !sl->pins) {
            int key = KEY(st, j->layer, j->expert);
            store_event(st, "\"ev\":\"drop_guess\",\"layer\":%d,\"expert\":%d,\"started\":%d", j->layer,
                        j->expert, j->started);
            job_unlink(st, j);
            st->stats.prefetch_cancelled++;
            if (!j->started || j->chunks_out == 0) {
                int s = j->slot;
                sl->job = NULL;
                slot_reset(st, s);
                st->free_stack[st->n_free++] = s;
                free(j);
            } else {
                j->abandoned = 1;
                for (int k = 0; k < j->n_pieces; k++) j->piece_next[k] = j->piece_len[k];
                if (st->slot_of[key] == j->slot) st->slot_of[key] = -1;
                sl->prefetched = 0;
            }
        }
        j = nx;
    }
}

int store_request(df_store *st, int layer, const int *experts, int n, store_prio prio) {
    pthread_mutex_lock(&st->mu);
    int rc = 0, started = 0;
    /* a demand set first holds every member already present, so that loading one member cannot take
     * the slot of another (e.g. a guess for it that has not been acquired yet) */
    if (prio == STORE_DEMAND)
        for (int i = 0; i < n; i++) {
            if (!check_key(st, layer, experts[i])) continue;
            const int s = st->slot_of[KEY(st, layer, experts[i])];
            if (s >= 0 && (st->slots[s].state == SLOT_LOADING || st->slots[s].state == SLOT_READY))
                st->slots[s].demand_hold = 1;
        }
    for (int i = 0; i < n; i++) {
        if (!check_key(st, layer, experts[i])) { rc = DF_EINVAL; continue; }
        int key = KEY(st, layer, experts[i]);
        int s = st->slot_of[key];
        if (s >= 0) {
            store_slot *sl = &st->slots[s];
            if (prio == STORE_DEMAND) {
                if (sl->state == SLOT_LOADING || sl->state == SLOT_READY) sl->demand_hold = 1;
                if (sl->state == SLOT_LOADING && sl->job->prio == STORE_PREFETCH) {
                    /* a guess that is now needed: move it ahead of the other guesses */
                    sl->job->prio = STORE_DEMAND;
                    sl->fresh = 1;
                    if (sl->job->in_list == 2) { job_unlink(st, sl->job); job_append(st, sl->job, 1); }
                }
            }
            continue;
        }
        s = start_load(st, layer, experts[i], prio, 0);
        if (s == -2) { rc = DF_ENOMEM; continue; }
        if (s < 0) continue; /* no slot free now: acquire will load it */
        started++;
        if (prio == STORE_DEMAND) {
            st->slots[s].demand_hold = 1;
            st->slots[s].fresh = 1;
        } else {
            st->slots[s].prefetched = 1;
            st->stats.prefetch_issued++;
            st->pf_issued[layer]++;
        }
    }
    if (prio == STORE_DEMAND) drop_stale_guesses(st, layer);
    store_event(st, "\"ev\":\"request\",\"layer\":%d,\"n\":%d,\"prio\":\"%s\",\"started\":%d", layer, n,
                prio == STORE_DEMAND ? "demand" : "prefetch", started);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* 2 when expert e of the layer is in memory, 1 when its slot is being read, else 0 (st->mu held). */
static unsigned char key_present(const df_store *st, int layer, int e) {
    const int s = check_key(st, layer, e) ? st->slot_of[KEY(st, layer, e)] : -1;
    return s < 0 ? 0 : st->slots[s].state == SLOT_READY ? 2 : st->slots[s].state == SLOT_LOADING ? 1 : 0;
}

void store_present(df_store *st, int layer, const int *experts, int n, unsigned char *present) {
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < n; i++) present[i] = key_present(st, layer, experts[i]);
    pthread_mutex_unlock(&st->mu);
}

void store_map(df_store *st, int layer, unsigned char *state, float *heat) {
    pthread_mutex_lock(&st->mu);
    const int ok = check_key(st, layer, 0);
    for (int e = 0; e < st->n_experts; e++) {
        state[e] = key_present(st, layer, e);
        if (heat) heat[e] = ok ? (float)key_score(st, KEY(st, layer, e)) : 0.0f;
    }
    pthread_mutex_unlock(&st->mu);
}

int store_max_acquire(const df_store *st) {
    int m = st->n_slots - st->hot_limit;
    return m < st->top_k ? st->top_k : m;
}

/* One access of key: recency-weighted count (LRFU): c = c * decay^age + 1. */
static void touch(df_store *st, int key) {
    st->t_last[key] = st->lclock[key / st->n_experts];
    if (st->no_heat) return;
    st->freq[key] = st->freq[key] * decay_to(st, key) + 1.0f;
    st->count_run[key] += 1.0;
    st->acq_total++;
}

int store_acquire(df_store *st, int layer, const int *experts, int n, df_expert *views, char *err, size_t errlen) {
    if (n <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (!check_key(st, layer, experts[i]))
            return seterr(err, errlen, DF_EINVAL, "store_acquire: layer %d expert %d is not a routed expert of %s",
                          layer, experts[i], st->nat->name);
    if (n > st->n_slots)
        return seterr(err, errlen, DF_EBUDGET,
                      "store_acquire: %d experts at once but the expert cache has %d slots (acquire in chunks of "
                      "store_max_acquire() = %d, or raise --ram-budget)",
                      n, st->n_slots, store_max_acquire(st));
    int *slot = malloc(n * sizeof(int));
    if (!slot) return seterr(err, errlen, DF_ENOMEM, "out of memory");
    double t_enter = store_now();
    int hits = 0, misses = 0, rc = 0, waited = 0;
    pthread_mutex_lock(&st->mu);
    st->clock++;
    if (layer != st->last_layer) { st->lclock[layer]++; st->last_layer = layer; } /* a new visit (~ token) */
    /* pass 1: pin what is there, classify hit / miss */
    for (int i = 0; i < n; i++) {
        int key = KEY(st, layer, experts[i]);
        int s = st->slot_of[key];
        slot[i] = -1;
        if (s >= 0 && st->slots[s].state == SLOT_ERROR) continue; /* reported below */
        if (s >= 0) {
            store_slot *sl = &st->slots[s];
            sl->pins++;
            slot[i] = s;
            /* a hit: in memory from an earlier use; a guess read for this use (prefetched, not yet used) is a
             * miss, its bytes read for it like a demand read's (the storage bound's (1 - h) counts them) */
            if (sl->state == SLOT_READY && !sl->fresh && !sl->prefetched) hits++; else misses++;
            if (sl->prefetched) { st->stats.prefetch_useful++; st->pf_useful[layer]++; sl->prefetched = 0; }
            if (sl->state == SLOT_LOADING && sl->job->prio == STORE_PREFETCH) {
                sl->job->prio = STORE_DEMAND;
                if (sl->job->in_list == 2) { job_unlink(st, sl->job); job_append(st, sl->job, 1); }
            }
        } else {
            misses++;
        }
        touch(st, key);
    }
    /* pass 2: load what is missing, wait for everything */
    while (1) {
        int pending = 0;
        for (int i = 0; i < n && !rc; i++) {
            int key = KEY(st, layer, experts[i]);
            if (slot[i] < 0) {
                int s = st->slot_of[key];
                if (s >= 0 && st->slots[s].state == SLOT_ERROR) {
                    store_slot *sl = &st->slots[s];
                    rc = seterr(err, errlen, sl->err, "%s", sl->errmsg ? sl->errmsg : "expert read failed");
                    if (!sl->pins) slot_reset(st, s), st->free_stack[st->n_free++] = s;
                    break;
                }
                if (s >= 0) { st->slots[s].pins++; slot[i] = s; }
                else {
                    s = start_load(st, layer, experts[i], STORE_DEMAND, 1);
                    if (s == -2) { rc = seterr(err, errlen, DF_ENOMEM, "out of memory for an expert slot"); break; }
                    if (s >= 0) { st->slots[s].pins++; st->slots[s].fresh = 1; slot[i] = s; }
                }
            }
            if (slot[i] < 0) { pending++; continue; }
            store_slot *sl = &st->slots[slot[i]];
            if (sl->state == SLOT_ERROR) {
                rc = seterr(err, errlen, sl->err, "%s", sl->errmsg ? sl->errmsg : "expert read failed");
                break;
            }
            if (sl->state != SLOT_READY) pending++;
        }
        if (rc || !pending) break;
        /* nothing can make progress when no load is running and no slot is free */
        int loading = st->dem_head || st->pre_head;
        for (int s = 0; s < st->n_slots && !loading; s++) loading = st->slots[s].state == SLOT_LOADING;
        if (!loading) {
            rc = seterr(err, errlen, DF_EBUDGET,
                        "store_acquire: no free expert slot for layer %d (all %d slots pinned); release experts "
                        "before acquiring more or raise --ram-budget",
                        layer, st->n_slots);
            break;
        }
        waited = 1;
        pthread_cond_wait(&st->done_cv, &st->mu);
    }
    if (rc) {
        for (int i = 0; i < n; i++) {
            if (slot[i] < 0) continue;
            store_slot *sl = &st->slots[slot[i]];
            sl->pins--;
            if (sl->state == SLOT_ERROR && !sl->pins) {
                slot_reset(st, slot[i]);
                st->free_stack[st->n_free++] = slot[i];
            }
        }
    } else {
        for (int i = 0; i < n; i++) {
            store_slot *sl = &st->slots[slot[i]];
            sl->demand_hold = 0;
            sl->fresh = 0;
            sl->last_use = st->clock;
        }
        st->stats.hits += hits;
        st->stats.misses += misses;
    }
    double stall = waited ? store_now() - t_enter : 0;
    st->stats.stall_s += stall;
    if (st->events && !rc) {
        char ids[512];
        size_t o = 0;
        for (int i = 0; i < n && o < sizeof ids - 16; i++) o += snprintf(ids + o, sizeof ids - o, "%s%d", i ? "," : "", experts[i]);
        store_event(st, "\"ev\":\"acquire\",\"layer\":%d,\"n\":%d,\"ids\":[%s],\"hits\":%d,\"misses\":%d,\"stall_ms\":%.3f",
                    layer, n, ids, hits, misses, stall * 1e3);
    }
    pthread_mutex_unlock(&st->mu);
    if (!rc)
        for (int i = 0; i < n; i++) native_expert_views(st->nat, st->slots[slot[i]].buf, &views[i]);
    free(slot);
    return rc;
}

void store_release(df_store *st, int layer, const int *experts, int n) {
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < n; i++) {
        if (!check_key(st, layer, experts[i])) continue;
        int s = st->slot_of[KEY(st, layer, experts[i])];
        if (s >= 0 && st->slots[s].pins > 0) st->slots[s].pins--;
    }
    pthread_cond_broadcast(&st->done_cv); /* a waiting acquire may now evict */
    pthread_mutex_unlock(&st->mu);
}

void store_cancel_prefetch(df_store *st) {
    pthread_mutex_lock(&st->mu);
    store_job *j = st->pre_head;
    while (j) {
        store_job *nx = j->next;
        if (!j->started) {
            job_unlink(st, j);
            int s = j->slot;
            st->slots[s].job = NULL;
            st->stats.prefetch_cancelled++;
            slot_reset(st, s);
            st->free_stack[st->n_free++] = s;
            free(j);
        }
        j = nx;
    }
    pthread_mutex_unlock(&st->mu);
}

/* Verify and publish a finished job (mu not held on entry). */
void store_job_finish(df_store *st, store_job *j) {
    store_slot *sl = &st->slots[j->slot];
    if (j->abandoned) { /* a dropped guess: nothing to publish, the slot is free again */
        pthread_mutex_lock(&st->mu);
        sl->job = NULL;
        slot_reset(st, j->slot);
        st->free_stack[st->n_free++] = j->slot;
        pthread_cond_broadcast(&st->done_cv);
        pthread_mutex_unlock(&st->mu);
        free(j);
        return;
    }
    int key = KEY(st, j->layer, j->expert);
    store_layer *L = &st->layers[j->layer];
    uint64_t nverified = 0;
    if (!j->err && st->o.verify && !st->verified[key]) {
        uint64_t h = XXH64(sl->buf, st->stride, 0);
        nverified = st->stride;
        if (h != L->xxh64[j->expert]) {
            char files[1200] = "";
            size_t off = 0;
            for (int k = 0; k < L->n_files && off < sizeof files - 2; k++)
                off += snprintf(files + off, sizeof files - off, "%s%s", k ? ", " : "", L->files[k]);
            j->err = DF_EFORMAT;
            snprintf(j->errmsg, sizeof j->errmsg,
                     "checksum mismatch in layer %d expert %d (%s at offset %llu, %llu bytes): XXH64 %016llx, manifest "
                     "says %016llx; the pack is corrupt: re-run `deltafin convert` (or `deltafin doctor`)",
                     j->layer, j->expert, files, (unsigned long long)j->piece_off[0],
                     (unsigned long long)st->stride, (unsigned long long)h, (unsigned long long)L->xxh64[j->expert]);
        }
    }
    double ms = (store_now() - j->t_start) * 1e3;
    pthread_mutex_lock(&st->mu);
    st->stats.bytes_verified += nverified;
    if (j->err && !sl->pins) {
        /* nobody waits for it now (a guess, a load whose acquire already failed on another expert, a demand load not
         * yet acquired): drop the slot, so that the next need loads the expert again (a streamed install: fetches it
         * again once the mirror is back) instead of getting this error, kept from an earlier failure */
        store_event(st, "\"ev\":\"read_error\",\"layer\":%d,\"expert\":%d,\"code\":%d", j->layer, j->expert, j->err);
        slot_reset(st, j->slot);
        st->free_stack[st->n_free++] = j->slot;
    } else if (j->err) {
        sl->state = SLOT_ERROR;
        sl->err = j->err;
        sl->errmsg = strdup(j->errmsg);
        store_event(st, "\"ev\":\"read_error\",\"layer\":%d,\"expert\":%d,\"code\":%d", j->layer, j->expert, j->err);
    } else {
        sl->state = SLOT_READY;
        if (nverified) st->verified[key] = 1;
        if (j->prio == STORE_DEMAND) st->stats.bytes_demand += st->stride;
        else st->stats.bytes_prefetch += st->stride;
        if (st->hot[key]) st->hot_loaded++;
        store_event(st, "\"ev\":\"read\",\"layer\":%d,\"expert\":%d,\"prio\":\"%s\",\"bytes\":%llu,\"ms\":%.3f", j->layer,
                    j->expert, j->prio == STORE_DEMAND ? "demand" : "prefetch", (unsigned long long)st->stride, ms);
    }
    sl->job = NULL;
    st->stats.resident_bytes = (uint64_t)st->n_slots_alloc * st->slot_bytes;
    pthread_cond_broadcast(&st->done_cv);
    pthread_mutex_unlock(&st->mu);
    free(j);
}

void store_remote_done(void *token, int rc, const char *msg, uint64_t xxh64) {
    store_job *j = token;
    df_store *st = j->st;
    if (rc) {
        j->err = rc;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", msg ? msg : "remote fetch failed");
        pthread_mutex_lock(&st->mu);
        j->remote = 0;
        pthread_mutex_unlock(&st->mu);
        store_job_finish(st, j);
        return;
    }
    pthread_mutex_lock(&st->mu);
    j->remote = 0;
    st->layers[j->layer].xxh64[j->expert] = xxh64;
    store_layer *L = &st->layers[j->layer];
    job_append(st, j, j->prio == STORE_DEMAND ? 1 : 2);
    for (int k = 0; k < L->n_files; k++) pthread_cond_broadcast(&st->drives[L->drive[k]].cv);
    pthread_cond_broadcast(&st->done_cv);
    pthread_mutex_unlock(&st->mu);
}

void store_get_stats(const df_store *st, store_stats *out) {
    df_store *m = (df_store *)st;
    pthread_mutex_lock(&m->mu);
    *out = st->stats;
    out->resident_bytes = (uint64_t)st->n_slots_alloc * st->slot_bytes;
    out->n_slots_pinned = __atomic_load_n(&st->n_slots_pinned, __ATOMIC_RELAXED);
    out->slot_bytes = st->slot_bytes;
    out->io_depth = st->o.io_depth;
    out->io_bytes = st->io_bytes;
    out->n_drives = st->n_drives;
    for (int d = 0; d < st->n_drives && d < 16; d++) {
        out->drive_bytes[d] = st->drives[d].bytes;
        double busy = st->drives[d].busy_s;
        if (st->drives[d].inflight) busy += store_now() - st->drives[d].busy_since;
        out->drive_busy_s[d] = busy;
    }
    pthread_mutex_unlock(&m->mu);
}

void store_set_heat_counting(df_store *st, int on) {
    pthread_mutex_lock(&st->mu);
    st->no_heat = !on;
    pthread_mutex_unlock(&st->mu);
}

void store_reset_stats(df_store *st) {
    pthread_mutex_lock(&st->mu);
    char eng[16];
    memcpy(eng, st->stats.io_engine, sizeof eng);
    memset(&st->stats, 0, sizeof st->stats);
    memcpy(st->stats.io_engine, eng, sizeof eng);
    st->stats.n_slots = st->n_slots;
    st->stats.n_drives = st->n_drives;
    for (int d = 0; d < st->n_drives; d++) {
        st->drives[d].bytes = 0;
        st->drives[d].busy_s = 0;
        if (st->drives[d].inflight) st->drives[d].busy_since = store_now();
    }
    st->last_tok = st->stats;
    pthread_mutex_unlock(&st->mu);
}

double store_layer_recall(const df_store *st, int layer, int min_issued) {
    if (layer < 0 || layer >= st->n_layers) return -1;
    df_store *m = (df_store *)st;
    pthread_mutex_lock(&m->mu);
    uint32_t is = st->pf_issued[layer], us = st->pf_useful[layer];
    pthread_mutex_unlock(&m->mu);
    return is < (uint32_t)(min_issued > 0 ? min_issued : 1) ? -1 : (double)us / is;
}

void store_token_event(df_store *st, int64_t pos) {
    if (!st->events) return;
    pthread_mutex_lock(&st->mu);
    store_stats *a = &st->last_tok, *b = &st->stats;
    b->n_drives = st->n_drives;
    for (int d = 0; d < st->n_drives && d < 16; d++) {
        b->drive_bytes[d] = st->drives[d].bytes;
        b->drive_busy_s[d] = st->drives[d].busy_s +
                             (st->drives[d].inflight ? store_now() - st->drives[d].busy_since : 0.0);
    }
    uint64_t h = b->hits - a->hits, m = b->misses - a->misses;
    /* per drive: bytes read since the previous token and GB/s while busy */
    char drives[16 * 48] = "";
    size_t dl = 0;
    for (int d = 0; d < b->n_drives && d < 16; d++) {
        uint64_t db = b->drive_bytes[d] - a->drive_bytes[d];
        double busy = b->drive_busy_s[d] - a->drive_busy_s[d];
        dl += (size_t)snprintf(drives + dl, sizeof drives - dl, "%s{\"bytes\":%llu,\"gbps\":%.3f}", d ? "," : "",
                               (unsigned long long)db, busy > 0 ? db / busy / 1e9 : 0.0);
        if (dl >= sizeof drives) break;
    }
    store_event(st,
                "\"drives\":[%s],\"ev\":\"token\",\"pos\":%lld,\"bytes_demand\":%llu,\"bytes_prefetch\":%llu,\"hits\":%llu,"
                "\"misses\":%llu,\"hit_rate\":%.4f,\"prefetch_issued\":%llu,\"prefetch_useful\":%llu,\"stall_ms\":%.3f",
                drives, (long long)pos, (unsigned long long)(b->bytes_demand - a->bytes_demand),
                (unsigned long long)(b->bytes_prefetch - a->bytes_prefetch), (unsigned long long)h,
                (unsigned long long)m, h + m ? (double)h / (h + m) : 0.0,
                (unsigned long long)(b->prefetch_issued - a->prefetch_issued),
                (unsigned long long)(b->prefetch_useful - a->prefetch_useful), (b->stall_s - a->stall_s) * 1e3);
    fflush(st->events);
    st->last_tok = st->stats;
    pthread_mutex_unlock(&st->mu);
}
