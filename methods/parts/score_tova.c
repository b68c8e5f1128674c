/*
 * score_tova.c -- scorer `tova`: the attention of the last query.
 *
 * Paper: TOVA (Transformers are Multi-State RNNs), arXiv 2401.06104.
 * Formula: the query of the last prompt position N - 1 attends to all N
 * keys (softmax over j <= N - 1); key j scores that probability, averaged
 * over the G query heads of its KV head. Higher = keep.
 * Computed by core's kvs_attn_colsum_fused on that one query row (the
 * column sum of a one-row attention is the row itself). Needs the last
 * query only. Cost Hq * N * d; memory [Hq] + the scores. No parameters.
 * Decisions where sources disagree:
 *   - Averaging: TOVA's paper and kvpress's TOVAPress average over ALL
 *     query heads of the layer (one selection per layer); we average over
 *     the GQA group of each KV head (the project's per-KV-head rule).
 *   - The last token: TOVA always holds the newest token, kvpress forces it
 *     by giving it max + 1; here the scorer leaves its own attention as its
 *     score and the `tova` preset keeps it with the `window` keep rule
 *     (window = 1), so the rule is visible and can be ablated.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    float *lse; /* [Hq] */
} tova_state;

static int tova_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m;
    (void)p;
    (void)N;
    return 1;
}

static void tova_destroy(void *state) {
    tova_state *st = state;
    if (!st) return;
    free(st->lse);
    free(st);
}

static kvs_status tova_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    tova_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->lse = malloc(sizeof(float) * (size_t)c->shape.n_q_heads);
    if (!st->lse) {
        tova_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

static kvs_status tova_score(void *state, int layer, const kvs_layer *in, float *scores,
                             kvs_err *err) {
    tova_state *st = state;
    const char *mn = st->c->m->name;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads;
    if (!in->q.data || in->q.n_tokens < 1 || in->q.n_heads != st->c->shape.n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the query of the last prompt position (Nq >= 1, "
                          "Hq = %d) but got Nq=%d",
                          mn, layer, st->c->shape.n_q_heads, in->q.data ? in->q.n_tokens : 0);
    kvs_view q1 = in->q; /* the last row: position N - 1 */
    q1.data = (const char *)in->q.data +
              (size_t)(in->q.n_tokens - 1) * (size_t)in->q.s_tok * kvs_dtype_size(in->q.dtype);
    q1.n_tokens = 1;
    kvs_status rc =
        kvs_attn_colsum_fused(&q1, &in->k, st->lse, scores, NULL, st->c->shape.threads, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", mn, layer);
    for (size_t i = 0; i < (size_t)H * (size_t)N; i++)
        if (!isfinite(scores[i]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "%s: layer %d: KV head %d: token %d: "
                              "attention is not finite", mn, layer, (int)(i / (size_t)N),
                              (int)(i % (size_t)N));
    return KVS_OK;
}

const kvs_scorer kvs_scorer_tova = {
    .name = "tova",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = tova_queries,
    .create = tova_create,
    .score = tova_score,
    .destroy = tova_destroy,
};
