/* hub_http.c — hub.h: the mirror's base URL and token, single requests (small files, HEADs,
 * the listing) with retries, the file listing and the selection of what `setup` needs, and
 * the messages for HTTP statuses and network errors. */
#include "hub.h"
#include "deltafin.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include "hub_curl.h"
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int hub_init(hub_ctx *h, const char *mirror, const char *repo, const char *rev, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    const char *env = getenv("HF_ENDPOINT"), *tok = getenv("HF_TOKEN");
    const char *m = mirror && *mirror ? mirror : env && *env ? env : "https://huggingface.co";
    snprintf(h->mirror, sizeof h->mirror, "%s", m);
    size_t L = strlen(h->mirror);
    while (L > 0 && h->mirror[L - 1] == '/') h->mirror[--L] = 0;
    if (strncmp(h->mirror, "http://", 7) && strncmp(h->mirror, "https://", 8))
        return df_set_errc(err, errlen, DF_EINVAL, "mirror \"%s\" is not an http:// or https:// URL (from %s)", m,
                           mirror && *mirror ? "--mirror" : "HF_ENDPOINT");
    const char *slash = repo ? strchr(repo, '/') : NULL;
    if (!repo || !slash || slash == repo || !slash[1] || strchr(slash + 1, '/') || strlen(repo) >= sizeof h->repo ||
        strpbrk(repo, " ?#%"))
        return df_set_errc(err, errlen, DF_EINVAL, "repo \"%s\" is not a Hugging Face repo id (OWNER/NAME, e.g. moonshotai/Kimi-K2-Instruct)",
                           repo ? repo : "");
    snprintf(h->repo, sizeof h->repo, "%s", repo);
    snprintf(h->rev, sizeof h->rev, "%s", rev && *rev ? rev : "main");
    if (tok && *tok) snprintf(h->token, sizeof h->token, "%s", tok);
    h->retries = 4;
    if (!hub_curl_open(err, errlen)) return DF_EIO;
    return 0;
}

void hub_file_url(const hub_ctx *h, const char *file, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s/resolve/%s/%s", h->mirror, h->repo, h->rev, file);
}

/* hub_http_error for the expert fetches of a streamed install (h->streamed): run / serve / bench / warm asked for an
 * expert the install does not hold yet. Nothing was left half-done for setup to resume, and the mirror is the one the
 * install recorded (stream.json), not --mirror / HF_ENDPOINT: the expert is fetched again the next time a token needs
 * it, so the user retries (the request, or the command) once the mirror answers. Short: the store keeps 512 bytes of
 * a fetch's message, after "streaming expert E of layer L from MIRROR: ". 1 for the statuses setup's messages fit. */
static int streamed_http_error(const hub_ctx *h, long status, int cc, const char *cmsg, const char *url, const char *what,
                               char *err, size_t errlen) {
    static const char again[] = "the expert is fetched again the next time it is needed: retry once the mirror answers";
    if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY)
        return df_set_errc(err, errlen, DF_EIO, "cannot reach the mirror %s (%s): no network, or the mirror is down? check the "
                           "connection; %s", h->mirror, cmsg && *cmsg ? cmsg : hub_curl_api()->easy_strerror((CURLcode)cc), again);
    if (cc == CURLE_WRITE_ERROR && cmsg && *cmsg)
        return df_set_errc(err, errlen, DF_EIO, "%s", cmsg);
    if (cc)
        return df_set_errc(err, errlen, DF_EIO, "fetching from %s failed after %d tries: %s; %s", what, h->retries + 1,
                           cmsg && *cmsg ? cmsg : hub_curl_api()->easy_strerror((CURLcode)cc), again);
    if (status == 404)
        return df_set_errc(err, errlen, DF_EINVAL, "%s: 404 Not Found: %s is no longer in %s at revision %s on this mirror: "
                           "the experts this streamed install does not hold cannot be fetched until it is back", url, what,
                           h->repo, h->rev);
    if (status >= 500)
        return df_set_errc(err, errlen, DF_EIO, "%s: the mirror answered HTTP %ld after %d tries; %s", url, status, h->retries + 1,
                           again);
    return 1;
}

int hub_http_error(const hub_ctx *h, long status, int cc, const char *cmsg, const char *url, const char *what, char *err,
                   size_t errlen) {
    if (h->streamed[0]) {
        int rc = streamed_http_error(h, status, cc, cmsg, url, what, err, errlen);
        if (rc <= 0) return rc;
    }
    if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY)
        return df_set_errc(err, errlen, DF_EIO, "cannot reach the mirror %s (%s, for %s): no network, or the wrong mirror? "
                           "check the connection, --mirror or HF_ENDPOINT; `deltafin setup` resumes where it stopped", h->mirror,
                           cmsg && *cmsg ? cmsg : hub_curl_api()->easy_strerror((CURLcode)cc), url);
    if (cc == CURLE_WRITE_ERROR && cmsg && *cmsg)
        return df_set_errc(err, errlen, DF_EIO, "%s", cmsg);
    if (cc)
        return df_set_errc(err, errlen, DF_EIO, "download of %s failed after %d tries: %s (%s); run the same setup again to resume",
                           what, h->retries + 1, cmsg && *cmsg ? cmsg : hub_curl_api()->easy_strerror((CURLcode)cc), url);
    if (status == 401)
        return df_set_errc(err, errlen, DF_EINVAL, "%s: 401 Unauthorized: %s", url,
                           h->token[0] ? "the token in HF_TOKEN was refused; check that it is valid"
                                       : "the repo needs a token: set HF_TOKEN to an access token that can read it");
    if (status == 403)
        return df_set_errc(err, errlen, DF_EINVAL, "%s: 403 Forbidden: %s has no access to %s (accept the model's terms on the "
                           "hub, or set HF_TOKEN to a token that can read it)", url, h->token[0] ? "the token in HF_TOKEN" : "an anonymous request",
                           h->repo);
    if (status == 404)
        return df_set_errc(err, errlen, DF_EINVAL, "%s: 404 Not Found: %s is not in %s at revision %s on %s (check the repo id and --revision)",
                           url, what, h->repo, h->rev, h->mirror);
    if (status >= 500)
        return df_set_errc(err, errlen, DF_EIO, "%s: the mirror answered HTTP %ld after %d tries; try again later (setup resumes) "
                           "or use another --mirror", url, status, h->retries + 1);
    return df_set_errc(err, errlen, DF_EIO, "%s: unexpected HTTP %ld from the mirror for %s", url, status, what);
}

typedef struct {
    char *buf;
    size_t len, cap, limit;
} membuf;

static size_t mem_write(char *p, size_t sz, size_t nm, void *u) {
    membuf *m = u;
    size_t n = sz * nm;
    if (m->len + n + 1 > m->limit) return 0;
    if (m->len + n + 1 > m->cap) {
        size_t c = m->cap ? m->cap * 2 : 65536;
        while (c < m->len + n + 1) c *= 2;
        char *nb = realloc(m->buf, c);
        if (!nb) return 0;
        m->buf = nb;
        m->cap = c;
    }
    memcpy(m->buf + m->len, p, n);
    m->len += n;
    m->buf[m->len] = 0;
    return n;
}

typedef struct {
    char etag[160], linked_etag[160], error_code[160];
    uint64_t linked_size, content_length;
    int have_linked_size, have_length;
    int redirects;          /* status lines seen (1 = not redirected) */
} hdrs;

static void trim_copy(char *dst, size_t cap, const char *v, size_t n) {
    while (n && isspace((unsigned char)*v)) { v++; n--; }
    while (n && isspace((unsigned char)v[n - 1])) n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t hdr_cb(char *b, size_t sz, size_t nm, void *u) {
    hdrs *h = u;
    size_t n = sz * nm;
    if (n > 5 && !strncmp(b, "HTTP/", 5)) {
        /* a new response (after a redirect): its own ETag and length; the hub's X-Linked-* (sent with the
         * redirect to the storage backend) are kept */
        h->etag[0] = 0;
        h->error_code[0] = 0;
        h->content_length = 0;
        h->have_length = 0;
        h->redirects++;
    }
    const char *colon = memchr(b, ':', n);
    if (!colon) return n;
    size_t kl = (size_t)(colon - b);
    const char *v = colon + 1;
    size_t vl = n - kl - 1;
    char val[160];
    trim_copy(val, sizeof val, v, vl);
    if (kl == 4 && !strncasecmp(b, "etag", 4)) snprintf(h->etag, sizeof h->etag, "%s", val);
    else if (kl == 13 && !strncasecmp(b, "x-linked-etag", 13)) snprintf(h->linked_etag, sizeof h->linked_etag, "%s", val);
    else if (kl == 13 && !strncasecmp(b, "x-linked-size", 13)) { h->linked_size = strtoull(val, NULL, 10); h->have_linked_size = 1; }
    else if (kl == 14 && !strncasecmp(b, "content-length", 14)) { h->content_length = strtoull(val, NULL, 10); h->have_length = 1; }
    else if (kl == 12 && !strncasecmp(b, "x-error-code", 12)) snprintf(h->error_code, sizeof h->error_code, "%s", val);
    return n;
}

/* The common easy-handle settings: redirects, token, timeouts (a stalled transfer fails after
 * 30 s below 1 byte/s, so a dead connection is retried rather than waited on). */
void hub_easy_setup(const hub_ctx *h, void *easy, struct curl_slist **hl) {
    CURL *e = easy;
    hub_curl_api()->easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    hub_curl_api()->easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
    hub_curl_api()->easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    hub_curl_api()->easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 15L);
    hub_curl_api()->easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    hub_curl_api()->easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 30L);
    hub_curl_api()->easy_setopt(e, CURLOPT_USERAGENT, "deltafin/" DELTAFIN_VERSION);
    *hl = NULL;
    if (h->token[0]) {
        char a[1100];
        snprintf(a, sizeof a, "Authorization: Bearer %s", h->token);
        *hl = hub_curl_api()->slist_append(*hl, a);
        hub_curl_api()->easy_setopt(e, CURLOPT_HTTPHEADER, *hl);
    }
}

static void backoff(int attempt) {
    double s = 0.2 * (double)(1 << (attempt < 5 ? attempt : 5));
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* One request with retries on network errors and 5xx. Returns 0 with *status set for any
 * HTTP answer < 500 (the caller judges 4xx), or a mapped error. */
static int request(const hub_ctx *h, const char *url, int head, membuf *body, hdrs *hd, long *status, const char *what,
                   char *err, size_t errlen, int follow) {
    char cmsg[CURL_ERROR_SIZE];
    int cc = 0;
    for (int attempt = 0;; attempt++) {
        CURL *e = hub_curl_api()->easy_init();
        if (!e) return df_set_errc(err, errlen, DF_ENOMEM, "libcurl: cannot create a handle");
        struct curl_slist *hl;
        hub_easy_setup(h, e, &hl);
        cmsg[0] = 0;
        memset(hd, 0, sizeof *hd);
        if (body) { body->len = 0; if (body->buf) body->buf[0] = 0; }
        hub_curl_api()->easy_setopt(e, CURLOPT_URL, url);
        hub_curl_api()->easy_setopt(e, CURLOPT_ERRORBUFFER, cmsg);
        hub_curl_api()->easy_setopt(e, CURLOPT_HEADERFUNCTION, hdr_cb);
        hub_curl_api()->easy_setopt(e, CURLOPT_HEADERDATA, hd);
        hub_curl_api()->easy_setopt(e, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
        if (head) hub_curl_api()->easy_setopt(e, CURLOPT_NOBODY, 1L);
        else {
            hub_curl_api()->easy_setopt(e, CURLOPT_WRITEFUNCTION, mem_write);
            hub_curl_api()->easy_setopt(e, CURLOPT_WRITEDATA, body);
        }
        cc = (int)hub_curl_api()->easy_perform(e);
        *status = 0;
        hub_curl_api()->easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
        hub_curl_api()->easy_cleanup(e);
        hub_curl_api()->slist_free_all(hl);
        if (h->verbose) fprintf(stderr, "hub: %s %s -> %ld%s%s\n", head ? "HEAD" : "GET", url, *status, cc ? " " : "", cc ? cmsg : "");
        if (!cc && *status < 500) return 0;
        if (cc == CURLE_WRITE_ERROR && body && body->len + 1 >= body->limit)
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: larger than %zu bytes; not a file setup reads whole", url, body->limit);
        if (attempt >= h->retries) break;
        backoff(attempt);
    }
    return hub_http_error(h, *status, cc, cmsg, url, what, err, errlen);
}

int hub_get_file(const hub_ctx *h, const char *file, char **out, size_t *len, char *err, size_t errlen) {
    char url[2048];
    hub_file_url(h, file, url, sizeof url);
    membuf b = {0};
    b.limit = (size_t)256 << 20;
    hdrs hd;
    long st;
    int rc = request(h, url, 0, &b, &hd, &st, file, err, errlen, 1);
    if (!rc && st != 200) rc = hub_http_error(h, st, 0, NULL, url, file, err, errlen);
    if (rc) { free(b.buf); return rc; }
    if (!b.buf) b.buf = calloc(1, 1);
    *out = b.buf;
    if (len) *len = b.len;
    return 0;
}

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

/* An ETag value (possibly W/"...", quoted) -> bare lowercase text. */
static void etag_bare(const char *in, char *out, size_t cap) {
    if (!strncmp(in, "W/", 2)) in += 2;
    if (*in == '"') in++;
    snprintf(out, cap, "%s", in);
    size_t L = strlen(out);
    if (L && out[L - 1] == '"') out[L - 1] = 0;
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
}

/* HEAD one file: size (X-Linked-Size, else Content-Length) and sha256 (X-Linked-Etag, else ETag, when 64 hex),
 * or the git blob id (40 hex) into f->sha1. 1 = absent (404), 0 = found, <0 error. */
int hub_head(const hub_ctx *h, const char *file, hub_file *f, char *err, size_t errlen) {
    char url[2048];
    hub_file_url(h, file, url, sizeof url);
    hdrs hd;
    long st;
    /* not following a redirect first: the hub sends X-Linked-Size / X-Linked-Etag with the redirect of an LFS file */
    int rc = request(h, url, 1, NULL, &hd, &st, file, err, errlen, 0);
    if (rc) return rc;
    if (st >= 300 && st < 400 && !hd.have_linked_size && (rc = request(h, url, 1, NULL, &hd, &st, file, err, errlen, 1)))
        return rc;
    if (st == 404) return 1;
    if (st != 200 && !(st >= 300 && st < 400)) return hub_http_error(h, st, 0, NULL, url, file, err, errlen);
    snprintf(f->name, sizeof f->name, "%s", file);
    f->size = hd.have_linked_size ? hd.linked_size : hd.content_length;
    char tag[160];
    etag_bare(hd.linked_etag[0] ? hd.linked_etag : hd.etag, tag, sizeof tag);
    f->sha256[0] = 0;
    if (is_hex(tag, 64)) snprintf(f->sha256, sizeof f->sha256, "%.64s", tag);
    f->sha1[0] = 0;
    if (is_hex(tag, 40)) snprintf(f->sha1, sizeof f->sha1, "%.40s", tag);
    return 0;
}

static int add_file(hub_file **fs, int *n, int *cap, const char *name, uint64_t size, const char *sha) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*fs)[i].name, name)) return 0;
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 32;
        hub_file *nf = realloc(*fs, sizeof(hub_file) * (size_t)c);
        if (!nf) return -1;
        *fs = nf;
        *cap = c;
    }
    hub_file *f = &(*fs)[(*n)++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->size = size;
    if (sha && is_hex(sha, 64)) {
        snprintf(f->sha256, sizeof f->sha256, "%s", sha);
        for (char *p = f->sha256; *p; p++) *p = (char)tolower((unsigned char)*p);
    }
    return 0;
}

static const char *const small_files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                          "tiktoken.model", "special_tokens_map.json", "chat_template.jinja", "README.md",
                                          "model.safetensors.index.json"};

int hub_list(const hub_ctx *h, hub_file **files, int *n, char *err, size_t errlen) {
    *files = NULL;
    *n = 0;
    int cap = 0, rc;
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", h->mirror, h->repo, h->rev);
    membuf b = {0};
    b.limit = (size_t)64 << 20;
    hdrs hd;
    long st;
    if ((rc = request(h, url, 0, &b, &hd, &st, "the file listing", err, errlen, 1))) { free(b.buf); return rc; }
    if (st == 401 || st == 403) { free(b.buf); return hub_http_error(h, st, 0, NULL, url, "the file listing", err, errlen); }
    if (st == 200) {
        cJSON *root = cJSON_Parse(b.buf ? b.buf : "");
        const cJSON *sib = root ? cJSON_GetObjectItemCaseSensitive(root, "siblings") : NULL;
        if (!cJSON_IsArray(sib)) {
            cJSON_Delete(root);
            free(b.buf);
            return df_set_errc(err, errlen, DF_EFORMAT, "%s: not a model listing (no \"siblings\" array)", url);
        }
        const cJSON *s;
        cJSON_ArrayForEach(s, sib) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
            if (!cJSON_IsString(fn)) continue;
            const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
            const cJSON *sz = cJSON_GetObjectItemCaseSensitive(lfs ? lfs : s, "size");
            if (!sz && lfs) sz = cJSON_GetObjectItemCaseSensitive(s, "size");
            const cJSON *sha = lfs ? cJSON_GetObjectItemCaseSensitive(lfs, "sha256") : NULL;
            const cJSON *blob = lfs ? NULL : cJSON_GetObjectItemCaseSensitive(s, "blobId");
            if (add_file(files, n, &cap, fn->valuestring, cJSON_IsNumber(sz) ? (uint64_t)sz->valuedouble : 0,
                         cJSON_IsString(sha) ? sha->valuestring : NULL)) {
                cJSON_Delete(root);
                free(b.buf);
                return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
            }
            if (cJSON_IsString(blob) && is_hex(blob->valuestring, 40)) {
                hub_file *last = &(*files)[*n - 1];
                if (!strcmp(last->name, fn->valuestring)) {
                    snprintf(last->sha1, sizeof last->sha1, "%.40s", blob->valuestring);
                    for (char *q = last->sha1; *q; q++) *q = (char)tolower((unsigned char)*q);
                }
            }
        }
        cJSON_Delete(root);
        free(b.buf);
        return 0;
    }
    free(b.buf);
    /* no listing API: the index names the shards; HEADs give sizes and hashes */
    char *idx = NULL;
    hub_file f;
    rc = hub_get_file(h, "model.safetensors.index.json", &idx, NULL, err, errlen);
    if (rc == DF_EINVAL && strstr(err, " 404 ")) {
        int hr = hub_head(h, "config.json", &f, err, errlen);
        if (hr < 0) return hr;
        if (hr == 1) {
            /* repo or revision? the repo's own API entry tells where the mirror has one */
            snprintf(url, sizeof url, "%s/api/models/%s", h->mirror, h->repo);
            membuf b2 = {0};
            b2.limit = (size_t)16 << 20;
            long st2 = 0;
            int r2 = request(h, url, 0, &b2, &hd, &st2, "the repo", err, errlen, 1);
            free(b2.buf);
            if (!r2 && st2 == 200)
                return df_set_errc(err, errlen, DF_EINVAL, "revision \"%s\" not found in %s on %s (check --revision)", h->rev, h->repo, h->mirror);
            return df_set_errc(err, errlen, DF_EINVAL, "repo %s not found on %s at revision %s (no config.json; check the repo id%s)",
                               h->repo, h->mirror, h->rev, strcmp(h->rev, "main") ? " and --revision" : "");
        }
        rc = add_file(files, n, &cap, "model.safetensors", 0, NULL);
    } else if (rc) return rc;
    else {
        cJSON *root = cJSON_Parse(idx);
        const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            cJSON_Delete(root);
            free(idx);
            return df_set_errc(err, errlen, DF_EFORMAT, "model.safetensors.index.json of %s: no \"weight_map\" object", h->repo);
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, wm) if (cJSON_IsString(e)) add_file(files, n, &cap, e->valuestring, 0, NULL);
        cJSON_Delete(root);
        free(idx);
    }
    for (size_t i = 0; i < sizeof small_files / sizeof small_files[0]; i++) add_file(files, n, &cap, small_files[i], 0, NULL);
    /* sizes + hashes by HEAD; drop what the mirror does not have */
    int k = 0;
    for (int i = 0; i < *n; i++) {
        char name[512];
        snprintf(name, sizeof name, "%s", (*files)[i].name);
        int hr = hub_head(h, name, &f, err, errlen);
        if (hr < 0) { free(*files); *files = NULL; *n = 0; return hr; }
        if (hr == 1) {
            if (strstr(name, ".safetensors") && !strstr(name, ".index.json")) {
                free(*files); *files = NULL; *n = 0;
                return df_set_errc(err, errlen, DF_EINVAL, "%s names shard %s, which %s does not have at revision %s",
                                   "model.safetensors.index.json", name, h->mirror, h->rev);
            }
            continue;
        }
        (*files)[k++] = f;
    }
    *n = k;
    return 0;
}

static int wanted_small(const char *n) {
    for (size_t i = 0; i < sizeof small_files / sizeof small_files[0]; i++)
        if (!strcmp(n, small_files[i])) return 1;
    return 0;
}

static int vision_tensor(const char *t) {
    return !strncmp(t, "vision_tower", 12) || !strncmp(t, "vision_model", 12) || !strncmp(t, "visual.", 7) ||
           !strncmp(t, "mm_projector", 12) || !strncmp(t, "multi_modal_projector", 21);
}

int hub_select(hub_file *files, int n, const char *index_json, int include_draft) {
    cJSON *root = index_json ? cJSON_Parse(index_json) : NULL;
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = files[i].name;
        const char *base = strrchr(nm, '/');
        base = base ? base + 1 : nm;
        int draft = !strncmp(nm, "draft/", 6);
        if (draft && !include_draft) continue;
        int keep;
        size_t L = strlen(base);
        if (L > 12 && !strcmp(base + L - 12, ".safetensors")) {
            keep = 1;
            if (cJSON_IsObject(wm) && !draft) {
                int any = 0, other = 0;
                const cJSON *e;
                cJSON_ArrayForEach(e, wm) {
                    if (!cJSON_IsString(e) || strcmp(e->valuestring, nm)) continue;
                    any = 1;
                    if (!vision_tensor(e->string)) other = 1;
                }
                keep = any && other; /* only shards the index names, and not those holding vision tensors only */
            }
        } else keep = wanted_small(base) && (draft || strchr(nm, '/') == NULL);
        if (keep) files[k++] = files[i];
    }
    cJSON_Delete(root);
    return k;
}

int hub_get_range(const hub_ctx *h, const char *file, uint64_t off, uint64_t len, void *dst, const char *sha256, char *err,
                  size_t errlen) {
    char url[2048], range[64];
    hub_file_url(h, file, url, sizeof url);
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
    membuf b = {0};
    b.limit = (size_t)len + 2;
    char cmsg[CURL_ERROR_SIZE];
    int cc = 0;
    long st = 0;
    hdrs hd;
    for (int attempt = 0;; attempt++) {
        CURL *e = hub_curl_api()->easy_init();
        if (!e) return df_set_errc(err, errlen, DF_ENOMEM, "libcurl: cannot create a handle");
        struct curl_slist *hl;
        hub_easy_setup(h, e, &hl);
        cmsg[0] = 0;
        b.len = 0;
        memset(&hd, 0, sizeof hd);
        hub_curl_api()->easy_setopt(e, CURLOPT_URL, url);
        hub_curl_api()->easy_setopt(e, CURLOPT_RANGE, range);
        hub_curl_api()->easy_setopt(e, CURLOPT_ERRORBUFFER, cmsg);
        hub_curl_api()->easy_setopt(e, CURLOPT_HEADERFUNCTION, hdr_cb);
        hub_curl_api()->easy_setopt(e, CURLOPT_HEADERDATA, &hd);
        hub_curl_api()->easy_setopt(e, CURLOPT_WRITEFUNCTION, mem_write);
        hub_curl_api()->easy_setopt(e, CURLOPT_WRITEDATA, &b);
        cc = (int)hub_curl_api()->easy_perform(e);
        st = 0;
        hub_curl_api()->easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
        hub_curl_api()->easy_cleanup(e);
        hub_curl_api()->slist_free_all(hl);
        if (h->verbose) fprintf(stderr, "hub: GET %s bytes %s -> %ld\n", url, range, st);
        if (!cc && st == 206 && b.len == len) break;
        if (!cc && st == 200) { free(b.buf); return
            df_set_errc(err, errlen, DF_EUNSUPPORTED, "the mirror %s does not support HTTP Range requests (200 to a request "
                        "for bytes %s of %s): streamed installs fetch experts by range; use --full or another --mirror", h->mirror, range, file); }
        if (!cc && st >= 400 && st < 500) { free(b.buf); return hub_http_error(h, st, 0, NULL, url, file, err, errlen); }
        if (attempt >= h->retries) {
            free(b.buf);
            if (cc) return hub_http_error(h, 0, cc, cmsg, url, file, err, errlen);
            if (st >= 500) return hub_http_error(h, st, 0, NULL, url, file, err, errlen);
            return df_set_errc(err, errlen, DF_EIO, "%s bytes %s: got %zu bytes (HTTP %ld), expected %llu", url, range, b.len, st,
                               (unsigned long long)len);
        }
        backoff(attempt);
    }
    /* the file's identity: X-Linked-Etag (the hub's sha256), else the ETag of an answer that was not redirected
     * (a storage backend's ETag need not be the sha256) */
    char tag[160] = "";
    if (hd.linked_etag[0]) etag_bare(hd.linked_etag, tag, sizeof tag);
    else if (hd.redirects <= 1) etag_bare(hd.etag, tag, sizeof tag);
    if (sha256 && sha256[0] && is_hex(tag, 64) && strcmp(tag, sha256)) {
        free(b.buf);
        if (h->streamed[0]) /* setup --stream again over it would only check what it holds: a new install is needed */
            return df_set_errc(err, errlen, DF_EFORMAT, "%s changed on the mirror (sha256 %.12s..., the install's %.12s...): this "
                               "streamed install cannot fetch its missing experts from it; install it again elsewhere: "
                               "`deltafin setup %s --stream --dir NEW_DIR` (--revision COMMIT pins a version)", url, tag, sha256,
                               h->repo);
        return df_set_errc(err, errlen, DF_EFORMAT, "%s changed on the mirror: its sha256 is now %s, the install was made from %s; "
                           "run `deltafin setup %s` again", url, tag, sha256, h->repo);
    }
    memcpy(dst, b.buf, len);
    free(b.buf);
    return 0;
}
