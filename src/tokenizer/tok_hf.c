/* tok_hf.c — load a Hugging Face tokenizer.json (tokenizers' serialization):
 * BPE model (vocab, merges as "a b" strings or [a, b] arrays, ignore_merges,
 * byte_fallback, unk_token), added tokens, normalizers, pre-tokenizers and the
 * decoder. Any component type we do not implement is an error naming it. */
#include "tok_internal.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { tok_err(err, errlen, "cannot open %s: check the path", path); return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b) { fclose(f); tok_err(err, errlen, "out of memory reading %s", path); return NULL; }
    if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        fclose(f); free(b); tok_err(err, errlen, "cannot read %s", path); return NULL;
    }
    fclose(f);
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

char *tok_slurp(const char *path, size_t *len, char *err, size_t errlen) { return slurp(path, len, err, errlen); }

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static int jbool(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

/* Does a component tree mention type `ty` (ByteLevel detection)? */
static int mentions_type(const cJSON *o, const char *ty) {
    if (!o || cJSON_IsNull(o)) return 0;
    const char *t = jstr(o, "type");
    if (t && !strcmp(t, ty)) return 1;
    const cJSON *c;
    cJSON_ArrayForEach(c, o) if (cJSON_IsObject(c) || cJSON_IsArray(c)) if (mentions_type(c, ty)) return 1;
    return 0;
}

static int add_norm(df_tokenizer *t, const cJSON *n, const char *path, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *ty = jstr(n, "type");
    if (!ty) { tok_err(err, errlen, "%s: normalizer without \"type\"", path); return DF_EFORMAT; }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *c, *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        cJSON_ArrayForEach(c, arr) { int rc = add_norm(t, c, path, err, errlen); if (rc) return rc; }
        return 0;
    }
    tok_norm nm = {0};
    if (!strcmp(ty, "NFC")) nm.type = TOK_NORM_NFC;
    else if (!strcmp(ty, "NFD")) nm.type = TOK_NORM_NFD;
    else if (!strcmp(ty, "NFKC")) nm.type = TOK_NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) nm.type = TOK_NORM_NFKD;
    else if (!strcmp(ty, "Lowercase")) nm.type = TOK_NORM_LOWERCASE;
    else if (!strcmp(ty, "Prepend")) {
        nm.type = TOK_NORM_PREPEND;
        const char *p = jstr(n, "prepend");
        if (!p) { tok_err(err, errlen, "%s: Prepend normalizer without \"prepend\"", path); return DF_EFORMAT; }
        nm.a = strdup(p);
    } else if (!strcmp(ty, "Replace")) {
        nm.type = TOK_NORM_REPLACE;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *s = pat ? jstr(pat, "String") : NULL, *c = jstr(n, "content");
        if (!s || !c) {
            tok_err(err, errlen, "%s: Replace normalizer with a Regex pattern is not supported (only String)", path);
            return DF_EUNSUPPORTED;
        }
        nm.a = strdup(s); nm.b = strdup(c);
    } else {
        tok_err(err, errlen, "%s: normalizer type \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, "
                "Lowercase, Replace, Prepend, Sequence)", path, ty);
        return DF_EUNSUPPORTED;
    }
    tok_norm *nn = realloc(t->norms, (t->n_norms + 1) * sizeof *nn);
    if (!nn) return DF_ENOMEM;
    t->norms = nn;
    t->norms[t->n_norms++] = nm;
    return 0;
}

static int push_pretok(df_tokenizer *t, tok_pretok *p) {
    tok_pretok *np = realloc(t->pretoks, (t->n_pretoks + 1) * sizeof *np);
    if (!np) return DF_ENOMEM;
    t->pretoks = np;
    t->pretoks[t->n_pretoks++] = *p;
    return 0;
}

static int add_pretok(df_tokenizer *t, const cJSON *n, const char *path, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *ty = jstr(n, "type");
    if (!ty) { tok_err(err, errlen, "%s: pre_tokenizer without \"type\"", path); return DF_EFORMAT; }
    char what[300];
    snprintf(what, sizeof what, "%s: pre_tokenizer %s", path, ty);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *c, *arr = cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        cJSON_ArrayForEach(c, arr) { int rc = add_pretok(t, c, path, err, errlen); if (rc) return rc; }
        return 0;
    }
    tok_pretok p;
    memset(&p, 0, sizeof p);
    if (!strcmp(ty, "Split")) {
        p.type = TOK_PRE_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *re = pat ? jstr(pat, "Regex") : NULL, *lit = pat ? jstr(pat, "String") : NULL;
        char *own = NULL;
        if (!re && lit) { /* literal string: quote every character */
            size_t L = strlen(lit);
            own = malloc(L * 4 + 8);
            if (!own) return DF_ENOMEM;
            strcpy(own, "\\Q");
            size_t k = 2;
            for (size_t i = 0; i < L; i++) {
                if (lit[i] == '\\' && lit[i + 1] == 'E') { memcpy(own + k, "\\E\\\\\\Q", 6); k += 6; continue; }
                own[k++] = lit[i];
            }
            memcpy(own + k, "\\E", 3);
            re = own;
        }
        if (!re) { tok_err(err, errlen, "%s: Split without a Regex or String pattern", path); return DF_EFORMAT; }
        int rc = tok_regex_compile(&p.re, re, what, err, errlen);
        free(own);
        if (rc) return rc;
        const char *b = jstr(n, "behavior");
        if (!b) b = "Isolated";
        if (!strcmp(b, "Removed")) p.behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) p.behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) p.behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p.behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p.behavior = TOK_SPLIT_CONTIGUOUS;
        else { tok_err(err, errlen, "%s: Split behavior \"%s\" is unknown", path, b); tok_regex_free(&p.re); return DF_EUNSUPPORTED; }
        p.invert = jbool(n, "invert", 0);
    } else if (!strcmp(ty, "ByteLevel")) {
        p.type = TOK_PRE_BYTELEVEL;
        p.use_regex = jbool(n, "use_regex", 1);
        p.add_prefix_space = jbool(n, "add_prefix_space", 1);
        if (p.use_regex) {
            int rc = tok_regex_compile(&p.re, tok_gpt2_pattern, what, err, errlen);
            if (rc) return rc;
        }
    } else if (!strcmp(ty, "Digits")) {
        p.type = TOK_PRE_DIGITS;
        p.individual = jbool(n, "individual_digits", 0);
        int rc = tok_regex_compile(&p.re, "\\p{N}", what, err, errlen);
        if (rc) return rc;
    } else {
        tok_err(err, errlen, "%s: pre_tokenizer type \"%s\" is not supported (supported: Sequence, Split, "
                "ByteLevel, Digits)", path, ty);
        return DF_EUNSUPPORTED;
    }
    return push_pretok(t, &p);
}

static int check_decoder(df_tokenizer *t, const cJSON *d, const char *path, char *err, size_t errlen) {
    if (!d || cJSON_IsNull(d)) { t->decoder = t->byte_level ? TOK_DEC_BYTELEVEL : TOK_DEC_RAW; return 0; }
    const char *ty = jstr(d, "type");
    if (ty && !strcmp(ty, "ByteLevel")) { t->decoder = TOK_DEC_BYTELEVEL; return 0; }
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *c, *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        cJSON_ArrayForEach(c, arr) { int rc = check_decoder(t, c, path, err, errlen); if (rc) return rc; }
        return 0;
    }
    tok_err(err, errlen, "%s: decoder type \"%s\" is not supported (supported: ByteLevel, Sequence)", path,
            ty ? ty : "(none)");
    return DF_EUNSUPPORTED;
}

/* Model-space bytes of a vocab string. */
static int model_bytes(const df_tokenizer *t, const char *s, tok_buf *b) {
    b->n = 0;
    if (t->byte_level) {
        int rc = tok_bytelevel_decode_str(s, strlen(s), b);
        if (rc == 0) return 0;
        if (rc == DF_ENOMEM) return rc;
        b->n = 0;
    }
    return tok_buf_put(b, s, strlen(s));
}

int tok_load_hf(df_tokenizer *t, const char *path, char *err, size_t errlen) {
    size_t len;
    char *txt = slurp(path, &len, err, errlen);
    if (!txt) return DF_EIO;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!root) { tok_err(err, errlen, "%s: not valid JSON (expected a Hugging Face tokenizer.json)", path); return DF_EFORMAT; }
    int rc = 0;
    tok_buf b = {0}, b2 = {0};
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mty = model ? jstr(model, "type") : NULL;
    if (!cJSON_IsObject(model)) {
        /* JSON, but not a tokenizer.json; a tokenizer_config.json (the tokenizer's settings) is the likely mix-up */
        const int is_cfg = cJSON_IsObject(root) && (cJSON_GetObjectItemCaseSensitive(root, "tokenizer_class") ||
                                                   cJSON_GetObjectItemCaseSensitive(root, "chat_template") ||
                                                   cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder"));
        tok_err(err, errlen, "%s is JSON but not a Hugging Face tokenizer.json: expected an object with a \"model\" object (the "
                "BPE vocabulary and merges)%s", path,
                is_cfg ? "; this looks like tokenizer_config.json (the tokenizer's settings), not the tokenizer itself"
                       : !cJSON_IsObject(root) ? ", not a JSON array, string or number" : "");
        rc = DF_EFORMAT;
        goto out;
    }
    if (!mty) mty = cJSON_GetObjectItemCaseSensitive(model, "merges") ? "BPE" : "(none)";
    if (strcmp(mty, "BPE")) {
        tok_err(err, errlen, "%s: model type \"%s\" is not supported (only BPE)", path, mty);
        rc = DF_EUNSUPPORTED; goto out;
    }
    const char *csp = jstr(model, "continuing_subword_prefix"), *ews = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (ews && *ews)) {
        tok_err(err, errlen, "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", path);
        rc = DF_EUNSUPPORTED; goto out;
    }
    const cJSON *dro = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dro) && dro->valuedouble > 0) {
        tok_err(err, errlen, "%s: BPE dropout %g is not supported (not deterministic)", path, dro->valuedouble);
        rc = DF_EUNSUPPORTED; goto out;
    }
    t->byte_level = mentions_type(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "ByteLevel") ||
                    mentions_type(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "ByteLevel");
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    t->byte_fallback = jbool(model, "byte_fallback", 0);

    if ((rc = add_norm(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), path, err, errlen))) goto out;
    if ((rc = add_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), path, err, errlen))) goto out;
    if ((rc = check_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), path, err, errlen))) goto out;

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) { tok_err(err, errlen, "%s: model.vocab is not an object", path); rc = DF_EFORMAT; goto out; }
    int nv = cJSON_GetArraySize(vocab);
    tok_map_init(&t->vocab, (size_t)nv);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2e9) {
            tok_err(err, errlen, "%s: model.vocab[\"%.60s\"] is not a valid id", path, e->string);
            rc = DF_EFORMAT; goto out;
        }
        int32_t id = (int32_t)e->valuedouble;
        if ((rc = model_bytes(t, e->string, &b))) goto out;
        if ((rc = tok_map_put(&t->vocab, b.p, b.n, id))) goto out;
        if ((rc = tok_set_token(t, id, b.p, b.n, 0))) goto out;
    }
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    if (t->byte_level) {
        for (int i = 0; i < 256; i++) { char c = (char)i; t->byte_id[i] = tok_map_get(&t->vocab, &c, 1); }
    } else if (t->byte_fallback) {
        for (int i = 0; i < 256; i++) {
            char nm[8];
            snprintf(nm, sizeof nm, "<0x%02X>", i);
            t->byte_id[i] = tok_map_get(&t->vocab, nm, strlen(nm));
            if (t->byte_id[i] >= 0) {
                char c = (char)i;
                tok_set_token(t, t->byte_id[i], &c, 1, 0);
            }
        }
    }
    const char *unk = jstr(model, "unk_token");
    t->unk_id = -1;
    if (unk) { if ((rc = model_bytes(t, unk, &b))) goto out; t->unk_id = tok_map_get(&t->vocab, b.p, b.n); }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int nm = cJSON_GetArraySize(merges);
    tok_pairs_init(&t->pairs, (size_t)nm + 16);
    if (!t->pairs.keys) { rc = DF_ENOMEM; goto out; }
    int rank = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a = NULL, *c = NULL;
        char *tmp = NULL;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring + (e->valuestring[0] ? 1 : 0), ' ');
            if (!sp) { tok_err(err, errlen, "%s: merge %d \"%.60s\" has no space", path, rank, e->valuestring); rc = DF_EFORMAT; goto out; }
            tmp = strdup(e->valuestring);
            tmp[sp - e->valuestring] = 0;
            a = tmp; c = tmp + (sp - e->valuestring) + 1;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring; c = cJSON_GetArrayItem(e, 1)->valuestring;
        } else { tok_err(err, errlen, "%s: merge %d is neither \"a b\" nor [a, b]", path, rank); rc = DF_EFORMAT; goto out; }
        if ((rc = model_bytes(t, a, &b)) || (rc = model_bytes(t, c, &b2))) { free(tmp); goto out; }
        int32_t ia = tok_map_get(&t->vocab, b.p, b.n), ib = tok_map_get(&t->vocab, b2.p, b2.n);
        tok_buf_put(&b, b2.p, b2.n);
        int32_t im = tok_map_get(&t->vocab, b.p, b.n);
        free(tmp);
        if (ia < 0 || ib < 0 || im < 0) {
            tok_err(err, errlen, "%s: merge %d refers to a token missing from the vocab", path, rank);
            rc = DF_EFORMAT; goto out;
        }
        if ((rc = tok_pairs_put(&t->pairs, ia, ib, rank, im))) goto out;
        rank++;
    }

    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int na = cJSON_GetArraySize(added);
    if (na > 0) {
        t->added = calloc((size_t)na, sizeof *t->added);
        if (!t->added) { rc = DF_ENOMEM; goto out; }
    }
    cJSON_ArrayForEach(e, added) {
        const char *content = jstr(e, "content");
        const cJSON *idj = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!content || !cJSON_IsNumber(idj)) { tok_err(err, errlen, "%s: added_tokens entry without content/id", path); rc = DF_EFORMAT; goto out; }
        tok_added *a = &t->added[t->n_added++];
        a->content = strdup(content);
        a->len = strlen(content);
        a->id = (int32_t)idj->valuedouble;
        a->special = jbool(e, "special", 0);
        a->lstrip = jbool(e, "lstrip", 0);
        a->rstrip = jbool(e, "rstrip", 0);
        a->normalized = jbool(e, "normalized", !a->special);
        a->single_word = jbool(e, "single_word", 0);
        if (a->len) t->added_first[(uint8_t)content[0]] = 1;
        /* Decoded bytes: HF's ByteLevel decoder maps the token's characters
         * through the byte alphabet when all of them belong to it; else raw. */
        b.n = 0;
        if (t->decoder == TOK_DEC_BYTELEVEL && tok_bytelevel_decode_str(content, a->len, &b) == 0) {
        } else { b.n = 0; tok_buf_put(&b, content, a->len); }
        if ((rc = tok_set_token(t, a->id, b.p, b.n, TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0)))) goto out;
    }
out:
    free(b.p); free(b2.p);
    cJSON_Delete(root);
    return rc;
}
