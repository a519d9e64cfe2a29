/*
 * test_store.c — the expert store on hand-made packs (layout of
 * docs/native-format.md): reads, views, stripes over 2 and 3 directories,
 * io_uring vs pread, checksum corruption and truncation errors, eviction and
 * hit/miss counting under a small cache, LRU vs frequency-aware eviction,
 * prefetch accounting and cancel, the RAM budget, heat persistence, events.
 */
#define _GNU_SOURCE
#include "test_util.h"
#include "test_store_fixture.h"
#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* Until/unless src/model provides it in the link, the same arithmetic
 * (parts' offsets inside one extent). The model's strong symbol wins. */
__attribute__((weak)) void native_expert_views(const df_native *n, const void *extent, df_expert *out) {
    df_weight *w[3] = {&out->gate, &out->up, &out->down};
    for (int i = 0; i < 3; i++) {
        w[i]->type = n->expert_type;
        w[i]->rows = n->parts[i].rows;
        w[i]->cols = n->parts[i].cols;
        w[i]->data = (const uint8_t *)extent + n->parts[i].offset;
        w[i]->scale = n->parts[i].scale_bytes ? (const uint8_t *)extent + n->parts[i].scale_offset : NULL;
    }
}


static uint8_t pattern(int l, int e, uint64_t i) {
    if (i >= EXTENT) return 0;
    uint64_t x = (uint64_t)l * 1000003u + (uint64_t)e * 7919u + i * 2654435761u;
    return (uint8_t)(x ^ (x >> 13) ^ (x >> 29));
}

typedef struct {
    df_native nat;
    native_expert_layer layers[2];
    char root[256];
    uint64_t xxh[2][NE];
    char *files[2][3];
} fixture;

static void write_file(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Model with layers 1 and 2 MoE, 8 experts, bf16 parts; packs striped over n_dirs. */
static void make_fixture(fixture *fx, const char *tag, int n_dirs) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->root, sizeof fx->root, "/tmp/df_test_store_%d_%s", (int)getpid(), tag);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/d0 %s/d1 %s/d2", fx->root, fx->root, fx->root, fx->root);
    if (system(cmd)) exit(1);
    df_native *n = &fx->nat;
    fixture_native_init(n, fx->layers, fx->root, "fixture");
    uint64_t stripe = n_dirs == 1 ? STRIDE : ((STRIDE / n_dirs + 4095) / 4096 * 4096);
    static uint8_t ext[STRIDE];
    for (int li = 0; li < 2; li++) {
        native_expert_layer *L = &fx->layers[li];
        L->layer = li + 1;
        L->n_files = n_dirs;
        L->files = fx->files[li];
        L->stripe_bytes = stripe;
        L->xxh64 = fx->xxh[li];
        uint8_t *packs[3];
        for (int k = 0; k < n_dirs; k++) {
            packs[k] = calloc(NE, stripe);
            char p[600];
            snprintf(p, sizeof p, "%s/d%d/experts-L%03d.pack", fx->root, k, L->layer);
            fx->files[li][k] = strdup(p);
        }
        for (int e = 0; e < NE; e++) {
            for (uint64_t i = 0; i < STRIDE; i++) ext[i] = pattern(L->layer, e, i);
            fx->xxh[li][e] = XXH64(ext, STRIDE, 0);
            for (int k = 0; k < n_dirs; k++) {
                uint64_t b = (uint64_t)k * stripe, len = b < STRIDE ? STRIDE - b : 0;
                if (len > stripe) len = stripe;
                memcpy(packs[k] + (uint64_t)e * stripe, ext + b, len);
            }
        }
        for (int k = 0; k < n_dirs; k++) {
            write_file(fx->files[li][k], packs[k], (size_t)NE * stripe);
            free(packs[k]);
        }
    }
}

static void free_fixture(fixture *fx) {
    for (int li = 0; li < 2; li++)
        for (int k = 0; k < 3; k++) free(fx->files[li][k]);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx->root);
    if (system(cmd)) {}
}

/* 1 if the views of (layer, e) hold exactly the pattern bytes */
static int views_ok(const df_expert *v, int layer, int e) {
    const df_weight *w[3] = {&v->gate, &v->up, &v->down};
    for (int p = 0; p < 3; p++) {
        const uint8_t *d = w[p]->data;
        if (w[p]->type != DF_W_BF16 || w[p]->rows != (p == 2 ? H : I)) return 0;
        for (uint64_t i = 0; i < 5120; i++)
            if (d[i] != pattern(layer, e, (uint64_t)p * 5120 + i)) return 0;
    }
    return 1;
}

static uint64_t views_hash(const df_expert *v) {
    const uint8_t *base = v->gate.data;
    return XXH64(base, STRIDE, 0);
}

static double g_hot = -1; /* hot_fraction for open_store (-1 = default) */

static df_store *open_store(fixture *fx, uint64_t cache, int uring, int policy, const char *heat, const char *events) {
    store_opts o;
    store_opts_default(&o);
    o.hot_fraction = g_hot;
    o.cache_bytes = cache;
    o.use_uring = uring;
    o.policy = policy;
    o.heat_path = heat;
    o.events_path = events;
    o.io_bytes = 4096; /* several chunks per stripe */
    o.io_depth = 4;
    df_store *st = NULL;
    char err[512] = "";
    int rc = store_open(&st, &fx->nat, &o, err, sizeof err);
    CHECK(rc == 0, "store_open: %d %s", rc, err);
    return st;
}

/* Read every expert of both layers; return the XOR of view hashes, check bytes. */
static uint64_t read_all(df_store *st, int *bad) {
    uint64_t acc = 0;
    for (int layer = 1; layer <= 2; layer++) {
        int ids[NE];
        for (int e = 0; e < NE; e++) ids[e] = e;
        store_request(st, layer, ids, NE, STORE_DEMAND);
        for (int e = 0; e < NE; e += 2) {
            df_expert v[2];
            char err[512] = "";
            int rc = store_acquire(st, layer, ids + e, 2, v, err, sizeof err);
            if (rc) { fprintf(stderr, "acquire: %s\n", err); (*bad)++; continue; }
            for (int q = 0; q < 2; q++) {
                if (!views_ok(&v[q], layer, e + q)) (*bad)++;
                acc = acc * 31 + views_hash(&v[q]);
            }
            store_release(st, layer, ids + e, 2);
        }
    }
    return acc;
}

static void test_reads_and_engines(void) {
    fixture fx;
    uint64_t ref = 0;
    for (int nd = 1; nd <= 3; nd++) {
        make_fixture(&fx, "rd", nd);
        for (int uring = 1; uring >= 0; uring--) {
            for (int cache_all = 1; cache_all >= 0; cache_all--) {
                df_store *st = open_store(&fx, cache_all ? 0 : 4 * (uint64_t)STRIDE, uring, 0, NULL, NULL);
                if (!st) continue;
                int bad = 0;
                uint64_t h = read_all(st, &bad);
                CHECK(bad == 0, "stripes %d uring %d cache_all %d: %d bad experts", nd, uring, cache_all, bad);
                if (!ref) ref = h;
                CHECK(h == ref, "stripes %d uring %d: hash %llx vs %llx", nd, uring, (unsigned long long)h,
                      (unsigned long long)ref);
                store_stats s;
                store_get_stats(st, &s);
                CHECK(s.misses == 16 && s.hits == 0, "misses %llu hits %llu", (unsigned long long)s.misses,
                      (unsigned long long)s.hits);
                CHECK(s.bytes_demand == 16ull * STRIDE, "bytes_demand %llu", (unsigned long long)s.bytes_demand);
                CHECK(s.n_drives == nd, "n_drives %d vs %d", s.n_drives, nd);
                uint64_t sum = 0;
                for (int d = 0; d < s.n_drives; d++) sum += s.drive_bytes[d];
                CHECK(sum == 16ull * STRIDE, "drive bytes %llu", (unsigned long long)sum);
                CHECK(!strcmp(s.io_engine, uring ? "io_uring" : "pread"), "engine %s (uring %d)", s.io_engine, uring);
                if (cache_all) {
                    CHECK(s.resident_bytes == 16ull * STRIDE * (nd == 3 ? 24576.0 / STRIDE : 1),
                          "resident %llu", (unsigned long long)s.resident_bytes);
                    /* second pass: all hits, no new bytes */
                    int bad2 = 0;
                    read_all(st, &bad2);
                    store_get_stats(st, &s);
                    CHECK(bad2 == 0 && s.hits == 16 && s.bytes_demand == 16ull * STRIDE, "second pass hits %llu",
                          (unsigned long long)s.hits);
                }
                store_close(st);
            }
        }
        free_fixture(&fx);
    }
}

static void test_corruption(void) {
    fixture fx;
    for (int nd = 1; nd <= 2; nd++) {
        make_fixture(&fx, "bad", nd);
        /* flip one byte of expert 5 of layer 2 in the last stripe file */
        const char *f = fx.files[1][nd - 1];
        int fd = open(f, O_RDWR);
        uint64_t off = 5ull * fx.layers[1].stripe_bytes + 100;
        uint8_t b;
        CHECK(pread(fd, &b, 1, off) == 1, "pread");
        b ^= 0x40;
        CHECK(pwrite(fd, &b, 1, off) == 1, "pwrite");
        close(fd);
        for (int uring = 0; uring <= 1; uring++) {
            df_store *st = open_store(&fx, 0, uring, 0, NULL, NULL);
            int ids[2] = {4, 5};
            df_expert v[2];
            char err[1024] = "";
            int rc = store_acquire(st, 2, ids, 2, v, err, sizeof err);
            CHECK(rc == DF_EFORMAT, "corrupt expert: rc %d (%s)", rc, err);
            CHECK(strstr(err, "layer 2") && strstr(err, "expert 5") && strstr(err, fx.files[1][0]),
                  "message names layer, expert, file: %s", err);
            /* other experts still fine; the bad one fails again */
            int ok_id = 4;
            rc = store_acquire(st, 2, &ok_id, 1, v, err, sizeof err);
            CHECK(rc == 0 && views_ok(&v[0], 2, 4), "expert 4 after error: %d %s", rc, err);
            store_release(st, 2, &ok_id, 1);
            int bad_id = 5;
            rc = store_acquire(st, 2, &bad_id, 1, v, err, sizeof err);
            CHECK(rc == DF_EFORMAT, "corrupt expert again: %d", rc);
            store_close(st);
        }
        free_fixture(&fx);
    }
}

static void test_truncated(void) {
    fixture fx;
    make_fixture(&fx, "trunc", 1);
    CHECK(truncate(fx.files[0][0], 5ull * STRIDE + 100) == 0, "truncate");
    store_opts o;
    store_opts_default(&o);
    df_store *st = NULL;
    char err[1024] = "";
    int rc = store_open(&st, &fx.nat, &o, err, sizeof err);
    CHECK(rc == DF_EFORMAT && st == NULL, "truncated pack: rc %d", rc);
    CHECK(strstr(err, "truncated") && strstr(err, fx.files[0][0]) && strstr(err, "layer 1"), "message: %s", err);
    /* a missing pack */
    free_fixture(&fx);
    make_fixture(&fx, "trunc", 1);
    unlink(fx.files[1][0]);
    rc = store_open(&st, &fx.nat, &o, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, fx.files[1][0]), "missing pack: %d %s", rc, err);
    free_fixture(&fx);
}

/* Hit / miss counting and eviction with 4 slots. */
/* A demand set larger than the cache (issue 10): its present members are held, not evicted to load others
 * (they would be read twice); store_present names the members with a slot, acquired first, then the rest in
 * groups as slots are released: every member read once. */
static void test_set_larger_than_cache(void) {
    fixture fx;
    make_fixture(&fx, "big", 1);
    df_store *st = open_store(&fx, 4ull * STRIDE + 100, 1, 0, NULL, NULL);
    df_expert v[4];
    char err[512];
    int pre[2] = {6, 7};
    CHECK(store_acquire(st, 1, pre, 2, v, err, sizeof err) == 0, "%s", err);
    store_release(st, 1, pre, 2);
    int set[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK(store_request(st, 1, set, 8, STORE_DEMAND) == 0, "request");
    unsigned char p[8];
    store_present(st, 1, set, 8, p);
    int n_p = 0;
    for (int i = 0; i < 8; i++) n_p += p[i] != 0;
    /* 6 and 7 (acquired above) in memory (2); 0 and 1 being read (1) or read already (2); 2..5 without a slot */
    CHECK(n_p == 4 && p[6] == 2 && p[7] == 2 && p[0] && p[1] && p[0] <= 2 && p[1] <= 2 && !p[2],
          "present %d: %d%d%d%d%d%d%d%d", n_p, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    /* the engine's order: present members first, then the rest, two at a time, re-requested on release */
    int order[8] = {0, 1, 6, 7, 2, 3, 4, 5};
    for (int g = 0; g < 8; g += 2) {
        CHECK(store_acquire(st, 1, order + g, 2, v, err, sizeof err) == 0, "group %d: %s", g, err);
        CHECK(views_ok(&v[0], 1, order[g]) && views_ok(&v[1], 1, order[g + 1]), "group %d bytes", g);
        store_release(st, 1, order + g, 2);
        if (g + 2 < 8) store_request(st, 1, order + g + 2, 8 - g - 2, STORE_DEMAND);
    }
    store_stats s;
    store_get_stats(st, &s);
    CHECK(s.bytes_demand == 8ull * STRIDE, "read %llu bytes for 8 experts of %u (a member read twice)",
          (unsigned long long)s.bytes_demand, STRIDE);
    store_close(st);
    free_fixture(&fx);
}

static void test_eviction_counts(void) {
    fixture fx;
    make_fixture(&fx, "ev", 1);
    df_store *st = open_store(&fx, 4ull * STRIDE + 100, 1, 0, NULL, NULL);
    store_stats s;
    store_get_stats(st, &s);
    CHECK(s.n_slots == 4, "slots %d", s.n_slots);
    CHECK(store_max_acquire(st) == 4, "max acquire %d", store_max_acquire(st));
    df_expert v[4];
    char err[512];
    int a[2] = {0, 1}, b[2] = {2, 3}, c[2] = {4, 5};
    /* a: 2 misses; a again: 2 hits (a now has freq 2) */
    CHECK(store_acquire(st, 1, a, 2, v, err, sizeof err) == 0, "%s", err);
    store_release(st, 1, a, 2);
    CHECK(store_acquire(st, 1, a, 2, v, err, sizeof err) == 0, "%s", err);
    store_release(st, 1, a, 2);
    CHECK(store_acquire(st, 1, b, 2, v, err, sizeof err) == 0, "%s", err);
    store_release(st, 1, b, 2);
    /* c evicts b (freq 1), not a (freq 2) even though a is older */
    CHECK(store_acquire(st, 1, c, 2, v, err, sizeof err) == 0, "%s", err);
    CHECK(views_ok(&v[0], 1, 4) && views_ok(&v[1], 1, 5), "bytes after eviction");
    store_release(st, 1, c, 2);
    CHECK(store_acquire(st, 1, a, 2, v, err, sizeof err) == 0 && views_ok(&v[0], 1, 0), "%s", err);
    store_release(st, 1, a, 2);
    store_get_stats(st, &s);
    CHECK(s.hits == 4 && s.misses == 6, "hits %llu misses %llu", (unsigned long long)s.hits,
          (unsigned long long)s.misses);
    CHECK(s.resident_bytes == 4ull * STRIDE, "resident %llu", (unsigned long long)s.resident_bytes);
    /* too many at once: budget error, not a hang */
    int five[5] = {0, 1, 2, 3, 4};
    df_expert v5[5];
    int rc = store_acquire(st, 1, five, 5, v5, err, sizeof err);
    CHECK(rc == DF_EBUDGET && strstr(err, "slots"), "5 > 4 slots: %d %s", rc, err);
    /* all 4 pinned, then one more: error instead of deadlock */
    int four[4] = {0, 1, 2, 3}, six = 6;
    CHECK(store_acquire(st, 2, four, 4, v, err, sizeof err) == 0, "%s", err);
    rc = store_acquire(st, 2, &six, 1, v5, err, sizeof err);
    CHECK(rc == DF_EBUDGET, "all pinned: %d %s", rc, err);
    store_release(st, 2, four, 4);
    rc = store_acquire(st, 2, &six, 1, v5, err, sizeof err);
    CHECK(rc == 0 && views_ok(&v5[0], 2, 6), "after release: %d %s", rc, err);
    store_release(st, 2, &six, 1);
    store_close(st);
    free_fixture(&fx);
}

/* A decode-like trace: layers visited cyclically, top-2 of 8 experts drawn
 * from a skewed (1/(rank+1)) distribution with a fixed seed, 6 slots for 16
 * keys. LRU keeps the cold experts just used; frequency keeps the popular ones. */
static uint64_t trace_hits(fixture *fx, int policy) {
    df_store *st = open_store(fx, 6ull * STRIDE, 1, policy, NULL, NULL);
    char err[512];
    df_expert v[2];
    uint64_t rng = 12345;
    double cdf[NE], z = 0;
    for (int e = 0; e < NE; e++) z += 1.0 / (e + 1);
    for (int e = 0, c = 0; e < NE; e++) cdf[e] = (c += 0, (e ? cdf[e - 1] : 0) + 1.0 / (e + 1) / z);
    for (int t = 0; t < 200; t++) {
        for (int layer = 1; layer <= 2; layer++) {
            int ids[2];
            for (int q = 0; q < 2; q++) {
                do {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    double u = (rng >> 11) * (1.0 / 9007199254740992.0);
                    int e = 0;
                    while (e < NE - 1 && u > cdf[e]) e++;
                    ids[q] = (e + 3 * layer) % NE; /* each layer has its own popular experts */
                } while (q == 1 && ids[1] == ids[0]);
            }
            if (store_acquire(st, layer, ids, 2, v, err, sizeof err)) { fprintf(stderr, "%s\n", err); break; }
            store_release(st, layer, ids, 2);
        }
    }
    store_stats s;
    store_get_stats(st, &s);
    store_close(st);
    return s.hits;
}

static void test_policy(void) {
    fixture fx;
    make_fixture(&fx, "pol", 1);
    uint64_t freq = trace_hits(&fx, 0), lru = trace_hits(&fx, 1);
    printf("trace hits: LRFU %llu, LRU %llu (of 800)\n", (unsigned long long)freq, (unsigned long long)lru);
    CHECK(freq > lru, "LRFU %llu should beat LRU %llu", (unsigned long long)freq, (unsigned long long)lru);
    free_fixture(&fx);
}

static void test_prefetch(void) {
    fixture fx;
    make_fixture(&fx, "pf", 2);
    df_store *st = open_store(&fx, 0, 1, 0, NULL, NULL);
    int p[3] = {1, 3, 6};
    store_request(st, 2, p, 3, STORE_PREFETCH);
    /* wait until they are in (prefetch bytes counted) */
    store_stats s;
    for (int i = 0; i < 2000; i++) {
        store_get_stats(st, &s);
        if (s.bytes_prefetch == 3ull * STRIDE) break;
        usleep(1000);
    }
    CHECK(s.bytes_prefetch == 3ull * STRIDE && s.prefetch_issued == 3, "prefetch bytes %llu issued %llu",
          (unsigned long long)s.bytes_prefetch, (unsigned long long)s.prefetch_issued);
    int want[2] = {3, 4};
    df_expert v[2];
    char err[512];
    store_request(st, 2, want, 2, STORE_DEMAND);
    CHECK(store_acquire(st, 2, want, 2, v, err, sizeof err) == 0, "%s", err);
    CHECK(views_ok(&v[0], 2, 3) && views_ok(&v[1], 2, 4), "prefetched bytes");
    store_release(st, 2, want, 2);
    store_get_stats(st, &s);
    /* the prefetched expert was read for this use: a miss for the hit rate (the storage bound counts its bytes) */
    CHECK(s.prefetch_useful == 1 && s.hits == 0 && s.misses == 2, "useful %llu hits %llu misses %llu",
          (unsigned long long)s.prefetch_useful, (unsigned long long)s.hits, (unsigned long long)s.misses);
    CHECK(s.bytes_demand == STRIDE, "demand bytes %llu", (unsigned long long)s.bytes_demand);
    CHECK_NEAR(store_layer_recall(st, 2, 1), 1.0 / 3, 1e-12, "layer 2 recall");
    CHECK(store_layer_recall(st, 1, 1) == -1 && store_layer_recall(st, 2, 4) == -1, "recall without enough guesses");
    /* cancel: queue many guesses then cancel; whatever was not started is dropped, the rest completes */
    int all[NE];
    for (int e = 0; e < NE; e++) all[e] = e;
    store_request(st, 1, all, NE, STORE_PREFETCH);
    store_cancel_prefetch(st);
    store_get_stats(st, &s);
    CHECK(s.prefetch_issued == 3 + NE, "issued %llu", (unsigned long long)s.prefetch_issued);
    df_expert v8[NE];
    CHECK(store_acquire(st, 1, all, NE, v8, err, sizeof err) == 0, "%s", err);
    int good = 1;
    for (int e = 0; e < NE; e++) good &= views_ok(&v8[e], 1, e);
    CHECK(good, "bytes after cancel");
    store_release(st, 1, all, NE);
    store_get_stats(st, &s);
    CHECK(s.prefetch_useful + s.prefetch_cancelled == 1 + NE, "useful %llu + cancelled %llu",
          (unsigned long long)s.prefetch_useful, (unsigned long long)s.prefetch_cancelled);
    printf("cancelled %llu of %d queued guesses\n", (unsigned long long)s.prefetch_cancelled, NE);
    store_close(st);
    /* stale guesses: a demand request for a layer drops that layer's other queued / running guesses */
    for (int rep = 0; rep < 20; rep++) {
        st = open_store(&fx, 6ull * STRIDE, rep % 2, 0, NULL, NULL);
        store_request(st, 1, all, 6, STORE_PREFETCH);
        int two = 2;
        store_request(st, 1, &two, 1, STORE_DEMAND);
        CHECK(store_acquire(st, 1, &two, 1, v8, err, sizeof err) == 0 && views_ok(&v8[0], 1, 2), "%s", err);
        store_release(st, 1, &two, 1);
        int six[6] = {7, 6, 5, 4, 3, 1};
        store_request(st, 1, six, 6, STORE_DEMAND);
        CHECK(store_acquire(st, 1, six, 6, v8, err, sizeof err) == 0, "%s", err);
        good = 1;
        for (int e = 0; e < 6; e++) good &= views_ok(&v8[e], 1, six[e]);
        CHECK(good, "bytes after dropped guesses");
        store_release(st, 1, six, 6);
        store_get_stats(st, &s);
        CHECK(s.prefetch_useful >= 1 && s.prefetch_useful + s.prefetch_cancelled <= 6, "useful %llu cancelled %llu",
              (unsigned long long)s.prefetch_useful, (unsigned long long)s.prefetch_cancelled);
        store_close(st);
    }
    free_fixture(&fx);
}

static void test_budget(void) {
    fixture fx;
    make_fixture(&fx, "bud", 1);
    uint64_t cache = 1;
    char err[512] = "";
    CHECK(store_budget(&fx.nat, 0, 1000, 1000, 0, &cache, err, sizeof err) == 0 && cache == 0, "unlimited");
    CHECK(store_slot_bytes(&fx.nat) == STRIDE, "slot bytes");
    /* minimum = spine 1 MiB + kv 64 KiB + tables (3 x 8 keys x 22 B + 64 KiB) + 2*top_k(2) * 16 KiB */
    uint64_t min = 1048576 + 65536 + 528 + 65536 + 4ull * STRIDE;
    int rc = store_budget(&fx.nat, min - 1, 1048576, 65536, 0, &cache, err, sizeof err);
    CHECK(rc == DF_EBUDGET && strstr(err, "1245712"), "too small: %d %s", rc, err);
    rc = store_budget(&fx.nat, min + 10 * STRIDE, 1048576, 65536, 0, &cache, err, sizeof err);
    CHECK(rc == 0 && cache == 14ull * STRIDE, "cache %llu", (unsigned long long)cache);
    /* a cache below top-k is refused by store_open with the minimum */
    store_opts o;
    store_opts_default(&o);
    o.cache_bytes = STRIDE;
    df_store *st = NULL;
    rc = store_open(&st, &fx.nat, &o, err, sizeof err);
    CHECK(rc == DF_EBUDGET && strstr(err, "32768"), "1 slot: %d %s", rc, err);
    free_fixture(&fx);
}

static void test_heat_events(void) {
    fixture fx;
    make_fixture(&fx, "heat", 1);
    char heat[400], ev[400];
    snprintf(heat, sizeof heat, "%s/heat.bin", fx.root);
    snprintf(ev, sizeof ev, "%s/events.jsonl", fx.root);
    df_store *st = open_store(&fx, 8ull * STRIDE, 1, 0, heat, ev);
    df_expert v[2];
    char err[512];
    for (int t = 0; t < 20; t++) {
        int ids[2] = {7, t % 4};
        CHECK(store_acquire(st, 1, ids, 2, v, err, sizeof err) == 0, "%s", err);
        store_release(st, 1, ids, 2);
        store_token_event(st, t);
    }
    store_close(st);
    struct stat sb;
    CHECK(stat(heat, &sb) == 0 && sb.st_size == 32 + NL * NE * 4, "heat file size %lld", (long long)sb.st_size);
    /* reopen: the heat is loaded and the hot tier is formed; expert 7 of layer 1 is in it */
    g_hot = 0.25;
    st = open_store(&fx, 8ull * STRIDE, 1, 0, heat, ev);
    g_hot = -1;
    CHECK(store_max_acquire(st) == 8 - 2, "max acquire with hot tier of 2: %d", store_max_acquire(st));
    store_close(st);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = fopen(ev, "r");
    if (f) {
        buf = calloc(1, 1 << 20);
        len = fread(buf, 1, (1 << 20) - 1, f);
        fclose(f);
    }
    CHECK(buf && len > 0 && strstr(buf, "\"ev\":\"acquire\"") && strstr(buf, "\"ev\":\"token\"") &&
              strstr(buf, "\"loaded\":1") && strstr(buf, "\"ev\":\"read\""),
          "events file content");
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    CHECK(lines > 40, "event lines %d", lines);
    free(buf);
    free_fixture(&fx);
}

int main(void) {
    test_reads_and_engines();
    test_corruption();
    test_truncated();
    test_eviction_counts();
    test_set_larger_than_cache();
    test_policy();
    test_prefetch();
    test_budget();
    test_heat_events();
    return t_done();
}
