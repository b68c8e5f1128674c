/*
 * test_gpu_kernels.c -- parity of every device building block with its CPU
 * reference: DCT-II / DCT-III (kernels/dct.h), the fused FlashCache layer
 * statistics (dct.h-based reference), top-k (kvs_topk_indices, with forced
 * ties), pooling (kvs_pool1d_*), attention lse / column sums / entropies
 * (kvs_attn_*), cosine-argmax assignment (kvs_merge_assign) and compaction
 * with every merge formula (kvs_apply). Outputs are poisoned (NaN) before
 * each run; inputs are fresh random (seed printed). fp32, fp16 and bf16.
 * Without a CUDA device it checks that the absence is reported the
 * documented way and exits 77 (CTest: skipped).
 * What it is not: no timing (tests/gpu/bench_overhead.c), no method plans
 * (test_gpu_methods.c).
 */
#include "kg_util.h"

static const kvs_dtype kDtypes[3] = {KVS_F32, KVS_F16, KVS_BF16};

static void test_dct(kvs_gpu_workspace *ws, uint64_t *rng) {
    const int Ns[] = {1, 2, 3, 7, 64, 100, 257, 1024};
    const int ncols = 6;
    for (size_t t = 0; t < sizeof Ns / sizeof Ns[0]; t++) {
        const int N = Ns[t];
        const size_t n = (size_t)ncols * N;
        float *x = malloc(sizeof(float) * n), *X = malloc(sizeof(float) * n);
        float *gX = malloc(sizeof(float) * n), *gx = malloc(sizeof(float) * n);
        kvs_err err;
        kvs_err_clear(&err);
        kvs_dct_plan *plan = NULL;
        CHECK_OK(kvs_dct_plan_create(N, ncols, &plan, &err), &err);
        for (size_t i = 0; i < n; i++) x[i] = (float)kvs_rng_normal(rng);
        CHECK_OK(kvs_dct2_ortho_cols(plan, x, X, &err), &err);
        float *dx = kg_upload(x, sizeof(float) * n);
        float *dX = kg_alloc_poisoned(sizeof(float) * n), *dx2 = kg_alloc_poisoned(sizeof(float) * n);
        CHECK(dx && dX && dx2);
        if (dx && dX && dx2) {
            CHECK_OK(kvs_gpu_dct2(ws, dx, dX, ncols, N, &err), &err);
            CHECK_OK(kvs_gpu_dct3(ws, dX, dx2, ncols, N, &err), &err);
            CHECK_OK(kvs_gpu_sync(ws, &err), &err);
            CHECK(!kg_download(gX, dX, sizeof(float) * n) && !kg_download(gx, dx2, sizeof(float) * n));
            const double sX = kg_max_abs(X, n), eX = kg_max_err(gX, X, n), ex = kg_max_err(gx, x, n);
            CHECK_MSG(eX <= 2e-5 * (sX > 1 ? sX : 1), "DCT-II N=%d: max err %g (scale %g)", N, eX, sX);
            CHECK_MSG(ex <= 2e-5 * (kg_max_abs(x, n) + 1), "DCT-III(DCT-II) N=%d: max err %g", N, ex);
        }
        kvs_gpu_free(dx);
        kvs_gpu_free(dX);
        kvs_gpu_free(dx2);
        kvs_dct_plan_destroy(plan);
        free(x);
        free(X);
        free(gX);
        free(gx);
    }
}

static void test_flashcache_layer(kvs_gpu_workspace *ws, uint64_t *rng) {
    const int Ns[] = {5, 33, 256, 1000};
    for (int ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int N = Ns[ni], H = 2, d = ni % 2 ? 64 : 40;
            kvs_dense_cache dc;
            if (kg_synth(1, 2, H, d, N, 0, 0.0, kvs_rng_next(rng), &dc)) {
                CHECK(0);
                continue;
            }
            kg_cache c;
            if (kg_cache_make(&dc, kDtypes[ti], &c)) {
                CHECK(0);
                kvs_dense_cache_free(&dc);
                continue;
            }
            const double gammas[] = {0.2, 0.05, 1.0};
            for (int gi = 0; gi < 3; gi++) {
                int omega = (int)lround(gammas[gi] * N);
                if (omega < 1) omega = 1;
                float *ref = malloc(sizeof(float) * (size_t)H * N), *got = malloc(sizeof(float) * (size_t)H * N);
                double e[4], ge[4];
                CHECK(!kg_ref_flashcache(&c.hl[0], omega, ref, e));
                float *ddev = kg_alloc_poisoned(sizeof(float) * (size_t)H * N);
                double *den = kg_alloc_poisoned(sizeof(double) * 4);
                kvs_err err;
                kvs_err_clear(&err);
                CHECK_OK(kvs_gpu_lowpass_layer(ws, &c.dl[0], 0, omega, ddev, den, &err), &err);
                CHECK_OK(kvs_gpu_sync(ws, &err), &err);
                CHECK(!kg_download(got, ddev, sizeof(float) * (size_t)H * N) &&
                      !kg_download(ge, den, sizeof ge));
                const double sc = kg_max_abs(ref, (size_t)H * N), er = kg_max_err(got, ref, (size_t)H * N);
                CHECK_MSG(er <= 1e-4 * sc + 1e-6, "%s N=%d omega=%d: deviation max err %g (max %g)",
                          kvs_dtype_name(kDtypes[ti]), N, omega, er, sc);
                for (int i = 0; i < 4; i++)
                    CHECK_MSG(fabs(ge[i] - e[i]) <= 1e-5 * fabs(e[i]) + 1e-9,
                              "%s N=%d omega=%d energy %d: gpu %.12g cpu %.12g",
                              kvs_dtype_name(kDtypes[ti]), N, omega, i, ge[i], e[i]);
                if (omega == N) CHECK_MSG(er <= 1e-4 * (sc + 1e-3), "omega = N keeps the signal");
                kvs_gpu_free(ddev);
                kvs_gpu_free(den);
                free(ref);
                free(got);
            }
            kg_cache_free(&c);
            kvs_dense_cache_free(&dc);
        }
}

static void test_topk(kvs_gpu_workspace *ws, uint64_t *rng) {
    const int ns[] = {1, 2, 17, 1000, 5000};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int n = ns[ni], S = 5;
        const int ks[] = {1, n / 3 > 0 ? n / 3 : 1, n > 1 ? n - 1 : 1, n};
        float *s = malloc(sizeof(float) * (size_t)S * n);
        for (int i = 0; i < S * n; i++) {
            const int seg = i / n;
            /* segment 0: many exact ties; 1: signed zeros; others: continuous */
            double u = kvs_rng_uniform(rng);
            s[i] = seg == 0 ? (float)floor(u * 7.0)
                   : seg == 1 ? (u < 0.5 ? -0.0f : 0.0f) + (u > 0.9 ? 1.0f : 0.0f)
                              : (float)kvs_rng_normal(rng);
        }
        float *ds = kg_upload(s, sizeof(float) * (size_t)S * n);
        for (int ki = 0; ki < 4; ki++) {
            const int k = ks[ki];
            int32_t *ref = malloc(sizeof(int32_t) * (size_t)S * k), *got = malloc(sizeof(int32_t) * (size_t)S * k);
            int32_t *dout = kg_alloc_poisoned(sizeof(int32_t) * (size_t)S * k);
            kvs_err err;
            kvs_err_clear(&err);
            for (int g = 0; g < S; g++)
                CHECK_OK(kvs_topk_indices(s + (size_t)g * n, n, k, ref + (size_t)g * k, &err), &err);
            CHECK_OK(kvs_gpu_topk(ws, ds, S, n, k, dout, &err), &err);
            CHECK_OK(kvs_gpu_sync(ws, &err), &err);
            CHECK(!kg_download(got, dout, sizeof(int32_t) * (size_t)S * k));
            for (int g = 0; g < S; g++)
                CHECK_MSG(!memcmp(got + (size_t)g * k, ref + (size_t)g * k, sizeof(int32_t) * (size_t)k),
                          "top-k segment %d n=%d k=%d differs (first gpu %d cpu %d)", g, n, k,
                          (int)got[(size_t)g * k], (int)ref[(size_t)g * k]);
            kvs_gpu_free(dout);
            free(ref);
            free(got);
        }
        /* a NaN score is an error naming the segment and token */
        if (n >= 2) {
            float nanv = NAN;
            kvs_err err;
            kvs_err_clear(&err);
            CHECK_OK(kvs_gpu_memcpy_h2d(ds + 1, &nanv, sizeof nanv, &err), &err);
            int32_t *dout = kg_alloc_poisoned(sizeof(int32_t) * (size_t)S);
            CHECK_OK(kvs_gpu_topk(ws, ds, S, n, 1, dout, &err), &err);
            CHECK_FAILS(kvs_gpu_sync(ws, &err), KVS_ERR_NUMERIC, &err, "token 1 is NaN");
            kvs_gpu_free(dout);
        }
        kvs_gpu_free(ds);
        free(s);
    }
}

static void test_pool(kvs_gpu_workspace *ws, uint64_t *rng) {
    const int ns[] = {1, 5, 300};
    const int ks[] = {1, 2, 7, 8, 33};
    for (size_t ni = 0; ni < 3; ni++)
        for (size_t ki = 0; ki < 5; ki++)
            for (int is_max = 0; is_max < 2; is_max++) {
                const int n = ns[ni], k = ks[ki], R = 3;
                float *x = malloc(sizeof(float) * (size_t)R * n), *ref = malloc(sizeof(float) * (size_t)R * n);
                float *got = malloc(sizeof(float) * (size_t)R * n);
                for (int i = 0; i < R * n; i++) x[i] = (float)kvs_rng_normal(rng);
                for (int r = 0; r < R; r++)
                    (is_max ? kvs_pool1d_max : kvs_pool1d_avg)(x + (size_t)r * n, n, k, ref + (size_t)r * n);
                float *dx = kg_upload(x, sizeof(float) * (size_t)R * n);
                float *dout = kg_alloc_poisoned(sizeof(float) * (size_t)R * n);
                kvs_err err;
                kvs_err_clear(&err);
                CHECK_OK(kvs_gpu_pool1d(ws, dx, R, n, k, is_max, dout, &err), &err);
                CHECK_OK(kvs_gpu_sync(ws, &err), &err);
                CHECK(!kg_download(got, dout, sizeof(float) * (size_t)R * n));
                const double e = kg_max_err(got, ref, (size_t)R * n);
                CHECK_MSG(is_max ? e == 0.0 : e <= 1e-6, "pool %s n=%d k=%d: max err %g",
                          is_max ? "max" : "avg", n, k, e);
                kvs_gpu_free(dx);
                kvs_gpu_free(dout);
                free(x);
                free(ref);
                free(got);
            }
}

/* Both tile paths: tensor cores (fp16 / bf16 inputs) and CUDA cores. */
static void test_attention(kvs_gpu_workspace *ws, uint64_t *rng) {
    const int Ns[] = {70, 300};
    for (int tc = 0; tc < 2; tc++)
    for (int ti = 0; ti < 3; ti++)
        for (int ni = 0; ni < 2; ni++)
            for (int qi = 0; qi < 2; qi++) {
                const int tc_on = kvs_gpu_workspace_tensor_cores(ws, tc);
                if (tc && !tc_on && ti == 0 && ni == 0 && qi == 0)
                    printf("  tensor cores unavailable: the second pass repeats CUDA cores\n");
                const int N = Ns[ni], Hq = 4, H = 2, d = ni ? 64 : 80, Nq = qi ? 17 : N;
                kvs_dense_cache dc;
                if (kg_synth(1, Hq, H, d, N, Nq, 0.4, kvs_rng_next(rng), &dc)) {
                    CHECK(0);
                    continue;
                }
                kg_cache c;
                if (kg_cache_make(&dc, kDtypes[ti], &c)) {
                    CHECK(0);
                    kvs_dense_cache_free(&dc);
                    continue;
                }
                const kvs_view *hq = &c.hl[0].q, *hk = &c.hl[0].k, *gq = &c.dl[0].q, *gk = &c.dl[0].k;
                kvs_err err;
                kvs_err_clear(&err);
                float *lse = malloc(sizeof(float) * (size_t)Hq * Nq), *glse = malloc(sizeof(float) * (size_t)Hq * Nq);
                float *cs = malloc(sizeof(float) * (size_t)H * N), *gcs = malloc(sizeof(float) * (size_t)H * N);
                CHECK_OK(kvs_attn_lse(hq, hk, lse, 1, &err), &err);
                CHECK_OK(kvs_attn_colsum(hq, hk, lse, cs, NULL, 1, &err), &err);
                float *dlse = kg_alloc_poisoned(sizeof(float) * (size_t)Hq * Nq);
                float *dcs = kg_alloc_poisoned(sizeof(float) * (size_t)H * N);
                CHECK_OK(kvs_gpu_attn_lse(ws, gq, gk, dlse, &err), &err);
                CHECK_OK(kvs_gpu_attn_colsum(ws, gq, gk, dlse, dcs, &err), &err);
                CHECK_OK(kvs_gpu_sync(ws, &err), &err);
                CHECK(!kg_download(glse, dlse, sizeof(float) * (size_t)Hq * Nq) &&
                      !kg_download(gcs, dcs, sizeof(float) * (size_t)H * N));
                const double el = kg_max_err(glse, lse, (size_t)Hq * Nq);
                CHECK_MSG(el <= 1e-4 * (1.0 + kg_max_abs(lse, (size_t)Hq * Nq)), "%s N=%d Nq=%d tc=%d: lse max err %g",
                          kvs_dtype_name(kDtypes[ti]), N, Nq, tc_on, el);
                const double sc = kg_max_abs(cs, (size_t)H * N), ec = kg_max_err(gcs, cs, (size_t)H * N);
                CHECK_MSG(ec <= 1e-4 * sc, "%s N=%d Nq=%d tc=%d: colsum max err %g (max %g)",
                          kvs_dtype_name(kDtypes[ti]), N, Nq, tc_on, ec, sc);
                for (int mi = 0; mi < 2; mi++) {
                    const uint8_t *mod = mi ? dc.modality : NULL;
                    kvs_entropy_stats r, g;
                    CHECK_OK(kvs_attn_entropies(hq, hk, lse, mod, &r, 1, &err), &err);
                    CHECK_OK(kvs_gpu_attn_entropies(ws, gq, gk, dlse, mod, &g, &err), &err);
                    CHECK_NEAR(g.plain, r.plain, 1e-4);
                    CHECK_NEAR(g.e_tv, r.e_tv, 1e-4);
                    CHECK_NEAR(g.e_vt, r.e_vt, 1e-4);
                    CHECK_EQ_INT(g.n_tv, r.n_tv);
                    CHECK_EQ_INT(g.n_vt, r.n_vt);
                }
                kvs_gpu_free(dlse);
                kvs_gpu_free(dcs);
                free(lse);
                free(glse);
                free(cs);
                free(gcs);
                kg_cache_free(&c);
                kvs_dense_cache_free(&dc);
            }
}

/* CPU and GPU assignment of one head; marks in skip[] the slots touched by
 * a tolerated tie (cosines within 1e-5). Returns the number of real
 * differences. */
static int cmp_assign(kvs_gpu_workspace *ws, const kvs_view *hk, const kvs_view *dk, int h,
                      const int32_t *kept, int B, unsigned char *skip) {
    const int N = hk->n_tokens, d = hk->head_dim;
    int32_t *ra = malloc(sizeof(int32_t) * (size_t)N), *ga = malloc(sizeof(int32_t) * (size_t)N);
    float *ke = malloc(sizeof(float) * (size_t)d * 3);
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_merge_assign(hk, h, kept, B, ra, &err), &err);
    int32_t *dkept = kg_upload(kept, sizeof(int32_t) * (size_t)B);
    int32_t *dassign = kg_alloc_poisoned(sizeof(int32_t) * (size_t)N);
    CHECK_OK(kvs_gpu_merge_assign(ws, dk, h, dkept, B, dassign, &err), &err);
    CHECK_OK(kvs_gpu_sync(ws, &err), &err);
    CHECK(!kg_download(ga, dassign, sizeof(int32_t) * (size_t)N));
    int real = 0, ties = 0;
    for (int n = 0; n < N; n++) {
        if (ra[n] == ga[n]) continue;
        if (ra[n] >= 0 && ga[n] >= 0 && ga[n] < B) {
            kvs_view_rows_f32(hk, h, n, 1, ke);
            kvs_view_rows_f32(hk, h, kept[ra[n]], 1, ke + d);
            kvs_view_rows_f32(hk, h, kept[ga[n]], 1, ke + 2 * d);
            if (fabs(kg_cos(ke, ke + d, d) - kg_cos(ke, ke + 2 * d, d)) <= 1e-5) {
                ties++;
                if (skip) skip[ra[n]] = skip[ga[n]] = 1;
                continue;
            }
        }
        if (real < 3) fprintf(stderr, "assign head %d token %d: gpu %d cpu %d\n", h, n, ga[n], ra[n]);
        real++;
    }
    if (ties) printf("  head %d: %d assignment ties tolerated\n", h, ties);
    kvs_gpu_free(dkept);
    kvs_gpu_free(dassign);
    free(ra);
    free(ga);
    free(ke);
    return real;
}

static void random_subset(uint64_t *rng, int N, int B, int32_t *out) {
    /* selection sampling: ascending, unique */
    int need = B;
    for (int n = 0; n < N && need > 0; n++)
        if (kvs_rng_uniform(rng) * (N - n) < need) out[B - need--] = n;
}

static void test_merge_apply(kvs_gpu_workspace *ws, uint64_t *rng) {
    for (int ti = 0; ti < 3; ti++) {
        const int L = 2, H = 2, d = 64, N = 400;
        kvs_dense_cache dc;
        if (kg_synth(L, 2, H, d, N, 0, 0.0, kvs_rng_next(rng), &dc)) {
            CHECK(0);
            continue;
        }
        kg_cache c;
        if (kg_cache_make(&dc, kDtypes[ti], &c)) {
            CHECK(0);
            kvs_dense_cache_free(&dc);
            continue;
        }
        const int Bs[] = {1, 37, 399, 400};
        for (int bi = 0; bi < 4; bi++) {
            const int B = Bs[bi];
            int32_t *kept = malloc(sizeof(int32_t) * (size_t)B);
            random_subset(rng, N, B, kept);
            for (int h = 0; h < H; h++)
                CHECK_MSG(cmp_assign(ws, &c.hl[0].k, &c.dl[0].k, h, kept, B, NULL) == 0,
                          "%s B=%d head %d: assignment differs", kvs_dtype_name(kDtypes[ti]), B, h);
            free(kept);
        }
        for (int m = KVS_MERGE_NONE; m <= KVS_MERGE_WEIGHTED; m++) {
            const int budgets[2] = {1 + (int)(kvs_rng_uniform(rng) * 100), N};
            kvs_plan plan;
            kvs_err err;
            kvs_err_clear(&err);
            CHECK_OK(kvs_plan_init(&plan, "test", L, H, N, budgets, &err), &err);
            plan.merge = (kvs_merge)m;
            for (int l = 0; l < L; l++)
                for (int h = 0; h < H; h++)
                    random_subset(rng, N, budgets[l], plan.layers[l].idx + (size_t)h * budgets[l]);
            kvs_dense_cache ref;
            CHECK_OK(kvs_apply(&c.host, &plan, &ref, &err), &err);
            for (int l = 0; l < L; l++) {
                const int B = budgets[l];
                const size_t n = (size_t)H * B * d;
                float *dk = kg_alloc_poisoned(sizeof(float) * n), *dv = kg_alloc_poisoned(sizeof(float) * n);
                float *gk = malloc(sizeof(float) * n), *gv = malloc(sizeof(float) * n);
                unsigned char *skip = calloc((size_t)H * B, 1);
                CHECK_OK(kvs_gpu_apply_layer(ws, &c.dl[l], &plan, l, dk, dv, &err), &err);
                CHECK_OK(kvs_gpu_sync(ws, &err), &err);
                CHECK(!kg_download(gk, dk, sizeof(float) * n) && !kg_download(gv, dv, sizeof(float) * n));
                if (m != KVS_MERGE_NONE && B < N)
                    for (int h = 0; h < H; h++)
                        CHECK(cmp_assign(ws, &c.hl[l].k, &c.dl[l].k, h, plan.layers[l].idx + (size_t)h * B,
                                         B, skip + (size_t)h * B) == 0);
                char what[96];
                snprintf(what, sizeof what, "apply %s merge=%s layer %d B=%d",
                         kvs_dtype_name(kDtypes[ti]), kvs_merge_name((kvs_merge)m), l, B);
                if (ref.layers)
                    CHECK_MSG(kg_cmp_merged(gk, gv, ref.layers[l].k, ref.layers[l].v, H, B, d, skip,
                                            1e-4, what) == 0, "%s", what);
                kvs_gpu_free(dk);
                kvs_gpu_free(dv);
                free(gk);
                free(gv);
                free(skip);
            }
            kvs_dense_cache_free(&ref);
            kvs_plan_free(&plan);
        }
        kg_cache_free(&c);
        kvs_dense_cache_free(&dc);
    }
}

int main(void) {
    int rc = kg_device_or_skip("test_gpu_kernels");
    if (rc) return rc;
    uint64_t seed = kg_seed(), rng = seed;
    kvs_shape mx = {3, 5000, 2, 4, 80, 0, 1}; /* S = 5 top-k segments <= L * Hkv */
    kvs_gpu_workspace *ws = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_workspace_init(&ws, &mx, &err) != KVS_OK) {
        fprintf(stderr, "workspace: %s\n", err.msg);
        return 1;
    }
    printf("device: %s\n", kvs_gpu_workspace_device(ws));
    test_dct(ws, &rng);
    test_flashcache_layer(ws, &rng);
    test_topk(ws, &rng);
    test_pool(ws, &rng);
    test_attention(ws, &rng);
    kvs_gpu_workspace_tensor_cores(ws, 1);
    test_merge_apply(ws, &rng);
    kvs_gpu_workspace_free(ws);
    printf("%d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
