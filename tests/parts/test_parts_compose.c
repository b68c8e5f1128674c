/*
 * test_parts_compose.c -- methods composed from a user's description
 * (methods/parts/compose_json.c, compose_dyn.c):
 *   - errors name the field and the part: unknown scorer / allocator / keep
 *     rule / pick rule with a close-name suggestion, unknown field, a
 *     parameter no part reads (with a suggestion), a parameter out of range
 *     (naming the part that reads it), merge other than none, `parts`
 *     fixed, a rule listed twice, bad JSON, a bad name; a scorer that needs
 *     queries on a cache without them is refused by kvs_compress;
 *   - identity: the canonical JSON lists every field and value, so two
 *     descriptions of one composition have one name, and the canonical form
 *     composes back to itself; the label is not part of it; `parts` cannot
 *     be changed with kvs_params_set;
 *   - a description of a preset's composition with its values gives plans
 *     bit-identical to the preset (knorm, tova, keydiff, pyramidkv, chunkkv,
 *     expected_attention, pyramid_tova) on random caches and budgets;
 *   - the flashcache scorer with uniform + sinks + window + topk is
 *     bit-identical to `flashcache dba=false` with keep_sinks / keep_recent;
 *   - kvs_method_resolve: a name or a description.
 */
#include "kvs_parts.h"
#include "m1_util.h"

static int n_compared = 0;

static void expect_error(const char *json, const char *needle) {
    kvs_composed *c = NULL;
    kvs_err e = {0};
    kvs_status rc = kvs_composed_from_json(json, &c, &e);
    CHECK_MSG(rc != KVS_OK && strstr(e.msg, needle), "%s: expected an error with \"%s\", got %d: %s",
              json, needle, rc, e.msg);
    CHECK(c == NULL);
    kvs_composed_free(c);
}

static kvs_composed *compose(const char *json) {
    kvs_composed *c = NULL;
    kvs_err e = {0};
    kvs_status rc = kvs_composed_from_json(json, &c, &e);
    CHECK_MSG(rc == KVS_OK, "%s: %s", json, e.msg);
    return rc ? NULL : c;
}

static void test_errors(void) {
    expect_error("{\"score\":\"tovaa\"}", "score: unknown scorer 'tovaa' (did you mean 'tova'?)");
    expect_error("{}", "score: missing (required)");
    expect_error("{\"score\":3}", "score: expected the name of a scorer");
    expect_error("{\"score\":\"tova\",\"allocate\":\"pyramd\"}",
                 "allocate: unknown allocator 'pyramd' (did you mean 'pyramid'?)");
    expect_error("{\"score\":\"tova\",\"pick\":\"chunks\"}",
                 "pick: unknown pick 'chunks' (did you mean 'chunk'?)");
    expect_error("{\"score\":\"tova\",\"keep\":{\"sink\":4}}",
                 "keep: unknown keep 'sink' (did you mean 'sinks'?)");
    expect_error("{\"score\":\"tova\",\"keep\":[\"sinks\",\"sinks\"]}", "keep.sinks: rule listed twice");
    expect_error("{\"score\":\"tova\",\"scorer\":\"x\"}", "scorer: unknown field");
    expect_error("{\"score\":\"snapkv\",\"params\":{\"windw\":8}}",
                 "params.windw: no part of this composition reads 'windw' (did you mean 'window'?)");
    expect_error("{\"score\":\"snapkv\",\"params\":{\"window\":0}}",
                 "params.window: parameter window = 0 is out of range [1, 2147483647] (read by "
                 "scorer snapkv)");
    expect_error("{\"score\":\"snapkv\",\"pick\":\"chunk\",\"params\":{\"chunk\":0}}",
                 "(read by pick chunk)");
    expect_error("{\"score\":\"snapkv\",\"params\":{\"pool\":\"median\"}}",
                 "params.pool: parameter pool = 'median' is not one of max|avg");
    expect_error("{\"score\":\"knorm\",\"keep\":{\"sinks\":-1}}", "keep.sinks: parameter sinks = -1");
    expect_error("{\"score\":\"knorm\",\"keep\":{\"window\":{\"recent_frac\":2}}}",
                 "keep.window.recent_frac: parameter recent_frac = 2 is out of range");
    expect_error("{\"score\":\"knorm\",\"merge\":\"sum\"}", "merge: expected none, pivotal");
    expect_error("{\"score\":\"knorm\",\"params\":{\"parts\":3}}", "`parts` is fixed");
    expect_error("{\"score\":\"knorm\",\"params\":{\"seed\":1}}",
                 "no part of this composition reads 'seed'");
    expect_error("{\"score\":\"knorm\",\"name\":\"{x\"}", "name: expected a non-empty string");
    expect_error("{\"score\":\"knorm\",", "not valid JSON");
    expect_error("[1]", "a composed method is an object");
}

static void test_identity(void) {
    kvs_composed *a = compose("{\"score\":\"knorm\"}");
    kvs_composed *b = compose("{\"name\":\"my_knorm\",\"score\":\"knorm\",\"allocate\":\"uniform\","
                              "\"pick\":\"topk\",\"merge\":\"none\",\"keep\":{},\"params\":{}}");
    if (a && b) {
        CHECK(strcmp(kvs_composed_method(a)->name, kvs_composed_method(b)->name) == 0);
        CHECK(strcmp(kvs_composed_label(b), "my_knorm") == 0);
        CHECK(strcmp(kvs_composed_label(a), "knorm+uniform+topk") == 0);
        CHECK_MSG(strcmp(kvs_composed_method(a)->name,
                         "{\"score\":\"knorm\",\"allocate\":\"uniform\",\"keep\":{},\"pick\":"
                         "\"topk\",\"merge\":\"none\",\"params\":{}}") == 0,
                  "canonical: %s", kvs_composed_method(a)->name);
    }
    kvs_composed_free(a);
    kvs_composed_free(b);
    /* every value listed, keep rules in the order given, canonical -> itself */
    const char *d = "{\"score\":\"snapkv\",\"allocate\":\"pyramid\",\"keep\":{\"window\":16,"
                    "\"sinks\":4},\"pick\":\"chunk\",\"params\":{\"chunk\":5,\"pool\":\"avg\"}}";
    kvs_composed *c = compose(d);
    if (c) {
        const char *want = "{\"score\":\"snapkv\",\"allocate\":\"pyramid\",\"keep\":{\"window\":16,"
                           "\"sinks\":4},\"pick\":\"chunk\",\"merge\":\"none\",\"params\":{"
                           "\"kernel\":7,\"pool\":\"avg\",\"beta\":20,\"recent_frac\":0,\"chunk\":5}}";
        const kvs_method *m = kvs_composed_method(c);
        CHECK_MSG(strcmp(m->name, want) == 0, "canonical: %s", m->name);
        CHECK(strcmp(kvs_composed_label(c), "snapkv+pyramid+window+sinks+chunk") == 0);
        CHECK(m->needs == KVS_NEED_Q_WINDOW);
        kvs_composed *c2 = compose(m->name);
        if (c2) CHECK(strcmp(kvs_composed_method(c2)->name, m->name) == 0);
        kvs_composed_free(c2);
        /* `parts` pinned: --param cannot change the composition */
        kvs_params p;
        kvs_params_defaults(m, &p);
        kvs_err e = {0};
        CHECK_FAILS(kvs_params_set(m, &p, "parts", "0", &e), KVS_ERR_INVALID, &e, "out of range");
        CHECK_OK(kvs_params_set(m, &p, "chunk", "7", &e), &e);
        /* a window query budget: the snapkv window of 16 */
        CHECK_EQ_INT(m->queries_wanted(&p, 100), 16);
    }
    kvs_composed_free(c);
    /* keep as a list in priority order; true = the rule's default */
    kvs_composed *l = compose("{\"score\":\"tova\",\"keep\":[\"window\",\"sinks\"]}");
    kvs_composed *t = compose("{\"score\":\"tova\",\"keep\":{\"window\":true,\"sinks\":true}}");
    if (l && t) {
        CHECK(strcmp(kvs_composed_method(l)->name, kvs_composed_method(t)->name) == 0);
        CHECK(strstr(kvs_composed_method(l)->name, "\"keep\":{\"window\":0,\"sinks\":0}") != NULL);
    }
    kvs_composed_free(l);
    kvs_composed_free(t);
    /* resolve: a name or a description */
    const kvs_method *m = NULL;
    kvs_composed *own = NULL;
    kvs_err e = {0};
    CHECK_OK(kvs_method_resolve("tova", &m, &own, &e), &e);
    CHECK(m == &kvs_preset_tova && own == NULL);
    CHECK_OK(kvs_method_resolve("{\"score\":\"h2o\"}", &m, &own, &e), &e);
    CHECK(own && m == kvs_composed_method(own) && m->needs == KVS_NEED_Q_ALL);
    kvs_composed_free(own);
    own = NULL;
    CHECK_FAILS(kvs_method_resolve("{\"score\":\"h20\"}", &m, &own, &e), KVS_ERR_NOTFOUND, &e,
                "composed method: score: unknown scorer 'h20' (did you mean 'h2o'?)");
    CHECK_FAILS(kvs_method_resolve("tvoa", &m, &own, &e), KVS_ERR_NOTFOUND, &e, "unknown method");
}

/* A cache without queries: a scorer that reads them is refused, naming it. */
static void test_needs(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 2, 4, 40, 0, 8);
    m1_cache_fill_random(&c, 5);
    kvs_composed *x = compose("{\"score\":\"expected_attention\"}");
    if (x) {
        kvs_params p;
        kvs_params_defaults(kvs_composed_method(x), &p);
        kvs_plan pl;
        kvs_budget b = {0.5, 0};
        kvs_err e = {0};
        CHECK_FAILS(kvs_compress(kvs_composed_method(x), &p, &c.view, &b, 1, &pl, &e),
                    KVS_ERR_INVALID, &e, "\"score\":\"expected_attention\"");
        CHECK(strstr(e.msg, "needs the queries") != NULL);
    }
    kvs_composed_free(x);
    m1_cache_free(&c);
}

static void compare(const kvs_method *a, const kvs_params *pa, const kvs_method *b,
                    const kvs_params *pb, m1_cache *c, int B, int threads, const char *what) {
    kvs_plan x, y;
    kvs_budget bud = {0, B};
    kvs_err ea = {0}, eb = {0};
    kvs_status ra = kvs_compress(a, pa, &c->view, &bud, threads, &x, &ea);
    kvs_status rb = kvs_compress(b, pb, &c->view, &bud, threads, &y, &eb);
    CHECK_MSG(ra == KVS_OK && rb == KVS_OK, "%s N=%d B=%d: %s | %s", what, c->N, B, ea.msg, eb.msg);
    if (ra || rb) {
        if (!ra) kvs_plan_free(&x);
        if (!rb) kvs_plan_free(&y);
        return;
    }
    CHECK_MSG(m1_plans_equal(&x, &y), "%s N=%d B=%d threads=%d: plans differ", what, c->N, B, threads);
    n_compared++;
    kvs_plan_free(&x);
    kvs_plan_free(&y);
}

/* Composed == preset, on a few random caches and budgets. */
static void test_presets(void) {
    static const struct {
        const kvs_method *preset;
        const char *desc;
    } cases[] = {
        {&kvs_preset_knorm, "{\"score\":\"knorm\",\"keep\":{\"sinks\":0,\"window\":0}}"},
        {&kvs_preset_tova, "{\"score\":\"tova\",\"keep\":{\"window\":1}}"},
        {&kvs_preset_keydiff, "{\"score\":\"keydiff\",\"keep\":{\"sinks\":0,\"window\":0}}"},
        {&kvs_preset_pyramidkv,
         "{\"score\":\"snapkv\",\"allocate\":\"pyramid\",\"keep\":{\"window\":8}}"},
        {&kvs_preset_chunkkv,
         "{\"score\":\"snapkv\",\"keep\":{\"window\":8},\"pick\":\"chunk\"}"},
        {&kvs_preset_expected_attention,
         "{\"score\":\"expected_attention\",\"keep\":{\"sinks\":4}}"},
        {&kvs_preset_pyramid_tova,
         "{\"score\":\"tova\",\"allocate\":\"pyramid\",\"keep\":{\"window\":1}}"},
    };
    const int shapes[3][6] = {{2, 2, 4, 50, 50, 8}, {3, 1, 3, 97, 20, 16}, {1, 2, 2, 9, 9, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_composed *c = compose(cases[i].desc);
        if (!c) continue;
        const kvs_method *m = kvs_composed_method(c);
        kvs_params pc, pp;
        kvs_params_defaults(m, &pc);
        kvs_params_defaults(cases[i].preset, &pp);
        for (int s = 0; s < 3; s++) {
            m1_cache mc;
            m1_cache_init(&mc, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                          shapes[s][4], shapes[s][5]);
            m1_cache_fill_random(&mc, 17 + (uint64_t)s);
            const int N = mc.N, bs[5] = {1, 3, N / 4 + 1, N / 2, N};
            for (int b = 0; b < 5; b++)
                if (bs[b] >= 1 && bs[b] <= N)
                    compare(cases[i].preset, &pp, m, &pc, &mc, bs[b], 1 + (b & 1),
                            cases[i].preset->name);
            m1_cache_free(&mc);
        }
        kvs_composed_free(c);
    }
}

/* flashcache scorer + uniform + sinks + window + topk == flashcache dba=false. */
static void test_flashcache_identity(void) {
    const int sk[3][2] = {{0, 0}, {2, 3}, {5, 0}};
    const int shapes[3][4] = {{2, 2, 64, 8}, {3, 1, 97, 16}, {1, 3, 30, 4}}; /* L Hkv N d */
    for (int k = 0; k < 3; k++) {
        char desc[200], buf[16];
        snprintf(desc, sizeof desc,
                 "{\"score\":\"flashcache\",\"keep\":{\"sinks\":%d,\"window\":%d},\"params\":"
                 "{\"gamma\":%s}}",
                 sk[k][0], sk[k][1], k == 1 ? "0.1" : "0.2");
        kvs_composed *c = compose(desc);
        if (!c) continue;
        kvs_params pc, pf;
        kvs_params_defaults(kvs_composed_method(c), &pc);
        kvs_params_defaults(&kvs_method_flashcache, &pf);
        m1_set(&kvs_method_flashcache, &pf, "dba", "false");
        m1_set(&kvs_method_flashcache, &pf, "gamma", k == 1 ? "0.1" : "0.2");
        snprintf(buf, sizeof buf, "%d", sk[k][0]);
        m1_set(&kvs_method_flashcache, &pf, "keep_sinks", buf);
        snprintf(buf, sizeof buf, "%d", sk[k][1]);
        m1_set(&kvs_method_flashcache, &pf, "keep_recent", buf);
        for (int s = 0; s < 3; s++) {
            m1_cache mc;
            m1_cache_init(&mc, shapes[s][0], shapes[s][1], shapes[s][1], shapes[s][2], 0,
                          shapes[s][3]);
            m1_cache_fill_random(&mc, 40 + (uint64_t)s);
            const int N = mc.N, bs[5] = {1, 4, N / 3, N - 1, N};
            for (int b = 0; b < 5; b++)
                if (bs[b] >= 1)
                    compare(&kvs_method_flashcache, &pf, kvs_composed_method(c), &pc, &mc, bs[b],
                            1 + 2 * (b & 1), "flashcache");
            m1_cache_free(&mc);
        }
        kvs_composed_free(c);
    }
}

int main(void) {
    test_errors();
    test_identity();
    test_needs();
    test_presets();
    test_flashcache_identity();
    CHECK_MSG(n_compared >= 7 * 12 + 30, "only %d plan comparisons ran", n_compared);
    printf("%d plan comparisons\n", n_compared);
    return kvs_test_finish("test_parts_compose");
}
