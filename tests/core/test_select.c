/*
 * test_select.c -- kvs_topk_indices (hand cases with ties, signed zeros and
 * infinities, NaN error, random properties against a naive full sort,
 * adversarial orders), kvs_sort_i32, and 1-D max / avg pooling (hand cases
 * for odd and even k, padding ignored, real-count averages, random vs naive).
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

static kvs_err e_, *e = &e_;

static void check_topk(const float *s, int n, int k, const int32_t *want) {
    int32_t out[64];
    kvs_err_clear(e);
    CHECK_OK(kvs_topk_indices(s, n, k, out, e), e);
    for (int i = 0; i < k; i++) CHECK_MSG(out[i] == want[i], "k=%d slot %d: got %d want %d", k, i, out[i], want[i]);
}

static void test_topk_hand(void) {
    float s[] = {1, 3, 3, 2, 3};
    { int32_t w[] = {1, 2}; check_topk(s, 5, 2, w); }
    { int32_t w[] = {1}; check_topk(s, 5, 1, w); }
    { int32_t w[] = {1, 2, 4}; check_topk(s, 5, 3, w); }
    { int32_t w[] = {1, 2, 3, 4}; check_topk(s, 5, 4, w); }
    { int32_t w[] = {0, 1, 2, 3, 4}; check_topk(s, 5, 5, w); }
    check_topk(s, 5, 0, NULL);
    float z[] = {-0.0f, 0.0f, -0.0f};
    { int32_t w[] = {0}; check_topk(z, 3, 1, w); } /* -0 == +0: tie -> lower index */
    float inf[] = {-INFINITY, 5, INFINITY, -INFINITY, -1e30f};
    { int32_t w[] = {1, 2}; check_topk(inf, 5, 2, w); }
    { int32_t w[] = {1, 2, 4}; check_topk(inf, 5, 3, w); }
    { int32_t w[] = {0, 1, 2, 4}; check_topk(inf, 5, 4, w); }
    float neg[] = {-3, -1, -2, -1e-40f, -1e-38f}; /* subnormals order correctly */
    { int32_t w[] = {3, 4}; check_topk(neg, 5, 2, w); }
    int32_t out[8];
    float bad[] = {1, 2, NAN, 3};
    CHECK_FAILS(kvs_topk_indices(bad, 4, 2, out, e), KVS_ERR_NUMERIC, e, "score of token 2 is NaN");
    CHECK_FAILS(kvs_topk_indices(bad, 4, 4, out, e), KVS_ERR_NUMERIC, e, "token 2");
    CHECK_FAILS(kvs_topk_indices(s, 5, 6, out, e), KVS_ERR_INVALID, e, "k = 6 of n = 5");
    CHECK_FAILS(kvs_topk_indices(s, 5, -1, out, e), KVS_ERR_INVALID, e, "k = -1");
    CHECK_OK(kvs_topk_indices(NULL, 0, 0, NULL, e), e);
}

/* Reference: full sort of (score desc, index asc), first k, then sort ascending. */
static const float *g_s;
static int cmp_ref(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_s[i] > g_s[j]) return -1;
    if (g_s[i] < g_s[j]) return 1;
    return (i > j) - (i < j);
}
static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int topk_matches(const float *s, int n, int k, int32_t *ref, int32_t *out) {
    for (int i = 0; i < n; i++) ref[i] = i;
    g_s = s;
    qsort(ref, (size_t)n, sizeof *ref, cmp_ref);
    qsort(ref, (size_t)k, sizeof *ref, cmp_i32);
    kvs_err_clear(e);
    if (kvs_topk_indices(s, n, k, out, e) != KVS_OK) return 0;
    return memcmp(ref, out, (size_t)k * sizeof *out) == 0;
}

static void test_topk_random(void) {
    enum { NMAX = 5000 };
    static float s[NMAX];
    static int32_t ref[NMAX], out[NMAX];
    uint64_t r = 99;
    int fails = 0;
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + (int)(kvs_rng_next(&r) % NMAX);
        int k = (int)(kvs_rng_next(&r) % (uint64_t)(n + 1));
        int kind = trial % 6;
        for (int i = 0; i < n; i++) {
            double u = kvs_rng_normal(&r);
            switch (kind) {
            case 0: s[i] = (float)u; break;
            case 1: s[i] = (float)floor(u * 2); break;          /* heavy ties */
            case 2: s[i] = 1.0f; break;                          /* all equal */
            case 3: s[i] = (float)i; break;                      /* ascending */
            case 4: s[i] = (float)(n - i); break;                /* descending */
            default: s[i] = (float)((i % 2) ? i : n - i); break; /* zig-zag */
            }
        }
        if (!topk_matches(s, n, k, ref, out)) {
            if (fails < 3) fprintf(stderr, "topk mismatch: trial %d n=%d k=%d kind=%d\n", trial, n, k, kind);
            fails++;
        }
    }
    CHECK_EQ_INT(fails, 0);
    /* one large case */
    enum { NB = 200000 };
    float *big = malloc(NB * sizeof *big);
    int32_t *rb = malloc(NB * sizeof *rb), *ob = malloc(NB * sizeof *ob);
    for (int i = 0; i < NB; i++) big[i] = (float)floor(kvs_rng_normal(&r) * 100);
    CHECK(topk_matches(big, NB, NB / 5, rb, ob));
    free(big);
    free(rb);
    free(ob);
}

static void test_sort(void) {
    enum { NMAX = 3000 };
    static int32_t a[NMAX], b[NMAX];
    uint64_t r = 5;
    int fails = 0;
    for (int trial = 0; trial < 200; trial++) {
        int n = (int)(kvs_rng_next(&r) % NMAX);
        for (int i = 0; i < n; i++) a[i] = i * 3 - 1000;
        int kind = trial % 3;
        if (kind == 0) /* random permutation */
            for (int i = n - 1; i > 0; i--) {
                int j = (int)(kvs_rng_next(&r) % (uint64_t)(i + 1));
                int32_t t = a[i];
                a[i] = a[j];
                a[j] = t;
            }
        else if (kind == 1) /* reversed */
            for (int i = 0; i < n / 2; i++) {
                int32_t t = a[i];
                a[i] = a[n - 1 - i];
                a[n - 1 - i] = t;
            }
        memcpy(b, a, (size_t)n * sizeof *a);
        qsort(b, (size_t)n, sizeof *b, cmp_i32);
        kvs_sort_i32(a, n);
        if (n && memcmp(a, b, (size_t)n * sizeof *a) != 0) fails++;
    }
    CHECK_EQ_INT(fails, 0);
    int32_t one[1] = {7};
    kvs_sort_i32(one, 1);
    CHECK(one[0] == 7);
    kvs_sort_i32(NULL, 0);
}

static void naive_pool(const float *x, int n, int k, float *mx, float *av) {
    for (int i = 0; i < n; i++) {
        int lo = i - k / 2, hi = i - k / 2 + k - 1;
        if (lo < 0) lo = 0;
        if (hi > n - 1) hi = n - 1;
        float m = -INFINITY;
        double s = 0;
        for (int j = lo; j <= hi; j++) {
            if (x[j] > m) m = x[j];
            s += x[j];
        }
        mx[i] = m;
        av[i] = (float)(s / (hi - lo + 1));
    }
}

static void test_pool(void) {
    float x[] = {1, 5, 2, 0, 3}, o[8];
    kvs_pool1d_max(x, 5, 3, o);
    { float w[] = {5, 5, 5, 3, 3}; for (int i = 0; i < 5; i++) CHECK(o[i] == w[i]); }
    kvs_pool1d_avg(x, 5, 3, o);
    { float w[] = {3, 8.f / 3, 7.f / 3, 5.f / 3, 1.5f}; for (int i = 0; i < 5; i++) CHECK_NEAR(o[i], w[i], 1e-6); }
    /* even k = 4: window [i-2, i+1] */
    kvs_pool1d_max(x, 5, 4, o);
    { float w[] = {5, 5, 5, 5, 3}; for (int i = 0; i < 5; i++) CHECK(o[i] == w[i]); }
    kvs_pool1d_avg(x, 5, 4, o);
    { float w[] = {3, 8.f / 3, 2, 2.5f, 5.f / 3}; for (int i = 0; i < 5; i++) CHECK_NEAR(o[i], w[i], 1e-6); }
    /* max ignores padding: all negative input never becomes 0 */
    float ng[] = {-1, -5, -2};
    kvs_pool1d_max(ng, 3, 3, o);
    { float w[] = {-1, -1, -2}; for (int i = 0; i < 3; i++) CHECK(o[i] == w[i]); }
    kvs_pool1d_avg(ng, 3, 3, o);
    { float w[] = {-3, -8.f / 3, -3.5f}; for (int i = 0; i < 3; i++) CHECK_NEAR(o[i], w[i], 1e-6); }
    /* k = 1 is the identity; k > n covers everything */
    kvs_pool1d_max(x, 5, 1, o);
    for (int i = 0; i < 5; i++) CHECK(o[i] == x[i]);
    kvs_pool1d_avg(x, 5, 1, o);
    for (int i = 0; i < 5; i++) CHECK(o[i] == x[i]);
    kvs_pool1d_max(ng, 3, 9, o);
    for (int i = 0; i < 3; i++) CHECK(o[i] == -1);
    kvs_pool1d_avg(ng, 3, 9, o);
    for (int i = 0; i < 3; i++) CHECK_NEAR(o[i], -8.0 / 3, 1e-6);
    /* an Inf that leaves the window does not poison later averages */
    float xi[] = {1, INFINITY, 2, 3, 4};
    kvs_pool1d_avg(xi, 5, 3, o);
    CHECK(o[0] == INFINITY && o[1] == INFINITY && o[2] == INFINITY);
    CHECK_NEAR(o[3], 3, 1e-6);
    CHECK_NEAR(o[4], 3.5, 1e-6);
    kvs_pool1d_max(xi, 5, 3, o);
    CHECK(o[0] == INFINITY && o[2] == INFINITY && o[3] == 4);

    /* random vs naive, odd and even k, including k > DQ capacity */
    enum { NMAX = 3000 };
    static float a[NMAX], m1[NMAX], a1[NMAX], m2[NMAX], a2[NMAX];
    uint64_t r = 11;
    int fm = 0, fa = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(kvs_rng_next(&r) % NMAX);
        int k = 1 + (int)(kvs_rng_next(&r) % 40);
        if (trial % 50 == 0) k = 1000 + (int)(kvs_rng_next(&r) % 2000);
        for (int i = 0; i < n; i++) a[i] = (float)kvs_rng_normal(&r) * (trial % 2 ? 1.0f : 1e3f);
        if (trial % 3 == 0)
            for (int i = 0; i < n; i++) a[i] = floorf(a[i]); /* ties */
        naive_pool(a, n, k, m1, a1);
        kvs_pool1d_max(a, n, k, m2);
        kvs_pool1d_avg(a, n, k, a2);
        for (int i = 0; i < n; i++) {
            if (m1[i] != m2[i]) fm++;
            if (fabsf(a1[i] - a2[i]) > 1e-5f * (1.0f + fabsf(a1[i])) * (trial % 2 ? 1.0f : 1e3f)) fa++;
        }
    }
    CHECK_EQ_INT(fm, 0);
    CHECK_EQ_INT(fa, 0);
}

int main(void) {
    test_topk_hand();
    test_topk_random();
    test_sort();
    test_pool();
    return kvs_test_finish("core_select");
}
