/*
 * config_dataset.c -- an experiment's dataset: synthetic{...} (shapes,
 * lengths, seeds, queries, outliers), niah{...}, ruler{...} (its tasks as
 * names or tables) and the file datasets jsonl{...} / longbench{...} /
 * milebench{...}, checked into kvs_experiment.
 *
 * What it is not: no choice of which helper a kind may use
 * (config_experiment.c), no reading of the data (datasets/).
 */
#include "config_internal.h"
#include "kvs_datasets.h"
#include "kvs_formats.h"

#include <ctype.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvs_status parse_shape(const vctx *v, int idx, int base_line, const char *field,
                              kvs_eval_shape *out) {
    lua_State *L = v->L;
    kvs_status rc;
    memset(out, 0, sizeof *out);
    if (lua_type(L, idx) == LUA_TSTRING) {
        kvs_synth_config sc;
        kvs_err e = {0};
        const char *name = lua_tostring(L, idx);
        if (kvs_synth_preset(name, &sc, &e) != KVS_OK)
            return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "%s", e.msg);
        snprintf(out->name, sizeof out->name, "%s", name);
        out->n_layers = sc.n_layers, out->n_q_heads = sc.n_q_heads;
        out->n_kv_heads = sc.n_kv_heads, out->head_dim = sc.head_dim;
        return KVS_OK;
    }
    if (lua_type(L, idx) != LUA_TTABLE)
        return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                            "expected a shape preset name or shape{layers=, q_heads=, kv_heads=, "
                            "head_dim=}, got a %s",
                            kvs_cfg_type_name(L, idx));
    int line = kvs_cfg_table_line(L, idx, base_line);
    static const char *const keys[] = {"layers", "q_heads", "kv_heads", "head_dim", NULL};
    char pre[160];
    snprintf(pre, sizeof pre, "%s.", field);
    if ((rc = kvs_cfg_check_keys(v, idx, line, pre, keys))) return rc;
    int64_t a, b, c, d;
    char f[200];
    snprintf(f, sizeof f, "%s.layers", field);
    if ((rc = kvs_cfg_get_int(v, idx, line, "layers", f, 1, 256, -1, &a))) return rc;
    snprintf(f, sizeof f, "%s.q_heads", field);
    if ((rc = kvs_cfg_get_int(v, idx, line, "q_heads", f, 1, 256, -1, &b))) return rc;
    snprintf(f, sizeof f, "%s.kv_heads", field);
    if ((rc = kvs_cfg_get_int(v, idx, line, "kv_heads", f, 1, 256, -1, &c))) return rc;
    snprintf(f, sizeof f, "%s.head_dim", field);
    if ((rc = kvs_cfg_get_int(v, idx, line, "head_dim", f, 2, 1024, -1, &d))) return rc;
    if (a < 0 || b < 0 || c < 0 || d < 0)
        return kvs_cfg_ferr(v, line, NULL, KVS_ERR_INVALID,
                            "%s: shape{} needs layers, q_heads, kv_heads and head_dim", field);
    if (b % c != 0)
        return kvs_cfg_ferr(v, line, f, KVS_ERR_INVALID, "q_heads (%lld) must be a multiple of kv_heads (%lld)",
                            (long long)b, (long long)c);
    if (d % 2 != 0)
        return kvs_cfg_ferr(v, line, f, KVS_ERR_INVALID, "head_dim %lld must be even (RoPE pairs channels)",
                            (long long)d);
    out->n_layers = (int)a, out->n_q_heads = (int)b, out->n_kv_heads = (int)c, out->head_dim = (int)d;
    snprintf(out->name, sizeof out->name, "custom-L%d-Hq%d-Hkv%d-d%d", out->n_layers,
             out->n_q_heads, out->n_kv_heads, out->head_dim);
    return KVS_OK;
}

kvs_status kvs_cfg_parse_synthetic(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = kvs_cfg_table_line(L, t, e->line);
    static const char *const keys[] = {"shape", "n_tokens", "seeds", "queries", "probes",
                                       "outliers", "sinks", "image_frac", NULL};
    if ((rc = kvs_cfg_check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "synthetic");
    /* shapes */
    lua_getfield(L, t, "shape");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, line, NULL, KVS_ERR_INVALID, "dataset.shape: missing (required): a preset "
                            "name, shape{...}, or a list of them");
    }
    int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, line, "dataset.shape"))) {
        lua_pop(L, 1);
        return rc;
    }
    e->shapes = calloc((size_t)n, sizeof *e->shapes);
    if (!e->shapes) {
        lua_pop(L, 1);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    e->n_shapes = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "dataset.shape", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        rc = parse_shape(v, lua_gettop(L), line, name, &e->shapes[i - 1]);
        lua_pop(L, 1);
        if (rc) {
            lua_pop(L, 1);
            return rc;
        }
    }
    lua_pop(L, 1);
    int64_t *tmp = NULL;
    int nt = 0;
    if ((rc = kvs_cfg_get_ints(v, t, line, "n_tokens", "dataset.n_tokens", 16, 1 << 20, 1, 0, &tmp, &nt)))
        return rc;
    e->lengths = malloc(sizeof *e->lengths * (size_t)nt);
    if (!e->lengths) {
        free(tmp);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < nt; i++) e->lengths[i] = (int)tmp[i];
    e->n_lengths = nt;
    free(tmp);
    if ((rc = kvs_cfg_get_ints(v, t, line, "seeds", "dataset.seeds", 0, INT64_MAX, 0, 1, &e->seeds,
                               &e->n_seeds)))
        return rc;
    /* queries: "all" or a count */
    lua_getfield(L, t, "queries");
    if (lua_isnil(L, -1)) {
        e->queries = -1;
    } else if (lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "all") == 0) {
        e->queries = -1;
    } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0 &&
               lua_tointeger(L, -1) <= (1 << 20)) {
        e->queries = (int)lua_tointeger(L, -1);
    } else {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, line, "dataset.queries", KVS_ERR_INVALID,
                            "expected \"all\" or a whole number of queries in [0, 1048576]");
    }
    lua_pop(L, 1);
    int64_t x;
    if ((rc = kvs_cfg_get_int(v, t, line, "probes", "dataset.probes", 1, 4096, 16, &x))) return rc;
    e->probes = (int)x;
    if ((rc = kvs_cfg_get_int(v, t, line, "outliers", "dataset.outliers", 0, 1 << 20, 0, &x))) return rc;
    e->outliers = (int)x;
    if ((rc = kvs_cfg_get_int(v, t, line, "sinks", "dataset.sinks", -1, 1 << 20, -1, &x))) return rc;
    e->sinks = (int)x;
    if ((rc = kvs_cfg_get_double(v, t, line, "image_frac", "dataset.image_frac", 0.0, 0.95, 0.0,
                                 &e->image_frac)))
        return rc;
    for (int i = 0; i < e->n_lengths; i++)
        if (e->outliers > e->lengths[i] / 2)
            return kvs_cfg_ferr(v, line, "dataset.outliers", KVS_ERR_INVALID,
                                "%d outliers out of range for n_tokens %d: at most N/2 = %d", e->outliers,
                                e->lengths[i], e->lengths[i] / 2);
    return KVS_OK;
}

/* data (a folder, relative to the config's) and setting of niah{} / ruler{} */
static kvs_status parse_ds_common(const vctx *v, int t, int line, kvs_experiment *e) {
    kvs_status rc;
    char data[1024];
    if ((rc = kvs_cfg_get_string(v, t, line, "data", "dataset.data", data, sizeof data, 0))) return rc;
    if ((rc = kvs_cfg_rel_path(v, line, "dataset.data", data, e->dataset_data, sizeof e->dataset_data)))
        return rc;
    static const char *const modes[] = {"query_aware", "query_agnostic", NULL};
    lua_getfield(v->L, t, "setting");
    int has = !lua_isnil(v->L, -1);
    lua_pop(v->L, 1);
    e->n_ds_modes = 0;
    if (has && (rc = kvs_cfg_get_choice_list(v, t, line, "setting", modes, 0, e->ds_modes, 2, &e->n_ds_modes))) {
        kvs_err_prefix(v->err, "dataset");
        return rc;
    }
    return KVS_OK;
}

/* One RULER argument of a task table (tasks[i].key), when given. */
static kvs_status ruler_int(const vctx *v, int t, int line, const char *field, const char *key,
                            int lo, int hi, int *out) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", field, key);
    int64_t x;
    kvs_status rc = kvs_cfg_get_int(v, t, line, key, name, lo, hi, *out, &x);
    if (!rc) *out = (int)x;
    return rc;
}

static kvs_status ruler_str(const vctx *v, int t, int line, const char *field, const char *key,
                            char *out, size_t n) {
    char name[96], buf[64];
    snprintf(name, sizeof name, "%s.%s", field, key);
    kvs_status rc = kvs_cfg_get_string(v, t, line, key, name, buf, sizeof buf, 0);
    if (!rc && buf[0]) {
        if (strlen(buf) >= n) return kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "'%s' is too long", buf);
        snprintf(out, n, "%s", buf);
    }
    return rc;
}

/* tasks[i] as a table: { name = "my_niah", task = "niah", type_haystack =
 * "needle", ... } (task: the kind; without it, name must be a standard
 * task, whose arguments the other keys change). */
static kvs_status parse_ruler_task(const vctx *v, int t, int line, const char *field,
                                   kvs_ruler_task *out) {
    kvs_status rc;
    static const char *const keys[] = {"name",          "task",          "type_haystack", "type_needle_k",
                                       "type_needle_v", "num_needle_k",  "num_needle_v",  "num_needle_q",
                                       "num_chains",    "num_hops",      "freq_cw",       "freq_ucw",
                                       "num_cw",        "alpha",         "coded_wordlen", "vocab_size",
                                       "dataset",       "tokens_to_generate", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s.", field);
    if ((rc = kvs_cfg_check_keys(v, t, line, prefix, keys))) return rc;
    char name[48], kind[32], fname[96];
    snprintf(fname, sizeof fname, "%s.name", field);
    if ((rc = kvs_cfg_get_string(v, t, line, "name", fname, name, sizeof name, 1))) return rc;
    snprintf(fname, sizeof fname, "%s.task", field);
    if ((rc = kvs_cfg_get_string(v, t, line, "task", fname, kind, sizeof kind, 0))) return rc;
    kvs_err e2 = {0};
    if (kind[0] ? kvs_ruler_task_defaults(kind, out, &e2) : kvs_ruler_task_get(name, out, &e2))
        return kvs_cfg_ferr(v, line, kind[0] ? fname : field, KVS_ERR_INVALID, "%s%s", e2.msg,
                            kind[0] ? "" : " (or give task = the kind, for a task of your own)");
    for (const char *p = name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.'))
            return kvs_cfg_ferr(v, line, field, KVS_ERR_INVALID, "name '%s': use letters, digits, '_', '-', '.'", name);
    snprintf(out->name, sizeof out->name, "%s", name);
    if ((rc = ruler_str(v, t, line, field, "type_haystack", out->type_haystack, sizeof out->type_haystack)) ||
        (rc = ruler_str(v, t, line, field, "type_needle_k", out->type_needle_k, sizeof out->type_needle_k)) ||
        (rc = ruler_str(v, t, line, field, "type_needle_v", out->type_needle_v, sizeof out->type_needle_v)) ||
        (rc = ruler_str(v, t, line, field, "dataset", out->dataset, sizeof out->dataset)) ||
        (rc = ruler_int(v, t, line, field, "num_needle_k", 1, 100, &out->num_needle_k)) ||
        (rc = ruler_int(v, t, line, field, "num_needle_v", 1, 100, &out->num_needle_v)) ||
        (rc = ruler_int(v, t, line, field, "num_needle_q", 1, 100, &out->num_needle_q)) ||
        (rc = ruler_int(v, t, line, field, "num_chains", 1, 100, &out->num_chains)) ||
        (rc = ruler_int(v, t, line, field, "num_hops", 1, 100, &out->num_hops)) ||
        (rc = ruler_int(v, t, line, field, "freq_cw", 1, 1000, &out->freq_cw)) ||
        (rc = ruler_int(v, t, line, field, "freq_ucw", 1, 1000, &out->freq_ucw)) ||
        (rc = ruler_int(v, t, line, field, "num_cw", 1, 100, &out->num_cw)) ||
        (rc = ruler_int(v, t, line, field, "coded_wordlen", 2, 32, &out->coded_wordlen)) ||
        (rc = ruler_int(v, t, line, field, "vocab_size", 0, 1000000, &out->vocab_size)) ||
        (rc = ruler_int(v, t, line, field, "tokens_to_generate", 0, 65536, &out->tokens_to_generate)))
        return rc;
    char an[96];
    snprintf(an, sizeof an, "%s.alpha", field);
    if ((rc = kvs_cfg_get_double(v, t, line, "alpha", an, 1.000001, 10.0, out->alpha, &out->alpha))) return rc;
    if (kvs_ruler_task_check(out, &e2)) return kvs_cfg_ferr(v, line, field, KVS_ERR_INVALID, "%s", e2.msg);
    return KVS_OK;
}

/* ruler{ tasks, lengths, n, seed, data, setting } */
kvs_status kvs_cfg_parse_ruler(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = kvs_cfg_table_line(L, t, e->line);
    static const char *const keys[] = {"tasks", "lengths", "n", "seed", "data", "setting", NULL};
    if ((rc = kvs_cfg_check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "ruler");
    int64_t *tmp = NULL;
    int n = 0;
    if ((rc = kvs_cfg_get_ints(v, t, line, "lengths", "dataset.lengths", 256, 1 << 22, 1, 0, &tmp, &n))) return rc;
    e->lengths = malloc(sizeof *e->lengths * (size_t)n);
    if (!e->lengths) {
        free(tmp);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) e->lengths[i] = (int)tmp[i];
    e->n_lengths = n;
    free(tmp);
    int64_t x;
    if ((rc = kvs_cfg_get_int(v, t, line, "n", "dataset.n", 1, 100000, 1, &x))) return rc;
    e->per_cell = (int)x;
    if ((rc = kvs_cfg_get_int(v, t, line, "seed", "dataset.seed", 0, INT64_MAX, 42, &x))) return rc;
    e->seeds = malloc(sizeof *e->seeds);
    if (!e->seeds) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    e->seeds[0] = x;
    e->n_seeds = 1;
    if ((rc = parse_ds_common(v, t, line, e))) return rc;
    /* tasks: names or tables; default every standard task */
    lua_getfield(L, t, "tasks");
    int idx = lua_gettop(L);
    const char *const *std = kvs_ruler_task_names();
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        int ns = 0;
        while (std[ns]) ns++;
        e->ruler_tasks = calloc((size_t)ns, sizeof *e->ruler_tasks);
        if (!e->ruler_tasks) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < ns; i++) kvs_ruler_task_get(std[i], &e->ruler_tasks[i], NULL);
        e->n_ruler_tasks = ns;
        return KVS_OK;
    }
    int is_list;
    n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, line, "dataset.tasks"))) goto done;
    if (n < 1) {
        rc = kvs_cfg_ferr(v, line, "dataset.tasks", KVS_ERR_INVALID, "empty list");
        goto done;
    }
    e->ruler_tasks = calloc((size_t)n, sizeof *e->ruler_tasks);
    if (!e->ruler_tasks) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 1; i <= n && !rc; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "dataset.tasks", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        kvs_ruler_task *rt = &e->ruler_tasks[i - 1];
        if (lua_type(L, -1) == LUA_TSTRING) {
            kvs_err e2 = {0};
            if (kvs_ruler_task_get(lua_tostring(L, -1), rt, &e2))
                rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "%s", e2.msg);
        } else if (lua_type(L, -1) == LUA_TTABLE) {
            rc = parse_ruler_task(v, lua_gettop(L), line, name, rt);
        } else {
            rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID,
                              "expected a task name or a table { name = ..., task = ..., ... }, got a %s",
                              kvs_cfg_type_name(L, -1));
        }
        lua_pop(L, 1);
        for (int j = 0; !rc && j < i - 1; j++)
            if (!strcmp(e->ruler_tasks[j].name, rt->name))
                rc = kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "task '%s' given twice", rt->name);
        if (!rc) e->n_ruler_tasks = i;
    }
done:
    lua_pop(L, 1);
    return rc;
}

kvs_status kvs_cfg_parse_niah(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = kvs_cfg_table_line(L, t, e->line);
    static const char *const keys[] = {"lengths", "depths", "per_cell", "seed", "haystack",
                                       "data",    "setting", NULL};
    if ((rc = kvs_cfg_check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "niah");
    static const char *const hays[] = {"default", "paul_graham", NULL};
    char hay[32];
    int which = 0;
    if ((rc = kvs_cfg_get_string(v, t, line, "haystack", "dataset.haystack", hay, sizeof hay, 0))) return rc;
    if (hay[0] && (rc = kvs_cfg_check_choice(v, line, "dataset.haystack", hay, hays, &which))) return rc;
    snprintf(e->haystack, sizeof e->haystack, "%s", which == 1 ? "paul_graham" : "");
    if ((rc = parse_ds_common(v, t, line, e))) return rc;
    int64_t *tmp = NULL;
    int n = 0;
    if ((rc = kvs_cfg_get_ints(v, t, line, "lengths", "dataset.lengths", 64, 1 << 20, 1, 0, &tmp, &n)))
        return rc;
    e->lengths = malloc(sizeof *e->lengths * (size_t)n);
    if (!e->lengths) {
        free(tmp);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) e->lengths[i] = (int)tmp[i];
    e->n_lengths = n;
    free(tmp);
    /* depths in [0, 1] */
    lua_getfield(L, t, "depths");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return kvs_cfg_ferr(v, line, NULL, KVS_ERR_INVALID, "dataset.depths: missing (required)");
    }
    int is_list;
    n = kvs_cfg_list_len(L, idx, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, line, "dataset.depths"))) {
        lua_pop(L, 1);
        return rc;
    }
    e->depths = malloc(sizeof *e->depths * (size_t)n);
    if (!e->depths) {
        lua_pop(L, 1);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    e->n_depths = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, "dataset.depths", is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        int ok = lua_type(L, -1) == LUA_TNUMBER;
        double d = lua_tonumber(L, -1);
        lua_pop(L, 1);
        if (!ok || !(d >= 0 && d <= 1)) {
            lua_pop(L, 1);
            return kvs_cfg_ferr(v, line, name, KVS_ERR_INVALID, "expected a depth in [0, 1]");
        }
        e->depths[i - 1] = d;
    }
    lua_pop(L, 1);
    int64_t x;
    if ((rc = kvs_cfg_get_int(v, t, line, "per_cell", "dataset.per_cell", 1, 100000, 1, &x))) return rc;
    e->per_cell = (int)x;
    if ((rc = kvs_cfg_get_int(v, t, line, "seed", "dataset.seed", 0, INT64_MAX, 1, &x))) return rc;
    e->seeds = malloc(sizeof *e->seeds);
    if (!e->seeds) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    e->seeds[0] = x;
    e->n_seeds = 1;
    return KVS_OK;
}

/* jsonl{ path, limit } / longbench{...} / milebench{...}: a file dataset of
 * kind `task`; the path is relative to the config's folder. */
kvs_status kvs_cfg_parse_file_dataset(const vctx *v, int t, const char *helper, kvs_experiment *e) {
    kvs_status rc;
    int line = kvs_cfg_table_line(v->L, t, e->line);
    static const char *const keys[] = {"path", "limit", NULL};
    if ((rc = kvs_cfg_check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "%s", helper);
    char path[1024];
    if ((rc = kvs_cfg_get_string(v, t, line, "path", "dataset.path", path, sizeof path, 1))) return rc;
    if ((rc = kvs_cfg_rel_path(v, line, "dataset.path", path, e->dataset_path, sizeof e->dataset_path)))
        return rc;
    int64_t x;
    if ((rc = kvs_cfg_get_int(v, t, line, "limit", "dataset.limit", 0, 1 << 30, 0, &x))) return rc;
    e->limit = (int)x;
    return KVS_OK;
}
