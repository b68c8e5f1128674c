/*
 * score_lagkv.c -- scorer `lagkv`: attention-free lag-relative statistics.
 *
 * Paper: LagKV, arXiv 2504.04704; code: kvpress LagKVPress
 * (kvpress/presses/lagkv_press.py, read at commit 08a43bf).
 * Formula, per layer and KV head, with s sinks and partitions of lag L:
 *   N < s + 2L: nothing is scored by statistics: sinks 1, token j >= s
 *   (j - s) / (N - s) (the newest kept first).
 *   Otherwise the tokens [s, e), e = s + floor((N - s) / L) L, form P
 *   partitions of L; the last one and the remainder [e - L, N) are the tail
 *   (score 1, kept first with the sinks). Token t of partition p < P - 1 is
 *   scored against partition p + 1 (its "lag" reference): per channel c,
 *   x_c = (K[t][c] - min_c) / (max_c - min_c) with min / max over the
 *   reference's L tokens; sigma_t = the standard deviation of x over the d
 *   channels (unbiased, as torch.std); a softmax of sigma over the L tokens
 *   of the partition; the same for V; the mean of the two. Without
 *   cross_scoring (default) a token's score is its rank within its partition
 *   divided by L (so every partition keeps about the same share); with it,
 *   the mean softmax itself. Higher = keep.
 * Parameters: sinks (int, absent 0; kvpress's n_sink 4 is this part's
 * declared default), lag (int >= 1, 128 = kvpress's lag_size),
 * cross_scoring (bool, false).
 * Decisions where kvpress is silent or undefined:
 *   - A channel whose reference is constant (max = min) divides 0 by 0 in
 *     kvpress (NaN); here it contributes x = 0.
 *   - d = 1: torch.std of one value is NaN; here sigma = 0.
 *   - Ties of the rank (equal mean softmax) go to the lower index first
 *     (the later token ranks higher); torch's argsort leaves them open.
 *   - Sinks and the tail score 1 as in kvpress; the pick rule keeps them
 *     first (ties: lower index), whatever keep rules the composition has.
 * Reads K and V only. Memory [N][d] floats for K and V rows, [L] doubles.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kvs_part_ctx *c;
    float *krows, *vrows;   /* [N][d] */
    double *sk, *sv, *tmp;  /* [N], [N], [L] */
    double *lo, *hi;        /* [d] */
    int32_t *order;         /* [L] */
} lag_state;

static void lag_destroy(void *state) {
    lag_state *st = state;
    if (!st) return;
    free(st->krows);
    free(st->vrows);
    free(st->sk);
    free(st->sv);
    free(st->tmp);
    free(st->lo);
    free(st->hi);
    free(st->order);
    free(st);
}

static kvs_status lag_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim;
    lag_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->krows = malloc(sizeof(float) * N * d);
    st->vrows = malloc(sizeof(float) * N * d);
    st->sk = malloc(sizeof(double) * N);
    st->sv = malloc(sizeof(double) * N);
    st->tmp = malloc(sizeof(double) * N);
    st->lo = malloc(sizeof(double) * d);
    st->hi = malloc(sizeof(double) * d);
    st->order = malloc(sizeof(int32_t) * N);
    if (!st->krows || !st->vrows || !st->sk || !st->sv || !st->tmp || !st->lo || !st->hi ||
        !st->order) {
        lag_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [N=%zu][d=%zu] rows", N, d);
    }
    *state = st;
    return KVS_OK;
}

/* The softmax over a partition [a, a + L) of the sigma of each token, with
 * partition [a + L, a + 2L) as the reference; rows [N][d]; out [N]. */
static void partition_score(lag_state *st, const float *rows, int d, int a, int L, double *out) {
    for (int c = 0; c < d; c++) st->lo[c] = INFINITY, st->hi[c] = -INFINITY;
    for (int t = a + L; t < a + 2 * L; t++)
        for (int c = 0; c < d; c++) {
            const double x = rows[(size_t)t * d + c];
            if (x < st->lo[c]) st->lo[c] = x;
            if (x > st->hi[c]) st->hi[c] = x;
        }
    double mx = -INFINITY;
    for (int t = a; t < a + L; t++) {
        double sum = 0.0, sq = 0.0;
        for (int c = 0; c < d; c++) {
            const double r = st->hi[c] - st->lo[c];
            const double x = r > 0 ? (rows[(size_t)t * d + c] - st->lo[c]) / r : 0.0;
            sum += x;
            sq += x * x;
        }
        double var = d > 1 ? (sq - sum * sum / d) / (d - 1) : 0.0;
        if (var < 0) var = 0; /* rounding of sq - sum^2 / d */
        out[t] = sqrt(var);
        if (out[t] > mx) mx = out[t];
    }
    double z = 0.0;
    for (int t = a; t < a + L; t++) z += (out[t] = exp(out[t] - mx));
    for (int t = a; t < a + L; t++) out[t] /= z;
}

static kvs_status lag_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)layer;
    (void)err;
    lag_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, d = c->shape.head_dim;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    const int L = (int)kvs_part_param(c->m, c->p, "lag", 128);
    const int cross = kvs_part_param(c->m, c->p, "cross_scoring", 0) != 0.0;
    if (s > N) s = N;
    for (int h = 0; h < H; h++) {
        float *row = scores + (size_t)h * N; /* [N] */
        for (int j = 0; j < s; j++) row[j] = 1.0f;
        if (N < s + 2 * L) {
            for (int j = s; j < N; j++) row[j] = (float)((double)(j - s) / (double)(N - s));
            continue;
        }
        const int e = s + ((N - s) / L) * L, P = (e - s) / L;
        kvs_view_rows_f32(&in->k, h, 0, N, st->krows);
        kvs_view_rows_f32(&in->v, h, 0, N, st->vrows);
        for (int p = 0; p + 1 < P; p++) {
            const int a = s + p * L;
            partition_score(st, st->krows, d, a, L, st->sk);
            partition_score(st, st->vrows, d, a, L, st->sv);
            for (int t = a; t < a + L; t++) st->tmp[t] = (st->sk[t] + st->sv[t]) / 2;
            if (cross) {
                for (int t = a; t < a + L; t++) row[t] = (float)st->tmp[t];
                continue;
            }
            /* rank within the partition: ties to the lower index first, an
             * insertion sort of L indices (L is small: 128 by default) */
            for (int i = 0; i < L; i++) {
                int j = i;
                while (j > 0 && st->tmp[a + st->order[j - 1]] > st->tmp[a + i]) {
                    st->order[j] = st->order[j - 1];
                    j--;
                }
                st->order[j] = i;
            }
            for (int r = 0; r < L; r++) row[a + st->order[r]] = (float)((double)r / L);
        }
        for (int j = e - L; j < N; j++) row[j] = 1.0f; /* the tail: the last partition + rest */
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_lagkv = {
    .name = "lagkv",
    .needs = 0,
    .queries_wanted = NULL,
    .create = lag_create,
    .score = lag_score,
    .destroy = lag_destroy,
};
