/* convert_stub.c — placeholder; the model owner deletes this when convert.c lands. */
#include "deltafin.h"
#include <stdio.h>
#include <string.h>
void df_convert_opts_default(df_convert_opts *o) { memset(o, 0, sizeof *o); }
int df_convert(const char *hf_dir, const char *out_dir, const df_convert_opts *opts, char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "df_convert: not implemented yet");
    return DF_EUNSUPPORTED;
}
