/*
 * attn512.c -- decode attention's GQA-group kernels (kvs_dot_cache_heads,
 * kvs_axpy_cache_heads of simd.c) again on AVX-512F, for f16 / bf16 cache
 * rows whose head size is a multiple of 32. Compiled with AVX-512 flags
 * (backend/CMakeLists.txt) and run only where kvs_attn512_available() finds
 * the instructions; simd.c calls in here and keeps every other case.
 *
 * Bit for bit simd.c's results, hence those of the one-head kernels
 * kvs_dot_cache / kvs_axpy_cache (test_backend_attn checks both paths):
 *   - dot: one zmm per 16-element chunk holds the AVX2 kernel's two
 *     accumulators (lanes 0-7 = a0, lanes 8-15 = a1), so each lane sees the
 *     same fma chain; a0 + a1 is the low half plus the high half, and the
 *     horizontal sum of eight rows is done at once by hsum8_rows, which adds
 *     the lanes in hsum8's order.
 *   - axpy: every output element's fma chain over the rows in order, as
 *     before; only the chunk width (32 elements, 2 zmm) and the number of
 *     heads a pass (up to 8) differ, which change no operation.
 * Why it is faster: two rows at a time in the dot (14 independent fma chains
 * where one row had 7: a row's chain is only d / 16 long) and one conversion
 * of each element for up to 8 heads; one row at a time on zmm was no faster
 * than AVX2. A one-thread harness on a 2-core Sapphire Rapids VM (7 heads,
 * d 64, dot then axpy, ns a key + value row pair): rows in cache 27 -> 23,
 * rows streamed from 96 MiB 39 -> 32-34 (both with the spread prefetch of
 * engine_private.h; docs/performance.md, last subsection).
 *
 * What it is not: no f32 rows, no other head sizes, no threads.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine_private.h"

#define A512_HEADS 8  /* heads a pass: 2 rows x 8 accumulators (dot), 2 x 8 (axpy) */
#define A512_ROWS 32  /* rows a block, as simd.c: 32 x 64 x 2 bytes = 4 KiB at Qwen2.5's head size */

#if defined(__GNUC__)
#define A512_INLINE static inline __attribute__((always_inline))
#else
#define A512_INLINE static inline
#endif

int kvs_attn512_available(void) {
    static atomic_int state; /* 0 not asked yet, 1 no, 2 yes */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        const char *e = getenv("KVSIEVE_ATTN512");
        s = (e && e[0] == '0') || !__builtin_cpu_supports("avx512f") ? 1 : 2;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s == 2;
}

A512_INLINE __m512 ld16(int bf, const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (bf) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The AVX2 kernel's a0 + a1: lanes 0-7 plus lanes 8-15 (AVX-512F has no
 * 256-bit float extract, hence the double view). */
A512_INLINE __m256 a0_plus_a1(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* {hsum8(v[0]), .., hsum8(v[7])} for eight rows' a0 + a1 (v: [8][8]) bit for
 * bit: each lane takes hsum8's additions in its order (low half + high half,
 * then lanes 0 + 2 and 1 + 3, then those two); only the shuffles that line
 * the operands up differ. */
A512_INLINE __m256 hsum8_rows(const float *v) {
    __m256 s[4]; /* s[j]: rows j | j + 4, each low half + high half */
    for (int j = 0; j < 4; j++) {
        __m256 a = _mm256_load_ps(v + 8 * j), b = _mm256_load_ps(v + 8 * (j + 4));
        s[j] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    /* lanes 0 + 2 and 1 + 3: rows 0, 1 | 4, 5 and rows 2, 3 | 6, 7 */
    __m256 u01 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
    __m256 u23 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
    /* lane 0 + lane 1: rows 0 .. 7 in order */
    return _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x88), _mm256_shuffle_ps(u01, u23, 0xDD));
}

/* out[h * os + t] = q_h . row t * scale for NH heads, rows [0, nrows) of one block */
A512_INLINE void dot_blk(int bf, const int NH, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows,
                         int n, float scale, float *out, size_t os) {
    _Alignas(32) float v[A512_HEADS][64]; /* head h, row r of the group: a0 + a1 at v[h] + 8 r */
    const __m256 vs = _mm256_set1_ps(scale);
    for (int t = 0; t < nrows; t += 8) {
        const int m = nrows - t < 8 ? nrows - t : 8;
        if (m < 8) /* the rows past the end: defined values, never stored */
            for (int h = 0; h < NH; h++)
                for (int e = 8 * m; e < 64; e++) v[h][e] = 0;
        for (int r = 0; r < m; r += 2) {
            /* rows r and r + 1 together (r + 1 past the end: row r again, never stored) */
            const uint16_t *r0 = k + (size_t)(t + r) * rse, *r1 = r + 1 < m ? r0 + rse : r0;
            __m512 a[A512_HEADS], b[A512_HEADS];
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) a[h] = b[h] = _mm512_setzero_ps();
            for (int i = 0; i < n; i += 16) {
                if (i % 32 == 0) {
                    kvs_prefetch_ahead(r0 + i);
                    kvs_prefetch_ahead(r1 + i);
                }
                __m512 k0 = ld16(bf, r0 + i), k1 = ld16(bf, r1 + i);
#pragma GCC unroll 8
                for (int h = 0; h < NH; h++) {
                    __m512 qq = _mm512_loadu_ps(q + h * qs + i);
                    a[h] = _mm512_fmadd_ps(qq, k0, a[h]);
                    b[h] = _mm512_fmadd_ps(qq, k1, b[h]);
                }
            }
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                _mm256_store_ps(v[h] + 8 * r, a0_plus_a1(a[h]));
                _mm256_store_ps(v[h] + 8 * r + 8, a0_plus_a1(b[h]));
            }
        }
        const __mmask8 keep = (__mmask8)((1u << m) - 1);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) _mm256_mask_storeu_ps(out + h * os + t, keep, _mm256_mul_ps(hsum8_rows(v[h]), vs));
    }
}

/* o[h * os + d] += p[h * ps + t] row t [d], rows [0, nrows) in order, NH heads */
A512_INLINE void axpy_blk(int bf, const int NH, float *o, size_t os, const float *p, size_t ps, const uint16_t *x,
                          size_t rse, int nrows, int n) {
    for (int d = 0; d < n; d += 32) {
        __m512 c0[A512_HEADS], c1[A512_HEADS];
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            c0[h] = _mm512_loadu_ps(o + h * os + d);
            c1[h] = _mm512_loadu_ps(o + h * os + d + 16);
        }
        for (int t = 0; t < nrows; t++) {
            const uint16_t *r = x + (size_t)t * rse + d;
            kvs_prefetch_ahead(r);
            __m512 v0 = ld16(bf, r), v1 = ld16(bf, r + 16);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                __m512 a = _mm512_set1_ps(p[h * ps + t]);
                c0[h] = _mm512_fmadd_ps(a, v0, c0[h]);
                c1[h] = _mm512_fmadd_ps(a, v1, c1[h]);
            }
        }
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            _mm512_storeu_ps(o + h * os + d, c0[h]);
            _mm512_storeu_ps(o + h * os + d + 16, c1[h]);
        }
    }
}

/* One block for nh <= A512_HEADS heads: the head count and element type are
 * constants per instance, so the accumulators are registers. */
#define A512_CASES(F, ...)                                                                                             \
    switch (nh * 2 + (bf != 0)) {                                                                                      \
    case 2: F(0, 1, __VA_ARGS__); break;                                                                               \
    case 3: F(1, 1, __VA_ARGS__); break;                                                                               \
    case 4: F(0, 2, __VA_ARGS__); break;                                                                               \
    case 5: F(1, 2, __VA_ARGS__); break;                                                                               \
    case 6: F(0, 3, __VA_ARGS__); break;                                                                               \
    case 7: F(1, 3, __VA_ARGS__); break;                                                                               \
    case 8: F(0, 4, __VA_ARGS__); break;                                                                               \
    case 9: F(1, 4, __VA_ARGS__); break;                                                                               \
    case 10: F(0, 5, __VA_ARGS__); break;                                                                              \
    case 11: F(1, 5, __VA_ARGS__); break;                                                                              \
    case 12: F(0, 6, __VA_ARGS__); break;                                                                              \
    case 13: F(1, 6, __VA_ARGS__); break;                                                                              \
    case 14: F(0, 7, __VA_ARGS__); break;                                                                              \
    case 15: F(1, 7, __VA_ARGS__); break;                                                                              \
    case 16: F(0, 8, __VA_ARGS__); break;                                                                              \
    case 17: F(1, 8, __VA_ARGS__); break;                                                                              \
    default: break; /* nh is 1 .. A512_HEADS (the caller splits) */                                                    \
    }

static void dot_pass(int bf, int nh, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows, int n,
                     float scale, float *out, size_t os) {
    A512_CASES(dot_blk, q, qs, k, rse, nrows, n, scale, out, os)
}

static void axpy_pass(int bf, int nh, float *o, size_t os, const float *p, size_t ps, const uint16_t *x, size_t rse,
                      int nrows, int n) {
    A512_CASES(axpy_blk, o, os, p, ps, x, rse, nrows, n)
}

/* Heads in passes of at most A512_HEADS, as even as possible (11: 6 + 5). */
static int passes(int nh) { return (nh + A512_HEADS - 1) / A512_HEADS; }
static int first(int nh, int nb, int b) { return (int)((long)nh * b / nb); }

void kvs_dot_cache_heads512(int bf, const float *q, size_t qstride, int nh, const uint16_t *k, size_t rstride,
                            int nrows, int n, float scale, float *out, size_t ostride) {
    const int nb = passes(nh);
    for (int t0 = 0; t0 < nrows; t0 += A512_ROWS) {
        const int nr = nrows - t0 < A512_ROWS ? nrows - t0 : A512_ROWS;
        for (int b = 0; b < nb; b++) {
            const int h0 = first(nh, nb, b), h1 = first(nh, nb, b + 1);
            dot_pass(bf, h1 - h0, q + (size_t)h0 * qstride, qstride, k + (size_t)t0 * rstride, rstride, nr, n, scale,
                     out + (size_t)h0 * ostride + t0, ostride);
        }
    }
}

void kvs_axpy_cache_heads512(int bf, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                             const uint16_t *x, size_t rstride, int nrows, int n) {
    const int nb = passes(nh);
    for (int t0 = 0; t0 < nrows; t0 += A512_ROWS) { /* blocks in row order */
        const int nr = nrows - t0 < A512_ROWS ? nrows - t0 : A512_ROWS;
        for (int b = 0; b < nb; b++) {
            const int h0 = first(nh, nb, b), h1 = first(nh, nb, b + 1);
            axpy_pass(bf, h1 - h0, o + (size_t)h0 * ostride, ostride, p + (size_t)h0 * pstride + t0, pstride,
                      x + (size_t)t0 * rstride, rstride, nr, n);
        }
    }
}
