/*
 * cpu_private.h -- what the files of backend/cpu/ share beyond kvs_cpu.h:
 * each kernel family's variants by name, the CPU feature probes (features.c)
 * and the constants dispatch.c needs. Private to backend/cpu/ (tests declare
 * the few entry points they compare).
 *
 * Variants and their references (each variant gives its reference's bits):
 *   dot.c       reference: scalar (kvs_dot_q8a_scalar) and x86-64-v3 kernels
 *   dot_vnni.c  dot.c again with AVX-512 VNNI     (tests/backend/test_backend_quant_cols.c)
 *   dot_bs.c    block-scale route, AVX-512 VNNI   reference kvs_dot_q8a_bs_ref in dot.c
 *   dot_amx.c   block-scale route, AMX-INT8       dot_bs.c's bits (tests/backend/test_backend_bs.c)
 *   simd.c      reference: KV cache row kernels (plain C, AVX2 + F16C)
 *   attn512.c   simd.c's GQA-group kernels on AVX-512F (tests/backend/test_backend_attn.c)
 */
#ifndef KVS_CPU_PRIVATE_H
#define KVS_CPU_PRIVATE_H

#include <stdint.h>

#include "kvs_cpu.h"

/* ---- dot products (dot.c, dot_vnni.c, dot_bs.c, dot_amx.c) ---------------------- */
/* Decode's key dots on a Q8_0 / Q4_0 KV cache (dot_kv.c; gtype KVS_GGML_Q8_0
 * or _Q4_0, n a multiple of 32, at most KVS_CACHE_QMAX): out[c * os + r] =
 * scale x the dot of row r (rows + r * rb) with the fp32 query column c
 * (q + c * qs), each row's bits independent of nrows and ncols. */
void kvs_dot_kv_rows_f(int gtype, const void *rows, size_t rb, int nrows, const float *q, size_t qs, int ncols,
                       int n, float scale, float *out, size_t os);
/* Decode's value sums on a Q8_0 / Q4_0 cache (dot_kv.c): o[h * os + e] +=
 * (p[h * ps + t] x d_t) x q_t[e] over the rows t in order, per head the same
 * operations whatever nh (one head alone gives every head's bits). */
void kvs_axpy_kv_rows(int gtype, float *o, size_t os, int nh, const float *p, size_t ps, const void *x, size_t rb,
                      int nrows, int n);
float kvs_dot_ff(const float *a, const float *b, int64_t n);
float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* dot.c's own kernels (x86-64-v3 or scalar), one row: what kvs_dot_q8a runs
 * off the block-scale route where the VNNI build does not. */
float kvs_dot_q8a_base(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* Which kernels kvs_dot_q8a / kvs_dot_q8a_rows run: 1 where this build has the
 * AVX-512 VNNI ones (dot_vnni.c) and the CPU has AVX512_VNNI and AVX512VL.
 * The two builds' entry points, for the tests that compare them bit for bit:
 * _base (x86-64-v3 or scalar, always) and _vnni (only when available). */
int kvs_dot_vnni_available(void);
void kvs_dot_q8a_rows_base(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
float kvs_dot_q8a_vnni(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* The block-scale route (dot_bs.c) for Q8_0 and Q5_0 rows (Q4_K, Q6_K: n a
 * multiple of 256), n <= 8192: where kvs_dot_bs_route(type, n) is 1,
 * kvs_dot_q8a and kvs_dot_q8a_rows run its kernels for every call on such
 * rows, one column or many, with its own float structure (per block: exact
 * integer dot S, y = fma(dw * dx, S, y); Q4_K then its min term; Q6_K per
 * group of 16), of which kvs_dot_q8a_bs_ref is the plain C form.
 * _engine: 2 AMX-INT8 tiles (dot_amx.c; the CPU has them, the kernel granted
 * tile data, KVSIEVE_AMX is not 0), 1 AVX-512 VNNI (where the CPU has it and
 * not AMX), 0 none (or KVSIEVE_BS=0). The _bs entry points may only be called where the route is
 * 1; _bs_vnni runs the VNNI engine whichever the machine picks, where
 * _vnni_available (tests compare the engines). */
int kvs_dot_bs_engine(void);
int kvs_dot_bs_vnni_available(void);
float kvs_dot_q8a_bs(int type, const void *row, const kvs_q8a_block *x, int64_t n);
void kvs_dot_q8a_rows_bs(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                         int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows_bs_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                              int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
int kvs_dot_amx_available(void);
float kvs_dot_q8a_bs_ref(int type, const void *row, const kvs_q8a_block *x, int64_t n);
#define KVS_BS_NMAX 8192       /* longest row on the route (the stack panels of both engines) */
/* The AMX engine (dot_amx.c): many columns, as kvs_dot_q8a_rows; only where
 * kvs_dot_amx_available() is 1. kvs_dot_q8a_rows_bs gives it calls of at
 * least KVS_AMX_MIN_COLS columns: below that the VNNI kernels were as fast or
 * faster on a 2-core Sapphire Rapids VM (dot_amx.c has the numbers). */
#define KVS_AMX_MIN_COLS 32
void kvs_dot_amx_rows(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                      int ncols, int64_t n, float *out, int64_t os);

/* ---- KV cache rows (kvcache.c, simd.c, attn512.c) ------------------------------- */
/* The float cache types' kernels behind kvcache.c's entry points (which
 * handle Q8_0 / Q4_0 rows itself): simd.c's one-head kernels and dispatch.c's
 * choice of GQA-group kernels, for f32 / f16 / bf16 rows. */
void kvs_cache_to_f32_float(int ctype, const void *src, float *dst, int n);
void kvs_cache_from_f32_float(int ctype, const float *src, void *dst, int n);
float kvs_dot_cache_float(int ctype, const float *q, const void *k, int n);
void kvs_axpy_cache_float(int ctype, float *o, float a, const void *x, int n);
void kvs_dot_cache_heads_float(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride,
                               int nrows, int n, float scale, float *out, size_t ostride);
void kvs_axpy_cache_heads_float(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                                const void *x, size_t rstride, int nrows, int n);
const char *kvs_attn_kernels_float(int ctype, int n);
/* simd.c's own kernels (AVX2 + F16C, or one head at a time) for
 * kvs_dot_cache_heads / kvs_axpy_cache_heads, and their name for
 * kvs_attn_kernels: "avx2" or "one head at a time". */
void kvs_dot_cache_heads_base(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride,
                              int nrows, int n, float scale, float *out, size_t ostride);
void kvs_axpy_cache_heads_base(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                               const void *x, size_t rstride, int nrows, int n);
const char *kvs_attn_kernels_base(int ctype);
/* The same two on AVX-512F (attn512.c), bit for bit, for f16 (bf = 0) or
 * bf16 (bf = 1) rows and n % 32 == 0; dispatch.c calls them where
 * kvs_attn512_available() (the CPU has AVX-512F and KVSIEVE_ATTN512 is not
 * 0). Builds without attn512.c: KVS_HAVE_ATTN512 undefined. */
int kvs_attn512_available(void);
/* Decode attention's software prefetch (simd.c, attn512.c): as each 64-byte
 * line of a cache row is read, the line KVS_PREFETCH_AHEAD bytes further on
 * is requested, so the requests are spread over the compute. Rows of one KV
 * head are contiguous, so that is the row 8 KiB ahead; near the end of the
 * cache the address may lie past it, which a prefetch ignores (it is made
 * as an integer, never as an out-of-bounds pointer). Measured on a 2-core
 * Sapphire Rapids VM, one thread, 7 heads of d 64 over rows streamed from
 * 96 MiB: dot + axpy 50 -> 39 ns a row pair (AVX2), 40-44 -> 28-33
 * (AVX-512F), where a burst of prefetches for the block two blocks ahead,
 * what simd.c did before, was no faster than none. (That block prefetch had
 * measured 47.9 -> 52.7 tok/s for Qwen2.5 after 4K tokens on a 2-core Zen 4;
 * the spread prefetch has not been measured on Zen 4 yet.) */
#define KVS_PREFETCH_AHEAD 8192
static inline void kvs_prefetch_ahead(const void *p) {
    __builtin_prefetch((const void *)((uintptr_t)p + KVS_PREFETCH_AHEAD), 0, 3);
}
void kvs_dot_cache_heads512(int bf, const float *q, size_t qstride, int nh, const uint16_t *k, size_t rstride,
                            int nrows, int n, float scale, float *out, size_t ostride);
void kvs_axpy_cache_heads512(int bf, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                             const uint16_t *x, size_t rstride, int nrows, int n);

#endif /* KVS_CPU_PRIVATE_H */
