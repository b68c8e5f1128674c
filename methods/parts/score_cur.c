/*
 * score_cur.c -- scorer `cur`: CurDKV's leverage-style scores from the
 * squared norms of keys and values (no attention, no queries).
 *
 * Paper: CurDKV, arXiv 2509.15038; code read: kvpress CURPress
 * (kvpress/presses/cur_press.py, kvpress 0.5.5 wheel).
 * Formula, per layer and KV head, with w = local_window:
 *   k2_j = ||k_j||^2, v2_j = ||v_j||^2;
 *   w > 0 (the local approximation, default): the tokens are cut into
 *   windows of w from token 0 (the last one shorter) and each value is
 *   divided by the sum over its window;
 *   then by leverage_type: kv_product (default) k2 v2, key k2, value v2,
 *   kv_avg (k2 + v2) / 2; the result is divided by its sum over the head's
 *   tokens, and the first `sinks` tokens score 1 (kept first).
 * Parameters: sinks (int, absent 0; kvpress's num_sinks 4 is the preset's),
 * leverage_type (enum kv_product|key|value|kv_avg, kv_product),
 * local_window (int >= 0, 16; 0 = no local approximation).
 * Decisions where kvpress is undefined or not followed:
 *   - a window (or a head) whose sum is 0 divides 0 by 0 in kvpress (NaN);
 *     here its tokens get 0;
 *   - kvpress's use_random_leverage (a Gaussian projection of K and V to
 *     20 columns, unseeded, off by default) is not offered.
 * Reads K and V only. Cost one pass over K and V, all layers in one parallel
 * run (score_layers) over (layer, KV head) units on the shape's threads:
 * rows converted in tiles of 64, squares summed in double in
 * kvs_part_sumsq_f64's lane order, then the windows and the product in token
 * order; the result does not depend on the thread count. Memory per worker
 * [64][d] floats and 2 [N] doubles.
 */
#include "kvs_parts.h"

#include <stdlib.h>

enum { CUR_TILE = 64 }; /* rows per tile */

typedef struct {
    const kvs_part_ctx *c;
    int T;           /* workers */
    float *rows;     /* [T][CUR_TILE][d] */
    double *k2, *v2; /* [T][N] */
} cur_state;

typedef struct {
    cur_state *st;
    const kvs_layer *in; /* [n_layers] */
    float *scores;       /* [n_layers][Hkv][N] */
    int s, type, w;      /* sinks, leverage_type, local_window */
} cur_job;

static void cur_destroy(void *state) {
    cur_state *st = state;
    if (!st) return;
    free(st->rows);
    free(st->k2);
    free(st->v2);
    free(st);
}

static kvs_status cur_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim;
    cur_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->T = kvs_parallel_threads(c->shape.threads, 64);
    const size_t T = (size_t)st->T;
    st->rows = malloc(sizeof(float) * T * CUR_TILE * d);
    st->k2 = malloc(sizeof(double) * T * N);
    st->v2 = malloc(sizeof(double) * T * N);
    if (!st->rows || !st->k2 || !st->v2) {
        cur_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [T=%zu][N=%zu] norms", T, N);
    }
    *state = st;
    return KVS_OK;
}

/* Squared row norms of head h of view x into out [N] (tiles of CUR_TILE rows
 * in rows), then the local normalisation by windows of w (w = 0: none). */
static void sq_norms(const kvs_view *x, int h, int w, float *rows, double *out) {
    const int N = x->n_tokens, d = x->head_dim;
    for (int t0 = 0; t0 < N; t0 += CUR_TILE) {
        const int cnt = N - t0 < CUR_TILE ? N - t0 : CUR_TILE;
        kvs_view_rows_f32(x, h, t0, cnt, rows);
        for (int i = 0; i < cnt; i++) out[t0 + i] = kvs_part_sumsq_f64(rows + (size_t)i * d, d);
    }
    if (w <= 0) return;
    for (int a = 0; a < N; a += w) {
        const int e = a + w < N ? a + w : N;
        double z = 0.0;
        for (int j = a; j < e; j++) z += out[j];
        for (int j = a; j < e; j++) out[j] = z > 0 ? out[j] / z : 0.0;
    }
}

/* Unit u: (layer, KV head) u / Hkv, u % Hkv, whole. */
static kvs_status cur_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const cur_job *j = job;
    cur_state *st = j->st;
    const int N = st->c->shape.n_tokens, d = st->c->shape.head_dim, H = st->c->shape.n_kv_heads;
    const int l = u / H, h = u % H;
    float *rows = st->rows + (size_t)tid * CUR_TILE * d, *row = j->scores + (size_t)u * N; /* [N] */
    double *k2 = st->k2 + (size_t)tid * N, *v2 = st->v2 + (size_t)tid * N;
    sq_norms(&j->in[l].k, h, j->w, rows, k2);
    sq_norms(&j->in[l].v, h, j->w, rows, v2);
    double z = 0.0;
    for (int t = 0; t < N; t++) {
        const double a = k2[t], b = v2[t];
        k2[t] = j->type == 1 ? a : j->type == 2 ? b : j->type == 3 ? (a + b) / 2 : a * b;
        z += k2[t];
    }
    for (int t = 0; t < N; t++) row[t] = z > 0 ? (float)(k2[t] / z) : 0.0f;
    for (int t = 0; t < j->s; t++) row[t] = 1.0f;
    return KVS_OK;
}

static kvs_status cur_layers(void *state, const kvs_layer *in, int n_layers, float *scores,
                             kvs_err *err) {
    cur_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    if (s > N) s = N;
    cur_job j = {st, in, scores, s, (int)kvs_part_param(c->m, c->p, "leverage_type", 0),
                 (int)kvs_part_param(c->m, c->p, "local_window", 16)};
    return kvs_parallel_run(&j, cur_unit, n_layers * H, st->T, "cur", err);
}

static kvs_status cur_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)layer;
    return cur_layers(state, in, 1, scores, err);
}

const kvs_scorer kvs_scorer_cur = {
    .name = "cur",
    .needs = 0,
    .queries_wanted = NULL,
    .create = cur_create,
    .score = cur_score,
    .destroy = cur_destroy,
    .score_layers = cur_layers,
};
