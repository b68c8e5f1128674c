/*
 * simd.c -- vectorised element-wise helpers of the forward pass: exp (for
 * softmax), GELU-tanh gating, axpy. AVX2 + FMA when the build targets it
 * (Release: -march=x86-64-v3), plain C otherwise; both paths agree to ~1e-6
 * relative (exp is a degree-6 polynomial after range reduction, as in Cephes).
 * Also the KV cache row kernels (f32 / f16 / bf16 rows: conversion, dot with
 * an fp32 query, axpy into an fp32 output).
 * What it is not: no matrix products (OpenBLAS and quant.c).
 */
#include <math.h>
#include <string.h>

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

/* ---- KV cache rows of the session's element type (kvs_cache_type) ------------- */
/* f16 rows convert with F16C in registers, bf16 rows by a 16-bit shift; f32
 * rows go through the fp32 kernels above, so an f32 cache computes exactly
 * what it did before cache types existed. */

#if defined(KVS_SIMD_AVX2) && defined(__F16C__)
#define KVS_SIMD_F16C 1
static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#endif
#ifdef KVS_SIMD_AVX2
static inline __m256 ld_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline float hsum8_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

size_t kvs_cache_elem_size(int ctype) { return ctype == KVS_CACHE_F32 ? 4 : 2; }

void kvs_cache_to_f32(int ctype, const void *src, float *dst, int n) {
    if (ctype == KVS_CACHE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    const uint16_t *h = src;
    int i = 0;
    if (ctype == KVS_CACHE_F16) {
#ifdef KVS_SIMD_F16C
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_f16(h + i));
#endif
        for (; i < n; i++) dst[i] = kvs_f16_to_f32(h[i]);
    } else {
#ifdef KVS_SIMD_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_bf16(h + i));
#endif
        for (; i < n; i++) dst[i] = kvs_bf16_to_f32(h[i]);
    }
}

void kvs_cache_from_f32(int ctype, const float *src, void *dst, int n) {
    if (ctype == KVS_CACHE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *h = dst;
    int i = 0;
    if (ctype == KVS_CACHE_F16) {
#ifdef KVS_SIMD_F16C
        /* round to nearest even, as kvs_f32_to_f16 */
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < n; i++) h[i] = kvs_f32_to_f16(src[i]);
    } else {
        for (; i < n; i++) h[i] = kvs_f32_to_bf16(src[i]);
    }
}

float kvs_dot_cache(int ctype, const float *q, const void *k, int n) {
    if (ctype == KVS_CACHE_F32) return kvs_dot_ff(q, k, n);
    const uint16_t *h = k;
    int i = 0;
    float s = 0;
    if (ctype == KVS_CACHE_F16) {
#ifdef KVS_SIMD_F16C
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld_f16(h + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld_f16(h + i + 8), a1);
        }
        s = hsum8_ps(_mm256_add_ps(a0, a1));
#endif
        for (; i < n; i++) s += q[i] * kvs_f16_to_f32(h[i]);
    } else {
#ifdef KVS_SIMD_AVX2
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld_bf16(h + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld_bf16(h + i + 8), a1);
        }
        s = hsum8_ps(_mm256_add_ps(a0, a1));
#endif
        for (; i < n; i++) s += q[i] * kvs_bf16_to_f32(h[i]);
    }
    return s;
}

void kvs_axpy_cache(int ctype, float *o, float a, const void *x, int n) {
    if (ctype == KVS_CACHE_F32) {
        kvs_vaxpy(o, a, x, n);
        return;
    }
    const uint16_t *h = x;
    int i = 0;
    if (ctype == KVS_CACHE_F16) {
#ifdef KVS_SIMD_F16C
        __m256 va = _mm256_set1_ps(a);
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(va, ld_f16(h + i), _mm256_loadu_ps(o + i)));
#endif
        for (; i < n; i++) o[i] += a * kvs_f16_to_f32(h[i]);
    } else {
#ifdef KVS_SIMD_AVX2
        __m256 va = _mm256_set1_ps(a);
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(va, ld_bf16(h + i), _mm256_loadu_ps(o + i)));
#endif
        for (; i < n; i++) o[i] += a * kvs_bf16_to_f32(h[i]);
    }
}
