/*
 * test_parts_alloc.c -- the data-driven allocators dba, entropy and cake
 * (methods/parts/alloc_*.c): hand-checked golden budgets, exact global sums
 * and floors over random inputs, CAKE's statistics on a hand case, and the
 * allocators inside compositions (a scorer that writes the statistics and
 * the allocator's own measure agree; a missing input is an error naming
 * the allocator).
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

static void check_budgets(const int *b, int L, int N, int per_layer, const char *what) {
    int64_t sum = 0;
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    int ok = 1;
    for (int l = 0; l < L; l++) {
        sum += b[l];
        if (b[l] < bmin || b[l] > N) ok = 0;
    }
    CHECK_MSG(ok && sum == (int64_t)L * per_layer, "%s L=%d N=%d B=%d: sum %lld, floor %d", what, L,
              N, per_layer, (long long)sum, bmin);
}

static void set_R(kvs_layer_stats *s, double rk, double rv) {
    memset(s, 0, sizeof *s);
    s->e_high[0] = rk, s->e_tot[0] = 1.0;
    s->e_high[1] = rv, s->e_tot[1] = 1.0;
}

static void test_dba(uint64_t *rng) {
    kvs_err e = {0};
    kvs_layer_stats st[3];
    int b[3], zero = -1;
    /* R = 1, 0.5, 1.5 (sum 3) of 60: exactly 20, 10, 30 */
    set_R(&st[0], 0.5, 0.5), set_R(&st[1], 0.25, 0.25), set_R(&st[2], 0.75, 0.75);
    CHECK_OK(kvs_dba_budgets(st, 3, 100, 20, b, &zero, &e), &e);
    CHECK(b[0] == 20 && b[1] == 10 && b[2] == 30 && zero == 0);
    /* of 63: 21, 10.5, 31.5 -> the remainder ties go to the lower layer: 21, 11, 31 */
    CHECK_OK(kvs_dba_budgets(st, 3, 100, 21, b, &zero, &e), &e);
    CHECK(b[0] == 21 && b[1] == 11 && b[2] == 31);
    /* a zero-energy layer: R = 0, clamped up to B_min = 1, the rest water-filled:
     * 59 over two equal layers = 29.5 each -> 30, 1, 29 */
    set_R(&st[1], 0, 0), set_R(&st[2], 0.5, 0.5);
    st[1].e_tot[0] = st[1].e_tot[1] = 0.0;
    CHECK_OK(kvs_dba_budgets(st, 3, 100, 20, b, &zero, &e), &e);
    CHECK(b[0] == 30 && b[1] == 1 && b[2] == 29 && zero == 2);
    /* clamp at N: R = 1, 1e-6, 1e-6 of 3 * 80 with N = 100 -> 100, 70, 70 */
    set_R(&st[0], 0.5, 0.5), set_R(&st[1], 1e-6, 0), set_R(&st[2], 1e-6, 0);
    CHECK_OK(kvs_dba_budgets(st, 3, 100, 80, b, &zero, &e), &e);
    CHECK(b[0] == 100 && b[1] == 70 && b[2] == 70);
    CHECK_FAILS(kvs_dba_budgets(st, 3, 100, 0, b, &zero, &e), KVS_ERR_INVALID, &e, "dba");
    for (int rep = 0; rep < 300; rep++) {
        const int L = 1 + (int)(kvs_rng_uniform(rng) * 40), N = 1 + (int)(kvs_rng_uniform(rng) * 500);
        const int B = 1 + (int)(kvs_rng_uniform(rng) * N);
        kvs_layer_stats *s = calloc((size_t)L, sizeof *s);
        int *bb = malloc(sizeof(int) * (size_t)L);
        for (int l = 0; l < L; l++) {
            const double u = kvs_rng_uniform(rng);
            set_R(&s[l], u * u * u, kvs_rng_uniform(rng) < 0.1 ? 0 : kvs_rng_uniform(rng));
        }
        CHECK_OK(kvs_dba_budgets(s, L, N, B, bb, NULL, &e), &e);
        check_budgets(bb, L, N, B, "dba");
        free(s);
        free(bb);
    }
}

static void test_entropy(uint64_t *rng) {
    kvs_err e = {0};
    int b[3];
    /* softmax of ln 1, ln 2, ln 3 = 1/6, 2/6, 3/6 of 60: 10, 20, 30 */
    const double E[3] = {0.0, log(2.0), log(3.0)};
    CHECK_OK(kvs_entropy_budgets(E, 3, 100, 20, b, &e), &e);
    CHECK(b[0] == 10 && b[1] == 20 && b[2] == 30);
    /* a shift of every entropy changes nothing (softmax) */
    const double E2[3] = {5.0, 5.0 + log(2.0), 5.0 + log(3.0)};
    CHECK_OK(kvs_entropy_budgets(E2, 3, 100, 20, b, &e), &e);
    CHECK(b[0] == 10 && b[1] == 20 && b[2] == 30);
    /* a very low entropy: its layer is floored at B_min = ceil(0.01 * 300) = 3 */
    const double E3[3] = {-50.0, 1.0, 1.0};
    CHECK_OK(kvs_entropy_budgets(E3, 3, 300, 40, b, &e), &e);
    CHECK(b[0] == 3 && b[1] == 59 && b[2] == 58);
    const double bad[2] = {1.0, NAN};
    CHECK_FAILS(kvs_entropy_budgets(bad, 2, 10, 5, b, &e), KVS_ERR_NUMERIC, &e, "layer 1");
    for (int rep = 0; rep < 300; rep++) {
        const int L = 1 + (int)(kvs_rng_uniform(rng) * 40), N = 1 + (int)(kvs_rng_uniform(rng) * 500);
        const int B = 1 + (int)(kvs_rng_uniform(rng) * N);
        double *x = malloc(sizeof(double) * (size_t)L);
        int *bb = malloc(sizeof(int) * (size_t)L);
        for (int l = 0; l < L; l++) x[l] = 8.0 * kvs_rng_uniform(rng);
        CHECK_OK(kvs_entropy_budgets(x, L, N, B, bb, &e), &e);
        check_budgets(bb, L, N, B, "entropy");
        free(x);
        free(bb);
    }
}

static void test_cake(uint64_t *rng) {
    kvs_err e = {0};
    int b[3];
    /* P = sqrt(disp) * var = 1, 2, 3; the window 8 in every layer, the other
     * 3 * 20 split 10, 20, 30: 18, 28, 38 */
    const double disp[3] = {1.0, 4.0, 9.0}, var[3] = {1.0, 1.0, 1.0};
    CHECK_OK(kvs_cake_budgets(disp, var, 3, 100, 28, 8, 2.0, 1.0, b, &e), &e);
    CHECK(b[0] == 18 && b[1] == 28 && b[2] == 38);
    /* tau2 = 0.5 squares the shift: var 1, 2, 1 with disp 1 -> P = 1, 4, 1 of 60 */
    const double d1[3] = {1.0, 1.0, 1.0}, v2[3] = {1.0, 2.0, 1.0};
    CHECK_OK(kvs_cake_budgets(d1, v2, 3, 100, 28, 8, 1.0, 0.5, b, &e), &e);
    CHECK(b[0] == 18 && b[1] == 48 && b[2] == 18);
    /* B <= w: nothing to shape */
    CHECK_OK(kvs_cake_budgets(disp, var, 3, 100, 8, 8, 1.0, 1.0, b, &e), &e);
    CHECK(b[0] == 8 && b[1] == 8 && b[2] == 8);
    CHECK_FAILS(kvs_cake_budgets(disp, var, 3, 100, 28, 8, 0.0, 1.0, b, &e), KVS_ERR_INVALID, &e,
                "tau1");
    for (int rep = 0; rep < 300; rep++) {
        const int L = 1 + (int)(kvs_rng_uniform(rng) * 40), N = 2 + (int)(kvs_rng_uniform(rng) * 500);
        const int B = 1 + (int)(kvs_rng_uniform(rng) * N), w = (int)(kvs_rng_uniform(rng) * 40);
        double *x = malloc(sizeof(double) * 2 * (size_t)L);
        int *bb = malloc(sizeof(int) * (size_t)L);
        for (int l = 0; l < 2 * L; l++) x[l] = kvs_rng_uniform(rng) < 0.1 ? 0.0 : 5.0 * kvs_rng_uniform(rng);
        CHECK_OK(kvs_cake_budgets(x, x + L, L, N, B, w < N ? w : N - 1, 1.5, 0.5, bb, &e), &e);
        check_budgets(bb, L, N, B, "cake");
        free(x);
        free(bb);
    }
    /* The statistics on a hand case: N = 3, w = 2, d = 1, keys all 0, so the
     * row at position 1 is (1/2, 1/2), the row at 2 is (1/3, 1/3, 1/3). The
     * prefix is key 0: disp = -(1/2 ln 1/2 + 1/3 ln 1/3), var = (1/2 - 1/3)^2 / 2. */
    m1_cache c;
    m1_cache_init(&c, 1, 1, 1, 3, 3, 1);
    for (int i = 0; i < 3; i++) *m1_q(&c, 0, 0, i) = 1.0f;
    double D = 0, V = 0;
    CHECK_OK(kvs_cake_measure(&c.layers[0], 2, &D, &V, &e), &e);
    const double D0 = -(0.5 * log(0.5) + (1.0 / 3) * log(1.0 / 3));
    CHECK_MSG(fabs(D - D0) < 1e-6 && fabs(V - 1.0 / 72) < 1e-7, "cake measure: D=%.9g (%.9g) V=%.9g (%.9g)",
              D, D0, V, 1.0 / 72);
    /* GQA: two query heads on one KV head sum their statistics */
    m1_cache c2;
    m1_cache_init(&c2, 1, 1, 2, 3, 3, 1);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 3; i++) *m1_q(&c2, 0, h, i) = 1.0f;
    double D2 = 0, V2 = 0;
    CHECK_OK(kvs_cake_measure(&c2.layers[0], 2, &D2, &V2, &e), &e);
    CHECK(fabs(D2 - 2 * D) < 1e-12 && fabs(V2 - 2 * V) < 1e-12);
    CHECK_FAILS(kvs_cake_measure(&c.layers[0], 3, &D, &V, &e), KVS_ERR_INVALID, &e, "window");
    m1_cache_free(&c);
    m1_cache_free(&c2);
}

static kvs_composed *composed(const char *json) {
    kvs_err e = {0};
    kvs_composed *c = NULL;
    CHECK_OK(kvs_composed_from_json(json, &c, &e), &e);
    return c;
}

static int layer_budgets(const kvs_method *m, m1_cache *c, int B, int *out, kvs_err *e) {
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_budget b = {0, B};
    kvs_plan pl;
    kvs_status rc = kvs_compress(m, &p, &c->view, &b, 2, &pl, e);
    if (rc) return rc;
    for (int l = 0; l < c->L; l++) out[l] = pl.layers[l].budget;
    kvs_plan_free(&pl);
    return KVS_OK;
}

/* The allocators in compositions: with a scorer that does not write the
 * statistics, the allocator's measure gives the same budgets. */
static void test_compositions(void) {
    m1_cache c;
    m1_cache_init(&c, 5, 2, 4, 90, 90, 16);
    m1_cache_fill_random(&c, 99);
    for (int l = 0; l < c.L; l++) /* layers of different smoothness and sharpness */
        for (int h = 0; h < c.Hkv; h++)
            for (int n = 0; n < c.N; n++)
                for (int i = 0; i < c.d; i++) {
                    m1_k(&c, l, h, n)[i] *= (float)(1 + l);
                    m1_v(&c, l, h, n)[i] += (float)(l * sin(0.1 * n));
                }
    kvs_err e = {0};
    int a[5], b[5];
    const int B = 30;
    /* dba: flashcache's energies == dba's own transform */
    CHECK_OK(layer_budgets(&kvs_preset_flashcache_parts, &c, B, a, &e), &e);
    kvs_composed *kd = composed("{\"score\": \"keydiff\", \"allocate\": \"dba\"}");
    if (kd) {
        CHECK_OK(layer_budgets(kvs_composed_method(kd), &c, B, b, &e), &e);
        CHECK(memcmp(a, b, sizeof a) == 0);
    }
    int differs = 0;
    for (int l = 1; l < c.L; l++) differs |= a[l] != a[0];
    CHECK_MSG(differs, "dba gave equal budgets on layers of different energy");
    /* entropy: h2o's fused pass == the allocator's own pass (modality mixed) */
    c.modality = calloc((size_t)c.N, 1);
    for (int j = 0; j < c.N; j++) c.modality[j] = (j / 10) % 2 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    c.view.modality = c.modality;
    CHECK_OK(layer_budgets(&kvs_method_meda, &c, B, a, &e), &e);
    kvs_composed *en = composed("{\"score\": \"snapkv\", \"allocate\": \"entropy\", "
                                "\"keep\": {\"window\": 8}}");
    if (en) {
        CHECK_OK(layer_budgets(kvs_composed_method(en), &c, B, b, &e), &e);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK(kvs_composed_method(en)->needs & KVS_NEED_Q_ALL);
    }
    /* lookm and meda composed by hand, merges by name: the presets' plans */
    const char *js[2] = {"{\"score\": \"lookm\", \"keep\": {\"window\": true}, \"merge\": \"lookm\", "
                         "\"params\": {\"recent_frac\": 0.5}}",
                         "{\"score\": \"lookm\", \"allocate\": \"entropy\", \"keep\": {\"window\": true}, "
                         "\"merge\": \"meda\", \"params\": {\"recent_frac\": 0.5}}"};
    const kvs_method *pre[2] = {&kvs_method_lookm, &kvs_method_meda};
    for (int i = 0; i < 2; i++) {
        kvs_composed *cm = composed(js[i]);
        if (!cm) continue;
        kvs_params pa, pb;
        kvs_params_defaults(pre[i], &pa);
        kvs_params_defaults(kvs_composed_method(cm), &pb);
        kvs_budget bud = {0, B};
        kvs_plan x, y;
        CHECK_OK(kvs_compress(pre[i], &pa, &c.view, &bud, 1, &x, &e), &e);
        CHECK_OK(kvs_compress(kvs_composed_method(cm), &pb, &c.view, &bud, 1, &y, &e), &e);
        CHECK_MSG(m1_plans_equal(&x, &y) && x.merge == y.merge && x.merge != KVS_MERGE_NONE,
                  "%s composed differs from the preset", pre[i]->name);
        kvs_plan_free(&x);
        kvs_plan_free(&y);
        kvs_composed_free(cm);
    }
    /* cake over snapkv: the window is kept in every layer, sum exact */
    kvs_composed *ck = composed("{\"score\": \"snapkv\", \"allocate\": \"cake\", "
                                "\"keep\": {\"window\": 8}, \"params\": {\"tau1\": 1.6, \"tau2\": 0.4}}");
    if (ck) {
        CHECK_OK(layer_budgets(kvs_composed_method(ck), &c, B, b, &e), &e);
        check_budgets(b, c.L, c.N, B, "cake composed");
        for (int l = 0; l < c.L; l++) CHECK(b[l] >= 8);
    }
    /* a window-only record: a composition with entropy needs every query */
    m1_cache w;
    m1_cache_init(&w, 2, 2, 4, 60, 20, 8);
    m1_cache_fill_random(&w, 3);
    if (en) {
        CHECK_FAILS(layer_budgets(kvs_composed_method(en), &w, 10, b, &e), KVS_ERR_INVALID, &e,
                    "needs the queries of all");
    }
    if (ck) CHECK_OK(layer_budgets(kvs_composed_method(ck), &w, 10, b, &e), &e);
    m1_cache_free(&w);
    kvs_composed_free(kd);
    kvs_composed_free(en);
    kvs_composed_free(ck);
    m1_cache_free(&c);
}

int main(void) {
    uint64_t rng = 2026;
    test_dba(&rng);
    test_entropy(&rng);
    test_cake(&rng);
    test_compositions();
    printf("test_parts_alloc: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
