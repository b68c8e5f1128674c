/*
 * dtype.c -- element types, fp16/bf16 <-> fp32 conversion, host views.
 *
 * What it is: bit-exact IEEE conversions (round to nearest even, subnormals,
 * inf and NaN preserved), contiguous view construction, row extraction to
 * fp32 and the finiteness scan used by kvs_cache_validate.
 * What it is not: no device code. Views with device KVS_CUDA must not be passed
 * to kvs_view_rows_f32 / kvs_view_check_finite (asserted); kernels/ has its own.
 */
#include "kvsieve.h"

#include <assert.h>
#include <math.h>
#include <string.h>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

size_t kvs_dtype_size(kvs_dtype t) {
    switch (t) {
    case KVS_F32: return 4;
    case KVS_F16: return 2;
    case KVS_BF16: return 2;
    case KVS_U8: return 1;
    case KVS_I32: return 4;
    }
    return 0;
}

const char *kvs_dtype_name(kvs_dtype t) {
    switch (t) {
    case KVS_F32: return "F32";
    case KVS_F16: return "F16";
    case KVS_BF16: return "BF16";
    case KVS_U8: return "U8";
    case KVS_I32: return "I32";
    }
    return "?";
}

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kvs_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: value = mant * 2^-24, exact in fp32 */
        float mag = (float)mant * (1.0f / 16777216.0f);
        return sign ? -mag : mag;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13)); /* inf / NaN */
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Shift m right by s bits (1 <= s <= 31) rounding to nearest, ties to even. */
static inline uint32_t shift_rne(uint32_t m, unsigned s) {
    uint32_t r = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return r;
}

uint16_t kvs_f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    /* 65520 = halfway between 65504 (max half) and 65536: ties go to even,
     * which is the overflow side, so everything >= 65520 becomes inf. */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    uint32_t exp = ax >> 23;
    if (exp < 113) { /* below 2^-14: half subnormal or zero */
        if (exp < 102) return sign; /* < 2^-25: rounds to zero */
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        /* value = mant * 2^(exp-150); in units of 2^-24: mant >> (126 - exp) */
        return (uint16_t)(sign | shift_rne(mant, 126u - exp)); /* may carry into the normal range: correct */
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits (carry is fine) */
    uint32_t h = ((exp - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float kvs_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t kvs_f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even; overflow -> inf */
    return (uint16_t)(x >> 16);
}

kvs_view kvs_view_make(const void *data, kvs_dtype t, int H, int N, int d) {
    kvs_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = t;
    v.device = KVS_HOST;
    v.n_heads = H;
    v.n_tokens = N;
    v.head_dim = d;
    v.s_tok = d;
    v.s_head = (int64_t)N * d;
    return v;
}

void kvs_view_rows_f32(const kvs_view *v, int h, int n0, int count, float *dst /* [count][d] */) {
    assert(v && v->data && v->device == KVS_HOST);
    assert(h >= 0 && h < v->n_heads && n0 >= 0 && count >= 0 && n0 + count <= v->n_tokens);
    const int d = v->head_dim;
    const int64_t base = (int64_t)h * v->s_head + (int64_t)n0 * v->s_tok;
    switch (v->dtype) {
    case KVS_F32: {
        const float *src = (const float *)v->data + base;
        if (v->s_tok == d) {
            memcpy(dst, src, (size_t)count * (size_t)d * sizeof(float));
        } else {
            for (int i = 0; i < count; i++)
                memcpy(dst + (size_t)i * d, src + (int64_t)i * v->s_tok, (size_t)d * sizeof(float));
        }
        break;
    }
    case KVS_F16: {
        const uint16_t *src = (const uint16_t *)v->data + base;
        for (int i = 0; i < count; i++) {
            const uint16_t *row = src + (int64_t)i * v->s_tok;
            float *o = dst + (size_t)i * d;
            int c = 0;
#if defined(__F16C__) && defined(__AVX__)
            /* Hardware conversion, 8 at a time: exact (every fp16 value,
             * subnormals included, is representable in fp32). Tests compare
             * it with the scalar kvs_f16_to_f32 for all 65536 inputs. */
            for (; c + 8 <= d; c += 8)
                _mm256_storeu_ps(o + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + c))));
#endif
            for (; c < d; c++) o[c] = kvs_f16_to_f32(row[c]);
        }
        break;
    }
    case KVS_BF16: {
        const uint16_t *src = (const uint16_t *)v->data + base;
        for (int i = 0; i < count; i++) {
            const uint16_t *row = src + (int64_t)i * v->s_tok;
            float *o = dst + (size_t)i * d;
            for (int c = 0; c < d; c++) o[c] = kvs_bf16_to_f32(row[c]);
        }
        break;
    }
    default:
        assert(!"kvs_view_rows_f32: view dtype must be F32, F16 or BF16");
    }
}

void kvs_view_gather_f32(const kvs_view *v, int h, const int32_t *idx, int n, float *dst) {
    const int d = v->head_dim;
    int i = 0;
    while (i < n) {
        int run = 1;
        while (i + run < n && idx[i + run] == idx[i] + run) run++;
        kvs_view_rows_f32(v, h, idx[i], run, dst + (size_t)i * d);
        i += run;
    }
}

/* Exponent bits all ones means Inf or NaN. The loops only OR a flag, in
 * fixed-size inner blocks that gcc -O2 vectorises (32-byte compares), so a
 * scan runs near memory speed; the exact position is found after. */
static int span_bad_f32(const uint32_t *p, size_t n) {
    uint32_t acc = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t b = 0;
        for (int k = 0; k < 16; k++) b |= (uint32_t)((p[i + k] & 0x7f800000u) == 0x7f800000u);
        acc |= b;
    }
    for (; i < n; i++) acc |= (uint32_t)((p[i] & 0x7f800000u) == 0x7f800000u);
    return acc != 0;
}
static int span_bad_u16(const uint16_t *p, size_t n, uint16_t expmask) {
    uint16_t acc = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint16_t b = 0;
        for (int k = 0; k < 32; k++) b |= (uint16_t)((uint16_t)(p[i + k] & expmask) == expmask);
        acc |= b;
    }
    for (; i < n; i++) acc |= (uint16_t)((uint16_t)(p[i] & expmask) == expmask);
    return acc != 0;
}
/* Elements [off, off + n) of the view's storage hold a NaN or Inf. */
static int span_bad(const kvs_view *v, int64_t off, size_t n) {
    if (v->dtype == KVS_F32) return span_bad_f32((const uint32_t *)v->data + off, n);
    return span_bad_u16((const uint16_t *)v->data + off, n,
                        v->dtype == KVS_F16 ? (uint16_t)0x7c00u : (uint16_t)0x7f80u);
}

kvs_status kvs_view_check_finite(const kvs_view *v, const char *what, kvs_err *err) {
    if (!what) what = "tensor";
    if (!v || !v->data)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: view has no data", what);
    if (v->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: finiteness check needs host memory (view is on CUDA)", what);
    if (v->dtype != KVS_F32 && v->dtype != KVS_F16 && v->dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: dtype %s is not F32, F16 or BF16", what,
                          kvs_dtype_name(v->dtype));
    const int d = v->head_dim;
    /* Rows that touch (s_tok == d) are scanned ROWS at a time, the rest one
     * by one; a flagged block is re-scanned row by row. */
    enum { ROWS = 64 };
    const int block = v->s_tok == d ? ROWS : 1;
    for (int h = 0; h < v->n_heads; h++) {
        for (int n = 0; n < v->n_tokens; n++) {
            const int64_t off = (int64_t)h * v->s_head + (int64_t)n * v->s_tok;
            if (block > 1 && n % block == 0) {
                const int rows = v->n_tokens - n < block ? v->n_tokens - n : block;
                if (!span_bad(v, off, (size_t)rows * (size_t)d)) {
                    n += rows - 1;
                    continue;
                }
            }
            if (!span_bad(v, off, (size_t)d)) continue;
            for (int c = 0; c < d; c++) {
                float x;
                if (v->dtype == KVS_F32) {
                    memcpy(&x, (const float *)v->data + off + c, sizeof x);
                } else {
                    const uint16_t u = ((const uint16_t *)v->data)[off + c];
                    x = v->dtype == KVS_F16 ? kvs_f16_to_f32(u) : kvs_bf16_to_f32(u);
                }
                if (!isfinite(x))
                    return kvs_errorf(err, KVS_ERR_NUMERIC, "%s head %d token %d channel %d is %s",
                                      what, h, n, c, isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf"));
            }
            assert(!"row flagged non-finite but no element found");
        }
    }
    return KVS_OK;
}
