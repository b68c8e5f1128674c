/*
 * alloc_uniform.c -- allocator `uniform`: every layer gets the per-layer budget.
 *
 * Formula: B_l = B = floor(rho * N) for every layer l (the global budget
 * L * B split evenly). What SnapKV, H2O and StreamingLLM do. No parameters.
 */
#include "kvs_parts.h"

static kvs_status uniform_allocate(const kvs_part_ctx *c, int per_layer, int *budgets,
                                   kvs_err *err) {
    (void)err;
    for (int l = 0; l < c->shape.n_layers; l++) budgets[l] = per_layer;
    return KVS_OK;
}

const kvs_allocator kvs_alloc_uniform = {.name = "uniform", .allocate = uniform_allocate};
