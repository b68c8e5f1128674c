/*
 * gpu_compress.c -- kvs_gpu_compress: the method drivers of the CUDA path.
 *
 * What it is: for each method with a GPU path, the same decisions as its CPU
 * reference in methods/ (parameters read by name from the method's own
 * declaration, the same budget rules through core's kvs_budget_allocate,
 * the same forced ranges and top-k segments), with the numbers computed by
 * the kernels of kvs_kernels.cu on the workspace stream:
 *   flashcache    per layer: fused DCT low-pass deviation + energies (FFT or
 *                 truncated-basis GEMM route, the workspace's setting); DBA
 *                 budgets on the host from the L x 4 energies (one sync);
 *   snapkv        per layer: lse + column sums of the window queries, pooled;
 *   h2o / lookm   per layer: lse + column sums of all queries, normalise /
 *                 text boost on the device;
 *   meda          as lookm plus row entropies; budgets on the host from the
 *                 L x 6 statistics (one sync);
 *   full, random, no scores: after a device-side finiteness check of K/V
 *   streamingllm  the CPU method itself builds the plan (their observe reads
 *                 shapes only, never data; random's streams are seeded per
 *                 (layer, head), so the plan is the CPU's bit for bit).
 * Every method checks K, V and the query rows it reads (the last
 * queries_wanted rows, as kvs_compress) for NaN / Inf on the device.
 * Then one top-k launch over all (layer, head) segments, one copy of the
 * indices back, one sync that also reports what the device flagged.
 * What it is not: no kernels (kvs_kernels.cu), no CPU fallback: a method
 * without a GPU path is KVS_ERR_UNSUPPORTED naming method and device.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fc_gemm.h"
#include "kvs_kernels_internal.h"
#include "kvsieve_methods.h"

typedef struct {
    const kvs_method *m;
    const kvs_params *p;
    const kvs_cache_view *c;
    kvs_shape shape;
    int per_layer;
    int q_rows; /* query rows the method reads (the last ones), as kvs_compress counts them */
    kvs_gpu_workspace *ws;
} gctx;

static kvs_status lchk(int rc, const char *what, kvs_err *err) {
    return kvs_gpu_cuda_check(rc, what, err);
}

/* Parameter `name` of the method, or KVS_ERR_INTERNAL when the method does
 * not declare it (kvs_param_get would assert, or read p->v[-1] under
 * NDEBUG). */
static kvs_status gparam(const gctx *g, const char *name, double *out, kvs_err *err) {
    const int i = kvs_param_index(g->m, name);
    if (i < 0 || i >= g->p->n)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "%s (gpu): the GPU driver reads parameter '%s', which the method does "
                          "not declare",
                          g->m->name, name);
    *out = g->p->v[i];
    return KVS_OK;
}

/* Finite checks of K, V (unless skip_kv) and of the query rows the method
 * reads (the last g->q_rows of each layer; none for methods without
 * queries), exactly the values kvs_compress checks on the host. */
static kvs_status check_inputs(gctx *g, int skip_kv, kvs_err *err) {
    for (int l = 0; l < g->shape.n_layers; l++) {
        const kvs_layer *ly = &g->c->layers[l];
        int rc = 0;
        if (!skip_kv) {
            rc = kvs_launch_check_finite(g->ws, &ly->k, KVS_GERR_K, l);
            if (!rc) rc = kvs_launch_check_finite(g->ws, &ly->v, KVS_GERR_V, l);
        }
        if (!rc && g->q_rows > 0 && ly->q.data && ly->q.n_tokens > 0) {
            kvs_view qv = ly->q; /* [Hq][rows][d]: the last rows; token index = row - (Nq - rows) */
            const int rows = g->q_rows < qv.n_tokens ? g->q_rows : qv.n_tokens;
            qv.data = (const char *)qv.data +
                      (size_t)(qv.n_tokens - rows) * (size_t)qv.s_tok * kvs_dtype_size(qv.dtype);
            qv.n_tokens = rows;
            rc = kvs_launch_check_finite(g->ws, &qv, KVS_GERR_Q, l);
        }
        if (rc) return lchk(rc, "finiteness check", err);
    }
    return KVS_OK;
}

/* Upload the descriptors in ws->h_desc (L * Hkv of them, layer-major), run
 * the top-k over `scores`, copy the indices back, sync, build the plan. */
static kvs_status select_and_fill(gctx *g, const float *scores, const int *budgets,
                                  kvs_merge merge, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    const int nseg = L * H;
    long long total = 0;
    for (int l = 0; l < L; l++) total += (long long)H * budgets[l];
    int rc = (int)cudaMemcpyAsync(ws->desc, ws->h_desc, sizeof(kvs_topk_desc) * (size_t)nseg,
                                  cudaMemcpyHostToDevice, ws->stream);
    if (!rc) rc = kvs_launch_topk(ws, scores, ws->desc, nseg, ws->idx);
    if (!rc)
        rc = (int)cudaMemcpyAsync(ws->h_idx, ws->idx, sizeof(int32_t) * (size_t)total,
                                  cudaMemcpyDeviceToHost, ws->stream);
    if (rc) return lchk(rc, "top-k", err);
    kvs_status st = kvs_gpu_sync(ws, err);
    if (st) return st;
    st = kvs_plan_init(out, g->m->name, L, H, N, budgets, err);
    if (st) return st;
    out->merge = merge;
    long long off = 0;
    for (int l = 0; l < L; l++) {
        const size_t n = (size_t)H * (size_t)budgets[l];
        memcpy(out->layers[l].idx, ws->h_idx + off, sizeof(int32_t) * n);
        off += (long long)n;
    }
    return KVS_OK;
}

/* Fill ws->h_desc[l * H + h] for a layer with budget B: the output row is
 * [0, head) ++ top-k of [lo, hi) ++ [tail_start, tail_start + tail). */
static void set_desc(gctx *g, int l, int h, int B, long long score_off, long long out_off,
                     int head, int lo, int hi, int k, int tail_start, int tail) {
    kvs_topk_desc *D = &g->ws->h_desc[(size_t)l * g->shape.n_kv_heads + h];
    memset(D, 0, sizeof *D);
    D->score_off = score_off;
    D->out_off = out_off;
    D->head_cnt = head;
    D->lo = lo;
    D->hi = hi;
    D->k = k;
    D->tail_start = tail_start;
    D->tail_cnt = tail;
    D->layer = l;
    D->head = h;
    assert(head + k + tail == B && head >= 0 && k >= 0 && tail >= 0);
    assert(k == 0 || (head <= lo && lo < hi && hi <= tail_start && k <= hi - lo));
    (void)B;
}

/* ---- full, random, streamingllm ----------------------------------------------- */

static kvs_status run_index_method(gctx *g, kvs_plan *out, kvs_err *err) {
    kvs_status st = check_inputs(g, 0, err);
    if (st) return st;
    void *state = NULL;
    st = g->m->create(g->p, &g->shape, &state, err);
    if (st) return st;
    for (int l = 0; l < g->shape.n_layers && !st; l++)
        st = g->m->observe(state, l, &g->c->layers[l], g->c->modality, err);
    if (!st) st = g->m->select(state, g->per_layer, out, err);
    g->m->destroy(state);
    if (st) return st;
    return kvs_gpu_sync(g->ws, err);
}

/* ---- flashcache --------------------------------------------------------------- */

static kvs_status run_flashcache(gctx *g, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    const int d = g->shape.head_dim;
    double gamma = 0.0, pdba = 0.0, pgran = 0.0, psinks = 0.0, precent = 0.0;
    kvs_status st = gparam(g, "gamma", &gamma, err);
    if (!st) st = gparam(g, "dba", &pdba, err);
    if (!st) st = gparam(g, "granularity", &pgran, err);
    if (!st) st = gparam(g, "keep_sinks", &psinks, err);
    if (!st) st = gparam(g, "keep_recent", &precent, err);
    if (st) return st;
    const int dba = pdba != 0.0, gran_layer = (int)pgran == 1;
    const int sinks = (int)psinks, recent = (int)precent;
    if (!(gamma > 0.0 && gamma <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "flashcache: gamma=%g outside (0, 1]", gamma);
    int omega = (int)lround(gamma * (double)N);
    if (omega < 1) omega = 1;
    if (omega > N) omega = N;
    st = kvs_fc_prepare(ws, N, 2 * H * d, omega, err); /* FFT plans or the GEMM basis */
    if (st) return kvs_err_prefix(err, "flashcache");
    st = check_inputs(g, 1, err); /* K and V are checked inside the pack kernel */
    if (st) return st;
    for (int l = 0; l < L; l++) {
        st = kvs_fc_layer(ws, &g->c->layers[l], l, omega, ws->scores + (size_t)l * H * N,
                          ws->energy + 4 * l, err);
        if (st) return kvs_err_prefix(err, "flashcache");
    }
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L] */
    double *R = calloc((size_t)L, sizeof(double)); /* [L] */
    char note[256] = "";
    if (!budgets || !R) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "flashcache: out of memory");
        goto cleanup;
    }
    if (dba) {
        int rc = (int)cudaMemcpyAsync(ws->h_energy, ws->energy, sizeof(double) * 4 * (size_t)L,
                                      cudaMemcpyDeviceToHost, ws->stream);
        if (rc) {
            st = lchk(rc, "flashcache: energies", err);
            goto cleanup;
        }
        if ((st = kvs_gpu_sync(ws, err))) goto cleanup;
        int zero_layers = 0, first_zero = -1;
        for (int l = 0; l < L; l++) {
            R[l] = 0.0;
            for (int t = 0; t < 2; t++) {
                const double lo = ws->h_energy[4 * l + 2 * t], tot = ws->h_energy[4 * l + 2 * t + 1];
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
    const float *scores = ws->scores;
    if (gran_layer) {
        for (int l = 0; l < L; l++) {
            int rc = kvs_launch_head_sum(ws, ws->scores + (size_t)l * H * N, H, N,
                                         ws->scratch + (size_t)l * N);
            if (rc) {
                st = lchk(rc, "flashcache: layer sums", err);
                goto cleanup;
            }
        }
        scores = ws->scratch;
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
                set_desc(g, l, h, B, so, oo, N, 0, 0, 0, N, 0);
            } else if (s + r >= B) {
                const int ks = s < B ? s : B, kr = B - ks;
                set_desc(g, l, h, B, so, oo, ks, 0, 0, 0, N - kr, kr);
            } else {
                set_desc(g, l, h, B, so, oo, s, s, N - r, B - s - r, N - r, r);
            }
        }
        off += (long long)H * B;
    }
    st = select_and_fill(g, scores, budgets, KVS_MERGE_NONE, out, err);
    if (!st) snprintf(out->note, sizeof out->note, "%s", note);
cleanup:
    free(budgets);
    free(R);
    return st;
}

/* ---- snapkv ------------------------------------------------------------------- */

static kvs_status run_snapkv(gctx *g, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    double pwin = 0.0, pker = 0.0, ppool = 0.0;
    kvs_status st = gparam(g, "window", &pwin, err);
    if (!st) st = gparam(g, "kernel", &pker, err);
    if (!st) st = gparam(g, "pool", &ppool, err);
    if (st) return st;
    const int window = (int)pwin, kernel = (int)pker, is_max = (int)ppool == 0;
    if (window < 1 || kernel < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "snapkv: window=%d and kernel=%d must be >= 1",
                          window, kernel);
    const int w = window < N ? window : N, P = N - w;
    for (int l = 0; l < L; l++) {
        const kvs_view *q = &g->c->layers[l].q;
        if (!q->data || q->n_tokens < w)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "snapkv: layer %d: needs the queries of the last %d prompt positions "
                              "(window=%d) but %d were recorded",
                              l, w, w, q->data ? q->n_tokens : 0);
    }
    st = check_inputs(g, 0, err);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &g->c->layers[l];
        kvs_view qw = ly->q; /* [Hq][w][d]: the last w recorded rows */
        qw.data = (const char *)ly->q.data +
                  (size_t)(ly->q.n_tokens - w) * (size_t)ly->q.s_tok * kvs_dtype_size(ly->q.dtype);
        qw.n_tokens = w;
        int rc = kvs_launch_lse(ws, &qw, &ly->k, ws->lse, l);
        if (!rc) rc = kvs_launch_colsum(ws, &qw, &ly->k, ws->lse, ws->scratch);
        if (!rc && P > 0)
            rc = kvs_launch_pool(ws, ws->scratch, H, N, P, kernel, is_max,
                                 ws->scores + (size_t)l * H * N, N, l);
        if (rc) return lchk(rc, "snapkv: window votes", err);
    }
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "snapkv: out of memory");
    const int B = g->per_layer;
    for (int l = 0; l < L; l++) {
        budgets[l] = B;
        for (int h = 0; h < H; h++) {
            const long long so = ((long long)l * H + h) * N, oo = ((long long)l * H + h) * B;
            if (B <= w)
                set_desc(g, l, h, B, so, oo, 0, 0, 0, 0, N - B, B);
            else
                set_desc(g, l, h, B, so, oo, 0, 0, P, B - w, P, w);
        }
    }
    st = select_and_fill(g, ws->scores, budgets, KVS_MERGE_NONE, out, err);
    free(budgets);
    return st;
}

/* ---- h2o, lookm, meda ------------------------------------------------------------ */

static const kvs_merge merge_of_choice[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE,
                                             KVS_MERGE_WEIGHTED, KVS_MERGE_NONE};

static kvs_status run_attention(gctx *g, kvs_plan *out, kvs_err *err) {
    kvs_gpu_workspace *ws = g->ws;
    const char *name = g->m->name;
    const int L = g->shape.n_layers, H = g->shape.n_kv_heads, N = g->shape.n_tokens;
    const int is_h2o = strcmp(name, "h2o") == 0, is_meda = strcmp(name, "meda") == 0;
    int normalize = 0;
    double frac = 0.5, pnorm = 0.0, pmerge = 0.0, ppolicy = 0.0;
    kvs_merge merge = KVS_MERGE_NONE;
    kvs_status st = gparam(g, "recent_frac", &frac, err);
    if (st) return st;
    if (is_h2o) {
        if ((st = gparam(g, "normalize", &pnorm, err))) return st;
        normalize = pnorm != 0.0;
    } else if (is_meda) {
        if ((st = gparam(g, "merge", &pmerge, err))) return st;
        merge = merge_of_choice[(int)pmerge & 3];
    } else { /* lookm */
        if ((st = gparam(g, "text_policy", &ppolicy, err))) return st;
        if ((st = gparam(g, "merge", &pmerge, err))) return st;
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
    if (!is_h2o && g->c->modality) {
        for (int j = 0; j < N; j++)
            if (g->c->modality[j] > KVS_MOD_AUDIO)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: modality[%d] = %d is not a KVS_MOD_* value (0 text, 1 "
                                  "image, 2 video, 3 audio)",
                                  name, j, (int)g->c->modality[j]);
        memcpy(ws->h_modality, g->c->modality, (size_t)N);
        int rc = (int)cudaMemcpyAsync(ws->modality, ws->h_modality, (size_t)N,
                                      cudaMemcpyHostToDevice, ws->stream);
        if (rc) return lchk(rc, "modality upload", err);
        mod = ws->modality;
    }
    st = check_inputs(g, 0, err);
    if (st) return st;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &g->c->layers[l];
        float *sc = ws->scores + (size_t)l * H * N; /* [Hkv][N] */
        int rc = kvs_launch_lse(ws, &ly->q, &ly->k, ws->lse, l);
        if (!rc) rc = kvs_launch_colsum(ws, &ly->q, &ly->k, ws->lse, sc);
        if (!rc) rc = kvs_launch_score_post(ws, sc, H, N, normalize, !is_h2o, mod, l);
        if (!rc && is_meda)
            rc = kvs_launch_entropies(ws, &ly->q, &ly->k, ws->lse, mod, ws->stats + 6 * l, l);
        if (rc) return lchk(rc, "attention statistics", err);
    }
    int *budgets = calloc((size_t)L, sizeof(int)); /* [L] */
    double *w = calloc((size_t)L, sizeof(double)); /* [L] */
    char note[256] = "";
    if (!budgets || !w) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", name);
        goto cleanup;
    }
    if (is_meda) {
        int rc = (int)cudaMemcpyAsync(ws->h_stats, ws->stats, sizeof(double) * 6 * (size_t)L,
                                      cudaMemcpyDeviceToHost, ws->stream);
        if (rc) {
            st = lchk(rc, "meda: entropies", err);
            goto cleanup;
        }
        if ((st = kvs_gpu_sync(ws, err))) goto cleanup;
        int xmodal = 1;
        for (int l = 0; l < L; l++)
            if (ws->h_stats[6 * l + 3] + ws->h_stats[6 * l + 4] == 0.0) xmodal = 0;
        double emax = -INFINITY;
        for (int l = 0; l < L; l++) {
            const double *e = ws->h_stats + 6 * l; /* plain, e_tv, e_vt, n_tv, n_vt */
            w[l] = xmodal ? (e[3] > 0 ? e[1] : 0.0) + (e[4] > 0 ? e[2] : 0.0) : e[0];
            if (!isfinite(w[l])) {
                st = kvs_errorf(err, KVS_ERR_NUMERIC, "meda: layer %d: entropy is not finite (%g)",
                                l, w[l]);
                goto cleanup;
            }
            if (w[l] > emax) emax = w[l];
        }
        double wsum = 0.0;
        for (int l = 0; l < L; l++) wsum += (w[l] = exp(w[l] - emax));
        for (int l = 0; l < L; l++) w[l] /= wsum;
        int bmin = kvs_budget_min(N);
        if (bmin > g->per_layer) bmin = g->per_layer;
        st = kvs_budget_allocate(w, L, (int64_t)L * g->per_layer, bmin, N, budgets, err);
        if (st) {
            kvs_err_prefix(err, "meda: layer budgets");
            goto cleanup;
        }
        if (xmodal)
            snprintf(note, sizeof note,
                     "meda: cross-modal entropy E_TV (%lld rows) + E_VT (%lld rows) set layer "
                     "budgets",
                     (long long)ws->h_stats[3], (long long)ws->h_stats[4]);
        else
            snprintf(note, sizeof note,
                     "meda: single modality (no cross-modal attention rows), plain mean row "
                     "entropy set layer budgets");
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
                set_desc(g, l, h, B, so, oo, N, 0, 0, 0, N, 0);
            else
                set_desc(g, l, h, B, so, oo, 0, 0, N - r, B - r, N - r, r);
        }
        off += (long long)H * B;
    }
    st = select_and_fill(g, ws->scores, budgets, merge, out, err);
    if (!st && note[0]) snprintf(out->note, sizeof out->note, "%s", note);
cleanup:
    free(budgets);
    free(w);
    return st;
}

/* ---- entry point --------------------------------------------------------------- */

kvs_status kvs_gpu_compress(const char *method, const kvs_params *p,
                            const kvs_cache_view *c, const kvs_budget *b,
                            kvs_gpu_workspace *ws, kvs_plan *out, kvs_err *err) {
    if (!method || !p || !c || !b || !ws || !out)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_compress: NULL argument");
    memset(out, 0, sizeof *out);
    const kvs_method *m = NULL;
    if (method[0] == '{') /* a composition's canonical JSON (methods/parts) */
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "method %.200s: composed methods have no GPU implementation; pass host views",
                          method);
    kvs_status st = kvs_method_lookup(method, &m, err);
    if (st) return st;
    gctx g;
    memset(&g, 0, sizeof g);
    g.m = m;
    g.p = p;
    g.c = c;
    g.ws = ws;
    if (p->n != m->n_params) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "parameter set holds %d values but the method declares %d", p->n,
                        m->n_params);
        goto cleanup;
    }
    /* shapes only: device K/V/Q are checked for NaN / Inf on the device
     * (check_inputs), which reads the same values kvs_compress scans */
    if ((st = kvs_cache_check_shape(c, &g.shape, err))) goto cleanup;
    g.shape.threads = 1;
    if ((m->needs & (KVS_NEED_Q_ALL | KVS_NEED_Q_WINDOW)) && g.shape.n_queries > 0) {
        g.q_rows = m->queries_wanted ? m->queries_wanted(p, g.shape.n_tokens) : g.shape.n_queries;
        if (g.q_rows < 1 || g.q_rows > g.shape.n_queries) g.q_rows = g.shape.n_queries;
    }
    const int L = g.shape.n_layers, N = g.shape.n_tokens;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &c->layers[l];
        char what[48];
        snprintf(what, sizeof what, "layer %d: K", l);
        if ((st = kvs_gpu_check_view(ws, &ly->k, what, err))) goto cleanup;
        snprintf(what, sizeof what, "layer %d: V", l);
        if ((st = kvs_gpu_check_view(ws, &ly->v, what, err))) goto cleanup;
        if (ly->q.data && ly->q.n_tokens > 0) {
            snprintf(what, sizeof what, "layer %d: Q", l);
            if ((st = kvs_gpu_check_view(ws, &ly->q, what, err))) goto cleanup;
        }
    }
    if (L > ws->L || g.shape.n_kv_heads > ws->Hkv ||
        (g.shape.n_queries > 0 && g.shape.n_q_heads > ws->Hq)) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "cache L=%d Hkv=%d Hq=%d exceeds the workspace (L <= %d, Hkv <= %d, Hq <= %d)",
                        L, g.shape.n_kv_heads, g.shape.n_q_heads, ws->L, ws->Hkv, ws->Hq);
        goto cleanup;
    }
    if ((m->needs & KVS_NEED_Q_ALL) && g.shape.n_queries != N) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "method %s needs the queries of all N=%d prompt positions; the cache has Nq=%d",
                        m->name, N, g.shape.n_queries);
        goto cleanup;
    }
    if ((m->needs & KVS_NEED_Q_WINDOW) && g.shape.n_queries < 1) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "method %s needs the queries of the last prompt positions (observation "
                        "window); the cache has Nq=0",
                        m->name);
        goto cleanup;
    }
    if ((st = kvs_budget_per_layer(b, N, &g.per_layer, err))) goto cleanup;
    int rc = kvs_launch_reset_err(ws);
    if (rc) {
        st = lchk(rc, "reset", err);
        goto cleanup;
    }
    if (!strcmp(m->name, "full") || !strcmp(m->name, "streamingllm") || !strcmp(m->name, "random"))
        st = run_index_method(&g, out, err);
    else if (!strcmp(m->name, "flashcache"))
        st = run_flashcache(&g, out, err);
    else if (!strcmp(m->name, "snapkv"))
        st = run_snapkv(&g, out, err);
    else if (!strcmp(m->name, "h2o") || !strcmp(m->name, "lookm") || !strcmp(m->name, "meda"))
        st = run_attention(&g, out, err);
    else
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "method %s has no GPU implementation (device %s); run it on host memory "
                        "with kvs_compress",
                        m->name, kvs_gpu_workspace_device(ws));
    if (st) goto cleanup;
    /* the contract kvs_compress enforces */
    if ((st = kvs_plan_check(out, err))) goto cleanup;
    if (out->n_layers != L || out->n_kv_heads != g.shape.n_kv_heads || out->n_tokens != N) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL,
                        "plan has shape L=%d Hkv=%d N=%d but the cache has L=%d Hkv=%d N=%d",
                        out->n_layers, out->n_kv_heads, out->n_tokens, L, g.shape.n_kv_heads, N);
        goto cleanup;
    }
    /* a method that keeps everything (KVS_KEEPS_ALL, the `full` control) is
     * exempt from the budget, exactly as in kvs_compress */
    const int64_t want = (int64_t)L * ((m->needs & KVS_KEEPS_ALL) ? N : g.per_layer);
    const int64_t got = kvs_plan_total(out);
    if (got != want) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL,
                        "plan budgets sum to %lld but the budget is %lld (L = %d layers x %d)",
                        (long long)got, (long long)want, L, (int)(want / L));
        goto cleanup;
    }
    if (out->method[0] == '\0') snprintf(out->method, sizeof out->method, "%s", m->name);
cleanup:
    if (st) {
        /* leave the stream idle and the error record clear for the next call */
        kvs_err tmp;
        kvs_err_clear(&tmp);
        (void)kvs_gpu_sync(ws, &tmp);
        kvs_plan_free(out);
        kvs_err_prefix(err, "method %s (gpu)", m ? m->name : method);
    }
    return st;
}
