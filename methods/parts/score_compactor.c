/*
 * score_compactor.c -- scorer `compactor`: Compactor's blend of approximate
 * leverage scores of the keys and non-causal chunked attention.
 *
 * Paper: Compactor, "Calibrated Query-Agnostic KV Cache Compression with
 * Approximate Leverage Scores", arXiv 2507.08143; code read: kvpress
 * CompactorPress and NonCausalAttnPress (compactor_press.py,
 * non_causal_attention_press.py, kvpress 0.5.5 wheel).
 * Formula, per layer, on the inner tokens [s, N - e) (s = the first
 * `sinks`, e = the last `window`, which score FLT_MAX: the keep rules hold
 * them, as the press pads them with its maximum):
 *   leverage  kvs_leverage_head (score_leverage.c) of each KV head's inner
 *             keys (centred over the inner tokens, Gaussian sketch of
 *             sketch_dimension columns, seeded per (layer, head) as the
 *             leverage scorer), z-scored over the layer's [Hkv][n] values;
 *   attention the inner tokens cut into chunks of attn_chunk from the first
 *             inner token (the last one shorter); in each chunk every query
 *             attends to every key of the chunk, non-causal, with the plain
 *             dot product (no 1/sqrt(d), as the press); key j's column sum,
 *             averaged over the G query heads, times ||v_j||, average-pooled
 *             over 3 tokens (zero padded, / 3), z-scored over the layer;
 *   score     blending * leverage_z + attention_z.
 * Z-scores: mean and unbiased standard deviation (at least 1e-6) over the
 * layer's [Hkv][n] values, as torch's mean / std over the whole tensor.
 * Parameters: sinks (absent 8) and window (absent 4): the press's
 * sink_size_start / sink_size_end; attn_chunk (absent 256), sketch_dimension
 * (48), seed (0), blending (absent 0.75).
 * Decisions where the sources disagree or are silent:
 *   - blending: the press sets it to the compression ratio (the share of
 *     tokens removed); here scores are computed before the budget is known
 *     (observe precedes select), so it is a parameter, default 0.75: the
 *     press's value at the project's reference budget of 0.25 kept.
 *   - The press pads the last chunk with zero queries and keys and masks
 *     the padded keys with -1e-9 (not -inf), so padding takes attention
 *     mass in the last chunk; here the last chunk is simply shorter.
 *   - Queries: the press recomputes the post-RoPE queries of every prompt
 *     position from the hidden states; here they are the recorded queries
 *     (KVS_NEED_Q_ALL). Keys: post-RoPE as cached (the leverage press
 *     recomputes pre-RoPE keys; see score_leverage.c).
 *   - The chunk parameter is `attn_chunk` (ChunkKV's `chunk` means another
 *     thing). The sketch stream is the leverage scorer's, over the inner keys.
 * Cost per layer: Hq * n * attn_chunk * d (sgemm per chunk) + the leverage
 * sketch (Hkv * n * d * k); memory attn_chunk^2 + n * (d + k) floats.
 */
#include "kvs_parts.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    int chunk, k;
    float *kr, *qr, *y, *logit; /* [N][d], [chunk][d], [N][k], [chunk][chunk] */
    double *g, *z, *lev, *att;  /* [k][k], [k][k], [Hkv][N], [Hkv][N] */
} cpt_state;

static int cpt_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m, (void)p;
    return N;
}

static void cpt_destroy(void *state) {
    cpt_state *st = state;
    if (!st) return;
    free(st->kr), free(st->qr), free(st->y), free(st->logit);
    free(st->g), free(st->z), free(st->lev), free(st->att);
    free(st);
}

static kvs_status cpt_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim,
                 H = (size_t)c->shape.n_kv_heads;
    cpt_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->k = (int)kvs_part_param(c->m, c->p, "sketch_dimension", 48);
    double ch = kvs_part_param(c->m, c->p, "attn_chunk", 256);
    st->chunk = ch < (double)N ? (int)ch : (int)N;
    if (st->chunk < 1) st->chunk = 1;
    const size_t k = (size_t)st->k, m = (size_t)st->chunk;
    st->kr = malloc(sizeof(float) * N * d);
    st->qr = malloc(sizeof(float) * m * d);
    st->y = malloc(sizeof(float) * N * k);
    st->logit = malloc(sizeof(float) * m * m);
    st->g = malloc(sizeof(double) * k * k);
    st->z = malloc(sizeof(double) * k * k);
    st->lev = malloc(sizeof(double) * H * N);
    st->att = malloc(sizeof(double) * H * N);
    if (!st->kr || !st->qr || !st->y || !st->logit || !st->g || !st->z || !st->lev || !st->att) {
        cpt_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for N=%zu chunk=%zu sketch=%zu", N,
                          m, k);
    }
    *state = st;
    return KVS_OK;
}

/* x [n] of each of H heads (stride N) to z-scores over all H * n values. */
static void zscore(double *x, int H, int N, int n) {
    double mean = 0.0, var = 0.0;
    const double cnt = (double)H * n;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < n; j++) mean += x[(size_t)h * N + j];
    mean /= cnt;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < n; j++) {
            const double t = x[(size_t)h * N + j] - mean;
            var += t * t;
        }
    double sd = cnt > 1 ? sqrt(var / (cnt - 1)) : 0.0;
    if (!(sd >= 1e-6)) sd = 1e-6;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < n; j++) x[(size_t)h * N + j] = (x[(size_t)h * N + j] - mean) / sd;
}

static kvs_status cpt_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    cpt_state *st = state;
    const kvs_part_ctx *c = st->c;
    const char *mn = c->m->name;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, d = c->shape.head_dim;
    const int Hq = c->shape.n_q_heads, G = Hq / H;
    if (!in->q.data || in->q.n_tokens != N || in->q.n_heads != Hq)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the queries of all %d prompt positions but %d were "
                          "recorded",
                          mn, layer, N, in->q.data ? in->q.n_tokens : 0);
    const double sv = kvs_part_param(c->m, c->p, "sinks", 8), ev = kvs_part_param(c->m, c->p, "window", 4);
    const int s = sv < N ? (int)sv : N;
    const int e = ev < N - s ? (int)ev : N - s;
    const int n = N - s - e; /* inner tokens [s, s + n) */
    const double blend = kvs_part_param(c->m, c->p, "blending", 0.75);
    const uint64_t seed = (uint64_t)kvs_part_param(c->m, c->p, "seed", 0);
    for (size_t i = 0; i < (size_t)H * N; i++) scores[i] = FLT_MAX;
    if (n < 1) return KVS_OK;
    for (int h = 0; h < H; h++) {
        /* leverage of the inner keys */
        kvs_view_rows_f32(&in->k, h, s, n, st->kr);
        const uint64_t stream = seed + (uint64_t)(layer * H + h + 1) * 0x9E3779B97F4A7C15ull;
        kvs_status rc = kvs_leverage_head(st->kr, n, d, st->k, stream, st->y, st->g, st->z,
                                          st->lev + (size_t)h * N, err);
        if (rc) return kvs_err_prefix(err, "%s: layer %d KV head %d", mn, layer, h);
        /* non-causal chunked attention column sums, group mean */
        double *att = st->att + (size_t)h * N;
        for (int j = 0; j < n; j++) att[j] = 0.0;
        for (int a = 0; a < n; a += st->chunk) {
            const int m = n - a < st->chunk ? n - a : st->chunk;
            const float *kc = st->kr + (size_t)a * d; /* [m][d] */
            for (int t = 0; t < G; t++) {
                kvs_view_rows_f32(&in->q, h * G + t, s + a, m, st->qr);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, d, 1.0f, st->qr, d, kc,
                            d, 0.0f, st->logit, m);
                for (int i = 0; i < m; i++) {
                    float *row = st->logit + (size_t)i * m;
                    float mx = -INFINITY;
                    for (int j = 0; j < m; j++) mx = row[j] > mx ? row[j] : mx;
                    double zs = 0.0;
                    for (int j = 0; j < m; j++) zs += (row[j] = expf(row[j] - mx));
                    for (int j = 0; j < m; j++) att[a + j] += row[j] / zs / G;
                }
            }
        }
        /* times ||v||, pooled over 3 (zero padded, / 3) */
        kvs_view_rows_f32(&in->v, h, s, n, st->kr);
        for (int j = 0; j < n; j++) {
            double nv = 0.0;
            for (int x = 0; x < d; x++) nv += (double)st->kr[(size_t)j * d + x] * st->kr[(size_t)j * d + x];
            att[j] *= sqrt(nv);
        }
        double prev = 0.0;
        for (int j = 0; j < n; j++) {
            const double cur = att[j], next = j + 1 < n ? att[j + 1] : 0.0;
            att[j] = (prev + cur + next) / 3.0;
            prev = cur;
        }
    }
    zscore(st->lev, H, N, n);
    zscore(st->att, H, N, n);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < n; j++) {
            const double x = blend * st->lev[(size_t)h * N + j] + st->att[(size_t)h * N + j];
            if (!isfinite(x))
                return kvs_errorf(err, KVS_ERR_NUMERIC, "%s: layer %d: KV head %d: token %d: "
                                  "score is not finite", mn, layer, h, s + j);
            scores[(size_t)h * N + s + j] = (float)x;
        }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_compactor = {
    .name = "compactor",
    .needs = KVS_NEED_Q_ALL,
    .queries_wanted = cpt_queries,
    .create = cpt_create,
    .score = cpt_score,
    .destroy = cpt_destroy,
};
