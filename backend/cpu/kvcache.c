/*
 * kvcache.c -- the KV cache row entry points of kvs_cpu.h (sizes, conversion
 * to and from fp32, decode attention's key dots and value sums, one head or
 * the query heads of a GQA group against the same rows) for every cache type,
 * and the kernels of the block types Q8_0 and Q4_0 (GGUF's blocks of 32
 * values and an f16 scale). f32 / f16 / bf16 rows go to simd.c's kernels
 * (through dispatch.c for the GQA-group kernels).
 *
 * Keys: the query is quantised to 8 bits once per call (kvs_q8a_quantize)
 * and multiplied with the rows by the weight kernels' integer dot products
 * (kvs_dot_q8a, kvs_dot_q8a_rows: dot.c, the block-scale route where the CPU
 * has it), as llama.cpp's CPU attention does with a quantised K. Values: half
 * a block at a time is dequantised in registers (the values kvs_dequant_row
 * gives) and added to four heads' accumulators per pass. Nothing larger than
 * one block (decode) or one key tile of prefill (kvs_cache_to_f32) is ever
 * dequantised.
 * What it is not: no block format of its own (quant.c), no threads, no float
 * row kernels (simd.c, attn512.c).
 */
#include <assert.h>

#include "cpu_private.h"
#include "quant_blocks.h"

#define HEADS_PER_CALL 8 /* query heads quantised per kvs_dot_q8a_rows call (stack buffer) */

int kvs_cache_is_block(int ctype) { return ctype == KVS_CACHE_Q8_0 || ctype == KVS_CACHE_Q4_0; }

int kvs_cache_is_kivi(int ctype) { return ctype == KVS_CACHE_KIVI2 || ctype == KVS_CACHE_KIVI4; }

int kvs_cache_ggml_type(int ctype) {
    switch (ctype) {
    case KVS_CACHE_F16: return KVS_GGML_F16;
    case KVS_CACHE_BF16: return KVS_GGML_BF16;
    case KVS_CACHE_F32: return KVS_GGML_F32;
    case KVS_CACHE_Q8_0: return KVS_GGML_Q8_0;
    case KVS_CACHE_Q4_0: return KVS_GGML_Q4_0;
    default: return -1;
    }
}

size_t kvs_cache_row_size(int ctype, int64_t n) {
    const int t = kvs_cache_ggml_type(ctype);
    return t < 0 ? 0 : kvs_ggml_row_size(t, n);
}

static void to_f32_q(int ctype, const void *src, float *dst, int n) {
    kvs_status st = kvs_dequant_row(kvs_cache_ggml_type(ctype), src, dst, n, NULL);
    assert(st == KVS_OK);
    (void)st;
}

static void from_f32_q(int ctype, const float *src, void *dst, int n) {
    kvs_status st = kvs_quant_row(kvs_cache_ggml_type(ctype), src, dst, n, NULL);
    assert(st == KVS_OK);
    (void)st;
}

static float dot_q(int ctype, const float *q, const void *k, int n) {
    kvs_q8a_block qa[KVS_CACHE_QMAX / 32];
    assert(n % 32 == 0 && n <= KVS_CACHE_QMAX);
    kvs_q8a_quantize(q, qa, n);
    return kvs_dot_q8a(kvs_cache_ggml_type(ctype), k, qa, n);
}

/* kvs_dot_q8a_rows gives kvs_dot_q8a's bits per column, and the scale is the
 * same one multiplication after it: dot_q(...) * scale per head. */
static void dot_heads_q(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride,
                        int nrows, int n, float scale, float *out, size_t ostride) {
    enum { NB = KVS_CACHE_QMAX / 32 };
    kvs_q8a_block qa[HEADS_PER_CALL][NB];
    assert(n % 32 == 0 && n <= KVS_CACHE_QMAX && rstride % 32 == 0);
    const int gt = kvs_cache_ggml_type(ctype);
    const size_t rb = kvs_cache_row_size(ctype, (int64_t)rstride);
    for (int h0 = 0; h0 < nh; h0 += HEADS_PER_CALL) {
        const int hn = nh - h0 < HEADS_PER_CALL ? nh - h0 : HEADS_PER_CALL;
        for (int h = 0; h < hn; h++) kvs_q8a_quantize(q + (size_t)(h0 + h) * qstride, qa[h], n);
        float *o = out + (size_t)h0 * ostride;
        if (nrows > 0) kvs_dot_q8a_rows(gt, k, rb, nrows, qa[0], NB, hn, n, o, (int64_t)ostride);
        for (int h = 0; h < hn; h++)
            for (int t = 0; t < nrows; t++) o[(size_t)h * ostride + t] *= scale;
    }
}

#ifdef KVS_HAVE_AVX2
/* Half hf (elements 16 hf .. 16 hf + 15) of a Q8_0 / Q4_0 block as 2 x 8
 * floats d * q: the products kvs_dequant_row makes, so prefill and decode
 * read the same values. */
static inline __attribute__((always_inline)) void half_f32(int ctype, const uint8_t *blk, int hf, __m256 v[2]) {
    const __m256 d = _mm256_set1_ps(h2f(blk));
    __m128i q;
    if (ctype == KVS_CACHE_Q8_0) q = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * hf));
    else { /* Q4_0: elements 0..15 the low nibbles of qs, 16..31 the high ones */
        const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(0xF);
        q = _mm_sub_epi8(_mm_and_si128(hf ? _mm_srli_epi16(qs, 4) : qs, m4), _mm_set1_epi8(8));
    }
    v[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    v[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
}

/* 16 elements (half hf of one block column) of HN <= 4 heads over nrows
 * rows: 8 accumulators in registers, one fma per element and row, rows in
 * order (each half is dequantised once per pass of up to 4 heads). */
static inline __attribute__((always_inline)) void axpy_half4(int ctype, int HN, int hf, float *o, size_t ostride,
                                                             const float *p, size_t pstride, const uint8_t *x,
                                                             size_t rb, int nrows) {
    __m256 a[4][2], v[2];
    #pragma GCC unroll 4
    for (int h = 0; h < HN; h++)
        #pragma GCC unroll 2
        for (int i = 0; i < 2; i++) a[h][i] = _mm256_loadu_ps(o + (size_t)h * ostride + 8 * i);
    for (int t = 0; t < nrows; t++) {
        half_f32(ctype, x + (size_t)t * rb, hf, v);
        #pragma GCC unroll 4
        for (int h = 0; h < HN; h++) {
            const __m256 w = _mm256_set1_ps(p[(size_t)h * pstride + t]);
            #pragma GCC unroll 2
            for (int i = 0; i < 2; i++) a[h][i] = _mm256_fmadd_ps(w, v[i], a[h][i]);
        }
    }
    #pragma GCC unroll 4
    for (int h = 0; h < HN; h++)
        #pragma GCC unroll 2
        for (int i = 0; i < 2; i++) _mm256_storeu_ps(o + (size_t)h * ostride + 8 * i, a[h][i]);
}

/* One type and head count per instance: the accumulators stay in registers. */
#define KVS_AXPY_CASES(T)                                                                    \
    switch (hn) {                                                                            \
    case 4: axpy_half4(T, 4, hf, ob, ostride, pb, pstride, xt, rb, nr); break;               \
    case 3: axpy_half4(T, 3, hf, ob, ostride, pb, pstride, xt, rb, nr); break;               \
    case 2: axpy_half4(T, 2, hf, ob, ostride, pb, pstride, xt, rb, nr); break;               \
    default: axpy_half4(T, 1, hf, ob, ostride, pb, pstride, xt, rb, nr); break;              \
    }
#endif

/* o_h += p_h[t] row t, each element's sum over the rows in order: the same
 * operations whatever nh, so one head alone (axpy_q) gives every head's bits. */
static void axpy_heads_q(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                         const void *x, size_t rstride, int nrows, int n) {
    assert(n % 32 == 0 && n <= KVS_CACHE_QMAX && rstride % 32 == 0);
    const size_t rb = kvs_cache_row_size(ctype, (int64_t)rstride);
    const uint8_t *xb = x;
#ifdef KVS_HAVE_AVX2
    const size_t bb = kvs_cache_row_size(ctype, 32);
    /* blocks of ROWS rows stay in L1 while the half blocks and head passes go over them */
    enum { ROWS = 32 };
    for (int t0 = 0; t0 < nrows; t0 += ROWS) {
        const int nr = nrows - t0 < ROWS ? nrows - t0 : ROWS;
        for (int b = 0; b < n / 32; b++)
            for (int hf = 0; hf < 2; hf++)
                for (int h0 = 0; h0 < nh; h0 += 4) {
                    const int hn = nh - h0 < 4 ? nh - h0 : 4;
                    float *ob = o + (size_t)h0 * ostride + (size_t)b * 32 + 16 * hf;
                    const float *pb = p + (size_t)h0 * pstride + t0;
                    const uint8_t *xt = xb + (size_t)t0 * rb + b * bb;
                    if (ctype == KVS_CACHE_Q8_0) {
                        KVS_AXPY_CASES(KVS_CACHE_Q8_0)
                    } else {
                        KVS_AXPY_CASES(KVS_CACHE_Q4_0)
                    }
                }
    }
#else
    float row[KVS_CACHE_QMAX];
    for (int t = 0; t < nrows; t++) {
        to_f32_q(ctype, xb + (size_t)t * rb, row, n);
        for (int h = 0; h < nh; h++) {
            float *oh = o + (size_t)h * ostride;
            const float a = p[(size_t)h * pstride + t];
            for (int i = 0; i < n; i++) oh[i] += a * row[i];
        }
    }
#endif
}

static void axpy_q(int ctype, float *o, float a, const void *x, int n) {
    axpy_heads_q(ctype, o, 0, 1, &a, 0, x, (size_t)n, 1, n);
}

/* ---- entry points ------------------------------------------------------------ */

void kvs_cache_to_f32(int ctype, const void *src, float *dst, int n) {
    if (kvs_cache_is_block(ctype)) to_f32_q(ctype, src, dst, n);
    else kvs_cache_to_f32_float(ctype, src, dst, n);
}

void kvs_cache_from_f32(int ctype, const float *src, void *dst, int n) {
    if (kvs_cache_is_block(ctype)) from_f32_q(ctype, src, dst, n);
    else kvs_cache_from_f32_float(ctype, src, dst, n);
}

float kvs_dot_cache(int ctype, const float *q, const void *k, int n) {
    return kvs_cache_is_block(ctype) ? dot_q(ctype, q, k, n) : kvs_dot_cache_float(ctype, q, k, n);
}

void kvs_axpy_cache(int ctype, float *o, float a, const void *x, int n) {
    if (kvs_cache_is_block(ctype)) axpy_q(ctype, o, a, x, n);
    else kvs_axpy_cache_float(ctype, o, a, x, n);
}

void kvs_dot_cache_heads(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride, int nrows,
                         int n, float scale, float *out, size_t ostride) {
    if (kvs_cache_is_block(ctype)) dot_heads_q(ctype, q, qstride, nh, k, rstride, nrows, n, scale, out, ostride);
    else kvs_dot_cache_heads_float(ctype, q, qstride, nh, k, rstride, nrows, n, scale, out, ostride);
}

void kvs_axpy_cache_heads(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride, const void *x,
                          size_t rstride, int nrows, int n) {
    if (kvs_cache_is_block(ctype)) axpy_heads_q(ctype, o, ostride, nh, p, pstride, x, rstride, nrows, n);
    else kvs_axpy_cache_heads_float(ctype, o, ostride, nh, p, pstride, x, rstride, nrows, n);
}

const char *kvs_attn_kernels(int ctype, int n) {
    if (kvs_cache_is_block(ctype)) return "q8 query dots, value blocks in registers";
    return kvs_attn_kernels_float(ctype, n);
}
