/*
 * dct_internal.h -- private to the CPU DCT (kernels/dct*.c): the plan's
 * layout, the process-wide FFTW plan cache's entries, Bluestein's bands and
 * the FFT steps the transforms (dct.c) and the fused low-pass (dct_lowpass.c)
 * share. The algorithms are described at the top of dct.c; dct.h is the
 * manual.
 *
 * What it is: declarations and two small inline helpers of Bluestein's
 * convolution. What it is not: no public API, not included outside the
 * dct*.c files.
 */
#ifndef KVS_DCT_INTERNAL_H
#define KVS_DCT_INTERNAL_H

#include <fftw3.h>
#include <stdint.h>

#include "dct.h"

/* ---- the plan cache (process-wide; see the top) ------------------------------ */

/* Direct route, one (N, d): FFTW's plans for all d columns and for the column
 * groups of kvs_dct_lowpass_sqres (g, ng as in the plan). */
typedef struct direct_entry {
    struct direct_entry *next;
    int n, d, g, ng;
    fftwf_plan r2c, c2r;         /* all d columns: v -> V, V -> v */
    fftwf_plan gr2c[2], gc2r[2]; /* groups: 0 full, 1 narrower last (NULL: not used) */
    /* half_route(N): the "r2c" / "c2r" plans are complex FFTs of length N/2
     * on the columns read as N/2 complex pairs (fwd_fft / inv_fft split and
     * merge the half spectra), and tw [N/4 + 1] holds exp(-2 pi i k / N).
     * NULL otherwise (FFTW's r2c / c2r). */
    fftwf_complex *tw;
} direct_entry;

/* Bluestein route, one M: in-place complex FFTs of one sequence. */
typedef struct chirp_entry {
    struct chirp_entry *next;
    int m;
    fftwf_plan fwd, bwd;
} chirp_entry;


/* A Bluestein band: outputs k in (-K, K) through FFTs of length m, the N
 * inputs (forward) and outputs (inverse) in P blocks of at most L tokens
 * (see bands_choose). */
typedef struct {
    int K, m, P, L;
    const chirp_entry *fft;
    fftwf_complex *wf; /* [2P][m]: per block the FFT of its forward kernel,
                          times 1/m, then (at wf + (P + blk) m) the mirrored
                          one (wf[P m + q] = wf[-q]) */
} band;

struct kvs_dct_plan {
    int n, d, h;         /* h = N/2 + 1 complex outputs per column */
    int hs;              /* column stride of V / Vg (spectrum_stride) */
    kvs_dct_route route;
    float *v;            /* [d][N] permuted columns (r2c input / c2r output) */
    fftwf_complex *V;    /* [d][h] spectra */
    float *t;            /* [d][N] row-major path: transposed block */
    float *cs, *sn;      /* [h] cos, sin of pi k / (2N) */
    float *col, *acc_p;  /* [2N] column coefficients (chirp_lowpass: two), [N] squared residual
                            (kvs_dct_lowpass_sqres) */
    /* Direct route: the cached plans (not owned). kvs_dct_lowpass_sqres
     * works on groups of g columns (the last one has d - (ng - 1) g) so that
     * a group's spectrum and base stay in L2; only where FFTW planned each
     * column exactly as for all d (see same_columns); otherwise g = d and
     * Vg = V, tg = t. Bluestein: g = d. */
    const direct_entry *de;
    int g, ng;
    fftwf_complex *Vg;   /* [g][h] a group's spectra */
    float *tg;           /* [g][N] its low-pass bases (permuted) */
    float *rows;         /* [DCT_CHUNK][d] fp16 / bf16 rows converted to fp32 */
    /* Bluestein route: the full band (K = h) for the plain transforms and the
     * low-pass band (K = min(omega, h), or the full one) of
     * kvs_dct_lowpass_sqres; one sequence of scratch and the chirp. */
    band full, low;
    int omega;           /* the plan's low-pass cut-off, 0: any */
    fftwf_complex *w;    /* [N + max K] chirp w_j, j >= 0 */
    fftwf_complex *a, *b, *c; /* [max m] each: convolution scratch (FFT in, out, sum) */
};

/* Bytes of one column group's working set (its columns of v, spectrum and
 * base: about 12 g N) that kvs_dct_lowpass_sqres aims to keep in L2. */
enum { DCT_GROUP_BYTES = 192 << 10 };
enum { DCT_CHUNK = 32 }; /* tokens per read of a view (L1-sized) */


/* ---- the FFT steps (dct_fft.c) ------------------------------------------------ */

/* Bluestein: the forward / inverse convolution of one column pair (x1 / o1
 * NULL: a single column), leaving the result in the plan's scratch p->a
 * (forward) or writing the columns (inverse). */
void kvs_dct_chirp_fwd(const kvs_dct_plan *p, const band *b, const float *restrict x0,
                       const float *restrict x1);
void kvs_dct_chirp_bwd(const kvs_dct_plan *p, const band *b, float *restrict o0,
                       float *restrict o1);
/* Bluestein: m columns v [m][N] -> half spectra V [m][h] (band b) and back
 * (as FFTW's c2r, unnormalised). */
void kvs_dct_chirp_r2c(const kvs_dct_plan *p, const band *b, int m, const float *v,
                       fftwf_complex *V);
void kvs_dct_chirp_c2r(const kvs_dct_plan *p, const band *b, int m, const fftwf_complex *V,
                       float *out);
/* Direct route: the cached FFTW plan for m columns (all d, a full group or
 * the narrower last one), forward (v -> V) or inverse (V -> v). */
fftwf_plan kvs_dct_direct_cols_plan(const kvs_dct_plan *p, int m, int inverse);
/* v ([m][N]) -> V ([m][h]) and back for m columns of the plan on its route;
 * inv destroys V (FFTW's c2r). */
void kvs_dct_fwd_fft(const kvs_dct_plan *p, const band *b, int m, float *v, fftwf_complex *V);
void kvs_dct_inv_fft(const kvs_dct_plan *p, const band *b, int m, fftwf_complex *V, float *out);

/* Z[k] = w_k A[k mod M] for k and -k (w_{-k} = w_k), split into the two
 * columns' spectra: V0 = (Zp + conj Zn) / 2, V1 = (Zp - conj Zn) / (2i). */
static inline void kvs_dct_chirp_split(const float *restrict A, int M, const float *restrict W, int k,
                               float v0[2], float v1[2]) {
    const int kn = k ? M - k : 0;
    const float wr = W[2 * k], wi = W[2 * k + 1];
    const float pr = A[2 * k] * wr - A[2 * k + 1] * wi;
    const float pi = A[2 * k] * wi + A[2 * k + 1] * wr;
    const float nr = A[2 * kn] * wr - A[2 * kn + 1] * wi;
    const float ni = A[2 * kn] * wi + A[2 * kn + 1] * wr;
    v0[0] = 0.5f * (pr + nr);
    v0[1] = 0.5f * (pi - ni);
    v1[0] = 0.5f * (pi + ni);
    v1[1] = -0.5f * (pr - nr);
}

/* The inverse's input at k and -k from the two columns' spectra V0[k] = (r0,
 * i0), V1[k] = (r1, i1) (imaginary parts already 0 at k = 0 and Nyquist):
 * A[k] = conj(Z[k]) w_k, A[M-k] = conj(Z[-k]) w_k, Z[k] = V0[k] + i V1[k],
 * Z[-k] = conj V0[k] + i conj V1[k]; at Nyquist only A[k]. */
static inline void kvs_dct_chirp_merge(float *restrict A, int M, const float *restrict W, int k, int nyq,
                               float r0, float i0, float r1, float i1) {
    const float wr = W[2 * k], wi = W[2 * k + 1];
    /* Z[k] = (r0 - i1) + i (i0 + r1); Z[-k] = (r0 + i1) + i (r1 - i0) */
    const float zr = r0 - i1, zi = -(i0 + r1); /* conj Z[k] */
    A[2 * k] = zr * wr - zi * wi;
    A[2 * k + 1] = zr * wi + zi * wr;
    if (k) {
        const float yr = r0 + i1, yi = -(r1 - i0); /* conj Z[-k] */
        A[2 * (M - k)] = nyq ? 0.0f : yr * wr - yi * wi;
        A[2 * (M - k) + 1] = nyq ? 0.0f : yr * wi + yi * wr;
    }
}

#endif /* KVS_DCT_INTERNAL_H */
