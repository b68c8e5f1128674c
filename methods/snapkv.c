/*
 * snapkv.c -- SnapKV: prefix tokens voted for by an observation window.
 *
 * Spec (methods.md, "SnapKV"): the observation window is the last w prompt
 * tokens' queries. For query head h and window query i (position p_i),
 * W_h[i][j] = softmax_j over all keys j <= p_i. Votes for prefix keys
 * j < N - w: v_h[j] = sum_i W_h[i][j]; GQA mean over the G query heads of a
 * KV head; then 1-D pooling along tokens, stride 1, window k, centred (padding
 * k/2; max ignores padding, avg divides by the number of real elements).
 * Keep the top B - w prefix tokens by pooled vote (ties: lower index) plus the
 * whole window. If B <= w keep the last B; B >= N keeps everything.
 * Cost Hq * w * N * d, linear in N: kvs_attn_colsum_fused (one pass) on the w
 * window queries only; memory O(N) per head (the pooled votes are kept per
 * layer until select, nothing else).
 *
 * Parameters: window (int, default 32, [1, 2^31-1]), kernel (int, default 7,
 *             [1, 2^31-1]), pool (enum max|avg, default max).
 * Decisions the spec left open:
 *   - The window uses the LAST w of the Nq recorded queries; Nq < w is an
 *     error naming both numbers (never a silent smaller window) -- except
 *     when the prompt itself is shorter than the window (N < w): then the
 *     window is the whole prompt, w_eff = N, and Nq >= N is required.
 *   - Pooling runs over the prefix votes only (the window is kept anyway), so
 *     the padding sits at j = 0 and j = N - w - 1.
 *   - Votes are fp32 column sums from core (kvs_attn_colsum_fused), which already
 *     average over the GQA group before pooling.
 * What it is not: no attention over all N queries, no N x N buffer.
 */
#include "kvsieve_methods.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { P_WINDOW = 0, P_KERNEL = 1, P_POOL = 2 };
enum { POOL_MAX = 0, POOL_AVG = 1 };

static const kvs_param_def snapkv_params[] = {
    {"window", KVS_PARAM_INT, 32, 1, 2147483647.0, NULL,
     "observation window w: the last w prompt queries vote; the window is always kept"},
    {"kernel", KVS_PARAM_INT, 7, 1, 2147483647.0, NULL,
     "pooling window k along tokens (stride 1, centred, padding k/2)"},
    {"pool", KVS_PARAM_ENUM, POOL_MAX, 0, 1, "max|avg",
     "pooling of the votes: max (ignores padding) or avg (divides by real elements)"},
};

typedef struct {
    kvs_shape shape;
    int w;      /* effective window: min(window, N) */
    int kernel;
    int pool;
    int threads;
    float *lse;    /* [Hq][w] scratch */
    float *colsum; /* [Hkv][N] scratch */
    float *votes;  /* [L][Hkv][N - w] pooled votes */
    unsigned char *seen; /* [L] */
} snapkv_state;

static int snapkv_queries_wanted(const kvs_params *p, int N) {
    int w = (int)p->v[P_WINDOW];
    return w < N ? w : N;
}

static void snapkv_destroy(void *state) {
    snapkv_state *st = state;
    if (!st) return;
    free(st->lse);
    free(st->colsum);
    free(st->votes);
    free(st->seen);
    free(st);
}

static kvs_status snapkv_create(const kvs_params *p, const kvs_shape *s, void **state,
                                kvs_err *err) {
    assert(p->n == (int)(sizeof snapkv_params / sizeof snapkv_params[0]));
    kvs_status rc = KVS_OK;
    const int N = s->n_tokens, L = s->n_layers, Hkv = s->n_kv_heads, Hq = s->n_q_heads;
    if (N < 1 || L < 1 || Hkv < 1 || Hq < Hkv || Hq % Hkv != 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "snapkv: bad shape N=%d L=%d Hkv=%d Hq=%d", N, L, Hkv, Hq);
    snapkv_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "snapkv: out of memory");
    st->shape = *s;
    st->w = snapkv_queries_wanted(p, N);
    st->kernel = (int)p->v[P_KERNEL];
    st->pool = (int)p->v[P_POOL];
    st->threads = s->threads > 0 ? s->threads : 1;
    const int P = N - st->w;
    st->lse = malloc(sizeof(float) * (size_t)Hq * (size_t)st->w);
    st->colsum = malloc(sizeof(float) * (size_t)Hkv * (size_t)N);
    st->votes = malloc(sizeof(float) * ((size_t)L * (size_t)Hkv * (size_t)P + 1));
    st->seen = calloc((size_t)L, 1);
    if (!st->lse || !st->colsum || !st->votes || !st->seen) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "snapkv: out of memory (L=%d Hkv=%d N=%d)", L, Hkv,
                        N);
        goto cleanup;
    }
    *state = st;
    st = NULL;
cleanup:
    snapkv_destroy(st);
    return rc;
}

static kvs_status snapkv_observe(void *state, int layer, const kvs_layer *in,
                                 const uint8_t *modality, kvs_err *err) {
    snapkv_state *st = state;
    const int N = st->shape.n_tokens, Hkv = st->shape.n_kv_heads, w = st->w;
    if (layer < 0 || layer >= st->shape.n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "snapkv: layer %d out of range [0, %d)", layer,
                          st->shape.n_layers);
    if (in->k.n_tokens != N || in->k.n_heads != Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "snapkv: layer %d: K is [%d][%d] but the shape says [%d][%d]", layer,
                          in->k.n_heads, in->k.n_tokens, Hkv, N);
    if (!in->q.data || in->q.n_tokens < w)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "snapkv: layer %d: needs the queries of the last %d prompt positions "
                          "(window=%d) but %d were recorded",
                          layer, w, w, in->q.data ? in->q.n_tokens : 0);
    if (in->q.n_heads != st->shape.n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "snapkv: layer %d: %d query heads but the shape says %d", layer,
                          in->q.n_heads, st->shape.n_q_heads);
    /* The last w recorded query rows: positions N - w .. N - 1. */
    kvs_view qw = in->q; /* [Hq][w][d] */
    qw.data = (const char *)in->q.data +
              (size_t)(in->q.n_tokens - w) * (size_t)in->q.s_tok * kvs_dtype_size(in->q.dtype);
    qw.n_tokens = w;
    /* One pass over the window's logits: row lse and column sums together. */
    kvs_status rc = kvs_attn_colsum_fused(&qw, &in->k, st->lse, st->colsum, NULL, st->threads, err);
    if (rc) return kvs_err_prefix(err, "snapkv: layer %d", layer);
    const int P = N - w;
    for (int h = 0; h < Hkv; h++) {
        const float *v = st->colsum + (int64_t)h * N;                          /* [N] */
        float *dst = st->votes + ((int64_t)layer * Hkv + h) * (int64_t)P; /* [P] */
        for (int j = 0; j < P; j++)
            if (!isfinite(v[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "snapkv: layer %d head %d: vote of token %d is not finite",
                                  layer, h, j);
        if (P == 0) continue;
        if (st->pool == POOL_MAX)
            kvs_pool1d_max(v, P, st->kernel, dst);
        else
            kvs_pool1d_avg(v, P, st->kernel, dst);
    }
    st->seen[layer] = 1;
    return KVS_OK;
}

static kvs_status snapkv_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    snapkv_state *st = state;
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    const int w = st->w, P = N - w;
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "snapkv: per-layer budget %d outside [1, %d]",
                          per_layer, N);
    for (int l = 0; l < L; l++)
        if (!st->seen[l])
            return kvs_errorf(err, KVS_ERR_INVALID, "snapkv: layer %d was never observed", l);
    const int B = per_layer;
    kvs_status rc = KVS_OK;
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "snapkv: out of memory");
    for (int l = 0; l < L; l++) budgets[l] = B;
    rc = kvs_plan_init(out, "snapkv", L, H, N, budgets, err);
    if (rc) goto cleanup;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            int32_t *row = out->layers[l].idx + (int64_t)h * B; /* [B] */
            if (B <= w) { /* the last B tokens (B == N == w: everything) */
                for (int i = 0; i < B; i++) row[i] = N - B + i;
                continue;
            }
            const int top = B - w; /* <= P since B <= N */
            const float *v = st->votes + ((int64_t)l * H + h) * (int64_t)P; /* [P] */
            rc = kvs_topk_indices(v, P, top, row, err);
            if (rc) {
                kvs_err_prefix(err, "snapkv: layer %d head %d", l, h);
                goto cleanup;
            }
            for (int i = 0; i < w; i++) row[top + i] = P + i;
        }
cleanup:
    free(budgets);
    return rc;
}

const kvs_method kvs_method_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: prefix tokens voted by the last `window` queries, pooled, plus the window",
    .needs = KVS_NEED_Q_WINDOW,
    .params = snapkv_params,
    .n_params = (int)(sizeof snapkv_params / sizeof snapkv_params[0]),
    .queries_wanted = snapkv_queries_wanted,
    .create = snapkv_create,
    .observe = snapkv_observe,
    .select = snapkv_select,
    .destroy = snapkv_destroy,
};
