/*
 * test_plan.c -- kvs_plan_init / free / check / total / retention and merge
 * names: valid plans pass, each broken invariant fails with a message that
 * names the layer and head.
 */
#include "kvsieve.h"
#include "test_util.h"

static kvs_err e_, *e = &e_;

/* Fill head h of layer l with budget consecutive indices starting at start. */
static void fill(kvs_plan *p, int l, int h, int start) {
    int B = p->layers[l].budget;
    for (int i = 0; i < B; i++) p->layers[l].idx[h * B + i] = start + i;
}

static void test_valid(void) {
    kvs_plan p;
    int budgets[3] = {2, 5, 1};
    CHECK_OK(kvs_plan_init(&p, "toy", 3, 2, 10, budgets, e), e);
    CHECK(strcmp(p.method, "toy") == 0);
    CHECK_EQ_INT(p.n_layers, 3);
    CHECK_EQ_INT(p.n_kv_heads, 2);
    CHECK_EQ_INT(p.n_tokens, 10);
    CHECK_EQ_INT(p.merge, KVS_MERGE_NONE);
    CHECK(p.note[0] == '\0');
    for (int l = 0; l < 3; l++)
        for (int h = 0; h < 2; h++) fill(&p, l, h, h * 3);
    CHECK_OK(kvs_plan_check(&p, e), e);
    CHECK_EQ_INT(kvs_plan_total(&p), 8);

    /* retention: layer 0 heads keep {0,1} / {3,4}; layer 1 {0..4} / {3..7}; layer 2 {0} / {3} */
    int32_t out1[] = {0};
    CHECK_NEAR(kvs_plan_retention(&p, out1, 1), 3.0 / 6.0, 1e-12); /* token 0: head 0 of each layer */
    int32_t out2[] = {3, 9, -1, 100};
    /* token 3: L0H1, L1H0, L1H1, L2H1 = 4 of 6; 9: none; -1, 100: out of range, never kept */
    CHECK_NEAR(kvs_plan_retention(&p, out2, 4), 4.0 / 24.0, 1e-12);
    CHECK(isnan(kvs_plan_retention(&p, out2, 0)));

    /* budgets == N everywhere */
    int full[1] = {4};
    kvs_plan q;
    CHECK_OK(kvs_plan_init(&q, "full", 1, 1, 4, full, e), e);
    fill(&q, 0, 0, 0);
    CHECK_OK(kvs_plan_check(&q, e), e);
    kvs_plan_free(&q);
    CHECK(q.layers == NULL && q.n_layers == 0);
    kvs_plan_free(&q); /* double free is harmless on a freed plan */
    kvs_plan_free(&p);

    /* a long method name is truncated, not overflowed */
    CHECK_OK(kvs_plan_init(&q, "a-very-long-method-name-that-exceeds-32-bytes", 1, 1, 4, full, e), e);
    CHECK_EQ_INT(strlen(q.method), sizeof q.method - 1);
    kvs_plan_free(&q);
}

static void test_init_errors(void) {
    kvs_plan p;
    int bad[2] = {3, 11};
    CHECK_FAILS(kvs_plan_init(&p, "x", 2, 1, 10, bad, e), KVS_ERR_INVALID, e, "layer 1: budget 11 is not in [1, N = 10]");
    CHECK(p.layers == NULL);
    int zero[2] = {0, 3};
    CHECK_FAILS(kvs_plan_init(&p, "x", 2, 1, 10, zero, e), KVS_ERR_INVALID, e, "layer 0: budget 0");
    int ok[1] = {1};
    CHECK_FAILS(kvs_plan_init(&p, "x", 1, 0, 10, ok, e), KVS_ERR_INVALID, e, "Hkv = 0");
    CHECK_FAILS(kvs_plan_init(&p, "x", 0, 1, 10, ok, e), KVS_ERR_INVALID, e, "L = 0");
}

static void test_check_errors(void) {
    kvs_plan p;
    int budgets[2] = {3, 4};
    CHECK_OK(kvs_plan_init(&p, "toy", 2, 3, 8, budgets, e), e);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++) fill(&p, l, h, h);
    CHECK_OK(kvs_plan_check(&p, e), e);

    p.layers[1].idx[2 * 4 + 2] = p.layers[1].idx[2 * 4 + 1]; /* duplicate in layer 1 head 2 */
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 1 head 2: index 3 at slot 2 follows 3");
    fill(&p, 1, 2, 2);
    p.layers[0].idx[1 * 3 + 0] = 5; /* unsorted in layer 0 head 1: 5, 2, 3 */
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 0 head 1: index 2 at slot 1 follows 5");
    fill(&p, 0, 1, 1);
    p.layers[1].idx[0] = -1;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 1 head 0: index -1 at slot 0 is out of range [0, 8)");
    p.layers[1].idx[0] = 0;
    p.layers[0].idx[2 * 3 + 2] = 8;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 0 head 2: index 8 at slot 2 is out of range");
    fill(&p, 0, 2, 2);
    CHECK_OK(kvs_plan_check(&p, e), e);
    p.layers[1].budget = 9;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 1: budget 9 is not in [1, N = 8]");
    p.layers[1].budget = 4;
    p.merge = (kvs_merge)7;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "unknown merge mode 7");
    p.merge = KVS_MERGE_WEIGHTED;
    CHECK_OK(kvs_plan_check(&p, e), e);
    kvs_plan_free(&p);
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "L = 0");
}

static void test_merge_names(void) {
    CHECK(strcmp(kvs_merge_name(KVS_MERGE_NONE), "none") == 0);
    CHECK(strcmp(kvs_merge_name(KVS_MERGE_PIVOTAL), "pivotal") == 0);
    CHECK(strcmp(kvs_merge_name(KVS_MERGE_AVERAGE), "average") == 0);
    CHECK(strcmp(kvs_merge_name(KVS_MERGE_WEIGHTED), "weighted") == 0);
    CHECK(strcmp(kvs_merge_name((kvs_merge)9), "unknown") == 0);
}

int main(void) {
    test_valid();
    test_init_errors();
    test_check_errors();
    test_merge_names();
    return kvs_test_finish("core_plan");
}
