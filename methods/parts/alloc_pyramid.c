/*
 * alloc_pyramid.c -- allocator `pyramid`: PyramidKV's linear layer schedule.
 *
 * Paper: PyramidKV, arXiv 2406.02069 (official code: Zefan-Cai/PyramidKV,
 * pyramidkv_utils.py, PyramidKVCluster.update_kv; kvpress PyramidKVPress).
 * Formula: each layer keeps a window of w tokens plus a share of the rest.
 * With X = B - w the mean non-window budget, the top layer gets
 * min = X / beta, the bottom layer max = 2X - min, and the layers between
 * a straight line: b_l = max - l (max - min) / (L - 1), l = 0 (bottom) ..
 * L - 1 (top). If max would exceed N - w it is set to N - w and min to
 * 2X - max. The line's mean is X, so sum_l (w + b_l) = L * B exactly in
 * reals; core's kvs_budget_allocate (largest remainder, clamp to
 * [B_min, N], water-filling) turns it into integers with the exact global
 * sum. The schedule is non-increasing from bottom to top.
 * Parameters: beta (float >= 1, absent: 20, the paper's default), window
 * (the protected window w, shared with the keep rule and the SnapKV scorer;
 * absent: 0).
 * Decisions where sources disagree:
 *   - The official code floors min (integer //) and the step
 *     ((max - min) // (L - 1)), so its layers do not sum to L * B; we keep
 *     the real line and round once with the exact global sum.
 *   - kvpress applies the line to the whole budget B (window included) and
 *     falls back to uniform when min < w; we follow the official code (the
 *     line is on B - w, the window added to every layer).
 *   - B <= w, or L = 1: every layer gets B (nothing to shape).
 *   - B_min = min(max(1, ceil(0.01 N)), B) (the spec's B_min, never above B).
 */
#include "kvs_parts.h"

#include <stdlib.h>

kvs_status kvs_pyramid_budgets(int L, int N, int per_layer, int window, double beta, int *budgets,
                               kvs_err *err) {
    if (L < 1 || N < 1 || per_layer < 1 || per_layer > N || !(beta >= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "pyramid: bad input L=%d N=%d B=%d beta=%g (need B in [1, N], beta >= 1)",
                          L, N, per_layer, beta);
    const int w = window < 0 ? 0 : window;
    if (L == 1 || per_layer <= w) {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
        return KVS_OK;
    }
    const double X = (double)per_layer - w;
    double mn = X / beta, mx = 2.0 * X - mn;
    if (mx > (double)(N - w)) {
        mx = (double)(N - w);
        mn = 2.0 * X - mx;
    }
    double *wts = malloc(sizeof(double) * (size_t)L);
    if (!wts) return kvs_errorf(err, KVS_ERR_NOMEM, "pyramid: out of memory");
    const double step = (mx - mn) / (double)(L - 1);
    for (int l = 0; l < L; l++) wts[l] = (double)w + mx - (double)l * step;
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    kvs_status rc = kvs_budget_allocate(wts, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    free(wts);
    return rc ? kvs_err_prefix(err, "pyramid") : KVS_OK;
}

static kvs_status pyramid_allocate(const kvs_part_ctx *c, int per_layer, int *budgets,
                                   kvs_err *err) {
    const int w = (int)kvs_part_param(c->m, c->p, "window", 0);
    const double beta = kvs_part_param(c->m, c->p, "beta", 20.0);
    return kvs_pyramid_budgets(c->shape.n_layers, c->shape.n_tokens, per_layer,
                               w < c->shape.n_tokens ? w : c->shape.n_tokens, beta, budgets, err);
}

const kvs_allocator kvs_alloc_pyramid = {.name = "pyramid", .allocate = pyramid_allocate};
