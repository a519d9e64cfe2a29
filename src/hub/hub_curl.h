/*
 * hub_curl.h — libcurl, opened with dlopen when a download first needs it (hub_init), so that `run`, `serve`
 * and the other commands that never touch the network do not map libcurl and its TLS, Kerberos and LDAP
 * dependencies (about 4.4 MiB of resident memory at start, which counts against the peak RSS that --ram-budget
 * bounds). The declarations and constants are libcurl's own (<curl/curl.h>); the calls go through the table.
 */
#ifndef DF_HUB_CURL_H
#define DF_HUB_CURL_H

#include <curl/curl.h>
#include <stddef.h>

typedef struct hub_curl {
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_setopt)(CURLM *, CURLMoption, ...);
    CURLMcode (*multi_add_handle)(CURLM *, CURL *);
    CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
    CURLMcode (*multi_perform)(CURLM *, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    CURLMcode (*multi_poll)(CURLM *, struct curl_waitfd[], unsigned int, int, int *);
    CURLMcode (*multi_cleanup)(CURLM *);
} hub_curl;

/* Opens libcurl once (thread-safe; the sonames DF_CURL_SONAME of the build, then libcurl.so.4,
 * libcurl-gnutls.so.4), resolves the functions above and runs curl_global_init(CURL_GLOBAL_DEFAULT).
 * Returns the table, or NULL with a message in err naming the library and the package to install. */
const hub_curl *hub_curl_open(char *err, size_t errlen);

/* The table after a successful hub_curl_open (every hub_ctx has one: hub_init opens it); NULL before. */
const hub_curl *hub_curl_api(void);

#endif
