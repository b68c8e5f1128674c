/*
 * test_attn_stats.c -- kvs_attn_lse and kvs_attn_colsum (with row entropies)
 * against a naive double-precision reference over random shapes (Nq < N,
 * GQA G = 1, 2, 4, fp32 / fp16 / bf16 views, a strided fp32 view, N not a
 * multiple of the tile), bit-identical results for 1, 2 and 3 threads, the
 * GQA group mean, a hand-checked uniform case, and the error paths.
 */
#include "attn_ref.h"
#include "kvsieve.h"
#include "test_util.h"

typedef struct {
    int Hq, Hkv, Nq, N, d;
    kvs_dtype t;
    int stride_pad; /* extra elements per token row in K (strided view) */
    double scale;
} shape;

static void check_shape(const shape *sh, uint64_t seed) {
    uint64_t rng = seed;
    const int Hq = sh->Hq, Hkv = sh->Hkv, Nq = sh->Nq, N = sh->N, d = sh->d, G = Hq / Hkv;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, sh->t, (size_t)Hq * Nq * d, sh->scale, &qraw, &qv);
    ref_fill(&rng, sh->t, (size_t)Hkv * N * d, sh->scale, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, sh->t, Hq, Nq, d);
    kvs_view k = kvs_view_make(kraw, sh->t, Hkv, N, d);
    float *kpad = NULL;
    if (sh->stride_pad > 0) { /* same values, rows of d + pad floats */
        const int st = d + sh->stride_pad;
        kpad = malloc(sizeof(float) * (size_t)Hkv * N * st);
        for (size_t x = 0; x < (size_t)Hkv * N * st; x++) kpad[x] = 1e30f; /* poison padding */
        for (int g = 0; g < Hkv; g++)
            for (int j = 0; j < N; j++)
                memcpy(kpad + ((size_t)g * N + j) * st, kv + ((size_t)g * N + j) * d,
                       sizeof(float) * d);
        k.data = kpad;
        k.dtype = KVS_F32;
        k.s_tok = st;
        k.s_head = (int64_t)N * st;
    }
    double *rl = malloc(sizeof(double) * (size_t)Hq * Nq + 8);
    double *A = ref_probs(qv, kv, Hq, Hkv, Nq, N, d, rl);
    float *lse = malloc(sizeof(float) * (size_t)Hq * Nq + 8);
    float *cs = malloc(sizeof(float) * (size_t)Hkv * N);
    float *re = malloc(sizeof(float) * (size_t)Hq * Nq + 8);
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 2, err), err);
    CHECK_OK(kvs_attn_colsum(&q, &k, lse, cs, re, 2, err), err);
    int bad = 0;
    for (int x = 0; x < Hq * Nq && bad < 5; x++) {
        const double tol = 2e-5 * (1.0 + fabs(rl[x]));
        if (!(fabs(lse[x] - rl[x]) <= tol)) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: lse[%d] = %.9g, reference %.9g", Hq, Hkv,
                      Nq, N, d, x, lse[x], rl[x]);
            bad++;
        }
    }
    for (int g = 0; g < Hkv; g++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0;
            for (int hl = 0; hl < G; hl++)
                for (int i = 0; i < Nq; i++) ref += A[((size_t)(g * G + hl) * Nq + i) * N + j];
            ref /= G;
            const double got = cs[(size_t)g * N + j];
            if (!(fabs(got - ref) <= 1e-4 * (1.0 + ref)) && bad < 10) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: colsum[%d][%d] = %.9g, reference %.9g",
                          Hq, Hkv, Nq, N, d, g, j, got, ref);
                bad++;
            }
        }
    for (int h = 0; h < Hq; h++)
        for (int i = 0; i < Nq; i++) {
            double H = 0.0;
            const double *a = A + ((size_t)h * Nq + i) * N;
            for (int j = 0; j < N; j++)
                if (a[j] > 0.0) H -= a[j] * log(a[j]);
            const double got = re[(size_t)h * Nq + i];
            if (!(fabs(got - H) <= 1e-4 * (1.0 + fabs(rl[(size_t)h * Nq + i]))) && bad < 15) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: row entropy[%d][%d] = %.9g, ref %.9g",
                          Hq, Hkv, Nq, N, d, h, i, got, H);
                bad++;
            }
        }
    kvs_test_checks++;
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
    free(kpad);
    free(rl);
    free(A);
    free(lse);
    free(cs);
    free(re);
}

/* q == 0: every row is uniform over its causal keys. lse_i = log(p_i + 1),
 * colsum_j = sum_{i: p_i >= j} 1 / (p_i + 1), entropy_i = log(p_i + 1). */
static void test_uniform_hand(void) {
    enum { Hq = 2, Hkv = 1, Nq = 3, N = 4, d = 4 };
    float qd[Hq * Nq * d] = {0};
    float kd[Hkv * N * d];
    for (int x = 0; x < Hkv * N * d; x++) kd[x] = (float)(x % 7) - 3.0f;
    kvs_view q = kvs_view_make(qd, KVS_F32, Hq, Nq, d), k = kvs_view_make(kd, KVS_F32, Hkv, N, d);
    float lse[Hq * Nq], cs[Hkv * N], re[Hq * Nq];
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 1, err), err);
    CHECK_OK(kvs_attn_colsum(&q, &k, lse, cs, re, 1, err), err);
    /* rows sit at positions 1, 2, 3: they see 2, 3, 4 keys */
    for (int h = 0; h < Hq; h++) {
        CHECK_NEAR(lse[h * Nq + 0], log(2.0), 1e-6);
        CHECK_NEAR(lse[h * Nq + 1], log(3.0), 1e-6);
        CHECK_NEAR(lse[h * Nq + 2], log(4.0), 1e-6);
        CHECK_NEAR(re[h * Nq + 0], log(2.0), 1e-6);
        CHECK_NEAR(re[h * Nq + 2], log(4.0), 1e-6);
    }
    /* key 0 and 1: 1/2 + 1/3 + 1/4; key 2: 1/3 + 1/4; key 3: 1/4 */
    CHECK_NEAR(cs[0], 1.0 / 2 + 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[1], 1.0 / 2 + 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[2], 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[3], 1.0 / 4, 1e-6);
}

/* Same inputs, threads 1, 2, 3: bit-identical lse, colsum, row entropy and
 * entropies. Shapes give several row blocks and all 8 colsum slabs. */
static void test_threads_deterministic(void) {
    uint64_t rng = 77;
    const int Hq = 4, Hkv = 2, Nq = 700, N = 900, d = 32;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, KVS_F16, (size_t)Hq * Nq * d, 1.5, &qraw, &qv);
    ref_fill(&rng, KVS_F16, (size_t)Hkv * N * d, 1.5, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, KVS_F16, Hq, Nq, d), k = kvs_view_make(kraw, KVS_F16, Hkv, N, d);
    uint8_t *mod = malloc(N);
    for (int j = 0; j < N; j++) mod[j] = (j / 50) % 3 == 1 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    float *lse[3], *cs[3], *re[3];
    kvs_entropy_stats es[3];
    kvs_err errs = {0}, *err = &errs;
    for (int t = 0; t < 3; t++) {
        lse[t] = malloc(sizeof(float) * Hq * Nq);
        cs[t] = malloc(sizeof(float) * Hkv * N);
        re[t] = malloc(sizeof(float) * Hq * Nq);
        CHECK_OK(kvs_attn_lse(&q, &k, lse[t], t + 1, err), err);
        CHECK_OK(kvs_attn_colsum(&q, &k, lse[t], cs[t], re[t], t + 1, err), err);
        CHECK_OK(kvs_attn_entropies(&q, &k, lse[t], mod, &es[t], t + 1, err), err);
    }
    for (int t = 1; t < 3; t++) {
        CHECK_MSG(memcmp(lse[0], lse[t], sizeof(float) * Hq * Nq) == 0, "lse differs at %d threads", t + 1);
        CHECK_MSG(memcmp(cs[0], cs[t], sizeof(float) * Hkv * N) == 0, "colsum differs at %d threads", t + 1);
        CHECK_MSG(memcmp(re[0], re[t], sizeof(float) * Hq * Nq) == 0, "row entropy differs at %d threads", t + 1);
        CHECK_MSG(memcmp(&es[0], &es[t], sizeof es[0]) == 0, "entropies differ at %d threads", t + 1);
    }
    /* threads <= 0 means one thread */
    float *l0 = malloc(sizeof(float) * Hq * Nq);
    CHECK_OK(kvs_attn_lse(&q, &k, l0, 0, err), err);
    CHECK(memcmp(l0, lse[0], sizeof(float) * Hq * Nq) == 0);
    free(l0);
    for (int t = 0; t < 3; t++) {
        free(lse[t]);
        free(cs[t]);
        free(re[t]);
    }
    free(mod);
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
}

/* colsum of a G = 2 group == mean of the colsums of its two heads alone. */
static void test_gqa_group_mean(void) {
    uint64_t rng = 5;
    const int Nq = 150, N = 333, d = 16;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, KVS_F32, (size_t)2 * Nq * d, 1.0, &qraw, &qv);
    ref_fill(&rng, KVS_F32, (size_t)N * d, 1.0, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, KVS_F32, 2, Nq, d), k = kvs_view_make(kraw, KVS_F32, 1, N, d);
    float lse[2 * 150], cs[333], c0[333], c1[333], l1[150];
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 1, err), err);
    CHECK_OK(kvs_attn_colsum(&q, &k, lse, cs, NULL, 1, err), err);
    for (int h = 0; h < 2; h++) {
        kvs_view qh = kvs_view_make((float *)qraw + (size_t)h * Nq * d, KVS_F32, 1, Nq, d);
        CHECK_OK(kvs_attn_lse(&qh, &k, l1, 1, err), err);
        CHECK_OK(kvs_attn_colsum(&qh, &k, l1, h ? c1 : c0, NULL, 1, err), err);
    }
    double total = 0.0;
    for (int j = 0; j < N; j++) {
        CHECK_NEAR(cs[j], 0.5 * ((double)c0[j] + c1[j]), 1e-5);
        total += cs[j];
    }
    /* each row's probabilities sum to 1, so the group mean sums to Nq */
    CHECK_NEAR(total, (double)Nq, 1e-4);
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
}

static void test_errors(void) {
    float qd[2 * 3 * 4] = {0}, kd[2 * 5 * 4] = {0}, lse[6], cs[10];
    kvs_err errs = {0}, *err = &errs;
    kvs_view q = kvs_view_make(qd, KVS_F32, 2, 3, 4), k = kvs_view_make(kd, KVS_F32, 2, 5, 4);
    kvs_view qn = q;
    qn.data = NULL;
    CHECK_FAILS(kvs_attn_lse(&qn, &k, lse, 1, err), KVS_ERR_INVALID, err, "no queries");
    kvs_view q3 = kvs_view_make(qd, KVS_F32, 3, 2, 4);
    CHECK_FAILS(kvs_attn_lse(&q3, &k, lse, 1, err), KVS_ERR_INVALID, err, "not a multiple");
    kvs_view qd5 = kvs_view_make(qd, KVS_F32, 2, 2, 5);
    CHECK_FAILS(kvs_attn_lse(&qd5, &k, lse, 1, err), KVS_ERR_INVALID, err, "head_dim");
    kvs_view qlong = kvs_view_make(qd, KVS_F32, 1, 6, 4);
    kvs_view k1 = kvs_view_make(kd, KVS_F32, 1, 5, 4);
    CHECK_FAILS(kvs_attn_lse(&qlong, &k1, lse, 1, err), KVS_ERR_INVALID, err, "exceed");
    kvs_view kc = k;
    kc.device = KVS_CUDA;
    CHECK_FAILS(kvs_attn_lse(&q, &kc, lse, 1, err), KVS_ERR_UNSUPPORTED, err, "device memory");
    kvs_view ki = k;
    ki.dtype = KVS_I32;
    CHECK_FAILS(kvs_attn_colsum(&q, &ki, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err, "I32");
    CHECK_FAILS(kvs_attn_colsum(&q, &k, NULL, cs, NULL, 1, err), KVS_ERR_INVALID, err, "lse");
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 1, err), err);
    lse[4] = NAN;
    CHECK_FAILS(kvs_attn_colsum(&q, &k, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err,
                "query head 1 row 1");
    kd[7] = INFINITY;
    CHECK_FAILS(kvs_attn_lse(&q, &k, lse, 1, err), KVS_ERR_NUMERIC, err, "not finite");
}

int main(void) {
    const shape fixed[] = {
        {1, 1, 1, 1, 4, KVS_F32, 0, 1.0},      /* N = 1 */
        {2, 1, 37, 37, 16, KVS_F32, 0, 1.0},   /* G = 2, Nq = N */
        {4, 1, 70, 300, 32, KVS_F16, 0, 1.2},  /* G = 4, Nq < N, fp16 */
        {4, 4, 130, 130, 8, KVS_F32, 0, 2.0},  /* G = 1, sharp attention */
        {4, 2, 200, 520, 64, KVS_BF16, 0, 1.0},/* bf16, three key tiles */
        {8, 2, 65, 600, 24, KVS_F32, 5, 1.0},  /* strided fp32 K */
        {2, 2, 1, 257, 8, KVS_F16, 0, 1.0},    /* one query, N = TK + 1 */
        {2, 2, 530, 800, 16, KVS_F16, 0, 1.0}, /* G = 1: 256-row blocks, last partial */
        {4, 2, 300, 300, 8, KVS_F32, 0, 1.0},  /* G = 2: 128-row blocks */
    };
    for (size_t s = 0; s < sizeof fixed / sizeof fixed[0]; s++) check_shape(&fixed[s], 100 + s);
    uint64_t rng = 2024;
    for (int r = 0; r < 6; r++) {
        shape sh;
        const int gs[3] = {1, 2, 4};
        sh.Hkv = 1 + (int)(kvs_rng_uniform(&rng) * 2);
        sh.Hq = sh.Hkv * gs[(int)(kvs_rng_uniform(&rng) * 3)];
        sh.N = 1 + (int)(kvs_rng_uniform(&rng) * 600);
        sh.Nq = 1 + (int)(kvs_rng_uniform(&rng) * sh.N);
        sh.d = 1 + (int)(kvs_rng_uniform(&rng) * 40);
        sh.t = (kvs_dtype)(int)(kvs_rng_uniform(&rng) * 3);
        sh.stride_pad = 0;
        sh.scale = 0.5 + 2.0 * kvs_rng_uniform(&rng);
        check_shape(&sh, 500 + r);
    }
    test_uniform_hand();
    test_threads_deterministic();
    test_gqa_group_mean();
    test_errors();
    return kvs_test_finish("core_attn_stats");
}
