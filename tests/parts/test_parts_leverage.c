/*
 * test_parts_leverage.c -- the scorers cur and leverage and their presets
 * (methods/parts/score_cur.c, score_leverage.c):
 *   cur
 *     - hand-checked plans: squared norms, local windows vs the whole head,
 *       the four leverage types, the sinks;
 *   leverage
 *     - with a square sketch (k = d) the sketched leverage is the exact
 *       leverage x' (X'X)^-1 x of the centred keys (up to the 0.01 jitter):
 *       checked against the closed-form 2 x 2 inverse at d = 2;
 *     - leverages sum to the rank d (trace of the hat matrix) when k >= d;
 *     - the scores are z-scores over the layer (mean 0, unbiased sd 1),
 *       and the same seed gives the same plan, another seed may not matter
 *       at k >= d (the sketch cancels);
 *     - the preset's plan keeps the hand-made outlier key.
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

static void run_B(const kvs_method *m, const kvs_params *p, m1_cache *c, int B, kvs_plan *pl) {
    kvs_err e = {0};
    kvs_budget b = {0, B};
    memset(pl, 0, sizeof *pl);
    CHECK_OK(kvs_compress(m, p, &c->view, &b, 1, pl, &e), &e);
}

/* cur, L = 1, Hkv = 1, N = 4, d = 1, sinks 0 unless said.
 *   keys 3, 1, 2, 1: k2 = 9, 1, 4, 1; values 1: v2 = 1.
 *   local_window 2: k2 -> .9 .1 | .8 .2; v2 -> .5 each.
 *     kv_product (k2 v2, then / sum = 1): .45 .05 .4 .1 /1 -> order 0, 2, 3, 1
 *       B = 2 -> {0, 2};  B = 3 -> {0, 2, 3}
 *     sinks 1: token 0 kept, then 2, 3: B = 3 -> {0, 2, 3}; B = 2 -> {0, 2}
 *   local_window 0: k2 / 15 = .6 .067 .267 .067: B = 3 -> 0, 2, then the
 *     tie 1 / 3 -> lower: {0, 1, 2}
 *   value type (local 2): all .25 -> ties: B = 2 -> {0, 1}
 *   kv_avg: (k2 + .5) / 2 = .7 .3 .65 .35 (/ 2): B = 3 -> {0, 2, 3}
 *   a key of 0 in a window of zeros: keys 0, 0, 2, 1 with local_window 2:
 *     window [0, 2) sums to 0 -> 0, 0; [2, 4) -> .8 .2: key type B = 3 ->
 *     2, 3, then the tie 0 / 1 at 0 -> {0, 2, 3} */
static void cur_hand(void) {
    const kvs_method *m = &kvs_preset_cur;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 4, 0, 1);
    const float k[4] = {3, 1, 2, 1};
    for (int n = 0; n < 4; n++) {
        m1_k(&c, 0, 0, n)[0] = k[n];
        m1_v(&c, 0, 0, n)[0] = 1;
    }
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "sinks", "0");
    m1_set(m, &p, "local_window", "2");
    run_B(m, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    m1_set(m, &p, "leverage_type", "value");
    run_B(m, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1);
    kvs_plan_free(&pl);
    m1_set(m, &p, "leverage_type", "kv_avg");
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    m1_set(m, &p, "leverage_type", "kv_product");
    m1_set(m, &p, "local_window", "0");
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2);
    kvs_plan_free(&pl);
    /* sinks 1 with another order: keys 1, 3, 2, 1 -> window 2: .1 .9 | .8 .2 */
    const float k2[4] = {1, 3, 2, 1};
    for (int n = 0; n < 4; n++) m1_k(&c, 0, 0, n)[0] = k2[n];
    m1_set(m, &p, "local_window", "2");
    m1_set(m, &p, "sinks", "1");
    run_B(m, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2);
    kvs_plan_free(&pl);
    /* a window of zero keys scores 0 (kvpress: 0 / 0) */
    const float k3[4] = {0, 0, 2, 1};
    for (int n = 0; n < 4; n++) m1_k(&c, 0, 0, n)[0] = k3[n];
    m1_set(m, &p, "sinks", "0");
    m1_set(m, &p, "leverage_type", "key");
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* Exact leverage at d = 2 against the sketched one with k = 2 and k = 5. */
static void leverage_exact(void) {
    enum { N = 7, D = 2 };
    const float kr[N][D] = {{1, 2}, {3, -1}, {0, 0}, {2, 2}, {-4, 1}, {1, 1}, {10, -6}};
    double mx = 0, my = 0;
    for (int j = 0; j < N; j++) mx += kr[j][0], my += kr[j][1];
    mx /= N, my /= N;
    double a = 0, b = 0, cc = 0;
    for (int j = 0; j < N; j++) {
        const double x = kr[j][0] - mx, y = kr[j][1] - my;
        a += x * x, b += x * y, cc += y * y;
    }
    const double det = a * cc - b * b;
    /* Leverage does not change with the scale of the keys, the jitter 0.01
     * does: at scale 100 it is negligible and the sketch cancels (k >= d);
     * at scale 1 it only lowers each leverage. */
    for (int k = 2; k <= 5; k += 3)
        for (int big = 0; big < 2; big++) {
            const float f = big ? 100.0f : 1.0f;
            float ks[N][D], y[N * 5];
            for (int j = 0; j < N; j++) ks[j][0] = kr[j][0] * f, ks[j][1] = kr[j][1] * f;
            double g[25], z[25], out[N], sum = 0;
            kvs_err e = {0};
            CHECK_OK(kvs_leverage_head(&ks[0][0], N, D, k, 12345, y, g, z, out, &e), &e);
            for (int j = 0; j < N; j++) {
                const double x = kr[j][0] - mx, yy = kr[j][1] - my;
                const double exact = (cc * x * x - 2 * b * x * yy + a * yy * yy) / det;
                if (big) CHECK_NEAR(out[j], exact, 1e-4 * (1 + exact));
                else CHECK_MSG(out[j] <= exact * (1 + 1e-5), "jitter raised a leverage");
                sum += out[j];
            }
            if (big) CHECK_NEAR(sum, 2.0, 1e-4); /* trace of the hat matrix = rank */
        }
}

static void leverage_preset(void) {
    const kvs_method *m = &kvs_preset_leverage;
    m1_cache c;
    m1_cache_init(&c, 2, 2, 2, 60, 0, 8);
    m1_cache_fill_random(&c, 41);
    for (int ch = 0; ch < 8; ch++) m1_k(&c, 1, 1, 17)[ch] = ch % 2 ? 25.0f : -25.0f; /* an outlier key */
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_plan a, b;
    run_B(m, &p, &c, 5, &a);
    int has = 0;
    for (int i = 0; i < 5; i++) has |= a.layers[1].idx[5 + i] == 17;
    CHECK_MSG(has, "the outlier key of layer 1 head 1 is not kept");
    run_B(m, &p, &c, 5, &b);
    CHECK(m1_plans_equal(&a, &b));
    kvs_plan_free(&b);
    kvs_plan_free(&a);
    /* the scores are z-scores over the layer */
    kvs_part_ctx ctx = {.m = m, .p = &p, .shape = m1_shape(&c, 1)};
    void *st = NULL;
    kvs_err e = {0};
    float sc[2 * 60];
    CHECK_OK(kvs_scorer_leverage.create(&ctx, &st, &e), &e);
    if (st) {
        CHECK_OK(kvs_scorer_leverage.score(st, 0, &c.layers[0], sc, &e), &e);
        double mean = 0, var = 0;
        for (int i = 0; i < 120; i++) mean += sc[i];
        mean /= 120;
        for (int i = 0; i < 120; i++) var += (sc[i] - mean) * (sc[i] - mean);
        CHECK_NEAR(mean, 0.0, 1e-5);
        CHECK_NEAR(var / 119, 1.0, 1e-4);
        kvs_scorer_leverage.destroy(st);
    }
    m1_cache_free(&c);
}

int main(void) {
    cur_hand();
    leverage_exact();
    leverage_preset();
    return kvs_test_finish("test_parts_leverage");
}
