/*
 * config_experiment.c -- one experiment{...} table checked into
 * kvs_experiment: its name, kind and description, which dataset helper the
 * kind takes, methods, budgets and threads, and the fields of one kind that
 * must be absent in another; the kind's own fields are read by
 * config_task.c and config_overhead.c.
 *
 * What it is not: no Lua state (config_sandbox.c), no file or override
 * handling (config.c).
 */
#include "config_internal.h"

#include <ctype.h>
#include <lua.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvs_status parse_budgets(const vctx *v, int t, kvs_experiment *e, int required) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, t, "budgets");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        if (required)
            return kvs_cfg_ferr(v, e->line, NULL, KVS_ERR_INVALID,
                                "budgets: missing (required): ratios in (0, 1] or token counts, e.g. "
                                "budgets = { 0.1, 0.2, 0.5 }");
        return KVS_OK;
    }
    int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, e->line, "budgets"))) goto done;
    e->budgets = calloc((size_t)n, sizeof *e->budgets);
    if (!e->budgets) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    e->n_budgets = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "budgets", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        int isnum = lua_type(L, -1) == LUA_TNUMBER;
        int isint = lua_isinteger(L, -1);
        double x = lua_tonumber(L, -1);
        const char *tn = kvs_cfg_type_name(L, -1);
        lua_pop(L, 1);
        if (!isnum) {
            rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID,
                              "expected a number (a ratio in (0, 1] or a token count >= 2), got a %s", tn);
            goto done;
        }
        if (x > 0 && x <= 1) {
            e->budgets[i - 1].ratio = x;
        } else if (x > 1 && x <= (double)(1 << 30) && (isint || x == floor(x))) {
            e->budgets[i - 1].tokens = (int64_t)x;
        } else {
            rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID,
                              "%g out of range: a budget is a ratio in (0, 1] or a whole number of tokens "
                              "in [2, 1073741824]",
                              x);
            goto done;
        }
        for (int j = 0; j < i - 1; j++)
            if (e->budgets[j].ratio == e->budgets[i - 1].ratio &&
                e->budgets[j].tokens == e->budgets[i - 1].tokens) {
                rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID, "budget %g listed twice", x);
                goto done;
            }
    }
done:
    lua_pop(L, 1);
    return rc;
}

kvs_status kvs_cfg_parse_experiment(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    e->line = kvs_cfg_table_line(L, t, 0);
    static const char *const keys[] = {"name",    "kind",    "description", "dataset", "methods",
                                       "budgets", "params",  "threads",     "backend", "model",
                                       "metrics", "repeats", "warmup",      "device",  "dtype",
                                       "max_tokens", "mode", "template", "n_predict", "setting",
                                       "kv_spans", "ignore_eos", "variants_per_request", NULL};
    if ((rc = kvs_cfg_check_keys(v, t, e->line, "", keys))) return rc;
    if ((rc = kvs_cfg_get_string(v, t, e->line, "name", "name", e->name, sizeof e->name, 1))) return rc;
    for (const char *p = e->name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.'))
            return kvs_cfg_ferr(v, e->line, "name", KVS_ERR_INVALID,
                                "'%s': use letters, digits, '_', '-' and '.' only", e->name);
    if (!e->name[0]) return kvs_cfg_ferr(v, e->line, "name", KVS_ERR_INVALID, "empty name");
    char kind[16];
    int k = 0;
    static const char *const kinds[] = {"fidelity", "overhead", "task", NULL};
    if ((rc = kvs_cfg_get_string(v, t, e->line, "kind", "kind", kind, sizeof kind, 0))) return rc;
    if (!kind[0]) snprintf(kind, sizeof kind, "fidelity");
    if ((rc = kvs_cfg_check_choice(v, e->line, "kind", kind, kinds, &k))) return rc;
    e->kind = (kvs_exp_kind)k;
    char scratch[512];
    if ((rc = kvs_cfg_get_string(v, t, e->line, "description", "description", scratch, sizeof scratch, 0)))
        return rc;

    /* dataset */
    lua_getfield(L, t, "dataset");
    int d = lua_gettop(L);
    if (lua_isnil(L, d)) {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, e->line, NULL, KVS_ERR_INVALID,
                            "dataset: missing (required): synthetic{...} or niah{...}");
    }
    const char *helper = NULL;
    if (lua_type(L, d) == LUA_TTABLE) {
        lua_getfield(L, d, "__helper");
        helper = lua_tostring(L, -1);
        lua_pop(L, 1); /* the string stays alive: it is interned and referenced by the table */
    }
    int file_ds = helper && (!strcmp(helper, "jsonl") || !strcmp(helper, "longbench") ||
                             !strcmp(helper, "milebench"));
    if (file_ds) {
        if (e->kind != KVS_KIND_TASK)
            rc = kvs_cfg_ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                              "kind '%s' needs synthetic{...} caches; %s{...} is for kind 'task'", kind,
                              helper);
        else
            rc = kvs_cfg_parse_file_dataset(v, d, helper, e);
    } else if (helper && !strcmp(helper, "ruler")) {
        if (e->kind != KVS_KIND_TASK)
            rc = kvs_cfg_ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                              "kind '%s' needs synthetic{...} caches; ruler{...} is for kind 'task'", kind);
        else
            rc = kvs_cfg_parse_ruler(v, d, e);
    } else if (!helper || (strcmp(helper, "synthetic") != 0 && strcmp(helper, "niah") != 0)) {
        rc = kvs_cfg_ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                          "expected synthetic{...}, niah{...} or ruler{...}, got a %s", kvs_cfg_type_name(L, d));
    } else if (strcmp(helper, "synthetic") == 0) {
        if (e->kind == KVS_KIND_TASK)
            rc = kvs_cfg_ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                              "kind 'task' needs a prompt dataset such as niah{...}, not synthetic{...}");
        else
            rc = kvs_cfg_parse_synthetic(v, d, e);
    } else {
        if (e->kind != KVS_KIND_TASK)
            rc = kvs_cfg_ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                              "kind '%s' needs synthetic{...} caches; niah{...} is for kind 'task'", kind);
        else
            rc = kvs_cfg_parse_niah(v, d, e);
    }
    lua_pop(L, 1);
    if (rc) return rc;

    if ((rc = kvs_cfg_parse_methods(v, t, e))) return rc;
    if ((rc = parse_budgets(v, t, e, 1))) return rc;
    int64_t x;
    if (e->kind == KVS_KIND_OVERHEAD) { /* an axis of the overhead grid: a value or a list */
        if ((rc = kvs_cfg_parse_thread_counts(v, t, e))) return rc;
    } else {
        if ((rc = kvs_cfg_get_int(v, t, e->line, "threads", "threads", 1, 256, 1, &x))) return rc;
        e->threads = (int)x;
    }

    /* kind-specific fields; the others must be absent */
    static const char *const task_only[] = {"backend",    "model",      "metrics",   "mode",
                                            "template",   "n_predict",  "setting",   "kv_spans",
                                            "ignore_eos", "variants_per_request", NULL};
    static const char *const overhead_only[] = {"repeats", "warmup", "device", "dtype",
                                                "max_tokens", NULL};
    const char *const *forbid[2] = {e->kind == KVS_KIND_TASK ? NULL : task_only,
                                    e->kind == KVS_KIND_OVERHEAD ? NULL : overhead_only};
    for (int f = 0; f < 2; f++) {
        if (!forbid[f]) continue;
        for (int i = 0; forbid[f][i]; i++) {
            lua_getfield(L, t, forbid[f][i]);
            int present = !lua_isnil(L, -1);
            lua_pop(L, 1);
            if (present)
                return kvs_cfg_ferr(v, e->line, forbid[f][i], KVS_ERR_INVALID,
                                    "not used by kind '%s' (it belongs to kind '%s')", kind,
                                    f == 0 ? "task" : "overhead");
        }
    }
    if (e->kind == KVS_KIND_TASK) {
        if ((rc = kvs_cfg_parse_backend(v, t, e))) return rc;
        char model[256];
        if ((rc = kvs_cfg_get_string(v, t, e->line, "model", "model", model, sizeof model, 0))) return rc;
        if (model[0] && e->model[0] && strcmp(model, e->model) != 0)
            return kvs_cfg_ferr(v, e->line, "model", KVS_ERR_INVALID,
                                "'%s' differs from backend.model '%s' (give it once)", model, e->model);
        if (model[0]) snprintf(e->model, sizeof e->model, "%s", model);
        if (!e->model[0]) snprintf(e->model, sizeof e->model, "default");
        if ((rc = kvs_cfg_parse_metrics(v, t, e))) return rc;
        if ((rc = kvs_cfg_parse_task_fields(v, t, e))) return rc;
    }
    if (e->kind == KVS_KIND_OVERHEAD && (rc = kvs_cfg_parse_overhead(v, t, e))) return rc;
    return KVS_OK;
}
