/*
 * dct.c -- orthonormal DCT-II / DCT-III of d columns of length N via one real
 * FFT per column (FFTW single precision). See dct.h for definitions, layouts
 * and the thread rules.
 *
 * Makhoul's algorithm (any N >= 1). Let Y[k] = sum_n x[n] cos(pi (2n+1) k /
 * (2N)) be the unnormalised DCT-II, so X[k] = a_k Y[k].
 *   permute: v[p] = x[2p] (p < ceil(N/2)), v[N-1-p] = x[2p+1] (p < floor(N/2))
 *   V = FFT_N(v) (real-to-complex, k = 0..N/2), W = exp(-i pi / (2N)):
 *   Y[k] = Re(W^k V[k]) and, by the conjugate symmetry of V, Y[N-k] =
 *   -Im(W^k V[k]); with c = cos(pi k / 2N), s = sin(pi k / 2N), V = a + ib:
 *   Y[k] = c a + s b, Y[N-k] = s a - c b.
 * Inverse: V[k] = W^-k (Y[k] - i Y[N-k]) (Y[N] = 0) = (c y1 + s y2) +
 *   i (s y1 - c y2), v = IFFT_N(V) = c2r(V) / N, then undo the permutation.
 * The orthonormal factors a_k and the 1/N are folded into the twiddles.
 * Speed: the permutation, twiddle and transpose loops are memory-bound
 * streams; GCC's -O2 cost model leaves them scalar, so this file asks GCC for
 * -O3 (loop vectorisation). Results do not depend on it: no reassociation.
 * What it is not: no planning during execution, no thread pool, no GPU.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "dct.h"

#include <assert.h>
#include <fftw3.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kvs_dct_plan {
    int n, d, h;         /* h = N/2 + 1 complex outputs per column */
    float *v;            /* [d][N] permuted columns (r2c input / c2r output) */
    fftwf_complex *V;    /* [d][h] spectra */
    float *t;            /* [d][N] row-major path: transposed block */
    float *cs, *sn;      /* [h] cos, sin of pi k / (2N) */
    fftwf_plan r2c, c2r;
};

int kvs_dct_plan_n(const kvs_dct_plan *p) { return p->n; }
int kvs_dct_plan_d(const kvs_dct_plan *p) { return p->d; }

void kvs_dct_plan_destroy(kvs_dct_plan *p) {
    if (!p) return;
    if (p->r2c) fftwf_destroy_plan(p->r2c);
    if (p->c2r) fftwf_destroy_plan(p->c2r);
    fftwf_free(p->v);
    fftwf_free(p->V);
    fftwf_free(p->t);
    free(p->cs);
    free(p->sn);
    free(p);
}

kvs_status kvs_dct_plan_create(int N, int d, kvs_dct_plan **out, kvs_err *err) {
    kvs_status st = KVS_OK;
    kvs_dct_plan *p = NULL;
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "dct: NULL output");
    *out = NULL;
    if (N < 1 || d < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d must be >= 1", N, d);
    if ((int64_t)N * d > INT32_MAX / 2)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d exceeds 2^30 elements",
                          N, d);
    p = calloc(1, sizeof *p);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
    p->n = N;
    p->d = d;
    p->h = N / 2 + 1;
    const size_t nd = (size_t)N * (size_t)d;
    p->v = fftwf_malloc(sizeof(float) * nd);
    p->t = fftwf_malloc(sizeof(float) * nd);
    p->V = fftwf_malloc(sizeof(fftwf_complex) * (size_t)p->h * (size_t)d);
    p->cs = malloc(sizeof(float) * (size_t)p->h);
    p->sn = malloc(sizeof(float) * (size_t)p->h);
    if (!p->v || !p->t || !p->V || !p->cs || !p->sn) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
        goto cleanup;
    }
    for (int k = 0; k < p->h; k++) {
        const double a = 3.14159265358979323846 * (double)k / (2.0 * (double)N);
        p->cs[k] = (float)cos(a);
        p->sn[k] = (float)sin(a);
    }
    int n[1] = {N};
    /* FFTW's planner is not re-entrant; the server and the runner may compress
     * on several threads at once, so make it thread-safe once per process
     * (fftw3f_threads; the only process-wide state kvsieve touches). */
    static pthread_once_t planner_once = PTHREAD_ONCE_INIT;
    pthread_once(&planner_once, fftwf_make_planner_thread_safe);
    p->r2c = fftwf_plan_many_dft_r2c(1, n, d, p->v, NULL, 1, N, p->V, NULL, 1, p->h,
                                     FFTW_ESTIMATE);
    p->c2r = fftwf_plan_many_dft_c2r(1, n, d, p->V, NULL, 1, p->h, p->v, NULL, 1, N,
                                     FFTW_ESTIMATE);
    if (!p->r2c || !p->c2r) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL, "dct: FFTW could not plan N=%d d=%d", N, d);
        goto cleanup;
    }
    *out = p;
    p = NULL;
cleanup:
    kvs_dct_plan_destroy(p);
    return st;
}

void kvs_transpose_f32(const float *in, int rows, int cols, float *out) {
    /* Tiles of T x T; the inner loop writes contiguous output. Reads walk a
     * tile's rows, which stay in L1 for the whole tile. */
    enum { T = 16 };
    for (int r0 = 0; r0 < rows; r0 += T) {
        const int r1 = r0 + T < rows ? r0 + T : rows;
        for (int c0 = 0; c0 < cols; c0 += T) {
            const int c1 = c0 + T < cols ? c0 + T : cols;
            for (int c = c0; c < c1; c++) {
                float *o = out + (int64_t)c * rows; /* [rows] */
                for (int r = r0; r < r1; r++) o[r] = in[(int64_t)r * cols + c];
            }
        }
    }
}

kvs_status kvs_dct2_ortho_cols(kvs_dct_plan *p, const float *x, float *X, kvs_err *err) {
    if (!p || !x || !X) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct2_ortho: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    for (int c = 0; c < d; c++) { /* permute into v; x is fully read before X is written */
        const float *xc = x + (int64_t)c * N; /* [N] */
        float *vc = p->v + (int64_t)c * N;     /* [N] */
        for (int q = 0; q < ne; q++) vc[q] = xc[2 * q];
        for (int q = 0; q < no; q++) vc[N - 1 - q] = xc[2 * q + 1];
    }
    fftwf_execute(p->r2c);
    const float s0 = (float)sqrt(1.0 / N), s1 = (float)sqrt(2.0 / N);
    for (int c = 0; c < d; c++) {
        const fftwf_complex *Vc = p->V + (int64_t)c * h; /* [h] */
        float *Xc = X + (int64_t)c * N;                  /* [N] */
        Xc[0] = s0 * Vc[0][0];
        for (int k = 1; k < h; k++) /* k = 1 .. floor(N/2) */
            Xc[k] = s1 * (p->cs[k] * Vc[k][0] + p->sn[k] * Vc[k][1]);
        for (int k = 1; k < no + (N & 1); k++) /* N - k = N-1 .. floor(N/2)+1 */
            Xc[N - k] = s1 * (p->sn[k] * Vc[k][0] - p->cs[k] * Vc[k][1]);
    }
    return KVS_OK;
}

kvs_status kvs_dct3_ortho_cols(kvs_dct_plan *p, const float *X, float *x, kvs_err *err) {
    if (!p || !X || !x) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct3_ortho: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    /* Y[k] = X[k] / a_k; with the 1/N of the inverse FFT: k = 0 scales by
     * sqrt(N)/N = 1/sqrt(N), k > 0 by sqrt(N/2)/N = 1/sqrt(2N). */
    const float s0 = (float)(1.0 / sqrt((double)N)), s1 = (float)(1.0 / sqrt(2.0 * N));
    for (int c = 0; c < d; c++) {
        const float *Xc = X + (int64_t)c * N; /* [N] */
        fftwf_complex *Vc = p->V + (int64_t)c * h;
        Vc[0][0] = s0 * Xc[0];
        Vc[0][1] = 0.0f;
        for (int k = 1; k < h; k++) {
            const float y1 = s1 * Xc[k], y2 = s1 * Xc[N - k], ck = p->cs[k], sk = p->sn[k];
            Vc[k][0] = ck * y1 + sk * y2;
            Vc[k][1] = sk * y1 - ck * y2;
        }
    }
    fftwf_execute(p->c2r);
    for (int c = 0; c < d; c++) {
        const float *vc = p->v + (int64_t)c * N; /* [N] */
        float *xc = x + (int64_t)c * N;
        for (int q = 0; q < ne; q++) xc[2 * q] = vc[q];
        for (int q = 0; q < no; q++) xc[2 * q + 1] = vc[N - 1 - q];
    }
    return KVS_OK;
}

kvs_status kvs_dct2_ortho(kvs_dct_plan *p, const float *x, float *X, kvs_err *err) {
    if (!p || !x || !X) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct2_ortho: NULL argument");
    kvs_transpose_f32(x, p->n, p->d, p->t); /* [N][d] -> [d][N] */
    kvs_status st = kvs_dct2_ortho_cols(p, p->t, p->t, err);
    if (st) return st;
    kvs_transpose_f32(p->t, p->d, p->n, X); /* [d][N] -> [N][d] */
    return KVS_OK;
}

kvs_status kvs_dct3_ortho(kvs_dct_plan *p, const float *X, float *x, kvs_err *err) {
    if (!p || !X || !x) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct3_ortho: NULL argument");
    kvs_transpose_f32(X, p->n, p->d, p->t);
    kvs_status st = kvs_dct3_ortho_cols(p, p->t, p->t, err);
    if (st) return st;
    kvs_transpose_f32(p->t, p->d, p->n, x);
    return KVS_OK;
}
