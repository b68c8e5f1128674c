/*
 * score_snapkv.c -- scorer `snapkv`: votes of the observation window, pooled.
 *
 * Paper: SnapKV, arXiv 2404.14469. Formula: the last w prompt queries attend
 * (causal softmax over all keys they see); each prefix key j < N - w gets
 * the sum of the attention the window's queries give it, averaged over the
 * G query heads of its KV head, then smoothed along tokens by a centred 1-D
 * pooling of width k (max or avg). Higher vote = keep.
 * It reuses exactly what methods/snapkv.c uses: core's kvs_attn_colsum_fused
 * on the last w query rows and kvs_pool1d_max / kvs_pool1d_avg over the
 * prefix votes only, so the prefix scores are bit-identical to snapkv's.
 * Parameters (read by name): window (w, absent: 32), kernel (absent: 7),
 * pool (max|avg, absent: max). Cost Hq * w * N * d (one fused pass), memory
 * [Hq][w] + [Hkv][N].
 * Decisions where sources disagree / the spec is silent:
 *   - w_eff = min(window, N); fewer than w_eff recorded queries is an error
 *     (as snapkv.c), never a silently smaller window.
 *   - The window tokens [N - w, N) get no vote (the original pools the
 *     prefix only); they score FLT_MAX so that they rank first should a
 *     composition leave them unprotected. With the `window` keep rule (the
 *     same `window` parameter) they are always kept anyway, as in SnapKV.
 */
#include "kvs_parts.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    int w, kernel, avg;
    float *lse;    /* [Hq][w] */
    float *colsum; /* [Hkv][N] */
} snap_state;

static int snap_window(const kvs_method *m, const kvs_params *p, int N) {
    int w = (int)kvs_part_param(m, p, "window", 32);
    if (w < 1) w = 1;
    return w < N ? w : N;
}

static void snap_destroy(void *state) {
    snap_state *st = state;
    if (!st) return;
    free(st->lse);
    free(st->colsum);
    free(st);
}

static kvs_status snap_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    snap_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->w = snap_window(c->m, c->p, c->shape.n_tokens);
    st->kernel = (int)kvs_part_param(c->m, c->p, "kernel", 7);
    st->avg = kvs_part_param(c->m, c->p, "pool", 0) != 0;
    st->lse = malloc(sizeof(float) * (size_t)c->shape.n_q_heads * (size_t)st->w);
    st->colsum = malloc(sizeof(float) * (size_t)c->shape.n_kv_heads * (size_t)c->shape.n_tokens);
    if (!st->lse || !st->colsum) {
        snap_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

static kvs_status snap_score(void *state, int layer, const kvs_layer *in, float *scores,
                             kvs_err *err) {
    snap_state *st = state;
    const char *mn = st->c->m->name;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads, w = st->w, P = N - w;
    if (!in->q.data || in->q.n_tokens < w)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the queries of the last %d prompt positions "
                          "(window=%d) but %d were recorded",
                          mn, layer, w, w, in->q.data ? in->q.n_tokens : 0);
    if (in->q.n_heads != st->c->shape.n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: %d query heads but the shape says %d",
                          mn, layer, in->q.n_heads, st->c->shape.n_q_heads);
    kvs_view qw = in->q; /* the last w rows: positions N - w .. N - 1 */
    qw.data = (const char *)in->q.data +
              (size_t)(in->q.n_tokens - w) * (size_t)in->q.s_tok * kvs_dtype_size(in->q.dtype);
    qw.n_tokens = w;
    kvs_status rc =
        kvs_attn_colsum_fused(&qw, &in->k, st->lse, st->colsum, NULL, st->c->shape.threads, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", mn, layer);
    for (int h = 0; h < H; h++) {
        const float *v = st->colsum + (size_t)h * N; /* [N] */
        float *dst = scores + (size_t)h * N;         /* [N] */
        for (int j = 0; j < P; j++)
            if (!isfinite(v[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: layer %d head %d: vote of token %d is not finite", mn, layer,
                                  h, j);
        if (P > 0) {
            if (st->avg) kvs_pool1d_avg(v, P, st->kernel, dst);
            else kvs_pool1d_max(v, P, st->kernel, dst);
        }
        for (int j = P; j < N; j++) dst[j] = FLT_MAX;
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_snapkv = {
    .name = "snapkv",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = snap_window,
    .create = snap_create,
    .score = snap_score,
    .destroy = snap_destroy,
};
