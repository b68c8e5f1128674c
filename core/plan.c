/*
 * plan.c -- kvs_plan: allocation, invariant checks, totals, outlier retention.
 *
 * What it is: the owner of plan memory and the single checker of its
 * invariants (per layer a budget in [1, N]; per KV head `budget` indices,
 * strictly ascending, in [0, N)). Methods fill plans; everyone else checks.
 * What it is not: no selection (methods), no compaction (apply.c).
 */
#include "kvsieve.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kvs_merge_name(kvs_merge m) {
    switch (m) {
    case KVS_MERGE_NONE: return "none";
    case KVS_MERGE_PIVOTAL: return "pivotal";
    case KVS_MERGE_AVERAGE: return "average";
    case KVS_MERGE_WEIGHTED: return "weighted";
    }
    return "unknown";
}

kvs_status kvs_plan_init(kvs_plan *p, const char *method, int L, int Hkv, int N, const int *budgets,
                         kvs_err *err) {
    if (!p) return kvs_errorf(err, KVS_ERR_INVALID, "plan: NULL plan");
    memset(p, 0, sizeof *p);
    if (!budgets) return kvs_errorf(err, KVS_ERR_INVALID, "plan: NULL budgets");
    if (L < 1 || Hkv < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: shape L = %d, Hkv = %d, N = %d (all need >= 1)", L,
                          Hkv, N);
    for (int l = 0; l < L; l++)
        if (budgets[l] < 1 || budgets[l] > N)
            return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d: budget %d is not in [1, N = %d]", l,
                              budgets[l], N);
    snprintf(p->method, sizeof p->method, "%s", method ? method : "");
    p->n_layers = L;
    p->n_kv_heads = Hkv;
    p->n_tokens = N;
    p->merge = KVS_MERGE_NONE;
    p->layers = calloc((size_t)L, sizeof *p->layers);
    if (!p->layers) goto nomem;
    for (int l = 0; l < L; l++) {
        p->layers[l].budget = budgets[l];
        p->layers[l].idx = malloc((size_t)Hkv * (size_t)budgets[l] * sizeof(int32_t)); /* [Hkv][B_l] */
        if (!p->layers[l].idx) goto nomem;
    }
    return KVS_OK;
nomem:
    kvs_plan_free(p);
    return kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory for %d layers x %d heads", L, Hkv);
}

void kvs_plan_free(kvs_plan *p) {
    if (!p) return;
    if (p->layers)
        for (int l = 0; l < p->n_layers; l++) free(p->layers[l].idx);
    free(p->layers);
    memset(p, 0, sizeof *p);
}

kvs_status kvs_plan_check(const kvs_plan *p, kvs_err *err) {
    if (!p) return kvs_errorf(err, KVS_ERR_INVALID, "plan: NULL plan");
    if (p->n_layers < 1 || p->n_kv_heads < 1 || p->n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: shape L = %d, Hkv = %d, N = %d (all need >= 1)",
                          p->n_layers, p->n_kv_heads, p->n_tokens);
    if (!p->layers) return kvs_errorf(err, KVS_ERR_INVALID, "plan: no layer array");
    if (memchr(p->method, '\0', sizeof p->method) == NULL)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: method name is not terminated");
    if (memchr(p->note, '\0', sizeof p->note) == NULL)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: note is not terminated");
    if ((unsigned)p->merge > (unsigned)KVS_MERGE_WEIGHTED)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: unknown merge mode %d", (int)p->merge);
    const int N = p->n_tokens;
    for (int l = 0; l < p->n_layers; l++) {
        const kvs_plan_layer *pl = &p->layers[l];
        const int B = pl->budget;
        if (B < 1 || B > N)
            return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d: budget %d is not in [1, N = %d]", l, B,
                              N);
        if (!pl->idx) return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d: no index array", l);
        for (int h = 0; h < p->n_kv_heads; h++) {
            const int32_t *row = pl->idx + (size_t)h * (size_t)B; /* [B] */
            for (int i = 0; i < B; i++) {
                if (row[i] < 0 || row[i] >= N)
                    return kvs_errorf(err, KVS_ERR_INVALID,
                                      "plan: layer %d head %d: index %d at slot %d is out of range [0, %d)",
                                      l, h, (int)row[i], i, N);
                if (i > 0 && row[i] <= row[i - 1])
                    return kvs_errorf(err, KVS_ERR_INVALID,
                                      "plan: layer %d head %d: index %d at slot %d follows %d (indices "
                                      "must be sorted ascending and unique)",
                                      l, h, (int)row[i], i, (int)row[i - 1]);
            }
        }
    }
    return KVS_OK;
}

int64_t kvs_plan_total(const kvs_plan *p) {
    int64_t t = 0;
    if (!p || !p->layers) return 0;
    for (int l = 0; l < p->n_layers; l++) t += p->layers[l].budget;
    return t;
}

/* Binary search in a sorted ascending row. */
static int contains(const int32_t *row, int B, int32_t x) {
    int lo = 0, hi = B;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (row[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo < B && row[lo] == x;
}

double kvs_plan_retention(const kvs_plan *p, const int32_t *outliers, int M) {
    /* No outliers or no plan: the fraction is undefined. */
    if (!p || !p->layers || !outliers || M <= 0) return NAN;
    int64_t kept = 0, all = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const kvs_plan_layer *pl = &p->layers[l];
        for (int h = 0; h < p->n_kv_heads; h++) {
            const int32_t *row = pl->idx + (size_t)h * (size_t)pl->budget; /* [B] sorted */
            for (int i = 0; i < M; i++) {
                all++;
                kept += contains(row, pl->budget, outliers[i]); /* out-of-range ids are never kept */
            }
        }
    }
    return (double)kept / (double)all;
}
