/*
 * flashcache_gpu.c -- the GPU driver of FlashCache (methods/flashcache.c is
 * the CPU reference: the same parameters, budgets and forced ranges).
 *
 * What it is: per layer, kernels' fused DCT low-pass deviation and energies
 * (kvs_gpu_lowpass_layer: the FFT or truncated-basis GEMM route, the
 * workspace's setting); with dba, the L x 4 energies copied back once
 * (one sync) and core's kvs_budget_allocate run as on the CPU; per-layer
 * granularity sums the heads on the device; then one top-k over every
 * (layer, head) segment with the sinks and recent window forced.
 * What it is not: no kernels, no CPU fallback.
 */
#include "gpu_driver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_gpu_run_flashcache(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const kvs_gpu_scratch sc = kvs_gpu_workspace_scratch(ws);
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    const int d = g->shape.head_dim;
    double gamma = 0.0, pdba = 0.0, pgran = 0.0, psinks = 0.0, precent = 0.0;
    kvs_status st = kvs_gpu_param(g, "gamma", &gamma, err);
    if (!st) st = kvs_gpu_param(g, "dba", &pdba, err);
    if (!st) st = kvs_gpu_param(g, "granularity", &pgran, err);
    if (!st) st = kvs_gpu_param(g, "keep_sinks", &psinks, err);
    if (!st) st = kvs_gpu_param(g, "keep_recent", &precent, err);
    if (st) return st;
    const int dba = pdba != 0.0, gran_layer = (int)pgran == 1;
    const int sinks = (int)psinks, recent = (int)precent;
    if (!(gamma > 0.0 && gamma <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: gamma=%g outside (0, 1]", gamma);
    int omega = (int)lround(gamma * (double)N);
    if (omega < 1) omega = 1;
    if (omega > N) omega = N;
    st = kvs_gpu_lowpass_prepare(ws, N, 2 * H * d, omega, err); /* FFT plans or the GEMM basis */
    if (st) return kvs_err_prefix(err, "flashcache");
    st = kvs_gpu_check_inputs(g, 1, err); /* K and V are checked inside the pack kernel */
    if (st) return st;
    for (int l = 0; l < L; l++) {
        st = kvs_gpu_lowpass_layer(ws, &g->c->layers[l], l, omega, sc.scores + (size_t)l * H * N,
                                   sc.energy + 4 * l, err);
        if (st) return kvs_err_prefix(err, "flashcache");
    }
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int));       /* [L] */
    double *R = calloc((size_t)(L > 0 ? L : 1), sizeof(double));       /* [L] */
    double *E = calloc((size_t)(L > 0 ? L : 1) * 4, sizeof(double));   /* [L][4] energies */
    char note[256] = "";
    if (!budgets || !R || !E) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "flashcache: out of memory");
        goto cleanup;
    }
    if (dba) {
        st = kvs_gpu_download(ws, E, sc.energy, sizeof(double) * 4 * (size_t)L, err);
        if (st) {
            kvs_err_prefix(err, "flashcache: energies");
            goto cleanup;
        }
        int zero_layers = 0, first_zero = -1;
        for (int l = 0; l < L; l++) {
            R[l] = 0.0;
            for (int t = 0; t < 2; t++) {
                const double lo = E[4 * l + 2 * t], tot = E[4 * l + 2 * t + 1];
                if (tot > 0.0) {
                    const double r = 1.0 - lo / tot;
                    R[l] += r > 0.0 ? r : 0.0;
                } else {
                    zero_layers++;
                    if (first_zero < 0) first_zero = l;
                }
            }
        }
        int bmin = kvs_budget_min(N);
        if (bmin > g->per_layer) bmin = g->per_layer;
        st = kvs_budget_allocate(R, L, (int64_t)L * g->per_layer, bmin, N, budgets, err);
        if (st) {
            kvs_err_prefix(err, "flashcache: dba");
            goto cleanup;
        }
        if (zero_layers)
            snprintf(note, sizeof note,
                     "flashcache: %d K/V block(s) with zero energy (first in layer %d) got R = 0",
                     zero_layers, first_zero);
    } else {
        for (int l = 0; l < L; l++) budgets[l] = g->per_layer;
    }
    const float *scores = sc.scores;
    if (gran_layer) {
        for (int l = 0; l < L; l++) {
            st = kvs_gpu_head_sum(ws, sc.scores + (size_t)l * H * N, H, N, sc.sums + (size_t)l * N,
                                  err);
            if (st) {
                kvs_err_prefix(err, "flashcache: layer sums");
                goto cleanup;
            }
        }
        scores = sc.sums;
    }
    long long off = 0;
    for (int l = 0; l < L; l++) {
        const int B = budgets[l];
        const int s = sinks < N ? sinks : N;
        const int r = recent < N - s ? recent : N - s;
        for (int h = 0; h < H; h++) {
            const long long so = gran_layer ? (long long)l * N : ((long long)l * H + h) * N;
            const long long oo = off + (long long)h * B;
            if (B >= N) {
                kvs_gpu_set_desc(g, l, h, B, so, oo, N, 0, 0, 0, N, 0);
            } else if (s + r >= B) {
                const int ks = s < B ? s : B, kr = B - ks;
                kvs_gpu_set_desc(g, l, h, B, so, oo, ks, 0, 0, 0, N - kr, kr);
            } else {
                kvs_gpu_set_desc(g, l, h, B, so, oo, s, s, N - r, B - s - r, N - r, r);
            }
        }
        off += (long long)H * B;
    }
    st = kvs_gpu_select_fill(g, scores, budgets, KVS_MERGE_NONE, out, err);
    if (!st) snprintf(out->note, sizeof out->note, "%s", note);
cleanup:
    free(budgets);
    free(R);
    free(E);
    return st;
}
