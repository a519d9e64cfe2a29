/*
 * store_heat.c — the persistent heat histogram of a model's experts and the
 * pinned hot tier derived from it.
 *
 * File (little-endian binary, written tmp + fsync + rename):
 *   "DFHEAT1\0", u32 n_layers, u32 n_experts, u64 model_id, f64 acquisitions,
 *   f32 heat[n_layers * n_experts]
 * model_id = XXH64 of the expert checksum table. Only this model's heat file
 * (same layers, experts and model_id, exact size) is read and rewritten; a
 * missing or empty file is created at close. Anything else at the path (not a
 * regular file, unreadable, not a heat file, another model's, damaged) is
 * neither used nor written: one warning on stderr at open says so. On close:
 * heat = heat * 2^(-run_acquisitions / half_life) + this run's acquisition
 * counts; a failed save is one warning on stderr, the old file unchanged and
 * no temporary file left. On open the top hot_fraction * n_slots experts by
 * heat form the hot tier (evicted only when nothing else can be), and heat,
 * scaled to a mean of 1 over experts, seeds the eviction score.
 * The heat only changes which experts stay in RAM, never any result.
 */
#define _GNU_SOURCE
#include "store_internal.h"
#include "deltafin.h"
#include "util/util.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static const char MAGIC[8] = "DFHEAT1";
enum { HEADER = 32 }; /* magic, u32 layers, u32 experts, u64 model id, f64 acquisitions */

static uint64_t model_id(const df_store *st) {
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    uint32_t dims[2] = {(uint32_t)st->n_layers, (uint32_t)st->n_experts};
    XXH64_update(h, dims, sizeof dims);
    for (int l = 0; l < st->n_layers; l++)
        if (st->layers[l].n_files) XXH64_update(h, st->layers[l].xxh64, sizeof(uint64_t) * st->n_experts);
    uint64_t r = XXH64_digest(h);
    XXH64_freeState(h);
    return r;
}

/* The first n bytes as a C string literal's contents (printable ASCII as is, the rest escaped). */
static void quote_bytes(const unsigned char *b, size_t n, char *out, size_t outlen) {
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && k + 5 < outlen; i++) {
        if (b[i] == '"' || b[i] == '\\') k += (size_t)snprintf(out + k, outlen - k, "\\%c", b[i]);
        else if (b[i] == '\n') k += (size_t)snprintf(out + k, outlen - k, "\\n");
        else if (b[i] >= 0x20 && b[i] < 0x7f) k += (size_t)snprintf(out + k, outlen - k, "%c", b[i]);
        else k += (size_t)snprintf(out + k, outlen - k, "\\x%02x", b[i]);
    }
}

/* What is at o.heat_path. 1: this model's heat file, *heat = its n_layers * n_experts values (malloc'd) and *acq
 * its acquisitions; 0: nothing to read (no file, or an empty one: created at close); -1: something else, not to be
 * used nor overwritten, why = what it is (for "--heat PATH <why>"). Never blocks on a FIFO or device. */
static int read_heat(const df_store *st, float **heat, double *acq, char *why, size_t whylen) {
    const char *path = st->o.heat_path;
    *heat = NULL;
    *acq = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return 0; /* the save reports when it cannot create it */
        snprintf(why, whylen, "cannot be examined (%s)", strerror(errno));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(why, whylen, "is not a regular file");
        return -1;
    }
    if (sb.st_size == 0) return 0;
    size_t n = (size_t)st->n_layers * st->n_experts;
    const long long want = HEADER + (long long)(n * sizeof(float));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot be read (%s)", strerror(errno));
        return -1;
    }
    unsigned char hdr[HEADER];
    const size_t got = sb.st_size < HEADER ? (size_t)sb.st_size : HEADER; /* a short file: its bytes, for the message */
    int rc = -1, e = df_pread_all(fd, hdr, got, 0);
    if (e) {
        snprintf(why, whylen, "cannot be read (%s)", strerror(-e));
        goto out;
    }
    if (got < 8 || memcmp(hdr, MAGIC, 8)) {
        char q[48];
        quote_bytes(hdr, got < 8 ? got : 8, q, sizeof q);
        snprintf(why, whylen, "is not a deltafin heat file (it starts with \"%s\")", q);
        goto out;
    }
    uint32_t nl = 0, ne = 0;
    uint64_t id = 0;
    if (got == HEADER) {
        memcpy(&nl, hdr + 8, 4);
        memcpy(&ne, hdr + 12, 4);
        memcpy(&id, hdr + 16, 8);
        memcpy(acq, hdr + 24, 8);
    }
    if (got == HEADER && (nl != (uint32_t)st->n_layers || ne != (uint32_t)st->n_experts)) {
        snprintf(why, whylen, "is the heat file of another model (%u layers x %u experts; this model has %d x %d)", nl,
                 ne, st->n_layers, st->n_experts);
        goto out;
    }
    if (got == HEADER && id != model_id(st)) {
        snprintf(why, whylen, "is the heat file of another model (other expert checksums)");
        goto out;
    }
    if ((long long)sb.st_size != want) {
        snprintf(why, whylen, "is a damaged heat file (%lld bytes, %lld expected for this model)",
                 (long long)sb.st_size, want);
        goto out;
    }
    *heat = malloc(n * sizeof(float));
    if (!*heat) {
        snprintf(why, whylen, "cannot be read (%s)", strerror(ENOMEM));
        goto out;
    }
    if ((e = df_pread_all(fd, *heat, n * sizeof(float), HEADER))) {
        snprintf(why, whylen, "cannot be read (%s)", e == -EIO ? "it shrank while being read" : strerror(-e));
        free(*heat);
        *heat = NULL;
        goto out;
    }
    rc = 1;
out:
    close(fd);
    if (rc < 0) *acq = 0;
    return rc;
}

static void warn_kept(const df_store *st, const char *why) {
    fprintf(stderr, "deltafin: warning: --heat %s %s; it is left untouched and this run's expert heat is not saved: "
                    "pass another path (or --heat off)\n", st->o.heat_path, why);
}

static void warn_unsaved(const df_store *st, int err) {
    fprintf(stderr, "deltafin: warning: could not save the expert heat to %s: %s (use --heat PATH to save it "
                    "elsewhere)\n", st->o.heat_path, strerror(err));
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int store_heat_load(df_store *st) {
    double acq = 0;
    float *heat = NULL;
    char why[256];
    int r = read_heat(st, &heat, &acq, why, sizeof why);
    if (r < 0) {
        st->heat_keep = 1;
        warn_kept(st, why);
    }
    if (r <= 0) {
        store_event(st, "\"ev\":\"heat\",\"path\":\"%s\",\"loaded\":0", st->o.heat_path);
        return 0;
    }
    size_t n = (size_t)st->n_layers * st->n_experts;
    double sum = 0;
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) if (heat[i] > 0) { sum += heat[i]; nz++; }
    if (sum <= 0) { free(heat); return 0; }
    /* prior: mean over used experts = 1 acquisition */
    float *prior = malloc(n * sizeof(float));
    if (!prior) { free(heat); return 0; }
    for (size_t i = 0; i < n; i++) prior[i] = (float)(heat[i] * (double)nz / sum);
    st->heat = prior;
    /* hot tier: the top hot_fraction * n_slots by heat */
    int limit = (int)(st->o.hot_fraction * st->n_slots);
    if (limit > st->n_slots - 2 * st->top_k) limit = st->n_slots - 2 * st->top_k;
    if (limit < 0) limit = 0;
    if ((size_t)limit > nz) limit = (int)nz;
    if (limit > 0) {
        float *sorted = malloc(n * sizeof(float));
        if (sorted) {
            memcpy(sorted, heat, n * sizeof(float));
            qsort(sorted, n, sizeof(float), cmp_desc);
            float thr = sorted[limit - 1];
            int k = 0;
            for (size_t i = 0; i < n && k < limit; i++)
                if (heat[i] > thr) { st->hot[i] = 1; k++; }
            for (size_t i = 0; i < n && k < limit; i++)
                if (heat[i] == thr && thr > 0) { st->hot[i] = 1; k++; }
            st->hot_limit = k;
            free(sorted);
        }
    }
    free(heat);
    store_event(st, "\"ev\":\"heat\",\"path\":\"%s\",\"loaded\":1,\"acquisitions\":%.0f,\"hot\":%d", st->o.heat_path,
                acq, st->hot_limit);
    return 0;
}

void store_heat_save(df_store *st) {
    if (st->heat_keep) return;
    size_t n = (size_t)st->n_layers * st->n_experts;
    double run = 0;
    for (size_t i = 0; i < n; i++) run += st->count_run[i];
    if (run <= 0) return;
    /* read again: another run may have saved since this one opened (or put something else there) */
    double acq = 0;
    float *old = NULL;
    char why[256];
    if (read_heat(st, &old, &acq, why, sizeof why) < 0) {
        warn_kept(st, why);
        return;
    }
    float *heat = calloc(n, sizeof(float));
    if (!heat) { free(old); warn_unsaved(st, ENOMEM); return; }
    double decay = pow(2.0, -run / st->o.heat_half_life);
    for (size_t i = 0; i < n; i++) heat[i] = (float)((old ? old[i] * decay : 0) + st->count_run[i]);
    free(old);
    /* a heat path that is a symbolic link is saved into the file it names (the link stays a link) */
    char target[4096];
    if (!realpath(st->o.heat_path, target)) snprintf(target, sizeof target, "%s", st->o.heat_path);
    char tmp[4200];
    int len = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", target, (long)getpid()); /* concurrent runs */
    if (len < 0 || (size_t)len >= sizeof tmp) { free(heat); warn_unsaved(st, ENAMETOOLONG); return; }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { int e = errno; free(heat); warn_unsaved(st, e); return; }
    unsigned char hdr[HEADER];
    uint32_t nl = (uint32_t)st->n_layers, ne = (uint32_t)st->n_experts;
    uint64_t id = model_id(st);
    double total = acq + run;
    memcpy(hdr, MAGIC, 8);
    memcpy(hdr + 8, &nl, 4);
    memcpy(hdr + 12, &ne, 4);
    memcpy(hdr + 16, &id, 8);
    memcpy(hdr + 24, &total, 8);
    int err = -df_pwrite_all(fd, hdr, HEADER, 0);
    if (!err) err = -df_pwrite_all(fd, heat, n * sizeof(float), HEADER);
    if (!err && fsync(fd)) err = errno;
    if (close(fd) && !err) err = errno;
    free(heat);
    if (!err && rename(tmp, target)) err = errno;
    if (err) {
        unlink(tmp);
        warn_unsaved(st, err);
    }
}
