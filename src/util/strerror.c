/* strerror.c — df_strerror: human-readable text of the DF_E* codes (public API). */
#include "deltafin.h"

const char *df_strerror(int code) {
    switch (code) {
    case DF_OK: return "ok";
    case DF_EINVAL: return "invalid argument";
    case DF_EIO: return "I/O error";
    case DF_EFORMAT: return "malformed or corrupt file";
    case DF_EUNSUPPORTED: return "unsupported input";
    case DF_ENOMEM: return "out of memory";
    case DF_EBUDGET: return "RAM budget too small";
    case DF_ECANCELLED: return "cancelled";
    case DF_ECONTEXT: return "context (KV cache) full";
    default: return "unknown error";
    }
}
