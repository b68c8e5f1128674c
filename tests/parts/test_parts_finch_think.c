/*
 * test_parts_finch_think.c -- the finch scorer, the segment pick rule and the
 * think channel rule by hand-computed values; the finch and think presets'
 * plans; key channel masks through kvs_plan_check, kvs_apply (pruned
 * channels zeroed), kvs_plan_kv_bytes (packed bytes) and the plan's JSON.
 */
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "m1_util.h"

#include <float.h>
#include <math.h>

/* finch, L = 1, Hkv = 1, Hq = 2 (G = 2), N = 4, d = 1, window w = 2:
 * question rows at positions 2 and 3, context tokens 0 and 1.
 *   head 0: q = 0 in both rows: uniform rows, 1/3 (3 keys) and 1/4 (4 keys).
 *   head 1: q = 1, keys k = 0, ln 2, ln 2, 0: row at 2 sees e^k = 1, 2, 2
 *     (z 5): 0.2, 0.4; row at 3 sees 1, 2, 2, 1 (z 6): 1/6, 1/3.
 *   normalize_scores (factors 2, 3):
 *     token 0: (2/3 + 3/4 + 2 * 0.2 + 3/6) / 4 = (17/12 + 0.9) / 4 = 0.5791667
 *     token 1: (17/12 + 2 * 0.4 + 3/3) / 4    = (17/12 + 1.8) / 4 = 0.8041667
 *   without (factors 1):
 *     token 0: (1/3 + 1/4 + 0.2 + 1/6) / 4 = 0.2375
 *     token 1: (7/12 + 0.4 + 1/3) / 4     = 0.3291667
 *   tokens 2, 3 (the question): FLT_MAX. */
static void finch_scores(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 2, 4, 4, 1);
    const float kk[4] = {0.0f, logf(2.0f), logf(2.0f), 0.0f};
    for (int n = 0; n < 4; n++) m1_k(&c, 0, 0, n)[0] = kk[n];
    for (int i = 0; i < 4; i++) m1_q(&c, 0, 1, i)[0] = 1.0f; /* head 0 stays 0 */
    for (int norm = 1; norm >= 0; norm--) {
        kvs_params p;
        kvs_params_defaults(&kvs_preset_finch, &p);
        m1_set(&kvs_preset_finch, &p, "window", "2");
        m1_set(&kvs_preset_finch, &p, "normalize_scores", norm ? "true" : "false");
        kvs_part_ctx ctx = {.m = &kvs_preset_finch, .p = &p, .shape = m1_shape(&c, 1)};
        void *st = NULL;
        kvs_err e = {0};
        float sc[4];
        CHECK_OK(kvs_scorer_finch.create(&ctx, &st, &e), &e);
        CHECK_EQ_INT(kvs_scorer_finch.queries_wanted(&kvs_preset_finch, &p, 4), 2);
        CHECK_OK(kvs_scorer_finch.score(st, 0, &c.layers[0], sc, &e), &e);
        CHECK_NEAR(sc[0], norm ? 0.5791667 : 0.2375, 1e-6);
        CHECK_NEAR(sc[1], norm ? 0.8041667 : 0.3291667, 1e-6);
        CHECK(sc[2] == FLT_MAX && sc[3] == FLT_MAX);
        /* fewer recorded queries than the question: an error naming both */
        kvs_layer one = c.layers[0];
        one.q.n_tokens = 1;
        CHECK_FAILS(kvs_scorer_finch.score(st, 0, &one, sc, &e), KVS_ERR_INVALID, &e, "window=2");
        kvs_scorer_finch.destroy(st);
    }
    m1_cache_free(&c);
}

/* segment pick on 10 candidates [2, 12) with chunk_length 4: segments
 * [2,6) [6,10) [10,12) of 4, 4, 2 tokens.
 *   k = 5: 20/10, 20/10, 10/10 -> 2, 2, 1 (exact, no remainder).
 *   k = 3: 12/10 = 1 r 2, 1 r 2, 6/10 = 0 r 6 -> one left: segment 2 -> 1, 1, 1.
 *   k = 7: 28/10 = 2 r 8, 2 r 8, 14/10 = 1 r 4 -> two left: segments 0, 1 -> 3, 3, 1.
 * scores (index: value) 2:1 3:5 4:3 5:4 | 6:9 7:2 8:8 9:7 | 10:6 11:0, so
 *   k = 5 -> {3,5} {6,8} {10}; k = 3 -> {3} {6} {10}; k = 7 -> {3,4,5} {6,8,9} {10}.
 * chunk_length 0: one segment = topk: k = 3 -> {6, 8, 9}. */
static void segment_pick(void) {
    const float sc[12] = {99, 99, 1, 5, 3, 4, 9, 2, 8, 7, 6, 0};
    kvs_params p;
    kvs_params_defaults(&kvs_preset_finch, &p);
    kvs_pick_pair pairs[12];
    int32_t ibuf[12], out[12];
    uint8_t mask[12];
    kvs_pick_ws ws = {pairs, ibuf, mask, NULL};
    kvs_err e = {0};
    kvs_part_ctx ctx = {.m = &kvs_preset_finch, .p = &p};
    static const int32_t w5[] = {3, 5, 6, 8, 10}, w3[] = {3, 6, 10}, w7[] = {3, 4, 5, 6, 8, 9, 10},
                         w0[] = {6, 8, 9};
    m1_set(&kvs_preset_finch, &p, "chunk_length", "4");
    CHECK_OK(kvs_pick_segment.pick(&ctx, sc, 2, 12, 5, &ws, out, &e), &e);
    CHECK(memcmp(out, w5, sizeof w5) == 0);
    CHECK_OK(kvs_pick_segment.pick(&ctx, sc, 2, 12, 3, &ws, out, &e), &e);
    CHECK(memcmp(out, w3, sizeof w3) == 0);
    CHECK_OK(kvs_pick_segment.pick(&ctx, sc, 2, 12, 7, &ws, out, &e), &e);
    CHECK(memcmp(out, w7, sizeof w7) == 0);
    m1_set(&kvs_preset_finch, &p, "chunk_length", "0");
    CHECK_OK(kvs_pick_segment.pick(&ctx, sc, 2, 12, 3, &ws, out, &e), &e);
    CHECK(memcmp(out, w0, sizeof w0) == 0);
}

/* think, Hkv = 1, Hq = 2, d = 4, N = 2, window 1 (the last query row):
 *   q head 0 = (1, 2, 0, 1), head 1 = (1, 0, 0, 3): group mean of q^2 =
 *     (1, 2, 0, 5); keys (1,1,5,0) (1,1,5,2): mean k^2 = (1, 1, 25, 2);
 *   scores (1, 2, 0, 10): ratio 0.5 prunes 2 -> channels 2 and 0: mask 0101;
 *   ratio 0.25 prunes 1 -> channel 2: mask 1101; ratio 0 prunes none.
 *   Ties: all-equal scores, ratio 0.5: the higher channels go first: 1100. */
static void think_channels(void) {
    m1_cache c;
    m1_cache_init(&c, 1, 1, 2, 2, 1, 4);
    const float q0[4] = {1, 2, 0, 1}, q1[4] = {1, 0, 0, 3}, k0[4] = {1, 1, 5, 0}, k1[4] = {1, 1, 5, 2};
    memcpy(m1_q(&c, 0, 0, 0), q0, sizeof q0);
    memcpy(m1_q(&c, 0, 1, 0), q1, sizeof q1);
    memcpy(m1_k(&c, 0, 0, 0), k0, sizeof k0);
    memcpy(m1_k(&c, 0, 0, 1), k1, sizeof k1);
    uint8_t m[4];
    kvs_err e = {0};
    static const uint8_t m50[4] = {0, 1, 0, 1}, m25[4] = {1, 1, 0, 1}, all[4] = {1, 1, 1, 1},
                         tie[4] = {1, 1, 0, 0};
    CHECK_OK(kvs_think_channels(&c.layers[0], 1, 0.5, m, &e), &e);
    CHECK(memcmp(m, m50, 4) == 0);
    CHECK_OK(kvs_think_channels(&c.layers[0], 1, 0.25, m, &e), &e);
    CHECK(memcmp(m, m25, 4) == 0);
    CHECK_OK(kvs_think_channels(&c.layers[0], 1, 0.0, m, &e), &e);
    CHECK(memcmp(m, all, 4) == 0);
    CHECK_FAILS(kvs_think_channels(&c.layers[0], 2, 0.5, m, &e), KVS_ERR_INVALID, &e, "window=2");
    CHECK_FAILS(kvs_think_channels(&c.layers[0], 1, 1.0, m, &e), KVS_ERR_INVALID, &e, "key_channel_ratio");
    for (int i = 0; i < 4; i++) m1_q(&c, 0, 0, 0)[i] = m1_q(&c, 0, 1, 0)[i] = 1.0f;
    for (int i = 0; i < 4; i++) m1_k(&c, 0, 0, 0)[i] = m1_k(&c, 0, 0, 1)[i] = 2.0f;
    CHECK_OK(kvs_think_channels(&c.layers[0], 1, 0.5, m, &e), &e);
    CHECK(memcmp(m, tie, 4) == 0);
    m1_cache_free(&c);
}

/* The presets on a random cache: think keeps snapkv_parts' tokens exactly
 * (same window, kernel, pooling) and carries each layer's think masks;
 * apply zeroes the pruned channels and nothing else; the bytes count a
 * packed store; the JSON round trip keeps the masks; a mask with no kept
 * channel is refused. finch's question is always kept. */
static void presets(void) {
    m1_cache c;
    const int L = 2, H = 2, Hq = 4, N = 50, d = 8;
    m1_cache_init(&c, L, H, Hq, N, N, d);
    m1_cache_fill_random(&c, 11);
    kvs_err e = {0};
    kvs_params pt, ps, pf;
    kvs_params_defaults(&kvs_preset_think, &pt);
    kvs_params_defaults(&kvs_preset_snapkv_parts, &ps);
    kvs_params_defaults(&kvs_preset_finch, &pf);
    kvs_budget b = {0, 20};
    kvs_plan a, s, f;
    CHECK_OK(kvs_compress(&kvs_preset_think, &pt, &c.view, &b, 1, &a, &e), &e);
    CHECK_OK(kvs_compress(&kvs_preset_snapkv_parts, &ps, &c.view, &b, 1, &s, &e), &e);
    CHECK(a.kchan != NULL && a.kchan_dim == d && s.kchan == NULL);
    CHECK(m1_plans_equal(&a, &s));
    CHECK(strstr(a.note, "not freed") != NULL);
    uint8_t m[H * d];
    for (int l = 0; l < L; l++) {
        CHECK_OK(kvs_think_channels(&c.layers[l], 32, 0.5, m, &e), &e);
        CHECK(memcmp(m, a.kchan + (size_t)l * H * d, sizeof m) == 0);
        for (int h = 0; h < H; h++) CHECK_EQ_INT(kvs_plan_kchan_kept(&a, l, h, d), d / 2);
    }
    /* bytes: K 4 of 8 channels, V all 8: 20 rows x 2 heads x 2 layers x 12 x 4 */
    CHECK_EQ_INT(kvs_plan_kv_bytes(&a, d, 4), (int64_t)20 * H * L * (4 + 8) * 4);
    CHECK_EQ_INT(kvs_plan_kv_bytes(&s, d, 4), (int64_t)20 * H * L * (8 + 8) * 4);
    kvs_dense_cache ca, cs;
    CHECK_OK(kvs_apply(&c.view, &a, &ca, &e), &e);
    CHECK_OK(kvs_apply(&c.view, &s, &cs, &e), &e);
    int zero_ok = 1, same_ok = 1;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < 20; i++)
                for (int ch = 0; ch < d; ch++) {
                    const size_t o = (((size_t)h * 20) + i) * d + ch;
                    const int kept = a.kchan[((size_t)l * H + h) * d + ch];
                    if (kept && ca.layers[l].k[o] != cs.layers[l].k[o]) same_ok = 0;
                    if (!kept && ca.layers[l].k[o] != 0.0f) zero_ok = 0;
                    if (ca.layers[l].v[o] != cs.layers[l].v[o]) same_ok = 0;
                }
    CHECK_MSG(zero_ok, "pruned key channels are not zero after apply");
    CHECK_MSG(same_ok, "kept channels or values differ from the token-only plan");
    kvs_dense_cache_free(&ca);
    kvs_dense_cache_free(&cs);
    /* JSON round trip */
    char *js = kvs_plan_to_json(&a, &kvs_preset_think, &pt);
    CHECK(js != NULL && strstr(js, "\"key_channels\"") != NULL);
    kvs_plan r;
    CHECK_OK(kvs_plan_from_json(js, &r, &e), &e);
    CHECK(r.kchan && r.kchan_dim == d && memcmp(r.kchan, a.kchan, (size_t)L * H * d) == 0);
    CHECK(m1_plans_equal(&r, &a));
    kvs_plan_free(&r);
    free(js);
    /* a head with every channel pruned is refused */
    memset(a.kchan + d, 0, (size_t)d);
    CHECK_FAILS(kvs_plan_check(&a, &e), KVS_ERR_INVALID, &e, "every key channel is pruned");
    kvs_plan_free(&a);
    kvs_plan_free(&s);
    /* finch keeps its 32-token question in every head */
    CHECK_OK(kvs_compress(&kvs_preset_finch, &pf, &c.view, &(kvs_budget){0, 40}, 1, &f, &e), &e);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int t = N - 32; t < N; t++) CHECK(m1_kept(&f, l, h, t));
    CHECK(f.kchan == NULL);
    kvs_plan_free(&f);
    m1_cache_free(&c);
}

/* A description naming the channel rule gives the think preset's plan and
 * masks; with a token-only description, no masks; a wrong name is refused
 * naming the field. */
static void composed(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 2, 4, 40, 40, 8);
    m1_cache_fill_random(&c, 5);
    kvs_err e = {0};
    kvs_composed *cm = NULL;
    CHECK_OK(kvs_composed_from_json("{\"score\":\"snapkv\",\"keep\":{\"window\":32},"
                                    "\"channels\":\"think\",\"params\":{\"key_channel_ratio\":0.5}}",
                                    &cm, &e),
             &e);
    if (!cm) return;
    const kvs_method *m = kvs_composed_method(cm);
    CHECK(strstr(m->name, "\"channels\":\"think\"") != NULL);
    CHECK(m->needs & KVS_NEED_Q_WINDOW);
    kvs_params p, pt;
    kvs_params_defaults(m, &p);
    kvs_params_defaults(&kvs_preset_think, &pt);
    kvs_budget b = {0.3, 0};
    kvs_plan x, y;
    CHECK_OK(kvs_compress(m, &p, &c.view, &b, 1, &x, &e), &e);
    CHECK_OK(kvs_compress(&kvs_preset_think, &pt, &c.view, &b, 1, &y, &e), &e);
    CHECK(m1_plans_equal(&x, &y));
    CHECK(x.kchan && y.kchan && memcmp(x.kchan, y.kchan, (size_t)2 * 2 * 8) == 0);
    kvs_plan_free(&x);
    kvs_plan_free(&y);
    kvs_composed_free(cm);
    cm = NULL;
    CHECK_FAILS(kvs_composed_from_json("{\"score\":\"tova\",\"channels\":\"thnk\"}", &cm, &e),
                KVS_ERR_NOTFOUND, &e, "channels");
    m1_cache_free(&c);
}

int main(void) {
    composed();
    finch_scores();
    segment_pick();
    think_channels();
    presets();
    printf("test_parts_finch_think: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
