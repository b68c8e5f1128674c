/*
 * config_overhead.c -- the fields of kind `overhead`: thread counts,
 * repeats, warm-up, devices, dtypes, the default input sets, and the
 * max_tokens limits per method (and shape).
 *
 * What it is not: no timing (overhead.c); the meaning of a limit for the
 * grid is kvs_overhead_limit (overhead.c).
 */
#include "config_internal.h"
#include "kvs_formats.h"

#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* threads = 2 or threads = { 1, 2 }: the overhead grid's thread axis. */
kvs_status kvs_cfg_parse_thread_counts(const vctx *v, int t, kvs_experiment *e) {
    int64_t *tc = NULL;
    int n = 0;
    kvs_status rc = kvs_cfg_get_ints(v, t, e->line, "threads", "threads", 1, 256, 0, 1, &tc, &n);
    if (rc) return rc;
    int max = (int)(sizeof e->thread_counts / sizeof e->thread_counts[0]);
    if (n > max) {
        free(tc);
        return kvs_cfg_ferr(v, e->line, "threads", KVS_ERR_INVALID, "%d values; at most %d", n, max);
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (tc[j] == tc[i]) {
                char name[32];
                snprintf(name, sizeof name, "threads[%d]", i + 1);
                rc = kvs_cfg_ferr(v, e->line, name, KVS_ERR_INVALID, "%lld given twice", (long long)tc[i]);
                free(tc);
                return rc;
            }
        e->thread_counts[i] = (int)tc[i];
    }
    e->n_thread_counts = n;
    e->threads = e->thread_counts[0];
    free(tc);
    return KVS_OK;
}

/* One limit: a whole number of tokens in [0, 2^20]; 0 = never. */
static kvs_status limit_value(const vctx *v, int base_line, const char *field, int *out) {
    lua_State *L = v->L;
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > (1 << 20))
        return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                            "expected a whole number of tokens in [0, 1048576] (0: never), got %s",
                            lua_type(L, -1) == LUA_TNUMBER ? "another number" : kvs_cfg_type_name(L, -1));
    *out = (int)lua_tointeger(L, -1);
    return KVS_OK;
}

/* max_tokens = { method = N | { [shape] = N, ... }, ... }: cells with a
 * larger N are not in the grid; 0 = the method does not run (there). */
static kvs_status parse_limits(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    const int cap = (int)(sizeof e->limits / sizeof e->limits[0]);
    lua_getfield(L, t, "max_tokens");
    int mt = lua_gettop(L);
    if (lua_isnil(L, mt)) goto done;
    if (lua_type(L, mt) != LUA_TTABLE) {
        rc = kvs_cfg_ferr(v, e->line, "max_tokens", KVS_ERR_INVALID,
                          "expected a table { method = N or { [\"shape\"] = N } }, got a %s",
                          kvs_cfg_type_name(L, mt));
        goto done;
    }
    lua_pushnil(L);
    while (!rc && lua_next(L, mt)) { /* key -2, value -1 */
        if (lua_type(L, -2) != LUA_TSTRING) {
            rc = kvs_cfg_ferr(v, e->line, "max_tokens", KVS_ERR_INVALID,
                              "keys must be method names (max_tokens = { h2o = 8192 })");
            lua_pop(L, 2);
            break;
        }
        const char *mname = lua_tostring(L, -2);
        char field[96];
        snprintf(field, sizeof field, "max_tokens.%s", mname);
        /* any method of the registry, run or not (so that -D may narrow
         * `methods` without touching the limits, as for shapes below); a
         * limit of a method the experiment does not run is kept and unused */
        if (!kvs_method_find(mname))
            rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID, "unknown method '%s'", mname);
        else if (lua_type(L, -1) == LUA_TTABLE) {
            int st = lua_gettop(L);
            lua_pushnil(L);
            while (!rc && lua_next(L, st)) {
                char f2[160];
                if (lua_type(L, -2) != LUA_TSTRING) {
                    rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID,
                                      "keys must be shape names ({ [\"gemma3-270m\"] = 8192 })");
                    lua_pop(L, 2);
                    break;
                }
                const char *sname = lua_tostring(L, -2);
                snprintf(f2, sizeof f2, "%s.%s", field, sname);
                /* a shape of this experiment or any preset (so that -D may
                 * change dataset.shape without touching the limits) */
                int known = 0;
                for (int i = 0; i < e->n_shapes; i++) known |= !strcmp(e->shapes[i].name, sname);
                kvs_synth_config psc;
                if (!known) known = kvs_synth_preset(sname, &psc, NULL) == KVS_OK;
                int lim = 0;
                if (!known)
                    rc = kvs_cfg_ferr(v, e->line, f2, KVS_ERR_INVALID,
                                      "shape '%s' is neither in this experiment's dataset.shape nor a "
                                      "preset", sname);
                else if (!(rc = limit_value(v, e->line, f2, &lim))) {
                    if (e->n_limits >= cap)
                        rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID, "more than %d limits", cap);
                    else {
                        snprintf(e->limits[e->n_limits].method, sizeof e->limits[0].method, "%s",
                                 mname);
                        snprintf(e->limits[e->n_limits].shape, sizeof e->limits[0].shape, "%s",
                                 sname);
                        e->limits[e->n_limits++].max_tokens = lim;
                    }
                }
                lua_pop(L, 1);
                if (rc) lua_pop(L, 1);
            }
        } else {
            int lim = 0;
            if (!(rc = limit_value(v, e->line, field, &lim))) {
                if (e->n_limits >= cap)
                    rc = kvs_cfg_ferr(v, e->line, field, KVS_ERR_INVALID, "more than %d limits", cap);
                else {
                    snprintf(e->limits[e->n_limits].method, sizeof e->limits[0].method, "%s", mname);
                    e->limits[e->n_limits].shape[0] = '\0';
                    e->limits[e->n_limits++].max_tokens = lim;
                }
            }
        }
        lua_pop(L, 1);
        if (rc) lua_pop(L, 1);
    }
done:
    lua_pop(L, 1);
    return rc;
}

/* repeats, warmup, device(s), dtype(s), max_tokens; seeds default to three
 * rotated input sets. */
kvs_status kvs_cfg_parse_overhead(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int64_t x;
    if ((rc = kvs_cfg_get_int(v, t, e->line, "repeats", "repeats", 1, 100000, 20, &x))) return rc;
    e->repeats = (int)x;
    if ((rc = kvs_cfg_get_int(v, t, e->line, "warmup", "warmup", 0, 1000, 2, &x))) return rc;
    e->warmup = (int)x;
    static const char *const devices[] = {"cpu", "cuda", NULL};
    static const char *const dtypes[] = {"f32", "f16", "bf16", NULL};
    static const kvs_dtype dtv[] = {KVS_F32, KVS_F16, KVS_BF16};
    int idx[3], n = 0;
    if ((rc = kvs_cfg_get_choice_list(v, t, e->line, "device", devices, 0, idx, 2, &n))) return rc;
    e->n_devices = n;
    for (int i = 0; i < n; i++) snprintf(e->devices[i], sizeof e->devices[i], "%s", devices[idx[i]]);
    snprintf(e->device, sizeof e->device, "%s", e->devices[0]);
    if ((rc = kvs_cfg_get_choice_list(v, t, e->line, "dtype", dtypes, 0, idx, 3, &n))) return rc;
    e->n_dtypes = n;
    for (int i = 0; i < n; i++) e->dtypes[i] = dtv[idx[i]];
    e->dtype = e->dtypes[0];
    /* seeds: the input sets rotated over the repetitions; default three */
    lua_getfield(L, t, "dataset");
    int has_seeds = 0;
    if (lua_type(L, -1) == LUA_TTABLE) {
        lua_getfield(L, -1, "seeds");
        has_seeds = !lua_isnil(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (!has_seeds) {
        int64_t *s3 = realloc(e->seeds, 3 * sizeof *s3);
        if (!s3) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        s3[0] = 1, s3[1] = 2, s3[2] = 3;
        e->seeds = s3;
        e->n_seeds = 3;
    }
    return parse_limits(v, t, e);
}
