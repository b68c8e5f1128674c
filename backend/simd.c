/*
 * simd.c -- vectorised element-wise helpers of the forward pass: exp (for
 * softmax), GELU-tanh gating, axpy. AVX2 + FMA when the build targets it
 * (Release: -march=x86-64-v3), plain C otherwise; both paths agree to ~1e-6
 * relative (exp is a degree-6 polynomial after range reduction, as in Cephes).
 * What it is not: no matrix products (OpenBLAS and quant.c).
 */
#include <math.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVS_SIMD_AVX2 1
#endif

#include "engine_private.h"

#ifdef KVS_SIMD_AVX2
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
#endif

double kvs_vexp_sub(float *x, int n, float sub) {
    int i = 0;
    double sum = 0;
#ifdef KVS_SIMD_AVX2
    __m256 acc = _mm256_setzero_ps(), s = _mm256_set1_ps(sub);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    for (int k = 0; k < 8; k++) sum += t[k];
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - sub);
        sum += x[i];
    }
    return sum;
}

/* g = gelu_tanh(g) * u, with gelu_tanh(x) = x / (1 + exp(-2 c (x + 0.044715 x^3))), c = sqrt(2/pi) */
void kvs_vgelu_mul(float *g, const float *u, int n) {
    const float c2 = -2.0f * 0.7978845608028654f;
    int i = 0;
#ifdef KVS_SIMD_AVX2
    const __m256 vc = _mm256_set1_ps(c2), k = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 inner = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(k, x), x, one));
        __m256 e = exp256(_mm256_mul_ps(vc, inner));
        __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) {
        float x = g[i];
        float e = expf(fminf(88.0f, fmaxf(-87.0f, c2 * (x + 0.044715f * x * x * x))));
        g[i] = x / (1.0f + e) * u[i];
    }
}

void kvs_vsilu_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void kvs_vaxpy(float *o, float a, const float *x, int n) {
    int i = 0;
#ifdef KVS_SIMD_AVX2
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(o + i)));
#endif
    for (; i < n; i++) o[i] += a * x[i];
}

double kvs_sumsq(const float *x, int n) {
    int i = 0;
    double s = 0;
#ifdef KVS_SIMD_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a0, a1));
    for (int k = 0; k < 8; k++) s += t[k];
#endif
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}
