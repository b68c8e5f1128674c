/*
 * synth_extra.c -- the model-side tensors of a synthetic cache: an output
 * projection W_o and KVzip's context-reconstruction statistic.
 *
 * What it is: kvs_synth_extra, seeded like kvs_synth_generate (a splitmix64
 * stream per (seed, layer, head, purpose), so the numbers do not depend on
 * loop order, and K/V/Q/probes do not depend on whether these are asked for).
 * The structure is planted so that CriticalKV's and KVzip's choices are not
 * trivial:
 *  - W_o [Hq][E][d]: N(0, 1) / sqrt(d) entries, scaled per query head by a
 *    log-normal factor exp(0.8 z) (heads move the output by different
 *    amounts) and per row e by 0.5 + U[0, 1).
 *  - recon [Hkv][N]: sigmoid of a logit made of a per-layer level N(-1, 0.7^2),
 *    a per-head level N(0, 1), a smooth curve along tokens (3 low cosine
 *    modes, amplitude 1.2 / 0.6 / 0.3), per-token noise N(0, 0.8^2), +3 on the
 *    planted outlier tokens; a sink's logit is 3 plus half of that curve and
 *    noise (high in every head, as kvpress's sinks score 1); clipped to
 *    [-12, 12], so every value lies strictly inside (0, 1) and layers and
 *    heads differ in level (the global ranking splits budgets unevenly).
 * What it is not: no model, and no claim that real statistics have these
 * exact distributions.
 */
#include "kvs_formats.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SYX_PI 3.14159265358979323846

enum { SX_WO_HEAD = 1, SX_WO_ROWS, SX_WO_W, SX_RC_LAYER, SX_RC_HEAD, SX_RC_TOK };

/* A stream of its own per (seed, layer, head, purpose); a different salt
 * from synth.c's, so no stream is shared with K/V/Q. */
static uint64_t extra_seed(uint64_t seed, int layer, int head, int purpose) {
    uint64_t s = seed ^ 0x73796e7468787472ull;
    uint64_t a = kvs_rng_next(&s);
    s = a ^ ((uint64_t)(uint32_t)layer << 32 | (uint32_t)head);
    uint64_t b = kvs_rng_next(&s);
    s = b ^ (uint64_t)purpose * 0xD1B54A32D192ED03ull;
    return kvs_rng_next(&s);
}

static void free_layers(float **a, int L) {
    if (!a) return;
    for (int l = 0; l < L; l++) free(a[l]);
    free(a);
}

static void gen_wo(const kvs_synth_config *cfg, int l, int E, double *row /* [E] scratch */,
                   float *w /* [Hq][E][d] */) {
    const int Hq = cfg->n_q_heads, d = cfg->head_dim;
    const double inv = 1.0 / sqrt((double)d);
    uint64_t rs = extra_seed(cfg->seed, l, -1, SX_WO_ROWS);
    for (int e = 0; e < E; e++) row[e] = 0.5 + kvs_rng_uniform(&rs);
    for (int h = 0; h < Hq; h++) {
        uint64_t hs = extra_seed(cfg->seed, l, h, SX_WO_HEAD);
        const double scale = exp(0.8 * kvs_rng_normal(&hs)) * inv;
        uint64_t ws = extra_seed(cfg->seed, l, h, SX_WO_W);
        for (int e = 0; e < E; e++) {
            float *r = w + ((size_t)h * E + e) * d;
            const double s = scale * row[e];
            for (int c = 0; c < d; c++) r[c] = (float)(s * kvs_rng_normal(&ws));
        }
    }
}

static void gen_recon(const kvs_synth_config *cfg, int l, const uint8_t *is_outlier, float *r /* [Hkv][N] */) {
    const int Hkv = cfg->n_kv_heads, N = cfg->n_tokens, S = cfg->n_sinks < N ? cfg->n_sinks : N;
    uint64_t ls = extra_seed(cfg->seed, l, -1, SX_RC_LAYER);
    const double layer_level = -1.0 + 0.7 * kvs_rng_normal(&ls);
    static const double amp[3] = {1.2, 0.6, 0.3};
    for (int g = 0; g < Hkv; g++) {
        uint64_t hs = extra_seed(cfg->seed, l, g, SX_RC_HEAD);
        const double level = layer_level + kvs_rng_normal(&hs);
        double freq[3], phase[3];
        for (int m = 0; m < 3; m++) {
            freq[m] = 0.5 + 2.5 * kvs_rng_uniform(&hs) * (m + 1);
            phase[m] = 2.0 * SYX_PI * kvs_rng_uniform(&hs);
        }
        uint64_t ts = extra_seed(cfg->seed, l, g, SX_RC_TOK);
        for (int n = 0; n < N; n++) {
            double x = level + 0.8 * kvs_rng_normal(&ts);
            for (int m = 0; m < 3; m++) x += amp[m] * cos(SYX_PI * freq[m] * (n + 0.5) / N + phase[m]);
            if (n < S) x = 3.0 + 0.5 * (x - level); /* sinks: high whatever the head's level */
            else if (is_outlier[n]) x += 3.0;
            if (x > 12.0) x = 12.0;
            if (x < -12.0) x = -12.0;
            r[(size_t)g * N + n] = (float)(1.0 / (1.0 + exp(-x)));
        }
    }
}

kvs_status kvs_synth_extra(const kvs_synth_config *cfg, const int32_t *outliers, int n_outliers, int wo_rows,
                           float ***wo_out, float ***recon_out, kvs_err *err) {
    assert(cfg);
    if (wo_out) *wo_out = NULL;
    if (recon_out) *recon_out = NULL;
    const int L = cfg->n_layers, Hq = cfg->n_q_heads, Hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int N = cfg->n_tokens;
    if (L < 1 || Hkv < 1 || Hq < 1 || Hq % Hkv != 0 || d < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: shape L %d, Hq %d, Hkv %d, d %d, N %d is not valid", L,
                          Hq, Hkv, d, N);
    if (wo_out && wo_rows < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: W_o hidden size E = %d must be >= 1", wo_rows);
    if (n_outliers < 0 || (n_outliers > 0 && !outliers))
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: bad outlier list (%d entries)", n_outliers);
    float **wo = NULL, **rc = NULL;
    double *row = NULL;
    uint8_t *mark = calloc((size_t)N, 1);
    if (!mark) goto nomem;
    for (int i = 0; i < n_outliers; i++) {
        if (outliers[i] < 0 || outliers[i] >= N) {
            free(mark);
            return kvs_errorf(err, KVS_ERR_INVALID, "synth: outlier %d = %d out of range [0, %d)", i,
                              outliers[i], N);
        }
        mark[outliers[i]] = 1;
    }
    if (wo_out) {
        if (!(wo = calloc((size_t)L, sizeof *wo)) || !(row = malloc(sizeof(double) * (size_t)wo_rows))) goto nomem;
        for (int l = 0; l < L; l++) {
            if (!(wo[l] = malloc(sizeof(float) * (size_t)Hq * (size_t)wo_rows * (size_t)d))) goto nomem;
            gen_wo(cfg, l, wo_rows, row, wo[l]);
        }
    }
    if (recon_out) {
        if (!(rc = calloc((size_t)L, sizeof *rc))) goto nomem;
        for (int l = 0; l < L; l++) {
            if (!(rc[l] = malloc(sizeof(float) * (size_t)Hkv * (size_t)N))) goto nomem;
            gen_recon(cfg, l, mark, rc[l]);
        }
    }
    free(mark);
    free(row);
    if (wo_out) *wo_out = wo;
    if (recon_out) *recon_out = rc;
    return KVS_OK;
nomem:
    free(mark);
    free(row);
    free_layers(wo, L);
    free_layers(rc, L);
    return kvs_errorf(err, KVS_ERR_NOMEM, "synth: out of memory for W_o (E %d) / recon of %d layers", wo_rows, L);
}
