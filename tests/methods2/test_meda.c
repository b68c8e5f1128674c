/*
 * test_meda.c -- tests of methods/meda.c: layer budgets follow entropy
 * (hand-computed plain-entropy case, and a cross-modal case built so that
 * plain and cross-modal entropy disagree), the single-modality fallback and
 * its note, exact global sums, random shapes against a double-precision
 * naive reference (entropies, budgets, text-prior selection), error paths.
 */
#include "m2_ref.h"

/*
 * Plain-entropy case: L = 2, N = 8, d = 2, one head, no modality mask.
 * Uniform layer: q = 0, every row of the causal attention is uniform over
 *   its i + 1 keys: E = mean_i ln(i + 1) = ln(8!) / 8 = 10.6046 / 8 = 1.32558.
 * Peaked layer: q_i = (10 sqrt 2, 0), k_0 = (10, 0), k_j = (0, 1): logit 100
 *   on key 0, 0 elsewhere -> each row ~ one-hot on key 0, E ~ 0 (< 1e-40).
 * softmax(E) = (e^1.32558, 1) / (e^1.32558 + 1) = (0.79012, 0.20988);
 * per_layer 4, total 8: shares 6.321, 1.679 -> floors 6, 1, remainder 1 to
 * the larger remainder (0.679) -> budgets [6, 2].
 * Selection (recent_frac 0.5, all text so the boost changes nothing):
 *   uniform layer, B = 6: M = 3 {5, 6, 7} + top 3 of [0, 5) by column sums
 *   (H_8 - H_j, decreasing in j) {0, 1, 2}         -> {0, 1, 2, 5, 6, 7}
 *   peaked layer, B = 2: M = 1 {7} + top 1 (key 0)  -> {0, 7}
 */
static void set_uniform_layer(m2_cache *c, int l) {
    for (int j = 0; j < c->N; j++) {
        m2_Q(c, l, 0, j)[0] = 0, m2_Q(c, l, 0, j)[1] = 0;
        m2_K(c, l, 0, j)[0] = (float)(j % 3), m2_K(c, l, 0, j)[1] = 1;
        m2_V(c, l, 0, j)[0] = (float)j, m2_V(c, l, 0, j)[1] = 1;
    }
}
static void set_peaked_layer(m2_cache *c, int l) {
    for (int j = 0; j < c->N; j++) {
        m2_Q(c, l, 0, j)[0] = (float)(10 * sqrt(2.0)), m2_Q(c, l, 0, j)[1] = 0;
        m2_K(c, l, 0, j)[0] = j == 0 ? 10.0f : 0.0f, m2_K(c, l, 0, j)[1] = 1;
        m2_V(c, l, 0, j)[0] = (float)j, m2_V(c, l, 0, j)[1] = 1;
    }
}

static void test_plain_entropy_budgets(void) {
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    for (int order = 0; order < 2; order++) {
        m2_cache c;
        m2_cache_alloc(&c, 2, 8, 1, 1, 2);
        int lu = order, lp = 1 - order; /* uniform / peaked layer index */
        set_uniform_layer(&c, lu);
        set_peaked_layer(&c, lp);
        m2_cache_views(&c, 8);
        kvs_plan plan;
        kvs_err err_store = {0}, *err = &err_store;
        kvs_budget b = {0.5, 0}; /* per_layer 4 */
        kvs_status st = kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            CHECK_EQ_INT(plan.layers[lu].budget, 6);
            CHECK_EQ_INT(plan.layers[lp].budget, 2);
            CHECK_EQ_INT(kvs_plan_total(&plan), 8);
            const int32_t wu[6] = {0, 1, 2, 5, 6, 7}, wp[2] = {0, 7};
            CHECK(memcmp(plan.layers[lu].idx, wu, sizeof wu) == 0);
            CHECK(memcmp(plan.layers[lp].idx, wp, sizeof wp) == 0);
            CHECK(plan.merge == KVS_MERGE_AVERAGE);
            CHECK_MSG(strstr(plan.note, "single modality") && strstr(plan.note, "plain"),
                      "note: %s", plan.note);
            kvs_plan_free(&plan);
        }
        /* per_layer = N keeps everything; per_layer = 1 gives each layer 1
         * (B_min = min(ceil(0.01 N), per_layer) = 1) */
        kvs_budget full = {1.0, 0}, one = {0, 1};
        st = kvs_compress(&kvs_method_meda, &p, &c.view, &full, 1, &plan, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            CHECK_EQ_INT(plan.layers[0].budget, 8);
            CHECK_EQ_INT(plan.layers[1].budget, 8);
            kvs_plan_free(&plan);
        }
        st = kvs_compress(&kvs_method_meda, &p, &c.view, &one, 1, &plan, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            CHECK_EQ_INT(plan.layers[0].budget, 1);
            CHECK_EQ_INT(plan.layers[1].budget, 1);
            kvs_plan_free(&plan);
        }
        m2_cache_free(&c);
    }
}

/*
 * Cross-modal case: N = 8, d = 8, one head, modality [T T I I I I T T].
 * Keys are one-hot (k_j = e_j) and every query is q = sqrt(8) * z, so the
 * logit of key j is z_j for every query.
 * Layer A: z = 0 except image keys 3, 4, 5 at -20 (image key 2 dominates the
 *   images). E_TV: text rows 6, 7 over images {2..5}: ~one-hot on 2 -> ~0
 *   (rows 0, 1 see no image: skipped). E_VT: image rows 2..5 over text {0, 1},
 *   equal logits -> ln 2. E^A = ln 2. Plain entropy: rows see {text <= i, 2}
 *   uniformly: (0 + ln2 + 4 ln3 + ln4 + ln5) / 8 = 1.010.
 * Layer B: z = 0 except the text sink 0 at +20. Plain ~ 0 (sink). E_TV: text
 *   rows 6, 7 over images {2..5}: uniform -> ln 4. E_VT: image rows over
 *   {0, 1}: ~one-hot on 0 -> ~0. E^B = ln 4.
 * Cross-modal: softmax(ln2, ln4) = (1/3, 2/3); per_layer 3, total 6 ->
 *   budgets [2, 4]. Plain (mask absent): softmax(1.010, 0) = (0.733, 0.267)
 *   -> 4.40, 1.60 -> [4, 2]. The two orders disagree, so the budgets show
 *   which entropy was used.
 */
static void test_cross_modal_budgets(void) {
    static const uint8_t mod[8] = {0, 0, 1, 1, 1, 1, 0, 0};
    m2_cache c;
    m2_cache_alloc(&c, 2, 8, 1, 1, 8);
    for (int l = 0; l < 2; l++)
        for (int j = 0; j < 8; j++) {
            m2_K(&c, l, 0, j)[j] = 1;
            m2_V(&c, l, 0, j)[0] = (float)j;
            for (int e = 0; e < 8; e++) {
                double z = 0;
                if (l == 0 && e >= 3 && e <= 5) z = -20;
                if (l == 1 && e == 0) z = 20;
                m2_Q(&c, l, 0, j)[e] = (float)(sqrt(8.0) * z);
            }
        }
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    kvs_budget b = {0, 3};
    kvs_plan plan;
    kvs_err err_store = {0}, *err = &err_store;
    /* with the mask: cross-modal entropy */
    c.mod = malloc(8);
    memcpy(c.mod, mod, 8);
    m2_cache_views(&c, 8);
    kvs_status st = kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK_EQ_INT(plan.layers[0].budget, 2);
        CHECK_EQ_INT(plan.layers[1].budget, 4);
        CHECK_MSG(strstr(plan.note, "cross-modal") != NULL, "note: %s", plan.note);
        kvs_plan_free(&plan);
    }
    /* the reference in the test agrees on the entropies */
    m2_ent e0, e1;
    double sc[8];
    m2_ref_layer(&c, 0, 0, 1, sc, &e0);
    m2_ref_layer(&c, 1, 0, 1, sc, &e1);
    CHECK_NEAR(e0.e_tv + e0.e_vt, log(2.0), 1e-5);
    CHECK_NEAR(e1.e_tv + e1.e_vt, log(4.0), 1e-5);
    CHECK_NEAR(e0.plain, (log(2.0) + 4 * log(3.0) + log(4.0) + log(5.0)) / 8, 1e-5);
    /* without the mask: single modality, plain entropy */
    free(c.mod);
    c.mod = NULL;
    m2_cache_views(&c, 8);
    st = kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK_EQ_INT(plan.layers[0].budget, 4);
        CHECK_EQ_INT(plan.layers[1].budget, 2);
        CHECK_MSG(strstr(plan.note, "single modality") != NULL, "note: %s", plan.note);
        kvs_plan_free(&plan);
    }
    /* an all-image mask is a single modality too */
    c.mod = malloc(8);
    memset(c.mod, KVS_MOD_IMAGE, 8);
    m2_cache_views(&c, 8);
    st = kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK_EQ_INT(plan.layers[0].budget, 4);
        CHECK(strstr(plan.note, "single modality") != NULL);
        kvs_plan_free(&plan);
    }
    m2_cache_free(&c);
}

/* Budgets hit the global sum exactly over many layers and ratios, and a
 * higher-entropy layer never gets fewer tokens than a lower-entropy one
 * (before clamping, shares are monotone in E). */
static void test_global_sum_monotone(void) {
    uint64_t rng = 5;
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    for (int t = 0; t < 12; t++) {
        int L = 3 + t % 4, N = 16 + (int)(kvs_rng_uniform(&rng) * 48);
        m2_cache c;
        m2_cache_alloc(&c, L, N, 1, 2, 4);
        m2_cache_random(&c, &rng, 0.5);
        /* scale layer l's queries by l: sharper attention, lower entropy */
        for (int l = 0; l < L; l++)
            for (size_t i = 0; i < (size_t)2 * N * 4; i++) c.q[(size_t)l * 2 * N * 4 + i] *= (float)(l * 3);
        m2_cache_views(&c, N);
        kvs_budget b = {0.05 + 0.6 * kvs_rng_uniform(&rng), 0};
        int per_layer;
        kvs_err err_store = {0}, *err = &err_store;
        CHECK_OK(kvs_budget_per_layer(&b, N, &per_layer, err), err);
        kvs_plan plan;
        kvs_status st = kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err);
        CHECK_OK(st, err);
        if (st == KVS_OK) {
            CHECK_EQ_INT(kvs_plan_total(&plan), (int64_t)L * per_layer);
            /* layer 0 (q = 0, uniform, the highest entropy) gets the most */
            for (int l = 1; l < L; l++)
                CHECK_MSG(plan.layers[0].budget >= plan.layers[l].budget,
                          "case %d: layer 0 budget %d < layer %d budget %d", t,
                          plan.layers[0].budget, l, plan.layers[l].budget);
            kvs_plan_free(&plan);
        }
        m2_cache_free(&c);
    }
}

/* B_min: N = 150 gives kvs_budget_min = ceil(1.5) = 2. Layers: two uniform
 * (E = ln(150!) / 150 = 4.0335) and a peaked one (E ~ 0). per_layer 4,
 * total 12: shares 5.896, 5.896, 0.104 -> the peaked layer is clamped up to
 * B_min = 2 and the rest water-filled: [5, 5, 2]. per_layer 1 (< B_min):
 * B_min is lowered to 1, else L * B_min = 6 > 3 could not be met. */
static void test_bmin(void) {
    m2_cache c;
    m2_cache_alloc(&c, 3, 150, 1, 1, 2);
    set_uniform_layer(&c, 0);
    set_peaked_layer(&c, 1);
    set_uniform_layer(&c, 2);
    m2_cache_views(&c, 150);
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    kvs_budget b4 = {0, 4}, b1 = {0, 1};
    kvs_status st = kvs_compress(&kvs_method_meda, &p, &c.view, &b4, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK_EQ_INT(plan.layers[0].budget, 5);
        CHECK_EQ_INT(plan.layers[1].budget, 2);
        CHECK_EQ_INT(plan.layers[2].budget, 5);
        kvs_plan_free(&plan);
    }
    st = kvs_compress(&kvs_method_meda, &p, &c.view, &b1, 1, &plan, err);
    CHECK_OK(st, err);
    if (st == KVS_OK) {
        CHECK_EQ_INT(kvs_plan_total(&plan), 3);
        for (int l = 0; l < 3; l++) CHECK(plan.layers[l].budget >= 1);
        kvs_plan_free(&plan);
    }
    m2_cache_free(&c);
}

static void test_random(void) {
    kvs_params p;
    kvs_err err_store = {0}, *err = &err_store;
    kvs_params_defaults(&kvs_method_meda, &p);
    m2_check_random(&kvs_method_meda, &p, (m2_refcfg){0, 1, 1, 0.5, 1}, 60, 1, 64, 31);
    /* longer prompts: cross core's query (64) and key (256) tile edges */
    m2_check_random(&kvs_method_meda, &p, (m2_refcfg){0, 1, 1, 0.5, 1}, 6, 65, M2_NMAX, 33);
    CHECK_OK(kvs_params_set(&kvs_method_meda, &p, "recent_frac", "0.75", err), err);
    m2_check_random(&kvs_method_meda, &p, (m2_refcfg){0, 1, 1, 0.75, 1}, 20, 1, 64, 32);
}

static void test_errors(void) {
    m2_cache c;
    m2_cache_alloc(&c, 2, 8, 1, 1, 2);
    set_uniform_layer(&c, 0);
    set_peaked_layer(&c, 1);
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    kvs_err err_store = {0}, *err = &err_store;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_budget b = {0.5, 0};
    m2_cache_views(&c, 0);
    CHECK_FAILS(kvs_compress(&kvs_method_meda, &p, &c.view, &b, 1, &plan, err), KVS_ERR_INVALID,
                err, "Nq=0");
    CHECK_MSG(strstr(err->msg, "meda") != NULL, "message: %s", err->msg);
    CHECK_FAILS(m2_run_direct(&kvs_method_meda, &p, &c, -1, 4, &plan, err), KVS_ERR_INVALID, err,
                "meda: scorer lookm: needs the queries of all N=8 prompt positions "
                "(KVS_NEED_Q_ALL) but none were given (Nq=0)");
    m2_cache_views(&c, 5);
    CHECK_FAILS(m2_run_direct(&kvs_method_meda, &p, &c, -1, 4, &plan, err), KVS_ERR_INVALID, err,
                "got Nq=5");
    CHECK_FAILS(m2_run_direct(&kvs_method_meda, &p, &c, 8, 4, &plan, err), KVS_ERR_INVALID, err,
                "meda: layer 0: needs the queries of all N=8");
    m2_cache_views(&c, 8);
    c.mod = calloc(8, 1);
    c.mod[7] = 200;
    m2_cache_views(&c, 8);
    CHECK_FAILS(m2_run_direct(&kvs_method_meda, &p, &c, -1, 4, &plan, err), KVS_ERR_INVALID, err,
                "meda: layer 0: modality[7] = 200");
    CHECK_FAILS(kvs_params_set(&kvs_method_meda, &p, "recent_frac", "-0.1", err), KVS_ERR_INVALID,
                err, "recent_frac");
    /* select before every layer was observed */
    kvs_shape sh = {2, 8, 1, 1, 2, 8, 1};
    void *state = NULL;
    c.mod[7] = KVS_MOD_TEXT;
    CHECK_OK(kvs_method_meda.create(&p, &sh, &state, err), err);
    if (state) {
        CHECK_OK(kvs_method_meda.observe(state, 0, &c.layers[0], c.mod, err), err);
        CHECK_FAILS(kvs_method_meda.select(state, 4, &plan, err), KVS_ERR_INVALID, err,
                    "meda: select after 1 of 2 layers were observed");
        kvs_method_meda.destroy(state);
    }
    m2_cache_free(&c);
}

static void test_declaration(void) {
    CHECK(strcmp(kvs_method_meda.name, "meda") == 0);
    CHECK(kvs_method_meda.needs & KVS_NEED_Q_ALL);
    CHECK(kvs_method_meda.needs & KVS_NEED_MODALITY);
    CHECK(kvs_method_find("meda") == &kvs_method_meda);
    CHECK_EQ_INT(kvs_method_meda.queries_wanted(NULL, 50), 50);
    kvs_params p;
    kvs_params_defaults(&kvs_method_meda, &p);
    CHECK_EQ_INT(p.n, 2);
    CHECK(kvs_param_get(&kvs_method_meda, &p, "recent_frac") == 0.5);
    CHECK(kvs_param_get(&kvs_method_meda, &p, "merge") == 1.0); /* average */
}

int main(void) {
    test_declaration();
    test_plain_entropy_budgets();
    test_cross_modal_budgets();
    test_global_sum_monotone();
    test_bmin();
    test_random();
    test_errors();
    return kvs_test_finish("test_meda");
}
