/*
 * meda.c -- MEDA (entropy-guided layer budgets + text prior + merging), CPU
 * reference. Follows the spec (shared/spec/methods.md, "MEDA").
 *
 * Rules:
 *   - Layer entropy E^l from the head-averaged causal attention of layer l
 *     (core's kvs_attn_entropies): E_TV = mean row entropy of text queries
 *     restricted to image keys (re-normalised), E_VT = image queries
 *     restricted to text keys; rows with no eligible key are skipped;
 *     E^l = E_TV + E_VT. A term with no rows at all contributes 0. ("Image"
 *     here is what core calls visual: KVS_MOD_IMAGE and KVS_MOD_VIDEO; audio
 *     rows and keys take part in neither term.)
 *     Single modality (no cross-modal row in the prompt: modality absent,
 *     all text, all image, ...): E^l = the plain mean row entropy of the
 *     layer's head-averaged attention, and plan->note says so.
 *   - Layer budgets: alpha_l = softmax_l(E^l) * L * rho, B_l = alpha_l * N,
 *     i.e. total = L * per_layer split proportionally to softmax(E) (computed
 *     as exp(E^l - max E) / sum, numerically stable) by kvs_budget_allocate:
 *     largest remainder, clamped to [B_min, N], water-filled to the exact sum.
 *   - Within layer l (budget B_l), per KV head: LOOK-M's text prior on the
 *     H2O scores (column sums of the causal attention over all N queries,
 *     GQA mean; every text token += max_j s[j] of its head), keep the recent
 *     M = floor(B_l * recent_frac) tokens and the top B_l - M of [0, N - M)
 *     by boosted score (ties: lower index). B_l >= N keeps everything.
 *   - Merge (`merge`, default average) goes into plan->merge; core's
 *     kvs_apply merges every evicted token into its most key-similar kept
 *     token of the same KV head.
 *   - Budgets need every layer's entropy, so observe only stores, per layer,
 *     the [Hkv][N] boosted scores and the layer's entropy statistics; all
 *     selection happens in select.
 *
 * Decisions the spec left open (named parameters or stated here):
 *   - `recent_frac` (float, default 0.5 as the released code; the paper text
 *     says 3 : 1, i.e. 0.75; range [0, 1]).
 *   - `merge` (enum pivotal|average|weighted|none, default average).
 *   - B_min = kvs_budget_min(N) = max(1, ceil(0.01 N)) as the spec, but never
 *     above per_layer (otherwise L * B_min could exceed the global budget at
 *     tiny ratios); B_max = N.
 *   - Entropy pass: observe runs one fused pass (kvs_attn_stats_fused) that
 *     yields lse, column sums and the entropies of the head-averaged
 *     attention. Per-head row entropies could not replace the latter: they
 *     are the entropies of each query head's own distribution A_h, and their mean is not the entropy of the
 *     head-averaged Abar = mean_h A_h (H is concave, so H(Abar) >= mean_h
 *     H(A_h)); the cross-modal terms also need a re-normalisation over the
 *     other modality's keys, which row_entropy does not do.
 *   - Modality absent means all text (so the plain-entropy fallback); values
 *     outside KVS_MOD_* are KVS_ERR_INVALID. Missing queries or Nq != N are
 *     KVS_ERR_INVALID naming meda, the layer and Nq. Host memory only.
 *
 * What this file is not: the attention statistics and the budget
 * water-filling live in core/, merging in core's kvs_apply, the shared
 * state / scoring / selection helpers in textprior.c.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve_methods.h"
#include "textprior.h"

static const kvs_param_def meda_params[] = {
    {"recent_frac", KVS_PARAM_FLOAT, 0.5, 0.0, 1.0, NULL,
     "share of each layer's budget kept as the recent window (released code 0.5, paper 0.75)"},
    {"merge", KVS_PARAM_ENUM, 1, 0, 0, "pivotal|average|weighted|none",
     "how evicted tokens are merged into their most key-similar kept token at apply"},
};
enum { P_RECENT_FRAC = 0, P_MERGE = 1 };

static const kvs_merge meda_merge_of[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE,
                                           KVS_MERGE_WEIGHTED, KVS_MERGE_NONE};

typedef struct {
    kvs_tp_state tp;        /* first member (kvs_tp_create / kvs_tp_destroy); scores are boosted */
    kvs_merge merge;
    kvs_entropy_stats *ent; /* [L] */
    uint8_t *all_text;      /* [N] KVS_MOD_TEXT, used when modality is NULL */
} meda_state;

static void meda_destroy(void *state) {
    meda_state *s = state;
    if (!s) return;
    free(s->ent);
    free(s->all_text);
    kvs_tp_destroy(s);
}

static kvs_status meda_create(const kvs_params *p, const kvs_shape *shape, void **state,
                              kvs_err *err) {
    kvs_status st = kvs_tp_create(&kvs_method_meda, p, shape, P_RECENT_FRAC, sizeof(meda_state),
                                  state, err);
    if (st != KVS_OK) return st;
    meda_state *s = *state;
    s->merge = meda_merge_of[(int)p->v[P_MERGE]];
    s->ent = calloc((size_t)shape->n_layers, sizeof *s->ent);
    s->all_text = calloc((size_t)shape->n_tokens, 1); /* KVS_MOD_TEXT == 0 */
    if (!s->ent || !s->all_text) {
        meda_destroy(s);
        *state = NULL;
        return kvs_errorf(err, KVS_ERR_NOMEM,
                          "meda: out of memory for [L=%d][Hkv=%d][N=%d] scores", shape->n_layers,
                          shape->n_kv_heads, shape->n_tokens);
    }
    return KVS_OK;
}

static kvs_status meda_observe(void *state, int layer, const kvs_layer *in,
                               const uint8_t *modality, kvs_err *err) {
    meda_state *s = state;
    /* Scores and entropies from one fused pass over the logits. */
    return kvs_tp_observe(&s->tp, layer, in, modality, 0, 1, modality ? modality : s->all_text,
                          &s->ent[layer], err);
}

static kvs_status meda_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    meda_state *s = state;
    const int L = s->tp.shape.n_layers, Hkv = s->tp.shape.n_kv_heads, N = s->tp.shape.n_tokens;
    kvs_status st = kvs_tp_check_select(&s->tp, per_layer, err);
    if (st != KVS_OK) return st;
    double *w = malloc(sizeof(double) * (size_t)L); /* [L] E^l, then softmax weights */
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L] */
    if (!w || !budgets) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "meda: out of memory");
        goto cleanup;
    }
    /* The modality mask is shared by all layers, so the cross-modal row
     * counts are the same in every layer; require all layers to have them. */
    int xmodal = 1;
    for (int l = 0; l < L; l++)
        if (s->ent[l].n_tv + s->ent[l].n_vt == 0) xmodal = 0;
    double emax = -INFINITY;
    for (int l = 0; l < L; l++) {
        const kvs_entropy_stats *e = &s->ent[l];
        w[l] = xmodal ? (e->n_tv > 0 ? e->e_tv : 0.0) + (e->n_vt > 0 ? e->e_vt : 0.0) : e->plain;
        if (!isfinite(w[l])) {
            st = kvs_errorf(err, KVS_ERR_NUMERIC, "meda: layer %d: entropy is not finite (%g)", l,
                            w[l]);
            goto cleanup;
        }
        if (w[l] > emax) emax = w[l];
    }
    double wsum = 0.0;
    for (int l = 0; l < L; l++) wsum += (w[l] = exp(w[l] - emax));
    for (int l = 0; l < L; l++) w[l] /= wsum; /* softmax_l(E^l); the max term is 1, wsum >= 1 */
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    st = kvs_budget_allocate(w, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    if (st != KVS_OK) {
        kvs_err_prefix(err, "meda: layer budgets");
        goto cleanup;
    }
    st = kvs_tp_fill_plan("meda", s->tp.scores, L, Hkv, N, budgets, s->tp.recent_frac, s->merge,
                          out, err);
    if (st != KVS_OK) goto cleanup;
    if (xmodal)
        snprintf(out->note, sizeof out->note,
                 "meda: cross-modal entropy E_TV (%lld rows) + E_VT (%lld rows) set layer budgets",
                 (long long)s->ent[0].n_tv, (long long)s->ent[0].n_vt);
    else
        snprintf(out->note, sizeof out->note,
                 "meda: single modality (no cross-modal attention rows), plain mean row entropy "
                 "set layer budgets");
cleanup:
    free(w);
    free(budgets);
    return st;
}

const kvs_method kvs_method_meda = {
    .name = "meda",
    .summary = "MEDA: cross-modal entropy layer budgets, text-prior selection, average merging",
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .params = meda_params,
    .n_params = (int)(sizeof meda_params / sizeof meda_params[0]),
    .queries_wanted = kvs_tp_queries_all,
    .create = meda_create,
    .observe = meda_observe,
    .select = meda_select,
    .destroy = meda_destroy,
};
