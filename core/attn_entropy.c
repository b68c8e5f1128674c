/*
 * attn_entropy.c -- the entropies of the head-averaged attention, plain and
 * cross-modal (kvs_attn_entropies, pass 2b after kvs_attn_lse), and
 * every statistic of kvs_attn_stats_fused from one pass over the logits
 * (lse, GQA-averaged column sums, row entropies and the head-averaged
 * entropies), for the CPU.
 *
 * What it is: the same tiling, thread split and determinism as attention.c
 * (whose header comment states them, with the cross-modal decisions); a
 * row's kind (text-to-visual, visual-to-text, none) comes from the modality
 * of its token and of the keys it sees. What it is not: no CUDA (kernels/),
 * no method logic, no N x N buffer.
 */
#include "attn_internal.h"
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* Means over rows in row order (independent of the thread count): row i's
 * entropies are hp[i * stride], hx[i * stride]. */
static kvs_status reduce_rows(const double *hp, const double *hx, size_t stride, const int8_t *kind,
                              int Nq, kvs_entropy_stats *out, const char *fn, kvs_err *err) {
    double sp = 0.0, stv = 0.0, svt = 0.0;
    for (int i = 0; i < Nq; i++) {
        sp += hp[i * stride];
        if (kind[i] == ROW_TV) {
            stv += hx[i * stride];
            out->n_tv++;
        } else if (kind[i] == ROW_VT) {
            svt += hx[i * stride];
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

static kvs_status ent_reduce(const row_stats *re, int Nq, kvs_entropy_stats *out, const char *fn,
                             kvs_err *err) {
    return reduce_rows(re->h_plain, re->h_x, 1, re->kind, Nq, out, fn, err);
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
    for (int g = 0; g < c->Hkv; g++) kvs_attn_load_q_group(c, g, i0, nr, sc->qb + (size_t)g * GM * c->d);
    const v8f inv_hq = v8_set1((float)(1.0 / c->Hq));
    float kmv[TK], kmt[TK]; /* eligibility masks of the tile's keys: visual, text */
    for (int j0 = 0; j0 <= pmax; j0 += TK) {
        const int w = pmax + 1 - j0 < TK ? pmax + 1 - j0 : TK;
        const int wp = (w + VL - 1) / VL * VL;
        for (size_t x = 0; x < (size_t)nr * TK; x++) sc->abar[x] = 0.0f;
        for (int g = 0; g < c->Hkv; g++) {
            kvs_attn_tile_logits(c, sc->qb + (size_t)g * GM * c->d, GM, g, j0, w, sc->s);
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
    kvs_status st = kvs_attn_ctx_init(&c, q, k, 0, 0, threads, fn, err);
    if (st) goto cleanup;
    if (!out) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL output", fn);
        goto cleanup;
    }
    st = ent_begin(&c, out, fn, err);
    if (st) goto cleanup;
    st = kvs_attn_check_lse(&c, lse, fn, err);
    if (st) goto cleanup;
    st = row_stats_init(&J.re, &c, modality, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    const int re_ok = row_stats_alloc(&J.re, c.Nq);
    nt = kvs_parallel_threads(threads, c.nb);
    sc = kvs_attn_scratch_alloc(nt, c.Hq * c.tq, c.G * c.tq, c.d, c.tq);
    if (!re_ok || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for row statistics (Nq = %d)", fn, c.Nq);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, ent_unit, c.nb, nt, fn, err);
    if (st) goto cleanup;
    st = ent_reduce(&J.re, c.Nq, out, fn, err);
cleanup:
    kvs_attn_scratch_free(sc, nt);
    row_stats_free(&J.re);
    kvs_attn_ctx_free(&c);
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
            kvs_attn_load_q_group(c, g, i0, nr, sc->qb);
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
    kvs_status st = kvs_attn_ctx_init(&c, q, k, 0, 0, threads, fn, err);
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
    st = kvs_attn_fused_setup(&c, c.Hq, &J.ld, &lse, &lse_owned, fn, err);
    if (st) goto cleanup;
    J.c = &c;
    J.lse = lse;
    J.row_entropy = row_entropy;
    J.n_slab = kvs_attn_make_slabs(&c, J.slab_b0);
    nt = kvs_parallel_threads(threads, J.n_slab);
    const size_t rows = (size_t)c.Hq * (size_t)c.tq;
    const int re_ok = row_stats_alloc(&J.re, c.Nq);
    J.big = malloc(sizeof(float) * (size_t)nt * rows * (size_t)J.ld); /* [nt][Hq*tq][ld] */
    if (colsum) {
        J.acc = calloc((size_t)J.n_slab * (size_t)c.Hkv * (size_t)c.N, sizeof(double));
        J.colf = malloc(sizeof(float) * (size_t)nt * (size_t)J.ld); /* [nt][ld] */
    }
    sc = kvs_attn_scratch_alloc(nt, c.G * c.tq, 1, c.d, 0);
    if (!re_ok || !J.big || (colsum && (!J.acc || !J.colf)) || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM,
                        "%s: no memory for the logit buffers (%d threads x %d rows x %d keys)", fn,
                        nt, (int)rows, c.N);
        goto cleanup;
    }
    J.sc = sc;
    st = kvs_parallel_run(&J, stats_unit, J.n_slab, nt, fn, err);
    if (st) goto cleanup;
    st = kvs_attn_lse_check_finite(&c, lse, fn, err);
    if (st) goto cleanup;
    if (colsum) kvs_attn_reduce_slabs(&c, J.acc, J.n_slab, (size_t)c.N, (size_t)c.Hkv * c.N, colsum);
    st = ent_reduce(&J.re, c.Nq, ent, fn, err);
cleanup:
    kvs_attn_scratch_free(sc, nt);
    row_stats_free(&J.re);
    free(J.big);
    free(J.colf);
    free(J.acc);
    free(lse_owned);
    kvs_attn_ctx_free(&c);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Given statistics: a producer's rows, a consumer's one entry point         */
/* ------------------------------------------------------------------------ */

void kvs_attn_row_entropy(const float *asum, int nv, int Hq, const uint8_t *modality, double h[2],
                          int8_t *kind) {
    const int p = nv - 1;
    int8_t kd = ROW_NONE;
    if (modality) {
        int vis = 0, txt = 0; /* keys 0 .. p of each kind (row_kind's prefix counts) */
        for (int j = 0; j <= p && !(vis && txt); j++) {
            vis |= is_visual(modality[j]);
            txt |= modality[j] == KVS_MOD_TEXT;
        }
        if (modality[p] == KVS_MOD_TEXT && vis) kd = ROW_TV;
        else if (is_visual(modality[p]) && txt) kd = ROW_VT;
    }
    const v8f inv = v8_set1((float)(1.0 / Hq));
    double zp = 0.0, tp = 0.0, zx = 0.0, tx = 0.0;
    float a[TK], km[TK]; /* a chunk of the row, zero-padded to VL; its keys' eligibility */
    /* float sums over TK-key chunks, double across them (as the passes above) */
    for (int j0 = 0; j0 < nv; j0 += TK) {
        const int w = nv - j0 < TK ? nv - j0 : TK, wp = (w + VL - 1) / VL * VL;
        memcpy(a, asum + j0, sizeof(float) * (size_t)w);
        for (int j = w; j < wp; j++) a[j] = 0.0f;
        if (kd != ROW_NONE)
            for (int j = 0; j < wp; j++)
                km[j] = j < w && (kd == ROW_TV ? is_visual(modality[j0 + j])
                                               : modality[j0 + j] == KVS_MOD_TEXT)
                            ? 1.0f
                            : 0.0f;
        v8f vz = v8_set1(0.0f), vt = vz, vzx = vz, vtx = vz;
        for (int j = 0; j < wp; j += VL) {
            const v8f av = v8_load(a + j) * inv, t = v8_xlogx(av);
            vz += av;
            vt += t;
            if (kd != ROW_NONE) {
                const v8f mk = v8_load(km + j);
                vzx += av * mk;
                vtx += t * mk;
            }
        }
        zp += v8_hsum(vz);
        tp += v8_hsum(vt);
        if (kd != ROW_NONE) {
            zx += v8_hsum(vzx);
            tx += v8_hsum(vtx);
        }
    }
    row_stats re = {0};
    re.h_plain = &h[0];
    re.h_x = &h[1];
    re.kind = kind;
    row_entropy_out(zp, tp, zx, tx, kd, 0, &re);
}

kvs_status kvs_attn_entropy_reduce(const double *h, const int8_t *kind, int Nq,
                                   kvs_entropy_stats *out, kvs_err *err) {
    static const char fn[] = "kvs_attn_entropy_reduce";
    if (!h || !kind || !out || Nq < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL input or no rows (Nq = %d)", fn, Nq);
    memset(out, 0, sizeof *out);
    return reduce_rows(h, h + 1, 2, kind, Nq, out, fn, err);
}

kvs_status kvs_layer_attn_stats(const kvs_layer *in, const uint8_t *modality, float *colsum,
                                kvs_entropy_stats *ent, int threads, int *given, kvs_err *err) {
    static const char fn[] = "kvs_layer_attn_stats";
    if (given) *given = 0;
    const int N = in->k.n_tokens, Hkv = in->k.n_heads;
    const int need_col = colsum && !in->attn_colsum, need_ent = ent && !in->attn_ent;
    if (colsum && in->attn_colsum) memcpy(colsum, in->attn_colsum, sizeof(float) * (size_t)Hkv * N);
    if (ent && in->attn_ent) *ent = *in->attn_ent;
    if (!need_col && !need_ent) {
        if (given) *given = 1;
        return KVS_OK;
    }
    if (!in->q.data || in->q.n_tokens != N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: needs the queries of all N=%d prompt positions but got Nq=%d", fn, N,
                          in->q.data ? in->q.n_tokens : 0);
    if (!need_ent)
        return kvs_attn_colsum_fused(&in->q, &in->k, NULL, colsum, NULL, threads, err);
    uint8_t *all_text = modality ? NULL : calloc((size_t)N, 1); /* KVS_MOD_TEXT == 0 */
    if (!modality && !all_text) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", fn);
    kvs_status st = kvs_attn_stats_fused(&in->q, &in->k, modality ? modality : all_text, NULL,
                                         need_col ? colsum : NULL, NULL, ent, threads, err);
    free(all_text);
    return st;
}
