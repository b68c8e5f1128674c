/*
 * dct_lowpass.c -- kvs_dct_lowpass_sqres (dct.h): the DCT low-pass residual
 * of one head, fused over L2-sized column groups (direct route) or Bluestein
 * bands, bit for bit the unfused steps of dct.c on the direct route.
 *
 * What it is: head loading into Makhoul's order, the spectral low-pass with
 * its energy, the inverse and the squared residual. What it is not: no
 * planning (dct_plan.c), no FFT of its own (dct_fft.c).
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

/* Tokens n0 .. n0+cnt-1 of m columns into vg ([m][N], column c at vg + c N)
 * in Makhoul's order: token n sits at perm(n) (see the top of dct.c), perm(2q) = q,
 * perm(2q+1) = N-1-q. rows[i * stride + c] is token n0 + i, column c. */
static void load_chunk(float *vg, int N, int m, const float *rows, int64_t stride, int n0,
                       int cnt) {
    const int ie = n0 & 1, io = 1 - ie;               /* first row of an even / odd token */
    const int nE = cnt > ie ? (cnt - ie + 1) / 2 : 0; /* even tokens in the chunk */
    const int nO = cnt > io ? (cnt - io + 1) / 2 : 0; /* odd tokens */
    const int pe = (n0 + ie) / 2, po = N - 1 - (n0 + io) / 2; /* their first slots */
    const int64_t s2 = 2 * stride;
    const float *re = rows + ie * stride, *ro = rows + io * stride;
    for (int c = 0; c < m; c++) {
        float *ve = vg + (int64_t)c * N + pe; /* [nE] ascending */
        float *vo = vg + (int64_t)c * N + po; /* [nO] descending */
        for (int j = 0; j < nE; j++) ve[j] = re[j * s2 + c];
        for (int j = 0; j < nO; j++) vo[-j] = ro[j * s2 + c];
    }
}

/* Head `head` of x, all N tokens and d columns, into v ([d][N], permuted):
 * DCT_CHUNK rows at a time copied (converted) to fp32 by kvs_view_rows_f32,
 * a sequential stream the prefetcher follows (transposing straight from the
 * view measured slower), then transposed from L1 (rows: [DCT_CHUNK][d]). */
static void load_head(const kvs_view *x, int head, int N, int d, float *v, float *rows) {
    for (int n0 = 0; n0 < N; n0 += DCT_CHUNK) {
        const int cnt = N - n0 < DCT_CHUNK ? N - n0 : DCT_CHUNK;
        kvs_view_rows_f32(x, head, n0, cnt, rows);
        load_chunk(v, N, d, rows, d, n0, cnt);
    }
}

/* The DCT-III input of coefficient pair (k, N-k), as kvs_dct3_ortho_cols
 * builds it: x1 = X[k], x2 = X[N-k] (0 where cut off). */
static inline void dct3_pair(fftwf_complex Vk, float x1, float x2, float s1, float ck, float sk) {
    const float y1 = s1 * x1, y2 = s1 * x2;
    Vk[0] = ck * y1 + sk * y2;
    Vk[1] = sk * y1 - ck * y2;
}

/* w[q] += sum over the m columns of (x - base)^2, q < N (permuted order). */
static void residual_acc(const float *v, const float *base, int m, int N, float *restrict w) {
    for (int c = 0; c < m; c++) {
        const float *restrict xc = v + (int64_t)c * N, *restrict bc = base + (int64_t)c * N;
        for (int q = 0; q < N; q++) {
            const float r = xc[q] - bc[q];
            w[q] += r * r;
        }
    }
}

#if defined(__AVX2__)
/* Eight complex values c[k .. k+8) (interleaved at z) as real and imaginary
 * parts in k order, and back. */
static inline void deint8(const float *z, __m256 *re, __m256 *im) {
    const __m256 a = _mm256_loadu_ps(z), b = _mm256_loadu_ps(z + 8);
    /* [r0 r1 r4 r5 | r2 r3 r6 r7] after the shuffle; swap the middle 64-bit chunks */
    *re = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *im = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
static inline void inter8(float *z, __m256 re, __m256 im) {
    re = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(re), 0xD8));
    im = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(im), 0xD8));
    _mm256_storeu_ps(z, _mm256_unpacklo_ps(re, im));
    _mm256_storeu_ps(z + 8, _mm256_unpackhi_ps(re, im));
}

/* half_lowpass's loop for k = 1 .. in blocks of eight while k + 8 <= omega:
 * each lane does exactly the scalar loop's float operations (no FMA, same
 * order). Z[H - k] is read and written in descending k (reversed lanes).
 * Returns the first k it did not do. */
static int half_lowpass8(float *restrict Z, float *restrict Zj, const float *restrict tw,
                         const float *restrict cs, const float *restrict sn, float *restrict X,
                         int omega, float a1f, float b1f) {
    const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 a1 = _mm256_set1_ps(a1f), b1 = _mm256_set1_ps(b1f), zero = _mm256_setzero_ps();
    int k = 1;
    for (; k + 8 <= omega; k += 8) {
        __m256 zr, zi, yr, yi, wr, wi;
        deint8(Z + 2 * k, &zr, &zi);
        deint8(Zj - 2 * (k + 7), &yr, &yi); /* Z[H-k-7 .. H-k]: descending k */
        yr = _mm256_permutevar8x32_ps(yr, rev);
        yi = _mm256_permutevar8x32_ps(yi, rev);
        deint8(tw + 2 * k, &wr, &wi);
        const __m256 c = _mm256_loadu_ps(cs + k), sv = _mm256_loadu_ps(sn + k);
        const __m256 er = _mm256_mul_ps(half, _mm256_add_ps(zr, yr));
        const __m256 ei = _mm256_mul_ps(half, _mm256_sub_ps(zi, yi));
        const __m256 orr = _mm256_mul_ps(half, _mm256_add_ps(zi, yi));
        const __m256 oi = _mm256_mul_ps(mhalf, _mm256_sub_ps(zr, yr));
        const __m256 tr = _mm256_sub_ps(_mm256_mul_ps(wr, orr), _mm256_mul_ps(wi, oi));
        const __m256 ti = _mm256_add_ps(_mm256_mul_ps(wr, oi), _mm256_mul_ps(wi, orr));
        const __m256 vr = _mm256_add_ps(er, tr), vi = _mm256_add_ps(ei, ti);
        const __m256 xk =
            _mm256_mul_ps(a1, _mm256_add_ps(_mm256_mul_ps(c, vr), _mm256_mul_ps(sv, vi)));
        _mm256_storeu_ps(X + k, xk);
        const __m256 y1 = _mm256_mul_ps(b1, xk), y2 = _mm256_mul_ps(b1, zero);
        const __m256 ar = _mm256_add_ps(_mm256_mul_ps(c, y1), _mm256_mul_ps(sv, y2));
        const __m256 ai = _mm256_sub_ps(_mm256_mul_ps(sv, y1), _mm256_mul_ps(c, y2));
        const __m256 mr = _mm256_add_ps(ar, zero), mi = _mm256_sub_ps(ai, zero);
        const __m256 dr = _mm256_sub_ps(ar, zero), di = _mm256_add_ps(ai, zero);
        const __m256 pr = _mm256_add_ps(_mm256_mul_ps(dr, wr), _mm256_mul_ps(di, wi));
        const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(di, wr), _mm256_mul_ps(dr, wi));
        inter8(Z + 2 * k, _mm256_sub_ps(mr, pi), _mm256_add_ps(mi, pr));
        inter8(Zj - 2 * (k + 7), _mm256_permutevar8x32_ps(_mm256_add_ps(mr, pi), rev),
               _mm256_permutevar8x32_ps(_mm256_sub_ps(pr, mi), rev));
    }
    return k;
}
#endif

/* One column of the half route with omega <= H/2 (H = N/2): Z holds the
 * complex FFT of length H of the column's pairs (kvs_dct_fwd_fft's input); on return
 * it holds the input of the backward FFT that gives the column's low-pass
 * base (kvs_dct_inv_fft's), and the energy of the kept X[k < omega] is added to sum
 * (returned). What kvs_dct_fwd_fft's split, the coefficient / low-pass loops of
 * kvs_dct_lowpass_sqres and kvs_dct_inv_fft's merge do, in one pass over k < omega,
 * with the same float operations on the same operands: V[k] needs only
 * Z[k] and Z[H-k]; X[m >= omega] is cut, so the low-passed V'[k >= omega]
 * is +0 and the merge of pair (k, H-k) has b = V'[H-k] = +0 (H - k > H/2 >=
 * omega), and both Z'[k] and Z'[H-k] are +0 for omega <= k <= H/2. The +0
 * terms are kept in the expressions (x + 0.0f is not x when x = -0), so the
 * result is bit for bit the unfused one (tests/methods1/test_dct.c). */
static double half_lowpass(const kvs_dct_plan *p, float *restrict Z, int omega, float a0,
                           float a1, float b0, float b1, double sum) {
    const int H = p->n / 2;
    const float *restrict tw = (const float *)p->de->tw;
    const float *restrict cs = p->cs, *restrict sn = p->sn;
    float *restrict X = p->col;
    const float zero = 0.0f; /* V'[H-k], and the cut X[N-k] of dct3_pair */
    /* k = 0 pairs Z[0] with itself (j = 0); V'[0] = (b0 X[0], 0). */
    {
        const float zr = Z[0], zi = Z[1];
        const float er = 0.5f * (zr + zr), orr = 0.5f * (zi + zi), oi = -0.5f * (zr - zr);
        const float tr = tw[0] * orr - tw[1] * oi;
        X[0] = a0 * (er + tr);
        const float ar = b0 * X[0], ai = 0.0f;
        const float mr = ar + zero, mi = ai - zero, dr = ar - zero, di = ai + zero;
        const float pr = dr * tw[0] + di * tw[1], pi = di * tw[0] - dr * tw[1];
        Z[0] = mr - pi;
        Z[1] = mi + pr;
    }
    /* 1 <= k < omega, j = H - k > k: independent iterations, eight at a time
     * in AVX2 (half_lowpass8), the rest here. */
    float *restrict Zj = Z + 2 * H; /* Zj[-2k] = Z[2 (H - k)] */
    int k = 1;
#if defined(__AVX2__)
    k = half_lowpass8(Z, Zj, tw, cs, sn, X, omega, a1, b1);
#endif
    for (; k < omega; k++) {
        const float zr = Z[2 * k], zi = Z[2 * k + 1], yr = Zj[-2 * k], yi = Zj[-2 * k + 1];
        const float er = 0.5f * (zr + yr), ei = 0.5f * (zi - yi);
        const float orr = 0.5f * (zi + yi), oi = -0.5f * (zr - yr);
        const float wr = tw[2 * k], wi = tw[2 * k + 1];
        const float tr = wr * orr - wi * oi, ti = wr * oi + wi * orr;
        const float vr = er + tr, vi = ei + ti; /* V[k] */
        const float xk = a1 * (cs[k] * vr + sn[k] * vi);
        X[k] = xk;
        /* V'[k] = dct3_pair(X[k], 0) */
        const float y1 = b1 * xk, y2 = b1 * zero;
        const float ar = cs[k] * y1 + sn[k] * y2, ai = sn[k] * y1 - cs[k] * y2;
        const float mr = ar + zero, mi = ai - zero, dr = ar - zero, di = ai + zero;
        const float pr = dr * wr + di * wi, pi = di * wr - dr * wi;
        Z[2 * k] = mr - pi;
        Z[2 * k + 1] = mi + pr;
        Zj[-2 * k] = mr + pi;
        Zj[-2 * k + 1] = pr - mi;
    }
    for (int q = 0; q < omega; q++) sum += (double)X[q] * X[q];
    memset(Z + 2 * omega, 0, sizeof(float) * 2 * (size_t)(H - 2 * omega + 1));
    return sum;
}

/* chirp_lowpass at one k of the band (see there): split the convolution's
 * output at k and M - k, the kept coefficients X0[k], X1[k] (k < kl; X1 NULL:
 * one column), and the inverse's input in their place. */
static inline void chirp_lowpass1(float *restrict A, int M, const float *restrict W,
                                  const float *restrict cs, const float *restrict sn,
                                  float *restrict X0, float *restrict X1, int k, int kl, int nyq,
                                  float a0, float a1, float b0, float b1) {
    fftwf_complex v0, v1, y0 = {0.0f, 0.0f}, y1 = {0.0f, 0.0f};
    kvs_dct_chirp_split(A, M, W, k, v0, v1);
    if (k == 0) {
        X0[0] = a0 * v0[0];
        y0[0] = b0 * X0[0];
        if (X1) {
            X1[0] = a0 * v1[0];
            y1[0] = b0 * X1[0];
        }
    } else if (k < kl) {
        X0[k] = a1 * (cs[k] * v0[0] + sn[k] * v0[1]);
        dct3_pair(y0, X0[k], 0.0f, b1, cs[k], sn[k]);
        if (X1) {
            X1[k] = a1 * (cs[k] * v1[0] + sn[k] * v1[1]);
            dct3_pair(y1, X1[k], 0.0f, b1, cs[k], sn[k]);
        }
    }
    kvs_dct_chirp_merge(A, M, W, k, nyq, y0[0], k && !nyq ? y0[1] : 0.0f, y1[0], k && !nyq ? y1[1] : 0.0f);
}

#if defined(__AVX2__)
/* chirp_lowpass1 for k, k + 1, .. in blocks of eight while k + 8 <= kend
 * (1 <= k; kend excludes Nyquist): each lane does exactly the scalar float
 * operations (no FMA, same order; lanes k >= kl get the scalar's +0 input).
 * A[M - k] is read and written in descending k (reversed lanes); a block's
 * two ranges never meet (K <= M / 2). Returns the first k it did not do. */
static int chirp_lowpass8(float *restrict A, int M, const float *restrict W,
                          const float *restrict cs, const float *restrict sn, float *restrict X0,
                          float *restrict X1, int k, int kend, int kl, float a1f, float b1f) {
    const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 a1 = _mm256_set1_ps(a1f), b1 = _mm256_set1_ps(b1f), sign = _mm256_set1_ps(-0.0f);
    const __m256 y2 = _mm256_mul_ps(b1, _mm256_setzero_ps()); /* dct3_pair's b1 * 0 */
    for (; k + 8 <= kend; k += 8) {
        __m256 ar, ai, br, bi, wr, wi;
        deint8(A + 2 * (int64_t)k, &ar, &ai);
        deint8(A + 2 * (int64_t)(M - k - 7), &br, &bi);
        br = _mm256_permutevar8x32_ps(br, rev);
        bi = _mm256_permutevar8x32_ps(bi, rev);
        deint8(W + 2 * (int64_t)k, &wr, &wi);
        const __m256 pr = _mm256_sub_ps(_mm256_mul_ps(ar, wr), _mm256_mul_ps(ai, wi));
        const __m256 pi = _mm256_add_ps(_mm256_mul_ps(ar, wi), _mm256_mul_ps(ai, wr));
        const __m256 nr = _mm256_sub_ps(_mm256_mul_ps(br, wr), _mm256_mul_ps(bi, wi));
        const __m256 ni = _mm256_add_ps(_mm256_mul_ps(br, wi), _mm256_mul_ps(bi, wr));
        const __m256 c = _mm256_loadu_ps(cs + k), s = _mm256_loadu_ps(sn + k);
        const __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(kl), _mm256_add_epi32(_mm256_set1_epi32(k), lane)));
        __m256 y[2][2]; /* [column][re, im] the DCT-III input */
        for (int t = 0; t < 2; t++) {
            if (t == 1 && !X1) {
                y[1][0] = y[1][1] = _mm256_setzero_ps();
                break;
            }
            const __m256 vr = t ? _mm256_mul_ps(half, _mm256_add_ps(pi, ni))
                                : _mm256_mul_ps(half, _mm256_add_ps(pr, nr));
            const __m256 vi = t ? _mm256_mul_ps(mhalf, _mm256_sub_ps(pr, nr))
                                : _mm256_mul_ps(half, _mm256_sub_ps(pi, ni));
            const __m256 X =
                _mm256_mul_ps(a1, _mm256_add_ps(_mm256_mul_ps(c, vr), _mm256_mul_ps(s, vi)));
            _mm256_storeu_ps((t ? X1 : X0) + k, X); /* lanes >= kl are never read */
            const __m256 y1 = _mm256_mul_ps(b1, X);
            y[t][0] = _mm256_and_ps(keep, _mm256_add_ps(_mm256_mul_ps(c, y1), _mm256_mul_ps(s, y2)));
            y[t][1] = _mm256_and_ps(keep, _mm256_sub_ps(_mm256_mul_ps(s, y1), _mm256_mul_ps(c, y2)));
        }
        const __m256 r0 = y[0][0], i0 = y[0][1], r1 = y[1][0], i1 = y[1][1];
        const __m256 zr = _mm256_sub_ps(r0, i1), zi = _mm256_xor_ps(_mm256_add_ps(i0, r1), sign);
        const __m256 qr = _mm256_add_ps(r0, i1), qi = _mm256_xor_ps(_mm256_sub_ps(r1, i0), sign);
        inter8(A + 2 * (int64_t)k, _mm256_sub_ps(_mm256_mul_ps(zr, wr), _mm256_mul_ps(zi, wi)),
               _mm256_add_ps(_mm256_mul_ps(zr, wi), _mm256_mul_ps(zi, wr)));
        const __m256 hr = _mm256_sub_ps(_mm256_mul_ps(qr, wr), _mm256_mul_ps(qi, wi));
        const __m256 hi = _mm256_add_ps(_mm256_mul_ps(qr, wi), _mm256_mul_ps(qi, wr));
        inter8(A + 2 * (int64_t)(M - k - 7), _mm256_permutevar8x32_ps(hr, rev),
               _mm256_permutevar8x32_ps(hi, rev));
    }
    return k;
}
#endif

/* kvs_dct_lowpass_sqres's spectral steps on Bluestein's route, fused: per
 * column pair, the forward convolution, then for each k of the band (K =
 * min(b->K, h)) the split (kvs_dct_chirp_split), X[k] = a_k (c Re + s Im) for k < kl
 * (kl = omega), the low-passed DCT-III input (dct3_pair; 0 for kl <= k < K)
 * and the inverse's input (kvs_dct_chirp_merge) in place of the convolution's output
 * (entry k reads and writes only k and M - k; chirp_lowpass1, eight at a
 * time in chirp_lowpass8), then the inverse convolution into the base
 * (p->tg). The same float operations per value as kvs_dct_fwd_fft, the per-column
 * loop and kvs_dct_inv_fft, so the results are bit for bit theirs; sum gains
 * sum_{j < kl} X[j]^2 column by column, as there. Needs kh > kl and kh >= K:
 * no kept coefficient N - k in the band. X in p->col ([2][N]). */
static double chirp_lowpass(const kvs_dct_plan *p, const band *b, int m, const float *vg, int kl,
                            float a0, float a1, float b0, float b1, double sum) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    const int kend = !(N & 1) && N / 2 < K ? N / 2 : K; /* the vector blocks stop short of Nyquist */
    float *A = (float *)p->a;
    const float *W = (const float *)p->w, *cs = p->cs, *sn = p->sn;
    for (int c = 0; c < m; c += 2) {
        const float *x0 = vg + (int64_t)c * N, *x1 = c + 1 < m ? x0 + N : NULL; /* [N] */
        float *X0 = p->col, *X1 = x1 ? p->col + N : NULL;                      /* [kl] each */
        kvs_dct_chirp_fwd(p, b, x0, x1);
        chirp_lowpass1(A, M, W, cs, sn, X0, X1, 0, kl, 0, a0, a1, b0, b1);
        int k = 1;
#if defined(__AVX2__)
        k = chirp_lowpass8(A, M, W, cs, sn, X0, X1, k, kend, kl, a1, b1);
#endif
        for (; k < K; k++)
            chirp_lowpass1(A, M, W, cs, sn, X0, X1, k, kl, !(N & 1) && 2 * k == N, a0, a1, b0, b1);
        memset(A + 2 * K, 0, sizeof(float) * 2 * (size_t)(M - 2 * K + 1));
        for (int j = 0; j < kl; j++) sum += (double)X0[j] * X0[j];
        if (x1)
            for (int j = 0; j < kl; j++) sum += (double)X1[j] * X1[j];
        float *o0 = p->tg + (int64_t)c * N;
        kvs_dct_chirp_bwd(p, b, o0, x1 ? o0 + N : NULL);
    }
    return sum;
}

kvs_status kvs_dct_lowpass_sqres(kvs_dct_plan *p, const kvs_view *x, int head, int omega,
                                 double *lo, float *acc, kvs_err *err) {
    if (!p || !x || !x->data || !lo || !acc)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct_lowpass_sqres: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    if (x->n_tokens != N || x->head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: view has N=%d d=%d, the plan N=%d d=%d",
                          x->n_tokens, x->head_dim, N, d);
    if (head < 0 || head >= x->n_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: head %d outside [0, %d)", head, x->n_heads);
    if (x->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_dct_lowpass_sqres: view is in device memory");
    if (x->dtype != KVS_F32 && x->dtype != KVS_F16 && x->dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: dtype %d is not a float type", (int)x->dtype);
    if (omega < 1 || omega > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: omega=%d outside [1, N=%d]", omega, N);
    /* Scales exactly as kvs_dct2_ortho_cols (a*) and kvs_dct3_ortho_cols (b*). */
    const float a0 = (float)sqrt(1.0 / N), a1 = (float)sqrt(2.0 / N);
    const float b0 = (float)(1.0 / sqrt((double)N)), b1 = (float)(1.0 / sqrt(2.0 * N));
    const int kl = omega < h ? omega : h; /* k < kl: X[k] is kept */
    const int kh = N - omega + 1 > 1 ? N - omega + 1 : 1; /* k >= kh: X[N-k] is kept */
    /* Bluestein: only V[k < kl] is read and written back, so the plan's
     * low band serves when it covers kl (the full band otherwise). */
    const band *bd = kl <= p->low.K ? &p->low : &p->full;
    float *X = p->col;   /* [N] one column's coefficients, entries m < omega valid */
    float *w = p->acc_p; /* [N] squared residual in permuted order */
    memset(w, 0, sizeof(float) * (size_t)N);
    load_head(x, head, N, d, p->v, p->rows);
    /* The fast path needs the half route and every kept k at most H/2 (so
     * no kept pair (k, N-k) and, in the merge, no kept partner H-k). */
    const int fast = p->route == KVS_DCT_DIRECT && p->de->tw && omega <= N / 2 / 2;
    /* Bluestein's band reads only V[k < K] (kvs_dct_chirp_c2r): nothing above he */
    const int he = p->route == KVS_DCT_BLUESTEIN && bd->K < h ? bd->K : h;
    /* Bluestein with every kept k below the band's end and no kept partner
     * N - k inside it (omega below about N/2): the split, low-pass and merge
     * run in one pass over the band between the two convolutions, no
     * spectrum written (chirp_lowpass) */
    const int chirp_fused = p->route == KVS_DCT_BLUESTEIN && kl == omega && kh > kl && kh >= he;
    double sum = 0.0;
    for (int gi = 0; gi < p->ng; gi++) {
        const int c0 = gi * p->g, m = d - c0 < p->g ? d - c0 : p->g; /* columns [c0, c0 + m) */
        float *vg = p->v + (int64_t)c0 * N; /* [m][N] */
        if (fast) { /* the spectral steps fused into one pass per column (half_lowpass) */
            fftwf_execute_dft(kvs_dct_direct_cols_plan(p, m, 0), (fftwf_complex *)vg, p->Vg);
            for (int c = 0; c < m; c++)
                sum = half_lowpass(p, (float *)(p->Vg + (int64_t)c * p->hs), omega, a0, a1, b0,
                                   b1, sum);
            fftwf_execute_dft(kvs_dct_direct_cols_plan(p, m, 1), p->Vg, (fftwf_complex *)p->tg);
            residual_acc(vg, p->tg, m, N, w);
            continue;
        }
        if (chirp_fused) { /* g = d: one group */
            sum = chirp_lowpass(p, bd, m, vg, kl, a0, a1, b0, b1, sum);
            residual_acc(vg, p->tg, m, N, w);
            continue;
        }
        /* vg -> Vg; r2c preserves vg */
        kvs_dct_fwd_fft(p, bd, m, vg, p->Vg);
        for (int c = 0; c < m; c++) {
            fftwf_complex *Vc = p->Vg + (int64_t)c * p->hs; /* [h] */
            X[0] = a0 * Vc[0][0];
            for (int k = 1; k < kl; k++) X[k] = a1 * (p->cs[k] * Vc[k][0] + p->sn[k] * Vc[k][1]);
            for (int j = h; j < omega; j++) {
                const int k = N - j; /* 1 <= k < ne */
                X[j] = a1 * (p->sn[k] * Vc[k][0] - p->cs[k] * Vc[k][1]);
            }
            for (int j = 0; j < omega; j++) sum += (double)X[j] * X[j];
            /* The low-passed spectrum, in place. */
            Vc[0][0] = b0 * X[0];
            Vc[0][1] = 0.0f;
            if (kh <= kl) { /* every pair has a kept member */
                for (int k = 1; k < h; k++)
                    dct3_pair(Vc[k], k < omega ? X[k] : 0.0f, N - k < omega ? X[N - k] : 0.0f, b1,
                              p->cs[k], p->sn[k]);
            } else {
                for (int k = 1; k < kl; k++) /* k < kl < kh: X[N-k] is cut */
                    dct3_pair(Vc[k], X[k], 0.0f, b1, p->cs[k], p->sn[k]);
                int kz = kh < h ? kh : h; /* [kl, kz): both cut, b1 * 0 pairs give +0 */
                if (kz > he) kz = he;
                if (kz > kl) memset(Vc + kl, 0, sizeof(fftwf_complex) * (size_t)(kz - kl));
                for (int k = kz; k < he; k++) /* k >= kh > kl: X[k] is cut */
                    dct3_pair(Vc[k], 0.0f, X[N - k], b1, p->cs[k], p->sn[k]);
            }
        }
        /* base (permuted) -> tg; c2r destroys Vg, not vg */
        kvs_dct_inv_fft(p, bd, m, p->Vg, p->tg);
        residual_acc(vg, p->tg, m, N, w);
    }
    *lo = sum;
    for (int q = 0; q < ne; q++) acc[2 * q] = w[q];
    for (int q = 0; q < no; q++) acc[2 * q + 1] = w[N - 1 - q];
    return KVS_OK;
}
