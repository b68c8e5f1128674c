/*
 * score_finch.c -- scorer `finch`: attention of the question's queries over
 * the context, each query row weighted by the keys it sees (Finch).
 *
 * Paper: Finch, "Prompt-guided Key-Value Cache Compression", arXiv
 * 2408.00167 (TACL 2024); kvpress FinchPress (kvpress/presses/
 * finch_press.py, read at 0603dec). The prompt is context + question; the
 * question is its last w tokens (the `window` parameter).
 * Formula, for KV head g with the G query heads of its group: query row i
 * of the question sits at position p_i = N - w + i and has the causal
 * softmax A_h[i][j] over every key j <= p_i (context and question keys
 * alike); context token j < N - w scores
 *   s_g[j] = 1/(G w) * sum_{h in g} sum_i f_i A_h[i][j],
 * with f_i = p_i when `normalize_scores` (kvpress's factor: a row spread over more
 * keys is scaled up, so late and early rows count alike) and f_i = 1
 * otherwise. The question tokens [N - w, N) score FLT_MAX (rank first, as
 * kvpress pads them with max + 1); the `window` keep rule of the preset
 * keeps them anyway. Higher = keep.
 * Parameters (read by name): window (w, absent 32), normalize_scores (absent 1).
 * Cost one of the core's window attention passes (kvs_attn_colsum_fused_w,
 * the weights f_i applied to the normalised rows), Hq * w * N * d
 * multiply-adds in fp32 on the shape's threads, as SnapKV; scratch
 * [Hq][w] + [w] + [Hkv][N] floats.
 * Decisions where sources disagree or are silent:
 *   - The question's length: kvpress finds it from a delimiter token it adds
 *     to the tokenizer; a cache view carries no question boundary, so w is
 *     a parameter (default 32, SnapKV's window) and fewer than w recorded
 *     queries is an error naming both numbers, never a smaller window.
 *   - The factor f_i = p_i is kvpress's (the number of keys row i sees less
 *     one); the paper's "number of non-zero weights" would be p_i + 1. We
 *     follow kvpress.
 *   - No pooling (kvpress's Finch has none, unlike SnapKV).
 *   - kvpress averages over the GQA group; so do we (per KV head picks).
 *   - The paper's chunked prefill (each context chunk scored with the
 *     question appended, the cache compressed between chunks) is not a
 *     one-shot rule; kvpress's chunked selection (per chunk of
 *     chunk_length its share of the budget) is the `segment` pick rule.
 */
#include "kvs_parts.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    int w, normalize;
    float *lse;    /* [Hq][w] the question rows' log-sum-exp */
    float *f;      /* [w] the rows' weights f_i */
    float *colsum; /* [Hkv][N] */
} finch_state;

static int finch_window(const kvs_method *m, const kvs_params *p, int N) {
    int w = (int)kvs_part_param(m, p, "window", 32);
    if (w < 1) w = 1;
    return w < N ? w : N;
}

static void finch_destroy(void *state) {
    finch_state *st = state;
    if (!st) return;
    free(st->lse);
    free(st->f);
    free(st->colsum);
    free(st);
}

static kvs_status finch_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    finch_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    const size_t N = (size_t)c->shape.n_tokens;
    st->c = c;
    st->w = finch_window(c->m, c->p, c->shape.n_tokens);
    st->normalize = kvs_part_param(c->m, c->p, "normalize_scores", 1) != 0;
    st->lse = malloc(sizeof(float) * (size_t)c->shape.n_q_heads * (size_t)st->w);
    st->f = malloc(sizeof(float) * (size_t)st->w);
    st->colsum = malloc(sizeof(float) * (size_t)c->shape.n_kv_heads * N);
    if (!st->lse || !st->f || !st->colsum) {
        finch_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [Hkv][N=%zu] scores", N);
    }
    *state = st;
    return KVS_OK;
}

/* The weighted column sum in one of the core's attention passes
 * (kvs_attn_colsum_fused_w with row i's weight f_i): each question row's
 * logits are computed once, normalised and added to the columns. */
static kvs_status finch_score(void *state, int layer, const kvs_layer *in, float *scores,
                              kvs_err *err) {
    finch_state *st = state;
    const char *mn = st->c->m->name;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads, w = st->w, P = N - w;
    const int Hq = st->c->shape.n_q_heads;
    if (!in->q.data || in->q.n_tokens < w)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the queries of the question's %d tokens (window=%d) "
                          "but %d were recorded",
                          mn, layer, w, w, in->q.data ? in->q.n_tokens : 0);
    if (in->q.n_heads != Hq || Hq < H || Hq % H)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: %d query heads, the shape says %d",
                          mn, layer, in->q.n_heads, Hq);
    if (P == 0) { /* no context: nothing to rank */
        for (size_t j = 0; j < (size_t)H * N; j++) scores[j] = FLT_MAX;
        return KVS_OK;
    }
    kvs_view qw = in->q; /* the question's rows: positions N - w .. N - 1 */
    qw.data = (const char *)in->q.data +
              (size_t)(in->q.n_tokens - w) * (size_t)in->q.s_tok * kvs_dtype_size(in->q.dtype);
    qw.n_tokens = w;
    /* f_i = p_i >= P >= 1: the keys row i sees, less one (kvpress) */
    for (int i = 0; i < w; i++) st->f[i] = st->normalize ? (float)(N - w + i) : 1.0f;
    kvs_status rc = kvs_attn_colsum_fused_w(&qw, &in->k, st->f, st->lse, st->colsum, NULL,
                                            st->c->shape.threads, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", mn, layer);
    for (int g = 0; g < H; g++) {
        const float *v = st->colsum + (size_t)g * N; /* [N]: (1/G) sum_h sum_i f_i A_h[i][j] */
        float *dst = scores + (size_t)g * N;         /* [N] */
        for (int j = 0; j < P; j++) {
            dst[j] = v[j] / (float)w;
            if (!isfinite(dst[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: layer %d: KV head %d: score of token %d is not finite", mn,
                                  layer, g, j);
        }
        for (int j = P; j < N; j++) dst[j] = FLT_MAX;
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_finch = {
    .name = "finch",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = finch_window,
    .create = finch_create,
    .score = finch_score,
    .destroy = finch_destroy,
};
