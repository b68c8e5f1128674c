/*
 * test_attn_weighted.c -- kvs_attn_colsum_fused_w (the one-pass column sums
 * with weighted query rows, Finch's question weighting) against a
 * straightforward double recomputation (attn_ref.h's probabilities, each
 * row times its weight, summed over the rows and the G heads of a group,
 * divided by G): fp32 / fp16 / bf16, G = 1, 2, 4, 7, one and several row
 * blocks, N not a multiple of the vector width; lse unweighted (equal to
 * kvs_attn_colsum_fused's); all weights 1 and NULL give kvs_attn_colsum_fused
 * bit for bit; results bit-identical for 1 and 2 threads; a non-finite
 * weight is an error. kvs_attn_softmax_row (one row's softmax in place and
 * its prefix sum p log p) against the same in double, lengths around the
 * 8-lane and 256-key chunk edges. Not a benchmark.
 */
#include "attn_ref.h"
#include "kvsieve.h"
#include "test_util.h"

static void check_case(int Hq, int Hkv, int Nq, int N, int d, kvs_dtype t, uint64_t seed) {
    uint64_t rng = seed;
    const int G = Hq / Hkv;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, t, (size_t)Hq * Nq * d, 1.0, &qraw, &qv);
    ref_fill(&rng, t, (size_t)Hkv * N * d, 1.0, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, t, Hq, Nq, d);
    kvs_view k = kvs_view_make(kraw, t, Hkv, N, d);
    float *wt = malloc(sizeof(float) * (size_t)Nq); /* [Nq] weights, Finch-like and not */
    for (int i = 0; i < Nq; i++) wt[i] = (float)(N - Nq + i) * (0.5f + (float)kvs_rng_uniform(&rng));
    double *rl = malloc(sizeof(double) * (size_t)Hq * Nq);
    double *A = ref_probs(qv, kv, Hq, Hkv, Nq, N, d, rl); /* [Hq][Nq][N] */
    float *cs = malloc(sizeof(float) * (size_t)Hkv * N), *cs1 = malloc(sizeof(float) * (size_t)Hkv * N);
    float *lse = malloc(sizeof(float) * (size_t)Hq * Nq), *lse0 = malloc(sizeof(float) * (size_t)Hq * Nq);
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_colsum_fused_w(&q, &k, wt, lse, cs, NULL, 2, err), err);
    int bad = 0;
    for (int g = 0; g < Hkv; g++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0, mag = 0.0;
            for (int hl = 0; hl < G; hl++)
                for (int i = 0; i < Nq; i++) {
                    const double x = wt[i] * A[((size_t)(g * G + hl) * Nq + i) * N + j];
                    ref += x;
                    mag += fabs(x);
                }
            ref /= G;
            mag /= G;
            const double got = cs[(size_t)g * N + j];
            if (!(fabs(got - ref) <= 2e-5 * mag + 1e-30 * N) && bad++ < 5)
                CHECK_MSG(0, "Hq%d Hkv%d Nq%d N%d d%d %s: colsum[%d][%d] = %.9g, reference %.9g", Hq,
                          Hkv, Nq, N, d, kvs_dtype_name(t), g, j, got, ref);
        }
    for (int x = 0; x < Hq * Nq; x++)
        if (!(fabs(lse[x] - rl[x]) <= 2e-5 * (1.0 + fabs(rl[x]))) && bad++ < 10)
            CHECK_MSG(0, "Hq%d Nq%d N%d: lse[%d] = %.9g, reference %.9g", Hq, Nq, N, x, lse[x], rl[x]);
    CHECK(bad == 0);
    /* 1 thread: the same bits */
    CHECK_OK(kvs_attn_colsum_fused_w(&q, &k, wt, NULL, cs1, NULL, 1, err), err);
    CHECK(memcmp(cs, cs1, sizeof(float) * (size_t)Hkv * N) == 0);
    /* weights all 1 and NULL: kvs_attn_colsum_fused itself */
    for (int i = 0; i < Nq; i++) wt[i] = 1.0f;
    CHECK_OK(kvs_attn_colsum_fused_w(&q, &k, wt, lse, cs, NULL, 2, err), err);
    CHECK_OK(kvs_attn_colsum_fused(&q, &k, lse0, cs1, NULL, 2, err), err);
    CHECK(memcmp(cs, cs1, sizeof(float) * (size_t)Hkv * N) == 0);
    CHECK(memcmp(lse, lse0, sizeof(float) * (size_t)Hq * Nq) == 0);
    CHECK_OK(kvs_attn_colsum_fused_w(&q, &k, NULL, lse, cs, NULL, 2, err), err);
    CHECK(memcmp(cs, cs1, sizeof(float) * (size_t)Hkv * N) == 0);
    /* a NaN weight is refused, naming the row */
    wt[Nq - 1] = NAN;
    CHECK_FAILS(kvs_attn_colsum_fused_w(&q, &k, wt, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err,
                "row weight");
    free(wt);
    free(rl);
    free(A);
    free(cs);
    free(cs1);
    free(lse);
    free(lse0);
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
}

static void check_softmax_row(int n, int m, double scale, uint64_t seed) {
    uint64_t rng = seed;
    float *s = malloc(sizeof(float) * (size_t)n + 4);
    double *x = malloc(sizeof(double) * (size_t)n + 8);
    for (int j = 0; j < n; j++) x[j] = s[j] = (float)(scale * kvs_rng_normal(&rng));
    double mx = -INFINITY, z = 0.0, plp = 0.0;
    for (int j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < n; j++) z += exp(x[j] - mx);
    const double lse = mx + log(z);
    for (int j = 0; j < m; j++) plp += exp(x[j] - lse) * (x[j] - lse);
    double got_plp = 0.0;
    const float got = kvs_attn_softmax_row(s, n, m, &got_plp);
    CHECK_MSG(fabs(got - lse) <= 2e-6 * (1.0 + fabs(lse)), "n%d: lse %.9g, reference %.9g", n,
              (double)got, lse);
    double mag = 0.0; /* sum |p log p| over the prefix: the scale of the sum's rounding */
    for (int j = 0; j < m; j++) mag += fabs(exp(x[j] - lse) * (x[j] - lse));
    CHECK_MSG(fabs(got_plp - plp) <= 1e-5 * mag + 1e-12, "n%d m%d: sum p log p %.12g, reference %.12g",
              n, m, got_plp, plp);
    int bad = 0;
    for (int j = 0; j < n; j++) {
        const double p = exp(x[j] - lse);
        /* fp32 exp: relative error grows with |s - max| (its argument's rounding) */
        if (!(fabs(s[j] - p) <= 1e-7 * (20.0 + fabs(x[j] - mx)) * p + 1e-30) && bad++ < 3)
            CHECK_MSG(0, "n%d: p[%d] = %.9g, reference %.9g", n, j, (double)s[j], p);
    }
    free(s);
    free(x);
}

int main(void) {
    const int ns[][2] = {{1, 1}, {1, 0}, {7, 3}, {8, 8}, {9, 8}, {255, 250}, {256, 255},
                         {257, 200}, {600, 571}, {1031, 1000}, {2048, 2016}};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        check_softmax_row(ns[i][0], ns[i][1], 1.0, 70 + i);
        check_softmax_row(ns[i][0], ns[i][1], 6.0, 90 + i); /* sharp rows */
    }
    double plp = 1.0;
    CHECK(kvs_attn_softmax_row(NULL, 0, 0, &plp) == -INFINITY && plp == 0.0);
    check_case(1, 1, 1, 1, 4, KVS_F32, 1);       /* N = 1 */
    check_case(4, 1, 32, 300, 32, KVS_F16, 2);   /* Finch's window, G = 4 */
    check_case(2, 1, 37, 37, 16, KVS_F32, 3);    /* G = 2, Nq = N */
    check_case(14, 2, 20, 211, 16, KVS_BF16, 4); /* G = 7, N % 8 != 0 */
    check_case(2, 2, 300, 520, 8, KVS_F32, 5);   /* G = 1: 256-row blocks, several slabs */
    check_case(4, 1, 90, 130, 24, KVS_F16, 6);   /* G = 4: 64-row blocks */
    return kvs_test_finish("core_attn_weighted");
}
