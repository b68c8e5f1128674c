/*
 * alloc_dba.c -- allocator `dba`: FlashCache's Dynamic Budget Allocation.
 *
 * Source: FlashCache (the seed paper, methods.md "FlashCache" step 6;
 * methods/flashcache.c is the monolithic reference). Formula: by Parseval
 * the high-band energy share of layer l is R_K = ||X_K[m >= omega]||^2 /
 * ||K||^2 over all heads and channels (omega = max(1, round(gamma N)) DCT
 * coefficients), the same for V, R^l = R_K^l + R_V^l; the budgets are
 * proportional to R^l, rounded by core's kvs_budget_allocate (largest
 * remainder, clamped to [B_min, N], water-filled to the exact L * B).
 * Statistics: the `flashcache` scorer writes the energies while it scores
 * (no second transform); with any other scorer, measure runs the same fused
 * transform (kvs_dct_lowpass_sqres, route AUTO) per head of K and V, so the
 * energies are the same bits either way, summed as methods/flashcache.c
 * sums them (per head: high, low + high; then over heads in index order).
 * Parameters: gamma (float in (0, 1], absent 0.2), dba (bool, absent true:
 * false gives every layer B, FlashCache's `dba=false`).
 * Decisions (as methods/flashcache.c): a K or V block with zero energy adds
 * R = 0 (the note counts them); all-zero R gives equal shares; B_min =
 * min(max(1, ceil(0.01 N)), B).
 */
#include "kvs_parts.h"

#include "dct.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_dba_budgets(const kvs_layer_stats *st, int L, int N, int per_layer, int *budgets,
                           int *n_zero, kvs_err *err) {
    if (!st || L < 1 || N < 1 || per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "dba: bad input L=%d N=%d B=%d", L, N, per_layer);
    double *R = malloc(sizeof(double) * (size_t)L); /* [L] */
    if (!R) return kvs_errorf(err, KVS_ERR_NOMEM, "dba: out of memory");
    int zero = 0;
    for (int l = 0; l < L; l++) {
        R[l] = 0.0;
        for (int t = 0; t < 2; t++) {
            const double tot = st[l].e_tot[t], hi = st[l].e_high[t];
            if (tot > 0.0) R[l] += hi / tot;
            else zero++;
        }
    }
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    kvs_status rc = kvs_budget_allocate(R, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    free(R);
    if (n_zero) *n_zero = zero;
    return rc ? kvs_err_prefix(err, "dba") : KVS_OK;
}

static int dba_omega(const kvs_part_ctx *c) {
    const int N = c->shape.n_tokens;
    int omega = (int)lround(kvs_part_param(c->m, c->p, "gamma", 0.2) * (double)N);
    return omega < 1 ? 1 : omega > N ? N : omega;
}

static kvs_status dba_measure(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                              kvs_layer_stats *out, kvs_err *err) {
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, omega = dba_omega(c);
    if (kvs_part_param(c->m, c->p, "dba", 1) == 0) { /* budgets are uniform: nothing to read */
        out->have |= KVS_STAT_ENERGY;
        return KVS_OK;
    }
    kvs_dct_plan *plan = NULL;
    float *acc = malloc(sizeof(float) * (size_t)N); /* [N] */
    kvs_status rc = acc ? kvs_dct_plan_create_opts(N, c->shape.head_dim, omega, KVS_DCT_AUTO, &plan, err)
                        : kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    double eh[2] = {0, 0}, et[2] = {0, 0};
    for (int h = 0; h < H && !rc; h++)
        for (int t = 0; t < 2 && !rc; t++) {
            double lo = 0.0, hi = 0.0;
            rc = kvs_dct_lowpass_sqres(plan, t ? &in->v : &in->k, h, omega, &lo, acc, err);
            if (rc) {
                kvs_err_prefix(err, "layer %d head %d %s", layer, h, t ? "V" : "K");
                break;
            }
            for (int n = 0; n < N; n++) hi += acc[n];
            eh[t] += hi;
            et[t] += lo + hi;
        }
    kvs_dct_plan_destroy(plan);
    free(acc);
    if (rc) return rc;
    for (int t = 0; t < 2; t++) out->e_high[t] = eh[t], out->e_tot[t] = et[t];
    out->have |= KVS_STAT_ENERGY;
    return KVS_OK;
}

static kvs_status dba_allocate(const kvs_part_ctx *c, int per_layer, int *budgets, kvs_err *err) {
    const int L = c->shape.n_layers;
    if (kvs_part_param(c->m, c->p, "dba", 1) == 0) {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
        return KVS_OK;
    }
    if (!c->stats)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "dba: no layer statistics (not in a composition)");
    int zero = 0, first = -1;
    kvs_status rc = kvs_dba_budgets(c->stats, L, c->shape.n_tokens, per_layer, budgets, &zero, err);
    if (rc) return rc;
    for (int l = 0; l < L && first < 0; l++)
        if (!(c->stats[l].e_tot[0] > 0.0) || !(c->stats[l].e_tot[1] > 0.0)) first = l;
    if (zero && c->note)
        snprintf(c->note, 256, "dba: %d K/V block(s) with zero energy (first in layer %d) got R = 0",
                 zero, first);
    return KVS_OK;
}

const kvs_allocator kvs_alloc_dba = {
    .name = "dba",
    .allocate = dba_allocate,
    .stats = KVS_STAT_ENERGY,
    .needs = 0,
    .queries_wanted = NULL,
    .measure = dba_measure,
};
