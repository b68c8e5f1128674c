/*
 * budget.c -- from a user budget (ratio or tokens) to exact per-layer budgets.
 *
 * What it is: validation of kvs_budget, the default per-layer minimum, and the
 * proportional allocation with clamping, water-filling and largest-remainder
 * rounding that every method re-allocating across layers must use.
 * What it is not: it does not decide the weights (each method does).
 */
#include "kvsieve.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

kvs_status kvs_budget_per_layer(const kvs_budget *b, int N, int *per_layer, kvs_err *err) {
    if (!b || !per_layer) return kvs_errorf(err, KVS_ERR_INVALID, "budget: NULL argument");
    if (N < 1) return kvs_errorf(err, KVS_ERR_INVALID, "budget: prompt length N = %d (need >= 1)", N);
    if (isnan(b->ratio)) return kvs_errorf(err, KVS_ERR_INVALID, "budget: ratio is NaN");
    const int has_ratio = b->ratio != 0.0, has_tokens = b->tokens != 0;
    if (has_ratio && has_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "budget: both ratio (%g) and tokens (%lld) are set; give exactly one",
                          b->ratio, (long long)b->tokens);
    if (!has_ratio && !has_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID, "budget: neither ratio nor tokens is set");
    int64_t B;
    if (has_ratio) {
        if (!(b->ratio > 0.0 && b->ratio <= 1.0))
            return kvs_errorf(err, KVS_ERR_INVALID, "budget: ratio %g is not in (0, 1]", b->ratio);
        /* floor(ratio * N), forgiving the representation error of decimal
         * ratios: 0.29 * 100 = 28.999999999999996 means 29. */
        double x = b->ratio * (double)N;
        double f = floor(x);
        if (x - f > 1.0 - 1e-9) f += 1.0;
        B = (int64_t)f;
    } else {
        if (b->tokens < 1)
            return kvs_errorf(err, KVS_ERR_INVALID, "budget: tokens = %lld (need >= 1)",
                              (long long)b->tokens);
        B = b->tokens;
    }
    if (B < 1) B = 1;
    if (B > N) B = N;
    *per_layer = (int)B;
    return KVS_OK;
}

int kvs_budget_min(int N) {
    if (N < 1) return 1;
    int m = (int)(((int64_t)N + 99) / 100); /* ceil(0.01 * N) in exact integers */
    return m < 1 ? 1 : m;
}

/* Layers ordered by descending remainder, ties to the lower layer index. */
typedef struct {
    double rem;
    int layer;
} rem_item;

static int cmp_rem_desc(const void *a, const void *b) {
    const rem_item *x = a, *y = b;
    if (x->rem > y->rem) return -1;
    if (x->rem < y->rem) return 1;
    return (x->layer > y->layer) - (x->layer < y->layer);
}

kvs_status kvs_budget_allocate(const double *weights, int L, int64_t total, int bmin, int bmax,
                               int *out, kvs_err *err) {
    kvs_status st = KVS_OK;
    signed char *state = NULL; /* [L] 0 free, -1 clamped at bmin, +1 clamped at bmax */
    double *x = NULL;          /* [L] real-valued share */
    rem_item *items = NULL;    /* [L] */

    if (!weights || !out) return kvs_errorf(err, KVS_ERR_INVALID, "budget allocation: NULL argument");
    if (L < 1) return kvs_errorf(err, KVS_ERR_INVALID, "budget allocation: L = %d layers (need >= 1)", L);
    if (bmin < 0 || bmax < bmin)
        return kvs_errorf(err, KVS_ERR_INVALID, "budget allocation: bounds [%d, %d] are empty or negative",
                          bmin, bmax);
    if (total < (int64_t)L * bmin || total > (int64_t)L * bmax)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "budget allocation: total %lld tokens cannot be split over %d layers "
                          "within [%d, %d] per layer (need %lld..%lld)",
                          (long long)total, L, bmin, bmax, (long long)L * bmin, (long long)L * bmax);
    double wsum = 0.0;
    for (int l = 0; l < L; l++) {
        if (!isfinite(weights[l]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "budget allocation: layer %d: weight is %s", l,
                              isnan(weights[l]) ? "NaN" : "Inf");
        if (weights[l] < 0.0)
            return kvs_errorf(err, KVS_ERR_INVALID, "budget allocation: layer %d: weight %g is negative",
                              l, weights[l]);
        wsum += weights[l];
    }
    if (!isfinite(wsum))
        return kvs_errorf(err, KVS_ERR_NUMERIC, "budget allocation: sum of weights overflows");
    const int equal = wsum == 0.0; /* all-zero weights: equal shares */

    state = calloc((size_t)L, sizeof *state);
    x = malloc((size_t)L * sizeof *x);
    items = malloc((size_t)L * sizeof *items);
    if (!state || !x || !items) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "budget allocation: out of memory for %d layers", L);
        goto cleanup;
    }

    /* Water-filling. The exact solution is x_l = clamp(lambda * w_l, bmin,
     * bmax) with sum x = total. Each round shares what the clamped layers
     * leave over the free layers in proportion to their weights; if the free
     * shares overshoot bmax by more than they undershoot bmin, the overshooting
     * layers are clamped for sure (lambda can only grow), else the
     * undershooting ones; at least one layer is fixed per round. */
    for (int round = 0; round <= L; round++) {
        int64_t t_free = total;
        double w_free = 0.0;
        int n_free = 0;
        for (int l = 0; l < L; l++) {
            if (state[l] < 0) t_free -= bmin;
            else if (state[l] > 0) t_free -= bmax;
            else {
                n_free++;
                w_free += equal ? 1.0 : weights[l];
            }
        }
        if (n_free == 0) break;
        const int eq_now = w_free == 0.0; /* only zero-weight layers left: equal shares */
        double over = 0.0, under = 0.0;
        for (int l = 0; l < L; l++) {
            if (state[l]) continue;
            double w = eq_now ? 1.0 : (equal ? 1.0 : weights[l]);
            double wf = eq_now ? (double)n_free : w_free;
            x[l] = (double)t_free * w / wf;
            if (x[l] > bmax) over += x[l] - bmax;
            if (x[l] < bmin) under += bmin - x[l];
        }
        if (over == 0.0 && under == 0.0) break;
        for (int l = 0; l < L; l++) {
            if (state[l]) continue;
            if (over >= under && x[l] > bmax) state[l] = 1;
            if (under >= over && x[l] < bmin) state[l] = -1;
        }
    }

    /* Largest-remainder rounding of the free shares. */
    int64_t sum = 0;
    int n_items = 0;
    for (int l = 0; l < L; l++) {
        if (state[l] < 0) out[l] = bmin;
        else if (state[l] > 0) out[l] = bmax;
        else {
            double f = floor(x[l]);
            if (f < bmin) f = bmin; /* guard against rounding noise */
            if (f > bmax) f = bmax;
            out[l] = (int)f;
            items[n_items].rem = x[l] - f;
            items[n_items].layer = l;
            n_items++;
        }
        sum += out[l];
    }
    qsort(items, (size_t)n_items, sizeof *items, cmp_rem_desc);
    int64_t extra = total - sum;
    /* extra is the sum of the remainders (< n_items) up to rounding noise */
    for (int i = 0; i < n_items && extra > 0; i++) {
        int l = items[i].layer;
        if (out[l] < bmax) {
            out[l]++;
            extra--;
        }
    }
    for (int i = n_items - 1; i >= 0 && extra < 0; i--) {
        int l = items[i].layer;
        if (out[l] > bmin) {
            out[l]--;
            extra++;
        }
    }
    /* Rounding noise only: fix up any residue in layer order. */
    for (int l = 0; l < L && extra > 0; l++) {
        int64_t room = bmax - out[l];
        int64_t give = room < extra ? room : extra;
        out[l] += (int)give;
        extra -= give;
    }
    for (int l = 0; l < L && extra < 0; l++) {
        int64_t room = out[l] - bmin;
        int64_t take = room < -extra ? room : -extra;
        out[l] -= (int)take;
        extra += take;
    }
    if (extra != 0) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL, "budget allocation: %lld tokens left unassigned",
                        (long long)extra);
        goto cleanup;
    }
#ifndef NDEBUG
    {
        int64_t check = 0;
        for (int l = 0; l < L; l++) {
            assert(out[l] >= bmin && out[l] <= bmax);
            check += out[l];
        }
        assert(check == total);
    }
#endif
cleanup:
    free(state);
    free(x);
    free(items);
    return st;
}
