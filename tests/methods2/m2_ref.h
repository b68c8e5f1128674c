/*
 * m2_ref.h -- test-only helpers for the h2o / lookm / meda tests: building
 * small fp32 caches, and an independent double-precision naive reference of
 * the three methods that MATERIALISES the N x N attention (allowed here, in
 * tests only, for N <= 64). Not used by the library.
 */
#ifndef M2_REF_H
#define M2_REF_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve.h"
#include "kvsieve_methods.h"
#include "test_util.h"

#define M2_NMAX 320 /* larger than core's key tile (256) so tile edges are crossed */

/* A small prompt cache owned by the test. */
typedef struct {
    int L, N, Hkv, Hq, d;
    float *k, *v, *q;  /* [L][Hkv][N][d], [L][Hkv][N][d], [L][Hq][N][d] */
    uint8_t *mod;      /* [N] or NULL */
    kvs_layer *layers; /* [L] */
    kvs_cache_view view;
} m2_cache;

static void m2_cache_alloc(m2_cache *c, int L, int N, int Hkv, int Hq, int d) {
    memset(c, 0, sizeof *c);
    c->L = L, c->N = N, c->Hkv = Hkv, c->Hq = Hq, c->d = d;
    c->k = calloc((size_t)L * Hkv * N * d, sizeof(float));
    c->v = calloc((size_t)L * Hkv * N * d, sizeof(float));
    c->q = calloc((size_t)L * Hq * N * d, sizeof(float));
    c->layers = calloc((size_t)L, sizeof(kvs_layer));
    assert(c->k && c->v && c->q && c->layers);
}

/* (Re)build the views; nq = number of query rows recorded (N for all, 0 for
 * none, the last nq rows otherwise). */
static void m2_cache_views(m2_cache *c, int nq) {
    const size_t kvl = (size_t)c->Hkv * c->N * c->d, ql = (size_t)c->Hq * c->N * c->d;
    for (int l = 0; l < c->L; l++) {
        c->layers[l].k = kvs_view_make(c->k + l * kvl, KVS_F32, c->Hkv, c->N, c->d);
        c->layers[l].v = kvs_view_make(c->v + l * kvl, KVS_F32, c->Hkv, c->N, c->d);
        if (nq > 0) {
            /* the last nq rows of each head: a strided view */
            kvs_view qv = kvs_view_make(c->q + l * ql, KVS_F32, c->Hq, c->N, c->d);
            qv.data = c->q + l * ql + (size_t)(c->N - nq) * c->d;
            qv.n_tokens = nq;
            c->layers[l].q = qv;
        } else {
            c->layers[l].q = kvs_view_make(NULL, KVS_F32, c->Hq, 0, c->d);
        }
    }
    c->view.n_layers = c->L;
    c->view.layers = c->layers;
    c->view.modality = c->mod;
}

static void m2_cache_free(m2_cache *c) {
    free(c->k), free(c->v), free(c->q), free(c->mod), free(c->layers);
    memset(c, 0, sizeof *c);
}

static float *m2_K(m2_cache *c, int l, int h, int n) {
    return c->k + (((size_t)l * c->Hkv + h) * c->N + n) * c->d;
}
static float *m2_V(m2_cache *c, int l, int h, int n) {
    return c->v + (((size_t)l * c->Hkv + h) * c->N + n) * c->d;
}
static float *m2_Q(m2_cache *c, int l, int h, int n) {
    return c->q + (((size_t)l * c->Hq + h) * c->N + n) * c->d;
}

/* Random cache: keys and queries ~ scale * N(0,1), with a few "heavy" keys
 * (sinks / outliers) so rankings are not flat. */
static void m2_cache_random(m2_cache *c, uint64_t *rng, double scale) {
    for (int l = 0; l < c->L; l++) {
        for (int h = 0; h < c->Hkv; h++)
            for (int n = 0; n < c->N; n++) {
                double boost = (kvs_rng_uniform(rng) < 0.1) ? 3.0 : 1.0;
                for (int e = 0; e < c->d; e++) {
                    m2_K(c, l, h, n)[e] = (float)(scale * boost * kvs_rng_normal(rng));
                    m2_V(c, l, h, n)[e] = (float)kvs_rng_normal(rng);
                }
            }
        for (int h = 0; h < c->Hq; h++)
            for (int n = 0; n < c->N; n++)
                for (int e = 0; e < c->d; e++)
                    m2_Q(c, l, h, n)[e] = (float)(scale * kvs_rng_normal(rng));
    }
}

/* Drive a method by hand (create / observe every layer / select / destroy),
 * bypassing kvs_compress, so the method's own guards are exercised. The
 * shape is taken from the cache; its Nq is shape_nq (< 0: layer 0's query
 * rows), so a test can make create pass and observe see fewer queries. */
static kvs_status m2_run_direct(const kvs_method *m, const kvs_params *p, m2_cache *c,
                                int shape_nq, int per_layer, kvs_plan *plan, kvs_err *err) {
    int nq = shape_nq >= 0 ? shape_nq : c->layers[0].q.data ? c->layers[0].q.n_tokens : 0;
    kvs_shape sh = {c->L, c->N, c->Hkv, c->Hq, c->d, nq, 1};
    void *state = NULL;
    kvs_status st = m->create(p, &sh, &state, err);
    if (st != KVS_OK) return st;
    for (int l = 0; l < c->L && st == KVS_OK; l++) st = m->observe(state, l, &c->layers[l], c->mod, err);
    if (st == KVS_OK) st = m->select(state, per_layer, plan, err);
    m->destroy(state);
    return st;
}

/* ---- naive reference (double, N x N materialised) ----------------------- */

typedef struct {
    double plain, e_tv, e_vt;
    long n_tv, n_vt;
} m2_ent;

/* Attention of one layer: A is [Hq][N][N] (row i: keys 0..i), full queries. */
static void m2_ref_attention(m2_cache *c, int l, double *A) {
    const int N = c->N, d = c->d, G = c->Hq / c->Hkv;
    for (int h = 0; h < c->Hq; h++)
        for (int i = 0; i < N; i++) {
            double *row = A + ((size_t)h * N + i) * N;
            double mx = -INFINITY;
            for (int j = 0; j < N; j++) {
                if (j > i) {
                    row[j] = 0;
                    continue;
                }
                double s = 0;
                for (int e = 0; e < d; e++)
                    s += (double)m2_Q(c, l, h, i)[e] * (double)m2_K(c, l, h / G, j)[e];
                row[j] = s / sqrt((double)d);
                if (row[j] > mx) mx = row[j];
            }
            double z = 0;
            for (int j = 0; j <= i; j++) z += (row[j] = exp(row[j] - mx));
            for (int j = 0; j <= i; j++) row[j] /= z;
        }
}

/* H2O scores [Hkv][N] (GQA mean of column sums), optional normalise, optional
 * text boost; entropies of the head-averaged attention. */
static void m2_ref_layer(m2_cache *c, int l, int normalize, int boost, double *sc, m2_ent *ent) {
    const int N = c->N, Hq = c->Hq, Hkv = c->Hkv, G = Hq / Hkv;
    assert(N <= M2_NMAX);
    double *A = malloc(sizeof(double) * (size_t)Hq * N * N); /* [Hq][N][N], test only */
    assert(A);
    m2_ref_attention(c, l, A);
    for (int g = 0; g < Hkv; g++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int h = g * G; h < (g + 1) * G; h++)
                for (int i = j; i < N; i++) s += A[((size_t)h * N + i) * N + j];
            s /= G;
            if (normalize) s /= (N - j);
            sc[(size_t)g * N + j] = s;
        }
    if (boost)
        for (int g = 0; g < Hkv; g++) {
            double mx = -INFINITY;
            for (int j = 0; j < N; j++) mx = fmax(mx, sc[(size_t)g * N + j]);
            for (int j = 0; j < N; j++)
                if (!c->mod || c->mod[j] == KVS_MOD_TEXT) sc[(size_t)g * N + j] += mx;
        }
    if (ent) {
        memset(ent, 0, sizeof *ent);
        double abar[M2_NMAX];
        double tv = 0, vt = 0;
        for (int i = 0; i < N; i++) {
            for (int j = 0; j < N; j++) {
                abar[j] = 0;
                for (int h = 0; h < Hq; h++) abar[j] += A[((size_t)h * N + i) * N + j];
                abar[j] /= Hq;
            }
            double H = 0;
            for (int j = 0; j <= i; j++)
                if (abar[j] > 0) H -= abar[j] * log(abar[j]);
            ent->plain += H / N;
            int mi = c->mod ? c->mod[i] : KVS_MOD_TEXT;
            int want = mi == KVS_MOD_TEXT ? KVS_MOD_IMAGE : mi == KVS_MOD_IMAGE ? KVS_MOD_TEXT : -1;
            if (want < 0) continue;
            double z = 0;
            int any = 0;
            for (int j = 0; j <= i; j++)
                if ((c->mod ? c->mod[j] : KVS_MOD_TEXT) == want) z += abar[j], any = 1;
            if (!any) continue;
            double Hr = 0;
            for (int j = 0; j <= i; j++)
                if ((c->mod ? c->mod[j] : KVS_MOD_TEXT) == want && abar[j] > 0) {
                    double p = abar[j] / z;
                    Hr -= p * log(p);
                }
            if (mi == KVS_MOD_TEXT) tv += Hr, ent->n_tv++;
            else vt += Hr, ent->n_vt++;
        }
        ent->e_tv = ent->n_tv ? tv / ent->n_tv : 0;
        ent->e_vt = ent->n_vt ? vt / ent->n_vt : 0;
    }
    free(A);
}

/* Reference selection for one head: last r, plus the top B - r of [0, N - r)
 * by score (ties: lower index), ascending. out is [B]. */
static void m2_ref_select(const double *sc, int N, int B, int r, int32_t *out) {
    if (B >= N) {
        for (int j = 0; j < N; j++) out[j] = j;
        return;
    }
    int n_rest = N - r, k = B - r;
    char taken[M2_NMAX] = {0};
    for (int t = 0; t < k; t++) {
        int best = -1;
        for (int j = 0; j < n_rest; j++)
            if (!taken[j] && (best < 0 || sc[j] > sc[best])) best = j;
        taken[best] = 1;
    }
    int o = 0;
    for (int j = 0; j < n_rest; j++)
        if (taken[j]) out[o++] = j;
    for (int j = n_rest; j < N; j++) out[o++] = j;
    assert(o == B);
}

/* Compare a method's head selection with the reference. Exact match -> 1.
 * Otherwise the method's choice must still be optimal up to `tol` (relative
 * to the largest |score|): the recent window kept, and no evicted candidate
 * scoring more than tol above a kept one -> 0 (a near tie). Violations are
 * reported as CHECK failures. */
static int m2_compare_head(const double *sc, int N, int B, int r, const int32_t *got,
                           double tol, const char *what, int l, int g) {
    int32_t ref[M2_NMAX];
    m2_ref_select(sc, N, B, r, ref);
    if (memcmp(ref, got, sizeof(int32_t) * (size_t)B) == 0) return 1;
    char kept[M2_NMAX] = {0};
    for (int i = 0; i < B; i++) kept[got[i]] = 1;
    double smax = 0;
    for (int j = 0; j < N; j++) smax = fmax(smax, fabs(sc[j]));
    double min_kept = INFINITY, max_evicted = -INFINITY;
    int recent_ok = 1;
    for (int j = N - r; j < N; j++) recent_ok &= kept[j];
    for (int j = 0; j < N - r; j++) {
        if (kept[j]) min_kept = fmin(min_kept, sc[j]);
        else max_evicted = fmax(max_evicted, sc[j]);
    }
    CHECK_MSG(recent_ok, "%s layer %d head %d: recent window not kept", what, l, g);
    CHECK_MSG(B >= N || min_kept >= max_evicted - tol * fmax(1.0, smax),
              "%s layer %d head %d: kept min %.9g < evicted max %.9g", what, l, g, min_kept,
              max_evicted);
    return 0;
}

/* ---- random property + reference comparison ---------------------------- */

typedef struct {
    int normalize;      /* H2O's normalize */
    int boost;          /* text prior (lookm, meda) */
    int meda;           /* entropy layer budgets */
    double recent;      /* recent-window fraction */
    int use_modality;   /* give random text/image masks (else NULL) */
} m2_refcfg;

static int m2_plans_equal(const kvs_plan *a, const kvs_plan *b) {
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads || a->merge != b->merge)
        return 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->layers[l].budget != b->layers[l].budget) return 0;
        if (memcmp(a->layers[l].idx, b->layers[l].idx,
                   sizeof(int32_t) * (size_t)a->n_kv_heads * a->layers[l].budget))
            return 0;
    }
    return 1;
}

/* Random modality: a text prefix, an image block, a text suffix (either part
 * may be empty), or a fully random mask. */
static void m2_random_modality(m2_cache *c, uint64_t *rng) {
    c->mod = malloc((size_t)c->N);
    assert(c->mod);
    int kind = (int)(kvs_rng_uniform(rng) * 3);
    int a = (int)(kvs_rng_uniform(rng) * c->N), b = a + (int)(kvs_rng_uniform(rng) * (c->N - a + 1));
    for (int j = 0; j < c->N; j++) {
        if (kind == 2) c->mod[j] = kvs_rng_uniform(rng) < 0.5 ? KVS_MOD_TEXT : KVS_MOD_IMAGE;
        else c->mod[j] = (j >= a && j < b) ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    }
}

/* n_cases random prompts with N in [nmin, nmax] (the first cases with
 * nmin == 1 use N = 1..4). */
static void m2_check_random(const kvs_method *m, const kvs_params *p, m2_refcfg cfg, int n_cases,
                            int nmin, int nmax, uint64_t seed) {
    assert(1 <= nmin && nmin <= nmax && nmax <= M2_NMAX);
    uint64_t rng = seed;
    int heads = 0, exact = 0, budget_mismatch = 0;
    for (int t = 0; t < n_cases; t++) {
        int L = 1 + (int)(kvs_rng_uniform(&rng) * 3);
        int Hkv = 1 + (int)(kvs_rng_uniform(&rng) * 3);
        int G = 1 + (int)(kvs_rng_uniform(&rng) * 3);
        int d = 2 << (int)(kvs_rng_uniform(&rng) * 4);
        int N = (nmin == 1 && t < 4) ? 1 + t : nmin + (int)(kvs_rng_uniform(&rng) * (nmax - nmin + 1));
        m2_cache c;
        m2_cache_alloc(&c, L, N, Hkv, G * Hkv, d);
        m2_cache_random(&c, &rng, 0.5 + 1.5 * kvs_rng_uniform(&rng));
        if (cfg.use_modality && kvs_rng_uniform(&rng) < 0.8) m2_random_modality(&c, &rng);
        m2_cache_views(&c, N);
        kvs_budget b = {0, 0};
        if (kvs_rng_uniform(&rng) < 0.7) b.ratio = 0.05 + 0.95 * kvs_rng_uniform(&rng);
        else b.tokens = 1 + (int64_t)(kvs_rng_uniform(&rng) * N);
        if (t % 7 == 3) b.ratio = 1.0, b.tokens = 0; /* keep everything */
        int per_layer = 0;
        kvs_err err_store = {0}, *err = &err_store;
        CHECK_OK(kvs_budget_per_layer(&b, N, &per_layer, err), err);
        kvs_plan plan, plan2;
        memset(&plan, 0, sizeof plan);
        memset(&plan2, 0, sizeof plan2);
        kvs_status st = kvs_compress(m, p, &c.view, &b, 1, &plan, err);
        CHECK_MSG(st == KVS_OK, "%s case %d (L=%d N=%d Hkv=%d G=%d d=%d B=%d): %s", m->name, t, L,
                  N, Hkv, G, d, per_layer, err->msg);
        if (st != KVS_OK) {
            m2_cache_free(&c);
            continue;
        }
        CHECK_OK(kvs_plan_check(&plan, err), err);
        CHECK_EQ_INT(kvs_plan_total(&plan), (int64_t)L * per_layer);
        CHECK_EQ_INT(plan.n_layers, L);
        CHECK_EQ_INT(plan.n_kv_heads, Hkv);
        CHECK_EQ_INT(plan.n_tokens, N);
        CHECK(strcmp(plan.method, m->name) == 0);
        /* determinism: same inputs, another thread count, same plan */
        CHECK_OK(kvs_compress(m, p, &c.view, &b, 3, &plan2, err), err);
        CHECK_MSG(m2_plans_equal(&plan, &plan2), "%s case %d: plan differs across runs", m->name, t);

        double *sc = malloc(sizeof(double) * (size_t)L * Hkv * N); /* [L][Hkv][N] */
        m2_ent *ent = calloc((size_t)L, sizeof *ent);
        int *ref_b = malloc(sizeof(int) * (size_t)L);
        double *w = malloc(sizeof(double) * (size_t)L);
        assert(sc && ent && ref_b && w);
        for (int l = 0; l < L; l++)
            m2_ref_layer(&c, l, cfg.normalize, cfg.boost, sc + (size_t)l * Hkv * N, &ent[l]);
        if (cfg.meda) {
            int xmodal = 1;
            for (int l = 0; l < L; l++) xmodal &= (ent[l].n_tv + ent[l].n_vt) > 0;
            double emax = -INFINITY, z = 0;
            for (int l = 0; l < L; l++) {
                w[l] = xmodal ? ent[l].e_tv + ent[l].e_vt : ent[l].plain;
                emax = fmax(emax, w[l]);
            }
            for (int l = 0; l < L; l++) z += (w[l] = exp(w[l] - emax));
            for (int l = 0; l < L; l++) w[l] /= z;
            int bmin = kvs_budget_min(N) < per_layer ? kvs_budget_min(N) : per_layer;
            CHECK_OK(kvs_budget_allocate(w, L, (int64_t)L * per_layer, bmin, N, ref_b, err), err);
            CHECK_MSG(strstr(plan.note, xmodal ? "cross-modal" : "single modality") != NULL,
                      "meda case %d: note '%s' (xmodal %d)", t, plan.note, xmodal);
        } else {
            for (int l = 0; l < L; l++) ref_b[l] = per_layer;
        }
        for (int l = 0; l < L; l++) {
            int B = plan.layers[l].budget;
            if (B != ref_b[l]) {
                /* fp32 vs double entropies can move one token at a rounding
                 * boundary; anything more is a bug */
                budget_mismatch++;
                CHECK_MSG(abs(B - ref_b[l]) <= 1, "%s case %d layer %d: budget %d, reference %d",
                          m->name, t, l, B, ref_b[l]);
                continue;
            }
            int r = (int)floor(B * cfg.recent);
            for (int g = 0; g < Hkv; g++) {
                heads++;
                exact += m2_compare_head(sc + ((size_t)l * Hkv + g) * N, N, B, r,
                                         plan.layers[l].idx + (size_t)g * B, 1e-4, m->name, l, g);
                /* recent window kept, directly */
                for (int j = N - r; j < N; j++) {
                    int found = 0;
                    for (int i = 0; i < B; i++) found |= plan.layers[l].idx[(size_t)g * B + i] == j;
                    CHECK_MSG(found, "%s case %d layer %d head %d: recent token %d evicted",
                              m->name, t, l, g, j);
                }
            }
        }
        free(sc), free(ent), free(ref_b), free(w);
        kvs_plan_free(&plan);
        kvs_plan_free(&plan2);
        m2_cache_free(&c);
    }
    printf("%s: %d random cases, %d heads compared, %d exact matches of the naive reference, %d "
           "layer budgets off by one\n",
           m->name, n_cases, heads, exact, budget_mismatch);
    CHECK_MSG(exact >= heads * 9 / 10, "%s: only %d of %d heads match the reference exactly",
              m->name, exact, heads);
    CHECK(budget_mismatch * 20 <= n_cases);
}

#endif
