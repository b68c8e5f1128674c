/*
 * h2o.c -- H2O ("heavy hitters"), CPU reference. Follows the spec
 * (shared/spec/methods.md, "H2O").
 *
 * Rules:
 *   - Score per query head h: the column sum of the causal attention over ALL
 *     N prefill queries, s_h[j] = sum_{i >= j} A_h[i][j], fp32 (core's
 *     kvs_attn_lse + kvs_attn_colsum: two tiled passes, O(N) memory per head,
 *     never an N x N buffer). GQA: mean over the G query heads of a KV head.
 *   - Option `normalize` (default false, i.e. raw sums as the original code):
 *     s[j] /= N - j, the number of queries that see key j.
 *   - Per KV head and layer with budget B: keep the last r = floor(B / 2)
 *     tokens (recent window) and the top B - r of tokens [0, N - r) by score;
 *     ties go to the lower token index. B >= N keeps everything.
 *   - Every layer keeps the same B = per_layer (no re-allocation across
 *     layers), every KV head of a layer keeps B tokens. No merging.
 *
 * Decisions the spec left open (all named parameters or stated here):
 *   - `recent_frac` (float, default 0.5, range [0, 1]): the recent window is
 *     r = floor(B * recent_frac). The default gives exactly the spec's
 *     floor(B / 2); other values are for ablations only.
 *   - Queries: H2O needs the queries of all N positions (KVS_NEED_Q_ALL).
 *     Missing queries, or Nq != N, are an error (KVS_ERR_INVALID naming h2o,
 *     the layer and Nq) at create and again at observe; there is no fallback
 *     to a partial window.
 *   - observe keeps only the layer's [Hkv][N] scores; selection happens in
 *     select, once per_layer is known.
 *   - Host memory only (a CUDA view is KVS_ERR_UNSUPPORTED here).
 *
 * What this file is not: the attention statistics live in core/, the shared
 * score / selection helpers in textprior.c; compaction is core's kvs_apply.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve_methods.h"
#include "textprior.h"

static const kvs_param_def h2o_params[] = {
    {"normalize", KVS_PARAM_BOOL, 0, 0, 1, NULL,
     "divide each attention column sum by N - j, the number of queries that see token j"},
    {"recent_frac", KVS_PARAM_FLOAT, 0.5, 0.0, 1.0, NULL,
     "share of the budget kept as the recent window, r = floor(B * recent_frac) (spec: 0.5)"},
};
enum { P_NORMALIZE = 0, P_RECENT_RATIO = 1 };

typedef struct {
    kvs_shape shape;
    int normalize;
    double recent_frac;
    int n_observed; /* layers observed so far, in order */
    float *lse;     /* [Hq][N] scratch for the lse pass */
    float *scores;  /* [L][Hkv][N] */
} h2o_state;

static int h2o_queries_wanted(const kvs_params *p, int N) {
    (void)p;
    return N;
}

static void h2o_destroy(void *state) {
    h2o_state *s = state;
    if (!s) return;
    free(s->lse);
    free(s->scores);
    free(s);
}

static kvs_status h2o_create(const kvs_params *p, const kvs_shape *shape, void **state,
                             kvs_err *err) {
    *state = NULL;
    kvs_status st = kvs_tp_check_params(&kvs_method_h2o, p, err);
    if (st != KVS_OK) return st;
    if (shape->n_layers < 1 || shape->n_tokens < 1 || shape->n_kv_heads < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "h2o: bad shape L=%d N=%d Hkv=%d",
                          shape->n_layers, shape->n_tokens, shape->n_kv_heads);
    st = kvs_tp_require_all_queries("h2o", -1, shape->n_tokens, shape->n_q_heads,
                                    shape->n_queries, shape->n_queries > 0, err);
    if (st != KVS_OK) return st;
    h2o_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "h2o: out of memory for the state");
    s->shape = *shape;
    s->normalize = p->v[P_NORMALIZE] != 0.0;
    s->recent_frac = p->v[P_RECENT_RATIO];
    const size_t N = (size_t)shape->n_tokens;
    s->lse = malloc(sizeof(float) * (size_t)shape->n_q_heads * N);
    s->scores = malloc(sizeof(float) * (size_t)shape->n_layers * (size_t)shape->n_kv_heads * N);
    if (!s->lse || !s->scores) {
        h2o_destroy(s);
        return kvs_errorf(err, KVS_ERR_NOMEM, "h2o: out of memory for [L=%d][Hkv=%d][N=%d] scores",
                          shape->n_layers, shape->n_kv_heads, shape->n_tokens);
    }
    *state = s;
    return KVS_OK;
}

static kvs_status h2o_observe(void *state, int layer, const kvs_layer *in,
                              const uint8_t *modality, kvs_err *err) {
    h2o_state *s = state; /* H2O ignores modality */
    return kvs_tp_observe("h2o", layer, &s->n_observed, &s->shape, in, modality, s->normalize, 0, s->lse,
                          s->scores, NULL, NULL, err);
}

static kvs_status h2o_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    h2o_state *s = state;
    const int L = s->shape.n_layers, Hkv = s->shape.n_kv_heads, N = s->shape.n_tokens;
    if (s->n_observed != L)
        return kvs_errorf(err, KVS_ERR_INVALID, "h2o: select after %d of %d layers were observed",
                          s->n_observed, L);
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "h2o: per-layer budget %d outside [1, N=%d]",
                          per_layer, N);
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L], every layer the same */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "h2o: out of memory");
    for (int l = 0; l < L; l++) budgets[l] = per_layer;
    kvs_status st = kvs_tp_fill_plan("h2o", s->scores, L, Hkv, N, budgets, s->recent_frac,
                                     KVS_MERGE_NONE, out, err);
    free(budgets);
    return st;
}

const kvs_method kvs_method_h2o = {
    .name = "h2o",
    .summary = "H2O heavy hitters: attention column sums over all prefill queries + recent window",
    .needs = KVS_NEED_Q_ALL,
    .params = h2o_params,
    .n_params = (int)(sizeof h2o_params / sizeof h2o_params[0]),
    .queries_wanted = h2o_queries_wanted,
    .create = h2o_create,
    .observe = h2o_observe,
    .select = h2o_select,
    .destroy = h2o_destroy,
};
