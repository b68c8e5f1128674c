/*
 * config_method.c -- composed methods in a Lua config:
 *   methods = { "snapkv", { name = "ada_tova", score = "tova",
 *               allocate = "pyramid", keep = { sinks = 4, window = 8 },
 *               pick = "chunk", params = { chunk = 16 } } }
 * What it is: the Lua table turned into the JSON description methods/parts
 * reads (kvs_composed_from_cjson: one parser for the CLI, the HTTP API and
 * configs), the composed method kept by the experiment, and its variant:
 * one, with the described values (a sweep over a composed method is a list
 * of compositions). Its cell identity is the method's name, the canonical
 * JSON; the label in reports is its `name` (or a short label of its parts).
 * Its label must differ from every registered method's name and from the
 * other compositions' labels (reports group results by label).
 * What it is not: no validation of the description (its errors name the
 * field and the part), no sweeps.
 */
#include "config_method.h"

#include "kvs_parts.h"
#include "kvsieve_methods.h"

#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Lua value at idx as JSON: tables with keys 1..n are lists, other
 * tables objects (string keys only); integers stay integers. */
static cJSON *lua_json(lua_State *L, int idx, int depth, kvs_err *err) {
    idx = lua_absindex(L, idx);
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TNUMBER: return cJSON_CreateNumber(lua_tonumber(L, idx));
    case LUA_TSTRING: return cJSON_CreateString(lua_tostring(L, idx));
    case LUA_TTABLE: break;
    default:
        kvs_errorf(err, KVS_ERR_INVALID, "a %s cannot be part of a method description",
                   luaL_typename(L, idx));
        return NULL;
    }
    if (depth > 4) {
        kvs_errorf(err, KVS_ERR_INVALID, "method description nested too deeply");
        return NULL;
    }
    const lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    int n_keys = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) n_keys++, lua_pop(L, 1);
    const int is_list = n > 0 && n == n_keys;
    cJSON *o = is_list ? cJSON_CreateArray() : cJSON_CreateObject();
    if (!o) {
        kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (is_list) {
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, i);
            cJSON *c = lua_json(L, -1, depth + 1, err);
            lua_pop(L, 1);
            if (!c) goto fail;
            cJSON_AddItemToArray(o, c);
        }
        return o;
    }
    /* object: keys in sorted order, so Lua's hash order never shows (the
     * keep rules' priority is then their sorted order: prefix before suffix
     * for sinks / window) */
    const char *keys[64];
    int nk = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING || nk >= 64) {
            lua_pop(L, 1);
            kvs_errorf(err, KVS_ERR_INVALID, "method description: keys must be names");
            goto fail;
        }
        keys[nk++] = lua_tostring(L, -1); /* stays valid: the key is in the table */
    }
    for (int i = 1; i < nk; i++)
        for (int j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
            const char *t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
        }
    for (int i = 0; i < nk; i++) {
        lua_getfield(L, idx, keys[i]);
        cJSON *c = lua_json(L, -1, depth + 1, err);
        lua_pop(L, 1);
        if (!c) {
            kvs_err_prefix(err, "%s", keys[i]);
            goto fail;
        }
        cJSON_AddItemToObject(o, keys[i], c);
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

kvs_status kvs_config_method_table(lua_State *L, int idx, kvs_experiment *e, const kvs_method **m,
                                   kvs_err *err) {
    *m = NULL;
    cJSON *o = lua_json(L, idx, 0, err);
    if (!o) return err->code ? err->code : KVS_ERR_INVALID;
    kvs_composed *c = NULL;
    kvs_status rc = kvs_composed_from_cjson(o, &c, err);
    cJSON_Delete(o);
    if (rc) return rc;
    /* reports group results by label: it must name this variant alone */
    const char *label = kvs_composed_label(c);
    int clash = kvs_method_find(label) != NULL;
    for (int i = 0; i < e->n_composed && !clash; i++)
        clash = strcmp(kvs_composed_label(e->composed[i]), label) == 0;
    if (clash) {
        rc = kvs_errorf(err, KVS_ERR_INVALID,
                        "name: '%s' already names a method of this experiment or a registered "
                        "method; give the composition another name",
                        label);
        kvs_composed_free(c);
        return rc;
    }
    kvs_composed **nc = realloc(e->composed, sizeof *nc * (size_t)(e->n_composed + 1));
    if (!nc) {
        kvs_composed_free(c);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    e->composed = nc;
    e->composed[e->n_composed++] = c;
    *m = kvs_composed_method(c);
    return KVS_OK;
}

kvs_status kvs_config_composed_variant(kvs_experiment *e, const kvs_method *m, kvs_err *err) {
    const char *label = NULL;
    for (int i = 0; i < e->n_composed; i++)
        if (kvs_composed_method(e->composed[i]) == m) label = kvs_composed_label(e->composed[i]);
    if (!label) return kvs_errorf(err, KVS_ERR_INTERNAL, "composed method not owned by experiment");
    kvs_variant *nv = realloc(e->variants, sizeof *nv * (size_t)(e->n_variants + 1));
    if (!nv) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    e->variants = nv;
    kvs_variant *var = &e->variants[e->n_variants];
    memset(var, 0, sizeof *var);
    var->method = m;
    kvs_params_defaults(m, &var->params);
    snprintf(var->label, sizeof var->label, "%s", label);
    size_t jl = (size_t)snprintf(var->params_json, sizeof var->params_json, "{");
    for (int p = 0; p < m->n_params && jl < sizeof var->params_json; p++) {
        char txt[64];
        kvs_param_format(&m->params[p], var->params.v[p], txt, sizeof txt);
        jl += (size_t)snprintf(var->params_json + jl, sizeof var->params_json - jl, "%s\"%s\":\"%s\"",
                               p ? "," : "", m->params[p].name, txt);
    }
    if (jl + 1 >= sizeof var->params_json)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "%s: parameter text too long", label);
    snprintf(var->params_json + jl, sizeof var->params_json - jl, "}");
    e->n_variants++;
    return KVS_OK;
}

void kvs_config_composed_free(kvs_experiment *e) {
    for (int i = 0; i < e->n_composed; i++) kvs_composed_free(e->composed[i]);
    free(e->composed);
    e->composed = NULL;
    e->n_composed = 0;
}
