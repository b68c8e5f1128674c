/*
 * cache_args.c -- the KV cache type flags shared by serve, generate and bench
 * (--cache-type, llama.cpp's -ctk / -ctv). Built with the backend only.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvs_backend.h"

int kvs_arg_cache_type(const char *cmd, int argc, char **argv, int *i, int *ctk, int *ctv) {
    const char *a = argv[*i];
    const int both = !strcmp(a, "--cache-type");
    const int k = !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctk");
    const int v = !strcmp(a, "--cache-type-v") || !strcmp(a, "-ctv");
    if (!both && !k && !v) return -1;
    const char *text = kvs_arg_value(argc, argv, i);
    if (!text) return 2;
    int t;
    kvs_err e = {0};
    if (kvs_cache_type_parse(text, &t, &e) != KVS_OK) {
        fprintf(stderr, "kvsieve %s: %s: %s\n", cmd, a, e.msg);
        return 2;
    }
    if (both) *ctk = t, *ctv = 0;
    else if (v) *ctv = KVS_CACHE_V(t);
    else {
        if (*ctv == 0) *ctv = KVS_CACHE_V(*ctk); /* V keeps the type it had */
        *ctk = t;
    }
    return 0;
}

int kvs_arg_kivi(int argc, char **argv, int *i, long kivi[2]) {
    const char *a = argv[*i];
    const int g = !strcmp(a, "--kivi-group"), r = !strcmp(a, "--kivi-residual");
    if (!g && !r) return -1;
    const char *v = kvs_arg_value(argc, argv, i);
    return !v || kvs_arg_int(a, v, 1, 1 << 16, &kivi[r]) ? 2 : 0;
}

kvs_status kvs_kivi_apply(kvs_session *s, int ctk, const long kivi[2], kvs_err *err) {
    if (!kvs_cache_is_kivi(ctk) || (kivi[0] <= 0 && kivi[1] <= 0)) return KVS_OK;
    return kvs_session_set_kivi(s, (int)kivi[0], (int)kivi[1], err);
}

const char *kvs_cache_types_str(int ctk, int ctv, char *buf) {
    const int v = ctv ? ctv - 1 : ctk;
    snprintf(buf, 32, v == ctk ? "%s" : "%s/%s", kvs_cache_type_name(ctk), kvs_cache_type_name(v));
    return buf;
}
