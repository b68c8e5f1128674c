/*
 * test_dct.c -- methods/dct.h: the orthonormal DCT-II / DCT-III pair on
 * [N][d] and [d][N] column batches, against a naive double-precision DCT
 * written here (small N) and against FFTW's own REDFT10 / REDFT01 kinds
 * (large N), plus round trip, Parseval, in-place use and the error paths.
 */
#include "dct.h"

#include <fftw3.h>
#include "test_util.h"

#include <math.h>
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
    const int Ns[] = {1, 2, 3, 5, 8, 16, 17, 64, 100, 257};
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

int main(void) {
    test_hand();
    test_against_naive();
    test_errors();
    test_cols_and_fftw();
    return kvs_test_finish("test_dct");
}
