/*
 * simd.c -- vectorised element-wise helpers of the forward pass: exp (for
 * softmax), GELU-tanh gating, axpy. AVX2 + FMA when the build targets it
 * (Release: -march=x86-64-v3), plain C otherwise; both paths agree to ~1e-6
 * relative (exp is a degree-6 polynomial after range reduction, as in Cephes).
 * Also the KV cache row kernels of the float types (f32 / f16 / bf16 rows:
 * conversion, dot with an fp32 query, axpy into an fp32 output), one query
 * head at a time or all the heads of a GQA group per pass over the rows
 * (kvcache.c routes the kvs_cache_* entry points here; block types are its own).
 * These are the references of attn512.c's AVX-512F kernels, which give
 * their bits (tests/backend/test_backend_attn.c); dispatch.c picks.
 * What it is not: no matrix products (OpenBLAS and quant.c).
 */
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVS_SIMD_AVX2 1
#endif

#include "cpu_private.h"

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

/* g = silu(g) * u = g / (1 + exp(-g)) * u; exp256 in the lanes (as gelu
 * above), libm's expf for the tail. exp256 clamps its argument -g to
 * [-87, 88]: that touches only g > 87, where silu(g) is g to float precision
 * either way, and g < -88, where |silu(g)| < 1e-35 comes out as g e^-88
 * instead (libm: 0 or g e^g), which no later step can tell apart. */
void kvs_vsilu_mul(float *g, const float *u, int n) {
    int i = 0;
#ifdef KVS_SIMD_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_xor_ps(x, neg));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* The largest x[i] (NaN elements are passed over, as `if (x > m) m = x`
 * does); -INFINITY for n = 0. A maximum does not depend on the order it is
 * taken in, so the vector lanes give exactly the scalar loop's value. */
float kvs_vmax(const float *x, int n) {
    int i = 0;
    float m = -INFINITY;
#ifdef KVS_SIMD_AVX2
    /* max_ps(v, a) returns a where v is NaN: NaN scores are skipped */
    __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_max_ps(_mm256_loadu_ps(x + i), a0);
        a1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), a1);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_max_ps(a0, a1));
    for (int k = 0; k < 8; k++)
        if (t[k] > m) m = t[k];
#endif
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

void kvs_vscale(float *x, int n, float a) {
    int i = 0;
#ifdef KVS_SIMD_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
#endif
    for (; i < n; i++) x[i] *= a;
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

/* Greedy sampling over a vocabulary row: two vector passes (the maximum, with
 * NaN caught by an unordered compare; then the first index holding it), the
 * index the scalar loop `if (x[i] > x[best]) best = i` gives, -0 and +0
 * compared equal as there. */
int kvs_argmax(const float *x, int n) {
    if (n <= 0) return -1;
    int i = 0;
    float m = x[0];
    int nan = isnan(m);
#ifdef KVS_SIMD_AVX2
    if (n >= 16) {
        __m256 m0 = _mm256_set1_ps(m), m1 = m0, u = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
            u = _mm256_or_ps(u, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
            m0 = _mm256_max_ps(m0, v0);
            m1 = _mm256_max_ps(m1, v1);
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_max_ps(m0, m1));
        for (int k = 0; k < 8; k++) m = t[k] > m ? t[k] : m;
        nan |= _mm256_movemask_ps(u) != 0;
    }
#endif
    for (; i < n; i++) {
        nan |= isnan(x[i]);
        m = x[i] > m ? x[i] : m;
    }
    if (nan) return -1;
    i = 0;
#ifdef KVS_SIMD_AVX2
    const __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) {
        int e = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (e) return i + __builtin_ctz((unsigned)e);
    }
#endif
    for (; i < n; i++)
        if (x[i] == m) return i;
    return -1; /* not reached: m is one of the x[i] */
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

static size_t elem_size(int ctype) { return ctype == KVS_CACHE_F32 ? 4 : 2; }

void kvs_cache_to_f32_float(int ctype, const void *src, float *dst, int n) {
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

void kvs_cache_from_f32_float(int ctype, const float *src, void *dst, int n) {
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

float kvs_dot_cache_float(int ctype, const float *q, const void *k, int n) {
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

void kvs_axpy_cache_float(int ctype, float *o, float a, const void *x, int n) {
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

/* ---- the query heads of one GQA group against the same cache rows ----------- */
/* Every query head of a group reads the same key and value rows. These
 * kernels convert each f16/bf16 element once per pass for up to
 * KVS_GROUP_REGS heads (their accumulators stay in registers) instead of once
 * per head, and work on blocks of KVS_GROUP_ROWS rows so that a block stays
 * in L1 while the heads' passes go over it. Each head's result goes through
 * exactly the float operations of the one-head kernels above (the same
 * accumulators, chunking, tails and order over rows), so it is bit for bit
 * what kvs_dot_cache / kvs_axpy_cache give, whichever heads share a pass. */

#define KVS_GROUP_REGS 4  /* heads per register pass: 2 x 4 accumulators + 2 rows' chunks */
#define KVS_GROUP_ROWS 32 /* rows per block: 32 x 256 x 2 bytes = 16 KiB at gemma's head size */

#ifdef KVS_SIMD_F16C
#if defined(__GNUC__)
#define KVS_INLINE static inline __attribute__((always_inline))
#else
#define KVS_INLINE static inline
#endif

KVS_INLINE __m256 ld_cache8(int bf, const uint16_t *p) { return bf ? ld_bf16(p) : ld_f16(p); }
KVS_INLINE float cache_elem(int bf, uint16_t v) { return bf ? kvs_bf16_to_f32(v) : kvs_f16_to_f32(v); }

/* out[h * os + t] = kvs_dot_cache(q + h * qs, row t) * scale, NH heads, rows [0, nrows) */
KVS_INLINE void dot_heads(int bf, const int NH, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows,
                          int n, float scale, float *out, size_t os) {
    for (int t = 0; t < nrows; t++) {
        const uint16_t *r = k + (size_t)t * rse;
        __m256 a0[KVS_GROUP_REGS], a1[KVS_GROUP_REGS];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) a0[h] = a1[h] = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            if (i % 32 == 0) kvs_prefetch_ahead(r + i);
            __m256 k0 = ld_cache8(bf, r + i), k1 = ld_cache8(bf, r + i + 8);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * qs + i), k0, a0[h]);
                a1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * qs + i + 8), k1, a1[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const float *qh = q + h * qs;
            float s = hsum8_ps(_mm256_add_ps(a0[h], a1[h]));
            for (int e = i; e < n; e++) s += qh[e] * cache_elem(bf, r[e]);
            out[h * os + t] = s * scale;
        }
    }
}

/* o[h * os + d] += p[h * ps + t] x[t][d] for t = 0, 1, .. nrows - 1 in order, NH heads */
KVS_INLINE void axpy_heads(int bf, const int NH, float *o, size_t os, const float *p, size_t ps, const uint16_t *x,
                           size_t rse, int nrows, int n) {
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        __m256 c0[KVS_GROUP_REGS], c1[KVS_GROUP_REGS];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            c0[h] = _mm256_loadu_ps(o + h * os + d);
            c1[h] = _mm256_loadu_ps(o + h * os + d + 8);
        }
        for (int t = 0; t < nrows; t++) {
            const uint16_t *r = x + (size_t)t * rse + d;
            if (d % 32 == 0) kvs_prefetch_ahead(r);
            __m256 v0 = ld_cache8(bf, r), v1 = ld_cache8(bf, r + 8);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                __m256 a = _mm256_broadcast_ss(p + h * ps + t);
                c0[h] = _mm256_fmadd_ps(a, v0, c0[h]);
                c1[h] = _mm256_fmadd_ps(a, v1, c1[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            _mm256_storeu_ps(o + h * os + d, c0[h]);
            _mm256_storeu_ps(o + h * os + d + 8, c1[h]);
        }
    }
    for (; d + 8 <= n; d += 8) {
        __m256 c0[KVS_GROUP_REGS];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) c0[h] = _mm256_loadu_ps(o + h * os + d);
        for (int t = 0; t < nrows; t++) {
            __m256 v0 = ld_cache8(bf, x + (size_t)t * rse + d);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) c0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * ps + t), v0, c0[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) _mm256_storeu_ps(o + h * os + d, c0[h]);
    }
    for (; d < n; d++) /* the one-head kernel's scalar tail: o[d] += a * x[d] */
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < nrows; t++) o[h * os + d] += p[h * ps + t] * cache_elem(bf, x[(size_t)t * rse + d]);
}

/* One block of rows for nh <= KVS_GROUP_REGS heads: a constant head count and
 * element type per instance, so the accumulators are registers. */
static void dot_heads_blk(int bf, int nh, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows, int n,
                          float scale, float *out, size_t os) {
    switch (nh * 2 + (bf != 0)) {
    case 2: dot_heads(0, 1, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 3: dot_heads(1, 1, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 4: dot_heads(0, 2, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 5: dot_heads(1, 2, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 6: dot_heads(0, 3, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 7: dot_heads(1, 3, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 8: dot_heads(0, 4, q, qs, k, rse, nrows, n, scale, out, os); break;
    case 9: dot_heads(1, 4, q, qs, k, rse, nrows, n, scale, out, os); break;
    default: break; /* nh is 1 .. KVS_GROUP_REGS (the caller splits) */
    }
}

static void axpy_heads_blk(int bf, int nh, float *o, size_t os, const float *p, size_t ps, const uint16_t *x,
                           size_t rse, int nrows, int n) {
    switch (nh * 2 + (bf != 0)) {
    case 2: axpy_heads(0, 1, o, os, p, ps, x, rse, nrows, n); break;
    case 3: axpy_heads(1, 1, o, os, p, ps, x, rse, nrows, n); break;
    case 4: axpy_heads(0, 2, o, os, p, ps, x, rse, nrows, n); break;
    case 5: axpy_heads(1, 2, o, os, p, ps, x, rse, nrows, n); break;
    case 6: axpy_heads(0, 3, o, os, p, ps, x, rse, nrows, n); break;
    case 7: axpy_heads(1, 3, o, os, p, ps, x, rse, nrows, n); break;
    case 8: axpy_heads(0, 4, o, os, p, ps, x, rse, nrows, n); break;
    case 9: axpy_heads(1, 4, o, os, p, ps, x, rse, nrows, n); break;
    default: break;
    }
}

/* Split nh heads into passes of at most KVS_GROUP_REGS, as even as possible
 * (7 heads: 4 + 3): pass b of nb covers heads [first(b), first(b + 1)). */
static int group_passes(int nh) { return (nh + KVS_GROUP_REGS - 1) / KVS_GROUP_REGS; }
static int group_first(int nh, int nb, int b) { return (int)((long)nh * b / nb); }
#endif

/* This file's kernels for the GQA group (dispatch.c sends f16/bf16 rows to
 * attn512.c where the CPU has AVX-512F). */
const char *kvs_attn_kernels_base(int ctype) {
#ifdef KVS_SIMD_F16C
    if (ctype != KVS_CACHE_F32) return "avx2";
#endif
    return "one head at a time";
}

void kvs_dot_cache_heads_base(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride,
                              int nrows, int n, float scale, float *out, size_t ostride) {
#ifdef KVS_SIMD_F16C
    if (ctype != KVS_CACHE_F32) {
        const uint16_t *kh = k;
        const int nb = group_passes(nh), bf = ctype == KVS_CACHE_BF16;
        for (int t0 = 0; t0 < nrows; t0 += KVS_GROUP_ROWS) {
            int nr = nrows - t0 < KVS_GROUP_ROWS ? nrows - t0 : KVS_GROUP_ROWS;
            for (int b = 0; b < nb; b++) {
                int h0 = group_first(nh, nb, b), h1 = group_first(nh, nb, b + 1);
                dot_heads_blk(bf, h1 - h0, q + (size_t)h0 * qstride, qstride, kh + (size_t)t0 * rstride, rstride, nr,
                              n, scale, out + (size_t)h0 * ostride + t0, ostride);
            }
        }
        return;
    }
#endif
    /* f32 rows (nothing to convert) and builds without F16C: the one-head kernel per head */
    const uint8_t *kb = k;
    const size_t rb = rstride * elem_size(ctype);
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < nrows; t++)
            out[(size_t)h * ostride + t] =
                kvs_dot_cache_float(ctype, q + (size_t)h * qstride, kb + (size_t)t * rb, n) * scale;
}

void kvs_axpy_cache_heads_base(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                               const void *x, size_t rstride, int nrows, int n) {
#ifdef KVS_SIMD_F16C
    if (ctype != KVS_CACHE_F32) {
        const uint16_t *xh = x;
        const int nb = group_passes(nh), bf = ctype == KVS_CACHE_BF16;
        /* blocks in row order: each output element still sums its rows in order */
        for (int t0 = 0; t0 < nrows; t0 += KVS_GROUP_ROWS) {
            int nr = nrows - t0 < KVS_GROUP_ROWS ? nrows - t0 : KVS_GROUP_ROWS;
            for (int b = 0; b < nb; b++) {
                int h0 = group_first(nh, nb, b), h1 = group_first(nh, nb, b + 1);
                axpy_heads_blk(bf, h1 - h0, o + (size_t)h0 * ostride, ostride, p + (size_t)h0 * pstride + t0, pstride,
                               xh + (size_t)t0 * rstride, rstride, nr, n);
            }
        }
        return;
    }
#endif
    const uint8_t *xb = x;
    const size_t rb = rstride * elem_size(ctype);
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < nrows; t++)
            kvs_axpy_cache_float(ctype, o + (size_t)h * ostride, p[(size_t)h * pstride + t], xb + (size_t)t * rb, n);
}
