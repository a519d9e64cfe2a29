/*
 * store_heat.c — the persistent heat histogram of a model's experts and the
 * pinned hot tier derived from it.
 *
 * File (little-endian binary, written tmp + fsync + rename):
 *   "DFHEAT1\0", u32 n_layers, u32 n_experts, u64 model_id, f64 acquisitions,
 *   f32 heat[n_layers * n_experts]
 * model_id = XXH64 of the expert checksum table, so a histogram of another
 * model is never used. On close: heat = heat * 2^(-run_acquisitions / half_life)
 * + this run's acquisition counts. On open the top hot_fraction * n_slots
 * experts by heat form the hot tier (evicted only when nothing else can be),
 * and heat, scaled to a mean of 1 over experts, seeds the eviction score.
 * The heat only changes which experts stay in RAM, never any result.
 */
#define _GNU_SOURCE
#include "store_internal.h"
#include "deltafin.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static const char MAGIC[8] = "DFHEAT1";

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

static float *read_heat(const df_store *st, double *acq) {
    FILE *f = fopen(st->o.heat_path, "rb");
    if (!f) return NULL;
    char magic[8];
    uint32_t nl = 0, ne = 0;
    uint64_t id = 0;
    size_t n = (size_t)st->n_layers * st->n_experts;
    float *heat = NULL;
    if (fread(magic, 8, 1, f) == 1 && !memcmp(magic, MAGIC, 8) && fread(&nl, 4, 1, f) == 1 && fread(&ne, 4, 1, f) == 1 &&
        fread(&id, 8, 1, f) == 1 && fread(acq, 8, 1, f) == 1 && nl == (uint32_t)st->n_layers &&
        ne == (uint32_t)st->n_experts && id == model_id(st)) {
        heat = malloc(n * sizeof(float));
        if (heat && fread(heat, sizeof(float), n, f) != n) { free(heat); heat = NULL; }
    }
    fclose(f);
    return heat;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int store_heat_load(df_store *st) {
    double acq = 0;
    float *heat = read_heat(st, &acq);
    if (!heat) {
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
    size_t n = (size_t)st->n_layers * st->n_experts;
    double run = 0;
    for (size_t i = 0; i < n; i++) run += st->count_run[i];
    if (run <= 0) return;
    double acq = 0;
    float *old = read_heat(st, &acq);
    float *heat = calloc(n, sizeof(float));
    if (!heat) { free(old); return; }
    double decay = pow(2.0, -run / st->o.heat_half_life);
    for (size_t i = 0; i < n; i++) heat[i] = (float)((old ? old[i] * decay : 0) + st->count_run[i]);
    free(old);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", st->o.heat_path, (long)getpid()); /* concurrent runs */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { free(heat); return; }
    uint32_t nl = (uint32_t)st->n_layers, ne = (uint32_t)st->n_experts;
    uint64_t id = model_id(st);
    double total = acq + run;
    int ok = write(fd, MAGIC, 8) == 8 && write(fd, &nl, 4) == 4 && write(fd, &ne, 4) == 4 && write(fd, &id, 8) == 8 &&
             write(fd, &total, 8) == 8 && write(fd, heat, n * sizeof(float)) == (ssize_t)(n * sizeof(float));
    ok = ok && fsync(fd) == 0;
    close(fd);
    free(heat);
    if (!ok || rename(tmp, st->o.heat_path) != 0) unlink(tmp);
}
