/*
 * kvs_cpu.h -- the engine's CPU kernels: GGUF tensor types, quantised rows
 * (dequantisation, quantisation, Q8 activations), dot products of weight rows
 * with activations, the element-wise vector helpers of the forward pass and
 * the KV cache row kernels. This header is the manual of backend/cpu/.
 *
 * What it is: portable entry points. Each runs its portable kernel (plain C,
 * or AVX2 + FMA + F16C where the build targets x86-64-v3) or, on CPUs that
 * have them, an ISA variant (AVX-512 VNNI, AMX-INT8, AVX-512F) chosen at run
 * time in one place, dispatch.c, from what features.c finds. The variants,
 * the reference each matches and the tests that compare them: cpu_private.h.
 * What it is not: no model and no threads (backend/model/ splits rows over
 * its pool), no float matrix products (OpenBLAS).
 */
#ifndef KVS_CPU_H
#define KVS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor types (numbering as in GGUF files). */
typedef enum {
    KVS_GGML_F32 = 0,
    KVS_GGML_F16 = 1,
    KVS_GGML_Q4_0 = 2,
    KVS_GGML_Q4_1 = 3,
    KVS_GGML_Q5_0 = 6,
    KVS_GGML_Q5_1 = 7,
    KVS_GGML_Q8_0 = 8,
    KVS_GGML_Q8_1 = 9,
    KVS_GGML_Q2_K = 10,
    KVS_GGML_Q3_K = 11,
    KVS_GGML_Q4_K = 12,
    KVS_GGML_Q5_K = 13,
    KVS_GGML_Q6_K = 14,
    KVS_GGML_Q8_K = 15,
    KVS_GGML_BF16 = 30
} kvs_ggml_type;

/* Name of a tensor type ("Q4_K"), or "?" when unknown. */
const char *kvs_ggml_type_name(int type);
/* 1 if this build can dequantise and multiply the type. */
int kvs_ggml_type_supported(int type);
/* Elements per block and bytes per block (0 for unknown types). */
int kvs_ggml_blck_size(int type);
size_t kvs_ggml_type_size(int type);
/* Bytes of a row of n elements (n must be a multiple of the block size). */
size_t kvs_ggml_row_size(int type, int64_t n);

/* ------------------------------------------------------------------------ */
/* Quantised rows: dequantisation, quantisation (for tests), dot products    */
/* ------------------------------------------------------------------------ */

/* Row of n elements of `type` (n multiple of the block size) to fp32. */
kvs_status kvs_dequant_row(int type, const void *src, float *dst, int64_t n, kvs_err *err);
/* Reference quantiser (round to nearest; for tests and the writer): fp32 ->
 * row of `type`. dst holds kvs_ggml_row_size(type, n) bytes. */
kvs_status kvs_quant_row(int type, const float *src, void *dst, int64_t n, kvs_err *err);

/* Activations quantised for integer dot products: blocks of 32 with an fp32
 * scale, int8 values and per-16 sums. */
typedef struct {
    float d;
    int16_t sum16[2];
    int8_t q[32];
} kvs_q8a_block;

/* x [n] -> [n/32] blocks (n multiple of 32). */
void kvs_q8a_quantize(const float *x, kvs_q8a_block *out, int64_t n);
/* Dot of a weight row (type, n elements) with quantised activations. F32,
 * F16, BF16 rows use kvs_dot_f32 on the fp32 activations instead. */
float kvs_dot_q8a(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* Dot of a weight row of any supported type with fp32 activations. */
float kvs_dot_f32(int type, const void *row, const float *x, int64_t n);
/* Greedy sampling: the first index of the largest of x[0..n), vectorised;
 * -1 when n <= 0 or any x is NaN. */
int kvs_argmax(const float *x, int n);

/* y[c] = kvs_dot_q8a(type, row, x + c * xstride, n) for c < ncols, bit for bit,
 * each weight block unpacked once for all columns (quant.c). */
void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);
/* The same over nrows rows (row r at rows + r * row_bytes): out[c * ostride + r]
 * = kvs_dot_q8a(type, row r, x + c * xstride, n), bit for bit. The batched
 * matrix-vector product of decode calls it on a thread's range of rows. */
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
/* 1 where kvs_dot_q8a / kvs_dot_q8a_rows take the block-scale route for rows
 * of this type and length on this machine (cpu_private.h: Q8_0, Q5_0, Q4_K,
 * Q6_K where the CPU has AVX-512 VNNI or AMX): a float structure of its own,
 * the same for any number of columns, so prefill may quantise a chunk's
 * activations and take decode's kernels. */
int kvs_dot_bs_route(int type, int64_t n);

/* ---- vector helpers (simd.c) and KV cache rows (kvcache.c) ------------------- */
/* Element type of the KV cache. Attention always accumulates in fp32; f16 and
 * bf16 rows are converted in registers (decode) or per key tile (prefill).
 * Q8_0 and Q4_0 are GGUF's blocks of 32 values with an f16 scale (34 and 18
 * bytes): a row of n elements (n a multiple of 32) is n / 32 blocks, so a
 * cache row is still one token of one head. Decode dots keys with the query
 * quantised to 8 bits (kvs_q8a_block, as llama.cpp) and adds values a row
 * at a time dequantised into a stack buffer (attn_quant.c); prefill
 * dequantises per key tile as for f16.
 * KIVI2 / KIVI4 are KIVI-style 2- and 4-bit caches (kernels/kivi.h): no rows
 * at all, one store per (layer, KV head) that backend/model/kivi_cache.c
 * keeps; none of the row entry points below takes them (row size 0).
 * 0 (a zero-initialised opts) is f16, as llama.cpp's default cache. */
typedef enum {
    KVS_CACHE_F16 = 0,
    KVS_CACHE_BF16 = 1,
    KVS_CACHE_F32 = 2,
    KVS_CACHE_Q8_0 = 3,
    KVS_CACHE_Q4_0 = 4,
    KVS_CACHE_KIVI2 = 5,
    KVS_CACHE_KIVI4 = 6
} kvs_cache_type;
#define KVS_CACHE_N_TYPES 7
/* Longest row (elements) of a block cache type the kernels take: head_dim of
 * Q8_0 / Q4_0 caches must be a multiple of 32 and at most this. */
#define KVS_CACHE_QMAX 512
/* x[i] = exp(x[i] - sub); returns the sum. */
double kvs_vexp_sub(float *x, int n, float sub);
void kvs_vgelu_mul(float *g, const float *u, int n); /* g = gelu_tanh(g) * u */
void kvs_vsilu_mul(float *g, const float *u, int n); /* g = silu(g) * u */
void kvs_vaxpy(float *o, float a, const float *x, int n); /* o += a x */
float kvs_vmax(const float *x, int n);                   /* max x[i], NaN skipped; -inf if n = 0 */
void kvs_vscale(float *x, int n, float a);               /* x *= a */
double kvs_sumsq(const float *x, int n);                 /* sum of squares */
/* KV cache rows of element type ctype (kvs_cache_type); n elements (block
 * types: n a multiple of 32, at most KVS_CACHE_QMAX for the dot and axpy
 * kernels, and every pointer at a block boundary). */
int kvs_cache_is_block(int ctype);                 /* 1 for Q8_0, Q4_0 */
int kvs_cache_is_kivi(int ctype);                  /* 1 for KIVI2, KIVI4 (no rows) */
int kvs_cache_ggml_type(int ctype);                /* KVS_GGML_* of the type, -1 if unknown */
size_t kvs_cache_row_size(int ctype, int64_t n);   /* bytes of n elements; 0 if unknown */
void kvs_cache_to_f32(int ctype, const void *src, float *dst, int n);
void kvs_cache_from_f32(int ctype, const float *src, void *dst, int n);
float kvs_dot_cache(int ctype, const float *q, const void *k, int n);       /* q . k */
void kvs_axpy_cache(int ctype, float *o, float a, const void *x, int n);    /* o += a x */
/* nh query heads (head h at q + h * qstride) against nrows rows (row t at k +
 * kvs_cache_row_size(ctype, t * rstride) bytes): out[h * ostride + t] = kvs_dot_cache(q_h, row t) *
 * scale, bit for bit, each f16/bf16 element converted once per pass of up to
 * 4 heads. */
void kvs_dot_cache_heads(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride, int nrows,
                         int n, float scale, float *out, size_t ostride);
/* o_h += p[h * pstride + t] row t for t = 0 .. nrows - 1, with o_h = o + h *
 * ostride: bit for bit kvs_axpy_cache(o_h, p_h[t], row t) over t in order. */
void kvs_axpy_cache_heads(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride, const void *x,
                          size_t rstride, int nrows, int n);
/* Which kernels kvs_dot_cache_heads / kvs_axpy_cache_heads run for rows of
 * type ctype and size n on this machine: "avx512f", "avx2" or "one head at a
 * time" (f32 rows, builds without F16C), or the Q8_0 / Q4_0 kernels' name.
 * For tests and logs. */
const char *kvs_attn_kernels(int ctype, int n);

#ifdef __cplusplus
}
#endif

#endif /* KVS_CPU_H */
