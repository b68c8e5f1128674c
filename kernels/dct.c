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
 * kvs_dct_lowpass_sqres (dct_lowpass.c) runs the same steps on the same FFTW
 * plans column group by column group, fused with the low-pass, the energy
 * and the residual, without the un-permutation: the residual is summed in
 * permuted order and un-permuted once per head ([N], not [d][N]).
 * Routes (kvs_dct_route_for): the N-point real FFT above is FFTW's own
 * (fast when N = 2^a 3^b 5^c; "direct") or, for any other N, where FFTW falls
 * back to Rader's algorithm and is 10-20x slower, Bluestein's: the N-point
 * DFT as a chirp convolution through an FFT of a smooth length M.
 *   w_j = exp(-i pi j^2 / N) (j^2 taken mod 2N, in double), so
 *   e^{-2 pi i n k / N} = w_n w_k conj(w_{k-n}) and, for k in (-K, K),
 *   Z[k] = w_k sum_n (z_n w_n) conj(w_{k-n}): a linear convolution whose
 *   lags k - n span N + 2K - 2 values, so a cyclic one of length
 *   M >= N + 2K - 2 (M = 2^a, 3 2^a or 5 2^a) is exact.
 * Two real columns ride in one complex sequence z = v0 + i v1 and are split
 * with V0[k] = (Z[k] + conj Z[-k]) / 2, V1[k] = (Z[k] - conj Z[-k]) / (2i);
 * the inverse runs the same convolution on conj(Z) (kernel mirrored:
 * Wi[j] = Wf[-j]), z = conj(w_n c_n). The full spectrum needs K = N/2 + 1,
 * M >= 2N - 1; a low-pass needs only k < omega, so a plan made
 * with omega (kvs_dct_plan_create_opts) uses K = min(omega, N/2 + 1) there.
 * Split (band_choose): the sum over n splits into P blocks of L = ceil(N/P)
 * tokens, each a convolution of length M >= L + 2K - 2 with its own kernel
 * (lags shifted by the block's first token); the blocks' spectra are summed
 * before the one inverse FFT (forward), or one FFT feeds P inverse FFTs, one
 * per block of output tokens (inverse). P + 1 FFTs of length M instead of
 * two of the unsplit length: at gamma 0.2, N = 1021 runs 3 FFTs of 1024
 * instead of 2 of 2048 (block CPU time -25..-30% here). Results agree
 * with the direct route to float rounding (tests).
 * Direct route, even N (half_route): the real FFT of v is a complex FFT of
 * z[n] = v[2n] + i v[2n+1] (length N/2; the column is already laid out as
 * those pairs) and an O(N) split into the half spectrum (fwd_fft); the
 * inverse merges the half spectrum into N/2 complex values and runs the
 * backward complex FFT straight into the output column (inv_fft).
 * Plan cache: FFTW plans are made once per process and size (direct: per
 * (N, d); Bluestein: per M) in a list guarded by one mutex, executed only
 * through the new-array interface (thread-safe), and never freed: FFTW's
 * planner is process-global state anyway (not re-entrant, with its own
 * wisdom and twiddle caches), so this is the one justified piece of
 * process-wide state; a kvs_dct_plan only holds its scratch and pointers
 * into the cache. Memory: one entry per distinct (N, d) on the direct route
 * (FFTW twiddles, O(N)) and per M on Bluestein's.
 * Speed: the permutation, twiddle and transpose loops are memory-bound
 * streams; GCC's -O2 cost model leaves them scalar, so this file asks GCC for
 * -O3 (loop vectorisation). Results do not depend on it: no reassociation.
 * What it is not: no planning during execution, no thread pool, no GPU.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "dct.h"
#include "dct_internal.h"

#include <assert.h>
#include <fftw3.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    kvs_dct_fwd_fft(p, &p->full, d, p->v, p->V);
    const float s0 = (float)sqrt(1.0 / N), s1 = (float)sqrt(2.0 / N);
    for (int c = 0; c < d; c++) {
        const fftwf_complex *Vc = p->V + (int64_t)c * p->hs; /* [h] */
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
        fftwf_complex *Vc = p->V + (int64_t)c * p->hs;
        Vc[0][0] = s0 * Xc[0];
        Vc[0][1] = 0.0f;
        for (int k = 1; k < h; k++) {
            const float y1 = s1 * Xc[k], y2 = s1 * Xc[N - k], ck = p->cs[k], sk = p->sn[k];
            Vc[k][0] = ck * y1 + sk * y2;
            Vc[k][1] = sk * y1 - ck * y2;
        }
    }
    kvs_dct_inv_fft(p, &p->full, d, p->V, p->v);
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
