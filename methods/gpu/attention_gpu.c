/*
 * attention_gpu.c -- the GPU driver of the attention-score methods: h2o,
 * lookm and meda (methods/h2o.c, the lookm / meda presets and their shared
 * textprior.c are the CPU references: the same parameters, recent window,
 * text boost, merge rule and meda's entropy budgets).
 *
 * What it is: per layer, kernels' attention statistics of all queries
 * (log-sum-exp, column sums GQA-averaged), then on the device h2o's
 * normalisation or the text boost of lookm / meda; meda also reduces the
 * row entropies and copies the L x 6 statistics back once (one sync) to
 * run core's kvs_budget_allocate as the CPU does. Then one top-k over every
 * (layer, head) segment with the recent window kept. The three share one
 * driver because they differ only in those steps.
 * What it is not: no kernels, no CPU fallback.
 */
#include "gpu_driver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { ATT_H2O, ATT_LOOKM, ATT_MEDA } att_kind;

static const kvs_merge merge_of_choice[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE,
                                             KVS_MERGE_WEIGHTED, KVS_MERGE_NONE};

/* meda: layer budgets from the entropies of stats [L][6] (host). */
static kvs_status meda_budgets(kvs_gpu_ctx *g, const double *stats, double *w, int *budgets,
                               char *note, size_t note_n, kvs_err *err) {
    const int L = g->shape.n_layers, N = g->shape.n_tokens;
    int xmodal = 1;
    for (int l = 0; l < L; l++)
        if (stats[6 * l + 3] + stats[6 * l + 4] == 0.0) xmodal = 0;
    double emax = -INFINITY;
    for (int l = 0; l < L; l++) {
        const double *e = stats + 6 * l; /* plain, e_tv, e_vt, n_tv, n_vt */
        w[l] = xmodal ? (e[3] > 0 ? e[1] : 0.0) + (e[4] > 0 ? e[2] : 0.0) : e[0];
        if (!isfinite(w[l]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "meda: layer %d: entropy is not finite (%g)",
                              l, w[l]);
        if (w[l] > emax) emax = w[l];
    }
    double wsum = 0.0;
    for (int l = 0; l < L; l++) wsum += (w[l] = exp(w[l] - emax));
    for (int l = 0; l < L; l++) w[l] /= wsum;
    int bmin = kvs_budget_min(N);
    if (bmin > g->per_layer) bmin = g->per_layer;
    kvs_status st = kvs_budget_allocate(w, L, (int64_t)L * g->per_layer, bmin, N, budgets, err);
    if (st) return kvs_err_prefix(err, "meda: layer budgets");
    if (xmodal)
        snprintf(note, note_n,
                 "meda: cross-modal entropy E_TV (%lld rows) + E_VT (%lld rows) set layer "
                 "budgets",
                 (long long)stats[3], (long long)stats[4]);
    else
        snprintf(note, note_n,
                 "meda: single modality (no cross-modal attention rows), plain mean row "
                 "entropy set layer budgets");
    return KVS_OK;
}

static kvs_status run_attention(kvs_gpu_ctx *g, att_kind kind, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const kvs_gpu_scratch sc = kvs_gpu_workspace_scratch(ws);
    const char *name = g->m->name;
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    int normalize = 0;
    double frac = 0.5, pnorm = 0.0, pmerge = 0.0, ppolicy = 0.0;
    kvs_merge merge = KVS_MERGE_NONE;
    kvs_status st = kvs_gpu_param(g, "recent_frac", &frac, err);
    if (st) return st;
    if (kind == ATT_H2O) {
        if ((st = kvs_gpu_param(g, "normalize", &pnorm, err))) return st;
        normalize = pnorm != 0.0;
    } else if (kind == ATT_MEDA) {
        if ((st = kvs_gpu_param(g, "merge", &pmerge, err))) return st;
        merge = merge_of_choice[(int)pmerge & 3];
    } else {
        if ((st = kvs_gpu_param(g, "text_policy", &ppolicy, err))) return st;
        if ((st = kvs_gpu_param(g, "merge", &pmerge, err))) return st;
        if ((int)ppolicy == 1)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "lookm: text_policy=keep_all keeps every text token and may exceed "
                              "the budget, which breaks the exact-budget plan contract (each layer "
                              "keeps exactly its budget); use text_policy=budget");
        merge = merge_of_choice[(int)pmerge & 3];
    }
    if (!(frac >= 0.0 && frac <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: recent share %g outside [0, 1]", name, frac);
    const uint8_t *mod = NULL;
    if (kind != ATT_H2O && g->c->modality) {
        for (int j = 0; j < N; j++)
            if (g->c->modality[j] > KVS_MOD_AUDIO)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: modality[%d] = %d is not a KVS_MOD_* value (0 text, 1 "
                                  "image, 2 video, 3 audio)",
                                  name, j, (int)g->c->modality[j]);
        if ((st = kvs_gpu_upload_modality(ws, g->c->modality, N, &mod, err))) return st;
    }
    st = kvs_gpu_check_inputs(g, 0, err);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &g->c->layers[l];
        float *s = sc.scores + (size_t)l * H * N; /* [Hkv][N] */
        st = kvs_gpu_attn_lse_at(ws, &ly->q, &ly->k, sc.lse, l, err);
        if (!st) st = kvs_gpu_attn_colsum(ws, &ly->q, &ly->k, sc.lse, s, err);
        if (!st) st = kvs_gpu_score_post(ws, s, H, N, normalize, kind != ATT_H2O, mod, l, err);
        if (!st && kind == ATT_MEDA)
            st = kvs_gpu_attn_entropy_stats(ws, &ly->q, &ly->k, sc.lse, mod, sc.stats + 6 * l, l,
                                            err);
        if (st) return kvs_err_prefix(err, "attention statistics");
    }
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int));       /* [L] */
    double *w = calloc((size_t)(L > 0 ? L : 1), sizeof(double));       /* [L] */
    double *stats = calloc((size_t)(L > 0 ? L : 1) * 6, sizeof(double)); /* [L][6] */
    char note[256] = "";
    if (!budgets || !w || !stats) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", name);
        goto cleanup;
    }
    if (kind == ATT_MEDA) {
        st = kvs_gpu_download(ws, stats, sc.stats, sizeof(double) * 6 * (size_t)L, err);
        if (st) {
            kvs_err_prefix(err, "meda: entropies");
            goto cleanup;
        }
        if ((st = meda_budgets(g, stats, w, budgets, note, sizeof note, err))) goto cleanup;
    } else {
        for (int l = 0; l < L; l++) budgets[l] = g->per_layer;
    }
    long long off = 0;
    for (int l = 0; l < L; l++) {
        const int B = budgets[l];
        int r = (int)floor((double)B * frac);
        if (r < 0) r = 0;
        if (r > B) r = B;
        for (int h = 0; h < H; h++) {
            const long long so = ((long long)l * H + h) * N, oo = off + (long long)h * B;
            if (B >= N)
                kvs_gpu_set_desc(g, l, h, B, so, oo, N, 0, 0, 0, N, 0);
            else
                kvs_gpu_set_desc(g, l, h, B, so, oo, 0, 0, N - r, B - r, N - r, r);
        }
        off += (long long)H * B;
    }
    st = kvs_gpu_select_fill(g, sc.scores, budgets, merge, out, err);
    if (!st && note[0]) snprintf(out->note, sizeof out->note, "%s", note);
cleanup:
    free(budgets);
    free(w);
    free(stats);
    return st;
}

kvs_status kvs_gpu_run_h2o(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    return run_attention(g, ATT_H2O, out, err);
}
kvs_status kvs_gpu_run_lookm(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    return run_attention(g, ATT_LOOKM, out, err);
}
kvs_status kvs_gpu_run_meda(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    return run_attention(g, ATT_MEDA, out, err);
}
