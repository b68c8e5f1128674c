/*
 * attention.c -- attention statistics of one layer in O(N) memory per head:
 * the row log-sum-exp (kvs_attn_lse), the GQA-averaged column sums with
 * optional row entropies (kvs_attn_colsum), both from one pass over the
 * logits (kvs_attn_colsum_fused), the entropies of the head-averaged
 * attention, plain and MEDA cross-modal (kvs_attn_entropies), and all of
 * these from one pass (kvs_attn_stats_fused).
 *
 * What it is: the CPU reference of these statistics, the dominant cost of
 * H2O / LOOK-M / MEDA. Two-pass tiled log-sum-exp (spec/methods.md): pass 1
 * (kvs_attn_lse) runs an online max / sum over key tiles, pass 2 (colsum,
 * entropies) recomputes the logits tile by tile and accumulates
 * p = exp(s - lse). A tile is tq query rows of every query head of one GQA
 * group (stacked, so one K tile serves G heads) times TK keys; logits come
 * from cblas_sgemm on fp32 rows (K converted once per call unless it is
 * already fp32 with a usable stride), causal tiles beyond the last row's
 * position are skipped, the diagonal tile is masked per row. The exp / log
 * loops use GCC vector extensions (8 lanes) so they vectorise at -O2.
 *
 * Fused path (kvs_attn_colsum_fused): the same statistics from ONE GEMM per
 * row block instead of two: a block of up to FUSED_ROWS stacked rows (G heads
 * x tq rows) gets its logits against all causally visible keys into a
 * per-thread [rows][N] buffer (threads * max(FUSED_ROWS, G) * N * 4 bytes, O(N) per
 * thread, never N x N); each row then yields its exact max, e = exp(s - max)
 * (stored in place), lse = max + log(sum e) and p = e / sum e, accumulated
 * into the column sums in the same fixed slab order as the two-pass path.
 * kvs_attn_stats_fused holds the rows of ALL Hq heads per block (up to
 * FUSED_ROWS stacked rows) so it also gets the head-averaged entropies.
 *
 * Threads: kvs_parallel_run (parallel.c) hands out work units. Every result is
 * independent of the thread count: the lse and entropy units own disjoint
 * rows; colsum splits each KV head's rows into a FIXED number of slabs
 * (depending on the shapes only) with one [N] double accumulator each,
 * reduced in slab order at the end. OpenBLAS is set to one thread for the
 * duration of a call and restored afterwards (kvs_parallel_run does it).
 *
 * Decisions (to be listed in docs/methods.md): for the cross-modal entropies "image"
 * means the visual modalities KVS_MOD_IMAGE and KVS_MOD_VIDEO; audio rows and
 * keys take part in neither E_TV nor E_VT. A row whose eligible keys exist
 * but whose restricted mass underflows fp32 (sum of Abar over them == 0) is
 * skipped like a row without eligible keys.
 *
 * What it is not: no CUDA (kernels/ has the device path), no method logic,
 * no N x N buffer anywhere.
 */
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
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

/* ------------------------------------------------------------------------ */
/* Shared setup                                                              */
/* ------------------------------------------------------------------------ */

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

static int dtype_ok(kvs_dtype t) { return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16; }

static kvs_status check_view(const kvs_view *v, const char *fn, const char *what, kvs_err *err) {
    if (!v->data)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: %s has no data%s", fn, what,
                          what[0] == 'q' ? " (no queries recorded)" : "");
    if (v->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: %s is device memory; the CPU path needs host views (kernels/ has "
                          "the CUDA path)", fn, what);
    if (!dtype_ok(v->dtype))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: %s has dtype %s (need F32, F16 or BF16)", fn,
                          what, kvs_dtype_name(v->dtype));
    if (v->n_heads < 1 || v->head_dim < 1 || v->n_tokens < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: %s has shape [%d][%d][%d]", fn, what,
                          v->n_heads, v->n_tokens, v->head_dim);
    return KVS_OK;
}

/* fp16 / bf16 keys to fp32, one (KV head, KCONV_ROWS rows) unit each: on
 * the call's threads, since with small GQA groups (SnapKV's window on a
 * model without GQA) the conversion costs as much as the logits. */
enum { KCONV_ROWS = 1024, KCHUNK = 512 };
typedef struct {
    const kvs_view *k;
    float *dst; /* [Hkv][N][d] */
    int n_chunks;
} kconv_job;

static kvs_status kconv_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    (void)tid;
    const kconv_job *j = job;
    const int g = u / j->n_chunks, n0 = (u % j->n_chunks) * KCONV_ROWS;
    const int N = j->k->n_tokens, d = j->k->head_dim;
    const int rows = N - n0 < KCONV_ROWS ? N - n0 : KCONV_ROWS;
    kvs_view_rows_f32(j->k, g, n0, rows, j->dst + ((size_t)g * N + (size_t)n0) * d);
    return KVS_OK;
}

/* wide: grow the row block for small G (lse, colsum); entropies keep TQ
 * since one of its units holds the rows of all Hq heads. */
static kvs_status ctx_convert_k(attn_ctx *c, int threads, const char *fn, kvs_err *err);

/* lazy: leave fp16 / bf16 keys unconverted (c->k_lazy) for a caller that
 * decides later (kvs_attn_colsum_fused). */
static kvs_status ctx_init(attn_ctx *c, const kvs_view *q, const kvs_view *k, int wide, int lazy,
                           int threads, const char *fn, kvs_err *err) {
    memset(c, 0, sizeof *c);
    if (!q || !k) return kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL q or k view", fn);
    kvs_status st = check_view(q, fn, "q", err);
    if (st) return st;
    st = check_view(k, fn, "k", err);
    if (st) return st;
    if (k->n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: k has N = %d tokens (need >= 1)", fn,
                          k->n_tokens);
    if (q->head_dim != k->head_dim)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: head_dim of q (%d) and k (%d) differ", fn,
                          q->head_dim, k->head_dim);
    if (q->n_heads % k->n_heads != 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: Hq = %d query heads is not a multiple of Hkv = %d KV heads", fn,
                          q->n_heads, k->n_heads);
    if (q->n_tokens > k->n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: Nq = %d queries exceed N = %d keys", fn,
                          q->n_tokens, k->n_tokens);
    c->q = q;
    c->k = k;
    c->Hq = q->n_heads;
    c->Hkv = k->n_heads;
    c->G = c->Hq / c->Hkv;
    c->Nq = q->n_tokens;
    c->N = k->n_tokens;
    c->d = k->head_dim;
    c->off = c->N - c->Nq;
    c->tq = wide && c->G < 3 ? TQ_MAX / c->G : TQ;
    c->nb = (c->Nq + c->tq - 1) / c->tq;
    c->scale = (float)(1.0 / sqrt((double)c->d));
    if (k->dtype == KVS_F32 && k->s_tok >= k->head_dim && k->s_tok <= INT_MAX) {
        c->kf = (const float *)k->data;
        c->kf_head = k->s_head;
        c->kf_tok = k->s_tok;
        return KVS_OK;
    }
    if (lazy) {
        c->k_lazy = 1;
        return KVS_OK;
    }
    return ctx_convert_k(c, threads, fn, err);
}

/* Every KV head's keys to fp32 [Hkv][N][d] (c->kf_owned, freed by ctx_free). */
static kvs_status ctx_convert_k(attn_ctx *c, int threads, const char *fn, kvs_err *err) {
    const size_t nd = (size_t)c->N * (size_t)c->d;
    c->k_lazy = 0;
    c->kf_owned = malloc(sizeof(float) * nd * (size_t)c->Hkv); /* [Hkv][N][d] */
    if (!c->kf_owned)
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for the fp32 keys (%d heads x %d x %d)",
                          fn, c->Hkv, c->N, c->d);
    kconv_job kj = {c->k, c->kf_owned, (c->N + KCONV_ROWS - 1) / KCONV_ROWS};
    kvs_status st = kvs_parallel_run(&kj, kconv_unit, c->Hkv * kj.n_chunks, threads, fn, err);
    if (st) return st;
    c->kf = c->kf_owned;
    c->kf_head = (int64_t)nd;
    c->kf_tok = c->d;
    return KVS_OK;
}

static void ctx_free(attn_ctx *c) {
    free(c->kf_owned);
    c->kf_owned = NULL;
}

/* Rows in query block b. */
static inline int block_rows(const attn_ctx *c, int b) {
    const int left = c->Nq - b * c->tq;
    return left < c->tq ? left : c->tq;
}

/* Query rows [i0, i0+nr) of the G heads of group g, stacked: row hl*nr + r.
 * dst is [G*nr][d]. */
static void load_q_group(const attn_ctx *c, int g, int i0, int nr, float *dst) {
    for (int hl = 0; hl < c->G; hl++)
        kvs_view_rows_f32(c->q, g * c->G + hl, i0, nr, dst + (size_t)hl * nr * c->d);
}

/* s[M][TK] (row stride TK) = scale * qrows[M][d] . K[g][j0 .. j0+w)^T */
static void tile_logits(const attn_ctx *c, const float *qrows, int M, int g, int j0, int w,
                        float *s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, w, c->d, c->scale, qrows, c->d,
                c->kf + (int64_t)g * c->kf_head + (int64_t)j0 * c->kf_tok, (int)c->kf_tok, 0.0f,
                s, TK);
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

/* After a pass that wrote lse [Hq][Nq]: KVS_ERR_NUMERIC naming fn, the query
 * head and row of the first non-finite value (row-major order). */
static kvs_status lse_check_finite(const attn_ctx *c, const float *lse, const char *fn,
                                   kvs_err *err) {
    for (int h = 0; h < c->Hq; h++)
        for (int i = 0; i < c->Nq; i++)
            if (!isfinite(lse[(size_t)h * c->Nq + i]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "%s: log-sum-exp of query head %d row %d is not finite (NaN or "
                                  "Inf in q or k?)", fn, h, i);
    return KVS_OK;
}

/* colsum [Hkv][N] = (1/G) * sum over slabs sl = 0 .. n_slab-1 (in that
 * order, in double) of acc[g * g_stride + sl * sl_stride + j]: the slab
 * partials of [Hkv][n_slab][N] (g_stride = n_slab N, sl_stride = N) or
 * [n_slab][Hkv][N] (g_stride = N, sl_stride = Hkv N) layouts alike. */
static void reduce_slabs(const attn_ctx *c, const double *acc, int n_slab, size_t g_stride,
                         size_t sl_stride, float *colsum) {
    const double inv_g = 1.0 / c->G;
    for (int g = 0; g < c->Hkv; g++)
        for (int j = 0; j < c->N; j++) {
            double s = 0.0;
            for (int sl = 0; sl < n_slab; sl++)
                s += acc[(size_t)g * g_stride + (size_t)sl * sl_stride + j];
            colsum[(size_t)g * c->N + j] = (float)(s * inv_g);
        }
}

/* Per-thread scratch. */
typedef struct {
    float *qb;    /* [rows][d] query rows of the current unit */
    float *s;     /* [G*tq][TK] logits / probabilities of one tile */
    float *abar;  /* [tq][TK] head-averaged probabilities (entropies) */
    double *acc;  /* [4][rows] per-row accumulators */
} scratch;

static void scratch_free(scratch *sc, int n) {
    if (!sc) return;
    for (int t = 0; t < n; t++) {
        free(sc[t].qb);
        free(sc[t].s);
        free(sc[t].abar);
        free(sc[t].acc);
    }
    free(sc);
}

/* q_rows: rows of queries held at once; s_rows: rows of the logit tile. */
static scratch *scratch_alloc(int n, int q_rows, int s_rows, int d, int abar_rows) {
    scratch *sc = calloc((size_t)n, sizeof *sc);
    if (!sc) return NULL;
    for (int t = 0; t < n; t++) {
        sc[t].qb = malloc(sizeof(float) * (size_t)q_rows * (size_t)d);
        sc[t].s = malloc(sizeof(float) * (size_t)s_rows * TK);
        sc[t].acc = malloc(sizeof(double) * 4 * (size_t)q_rows);
        if (abar_rows) sc[t].abar = malloc(sizeof(float) * (size_t)abar_rows * TK);
        if (!sc[t].qb || !sc[t].s || !sc[t].acc || (abar_rows && !sc[t].abar)) {
            scratch_free(sc, n);
            return NULL;
        }
    }
    return sc;
}

/* ------------------------------------------------------------------------ */
/* Pass 1: row log-sum-exp                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    const attn_ctx *c;
    scratch *sc;
    float *lse; /* [Hq][Nq] */
} lse_job;

static kvs_status lse_unit(void *jp, int tid, int u, kvs_err *err) {
    (void)err;
    lse_job *J = jp;
    const attn_ctx *c = J->c;
    scratch *sc = &J->sc[tid];
    const int g = u / c->nb;
    const int b = c->nb - 1 - u % c->nb; /* longest rows first */
    const int i0 = b * c->tq, nr = block_rows(c, b), M = c->G * nr;
    const int pmax = c->off + i0 + nr - 1;
    double *m = sc->acc, *l = sc->acc + M; /* [M] running max, [M] running sum */
    load_q_group(c, g, i0, nr, sc->qb);
    for (int R = 0; R < M; R++) {
        m[R] = -INFINITY;
        l[R] = 0.0;
    }
    for (int j0 = 0; j0 <= pmax; j0 += TK) {
        const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
        const int wp = (w + VL - 1) / VL * VL;
        tile_logits(c, sc->qb, M, g, j0, w, sc->s);
        for (int R = 0; R < M; R++) {
            const int nv = valid_keys(c->off + i0 + R % nr, j0, w);
            if (nv == 0) continue;
            float *s = sc->s + (size_t)R * TK;
            mask_tail(s, nv, wp);
            v8f mx = v8_set1(MASKED);
            for (int j = 0; j < wp; j += VL) mx = v8_max(mx, v8_load(s + j));
            const float mt = v8_hmax(mx);
            const float mn = (double)mt > m[R] ? mt : (float)m[R];
            const v8f mb = v8_set1(mn);
            v8f sum = v8_set1(0.0f);
            for (int j = 0; j < wp; j += VL) sum += v8_exp(v8_load(s + j) - mb);
            l[R] = l[R] * exp(m[R] - (double)mn) + v8_hsum(sum);
            m[R] = mn;
        }
    }
    for (int R = 0; R < M; R++) {
        const int h = g * c->G + R / nr, r = R % nr;
        J->lse[(size_t)h * c->Nq + i0 + r] = (float)(m[R] + log(l[R]));
    }
    return KVS_OK;
}

kvs_status kvs_attn_lse(const kvs_view *q, const kvs_view *k, float *lse, int threads,
                        kvs_err *err) {
    static const char fn[] = "kvs_attn_lse";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    kvs_status st = ctx_init(&c, q, k, 1, 0, threads, fn, err);
    if (st) goto cleanup;
    if (!lse && c.Nq > 0) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL lse output", fn);
        goto cleanup;
    }
    if (c.Nq == 0) goto cleanup;
    const int n_units = c.Hkv * c.nb;
    nt = kvs_parallel_threads(threads, n_units);
    sc = scratch_alloc(nt, c.G * c.tq, c.G * c.tq, c.d, 0);
    if (!sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for tile scratch (%d threads)", fn, nt);
        goto cleanup;
    }
    lse_job J = {.c = &c, .sc = sc, .lse = lse};
    st = kvs_parallel_run(&J, lse_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    st = lse_check_finite(&c, lse, fn, err);
cleanup:
    scratch_free(sc, nt);
    ctx_free(&c);
    return st;
}

/* Checks the lse input of pass 2. */
static kvs_status check_lse(const attn_ctx *c, const float *lse, const char *fn, kvs_err *err) {
    if (!lse) return kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL lse (run kvs_attn_lse first)", fn);
    for (int h = 0; h < c->Hq; h++)
        for (int i = 0; i < c->Nq; i++)
            if (!isfinite(lse[(size_t)h * c->Nq + i]))
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: lse of query head %d row %d is not finite", fn, h, i);
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Pass 2a: column sums (+ row entropies)                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    const attn_ctx *c;
    scratch *sc;
    const float *lse; /* [Hq][Nq] */
    float *row_entropy; /* [Hq][Nq] or NULL */
    int n_slab;
    int slab_b0[NSLAB + 1]; /* slab s covers row blocks [slab_b0[s], slab_b0[s+1]) */
    double *acc;            /* [Hkv][n_slab][N] */
} colsum_job;

static kvs_status colsum_unit(void *jp, int tid, int u, kvs_err *err) {
    (void)err;
    colsum_job *J = jp;
    const attn_ctx *c = J->c;
    scratch *sc = &J->sc[tid];
    const int g = u / J->n_slab, sl = u % J->n_slab;
    double *acc = J->acc + ((size_t)g * J->n_slab + sl) * c->N; /* [N] */
    double *ps = sc->acc;                      /* [M] sum_j p s */
    double *lrow = sc->acc + (size_t)c->G * c->tq; /* [M] lse of the rows */
    const int ent = J->row_entropy != NULL;
    for (int b = J->slab_b0[sl]; b < J->slab_b0[sl + 1]; b++) {
        const int i0 = b * c->tq, nr = block_rows(c, b), M = c->G * nr;
        const int pmax = c->off + i0 + nr - 1;
        load_q_group(c, g, i0, nr, sc->qb);
        for (int R = 0; R < M; R++) {
            lrow[R] = J->lse[(size_t)(g * c->G + R / nr) * c->Nq + i0 + R % nr];
            ps[R] = 0.0;
        }
        for (int j0 = 0; j0 <= pmax; j0 += TK) {
            const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
            const int wp = (w + VL - 1) / VL * VL;
            v8f col[TK / VL];
            for (int v = 0; v < wp / VL; v++) col[v] = v8_set1(0.0f);
            tile_logits(c, sc->qb, M, g, j0, w, sc->s);
            for (int R = 0; R < M; R++) {
                const int nv = valid_keys(c->off + i0 + R % nr, j0, w);
                if (nv == 0) continue;
                float *s = sc->s + (size_t)R * TK;
                mask_tail(s, nv, wp);
                const v8f lb = v8_set1((float)lrow[R]);
                if (ent) {
                    v8f sp = v8_set1(0.0f);
                    for (int j = 0, v = 0; j < wp; j += VL, v++) {
                        const v8f sv = v8_load(s + j);
                        const v8f p = v8_exp(sv - lb);
                        col[v] += p;
                        sp += p * sv;
                    }
                    ps[R] += v8_hsum(sp);
                } else {
                    for (int j = 0, v = 0; j < wp; j += VL, v++) col[v] += v8_exp(v8_load(s + j) - lb);
                }
            }
            for (int v = 0; v < wp / VL; v++)
                for (int x = 0; x < VL && v * VL + x < w; x++) acc[j0 + v * VL + x] += (double)col[v][x];
        }
        if (ent)
            for (int R = 0; R < M; R++) {
                const int h = g * c->G + R / nr;
                J->row_entropy[(size_t)h * c->Nq + i0 + R % nr] = (float)(lrow[R] - ps[R]);
            }
    }
    return KVS_OK;
}

/* Output check of the column-sum passes: a NULL colsum is KVS_ERR_INVALID
 * naming fn; otherwise colsum [Hkv][N] is zeroed (the result when Nq = 0). */
static kvs_status colsum_begin(const attn_ctx *c, float *colsum, const char *fn, kvs_err *err) {
    if (!colsum) return kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL colsum output", fn);
    memset(colsum, 0, sizeof(float) * (size_t)c->Hkv * (size_t)c->N);
    return KVS_OK;
}

/* Fixed partition of the row blocks into n_slab slabs of about equal causal
 * work (depends on the shapes only, never on the thread count). */
static int make_slabs(const attn_ctx *c, int *b0) {
    const int ns = c->nb < NSLAB ? c->nb : NSLAB;
    double total = 0.0;
    for (int b = 0; b < c->nb; b++) {
        const int nr = block_rows(c, b);
        total += (double)nr * (double)(c->off + b * c->tq + nr);
    }
    double cum = 0.0;
    int s = 1;
    b0[0] = 0;
    for (int b = 0; b < c->nb && s < ns; b++) {
        const int nr = block_rows(c, b);
        cum += (double)nr * (double)(c->off + b * c->tq + nr);
        /* close slab s-1 after block b once its share is reached, keeping
         * at least one block for each remaining slab */
        const int left = c->nb - (b + 1);
        if ((cum >= total * s / ns && left >= ns - s) || left == ns - s) b0[s++] = b + 1;
    }
    assert(s == ns);
    b0[ns] = c->nb;
    for (int i = 0; i < ns; i++) assert(b0[i] < b0[i + 1]);
    return ns;
}

kvs_status kvs_attn_colsum(const kvs_view *q, const kvs_view *k, const float *lse,
                           float *colsum, float *row_entropy, int threads, kvs_err *err) {
    static const char fn[] = "kvs_attn_colsum";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    colsum_job J;
    memset(&J, 0, sizeof J);
    kvs_status st = ctx_init(&c, q, k, 1, 0, threads, fn, err);
    if (st) goto cleanup;
    st = colsum_begin(&c, colsum, fn, err);
    if (st || c.Nq == 0) goto cleanup;
    st = check_lse(&c, lse, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.n_slab = make_slabs(&c, J.slab_b0);
    J.acc = calloc((size_t)c.Hkv * (size_t)J.n_slab * (size_t)c.N, sizeof(double));
    const int n_units = c.Hkv * J.n_slab;
    nt = kvs_parallel_threads(threads, n_units);
    sc = scratch_alloc(nt, c.G * c.tq, c.G * c.tq, c.d, 0);
    if (!J.acc || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for accumulators (%d x %d x %d)", fn,
                        c.Hkv, J.n_slab, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, colsum_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    reduce_slabs(&c, J.acc, J.n_slab, (size_t)J.n_slab * c.N, (size_t)c.N, colsum);
cleanup:
    scratch_free(sc, nt);
    free(J.acc);
    ctx_free(&c);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Fused one-pass lse + column sums (+ row entropies)                        */
/* ------------------------------------------------------------------------ */

/* A unit is (KV head g, slab) as in colsum; each row block of the slab is
 * M = G * tq stacked rows. One GEMM writes the block's logits against all
 * keys up to the block's last position into a per-thread [M][ld] buffer
 * (ld = N rounded up to VL, plus VL so rows do not alias in the cache);
 * then each row, while it sits in L1/L2, gets its exact max and log-sum-exp
 * and its probabilities p = exp(s - lse), added to a per-thread float
 * column accumulator [ld] in row order R = 0 .. M-1 (the same order per key
 * as the two-pass colsum), which is added to the slab's double accumulator
 * after the block. Sums over keys run in float within TK-key chunks and in
 * double across chunks, like the two-pass path. */

typedef struct {
    const attn_ctx *c;
    scratch *sc;
    float *big;         /* [threads][M][ld] logit buffers */
    float *colf;        /* [threads][ld] float column accumulators of one block */
    int64_t ld;         /* row stride of big */
    float *lse;         /* [Hq][Nq] out */
    float *row_entropy; /* [Hq][Nq] or NULL */
    int n_slab;
    int slab_b0[NSLAB + 1];
    double *acc; /* [Hkv][n_slab][N] */
    float *kbuf; /* [threads][KCHUNK][d] fp32 keys being converted (lazy), or NULL */
} fused_job;

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

/* Set-up the fused passes share: c->tq = rows per block and head so that
 * stacked_heads * tq <= FUSED_ROWS (at least 1), c->nb to match; *ld = the
 * row stride of the logit buffers (N rounded up to VL, plus VL); when *lse
 * is NULL, a [Hq][Nq] buffer goes to *lse and *lse_owned (the caller frees
 * *lse_owned, also on error). */
static kvs_status fused_setup(attn_ctx *c, int stacked_heads, int64_t *ld, float **lse,
                              float **lse_owned, const char *fn, kvs_err *err) {
    c->tq = FUSED_ROWS / stacked_heads > 0 ? FUSED_ROWS / stacked_heads : 1;
    c->nb = (c->Nq + c->tq - 1) / c->tq;
    *ld = ((int64_t)c->N + VL - 1) / VL * VL + VL;
    if (!*lse) {
        *lse = *lse_owned = malloc(sizeof(float) * (size_t)c->Hq * (size_t)c->Nq);
        if (!*lse)
            return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for lse (%d heads x %d rows)", fn,
                              c->Hq, c->Nq);
    }
    return KVS_OK;
}

static kvs_status fused_unit(void *jp, int tid, int u, kvs_err *err) {
    (void)err;
    fused_job *J = jp;
    const attn_ctx *c = J->c;
    scratch *sc = &J->sc[tid];
    const int g = u / J->n_slab, sl = u % J->n_slab;
    const int64_t ld = J->ld;
    double *acc = J->acc + ((size_t)g * J->n_slab + sl) * c->N; /* [N] */
    float *buf = J->big + (size_t)tid * (size_t)(c->G * c->tq) * (size_t)ld; /* [M][ld] */
    float *col = J->colf + (size_t)tid * (size_t)ld;                         /* [ld] */
    float *kbuf = J->kbuf ? J->kbuf + (size_t)tid * KCHUNK * (size_t)c->d : NULL; /* [KCHUNK][d] */
    for (int b = J->slab_b0[sl]; b < J->slab_b0[sl + 1]; b++) {
        const int i0 = b * c->tq, nr = block_rows(c, b), M = c->G * nr;
        const int W = c->off + i0 + nr; /* keys 0 .. W-1 are visible to some row */
        const int Wp = (W + VL - 1) / VL * VL;
        assert(Wp <= ld);
        load_q_group(c, g, i0, nr, sc->qb);
        if (c->kf) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, W, c->d, c->scale, sc->qb, c->d,
                        c->kf + (int64_t)g * c->kf_head, (int)c->kf_tok, 0.0f, buf, (int)ld);
        } else { /* lazy keys (nb == 1: this is the head's only block) */
            for (int j0 = 0; j0 < W; j0 += KCHUNK) {
                const int w = W - j0 < KCHUNK ? W - j0 : KCHUNK;
                kvs_view_rows_f32(c->k, g, j0, w, kbuf);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, w, c->d, c->scale, sc->qb,
                            c->d, kbuf, c->d, 0.0f, buf + j0, (int)ld);
            }
        }
        memset(col, 0, sizeof(float) * (size_t)Wp);
        for (int R = 0; R < M; R++) {
            const int r = R % nr, h = g * c->G + R / nr;
            const int nv = c->off + i0 + r + 1; /* causal keys 0 .. p */
            const int nvp = (nv + VL - 1) / VL * VL;
            float *s = buf + (size_t)R * (size_t)ld; /* [ld] */
            const v8f il = fused_row_out(s, nv, J->lse, J->row_entropy, (size_t)h * c->Nq + i0 + r);
            for (int j = 0; j < nvp; j += VL) v8_store(col + j, v8_load(col + j) + v8_load(s + j) * il);
        }
        for (int j = 0; j < W; j++) acc[j] += (double)col[j];
    }
    return KVS_OK;
}

kvs_status kvs_attn_colsum_fused(const kvs_view *q, const kvs_view *k, float *lse, float *colsum,
                                 float *row_entropy, int threads, kvs_err *err) {
    static const char fn[] = "kvs_attn_colsum_fused";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    float *lse_owned = NULL; /* [Hq][Nq] when the caller passes lse = NULL */
    fused_job J;
    memset(&J, 0, sizeof J);
    kvs_status st = ctx_init(&c, q, k, 1, 1, threads, fn, err);
    if (st) goto cleanup;
    st = colsum_begin(&c, colsum, fn, err);
    if (st || c.Nq == 0) goto cleanup;
    /* rows per block and head: FUSED_ROWS stacked rows of the G heads of a group */
    st = fused_setup(&c, c.G, &J.ld, &lse, &lse_owned, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.n_slab = make_slabs(&c, J.slab_b0);
    const int n_units = c.Hkv * J.n_slab;
    nt = kvs_parallel_threads(threads, n_units);
    const size_t M = (size_t)c.G * (size_t)c.tq;
    /* fp16 / bf16 keys read by one block per KV head (SnapKV's window): the
     * unit converts them KCHUNK keys at a time into per-thread scratch that
     * stays in cache, instead of a fresh [Hkv][N][d] fp32 copy of the layer
     * (with a small GQA group that copy cost as much as the logits). */
    if (c.k_lazy && c.nb > 1) st = ctx_convert_k(&c, threads, fn, err);
    if (!st && c.k_lazy) {
        J.kbuf = malloc(sizeof(float) * (size_t)nt * KCHUNK * (size_t)c.d); /* [nt][KCHUNK][d] */
        if (!J.kbuf) st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for the fp32 keys", fn);
    }
    if (st) goto cleanup;
    J.acc = calloc((size_t)c.Hkv * (size_t)J.n_slab * (size_t)c.N, sizeof(double));
    J.big = malloc(sizeof(float) * (size_t)nt * M * (size_t)J.ld);    /* [nt][M][ld] */
    J.colf = malloc(sizeof(float) * (size_t)nt * (size_t)J.ld);       /* [nt][ld] */
    sc = scratch_alloc(nt, (int)M, 1, c.d, 0);
    if (!J.acc || !J.big || !J.colf || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM,
                        "%s: no memory for the logit buffers (%d threads x %d rows x %d keys)", fn,
                        nt, (int)M, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, fused_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    st = lse_check_finite(&c, lse, fn, err);
    if (st) goto cleanup;
    reduce_slabs(&c, J.acc, J.n_slab, (size_t)J.n_slab * c.N, (size_t)c.N, colsum);
cleanup:
    scratch_free(sc, nt);
    free(J.acc);
    free(J.big);
    free(J.colf);
    free(J.kbuf);
    free(lse_owned);
    ctx_free(&c);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Pass 2b: entropies of the head-averaged attention                         */
/* ------------------------------------------------------------------------ */

enum { ROW_NONE = 0, ROW_TV = 1, ROW_VT = 2 };

static int is_visual(uint8_t m) { return m == KVS_MOD_IMAGE || m == KVS_MOD_VIDEO; }

/* Prefix counts of visual and text keys: *nvis, *ntxt are [N+1] (malloc'd,
 * the caller frees them, also on error). Checks every modality value. */
static kvs_status modality_counts(const uint8_t *modality, int N, int32_t **nvis, int32_t **ntxt,
                                  const char *fn, kvs_err *err) {
    *nvis = malloc(sizeof(int32_t) * ((size_t)N + 1)); /* [N+1] */
    *ntxt = malloc(sizeof(int32_t) * ((size_t)N + 1)); /* [N+1] */
    if (!*nvis || !*ntxt)
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for modality counts (N = %d)", fn, N);
    int32_t *nv = *nvis, *nt = *ntxt;
    nv[0] = nt[0] = 0;
    for (int j = 0; j < N; j++) {
        if (modality[j] > KVS_MOD_AUDIO)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: modality of token %d is %d (not a KVS_MOD_*)",
                              fn, j, (int)modality[j]);
        nv[j + 1] = nv[j] + (is_visual(modality[j]) ? 1 : 0);
        nt[j + 1] = nt[j] + (modality[j] == KVS_MOD_TEXT ? 1 : 0);
    }
    return KVS_OK;
}

/* Modality inputs and per-row results of an entropy pass
 * (kvs_attn_entropies, kvs_attn_stats_fused). */
typedef struct {
    const uint8_t *modality; /* [N] or NULL */
    int32_t *n_vis;          /* [N+1] prefix counts of visual keys, or NULL */
    int32_t *n_txt;          /* [N+1] prefix counts of text keys, or NULL */
    double *h_plain;         /* [Nq] entropy of the Abar row */
    double *h_x;             /* [Nq] restricted entropy (when kind != NONE) */
    int8_t *kind;            /* [Nq] ROW_* */
} row_stats;

/* re must be zeroed. Sets re->modality and, when it is non-NULL, the prefix
 * counts (modality_counts: its errors, naming fn). row_stats_free frees
 * what was allocated, also after a failure. */
static kvs_status row_stats_init(row_stats *re, const attn_ctx *c, const uint8_t *modality,
                                 const char *fn, kvs_err *err) {
    re->modality = modality;
    if (!modality) return KVS_OK;
    return modality_counts(modality, c->N, &re->n_vis, &re->n_txt, fn, err);
}

/* Allocates the [Nq] results; 0 when out of memory (the caller reports). */
static int row_stats_alloc(row_stats *re, int Nq) {
    re->h_plain = malloc(sizeof(double) * (size_t)Nq); /* [Nq] */
    re->h_x = malloc(sizeof(double) * (size_t)Nq);     /* [Nq] */
    re->kind = malloc((size_t)Nq);                     /* [Nq] */
    return re->h_plain && re->h_x && re->kind;
}

static void row_stats_free(row_stats *re) {
    free(re->h_plain);
    free(re->h_x);
    free(re->kind);
    free(re->n_vis);
    free(re->n_txt);
}

/* Kind of query row at position p (ROW_*), from the prefix counts. */
static int8_t row_kind(const row_stats *re, int p) {
    if (!re->modality) return ROW_NONE;
    const uint8_t qm = re->modality[p];
    if (qm == KVS_MOD_TEXT && re->n_vis[p + 1] > 0) return ROW_TV;
    if (is_visual(qm) && re->n_txt[p + 1] > 0) return ROW_VT;
    return ROW_NONE;
}

/* Start of the entropy passes, after the NULL check of out: zeroes *out;
 * Nq = 0 is KVS_ERR_INVALID naming fn (the mean entropy is undefined). */
static kvs_status ent_begin(const attn_ctx *c, kvs_entropy_stats *out, const char *fn,
                            kvs_err *err) {
    memset(out, 0, sizeof *out);
    if (c->Nq == 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: no query rows (Nq = 0): mean entropy undefined", fn);
    return KVS_OK;
}

/* Means over rows in row order (independent of the thread count). */
static kvs_status ent_reduce(const row_stats *re, int Nq, kvs_entropy_stats *out, const char *fn,
                             kvs_err *err) {
    const double *h_plain = re->h_plain, *h_x = re->h_x;
    const int8_t *kind = re->kind;
    double sp = 0.0, stv = 0.0, svt = 0.0;
    for (int i = 0; i < Nq; i++) {
        sp += h_plain[i];
        if (kind[i] == ROW_TV) {
            stv += h_x[i];
            out->n_tv++;
        } else if (kind[i] == ROW_VT) {
            svt += h_x[i];
            out->n_vt++;
        }
    }
    out->plain = sp / Nq;
    out->e_tv = out->n_tv ? stv / (double)out->n_tv : 0.0;
    out->e_vt = out->n_vt ? svt / (double)out->n_vt : 0.0;
    if (!isfinite(out->plain) || !isfinite(out->e_tv) || !isfinite(out->e_vt))
        return kvs_errorf(err, KVS_ERR_NUMERIC, "%s: entropy is not finite (NaN or Inf in q or k?)",
                          fn);
    return KVS_OK;
}

/* Finishes query row i from its sums over the keys of a = Abar: zp = sum a,
 * tp = sum a log a (all keys), zx, tx the same over the keys the row's kind
 * makes eligible, into re: h_plain[i] = entropy of a / zp = log zp - tp / zp;
 * kind[i] = kind, or ROW_NONE when the restricted mass zx underflowed
 * to 0; h_x[i] = log zx - tx / zx for a cross-modal row, else 0. */
static void row_entropy_out(double zp, double tp, double zx, double tx, int8_t kind, int i,
                            row_stats *re) {
    re->h_plain[i] = log(zp) - tp / zp;
    if (kind != ROW_NONE && !(zx > 0.0)) kind = ROW_NONE; /* restricted mass underflowed */
    re->kind[i] = kind;
    re->h_x[i] = kind != ROW_NONE ? log(zx) - tx / zx : 0.0;
}

typedef struct {
    const attn_ctx *c;
    scratch *sc;
    const float *lse;         /* [Hq][Nq] */
    row_stats re;
} ent_job;

static kvs_status ent_unit(void *jp, int tid, int u, kvs_err *err) {
    (void)err;
    ent_job *J = jp;
    const attn_ctx *c = J->c;
    scratch *sc = &J->sc[tid];
    const int b = c->nb - 1 - u;
    const int i0 = b * c->tq, nr = block_rows(c, b), GM = c->G * nr;
    const int pmax = c->off + i0 + nr - 1;
    double *zp = sc->acc, *tp = zp + nr, *zx = tp + nr, *tx = zx + nr; /* [nr] each */
    int8_t kind[TQ_MAX];
    for (int r = 0; r < nr; r++) {
        zp[r] = tp[r] = zx[r] = tx[r] = 0.0;
        kind[r] = row_kind(&J->re, c->off + i0 + r);
    }
    /* all Hq heads: group g's rows start at g * G * nr; [Hq*nr][d] */
    for (int g = 0; g < c->Hkv; g++) load_q_group(c, g, i0, nr, sc->qb + (size_t)g * GM * c->d);
    const v8f inv_hq = v8_set1((float)(1.0 / c->Hq));
    float kmv[TK], kmt[TK]; /* eligibility masks of the tile's keys: visual, text */
    for (int j0 = 0; j0 <= pmax; j0 += TK) {
        const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
        const int wp = (w + VL - 1) / VL * VL;
        for (size_t x = 0; x < (size_t)nr * TK; x++) sc->abar[x] = 0.0f;
        for (int g = 0; g < c->Hkv; g++) {
            tile_logits(c, sc->qb + (size_t)g * GM * c->d, GM, g, j0, w, sc->s);
            for (int R = 0; R < GM; R++) {
                const int r = R % nr, h = g * c->G + R / nr;
                const int nv = valid_keys(c->off + i0 + r, j0, w);
                if (nv == 0) continue;
                float *s = sc->s + (size_t)R * TK, *a = sc->abar + (size_t)r * TK;
                mask_tail(s, nv, wp);
                const v8f lb = v8_set1(J->lse[(size_t)h * c->Nq + i0 + r]);
                for (int j = 0; j < wp; j += VL) v8_store(a + j, v8_load(a + j) + v8_exp(v8_load(s + j) - lb));
            }
        }
        if (J->re.modality) {
            for (int j = 0; j < wp; j++) {
                const int ok = j < w;
                kmv[j] = ok && is_visual(J->re.modality[j0 + j]) ? 1.0f : 0.0f;
                kmt[j] = ok && J->re.modality[j0 + j] == KVS_MOD_TEXT ? 1.0f : 0.0f;
            }
        }
        for (int r = 0; r < nr; r++) {
            if (valid_keys(c->off + i0 + r, j0, w) == 0) continue;
            const float *a = sc->abar + (size_t)r * TK;
            const float *km = kind[r] == ROW_TV ? kmv : kmt;
            v8f vz = v8_set1(0.0f), vt = vz, vzx = vz, vtx = vz;
            for (int j = 0; j < wp; j += VL) {
                const v8f av = v8_load(a + j) * inv_hq;
                const v8f t = v8_xlogx(av);
                vz += av;
                vt += t;
                if (kind[r] != ROW_NONE) {
                    const v8f mk = v8_load(km + j);
                    vzx += av * mk;
                    vtx += t * mk;
                }
            }
            zp[r] += v8_hsum(vz);
            tp[r] += v8_hsum(vt);
            if (kind[r] != ROW_NONE) {
                zx[r] += v8_hsum(vzx);
                tx[r] += v8_hsum(vtx);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        row_entropy_out(zp[r], tp[r], zx[r], tx[r], kind[r], i0 + r, &J->re);
    return KVS_OK;
}

kvs_status kvs_attn_entropies(const kvs_view *q, const kvs_view *k, const float *lse,
                              const uint8_t *modality, kvs_entropy_stats *out, int threads,
                              kvs_err *err) {
    static const char fn[] = "kvs_attn_entropies";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    ent_job J;
    memset(&J, 0, sizeof J);
    kvs_status st = ctx_init(&c, q, k, 0, 0, threads, fn, err);
    if (st) goto cleanup;
    if (!out) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL output", fn);
        goto cleanup;
    }
    st = ent_begin(&c, out, fn, err);
    if (st) goto cleanup;
    st = check_lse(&c, lse, fn, err);
    if (st) goto cleanup;
    st = row_stats_init(&J.re, &c, modality, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    const int re_ok = row_stats_alloc(&J.re, c.Nq);
    nt = kvs_parallel_threads(threads, c.nb);
    sc = scratch_alloc(nt, c.Hq * c.tq, c.G * c.tq, c.d, c.tq);
    if (!re_ok || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for row statistics (Nq = %d)", fn, c.Nq);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, ent_unit, c.nb, nt, fn, err);
    if (st) goto cleanup;
    st = ent_reduce(&J.re, c.Nq, out, fn, err);
cleanup:
    scratch_free(sc, nt);
    row_stats_free(&J.re);
    ctx_free(&c);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Fused one-pass lse + column sums + entropies (everything MEDA needs)      */
/* ------------------------------------------------------------------------ */

/* A unit is one slab of row blocks; a row block is tq rows of ALL Hq heads
 * (Hq * tq <= FUSED_ROWS stacked rows, at least one row per head), so the
 * head-averaged attention of a row is at hand. Per KV group one GEMM fills
 * the group's G * nr rows of the per-thread [Hq * tq][ld] buffer; each row
 * becomes its probabilities in place (fused_row), added to the group's
 * float column accumulator in row order; then each query row's Abar over
 * the Hq heads (summed in head order, as kvs_attn_entropies does) gives the
 * plain and cross-modal entropy sums. */

typedef struct {
    const attn_ctx *c;
    scratch *sc;              /* qb: [G*tq][d] */
    float *big;               /* [threads][Hq*tq][ld] */
    float *colf;              /* [threads][ld] column accumulator, NULL without colsum */
    int64_t ld;
    float *lse;               /* [Hq][Nq] */
    float *row_entropy;       /* [Hq][Nq] or NULL */
    row_stats re;
    int n_slab;
    int slab_b0[NSLAB + 1];
    double *acc;              /* [n_slab][Hkv][N] or NULL */
} stats_job;

static kvs_status stats_unit(void *jp, int tid, int sl, kvs_err *err) {
    (void)err;
    stats_job *J = jp;
    const attn_ctx *c = J->c;
    scratch *sc = &J->sc[tid];
    const int64_t ld = J->ld;
    float *buf = J->big + (size_t)tid * (size_t)(c->Hq * c->tq) * (size_t)ld; /* [Hq*tq][ld] */
    float *col = J->colf ? J->colf + (size_t)tid * (size_t)ld : NULL;         /* [ld] */
    const v8f inv_hq = v8_set1((float)(1.0 / c->Hq));
    float kmv[TK], kmt[TK]; /* eligibility of a chunk's keys: visual, text */
    for (int b = J->slab_b0[sl]; b < J->slab_b0[sl + 1]; b++) {
        const int i0 = b * c->tq, nr = block_rows(c, b), GM = c->G * nr;
        const int W = c->off + i0 + nr; /* keys 0 .. W-1 are visible to some row */
        assert((W + VL - 1) / VL * VL <= ld);
        for (int g = 0; g < c->Hkv; g++) {
            float *gb = buf + (size_t)g * GM * (size_t)ld; /* [GM][ld]: rows of heads g*G .. */
            load_q_group(c, g, i0, nr, sc->qb);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GM, W, c->d, c->scale, sc->qb,
                        c->d, c->kf + (int64_t)g * c->kf_head, (int)c->kf_tok, 0.0f, gb, (int)ld);
            if (col) memset(col, 0, sizeof(float) * (size_t)((W + VL - 1) / VL * VL));
            for (int R = 0; R < GM; R++) {
                const int r = R % nr, h = g * c->G + R / nr;
                const int nv = c->off + i0 + r + 1, nvp = (nv + VL - 1) / VL * VL;
                float *s = gb + (size_t)R * (size_t)ld; /* [ld] */
                const v8f il =
                    fused_row_out(s, nv, J->lse, J->row_entropy, (size_t)h * c->Nq + i0 + r);
                for (int j = 0; j < nvp; j += VL) {
                    const v8f p = v8_load(s + j) * il;
                    v8_store(s + j, p);
                    if (col) v8_store(col + j, v8_load(col + j) + p);
                }
            }
            if (col) {
                double *acc = J->acc + ((size_t)sl * c->Hkv + g) * c->N; /* [N] */
                for (int j = 0; j < W; j++) acc[j] += (double)col[j];
            }
        }
        /* entropies of Abar = mean over the Hq heads; head h, row r is buf row h * nr + r */
        for (int r = 0; r < nr; r++) {
            const int p = c->off + i0 + r, nv = p + 1, nvp = (nv + VL - 1) / VL * VL;
            const int8_t kind = row_kind(&J->re, p);
            const float *km = kind == ROW_TV ? kmv : kmt;
            double zp = 0.0, tp = 0.0, zx = 0.0, tx = 0.0;
            for (int j0 = 0; j0 < nvp; j0 += TK) {
                const int je = j0 + TK < nvp ? j0 + TK : nvp;
                if (kind != ROW_NONE)
                    for (int j = j0; j < je; j++) {
                        const int ok = j < nv;
                        kmv[j - j0] = ok && is_visual(J->re.modality[j]) ? 1.0f : 0.0f;
                        kmt[j - j0] = ok && J->re.modality[j] == KVS_MOD_TEXT ? 1.0f : 0.0f;
                    }
                v8f vz = v8_set1(0.0f), vt = vz, vzx = vz, vtx = vz;
                for (int j = j0; j < je; j += VL) {
                    v8f a = v8_load(buf + (size_t)r * (size_t)ld + j);
                    for (int h = 1; h < c->Hq; h++) a += v8_load(buf + ((size_t)h * nr + r) * (size_t)ld + j);
                    const v8f av = a * inv_hq;
                    const v8f t = v8_xlogx(av);
                    vz += av;
                    vt += t;
                    if (kind != ROW_NONE) {
                        const v8f mk = v8_load(km + (j - j0));
                        vzx += av * mk;
                        vtx += t * mk;
                    }
                }
                zp += v8_hsum(vz);
                tp += v8_hsum(vt);
                if (kind != ROW_NONE) {
                    zx += v8_hsum(vzx);
                    tx += v8_hsum(vtx);
                }
            }
            row_entropy_out(zp, tp, zx, tx, kind, i0 + r, &J->re);
        }
    }
    return KVS_OK;
}

kvs_status kvs_attn_stats_fused(const kvs_view *q, const kvs_view *k, const uint8_t *modality,
                                float *lse, float *colsum, float *row_entropy,
                                kvs_entropy_stats *ent, int threads, kvs_err *err) {
    static const char fn[] = "kvs_attn_stats_fused";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    float *lse_owned = NULL; /* [Hq][Nq] when the caller passes lse = NULL */
    stats_job J;
    memset(&J, 0, sizeof J);
    kvs_status st = ctx_init(&c, q, k, 0, 0, threads, fn, err);
    if (st) goto cleanup;
    if (!ent) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL entropy output", fn);
        goto cleanup;
    }
    if (colsum) memset(colsum, 0, sizeof(float) * (size_t)c.Hkv * (size_t)c.N);
    st = ent_begin(&c, ent, fn, err);
    if (st) goto cleanup;
    st = row_stats_init(&J.re, &c, modality, fn, err);
    if (st) goto cleanup;
    /* rows per block and head: FUSED_ROWS stacked rows over all Hq heads */
    st = fused_setup(&c, c.Hq, &J.ld, &lse, &lse_owned, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.n_slab = make_slabs(&c, J.slab_b0);
    nt = kvs_parallel_threads(threads, J.n_slab);
    const size_t rows = (size_t)c.Hq * (size_t)c.tq;
    const int re_ok = row_stats_alloc(&J.re, c.Nq);
    J.big = malloc(sizeof(float) * (size_t)nt * rows * (size_t)J.ld); /* [nt][Hq*tq][ld] */
    if (colsum) {
        J.acc = calloc((size_t)J.n_slab * (size_t)c.Hkv * (size_t)c.N, sizeof(double));
        J.colf = malloc(sizeof(float) * (size_t)nt * (size_t)J.ld); /* [nt][ld] */
    }
    sc = scratch_alloc(nt, c.G * c.tq, 1, c.d, 0);
    if (!re_ok || !J.big || (colsum && (!J.acc || !J.colf)) || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM,
                        "%s: no memory for the logit buffers (%d threads x %d rows x %d keys)", fn,
                        nt, (int)rows, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, stats_unit, J.n_slab, nt, fn, err);
    if (st) goto cleanup;
    st = lse_check_finite(&c, lse, fn, err);
    if (st) goto cleanup;
    if (colsum) reduce_slabs(&c, J.acc, J.n_slab, (size_t)c.N, (size_t)c.Hkv * c.N, colsum);
    st = ent_reduce(&J.re, c.Nq, ent, fn, err);
cleanup:
    scratch_free(sc, nt);
    row_stats_free(&J.re);
    free(J.big);
    free(J.colf);
    free(J.acc);
    free(lse_owned);
    ctx_free(&c);
    return st;
}
