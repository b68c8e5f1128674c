/*
 * alloc_adakv.c -- head allocator `adakv`: AdaKV's head-adaptive split of a
 * layer's budget over its KV heads (ragged per-head counts).
 *
 * Paper: Ada-KV, arXiv 2407.11550 (official code FFY0/AdaKV, commit
 * 0ae8e19, adaptive_snapkv/monkeypatch/snapkv_utils.py,
 * AdaptiveSnapKVCluster.update_kv; kvpress AdaKVPress).
 * Rule: a layer whose heads pick b tokens each on average (the layer budget
 * minus the protected window / sinks) has Hkv * b pick slots. Each head
 * first gets a safeguard floor f = max(1, floor(alpha * b)) of its own best
 * candidates; the other Hkv * (b - f) slots go to the best of all remaining
 * candidates of all heads together, one top-k over the flattened
 * [Hkv][hi - lo] scores (ties: lower head, then lower token). counts[h] = f
 * + the slots head h won; the sum is exactly Hkv * b. A head's count never
 * exceeds its hi - lo candidates.
 * Parameter: alpha (float in [0, 1]; absent: 0.2, kvpress's alpha_safeguard).
 * Decisions where sources disagree:
 *   - The official code takes the top Hkv * b of the flattened scores
 *     without a floor, then sets each head to round(n_h (1 - alpha) +
 *     floor(alpha * b)) (its sum can miss Hkv * b by rounding); kvpress
 *     forces each head's best n_safe = int(B (1 - ratio) alpha) first, then
 *     one flattened top-k for the rest. We follow kvpress's order (floor
 *     first, then one top-k), which keeps the layer total exact.
 *   - The official README's default floor_alpha is 0.5, kvpress's
 *     alpha_safeguard 0.2; we default to 0.2 (kvpress, reviewed by the
 *     paper's first author in CriticalAdaKVPress).
 *   - The floor is at least one token so every head keeps a row to attend to
 *     even with no protected window.
 * Memory: Hkv * (hi - lo) floats and the top-k scratch, per layer.
 * What it is not: no scoring (the scorer), no picking (the pick rule picks
 * counts[h] tokens of head h; with topk it is exactly the head's share of
 * the flattened top-k).
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

kvs_status kvs_adakv_split(const float *scores, int Hkv, int N, int lo, int hi, int k, double alpha,
                           int *counts, kvs_err *err) {
    if (!scores || !counts || Hkv < 1 || lo < 0 || hi > N || lo >= hi || k < 1 || k > hi - lo ||
        !(alpha >= 0.0 && alpha <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "adakv: bad input Hkv=%d N=%d candidates [%d, %d) k=%d alpha=%g", Hkv, N, lo,
                          hi, k, alpha);
    const int n = hi - lo;
    if ((int64_t)Hkv * n > 2147483647)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "adakv: Hkv x candidates = %d x %d exceeds int32", Hkv,
                          n);
    int f = (int)floor(alpha * (double)k);
    if (f < 1) f = 1;
    if (f > k) f = k;
    float *x = malloc(sizeof(float) * (size_t)Hkv * (size_t)n);   /* [Hkv][n] flattened */
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)Hkv * (size_t)k); /* [Hkv * k] */
    if (!x || !sel) {
        free(x);
        free(sel);
        return kvs_errorf(err, KVS_ERR_NOMEM, "adakv: out of memory for %d x %d scores", Hkv, n);
    }
    kvs_status rc = KVS_OK;
    for (int h = 0; h < Hkv && !rc; h++) {
        float *xh = x + (size_t)h * n;
        for (int j = 0; j < n; j++) xh[j] = scores[(size_t)h * N + lo + j];
        rc = kvs_topk_indices(xh, n, f, sel, err);
        /* the floor always wins the flattened top-k below */
        for (int i = 0; i < f && !rc; i++) xh[sel[i]] = INFINITY;
        counts[h] = 0;
    }
    if (!rc) rc = kvs_topk_indices(x, Hkv * n, Hkv * k, sel, err);
    if (!rc)
        for (int i = 0; i < Hkv * k; i++) counts[sel[i] / n]++;
    free(x);
    free(sel);
    return rc ? kvs_err_prefix(err, "adakv") : KVS_OK;
}

static kvs_status adakv_split(const kvs_part_ctx *c, int layer, const float *scores, int lo, int hi,
                              int k, int *counts, kvs_err *err) {
    const double alpha = kvs_part_param(c->m, c->p, "alpha", 0.2);
    kvs_status rc = kvs_adakv_split(scores, c->shape.n_kv_heads, c->shape.n_tokens, lo, hi, k, alpha,
                                    counts, err);
    return rc ? kvs_err_prefix(err, "layer %d", layer) : KVS_OK;
}

const kvs_head_allocator kvs_heads_adakv = {.name = "adakv", .split = adakv_split};
