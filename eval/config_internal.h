/*
 * config_internal.h -- what the files of the config loader share (config.c,
 * config_sandbox.c, config_field.c, config_experiment.c, config_dataset.c,
 * config_methods.c, config_task.c, config_overhead.c): the validation context
 * and the field readers that report file:line and the field, and the parser
 * of each part of an experiment. Every reader and parser leaves the Lua stack
 * as it found it.
 * Internal to eval/; not part of the public API (kvs_eval.h is the manual).
 */
#ifndef KVS_EVAL_CONFIG_INTERNAL_H
#define KVS_EVAL_CONFIG_INTERNAL_H

#include "kvs_eval.h"

#include <lua.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the Lua state (config_sandbox.c) -------------------------------------- */

/* Registry key of the list experiment{} appends its tables to. */
#define KVS_CFG_REG_LIST "kvsieve.experiments"

/* What a config's run has used: instructions (in millions, capped at 200)
 * and bytes of Lua memory (capped at KVS_CFG_MEM_LIMIT: a description never
 * needs more, and a runaway one must fail with an error, not take the
 * machine's memory). */
#define KVS_CFG_MEM_LIMIT ((size_t)256 << 20)
typedef struct {
    long ticks;
    size_t bytes;
} kvs_cfg_meter;

/* A fresh sandboxed state whose code may read files below `dir` (resolved);
 * *meter counts what it uses and must outlive it (lua_close included). NULL
 * when out of memory. */
lua_State *kvs_cfg_sandbox_open(const char *dir, kvs_cfg_meter *meter);

/* ---- reading fields (config_field.c) ---------------------------------------- */

/* The validation context: the state, the config's path and text (for
 * file:line), the -D overrides (an error in a field they set names them). */
typedef struct {
    lua_State *L;
    const char *path, *text;
    const char *const *overrides;
    int n_overrides;
    kvs_err *err;
} vctx;

/* Error at a field of a table called at base_line. */
kvs_status kvs_cfg_ferr(const vctx *v, int base_line, const char *field, kvs_status code,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Every key of the table at idx must be in allowed[] (keys "__*" are ours). */
kvs_status kvs_cfg_check_keys(const vctx *v, int idx, int base_line, const char *prefix,
                              const char *const *allowed);

/* The line of the call that made the table at idx (its __line), else dflt. */
int kvs_cfg_table_line(lua_State *L, int idx, int dflt);

const char *kvs_cfg_type_name(lua_State *L, int idx);

/* Value at idx as a list: returns its length, or 1 when it is a scalar
 * (then element 1 is the value itself). Pushes nothing. */
int kvs_cfg_list_len(lua_State *L, int idx, int *is_list);

/* Push element i (1-based) of a list-or-scalar at idx. */
void kvs_cfg_list_get(lua_State *L, int idx, int is_list, int i);

/* The field name of element i: "field[i]" for a list, "field" for a scalar. */
void kvs_cfg_elem_name(char *out, size_t n, const char *field, int is_list, int i);

/* A list that is a table must be a proper sequence. */
kvs_status kvs_cfg_check_sequence(const vctx *v, int idx, int base_line, const char *field);

/* Integers: a number or a list of numbers, each in [lo, hi]. */
kvs_status kvs_cfg_get_ints(const vctx *v, int t, int base_line, const char *key, const char *field,
                            int64_t lo, int64_t hi, int required, int64_t dflt, int64_t **out,
                            int *n_out);

kvs_status kvs_cfg_get_int(const vctx *v, int t, int base_line, const char *key, const char *field,
                           int64_t lo, int64_t hi, int64_t dflt, int64_t *out);

kvs_status kvs_cfg_get_double(const vctx *v, int t, int base_line, const char *key, const char *field,
                              double lo, double hi, double dflt, double *out);

/* Optional string; "" when absent. */
kvs_status kvs_cfg_get_string(const vctx *v, int t, int base_line, const char *key, const char *field,
                              char *out, size_t n, int required);

/* Value must be one of choices (NULL-terminated). */
kvs_status kvs_cfg_check_choice(const vctx *v, int base_line, const char *field, const char *val,
                                const char *const *choices, int *index);

/* A path from the config: absolute (or empty) as given, else relative to the
 * config file's folder. */
kvs_status kvs_cfg_rel_path(const vctx *v, int line, const char *field, const char *in, char *out,
                            size_t n);

/* A choice or a list of distinct choices: idx[0..*n) indices into choices. */
kvs_status kvs_cfg_get_choice_list(const vctx *v, int t, int base_line, const char *key,
                                   const char *const *choices, int dflt, int *idx, int max, int *n);

/* ---- an experiment (config_experiment.c) ------------------------------------- */

kvs_status kvs_cfg_parse_experiment(const vctx *v, int t, kvs_experiment *e);
/* 1 when a and b are embedded-backend experiments whose KV cache types differ
 * (backend.cache): one name may then be defined once per cache type, the
 * rows of each type told apart by their cells' keys (config_task.c). */
int kvs_cfg_other_cache(const kvs_experiment *a, const kvs_experiment *b);

/* ---- the dataset helpers (config_dataset.c) ---------------------------------- */

kvs_status kvs_cfg_parse_synthetic(const vctx *v, int t, kvs_experiment *e);

/* ruler{ tasks, lengths, n, seed, data, setting } */
kvs_status kvs_cfg_parse_ruler(const vctx *v, int t, kvs_experiment *e);

kvs_status kvs_cfg_parse_niah(const vctx *v, int t, kvs_experiment *e);

/* jsonl{ path, limit } / longbench{...} / milebench{...}: a file dataset of
 * kind `task`; the path is relative to the config's folder. */
kvs_status kvs_cfg_parse_file_dataset(const vctx *v, int t, const char *helper, kvs_experiment *e);

/* ---- methods and parameter sweeps (config_methods.c) ------------------------- */

kvs_status kvs_cfg_parse_methods(const vctx *v, int t, kvs_experiment *e);

/* ---- kind task (config_task.c) ----------------------------------------------- */

kvs_status kvs_cfg_parse_backend(const vctx *v, int t, kvs_experiment *e);

/* mode (a value or a list), template, n_predict, ignore_eos, variants_per_request. */
kvs_status kvs_cfg_parse_task_fields(const vctx *v, int t, kvs_experiment *e);

kvs_status kvs_cfg_parse_metrics(const vctx *v, int t, kvs_experiment *e);

/* ---- kind overhead (config_overhead.c) --------------------------------------- */

/* threads = 2 or threads = { 1, 2 }: the overhead grid's thread axis. */
kvs_status kvs_cfg_parse_thread_counts(const vctx *v, int t, kvs_experiment *e);

/* repeats, warmup, device(s), dtype(s), max_tokens; seeds default to three
 * rotated input sets. */
kvs_status kvs_cfg_parse_overhead(const vctx *v, int t, kvs_experiment *e);

#endif
