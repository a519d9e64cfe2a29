/* hub_download.c — hub_download (hub.h): parallel ranged, resumable downloads through one
 * libcurl multi handle, and the deferred sync of the verified files (hub_sync_verified).
 *
 * Every file is cut into chunks of chunk_bytes; up to `connections` chunks are in flight at
 * once, round-robin over as many files (in listing order) as there are hashing threads. Bytes are written with pwrite straight into
 * FILE.partial at their offset (preallocated, so a full disk fails before the transfer); the
 * sidecar FILE.partial.state holds a header (magic, file size, chunk size, sha256) and
 * one u64 per chunk: the bytes of that chunk already written, updated after each write. A run
 * killed at any point (kill -9 included: both files are in the page cache) resumes every chunk
 * at its first missing byte. A hashing thread follows each file's contiguous written prefix
 * (reading it back from the page cache), so the sha256 is ready about when the last byte lands.
 *
 * A finished file whose sha256 matches is renamed to its final name without waiting for its
 * bytes to reach the disk: first its sidecar's magic becomes "verified, not yet synced" and the
 * sidecar is fsynced, then FILE.partial is renamed to FILE. The sidecar stays until the data is
 * known durable (hub_sync_verified: every such file fdatasynced in parallel threads, then the
 * sidecars removed) or the file is removed unsynced (hub_remove_download). A run that finds FILE
 * (or FILE.partial) with a "verified, not yet synced" sidecar re-hashes it from the disk before
 * anything is downloaded: a match is kept (not downloaded again), a mismatch (a power loss lost
 * some of its pages) is downloaded again from scratch. Files without a sha256 (small git files,
 * checked by their blob id) are fdatasynced before their rename. */
#define _GNU_SOURCE
#include "hub.h"
#include "deltafin.h"
#include "util/util.h"

#include "hub_curl.h"
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_HDR 88 /* magic 8 + size 8 + chunk 8 + sha256 hex 64 */
/* sidecar magics: a download in progress, and a whole file whose sha256 matched, renamed (or about to be)
 * to its final name, whose bytes are not yet known to be on the disk */
static const char MAGIC_PARTIAL[8] = {'D', 'F', 'D', 'L', '1', 0, 0, 0};
static const char MAGIC_UNSYNCED[8] = {'D', 'F', 'D', 'L', '1', 'v', 'u', 0};

void hub_dl_opts_default(hub_dl_opts *o) {
    memset(o, 0, sizeof *o);
    o->connections = 8;
    o->chunk_bytes = (uint64_t)16 << 20;
    o->tty = isatty(2) != 0;
}

int hub_sha256_file(const char *path, char out[65], char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = (size_t)4 << 20;
    unsigned char *buf = malloc(cap);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!buf || !c) { free(buf); EVP_MD_CTX_free(c); close(fd); return df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); }
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = df_set_errc(err, errlen, DF_EIO, "cannot read %s: %s", path, strerror(errno)); break; }
        if (r == 0) break;
        EVP_DigestUpdate(c, buf, (size_t)r);
    }
    unsigned char md[32];
    unsigned int mdl = 0;
    EVP_DigestFinal_ex(c, md, &mdl);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(c);
    free(buf);
    close(fd);
    return rc;
}

typedef struct {
    const hub_file *f;
    char final_path[4096], part_path[4200], state_path[4300];
    int fd, sfd;
    uint64_t chunk, nchunks, next_chunk, remaining; /* remaining: chunks not complete */
    uint64_t *done;                                 /* [nchunks] bytes of each chunk written (atomic: the hasher reads) */
    int active, finished;
    int recheck;                                    /* 1: FILE, 2: FILE.partial holds a verified, unsynced download to re-hash */
    /* sha256 of the written prefix [0, hashed), by the hashing thread */
    uint64_t hashed;
    int hash_state;                                 /* 0 pending, 1 digest ready, -1 read error (hash_msg) */
    char digest[65], hash_msg[800];
} dl_file;

enum { HASH_THREADS_MAX = 4 };

typedef struct {
    dl_file *fs;
    int n, stop;
    int writeback;                                  /* hand each hashed range to writeback (sync_file_range) */
    int next;                                       /* the next file a hashing thread claims (atomic) */
    pthread_mutex_t mu;
    pthread_cond_t cv;                              /* a file's digest is ready */
} hasher;

/* A hashing thread: claims the files one at a time, in order (several threads hash several files at
 * once: a file's SHA-256 is one sequential stream, slower than the download on some CPUs); for each,
 * the bytes from `hashed` up to the end of the written prefix, in 4 MiB reads; waits 1 ms when nothing
 * new is written. With writeback, each hashed range is handed to writeback at once. */
static void *hash_main(void *arg) {
    hasher *H = arg;
    size_t cap = (size_t)4 << 20;
    unsigned char *buf = malloc(cap);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    for (;;) {
        const int i = __atomic_fetch_add(&H->next, 1, __ATOMIC_ACQ_REL);
        if (i >= H->n) break;
        dl_file *df = &H->fs[i];
        if (__atomic_load_n(&df->hash_state, __ATOMIC_ACQUIRE) != 0) continue;
        EVP_DigestInit_ex(c, EVP_sha256(), NULL);
        int st = 1;
        while (df->hashed < df->f->size) {
            if (__atomic_load_n(&H->stop, __ATOMIC_ACQUIRE)) goto out;
            uint64_t ci = df->hashed / df->chunk;
            uint64_t avail = ci * df->chunk + __atomic_load_n(&df->done[ci], __ATOMIC_ACQUIRE);
            if (avail <= df->hashed) {
                struct timespec ts = {0, 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            size_t len = (size_t)(avail - df->hashed < cap ? avail - df->hashed : cap);
            if (!buf || !c || df_pread_all(df->fd, buf, len, df->hashed)) {
                snprintf(df->hash_msg, sizeof df->hash_msg, "cannot read back %s to hash it: %s", df->f->name,
                         buf && c ? strerror(errno) : "out of memory");
                st = -1;
                break;
            }
            EVP_DigestUpdate(c, buf, len);
            /* a hint: its failure changes nothing (hub_sync_verified's fdatasync decides) */
            if (H->writeback) (void)sync_file_range(df->fd, (off64_t)df->hashed, (off64_t)len, SYNC_FILE_RANGE_WRITE);
            df->hashed += len;
        }
        if (st == 1) {
            unsigned char md[32];
            unsigned int mdl = 0;
            EVP_DigestFinal_ex(c, md, &mdl);
            for (int k = 0; k < 32; k++) snprintf(df->digest + 2 * k, 3, "%02x", md[k]);
        }
        pthread_mutex_lock(&H->mu);
        __atomic_store_n(&df->hash_state, st, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&H->cv);
        pthread_mutex_unlock(&H->mu);
    }
out:
    EVP_MD_CTX_free(c);
    free(buf);
    return NULL;
}

typedef struct retry_item {
    dl_file *df;
    uint64_t ci;
    int tries;
    double not_before;
    struct retry_item *next;
} retry_item;

enum { XF_OK = 0, XF_RETRY, XF_FATAL };

typedef struct {
    CURL *e;
    struct curl_slist *hl;
    dl_file *df;
    uint64_t ci, pos, end; /* absolute file offsets: next byte, one past the last */
    int checked, tries;
    int fail;              /* XF_* decided inside the write callback */
    long status;
    char msg[4800];
    char cerr[CURL_ERROR_SIZE];
    hub_dl_opts *o;
} xfer;

static size_t on_data(char *p, size_t sz, size_t nm, void *u) {
    xfer *x = u;
    size_t n = sz * nm;
    dl_file *df = x->df;
    uint64_t c0 = x->ci * df->chunk;
    if (!x->checked) {
        long st = 0;
        hub_curl_api()->easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &st);
        x->status = st;
        if (st == 200 && !(x->pos == 0 && x->end == df->f->size)) {
            x->fail = XF_FATAL;
            snprintf(x->msg, sizeof x->msg, "the mirror does not support HTTP Range requests (it answered 200 with the whole "
                     "file to a request for bytes %llu-%llu of %s); setup needs ranged downloads to resume and to run in "
                     "parallel: use a mirror that supports them (--mirror / HF_ENDPOINT)",
                     (unsigned long long)x->pos, (unsigned long long)(x->end - 1), df->f->name);
            return 0;
        }
        if (st != 206 && st != 200) { x->fail = st >= 500 ? XF_RETRY : XF_FATAL; return 0; }
        x->checked = 1;
    }
    if (x->pos + n > x->end) {
        x->fail = XF_FATAL;
        snprintf(x->msg, sizeof x->msg, "the mirror sent more bytes of %s than the range asked for (%llu-%llu): it does "
                 "not handle Range requests correctly; use another --mirror", df->f->name, (unsigned long long)x->pos,
                 (unsigned long long)(x->end - 1));
        return 0;
    }
    int r = df_pwrite_all(df->fd, p, n, x->pos);
    if (r) {
        x->fail = XF_FATAL;
        snprintf(x->msg, sizeof x->msg, "cannot write %s: %s%s", df->part_path, strerror(-r),
                 r == -ENOSPC ? " (disk full: free space or choose another --dir; setup resumes where it stopped)" : "");
        return 0;
    }
    x->pos += n;
    __atomic_store_n(&df->done[x->ci], x->pos - c0, __ATOMIC_RELEASE);
    if (df_pwrite_all(df->sfd, &df->done[x->ci], 8, STATE_HDR + 8 * x->ci)) {
        x->fail = XF_FATAL;
        snprintf(x->msg, sizeof x->msg, "cannot write %s: %s", df->state_path, strerror(errno));
        return 0;
    }
    x->o->bytes_fetched += n;
    return n;
}

/* Open or create FILE.partial + its sidecar. A sidecar whose header matches the file (size,
 * sha256) is resumed with the chunk size it was written with, whatever --chunk is now. */
static int open_partial(dl_file *df, char *err, size_t errlen) {
    const hub_file *f = df->f;
    unsigned char hdr[STATE_HDR];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, MAGIC_PARTIAL, 8);
    memcpy(hdr + 8, &f->size, 8);
    memcpy(hdr + 24, f->sha256, strlen(f->sha256));
    int resumed = 0;
    df->sfd = open(df->state_path, O_RDWR | O_CLOEXEC);
    df->fd = open(df->part_path, O_RDWR | O_CLOEXEC);
    struct stat st;
    unsigned char old[STATE_HDR];
    if (df->sfd >= 0 && df->fd >= 0 && fstat(df->fd, &st) == 0 && (uint64_t)st.st_size == f->size &&
        df_pread_all(df->sfd, old, STATE_HDR, 0) == 0 && !memcmp(old, hdr, 16) && !memcmp(old + 24, hdr + 24, STATE_HDR - 24)) {
        uint64_t ch;
        memcpy(&ch, old + 16, 8);
        if (ch >= 65536) {
            df->chunk = ch;
            df->nchunks = (f->size + ch - 1) / ch;
            df->done = calloc(df->nchunks ? df->nchunks : 1, 8);
            if (!df->done) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
            resumed = df_pread_all(df->sfd, df->done, 8 * df->nchunks, STATE_HDR) == 0;
            for (uint64_t i = 0; resumed && i < df->nchunks; i++) {
                uint64_t len = i + 1 < df->nchunks ? ch : f->size - i * ch;
                if (df->done[i] > len) resumed = 0;
            }
            if (!resumed) { free(df->done); df->done = NULL; }
        }
    }
    if (!resumed) {
        if (df->sfd >= 0) close(df->sfd);
        if (df->fd >= 0) close(df->fd);
        df->nchunks = (f->size + df->chunk - 1) / df->chunk;
        df->done = calloc(df->nchunks ? df->nchunks : 1, 8);
        if (!df->done) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory");
        memcpy(hdr + 16, &df->chunk, 8);
        unlink(df->state_path);
        df->fd = open(df->part_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (df->fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot create %s: %s", df->part_path, strerror(errno));
        int r = f->size ? posix_fallocate(df->fd, 0, (off_t)f->size) : 0;
        if (r == EOPNOTSUPP || r == EINVAL) r = ftruncate(df->fd, (off_t)f->size) ? errno : 0;
        if (r) {
            close(df->fd);
            df->fd = -1;
            unlink(df->part_path);
            return df_set_errc(err, errlen, DF_EIO, "cannot allocate %llu bytes for %s: %s%s", (unsigned long long)f->size,
                               df->part_path, strerror(r), r == ENOSPC ? " (disk full: free space or choose another --dir)" : "");
        }
        df->sfd = open(df->state_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (df->sfd < 0 || df_pwrite_all(df->sfd, hdr, STATE_HDR, 0) || df_pwrite_all(df->sfd, df->done, 8 * df->nchunks, STATE_HDR))
            return df_set_errc(err, errlen, DF_EIO, "cannot write %s: %s", df->state_path, strerror(errno));
    }
    df->remaining = 0;
    for (uint64_t i = 0; i < df->nchunks; i++) {
        uint64_t len = i + 1 < df->nchunks ? df->chunk : f->size - i * df->chunk;
        if (df->done[i] < len) df->remaining++;
    }
    return 0;
}

int hub_seed_partial(const char *path, uint64_t size, const char *sha256, uint64_t chunk, const uint64_t *done,
                     uint64_t nchunks, char *err, size_t errlen) {
    char part[4200], state[4300];
    snprintf(part, sizeof part, "%s.partial", path);
    snprintf(state, sizeof state, "%s.partial.state", path);
    unsigned char hdr[STATE_HDR];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, MAGIC_PARTIAL, 8);
    memcpy(hdr + 8, &size, 8);
    memcpy(hdr + 16, &chunk, 8);
    memcpy(hdr + 24, sha256, strlen(sha256) < 64 ? strlen(sha256) : 64);
    int fd = open(state, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = fd < 0 || df_pwrite_all(fd, hdr, STATE_HDR, 0) || df_pwrite_all(fd, done, 8 * nchunks, STATE_HDR) || fsync(fd);
    if (fd >= 0) close(fd);
    if (rc || rename(path, part) != 0) {
        unlink(state);
        return df_set_errc(err, errlen, DF_EIO, "cannot turn %s into a partial download: %s", path, strerror(errno));
    }
    return df_fsync_dir_of(part, err, errlen);
}

static uint64_t chunk_len(const dl_file *df, uint64_t i) {
    return i + 1 < df->nchunks ? df->chunk : df->f->size - i * df->chunk;
}

/* whether df has a chunk still to request (advancing next_chunk past chunks already complete) */
static int issuable(dl_file *c) {
    while (!c->finished && c->next_chunk < c->nchunks && c->done[c->next_chunk] >= chunk_len(c, c->next_chunk))
        c->next_chunk++;
    return !c->finished && c->next_chunk < c->nchunks;
}

/* All chunks written and checked. A file with a sha256 that matched: its sidecar is marked "verified,
 * not yet synced" and fsynced (with its directory entry), then the file is renamed into place with its
 * bytes possibly still in the page cache (hub_sync_verified or hub_remove_download settles it). A file
 * without one: fdatasynced, its git blob id checked, renamed, the sidecar removed. */
static int finish_file(const hub_ctx *h, dl_file *df, char *err, size_t errlen) {
    if (df->f->sha256[0]) {
        const char *got = df->digest;
        if (df->hash_state < 0) return df_set_errc(err, errlen, DF_EIO, "%s", df->hash_msg);
        close(df->fd);
        df->fd = -1;
        if (strcmp(got, df->f->sha256)) {
            char url[2048];
            hub_file_url(h, df->f->name, url, sizeof url);
            close(df->sfd);
            df->sfd = -1;
            unlink(df->part_path);
            unlink(df->state_path);
            return df_set_errc(err, errlen, DF_EFORMAT, "sha256 mismatch for %s (%s): expected %s (the mirror's listing / ETag), "
                               "got %s; the download was removed: run setup again, or use another --mirror if it repeats",
                               df->f->name, url, df->f->sha256, got);
        }
        int r = df_pwrite_all(df->sfd, MAGIC_UNSYNCED, 8, 0);
        if (r || fsync(df->sfd) != 0) {
            int e = r ? -r : errno;
            close(df->sfd);
            df->sfd = -1;
            return df_set_errc(err, errlen, DF_EIO, "cannot write %s: %s", df->state_path, strerror(e));
        }
        close(df->sfd);
        df->sfd = -1;
        int rc = df_fsync_dir_of(df->state_path, err, errlen);
        if (rc) return rc;
        if (rename(df->part_path, df->final_path) != 0)
            return df_set_errc(err, errlen, DF_EIO, "cannot rename %s to %s: %s", df->part_path, df->final_path, strerror(errno));
        df->finished = 1;
        return 0;
    }
    if (fdatasync(df->fd) != 0)
        return df_set_errc(err, errlen, DF_EIO, "cannot sync %s: %s", df->part_path, strerror(errno));
    close(df->fd);
    df->fd = -1;
    close(df->sfd);
    df->sfd = -1;
    if (df->f->sha1[0]) {
        /* a small git file: its blob id = sha1("blob SIZE\0" + bytes) */
        char *data = NULL;
        size_t len = 0;
        int rc = df_read_file(df->part_path, &data, &len, err, errlen);
        if (rc) return rc;
        char pre[40];
        int pl = snprintf(pre, sizeof pre, "blob %zu", len) + 1;
        unsigned char md[20];
        unsigned int mdl = 0;
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        EVP_DigestInit_ex(c, EVP_sha1(), NULL);
        EVP_DigestUpdate(c, pre, (size_t)pl);
        EVP_DigestUpdate(c, data, len);
        EVP_DigestFinal_ex(c, md, &mdl);
        EVP_MD_CTX_free(c);
        free(data);
        char got[41];
        for (int i = 0; i < 20; i++) snprintf(got + 2 * i, 3, "%02x", md[i]);
        if (strcmp(got, df->f->sha1)) {
            unlink(df->part_path);
            unlink(df->state_path);
            return df_set_errc(err, errlen, DF_EFORMAT, "git blob id mismatch for %s: expected %s (the mirror's listing / ETag), got %s; "
                               "the download was removed: run setup again", df->f->name, df->f->sha1, got);
        }
    }
    if (rename(df->part_path, df->final_path) != 0)
        return df_set_errc(err, errlen, DF_EIO, "cannot rename %s to %s: %s", df->part_path, df->final_path, strerror(errno));
    unlink(df->state_path);
    df->finished = 1;
    return df_fsync_dir_of(df->final_path, err, errlen);
}

static void human_time(double s, char *out, size_t cap) {
    if (!(s >= 0) || s > 1e7) { snprintf(out, cap, "--:--"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

static void progress_line(dl_file *fs, int n, uint64_t total, const hub_dl_opts *o, double t0, int *open_line) {
    double el = df_now() - t0;
    uint64_t done = o->bytes_present + o->bytes_fetched;
    double rate = el > 0 ? (double)o->bytes_fetched / el : 0;
    char eta[32];
    human_time(rate > 0 ? (double)(total - done) / rate : -1, eta, sizeof eta);
    /* the files in flight (started, not finished): the first two by name with their share, then how many more */
    char curs[700] = "";
    int shown = 0, more = 0;
    for (int i = 0; i < n; i++) {
        const dl_file *cur = &fs[i];
        if (cur->finished || !cur->nchunks) continue;
        uint64_t d = 0;
        for (uint64_t k = 0; k < cur->nchunks; k++) d += cur->done[k];
        if (!d && shown) { more++; continue; } /* not started yet: counted once it has bytes */
        if (shown == 2) { more++; continue; }
        const size_t l = strlen(curs);
        snprintf(curs + l, sizeof curs - l, "%s%s %.1f/%.1f MB %3.0f%%", shown ? ", " : " | ", cur->f->name, d / 1e6,
                 cur->f->size / 1e6, cur->f->size ? 100.0 * (double)d / (double)cur->f->size : 100.0);
        shown++;
    }
    if (more) {
        const size_t l = strlen(curs);
        snprintf(curs + l, sizeof curs - l, " (+%d more)", more);
    }
    /* a terminal: one line rewritten in place (spaces cover a longer earlier one); else one plain line each time */
    fprintf(stderr, "%sdownload: %.1f/%.1f MB %5.1f%%  %.1f MB/s  ETA %s%s%s", o->tty ? "\r" : "", done / 1e6, total / 1e6,
            total ? 100.0 * (double)done / (double)total : 100.0, rate / 1e6, eta, curs, o->tty ? "   " : "\n");
    fflush(stderr);
    *open_line = o->tty;
}

/* 1 when the sidecar at state_path says "verified, not yet synced" for a file of this size and sha256. */
static int sidecar_unsynced(const char *state_path, uint64_t size, const char *sha256) {
    if (!sha256[0]) return 0;
    int fd = open(state_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    unsigned char b[STATE_HDR], want[64];
    int ok = df_pread_all(fd, b, STATE_HDR, 0) == 0;
    close(fd);
    memset(want, 0, sizeof want);
    memcpy(want, sha256, strnlen(sha256, 64));
    uint64_t sz;
    memcpy(&sz, b + 8, 8);
    return ok && !memcmp(b, MAGIC_UNSYNCED, 8) && sz == size && !memcmp(b + 24, want, 64);
}

typedef struct {
    dl_file *fs;
    const int *idx;
    int n, next; /* next: the next entry of idx a thread claims (atomic) */
} recheck_job;

/* Re-hash whole files (fs[idx[k]], the file recheck names) into digest / hash_state / hash_msg. */
static void *recheck_main(void *arg) {
    recheck_job *J = arg;
    for (;;) {
        const int k = __atomic_fetch_add(&J->next, 1, __ATOMIC_ACQ_REL);
        if (k >= J->n) break;
        dl_file *df = &J->fs[J->idx[k]];
        const char *p = df->recheck == 1 ? df->final_path : df->part_path;
        df->hash_state = hub_sha256_file(p, df->digest, df->hash_msg, sizeof df->hash_msg) ? -1 : 1;
    }
    return NULL;
}

/* Files left verified but not yet synced by an earlier run (fs[idx[0..m-1]]): re-hashed from the disk in
 * up to nthreads threads. A match is kept at its final name (its sidecar stays until the sync), a
 * mismatch is removed with its sidecar, to be downloaded again from scratch. */
static int recheck_unsynced(dl_file *fs, const int *idx, int m, int nthreads, hub_dl_opts *o, char *err, size_t errlen) {
    recheck_job J = {fs, idx, m, 0};
    uint64_t bytes = 0;
    for (int k = 0; k < m; k++) bytes += fs[idx[k]].f->size;
    if (!o->quiet)
        fprintf(stderr, "setup: re-checking %d file%s (%.1f MB) verified by an earlier run but not yet synced to the disk\n", m,
                m == 1 ? "" : "s", bytes / 1e6);
    df_run_workers(nthreads < m ? (nthreads < HASH_THREADS_MAX ? nthreads : HASH_THREADS_MAX) : m, recheck_main, &J);
    for (int k = 0; k < m; k++) {
        dl_file *df = &fs[idx[k]];
        const char *p = df->recheck == 1 ? df->final_path : df->part_path;
        if (df->hash_state < 0)
            return df_set_errc(err, errlen, DF_EIO, "cannot re-check %s (downloaded by an earlier run, not yet synced): %s", p,
                               df->hash_msg);
        if (!strcmp(df->digest, df->f->sha256)) {
            if (df->recheck == 2 && rename(df->part_path, df->final_path) != 0)
                return df_set_errc(err, errlen, DF_EIO, "cannot rename %s to %s: %s", df->part_path, df->final_path, strerror(errno));
            df->finished = 1;
            o->bytes_present += df->f->size;
            o->rechecked_ok++;
            if (!o->quiet)
                fprintf(stderr, "  %-60s %10.1f MB  sha256 OK on the disk (kept)\n", df->f->name, df->f->size / 1e6);
        } else {
            if (unlink(p) != 0 && errno != ENOENT)
                return df_set_errc(err, errlen, DF_EIO, "cannot remove %s (its sha256 on the disk does not match): %s", p, strerror(errno));
            unlink(df->state_path);
            df->hash_state = 0;
            df->digest[0] = 0;
            o->rechecked_bad++;
            if (!o->quiet)
                fprintf(stderr, "  %-60s %10.1f MB  sha256 on the disk does not match (bytes lost before they reached the disk): "
                                "downloading it again\n", df->f->name, df->f->size / 1e6);
        }
        df->recheck = 0;
    }
    return 0;
}

typedef struct {
    int *fds;
    int *errs; /* errno of each fdatasync, 0 = synced */
    int n, next;
} sync_job;

static void *sync_main(void *arg) {
    sync_job *J = arg;
    for (;;) {
        const int k = __atomic_fetch_add(&J->next, 1, __ATOMIC_ACQ_REL);
        if (k >= J->n) break;
        J->errs[k] = fdatasync(J->fds[k]) == 0 ? 0 : errno;
    }
    return NULL;
}

enum { SYNC_THREADS_MAX = 8 };

int hub_sync_verified(const hub_file *files, int n, const char *dir, uint64_t *bytes, double *seconds, char *err, size_t errlen) {
    const double t0 = df_now();
    if (bytes) *bytes = 0;
    if (seconds) *seconds = 0;
    int *which = calloc((size_t)(n ? n : 1), sizeof(int)), *fds = calloc((size_t)(n ? n : 1), sizeof(int)),
        *errs = calloc((size_t)(n ? n : 1), sizeof(int));
    int m = 0, rc = 0;
    uint64_t total = 0;
    char path[4096], state[4300];
    if (!which || !fds || !errs) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < n; i++) {
        if (df_path_join(path, sizeof path, dir, files[i].name)) { rc = df_set_errc(err, errlen, DF_EINVAL, "path too long: %s/%s", dir, files[i].name); goto out; }
        snprintf(state, sizeof state, "%s.partial.state", path);
        if (!sidecar_unsynced(state, files[i].size, files[i].sha256)) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* removed unsynced: the sidecar goes with the next download of it */
            rc = df_set_errc(err, errlen, DF_EIO, "cannot open %s to sync it: %s", path, strerror(errno));
            goto out;
        }
        which[m] = i;
        fds[m++] = fd;
        total += files[i].size;
    }
    if (m) {
        sync_job J = {fds, errs, m, 0};
        df_run_workers(m < SYNC_THREADS_MAX ? m : SYNC_THREADS_MAX, sync_main, &J);
        for (int k = 0; k < m && !rc; k++)
            if (errs[k]) {
                df_path_join(path, sizeof path, dir, files[which[k]].name);
                rc = df_set_errc(err, errlen, DF_EIO, "cannot sync %s to the disk: %s; it stays marked as not yet synced, so the next "
                                 "setup re-checks its sha256 (and downloads it again if it does not match)", path, strerror(errs[k]));
            }
        /* the renames durable before the sidecars go (one fsync per run of files in the same directory) */
        char last[4096] = "";
        for (int k = 0; k < m && !rc; k++) {
            df_path_join(path, sizeof path, dir, files[which[k]].name);
            char *sl = strrchr(path, '/');
            size_t dl = sl ? (size_t)(sl - path) : 0;
            if (strlen(last) == dl && !strncmp(last, path, dl)) continue;
            rc = df_fsync_dir_of(path, err, errlen);
            snprintf(last, sizeof last, "%.*s", (int)dl, path);
        }
        for (int k = 0; k < m && !rc; k++) {
            df_path_join(path, sizeof path, dir, files[which[k]].name);
            snprintf(state, sizeof state, "%s.partial.state", path);
            if (unlink(state) != 0 && errno != ENOENT)
                rc = df_set_errc(err, errlen, DF_EIO, "cannot remove %s (its file is synced): %s", state, strerror(errno));
        }
    }
out:
    for (int k = 0; fds && k < m; k++) close(fds[k]);
    free(which);
    free(fds);
    free(errs);
    if (!rc && bytes) *bytes = total;
    if (seconds) *seconds = df_now() - t0;
    return rc;
}

int hub_remove_download(const char *dir, const char *name, char *err, size_t errlen) {
    char path[4096], state[4300];
    if (df_path_join(path, sizeof path, dir, name)) return df_set_errc(err, errlen, DF_EINVAL, "path too long: %s/%s", dir, name);
    snprintf(state, sizeof state, "%s.partial.state", path);
    /* the file before its sidecar: a sidecar left without its file is discarded by the next download of it */
    if (unlink(path) != 0 && errno != ENOENT) return df_set_errc(err, errlen, DF_EIO, "cannot remove %s: %s", path, strerror(errno));
    if (unlink(state) != 0 && errno != ENOENT) return df_set_errc(err, errlen, DF_EIO, "cannot remove %s: %s", state, strerror(errno));
    return 0;
}

int hub_download(const hub_ctx *h, const hub_file *files, int n, const char *dir, hub_dl_opts *o, char *err, size_t errlen) {
    if (o->connections < 1) o->connections = 1;
    if (o->chunk_bytes < 65536) o->chunk_bytes = 65536;
    o->bytes_fetched = o->bytes_present = o->synced_bytes = 0;
    o->retries_used = o->rechecked_ok = o->rechecked_bad = 0;
    o->seconds = o->sync_seconds = 0;
    int rc = 0, open_line = 0;
    double t0 = df_now(), last_print = o->tty ? 0 : t0; /* elsewhere than a terminal: the first line at 5 s */
    dl_file *fs = calloc((size_t)(n ? n : 1), sizeof(dl_file));
    xfer *xs = calloc((size_t)o->connections, sizeof(xfer));
    CURLM *multi = hub_curl_api()->multi_init();
    retry_item *retries = NULL;
    uint64_t total = 0;
    hasher H = {0};
    pthread_mutex_init(&H.mu, NULL);
    pthread_cond_init(&H.cv, NULL);
    pthread_t hash_threads[HASH_THREADS_MAX];
    int hash_started = 0;
    if (!fs || !xs || !multi) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < n; i++) { fs[i].fd = fs[i].sfd = -1; }
    /* one hashing thread per file being hashed, up to the cores less the transfer's, at most 4 */
    long ncores = sysconf(_SC_NPROCESSORS_ONLN);
    int nh = ncores > 2 ? (int)(ncores - 1 < HASH_THREADS_MAX ? ncores - 1 : HASH_THREADS_MAX) : 1;
    if (o->hash_threads > 0) nh = o->hash_threads < HASH_THREADS_MAX ? o->hash_threads : HASH_THREADS_MAX;
    if (nh > n) nh = n > 0 ? n : 1;
    /* paths; files an earlier run verified but did not sync are re-hashed from the disk first */
    int *rechk = calloc((size_t)(n ? n : 1), sizeof(int)), nrechk = 0;
    if (!rechk) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < n && !rc; i++) {
        dl_file *df = &fs[i];
        df->f = &files[i];
        total += files[i].size;
        if (df_path_join(df->final_path, sizeof df->final_path, dir, files[i].name)) {
            rc = df_set_errc(err, errlen, DF_EINVAL, "path too long: %s/%s", dir, files[i].name);
            break;
        }
        snprintf(df->part_path, sizeof df->part_path, "%s.partial", df->final_path);
        snprintf(df->state_path, sizeof df->state_path, "%s.partial.state", df->final_path);
        char sub[4096];
        snprintf(sub, sizeof sub, "%s", df->final_path);
        char *sl = strrchr(sub, '/');
        if (sl) { *sl = 0; if ((rc = df_mkdir_p(sub, err, errlen))) break; }
        if (!sidecar_unsynced(df->state_path, files[i].size, files[i].sha256)) continue;
        struct stat st;
        if (stat(df->final_path, &st) == 0 && (uint64_t)st.st_size == files[i].size) df->recheck = 1;
        else if (stat(df->part_path, &st) == 0 && (uint64_t)st.st_size == files[i].size) df->recheck = 2; /* stopped before the rename */
        else { unlink(df->state_path); continue; }
        rechk[nrechk++] = i;
    }
    if (!rc && nrechk) rc = recheck_unsynced(fs, rechk, nrechk, nh, o, err, errlen);
    free(rechk);
    /* open every other file: finished ones are skipped, partial ones resume */
    for (int i = 0; i < n && !rc; i++) {
        dl_file *df = &fs[i];
        if (df->finished) { df->hash_state = 1; continue; }
        struct stat st;
        if (stat(df->final_path, &st) == 0 && (uint64_t)st.st_size == files[i].size) {
            df->finished = df->hash_state = 1;
            o->bytes_present += files[i].size;
            continue;
        }
        df->chunk = o->chunk_bytes;
        if ((rc = open_partial(df, err, errlen))) break;
        for (uint64_t c = 0; c < df->nchunks; c++) o->bytes_present += df->done[c];
        if (!files[i].sha256[0]) df->hash_state = 1; /* nothing to check it against */
    }
    if (rc) goto out;
    H.fs = fs;
    H.n = n;
    H.writeback = o->writeback;
    for (int t = 0; t < nh; t++) {
        if (pthread_create(&hash_threads[t], NULL, hash_main, &H) != 0) break;
        hash_started++;
    }
    if (!hash_started) {
        rc = df_set_errc(err, errlen, DF_ENOMEM, "cannot start the hashing thread");
        goto out;
    }
    hub_curl_api()->multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)o->connections);
    int file_cursor = 0, active = 0;
    /* Chunks are issued across `window` files at once, one per hashing thread: a file's SHA-256 is one
     * sequential stream that may run slower than the transfer, so files arriving side by side, each at a
     * share of the rate, are hashed side by side and every digest is ready about when its last byte lands
     * (with one file at a time the last file's hash would trail the transfer). */
    const int window = hash_started;
    unsigned rr = 0;
    for (;;) {
        if (df_interrupted()) {
            rc = df_set_errc(err, errlen, DF_ECANCELLED, "interrupted; the partial files are kept: run the same setup again to resume");
            break;
        }
        /* start transfers: due retries first, then new chunks round-robin over the window's files */
        double now = df_now();
        for (int s = 0; s < o->connections; s++) {
            if (xs[s].e) continue;
            dl_file *df = NULL;
            uint64_t ci = 0;
            int tries = 0;
            retry_item **pp = &retries;
            while (*pp && (*pp)->not_before > now) pp = &(*pp)->next;
            if (*pp) {
                retry_item *r = *pp;
                *pp = r->next;
                df = r->df; ci = r->ci; tries = r->tries;
                free(r);
            } else {
                /* round-robin over the first `window` files with chunks left to issue */
                while (file_cursor < n && !issuable(&fs[file_cursor])) file_cursor++;
                int cand[HASH_THREADS_MAX], nc = 0;
                for (int i = file_cursor; i < n && nc < window; i++)
                    if (issuable(&fs[i])) cand[nc++] = i;
                if (nc) {
                    df = &fs[cand[rr++ % (unsigned)nc]];
                    ci = df->next_chunk++;
                }
            }
            if (!df) break;
            xfer *x = &xs[s];
            memset(x, 0, sizeof *x);
            x->df = df; x->ci = ci; x->tries = tries; x->o = o;
            x->pos = ci * df->chunk + df->done[ci];
            x->end = ci * df->chunk + chunk_len(df, ci);
            x->e = hub_curl_api()->easy_init();
            if (!x->e) { rc = df_set_errc(err, errlen, DF_ENOMEM, "libcurl: cannot create a handle"); break; }
            hub_easy_setup(h, x->e, &x->hl);
            char url[2048], range[64];
            hub_file_url(h, df->f->name, url, sizeof url);
            snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)x->pos, (unsigned long long)(x->end - 1));
            hub_curl_api()->easy_setopt(x->e, CURLOPT_URL, url);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_RANGE, range);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_WRITEFUNCTION, on_data);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_WRITEDATA, x);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_ERRORBUFFER, x->cerr);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_BUFFERSIZE, 512L * 1024L);
            hub_curl_api()->easy_setopt(x->e, CURLOPT_PRIVATE, x);
            hub_curl_api()->multi_add_handle(multi, x->e);
            df->active++;
            active++;
        }
        if (rc) break;
        /* files whose every chunk is written and whose digest is ready: check, rename, report */
        int unfinished = 0;
        for (int i = 0; i < n && !rc; i++) {
            dl_file *df = &fs[i];
            if (df->finished) continue;
            if (df->remaining || df->active || !__atomic_load_n(&df->hash_state, __ATOMIC_ACQUIRE)) { unfinished++; continue; }
            if ((rc = finish_file(h, df, err, errlen))) break;
            if (!o->quiet) {
                fprintf(stderr, "%s  %-60s %10.1f MB  %s%-*s\n", o->tty ? "\r" : "", df->f->name, df->f->size / 1e6,
                        df->f->sha256[0] ? "sha256 OK" : df->f->sha1[0] ? "git blob id OK" : "done (no hash known)", o->tty ? 40 : 0, "");
                open_line = 0;
            }
        }
        if (rc) break;
        if (active == 0) {
            if (!retries && !unfinished) break; /* everything done */
            if (!retries) {
                /* only digests outstanding */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 20 * 1000 * 1000;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_mutex_lock(&H.mu);
                pthread_cond_timedwait(&H.cv, &H.mu, &ts);
                pthread_mutex_unlock(&H.mu);
            } else {
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        int running = 0;
        hub_curl_api()->multi_perform(multi, &running);
        CURLMsg *m;
        int left;
        while ((m = hub_curl_api()->multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            xfer *x = NULL;
            hub_curl_api()->easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            CURLcode res = m->data.result;
            long st = 0;
            hub_curl_api()->easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &st);
            dl_file *df = x->df;
            hub_curl_api()->multi_remove_handle(multi, x->e);
            hub_curl_api()->easy_cleanup(x->e);
            hub_curl_api()->slist_free_all(x->hl);
            x->e = NULL;
            df->active--;
            active--;
            if (rc) continue;
            char url[2048];
            hub_file_url(h, df->f->name, url, sizeof url);
            if (res == CURLE_OK && !x->fail && st != 206 && st != 200) x->fail = st >= 500 ? XF_RETRY : XF_FATAL;
            if (res == CURLE_OK && !x->fail && x->pos == x->end) {
                df->remaining--;
                continue;
            }
            if (x->fail == XF_FATAL) {
                if (x->msg[0]) rc = df_set_errc(err, errlen, x->status == 200 ? DF_EUNSUPPORTED : DF_EIO, "%s", x->msg);
                else rc = hub_http_error(h, x->status ? x->status : st, 0, NULL, url, df->f->name, err, errlen);
                continue;
            }
            /* a network error, a drop (the range not complete) or a 5xx: retry from the first missing byte */
            if (x->tries >= h->retries) {
                if (x->status >= 500) rc = hub_http_error(h, x->status, 0, NULL, url, df->f->name, err, errlen);
                else if (res != CURLE_OK) rc = hub_http_error(h, 0, (int)res, x->cerr, url, df->f->name, err, errlen);
                else if (st >= 500) rc = hub_http_error(h, x->status ? x->status : st, 0, NULL, url, df->f->name, err, errlen);
                else rc = df_set_errc(err, errlen, DF_EIO, "download of %s stopped early %d times (%s); run the same setup again to resume",
                                      df->f->name, x->tries + 1, url);
                continue;
            }
            retry_item *r = calloc(1, sizeof *r);
            if (!r) { rc = df_set_errc(err, errlen, DF_ENOMEM, "out of memory"); continue; }
            r->df = df; r->ci = x->ci; r->tries = x->tries + 1;
            r->not_before = df_now() + 0.2 * (double)(1 << (x->tries < 5 ? x->tries : 5));
            r->next = retries;
            retries = r;
            o->retries_used++;
            if (h->verbose) {
                fprintf(stderr, "%shub: retry %d of %s bytes from %llu: %s\n", open_line ? "\n" : "", r->tries, df->f->name,
                        (unsigned long long)x->pos, res ? x->cerr : "short or 5xx answer");
                open_line = 0;
            }
        }
        if (rc) break;
        if (!o->quiet && df_now() - last_print > (o->tty ? 0.5 : 5.0)) { progress_line(fs, n, total, o, t0, &open_line); last_print = df_now(); }
        if (active) hub_curl_api()->multi_poll(multi, NULL, 0, 100, NULL);
    }
    if (!rc && !o->quiet && o->tty) { /* the line's final state (elsewhere the caller's summary line follows) */
        progress_line(fs, n, total, o, t0, &open_line);
        fprintf(stderr, "\n");
        open_line = 0;
    }
    o->seconds = df_now() - t0;
    if (!rc && !o->defer_sync) rc = hub_sync_verified(files, n, dir, &o->synced_bytes, &o->sync_seconds, err, errlen);
out:
    if (hash_started) {
        __atomic_store_n(&H.stop, 1, __ATOMIC_RELEASE);
        for (int t = 0; t < hash_started; t++) pthread_join(hash_threads[t], NULL);
    }
    pthread_mutex_destroy(&H.mu);
    pthread_cond_destroy(&H.cv);
    if (open_line) fprintf(stderr, "\n");
    if (!o->seconds) o->seconds = df_now() - t0;
    for (int s = 0; xs && s < o->connections; s++)
        if (xs[s].e) {
            hub_curl_api()->multi_remove_handle(multi, xs[s].e);
            hub_curl_api()->easy_cleanup(xs[s].e);
            hub_curl_api()->slist_free_all(xs[s].hl);
        }
    while (retries) { retry_item *r = retries; retries = r->next; free(r); }
    for (int i = 0; fs && i < n; i++) {
        if (fs[i].fd >= 0) close(fs[i].fd);
        if (fs[i].sfd >= 0) close(fs[i].sfd);
        free(fs[i].done);
    }
    if (multi) hub_curl_api()->multi_cleanup(multi);
    free(fs);
    free(xs);
    return rc;
}
