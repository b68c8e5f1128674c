/*
 * attention.c -- attention statistics of one layer in O(N) memory per head:
 * the row log-sum-exp (kvs_attn_lse), the GQA-averaged column sums with
 * optional row entropies (kvs_attn_colsum), both from one pass over the
 * logits (kvs_attn_colsum_fused), the entropies of the head-averaged
 * attention, plain and MEDA cross-modal (kvs_attn_entropies), and all of
 * these from one pass (kvs_attn_stats_fused), and the column sums with
 * weighted query rows (kvs_attn_colsum_fused_w); one row's softmax in
 * place for the parts' window statistics (kvs_attn_softmax_row). This file holds the shared
 * set-up, the log-sum-exp and the column sums; the entropies and the
 * one-pass statistics are in attn_entropy.c, the tile sizes, vector helpers
 * and context both use in attn_internal.h.
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
#include "attn_internal.h"
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Shared setup                                                              */
/* ------------------------------------------------------------------------ */

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
kvs_status kvs_attn_ctx_init(attn_ctx *c, const kvs_view *q, const kvs_view *k, int wide, int lazy,
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

void kvs_attn_ctx_free(attn_ctx *c) {
    free(c->kf_owned);
    c->kf_owned = NULL;
}

/* Query rows [i0, i0+nr) of the G heads of group g, stacked: row hl*nr + r.
 * dst is [G*nr][d]. */
void kvs_attn_load_q_group(const attn_ctx *c, int g, int i0, int nr, float *dst) {
    for (int hl = 0; hl < c->G; hl++)
        kvs_view_rows_f32(c->q, g * c->G + hl, i0, nr, dst + (size_t)hl * nr * c->d);
}

/* s[M][TK] (row stride TK) = scale * qrows[M][d] . K[g][j0 .. j0+w)^T */
void kvs_attn_tile_logits(const attn_ctx *c, const float *qrows, int M, int g, int j0, int w,
                          float *s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, w, c->d, c->scale, qrows, c->d,
                c->kf + (int64_t)g * c->kf_head + (int64_t)j0 * c->kf_tok, (int)c->kf_tok, 0.0f,
                s, TK);
}

/* After a pass that wrote lse [Hq][Nq]: KVS_ERR_NUMERIC naming fn, the query
 * head and row of the first non-finite value (row-major order). */
kvs_status kvs_attn_lse_check_finite(const attn_ctx *c, const float *lse, const char *fn,
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
void kvs_attn_reduce_slabs(const attn_ctx *c, const double *acc, int n_slab, size_t g_stride,
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

void kvs_attn_scratch_free(scratch *sc, int n) {
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
scratch *kvs_attn_scratch_alloc(int n, int q_rows, int s_rows, int d, int abar_rows) {
    scratch *sc = calloc((size_t)n, sizeof *sc);
    if (!sc) return NULL;
    for (int t = 0; t < n; t++) {
        sc[t].qb = malloc(sizeof(float) * (size_t)q_rows * (size_t)d);
        sc[t].s = malloc(sizeof(float) * (size_t)s_rows * TK);
        sc[t].acc = malloc(sizeof(double) * 4 * (size_t)q_rows);
        if (abar_rows) sc[t].abar = malloc(sizeof(float) * (size_t)abar_rows * TK);
        if (!sc[t].qb || !sc[t].s || !sc[t].acc || (abar_rows && !sc[t].abar)) {
            kvs_attn_scratch_free(sc, n);
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
    kvs_attn_load_q_group(c, g, i0, nr, sc->qb);
    for (int R = 0; R < M; R++) {
        m[R] = -INFINITY;
        l[R] = 0.0;
    }
    for (int j0 = 0; j0 <= pmax; j0 += TK) {
        const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
        const int wp = (w + VL - 1) / VL * VL;
        kvs_attn_tile_logits(c, sc->qb, M, g, j0, w, sc->s);
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
    kvs_status st = kvs_attn_ctx_init(&c, q, k, 1, 0, threads, fn, err);
    if (st) goto cleanup;
    if (!lse && c.Nq > 0) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL lse output", fn);
        goto cleanup;
    }
    if (c.Nq == 0) goto cleanup;
    const int n_units = c.Hkv * c.nb;
    nt = kvs_parallel_threads(threads, n_units);
    sc = kvs_attn_scratch_alloc(nt, c.G * c.tq, c.G * c.tq, c.d, 0);
    if (!sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for tile scratch (%d threads)", fn, nt);
        goto cleanup;
    }
    lse_job J = {.c = &c, .sc = sc, .lse = lse};
    st = kvs_parallel_run(&J, lse_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    st = kvs_attn_lse_check_finite(&c, lse, fn, err);
cleanup:
    kvs_attn_scratch_free(sc, nt);
    kvs_attn_ctx_free(&c);
    return st;
}

/* Checks the lse input of pass 2. */
kvs_status kvs_attn_check_lse(const attn_ctx *c, const float *lse, const char *fn, kvs_err *err) {
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
        kvs_attn_load_q_group(c, g, i0, nr, sc->qb);
        for (int R = 0; R < M; R++) {
            lrow[R] = J->lse[(size_t)(g * c->G + R / nr) * c->Nq + i0 + R % nr];
            ps[R] = 0.0;
        }
        for (int j0 = 0; j0 <= pmax; j0 += TK) {
            const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
            const int wp = (w + VL - 1) / VL * VL;
            v8f col[TK / VL];
            for (int v = 0; v < wp / VL; v++) col[v] = v8_set1(0.0f);
            kvs_attn_tile_logits(c, sc->qb, M, g, j0, w, sc->s);
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
int kvs_attn_make_slabs(const attn_ctx *c, int *b0) {
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
    kvs_status st = kvs_attn_ctx_init(&c, q, k, 1, 0, threads, fn, err);
    if (st) goto cleanup;
    st = colsum_begin(&c, colsum, fn, err);
    if (st || c.Nq == 0) goto cleanup;
    st = kvs_attn_check_lse(&c, lse, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.n_slab = kvs_attn_make_slabs(&c, J.slab_b0);
    J.acc = calloc((size_t)c.Hkv * (size_t)J.n_slab * (size_t)c.N, sizeof(double));
    const int n_units = c.Hkv * J.n_slab;
    nt = kvs_parallel_threads(threads, n_units);
    sc = kvs_attn_scratch_alloc(nt, c.G * c.tq, c.G * c.tq, c.d, 0);
    if (!J.acc || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for accumulators (%d x %d x %d)", fn,
                        c.Hkv, J.n_slab, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, colsum_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    kvs_attn_reduce_slabs(&c, J.acc, J.n_slab, (size_t)J.n_slab * c.N, (size_t)c.N, colsum);
cleanup:
    kvs_attn_scratch_free(sc, nt);
    free(J.acc);
    kvs_attn_ctx_free(&c);
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
    const float *row_w; /* [Nq] weights of the query rows in the column sums, or NULL (all 1) */
} fused_job;

/* Set-up the fused passes share: c->tq = rows per block and head so that
 * stacked_heads * tq <= FUSED_ROWS (at least 1), c->nb to match; *ld = the
 * row stride of the logit buffers (N rounded up to VL, plus VL); when *lse
 * is NULL, a [Hq][Nq] buffer goes to *lse and *lse_owned (the caller frees
 * *lse_owned, also on error). */
kvs_status kvs_attn_fused_setup(attn_ctx *c, int stacked_heads, int64_t *ld, float **lse,
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
        kvs_attn_load_q_group(c, g, i0, nr, sc->qb);
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
            v8f il = fused_row_out(s, nv, J->lse, J->row_entropy, (size_t)h * c->Nq + i0 + r);
            if (J->row_w) il *= v8_set1(J->row_w[i0 + r]);
            for (int j = 0; j < nvp; j += VL) v8_store(col + j, v8_load(col + j) + v8_load(s + j) * il);
        }
        for (int j = 0; j < W; j++) acc[j] += (double)col[j];
    }
    return KVS_OK;
}

kvs_status kvs_attn_colsum_fused(const kvs_view *q, const kvs_view *k, float *lse, float *colsum,
                                 float *row_entropy, int threads, kvs_err *err) {
    return kvs_attn_colsum_fused_w(q, k, NULL, lse, colsum, row_entropy, threads, err);
}

kvs_status kvs_attn_colsum_fused_w(const kvs_view *q, const kvs_view *k, const float *row_w,
                                   float *lse, float *colsum, float *row_entropy, int threads,
                                   kvs_err *err) {
    const char *fn = row_w ? "kvs_attn_colsum_fused_w" : "kvs_attn_colsum_fused";
    attn_ctx c;
    scratch *sc = NULL;
    int nt = 0;
    float *lse_owned = NULL; /* [Hq][Nq] when the caller passes lse = NULL */
    fused_job J;
    memset(&J, 0, sizeof J);
    kvs_status st = kvs_attn_ctx_init(&c, q, k, 1, 1, threads, fn, err);
    if (st) goto cleanup;
    st = colsum_begin(&c, colsum, fn, err);
    if (st || c.Nq == 0) goto cleanup;
    /* rows per block and head: FUSED_ROWS stacked rows of the G heads of a group */
    st = kvs_attn_fused_setup(&c, c.G, &J.ld, &lse, &lse_owned, fn, err);
    if (st) goto cleanup;
    if (row_w)
        for (int i = 0; i < c.Nq; i++)
            if (!isfinite(row_w[i])) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "%s: row weight %d is not finite (%g)", fn, i,
                                (double)row_w[i]);
                goto cleanup;
            }
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.row_w = row_w;
    J.n_slab = kvs_attn_make_slabs(&c, J.slab_b0);
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
    sc = kvs_attn_scratch_alloc(nt, (int)M, 1, c.d, 0);
    if (!J.acc || !J.big || !J.colf || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM,
                        "%s: no memory for the logit buffers (%d threads x %d rows x %d keys)", fn,
                        nt, (int)M, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, fused_unit, n_units, nt, fn, err);
    if (st) goto cleanup;
    st = kvs_attn_lse_check_finite(&c, lse, fn, err);
    if (st) goto cleanup;
    kvs_attn_reduce_slabs(&c, J.acc, J.n_slab, (size_t)J.n_slab * c.N, (size_t)c.N, colsum);
cleanup:
    kvs_attn_scratch_free(sc, nt);
    free(J.acc);
    free(J.big);
    free(J.colf);
    free(J.kbuf);
    free(lse_owned);
    kvs_attn_ctx_free(&c);
    return st;
}

/* ------------------------------------------------------------------------ */
/* One row's softmax in place (window statistics of the parts)               */
/* ------------------------------------------------------------------------ */

float kvs_attn_softmax_row(float *s, int n, int m, double *plogp) {
    if (n < 1) {
        *plogp = 0.0;
        return -INFINITY;
    }
    const int nf = n / VL * VL; /* vector body; the tail one by one */
    v8f mx = v8_set1(MASKED);
    for (int j = 0; j < nf; j += VL) mx = v8_max(mx, v8_load(s + j));
    float mt = v8_hmax(mx);
    for (int j = nf; j < n; j++) mt = s[j] > mt ? s[j] : mt;
    const v8f mb = v8_set1(mt);
    /* z = sum e, and over j < m: se = sum e, set = sum e (s - max); float
     * lanes within TK-key chunks, double across chunks (as fused_row) */
    double z = 0.0, se = 0.0, set = 0.0;
    for (int j0 = 0; j0 < n; j0 += TK) {
        const int je = j0 + TK < n ? j0 + TK : n;
        v8f vz = v8_set1(0.0f), vs = vz, vt = vz;
        float tz = 0.0f, ts = 0.0f, tt = 0.0f;
        int j = j0;
        for (; j + VL <= je; j += VL) {
            const v8f t = v8_load(s + j) - mb, e = v8_exp(t);
            v8_store(s + j, e);
            vz += e;
            if (j + VL <= m) {
                vs += e;
                vt += e * t;
            } else if (j < m) {
                for (int x = 0; x < m - j; x++) ts += e[x], tt += e[x] * t[x];
            }
        }
        for (; j < je; j++) {
            const float t = s[j] - mt, e = expf(t);
            s[j] = e;
            tz += e;
            if (j < m) ts += e, tt += e * t;
        }
        z += v8_hsum(vz) + (double)tz;
        se += v8_hsum(vs) + (double)ts;
        set += v8_hsum(vt) + (double)tt;
    }
    const float inv = (float)(1.0 / z);
    const v8f vi = v8_set1(inv);
    for (int j = 0; j < nf; j += VL) v8_store(s + j, v8_load(s + j) * vi);
    for (int j = nf; j < n; j++) s[j] *= inv;
    const double lz = log(z);
    *plogp = set / z - lz * se / z; /* sum_{j<m} p (s - max - log z) */
    return (float)((double)mt + lz);
}

