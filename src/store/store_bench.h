/*
 * store_bench.h — raw read-bandwidth measurement of expert drives, with the
 * same I/O path as the store (O_DIRECT, io_uring or a pread pool, one queue per
 * directory). Used by `deltafin bench io` and `deltafin bench decode`.
 */
#ifndef DF_STORE_BENCH_H
#define DF_STORE_BENCH_H

#include <stdint.h>
#include <stddef.h>

typedef struct {
    const char *dirs;        /* comma-separated directories; every regular file >= run_bytes in each is read */
    uint64_t io_bytes;       /* one read (default 1 MiB) */
    uint64_t run_bytes;      /* bytes read back to back from one random io_bytes-aligned offset (one expert
                                extent in the engine; 0 = io_bytes) */
    int qd;                  /* reads in flight per directory (default 16) */
    double seconds;          /* duration (default 10) */
    int use_uring;           /* 1 = io_uring (default), 0 = pread threads */
    uint64_t seed;
    int group;               /* >1: runs come in groups of `group` distinct run-aligned extents of one file, in
                                ascending offset order (one MoE layer's top-k experts, as the engine reads them);
                                0/1 = independent random runs */
    uint64_t buffer_bytes;   /* the destination: reads land in consecutive read-sized slices of a pool this large
                                (touched before the clock starts), as the store fills its expert cache; 0 = qd
                                reads' worth, reused (fio's default). On some virtual machines the drive delivers
                                much less into a pool of gigabytes than into a few reused megabytes. */
    int fixed;               /* 1: the destination (reused buffers or the pool) registered with the io_uring
                                (read_fixed: no page pinning per read, as fio's fixedbufs); 0 (default): plain reads,
                                as the store reads and as fio by default */
    int cpu_load;            /* threads kept computing (a loop in registers, no memory traffic) for the measurement:
                                what the drive delivers while the cores are busy, as in a decode that overlaps its
                                reads with compute. On some virtual machines the host's I/O emulation shares the
                                guest's cores, and the drive then reads much slower than when they idle. 0 = none */
    const char *match;       /* fnmatch pattern of the file names to read (e.g. "experts-L*.pack": a model
                                directory's packs, not its spine); NULL = every large enough file */
} store_bench_opts;

typedef struct {
    int n_dirs;
    double gbps;             /* total, 1e9 bytes / s */
    double dir_gbps[16];
    uint64_t bytes;
    double seconds;
    int direct;              /* 1 if every file was read with O_DIRECT */
    int fixed_buf;           /* 1 if every queue read into buffers registered with its io_uring */
    int n_sparse;            /* files not read: sparse or preallocated (holes / unwritten extents) */
    char io_engine[16];
} store_bench_result;

void store_bench_opts_default(store_bench_opts *o);
/* Random-offset reads over the files of each directory for o->seconds.
 * DF_EINVAL (no file large enough: the message names the directory), DF_EIO. */
int store_bench_io(const store_bench_opts *o, store_bench_result *r, char *err, size_t errlen);

#endif
