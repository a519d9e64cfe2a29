/* api.c — public API: model, session, eval, sampling, stats (stubs until the engine lands). */
#include "deltafin.h"
#include <stdio.h>
#include <string.h>

static int stub(char *err, size_t errlen, const char *fn) {
    if (err && errlen) snprintf(err, errlen, "%s: not implemented yet", fn);
    return DF_EUNSUPPORTED;
}
void df_model_opts_default(df_model_opts *o) { memset(o, 0, sizeof *o); }
int df_model_open(df_model **out, const char *path, const df_model_opts *opts, char *err, size_t errlen) {
    *out = NULL; return stub(err, errlen, "df_model_open");
}
void df_model_close(df_model *m) {}
const char *df_model_describe(const df_model *m) { return ""; }
const char *df_model_name(const df_model *m) { return ""; }
int df_model_n_vocab(const df_model *m) { return 0; }
int df_model_n_ctx_max(const df_model *m) { return 0; }
int df_model_is_exact(const df_model *m) { return 1; }
const df_tokenizer *df_model_tokenizer(const df_model *m) { return NULL; }
int df_model_verify(df_model *m, df_progress_fn p, void *u, char *err, size_t errlen) { return stub(err, errlen, "df_model_verify"); }
int df_session_new(df_session **out, df_model *m, int n_ctx, char *err, size_t errlen) { *out = NULL; return stub(err, errlen, "df_session_new"); }
void df_session_free(df_session *s) {}
int df_session_n_past(const df_session *s) { return 0; }
const int32_t *df_session_tokens(const df_session *s) { return NULL; }
int df_session_truncate(df_session *s, int n_keep) { return DF_EUNSUPPORTED; }
int df_eval(df_session *s, const int32_t *ids, int n, float *logits, int flags, df_progress_fn p, void *u, char *err, size_t errlen) { return stub(err, errlen, "df_eval"); }
void df_sampler_opts_default(df_sampler_opts *o) { memset(o, 0, sizeof *o); o->top_p = 1.0f; }
df_sampler *df_sampler_new(const df_sampler_opts *o) { return NULL; }
void df_sampler_free(df_sampler *s) {}
int32_t df_sample(df_sampler *s, const float *logits, int n_vocab) { return 0; }
float df_logprob(const float *logits, int n_vocab, int32_t id, int top_n, int32_t *ti, float *tl) { return 0; }
void df_model_stats(const df_model *m, df_stats *out) { memset(out, 0, sizeof *out); }
void df_model_stats_reset(df_model *m) {}
