/*
 * dot_bs.c -- the block-scale route: Q8_0, Q5_0, Q4_K and Q6_K weight rows
 * against Q8 activations (kvs_q8a_block), one row or many, one column or
 * many, with a float structure of its own, on two engines: AVX-512 VNNI
 * (here) and AMX-INT8 tiles (dot_amx.c). Compiled with AVX-512 VNNI
 * (backend/cpu/CMakeLists.txt) and run only where kvs_dot_bs_engine()
 * (features.c) picks one (AMX where the CPU has it, else VNNI; KVSIEVE_BS=0
 * turns both off); dispatch.c sends the calls.
 * Reference: kvs_dot_q8a_bs_ref (dot.c, plain C); tests/backend/
 * test_backend_bs.c checks both engines against it bit for bit.
 *
 * Why a route of its own: a batch of sequences (batched decode: a request's
 * variants and the slots) multiplies every weight block by many activation
 * columns, and dot.c's tiles pay a horizontal reduction and a float step per
 * (row, column, block) in the shape of the one-column dot. Here each weight
 * block's integer dot S is computed exactly, so the float arithmetic after it
 * is ours to define. It is
 *
 *     y = 0;  for each block b in order:  y = fma(dw_b * dx_b, (float)S_b, y)
 *
 * dw_b the weight block's f16 scale, dx_b the activation block's scale, S_b
 * the block's 32 int8 products summed (exact in int32; Q5_0's values taken
 * as q - 16 in [-16, 15]). Q4_K's 32-value sub-blocks have an unsigned
 * value, a scale d * sc and a min, whose term follows at once:
 *
 *     y = fma(dw_b * dx_b, (float)S_b, y);  y = fma(-(dmin * m_b), dx_b * X_b, y)
 *
 * X_b the activation block's integer sum. Q6_K's scales belong to groups of
 * 16 (values q - 32, signed): y = fma(d * sc_g * dx, (float)S_g, y) per group
 * in order. Every kernel of both engines computes exactly that -- one row
 * alone with scalar fmaf, one column with 16 rows in the vector lanes (Q4_K,
 * Q6_K: two rows at a time), many columns with 16 columns in the lanes -- so
 * a sequence in a batch gets the logits it gets alone, bit for bit, and the
 * two engines give the same bits; kvs_dot_q8a_bs_ref (dot.c, plain C) is the
 * tests' reference. It is not dot.c's float structure (vector lanes of
 * 4-product partial sums), so the route is a property of (type, n) and the
 * machine -- kvs_dot_bs_route -- and dispatch.c's entry points take it for
 * every call on such a matrix.
 *
 * The VNNI engine, many columns: vpdpbusd multiplies unsigned bytes by signed
 * ones, 4 per 32-bit lane. Columns in the lanes: the activations of 16 columns
 * packed 4 bytes per column (the order of an AMX B tile), each weight's 4
 * bytes broadcast to every lane, so 8 vpdpbusd give one row's S_b for 16
 * columns with no horizontal sum. The weights are the unsigned operand, as
 * w + 128 (Q5_0: its stored q = w + 16; Q4_K: its nibbles as they are), and
 * the lanes start from -128 X_b (Q5_0: -16 X_b; Q6_K: the group's 16-sum),
 * so S_b comes out exact. One column: each
 * block through one vpdpbusd, 8 blocks' partial sums reduced together by a
 * transposing add tree, and the float steps with 16 rows in the lanes.
 *
 * What it is not: no other types (dot.c's kernels take them), no threading
 * (forward.c splits rows). Prefill calls it too, with a chunk's T tokens as
 * the columns (forward.c, matmul): the float structure above does not depend
 * on the number of columns, so a prompt's tokens get decode's bits.
 */
#include <assert.h>

#include "dot_bs.h"

float kvs_dot_q8a_bs(int type, const void *row, const kvs_q8a_block *x, int64_t n) {
    assert(kvs_dot_bs_route(type, n));
    return bs_one_row(type, row, x, n);
}

/* ---- VNNI, one column ------------------------------------------------------------ */

/* A Q8_0 / Q5_0 block as vpdpbusd's unsigned operand, w + wofs(type): Q8_0's
 * bytes xor 0x80, Q5_0's stored q as it is (two operations fewer). The one-
 * and many-column kernels below then correct by -wofs X. */
static inline int wofs(int type) { return type == KVS_GGML_Q5_0 ? 16 : 128; }
static inline __m256i wblock_u(int type, const uint8_t *blk) {
    if (type == KVS_GGML_Q5_0) return q5_0_unpack_u(blk);
    return _mm256_xor_si256(wblock(type, blk), _mm256_set1_epi8((char)0x80));
}

/* 8 vectors of 8 partial sums -> their 8 sums, vector j in lane j. */
static inline __m256i sum8x8(const __m256i p[8]) {
    /* lo / hi: vectors 0-3 / 4-7, each sum of their low 128-bit halves, then of the high ones */
    const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* 16 x 16 int32 in registers transposed: v[i] is row i on entry, column i
 * on return (pairs of 32-bit, then 64-bit, then 128-bit lanes swapped). */
static inline void tr16(__m512i v[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) { /* u[4q + m]: rows 4q..4q+3 of columns 4L + m, lane L */
        u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    for (int m = 0; m < 4; m++) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), x1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
        const __m512i x2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
        const __m512i x3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
        v[m] = _mm512_shuffle_i32x4(x0, x2, 0x88), v[4 + m] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
        v[8 + m] = _mm512_shuffle_i32x4(x1, x3, 0x88), v[12 + m] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
    }
}

/* Units u0..u0+15 of a table's 16 rows (pitch SP), unit i's rows in v[i]. */
static inline void tr16_load(const void *tab, int64_t pitch, int64_t u0, __m512i v[16]) {
    for (int r = 0; r < 16; r++) v[r] = _mm512_loadu_si512((const int32_t *)tab + r * pitch + u0);
    tr16(v);
}

/* Q8_0 / Q5_0, one row's blocks b0..b0+nj-1 (nj <= 8) against NC columns
 * (column c at x + c * xs): S + o X into S[c * ss + b0..] (o: 128, Q5_0 16), the f16 scales
 * into sc[16 b] (the [block][row] table). Each block is unpacked once. */
static inline __attribute__((always_inline)) void q8_chunk(int type, const int NC, const uint8_t *row,
                                                            const kvs_q8a_block *x, int64_t xs, int64_t b0, int nj,
                                                            int32_t *S, int64_t ss, uint16_t *sc) {
    const int bs = bsize(type);
    __m256i w[8], p[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        if (j >= nj) {
            w[j] = _mm256_setzero_si256();
            continue;
        }
        const uint8_t *blk = row + (b0 + j) * bs;
        w[j] = wblock_u(type, blk);
        memcpy(sc + (b0 + j) * 16, blk, 2);
    }
    for (int c = 0; c < NC; c++) {
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            p[j] = j < nj ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[j],
                                                _mm256_loadu_si256((const __m256i *)x[c * xs + b0 + j].q))
                          : _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)(S + c * ss + b0), sum8x8(p));
    }
}

/* One column, or two (NC; column c at x + c * xs, its outputs at out + c *
 * os): per group of 16 rows, each row in address order into tables of its
 * units' integer dots (one vpdpbusd per 32 values, 8 of them reduced
 * together; Q8_0 weights as w + 128, Q5_0 as w + 16, Q6_K as q in [0, 63]: the
 * tables hold S + o X) and their scales; then per 16 units the tables'
 * 16 x 16 squares transposed in registers, and per unit its 16 rows,
 * corrected by -o X, through the float steps in the lanes of one
 * accumulator. Two columns share each block's unpacking and the scales;
 * each column's integers and float steps are those of one column alone.
 * Reading a row at a time keeps the hardware's stream prefetch on (block b
 * of 16 rows at a time measured 3x slower from memory; vector gathers
 * instead of the transposes, 2x slower). Q6_K's table keeps the tree's
 * order: within a superblock, group 2k + h of block k at 8 (k / 4) + 4 h +
 * k % 4. */
static inline __attribute__((always_inline)) void rows_one(const int type, const int NC, const uint8_t *rows,
                                                            size_t rb, int64_t nrows, const kvs_q8a_block *x,
                                                            int64_t xs, int64_t n, float *out, int64_t os) {
    enum { SP = KVS_BS_NMAX / 16 + 16, SS = 16 * SP }; /* the tables' row pitch (entries; 16 to spare), size */
    const int64_t nb = n / 32, ng = nrows / 16 * 16;
    const int k4 = type == KVS_GGML_Q4_K, q6 = type == KVS_GGML_Q6_K;
    const int64_t nu = q6 ? n / 16 : nb;
    const int o = wofs(type); /* Q8_0 / Q5_0: the tables hold S + o X */
    _Alignas(64) int32_t st[2 * SS];
    _Alignas(64) float dwt[16 * SP], dmt[16 * SP];
    _Alignas(64) uint16_t sc16[KVS_BS_NMAX / 32 * 16]; /* Q8_0 / Q5_0 scales */
    for (int64_t g = 0; g < ng; g += 16) {
        const uint8_t *r0 = rows + (size_t)g * rb;
        for (int r = 0; r < 16; r++) {
            const uint8_t *row = r0 + (size_t)r * rb;
            int32_t *S = st + r * SP;
            if (g + 32 <= ng) /* the next group's row r: its lines in flight while this group's lanes pass runs */
                for (size_t l = 0; l < rb; l += 64) _mm_prefetch((const char *)(row + 16 * rb + l), _MM_HINT_T1);
            float *dw = dwt + r * SP;
            __m256i q[8], p[8];
            if (k4)
                for (int64_t sb = 0; sb < n / 256; sb++) {
                    q4k_unpack(row + sb * 144, q, dw + sb * 8, dmt + r * SP + sb * 8);
                    for (int c = 0; c < NC; c++) {
                        #pragma GCC unroll 8
                        for (int j = 0; j < 8; j++)
                            p[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[j],
                                                       _mm256_loadu_si256((const __m256i *)x[c * xs + sb * 8 + j].q));
                        _mm256_storeu_si256((__m256i *)(S + c * SS + sb * 8), sum8x8(p));
                    }
                }
            else if (q6)
                for (int64_t sb = 0; sb < n / 256; sb++) {
                    const uint8_t *blk = row + sb * 210;
                    q6k_unpack(blk, 0, q);
                    q6k_unpack(blk, 1, q + 4);
                    for (int c = 0; c < NC; c++) {
                        #pragma GCC unroll 8
                        for (int k = 0; k < 8; k++)
                            p[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[k],
                                                       _mm256_loadu_si256((const __m256i *)x[c * xs + sb * 8 + k].q));
                        for (int h = 0; h < 2; h++) /* lanes: the low groups of 4 blocks, then their high groups */
                            _mm256_storeu_si256((__m256i *)(S + c * SS + sb * 16 + 8 * h),
                                                _mm256_hadd_epi32(_mm256_hadd_epi32(p[4 * h], p[4 * h + 1]),
                                                                  _mm256_hadd_epi32(p[4 * h + 2], p[4 * h + 3])));
                    }
                    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
                    _mm512_storeu_ps(dw + sb * 16, _mm512_mul_ps(_mm512_set1_ps(h2f(blk + 208)), sc));
                }
            else {
                int64_t b0 = 0;
                for (; b0 + 8 <= nb; b0 += 8) q8_chunk(type, NC, row, x, xs, b0, 8, S, SS, sc16 + r);
                if (b0 < nb) q8_chunk(type, NC, row, x, xs, b0, (int)(nb - b0), S, SS, sc16 + r);
            }
        }
        for (int c = 0; c < NC; c++) {
            const kvs_q8a_block *xc = x + c * xs;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t u0 = 0; u0 < nu; u0 += 16) {
                __m512i S[16], W[16], M[16];
                tr16_load(st + c * SS, SP, u0, S);
                if (k4 || q6) tr16_load(dwt, SP, u0, W);
                if (k4) tr16_load(dmt, SP, u0, M);
                const int un = nu - u0 < 16 ? (int)(nu - u0) : 16;
                for (int i = 0; i < un; i++) {
                    const int64_t u = u0 + i;
                    if (q6) { /* u0 is a superblock's first group */
                        const int k = i / 2, h = i % 2;
                        const kvs_q8a_block *xb = &xc[u0 / 2 + k];
                        const __m512i Si = _mm512_add_epi32(S[8 * (k / 4) + 4 * h + k % 4],
                                                            _mm512_set1_epi32(-32 * xb->sum16[h]));
                        acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_castsi512_ps(W[i]), _mm512_set1_ps(xb->d)),
                                              _mm512_cvtepi32_ps(Si), acc);
                    } else if (k4) {
                        acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_castsi512_ps(W[i]), _mm512_set1_ps(xc[u].d)),
                                              _mm512_cvtepi32_ps(S[i]), acc);
                        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(M[i]), _mm512_set1_ps(x_sum(&xc[u])), acc);
                    } else {
                        const __m512i Si =
                            _mm512_add_epi32(S[i], _mm512_set1_epi32(-o * (xc[u].sum16[0] + xc[u].sum16[1])));
                        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc16 + u * 16)));
                        acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xc[u].d)), _mm512_cvtepi32_ps(Si), acc);
                    }
                }
            }
            _mm512_storeu_ps(out + c * os + g, acc);
        }
    }
    for (int64_t r = ng; r < nrows; r++)
        for (int c = 0; c < NC; c++) out[c * os + r] = bs_one_row(type, rows + (size_t)r * rb, x + c * xs, n);
}

/* One instance per (type, column count): the type's tests fold away in the
 * inner loops (same operations, fewer branches), and profiles show each
 * type apart. */
#define KVS_ONE_INSTANCE(NAME, TYPE, NC)                                                                       \
    static __attribute__((noinline)) void NAME(const uint8_t *rows, size_t rb, int64_t nrows,                 \
                                               const kvs_q8a_block *x, int64_t xs, int64_t n, float *out,     \
                                               int64_t os) {                                                  \
        rows_one(TYPE, NC, rows, rb, nrows, x, xs, n, out, os);                                               \
    }
KVS_ONE_INSTANCE(one_q8_0, KVS_GGML_Q8_0, 1)
KVS_ONE_INSTANCE(one_q5_0, KVS_GGML_Q5_0, 1)
KVS_ONE_INSTANCE(one_q4_k, KVS_GGML_Q4_K, 1)
KVS_ONE_INSTANCE(one_q6_k, KVS_GGML_Q6_K, 1)
KVS_ONE_INSTANCE(two_q8_0, KVS_GGML_Q8_0, 2)
KVS_ONE_INSTANCE(two_q5_0, KVS_GGML_Q5_0, 2)
KVS_ONE_INSTANCE(two_q4_k, KVS_GGML_Q4_K, 2)
KVS_ONE_INSTANCE(two_q6_k, KVS_GGML_Q6_K, 2)
#undef KVS_ONE_INSTANCE

/* ncols (1 or 2) columns, column c at x + c * xs, its outputs at out + c * os. */
static void vnni_rows_one(int type, int ncols, const uint8_t *rows, size_t rb, int64_t nrows,
                          const kvs_q8a_block *x, int64_t xs, int64_t n, float *out, int64_t os) {
    if (ncols == 1) {
        switch (type) {
        case KVS_GGML_Q8_0: one_q8_0(rows, rb, nrows, x, xs, n, out, os); break;
        case KVS_GGML_Q5_0: one_q5_0(rows, rb, nrows, x, xs, n, out, os); break;
        case KVS_GGML_Q4_K: one_q4_k(rows, rb, nrows, x, xs, n, out, os); break;
        default: one_q6_k(rows, rb, nrows, x, xs, n, out, os); break;
        }
        return;
    }
    switch (type) {
    case KVS_GGML_Q8_0: two_q8_0(rows, rb, nrows, x, xs, n, out, os); break;
    case KVS_GGML_Q5_0: two_q5_0(rows, rb, nrows, x, xs, n, out, os); break;
    case KVS_GGML_Q4_K: two_q4_k(rows, rb, nrows, x, xs, n, out, os); break;
    default: two_q6_k(rows, rb, nrows, x, xs, n, out, os); break;
    }
}

/* ---- VNNI, many columns ------------------------------------------------------------ */

/* Eight rows of a group's panel (row r at w0 + r * n; their scales dw[u *
 * 16 + r], Q4_K's negated mins dm[...]) against at most 8 columns: lanes 0-7
 * of the first tile's packing, in 256-bit vectors, each lane through the
 * operations of a lane of the 512-bit loop below (so the bits are those of
 * one column alone). Prefetches pn bytes from pf, pu a unit. */
static inline __attribute__((always_inline)) void cols8_half(int k4, int q6, int nk, int ul, int64_t nu,
                                                            const int8_t *w0, int64_t n, const int32_t *bp,
                                                            const float *dxt, const float *sxt, const int32_t *cxt,
                                                            const float *dwh, const float *dmh, const char *pf,
                                                            int64_t pn, int64_t pu, int ncols, float *out,
                                                            int64_t os) {
    __m256 acc[8];
    _Alignas(32) float yt[8 * 8];
    #pragma GCC unroll 8
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nu; u++) {
        for (int64_t l = u * pu; l < (u + 1) * pu && l < pn; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
        const int64_t tb = q6 ? u / 2 : u;
        const int32_t *X = bp + tb * 128 + (q6 ? (u % 2) * 64 : 0);
        __m256i xk[8];
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            xk[k] = k < nk ? _mm256_load_si256((const __m256i *)(X + 16 * k)) : _mm256_setzero_si256();
        const __m256 dx = _mm256_load_ps(dxt + tb * 16);
        const __m256i cv = k4 ? _mm256_setzero_si256() : _mm256_load_si256((const __m256i *)(cxt + u * 16));
        const float *dw = dwh + u * 16, *dm = dmh + u * 16;
        #pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const int8_t *w = w0 + (size_t)r * n + u * ul;
            __m256i s = cv;
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                if (k >= nk) break;
                int32_t wk;
                memcpy(&wk, w + 4 * k, 4);
                s = _mm256_dpbusd_epi32(s, _mm256_set1_epi32(wk), xk[k]);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dw[r]), dx), _mm256_cvtepi32_ps(s), acc[r]);
            if (k4) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dm[r]), _mm256_load_ps(sxt + tb * 16), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < 8; r++) _mm256_store_ps(yt + r * 8, acc[r]);
    for (int c = 0; c < ncols; c++)
        for (int r = 0; r < 8; r++) out[(int64_t)c * os + r] = yt[r * 8 + c];
}

/* Many columns: per pass, as many 16-column tiles as KVS_BS_BP bytes of packed activations
 * hold (bs_pack); per group of 16 rows, their weights once as unsigned bytes
 * in a panel with their scales, then per tile and half group (8 rows) the
 * rows' accumulators in registers, columns in the lanes, and per unit (a
 * block; Q6_K's group of 16) its activation vectors loaded once for the 8
 * rows. */
static inline __attribute__((always_inline)) void rows_cols(const int type, const uint8_t *rows, size_t rb,
                                                             int64_t nrows, const kvs_q8a_block *x, int64_t xs,
                                                             int ncols, int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32;
    const int bs = bsize(type), k4 = type == KVS_GGML_Q4_K, q6 = type == KVS_GGML_Q6_K;
    const int64_t nu = q6 ? 2 * nb : nb; /* units per row: blocks, or Q6_K's groups of 16 */
    const int nk = q6 ? 4 : 8, ul = q6 ? 16 : 32; /* 4-byte steps and values per unit */
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    _Alignas(64) int32_t bp[KVS_BS_BP / 4];
    _Alignas(64) float dxt[KVS_BS_BP / 32], sxt[KVS_BS_BP / 32]; /* scales, Q4_K's scaled sums */
    _Alignas(64) int32_t cxt[KVS_BS_BP / 16];                   /* -128 X (Q5_0: -16 X) per unit */
    _Alignas(64) float dwt[KVS_BS_NMAX / 16 * 16], dmt[KVS_BS_NMAX / 32 * 16]; /* per unit, per row */
    _Alignas(64) int8_t panel[16 * KVS_BS_NMAX];
    _Alignas(64) float yt[8 * 16];
    _Alignas(64) uint16_t sc16[KVS_BS_NMAX / 32 * 16]; /* Q8_0 / Q5_0 scales, [block][row] */
    const int64_t ng = nrows / 16 * 16;
    const int ntile = (ncols + 15) / 16;
    const int per = (int)(KVS_BS_BP / (nb * 512)); /* tiles per pass; >= 1 since nb <= 256 */
    assert(per >= 1);
    for (int t0 = 0; t0 < ntile; t0 += per) {
        const int tn = ntile - t0 < per ? ntile - t0 : per;
        bs_pack(q6, x, xs, ncols, t0, tn, nb, bp, dxt, sxt, k4 ? NULL : cxt, wofs(type));
        for (int64_t g = 0; g < ng; g += 16) {
            const uint8_t *r0 = rows + (size_t)g * rb;
            if (k4) q4k_prep(r0, rb, n, panel, dwt, dmt);
            else if (q6) q6k_prep(r0, rb, n, panel, dwt, flip);
            else { /* row by row in address order (16 interleaved streams stalled on memory); scales via f16 */
                for (int r = 0; r < 16; r++)
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = r0 + (size_t)r * rb + b * bs;
                        _mm256_storeu_si256((__m256i *)(panel + r * n + b * 32), wblock_u(type, blk));
                        memcpy(sc16 + b * 16 + r, blk, 2);
                    }
                for (int64_t b = 0; b < nb; b++)
                    _mm512_store_ps(dwt + b * 16, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc16 + b * 16))));
            }
            /* the next group's rows into L2 while this one's columns pass: spread over the first tile's units */
            const char *pf = (const char *)(r0 + 16 * rb);
            const int64_t pn = g + 32 <= nrows ? (int64_t)(16 * rb) : 0; /* bytes to prefetch */
            const int64_t pu = (pn + 64 * nu - 1) / (64 * nu) * 64;        /* per unit, whole lines */
            if (ncols <= 8) { /* one tile, half its lanes: 256-bit vectors (Zen 4 runs two a cycle, one 512-bit) */
                for (int h = 0; h < 2; h++)
                    cols8_half(k4, q6, nk, ul, nu, panel + (size_t)(8 * h) * n, n, bp, dxt, sxt, cxt,
                               dwt + 8 * h, dmt + 8 * h, pf, h == 0 ? pn : 0, pu, ncols, out + g + 8 * h, os);
                continue;
            }
            for (int t = 0; t < tn; t++)
                for (int h = 0; h < 2; h++) {
                    __m512 acc[8];
                    #pragma GCC unroll 8
                    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
                    const int8_t *w0 = panel + (size_t)(8 * h) * n;
                    for (int64_t u = 0; u < nu; u++) {
                        if (t == 0 && h == 0)
                            for (int64_t l = u * pu; l < (u + 1) * pu && l < pn; l += 64)
                                _mm_prefetch(pf + l, _MM_HINT_T1);
                        const int64_t tb = t * nb + (q6 ? u / 2 : u);
                        const int32_t *X = bp + tb * 128 + (q6 ? (u % 2) * 64 : 0); /* Q6_K: rows 4h..4h+3 */
                        __m512i xk[8];
                        #pragma GCC unroll 8
                        for (int k = 0; k < 8; k++)
                            xk[k] = k < nk ? _mm512_load_si512(X + 16 * k) : _mm512_setzero_si512();
                        const __m512 dx = _mm512_load_ps(dxt + tb * 16);
                        const __m512i cv = k4 ? _mm512_setzero_si512() : _mm512_load_si512(cxt + (t * nu + u) * 16);
                        const float *dw = dwt + u * 16 + 8 * h, *dm = dmt + u * 16 + 8 * h;
                        #pragma GCC unroll 8
                        for (int r = 0; r < 8; r++) {
                            const int8_t *w = w0 + (size_t)r * n + u * ul;
                            __m512i s = cv;
                            #pragma GCC unroll 8
                            for (int k = 0; k < 8; k++) {
                                if (k >= nk) break;
                                int32_t wk;
                                memcpy(&wk, w + 4 * k, 4);
                                s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(wk), xk[k]);
                            }
                            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dw[r]), dx), _mm512_cvtepi32_ps(s),
                                                     acc[r]);
                            if (k4)
                                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dm[r]), _mm512_load_ps(sxt + tb * 16), acc[r]);
                        }
                    }
                    #pragma GCC unroll 8
                    for (int r = 0; r < 8; r++) _mm512_store_ps(yt + r * 16, acc[r]);
                    const int c0 = (t0 + t) * 16, nc = ncols - c0 < 16 ? ncols - c0 : 16;
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < 8; r++) out[(int64_t)(c0 + c) * os + g + 8 * h + r] = yt[r * 16 + c];
                }
        }
    }
    for (int64_t r = ng; r < nrows; r++)
        for (int c = 0; c < ncols; c++)
            out[(int64_t)c * os + r] = bs_one_row(type, rows + (size_t)r * rb, x + (int64_t)c * xs, n);
}

/* One instance per type, as the one-column kernel. */
#define KVS_COLS_INSTANCE(NAME, TYPE)                                                                          \
    static __attribute__((noinline)) void NAME(const uint8_t *rows, size_t rb, int64_t nrows,                 \
                                               const kvs_q8a_block *x, int64_t xs, int ncols, int64_t n,      \
                                               float *out, int64_t os) {                                      \
        rows_cols(TYPE, rows, rb, nrows, x, xs, ncols, n, out, os);                                           \
    }
KVS_COLS_INSTANCE(cols_q8_0, KVS_GGML_Q8_0)
KVS_COLS_INSTANCE(cols_q5_0, KVS_GGML_Q5_0)
KVS_COLS_INSTANCE(cols_q4_k, KVS_GGML_Q4_K)
KVS_COLS_INSTANCE(cols_q6_k, KVS_GGML_Q6_K)
#undef KVS_COLS_INSTANCE

static void vnni_rows_cols(int type, const uint8_t *rows, size_t rb, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xs, int ncols, int64_t n, float *out, int64_t os) {
    switch (type) {
    case KVS_GGML_Q8_0: cols_q8_0(rows, rb, nrows, x, xs, ncols, n, out, os); break;
    case KVS_GGML_Q5_0: cols_q5_0(rows, rb, nrows, x, xs, ncols, n, out, os); break;
    case KVS_GGML_Q4_K: cols_q4_k(rows, rb, nrows, x, xs, ncols, n, out, os); break;
    default: cols_q6_k(rows, rb, nrows, x, xs, ncols, n, out, os); break;
    }
}

/* ---- entry points ------------------------------------------------------------------ */

void kvs_dot_q8a_rows_bs_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                              int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride) {
    assert(kvs_dot_bs_vnni_available() && n > 0 && n <= KVS_BS_NMAX);
    if (ncols <= 2) /* one or two columns: the one-column kernel (the panels cost more than a second column) */
        vnni_rows_one(type, ncols, rows, row_bytes, nrows, x, xstride, n, out, ostride);
    else
        vnni_rows_cols(type, rows, row_bytes, nrows, x, xstride, ncols, n, out, ostride);
}
