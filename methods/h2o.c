/*
 * h2o.c -- H2O ("heavy hitters"), CPU reference. Follows the spec
 * (shared/spec/methods.md, "H2O").
 *
 * Rules:
 *   - Score per query head h: the column sum of the causal attention over ALL
 *     N prefill queries, s_h[j] = sum_{i >= j} A_h[i][j], fp32 (core's
 *     kvs_attn_lse + kvs_attn_colsum: two tiled passes, O(N) memory per head,
 *     never an N x N buffer; read from kvs_layer.attn_colsum instead where
 *     the view carries it). GQA: mean over the G query heads of a KV head.
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
 * state / score / selection helpers in textprior.c; compaction is core's kvs_apply.
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
    kvs_tp_state tp; /* first member (kvs_tp_create / kvs_tp_destroy) */
    int normalize;
} h2o_state;

static kvs_status h2o_create(const kvs_params *p, const kvs_shape *shape, void **state,
                             kvs_err *err) {
    kvs_status st = kvs_tp_create(&kvs_method_h2o, p, shape, P_RECENT_RATIO, sizeof(h2o_state),
                                  state, err);
    if (st != KVS_OK) return st;
    h2o_state *s = *state;
    s->normalize = p->v[P_NORMALIZE] != 0.0;
    return KVS_OK;
}

static kvs_status h2o_observe(void *state, int layer, const kvs_layer *in,
                              const uint8_t *modality, kvs_err *err) {
    h2o_state *s = state; /* H2O ignores modality */
    return kvs_tp_observe(&s->tp, layer, in, modality, s->normalize, 0, NULL, NULL, err);
}

static kvs_status h2o_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    h2o_state *s = state;
    return kvs_tp_select_uniform(&s->tp, per_layer, KVS_MERGE_NONE, out, err);
}

const kvs_method kvs_method_h2o = {
    .name = "h2o",
    .summary = "H2O heavy hitters: attention column sums over all prefill queries + recent window",
    .needs = KVS_NEED_Q_ALL | KVS_READS_ATTN_STATS,
    .params = h2o_params,
    .n_params = (int)(sizeof h2o_params / sizeof h2o_params[0]),
    .queries_wanted = kvs_tp_queries_all,
    .create = h2o_create,
    .observe = h2o_observe,
    .select = h2o_select,
    .destroy = kvs_tp_destroy,
};
