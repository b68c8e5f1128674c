/*
 * dot_kv.c -- decode attention's kernels on a Q8_0 / Q4_0 KV cache (head size
 * n <= KVS_CACHE_QMAX): the key dots of a GQA group's query heads against one
 * KV head's rows, and the weighted value sums.
 *
 * Keys: each row's int8 values are made float in registers once for every
 * head, dotted with the fp32 query per block of 32 and scaled by the block's
 * d; eight rows' per-head vectors are then reduced together (one transposed
 * sum gives the eight results as one vector). Measured on the AVX2 EPYC VM
 * (tests/backend/bench_kv_attn.c, 7 heads of d 64): 22 ns a row, where the
 * integer route (the query quantised to 8 bits, maddubs / madd per block as
 * the weight kernels and llama.cpp do) took 28 and f16 rows take 19: that
 * CPU's vector integer multiplies are the slow part, and a key row of 2 to
 * 16 blocks gives them nothing to amortise. Values: each row's weight p is
 * multiplied by its block's scale once per tile (p x d), then the int8
 * values are made float and added with one fma per head and element.
 *
 * Each row's and head's float operations are fixed (keys: per block b in
 * order a_b = q_b . k_b in four fmas, acc = fma(a_b, d_b, acc), then the
 * lanes as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), times scale; values:
 * the rows in order), so a row's or a head's result never depends on which
 * rows or heads share its call: kvs_dot_cache / kvs_axpy_cache (one row,
 * one head) give the group kernels' bits.
 * What it is not: no other block type, no threads; the block-scale route
 * (dot_bs.c) is kvcache.c's choice where the CPU has it.
 */
#include "cpu_private.h"
#include "quant_blocks.h"

#define ROWS 8     /* key rows per pass: one vector of sums */
#define KV_TILE 32 /* value rows per tile: their weights p * d stay in L1 */

#ifdef KVS_HAVE_AVX2
/* The eight lane sums of a[0..7] as one vector, lane r = row r's sum. */
static inline __m256 reduce8(const __m256 a[ROWS]) {
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    /* h0 lane r (r < 4): row r's lanes 0..3 (low half) and 4..7 (high half) */
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

/* The float route of the key dots: out[c * os + r] = scale x sum over the
 * blocks b of d_b x (q_c . k_b), k_b the block's int8 values made float in
 * registers once per row for every head, q_c the fp32 query; eight rows'
 * per-head vectors reduced together (reduce8). No integer multiplies: what
 * a CPU whose vector integer multiply is slow runs faster. */
void kvs_dot_kv_rows_f(int gtype, const void *rows, size_t rb, int nrows, const float *q, size_t qs, int ncols,
                       int n, float scale, float *out, size_t os) {
    enum { NBM = KVS_CACHE_QMAX / 32, CM = 16 };
    const int nb = n / 32, q8 = gtype == KVS_GGML_Q8_0;
    const size_t bb = q8 ? 34 : 18;
    __m256 R[CM][ROWS]; /* [head][row]: the row's lane vector */
    const __m256 vs = _mm256_set1_ps(scale);
    for (int c0 = 0; c0 < ncols; c0 += CM) {
        const int nc = ncols - c0 < CM ? ncols - c0 : CM;
        for (int r0 = 0; r0 < nrows; r0 += ROWS) {
            const int nr = nrows - r0 < ROWS ? nrows - r0 : ROWS;
            for (int r = 0; r < ROWS; r++) {
                if (r >= nr) {
                    for (int c = 0; c < nc; c++) R[c][r] = _mm256_setzero_ps();
                    continue;
                }
                const uint8_t *row = (const uint8_t *)rows + (size_t)(r0 + r) * rb;
                for (int c = 0; c < nc; c++) R[c][r] = _mm256_setzero_ps();
                for (int b = 0; b < nb; b++) {
                    const uint8_t *blk = row + (size_t)b * bb;
                    const __m256i w = q8 ? _mm256_loadu_si256((const __m256i *)(blk + 2)) : q4_0_unpack(blk);
                    const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
                    const __m256 k0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
                    const __m256 k1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
                    const __m256 k2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
                    const __m256 k3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
                    const __m256 d = _mm256_set1_ps(h2f(blk));
                    for (int c = 0; c < nc; c++) {
                        const float *qb = q + (size_t)(c0 + c) * qs + (size_t)b * 32;
                        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qb), k0);
                        a = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), k1, a);
                        a = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 16), k2, a);
                        a = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), k3, a);
                        R[c][r] = _mm256_fmadd_ps(a, d, R[c][r]);
                    }
                }
            }
            for (int c = 0; c < nc; c++) {
                const __m256 sm = _mm256_mul_ps(reduce8(R[c]), vs);
                float *o = out + (size_t)(c0 + c) * os + r0;
                if (nr == ROWS) {
                    _mm256_storeu_ps(o, sm);
                } else {
                    float t[ROWS];
                    _mm256_storeu_ps(t, sm);
                    for (int r = 0; r < nr; r++) o[r] = t[r];
                }
            }
        }
    }
}

/* 16 elements (half hf of block column b) of HN <= 4 heads over nr rows in
 * order: 8 accumulators in registers, per row the half's int8 values made
 * floats once and one fma per head and element with the weight p * d. */
static inline __attribute__((always_inline)) void axpy_half(int q8, int HN, int hf, float *o, size_t os,
                                                            const float *pw, const uint8_t *x, size_t rb, int nr) {
    __m256 a[4][2];
    #pragma GCC unroll 4
    for (int h = 0; h < HN; h++)
        #pragma GCC unroll 2
        for (int i = 0; i < 2; i++) a[h][i] = _mm256_loadu_ps(o + (size_t)h * os + 8 * i);
    for (int t = 0; t < nr; t++) {
        const uint8_t *blk = x + (size_t)t * rb;
        __m128i q;
        if (q8) q = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * hf));
        else { /* Q4_0: elements 0..15 the low nibbles of qs, 16..31 the high ones */
            const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(0xF);
            q = _mm_sub_epi8(_mm_and_si128(hf ? _mm_srli_epi16(qs, 4) : qs, m4), _mm_set1_epi8(8));
        }
        const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
        #pragma GCC unroll 4
        for (int h = 0; h < HN; h++) {
            const __m256 w = _mm256_broadcast_ss(pw + (size_t)h * KV_TILE + t);
            a[h][0] = _mm256_fmadd_ps(w, v0, a[h][0]);
            a[h][1] = _mm256_fmadd_ps(w, v1, a[h][1]);
        }
    }
    #pragma GCC unroll 4
    for (int h = 0; h < HN; h++)
        #pragma GCC unroll 2
        for (int i = 0; i < 2; i++) _mm256_storeu_ps(o + (size_t)h * os + 8 * i, a[h][i]);
}

void kvs_axpy_kv_rows(int gtype, float *o, size_t os, int nh, const float *p, size_t ps, const void *x, size_t rb,
                      int nrows, int n) {
    enum { NBM = KVS_CACHE_QMAX / 32 };
    const int nb = n / 32, q8 = gtype == KVS_GGML_Q8_0;
    const size_t bb = q8 ? 34 : 18;
    float pw[NBM][4][KV_TILE]; /* [block][head of the pass][row]: p * d */
    float dt[NBM][KV_TILE];    /* [block][row]: the scales */
    for (int t0 = 0; t0 < nrows; t0 += KV_TILE) {
        const int nr = nrows - t0 < KV_TILE ? nrows - t0 : KV_TILE, nr8 = nr / 8 * 8;
        const uint8_t *xt = (const uint8_t *)x + (size_t)t0 * rb;
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < nr; t++) dt[b][t] = h2f(xt + (size_t)t * rb + (size_t)b * bb);
        for (int h0 = 0; h0 < nh; h0 += 4) {
            const int hn = nh - h0 < 4 ? nh - h0 : 4;
            for (int b = 0; b < nb; b++)
                for (int h = 0; h < hn; h++) {
                    const float *ph = p + (size_t)(h0 + h) * ps + t0;
                    int t = 0;
                    for (; t < nr8; t += 8)
                        _mm256_storeu_ps(&pw[b][h][t], _mm256_mul_ps(_mm256_loadu_ps(ph + t), _mm256_loadu_ps(&dt[b][t])));
                    for (; t < nr; t++) pw[b][h][t] = ph[t] * dt[b][t];
                }
            for (int b = 0; b < nb; b++)
                for (int hf = 0; hf < 2; hf++) {
                    float *ob = o + (size_t)h0 * os + (size_t)b * 32 + 16 * hf;
                    const uint8_t *xb = xt + (size_t)b * bb;
                    const float *w = pw[b][0];
#define KVS_KV_AXPY(Q)                                                          \
    switch (hn) {                                                               \
    case 4: axpy_half(Q, 4, hf, ob, os, w, xb, rb, nr); break;                  \
    case 3: axpy_half(Q, 3, hf, ob, os, w, xb, rb, nr); break;                  \
    case 2: axpy_half(Q, 2, hf, ob, os, w, xb, rb, nr); break;                  \
    default: axpy_half(Q, 1, hf, ob, os, w, xb, rb, nr); break;                 \
    }
                    if (q8) {
                        KVS_KV_AXPY(1)
                    } else {
                        KVS_KV_AXPY(0)
                    }
#undef KVS_KV_AXPY
                }
        }
    }
}
#else
/* Without AVX2: the same sums in plain C, lanes in order (this build's own bits). */
static int elem(const uint8_t *blk, int q8, int j) {
    return q8 ? (int)(int8_t)blk[2 + j] : (j < 16 ? (blk[2 + j] & 0xF) : (blk[2 + j - 16] >> 4)) - 8;
}

void kvs_dot_kv_rows_f(int gtype, const void *rows, size_t rb, int nrows, const float *q, size_t qs, int ncols,
                       int n, float scale, float *out, size_t os) {
    const int nb = n / 32, q8 = gtype == KVS_GGML_Q8_0;
    const size_t bb = q8 ? 34 : 18;
    for (int r = 0; r < nrows; r++)
        for (int c = 0; c < ncols; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = (const uint8_t *)rows + (size_t)r * rb + (size_t)b * bb;
                float a = 0;
                for (int j = 0; j < 32; j++) a += q[(size_t)c * qs + (size_t)b * 32 + j] * (float)elem(blk, q8, j);
                acc += a * h2f(blk);
            }
            out[(size_t)c * os + r] = acc * scale;
        }
}

void kvs_axpy_kv_rows(int gtype, float *o, size_t os, int nh, const float *p, size_t ps, const void *x, size_t rb,
                      int nrows, int n) {
    const int q8 = gtype == KVS_GGML_Q8_0;
    const size_t bb = q8 ? 34 : 18;
    for (int h = 0; h < nh; h++)
        for (int e = 0; e < n; e++) {
            const int b = e / 32, j = e % 32;
            float acc = o[(size_t)h * os + e];
            for (int t = 0; t < nrows; t++) {
                const uint8_t *blk = (const uint8_t *)x + (size_t)t * rb + (size_t)b * bb;
                acc += (p[(size_t)h * ps + t] * h2f(blk)) * (float)elem(blk, q8, j);
            }
            o[(size_t)h * os + e] = acc;
        }
}
#endif
