/*
 * kvcache.c -- the KV cache row entry points of kvs_cpu.h (sizes, conversion
 * to and from fp32, decode attention's key dots and value sums, one head or
 * the query heads of a GQA group against the same rows) for every cache type,
 * and the kernels of the block types Q8_0 and Q4_0 (GGUF's blocks of 32
 * values and an f16 scale). f32 / f16 / bf16 rows go to simd.c's kernels
 * (through dispatch.c for the GQA-group kernels).
 *
 * Keys: dot_kv.c's kernel (each row's int8 values made float in registers
 * once for all the heads of the group, the fp32 query, per-block scales),
 * or where the CPU has the weight kernels' block-scale route (kvs_dot_q8a,
 * kvs_dot_q8a_rows: dot.c, dot_bs.c) the query quantised to 8 bits once per
 * call and integer dot products, as llama.cpp's CPU attention does. Values
 * (dot_kv.c): each row's weight is multiplied by its block's scale once, and
 * half a block at a time of int8 values is made float in registers and added
 * to four heads' accumulators per pass. Nothing larger than one block
 * (decode) or one key tile of prefill (kvs_cache_to_f32) is ever
 * dequantised.
 * What it is not: no block format of its own (quant.c), no threads, no float
 * row kernels (simd.c, attn512.c).
 */
#include <assert.h>

#include "cpu_private.h"
#include "quant_blocks.h"

#define HEADS_PER_CALL 8 /* query heads quantised per kvs_dot_q8a_rows call (stack buffer; block-scale route) */

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
    const int gt = kvs_cache_ggml_type(ctype);
    if (kvs_dot_bs_route(gt, n)) kvs_q8a_quantize(q, qa, n);
    if (kvs_dot_bs_route(gt, n)) return kvs_dot_q8a(gt, k, qa, n);
    float y; /* dot_kv.c's route: the fp32 query, as the group kernel (scale 1: the bits before it) */
    kvs_dot_kv_rows_f(gt, k, kvs_cache_row_size(ctype, n), 1, q, (size_t)n, 1, n, 1.0f, &y, 1);
    return y;
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
    if (!kvs_dot_bs_route(gt, n)) { /* dot_kv.c: the fp32 query, the scale inside */
        if (nrows > 0) kvs_dot_kv_rows_f(gt, k, rb, nrows, q, qstride, nh, n, scale, out, ostride);
        return;
    }
    for (int h0 = 0; h0 < nh; h0 += HEADS_PER_CALL) {
        const int hn = nh - h0 < HEADS_PER_CALL ? nh - h0 : HEADS_PER_CALL;
        for (int h = 0; h < hn; h++) kvs_q8a_quantize(q + (size_t)(h0 + h) * qstride, qa[h], n);
        float *o = out + (size_t)h0 * ostride;
        if (nrows > 0) kvs_dot_q8a_rows(gt, k, rb, nrows, qa[0], NB, hn, n, o, (int64_t)ostride);
        for (int h = 0; h < hn; h++)
            for (int t = 0; t < nrows; t++) o[(size_t)h * ostride + t] *= scale;
    }
}

/* o_h += p_h[t] row t, each element's sum over the rows in order: the same
 * operations whatever nh, so one head alone (axpy_q) gives every head's bits
 * (dot_kv.c: per row the weight p * d once, then one fma per element). */
static void axpy_heads_q(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                         const void *x, size_t rstride, int nrows, int n) {
    assert(n % 32 == 0 && n <= KVS_CACHE_QMAX && rstride % 32 == 0);
    kvs_axpy_kv_rows(kvs_cache_ggml_type(ctype), o, ostride, nh, p, pstride, x,
                     kvs_cache_row_size(ctype, (int64_t)rstride), nrows, n);
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
    if (kvs_cache_is_block(ctype))
        return kvs_dot_bs_route(kvs_cache_ggml_type(ctype), n) ? "q8 query dots, value blocks in registers"
                                                               : "int8 rows as floats, value blocks in registers";
    return kvs_attn_kernels_float(ctype, n);
}
