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
 *   - Logits by one fp32 GEMM per KV head (its G query heads' window rows
 *     against all keys, as core's attention statistics); softmax in fp32
 *     with the row maximum subtracted and a double sum; D per row from
 *     log p = s - max - log z (no per-key log; the official code's
 *     log(p + 1e-10) differs only where p is below ~1e-8, where p log p is
 *     about 0 either way); V from per-column sums and sums of squares in
 *     double (clamped at 0 against rounding).
 *   - Window clamped to min(w, Nq, N - 1); with fewer than 2 window rows
 *     (or B <= w, or L = 1) there is nothing to measure or shape, so every
 *     layer gets B (the note says so). All-zero preferences give equal
 *     shares (kvs_budget_allocate).
 * Cost: Hq * w * N * d per layer (as SnapKV's votes); memory w * N floats
 * plus one KV head's keys in fp32.
 */
#include "kvs_parts.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_cake_measure_ex(const kvs_layer *in, int window, double gamma, double *disp,
                               double *var, float *evict, kvs_err *err) {
    const kvs_view *q = &in->q, *k = &in->k;
    const int N = k->n_tokens, d = k->head_dim, Hkv = k->n_heads, Hq = q->n_heads;
    const int Nq = q->data ? q->n_tokens : 0, w = window;
    *disp = *var = 0.0;
    if (w < 2 || w > Nq || w >= N || Hq < 1 || Hq % Hkv != 0 || q->head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "cake: window %d needs 2 <= w <= Nq=%d and w < N=%d (Hq=%d Hkv=%d)", w,
                          Nq, N, Hq, Hkv);
    const int G = Hq / Hkv, P = N - w, R = G * w; /* prefix keys [0, P); R rows per KV head */
    float *kk = malloc(sizeof(float) * (size_t)N * (size_t)d); /* [N][d] one KV head */
    float *qq = malloc(sizeof(float) * (size_t)R * (size_t)d); /* [G][w][d] its window rows */
    float *a = malloc(sizeof(float) * (size_t)R * (size_t)N);  /* [G][w][N] logits, then probabilities */
    double *sum = malloc(sizeof(double) * 2 * (size_t)N);      /* [2][P] column sums, sums of squares */
    if (!kk || !qq || !a || !sum) {
        free(kk);
        free(qq);
        free(a);
        free(sum);
        return kvs_errorf(err, KVS_ERR_NOMEM, "cake: out of memory for [%d][%d] probabilities", R, N);
    }
    const float scale = 1.0f / sqrtf((float)d);
    double D = 0.0, V = 0.0;
    for (int g = 0; g < Hkv; g++) {
        kvs_view_rows_f32(k, g, 0, N, kk);
        for (int t = 0; t < G; t++) kvs_view_rows_f32(q, g * G + t, Nq - w, w, qq + (size_t)t * w * d);
        /* logits of every window row against every key (the masked ones unused) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, N, d, scale, qq, d, kk, d, 0.0f, a, N);
        for (int r = 0; r < R; r++) {
            const int n_vis = P + r % w + 1; /* row i = r % w sits at position P + i */
            float *ai = a + (size_t)r * N;
            float mx = -INFINITY;
            for (int j = 0; j < n_vis; j++) mx = ai[j] > mx ? ai[j] : mx;
            /* e_j = exp(s_j - mx), z = sum e: over the prefix, sum p log p =
             * (sum e (s - mx)) / z - log z (sum e) / z, with no log per key */
            double z = 0.0, set = 0.0, se = 0.0;
            for (int j = 0; j < n_vis; j++) {
                const float t = ai[j] - mx, e = expf(t);
                ai[j] = e;
                z += e;
                if (j < P) set += (double)e * t, se += e;
            }
            const float inv = (float)(1.0 / z);
            for (int j = 0; j < n_vis; j++) ai[j] *= inv;
            D -= set / z - log(z) * se / z;
        }
        /* variance over the w rows of each prefix column, row by row
         * (sum and sum of squares in double; probabilities are in [0, 1]);
         * the eviction indicator [P] of KV head g: the group mean of
         * mean_i A + gamma * var_i A */
        float *ev = evict ? evict + (size_t)g * P : NULL;
        if (ev)
            for (int j = 0; j < P; j++) ev[j] = 0.0f;
        for (int t = 0; t < G; t++) {
            const float *at = a + (size_t)t * w * N; /* [w][N] of query head g G + t */
            double *s1 = sum, *s2 = sum + P;
            for (int j = 0; j < P; j++) s1[j] = s2[j] = 0.0;
            for (int i = 0; i < w; i++)
                for (int j = 0; j < P; j++) {
                    const double x = at[(size_t)i * N + j];
                    s1[j] += x;
                    s2[j] += x * x;
                }
            double vt = 0.0;
            for (int j = 0; j < P; j++) {
                const double v = (s2[j] - s1[j] * s1[j] / w) / (w - 1);
                vt += v > 0.0 ? v : 0.0;
                if (ev) ev[j] += (float)((s1[j] / w + gamma * (v > 0.0 ? v : 0.0)) / G);
            }
            V += vt;
        }
    }
    free(sum);
    free(kk);
    free(qq);
    free(a);
    if (!isfinite(D) || !isfinite(V))
        return kvs_errorf(err, KVS_ERR_NUMERIC, "cake: dispersion %g or shift %g is not finite", D, V);
    *disp = D;
    *var = V;
    return KVS_OK;
}

kvs_status kvs_cake_measure(const kvs_layer *in, int window, double *disp, double *var,
                            kvs_err *err) {
    return kvs_cake_measure_ex(in, window, 0.0, disp, var, NULL, err);
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
        kvs_status rc = kvs_cake_measure(in, w, &out->cake_disp, &out->cake_var, err);
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
