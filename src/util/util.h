/*
 * util.h — small helpers shared by every module: error messages, aligned
 * allocation, whole-file reads, atomic file writes, exact number-format
 * conversions (bf16 / f16 / fp8 e4m3fn / fp4 e2m1 / e8m0 -> f32), XXH64 helpers
 * and a one-line progress printer.
 *
 * Error convention (as include/deltafin.h): fallible functions return 0 or a
 * negative DF_E* code and, when err != NULL, a one-line message in err.
 */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------ errors */

/* printf-style message into err[0..errlen-1] (no-op when err is NULL or
 * errlen is 0). Always returns `code`, so callers can write
 * `return df_set_errc(err, errlen, DF_EIO, "...")`. */
void df_set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int df_set_errc(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* An on/off environment alias of a model option (DF_PREFETCH of --prefetch, DF_PREFAULT of --prefault; the engine
 * reads it when the option is not given, the CLI checks it first) into *mode: unset or empty = 0 (not given),
 * "1"/"on" = 1, "0"/"off" = 2, and when `ungated` (DF_PREFETCH) "ungated" = 3. Anything else: DF_EINVAL with a
 * message naming the variable, its value, the accepted values and `flag`. */
int df_env_switch(const char *name, const char *flag, int ungated, int *mode, char *err, size_t errlen);

/* ------------------------------------------------------------------ memory */

/* Aligned allocation (align: power of two >= sizeof(void*)); size 0 gives a
 * valid minimal block. Free with df_aligned_free. NULL on failure. */
void *df_aligned_alloc(size_t align, size_t size);
void df_aligned_free(void *p);
/* round x up to a multiple of a (a > 0) */
static inline uint64_t df_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ------------------------------------------------------------------- files */

/* Read a whole file into a malloc'd buffer with a trailing NUL (not counted in
 * *len; len may be NULL). DF_EIO with the path and errno text on failure. */
int df_read_file(const char *path, char **buf, size_t *len, char *err, size_t errlen);
/* Write data to `path` atomically: path.tmp, write, fsync, rename, fsync the
 * directory. On any error the .tmp file is removed and nothing at `path` changes. */
int df_write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);
/* fsync the directory containing `path` (or `path` itself when it is a directory). */
int df_fsync_dir_of(const char *path, char *err, size_t errlen);
/* Copy a file atomically (df_write_file_atomic of its contents). */
int df_copy_file_atomic(const char *src, const char *dst, char *err, size_t errlen);
/* 1 if path exists (any type), else 0. */
int df_path_exists(const char *path);
int df_is_dir(const char *path);
/* mkdir -p (mode 0755). */
int df_mkdir_p(const char *path, char *err, size_t errlen);
/* Join dir + "/" + name into out (cap bytes); DF_EINVAL when it does not fit. */
int df_path_join(char *out, size_t cap, const char *dir, const char *name);
/* pwrite / pread everything (retries short transfers and EINTR); 0 or -errno. */
int df_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
int df_pread_all(int fd, void *buf, size_t len, uint64_t off);

/* ----------------------------------------------------- number conversions */
/* All exact: every value of the source format is representable in f32.
 * Sources: IEEE 754 (f16), bfloat16 = top half of f32, OCP MX spec v1.0
 * (e4m3fn: bias 7, no inf, S.1111.111 = NaN; e2m1: 0,.5,1,1.5,2,3,4,6 with
 * sign in bit 3; e8m0: 2^(e-127), 0xFF = NaN). */
extern const float df_fp8_e4m3_table[256];
extern const float df_e2m1_table[16];
static inline float df_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
float df_f16_to_f32(uint16_t h);
static inline float df_fp8_e4m3_to_f32(uint8_t b) { return df_fp8_e4m3_table[b]; }
static inline float df_e2m1_to_f32(uint8_t nib) { return df_e2m1_table[nib & 15]; }
float df_e8m0_to_f32(uint8_t e);
/* f32 -> bf16 with round-to-nearest-even (NaN stays a quiet NaN). */
uint16_t df_f32_to_bf16(float f);
/* 1 if f is exactly representable as bf16 (NaN counts as representable). */
int df_f32_is_bf16_exact(float f);

/* -------------------------------------------------------------------- hash */

/* XXH64 with seed 0 (the checksum of docs/native-format.md). */
uint64_t df_xxh64(const void *data, size_t len);
/* 16 lowercase hex digits + NUL into out[17]. */
void df_xxh64_hex(uint64_t h, char out[17]);
/* Parse 16 hex digits; 0 ok, DF_EFORMAT otherwise. */
int df_xxh64_parse(const char *s, uint64_t *h);

/* Monotonic seconds. */
double df_now(void);
/* Number of online CPUs (>= 1). */
int df_n_cpus(void);
/* Run fn(arg) on up to n threads (at most 64) at once and wait for all of them; fn shares the work through arg
 * (e.g. an atomic index), so one thread suffices: when none can be started, fn runs on the calling thread. */
void df_run_workers(int n, void *(*fn)(void *), void *arg);

/* ---------------------------------------------------------- UTF-8 (utf8.c) */

/* Well-formed UTF-8 is RFC 3629's: no overlong forms, surrogates (U+D800..U+DFFF) or code points above U+10FFFF.
 * df_utf8_seq: the length (1..4) of the well-formed sequence at s[0..n) (n >= 1), 0 when it is ill-formed, -1 when
 * it is a well-formed but incomplete prefix (it needs bytes past n). */
int df_utf8_seq(const unsigned char *s, size_t n);
/* The offset of the first byte of s[0..n) that does not start a well-formed, complete sequence (a stray
 * continuation byte, an invalid lead byte, the lead byte of an ill-formed or truncated sequence), or n when all of
 * s[0..n) is well-formed UTF-8. */
size_t df_utf8_invalid_at(const char *s, size_t n);
/* The 4 hex digits of a JSON \uXXXX escape at s (either case): 0 with their value in *v, or -1 at the first
 * character that is not one (s is read no further, so a NUL-terminated s is safe). */
int df_hex4(const char *s, unsigned *v);

/* ------------------------------------------------ shell quoting (shquote.c) */

/* `s` as one word of a POSIX shell command line, for the commands messages suggest (`rm -rf DIR`,
 * `deltafin doctor --model DIR`): s itself when every character is plain (letters, digits, _@%+=:,./-),
 * else s in single quotes with each embedded ' written '\''. Writes into out (cap bytes) and returns out;
 * when the quoted word does not fit, out gets '(path too long)' (never a truncated word). */
const char *df_shell_quote(const char *s, char *out, size_t cap);

/* A message about the files of an install of `deltafin setup`: the engine's advice for a model the user converted,
 * "re-run `deltafin convert`" or "convert again" (its first occurrence), becomes "repair the install with `FIX`"
 * (fix: the setup command, already shell-quoted). msg is rewritten in place within cap bytes; unchanged when it has
 * no such advice. */
void df_advice_setup_repair(char *msg, size_t cap, const char *fix);
/* The same for a model the user converted: the advice becomes "convert again: `FIX`" (FIX the convert command). */
void df_advice_convert_repair(char *msg, size_t cap, const char *fix);
/* msg without the engine's advice to convert again ("; convert again", "; re-run `deltafin convert`"), for a message
 * that names its own repair (`deltafin list`: the setup command; `deltafin setup`: what it does); in place. */
void df_advice_strip(char *msg);

/* ------------------------------------------------- interruption (interrupt.c) */

/* Commands that write a model: SIGINT, SIGTERM and SIGHUP become a request to stop.
 * The first one only sets a flag (df_interrupted) that the writer polls, so it can
 * remove its partial files and exit non-zero; a second one ends the process at once
 * (its *.tmp files are then recognised and removed by the next run). Signals the
 * parent set to be ignored stay ignored. */
void df_interrupt_install(void);
/* The signal received since df_interrupt_install (SIGINT, ...), or 0. Async-signal-safe. */
int df_interrupted(void);
/* Forget a signal recorded by the handlers of df_interrupt_install (after its writer has stopped and the
 * caller has dealt with it, e.g. re-raised it under the previous disposition). */
void df_interrupt_clear(void);
/* "SIGINT", "SIGTERM", "SIGHUP" (else "a signal"). */
const char *df_signal_name(int sig);
/* Writer lock on a directory: an exclusive, non-blocking flock on the directory itself,
 * held until the returned fd is closed or the process ends (also by kill -9). Returns
 * the fd (>= 0), -EBUSY when another process holds it, or -errno. */
int df_dir_lock(const char *dir);

#endif
