/*
 * dispatch.c -- the one place that picks a kernel: the entry points of
 * kvs_cpu.h whose work has ISA variants send each call to the variant this
 * CPU runs (features.c says which it has), the portable kernel otherwise.
 *
 *   kvs_dot_q8a, kvs_dot_q8a_rows (kvs_dot_q8a_cols):
 *     the block-scale route where kvs_dot_bs_route(type, n) (dot_bs.c, or
 *     dot_amx.c's tiles from KVS_AMX_MIN_COLS columns), else dot.c's kernels
 *     built with AVX-512 VNNI (dot_vnni.c) where the CPU has them, else
 *     dot.c's x86-64-v3 or scalar kernels;
 *   kvs_dot_cache_heads, kvs_axpy_cache_heads (kvs_attn_kernels) of f32 /
 *     f16 / bf16 rows (kvcache.c sends them here as *_float):
 *     attn512.c for f16 / bf16 rows of a multiple of 32 elements where the
 *     CPU has AVX-512F, else simd.c's kernels.
 *
 * Every variant gives its reference's bits (cpu_private.h lists which and
 * the tests that check it), so the choice changes speed, never a result --
 * except the block-scale route, whose float structure is its own and is a
 * property of (type, n) and the machine for every call.
 * What it is not: no kernel, no probing (features.c).
 */
#include <assert.h>
#include <math.h>

#include "cpu_private.h"

/* ---- dot products of quantised rows ------------------------------------------------ */

float kvs_dot_q8a(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    if (kvs_dot_bs_route(type, n)) return kvs_dot_q8a_bs(type, row, x, n);
#if defined(KVS_HAVE_DOT_VNNI)
    if (kvs_dot_vnni_available()) return kvs_dot_q8a_vnni(type, row, x, n);
#endif
    return kvs_dot_q8a_base(type, row, x, n);
}

void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    if (kvs_dot_bs_route(type, n)) {
        kvs_dot_q8a_rows_bs(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
#if defined(KVS_HAVE_DOT_VNNI)
    if (kvs_dot_vnni_available()) {
        kvs_dot_q8a_rows_vnni(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
        return;
    }
#endif
    kvs_dot_q8a_rows_base(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}

void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y) {
    kvs_dot_q8a_rows(type, row, 0, 1, x, xstride, ncols, n, y, 1);
}

/* ---- the block-scale route's two engines --------------------------------------------- */
#if defined(KVS_HAVE_DOT_BS)
void kvs_dot_q8a_rows_bs(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                         int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    assert(kvs_dot_bs_route(type, n));
    /* AMX tiles from KVS_AMX_MIN_COLS columns (prefill's chunks, large batches); fewer take the VNNI kernels
     * on AMX machines too: the same bits, and faster there (dot_amx.c) */
    if (kvs_dot_bs_engine() == 2 && ncols >= KVS_AMX_MIN_COLS)
        kvs_dot_amx_rows(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
    else kvs_dot_q8a_rows_bs_vnni(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}
#else
/* This build has no block-scale route (dot_bs.c): kvs_dot_bs_route is never 1. */
float kvs_dot_q8a_bs(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    (void)type, (void)row, (void)x, (void)n;
    assert(!"kvs_dot_q8a_bs without the block-scale route");
    return NAN;
}
static void bs_unbuilt(int ncols, int64_t nrows, float *out, int64_t ostride) {
    assert(!"kvs_dot_q8a_rows_bs without the block-scale route");
    for (int c = 0; c < ncols; c++)
        for (int64_t r = 0; r < nrows; r++) out[(int64_t)c * ostride + r] = NAN;
}
void kvs_dot_q8a_rows_bs(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                         int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    (void)type, (void)rows, (void)row_bytes, (void)x, (void)xstride, (void)n;
    bs_unbuilt(ncols, nrows, out, ostride);
}
void kvs_dot_q8a_rows_bs_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                              int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    (void)type, (void)rows, (void)row_bytes, (void)x, (void)xstride, (void)n;
    bs_unbuilt(ncols, nrows, out, ostride);
}
#endif

/* ---- decode attention over KV cache rows ---------------------------------------------- */

#ifdef KVS_HAVE_ATTN512
/* attn512.c takes f16/bf16 rows of a multiple of 32 elements on AVX-512F CPUs */
static int use_attn512(int ctype, int n) {
    return (ctype == KVS_CACHE_F16 || ctype == KVS_CACHE_BF16) && n % 32 == 0 && kvs_attn512_available();
}
#endif

const char *kvs_attn_kernels_float(int ctype, int n) {
#ifdef KVS_HAVE_ATTN512
    if (use_attn512(ctype, n)) return "avx512f";
#else
    (void)n;
#endif
    return kvs_attn_kernels_base(ctype);
}

void kvs_dot_cache_heads_float(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride,
                               int nrows, int n, float scale, float *out, size_t ostride) {
#ifdef KVS_HAVE_ATTN512
    if (use_attn512(ctype, n)) {
        kvs_dot_cache_heads512(ctype == KVS_CACHE_BF16, q, qstride, nh, k, rstride, nrows, n, scale, out, ostride);
        return;
    }
#endif
    kvs_dot_cache_heads_base(ctype, q, qstride, nh, k, rstride, nrows, n, scale, out, ostride);
}

void kvs_axpy_cache_heads_float(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                                const void *x, size_t rstride, int nrows, int n) {
#ifdef KVS_HAVE_ATTN512
    if (use_attn512(ctype, n)) {
        kvs_axpy_cache_heads512(ctype == KVS_CACHE_BF16, o, ostride, nh, p, pstride, x, rstride, nrows, n);
        return;
    }
#endif
    kvs_axpy_cache_heads_base(ctype, o, ostride, nh, p, pstride, x, rstride, nrows, n);
}
