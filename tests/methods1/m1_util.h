/*
 * m1_util.h -- helpers for the methods1 tests (full, random, streamingllm,
 * snapkv, flashcache): an owned fp32 cache of L layers, a way to run a
 * method through its own table (create / observe / select) so tests do not
 * depend on the driver's extra checks, and plan comparisons.
 * Not a framework: static functions only, no global state.
 */
#ifndef M1_UTIL_H
#define M1_UTIL_H

#include "kvsieve_methods.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int L, Hkv, Hq, N, Nq, d;
    float *k, *v, *q;   /* [L][Hkv][N][d], [L][Hkv][N][d], [L][Hq][Nq][d] (q NULL if Nq == 0) */
    uint8_t *modality;  /* [N] or NULL */
    float *wo;          /* [L][Hq][E][d] output projections (m1_cache_add_wo), or NULL */
    float *recon;       /* [L][Hkv][N] reconstruction maxima (m1_cache_add_recon), or NULL */
    kvs_layer *layers;  /* [L] */
    kvs_cache_view view;
} m1_cache;

static inline float *m1_k(m1_cache *c, int l, int h, int n) {
    return c->k + (((int64_t)l * c->Hkv + h) * c->N + n) * c->d;
}
static inline float *m1_v(m1_cache *c, int l, int h, int n) {
    return c->v + (((int64_t)l * c->Hkv + h) * c->N + n) * c->d;
}
static inline float *m1_q(m1_cache *c, int l, int h, int i) {
    return c->q + (((int64_t)l * c->Hq + h) * c->Nq + i) * c->d;
}

/* Zero-filled cache; call m1_cache_views after filling (or before: views
 * point at the buffers, so filling later is fine too). */
static inline void m1_cache_init(m1_cache *c, int L, int Hkv, int Hq, int N, int Nq, int d) {
    memset(c, 0, sizeof *c);
    c->L = L, c->Hkv = Hkv, c->Hq = Hq, c->N = N, c->Nq = Nq, c->d = d;
    size_t kvn = (size_t)L * Hkv * N * d;
    c->k = calloc(kvn ? kvn : 1, sizeof(float));
    c->v = calloc(kvn ? kvn : 1, sizeof(float));
    if (Nq > 0) c->q = calloc((size_t)L * Hq * Nq * d, sizeof(float));
    c->layers = calloc((size_t)L, sizeof(kvs_layer));
    if (!c->k || !c->v || (Nq > 0 && !c->q) || !c->layers) {
        fprintf(stderr, "m1_cache_init: out of memory\n");
        exit(2);
    }
    for (int l = 0; l < L; l++) {
        c->layers[l].k = kvs_view_make(c->k + (size_t)l * Hkv * N * d, KVS_F32, Hkv, N, d);
        c->layers[l].v = kvs_view_make(c->v + (size_t)l * Hkv * N * d, KVS_F32, Hkv, N, d);
        if (Nq > 0)
            c->layers[l].q = kvs_view_make(c->q + (size_t)l * Hq * Nq * d, KVS_F32, Hq, Nq, d);
        else
            c->layers[l].q = kvs_view_make(NULL, KVS_F32, Hq, 0, d);
    }
    c->view.n_layers = L;
    c->view.layers = c->layers;
    c->view.modality = NULL;
}

static inline void m1_cache_free(m1_cache *c) {
    free(c->k);
    free(c->v);
    free(c->q);
    free(c->modality);
    free(c->wo);
    free(c->recon);
    free(c->layers);
    memset(c, 0, sizeof *c);
}

/* Gaussian K, V, Q from a seed, plus a smooth low-frequency part. */
static inline void m1_cache_fill_random(m1_cache *c, uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t kvn = (size_t)c->L * c->Hkv * c->N * c->d;
    for (size_t i = 0; i < kvn; i++) {
        size_t n = (i / (size_t)c->d) % (size_t)c->N;
        double smooth = sin(0.05 * (double)n + 0.3 * (double)(i % (size_t)c->d));
        c->k[i] = (float)(smooth + 0.5 * kvs_rng_normal(&rng));
        c->v[i] = (float)(0.5 * smooth + 0.5 * kvs_rng_normal(&rng));
    }
    if (c->q) {
        size_t qn = (size_t)c->L * c->Hq * c->Nq * c->d;
        for (size_t i = 0; i < qn; i++) c->q[i] = (float)kvs_rng_normal(&rng);
    }
}

/* Gaussian output projections W_o [Hq][E][d] per layer, for methods that
 * declare KVS_NEED_W_O (the views are the layers' wo). */
static inline void m1_cache_add_wo(m1_cache *c, int E, uint64_t seed) {
    const size_t per = (size_t)c->Hq * E * c->d;
    free(c->wo);
    c->wo = malloc(sizeof(float) * per * (size_t)c->L);
    if (!c->wo) {
        fprintf(stderr, "m1_cache_add_wo: out of memory\n");
        exit(2);
    }
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < per * (size_t)c->L; i++) c->wo[i] = (float)kvs_rng_normal(&rng);
    for (int l = 0; l < c->L; l++)
        c->layers[l].wo = kvs_view_make(c->wo + per * (size_t)l, KVS_F32, c->Hq, E, c->d);
}

/* Uniform [0, 1) stand-ins for the context-reconstruction statistic
 * (kvs_layer.attn_recon_max), for methods that declare KVS_NEED_RECON. */
static inline void m1_cache_add_recon(m1_cache *c, uint64_t seed) {
    const size_t per = (size_t)c->Hkv * c->N;
    free(c->recon);
    c->recon = malloc(sizeof(float) * (per * (size_t)c->L + 1));
    if (!c->recon) {
        fprintf(stderr, "m1_cache_add_recon: out of memory\n");
        exit(2);
    }
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 11;
    for (size_t i = 0; i < per * (size_t)c->L; i++) c->recon[i] = (float)kvs_rng_uniform(&rng);
    for (int l = 0; l < c->L; l++) c->layers[l].attn_recon_max = c->recon + per * (size_t)l;
}

static inline kvs_shape m1_shape(const m1_cache *c, int threads) {
    kvs_shape s = {c->L, c->N, c->Hkv, c->Hq, c->d, c->Nq, threads};
    return s;
}

/* Run a method through its table: create, observe all layers, select. The
 * plan is freed on failure. */
static inline kvs_status m1_run(const kvs_method *m, const kvs_params *p, m1_cache *c, int per_layer,
                         kvs_plan *plan, kvs_err *err) {
    void *state = NULL;
    kvs_shape s = m1_shape(c, 1);
    memset(plan, 0, sizeof *plan);
    kvs_status st = m->create(p, &s, &state, err);
    if (st) return st;
    for (int l = 0; l < c->L && !st; l++) st = m->observe(state, l, &c->layers[l], c->modality, err);
    if (!st) st = m->select(state, per_layer, plan, err);
    m->destroy(state);
    if (st) kvs_plan_free(plan);
    return st;
}

/* 1 if layer l head h of the plan keeps exactly want[0..n). */
static inline int m1_row_is(const kvs_plan *p, int l, int h, const int32_t *want, int n) {
    if (l >= p->n_layers || h >= p->n_kv_heads || p->layers[l].budget != n) return 0;
    const int32_t *row = p->layers[l].idx + (int64_t)h * n;
    for (int i = 0; i < n; i++)
        if (row[i] != want[i]) return 0;
    return 1;
}

static inline void m1_print_row(const kvs_plan *p, int l, int h) {
    const int B = p->layers[l].budget;
    fprintf(stderr, "  layer %d head %d keeps %d:", l, h, B);
    for (int i = 0; i < B; i++) fprintf(stderr, " %d", p->layers[l].idx[(int64_t)h * B + i]);
    fputc('\n', stderr);
}

/* CHECK that every head of layer l keeps exactly want[0..n). */
#define CHECK_ROW(plan, l, h, ...)                                                      \
    do {                                                                                \
        const int32_t _w[] = {__VA_ARGS__};                                             \
        int _ok = m1_row_is((plan), (l), (h), _w, (int)(sizeof _w / sizeof _w[0]));     \
        CHECK_MSG(_ok, "layer %d head %d differs from the hand-computed set", (l), (h)); \
        if (!_ok && (plan)->layers) m1_print_row((plan), (l), (h));                     \
    } while (0)

static inline int m1_plans_equal(const kvs_plan *a, const kvs_plan *b) {
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads || a->n_tokens != b->n_tokens)
        return 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->layers[l].budget != b->layers[l].budget) return 0;
        if (!a->layers[l].counts != !b->layers[l].counts) return 0;
        if (a->layers[l].counts &&
            memcmp(a->layers[l].counts, b->layers[l].counts, sizeof(int32_t) * (size_t)a->n_kv_heads))
            return 0;
        if (memcmp(a->layers[l].idx, b->layers[l].idx,
                   sizeof(int32_t) * (size_t)a->layers[l].budget * (size_t)a->n_kv_heads))
            return 0;
    }
    return 1;
}

/* 1 if token t is kept in layer l head h. */
static inline int m1_kept(const kvs_plan *p, int l, int h, int t) {
    int B;
    const int32_t *row = kvs_plan_head(p, l, h, &B); /* ragged plans too */
    for (int i = 0; i < B; i++)
        if (row[i] == t) return 1;
    return 0;
}

static inline void m1_set(const kvs_method *m, kvs_params *p, const char *name, const char *value) {
    kvs_err e_ = {0}, *e = &e_;
    CHECK_OK(kvs_params_set(m, p, name, value, e), e);
}

#endif
