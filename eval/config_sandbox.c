/*
 * config_sandbox.c -- the Lua state a config runs in: a sandboxed Lua 5.4
 * state per file and the helpers a config may call (experiment{...},
 * synthetic{...}, niah{...}, ruler{...}, jsonl{...}, longbench{...},
 * milebench{...}, shape{...}, backend{...}), which only tag and collect
 * tables: experiment{} appends to a list in the registry (KVS_CFG_REG_LIST);
 * presets() returns the names of the registered methods in registry order
 * (what `kvsieve methods` lists), so a config can run every preset without
 * naming them; method_needs(name) lists what a method reads beyond K and V
 * ("q_window", "q_all", "modality", "w_o", "recon"), so a config can size a grid by
 * a method's cost class without naming methods either.
 *
 * Sandbox: base library without dofile/loadfile (load is text-only),
 * string, table, math, utf8, coroutine; os has only clock/date/time/
 * difftime; io has only open, read-only, for files below the config's folder.
 * No package library, so no require and no C modules. A config that runs
 * for more than about 2e8 VM instructions is stopped.
 * What it is not: no checking of what the tables hold (config_*.c), no
 * loading of the file (config.c).
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "config_internal.h"
#include "kvsieve_methods.h"

#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    lua_getfield(L, LUA_REGISTRYINDEX, KVS_CFG_REG_LIST);
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

/* presets(): { "full", "random", ... } in registry order. */
static int l_presets(lua_State *L) {
    int n = kvs_methods_count();
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, kvs_method_at(i)->name);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* method_needs("h2o"): { "q_all", "modality" }; an unknown name is an error
 * that suggests a close one. */
static int l_method_needs(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    kvs_err err = {0};
    const kvs_method *m = NULL;
    if (kvs_method_lookup(name, &m, &err) != KVS_OK) return luaL_error(L, "method_needs: %s", err.msg);
    static const struct {
        unsigned bit;
        const char *name;
    } bits[] = {{KVS_NEED_Q_WINDOW, "q_window"},
                {KVS_NEED_Q_ALL, "q_all"},
                {KVS_NEED_MODALITY, "modality"},
                {KVS_NEED_W_O, "w_o"},
                {KVS_NEED_RECON, "recon"}};
    lua_newtable(L);
    int n = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if (m->needs & bits[i].bit) {
            lua_pushstring(L, bits[i].name);
            lua_rawseti(L, -2, ++n);
        }
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
    lua_setfield(L, LUA_REGISTRYINDEX, KVS_CFG_REG_LIST);
    lua_pushcfunction(L, l_experiment);
    lua_setglobal(L, "experiment");
    lua_pushcfunction(L, l_presets);
    lua_setglobal(L, "presets");
    lua_pushcfunction(L, l_method_needs);
    lua_setglobal(L, "method_needs");
    static const char *const helpers[] = {"synthetic", "niah",      "shape",     "backend",
                                           "jsonl",     "longbench", "milebench", "ruler"};
    for (size_t i = 0; i < sizeof helpers / sizeof helpers[0]; i++) {
        lua_pushstring(L, helpers[i]);
        lua_pushcclosure(L, l_helper, 1);
        lua_setglobal(L, helpers[i]);
    }
}

/* Lua's allocator with a ceiling: past KVS_CFG_MEM_LIMIT an allocation
 * fails, and Lua raises a memory error (LUA_ERRMEM) the loader reports. */
static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    kvs_cfg_meter *m = ud;
    const size_t old = ptr ? osize : 0; /* without ptr, osize is a type tag */
    if (nsize == 0) {
        m->bytes -= old;
        free(ptr);
        return NULL;
    }
    if (nsize > old && m->bytes - old + nsize > KVS_CFG_MEM_LIMIT) return NULL;
    void *p = realloc(ptr, nsize);
    if (p) m->bytes = m->bytes - old + nsize;
    return p;
}

lua_State *kvs_cfg_sandbox_open(const char *dir, kvs_cfg_meter *meter) {
    lua_State *L = lua_newstate(l_alloc, meter);
    if (!L) return NULL;
    *(long **)lua_getextraspace(L) = &meter->ticks;
    lua_sethook(L, l_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    open_sandbox(L, dir);
    return L;
}
