/* test_model_formats.c — number formats, config.json parsing, safetensors
 * validation and HF encodings (fp8 block, int4 pack-quantized, mxfp4, gpt-oss
 * blocks) checked against hand-computed values. Files are written by the test. */
#include "test_util.h"
#include "test_model_stwrite.h"

#include "deltafin.h"
#include "model/config.h"
#include "model/hf_encodings.h"
#include "model/native.h"
#include "model/safetensors.h"
#include "model/weights_util.h"
#include "util/util.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static void test_numbers(void) {
    /* fp8 e4m3fn */
    CHECK(df_fp8_e4m3_to_f32(0x00) == 0.0f, "fp8 0");
    CHECK(df_fp8_e4m3_to_f32(0x01) == ldexpf(1, -9), "fp8 smallest subnormal");
    CHECK(df_fp8_e4m3_to_f32(0x07) == 7 * ldexpf(1, -9), "fp8 largest subnormal");
    CHECK(df_fp8_e4m3_to_f32(0x08) == ldexpf(1, -6), "fp8 smallest normal");
    CHECK(df_fp8_e4m3_to_f32(0x38) == 1.0f, "fp8 1.0");
    CHECK(df_fp8_e4m3_to_f32(0x3C) == 1.5f, "fp8 1.5");
    CHECK(df_fp8_e4m3_to_f32(0x7E) == 448.0f, "fp8 max 448");
    CHECK(isnan(df_fp8_e4m3_to_f32(0x7F)) && isnan(df_fp8_e4m3_to_f32(0xFF)), "fp8 NaN");
    CHECK(df_fp8_e4m3_to_f32(0x78) == 256.0f, "fp8 0x78 (e=15 is a normal exponent in e4m3fn)");
    CHECK(df_fp8_e4m3_to_f32(0xB8) == -1.0f, "fp8 -1");
    CHECK(signbit(df_fp8_e4m3_to_f32(0x80)) && df_fp8_e4m3_to_f32(0x80) == 0.0f, "fp8 -0");
    CHECK(df_fp8_e4m3_to_f32(0x81) == -ldexpf(1, -9), "fp8 negative subnormal");
    /* f16 */
    CHECK(df_f16_to_f32(0x3C00) == 1.0f, "f16 1");
    CHECK(df_f16_to_f32(0x0001) == ldexpf(1, -24), "f16 subnormal");
    CHECK(df_f16_to_f32(0x03FF) == 1023 * ldexpf(1, -24), "f16 largest subnormal");
    CHECK(df_f16_to_f32(0xFBFF) == -65504.0f, "f16 -max");
    CHECK(isinf(df_f16_to_f32(0x7C00)) && isnan(df_f16_to_f32(0x7E00)), "f16 inf/nan");
    CHECK(df_f16_to_f32(0xC000) == -2.0f, "f16 -2");
    /* bf16 */
    CHECK(df_bf16_to_f32(0x3F80) == 1.0f, "bf16 1");
    CHECK(df_bf16_to_f32(0xC040) == -3.0f, "bf16 -3");
    CHECK(df_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3F80, "bf16 RNE tie to even (down)");
    CHECK(df_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)) == 0x3F82, "bf16 RNE tie to even (up)");
    CHECK(df_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)) == 0x3F81, "bf16 above half rounds up");
    CHECK(df_f32_is_bf16_exact(1.5f) && !df_f32_is_bf16_exact(1.0f + ldexpf(1, -10)), "bf16 exactness");
    /* e2m1, e8m0 */
    static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= df_e2m1_to_f32((uint8_t)i) == e2m1[i];
    CHECK(ok, "e2m1 table");
    CHECK(df_e8m0_to_f32(127) == 1.0f && df_e8m0_to_f32(128) == 2.0f && df_e8m0_to_f32(120) == ldexpf(1, -7), "e8m0");
    CHECK(df_e8m0_to_f32(0) == ldexpf(1, -127) && df_e8m0_to_f32(0) > 0, "e8m0 0 = 2^-127 (subnormal)");
    CHECK(isnan(df_e8m0_to_f32(255)), "e8m0 0xFF NaN");
    /* xxh64 helpers: known vector XXH64("", 0) = ef46db3751d8e999 */
    char hx[17];
    df_xxh64_hex(df_xxh64("", 0), hx);
    CHECK(!strcmp(hx, "ef46db3751d8e999"), "xxh64 empty: %s", hx);
    uint64_t v;
    CHECK(df_xxh64_parse("ef46db3751d8e999", &v) == 0 && v == 0xef46db3751d8e999ull, "xxh64 parse");
    CHECK(df_xxh64_parse("xyz", &v) == DF_EFORMAT, "xxh64 parse bad");
    CHECK(!strcmp(df_strerror(DF_EFORMAT), "malformed or corrupt file"), "strerror");
    /* weight sizes */
    CHECK(df_weight_data_bytes(DF_W_INT4_G32, 4, 64) == 128 && df_weight_scale_bytes(DF_W_INT4_G32, 4, 64) == 16, "int4 sizes");
    CHECK(df_weight_scale_bytes(DF_W_FP8_B128, 129, 300) == 2 * 3 * 4, "fp8 scale size");
    CHECK(df_weight_data_bytes(DF_W_MXFP4, 2, 64) == 64 && df_weight_scale_bytes(DF_W_MXFP4, 2, 64) == 4, "mxfp4 sizes");
    CHECK(df_wtype_from_name("int4_g32") == DF_W_INT4_G32 && df_wtype_from_name("nope") == -1, "wtype names");
}

static void test_config(void) {
    df_config c;
    char err[512];
    const char *dsv3 = "{\"model_type\":\"deepseek_v3\",\"hidden_size\":128,\"num_hidden_layers\":4,\"q_lora_rank\":null,"
                       "\"rope_theta\":10000,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"original_max_position_embeddings\":4096,"
                       "\"beta_fast\":32,\"beta_slow\":1,\"mscale\":1.0,\"mscale_all_dim\":1.0},\"eos_token_id\":[7,8],\"bos_token_id\":null}";
    CHECK(config_parse(dsv3, &c, "a/config.json", err, sizeof err) == 0, "dsv3 parse: %s", err);
    CHECK(c.q_lora_rank == 0 && c.hidden_size == 128 && c.n_routed_experts == 256 && c.rope_yarn == 1, "dsv3 fields");
    CHECK(c.rope_factor == 40 && c.rope_original_max_pos == 4096 && c.rope_mscale_all_dim == 1.0 && c.rope_has_original_max, "yarn fields");
    CHECK(c.eos_token_id == 7 && c.bos_token_id == -1, "eos list / bos null: %d %d", c.eos_token_id, c.bos_token_id);
    CHECK(c.n_group == 8 && c.topk_group == 4 && c.first_k_dense_replace == 3 && c.norm_topk_prob == 1, "HF defaults");
    CHECK(fabsf(c.routed_scaling_factor - 2.5f) < 1e-7 && fabsf(c.rms_norm_eps - 1e-6f) < 1e-12, "defaults float");
    CHECK(!strcmp(c.scoring_func, "sigmoid") && !strcmp(c.topk_method, "noaux_tc"), "scoring defaults");

    const char *k2 = "{\"model_type\":\"kimi_k2\",\"q_lora_rank\":1536,\"n_group\":1,\"topk_group\":1,\"n_routed_experts\":384,"
                     "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":50000.0,\"factor\":32.0,\"beta_fast\":1,\"beta_slow\":1,"
                     "\"original_max_position_embeddings\":4096,\"mscale\":1.0,\"mscale_all_dim\":1.0}}";
    CHECK(config_parse(k2, &c, "k2/config.json", err, sizeof err) == 0, "k2 parse: %s", err);
    CHECK(c.rope_theta == 50000.0 && c.rope_factor == 32.0 && c.rope_beta_fast == 1 && c.q_lora_rank == 1536, "rope_parameters theta");

    const char *nolora = "{\"model_type\":\"deepseek_v3\"}";
    CHECK(config_parse(nolora, &c, NULL, err, sizeof err) == 0 && c.q_lora_rank == 1536 && c.rope_yarn == 0 && c.rope_theta == 10000.0,
          "absent q_lora_rank -> 1536 default");

    const char *k25 = "{\"model_type\":\"kimi_k25\",\"vision_config\":{},\"text_config\":{\"model_type\":\"kimi_k2\",\"hidden_size\":7168,"
                      "\"n_group\":1,\"topk_group\":1,\"n_routed_experts\":384,\"first_k_dense_replace\":1}}";
    CHECK(config_parse(k25, &c, NULL, err, sizeof err) == 0, "k25 parse: %s", err);
    CHECK(!strcmp(c.model_type, "kimi_k25") && c.hidden_size == 7168 && c.n_routed_experts == 384 && c.first_k_dense_replace == 1,
          "k25 text_config");

    int rc = config_parse("{\"model_type\":\"qwen3_moe\"}", &c, "q/config.json", err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "qwen3_moe") && strstr(err, "q/config.json"), "bad model_type: %s", err);
    rc = config_parse("{\"model_type\":\"deepseek_v3\",\"scoring_func\":\"softmax\"}", &c, "s/config.json", err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "softmax") && strstr(err, "s/config.json"), "bad scoring_func: %s", err);
    rc = config_parse("{\"model_type\":\"deepseek_v3\",\"topk_method\":\"greedy\"}", &c, "t/config.json", err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "greedy"), "bad topk_method: %s", err);
    rc = config_parse("{\"model_type\":", &c, "x/config.json", err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "x/config.json"), "bad json: %s", err);
    rc = config_parse("{\"model_type\":\"deepseek_v3\",\"hidden_size\":\"big\"}", &c, "y/config.json", err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "hidden_size"), "bad field type: %s", err);
}

static void write_raw(const char *path, const char *hdr, const void *data, size_t n, int64_t hlen_override) {
    FILE *f = fopen(path, "wb");
    uint64_t hl = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(hdr);
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Element i of an F32 tensor: safetensors data starts right after the JSON header, so it may be unaligned. */
static float st_f32_at(const st_tensor *t, size_t i) {
    float v;
    memcpy(&v, (const char *)t->data + i * sizeof v, sizeof v);
    return v;
}

static void test_safetensors(void) {
    char p[1100], err[512];
    st_set *s = NULL;
    float f[6] = {1, 2, 3, 4, 5, 6};
    snprintf(p, sizeof p, "%s/ok.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                 "\"__metadata__\":{\"format\":\"pt\"}}", f, 24, -1);
    int rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == 0, "valid file: %s", err);
    if (!rc) {
        const st_tensor *a = st_find(s, "a"), *b = st_find(s, "b");
        CHECK(a && b && s->n == 2, "find");
        CHECK(a && a->dtype == ST_F32 && a->ndim == 2 && a->shape[1] == 2 && st_f32_at(a, 3) == 4.0f, "tensor a data");
        CHECK(b && b->dtype == ST_BF16 && b->nbytes == 8, "tensor b");
        CHECK(!st_find(s, "c"), "absent");
        st_close(s);
    }
    /* truncated: data shorter than offsets */
    snprintf(p, sizeof p, "%s/trunc.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", f, 10, -1);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "truncated") && strstr(err, "\"a\"") && strstr(err, "trunc.safetensors"), "truncated: %s", err);
    /* overlapping tensors */
    snprintf(p, sizeof p, "%s/overlap.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", f,
              12, -1);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "overlap"), "overlap: %s", err);
    /* header length beyond the file */
    snprintf(p, sizeof p, "%s/badlen.safetensors", tmpdir);
    write_raw(p, "{}", NULL, 0, 1000000);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "header length"), "bad header length: %s", err);
    /* shorter than 8 bytes */
    snprintf(p, sizeof p, "%s/tiny.safetensors", tmpdir);
    stw_write_text(p, "abc");
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "truncated"), "tiny file: %s", err);
    /* wrong dtype size: 3 F32 elements in 8 bytes */
    snprintf(p, sizeof p, "%s/size.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", f, 8, -1);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "needs 12"), "dtype size mismatch: %s", err);
    /* malformed JSON */
    snprintf(p, sizeof p, "%s/json.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",", NULL, 0, -1);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "JSON"), "malformed json: %s", err);
    /* unknown dtype */
    snprintf(p, sizeof p, "%s/dtype.safetensors", tmpdir);
    write_raw(p, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}", f, 1, -1);
    rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "Q4"), "unknown dtype: %s", err);
    /* missing file */
    rc = st_open_file(&s, "/nonexistent/x.safetensors", err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "/nonexistent/x.safetensors"), "missing: %s", err);
    /* sharded directory with an index */
    char d[512];
    snprintf(d, sizeof d, "%s/shards", tmpdir);
    df_mkdir_p(d, err, sizeof err);
    snprintf(p, sizeof p, "%s/m-1.safetensors", d);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", f, 8, -1);
    snprintf(p, sizeof p, "%s/m-2.safetensors", d);
    write_raw(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", f + 5, 4, -1);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    stw_write_text(p, "{\"metadata\":{},\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}");
    rc = st_open_dir(&s, d, err, sizeof err);
    CHECK(rc == 0 && s->n_files == 2 && st_find(s, "b") && st_f32_at(st_find(s, "b"), 0) == 6.0f, "shards: %s", err);
    if (!rc) st_close(s);
    stw_write_text(p, "{\"metadata\":{},\"weight_map\":{\"a\":\"m-2.safetensors\",\"b\":\"m-2.safetensors\"}}");
    rc = st_open_dir(&s, d, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "\"a\""), "index names the wrong shard: %s", err);
}

/* Build a checkpoint file with one tensor family per encoding and check dequantization. */
static void test_encodings(void) {
    char p[512], err[512];
    stw w = {0};
    /* fp8: [130, 4] -> scale [2, 1] */
    int64_t sh[4] = {130, 4};
    uint8_t *q = stw_add(&w, "fp.weight", "F8_E4M3", 2, sh, NULL);
    q[0] = 0x38;             /* 1.0 */
    q[1] = 0x01;             /* 2^-9 (subnormal) */
    q[2] = 0x7F;             /* NaN */
    q[3] = 0xC4;             /* -3.0: s=1 e=8 m=4 -> -(1.5*2) */
    q[129 * 4 + 3] = 0x7E;   /* 448 */
    int64_t ssh[2] = {2, 1};
    float sc[2] = {0.5f, 4.0f};
    stw_add(&w, "fp.weight_scale_inv", "F32", 2, ssh, sc);
    /* int4: [2, 32] -> packed I32 [2, 4], scale BF16 [2, 1] */
    int64_t ish[2] = {2, 4};
    uint32_t pk[8] = {0x76543210u, 0xFEDCBA98u, 0, 0x88888888u, 0x00000008u, 0, 0, 0xF0000000u};
    stw_add(&w, "i4.weight_packed", "I32", 2, ish, pk);
    int64_t issh[2] = {2, 1};
    uint16_t isc[2] = {stw_bf16(0.25f), stw_bf16(-2.0f)};
    stw_add(&w, "i4.weight_scale", "BF16", 2, issh, isc);
    int64_t wsh[1] = {2};
    int32_t ws[2] = {2, 32};
    stw_add(&w, "i4.weight_shape", "I32", 1, wsh, ws);
    /* mxfp4: [1, 64] -> packed U8 [1, 32], scale U8 [1, 2] */
    int64_t msh[2] = {1, 32};
    uint8_t mp[32] = {0x21, 0xF8};
    mp[16] = 0x7F;           /* elements 32 (code 15: -6) and 33 (code 7: 6) */
    stw_add(&w, "mx.weight_packed", "U8", 2, msh, mp);
    int64_t mssh[2] = {1, 2};
    uint8_t ms[2] = {128, 125};   /* 2.0, 0.25 */
    stw_add(&w, "mx.weight_scale", "U8", 2, mssh, ms);
    /* gpt-oss blocks: E=2, R=4 (gate/up interleaved), C=32 */
    int64_t bsh[4] = {2, 4, 1, 16}, bssh[3] = {2, 4, 1};
    uint8_t blocks[2 * 4 * 16] = {0}, bscales[8];
    for (int e = 0; e < 2; e++)
        for (int r = 0; r < 4; r++) {
            blocks[(e * 4 + r) * 16] = (uint8_t)(0x10 * r + 2 * e + 1); /* element 0 code 2e+1, element 1 code r */
            bscales[e * 4 + r] = (uint8_t)(127 + r);
        }
    stw_add(&w, "model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", 4, bsh, blocks);
    stw_add(&w, "model.layers.0.mlp.experts.gate_up_proj_scales", "U8", 3, bssh, bscales);
    /* plain */
    int64_t psh[2] = {2, 2};
    uint16_t hf[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
    stw_add(&w, "h.weight", "F16", 2, psh, hf);
    int64_t i16sh[2] = {2, 2};
    stw_add(&w, "bad.weight", "I16", 2, i16sh, NULL);
    stw_add(&w, "nofp8scale.weight", "F8_E4M3", 2, psh, NULL);
    snprintf(p, sizeof p, "%s/enc.safetensors", tmpdir);
    CHECK(stw_write_range(&w, 0, w.n, p) == 0, "write enc");
    stw_free(&w);

    st_set *s;
    int rc = st_open_file(&s, p, err, sizeof err);
    CHECK(rc == 0, "open enc: %s", err);
    if (rc) return;
    hf_quant qn, qfp8, qct;
    memset(&qn, 0, sizeof qn);
    cJSON *cj = cJSON_Parse("{\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128]}}");
    CHECK(hf_quant_parse(cj, &qfp8, "c", err, sizeof err) == 0 && qfp8.method == HF_Q_FP8, "fp8 quant config");
    cJSON_Delete(cj);
    cj = cJSON_Parse("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{"
                     "\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"group_size\":32,"
                     "\"strategy\":\"group\"}},\"group_1\":{\"format\":\"mxfp4-pack-quantized\",\"targets\":[\"Linear\"],\"weights\":{"
                     "\"num_bits\":4,\"type\":\"float\",\"group_size\":32}}},\"ignore\":[\"lm_head\"]}}");
    CHECK(hf_quant_parse(cj, &qct, "c", err, sizeof err) == 0 && qct.has_int4 && qct.has_mxfp4, "compressed-tensors config: %s", err);
    cJSON_Delete(cj);
    cj = cJSON_Parse("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{"
                     "\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"group_size\":128}}}}}");
    hf_quant qb;
    rc = hf_quant_parse(cj, &qb, "c128", err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "128"), "int4 group 128 refused: %s", err);
    cJSON_Delete(cj);
    cj = cJSON_Parse("{\"quantization_config\":{\"quant_method\":\"awq\"}}");
    rc = hf_quant_parse(cj, &qb, "cawq", err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "awq"), "awq refused: %s", err);
    cJSON_Delete(cj);

    hf_weight hw;
    df_weight dw;
    float row[64];
    /* fp8 */
    rc = hf_weight_get(s, &qfp8, "fp", &hw, err, sizeof err);
    CHECK(rc == 0 && hw.type == DF_W_FP8_B128 && hw.rows == 130 && hw.cols == 4 && hf_scale_bytes(&hw) == 8, "fp8 resolve: %s", err);
    if (!rc && !hf_weight_view(&hw, &dw)) {
        df_weight_dequant_row(&dw, 0, row);
        CHECK(row[0] == 0.5f && row[1] == ldexpf(1, -10) && isnan(row[2]) && row[3] == -1.5f, "fp8 row 0: %g %g %g %g", row[0], row[1], row[2],
              row[3]);
        df_weight_dequant_row(&dw, 129, row);
        CHECK(row[3] == 448.0f * 4.0f && row[0] == 0.0f, "fp8 row 129 (second scale block): %g", row[3]);
    }
    /* int4: nibble j of word k = element 8k+j, value nibble-8 */
    rc = hf_weight_get(s, &qct, "i4", &hw, err, sizeof err);
    CHECK(rc == 0 && hw.type == DF_W_INT4_G32 && hw.rows == 2 && hw.cols == 32, "int4 resolve: %s", err);
    if (!rc && !hf_weight_view(&hw, &dw)) {
        df_weight_dequant_row(&dw, 0, row);
        int ok = 1;
        for (int j = 0; j < 16; j++) ok &= row[j] == (float)(j - 8) * 0.25f;
        for (int j = 16; j < 24; j++) ok &= row[j] == -2.0f;   /* nibble 0 -> -8 * 0.25 */
        for (int j = 24; j < 32; j++) ok &= row[j] == 0.0f;    /* nibble 8 -> 0 */
        CHECK(ok, "int4 row 0 nibble order: %g %g %g %g", row[0], row[1], row[8], row[15]);
        df_weight_dequant_row(&dw, 1, row);
        CHECK(row[0] == 0.0f && row[1] == 16.0f && row[31] == -14.0f, "int4 row 1: %g %g %g", row[0], row[1], row[31]);
    }
    rc = hf_weight_get(s, &qn, "i4", &hw, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "i4.weight_packed") && strstr(err, "I32") && strstr(err, "enc.safetensors"),
          "int4 without config: %s", err);
    /* mxfp4: low nibble = even element */
    rc = hf_weight_get(s, &qct, "mx", &hw, err, sizeof err);
    CHECK(rc == 0 && hw.type == DF_W_MXFP4 && hw.cols == 64, "mxfp4 resolve: %s", err);
    if (!rc && !hf_weight_view(&hw, &dw)) {
        df_weight_dequant_row(&dw, 0, row);
        CHECK(row[0] == 1.0f && row[1] == 2.0f && row[2] == 0.0f && signbit(row[2]) && row[3] == -12.0f, "mxfp4 block 0: %g %g %g %g",
              row[0], row[1], row[2], row[3]);
        CHECK(row[32] == -1.5f && row[33] == 1.5f, "mxfp4 block 1 (scale 0.25): %g %g", row[32], row[33]);
    }
    /* gpt-oss blocks: expert 1, odd rows (up) */
    rc = hf_gptoss_expert(s, "model.layers.0.mlp.experts.gate_up_proj", 1, 2, &hw, err, sizeof err);
    CHECK(rc == 0 && hw.rows == 2 && hw.cols == 32 && hw.data_row_stride == 32, "gpt-oss resolve: %s", err);
    if (!rc) {
        uint8_t d[32], sc2[2];
        hf_weight_copy(&hw, d, sc2);
        dw.type = DF_W_MXFP4; dw.rows = 2; dw.cols = 32; dw.data = d; dw.scale = sc2;
        df_weight_dequant_row(&dw, 1, row); /* source row 3 of expert 1: code 3 (1.5), code 3 (1.5), scale 2^3 */
        CHECK(row[0] == 12.0f && row[1] == 12.0f && sc2[0] == 128, "gpt-oss odd rows: %g %g", row[0], row[1]);
    }
    /* f16 */
    rc = hf_weight_get(s, &qn, "h", &hw, err, sizeof err);
    CHECK(rc == 0 && hw.type == DF_W_F16, "f16 resolve");
    if (!rc && !hf_weight_view(&hw, &dw)) {
        df_weight_dequant_row(&dw, 1, row);
        CHECK(row[0] == ldexpf(1, -24) && row[1] == 65504.0f, "f16 row");
    }
    rc = hf_weight_get(s, &qn, "bad", &hw, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "bad.weight") && strstr(err, "I16") && strstr(err, "enc.safetensors"), "I16: %s", err);
    rc = hf_weight_get(s, &qfp8, "nofp8scale", &hw, err, sizeof err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, "F8_E4M3") && strstr(err, "weight_scale_inv"), "fp8 without scale: %s", err);
    rc = hf_weight_get(s, &qn, "missing", &hw, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "missing.weight"), "missing: %s", err);
    CHECK(hf_base_len("a.b.weight_scale_inv") == 3 && hf_base_len("a.bias") == -1, "base len");
    st_close(s);
}

/* Mutated and truncated copies of a valid file must parse or fail cleanly (run under DF_ASAN to catch overreads). */
static void test_safetensors_fuzz(void) {
    char p[600], q[600], err[512];
    stw w = {0};
    int64_t sh[2] = {3, 5};
    stw_add(&w, "model.layers.0.self_attn.q_a_proj.weight", "BF16", 2, sh, NULL);
    stw_add(&w, "b", "F32", 1, sh, NULL);
    stw_add(&w, "c.weight_packed", "I32", 2, sh, NULL);
    snprintf(p, sizeof p, "%s/fuzz_src.safetensors", tmpdir);
    stw_write_range(&w, 0, w.n, p);
    stw_free(&w);
    char *src;
    size_t n;
    df_read_file(p, &src, &n, err, sizeof err);
    snprintf(q, sizeof q, "%s/fuzz.safetensors", tmpdir);
    int ok = 0, failed_cleanly = 0, bad = 0;
    for (int it = 0; it < 800; it++) {
        char *m = malloc(n);
        memcpy(m, src, n);
        size_t len = n;
        int kind = (int)(stw_rand() % 4);
        if (kind == 0) len = stw_rand() % n;                                   /* truncation */
        else for (int k = 0; k < 1 + (int)(stw_rand() % 4); k++) {
            size_t at = stw_rand() % (n < 400 ? n : 400);                      /* header bytes mostly */
            m[at] = kind == 1 ? (char)stw_rand() : (char)"0123456789[]{},:\"\" -e."[stw_rand() % 19];
        }
        FILE *f = fopen(q, "wb");
        fwrite(m, 1, len, f);
        fclose(f);
        free(m);
        st_set *s;
        int rc = st_open_file(&s, q, err, sizeof err);
        if (rc == 0) {
            ok++;
            for (int i = 0; i < s->n; i++) /* every tensor inside the map */
                if (s->t[i].data < (const uint8_t *)s->files[0].map ||
                    s->t[i].data + s->t[i].nbytes > (const uint8_t *)s->files[0].map + s->files[0].size) bad++;
            st_close(s);
        } else if (rc == DF_EFORMAT || rc == DF_EUNSUPPORTED) {
            failed_cleanly++;
            if (!err[0]) bad++;
        } else {
            bad++;
        }
    }
    free(src);
    CHECK(bad == 0 && failed_cleanly > 250, "fuzz: %d parsed, %d clean errors, %d bad", ok, failed_cleanly, bad);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_model_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_numbers();
    test_config();
    test_safetensors();
    test_safetensors_fuzz();
    test_encodings();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
