/*
 * test_parts_critical.c -- the pick rule `critical` (CriticalKV) and its
 * presets criticalkv / criticaladakv (methods/parts/pick_critical.c):
 *   - hand-checked W_o norms on a strided W_o view laid out as an HF
 *     o_proj.weight [E][Hq*d] (two query heads share one KV head: mean);
 *   - hand-checked two-stage picks (stage-1 share, its floor of 1, the
 *     epsilon, a protected prefix);
 *   - first_stage_ratio 1 gives SnapKV's plan (criticalkv == snapkv) and
 *     AdaKV's plan (criticaladakv == adakv); a positive scale of W_o or of
 *     V changes no plan; plans are exact, repeatable, thread independent;
 *   - a cache view without W_o is refused naming the method and W_o, as is
 *     a W_o of the wrong shape; a composed method with the critical pick
 *     declares the need.
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

static void norms_hand(void) {
    /* Hkv = 1, Hq = 2, N = 2, d = 2, E = 2. V: v0 = (1,0), v1 = (1,-1).
     * W_0 = [[1,2],[0,1]]: W_0 v0 = (1,0) -> 1; W_0 v1 = (-1,-1) -> 2.
     * W_1 = [[-1,0],[3,3]]: W_1 v0 = (-1,3) -> 4; W_1 v1 = (-1,0) -> 1.
     * Means over the group: 2.5, 1.5. o_proj rows [W_0[o] | W_1[o]]. */
    const float v[2][2] = {{1, 0}, {1, -1}};
    const float oproj[2][4] = {{1, 2, -1, 0}, {0, 1, 3, 3}};
    kvs_layer ly = {.k = kvs_view_make(v, KVS_F32, 1, 2, 2), .v = kvs_view_make(v, KVS_F32, 1, 2, 2)};
    ly.wo = (kvs_view){oproj, KVS_F32, KVS_HOST, 2, 2, 2, 2, 4};
    float w[2] = {0, 0};
    kvs_err e = {0};
    CHECK_OK(kvs_critical_wo_norms(&ly, 1, w, &e), &e);
    CHECK_NEAR(w[0], 2.5, 1e-6);
    CHECK_NEAR(w[1], 1.5, 1e-6);
    ly.wo.head_dim = 3; /* does not match d */
    CHECK_FAILS(kvs_critical_wo_norms(&ly, 1, w, &e), KVS_ERR_INVALID, &e, "W_o");
}

/* A method declaring the critical pick's parameters. */
static const kvs_param_def crit_params[] = {KVS_PARTS_P_FIRST_STAGE(0.5),
                                            KVS_PARTS_P_CRIT_EPSILON(0)};
static const kvs_method crit_m = {.name = "t_critical", .params = crit_params, .n_params = 2};

static void pick(const char *f, const char *eps, const float *s, const float *w, int N, int lo, int k,
                 int32_t *out) {
    kvs_params p;
    kvs_params_defaults(&crit_m, &p);
    m1_set(&crit_m, &p, "first_stage_ratio", f);
    m1_set(&crit_m, &p, "critical_epsilon", eps);
    kvs_part_ctx c = {.m = &crit_m, .p = &p, .shape = {1, N, 1, 1, 2, 0, 1}};
    kvs_pick_pair pairs[8];
    int32_t ibuf[8];
    uint8_t mask[8];
    kvs_pick_ws ws = {pairs, ibuf, mask, w};
    kvs_err e = {0};
    CHECK_OK(kvs_pick_critical.pick(&c, s, lo, N, k, &ws, out, &e), &e);
}

#define CHECK_SET(got, ...)                                                   \
    do {                                                                      \
        const int32_t _w[] = {__VA_ARGS__};                                   \
        const int _n = (int)(sizeof _w / sizeof _w[0]);                       \
        int _ok = 1;                                                          \
        for (int _i = 0; _i < _n; _i++) _ok &= (got)[_i] == _w[_i];           \
        CHECK_MSG(_ok, "critical pick %d: got %d %d %d %d", __LINE__, (got)[0], \
                  (got)[1], _n > 2 ? (got)[2] : -1, _n > 3 ? (got)[3] : -1);  \
    } while (0)

/* s = .5 .1 .4 .2 .3 .05, w = 1 10 1 3 1 30; with epsilon 0, r = s w =
 * .5 1 .4 .6 .3 1.5.
 *   f .5, k 4: k1 = 2 by s: {0, 2}; the rest by r: 5 (1.5), 1 (1) -> {0,1,2,5}
 *   f .5, k 3: k1 = floor(1.5) = 1: {0}; then 5, 1           -> {0,1,5}
 *   f 0,  k 3: by r alone: 5, 1, 3 (.6)                       -> {1,3,5}
 *   f 1,  k 3: by s alone: .5, .4, .3                         -> {0,2,4}
 *   f .1, k 3: floor(.3) = 0, raised to 1: {0}; then 5, 1    -> {0,1,5}
 *   lo 1 (token 0 protected), f .5, k 2: k1 = 1 among 1..5 by s: 2 (.4);
 *          then by r: 5                                       -> {2,5}
 * epsilon: s = 0 0, w = 1 2, f 0, k 1: epsilon 0 ties -> {0};
 *          epsilon 1e-4: r = 1e-4, 2e-4                       -> {1} */
static void pick_hand(void) {
    const float s[6] = {.5f, .1f, .4f, .2f, .3f, .05f}, w[6] = {1, 10, 1, 3, 1, 30};
    int32_t o[6];
    pick("0.5", "0", s, w, 6, 0, 4, o);
    CHECK_SET(o, 0, 1, 2, 5);
    pick("0.5", "0", s, w, 6, 0, 3, o);
    CHECK_SET(o, 0, 1, 5);
    pick("0", "0", s, w, 6, 0, 3, o);
    CHECK_SET(o, 1, 3, 5);
    pick("1", "0", s, w, 6, 0, 3, o);
    CHECK_SET(o, 0, 2, 4);
    pick("0.1", "0", s, w, 6, 0, 3, o);
    CHECK_SET(o, 0, 1, 5);
    pick("0.5", "0", s, w, 6, 1, 2, o);
    CHECK_SET(o, 2, 5);
    const float z[2] = {0, 0}, w2[2] = {1, 2};
    pick("0", "0", z, w2, 2, 0, 1, o);
    CHECK_SET(o, 0);
    pick("0", "0.0001", z, w2, 2, 0, 1, o);
    CHECK_SET(o, 1);
}

static int run(const kvs_method *m, const kvs_params *p, m1_cache *c, int B, int threads,
               kvs_plan *out) {
    kvs_err e = {0};
    kvs_budget b = {0, B};
    kvs_status rc = kvs_compress(m, p, &c->view, &b, threads, out, &e);
    CHECK_MSG(rc == KVS_OK, "%s N=%d B=%d: %s", m->name, c->N, B, e.msg);
    return rc == KVS_OK;
}

static void props(void) {
    uint64_t rng = 32;
    for (int rep = 0; rep < 8; rep++) {
        const int Hkv = 1 + rep % 3, G = 1 + rep % 2, N = 40 + 23 * rep, d = 8 * (1 + rep % 2);
        m1_cache c;
        m1_cache_init(&c, 2, Hkv, Hkv * G, N, N, d);
        m1_cache_fill_random(&c, 500 + (uint64_t)rep);
        m1_cache_add_wo(&c, 5 + rep, 900 + (uint64_t)rep);
        const int B = 1 + (int)(kvs_rng_uniform(&rng) * (N - 1));
        const kvs_method *crit[2] = {&kvs_preset_criticalkv, &kvs_preset_criticaladakv};
        const kvs_method *base[2] = {&kvs_method_snapkv, &kvs_preset_adakv};
        for (int i = 0; i < 2; i++) {
            kvs_params p, pb;
            kvs_plan a, b, t;
            kvs_params_defaults(crit[i], &p);
            kvs_params_defaults(base[i], &pb);
            if (!run(crit[i], &p, &c, B, 1, &a)) continue;
            if (run(crit[i], &p, &c, B, 3, &t)) {
                CHECK_MSG(m1_plans_equal(&a, &t), "%s: 1 vs 3 threads differ", crit[i]->name);
                kvs_plan_free(&t);
            }
            /* positive scales of W_o and V: same ranking, same plan */
            const size_t nwo = (size_t)c.L * c.Hq * (size_t)(5 + rep) * d;
            for (size_t j = 0; j < nwo; j++) c.wo[j] *= 3.0f;
            if (run(crit[i], &p, &c, B, 1, &t)) {
                CHECK_MSG(m1_plans_equal(&a, &t), "%s: W_o x 3 changed the plan", crit[i]->name);
                kvs_plan_free(&t);
            }
            for (size_t j = 0; j < nwo; j++) c.wo[j] /= 3.0f;
            /* stage 1 only: the base method's plan */
            m1_set(crit[i], &p, "first_stage_ratio", "1");
            if (run(crit[i], &p, &c, B, 1, &t) && run(base[i], &pb, &c, B, 1, &b)) {
                CHECK_MSG(m1_plans_equal(&b, &t), "%s first_stage_ratio 1 != %s (B=%d N=%d)",
                          crit[i]->name, base[i]->name, B, N);
                kvs_plan_free(&t);
                kvs_plan_free(&b);
            }
            kvs_plan_free(&a);
        }
        m1_cache_free(&c);
    }
}

static void refusals(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 2, 4, 40, 40, 8);
    m1_cache_fill_random(&c, 3);
    kvs_err e = {0};
    kvs_budget b = {0, 10};
    kvs_plan pl;
    kvs_params p;
    kvs_params_defaults(&kvs_preset_criticalkv, &p);
    CHECK_FAILS(kvs_compress(&kvs_preset_criticalkv, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID,
                &e, "output projection W_o");
    CHECK(strstr(e.msg, "criticalkv") != NULL);
    m1_cache_add_wo(&c, 6, 1);
    c.layers[1].wo.head_dim = 4; /* the wrong d */
    CHECK_FAILS(kvs_compress(&kvs_preset_criticalkv, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID,
                &e, "W_o view");
    c.layers[1].wo.head_dim = 8;
    c.wo[3] = NAN;
    CHECK_FAILS(kvs_compress(&kvs_preset_criticalkv, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_NUMERIC,
                &e, "W_o");
    c.wo[3] = 0.5f;
    CHECK_OK(kvs_compress(&kvs_preset_criticalkv, &p, &c.view, &b, 1, &pl, &e), &e);
    kvs_plan_free(&pl);
    /* a composed method with the critical pick declares the need */
    kvs_composed *cm = NULL;
    CHECK_OK(kvs_composed_from_json("{\"score\":\"knorm\",\"pick\":\"critical\"}", &cm, &e), &e);
    if (cm) {
        const kvs_method *m = kvs_composed_method(cm);
        CHECK(m->needs & KVS_NEED_W_O);
        kvs_params_defaults(m, &p);
        CHECK_OK(kvs_compress(m, &p, &c.view, &b, 1, &pl, &e), &e);
        kvs_plan_free(&pl);
        kvs_composed_free(cm);
    }
    m1_cache_free(&c);
}

int main(void) {
    norms_hand();
    pick_hand();
    props();
    refusals();
    return kvs_test_finish("test_parts_critical");
}
