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
 *   spatial dispersion  D_l = - sum_{h,i,j} A log(A + 1e-10)
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
 *   - Sums in double; probabilities from fp32 logits (core's convention).
 *   - Window clamped to min(w, Nq, N - 1); with fewer than 2 window rows
 *     (or B <= w, or L = 1) there is nothing to measure or shape, so every
 *     layer gets B (the note says so). All-zero preferences give equal
 *     shares (kvs_budget_allocate).
 * Cost: Hq * w * N * d per layer (as SnapKV's votes); memory w * N floats
 * plus one KV head's keys in fp32.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_cake_measure(const kvs_layer *in, int window, double *disp, double *var,
                            kvs_err *err) {
    const kvs_view *q = &in->q, *k = &in->k;
    const int N = k->n_tokens, d = k->head_dim, Hkv = k->n_heads, Hq = q->n_heads;
    const int Nq = q->data ? q->n_tokens : 0, w = window;
    *disp = *var = 0.0;
    if (w < 2 || w > Nq || w >= N || Hq < 1 || Hq % Hkv != 0 || q->head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "cake: window %d needs 2 <= w <= Nq=%d and w < N=%d (Hq=%d Hkv=%d)", w,
                          Nq, N, Hq, Hkv);
    const int G = Hq / Hkv, P = N - w; /* prefix keys [0, P) */
    float *kk = malloc(sizeof(float) * (size_t)N * (size_t)d); /* [N][d] one KV head */
    float *qq = malloc(sizeof(float) * (size_t)w * (size_t)d); /* [w][d] */
    float *a = malloc(sizeof(float) * (size_t)w * (size_t)N);  /* [w][N] probabilities */
    if (!kk || !qq || !a) {
        free(kk);
        free(qq);
        free(a);
        return kvs_errorf(err, KVS_ERR_NOMEM, "cake: out of memory for [%d][%d] probabilities", w, N);
    }
    const float scale = 1.0f / sqrtf((float)d);
    double D = 0.0, V = 0.0;
    for (int g = 0; g < Hkv; g++) {
        kvs_view_rows_f32(k, g, 0, N, kk);
        for (int h = g * G; h < (g + 1) * G; h++) {
            kvs_view_rows_f32(q, h, Nq - w, w, qq);
            for (int i = 0; i < w; i++) {
                const int n_vis = P + i + 1; /* row i sits at position P + i */
                float *ai = a + (size_t)i * N;
                const float *qi = qq + (size_t)i * d;
                float mx = -INFINITY;
                for (int j = 0; j < n_vis; j++) {
                    const float *kj = kk + (size_t)j * d;
                    float s = 0.0f;
                    for (int c = 0; c < d; c++) s += qi[c] * kj[c];
                    ai[j] = s * scale;
                    if (ai[j] > mx) mx = ai[j];
                }
                double z = 0.0;
                for (int j = 0; j < n_vis; j++) z += exp((double)ai[j] - mx);
                for (int j = 0; j < n_vis; j++) ai[j] = (float)(exp((double)ai[j] - mx) / z);
                for (int j = 0; j < P; j++) D -= (double)ai[j] * log((double)ai[j] + 1e-10);
            }
            for (int j = 0; j < P; j++) {
                double m = 0.0, s2 = 0.0;
                for (int i = 0; i < w; i++) m += a[(size_t)i * N + j];
                m /= w;
                for (int i = 0; i < w; i++) {
                    const double e = a[(size_t)i * N + j] - m;
                    s2 += e * e;
                }
                V += s2 / (w - 1);
            }
        }
    }
    free(kk);
    free(qq);
    free(a);
    if (!isfinite(D) || !isfinite(V))
        return kvs_errorf(err, KVS_ERR_NUMERIC, "cake: dispersion %g or shift %g is not finite", D, V);
    *disp = D;
    *var = V;
    return KVS_OK;
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
