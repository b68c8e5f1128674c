/*
 * attn_internal.h -- what the two files of the CPU attention statistics
 * share (attention.c: log-sum-exp and column sums; attn_entropy.c: the
 * entropies and the one-pass statistics): the tile sizes, the 8-lane vector
 * helpers, the per-call context (shapes, fp32 keys) and per-thread scratch,
 * the row kernels of the fused passes (inline: they are the inner loops),
 * and the set-up and reduction steps both use.
 * Internal to core/; not part of the public API (kvsieve.h is the manual).
 */
#ifndef KVS_CORE_ATTN_INTERNAL_H
#define KVS_CORE_ATTN_INTERNAL_H

#include "kvsieve.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    TQ = 64,      /* query rows per tile, per query head (G >= 3) */
    TQ_MAX = 256, /* ... grown to 256 / G for G = 1, 2 so the GEMM has >= 128 rows */
    TK = 256,  /* keys per tile (multiple of VL) */
    NSLAB = 8, /* colsum: fixed row slabs per KV head (determinism) */
    FUSED_ROWS = 256,  /* fused colsum: stacked rows (G heads x rows) per logit buffer */
    VL = 8     /* vector lanes */
};

/* Logit written into masked (non-causal or padding) tile entries: exp of it
 * is exactly 0 and 0 * it is -0, so it never produces NaN. */
#define MASKED (-1.0e30f)

/* ------------------------------------------------------------------------ */
/* 8-lane vector helpers (GCC vector extensions)                             */
/* ------------------------------------------------------------------------ */

/* 32-byte vectors are AVX registers with -march=x86-64-v3 (the Release
 * flags); without AVX GCC lowers them to SSE pairs and warns that passing
 * them between functions would change the ABI. These helpers are static and
 * inlined, so there is no ABI to keep: silence that one warning here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v8_store(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline v8f v8_set1(float x) { return (v8f){x, x, x, x, x, x, x, x}; }
static inline v8i v8i_set1(int32_t x) { return (v8i){x, x, x, x, x, x, x, x}; }
/* m lanes are all-ones or zero: m ? a : b */
static inline v8f v8_select(v8i m, v8f a, v8f b) {
    return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}
static inline v8f v8_max(v8f a, v8f b) { return v8_select(a > b, a, b); }
static inline double v8_hsum(v8f v) {
    double s = 0.0;
    for (int i = 0; i < VL; i++) s += (double)v[i];
    return s;
}
static inline float v8_hmax(v8f v) {
    float m = v[0];
    for (int i = 1; i < VL; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* exp(x), relative error ~1e-7 for x in [-87, 88]; exactly 0 below -87.3,
 * x clamped at 88 above. Range reduction x = n ln2 + r, |r| <= ln2/2, a
 * degree-7 Taylor polynomial for exp(r), 2^n built in the exponent bits. */
static inline v8f v8_exp(v8f x) {
    const v8i under = x < v8_set1(-87.3f);
    x = v8_select(x > v8_set1(88.0f), v8_set1(88.0f), x);
    x = v8_select(under, v8_set1(-87.0f), x);
    const v8f magic = v8_set1(12582912.0f); /* 1.5 * 2^23: rounds to an integer */
    const v8f t = x * v8_set1(1.44269504088896341f) + magic;
    const v8f n = t - magic;
    v8f r = x - n * v8_set1(0.693145751953125f);
    r = r - n * v8_set1(1.428606765330187045e-06f);
    v8f p = v8_set1(1.0f / 5040.0f);
    p = p * r + v8_set1(1.0f / 720.0f);
    p = p * r + v8_set1(1.0f / 120.0f);
    p = p * r + v8_set1(1.0f / 24.0f);
    p = p * r + v8_set1(1.0f / 6.0f);
    p = p * r + v8_set1(0.5f);
    p = p * r + v8_set1(1.0f);
    p = p * r + v8_set1(1.0f);
    const v8i ni = (v8i)t - v8i_set1(0x4B400000); /* the integer n */
    const v8f scale = (v8f)((ni + v8i_set1(127)) << 23);
    return v8_select(under, v8_set1(0.0f), p * scale);
}

/* a * log(a) for a >= 0, 0 where a < 1e-37 (covers a == 0 and denormals).
 * log via a = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(u),
 * u = (m-1)/(m+1), odd series to u^9 (|u| <= 0.172: error < 1e-9). */
static inline v8f v8_xlogx(v8f a) {
    const v8i tiny = a < v8_set1(1.0e-37f);
    const v8f as = v8_select(tiny, v8_set1(1.0f), a);
    const v8i bits = (v8i)as;
    v8i e = ((bits >> 23) & v8i_set1(0xff)) - v8i_set1(127);
    v8f m = (v8f)((bits & v8i_set1(0x007fffff)) | v8i_set1(0x3f800000));
    const v8i big = m > v8_set1(1.41421356237f);
    m = v8_select(big, m * v8_set1(0.5f), m);
    e = e - big; /* big lanes are -1 */
    const v8f u = (m - v8_set1(1.0f)) / (m + v8_set1(1.0f));
    const v8f u2 = u * u;
    v8f p = v8_set1(1.0f / 9.0f);
    p = p * u2 + v8_set1(1.0f / 7.0f);
    p = p * u2 + v8_set1(1.0f / 5.0f);
    p = p * u2 + v8_set1(1.0f / 3.0f);
    p = p * u2 + v8_set1(1.0f);
    const v8f lg = __builtin_convertvector(e, v8f) * v8_set1(0.693147180559945309f) +
                   v8_set1(2.0f) * u * p;
    return v8_select(tiny, v8_set1(0.0f), as * lg);
}

typedef struct {
    const kvs_view *q;
    int Hq, Hkv, G, Nq, N, d;
    int off;     /* N - Nq: position of query row 0 */
    int tq;      /* query rows per block and head: TQ, or 256 / G for small G */
    int nb;      /* query row blocks of tq rows */
    float scale; /* 1 / sqrt(d) */
    const float *kf; /* K head g, token j: kf + g * kf_head + j * kf_tok */
    int64_t kf_head, kf_tok;
    float *kf_owned; /* [Hkv][N][d] fp32 copy when K is not usable as is */
    const kvs_view *k; /* the keys as given */
    int k_lazy;        /* kf == NULL: each unit converts its head's keys (fused path) */
} attn_ctx;

/* Rows in query block b. */
static inline int block_rows(const attn_ctx *c, int b) {
    const int left = c->Nq - b * c->tq;
    return left < c->tq ? left : c->tq;
}

/* Keys of the tile at j0 (width w) that row at position p may see. */
static inline int valid_keys(int p, int j0, int w) {
    int nv = p + 1 - j0;
    return nv < 0 ? 0 : (nv > w ? w : nv);
}

/* Set s[nv .. wp) to MASKED; wp = w rounded up to VL (<= TK). */
static inline void mask_tail(float *s, int nv, int wp) {
    for (int j = nv; j < wp; j++) s[j] = MASKED;
}

/* Per-thread scratch. */
typedef struct {
    float *qb;    /* [rows][d] query rows of the current unit */
    float *s;     /* [G*tq][TK] logits / probabilities of one tile */
    float *abar;  /* [tq][TK] head-averaged probabilities (entropies) */
    double *acc;  /* [4][rows] per-row accumulators */
} scratch;

/* One row of logits s[0 .. nv) (the causal keys; s[nv .. nv rounded up to
 * VL) is masked here): replaces them by e = exp(s - max) and returns
 * 1 / sum e, so p = e * the result (= exp(s - lse) up to rounding).
 * *lse = max + log(sum e); *ps = sum p s when want_ps (else 0). Sums run in
 * float over TK-key chunks and in double across chunks. */
static inline float fused_row(float *s, int nv, int want_ps, float *lse, double *ps) {
    const int nvp = (nv + VL - 1) / VL * VL;
    mask_tail(s, nv, nvp);
    v8f mx = v8_set1(MASKED);
    for (int j = 0; j < nvp; j += VL) mx = v8_max(mx, v8_load(s + j));
    const v8f mb = v8_set1(v8_hmax(mx));
    double l = 0.0, es = 0.0;
    for (int j0 = 0; j0 < nvp; j0 += TK) {
        const int je = j0 + TK < nvp ? j0 + TK : nvp;
        v8f sum = v8_set1(0.0f), sp = sum;
        if (want_ps) {
            for (int j = j0; j < je; j += VL) {
                const v8f sv = v8_load(s + j), e = v8_exp(sv - mb);
                v8_store(s + j, e);
                sum += e;
                sp += e * sv;
            }
            es += v8_hsum(sp);
        } else {
            for (int j = j0; j < je; j += VL) {
                const v8f e = v8_exp(v8_load(s + j) - mb);
                v8_store(s + j, e);
                sum += e;
            }
        }
        l += v8_hsum(sum);
    }
    *lse = (float)((double)mb[0] + log(l));
    *ps = es / l;
    return (float)(1.0 / l);
}

/* fused_row on row s of query head h, row i (index x = h * Nq + i): stores
 * lse[x] and, when row_entropy is non-NULL, row_entropy[x] = lse - sum p s;
 * returns 1 / sum e broadcast, so p = e * the result. */
static inline v8f fused_row_out(float *s, int nv, float *lse, float *row_entropy, size_t x) {
    float lf;
    double ps;
    const v8f il = v8_set1(fused_row(s, nv, row_entropy != NULL, &lf, &ps));
    lse[x] = lf;
    if (row_entropy) row_entropy[x] = (float)((double)lf - ps);
    return il;
}

/* ---- set-up and reduction (attention.c) ------------------------------------ */

/* lazy: leave fp16 / bf16 keys unconverted (c->k_lazy) for a caller that
 * decides later (kvs_attn_colsum_fused). */
kvs_status kvs_attn_ctx_init(attn_ctx *c, const kvs_view *q, const kvs_view *k, int wide, int lazy,
                             int threads, const char *fn, kvs_err *err);

void kvs_attn_ctx_free(attn_ctx *c);

/* Query rows [i0, i0+nr) of the G heads of group g, stacked: row hl*nr + r.
 * dst is [G*nr][d]. */
void kvs_attn_load_q_group(const attn_ctx *c, int g, int i0, int nr, float *dst);

/* s[M][TK] (row stride TK) = scale * qrows[M][d] . K[g][j0 .. j0+w)^T */
void kvs_attn_tile_logits(const attn_ctx *c, const float *qrows, int M, int g, int j0, int w,
                          float *s);

/* After a pass that wrote lse [Hq][Nq]: KVS_ERR_NUMERIC naming fn, the query
 * head and row of the first non-finite value (row-major order). */
kvs_status kvs_attn_lse_check_finite(const attn_ctx *c, const float *lse, const char *fn,
                                     kvs_err *err);

/* colsum [Hkv][N] = (1/G) * sum over slabs sl = 0 .. n_slab-1 (in that
 * order, in double) of acc[g * g_stride + sl * sl_stride + j]: the slab
 * partials of [Hkv][n_slab][N] (g_stride = n_slab N, sl_stride = N) or
 * [n_slab][Hkv][N] (g_stride = N, sl_stride = Hkv N) layouts alike. */
void kvs_attn_reduce_slabs(const attn_ctx *c, const double *acc, int n_slab, size_t g_stride,
                           size_t sl_stride, float *colsum);

void kvs_attn_scratch_free(scratch *sc, int n);

/* q_rows: rows of queries held at once; s_rows: rows of the logit tile. */
scratch *kvs_attn_scratch_alloc(int n, int q_rows, int s_rows, int d, int abar_rows);

/* Checks the lse input of pass 2. */
kvs_status kvs_attn_check_lse(const attn_ctx *c, const float *lse, const char *fn, kvs_err *err);

/* Fixed partition of the row blocks into n_slab slabs of about equal causal
 * work (depends on the shapes only, never on the thread count). */
int kvs_attn_make_slabs(const attn_ctx *c, int *b0);

/* Set-up the fused passes share: c->tq = rows per block and head so that
 * stacked_heads * tq <= FUSED_ROWS (at least 1), c->nb to match; *ld = the
 * row stride of the logit buffers (N rounded up to VL, plus VL); when *lse
 * is NULL, a [Hq][Nq] buffer goes to *lse and *lse_owned (the caller frees
 * *lse_owned, also on error). */
kvs_status kvs_attn_fused_setup(attn_ctx *c, int stacked_heads, int64_t *ld, float **lse,
                                float **lse_owned, const char *fn, kvs_err *err);

#endif
