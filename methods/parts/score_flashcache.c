/*
 * score_flashcache.c -- scorer `flashcache`: FlashCache's DCT outlier score.
 *
 * Source: FlashCache (the seed paper of this project; methods.md
 * "FlashCache", methods/flashcache.c). Formula, per layer, KV head h:
 * omega = max(1, round(gamma N)) (at most N); K_base, V_base = the
 * orthonormal DCT-II of each channel along tokens, cut to the first omega
 * coefficients, DCT-III back; the score of token n is
 *   Dev_h[n] = mean_c (K - K_base)^2 + mean_c (V - V_base)^2,
 * higher = more of an outlier = keep. Reads K and V only.
 * Code path: the same fused transform as methods/flashcache.c
 * (kvs_dct_lowpass_sqres, dct.h) with the same plan (route AUTO, omega
 * known), and Dev summed in the same float order (K share, then + V share),
 * so `flashcache` scorer + uniform + sinks / window + topk selects exactly
 * what `flashcache dba=false granularity=head` does (tests/parts checks
 * it). Parameter: gamma (float in (0, 1], absent: 0.2, FlashCache's
 * default).
 * Decisions: DBA (FlashCache's layer budgets from the high-band energy) is
 * an allocator's business (alloc_dba.c); when the composition's allocator
 * reads the energies (KVS_STAT_ENERGY) this scorer writes them from the
 * transform it runs anyway. Parameter granularity (enum head|layer, absent
 * head): layer writes the sum of Dev over heads (summed in head order, as
 * methods/flashcache.c) to every head's row, so every head picks one set. One thread: the
 * monolithic method's threaded observe is the fast path.
 * Memory: one DCT plan (about 4 N d floats of scratch) and [2][N] floats.
 */
#include "kvs_parts.h"

#include "dct.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    kvs_dct_plan *plan;
    int omega;
    float *acc, *part; /* [N] each */
} fcs_state;

static void fcs_destroy(void *state) {
    fcs_state *st = state;
    if (!st) return;
    kvs_dct_plan_destroy(st->plan);
    free(st->acc);
    free(st->part);
    free(st);
}

static kvs_status fcs_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const int N = c->shape.n_tokens, d = c->shape.head_dim;
    fcs_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    const double gamma = kvs_part_param(c->m, c->p, "gamma", 0.2);
    st->omega = (int)lround(gamma * (double)N);
    if (st->omega < 1) st->omega = 1;
    if (st->omega > N) st->omega = N;
    st->acc = malloc(sizeof(float) * (size_t)N);
    st->part = malloc(sizeof(float) * (size_t)N);
    kvs_status rc = !st->acc || !st->part
                        ? kvs_errorf(err, KVS_ERR_NOMEM, "out of memory")
                        : kvs_dct_plan_create_opts(N, d, st->omega, KVS_DCT_AUTO, &st->plan, err);
    if (rc) {
        fcs_destroy(st);
        return rc;
    }
    *state = st;
    return KVS_OK;
}

static kvs_status fcs_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    fcs_state *st = state;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads;
    const float inv_d = 1.0f / (float)st->c->shape.head_dim;
    /* the energies DBA reads (alloc_dba.c), summed as it sums them */
    const int energy = st->c->stats && (st->c->want_stats & KVS_STAT_ENERGY);
    double eh[2] = {0, 0}, et[2] = {0, 0};
    for (int h = 0; h < H; h++) {
        double lo = 0.0, hi = 0.0;
        kvs_status rc = kvs_dct_lowpass_sqres(st->plan, &in->k, h, st->omega, &lo, st->acc, err);
        if (rc) return kvs_err_prefix(err, "flashcache: layer %d head %d K", layer, h);
        if (energy) {
            for (int n = 0; n < N; n++) hi += st->acc[n];
            eh[0] += hi;
            et[0] += lo + hi;
        }
        for (int n = 0; n < N; n++) st->part[n] = st->acc[n] * inv_d;
        lo = hi = 0.0;
        rc = kvs_dct_lowpass_sqres(st->plan, &in->v, h, st->omega, &lo, st->acc, err);
        if (rc) return kvs_err_prefix(err, "flashcache: layer %d head %d V", layer, h);
        if (energy) {
            for (int n = 0; n < N; n++) hi += st->acc[n];
            eh[1] += hi;
            et[1] += lo + hi;
        }
        /* V's share in its own pass, then one add: the float operations of
         * methods/flashcache.c (no product fused into the sum) */
        for (int n = 0; n < N; n++) st->acc[n] *= inv_d;
        float *row = scores + (size_t)h * (size_t)N; /* [N] */
        for (int n = 0; n < N; n++) {
            row[n] = st->part[n] + st->acc[n];
            if (!isfinite(row[n]))
                return kvs_errorf(err, KVS_ERR_NUMERIC,
                                  "flashcache: layer %d head %d: deviation of token %d is not "
                                  "finite (values too large for fp32 squares)",
                                  layer, h, n);
        }
    }
    if (kvs_part_param(st->c->m, st->c->p, "granularity", 0) == 1) /* one set per layer */
        for (int n = 0; n < N; n++) {
            float a = 0.0f;
            for (int h = 0; h < H; h++) a += scores[(size_t)h * N + n];
            for (int h = 0; h < H; h++) scores[(size_t)h * N + n] = a;
        }
    if (energy) {
        kvs_layer_stats *ls = &st->c->stats[layer];
        for (int t = 0; t < 2; t++) ls->e_high[t] = eh[t], ls->e_tot[t] = et[t];
        ls->have |= KVS_STAT_ENERGY;
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_flashcache = {
    .name = "flashcache",
    .needs = 0,
    .queries_wanted = NULL,
    .create = fcs_create,
    .score = fcs_score,
    .destroy = fcs_destroy,
};
