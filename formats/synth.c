/*
 * synth.c -- synthetic KV caches that look like real ones.
 *
 * What it is: shape presets and a deterministic generator of fp32 caches
 * (K, V, Q, probe queries, outlier list, modality) for tests, benchmarks and
 * the fidelity study when no recorded cache is at hand.
 * What it is not: not a model. The structure is planted by hand, as follows,
 * per layer l and KV head g (every random draw comes from a splitmix64 stream
 * seeded by (seed, layer, head, purpose), so the output is identical for a
 * seed whatever the loop order):
 *
 *  1. Smooth base (K and V separately, before RoPE). J = 6 DCT-II cosine
 *     modes along tokens, B_j[n] = cos(pi (2n+1) m_j / 2N), with random
 *     frequencies m_j in [1, N/20] (squared-uniform draw: low ones are more
 *     likely) and amplitudes decaying as 0.75^j in order of frequency. Each
 *     channel c mixes the head's modes with its own random weights W[j][c]
 *     and adds a per-channel mean mu[c] (a head's keys share a direction,
 *     as real keys do): base[n][c] = mu[c] + sum_j B_j[n] W[j][c]. The
 *     smooth signal's std along tokens is about 1 per channel.
 *  2. White noise: 0.15 per channel on text tokens, 0.05 on image tokens
 *     (image spans are smoother, i.e. more redundant, than text).
 *  3. Outliers ("needles"): n_outliers distinct token positions after the
 *     sinks (seeded, sorted, the same in every layer and head) get an extra
 *     random N(0, 3^2) vector in K and in V: 3x the smooth signal's std per
 *     channel (the key's norm grows about 2x).
 *  4. RoPE on keys, rotate-half convention, angle pos * theta^(-2i/d) for
 *     pair (i, i + d/2), keys at positions 0..N-1 (cos/sin tables, no trig in
 *     the inner loops).
 *  5. Attention sinks: the first n_sinks keys are replaced by a vector of
 *     norm gain*|mu| along the mean query direction at the end of the prompt
 *     (R(N-1) mu/|mu|), with gain chosen so that a sink's logit exceeds a
 *     typical one by about ln(N/n_sinks) + 2 (at N = 512 the four sinks draw
 *     about 70% of the last query's attention); their values are small
 *     (0.1 x noise).
 *  6. Queries (the last n_queries positions): s_q mu/|mu| + a per-query-head
 *     bias N(0, 0.5^2) + N(0, 0.5^2) noise, rotated at their positions;
 *     s_q = 3 gives recent-key logits around 3.
 *  7. Probes ([Hq][P][d] per layer, positions N..N+P-1): the first P/2 (when
 *     there are outliers) aim at one outlier each: 0.5 x a generic query plus
 *     a vector along that outlier's rotated key deviation, scaled so its logit
 *     is about ln(N) + 4 above the crowd; the rest are generic queries.
 *  8. Image spans (image_frac > 0): 1 span (3 when >= 48 tokens) of equal
 *     length, at random gaps after the sinks, covering round(image_frac * N)
 *     tokens (at most N - n_sinks); modality[n] = 1 there.
 *
 * Work is O(N d J) per head; memory beyond the output is O((N + P) d) for the
 * RoPE tables plus O(N) per head.
 */
#include "kvs_formats.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYN_PI 3.14159265358979323846
#define SYN_MODES 6
#define SYN_NOISE_TEXT 0.15f
#define SYN_NOISE_IMAGE 0.05f
#define SYN_OUTLIER_DEV 3.0f
#define SYN_Q_SCALE 3.0
#define SYN_Q_BIAS 0.5
#define SYN_Q_NOISE 0.5f
#define SYN_V_MEAN 0.5

enum { ST_KMODES = 1, ST_VMODES, ST_KNOISE, ST_VNOISE, ST_QBIAS, ST_QNOISE, ST_PROBE, ST_GLOBAL };

static const struct {
    const char *name;
    int L, Hq, Hkv, d;
    double theta;
} presets[] = {
    {"qwen2.5-vl-7b", 28, 28, 4, 128, 1000000.0},
    {"llava-1.5-7b", 32, 32, 32, 128, 10000.0},
    {"gemma3-270m", 18, 4, 1, 256, 1000000.0},
    {"tiny", 2, 4, 2, 16, 10000.0},
};

void kvs_synth_defaults(kvs_synth_config *cfg) {
    assert(cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_probes = 16;
    cfg->n_outliers = -1; /* auto: max(4, N/256), at most N - n_sinks */
    cfg->n_sinks = 4;
    cfg->image_frac = 0.0;
    cfg->rope_theta = 10000.0;
    cfg->seed = 0;
}

kvs_status kvs_synth_preset(const char *name, kvs_synth_config *cfg, kvs_err *err) {
    assert(cfg);
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (name && strcmp(name, presets[i].name) == 0) {
            kvs_synth_defaults(cfg);
            snprintf(cfg->preset, sizeof cfg->preset, "%s", presets[i].name);
            cfg->n_layers = presets[i].L;
            cfg->n_q_heads = presets[i].Hq;
            cfg->n_kv_heads = presets[i].Hkv;
            cfg->head_dim = presets[i].d;
            cfg->rope_theta = presets[i].theta;
            return KVS_OK;
        }
    char known[128] = "";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, presets[i].name, sizeof known - strlen(known) - 1);
    }
    return kvs_errorf(err, KVS_ERR_NOTFOUND, "unknown synth preset '%s'; known: %s", name ? name : "",
                      known);
}

/* ---- random streams --------------------------------------------------------- */

static uint64_t stream_seed(uint64_t seed, int layer, int head, int purpose) {
    uint64_t s = seed ^ 0x6b7673796e746821ull;
    uint64_t a = kvs_rng_next(&s);
    s = a ^ ((uint64_t)(uint32_t)layer << 32 | (uint32_t)head);
    uint64_t b = kvs_rng_next(&s);
    s = b ^ (uint64_t)purpose * 0x9E3779B97F4A7C15ull;
    return kvs_rng_next(&s);
}

/* Inline splitmix64 for the per-element noise (same generator as core). */
static inline uint64_t mix_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms
 * (mean 0, variance 1, tails cut at +-3.46). One splitmix call. */
static inline float fast_normal(uint64_t *s) {
    uint64_t x = mix_next(s);
    uint32_t sum = (uint32_t)(x & 0xffff) + (uint32_t)((x >> 16) & 0xffff) + (uint32_t)((x >> 32) & 0xffff) +
                   (uint32_t)(x >> 48);
    return ((float)sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* ---- pieces ----------------------------------------------------------------- */

/* Rotate-half RoPE of one row x [d] at position pos; tables [pos][d/2]. */
static void rope_row(float *x, int pos, int half, const float *cs, const float *sn) {
    const float *c = cs + (size_t)pos * (size_t)half, *s = sn + (size_t)pos * (size_t)half;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
    }
}

static double norm2(const float *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* Smooth base + noise + outlier deviations for one head of K or V (before
 * RoPE): out [N][d]. mu [d] receives the channel means; dev [M][d] receives
 * the outlier deviations (may be NULL: then only drawn and added). */
static void gen_head(float *out, int N, int d, const float *costab, uint64_t mode_seed, uint64_t noise_seed,
                     double mean_scale, const uint8_t *modality, const int32_t *slot, float *mu, float *dev,
                     int M, float *W /* [J][d] scratch */) {
    uint64_t rs = mode_seed;
    int mmax = N / 20 > 1 ? N / 20 : 1;
    int64_t m[SYN_MODES];
    double amp[SYN_MODES], asum = 0;
    for (int j = 0; j < SYN_MODES; j++) {
        double u = kvs_rng_uniform(&rs);
        m[j] = 1 + (int64_t)(u * u * mmax);
        if (m[j] > mmax) m[j] = mmax;
    }
    /* sort frequencies ascending; amplitude decays with rank */
    for (int a = 1; a < SYN_MODES; a++)
        for (int b = a; b > 0 && m[b] < m[b - 1]; b--) {
            int64_t t = m[b];
            m[b] = m[b - 1];
            m[b - 1] = t;
        }
    for (int j = 0; j < SYN_MODES; j++) {
        amp[j] = pow(0.75, j);
        asum += amp[j] * amp[j];
    }
    /* var along tokens of sum_j B_j W_j = sum_j W_j^2 / 2 -> scale to 1 */
    double wscale = sqrt(2.0 / asum);
    for (int c = 0; c < d; c++) mu[c] = (float)(mean_scale * kvs_rng_normal(&rs));
    for (int j = 0; j < SYN_MODES; j++)
        for (int c = 0; c < d; c++) W[j * d + c] = (float)(amp[j] * wscale * kvs_rng_normal(&rs));
    /* outlier deviations, drawn in outlier order */
    uint64_t ds = mode_seed ^ 0x5bd1e995u;
    for (int o = 0; o < M; o++)
        for (int c = 0; c < d; c++) dev[(size_t)o * d + c] = SYN_OUTLIER_DEV * (float)kvs_rng_normal(&ds);

    uint64_t ns = noise_seed;
    int64_t N4 = 4 * (int64_t)N, idx[SYN_MODES], step[SYN_MODES];
    for (int j = 0; j < SYN_MODES; j++) {
        idx[j] = m[j] % N4;             /* (2n+1) m at n = 0 */
        step[j] = (2 * m[j]) % N4;
    }
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * d;
        float b[SYN_MODES];
        for (int j = 0; j < SYN_MODES; j++) {
            b[j] = costab[idx[j]];
            idx[j] += step[j];
            if (idx[j] >= N4) idx[j] -= N4;
        }
        float sig = (modality && modality[n] == KVS_MOD_IMAGE) ? SYN_NOISE_IMAGE : SYN_NOISE_TEXT;
        for (int c = 0; c < d; c++) {
            float x = mu[c];
            for (int j = 0; j < SYN_MODES; j++) x += b[j] * W[j * d + c];
            row[c] = x;
        }
        for (int c = 0; c < d; c++) row[c] += sig * fast_normal(&ns);
        if (slot[n] >= 0) {
            const float *dv = dev + (size_t)slot[n] * d;
            for (int c = 0; c < d; c++) row[c] += dv[c];
        }
    }
}

/* A generic query before RoPE: s_q mu/|mu| + bias + noise. */
static void gen_query(float *q, int d, const float *mu_unit, const float *bias, uint64_t *ns) {
    for (int c = 0; c < d; c++) q[c] = (float)SYN_Q_SCALE * mu_unit[c] + bias[c] + SYN_Q_NOISE * fast_normal(ns);
}

static kvs_status check_config(const kvs_synth_config *c, int *M, kvs_err *err) {
    if (c->n_layers < 1 || c->n_kv_heads < 1 || c->n_q_heads < 1 || c->head_dim < 2)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "synth: shape L %d, Hq %d, Hkv %d, d %d: all must be >= 1 (d >= 2)", c->n_layers,
                          c->n_q_heads, c->n_kv_heads, c->head_dim);
    if (c->head_dim % 2)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: head_dim %d must be even (RoPE pairs)", c->head_dim);
    if (c->n_q_heads % c->n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_q_heads %d is not a multiple of n_kv_heads %d",
                          c->n_q_heads, c->n_kv_heads);
    if (c->n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_tokens %d (need >= 1)", c->n_tokens);
    if (c->n_tokens > (1 << 28))
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_tokens %d is too large", c->n_tokens);
    if (c->n_queries < 0 || c->n_queries > c->n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_queries %d out of range [0, n_tokens = %d]",
                          c->n_queries, c->n_tokens);
    if (c->n_probes < 0 || c->n_probes > (1 << 20))
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_probes %d out of range", c->n_probes);
    if (c->n_sinks < 0 || c->n_sinks > c->n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: n_sinks %d out of range [0, n_tokens = %d]",
                          c->n_sinks, c->n_tokens);
    if (c->n_outliers < 0) {
        int a = c->n_tokens / 256 > 4 ? c->n_tokens / 256 : 4;
        *M = a < c->n_tokens - c->n_sinks ? a : c->n_tokens - c->n_sinks;
    } else if (c->n_outliers > c->n_tokens - c->n_sinks)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "synth: n_outliers %d does not fit after %d sinks in %d tokens", c->n_outliers,
                          c->n_sinks, c->n_tokens);
    else
        *M = c->n_outliers;
    if (!(c->image_frac >= 0.0 && c->image_frac <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: image_frac %g out of range [0, 1]", c->image_frac);
    if (!(c->rope_theta > 1.0) || !isfinite(c->rope_theta))
        return kvs_errorf(err, KVS_ERR_INVALID, "synth: rope_theta %g must be finite and > 1", c->rope_theta);
    return KVS_OK;
}

kvs_status kvs_synth_resolve(kvs_synth_config *cfg, kvs_err *err) {
    int M = 0;
    kvs_status st = check_config(cfg, &M, err);
    if (st == KVS_OK) cfg->n_outliers = M;
    return st;
}

kvs_status kvs_synth_generate(const kvs_synth_config *cfg, kvs_dense_cache *out, float ***probes_out,
                              int32_t **outliers_out, kvs_err *err) {
    assert(cfg && out);
    memset(out, 0, sizeof *out);
    if (probes_out) *probes_out = NULL;
    if (outliers_out) *outliers_out = NULL;
    int M = 0;
    kvs_status st = check_config(cfg, &M, err);
    if (st) return st;
    const int L = cfg->n_layers, Hq = cfg->n_q_heads, Hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int N = cfg->n_tokens, Nq = cfg->n_queries, S = cfg->n_sinks, G = Hq / Hkv, half = d / 2;
    const int P = probes_out ? cfg->n_probes : 0;
    const int Npos = N + P;
    const size_t kvsz = (size_t)Hkv * (size_t)N * (size_t)d;

    float *costab = NULL, *rc = NULL, *rsn = NULL, *W = NULL, *muK = NULL, *muV = NULL, *devK = NULL,
          *devV = NULL, *bias = NULL, *tmp = NULL;
    int32_t *outl = NULL, *slot = NULL;
    float **probes = NULL;
    uint8_t *mark = NULL;

    costab = malloc(sizeof(float) * 4 * (size_t)N);               /* [4N] cos(pi k / 2N) */
    rc = malloc(sizeof(float) * (size_t)Npos * (size_t)half);     /* [Npos][d/2] */
    rsn = malloc(sizeof(float) * (size_t)Npos * (size_t)half);    /* [Npos][d/2] */
    W = malloc(sizeof(float) * SYN_MODES * (size_t)d);            /* [J][d] */
    muK = malloc(sizeof(float) * (size_t)Hkv * d);                /* [Hkv][d] */
    muV = malloc(sizeof(float) * (size_t)d);                      /* [d] */
    devK = malloc(sizeof(float) * (size_t)Hkv * (size_t)(M ? M : 1) * d); /* [Hkv][M][d], rotated */
    devV = malloc(sizeof(float) * (size_t)(M ? M : 1) * d);       /* [M][d] */
    bias = malloc(sizeof(float) * (size_t)d);                     /* [d] */
    tmp = malloc(sizeof(float) * (size_t)d);                      /* [d] */
    outl = malloc(sizeof(int32_t) * (size_t)(M ? M : 1));         /* [M] */
    slot = malloc(sizeof(int32_t) * (size_t)N);                   /* [N] outlier number or -1 */
    mark = calloc((size_t)N, 1);                                  /* [N] */
    out->layers = calloc((size_t)L, sizeof *out->layers);
    if (!costab || !rc || !rsn || !W || !muK || !muV || !devK || !devV || !bias || !tmp || !outl || !slot ||
        !mark || !out->layers)
        goto nomem;
    out->n_layers = L;
    out->n_tokens = N;
    for (int l = 0; l < L; l++) {
        kvs_dense_layer *ly = &out->layers[l];
        ly->n_tokens = N;
        ly->n_kv_heads = Hkv;
        ly->head_dim = d;
        ly->n_q_heads = Hq;
        ly->n_queries = Nq;
        ly->k = malloc(sizeof(float) * kvsz);
        ly->v = malloc(sizeof(float) * kvsz);
        if (!ly->k || !ly->v) goto nomem;
        if (Nq) {
            ly->q = malloc(sizeof(float) * (size_t)Hq * (size_t)Nq * (size_t)d);
            if (!ly->q) goto nomem;
        }
    }
    if (P > 0) {
        probes = calloc((size_t)L, sizeof *probes);
        if (!probes) goto nomem;
        for (int l = 0; l < L; l++)
            if (!(probes[l] = malloc(sizeof(float) * (size_t)Hq * (size_t)P * (size_t)d))) goto nomem;
    }

    /* Tables. */
    for (int64_t k = 0; k < 4 * (int64_t)N; k++) costab[k] = (float)cos(SYN_PI * (double)k / (2.0 * N));
    for (int i = 0; i < half; i++) {
        double f = pow(cfg->rope_theta, -2.0 * i / d);
        for (int p = 0; p < Npos; p++) {
            double a = (double)p * f;
            rc[(size_t)p * half + i] = (float)cos(a);
            rsn[(size_t)p * half + i] = (float)sin(a);
        }
    }

    /* Outlier positions: Floyd's sampling of M distinct values in [S, N). */
    uint64_t gs = stream_seed(cfg->seed, -1, -1, ST_GLOBAL);
    int span = N - S;
    for (int j = span - M; j < span; j++) {
        int t = (int)(kvs_rng_uniform(&gs) * (j + 1));
        if (t > j) t = j;
        if (mark[S + t]) t = j;
        mark[S + t] = 1;
    }
    int mi = 0;
    for (int n = 0; n < N; n++) {
        slot[n] = mark[n] ? mi : -1;
        if (mark[n]) outl[mi++] = n;
    }
    assert(mi == M);

    /* Image spans. */
    if (cfg->image_frac > 0) {
        out->modality = calloc((size_t)N, 1);
        if (!out->modality) goto nomem;
        int T = (int)lround(cfg->image_frac * N);
        if (T > N - S) T = N - S;
        int ns = T >= 48 ? 3 : 1;
        if (T > 0) {
            double w[4], ws = 0;
            for (int i = 0; i <= ns; i++) ws += (w[i] = 0.05 + kvs_rng_uniform(&gs));
            int free_tok = N - S - T, pos = S, used_gap = 0;
            for (int i = 0; i < ns; i++) {
                int gap = (int)floor(free_tok * w[i] / ws);
                used_gap += gap;
                pos += gap;
                int len = T / ns + (i == ns - 1 ? T % ns : 0);
                memset(out->modality + pos, KVS_MOD_IMAGE, (size_t)len);
                pos += len;
            }
            assert(used_gap <= free_tok && pos <= N);
        }
    }
    const uint8_t *modality = out->modality;

    for (int l = 0; l < L; l++) {
        kvs_dense_layer *ly = &out->layers[l];
        for (int g = 0; g < Hkv; g++) {
            float *K = ly->k + (size_t)g * N * d, *V = ly->v + (size_t)g * N * d;
            float *mu = muK + (size_t)g * d, *dk = devK + (size_t)g * (M ? M : 1) * d;
            gen_head(K, N, d, costab, stream_seed(cfg->seed, l, g, ST_KMODES),
                     stream_seed(cfg->seed, l, g, ST_KNOISE), 1.0, modality, slot, mu, dk, M, W);
            gen_head(V, N, d, costab, stream_seed(cfg->seed, l, g, ST_VMODES),
                     stream_seed(cfg->seed, l, g, ST_VNOISE), SYN_V_MEAN, modality, slot, muV, devV, M, W);
            for (int n = 0; n < N; n++) rope_row(K + (size_t)n * d, n, half, rc, rsn);
            for (int o = 0; o < M; o++) rope_row(dk + (size_t)o * d, outl[o], half, rc, rsn);
            /* sinks: along the mean query direction at position N-1 */
            double mn = norm2(mu, d);
            if (mn < 1e-6) mn = 1e-6;
            for (int c = 0; c < d; c++) tmp[c] = (float)(mu[c] / mn);
            rope_row(tmp, N - 1, half, rc, rsn);
            double gain = (log((double)N / (S ? S : 1)) + 2.0) / SYN_Q_SCALE + 1.0;
            uint64_t ss = stream_seed(cfg->seed, l, g, ST_QBIAS) ^ 0xa5a5a5a5u;
            for (int n = 0; n < S; n++) {
                float *kr = K + (size_t)n * d, *vr = V + (size_t)n * d;
                for (int c = 0; c < d; c++) {
                    kr[c] = (float)(gain * mn) * tmp[c] + SYN_NOISE_TEXT * fast_normal(&ss);
                    vr[c] = 0.1f * fast_normal(&ss);
                }
            }
        }
        /* queries and probes per query head */
        for (int h = 0; h < Hq; h++) {
            int g = h / G;
            const float *mu = muK + (size_t)g * d;
            double mn = norm2(mu, d);
            if (mn < 1e-6) mn = 1e-6;
            uint64_t bs = stream_seed(cfg->seed, l, h, ST_QBIAS);
            for (int c = 0; c < d; c++) bias[c] = (float)(SYN_Q_BIAS * kvs_rng_normal(&bs));
            for (int c = 0; c < d; c++) tmp[c] = (float)(mu[c] / mn);
            uint64_t qs = stream_seed(cfg->seed, l, h, ST_QNOISE);
            for (int i = 0; i < Nq; i++) {
                float *q = ly->q + ((size_t)h * Nq + i) * d;
                gen_query(q, d, tmp, bias, &qs);
                rope_row(q, N - Nq + i, half, rc, rsn);
            }
            if (P > 0) {
                uint64_t ps = stream_seed(cfg->seed, l, h, ST_PROBE);
                int n_aim = M > 0 ? P / 2 : 0;
                for (int p = 0; p < P; p++) {
                    float *q = probes[l] + ((size_t)h * P + p) * d;
                    gen_query(q, d, tmp, bias, &ps);
                    rope_row(q, N + p, half, rc, rsn);
                    if (p < n_aim) {
                        int o = (int)(kvs_rng_next(&ps) % (uint64_t)M);
                        const float *dv = devK + ((size_t)g * M + o) * d;
                        double dn = norm2(dv, d);
                        if (dn < 1e-6) dn = 1e-6;
                        double beta = (log((double)N) + 4.0) * sqrt((double)d) / dn;
                        for (int c = 0; c < d; c++) q[c] = 0.5f * q[c] + (float)(beta * dv[c] / dn);
                    }
                }
            }
        }
    }
    if (probes_out) {
        *probes_out = probes;
        probes = NULL;
    }
    if (outliers_out) {
        *outliers_out = outl;
        outl = NULL;
    }
    goto cleanup;
nomem:
    st = kvs_errorf(err, KVS_ERR_NOMEM,
                    "synth: out of memory for L %d x Hkv %d x N %d x d %d (%.1f MB of K+V)", L, Hkv, N, d,
                    2.0 * L * (double)kvsz * 4 / 1e6);
    kvs_dense_cache_free(out);
cleanup:
    if (probes) {
        for (int l = 0; l < L; l++) free(probes[l]);
        free(probes);
    }
    free(costab);
    free(rc);
    free(rsn);
    free(W);
    free(muK);
    free(muV);
    free(devK);
    free(devV);
    free(bias);
    free(tmp);
    free(outl);
    free(slot);
    free(mark);
    return st;
}
