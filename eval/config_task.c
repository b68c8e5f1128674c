/*
 * config_task.c -- the fields of kind `task`: the backend (embedded or URLs,
 * api, threads, ctx, requests in flight), metrics, and the prompt settings
 * (mode / setting, template, kv_spans, n_predict, ignore_eos,
 * variants_per_request), checked against each other.
 *
 * What it is not: no requests (client.c, runner.c).
 */
#include "config_internal.h"
#include "kvs_datasets.h"
#include "kvs_metrics.h"

#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* backend.url: a string or a list of strings (cells spread across them). */
static kvs_status parse_backend_urls(const vctx *v, int idx, int line, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, idx, "url");
    int u = lua_gettop(L);
    if (lua_isnil(L, u)) {
        lua_pop(L, 1);
        return KVS_OK;
    }
    int is_list, n = lua_type(L, u) == LUA_TSTRING ? 1 : kvs_cfg_list_len(L, u, &is_list);
    if (lua_type(L, u) == LUA_TSTRING) is_list = 0;
    if (lua_type(L, u) != LUA_TSTRING && lua_type(L, u) != LUA_TTABLE) {
        rc = kvs_cfg_ferr(v, line, "backend.url", KVS_ERR_INVALID,
                          "expected a URL or a list of URLs, got a %s", kvs_cfg_type_name(L, u));
        goto done;
    }
    if (is_list && (rc = kvs_cfg_check_sequence(v, u, line, "backend.url"))) goto done;
    if (n < 1 || n > 64) {
        rc = kvs_cfg_ferr(v, line, "backend.url", KVS_ERR_INVALID, "%d URLs; give 1 to 64", n);
        goto done;
    }
    e->backend_urls = calloc((size_t)n, sizeof *e->backend_urls);
    if (!e->backend_urls) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    e->n_backend_urls = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "backend.url", is_list, i);
        if (is_list)
            kvs_cfg_list_get(L, u, is_list, i);
        else
            lua_pushvalue(L, u);
        size_t len = 0;
        const char *x = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!x)
            rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "expected a string, got a %s", kvs_cfg_type_name(L, -1));
        else if (len >= sizeof e->backend_urls[0])
            rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "too long (%zu characters)", len);
        else if (strncmp(x, "http://", 7) != 0 && strncmp(x, "https://", 8) != 0)
            rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "'%s' is not an http:// or https:// URL", x);
        else
            memcpy(e->backend_urls[i - 1], x, len + 1);
        lua_pop(L, 1);
        if (rc) goto done;
    }
    snprintf(e->backend_url, sizeof e->backend_url, "%s", e->backend_urls[0]);
done:
    lua_pop(L, 1);
    return rc;
}

static const char *cache_or_f16(const char *t) { return t[0] ? t : "f16"; }

int kvs_cfg_other_cache(const kvs_experiment *a, const kvs_experiment *b) {
    return a->backend_embedded && b->backend_embedded &&
           (strcmp(cache_or_f16(a->backend_cache_k), cache_or_f16(b->backend_cache_k)) ||
            strcmp(cache_or_f16(a->backend_cache_v), cache_or_f16(b->backend_cache_v)));
}

/* backend.cache = { type = T } (K and V) or { k = T, v = T } (llama.cpp's -ctk /
 * -ctv; the one not given stays f16, or type's): kvsieve serve's KV cache types. */
static kvs_status parse_backend_cache(const vctx *v, int idx, int line, kvs_experiment *e) {
    lua_State *L = v->L;
    static const char *const types[] = {"f16", "bf16", "f32", "q8_0", "q4_0", "kivi2", "kivi4", NULL};
    static const char *const keys[] = {"type", "k", "v", NULL};
    lua_getfield(L, idx, "cache");
    int c = lua_gettop(L);
    kvs_status rc = KVS_OK;
    if (lua_isnil(L, c)) goto done;
    if (lua_type(L, c) != LUA_TTABLE) {
        rc = kvs_cfg_ferr(v, line, "backend.cache", KVS_ERR_INVALID,
                          "expected { type = \"q8_0\" } or { k = \"q8_0\", v = \"q4_0\" }, got a %s",
                          kvs_cfg_type_name(L, c));
        goto done;
    }
    int cl = kvs_cfg_table_line(L, c, line), wt = 0, wk = 0, wv = 0; /* 0: f16 */
    char ty[16], k[16], vv[16];
    if ((rc = kvs_cfg_check_keys(v, c, cl, "backend.cache.", keys)) ||
        (rc = kvs_cfg_get_string(v, c, cl, "type", "backend.cache.type", ty, sizeof ty, 0)) ||
        (rc = kvs_cfg_get_string(v, c, cl, "k", "backend.cache.k", k, sizeof k, 0)) ||
        (rc = kvs_cfg_get_string(v, c, cl, "v", "backend.cache.v", vv, sizeof vv, 0)))
        goto done;
    if (ty[0] && (k[0] || vv[0])) {
        rc = kvs_cfg_ferr(v, cl, "backend.cache", KVS_ERR_INVALID, "give type (K and V) or k and v, not both");
        goto done;
    }
    if ((ty[0] && (rc = kvs_cfg_check_choice(v, cl, "backend.cache.type", ty, types, &wt))) ||
        (k[0] && (rc = kvs_cfg_check_choice(v, cl, "backend.cache.k", k, types, &wk))) ||
        (vv[0] && (rc = kvs_cfg_check_choice(v, cl, "backend.cache.v", vv, types, &wv))))
        goto done;
    snprintf(e->backend_cache_k, sizeof e->backend_cache_k, "%s", types[ty[0] ? wt : wk]);
    snprintf(e->backend_cache_v, sizeof e->backend_cache_v, "%s", types[ty[0] ? wt : wv]);
done:
    lua_pop(L, 1);
    return rc;
}

kvs_status kvs_cfg_parse_backend(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    e->in_flight = 2;
    lua_getfield(L, t, "backend");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        e->backend_embedded = 1;
    } else if (lua_type(L, idx) != LUA_TTABLE) {
        rc = kvs_cfg_ferr(v, e->line, "backend", KVS_ERR_INVALID,
                          "expected { embedded = true } or { url = \"http://host:port\" }, got a %s",
                          kvs_cfg_type_name(L, idx));
    } else {
        int line = kvs_cfg_table_line(L, idx, e->line);
        static const char *const keys[] = {"embedded", "url", "model",     "api",   "threads",
                                           "ctx",      "cache", "in_flight", NULL};
        int64_t x;
        char api[16];
        if (!(rc = kvs_cfg_check_keys(v, idx, line, "backend.", keys)) &&
            !(rc = parse_backend_urls(v, idx, line, e)) &&
            !(rc = kvs_cfg_get_string(v, idx, line, "model", "backend.model", e->model, sizeof e->model,
                                      0)) &&
            !(rc = kvs_cfg_get_string(v, idx, line, "api", "backend.api", api, sizeof api, 0))) {
            lua_getfield(L, idx, "embedded");
            int has_emb = !lua_isnil(L, -1);
            if (has_emb && !lua_isboolean(L, -1))
                rc = kvs_cfg_ferr(v, line, "backend.embedded", KVS_ERR_INVALID,
                                  "expected true or false, got a %s", kvs_cfg_type_name(L, -1));
            e->backend_embedded = lua_toboolean(L, -1);
            lua_pop(L, 1);
            if (!rc && e->backend_embedded == (e->n_backend_urls > 0))
                rc = kvs_cfg_ferr(v, line, NULL, KVS_ERR_INVALID,
                                  "backend: give exactly one of embedded = true or url = \"...\"");
            static const char *const apis[] = {"kvsieve", "openai", NULL};
            int which = 0;
            if (!rc && api[0] && !(rc = kvs_cfg_check_choice(v, line, "backend.api", api, apis, &which)))
                e->backend_openai = which == 1;
            if (!rc && e->backend_openai && e->backend_embedded)
                rc = kvs_cfg_ferr(v, line, "backend.api", KVS_ERR_INVALID,
                                  "the embedded backend is kvsieve's own server; api = \"openai\" is for "
                                  "url = ... servers");
            if (!rc && !(rc = kvs_cfg_get_int(v, idx, line, "threads", "backend.threads", 1, 1024, 0, &x)))
                e->backend_threads = (int)x;
            if (!rc && !(rc = kvs_cfg_get_int(v, idx, line, "ctx", "backend.ctx", 64, 1 << 24, 0, &x)))
                e->backend_ctx = (int)x;
            if (!rc && !(rc = kvs_cfg_get_int(v, idx, line, "in_flight", "backend.in_flight", 1, 64, 2, &x)))
                e->in_flight = (int)x;
            if (!rc) rc = parse_backend_cache(v, idx, line, e);
            if (!rc && !e->backend_embedded && (e->backend_threads || e->backend_ctx || e->backend_cache_k[0]))
                rc = kvs_cfg_ferr(v, line,
                                  e->backend_threads ? "backend.threads"
                                  : e->backend_ctx   ? "backend.ctx"
                                                     : "backend.cache",
                                  KVS_ERR_INVALID, "only for embedded = true (a url backend is started "
                                  "by whoever runs it)");
        }
    }
    lua_pop(L, 1);
    return rc;
}

/* mode (a value or a list), template, n_predict, ignore_eos, variants_per_request. */
kvs_status kvs_cfg_parse_task_fields(const vctx *v, int t, kvs_experiment *e) {
    kvs_status rc;
    static const char *const modes[] = {"query_aware", "query_agnostic", NULL};
    /* mode, or its name `setting` (at the experiment or in the dataset) */
    lua_getfield(v->L, t, "mode");
    int has_mode = !lua_isnil(v->L, -1);
    lua_pop(v->L, 1);
    lua_getfield(v->L, t, "setting");
    int has_setting = !lua_isnil(v->L, -1);
    lua_pop(v->L, 1);
    if (has_mode + has_setting + (e->n_ds_modes > 0) > 1)
        return kvs_cfg_ferr(v, e->line, has_setting ? "setting" : "mode", KVS_ERR_INVALID,
                            "give the setting once: mode, setting and dataset.setting are the same field");
    if (e->n_ds_modes > 0) {
        e->n_modes = e->n_ds_modes;
        memcpy(e->modes, e->ds_modes, sizeof e->modes);
    } else if ((rc = kvs_cfg_get_choice_list(v, t, e->line, has_setting ? "setting" : "mode", modes, 0, e->modes,
                                             2, &e->n_modes))) {
        return rc;
    }
    if ((rc = kvs_cfg_get_string(v, t, e->line, "template", "template", e->prompt_template,
                                 sizeof e->prompt_template, 0)))
        return rc;
    if (e->prompt_template[0]) {
        const kvs_prompt_template *pt;
        kvs_err e2 = {0};
        if (kvs_prompt_template_get(e->prompt_template, &pt, &e2))
            return kvs_cfg_ferr(v, e->line, "template", KVS_ERR_INVALID, "%s", e2.msg);
    }
    lua_getfield(v->L, t, "kv_spans");
    int ks_type = lua_type(v->L, -1);
    e->no_kv_spans = ks_type == LUA_TBOOLEAN && !lua_toboolean(v->L, -1);
    lua_pop(v->L, 1);
    if (ks_type != LUA_TNIL && ks_type != LUA_TBOOLEAN)
        return kvs_cfg_ferr(v, e->line, "kv_spans", KVS_ERR_INVALID, "expected true or false");
    int64_t x;
    int dflt = !strcmp(e->dataset, "niah") ? 24 : !strcmp(e->dataset, "ruler") ? 0 : 64;
    if ((rc = kvs_cfg_get_int(v, t, e->line, "n_predict", "n_predict", 1, 1 << 16, dflt, &x))) return rc;
    e->n_predict = (int)x;
    lua_getfield(v->L, t, "ignore_eos");
    int has_ie = !lua_isnil(v->L, -1), ie_ok = lua_isboolean(v->L, -1);
    e->ignore_eos = lua_toboolean(v->L, -1);
    lua_pop(v->L, 1);
    if (has_ie && !ie_ok)
        return kvs_cfg_ferr(v, e->line, "ignore_eos", KVS_ERR_INVALID, "expected true or false");
    if ((rc = kvs_cfg_get_int(v, t, e->line, "variants_per_request", "variants_per_request", 0, 160, 0,
                              &x)))
        return rc;
    e->variants_per_request = (int)x;
    if (e->backend_openai)
        for (int i = 0; i < e->n_variants; i++)
            if (e->variants[i].method != &kvs_method_full)
                return kvs_cfg_ferr(v, e->line, "methods", KVS_ERR_INVALID,
                                    "method '%s': backend api 'openai' (a plain OpenAI-compatible server, "
                                    "no kv_compression) can only evaluate 'full'",
                                    e->variants[i].method->name);
    for (int i = 0; i < e->n_modes; i++)
        if (e->modes[i] == KVS_PROMPT_QUERY_AGNOSTIC && e->backend_openai)
            return kvs_cfg_ferr(v, e->line, "mode", KVS_ERR_INVALID,
                                "query_agnostic needs the kvsieve kv_compression extension (backend api "
                                "'openai' cannot append the question after a compression)");
    return KVS_OK;
}

kvs_status kvs_cfg_parse_metrics(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    const char *const *known = kvs_metric_names();
    lua_getfield(L, t, "metrics");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, e->line, NULL, KVS_ERR_INVALID,
                            "metrics: missing (required for kind 'task'), e.g. metrics = { \"contains\" }");
    }
    int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, e->line, "metrics"))) goto done;
    e->metrics = calloc((size_t)n, sizeof *e->metrics);
    if (!e->metrics) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    e->n_metrics = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        int which;
        kvs_cfg_elem_name(name, sizeof name, "metrics", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        snprintf(e->metrics[i - 1], sizeof e->metrics[i - 1], "%s", s);
        lua_pop(L, 1);
        if ((rc = kvs_cfg_check_choice(v, e->line, name, e->metrics[i - 1], known, &which))) goto done;
    }
done:
    lua_pop(L, 1);
    return rc;
}
