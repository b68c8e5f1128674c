/*
 * dct.h -- orthonormal DCT-II / DCT-III along the token axis, batched over
 * the d channels of one KV head (FFTW single precision).
 *
 * What it is: the transform FlashCache (methods/flashcache.c) uses, exposed so
 * the latency benchmark and the GPU parity tests can reuse exactly the same
 * CPU reference. Two layouts:
 *   - row-major [N][d] (a head as the cache stores it): column c is the
 *     sequence x[n] = a[n*d + c], n = 0..N-1;
 *   - column-major [d][N] ("_cols"): column c is a[c*N + n] (what FlashCache
 *     works in after one transpose, so no further transposes are needed).
 *
 *   DCT-II  (kvs_dct2_ortho*): X[m] = a_m sum_n x[n] cos(pi (2n+1) m / (2N)),
 *                              a_0 = sqrt(1/N), a_m = sqrt(2/N) for m > 0.
 *   DCT-III (kvs_dct3_ortho*): its inverse, x[n] = sum_m a_m X[m] cos(...).
 * Both are orthonormal, so sum_m X[m]^2 = sum_n x[n]^2 (Parseval).
 *
 * How (dct.c): Makhoul's N-point algorithm, one real FFT of length N per
 * column (fftwf_plan_many_dft_r2c / c2r over contiguous columns) plus an
 * O(N) permutation and twiddle, for any N >= 1. Measured on this project's
 * CPU it is 3-6x faster than FFTW's own REDFT10/REDFT01 r2r kinds batched with
 * stride d (those have no SIMD codelets); the tests cross-check the two.
 *
 * What it is not: no planning at execution time, no threads of its own, no
 * GPU code (kernels/ holds the cuFFT version).
 *
 * Thread safety: FFTW's planner is not thread-safe, so kvs_dct_plan_create
 * and kvs_dct_plan_destroy must not run concurrently with any other FFTW
 * planning in the process (callers serialise them, e.g. in a method's
 * create()). A plan owns its scratch buffers, so one plan may be executed by
 * one thread at a time; threads that transform concurrently each need their
 * own plan. in and out may be the same buffer; any alignment is accepted.
 */
#ifndef KVS_DCT_H
#define KVS_DCT_H

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_dct_plan kvs_dct_plan;

/* Plans for one (N, d): N >= 1 tokens, d >= 1 channels. FFTW_ESTIMATE, so it
 * takes about a millisecond and never touches caller data. Allocates scratch
 * of about 4 N d floats. Not thread-safe (see above). */
kvs_status kvs_dct_plan_create(int N, int d, kvs_dct_plan **out, kvs_err *err);
void kvs_dct_plan_destroy(kvs_dct_plan *p); /* NULL is fine */
int kvs_dct_plan_n(const kvs_dct_plan *p);
int kvs_dct_plan_d(const kvs_dct_plan *p);

/* Row-major: x, X are [N][d]. */
kvs_status kvs_dct2_ortho(kvs_dct_plan *p, const float *x, float *X, kvs_err *err);
kvs_status kvs_dct3_ortho(kvs_dct_plan *p, const float *X, float *x, kvs_err *err);

/* Column-major: x, X are [d][N]. */
kvs_status kvs_dct2_ortho_cols(kvs_dct_plan *p, const float *x, float *X, kvs_err *err);
kvs_status kvs_dct3_ortho_cols(kvs_dct_plan *p, const float *X, float *x, kvs_err *err);

/* Blocked transpose of a [rows][cols] matrix into [cols][rows] (out != in). */
void kvs_transpose_f32(const float *in, int rows, int cols, float *out);

#ifdef __cplusplus
}
#endif
#endif /* KVS_DCT_H */
