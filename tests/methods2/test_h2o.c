/*
 * test_h2o.c -- tests of methods/h2o.c: a hand-computed golden case (exact
 * indices for several budgets, raw and normalised scores), random shapes
 * against a double-precision naive reference, and the error paths
 * (missing / insufficient queries, bad parameters, misuse of the contract).
 */
#include "m2_ref.h"

/*
 * The golden prompt: N = 6, d = 2, one head. Every query is q_i = (sqrt 2, 0)
 * and key j is k_j = (ln w_j, y_j), so the logit is q.k / sqrt(2) = ln w_j
 * and exp(logit) = w_j, with w = [1, 1, 1, 3, 1, 1]. Row i of the causal
 * attention is A[i][j] = w_j / W_i, W_i = w_0 + ... + w_i = [1, 2, 3, 6, 7, 8].
 * Column sums s[j] = w_j * T_j with T_j = sum_{i >= j} 1 / W_i:
 *   T_5 = 1/8 = 21/168          s_5 =  21/168 = 0.125
 *   T_4 = 1/7 + 1/8 = 45/168    s_4 =  45/168 = 0.268
 *   T_3 = 1/6 + T_4 = 73/168    s_3 = 219/168 = 1.304  (w_3 = 3: the heavy hitter)
 *   T_2 = 1/3 + T_3 = 129/168   s_2 = 129/168 = 0.768
 *   T_1 = 1/2 + T_2 = 213/168   s_1 = 213/168 = 1.268
 *   T_0 = 1 + T_1 = 381/168     s_0 = 381/168 = 2.268  (the sink)
 * (sum = 1008/168 = 6 = N, as every row sums to 1). Ranking: 0, 3, 1, 2, 4, 5.
 * normalize divides by N - j = 6..1: [0.378, 0.254, 0.192, 0.435, 0.134,
 * 0.125], ranking 3, 0, 1, 2, 4, 5.
 * y_j only matters for merging (not used by H2O).
 */
static void golden_cache(m2_cache *c) {
    static const double w[6] = {1, 1, 1, 3, 1, 1};
    static const double y[6] = {2, 1, -1, 0.5, -3, -1};
    m2_cache_alloc(c, 1, 6, 1, 1, 2);
    for (int j = 0; j < 6; j++) {
        m2_Q(c, 0, 0, j)[0] = (float)sqrt(2.0);
        m2_Q(c, 0, 0, j)[1] = 0;
        m2_K(c, 0, 0, j)[0] = (float)log(w[j]);
        m2_K(c, 0, 0, j)[1] = (float)y[j];
        m2_V(c, 0, 0, j)[0] = (float)j;
        m2_V(c, 0, 0, j)[1] = 1;
    }
    m2_cache_views(c, 6);
}

static void expect_plan(const kvs_params *p, m2_cache *c, int B, const int32_t *want,
                        const char *label) {
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    kvs_budget b = {0, B};
    CHECK_OK(kvs_compress(&kvs_method_h2o, p, &c->view, &b, 1, &plan, err), err);
    if (err->code != KVS_OK) return;
    CHECK_EQ_INT(plan.layers[0].budget, B);
    int same = memcmp(plan.layers[0].idx, want, sizeof(int32_t) * (size_t)B) == 0;
    CHECK_MSG(same, "%s B=%d: got %d %d %d ...", label, B, plan.layers[0].idx[0],
              B > 1 ? plan.layers[0].idx[1] : -1, B > 2 ? plan.layers[0].idx[2] : -1);
    CHECK(plan.merge == KVS_MERGE_NONE);
    kvs_plan_free(&plan);
}

static void test_golden(void) {
    m2_cache c;
    golden_cache(&c);
    kvs_params p;
    kvs_err err_store = {0}, *err = &err_store;
    kvs_params_defaults(&kvs_method_h2o, &p);
    /* raw sums: B=2 r=1 {5} + top1 of [0,5) = 0 */
    expect_plan(&p, &c, 1, (const int32_t[]){0}, "raw"); /* r = 0: top 1 overall */
    expect_plan(&p, &c, 2, (const int32_t[]){0, 5}, "raw");
    expect_plan(&p, &c, 3, (const int32_t[]){0, 3, 5}, "raw");    /* heavy hitter 3 beats 1 */
    expect_plan(&p, &c, 4, (const int32_t[]){0, 3, 4, 5}, "raw"); /* r = 2, top 2 of [0,4) */
    expect_plan(&p, &c, 5, (const int32_t[]){0, 1, 3, 4, 5}, "raw");
    expect_plan(&p, &c, 6, (const int32_t[]){0, 1, 2, 3, 4, 5}, "raw");
    /* normalised: 3 outranks the sink */
    CHECK_OK(kvs_params_set(&kvs_method_h2o, &p, "normalize", "true", err), err);
    expect_plan(&p, &c, 2, (const int32_t[]){3, 5}, "normalize");
    expect_plan(&p, &c, 3, (const int32_t[]){0, 3, 5}, "normalize");
    /* no recent window: top 2 overall by raw sums */
    kvs_params_defaults(&kvs_method_h2o, &p);
    CHECK_OK(kvs_params_set(&kvs_method_h2o, &p, "recent_frac", "0", err), err);
    expect_plan(&p, &c, 2, (const int32_t[]){0, 3}, "recent_frac=0");
    /* all recent: the last B */
    CHECK_OK(kvs_params_set(&kvs_method_h2o, &p, "recent_frac", "1", err), err);
    expect_plan(&p, &c, 3, (const int32_t[]){3, 4, 5}, "recent_frac=1");
    m2_cache_free(&c);
}

/* Two KV heads with GQA (G = 2): each KV head keeps its own set, the same
 * count; query heads of KV head 1 attend uniformly (q = 0), so its column
 * sums are H_6 - H_j: monotone, the earliest tokens win. */
static void test_per_head(void) {
    m2_cache c;
    m2_cache_alloc(&c, 1, 6, 2, 4, 2);
    static const double w[6] = {1, 1, 1, 3, 1, 1};
    for (int j = 0; j < 6; j++) {
        for (int h = 0; h < 2; h++) {
            m2_Q(&c, 0, h, j)[0] = (float)sqrt(2.0); /* KV head 0's group */
            m2_Q(&c, 0, 2 + h, j)[0] = 0;           /* KV head 1's group */
        }
        m2_K(&c, 0, 0, j)[0] = (float)log(w[j]);
        m2_K(&c, 0, 1, j)[0] = (float)log(w[j]);
    }
    m2_cache_views(&c, 6);
    kvs_params p;
    kvs_params_defaults(&kvs_method_h2o, &p);
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    kvs_budget b = {0, 3};
    CHECK_OK(kvs_compress(&kvs_method_h2o, &p, &c.view, &b, 1, &plan, err), err);
    if (err->code == KVS_OK) {
        const int32_t want0[3] = {0, 3, 5}, want1[3] = {0, 1, 5};
        CHECK(memcmp(plan.layers[0].idx, want0, sizeof want0) == 0);
        CHECK(memcmp(plan.layers[0].idx + 3, want1, sizeof want1) == 0);
        kvs_plan_free(&plan);
    }
    m2_cache_free(&c);
}

/* The golden case stored as fp16 (K, V, Q converted; ln 3 and sqrt 2 round
 * to within 1e-3, far from any tie): the same selection. */
static void test_golden_f16(void) {
    m2_cache c;
    golden_cache(&c);
    uint16_t kh[12], vh[12], qh[12]; /* [1][6][2] each */
    for (int i = 0; i < 12; i++) {
        kh[i] = kvs_f32_to_f16(c.k[i]);
        vh[i] = kvs_f32_to_f16(c.v[i]);
        qh[i] = kvs_f32_to_f16(c.q[i]);
    }
    c.layers[0].k = kvs_view_make(kh, KVS_F16, 1, 6, 2);
    c.layers[0].v = kvs_view_make(vh, KVS_F16, 1, 6, 2);
    c.layers[0].q = kvs_view_make(qh, KVS_F16, 1, 6, 2);
    kvs_params p;
    kvs_params_defaults(&kvs_method_h2o, &p);
    expect_plan(&p, &c, 3, (const int32_t[]){0, 3, 5}, "f16");
    expect_plan(&p, &c, 5, (const int32_t[]){0, 1, 3, 4, 5}, "f16");
    m2_cache_free(&c);
}

static void test_random(void) {
    kvs_params p;
    kvs_err err_store = {0}, *err = &err_store;
    kvs_params_defaults(&kvs_method_h2o, &p);
    m2_check_random(&kvs_method_h2o, &p, (m2_refcfg){0, 0, 0, 0.5, 0}, 60, 1, 64, 11);
    /* longer prompts: cross core's query (64) and key (256) tile edges */
    m2_check_random(&kvs_method_h2o, &p, (m2_refcfg){0, 0, 0, 0.5, 0}, 6, 65, M2_NMAX, 14);
    CHECK_OK(kvs_params_set(&kvs_method_h2o, &p, "normalize", "true", err), err);
    m2_check_random(&kvs_method_h2o, &p, (m2_refcfg){1, 0, 0, 0.5, 0}, 30, 1, 64, 12);
    kvs_params_defaults(&kvs_method_h2o, &p);
    CHECK_OK(kvs_params_set(&kvs_method_h2o, &p, "recent_frac", "0.3", err), err);
    m2_check_random(&kvs_method_h2o, &p, (m2_refcfg){0, 0, 0, 0.3, 0}, 30, 1, 64, 13);
}

static void test_errors(void) {
    m2_cache c;
    golden_cache(&c);
    kvs_params p;
    kvs_params_defaults(&kvs_method_h2o, &p);
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_budget b = {0.5, 0};

    /* no queries at all: through kvs_compress and through the method itself */
    m2_cache_views(&c, 0);
    CHECK_FAILS(kvs_compress(&kvs_method_h2o, &p, &c.view, &b, 1, &plan, err), KVS_ERR_INVALID,
                err, "Nq=0");
    CHECK_MSG(strstr(err->msg, "h2o") != NULL, "message: %s", err->msg);
    CHECK_FAILS(m2_run_direct(&kvs_method_h2o, &p, &c, -1, 3, &plan, err), KVS_ERR_INVALID, err,
                "h2o: needs the queries of all N=6 prompt positions");
    CHECK(strstr(err->msg, "Nq=0") != NULL);
    /* the observe guard: create told Nq = N, the layer brings none / 4 */
    CHECK_FAILS(m2_run_direct(&kvs_method_h2o, &p, &c, 6, 3, &plan, err), KVS_ERR_INVALID, err,
                "h2o: layer 0: needs the queries of all N=6");
    m2_cache_views(&c, 4);
    CHECK_FAILS(kvs_compress(&kvs_method_h2o, &p, &c.view, &b, 1, &plan, err), KVS_ERR_INVALID,
                err, "Nq=4");
    CHECK_MSG(strstr(err->msg, "h2o") != NULL, "message: %s", err->msg);
    CHECK_FAILS(m2_run_direct(&kvs_method_h2o, &p, &c, -1, 3, &plan, err), KVS_ERR_INVALID, err,
                "got Nq=4");
    CHECK_FAILS(m2_run_direct(&kvs_method_h2o, &p, &c, 6, 3, &plan, err), KVS_ERR_INVALID, err,
                "h2o: layer 0: needs the queries of all N=6 prompt positions (KVS_NEED_Q_ALL) but "
                "got Nq=4");
    m2_cache_views(&c, 6);

    /* parameters */
    CHECK_FAILS(kvs_params_set(&kvs_method_h2o, &p, "recent_frac", "1.5", err), KVS_ERR_INVALID,
                err, "recent_frac");
    kvs_params bad = p;
    bad.v[1] = 2.0; /* hand-filled, bypassing kvs_params_set */
    void *state = NULL;
    kvs_shape sh = {1, 6, 1, 1, 2, 6, 1};
    CHECK_FAILS(kvs_method_h2o.create(&bad, &sh, &state, err), KVS_ERR_INVALID, err,
                "h2o: parameter recent_frac");
    CHECK(state == NULL);

    /* contract misuse: select before observe, observe out of order */
    CHECK_OK(kvs_method_h2o.create(&p, &sh, &state, err), err);
    if (state) {
        CHECK_FAILS(kvs_method_h2o.select(state, 3, &plan, err), KVS_ERR_INVALID, err,
                    "select after 0 of 1 layers");
        CHECK_FAILS(kvs_method_h2o.observe(state, 1, &c.layers[0], NULL, err), KVS_ERR_INVALID,
                    err, "out of order");
        CHECK_OK(kvs_method_h2o.observe(state, 0, &c.layers[0], NULL, err), err);
        CHECK_FAILS(kvs_method_h2o.select(state, 7, &plan, err), KVS_ERR_INVALID, err,
                    "per-layer budget 7 outside [1, N=6]");
        kvs_method_h2o.destroy(state);
    }
    /* shape disagreeing with create */
    kvs_shape sh2 = {1, 6, 2, 2, 2, 6, 1};
    state = NULL;
    CHECK_OK(kvs_method_h2o.create(&p, &sh2, &state, err), err);
    if (state) {
        CHECK_FAILS(kvs_method_h2o.observe(state, 0, &c.layers[0], NULL, err), KVS_ERR_INVALID,
                    err, "do not match the shape");
        kvs_method_h2o.destroy(state);
    }
    /* NaN in K: rejected, naming the layer */
    m2_K(&c, 0, 0, 2)[1] = NAN;
    kvs_err_clear(err);
    CHECK(kvs_compress(&kvs_method_h2o, &p, &c.view, &b, 1, &plan, err) == KVS_ERR_NUMERIC);
    CHECK_MSG(strstr(err->msg, "layer 0") != NULL, "message: %s", err->msg);
    m2_cache_free(&c);
}

static void test_declaration(void) {
    CHECK(strcmp(kvs_method_h2o.name, "h2o") == 0);
    CHECK(kvs_method_h2o.needs & KVS_NEED_Q_ALL);
    CHECK(kvs_method_find("h2o") == &kvs_method_h2o);
    CHECK_EQ_INT(kvs_method_h2o.queries_wanted(NULL, 123), 123);
    kvs_params p;
    kvs_params_defaults(&kvs_method_h2o, &p);
    CHECK_EQ_INT(p.n, 2);
    CHECK(kvs_param_get(&kvs_method_h2o, &p, "normalize") == 0.0);
    CHECK(kvs_param_get(&kvs_method_h2o, &p, "recent_frac") == 0.5);
}

int main(void) {
    test_declaration();
    test_golden();
    test_golden_f16();
    test_per_head();
    test_random();
    test_errors();
    return kvs_test_finish("test_h2o");
}
