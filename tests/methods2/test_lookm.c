/*
 * test_lookm.c -- tests of methods/lookm.c: a hand-computed golden case with
 * a text prior that changes the selection, merging through kvs_apply checked
 * against a hand computation of the pivotal / average / weighted formulas,
 * the text prior as a property (text outranks image), random shapes against
 * a double-precision naive reference, and the error paths.
 */
#include "m2_ref.h"

/*
 * The golden prompt (same attention as test_h2o.c): N = 6, d = 2, one head,
 * q_i = (sqrt 2, 0), k_j = (ln w_j, y_j), w = [1, 1, 1, 3, 1, 1],
 * y = [2, 1, -1, 0.5, -3, -1], v_j = (j, 1). H2O column sums (x 168):
 *   s = [381, 213, 129, 219, 45, 21] / 168, max = s_0 = 381/168.
 * Modality [I, T, I, I, I, T]: text tokens 1 and 5 get + 381/168:
 *   boosted = [381, 594, 129, 219, 45, 402] / 168.
 * B = 2: M = 1 keeps {5}; top 1 of [0, 5) is 1 (594)       -> {1, 5}
 * B = 3: M = 1; top 2 of [0, 5): 1 (594), 0 (381)           -> {0, 1, 5}
 *        (H2O, and LOOK-M without a mask, give {0, 3, 5})
 * B = 4: M = 2 keeps {4, 5}; top 2 of [0, 4): 1, 0          -> {0, 1, 4, 5}
 */
static void golden_cache(m2_cache *c, int with_mask) {
    static const double w[6] = {1, 1, 1, 3, 1, 1};
    static const double y[6] = {2, 1, -1, 0.5, -3, -1};
    static const uint8_t mod[6] = {KVS_MOD_IMAGE, KVS_MOD_TEXT,  KVS_MOD_IMAGE,
                                   KVS_MOD_IMAGE, KVS_MOD_IMAGE, KVS_MOD_TEXT};
    m2_cache_alloc(c, 1, 6, 1, 1, 2);
    for (int j = 0; j < 6; j++) {
        m2_Q(c, 0, 0, j)[0] = (float)sqrt(2.0);
        m2_K(c, 0, 0, j)[0] = (float)log(w[j]);
        m2_K(c, 0, 0, j)[1] = (float)y[j];
        m2_V(c, 0, 0, j)[0] = (float)j;
        m2_V(c, 0, 0, j)[1] = 1;
    }
    if (with_mask) {
        c->mod = malloc(6);
        memcpy(c->mod, mod, 6);
    }
    m2_cache_views(c, 6);
}

static void expect_plan(const kvs_params *p, m2_cache *c, int B, const int32_t *want,
                        const char *label) {
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    kvs_budget b = {0, B};
    kvs_status st = kvs_compress(&kvs_method_lookm, p, &c->view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st != KVS_OK) return;
    CHECK_EQ_INT(plan.layers[0].budget, B);
    int same = memcmp(plan.layers[0].idx, want, sizeof(int32_t) * (size_t)B) == 0;
    CHECK_MSG(same, "%s B=%d: got %d %d %d ...", label, B, plan.layers[0].idx[0],
              B > 1 ? plan.layers[0].idx[1] : -1, B > 2 ? plan.layers[0].idx[2] : -1);
    kvs_plan_free(&plan);
}

static void test_golden(void) {
    m2_cache c;
    kvs_params p;
    kvs_params_defaults(&kvs_method_lookm, &p);
    golden_cache(&c, 1);
    expect_plan(&p, &c, 2, (const int32_t[]){1, 5}, "text prior");
    expect_plan(&p, &c, 3, (const int32_t[]){0, 1, 5}, "text prior");
    expect_plan(&p, &c, 4, (const int32_t[]){0, 1, 4, 5}, "text prior");
    expect_plan(&p, &c, 6, (const int32_t[]){0, 1, 2, 3, 4, 5}, "text prior");
    m2_cache_free(&c);
    /* no mask: everything is text, the ranking is H2O's */
    golden_cache(&c, 0);
    expect_plan(&p, &c, 3, (const int32_t[]){0, 3, 5}, "no mask");
    m2_cache_free(&c);
}

/* Merging through core's kvs_apply, B = 2, kept {1, 5}, evicted {0, 2, 3, 4}.
 * Cosine of keys: k_1 = (0, 1), k_5 = (0, -1); k_0 = (0, 2) and
 * k_3 = (ln 3, 0.5) have positive y -> assigned to 1; k_2 = (0, -1) and
 * k_4 = (0, -3) -> assigned to 5. So S_1 = {0, 3}, S_5 = {2, 4}, n = 2.
 * pivotal: k_1' = (k_1 + (k_0+k_1)/2 + (k_3+k_1)/2) / 3
 *               = ((0,1) + (0,1.5) + (ln3/2, 0.75)) / 3 = (ln3/6, 13/12)
 *          k_5' = ((0,-1) + (0,-1) + (0,-2)) / 3 = (0, -4/3)
 *          v_1' = ((1,1) + (0.5,1) + (2,1)) / 3 = (7/6, 1)
 *          v_5' = ((5,1) + (3.5,1) + (4.5,1)) / 3 = (13/3, 1)
 * average: k_1' = (k_1 + k_0 + k_3) / 3 = (ln3/3, 3.5/3), v_1' = (4/3, 1)
 *          k_5' = (0, -5/3), v_5' = (11/3, 1)
 * weighted: cos(k_0,k_1) = 1, cos(k_3,k_1) = c3 = 0.5 / sqrt(ln^2 3 + 0.25):
 *          k_1' = (k_1 + k_0 + c3 k_3) / 3, v_1' = (v_1 + v_0 + c3 v_3) / 3
 *          cos(k_2,k_5) = 1, cos(k_4,k_5) = 1: k_5' = (0, -5/3), v_5' = (11/3, 1)
 */
static void apply_and_check(const char *merge, kvs_merge want_merge, const float want_k[2][2],
                            const float want_v[2][2]) {
    m2_cache c;
    golden_cache(&c, 1);
    kvs_params p;
    kvs_err err_store = {0}, *err = &err_store;
    kvs_params_defaults(&kvs_method_lookm, &p);
    CHECK_OK(kvs_params_set(&kvs_method_lookm, &p, "merge", merge, err), err);
    kvs_plan plan;
    kvs_budget b = {0, 2};
    kvs_status st = kvs_compress(&kvs_method_lookm, &p, &c.view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK(plan.merge == want_merge);
        CHECK(plan.layers[0].idx[0] == 1 && plan.layers[0].idx[1] == 5);
        kvs_dense_cache out;
        memset(&out, 0, sizeof out);
        st = kvs_apply(&c.view, &plan, &out, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            CHECK_EQ_INT(out.layers[0].n_tokens, 2);
            for (int t = 0; t < 2; t++)
                for (int e = 0; e < 2; e++) {
                    CHECK_NEAR(out.layers[0].k[t * 2 + e], want_k[t][e], 1e-6);
                    CHECK_NEAR(out.layers[0].v[t * 2 + e], want_v[t][e], 1e-6);
                }
            kvs_dense_cache_free(&out);
        }
        kvs_plan_free(&plan);
    }
    m2_cache_free(&c);
}

static void test_merge_apply(void) {
    const float l3 = (float)log(3.0);
    const float c3 = (float)(0.5 / sqrt(log(3.0) * log(3.0) + 0.25));
    {
        const float k[2][2] = {{l3 / 6, 13.0f / 12}, {0, -4.0f / 3}};
        const float v[2][2] = {{7.0f / 6, 1}, {13.0f / 3, 1}};
        apply_and_check("pivotal", KVS_MERGE_PIVOTAL, k, v);
    }
    {
        const float k[2][2] = {{l3 / 3, 3.5f / 3}, {0, -5.0f / 3}};
        const float v[2][2] = {{4.0f / 3, 1}, {11.0f / 3, 1}};
        apply_and_check("average", KVS_MERGE_AVERAGE, k, v);
    }
    {
        const float k[2][2] = {{c3 * l3 / 3, (1 + 2 + c3 * 0.5f) / 3}, {0, -5.0f / 3}};
        const float v[2][2] = {{(1 + 0 + c3 * 3) / 3, (1 + 1 + c3) / 3}, {11.0f / 3, 1}};
        apply_and_check("weighted", KVS_MERGE_WEIGHTED, k, v);
    }
    {
        const float k[2][2] = {{0, 1}, {0, -1}};
        const float v[2][2] = {{1, 1}, {5, 1}};
        apply_and_check("none", KVS_MERGE_NONE, k, v);
    }
}

/* Property: with a mask, among tokens outside the recent window, no image
 * token is kept while a text token is evicted. */
static void test_text_prior_property(void) {
    uint64_t rng = 99;
    kvs_params p;
    kvs_params_defaults(&kvs_method_lookm, &p);
    int cases_with_both = 0;
    for (int t = 0; t < 40; t++) {
        m2_cache c;
        int N = 8 + (int)(kvs_rng_uniform(&rng) * 56);
        m2_cache_alloc(&c, 2, N, 2, 4, 8);
        m2_cache_random(&c, &rng, 1.5);
        m2_random_modality(&c, &rng);
        m2_cache_views(&c, N);
        kvs_budget b = {0.1 + 0.5 * kvs_rng_uniform(&rng), 0};
        kvs_plan plan;
        kvs_err err_store = {0}, *err = &err_store;
        kvs_status st = kvs_compress(&kvs_method_lookm, &p, &c.view, &b, 1, &plan, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            for (int l = 0; l < 2; l++)
                for (int g = 0; g < 2; g++) {
                    int B = plan.layers[l].budget, M = B / 2;
                    const int32_t *idx = plan.layers[l].idx + (size_t)g * B;
                    char kept[M2_NMAX] = {0};
                    for (int i = 0; i < B; i++) kept[idx[i]] = 1;
                    int text_evicted = 0, image_kept = 0;
                    for (int j = 0; j < N - M; j++) {
                        if (c.mod[j] == KVS_MOD_TEXT && !kept[j]) text_evicted = 1;
                        if (c.mod[j] == KVS_MOD_IMAGE && kept[j]) image_kept = 1;
                    }
                    CHECK_MSG(!(text_evicted && image_kept),
                              "case %d layer %d head %d: image kept while text evicted", t, l, g);
                    cases_with_both += text_evicted || image_kept;
                }
            kvs_plan_free(&plan);
        }
        m2_cache_free(&c);
    }
    CHECK(cases_with_both > 20); /* the property was actually exercised */
}

static void test_random(void) {
    kvs_params p;
    kvs_params_defaults(&kvs_method_lookm, &p);
    m2_check_random(&kvs_method_lookm, &p, (m2_refcfg){0, 1, 0, 0.5, 1}, 60, 1, 64, 21);
    /* longer prompts: cross core's query (64) and key (256) tile edges */
    m2_check_random(&kvs_method_lookm, &p, (m2_refcfg){0, 1, 0, 0.5, 1}, 6, 65, M2_NMAX, 23);
    kvs_err err_store = {0}, *err = &err_store;
    CHECK_OK(kvs_params_set(&kvs_method_lookm, &p, "recent_frac", "0.25", err), err);
    m2_check_random(&kvs_method_lookm, &p, (m2_refcfg){0, 1, 0, 0.25, 1}, 20, 1, 64, 22);
}

static void test_errors(void) {
    m2_cache c;
    golden_cache(&c, 1);
    kvs_params p;
    kvs_params_defaults(&kvs_method_lookm, &p);
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_budget b = {0.5, 0};

    /* keep_all breaks the exact-budget contract */
    kvs_params pk = p;
    CHECK_OK(kvs_params_set(&kvs_method_lookm, &pk, "text_policy", "keep_all", err), err);
    CHECK_FAILS(kvs_compress(&kvs_method_lookm, &pk, &c.view, &b, 1, &plan, err),
                KVS_ERR_UNSUPPORTED, err, "exact-budget");
    CHECK(strstr(err->msg, "text_policy=keep_all") != NULL);

    /* missing and insufficient queries */
    m2_cache_views(&c, 0);
    CHECK_FAILS(kvs_compress(&kvs_method_lookm, &p, &c.view, &b, 1, &plan, err), KVS_ERR_INVALID,
                err, "Nq=0");
    CHECK_MSG(strstr(err->msg, "lookm") != NULL, "message: %s", err->msg);
    CHECK_FAILS(m2_run_direct(&kvs_method_lookm, &p, &c, -1, 3, &plan, err), KVS_ERR_INVALID,
                err, "lookm: needs the queries of all N=6 prompt positions");
    CHECK(strstr(err->msg, "Nq=0") != NULL);
    m2_cache_views(&c, 2);
    CHECK_FAILS(m2_run_direct(&kvs_method_lookm, &p, &c, 6, 3, &plan, err), KVS_ERR_INVALID,
                err, "lookm: layer 0: needs the queries of all N=6 prompt positions "
                      "(KVS_NEED_Q_ALL) but got Nq=2");
    m2_cache_views(&c, 6);

    /* a modality value that is not KVS_MOD_* */
    c.mod[3] = 9;
    CHECK_FAILS(m2_run_direct(&kvs_method_lookm, &p, &c, -1, 3, &plan, err), KVS_ERR_INVALID,
                err, "lookm: layer 0: modality[3] = 9");
    c.mod[3] = KVS_MOD_IMAGE;

    CHECK_FAILS(kvs_params_set(&kvs_method_lookm, &p, "merge", "sum", err), KVS_ERR_INVALID,
                err, "merge");
    m2_cache_free(&c);
}

static void test_declaration(void) {
    CHECK(strcmp(kvs_method_lookm.name, "lookm") == 0);
    CHECK(kvs_method_lookm.needs & KVS_NEED_Q_ALL);
    CHECK(kvs_method_lookm.needs & KVS_NEED_MODALITY);
    CHECK(kvs_method_find("lookm") == &kvs_method_lookm);
    CHECK_EQ_INT(kvs_method_lookm.queries_wanted(NULL, 77), 77);
    kvs_params p;
    kvs_params_defaults(&kvs_method_lookm, &p);
    CHECK_EQ_INT(p.n, 3);
    CHECK(kvs_param_get(&kvs_method_lookm, &p, "text_policy") == 0.0); /* budget */
    CHECK(kvs_param_get(&kvs_method_lookm, &p, "merge") == 0.0);       /* pivotal */
    CHECK(kvs_param_get(&kvs_method_lookm, &p, "recent_frac") == 0.5);
    /* the default plan merges with the pivotal formula */
    m2_cache c;
    golden_cache(&c, 1);
    kvs_plan plan;
    kvs_err err_store = {0}, *err = &err_store;
    kvs_budget b = {0.5, 0};
    kvs_status st = kvs_compress(&kvs_method_lookm, &p, &c.view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK(plan.merge == KVS_MERGE_PIVOTAL);
        kvs_plan_free(&plan);
    }
    m2_cache_free(&c);
}

int main(void) {
    test_declaration();
    test_golden();
    test_merge_apply();
    test_text_prior_property();
    test_random();
    test_errors();
    return kvs_test_finish("test_lookm");
}
