/*
 * textprior.h -- private helpers shared by the attention-score methods h2o,
 * lookm and meda (methods/h2o.c; lookm and meda are presets of methods/parts/ now, and
 * tests/parts builds their reference from these helpers). Not a public header: only
 * files in methods/ include it.
 *
 * What it is: the H2O score (column sums of the causal attention over all
 * prefill queries, per query head, GQA mean, computed by core's two-pass
 * O(N)-memory kvs_attn_lse + kvs_attn_colsum), the LOOK-M text prior
 * (every text token's score += max_j s[j], per KV head), and the per-head
 * "recent window + top-k of the rest" selection they all share.
 * What it is not: no attention arithmetic of its own (core/ does it), no
 * budget allocation across layers (parts/alloc_entropy.c does that with
 * kvs_budget_allocate), no merging (core's kvs_apply does it).
 */
#ifndef KVS_TEXTPRIOR_H
#define KVS_TEXTPRIOR_H

#include <stddef.h>

#include "kvsieve.h"

/* Checks that p holds m->n_params values, each in its declared range (INT /
 * FLOAT: [min, max], not NaN; BOOL: 0 or 1; ENUM: an index into choices).
 * Guards create against a hand-filled kvs_params. */
kvs_status kvs_tp_check_params(const kvs_method *m, const kvs_params *p, kvs_err *err);

/* Guard used by create (shape) and observe (layer): the method needs the
 * queries of ALL N prompt positions. Fails with KVS_ERR_INVALID and a message
 * naming the method, the layer (layer < 0: at create) and Nq. */
kvs_status kvs_tp_require_all_queries(const char *method, int layer, int n_tokens, int n_q_heads,
                                      int n_queries, int has_q, kvs_err *err);

/* Checks one layer before scoring: host memory, shape equal to the one given
 * at create (N, Hkv, Hq, d) and all N queries present. Messages name the
 * method and layer. */
kvs_status kvs_tp_check_layer(const char *method, int layer, const kvs_layer *in,
                              const kvs_shape *shape, kvs_err *err);

/* Modality values must be KVS_MOD_* (0..3); NULL is allowed (all text). */
kvs_status kvs_tp_check_modality(const char *method, int layer, const uint8_t *modality, int N,
                                 kvs_err *err);

/* H2O scores of one layer: scores is [Hkv][N]: s[g][j] = (1/G) sum_{h in g}
 * sum_{i >= j} A_h[i][j], divided by N - j when `normalize`. When ent is
 * non-NULL (MEDA) it also receives the entropies of the head-averaged
 * attention under `modality` (kvs_attn_stats_fused); otherwise modality is
 * unused. One fused pass over the logits either way, or none where the view
 * carries the statistics (core's kvs_layer_attn_stats). A non-finite score
 * (logit overflow) is KVS_ERR_NUMERIC naming method, layer, KV head, token. */
kvs_status kvs_tp_scores(const char *method, int layer, const kvs_layer *in, int normalize,
                         int threads, float *scores /* [Hkv][N] */,
                         const uint8_t *modality, kvs_entropy_stats *ent, kvs_err *err);

/* LOOK-M's text prior is kvs_text_boost (methods/parts/kvs_parts.h, the h2o
 * scorer's option). */

/* Recent-window size r = floor(B * frac), clamped to [0, B]. frac = 0.5 gives
 * exactly floor(B / 2) (B * 0.5 is exact in double). */
int kvs_tp_recent(int B, double frac);

/* Per-head selection: if B >= N all tokens; else the last r tokens
 * [N - r, N) plus the top B - r of [0, N - r) by score (ties: lower index).
 * out is [B], sorted ascending, unique. */
kvs_status kvs_tp_select_head(const float *scores /* [N] */, int N, int B, int r,
                              int32_t *out /* [B] */, kvs_err *err);

/* Build the plan from stored scores: kvs_plan_init with budgets [L], then per
 * layer l and KV head g kvs_tp_select_head with r = kvs_tp_recent(B_l, frac);
 * out->merge = merge. On failure the plan is freed and the message names the
 * method, layer and head. */
kvs_status kvs_tp_fill_plan(const char *method, const float *scores /* [L][Hkv][N] */, int L,
                            int Hkv, int N, const int *budgets /* [L] */, double recent_frac,
                            kvs_merge merge, kvs_plan *out, kvs_err *err);

/* The state h2o, lookm and meda share. It is the FIRST member of each
 * method's own state struct, so that kvs_tp_create can allocate the whole
 * struct and kvs_tp_destroy free it. */
typedef struct {
    const kvs_method *m; /* the method; m->name names it in messages */
    kvs_shape shape;     /* as given at create */
    double recent_frac;  /* recent window share, r = floor(B * recent_frac) */
    int n_observed;      /* layers observed so far, in order */
    float *scores;       /* [L][Hkv][N] scores (text-boosted for lookm / meda) */
} kvs_tp_state;

/* queries_wanted of the three methods: all N prompt positions. */
int kvs_tp_queries_all(const kvs_params *p, int N);

/* The create step they share: kvs_tp_check_params, shape (L, N, Hkv >= 1),
 * kvs_tp_require_all_queries, then one zeroed block of state_size bytes
 * (>= sizeof(kvs_tp_state); the caller's struct starts with a kvs_tp_state)
 * with m, shape, recent_frac = p->v[recent_param] and the scores
 * buffer set. *state is NULL on failure (nothing left allocated); the
 * caller fills its own fields after success. */
kvs_status kvs_tp_create(const kvs_method *m, const kvs_params *p, const kvs_shape *shape,
                         int recent_param, size_t state_size, void **state, kvs_err *err);

/* Frees a state made by kvs_tp_create (scores, the block); NULL is a
 * no-op. Fields the method added are the method's to free first. */
void kvs_tp_destroy(void *state);

/* Guard at select: all L layers observed and 1 <= per_layer <= N. Messages
 * name the method. */
kvs_status kvs_tp_check_select(const kvs_tp_state *s, int per_layer, kvs_err *err);

/* Select with the same budget per_layer in every layer (h2o, lookm):
 * kvs_tp_check_select, then kvs_tp_fill_plan with out->merge = merge. */
kvs_status kvs_tp_select_uniform(const kvs_tp_state *s, int per_layer, kvs_merge merge,
                                 kvs_plan *out, kvs_err *err);

/* The observe step h2o, lookm and meda share: layers in order, shape and
 * (with text_prior) modality checks, the layer's scores into
 * s->scores[layer], the head-averaged entropies when ent is non-NULL (under
 * ent_modality), and LOOK-M's text boost when text_prior. Increments
 * s->n_observed on success. */
kvs_status kvs_tp_observe(kvs_tp_state *s, int layer, const kvs_layer *in, const uint8_t *modality,
                          int normalize, int text_prior, const uint8_t *ent_modality,
                          kvs_entropy_stats *ent, kvs_err *err);

#endif
