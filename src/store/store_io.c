/*
 * store_io.c — the drive queues of the expert store. One queue per drive
 * (= per expert directory); each queue is served either by one io_uring
 * thread keeping up to io_depth O_DIRECT reads in flight, or by io_depth
 * threads doing pread (fallback when io_uring is unavailable or use_uring=0).
 * Demand jobs are always served before prefetch jobs; each job's piece on this
 * drive is read in chunks of io_bytes straight into the slot buffer (stripe k
 * lands at stripe_begin[k], the sum of the earlier stripes' sizes, so a striped
 * extent is reassembled in place).
 * O_DIRECT reads that fail with EINVAL (unaligned filesystem) are retried
 * buffered for that chunk.
 */
#define _GNU_SOURCE
#include "store_internal.h"
#include "deltafin.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef DF_HAVE_URING
#include <liburing.h>
#endif

int store_take_chunk(df_store *st, int d, store_chunk *c) {
    if (st->stopping) return 0;
    for (int list = 1; list <= 2; list++) {
        for (store_job *j = list == 1 ? st->dem_head : st->pre_head; j; j = j->next) {
            for (int k = 0; k < j->n_pieces; k++) {
                if (j->piece_drive[k] != d || j->piece_next[k] >= j->piece_len[k]) continue;
                uint64_t len = j->piece_len[k] - j->piece_next[k];
                if (len > st->io_bytes) len = st->io_bytes;
                c->job = j;
                c->piece = k;
                c->fd = j->piece_fd[k];
                c->fd_buf = j->piece_fd_buf[k];
                c->off = j->piece_off[k] + j->piece_next[k];
                c->len = len;
                c->dst = st->slots[j->slot].buf + st->layers[j->layer].stripe_begin[k] + j->piece_next[k];
                j->piece_next[k] += len;
                j->started = 1;
                j->chunks_out++;
                int all = 1;
                for (int q = 0; q < j->n_pieces; q++) all &= j->piece_next[q] >= j->piece_len[q];
                if (all) {
                    /* fully handed out: leave the pending list */
                    store_job **head = j->in_list == 1 ? &st->dem_head : &st->pre_head;
                    store_job **tail = j->in_list == 1 ? &st->dem_tail : &st->pre_tail;
                    if (j->prev) j->prev->next = j->next; else *head = j->next;
                    if (j->next) j->next->prev = j->prev; else *tail = j->prev;
                    j->next = j->prev = NULL;
                    j->in_list = 0;
                }
                store_drive *dr = &st->drives[d];
                if (dr->inflight++ == 0) {
                    dr->busy_since = store_now();
                    store_event(st, "\"ev\":\"drive_busy\",\"drive\":%d", d);
                }
                return 1;
            }
        }
    }
    return 0;
}

void store_chunk_done(df_store *st, int d, store_chunk *c, int res, const char *msg) {
    store_job *j = c->job;
    int finish = 0;
    pthread_mutex_lock(&st->mu);
    store_drive *dr = &st->drives[d];
    if (res == 0) dr->bytes += c->len;
    if (--dr->inflight == 0) {
        dr->busy_s += store_now() - dr->busy_since;
        store_event(st, "\"ev\":\"drive_idle\",\"drive\":%d", d);
    }
    j->chunks_out--;
    if (res < 0 && !j->err) {
        j->err = res;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
        /* stop handing out the rest of this job */
        for (int q = 0; q < j->n_pieces; q++) j->piece_next[q] = j->piece_len[q];
        if (j->in_list) {
            store_job **head = j->in_list == 1 ? &st->dem_head : &st->pre_head;
            store_job **tail = j->in_list == 1 ? &st->dem_tail : &st->pre_tail;
            if (j->prev) j->prev->next = j->next; else *head = j->next;
            if (j->next) j->next->prev = j->prev; else *tail = j->prev;
            j->next = j->prev = NULL;
            j->in_list = 0;
        }
    }
    if (j->chunks_out == 0 && !j->in_list) {
        int all = 1;
        for (int q = 0; q < j->n_pieces; q++) all &= j->piece_next[q] >= j->piece_len[q];
        finish = all;
    }
    if (finish && st->n_verifiers && !j->abandoned && !j->err && st->o.verify &&
        !st->verified[j->layer * st->n_experts + j->expert]) {
        /* the checksum runs on a verifier thread: this drive keeps its reads in flight meanwhile */
        j->next = NULL;
        if (st->ver_tail) st->ver_tail->next = j; else st->ver_head = j;
        st->ver_tail = j;
        pthread_cond_signal(&st->ver_cv);
        finish = 0;
    }
    pthread_mutex_unlock(&st->mu);
    if (finish) store_job_finish(st, j);
}

/* A verifier thread: takes read jobs from the checksum queue and finishes them (XXH64, publish). */
static void *verifier_main(void *arg) {
    df_store *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->ver_head && !st->ver_stop) pthread_cond_wait(&st->ver_cv, &st->mu);
        store_job *j = st->ver_head;
        if (!j) break; /* stopping and drained */
        st->ver_head = j->next;
        if (!st->ver_head) st->ver_tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&st->mu);
        store_job_finish(st, j);
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static void read_error(df_store *st, store_chunk *c, int res, char *msg, size_t cap) {
    store_job *j = c->job;
    const char *file = st->layers[j->layer].files[j->piece_file[c->piece]];
    if (res == 0)
        snprintf(msg, cap,
                 "expert pack %s is truncated: layer %d expert %d needs %llu bytes at offset %llu but the file ends "
                 "there; re-run `deltafin convert`",
                 file, j->layer, j->expert, (unsigned long long)c->len, (unsigned long long)c->off);
    else
        snprintf(msg, cap, "read of layer %d expert %d from %s (offset %llu, %llu bytes) failed: %s", j->layer,
                 j->expert, file, (unsigned long long)c->off, (unsigned long long)c->len, strerror(-res));
}

/* Whole chunk with pread; 0, -errno, or 1 for end of file. */
static int pread_chunk(store_chunk *c) {
    uint64_t done = 0;
    int fd = c->fd;
    while (done < c->len) {
        ssize_t r = pread(fd, c->dst + done, c->len - done, (off_t)(c->off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && fd != c->fd_buf) { fd = c->fd_buf; continue; }
            return -errno;
        }
        if (r == 0) return 1;
        done += (uint64_t)r;
        if (done < c->len && ((c->off + done) % 512 || (uintptr_t)(c->dst + done) % 512)) fd = c->fd_buf;
    }
    return 0;
}

static void run_pread(store_drive *dr) {
    df_store *st = dr->st;
    int d = dr->id;
    while (1) {
        store_chunk c;
        pthread_mutex_lock(&st->mu);
        while (!st->stopping && !store_take_chunk(st, d, &c)) pthread_cond_wait(&dr->cv, &st->mu);
        if (st->stopping) { pthread_mutex_unlock(&st->mu); break; }
        pthread_mutex_unlock(&st->mu);
        int r = pread_chunk(&c);
        char msg[512] = "";
        if (r) read_error(st, &c, r == 1 ? 0 : r, msg, sizeof msg);
        store_chunk_done(st, d, &c, r == 0 ? 0 : r == 1 ? DF_EFORMAT : DF_EIO, msg);
    }
}

#ifdef DF_HAVE_URING
static int run_uring(store_drive *dr) {
    df_store *st = dr->st;
    int d = dr->id, qd = st->o.io_depth;
    struct io_uring ring;
    if (io_uring_queue_init(qd, &ring, 0) < 0) return -1;
    store_chunk *ctx = calloc(qd, sizeof *ctx);
    int *freeidx = malloc(qd * sizeof(int)), nfree = qd, inflight = 0;
    if (!ctx || !freeidx) { free(ctx); free(freeidx); io_uring_queue_exit(&ring); return -1; }
    for (int i = 0; i < qd; i++) freeidx[i] = i;
    while (1) {
        int n_new = 0, stop = 0;
        pthread_mutex_lock(&st->mu);
        for (;;) {
            while (nfree > 0) {
                store_chunk c;
                if (!store_take_chunk(st, d, &c)) break;
                int idx = freeidx[--nfree];
                ctx[idx] = c;
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                io_uring_prep_read(sqe, c.fd, c.dst, (unsigned)c.len, c.off);
                io_uring_sqe_set_data64(sqe, (uint64_t)idx);
                n_new++;
                inflight++;
            }
            if (n_new || inflight) break;
            if (st->stopping) { stop = 1; break; }
            pthread_cond_wait(&dr->cv, &st->mu);
        }
        pthread_mutex_unlock(&st->mu);
        if (stop) break;
        if (n_new) io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&ring, &cqe);
        if (w == -EINTR) continue;
        if (w < 0) continue;
        unsigned head, seen = 0;
        int resubmit = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            int idx = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            store_chunk *c = &ctx[idx];
            if (res == -EINTR || res == -EAGAIN || (res == -EINVAL && c->fd != c->fd_buf) ||
                (res > 0 && (uint64_t)res < c->len)) {
                if (res == -EINVAL) c->fd = c->fd_buf;
                if (res > 0) {
                    /* partial read: continue with the rest (buffered if no longer aligned) */
                    c->dst += res; c->off += res; c->len -= res;
                    c->job = c->job; /* bytes accounted when the chunk completes */
                    if (c->off % 512 || (uintptr_t)c->dst % 512) c->fd = c->fd_buf;
                }
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                io_uring_prep_read(sqe, c->fd, c->dst, (unsigned)c->len, c->off);
                io_uring_sqe_set_data64(sqe, (uint64_t)idx);
                resubmit++;
                continue;
            }
            char msg[512] = "";
            int code = 0;
            if (res <= 0) {
                read_error(st, c, res, msg, sizeof msg);
                code = res == 0 ? DF_EFORMAT : DF_EIO;
            }
            store_chunk_done(st, d, c, code, msg);
            freeidx[nfree++] = idx;
            inflight--;
        }
        io_uring_cq_advance(&ring, seen);
        if (resubmit) io_uring_submit(&ring);
    }
    free(ctx);
    free(freeidx);
    io_uring_queue_exit(&ring);
    return 0;
}
#endif

static void *drive_main(void *arg) {
    store_drive *dr = arg;
#ifdef DF_HAVE_URING
    if (dr->use_uring && run_uring(dr) == 0) return NULL;
#endif
    run_pread(dr);
    return NULL;
}

int store_io_start(df_store *st, char *err, size_t errlen) {
    st->uring_ok = 0;
    /* one verifier per drive (XXH64 hashes ~10 GB/s per core: faster than one drive reads) */
    st->n_verifiers = 0;
    st->ver_stop = 0;
    if (st->o.verify)
        for (int i = 0; i < st->n_drives; i++) {
            if (pthread_create(&st->verifiers[i], NULL, verifier_main, st)) break;
            st->n_verifiers++;
        }
#ifdef DF_HAVE_URING
    if (st->o.use_uring) {
        struct io_uring ring;
        if (io_uring_queue_init(st->o.io_depth, &ring, 0) == 0) {
            st->uring_ok = 1;
            io_uring_queue_exit(&ring);
        }
    }
#endif
    for (int d = 0; d < st->n_drives; d++) {
        store_drive *dr = &st->drives[d];
        dr->use_uring = st->uring_ok;
        dr->n_threads = st->uring_ok ? 1 : st->o.io_depth;
        dr->threads = calloc(dr->n_threads, sizeof(pthread_t));
        if (!dr->threads) {
            if (err && errlen) snprintf(err, errlen, "out of memory starting I/O threads");
            return DF_ENOMEM;
        }
        for (int i = 0; i < dr->n_threads; i++) {
            if (pthread_create(&dr->threads[i], NULL, drive_main, dr)) {
                dr->n_threads = i;
                if (err && errlen) snprintf(err, errlen, "cannot start I/O thread for %s", dr->dir);
                return DF_ENOMEM;
            }
        }
    }
    return 0;
}

void store_io_stop(df_store *st) {
    pthread_mutex_lock(&st->mu);
    st->stopping = 1;
    for (int d = 0; d < st->n_drives; d++) pthread_cond_broadcast(&st->drives[d].cv);
    pthread_mutex_unlock(&st->mu);
    for (int d = 0; d < st->n_drives; d++) {
        store_drive *dr = &st->drives[d];
        for (int i = 0; i < dr->n_threads; i++) pthread_join(dr->threads[i], NULL);
        free(dr->threads);
        dr->threads = NULL;
        dr->n_threads = 0;
    }
    /* no drive hands in jobs any more: the verifiers finish the queue and exit */
    pthread_mutex_lock(&st->mu);
    st->ver_stop = 1;
    pthread_cond_broadcast(&st->ver_cv);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->n_verifiers; i++) pthread_join(st->verifiers[i], NULL);
    st->n_verifiers = 0;
}
