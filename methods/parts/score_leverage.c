/*
 * score_leverage.c -- scorer `leverage`: approximate statistical leverage of
 * each key among the head's keys (geometric outliers are kept).
 *
 * Paper: Compactor, "Calibrated Query-Agnostic KV Cache Compression with
 * Approximate Leverage Scores", arXiv 2507.08143; code read: kvpress
 * LeverageScorePress (kvpress/presses/leverage_press.py, kvpress 0.5.5
 * wheel).
 * Formula, per layer and KV head, sketch size k:
 *   X = K - mean over tokens ([N][d]); Y = X Phi ([N][k]) with Phi a
 *   [d][k] Gaussian matrix scaled by 1/sqrt(k); G = Y'Y + c I with the
 *   jitter c = 0.01 (then 0.1, 1, 10, 100 while the Cholesky factorisation
 *   G = L L' fails); leverage l_j = y_j' G^-1 y_j = ||L^-1 y_j||^2, at
 *   least 0. The scores are the z-scores of l over the layer's [Hkv][N]
 *   values (mean, standard deviation unbiased as torch.std, at least 1e-6),
 *   as kvpress (an affine map: no plan of one layer changes by it).
 * Parameters: sketch_dimension (int >= 1, 48 = kvpress's), seed (int, 0).
 * Decisions:
 *   - kvpress scores the PRE-RoPE keys (it recomputes them from the hidden
 *     states); the cache view holds post-RoPE keys and no hidden states, so
 *     the cached keys are scored as they are.
 *   - Phi is drawn from a seeded stream per (layer, head): seed +
 *     (l * Hkv + h + 1) * 0x9E3779B97F4A7C15 (kvpress draws it unseeded with
 *     torch.randn, so its plans vary from run to run); fp32 sgemm for Y,
 *     the Gram matrix (dsyrk), Cholesky, L^-1 and its product with all rows
 *     (one dtrmm) in double.
 *   - The jitter sequence is kvpress's; if five factorisations fail the
 *     head is an error naming layer and head (kvpress raises too).
 * Cost per head N d k (sgemm) + N k^2 (Gram and solves); all layers in one
 * parallel run (score_layers) over (layer, KV head) units on the shape's
 * threads (BLAS single-threaded inside; each unit's sums in the same order
 * whatever the thread count), then each layer's z-scores. Memory per
 * worker [N][d] + [N][k] floats, [N][k] + 2 [k][k] doubles; [L][Hkv][N]
 * doubles of leverages.
 */
#include "kvs_parts.h"

#include <cblas.h>

#include <math.h>
#include <stdlib.h>

/* Cholesky factor of the k x k matrix g (lower, in place); 0 on success. */
static int cholesky(double *g, int k) {
    for (int j = 0; j < k; j++) {
        double s = g[(size_t)j * k + j];
        for (int p = 0; p < j; p++) s -= g[(size_t)j * k + p] * g[(size_t)j * k + p];
        if (!(s > 0)) return 1;
        const double ljj = sqrt(s);
        g[(size_t)j * k + j] = ljj;
        for (int i = j + 1; i < k; i++) {
            double t = g[(size_t)i * k + j];
            for (int p = 0; p < j; p++) t -= g[(size_t)i * k + p] * g[(size_t)j * k + p];
            g[(size_t)i * k + j] = t / ljj;
        }
    }
    return 0;
}

/* inv [k][k] (lower triangle) = the inverse of the lower-triangular l
 * [k][k], column by column by forward substitution, in double. */
static void lower_inverse(const double *l, int k, double *inv) {
    for (int j = 0; j < k; j++) {
        inv[(size_t)j * k + j] = 1.0 / l[(size_t)j * k + j];
        for (int i = j + 1; i < k; i++) {
            double t = 0.0;
            for (int p = j; p < i; p++) t += l[(size_t)i * k + p] * inv[(size_t)p * k + j];
            inv[(size_t)i * k + j] = -t / l[(size_t)i * k + i];
        }
    }
}

/* mean [d] = the column means of x [N][d] in double, rows in order (channels
 * in blocks of 8: they vectorise; the same sums as one channel at a time). */
static void col_mean(const float *restrict x, int N, int d, double *restrict mean) {
    for (int c = 0; c < d; c++) mean[c] = 0.0;
    for (int j = 0; j < N; j++) {
        const float *restrict r = x + (size_t)j * d;
        int c = 0;
        for (; c + 8 <= d; c += 8)
            for (int t = 0; t < 8; t++) mean[c + t] += r[c + t];
        for (; c < d; c++) mean[c] += r[c];
    }
    for (int c = 0; c < d; c++) mean[c] /= N;
}

kvs_status kvs_leverage_head(const float *krows, int N, int d, int k, uint64_t stream, float *y,
                             double *g, double *z, double *out, kvs_err *err) {
    /* centred keys in y's first N*d floats would alias; center on the fly:
     * Y = K Phi - 1 (mean K) Phi */
    float *phi = malloc(sizeof(float) * (size_t)d * k); /* [d][k] */
    double *mean = malloc(sizeof(double) * (size_t)d), *mphi = malloc(sizeof(double) * (size_t)k);
    double *yd = malloc(sizeof(double) * (size_t)N * k); /* [N][k] Y in double */
    if (!phi || !mean || !mphi || !yd) {
        free(phi), free(mean), free(mphi), free(yd);
        return kvs_errorf(err, KVS_ERR_NOMEM, "leverage: out of memory for [N=%d][k=%d] doubles", N, k);
    }
    uint64_t rng = stream;
    const double sc = 1.0 / sqrt((double)k);
    for (size_t i = 0; i < (size_t)d * k; i++) phi[i] = (float)(kvs_rng_normal(&rng) * sc);
    col_mean(krows, N, d, mean);
    for (int a = 0; a < k; a++) mphi[a] = 0.0;
    for (int c = 0; c < d; c++) /* mphi[a] = sum over c of mean[c] phi[c][a], c in order */
        for (int a = 0; a < k; a++) mphi[a] += mean[c] * phi[(size_t)c * k + a];
    /* y [N][k] = K Phi, then minus (mean K) Phi per row, rounded to fp32 and
     * widened into yd */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, k, d, 1.0f, krows, d, phi, k, 0.0f, y, k);
    for (size_t j = 0; j < (size_t)N; j++) {
        const float *restrict yr = y + j * k;
        double *restrict yo = yd + j * k;
        int a = 0;
        for (; a + 8 <= k; a += 8) /* blocks of 8 vectorise; the same values */
            for (int t = 0; t < 8; t++) yo[a + t] = (float)(yr[a + t] - mphi[a + t]);
        for (; a < k; a++) yo[a] = (float)(yr[a] - mphi[a]);
    }
    free(phi), free(mean), free(mphi);
    /* G = Y'Y (dsyrk, lower) */
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, k, N, 1.0, yd, k, 0.0, z, k);
    for (int a = 0; a < k; a++) /* the upper triangle too (the jitter loop copies all of z) */
        for (int b = 0; b < a; b++) z[(size_t)b * k + a] = z[(size_t)a * k + b];
    double jitter = 1e-2;
    int tries = 0;
    for (;; tries++) {
        if (tries == 5) {
            free(yd);
            return kvs_errorf(err, KVS_ERR_NUMERIC,
                              "leverage: the Cholesky factorisation of the %d x %d sketch Gram "
                              "matrix failed with jitter up to %g",
                              k, k, jitter / 10);
        }
        for (size_t i = 0; i < (size_t)k * k; i++) g[i] = z[i];
        for (int a = 0; a < k; a++) g[(size_t)a * k + a] += jitter;
        if (!cholesky(g, k)) break;
        jitter *= 10;
    }
    /* l_j = ||L^-1 y_j||^2: rows of yd L^-T, with L^-1 formed once (k^3 / 6,
     * into z: the Gram copy is no longer needed) and applied by dtrmm (N k^2 / 2,
     * about 1.5x faster than dtrsm's solves at k = 48) */
    lower_inverse(g, k, z);
    cblas_dtrmm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, N, k, 1.0, z, k, yd, k);
    for (int j = 0; j < N; j++) { /* 4 lanes (column a in lane a mod 4), folded pairwise */
        const double *x = yd + (size_t)j * k;
        double l[4] = {0, 0, 0, 0};
        int a = 0;
        for (; a + 4 <= k; a += 4)
            for (int t = 0; t < 4; t++) l[t] += x[a + t] * x[a + t];
        for (; a < k; a++) l[a % 4] += x[a] * x[a];
        const double s = (l[0] + l[2]) + (l[1] + l[3]);
        out[j] = s > 0 ? s : 0.0;
    }
    free(yd);
    return KVS_OK;
}

typedef struct {
    const kvs_part_ctx *c;
    int T, k;         /* workers, sketch columns */
    float *krows, *y; /* [T][N][d], [T][N][k] */
    double *g, *z;    /* [T][k][k] each */
    double *lev;      /* [L][Hkv][N] */
} lev_state;

typedef struct {
    lev_state *st;
    const kvs_layer *in; /* [n_layers] */
    int layer0;          /* the first layer's index (score: the one layer) */
    uint64_t seed;
} lev_job;

static void lev_destroy(void *state) {
    lev_state *st = state;
    if (!st) return;
    free(st->krows);
    free(st->y);
    free(st->g);
    free(st->z);
    free(st->lev);
    free(st);
}

static kvs_status lev_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim,
                 H = (size_t)c->shape.n_kv_heads, L = (size_t)(c->shape.n_layers > 0 ? c->shape.n_layers : 1);
    const size_t k = (size_t)kvs_part_param(c->m, c->p, "sketch_dimension", 48);
    lev_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->k = (int)k;
    st->T = kvs_parallel_threads(c->shape.threads, (int)(L * H));
    const size_t T = (size_t)st->T;
    st->krows = malloc(sizeof(float) * T * N * d);
    st->y = malloc(sizeof(float) * T * N * k);
    st->g = malloc(sizeof(double) * T * k * k);
    st->z = malloc(sizeof(double) * T * k * k);
    st->lev = malloc(sizeof(double) * L * H * N);
    if (!st->krows || !st->y || !st->g || !st->z || !st->lev) {
        lev_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for [T=%zu][N=%zu][k=%zu] sketches", T, N, k);
    }
    *state = st;
    return KVS_OK;
}

/* Unit u: (layer, KV head) u / Hkv, u % Hkv of the job's layers: leverage
 * into lev [u][N]; worker tid's scratch. */
static kvs_status lev_unit(void *job, int tid, int u, kvs_err *err) {
    const lev_job *j = job;
    lev_state *st = j->st;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads, d = st->c->shape.head_dim;
    const int k = st->k, layer = j->layer0 + u / H, h = u % H;
    float *krows = st->krows + (size_t)tid * N * d, *y = st->y + (size_t)tid * N * k;
    double *g = st->g + (size_t)tid * k * k, *z = st->z + (size_t)tid * k * k;
    kvs_view_rows_f32(&j->in[u / H].k, h, 0, N, krows);
    const uint64_t stream = j->seed + (uint64_t)(layer * H + h + 1) * 0x9E3779B97F4A7C15ull;
    kvs_status rc = kvs_leverage_head(krows, N, d, k, stream, y, g, z, st->lev + (size_t)u * N, err);
    if (rc) return kvs_err_prefix(err, "layer %d KV head %d", layer, h);
    return KVS_OK;
}

/* Scores [H][N] of one layer: the z-scores of its leverages lev [H][N]. */
static void lev_zscore(const double *lev, size_t n, float *scores) {
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < n; i++) mean += lev[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (lev[i] - mean) * (lev[i] - mean);
    double sd = n > 1 ? sqrt(var / (double)(n - 1)) : 0.0;
    if (!(sd >= 1e-6)) sd = 1e-6;
    for (size_t i = 0; i < n; i++) scores[i] = (float)((lev[i] - mean) / sd);
}

/* Layers [layer0, layer0 + n_layers): one parallel run over their (layer,
 * KV head) units, then each layer's z-scores. */
static kvs_status lev_run(lev_state *st, int layer0, const kvs_layer *in, int n_layers, float *scores,
                          kvs_err *err) {
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    const int L = c->shape.n_layers > 0 ? c->shape.n_layers : 1;
    if (n_layers > L)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "leverage: %d layers scored, %d planned", n_layers, L);
    lev_job j = {st, in, layer0, (uint64_t)kvs_part_param(c->m, c->p, "seed", 0)};
    kvs_status rc = kvs_parallel_run(&j, lev_unit, n_layers * H, st->T, "leverage", err);
    if (rc) return rc;
    const size_t n = (size_t)H * N;
    for (int l = 0; l < n_layers; l++) lev_zscore(st->lev + (size_t)l * n, n, scores + (size_t)l * n);
    return KVS_OK;
}

static kvs_status lev_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    return lev_run(state, layer, in, 1, scores, err);
}

static kvs_status lev_layers(void *state, const kvs_layer *in, int n_layers, float *scores,
                             kvs_err *err) {
    return lev_run(state, 0, in, n_layers, scores, err);
}

const kvs_scorer kvs_scorer_leverage = {
    .name = "leverage",
    .needs = 0,
    .queries_wanted = NULL,
    .create = lev_create,
    .score = lev_score,
    .destroy = lev_destroy,
    .score_layers = lev_layers,
};
