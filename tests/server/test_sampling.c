/*
 * test_sampling.c -- the sampler and the stop rules on fixed logits.
 *
 * Covers: greedy (ties), parameter errors naming the field, NaN logits,
 * seed determinism, empirical frequencies against hand-computed
 * distributions (temperature, top-k, top-p), a property test on random
 * vocabularies against a brute-force nucleus, and stop strings / tokens.
 * Not covered here: the HTTP layer (test_server_http.c).
 */
#include "kvs_sampling.h"
#include "test_util.h"

#include <stdint.h>

static int cmp_desc_prob(const void *a, const void *b, const double *p) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (p[ia] > p[ib]) return -1;
    if (p[ia] < p[ib]) return 1;
    return ia < ib ? -1 : ia > ib;
}
static const double *g_sort_p; /* test-only qsort context */
static int cmp_qsort(const void *a, const void *b) { return cmp_desc_prob(a, b, g_sort_p); }

static void freqs(const float *logits, int V, kvs_sampling_params p, int draws, double *f) {
    kvs_sampler s;
    kvs_err err_ = {0}, *err = &err_;
    for (int i = 0; i < V; i++) f[i] = 0.0;
    if (kvs_sampler_init(&s, &p, V, err) != KVS_OK) {
        fprintf(stderr, "init failed: %s\n", err->msg);
        kvs_test_failures++;
        return;
    }
    for (int d = 0; d < draws; d++) {
        int32_t t = -1;
        if (kvs_sampler_sample(&s, logits, &t, err) != KVS_OK || t < 0 || t >= V) {
            kvs_test_failures++;
            break;
        }
        f[t] += 1.0 / draws;
    }
    kvs_sampler_free(&s);
}

static void test_greedy(void) {
    kvs_err err_ = {0}, *err = &err_;
    kvs_sampling_params p;
    kvs_sampling_defaults(&p);
    kvs_sampler s;
    float logits[6] = {0.1f, 3.0f, -2.0f, 3.0f, 2.9f, -INFINITY};
    CHECK_OK(kvs_sampler_init(&s, &p, 6, err), err);
    int32_t t = -1;
    CHECK_OK(kvs_sampler_sample(&s, logits, &t, err), err);
    CHECK_EQ_INT(t, 1); /* tie between 1 and 3: lower id */
    kvs_sampler_free(&s);

    /* top_k == 1 is greedy whatever the temperature */
    p.temperature = 5.0;
    p.top_k = 1;
    CHECK_OK(kvs_sampler_init(&s, &p, 6, err), err);
    for (int i = 0; i < 50; i++) {
        CHECK_OK(kvs_sampler_sample(&s, logits, &t, err), err);
        CHECK_EQ_INT(t, 1);
    }
    /* NaN is an error naming the token */
    logits[4] = NAN;
    CHECK_FAILS(kvs_sampler_sample(&s, logits, &t, err), KVS_ERR_NUMERIC, err, "token 4");
    kvs_sampler_free(&s);
}

static void test_param_errors(void) {
    kvs_err err_ = {0}, *err = &err_;
    kvs_sampling_params p;
    kvs_sampler s;
    kvs_sampling_defaults(&p);
    p.temperature = -1;
    CHECK_FAILS(kvs_sampler_init(&s, &p, 4, err), KVS_ERR_INVALID, err, "temperature");
    kvs_sampling_defaults(&p);
    p.top_p = 0.0;
    CHECK_FAILS(kvs_sampler_init(&s, &p, 4, err), KVS_ERR_INVALID, err, "top_p");
    p.top_p = 1.5;
    CHECK_FAILS(kvs_sampling_check(&p, err), KVS_ERR_INVALID, err, "top_p");
    kvs_sampling_defaults(&p);
    p.top_k = -2;
    CHECK_FAILS(kvs_sampling_check(&p, err), KVS_ERR_INVALID, err, "top_k");
    kvs_sampling_defaults(&p);
    CHECK_FAILS(kvs_sampler_init(&s, &p, 0, err), KVS_ERR_INVALID, err, "n_vocab");
}

static void test_seed(void) {
    kvs_err err_ = {0}, *err = &err_;
    enum { V = 50, T = 200 };
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % 11) * 0.3f;
    kvs_sampling_params p;
    kvs_sampling_defaults(&p);
    p.temperature = 1.0;
    p.seed = 42;
    int32_t a[T], b[T], c[T];
    kvs_sampler s;
    CHECK_OK(kvs_sampler_init(&s, &p, V, err), err);
    for (int i = 0; i < T; i++) CHECK_OK(kvs_sampler_sample(&s, logits, &a[i], err), err);
    kvs_sampler_free(&s);
    CHECK_OK(kvs_sampler_init(&s, &p, V, err), err);
    for (int i = 0; i < T; i++) CHECK_OK(kvs_sampler_sample(&s, logits, &b[i], err), err);
    kvs_sampler_free(&s);
    p.seed = 43;
    CHECK_OK(kvs_sampler_init(&s, &p, V, err), err);
    for (int i = 0; i < T; i++) CHECK_OK(kvs_sampler_sample(&s, logits, &c[i], err), err);
    kvs_sampler_free(&s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    int diff = 0;
    for (int i = 0; i < T; i++) diff += a[i] != c[i];
    CHECK_MSG(diff > T / 4, "seeds 42 and 43 differ at only %d of %d draws", diff, T);
}

static void test_distributions(void) {
    /* p = (0.5, 0.3, 0.2) */
    const float logits[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    const int D = 40000;
    const double tol = 0.012; /* > 4 sigma of a frequency at D draws */
    double f[3];
    kvs_sampling_params p;
    kvs_sampling_defaults(&p);
    p.seed = 7;

    p.temperature = 1.0;
    freqs(logits, 3, p, D, f);
    CHECK_NEAR(f[0], 0.5, tol);
    CHECK_NEAR(f[1], 0.3, tol);
    CHECK_NEAR(f[2], 0.2, tol);

    /* T = 2: p ~ sqrt(p) */
    p.temperature = 2.0;
    freqs(logits, 3, p, D, f);
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    CHECK_NEAR(f[0], sqrt(0.5) / z, tol);
    CHECK_NEAR(f[1], sqrt(0.3) / z, tol);
    CHECK_NEAR(f[2], sqrt(0.2) / z, tol);

    /* top_k = 2 at T = 1: renormalised over {0, 1} */
    p.temperature = 1.0;
    p.top_k = 2;
    freqs(logits, 3, p, D, f);
    CHECK_NEAR(f[0], 0.625, tol);
    CHECK_NEAR(f[1], 0.375, tol);
    CHECK_EQ_INT(f[2] == 0.0, 1);

    /* top_p = 0.6: the nucleus is {0, 1} (0.5 < 0.6 <= 0.8) */
    p.top_k = 0;
    p.top_p = 0.6;
    freqs(logits, 3, p, D, f);
    CHECK_NEAR(f[0], 0.625, tol);
    CHECK_NEAR(f[1], 0.375, tol);
    CHECK_EQ_INT(f[2] == 0.0, 1);

    /* top_p = 0.45: only token 0 */
    p.top_p = 0.45;
    freqs(logits, 3, p, D, f);
    CHECK(f[1] == 0.0 && f[2] == 0.0);

    /* top_k = 2 and top_p = 0.7 over {0.625, 0.375}: nucleus {0, 1} */
    p.top_k = 2;
    p.top_p = 0.7;
    freqs(logits, 3, p, D, f);
    CHECK_NEAR(f[0], 0.625, tol);
    /* ... and top_p = 0.6 over it: only token 0 */
    p.top_p = 0.6;
    freqs(logits, 3, p, D, f);
    CHECK(f[1] == 0.0 && f[2] == 0.0);
}

/* Random vocabularies: every drawn token lies in the brute-force top-k set
 * and nucleus, and the most likely token is drawn most often. */
static void test_property_random(void) {
    kvs_err err_ = {0}, *err = &err_;
    uint64_t rs = 12345;
    for (int trial = 0; trial < 12; trial++) {
        int V = 2 + (int)(kvs_rng_next(&rs) % 3000);
        float *logits = malloc((size_t)V * sizeof *logits);
        double *pr = malloc((size_t)V * sizeof *pr);
        int32_t *ord = malloc((size_t)V * sizeof *ord);
        unsigned char *allowed = calloc((size_t)V, 1);
        for (int i = 0; i < V; i++) logits[i] = (float)(3.0 * kvs_rng_normal(&rs));
        kvs_sampling_params p;
        kvs_sampling_defaults(&p);
        p.temperature = 0.5 + kvs_rng_uniform(&rs);
        p.top_k = trial % 3 == 0 ? 0 : 1 + (int)(kvs_rng_next(&rs) % (unsigned)V);
        p.top_p = trial % 2 ? 1.0 : 0.3 + 0.69 * kvs_rng_uniform(&rs);
        p.seed = (uint64_t)trial;
        /* brute force: softmax over all, sorted, top-k, renormalise, nucleus */
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < V; i++) mx = fmax(mx, logits[i] / p.temperature);
        for (int i = 0; i < V; i++) sum += pr[i] = exp(logits[i] / p.temperature - mx);
        for (int i = 0; i < V; i++) {
            pr[i] /= sum;
            ord[i] = i;
        }
        g_sort_p = pr;
        qsort(ord, (size_t)V, sizeof *ord, cmp_qsort);
        int k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
        double mk = 0.0;
        for (int j = 0; j < k; j++) mk += pr[ord[j]];
        double cum = 0.0;
        int n_allowed = 0;
        for (int j = 0; j < k; j++) {
            allowed[ord[j]] = 1;
            n_allowed++;
            cum += pr[ord[j]] / mk;
            if (p.top_p < 1.0 && cum >= p.top_p - 1e-9) break;
        }
        kvs_sampler s;
        CHECK_OK(kvs_sampler_init(&s, &p, V, err), err);
        int bad = 0;
        for (int d = 0; d < 300; d++) {
            int32_t t = -1;
            CHECK_OK(kvs_sampler_sample(&s, logits, &t, err), err);
            if (t < 0 || t >= V || !allowed[t]) bad++;
        }
        CHECK_MSG(bad == 0, "trial %d (V %d, T %.3f, k %d, p %.3f): %d draws outside the allowed set of %d",
                  trial, V, p.temperature, p.top_k, p.top_p, bad, n_allowed);
        kvs_sampler_free(&s);
        free(logits);
        free(pr);
        free(ord);
        free(allowed);
    }
}

static void test_stop(void) {
    kvs_err err_ = {0}, *err = &err_;
    kvs_stop s;
    kvs_stop_init(&s, 16);
    CHECK_EQ_INT(s.n_predict, 16);
    CHECK_OK(kvs_stop_add_token(&s, 1, err), err);
    CHECK_OK(kvs_stop_add_token(&s, 1, err), err);
    CHECK_OK(kvs_stop_add_token(&s, 106, err), err);
    CHECK_EQ_INT(s.n_tokens, 2);
    CHECK(kvs_stop_is_token(&s, 106));
    CHECK(!kvs_stop_is_token(&s, 2));
    CHECK_FAILS(kvs_stop_add_string(&s, "", err), KVS_ERR_INVALID, err, "stop");
    CHECK_OK(kvs_stop_add_string(&s, "\n\n", err), err);
    CHECK_OK(kvs_stop_add_string(&s, "END", err), err);

    size_t cut = 0;
    const char *t1 = "hello EN";
    CHECK_EQ_INT(kvs_stop_find_string(&s, t1, 0, strlen(t1), &cut), -1);
    /* "END" completes across the boundary of the new bytes */
    const char *t2 = "hello END and more";
    CHECK_EQ_INT(kvs_stop_find_string(&s, t2, strlen(t1), 9, &cut), 1);
    CHECK_EQ_INT(cut, 6);
    /* two matches in the new bytes: the earliest wins */
    const char *t3 = "abc END\n\n";
    CHECK_EQ_INT(kvs_stop_find_string(&s, t3, 3, strlen(t3), &cut), 1);
    CHECK_EQ_INT(cut, 4);
    const char *t4 = "abc\n\nEND";
    CHECK_EQ_INT(kvs_stop_find_string(&s, t4, 0, strlen(t4), &cut), 0);
    CHECK_EQ_INT(cut, 3);
    /* a match entirely in the old text is not reported again */
    CHECK_EQ_INT(kvs_stop_find_string(&s, t4, strlen(t4), strlen(t4), &cut), -1);

    for (int i = 0; i < KVS_STOP_MAX_STRINGS - 2; i++) CHECK_OK(kvs_stop_add_string(&s, "x", err), err);
    CHECK_FAILS(kvs_stop_add_string(&s, "y", err), KVS_ERR_INVALID, err, "stop");
    kvs_stop_free(&s);
}

int main(void) {
    test_greedy();
    test_param_errors();
    test_seed();
    test_distributions();
    test_property_random();
    test_stop();
    return kvs_test_finish("test_sampling");
}
