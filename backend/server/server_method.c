/*
 * server_method.c -- the `method` of a kv_compression request: a registered
 * method's name, or a method composed from parts, given as a JSON object
 * ({"score": "snapkv", "allocate": "pyramid", "keep": {"sinks": 4}}) or as
 * that object's text. methods/parts' kvs_composed_from_cjson does the work
 * (the CLI and Lua configs use the same); this file only words its errors
 * (the caller answers 400) naming the field ("kv_compression.method: score: unknown scorer
 * 'snapk' (did you mean 'snapkv'?) ...") and keeps the composed method with
 * the variant (freed with the request).
 */
#include "server_internal.h"

#include "kvs_parts.h"
#include "kvsieve_methods.h"

#include <stdio.h>

int srv_parse_method(const cJSON *o, const char *field, variant_req *v, char *msg, size_t n) {
    char f[160];
    snprintf(f, sizeof f, "%s.method", field);
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(o, "method");
    if (!jm || cJSON_IsNull(jm)) return snprintf(msg, n, "%s is required", f), -1;
    kvs_err err = {0};
    kvs_status rc;
    if (cJSON_IsObject(jm)) {
        rc = kvs_composed_from_cjson(jm, &v->owned, &err);
        v->method = rc ? NULL : kvs_composed_method(v->owned);
    } else if (cJSON_IsString(jm)) {
        rc = kvs_method_resolve(jm->valuestring, &v->method, &v->owned, &err);
    } else {
        snprintf(msg, n, "%s must be a method name or an object {score, allocate, keep, pick, params}",
                 f);
        return -1;
    }
    if (rc) return snprintf(msg, n, "%s: %s", f, err.msg), -1;
    return 0;
}
