/*
 * cpu_matmul.c — the row-parallel matmul driver shared by the CPU backends:
 * y[T, rows] = x[T, cols] · W^T. Each thread decodes a row of W once into a
 * thread-local fp32 buffer and dots it with every token's x, so a weight is
 * read once per call whatever T is; for T == 1 a backend may supply a fused
 * decode+dot kernel instead.
 */
#include "cpu_internal.h"

#include <pthread.h>
#include <stdlib.h>

static __thread float *tl_row;
static __thread int64_t tl_cap;
static __thread void *tl_scr[CPU_SCRATCH_SLOTS];
static __thread size_t tl_scr_cap[CPU_SCRATCH_SLOTS];
/* The key's destructor frees a thread's buffers when ANY thread exits (pool workers and
 * callers of df_eval alike, e.g. a server's worker thread). Its value is the thread's
 * buffer table (non-NULL while the thread holds any buffer). */
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
typedef struct { void *p[CPU_SCRATCH_SLOTS + 1]; } tl_bufs;
static __thread tl_bufs tl_tab;
static void tl_free(void *arg) {
    tl_bufs *b = arg;
    for (int i = 0; i < CPU_SCRATCH_SLOTS + 1; i++) { free(b->p[i]); b->p[i] = NULL; }
}
static void tl_init(void) { pthread_key_create(&tl_key, tl_free); }
static void tl_register(void) {
    pthread_once(&tl_once, tl_init);
    tl_tab.p[0] = tl_row;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) tl_tab.p[i + 1] = tl_scr[i];
    pthread_setspecific(tl_key, &tl_tab);
}

/* two rows of n floats (row 1 at +stride16(n)) */
static float *row_buffer(int64_t n) {
    if (n > tl_cap) {
        free(tl_row);
        tl_row = aligned_alloc(64, (size_t)((n + 15) / 16 * 16) * 2 * sizeof(float));
        tl_cap = tl_row ? n : 0;
        tl_register();
    }
    return tl_row;
}

void *cpu_scratch(int slot, size_t bytes) {
    if (bytes > tl_scr_cap[slot]) {
        free(tl_scr[slot]);
        size_t n = (bytes + 4095) / 4096 * 4096;
        tl_scr[slot] = aligned_alloc(64, n);
        tl_scr_cap[slot] = tl_scr[slot] ? n : 0;
        tl_register();
    }
    return tl_scr[slot];
}

/* Called by a pool worker before it exits: release its buffers. */
void cpu_matmul_thread_exit(void) {
    free(tl_row);
    tl_row = NULL;
    tl_cap = 0;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) { free(tl_scr[i]); tl_scr[i] = NULL; tl_scr_cap[i] = 0; }
    pthread_once(&tl_once, tl_init);
    pthread_setspecific(tl_key, NULL);
}

typedef struct {
    const df_weight *w;
    const float *x;
    float *y;
    int T;
    cpu_decode_fn decode;
    cpu_dot_fn dot;
    cpu_matvec_fn matvec;
    cpu_dot4_fn dot4;
    cpu_dot4x2_fn dot4x2;
} mm_job;

static void mm_task(void *ctx, int64_t r0, int64_t r1, int tid) {
    const mm_job *j = ctx;
    const df_weight *w = j->w;
    if (j->T == 1 && j->matvec && j->matvec(w, j->x, j->y, r0, r1)) return;
    float *buf = row_buffer(w->cols);
    if (!buf) abort(); /* tiny allocation; nothing sensible to do without it */
    const int64_t cols = w->cols, rows = w->rows;
    int64_t r = r0;
    if (j->dot4x2 && j->T >= 4) { /* two rows x four tokens per pass (8 independent FMA chains) */
        float *buf1 = buf + (cols + 15) / 16 * 16;
        for (; r + 2 <= r1; r += 2) {
            j->decode(w, r, buf);
            j->decode(w, r + 1, buf1);
            int t = 0;
            for (; t + 4 <= j->T; t += 4) {
                float o[8];
                j->dot4x2(buf, buf1, j->x + (int64_t)t * cols, cols, cols, o);
                for (int k = 0; k < 4; k++) {
                    j->y[(int64_t)(t + k) * rows + r] = o[k];
                    j->y[(int64_t)(t + k) * rows + r + 1] = o[4 + k];
                }
            }
            for (; t < j->T; t++) {
                j->y[(int64_t)t * rows + r] = j->dot(buf, j->x + (int64_t)t * cols, cols);
                j->y[(int64_t)t * rows + r + 1] = j->dot(buf1, j->x + (int64_t)t * cols, cols);
            }
        }
    }
    for (; r < r1; r++) {
        j->decode(w, r, buf);
        int t = 0;
        if (j->dot4)
            for (; t + 4 <= j->T; t += 4) {
                float o[4];
                j->dot4(buf, j->x + (int64_t)t * w->cols, w->cols, w->cols, o);
                for (int k = 0; k < 4; k++) j->y[(int64_t)(t + k) * w->rows + r] = o[k];
            }
        for (; t < j->T; t++) j->y[(int64_t)t * w->rows + r] = j->dot(buf, j->x + (int64_t)t * w->cols, w->cols);
    }
}

void cpu_matmul_driver(df_pool *pool, const df_weight *w, const float *x, int T, float *y,
                       cpu_decode_fn decode, cpu_dot_fn dot, cpu_matvec_fn matvec, cpu_dot4_fn dot4,
                       cpu_dot4x2_fn dot4x2) {
    mm_job j = {w, x, y, T, decode, dot, matvec, dot4, dot4x2};
    /* grain: enough work per chunk to amortize dispatch (~64K weight elements), at least 1 row */
    int64_t per_row = w->cols * (T < 8 ? T : 8);
    int64_t grain = per_row > 0 ? (65536 + per_row - 1) / per_row : 1;
    int nt = df_pool_threads(pool);
    if ((int64_t)w->rows * w->cols * T < CPU_SERIAL_WORK) grain = w->rows; /* too small to be worth waking threads */
    else if (grain * nt > w->rows) grain = (w->rows + nt - 1) / nt;
    if (grain < 1) grain = 1;
    df_pool_run(pool, w->rows, grain, mm_task, &j);
}

int64_t cpu_chunk_rows(df_pool *pool, const df_weight *w, int T, int rb) {
    const int nt = df_pool_threads(pool);
    if (w->rows * w->cols * (int64_t)T < CPU_SERIAL_WORK || nt <= 1) return w->rows;
    const int64_t per_row = w->cols * (T < 8 ? T : 8);
    int64_t grain = (CPU_CHUNK_WORK + per_row - 1) / per_row;
    const int64_t fair = (w->rows + 8 * nt - 1) / (8 * nt);
    if (grain > fair) grain = fair;
    return (grain + rb - 1) / rb * rb;
}
