/*
 * test_parts_kvzip.c -- the kvzip scorer (reads kvs_layer.attn_recon_max,
 * sinks score 1, a view without it refused naming the scorer), the global
 * allocator by hand-computed budgets, and the kvzip preset's plan: exact
 * global budget, ragged per-head counts, and within every layer the kept
 * (head, token) pairs are that layer's best by the statistic (the global
 * ranking's rows, split over heads by one top-k: adakv with alpha 0).
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

static void scorer_reads_the_statistic(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 2, 4, 10, 0, 4);
    m1_cache_fill_random(&c, 3);
    kvs_params p;
    kvs_params_defaults(&kvs_preset_kvzip, &p);
    m1_set(&kvs_preset_kvzip, &p, "sinks", "3");
    kvs_part_ctx ctx = {.m = &kvs_preset_kvzip, .p = &p, .shape = m1_shape(&c, 1)};
    void *st = NULL;
    kvs_err e = {0};
    float sc[20];
    CHECK_OK(kvs_scorer_kvzip.create(&ctx, &st, &e), &e);
    /* without the statistic: refused, naming the scorer and the layer */
    CHECK_FAILS(kvs_scorer_kvzip.score(st, 1, &c.layers[1], sc, &e), KVS_ERR_INVALID, &e,
                "scorer kvzip: layer 1: the cache view has no context-reconstruction statistic");
    m1_cache_add_recon(&c, 7);
    CHECK_OK(kvs_scorer_kvzip.score(st, 1, &c.layers[1], sc, &e), &e);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 10; j++)
            CHECK(sc[h * 10 + j] == (j < 3 ? 1.0f : c.recon[20 + h * 10 + j])); /* layer 1's [Hkv][N] */
    kvs_scorer_kvzip.destroy(st);
    CHECK(kvs_scorer_kvzip.needs == KVS_NEED_RECON && (kvs_preset_kvzip.needs & KVS_NEED_RECON));
    /* kvs_compress refuses the view without it, naming the method and the input */
    kvs_plan pl;
    kvs_budget b = {0.5, 0};
    for (int l = 0; l < c.L; l++) c.layers[l].attn_recon_max = NULL;
    CHECK_FAILS(kvs_compress(&kvs_preset_kvzip, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID, &e,
                "method kvzip needs the context-reconstruction statistic");
    /* values that are not probabilities: refused, naming layer, head and token */
    m1_cache_add_recon(&c, 7);
    c.recon[1 * 20 + 10 + 4] = 1.5f;
    CHECK_FAILS(kvs_compress(&kvs_preset_kvzip, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_NUMERIC, &e,
                "layer 1: attn_recon_max head 1 token 4");
    m1_cache_free(&c);
}

/* global: L = 3, Hkv = 2, N = 10, B = 4: the top T = 24 of 60 scores.
 * Layer 0 scores 2 everywhere (20 pairs), layer 1 scores 1 on 4 pairs and 0
 * elsewhere, layer 2 all 0: counts 20, 4, 0 -> weights 20 : 4 : 0 of 12
 * rows = 10, 2, 0, then the floor B_min = min(max(1, ceil(0.1)), 4) = 1 per
 * layer, water-filled: 9, 2, 1. */
static void global_budgets(void) {
    float s[60] = {0};
    for (int i = 0; i < 20; i++) s[i] = 2.0f;
    s[20 + 1] = s[20 + 5] = s[20 + 12] = s[20 + 19] = 1.0f;
    kvs_params p;
    kvs_params_defaults(&kvs_preset_kvzip, &p);
    kvs_part_ctx ctx = {.m = &kvs_preset_kvzip, .p = &p, .shape = {3, 10, 2, 2, 4, 0, 1}, .scores = s};
    int bud[3];
    kvs_err e = {0};
    CHECK_OK(kvs_alloc_global.allocate(&ctx, 4, bud, &e), &e);
    CHECK_MSG(bud[0] == 9 && bud[1] == 2 && bud[2] == 1, "budgets %d %d %d", bud[0], bud[1], bud[2]);
    /* B = N keeps everything */
    CHECK_OK(kvs_alloc_global.allocate(&ctx, 10, bud, &e), &e);
    CHECK(bud[0] == 10 && bud[1] == 10 && bud[2] == 10);
    /* without the composition's scores: an internal error, not a silent uniform split */
    ctx.scores = NULL;
    CHECK_FAILS(kvs_alloc_global.allocate(&ctx, 4, bud, &e), KVS_ERR_INTERNAL, &e, "global");
}

static void preset_plans(void) {
    uint64_t rng = 5;
    for (int rep = 0; rep < 20; rep++) {
        const int L = 1 + (int)(kvs_rng_next(&rng) % 4), Hkv = 1 + (int)(kvs_rng_next(&rng) % 3);
        const int N = 20 + (int)(kvs_rng_next(&rng) % 150);
        m1_cache c;
        m1_cache_init(&c, L, Hkv, 2 * Hkv, N, 0, 8);
        m1_cache_fill_random(&c, 100 + (uint64_t)rep);
        m1_cache_add_recon(&c, 200 + (uint64_t)rep);
        kvs_params p;
        kvs_params_defaults(&kvs_preset_kvzip, &p);
        const kvs_budget b = {0.1 + 0.2 * (double)(rep % 4), 0};
        kvs_plan pl;
        kvs_err e = {0};
        CHECK_OK(kvs_compress(&kvs_preset_kvzip, &p, &c.view, &b, 1 + rep % 3, &pl, &e), &e);
        if (e.code) {
            m1_cache_free(&c);
            continue;
        }
        int per = 0;
        CHECK_OK(kvs_budget_per_layer(&b, N, &per, &e), &e);
        CHECK_EQ_INT((int)kvs_plan_total(&pl), L * per);
        for (int l = 0; l < L; l++) {
            const int B = pl.layers[l].budget;
            if (B >= N) continue;
            const int s = B < 4 ? B : 4; /* the sinks rule's share */
            /* kept flags of layer l, [Hkv][N] */
            uint8_t *kept = calloc((size_t)Hkv * N, 1);
            for (int h = 0; h < Hkv; h++) {
                int cnt = 0;
                const int32_t *row = kvs_plan_head(&pl, l, h, &cnt);
                for (int i = 0; i < s; i++) CHECK(row[i] == i);
                for (int i = 0; i < cnt; i++) kept[(size_t)h * N + row[i]] = 1;
            }
            /* the picked pairs are the layer's best: every kept candidate scores at least every evicted
             * one, except a head's single floor row (adakv keeps one per head even at alpha 0) */
            float min_kept = INFINITY, max_evicted = -INFINITY;
            const float *r = c.recon + (size_t)l * Hkv * N;
            for (int h = 0; h < Hkv; h++) {
                float best_h = -INFINITY; /* the head's floor row: its best candidate */
                for (int j = s; j < N; j++) best_h = fmaxf(best_h, r[(size_t)h * N + j]);
                for (int j = s; j < N; j++) {
                    const float x = r[(size_t)h * N + j];
                    if (kept[(size_t)h * N + j] && x != best_h) min_kept = fminf(min_kept, x);
                    if (!kept[(size_t)h * N + j]) max_evicted = fmaxf(max_evicted, x);
                }
            }
            CHECK_MSG(!(min_kept < max_evicted), "rep %d layer %d: kept %g < evicted %g", rep, l, min_kept,
                      max_evicted);
            free(kept);
        }
        kvs_plan_free(&pl);
        m1_cache_free(&c);
    }
}

int main(void) {
    scorer_reads_the_statistic();
    global_budgets();
    preset_plans();
    return kvs_test_finish("test_parts_kvzip");
}
