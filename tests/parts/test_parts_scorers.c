/*
 * test_parts_scorers.c -- the scorers expected_attention, lagkv and
 * flashcache (methods/parts/score_*.c), called
 * directly on small caches:
 *   expected_attention
 *     - hand-checked: N = 3 keys, d = 2, two query rows q = (1,0), (3,2)
 *       (mu = (2,1), S = [[1,1],[1,1]]): logits mu.k / sqrt 2 + k'Sk / 4,
 *       softmax, times ||v||; with sinks = 1 (softmax over keys 1, 2, the
 *       sink gets the maximum) and sinks = 2 (only the row at position 2
 *       is used: S = 0, one key left: score ||v_2||);
 *     - without covariance and value norms, on one query row, the scores
 *       equal the tova scorer's (last-query attention, GQA group mean);
 *     - scaling V by c scales the scores by c (epsilon 0); epsilon adds
 *       epsilon ||v|| ; sinks score the head's maximum;
 *   lagkv
 *     - hand-checked: fewer than s + 2L tokens (sinks 1, then the position
 *       ramp); N = 5, L = 2: one partition scored against the next, ranks
 *       and (cross_scoring) the mean softmax of the channel spreads;
 *     - ranks are a permutation per partition, sinks and tail score 1,
 *       per-channel shifts and positive scales change nothing;
 *   flashcache
 *     - K, V constant along tokens: nothing is an outlier (scores 0);
 *     - one spiked token scores highest in its head, and only there;
 *     - a low-pass that keeps every coefficient (gamma 1): scores 0.
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

/* Scores [L][Hkv][N] of scorer s with method m's parameters p. */
static int score_all(const kvs_scorer *s, const kvs_method *m, const kvs_params *p, m1_cache *c,
                     float *out) {
    kvs_part_ctx ctx = {.m = m, .p = p, .shape = m1_shape(c, 1)};
    void *st = NULL;
    kvs_err e = {0};
    kvs_status rc = s->create(&ctx, &st, &e);
    CHECK_MSG(rc == KVS_OK, "%s create: %s", s->name, e.msg);
    if (rc) return 0;
    for (int l = 0; l < c->L && !rc; l++) {
        rc = s->score(st, l, &c->layers[l], out + (size_t)l * c->Hkv * c->N, &e);
        CHECK_MSG(rc == KVS_OK, "%s score layer %d: %s", s->name, l, e.msg);
    }
    s->destroy(st);
    return rc == KVS_OK;
}

static void set(const kvs_method *m, kvs_params *p, const char *n, const char *v) { m1_set(m, p, n, v); }

static void ea_hand(void) {
    const kvs_method *m = &kvs_preset_expected_attention;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 3, 2, 2);
    const float q[2][2] = {{1, 0}, {3, 2}}, k[3][2] = {{1, 0}, {0, 1}, {1, -1}},
                v[3][2] = {{3, 4}, {0, 1}, {1, 0}};
    for (int i = 0; i < 2; i++) memcpy(m1_q(&c, 0, 0, i), q[i], sizeof q[i]);
    for (int j = 0; j < 3; j++) {
        memcpy(m1_k(&c, 0, 0, j), k[j], sizeof k[j]);
        memcpy(m1_v(&c, 0, 0, j), v[j], sizeof v[j]);
    }
    /* mu = (2, 1); S = [[1,1],[1,1]]: k0'Sk0 = 1, k1'Sk1 = 1, k2'Sk2 = 0 */
    const double z[3] = {2 / sqrt(2.0) + 0.25, 1 / sqrt(2.0) + 0.25, 1 / sqrt(2.0)};
    const double vn[3] = {5, 1, 1};
    kvs_params p;
    kvs_params_defaults(m, &p);
    float sc[3];
    set(m, &p, "sinks", "0");
    if (score_all(&kvs_scorer_expected_attention, m, &p, &c, sc)) {
        const double den = exp(z[0]) + exp(z[1]) + exp(z[2]);
        for (int j = 0; j < 3; j++) CHECK_NEAR(sc[j], exp(z[j]) / den * vn[j], 1e-6);
    }
    set(m, &p, "sinks", "1"); /* softmax over keys 1, 2; the sink gets the max */
    if (score_all(&kvs_scorer_expected_attention, m, &p, &c, sc)) {
        const double den = exp(z[1]) + exp(z[2]);
        const double s1 = exp(z[1]) / den, s2 = exp(z[2]) / den;
        CHECK_NEAR(sc[1], s1, 1e-6);
        CHECK_NEAR(sc[2], s2, 1e-6);
        CHECK_NEAR(sc[0], fmax(s1, s2), 1e-6);
    }
    set(m, &p, "sinks", "2"); /* the row at position 1 (< 2) is dropped: mu = (3,2), S = 0 */
    if (score_all(&kvs_scorer_expected_attention, m, &p, &c, sc)) {
        CHECK_NEAR(sc[2], 1.0, 1e-6);
        CHECK_NEAR(sc[0], 1.0, 1e-6);
        CHECK_NEAR(sc[1], 1.0, 1e-6);
    }
    /* no covariance, no value norms, sinks 0: softmax of mu.k / sqrt 2 */
    set(m, &p, "sinks", "0");
    set(m, &p, "use_covariance", "false");
    set(m, &p, "use_vnorm", "false");
    if (score_all(&kvs_scorer_expected_attention, m, &p, &c, sc)) {
        const double y[3] = {2 / sqrt(2.0), 1 / sqrt(2.0), 1 / sqrt(2.0)};
        const double den = exp(y[0]) + exp(y[1]) + exp(y[2]);
        for (int j = 0; j < 3; j++) CHECK_NEAR(sc[j], exp(y[j]) / den, 1e-6);
    }
    m1_cache_free(&c);
}

static void ea_props(void) {
    const kvs_method *m = &kvs_preset_expected_attention;
    for (int t = 0; t < 3; t++) {
        const int Hkv = 1 + t % 2, G = 1 + t, N = 20 + 13 * t, d = 8;
        m1_cache c;
        m1_cache_init(&c, 2, Hkv, Hkv * G, N, 1, d); /* one query row: the last position */
        m1_cache_fill_random(&c, 7 + (uint64_t)t);
        const size_t n = (size_t)2 * Hkv * N;
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        kvs_params p, pt;
        kvs_params_defaults(m, &p);
        kvs_params_defaults(&kvs_preset_tova, &pt);
        set(m, &p, "sinks", "0");
        set(m, &p, "use_covariance", "false");
        set(m, &p, "use_vnorm", "false");
        /* == tova's last-query attention */
        if (score_all(&kvs_scorer_expected_attention, m, &p, &c, a) &&
            score_all(&kvs_scorer_tova, &kvs_preset_tova, &pt, &c, b)) {
            double worst = 0;
            for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]));
            CHECK_MSG(worst < 1e-5, "t=%d: |ea - tova| = %g", t, worst);
        }
        /* V * 2 -> scores * 2; epsilon adds epsilon ||v||; sinks get the max */
        set(m, &p, "use_vnorm", "true");
        set(m, &p, "use_covariance", "true");
        set(m, &p, "sinks", "3");
        score_all(&kvs_scorer_expected_attention, m, &p, &c, a);
        for (size_t i = 0; i < n * (size_t)d; i++) c.v[i] *= 2;
        score_all(&kvs_scorer_expected_attention, m, &p, &c, b);
        for (size_t i = 0; i < n; i++) CHECK_NEAR(b[i], 2 * a[i], 1e-5 * (1 + fabs(a[i])));
        for (int h = 0; h < 2 * Hkv; h++) {
            float mx = -1;
            for (int j = 3; j < N; j++) mx = fmaxf(mx, b[(size_t)h * N + j]);
            for (int j = 0; j < 3; j++) CHECK(b[(size_t)h * N + j] == mx);
        }
        set(m, &p, "epsilon", "0.5");
        score_all(&kvs_scorer_expected_attention, m, &p, &c, a);
        for (int h = 0; h < 2 * Hkv; h++)
            for (int j = 3; j < N; j++) {
                const float *vr = c.v + ((size_t)h * N + j) * d;
                double vv = 0;
                for (int x = 0; x < d; x++) vv += (double)vr[x] * vr[x];
                CHECK_NEAR(a[(size_t)h * N + j], b[(size_t)h * N + j] + 0.5 * sqrt(vv), 1e-5);
            }
        free(a);
        free(b);
        m1_cache_free(&c);
    }
}

static void fc_props(void) {
    const kvs_method *m = &kvs_method_flashcache; /* declares gamma */
    const int N = 40, d = 4, H = 2;
    m1_cache c;
    m1_cache_init(&c, 1, H, H, N, 0, d);
    for (int h = 0; h < H; h++)
        for (int n = 0; n < N; n++)
            for (int x = 0; x < d; x++) m1_k(&c, 0, h, n)[x] = m1_v(&c, 0, h, n)[x] = 1.5f + x;
    float sc[2 * 40];
    kvs_params p;
    kvs_params_defaults(m, &p);
    if (score_all(&kvs_scorer_flashcache, m, &p, &c, sc))
        for (int i = 0; i < H * N; i++) CHECK_NEAR(sc[i], 0.0, 1e-6);
    m1_k(&c, 0, 1, 17)[2] += 10.0f; /* one outlier in head 1 */
    if (score_all(&kvs_scorer_flashcache, m, &p, &c, sc)) {
        int best = 0;
        for (int n = 1; n < N; n++) best = sc[N + n] > sc[N + best] ? n : best;
        CHECK_EQ_INT(best, 17);
        for (int n = 0; n < N; n++) CHECK_NEAR(sc[n], 0.0, 1e-6); /* head 0 untouched */
    }
    m1_set(m, &p, "gamma", "1");
    if (score_all(&kvs_scorer_flashcache, m, &p, &c, sc))
        for (int i = 0; i < H * N; i++) CHECK_NEAR(sc[i], 0.0, 1e-4);
    m1_cache_free(&c);
}

/* A method declaring lagkv's parameters (the scorer reads them by name). */
static const kvs_param_def lag_params[] = {KVS_PARTS_P_SINKS(0), KVS_PARTS_P_LAG(2), KVS_PARTS_P_CROSS(0)};
static const kvs_method lag_m = {.name = "t_lagkv", .params = lag_params, .n_params = 3};

static void lag_hand(void) {
    kvs_params p;
    kvs_params_defaults(&lag_m, &p);
    float sc[10];
    /* N < s + 2L: sinks 1, then (j - s) / (N - s) */
    {
        m1_cache c;
        m1_cache_init(&c, 1, 1, 1, 10, 0, 2);
        m1_set(&lag_m, &p, "sinks", "2");
        m1_set(&lag_m, &p, "lag", "8");
        if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, sc)) {
            CHECK(sc[0] == 1.0f && sc[1] == 1.0f);
            for (int j = 2; j < 10; j++) CHECK_NEAR(sc[j], (j - 2) / 8.0, 1e-7);
        }
        m1_cache_free(&c);
    }
    /* s = 0, L = 2, N = 5: partition {0, 1} against {2, 3}; tail [2, 5) = 1.
     * K: (0,0), (1,0) vs reference (0,0), (2,2): x = (0,0) and (.5,0), sigma
     * 0 and sqrt(.125); V all zero: constant channels give x = 0, softmax
     * 1/2 each. Mean softmax: token 1 higher -> ranks 0 and 1 -> 0, 1/2. */
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 5, 0, 2);
    const float k[5][2] = {{0, 0}, {1, 0}, {0, 0}, {2, 2}, {7, -3}};
    for (int j = 0; j < 5; j++) memcpy(m1_k(&c, 0, 0, j), k[j], sizeof k[j]);
    m1_set(&lag_m, &p, "sinks", "0");
    m1_set(&lag_m, &p, "lag", "2");
    if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, sc)) {
        CHECK_NEAR(sc[0], 0.0, 0);
        CHECK_NEAR(sc[1], 0.5, 0);
        for (int j = 2; j < 5; j++) CHECK(sc[j] == 1.0f);
    }
    m1_set(&lag_m, &p, "cross_scoring", "true");
    if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, sc)) {
        const double e = exp(sqrt(0.125)), p0 = 1 / (1 + e), p1 = e / (1 + e);
        CHECK_NEAR(sc[0], (p0 + 0.5) / 2, 1e-6);
        CHECK_NEAR(sc[1], (p1 + 0.5) / 2, 1e-6);
    }
    m1_cache_free(&c);
}

/* Ranks are a permutation of {0, 1/L, ..} in every scored partition; sinks
 * and the tail score 1; per-channel shifts and positive scales of K and V
 * change nothing (min-max normalisation). */
static void lag_props(void) {
    kvs_params p;
    kvs_params_defaults(&lag_m, &p);
    const int N = 103, d = 8, H = 2, s = 3, L = 10;
    m1_set(&lag_m, &p, "sinks", "3");
    m1_set(&lag_m, &p, "lag", "10");
    m1_cache c;
    m1_cache_init(&c, 2, H, H, N, 0, d);
    m1_cache_fill_random(&c, 99);
    const size_t n = (size_t)2 * H * N;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, a)) {
        const int e = s + ((N - s) / L) * L;
        for (int r = 0; r < 2 * H; r++) {
            const float *row = a + (size_t)r * N;
            for (int j = 0; j < s; j++) CHECK(row[j] == 1.0f);
            for (int j = e - L; j < N; j++) CHECK(row[j] == 1.0f);
            for (int q = s; q < e - L; q += L) {
                int seen[10] = {0};
                for (int t = q; t < q + L; t++) {
                    const int rk = (int)lround(row[t] * L);
                    CHECK(rk >= 0 && rk < L && fabsf(row[t] - (float)rk / L) < 1e-7f);
                    if (rk >= 0 && rk < L) seen[rk]++;
                }
                for (int i = 0; i < L; i++) CHECK_EQ_INT(seen[i], 1);
            }
        }
    }
    for (size_t i = 0; i < n * (size_t)d; i++) {
        const int ch = (int)(i % (size_t)d);
        c.k[i] = c.k[i] * (1.0f + 0.25f * (float)ch) + 3.0f * (float)ch;
        c.v[i] = c.v[i] * 2.0f - 1.0f;
    }
    m1_set(&lag_m, &p, "cross_scoring", "true");
    float *x = malloc(sizeof(float) * n);
    if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, b)) {
        m1_set(&lag_m, &p, "cross_scoring", "false");
        if (score_all(&kvs_scorer_lagkv, &lag_m, &p, &c, x))
            for (size_t i = 0; i < n; i++) CHECK_NEAR(x[i], a[i], 0);
        for (size_t i = 0; i < n; i++) CHECK(b[i] > 0.0f && b[i] <= 1.0f);
    }
    free(x);
    free(a);
    free(b);
    m1_cache_free(&c);
}

int main(void) {
    ea_hand();
    ea_props();
    fc_props();
    lag_hand();
    lag_props();
    return kvs_test_finish("test_parts_scorers");
}
