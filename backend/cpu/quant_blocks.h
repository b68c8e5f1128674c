/*
 * quant_blocks.h -- the GGUF quantised block layouts and the small accessors
 * quant.c (dequantisation, quantisation) and dot.c (dot products) share.
 * Private to backend/cpu/.
 *
 * Block layouts (as ggml defines them; our own code):
 *   Q8_0  32 values: f16 d, int8 q[32]                 x = d*q
 *   Q5_0  32 values: f16 d, u8 qh[4], u8 qs[16]        x = d*((nib | hbit<<4) - 16)
 *         element j < 16: low nibble of qs[j], element j+16: high nibble; hbit = bit j of qh
 *   Q4_0  32 values: f16 d, u8 qs[16]                  x = d*(nib - 8)
 *         element j < 16: low nibble of qs[j], element j+16: high nibble
 *   Q4_1  32 values: f16 d, f16 m, u8 qs[16]           x = d*nib + m
 *         element j < 16: low nibble of qs[j], element j+16: high nibble
 *   Q4_K  256 values: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *         8 sub-blocks of 32 with 6-bit scale sc and min m: x = d*sc*q - dmin*m;
 *         sub-blocks 2i and 2i+1 share qs[32i..32i+32) (low / high nibbles)
 *   Q6_K  256 values: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
 *         16 groups of 16 with an int8 scale: x = d*sc*(q - 32), q 6-bit
 */
#ifndef KVS_QUANT_BLOCKS_H
#define KVS_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVS_HAVE_AVX2 1
#endif

#include "kvs_cpu.h"

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef KVS_HAVE_AVX2
    return _cvtsh_ss(h);
#else
    return kvs_f16_to_f32(h);
#endif
}
static inline void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q6_K element e: half n = e/128, quarter qq = (e%128)/32, l = e%32. */
static inline int q6k_q(const uint8_t *b, int e) {
    const uint8_t *ql = b, *qh = b + 128;
    int n = e / 128, qq = (e % 128) / 32, l = e % 32;
    int lo = ql[n * 64 + l + (qq & 1) * 32];
    lo = qq >= 2 ? lo >> 4 : lo & 0xF;
    int hi = (qh[n * 32 + l] >> (2 * qq)) & 3;
    return lo | (hi << 4);
}
static inline int q6k_scale(const uint8_t *b, int e) {
    const int8_t *sc = (const int8_t *)(b + 192);
    int n = e / 128, qq = (e % 128) / 32, l = e % 32;
    return sc[n * 8 + qq * 2 + l / 16];
}

#ifdef KVS_HAVE_AVX2
/* Q5_0's high bits: byte j of the result is 0xFF where bit j of `bits` is set. */
static inline __m256i bytes_from_bits32(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* A Q5_0 block's 32 stored q in [0, 31] (value q - 16), in element order
 * (low nibbles of qs are elements 0..15, high nibbles 16..31; bit j of qh is
 * element j's fifth bit); q5_0_unpack gives the values as int8 in [-16, 15]:
 * what the dot kernels and the dequantiser share. */
static inline __m256i q5_0_unpack_u(const uint8_t *blk) {
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6)), m4 = _mm_set1_epi8(0xF);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    const __m256i hb = _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nib, hb);
}
static inline __m256i q5_0_unpack(const uint8_t *blk) {
    return _mm256_sub_epi8(q5_0_unpack_u(blk), _mm256_set1_epi8(16));
}

/* A Q4_0 block's 32 values as int8 in [-8, 7], element order (low nibbles of
 * qs are elements 0..15, high nibbles 16..31): the dot kernels' unpacking. */
static inline __m256i q4_0_unpack(const uint8_t *blk) {
    const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(0xF);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
}

/* Half n (0, 1) of a Q6_K superblock: its four 32-value blocks as u8 q in
 * [0, 63], element order (the dot kernels of dot.c and dot_amx.c share it). */
static inline __attribute__((always_inline)) void q6k_unpack(const uint8_t *blk, int n, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + n * 64));
    __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + n * 64 + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + n * 32));
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
}
#endif

#endif /* KVS_QUANT_BLOCKS_H */
