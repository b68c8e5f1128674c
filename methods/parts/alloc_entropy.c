/*
 * alloc_entropy.c -- allocator `entropy`: MEDA's layer budgets from the
 * cross-modal attention entropy.
 *
 * Source: MEDA (methods.md "MEDA", paper eq. 4-7; the rule of the
 * monolithic methods/meda.c it replaces, bit for bit). Formula: with the head-averaged causal attention
 * of layer l, E_TV = mean row entropy of text queries restricted to image
 * keys (re-normalised), E_VT = image queries over text keys (rows with no
 * eligible key skipped, a term with no rows adds 0), E^l = E_TV + E_VT;
 * if some layer has no cross-modal row (one modality, or modality absent =
 * all text) every layer uses its plain mean row entropy instead and the
 * plan's note says so. Budgets proportional to softmax_l(E^l) (computed as
 * exp(E^l - max E) / sum), rounded by core's kvs_budget_allocate (largest
 * remainder, clamped to [B_min, N], water-filled to the exact L * B).
 * Statistics: the `h2o` scorer writes the entropies from the same fused
 * pass as its column sums (kvs_attn_stats_fused) when this allocator reads
 * them; with any other scorer, measure runs that pass itself (one
 * attention pass over all N queries, O(N) memory per head) unless the view
 * carries them (kvs_layer.attn_ent: kvs_layer_attn_stats reads them).
 * Parameters: none. Needs the queries of all N positions and reads the
 * modality mask.
 * Decisions (as the monolithic meda.c took them): "image" is what core calls visual (image
 * and video); audio takes part in neither term; B_min = min(max(1,
 * ceil(0.01 N)), B); a non-finite E^l is KVS_ERR_NUMERIC naming the layer.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_entropy_budgets(const double *E, int L, int N, int per_layer, int *budgets,
                               kvs_err *err) {
    if (!E || L < 1 || N < 1 || per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "entropy: bad input L=%d N=%d B=%d", L, N, per_layer);
    double *w = malloc(sizeof(double) * (size_t)L); /* [L] softmax weights */
    if (!w) return kvs_errorf(err, KVS_ERR_NOMEM, "entropy: out of memory");
    double emax = -INFINITY;
    for (int l = 0; l < L; l++) {
        if (!isfinite(E[l])) {
            free(w);
            return kvs_errorf(err, KVS_ERR_NUMERIC, "entropy: layer %d: entropy is not finite (%g)",
                              l, E[l]);
        }
        if (E[l] > emax) emax = E[l];
    }
    double wsum = 0.0;
    for (int l = 0; l < L; l++) wsum += (w[l] = exp(E[l] - emax));
    for (int l = 0; l < L; l++) w[l] /= wsum; /* the max term is 1, wsum >= 1 */
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    kvs_status rc = kvs_budget_allocate(w, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    free(w);
    return rc ? kvs_err_prefix(err, "entropy: layer budgets") : KVS_OK;
}

static int entropy_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m;
    (void)p;
    return N;
}

static kvs_status entropy_measure(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                                  kvs_layer_stats *out, kvs_err *err) {
    const int N = c->shape.n_tokens;
    if (!in->q.data || in->q.n_tokens != N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "needs the queries of all N=%d prompt positions (KVS_NEED_Q_ALL) but got "
                          "Nq=%d",
                          N, in->q.data ? in->q.n_tokens : 0);
    kvs_status rc = kvs_layer_attn_stats(in, c->modality, NULL, &out->ent, c->shape.threads, NULL, err);
    if (rc) return kvs_err_prefix(err, "layer %d", layer);
    out->have |= KVS_STAT_ENTROPY;
    return KVS_OK;
}

static kvs_status entropy_allocate(const kvs_part_ctx *c, int per_layer, int *budgets,
                                   kvs_err *err) {
    const int L = c->shape.n_layers;
    if (!c->stats)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "entropy: no layer statistics (not in a composition)");
    /* The modality mask is shared by all layers, so the cross-modal row
     * counts are the same in every layer; require all layers to have them. */
    int xmodal = 1;
    for (int l = 0; l < L; l++)
        if (c->stats[l].ent.n_tv + c->stats[l].ent.n_vt == 0) xmodal = 0;
    double *E = malloc(sizeof(double) * (size_t)L); /* [L] */
    if (!E) return kvs_errorf(err, KVS_ERR_NOMEM, "entropy: out of memory");
    for (int l = 0; l < L; l++) {
        const kvs_entropy_stats *e = &c->stats[l].ent;
        E[l] = xmodal ? (e->n_tv > 0 ? e->e_tv : 0.0) + (e->n_vt > 0 ? e->e_vt : 0.0) : e->plain;
    }
    kvs_status rc = kvs_entropy_budgets(E, L, c->shape.n_tokens, per_layer, budgets, err);
    free(E);
    if (rc || !c->note) return rc;
    if (xmodal)
        snprintf(c->note, 256,
                 "entropy: cross-modal entropy E_TV (%lld rows) + E_VT (%lld rows) set layer budgets",
                 (long long)c->stats[0].ent.n_tv, (long long)c->stats[0].ent.n_vt);
    else
        snprintf(c->note, 256,
                 "entropy: single modality (no cross-modal attention rows), plain mean row entropy "
                 "set layer budgets");
    return KVS_OK;
}

const kvs_allocator kvs_alloc_entropy = {
    .name = "entropy",
    .allocate = entropy_allocate,
    .stats = KVS_STAT_ENTROPY,
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .props = KVS_READS_ATTN_STATS,
    .queries_wanted = entropy_queries,
    .measure = entropy_measure,
};
