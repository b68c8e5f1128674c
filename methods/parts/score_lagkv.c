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
 * Reads K and V only. Cost: all layers in one parallel run (score_layers)
 * over (layer, KV head, group of 4 partitions) units on the shape's threads, each converting its rows
 * of K and V to fp32 once (a two-partition ring: own, reference); per
 * channel the
 * reciprocal of the reference's range is taken once (x = (K - min) * inv,
 * not a division per element), and the sums of x and x^2 over the channels
 * run in 8 lanes (AVX where built with it, the same order without): the
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
    float *krows, *vrows;  /* [T][R][d] two partitions (a ring: own, reference) */
    double *lo, *inv;      /* [T][d] */
    double *sk, *sv;       /* [T][lag] */
} lag_state;

typedef struct {
    lag_state *st;
    const kvs_layer *in; /* [n_layers] */
    float *scores;       /* [n_layers][Hkv][N] */
    int s, L, P, cross;
    int per_head; /* units per head: groups of LAG_GROUP partitions */
} lag_job;

enum { LAG_GROUP = 4 }; /* partitions per unit: each partition is converted once per unit */

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
#if defined(__AVX__)
/* Channels [c, c + 8 nb) of the reference, nb <= 4 blocks at once (their
 * min / max chains overlap); _mm256_min_ps(x, m) is x < m ? x : m, as the
 * scalar loop. */
static void range_blocks(const float *restrict ref, int d, int L, int c, int nb, double *restrict lo,
                         double *restrict inv) {
    __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0, mn2 = mn0, mn3 = mn0;
    __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0, mx2 = mx0, mx3 = mx0;
    for (int t = 0; t < L; t++) {
        const float *r = ref + (size_t)t * d + c;
        const __m256 x0 = _mm256_loadu_ps(r);
        mn0 = _mm256_min_ps(x0, mn0), mx0 = _mm256_max_ps(x0, mx0);
        if (nb == 4) {
            const __m256 x1 = _mm256_loadu_ps(r + 8), x2 = _mm256_loadu_ps(r + 16), x3 = _mm256_loadu_ps(r + 24);
            mn1 = _mm256_min_ps(x1, mn1), mx1 = _mm256_max_ps(x1, mx1);
            mn2 = _mm256_min_ps(x2, mn2), mx2 = _mm256_max_ps(x2, mx2);
            mn3 = _mm256_min_ps(x3, mn3), mx3 = _mm256_max_ps(x3, mx3);
        }
    }
    float a[32], e[32];
    _mm256_storeu_ps(a, mn0), _mm256_storeu_ps(a + 8, mn1), _mm256_storeu_ps(a + 16, mn2), _mm256_storeu_ps(a + 24, mn3);
    _mm256_storeu_ps(e, mx0), _mm256_storeu_ps(e + 8, mx1), _mm256_storeu_ps(e + 16, mx2), _mm256_storeu_ps(e + 24, mx3);
    for (int k = 0; k < 8 * nb; k++) {
        const double r = (double)e[k] - (double)a[k];
        lo[c + k] = a[k];
        inv[c + k] = r > 0 ? 1.0 / r : 0.0;
    }
}
#endif

/* The reference's channel ranges: lo[c] and inv[c] = 1 / (max - min) over
 * its L rows ref [L][d] (0 for a constant channel: it contributes x = 0).
 * Min / max are exact in fp32. */
static void ref_range(const float *restrict ref, int d, int L, double *restrict lo,
                      double *restrict inv) {
    int c = 0;
#if defined(__AVX__)
    for (; c + 32 <= d; c += 32) range_blocks(ref, d, L, c, 4, lo, inv);
    for (; c + 8 <= d; c += 8) range_blocks(ref, d, L, c, 1, lo, inv);
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

/* Lanes of one token's sums: x_c = (r[c] - lo_c) inv_c, channel c in lane
 * c mod 8 of s8 (x) and q8 (x^2), blocks of 8 then the tail. */
static void token_sums(const float *restrict r, const double *restrict lo,
                       const double *restrict inv, int d, double *s8, double *q8) {
    int c = 0;
#if defined(__AVX__)
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    for (; c + 8 <= d; c += 8) {
        const __m256d x0 = _mm256_mul_pd(
            _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(r + c)), _mm256_loadu_pd(lo + c)),
            _mm256_loadu_pd(inv + c));
        const __m256d x1 = _mm256_mul_pd(
            _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(r + c + 4)), _mm256_loadu_pd(lo + c + 4)),
            _mm256_loadu_pd(inv + c + 4));
        s0 = _mm256_add_pd(s0, x0);
        s1 = _mm256_add_pd(s1, x1);
        q0 = _mm256_add_pd(q0, _mm256_mul_pd(x0, x0));
        q1 = _mm256_add_pd(q1, _mm256_mul_pd(x1, x1));
    }
    _mm256_storeu_pd(s8, s0);
    _mm256_storeu_pd(s8 + 4, s1);
    _mm256_storeu_pd(q8, q0);
    _mm256_storeu_pd(q8 + 4, q1);
#endif
    for (; c < d; c++) { /* the plain-C blocks and the tail: lane c mod 8 either way */
        const double x = ((double)r[c] - lo[c]) * inv[c];
        s8[c % 8] += x;
        q8[c % 8] += x * x;
    }
}

static double fold8(double *l) {
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

/* The softmax over a partition own [L][d] of the sigma of each token, with
 * ref [L][d] (the next partition) as the reference; out [L]; worker tid's
 * scratch. */
static void partition_score(lag_state *st, int tid, const float *own, const float *ref, int d,
                            int L, double *restrict out) {
    double *restrict lo = st->lo + (size_t)tid * d, *restrict inv = st->inv + (size_t)tid * d;
    ref_range(ref, d, L, lo, inv);
    double mx = -INFINITY;
    for (int t = 0; t < L; t++) {
        double s8[8] = {0}, q8[8] = {0};
        token_sums(own + (size_t)t * d, lo, inv, d, s8, q8);
        const double sum = fold8(s8), sq = fold8(q8);
        double var = d > 1 ? (sq - sum * sum / d) / (d - 1) : 0.0;
        if (var < 0) var = 0; /* rounding of sq - sum^2 / d */
        out[t] = sqrt(var);
        if (out[t] > mx) mx = out[t];
    }
    double z = 0.0;
    for (int t = 0; t < L; t++) z += (out[t] = exp(out[t] - mx));
    for (int t = 0; t < L; t++) out[t] /= z;
}

/* How many of v[0, n) are below x (le: or equal). */
static int count_below(const double *v, int n, double x, int le) {
    int i = 0, r = 0;
#if defined(__AVX__)
    const __m256d vx = _mm256_set1_pd(x);
    __m256i acc = _mm256_setzero_si256();
    for (; i + 4 <= n; i += 4) { /* a true compare is all ones: -1 per lane */
        const __m256d y = _mm256_loadu_pd(v + i);
        const __m256d m = le ? _mm256_cmp_pd(y, vx, _CMP_LE_OQ) : _mm256_cmp_pd(y, vx, _CMP_LT_OQ);
        acc = _mm256_sub_epi64(acc, _mm256_castpd_si256(m));
    }
    int64_t a[4];
    _mm256_storeu_si256((__m256i *)a, acc);
    r = (int)(a[0] + a[1] + a[2] + a[3]);
#endif
    for (; i < n; i++) r += le ? v[i] <= x : v[i] < x;
    return r;
}

/* Unit u: partitions [p0, p1) (a group of LAG_GROUP) of (layer, KV head)
 * u / per_head.
 * The ring holds partition p and its reference p + 1; moving on converts
 * only p + 2. */
static kvs_status lag_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const lag_job *j = job;
    lag_state *st = j->st;
    const int N = j->in[0].k.n_tokens, d = j->in[0].k.head_dim, H = j->in[0].k.n_heads, L = j->L;
    const int lh = u / j->per_head, h = lh % H;
    const kvs_layer *in = &j->in[lh / H];
    const int p0 = (u % j->per_head) * LAG_GROUP, p1 = p0 + LAG_GROUP < j->P - 1 ? p0 + LAG_GROUP : j->P - 1;
    float *kr = st->krows + (size_t)tid * st->R * d, *vr = st->vrows + (size_t)tid * st->R * d;
    double *sk = st->sk + (size_t)tid * L, *sv = st->sv + (size_t)tid * L;
    float *row = j->scores + (size_t)lh * N; /* [N] */
    const size_t slot = (size_t)L * d;      /* floats per ring slot */
    kvs_view_rows_f32(&in->k, h, j->s + p0 * L, L, kr + (size_t)(p0 % 2) * slot);
    kvs_view_rows_f32(&in->v, h, j->s + p0 * L, L, vr + (size_t)(p0 % 2) * slot);
    for (int p = p0; p < p1; p++) {
        const int a = j->s + p * L;
        const size_t own = (size_t)(p % 2) * slot, ref = (size_t)((p + 1) % 2) * slot;
        kvs_view_rows_f32(&in->k, h, a + L, L, kr + ref);
        kvs_view_rows_f32(&in->v, h, a + L, L, vr + ref);
        partition_score(st, tid, kr + own, kr + ref, d, L, sk);
        partition_score(st, tid, vr + own, vr + ref, d, L, sv);
        for (int t = 0; t < L; t++) sk[t] = (sk[t] + sv[t]) / 2;
        if (j->cross) {
            for (int t = 0; t < L; t++) row[a + t] = (float)sk[t];
            continue;
        }
        /* rank within the partition, ties to the lower index first: the
         * tokens before t at or below it, those after it strictly below */
        for (int t = 0; t < L; t++) {
            const int r = count_below(sk, t, sk[t], 1) + count_below(sk + t + 1, L - t - 1, sk[t], 0);
            row[a + t] = (float)((double)r / L);
        }
    }
    return KVS_OK;
}

static kvs_status lag_layers(void *state, const kvs_layer *in, int n_layers, float *scores,
                             kvs_err *err) {
    lag_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    int s = (int)kvs_part_param(c->m, c->p, "sinks", 0);
    const int L = (int)kvs_part_param(c->m, c->p, "lag", 128);
    const int cross = kvs_part_param(c->m, c->p, "cross_scoring", 0) != 0.0;
    if (s > N) s = N;
    if (N < s + 2 * L) { /* too short: sinks, then the newest first */
        for (int h = 0; h < n_layers * H; h++) {
            float *row = scores + (size_t)h * N; /* [N] */
            for (int j = 0; j < s; j++) row[j] = 1.0f;
            for (int j = s; j < N; j++) row[j] = (float)((double)(j - s) / (double)(N - s));
        }
        return KVS_OK;
    }
    const int e = s + ((N - s) / L) * L, P = (e - s) / L; /* P >= 2 */
    for (int h = 0; h < n_layers * H; h++) {
        float *row = scores + (size_t)h * N; /* [N] */
        for (int j = 0; j < s; j++) row[j] = 1.0f;
        for (int j = e - L; j < N; j++) row[j] = 1.0f; /* the tail: the last partition + rest */
    }
    lag_job j = {st, in, scores, s, L, P, cross, (P - 1 + LAG_GROUP - 1) / LAG_GROUP};
    return kvs_parallel_run(&j, lag_unit, n_layers * H * j.per_head, st->T, "lagkv", err);
}

static kvs_status lag_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)layer;
    return lag_layers(state, in, 1, scores, err);
}

const kvs_scorer kvs_scorer_lagkv = {
    .name = "lagkv",
    .needs = 0,
    .queries_wanted = NULL,
    .create = lag_create,
    .score = lag_score,
    .destroy = lag_destroy,
    .score_layers = lag_layers,
};
