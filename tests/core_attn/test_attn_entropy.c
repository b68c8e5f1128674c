/*
 * test_attn_entropy.c -- kvs_attn_entropies: plain mean row entropy of the
 * head-averaged attention and the MEDA cross-modal E_TV / E_VT, against a
 * naive double reference (random shapes, GQA, fp16, Nq < N), a hand case
 * with uniform attention, single-modality masks (n_tv = n_vt = 0), mixed
 * masks, the video = visual decision, and the error paths.
 */
#include "attn_ref.h"
#include "kvsieve.h"
#include "test_util.h"

static void check_case(int Hq, int Hkv, int Nq, int N, int d, kvs_dtype t, double scale,
                       const uint8_t *mod, uint64_t seed, int threads) {
    uint64_t rng = seed;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, t, (size_t)Hq * Nq * d, scale, &qraw, &qv);
    ref_fill(&rng, t, (size_t)Hkv * N * d, scale, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, t, Hq, Nq, d), k = kvs_view_make(kraw, t, Hkv, N, d);
    float *lse = malloc(sizeof(float) * (size_t)Hq * Nq);
    kvs_err errs = {0}, *err = &errs;
    kvs_entropy_stats got;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, threads, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, mod, &got, threads, err), err);
    const kvs_entropy_stats ref = ref_entropy_stats(qv, kv, Hq, Hkv, Nq, N, d, mod);
    CHECK_MSG(fabs(got.plain - ref.plain) <= 2e-5 * (1.0 + ref.plain),
              "Hq%d Hkv%d Nq%d N%d d%d: plain %.9g vs %.9g", Hq, Hkv, Nq, N, d, got.plain, ref.plain);
    CHECK_EQ_INT(got.n_tv, ref.n_tv);
    CHECK_EQ_INT(got.n_vt, ref.n_vt);
    CHECK_MSG(fabs(got.e_tv - ref.e_tv) <= 2e-5 * (1.0 + ref.e_tv),
              "Hq%d Hkv%d Nq%d N%d d%d: E_TV %.9g vs %.9g", Hq, Hkv, Nq, N, d, got.e_tv, ref.e_tv);
    CHECK_MSG(fabs(got.e_vt - ref.e_vt) <= 2e-5 * (1.0 + ref.e_vt),
              "Hq%d Hkv%d Nq%d N%d d%d: E_VT %.9g vs %.9g", Hq, Hkv, Nq, N, d, got.e_vt, ref.e_vt);
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
    free(lse);
}

/* q == 0: every row is uniform over its causal keys. Modality T I I T:
 *   plain = (log 1 + log 2 + log 3 + log 4) / 4
 *   text rows: p=0 sees no image key (skipped), p=3 sees images {1,2}: log 2
 *   image rows p=1, p=2 see the one text key {0}: entropy 0 */
static void test_uniform_hand(void) {
    enum { Hq = 2, N = 4, d = 3 };
    float qd[Hq * N * d] = {0}, kd[N * d] = {1, 2, 3, -1, 0, 2, 4, 4, -4, 0.5f, 0.5f, 1};
    const uint8_t mod[N] = {KVS_MOD_TEXT, KVS_MOD_IMAGE, KVS_MOD_IMAGE, KVS_MOD_TEXT};
    kvs_view q = kvs_view_make(qd, KVS_F32, Hq, N, d), k = kvs_view_make(kd, KVS_F32, 1, N, d);
    float lse[Hq * N];
    kvs_entropy_stats es;
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 1, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, mod, &es, 1, err), err);
    CHECK_NEAR(es.plain, (log(2.0) + log(3.0) + log(4.0)) / 4.0, 1e-6);
    CHECK_EQ_INT(es.n_tv, 1);
    CHECK_NEAR(es.e_tv, log(2.0), 1e-6);
    CHECK_EQ_INT(es.n_vt, 2);
    CHECK_NEAR(es.e_vt, 0.0, 1e-6);
    /* video counts as visual: same numbers */
    const uint8_t modv[N] = {KVS_MOD_TEXT, KVS_MOD_VIDEO, KVS_MOD_IMAGE, KVS_MOD_TEXT};
    kvs_entropy_stats ev;
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, modv, &ev, 1, err), err);
    CHECK_EQ_INT(ev.n_tv, 1);
    CHECK_EQ_INT(ev.n_vt, 2);
    CHECK_NEAR(ev.e_tv, log(2.0), 1e-6);
    /* audio rows and keys take part in neither */
    const uint8_t moda[N] = {KVS_MOD_TEXT, KVS_MOD_AUDIO, KVS_MOD_IMAGE, KVS_MOD_TEXT};
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, moda, &ev, 1, err), err);
    CHECK_EQ_INT(ev.n_tv, 1);
    CHECK_NEAR(ev.e_tv, 0.0, 1e-6); /* one image key left */
    CHECK_EQ_INT(ev.n_vt, 1);
}

/* Single modality: no cross-modal rows; plain equals the NULL-mask plain. */
static void test_single_modality(void) {
    uint64_t rng = 9;
    const int Hq = 4, Hkv = 2, Nq = 90, N = 310, d = 16;
    void *qraw, *kraw;
    float *qv, *kv;
    ref_fill(&rng, KVS_F32, (size_t)Hq * Nq * d, 1.3, &qraw, &qv);
    ref_fill(&rng, KVS_F32, (size_t)Hkv * N * d, 1.3, &kraw, &kv);
    kvs_view q = kvs_view_make(qraw, KVS_F32, Hq, Nq, d), k = kvs_view_make(kraw, KVS_F32, Hkv, N, d);
    float *lse = malloc(sizeof(float) * Hq * Nq);
    uint8_t *text = calloc(N, 1), *img = malloc(N);
    memset(img, KVS_MOD_IMAGE, N);
    kvs_entropy_stats a, b, c;
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 2, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, NULL, &a, 2, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, text, &b, 2, err), err);
    CHECK_OK(kvs_attn_entropies(&q, &k, lse, img, &c, 2, err), err);
    CHECK_EQ_INT(a.n_tv + a.n_vt + b.n_tv + b.n_vt + c.n_tv + c.n_vt, 0);
    CHECK(a.plain == b.plain && a.plain == c.plain);
    CHECK(a.plain > 0.0 && a.plain < log((double)N));
    const kvs_entropy_stats r = ref_entropy_stats(qv, kv, Hq, Hkv, Nq, N, d, NULL);
    CHECK_NEAR(a.plain, r.plain, 2e-5);
    free(lse);
    free(text);
    free(img);
    free(qraw);
    free(kraw);
    free(qv);
    free(kv);
}

static void test_errors(void) {
    float qd[2 * 3 * 4] = {0}, kd[5 * 4] = {0}, lse[6];
    uint8_t mod[5] = {0, 1, 1, 0, 0};
    kvs_entropy_stats es;
    kvs_err errs = {0}, *err = &errs;
    kvs_view q = kvs_view_make(qd, KVS_F32, 2, 3, 4), k = kvs_view_make(kd, KVS_F32, 1, 5, 4);
    CHECK_OK(kvs_attn_lse(&q, &k, lse, 1, err), err);
    mod[2] = 9;
    CHECK_FAILS(kvs_attn_entropies(&q, &k, lse, mod, &es, 1, err), KVS_ERR_INVALID, err, "token 2");
    mod[2] = 1;
    CHECK_FAILS(kvs_attn_entropies(&q, &k, NULL, mod, &es, 1, err), KVS_ERR_INVALID, err, "lse");
    kvs_view q0 = kvs_view_make(qd, KVS_F32, 2, 0, 4);
    CHECK_FAILS(kvs_attn_entropies(&q0, &k, lse, mod, &es, 1, err), KVS_ERR_INVALID, err, "Nq = 0");
    CHECK_FAILS(kvs_attn_entropies(&q, &k, lse, mod, NULL, 1, err), KVS_ERR_INVALID, err, "NULL");
}

int main(void) {
    test_uniform_hand();
    test_single_modality();
    /* mixed masks: blocks of image tokens inside text, Nq < N and Nq = N */
    {
        const int N = 400;
        uint8_t *mod = malloc(N);
        for (int j = 0; j < N; j++) mod[j] = (j >= 20 && j < 180) || (j >= 300 && j < 330) ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
        check_case(4, 1, 150, N, 32, KVS_F32, 1.0, mod, 1, 2);
        check_case(4, 2, N, N, 16, KVS_F16, 1.5, mod, 2, 3);
        check_case(2, 2, 70, N, 8, KVS_BF16, 2.0, mod, 3, 1);
        /* image first: early image queries have no text key to see */
        for (int j = 0; j < N; j++) mod[j] = j < 260 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
        check_case(2, 1, N, N, 12, KVS_F32, 1.0, mod, 4, 2);
        free(mod);
    }
    /* random shapes and random masks */
    uint64_t rng = 31;
    for (int r = 0; r < 5; r++) {
        const int gs[3] = {1, 2, 4};
        const int Hkv = 1 + (int)(kvs_rng_uniform(&rng) * 2);
        const int Hq = Hkv * gs[(int)(kvs_rng_uniform(&rng) * 3)];
        const int N = 1 + (int)(kvs_rng_uniform(&rng) * 500);
        const int Nq = 1 + (int)(kvs_rng_uniform(&rng) * N);
        const int d = 1 + (int)(kvs_rng_uniform(&rng) * 32);
        uint8_t *mod = malloc(N);
        for (int j = 0; j < N; j++) mod[j] = (uint8_t)(kvs_rng_uniform(&rng) * 4);
        check_case(Hq, Hkv, Nq, N, d, (kvs_dtype)(r % 3), 1.0 + kvs_rng_uniform(&rng), mod, 40 + r, 1 + r % 3);
        free(mod);
    }
    test_errors();
    return kvs_test_finish("core_attn_entropy");
}
