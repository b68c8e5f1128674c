/*
 * kvsieve_methods.h -- the registry of compression methods.
 *
 * Each method is one file in methods/ that defines one `const kvs_method`
 * (see core/kvsieve.h for the contract) and follows ../shared spec
 * methods.md to the letter; decisions the spec left open are written in the
 * file's header comment and in docs/methods.md. Adding a method: one file,
 * one line in registry.c, its tests.
 */
#ifndef KVSIEVE_METHODS_H
#define KVSIEVE_METHODS_H

#include "kvsieve.h"
#include "kvs_gpu_methods.h" /* kvs_gpu_compress: the methods on device views (gpu/) */

#ifdef __cplusplus
extern "C" {
#endif

extern const kvs_method kvs_method_full;
extern const kvs_method kvs_method_random;
extern const kvs_method kvs_method_streamingllm;
extern const kvs_method kvs_method_h2o;
extern const kvs_method kvs_method_snapkv;
/* lookm and meda are presets of parts (methods/parts/presets.c). */
extern const kvs_method kvs_method_lookm;
extern const kvs_method kvs_method_meda;
extern const kvs_method kvs_method_flashcache;

/* Registry order is the order of tables and `kvsieve methods`. */
int kvs_methods_count(void);
const kvs_method *kvs_method_at(int i);
/* NULL if unknown. */
const kvs_method *kvs_method_find(const char *name);
/* Like find, but fills err with "unknown method 'x' (did you mean 'y'?
 * known: full, random, ...)" when unknown. */
kvs_status kvs_method_lookup(const char *name, const kvs_method **out, kvs_err *err);
/* A name, or a method composed from parts when text starts with '{' (a JSON
 * description, methods/parts/kvs_parts.h): the front ends' one entry point.
 * *owned is the composed method to free with kvs_composed_free (NULL for a
 * registered one). */
/* 1 when the method reads kvs_layer.attn_colsum / attn_ent where a view
 * carries them (KVS_READS_ATTN_STATS in its needs, or a preset whose scorer
 * or allocator has it in props): a producer that can accumulate them during
 * prefill (the engine's kvs_session_set_attn_stats) should. */
int kvs_method_reads_attn_stats(const kvs_method *m);
struct kvs_composed;
kvs_status kvs_method_resolve(const char *text, const kvs_method **m, struct kvs_composed **owned,
                              kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
