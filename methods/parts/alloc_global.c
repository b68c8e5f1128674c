/*
 * alloc_global.c -- allocator `global`: layer budgets from one ranking of
 * the scorer's scores over every layer and KV head (KVzip's default,
 * kvpress KVzipPress with layerwise = False; the paper's non-uniform
 * budgets).
 *
 * Rule: of the L * Hkv * N (layer, head, token) scores, the top
 * T = L * Hkv * B (B the mean layer budget) are found by one top-k (ties:
 * lower layer, head, token first); layer l's weight is the count n_l of
 * its entries among them, and the budgets are one rounding of L * B in
 * proportion to n_l (kvs_budget_allocate: largest remainder, each layer in
 * [B_min, N] with B_min = min(max(1, ceil(0.01 N)), B), water-filled). So
 * B_l is n_l / Hkv up to rounding and the floor: with a head allocator
 * (adakv, alpha 0) the layer's rows then go to its best (head, token)
 * pairs, which is the global threshold of KVzip to within a row per head.
 * Decisions: kvpress keeps exactly the pairs above the global threshold (a
 * layer may keep any count, even none); a plan here keeps Hkv * B_l rows per
 * layer (a multiple of Hkv, at least B_min per head on average, at least
 * one row per head), so the exact global sum L * B holds and every head
 * keeps a row to attend to.
 * Memory: L * Hkv * N floats and the top-k's scratch (12 bytes per score),
 * per select. Needs the scores of every layer: the composition gives the
 * allocator its [L][Hkv][N] scores (kvs_part_ctx.scores).
 */
#include "kvs_parts.h"

#include <stdlib.h>

static kvs_status global_allocate(const kvs_part_ctx *c, int per_layer, int *budgets,
                                  kvs_err *err) {
    const int L = c->shape.n_layers, H = c->shape.n_kv_heads, N = c->shape.n_tokens;
    if (!c->scores)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "global: the composition gave no scores");
    const int64_t n = (int64_t)L * H * N, T = (int64_t)L * H * per_layer;
    if (n > 2147483647)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "global: L x Hkv x N = %d x %d x %d scores exceed int32", L, H, N);
    int32_t *top = malloc(sizeof(int32_t) * (size_t)T);
    double *w = calloc((size_t)L, sizeof *w);
    if (!top || !w) {
        free(top);
        free(w);
        return kvs_errorf(err, KVS_ERR_NOMEM, "global: out of memory for %lld scores", (long long)n);
    }
    kvs_status rc = kvs_topk_indices(c->scores, (int)n, (int)T, top, err);
    if (!rc) {
        for (int64_t i = 0; i < T; i++) w[top[i] / ((int64_t)H * N)] += 1.0;
        int bmin = kvs_budget_min(N);
        if (bmin > per_layer) bmin = per_layer;
        rc = kvs_budget_allocate(w, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    }
    free(top);
    free(w);
    return rc ? kvs_err_prefix(err, "global") : KVS_OK;
}

const kvs_allocator kvs_alloc_global = {.name = "global", .allocate = global_allocate};
