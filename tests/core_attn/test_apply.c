/*
 * test_apply.c -- kvs_apply compaction on a hand case, kvs_merge_assign
 * (hand case, ties to the lower kept slot also across similarity tiles,
 * zero keys, random shapes vs a brute-force double argmax), the three merge
 * formulas on a hand-computed case (numbers worked out by hand below), merge
 * through kvs_apply with an fp16 cache, the error paths, and kvs_apply_into
 * (threads, buffer re-use) against kvs_apply.
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

/* Two layers, two heads, N = 5, d = 2; element (l, h, n, c) = 1000 l + 100 h
 * + 10 n + c, so every gathered value names where it came from. */
static void test_compaction_hand(void) {
    enum { L = 2, H = 2, N = 5, d = 2 };
    float kd[L][H * N * d], vd[L][H * N * d];
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int c = 0; c < d; c++) {
                    kd[l][(h * N + n) * d + c] = (float)(1000 * l + 100 * h + 10 * n + c);
                    vd[l][(h * N + n) * d + c] = -(float)(1000 * l + 100 * h + 10 * n + c);
                }
    kvs_layer layers[L];
    for (int l = 0; l < L; l++) {
        layers[l].k = kvs_view_make(kd[l], KVS_F32, H, N, d);
        layers[l].v = kvs_view_make(vd[l], KVS_F32, H, N, d);
        layers[l].q = kvs_view_make(NULL, KVS_F32, H, 0, d);
    }
    uint8_t mod[N] = {0, 1, 1, 0, 0};
    kvs_cache_view cv = {.n_layers = L, .layers = layers, .modality = mod};
    kvs_plan plan;
    kvs_err errs = {0}, *err = &errs;
    const int budgets[L] = {2, 3};
    CHECK_OK(kvs_plan_init(&plan, "hand", L, H, N, budgets, err), err);
    const int32_t i0[H * 2] = {1, 4, 0, 2}, i1[H * 3] = {0, 1, 2, 2, 3, 4};
    memcpy(plan.layers[0].idx, i0, sizeof i0);
    memcpy(plan.layers[1].idx, i1, sizeof i1);
    plan.merge = KVS_MERGE_NONE;
    kvs_dense_cache out;
    CHECK_OK(kvs_apply(&cv, &plan, &out, err), err);
    CHECK_EQ_INT(out.n_layers, 2);
    CHECK_EQ_INT(out.n_tokens, 5);
    CHECK(out.modality && memcmp(out.modality, mod, N) == 0);
    CHECK_EQ_INT(out.layers[0].n_tokens, 2);
    CHECK_EQ_INT(out.layers[1].n_tokens, 3);
    CHECK_EQ_INT(out.layers[1].n_kv_heads, 2);
    CHECK_EQ_INT(out.layers[1].head_dim, 2);
    CHECK(out.layers[0].q == NULL && out.layers[0].n_queries == 0);
    /* layer 0: head 0 keeps {1, 4}, head 1 keeps {0, 2} */
    const float k0[] = {10, 11, 40, 41, 100, 101, 120, 121};
    /* layer 1: head 0 keeps {0, 1, 2}, head 1 keeps {2, 3, 4} */
    const float k1[] = {1000, 1001, 1010, 1011, 1020, 1021, 1120, 1121, 1130, 1131, 1140, 1141};
    for (int x = 0; x < 8; x++) {
        CHECK(out.layers[0].k[x] == k0[x]);
        CHECK(out.layers[0].v[x] == -k0[x]);
    }
    for (int x = 0; x < 12; x++) {
        CHECK(out.layers[1].k[x] == k1[x]);
        CHECK(out.layers[1].v[x] == -k1[x]);
    }
    kvs_dense_cache_free(&out);
    /* error paths: plan / cache disagree, broken plan */
    cv.n_layers = 1;
    CHECK_FAILS(kvs_apply(&cv, &plan, &out, err), KVS_ERR_INVALID, err, "layers");
    cv.n_layers = L;
    layers[1].v = kvs_view_make(vd[1], KVS_F32, H, N - 1, d);
    CHECK_FAILS(kvs_apply(&cv, &plan, &out, err), KVS_ERR_INVALID, err, "layer 1");
    layers[1].v = kvs_view_make(vd[1], KVS_F32, H, N, d);
    plan.layers[1].idx[4] = 2;
    CHECK_FAILS(kvs_apply(&cv, &plan, &out, err), KVS_ERR_INVALID, err, "sorted");
    CHECK(out.layers == NULL);
    kvs_plan_free(&plan);
}

/* The hand case of the merge formulas: one head, N = 5, d = 2, kept {0, 3}.
 *   k0 = (1,0)  k1 = (2,0)  k2 = (3,1)  k3 = (0,1)  k4 = (1,2)
 *   v0 = (1,1)  v1 = (3,0)  v2 = (0,3)  v3 = (2,2)  v4 = (4,0)
 * cos(k1,k0) = 1, cos(k1,k3) = 0 -> slot 0; cos(k2,k0) = 3/sqrt10 = .949,
 * cos(k2,k3) = 1/sqrt10 -> slot 0; cos(k4,k0) = 1/sqrt5, cos(k4,k3) =
 * 2/sqrt5 = .894 -> slot 1. So S_0 = {1, 2} (n = 2), S_1 = {4} (n = 1). */
static const float HK[5][2] = {{1, 0}, {2, 0}, {3, 1}, {0, 1}, {1, 2}};
static const float HV[5][2] = {{1, 1}, {3, 0}, {0, 3}, {2, 2}, {4, 0}};
static const int32_t HKEPT[2] = {0, 3};

static void merge_case(kvs_merge m, const float ek[2][2], const float ev[2][2]) {
    kvs_view k = kvs_view_make(HK, KVS_F32, 1, 5, 2), v = kvs_view_make(HV, KVS_F32, 1, 5, 2);
    int32_t assign[5];
    kvs_err errs = {0}, *err = &errs;
    CHECK_OK(kvs_merge_assign(&k, 0, HKEPT, 2, assign, err), err);
    const int32_t want[5] = {-1, 0, 0, -1, 1};
    for (int n = 0; n < 5; n++) CHECK_EQ_INT(assign[n], want[n]);
    float kk[2][2] = {{1, 0}, {0, 1}}, vv[2][2] = {{1, 1}, {2, 2}};
    kvs_merge_head(&k, &v, 0, HKEPT, 2, assign, m, &kk[0][0], &vv[0][0]);
    for (int s = 0; s < 2; s++)
        for (int c = 0; c < 2; c++) {
            CHECK_MSG(fabs(kk[s][c] - ek[s][c]) <= 1e-6, "%s: k slot %d ch %d = %.9g, want %.9g",
                      kvs_merge_name(m), s, c, kk[s][c], ek[s][c]);
            CHECK_MSG(fabs(vv[s][c] - ev[s][c]) <= 1e-6, "%s: v slot %d ch %d = %.9g, want %.9g",
                      kvs_merge_name(m), s, c, vv[s][c], ev[s][c]);
        }
}

static void test_merge_formulas_hand(void) {
    /* average: slot 0 = (x0 + x1 + x2) / 3, slot 1 = (x3 + x4) / 2
     *   k: ((1+2+3)/3, (0+0+1)/3) = (2, 1/3);  ((0+1)/2, (1+2)/2) = (0.5, 1.5)
     *   v: ((1+3+0)/3, (1+0+3)/3) = (4/3, 4/3); ((2+4)/2, (2+0)/2) = (3, 1) */
    const float ak[2][2] = {{2.0f, 1.0f / 3}, {0.5f, 1.5f}};
    const float av[2][2] = {{4.0f / 3, 4.0f / 3}, {3.0f, 1.0f}};
    merge_case(KVS_MERGE_AVERAGE, ak, av);
    /* pivotal: (x_c + sum_e (x_e + x_c)/2) / (n+1)
     *   k slot 0: ((1,0) + (1.5,0) + (2,0.5)) / 3 = (4.5, 0.5)/3 = (1.5, 1/6)
     *   k slot 1: ((0,1) + (0.5,1.5)) / 2 = (0.25, 1.25)
     *   v slot 0: ((1,1) + (2,0.5) + (0.5,2)) / 3 = (3.5, 3.5)/3 = (7/6, 7/6)
     *   v slot 1: ((2,2) + (3,1)) / 2 = (2.5, 1.5) */
    const float pk[2][2] = {{1.5f, 1.0f / 6}, {0.25f, 1.25f}};
    const float pv[2][2] = {{7.0f / 6, 7.0f / 6}, {2.5f, 1.5f}};
    merge_case(KVS_MERGE_PIVOTAL, pk, pv);
    /* weighted: (x_c + sum_e cos(k_e,k_c) x_e) / (n+1), 3/sqrt10 = 0.948683298,
     * 2/sqrt5 = 0.894427191
     *   k slot 0: (1 + 2 + 3*0.948683298, 0.948683298) / 3 = (1.948683298, 0.316227766)
     *   k slot 1: (0.894427191, 1 + 2*0.894427191) / 2 = (0.447213595, 1.394427191)
     *   v slot 0: (1 + 3, 1 + 3*0.948683298) / 3 = (1.333333333, 1.282016631)
     *   v slot 1: (2 + 4*0.894427191, 2) / 2 = (2.788854382, 1) */
    const float wk[2][2] = {{1.948683298f, 0.316227766f}, {0.447213595f, 1.394427191f}};
    const float wv[2][2] = {{1.333333333f, 1.282016631f}, {2.788854382f, 1.0f}};
    merge_case(KVS_MERGE_WEIGHTED, wk, wv);
    /* none leaves the rows alone */
    const float nk[2][2] = {{1, 0}, {0, 1}}, nv[2][2] = {{1, 1}, {2, 2}};
    merge_case(KVS_MERGE_NONE, nk, nv);
}

/* The same case through kvs_apply with an fp16 cache (all values exact in
 * fp16) and merge = average. */
static void test_apply_merge_fp16(void) {
    uint16_t kh[10], vh[10];
    for (int x = 0; x < 10; x++) {
        kh[x] = kvs_f32_to_f16((&HK[0][0])[x]);
        vh[x] = kvs_f32_to_f16((&HV[0][0])[x]);
    }
    kvs_layer ly = {.k = kvs_view_make(kh, KVS_F16, 1, 5, 2), .v = kvs_view_make(vh, KVS_F16, 1, 5, 2)};
    kvs_cache_view cv = {.n_layers = 1, .layers = &ly, .modality = NULL};
    kvs_plan plan;
    kvs_err errs = {0}, *err = &errs;
    const int b = 2;
    CHECK_OK(kvs_plan_init(&plan, "hand", 1, 1, 5, &b, err), err);
    memcpy(plan.layers[0].idx, HKEPT, sizeof HKEPT);
    plan.merge = KVS_MERGE_AVERAGE;
    kvs_dense_cache out;
    CHECK_OK(kvs_apply(&cv, &plan, &out, err), err);
    const float ak[4] = {2.0f, 1.0f / 3, 0.5f, 1.5f}, av[4] = {4.0f / 3, 4.0f / 3, 3.0f, 1.0f};
    for (int x = 0; x < 4; x++) {
        CHECK_NEAR(out.layers[0].k[x], ak[x], 1e-6);
        CHECK_NEAR(out.layers[0].v[x], av[x], 1e-6);
    }
    CHECK(out.modality == NULL);
    kvs_dense_cache_free(&out);
    kvs_plan_free(&plan);
}

static void test_assign_ties(void) {
    kvs_err errs = {0}, *err = &errs;
    /* kept {0, 2, 3}: (0,1), (1,1), (2,2); token 1 = (5,5) ties slots 1 and 2
     * (same direction, 2k is exactly 2 * k) -> slot 1. Token 4 = (0,0): zero
     * key, cosine 0 with every slot -> slot 0. */
    const float kd[5][2] = {{0, 1}, {5, 5}, {1, 1}, {2, 2}, {0, 0}};
    const int32_t kept[3] = {0, 2, 3};
    int32_t a[5];
    kvs_view k = kvs_view_make(kd, KVS_F32, 1, 5, 2);
    CHECK_OK(kvs_merge_assign(&k, 0, kept, 3, a, err), err);
    CHECK_EQ_INT(a[1], 1);
    CHECK_EQ_INT(a[4], 0);
    CHECK_EQ_INT(a[0], -1);
    CHECK_EQ_INT(a[2], -1);
    CHECK_EQ_INT(a[3], -1);
    /* A tie across similarity tiles (1024 kept slots per tile): N = 3000,
     * d = 4. Kept: even tokens. Token 10 and token 3000-2 = 2998 (slot 1499)
     * hold the same key direction, evicted token 11 points the same way. */
    enum { N = 3000, d = 4 };
    float *big = malloc(sizeof(float) * N * d);
    uint64_t rng = 3;
    for (int x = 0; x < N * d; x++) big[x] = (float)kvs_rng_normal(&rng);
    const float dir[d] = {0.5f, -1.0f, 2.0f, 0.25f};
    for (int c = 0; c < d; c++) {
        big[10 * d + c] = dir[c];
        big[2998 * d + c] = 4.0f * dir[c];
        big[11 * d + c] = 3.0f * dir[c];
    }
    int32_t *kb = malloc(sizeof(int32_t) * N / 2), *ab = malloc(sizeof(int32_t) * N);
    for (int b = 0; b < N / 2; b++) kb[b] = 2 * b;
    kvs_view kv = kvs_view_make(big, KVS_F32, 1, N, d);
    CHECK_OK(kvs_merge_assign(&kv, 0, kb, N / 2, ab, err), err);
    CHECK_EQ_INT(ab[11], 5);
    free(big);
    free(kb);
    free(ab);
}

/* Random shapes (kept > one similarity tile, evicted > one tile, two heads,
 * fp32 / fp16): assignment == brute-force double cosine argmax. */
static void test_assign_random(void) {
    kvs_err errs = {0}, *err = &errs;
    uint64_t rng = 11;
    const int shapes[][4] = {{1300, 1100, 8, 0}, {700, 40, 16, 1}, {50, 1, 3, 0}, {600, 599, 32, 1}};
    for (int s = 0; s < 4; s++) {
        const int N = shapes[s][0], B = shapes[s][1], d = shapes[s][2], H = 2;
        const kvs_dtype t = shapes[s][3] ? KVS_F16 : KVS_F32;
        float *val = malloc(sizeof(float) * H * N * d);
        void *raw = malloc(4 * (size_t)H * N * d);
        for (int x = 0; x < H * N * d; x++) {
            float f = (float)kvs_rng_normal(&rng);
            if (t == KVS_F16) {
                ((uint16_t *)raw)[x] = kvs_f32_to_f16(f);
                f = kvs_f16_to_f32(((uint16_t *)raw)[x]);
            } else {
                ((float *)raw)[x] = f;
            }
            val[x] = f;
        }
        kvs_view k = kvs_view_make(raw, t, H, N, d);
        /* kept: a random subset of size B, sorted */
        int32_t *kept = malloc(sizeof(int32_t) * B), *a = malloc(sizeof(int32_t) * N);
        int nk = 0;
        for (int n = 0; n < N && nk < B; n++)
            if (kvs_rng_uniform(&rng) * (N - n) < B - nk) kept[nk++] = n;
        CHECK_EQ_INT(nk, B);
        const int h = 1;
        CHECK_OK(kvs_merge_assign(&k, h, kept, B, a, err), err);
        int bad = 0, ki = 0;
        for (int n = 0; n < N; n++) {
            if (ki < B && kept[ki] == n) {
                ki++;
                if (a[n] != -1) bad++;
                continue;
            }
            const float *e = val + ((size_t)h * N + n) * d;
            double best = -2.0, second = -2.0;
            int bs = -1;
            for (int b = 0; b < B; b++) {
                const float *c = val + ((size_t)h * N + kept[b]) * d;
                double dot = 0, ne = 0, nc = 0;
                for (int x = 0; x < d; x++) {
                    dot += (double)e[x] * c[x];
                    ne += (double)e[x] * e[x];
                    nc += (double)c[x] * c[x];
                }
                const double cs = dot / sqrt(ne * nc);
                if (cs > best) {
                    second = best;
                    best = cs;
                    bs = b;
                } else if (cs > second) {
                    second = cs;
                }
            }
            /* near-ties within fp32 rounding may go either way */
            if (a[n] != bs && best - second > 1e-5) bad++;
        }
        CHECK_MSG(bad == 0, "shape N=%d B=%d d=%d: %d wrong assignments", N, B, d, bad);
        free(val);
        free(raw);
        free(kept);
        free(a);
    }
}

static void test_assign_errors(void) {
    kvs_err errs = {0}, *err = &errs;
    float kd[4 * 2] = {1, 0, 0, 1, 1, 1, NAN, 0};
    int32_t a[4];
    kvs_view k = kvs_view_make(kd, KVS_F32, 1, 4, 2);
    const int32_t uns[2] = {2, 1}, oor[2] = {1, 4}, ok[2] = {0, 1};
    CHECK_FAILS(kvs_merge_assign(&k, 0, uns, 2, a, err), KVS_ERR_INVALID, err, "sorted");
    CHECK_FAILS(kvs_merge_assign(&k, 0, oor, 2, a, err), KVS_ERR_INVALID, err, "outside");
    CHECK_FAILS(kvs_merge_assign(&k, 0, ok, 0, a, err), KVS_ERR_INVALID, err, "B = 0");
    CHECK_FAILS(kvs_merge_assign(&k, 1, ok, 2, a, err), KVS_ERR_INVALID, err, "head 1");
    CHECK_FAILS(kvs_merge_assign(&k, 0, ok, 2, a, err), KVS_ERR_NUMERIC, err, "token 3");
}

/* kvs_apply_into on 1-5 threads, into one output re-used across plans of
 * growing and shrinking budgets, is bit-identical to a fresh kvs_apply, for
 * fp32 and fp16 caches and every merge; a smaller plan keeps the buffers. */
static void test_apply_into_threads(void) {
    kvs_err errs = {0}, *err = &errs;
    enum { L = 3, H = 3, N = 97, d = 8 };
    static float kf[L][H * N * d], vf[L][H * N * d];
    static uint16_t kh[L][H * N * d], vh[L][H * N * d];
    uint64_t rng = 5;
    for (int l = 0; l < L; l++)
        for (int x = 0; x < H * N * d; x++) {
            kf[l][x] = (float)kvs_rng_normal(&rng);
            vf[l][x] = (float)kvs_rng_normal(&rng);
            kh[l][x] = kvs_f32_to_f16(kf[l][x]);
            vh[l][x] = kvs_f32_to_f16(vf[l][x]);
        }
    for (int half = 0; half < 2; half++) {
        kvs_layer layers[L];
        for (int l = 0; l < L; l++) {
            layers[l].k = half ? kvs_view_make(kh[l], KVS_F16, H, N, d) : kvs_view_make(kf[l], KVS_F32, H, N, d);
            layers[l].v = half ? kvs_view_make(vh[l], KVS_F16, H, N, d) : kvs_view_make(vf[l], KVS_F32, H, N, d);
            layers[l].q = kvs_view_make(NULL, KVS_F32, H, 0, d);
        }
        kvs_cache_view cv = {.n_layers = L, .layers = layers, .modality = NULL};
        for (int t = 1; t <= 5; t += 2) {
            kvs_dense_cache out;
            memset(&out, 0, sizeof out);
            const int rounds[4][L] = {{10, 50, 97}, {5, 20, 40}, {60, 97, 30}, {1, 2, 3}};
            for (int r = 0; r < 4; r++) {
                kvs_plan plan;
                CHECK_OK(kvs_plan_init(&plan, "rand", L, H, N, rounds[r], err), err);
                for (int l = 0; l < L; l++)
                    for (int h = 0; h < H; h++) { /* a random sorted subset */
                        int32_t *idx = plan.layers[l].idx + (size_t)h * rounds[r][l];
                        int need = rounds[r][l], got = 0;
                        for (int n = 0; n < N; n++)
                            if (kvs_rng_uniform(&rng) * (N - n) < need - got) idx[got++] = n;
                        CHECK_EQ_INT(got, need);
                    }
                plan.merge = (kvs_merge)(r % 4); /* none, pivotal, average, weighted */
                kvs_dense_cache ref;
                CHECK_OK(kvs_apply(&cv, &plan, &ref, err), err);
                float *k1 = out.layers ? out.layers[1].k : NULL;
                CHECK_OK(kvs_apply_into(&cv, &plan, t, &out, err), err);
                if (r == 1) CHECK(out.layers[1].k == k1); /* smaller: re-used */
                CHECK_EQ_INT(out.n_layers, L);
                for (int l = 0; l < L; l++) {
                    const size_t n = (size_t)H * rounds[r][l] * d;
                    CHECK_EQ_INT(out.layers[l].n_tokens, rounds[r][l]);
                    CHECK(memcmp(out.layers[l].k, ref.layers[l].k, n * sizeof(float)) == 0);
                    CHECK(memcmp(out.layers[l].v, ref.layers[l].v, n * sizeof(float)) == 0);
                }
                kvs_dense_cache_free(&ref);
                kvs_plan_free(&plan);
            }
            kvs_dense_cache_free(&out);
        }
    }
}

int main(void) {
    test_compaction_hand();
    test_merge_formulas_hand();
    test_apply_merge_fp16();
    test_assign_ties();
    test_assign_random();
    test_assign_errors();
    test_apply_into_threads();
    return kvs_test_finish("core_attn_apply");
}
