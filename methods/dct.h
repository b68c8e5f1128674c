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
 * kvs_dct_lowpass_sqres is FlashCache's transform, low-pass and residual
 * fused over L2-sized column groups (bit for bit the unfused steps).
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

/* FlashCache's low-pass residual of head `head` of a [N][d] view x (fp32,
 * fp16 or bf16, any strides), fused: with X the DCT-II of every column c,
 * base the DCT-III of X with X[m >= omega] = 0 (1 <= omega <= N):
 *   *lo    = sum_c sum_{m < omega} X_c[m]^2   (double; c, then m ascending)
 *   acc[n] = sum_c (x_c[n] - base_c[n])^2     (fp32, c ascending), acc [N]
 * Bit for bit what transposing to [d][N], kvs_dct2_ortho_cols, zeroing
 * X[m >= omega], kvs_dct3_ortho_cols and those two loops give (the same float
 * operations in the same order; tests/methods1/test_dct.c checks it). The
 * head is read once, row chunks transposed straight into the permuted FFT
 * input; then groups of kvs_dct_plan_group(p) columns go through FFT,
 * low-pass, inverse FFT and residual while their spectrum and base stay in
 * L2. Uses the plan's scratch. */
kvs_status kvs_dct_lowpass_sqres(kvs_dct_plan *p, const kvs_view *x, int head, int omega,
                                 double *lo, float *acc, kvs_err *err);
/* Columns per group of kvs_dct_lowpass_sqres: about 512 KiB / (12 N), a
 * multiple of 8 (of 16 for odd N), at least 8; d where that is not less than
 * d or where FFTW plans a group's columns differently from all d columns. */
int kvs_dct_plan_group(const kvs_dct_plan *p);

#ifdef __cplusplus
}
#endif
#endif /* KVS_DCT_H */
