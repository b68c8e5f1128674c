/*
 * dct_fft.c -- the FFT steps of the CPU DCT (dct.h): Bluestein's chirp
 * convolution and the direct route's FFTW calls with the even-N half
 * spectrum split / merge, for the transforms (dct.c) and the fused low-pass
 * (dct_lowpass.c). dct.c describes the algorithms.
 *
 * What it is: the real FFT of m permuted columns and its inverse on the
 * plan's route. What it is not: no planning (dct_plan.c), no DCT twiddles.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
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

static inline void cmul_acc(float *restrict F, const float *restrict G, const float *restrict K,
                            int m, int first) {
    if (first) {
        for (int j = 0; j < m; j++) {
            const float gr = G[2 * j], gi = G[2 * j + 1];
            F[2 * j] = gr * K[2 * j] - gi * K[2 * j + 1];
            F[2 * j + 1] = gr * K[2 * j + 1] + gi * K[2 * j];
        }
    } else {
        for (int j = 0; j < m; j++) {
            const float gr = G[2 * j], gi = G[2 * j + 1];
            F[2 * j] += gr * K[2 * j] - gi * K[2 * j + 1];
            F[2 * j + 1] += gr * K[2 * j + 1] + gi * K[2 * j];
        }
    }
}

/* The forward convolution of one column pair (x1 NULL: a single column):
 * with z = x0 + i x1, leaves in A (p->a) the cyclic convolution whose entry
 * k mod M is Z[k] / w_k for k in (-K, K) (band b): the sum over blocks of
 * FFT(block's z_n w_n) times its kernel, back through one inverse FFT. */
void kvs_dct_chirp_fwd(const kvs_dct_plan *p, const band *b, const float *restrict x0,
                      const float *restrict x1) {
    const int N = p->n, M = b->m, P = b->P, L = b->L;
    float *restrict A = (float *)p->a; /* [M] complex, interleaved */
    float *restrict G = (float *)p->b, *restrict F = (float *)p->c;
    const float *restrict W = (const float *)p->w;
    for (int blk = 0; blk < P; blk++) {
        const int nb = blk * L, lb = N - nb < L ? N - nb : L;
        const float *restrict Wb = W + 2 * (int64_t)nb;
        if (x1) {
            for (int n = 0; n < lb; n++) { /* (x0 + i x1) w_n */
                A[2 * n] = x0[nb + n] * Wb[2 * n] - x1[nb + n] * Wb[2 * n + 1];
                A[2 * n + 1] = x0[nb + n] * Wb[2 * n + 1] + x1[nb + n] * Wb[2 * n];
            }
        } else {
            for (int n = 0; n < lb; n++) {
                A[2 * n] = x0[nb + n] * Wb[2 * n] - 0.0f * Wb[2 * n + 1];
                A[2 * n + 1] = x0[nb + n] * Wb[2 * n + 1] + 0.0f * Wb[2 * n];
            }
        }
        memset(A + 2 * lb, 0, sizeof(float) * 2 * (size_t)(M - lb));
        fftwf_execute_dft(b->fft->fwd, p->a, p->b);
        cmul_acc(F, G, (const float *)(b->wf + (size_t)blk * M), M, blk == 0);
    }
    fftwf_execute_dft(b->fft->bwd, p->c, p->a);
}

/* The inverse convolution of one column pair: A (p->a) holds conj(Z[k]) w_k
 * at k mod M for k in (-K, K) and zeros between; per output block: times
 * its mirrored kernel (FFT(b[-j]) = wf[-q]), back, and z = conj(w_n c_n) =
 * o0 + i o1 for its tokens (o1 NULL: only the real part). */
void kvs_dct_chirp_bwd(const kvs_dct_plan *p, const band *b, float *restrict o0,
                      float *restrict o1) {
    const int N = p->n, M = b->m, P = b->P, L = b->L;
    float *restrict A = (float *)p->a, *restrict G = (float *)p->b, *restrict F = (float *)p->c;
    const float *restrict W = (const float *)p->w;
    fftwf_execute_dft(b->fft->fwd, p->a, p->b);
    for (int blk = 0; blk < P; blk++) {
        const int nb = blk * L, lb = N - nb < L ? N - nb : L;
        cmul_acc(F, G, (const float *)(b->wf + (size_t)(P + blk) * M), M, 1);
        fftwf_execute_dft(b->fft->bwd, p->c, p->a);
        const float *restrict Wb = W + 2 * (int64_t)nb;
        float *restrict q0 = o0 + nb; /* [lb] */
        if (o1) {
            float *restrict q1 = o1 + nb;
            for (int n = 0; n < lb; n++) {
                q0[n] = A[2 * n] * Wb[2 * n] - A[2 * n + 1] * Wb[2 * n + 1];
                q1[n] = -(A[2 * n] * Wb[2 * n + 1] + A[2 * n + 1] * Wb[2 * n]);
            }
        } else {
            for (int n = 0; n < lb; n++) q0[n] = A[2 * n] * Wb[2 * n] - A[2 * n + 1] * Wb[2 * n + 1];
        }
    }
}



/* Forward: m columns of v ([m][N], real) to their half spectra V ([m][h]),
 * V[c][k] = sum_n v[c][n] e^{-2 pi i n k / N} for k < min(K, h) (band b);
 * entries k >= K are left as they are. Two columns per convolution. */
void kvs_dct_chirp_r2c(const kvs_dct_plan *p, const band *b, int m, const float *v,
                      fftwf_complex *V) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    const float *A = (const float *)p->a, *W = (const float *)p->w;
    for (int c = 0; c < m; c += 2) {
        const float *x0 = v + (int64_t)c * N; /* [N] */
        kvs_dct_chirp_fwd(p, b, x0, c + 1 < m ? x0 + N : NULL);
        fftwf_complex *V0 = V + (int64_t)c * p->hs, *V1 = c + 1 < m ? V0 + p->hs : NULL; /* [h] */
        for (int k = 0; k < K; k++) {
            float v1[2];
            kvs_dct_chirp_split(A, M, W, k, V0[k], v1);
            if (V1) V1[k][0] = v1[0], V1[k][1] = v1[1];
        }
    }
}

/* Inverse, as FFTW's c2r (unnormalised; the imaginary parts of V[0] and, N
 * even, V[N/2] ignored): out[c][n] = sum_{k=0}^{N-1} V[c][k] e^{2 pi i k n / N}
 * with V[N-k] = conj V[k], where V[c][k] = 0 for k >= min(K, h) (band b). */
void kvs_dct_chirp_c2r(const kvs_dct_plan *p, const band *b, int m, const fftwf_complex *V,
                      float *out) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    float *A = (float *)p->a;
    const float *W = (const float *)p->w;
    for (int c = 0; c < m; c += 2) {
        const fftwf_complex *V0 = V + (int64_t)c * p->hs, *V1 = c + 1 < m ? V0 + p->hs : NULL;
        memset(A + 2 * K, 0, sizeof(float) * 2 * (size_t)(M - 2 * K + 1));
        for (int k = 0; k < K; k++) {
            const int nyq = !(N & 1) && 2 * k == N; /* V[N/2]: once, real parts */
            kvs_dct_chirp_merge(A, M, W, k, nyq, V0[k][0], k && !nyq ? V0[k][1] : 0.0f,
                        V1 ? V1[k][0] : 0.0f, V1 && k && !nyq ? V1[k][1] : 0.0f);
        }
        float *o0 = out + (int64_t)c * N;
        kvs_dct_chirp_bwd(p, b, o0, V1 ? o0 + N : NULL);
    }
}


fftwf_plan kvs_dct_direct_cols_plan(const kvs_dct_plan *p, int m, int inverse) {
    const direct_entry *e = p->de;
    if (m == p->d) return inverse ? e->c2r : e->r2c;
    return inverse ? e->gc2r[m == p->g ? 0 : 1] : e->gr2c[m == p->g ? 0 : 1];
}

/* v ([m][N]) -> V ([m][h]) and back for m columns of the plan: all d, or a
 * column group (direct route: the group plans; m == g or the last group). */
void kvs_dct_fwd_fft(const kvs_dct_plan *p, const band *b, int m, float *v, fftwf_complex *V) {
    if (p->route == KVS_DCT_BLUESTEIN) {
        kvs_dct_chirp_r2c(p, b, m, v, V);
        return;
    }
    const direct_entry *e = p->de;
    const fftwf_plan pl = kvs_dct_direct_cols_plan(p, m, 0);
    if (!e->tw) {
        fftwf_execute_dft_r2c(pl, v, V);
        return;
    }
    /* N even: Z = FFT_{N/2}(v[2n] + i v[2n+1]) into V, then each column's
     * half spectrum from Z in place: with E / O the FFTs of the even / odd
     * samples, E[k] = (Z[k] + conj Z[H-k]) / 2, O[k] = (Z[k] - conj Z[H-k]) /
     * (2i), V[k] = E[k] + w^k O[k] and V[H-k] = conj(E[k] - w^k O[k]),
     * w = exp(-2 pi i / N), for k = 0 .. H/2 (Z[H] = Z[0]). */
    fftwf_execute_dft(pl, (fftwf_complex *)v, V);
    const int H = p->n / 2;
    const float *restrict tw = (const float *)e->tw;
    for (int c = 0; c < m; c++) {
        float *restrict Z = (float *)(V + (int64_t)c * p->hs); /* [h] complex */
        for (int k = 0; k <= H / 2; k++) {
            const int j = k ? H - k : 0;
            const float zr = Z[2 * k], zi = Z[2 * k + 1], yr = Z[2 * j], yi = Z[2 * j + 1];
            const float er = 0.5f * (zr + yr), ei = 0.5f * (zi - yi);
            const float orr = 0.5f * (zi + yi), oi = -0.5f * (zr - yr);
            const float wr = tw[2 * k], wi = tw[2 * k + 1];
            const float tr = wr * orr - wi * oi, ti = wr * oi + wi * orr;
            Z[2 * k] = er + tr;
            Z[2 * k + 1] = ei + ti;
            Z[2 * (H - k)] = er - tr; /* k = 0: V[H] */
            Z[2 * (H - k) + 1] = ti - ei;
        }
    }
}

/* V is destroyed (FFTW's c2r). */
void kvs_dct_inv_fft(const kvs_dct_plan *p, const band *b, int m, fftwf_complex *V, float *out) {
    if (p->route == KVS_DCT_BLUESTEIN) {
        kvs_dct_chirp_c2r(p, b, m, V, out);
        return;
    }
    const direct_entry *e = p->de;
    const fftwf_plan pl = kvs_dct_direct_cols_plan(p, m, 1);
    if (!e->tw) {
        fftwf_execute_dft_c2r(pl, V, out);
        return;
    }
    /* N even, as c2r (imaginary parts of V[0], V[H] ignored): in place, for
     * k = 0 .. H/2 with a = V[k], b = V[H-k], E = a + conj b, O = (a - conj b)
     * conj(w^k): Z[k] = E + i O, Z[H-k] = conj E + i conj O; then
     * out[2n] + i out[2n+1] = IFFT_{N/2}(Z)[n] (unnormalised, as c2r). */
    const int H = p->n / 2;
    const float *restrict tw = (const float *)e->tw;
    for (int c = 0; c < m; c++) {
        float *restrict Z = (float *)(V + (int64_t)c * p->hs); /* [h] complex */
        for (int k = 0; k <= H / 2; k++) {
            const int j = H - k;
            const float ar = Z[2 * k], ai = k ? Z[2 * k + 1] : 0.0f;
            const float br = Z[2 * j], bi = k ? Z[2 * j + 1] : 0.0f;
            const float er = ar + br, ei = ai - bi, dr = ar - br, di = ai + bi;
            const float wr = tw[2 * k], wi = tw[2 * k + 1];
            const float orr = dr * wr + di * wi, oi = di * wr - dr * wi;
            Z[2 * k] = er - oi;
            Z[2 * k + 1] = ei + orr;
            if (k) {
                Z[2 * j] = er + oi;
                Z[2 * j + 1] = orr - ei;
            }
        }
    }
    fftwf_execute_dft(pl, V, (fftwf_complex *)out);
}
