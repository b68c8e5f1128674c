/*
 * pick_critical.c -- pick rule `critical`: CriticalKV's two-stage selection,
 * the scorer's ranking refined by how much each value moves the layer's
 * output through the output projection W_o.
 *
 * Paper: CriticalKV, "Identify Critical KV Cache in LLM Inference from an
 * Output Perturbation Perspective", arXiv 2502.03805; code read: kvpress
 * CriticalKVPress / CriticalAdaKVPress (kvpress/presses/criticalkv_press.py,
 * kvpress 0.5.5 wheel).
 * Formula, for one KV head h with pick budget k among the candidates
 * [lo, hi) and the scorer's scores s:
 *   w_j = mean over the G query heads i of h of ||W_o^i v_j||_1, with
 *         W_o^i the [E][d] slice of head i (observe, once per layer);
 *   stage 1: k1 = floor(first_stage_ratio * k), at least 1 when the ratio
 *         is > 0, tokens by s alone (ties: lower index);
 *   stage 2: the other k - k1 by r_j = (s_j + critical_epsilon) * w_j among
 *         the rest (ties: lower index).
 * Parameters: first_stage_ratio (float in [0, 1], absent 0.5),
 * critical_epsilon (float >= 0, absent 1e-4): kvpress's defaults.
 * Decisions:
 *   - The stage budgets come from the pick budget k, i.e. the layer budget
 *     less the protected sinks / window (kvpress computes them from the
 *     whole n_kept, whose SnapKV window is forced by its score); with the
 *     adakv head allocator k is the head's own share, as kvpress's
 *     CriticalAdaKV splits each head's budget.
 *   - r is clamped to the finite floats so that a stage-1 token (+inf
 *     here, kvpress's finfo.max) always outranks it.
 *   - Scores are used as the scorer gives them: the product is meant for
 *     non-negative attention-like scores (kvpress's use); a negative score
 *     (knorm, keydiff) is not refused.
 * Needs W_o (KVS_NEED_W_O; kvs_compress refuses a view without it).
 * Cost per layer: Hq N E d multiply-adds (sgemm, blocks of 128 tokens) and
 * Hq E d floats of scratch; the pick is two top-k of N.
 */
#include "kvs_parts.h"

#include <cblas.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>

enum { BLOCK = 128 }; /* tokens per sgemm block */

kvs_status kvs_critical_wo_norms(const kvs_layer *in, int threads, float *wnorm, kvs_err *err) {
    (void)threads; /* BLAS threads itself */
    const kvs_view *v = &in->v, *wo = &in->wo;
    const int H = v->n_heads, N = v->n_tokens, d = v->head_dim, Hq = wo->n_heads,
              E = wo->n_tokens;
    if (!wo->data || Hq < H || Hq % H != 0 || wo->head_dim != d || E < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "W_o [%d][%d][%d] does not match V [Hkv=%d][N=%d][d=%d] (need [Hq][E][d], "
                          "Hq a multiple of Hkv)",
                          Hq, E, wo->head_dim, H, N, d);
    const int G = Hq / H;
    float *vrows = malloc(sizeof(float) * (size_t)N * d);   /* [N][d] */
    float *w = malloc(sizeof(float) * (size_t)E * d);       /* [E][d] */
    float *prod = malloc(sizeof(float) * (size_t)BLOCK * E); /* [BLOCK][E] */
    double *acc = malloc(sizeof(double) * (size_t)N);        /* [N] */
    if (!vrows || !w || !prod || !acc) {
        free(vrows), free(w), free(prod), free(acc);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for W_o norms (N=%d E=%d d=%d)", N,
                          E, d);
    }
    for (int h = 0; h < H; h++) {
        kvs_view_rows_f32(v, h, 0, N, vrows);
        for (int j = 0; j < N; j++) acc[j] = 0.0;
        for (int g = 0; g < G; g++) {
            kvs_view_rows_f32(wo, h * G + g, 0, E, w);
            for (int j0 = 0; j0 < N; j0 += BLOCK) {
                const int nb = N - j0 < BLOCK ? N - j0 : BLOCK;
                /* prod [nb][E] = V rows [nb][d] x W^T [d][E] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, E, d, 1.0f,
                            vrows + (size_t)j0 * d, d, w, d, 0.0f, prod, E);
                for (int j = 0; j < nb; j++) {
                    const float *p = prod + (size_t)j * E;
                    double s = 0.0;
                    for (int o = 0; o < E; o++) s += fabsf(p[o]);
                    acc[j0 + j] += s;
                }
            }
        }
        for (int j = 0; j < N; j++) wnorm[(size_t)h * N + j] = (float)(acc[j] / G);
    }
    free(vrows), free(w), free(prod), free(acc);
    return KVS_OK;
}

static kvs_status critical_observe(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                                   float *aux, kvs_err *err) {
    (void)layer;
    if (!in->wo.data)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "the critical pick needs the layer's output projection W_o; the view "
                          "has none");
    return kvs_critical_wo_norms(in, c->shape.threads, aux, err);
}

static kvs_status critical_pick(const kvs_part_ctx *c, const float *scores, int lo, int hi, int k,
                                kvs_pick_ws *ws, int32_t *out, kvs_err *err) {
    if (!ws->aux)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "critical pick: no W_o norms (observe not run)");
    const double f = kvs_part_param(c->m, c->p, "first_stage_ratio", 0.5);
    const double eps = kvs_part_param(c->m, c->p, "critical_epsilon", 1e-4);
    const int n = hi - lo;
    int k1 = (int)floor(f * k + 1e-9);
    if (f > 0 && k1 < 1) k1 = 1;
    if (k1 > k) k1 = k;
    float *r = malloc(sizeof(float) * (size_t)n); /* [n] stage-2 ranking */
    if (!r) return kvs_errorf(err, KVS_ERR_NOMEM, "critical pick: out of memory (n = %d)", n);
    for (int i = 0; i < n; i++) {
        double x = ((double)scores[lo + i] + eps) * (double)ws->aux[lo + i];
        if (x > FLT_MAX) x = FLT_MAX;
        if (x < -FLT_MAX) x = -FLT_MAX;
        r[i] = (float)x;
    }
    kvs_status rc = kvs_topk_indices(scores + lo, n, k1, ws->ibuf, err); /* stage 1 */
    if (!rc) {
        for (int i = 0; i < k1; i++) r[ws->ibuf[i]] = INFINITY;
        rc = kvs_topk_indices(r, n, k, out, err); /* stage 1 (inf) + the best k - k1 of r */
    }
    free(r);
    if (rc) return rc;
    if (lo)
        for (int i = 0; i < k; i++) out[i] += lo;
    return KVS_OK;
}

const kvs_pick_rule kvs_pick_critical = {
    .name = "critical",
    .pick = critical_pick,
    .needs = KVS_NEED_W_O,
    .observe = critical_observe,
};
