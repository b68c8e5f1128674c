/*
 * config.c -- Lua experiment configs: a sandboxed Lua 5.4 state per file,
 * the helpers a config may call, and validation into kvs_experiment.
 *
 * What it is: the Lua side only collects tables (experiment{...},
 * synthetic{...}, niah{...}, ruler{...}, jsonl{...}, longbench{...},
 * milebench{...}, shape{...}, backend{...}); all checking happens
 * afterwards in plain C, so every error is a kvs_err naming file:line and
 * the field. A field's line is found by scanning the config text for the
 * key from the line of the call that holds it.
 * What it is not: no grid expansion (grid.c), no running (runner.c).
 *
 * Sandbox: base library without dofile/loadfile (load is text-only),
 * string, table, math, utf8, coroutine; os has only clock/date/time/
 * difftime; io has only open, read-only, for files below the config's folder.
 * No package library, so no require and no C modules.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "config_method.h"
#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "kvs_formats.h"
#include "kvs_metrics.h"
#include "kvs_parts.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kvs_exp_kind_name(kvs_exp_kind k) {
    switch (k) {
    case KVS_KIND_FIDELITY: return "fidelity";
    case KVS_KIND_OVERHEAD: return "overhead";
    case KVS_KIND_TASK: return "task";
    }
    return "?";
}

/* ---- sandbox ------------------------------------------------------------- */

#define REG_LIST "kvsieve.experiments"

/* Record the caller's line in t.__line and a helper tag in t.__helper. */
static void tag_table(lua_State *L, const char *helper) {
    lua_Debug ar;
    int line = 0;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar)) line = ar.currentline;
    lua_pushinteger(L, line);
    lua_setfield(L, 1, "__line");
    lua_pushstring(L, helper);
    lua_setfield(L, 1, "__helper");
}

static int l_experiment(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    tag_table(L, "experiment");
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LIST);
    lua_Integer n = luaL_len(L, -1);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, n + 1);
    lua_pop(L, 1);
    return 1;
}

static int l_helper(lua_State *L) {
    const char *name = lua_tostring(L, lua_upvalueindex(1));
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    tag_table(L, name);
    return 1;
}

/* io.open(path [, "r"|"rb"]) for files below the config's folder only. */
static int l_io_open(lua_State *L) {
    const char *dir = lua_tostring(L, lua_upvalueindex(2));
    const char *path = luaL_checkstring(L, 1);
    const char *mode = luaL_optstring(L, 2, "r");
    if (strcmp(mode, "r") != 0 && strcmp(mode, "rb") != 0)
        return luaL_error(L, "io.open: mode '%s' not allowed in a config (read-only: \"r\" or \"rb\")",
                          mode);
    char full[PATH_MAX * 2], real[PATH_MAX];
    if (path[0] == '/')
        snprintf(full, sizeof full, "%s", path);
    else
        snprintf(full, sizeof full, "%s/%s", dir, path);
    if (!realpath(full, real)) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, strerror(errno));
        lua_pushinteger(L, errno);
        return 3;
    }
    size_t ld = strlen(dir);
    if (strncmp(real, dir, ld) != 0 || (real[ld] != '/' && real[ld] != '\0'))
        return luaL_error(L, "io.open: '%s' is outside the config's folder %s (configs may only read "
                          "files below it)", path, dir);
    int top = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1)); /* the real io.open */
    lua_pushstring(L, real);
    lua_pushstring(L, mode);
    lua_call(L, 2, LUA_MULTRET);
    return lua_gettop(L) - top;
}

/* load(chunk [, name [, mode [, env]]]) restricted to text chunks. */
static int l_load(lua_State *L) {
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "=(load)");
    int env = !lua_isnone(L, 4) ? 4 : 0;
    if (luaL_loadbufferx(L, s, len, name, "t") != LUA_OK) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    if (env) {
        lua_pushvalue(L, env);
        if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
}

/* A config is a description, not a program: stop one that runs away
 * (an endless loop) after about 2e8 VM instructions. The counter lives in
 * the state's extra space. */
#define HOOK_EVERY 1000000
#define HOOK_LIMIT 200
static void l_count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    long *ticks = *(long **)lua_getextraspace(L);
    if (++*ticks > HOOK_LIMIT) {
        luaL_where(L, 0); /* the running function: where the loop is */
        lua_pushfstring(L, "the config ran for more than %d million instructions (an endless loop?)",
                        HOOK_LIMIT);
        lua_concat(L, 2);
        lua_error(L);
    }
}

static void open_sandbox(lua_State *L, const char *dir) {
    luaL_requiref(L, "_G", luaopen_base, 1);
    luaL_requiref(L, "string", luaopen_string, 1);
    luaL_requiref(L, "table", luaopen_table, 1);
    luaL_requiref(L, "math", luaopen_math, 1);
    luaL_requiref(L, "utf8", luaopen_utf8, 1);
    luaL_requiref(L, "coroutine", luaopen_coroutine, 1);
    lua_pop(L, 6);
    /* os and io: load privately, expose a safe subset. */
    luaL_requiref(L, "os", luaopen_os, 0);
    lua_newtable(L);
    static const char *const os_keep[] = {"clock", "date", "time", "difftime"};
    for (size_t i = 0; i < sizeof os_keep / sizeof os_keep[0]; i++) {
        lua_getfield(L, -2, os_keep[i]);
        lua_setfield(L, -2, os_keep[i]);
    }
    lua_setglobal(L, "os");
    lua_pop(L, 1);
    luaL_requiref(L, "io", luaopen_io, 0);
    lua_newtable(L);
    lua_getfield(L, -2, "open");
    lua_pushstring(L, dir);
    lua_pushcclosure(L, l_io_open, 2);
    lua_setfield(L, -2, "open");
    lua_setglobal(L, "io");
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_setglobal(L, "dofile");
    lua_pushnil(L);
    lua_setglobal(L, "loadfile");
    lua_pushcfunction(L, l_load);
    lua_setglobal(L, "load");
    /* the experiment API */
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LIST);
    lua_pushcfunction(L, l_experiment);
    lua_setglobal(L, "experiment");
    static const char *const helpers[] = {"synthetic", "niah",      "shape",     "backend",
                                           "jsonl",     "longbench", "milebench", "ruler"};
    for (size_t i = 0; i < sizeof helpers / sizeof helpers[0]; i++) {
        lua_pushstring(L, helpers[i]);
        lua_pushcclosure(L, l_helper, 1);
        lua_setglobal(L, helpers[i]);
    }
}

/* ---- validation context ---------------------------------------------------- */

typedef struct {
    lua_State *L;
    const char *path, *text;
    const char *const *overrides;
    int n_overrides;
    kvs_err *err;
} vctx;

/* Line of `key` (as `key =`) at or after line `from`; 0 if not found. */
static int find_key(const char *text, int from, const char *key, int *col_line, const char **pos) {
    const char *p = text;
    int line = 1;
    size_t kl = strlen(key);
    while (*p && line < from) {
        if (*p == '\n') line++;
        p++;
    }
    if (*pos && *pos > p) { /* continue after the previous key */
        for (const char *q = p; q < *pos; q++)
            if (*q == '\n') line++;
        p = *pos;
    }
    for (; *p; p++) {
        if (*p == '\n') {
            line++;
            continue;
        }
        if (*p == '-' && p[1] == '-') { /* comment: skip to end of line */
            while (p[1] && p[1] != '\n') p++;
            continue;
        }
        if (strncmp(p, key, kl) != 0) continue;
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '.')) continue;
        const char *q = p + kl;
        if (isalnum((unsigned char)*q) || *q == '_') continue;
        while (*q == ' ' || *q == '\t') q++;
        if (*q != '=' || q[1] == '=') continue;
        *col_line = line;
        *pos = q;
        return line;
    }
    return 0;
}

/* The line to report for a field path ("params.flashcache.gamma[2]") of a
 * table whose call is at base_line: the chain of keys found in order after
 * base_line; when the chain is incomplete (a helper table built in a local
 * variable, say), the chain without its leading keys. */
static int field_line(const vctx *v, int base_line, const char *field) {
    char buf[256];
    char *tok[16];
    int nt = 0;
    snprintf(buf, sizeof buf, "%s", field);
    for (char *t = strtok(buf, "."); t && nt < 16; t = strtok(NULL, ".")) {
        t[strcspn(t, "[")] = '\0';
        if (*t) tok[nt++] = t;
    }
    for (int skip = 0; skip < nt; skip++) {
        int line = base_line, l = 0, ok = 1;
        const char *pos = NULL;
        for (int i = skip; i < nt && ok; i++) {
            if (find_key(v->text, line, tok[i], &l, &pos))
                line = l;
            else
                ok = 0;
        }
        if (ok) return line;
    }
    return base_line;
}

/* The -D override that set a field, or NULL. */
static const char *override_for(const vctx *v, const char *field) {
    for (int i = 0; i < v->n_overrides; i++) {
        const char *o = v->overrides[i];
        size_t kl = strcspn(o, "=");
        if (strncmp(field, o, kl) == 0 && (field[kl] == '\0' || field[kl] == '.' || field[kl] == '['))
            return o;
    }
    return NULL;
}

/* Error at a field of a table called at base_line. */
static kvs_status ferr(const vctx *v, int base_line, const char *field, kvs_status code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static kvs_status ferr(const vctx *v, int base_line, const char *field, kvs_status code,
                       const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *o = field ? override_for(v, field) : NULL;
    if (o)
        return kvs_errorf(v->err, code, "-D %s: %s: %s", o, field, msg);
    int line = field ? field_line(v, base_line, field) : base_line;
    if (field)
        return kvs_errorf(v->err, code, "%s:%d: %s: %s", v->path, line, field, msg);
    return kvs_errorf(v->err, code, "%s:%d: %s", v->path, line, msg);
}

/* Every key of the table at idx must be in allowed[] (keys "__*" are ours). */
static kvs_status check_keys(const vctx *v, int idx, int base_line, const char *prefix,
                             const char *const *allowed) {
    lua_State *L = v->L;
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            char where[160];
            snprintf(where, sizeof where, "%s", prefix[0] ? prefix : "experiment");
            kvs_status rc = lua_type(L, -1) == LUA_TNUMBER
                                ? ferr(v, base_line, NULL, KVS_ERR_INVALID,
                                       "%s: positional value [%g] not allowed; write name = value",
                                       where, lua_tonumber(L, -1))
                                : ferr(v, base_line, NULL, KVS_ERR_INVALID,
                                       "%s: keys must be names", where);
            lua_pop(L, 1);
            return rc;
        }
        const char *k = lua_tostring(L, -1);
        if (strncmp(k, "__", 2) == 0) continue;
        int ok = 0, bestd = 4;
        const char *best = NULL;
        char known[512] = "";
        for (int i = 0; allowed[i]; i++) {
            if (strcmp(allowed[i], k) == 0) ok = 1;
            int d = kvs_edit_distance(k, allowed[i]);
            if (d < bestd) bestd = d, best = allowed[i];
            if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
            strncat(known, allowed[i], sizeof known - strlen(known) - 1);
        }
        if (!ok) {
            char field[200];
            snprintf(field, sizeof field, "%s%s", prefix, k);
            kvs_status rc =
                best ? ferr(v, base_line, field, KVS_ERR_INVALID,
                            "unknown key '%s' (did you mean '%s'?); allowed: %s", k, best, known)
                     : ferr(v, base_line, field, KVS_ERR_INVALID, "unknown key '%s'; allowed: %s", k,
                            known);
            lua_pop(L, 1);
            return rc;
        }
    }
    return KVS_OK;
}

static int table_line(lua_State *L, int idx, int dflt) {
    lua_getfield(L, idx, "__line");
    int line = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : dflt;
    lua_pop(L, 1);
    return line;
}

static const char *type_name(lua_State *L, int idx) { return luaL_typename(L, idx); }

/* Value at idx as a list: returns its length, or 1 when it is a scalar
 * (then element 1 is the value itself). Pushes nothing. */
static int list_len(lua_State *L, int idx, int *is_list) {
    if (lua_type(L, idx) == LUA_TTABLE) {
        lua_getfield(L, idx, "__helper");
        int helper = !lua_isnil(L, -1);
        lua_pop(L, 1);
        if (!helper) {
            *is_list = 1;
            return (int)lua_rawlen(L, idx);
        }
    }
    *is_list = 0;
    return 1;
}

/* Push element i (1-based) of a list-or-scalar at idx. */
static void list_get(lua_State *L, int idx, int is_list, int i) {
    if (is_list)
        lua_rawgeti(L, idx, i);
    else
        lua_pushvalue(L, idx);
}

static void elem_name(char *out, size_t n, const char *field, int is_list, int i) {
    if (is_list)
        snprintf(out, n, "%s[%d]", field, i);
    else
        snprintf(out, n, "%s", field);
}

/* A list that is a table must be a proper sequence. */
static kvs_status check_sequence(const vctx *v, int idx, int base_line, const char *field) {
    lua_State *L = v->L;
    idx = lua_absindex(L, idx);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
            lua_pop(L, 1);
            return ferr(v, base_line, field, KVS_ERR_INVALID,
                        "expected a list ({a, b, ...}), found a table with named keys");
        }
    }
    if (n == 0) return ferr(v, base_line, field, KVS_ERR_INVALID, "empty list");
    return KVS_OK;
}

/* Integers: a number or a list of numbers, each in [lo, hi]. */
static kvs_status get_ints(const vctx *v, int t, int base_line, const char *key, const char *field,
                           int64_t lo, int64_t hi, int required, int64_t dflt, int64_t **out,
                           int *n_out) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, t, key);
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        if (required) return ferr(v, base_line, NULL, KVS_ERR_INVALID, "%s: missing (required)", field);
        *out = malloc(sizeof **out);
        if (!*out) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        (*out)[0] = dflt;
        *n_out = 1;
        return KVS_OK;
    }
    int is_list, n = list_len(L, idx, &is_list);
    *out = NULL;
    if (is_list && (rc = check_sequence(v, idx, base_line, field))) goto done;
    *out = malloc(sizeof **out * (size_t)n);
    if (!*out) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    *n_out = n;
    for (int i = 1; i <= n; i++) {
        char name[200];
        elem_name(name, sizeof name, field, is_list, i);
        list_get(L, idx, is_list, i);
        if (!lua_isinteger(L, -1)) {
            double d = lua_tonumber(L, -1);
            int isnum = lua_type(L, -1) == LUA_TNUMBER;
            rc = isnum ? ferr(v, base_line, name, KVS_ERR_INVALID,
                              "expected a whole number in [%lld, %lld], got %g", (long long)lo,
                              (long long)hi, d)
                       : ferr(v, base_line, name, KVS_ERR_INVALID,
                              "expected a whole number in [%lld, %lld], got a %s", (long long)lo,
                              (long long)hi, type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        }
        int64_t x = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (x < lo || x > hi) {
            rc = ferr(v, base_line, name, KVS_ERR_INVALID, "%lld out of range [%lld, %lld]",
                      (long long)x, (long long)lo, (long long)hi);
            goto done;
        }
        (*out)[i - 1] = x;
    }
done:
    lua_pop(L, 1);
    if (rc) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

static kvs_status get_int(const vctx *v, int t, int base_line, const char *key, const char *field,
                          int64_t lo, int64_t hi, int64_t dflt, int64_t *out) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *out = dflt;
        return KVS_OK;
    }
    if (!lua_isinteger(L, -1)) {
        kvs_status rc = ferr(v, base_line, field, KVS_ERR_INVALID,
                             "expected a whole number in [%lld, %lld], got %s", (long long)lo,
                             (long long)hi,
                             lua_type(L, -1) == LUA_TNUMBER ? "a fraction" : type_name(L, -1));
        lua_pop(L, 1);
        return rc;
    }
    *out = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (*out < lo || *out > hi)
        return ferr(v, base_line, field, KVS_ERR_INVALID, "%lld out of range [%lld, %lld]",
                    (long long)*out, (long long)lo, (long long)hi);
    return KVS_OK;
}

static kvs_status get_double(const vctx *v, int t, int base_line, const char *key, const char *field,
                             double lo, double hi, double dflt, double *out) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *out = dflt;
        return KVS_OK;
    }
    if (lua_type(L, -1) != LUA_TNUMBER) {
        kvs_status rc = ferr(v, base_line, field, KVS_ERR_INVALID,
                             "expected a number in [%g, %g], got a %s", lo, hi, type_name(L, -1));
        lua_pop(L, 1);
        return rc;
    }
    *out = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!(*out >= lo && *out <= hi))
        return ferr(v, base_line, field, KVS_ERR_INVALID, "%g out of range [%g, %g]", *out, lo, hi);
    return KVS_OK;
}

/* Optional string; "" when absent. */
static kvs_status get_string(const vctx *v, int t, int base_line, const char *key, const char *field,
                             char *out, size_t n, int required) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    kvs_status rc = KVS_OK;
    if (lua_isnil(L, -1)) {
        out[0] = '\0';
        if (required) rc = ferr(v, base_line, NULL, KVS_ERR_INVALID, "%s: missing (required)", field);
    } else if (lua_type(L, -1) != LUA_TSTRING) {
        rc = ferr(v, base_line, field, KVS_ERR_INVALID, "expected a string, got a %s",
                  type_name(L, -1));
    } else {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (len >= n)
            rc = ferr(v, base_line, field, KVS_ERR_INVALID, "too long (%zu characters, at most %zu)",
                      len, n - 1);
        else
            memcpy(out, s, len + 1);
    }
    lua_pop(L, 1);
    return rc;
}

/* Value must be one of choices (NULL-terminated). */
static kvs_status check_choice(const vctx *v, int base_line, const char *field, const char *val,
                               const char *const *choices, int *index) {
    char known[256] = "";
    for (int i = 0; choices[i]; i++) {
        if (strcmp(val, choices[i]) == 0) {
            *index = i;
            return KVS_OK;
        }
        if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, choices[i], sizeof known - strlen(known) - 1);
    }
    return ferr(v, base_line, field, KVS_ERR_INVALID, "'%s' is not one of: %s", val, known);
}

/* ---- the pieces of an experiment ------------------------------------------- */

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
            return ferr(v, base_line, field, KVS_ERR_INVALID, "%s", e.msg);
        snprintf(out->name, sizeof out->name, "%s", name);
        out->n_layers = sc.n_layers, out->n_q_heads = sc.n_q_heads;
        out->n_kv_heads = sc.n_kv_heads, out->head_dim = sc.head_dim;
        return KVS_OK;
    }
    if (lua_type(L, idx) != LUA_TTABLE)
        return ferr(v, base_line, field, KVS_ERR_INVALID,
                    "expected a shape preset name or shape{layers=, q_heads=, kv_heads=, "
                    "head_dim=}, got a %s",
                    type_name(L, idx));
    int line = table_line(L, idx, base_line);
    static const char *const keys[] = {"layers", "q_heads", "kv_heads", "head_dim", NULL};
    char pre[160];
    snprintf(pre, sizeof pre, "%s.", field);
    if ((rc = check_keys(v, idx, line, pre, keys))) return rc;
    int64_t a, b, c, d;
    char f[200];
    snprintf(f, sizeof f, "%s.layers", field);
    if ((rc = get_int(v, idx, line, "layers", f, 1, 256, -1, &a))) return rc;
    snprintf(f, sizeof f, "%s.q_heads", field);
    if ((rc = get_int(v, idx, line, "q_heads", f, 1, 256, -1, &b))) return rc;
    snprintf(f, sizeof f, "%s.kv_heads", field);
    if ((rc = get_int(v, idx, line, "kv_heads", f, 1, 256, -1, &c))) return rc;
    snprintf(f, sizeof f, "%s.head_dim", field);
    if ((rc = get_int(v, idx, line, "head_dim", f, 2, 1024, -1, &d))) return rc;
    if (a < 0 || b < 0 || c < 0 || d < 0)
        return ferr(v, line, NULL, KVS_ERR_INVALID,
                    "%s: shape{} needs layers, q_heads, kv_heads and head_dim", field);
    if (b % c != 0)
        return ferr(v, line, f, KVS_ERR_INVALID, "q_heads (%lld) must be a multiple of kv_heads (%lld)",
                    (long long)b, (long long)c);
    if (d % 2 != 0)
        return ferr(v, line, f, KVS_ERR_INVALID, "head_dim %lld must be even (RoPE pairs channels)",
                    (long long)d);
    out->n_layers = (int)a, out->n_q_heads = (int)b, out->n_kv_heads = (int)c, out->head_dim = (int)d;
    snprintf(out->name, sizeof out->name, "custom-L%d-Hq%d-Hkv%d-d%d", out->n_layers,
             out->n_q_heads, out->n_kv_heads, out->head_dim);
    return KVS_OK;
}

static kvs_status parse_synthetic(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = table_line(L, t, e->line);
    static const char *const keys[] = {"shape", "n_tokens", "seeds", "queries", "probes",
                                       "outliers", "sinks", "image_frac", NULL};
    if ((rc = check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "synthetic");
    /* shapes */
    lua_getfield(L, t, "shape");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return ferr(v, line, NULL, KVS_ERR_INVALID, "dataset.shape: missing (required): a preset "
                    "name, shape{...}, or a list of them");
    }
    int is_list, n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, line, "dataset.shape"))) {
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
        elem_name(name, sizeof name, "dataset.shape", is_list, i);
        list_get(L, idx, is_list, i);
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
    if ((rc = get_ints(v, t, line, "n_tokens", "dataset.n_tokens", 16, 1 << 20, 1, 0, &tmp, &nt)))
        return rc;
    e->lengths = malloc(sizeof *e->lengths * (size_t)nt);
    if (!e->lengths) {
        free(tmp);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < nt; i++) e->lengths[i] = (int)tmp[i];
    e->n_lengths = nt;
    free(tmp);
    if ((rc = get_ints(v, t, line, "seeds", "dataset.seeds", 0, INT64_MAX, 0, 1, &e->seeds,
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
        return ferr(v, line, "dataset.queries", KVS_ERR_INVALID,
                    "expected \"all\" or a whole number of queries in [0, 1048576]");
    }
    lua_pop(L, 1);
    int64_t x;
    if ((rc = get_int(v, t, line, "probes", "dataset.probes", 1, 4096, 16, &x))) return rc;
    e->probes = (int)x;
    if ((rc = get_int(v, t, line, "outliers", "dataset.outliers", 0, 1 << 20, 0, &x))) return rc;
    e->outliers = (int)x;
    if ((rc = get_int(v, t, line, "sinks", "dataset.sinks", -1, 1 << 20, -1, &x))) return rc;
    e->sinks = (int)x;
    if ((rc = get_double(v, t, line, "image_frac", "dataset.image_frac", 0.0, 0.95, 0.0,
                         &e->image_frac)))
        return rc;
    for (int i = 0; i < e->n_lengths; i++)
        if (e->outliers > e->lengths[i] / 2)
            return ferr(v, line, "dataset.outliers", KVS_ERR_INVALID,
                        "%d outliers out of range for n_tokens %d: at most N/2 = %d", e->outliers,
                        e->lengths[i], e->lengths[i] / 2);
    return KVS_OK;
}

static kvs_status get_choice_list(const vctx *v, int t, int base_line, const char *key,
                                  const char *const *choices, int dflt, int *idx, int max, int *n);

/* A path from the config: absolute (or empty) as given, else relative to the
 * config file's folder. */
static kvs_status config_rel_path(const vctx *v, int line, const char *field, const char *in, char *out,
                                  size_t n) {
    if (in[0] == '/' || !in[0]) {
        snprintf(out, n, "%s", in);
        return KVS_OK;
    }
    const char *slash = strrchr(v->path, '/');
    int dl = slash ? (int)(slash - v->path) : 1;
    int w = snprintf(out, n, "%.*s/%s", dl, slash ? v->path : ".", in);
    if (w < 0 || (size_t)w >= n) return ferr(v, line, field, KVS_ERR_INVALID, "path too long");
    return KVS_OK;
}

/* data (a folder, relative to the config's) and setting of niah{} / ruler{} */
static kvs_status parse_ds_common(const vctx *v, int t, int line, kvs_experiment *e) {
    kvs_status rc;
    char data[1024];
    if ((rc = get_string(v, t, line, "data", "dataset.data", data, sizeof data, 0))) return rc;
    if ((rc = config_rel_path(v, line, "dataset.data", data, e->dataset_data, sizeof e->dataset_data)))
        return rc;
    static const char *const modes[] = {"query_aware", "query_agnostic", NULL};
    lua_getfield(v->L, t, "setting");
    int has = !lua_isnil(v->L, -1);
    lua_pop(v->L, 1);
    e->n_ds_modes = 0;
    if (has && (rc = get_choice_list(v, t, line, "setting", modes, 0, e->ds_modes, 2, &e->n_ds_modes))) {
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
    kvs_status rc = get_int(v, t, line, key, name, lo, hi, *out, &x);
    if (!rc) *out = (int)x;
    return rc;
}

static kvs_status ruler_str(const vctx *v, int t, int line, const char *field, const char *key,
                            char *out, size_t n) {
    char name[96], buf[64];
    snprintf(name, sizeof name, "%s.%s", field, key);
    kvs_status rc = get_string(v, t, line, key, name, buf, sizeof buf, 0);
    if (!rc && buf[0]) {
        if (strlen(buf) >= n) return ferr(v, line, name, KVS_ERR_INVALID, "'%s' is too long", buf);
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
    if ((rc = check_keys(v, t, line, prefix, keys))) return rc;
    char name[48], kind[32], fname[96];
    snprintf(fname, sizeof fname, "%s.name", field);
    if ((rc = get_string(v, t, line, "name", fname, name, sizeof name, 1))) return rc;
    snprintf(fname, sizeof fname, "%s.task", field);
    if ((rc = get_string(v, t, line, "task", fname, kind, sizeof kind, 0))) return rc;
    kvs_err e2 = {0};
    if (kind[0] ? kvs_ruler_task_defaults(kind, out, &e2) : kvs_ruler_task_get(name, out, &e2))
        return ferr(v, line, kind[0] ? fname : field, KVS_ERR_INVALID, "%s%s", e2.msg,
                    kind[0] ? "" : " (or give task = the kind, for a task of your own)");
    for (const char *p = name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.'))
            return ferr(v, line, field, KVS_ERR_INVALID, "name '%s': use letters, digits, '_', '-', '.'", name);
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
    if ((rc = get_double(v, t, line, "alpha", an, 1.000001, 10.0, out->alpha, &out->alpha))) return rc;
    if (kvs_ruler_task_check(out, &e2)) return ferr(v, line, field, KVS_ERR_INVALID, "%s", e2.msg);
    return KVS_OK;
}

/* ruler{ tasks, lengths, n, seed, data, setting } */
static kvs_status parse_ruler(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = table_line(L, t, e->line);
    static const char *const keys[] = {"tasks", "lengths", "n", "seed", "data", "setting", NULL};
    if ((rc = check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "ruler");
    int64_t *tmp = NULL;
    int n = 0;
    if ((rc = get_ints(v, t, line, "lengths", "dataset.lengths", 256, 1 << 22, 1, 0, &tmp, &n))) return rc;
    e->lengths = malloc(sizeof *e->lengths * (size_t)n);
    if (!e->lengths) {
        free(tmp);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) e->lengths[i] = (int)tmp[i];
    e->n_lengths = n;
    free(tmp);
    int64_t x;
    if ((rc = get_int(v, t, line, "n", "dataset.n", 1, 100000, 1, &x))) return rc;
    e->per_cell = (int)x;
    if ((rc = get_int(v, t, line, "seed", "dataset.seed", 0, INT64_MAX, 42, &x))) return rc;
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
    n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, line, "dataset.tasks"))) goto done;
    if (n < 1) {
        rc = ferr(v, line, "dataset.tasks", KVS_ERR_INVALID, "empty list");
        goto done;
    }
    e->ruler_tasks = calloc((size_t)n, sizeof *e->ruler_tasks);
    if (!e->ruler_tasks) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 1; i <= n && !rc; i++) {
        char name[64];
        elem_name(name, sizeof name, "dataset.tasks", is_list, i);
        list_get(L, idx, is_list, i);
        kvs_ruler_task *rt = &e->ruler_tasks[i - 1];
        if (lua_type(L, -1) == LUA_TSTRING) {
            kvs_err e2 = {0};
            if (kvs_ruler_task_get(lua_tostring(L, -1), rt, &e2))
                rc = ferr(v, line, name, KVS_ERR_INVALID, "%s", e2.msg);
        } else if (lua_type(L, -1) == LUA_TTABLE) {
            rc = parse_ruler_task(v, lua_gettop(L), line, name, rt);
        } else {
            rc = ferr(v, line, name, KVS_ERR_INVALID,
                      "expected a task name or a table { name = ..., task = ..., ... }, got a %s",
                      type_name(L, -1));
        }
        lua_pop(L, 1);
        for (int j = 0; !rc && j < i - 1; j++)
            if (!strcmp(e->ruler_tasks[j].name, rt->name))
                rc = ferr(v, line, name, KVS_ERR_INVALID, "task '%s' given twice", rt->name);
        if (!rc) e->n_ruler_tasks = i;
    }
done:
    lua_pop(L, 1);
    return rc;
}

static kvs_status parse_niah(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int line = table_line(L, t, e->line);
    static const char *const keys[] = {"lengths", "depths", "per_cell", "seed", "haystack",
                                       "data",    "setting", NULL};
    if ((rc = check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "niah");
    static const char *const hays[] = {"default", "paul_graham", NULL};
    char hay[32];
    int which = 0;
    if ((rc = get_string(v, t, line, "haystack", "dataset.haystack", hay, sizeof hay, 0))) return rc;
    if (hay[0] && (rc = check_choice(v, line, "dataset.haystack", hay, hays, &which))) return rc;
    snprintf(e->haystack, sizeof e->haystack, "%s", which == 1 ? "paul_graham" : "");
    if ((rc = parse_ds_common(v, t, line, e))) return rc;
    int64_t *tmp = NULL;
    int n = 0;
    if ((rc = get_ints(v, t, line, "lengths", "dataset.lengths", 64, 1 << 20, 1, 0, &tmp, &n)))
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
        return ferr(v, line, NULL, KVS_ERR_INVALID, "dataset.depths: missing (required)");
    }
    int is_list;
    n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, line, "dataset.depths"))) {
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
        elem_name(name, sizeof name, "dataset.depths", is_list, i);
        list_get(L, idx, is_list, i);
        int ok = lua_type(L, -1) == LUA_TNUMBER;
        double d = lua_tonumber(L, -1);
        lua_pop(L, 1);
        if (!ok || !(d >= 0 && d <= 1)) {
            lua_pop(L, 1);
            return ferr(v, line, name, KVS_ERR_INVALID, "expected a depth in [0, 1]");
        }
        e->depths[i - 1] = d;
    }
    lua_pop(L, 1);
    int64_t x;
    if ((rc = get_int(v, t, line, "per_cell", "dataset.per_cell", 1, 100000, 1, &x))) return rc;
    e->per_cell = (int)x;
    if ((rc = get_int(v, t, line, "seed", "dataset.seed", 0, INT64_MAX, 1, &x))) return rc;
    e->seeds = malloc(sizeof *e->seeds);
    if (!e->seeds) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    e->seeds[0] = x;
    e->n_seeds = 1;
    return KVS_OK;
}

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
            return ferr(v, base_line, field, KVS_ERR_INVALID,
                        "expected name = value pairs ({gamma = 0.1}), found a positional value");
        }
        const char *pname = lua_tostring(L, -2);
        snprintf(field, sizeof field, "params.%s.%s", m->name, pname);
        int pi = kvs_param_index(m, pname);
        if (pi < 0) {
            kvs_err e = {0};
            kvs_params_set(m, &scratch, pname, "0", &e);
            lua_pop(L, 2);
            return ferr(v, base_line, field, KVS_ERR_NOTFOUND, "%s", e.msg);
        }
        int idx = lua_gettop(L);
        int is_list, n = list_len(L, idx, &is_list);
        if (is_list && (rc = check_sequence(v, idx, base_line, field))) {
            lua_pop(L, 2);
            return rc;
        }
        if (n > MAX_SWEEP) {
            lua_pop(L, 2);
            return ferr(v, base_line, field, KVS_ERR_INVALID, "%d values; at most %d per parameter",
                        n, MAX_SWEEP);
        }
        sw->set[pi] = 1;
        sw->count[pi] = n;
        for (int i = 1; i <= n; i++) {
            char name[220], text[64];
            elem_name(name, sizeof name, field, is_list, i);
            list_get(L, idx, is_list, i);
            int ok = value_text(L, -1, text, sizeof text);
            const char *tn = type_name(L, -1);
            lua_pop(L, 1);
            if (!ok) {
                lua_pop(L, 2);
                return ferr(v, base_line, name, KVS_ERR_INVALID,
                            "expected a number, boolean or name, got a %s", tn);
            }
            kvs_err e = {0};
            if (kvs_params_set(m, &scratch, pname, text, &e) != KVS_OK) {
                lua_pop(L, 2);
                return ferr(v, base_line, name, KVS_ERR_INVALID, "%s", e.msg);
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

static kvs_status parse_methods(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    const kvs_method *list[64];
    int n_methods = 0;
    lua_getfield(L, t, "methods");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return ferr(v, e->line, NULL, KVS_ERR_INVALID, "methods: missing (required), e.g. methods = "
                    "{ \"full\", \"flashcache\" }");
    }
    int is_list, n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, e->line, "methods"))) goto done;
    if (n > 64) {
        rc = ferr(v, e->line, "methods", KVS_ERR_INVALID, "%d methods; at most 64", n);
        goto done;
    }
    for (int i = 1; i <= n; i++) {
        char name[64];
        elem_name(name, sizeof name, "methods", is_list, i);
        list_get(L, idx, is_list, i);
        kvs_err me = {0};
        const kvs_method *m = NULL;
        if (lua_type(L, -1) == LUA_TTABLE) { /* composed from parts (config_method.c) */
            if (kvs_config_method_table(L, lua_gettop(L), e, &m, &me) != KVS_OK) {
                lua_pop(L, 1);
                rc = ferr(v, e->line, name, me.code, "%s", me.msg);
                goto done;
            }
        } else if (lua_type(L, -1) != LUA_TSTRING) {
            rc = ferr(v, e->line, name, KVS_ERR_INVALID,
                      "expected a method name or a table composing one, got a %s",
                      type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        } else if (kvs_method_lookup(lua_tostring(L, -1), &m, &me) != KVS_OK) {
            lua_pop(L, 1);
            rc = ferr(v, e->line, name, KVS_ERR_NOTFOUND, "%s", me.msg);
            goto done;
        }
        lua_pop(L, 1);
        for (int j = 0; j < n_methods; j++)
            if (list[j] == m || strcmp(list[j]->name, m->name) == 0) {
                rc = ferr(v, e->line, name, KVS_ERR_INVALID, "method '%s' listed twice", m->name);
                goto done;
            }
        list[n_methods++] = m;
    }
    lua_pop(L, 1);
    /* params = { method = { name = value or list } } */
    sweep *sw = calloc((size_t)n_methods, sizeof *sw);
    int *has = calloc((size_t)n_methods, sizeof *has);
    if (!sw || !has) {
        free(sw);
        free(has);
        return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    }
    lua_getfield(L, t, "params");
    idx = lua_gettop(L);
    if (!lua_isnil(L, idx) && lua_type(L, idx) != LUA_TTABLE) {
        rc = ferr(v, e->line, "params", KVS_ERR_INVALID,
                  "expected a table { method = { param = value or {values} } }, got a %s",
                  type_name(L, idx));
    } else if (!lua_isnil(L, idx)) {
        lua_pushnil(L);
        while (!rc && lua_next(L, idx)) {
            if (lua_type(L, -2) != LUA_TSTRING) {
                rc = ferr(v, e->line, "params", KVS_ERR_INVALID, "keys must be method names");
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
                    rc = ferr(v, e->line, field, KVS_ERR_NOTFOUND, "%s", me.msg);
                else
                    rc = ferr(v, e->line, field, KVS_ERR_INVALID,
                              "method '%s' is not in methods; add it there or remove its params",
                              mname);
                lua_pop(L, 2);
                break;
            }
            if (lua_type(L, -1) != LUA_TTABLE) {
                rc = ferr(v, e->line, field, KVS_ERR_INVALID,
                          "expected a table { param = value or {values} }, got a %s",
                          type_name(L, -1));
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
        rc = list[j]->create == kvs_compose_dyn.create ? kvs_config_composed_variant(e, list[j], v->err)
                                                       : add_variants(e, list[j], has[j] ? &sw[j] : NULL, v->err);
    free(sw);
    free(has);
    return rc;
done:
    lua_pop(L, 1);
    return rc;
}

static kvs_status parse_budgets(const vctx *v, int t, kvs_experiment *e, int required) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, t, "budgets");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        if (required)
            return ferr(v, e->line, NULL, KVS_ERR_INVALID,
                        "budgets: missing (required): ratios in (0, 1] or token counts, e.g. "
                        "budgets = { 0.1, 0.2, 0.5 }");
        return KVS_OK;
    }
    int is_list, n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, e->line, "budgets"))) goto done;
    e->budgets = calloc((size_t)n, sizeof *e->budgets);
    if (!e->budgets) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    e->n_budgets = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        elem_name(name, sizeof name, "budgets", is_list, i);
        list_get(L, idx, is_list, i);
        int isnum = lua_type(L, -1) == LUA_TNUMBER;
        int isint = lua_isinteger(L, -1);
        double x = lua_tonumber(L, -1);
        const char *tn = type_name(L, -1);
        lua_pop(L, 1);
        if (!isnum) {
            rc = ferr(v, e->line, name, KVS_ERR_INVALID,
                      "expected a number (a ratio in (0, 1] or a token count >= 2), got a %s", tn);
            goto done;
        }
        if (x > 0 && x <= 1) {
            e->budgets[i - 1].ratio = x;
        } else if (x > 1 && x <= (double)(1 << 30) && (isint || x == floor(x))) {
            e->budgets[i - 1].tokens = (int64_t)x;
        } else {
            rc = ferr(v, e->line, name, KVS_ERR_INVALID,
                      "%g out of range: a budget is a ratio in (0, 1] or a whole number of tokens "
                      "in [2, 1073741824]",
                      x);
            goto done;
        }
        for (int j = 0; j < i - 1; j++)
            if (e->budgets[j].ratio == e->budgets[i - 1].ratio &&
                e->budgets[j].tokens == e->budgets[i - 1].tokens) {
                rc = ferr(v, e->line, name, KVS_ERR_INVALID, "budget %g listed twice", x);
                goto done;
            }
    }
done:
    lua_pop(L, 1);
    return rc;
}

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
    int is_list, n = lua_type(L, u) == LUA_TSTRING ? 1 : list_len(L, u, &is_list);
    if (lua_type(L, u) == LUA_TSTRING) is_list = 0;
    if (lua_type(L, u) != LUA_TSTRING && lua_type(L, u) != LUA_TTABLE) {
        rc = ferr(v, line, "backend.url", KVS_ERR_INVALID,
                  "expected a URL or a list of URLs, got a %s", type_name(L, u));
        goto done;
    }
    if (is_list && (rc = check_sequence(v, u, line, "backend.url"))) goto done;
    if (n < 1 || n > 64) {
        rc = ferr(v, line, "backend.url", KVS_ERR_INVALID, "%d URLs; give 1 to 64", n);
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
        elem_name(name, sizeof name, "backend.url", is_list, i);
        if (is_list)
            list_get(L, u, is_list, i);
        else
            lua_pushvalue(L, u);
        size_t len = 0;
        const char *x = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!x)
            rc = ferr(v, line, name, KVS_ERR_INVALID, "expected a string, got a %s", type_name(L, -1));
        else if (len >= sizeof e->backend_urls[0])
            rc = ferr(v, line, name, KVS_ERR_INVALID, "too long (%zu characters)", len);
        else if (strncmp(x, "http://", 7) != 0 && strncmp(x, "https://", 8) != 0)
            rc = ferr(v, line, name, KVS_ERR_INVALID, "'%s' is not an http:// or https:// URL", x);
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

static kvs_status parse_backend(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    e->in_flight = 2;
    lua_getfield(L, t, "backend");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        e->backend_embedded = 1;
    } else if (lua_type(L, idx) != LUA_TTABLE) {
        rc = ferr(v, e->line, "backend", KVS_ERR_INVALID,
                  "expected { embedded = true } or { url = \"http://host:port\" }, got a %s",
                  type_name(L, idx));
    } else {
        int line = table_line(L, idx, e->line);
        static const char *const keys[] = {"embedded", "url",     "model",     "api",
                                           "threads",  "ctx",     "in_flight", NULL};
        int64_t x;
        char api[16];
        if (!(rc = check_keys(v, idx, line, "backend.", keys)) &&
            !(rc = parse_backend_urls(v, idx, line, e)) &&
            !(rc = get_string(v, idx, line, "model", "backend.model", e->model, sizeof e->model,
                              0)) &&
            !(rc = get_string(v, idx, line, "api", "backend.api", api, sizeof api, 0))) {
            lua_getfield(L, idx, "embedded");
            int has_emb = !lua_isnil(L, -1);
            if (has_emb && !lua_isboolean(L, -1))
                rc = ferr(v, line, "backend.embedded", KVS_ERR_INVALID,
                          "expected true or false, got a %s", type_name(L, -1));
            e->backend_embedded = lua_toboolean(L, -1);
            lua_pop(L, 1);
            if (!rc && e->backend_embedded == (e->n_backend_urls > 0))
                rc = ferr(v, line, NULL, KVS_ERR_INVALID,
                          "backend: give exactly one of embedded = true or url = \"...\"");
            static const char *const apis[] = {"kvsieve", "openai", NULL};
            int which = 0;
            if (!rc && api[0] && !(rc = check_choice(v, line, "backend.api", api, apis, &which)))
                e->backend_openai = which == 1;
            if (!rc && e->backend_openai && e->backend_embedded)
                rc = ferr(v, line, "backend.api", KVS_ERR_INVALID,
                          "the embedded backend is kvsieve's own server; api = \"openai\" is for "
                          "url = ... servers");
            if (!rc && !(rc = get_int(v, idx, line, "threads", "backend.threads", 1, 1024, 0, &x)))
                e->backend_threads = (int)x;
            if (!rc && !(rc = get_int(v, idx, line, "ctx", "backend.ctx", 64, 1 << 24, 0, &x)))
                e->backend_ctx = (int)x;
            if (!rc && !(rc = get_int(v, idx, line, "in_flight", "backend.in_flight", 1, 64, 2, &x)))
                e->in_flight = (int)x;
            if (!rc && !e->backend_embedded && (e->backend_threads || e->backend_ctx))
                rc = ferr(v, line, e->backend_threads ? "backend.threads" : "backend.ctx",
                          KVS_ERR_INVALID, "only for embedded = true (a url backend is started "
                          "by whoever runs it)");
        }
    }
    lua_pop(L, 1);
    return rc;
}

/* jsonl{ path, limit } / longbench{...} / milebench{...}: a file dataset of
 * kind `task`; the path is relative to the config's folder. */
static kvs_status parse_file_dataset(const vctx *v, int t, const char *helper, kvs_experiment *e) {
    kvs_status rc;
    int line = table_line(v->L, t, e->line);
    static const char *const keys[] = {"path", "limit", NULL};
    if ((rc = check_keys(v, t, line, "dataset.", keys))) return rc;
    snprintf(e->dataset, sizeof e->dataset, "%s", helper);
    char path[1024];
    if ((rc = get_string(v, t, line, "path", "dataset.path", path, sizeof path, 1))) return rc;
    if ((rc = config_rel_path(v, line, "dataset.path", path, e->dataset_path, sizeof e->dataset_path)))
        return rc;
    int64_t x;
    if ((rc = get_int(v, t, line, "limit", "dataset.limit", 0, 1 << 30, 0, &x))) return rc;
    e->limit = (int)x;
    return KVS_OK;
}

static kvs_status get_choice_list(const vctx *v, int t, int base_line, const char *key,
                                  const char *const *choices, int dflt, int *idx, int max, int *n);

/* mode (a value or a list), template, n_predict, ignore_eos, variants_per_request. */
static kvs_status parse_task_fields(const vctx *v, int t, kvs_experiment *e) {
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
        return ferr(v, e->line, has_setting ? "setting" : "mode", KVS_ERR_INVALID,
                    "give the setting once: mode, setting and dataset.setting are the same field");
    if (e->n_ds_modes > 0) {
        e->n_modes = e->n_ds_modes;
        memcpy(e->modes, e->ds_modes, sizeof e->modes);
    } else if ((rc = get_choice_list(v, t, e->line, has_setting ? "setting" : "mode", modes, 0, e->modes,
                                     2, &e->n_modes))) {
        return rc;
    }
    if ((rc = get_string(v, t, e->line, "template", "template", e->prompt_template,
                         sizeof e->prompt_template, 0)))
        return rc;
    if (e->prompt_template[0]) {
        const kvs_prompt_template *pt;
        kvs_err e2 = {0};
        if (kvs_prompt_template_get(e->prompt_template, &pt, &e2))
            return ferr(v, e->line, "template", KVS_ERR_INVALID, "%s", e2.msg);
    }
    lua_getfield(v->L, t, "kv_spans");
    int ks_type = lua_type(v->L, -1);
    e->no_kv_spans = ks_type == LUA_TBOOLEAN && !lua_toboolean(v->L, -1);
    lua_pop(v->L, 1);
    if (ks_type != LUA_TNIL && ks_type != LUA_TBOOLEAN)
        return ferr(v, e->line, "kv_spans", KVS_ERR_INVALID, "expected true or false");
    int64_t x;
    int dflt = !strcmp(e->dataset, "niah") ? 24 : !strcmp(e->dataset, "ruler") ? 0 : 64;
    if ((rc = get_int(v, t, e->line, "n_predict", "n_predict", 1, 1 << 16, dflt, &x))) return rc;
    e->n_predict = (int)x;
    lua_getfield(v->L, t, "ignore_eos");
    int has_ie = !lua_isnil(v->L, -1), ie_ok = lua_isboolean(v->L, -1);
    e->ignore_eos = lua_toboolean(v->L, -1);
    lua_pop(v->L, 1);
    if (has_ie && !ie_ok)
        return ferr(v, e->line, "ignore_eos", KVS_ERR_INVALID, "expected true or false");
    if ((rc = get_int(v, t, e->line, "variants_per_request", "variants_per_request", 1, 64, 64,
                      &x)))
        return rc;
    e->variants_per_request = (int)x;
    if (e->backend_openai)
        for (int i = 0; i < e->n_variants; i++)
            if (e->variants[i].method != &kvs_method_full)
                return ferr(v, e->line, "methods", KVS_ERR_INVALID,
                            "method '%s': backend api 'openai' (a plain OpenAI-compatible server, "
                            "no kv_compression) can only evaluate 'full'",
                            e->variants[i].method->name);
    for (int i = 0; i < e->n_modes; i++)
        if (e->modes[i] == KVS_PROMPT_QUERY_AGNOSTIC && e->backend_openai)
            return ferr(v, e->line, "mode", KVS_ERR_INVALID,
                        "query_agnostic needs the kvsieve kv_compression extension (backend api "
                        "'openai' cannot append the question after a compression)");
    return KVS_OK;
}

static kvs_status parse_metrics(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    const char *const *known = kvs_metric_names();
    lua_getfield(L, t, "metrics");
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        return ferr(v, e->line, NULL, KVS_ERR_INVALID,
                    "metrics: missing (required for kind 'task'), e.g. metrics = { \"contains\" }");
    }
    int is_list, n = list_len(L, idx, &is_list);
    if (is_list && (rc = check_sequence(v, idx, e->line, "metrics"))) goto done;
    e->metrics = calloc((size_t)n, sizeof *e->metrics);
    if (!e->metrics) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    e->n_metrics = n;
    for (int i = 1; i <= n; i++) {
        char name[64];
        int which;
        elem_name(name, sizeof name, "metrics", is_list, i);
        list_get(L, idx, is_list, i);
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        snprintf(e->metrics[i - 1], sizeof e->metrics[i - 1], "%s", s);
        lua_pop(L, 1);
        if ((rc = check_choice(v, e->line, name, e->metrics[i - 1], known, &which))) goto done;
    }
done:
    lua_pop(L, 1);
    return rc;
}

/* ---- kind overhead ------------------------------------------------------------ */

/* A choice or a list of distinct choices: idx[0..*n) indices into choices. */
static kvs_status get_choice_list(const vctx *v, int t, int base_line, const char *key,
                                  const char *const *choices, int dflt, int *idx, int max, int *n) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, t, key);
    int li = lua_gettop(L);
    *n = 0;
    if (lua_isnil(L, li)) {
        idx[(*n)++] = dflt;
        lua_pop(L, 1);
        return KVS_OK;
    }
    int is_list, len = list_len(L, li, &is_list);
    if (is_list && (rc = check_sequence(v, li, base_line, key))) goto done;
    if (len > max) {
        rc = ferr(v, base_line, key, KVS_ERR_INVALID, "%d values; at most %d", len, max);
        goto done;
    }
    for (int i = 1; i <= len; i++) {
        char name[64];
        elem_name(name, sizeof name, key, is_list, i);
        list_get(L, li, is_list, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            rc = ferr(v, base_line, name, KVS_ERR_INVALID, "expected a string, got a %s",
                      type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        }
        char val[32];
        snprintf(val, sizeof val, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        int which = 0;
        if ((rc = check_choice(v, base_line, name, val, choices, &which))) goto done;
        for (int j = 0; j < *n; j++)
            if (idx[j] == which) {
                rc = ferr(v, base_line, name, KVS_ERR_INVALID, "'%s' given twice", val);
                goto done;
            }
        idx[(*n)++] = which;
    }
done:
    lua_pop(L, 1);
    return rc;
}

/* threads = 2 or threads = { 1, 2 }: the overhead grid's thread axis. */
static kvs_status parse_thread_counts(const vctx *v, int t, kvs_experiment *e) {
    int64_t *tc = NULL;
    int n = 0;
    kvs_status rc = get_ints(v, t, e->line, "threads", "threads", 1, 256, 0, 1, &tc, &n);
    if (rc) return rc;
    int max = (int)(sizeof e->thread_counts / sizeof e->thread_counts[0]);
    if (n > max) {
        free(tc);
        return ferr(v, e->line, "threads", KVS_ERR_INVALID, "%d values; at most %d", n, max);
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (tc[j] == tc[i]) {
                char name[32];
                snprintf(name, sizeof name, "threads[%d]", i + 1);
                rc = ferr(v, e->line, name, KVS_ERR_INVALID, "%lld given twice", (long long)tc[i]);
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
        return ferr(v, base_line, field, KVS_ERR_INVALID,
                    "expected a whole number of tokens in [0, 1048576] (0: never), got %s",
                    lua_type(L, -1) == LUA_TNUMBER ? "another number" : type_name(L, -1));
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
        rc = ferr(v, e->line, "max_tokens", KVS_ERR_INVALID,
                  "expected a table { method = N or { [\"shape\"] = N } }, got a %s",
                  type_name(L, mt));
        goto done;
    }
    lua_pushnil(L);
    while (!rc && lua_next(L, mt)) { /* key -2, value -1 */
        if (lua_type(L, -2) != LUA_TSTRING) {
            rc = ferr(v, e->line, "max_tokens", KVS_ERR_INVALID,
                      "keys must be method names (max_tokens = { h2o = 8192 })");
            lua_pop(L, 2);
            break;
        }
        const char *mname = lua_tostring(L, -2);
        char field[96];
        snprintf(field, sizeof field, "max_tokens.%s", mname);
        int used = 0;
        for (int i = 0; i < e->n_variants; i++) used |= !strcmp(e->variants[i].method->name, mname);
        if (!kvs_method_find(mname))
            rc = ferr(v, e->line, field, KVS_ERR_INVALID, "unknown method '%s'", mname);
        else if (!used)
            rc = ferr(v, e->line, field, KVS_ERR_INVALID,
                      "method '%s' is not in this experiment's methods", mname);
        else if (lua_type(L, -1) == LUA_TTABLE) {
            int st = lua_gettop(L);
            lua_pushnil(L);
            while (!rc && lua_next(L, st)) {
                char f2[160];
                if (lua_type(L, -2) != LUA_TSTRING) {
                    rc = ferr(v, e->line, field, KVS_ERR_INVALID,
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
                    rc = ferr(v, e->line, f2, KVS_ERR_INVALID,
                              "shape '%s' is neither in this experiment's dataset.shape nor a "
                              "preset", sname);
                else if (!(rc = limit_value(v, e->line, f2, &lim))) {
                    if (e->n_limits >= cap)
                        rc = ferr(v, e->line, field, KVS_ERR_INVALID, "more than %d limits", cap);
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
                    rc = ferr(v, e->line, field, KVS_ERR_INVALID, "more than %d limits", cap);
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
static kvs_status parse_overhead(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    int64_t x;
    if ((rc = get_int(v, t, e->line, "repeats", "repeats", 1, 100000, 20, &x))) return rc;
    e->repeats = (int)x;
    if ((rc = get_int(v, t, e->line, "warmup", "warmup", 0, 1000, 2, &x))) return rc;
    e->warmup = (int)x;
    static const char *const devices[] = {"cpu", "cuda", NULL};
    static const char *const dtypes[] = {"f32", "f16", "bf16", NULL};
    static const kvs_dtype dtv[] = {KVS_F32, KVS_F16, KVS_BF16};
    int idx[3], n = 0;
    if ((rc = get_choice_list(v, t, e->line, "device", devices, 0, idx, 2, &n))) return rc;
    e->n_devices = n;
    for (int i = 0; i < n; i++) snprintf(e->devices[i], sizeof e->devices[i], "%s", devices[idx[i]]);
    snprintf(e->device, sizeof e->device, "%s", e->devices[0]);
    if ((rc = get_choice_list(v, t, e->line, "dtype", dtypes, 0, idx, 3, &n))) return rc;
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

static kvs_status parse_experiment(const vctx *v, int t, kvs_experiment *e) {
    lua_State *L = v->L;
    kvs_status rc;
    e->line = table_line(L, t, 0);
    static const char *const keys[] = {"name",    "kind",    "description", "dataset", "methods",
                                       "budgets", "params",  "threads",     "backend", "model",
                                       "metrics", "repeats", "warmup",      "device",  "dtype",
                                       "max_tokens", "mode", "template", "n_predict", "setting",
                                       "kv_spans", "ignore_eos", "variants_per_request", NULL};
    if ((rc = check_keys(v, t, e->line, "", keys))) return rc;
    if ((rc = get_string(v, t, e->line, "name", "name", e->name, sizeof e->name, 1))) return rc;
    for (const char *p = e->name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.'))
            return ferr(v, e->line, "name", KVS_ERR_INVALID,
                        "'%s': use letters, digits, '_', '-' and '.' only", e->name);
    if (!e->name[0]) return ferr(v, e->line, "name", KVS_ERR_INVALID, "empty name");
    char kind[16];
    int k = 0;
    static const char *const kinds[] = {"fidelity", "overhead", "task", NULL};
    if ((rc = get_string(v, t, e->line, "kind", "kind", kind, sizeof kind, 0))) return rc;
    if (!kind[0]) snprintf(kind, sizeof kind, "fidelity");
    if ((rc = check_choice(v, e->line, "kind", kind, kinds, &k))) return rc;
    e->kind = (kvs_exp_kind)k;
    char scratch[512];
    if ((rc = get_string(v, t, e->line, "description", "description", scratch, sizeof scratch, 0)))
        return rc;

    /* dataset */
    lua_getfield(L, t, "dataset");
    int d = lua_gettop(L);
    if (lua_isnil(L, d)) {
        lua_pop(L, 1);
        return ferr(v, e->line, NULL, KVS_ERR_INVALID,
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
            rc = ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                      "kind '%s' needs synthetic{...} caches; %s{...} is for kind 'task'", kind,
                      helper);
        else
            rc = parse_file_dataset(v, d, helper, e);
    } else if (helper && !strcmp(helper, "ruler")) {
        if (e->kind != KVS_KIND_TASK)
            rc = ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                      "kind '%s' needs synthetic{...} caches; ruler{...} is for kind 'task'", kind);
        else
            rc = parse_ruler(v, d, e);
    } else if (!helper || (strcmp(helper, "synthetic") != 0 && strcmp(helper, "niah") != 0)) {
        rc = ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                  "expected synthetic{...}, niah{...} or ruler{...}, got a %s", type_name(L, d));
    } else if (strcmp(helper, "synthetic") == 0) {
        if (e->kind == KVS_KIND_TASK)
            rc = ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                      "kind 'task' needs a prompt dataset such as niah{...}, not synthetic{...}");
        else
            rc = parse_synthetic(v, d, e);
    } else {
        if (e->kind != KVS_KIND_TASK)
            rc = ferr(v, e->line, "dataset", KVS_ERR_INVALID,
                      "kind '%s' needs synthetic{...} caches; niah{...} is for kind 'task'", kind);
        else
            rc = parse_niah(v, d, e);
    }
    lua_pop(L, 1);
    if (rc) return rc;

    if ((rc = parse_methods(v, t, e))) return rc;
    if ((rc = parse_budgets(v, t, e, 1))) return rc;
    int64_t x;
    if (e->kind == KVS_KIND_OVERHEAD) { /* an axis of the overhead grid: a value or a list */
        if ((rc = parse_thread_counts(v, t, e))) return rc;
    } else {
        if ((rc = get_int(v, t, e->line, "threads", "threads", 1, 256, 1, &x))) return rc;
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
                return ferr(v, e->line, forbid[f][i], KVS_ERR_INVALID,
                            "not used by kind '%s' (it belongs to kind '%s')", kind,
                            f == 0 ? "task" : "overhead");
        }
    }
    if (e->kind == KVS_KIND_TASK) {
        if ((rc = parse_backend(v, t, e))) return rc;
        char model[256];
        if ((rc = get_string(v, t, e->line, "model", "model", model, sizeof model, 0))) return rc;
        if (model[0] && e->model[0] && strcmp(model, e->model) != 0)
            return ferr(v, e->line, "model", KVS_ERR_INVALID,
                        "'%s' differs from backend.model '%s' (give it once)", model, e->model);
        if (model[0]) snprintf(e->model, sizeof e->model, "%s", model);
        if (!e->model[0]) snprintf(e->model, sizeof e->model, "default");
        if ((rc = parse_metrics(v, t, e))) return rc;
        if ((rc = parse_task_fields(v, t, e))) return rc;
    }
    if (e->kind == KVS_KIND_OVERHEAD && (rc = parse_overhead(v, t, e))) return rc;
    return KVS_OK;
}

/* ---- overrides -------------------------------------------------------------- */

/* Apply "a.b.c=value" to the experiment table at t. */
static kvs_status apply_override(const vctx *v, int t, const char *ov) {
    lua_State *L = v->L;
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov)
        return kvs_errorf(v->err, KVS_ERR_INVALID, "-D %s: expected key=value", ov);
    char key[256];
    size_t kl = (size_t)(eq - ov);
    if (kl >= sizeof key) return kvs_errorf(v->err, KVS_ERR_INVALID, "-D %s: key too long", ov);
    memcpy(key, ov, kl);
    key[kl] = '\0';
    const char *val = eq + 1;
    /* the value: a Lua expression, else the text itself */
    char *chunk = malloc(strlen(val) + 8);
    if (!chunk) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
    sprintf(chunk, "return %s", val);
    int top = lua_gettop(L);
    if (luaL_loadbufferx(L, chunk, strlen(chunk), "=-D", "t") != LUA_OK ||
        lua_pcall(L, 0, 1, 0) != LUA_OK || lua_isnil(L, -1)) {
        lua_settop(L, top);
        lua_pushstring(L, val);
    }
    free(chunk);
    int vidx = lua_gettop(L);
    lua_pushvalue(L, t);
    char *save = NULL;
    char *tok = strtok_r(key, ".", &save);
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        if (!next) {
            lua_pushvalue(L, vidx);
            lua_setfield(L, -2, tok);
            break;
        }
        lua_getfield(L, -1, tok);
        if (lua_type(L, -1) != LUA_TTABLE) {
            lua_settop(L, top);
            return kvs_errorf(v->err, KVS_ERR_INVALID,
                              "-D %s: '%s' is not a table in this config, cannot set a field in it",
                              ov, tok);
        }
        lua_remove(L, -2);
        tok = next;
    }
    lua_settop(L, top);
    return KVS_OK;
}

/* ---- entry points --------------------------------------------------------- */

static void free_experiment(kvs_experiment *e) {
    free(e->shapes);
    free(e->lengths);
    free(e->seeds);
    free(e->depths);
    free(e->ruler_tasks);
    free(e->variants);
    free(e->budgets);
    free(e->metrics);
    free(e->backend_urls);
    kvs_config_composed_free(e);
}

void kvs_config_free(kvs_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->n_experiments; i++) free_experiment(&cfg->experiments[i]);
    free(cfg->experiments);
    free(cfg->text);
    free(cfg->overrides);
    memset(cfg, 0, sizeof *cfg);
}

kvs_status kvs_config_load_text(const char *path, const char *text, const char *const *overrides,
                                int n_overrides, kvs_config *cfg, kvs_err *err) {
    kvs_status rc = KVS_OK;
    lua_State *L = NULL;
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
    /* the sandbox root: the config's folder, resolved */
    char folder[1024];
    snprintf(folder, sizeof folder, "%s", path);
    char *slash = strrchr(folder, '/');
    if (slash)
        *(slash == folder ? slash + 1 : slash) = '\0';
    else
        snprintf(folder, sizeof folder, ".");
    if (!realpath(folder, cfg->dir)) {
        rc = kvs_errorf(err, KVS_ERR_IO, "%s: cannot resolve folder %s: %s", path, folder,
                        strerror(errno));
        goto cleanup;
    }
    size_t tl = strlen(text);
    cfg->text = malloc(tl + 1);
    if (!cfg->text) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    memcpy(cfg->text, text, tl + 1);
    /* hash = SHA-256(text || "\n-D " override ...) */
    kvs_sha256_ctx hc;
    kvs_sha256_init(&hc);
    kvs_sha256_update(&hc, text, tl);
    size_t olen = 0;
    for (int i = 0; i < n_overrides; i++) {
        kvs_sha256_update(&hc, "\n-D ", 4);
        kvs_sha256_update(&hc, overrides[i], strlen(overrides[i]));
        olen += strlen(overrides[i]) + 4;
    }
    uint8_t dg[32];
    kvs_sha256_final(&hc, dg);
    for (int i = 0; i < 32; i++) sprintf(cfg->hash + 2 * i, "%02x", dg[i]);
    if (n_overrides > 0) {
        cfg->overrides = calloc(olen + 1, 1);
        if (!cfg->overrides) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        for (int i = 0; i < n_overrides; i++) {
            if (i) strcat(cfg->overrides, " ");
            strcat(cfg->overrides, "-D ");
            strcat(cfg->overrides, overrides[i]);
        }
    }

    L = luaL_newstate();
    if (!L) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "cannot create a Lua state");
        goto cleanup;
    }
    long ticks = 0;
    *(long **)lua_getextraspace(L) = &ticks;
    lua_sethook(L, l_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    open_sandbox(L, cfg->dir);
    char chunkname[1100];
    snprintf(chunkname, sizeof chunkname, "@%s", path);
    if (luaL_loadbufferx(L, text, tl, chunkname, "t") != LUA_OK ||
        lua_pcall(L, 0, 0, 0) != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        rc = kvs_errorf(err, KVS_ERR_INVALID, "%s", m ? m : "error in config (no message)");
        goto cleanup;
    }
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LIST);
    int list = lua_gettop(L);
    int n = (int)lua_rawlen(L, list);
    if (n == 0) {
        rc = kvs_errorf(err, KVS_ERR_INVALID, "%s: no experiment{...} in this config", path);
        goto cleanup;
    }
    cfg->experiments = calloc((size_t)n, sizeof *cfg->experiments);
    if (!cfg->experiments) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    vctx v = {L, path, text, overrides, n_overrides, err};
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, list, i);
        int t = lua_gettop(L);
        for (int o = 0; o < n_overrides && !rc; o++) rc = apply_override(&v, t, overrides[o]);
        cfg->n_experiments = i;
        if (!rc) rc = parse_experiment(&v, t, &cfg->experiments[i - 1]);
        lua_pop(L, 1);
        if (rc) goto cleanup;
        for (int j = 0; j < i - 1; j++)
            if (strcmp(cfg->experiments[j].name, cfg->experiments[i - 1].name) == 0) {
                rc = ferr(&v, cfg->experiments[i - 1].line, "name", KVS_ERR_INVALID,
                          "experiment '%s' defined twice in this file", cfg->experiments[j].name);
                goto cleanup;
            }
    }
cleanup:
    if (L) lua_close(L);
    if (rc) kvs_config_free(cfg);
    return rc;
}

kvs_status kvs_config_load(const char *path, const char *const *overrides, int n_overrides,
                           kvs_config *cfg, kvs_err *err) {
    kvs_status rc = KVS_OK;
    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_errorf(err, KVS_ERR_IO, "cannot open config %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        rc = kvs_errorf(err, KVS_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
        goto cleanup;
    }
    long len = ftell(f);
    if (len < 0 || len > (64L << 20)) {
        rc = kvs_errorf(err, KVS_ERR_INVALID, "%s: not a config (size %ld; at most 64 MiB)", path, len);
        goto cleanup;
    }
    rewind(f);
    text = malloc((size_t)len + 1);
    if (!text) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory reading %s", path);
        goto cleanup;
    }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        rc = kvs_errorf(err, KVS_ERR_IO, "%s: read failed", path);
        goto cleanup;
    }
    text[len] = '\0';
    if (strlen(text) != (size_t)len) {
        rc = kvs_errorf(err, KVS_ERR_INVALID, "%s: contains a NUL byte (not a text config)", path);
        goto cleanup;
    }
    rc = kvs_config_load_text(path, text, overrides, n_overrides, cfg, err);
cleanup:
    free(text);
    fclose(f);
    return rc;
}
