/*
 * test_compress.c -- kvs_compress with a tiny fake method defined here that
 * keeps the first B tokens of every head. Its "mode" parameter makes it
 * misbehave in one way at a time, so every contract check of the driver is
 * exercised: budget sum, layer budget range, plan invariants, plan shape,
 * failing observe / select (state destroyed, plan freed, message prefixed),
 * and the declared query needs.
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

static kvs_err e_, *e = &e_;
static int n_created, n_destroyed, n_observed; /* test bookkeeping only */

enum { M_OK, M_BADSUM, M_UNSORTED, M_FAILOBS, M_FAILSEL, M_WRONGN, M_SHIFT, M_BIGLAYER };

typedef struct {
    kvs_shape s;
    int mode;
    int next_layer;
} fake_state;

static kvs_status fake_create(const kvs_params *p, const kvs_shape *s, void **state, kvs_err *err) {
    fake_state *f = calloc(1, sizeof *f);
    if (!f) return kvs_errorf(err, KVS_ERR_NOMEM, "fake: no memory");
    f->s = *s;
    f->mode = (int)p->v[0];
    *state = f;
    n_created++;
    return KVS_OK;
}

static kvs_status fake_observe(void *state, int layer, const kvs_layer *in, const uint8_t *modality,
                               kvs_err *err) {
    fake_state *f = state;
    if (layer != f->next_layer) return kvs_errorf(err, KVS_ERR_INTERNAL, "layers out of order");
    if (in->k.n_tokens != f->s.n_tokens) return kvs_errorf(err, KVS_ERR_INTERNAL, "wrong layer");
    f->next_layer++;
    n_observed++;
    if (f->mode == M_FAILOBS && layer == 1) return kvs_errorf(err, KVS_ERR_NUMERIC, "layer %d: scores blew up", layer);
    return KVS_OK;
}

static kvs_status fake_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    fake_state *f = state;
    const int L = f->s.n_layers, N = f->s.n_tokens, H = f->s.n_kv_heads;
    if (f->next_layer != L) return kvs_errorf(err, KVS_ERR_INTERNAL, "select before all layers");
    int budgets[16];
    for (int l = 0; l < L; l++) budgets[l] = per_layer;
    if (f->mode == M_BADSUM) budgets[0] = per_layer > 1 ? per_layer - 1 : per_layer + 1;
    if (f->mode == M_SHIFT) {
        budgets[0]++;
        budgets[1]--;
    }
    int n_plan = f->mode == M_WRONGN ? N + 1 : N;
    kvs_status st = kvs_plan_init(out, "", L, H, n_plan, budgets, err);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        int B = out->layers[l].budget;
        for (int h = 0; h < H; h++)
            for (int i = 0; i < B; i++) out->layers[l].idx[h * B + i] = f->mode == M_WRONGN ? i + 1 : i;
    }
    if (f->mode == M_UNSORTED && per_layer >= 2) out->layers[1].idx[1] = 0;
    if (f->mode == M_BIGLAYER) out->layers[0].budget = N + 1;
    if (f->mode == M_FAILSEL) /* fails after allocating: the driver must free the plan */
        return kvs_errorf(err, KVS_ERR_INVALID, "refusing to select");
    return KVS_OK;
}

static void fake_destroy(void *state) {
    free(state);
    n_destroyed++;
}

static int fake_wanted(const kvs_params *p, int N) { return N; }

static const kvs_param_def fake_params[] = {
    {"mode", KVS_PARAM_ENUM, 0, 0, 7, "ok|badsum|unsorted|failobs|failsel|wrongn|shift|biglayer", "misbehaviour"},
};
static const kvs_method firstb = {"firstb", "keeps the first B", 0, fake_params, 1, NULL,
                                  fake_create, fake_observe, fake_select, fake_destroy};
static const kvs_method h2o = {"h2o", "needs all queries", KVS_NEED_Q_ALL, fake_params, 1, fake_wanted,
                               fake_create, fake_observe, fake_select, fake_destroy};
static const kvs_method snapkv = {"snapkv", "needs a window", KVS_NEED_Q_WINDOW, fake_params, 1, NULL,
                                  fake_create, fake_observe, fake_select, fake_destroy};

/* A synthetic cache: L layers of [H][N][D], optional queries [HQ][Nq][D]. */
typedef struct {
    int L, N, nq;
    float *k, *v, *q;
    kvs_layer layers[8];
    kvs_cache_view view;
} cache_t;

enum { H = 2, HQ = 4, D = 8 };

static void cache_make(cache_t *c, int L, int N, int nq) {
    memset(c, 0, sizeof *c);
    c->L = L;
    c->N = N;
    c->nq = nq;
    size_t kv = (size_t)L * H * N * D, qn = (size_t)L * HQ * (nq ? nq : 1) * D;
    c->k = malloc(kv * sizeof(float)); /* [L][H][N][D] */
    c->v = malloc(kv * sizeof(float));
    c->q = malloc(qn * sizeof(float)); /* [L][HQ][nq][D] */
    uint64_t r = 3;
    for (size_t i = 0; i < kv; i++) {
        c->k[i] = (float)kvs_rng_normal(&r);
        c->v[i] = (float)kvs_rng_normal(&r);
    }
    for (size_t i = 0; i < qn; i++) c->q[i] = (float)kvs_rng_normal(&r);
    for (int l = 0; l < L; l++) {
        c->layers[l].k = kvs_view_make(c->k + (size_t)l * H * N * D, KVS_F32, H, N, D);
        c->layers[l].v = kvs_view_make(c->v + (size_t)l * H * N * D, KVS_F32, H, N, D);
        c->layers[l].q = nq ? kvs_view_make(c->q + (size_t)l * HQ * nq * D, KVS_F32, HQ, nq, D)
                            : kvs_view_make(NULL, KVS_F32, 0, 0, D);
    }
    c->view.n_layers = L;
    c->view.layers = c->layers;
    c->view.modality = NULL;
}

static void cache_free(cache_t *c) {
    free(c->k);
    free(c->v);
    free(c->q);
}

static kvs_params mode(const kvs_method *m, const char *name) {
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_err_clear(e);
    kvs_status st = kvs_params_set(m, &p, "mode", name, e);
    CHECK_OK(st, e);
    return p;
}

static void test_ok(void) {
    cache_t c;
    cache_make(&c, 4, 50, 0);
    kvs_params p = mode(&firstb, "ok");
    kvs_budget b = {0.2, 0};
    kvs_plan plan;
    n_created = n_destroyed = n_observed = 0;
    CHECK_OK(kvs_compress(&firstb, &p, &c.view, &b, 3, &plan, e), e);
    CHECK_EQ_INT(n_created, 1);
    CHECK_EQ_INT(n_destroyed, 1);
    CHECK_EQ_INT(n_observed, 4);
    CHECK(strcmp(plan.method, "firstb") == 0); /* filled in by the driver */
    CHECK_EQ_INT(plan.n_layers, 4);
    CHECK_EQ_INT(plan.n_tokens, 50);
    CHECK_EQ_INT(kvs_plan_total(&plan), 4 * 10);
    for (int l = 0; l < 4; l++) {
        CHECK_EQ_INT(plan.layers[l].budget, 10);
        CHECK_EQ_INT(plan.layers[l].idx[1 * 10 + 9], 9);
    }
    kvs_plan_free(&plan);
    /* per_layer >= N still runs the method, which keeps everything */
    kvs_budget all = {1.0, 0}, many = {0, 1000};
    n_created = 0;
    CHECK_OK(kvs_compress(&firstb, &p, &c.view, &all, 1, &plan, e), e);
    CHECK_EQ_INT(n_created, 1);
    CHECK_EQ_INT(plan.layers[2].budget, 50);
    kvs_plan_free(&plan);
    CHECK_OK(kvs_compress(&firstb, &p, &c.view, &many, 0, &plan, e), e);
    CHECK_EQ_INT(kvs_plan_total(&plan), 200);
    kvs_plan_free(&plan);
    /* budgets may move between layers as long as the sum is exact */
    kvs_params ps = mode(&firstb, "shift");
    CHECK_OK(kvs_compress(&firstb, &ps, &c.view, &b, 1, &plan, e), e);
    CHECK_EQ_INT(plan.layers[0].budget, 11);
    CHECK_EQ_INT(plan.layers[1].budget, 9);
    kvs_plan_free(&plan);
    cache_free(&c);
}

static void test_contract_violations(void) {
    cache_t c;
    cache_make(&c, 3, 40, 0);
    kvs_budget b = {0, 8};
    kvs_plan plan;
    kvs_params p;
    n_created = n_destroyed = 0;

    p = mode(&firstb, "badsum");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INTERNAL, e,
                "method firstb: plan budgets sum to 23 but the budget is 24 (L = 3 layers x 8)");
    CHECK(plan.layers == NULL);
    p = mode(&firstb, "unsorted");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "method firstb: plan: layer 1 head 0: index 0 at slot 1 follows 0");
    CHECK(plan.layers == NULL);
    p = mode(&firstb, "failobs");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_NUMERIC, e,
                "method firstb: layer 1: scores blew up");
    p = mode(&firstb, "failsel");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "method firstb: refusing to select");
    CHECK(plan.layers == NULL);
    p = mode(&firstb, "wrongn");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INTERNAL, e,
                "plan has shape L=3 Hkv=2 N=41 but the cache has L=3 Hkv=2 N=40");
    p = mode(&firstb, "biglayer");
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "layer 0: budget 41 is not in [1, N = 40]");
    CHECK_EQ_INT(n_created, 6);
    CHECK_EQ_INT(n_destroyed, 6); /* destroyed on every path */

    /* driver-side errors: bad budget, bad cache, bad parameter set */
    p = mode(&firstb, "ok");
    kvs_budget bad = {1.5, 0};
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &bad, 1, &plan, e), KVS_ERR_INVALID, e,
                "method firstb: budget: ratio 1.5 is not in (0, 1]");
    c.k[(size_t)1 * H * 40 * D + 7 * D + 2] = NAN; /* layer 1, head 0, token 7, channel 2 */
    CHECK_FAILS(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), KVS_ERR_NUMERIC, e,
                "method firstb: layer 1: K head 0 token 7 channel 2 is NaN");
    c.k[(size_t)1 * H * 40 * D + 7 * D + 2] = 0;
    kvs_params wrong;
    kvs_params_defaults(&firstb, &wrong);
    wrong.n = 0;
    CHECK_FAILS(kvs_compress(&firstb, &wrong, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "holds 0 values but the method declares 1");
    CHECK_EQ_INT(n_created, 6); /* none of these reached create */
    cache_free(&c);
}

static void test_needs(void) {
    kvs_budget b = {0.25, 0};
    kvs_plan plan;
    cache_t c;
    kvs_params p = mode(&h2o, "ok");
    cache_make(&c, 2, 512, 32);
    CHECK_FAILS(kvs_compress(&h2o, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "method h2o needs the queries of all N=512 prompt positions; the cache has Nq=32");
    CHECK_OK(kvs_compress(&snapkv, &p, &c.view, &b, 1, &plan, e), e);
    CHECK_EQ_INT(kvs_plan_total(&plan), 2 * 128);
    kvs_plan_free(&plan);
    cache_free(&c);
    cache_make(&c, 2, 64, 64);
    CHECK_OK(kvs_compress(&h2o, &p, &c.view, &b, 1, &plan, e), e);
    kvs_plan_free(&plan);
    cache_free(&c);
    cache_make(&c, 2, 64, 0);
    CHECK_FAILS(kvs_compress(&snapkv, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e,
                "method snapkv needs the queries of the last prompt positions");
    CHECK_FAILS(kvs_compress(&h2o, &p, &c.view, &b, 1, &plan, e), KVS_ERR_INVALID, e, "the cache has Nq=0");
    CHECK_OK(kvs_compress(&firstb, &p, &c.view, &b, 1, &plan, e), e);
    kvs_plan_free(&plan);
    cache_free(&c);
}

int main(void) {
    test_ok();
    test_contract_violations();
    test_needs();
    return kvs_test_finish("core_compress");
}
