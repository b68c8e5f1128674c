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
 * Reads K and V only; sums in double. Memory [N][d] floats, 2 [N] doubles.
 */
#include "kvs_parts.h"

#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    float *rows;      /* [N][d] */
    double *k2, *v2;  /* [N] */
} cur_state;

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
    st->rows = malloc(sizeof(float) * N * d);
    st->k2 = malloc(sizeof(double) * N);
    st->v2 = malloc(sizeof(double) * N);
    if (!st->rows || !st->k2 || !st->v2) {
        cur_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [N=%zu][d=%zu] rows", N, d);
    }
    *state = st;
    return KVS_OK;
}

/* Squared row norms of head h of view x into out [N], then the local
 * normalisation by windows of w (w = 0: none). */
static void sq_norms(cur_state *st, const kvs_view *x, int h, int N, int d, int w, double *out) {
    kvs_view_rows_f32(x, h, 0, N, st->rows);
    for (int j = 0; j < N; j++) {
        double s = 0.0;
        const float *r = st->rows + (size_t)j * d;
        for (int c = 0; c < d; c++) s += (double)r[c] * r[c];
        out[j] = s;
    }
    if (w <= 0) return;
    for (int a = 0; a < N; a += w) {
        const int e = a + w < N ? a + w : N;
        double z = 0.0;
        for (int j = a; j < e; j++) z += out[j];
        for (int j = a; j < e; j++) out[j] = z > 0 ? out[j] / z : 0.0;
    }
}

static kvs_status cur_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)layer;
    (void)err;
    cur_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, d = c->shape.head_dim;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    const int type = (int)kvs_part_param(c->m, c->p, "leverage_type", 0);
    const int w = (int)kvs_part_param(c->m, c->p, "local_window", 16);
    if (s > N) s = N;
    for (int h = 0; h < H; h++) {
        float *row = scores + (size_t)h * N; /* [N] */
        sq_norms(st, &in->k, h, N, d, w, st->k2);
        sq_norms(st, &in->v, h, N, d, w, st->v2);
        double z = 0.0;
        for (int j = 0; j < N; j++) {
            const double a = st->k2[j], b = st->v2[j];
            st->k2[j] = type == 1 ? a : type == 2 ? b : type == 3 ? (a + b) / 2 : a * b;
            z += st->k2[j];
        }
        for (int j = 0; j < N; j++) row[j] = z > 0 ? (float)(st->k2[j] / z) : 0.0f;
        for (int j = 0; j < s; j++) row[j] = 1.0f;
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_cur = {
    .name = "cur",
    .needs = 0,
    .queries_wanted = NULL,
    .create = cur_create,
    .score = cur_score,
    .destroy = cur_destroy,
};
