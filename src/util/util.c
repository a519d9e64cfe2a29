/* util.c — error formatting, aligned allocation, whole-file reads and atomic
 * writes, small filesystem helpers (see util.h). */
#include "util.h"
#include "deltafin.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void df_set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int df_set_errc(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (!err || !errlen) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

int df_env_switch(const char *name, const char *flag, int ungated, int *mode, char *err, size_t errlen) {
    const char *v = getenv(name);
    *mode = 0;
    if (!v || !*v) return DF_OK;
    if (!strcmp(v, "1") || !strcmp(v, "on")) *mode = 1;
    else if (!strcmp(v, "0") || !strcmp(v, "off")) *mode = 2;
    else if (ungated && !strcmp(v, "ungated")) *mode = 3;
    else return df_set_errc(err, errlen, DF_EINVAL, "environment variable %s=\"%s\": expected %s (the alias of %s on|off%s); "
                            "unset it or fix its value", name, v, ungated ? "1, on, 0, off or ungated" : "1, on, 0 or off",
                            flag, ungated ? "|ungated" : "");
    return DF_OK;
}

void *df_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, size ? size : align) != 0) return NULL;
    return p;
}

void df_aligned_free(void *p) { free(p); }

int df_read_file(const char *path, char **buf, size_t *len, char *err, size_t errlen) {
    *buf = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return df_set_errc(err, errlen, DF_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    size_t n = (size_t)st.st_size;
    char *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return df_set_errc(err, errlen, DF_ENOMEM, "out of memory reading %s (%zu bytes)", path, n);
    }
    int rc = df_pread_all(fd, b, n, 0);
    close(fd);
    if (rc) {
        free(b);
        return df_set_errc(err, errlen, DF_EIO, "cannot read %s: %s", path, strerror(-rc));
    }
    b[n] = 0;
    *buf = b;
    if (len) *len = n;
    return DF_OK;
}

int df_pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
    const char *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (w == 0) return -EIO;
        p += w; len -= (size_t)w; off += (uint64_t)w;
    }
    return 0;
}

int df_pread_all(int fd, void *buf, size_t len, uint64_t off) {
    char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO; /* unexpected end of file */
        p += r; len -= (size_t)r; off += (uint64_t)r;
    }
    return 0;
}

int df_fsync_dir_of(const char *path, char *err, size_t errlen) {
    char tmp[4096];
    const char *dir = path;
    if (!df_is_dir(path)) {
        snprintf(tmp, sizeof tmp, "%s", path);
        dir = dirname(tmp);
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) return df_set_errc(err, errlen, DF_EIO, "cannot fsync directory %s: %s", dir, strerror(e));
    return DF_OK;
}

int df_write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return df_set_errc(err, errlen, DF_EINVAL, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return df_set_errc(err, errlen, DF_EIO, "cannot create %s: %s", tmp, strerror(errno));
    int rc = df_pwrite_all(fd, data, len, 0);
    if (rc == 0 && fsync(fd) != 0) rc = -errno;
    if (close(fd) != 0 && rc == 0) rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
    if (rc != 0) {
        unlink(tmp);
        return df_set_errc(err, errlen, DF_EIO, "cannot write %s: %s", path, strerror(-rc));
    }
    return df_fsync_dir_of(path, err, errlen);
}

int df_copy_file_atomic(const char *src, const char *dst, char *err, size_t errlen) {
    char *buf;
    size_t n;
    int rc = df_read_file(src, &buf, &n, err, errlen);
    if (rc) return rc;
    rc = df_write_file_atomic(dst, buf, n, err, errlen);
    free(buf);
    return rc;
}

int df_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int df_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int df_mkdir_p(const char *path, char *err, size_t errlen) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return df_set_errc(err, errlen, DF_EINVAL, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return df_set_errc(err, errlen, DF_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return df_set_errc(err, errlen, DF_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
    if (!df_is_dir(tmp)) return df_set_errc(err, errlen, DF_EIO, "%s exists and is not a directory", tmp);
    return DF_OK;
}

int df_path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return (n < 0 || (size_t)n >= cap) ? DF_EINVAL : DF_OK;
}

double df_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void df_run_workers(int n, void *(*fn)(void *), void *arg) {
    pthread_t th[64];
    int started = 0;
    for (int t = 0; t < n && t < 64; t++) {
        if (pthread_create(&th[t], NULL, fn, arg) != 0) break;
        started++;
    }
    if (!started) fn(arg);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}

int df_n_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
