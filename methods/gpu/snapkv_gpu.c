/*
 * snapkv_gpu.c -- the GPU driver of SnapKV (methods/snapkv.c is the CPU
 * reference: the same window, pooling and forced window rows).
 *
 * What it is: per layer, kernels' attention statistics of the last `window`
 * queries (log-sum-exp, then column sums: the window's votes, GQA-averaged)
 * pooled along the tokens before the window; then one top-k over every
 * (layer, head) segment with the window itself kept.
 * What it is not: no kernels, no CPU fallback.
 */
#include "gpu_driver.h"

#include <stdlib.h>

kvs_status kvs_gpu_run_snapkv(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const kvs_gpu_scratch sc = kvs_gpu_workspace_scratch(ws);
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    double pwin = 0.0, pker = 0.0, ppool = 0.0;
    kvs_status st = kvs_gpu_param(g, "window", &pwin, err);
    if (!st) st = kvs_gpu_param(g, "kernel", &pker, err);
    if (!st) st = kvs_gpu_param(g, "pool", &ppool, err);
    if (st) return st;
    const int window = (int)pwin, kernel = (int)pker, is_max = (int)ppool == 0;
    if (window < 1 || kernel < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "snapkv: window=%d and kernel=%d must be >= 1",
                          window, kernel);
    const int w = window < N ? window : N, P = N - w;
    for (int l = 0; l < L; l++) {
        const kvs_view *q = &g->c->layers[l].q;
        if (!q->data || q->n_tokens < w)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "snapkv: layer %d: needs the queries of the last %d prompt positions "
                              "(window=%d) but %d were recorded",
                              l, w, w, q->data ? q->n_tokens : 0);
    }
    st = kvs_gpu_check_inputs(g, 0, err);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &g->c->layers[l];
        kvs_view qw = ly->q; /* [Hq][w][d]: the last w recorded rows */
        qw.data = (const char *)ly->q.data +
                  (size_t)(ly->q.n_tokens - w) * (size_t)ly->q.s_tok * kvs_dtype_size(ly->q.dtype);
        qw.n_tokens = w;
        st = kvs_gpu_attn_lse_at(ws, &qw, &ly->k, sc.lse, l, err);
        if (!st) st = kvs_gpu_attn_colsum(ws, &qw, &ly->k, sc.lse, sc.sums, err);
        if (!st && P > 0)
            st = kvs_gpu_pool_rows(ws, sc.sums, H, N, P, kernel, is_max,
                                   sc.scores + (size_t)l * H * N, N, l, err);
        if (st) return kvs_err_prefix(err, "snapkv: window votes");
    }
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "snapkv: out of memory");
    const int B = g->per_layer;
    for (int l = 0; l < L; l++) {
        budgets[l] = B;
        for (int h = 0; h < H; h++) {
            const long long so = ((long long)l * H + h) * N, oo = ((long long)l * H + h) * B;
            if (B <= w)
                kvs_gpu_set_desc(g, l, h, B, so, oo, 0, 0, 0, 0, N - B, B);
            else
                kvs_gpu_set_desc(g, l, h, B, so, oo, 0, 0, P, B - w, P, w);
        }
    }
    st = kvs_gpu_select_fill(g, sc.scores, budgets, KVS_MERGE_NONE, out, err);
    free(budgets);
    return st;
}
