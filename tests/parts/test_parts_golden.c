/*
 * test_parts_golden.c -- hand-checked plans of the knorm, keydiff, tova and
 * lagkv presets, and of the chunk pick rule, on 1-layer toy caches (the expected
 * sets computed by hand below).
 */
#include "kvs_parts.h"
#include "m1_util.h"

static void setk(m1_cache *c, int h, int n, float x, float y) {
    m1_k(c, 0, h, n)[0] = x;
    m1_k(c, 0, h, n)[1] = y;
}

static void run_B(const kvs_method *m, const kvs_params *p, m1_cache *c, int B, kvs_plan *pl) {
    kvs_err e = {0};
    kvs_budget b = {0, B};
    memset(pl, 0, sizeof *pl);
    CHECK_OK(kvs_compress(m, p, &c->view, &b, 1, pl, &e), &e);
}

/* knorm, L = 1, Hkv = 2, N = 6, d = 2. Score = -||k||.
 *   head 0: k = (3,0) (1,0) (0,2) (.5,.5) (4,3) (0,-1.5)
 *           norms 3, 1, 2, 0.707, 5, 1.5
 *     B = 3: the three lowest norms: tokens 3 (0.707), 1 (1), 5 (1.5) -> {1, 3, 5}
 *     B = 3, sinks = 1: token 0, then the two lowest of 1..5: 3, 1  -> {0, 1, 3}
 *   head 1: k = (0,1) x 6 tokens scaled by 6, 5, 4, 3, 2, 1 (norms 6 .. 1)
 *     B = 3: the last three (norms 3, 2, 1)                        -> {3, 4, 5}
 *     B = 3, sinks = 1: 0, then norms 1, 2                          -> {0, 4, 5} */
static void golden_knorm(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 2, 2, 6, 0, 2);
    const float h0[6][2] = {{3, 0}, {1, 0}, {0, 2}, {.5f, .5f}, {4, 3}, {0, -1.5f}};
    for (int n = 0; n < 6; n++) {
        setk(&c, 0, n, h0[n][0], h0[n][1]);
        setk(&c, 1, n, 0, (float)(6 - n));
    }
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(&kvs_preset_knorm, &p);
    run_B(&kvs_preset_knorm, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 1, 3, 5);
    CHECK_ROW(&pl, 0, 1, 3, 4, 5);
    kvs_plan_free(&pl);
    m1_set(&kvs_preset_knorm, &p, "sinks", "1");
    run_B(&kvs_preset_knorm, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 3);
    CHECK_ROW(&pl, 0, 1, 0, 4, 5);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* keydiff, L = 1, Hkv = 1, N = 4, d = 2. Keys (1,0) (2,0) (0,1) (1,1).
 *   anchor = normalized: unit keys (1,0) (1,0) (0,1) (.707,.707),
 *     sum a = (2.707, 1.707), |a| = 3.200;
 *     cos = 0.846, 0.846, 0.533, 0.975; score = -cos.
 *     B = 1: token 2 -> {2};  B = 2: 2, then the tie 0 / 1 -> lower: {0, 2};
 *     B = 3: {0, 1, 2}.
 *   anchor = raw: a = (4, 2), |a| = 4.472; cos = 0.894, 0.894, 0.447, 0.949:
 *     the same order here: B = 2 -> {0, 2}.
 *   A second cache where the anchors disagree: keys (1,0) (1,0) (0,10) (1,1).
 *     normalized: unit keys as above, so cos = .846, .846, .533, .975:
 *       B = 1 -> {2}; B = 2 -> 2, then the tie 0 / 1 -> {0, 2}.
 *     raw: a = (3, 11), |a| = 11.402; cos = .263, .263, .965, .868:
 *       B = 1 -> the tie 0 / 1 -> {0}; B = 2 -> {0, 1}. */
static void golden_keydiff(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 4, 0, 2);
    setk(&c, 0, 0, 1, 0);
    setk(&c, 0, 1, 2, 0);
    setk(&c, 0, 2, 0, 1);
    setk(&c, 0, 3, 1, 1);
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(&kvs_preset_keydiff, &p);
    run_B(&kvs_preset_keydiff, &p, &c, 1, &pl);
    CHECK_ROW(&pl, 0, 0, 2);
    kvs_plan_free(&pl);
    run_B(&kvs_preset_keydiff, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2);
    kvs_plan_free(&pl);
    run_B(&kvs_preset_keydiff, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2);
    kvs_plan_free(&pl);
    m1_set(&kvs_preset_keydiff, &p, "anchor", "raw");
    run_B(&kvs_preset_keydiff, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2);
    kvs_plan_free(&pl);
    /* the window rule: keep token 3, then the best of 0..2 -> {2, 3} */
    kvs_params_defaults(&kvs_preset_keydiff, &p);
    m1_set(&kvs_preset_keydiff, &p, "window", "1");
    run_B(&kvs_preset_keydiff, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    m1_cache_free(&c);

    m1_cache_init(&c, 1, 1, 1, 4, 0, 2);
    setk(&c, 0, 0, 1, 0);
    setk(&c, 0, 1, 1, 0);
    setk(&c, 0, 2, 0, 10);
    setk(&c, 0, 3, 1, 1);
    kvs_params_defaults(&kvs_preset_keydiff, &p);
    run_B(&kvs_preset_keydiff, &p, &c, 1, &pl);
    CHECK_ROW(&pl, 0, 0, 2);
    kvs_plan_free(&pl);
    run_B(&kvs_preset_keydiff, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2);
    kvs_plan_free(&pl);
    m1_set(&kvs_preset_keydiff, &p, "anchor", "raw");
    run_B(&kvs_preset_keydiff, &p, &c, 1, &pl);
    CHECK_ROW(&pl, 0, 0, 0);
    kvs_plan_free(&pl);
    run_B(&kvs_preset_keydiff, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* tova, L = 1, Hkv = 1, Hq = 2 (one GQA group of 2), N = 4, d = 1, only the
 * last query recorded (Nq = 1). Keys 0, 1, 2, 0; query head 0: q = 1,
 * head 1: q = -1 (sqrt(d) = 1).
 *   head 0 logits 0, 1, 2, 0: p = (1, e, e^2, 1) / 12.107
 *                              = .0826, .2245, .6103, .0826
 *   head 1 logits 0, -1, -2, 0: p = (1, 1/e, 1/e^2, 1) / 2.503
 *                              = .3995, .1470, .0541, .3995
 *   group mean: .2410, .1857, .3322, .2410
 *   default (window 1 keeps token 3):
 *     B = 2: 3 + best of 0..2 = 2                   -> {2, 3}
 *     B = 3: 3 + 2 (.3322) + 0 (.2410 > .1857)     -> {0, 2, 3}
 *       (token 0 beats token 1 only through head 1: the mean matters)
 *   window 0: B = 2: 2, then the exact tie 0 / 3 -> lower 0 -> {0, 2} */
static void golden_tova(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 2, 4, 1, 1);
    const float keys[4] = {0, 1, 2, 0};
    for (int n = 0; n < 4; n++) m1_k(&c, 0, 0, n)[0] = keys[n];
    m1_q(&c, 0, 0, 0)[0] = 1;
    m1_q(&c, 0, 1, 0)[0] = -1;
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(&kvs_preset_tova, &p);
    run_B(&kvs_preset_tova, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    run_B(&kvs_preset_tova, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 3);
    kvs_plan_free(&pl);
    m1_set(&kvs_preset_tova, &p, "window", "0");
    run_B(&kvs_preset_tova, &p, &c, 2, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* chunk pick rule (knorm scores, no protect rules, chunk = 3), L = 1,
 * Hkv = 1, N = 8, d = 2; key norms 1 1 1 | 5 5 5 | 1.2 1.2 (chunks [0,3),
 * [3,6), [6,8) from token 0). Scores -norm; chunk sums -3, -15, -2.4.
 *   B = 4: chunk 2 first (sum -2.4 > -3; its MEAN -1.2 would rank it after
 *          chunk 0's -1), taken whole (2), then 2 more: chunk 0 has 3 > 2,
 *          so its best 2 (tie -> lower) 0, 1              -> {0, 1, 6, 7}
 *   B = 5: chunk 2 whole, chunk 0 whole                    -> {0, 1, 2, 6, 7}
 *   B = 1: chunk 2 (2 > 1): its best, tie -> 6             -> {6} */
static const kvs_param_def chunk_params[] = {KVS_PARTS_P_CHUNK(3)};
static const kvs_composition chunk_comp = {.scorer = &kvs_scorer_knorm,
                                           .allocator = &kvs_alloc_uniform,
                                           .pick = &kvs_pick_chunk};
extern const kvs_method chunk_m;
static kvs_status chunk_create(const kvs_params *p, const kvs_shape *s, void **st, kvs_err *e) {
    return kvs_compose_create(&chunk_comp, &chunk_m, p, s, st, e);
}
const kvs_method chunk_m = {.name = "knorm_chunk", .params = chunk_params, .n_params = 1,
                            .create = chunk_create, .observe = kvs_compose_observe,
                            .select = kvs_compose_select, .destroy = kvs_compose_destroy};

static void golden_chunk(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 8, 0, 2);
    const float norms[8] = {1, 1, 1, 5, 5, 5, 1.2f, 1.2f};
    for (int n = 0; n < 8; n++) setk(&c, 0, n, norms[n], 0);
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(&chunk_m, &p);
    run_B(&chunk_m, &p, &c, 4, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 6, 7);
    kvs_plan_free(&pl);
    run_B(&chunk_m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 1, 2, 6, 7);
    kvs_plan_free(&pl);
    run_B(&chunk_m, &p, &c, 1, &pl);
    CHECK_ROW(&pl, 0, 0, 6);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

/* lagkv preset, sinks 1, lag 2, L = 1, Hkv = 1, N = 9, d = 2, V = 0 (every
 * V channel constant: its softmax is 1/2 for both tokens of a partition).
 * Token 0 is the sink (kept by the sinks rule); partitions [1,3) [3,5)
 * [5,7) [7,9); the last is the tail (score 1). Keys:
 *   t0 (5,5) | t1 (0,0) t2 (1,0) | t3 (0,1) t4 (1,0) | t5 (1,1) t6 (0,3) |
 *   t7 (0,1) t8 (1,0)
 *   [1,3) vs [3,5): ranges c0 [0,1], c1 [0,1]: x1 = (0,0) spread 0,
 *     x2 = (1,0) spread 1/sqrt2 = .7071 -> ranks t1 0, t2 1/2
 *   [3,5) vs [5,7): ranges c0 [0,1], c1 [1,3]: x3 = (0,0) spread 0,
 *     x4 = (1,-.5) spread 1.0607 -> t3 0, t4 1/2
 *   [5,7) vs [7,9): ranges [0,1] both: x5 = (1,1) spread 0, x6 = (0,3)
 *     spread 2.1213 -> t5 0, t6 1/2
 * rank scores: t1 0, t2 .5, t3 0, t4 .5, t5 0, t6 .5, t7 1, t8 1.
 *   B = 5: 0, then 7, 8, then the tie at .5 -> lower: 2, 4 -> {0,2,4,7,8}
 *   B = 3: {0, 7, 8};   B = 6: {0, 2, 4, 6, 7, 8}
 * cross_scoring: mean of the K softmax e^s / (1 + e^s) and 1/2:
 *   t2 (.6698+.5)/2 = .585, t4 (.7428+.5)/2 = .621, t6 (.8930+.5)/2 = .697
 *   B = 5: {0, 4, 6, 7, 8} */
static void golden_lagkv(void) {
    const kvs_method *m = &kvs_preset_lagkv;
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 9, 0, 2);
    const float k[9][2] = {{5, 5}, {0, 0}, {1, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 3}, {0, 1}, {1, 0}};
    for (int n = 0; n < 9; n++) setk(&c, 0, n, k[n][0], k[n][1]);
    kvs_params p;
    kvs_plan pl;
    kvs_params_defaults(m, &p);
    m1_set(m, &p, "sinks", "1");
    m1_set(m, &p, "lag", "2");
    run_B(m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 4, 7, 8);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 3, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 7, 8);
    kvs_plan_free(&pl);
    run_B(m, &p, &c, 6, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 2, 4, 6, 7, 8);
    kvs_plan_free(&pl);
    m1_set(m, &p, "cross_scoring", "true");
    run_B(m, &p, &c, 5, &pl);
    CHECK_ROW(&pl, 0, 0, 0, 4, 6, 7, 8);
    kvs_plan_free(&pl);
    m1_cache_free(&c);
}

int main(void) {
    golden_chunk();
    golden_lagkv();
    golden_knorm();
    golden_keydiff();
    golden_tova();
    printf("test_parts_golden: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
