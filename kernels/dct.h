/*
 * dct.h -- orthonormal DCT-II / DCT-III along the token axis, batched over
 * the d channels of one KV head (FFTW single precision).
 *
 * What it is: a building block of kernels/ (CPU, in the library with and
 * without CUDA): the transform of the DCT-based scorers in methods/, and the
 * CPU reference of its cuFFT twin (dct_cufft.cu) for the parity tests and
 * the latency benchmark. Two layouts:
 *   - row-major [N][d] (a head as the cache stores it): column c is the
 *     sequence x[n] = a[n*d + c], n = 0..N-1;
 *   - column-major [d][N] ("_cols"): column c is a[c*N + n] (what a
 *     low-pass scorer works in after one transpose, so no further transposes are needed).
 *
 *   DCT-II  (kvs_dct2_ortho*): X[m] = a_m sum_n x[n] cos(pi (2n+1) m / (2N)),
 *                              a_0 = sqrt(1/N), a_m = sqrt(2/N) for m > 0.
 *   DCT-III (kvs_dct3_ortho*): its inverse, x[n] = sum_m a_m X[m] cos(...).
 * Both are orthonormal, so sum_m X[m]^2 = sum_n x[n]^2 (Parseval).
 *
 * How (dct.c): Makhoul's N-point algorithm, one real FFT of length N per
 * column plus an O(N) permutation and twiddle, for any N >= 1. The real FFT
 * takes one of two routes (kvs_dct_route_for): FFTW's batched FFTs when
 * N = 2^a 3^b 5^c or N = 2 n with n 13-smooth ("direct": for even N a
 * complex FFT of N/2 on the column read as N/2 complex pairs plus an O(N)
 * split, which FFTW's ESTIMATE plans
 * run faster than its own r2c / c2r; r2c / c2r for odd N; 3-6x faster than
 * FFTW's REDFT10/REDFT01 r2r kinds batched with stride d), else
 * Bluestein's chirp convolution through complex FFTs of length 2^a, 3 2^a
 * or 5 2^a, two real columns at a time and the tokens in up to 4 blocks
 * (shorter FFTs where the band is narrow), so a prime N costs 1.5-2.5x what
 * a smooth N does instead of FFTW's 10-20x slower Rader plans. The two routes
 * agree to float rounding (the DCT method's golden plan hashes, recorded before
 * either change, are unchanged). The tests cross-check both against a
 * float64 DCT and FFTW's r2r kinds.
 * Plans: FFTW plans are made once per process and size in a cache (dct_plan.c)
 * (under one mutex; never freed; FFTW's planner is process-global anyway),
 * so creating a kvs_dct_plan after the first of its size only allocates
 * scratch (Bluestein: and one FFT of its kernel).
 *
 * kvs_dct_lowpass_sqres is the transform, low-pass and residual of one head
 * fused over L2-sized column groups (bit for bit the unfused steps).
 * What it is not: no planning at execution time, no threads of its own, no
 * GPU code (dct_cufft.cu is the cuFFT version).
 * Files: dct.c (the transforms), dct_plan.c (routes, the plan cache, plans),
 * dct_fft.c (the FFT steps), dct_lowpass.c (the fused low-pass residual).
 *
 * Thread safety: kvs_dct_plan_create* and kvs_dct_plan_destroy may run on
 * any thread at any time (the cache's mutex serialises FFTW planning, and
 * dct_plan.c makes FFTW's planner thread-safe for other FFTW users in the
 * process). A plan owns its scratch buffers, so one plan may be executed by
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

typedef enum {
    KVS_DCT_AUTO = 0,      /* kvs_dct_route_for(N) */
    KVS_DCT_DIRECT = 1,    /* FFTW's N-point real FFT (any N; slow for large prime factors) */
    KVS_DCT_BLUESTEIN = 2, /* chirp convolution through a smooth-length complex FFT (any N) */
} kvs_dct_route;

/* The route AUTO takes: DIRECT when N's prime factors are all 2, 3 or 5, or
 * N is even and those of N/2 are all at most 13; BLUESTEIN otherwise. */
kvs_dct_route kvs_dct_route_for(int N);

/* Plans for one (N, d): N >= 1 tokens, d >= 1 channels, route AUTO, any
 * low-pass cut-off. FFTW_ESTIMATE plans from the process-wide cache (the
 * first plan of a size plans, later ones do not), never touching caller
 * data. Allocates scratch of about 4 N d floats. */
kvs_status kvs_dct_plan_create(int N, int d, kvs_dct_plan **out, kvs_err *err);
/* The same with a route and omega in [0, N]: the cut-off the caller will
 * pass to kvs_dct_lowpass_sqres (0: not known). On the Bluestein route a
 * known omega below N/2 + 1 lets kvs_dct_lowpass_sqres convolve over
 * N + 2 omega - 2 lags instead of 2N - 1 (a shorter FFT); other omegas
 * still work, at the full length. */
kvs_status kvs_dct_plan_create_opts(int N, int d, int omega, kvs_dct_route route,
                                    kvs_dct_plan **out, kvs_err *err);
void kvs_dct_plan_destroy(kvs_dct_plan *p); /* NULL is fine */
int kvs_dct_plan_n(const kvs_dct_plan *p);
int kvs_dct_plan_d(const kvs_dct_plan *p);
kvs_dct_route kvs_dct_plan_route(const kvs_dct_plan *p); /* DIRECT or BLUESTEIN */
/* The FFT length the plan runs: N (direct), or Bluestein's M for the plain
 * transforms (lowpass 0) or for kvs_dct_lowpass_sqres at the plan's omega. */
int kvs_dct_plan_fft_size(const kvs_dct_plan *p, int lowpass);
/* Bluestein: the blocks P its convolution splits the N tokens into (each
 * through FFTs of that length: P + 1 per two columns and direction); 1 on
 * the direct route. */
int kvs_dct_plan_fft_blocks(const kvs_dct_plan *p, int lowpass);
/* Entries in the process-wide FFTW plan cache (direct (N, d) sets plus
 * Bluestein lengths M): what the tests use to check plans are made once. */
int kvs_dct_plan_cache_entries(void);

/* Row-major: x, X are [N][d]. */
kvs_status kvs_dct2_ortho(kvs_dct_plan *p, const float *x, float *X, kvs_err *err);
kvs_status kvs_dct3_ortho(kvs_dct_plan *p, const float *X, float *x, kvs_err *err);

/* Column-major: x, X are [d][N]. */
kvs_status kvs_dct2_ortho_cols(kvs_dct_plan *p, const float *x, float *X, kvs_err *err);
kvs_status kvs_dct3_ortho_cols(kvs_dct_plan *p, const float *X, float *x, kvs_err *err);

/* Blocked transpose of a [rows][cols] matrix into [cols][rows] (out != in). */
void kvs_transpose_f32(const float *in, int rows, int cols, float *out);

/* The low-pass residual of head `head` of a [N][d] view x (fp32,
 * fp16 or bf16, any strides), fused: with X the DCT-II of every column c,
 * base the DCT-III of X with X[m >= omega] = 0 (1 <= omega <= N):
 *   *lo    = sum_c sum_{m < omega} X_c[m]^2   (double; c, then m ascending)
 *   acc[n] = sum_c (x_c[n] - base_c[n])^2     (fp32, c ascending), acc [N]
 * On the direct route bit for bit what transposing to [d][N],
 * kvs_dct2_ortho_cols, zeroing X[m >= omega], kvs_dct3_ortho_cols and those
 * two loops give (the same float operations in the same order;
 * tests/methods1/test_dct.c checks it); on Bluestein's the same to float
 * rounding (its convolution may be shorter than the plain transforms'). The
 * head is read once, row chunks transposed straight into the permuted FFT
 * input; then groups of kvs_dct_plan_group(p) columns go through FFT,
 * low-pass, inverse FFT and residual while their spectrum and base stay in
 * L2. Uses the plan's scratch. */
kvs_status kvs_dct_lowpass_sqres(kvs_dct_plan *p, const kvs_view *x, int head, int omega,
                                 double *lo, float *acc, kvs_err *err);
/* Columns per group of kvs_dct_lowpass_sqres: about 512 KiB / (12 N), a
 * multiple of 8 (of 16 for odd N), at least 8; d where that is not less than
 * d or where FFTW plans a group's columns differently from all d columns;
 * d on the Bluestein route (it transforms two columns at a time in L1). */
int kvs_dct_plan_group(const kvs_dct_plan *p);

#ifdef __cplusplus
}
#endif
#endif /* KVS_DCT_H */
