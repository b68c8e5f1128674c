/*
 * dot.c -- dot products of quantised weight rows with activations: the
 * integer dots of the Q8 activations (kvs_q8a_block, quant.c) for every
 * quantised type, one row at a time (kvs_dot_q8a) and rows against columns
 * in register tiles (kvs_dot_q8a_rows, batched decode), and the fp32 dots of
 * float rows. Scalar reference, AVX2 kernels, and the same kernels with AVX-512
 * VNNI (this file compiled again as dot_vnni.c; see "entry points"). Which
 * kernels a call runs: dispatch.c.
 * Block layouts: quant_blocks.h.
 * What it is not: no threading (forward.c splits rows over threads) and no
 * float matrix products.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "cpu_private.h"
#include "quant_blocks.h"

/* ---- dot products: scalar (the reference; the VNNI build has no use for it) -- */

#ifndef KVS_DOT_VNNI

static float dot_q8_0_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        const int8_t *q = (const int8_t *)(blk + 2);
        int s = 0;
        for (int i = 0; i < 32; i++) s += q[i] * x[b].q[i];
        acc += h2f(blk) * x[b].d * (float)s;
    }
    return acc;
}

static float dot_q5_0_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 22;
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        const uint8_t *qs = blk + 6;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            int q1 = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            s += q0 * x[b].q[j] + q1 * x[b].q[j + 16];
        }
        acc += h2f(blk) * x[b].d * (float)s;
    }
    return acc;
}

static float dot_q4_0_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 18;
        const uint8_t *qs = blk + 2;
        int s = 0;
        for (int j = 0; j < 16; j++) s += ((qs[j] & 0xF) - 8) * x[b].q[j] + ((qs[j] >> 4) - 8) * x[b].q[j + 16];
        acc += h2f(blk) * x[b].d * (float)s;
    }
    return acc;
}

/* sum (d q + m) xd xq = d xd sum(q xq) + m xd sum(xq) */
static float dot_q4_1_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 20;
        const uint8_t *qs = blk + 4;
        int s = 0;
        for (int j = 0; j < 16; j++) s += (qs[j] & 0xF) * x[b].q[j] + (qs[j] >> 4) * x[b].q[j + 16];
        acc += h2f(blk) * x[b].d * (float)s + h2f(blk + 2) * x[b].d * (float)(x[b].sum16[0] + x[b].sum16[1]);
    }
    return acc;
}

static float dot_q4_k_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nsb) {
    float acc = 0;
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 144;
        float d = h2f(blk), dmin = h2f(blk + 2);
        const uint8_t *qs = blk + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4k_scale_min(j, blk + 4, &sc, &m);
            const kvs_q8a_block *xb = &x[b * 8 + j];
            const uint8_t *q = qs + (j / 2) * 32;
            int shift = (j & 1) * 4, s = 0;
            for (int l = 0; l < 32; l++) s += ((q[l] >> shift) & 0xF) * xb->q[l];
            acc += d * sc * xb->d * (float)s - dmin * m * xb->d * (float)(xb->sum16[0] + xb->sum16[1]);
        }
    }
    return acc;
}

static float dot_q6_k_scalar(const uint8_t *row, const kvs_q8a_block *x, int64_t nsb) {
    float acc = 0;
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 210;
        float d = h2f(blk + 208);
        for (int k = 0; k < 8; k++) {
            const kvs_q8a_block *xb = &x[b * 8 + k];
            for (int h = 0; h < 2; h++) {
                int e0 = k * 32 + h * 16, s = 0;
                for (int l = 0; l < 16; l++) s += q6k_q(blk, e0 + l) * xb->q[h * 16 + l];
                acc += d * xb->d * (float)q6k_scale(blk, e0) * (float)(s - 32 * xb->sum16[h]);
            }
        }
    }
    return acc;
}

/* ---- dot products: AVX2 ------------------------------------------------------ */

#endif /* !KVS_DOT_VNNI */

#ifdef KVS_HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* unsigned int8 u x signed int8 s -> 8 int32 sums of 4 adjacent products.
 * AVX2: maddubs (pairs into int16, saturating) then madd with ones; VNNI:
 * one vpdpbusd. The same integers wherever no int16 pair sum saturates,
 * i.e. |u s| <= 16383 per product: every use here has u <= 128 and |s| <=
 * 127 (activations are quantised to [-127, 127]), so both builds give the
 * same sums and the same floats after them. */
#ifdef KVS_DOT_VNNI
#define KVS_DP4(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#else
#define KVS_DP4(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#endif

/* signed int8 x signed int8 -> 8 int32 partial sums (|a| as the unsigned
 * operand, b with a's sign) */
static inline __m256i dot_i8(__m256i a, __m256i b) {
    __m256i ax = _mm256_sign_epi8(a, a);
    __m256i sb = _mm256_sign_epi8(b, a);
    return KVS_DP4(ax, sb);
}

static float dot_q8_0_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *b0 = row + b * 34, *b1 = b0 + 34;
        __m256 p0 = _mm256_cvtepi32_ps(dot_i8(_mm256_loadu_si256((const __m256i *)(b0 + 2)),
                                              _mm256_loadu_si256((const __m256i *)x[b].q)));
        __m256 p1 = _mm256_cvtepi32_ps(dot_i8(_mm256_loadu_si256((const __m256i *)(b1 + 2)),
                                              _mm256_loadu_si256((const __m256i *)x[b + 1].q)));
        acc = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(b0) * x[b].d), acc);
        acc2 = _mm256_fmadd_ps(p1, _mm256_set1_ps(h2f(b1) * x[b + 1].d), acc2);
    }
    acc = _mm256_add_ps(acc, acc2);
    for (; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
        __m256i q = _mm256_loadu_si256((const __m256i *)x[b].q);
        __m256 p = _mm256_cvtepi32_ps(dot_i8(w, q));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(h2f(blk) * x[b].d), acc);
    }
    return hsum8(acc);
}

static float dot_q5_0_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 22;
        __m256i w = q5_0_unpack(blk);
        __m256i q = _mm256_loadu_si256((const __m256i *)x[b].q);
        __m256 p = _mm256_cvtepi32_ps(dot_i8(w, q));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(h2f(blk) * x[b].d), acc);
    }
    return hsum8(acc);
}

/* Q4_0's nibbles less 8 as signed int8, then as Q5_0 (t_q5_0 shares it). */
static float dot_q4_0_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 18;
        __m256i w = q4_0_unpack(blk);
        __m256 p = _mm256_cvtepi32_ps(dot_i8(w, _mm256_loadu_si256((const __m256i *)x[b].q)));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(h2f(blk) * x[b].d), acc);
    }
    return hsum8(acc);
}

/* Nibbles are unsigned, so maddubs takes them as its unsigned operand
 * directly; the offset m enters through the activations' block sums. */
static float dot_q4_1_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float offs = 0;
    const __m128i m4 = _mm_set1_epi8(0xF);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 20;
        __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 4));
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
        __m256i p = KVS_DP4(nib, _mm256_loadu_si256((const __m256i *)x[b].q));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(blk) * x[b].d), acc);
        offs += h2f(blk + 2) * x[b].d * (float)(x[b].sum16[0] + x[b].sum16[1]);
    }
    return hsum8(acc) + offs;
}

static float dot_q4_k_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nsb) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 144;
        float d = h2f(blk), dmin = h2f(blk + 2);
        const uint8_t *qs = blk + 16;
        const kvs_q8a_block *xb = &x[b * 8];
        for (int jp = 0; jp < 4; jp++) {
            int s0, m0, s1, m1;
            q4k_scale_min(2 * jp, blk + 4, &s0, &m0);
            q4k_scale_min(2 * jp + 1, blk + 4, &s1, &m1);
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + jp * 32));
            __m256i lo = _mm256_and_si256(q4, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const kvs_q8a_block *x0 = &xb[2 * jp], *x1 = &xb[2 * jp + 1];
            __m256i p0 = KVS_DP4(lo, _mm256_loadu_si256((const __m256i *)x0->q));
            __m256i p1 = KVS_DP4(hi, _mm256_loadu_si256((const __m256i *)x1->q));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * s0 * x0->d), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * s1 * x1->d), acc);
            mins += dmin * (m0 * x0->d * (float)(x0->sum16[0] + x0->sum16[1]) +
                            m1 * x1->d * (float)(x1->sum16[0] + x1->sum16[1]));
        }
    }
    return hsum8(acc) - mins;
}

static float dot_q6_k_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nsb) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0;
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 210;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = h2f(blk + 208);
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_unpack(blk, n, q);
            for (int qq = 0; qq < 4; qq++) {
                const kvs_q8a_block *xb = &x[b * 8 + n * 4 + qq];
                int sa = sc[n * 8 + qq * 2], sb = sc[n * 8 + qq * 2 + 1];
                __m256i p = _mm256_maddubs_epi16(q[qq], _mm256_loadu_si256((const __m256i *)xb->q));
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)sb), _mm_set1_epi16((short)sa));
                p = _mm256_madd_epi16(p, scv);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * xb->d), acc);
                off += d * xb->d * 32.0f * (float)(sa * xb->sum16[0] + sb * xb->sum16[1]);
            }
        }
    }
    return hsum8(acc) - off;
}
#endif

/* One row against one column: this build's kernels. */
static float dot_q8a(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
#ifdef KVS_HAVE_AVX2
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_avx2(r, x, n / 32);
    case KVS_GGML_Q4_0: return dot_q4_0_avx2(r, x, n / 32);
    case KVS_GGML_Q5_0: return dot_q5_0_avx2(r, x, n / 32);
    case KVS_GGML_Q4_1: return dot_q4_1_avx2(r, x, n / 32);
    case KVS_GGML_Q4_K: return dot_q4_k_avx2(r, x, n / 256);
    case KVS_GGML_Q6_K: return dot_q6_k_avx2(r, x, n / 256);
    default: break;
    }
#else
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_scalar(r, x, n / 32);
    case KVS_GGML_Q4_0: return dot_q4_0_scalar(r, x, n / 32);
    case KVS_GGML_Q5_0: return dot_q5_0_scalar(r, x, n / 32);
    case KVS_GGML_Q4_1: return dot_q4_1_scalar(r, x, n / 32);
    case KVS_GGML_Q4_K: return dot_q4_k_scalar(r, x, n / 256);
    case KVS_GGML_Q6_K: return dot_q6_k_scalar(r, x, n / 256);
    default: break;
    }
#endif
    assert(!"dot_q8a: type has no integer dot product");
    return 0;
}

#ifndef KVS_DOT_VNNI
/* Exposed to tests through a prototype there: the scalar reference path. */
/* The block-scale route's float structure (dot_bs.c) in plain C: per block, the
 * exact integer dot, then y = fma(dw * dx, S, y) in block order (Q4_K: then its min term;
 * Q6_K: per group of 16). */
float kvs_dot_q8a_bs_ref(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    assert(type == KVS_GGML_Q8_0 || type == KVS_GGML_Q5_0 || type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K);
    const uint8_t *r = row;
    float y = 0.0f;
    if (type == KVS_GGML_Q6_K) { /* per group of 16 with its own int8 scale */
        for (int64_t sb = 0; sb < n / 256; sb++) {
            const uint8_t *blk = r + sb * 210;
            const float d = h2f(blk + 208);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++) {
                    const int e = 16 * g + i;
                    s += (q6k_q(blk, e) - 32) * x[sb * 8 + e / 32].q[e % 32];
                }
                y = fmaf(d * (float)q6k_scale(blk, 16 * g) * x[sb * 8 + g / 2].d, (float)s, y);
            }
        }
        return y;
    }
    if (type == KVS_GGML_Q4_K) { /* per 32-value sub-block: the scale term, then the min term */
        for (int64_t sb = 0; sb < n / 256; sb++) {
            const uint8_t *blk = r + sb * 144;
            const float d = h2f(blk), dmin = h2f(blk + 2);
            for (int j = 0; j < 8; j++) {
                const kvs_q8a_block *xb = &x[sb * 8 + j];
                int sc, m, s = 0;
                q4k_scale_min(j, blk + 4, &sc, &m);
                for (int i = 0; i < 32; i++) {
                    const uint8_t q = blk[16 + 32 * (j / 2) + i];
                    s += (j % 2 ? q >> 4 : q & 0xF) * xb->q[i];
                }
                y = fmaf(d * (float)sc * xb->d, (float)s, y);
                y = fmaf(-(dmin * (float)m), xb->d * (float)(xb->sum16[0] + xb->sum16[1]), y);
            }
        }
        return y;
    }
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = r + b * (type == KVS_GGML_Q8_0 ? 34 : 22);
        int s = 0;
        for (int i = 0; i < 32; i++) {
            int w;
            if (type == KVS_GGML_Q8_0) w = ((const int8_t *)(blk + 2))[i];
            else {
                uint32_t qh;
                memcpy(&qh, blk + 2, 4);
                int nib = i < 16 ? blk[6 + i] & 0xF : blk[6 + i - 16] >> 4;
                w = (nib | (int)((qh >> i) & 1) << 4) - 16;
            }
            s += w * x[b].q[i];
        }
        y = fmaf(h2f(blk) * x[b].d, (float)s, y);
    }
    return y;
}

float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n);
float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_scalar(r, x, n / 32);
    case KVS_GGML_Q4_0: return dot_q4_0_scalar(r, x, n / 32);
    case KVS_GGML_Q5_0: return dot_q5_0_scalar(r, x, n / 32);
    case KVS_GGML_Q4_1: return dot_q4_1_scalar(r, x, n / 32);
    case KVS_GGML_Q4_K: return dot_q4_k_scalar(r, x, n / 256);
    case KVS_GGML_Q6_K: return dot_q6_k_scalar(r, x, n / 256);
    default: break;
    }
    assert(!"kvs_dot_q8a_scalar: type has no integer dot product");
    return 0;
}

static float dot_ff(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0;
#ifdef KVS_HAVE_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

float kvs_dot_f32(int type, const void *row, const float *x, int64_t n) {
    if (type == KVS_GGML_F32) return dot_ff(row, x, n);
    float buf[256];
    int blck = kvs_ggml_blck_size(type);
    int chunk = blck == 1 ? 256 : blck;
    size_t csize = kvs_ggml_row_size(type, chunk);
    const uint8_t *r = row;
    float s = 0;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk, r += csize) {
        kvs_status st = kvs_dequant_row(type, r, buf, chunk, NULL);
        assert(st == KVS_OK);
        (void)st;
        s += dot_ff(buf, x + i, chunk);
    }
    if (i < n) { /* float types only: tail shorter than 256 */
        kvs_status st = kvs_dequant_row(type, r, buf, n - i, NULL);
        assert(st == KVS_OK);
        (void)st;
        s += dot_ff(buf, x + i, n - i);
    }
    return s;
}

/* fp32 dot for the attention code (model.c). */
float kvs_dot_ff(const float *a, const float *b, int64_t n);
float kvs_dot_ff(const float *a, const float *b, int64_t n) { return dot_ff(a, b, n); }
#endif /* !KVS_DOT_VNNI */

/* ---- multi-column dot products (batched decode) --------------------------------
 * Weight rows against ncols activation vectors: each weight block is
 * unpacked once and multiplied with every column of a register tile. Every
 * column goes through exactly the operations of kvs_dot_q8a (same
 * accumulators, same order, same scale products; the build has no fp
 * contraction, -std=c11), so out[c][r] == kvs_dot_q8a(type, row r, x + c *
 * xstride, n) bit for bit: a batch decodes each sequence as it would decode
 * alone, and one column is kvs_dot_q8a itself (single-sequence decode
 * unchanged). What the tiles save is the per-column scalar work: the scale
 * products and the Q4_K mins / Q6_K offsets are made for a whole tile with
 * vector operations from activation data transposed once per call. */

#ifdef KVS_HAVE_AVX2
/* Q8_0 / Q5_0 (and Q4_0) tiles: one row against NC <= T columns (NC a compile-time
 * count), the same operations per column as dot_q8_0_avx2 / dot_q5_0_avx2
 * (same accumulators, same block order, same scale products d * xd), but
 * the scale products of a block are made for all T columns with one vector
 * multiply from xdT [nb][T] (the tile's activation scales, transposed once
 * per call) and each column broadcasts its own from memory: per column and
 * block the kernel is sign, maddubs, madd, cvt, fma. */
#define KVS_T8 4 /* Q8_0 columns per tile: 2 x 4 accumulators in registers */

#define KVS_T5 8 /* Q5_0 columns per tile: 8 accumulators */

static inline __attribute__((always_inline)) void t_q8_0(int NC, const uint8_t *row, const kvs_q8a_block *x,
                                                         int64_t xs, int64_t nb, const float *xdT, float *y) {
    __m256 acc[KVS_T8], acc2[KVS_T8];
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = acc2[c] = _mm256_setzero_ps();
    float sc0[KVS_T8], sc1[KVS_T8];
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *b0 = row + b * 34, *b1 = b0 + 34;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2)), w1 = _mm256_loadu_si256((const __m256i *)(b1 + 2));
        __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
        _mm_storeu_ps(sc0, _mm_mul_ps(_mm_set1_ps(h2f(b0)), _mm_loadu_ps(xdT + b * KVS_T8)));
        _mm_storeu_ps(sc1, _mm_mul_ps(_mm_set1_ps(h2f(b1)), _mm_loadu_ps(xdT + (b + 1) * KVS_T8)));
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const kvs_q8a_block *xc = x + c * xs;
            __m256i s0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xc[b].q), w0);
            __m256i s1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xc[b + 1].q), w1);
            __m256 p0 = _mm256_cvtepi32_ps(KVS_DP4(a0, s0));
            __m256 p1 = _mm256_cvtepi32_ps(KVS_DP4(a1, s1));
            acc[c] = _mm256_fmadd_ps(p0, _mm256_set1_ps(sc0[c]), acc[c]);
            acc2[c] = _mm256_fmadd_ps(p1, _mm256_set1_ps(sc1[c]), acc2[c]);
        }
    }
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = _mm256_add_ps(acc[c], acc2[c]);
    for (; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
        _mm_storeu_ps(sc0, _mm_mul_ps(_mm_set1_ps(h2f(blk)), _mm_loadu_ps(xdT + b * KVS_T8)));
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const kvs_q8a_block *xc = x + c * xs;
            __m256 p = _mm256_cvtepi32_ps(dot_i8(w, _mm256_loadu_si256((const __m256i *)xc[b].q)));
            acc[c] = _mm256_fmadd_ps(p, _mm256_set1_ps(sc0[c]), acc[c]);
        }
    }
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) y[c] = hsum8(acc[c]);
}

/* Q5_0 or Q4_0 (type): the same operations once the block is unpacked. */
static inline __attribute__((always_inline)) void t_q5_0(int type, int NC, const uint8_t *row,
                                                         const kvs_q8a_block *x, int64_t xs, int64_t nb,
                                                         const float *xdT, float *y) {
    __m256 acc[KVS_T5];
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    float sc[KVS_T5];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * (type == KVS_GGML_Q4_0 ? 18 : 22);
        __m256i w = type == KVS_GGML_Q4_0 ? q4_0_unpack(blk) : q5_0_unpack(blk);
        __m256i aw = _mm256_sign_epi8(w, w);
        _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(h2f(blk)), _mm256_loadu_ps(xdT + b * KVS_T5)));
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m256i sq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[c * xs + b].q), w);
            __m256 p = _mm256_cvtepi32_ps(KVS_DP4(aw, sq));
            acc[c] = _mm256_fmadd_ps(p, _mm256_set1_ps(sc[c]), acc[c]);
        }
    }
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) y[c] = hsum8(acc[c]);
}

/* Q8_0 / Q5_0 rows against ncols columns, tiles of T columns: the tiles'
 * activation scales transposed once per call (xdT) and reused for every row.
 * Row-major over the rows: a weight row is read from memory once and stays
 * in L1 for all column tiles. A lone column is dot_q8a itself. */
#define KVS_XDT_MAX 8192 /* floats of transposed scales per pass (32 KiB of stack) */
#ifndef KVS_RB
#define KVS_RB 16 /* rows per block: their weights stay in L1 while each column tile passes over them */
#endif

static inline __attribute__((always_inline)) void t_rows(int type, int T, const uint8_t *rows, size_t rb,
                                                         int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                                                         int ncols, int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32;
    float xdT[KVS_XDT_MAX];
    if (ncols == 1 || nb * T > KVS_XDT_MAX) { /* rows of more than 8192 * 32 / T values: column by column */
        for (int64_t r = 0; r < nrows; r++)
            for (int c = 0; c < ncols; c++)
                out[(int64_t)c * os + r] = dot_q8a(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
        return;
    }
    int per = (int)(KVS_XDT_MAX / (nb * T)) * T; /* columns per pass, whole tiles */
    for (int c0 = 0; c0 < ncols; c0 += per) {
        int npass = ncols - c0 < per ? ncols - c0 : per;
        int ntile = (npass + T - 1) / T, last = npass - (ntile - 1) * T;
        for (int t = 0; t < ntile; t++)
            for (int64_t b = 0; b < nb; b++)
                for (int c = 0; c < T; c++) {
                    int cc = t * T + c;
                    xdT[(t * nb + b) * T + c] = cc < npass ? x[(int64_t)(c0 + cc) * xs + b].d : 0.0f;
                }
        for (int64_t r0 = 0; r0 < nrows; r0 += KVS_RB)
            for (int t = 0; t < ntile; t++)
                for (int64_t r = r0; r < nrows && r < r0 + KVS_RB; r++) {
                    const uint8_t *row = rows + (size_t)r * rb;
                    int nc = t < ntile - 1 ? T : last, cc = c0 + t * T;
                    const kvs_q8a_block *xc = x + (int64_t)cc * xs;
                    const float *xt = xdT + t * nb * T;
                    float y[8];
                    if (type == KVS_GGML_Q8_0) {
                        switch (nc) {
                        case 4: t_q8_0(4, row, xc, xs, nb, xt, y); break;
                        case 3: t_q8_0(3, row, xc, xs, nb, xt, y); break;
                        case 2: t_q8_0(2, row, xc, xs, nb, xt, y); break;
                        default: t_q8_0(1, row, xc, xs, nb, xt, y); break;
                        }
                    } else {
                        switch (nc) {
                        case 8: t_q5_0(type, 8, row, xc, xs, nb, xt, y); break;
                        case 7: t_q5_0(type, 7, row, xc, xs, nb, xt, y); break;
                        case 6: t_q5_0(type, 6, row, xc, xs, nb, xt, y); break;
                        case 5: t_q5_0(type, 5, row, xc, xs, nb, xt, y); break;
                        case 4: t_q5_0(type, 4, row, xc, xs, nb, xt, y); break;
                        case 3: t_q5_0(type, 3, row, xc, xs, nb, xt, y); break;
                        case 2: t_q5_0(type, 2, row, xc, xs, nb, xt, y); break;
                        default: t_q5_0(type, 1, row, xc, xs, nb, xt, y); break;
                        }
                    }
                    for (int c = 0; c < nc; c++) out[(int64_t)(cc + c) * os + r] = y[c];
                }
    }
}

/* Q4_K / Q6_K tiles of NC <= 4 columns: the operations of dot_q4_k_avx2 /
 * dot_q6_k_avx2 per column (same order; the build has no fp contraction, so
 * a vector mul/add over the tile's 4 columns rounds as the scalar one does),
 * the per-column scalar work (scale products, the mins / offset terms) done
 * for the 4 columns at once from transposed activation data: XD [nb][4]
 * scales, and per block the 16-sums: FS [nb][4] (Q4_K: float of both halves)
 * or S0, S1 [nb][4] (Q6_K: each half, int32). */
#define KVS_TK 4

static inline __attribute__((always_inline)) void t_q4_k(int NC, const uint8_t *row, const kvs_q8a_block *x,
                                                         int64_t xs, int64_t nsb, const float *XD, const float *FS,
                                                         float *y) {
    __m256 acc[KVS_TK];
    __m128 mins = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF);
    #pragma GCC unroll 4
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    float sc0[KVS_TK], sc1[KVS_TK];
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 144;
        float d = h2f(blk), dmin = h2f(blk + 2);
        const uint8_t *qs = blk + 16;
        for (int jp = 0; jp < 4; jp++) {
            int s0, m0, s1, m1;
            q4k_scale_min(2 * jp, blk + 4, &s0, &m0);
            q4k_scale_min(2 * jp + 1, blk + 4, &s1, &m1);
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + jp * 32));
            __m256i lo = _mm256_and_si256(q4, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const int64_t k0 = b * 8 + 2 * jp;
            __m128 xd0 = _mm_loadu_ps(XD + k0 * KVS_TK), xd1 = _mm_loadu_ps(XD + (k0 + 1) * KVS_TK);
            /* d * s0 * x0->d, per column */
            _mm_storeu_ps(sc0, _mm_mul_ps(_mm_set1_ps(d * (float)s0), xd0));
            _mm_storeu_ps(sc1, _mm_mul_ps(_mm_set1_ps(d * (float)s1), xd1));
            /* mins += dmin * (m0 * x0->d * fs0 + m1 * x1->d * fs1) */
            __m128 t0 = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps((float)m0), xd0), _mm_loadu_ps(FS + k0 * KVS_TK));
            __m128 t1 = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps((float)m1), xd1), _mm_loadu_ps(FS + (k0 + 1) * KVS_TK));
            mins = _mm_add_ps(mins, _mm_mul_ps(_mm_set1_ps(dmin), _mm_add_ps(t0, t1)));
            #pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const kvs_q8a_block *x0 = &x[c * xs + k0], *x1 = x0 + 1;
                __m256i p0 = KVS_DP4(lo, _mm256_loadu_si256((const __m256i *)x0->q));
                __m256i p1 = KVS_DP4(hi, _mm256_loadu_si256((const __m256i *)x1->q));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(sc0[c]), acc[c]);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(sc1[c]), acc[c]);
            }
        }
    }
    float mn[KVS_TK];
    _mm_storeu_ps(mn, mins);
    #pragma GCC unroll 4
    for (int c = 0; c < NC; c++) y[c] = hsum8(acc[c]) - mn[c];
}

static inline __attribute__((always_inline)) void t_q6_k(int NC, const uint8_t *row, const kvs_q8a_block *x,
                                                         int64_t xs, int64_t nsb, const float *XD, const int32_t *S0,
                                                         const int32_t *S1, float *y) {
    __m256 acc[KVS_TK];
    __m128 off = _mm_setzero_ps();
    #pragma GCC unroll 4
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    float sc[KVS_TK];
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * 210;
        const int8_t *scl = (const int8_t *)(blk + 192);
        float d = h2f(blk + 208);
        const __m128 dv = _mm_set1_ps(d);
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_unpack(blk, n, q);
            for (int qq = 0; qq < 4; qq++) {
                int sa = scl[n * 8 + qq * 2], sb = scl[n * 8 + qq * 2 + 1];
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)sb), _mm_set1_epi16((short)sa));
                const int64_t k = b * 8 + n * 4 + qq;
                /* d * xb->d per column; off += d * xb->d * 32 * (sa * sum16[0] + sb * sum16[1]) */
                __m128 dxd = _mm_mul_ps(dv, _mm_loadu_ps(XD + k * KVS_TK));
                _mm_storeu_ps(sc, dxd);
                __m128i si = _mm_add_epi32(_mm_mullo_epi32(_mm_set1_epi32(sa), _mm_loadu_si128((const __m128i *)(S0 + k * KVS_TK))),
                                           _mm_mullo_epi32(_mm_set1_epi32(sb), _mm_loadu_si128((const __m128i *)(S1 + k * KVS_TK))));
                off = _mm_add_ps(off, _mm_mul_ps(_mm_mul_ps(dxd, _mm_set1_ps(32.0f)), _mm_cvtepi32_ps(si)));
                #pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    const kvs_q8a_block *xb = &x[c * xs + k];
                    __m256i p = _mm256_maddubs_epi16(q[qq], _mm256_loadu_si256((const __m256i *)xb->q));
                    p = _mm256_madd_epi16(p, scv);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc[c]), acc[c]);
                }
            }
        }
    }
    float of[KVS_TK];
    _mm_storeu_ps(of, off);
    #pragma GCC unroll 4
    for (int c = 0; c < NC; c++) y[c] = hsum8(acc[c]) - of[c];
}

/* Q4_K / Q6_K rows against ncols columns in tiles of 4, transposed
 * activation data per pass (as t_rows). */
static void tk_rows(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                    int ncols, int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32, nsb = n / 256;
    float XD[KVS_XDT_MAX / 3], FS[KVS_XDT_MAX / 3];
    int32_t S0[KVS_XDT_MAX / 3], S1[KVS_XDT_MAX / 3];
    if (ncols == 1 || nb * KVS_TK > KVS_XDT_MAX / 3) {
        for (int64_t r = 0; r < nrows; r++)
            for (int c = 0; c < ncols; c++)
                out[(int64_t)c * os + r] = dot_q8a(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
        return;
    }
    int per = (int)(KVS_XDT_MAX / 3 / (nb * KVS_TK)) * KVS_TK;
    for (int c0 = 0; c0 < ncols; c0 += per) {
        int npass = ncols - c0 < per ? ncols - c0 : per;
        int ntile = (npass + KVS_TK - 1) / KVS_TK, last = npass - (ntile - 1) * KVS_TK;
        for (int t = 0; t < ntile; t++)
            for (int64_t b = 0; b < nb; b++)
                for (int c = 0; c < KVS_TK; c++) {
                    int cc = t * KVS_TK + c;
                    int64_t i = (t * nb + b) * KVS_TK + c;
                    const kvs_q8a_block *xb = cc < npass ? &x[(int64_t)(c0 + cc) * xs + b] : NULL;
                    XD[i] = xb ? xb->d : 0.0f;
                    FS[i] = xb ? (float)(xb->sum16[0] + xb->sum16[1]) : 0.0f;
                    S0[i] = xb ? xb->sum16[0] : 0;
                    S1[i] = xb ? xb->sum16[1] : 0;
                }
        for (int64_t r0 = 0; r0 < nrows; r0 += KVS_RB)
            for (int t = 0; t < ntile; t++)
                for (int64_t r = r0; r < nrows && r < r0 + KVS_RB; r++) {
                    const uint8_t *row = rows + (size_t)r * rb;
                    int nc = t < ntile - 1 ? KVS_TK : last, cc = c0 + t * KVS_TK;
                    const kvs_q8a_block *xc = x + (int64_t)cc * xs;
                    const int64_t o = t * nb * KVS_TK;
                    float y[KVS_TK];
#define KVS_TK_CALL(N)                                                                                         \
    if (type == KVS_GGML_Q4_K) t_q4_k(N, row, xc, xs, nsb, XD + o, FS + o, y);                                 \
    else t_q6_k(N, row, xc, xs, nsb, XD + o, S0 + o, S1 + o, y);
                    switch (nc) {
                    case 4: KVS_TK_CALL(4) break;
                    case 3: KVS_TK_CALL(3) break;
                    case 2: KVS_TK_CALL(2) break;
                    default: KVS_TK_CALL(1) break;
                    }
#undef KVS_TK_CALL
                    for (int c = 0; c < nc; c++) out[(int64_t)(cc + c) * os + r] = y[c];
                }
    }
}

#endif

/* Rows against columns: this build's kernels (see kvs_dot_q8a_rows). */
static void dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                         int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    const uint8_t *rw = rows;
#ifdef KVS_HAVE_AVX2
    if (type == KVS_GGML_Q8_0) {
        t_rows(KVS_GGML_Q8_0, KVS_T8, rw, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
    if (type == KVS_GGML_Q5_0) {
        t_rows(KVS_GGML_Q5_0, KVS_T5, rw, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
    if (type == KVS_GGML_Q4_0) { /* Q8_0 / Q4_0 KV cache rows against the query heads (kvcache.c) */
        t_rows(KVS_GGML_Q4_0, KVS_T5, rw, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
    if (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K) {
        tk_rows(type, rw, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
#endif
    for (int64_t r = 0; r < nrows; r++)
        for (int c = 0; c < ncols; c++)
            out[(int64_t)c * ostride + r] = dot_q8a(type, rw + (size_t)r * row_bytes, x + (int64_t)c * xstride, n);
}

/* ---- entry points ---------------------------------------------------------------
 * This file is compiled twice: as itself (x86-64-v3: AVX2, FMA, F16C, or
 * scalar) and, where the compiler can, as dot_vnni.c with AVX-512 VNNI
 * (KVS_DOT_VNNI: only KVS_DP4 differs). Each build exports its kernels under
 * its own names (_base, _vnni); dispatch.c runs the VNNI build's on CPUs that
 * have AVX512_VNNI and AVX512VL (vpdpbusd on 256-bit vectors: one instruction
 * for maddubs + madd), with bit-identical results (KVS_DP4;
 * tests/backend/test_backend_quant_cols.c checks both builds against each
 * other). */
#ifdef KVS_DOT_VNNI
float kvs_dot_q8a_vnni(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    return dot_q8a(type, row, x, n);
}
void kvs_dot_q8a_rows_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    dot_q8a_rows(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}
#else
float kvs_dot_q8a_base(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    return dot_q8a(type, row, x, n);
}

void kvs_dot_q8a_rows_base(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    dot_q8a_rows(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}
#endif /* KVS_DOT_VNNI */
