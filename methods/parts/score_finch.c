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
 * Cost Hq * w * N * d multiply-adds (one pass, double accumulation, one
 * thread); scratch [N][d] floats (one KV head's keys) and 2 N doubles.
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
    float *krows;  /* [N][d] one KV head's keys in fp32 */
    float *qrow;   /* [d] */
    double *logit; /* [N] */
    double *acc;   /* [N] */
} finch_state;

static int finch_window(const kvs_method *m, const kvs_params *p, int N) {
    int w = (int)kvs_part_param(m, p, "window", 32);
    if (w < 1) w = 1;
    return w < N ? w : N;
}

static void finch_destroy(void *state) {
    finch_state *st = state;
    if (!st) return;
    free(st->krows);
    free(st->qrow);
    free(st->logit);
    free(st->acc);
    free(st);
}

static kvs_status finch_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    finch_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim;
    st->c = c;
    st->w = finch_window(c->m, c->p, c->shape.n_tokens);
    st->normalize = kvs_part_param(c->m, c->p, "normalize_scores", 1) != 0;
    st->krows = malloc(sizeof(float) * N * d);
    st->qrow = malloc(sizeof(float) * d);
    st->logit = malloc(sizeof(double) * N);
    st->acc = malloc(sizeof(double) * N);
    if (!st->krows || !st->qrow || !st->logit || !st->acc) {
        finch_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [N=%zu][d=%zu] keys", N, d);
    }
    *state = st;
    return KVS_OK;
}

/* Adds f * A[j] for the context keys j < P of one query row at position p:
 * A is the softmax of q . k_j / sqrt(d) over j <= p. */
static void add_row(const finch_state *st, const float *q, int p, int P, double f) {
    const int d = st->c->shape.head_dim;
    const double scale = 1.0 / sqrt((double)d);
    double mx = -INFINITY;
    for (int j = 0; j <= p; j++) {
        const float *k = st->krows + (size_t)j * d;
        double s = 0.0;
        for (int c = 0; c < d; c++) s += (double)q[c] * k[c];
        st->logit[j] = s * scale;
        if (st->logit[j] > mx) mx = st->logit[j];
    }
    double z = 0.0;
    for (int j = 0; j <= p; j++) z += exp(st->logit[j] - mx);
    const double g = f / z;
    for (int j = 0; j < P && j <= p; j++) st->acc[j] += g * exp(st->logit[j] - mx);
}

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
    const int G = Hq / H, Nq = in->q.n_tokens;
    for (int g = 0; g < H; g++) {
        float *dst = scores + (size_t)g * N; /* [N] */
        for (int j = 0; j < P; j++) st->acc[j] = 0.0;
        kvs_view_rows_f32(&in->k, g, 0, N, st->krows);
        for (int h = g * G; h < (g + 1) * G; h++)
            for (int i = 0; i < w; i++) {
                const int p = N - w + i;
                kvs_view_rows_f32(&in->q, h, Nq - w + i, 1, st->qrow);
                add_row(st, st->qrow, p, P, st->normalize ? (double)p : 1.0);
            }
        for (int j = 0; j < P; j++) {
            dst[j] = (float)(st->acc[j] / ((double)G * w));
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
