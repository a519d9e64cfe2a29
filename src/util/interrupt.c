/* interrupt.c — for commands that write a model (`deltafin convert`, `deltafin synth`):
 * SIGINT / SIGTERM / SIGHUP as a request to stop, so the writer removes its partial files
 * and exits non-zero; and a per-directory writer lock (flock on the directory itself), so
 * a new run can tell a dead run's leftover *.tmp files from a live run's (see util.h). */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) {
    if (g_signal) { /* a second signal: stop at once (the next run removes the leftovers) */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_signal = sig;
}

void df_interrupt_install(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        /* a signal ignored by the parent (nohup, `cmd &` without job control) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

int df_interrupted(void) { return (int)g_signal; }

void df_interrupt_clear(void) { g_signal = 0; }

const char *df_signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
    }
}

int df_dir_lock(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno == EWOULDBLOCK ? EBUSY : errno;
        close(fd);
        return -e;
    }
    return fd;
}
