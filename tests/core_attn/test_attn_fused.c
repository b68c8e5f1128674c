/*
 * test_attn_fused.c -- kvs_attn_colsum_fused (one pass: lse, GQA column sums,
 * row entropies) and kvs_attn_stats_fused (the same plus the entropies of the
 * head-averaged attention, with mixed text / image / video / audio spans)
 * against the naive double-precision reference and against the two-pass
 * kvs_attn_lse + kvs_attn_colsum + kvs_attn_entropies on the same inputs: random
 * shapes (Nq < N, G = 1, 2, 3, 4, 8, several row blocks, N not a multiple of
 * the vector width), fp32 / fp16 / bf16 and a strided fp32 view; bit-identical
 * results for 1, 2, 3 threads and with lse = NULL; a hand-checked uniform
 * case and the error paths. Not a benchmark (bench_attn times the paths).
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

/* |a - b| <= rel * (|b| + floor) */
static int close_rel(double a, double b, double rel, double floor) {
    return fabs(a - b) <= rel * (fabs(b) + floor);
}

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
    double *rl = malloc(sizeof(double) * (size_t)Hq * Nq + 8);         /* [Hq][Nq] */
    double *A = ref_probs(qv, kv, Hq, Hkv, Nq, N, d, rl);              /* [Hq][Nq][N] test only */
    float *lse = malloc(sizeof(float) * (size_t)Hq * Nq + 8);          /* [Hq][Nq] fused */
    float *cs = malloc(sizeof(float) * (size_t)Hkv * N);               /* [Hkv][N] fused */
    float *re = malloc(sizeof(float) * (size_t)Hq * Nq + 8);           /* [Hq][Nq] fused */
    float *lse2 = malloc(sizeof(float) * (size_t)Hq * Nq + 8);         /* two-pass */
    float *cs2 = malloc(sizeof(float) * (size_t)Hkv * N);
    float *re2 = malloc(sizeof(float) * (size_t)Hq * Nq + 8);
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_colsum_fused(&q, &k, lse, cs, re, 2, err), err);
    CHECK_OK(kvs_attn_lse(&q, &k, lse2, 2, err), err);
    CHECK_OK(kvs_attn_colsum(&q, &k, lse2, cs2, re2, 2, err), err);
    int bad = 0;
    for (int x = 0; x < Hq * Nq; x++) {
        if (!(fabs(lse[x] - rl[x]) <= 2e-5 * (1.0 + fabs(rl[x]))) && bad < 5) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused lse[%d] = %.9g, reference %.9g", Hq,
                      Hkv, Nq, N, d, x, lse[x], rl[x]);
            bad++;
        }
        if (!close_rel(lse[x], lse2[x], 1e-6, 1.0) && bad < 10) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused lse[%d] = %.9g, two-pass %.9g", Hq,
                      Hkv, Nq, N, d, x, lse[x], lse2[x]);
            bad++;
        }
    }
    for (int g = 0; g < Hkv; g++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0;
            for (int hl = 0; hl < G; hl++)
                for (int i = 0; i < Nq; i++) ref += A[((size_t)(g * G + hl) * Nq + i) * N + j];
            ref /= G;
            const double got = cs[(size_t)g * N + j], two = cs2[(size_t)g * N + j];
            if (!(fabs(got - ref) <= 1e-4 * (1.0 + ref)) && bad < 15) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused colsum[%d][%d] = %.9g, ref %.9g",
                          Hq, Hkv, Nq, N, d, g, j, got, ref);
                bad++;
            }
            if (!close_rel(got, two, 1e-5, 1e-30) && bad < 20) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused colsum[%d][%d] = %.9g, two-pass "
                          "%.9g", Hq, Hkv, Nq, N, d, g, j, got, two);
                bad++;
            }
        }
    for (int h = 0; h < Hq; h++)
        for (int i = 0; i < Nq; i++) {
            double H = 0.0;
            const double *a = A + ((size_t)h * Nq + i) * N;
            for (int j = 0; j < N; j++)
                if (a[j] > 0.0) H -= a[j] * log(a[j]);
            const size_t x = (size_t)h * Nq + i;
            if (!(fabs(re[x] - H) <= 1e-4 * (1.0 + fabs(rl[x]))) && bad < 25) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused row entropy[%d][%d] = %.9g, "
                          "ref %.9g", Hq, Hkv, Nq, N, d, h, i, re[x], H);
                bad++;
            }
            /* H = lse - sum p s: absolute error scales with lse */
            if (!(fabs(re[x] - re2[x]) <= 1e-5 * (1.0 + fabs(lse2[x]))) && bad < 30) {
                CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: fused row entropy[%d][%d] = %.9g, "
                          "two-pass %.9g", Hq, Hkv, Nq, N, d, h, i, re[x], re2[x]);
                bad++;
            }
        }
    /* all-in-one pass: lse, colsum, row entropy and the entropies of Abar */
    uint8_t *mod = malloc((size_t)N); /* [N] text / image / video / audio spans */
    for (int j = 0; j < N; j++) {
        const int span = (j / 17 + (int)(seed % 5)) % 6;
        mod[j] = span == 1 || span == 2 ? KVS_MOD_IMAGE
                 : span == 4            ? KVS_MOD_VIDEO
                 : span == 5 && j % 3   ? KVS_MOD_AUDIO
                                        : KVS_MOD_TEXT;
    }
    float *lse3 = malloc(sizeof(float) * (size_t)Hq * Nq + 8);  /* [Hq][Nq] */
    float *cs4 = malloc(sizeof(float) * (size_t)Hkv * N);       /* [Hkv][N] */
    float *re3 = malloc(sizeof(float) * (size_t)Hq * Nq + 8);   /* [Hq][Nq] */
    kvs_entropy_stats es, es2, es3;
    CHECK_OK(kvs_attn_stats_fused(&q, &k, mod, lse3, cs4, re3, &es, 2, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse2, mod, &es2, 2, err), err);
    const kvs_entropy_stats ref = ref_entropy_stats(qv, kv, Hq, Hkv, Nq, N, d, mod);
    for (int x = 0; x < Hq * Nq; x++) {
        if (!close_rel(lse3[x], lse[x], 1e-6, 1.0) && bad < 35) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: stats lse[%d] = %.9g, colsum_fused %.9g",
                      Hq, Hkv, Nq, N, d, x, lse3[x], lse[x]);
            bad++;
        }
        if (!(fabs(re3[x] - re2[x]) <= 1e-5 * (1.0 + fabs(lse2[x]))) && bad < 40) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: stats row entropy[%d] = %.9g, two-pass "
                      "%.9g", Hq, Hkv, Nq, N, d, x, re3[x], re2[x]);
            bad++;
        }
    }
    for (int x = 0; x < Hkv * N; x++)
        if (!close_rel(cs4[x], cs2[x], 1e-5, 1e-30) && bad < 45) {
            CHECK_MSG(0, "shape Hq%d Hkv%d Nq%d N%d d%d: stats colsum[%d] = %.9g, two-pass %.9g",
                      Hq, Hkv, Nq, N, d, x, cs4[x], cs2[x]);
            bad++;
        }
    CHECK_EQ_INT(es.n_tv, ref.n_tv);
    CHECK_EQ_INT(es.n_vt, ref.n_vt);
    CHECK_EQ_INT(es.n_tv, es2.n_tv);
    CHECK_EQ_INT(es.n_vt, es2.n_vt);
    const double eg[3] = {es.plain, es.e_tv, es.e_vt}, er[3] = {ref.plain, ref.e_tv, ref.e_vt},
                 e2[3] = {es2.plain, es2.e_tv, es2.e_vt};
    for (int x = 0; x < 3; x++) {
        CHECK_MSG(fabs(eg[x] - er[x]) <= 2e-5 * (1.0 + er[x]),
                  "shape Hq%d Hkv%d Nq%d N%d d%d: stats entropy %d = %.9g, reference %.9g", Hq, Hkv,
                  Nq, N, d, x, eg[x], er[x]);
        CHECK_MSG(close_rel(eg[x], e2[x], 1e-5, 1e-3),
                  "shape Hq%d Hkv%d Nq%d N%d d%d: stats entropy %d = %.9g, two-pass %.9g", Hq, Hkv,
                  Nq, N, d, x, eg[x], e2[x]);
    }
    /* the optional outputs do not change the entropies, bit for bit */
    CHECK_OK(kvs_attn_stats_fused(&q, &k, mod, NULL, NULL, NULL, &es3, 1, err), err);
    CHECK_MSG(memcmp(&es, &es3, sizeof es) == 0,
              "shape Hq%d Hkv%d Nq%d N%d d%d: entropies differ without lse / colsum outputs", Hq,
              Hkv, Nq, N, d);
    free(mod);
    free(lse3);
    free(cs4);
    free(re3);
    /* lse = NULL and row_entropy = NULL: the same column sums, bit for bit */
    float *cs3 = malloc(sizeof(float) * (size_t)Hkv * N);
    CHECK_OK(kvs_attn_colsum_fused(&q, &k, NULL, cs3, NULL, 1, err), err);
    CHECK_MSG(memcmp(cs, cs3, sizeof(float) * (size_t)Hkv * N) == 0,
              "shape Hq%d Hkv%d Nq%d N%d d%d: colsum with lse = NULL differs", Hq, Hkv, Nq, N, d);
    free(cs3);
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
    free(lse2);
    free(cs2);
    free(re2);
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
    CHECK_OK(kvs_attn_colsum_fused(&q, &k, lse, cs, re, 1, err), err);
    /* rows sit at positions 1, 2, 3: they see 2, 3, 4 keys */
    for (int h = 0; h < Hq; h++) {
        CHECK_NEAR(lse[h * Nq + 0], log(2.0), 1e-6);
        CHECK_NEAR(lse[h * Nq + 1], log(3.0), 1e-6);
        CHECK_NEAR(lse[h * Nq + 2], log(4.0), 1e-6);
        CHECK_NEAR(re[h * Nq + 0], log(2.0), 1e-6);
        CHECK_NEAR(re[h * Nq + 1], log(3.0), 1e-6);
        CHECK_NEAR(re[h * Nq + 2], log(4.0), 1e-6);
    }
    CHECK_NEAR(cs[0], 1.0 / 2 + 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[1], 1.0 / 2 + 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[2], 1.0 / 3 + 1.0 / 4, 1e-6);
    CHECK_NEAR(cs[3], 1.0 / 4, 1e-6);
}

/* Same inputs, threads 1, 2, 3 (and 0 = one): bit-identical lse, colsum and
 * row entropy. Shapes give many row blocks and all 8 slabs per KV head. */
static void test_threads_deterministic(kvs_dtype t, int Hq, int Hkv, int Nq, int N, int d) {
    uint64_t rng = 77 + (uint64_t)t;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, t, (size_t)Hq * Nq * d, 1.5, &qraw, &qv);
    ref_fill(&rng, t, (size_t)Hkv * N * d, 1.5, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, t, Hq, Nq, d), k = kvs_view_make(kraw, t, Hkv, N, d);
    float *lse[4], *cs[4], *re[4];
    kvs_err errs = {0}, *err = &errs;
    for (int x = 0; x < 4; x++) {
        lse[x] = malloc(sizeof(float) * Hq * Nq); /* [Hq][Nq] */
        cs[x] = malloc(sizeof(float) * Hkv * N);  /* [Hkv][N] */
        re[x] = malloc(sizeof(float) * Hq * Nq);  /* [Hq][Nq] */
        CHECK_OK(kvs_attn_colsum_fused(&q, &k, lse[x], cs[x], re[x], x, err), err);
    }
    for (int x = 1; x < 4; x++) {
        CHECK_MSG(memcmp(lse[0], lse[x], sizeof(float) * Hq * Nq) == 0,
                  "%s G%d: fused lse differs at threads = %d", kvs_dtype_name(t), Hq / Hkv, x);
        CHECK_MSG(memcmp(cs[0], cs[x], sizeof(float) * Hkv * N) == 0,
                  "%s G%d: fused colsum differs at threads = %d", kvs_dtype_name(t), Hq / Hkv, x);
        CHECK_MSG(memcmp(re[0], re[x], sizeof(float) * Hq * Nq) == 0,
                  "%s G%d: fused row entropy differs at threads = %d", kvs_dtype_name(t), Hq / Hkv,
                  x);
    }
    uint8_t *mod = malloc((size_t)N); /* [N] */
    for (int j = 0; j < N; j++) mod[j] = (j / 40) % 3 == 1 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    kvs_entropy_stats es[4];
    for (int x = 0; x < 4; x++) {
        CHECK_OK(kvs_attn_stats_fused(&q, &k, mod, lse[x], cs[x], re[x], &es[x], x, err), err);
        if (x == 0) continue;
        CHECK_MSG(memcmp(lse[0], lse[x], sizeof(float) * Hq * Nq) == 0 &&
                      memcmp(cs[0], cs[x], sizeof(float) * Hkv * N) == 0 &&
                      memcmp(re[0], re[x], sizeof(float) * Hq * Nq) == 0 &&
                      memcmp(&es[0], &es[x], sizeof es[0]) == 0,
                  "%s G%d: kvs_attn_stats_fused differs at threads = %d", kvs_dtype_name(t),
                  Hq / Hkv, x);
    }
    CHECK(es[0].n_tv > 0 && es[0].n_vt > 0);
    free(mod);
    for (int x = 0; x < 4; x++) {
        free(lse[x]);
        free(cs[x]);
        free(re[x]);
    }
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
    CHECK_FAILS(kvs_attn_colsum_fused(&qn, &k, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err,
                "no queries");
    CHECK_FAILS(kvs_attn_colsum_fused(&q, &k, lse, NULL, NULL, 1, err), KVS_ERR_INVALID, err,
                "NULL colsum");
    kvs_view q3 = kvs_view_make(qd, KVS_F32, 3, 2, 4);
    CHECK_FAILS(kvs_attn_colsum_fused(&q3, &k, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err,
                "not a multiple");
    kvs_view kc = k;
    kc.device = KVS_CUDA;
    CHECK_FAILS(kvs_attn_colsum_fused(&q, &kc, lse, cs, NULL, 1, err), KVS_ERR_UNSUPPORTED, err,
                "device memory");
    kvs_view ki = k;
    ki.dtype = KVS_I32;
    CHECK_FAILS(kvs_attn_colsum_fused(&q, &ki, lse, cs, NULL, 1, err), KVS_ERR_INVALID, err, "I32");
    /* Nq = 0: nothing to sum, colsum zeroed */
    kvs_view q0 = kvs_view_make(qd, KVS_F32, 2, 0, 4);
    for (int j = 0; j < 10; j++) cs[j] = 7.0f;
    CHECK_OK(kvs_attn_colsum_fused(&q0, &k, NULL, cs, NULL, 1, err), err);
    for (int j = 0; j < 10; j++) CHECK(cs[j] == 0.0f);
    kvs_entropy_stats es;
    uint8_t mod[5] = {0, 1, 0, 9, 0};
    CHECK_FAILS(kvs_attn_stats_fused(&q, &k, NULL, lse, cs, NULL, NULL, 1, err), KVS_ERR_INVALID,
                err, "NULL entropy output");
    CHECK_FAILS(kvs_attn_stats_fused(&q0, &k, NULL, NULL, cs, NULL, &es, 1, err), KVS_ERR_INVALID,
                err, "Nq = 0");
    CHECK_FAILS(kvs_attn_stats_fused(&q, &k, mod, NULL, cs, NULL, &es, 1, err), KVS_ERR_INVALID,
                err, "modality of token 3 is 9");
    CHECK_FAILS(kvs_attn_stats_fused(&q, &kc, NULL, NULL, cs, NULL, &es, 1, err),
                KVS_ERR_UNSUPPORTED, err, "device memory");
    kd[7] = INFINITY; /* KV head 0, token 1 */
    CHECK_FAILS(kvs_attn_colsum_fused(&q, &k, lse, cs, NULL, 1, err), KVS_ERR_NUMERIC, err,
                "not finite");
    CHECK_FAILS(kvs_attn_colsum_fused(&q, &k, NULL, cs, NULL, 1, err), KVS_ERR_NUMERIC, err,
                "query head 0 row 0");
    CHECK_FAILS(kvs_attn_stats_fused(&q, &k, NULL, NULL, cs, NULL, &es, 1, err), KVS_ERR_NUMERIC,
                err, "not finite");
}

int main(void) {
    const shape fixed[] = {
        {1, 1, 1, 1, 4, KVS_F32, 0, 1.0},       /* N = 1 */
        {2, 1, 37, 37, 16, KVS_F32, 0, 1.0},    /* G = 2, Nq = N */
        {4, 1, 70, 300, 32, KVS_F16, 0, 1.2},   /* G = 4, Nq < N, fp16: 64 + 6 rows */
        {4, 4, 130, 130, 8, KVS_F32, 0, 2.0},   /* G = 1, sharp attention */
        {4, 2, 200, 520, 64, KVS_BF16, 0, 1.0}, /* bf16 */
        {8, 2, 65, 600, 24, KVS_F32, 5, 1.0},   /* strided fp32 K */
        {2, 2, 1, 257, 8, KVS_F16, 0, 1.0},     /* one query */
        {3, 1, 100, 203, 16, KVS_BF16, 0, 1.0}, /* G = 3: 85-row blocks, N % 8 != 0 */
        {8, 1, 90, 90, 8, KVS_F16, 0, 3.0},     /* G = 8: 32-row blocks, very sharp */
        {2, 2, 530, 800, 16, KVS_F16, 0, 1.0},  /* G = 1: 256-row blocks, last partial */
    };
    for (size_t s = 0; s < sizeof fixed / sizeof fixed[0]; s++) check_shape(&fixed[s], 100 + s);
    uint64_t rng = 4242;
    for (int r = 0; r < 6; r++) {
        shape sh;
        const int gs[4] = {1, 2, 3, 4};
        sh.Hkv = 1 + (int)(kvs_rng_uniform(&rng) * 2);
        sh.Hq = sh.Hkv * gs[(int)(kvs_rng_uniform(&rng) * 4)];
        sh.N = 1 + (int)(kvs_rng_uniform(&rng) * 600);
        sh.Nq = 1 + (int)(kvs_rng_uniform(&rng) * sh.N);
        sh.d = 1 + (int)(kvs_rng_uniform(&rng) * 40);
        sh.t = (kvs_dtype)(int)(kvs_rng_uniform(&rng) * 3);
        sh.stride_pad = 0;
        sh.scale = 0.5 + 2.0 * kvs_rng_uniform(&rng);
        check_shape(&sh, 900 + r);
    }
    test_uniform_hand();
    test_threads_deterministic(KVS_F16, 4, 2, 700, 900, 32);
    test_threads_deterministic(KVS_BF16, 2, 2, 1100, 1300, 16);
    test_threads_deterministic(KVS_F32, 3, 1, 600, 611, 24);
    test_threads_deterministic(KVS_F32, 8, 1, 500, 520, 16); /* 16 blocks in 8 slabs */
    test_errors();
    return kvs_test_finish("core_attn_fused");
}
