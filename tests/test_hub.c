/* test_hub.c — the pure parts of src/hub: which files `setup` takes (hub_select: vision-only shards,
 * draft/ files, other folders), repo id / mirror checks (hub_init), the installed-models registry
 * (record, replace, default, a malformed file) and the resumable-download sidecar seeded by
 * hub_seed_partial. Network paths are tested end to end by tests/e2e_setup.sh. */
#include "hub/hub.h"
#include "hub/registry.h"
#include "deltafin.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int has(const hub_file *f, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(f[i].name, name)) return 1;
    return 0;
}

static void test_select(void) {
    const char *names[] = {"config.json", "tokenizer.json", "README.md", "model.safetensors.index.json",
                           "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", "model-extra.safetensors", "draft/config.json",
                           "draft/model.safetensors", "original/consolidated.safetensors", "modeling_kimi.py",
                           ".gitattributes", "tiktoken.model"};
    int n = (int)(sizeof names / sizeof names[0]);
    hub_file fs[16];
    memset(fs, 0, sizeof fs);
    for (int i = 0; i < n; i++) snprintf(fs[i].name, sizeof fs[i].name, "%s", names[i]);
    /* shard 2 holds only vision tensors; shard 3 mixes vision and language: kept */
    const char *index = "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\","
                        "\"vision_tower.blocks.0.w\": \"model-00002-of-00003.safetensors\","
                        "\"mm_projector.proj.weight\": \"model-00002-of-00003.safetensors\","
                        "\"vision_tower.blocks.1.w\": \"model-00003-of-00003.safetensors\","
                        "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"}}";
    hub_file a[16];
    memcpy(a, fs, sizeof fs);
    int k = hub_select(a, n, index, 0);
    CHECK(k == 7, "selected %d files", k);
    CHECK(has(a, k, "config.json") && has(a, k, "tokenizer.json") && has(a, k, "README.md") && has(a, k, "tiktoken.model") &&
          has(a, k, "model.safetensors.index.json"), "small files kept");
    CHECK(has(a, k, "model-00001-of-00003.safetensors") && has(a, k, "model-00003-of-00003.safetensors"), "language shards kept");
    CHECK(!has(a, k, "model-00002-of-00003.safetensors"), "vision-only shard skipped");
    CHECK(!has(a, k, "model-extra.safetensors"), "a shard the index does not name is skipped");
    CHECK(!has(a, k, "draft/config.json") && !has(a, k, "original/consolidated.safetensors") && !has(a, k, "modeling_kimi.py") &&
          !has(a, k, ".gitattributes"), "draft/, other folders, code, git files skipped");
    memcpy(a, fs, sizeof fs);
    k = hub_select(a, n, index, 1);
    CHECK(has(a, k, "draft/config.json") && has(a, k, "draft/model.safetensors") && k == 9, "--include-draft: %d files", k);
    memcpy(a, fs, sizeof fs);
    k = hub_select(a, n, NULL, 0);
    CHECK(has(a, k, "model-00002-of-00003.safetensors") && has(a, k, "model-extra.safetensors"), "no index: every root shard");
}

static void test_init(void) {
    hub_ctx h;
    char err[512];
    unsetenv("HF_ENDPOINT");
    setenv("HF_TOKEN", "tok", 1);
    CHECK(hub_init(&h, NULL, "moonshotai/Kimi-K2-Instruct", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(h.mirror, "https://huggingface.co") && !strcmp(h.rev, "main") && !strcmp(h.token, "tok"), "defaults %s %s", h.mirror, h.rev);
    char url[2048];
    hub_file_url(&h, "config.json", url, sizeof url);
    CHECK(!strcmp(url, "https://huggingface.co/moonshotai/Kimi-K2-Instruct/resolve/main/config.json"), "%s", url);
    setenv("HF_ENDPOINT", "http://mirror.local:8080/", 1);
    CHECK(hub_init(&h, NULL, "a/b", "v1", err, sizeof err) == 0 && !strcmp(h.mirror, "http://mirror.local:8080"), "HF_ENDPOINT %s", h.mirror);
    CHECK(hub_init(&h, NULL, "Kimi-K2", NULL, err, sizeof err) == DF_EINVAL && strstr(err, "OWNER/NAME"), "%s", err);
    CHECK(hub_init(&h, NULL, "a/b/c", NULL, err, sizeof err) == DF_EINVAL, "three parts");
    CHECK(hub_init(&h, "ftp://x", "a/b", NULL, err, sizeof err) == DF_EINVAL && strstr(err, "--mirror"), "%s", err);
    unsetenv("HF_ENDPOINT");
    unsetenv("HF_TOKEN");
}

static void test_registry(void) {
    char dir[] = "/tmp/df_test_hub.XXXXXX", path[256], model[300], err[512];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(path, sizeof path, "%s/sub/models.json", dir);
    reg_entry *es = NULL, e, d;
    int n = -1;
    char dflt[256];
    CHECK(registry_load(path, &es, &n, dflt, sizeof dflt, err, sizeof err) == 0 && n == 0 && !dflt[0], "missing = empty");
    memset(&e, 0, sizeof e);
    snprintf(e.repo, sizeof e.repo, "a/b");
    snprintf(e.mode, sizeof e.mode, "full");
    snprintf(e.model, sizeof e.model, "%s/native", dir);
    e.bytes = 12345;
    CHECK(registry_record(path, &e, 1, err, sizeof err) == 0, "%s", err);
    CHECK(registry_default(path, &d, err, sizeof err) == 2 && !strcmp(d.repo, "a/b"), "no manifest yet: the default is reported missing (2)");
    snprintf(model, sizeof model, "%s/native", dir);
    mkdir(model, 0755);
    snprintf(model, sizeof model, "%s/native/manifest.json", dir);
    FILE *f = fopen(model, "w");
    if (f) { fputs("{}", f); fclose(f); }
    CHECK(registry_default(path, &d, err, sizeof err) == 1 && !strcmp(d.repo, "a/b") && d.bytes == 12345, "default a/b");
    snprintf(e.repo, sizeof e.repo, "c/d");
    CHECK(registry_record(path, &e, 0, err, sizeof err) == 0, "%s", err);
    e.bytes = 999;
    snprintf(e.repo, sizeof e.repo, "a/b");
    CHECK(registry_record(path, &e, 0, err, sizeof err) == 0, "%s", err);
    CHECK(registry_load(path, &es, &n, dflt, sizeof dflt, err, sizeof err) == 0 && n == 2 && !strcmp(dflt, "a/b") &&
          es[0].bytes == 999 && !strcmp(es[1].repo, "c/d"), "replace keeps order and default: n %d dflt %s", n, dflt);
    free(es);
    /* a default that names no entry (the entry removed by hand): 3, its name in out->repo, never another entry */
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "{\"default\": \"gone/x\", \"models\": [{\"repo\": \"a/b\", \"model\": \"%s/native\", \"mode\": \"full\"}]}", dir);
        fclose(f);
    }
    memset(&d, 0, sizeof d);
    CHECK(registry_default(path, &d, err, sizeof err) == 3 && !strcmp(d.repo, "gone/x") && !d.model[0],
          "dangling default: 3 and its name (got %s)", d.repo);
    f = fopen(path, "w");
    if (f) { fputs("{\"default\": \"\", \"models\": []}", f); fclose(f); }
    CHECK(registry_default(path, &d, err, sizeof err) == 0, "no default: 0");
    f = fopen(path, "w");
    if (f) { fputs("{\"x\": 1}", f); fclose(f); }
    CHECK(registry_load(path, &es, &n, dflt, sizeof dflt, err, sizeof err) == DF_EFORMAT && strstr(err, path), "%s", err);
    char reg[4096];
    setenv("DELTAFIN_REGISTRY", "/x/y.json", 1);
    CHECK(registry_path(NULL, reg, sizeof reg, err, sizeof err) == 0 && !strcmp(reg, "/x/y.json"), "env alias %s", reg);
    CHECK(registry_path("/f.json", reg, sizeof reg, err, sizeof err) == 0 && !strcmp(reg, "/f.json"), "flag wins %s", reg);
    unsetenv("DELTAFIN_REGISTRY");
    setenv("XDG_DATA_HOME", "/xdg", 1);
    CHECK(registry_path(NULL, reg, sizeof reg, err, sizeof err) == 0 && !strcmp(reg, "/xdg/deltafin/models.json"), "%s", reg);
    unsetenv("XDG_DATA_HOME");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_seed(void) {
    char dir[] = "/tmp/df_test_hub.XXXXXX", p[256], err[512];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(p, sizeof p, "%s/f.bin", dir);
    FILE *f = fopen(p, "w");
    if (f) { for (int i = 0; i < 300000; i++) fputc(i & 0xff, f); fclose(f); }
    uint64_t done[5] = {65536, 100, 0, 65536, 300000 - 4 * 65536};
    CHECK(hub_seed_partial(p, 300000, "ab", 65536, done, 5, err, sizeof err) == 0, "%s", err);
    char q[300];
    snprintf(q, sizeof q, "%s.partial.state", p);
    f = fopen(q, "rb");
    unsigned char b[88 + 40];
    size_t got = f ? fread(b, 1, sizeof b, f) : 0;
    if (f) fclose(f);
    uint64_t sz, ch, d1;
    memcpy(&sz, b + 8, 8);
    memcpy(&ch, b + 16, 8);
    memcpy(&d1, b + 96, 8);
    CHECK(got == sizeof b && !memcmp(b, "DFDL1", 5) && sz == 300000 && ch == 65536 && b[24] == 'a' && b[25] == 'b' && b[26] == 0 && d1 == 100,
          "sidecar header / done[1]");
    snprintf(q, sizeof q, "%s.partial", p);
    CHECK(access(q, F_OK) == 0 && access(p, F_OK) != 0, "renamed to .partial");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void) {
    test_select();
    test_init();
    test_registry();
    test_seed();
    return t_done();
}
