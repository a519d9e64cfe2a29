/* hub_curl.c — hub_curl.h: libcurl's functions resolved from the shared library at the first download. */
#include "hub_curl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifndef DF_CURL_SONAME
#define DF_CURL_SONAME "libcurl.so.4"
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static hub_curl g_api;
static const hub_curl *g_ok;
static char g_err[512];

/* one symbol into *slot; 0 when it is missing */
static int sym(void *lib, const char *name, void *slot) {
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(g_err, sizeof g_err, "libcurl: the library has no %s (too old a libcurl: setup needs 7.66 or later)",
                 name);
        return 0;
    }
    memcpy(slot, &p, sizeof p);
    return 1;
}

static void open_once(void) {
    static const char *const names[] = {DF_CURL_SONAME, "libcurl.so.4", "libcurl-gnutls.so.4"};
    void *lib = NULL;
    char first[256] = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && !first[0]) snprintf(first, sizeof first, "%s", dlerror());
    }
    if (!lib) {
        snprintf(g_err, sizeof g_err,
                 "libcurl: cannot open %s (%s); install libcurl (Debian: apt-get install libcurl4) for setup's downloads",
                 DF_CURL_SONAME, first);
        return;
    }
    hub_curl a;
    CURLcode (*global_init)(long) = NULL;
    if (!sym(lib, "curl_global_init", &global_init) || !sym(lib, "curl_easy_init", &a.easy_init) ||
        !sym(lib, "curl_easy_setopt", &a.easy_setopt) || !sym(lib, "curl_easy_perform", &a.easy_perform) ||
        !sym(lib, "curl_easy_getinfo", &a.easy_getinfo) || !sym(lib, "curl_easy_cleanup", &a.easy_cleanup) ||
        !sym(lib, "curl_easy_strerror", &a.easy_strerror) || !sym(lib, "curl_slist_append", &a.slist_append) ||
        !sym(lib, "curl_slist_free_all", &a.slist_free_all) || !sym(lib, "curl_multi_init", &a.multi_init) ||
        !sym(lib, "curl_multi_setopt", &a.multi_setopt) || !sym(lib, "curl_multi_add_handle", &a.multi_add_handle) ||
        !sym(lib, "curl_multi_remove_handle", &a.multi_remove_handle) ||
        !sym(lib, "curl_multi_perform", &a.multi_perform) || !sym(lib, "curl_multi_info_read", &a.multi_info_read) ||
        !sym(lib, "curl_multi_poll", &a.multi_poll) || !sym(lib, "curl_multi_cleanup", &a.multi_cleanup))
        return; /* the library stays mapped: a half-resolved handle is never used */
    CURLcode c = global_init(CURL_GLOBAL_DEFAULT);
    if (c != CURLE_OK) {
        snprintf(g_err, sizeof g_err, "libcurl: curl_global_init failed (%s)", a.easy_strerror(c));
        return;
    }
    g_api = a;
    g_ok = &g_api;
}

const hub_curl *hub_curl_open(char *err, size_t errlen) {
    pthread_once(&g_once, open_once);
    if (!g_ok && err && errlen) snprintf(err, errlen, "%s", g_err);
    return g_ok;
}

const hub_curl *hub_curl_api(void) { return g_ok; }
