/*
 * test_parts_layerpref.c -- CAKE's scorer, SimLayerKV and Q-Filters
 * (methods/parts/score_cake.c, alloc_simlayer.c, score_simlayer.c,
 * score_qfilter.c) and their presets cake, simlayerkv, qfilters:
 *   cake      the indicator mean + cake_gamma * var on a hand case (with and
 *             without pooling, gamma 0 is the mean), and the preset's layer
 *             budgets equal the cake allocator's own measure (the scorer's
 *             statistics are the same bits);
 *   simlayer  the mass on a hand row (spans, overlap, GQA mean), hand-checked
 *             budgets (lazy share, capped share, water-filling back, none /
 *             all lazy, the strict threshold), and a preset plan in which the
 *             lazy layer is StreamingLLM and the other picks by attention;
 *   qfilter   filters by hand (orientation, majority sign, tie, zero rows),
 *             the GQA mean, the last svd_queries rows, and preset plans;
 *   compactor plans by hand: blending 0 ranks by the pooled attention x ||v||,
 *             a large blending by the keys' leverage; all queries needed.
 * Every expected value is worked out in the comments.
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

/* One layer's scores from a scorer alone, with method m's parameters p. */
static void score_layer(const kvs_scorer *sc, const kvs_method *m, const kvs_params *p, m1_cache *c,
                        int l, float *scores) {
    kvs_err e = {0};
    kvs_part_ctx ctx = {0};
    ctx.m = m;
    ctx.p = p;
    ctx.shape = m1_shape(c, 1);
    void *st = NULL;
    CHECK_OK(sc->create(&ctx, &st, &e), &e);
    if (!st) return;
    CHECK_OK(sc->score(st, l, &c->layers[l], scores, &e), &e);
    sc->destroy(st);
}

/* cake, L = 1, Hkv = Hq = 1, d = 1, N = 5, window 2, queries q3 = q4 = 1,
 * keys 0, ln 2, 0, 0, 0 (logits = keys):
 *   row 3 sees keys 0..3: e = 1 2 1 1, z = 5: .2 .4 .2 .2
 *   row 4 sees keys 0..4: e = 1 2 1 1 1, z = 6: 1/6 1/3 1/6 1/6 1/6
 *   prefix j < 3: mean (.2 + 1/6) / 2 = 11/60, var (1/30)^2 / 2 = 1/1800
 *                 j = 1: mean 11/30, var (1/15)^2 / 2 = 1/450
 *   gamma 200, kernel 1: I = 11/60 + 1/9, 11/30 + 4/9, 11/60 + 1/9
 *   kernel 3 (zero padded, / 3): (I0 + I1) / 3, (I0 + I1 + I2) / 3, (I1 + I2) / 3
 *   gamma 0: the means.  Window tokens 3, 4: FLT_MAX. */
static void cake_hand(void) {
    const kvs_method *m = &kvs_preset_cake;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 5, 2, 1);
    m1_k(&c, 0, 0, 1)[0] = (float)log(2.0);
    m1_q(&c, 0, 0, 0)[0] = 1;
    m1_q(&c, 0, 0, 1)[0] = 1;
    kvs_params p;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "window", "2");
    m1_set(m, &p, "kernel", "1");
    float s[5];
    score_layer(&kvs_scorer_cake, m, &p, &c, 0, s);
    const double I0 = 11.0 / 60 + 200.0 / 1800, I1 = 11.0 / 30 + 200.0 / 450;
    CHECK_NEAR(s[0], I0, 1e-5);
    CHECK_NEAR(s[1], I1, 1e-5);
    CHECK_NEAR(s[2], I0, 1e-5);
    CHECK(s[3] > 1e30f && s[4] > 1e30f);
    m1_set(m, &p, "kernel", "3");
    score_layer(&kvs_scorer_cake, m, &p, &c, 0, s);
    CHECK_NEAR(s[0], (I0 + I1) / 3, 1e-5);
    CHECK_NEAR(s[1], (2 * I0 + I1) / 3, 1e-5);
    CHECK_NEAR(s[2], (I0 + I1) / 3, 1e-5);
    m1_set(m, &p, "kernel", "1");
    m1_set(m, &p, "cake_gamma", "0");
    score_layer(&kvs_scorer_cake, m, &p, &c, 0, s);
    CHECK_NEAR(s[0], 11.0 / 60, 1e-6);
    CHECK_NEAR(s[1], 11.0 / 30, 1e-6);
    /* the preset at B = 3: window 3, 4 kept, the best prefix key is 1 */
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "window", "2");
    m1_set(m, &p, "kernel", "1");
    kvs_plan pl;
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 1, 3, 4);
    kvs_plan_free(&pl);
    /* too few recorded queries for the window: an error naming both */
    kvs_err e = {0};
    kvs_budget b = {0, 3};
    m1_set(m, &p, "window", "3");
    CHECK_FAILS(kvs_compress(m, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID, &e, "window=3");
    m1_cache_free(&c);
}

/* The variance term decides: two prefix keys, one attended evenly (.25 from
 * both window rows), one unevenly. Keys 0: a, 1: b, queries of rows 3, 4
 * chosen so that row 3 gives key 1 more and row 4 less: with gamma 0 the
 * mean ranks them, with gamma 200 the variance does. Checked through the
 * scores' order on a random-ish case: the order under gamma 0 must equal the
 * order of the means, and under a huge gamma the order of the variances. */
static void cake_gamma_order(void) {
    const kvs_method *m = &kvs_preset_cake;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 6, 2, 1);
    /* keys 0: 0, 1: 1, 2: -1, 3: 0, 4: 0, 5: 0; queries +2 (row 4) and -2 (row 5)
     * row 4 (sees 0..4): logits 0 2 -2 0 0; row 5 (sees 0..5): 0 -2 2 0 0 0
     * key 0: attended the same by both rows' scale, key 1 high then low,
     * key 2 low then high: var of keys 1, 2 >> var of key 0 */
    m1_k(&c, 0, 0, 1)[0] = 1;
    m1_k(&c, 0, 0, 2)[0] = -1;
    m1_q(&c, 0, 0, 0)[0] = 2;
    m1_q(&c, 0, 0, 1)[0] = -2;
    kvs_params p;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "window", "2");
    m1_set(m, &p, "kernel", "1");
    /* by hand: z4 = 3 + e^2 + e^-2 = 10.524, z5 = 4 + e^-2 + e^2 = 11.524
     *   key 0: 1/z4, 1/z5 -> mean .0909, var tiny
     *   key 1: e^2/z4 = .7021, e^-2/z5 = .01174 -> mean .3569, var .2383
     *   key 2: e^-2/z4 = .01286, e^2/z5 = .6412 -> mean .3270, var .1974
     *   key 3: 1/z4, 1/z5 (same as key 0) */
    float s[6];
    m1_set(m, &p, "cake_gamma", "0");
    score_layer(&kvs_scorer_cake, m, &p, &c, 0, s);
    const double z4 = 3 + exp(2.0) + exp(-2.0), z5 = 4 + exp(2.0) + exp(-2.0);
    CHECK_NEAR(s[1], (exp(2.0) / z4 + exp(-2.0) / z5) / 2, 1e-6);
    CHECK_NEAR(s[2], (exp(-2.0) / z4 + exp(2.0) / z5) / 2, 1e-6);
    m1_set(m, &p, "cake_gamma", "200");
    score_layer(&kvs_scorer_cake, m, &p, &c, 0, s);
    const double v1 = pow(exp(2.0) / z4 - exp(-2.0) / z5, 2) / 2;
    const double v0 = pow(1 / z4 - 1 / z5, 2) / 2;
    CHECK_NEAR(s[1], (exp(2.0) / z4 + exp(-2.0) / z5) / 2 + 200 * v1, 1e-4);
    CHECK_NEAR(s[0], (1 / z4 + 1 / z5) / 2 + 200 * v0, 1e-5);
    m1_cache_free(&c);
}

/* The cake preset's budgets equal those of the cake allocator measuring on
 * its own (snapkv scorer): the scorer writes the same statistics. */
static void cake_stats_path(void) {
    m1_cache c;
    m1_cache_init(&c, 4, 2, 4, 120, 40, 8);
    m1_cache_fill_random(&c, 11);
    for (int l = 0; l < c.L; l++) /* layers of different sharpness */
        for (size_t i = 0; i < (size_t)c.Hq * c.Nq * c.d; i++)
            c.q[(size_t)l * c.Hq * c.Nq * c.d + i] *= (float)(0.5 + l);
    kvs_err e = {0};
    kvs_composed *ck = NULL;
    CHECK_OK(kvs_composed_from_json("{\"score\": \"snapkv\", \"allocate\": \"cake\", "
                                    "\"keep\": {\"window\": 32}}",
                                    &ck, &e),
             &e);
    if (!ck) return;
    kvs_params pa, pb;
    kvs_params_defaults(&kvs_preset_cake, &pa);
    kvs_params_defaults(kvs_composed_method(ck), &pb);
    kvs_plan x, y;
    run_B(&kvs_preset_cake, &pa, &c, 48, &x);
    run_B(kvs_composed_method(ck), &pb, &c, 48, &y);
    int differs = 0, sum = 0;
    for (int l = 0; l < c.L; l++) {
        CHECK_EQ_INT(x.layers[l].budget, y.layers[l].budget);
        differs |= x.layers[l].budget != x.layers[0].budget;
        sum += x.layers[l].budget;
        /* the window [N - 32, N) is kept in every layer and head */
        for (int h = 0; h < c.Hkv; h++)
            for (int t = c.N - 32; t < c.N; t++) CHECK(m1_kept(&x, l, h, t));
    }
    CHECK_EQ_INT(sum, 4 * 48);
    CHECK_MSG(differs, "cake gave equal budgets to layers of different sharpness");
    kvs_plan_free(&x);
    kvs_plan_free(&y);
    kvs_composed_free(ck);
    m1_cache_free(&c);
}

/* mass: L = 1, Hkv = 1, d = 1, N = 6, the last query 1, keys ln 3, 0, 0, 0,
 * 0, ln 2: e = 3 1 1 1 1 2, z = 9.
 *   sinks 1, recent 1: 3/9 + 2/9 = 5/9;  sinks 2, recent 2: 3/9 + 1/9 + 1/9
 *   + 2/9 = 7/9;  sinks 4, recent 4 (overlap): every key once = 1;
 *   sinks 0, recent 0: 0.
 * GQA, Hq = 2: head 1's query 0 gives 1/6 each: sinks 1, recent 1 -> 2/6;
 *   the mass is the mean (5/9 + 1/3) / 2 = 4/9. */
static void simlayer_mass(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 6, 1, 1);
    m1_k(&c, 0, 0, 0)[0] = (float)log(3.0);
    m1_k(&c, 0, 0, 5)[0] = (float)log(2.0);
    m1_q(&c, 0, 0, 0)[0] = 1;
    float lse[2], row[6];
    double mass = -1;
    kvs_err e = {0};
    const int sr[4][2] = {{1, 1}, {2, 2}, {4, 4}, {0, 0}};
    const double want[4] = {5.0 / 9, 7.0 / 9, 1.0, 0.0};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(kvs_simlayer_mass(&c.layers[0], sr[i][0], sr[i][1], 1, lse, row, &mass, &e), &e);
        CHECK_NEAR(mass, want[i], 1e-6);
    }
    m1_cache_free(&c);
    m1_cache_init(&c, 1, 1, 2, 6, 1, 1);
    m1_k(&c, 0, 0, 0)[0] = (float)log(3.0);
    m1_k(&c, 0, 0, 5)[0] = (float)log(2.0);
    m1_q(&c, 0, 0, 0)[0] = 1; /* head 1's query stays 0 */
    CHECK_OK(kvs_simlayer_mass(&c.layers[0], 1, 1, 1, lse, row, &mass, &e), &e);
    CHECK_NEAR(mass, 4.0 / 9, 1e-6);
    m1_cache_free(&c);
    /* no query: an error */
    m1_cache_init(&c, 1, 1, 1, 6, 0, 1);
    CHECK_FAILS(kvs_simlayer_mass(&c.layers[0], 1, 1, 1, lse, row, &mass, &e), KVS_ERR_INVALID, &e,
                "Nq >= 1");
    m1_cache_free(&c);
}

/* budgets, threshold .9:
 *   L 4, N 100, B 20, lazy_size 10, mass .95 .5 .99 .2: lazy 0, 2 get 10;
 *     the others (80 - 20) / 2 = 30 each -> 10 30 10 30
 *   lazy_size 50 > B: lazy share capped at B = 20 -> all 20
 *   N 40, B 30, lazy 0 only, lazy_size 10: 10, then 110 / 3 = 36.67 each:
 *     floors 36 36 36 (+10 = 118), 2 left to the largest remainders, ties to
 *     the lower layer -> 10 37 37 36
 *   N 30, B 25, lazy 0 only, lazy_size 5: 5, then 95 / 3 = 31.67 > N:
 *     30 each, the 5 they cannot hold go back to layer 0 -> 10 30 30 30
 *   none lazy (mass .9 is not > .9), all lazy: 20 each */
static void simlayer_budgets(void) {
    kvs_err e = {0};
    int b[4], n = -1;
    const double m1[4] = {.95, .5, .99, .2};
    CHECK_OK(kvs_simlayer_budgets(m1, 4, 100, 20, 10, 0.9, b, &n, &e), &e);
    CHECK(n == 2 && b[0] == 10 && b[1] == 30 && b[2] == 10 && b[3] == 30);
    CHECK_OK(kvs_simlayer_budgets(m1, 4, 100, 20, 50, 0.9, b, &n, &e), &e);
    CHECK(b[0] == 20 && b[1] == 20 && b[2] == 20 && b[3] == 20);
    const double m2[4] = {.95, .5, .5, .5};
    CHECK_OK(kvs_simlayer_budgets(m2, 4, 40, 30, 10, 0.9, b, &n, &e), &e);
    CHECK_MSG(n == 1 && b[0] == 10 && b[1] == 37 && b[2] == 37 && b[3] == 36, "%d %d %d %d", b[0],
              b[1], b[2], b[3]);
    CHECK_OK(kvs_simlayer_budgets(m2, 4, 30, 25, 5, 0.9, b, &n, &e), &e);
    CHECK_MSG(b[0] == 10 && b[1] == 30 && b[2] == 30 && b[3] == 30, "%d %d %d %d", b[0], b[1],
              b[2], b[3]);
    const double m3[4] = {.9, .5, .1, .2}, m4[4] = {1, 1, .95, .91};
    CHECK_OK(kvs_simlayer_budgets(m3, 4, 100, 20, 10, 0.9, b, &n, &e), &e);
    CHECK(n == 0 && b[0] == 20 && b[3] == 20);
    CHECK_OK(kvs_simlayer_budgets(m4, 4, 100, 20, 10, 0.9, b, &n, &e), &e);
    CHECK(n == 4 && b[0] == 20 && b[3] == 20);
    const double bad[2] = {NAN, 0};
    CHECK_FAILS(kvs_simlayer_budgets(bad, 2, 100, 20, 10, 0.9, b, &n, &e), KVS_ERR_NUMERIC, &e,
                "layer 0");
}

/* preset plan: L 2, Hkv = Hq = 1, d = 1, N 12, the last query 1; sinks 1,
 * recent 3 (lazy size 4), window 1, threshold .5.
 *   layer 0: keys 3 -> 5, 6 -> 4, others 0: z = 10 + e^5 + e^4 = 213;
 *     mass on {0} and {9, 10, 11} = 4 / 213: not lazy
 *   layer 1: key 0 -> 10, others 0: mass ~ 1: lazy
 *   B = 5, total 10: layer 1 gets 4 (sink 0, window 11, then by recency 10,
 *     9) -> {0, 9, 10, 11}; layer 0 gets 6: sink 0, window 11, 4 picks by
 *     attention: 3, 6, then the ties (e^0) to the lower index 1, 2 ->
 *     {0, 1, 2, 3, 6, 11} */
static void simlayer_plan(void) {
    const kvs_method *m = &kvs_preset_simlayerkv;
    m1_cache c;
    m1_cache_init(&c, 2, 1, 1, 12, 1, 1);
    m1_k(&c, 0, 0, 3)[0] = 5;
    m1_k(&c, 0, 0, 6)[0] = 4;
    m1_k(&c, 1, 0, 0)[0] = 10;
    m1_q(&c, 0, 0, 0)[0] = 1;
    m1_q(&c, 1, 0, 0)[0] = 1;
    kvs_params p;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "sinks", "1");
    m1_set(m, &p, "recent", "3");
    m1_set(m, &p, "lazy_threshold", "0.5");
    kvs_plan pl;
    run_B(m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2, 3, 6, 11);
    CHECK_ROW(&pl, 1, 0, 0, 9, 10, 11);
    kvs_plan_free(&pl);
    /* threshold 1: nothing is lazy, both layers pick by attention at B = 5 */
    m1_set(m, &p, "lazy_threshold", "1");
    run_B(m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 3, 6, 11);
    CHECK_ROW(&pl, 1, 0, 0, 1, 2, 3, 11);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* filters by hand (d = 2):
 *   rows (2, 0), (3, 0), (-1, 0): v = (1, 0), 2 of 3 positive -> (-1, 0)
 *   rows (2, 0), (-1, 0), (-1, 0): 1 of 3 positive -> (1, 0)
 *   rows (1, 0), (-1, 0): a tie (1 of 2 is not more than half) -> (1, 0),
 *     whatever order the rows come in
 *   rows (2, .1), (3, -.1), (-1, .05): Q'Q = [[14, -.15], [-.15, .0225]],
 *     v ~ (lambda - c, b) normalised, lambda the larger eigenvalue;
 *     2 of 3 positive -> -v
 *   zero rows -> 0 */
static void qfilter_hand(void) {
    kvs_err e = {0};
    double a[8], u[4], work[256];
    float f[2];
    const int lw = kvs_qfilter_lwork(4, 2);
    CHECK(lw > 0 && lw < 250);
    const float r1[6] = {2, 0, 3, 0, -1, 0}, r2[6] = {2, 0, -1, 0, -1, 0};
    const float r3[4] = {1, 0, -1, 0}, r3b[4] = {-1, 0, 1, 0}, r0[4] = {0, 0, 0, 0};
    CHECK_OK(kvs_qfilter_head(r1, 3, 2, a, u, work, lw, f, &e), &e);
    CHECK_NEAR(f[0], -1, 1e-7);
    CHECK_NEAR(f[1], 0, 1e-7);
    CHECK_OK(kvs_qfilter_head(r2, 3, 2, a, u, work, lw, f, &e), &e);
    CHECK_NEAR(f[0], 1, 1e-7);
    CHECK_OK(kvs_qfilter_head(r3, 2, 2, a, u, work, lw, f, &e), &e);
    CHECK_NEAR(f[0], 1, 1e-7);
    CHECK_OK(kvs_qfilter_head(r3b, 2, 2, a, u, work, lw, f, &e), &e);
    CHECK_NEAR(f[0], 1, 1e-7);
    CHECK_OK(kvs_qfilter_head(r0, 2, 2, a, u, work, lw, f, &e), &e);
    CHECK(f[0] == 0 && f[1] == 0);
    const float r4[6] = {2, .1f, 3, -.1f, -1, .05f};
    double qa = 0, qb = 0, qc = 0;
    for (int i = 0; i < 3; i++) {
        qa += (double)r4[2 * i] * r4[2 * i];
        qb += (double)r4[2 * i] * r4[2 * i + 1];
        qc += (double)r4[2 * i + 1] * r4[2 * i + 1];
    }
    const double lam = (qa + qc) / 2 + sqrt((qa - qc) * (qa - qc) / 4 + qb * qb);
    const double nx = lam - qc, ny = qb, nn = sqrt(nx * nx + ny * ny);
    CHECK_OK(kvs_qfilter_head(r4, 3, 2, a, u, work, lw, f, &e), &e);
    CHECK_NEAR(f[0], -nx / nn, 1e-6);
    CHECK_NEAR(f[1], -ny / nn, 1e-6);
    CHECK(ny < 0 && f[1] > 0); /* the small component matters: b = -.15 */
}

/* plans: Hkv = 1, window 0.
 *   Hq = 1, queries (2, 0), (-1, 0), (-1, 0): filter (1, 0), score -k_x;
 *     keys x = 3, -1, .5, -2, 1, -.5 -> scores -3 1 -.5 2 -1 .5: B 3 -> {1, 3, 5}
 *   svd_queries 1 reads the last row only: queries (-1, 0), (-1, 0), (2, 0):
 *     all three: filter (1, 0) -> {1, 3, 5}; the last one: (-1, 0), score
 *     k_x -> {0, 2, 4}
 *   Hq = 2 (one KV head): head 0 rows (2, 0), (3, 0), (-1, 0) -> (-1, 0);
 *     head 1 rows (0, 2), (0, 3), (0, -1) -> (0, -1); mean (-.5, -.5), score
 *     (k_x + k_y) / 2: keys (1, 1), (2, -3), (-1, 0), (0, 3) -> 1, -.5, -.5,
 *     1.5: B 2 -> {0, 3} */
static void qfilter_plans(void) {
    const kvs_method *m = &kvs_preset_qfilters;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 6, 3, 2);
    const float kx[6] = {3, -1, .5f, -2, 1, -.5f};
    for (int j = 0; j < 6; j++) m1_k(&c, 0, 0, j)[0] = kx[j];
    m1_q(&c, 0, 0, 0)[0] = 2;
    m1_q(&c, 0, 0, 1)[0] = -1;
    m1_q(&c, 0, 0, 2)[0] = -1;
    kvs_params p;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "window", "0");
    kvs_plan pl;
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 1, 3, 5);
    kvs_plan_free(&pl);
    m1_q(&c, 0, 0, 0)[0] = -1;
    m1_q(&c, 0, 0, 2)[0] = 2;
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 1, 3, 5);
    kvs_plan_free(&pl);
    m1_set(m, &p, "svd_queries", "1");
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 4);
    kvs_plan_free(&pl);
    /* the default window 64 > N: the window rule keeps the newest B tokens */
    kvs_params_defaults(m, &p);
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 3, 4, 5);
    kvs_plan_free(&pl);
    m1_cache_free(&c);

    m1_cache_init(&c, 1, 1, 2, 4, 3, 2);
    const float kk[8] = {1, 1, 2, -3, -1, 0, 0, 3};
    for (int j = 0; j < 4; j++) {
        m1_k(&c, 0, 0, j)[0] = kk[2 * j];
        m1_k(&c, 0, 0, j)[1] = kk[2 * j + 1];
    }
    const float q0[3] = {2, 3, -1};
    for (int i = 0; i < 3; i++) {
        m1_q(&c, 0, 0, i)[0] = q0[i];
        m1_q(&c, 0, 1, i)[1] = q0[i];
    }
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "window", "0");
    run_B(m, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 3);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* compactor, L = 1, Hkv = Hq = 1, d = 1, N = 7, sinks 1, window 1: inner
 * tokens 1..5 (one chunk). Queries 0: every inner query attends 1/5 to each
 * inner key, so each column sums to 1; times |v| = 1 5 1 1 2 -> 1 5 1 1 2;
 * pooled over 3 (/ 3): 2, 7/3, 7/3, 4/3, 1 -> order 2, 3 (exact tie: lower
 * first), 1, 4, 5.  blending 0: B 4 -> {0, 2, 3, 6}; B 5 -> {0, 1, 2, 3, 6}.
 * Keys of the inner tokens 0 0 0 0 10: centred -2 -2 -2 -2 8, the leverage
 * grows with the centred key's square (d = 1), so token 5 leads by far:
 * blending 1000, B 3 -> {0, 5, 6} (blending 0 gives {0, 2, 6}). */
static void compactor_hand(void) {
    const kvs_method *m = &kvs_preset_compactor;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 7, 7, 1);
    const float v[7] = {1, 1, 5, 1, 1, 2, 1};
    for (int j = 0; j < 7; j++) m1_v(&c, 0, 0, j)[0] = v[j];
    m1_k(&c, 0, 0, 5)[0] = 10;
    kvs_params p;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "sinks", "1");
    m1_set(m, &p, "window", "1");
    m1_set(m, &p, "blending", "0");
    kvs_plan pl;
    run_B(m, &p, &c, 4, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3, 6);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2, 3, 6);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 6);
    kvs_plan_free(&pl);
    m1_set(m, &p, "blending", "1000");
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 5, 6);
    kvs_plan_free(&pl);
    /* attn_chunk 2: chunks {1, 2}, {3, 4}, {5}: columns 1 each again (a
     * chunk's rows each give 1/m to its m keys): the same plan at blending 0 */
    m1_set(m, &p, "blending", "0");
    m1_set(m, &p, "attn_chunk", "2");
    run_B(m, &p, &c, 4, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3, 6);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
    /* a window of queries only: refused */
    m1_cache_init(&c, 1, 1, 1, 7, 3, 1);
    kvs_params_defaults(m, &p);
    kvs_err e = {0};
    kvs_budget b = {0, 3};
    CHECK_FAILS(kvs_compress(m, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID, &e,
                "queries of all");
    m1_cache_free(&c);
}

/* Random shapes: every preset gives an exact, checked plan (kvs_compress
 * checks counts, order, range and the sum), also with few recorded
 * queries (qfilters and simlayerkv read what the view carries). */
static void presets_random(void) {
    const kvs_method *ms[4] = {&kvs_preset_cake, &kvs_preset_simlayerkv, &kvs_preset_qfilters,
                               &kvs_preset_compactor};
    for (int rep = 0; rep < 6; rep++) {
        const int L = 2 + rep % 3, Hkv = 1 + rep % 2, G = 1 + rep % 3, N = 50 + 31 * rep;
        const int d = 4 + 4 * (rep % 3), Nq = rep % 2 ? N : 40;
        m1_cache c;
        m1_cache_init(&c, L, Hkv, Hkv * G, N, Nq, d);
        m1_cache_fill_random(&c, 100 + (uint64_t)rep);
        for (int i = 0; i < (Nq == N ? 4 : 3); i++) {
            kvs_params p;
            kvs_params_defaults(ms[i], &p);
            if (ms[i] == &kvs_preset_simlayerkv) m1_set(ms[i], &p, "recent", "8");
            kvs_plan pl;
            run_B(ms[i], &p, &c, N / 4, &pl);
            if (pl.n_layers == L) {
                long sum = 0;
                for (int l = 0; l < L; l++) sum += pl.layers[l].budget;
                CHECK_EQ_INT(sum, (long)L * (N / 4));
            }
            kvs_plan_free(&pl);
        }
        m1_cache_free(&c);
    }
}

int main(void) {
    cake_hand();
    cake_gamma_order();
    cake_stats_path();
    simlayer_mass();
    simlayer_budgets();
    simlayer_plan();
    qfilter_hand();
    qfilter_plans();
    compactor_hand();
    presets_random();
    printf("test_parts_layerpref: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
