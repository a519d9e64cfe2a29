/* test_convert.c — df_convert round trips on tiny hand-written HF checkpoints
 * (bf16 sharded; DeepSeek-V3 fp8 block; Kimi-K2-Thinking int4 experts; MXFP4
 * experts): every expert extent holds the source bytes bit for bit, checksums
 * verify, a corrupted pack byte and a truncated pack are detected, spine modes
 * (source / bf16 / int8) encode as documented, striping over two directories,
 * cleanup of temporary files on errors and cancellation, convert_cached reuse,
 * and every golden checkpoint under tests/golden converts. */
#include "test_util.h"
#include "test_model_stwrite.h"

#include "deltafin.h"
#include "model/convert.h"
#include "model/native.h"
#include "model/spine.h"
#include "model/weights_util.h"
#include "util/util.h"

#include <dirent.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { ENC_BF16, ENC_FP8, ENC_INT4, ENC_MXFP4 };

/* tiny DeepSeek-V3 shape */
#define H 64
#define NL 3
#define NH 2
#define QL 32
#define KVL 32
#define NOPE 16
#define ROPE 8
#define VD 16
#define VOC 96
#define INTER 96
#define MI 32
#define NE 4

static char tmpdir[256];

static void add_linear(stw *w, const char *base, int64_t r, int64_t c, int enc, int pow2_scales) {
    char nm[256];
    if (enc == ENC_BF16) {
        snprintf(nm, sizeof nm, "%s.weight", base);
        stw_add_bf16(w, nm, 2, r, c, 0.5f);
    } else if (enc == ENC_FP8) {
        int64_t sh[2] = {r, c}, ssh[2] = {(r + 127) / 128, (c + 127) / 128};
        snprintf(nm, sizeof nm, "%s.weight", base);
        uint8_t *q = stw_add(w, nm, "F8_E4M3", 2, sh, NULL);
        for (int64_t i = 0; i < r * c; i++) {
            q[i] = (uint8_t)(stw_rand() & 0xFF);
            if ((q[i] & 0x7F) == 0x7F) q[i] ^= 1; /* no NaN */
        }
        snprintf(nm, sizeof nm, "%s.weight_scale_inv", base);
        float *s = stw_add(w, nm, "F32", 2, ssh, NULL);
        for (int64_t i = 0; i < ssh[0] * ssh[1]; i++) s[i] = pow2_scales ? ldexpf(1, -6 - (int)(stw_rand() % 3)) : 0.001f + 0.01f * (float)(stw_rand() % 100) / 100.0f;
    } else if (enc == ENC_INT4) {
        int64_t sh[2] = {r, c / 8}, ssh[2] = {r, c / 32}, shs[1] = {2};
        snprintf(nm, sizeof nm, "%s.weight_packed", base);
        uint32_t *q = stw_add(w, nm, "I32", 2, sh, NULL);
        for (int64_t i = 0; i < r * c / 8; i++) q[i] = stw_rand() ^ (stw_rand() << 16);
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        uint16_t *s = stw_add(w, nm, "BF16", 2, ssh, NULL);
        for (int64_t i = 0; i < r * c / 32; i++) s[i] = stw_bf16(0.01f + 0.001f * (float)(stw_rand() % 50));
        snprintf(nm, sizeof nm, "%s.weight_shape", base);
        int32_t v[2] = {(int32_t)r, (int32_t)c};
        stw_add(w, nm, "I32", 1, shs, v);
    } else {
        int64_t sh[2] = {r, c / 2}, ssh[2] = {r, c / 32};
        snprintf(nm, sizeof nm, "%s.weight_packed", base);
        uint8_t *q = stw_add(w, nm, "U8", 2, sh, NULL);
        for (int64_t i = 0; i < r * c / 2; i++) q[i] = (uint8_t)stw_rand();
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        uint8_t *s = stw_add(w, nm, "U8", 2, ssh, NULL);
        for (int64_t i = 0; i < r * c / 32; i++) s[i] = (uint8_t)(120 + stw_rand() % 8);
    }
}

static void add_vec(stw *w, const char *name, int64_t n, int f32) {
    int64_t sh[1] = {n};
    if (f32) {
        float *d = stw_add(w, name, "F32", 1, sh, NULL);
        for (int64_t i = 0; i < n; i++) d[i] = stw_randf(0.5f);
    } else {
        stw_add_bf16(w, name, 1, n, 1, 0);
    }
}

/* Writes config.json + safetensors (2 shards + index when sharded) into dir; the
 * tensors stay in *w for comparison. spine_enc: ENC_BF16 or ENC_FP8. */
static int build_ckpt(const char *dir, stw *w, int spine_enc, int expert_enc, int sharded, int pow2, int mtp) {
    char p[700], nm[256], err[256];
    if (df_mkdir_p(dir, err, sizeof err)) return -1;
    const char *quant = "";
    if (spine_enc == ENC_FP8 || expert_enc == ENC_FP8)
        quant = ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128]}";
    else if (expert_enc == ENC_INT4)
        quant = ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":{"
                "\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"group_size\":32,\"strategy\":\"group\"}}},"
                "\"ignore\":[\"lm_head\",\"re:.*self_attn.*\",\"re:.*shared_experts.*\",\"re:.*mlp\\\\.(gate|up|down)_proj.*\"]}";
    else if (expert_enc == ENC_MXFP4)
        quant = ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"mxfp4-pack-quantized\",\"config_groups\":{\"group_0\":{"
                "\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":32}}},\"ignore\":[\"lm_head\"]}";
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\",\"vocab_size\":%d,\"hidden_size\":%d,"
             "\"intermediate_size\":%d,\"moe_intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,\"n_routed_experts\":%d,\"n_shared_experts\":1,\"num_experts_per_tok\":2,\"n_group\":2,"
             "\"topk_group\":1,\"first_k_dense_replace\":1,\"norm_topk_prob\":true,\"routed_scaling_factor\":2.5,\"q_lora_rank\":%d,"
             "\"kv_lora_rank\":%d,\"qk_nope_head_dim\":%d,\"qk_rope_head_dim\":%d,\"v_head_dim\":%d,\"rms_norm_eps\":1e-06,"
             "\"max_position_embeddings\":256,\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000.0,\"factor\":4.0,"
             "\"original_max_position_embeddings\":64,\"beta_fast\":32,\"beta_slow\":1,\"mscale\":1.0,\"mscale_all_dim\":1.0},"
             "\"tie_word_embeddings\":false,\"bos_token_id\":0,\"eos_token_id\":1%s}",
             VOC, H, INTER, MI, NL, NH, NH, NE, QL, KVL, NOPE, ROPE, VD, quant);
    snprintf(p, sizeof p, "%s/config.json", dir);
    stw_write_text(p, cfg);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    stw_write_text(p, "{\"model\":{\"type\":\"BPE\"}}");

    stw_add_bf16(w, "model.embed_tokens.weight", 2, VOC, H, 1.0f);
    add_vec(w, "model.norm.weight", H, 0);
    add_linear(w, "lm_head", VOC, H, ENC_BF16, 0);
    int nlayers = NL + (mtp ? 1 : 0);
    for (int l = 0; l < nlayers; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        add_vec(w, N("input_layernorm.weight"), H, 0);
        add_vec(w, N("post_attention_layernorm.weight"), H, 0);
        add_linear(w, N("self_attn.q_a_proj"), QL, H, spine_enc, pow2);
        add_vec(w, N("self_attn.q_a_layernorm.weight"), QL, 0);
        add_linear(w, N("self_attn.q_b_proj"), NH * (NOPE + ROPE), QL, spine_enc, pow2);
        add_linear(w, N("self_attn.kv_a_proj_with_mqa"), KVL + ROPE, H, spine_enc, pow2);
        add_vec(w, N("self_attn.kv_a_layernorm.weight"), KVL, 0);
        add_linear(w, N("self_attn.kv_b_proj"), NH * (NOPE + VD), KVL, spine_enc, pow2);
        add_linear(w, N("self_attn.o_proj"), H, NH * VD, spine_enc, pow2);
        if (l == 0) {
            add_linear(w, N("mlp.gate_proj"), INTER, H, spine_enc, pow2);
            add_linear(w, N("mlp.up_proj"), INTER, H, spine_enc, pow2);
            add_linear(w, N("mlp.down_proj"), H, INTER, spine_enc, pow2);
        } else {
            add_linear(w, N("mlp.gate"), NE, H, ENC_BF16, 0);
            add_vec(w, N("mlp.gate.e_score_correction_bias"), NE, 1);
            add_linear(w, N("mlp.shared_experts.gate_proj"), MI, H, spine_enc, pow2);
            add_linear(w, N("mlp.shared_experts.up_proj"), MI, H, spine_enc, pow2);
            add_linear(w, N("mlp.shared_experts.down_proj"), H, MI, spine_enc, pow2);
            for (int e = 0; e < NE; e++) {
                char b[200];
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.gate_proj", l, e);
                add_linear(w, b, MI, H, expert_enc, pow2);
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.up_proj", l, e);
                add_linear(w, b, MI, H, expert_enc, pow2);
                snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.down_proj", l, e);
                add_linear(w, b, H, MI, expert_enc, pow2);
            }
        }
#undef N
    }
    if (!sharded) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        return stw_write_range(w, 0, w->n, p);
    }
    int half = w->n / 2;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    if (stw_write_range(w, 0, half, p)) return -1;
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    if (stw_write_range(w, half, w->n, p)) return -1;
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    cJSON_AddObjectToObject(idx, "metadata");
    for (int i = 0; i < w->n; i++)
        cJSON_AddStringToObject(wm, w->e[i].name, i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    char *txt = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    stw_write_text(p, txt);
    free(txt);
    cJSON_Delete(idx);
    return 0;
}

static int count_tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L > 4 && !strcmp(de->d_name + L - 4, ".tmp")) n++;
    }
    closedir(d);
    return n;
}

/* main tensor / scale tensor of a source linear */
static void src_parts(const stw *w, const char *base, const stw_entry **data, const stw_entry **scale) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.weight", base);
    *data = stw_get(w, nm);
    *scale = NULL;
    if (*data) {
        snprintf(nm, sizeof nm, "%s.weight_scale_inv", base);
        *scale = stw_get(w, nm);
        return;
    }
    snprintf(nm, sizeof nm, "%s.weight_packed", base);
    *data = stw_get(w, nm);
    snprintf(nm, sizeof nm, "%s.weight_scale", base);
    *scale = stw_get(w, nm);
}

/* Every expert extent of a converted model equals the source bytes; checksums verify. */
static void check_experts(const df_native *n, const stw *w, const char *what) {
    int bad = 0, badsum = 0;
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int l = 1; l < NL; l++) {
        uint64_t bb = native_extent_buf_bytes(n, l);
        uint8_t *buf = malloc(bb);
        char err[512];
        for (int e = 0; e < NE; e++) {
            if (native_read_expert(n, l, e, buf, err, sizeof err)) { bad++; continue; }
            if (native_verify_expert(n, l, e, buf, err, sizeof err)) badsum++;
            for (int p = 0; p < 3; p++) {
                char base[200];
                snprintf(base, sizeof base, "model.layers.%d.mlp.experts.%d.%s", l, e, pn[p]);
                const stw_entry *d, *s;
                src_parts(w, base, &d, &s);
                const native_expert_part *P = &n->parts[p];
                if (!d || P->bytes != d->nbytes || memcmp(buf + P->offset, d->data, d->nbytes)) bad++;
                if (s && (P->scale_bytes != s->nbytes || memcmp(buf + P->scale_offset, s->data, s->nbytes))) bad++;
                if (!s && P->scale_bytes) bad++;
            }
            /* padding after the extent is zero */
            for (uint64_t i = n->extent_bytes; i < n->stride; i++)
                if (buf[i]) { bad++; break; }
            df_expert ex;
            native_expert_views(n, buf, &ex);
            if (ex.gate.rows != MI || ex.down.rows != H || ex.up.data != buf + n->parts[1].offset) bad++;
        }
        free(buf);
    }
    CHECK(bad == 0, "%s: %d expert extents differ from the source bytes", what, bad);
    CHECK(badsum == 0, "%s: %d expert checksums fail", what, badsum);
}

static void *load_spine(const df_native *n) {
    char *buf;
    size_t len;
    char err[256];
    if (df_read_file(n->spine_path, &buf, &len, err, sizeof err)) return NULL;
    /* df_read_file's buffer is malloc'd (16-byte aligned); kernels may need more: copy into 64-byte aligned memory */
    void *a = df_aligned_alloc(64, len);
    memcpy(a, buf, len);
    free(buf);
    return a;
}

static void test_roundtrip(int spine_enc, int expert_enc, int sharded, const char *label) {
    char hf[512], out[600], err[1024];
    snprintf(hf, sizeof hf, "%s/hf_%s", tmpdir, label);
    snprintf(out, sizeof out, "%s/native_%s", tmpdir, label);
    static stw w;
    w.n = 0;
    CHECK(build_ckpt(hf, &w, spine_enc, expert_enc, sharded, 0, 1) == 0, "%s: build", label);
    df_convert_opts o;
    df_convert_opts_default(&o);
    o.threads = 2;
    int rc = df_convert(hf, out, &o, err, sizeof err);
    CHECK(rc == 0, "%s: convert: %s", label, err);
    if (rc) { stw_free(&w); return; }
    df_native *n;
    rc = native_open(&n, out, err, sizeof err);
    CHECK(rc == 0, "%s: native_open: %s", label, err);
    if (rc) { stw_free(&w); return; }
    static const df_wtype want[4] = {DF_W_BF16, DF_W_FP8_B128, DF_W_INT4_G32, DF_W_MXFP4};
    CHECK(n->expert_type == want[expert_enc] && n->n_experts == NE && n->n_moe_layers == NL - 1 && n->stride % 4096 == 0,
          "%s: expert table (%s)", label, df_wtype_name(n->expert_type));
    CHECK(n->exact == 1 && !strcmp(n->spine_mode, "source") && n->cfg.hidden_size == H && n->cfg.rope_yarn, "%s: manifest header", label);
    CHECK(!native_find(n, "model.layers.3.input_layernorm.weight"), "%s: MTP layer tensors skipped", label);
    check_experts(n, &w, label);
    /* spine: views and exact bytes */
    void *sb = load_spine(n);
    df_spine sp;
    rc = spine_build(n, sb, &sp, err, sizeof err);
    CHECK(rc == 0, "%s: spine_build: %s", label, err);
    if (!rc) {
        const stw_entry *emb = stw_get(&w, "model.embed_tokens.weight");
        CHECK(sp.embed.type == DF_W_BF16 && !memcmp(sp.embed.data, emb->data, emb->nbytes), "%s: embed bytes", label);
        const stw_entry *nrm = stw_get(&w, "model.layers.1.input_layernorm.weight");
        CHECK(sp.layers[1].attn_norm[5] == df_bf16_to_f32(((uint16_t *)nrm->data)[5]), "%s: norm to f32", label);
        const stw_entry *bias = stw_get(&w, "model.layers.2.mlp.gate.e_score_correction_bias");
        CHECK(sp.layers[2].router_bias && sp.layers[2].router_bias[3] == ((float *)bias->data)[3], "%s: router bias", label);
        CHECK(sp.layers[0].is_moe == 0 && sp.layers[1].is_moe == 1 && sp.layers[1].has_shared && sp.layers[1].gate.rows == MI, "%s: layer kinds",
              label);
        const stw_entry *d, *s;
        src_parts(&w, "model.layers.1.self_attn.kv_b_proj", &d, &s);
        df_weight kvb = sp.layers[1].kv_b;
        CHECK(kvb.type == (spine_enc == ENC_FP8 ? DF_W_FP8_B128 : DF_W_BF16) && !memcmp(kvb.data, d->data, d->nbytes) &&
                  (!s || !memcmp(kvb.scale, s->data, s->nbytes)),
              "%s: kv_b bytes + scale", label);
        CHECK(((uintptr_t)kvb.data - (uintptr_t)sb) % 64 == 0, "%s: 64-byte alignment", label);
        spine_free(&sp);
    }
    df_aligned_free(sb);
    rc = native_verify(n, NULL, NULL, err, sizeof err);
    CHECK(rc == 0, "%s: verify: %s", label, err);
    native_close(n);
    /* tokenizer copied */
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    CHECK(df_path_exists(p), "%s: tokenizer.json copied", label);
    CHECK(count_tmp_files(out) == 0, "%s: no .tmp left", label);
    stw_free(&w);
}

static void test_corruption(void) {
    char hf[512], out[600], err[1024], p[700];
    snprintf(hf, sizeof hf, "%s/hf_corrupt", tmpdir);
    snprintf(out, sizeof out, "%s/native_corrupt", tmpdir);
    static stw w;
    w.n = 0;
    build_ckpt(hf, &w, ENC_BF16, ENC_MXFP4, 0, 0, 0);
    stw_free(&w);
    CHECK(df_convert(hf, out, NULL, err, sizeof err) == 0, "corrupt: convert: %s", err);
    df_native *n;
    if (native_open(&n, out, err, sizeof err)) { CHECK(0, "open: %s", err); return; }
    uint64_t stride = n->stride;
    native_close(n);
    /* flip one byte inside expert 3 of layer 2 */
    snprintf(p, sizeof p, "%s/experts-L002.pack", out);
    FILE *f = fopen(p, "r+b");
    fseek(f, (long)(3 * stride + 100), SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)(3 * stride + 100), SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    CHECK(native_open(&n, out, err, sizeof err) == 0, "corrupt byte: open still fine: %s", err);
    int rc = native_verify(n, NULL, NULL, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "layer 2 expert 3") && strstr(err, "experts-L002.pack"), "corrupt byte detected: %s", err);
    uint8_t *buf = malloc(stride);
    CHECK(native_read_expert(n, 2, 3, buf, err, sizeof err) == 0 && native_verify_expert(n, 2, 3, buf, err, sizeof err) == DF_EFORMAT,
          "verify_expert detects it");
    CHECK(native_read_expert(n, 2, 2, buf, err, sizeof err) == 0 && native_verify_expert(n, 2, 2, buf, err, sizeof err) == 0,
          "neighbour intact");
    free(buf);
    native_close(n);
    /* truncated pack */
    CHECK(truncate(p, (off_t)(3 * stride + 10)) == 0, "truncate");
    rc = native_open(&n, out, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "truncated") && strstr(err, "layer 2"), "truncated pack: %s", err);
    /* corrupted spine */
    snprintf(p, sizeof p, "%s/spine.bin", out);
    CHECK(truncate(p, 100) == 0, "truncate spine");
    rc = native_open(&n, out, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "spine.bin"), "truncated spine: %s", err);
    /* missing manifest */
    rc = native_open(&n, tmpdir, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "manifest.json"), "no manifest: %s", err);
}

static void test_spine_modes(void) {
    char hf[512], out[600], err[1024];
    snprintf(hf, sizeof hf, "%s/hf_fp8", tmpdir);
    static stw w;
    w.n = 0;
    build_ckpt(hf, &w, ENC_FP8, ENC_FP8, 0, 1, 0);  /* power-of-two block scales: bf16 re-encoding is lossless */
    df_convert_opts o;
    df_convert_opts_default(&o);
    /* bf16 */
    o.spine = DF_SPINE_BF16;
    snprintf(out, sizeof out, "%s/native_fp8_bf16", tmpdir);
    int rc = df_convert(hf, out, &o, err, sizeof err);
    CHECK(rc == 0, "bf16 spine: %s", err);
    df_native *n;
    if (!rc && !native_open(&n, out, err, sizeof err)) {
        CHECK(!strcmp(n->spine_mode, "bf16") && n->exact == 1, "bf16 lossless -> exact (%d)", n->exact);
        const native_tensor *t = native_find(n, "model.layers.1.self_attn.q_b_proj.weight");
        CHECK(t && t->type == DF_W_BF16 && t->scale_bytes == 0, "q_b re-encoded bf16");
        CHECK(n->expert_type == DF_W_FP8_B128, "experts keep fp8");
        void *sb = load_spine(n);
        const stw_entry *d, *s;
        src_parts(&w, "model.layers.1.self_attn.q_b_proj", &d, &s);
        df_weight src = {DF_W_FP8_B128, NH * (NOPE + ROPE), QL, d->data, s->data, 0};
        float a[QL], b[QL];
        df_weight dst = {DF_W_BF16, t->shape[0], t->shape[1], (uint8_t *)sb + t->offset, NULL, 0};
        int ok = 1;
        for (int r = 0; r < src.rows; r++) {
            df_weight_dequant_row(&src, r, a);
            df_weight_dequant_row(&dst, r, b);
            ok &= !memcmp(a, b, sizeof a);
        }
        CHECK(ok, "bf16 values == fp8 * scale exactly");
        df_aligned_free(sb);
        check_experts(n, &w, "fp8 experts");
        native_close(n);
    }
    stw_free(&w);
    /* bf16 with non-power-of-two scales: lossy -> exact false */
    snprintf(hf, sizeof hf, "%s/hf_fp8b", tmpdir);
    build_ckpt(hf, &w, ENC_FP8, ENC_BF16, 0, 0, 0);
    snprintf(out, sizeof out, "%s/native_fp8b_bf16", tmpdir);
    rc = df_convert(hf, out, &o, err, sizeof err);
    if (!rc && !native_open(&n, out, err, sizeof err)) {
        CHECK(n->exact == 0, "bf16 lossy -> exact false");
        native_close(n);
    } else CHECK(0, "fp8b: %s", err);
    /* int8 */
    o.spine = DF_SPINE_INT8;
    snprintf(out, sizeof out, "%s/native_fp8b_int8", tmpdir);
    rc = df_convert(hf, out, &o, err, sizeof err);
    CHECK(rc == 0, "int8 spine: %s", err);
    if (!rc && !native_open(&n, out, err, sizeof err)) {
        CHECK(n->exact == 0 && !strcmp(n->spine_mode, "int8"), "int8 -> not exact");
        const native_tensor *emb = native_find(n, "model.embed_tokens.weight");
        const native_tensor *rt = native_find(n, "model.layers.1.mlp.gate.weight");
        const native_tensor *nr = native_find(n, "model.norm.weight");
        CHECK(emb && emb->type == DF_W_BF16, "embed kept");
        CHECK(nr && nr->type == DF_W_BF16, "norm kept");
        CHECK(rt && rt->type == DF_W_INT8_ROW && rt->scale_bytes == NE * 4, "router int8_row");
        void *sb = load_spine(n);
        const stw_entry *src = stw_get(&w, "model.layers.1.mlp.gate.weight");
        /* row 2 by hand: s = absmax/127, q = round-half-even(x / s) */
        const uint16_t *x = (const uint16_t *)src->data + 2 * H;
        float amax = 0;
        for (int j = 0; j < H; j++) amax = fmaxf(amax, fabsf(df_bf16_to_f32(x[j])));
        float s = amax / 127.0f, sgot;
        memcpy(&sgot, (uint8_t *)sb + rt->scale_offset + 8, 4);
        const int8_t *q = (const int8_t *)((uint8_t *)sb + rt->offset) + 2 * H;
        int ok = sgot == s, maxq = 0;
        for (int j = 0; j < H; j++) {
            ok &= q[j] == (int8_t)nearbyintf(df_bf16_to_f32(x[j]) / s);
            if (abs(q[j]) > maxq) maxq = abs(q[j]);
        }
        CHECK(ok && maxq == 127, "int8 row quantization by hand (max |q| %d)", maxq);
        df_spine sp;
        CHECK(spine_build(n, sb, &sp, err, sizeof err) == 0, "int8 spine_build: %s", err);
        spine_free(&sp);
        df_aligned_free(sb);
        native_close(n);
    }
    stw_free(&w);
}

static void test_striping(void) {
    char hf[512], out[600], dirs[1400], err[1024];
    snprintf(hf, sizeof hf, "%s/hf_stripe", tmpdir);
    snprintf(out, sizeof out, "%s/native_stripe", tmpdir);
    snprintf(dirs, sizeof dirs, "%s/drive0,%s/drive1", tmpdir, tmpdir);
    static stw w;
    w.n = 0;
    build_ckpt(hf, &w, ENC_BF16, ENC_BF16, 0, 0, 0);
    df_convert_opts o;
    df_convert_opts_default(&o);
    o.expert_dirs = dirs;
    int rc = df_convert(hf, out, &o, err, sizeof err);
    CHECK(rc == 0, "striped convert: %s", err);
    df_native *n;
    if (!rc && !native_open(&n, out, err, sizeof err)) {
        const native_expert_layer *L = n->by_layer[1];
        CHECK(L && L->n_files == 2 && strstr(L->files[1], "drive1/experts-L001.s1.pack") && L->stripe_bytes % 4096 == 0 &&
                  L->stripe_bytes * 2 >= n->stride,
              "two stripes (stride %llu, stripe %llu)", (unsigned long long)n->stride, L ? (unsigned long long)L->stripe_bytes : 0ull);
        check_experts(n, &w, "striped");
        CHECK(native_verify(n, NULL, NULL, err, sizeof err) == 0, "striped verify: %s", err);
        /* packs moved to other drives: --expert-dirs override */
        char cmd[3000], nd[1400];
        snprintf(cmd, sizeof cmd, "mkdir -p %s/m0 %s/m1 && cp %s/drive0/*.pack %s/m0/ && cp %s/drive1/*.pack %s/m1/", tmpdir, tmpdir, tmpdir,
                 tmpdir, tmpdir, tmpdir);
        CHECK(system(cmd) == 0, "copy packs");
        snprintf(nd, sizeof nd, "%s/m0", tmpdir);
        CHECK(native_set_expert_dirs(n, nd, err, sizeof err) == DF_EINVAL, "override needs 2 dirs: %s", err);
        snprintf(nd, sizeof nd, "%s/m0,%s/m1", tmpdir, tmpdir);
        CHECK(native_set_expert_dirs(n, nd, err, sizeof err) == 0 && strstr(n->by_layer[2]->files[1], "/m1/experts-L002.s1.pack"),
              "override: %s", err);
        check_experts(n, &w, "striped, moved");
        native_close(n);
    }
    stw_free(&w);
}

static int cancel_cb(void *u, const char *what, uint64_t done, uint64_t total) {
    int *calls = u;
    return ++*calls >= 3;
}

static void test_errors(void) {
    char hf[512], out[600], p[700], err[1024];
    static stw w;
    /* missing routed expert tensor: found while writing packs -> tmp files removed */
    snprintf(hf, sizeof hf, "%s/hf_missing", tmpdir);
    snprintf(out, sizeof out, "%s/native_missing", tmpdir);
    w.n = 0;
    build_ckpt(hf, &w, ENC_BF16, ENC_BF16, 0, 0, 0);
    for (int i = 0; i < w.n; i++)
        if (!strcmp(w.e[i].name, "model.layers.2.mlp.experts.3.up_proj.weight")) snprintf(w.e[i].name, sizeof w.e[i].name, "unrelated.x.weight");
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    stw_write_range(&w, 0, w.n, p);
    int rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "model.layers.2.mlp.experts.3.up_proj"), "missing expert: %s", err);
    snprintf(p, sizeof p, "%s/manifest.json", out);
    CHECK(!df_path_exists(p) && count_tmp_files(out) == 0, "no manifest, no tmp after error");
    /* truncated checkpoint */
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    CHECK(truncate(p, 5000) == 0, "truncate ckpt");
    rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "model.safetensors"), "truncated checkpoint: %s", err);
    stw_free(&w);
    /* unsupported expert encoding in the file (I16) */
    snprintf(hf, sizeof hf, "%s/hf_i16", tmpdir);
    build_ckpt(hf, &w, ENC_BF16, ENC_BF16, 0, 0, 0);
    for (int i = 0; i < w.n; i++)
        if (!strcmp(w.e[i].name, "model.layers.1.mlp.experts.0.gate_proj.weight")) w.e[i].dtype = "I16";
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    stw_write_range(&w, 0, w.n, p);
    rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "experts.0.gate_proj") && strstr(err, "I16") && strstr(err, "model.safetensors"),
          "unsupported encoding: %s", err);
    stw_free(&w);
    /* cancellation */
    snprintf(hf, sizeof hf, "%s/hf_cancel", tmpdir);
    snprintf(out, sizeof out, "%s/native_cancel", tmpdir);
    build_ckpt(hf, &w, ENC_BF16, ENC_BF16, 0, 0, 0);
    stw_free(&w);
    df_convert_opts o;
    df_convert_opts_default(&o);
    int calls = 0;
    o.progress = cancel_cb;
    o.progress_user = &calls;
    o.threads = 1;
    rc = df_convert(hf, out, &o, err, sizeof err);
    snprintf(p, sizeof p, "%s/manifest.json", out);
    CHECK(rc == DF_ECANCELLED && !df_path_exists(p) && count_tmp_files(out) == 0, "cancel: rc %d, %s", rc, err);
    /* not an HF dir */
    rc = df_convert(tmpdir, out, NULL, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "config.json"), "no config: %s", err);
}

/* kimi_k25: text model under text_config, tensors under language_model., a vision tower to skip */
static void test_k25(void) {
    char hf[512], out[600], p[700], err[1024];
    snprintf(hf, sizeof hf, "%s/hf_k25", tmpdir);
    snprintf(out, sizeof out, "%s/native_k25", tmpdir);
    static stw w;
    w.n = 0;
    build_ckpt(hf, &w, ENC_BF16, ENC_MXFP4, 0, 0, 0);
    char *txt;
    snprintf(p, sizeof p, "%s/config.json", hf);
    df_read_file(p, &txt, NULL, err, sizeof err);
    cJSON *tc = cJSON_Parse(txt), *root = cJSON_CreateObject();
    free(txt);
    cJSON_AddStringToObject(root, "model_type", "kimi_k25");
    cJSON_AddItemToObject(root, "quantization_config", cJSON_DetachItemFromObject(tc, "quantization_config"));
    cJSON_ReplaceItemInObject(tc, "model_type", cJSON_CreateString("kimi_k2"));
    cJSON_AddItemToObject(root, "text_config", tc);
    cJSON_AddItemToObject(root, "vision_config", cJSON_CreateObject());
    txt = cJSON_Print(root);
    stw_write_text(p, txt);
    free(txt);
    cJSON_Delete(root);
    for (int i = 0; i < w.n; i++) {
        char nm[256];
        snprintf(nm, sizeof nm, "language_model.%.200s", w.e[i].name);
        memcpy(w.e[i].name, nm, sizeof nm);
    }
    int64_t vsh[2] = {4, 4};
    stw_add(&w, "vision_tower.encoder.blocks.0.attn.qkv.weight", "F32", 2, vsh, NULL);
    stw_add(&w, "mm_projector.proj.0.weight", "F32", 2, vsh, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    stw_write_range(&w, 0, w.n, p);
    int rc = df_convert(hf, out, NULL, err, sizeof err);
    CHECK(rc == 0, "k25 convert: %s", err);
    df_native *n;
    if (!rc && !native_open(&n, out, err, sizeof err)) {
        CHECK(!strcmp(n->cfg.model_type, "kimi_k25") && n->cfg.hidden_size == H && n->expert_type == DF_W_MXFP4, "k25 config");
        CHECK(native_find(n, "model.embed_tokens.weight") && !native_find(n, "vision_tower.encoder.blocks.0.attn.qkv.weight") &&
                  !native_find(n, "language_model.model.embed_tokens.weight"),
              "k25 names: prefix removed, vision skipped");
        void *sb = load_spine(n);
        df_spine sp;
        CHECK(spine_build(n, sb, &sp, err, sizeof err) == 0, "k25 spine: %s", err);
        spine_free(&sp);
        df_aligned_free(sb);
        CHECK(native_verify(n, NULL, NULL, err, sizeof err) == 0, "k25 verify: %s", err);
        native_close(n);
    }
    stw_free(&w);
}

static void test_cached(void) {
    char hf[512], cache[600], d1[1024], d2[1024], err[1024], p[1100];
    snprintf(hf, sizeof hf, "%s/hf_cache", tmpdir);
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    static stw w;
    w.n = 0;
    build_ckpt(hf, &w, ENC_BF16, ENC_INT4, 0, 0, 0);
    stw_free(&w);
    int rc = convert_cached(hf, cache, DF_SPINE_SOURCE, NULL, NULL, d1, sizeof d1, err, sizeof err);
    CHECK(rc == 0 && strstr(d1, "/cache/hf_cache-") && strstr(d1, "-source"), "cached first: %s %s", d1, err);
    snprintf(p, sizeof p, "%s/manifest.json", d1);
    struct stat s1, s2;
    stat(p, &s1);
    rc = convert_cached(hf, cache, DF_SPINE_SOURCE, NULL, NULL, d2, sizeof d2, err, sizeof err);
    stat(p, &s2);
    CHECK(rc == 0 && !strcmp(d1, d2) && s1.st_ino == s2.st_ino && s1.st_mtim.tv_nsec == s2.st_mtim.tv_nsec, "cached reuse");
    rc = convert_cached(hf, cache, DF_SPINE_BF16, NULL, NULL, d2, sizeof d2, err, sizeof err);
    CHECK(rc == 0 && strcmp(d1, d2) && strstr(d2, "-bf16"), "other mode, other dir: %s", d2);
}

static void test_goldens(void) {
    DIR *d = opendir("tests/golden");
    if (!d) { printf("no tests/golden directory (run from the repo root)\n"); return; }
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char hf[600], cfg[700], out[800], err[1024];
        snprintf(hf, sizeof hf, "tests/golden/%s", de->d_name);
        snprintf(cfg, sizeof cfg, "%s/config.json", hf);
        if (!df_path_exists(cfg)) continue;
        snprintf(out, sizeof out, "%s/golden_%s", tmpdir, de->d_name);
        int rc = df_convert(hf, out, NULL, err, sizeof err);
        CHECK(rc == 0, "golden %s converts: %s", de->d_name, err);
        df_native *nat;
        if (!rc) {
            rc = native_open(&nat, out, err, sizeof err);
            CHECK(rc == 0, "golden %s opens: %s", de->d_name, err);
            if (!rc) {
                void *sb = load_spine(nat);
                df_spine sp;
                rc = spine_build(nat, sb, &sp, err, sizeof err);
                CHECK(rc == 0, "golden %s spine: %s", de->d_name, err);
                if (!rc) spine_free(&sp);
                CHECK(native_verify(nat, NULL, NULL, err, sizeof err) == 0, "golden %s verify: %s", de->d_name, err);
                df_aligned_free(sb);
                native_close(nat);
            }
        }
        n++;
    }
    closedir(d);
    printf("golden checkpoints converted: %d\n", n);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_convert_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_roundtrip(ENC_BF16, ENC_BF16, 1, "bf16_sharded");
    test_roundtrip(ENC_FP8, ENC_FP8, 0, "fp8");
    test_roundtrip(ENC_BF16, ENC_INT4, 0, "int4");
    test_roundtrip(ENC_BF16, ENC_MXFP4, 1, "mxfp4");
    test_corruption();
    test_spine_modes();
    test_striping();
    test_errors();
    test_k25();
    test_cached();
    test_goldens();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (getenv("DF_KEEP_TMP")) printf("kept %s\n", tmpdir);
    else if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
