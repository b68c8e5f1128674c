/*
 * config_methods.c -- an experiment's methods and their parameter sweeps:
 * the `methods` list (registry names, each once), `params = { method =
 * { name = value or {values} } }`, and the variants, the cartesian product
 * of each method's swept values (last parameter fastest), with their labels
 * and canonical parameter JSON.
 *
 * What it is not: no budgets (config_experiment.c), no grid (grid.c).
 */
#include "config_internal.h"
#include "config_method.h"
#include "kvs_parts.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lua value at idx as parameter text. */
static int value_text(lua_State *L, int idx, char *buf, size_t n) {
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: snprintf(buf, n, "%s", lua_toboolean(L, idx) ? "true" : "false"); return 1;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            snprintf(buf, n, "%lld", (long long)lua_tointeger(L, idx));
        else
            snprintf(buf, n, "%.17g", lua_tonumber(L, idx));
        return 1;
    case LUA_TSTRING: snprintf(buf, n, "%s", lua_tostring(L, idx)); return 1;
    default: return 0;
    }
}

#define MAX_SWEEP 64

/* One method's parameter sweep: values[p][0..count[p]) parsed, per param index. */
typedef struct {
    int count[KVS_MAX_PARAMS];
    int set[KVS_MAX_PARAMS]; /* explicitly given */
    double values[KVS_MAX_PARAMS][MAX_SWEEP];
} sweep;

static kvs_status parse_method_params(const vctx *v, int t, int base_line, const kvs_method *m,
                                      sweep *sw) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    kvs_params scratch;
    kvs_params_defaults(m, &scratch);
    memset(sw, 0, sizeof *sw);
    t = lua_absindex(L, t);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        char field[200];
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 2);
            snprintf(field, sizeof field, "params.%s", m->name);
            return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                                "expected name = value pairs ({gamma = 0.1}), found a positional value");
        }
        const char *pname = lua_tostring(L, -2);
        snprintf(field, sizeof field, "params.%s.%s", m->name, pname);
        int pi = kvs_param_index(m, pname);
        if (pi < 0) {
            kvs_err e = {0};
            kvs_params_set(m, &scratch, pname, "0", &e);
            lua_pop(L, 2);
            return kvs_cfg_ferr(v, base_line, field, KVS_ERR_NOTFOUND, "%s", e.msg);
        }
        int idx = lua_gettop(L);
        int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
        if (is_list && (rc = kvs_cfg_check_sequence(v, idx, base_line, field))) {
            lua_pop(L, 2);
            return rc;
        }
        if (n > MAX_SWEEP) {
            lua_pop(L, 2);
            return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "%d values; at most %d per parameter",
                                n, MAX_SWEEP);
        }
        sw->set[pi] = 1;
        sw->count[pi] = n;
        for (int i = 1; i <= n; i++) {
            char name[220], text[64];
            kvs_cfg_elem_name(name, sizeof name, field, is_list, i);
            kvs_cfg_list_get(L, idx, is_list, i);
            int ok = value_text(L, -1, text, sizeof text);
            const char *tn = kvs_cfg_type_name(L, -1);
            lua_pop(L, 1);
            if (!ok) {
                lua_pop(L, 2);
                return kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID,
                                    "expected a number, boolean or name, got a %s", tn);
            }
            kvs_err e = {0};
            if (kvs_params_set(m, &scratch, pname, text, &e) != KVS_OK) {
                lua_pop(L, 2);
                return kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID, "%s", e.msg);
            }
            sw->values[pi][i - 1] = scratch.v[pi];
        }
        lua_pop(L, 1);
    }
    return KVS_OK;
}

/* Append the variants of one method (cartesian product of its sweep). */
static kvs_status add_variants(kvs_experiment *e, const kvs_method *m, const sweep *sw,
                               kvs_err *err) {
    int total = 1;
    for (int p = 0; p < m->n_params; p++)
        if (sw && sw->set[p]) total *= sw->count[p];
    if (total > 100000) return kvs_errorf(err, KVS_ERR_INVALID, "params.%s: %d combinations; too many", m->name, total);
    kvs_variant *nv = realloc(e->variants, sizeof *nv * (size_t)(e->n_variants + total));
    if (!nv) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    e->variants = nv;
    for (int c = 0; c < total; c++) {
        kvs_variant *var = &e->variants[e->n_variants++];
        memset(var, 0, sizeof *var);
        var->method = m;
        kvs_params_defaults(m, &var->params);
        int rem = c;
        /* last parameter varies fastest */
        for (int p = m->n_params - 1; p >= 0; p--) {
            if (!sw || !sw->set[p]) continue;
            var->params.v[p] = sw->values[p][rem % sw->count[p]];
            rem /= sw->count[p];
        }
        size_t ll = (size_t)snprintf(var->label, sizeof var->label, "%s", m->name);
        size_t jl = (size_t)snprintf(var->params_json, sizeof var->params_json, "{");
        for (int p = 0; p < m->n_params; p++) {
            char txt[64];
            kvs_param_format(&m->params[p], var->params.v[p], txt, sizeof txt);
            if (sw && sw->set[p] && ll < sizeof var->label)
                ll += (size_t)snprintf(var->label + ll, sizeof var->label - ll, " %s=%s",
                                       m->params[p].name, txt);
            if (jl < sizeof var->params_json)
                jl += (size_t)snprintf(var->params_json + jl, sizeof var->params_json - jl,
                                       "%s\"%s\":\"%s\"", p ? "," : "", m->params[p].name, txt);
        }
        if (jl < sizeof var->params_json)
            snprintf(var->params_json + jl, sizeof var->params_json - jl, "}");
        if (jl + 1 >= sizeof var->params_json || ll >= sizeof var->label)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "params.%s: parameter text too long", m->name);
    }
    return KVS_OK;
}

/* The experiment's `methods` list: a registry name or a list of them, each
 * once, at most 64, into list[0..*n_out) in the order given. */
static kvs_status parse_method_list(const vctx *v, int t, kvs_experiment *e,
                                    const kvs_method **list, int *n_out) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    int n_methods = 0;
    lua_getfield(L, t, "methods");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, e->line, NULL, KVS_ERR_INVALID, "methods: missing (required), e.g. methods = "
                            "{ \"full\", \"flashcache\" }");
    }
    int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, e->line, "methods"))) goto done;
    if (n > 64) {
        rc = kvs_cfg_ferr(v, e->line, "methods", KVS_ERR_INVALID, "%d methods; at most 64", n);
        goto done;
    }
    for (int i = 1; i <= n; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "methods", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        kvs_err me = {0};
        const kvs_method *m = NULL;
        if (lua_type(L, -1) == LUA_TTABLE) { /* composed from parts (config_method.c) */
            if (kvs_config_method_table(L, lua_gettop(L), e, &m, &me) != KVS_OK) {
                lua_pop(L, 1);
                rc = kvs_cfg_ferr(v, e->line, name, me.code, "%s", me.msg);
                goto done;
            }
        } else if (lua_type(L, -1) != LUA_TSTRING) {
            rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID,
                              "expected a method name or a table composing one, got a %s",
                              kvs_cfg_type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        } else if (kvs_method_lookup(lua_tostring(L, -1), &m, &me) != KVS_OK) {
            lua_pop(L, 1);
            rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_NOTFOUND, "%s", me.msg);
            goto done;
        }
        lua_pop(L, 1);
        for (int j = 0; j < n_methods; j++)
            if (list[j] == m || strcmp(list[j]->name, m->name) == 0) {
                rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID, "method '%s' listed twice", m->name);
                goto done;
            }
        list[n_methods++] = m;
    }
done:
    lua_pop(L, 1);
    *n_out = n_methods;
    return rc;
}

kvs_status kvs_cfg_parse_methods(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    const kvs_method *list[64];
    int n_methods = 0;
    kvs_status rc = parse_method_list(v, t, e, list, &n_methods);
    if (rc) return rc;
    /* params = { method = { name = value or list } } */
    sweep *sw = calloc((size_t)n_methods, sizeof *sw);
    int *has = calloc((size_t)n_methods, sizeof *has);
    if (!sw || !has) {
        free(sw);
        free(has);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    lua_getfield(L, t, "params");
    int idx = lua_gettop(L);
    if (!lua_isnil(L, idx) && lua_type(L, idx) != LUA_TTABLE) {
        rc = kvs_cfg_ferr(v, e->line, "params", KVS_ERR_INVALID,
                          "expected a table { method = { param = value or {values} } }, got a %s",
                          kvs_cfg_type_name(L, idx));
    } else if (!lua_isnil(L, idx)) {
        lua_pushnil(L);
        while (!rc && lua_next(L, idx)) {
            if (lua_type(L, -2) != LUA_TSTRING) {
                rc = kvs_cfg_ferr(v, e->line, "params", KVS_ERR_INVALID, "keys must be method names");
                lua_pop(L, 2);
                break;
            }
            const char *mname = lua_tostring(L, -2);
            char field[100];
            snprintf(field, sizeof field, "params.%s", mname);
            int found = -1;
            for (int j = 0; j < n_methods; j++)
                if (strcmp(list[j]->name, mname) == 0) found = j;
            if (found < 0) {
                kvs_err me = {0};
                const kvs_method *m = NULL;
                if (kvs_method_lookup(mname, &m, &me) != KVS_OK)
                    rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_NOTFOUND, "%s", me.msg);
                else
                    rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID,
                                      "method '%s' is not in methods; add it there or remove its params",
                                      mname);
                lua_pop(L, 2);
                break;
            }
            if (lua_type(L, -1) != LUA_TTABLE) {
                rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID,
                                  "expected a table { param = value or {values} }, got a %s",
                                  kvs_cfg_type_name(L, -1));
                lua_pop(L, 2);
                break;
            }
            rc = parse_method_params(v, lua_gettop(L), e->line, list[found], &sw[found]);
            if (rc) {
                lua_pop(L, 2);
                break;
            }
            has[found] = 1;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    for (int j = 0; !rc && j < n_methods; j++)
        rc = list[j]->create == kvs_compose_dyn.create
                 ? kvs_config_composed_variant(e, list[j], v->err)
                 : add_variants(e, list[j], has[j] ? &sw[j] : NULL, v->err);
    free(sw);
    free(has);
    return rc;
}
