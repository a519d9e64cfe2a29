/*
 * cuda_none.c — kernels/cuda.h in a build without the CUDA backend (DF_CUDA=OFF
 * or no nvcc): no device, every GPU entry point fails with that reason.
 */
#ifndef DF_HAVE_CUDA
#include "kernels/cuda.h"

#include <stdio.h>
#include <string.h>

static const char *const why_none = "this build has no CUDA backend (configure with -DDF_CUDA=ON where nvcc is installed)";

int df_cuda_probe(char *why, size_t whylen) {
    if (why && whylen) snprintf(why, whylen, "%s", why_none);
    return 0;
}
const df_backend *df_cuda_backend(void) { return NULL; }
void df_cuda_describe(char *buf, size_t len) { if (len) buf[0] = 0; }
void df_cuda_set_expert_budget(uint64_t bytes) { (void)bytes; }
void df_cuda_set_cache_by_address(int on) { (void)on; }
void df_cuda_cache_clear(void) {}
void df_cuda_cache_drop_model(int tag) { (void)tag; }
int df_cuda_preload(const df_weight *w) { return -1; }
int df_cuda_dev_load(const df_weight *w) { (void)w; return -1; }
double df_cuda_last_gpu_s(void) { return -1; }
void df_cuda_trace_stages(void) {}
uint64_t df_cuda_preload_spine(const df_spine *sp, int n_layers, int *all) { *all = 0; return 0; }
void df_cuda_set_matvec_rows(int n) { (void)n; }
void df_cuda_set_tile(int n) { (void)n; }
void df_cuda_set_split(int on) { (void)on; }
int df_cuda_pin(uint64_t dev_key, df_weight *w) { return 0; }
void df_cuda_unpin(uint64_t dev_key) {}
int df_cuda_has(uint64_t dev_key) { (void)dev_key; return 0; }
int df_cuda_host_pin(void *p, size_t n) { (void)p; (void)n; return -1; }
void df_cuda_host_unpin(void *p) { (void)p; }
void df_cuda_get_stats(df_cuda_stats *out) { memset(out, 0, sizeof *out); }
const char *df_cuda_last_error(void) { return why_none; }
int df_cuda_kda_recur(const df_kda_args *a) { (void)a; return -1; }
int df_cuda_kda_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                      float *const *conv, float *const *S, float *out, unsigned char *kept) {
    (void)b; (void)n_seq; (void)Ts; (void)h; (void)key; (void)conv; (void)S; (void)out; (void)kept;
    return -1;
}
int df_cuda_kda_state(uint64_t key, float *conv, float *S, int op) { (void)key; (void)conv; (void)S; (void)op; return -1; }
void df_cuda_kda_copies(int *n, uint64_t *bytes) { *n = 0; *bytes = 0; }
int df_cuda_matmul(const df_weight *w, const float *x, int T, float *y) { return -1; }
int df_cuda_matmul2(const df_weight *a, const df_weight *b, const float *x, float *ya, float *yb) { return -1; }
int df_cuda_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
                const float *x, int T, float *out) { return -1; }
int df_cuda_mlp_group(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                      int act, float beta, float lb, const float *const *x, const int *T, float *const *out) {
    (void)n; (void)gate; (void)up; (void)down; (void)act; (void)beta; (void)lb; (void)x; (void)T; (void)out;
    return -1;
}
int df_cuda_mla_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                       const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                       float *o_v) {
    (void)kv_b; (void)T; (void)H; (void)dn; (void)dr; (void)dv; (void)kvl; (void)scale; (void)q; (void)c; (void)kpe;
    (void)npos; (void)seq_key; (void)o_v;
    return -1;
}
void df_cuda_seq_forget(uint64_t uid) { (void)uid; }
int df_cuda_mla_attend_o(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                         const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                         const df_weight *o, float *out) {
    (void)kv_b; (void)T; (void)H; (void)dn; (void)dr; (void)dv; (void)kvl; (void)scale; (void)q; (void)c; (void)kpe;
    (void)npos; (void)seq_key; (void)o; (void)out;
    return -1;
}
int df_cuda_mla_project(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b,
                        const df_weight *q_proj, const df_weight *kv_a, const float *h, int T, float *q, float *kva) {
    (void)q_a; (void)q_a_norm; (void)eps; (void)q_b; (void)q_proj; (void)kv_a; (void)h; (void)T; (void)q; (void)kva;
    return -1;
}
int df_cuda_mla_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c, float *const *kpe,
                      const int *npos, const uint64_t *seq_key, float *x_out, float *h2, float *logits) {
    (void)b; (void)T; (void)x; (void)cs; (void)c; (void)kpe; (void)npos; (void)seq_key; (void)x_out; (void)h2; (void)logits;
    return -1;
}
int df_cuda_last_host_split(double *queue, double *wait) { (void)queue; (void)wait; return -1; }
int df_cuda_moe_resid(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                      int act, float beta, float lb, const float *x, const float *w, int shared, uint64_t resid_key) {
    (void)n; (void)gate; (void)up; (void)down; (void)act; (void)beta; (void)lb; (void)x; (void)w; (void)shared;
    (void)resid_key;
    return -1;
}
int df_cuda_rmsnorm(float *out, const float *x, const float *w, int T, int64_t n, float eps) { return -1; }
int df_cuda_silu_mul(float *out, const float *g, const float *u, int64_t n) { return -1; }
int df_cuda_situ_mul(float *out, const float *g, const float *u, int64_t n, float beta, float lb) { return -1; }
int df_cuda_softmax(float *x, int T, int64_t n) { return -1; }
int df_cuda_rope(float *x, int T, int dim, const float *inv_freq, float attention_factor, const int64_t *pos) { return -1; }
double df_cuda_bench_matmul(df_wtype t, int64_t rows, int64_t cols, int T, int iters) { return -1; }
double df_cuda_bench_group(df_wtype t, int64_t rows, int64_t cols, int T, int n, int iters) { return -1; }
double df_cuda_bench_bandwidth(void) { return -1; }
void df_cuda_fp32_peak(double *flops, int *sms, int *mhz) { *flops = 0; *sms = 0; *mhz = 0; }
int df_cuda_moe_routed(uint64_t resid_key, int layer, int *ids) {
    (void)resid_key; (void)layer; (void)ids;
    return 0;
}
int df_cuda_route_test(const float *logits, const float *bias, int E, int K, int n_group, int topk_group, int renorm,
                       float scale, int *ids, float *weights) {
    (void)logits; (void)bias; (void)E; (void)K; (void)n_group; (void)topk_group; (void)renorm; (void)scale; (void)ids;
    (void)weights;
    return -1;
}
int df_cuda_final_logits(const float *x, int n, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head,
                         float *logits) {
    (void)x; (void)n; (void)resid_key; (void)norm; (void)eps; (void)lm_head; (void)logits;
    return -1;
}
int df_cuda_final_argmax(const float *x, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head,
                         int slot) {
    (void)x; (void)resid_key; (void)norm; (void)eps; (void)lm_head; (void)slot;
    return -1;
}
int df_cuda_token_wait(int slot, int32_t *id) {
    (void)slot; (void)id;
    return -1;
}
int df_cuda_embed_dev(uint64_t resid_key, const df_weight *embed) {
    (void)resid_key; (void)embed;
    return -1;
}
#endif
