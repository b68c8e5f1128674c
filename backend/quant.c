/*
 * quant.c -- GGUF tensor types: sizes, dequantisation, a reference quantiser,
 * and dot products of weight rows with activations (scalar + AVX2).
 *
 * Block layouts (as ggml defines them; our own code):
 *   Q8_0  32 values: f16 d, int8 q[32]                 x = d*q
 *   Q5_0  32 values: f16 d, u8 qh[4], u8 qs[16]        x = d*((nib | hbit<<4) - 16)
 *         element j < 16: low nibble of qs[j], element j+16: high nibble; hbit = bit j of qh
 *   Q4_1  32 values: f16 d, f16 m, u8 qs[16]           x = d*nib + m
 *         element j < 16: low nibble of qs[j], element j+16: high nibble
 *   Q4_K  256 values: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *         8 sub-blocks of 32 with 6-bit scale sc and min m: x = d*sc*q - dmin*m;
 *         sub-blocks 2i and 2i+1 share qs[32i..32i+32) (low / high nibbles)
 *   Q6_K  256 values: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
 *         16 groups of 16 with an int8 scale: x = d*sc*(q - 32), q 6-bit
 * What it is not: no threading and no float matrix products (forward.c does
 * those); the multi-row, multi-column dots of batched decode are here.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVS_HAVE_AVX2 1
#endif

#include "kvs_backend.h"

typedef struct {
    int type;
    const char *name;
    int blck;
    size_t size;
    int supported;
} type_info;

static const type_info TYPES[] = {
    {KVS_GGML_F32, "F32", 1, 4, 1},       {KVS_GGML_F16, "F16", 1, 2, 1},
    {KVS_GGML_Q4_0, "Q4_0", 32, 18, 0},   {KVS_GGML_Q4_1, "Q4_1", 32, 20, 1},
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

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef KVS_HAVE_AVX2
    return _cvtsh_ss(h);
#else
    return kvs_f16_to_f32(h);
#endif
}
static void f2h(uint8_t *p, float f) {
    uint16_t h = kvs_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- dequantisation --------------------------------------------------------- */

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) y[i] = d * q[i];
}

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

/* Q6_K element e: half n = e/128, quarter qq = (e%128)/32, l = e%32. */
static int q6k_q(const uint8_t *b, int e) {
    const uint8_t *ql = b, *qh = b + 128;
    int n = e / 128, qq = (e % 128) / 32, l = e % 32;
    int lo = ql[n * 64 + l + (qq & 1) * 32];
    lo = qq >= 2 ? lo >> 4 : lo & 0xF;
    int hi = (qh[n * 32 + l] >> (2 * qq)) & 3;
    return lo | (hi << 4);
}
static int q6k_scale(const uint8_t *b, int e) {
    const int8_t *sc = (const int8_t *)(b + 192);
    int n = e / 128, qq = (e % 128) / 32, l = e % 32;
    return sc[n * 8 + qq * 2 + l / 16];
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
            else if (type == KVS_GGML_Q5_0) quant_q5_0(x, blk);
            else if (type == KVS_GGML_Q4_1) quant_q4_1(x, blk);
            else if (type == KVS_GGML_Q4_K) quant_q4_k(x, blk);
            else quant_q6_k(x, blk);
        }
    }
    return KVS_OK;
}

/* ---- activations ------------------------------------------------------------ */

void kvs_q8a_quantize(const float *x, kvs_q8a_block *out, int64_t n) {
    assert(n % 32 == 0);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
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

/* ---- dot products: scalar ---------------------------------------------------- */

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

#ifdef KVS_HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* signed int8 x signed int8 -> 8 int32 partial sums */
static inline __m256i dot_i8(__m256i a, __m256i b) {
    __m256i ax = _mm256_sign_epi8(a, a);
    __m256i sb = _mm256_sign_epi8(b, a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sb), _mm256_set1_epi16(1));
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

static inline __m256i bytes_from_bits32(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

static float dot_q5_0_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0xF);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 22;
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6));
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
        __m256i hb = _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10));
        __m256i w = _mm256_sub_epi8(_mm256_or_si256(nib, hb), _mm256_set1_epi8(16));
        __m256i q = _mm256_loadu_si256((const __m256i *)x[b].q);
        __m256 p = _mm256_cvtepi32_ps(dot_i8(w, q));
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
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 20;
        __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 4));
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nib, _mm256_loadu_si256((const __m256i *)x[b].q)), ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(blk) * x[b].d), acc);
        offs += h2f(blk + 2) * x[b].d * (float)(x[b].sum16[0] + x[b].sum16[1]);
    }
    return hsum8(acc) + offs;
}

static float dot_q4_k_avx2(const uint8_t *row, const kvs_q8a_block *x, int64_t nsb) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
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
            __m256i p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x0->q)), ones);
            __m256i p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)x1->q)), ones);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * s0 * x0->d), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * s1 * x1->d), acc);
            mins += dmin * (m0 * x0->d * (float)(x0->sum16[0] + x0->sum16[1]) +
                            m1 * x1->d * (float)(x1->sum16[0] + x1->sum16[1]));
        }
    }
    return hsum8(acc) - mins;
}

/* Q6_K: half n (0, 1) of a super-block as four vectors of 32 unsigned 6-bit
 * values (low nibbles | high two bits << 4), shared by the one- and
 * multi-column dot products. */
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

float kvs_dot_q8a(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
#ifdef KVS_HAVE_AVX2
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_avx2(r, x, n / 32);
    case KVS_GGML_Q5_0: return dot_q5_0_avx2(r, x, n / 32);
    case KVS_GGML_Q4_1: return dot_q4_1_avx2(r, x, n / 32);
    case KVS_GGML_Q4_K: return dot_q4_k_avx2(r, x, n / 256);
    case KVS_GGML_Q6_K: return dot_q6_k_avx2(r, x, n / 256);
    default: break;
    }
#else
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_scalar(r, x, n / 32);
    case KVS_GGML_Q5_0: return dot_q5_0_scalar(r, x, n / 32);
    case KVS_GGML_Q4_1: return dot_q4_1_scalar(r, x, n / 32);
    case KVS_GGML_Q4_K: return dot_q4_k_scalar(r, x, n / 256);
    case KVS_GGML_Q6_K: return dot_q6_k_scalar(r, x, n / 256);
    default: break;
    }
#endif
    assert(!"kvs_dot_q8a: type has no integer dot product");
    return 0;
}

/* Exposed to tests through a prototype there: the scalar reference path. */
float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n);
float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
    switch (type) {
    case KVS_GGML_Q8_0: return dot_q8_0_scalar(r, x, n / 32);
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
/* Q8_0 / Q5_0 tiles: one row against NC <= T columns (NC a compile-time
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
    const __m256i ones = _mm256_set1_epi16(1);
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
            __m256 p0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(a0, s0), ones));
            __m256 p1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(a1, s1), ones));
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

static inline __attribute__((always_inline)) void t_q5_0(int NC, const uint8_t *row, const kvs_q8a_block *x,
                                                         int64_t xs, int64_t nb, const float *xdT, float *y) {
    __m256 acc[KVS_T5];
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m256i ones = _mm256_set1_epi16(1);
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    float sc[KVS_T5];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 22;
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6));
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
        __m256i hb = _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10));
        __m256i w = _mm256_sub_epi8(_mm256_or_si256(nib, hb), _mm256_set1_epi8(16));
        __m256i aw = _mm256_sign_epi8(w, w);
        _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(h2f(blk)), _mm256_loadu_ps(xdT + b * KVS_T5)));
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m256i sq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[c * xs + b].q), w);
            __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, sq), ones));
            acc[c] = _mm256_fmadd_ps(p, _mm256_set1_ps(sc[c]), acc[c]);
        }
    }
    #pragma GCC unroll 8
    for (int c = 0; c < NC; c++) y[c] = hsum8(acc[c]);
}

/* Q8_0 / Q5_0 rows against ncols columns, tiles of T columns: the tiles'
 * activation scales transposed once per call (xdT) and reused for every row.
 * Row-major over the rows: a weight row is read from memory once and stays
 * in L1 for all column tiles. A lone column is kvs_dot_q8a itself. */
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
                out[(int64_t)c * os + r] = kvs_dot_q8a(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
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
                        case 8: t_q5_0(8, row, xc, xs, nb, xt, y); break;
                        case 7: t_q5_0(7, row, xc, xs, nb, xt, y); break;
                        case 6: t_q5_0(6, row, xc, xs, nb, xt, y); break;
                        case 5: t_q5_0(5, row, xc, xs, nb, xt, y); break;
                        case 4: t_q5_0(4, row, xc, xs, nb, xt, y); break;
                        case 3: t_q5_0(3, row, xc, xs, nb, xt, y); break;
                        case 2: t_q5_0(2, row, xc, xs, nb, xt, y); break;
                        default: t_q5_0(1, row, xc, xs, nb, xt, y); break;
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
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
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
                __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x0->q)), ones);
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)x1->q)), ones);
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
                out[(int64_t)c * os + r] = kvs_dot_q8a(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
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

void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
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
    if (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K) {
        tk_rows(type, rw, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
#endif
    for (int64_t r = 0; r < nrows; r++)
        for (int c = 0; c < ncols; c++)
            out[(int64_t)c * ostride + r] = kvs_dot_q8a(type, rw + (size_t)r * row_bytes, x + (int64_t)c * xstride, n);
}

void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y) {
    kvs_dot_q8a_rows(type, row, 0, 1, x, xstride, ncols, n, y, 1);
}
