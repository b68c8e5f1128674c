/*
 * index_gpu.c -- the GPU driver of the methods whose plans are index
 * arithmetic: full, random, streamingllm (methods/full.c, random.c,
 * streamingllm.c are the references and run here as they are).
 *
 * What it is: a device-side finiteness check of K and V (what kvs_compress
 * checks on the host), then the CPU method itself on the device views:
 * their observe reads shapes only, never data; random's streams are seeded
 * per (layer, head), so the plan is the CPU's bit for bit.
 * What it is not: no scores, no kernels.
 */
#include "gpu_driver.h"

kvs_status kvs_gpu_run_index(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    kvs_status st = kvs_gpu_check_inputs(g, 0, err);
    if (st) return st;
    void *state = NULL;
    st = g->m->create(g->p, &g->shape, &state, err);
    if (st) return st;
    for (int l = 0; l < g->shape.n_layers && !st; l++)
        st = g->m->observe(state, l, &g->c->layers[l], g->c->modality, err);
    if (!st) st = g->m->select(state, g->per_layer, out, err);
    g->m->destroy(state);
    if (st) return st;
    return kvs_gpu_sync(g->ws, err);
}
