/*
 * score_h2o.c -- scorer `h2o`: accumulated attention (heavy hitters).
 *
 * Paper: H2O, arXiv 2306.14048. Formula: every prefill query attends
 * causally; key j scores the sum of the attention all N queries give it,
 * averaged over the G query heads of its KV head (optionally divided by
 * N - j, the number of queries that see it). Higher = keep.
 * It computes exactly what methods/h2o.c (textprior.c) computes: core's
 * kvs_attn_colsum_fused over all N queries, then the optional division in
 * fp32, so the scores are bit-identical to h2o's.
 * Parameters: normalize (bool, absent: false); text_prior (bool, absent:
 * false): LOOK-M's text prior, every text token's score += the head's
 * maximum score (kvs_text_boost below; modality absent = all text), as
 * the monolithic lookm.c and meda.c scored. Needs all N queries. When the
 * composition's allocator reads MEDA's entropies (KVS_STAT_ENTROPY) the
 * pass is core's kvs_attn_stats_fused, which yields them with the column
 * sums (as the monolithic meda.c). All through core's kvs_layer_attn_stats:
 * where the view carries them (kvs_layer.attn_colsum / attn_ent, e.g. the
 * engine's prefill accumulated them) they are read, not recomputed (same
 * definition, another summation order). Cost Hq * N^2 * d / 2 (one fused
 * pass) or none; memory the scores.
 * Decisions where sources disagree: raw sums by default (the original code);
 * `normalize` is the spec's option. H2O's recent window is not part of the
 * scorer: compose it with the `window` keep rule (recent_frac = 0.5).
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    int normalize, text_prior;
} h2o_sc_state;

void kvs_text_boost(float *scores /* [Hkv][N] */, int Hkv, int N, const uint8_t *modality) {
    for (int g = 0; g < Hkv; g++) {
        float *s = scores + (size_t)g * N; /* [N] */
        float mx = s[0];
        for (int j = 1; j < N; j++)
            if (s[j] > mx) mx = s[j];
        for (int j = 0; j < N; j++)
            if (!modality || modality[j] == KVS_MOD_TEXT) s[j] += mx;
    }
}

static int h2o_sc_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m;
    (void)p;
    return N;
}

static void h2o_sc_destroy(void *state) {
    h2o_sc_state *st = state;
    if (!st) return;
    free(st);
}

static kvs_status h2o_sc_make(const kvs_part_ctx *c, int text_prior, void **state, kvs_err *err) {
    if (c->shape.n_queries <= 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "needs the queries of all N=%d prompt positions (KVS_NEED_Q_ALL) but "
                          "none were given (Nq=0)",
                          c->shape.n_tokens);
    if (c->shape.n_queries != c->shape.n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "needs the queries of all N=%d prompt positions (KVS_NEED_Q_ALL) but "
                          "got Nq=%d",
                          c->shape.n_tokens, c->shape.n_queries);
    h2o_sc_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->normalize = kvs_part_param(c->m, c->p, "normalize", 0) != 0;
    st->text_prior = text_prior || kvs_part_param(c->m, c->p, "text_prior", 0) != 0;
    *state = st;
    return KVS_OK;
}

static kvs_status h2o_sc_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    return h2o_sc_make(c, 0, state, err);
}

static kvs_status lookm_sc_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    return h2o_sc_make(c, 1, state, err);
}

static kvs_status h2o_sc_score(void *state, int layer, const kvs_layer *in, float *scores,
                               kvs_err *err) {
    h2o_sc_state *st = state;
    const char *mn = st->c->m->name;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads;
    if (!in->q.data || in->q.n_tokens != N || in->q.n_heads != st->c->shape.n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the queries of all N=%d prompt positions "
                          "(KVS_NEED_Q_ALL) but got Nq=%d",
                          mn, layer, N, in->q.data ? in->q.n_tokens : 0);
    /* MEDA's entropies (alloc_entropy.c) come from the same fused pass, or
     * with the column sums from the view when its producer has them */
    kvs_layer_stats *ls = st->c->stats && (st->c->want_stats & KVS_STAT_ENTROPY)
                              ? &st->c->stats[layer]
                              : NULL;
    const uint8_t *mod = st->c->modality;
    kvs_status rc = kvs_layer_attn_stats(in, mod, scores, ls ? &ls->ent : NULL,
                                         st->c->shape.threads, NULL, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", mn, layer);
    for (int g = 0; g < H; g++) {
        float *s = scores + (size_t)g * N; /* [N] */
        for (int j = 0; j < N; j++) {
            if (!isfinite(s[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: layer %d: KV head %d: attention score of token %d is not "
                                  "finite (logit overflow?)",
                                  mn, layer, g, j);
            if (st->normalize) s[j] /= (float)(N - j);
        }
    }
    if (ls) ls->have |= KVS_STAT_ENTROPY;
    if (st->text_prior) kvs_text_boost(scores, H, N, mod);
    return KVS_OK;
}

const kvs_scorer kvs_scorer_h2o = {
    .name = "h2o",
    .needs = KVS_NEED_Q_ALL,
    .props = KVS_READS_ATTN_STATS,
    .queries_wanted = h2o_sc_queries,
    .create = h2o_sc_create,
    .score = h2o_sc_score,
    .destroy = h2o_sc_destroy,
};

/* `lookm`: the same scorer with LOOK-M's text prior always on (the scorer of
 * the lookm and meda presets, whose parameter tables predate the parts). */
const kvs_scorer kvs_scorer_lookm = {
    .name = "lookm",
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .props = KVS_READS_ATTN_STATS,
    .queries_wanted = h2o_sc_queries,
    .create = lookm_sc_create,
    .score = h2o_sc_score,
    .destroy = h2o_sc_destroy,
};
