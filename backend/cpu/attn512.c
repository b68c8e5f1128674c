/*
 * attn512.c -- decode attention's GQA-group kernels (kvs_dot_cache_heads,
 * kvs_axpy_cache_heads of simd.c) again on AVX-512F, for f16 / bf16 cache
 * rows whose head size is a multiple of 32. Compiled with AVX-512 flags
 * (backend/cpu/CMakeLists.txt) and run only where kvs_attn512_available()
 * (features.c) finds the instructions; dispatch.c sends calls here, simd.c
 * (the reference) keeps every other case.
 *
 * Bit for bit simd.c's results, hence those of the one-head kernels
 * kvs_dot_cache / kvs_axpy_cache (test_backend_attn checks both paths):
 *   - dot: one zmm per 16-element chunk holds the AVX2 kernel's two
 *     accumulators (lanes 0-7 = a0, lanes 8-15 = a1), so each lane sees the
 *     same fma chain; a0 + a1 is the low half plus the high half, and the
 *     horizontal sums of eight rows are done at once on zmm registers
 *     (pair_sums, reduce8), every lane through hsum8's additions in order.
 *   - axpy: every output element's fma chain over the rows in order, as
 *     before; only the chunk width (32 elements, 2 zmm; the whole row for
 *     rows of 64) and the number of heads a pass (up to 8) differ, which
 *     change no operation.
 * Why it is faster: several rows at a time in the dot (a row's fma chain
 * is only d / 16 long): two rows for 5-8 heads (10-16 chains), four rows
 * for up to 4 heads (16 chains; two rows left Gemma 3's 4 heads of d 256
 * with 8 chains of 16 dependent fmas); the eight-row reduction on zmm
 * (fewer shuffle-port operations than a 256-bit tree or a horizontal sum a
 * row); one conversion of each element for up to 8 heads in the axpy,
 * whose prefetch runs a whole block of rows ahead (a chunk pass reads one
 * line a row, so 8 KiB ahead was only 16 rows of d 256 and half of each
 * block's lines came late); rows of 64 a whole row at a time, in address
 * order (axpy_row64_blk). One row at a time on zmm was no faster than
 * AVX2. One-thread harnesses on a 2-core Sapphire Rapids VM, ns a row:
 *   - 7 heads, d 64, dot then axpy (a key + value row pair): rows in cache
 *     27 -> 23, streamed from 96 MiB 39 -> 32-34 (both with the spread
 *     prefetch of cpu_private.h); the zmm reduction took the dot alone a
 *     further 13-19%.
 *   - four rows (2026-12-04 19:00 UTC), dot only, before / after: 4 heads of
 *     d 256 33.2 / 20.7 in cache, 33.3 / 22.3-25.0 streamed from 32 MiB; 2
 *     of d 256 20.0 / 13.3; 4 of d 128 16.9 / 11.3; 4 of d 64 9.8 / 7.1.
 *     The axpy of 4 heads of d 256 streamed from 32 MiB 27.0-27.7 / 22.5-22.8
 *     with the block-ahead prefetch. Four rows for 7 heads (as passes of 4
 *     + 3) was 15.8 -> 13.2 in cache but no faster from memory (17.8 / 17.7-
 *     18.1 over 100 MiB), and Qwen2.5's full cache at 25K tokens decoded
 *     20.7-21.3 tok/s against 21.3-21.6 with two rows: not kept.
 *
 * What it is not: no f32 rows, no other head sizes, no threads.
 */
#include <immintrin.h>
#include <stdint.h>

#include "cpu_private.h"

#define A512_HEADS 8      /* heads a pass: 2 rows x 8 accumulators (dot), 2 x 8 (axpy; 4 x 8 for rows of 64) */
#define A512_DOT4_HEADS 4 /* up to this many heads the dot takes 4 rows at a time (16 accumulators) */
#define A512_ROWS 32      /* rows a block, as simd.c: 32 x 64 x 2 bytes = 4 KiB at Qwen2.5's head size */

#if defined(__GNUC__)
#define A512_INLINE static inline __attribute__((always_inline))
#else
#define A512_INLINE static inline
#endif

A512_INLINE __m512 ld16(int bf, const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (bf) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Eight rows' horizontal sums at once, bit for bit those of the AVX2 kernel
 * (hsum8 of a0 + a1 per row). Rows j and j + 4 are accumulated together (a
 * and b), and z = [a0 + a1 of row j | a0 + a1 of row j + 4] is the first
 * addition of both (low 256 bits + high 256 bits). reduce8 then takes every
 * lane through hsum8's remaining additions in its order: each 128-bit quarter
 * of a row's a0 + a1 low + high, lanes 0 + 2 and 1 + 3, then those two; the
 * shuffles only line the operands up (rows 0..7 come out in lanes 0..7). */
A512_INLINE __m512 pair_sums(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

A512_INLINE __m256 reduce8(const float *z /* [4][16]: pair j at z + 16 j */) {
    const __m512 z0 = _mm512_load_ps(z), z1 = _mm512_load_ps(z + 16), z2 = _mm512_load_ps(z + 32),
                 z3 = _mm512_load_ps(z + 48);
    /* quarters: rows 0, 4, 1, 5 and rows 2, 6, 3, 7, each low half + high half of its a0 + a1 */
    const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
    const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(z2, z3, 0x88), _mm512_shuffle_f32x4(z2, z3, 0xDD));
    /* lanes 0 + 2 and 1 + 3: quarters rows 0, 2 | 4, 6 | 1, 3 | 5, 7 */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
    /* lane 0 + lane 1: quarters r0, r2, r0, r2 | r4, r6, .. | r1, r3, .. | r5, r7, .. */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(u, u, 0x88), _mm512_shuffle_ps(u, u, 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, r));
}

/* out[h * os + t] = q_h . row t * scale for NH heads, rows [0, nrows) of one block */
A512_INLINE void dot_blk(int bf, const int NH, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows,
                         int n, float scale, float *out, size_t os) {
    _Alignas(64) float z[A512_HEADS][64]; /* head h, pair j: [a0 + a1 of row j | of row j + 4] at z[h] + 16 j */
    const __m256 vs = _mm256_set1_ps(scale);
    for (int t = 0; t < nrows; t += 8) {
        const int m = nrows - t < 8 ? nrows - t : 8;
        const uint16_t *base = k + (size_t)t * rse;
        /* R rows at a time, R / 2 of reduce8's pairs (rows j + p and j + p + 4): four for up to
         * A512_DOT4_HEADS heads, two for more (the accumulators must fit in registers; R is a constant
         * per instance). A row past the end reads row 0 again, and its sums are never stored. */
        const int R = NH <= A512_DOT4_HEADS ? 4 : 2;
        for (int j = 0; j < 4; j += R / 2) {
            const uint16_t *r[4];
            __m512 a[4][A512_HEADS];
#pragma GCC unroll 4
            for (int x = 0; x < R; x++) {
                const int row = j + x / 2 + (x % 2) * 4; /* x = 2 p: row j + p; x = 2 p + 1: row j + p + 4 */
                r[x] = row < m ? base + (size_t)row * rse : base;
#pragma GCC unroll 8
                for (int h = 0; h < NH; h++) a[x][h] = _mm512_setzero_ps();
            }
            for (int i = 0; i < n; i += 16) {
                __m512 kx[4];
#pragma GCC unroll 4
                for (int x = 0; x < R; x++) {
                    if (i % 32 == 0) kvs_prefetch_ahead(r[x] + i);
                    kx[x] = ld16(bf, r[x] + i);
                }
#pragma GCC unroll 8
                for (int h = 0; h < NH; h++) {
                    const __m512 qq = _mm512_loadu_ps(q + h * qs + i);
#pragma GCC unroll 4
                    for (int x = 0; x < R; x++) a[x][h] = _mm512_fmadd_ps(qq, kx[x], a[x][h]);
                }
            }
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++)
#pragma GCC unroll 2
                for (int p = 0; p < R / 2; p++)
                    _mm512_store_ps(z[h] + 16 * (j + p), pair_sums(a[2 * p][h], a[2 * p + 1][h]));
        }
        const __mmask8 keep = (__mmask8)((1u << m) - 1);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) _mm256_mask_storeu_ps(out + h * os + t, keep, _mm256_mul_ps(reduce8(z[h]), vs));
    }
}

/* axpy_blk for rows of exactly 64 elements (Qwen2.5's and SmolLM2's head size), a whole row at a time: four
 * zmm of values against every head's four accumulators (7 or 8 heads spill a few of them to the stack, and
 * are still faster than two passes). The chunk passes read line 0 of every row of a block, then line 1;
 * rows in address order stream faster from memory. One-thread harness, f16 rows, ns a row, chunk passes /
 * whole rows, streamed from 100 MiB and in cache (512 rows): 7 heads 16.4-16.5 / 11.8-12.7 and 6.6 / 6.4;
 * 8 heads 17.5 / 13.0 and 7.6 / 8.4; 3 heads 14.0 / 10.1 and 3.7 / 3.4; 1 head 11.1 / 10.5 and 2.2 / 2.1.
 * Every output element's fma chain over the rows is the one of axpy_blk, so the bits are the same. */
A512_INLINE void axpy_row64_blk(int bf, const int NH, float *o, size_t os, const float *p, size_t ps,
                                const uint16_t *x, size_t rse, int nrows) {
    __m512 c[A512_HEADS][4];
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) c[h][k] = _mm512_loadu_ps(o + h * os + 16 * k);
    for (int t = 0; t < nrows; t++) {
        const uint16_t *r = x + (size_t)t * rse;
        kvs_prefetch_ahead(r);
        kvs_prefetch_ahead(r + 32);
        __m512 v[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) v[k] = ld16(bf, r + 16 * k);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            const __m512 a = _mm512_set1_ps(p[h * ps + t]);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) c[h][k] = _mm512_fmadd_ps(a, v[k], c[h][k]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(o + h * os + 16 * k, c[h][k]);
}

/* o[h * os + d] += p[h * ps + t] row t [d], rows [0, nrows) in order, NH heads */
A512_INLINE void axpy_blk(int bf, const int NH, float *o, size_t os, const float *p, size_t ps, const uint16_t *x,
                          size_t rse, int nrows, int n) {
    if (n == 64) {
        axpy_row64_blk(bf, NH, o, os, p, ps, x, rse, nrows);
        return;
    }
    /* a chunk pass reads one line a row: prefetch a whole block of rows ahead (at least the usual 8 KiB) */
    const size_t blk = (size_t)A512_ROWS * rse * 2, pf = blk > KVS_PREFETCH_AHEAD ? blk : KVS_PREFETCH_AHEAD;
    for (int d = 0; d < n; d += 32) {
        __m512 c0[A512_HEADS], c1[A512_HEADS];
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            c0[h] = _mm512_loadu_ps(o + h * os + d);
            c1[h] = _mm512_loadu_ps(o + h * os + d + 16);
        }
        for (int t = 0; t < nrows; t++) {
            const uint16_t *r = x + (size_t)t * rse + d;
            __builtin_prefetch((const void *)((uintptr_t)r + pf), 0, 3);
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

/* One block for nh heads (1 .. 8; the callers split): the head count and
 * element type are constants per instance, so the accumulators are
 * registers. */
#define A512_CASE(F, NH, ...)                                                                                          \
    case 2 * (NH): F(0, NH, __VA_ARGS__); break;                                                                       \
    case 2 * (NH) + 1: F(1, NH, __VA_ARGS__); break;
#define A512_CASES(F, ...)                                                                                             \
    A512_CASE(F, 1, __VA_ARGS__) A512_CASE(F, 2, __VA_ARGS__)                                                          \
    A512_CASE(F, 3, __VA_ARGS__) A512_CASE(F, 4, __VA_ARGS__)                                                          \
    A512_CASE(F, 5, __VA_ARGS__) A512_CASE(F, 6, __VA_ARGS__)                                                          \
    A512_CASE(F, 7, __VA_ARGS__) A512_CASE(F, 8, __VA_ARGS__)

static void dot_pass(int bf, int nh, const float *q, size_t qs, const uint16_t *k, size_t rse, int nrows, int n,
                     float scale, float *out, size_t os) {
    switch (nh * 2 + (bf != 0)) {
        A512_CASES(dot_blk, q, qs, k, rse, nrows, n, scale, out, os)
    default: break;
    }
}

static void axpy_pass(int bf, int nh, float *o, size_t os, const float *p, size_t ps, const uint16_t *x, size_t rse,
                      int nrows, int n) {
    switch (nh * 2 + (bf != 0)) {
        A512_CASES(axpy_blk, o, os, p, ps, x, rse, nrows, n)
    default: break;
    }
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
