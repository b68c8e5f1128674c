/*
 * full.c -- the `full` control: keeps every token of every layer and head.
 *
 * Spec (methods.md, "Controls"): `full` keeps everything; it is the reference
 * every table compares against. It has no parameters, needs nothing but the
 * shape, and computes no scores.
 *
 * Decision the spec left open: the requested budget is IGNORED. select()
 * returns a plan with budget N in every layer (plan total L * N), whatever
 * per_layer it is given; the plan note says so. It declares KVS_KEEPS_ALL, so
 * kvs_compress expects a plan total of L * N from it. Observe only checks the
 * layer's shape against create()'s.
 *
 * What it is not: no copy of K/V is kept; apply() does the (identity) gather.
 */
#include "kvsieve_methods.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvs_shape shape;
} full_state;

static kvs_status full_create(const kvs_params *p, const kvs_shape *s, void **state,
                              kvs_err *err) {
    full_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "full: out of memory");
    st->shape = *s;
    *state = st;
    return KVS_OK;
}

static kvs_status full_observe(void *state, int layer, const kvs_layer *in,
                               const uint8_t *modality, kvs_err *err) {
    full_state *st = state;
    if (layer < 0 || layer >= st->shape.n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "full: layer %d out of range [0, %d)", layer,
                          st->shape.n_layers);
    if (in->k.n_tokens != st->shape.n_tokens || in->k.n_heads != st->shape.n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "full: layer %d: K is [%d][%d] but the shape says [%d][%d]", layer,
                          in->k.n_heads, in->k.n_tokens, st->shape.n_kv_heads,
                          st->shape.n_tokens);
    return KVS_OK;
}

static kvs_status full_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    full_state *st = state;
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    kvs_status rc = KVS_OK;
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "full: out of memory");
    for (int l = 0; l < L; l++) budgets[l] = N;
    rc = kvs_plan_init(out, "full", L, H, N, budgets, err);
    if (rc) goto cleanup;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            int32_t *row = out->layers[l].idx + (int64_t)h * N; /* [N] */
            for (int n = 0; n < N; n++) row[n] = n;
        }
    snprintf(out->note, sizeof out->note,
             "full: keeps all %d tokens per layer (requested %d per layer ignored)", N, per_layer);
cleanup:
    free(budgets);
    return rc;
}

static void full_destroy(void *state) { free(state); }

const kvs_method kvs_method_full = {
    .name = "full",
    .summary = "control: keeps every token (the uncompressed reference)",
    .needs = KVS_KEEPS_ALL,
    .params = NULL,
    .n_params = 0,
    .queries_wanted = NULL,
    .create = full_create,
    .observe = full_observe,
    .select = full_select,
    .destroy = full_destroy,
};
