/*
 * test_plan.c -- plans as JSON: round trips over random plans (every index,
 * budget, merge, note and the method's parameters by name), and errors that
 * name the JSON field.
 */
#include "kvs_formats.h"
#include "kvsieve_methods.h"
#include "test_util.h"

#include <stdint.h>

static kvs_err *ep(kvs_err *e) { return e; }

static void random_plan(kvs_plan *p, uint64_t *rs, int L, int Hkv, int N) {
    int budgets[16];
    for (int l = 0; l < L; l++) budgets[l] = 1 + (int)(kvs_rng_next(rs) % (uint64_t)N);
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_plan_init(p, "flashcache", L, Hkv, N, budgets, &err), ep(&err));
    uint8_t *mark = malloc((size_t)N);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++) {
            int B = budgets[l];
            memset(mark, 0, (size_t)N);
            int c = 0;
            while (c < B) {
                int n = (int)(kvs_rng_next(rs) % (uint64_t)N);
                if (!mark[n]) mark[n] = 1, c++;
            }
            int32_t *row = p->layers[l].idx + (size_t)h * B;
            c = 0;
            for (int n = 0; n < N; n++)
                if (mark[n]) row[c++] = n;
        }
    free(mark);
}

static int plans_equal(const kvs_plan *a, const kvs_plan *b) {
    if (strcmp(a->method, b->method) || a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads ||
        a->n_tokens != b->n_tokens || a->merge != b->merge || strcmp(a->note, b->note))
        return 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->layers[l].budget != b->layers[l].budget) return 0;
        if (memcmp(a->layers[l].idx, b->layers[l].idx,
                   sizeof(int32_t) * (size_t)a->n_kv_heads * (size_t)a->layers[l].budget))
            return 0;
    }
    return 1;
}

static void test_roundtrip(void) {
    uint64_t rs = 99;
    const kvs_method *m = kvs_method_find("flashcache");
    CHECK(m != NULL);
    if (!m) return;
    for (int rep = 0; rep < 30; rep++) {
        kvs_plan p, q;
        int L = 1 + (int)(kvs_rng_next(&rs) % 6), Hkv = 1 + (int)(kvs_rng_next(&rs) % 4);
        int N = 1 + (int)(kvs_rng_next(&rs) % 300);
        random_plan(&p, &rs, L, Hkv, N);
        p.merge = (kvs_merge)(rep % 4);
        if (rep % 3 == 0) snprintf(p.note, sizeof p.note, "note \"%d\"\n", rep);
        kvs_params prm;
        kvs_params_defaults(m, &prm);
        kvs_err err;
        kvs_err_clear(&err);
        CHECK_OK(kvs_params_set(m, &prm, "gamma", "0.1", &err), ep(&err));
        CHECK_OK(kvs_params_set(m, &prm, "granularity", "layer", &err), ep(&err));
        char *js = kvs_plan_to_json(&p, m, rep % 2 ? &prm : NULL);
        CHECK(js != NULL);
        if (!js) continue;
        if (rep % 2) {
            CHECK(strstr(js, "\"gamma\":0.1") != NULL);
            CHECK(strstr(js, "\"granularity\":\"layer\"") != NULL);
        } else {
            CHECK(strstr(js, "\"gamma\":0.2") != NULL);
            CHECK(strstr(js, "\"granularity\":\"head\"") != NULL);
        }
        CHECK(strstr(js, "\"dba\":true") != NULL);
        CHECK(strstr(js, "\"method\":\"flashcache\"") != NULL);
        CHECK_OK(kvs_plan_from_json(js, &q, &err), ep(&err));
        CHECK(plans_equal(&p, &q));
        kvs_plan_free(&q);
        free(js);
        kvs_plan_free(&p);
    }
    /* golden: a tiny plan, hand-written text */
    const char *txt = "{\"method\":\"custom\",\"params\":{},\"n_tokens\":5,\"merge\":\"pivotal\","
                      "\"layers\":[{\"budget\":2,\"heads\":[[0,4],[1,2]]}]}";
    kvs_plan q;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_plan_from_json(txt, &q, &err), ep(&err));
    CHECK(strcmp(q.method, "custom") == 0);
    CHECK_EQ_INT(q.n_layers, 1);
    CHECK_EQ_INT(q.n_kv_heads, 2);
    CHECK_EQ_INT(q.n_tokens, 5);
    CHECK_EQ_INT(q.merge, KVS_MERGE_PIVOTAL);
    CHECK_EQ_INT(q.layers[0].idx[1], 4);
    CHECK_EQ_INT(q.layers[0].idx[2], 1);
    char *back = kvs_plan_to_json(&q, NULL, NULL);
    CHECK(back && strcmp(back, "{\"method\":\"custom\",\"params\":{},\"n_tokens\":5,\"merge\":\"pivotal\","
                               "\"layers\":[\n{\"budget\":2,\"heads\":[[0,4],[1,2]]}]}\n") == 0);
    free(back);
    kvs_plan_free(&q);
}

static void bad(const char *txt, const char *needle, int line) {
    kvs_plan p;
    kvs_err err;
    kvs_err_clear(&err);
    kvs_status st = kvs_plan_from_json(txt, &p, &err);
    kvs_test_checks++;
    if (st != KVS_ERR_FORMAT || !strstr(err.msg, needle)) {
        fprintf(stderr, "line %d: expected format error with \"%s\"; got %d: %s\n", line, needle, (int)st,
                err.msg);
        kvs_test_failures++;
    }
    if (st == KVS_OK) kvs_plan_free(&p);
    else CHECK(p.layers == NULL);
}

#define HDR "{\"method\":\"x\",\"n_tokens\":256,"
#define L1 "{\"budget\":2,\"heads\":[[0,1],[2,3]]}"

static void test_errors(void) {
    bad("{\"method\":", "plan: not valid JSON", __LINE__);
    bad("[1]", "plan: top level is not a JSON object", __LINE__);
    bad("{\"n_tokens\":5,\"layers\":[]}", "plan: method: missing", __LINE__);
    bad("{\"method\":7,\"n_tokens\":5}", "plan: method: not a string", __LINE__);
    bad("{\"method\":\"x\",\"layers\":[]}", "plan: n_tokens: missing", __LINE__);
    bad("{\"method\":\"x\",\"n_tokens\":2.5}", "plan: n_tokens: must be an integer", __LINE__);
    bad(HDR "\"merge\":\"blend\",\"layers\":[" L1 "]}", "plan: merge: 'blend'", __LINE__);
    bad(HDR "\"layers\":[]}", "plan: layers: must be a non-empty array", __LINE__);
    bad(HDR "\"note\":3,\"layers\":[" L1 "]}", "plan: note: not a string", __LINE__);
    bad(HDR "\"params\":[],\"layers\":[" L1 "]}", "plan: params: not an object", __LINE__);
    bad(HDR "\"layers\":[" L1 "," L1 ",{\"budget\":6,\"heads\":[[0,1,2,3,4,5],[0,1,2,3,4,300]]}]}",
        "plan: layers[2].heads[1][5]: index 300 out of range [0, 256)", __LINE__);
    bad(HDR "\"layers\":[" L1 ",{\"budget\":2,\"heads\":[[0,1]]}]}",
        "plan: layers[1].heads: 1 heads but layers[0] has 2", __LINE__);
    bad(HDR "\"layers\":[" L1 ",{\"budget\":3,\"heads\":[[0,1],[2,3]]}]}",
        "plan: layers[1].heads[0]: must be an array of budget = 3 indices (has 2)", __LINE__);
    bad(HDR "\"layers\":[{\"budget\":2,\"heads\":[[0,1],[3,2]]}]}", "plan: layers[0].heads[1][1]: index 2 after 3",
        __LINE__);
    bad(HDR "\"layers\":[{\"budget\":2,\"heads\":[[0,0],[2,3]]}]}", "plan: layers[0].heads[0][1]: index 0 after 0",
        __LINE__);
    bad(HDR "\"layers\":[{\"budget\":2,\"heads\":[[0,\"1\"],[2,3]]}]}", "plan: layers[0].heads[0][1]: not an integer",
        __LINE__);
    bad(HDR "\"layers\":[{\"budget\":0,\"heads\":[[],[]]}]}", "plan: layers[0].budget: 0 is not an integer in [1, n_tokens = 256]",
        __LINE__);
    bad(HDR "\"layers\":[{\"heads\":[[0],[1]]}]}", "plan: layers[0].budget: missing", __LINE__);
    bad(HDR "\"layers\":[{\"budget\":1}]}", "plan: layers[0].heads: missing", __LINE__);
    bad(HDR "\"layers\":[5]}", "plan: layers[0]: not an object", __LINE__);
    /* parameters of a registered method are checked by name and range */
    bad("{\"method\":\"flashcache\",\"params\":{\"gama\":0.1},\"n_tokens\":4,\"layers\":[{\"budget\":1,\"heads\":[[0]]}]}",
        "plan: params.gama:", __LINE__);
    bad("{\"method\":\"flashcache\",\"params\":{\"gamma\":7},\"n_tokens\":4,\"layers\":[{\"budget\":1,\"heads\":[[0]]}]}",
        "plan: params.gamma:", __LINE__);
    bad("{\"method\":\"flashcache\",\"params\":{\"gamma\":[1]},\"n_tokens\":4,\"layers\":[{\"budget\":1,\"heads\":[[0]]}]}",
        "plan: params.gamma: not a number, bool or string", __LINE__);
}

int main(void) {
    test_roundtrip();
    test_errors();
    return kvs_test_finish("formats_plan");
}
