/*
 * score_expected_attention.c -- scorer `expected_attention`: the attention
 * future queries are expected to pay, from the statistics of the queries.
 *
 * Paper: "Expected Attention", arXiv 2510.00636; code: kvpress
 * ExpectedAttentionPress (NVIDIA/kvpress, kvpress/presses/
 * expected_attention_press.py, read at commit 08a43bf).
 * Formula, per layer, query head i (KV head h = i / G), with s the sink
 * count: the queries q_r of the rows used (below) give the mean mu and the
 * covariance S = mean_r (q_r - mu)(q_r - mu)^T (population, d x d). Under a
 * Gaussian query, E[exp(q.k / sqrt d)] = exp(mu.k / sqrt d + k^T S k / (2d)),
 * so key j >= s gets the logit
 *   z_j = mu.k_j / sqrt(d) + [use_covariance] k_j^T S k_j / (2 d),
 * the softmax over j >= s gives a_ij, the score is the mean of a_ij over
 * the G query heads of h, then [use_vnorm] (score + epsilon) * ||v_j||_2.
 * Sink keys j < s get the largest score of their head (kept first by any
 * pick, as kvpress pads them with the maximum).
 * Parameters: sinks (int, the s above; absent 0; the preset's 4 is
 * kvpress's n_sink), use_covariance (bool, true), use_vnorm (bool, true),
 * epsilon (float >= 0, 0 as kvpress at that commit).
 * Rows used: every query row the cache holds (queries_wanted = N; with
 * fewer recorded rows Nq, the last Nq prompt positions), minus the rows at
 * positions < s (kvpress drops the first n_sink hidden states); if that
 * leaves none, all Nq rows.
 * Decisions where we differ from kvpress:
 *   - kvpress projects the PRE-RoPE hidden states with W_q, then rotates
 *     mu and S by the RoPE matrix averaged over the next n_future_positions
 *     (512) positions. The cache view carries POST-RoPE queries and no RoPE
 *     frequencies, so we take the statistics of the post-RoPE queries as
 *     they are: the recent queries, each rotated to its own position, stand
 *     for the future ones. No n_future_positions parameter. (With a RoPE
 *     model the average rotation shrinks the fast-rotating pairs of mu;
 *     ours keeps them as observed.)
 *   - Statistics per query head from the query rows, in double; kvpress
 *     computes the hidden-state covariance and projects it (the same
 *     population covariance of W_q h, up to rounding).
 *   - Sinks get their head's maximum, not the maximum over all heads (the
 *     picks are per KV head, so only the head's order matters).
 *   - Models with QK-norm (Qwen3, Gemma 3), which kvpress refuses: the
 *     queries the view carries are already normalised, so nothing is
 *     refused here.
 * Cost per layer: Hq (n d^2 / 2 + N d^2) multiply-adds for the covariance
 * and the quadratic form (N d without it), both through BLAS in fp32
 * (ssyrk of the centred rows, then ssymm K S and a row-wise dot in double):
 * the scalar double loops took 1.4 s a request at Gemma 3's d = 256 and
 * N = 1536 (experiments/methods.lua). Memory [Nq][d] + 2 [N][d] floats,
 * [d][d] floats, [H][N] doubles.
 */
#include "kvs_parts.h"

#include <cblas.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kvs_part_ctx *c;
    float *qrows, *krows, *vrows; /* [N][d] each (q: the used rows, centred) */
    float *kS;                    /* [N][d]: K S */
    float *cov;                   /* [d][d] */
    double *mu, *z, *acc;         /* [d], [N], [H][N] */
} ea_state;

static int ea_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m;
    (void)p;
    return N;
}

static void ea_destroy(void *state) {
    ea_state *st = state;
    if (!st) return;
    free(st->qrows);
    free(st->krows);
    free(st->vrows);
    free(st->mu);
    free(st->cov);
    free(st->z);
    free(st->acc);
    free(st->kS);
    free(st);
}

static kvs_status ea_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim,
                 H = (size_t)c->shape.n_kv_heads;
    ea_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->qrows = malloc(sizeof(float) * N * d);
    st->krows = malloc(sizeof(float) * N * d);
    st->vrows = malloc(sizeof(float) * N * d);
    st->mu = malloc(sizeof(double) * d);
    st->cov = malloc(sizeof(float) * d * d);
    st->z = malloc(sizeof(double) * N);
    st->acc = malloc(sizeof(double) * H * N);
    st->kS = malloc(sizeof(float) * N * d);
    if (!st->qrows || !st->krows || !st->vrows || !st->mu || !st->cov || !st->z || !st->acc ||
        !st->kS) {
        ea_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [N=%zu][d=%zu] rows", N, d);
    }
    *state = st;
    return KVS_OK;
}

/* mu of n rows [n][d] (in double); with cov, the rows are centred in place
 * and S [d][d] (full, symmetric) is their population covariance. */
static void stats(float *rows, int n, int d, int cov, double *mu, float *S) {
    for (int c = 0; c < d; c++) mu[c] = 0.0;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < d; c++) mu[c] += rows[(size_t)r * d + c];
    for (int c = 0; c < d; c++) mu[c] /= n;
    if (!cov) return;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < d; c++) rows[(size_t)r * d + c] = (float)(rows[(size_t)r * d + c] - mu[c]);
    /* S = X' X / n: the upper triangle, then mirrored */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, d, n, 1.0f / (float)n, rows, d, 0.0f, S, d);
    for (int a = 0; a < d; a++)
        for (int b = 0; b < a; b++) S[(size_t)a * d + b] = S[(size_t)b * d + a];
}

static kvs_status ea_score(void *state, int layer, const kvs_layer *in, float *scores,
                           kvs_err *err) {
    ea_state *st = state;
    const kvs_part_ctx *c = st->c;
    const char *mn = c->m->name;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, Hq = c->shape.n_q_heads,
              d = c->shape.head_dim;
    if (!in->q.data || in->q.n_tokens < 1 || in->q.n_heads != Hq || Hq < H)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: expected_attention needs recorded queries (Nq >= 1, "
                          "Hq = %d) but got Nq=%d",
                          mn, layer, Hq, in->q.data ? in->q.n_tokens : 0);
    const int G = Hq / H, Nq = in->q.n_tokens;
    const int use_cov = kvs_part_param(c->m, c->p, "use_covariance", 1) != 0.0;
    const int use_vnorm = kvs_part_param(c->m, c->p, "use_vnorm", 1) != 0.0;
    const double eps = kvs_part_param(c->m, c->p, "epsilon", 0.0);
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    if (s > N - 1) s = N - 1; /* at least one key in the softmax */
    if (s < 0) s = 0;
    int r0 = s - (N - Nq); /* first row at a position >= s */
    if (r0 < 0) r0 = 0;
    if (r0 >= Nq) r0 = 0;
    const int n = Nq - r0;
    const double isd = 1.0 / sqrt((double)d);
    memset(st->acc, 0, sizeof(double) * (size_t)H * (size_t)N);
    for (int h = 0; h < H; h++) {
        kvs_view_rows_f32(&in->k, h, 0, N, st->krows);
        for (int g = 0; g < G; g++) {
            const int qi = h * G + g;
            kvs_view_rows_f32(&in->q, qi, r0, n, st->qrows);
            stats(st->qrows, n, d, use_cov, st->mu, st->cov);
            if (use_cov) /* kS = K[s:] S, rows s.. of [N][d] */
                cblas_ssymm(CblasRowMajor, CblasRight, CblasUpper, N - s, d, 1.0f, st->cov, d,
                            st->krows + (size_t)s * d, d, 0.0f, st->kS + (size_t)s * d, d);
            double zmax = -INFINITY;
            for (int j = s; j < N; j++) {
                const float *k = st->krows + (size_t)j * d;
                double dot = 0.0, quad = 0.0;
                for (int a = 0; a < d; a++) dot += st->mu[a] * k[a];
                if (use_cov) {
                    const float *ks = st->kS + (size_t)j * d;
                    for (int a = 0; a < d; a++) quad += (double)ks[a] * k[a];
                }
                st->z[j] = dot * isd + quad / (2.0 * d);
                if (st->z[j] > zmax) zmax = st->z[j];
            }
            double sum = 0.0;
            for (int j = s; j < N; j++) sum += (st->z[j] = exp(st->z[j] - zmax));
            double *acc = st->acc + (size_t)h * N;
            for (int j = s; j < N; j++) acc[j] += st->z[j] / sum / G;
        }
    }
    for (int h = 0; h < H; h++) {
        double *acc = st->acc + (size_t)h * N;
        if (use_vnorm) {
            kvs_view_rows_f32(&in->v, h, 0, N, st->vrows);
            for (int j = s; j < N; j++) {
                const float *v = st->vrows + (size_t)j * d;
                double vv = 0.0;
                for (int a = 0; a < d; a++) vv += (double)v[a] * v[a];
                acc[j] = (acc[j] + eps) * sqrt(vv);
            }
        }
        double mx = -INFINITY;
        for (int j = s; j < N; j++) mx = acc[j] > mx ? acc[j] : mx;
        for (int j = 0; j < s; j++) acc[j] = mx;
        float *row = scores + (size_t)h * N;
        for (int j = 0; j < N; j++) {
            row[j] = (float)acc[j];
            if (!isfinite(row[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: layer %d: KV head %d: token %d: expected attention is not "
                                  "finite",
                                  mn, layer, h, j);
        }
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_expected_attention = {
    .name = "expected_attention",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = ea_queries,
    .create = ea_create,
    .score = ea_score,
    .destroy = ea_destroy,
};
