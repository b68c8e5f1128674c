/*
 * textprior.c -- private helpers of h2o.c (and the reference of the lookm and
 * meda presets in tests/parts): the
 * H2O attention column-sum score, the LOOK-M text prior, the per-head
 * "recent window + top-k of the rest" selection, and the create / observe /
 * select / destroy steps the three methods share. See textprior.h.
 *
 * What it is not: it computes no attention itself (core's fused
 * kvs_attn_colsum_fused / kvs_attn_stats_fused do, one pass over the logits,
 * memory O(rows x N) per thread), allocates no N x N buffer,
 * and holds no global state (each kvs_tp_state belongs to its caller).
 */
#include "textprior.h"

#include "kvs_parts.h" /* kvs_text_boost: LOOK-M's text prior lives with the h2o scorer */

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvs_status kvs_tp_check_params(const kvs_method *m, const kvs_params *p, kvs_err *err) {
    if (!p || p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: expected %d parameter values, got %d", m->name,
                          m->n_params, p ? p->n : -1);
    for (int i = 0; i < m->n_params; i++) {
        const kvs_param_def *d = &m->params[i];
        double x = p->v[i];
        int ok = !isnan(x);
        if (ok && (d->type == KVS_PARAM_INT || d->type == KVS_PARAM_FLOAT))
            ok = x >= d->min && x <= d->max && (d->type == KVS_PARAM_FLOAT || x == floor(x));
        if (ok && d->type == KVS_PARAM_BOOL) ok = x == 0.0 || x == 1.0;
        if (ok && d->type == KVS_PARAM_ENUM) {
            int n_choices = 1;
            for (const char *c = d->choices; c && *c; c++) n_choices += *c == '|';
            ok = x >= 0 && x < n_choices && x == floor(x);
        }
        if (!ok)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: parameter %s = %g is out of range", m->name,
                              d->name, x);
    }
    return KVS_OK;
}

kvs_status kvs_tp_require_all_queries(const char *method, int layer, int n_tokens, int n_q_heads,
                                      int n_queries, int has_q, kvs_err *err) {
    char where[32] = "";
    if (layer >= 0) snprintf(where, sizeof where, "layer %d: ", layer);
    if (!has_q || n_queries <= 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: %sneeds the queries of all N=%d prompt positions "
                          "(KVS_NEED_Q_ALL) but none were given (Nq=0)",
                          method, where, n_tokens);
    if (n_q_heads <= 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: %squeries have no heads (Hq=%d)", method,
                          where, n_q_heads);
    if (n_queries != n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: %sneeds the queries of all N=%d prompt positions "
                          "(KVS_NEED_Q_ALL) but got Nq=%d",
                          method, where, n_tokens, n_queries);
    return KVS_OK;
}

kvs_status kvs_tp_check_layer(const char *method, int layer, const kvs_layer *in,
                              const kvs_shape *shape, kvs_err *err) {
    if (!in)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: NULL layer", method, layer);
    const kvs_view *k = &in->k, *v = &in->v, *q = &in->q;
    if (!k->data || !v->data)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: K or V data is NULL", method,
                          layer);
    if (k->device != KVS_HOST || v->device != KVS_HOST || (q->data && q->device != KVS_HOST))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: layer %d: only host (CPU) memory is supported by this path", method,
                          layer);
    if (k->n_tokens != shape->n_tokens || k->n_heads != shape->n_kv_heads ||
        k->head_dim != shape->head_dim || v->n_tokens != k->n_tokens ||
        v->n_heads != k->n_heads || v->head_dim != k->head_dim)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: K [%d][%d][%d] / V [%d][%d][%d] do not match the shape "
                          "given at create [Hkv=%d][N=%d][d=%d]",
                          method, layer, k->n_heads, k->n_tokens, k->head_dim, v->n_heads,
                          v->n_tokens, v->head_dim, shape->n_kv_heads, shape->n_tokens,
                          shape->head_dim);
    kvs_status st = kvs_tp_require_all_queries(method, layer, k->n_tokens, q->n_heads,
                                               q->data ? q->n_tokens : 0, q->data != NULL, err);
    if (st != KVS_OK) return st;
    if (q->head_dim != k->head_dim || q->n_heads % k->n_heads != 0 ||
        q->n_heads != shape->n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: Q [%d][%d][%d] does not fit K [%d][%d][%d] (Hq must be "
                          "a multiple of Hkv, equal to %d, and d must agree)",
                          method, layer, q->n_heads, q->n_tokens, q->head_dim, k->n_heads,
                          k->n_tokens, k->head_dim, shape->n_q_heads);
    return KVS_OK;
}

kvs_status kvs_tp_check_modality(const char *method, int layer, const uint8_t *modality, int N,
                                 kvs_err *err) {
    if (!modality) return KVS_OK;
    for (int j = 0; j < N; j++)
        if (modality[j] > KVS_MOD_AUDIO)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "%s: layer %d: modality[%d] = %d is not a KVS_MOD_* value "
                              "(0 text, 1 image, 2 video, 3 audio)",
                              method, layer, j, (int)modality[j]);
    return KVS_OK;
}

kvs_status kvs_tp_scores(const char *method, int layer, const kvs_layer *in, int normalize,
                         int threads, float *scores /* [Hkv][N] */,
                         const uint8_t *modality, kvs_entropy_stats *ent, kvs_err *err) {
    const int N = in->k.n_tokens, Hkv = in->k.n_heads;
    assert(in->q.data && in->q.n_tokens == N);
    /* One fused pass over the logits: column sums (and, for MEDA, the
     * entropies of the head-averaged attention) from the same tiles, or none
     * where the view carries them (kvs_layer.attn_colsum / attn_ent) */
    kvs_status st = kvs_layer_attn_stats(in, modality, scores, ent, threads, NULL, err);
    if (st != KVS_OK) return kvs_err_prefix(err, "%s: layer %d", method, layer);
    for (int g = 0; g < Hkv; g++) {
        float *s = scores + (size_t)g * N; /* [N] */
        for (int j = 0; j < N; j++) {
            if (!isfinite(s[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: layer %d: KV head %d: attention score of token %d is not "
                                  "finite (logit overflow?)",
                                  method, layer, g, j);
            /* Nq == N: key j is seen by the queries at positions j .. N-1. */
            if (normalize) s[j] /= (float)(N - j);
        }
    }
    return KVS_OK;
}

int kvs_tp_recent(int B, double frac) {
    assert(B >= 0 && frac >= 0.0 && frac <= 1.0);
    double r = floor((double)B * frac);
    if (r < 0) r = 0;
    if (r > B) r = B;
    return (int)r;
}

kvs_status kvs_tp_select_head(const float *scores /* [N] */, int N, int B, int r,
                              int32_t *out /* [B] */, kvs_err *err) {
    assert(N > 0 && B >= 1 && B <= N && r >= 0 && r <= B);
    if (B >= N) {
        for (int j = 0; j < N; j++) out[j] = j;
        return KVS_OK;
    }
    const int n_rest = N - r, k = B - r;
    if (k > 0) {
        kvs_status st = kvs_topk_indices(scores, n_rest, k, out, err);
        if (st != KVS_OK) return st;
    }
    for (int i = 0; i < r; i++) out[k + i] = n_rest + i;
#ifndef NDEBUG
    for (int i = 1; i < B; i++) assert(out[i - 1] < out[i]);
#endif
    return KVS_OK;
}

kvs_status kvs_tp_fill_plan(const char *method, const float *scores /* [L][Hkv][N] */, int L,
                            int Hkv, int N, const int *budgets /* [L] */, double recent_frac,
                            kvs_merge merge, kvs_plan *out, kvs_err *err) {
    kvs_status st = kvs_plan_init(out, method, L, Hkv, N, budgets, err);
    if (st != KVS_OK) return kvs_err_prefix(err, "%s", method);
    out->merge = merge;
    for (int l = 0; l < L && st == KVS_OK; l++) {
        const int B = budgets[l], r = kvs_tp_recent(B, recent_frac);
        for (int g = 0; g < Hkv && st == KVS_OK; g++) {
            const float *sc = scores + ((size_t)l * Hkv + g) * N; /* [N] */
            st = kvs_tp_select_head(sc, N, B, r, out->layers[l].idx + (size_t)g * B, err);
            if (st != KVS_OK) kvs_err_prefix(err, "%s: layer %d: KV head %d", method, l, g);
        }
    }
    if (st != KVS_OK) kvs_plan_free(out);
    return st;
}

int kvs_tp_queries_all(const kvs_params *p, int N) {
    (void)p;
    return N;
}

kvs_status kvs_tp_create(const kvs_method *m, const kvs_params *p, const kvs_shape *shape,
                         int recent_param, size_t state_size, void **state, kvs_err *err) {
    assert(state_size >= sizeof(kvs_tp_state) && recent_param >= 0 && recent_param < m->n_params);
    *state = NULL;
    const char *method = m->name;
    kvs_status st = kvs_tp_check_params(m, p, err);
    if (st != KVS_OK) return st;
    if (shape->n_layers < 1 || shape->n_tokens < 1 || shape->n_kv_heads < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: bad shape L=%d N=%d Hkv=%d", method,
                          shape->n_layers, shape->n_tokens, shape->n_kv_heads);
    st = kvs_tp_require_all_queries(method, -1, shape->n_tokens, shape->n_q_heads,
                                    shape->n_queries, shape->n_queries > 0, err);
    if (st != KVS_OK) return st;
    kvs_tp_state *s = calloc(1, state_size);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for the state", method);
    s->m = m;
    s->shape = *shape;
    s->recent_frac = p->v[recent_param];
    const size_t N = (size_t)shape->n_tokens;
    s->scores = malloc(sizeof(float) * (size_t)shape->n_layers * (size_t)shape->n_kv_heads * N);
    if (!s->scores) {
        kvs_tp_destroy(s);
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for [L=%d][Hkv=%d][N=%d] scores",
                          method, shape->n_layers, shape->n_kv_heads, shape->n_tokens);
    }
    *state = s;
    return KVS_OK;
}

void kvs_tp_destroy(void *state) {
    kvs_tp_state *s = state;
    if (!s) return;
    free(s->scores);
    free(s);
}

kvs_status kvs_tp_check_select(const kvs_tp_state *s, int per_layer, kvs_err *err) {
    const int L = s->shape.n_layers, N = s->shape.n_tokens;
    if (s->n_observed != L)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: select after %d of %d layers were observed",
                          s->m->name, s->n_observed, L);
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: per-layer budget %d outside [1, N=%d]",
                          s->m->name, per_layer, N);
    return KVS_OK;
}

kvs_status kvs_tp_select_uniform(const kvs_tp_state *s, int per_layer, kvs_merge merge,
                                 kvs_plan *out, kvs_err *err) {
    kvs_status st = kvs_tp_check_select(s, per_layer, err);
    if (st != KVS_OK) return st;
    const int L = s->shape.n_layers;
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L], every layer the same */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", s->m->name);
    for (int l = 0; l < L; l++) budgets[l] = per_layer;
    st = kvs_tp_fill_plan(s->m->name, s->scores, L, s->shape.n_kv_heads, s->shape.n_tokens,
                          budgets, s->recent_frac, merge, out, err);
    free(budgets);
    return st;
}

kvs_status kvs_tp_observe(kvs_tp_state *s, int layer, const kvs_layer *in, const uint8_t *modality,
                          int normalize, int text_prior, const uint8_t *ent_modality,
                          kvs_entropy_stats *ent, kvs_err *err) {
    const char *method = s->m->name;
    const kvs_shape *shape = &s->shape;
    if (layer != s->n_observed || layer >= shape->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: observe(layer %d) out of order: expected layer %d of %d", method,
                          layer, s->n_observed, shape->n_layers);
    kvs_status st = kvs_tp_check_layer(method, layer, in, shape, err);
    if (st == KVS_OK && text_prior)
        st = kvs_tp_check_modality(method, layer, modality, shape->n_tokens, err);
    if (st != KVS_OK) return st;
    const int Hkv = shape->n_kv_heads, N = shape->n_tokens;
    float *sc = s->scores + (size_t)layer * Hkv * N; /* [Hkv][N] */
    st = kvs_tp_scores(method, layer, in, normalize, shape->threads, sc, ent_modality, ent,
                       err);
    if (st != KVS_OK) return st;
    if (text_prior) kvs_text_boost(sc, Hkv, N, modality);
    s->n_observed++;
    return KVS_OK;
}
