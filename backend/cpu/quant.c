/*
 * quant.c -- GGUF tensor types: sizes, dequantisation, a reference quantiser
 * and the activation quantiser of the integer dot products (dot.c).
 *
 * Block layouts: quant_blocks.h.
 * What it is not: no dot products (dot.c), no threading.
 */
#include <assert.h>
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "quant_blocks.h"

typedef struct {
    int type;
    const char *name;
    int blck;
    size_t size;
    int supported;
} type_info;

static const type_info TYPES[] = {
    {KVS_GGML_F32, "F32", 1, 4, 1},       {KVS_GGML_F16, "F16", 1, 2, 1},
    {KVS_GGML_Q4_0, "Q4_0", 32, 18, 1},   {KVS_GGML_Q4_1, "Q4_1", 32, 20, 1},
    {KVS_GGML_Q5_0, "Q5_0", 32, 22, 1},   {KVS_GGML_Q5_1, "Q5_1", 32, 24, 0},
    {KVS_GGML_Q8_0, "Q8_0", 32, 34, 1},   {KVS_GGML_Q8_1, "Q8_1", 32, 36, 0},
    {KVS_GGML_Q2_K, "Q2_K", 256, 84, 0},  {KVS_GGML_Q3_K, "Q3_K", 256, 110, 0},
    {KVS_GGML_Q4_K, "Q4_K", 256, 144, 1}, {KVS_GGML_Q5_K, "Q5_K", 256, 176, 0},
    {KVS_GGML_Q6_K, "Q6_K", 256, 210, 1}, {KVS_GGML_Q8_K, "Q8_K", 256, 292, 0},
    {KVS_GGML_BF16, "BF16", 1, 2, 1},
};

static const type_info *tinfo(int type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].type == type) return &TYPES[i];
    return NULL;
}

const char *kvs_ggml_type_name(int type) {
    const type_info *t = tinfo(type);
    return t ? t->name : "?";
}
int kvs_ggml_type_supported(int type) {
    const type_info *t = tinfo(type);
    return t ? t->supported : 0;
}
int kvs_ggml_blck_size(int type) {
    const type_info *t = tinfo(type);
    return t ? t->blck : 0;
}
size_t kvs_ggml_type_size(int type) {
    const type_info *t = tinfo(type);
    return t ? t->size : 0;
}
size_t kvs_ggml_row_size(int type, int64_t n) {
    const type_info *t = tinfo(type);
    if (!t) return 0;
    assert(n % t->blck == 0);
    return (size_t)(n / t->blck) * t->size;
}

static void f2h(uint8_t *p, float f) {
    uint16_t h = kvs_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* ---- dequantisation --------------------------------------------------------- */

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) y[i] = d * q[i];
}

#ifdef KVS_HAVE_AVX2
/* The 32 values as int8 (the dot kernels' unpacking), then d * (float)q eight
 * at a time: the scalar loop's operations, so the same floats. Prefill
 * dequantises every weight once per chunk, and Q5_0 is most of Qwen2.5's. */
static void deq_q5_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    int8_t q[32];
    _mm256_storeu_si256((__m256i *)q, q5_0_unpack(b));
    const __m256 vd = _mm256_set1_ps(d);
    for (int i = 0; i < 32; i += 8) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(vd, f));
    }
}
#else
static void deq_q5_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = d * (float)(((qs[j] & 0xF) | (h0 << 4)) - 16);
        y[j + 16] = d * (float)(((qs[j] >> 4) | (h1 << 4)) - 16);
    }
}
#endif

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0xF) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0xF) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int s, m;
        q4k_scale_min(j, sc, &s, &m);
        const uint8_t *q = qs + (j / 2) * 32;
        int shift = (j & 1) * 4;
        for (int l = 0; l < 32; l++) y[j * 32 + l] = d * s * ((q[l] >> shift) & 0xF) - dmin * m;
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    float d = h2f(b + 208);
    for (int e = 0; e < 256; e++) y[e] = d * q6k_scale(b, e) * (q6k_q(b, e) - 32);
}

kvs_status kvs_dequant_row(int type, const void *src, float *dst, int64_t n, kvs_err *err) {
    const type_info *t = tinfo(type);
    if (!t || !t->supported)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "tensor type %s (%d) cannot be dequantised",
                          kvs_ggml_type_name(type), type);
    if (n % t->blck)
        return kvs_errorf(err, KVS_ERR_INVALID, "row of %lld elements is not a multiple of the %s block (%d)",
                          (long long)n, t->name, t->blck);
    const uint8_t *p = src;
    switch (type) {
    case KVS_GGML_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KVS_GGML_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = h2f(p + 2 * i);
        break;
    case KVS_GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = kvs_bf16_to_f32(h);
        }
        break;
    default:
        for (int64_t b = 0; b < n / t->blck; b++) {
            const uint8_t *blk = p + (size_t)b * t->size;
            float *y = dst + b * t->blck;
            if (type == KVS_GGML_Q8_0) deq_q8_0(blk, y);
            else if (type == KVS_GGML_Q4_0) deq_q4_0(blk, y);
            else if (type == KVS_GGML_Q5_0) deq_q5_0(blk, y);
            else if (type == KVS_GGML_Q4_1) deq_q4_1(blk, y);
            else if (type == KVS_GGML_Q4_K) deq_q4_k(blk, y);
            else deq_q6_k(blk, y);
        }
    }
    return KVS_OK;
}

/* ---- reference quantiser ---------------------------------------------------- */

static int iround(float x) { return (int)lrintf(x); }
static int clampi(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    f2h(b, d);
    int8_t *q = (int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) q[i] = (int8_t)clampi(iround(x[i] * id), -127, 127);
}

/* The value of largest magnitude maps to -8 (the sign kept), so the 16
 * levels [-8, 7] cover it exactly; everything else rounds to nearest. */
static void quant_q4_0(const float *x, uint8_t *b) {
    float mx = 0, amax = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    float d = mx / -8, id = d != 0 ? 1 / d : 0;
    f2h(b, d);
    uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(iround(x[j] * id) + 8, 0, 15), q1 = clampi(iround(x[j + 16] * id) + 8, 0, 15);
        qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q5_0(const float *x, uint8_t *b) {
    float amax = 0, mx = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); mx = x[i]; }
    float d = mx / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
    f2h(b, d);
    d = h2f(b);
    id = d != 0 ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(iround(x[j] * id) + 16, 0, 31), q1 = clampi(iround(x[j + 16] * id) + 16, 0, 31);
        qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    memcpy(b + 2, &qh, 4);
}

/* min / max per block; d and m are rounded to f16 before the nibbles are
 * chosen, so the nibbles fit the scale the reader will see. */
static void quant_q4_1(const float *x, uint8_t *b) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    f2h(b, (hi - lo) / 15.0f);
    f2h(b + 2, lo);
    float d = h2f(b), m = h2f(b + 2), id = d > 0 ? 1.0f / d : 0.0f;
    uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(iround((x[j] - m) * id), 0, 15), q1 = clampi(iround((x[j + 16] - m) * id), 0, 15);
        qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q4_k(const float *x, uint8_t *b) {
    float scale[8], minv[8], maxs = 0, maxm = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[j * 32 + l]);
            hi = fmaxf(hi, x[j * 32 + l]);
        }
        scale[j] = (hi - lo) / 15.0f;
        minv[j] = -lo;
        maxs = fmaxf(maxs, scale[j]);
        maxm = fmaxf(maxm, minv[j]);
    }
    float d = maxs / 63.0f, dmin = maxm / 63.0f;
    f2h(b, d);
    f2h(b + 2, dmin);
    d = h2f(b);
    dmin = h2f(b + 2);
    uint8_t *sc = b + 4, *qs = b + 16;
    memset(sc, 0, 12);
    int S[8], M[8];
    for (int j = 0; j < 8; j++) {
        S[j] = d > 0 ? clampi((int)ceilf(scale[j] / d), 0, 63) : 0;
        M[j] = dmin > 0 ? clampi(iround(minv[j] / dmin), 0, 63) : 0;
        if (j < 4) {
            sc[j] |= (uint8_t)S[j];
            sc[j + 4] |= (uint8_t)M[j];
        } else {
            sc[j + 4] = (uint8_t)((S[j] & 0xF) | ((M[j] & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((S[j] >> 4) << 6);
            sc[j] |= (uint8_t)((M[j] >> 4) << 6);
        }
    }
    memset(qs, 0, 128);
    for (int j = 0; j < 8; j++) {
        float ds = d * S[j], dm = dmin * M[j];
        for (int l = 0; l < 32; l++) {
            int q = ds > 0 ? clampi(iround((x[j * 32 + l] + dm) / ds), 0, 15) : 0;
            qs[(j / 2) * 32 + l] |= (uint8_t)(q << ((j & 1) * 4));
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *b) {
    float s[16], maxs = 0;
    for (int g = 0; g < 16; g++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[g * 16 + l]));
        s[g] = amax / 31.0f;
        maxs = fmaxf(maxs, s[g]);
    }
    float d = maxs / 127.0f;
    f2h(b + 208, d);
    d = h2f(b + 208);
    memset(b, 0, 208);
    int8_t *scales = (int8_t *)(b + 192);
    uint8_t *ql = b, *qh = b + 128;
    for (int e = 0; e < 256; e++) {
        int n = e / 128, qq = (e % 128) / 32, l = e % 32;
        int si = n * 8 + qq * 2 + l / 16;
        /* group of 16 consecutive elements e/16 maps to scale index si */
        if (l % 16 == 0) scales[si] = (int8_t)(d > 0 ? clampi(iround(s[e / 16] / d), -128, 127) : 0);
        float ds = d * scales[si];
        int q = ds != 0 ? clampi(iround(x[e] / ds), -32, 31) + 32 : 32;
        int li = n * 64 + l + (qq & 1) * 32;
        ql[li] |= (uint8_t)((q & 0xF) << (qq >= 2 ? 4 : 0));
        qh[n * 32 + l] |= (uint8_t)((q >> 4) << (2 * qq));
    }
}

kvs_status kvs_quant_row(int type, const float *src, void *dst, int64_t n, kvs_err *err) {
    const type_info *t = tinfo(type);
    if (!t || !t->supported)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "tensor type %s (%d) cannot be quantised",
                          kvs_ggml_type_name(type), type);
    if (n % t->blck)
        return kvs_errorf(err, KVS_ERR_INVALID, "row of %lld elements is not a multiple of the %s block (%d)",
                          (long long)n, t->name, t->blck);
    uint8_t *p = dst;
    switch (type) {
    case KVS_GGML_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KVS_GGML_F16:
        for (int64_t i = 0; i < n; i++) f2h(p + 2 * i, src[i]);
        break;
    case KVS_GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kvs_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        break;
    default:
        for (int64_t b = 0; b < n / t->blck; b++) {
            uint8_t *blk = p + (size_t)b * t->size;
            const float *x = src + b * t->blck;
            if (type == KVS_GGML_Q8_0) quant_q8_0(x, blk);
            else if (type == KVS_GGML_Q4_0) quant_q4_0(x, blk);
            else if (type == KVS_GGML_Q5_0) quant_q5_0(x, blk);
            else if (type == KVS_GGML_Q4_1) quant_q4_1(x, blk);
            else if (type == KVS_GGML_Q4_K) quant_q4_k(x, blk);
            else quant_q6_k(x, blk);
        }
    }
    return KVS_OK;
}

/* ---- activations ------------------------------------------------------------ */

#if defined(__AVX2__)
/* One block in registers, the scalar loop's numbers exactly: the maximum does
 * not depend on its order, the products are the same, cvtps2dq rounds as
 * lrintf does (to nearest even, the default mode) and |q| <= 127 packs
 * without saturating. A block with a NaN returns 0 (the scalar loop then
 * decides: it truncates lrintf's result where packing would saturate). */
static int q8a_block_avx2(const float *v, kvs_q8a_block *o) {
    const __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8);
    const __m256 x2 = _mm256_loadu_ps(v + 16), x3 = _mm256_loadu_ps(v + 24);
    const __m256 un = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(x0, x0, _CMP_UNORD_Q), _mm256_cmp_ps(x1, x1, _CMP_UNORD_Q)),
                                   _mm256_or_ps(_mm256_cmp_ps(x2, x2, _CMP_UNORD_Q), _mm256_cmp_ps(x3, x3, _CMP_UNORD_Q)));
    if (_mm256_movemask_ps(un)) return 0;
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(x0, abs), _mm256_and_ps(x1, abs)),
                             _mm256_max_ps(_mm256_and_ps(x2, abs), _mm256_and_ps(x3, abs)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, vid)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, vid));
    const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, vid)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, vid));
    /* per-16 sums: [s0 lanes | s1 lanes] after one horizontal add tree */
    __m256i s = _mm256_hadd_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
    s = _mm256_hadd_epi32(s, s); /* lanes 0, 1: halves of s0; lanes 2, 3: of s1 (per 128-bit half) */
    const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    /* packs work per 128-bit half: bytes come out as groups of 4 in the order
     * q0lo q1lo q2lo q3lo | q0hi q1hi q2hi q3hi; the permute restores 0..31 */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_storeu_si256((__m256i *)o->q,
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    o->d = d;
    o->sum16[0] = (int16_t)_mm_cvtsi128_si32(t);
    o->sum16[1] = (int16_t)_mm_extract_epi32(t, 1);
    return 1;
}
#endif

void kvs_q8a_quantize(const float *x, kvs_q8a_block *out, int64_t n) {
    assert(n % 32 == 0);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
#if defined(__AVX2__)
        if (q8a_block_avx2(v, &out[b])) continue;
#endif
        float amax = 0;
        /* builds without AVX2, and blocks with a NaN: fmaxf's value (a NaN is
         * passed over) without its libm call (GCC does not inline fmaxf) */
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        kvs_q8a_block *o = &out[b];
        o->d = d;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; i++) {
            int q = (int)lrintf(v[i] * id);
            o->q[i] = (int8_t)q;
            if (i < 16) s0 += q;
            else s1 += q;
        }
        o->sum16[0] = (int16_t)s0;
        o->sum16[1] = (int16_t)s1;
    }
}
