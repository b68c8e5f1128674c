/*
 * dot_amx.c -- Q8_0, Q5_0, Q4_K and Q6_K weight rows against Q8 activations
 * (kvs_q8a_block) on Intel AMX-INT8 tiles: one row or many, one column or
 * many. Compiled with -mamx-tile -mamx-int8 and AVX-512 (backend/CMakeLists.txt)
 * and run only where kvs_dot_amx_available() says the CPU and the kernel
 * allow it.
 *
 * Why a route of its own: one tdpbssd makes 16 x 16 x 32 multiply-adds, so
 * a batch of sequences (batched decode: a request's variants and the slots)
 * costs little more than one sequence, where dot.c's VNNI tiles pay about
 * the same for every column. The tiles give each weight block's integer
 * dot exactly, so the float arithmetic after them is ours to define. It is
 *
 *     y = 0;  for each block b in order:  y = fma(dw_b * dx_b, (float)S_b, y)
 *
 * dw_b the weight block's f16 scale, dx_b the activation block's scale, S_b
 * the block's 32 int8 products summed (exact in int32; Q5_0's values taken
 * as q - 16 in [-16, 15]). Q4_K's 32-value sub-blocks have an unsigned
 * value (tdpbusd), a scale d * sc and a min, whose term follows at once:
 *
 *     y = fma(dw_b * dx_b, (float)S_b, y);  y = fma(-(dmin * m_b), dx_b * X_b, y)
 *
 * X_b the activation block's integer sum. Q6_K's scales belong to groups of
 * 16 (values q - 32, signed): a tile product per group (16-value tiles), and
 * y = fma(d * sc_g * dx, (float)S_g, y) per group in order. Every entry point computes exactly
 * that: one row alone with scalar fmaf (Q4_K, Q6_K: a superblock's integer
 * dots reduced together), one column with 16 rows in the vector lanes (Q4_K,
 * Q6_K: row by row, which measured faster than their tiles for one column), many
 * columns with 16 columns in the lanes. So a sequence in a batch gets the
 * logits it gets alone, bit for bit, as dot.c's kernels guarantee for theirs,
 * and kvs_dot_q8a_bs_ref (dot.c, plain C) is the tests' reference. It is not
 * dot.c's float structure (vector lanes of 4-product partial sums), so the
 * route is a property of (type, n) -- kvs_dot_amx_route -- and dot.c's entry
 * points take it for every call on such a matrix, one column or many.
 *
 * What it is not: no other types (dot.c's kernels take them), no
 * threading (forward.c splits rows), no prefill (forward.c's prefill still
 * dequantises and calls sgemm).
 */
#define _GNU_SOURCE /* syscall() */
#include <assert.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine_private.h"
#include "quant_blocks.h"

#define KVS_AMX_NMAX 8192      /* longest row on the route (the stack panels below) */
#define KVS_AMX_BP (128 * 1024) /* bytes of packed activations per pass */

/* ---- availability --------------------------------------------------------------
 * CPUID says whether the CPU has AMX-TILE, AMX-INT8 and AVX-512; XCR0 whether
 * the kernel saves tile state; Linux then hands out tile data only to a
 * process that asked (arch_prctl ARCH_REQ_XCOMP_PERM). KVSIEVE_AMX=0 turns
 * the route off (valgrind cannot decode AMX; A/B measurements). The answer
 * is cached: a fact about this machine and process, computed once. */
#define KVS_ARCH_REQ_XCOMP_PERM 0x1023
#define KVS_XFEATURE_XTILEDATA 18

static int amx_probe(void) {
    const char *e = getenv("KVSIEVE_AMX");
    if (e && e[0] == '0') return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int tile = (d >> 24) & 1, int8 = (d >> 25) & 1, f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni = (c >> 11) & 1;
    if (!(tile && int8 && f && bw && vl && vnni)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x600e6) != 0x600e6) return 0; /* SSE, AVX, AVX-512 and tile state enabled */
    return syscall(SYS_arch_prctl, KVS_ARCH_REQ_XCOMP_PERM, KVS_XFEATURE_XTILEDATA) == 0;
}

int kvs_dot_amx_available(void) {
    static atomic_int state; /* 0 not asked yet, 1 usable, -1 not */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        s = amx_probe() ? 1 : -1;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s > 0;
}

int kvs_dot_amx_route(int type, int64_t n) {
    const int ok = type == KVS_GGML_Q8_0 || type == KVS_GGML_Q5_0
                       ? n % 32 == 0
                       : (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K) && n % 256 == 0;
    return ok && n > 0 && n <= KVS_AMX_NMAX && kvs_dot_amx_available();
}

/* ---- one row ---------------------------------------------------------------------- */

static inline int bsize(int type) { return type == KVS_GGML_Q8_0 ? 34 : 22; }

/* A weight block's 32 values as int8 in element order. */
static inline __m256i wblock(int type, const uint8_t *blk) {
    return type == KVS_GGML_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2)) : q5_0_unpack(blk);
}

/* S_b: the block's exact integer dot (|w| as vpdpbusd's unsigned operand, x
 * with w's sign; |w| <= 128, |x| <= 127: no overflow). */
static inline int32_t block_isum(__m256i w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* The 8 scales d * sc and negated mins -(dmin * m) of a Q4_K superblock, as
 * vectors: the 6-bit fields of q4k_scale_min unpacked four at a time with
 * 32-bit masks and shifts (the same integers, the same float products). */
static inline void q4k_sm(const uint8_t *blk, __m256 *dw, __m256 *dm) {
    uint32_t u[3];
    memcpy(u, blk + 4, 12);
    const uint64_t sc = (uint64_t)(u[0] & 0x3f3f3f3fu) |
                        (uint64_t)((u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)) << 32;
    const uint64_t mn = (uint64_t)(u[1] & 0x3f3f3f3fu) |
                        (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)) << 32;
    const __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    *dw = _mm256_mul_ps(_mm256_set1_ps(h2f(blk)), fs);
    *dm = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(blk + 2)), fm), _mm256_set1_ps(-0.0f));
}

/* Q4_K superblock (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and
 * mins, 128 of nibbles): sub-block j's 32 values (0..15) into q, its scale
 * d * sc and its negated min -(dmin * m) into dw[j], dm[j]. */
static inline void q4k_unpack(const uint8_t *blk, __m256i q[8], float dw[8], float dm[8]) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < 4; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i));
        q[2 * i] = _mm256_and_si256(v, m4);
        q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    __m256 w, m;
    q4k_sm(blk, &w, &m);
    _mm256_storeu_ps(dw, w);
    _mm256_storeu_ps(dm, m);
}

/* An activation block's sum times its scale: Q4_K's min term per block. */
static inline float x_sum(const kvs_q8a_block *xb) { return xb->d * (float)(xb->sum16[0] + xb->sum16[1]); }

/* Q6_K superblock (210 bytes: ql[128], qh[64], int8 scales[16], f16 d):
 * 32-value block k (0..7) as int8 q - 32 in [-32, 31] into q[k]. */
static inline void q6k_unpack8(const uint8_t *blk, __m256i q[8]) {
    const __m256i o = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        q6k_unpack(blk, h, q + 4 * h);
        for (int k = 0; k < 4; k++) q[h * 4 + k] = _mm256_sub_epi8(q[h * 4 + k], o);
    }
}

/* Q6_K, NR rows (1 or 2: two rows' chains of dependent fmas overlap) against
 * one column, each row through exactly the operations of one row alone: per
 * superblock 16 groups of 16; each 32-value block's two halves are the two
 * 128-bit lanes of its vpdpbusd sums, kept apart by the tree. */
static inline __attribute__((always_inline)) void q6k_rows(const int NR, const uint8_t *const *r,
                                                         const kvs_q8a_block *x, int64_t n, float *y) {
    float acc[2] = {0.0f, 0.0f};
    for (int64_t s = 0; s < n / 256; s++) {
        int32_t S[2][16];
        const int8_t *sc[2];
        float d[2];
        for (int i = 0; i < NR; i++) {
            const uint8_t *blk = r[i] + s * 210;
            __m256i q[8], p[8];
            sc[i] = (const int8_t *)(blk + 192);
            d[i] = h2f(blk + 208);
            q6k_unpack8(blk, q);
            for (int k = 0; k < 8; k++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)x[s * 8 + k].q);
                p[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q[k], q[k]),
                                           _mm256_sign_epi8(xv, q[k]));
            }
            /* b: lanes [p0 p1 p2 p3] of the low halves, then of the high halves */
            const __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            _Alignas(32) int32_t t[16];
            _mm256_store_si256((__m256i *)t, b0);
            _mm256_store_si256((__m256i *)(t + 8), b1);
            for (int k = 0; k < 8; k++)
                S[i][2 * k] = t[(k / 4) * 8 + k % 4], S[i][2 * k + 1] = t[(k / 4) * 8 + 4 + k % 4];
        }
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < NR; i++)
                acc[i] = fmaf(d[i] * (float)sc[i][g] * x[s * 8 + g / 2].d, (float)S[i][g], acc[i]);
    }
    for (int i = 0; i < NR; i++) y[i] = acc[i];
}

/* Q4_K, NR rows (1 or 2) against one column, as q6k_rows: a superblock's 8
 * integer dots reduced together by a transposing horizontal-add tree, then
 * the float steps in order. */
static inline __attribute__((always_inline)) void q4k_rows(const int NR, const uint8_t *const *r,
                                                         const kvs_q8a_block *x, int64_t n, float *y) {
    float acc[2] = {0.0f, 0.0f};
    for (int64_t s = 0; s < n / 256; s++) {
        float dw[2][8], dm[2][8], S[2][8];
        for (int i = 0; i < NR; i++) {
            __m256i q[8], p[8];
            q4k_unpack(r[i] + s * 144, q, dw[i], dm[i]);
            for (int j = 0; j < 8; j++)
                p[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[j],
                                           _mm256_loadu_si256((const __m256i *)x[s * 8 + j].q));
            __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(b0), _mm256_extracti128_si256(b0, 1));
            __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(b1), _mm256_extracti128_si256(b1, 1));
            _mm256_storeu_ps(S[i], _mm256_cvtepi32_ps(_mm256_set_m128i(s1, s0)));
        }
        for (int j = 0; j < 8; j++) {
            const kvs_q8a_block *xb = &x[s * 8 + j];
            for (int i = 0; i < NR; i++) {
                acc[i] = fmaf(dw[i][j] * xb->d, S[i][j], acc[i]);
                acc[i] = fmaf(dm[i][j], x_sum(xb), acc[i]);
            }
        }
    }
    for (int i = 0; i < NR; i++) y[i] = acc[i];
}

float kvs_dot_q8a_amx(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    const uint8_t *r = row;
    float y;
    if (type == KVS_GGML_Q6_K) {
        q6k_rows(1, &r, x, n, &y);
        return y;
    }
    if (type == KVS_GGML_Q4_K) {
        q4k_rows(1, &r, x, n, &y);
        return y;
    }
    const int bs = bsize(type);
    y = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = r + b * bs;
        y = fmaf(h2f(blk) * x[b].d, (float)block_isum(wblock(type, blk), x[b].q), y);
    }
    return y;
}

/* ---- tiles -------------------------------------------------------------------------
 * Two sets so that two blocks are in flight: tmm0 / tmm3 A, 16 weight rows of
 * one block (16 x 32 int8); tmm1 / tmm4 B, one activation block of ncol
 * columns in the VNNI order (8 rows of 4 bytes per column); tmm2 / tmm5 C,
 * 16 x ncol int32. ncol is 1 (one column, rows in the lanes) or 16. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

static void tiles_config(int ncol, int k) { /* k: values per tile product, 32 or 16 (Q6_K's groups) */
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

/* The units b..nu-1 (blocks; Q6_K's groups of 16) two at a time on the two tile sets, each pair's
 * products issued before the float steps of either: LOAD(block, A, B, C,
 * buffer) runs the tiles, ACC(block, buffer) the float step. */
#define KVS_BLOCK_PAIRS(LOAD, ACC)                                                                              \
    do {                                                                                                        \
        for (; b + 2 <= nu; b += 2) {                                                                           \
            LOAD(b, 0, 1, 2, 0);                                                                                \
            LOAD(b + 1, 3, 4, 5, 1);                                                                            \
            ACC(b, 0);                                                                                          \
            ACC(b + 1, 1);                                                                                      \
        }                                                                                                       \
        if (b < nu) {                                                                                           \
            LOAD(b, 0, 1, 2, 0);                                                                                \
            ACC(b, 0);                                                                                          \
        }                                                                                                       \
    } while (0)

/* The f16 scales of block b of 16 rows (row r at blk + r * rb) as floats. */
static inline __m512 scales16(const uint8_t *blk, __m512i roff) {
    __m512i d = _mm512_i32gather_epi32(roff, blk, 1); /* 4 bytes from each row; the low 2 are the scale */
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

/* Q5_0: block b of 16 rows unpacked to int8, row r at dst + r * ds. */
static inline void unpack16(const uint8_t *blk, size_t rb, int8_t *dst, size_t ds) {
    for (int r = 0; r < 16; r++) _mm256_storeu_si256((__m256i *)(dst + r * ds), q5_0_unpack(blk + r * rb));
}

/* Q4_K: 16 rows unpacked to u8 values (row r at panel + r * n), their
 * scales and negated mins as floats (dwt / dmt [block][16]). */
static void q4k_prep(const uint8_t *r0, size_t rb, int64_t n, int8_t *panel, float *dwt, float *dmt) {
    __m256i q[8];
    float dw[8], dm[8];
    for (int r = 0; r < 16; r++)
        for (int64_t s = 0; s < n / 256; s++) {
            q4k_unpack(r0 + r * rb + s * 144, q, dw, dm);
            for (int j = 0; j < 8; j++) {
                _mm256_storeu_si256((__m256i *)(panel + r * n + (s * 8 + j) * 32), q[j]);
                dwt[(s * 8 + j) * 16 + r] = dw[j];
                dmt[(s * 8 + j) * 16 + r] = dm[j];
            }
        }
}

/* Q6_K: 16 rows as int8 q - 32 (row r at panel + r * n) and d * sc per
 * group of 16 (dwt [group][16]). */
static void q6k_prep(const uint8_t *r0, size_t rb, int64_t n, int8_t *panel, float *dwt) {
    __m256i q[8];
    for (int r = 0; r < 16; r++)
        for (int64_t s = 0; s < n / 256; s++) {
            const uint8_t *blk = r0 + r * rb + s * 210;
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = h2f(blk + 208);
            q6k_unpack8(blk, q);
            for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(panel + r * n + (s * 8 + k) * 32), q[k]);
            for (int g = 0; g < 16; g++) dwt[(s * 16 + g) * 16 + r] = d * (float)sc[g];
        }
}

/* One column, 16 rows per group in the lanes of one accumulator. */
static void rows_one(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x, int64_t n,
                     float *out) {
    if (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K) { /* one column: two rows at a time (faster than tiles) */
        int64_t r = 0;
        for (; r + 2 <= nrows; r += 2) {
            const uint8_t *rp[2] = {rows + (size_t)r * rb, rows + (size_t)(r + 1) * rb};
            if (type == KVS_GGML_Q4_K) q4k_rows(2, rp, x, n, out + r);
            else q6k_rows(2, rp, x, n, out + r);
        }
        if (r < nrows) out[r] = kvs_dot_q8a_amx(type, rows + (size_t)r * rb, x, n);
        return;
    }
    const int64_t nb = n / 32;
    const int bs = bsize(type), q8 = type == KVS_GGML_Q8_0;
    const __m512i roff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    _Alignas(64) int8_t wb[2][16 * 32];
    _Alignas(64) int32_t cb[2][16];
    const int64_t ng = nrows / 16 * 16, nu = nb;
    tiles_config(1, 32);
    for (int64_t g = 0; g < ng; g += 16) {
        const uint8_t *r0 = rows + (size_t)g * rb;
        __m512 acc = _mm512_setzero_ps();
        int64_t b = 0;
/* block B on tile set (TA, TB, TC) through buffers wb[S], cb[S] */
#define KVS_ONE_LOAD(B, TA, TB, TC, S)                                                                          \
    do {                                                                                                        \
        const uint8_t *blk = r0 + (B) * bs;                                                                     \
        if (q8) _tile_loadd(TA, blk + 2, (long)rb);                                                             \
        else {                                                                                                  \
            unpack16(blk, rb, wb[S], 32);                                                                       \
            _tile_loadd(TA, wb[S], 32);                                                                         \
        }                                                                                                       \
        _tile_loadd(TB, x[B].q, 4);                                                                             \
        _tile_zero(TC);                                                                                         \
        _tile_dpbssd(TC, TA, TB);                                                                               \
        _tile_stored(TC, cb[S], 4);                                                                             \
    } while (0)
#define KVS_ONE_ACC(B, S)                                                                                       \
    acc = _mm512_fmadd_ps(_mm512_mul_ps(scales16(r0 + (B) * bs, roff), _mm512_set1_ps(x[B].d)),              \
                          _mm512_cvtepi32_ps(_mm512_load_si512(cb[S])), acc)
        KVS_BLOCK_PAIRS(KVS_ONE_LOAD, KVS_ONE_ACC);
#undef KVS_ONE_LOAD
#undef KVS_ONE_ACC
        _mm512_storeu_ps(out + g, acc);
    }
    _tile_release();
    for (int64_t r = ng; r < nrows; r++) out[r] = kvs_dot_q8a_amx(type, rows + (size_t)r * rb, x, n);
}

/* Many columns: per pass, as many 16-column tiles as KVS_AMX_BP bytes of
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
    _Alignas(64) int32_t bp[KVS_AMX_BP / 4];
    _Alignas(64) float dxt[KVS_AMX_BP / 32], sxt[KVS_AMX_BP / 32]; /* scales, Q4_K's scaled sums */
    _Alignas(64) float dwt[KVS_AMX_NMAX / 16 * 16], dmt[KVS_AMX_NMAX / 32 * 16]; /* per unit, per row */
    _Alignas(64) int8_t panel[16 * KVS_AMX_NMAX]; /* Q5_0's 16 rows unpacked, or Q4_K's (q4k_prep) */
    _Alignas(64) int32_t cb[2][16 * 16];
    _Alignas(64) float yt[16 * 16];
    const int64_t ng = nrows / 16 * 16;
    const int ntile = (ncols + 15) / 16;
    const int per = (int)(KVS_AMX_BP / (nb * 512)); /* tiles per pass; >= 1 since nb <= 256 */
    assert(per >= 1);
    tiles_config(16, q6 ? 16 : 32);
    for (int t0 = 0; t0 < ntile; t0 += per) {
        const int tn = ntile - t0 < per ? ntile - t0 : per;
        for (int t = 0; t < tn; t++)
            for (int64_t b = 0; b < nb; b++) {
                int32_t *B = bp + (t * nb + b) * 128;
                float *D = dxt + (t * nb + b) * 16;
                for (int c = 0; c < 16; c++) {
                    const int col = (t0 + t) * 16 + c;
                    const kvs_q8a_block *xb = col < ncols ? &x[(int64_t)col * xs + b] : NULL;
                    for (int k = 0; k < 8; k++) {
                        int32_t v = 0;
                        if (xb) memcpy(&v, xb->q + 4 * k, 4);
                        B[k * 16 + c] = v;
                    }
                    D[c] = xb ? xb->d : 0.0f;
                    sxt[(t * nb + b) * 16 + c] = xb ? x_sum(xb) : 0.0f;
                }
            }
        for (int64_t g = 0; g < ng; g += 16) {
            const uint8_t *r0 = rows + (size_t)g * rb;
            if (k4) q4k_prep(r0, rb, n, panel, dwt, dmt);
            else if (q6) q6k_prep(r0, rb, n, panel, dwt);
            else
                for (int64_t b = 0; b < nb; b++) {
                    _mm512_store_ps(dwt + b * 16, scales16(r0 + b * bs, roff));
                    if (!q8) unpack16(r0 + b * bs, rb, panel + b * 32, (size_t)n);
                }
            for (int t = 0; t < tn; t++) {
                __m512 acc[16];
                #pragma GCC unroll 16
                for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
                int64_t b = 0;
#define KVS_COLS_LOAD(B, TA, TB, TC, S)                                                                         \
    do {                                                                                                        \
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
                KVS_BLOCK_PAIRS(KVS_COLS_LOAD, KVS_COLS_ACC);
#undef KVS_COLS_LOAD
#undef KVS_COLS_ACC
                #pragma GCC unroll 16
                for (int r = 0; r < 16; r++) _mm512_store_ps(yt + r * 16, acc[r]);
                const int c0 = (t0 + t) * 16, nc = ncols - c0 < 16 ? ncols - c0 : 16;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < 16; r++) out[(int64_t)(c0 + c) * os + g + r] = yt[r * 16 + c];
            }
        }
    }
    _tile_release();
    for (int64_t r = ng; r < nrows; r++)
        for (int c = 0; c < ncols; c++)
            out[(int64_t)c * os + r] = kvs_dot_q8a_amx(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
}

void kvs_dot_q8a_rows_amx(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                          int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    assert(kvs_dot_amx_route(type, n));
    if (ncols == 1) rows_one(type, rows, row_bytes, nrows, x, n, out);
    else rows_cols(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}
