/*
 * config.c -- loading a Lua experiment config: the file's text, its hash
 * (with the -D overrides), the sandboxed run (config_sandbox.c), the -D
 * overrides applied to each experiment{} table, and the check of each
 * table into kvs_experiment (config_experiment.c).
 *
 * What it is: kvs_config_load(_text) and kvs_config_free (kvs_eval.h). The Lua
 * side only collects tables; all checking happens afterwards in plain C,
 * so every error is a kvs_err naming file:line and the field.
 * What it is not: no grid expansion (grid.c), no running (runner.c).
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "config_internal.h"
#include "config_method.h"

#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
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

/* only: apply the overrides to the experiment{} tables of that name only (NULL: all). */
static kvs_status load_text(const char *path, const char *text, const char *only, const char *const *overrides,
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

    kvs_cfg_meter meter = {0, 0};
    L = kvs_cfg_sandbox_open(cfg->dir, &meter);
    if (!L) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "cannot create a Lua state");
        goto cleanup;
    }
    char chunkname[1100];
    snprintf(chunkname, sizeof chunkname, "@%s", path);
    int lst = luaL_loadbufferx(L, text, tl, chunkname, "t");
    if (lst == LUA_OK) lst = lua_pcall(L, 0, 0, 0);
    if (lst == LUA_ERRMEM) { /* no position: the failed allocation has none */
        rc = kvs_errorf(err, KVS_ERR_INVALID,
                        "%s: the config used more than %zu MiB of memory (a runaway table or "
                        "string.rep?)",
                        path, KVS_CFG_MEM_LIMIT >> 20);
        goto cleanup;
    }
    if (lst != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        rc = kvs_errorf(err, KVS_ERR_INVALID, "%s", m ? m : "error in config (no message)");
        goto cleanup;
    }
    lua_getfield(L, LUA_REGISTRYINDEX, KVS_CFG_REG_LIST);
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
        int mine = 1;
        if (only) {
            lua_getfield(L, t, "name");
            mine = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), only) == 0;
            lua_pop(L, 1);
        }
        for (int o = 0; o < n_overrides && mine && !rc; o++) rc = apply_override(&v, t, overrides[o]);
        cfg->n_experiments = i;
        if (!rc) rc = kvs_cfg_parse_experiment(&v, t, &cfg->experiments[i - 1]);
        lua_pop(L, 1);
        if (rc) goto cleanup;
        for (int j = 0; j < i - 1; j++)
            if (strcmp(cfg->experiments[j].name, cfg->experiments[i - 1].name) == 0 &&
                !kvs_cfg_other_cache(&cfg->experiments[j], &cfg->experiments[i - 1])) {
                rc = kvs_cfg_ferr(&v, cfg->experiments[i - 1].line, "name", KVS_ERR_INVALID,
                                  "experiment '%s' defined twice in this file", cfg->experiments[j].name);
                goto cleanup;
            }
    }
cleanup:
    if (L) lua_close(L);
    if (rc) kvs_config_free(cfg);
    return rc;
}

kvs_status kvs_config_load_text(const char *path, const char *text, const char *const *overrides,
                                int n_overrides, kvs_config *cfg, kvs_err *err) {
    return load_text(path, text, NULL, overrides, n_overrides, cfg, err);
}

kvs_status kvs_config_load_only(const char *path, const char *only, const char *const *overrides, int n_overrides,
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
    rc = load_text(path, text, only, overrides, n_overrides, cfg, err);
cleanup:
    free(text);
    fclose(f);
    return rc;
}

kvs_status kvs_config_load(const char *path, const char *const *overrides, int n_overrides,
                           kvs_config *cfg, kvs_err *err) {
    return kvs_config_load_only(path, NULL, overrides, n_overrides, cfg, err);
}
