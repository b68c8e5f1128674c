/*
 * alloc_cake.c -- allocator `cake`: CAKE's layer budgets from each layer's
 * attention preference (spatial dispersion x temporal shift).
 *
 * Paper: CAKE, "Cascading and Adaptive KV Cache Eviction with Layer
 * Preferences", arXiv 2503.12491 (ICLR 2025); official code antgroup/cakekv
 * (read: cake/model/modify_llama.py, llama_attn_forward_cake, and
 * cake/cake_cache.py, CakeprefillKVCache, as mirrored in qtris123/cakekv
 * at commit e6adc5e).
 * Formula, per layer l, with the last w prompt queries (the observation
 * window) of every query head h: A_h[i][j] = softmax_j of row i over the
 * keys it sees (causal inside the window). Over the prefix keys j < N - w:
 *   spatial dispersion  D_l = - sum_{h,i,j} A log A
 *   temporal shift      V_l = sum_{h,j} var_i A_h[i][j]  (unbiased, over the
 *                       w window rows)
 *   preference          P_l = D_l^(1/tau1) * V_l^(1/tau2)
 * Every layer keeps its window w; the rest of the global budget,
 * L * (B - w), is split in proportion to P_l: weights w + L (B - w) P_l /
 * sum P, rounded once by core's kvs_budget_allocate (largest remainder,
 * clamped to [B_min, N], water-filled to the exact L * B).
 * Parameters: window (int, shared with the SnapKV scorer and the window
 * keep rule; absent 32), tau1, tau2 (floats > 0, absent 1: the official
 * configs tune both per model and budget, e.g. Llama-3.1-8B at 1024:
 * 1.6 / 0.4, Mistral-7B: 0.8 / 0.5; 1 / 1 is the plain product).
 * Decisions where the sources are silent or disagree:
 *   - The official code rounds each layer's share on its own and then
 *     adjusts; we round once with the exact global sum (as pyramid).
 *   - CAKE's cascading (budgets re-split while prefilling layer by layer) is
 *     a memory schedule of the prefill; one-shot after the prefill it gives
 *     the same final split, so it is not modelled.
 *   - Logits by fp32 GEMMs of each KV head's G w window rows against its
 *     keys in blocks of 512 (as core's attention statistics); softmax in fp32 with the row
 *     maximum subtracted (core's kvs_attn_softmax_row: float sums within
 *     256 keys, double across); D per row from
 *     log p = s - max - log z (no per-key log; the official code's
 *     log(p + 1e-10) differs only where p is below ~1e-8, where p log p is
 *     about 0 either way); V from per-column sums and sums of squares in
 *     double (clamped at 0 against rounding).
 *   - Window clamped to min(w, Nq, N - 1); with fewer than 2 window rows
 *     (or B <= w, or L = 1) there is nothing to measure or shape, so every
 *     layer gets B (the note says so). All-zero preferences give equal
 *     shares (kvs_budget_allocate).
 * Cost: Hq * w * N * d per layer (as SnapKV's votes), on the shape's
 * threads (kvs_cake_measure_ex); memory [Hq][w][N] logits, [Hq][N - w]
 * indicator shares and per thread 512 keys in fp32 and [2][N - w] doubles.
 */
#include "kvs_parts.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Two parallel runs per layer. Logits: one unit per (KV head g, block of
 * CAKE_KROWS keys) converts its keys to fp32 and multiplies them with the
 * group's G w window rows (one sgemm; the keys are packed once) into the
 * layer's [Hkv][G w][N] logits. Rows: one unit per query head, its w rows'
 * softmax, the row terms of D, the column variances over the w rows (V)
 * and its share of the eviction indicator. Partials go to per-head slots
 * reduced in head order, so the result does not depend on the thread
 * count. */
typedef struct {
    const kvs_view *k;
    const float *qq; /* [Hq][w][d] fp32 window rows (= [Hkv][G w][d]) */
    int N, d, G, w, P, kchunks;
    float scale;
    double gamma;
    float *kbuf;   /* [threads][CAKE_KROWS][d] keys of one block in fp32 */
    float *a;      /* [Hq][w][N] logits, then probabilities */
    double *sum;   /* [threads][2][P] column sums, sums of squares */
    double *dv;    /* [Hq][2] per query head: its D and V terms */
    float *evp;    /* [Hq][P] per query head: its share of the indicator, or NULL */
} cake_job;

enum { CAKE_KROWS = 512 };

static kvs_status cake_logit_unit(void *jp, int tid, int u, kvs_err *err) {
    (void)err;
    cake_job *J = jp;
    const int g = u / J->kchunks, n0 = (u % J->kchunks) * CAKE_KROWS, d = J->d, R = J->G * J->w;
    const int rows = J->N - n0 < CAKE_KROWS ? J->N - n0 : CAKE_KROWS;
    float *kb = J->kbuf + (size_t)tid * CAKE_KROWS * d; /* [rows][d] */
    kvs_view_rows_f32(J->k, g, n0, rows, kb);
    /* logits of every window row against every key (the masked ones unused) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, rows, d, J->scale,
                J->qq + (size_t)g * R * d, d, kb, d, 0.0f, J->a + (size_t)g * R * J->N + n0, J->N);
    return KVS_OK;
}

static kvs_status cake_row_unit(void *jp, int tid, int h, kvs_err *err) {
    (void)err;
    cake_job *J = jp;
    const int N = J->N, w = J->w, P = J->P;
    float *a = J->a + (size_t)h * w * N;                     /* [w][N] */
    double *s1 = J->sum + (size_t)tid * 2 * P, *s2 = s1 + P; /* [P] each */
    /* each row's softmax over the keys it sees (row i sits at position
     * P + i); D -= its sum p log p over the prefix */
    double D = 0.0;
    for (int i = 0; i < w; i++) {
        double plp;
        kvs_attn_softmax_row(a + (size_t)i * N, P + i + 1, P, &plp);
        D -= plp;
    }
    /* variance over the w rows of each prefix column (sum and sum of squares
     * in double; probabilities are in [0, 1]) */
    for (int j = 0; j < P; j++) s1[j] = s2[j] = 0.0;
    for (int i = 0; i < w; i++) {
        const float *ai = a + (size_t)i * N;
        for (int j = 0; j < P; j++) {
            const double x = ai[j];
            s1[j] += x;
            s2[j] += x * x;
        }
    }
    double vt = 0.0;
    float *ev = J->evp ? J->evp + (size_t)h * P : NULL;
    for (int j = 0; j < P; j++) {
        const double v = (s2[j] - s1[j] * s1[j] / w) / (w - 1);
        vt += v > 0.0 ? v : 0.0;
        if (ev) ev[j] = (float)((s1[j] / w + J->gamma * (v > 0.0 ? v : 0.0)) / J->G);
    }
    J->dv[2 * (size_t)h] = D;
    J->dv[2 * (size_t)h + 1] = vt;
    return KVS_OK;
}

kvs_status kvs_cake_measure_ex(const kvs_layer *in, int window, double gamma, double *disp,
                               double *var, float *evict, int threads, kvs_err *err) {
    const kvs_view *q = &in->q, *k = &in->k;
    const int N = k->n_tokens, d = k->head_dim, Hkv = k->n_heads, Hq = q->n_heads;
    const int Nq = q->data ? q->n_tokens : 0, w = window;
    *disp = *var = 0.0;
    if (w < 2 || w > Nq || w >= N || Hq < 1 || Hq % Hkv != 0 || q->head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "cake: window %d needs 2 <= w <= Nq=%d and w < N=%d (Hq=%d Hkv=%d)", w,
                          Nq, N, Hq, Hkv);
    const int G = Hq / Hkv, P = N - w; /* prefix keys [0, P) */
    const int kchunks = (N + CAKE_KROWS - 1) / CAKE_KROWS;
    const int nt = kvs_parallel_threads(threads, Hkv * kchunks > Hq ? Hkv * kchunks : Hq);
    cake_job J = {.k = k, .N = N, .d = d, .G = G, .w = w, .P = P, .kchunks = kchunks,
                  .scale = 1.0f / sqrtf((float)d), .gamma = gamma};
    float *qq = malloc(sizeof(float) * (size_t)Hq * w * d);                /* [Hq][w][d] */
    J.qq = qq;
    J.kbuf = malloc(sizeof(float) * (size_t)nt * CAKE_KROWS * d);          /* [nt][KROWS][d] */
    J.a = malloc(sizeof(float) * (size_t)Hq * w * N);                      /* [Hq][w][N] */
    J.sum = malloc(sizeof(double) * (size_t)nt * 2 * P);                   /* [nt][2][P] */
    J.dv = malloc(sizeof(double) * 2 * (size_t)Hq);                        /* [Hq][2] */
    J.evp = evict ? malloc(sizeof(float) * (size_t)Hq * P) : NULL;         /* [Hq][P] */
    kvs_status rc = KVS_OK;
    if (!qq || !J.kbuf || !J.a || !J.sum || !J.dv || (evict && !J.evp))
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "cake: out of memory for [%d][%d][%d] probabilities",
                        Hq, w, N);
    if (!rc) {
        for (int h = 0; h < Hq; h++) kvs_view_rows_f32(q, h, Nq - w, w, qq + (size_t)h * w * d);
        rc = kvs_parallel_run(&J, cake_logit_unit, Hkv * kchunks, nt, "cake: logits", err);
    }
    if (!rc) rc = kvs_parallel_run(&J, cake_row_unit, Hq, nt, "cake", err);
    if (!rc) {
        double D = 0.0, V = 0.0;
        for (int h = 0; h < Hq; h++) D += J.dv[2 * (size_t)h], V += J.dv[2 * (size_t)h + 1];
        /* the eviction indicator [P] of KV head g: the group mean of
         * mean_i A + gamma * var_i A, summed over the group in head order */
        if (evict)
            for (int g = 0; g < Hkv; g++) {
                float *ev = evict + (size_t)g * P;
                for (int j = 0; j < P; j++) ev[j] = 0.0f;
                for (int t = 0; t < G; t++) {
                    const float *e = J.evp + (size_t)(g * G + t) * P;
                    for (int j = 0; j < P; j++) ev[j] += e[j];
                }
            }
        if (!isfinite(D) || !isfinite(V))
            rc = kvs_errorf(err, KVS_ERR_NUMERIC, "cake: dispersion %g or shift %g is not finite",
                            D, V);
        else
            *disp = D, *var = V;
    }
    free(qq);
    free(J.kbuf);
    free(J.a);
    free(J.sum);
    free(J.dv);
    free(J.evp);
    return rc;
}

kvs_status kvs_cake_measure(const kvs_layer *in, int window, double *disp, double *var,
                            kvs_err *err) {
    return kvs_cake_measure_ex(in, window, 0.0, disp, var, NULL, 1, err);
}

kvs_status kvs_cake_budgets(const double *disp, const double *var, int L, int N, int per_layer,
                            int window, double tau1, double tau2, int *budgets, kvs_err *err) {
    if (!disp || !var || L < 1 || N < 1 || per_layer < 1 || per_layer > N || !(tau1 > 0.0) ||
        !(tau2 > 0.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "cake: bad input L=%d N=%d B=%d tau1=%g tau2=%g", L,
                          N, per_layer, tau1, tau2);
    const int w = window < 0 ? 0 : window;
    if (L == 1 || per_layer <= w) {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
        return KVS_OK;
    }
    double *wts = malloc(sizeof(double) * (size_t)L); /* [L] */
    if (!wts) return kvs_errorf(err, KVS_ERR_NOMEM, "cake: out of memory");
    double sum = 0.0;
    for (int l = 0; l < L; l++) {
        if (!(disp[l] >= 0.0) || !(var[l] >= 0.0) || !isfinite(disp[l]) || !isfinite(var[l])) {
            free(wts);
            return kvs_errorf(err, KVS_ERR_NUMERIC, "cake: layer %d: dispersion %g / shift %g", l,
                              disp[l], var[l]);
        }
        wts[l] = pow(disp[l], 1.0 / tau1) * pow(var[l], 1.0 / tau2);
        sum += wts[l];
    }
    const double rest = (double)L * (double)(per_layer - w);
    for (int l = 0; l < L; l++) wts[l] = (double)w + (sum > 0.0 ? rest * wts[l] / sum : rest / L);
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    kvs_status rc = kvs_budget_allocate(wts, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    free(wts);
    return rc ? kvs_err_prefix(err, "cake") : KVS_OK;
}

/* The window actually measured: min(w, Nq, N - 1). */
static int cake_window(const kvs_part_ctx *c) {
    int w = (int)kvs_part_param(c->m, c->p, "window", 32);
    if (w > c->shape.n_queries) w = c->shape.n_queries;
    if (w > c->shape.n_tokens - 1) w = c->shape.n_tokens - 1;
    return w;
}

static int cake_queries(const kvs_method *m, const kvs_params *p, int N) {
    const int w = (int)kvs_part_param(m, p, "window", 32);
    return w < N ? w : N;
}

static kvs_status cake_measure(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                               kvs_layer_stats *out, kvs_err *err) {
    const int w = cake_window(c);
    if (w >= 2) {
        kvs_status rc = kvs_cake_measure_ex(in, w, 0.0, &out->cake_disp, &out->cake_var, NULL,
                                            c->shape.threads, err);
        if (rc) return kvs_err_prefix(err, "layer %d", layer);
    }
    out->have |= KVS_STAT_CAKE;
    return KVS_OK;
}

static kvs_status cake_allocate(const kvs_part_ctx *c, int per_layer, int *budgets, kvs_err *err) {
    const int L = c->shape.n_layers, w = cake_window(c);
    if (!c->stats)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "cake: no layer statistics (not in a composition)");
    if (w < 2) {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
        if (c->note)
            snprintf(c->note, 256, "cake: fewer than 2 window queries (w=%d): uniform budgets", w);
        return KVS_OK;
    }
    double *dv = malloc(sizeof(double) * 2 * (size_t)L); /* [2][L] */
    if (!dv) return kvs_errorf(err, KVS_ERR_NOMEM, "cake: out of memory");
    for (int l = 0; l < L; l++) dv[l] = c->stats[l].cake_disp, dv[L + l] = c->stats[l].cake_var;
    kvs_status rc = kvs_cake_budgets(dv, dv + L, L, c->shape.n_tokens, per_layer, w,
                                     kvs_part_param(c->m, c->p, "tau1", 1.0),
                                     kvs_part_param(c->m, c->p, "tau2", 1.0), budgets, err);
    free(dv);
    return rc;
}

const kvs_allocator kvs_alloc_cake = {
    .name = "cake",
    .allocate = cake_allocate,
    .stats = KVS_STAT_CAKE,
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = cake_queries,
    .measure = cake_measure,
};
