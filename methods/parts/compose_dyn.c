/*
 * compose_dyn.c -- the kvs_method entry points of a composition made at run
 * time (a user's description, compose_json.c), and its parameter table.
 *
 * What it is: kvs_compose_table (the composition's parameters: `parts` then
 * each part's, kvs_parts.h), the `parts` code (the index of each part within
 * its kind, radix 32: scorer + 32 (allocator + 32 (keep1 + 32 (keep2 + 32
 * (pick + 32 (heads + 32 (keep3 + 32 (merge + 32 channels))))))), a keep,
 * heads or channels slot 0 when empty, else 1 + the part's index, merge the
 * kvs_merge value (0: none); a composition without heads, a third keep
 * rule, a merge or channels keeps its code), and
 * kvs_compose_dyn, the entry points every composed method shares.
 * Why a code: a kvs_method's create sees only the parameter values, not the
 * method; the code, an INT parameter whose range is the one value, carries
 * the composition there (and cannot be changed by --param: out of range).
 * create decodes it, rebuilds the same table into a shadow method (its name
 * "composed", which the plan carries) and runs kvs_compose_create on it;
 * observe / select / destroy forward to compose.c.
 * What it is not: no parsing (compose_json.c), no part code.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RADIX = 32 };

static const char code_help[] =
    "the composition's parts, encoded (fixed: the method's name says them)";

/* Append the declarations of one part, merging names already present. */
static kvs_status add_part(const kvs_part_info *pi, kvs_param_def *defs, const kvs_part_info **owner, int *n,
                           kvs_err *err) {
    for (int i = 0; i < pi->n_params; i++) {
        const kvs_param_def *d = &pi->params[i];
        int j = 0;
        while (j < *n && strcmp(defs[j].name, d->name) != 0) j++;
        if (j < *n) { /* the same meaning: first default, intersected range */
            if (defs[j].type != d->type)
                return kvs_errorf(err, KVS_ERR_INTERNAL, "parameter %s: %s and %s %s disagree on its type",
                                  d->name, owner[j]->name, kvs_part_kind_name(pi->kind), pi->name);
            if (d->min > defs[j].min) defs[j].min = d->min;
            if (d->max < defs[j].max) defs[j].max = d->max;
            if (defs[j].min > defs[j].max)
                return kvs_errorf(err, KVS_ERR_INVALID, "parameter %s: the ranges of %s and %s %s do not meet",
                                  d->name, owner[j]->name, kvs_part_kind_name(pi->kind), pi->name);
            if (defs[j].def < defs[j].min) defs[j].def = defs[j].min;
            if (defs[j].def > defs[j].max) defs[j].def = defs[j].max;
            continue;
        }
        if (*n >= KVS_MAX_PARAMS)
            return kvs_errorf(err, KVS_ERR_INVALID, "the composition reads more than %d parameters",
                              KVS_MAX_PARAMS - 1);
        defs[*n] = *d;
        owner[*n] = pi;
        (*n)++;
    }
    return KVS_OK;
}

static double comp_code(const kvs_composition *comp, kvs_err *err, int *ok) {
    int idx[9];
    idx[0] = kvs_part_index(KVS_PART_SCORER, comp->scorer);
    idx[1] = kvs_part_index(KVS_PART_ALLOCATOR, comp->allocator);
    for (int i = 0; i < 2; i++) {
        const kvs_keep_rule *r = i < KVS_PARTS_MAX_KEEP ? comp->keep[i] : NULL;
        idx[2 + i] = r ? 1 + kvs_part_index(KVS_PART_KEEP, r) : 0;
        if (r && idx[2 + i] == 0) idx[2 + i] = -1;
    }
    idx[4] = kvs_part_index(KVS_PART_PICK, comp->pick);
    idx[5] = comp->heads ? 1 + kvs_part_index(KVS_PART_HEADS, comp->heads) : 0;
    if (comp->heads && idx[5] == 0) idx[5] = -1;
    const kvs_keep_rule *r3 = KVS_PARTS_MAX_KEEP > 2 ? comp->keep[2] : NULL;
    idx[6] = r3 ? 1 + kvs_part_index(KVS_PART_KEEP, r3) : 0;
    if (r3 && idx[6] == 0) idx[6] = -1;
    idx[7] = (int)comp->merge; /* 0: none */
    idx[8] = comp->channels ? 1 + kvs_part_index(KVS_PART_CHANNELS, comp->channels) : 0;
    if (comp->channels && idx[8] == 0) idx[8] = -1;
    double code = 0.0;
    for (int i = 8; i >= 0; i--) {
        if (idx[i] < 0 || idx[i] >= RADIX) {
            *ok = 0;
            kvs_errorf(err, KVS_ERR_INTERNAL, "composition holds a part that is not in the part table");
            return 0.0;
        }
        code = code * RADIX + idx[i];
    }
    *ok = 1;
    return code;
}

kvs_status kvs_compose_table(const kvs_composition *comp, kvs_param_def defs[KVS_MAX_PARAMS],
                             const kvs_part_info *owner[KVS_MAX_PARAMS], int *n, kvs_err *err) {
    *n = 0;
    int ok = 0;
    const double code = comp_code(comp, err, &ok);
    if (!ok) return KVS_ERR_INTERNAL;
    defs[0] = (kvs_param_def){"parts", KVS_PARAM_INT, code, code, code, NULL, code_help};
    owner[0] = NULL;
    *n = 1;
    const kvs_part_info *pis[8] = {NULL};
    pis[0] = kvs_part_of_kind(KVS_PART_SCORER, kvs_part_index(KVS_PART_SCORER, comp->scorer));
    pis[1] = kvs_part_of_kind(KVS_PART_ALLOCATOR,
                              kvs_part_index(KVS_PART_ALLOCATOR, comp->allocator));
    /* parameter order: scorer, allocator, the keep rules in order, pick, heads, channels */
    const kvs_part_info *keeps[KVS_PARTS_MAX_KEEP] = {NULL};
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && comp->keep[i]; i++)
        keeps[i] = kvs_part_of_kind(KVS_PART_KEEP, kvs_part_index(KVS_PART_KEEP, comp->keep[i]));
    pis[2] = keeps[0];
    pis[3] = keeps[1];
    pis[4] = keeps[2];
    pis[5] = kvs_part_of_kind(KVS_PART_PICK, kvs_part_index(KVS_PART_PICK, comp->pick));
    if (comp->heads)
        pis[6] = kvs_part_of_kind(KVS_PART_HEADS, kvs_part_index(KVS_PART_HEADS, comp->heads));
    if (comp->channels)
        pis[7] = kvs_part_of_kind(KVS_PART_CHANNELS, kvs_part_index(KVS_PART_CHANNELS, comp->channels));
    for (int i = 0; i < 8; i++) {
        if (!pis[i]) continue;
        kvs_status rc = add_part(pis[i], defs, owner, n, err);
        if (rc) return rc;
    }
    return KVS_OK;
}

/* The composition of parameter values p (their `parts` code), or an error. */
static kvs_status decode(const kvs_params *p, kvs_composition *comp, kvs_err *err) {
    memset(comp, 0, sizeof *comp);
    if (p->n < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "composed method: no `parts` parameter");
    double x = p->v[0];
    if (!(x >= 0 && x < pow(RADIX, 9)) || x != floor(x))
        return kvs_errorf(err, KVS_ERR_INVALID, "composed method: parts = %g is not a code", x);
    long long c = (long long)x;
    int idx[9];
    for (int i = 0; i < 9; i++) idx[i] = (int)(c % RADIX), c /= RADIX;
    const kvs_part_info *s = kvs_part_of_kind(KVS_PART_SCORER, idx[0]);
    const kvs_part_info *a = kvs_part_of_kind(KVS_PART_ALLOCATOR, idx[1]);
    const kvs_part_info *k1 = idx[2] ? kvs_part_of_kind(KVS_PART_KEEP, idx[2] - 1) : NULL;
    const kvs_part_info *k2 = idx[3] ? kvs_part_of_kind(KVS_PART_KEEP, idx[3] - 1) : NULL;
    const kvs_part_info *pk = kvs_part_of_kind(KVS_PART_PICK, idx[4]);
    const kvs_part_info *hd = idx[5] ? kvs_part_of_kind(KVS_PART_HEADS, idx[5] - 1) : NULL;
    const kvs_part_info *k3 = idx[6] ? kvs_part_of_kind(KVS_PART_KEEP, idx[6] - 1) : NULL;
    const kvs_part_info *ch = idx[8] ? kvs_part_of_kind(KVS_PART_CHANNELS, idx[8] - 1) : NULL;
    if (!s || !a || !pk || (idx[2] && !k1) || (idx[3] && !k2) || (!k1 && k2) || (idx[5] && !hd) ||
        (idx[6] && !k3) || (!k2 && k3) || idx[7] > KVS_MERGE_WEIGHTED || (idx[8] && !ch))
        return kvs_errorf(err, KVS_ERR_INVALID, "composed method: parts = %g names no composition",
                          x);
    comp->scorer = s->part;
    comp->allocator = a->part;
    comp->keep[0] = k1 ? k1->part : NULL;
    if (KVS_PARTS_MAX_KEEP > 1) comp->keep[1] = k2 ? k2->part : NULL;
    if (KVS_PARTS_MAX_KEEP > 2) comp->keep[2] = k3 ? k3->part : NULL;
    comp->pick = pk->part;
    comp->heads = hd ? hd->part : NULL;
    comp->merge = (kvs_merge)idx[7];
    comp->channels = ch ? ch->part : NULL;
    return KVS_OK;
}

typedef struct {
    kvs_composition comp;
    kvs_method shadow; /* name "composed", the rebuilt table */
    kvs_param_def defs[KVS_MAX_PARAMS];
    void *inner; /* compose.c's state */
} dyn_state;

static kvs_status rebuild(const kvs_params *p, dyn_state *d, kvs_err *err) {
    kvs_status rc = decode(p, &d->comp, err);
    if (rc) return rc;
    const kvs_part_info *owner[KVS_MAX_PARAMS];
    int n = 0;
    if ((rc = kvs_compose_table(&d->comp, d->defs, owner, &n, err))) return rc;
    if (n != p->n)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "composed method: %d parameter values for a composition of %d", p->n, n);
    d->shadow = (kvs_method){.name = "composed",
                             .summary = "a composition",
                             .needs = d->comp.scorer->needs | d->comp.allocator->needs | d->comp.pick->needs |
                                      (d->comp.channels ? d->comp.channels->needs : 0u),
                             .params = d->defs,
                             .n_params = n};
    return KVS_OK;
}

static int dyn_queries(const kvs_params *p, int N) {
    dyn_state d;
    kvs_err e = {0};
    if (rebuild(p, &d, &e)) return N; /* create reports the error */
    return kvs_compose_queries_wanted(&d.comp, &d.shadow, p, N);
}

static void dyn_destroy(void *state) {
    dyn_state *d = state;
    if (!d) return;
    kvs_compose_destroy(d->inner);
    free(d);
}

static kvs_status dyn_create(const kvs_params *p, const kvs_shape *s, void **state, kvs_err *err) {
    *state = NULL;
    dyn_state *d = calloc(1, sizeof *d);
    if (!d) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    kvs_status rc = rebuild(p, d, err);
    if (!rc) {
        d->shadow.params = d->defs; /* d does not move from here on */
        rc = kvs_compose_create(&d->comp, &d->shadow, p, s, &d->inner, err);
    }
    if (rc) {
        free(d);
        return rc;
    }
    *state = d;
    return KVS_OK;
}

static kvs_status dyn_observe(void *state, int layer, const kvs_layer *in, const uint8_t *modality,
                              kvs_err *err) {
    return kvs_compose_observe(((dyn_state *)state)->inner, layer, in, modality, err);
}

static kvs_status dyn_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    return kvs_compose_select(((dyn_state *)state)->inner, per_layer, out, err);
}

const kvs_method kvs_compose_dyn = {
    .name = "composed",
    .summary = "entry points of a composed method",
    .queries_wanted = dyn_queries,
    .create = dyn_create,
    .observe = dyn_observe,
    .select = dyn_select,
    .destroy = dyn_destroy,
};
