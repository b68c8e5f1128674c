/*
 * gpu_driver.c -- what the GPU drivers of methods/gpu/ share: parameters
 * read from the method's own declaration, the device finiteness checks of
 * the inputs kvs_compress checks on the host, top-k segment descriptors and
 * the plan built from the selected indices.
 *
 * What it is: host-side bookkeeping over kernels' building blocks
 * (kvs_kernels.h). What it is not: no method decision (the drivers), no
 * kernels.
 */
#include "gpu_driver.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

kvs_status kvs_gpu_param(const kvs_gpu_ctx *g, const char *name, double *out, kvs_err *err) {
    const int i = kvs_param_index(g->m, name);
    if (i < 0 || i >= g->p->n)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "%s (gpu): the GPU driver reads parameter '%s', which the method does "
                          "not declare",
                          g->m->name, name);
    *out = g->p->v[i];
    return KVS_OK;
}

kvs_status kvs_gpu_check_inputs(kvs_gpu_ctx *g, int skip_kv, kvs_err *err) {
    return kvs_gpu_check_finite(g->ws, g->c, g->shape.n_layers, g->q_rows, skip_kv, err);
}

void kvs_gpu_set_desc(kvs_gpu_ctx *g, int l, int h, int B, long long score_off,
                      long long out_off, int head, int lo, int hi, int k, int tail_start,
                      int tail) {
    kvs_topk_desc *D = &g->desc[(size_t)l * g->shape.n_kv_heads + h];
    memset(D, 0, sizeof *D);
    D->score_off = score_off;
    D->out_off = out_off;
    D->head_cnt = head;
    D->lo = lo;
    D->hi = hi;
    D->k = k;
    D->tail_start = tail_start;
    D->tail_cnt = tail;
    D->layer = l;
    D->head = h;
    assert(head + k + tail == B && head >= 0 && k >= 0 && tail >= 0);
    assert(k == 0 || (head <= lo && lo < hi && hi <= tail_start && k <= hi - lo));
    (void)B;
}

kvs_status kvs_gpu_select_fill(kvs_gpu_ctx *g, const float *scores, const int *budgets,
                               kvs_merge merge, kvs_plan *out, kvs_err *err) {
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    long long total = 0;
    for (int l = 0; l < L; l++) total += (long long)H * budgets[l];
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1)); /* [total] */
    if (!idx) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", g->m->name);
    kvs_status st = kvs_gpu_topk_segments(g->ws, scores, g->desc, L * H, idx, total, err);
    if (!st) st = kvs_plan_init(out, g->m->name, L, H, N, budgets, err);
    if (!st) {
        out->merge = merge;
        long long off = 0;
        for (int l = 0; l < L; l++) {
            const size_t n = (size_t)H * (size_t)budgets[l];
            memcpy(out->layers[l].idx, idx + off, sizeof(int32_t) * n);
            off += (long long)n;
        }
    }
    free(idx);
    return st;
}
