/*
 * bench_flashcache_cpu.c -- times the FlashCache CPU reference (observe +
 * select, one thread) at the qwen2.5-vl-7b shape: 28 layers, Hkv 4, d 128,
 * N = 8192 by default (argv[1] overrides N), and the DCT pair alone. Prints
 * numbers; asserts only that the plan is valid (tests never assert on time).
 * To keep memory small every layer views the same synthetic [Hkv][N][d] K/V
 * (smooth low-frequency columns, Gaussian noise, a few outlier tokens), so
 * caches are warm: this measures compute, not DRAM traffic.
 */
#include "dct.h"
#include "m1_util.h"

#include <math.h>

int main(int argc, char **argv) {
    const int L = 28, H = 4, d = 128;
    const int N = argc > 1 ? atoi(argv[1]) : 8192;
    if (N < 1) return 2;
    size_t nd = (size_t)H * N * d;
    float *k = malloc(sizeof(float) * nd), *v = malloc(sizeof(float) * nd);
    uint64_t rng = 1;
    for (size_t i = 0; i < nd; i++) {
        size_t n = (i / d) % (size_t)N;
        k[i] = (float)(sin(0.001 * n * (1 + i % 7)) + 0.1 * kvs_rng_normal(&rng));
        v[i] = (float)(cos(0.002 * n * (1 + i % 5)) + 0.1 * kvs_rng_normal(&rng));
    }
    for (int j = 0; j < 32; j++) k[((size_t)(j % H) * N + (size_t)(j * 997) % N) * d] += 20.0f;
    kvs_layer *layers = calloc(L, sizeof *layers);
    for (int l = 0; l < L; l++) {
        layers[l].k = kvs_view_make(k, KVS_F32, H, N, d);
        layers[l].v = kvs_view_make(v, KVS_F32, H, N, d);
        layers[l].q = kvs_view_make(NULL, KVS_F32, 4 * H, 0, d);
    }
    kvs_cache_view cv = {L, layers, NULL};
    kvs_params p;
    kvs_params_defaults(&kvs_method_flashcache, &p);
    kvs_budget b = {0.2, 0};
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan plan;
    /* The dominant term: one DCT pair per column (2 * L * H transforms of [N][d]). */
    kvs_dct_plan *dp = NULL;
    CHECK_OK(kvs_dct_plan_create(N, d, &dp, e), e);
    float *x = malloc(sizeof(float) * (size_t)N * d), *X = malloc(sizeof(float) * (size_t)N * d);
    memcpy(x, k, sizeof(float) * (size_t)N * d);
    double t0 = kvs_now_ms();
    for (int i = 0; i < 2 * L * H && dp; i++) {
        kvs_dct2_ortho_cols(dp, x, X, e);
        kvs_dct3_ortho_cols(dp, X, x, e);
    }
    double t_dct = kvs_now_ms() - t0;
    free(x), free(X);
    kvs_dct_plan_destroy(dp);
    double best = INFINITY;
    for (int rep = 0; rep < 3; rep++) {
        t0 = kvs_now_ms();
        CHECK_OK(kvs_compress(&kvs_method_flashcache, &p, &cv, &b, 1, &plan, e), e);
        double t = kvs_now_ms() - t0;
        if (t < best) best = t;
        if (plan.layers) CHECK_EQ_INT(kvs_plan_total(&plan), (int64_t)L * (N / 5));
        kvs_plan_free(&plan);
    }
    printf("flashcache cpu: L=%d Hkv=%d d=%d N=%d fp32, 1 thread: compress %.1f ms (best of 3); "
           "DCT pairs alone %.1f ms (%d pairs of [%d][%d])\n",
           L, H, d, N, best, t_dct, 2 * L * H, N, d);
    t0 = kvs_now_ms();
    CHECK_OK(kvs_compress(&kvs_method_flashcache, &p, &cv, &b, 2, &plan, e), e);
    printf("flashcache cpu: same, 2 threads: compress %.1f ms (one run)\n", kvs_now_ms() - t0);
    kvs_plan_free(&plan);
    free(k), free(v), free(layers);
    return kvs_test_finish("bench_flashcache_cpu");
}
