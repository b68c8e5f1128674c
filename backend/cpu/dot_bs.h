/*
 * dot_bs.h -- what the two engines of the block-scale route share
 * (dot_bs.c: AVX-512 VNNI; dot_amx.c: AMX-INT8 tiles): unpacking weight
 * blocks, the activation panels, the one-row kernel and the one-column Q4_K /
 * Q6_K kernels. Private to those two files, which are compiled with AVX-512
 * VNNI (dot_amx.c also with AMX); the float structure all of it computes is
 * described at the top of dot_bs.c.
 */
#ifndef KVS_DOT_BS_H
#define KVS_DOT_BS_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_private.h"
#include "quant_blocks.h"

#define KVS_BS_BP (128 * 1024) /* bytes of packed activations per pass */

static inline int bsize(int type) { return type == KVS_GGML_Q8_0 ? 34 : 22; }

/* A weight block's 32 values as int8 in element order. */
static inline __m256i wblock(int type, const uint8_t *blk) {
    return type == KVS_GGML_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2)) : q5_0_unpack(blk);
}

/* S_b: the block's exact integer dot (|w| as vpdpbusd's unsigned operand, x
 * with w's sign; |w| <= 128, |x| <= 127: no overflow). */
static inline int32_t block_isum(__m256i w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* The 8 scales d * sc and negated mins -(dmin * m) of a Q4_K superblock, as
 * vectors: the 6-bit fields of q4k_scale_min unpacked four at a time with
 * 32-bit masks and shifts (the same integers, the same float products). */
static inline void q4k_sm(const uint8_t *blk, __m256 *dw, __m256 *dm) {
    uint32_t u[3];
    memcpy(u, blk + 4, 12);
    const uint64_t sc = (uint64_t)(u[0] & 0x3f3f3f3fu) |
                        (uint64_t)((u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)) << 32;
    const uint64_t mn = (uint64_t)(u[1] & 0x3f3f3f3fu) |
                        (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)) << 32;
    const __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    *dw = _mm256_mul_ps(_mm256_set1_ps(h2f(blk)), fs);
    *dm = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(blk + 2)), fm), _mm256_set1_ps(-0.0f));
}

/* Q4_K superblock (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and
 * mins, 128 of nibbles): sub-block j's 32 values (0..15) into q, its scale
 * d * sc and its negated min -(dmin * m) into dw[j], dm[j]. */
static inline void q4k_unpack(const uint8_t *blk, __m256i q[8], float dw[8], float dm[8]) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < 4; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i));
        q[2 * i] = _mm256_and_si256(v, m4);
        q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    __m256 w, m;
    q4k_sm(blk, &w, &m);
    _mm256_storeu_ps(dw, w);
    _mm256_storeu_ps(dm, m);
}

/* An activation block's sum times its scale: Q4_K's min term per block. */
static inline float x_sum(const kvs_q8a_block *xb) { return xb->d * (float)(xb->sum16[0] + xb->sum16[1]); }

/* Q6_K superblock (210 bytes: ql[128], qh[64], int8 scales[16], f16 d):
 * 32-value block k (0..7) as int8 q - 32 in [-32, 31] into q[k]. */
static inline void q6k_unpack8(const uint8_t *blk, __m256i q[8]) {
    const __m256i o = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        q6k_unpack(blk, h, q + 4 * h);
        for (int k = 0; k < 4; k++) q[h * 4 + k] = _mm256_sub_epi8(q[h * 4 + k], o);
    }
}

/* Q6_K, NR rows (1 or 2: two rows' chains of dependent fmas overlap) against
 * one column, each row through exactly the operations of one row alone: per
 * superblock 16 groups of 16; each 32-value block's two halves are the two
 * 128-bit lanes of its vpdpbusd sums, kept apart by the tree. */
static inline __attribute__((always_inline)) void q6k_rows(const int NR, const uint8_t *const *r,
                                                         const kvs_q8a_block *x, int64_t n, float *y) {
    float acc[2] = {0.0f, 0.0f};
    for (int64_t s = 0; s < n / 256; s++) {
        int32_t S[2][16];
        const int8_t *sc[2];
        float d[2];
        for (int i = 0; i < NR; i++) {
            const uint8_t *blk = r[i] + s * 210;
            __m256i q[8], p[8];
            sc[i] = (const int8_t *)(blk + 192);
            d[i] = h2f(blk + 208);
            q6k_unpack8(blk, q);
            for (int k = 0; k < 8; k++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)x[s * 8 + k].q);
                p[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q[k], q[k]),
                                           _mm256_sign_epi8(xv, q[k]));
            }
            /* b: lanes [p0 p1 p2 p3] of the low halves, then of the high halves */
            const __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            _Alignas(32) int32_t t[16];
            _mm256_store_si256((__m256i *)t, b0);
            _mm256_store_si256((__m256i *)(t + 8), b1);
            for (int k = 0; k < 8; k++)
                S[i][2 * k] = t[(k / 4) * 8 + k % 4], S[i][2 * k + 1] = t[(k / 4) * 8 + 4 + k % 4];
        }
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < NR; i++)
                acc[i] = fmaf(d[i] * (float)sc[i][g] * x[s * 8 + g / 2].d, (float)S[i][g], acc[i]);
    }
    for (int i = 0; i < NR; i++) y[i] = acc[i];
}

/* Q4_K, NR rows (1 or 2) against one column, as q6k_rows: a superblock's 8
 * integer dots reduced together by a transposing horizontal-add tree, then
 * the float steps in order. */
static inline __attribute__((always_inline)) void q4k_rows(const int NR, const uint8_t *const *r,
                                                         const kvs_q8a_block *x, int64_t n, float *y) {
    float acc[2] = {0.0f, 0.0f};
    for (int64_t s = 0; s < n / 256; s++) {
        float dw[2][8], dm[2][8], S[2][8];
        for (int i = 0; i < NR; i++) {
            __m256i q[8], p[8];
            q4k_unpack(r[i] + s * 144, q, dw[i], dm[i]);
            for (int j = 0; j < 8; j++)
                p[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[j],
                                           _mm256_loadu_si256((const __m256i *)x[s * 8 + j].q));
            __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(b0), _mm256_extracti128_si256(b0, 1));
            __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(b1), _mm256_extracti128_si256(b1, 1));
            _mm256_storeu_ps(S[i], _mm256_cvtepi32_ps(_mm256_set_m128i(s1, s0)));
        }
        for (int j = 0; j < 8; j++) {
            const kvs_q8a_block *xb = &x[s * 8 + j];
            for (int i = 0; i < NR; i++) {
                acc[i] = fmaf(dw[i][j] * xb->d, S[i][j], acc[i]);
                acc[i] = fmaf(dm[i][j], x_sum(xb), acc[i]);
            }
        }
    }
    for (int i = 0; i < NR; i++) y[i] = acc[i];
}

/* One row, scalar fmaf per block (Q4_K, Q6_K: a superblock's integer dots reduced together). */
static inline float bs_one_row(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
    float y;
    if (type == KVS_GGML_Q6_K) {
        q6k_rows(1, &r, x, n, &y);
        return y;
    }
    if (type == KVS_GGML_Q4_K) {
        q4k_rows(1, &r, x, n, &y);
        return y;
    }
    const int bs = bsize(type);
    y = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = r + b * bs;
        y = fmaf(h2f(blk) * x[b].d, (float)block_isum(wblock(type, blk), x[b].q), y);
    }
    return y;
}


/* The f16 scales of block b of 16 rows (row r at blk + r * rb) as floats. */
static inline __m512 scales16(const uint8_t *blk, __m512i roff) {
    __m512i d = _mm512_i32gather_epi32(roff, blk, 1); /* 4 bytes from each row; the low 2 are the scale */
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

/* Q8_0 / Q5_0: block b of 16 rows as int8 values, row r at dst + r * ds,
 * each byte xor `flip` (0 for the tiles' signed operand; 0x80, i.e. w + 128,
 * for vpdpbusd's unsigned one). */
static inline void unpack16(int type, const uint8_t *blk, size_t rb, int8_t *dst, size_t ds, __m256i flip) {
    for (int r = 0; r < 16; r++)
        _mm256_storeu_si256((__m256i *)(dst + r * ds), _mm256_xor_si256(wblock(type, blk + r * rb), flip));
}

/* Q4_K: 16 rows unpacked to u8 values (row r at panel + r * n), their
 * scales and negated mins as floats (dwt / dmt [block][16]). */
static inline void q4k_prep(const uint8_t *r0, size_t rb, int64_t n, int8_t *panel, float *dwt, float *dmt) {
    __m256i q[8];
    float dw[8], dm[8];
    for (int r = 0; r < 16; r++)
        for (int64_t s = 0; s < n / 256; s++) {
            q4k_unpack(r0 + r * rb + s * 144, q, dw, dm);
            for (int j = 0; j < 8; j++) {
                _mm256_storeu_si256((__m256i *)(panel + r * n + (s * 8 + j) * 32), q[j]);
                dwt[(s * 8 + j) * 16 + r] = dw[j];
                dmt[(s * 8 + j) * 16 + r] = dm[j];
            }
        }
}

/* Q6_K: 16 rows as int8 q - 32 xor flip (row r at panel + r * n) and d * sc
 * per group of 16 (dwt [group][16]). */
static inline void q6k_prep(const uint8_t *r0, size_t rb, int64_t n, int8_t *panel, float *dwt, __m256i flip) {
    __m256i q[8];
    for (int r = 0; r < 16; r++)
        for (int64_t s = 0; s < n / 256; s++) {
            const uint8_t *blk = r0 + r * rb + s * 210;
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = h2f(blk + 208);
            q6k_unpack8(blk, q);
            for (int k = 0; k < 8; k++)
                _mm256_storeu_si256((__m256i *)(panel + r * n + (s * 8 + k) * 32), _mm256_xor_si256(q[k], flip));
            for (int g = 0; g < 16; g++) dwt[(s * 16 + g) * 16 + r] = d * (float)sc[g];
        }
}


/* Columns t0*16 .. of x packed for a pass of tn 16-column tiles: bp
 * [tile][block][8][16] int32 (4 activation bytes per column: the VNNI order of
 * an AMX B tile and of vpdpbusd's second operand), dxt [tile][block][16] the
 * scales, sxt the scaled sums (Q4_K's min term), and where cxt is not NULL
 * [tile][unit][16] the correction -co X of unsigned weights w + co (unit:
 * a block, or Q6_K's group of 16 with its own 16-sum). Columns past ncols
 * are zero. */
static inline void bs_pack(int q6, const kvs_q8a_block *x, int64_t xs, int ncols, int t0, int tn, int64_t nb,
                           int32_t *bp, float *dxt, float *sxt, int32_t *cxt, int co) {
    for (int t = 0; t < tn; t++) {
        /* real columns, then zeros: no pointer is formed past the last column (the compiler's masked loads
         * on such addresses took a fault-suppressing slow path on Zen 4, ~13 us a call with 2 columns) */
        const int nc = ncols - (t0 + t) * 16 < 16 ? ncols - (t0 + t) * 16 : 16;
        for (int64_t b = 0; b < nb; b++) {
            int32_t *B = bp + (t * nb + b) * 128;
            float *D = dxt + (t * nb + b) * 16, *SX = sxt + (t * nb + b) * 16;
            int c = 0;
            for (; c < nc; c++) {
                const kvs_q8a_block *xb = &x[(int64_t)((t0 + t) * 16 + c) * xs + b];
                for (int k = 0; k < 8; k++) memcpy(&B[k * 16 + c], xb->q + 4 * k, 4);
                D[c] = xb->d;
                SX[c] = x_sum(xb);
                if (!cxt) continue;
                if (q6) {
                    cxt[(t * 2 * nb + 2 * b) * 16 + c] = -co * xb->sum16[0];
                    cxt[(t * 2 * nb + 2 * b + 1) * 16 + c] = -co * xb->sum16[1];
                } else
                    cxt[(t * nb + b) * 16 + c] = -co * (xb->sum16[0] + xb->sum16[1]);
            }
            for (; c < 16; c++) {
                for (int k = 0; k < 8; k++) B[k * 16 + c] = 0;
                D[c] = 0.0f;
                SX[c] = 0.0f;
                if (!cxt) continue;
                if (q6) cxt[(t * 2 * nb + 2 * b) * 16 + c] = cxt[(t * 2 * nb + 2 * b + 1) * 16 + c] = 0;
                else cxt[(t * nb + b) * 16 + c] = 0;
            }
        }
    }
}

#endif /* KVS_DOT_BS_H */
