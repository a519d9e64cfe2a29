/*
 * test_heat_file.c — the store's persistent heat file (src/store/store_heat.c)
 * at an existing path: only this model's heat file is read and rewritten; a
 * file that is not a heat file, another model's heat file, a damaged one or a
 * FIFO is left byte for byte as it was, with one warning on stderr at open. A
 * save that fails (parent is not a directory; a write cut short by the file
 * size limit) says so on stderr, keeps the old file and leaves no temporary
 * file. Driven through store_open / store_acquire / store_close on a hand-made
 * model of 3 layers (1 and 2 routed, 8 experts).
 */
#define _GNU_SOURCE
#include "test_util.h"
#include "test_store_fixture.h"
#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define HEAT_BYTES (32 + NL * NE * 4)

typedef struct {
    df_native nat;
    native_expert_layer layers[2];
    char root[320];
    uint64_t xxh[2][NE];
    char *files[2][1];
} fixture;

static char g_dir[256]; /* scratch directory of this run */

/* A model whose expert bytes (so checksums, so heat-file model id) depend on seed. */
static void make_fixture(fixture *fx, const char *tag, unsigned seed) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->root, sizeof fx->root, "%s/%s", g_dir, tag);
    if (mkdir(fx->root, 0755)) { perror(fx->root); exit(1); }
    df_native *n = &fx->nat;
    fixture_native_init(n, fx->layers, fx->root, tag);
    uint8_t *pack = calloc(NE, STRIDE);
    for (int li = 0; li < 2; li++) {
        native_expert_layer *L = &fx->layers[li];
        L->layer = li + 1;
        L->n_files = 1;
        L->files = fx->files[li];
        L->stripe_bytes = STRIDE;
        L->xxh64 = fx->xxh[li];
        for (int e = 0; e < NE; e++) {
            uint8_t *ext = pack + (uint64_t)e * STRIDE;
            for (uint64_t i = 0; i < STRIDE; i++)
                ext[i] = i < EXTENT ? (uint8_t)((i * 2654435761u) ^ (seed * 7919u + (unsigned)L->layer * 31u + (unsigned)e)) : 0;
            fx->xxh[li][e] = XXH64(ext, STRIDE, 0);
        }
        char p[600];
        snprintf(p, sizeof p, "%s/experts-L%03d.pack", fx->root, L->layer);
        fx->files[li][0] = strdup(p);
        FILE *f = fopen(p, "wb");
        if (!f || fwrite(pack, STRIDE, NE, f) != NE) { perror(p); exit(1); }
        fclose(f);
    }
    free(pack);
}

static void free_fixture(fixture *fx) {
    for (int li = 0; li < 2; li++) free(fx->files[li][0]);
}

/* stderr of fn(arg) (through a pipe: not a file, so a file size limit does not cut it) */
static char g_err[8192];
static void capture_begin(int *saved, int p[2]) {
    fflush(stderr);
    if (pipe(p)) { perror("pipe"); exit(1); }
    *saved = dup(2);
    dup2(p[1], 2);
}
static void capture_end(int saved, int p[2]) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    ssize_t n = read(p[0], g_err, sizeof g_err - 1);
    g_err[n > 0 ? n : 0] = 0;
    close(p[0]);
}

/* One run: open the store with heat_path, acquire experts {0,1} of layer 1 `rounds` times (2 * rounds
 * acquisitions), close. Returns what it wrote to stderr in g_err. With fsize_limit > 0 the close runs under
 * RLIMIT_FSIZE = fsize_limit (SIGXFSZ ignored). */
static void run_store(fixture *fx, const char *heat, int rounds, long fsize_limit) {
    int saved, p[2];
    capture_begin(&saved, p);
    store_opts o;
    store_opts_default(&o);
    o.heat_path = heat;
    df_store *st = NULL;
    char err[512] = "";
    int rc = store_open(&st, &fx->nat, &o, err, sizeof err);
    if (rc == 0) {
        for (int r = 0; r < rounds; r++) {
            int ids[2] = {0, 1};
            df_expert v[2];
            if (store_acquire(st, 1, ids, 2, v, err, sizeof err) == 0) store_release(st, 1, ids, 2);
        }
        struct rlimit old;
        getrlimit(RLIMIT_FSIZE, &old);
        if (fsize_limit > 0) {
            struct rlimit lim = {(rlim_t)fsize_limit, old.rlim_max};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &lim);
        }
        store_close(st);
        if (fsize_limit > 0) setrlimit(RLIMIT_FSIZE, &old);
    }
    capture_end(saved, p);
    CHECK(rc == 0, "store_open: %d %s", rc, err);
}

static char *slurp(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 16);
    *len = fread(b, 1, 1 << 16, f);
    fclose(f);
    return b;
}

static void put(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(1); }
    fclose(f);
}

/* 1 if path holds exactly data[0..n) */
static int same_bytes(const char *path, const void *data, size_t n) {
    size_t len;
    char *b = slurp(path, &len);
    int ok = b && len == n && !memcmp(b, data, n);
    free(b);
    return ok;
}

/* entries of dir whose name ends in ".tmp" */
static int tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) k++;
    }
    closedir(d);
    return k;
}

static double heat_acq(const char *path) {
    size_t len;
    char *b = slurp(path, &len);
    double a = -1;
    if (b && len >= 32) memcpy(&a, b + 24, 8);
    free(b);
    return a;
}

static float heat_at(const char *path, int layer, int e) {
    size_t len;
    char *b = slurp(path, &len);
    float h = -1;
    if (b && len == HEAT_BYTES) memcpy(&h, b + 32 + 4 * (layer * NE + e), 4);
    free(b);
    return h;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/df_test_heat_file_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_dir, g_dir);
    if (system(cmd)) return 1;
    fixture a, b;
    make_fixture(&a, "a", 1);
    make_fixture(&b, "b", 2);
    char path[512], want[1024];

    /* 1. a missing file is created: 32-byte header + 3 x 8 floats; no warning */
    snprintf(path, sizeof path, "%s/heat.bin", g_dir);
    run_store(&a, path, 5, 0);
    CHECK(g_err[0] == 0, "new file: stderr \"%s\"", g_err);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == HEAT_BYTES, "new heat file size %lld",
          (long long)(stat(path, &sb) ? -1 : sb.st_size));
    CHECK(heat_acq(path) == 10.0, "acquisitions %g (want 10)", heat_acq(path));
    CHECK(heat_at(path, 1, 0) == 5.0f && heat_at(path, 1, 1) == 5.0f && heat_at(path, 1, 2) == 0.0f,
          "heat L1: %g %g %g (want 5 5 0)", heat_at(path, 1, 0), heat_at(path, 1, 1), heat_at(path, 1, 2));

    /* 2. this model's own file is read and updated: 10 + 6 acquisitions, heat 5 * 2^(-6/2^20) + 3 */
    run_store(&a, path, 3, 0);
    CHECK(g_err[0] == 0, "own file: stderr \"%s\"", g_err);
    CHECK(heat_acq(path) == 16.0, "acquisitions %g (want 16)", heat_acq(path));
    CHECK_NEAR(heat_at(path, 1, 0), 8.0, 1e-4, "heat L1 E0 after two runs");
    CHECK(tmp_files(g_dir) == 0, "temporary files left: %d", tmp_files(g_dir));
    size_t own_len;
    char *own = slurp(path, &own_len);

    /* 3. a text file is not a heat file: untouched, one warning naming it and what it starts with */
    char notes[512];
    snprintf(notes, sizeof notes, "%s/notes.md", g_dir);
    const char text[] = "# deltafin notes\nremember the milk\n";
    put(notes, text, sizeof text - 1);
    run_store(&a, notes, 5, 0);
    CHECK(same_bytes(notes, text, sizeof text - 1), "notes.md changed");
    snprintf(want, sizeof want,
             "deltafin: warning: --heat %s is not a deltafin heat file (it starts with \"# deltaf\"); it is left "
             "untouched and this run's expert heat is not saved: pass another path (or --heat off)\n", notes);
    CHECK(!strcmp(g_err, want), "stderr \"%s\"", g_err);
    CHECK(tmp_files(g_dir) == 0, "temporary files left: %d", tmp_files(g_dir));

    /* 4. a binary file shorter than the magic: untouched, its bytes quoted */
    char shortf[512];
    snprintf(shortf, sizeof shortf, "%s/short.bin", g_dir);
    const unsigned char sb3[3] = {0x00, 'D', 0xff};
    put(shortf, sb3, 3);
    run_store(&a, shortf, 1, 0);
    CHECK(same_bytes(shortf, sb3, 3), "short.bin changed");
    CHECK(strstr(g_err, "is not a deltafin heat file (it starts with \"\\x00D\\xff\")") != NULL, "stderr \"%s\"", g_err);

    /* 5. model a's heat file given to model b (same shape, other checksums): untouched */
    run_store(&b, path, 5, 0);
    CHECK(same_bytes(path, own, own_len), "model a's heat file changed by model b");
    snprintf(want, sizeof want, "deltafin: warning: --heat %s is the heat file of another model (other expert "
             "checksums); it is left untouched", path);
    CHECK(!strncmp(g_err, want, strlen(want)), "stderr \"%s\"", g_err);

    /* 6. a heat file of another shape (3 layers x 16 experts): untouched */
    char other[512];
    snprintf(other, sizeof other, "%s/other.bin", g_dir);
    unsigned char ob[32 + 3 * 16 * 4];
    memset(ob, 0, sizeof ob);
    memcpy(ob, "DFHEAT1", 8);
    uint32_t nl = 3, ne = 16;
    memcpy(ob + 8, &nl, 4);
    memcpy(ob + 12, &ne, 4);
    put(other, ob, sizeof ob);
    run_store(&a, other, 5, 0);
    CHECK(same_bytes(other, ob, sizeof ob), "other.bin changed");
    CHECK(strstr(g_err, "is the heat file of another model (3 layers x 16 experts; this model has 3 x 8)") != NULL,
          "stderr \"%s\"", g_err);

    /* 7. this model's file cut short by 4 bytes: damaged, untouched */
    char cut[512];
    snprintf(cut, sizeof cut, "%s/cut.bin", g_dir);
    put(cut, own, own_len - 4);
    run_store(&a, cut, 5, 0);
    CHECK(same_bytes(cut, own, own_len - 4), "cut.bin changed");
    CHECK(strstr(g_err, "is a damaged heat file (124 bytes, 128 expected for this model)") != NULL, "stderr \"%s\"",
          g_err);

    /* 8. a FIFO: not opened (no hang), still a FIFO */
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo");
    run_store(&a, fifo, 5, 0);
    CHECK(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "fifo replaced");
    CHECK(strstr(g_err, "is not a regular file; it is left untouched") != NULL, "stderr \"%s\"", g_err);

    /* 9. an empty file counts as missing: written */
    char empty[512];
    snprintf(empty, sizeof empty, "%s/empty.bin", g_dir);
    put(empty, "", 0);
    run_store(&a, empty, 5, 0);
    CHECK(g_err[0] == 0, "empty file: stderr \"%s\"", g_err);
    CHECK(stat(empty, &sb) == 0 && sb.st_size == HEAT_BYTES && heat_acq(empty) == 10.0, "empty file not written");

    /* 10. the parent is a regular file: the save fails, one warning with the reason, nothing created */
    char pfile[512], under[600];
    snprintf(pfile, sizeof pfile, "%s/x_file", g_dir);
    put(pfile, "x", 1);
    snprintf(under, sizeof under, "%s/heat.bin", pfile);
    run_store(&a, under, 5, 0);
    snprintf(want, sizeof want, "deltafin: warning: could not save the expert heat to %s: Not a directory (use --heat "
             "PATH to save it elsewhere)\n", under);
    CHECK(!strcmp(g_err, want), "stderr \"%s\"", g_err);
    CHECK(same_bytes(pfile, "x", 1), "x_file changed");

    /* 11. a write cut short (file size limit 64 bytes < 128): the old file stays, no temporary file is left */
    run_store(&a, path, 5, 64);
    snprintf(want, sizeof want, "deltafin: warning: could not save the expert heat to %s: File too large (use --heat "
             "PATH to save it elsewhere)\n", path);
    CHECK(!strcmp(g_err, want), "stderr \"%s\"", g_err);
    CHECK(same_bytes(path, own, own_len), "heat file changed by a failed save");
    CHECK(tmp_files(g_dir) == 0, "temporary files left: %d", tmp_files(g_dir));

    free(own);
    free_fixture(&a);
    free_fixture(&b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    return t_done();
}
