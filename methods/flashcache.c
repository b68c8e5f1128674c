/*
 * flashcache.c -- FlashCache: frequency-domain outlier-KV selection with
 * dynamic budget allocation (the seed paper's method; CPU reference).
 *
 * Spec (methods.md, "FlashCache"), per layer l, KV head h, channel c:
 *  1. Transform: orthonormal DCT-II of the column x[n] = K[h][n][c] (and V)
 *     along tokens, X[m] = a_m sum_n x[n] cos(pi (2n+1) m / (2N)).
 *  2. Low-pass: omega = max(1, round(gamma * N)); keep X[m], m < omega.
 *  3. Base: orthonormal DCT-III of the filtered coefficients: K_base, V_base.
 *  4. Deviation: Dev_h[n] = mean_c (K - K_base)^2 + mean_c (V - V_base)^2.
 *  5. Select: per KV head the B_l tokens with the largest Dev_h (ties: lower
 *     index). granularity=layer sums Dev_h over heads: one set per layer.
 *  6. DBA (default on): R^l = R_K^l + R_V^l, R_K = 1 - ||X_K[m<omega]||^2 /
 *     ||K||^2 over all heads and channels of the layer; budgets proportional
 *     to R^l via kvs_budget_allocate (largest remainder, clamped to
 *     [B_min, N], water-filled to the exact total L * per_layer). dba=false:
 *     every layer gets per_layer.
 *  7. keep_sinks / keep_recent (default 0): first s / last r tokens forced in.
 * No queries, no attention, no modality.
 *
 * Parameters: gamma (float, 0.2, (0, 1]), dba (bool, true),
 *   granularity (enum head|layer, head), keep_sinks (int, 0), keep_recent
 *   (int, 0).
 * Decisions the spec left open:
 *   - R_K = 1 - ||X_low||^2 / ||K||^2 is computed as ||X_high||^2 /
 *     (||X_low||^2 + ||X_high||^2), both by Parseval: ||X_low||^2 summed from
 *     the coefficients m < omega, ||X_high||^2 = ||K - K_base||^2 summed from
 *     the residual the deviation needs anyway (one pass less, and no
 *     cancellation in 1 - lo/tot when a layer is smooth). Sums in double
 *     per column; R_K is in [0, 1] by construction. A layer whose
 *     K (or V) has zero energy gets R_K = 0 (R_V = 0) and the plan note says
 *     so; if every R^l is 0 the budgets are equal shares.
 *   - B_min = min(kvs_budget_min(N), per_layer), so a budget below 1% of N
 *     (e.g. tokens=1) is still feasible; B_max = N.
 *   - Forced tokens (keep_sinks, keep_recent) count in the layer's budget.
 *     s_eff = min(s, N), r_eff = min(r, N - s_eff). If s_eff + r_eff >= B_l,
 *     the kept set is the first min(s_eff, B_l) tokens then the LAST remaining
 *     tokens of the recent window (sinks win over recent; newest recent first).
 *     Otherwise the other B_l - s_eff - r_eff are the top Dev of the middle.
 *   - gamma's lower bound is declared as 1e-9 (the parameter range is
 *     inclusive); any gamma below 0.5 / N already gives omega = 1.
 *   - Dev is accumulated in fp32 per token from an fp32 transform; a Dev that
 *     is not finite (overflow in K^2) is KVS_ERR_NUMERIC naming layer/head.
 * Memory: observe keeps Dev [L][Hkv][N] and four double energies per layer;
 * each worker's DCT plan holds one head's [d][N] permuted columns plus one
 * L2-sized column group's spectrum and base, reused for every head and
 * layer. The transform is kvs_dct_lowpass_sqres (kernels/dct.h: Makhoul's
 * algorithm on FFTW real FFTs, fused with the low-pass, the energies and the
 * squared residual; bit for bit the unfused DCT-II / zeroing / DCT-III).
 * FFTW plans are made once in create() (kernels/dct_plan.c makes FFTW's planner
 * thread-safe once per process).
 * Threads: observe gathers layers (their memory stays valid until select)
 * and transforms them C at a time (C ~ 8 units per worker / (2 Hkv), at
 * least 1: Gemma 3's one KV head gives two units a layer, and a join after
 * every layer cost more than the imbalance of one run) through core's
 * kvs_parallel_run, each worker with its own plan; a unit writes only its
 * own share of Dev and its own energies; Dev = K share + V share per token
 * and the energies are summed over heads in index order afterwards, so the
 * plan is bit-identical for any thread count.
 * Speed: GCC is asked for -O3 here (the residual loops are memory-bound
 * streams GCC's -O2 cost model leaves scalar); no reassociation is enabled,
 * so results do not depend on it.
 * What it is not: no GPU path here (kernels/), no GEMM route.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "kvsieve_methods.h"

#include "dct.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { P_GAMMA = 0, P_DBA, P_GRAN, P_SINKS, P_RECENT };
enum { GRAN_HEAD = 0, GRAN_LAYER = 1 };
enum { FC_UNITS_PER_WORKER = 8 };

static const kvs_param_def fc_params[] = {
    {"gamma", KVS_PARAM_FLOAT, 0.2, 1e-9, 1.0, NULL,
     "low-pass cut-off in (0, 1]: omega = max(1, round(gamma * N)) DCT coefficients kept"},
    {"dba", KVS_PARAM_BOOL, 1, 0, 1, NULL,
     "dynamic budget allocation: layer budgets proportional to high-band energy share R^l"},
    {"granularity", KVS_PARAM_ENUM, GRAN_HEAD, 0, 1, "head|layer",
     "select per KV head, or one set per layer from Dev summed over heads"},
    {"keep_sinks", KVS_PARAM_INT, 0, 0, 2147483647.0, NULL,
     "always keep the first s tokens (ablation; counted in the budget)"},
    {"keep_recent", KVS_PARAM_INT, 0, 0, 2147483647.0, NULL,
     "always keep the last r tokens (ablation; counted in the budget)"},
};

/* Per-thread transform workspace (a DCT plan owns scratch, so one each; it
 * holds the block, its spectrum and its base, see kvs_dct_lowpass_sqres). */
typedef struct {
    kvs_dct_plan *plan;
    float *acc;  /* [N] sum over channels of the squared residual */
} fc_work;

typedef struct {
    kvs_shape shape;
    double gamma;
    int omega;
    int dba, gran, sinks, recent;
    int n_work;            /* workers: kvs_parallel_threads(threads, 2 Hkv C) */
    fc_work *work;         /* [n_work] */
    int chunk;             /* C: layers transformed per parallel run */
    int first, pending;    /* the run being gathered: layers [first, first + pending) */
    kvs_view *views;       /* [C][2] their K and V views (valid until select) */
    float *dev;            /* [L][Hkv][N] deviation per token */
    float *dev_part;       /* [C][Hkv][2][N] a run's per-(layer, head, K|V) share of dev */
    double *e_head;        /* [C][Hkv][2][2] its energies per head: K/V x high/total */
    double *e_high, *e_tot; /* [L][2] energies (0: K, 1: V), high band and total */
    unsigned char *seen;   /* [L] */
} fc_state;

static void fc_work_free(fc_work *w) {
    kvs_dct_plan_destroy(w->plan);
    free(w->acc);
}

static void fc_destroy(void *state) {
    fc_state *st = state;
    if (!st) return;
    for (int i = 0; st->work && i < st->n_work; i++) fc_work_free(&st->work[i]);
    free(st->work);
    free(st->views);
    free(st->dev);
    free(st->dev_part);
    free(st->e_head);
    free(st->e_high);
    free(st->e_tot);
    free(st->seen);
    free(st);
}

static kvs_status fc_create(const kvs_params *p, const kvs_shape *s, void **state,
                            kvs_err *err) {
    assert(p->n == (int)(sizeof fc_params / sizeof fc_params[0]));
    kvs_status rc = KVS_OK;
    const int N = s->n_tokens, L = s->n_layers, H = s->n_kv_heads, d = s->head_dim;
    const double gamma = p->v[P_GAMMA];
    if (!(gamma > 0.0 && gamma <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: gamma=%g outside (0, 1]", gamma);
    if (N < 1 || L < 1 || H < 1 || d < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: bad shape N=%d L=%d Hkv=%d d=%d",
                          N, L, H, d);
    fc_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "flashcache: out of memory");
    st->shape = *s;
    st->gamma = gamma;
    st->omega = (int)lround(gamma * (double)N);
    if (st->omega < 1) st->omega = 1;
    if (st->omega > N) st->omega = N;
    st->dba = p->v[P_DBA] != 0;
    st->gran = (int)p->v[P_GRAN];
    st->sinks = (int)p->v[P_SINKS];
    st->recent = (int)p->v[P_RECENT];
    /* Layers per run: about FC_UNITS_PER_WORKER units per worker, so that
     * few-head models (Gemma 3: one KV head, two units a layer) do not wait at
     * a join after every layer; many-head models run layer by layer. */
    const int want = FC_UNITS_PER_WORKER * kvs_parallel_threads(s->threads, 2 * H * L);
    st->chunk = want / (2 * H) < 1 ? 1 : (want / (2 * H) > L ? L : want / (2 * H));
    st->n_work = kvs_parallel_threads(s->threads, 2 * H * st->chunk);
    st->work = calloc((size_t)st->n_work, sizeof(fc_work));
    st->views = calloc((size_t)st->chunk * 2, sizeof(kvs_view));
    st->dev = malloc(sizeof(float) * (size_t)L * (size_t)H * (size_t)N);
    st->dev_part = malloc(sizeof(float) * 2 * (size_t)st->chunk * (size_t)H * (size_t)N);
    st->e_head = calloc((size_t)st->chunk * (size_t)H * 4, sizeof(double));
    st->e_high = calloc((size_t)L * 2, sizeof(double));
    st->e_tot = calloc((size_t)L * 2, sizeof(double));
    st->seen = calloc((size_t)L, 1);
    if (!st->work || !st->views || !st->dev || !st->dev_part || !st->e_head || !st->e_high ||
        !st->e_tot || !st->seen) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "flashcache: out of memory (L=%d Hkv=%d N=%d d=%d)",
                        L, H, N, d);
        goto cleanup;
    }
    for (int i = 0; i < st->n_work; i++) {
        fc_work *w = &st->work[i];
        /* plans come from dct.c's process-wide FFTW plan cache: planned once
         * per length, not per request */
        rc = kvs_dct_plan_create_opts(N, d, st->omega, KVS_DCT_AUTO, &w->plan, err);
        if (rc) {
            kvs_err_prefix(err, "flashcache");
            goto cleanup;
        }
        w->acc = malloc(sizeof(float) * (size_t)N);
        if (!w->acc) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM,
                            "flashcache: out of memory for worker %d (N=%d d=%d)", i, N, d);
            goto cleanup;
        }
    }
    *state = st;
    st = NULL;
cleanup:
    fc_destroy(st);
    return rc;
}

/* One head of K or V: transform, energies, low-pass base, add the mean
 * squared residual of every token to dev[0..N). */
static kvs_status fc_column_block(const fc_state *st, fc_work *w, const kvs_view *v, int h,
                                  float *dev /* [N] */,
                                  double *e_high, double *e_tot, kvs_err *err) {
    const int N = st->shape.n_tokens, d = st->shape.head_dim, omega = st->omega;
    /* DCT-II, lo = ||X[m < omega]||^2, base = DCT-III of the low band,
     * acc[n] = sum_c (x - base)^2, read from the view in L2-sized column
     * groups (kernels/dct.h). */
    double lo = 0.0;
    float *acc = w->acc; /* [N] */
    kvs_status rc = kvs_dct_lowpass_sqres(w->plan, v, h, omega, &lo, acc, err);
    if (rc) return rc;
    /* High band by Parseval: ||X[m >= omega]||^2 = ||x - base||^2. */
    double hi = 0.0;
    for (int n = 0; n < N; n++) hi += acc[n];
    *e_high += hi;
    *e_tot += lo + hi;
    const float inv_d = 1.0f / (float)d;
    for (int n = 0; n < N; n++) dev[n] += acc[n] * inv_d;
    return KVS_OK;
}

/* A run's unit for kvs_parallel_run (the job is the state): unit u is, in
 * the run's layer u / (2 Hkv), head (u / 2) % Hkv of K (u even) or V (u odd),
 * so a one-head layer still keeps two workers busy. */
static kvs_status fc_unit(void *job, int tid, int u, kvs_err *err) {
    fc_state *st = job;
    const int N = st->shape.n_tokens, H = st->shape.n_kv_heads;
    const int slot = u / (2 * H), h = (u / 2) % H, t = u % 2;
    assert(tid >= 0 && tid < st->n_work && slot < st->pending);
    float *part = st->dev_part + (int64_t)u * N;     /* [N] */
    double *eh = st->e_head + 2 * (int64_t)u;        /* high, total */
    memset(part, 0, sizeof(float) * (size_t)N);
    eh[0] = eh[1] = 0.0;
    const kvs_status rc =
        fc_column_block(st, &st->work[tid], &st->views[2 * slot + t], h, part, &eh[0], &eh[1], err);
    if (rc)
        kvs_err_prefix(err, "flashcache: layer %d head %d %s", st->first + slot, h, t ? "V" : "K");
    return rc;
}

/* Transform the gathered layers in one parallel run, then per layer: Dev =
 * K share + V share and the energies summed over heads, in index order
 * whatever the thread count (so the plan is bit-identical for any). */
static kvs_status fc_flush(fc_state *st, kvs_err *err) {
    const int N = st->shape.n_tokens, H = st->shape.n_kv_heads;
    /* an error names the failing unit with the lowest index, whatever the
     * thread count (kvs_parallel_run) */
    kvs_status rc =
        kvs_parallel_run(st, fc_unit, 2 * H * st->pending, st->n_work, "flashcache", err);
    if (rc) return rc;
    for (int slot = 0; slot < st->pending; slot++) {
        const int layer = st->first + slot;
        for (int h = 0; h < H; h++) {
            float *dev = st->dev + ((int64_t)layer * H + h) * N; /* [N] */
            const float *pk = st->dev_part + ((int64_t)slot * H + h) * 2 * N, *pv = pk + N;
            for (int n = 0; n < N; n++) {
                dev[n] = pk[n] + pv[n];
                if (!isfinite(dev[n]))
                    return kvs_errorf(err, KVS_ERR_NUMERIC,
                                      "flashcache: layer %d head %d: deviation of token %d is "
                                      "not finite (values too large for fp32 squares)",
                                      layer, h, n);
            }
        }
        double *ehi = st->e_high + 2 * (int64_t)layer, *etot = st->e_tot + 2 * (int64_t)layer;
        const double *eh = st->e_head + (int64_t)slot * H * 4; /* [H][2][2] */
        ehi[0] = ehi[1] = etot[0] = etot[1] = 0.0;
        for (int h = 0; h < H; h++)
            for (int t = 0; t < 2; t++) {
                ehi[t] += eh[4 * h + 2 * t];
                etot[t] += eh[4 * h + 2 * t + 1];
            }
        st->seen[layer] = 1;
    }
    st->first += st->pending;
    st->pending = 0;
    return KVS_OK;
}

/* Layers are gathered (their memory stays valid until select: kvs_method)
 * and transformed st->chunk at a time, and at the last layer. */
static kvs_status fc_observe(void *state, int layer, const kvs_layer *in,
                             const uint8_t *modality, kvs_err *err) {
    fc_state *st = state;
    const int N = st->shape.n_tokens, H = st->shape.n_kv_heads, d = st->shape.head_dim;
    const int L = st->shape.n_layers;
    if (layer < 0 || layer >= L)
        return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: layer %d out of range [0, %d)",
                          layer, L);
    if (layer != st->first + st->pending)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "flashcache: layer %d observed out of order (expected layer %d)", layer,
                          st->first + st->pending);
    const kvs_view *kv[2] = {&in->k, &in->v};
    const char *nm[2] = {"K", "V"};
    for (int t = 0; t < 2; t++) {
        if (kv[t]->n_tokens != N || kv[t]->n_heads != H || kv[t]->head_dim != d)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "flashcache: layer %d: %s is [%d][%d][%d] but the shape says "
                              "[%d][%d][%d]",
                              layer, nm[t], kv[t]->n_heads, kv[t]->n_tokens, kv[t]->head_dim, H,
                              N, d);
        if (kv[t]->device != KVS_HOST)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "flashcache: layer %d: %s is in device memory; the CPU reference "
                              "needs host memory",
                              layer, nm[t]);
    }
    st->views[2 * st->pending] = in->k;
    st->views[2 * st->pending + 1] = in->v;
    st->pending++;
    if (st->pending == st->chunk || layer == L - 1) return fc_flush(st, err);
    return KVS_OK;
}

/* Keep B of the N scores sc[0..N) into row[0..B), sorted, honouring the
 * forced sinks/recent (see the header comment). */
static kvs_status fc_pick(const fc_state *st, const float *sc /* [N] */, int B,
                          int32_t *row /* [B] */, kvs_err *err) {
    const int N = st->shape.n_tokens;
    if (B >= N) {
        for (int i = 0; i < N; i++) row[i] = i;
        return KVS_OK;
    }
    const int s = st->sinks < N ? st->sinks : N;
    const int r = st->recent < N - s ? st->recent : N - s;
    if (s + r >= B) {
        const int ks = s < B ? s : B, kr = B - ks; /* kr <= r */
        for (int i = 0; i < ks; i++) row[i] = i;
        for (int i = 0; i < kr; i++) row[ks + i] = N - kr + i;
        return KVS_OK;
    }
    const int M = N - s - r, top = B - s - r; /* middle [s, N - r), 0 < top < M */
    for (int i = 0; i < s; i++) row[i] = i;
    kvs_status rc = kvs_topk_indices(sc + s, M, top, row + s, err);
    if (rc) return rc;
    for (int i = 0; i < top; i++) row[s + i] += s;
    for (int i = 0; i < r; i++) row[s + top + i] = N - r + i;
    return KVS_OK;
}

static kvs_status fc_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    fc_state *st = state;
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    kvs_status rc = KVS_OK;
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "flashcache: per-layer budget %d outside [1, %d]", per_layer, N);
    for (int l = 0; l < L; l++)
        if (!st->seen[l])
            return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: layer %d was never observed", l);
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    double *R = malloc(sizeof(double) * (size_t)L);        /* [L] */
    float *sum = malloc(sizeof(float) * (size_t)N);        /* [N] layer granularity */
    char note[256] = "";
    if (!budgets || !R || !sum) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "flashcache: out of memory");
        goto cleanup;
    }
    if (st->dba) {
        int zero_layers = 0, first_zero = -1;
        for (int l = 0; l < L; l++) {
            R[l] = 0.0;
            for (int t = 0; t < 2; t++) {
                const double tot = st->e_tot[2 * l + t], hi = st->e_high[2 * l + t];
                if (tot > 0.0) {
                    R[l] += hi / tot;
                } else {
                    zero_layers++;
                    if (first_zero < 0) first_zero = l;
                }
            }
        }
        int bmin = kvs_budget_min(N);
        if (bmin > per_layer) bmin = per_layer;
        rc = kvs_budget_allocate(R, L, (int64_t)L * per_layer, bmin, N, budgets, err);
        if (rc) {
            kvs_err_prefix(err, "flashcache: dba");
            goto cleanup;
        }
        if (zero_layers)
            snprintf(note, sizeof note,
                     "flashcache: %d K/V block(s) with zero energy (first in layer %d) got "
                     "R = 0",
                     zero_layers, first_zero);
    } else {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
    }
    rc = kvs_plan_init(out, "flashcache", L, H, N, budgets, err);
    if (rc) goto cleanup;
    snprintf(out->note, sizeof out->note, "%s", note);
    for (int l = 0; l < L; l++) {
        const int B = budgets[l];
        const float *dev = st->dev + (int64_t)l * H * N; /* [H][N] */
        int32_t *idx = out->layers[l].idx;                /* [H][B] */
        if (st->gran == GRAN_LAYER) {
            for (int n = 0; n < N; n++) {
                float a = 0.0f;
                for (int h = 0; h < H; h++) a += dev[(int64_t)h * N + n];
                sum[n] = a;
            }
            rc = fc_pick(st, sum, B, idx, err);
            if (rc) {
                kvs_err_prefix(err, "flashcache: layer %d", l);
                goto cleanup;
            }
            for (int h = 1; h < H; h++)
                memcpy(idx + (int64_t)h * B, idx, sizeof(int32_t) * (size_t)B);
        } else {
            for (int h = 0; h < H; h++) {
                rc = fc_pick(st, dev + (int64_t)h * N, B, idx + (int64_t)h * B, err);
                if (rc) {
                    kvs_err_prefix(err, "flashcache: layer %d head %d", l, h);
                    goto cleanup;
                }
            }
        }
    }
cleanup:
    free(budgets);
    free(R);
    free(sum);
    return rc;
}

const kvs_method kvs_method_flashcache = {
    .name = "flashcache",
    .summary = "FlashCache: keep tokens that deviate most from the DCT low-pass base KV; "
               "layer budgets by high-band energy",
    .needs = 0,
    .params = fc_params,
    .n_params = (int)(sizeof fc_params / sizeof fc_params[0]),
    .queries_wanted = NULL,
    .create = fc_create,
    .observe = fc_observe,
    .select = fc_select,
    .destroy = fc_destroy,
};
