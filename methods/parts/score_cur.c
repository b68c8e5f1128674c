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
 * Reads K and V only. Cost one pass over K and V: the squared norms in one
 * parallel run per layer over units of 256 rows of one head and K|V on the
 * shape's threads (rows converted in tiles of 64; squares summed in double
 * in kvs_part_sumsq_f64's lane order), then the windows and the product per
 * head in token order; the result does not depend on the thread count.
 * Memory [T][64][d] floats, 2 [Hkv][N] doubles.
 */
#include "kvs_parts.h"

#include <stdlib.h>

enum { CUR_TILE = 64, CUR_UNIT = 256 }; /* rows per tile, rows per parallel unit */

typedef struct {
    const kvs_part_ctx *c;
    int T;           /* workers */
    float *rows;     /* [T][CUR_TILE][d] */
    double *k2, *v2; /* [Hkv][N] */
} cur_state;

typedef struct {
    cur_state *st;
    const kvs_layer *in;
    int per_head; /* units per head */
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
    const size_t H = (size_t)c->shape.n_kv_heads;
    cur_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->T = kvs_parallel_threads(c->shape.threads, 64);
    st->rows = malloc(sizeof(float) * (size_t)st->T * CUR_TILE * d);
    st->k2 = malloc(sizeof(double) * H * N);
    st->v2 = malloc(sizeof(double) * H * N);
    if (!st->rows || !st->k2 || !st->v2) {
        cur_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [Hkv=%zu][N=%zu] norms", H, N);
    }
    *state = st;
    return KVS_OK;
}

/* Unit u: squared norms of rows [n0, n0 + CUR_UNIT) of head (u / 2) /
 * per_head, of K (u even) or V. */
static kvs_status cur_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const cur_job *j = job;
    cur_state *st = j->st;
    const kvs_view *x = u % 2 ? &j->in->v : &j->in->k;
    const int N = x->n_tokens, d = x->head_dim, h = (u / 2) / j->per_head;
    const int n0 = ((u / 2) % j->per_head) * CUR_UNIT, n1 = n0 + CUR_UNIT < N ? n0 + CUR_UNIT : N;
    float *rows = st->rows + (size_t)tid * CUR_TILE * d;
    double *out = (u % 2 ? st->v2 : st->k2) + (size_t)h * N;
    for (int t0 = n0; t0 < n1; t0 += CUR_TILE) {
        const int cnt = n1 - t0 < CUR_TILE ? n1 - t0 : CUR_TILE;
        kvs_view_rows_f32(x, h, t0, cnt, rows);
        for (int i = 0; i < cnt; i++) out[t0 + i] = kvs_part_sumsq_f64(rows + (size_t)i * d, d);
    }
    return KVS_OK;
}

/* The local normalisation of out [N] by windows of w (w = 0: none). */
static void local_norm(double *out, int N, int w) {
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
    cur_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    const int type = (int)kvs_part_param(c->m, c->p, "leverage_type", 0);
    const int w = (int)kvs_part_param(c->m, c->p, "local_window", 16);
    if (s > N) s = N;
    cur_job job = {st, in, (N + CUR_UNIT - 1) / CUR_UNIT};
    kvs_status rc = kvs_parallel_run(&job, cur_unit, 2 * H * job.per_head, st->T, "cur", err);
    if (rc) return rc;
    for (int h = 0; h < H; h++) {
        float *row = scores + (size_t)h * N; /* [N] */
        double *k2 = st->k2 + (size_t)h * N, *v2 = st->v2 + (size_t)h * N;
        local_norm(k2, N, w);
        local_norm(v2, N, w);
        double z = 0.0;
        for (int j = 0; j < N; j++) {
            const double a = k2[j], b = v2[j];
            k2[j] = type == 1 ? a : type == 2 ? b : type == 3 ? (a + b) / 2 : a * b;
            z += k2[j];
        }
        for (int j = 0; j < N; j++) row[j] = z > 0 ? (float)(k2[j] / z) : 0.0f;
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
