/* registry.c -- the list of methods, in table order, and the lookups: by
 * name, or (kvs_method_resolve, kvs_parts.h) a name or a composition. */
#include "kvsieve_methods.h"

#include <stdio.h>
#include <string.h>

#include "kvs_parts.h" /* the presets of methods/parts/ */

static const kvs_method *const registry[] = {
    &kvs_method_full,  &kvs_method_random, &kvs_method_streamingllm, &kvs_method_h2o,
    &kvs_method_snapkv, &kvs_method_lookm, &kvs_method_meda,        &kvs_method_flashcache,
    /* methods as parts (methods/parts/presets.c); the *_parts compositions of the
     * monolithic methods are for tests/parts' bit-identity proof, not listed */
    &kvs_preset_knorm, &kvs_preset_tova, &kvs_preset_keydiff, &kvs_preset_pyramidkv,
    &kvs_preset_chunkkv, &kvs_preset_expected_attention, &kvs_preset_pyramid_tova,
    &kvs_preset_adakv, &kvs_preset_ada_pyramidkv, &kvs_preset_ada_flashcache,
    &kvs_preset_lagkv, &kvs_preset_criticalkv, &kvs_preset_criticaladakv,
    &kvs_preset_cur, &kvs_preset_leverage,
    &kvs_preset_cake, &kvs_preset_simlayerkv, &kvs_preset_qfilters, &kvs_preset_compactor,
    &kvs_preset_finch, &kvs_preset_think, &kvs_preset_kvzip,
};

int kvs_method_reads_attn_stats(const kvs_method *m) {
    if (!m) return 0;
    if (m->needs & KVS_READS_ATTN_STATS) return 1;
    const kvs_composition *c = kvs_parts_composition(m);
    return c && ((c->scorer->props | c->allocator->props) & KVS_READS_ATTN_STATS) != 0;
}

int kvs_methods_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const kvs_method *kvs_method_at(int i) {
    return (i >= 0 && i < kvs_methods_count()) ? registry[i] : NULL;
}

const kvs_method *kvs_method_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < kvs_methods_count(); i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

kvs_status kvs_method_lookup(const char *name, const kvs_method **out, kvs_err *err) {
    *out = kvs_method_find(name);
    if (*out) return KVS_OK;
    const char *best = NULL;
    int bestd = 4;
    char known[512] = "";
    for (int i = 0; i < kvs_methods_count(); i++) {
        int d = kvs_edit_distance(name ? name : "", registry[i]->name);
        if (d < bestd) bestd = d, best = registry[i]->name;
        if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, registry[i]->name, sizeof known - strlen(known) - 1);
    }
    if (best)
        return kvs_errorf(err, KVS_ERR_NOTFOUND, "unknown method '%s' (did you mean '%s'?); known: %s",
                          name ? name : "", best, known);
    return kvs_errorf(err, KVS_ERR_NOTFOUND, "unknown method '%s'; known: %s", name ? name : "", known);
}

kvs_status kvs_method_resolve(const char *text, const kvs_method **m, kvs_composed **owned,
                              kvs_err *err) {
    *m = NULL;
    *owned = NULL;
    if (text && text[0] == '{') {
        kvs_status rc = kvs_composed_from_json(text, owned, err);
        if (rc) return kvs_err_prefix(err, "composed method");
        *m = kvs_composed_method(*owned);
        return KVS_OK;
    }
    return kvs_method_lookup(text, m, err);
}
