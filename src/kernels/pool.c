/*
 * pool.c — a small pthread pool shared by the kernels: df_pool_run splits an
 * index range into chunks that the workers and the calling thread take from an
 * atomic counter. One job runs at a time per pool (callers are serialized).
 *
 * Waking: a job is published by bumping an atomic generation. Idle workers
 * spin briefly on it (a decode step issues thousands of small jobs, and a
 * futex wake-up costs tens of microseconds), then sleep on a condition
 * variable; the publisher always broadcasts under the mutex, so no wake-up
 * is lost. Completion is counted down in `busy`; the last worker signals.
 * Spinning yields the CPU every SPIN_YIELD polls, so on an oversubscribed machine
 * (other processes, or more threads than the CPUs this process may use) a spinning
 * thread does not steal the time slice of the thread that has the work.
 * The default thread count is the CPUs in this process's affinity mask (taskset,
 * cpusets), not every online CPU.
 */
#define _GNU_SOURCE
#include "backend.h"
#include "cpu/cpu_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_SPIN 4000 /* polls (~10-40 us) before a worker sleeps */
#define SPIN_YIELD 64  /* sched_yield() every this many polls */

struct df_pool {
    int n_threads;                  /* including the caller */
    pthread_t *workers;             /* [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    pthread_mutex_t run_mu;         /* serializes df_pool_run callers */
    atomic_ullong generation;
    atomic_int stop;
    atomic_int busy;                /* workers still inside the current job */
    /* current job (written before generation is bumped) */
    df_task_fn fn;
    void *ctx;
    int64_t n, grain;
    atomic_llong next;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void pool_work(df_pool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->grain);
        if (b >= p->n) break;
        int64_t e = b + p->grain < p->n ? b + p->grain : p->n;
        p->fn(p->ctx, b, e, tid);
    }
}

typedef struct { df_pool *p; int tid; } worker_arg;

static void *pool_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    df_pool *p = wa.p;
    unsigned long long seen = 0;
    for (;;) {
        unsigned long long g = atomic_load(&p->generation);
        for (int s = 0; g == seen && !atomic_load(&p->stop) && s < POOL_SPIN; s++) {
            if (s % SPIN_YIELD == SPIN_YIELD - 1) sched_yield();
            else cpu_relax();
            g = atomic_load(&p->generation);
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        pool_work(p, wa.tid);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    cpu_matmul_thread_exit();
    return NULL;
}

/* CPUs this process may run on (affinity mask), else the online CPUs. */
static int usable_cpus(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

df_pool *df_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = usable_cpus();
    df_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) { free(p); return NULL; }
        for (int i = 0; i < n_threads - 1; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) { wa->p = p; wa->tid = i + 1; }
            if (!wa || pthread_create(&p->workers[i], NULL, pool_main, wa) != 0) {
                free(wa);
                p->n_threads = i + 1; /* run with what we have */
                break;
            }
        }
    }
    return p;
}

void df_pool_free(df_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int df_pool_threads(const df_pool *p) { return p ? p->n_threads : 1; }

void df_pool_run(df_pool *p, int64_t n, int64_t grain, df_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1); /* publish (seq_cst: the job fields are visible first) */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, 0);
    for (int s = 0; atomic_load(&p->busy) > 0 && s < POOL_SPIN; s++) {
        if (s % SPIN_YIELD == SPIN_YIELD - 1) sched_yield();
        else cpu_relax();
    }
    if (atomic_load(&p->busy) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_mu);
}
