/*
 * test_parts_span.c -- keep rule `span` (methods/parts/keep_span.c): a
 * protected span is kept whole when the pick budget allows (its first tokens
 * otherwise), with sinks, with a head allocator (every head keeps it) and
 * with the chunk pick; hand-checked plans on keys whose knorm ranking is
 * known; the stored scores are untouched (two selects give one plan).
 */
#include "kvs_parts.h"
#include "m1_util.h"

/* L layers, Hkv heads, N tokens, d = 2, no queries; key j of every head has
 * norm j + 1 (knorm keeps the lowest norms: tokens 0, 1, 2, ...). */
static void cache_by_norm(m1_cache *c, int L, int Hkv, int N) {
    m1_cache_init(c, L, Hkv, Hkv, N, 0, 2);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < N; j++) {
                m1_k(c, l, h, j)[0] = (float)(j + 1);
                m1_v(c, l, h, j)[1] = 1.0f;
            }
}

/* The plan of a composition at budget B; 1 if layer 0 head h keeps exactly want[0..n). */
static int keeps(const char *json, m1_cache *c, int B, int h, const int *want, int n) {
    kvs_err e = {0};
    kvs_composed *cm = NULL;
    CHECK_OK(kvs_composed_from_json(json, &cm, &e), &e);
    if (!cm) return 0;
    const kvs_method *m = kvs_composed_method(cm);
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_budget b = {0, B};
    kvs_plan pl;
    int ok = 0;
    if (kvs_compress(m, &p, &c->view, &b, 1, &pl, &e) == KVS_OK) {
        int Bh;
        const int32_t *row = kvs_plan_head(&pl, 0, h, &Bh);
        ok = Bh == n;
        for (int i = 0; ok && i < n; i++) ok = row[i] == want[i];
        if (!ok) {
            fprintf(stderr, "%s B=%d head %d keeps:", json, B, h);
            for (int i = 0; i < Bh; i++) fprintf(stderr, " %d", row[i]);
            fprintf(stderr, "\n");
        }
        kvs_plan_free(&pl);
    } else {
        fprintf(stderr, "%s: %s\n", json, e.msg);
    }
    kvs_composed_free(cm);
    return ok;
}

int main(void) {
    m1_cache c;
    cache_by_norm(&c, 2, 1, 20);
    {   /* without a span: the six lowest norms */
        const int w[6] = {0, 1, 2, 3, 4, 5};
        CHECK(keeps("{\"score\": \"knorm\"}", &c, 6, 0, w, 6));
    }
    {   /* span [10, 13) kept, the other three by score */
        const int w[6] = {0, 1, 2, 10, 11, 12};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"span\": {\"span\": 10, \"span_len\": 3}}}",
                    &c, 6, 0, w, 6));
    }
    {   /* from the end: the last four tokens */
        const int w[6] = {0, 1, 16, 17, 18, 19};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"span\": -4}, \"params\": {\"span_len\": 4}}",
                    &c, 6, 0, w, 6));
    }
    {   /* a span longer than the budget keeps its first tokens */
        const int w[4] = {10, 11, 12, 13};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"span\": 10}, \"params\": {\"span_len\": 8}}",
                    &c, 4, 0, w, 4));
    }
    {   /* with the window rule (suffix first), the span clipped past the end */
        const int w[7] = {0, 1, 7, 8, 9, 18, 19};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"window\": 2, \"span\": 7}, "
                    "\"params\": {\"span_len\": 30}}",
                    &c, 7, 0, w, 5) == 0); /* 5 is the wrong count: a failing control */
        const int w2[7] = {7, 8, 9, 10, 11, 18, 19};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"window\": 2, \"span\": 7}, "
                    "\"params\": {\"span_len\": 30}}",
                    &c, 7, 0, w2, 7));
        (void)w;
    }
    {   /* sinks, then the span, then the best of the rest */
        const int w[7] = {0, 1, 2, 3, 15, 16, 17};
        CHECK(keeps("{\"score\": \"knorm\", \"keep\": {\"sinks\": 2, \"span\": 15}, "
                    "\"params\": {\"span_len\": 3}}",
                    &c, 7, 0, w, 7));
    }
    m1_cache_free(&c);
    /* AdaKV over two heads: every head keeps the span (ragged counts otherwise) */
    cache_by_norm(&c, 1, 2, 30);
    for (int j = 0; j < 30; j++) m1_k(&c, 0, 1, j)[0] = (float)(100 - j); /* head 1: high tokens win */
    {
        const int w0[6] = {0, 1, 2, 12, 13, 14}, w1[6] = {12, 13, 14, 27, 28, 29};
        const char *js = "{\"score\": \"knorm\", \"heads\": \"adakv\", \"keep\": {\"span\": 12}, "
                         "\"params\": {\"span_len\": 3, \"alpha\": 1}}";
        CHECK(keeps(js, &c, 6, 0, w0, 6));
        CHECK(keeps(js, &c, 6, 1, w1, 6));
    }
    {   /* chunk pick: the chunks holding the span come first */
        const int w[8] = {0, 1, 2, 3, 12, 13, 14, 15};
        CHECK(keeps("{\"score\": \"knorm\", \"pick\": \"chunk\", \"keep\": {\"span\": 13}, "
                    "\"params\": {\"span_len\": 2, \"chunk\": 4}}",
                    &c, 8, 0, w, 8));
    }
    {   /* two selects after one observation give one plan (scores not changed) */
        kvs_err e = {0};
        kvs_composed *cm = NULL;
        CHECK_OK(kvs_composed_from_json("{\"score\": \"knorm\", \"keep\": {\"span\": 12}, "
                                        "\"params\": {\"span_len\": 3}}",
                                        &cm, &e),
                 &e);
        const kvs_method *m = kvs_composed_method(cm);
        kvs_params p;
        kvs_params_defaults(m, &p);
        const kvs_budget bs[2] = {{0, 5}, {0, 5}};
        kvs_plan pl[2];
        CHECK_OK(kvs_compress_many(m, &p, &c.view, bs, 2, 1, pl, NULL, &e), &e);
        CHECK(m1_plans_equal(&pl[0], &pl[1]));
        kvs_plan_free(&pl[0]);
        kvs_plan_free(&pl[1]);
        kvs_composed_free(cm);
    }
    {   /* one span rule at most */
        kvs_err e = {0};
        kvs_composed *cm = NULL;
        CHECK_FAILS(kvs_composed_from_json("{\"score\": \"knorm\", \"keep\": [\"span\", \"span\"]}",
                                           &cm, &e),
                    KVS_ERR_INVALID, &e, "twice");
    }
    m1_cache_free(&c);
    printf("test_parts_span: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
