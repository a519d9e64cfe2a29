/*
 * store_bench.c — `bench io`: O_DIRECT random-offset read bandwidth per
 * directory at a given read size and queue depth, through io_uring (one ring
 * per directory) or a pool of pread threads, like the store's drive queues.
 * Offsets are aligned to io_bytes; each "run" reads run_bytes back to back
 * (one expert extent in chunks of io_bytes); chunks are handed out in order
 * from the current run, so up to qd consecutive chunks are in flight — the
 * store's read pattern. With run = io_bytes it is plain random reads.
 */
#define _GNU_SOURCE
#include "store_bench.h"
#include "deltafin.h"
#include "util/util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#ifdef DF_HAVE_URING
#include <liburing.h>
#endif

void store_bench_opts_default(store_bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->io_bytes = 1 << 20;
    o->qd = 16;
    o->seconds = 10;
    o->use_uring = 1;
    o->seed = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    int fd;
    uint64_t size;
    char name[256];
} bfile;

static int cmp_bfile(const void *a, const void *b) { return strcmp(((const bfile *)a)->name, ((const bfile *)b)->name); }

typedef struct {
    const store_bench_opts *o;
    char dir[1024];
    bfile *files;
    int n_files;
    int n_sparse;            /* files skipped: holes or unwritten extents (their reads never reach the drive) */
    uint64_t total;          /* sum of usable sizes */
    int direct;
    pthread_mutex_t mu;      /* pread threads: run state */
    uint64_t rng;
    uint64_t bytes;
    double t_begin, t_end, t_done; /* the timed window: after the queue's setup, until its last read ended */
    int grp_f, grp_n, grp_i, grp_next; /* group mode: file, extents, next extent, next file */
    uint64_t grp_off[64];
    uint8_t *pool;           /* buffer_bytes > qd reads: the destination pool (n_slices of io_bytes), else NULL */
    int n_slices, next_slice;
    unsigned char *slice_busy;
    int fixed_buf;           /* io_uring: the destination buffers registered with the ring (read_fixed) */
    int cur_f;               /* pread pool: the run being handed out */
    uint64_t cur_off, cur_left;
    int err;
    char errmsg[1200];
} bdir;

/* The destination pool of buffer_bytes (rounded to whole reads; at least 2 x qd slices so a slice is never
 * reused while in flight), on huge pages where the kernel gives them and touched now, before any clock starts.
 * 0, or DF_ENOMEM. Without a pool (buffer_bytes <= qd reads) nothing is allocated. */
static int pool_init(bdir *d) {
    const store_bench_opts *o = d->o;
    if (o->buffer_bytes <= (uint64_t)o->qd * o->io_bytes) return 0;
    uint64_t n = o->buffer_bytes / o->io_bytes;
    if (n < 2 * (uint64_t)o->qd) n = 2 * (uint64_t)o->qd;
    const size_t bytes = (size_t)(n * o->io_bytes);
    if (posix_memalign((void **)&d->pool, 2u << 20, bytes) || !(d->slice_busy = calloc(n, 1))) {
        free(d->pool);
        d->pool = NULL;
        snprintf(d->errmsg, sizeof d->errmsg, "cannot allocate %zu bytes of read buffers (--buffer)", bytes);
        return DF_ENOMEM;
    }
    madvise(d->pool, bytes, MADV_HUGEPAGE);
    memset(d->pool, 0, bytes);
    d->n_slices = (int)n;
    return 0;
}

/* The next free slice of the pool, marked busy (the caller holds d->mu or is the queue's only thread). */
static int pool_take(bdir *d) {
    for (;;) {
        const int s = d->next_slice;
        d->next_slice = (d->next_slice + 1) % d->n_slices;
        if (!d->slice_busy[s]) { d->slice_busy[s] = 1; return s; }
    }
}

static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The next run: with group > 1, the next of `group` distinct run-aligned
 * extents of one file, ascending (a MoE layer's experts), files taken in name
 * order (experts-L001.pack, L002, ...: layer after layer, as decode does); else a random
 * io-aligned start in a random file (weighted by size) such that run bytes fit. */
static void pick_run(bdir *d, uint64_t run, int *f, uint64_t *off) {
    int g = d->o->group;
    if (g > 1) {
        if (d->grp_i >= d->grp_n) {
            int i = d->grp_next++ % d->n_files; /* files in name order: layer after layer, as decode */
            uint64_t n_ext = d->files[i].size / run;
            int n = g < 64 ? g : 64;
            if ((uint64_t)n > n_ext) n = (int)n_ext;
            d->grp_f = i;
            d->grp_n = 0;
            while (d->grp_n < n) {
                uint64_t e = rnd(&d->rng) % n_ext, o = e * run;
                int dup = 0;
                for (int k = 0; k < d->grp_n; k++) dup |= d->grp_off[k] == o;
                if (!dup) d->grp_off[d->grp_n++] = o;
            }
            qsort(d->grp_off, d->grp_n, sizeof(uint64_t), cmp_u64);
            d->grp_i = 0;
        }
        *f = d->grp_f;
        *off = d->grp_off[d->grp_i++];
        return;
    }
    uint64_t x = rnd(&d->rng) % d->total;
    int i = 0;
    while (i < d->n_files - 1 && x >= d->files[i].size - run + 1) { x -= d->files[i].size - run + 1; i++; }
    uint64_t io = d->o->io_bytes;
    *f = i;
    *off = x / io * io;
    if (*off + run > d->files[i].size) *off = (d->files[i].size - run) / 4096 * 4096;
}

static int open_dir(bdir *d, uint64_t run, char *err, size_t errlen) {
    DIR *dp = opendir(d->dir);
    if (!dp) {
        snprintf(err, errlen, "cannot open directory %s: %s", d->dir, strerror(errno));
        return DF_EIO;
    }
    struct dirent *de;
    int cap = 0;
    d->direct = 1;
    while ((de = readdir(dp))) {
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", d->dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < run + 4096) continue;
        if (strstr(de->d_name, ".tmp")) continue;
        if (d->o->match && fnmatch(d->o->match, de->d_name, 0)) continue;
        int fd = open(p, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd < 0) { fd = open(p, O_RDONLY | O_CLOEXEC); d->direct = 0; }
        if (fd < 0) continue;
        /* a hole (or an unwritten extent, which SEEK_HOLE reports as one) reads as zeros without the drive: such a
         * file would measure memory, not the disk */
        const off_t hole = lseek(fd, 0, SEEK_HOLE);
        if (hole >= 0 && hole < sb.st_size) {
            close(fd);
            d->n_sparse++;
            continue;
        }
        if (d->n_files == cap) {
            cap = cap ? cap * 2 : 16;
            d->files = realloc(d->files, cap * sizeof *d->files);
        }
        d->files[d->n_files].fd = fd;
        snprintf(d->files[d->n_files].name, sizeof d->files[d->n_files].name, "%s", de->d_name);
        d->files[d->n_files].size = (uint64_t)sb.st_size / 4096 * 4096;
        d->total += d->files[d->n_files].size - run + 1;
        d->n_files++;
    }
    closedir(dp);
    if (d->n_files) qsort(d->files, d->n_files, sizeof *d->files, cmp_bfile);
    if (!d->n_files) {
        char qdir[4200], sub[4200]; /* the suggested command is pasted into a shell: the directory quoted as one word */
        char skipped[200] = "";
        if (d->n_sparse)
            snprintf(skipped, sizeof skipped, "; %d skipped: sparse or preallocated (holes or unwritten extents read as "
                     "zeros without the drive)", d->n_sparse);
        snprintf(err, errlen,
                 "%s has no file%s%s of at least %llu bytes of written data to read%s (write one with `deltafin synth %s ...`, "
                 "a new directory: synth writes into no other, and give --dir that directory)",
                 d->dir, d->o->match ? " named " : "", d->o->match ? d->o->match : "", (unsigned long long)(run + 4096),
                 skipped, df_shell_quote((snprintf(sub, sizeof sub, "%s/synth", d->dir), sub), qdir, sizeof qdir));
        return DF_EINVAL;
    }
    return 0;
}

typedef struct {
    bdir *d;
    uint8_t *buf;
} pthr;

static void *pread_main(void *arg) {
    pthr *t = arg;
    bdir *d = t->d;
    const store_bench_opts *o = d->o;
    uint64_t run = o->run_bytes ? o->run_bytes : o->io_bytes;
    while (now_s() < d->t_end) {
        int f;
        uint64_t off, len;
        pthread_mutex_lock(&d->mu); /* next chunk of the shared current run, as the store's pread pool */
        if (!d->cur_left) { pick_run(d, run, &d->cur_f, &d->cur_off); d->cur_left = run; }
        f = d->cur_f;
        off = d->cur_off;
        len = d->cur_left < o->io_bytes ? d->cur_left : o->io_bytes;
        d->cur_off += len;
        d->cur_left -= len;
        const int slice = d->pool ? pool_take(d) : -1;
        pthread_mutex_unlock(&d->mu);
        uint8_t *dst = slice >= 0 ? d->pool + (size_t)slice * o->io_bytes : t->buf;
        for (uint64_t done = 0; done < len;) {
            ssize_t r = pread(d->files[f].fd, dst + done, len - done, (off_t)(off + done));
            if (r <= 0) {
                if (r < 0 && errno == EINTR) continue;
                pthread_mutex_lock(&d->mu);
                d->err = DF_EIO;
                snprintf(d->errmsg, sizeof d->errmsg, "read in %s failed: %s", d->dir,
                         r < 0 ? strerror(errno) : "end of file");
                pthread_mutex_unlock(&d->mu);
                return NULL;
            }
            done += (uint64_t)r;
        }
        pthread_mutex_lock(&d->mu);
        d->bytes += len;
        if (slice >= 0) d->slice_busy[slice] = 0;
        pthread_mutex_unlock(&d->mu);
    }
    return NULL;
}

#ifdef DF_HAVE_URING
/* Like the store's drive queue: chunks are handed out in order from the current
 * run (one expert extent), so up to qd consecutive chunks of one or two extents
 * are in flight; a new random run starts when the current one is fully issued. */
static void *uring_main(void *arg) {
    bdir *d = arg;
    const store_bench_opts *o = d->o;
    uint64_t run = o->run_bytes ? o->run_bytes : o->io_bytes;
    struct io_uring ring;
    if (io_uring_queue_init(o->qd, &ring, 0) < 0) {
        d->err = DF_EIO;
        snprintf(d->errmsg, sizeof d->errmsg, "io_uring_queue_init failed");
        return NULL;
    }
    /* the qd buffers: one region on huge pages where the kernel gives them, touched before the clock
     * starts, registered with the ring with --fixed (no page pinning per read); the files registered too.
     * Either registration may be refused (old kernel, memlock limit): then plain reads. */
    const size_t region = (size_t)o->qd * o->io_bytes;
    uint8_t *mem = NULL;
    if (posix_memalign((void **)&mem, 2u << 20, region)) {
        io_uring_queue_exit(&ring);
        d->err = DF_ENOMEM;
        snprintf(d->errmsg, sizeof d->errmsg, "cannot allocate %zu bytes of read buffers", region);
        return NULL;
    }
    madvise(mem, region, MADV_HUGEPAGE);
    memset(mem, 0, region);
    uint8_t **bufs = calloc(o->qd, sizeof *bufs);
    struct iovec *iov = calloc(o->qd, sizeof *iov);
    int *fds = malloc(sizeof(int) * (size_t)d->n_files);
    for (int i = 0; i < o->qd; i++) {
        bufs[i] = mem + (size_t)i * o->io_bytes;
        iov[i].iov_base = bufs[i];
        iov[i].iov_len = o->io_bytes;
    }
    /* with a destination pool (--buffer) the reads go to its slices: with --fixed, the pool registered in pieces of at
     * most 1 GiB (whole reads; a registered buffer is at most 1 GiB), read k of a piece at buffer index = the piece */
    const uint64_t piece = ((1ull << 30) / o->io_bytes) * o->io_bytes;
    int fixed_buf = 0;
    if (o->fixed && !d->pool) fixed_buf = io_uring_register_buffers(&ring, iov, (unsigned)o->qd) == 0;
    if (o->fixed && d->pool) {
        const uint64_t pool_bytes = (uint64_t)d->n_slices * o->io_bytes;
        const unsigned np = (unsigned)((pool_bytes + piece - 1) / piece);
        struct iovec *pv = calloc(np, sizeof *pv);
        for (unsigned k = 0; pv && k < np; k++) {
            pv[k].iov_base = d->pool + (size_t)k * piece;
            pv[k].iov_len = (size_t)(pool_bytes - k * piece < piece ? pool_bytes - k * piece : piece);
        }
        fixed_buf = pv && io_uring_register_buffers(&ring, pv, np) == 0;
        free(pv);
    }
    d->fixed_buf = fixed_buf;
    int *slice_of = calloc(o->qd, sizeof(int));
    for (int f = 0; f < d->n_files; f++) fds[f] = d->files[f].fd;
    const int fixed_file = io_uring_register_files(&ring, fds, (unsigned)d->n_files) == 0;
    d->t_begin = now_s();
    d->t_end = d->t_begin + o->seconds;
    int cur_f = 0, inflight = 0, stop = 0;
    uint64_t cur_off = 0, cur_left = 0;
    /* issue the next chunk into buffer i */
#define ISSUE(i) do { \
        if (!cur_left) { pick_run(d, run, &cur_f, &cur_off); cur_left = run; } \
        uint64_t len_ = cur_left < o->io_bytes ? cur_left : o->io_bytes; \
        struct io_uring_sqe *sqe_ = io_uring_get_sqe(&ring); \
        const int fd_ = fixed_file ? cur_f : d->files[cur_f].fd; \
        if (d->pool) { slice_of[i] = pool_take(d); \
            const uint64_t at_ = (uint64_t)slice_of[i] * o->io_bytes; \
            if (fixed_buf) io_uring_prep_read_fixed(sqe_, fd_, d->pool + at_, (unsigned)len_, cur_off, (int)(at_ / piece)); \
            else io_uring_prep_read(sqe_, fd_, d->pool + at_, (unsigned)len_, cur_off); } \
        else if (fixed_buf) io_uring_prep_read_fixed(sqe_, fd_, bufs[i], (unsigned)len_, cur_off, (i)); \
        else io_uring_prep_read(sqe_, fd_, bufs[i], (unsigned)len_, cur_off); \
        if (fixed_file) sqe_->flags |= IOSQE_FIXED_FILE; \
        io_uring_sqe_set_data64(sqe_, (uint64_t)(i)); \
        cur_off += len_; cur_left -= len_; inflight++; } while (0)
    for (int i = 0; i < o->qd; i++) ISSUE(i);
    io_uring_submit(&ring);
    while (inflight > 0) {
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&ring, &cqe);
        if (w == -EINTR) continue;
        if (w < 0) break;
        unsigned head, seen = 0;
        int sub = 0;
        if (!stop && now_s() >= d->t_end) stop = 1;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            int i = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            inflight--;
            if (d->pool) d->slice_busy[slice_of[i]] = 0;
            if (res <= 0) {
                d->err = DF_EIO;
                snprintf(d->errmsg, sizeof d->errmsg, "read in %s failed: %s", d->dir,
                         res < 0 ? strerror(-res) : "end of file");
                stop = 1;
                continue;
            }
            d->bytes += (uint64_t)res;
            if (stop) continue;
            ISSUE(i);
            sub++;
        }
        io_uring_cq_advance(&ring, seen);
        if (sub) io_uring_submit(&ring);
    }
#undef ISSUE
    d->t_done = now_s();
    if (fixed_file) io_uring_unregister_files(&ring);
    if (fixed_buf) io_uring_unregister_buffers(&ring);
    io_uring_queue_exit(&ring);
    free(mem);
    free(bufs);
    free(iov);
    free(fds);
    free(slice_of);
    return NULL;
}
#endif

/* A busy core for store_bench_opts.cpu_load: dependent multiply-adds in registers until told to stop. */
static void *spin_main(void *arg) {
    atomic_int *stop = arg;
    double x = 1.0;
    while (!atomic_load_explicit(stop, memory_order_relaxed))
        for (int i = 0; i < 65536; i++) x = x * 0.999999 + 1e-6;
    return (void *)(uintptr_t)(x > 2.0); /* keeps the loop */
}

int store_bench_io(const store_bench_opts *o, store_bench_result *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (!o->dirs || !*o->dirs || o->io_bytes < 4096 || o->io_bytes % 4096 || o->qd < 1 || o->seconds <= 0) {
        snprintf(err, errlen, "need --dir, a read size that is a multiple of 4096, --qd >= 1, --seconds > 0");
        return DF_EINVAL;
    }
    uint64_t run = o->run_bytes ? (o->run_bytes + 4095) / 4096 * 4096 : o->io_bytes;
    store_bench_opts oo = *o;
    oo.run_bytes = run;
    bdir *dirs = calloc(16, sizeof *dirs);
    int nd = 0, rc = 0;
    char *cp = strdup(o->dirs), *save = NULL;
    for (char *t = strtok_r(cp, ",", &save); t && nd < 16; t = strtok_r(NULL, ",", &save)) {
        bdir *d = &dirs[nd++];
        d->o = &oo;
        snprintf(d->dir, sizeof d->dir, "%s", t);
        d->rng = (o->seed ? o->seed : 1) * 0x9E3779B97F4A7C15ull + nd;
        pthread_mutex_init(&d->mu, NULL);
        if ((rc = open_dir(d, run, err, errlen))) break;
        if ((rc = pool_init(d))) { snprintf(err, errlen, "%s", d->errmsg); break; }
    }
    free(cp);
    int uring = 0;
#ifdef DF_HAVE_URING
    if (o->use_uring) {
        struct io_uring ring;
        if (io_uring_queue_init(o->qd, &ring, 0) == 0) { uring = 1; io_uring_queue_exit(&ring); }
    }
#endif
    snprintf(r->io_engine, sizeof r->io_engine, "%s", uring ? "io_uring" : "pread");
    if (!rc) {
        int per = uring ? 1 : o->qd;
        pthread_t *th = calloc((size_t)nd * per, sizeof(pthread_t));
        pthr *pt = calloc((size_t)nd * per, sizeof(pthr));
        atomic_int spin_stop = 0;
        const int n_spin = o->cpu_load > 0 ? (o->cpu_load < 256 ? o->cpu_load : 256) : 0;
        pthread_t spin[256];
        int spun = 0;
        for (; spun < n_spin; spun++)
            if (pthread_create(&spin[spun], NULL, spin_main, &spin_stop)) break;
        double t0 = now_s();
        for (int i = 0; i < nd; i++) {
            dirs[i].t_begin = t0; /* io_uring queues restart the clock after their setup */
            dirs[i].t_end = t0 + o->seconds;
        }
        for (int i = 0; i < nd; i++)
            for (int k = 0; k < per; k++) {
                pthr *p = &pt[i * per + k];
                p->d = &dirs[i];
#ifdef DF_HAVE_URING
                if (uring) { pthread_create(&th[i * per + k], NULL, uring_main, &dirs[i]); continue; }
#endif
                if (posix_memalign((void **)&p->buf, 4096, o->io_bytes)) p->buf = NULL;
                pthread_create(&th[i * per + k], NULL, pread_main, p);
            }
        for (int i = 0; i < nd * per; i++) pthread_join(th[i], NULL);
        const double t1 = now_s();
        atomic_store(&spin_stop, 1);
        for (int i = 0; i < spun; i++) pthread_join(spin[i], NULL);
        r->n_dirs = nd;
        r->direct = 1;
        r->fixed_buf = uring;
        r->gbps = 0;
        for (int i = 0; i < nd; i++) {
            /* each queue's bytes over its own window (setup excluded); the total is their sum */
            const double dt = (dirs[i].t_done > 0 ? dirs[i].t_done : t1) - dirs[i].t_begin;
            if (dt > r->seconds) r->seconds = dt;
            r->bytes += dirs[i].bytes;
            r->dir_gbps[i] = dt > 0 ? dirs[i].bytes / 1e9 / dt : 0;
            r->gbps += r->dir_gbps[i];
            r->direct &= dirs[i].direct;
            r->fixed_buf &= dirs[i].fixed_buf;
            r->n_sparse += dirs[i].n_sparse;
            if (dirs[i].err && !rc) {
                rc = dirs[i].err;
                snprintf(err, errlen, "%s", dirs[i].errmsg);
            }
        }
        for (int i = 0; i < nd * per; i++) free(pt[i].buf);
        free(th);
        free(pt);
    }
    for (int i = 0; i < nd; i++) {
        for (int f = 0; f < dirs[i].n_files; f++) close(dirs[i].files[f].fd);
        free(dirs[i].files);
        free(dirs[i].pool);
        free(dirs[i].slice_busy);
        pthread_mutex_destroy(&dirs[i].mu);
    }
    free(dirs);
    return rc;
}
