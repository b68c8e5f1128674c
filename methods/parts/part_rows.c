/*
 * part_rows.c -- the row reductions the linear scorers share (knorm,
 * keydiff, cur; the overhead study's key-norm term).
 *
 * What it is: sums over one fp32 row of d channels in a fixed order, AVX
 * where the build has it and plain C in the same order without: W partial sums (channel t goes to lane t mod W,
 * W = 32 in fp32, 16 in double: four 256-bit registers, so four add chains
 * overlap), combined pairwise (lane k + lane k + W/2, halving to one). The
 * result depends only on the row, not on the machine or the thread that ran
 * it (C11 without contraction: no FMA). Why: a single running sum is one
 * dependent add per channel; its latency, not the memory, set the scorers'
 * speed.
 * What it is not: no conversion (kvs_view_rows_f32 does that) and no
 * compensated summation.
 */
#include "kvs_parts.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

enum { WF = 32, WD = 16 }; /* lanes: fp32, double */

static float fold_f(float *l) {
    for (int w = WF / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

static double fold_d(double *l) {
    for (int w = WD / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

/* Lanes [0, W) of a row pair: l[k] += a[t + k] b[t + k] over whole blocks
 * of W channels, in registers; returns the first channel left over. */
static int blocks_f(const float *a, const float *b, int d, float *l) {
    int t = 0;
#if defined(__AVX__)
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; t + WF <= d; t += WF) {
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t)));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(a + t + 8), _mm256_loadu_ps(b + t + 8)));
        s2 = _mm256_add_ps(s2, _mm256_mul_ps(_mm256_loadu_ps(a + t + 16), _mm256_loadu_ps(b + t + 16)));
        s3 = _mm256_add_ps(s3, _mm256_mul_ps(_mm256_loadu_ps(a + t + 24), _mm256_loadu_ps(b + t + 24)));
    }
    _mm256_storeu_ps(l, s0);
    _mm256_storeu_ps(l + 8, s1);
    _mm256_storeu_ps(l + 16, s2);
    _mm256_storeu_ps(l + 24, s3);
#endif
    for (; t + WF <= d; t += WF)
        for (int k = 0; k < WF; k++) l[k] += a[t + k] * b[t + k];
    return t;
}

float kvs_part_sumsq(const float *r, int d) {
    float l[WF] = {0};
    for (int t = blocks_f(r, r, d, l); t < d; t++) l[t % WF] += r[t] * r[t];
    return fold_f(l);
}

float kvs_part_dot(const float *a, const float *b, int d) {
    float l[WF] = {0};
    for (int t = blocks_f(a, b, d, l); t < d; t++) l[t % WF] += a[t] * b[t];
    return fold_f(l);
}

double kvs_part_sumsq_f64(const float *r, int d) {
    double l[WD] = {0};
    int t = 0;
#if defined(__AVX__)
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    for (; t + WD <= d; t += WD) {
        const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(r + t)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(r + t + 4));
        const __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(r + t + 8)), x3 = _mm256_cvtps_pd(_mm_loadu_ps(r + t + 12));
        s0 = _mm256_add_pd(s0, _mm256_mul_pd(x0, x0));
        s1 = _mm256_add_pd(s1, _mm256_mul_pd(x1, x1));
        s2 = _mm256_add_pd(s2, _mm256_mul_pd(x2, x2));
        s3 = _mm256_add_pd(s3, _mm256_mul_pd(x3, x3));
    }
    _mm256_storeu_pd(l, s0);
    _mm256_storeu_pd(l + 4, s1);
    _mm256_storeu_pd(l + 8, s2);
    _mm256_storeu_pd(l + 12, s3);
#endif
    for (; t + WD <= d; t += WD)
        for (int k = 0; k < WD; k++) l[k] += (double)r[t + k] * r[t + k];
    for (; t < d; t++) l[t % WD] += (double)r[t] * r[t];
    return fold_d(l);
}
