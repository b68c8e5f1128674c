/*
 * test_compress_many.c -- kvs_compress_many (one observation, one select per
 * budget) gives, for every registered method, every budget and several
 * synthetic caches, byte for byte the plans kvs_compress gives for each
 * budget alone: indices, ragged counts, per-layer budgets, merge, method
 * name and note. Also: a method declaring KVS_SELECT_ONCE (its select
 * consumes the state) gets one observation per budget and still the right
 * plans; errors name the budget and leave every plan freed.
 * Not a test of the methods' own correctness (tests/methods*, tests/parts).
 */
#include "kvs_formats.h"
#include "kvs_parts.h" /* kvs_composed_free */
#include "kvsieve_methods.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* 1 when a and b are the same plan, byte for byte; else prints why. */
static int plan_same(const kvs_plan *a, const kvs_plan *b, const char *what) {
    if (strcmp(a->method, b->method) || strcmp(a->note, b->note) || a->merge != b->merge ||
        a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads || a->n_tokens != b->n_tokens) {
        fprintf(stderr, "%s: header differs: '%s'/'%s' note '%s'/'%s' merge %d/%d L %d/%d Hkv %d/%d N %d/%d\n",
                what, a->method, b->method, a->note, b->note, a->merge, b->merge, a->n_layers, b->n_layers,
                a->n_kv_heads, b->n_kv_heads, a->n_tokens, b->n_tokens);
        return 0;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const kvs_plan_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->budget != y->budget || !x->counts != !y->counts) {
            fprintf(stderr, "%s: layer %d: budget %d/%d, ragged %d/%d\n", what, l, x->budget, y->budget,
                    !!x->counts, !!y->counts);
            return 0;
        }
        if (x->counts && memcmp(x->counts, y->counts, sizeof(int32_t) * (size_t)a->n_kv_heads)) {
            fprintf(stderr, "%s: layer %d: head counts differ\n", what, l);
            return 0;
        }
        const size_t n = (size_t)a->n_kv_heads * (size_t)x->budget; /* rows of the layer, ragged or not */
        if (memcmp(x->idx, y->idx, sizeof(int32_t) * n)) {
            fprintf(stderr, "%s: layer %d: kept indices differ\n", what, l);
            return 0;
        }
    }
    return 1;
}

static int plan_zero(const kvs_plan *p) { return !p->layers && p->n_layers == 0 && p->method[0] == '\0'; }

enum { NB = 7 };

/* Every budget of b[0..NB) through kvs_compress_many and kvs_compress. */
static void compare(const kvs_method *m, const kvs_params *p, const kvs_cache_view *cv, const kvs_budget *b,
                    int threads, const char *cache_name) {
    kvs_plan many[NB], one;
    double ms[NB];
    kvs_err e1 = {0}, e2 = {0};
    kvs_status st_many = kvs_compress_many(m, p, cv, b, NB, threads, many, ms, &e1);
    for (int i = 0; i < NB; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s on %s, budget %d (ratio %g tokens %lld)", m->name, cache_name, i, b[i].ratio,
                 (long long)b[i].tokens);
        kvs_status st_one = kvs_compress(m, p, cv, &b[i], threads, &one, &e2);
        if (st_many == KVS_OK) {
            CHECK_MSG(st_one == KVS_OK, "%s: kvs_compress failed alone: %s", what, e2.msg);
            if (st_one == KVS_OK) CHECK_MSG(plan_same(&many[i], &one, what), "%s", what);
            CHECK_MSG(ms[i] >= 0.0, "%s: select_ms %g", what, ms[i]);
        } else {
            /* one budget failing fails the call; every plan is left zeroed */
            CHECK_MSG(plan_zero(&many[i]), "%s: plan not freed after an error", what);
        }
        kvs_plan_free(&one);
    }
    if (st_many != KVS_OK) { /* then some budget fails alone too, with the same code */
        int fails = 0;
        for (int i = 0; i < NB && !fails; i++) {
            kvs_status s1 = kvs_compress(m, p, cv, &b[i], threads, &one, &e2);
            fails = s1 == st_many;
            kvs_plan_free(&one);
        }
        CHECK_MSG(fails, "%s on %s: kvs_compress_many failed (%s) but no budget fails alone", m->name,
                  cache_name, e1.msg);
    }
    for (int i = 0; i < NB; i++) kvs_plan_free(&many[i]);
}

typedef struct {
    const char *method, *kv; /* a parameter setting to try besides the defaults */
} override;

static const override overrides[] = {
    {"flashcache", "dba=false"}, {"flashcache", "granularity=layer"}, {"flashcache", "keep_sinks=4"},
    {"snapkv", "window=8"},      {"snapkv", "pool=avg"},              {"h2o", "normalize=true"},
    {"h2o", "recent_frac=0"},    {"meda", "recent_frac=0.25"},        {"random", "seed=7"},
};

static void all_methods(const kvs_cache_view *cv, int N, int threads, const char *cache_name) {
    const kvs_budget b[NB] = {{0.75, 0}, {0.5, 0}, {0.25, 0}, {0.125, 0},
                              {0, 1},    {0, N / 3}, {0, N}};
    for (int i = 0; i < kvs_methods_count(); i++) {
        const kvs_method *m = kvs_method_at(i);
        kvs_params p;
        kvs_params_defaults(m, &p);
        compare(m, &p, cv, b, threads, cache_name);
        for (size_t k = 0; k < sizeof overrides / sizeof overrides[0]; k++) {
            if (strcmp(overrides[k].method, m->name)) continue;
            kvs_err e = {0};
            kvs_params_defaults(m, &p);
            CHECK_OK(kvs_params_set_kv(m, &p, overrides[k].kv, &e), &e);
            compare(m, &p, cv, b, threads, cache_name);
        }
    }
    /* a user's composition (run-time table, ragged heads, chunk pick) */
    const kvs_method *cm = NULL;
    struct kvs_composed *owned = NULL;
    kvs_err e = {0};
    CHECK_OK(kvs_method_resolve("{\"score\": \"knorm\", \"allocate\": \"pyramid\", \"heads\": \"adakv\", "
                                "\"keep\": {\"sinks\": 2}, \"pick\": \"chunk\"}",
                                &cm, &owned, &e),
             &e);
    if (cm) {
        kvs_params p;
        kvs_params_defaults(cm, &p);
        compare(cm, &p, cv, b, threads, cache_name);
    }
    kvs_composed_free(owned);
}

/* A synthetic cache of the preset's shape (n_layers overridden when > 0). */
static void on_synth(const char *preset, int L, int N, int Nq, double image_frac, uint64_t seed, int threads) {
    kvs_synth_config cfg;
    kvs_err e = {0};
    CHECK_OK(kvs_synth_preset(preset, &cfg, &e), &e);
    if (L > 0) cfg.n_layers = L;
    cfg.n_tokens = N;
    cfg.n_queries = Nq;
    cfg.n_probes = 0;
    cfg.image_frac = image_frac;
    cfg.seed = seed;
    kvs_dense_cache dc;
    memset(&dc, 0, sizeof dc);
    CHECK_OK(kvs_synth_generate(&cfg, &dc, NULL, NULL, &e), &e);
    if (dc.n_layers < 1) return;
    kvs_layer *layers = calloc((size_t)dc.n_layers, sizeof *layers);
    kvs_cache_view cv;
    CHECK_OK(kvs_dense_cache_view(&dc, &cv, layers, &e), &e);
    char name[96];
    snprintf(name, sizeof name, "%s L=%d N=%d Nq=%d image=%g seed=%llu threads=%d", preset, dc.n_layers, N, Nq,
             image_frac, (unsigned long long)seed, threads);
    all_methods(&cv, N, threads, name);
    free(layers);
    kvs_dense_cache_free(&dc);
}

/* ---- a method whose select consumes its state ------------------------------ */

typedef struct {
    kvs_shape shape;
    int observed, selected;
    float *score; /* [N]: the sum of |K| over layers, heads, channels */
} once_state;

static kvs_status once_create(const kvs_params *p, const kvs_shape *s, void **state, kvs_err *err) {
    (void)p;
    once_state *st = calloc(1, sizeof *st);
    if (st) st->score = calloc((size_t)s->n_tokens, sizeof(float));
    if (!st || !st->score) {
        if (st) free(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "once: out of memory");
    }
    st->shape = *s;
    *state = st;
    return KVS_OK;
}

static kvs_status once_observe(void *state, int layer, const kvs_layer *in, const uint8_t *mod, kvs_err *err) {
    (void)mod;
    (void)err;
    once_state *st = state;
    const kvs_view *k = &in->k;
    for (int h = 0; h < k->n_heads; h++)
        for (int n = 0; n < k->n_tokens; n++) {
            const float *row = (const float *)k->data + (size_t)h * (size_t)k->s_head + (size_t)n * (size_t)k->s_tok;
            for (int c = 0; c < k->head_dim; c++) st->score[n] += fabsf(row[c]);
        }
    st->observed = layer + 1;
    return KVS_OK;
}

/* Keeps the top scores, then zeroes them: a second select sees other scores. */
static kvs_status once_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    once_state *st = state;
    if (st->selected++)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "once: select called twice on one observation");
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    int *budgets = malloc(sizeof(int) * (size_t)L);
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "once: out of memory");
    for (int l = 0; l < L; l++) budgets[l] = per_layer;
    kvs_status rc = kvs_plan_init(out, "once", L, H, N, budgets, err);
    free(budgets);
    if (rc) return rc;
    rc = kvs_topk_indices(st->score, N, per_layer, out->layers[0].idx, err);
    if (rc) return rc;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            memcpy(out->layers[l].idx + (size_t)h * per_layer, out->layers[0].idx, sizeof(int32_t) * per_layer);
    for (int i = 0; i < per_layer; i++) st->score[out->layers[0].idx[i]] = 0.0f;
    return KVS_OK;
}

static void once_destroy(void *state) {
    once_state *st = state;
    if (st) free(st->score);
    free(st);
}

static void test_select_once(void) {
    kvs_synth_config cfg;
    kvs_err e = {0};
    CHECK_OK(kvs_synth_preset("tiny", &cfg, &e), &e);
    cfg.n_tokens = 40;
    cfg.n_probes = 0;
    cfg.seed = 3;
    kvs_dense_cache dc;
    memset(&dc, 0, sizeof dc);
    CHECK_OK(kvs_synth_generate(&cfg, &dc, NULL, NULL, &e), &e);
    kvs_layer layers[8];
    kvs_cache_view cv;
    CHECK_OK(kvs_dense_cache_view(&dc, &cv, layers, &e), &e);
    kvs_method once = {.name = "once", .summary = "test", .needs = KVS_SELECT_ONCE, .create = once_create,
                       .observe = once_observe, .select = once_select, .destroy = once_destroy};
    kvs_params p = {0};
    kvs_budget b[3] = {{0.5, 0}, {0.25, 0}, {0, 5}};
    kvs_plan many[3], one;
    CHECK_OK(kvs_compress_many(&once, &p, &cv, b, 3, 1, many, NULL, &e), &e);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(kvs_compress(&once, &p, &cv, &b[i], 1, &one, &e), &e);
        CHECK_MSG(plan_same(&many[i], &one, "once"), "budget %d", i);
        kvs_plan_free(&one);
        kvs_plan_free(&many[i]);
    }
    /* without the flag the second select sees a consumed state: the flag is
     * what makes the call right, and the error names the budget */
    once.needs = 0;
    CHECK_FAILS(kvs_compress_many(&once, &p, &cv, b, 3, 1, many, NULL, &e), KVS_ERR_INTERNAL, &e,
                "budget 1 of 3");
    for (int i = 0; i < 3; i++) CHECK(plan_zero(&many[i]));
    /* a bad budget fails before any work and names its index */
    kvs_budget bad[3] = {{0.5, 0}, {0.25, 0}, {1.5, 0}};
    kvs_params hp;
    kvs_params_defaults(&kvs_method_streamingllm, &hp);
    CHECK_FAILS(kvs_compress_many(&kvs_method_streamingllm, &hp, &cv, bad, 3, 1, many, NULL, &e), KVS_ERR_INVALID, &e,
                "budget 2 of 3");
    for (int i = 0; i < 3; i++) CHECK(plan_zero(&many[i]));
    CHECK_FAILS(kvs_compress_many(&kvs_method_streamingllm, &hp, &cv, b, 0, 1, many, NULL, &e), KVS_ERR_INVALID, &e,
                "no budget");
    kvs_dense_cache_free(&dc);
}

int main(void) {
    test_select_once();
    /* all queries (every method runs), two shapes, one with image spans
     * (MEDA / LOOK-M cross-modal paths), 1 and 2 threads */
    on_synth("tiny", 0, 64, 64, 0.0, 1, 1);
    on_synth("tiny", 3, 97, 97, 0.3, 2, 2);
    on_synth("gemma3-270m", 3, 150, 150, 0.0, 5, 2);
    /* a query window only: the methods that need every query fail in both */
    on_synth("tiny", 0, 80, 16, 0.0, 4, 1);
    return kvs_test_finish("test_compress_many");
}
