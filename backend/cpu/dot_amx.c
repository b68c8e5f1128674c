/*
 * dot_amx.c -- the block-scale route's AMX-INT8 engine: Q8_0, Q5_0, Q4_K
 * and Q6_K weight rows against Q8 activations (kvs_q8a_block) on Intel AMX
 * tiles (Sapphire Rapids and later), one column or many. Compiled with
 * -mamx-tile -mamx-int8 and AVX-512 (backend/cpu/CMakeLists.txt) and run only
 * where kvs_dot_amx_available() (features.c) says the CPU and the kernel
 * allow it.
 *
 * One tdpbssd makes 16 x 16 x 32 multiply-adds and gives each weight
 * block's integer dot exactly; the float steps after it are the route's
 * (dot_bs.c says which), so these kernels and the AVX-512 VNNI engine of
 * dot_bs.c give the same bits (reference kvs_dot_q8a_bs_ref in dot.c;
 * tests/backend/test_backend_bs.c checks both engines against it bit for
 * bit). Many columns, 16 in the lanes of a tile.
 * dispatch.c sends calls here from KVS_AMX_MIN_COLS (32) columns only:
 * prefill's chunks, and batches of 32 sequences and more. Measured on a
 * 2-core Sapphire Rapids VM (2026-12-04, `kvsieve bench --batch`, ms a decode
 * step, VNNI engine / these tiles): one sequence Gemma 3 13.0 / 18.9 and
 * Qwen2.5 19.7 / 35.6 (the one-column tile kernel this file had, now
 * removed), 3-8 sequences 3-18% slower here, 16 3-7% slower, 32 about even
 * (Gemma 54.7 / 54.6, Qwen2.5 89.0 / 83.2), 64 10% faster (107 / 97, 164 /
 * 148), prefill at 512 tokens ~15-20% faster (Qwen2.5 626-631 / 719-758
 * tok/s). Then (2026-12-04 16:00 UTC, same VM) the next group's rows
 * prefetched as the tiles run (prefetch_share), the float steps two units
 * behind the tiles (KVS_UNITS_PIPELINED) and the output columns gathered
 * from the results tile: one-thread harness, 32 columns, rows from memory,
 * ns a tile product, before / after: Q8_0 (262144 x 640) 58 / 38, Q5_0
 * (65536 x 640) 73 / 52, Q4_K 55 / 59 and Q6_K 82 / 78 (no gain there;
 * what bounds those two is not yet measured); Gemma 3's 32-sequence step
 * 65-67 -> 57-58 ms (`kvsieve bench --batch 1,32`, alternating runs);
 * Qwen2.5 prefill at 512 tokens unchanged (543-574 / 575-580 tok/s).
 *
 * What it is not: no other types, no threading (forward.c splits rows).
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "dot_bs.h"

/* ---- tiles -------------------------------------------------------------------------
 * Two sets so that two blocks are in flight: tmm0 / tmm3 A, 16 weight rows of
 * one block (16 x 32 int8); tmm1 / tmm4 B, one activation block of 16
 * columns in the VNNI order (8 rows of 4 bytes per column); tmm2 / tmm5 C,
 * 16 x 16 int32. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

static void tiles_config(int k) { /* k: values per tile product, 32 or 16 (Q6_K's groups) */
    const int ncol = 16;
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int s = 0; s < 2; s++) {
        c.rows[3 * s] = 16, c.colsb[3 * s] = (uint16_t)k;
        c.rows[3 * s + 1] = (uint8_t)(k / 4), c.colsb[3 * s + 1] = (uint16_t)(4 * ncol);
        c.rows[3 * s + 2] = 16, c.colsb[3 * s + 2] = (uint16_t)(4 * ncol);
    }
    /* gcc 12 does not see that ldtilecfg reads the struct and drops the
     * stores above without this (the loaded config is then all zero) */
    __asm__ volatile("" : : "m"(c) : "memory");
    _tile_loadconfig(&c);
}

/* The units 0..nu-1 (blocks; Q6_K's groups of 16) on the two tile sets,
 * two units ahead: unit u's tiles are issued before the float step of unit
 * u - 2, so the float step never waits for the product it reads (the tiles'
 * latency and their store's trip to L1); the integer results go through a
 * ring of four buffers, so no tile store overwrites what a float step has
 * yet to read. LOAD(unit, A, B, C, buffer) runs the tiles, ACC(unit,
 * buffer) the float step; the units' float steps stay in order. */
#define KVS_UNITS_PIPELINED(LOAD, ACC)                                                                          \
    do {                                                                                                        \
        if (nu > 0) LOAD(0, 0, 1, 2, 0);                                                                        \
        if (nu > 1) LOAD(1, 3, 4, 5, 1);                                                                        \
        int64_t u = 0;                                                                                          \
        for (; u + 2 <= nu; u += 2) {                                                                           \
            if (u + 2 < nu) LOAD(u + 2, 0, 1, 2, (u + 2) & 3);                                                  \
            ACC(u, u & 3);                                                                                      \
            if (u + 3 < nu) LOAD(u + 3, 3, 4, 5, (u + 3) & 3);                                                  \
            ACC(u + 1, (u + 1) & 3);                                                                            \
        }                                                                                                       \
        if (u < nu) ACC(u, u & 3);                                                                              \
    } while (0)

/* Share k (per lines each) of the lines of [p, p + bytes): the next group's
 * rows are prefetched a few lines per tile product while this group's run,
 * not in one burst (which stalls on the fill buffers) and not left to the
 * scale gathers and tile loads (they then waited on memory at the start of
 * every group: in a one-thread harness over Gemma 3's Q8_0 output matrix,
 * 262144 rows x 640, 32 columns, 58 -> 38 ns a tile product together with
 * the pipelining above and the gathered output columns). always_inline:
 * gcc 12 dropped every call of this function when it was merely inline
 * (a function of nothing but prefetches has no effect in its view), which
 * left the object without a single prefetch instruction. */
static inline __attribute__((always_inline)) void prefetch_share(const uint8_t *p, size_t bytes, size_t per, size_t k) {
    const size_t lines = (bytes + 63) / 64, l1 = (k + 1) * per < lines ? (k + 1) * per : lines;
    for (size_t l = k * per; l < l1; l++) _mm_prefetch((const char *)p + l * 64, _MM_HINT_T0);
}

/* Many columns: per pass, as many 16-column tiles as KVS_BS_BP bytes of
 * packed activations hold (B tiles [tile][block][8][16] int32, scales
 * [tile][block][16]); per group of 16 rows, their scales (and for Q5_0 their
 * unpacked values) once, then every tile of the pass with the 16 rows'
 * accumulators in registers, columns in the lanes. */
static void rows_cols(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                      int ncols, int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32;
    const int bs = bsize(type), q8 = type == KVS_GGML_Q8_0, k4 = type == KVS_GGML_Q4_K, q6 = type == KVS_GGML_Q6_K;
    const int64_t nu = q6 ? 2 * nb : nb; /* tile products per row: blocks, or Q6_K's groups of 16 */
    const __m512i roff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    _Alignas(64) int32_t bp[KVS_BS_BP / 4];
    _Alignas(64) float dxt[KVS_BS_BP / 32], sxt[KVS_BS_BP / 32]; /* scales, Q4_K's scaled sums */
    _Alignas(64) float dwt[KVS_BS_NMAX / 16 * 16], dmt[KVS_BS_NMAX / 32 * 16]; /* per unit, per row */
    _Alignas(64) int8_t panel[16 * KVS_BS_NMAX]; /* Q5_0's 16 rows unpacked, or Q4_K's (q4k_prep) */
    _Alignas(64) int32_t cb[4][16 * 16];
    _Alignas(64) float yt[16 * 16];
    const int64_t ng = nrows / 16 * 16;
    const int ntile = (ncols + 15) / 16;
    const int per = (int)(KVS_BS_BP / (nb * 512)); /* tiles per pass; >= 1 since nb <= 256 */
    assert(per >= 1);
    const __m512i ycol = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16)); /* a column of yt */
    const size_t gbytes = 16 * rb; /* a group's rows */
    tiles_config(q6 ? 16 : 32);
    for (int t0 = 0; t0 < ntile; t0 += per) {
        const int tn = ntile - t0 < per ? ntile - t0 : per;
        bs_pack(q6, x, xs, ncols, t0, tn, nb, bp, dxt, sxt, NULL, 0);
        const size_t pf_per = ((gbytes + 63) / 64 + (size_t)(tn * nu) - 1) / (size_t)(tn * nu);
        for (int64_t g = 0; g < ng; g += 16) {
            const uint8_t *r0 = rows + (size_t)g * rb;
            const uint8_t *next = g + 16 < ng ? r0 + gbytes : NULL;
            if (k4) q4k_prep(r0, rb, n, panel, dwt, dmt);
            else if (q6) q6k_prep(r0, rb, n, panel, dwt, _mm256_setzero_si256());
            else
                for (int64_t b = 0; b < nb; b++) {
                    _mm512_store_ps(dwt + b * 16, scales16(r0 + b * bs, roff));
                    if (!q8) unpack16(type, r0 + b * bs, rb, panel + b * 32, (size_t)n, _mm256_setzero_si256());
                }
            for (int t = 0; t < tn; t++) {
                __m512 acc[16];
                #pragma GCC unroll 16
                for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
#define KVS_COLS_LOAD(B, TA, TB, TC, S)                                                                         \
    do {                                                                                                        \
        if (next) prefetch_share(next, gbytes, pf_per, (size_t)(t * nu + (B)));                                \
        if (q8) _tile_loadd(TA, r0 + (B) * bs + 2, (long)rb);                                                   \
        else if (q6) _tile_loadd(TA, panel + (B) * 16, (long)n);                                                \
        else _tile_loadd(TA, panel + (B) * 32, (long)n);                                                        \
        if (q6) _tile_loadd(TB, bp + (t * nb + (B) / 2) * 128 + ((B) % 2) * 64, 64); /* rows 4h..4h+3 */       \
        else _tile_loadd(TB, bp + (t * nb + (B)) * 128, 64);                                                    \
        _tile_zero(TC);                                                                                         \
        if (k4) _tile_dpbusd(TC, TA, TB);                                                                       \
        else _tile_dpbssd(TC, TA, TB);                                                                          \
        _tile_stored(TC, cb[S], 64);                                                                            \
    } while (0)
#define KVS_COLS_ACC(B, S)                                                                                      \
    do {                                                                                                        \
        const __m512 dx = _mm512_load_ps(dxt + (t * nb + (q6 ? (B) / 2 : (B))) * 16);                         \
        const float *dw = dwt + (B) * 16;                                                                       \
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) acc[r] =                                          \
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dw[r]), dx),                                           \
                            _mm512_cvtepi32_ps(_mm512_load_si512(cb[S] + r * 16)), acc[r]);                     \
        if (k4) {                                                                                               \
            const __m512 sx = _mm512_load_ps(sxt + (t * nb + (B)) * 16);                                       \
            const float *dm = dmt + (B) * 16;                                                                   \
            _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) acc[r] =                                      \
                _mm512_fmadd_ps(_mm512_set1_ps(dm[r]), sx, acc[r]);                                             \
        }                                                                                                       \
    } while (0)
                KVS_UNITS_PIPELINED(KVS_COLS_LOAD, KVS_COLS_ACC);
#undef KVS_COLS_LOAD
#undef KVS_COLS_ACC
                #pragma GCC unroll 16
                for (int r = 0; r < 16; r++) _mm512_store_ps(yt + r * 16, acc[r]);
                const int c0 = (t0 + t) * 16, nc = ncols - c0 < 16 ? ncols - c0 : 16;
                for (int c = 0; c < nc; c++) /* column c's 16 rows, gathered from the tile of results */
                    _mm512_storeu_ps(out + (int64_t)(c0 + c) * os + g, _mm512_i32gather_ps(ycol, yt + c, 4));
            }
        }
    }
    _tile_release();
    for (int64_t r = ng; r < nrows; r++)
        for (int c = 0; c < ncols; c++)
            out[(int64_t)c * os + r] = bs_one_row(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
}

void kvs_dot_amx_rows(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                      int ncols, int64_t n, float *out, int64_t os) {
    assert(kvs_dot_amx_available() && n <= KVS_BS_NMAX && ncols >= 1);
    rows_cols(type, rows, rb, nrows, x, xs, ncols, n, out, os);
}
