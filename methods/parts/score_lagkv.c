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
 * Reads K and V only. Cost: one parallel run per layer over the (KV head,
 * partition) units on the shape's threads, each converting its partition
 * and the reference (2L rows of K and of V) to fp32; per channel the
 * reciprocal of the reference's range is taken once (x = (K - min) * inv,
 * not a division per element), and the sums of x and x^2 over the channels
 * run in 4 lanes (AVX where built with it, the same order without): the
 * result does not depend on the thread count or the build. Memory per
 * worker [2L][d] floats for K and V, [d] and [L] doubles.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

typedef struct {
    const kvs_part_ctx *c;
    int T, R;              /* workers; rows per worker buffer, min(2 lag, N) */
    float *krows, *vrows;  /* [T][R][d] a partition and its reference */
    double *lo, *inv;      /* [T][d] */
    double *sk, *sv;       /* [T][lag] */
} lag_state;

typedef struct {
    lag_state *st;
    const kvs_layer *in;
    float *scores; /* [Hkv][N] */
    int s, L, P, cross;
} lag_job;

static void lag_destroy(void *state) {
    lag_state *st = state;
    if (!st) return;
    free(st->krows);
    free(st->vrows);
    free(st->lo);
    free(st->inv);
    free(st->sk);
    free(st->sv);
    free(st);
}

static kvs_status lag_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim;
    lag_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    const double lag = kvs_part_param(c->m, c->p, "lag", 128);
    const size_t L = lag < 1 ? 1 : lag > (double)N ? N : (size_t)lag;
    st->R = (int)(2 * L < N ? 2 * L : N);
    st->T = kvs_parallel_threads(c->shape.threads, 64);
    const size_t T = (size_t)st->T;
    st->krows = malloc(sizeof(float) * T * (size_t)st->R * d);
    st->vrows = malloc(sizeof(float) * T * (size_t)st->R * d);
    st->lo = malloc(sizeof(double) * T * d);
    st->inv = malloc(sizeof(double) * T * d);
    st->sk = malloc(sizeof(double) * T * L);
    st->sv = malloc(sizeof(double) * T * L);
    if (!st->krows || !st->vrows || !st->lo || !st->inv || !st->sk ||
        !st->sv) {
        lag_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [T=%zu][R=%d][d=%zu] rows", T,
                          st->R, d);
    }
    *state = st;
    return KVS_OK;
}

/* The reference's channel ranges: lo[c] and inv[c] = 1 / (max - min) over
 * rows [L, 2L) (0 for a constant channel: it contributes x = 0). Min / max
 * are exact in fp32; 8 channels at a time kept in registers over the rows. */
static void ref_range(const float *restrict rows, int d, int L, double *restrict lo,
                      double *restrict inv) {
    const float *ref = rows + (size_t)L * d;
    int c = 0;
#if defined(__AVX__)
    for (; c + 8 <= d; c += 8) {
        __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
        for (int t = 0; t < L; t++) {
            const __m256 x = _mm256_loadu_ps(ref + (size_t)t * d + c);
            mn = _mm256_min_ps(x, mn); /* x < mn ? x : mn, as the scalar loop */
            mx = _mm256_max_ps(x, mx);
        }
        float a[8], b[8];
        _mm256_storeu_ps(a, mn);
        _mm256_storeu_ps(b, mx);
        for (int k = 0; k < 8; k++) {
            const double r = (double)b[k] - (double)a[k];
            lo[c + k] = a[k];
            inv[c + k] = r > 0 ? 1.0 / r : 0.0;
        }
    }
#endif
    for (; c < d; c++) {
        float mn = INFINITY, mx = -INFINITY;
        for (int t = 0; t < L; t++) {
            const float x = ref[(size_t)t * d + c];
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
        }
        const double r = (double)mx - (double)mn;
        lo[c] = mn;
        inv[c] = r > 0 ? 1.0 / r : 0.0;
    }
}

/* The softmax over a partition rows [0, L) of the sigma of each token, with
 * rows [L, 2L) as the reference; rows [2L][d]; out [L]; worker tid's
 * scratch. x_c = (K[t][c] - lo_c) inv_c; the sums of x and x^2 in 4 lanes
 * (channel c in lane c mod 4), combined (l0 + l2) + (l1 + l3). */
static void partition_score(lag_state *st, int tid, const float *restrict rows, int d, int L,
                            double *restrict out) {
    double *restrict lo = st->lo + (size_t)tid * d, *restrict inv = st->inv + (size_t)tid * d;
    ref_range(rows, d, L, lo, inv);
    double mx = -INFINITY;
    for (int t = 0; t < L; t++) {
        const float *r = rows + (size_t)t * d;
        double s4[4] = {0}, q4[4] = {0};
        int c = 0;
#if defined(__AVX__)
        __m256d vs = _mm256_setzero_pd(), vq = _mm256_setzero_pd();
        for (; c + 4 <= d; c += 4) {
            const __m256d x = _mm256_mul_pd(
                _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(r + c)), _mm256_loadu_pd(lo + c)),
                _mm256_loadu_pd(inv + c));
            vs = _mm256_add_pd(vs, x);
            vq = _mm256_add_pd(vq, _mm256_mul_pd(x, x));
        }
        _mm256_storeu_pd(s4, vs);
        _mm256_storeu_pd(q4, vq);
#endif
        for (; c + 4 <= d; c += 4)
            for (int k = 0; k < 4; k++) {
                const double x = ((double)r[c + k] - lo[c + k]) * inv[c + k];
                s4[k] += x;
                q4[k] += x * x;
            }
        for (; c < d; c++) {
            const double x = ((double)r[c] - lo[c]) * inv[c];
            s4[c % 4] += x;
            q4[c % 4] += x * x;
        }
        const double sum = (s4[0] + s4[2]) + (s4[1] + s4[3]), sq = (q4[0] + q4[2]) + (q4[1] + q4[3]);
        double var = d > 1 ? (sq - sum * sum / d) / (d - 1) : 0.0;
        if (var < 0) var = 0; /* rounding of sq - sum^2 / d */
        out[t] = sqrt(var);
        if (out[t] > mx) mx = out[t];
    }
    double z = 0.0;
    for (int t = 0; t < L; t++) z += (out[t] = exp(out[t] - mx));
    for (int t = 0; t < L; t++) out[t] /= z;
}

/* Unit u: partition p = u % (P - 1) of head u / (P - 1). */
static kvs_status lag_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const lag_job *j = job;
    lag_state *st = j->st;
    const int N = j->in->k.n_tokens, d = j->in->k.head_dim, L = j->L;
    const int h = u / (j->P - 1), a = j->s + (u % (j->P - 1)) * L;
    float *kr = st->krows + (size_t)tid * st->R * d, *vr = st->vrows + (size_t)tid * st->R * d;
    double *sk = st->sk + (size_t)tid * L, *sv = st->sv + (size_t)tid * L;
    float *row = j->scores + (size_t)h * N; /* [N] */
    kvs_view_rows_f32(&j->in->k, h, a, 2 * L, kr);
    kvs_view_rows_f32(&j->in->v, h, a, 2 * L, vr);
    partition_score(st, tid, kr, d, L, sk);
    partition_score(st, tid, vr, d, L, sv);
    for (int t = 0; t < L; t++) sk[t] = (sk[t] + sv[t]) / 2;
    if (j->cross) {
        for (int t = 0; t < L; t++) row[a + t] = (float)sk[t];
        return KVS_OK;
    }
    /* rank within the partition, ties to the lower index first: the tokens
     * below t, and the equal ones before it */
    for (int t = 0; t < L; t++) {
        const double x = sk[t];
        int r = 0;
        for (int i = 0; i < t; i++) r += sk[i] <= x;
        for (int i = t + 1; i < L; i++) r += sk[i] < x;
        row[a + t] = (float)((double)r / L);
    }
    return KVS_OK;
}

static kvs_status lag_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)layer;
    lag_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    const int L = (int)kvs_part_param(c->m, c->p, "lag", 128);
    const int cross = kvs_part_param(c->m, c->p, "cross_scoring", 0) != 0.0;
    if (s > N) s = N;
    if (N < s + 2 * L) { /* too short: sinks, then the newest first */
        for (int h = 0; h < H; h++) {
            float *row = scores + (size_t)h * N; /* [N] */
            for (int j = 0; j < s; j++) row[j] = 1.0f;
            for (int j = s; j < N; j++) row[j] = (float)((double)(j - s) / (double)(N - s));
        }
        return KVS_OK;
    }
    const int e = s + ((N - s) / L) * L, P = (e - s) / L; /* P >= 2 */
    for (int h = 0; h < H; h++) {
        float *row = scores + (size_t)h * N; /* [N] */
        for (int j = 0; j < s; j++) row[j] = 1.0f;
        for (int j = e - L; j < N; j++) row[j] = 1.0f; /* the tail: the last partition + rest */
    }
    lag_job j = {st, in, scores, s, L, P, cross};
    return kvs_parallel_run(&j, lag_unit, H * (P - 1), st->T, "lagkv", err);
}

const kvs_scorer kvs_scorer_lagkv = {
    .name = "lagkv",
    .needs = 0,
    .queries_wanted = NULL,
    .create = lag_create,
    .score = lag_score,
    .destroy = lag_destroy,
};
