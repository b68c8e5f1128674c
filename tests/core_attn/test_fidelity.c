/*
 * test_fidelity.c -- kvs_fidelity_layer: exactly 0 for a plan that keeps
 * everything (fp32 and fp16 caches), > 0 for an evicting plan and equal to
 * a naive double reference, a hand case, and the error paths.
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

/* o = softmax(q K^T / sqrt d) V in double for one probe; k, v are [n][d]. */
static void ref_out(const float *q, const float *k, const float *v, int n, int d, double *o) {
    double *s = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; j++) {
        double a = 0.0;
        for (int c = 0; c < d; c++) a += (double)q[c] * k[(size_t)j * d + c];
        s[j] = a / sqrt((double)d);
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
    for (int c = 0; c < d; c++) {
        o[c] = 0.0;
        for (int j = 0; j < n; j++) o[c] += s[j] / sum * v[(size_t)j * d + c];
    }
    free(s);
}

static void fill(uint64_t *rng, float *x, size_t n, double sc) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(sc * kvs_rng_normal(rng));
}

static void test_full_and_evicting(kvs_dtype t) {
    enum { Hq = 4, Hkv = 2, N = 300, d = 16, P = 70 };
    uint64_t rng = 12;
    float *kf = malloc(sizeof(float) * Hkv * N * d), *vf = malloc(sizeof(float) * Hkv * N * d);
    float *pf = malloc(sizeof(float) * Hq * P * d);
    fill(&rng, kf, Hkv * N * d, 1.0);
    fill(&rng, vf, Hkv * N * d, 1.0);
    fill(&rng, pf, Hq * P * d, 1.5);
    uint16_t *kh = malloc(2 * Hkv * N * d), *vh = malloc(2 * Hkv * N * d);
    if (t == KVS_F16)
        for (int x = 0; x < Hkv * N * d; x++) {
            kh[x] = kvs_f32_to_f16(kf[x]);
            vh[x] = kvs_f32_to_f16(vf[x]);
            kf[x] = kvs_f16_to_f32(kh[x]);
            vf[x] = kvs_f16_to_f32(vh[x]);
        }
    kvs_layer ly = {.k = kvs_view_make(t == KVS_F16 ? (void *)kh : (void *)kf, t, Hkv, N, d),
                    .v = kvs_view_make(t == KVS_F16 ? (void *)vh : (void *)vf, t, Hkv, N, d)};
    kvs_cache_view cv = {.n_layers = 1, .layers = &ly};
    kvs_view probes = kvs_view_make(pf, KVS_F32, Hq, P, d);
    kvs_err errs = {0}, *err = &errs;
    kvs_plan plan;
    kvs_dense_cache out;
    double mean = -1, mx = -1;
    /* keep everything */
    int b = N;
    CHECK_OK(kvs_plan_init(&plan, "full", 1, Hkv, N, &b, err), err);
    for (int h = 0; h < Hkv; h++)
        for (int n = 0; n < N; n++) plan.layers[0].idx[h * N + n] = n;
    CHECK_OK(kvs_apply(&cv, &plan, &out, err), err);
    CHECK_OK(kvs_fidelity_layer(&probes, &ly, &out.layers[0], &mean, &mx, err), err);
    CHECK(mean == 0.0);
    CHECK(mx == 0.0);
    kvs_dense_cache_free(&out);
    kvs_plan_free(&plan);
    /* keep every third token, head 1 shifted by one */
    b = N / 3;
    CHECK_OK(kvs_plan_init(&plan, "evict", 1, Hkv, N, &b, err), err);
    for (int h = 0; h < Hkv; h++)
        for (int i = 0; i < b; i++) plan.layers[0].idx[h * b + i] = 3 * i + h;
    CHECK_OK(kvs_apply(&cv, &plan, &out, err), err);
    CHECK_OK(kvs_fidelity_layer(&probes, &ly, &out.layers[0], &mean, &mx, err), err);
    CHECK(mean > 0.0 && mx >= mean);
    /* reference in double */
    double rsum = 0.0, rmax = 0.0, *of = malloc(sizeof(double) * d), *oc = malloc(sizeof(double) * d);
    for (int h = 0; h < Hq; h++) {
        const int g = h / (Hq / Hkv);
        for (int p = 0; p < P; p++) {
            const float *q = pf + ((size_t)h * P + p) * d;
            ref_out(q, kf + (size_t)g * N * d, vf + (size_t)g * N * d, N, d, of);
            ref_out(q, out.layers[0].k + (size_t)g * b * d, out.layers[0].v + (size_t)g * b * d, b, d, oc);
            double nf = 0, ne = 0;
            for (int c = 0; c < d; c++) {
                nf += of[c] * of[c];
                ne += (oc[c] - of[c]) * (oc[c] - of[c]);
            }
            const double r = sqrt(ne / nf);
            rsum += r;
            rmax = r > rmax ? r : rmax;
        }
    }
    CHECK_NEAR(mean, rsum / (Hq * P), 1e-4);
    CHECK_NEAR(mx, rmax, 1e-4);
    /* error paths */
    kvs_dense_layer bad = out.layers[0];
    bad.head_dim = d + 1;
    CHECK_FAILS(kvs_fidelity_layer(&probes, &ly, &bad, &mean, &mx, err), KVS_ERR_INVALID, err,
                "compressed layer");
    kvs_view p3 = kvs_view_make(pf, KVS_F32, 3, P, d);
    CHECK_FAILS(kvs_fidelity_layer(&p3, &ly, &out.layers[0], &mean, &mx, err), KVS_ERR_INVALID, err,
                "multiple");
    kvs_view pd = kvs_view_make(pf, KVS_F32, Hq, P, d - 1);
    CHECK_FAILS(kvs_fidelity_layer(&pd, &ly, &out.layers[0], &mean, &mx, err), KVS_ERR_INVALID, err,
                "do not agree");
    free(of);
    free(oc);
    kvs_dense_cache_free(&out);
    kvs_plan_free(&plan);
    free(kf);
    free(vf);
    free(pf);
    free(kh);
    free(vh);
}

/* Hand case: d = 1, N = 2, keys 0, V = (1, 3); probe q = 0 sees both tokens
 * equally: o_full = 2. Keeping token 0 only: o_comp = 1, rel err = 1/2.
 * Keeping token 1 only: o_comp = 3, rel err = 1/2. A zero full output is an
 * error (relative error undefined). */
static void test_hand(void) {
    float k[2] = {0, 0}, v[2] = {1, 3}, q[1] = {0};
    kvs_layer ly = {.k = kvs_view_make(k, KVS_F32, 1, 2, 1), .v = kvs_view_make(v, KVS_F32, 1, 2, 1)};
    kvs_view probes = kvs_view_make(q, KVS_F32, 1, 1, 1);
    float ck[1] = {0}, cv[1] = {1};
    kvs_dense_layer comp = {.n_tokens = 1, .n_kv_heads = 1, .head_dim = 1, .k = ck, .v = cv};
    double mean, mx;
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_fidelity_layer(&probes, &ly, &comp, &mean, &mx, err), err);
    CHECK_NEAR(mean, 0.5, 1e-7);
    CHECK_NEAR(mx, 0.5, 1e-7);
    cv[0] = 3;
    CHECK_OK(kvs_fidelity_layer(&probes, &ly, &comp, &mean, &mx, err), err);
    CHECK_NEAR(mean, 0.5, 1e-7);
    v[0] = -3;
    CHECK_FAILS(kvs_fidelity_layer(&probes, &ly, &comp, &mean, &mx, err), KVS_ERR_NUMERIC, err,
                "zero");
    v[0] = NAN;
    CHECK_FAILS(kvs_fidelity_layer(&probes, &ly, &comp, &mean, &mx, err), KVS_ERR_NUMERIC, err,
                "not finite");
}

int main(void) {
    test_full_and_evicting(KVS_F32);
    test_full_and_evicting(KVS_F16);
    test_hand();
    return kvs_test_finish("core_attn_fidelity");
}
