/*
 * test_store_synth.c — `deltafin synth` output read back through the model's
 * manifest reader (native_open) and the expert store: every expert of a small
 * synthetic model striped over two directories comes back byte-identical to
 * native_read_expert (pread, no store) with io_uring and with the pread pool,
 * under a small cache, and with --expert-dirs pointing at moved packs.
 * Needs DF_BIN (set by CTest); skipped with a message otherwise.
 */
#define _GNU_SOURCE
#include "test_util.h"
#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static uint64_t read_all(const df_native *nat, int uring, uint64_t cache, const char *dirs, int *bad) {
    store_opts o;
    store_opts_default(&o);
    o.use_uring = uring;
    o.cache_bytes = cache;
    o.expert_dirs = dirs;
    df_store *st = NULL;
    char err[1024] = "";
    int rc = store_open(&st, nat, &o, err, sizeof err);
    CHECK(rc == 0, "store_open: %s", err);
    if (rc) return 0;
    uint64_t acc = 0;
    uint64_t bufb = store_slot_bytes(nat);
    uint8_t *ref = malloc(bufb);
    for (int i = 0; i < nat->n_moe_layers; i++) {
        int l = nat->moe_layers[i].layer;
        for (int e = 0; e < nat->n_experts; e += 4) {
            int ids[4] = {e, e + 1, e + 2, e + 3};
            df_expert v[4];
            store_request(st, l, ids, 4, STORE_DEMAND);
            rc = store_acquire(st, l, ids, 4, v, err, sizeof err);
            CHECK(rc == 0, "acquire L%d E%d: %s", l, e, err);
            if (rc) { (*bad)++; continue; }
            for (int q = 0; q < 4; q++) {
                rc = native_read_expert(nat, l, e + q, ref, err, sizeof err);
                CHECK(rc == 0, "native_read_expert: %s", err);
                if (memcmp(v[q].gate.data, ref, nat->stride)) (*bad)++;
                if ((const uint8_t *)v[q].down.data - (const uint8_t *)v[q].gate.data != (long)nat->parts[2].offset)
                    (*bad)++;
                acc = acc * 31 + XXH64(v[q].gate.data, nat->stride, 0);
            }
            store_release(st, l, ids, 4);
        }
    }
    store_stats s;
    store_get_stats(st, &s);
    CHECK(s.misses == (uint64_t)nat->n_moe_layers * nat->n_experts, "misses %llu", (unsigned long long)s.misses);
    CHECK(!strcmp(s.io_engine, uring ? "io_uring" : "pread"), "engine %s", s.io_engine);
    free(ref);
    store_close(st);
    return acc;
}

int main(void) {
    const char *bin = getenv("DF_BIN");
    if (!bin) { printf("DF_BIN not set: skipped\n"); return t_done(); }
    char dir[256], cmd[2048];
    snprintf(dir, sizeof dir, "/tmp/df_test_store_synth_%d", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s synth %s/m --quiet --hidden 256 --moe-inter 128 --experts 16 --layers 4 --vocab 512 "
             "--heads 4 --q-lora 64 --kv-lora 32 --inter 512 --nope 16 --rope 8 --v-dim 16 --top-k 4 "
             "--expert-dirs %s/a,%s/b",
             dir, bin, dir, dir, dir);
    CHECK(system(cmd) == 0, "synth: %s", cmd);
    df_native *nat = NULL;
    char err[1024] = "", path[512];
    snprintf(path, sizeof path, "%s/m", dir);
    int rc = native_open(&nat, path, err, sizeof err);
    CHECK(rc == 0, "native_open: %s", err);
    if (rc) return t_done();
    CHECK(nat->n_moe_layers == 3 && nat->n_experts == 16 && nat->expert_type == DF_W_MXFP4, "shape");
    CHECK(nat->moe_layers[0].n_files == 2, "2 stripes");
    /* mxfp4 [128 x 256]: data 16384 + scale 1024 per gate/up, down [256 x 128] 16384 + 1024 -> 52224 -> stride 53248 */
    CHECK(nat->extent_bytes == 52224 && nat->stride == 53248, "extent %llu stride %llu",
          (unsigned long long)nat->extent_bytes, (unsigned long long)nat->stride);
    int bad = 0;
    uint64_t h1 = read_all(nat, 1, 0, NULL, &bad);
    uint64_t h2 = read_all(nat, 0, 0, NULL, &bad);
    uint64_t h3 = read_all(nat, 1, 8 * store_slot_bytes(nat), NULL, &bad);
    CHECK(bad == 0, "%d experts differ from native_read_expert", bad);
    CHECK(h1 == h2 && h1 == h3, "uring / pread / small cache give the same bytes");
    /* move the packs: --expert-dirs override */
    snprintf(cmd, sizeof cmd, "mv %s/a %s/a2 && mv %s/b %s/b2", dir, dir, dir, dir);
    CHECK(system(cmd) == 0, "mv");
    char dirs[600];
    snprintf(dirs, sizeof dirs, "%s/a2,%s/b2", dir, dir);
    store_opts o;
    store_opts_default(&o);
    df_store *st = NULL;
    rc = store_open(&st, nat, &o, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "experts-L001.pack"), "moved packs without override: %d %s", rc, err);
    /* the reference reader needs the files in place: compare to h1 only */
    store_opts_default(&o);
    o.expert_dirs = dirs;
    rc = store_open(&st, nat, &o, err, sizeof err);
    CHECK(rc == 0, "override: %s", err);
    if (!rc) {
        uint64_t acc = 0;
        for (int i = 0; i < nat->n_moe_layers; i++) {
            int l = nat->moe_layers[i].layer;
            for (int e = 0; e < nat->n_experts; e += 4) {
                int ids[4] = {e, e + 1, e + 2, e + 3};
                df_expert v[4];
                rc = store_acquire(st, l, ids, 4, v, err, sizeof err);
                CHECK(rc == 0, "%s", err);
                for (int q = 0; q < 4 && !rc; q++) acc = acc * 31 + XXH64(v[q].gate.data, nat->stride, 0);
                store_release(st, l, ids, 4);
            }
        }
        CHECK(acc == h1, "bytes through --expert-dirs");
        store_close(st);
    }
    o.expert_dirs = path; /* one directory for two stripes */
    rc = store_open(&st, nat, &o, err, sizeof err);
    CHECK(rc == DF_EINVAL && strstr(err, "--expert-dirs"), "wrong dir count: %s", err);
    native_close(nat);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return t_done();
}
