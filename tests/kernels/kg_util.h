/*
 * kg_util.h -- helpers shared by the GPU parity tests (tests/kernels/):
 * the skip rule, fresh seeds, caches mirrored on host and device in one
 * dtype (so CPU and GPU see the same rounded values), poisoning, reference
 * scores from the CPU helpers (core/ attention + select, kernels/dct.h) for
 * the tie-tolerant plan comparison, and the merge-aware cache comparison.
 *
 * What it is not: no reference of its own for any method: plans come from
 * kvs_compress, merged caches from kvs_apply; the reference scores only
 * decide whether two differing plans differ at an exact-score tie.
 */
#ifndef KG_UTIL_H
#define KG_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dct.h"
#include "kvs_formats.h"
#include "kvs_kernels.h"
#include "kvsieve_methods.h"
#include "test_util.h"

#define KG_SKIP 77

/* 0: a device is present. 77: none (prints SKIP and the reason). 1: the API
 * did not explain the absence the documented way (a real failure). */
static inline int kg_device_or_skip(const char *test) {
    int n = -1;
    kvs_err err;
    kvs_err_clear(&err);
    kvs_status st = kvs_gpu_device_count(&n, &err);
    if (st == KVS_OK && n > 0) return 0;
    int ok = st == KVS_ERR_UNSUPPORTED && n == 0 &&
             (strstr(err.msg, "no CUDA device") || strstr(err.msg, "built without CUDA"));
    /* without a device the workspace must refuse too, with the same reason */
    kvs_shape sh = {1, 8, 1, 1, 8, 0, 1};
    kvs_gpu_workspace *ws = (kvs_gpu_workspace *)1;
    kvs_err e2;
    kvs_err_clear(&e2);
    kvs_status st2 = kvs_gpu_workspace_init(&ws, &sh, &e2);
    ok = ok && st2 == KVS_ERR_UNSUPPORTED && ws == NULL &&
         (strstr(e2.msg, "no CUDA device") || strstr(e2.msg, "built without CUDA"));
    if (!ok) {
        fprintf(stderr, "%s: device count failed without the documented message: rc=%d n=%d "
                        "msg='%s' / workspace rc=%d msg='%s'\n",
                test, (int)st, n, err.msg, (int)st2, e2.msg);
        return 1;
    }
    printf("SKIP: %s: %s\n", test, err.msg);
    return KG_SKIP;
}

/* max |a[i]| over n */
static inline double kg_max_abs(const float *a, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

/* max |a - b| over n; NaN counts as infinite */
static inline double kg_max_err(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}

/* Fresh seed each run (printed), or KVS_SEED from the environment. */
static inline uint64_t kg_seed(void) {
    const char *s = getenv("KVS_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 0)
                      : ((uint64_t)time(NULL) * 1000003ull) ^ ((uint64_t)getpid() << 20);
    printf("seed %llu (rerun with KVS_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

/* ---- dtype buffers ----------------------------------------------------------- */

/* Host copy of src[n] fp32 in dtype t (malloc'd). */
static inline void *kg_convert(const float *src, size_t n, kvs_dtype t) {
    const size_t es = kvs_dtype_size(t);
    void *dst = malloc(es * (n ? n : 1));
    if (!dst) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (t == KVS_F32) ((float *)dst)[i] = src[i];
        else if (t == KVS_F16) ((uint16_t *)dst)[i] = kvs_f32_to_f16(src[i]);
        else ((uint16_t *)dst)[i] = kvs_f32_to_bf16(src[i]);
    }
    return dst;
}

static inline void *kg_upload(const void *host, size_t bytes) {
    void *d = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_malloc(&d, bytes, &err) != KVS_OK) {
        fprintf(stderr, "kg_upload: %s\n", err.msg);
        return NULL;
    }
    if (kvs_gpu_memcpy_h2d(d, host, bytes, &err) != KVS_OK) {
        fprintf(stderr, "kg_upload: %s\n", err.msg);
        kvs_gpu_free(d);
        return NULL;
    }
    return d;
}

static inline void *kg_alloc_poisoned(size_t bytes) {
    void *d = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_malloc(&d, bytes, &err) != KVS_OK || kvs_gpu_poison(d, bytes, &err) != KVS_OK) {
        fprintf(stderr, "kg_alloc_poisoned: %s\n", err.msg);
        kvs_gpu_free(d);
        return NULL;
    }
    return d;
}

static inline int kg_download(void *host, const void *dev, size_t bytes) {
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_memcpy_d2h(host, dev, bytes, &err) != KVS_OK) {
        fprintf(stderr, "kg_download: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---- a cache mirrored on host and device ------------------------------------- */

typedef struct {
    int L;
    kvs_dtype t;
    void **hk, **hv, **hq; /* [L] host buffers in dtype t */
    void **dk, **dv, **dq; /* [L] device copies */
    kvs_layer *hl, *dl;    /* [L] views */
    kvs_cache_view host, dev;
} kg_cache;

static inline void kg_cache_free(kg_cache *c) {
    if (!c) return;
    for (int l = 0; l < c->L; l++) {
        if (c->hk) free(c->hk[l]);
        if (c->hv) free(c->hv[l]);
        if (c->hq) free(c->hq[l]);
        if (c->dk) kvs_gpu_free(c->dk[l]);
        if (c->dv) kvs_gpu_free(c->dv[l]);
        if (c->dq) kvs_gpu_free(c->dq[l]);
    }
    free(c->hk);
    free(c->hv);
    free(c->hq);
    free(c->dk);
    free(c->dv);
    free(c->dq);
    free(c->hl);
    free(c->dl);
    memset(c, 0, sizeof *c);
}

/* Mirror a dense fp32 cache (every layer with N tokens; q optional) in dtype t. */
static inline int kg_cache_make(const kvs_dense_cache *src, kvs_dtype t, kg_cache *c) {
    memset(c, 0, sizeof *c);
    const int L = src->n_layers;
    c->L = L;
    c->t = t;
    c->hk = calloc((size_t)L, sizeof(void *));
    c->hv = calloc((size_t)L, sizeof(void *));
    c->hq = calloc((size_t)L, sizeof(void *));
    c->dk = calloc((size_t)L, sizeof(void *));
    c->dv = calloc((size_t)L, sizeof(void *));
    c->dq = calloc((size_t)L, sizeof(void *));
    c->hl = calloc((size_t)L, sizeof(kvs_layer));
    c->dl = calloc((size_t)L, sizeof(kvs_layer));
    if (!c->hk || !c->hv || !c->hq || !c->dk || !c->dv || !c->dq || !c->hl || !c->dl) goto fail;
    const size_t es = kvs_dtype_size(t);
    for (int l = 0; l < L; l++) {
        const kvs_dense_layer *s = &src->layers[l];
        const int H = s->n_kv_heads, N = s->n_tokens, d = s->head_dim;
        const size_t nkv = (size_t)H * N * d;
        c->hk[l] = kg_convert(s->k, nkv, t);
        c->hv[l] = kg_convert(s->v, nkv, t);
        if (!c->hk[l] || !c->hv[l]) goto fail;
        c->dk[l] = kg_upload(c->hk[l], nkv * es);
        c->dv[l] = kg_upload(c->hv[l], nkv * es);
        if (!c->dk[l] || !c->dv[l]) goto fail;
        c->hl[l].k = kvs_view_make(c->hk[l], t, H, N, d);
        c->hl[l].v = kvs_view_make(c->hv[l], t, H, N, d);
        c->dl[l].k = kvs_view_make(c->dk[l], t, H, N, d);
        c->dl[l].v = kvs_view_make(c->dv[l], t, H, N, d);
        c->dl[l].k.device = c->dl[l].v.device = KVS_CUDA;
        if (s->q && s->n_queries > 0) {
            const size_t nq = (size_t)s->n_q_heads * s->n_queries * d;
            c->hq[l] = kg_convert(s->q, nq, t);
            if (!c->hq[l]) goto fail;
            c->dq[l] = kg_upload(c->hq[l], nq * es);
            if (!c->dq[l]) goto fail;
            c->hl[l].q = kvs_view_make(c->hq[l], t, s->n_q_heads, s->n_queries, d);
            c->dl[l].q = kvs_view_make(c->dq[l], t, s->n_q_heads, s->n_queries, d);
            c->dl[l].q.device = KVS_CUDA;
        }
    }
    c->host.n_layers = c->dev.n_layers = L;
    c->host.layers = c->hl;
    c->dev.layers = c->dl;
    c->host.modality = c->dev.modality = src->modality;
    return 0;
fail:
    fprintf(stderr, "kg_cache_make: out of host or device memory\n");
    kg_cache_free(c);
    return 1;
}

/* A synthetic cache from formats/ (tiny shapes, fresh seed). */
static inline int kg_synth(int L, int Hq, int Hkv, int d, int N, int Nq, double image_frac,
                    uint64_t seed, kvs_dense_cache *out) {
    kvs_synth_config cfg;
    kvs_synth_defaults(&cfg);
    cfg.n_layers = L;
    cfg.n_q_heads = Hq;
    cfg.n_kv_heads = Hkv;
    cfg.head_dim = d;
    cfg.n_tokens = N;
    cfg.n_queries = Nq;
    cfg.n_probes = 0;
    cfg.image_frac = image_frac;
    cfg.seed = seed;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_synth_generate(&cfg, out, NULL, NULL, &err) != KVS_OK) {
        fprintf(stderr, "kg_synth: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---- plan comparison, tolerant to exact-score ties ------------------------------ */

/* Compare the index sets of one head: identical, or every token in the
 * symmetric difference has a reference score within tol * scale of every
 * other one in it (an exact tie that fp32 rounding ordered differently).
 * Returns 0 identical, 1 tolerated tie, -1 real difference (printed). */
static inline int kg_cmp_rows(const int32_t *a, const int32_t *b, int B, int N, const float *score,
                       double tol, const char *what) {
    if (!memcmp(a, b, sizeof(int32_t) * (size_t)B)) return 0;
    if (!score) {
        fprintf(stderr, "%s: index sets differ and no reference score to judge ties\n", what);
        return -1;
    }
    unsigned char *ina = calloc((size_t)N, 1), *inb = calloc((size_t)N, 1);
    if (!ina || !inb) {
        free(ina);
        free(inb);
        return -1;
    }
    for (int i = 0; i < B; i++) {
        ina[a[i]] = 1;
        inb[b[i]] = 1;
    }
    double lo = 1e300, hi = -1e300, scale = 0.0;
    int ndiff = 0;
    for (int j = 0; j < N; j++) {
        const double s = score[j];
        if (fabs(s) > scale) scale = fabs(s);
        if (ina[j] != inb[j]) {
            ndiff++;
            if (s < lo) lo = s;
            if (s > hi) hi = s;
        }
    }
    free(ina);
    free(inb);
    if (hi - lo <= tol * (scale > 0 ? scale : 1.0)) return 1;
    fprintf(stderr, "%s: %d tokens differ, reference scores span [%.9g, %.9g] (scale %.3g)\n",
            what, ndiff, lo, hi, scale);
    return -1;
}

/* ---- reference scores from the CPU helpers ----------------------------------- */

/* FlashCache deviation of one layer (host view, any dtype) via kernels/dct.h:
 * dev [H][N]; energies e[4] = {low K, tot K, low V, tot V}. */
static inline int kg_ref_flashcache(const kvs_layer *ly, int omega, float *dev, double *e) {
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    const size_t nd = (size_t)N * d;
    float *rows = malloc(sizeof(float) * nd), *x = malloc(sizeof(float) * nd);
    float *X = malloc(sizeof(float) * nd), *base = malloc(sizeof(float) * nd);
    kvs_dct_plan *plan = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    int rc = 1;
    if (!rows || !x || !X || !base || kvs_dct_plan_create(N, d, &plan, &err) != KVS_OK) goto out;
    for (int i = 0; i < 4; i++) e[i] = 0.0;
    for (int h = 0; h < H; h++) {
        float *dh = dev + (size_t)h * N;
        memset(dh, 0, sizeof(float) * (size_t)N);
        for (int t = 0; t < 2; t++) {
            kvs_view_rows_f32(t ? &ly->v : &ly->k, h, 0, N, rows);
            kvs_transpose_f32(rows, N, d, x);
            if (kvs_dct2_ortho_cols(plan, x, X, &err) != KVS_OK) goto out;
            for (int c = 0; c < d; c++) {
                float *Xc = X + (size_t)c * N;
                for (int m = 0; m < N; m++) {
                    const double q = (double)Xc[m] * Xc[m];
                    e[2 * t + 1] += q;
                    if (m < omega) e[2 * t] += q;
                    else Xc[m] = 0.0f;
                }
            }
            if (kvs_dct3_ortho_cols(plan, X, base, &err) != KVS_OK) goto out;
            for (int n = 0; n < N; n++) {
                float acc = 0.0f;
                for (int c = 0; c < d; c++) {
                    const float r = x[(size_t)c * N + n] - base[(size_t)c * N + n];
                    acc += r * r;
                }
                dh[n] += acc / (float)d;
            }
        }
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "kg_ref_flashcache: %s\n", err.msg[0] ? err.msg : "out of memory");
    kvs_dct_plan_destroy(plan);
    free(rows);
    free(x);
    free(X);
    free(base);
    return rc;
}

/* H2O-family scores of one layer on the host: sc [Hkv][N] (GQA-mean column
 * sums over all queries), normalised and / or text-boosted as asked. */
static inline int kg_ref_colsum(const kvs_view *q, const kvs_view *k, float *sc) {
    float *lse = malloc(sizeof(float) * (size_t)q->n_heads * (size_t)(q->n_tokens ? q->n_tokens : 1));
    kvs_err err;
    kvs_err_clear(&err);
    int rc = !lse || kvs_attn_lse(q, k, lse, 1, &err) != KVS_OK ||
             kvs_attn_colsum(q, k, lse, sc, NULL, 1, &err) != KVS_OK;
    if (rc) fprintf(stderr, "kg_ref_colsum: %s\n", err.msg);
    free(lse);
    return rc;
}

/* ---- merged-cache comparison ----------------------------------------------------- */

/* Compare a GPU-compacted layer (host copies gk, gv [H][B][d]) with the CPU
 * one (ck, cv), element-wise |g - c| <= rtol * (|c| + rms(c)); slots touched
 * by a tolerated assignment tie (skip[h][b] != 0) are not compared. Returns
 * the number of bad elements (first few printed). */
static inline long kg_cmp_merged(const float *gk, const float *gv, const float *ck, const float *cv,
                          int H, int B, int d, const unsigned char *skip, double rtol,
                          const char *what) {
    double ss = 0.0;
    const size_t n = (size_t)H * B * d;
    for (size_t i = 0; i < n; i++) ss += (double)ck[i] * ck[i] + (double)cv[i] * cv[i];
    const double rms = sqrt(ss / (2.0 * (double)(n ? n : 1)));
    long bad = 0;
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++) {
            if (skip && skip[(size_t)h * B + b]) continue;
            for (int c = 0; c < d; c++) {
                const size_t i = ((size_t)h * B + b) * d + c;
                for (int t = 0; t < 2; t++) {
                    const double g = t ? gv[i] : gk[i], r = t ? cv[i] : ck[i];
                    if (!(fabs(g - r) <= rtol * (fabs(r) + rms))) {
                        if (bad < 5)
                            fprintf(stderr, "%s: %s head %d slot %d channel %d: gpu %.9g cpu %.9g\n",
                                    what, t ? "V" : "K", h, b, c, g, r);
                        bad++;
                    }
                }
            }
        }
    return bad;
}

/* Cosine of two host rows. */
static inline double kg_cos(const float *a, const float *b, int d) {
    double dot = 0.0, na = 0.0, nb = 0.0;
    for (int c = 0; c < d; c++) {
        dot += (double)a[c] * b[c];
        na += (double)a[c] * a[c];
        nb += (double)b[c] * b[c];
    }
    return na > 0 && nb > 0 ? dot / sqrt(na * nb) : 0.0;
}

#endif
