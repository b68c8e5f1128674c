/*
 * test_ragged.c -- ragged plans (per-head counts) and the adakv head
 * allocator: plan checks on ragged plans (counts, sums, sorted, unique),
 * kvs_apply on a ragged plan against a one-head dense reference per head
 * (gather and merge, 1 and 3 threads), AdaKV's split by hand and against a
 * brute-force reference, adakv vs snapkv at ratio 0.25 (same total, same
 * bytes; alpha = 1 gives snapkv's plan), and the JSON round trip of a
 * ragged plan (and refusals of bad "counts").
 */
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>

static kvs_err e_, *e = &e_;

/* A 2-layer, 3-head, N = 10 ragged plan: layer 0 counts {1, 4, 4} (budget
 * 3), layer 1 dense-equal counts {2, 2, 2} (stored dense). */
static void make_plan(kvs_plan *p) {
    const int counts[6] = {1, 4, 4, 2, 2, 2};
    CHECK_OK(kvs_plan_init_ragged(p, "toy", 2, 3, 10, counts, e), e);
    CHECK(p->layers[0].counts != NULL);
    CHECK(p->layers[1].counts == NULL);
    CHECK_EQ_INT(p->layers[0].budget, 3);
    CHECK_EQ_INT(p->layers[1].budget, 2);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++) {
            int B;
            int32_t *row = kvs_plan_head(p, l, h, &B);
            for (int i = 0; i < B; i++) row[i] = (int32_t)(2 * i + h % 2);
        }
}

static void test_plan_check(void) {
    kvs_plan p;
    make_plan(&p);
    CHECK_OK(kvs_plan_check(&p, e), e);
    CHECK(kvs_plan_is_ragged(&p));
    CHECK_EQ_INT(kvs_plan_total(&p), 5);
    CHECK_EQ_INT(kvs_plan_kv_bytes(&p, 4, 2), (int64_t)(9 + 6) * 4 * 2 * 2);
    int B;
    /* heads are packed: head 2 of layer 0 starts after 1 + 4 rows */
    CHECK(kvs_plan_head(&p, 0, 2, &B) == p.layers[0].idx + 5);
    CHECK_EQ_INT(B, 4);
    /* retention: token 0 is kept by heads 0, 2 of each layer */
    int32_t t0[] = {0};
    CHECK_NEAR(kvs_plan_retention(&p, t0, 1), 4.0 / 6.0, 1e-12);

    int32_t *row = kvs_plan_head(&p, 0, 1, &B);
    int32_t keep = row[2];
    row[2] = row[1];
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 0 head 1");
    row[2] = keep;
    row[3] = 10;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "out of range");
    row[3] = 7;
    CHECK_OK(kvs_plan_check(&p, e), e);
    p.layers[0].counts[0] = 2; /* sum 10 != 3 x 3 */
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "sum to 10");
    p.layers[0].counts[0] = 0;
    p.layers[0].counts[1] = 5;
    CHECK_FAILS(kvs_plan_check(&p, e), KVS_ERR_INVALID, e, "layer 0 head 0: count 0");
    kvs_plan_free(&p);

    const int bad_sum[3] = {1, 1, 2}; /* 4 is not a multiple of 3 */
    CHECK_FAILS(kvs_plan_init_ragged(&p, "toy", 1, 3, 10, bad_sum, e), KVS_ERR_INVALID, e,
                "not a multiple");
    const int bad_count[3] = {11, 1, 0};
    CHECK_FAILS(kvs_plan_init_ragged(&p, "toy", 1, 3, 10, bad_count, e), KVS_ERR_INVALID, e,
                "head 0: count 11");
}

/* Head h of a ragged dense layer == kvs_apply of a one-head dense plan on a
 * one-head view of the same cache (the dense path, merges included). */
static void test_apply(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 3, 3, 10, 0, 5);
    m1_cache_fill_random(&c, 17);
    for (int merge = 0; merge <= KVS_MERGE_WEIGHTED; merge++)
        for (int threads = 1; threads <= 3; threads += 2) {
            kvs_plan p;
            make_plan(&p);
            p.merge = (kvs_merge)merge;
            kvs_dense_cache out = {0};
            CHECK_OK(kvs_apply_into(&c.view, &p, threads, &out, e), e);
            CHECK(out.layers[0].counts != NULL && out.layers[1].counts == NULL);
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 3; h++) {
                    int B, Bo;
                    int32_t *row = kvs_plan_head(&p, l, h, &B);
                    const int64_t off = kvs_dense_head(&out.layers[l], h, &Bo);
                    CHECK_EQ_INT(Bo, B);
                    kvs_layer one = c.layers[l];
                    one.k = kvs_view_make(m1_k(&c, l, h, 0), KVS_F32, 1, c.N, c.d);
                    one.v = kvs_view_make(m1_v(&c, l, h, 0), KVS_F32, 1, c.N, c.d);
                    kvs_cache_view cv = {1, &one, NULL};
                    kvs_plan_layer pl = {B, row, NULL};
                    kvs_plan ref = p;
                    ref.n_layers = 1;
                    ref.n_kv_heads = 1;
                    ref.layers = &pl;
                    kvs_dense_cache r = {0};
                    CHECK_OK(kvs_apply(&cv, &ref, &r, e), e);
                    const size_t n = (size_t)B * c.d;
                    CHECK_MSG(memcmp(r.layers[0].k, out.layers[l].k + off * c.d, n * 4) == 0 &&
                                  memcmp(r.layers[0].v, out.layers[l].v + off * c.d, n * 4) == 0,
                              "merge %d threads %d layer %d head %d differs from the one-head reference",
                              merge, threads, l, h);
                    kvs_dense_cache_free(&r);
                }
            /* fidelity reads each head's own rows: keeping everything is exact */
            kvs_dense_cache_free(&out);
            kvs_plan_free(&p);
        }
    /* a ragged layer with every token in heads 1, 2 and fewer in head 0:
     * fidelity of head 0's probes differs from 0, heads 1, 2 contribute 0 */
    const int counts[3] = {4, 13, 13};
    m1_cache w;
    m1_cache_init(&w, 1, 3, 3, 13, 0, 4);
    m1_cache_fill_random(&w, 3);
    kvs_plan p;
    CHECK_OK(kvs_plan_init_ragged(&p, "toy", 1, 3, 13, counts, e), e);
    for (int h = 0; h < 3; h++) {
        int B;
        int32_t *row = kvs_plan_head(&p, 0, h, &B);
        for (int i = 0; i < B; i++) row[i] = h == 0 ? 3 * i : i;
    }
    kvs_dense_cache out = {0};
    CHECK_OK(kvs_apply(&w.view, &p, &out, e), e);
    float probes[3 * 2 * 4];
    uint64_t rng = 5;
    for (int i = 0; i < 24; i++) probes[i] = (float)kvs_rng_normal(&rng);
    kvs_view pv = kvs_view_make(probes, KVS_F32, 3, 2, 4);
    double mean, mx;
    CHECK_OK(kvs_fidelity_layer(&pv, &w.layers[0], &out.layers[0], &mean, &mx, e), e);
    CHECK(mean > 0.0 && mx > 0.0);
    /* heads 1 and 2 are exact, so the mean is head 0's share: max >= 3 x mean */
    CHECK(mx >= 3.0 * mean - 1e-12);
    kvs_dense_cache_free(&out);
    kvs_plan_free(&p);
    m1_cache_free(&w);
    m1_cache_free(&c);
}

/* Brute force: floor = each head's own top f; then the best remaining by
 * (score desc, head asc, token asc). */
static void split_ref(const float *sc, int H, int N, int lo, int hi, int k, double alpha, int *counts) {
    int f = (int)floor(alpha * k);
    if (f < 1) f = 1;
    if (f > k) f = k;
    const int n = hi - lo;
    uint8_t *taken = calloc((size_t)H * n, 1);
    for (int h = 0; h < H; h++) {
        counts[h] = 0;
        for (int r = 0; r < f; r++) {
            int best = -1;
            for (int j = 0; j < n; j++)
                if (!taken[h * n + j] && (best < 0 || sc[h * N + lo + j] > sc[h * N + lo + best])) best = j;
            taken[h * n + best] = 1;
            counts[h]++;
        }
    }
    for (int r = 0; r < H * (k - f); r++) {
        int bh = -1, bj = -1;
        for (int h = 0; h < H; h++)
            for (int j = 0; j < n; j++)
                if (!taken[h * n + j] && (bh < 0 || sc[h * N + lo + j] > sc[bh * N + lo + bj])) bh = h, bj = j;
        taken[bh * n + bj] = 1;
        counts[bh]++;
    }
    free(taken);
}

static void test_split(void) {
    const float sc[12] = {9, 8, 7, 6, 5, 4, 1, 1, 1, 1, 1, 2};
    int c[2];
    CHECK_OK(kvs_adakv_split(sc, 2, 6, 0, 6, 3, 0.34, c, e), e);
    CHECK(c[0] == 5 && c[1] == 1); /* floor 1 each, head 0 wins the 4 others */
    CHECK_OK(kvs_adakv_split(sc, 2, 6, 0, 6, 3, 1.0, c, e), e);
    CHECK(c[0] == 3 && c[1] == 3); /* alpha 1: equal counts */
    CHECK_OK(kvs_adakv_split(sc, 2, 6, 0, 6, 5, 0.0, c, e), e);
    CHECK(c[0] == 6 && c[1] == 4); /* head 0 capped at its 6 candidates */
    CHECK_OK(kvs_adakv_split(sc, 2, 6, 1, 5, 2, 0.0, c, e), e);
    CHECK(c[0] == 3 && c[1] == 1);
    CHECK_FAILS(kvs_adakv_split(sc, 2, 6, 0, 6, 7, 0.2, c, e), KVS_ERR_INVALID, e, "k=7");
    uint64_t rng = 11;
    for (int it = 0; it < 300; it++) {
        const int H = 1 + (int)(kvs_rng_uniform(&rng) * 5), N = 2 + (int)(kvs_rng_uniform(&rng) * 30);
        const int lo = (int)(kvs_rng_uniform(&rng) * (N / 2)), hi = N - (int)(kvs_rng_uniform(&rng) * (N - lo - 1));
        const int k = 1 + (int)(kvs_rng_uniform(&rng) * (hi - lo));
        const double alpha = kvs_rng_uniform(&rng);
        float s[5 * 32];
        for (int i = 0; i < H * N; i++) s[i] = (float)(int)(kvs_rng_uniform(&rng) * 8); /* ties */
        int got[5], want[5], sum = 0;
        CHECK_OK(kvs_adakv_split(s, H, N, lo, hi, k, alpha, got, e), e);
        split_ref(s, H, N, lo, hi, k, alpha, want);
        for (int h = 0; h < H; h++) {
            sum += got[h];
            CHECK_MSG(got[h] == want[h] && got[h] >= 1 && got[h] <= hi - lo,
                      "it %d H=%d N=%d [%d,%d) k=%d alpha=%g head %d: %d, reference %d", it, H, N, lo, hi,
                      k, alpha, h, got[h], want[h]);
        }
        CHECK_EQ_INT(sum, H * k);
    }
}

static void test_vs_snapkv_and_json(void) {
    m1_cache c;
    m1_cache_init(&c, 3, 4, 8, 200, 32, 8);
    m1_cache_fill_random(&c, 23);
    /* heads of different sharpness: scale the queries of half the groups */
    for (int l = 0; l < c.L; l++)
        for (int h = 0; h < c.Hq; h += 4)
            for (int i = 0; i < c.Nq; i++)
                for (int x = 0; x < c.d; x++) m1_q(&c, l, h, i)[x] *= 4.0f;
    kvs_budget b = {0.25, 0};
    kvs_params pa, ps, p1;
    kvs_params_defaults(&kvs_preset_adakv, &pa);
    kvs_params_defaults(&kvs_method_snapkv, &ps);
    kvs_plan a, s, one;
    CHECK_OK(kvs_compress(&kvs_preset_adakv, &pa, &c.view, &b, 2, &a, e), e);
    CHECK_OK(kvs_compress(&kvs_method_snapkv, &ps, &c.view, &b, 2, &s, e), e);
    CHECK_EQ_INT(kvs_plan_total(&a), kvs_plan_total(&s));
    CHECK_EQ_INT(kvs_plan_kv_bytes(&a, c.d, 2), kvs_plan_kv_bytes(&s, c.d, 2));
    CHECK_MSG(kvs_plan_is_ragged(&a), "adakv kept equal counts on heads of different sharpness");
    for (int l = 0; l < c.L; l++)
        for (int h = 0; h < c.Hkv; h++)
            for (int t = c.N - 32; t < c.N; t++) CHECK(m1_kept(&a, l, h, t)); /* the window */
    /* alpha = 1: every head keeps its own top-k, i.e. SnapKV's plan */
    kvs_params_defaults(&kvs_preset_adakv, &p1);
    m1_set(&kvs_preset_adakv, &p1, "alpha", "1");
    CHECK_OK(kvs_compress(&kvs_preset_adakv, &p1, &c.view, &b, 1, &one, e), e);
    CHECK(!kvs_plan_is_ragged(&one));
    for (int l = 0; l < c.L; l++)
        CHECK(memcmp(one.layers[l].idx, s.layers[l].idx, sizeof(int32_t) * 4 * (size_t)s.layers[l].budget) == 0);

    /* JSON round trip of the ragged plan */
    char *js = kvs_plan_to_json(&a, &kvs_preset_adakv, &pa);
    CHECK(js != NULL && strstr(js, "\"counts\":[") != NULL);
    kvs_plan back;
    CHECK_OK(kvs_plan_from_json(js, &back, e), e);
    CHECK(m1_plans_equal(&a, &back));
    kvs_plan_free(&back);
    /* a count that breaks the sum is refused naming the field */
    char *bad = strstr(js, "\"counts\":[");
    bad += strlen("\"counts\":[");
    *bad = *bad == '9' ? '8' : '9';
    CHECK_FAILS(kvs_plan_from_json(js, &back, e), KVS_ERR_FORMAT, e, "counts");
    free(js);
    kvs_plan_free(&a);
    kvs_plan_free(&s);
    kvs_plan_free(&one);
    m1_cache_free(&c);
}

int main(void) {
    test_plan_check();
    test_apply();
    test_split();
    test_vs_snapkv_and_json();
    return kvs_test_finish("test_ragged");
}
