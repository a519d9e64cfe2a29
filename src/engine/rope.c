/*
 * rope.c — rotary position embedding for the MLA rope parts, with YaRN.
 * Follows transformers v5 (modeling_rope_utils._compute_yarn_parameters and
 * DeepseekV3Attention): inverse frequencies computed in fp32 like torch,
 * YaRN applied whenever the config asks for it (not only past the original
 * context), cos/sin multiplied by the attention factor, softmax scale
 * qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2. Interleaved pairs
 * (rope_interleave): see rope_apply. Notes: shared/notes/model-math.md.
 */
#include "engine.h"
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double find_correction_dim(double num_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (num_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

int rope_init(df_rope *r, const df_config *cfg, char *err, size_t errlen) {
    const int dim = cfg->qk_rope_head_dim, half = dim / 2;
    r->dim = dim;
    r->inv_freq = malloc(sizeof(float) * (size_t)(half > 0 ? half : 1));
    if (!r->inv_freq) {
        if (err) snprintf(err, errlen, "rope: out of memory");
        return DF_ENOMEM;
    }
    const float basef = (float)cfg->rope_theta;
    r->attention_factor = 1.0f;
    r->softmax_scale = 1.0 / sqrt((double)(cfg->qk_nope_head_dim + cfg->qk_rope_head_dim));
    /* pos_freqs = base ** (arange(0, dim, 2).float() / dim), all fp32 as in torch */
    for (int i = 0; i < half; i++) {
        float ex = (float)(2 * i) / (float)dim;
        r->inv_freq[i] = 1.0f / powf(basef, ex);
    }
    if (!cfg->rope_yarn || cfg->mla_use_nope) return DF_OK; /* no rotary: the scale stays (nope+rope)^-0.5 */

    double factor = cfg->rope_factor;
    const double orig = cfg->rope_original_max_pos > 0 ? cfg->rope_original_max_pos : cfg->max_position_embeddings;
    /* attention factor on cos/sin */
    if (cfg->rope_attention_factor > 0) r->attention_factor = (float)cfg->rope_attention_factor;
    else if (cfg->rope_mscale != 0 && cfg->rope_mscale_all_dim != 0)
        r->attention_factor = (float)(yarn_get_mscale(factor, cfg->rope_mscale) /
                                      yarn_get_mscale(factor, cfg->rope_mscale_all_dim));
    else r->attention_factor = (float)yarn_get_mscale(factor, 1.0);

    double beta_fast = cfg->rope_beta_fast != 0 ? cfg->rope_beta_fast : 32.0;
    double beta_slow = cfg->rope_beta_slow != 0 ? cfg->rope_beta_slow : 1.0;
    double low = find_correction_dim(beta_fast, dim, cfg->rope_theta, orig);
    double high = find_correction_dim(beta_slow, dim, cfg->rope_theta, orig);
    if (cfg->rope_truncate) { low = floor(low); high = ceil(high); }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int i = 0; i < half; i++) {
        float pos_freq = powf(basef, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq;
        float interp = 1.0f / ((float)factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float ef = 1.0f - ramp; /* inv_freq_extrapolation_factor */
        r->inv_freq[i] = interp * (1.0f - ef) + extra * ef;
    }
    /* DeepseekV3Attention: scaling *= mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set */
    if (cfg->rope_mscale_all_dim != 0) {
        double m = yarn_get_mscale(cfg->rope_factor, cfg->rope_mscale_all_dim);
        r->softmax_scale *= m * m;
    }
    return DF_OK;
}

void rope_free(df_rope *r) {
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void rope_cs(const df_rope *r, int64_t pos, float *cs) {
    for (int i = 0; i < r->dim / 2; i++) {
        float f = r->inv_freq[i] * (float)pos; /* fp32 product, as torch */
        cs[2 * i] = cosf(f) * r->attention_factor;
        cs[2 * i + 1] = sinf(f) * r->attention_factor;
    }
}

void rope_apply(const df_rope *r, float *x, int64_t pos) {
    const int half = r->dim / 2;
    float tmp[half > 0 ? 2 * half : 1], cs[half > 0 ? 2 * half : 1];
    rope_cs(r, pos, cs);
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        float a = x[2 * i], b = x[2 * i + 1];
        tmp[i] = a * c - b * s;
        tmp[i + half] = b * c + a * s;
    }
    for (int i = 0; i < 2 * half; i++) x[i] = tmp[i];
}
