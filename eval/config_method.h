/*
 * config_method.h -- a composed method in a config's `methods` list (a Lua
 * table) and its one variant; private to eval/ (config.c's hook).
 */
#ifndef KVS_CONFIG_METHOD_H
#define KVS_CONFIG_METHOD_H

#include "kvs_eval.h"

#include <lua.h>

/* The table at stack index idx is converted to a JSON description and
 * composed (methods/parts kvs_composed_from_cjson); the method is owned by e
 * and *m points at it. Errors carry no location (the caller adds
 * file:line and the field). */
kvs_status kvs_config_method_table(lua_State *L, int idx, kvs_experiment *e, const kvs_method **m,
                                   kvs_err *err);
/* Append the one variant of composed method m (its described values; the
 * label is its name or short label, params_json every value). */
kvs_status kvs_config_composed_variant(kvs_experiment *e, const kvs_method *m, kvs_err *err);
/* Free the composed methods of e. */
void kvs_config_composed_free(kvs_experiment *e);

#endif
