/*
 * cuda_trace.c — DF_CUDA_TRACE=1 or 2 (a developer knob, docs/cuda.md): the wall time of every GPU call the engine
 * makes through the cuda backend table (matmul, mlp, mlp_group, mla_project, mla_attend, mla_attend_o, mla_block,
 * moe_resid, kda_recur, kda_block), from the call to its return (each but moe_resid ends with a synchronisation, so this is the device
 * work plus the launches, copies and the synchronisation itself); its host time split into queueing (from taking the runtime's mutex to
 * calling the closing synchronisation: staging, launches) and waiting inside that synchronisation
 * (df_cuda_last_host_split); and with DF_CUDA_TRACE=1 its device time (df_cuda_last_gpu_s: events from the start of
 * its stream work to its closing synchronisation, and per stage). Printed per operation as a table on stderr at
 * exit. DF_CUDA_TRACE=2 records no device events, so the calls run as they do untraced: a queue time near the
 * call's time means the GPU waits for the host. Comparing a call's mean with its kernels' time (bench kernels
 * --backend cuda) gives the per-call overhead a layer-resident forward removes.
 * Timing only: the calls and their results are unchanged.
 */
#ifdef DF_HAVE_CUDA
#include "kernels/backend.h"
#include "kernels/cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TR_MATMUL, TR_MLP, TR_GROUP, TR_PROJECT, TR_ATTEND, TR_ATTEND_O, TR_BLOCK, TR_RESID, TR_KDA, TR_KDA_BLOCK, TR_N };
static const char *const tr_name[TR_N] = {"matmul",   "mlp",       "mlp_group", "mla_project", "mla_attend",
                                          "mla_attend_o", "mla_block", "moe_resid", "kda_recur", "kda_block"};
static struct {
    unsigned long long calls, rows, items, gpu_calls, host_calls;
    double s, gpu_s, queue_s, wait_s;
} g_tr[TR_N];
static pthread_mutex_t g_tr_mu = PTHREAD_MUTEX_INITIALIZER;
static df_backend g_orig;

static double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void tr_add(int op, double t0, long rows, int items) {
    const double dt = tr_now() - t0, g = df_cuda_last_gpu_s();
    double q = 0, w = 0;
    const int hs = df_cuda_last_host_split(&q, &w) == 0;
    pthread_mutex_lock(&g_tr_mu);
    if (g >= 0) {
        g_tr[op].gpu_calls++;
        g_tr[op].gpu_s += g;
    }
    if (hs) {
        g_tr[op].host_calls++;
        g_tr[op].queue_s += q;
        g_tr[op].wait_s += w;
    }
    g_tr[op].calls++;
    g_tr[op].rows += (unsigned long long)(rows > 0 ? rows : 0);
    g_tr[op].items += (unsigned long long)items;
    g_tr[op].s += dt;
    pthread_mutex_unlock(&g_tr_mu);
}

static void tr_print(void) {
    fprintf(stderr, "cuda trace: op             calls     total ms    mean us  device us   queue us    wait us   rows/call  "
                    "items/call\n");
    for (int i = 0; i < TR_N; i++)
        if (g_tr[i].calls)
            fprintf(stderr, "cuda trace: %-12s %9llu %12.3f %10.1f %10.1f %10.1f %10.1f %11.1f %11.1f\n", tr_name[i],
                    g_tr[i].calls, g_tr[i].s * 1e3, g_tr[i].s * 1e6 / g_tr[i].calls,
                    g_tr[i].gpu_calls ? g_tr[i].gpu_s * 1e6 / g_tr[i].gpu_calls : -1.0,
                    g_tr[i].host_calls ? g_tr[i].queue_s * 1e6 / g_tr[i].host_calls : -1.0,
                    g_tr[i].host_calls ? g_tr[i].wait_s * 1e6 / g_tr[i].host_calls : -1.0,
                    (double)g_tr[i].rows / g_tr[i].calls, (double)g_tr[i].items / g_tr[i].calls);
    df_cuda_trace_stages();
}

static void tr_matmul(df_pool *pool, const df_weight *w, const float *x, int T, float *y) {
    const double t0 = tr_now();
    g_orig.matmul(pool, w, x, T, y);
    tr_add(TR_MATMUL, t0, T, 1);
}
static int tr_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
                  const float *x, int T, float *out) {
    const double t0 = tr_now();
    const int rc = g_orig.mlp(gate, up, down, act, beta, lb, x, T, out);
    tr_add(TR_MLP, t0, T, 1);
    return rc;
}
static int tr_group(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down, int act,
                    float beta, float lb, const float *const *x, const int *T, float *const *out) {
    const double t0 = tr_now();
    const int rc = g_orig.mlp_group(n, gate, up, down, act, beta, lb, x, T, out);
    long rows = 0;
    for (int i = 0; i < n; i++) rows += T[i] > 0 ? T[i] : 0;
    tr_add(TR_GROUP, t0, rows, n);
    return rc;
}
static int tr_project(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b, const df_weight *q_proj,
                      const df_weight *kv_a, const float *h, int T, float *q, float *kva) {
    const double t0 = tr_now();
    const int rc = g_orig.mla_project(q_a, q_a_norm, eps, q_b, q_proj, kv_a, h, T, q, kva);
    tr_add(TR_PROJECT, t0, T, 1);
    return rc;
}
static int tr_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                     const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key, float *o_v) {
    const double t0 = tr_now();
    const int rc = g_orig.mla_attend(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, o_v);
    tr_add(TR_ATTEND, t0, T, 1);
    return rc;
}
static int tr_attend_o(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                       const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                       const df_weight *o, float *out) {
    const double t0 = tr_now();
    const int rc = g_orig.mla_attend_o(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, o, out);
    tr_add(TR_ATTEND_O, t0, T, 1);
    return rc;
}

static int tr_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c, float *const *kpe,
                    const int *npos, const uint64_t *seq_key, float *x_out, float *h2, float *logits) {
    const double t0 = tr_now();
    const int rc = g_orig.mla_block(b, T, x, cs, c, kpe, npos, seq_key, x_out, h2, logits);
    tr_add(TR_BLOCK, t0, T, 1);
    return rc;
}

static int tr_resid(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down, int act,
                    float beta, float lb, const float *x, const float *w, int shared, uint64_t resid_key) {
    const double t0 = tr_now();
    const int rc = g_orig.moe_resid(n, gate, up, down, act, beta, lb, x, w, shared, resid_key);
    tr_add(TR_RESID, t0, 1, n);
    return rc;
}

static int tr_kda(const df_kda_args *a) {
    const double t0 = tr_now();
    const int rc = g_orig.kda_recur(a);
    tr_add(TR_KDA, t0, a->T, 1);
    return rc;
}

static int tr_kda_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                        float *const *conv, float *const *S, float *out, unsigned char *kept) {
    const double t0 = tr_now();
    const int rc = g_orig.kda_block(b, n_seq, Ts, h, key, conv, S, out, kept);
    long rows = 0;
    for (int i = 0; i < n_seq; i++) rows += Ts[i];
    tr_add(TR_KDA_BLOCK, t0, rows, n_seq);
    return rc;
}

void df_cuda_trace_wrap(df_backend *be) {
    g_orig = *be;
    be->matmul = tr_matmul;
    if (be->mlp) be->mlp = tr_mlp;
    if (be->mlp_group) be->mlp_group = tr_group;
    if (be->mla_project) be->mla_project = tr_project;
    if (be->mla_attend) be->mla_attend = tr_attend;
    if (be->mla_attend_o) be->mla_attend_o = tr_attend_o;
    if (be->mla_block) be->mla_block = tr_block;
    if (be->moe_resid) be->moe_resid = tr_resid;
    if (be->kda_recur) be->kda_recur = tr_kda;
    if (be->kda_block) be->kda_block = tr_kda_block;
    atexit(tr_print);
}
#endif
