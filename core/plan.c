/*
 * plan.c -- kvs_plan: allocation, invariant checks, totals, outlier retention.
 *
 * What it is: the owner of plan memory and the single checker of its
 * invariants (per layer a budget in [1, N]; per KV head `budget` indices, or
 * counts[h] in [1, N] summing to Hkv * budget for a ragged layer, strictly
 * ascending, in [0, N); key channel masks of 0 / 1 with a kept channel per
 * head). Methods fill plans; everyone else checks.
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

kvs_status kvs_plan_init_ragged(kvs_plan *p, const char *method, int L, int Hkv, int N,
                                const int *counts, kvs_err *err) {
    if (!p) return kvs_errorf(err, KVS_ERR_INVALID, "plan: NULL plan");
    memset(p, 0, sizeof *p);
    if (!counts) return kvs_errorf(err, KVS_ERR_INVALID, "plan: NULL counts");
    if (L < 1 || Hkv < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: shape L = %d, Hkv = %d, N = %d (all need >= 1)", L,
                          Hkv, N);
    int *budgets = malloc(sizeof(int) * (size_t)L); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory");
    for (int l = 0; l < L; l++) {
        int64_t sum = 0;
        for (int h = 0; h < Hkv; h++) {
            const int c = counts[(size_t)l * Hkv + h];
            if (c < 1 || c > N) {
                free(budgets);
                return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d head %d: count %d is not in [1, N = %d]",
                                  l, h, c, N);
            }
            sum += c;
        }
        if (sum % Hkv) {
            free(budgets);
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "plan: layer %d: counts sum to %lld, not a multiple of Hkv = %d", l, (long long)sum,
                              Hkv);
        }
        budgets[l] = (int)(sum / Hkv);
    }
    kvs_status st = kvs_plan_init(p, method, L, Hkv, N, budgets, err);
    free(budgets);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        const int *c = counts + (size_t)l * Hkv;
        int equal = 1;
        for (int h = 1; h < Hkv; h++) equal &= c[h] == c[0];
        if (equal) continue; /* stored dense */
        p->layers[l].counts = malloc(sizeof(int32_t) * (size_t)Hkv); /* [Hkv] */
        if (!p->layers[l].counts) {
            kvs_plan_free(p);
            return kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory for the counts of layer %d", l);
        }
        for (int h = 0; h < Hkv; h++) p->layers[l].counts[h] = c[h];
    }
    return KVS_OK;
}

int32_t *kvs_plan_head(const kvs_plan *p, int l, int h, int *count) {
    const kvs_plan_layer *pl = &p->layers[l];
    assert(h >= 0 && h < p->n_kv_heads);
    if (!pl->counts) {
        if (count) *count = pl->budget;
        return pl->idx + (size_t)h * (size_t)pl->budget;
    }
    size_t off = 0;
    for (int g = 0; g < h; g++) off += (size_t)pl->counts[g];
    if (count) *count = pl->counts[h];
    return pl->idx + off;
}

int kvs_plan_is_ragged(const kvs_plan *p) {
    if (!p || !p->layers) return 0;
    for (int l = 0; l < p->n_layers; l++)
        if (p->layers[l].counts) return 1;
    return 0;
}

int64_t kvs_plan_kv_bytes(const kvs_plan *p, int head_dim, size_t elem_size) {
    /* sum_h counts[h] = Hkv * budget in every layer, ragged or not */
    if (!p->kchan) return kvs_plan_total(p) * (int64_t)p->n_kv_heads * head_dim * (int64_t)elem_size * 2;
    int64_t b = 0;
    for (int l = 0; l < p->n_layers; l++)
        for (int h = 0; h < p->n_kv_heads; h++) {
            int rows;
            kvs_plan_head(p, l, h, &rows);
            b += (int64_t)rows * (kvs_plan_kchan_kept(p, l, h, head_dim) + head_dim);
        }
    return b * (int64_t)elem_size;
}

kvs_status kvs_plan_kchan_init(kvs_plan *p, int d, kvs_err *err) {
    if (d < 1) return kvs_errorf(err, KVS_ERR_INVALID, "plan: key channel masks of %d channels", d);
    free(p->kchan);
    p->kchan = malloc((size_t)p->n_layers * (size_t)p->n_kv_heads * (size_t)d); /* [L][Hkv][d] */
    p->kchan_dim = p->kchan ? d : 0;
    if (!p->kchan) return kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory for key channel masks");
    memset(p->kchan, 1, (size_t)p->n_layers * (size_t)p->n_kv_heads * (size_t)d);
    return KVS_OK;
}

int kvs_plan_kchan_kept(const kvs_plan *p, int l, int h, int d) {
    if (!p->kchan) return d;
    const uint8_t *m = p->kchan + ((size_t)l * p->n_kv_heads + h) * (size_t)p->kchan_dim; /* [d] */
    int n = 0;
    for (int c = 0; c < p->kchan_dim; c++) n += m[c] != 0;
    return n;
}

void kvs_plan_free(kvs_plan *p) {
    if (!p) return;
    if (p->layers)
        for (int l = 0; l < p->n_layers; l++) {
            free(p->layers[l].idx);
            free(p->layers[l].counts);
        }
    free(p->layers);
    free(p->kchan);
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
    if (p->kchan) {
        if (p->kchan_dim < 1)
            return kvs_errorf(err, KVS_ERR_INVALID, "plan: key channel masks of %d channels", p->kchan_dim);
        for (int l = 0; l < p->n_layers; l++)
            for (int h = 0; h < p->n_kv_heads; h++) {
                const uint8_t *m = p->kchan + ((size_t)l * p->n_kv_heads + h) * (size_t)p->kchan_dim;
                int kept = 0;
                for (int c = 0; c < p->kchan_dim; c++) {
                    if (m[c] > 1)
                        return kvs_errorf(err, KVS_ERR_INVALID,
                                          "plan: layer %d head %d: key channel %d mask is %d (0 or 1)", l,
                                          h, c, (int)m[c]);
                    kept += m[c];
                }
                if (!kept)
                    return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d head %d: every key channel is pruned",
                                      l, h);
            }
    } else if (p->kchan_dim)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan: kchan_dim %d without masks", p->kchan_dim);
    const int N = p->n_tokens;
    for (int l = 0; l < p->n_layers; l++) {
        const kvs_plan_layer *pl = &p->layers[l];
        const int B = pl->budget;
        if (B < 1 || B > N)
            return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d: budget %d is not in [1, N = %d]", l, B,
                              N);
        if (!pl->idx) return kvs_errorf(err, KVS_ERR_INVALID, "plan: layer %d: no index array", l);
        if (pl->counts) {
            int64_t sum = 0;
            for (int h = 0; h < p->n_kv_heads; h++) {
                if (pl->counts[h] < 1 || pl->counts[h] > N)
                    return kvs_errorf(err, KVS_ERR_INVALID,
                                      "plan: layer %d head %d: count %d is not in [1, N = %d]", l, h,
                                      (int)pl->counts[h], N);
                sum += pl->counts[h];
            }
            if (sum != (int64_t)p->n_kv_heads * B)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "plan: layer %d: head counts sum to %lld, not Hkv x budget = %d x %d", l,
                                  (long long)sum, p->n_kv_heads, B);
        }
        for (int h = 0; h < p->n_kv_heads; h++) {
            int Bh;
            const int32_t *row = kvs_plan_head(p, l, h, &Bh); /* [Bh] */
            for (int i = 0; i < Bh; i++) {
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
        for (int h = 0; h < p->n_kv_heads; h++) {
            int Bh;
            const int32_t *row = kvs_plan_head(p, l, h, &Bh); /* [Bh] sorted */
            for (int i = 0; i < M; i++) {
                all++;
                kept += contains(row, Bh, outliers[i]); /* out-of-range ids are never kept */
            }
        }
    }
    return (double)kept / (double)all;
}
