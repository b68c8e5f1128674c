/*
 * test_dct.c -- kernels/dct.h: the orthonormal DCT-II / DCT-III pair on
 * [N][d] and [d][N] column batches, against a naive double-precision DCT
 * written here (small N) and against FFTW's own REDFT10 / REDFT01 kinds
 * (large N), plus round trip, Parseval, in-place use and the error paths;
 * and FlashCache's fused kvs_dct_lowpass_sqres, bit for bit against the
 * unfused transpose / DCT-II / zeroing / DCT-III / residual it replaces.
 * Both routes (direct FFTW, Bluestein) at any length against a float64 DCT;
 * Bluestein's fused low-pass against the direct one; the plan cache (plans
 * made once per size) and plans used on several threads at once.
 */
#include "dct.h"

#include <fftw3.h>
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>

#define KVS_PI 3.14159265358979323846

/* Naive orthonormal DCT-II of every column, in double. x, X are [N][d]. */
static void naive_dct2(const float *x, double *X, int N, int d) {
    for (int c = 0; c < d; c++)
        for (int m = 0; m < N; m++) {
            double a = m == 0 ? sqrt(1.0 / N) : sqrt(2.0 / N), s = 0.0;
            for (int n = 0; n < N; n++)
                s += (double)x[n * d + c] * cos(KVS_PI * (2.0 * n + 1.0) * m / (2.0 * N));
            X[m * d + c] = a * s;
        }
}

static double rel_err_f(const float *a, const double *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_against_naive(void) {
    const int Ns[] = {1, 2, 3, 4, 5, 6, 8, 10, 16, 17, 64, 100, 257, 1540};
    const int ds[] = {1, 3, 4, 8};
    uint64_t rng = 42;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof ds / sizeof ds[0]; b++) {
            const int N = Ns[a], d = ds[b], nd = N * d;
            kvs_err e_ = {0}, *e = &e_;
            kvs_dct_plan *p = NULL;
            CHECK_OK(kvs_dct_plan_create(N, d, &p, e), e);
            if (!p) continue;
            CHECK_EQ_INT(kvs_dct_plan_n(p), N);
            CHECK_EQ_INT(kvs_dct_plan_d(p), d);
            float *x = malloc(sizeof(float) * (size_t)nd), *X = malloc(sizeof(float) * (size_t)nd);
            float *y = malloc(sizeof(float) * (size_t)nd), *x0 = malloc(sizeof(float) * (size_t)nd);
            double *ref = malloc(sizeof(double) * (size_t)nd), *xd = malloc(sizeof(double) * (size_t)nd);
            for (int i = 0; i < nd; i++) x0[i] = x[i] = (float)(kvs_rng_normal(&rng) + (i % d));
            naive_dct2(x, ref, N, d);
            CHECK_OK(kvs_dct2_ortho(p, x, X, e), e);
            double err2 = rel_err_f(X, ref, nd);
            CHECK_MSG(err2 < 1e-6, "N=%d d=%d: DCT-II vs naive rel err %.3g", N, d, err2);
            CHECK_MSG(memcmp(x, x0, sizeof(float) * (size_t)nd) == 0, "N=%d d=%d: input modified",
                      N, d);
            /* Parseval: sum X^2 == sum x^2 */
            double ex = 0, eX = 0;
            for (int i = 0; i < nd; i++) ex += (double)x[i] * x[i], eX += (double)X[i] * X[i];
            CHECK_MSG(fabs(eX - ex) <= 1e-6 * ex, "N=%d d=%d: Parseval %.9g vs %.9g", N, d, eX, ex);
            /* DCT-III of the naive coefficients gives x back. */
            float *Xf = malloc(sizeof(float) * (size_t)nd);
            for (int i = 0; i < nd; i++) Xf[i] = (float)ref[i], xd[i] = x[i];
            CHECK_OK(kvs_dct3_ortho(p, Xf, y, e), e);
            double err3 = rel_err_f(y, xd, nd);
            CHECK_MSG(err3 < 1e-6, "N=%d d=%d: DCT-III(naive X) vs x rel err %.3g", N, d, err3);
            /* Round trip through our own pair. */
            CHECK_OK(kvs_dct3_ortho(p, X, y, e), e);
            double errr = rel_err_f(y, xd, nd);
            CHECK_MSG(errr < 1e-6, "N=%d d=%d: round trip rel err %.3g", N, d, errr);
            free(Xf);
            free(x);
            free(X);
            free(y);
            free(x0);
            free(ref);
            free(xd);
            kvs_dct_plan_destroy(p);
        }
}

/* Hand case: N = 4, d = 1, x = 1, 1, 1, 1 -> X = (2, 0, 0, 0) (a_0 * 4 =
 * sqrt(1/4) * 4 = 2); x = cos(pi (2n+1) / 8) * sqrt(2/4)... the m = 1 basis
 * vector b_1[n] = sqrt(2/4) cos(pi (2n+1)/8) has X = (0, 1, 0, 0). */
static void test_hand(void) {
    kvs_err e_ = {0}, *e = &e_;
    kvs_dct_plan *p = NULL;
    CHECK_OK(kvs_dct_plan_create(4, 1, &p, e), e);
    if (!p) return;
    float *x = malloc(sizeof(float) * 4), *X = malloc(sizeof(float) * 4);
    for (int n = 0; n < 4; n++) x[n] = 1.0f;
    CHECK_OK(kvs_dct2_ortho(p, x, X, e), e);
    CHECK_NEAR(X[0], 2.0, 1e-6);
    for (int m = 1; m < 4; m++) CHECK_NEAR(X[m], 0.0, 1e-6);
    for (int n = 0; n < 4; n++) x[n] = (float)(sqrt(0.5) * cos(KVS_PI * (2 * n + 1) / 8.0));
    CHECK_OK(kvs_dct2_ortho(p, x, X, e), e);
    CHECK_NEAR(X[0], 0.0, 1e-6);
    CHECK_NEAR(X[1], 1.0, 1e-6);
    CHECK_NEAR(X[2], 0.0, 1e-6);
    CHECK_NEAR(X[3], 0.0, 1e-6);
    free(x);
    free(X);
    kvs_dct_plan_destroy(p);
}

static void test_errors(void) {
    kvs_err e_ = {0}, *e = &e_;
    kvs_dct_plan *p = NULL;
    CHECK_FAILS(kvs_dct_plan_create(0, 4, &p, e), KVS_ERR_INVALID, e, "N=0");
    CHECK(p == NULL);
    CHECK_FAILS(kvs_dct_plan_create(4, 0, &p, e), KVS_ERR_INVALID, e, "d=0");
    CHECK_FAILS(kvs_dct_plan_create(1 << 20, 1 << 12, &p, e), KVS_ERR_INVALID, e, "exceeds");
    CHECK_OK(kvs_dct_plan_create(8, 2, &p, e), e);
    if (!p) return;
    float a[16] = {0};
    CHECK_FAILS(kvs_dct2_ortho(p, NULL, a, e), KVS_ERR_INVALID, e, "NULL");
    CHECK_FAILS(kvs_dct3_ortho_cols(p, a, NULL, e), KVS_ERR_INVALID, e, "NULL");
    kvs_dct_plan_destroy(p);
    kvs_dct_plan_destroy(NULL); /* allowed */
}

/* Column-major API, in-place use, and agreement with FFTW's REDFT10 /
 * REDFT01 (scaled to orthonormal here) at sizes the naive DCT is too slow
 * for, even and odd. */
static void test_cols_and_fftw(void) {
    const int Ns[] = {1000, 1001, 4096};
    const int d = 3;
    uint64_t rng = 7;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++) {
        const int N = Ns[a], nd = N * d;
        kvs_err e_ = {0}, *e = &e_;
        kvs_dct_plan *p = NULL;
        CHECK_OK(kvs_dct_plan_create(N, d, &p, e), e);
        if (!p) continue;
        float *x = malloc(sizeof(float) * nd), *X = malloc(sizeof(float) * nd); /* [d][N] */
        float *y = malloc(sizeof(float) * nd), *ref = fftwf_malloc(sizeof(float) * nd);
        float *in = fftwf_malloc(sizeof(float) * nd);
        for (int i = 0; i < nd; i++) in[i] = x[i] = (float)kvs_rng_normal(&rng);
        int n[1] = {N};
        fftwf_r2r_kind k10[1] = {FFTW_REDFT10}, k01[1] = {FFTW_REDFT01};
        fftwf_plan f = fftwf_plan_many_r2r(1, n, d, in, NULL, 1, N, ref, NULL, 1, N, k10,
                                           FFTW_ESTIMATE);
        fftwf_execute(f);
        fftwf_destroy_plan(f);
        for (int c = 0; c < d; c++)
            for (int m = 0; m < N; m++)
                ref[c * N + m] *= (float)(m ? sqrt(1.0 / (2.0 * N)) : sqrt(1.0 / (4.0 * N)));
        CHECK_OK(kvs_dct2_ortho_cols(p, x, X, e), e);
        double num = 0, den = 0;
        for (int i = 0; i < nd; i++)
            num += ((double)X[i] - ref[i]) * ((double)X[i] - ref[i]), den += (double)ref[i] * ref[i];
        CHECK_MSG(sqrt(num / den) < 1e-6, "N=%d: DCT-II vs FFTW REDFT10 rel err %.3g", N,
                  sqrt(num / den));
        /* DCT-III vs REDFT01 of the orthonormally pre-scaled coefficients. */
        for (int c = 0; c < d; c++)
            for (int m = 0; m < N; m++)
                in[c * N + m] = X[c * N + m] * (float)(m ? sqrt(0.5 / N) : sqrt(1.0 / N));
        f = fftwf_plan_many_r2r(1, n, d, in, NULL, 1, N, ref, NULL, 1, N, k01, FFTW_ESTIMATE);
        fftwf_execute(f);
        fftwf_destroy_plan(f);
        CHECK_OK(kvs_dct3_ortho_cols(p, X, y, e), e);
        num = den = 0;
        for (int i = 0; i < nd; i++)
            num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]), den += (double)ref[i] * ref[i];
        CHECK_MSG(sqrt(num / den) < 1e-6, "N=%d: DCT-III vs FFTW REDFT01 rel err %.3g", N,
                  sqrt(num / den));
        num = den = 0;
        for (int i = 0; i < nd; i++)
            num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]), den += (double)x[i] * x[i];
        CHECK_MSG(sqrt(num / den) < 1e-6, "N=%d: cols round trip rel err %.3g", N, sqrt(num / den));
        /* In place: same numbers as out of place. */
        memcpy(y, x, sizeof(float) * nd);
        CHECK_OK(kvs_dct2_ortho_cols(p, y, y, e), e);
        CHECK(memcmp(y, X, sizeof(float) * nd) == 0);
        CHECK_OK(kvs_dct3_ortho_cols(p, y, y, e), e);
        CHECK_OK(kvs_dct3_ortho_cols(p, X, X, e), e);
        CHECK(memcmp(y, X, sizeof(float) * nd) == 0);
        /* Row-major agrees with column-major on the transposed data. */
        float *r = malloc(sizeof(float) * nd), *R = malloc(sizeof(float) * nd);
        kvs_transpose_f32(x, d, N, r); /* [N][d] */
        CHECK_OK(kvs_dct2_ortho(p, r, R, e), e);
        CHECK_OK(kvs_dct2_ortho_cols(p, x, X, e), e);
        kvs_transpose_f32(R, N, d, y);
        CHECK(memcmp(y, X, sizeof(float) * nd) == 0);
        free(r), free(R);
        free(x), free(X), free(y);
        fftwf_free(ref), fftwf_free(in);
        kvs_dct_plan_destroy(p);
    }
    /* The transpose itself, odd sizes across the 32-block edge. */
    float t[35 * 33], u[35 * 33];
    for (int i = 0; i < 35 * 33; i++) t[i] = (float)i;
    kvs_transpose_f32(t, 35, 33, u);
    int ok = 1;
    for (int r = 0; r < 35; r++)
        for (int c = 0; c < 33; c++) ok &= u[c * 35 + r] == t[r * 33 + c];
    CHECK(ok);
}

/* The unfused computation kvs_dct_lowpass_sqres replaces (what FlashCache
 * did before): head h of x to fp32 [d][N], DCT-II, energy of m < omega,
 * zero m >= omega, DCT-III, squared residual summed over channels. */
static void lowpass_ref(kvs_dct_plan *p, const kvs_view *x, int h, int omega, double *lo,
                        float *acc /* [N] */) {
    const int N = x->n_tokens, d = x->head_dim;
    const size_t nd = (size_t)N * d;
    float *rows = malloc(sizeof(float) * nd), *xc = malloc(sizeof(float) * nd); /* [N][d], [d][N] */
    float *X = malloc(sizeof(float) * nd), *b = malloc(sizeof(float) * nd);     /* [d][N] each */
    kvs_err e_ = {0}, *e = &e_;
    kvs_view_rows_f32(x, h, 0, N, rows);
    kvs_transpose_f32(rows, N, d, xc); /* [d][N] */
    CHECK_OK(kvs_dct2_ortho_cols(p, xc, X, e), e);
    double s = 0.0;
    for (int c = 0; c < d; c++) {
        float *Xc = X + (size_t)c * N;
        for (int m = 0; m < omega; m++) s += (double)Xc[m] * Xc[m];
        for (int m = omega; m < N; m++) Xc[m] = 0.0f;
    }
    *lo = s;
    CHECK_OK(kvs_dct3_ortho_cols(p, X, b, e), e);
    for (int n = 0; n < N; n++) acc[n] = 0.0f;
    for (int c = 0; c < d; c++)
        for (int n = 0; n < N; n++) {
            const float r = xc[(size_t)c * N + n] - b[(size_t)c * N + n];
            acc[n] += r * r;
        }
    free(rows), free(xc), free(X), free(b);
}

/* Fused == unfused, exactly: shapes with one group, several groups and a
 * narrower last group; omega at the edges (1, N) and on both sides of N/2
 * (where the kept pairs (k, N-k) change); fp32 (contiguous and strided,
 * head > 0), fp16, bf16. */
static void test_lowpass_sqres(void) {
    static const struct {
        int N, d;
    } sh[] = {{1, 1},    {2, 3},     {3, 2},     {5, 4},     {17, 3},    {64, 8},
              {1001, 5}, {2048, 40}, {3001, 24}, {3000, 20}, {1023, 64}, {2048, 256},
              {37, 12},  {15, 9}};
    uint64_t rng = 99;
    int grouped = 0;
    for (size_t a = 0; a < sizeof sh / sizeof sh[0]; a++) {
        const int N = sh[a].N, d = sh[a].d, H = 2, pad = 3, st = d + pad; /* strided rows */
        kvs_err e_ = {0}, *e = &e_;
        kvs_dct_plan *p = NULL;
        CHECK_OK(kvs_dct_plan_create(N, d, &p, e), e);
        if (!p) continue;
        const int g = kvs_dct_plan_group(p);
        CHECK_MSG(g >= 1 && g <= d, "N=%d d=%d: group %d", N, d, g);
        if (g < d) grouped++;
        if (N == 2048 && d == 256) /* the Gemma 3 shape: the L2-sized path is in use */
            CHECK_MSG(g < d, "N=2048 d=256: kvs_dct_plan_group = %d, not grouped", g);
        const size_t ne = (size_t)H * N * st;
        float *f = malloc(sizeof(float) * ne);
        uint16_t *h16 = malloc(sizeof(uint16_t) * ne), *b16 = malloc(sizeof(uint16_t) * ne);
        for (size_t i = 0; i < ne; i++) {
            const size_t n = (i / (size_t)st) % (size_t)N;
            f[i] = (float)(sin(0.01 * (double)n * (1 + i % 3)) + 0.3 * kvs_rng_normal(&rng));
            if (i % 97 == 0) f[i] *= 8.0f; /* outliers */
            h16[i] = kvs_f32_to_f16(f[i]);
            b16[i] = kvs_f32_to_bf16(f[i]);
        }
        kvs_view views[4];
        views[0] = kvs_view_make(f, KVS_F32, H, N, st); /* rows of st floats, */
        views[0].head_dim = d;                          /* the first d used: strided */
        views[1] = kvs_view_make(f, KVS_F32, H, N, d);  /* contiguous [H][N][d] */
        views[2] = kvs_view_make(h16, KVS_F16, H, N, d);
        views[3] = kvs_view_make(b16, KVS_BF16, H, N, d);
        const int omegas[] = {1, N / 5 > 0 ? N / 5 : 1, N / 2, N / 2 + 1, (3 * N) / 4, N};
        float *acc = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
        for (int vi = 0; vi < 4; vi++)
            for (size_t oi = 0; oi < sizeof omegas / sizeof omegas[0]; oi++) {
                const int om = omegas[oi] < 1 ? 1 : (omegas[oi] > N ? N : omegas[oi]);
                const int head = (int)(oi % 2);
                double lo = -1.0, lo_ref = -2.0;
                CHECK_OK(kvs_dct_lowpass_sqres(p, &views[vi], head, om, &lo, acc, e), e);
                lowpass_ref(p, &views[vi], head, om, &lo_ref, ref);
                CHECK_MSG(lo == lo_ref, "N=%d d=%d view %d omega %d: lo %.17g vs %.17g", N, d, vi,
                          om, lo, lo_ref);
                CHECK_MSG(memcmp(acc, ref, sizeof(float) * N) == 0,
                          "N=%d d=%d view %d omega %d: residual differs", N, d, vi, om);
                if (om == N) { /* nothing cut: the residual is round-off only */
                    double ss = 0.0;
                    for (int n = 0; n < N; n++) ss += acc[n];
                    CHECK_MSG(ss <= 1e-8 * lo + 1e-30, "N=%d d=%d: omega = N residual %.3g of %.3g",
                              N, d, ss, lo);
                }
            }
        /* Parseval: lo (omega) + residual = total energy (omega = N / 5). */
        if (N >= 5) {
            double lo = 0.0, tot = 0.0, hi = 0.0;
            CHECK_OK(kvs_dct_lowpass_sqres(p, &views[1], 1, N / 5, &lo, acc, e), e);
            for (int n = 0; n < N; n++) hi += acc[n];
            for (int n = 0; n < N; n++)
                for (int c = 0; c < d; c++) {
                    const double v = f[((size_t)N + n) * d + c];
                    tot += v * v;
                }
            CHECK_MSG(fabs(lo + hi - tot) <= 1e-5 * tot, "N=%d d=%d: lo + hi %.9g vs %.9g", N, d,
                      lo + hi, tot);
        }
        free(f), free(h16), free(b16), free(acc), free(ref);
        kvs_dct_plan_destroy(p);
    }
    CHECK_MSG(grouped >= 3, "only %d shapes took the grouped path", grouped);
}

static void test_lowpass_errors(void) {
    kvs_err e_ = {0}, *e = &e_;
    kvs_dct_plan *p = NULL;
    CHECK_OK(kvs_dct_plan_create(8, 2, &p, e), e);
    if (!p) return;
    float x[2 * 8 * 2] = {0}, acc[8];
    double lo;
    kvs_view v = kvs_view_make(x, KVS_F32, 2, 8, 2);
    CHECK_OK(kvs_dct_lowpass_sqres(p, &v, 1, 3, &lo, acc, e), e);
    CHECK(lo == 0.0);
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, NULL, 0, 3, &lo, acc, e), KVS_ERR_INVALID, e, "NULL");
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &v, 0, 3, NULL, acc, e), KVS_ERR_INVALID, e, "NULL");
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &v, 0, 0, &lo, acc, e), KVS_ERR_INVALID, e, "omega=0");
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &v, 0, 9, &lo, acc, e), KVS_ERR_INVALID, e, "omega=9");
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &v, 2, 3, &lo, acc, e), KVS_ERR_INVALID, e, "head 2");
    kvs_view w = kvs_view_make(x, KVS_F32, 1, 16, 2);
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &w, 0, 3, &lo, acc, e), KVS_ERR_INVALID, e, "N=16 d=2");
    w = v;
    w.device = KVS_CUDA;
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &w, 0, 3, &lo, acc, e), KVS_ERR_UNSUPPORTED, e,
                "device memory");
    w = v;
    w.dtype = KVS_U8;
    CHECK_FAILS(kvs_dct_lowpass_sqres(p, &w, 0, 3, &lo, acc, e), KVS_ERR_INVALID, e, "dtype");
    kvs_dct_plan_destroy(p);
}

/* Float64 orthonormal DCT-II (inv 0) or DCT-III (inv 1) of column-major
 * [d][N] data, exact cosines from a table of cos(pi j / (2N)), j mod 4N. */
static void f64_dct_cols(const float *x, double *y, int N, int d, int inv) {
    double *T = malloc(sizeof(double) * 4 * (size_t)N);
    for (int j = 0; j < 4 * N; j++) T[j] = cos(KVS_PI * j / (2.0 * N));
    for (int c = 0; c < d; c++) {
        const float *xc = x + (size_t)c * N;
        for (int o = 0; o < N; o++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) {
                const int m = inv ? i : o, n = inv ? o : i; /* frequency, token */
                const double a = m == 0 ? sqrt(1.0 / N) : sqrt(2.0 / N);
                s += a * xc[i] * T[(int)(((2 * (int64_t)n + 1) * m) % (4 * N))];
            }
            y[(size_t)c * N + o] = s;
        }
    }
    free(T);
}

static double rel_err_cols(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Any length, either route: DCT-II and DCT-III against the float64 DCT at
 * prime (1021, 1031, 2003, 4099), smooth (1536, 2048) and tiny (1, 2, 3) N;
 * AUTO takes the direct route exactly at 5-smooth N. */
static void test_routes_any_length(void) {
    const int Ns[] = {1, 2, 3, 7, 1001, 1021, 1031, 1400, 1536, 2003, 2048, 2046, 4099};
    const kvs_dct_route routes[] = {KVS_DCT_AUTO, KVS_DCT_DIRECT, KVS_DCT_BLUESTEIN};
    const int d = 3;
    uint64_t rng = 5;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++) {
        const int N = Ns[a];
        const size_t nd = (size_t)N * d;
        /* 1400 = 2 * 700 (700 = 2^2 5^2 7) is direct; 1001 = 7 11 13 (odd) and
         * 2046 = 2 * 3 * 11 * 31 are not */
        const int smooth = N != 7 && N != 1001 && N != 1021 && N != 1031 && N != 2003 &&
                           N != 2046 && N != 4099;
        CHECK_MSG(kvs_dct_route_for(N) == (smooth ? KVS_DCT_DIRECT : KVS_DCT_BLUESTEIN),
                  "N=%d: route %d", N, (int)kvs_dct_route_for(N));
        float *x = malloc(sizeof(float) * nd), *X = malloc(sizeof(float) * nd);
        float *y = malloc(sizeof(float) * nd);
        double *ref = malloc(sizeof(double) * nd), *ref3 = malloc(sizeof(double) * nd);
        for (size_t i = 0; i < nd; i++)
            x[i] = (float)(kvs_rng_normal(&rng) + sin(0.01 * (double)(i % (size_t)N)));
        f64_dct_cols(x, ref, N, d, 0);
        f64_dct_cols(x, ref3, N, d, 1); /* DCT-III of x read as coefficients */
        for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
            kvs_err e_ = {0}, *e = &e_;
            kvs_dct_plan *p = NULL;
            CHECK_OK(kvs_dct_plan_create_opts(N, d, N / 5, routes[r], &p, e), e);
            if (!p) continue;
            const kvs_dct_route got = kvs_dct_plan_route(p);
            CHECK(got == (routes[r] == KVS_DCT_AUTO ? kvs_dct_route_for(N) : routes[r]));
            CHECK_OK(kvs_dct2_ortho_cols(p, x, X, e), e);
            double e2 = rel_err_cols(X, ref, nd);
            CHECK_MSG(e2 < 1e-6, "N=%d route %d: DCT-II vs float64 rel err %.3g", N, (int)got, e2);
            CHECK_OK(kvs_dct3_ortho_cols(p, x, y, e), e);
            double e3 = rel_err_cols(y, ref3, nd);
            CHECK_MSG(e3 < 1e-6, "N=%d route %d: DCT-III vs float64 rel err %.3g", N, (int)got, e3);
            if (got == KVS_DCT_BLUESTEIN) { /* P blocks of L tokens, K = N/2 + 1 outputs */
                const int P = kvs_dct_plan_fft_blocks(p, 0), M = kvs_dct_plan_fft_size(p, 0);
                const int L = (N + P - 1) / P, K = N / 2 + 1;
                CHECK_MSG(P >= 1 && P <= 4 && (P - 1) * L < N && M >= L + 2 * K - 2 && M < 4 * N,
                          "N=%d: Bluestein length %d, %d blocks", N, M, P);
            }
            kvs_dct_plan_destroy(p);
        }
        free(x), free(X), free(y), free(ref), free(ref3);
    }
}

/* FlashCache's fused transform on the Bluestein route (with its shorter
 * low-pass convolution) against the direct route at prime N: energies and
 * per-token residuals agree to float rounding, fp16 input. */
static void test_lowpass_routes(void) {
    const int Ns[] = {1021, 2003, 1031};
    const int d = 24, H = 1;
    uint64_t rng = 77;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++) {
        const int N = Ns[a];
        const size_t ne = (size_t)H * N * d;
        uint16_t *h16 = malloc(sizeof(uint16_t) * ne);
        for (size_t i = 0; i < ne; i++) {
            const size_t n = (i / (size_t)d) % (size_t)N;
            float f = (float)(sin(0.01 * (double)n * (1 + i % 3)) + 0.3 * kvs_rng_normal(&rng));
            if (i % 97 == 0) f *= 8.0f;
            h16[i] = kvs_f32_to_f16(f);
        }
        kvs_view v = kvs_view_make(h16, KVS_F16, H, N, d);
        const int omegas[] = {1, N / 5, N / 2, N / 2 + 1, N};
        float *acc = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
        for (size_t oi = 0; oi < sizeof omegas / sizeof omegas[0]; oi++) {
            const int om = omegas[oi];
            kvs_err e_ = {0}, *e = &e_;
            kvs_dct_plan *pb = NULL, *pd = NULL;
            CHECK_OK(kvs_dct_plan_create_opts(N, d, N / 5, KVS_DCT_BLUESTEIN, &pb, e), e);
            CHECK_OK(kvs_dct_plan_create_opts(N, d, 0, KVS_DCT_DIRECT, &pd, e), e);
            if (!pb || !pd) {
                kvs_dct_plan_destroy(pb), kvs_dct_plan_destroy(pd);
                continue;
            }
            /* N = 2003: the band needs 2802 lags (3072), the full 4005 (4096); at
             * 1021 / 1031 both end at 2048 (1536 gives way to it, see smooth_size) */
            if (om == N / 5)
                CHECK_MSG(N == 2003 ? kvs_dct_plan_fft_size(pb, 1) < kvs_dct_plan_fft_size(pb, 0)
                                    : kvs_dct_plan_fft_size(pb, 1) <= kvs_dct_plan_fft_size(pb, 0),
                          "N=%d: the low-pass band is longer (%d vs %d)", N,
                          kvs_dct_plan_fft_size(pb, 1), kvs_dct_plan_fft_size(pb, 0));
            double lo = 0, lo_ref = 0, mx = 0, diff = 0, tot = 0;
            CHECK_OK(kvs_dct_lowpass_sqres(pb, &v, 0, om, &lo, acc, e), e);
            CHECK_OK(kvs_dct_lowpass_sqres(pd, &v, 0, om, &lo_ref, ref, e), e);
            for (int n = 0; n < N; n++) {
                mx = fmax(mx, fabs((double)acc[n] - ref[n]));
                tot += ref[n];
            }
            diff = fabs(lo - lo_ref);
            CHECK_MSG(diff <= 1e-5 * (lo_ref + tot), "N=%d omega %d: lo %.9g vs %.9g", N, om, lo,
                      lo_ref);
            CHECK_MSG(mx <= 1e-5 * (lo_ref + tot) / N * 50 + 1e-6 * (lo_ref + tot) / N,
                      "N=%d omega %d: residual differs by %.3g (mean %.3g)", N, om, mx, tot / N);
            kvs_dct_plan_destroy(pb);
            kvs_dct_plan_destroy(pd);
        }
        free(h16), free(acc), free(ref);
    }
}

/* Plans are made once per process and size: a second plan of the same
 * (N, d) (direct) or N (Bluestein) adds no cache entry. */
static void test_plan_cache(void) {
    kvs_err e_ = {0}, *e = &e_;
    const int sizes[][3] = {{1000, 5, 200}, {1009, 5, 202}, {1009, 7, 202}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kvs_dct_plan *p = NULL, *q = NULL;
        CHECK_OK(kvs_dct_plan_create_opts(sizes[i][0], sizes[i][1], sizes[i][2], KVS_DCT_AUTO, &p,
                                          e), e);
        const int after_first = kvs_dct_plan_cache_entries();
        CHECK_OK(kvs_dct_plan_create_opts(sizes[i][0], sizes[i][1], sizes[i][2], KVS_DCT_AUTO, &q,
                                          e), e);
        CHECK_MSG(kvs_dct_plan_cache_entries() == after_first,
                  "N=%d d=%d: a second plan added cache entries (%d -> %d)", sizes[i][0],
                  sizes[i][1], after_first, kvs_dct_plan_cache_entries());
        kvs_dct_plan_destroy(p);
        kvs_dct_plan_destroy(q);
    }
}

/* Plans created, used and destroyed on several threads at once (the cache's
 * mutex): every thread's transform equals the one made on the main thread. */
typedef struct {
    int N;
    const float *x;
    const float *want;
    int ok;
} thr_job;

static void *thr_main(void *arg) {
    thr_job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 4; r++) {
        kvs_err e = {0};
        kvs_dct_plan *p = NULL;
        float *X = malloc(sizeof(float) * 2 * (size_t)j->N);
        if (kvs_dct_plan_create(j->N, 2, &p, &e) || kvs_dct2_ortho_cols(p, j->x, X, &e) ||
            memcmp(X, j->want, sizeof(float) * 2 * (size_t)j->N))
            j->ok = 0;
        kvs_dct_plan_destroy(p);
        free(X);
    }
    return NULL;
}

static void test_threads(void) {
    enum { T = 4 };
    const int Ns[T] = {997, 1009, 1200, 1013};
    thr_job jobs[T];
    float *xs[T], *ws[T];
    uint64_t rng = 3;
    for (int t = 0; t < T; t++) {
        const int N = Ns[t];
        xs[t] = malloc(sizeof(float) * 2 * N);
        ws[t] = malloc(sizeof(float) * 2 * N);
        for (int i = 0; i < 2 * N; i++) xs[t][i] = (float)kvs_rng_normal(&rng);
        kvs_err e_ = {0}, *e = &e_;
        kvs_dct_plan *p = NULL;
        CHECK_OK(kvs_dct_plan_create(N, 2, &p, e), e);
        if (p) CHECK_OK(kvs_dct2_ortho_cols(p, xs[t], ws[t], e), e);
        kvs_dct_plan_destroy(p);
        jobs[t] = (thr_job){N, xs[t], ws[t], 0};
    }
    pthread_t th[T];
    for (int t = 0; t < T; t++) CHECK(pthread_create(&th[t], NULL, thr_main, &jobs[t]) == 0);
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK_MSG(jobs[t].ok, "thread %d (N=%d): plan or transform differs", t, Ns[t]);
        free(xs[t]), free(ws[t]);
    }
}

int main(void) {
    test_hand();
    test_against_naive();
    test_errors();
    test_cols_and_fftw();
    test_lowpass_sqres();
    test_lowpass_errors();
    test_routes_any_length();
    test_lowpass_routes();
    test_plan_cache();
    test_threads();
    return kvs_test_finish("test_dct");
}
