/*
 * hub.h — a client for Hugging Face-compatible model mirrors (libcurl), used by `deltafin setup`.
 *
 * HTTP layout (the hub's, served by any mirror): a file is GET MIRROR/REPO/resolve/REV/FILE
 * (Range requests for parts; LFS files carry X-Linked-Size and ETag / X-Linked-Etag = the
 * file's sha256); the file listing is GET MIRROR/api/models/REPO/revision/REV?blobs=true
 * ({"siblings": [{"rfilename", "size", "lfs": {"sha256", "size"}}]}); where a mirror has no
 * listing API, model.safetensors.index.json names the shards and a HEAD of each gives its
 * size and sha256. A token from $HF_TOKEN is sent as "Authorization: Bearer TOKEN".
 *
 * Errors (DF_E* with a one-line message naming the URL and what to do): DF_EIO for the
 * network (no connection, a drop after every retry, 5xx after every retry, disk full),
 * DF_EINVAL for 401 / 403 (the token) and 404 (repo, revision or file), DF_EUNSUPPORTED for
 * a mirror without Range support, DF_EFORMAT for a sha256 mismatch or a malformed listing.
 */
#ifndef DF_HUB_H
#define DF_HUB_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char mirror[512];   /* base URL, no trailing slash */
    char repo[256];     /* owner/name */
    char rev[128];      /* branch, tag or commit */
    char token[1024];   /* "" = none */
    int retries;        /* extra tries of a failed request (network error, 5xx) */
    int verbose;
    /* "" for setup's downloads; for the expert fetches of a streamed install (stream.h: run, serve, bench, warm), its
     * native directory: the error messages then say what to do in that case (retry once the mirror answers: a failed
     * fetch is tried again at the next need; nothing is left for setup to resume, and the mirror is the one the install
     * recorded, not --mirror / HF_ENDPOINT) */
    char streamed[1024];
} hub_ctx;

typedef struct {
    char name[512];     /* path inside the repo */
    uint64_t size;      /* bytes; 0 = unknown until a HEAD */
    char sha256[65];    /* LFS files: lowercase hex; "" = none known (small git files) */
    char sha1[41];      /* small (git) files: the git blob id (sha1 of "blob SIZE\0" + bytes); "" = unknown */
} hub_file;

/* mirror NULL/"" -> $HF_ENDPOINT, else https://huggingface.co; rev NULL -> "main"; token from
 * $HF_TOKEN. Opens libcurl once (hub_curl.h; DF_EIO when it cannot). DF_EINVAL for a malformed repo id (needs
 * owner/name). */
int hub_init(hub_ctx *h, const char *mirror, const char *repo, const char *rev, char *err, size_t errlen);

/* MIRROR/REPO/resolve/REV/FILE into out. */
void hub_file_url(const hub_ctx *h, const char *file, char *out, size_t cap);

/* GET a whole small file of the repo into a malloc'd NUL-terminated buffer (retries as above).
 * 404 -> DF_EINVAL "FILE not found in REPO at revision REV (URL)"; other errors as above. */
int hub_get_file(const hub_ctx *h, const char *file, char **body, size_t *len, char *err, size_t errlen);

/* The files of the repo at the revision (listing API, else the safetensors index + HEADs).
 * *files malloc'd. 404 everywhere -> DF_EINVAL naming repo and revision. */
int hub_list(const hub_ctx *h, hub_file **files, int *n, char *err, size_t errlen);

/* HEAD one file of the repo: f gets its name, size (X-Linked-Size, else Content-Length) and sha256
 * (X-Linked-Etag, else ETag, when it is 64 hex digits) or its git blob id f->sha1 (an ETag of 40 hex
 * digits). 0 found, 1 absent (404), <0 DF_E* as above. */
int hub_head(const hub_ctx *h, const char *file, hub_file *f, char *err, size_t errlen);

/* libcurl easy-handle settings every request uses (redirects, token header into *hl, timeouts). */
struct curl_slist;
void hub_easy_setup(const hub_ctx *h, void *easy, struct curl_slist **hl);

/* Which files `setup` needs: config / tokenizer / generation files, the model card, the index
 * and every .safetensors shard the index names, except shards holding only vision tensors
 * (needs the index text; NULL = keep every shard) and, without include_draft, files under draft/.
 * Compacts files[] in place; returns the new count. */
int hub_select(hub_file *files, int n, const char *index_json, int include_draft);

/* Mapped message for an HTTP status or a libcurl error of `url` (what = "listing", a file name, ...). */
int hub_http_error(const hub_ctx *h, long status, int curl_code, const char *curl_msg, const char *url, const char *what,
                   char *err, size_t errlen);

/* GET bytes [off, off + len) of a repo file into dst (exactly len bytes or an error; retries as above).
 * sha256 (may be NULL/""): the file's expected sha256; an answer whose ETag names another is DF_EFORMAT
 * (the file changed on the mirror). A 200 answer is DF_EUNSUPPORTED (no Range support). */
int hub_get_range(const hub_ctx *h, const char *file, uint64_t off, uint64_t len, void *dst, const char *sha256, char *err,
                  size_t errlen);

/* ---- downloads (hub_download.c) ---- */
typedef struct {
    int connections;         /* parallel ranged requests (default 8) */
    uint64_t chunk_bytes;    /* bytes per ranged request (default 16M) */
    int quiet;               /* no progress lines */
    int tty;                 /* stderr is a terminal (hub_dl_opts_default sets it from isatty(2)): the progress line is
                                rewritten in place ("\r") twice a second; else (a log file, a pipe) a plain line every
                                5 s, the first at 5 s, with no "\r" or padding */
    int hash_threads;        /* SHA-256 threads, one file each at a time; 0 = auto (cores - 1, 1..4) */
    int defer_sync;          /* 1: leave the verified files unsynced (the caller calls hub_sync_verified or
                                hub_remove_download for each); 0: hub_download syncs them before it returns */
    int writeback;           /* hand each hashed range to writeback at once (sync_file_range): the final sync then
                                finds the bytes (nearly) on the disk, at some cost to the download's own speed */
    /* results */
    uint64_t bytes_fetched;  /* body bytes received this run */
    uint64_t bytes_present;  /* bytes already on disk from an earlier run (resumed or complete) */
    int retries_used;        /* failed requests retried */
    int rechecked_ok;        /* files an earlier run verified but did not sync, re-hashed from the disk: kept */
    int rechecked_bad;       /* ... whose sha256 on the disk did not match: downloaded again */
    double seconds;          /* wall time of the download: every file verified and at its final name */
    uint64_t synced_bytes;   /* without defer_sync: bytes made durable by the final sync */
    double sync_seconds;     /* ... and its wall time */
} hub_dl_opts;

void hub_dl_opts_default(hub_dl_opts *o);

/* Download files[0..n-1] into dir (subdirectories created) in parallel ranged requests.
 * Each file is written to FILE.partial with a sidecar FILE.partial.state (sizes + bytes done per
 * chunk, updated as bytes land), so a run killed at any point resumes where it stopped without
 * fetching a byte twice. A file gets its final name only after its sha256 (LFS) or git blob id
 * (small files: sha1 of "blob SIZE\0" + bytes, from the listing's blobId or the ETag) matched.
 * A file checked by its sha256 is renamed before its bytes are known to be on the disk: its sidecar,
 * marked "verified, not yet synced" (durably, before the rename), stays until hub_sync_verified (or
 * hub_remove_download); a run that finds such a file re-hashes it from the disk first and keeps it
 * (not downloaded again) or, when the disk lost some of its bytes, downloads it again. Files checked
 * by their git blob id are fsynced before their rename. A file already at its final name with the
 * right size and no sidecar is kept. A sha256 mismatch removes the partial file (DF_EFORMAT naming
 * file, expected and found hashes). Progress: one line per file when it completes and an overall
 * line (bytes, rate, ETA, current files) on stderr. */
int hub_download(const hub_ctx *h, const hub_file *files, int n, const char *dir, hub_dl_opts *o, char *err,
                 size_t errlen);

/* Make every file of files[] in dir that is marked "verified, not yet synced" durable: fdatasync of
 * each (in parallel threads), an fsync of their directories, then their sidecars removed. *bytes /
 * *seconds (either may be NULL): what was synced and how long it took. DF_EIO naming the file (its
 * sidecar then stays, so the next setup re-checks it). */
int hub_sync_verified(const hub_file *files, int n, const char *dir, uint64_t *bytes, double *seconds, char *err,
                      size_t errlen);

/* Remove dir/name and then its sidecar (a downloaded file no longer needed, synced or not). DF_EIO naming it. */
int hub_remove_download(const char *dir, const char *name, char *err, size_t errlen);

/* Turn the file at `path` (size bytes, already holding some of its bytes) into path.partial with a
 * sidecar saying which bytes are there: done[i] = bytes present from the start of chunk i (chunk bytes
 * each), so hub_download resumes it and fetches only the rest. DF_EIO naming the file. */
int hub_seed_partial(const char *path, uint64_t size, const char *sha256, uint64_t chunk, const uint64_t *done,
                     uint64_t nchunks, char *err, size_t errlen);

/* sha256 of a whole file as lowercase hex. DF_EIO naming it. */
int hub_sha256_file(const char *path, char out[65], char *err, size_t errlen);

#endif
