/*
 * alloc_simlayer.c -- allocator `simlayer`: SimLayerKV's lazy layers keep
 * only their StreamingLLM size, the other layers share what that frees.
 *
 * Paper: SimLayerKV, "A Simple Framework for Layer-Level KV Cache
 * Reduction", arXiv 2410.13846; official code sail-sg/SimLayerKV (read:
 * LongBench/SimLayerKV_attention_llama.py at commit ff6c198, its decode-time
 * measure); kvpress SimLayerKVPress (simlayerkv_press.py, kvpress 0.5.5).
 * Measure (kvs_simlayer_mass), per layer: the last prompt query attends
 * over all N keys; its mass on the first `sinks` keys plus the last
 * `recent` keys (each key once), averaged over the query heads. A layer
 * whose mass exceeds `lazy_threshold` is lazy: its attention barely leaves
 * the sinks and the recent tokens, so StreamingLLM's set is enough for it.
 * Budgets (kvs_simlayer_budgets): the paper and kvpress keep every token of
 * a non-lazy layer and have no global budget (the compression ratio is an
 * outcome). Here the budget L * B is exact, so a lazy layer's share is
 * b_z = min(sinks + recent, N, B) (never more than the uniform share) and
 * the non-lazy layers split the rest equally, up to N each; what they
 * cannot hold goes back to the lazy layers (water-filling in
 * kvs_budget_allocate, one rounding, [B_min, N]). With no lazy layer, or
 * all lazy, every layer gets B (the note says how many were lazy).
 * Parameters (read by name, shared with the simlayer scorer and the sinks
 * rule): sinks (absent 4), recent (absent 1024), lazy_threshold (absent
 * 0.9: the official repository's value for Llama-3; Llama-2 0.65, Mistral
 * 0.8, Qwen 0.85; kvpress's default 1.0 turns the method off).
 * Decisions where the sources disagree:
 *   - The query: the last prompt query (the official code measures the
 *     first decoded token, kvpress's n_last = 1 the last prompt query over
 *     the keys before it). Its own key counts in the recent span, as in the
 *     official code (kvpress drops it).
 *   - The mean over query heads of the per-head masses (both sources).
 *     With sinks + recent >= N the spans cover every key: mass 1, lazy,
 *     and StreamingLLM's set is the whole prompt clipped to B (kvpress
 *     leaves such prompts uncompressed).
 * Cost Hq * N * d per layer (one query row); memory [Hq] + [Hkv][N].
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kvs_status kvs_simlayer_mass(const kvs_layer *in, int sinks, int recent, int threads, float *lse,
                             float *row, double *mass, kvs_err *err) {
    const int N = in->k.n_tokens, H = in->k.n_heads;
    *mass = 0.0;
    if (!in->q.data || in->q.n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "simlayer: needs the query of the last prompt position (Nq >= 1)");
    kvs_view q1 = in->q; /* the last row: position N - 1 */
    q1.data = (const char *)in->q.data +
              (size_t)(in->q.n_tokens - 1) * (size_t)in->q.s_tok * kvs_dtype_size(in->q.dtype);
    q1.n_tokens = 1;
    kvs_status rc = kvs_attn_colsum_fused(&q1, &in->k, lse, row, NULL, threads, err);
    if (rc) return rc;
    const int s = sinks < N ? (sinks < 0 ? 0 : sinks) : N;
    int r0 = N - (recent < 0 ? 0 : recent); /* recent span [r0, N) */
    if (r0 < s) r0 = s;
    double m = 0.0;
    for (int h = 0; h < H; h++) {
        const float *a = row + (size_t)h * N;
        for (int j = 0; j < N; j++)
            if (!isfinite(a[j]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "simlayer: KV head %d: attention of token %d is not finite", h, j);
        double t = 0.0;
        for (int j = 0; j < s; j++) t += a[j];
        for (int j = r0; j < N; j++) t += a[j];
        m += t;
    }
    *mass = m / H;
    return KVS_OK;
}

kvs_status kvs_simlayer_budgets(const double *mass, int L, int N, int per_layer, int lazy_size,
                                double threshold, int *budgets, int *n_lazy, kvs_err *err) {
    *n_lazy = 0;
    if (!mass || L < 1 || N < 1 || per_layer < 1 || per_layer > N || lazy_size < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "simlayer: bad input L=%d N=%d B=%d lazy_size=%d",
                          L, N, per_layer, lazy_size);
    int n = 0;
    for (int l = 0; l < L; l++) {
        if (!isfinite(mass[l]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "simlayer: layer %d: mass %g", l, mass[l]);
        n += mass[l] > threshold;
    }
    *n_lazy = n;
    if (n == 0 || n == L) {
        for (int l = 0; l < L; l++) budgets[l] = per_layer;
        return KVS_OK;
    }
    int bz = lazy_size < N ? lazy_size : N;
    if (bz > per_layer) bz = per_layer;
    const double total = (double)L * per_layer;
    const double rest = (total - (double)n * bz) / (L - n);
    double *wts = malloc(sizeof(double) * (size_t)L); /* [L] */
    if (!wts) return kvs_errorf(err, KVS_ERR_NOMEM, "simlayer: out of memory");
    for (int l = 0; l < L; l++) wts[l] = mass[l] > threshold ? (double)bz : rest;
    int bmin = kvs_budget_min(N);
    if (bmin > per_layer) bmin = per_layer;
    kvs_status rc = kvs_budget_allocate(wts, L, (int64_t)L * per_layer, bmin, N, budgets, err);
    free(wts);
    return rc ? kvs_err_prefix(err, "simlayer") : KVS_OK;
}

static int simlayer_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m, (void)p, (void)N;
    return 1;
}

static kvs_status simlayer_measure(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                                   kvs_layer_stats *out, kvs_err *err) {
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, Hq = in->q.n_heads;
    float *lse = malloc(sizeof(float) * (size_t)(Hq > 0 ? Hq : 1));
    float *row = malloc(sizeof(float) * (size_t)H * (size_t)N); /* [Hkv][N] */
    kvs_status rc = KVS_OK;
    if (!lse || !row) rc = kvs_errorf(err, KVS_ERR_NOMEM, "simlayer: out of memory");
    else
        rc = kvs_simlayer_mass(in, (int)kvs_part_param(c->m, c->p, "sinks", 4),
                               (int)kvs_part_param(c->m, c->p, "recent", 1024),
                               c->shape.threads, lse, row, &out->lazy_mass, err);
    free(lse);
    free(row);
    if (rc) return kvs_err_prefix(err, "layer %d", layer);
    out->have |= KVS_STAT_LAZY;
    return KVS_OK;
}

static kvs_status simlayer_allocate(const kvs_part_ctx *c, int per_layer, int *budgets,
                                    kvs_err *err) {
    const int L = c->shape.n_layers;
    if (!c->stats)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "simlayer: no layer statistics (not in a composition)");
    double *mass = malloc(sizeof(double) * (size_t)L); /* [L] */
    if (!mass) return kvs_errorf(err, KVS_ERR_NOMEM, "simlayer: out of memory");
    for (int l = 0; l < L; l++) mass[l] = c->stats[l].lazy_mass;
    const double thr = kvs_part_param(c->m, c->p, "lazy_threshold", 0.9);
    /* sinks + recent in double: both may be as large as INT_MAX */
    const double size = kvs_part_param(c->m, c->p, "sinks", 4) +
                        kvs_part_param(c->m, c->p, "recent", 1024);
    const int N = c->shape.n_tokens;
    int n_lazy = 0;
    kvs_status rc = kvs_simlayer_budgets(mass, L, N, per_layer, size < N ? (int)size : N, thr,
                                         budgets, &n_lazy, err);
    free(mass);
    if (!rc && c->note)
        snprintf(c->note, 256, "simlayer: %d of %d layers lazy (mass > %g)%s", n_lazy, L, thr,
                 n_lazy == 0 || n_lazy == L ? ": uniform budgets" : "");
    return rc;
}

const kvs_allocator kvs_alloc_simlayer = {
    .name = "simlayer",
    .allocate = simlayer_allocate,
    .stats = KVS_STAT_LAZY,
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = simlayer_queries,
    .measure = simlayer_measure,
};
