/*
 * test_methods1_hand.c -- hand-checked cases that pin the exact kept indices
 * of full, random, streamingllm, snapkv and flashcache, and their error
 * paths (bad parameters, too few queries, rerotate). Every expected set is
 * worked out in the comment above its check.
 */
#include "m1_util.h"

#include <math.h>

/* ---- full ----------------------------------------------------------------- */

static void test_full(void) {
    const kvs_method *m = &kvs_method_full;
    m1_cache c;
    m1_cache_init(&c, 2, 2, 2, 5, 0, 2);
    m1_cache_fill_random(&c, 1);
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_plan plan;
    kvs_err e_ = {0}, *e = &e_;
    /* Whatever per-layer budget is asked, every layer and head keeps 0..4. */
    CHECK_OK(m1_run(m, &p, &c, 2, &plan, e), e);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) CHECK_ROW(&plan, l, h, 0, 1, 2, 3, 4);
    CHECK(strstr(plan.note, "ignored") != NULL);
    CHECK_OK(kvs_plan_check(&plan, e), e);
    kvs_plan_free(&plan);
    /* Through the driver at ratio 1 (the budget it enforces is then L*N). */
    kvs_budget b = {1.0, 0};
    CHECK_OK(kvs_compress(m, &p, &c.view, &b, 1, &plan, e), e);
    if (plan.layers) CHECK_ROW(&plan, 1, 1, 0, 1, 2, 3, 4);
    kvs_plan_free(&plan);
    /* full has no parameters. */
    CHECK_FAILS(kvs_params_set(m, &p, "seed", "1", e), KVS_ERR_NOTFOUND, e, "no parameters");
    m1_cache_free(&c);
}

/* ---- random --------------------------------------------------------------- */

static void test_random(void) {
    const kvs_method *m = &kvs_method_random;
    kvs_params p;
    kvs_params_defaults(m, &p);
    CHECK_EQ_INT(m->n_params, 1);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "seed"), 0);
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan plan;
    m1_cache c;
    /* B = N keeps everything; N = 1 keeps token 0. */
    m1_cache_init(&c, 1, 2, 2, 6, 0, 1);
    CHECK_OK(m1_run(m, &p, &c, 6, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 2, 3, 4, 5);
    CHECK_ROW(&plan, 0, 1, 0, 1, 2, 3, 4, 5);
    kvs_plan_free(&plan);
    m1_cache_free(&c);
    m1_cache_init(&c, 1, 1, 1, 1, 0, 1);
    CHECK_OK(m1_run(m, &p, &c, 1, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0);
    kvs_plan_free(&plan);
    m1_cache_free(&c);

    /* Uniformity: N = 10, B = 3, 4000 (seed, layer) draws: every token is kept
     * with probability 3/10; the std of a frequency is sqrt(.3*.7/4000) =
     * 0.0072, the check allows 0.03 (> 4 sigma; deterministic seeds anyway). */
    int count[10] = {0};
    m1_cache_init(&c, 4, 1, 1, 10, 0, 1);
    for (int seed = 0; seed < 1000; seed++) {
        char sv[16];
        snprintf(sv, sizeof sv, "%d", seed);
        m1_set(m, &p, "seed", sv);
        CHECK_OK(m1_run(m, &p, &c, 3, &plan, e), e);
        for (int l = 0; l < 4; l++)
            for (int i = 0; i < 3; i++) count[plan.layers[l].idx[i]]++;
        kvs_plan_free(&plan);
    }
    for (int t = 0; t < 10; t++)
        CHECK_MSG(fabs(count[t] / 4000.0 - 0.3) < 0.03, "token %d kept %d / 4000 times", t,
                  count[t]);
    m1_cache_free(&c);

    /* Heads and seeds give different subsets (N = 50, B = 10). */
    m1_cache_init(&c, 1, 2, 2, 50, 0, 1);
    kvs_plan a, b2;
    m1_set(m, &p, "seed", "7");
    CHECK_OK(m1_run(m, &p, &c, 10, &a, e), e);
    m1_set(m, &p, "seed", "8");
    CHECK_OK(m1_run(m, &p, &c, 10, &b2, e), e);
    CHECK(!m1_plans_equal(&a, &b2));
    CHECK(memcmp(a.layers[0].idx, a.layers[0].idx + 10, sizeof(int32_t) * 10) != 0);
    kvs_plan_free(&a);
    kvs_plan_free(&b2);
    m1_cache_free(&c);

    CHECK_FAILS(kvs_params_set(m, &p, "seed", "-1", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "seed", "1.5", e), KVS_ERR_INVALID, e, "not an integer");
    CHECK_FAILS(kvs_params_set(m, &p, "sed", "1", e), KVS_ERR_NOTFOUND, e, "did you mean 'seed'");
}

/* ---- streamingllm --------------------------------------------------------- */

static void test_streamingllm(void) {
    const kvs_method *m = &kvs_method_streamingllm;
    kvs_params p;
    kvs_params_defaults(m, &p);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "sinks"), 4);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "rerotate"), 0);
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan plan;
    m1_cache c;
    m1_cache_init(&c, 2, 2, 2, 10, 0, 2);
    m1_cache_fill_random(&c, 3);
    /* N = 10, S = 4, B = 6: sinks 0..3 plus the last B - S = 2: 8, 9. Same set
     * in every layer and head. */
    CHECK_OK(m1_run(m, &p, &c, 6, &plan, e), e);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) CHECK_ROW(&plan, l, h, 0, 1, 2, 3, 8, 9);
    kvs_plan_free(&plan);
    /* B = 5: 0..3 plus 9. */
    CHECK_OK(m1_run(m, &p, &c, 5, &plan, e), e);
    CHECK_ROW(&plan, 1, 0, 0, 1, 2, 3, 9);
    kvs_plan_free(&plan);
    /* B = 4 = S and B = 3 < S: the first B. */
    CHECK_OK(m1_run(m, &p, &c, 4, &plan, e), e);
    CHECK_ROW(&plan, 0, 1, 0, 1, 2, 3);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 3, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 2);
    kvs_plan_free(&plan);
    /* B = N: everything. */
    CHECK_OK(m1_run(m, &p, &c, 10, &plan, e), e);
    CHECK_ROW(&plan, 1, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    kvs_plan_free(&plan);
    /* sinks = 0, B = 3: the last 3. sinks = 2, B = 5: 0, 1 and the last 3. */
    m1_set(m, &p, "sinks", "0");
    CHECK_OK(m1_run(m, &p, &c, 3, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 7, 8, 9);
    kvs_plan_free(&plan);
    m1_set(m, &p, "sinks", "2");
    CHECK_OK(m1_run(m, &p, &c, 5, &plan, e), e);
    CHECK_ROW(&plan, 1, 1, 0, 1, 7, 8, 9);
    kvs_plan_free(&plan);
    /* Through the driver: ratio 0.5 -> B = floor(0.5 * 10) = 5, S = 4:
     * 0..3 and 9. */
    kvs_params_defaults(m, &p);
    kvs_budget b = {0.5, 0};
    CHECK_OK(kvs_compress(m, &p, &c.view, &b, 1, &plan, e), e);
    if (plan.layers) CHECK_ROW(&plan, 1, 0, 0, 1, 2, 3, 9);
    kvs_plan_free(&plan);
    /* rerotate = true is refused with the reason. */
    m1_set(m, &p, "rerotate", "true");
    CHECK_FAILS(m1_run(m, &p, &c, 5, &plan, e), KVS_ERR_UNSUPPORTED, e, "pre-RoPE");
    CHECK_FAILS(kvs_compress(m, &p, &c.view, &b, 1, &plan, e), KVS_ERR_UNSUPPORTED, e,
                "rerotate");
    kvs_params_defaults(m, &p);
    CHECK_FAILS(kvs_params_set(m, &p, "sinks", "-1", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "rerotate", "maybe", e), KVS_ERR_INVALID, e,
                "not a boolean");
    m1_cache_free(&c);
}

/* ---- snapkv --------------------------------------------------------------- */

/* N = 8, d = 2, one head, window w = 2: window queries sit at positions 6, 7.
 * With c = 4 sqrt(2), q6 = (c, 0), q7 = (0, c), logits are 4 k[j][0] (q6)
 * and 4 k[j][1] (q7). Keys: k1 = (1, 0), k3 = (0, 0.5), k5 = (0, 1), the
 * rest 0.
 *   q6 over j <= 6: Z = e^4 + 6 = 60.59815; p1 = 0.900988, others 0.0165022.
 *   q7 over j <= 7: Z = 6 + e^2 + e^4 = 67.98721; p5 = 0.803068,
 *                   p3 = 0.108683, others 0.0147086.
 * Votes of the prefix j = 0..5:
 *   v = (0.0312108, 0.9156966, 0.0312108, 0.1251852, 0.0312108, 0.8195702).
 * kernel 1 (no pooling): order 1, 5, 3, then 0, 2, 4 tied (lower first).
 * kernel 3, max: (0.9157, 0.9157, 0.9157, 0.1252, 0.8196, 0.8196):
 *   order 0, 1, 2 (tied, lower first), 4, 5, 3.
 * kernel 3, avg (edges divide by 2):
 *   (0.4734537, 0.3260394, 0.3573642, 0.0625356, 0.3253221, 0.4253905):
 *   order 0, 5, 2, 1, 4, 3.
 * A recorded first query row (Nq = 3) holds garbage (100, -100): only the
 * last w rows may be used. */
static void snapkv_hand_cache(m1_cache *c) {
    m1_cache_init(c, 1, 1, 1, 8, 3, 2);
    const float cq = 4.0f * sqrtf(2.0f);
    m1_k(c, 0, 0, 1)[0] = 1.0f;
    m1_k(c, 0, 0, 3)[1] = 0.5f;
    m1_k(c, 0, 0, 5)[1] = 1.0f;
    m1_q(c, 0, 0, 0)[0] = 100.0f;
    m1_q(c, 0, 0, 0)[1] = -100.0f;
    m1_q(c, 0, 0, 1)[0] = cq;
    m1_q(c, 0, 0, 2)[1] = cq;
}

static void test_snapkv(void) {
    const kvs_method *m = &kvs_method_snapkv;
    kvs_params p;
    kvs_params_defaults(m, &p);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "window"), 32);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "kernel"), 7);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "pool"), 0); /* max */
    CHECK(m->needs & KVS_NEED_Q_WINDOW);
    CHECK_EQ_INT(m->queries_wanted(&p, 1000), 32);
    CHECK_EQ_INT(m->queries_wanted(&p, 20), 20);
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan plan;
    m1_cache c;
    snapkv_hand_cache(&c);
    m1_set(m, &p, "window", "2");
    m1_set(m, &p, "kernel", "1");
    /* B = 4: top 2 of the prefix (1, 5) + window (6, 7). */
    CHECK_OK(m1_run(m, &p, &c, 4, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 1, 5, 6, 7);
    kvs_plan_free(&plan);
    /* B = 5: 1, 3, 5 + window. B = 6: then 0 wins the three-way tie. */
    CHECK_OK(m1_run(m, &p, &c, 5, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 1, 3, 5, 6, 7);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 6, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 3, 5, 6, 7);
    kvs_plan_free(&plan);
    /* B <= w: the last B. */
    CHECK_OK(m1_run(m, &p, &c, 2, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 6, 7);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 1, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 7);
    kvs_plan_free(&plan);
    /* kernel 3, max pooling: B = 5 -> 0, 1, 2 + window; B = 6 -> 0, 1, 2, 4. */
    m1_set(m, &p, "kernel", "3");
    CHECK_OK(m1_run(m, &p, &c, 5, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 2, 6, 7);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 6, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 2, 4, 6, 7);
    kvs_plan_free(&plan);
    /* kernel 3, avg pooling: B = 4 -> 0, 5; B = 5 -> 0, 2, 5; B = 6 -> 0, 1, 2, 5. */
    m1_set(m, &p, "pool", "avg");
    CHECK_OK(m1_run(m, &p, &c, 4, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 5, 6, 7);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 5, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 2, 5, 6, 7);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 6, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 0, 1, 2, 5, 6, 7);
    kvs_plan_free(&plan);
    /* Through the driver: tokens = 4 with kernel 1, max -> 1, 5, 6, 7. */
    m1_set(m, &p, "pool", "max");
    m1_set(m, &p, "kernel", "1");
    kvs_budget b = {0, 4};
    CHECK_OK(kvs_compress(m, &p, &c.view, &b, 2, &plan, e), e);
    if (plan.layers) CHECK_ROW(&plan, 0, 0, 1, 5, 6, 7);
    kvs_plan_free(&plan);
    /* Too few queries: window 4 but Nq = 3 -> an error naming both. */
    m1_set(m, &p, "window", "4");
    CHECK_FAILS(m1_run(m, &p, &c, 5, &plan, e), KVS_ERR_INVALID, e,
                "last 4 prompt positions (window=4) but 3 were recorded");
    CHECK_FAILS(kvs_compress(m, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "but 3 were recorded");
    m1_cache_free(&c);
    /* No queries at all. */
    m1_cache_init(&c, 1, 1, 1, 8, 0, 2);
    CHECK_FAILS(m1_run(m, &p, &c, 5, &plan, e), KVS_ERR_INVALID, e, "but 0 were recorded");
    m1_cache_free(&c);
    /* Parameters. */
    CHECK_FAILS(kvs_params_set(m, &p, "kernel", "0", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "window", "0", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "pool", "median", e), KVS_ERR_INVALID, e, "max|avg");
    CHECK_FAILS(kvs_params_set(m, &p, "windw", "3", e), KVS_ERR_NOTFOUND, e, "window");
}

/* ---- flashcache ----------------------------------------------------------- */

/* N = 8, d = 1, one head: K[n] = 1 + 10 [n == 5], V = 0. gamma = 0.2 gives
 * omega = round(1.6) = 2: the base is the projection on the DCT basis
 * vectors b0 = 1/sqrt(8) and b1[n] = (1/2) cos(pi (2n+1) / 16).
 * The constant 1 is all in b0 (residual 0). The spike 10 e_5 projects to
 * 10/8 = 1.25 on b0 and 10 b1[5] b1[n] = 2.5 cos(11pi/16) cos((2n+1)pi/16) on
 * b1, cos(11pi/16) = -0.555570. Residual r[n] = 10[n == 5] - 1.25
 * + 1.388925 cos((2n+1)pi/16):
 *   n:   0       1        2        3        4        5       6        7
 *   r:  0.1122 -0.0952  -0.4784  -0.9790  -1.5210  7.9784  -2.4049  -2.6122
 *   Dev = r^2 (d = 1, V contributes 0):
 *       0.0126  0.0091   0.2288   0.9585   2.3133  63.65   5.7833   6.8237
 * Order by Dev: 5, 7, 6, 4, 3, 2, 0, 1. */
static void flashcache_spike(m1_cache *c, int Hkv) {
    m1_cache_init(c, 1, Hkv, Hkv, 8, 0, 1);
    for (int h = 0; h < Hkv; h++)
        for (int n = 0; n < 8; n++) m1_k(c, 0, h, n)[0] = 1.0f;
    m1_k(c, 0, 0, 5)[0] += 10.0f;
}

static void test_flashcache_hand(void) {
    const kvs_method *m = &kvs_method_flashcache;
    kvs_params p;
    kvs_params_defaults(m, &p);
    CHECK_NEAR(kvs_param_get(m, &p, "gamma"), 0.2, 1e-12);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "dba"), 1);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "granularity"), 0);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "keep_sinks"), 0);
    CHECK_EQ_INT((int)kvs_param_get(m, &p, "keep_recent"), 0);
    CHECK_EQ_INT(m->needs, 0);
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan plan;
    m1_cache c;
    flashcache_spike(&c, 1);
    struct {
        int B;
        int32_t want[8];
    } cases[] = {
        {1, {5}}, {2, {5, 7}}, {3, {5, 6, 7}}, {4, {4, 5, 6, 7}}, {5, {3, 4, 5, 6, 7}},
        {6, {2, 3, 4, 5, 6, 7}}, {7, {0, 2, 3, 4, 5, 6, 7}}, {8, {0, 1, 2, 3, 4, 5, 6, 7}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(m1_run(m, &p, &c, cases[i].B, &plan, e), e);
        CHECK_MSG(m1_row_is(&plan, 0, 0, cases[i].want, cases[i].B), "spike case B=%d",
                  cases[i].B);
        if (!m1_row_is(&plan, 0, 0, cases[i].want, cases[i].B)) m1_print_row(&plan, 0, 0);
        /* V is all zeros: the note says so (DBA on). */
        CHECK(strstr(plan.note, "zero energy") != NULL);
        kvs_plan_free(&plan);
    }
    /* Forced tokens, counted in the budget:
     *   keep_sinks 1, B = 2 -> 0 + the top Dev of 1..7 = 5.
     *   keep_sinks 1, keep_recent 1, B = 3 -> 0, 7 + top of 1..6 = 5.
     *   keep_recent 2, B = 2 -> the forced 6, 7 fill the budget.
     *   keep_recent 2, B = 3 -> 6, 7 + top of 0..5 = 5.
     *   keep_sinks 3, B = 2 -> the first 2 sinks.
     *   keep_sinks 1, keep_recent 3, B = 3 -> sink 0 then the newest 2: 6, 7. */
    struct {
        const char *s, *r;
        int B;
        int32_t want[4];
    } forced[] = {
        {"1", "0", 2, {0, 5}},    {"1", "1", 3, {0, 5, 7}}, {"0", "2", 2, {6, 7}},
        {"0", "2", 3, {5, 6, 7}}, {"3", "0", 2, {0, 1}},    {"1", "3", 3, {0, 6, 7}},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
        m1_set(m, &p, "keep_sinks", forced[i].s);
        m1_set(m, &p, "keep_recent", forced[i].r);
        CHECK_OK(m1_run(m, &p, &c, forced[i].B, &plan, e), e);
        int ok = m1_row_is(&plan, 0, 0, forced[i].want, forced[i].B);
        CHECK_MSG(ok, "keep_sinks=%s keep_recent=%s B=%d", forced[i].s, forced[i].r, forced[i].B);
        if (!ok) m1_print_row(&plan, 0, 0);
        kvs_plan_free(&plan);
    }
    m1_cache_free(&c);

    /* Two heads: head 0 as above, head 1 K[n] = 1 + 20 [n == 2]. Its residual
     * at 2 is 20 (1 - 1/8 - (1/4) cos^2(5pi/16)) = 15.957 (Dev 254.6); at 5
     * it is 20 (-1/8 - (1/4) cos(5pi/16) cos(11pi/16)) = -0.9567 (Dev 0.915).
     * Per head, B = 1: head 0 keeps 5, head 1 keeps 2. Per layer (Dev summed):
     * 2 (254.6 + 0.23) beats 5 (63.65 + 0.92): B = 1 -> 2; B = 2 -> 2, 5. */
    kvs_params_defaults(m, &p);
    flashcache_spike(&c, 2);
    m1_k(&c, 0, 1, 2)[0] += 20.0f;
    CHECK_OK(m1_run(m, &p, &c, 1, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 5);
    CHECK_ROW(&plan, 0, 1, 2);
    kvs_plan_free(&plan);
    m1_set(m, &p, "granularity", "layer");
    CHECK_OK(m1_run(m, &p, &c, 1, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 2);
    CHECK_ROW(&plan, 0, 1, 2);
    kvs_plan_free(&plan);
    CHECK_OK(m1_run(m, &p, &c, 2, &plan, e), e);
    CHECK_ROW(&plan, 0, 0, 2, 5);
    CHECK_ROW(&plan, 0, 1, 2, 5);
    kvs_plan_free(&plan);
    m1_cache_free(&c);

    /* DBA, N = 16, d = 1, one head, omega = round(3.2) = 3 (m = 0, 1, 2 low).
     * Layer 0: K = V = DCT basis vector m = 1 (all energy low): R^0 = 0.
     * Layer 1: K = V = basis vector m = 15 (all energy high): R^1 = 2.
     * per_layer 4 -> total 8, B_min = max(1, ceil(0.16)) = 1: layer 0 gets
     * its share 0 clamped up to 1, layer 1 the other 7. dba = false: 4, 4.
     * Then layer 0: K high (m = 15), V low (m = 1): R^0 = 1, R^1 = 2, per_layer
     * 3 -> total 6 split 1 : 2 = 2, 4. */
    kvs_params_defaults(m, &p);
    m1_cache_init(&c, 2, 1, 1, 16, 0, 1);
    for (int n = 0; n < 16; n++) {
        float b1 = (float)(sqrt(2.0 / 16) * cos(3.14159265358979 * (2 * n + 1) * 1 / 32.0));
        float b15 = (float)(sqrt(2.0 / 16) * cos(3.14159265358979 * (2 * n + 1) * 15 / 32.0));
        m1_k(&c, 0, 0, n)[0] = m1_v(&c, 0, 0, n)[0] = b1;
        m1_k(&c, 1, 0, n)[0] = m1_v(&c, 1, 0, n)[0] = b15;
    }
    CHECK_OK(m1_run(m, &p, &c, 4, &plan, e), e);
    CHECK_EQ_INT(plan.layers[0].budget, 1);
    CHECK_EQ_INT(plan.layers[1].budget, 7);
    kvs_plan_free(&plan);
    m1_set(m, &p, "dba", "false");
    CHECK_OK(m1_run(m, &p, &c, 4, &plan, e), e);
    CHECK_EQ_INT(plan.layers[0].budget, 4);
    CHECK_EQ_INT(plan.layers[1].budget, 4);
    kvs_plan_free(&plan);
    m1_set(m, &p, "dba", "true");
    for (int n = 0; n < 16; n++) m1_k(&c, 0, 0, n)[0] = m1_k(&c, 1, 0, n)[0];
    CHECK_OK(m1_run(m, &p, &c, 3, &plan, e), e);
    CHECK_EQ_INT(plan.layers[0].budget, 2);
    CHECK_EQ_INT(plan.layers[1].budget, 4);
    CHECK(plan.note[0] == '\0');
    kvs_plan_free(&plan);
    /* Through the driver: total exact. */
    kvs_budget b = {0.25, 0};
    CHECK_OK(kvs_compress(m, &p, &c.view, &b, 1, &plan, e), e);
    CHECK_EQ_INT(kvs_plan_total(&plan), 2 * 4);
    kvs_plan_free(&plan);
    m1_cache_free(&c);

    /* Parameters. */
    kvs_params_defaults(m, &p);
    CHECK_FAILS(kvs_params_set(m, &p, "gamma", "0", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "gamma", "1.5", e), KVS_ERR_INVALID, e, "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "gama", "0.1", e), KVS_ERR_NOTFOUND, e,
                "did you mean 'gamma'");
    CHECK_FAILS(kvs_params_set(m, &p, "granularity", "token", e), KVS_ERR_INVALID, e,
                "head|layer");
    CHECK_FAILS(kvs_params_set(m, &p, "keep_sinks", "-2", e), KVS_ERR_INVALID, e,
                "out of range");
    CHECK_FAILS(kvs_params_set(m, &p, "dba", "yes please", e), KVS_ERR_INVALID, e, "boolean");
    /* gamma = 1 is legal: omega = N, the base is K itself. */
    m1_set(m, &p, "gamma", "1");
    /* A gamma that bypassed kvs_params_set is still refused by create(). */
    p.v[0] = 0.0;
    flashcache_spike(&c, 1);
    CHECK_FAILS(m1_run(m, &p, &c, 2, &plan, e), KVS_ERR_INVALID, e, "gamma=0 outside (0, 1]");
    m1_cache_free(&c);
    /* A transform failing in one (head, K|V) unit (here a V that is not a
     * float type, which only the method's own table lets through) is
     * reported with its layer, head and K|V, 2 threads or 1. */
    kvs_params_defaults(m, &p);
    flashcache_spike(&c, 2);
    for (int threads = 1; threads <= 2; threads++) {
        kvs_shape s = m1_shape(&c, threads);
        void *state = NULL;
        CHECK_OK(m->create(&p, &s, &state, e), e);
        if (!state) continue;
        kvs_layer bad = c.layers[0];
        bad.v.dtype = KVS_U8;
        CHECK_FAILS(m->observe(state, 0, &bad, NULL, e), KVS_ERR_INVALID, e,
                    "flashcache: layer 0 head 0 V: kvs_dct_lowpass_sqres: dtype");
        m->destroy(state);
    }
    m1_cache_free(&c);
}

int main(void) {
    test_full();
    test_random();
    test_streamingllm();
    test_snapkv();
    test_flashcache_hand();
    return kvs_test_finish("test_methods1_hand");
}
