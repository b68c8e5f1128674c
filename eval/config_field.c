/*
 * config_field.c -- reading the fields of a config's Lua tables with errors
 * that name file:line and the field: integers, numbers, strings, choices,
 * lists of them, allowed keys, and paths relative to the config's folder.
 *
 * What it is: the readers every part of the validation uses. A field's line
 * is found by scanning the config text for the key from the line of the
 * call that holds it; a field set by a -D override names the override
 * instead. What it is not: no knowledge of what an experiment holds
 * (config_experiment.c and the files it calls).
 */
#include "config_internal.h"

#include <ctype.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
kvs_status kvs_cfg_ferr(const vctx *v, int base_line, const char *field, kvs_status code,
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
kvs_status kvs_cfg_check_keys(const vctx *v, int idx, int base_line, const char *prefix,
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
                                ? kvs_cfg_ferr(v, base_line, NULL, KVS_ERR_INVALID,
                                               "%s: positional value [%g] not allowed; write name = value",
                                               where, lua_tonumber(L, -1))
                                : kvs_cfg_ferr(v, base_line, NULL, KVS_ERR_INVALID,
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
                best ? kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                                    "unknown key '%s' (did you mean '%s'?); allowed: %s", k, best, known)
                     : kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "unknown key '%s'; allowed: %s", k,
                                    known);
            lua_pop(L, 1);
            return rc;
        }
    }
    return KVS_OK;
}

int kvs_cfg_table_line(lua_State *L, int idx, int dflt) {
    lua_getfield(L, idx, "__line");
    int line = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : dflt;
    lua_pop(L, 1);
    return line;
}

const char *kvs_cfg_type_name(lua_State *L, int idx) { return luaL_typename(L, idx); }

/* Value at idx as a list: returns its length, or 1 when it is a scalar
 * (then element 1 is the value itself). Pushes nothing. */
int kvs_cfg_list_len(lua_State *L, int idx, int *is_list) {
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
void kvs_cfg_list_get(lua_State *L, int idx, int is_list, int i) {
    if (is_list)
        lua_rawgeti(L, idx, i);
    else
        lua_pushvalue(L, idx);
}

void kvs_cfg_elem_name(char *out, size_t n, const char *field, int is_list, int i) {
    if (is_list)
        snprintf(out, n, "%s[%d]", field, i);
    else
        snprintf(out, n, "%s", field);
}

/* A list that is a table must be a proper sequence. */
kvs_status kvs_cfg_check_sequence(const vctx *v, int idx, int base_line, const char *field) {
    lua_State *L = v->L;
    idx = lua_absindex(L, idx);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
            lua_pop(L, 1);
            return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                                "expected a list ({a, b, ...}), found a table with named keys");
        }
    }
    if (n == 0) return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "empty list");
    return KVS_OK;
}

/* Integers: a number or a list of numbers, each in [lo, hi]. */
kvs_status kvs_cfg_get_ints(const vctx *v, int t, int base_line, const char *key, const char *field,
                            int64_t lo, int64_t hi, int required, int64_t dflt, int64_t **out,
                            int *n_out) {
    lua_State *L = v->L;
    kvs_status rc = KVS_OK;
    lua_getfield(L, t, key);
    int idx = lua_gettop(L);
    if (lua_isnil(L, idx)) {
        lua_pop(L, 1);
        if (required) return kvs_cfg_ferr(v, base_line, NULL, KVS_ERR_INVALID, "%s: missing (required)", field);
        *out = malloc(sizeof **out);
        if (!*out) return kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        (*out)[0] = dflt;
        *n_out = 1;
        return KVS_OK;
    }
    int is_list, n = kvs_cfg_list_len(L, idx, &is_list);
    *out = NULL;
    if (is_list && (rc = kvs_cfg_check_sequence(v, idx, base_line, field))) goto done;
    *out = malloc(sizeof **out * (size_t)n);
    if (!*out) {
        rc = kvs_errorf(v->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    *n_out = n;
    for (int i = 1; i <= n; i++) {
        char name[200];
        kvs_cfg_elem_name(name, sizeof name, field, is_list, i);
        kvs_cfg_list_get(L, idx, is_list, i);
        if (!lua_isinteger(L, -1)) {
            double d = lua_tonumber(L, -1);
            int isnum = lua_type(L, -1) == LUA_TNUMBER;
            rc = isnum ? kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID,
                                      "expected a whole number in [%lld, %lld], got %g", (long long)lo,
                                      (long long)hi, d)
                       : kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID,
                                      "expected a whole number in [%lld, %lld], got a %s", (long long)lo,
                                      (long long)hi, kvs_cfg_type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        }
        int64_t x = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (x < lo || x > hi) {
            rc = kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID, "%lld out of range [%lld, %lld]",
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

kvs_status kvs_cfg_get_int(const vctx *v, int t, int base_line, const char *key, const char *field,
                           int64_t lo, int64_t hi, int64_t dflt, int64_t *out) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *out = dflt;
        return KVS_OK;
    }
    if (!lua_isinteger(L, -1)) {
        kvs_status rc = kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                                     "expected a whole number in [%lld, %lld], got %s", (long long)lo,
                                     (long long)hi,
                                     lua_type(L, -1) == LUA_TNUMBER ? "a fraction" : kvs_cfg_type_name(L, -1));
        lua_pop(L, 1);
        return rc;
    }
    *out = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (*out < lo || *out > hi)
        return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "%lld out of range [%lld, %lld]",
                            (long long)*out, (long long)lo, (long long)hi);
    return KVS_OK;
}

kvs_status kvs_cfg_get_double(const vctx *v, int t, int base_line, const char *key, const char *field,
                              double lo, double hi, double dflt, double *out) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *out = dflt;
        return KVS_OK;
    }
    if (lua_type(L, -1) != LUA_TNUMBER) {
        kvs_status rc = kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID,
                                     "expected a number in [%g, %g], got a %s", lo, hi, kvs_cfg_type_name(L, -1));
        lua_pop(L, 1);
        return rc;
    }
    *out = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!(*out >= lo && *out <= hi))
        return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "%g out of range [%g, %g]", *out, lo, hi);
    return KVS_OK;
}

/* Optional string; "" when absent. */
kvs_status kvs_cfg_get_string(const vctx *v, int t, int base_line, const char *key, const char *field,
                              char *out, size_t n, int required) {
    lua_State *L = v->L;
    lua_getfield(L, t, key);
    kvs_status rc = KVS_OK;
    if (lua_isnil(L, -1)) {
        out[0] = '\0';
        if (required) rc = kvs_cfg_ferr(v, base_line, NULL, KVS_ERR_INVALID, "%s: missing (required)", field);
    } else if (lua_type(L, -1) != LUA_TSTRING) {
        rc = kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "expected a string, got a %s",
                          kvs_cfg_type_name(L, -1));
    } else {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (len >= n)
            rc = kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "too long (%zu characters, at most %zu)",
                              len, n - 1);
        else
            memcpy(out, s, len + 1);
    }
    lua_pop(L, 1);
    return rc;
}

/* Value must be one of choices (NULL-terminated). */
kvs_status kvs_cfg_check_choice(const vctx *v, int base_line, const char *field, const char *val,
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
    return kvs_cfg_ferr(v, base_line, field, KVS_ERR_INVALID, "'%s' is not one of: %s", val, known);
}

/* A path from the config: absolute (or empty) as given, else relative to the
 * config file's folder. */
kvs_status kvs_cfg_rel_path(const vctx *v, int line, const char *field, const char *in, char *out,
                            size_t n) {
    if (in[0] == '/' || !in[0]) {
        snprintf(out, n, "%s", in);
        return KVS_OK;
    }
    const char *slash = strrchr(v->path, '/');
    int dl = slash ? (int)(slash - v->path) : 1;
    int w = snprintf(out, n, "%.*s/%s", dl, slash ? v->path : ".", in);
    if (w < 0 || (size_t)w >= n) return kvs_cfg_ferr(v, line, field, KVS_ERR_INVALID, "path too long");
    return KVS_OK;
}

/* A choice or a list of distinct choices: idx[0..*n) indices into choices. */
kvs_status kvs_cfg_get_choice_list(const vctx *v, int t, int base_line, const char *key,
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
    int is_list, len = kvs_cfg_list_len(L, li, &is_list);
    if (is_list && (rc = kvs_cfg_check_sequence(v, li, base_line, key))) goto done;
    if (len > max) {
        rc = kvs_cfg_ferr(v, base_line, key, KVS_ERR_INVALID, "%d values; at most %d", len, max);
        goto done;
    }
    for (int i = 1; i <= len; i++) {
        char name[64];
        kvs_cfg_elem_name(name, sizeof name, key, is_list, i);
        kvs_cfg_list_get(L, li, is_list, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            rc = kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID, "expected a string, got a %s",
                              kvs_cfg_type_name(L, -1));
            lua_pop(L, 1);
            goto done;
        }
        char val[32];
        snprintf(val, sizeof val, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        int which = 0;
        if ((rc = kvs_cfg_check_choice(v, base_line, name, val, choices, &which))) goto done;
        for (int j = 0; j < *n; j++)
            if (idx[j] == which) {
                rc = kvs_cfg_ferr(v, base_line, name, KVS_ERR_INVALID, "'%s' given twice", val);
                goto done;
            }
        idx[(*n)++] = which;
    }
done:
    lua_pop(L, 1);
    return rc;
}
