/*
 * score_cake.c -- scorer `cake`: CAKE's eviction indicator, the mean plus
 * gamma times the variance of the window's attention to each key.
 *
 * Paper: CAKE, "Cascading and Adaptive KV Cache Eviction with Layer
 * Preferences", arXiv 2503.12491 (ICLR 2025), its eviction indicator;
 * official code antgroup/cakekv, read as mirrored in qtris123/cakekv at
 * commit e6adc5e (cake/model/modify_llama.py, llama_attn_forward_cake;
 * experiments/LongBench/pred_cake.py for the defaults).
 * Formula, per layer and query head, with the last w prompt queries (the
 * window) and A[i][j] their causal softmax over the keys: for each prefix
 * key j < N - w, I_j = mean_i A[i][j] + gamma * var_i A[i][j] (unbiased
 * over the w rows): a key that is attended on average, or attended
 * unevenly across the window (its importance shifts), is kept. I is
 * averaged over the G query heads of a KV head and smoothed along tokens by
 * an average pooling of `kernel` tokens, zero padded, always divided by the
 * kernel (the official F.avg_pool1d with its default count_include_pad).
 * The window tokens [N - w, N) score FLT_MAX (the `window` keep rule keeps
 * them, as CAKE keeps its window).
 * Computed by kvs_cake_measure_ex (alloc_cake.c) in the same pass as the
 * `cake` allocator's dispersion and shift, which this scorer writes to the
 * layer statistics when the allocator reads them (no second pass).
 * Parameters: window (absent 32), kernel (absent 5), cake_gamma (absent
 * 200: pred_cake.py's default, used for every reported run).
 * Decisions where the sources disagree or are silent:
 *   - The parameter is `cake_gamma`, not `gamma` (flashcache's `gamma` is
 *     its low-pass cut-off; one name means one thing in a composition).
 *   - Probabilities in fp32 with double sums (the official code casts them
 *     to the model dtype, fp16 / bf16, before mean and variance).
 *   - An even kernel covers j - k/2 .. j - k/2 + k - 1 (snapkv's
 *     convention; torch would return one more column, which the official
 *     code, with kernel 5, never meets).
 *   - w_eff = min(window, N - 1); fewer than w_eff recorded queries is an
 *     error (as snapkv). N <= 2 (w_eff < 2: no variance) scores the prefix
 *     0 (a single prefix token at most; nothing to rank).
 * Cost Hq * w * N * d per layer (one sgemm per query head on the shape's
 * threads, as CAKE's allocator); memory as kvs_cake_measure_ex +
 * [Hkv][N - w].
 */
#include "kvs_parts.h"

#include <float.h>
#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    float *ev; /* [Hkv][N] indicator before pooling */
} cake_state;

static int cake_w(const kvs_method *m, const kvs_params *p, int N) {
    int w = (int)kvs_part_param(m, p, "window", 32);
    if (w > N - 1) w = N - 1;
    return w < 0 ? 0 : w;
}

static int cake_queries(const kvs_method *m, const kvs_params *p, int N) {
    const int w = cake_w(m, p, N);
    return w > 0 ? w : 1;
}

static void cake_destroy(void *state) {
    cake_state *st = state;
    if (!st) return;
    free(st->ev);
    free(st);
}

static kvs_status cake_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    cake_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->ev = malloc(sizeof(float) * (size_t)c->shape.n_kv_heads * (size_t)c->shape.n_tokens);
    if (!st->ev) {
        cake_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

static kvs_status cake_score(void *state, int layer, const kvs_layer *in, float *scores,
                             kvs_err *err) {
    cake_state *st = state;
    const kvs_part_ctx *c = st->c;
    const char *mn = c->m->name;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    const int w = cake_w(c->m, c->p, N), P = N - w;
    const int kernel = (int)kvs_part_param(c->m, c->p, "kernel", 5);
    const double gamma = kvs_part_param(c->m, c->p, "cake_gamma", 200.0);
    for (size_t i = 0; i < (size_t)H * (size_t)N; i++) scores[i] = 0.0f;
    if (w < 2) { /* N <= 2: at most one prefix token */
        for (int h = 0; h < H; h++)
            for (int j = P; j < N; j++) scores[(size_t)h * N + j] = FLT_MAX;
        return KVS_OK;
    }
    if (!in->q.data || in->q.n_tokens < w)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the queries of the last %d prompt positions "
                          "(window=%d) but %d were recorded",
                          mn, layer, w, w, in->q.data ? in->q.n_tokens : 0);
    double D = 0.0, V = 0.0;
    kvs_status rc = kvs_cake_measure_ex(in, w, gamma, &D, &V, st->ev, c->shape.threads, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", mn, layer);
    /* the allocator measures with min(window, Nq, N - 1): the same w here */
    if (c->stats && (c->want_stats & KVS_STAT_CAKE)) {
        c->stats[layer].cake_disp = D;
        c->stats[layer].cake_var = V;
        c->stats[layer].have |= KVS_STAT_CAKE;
    }
    const int lo = kernel / 2;
    for (int h = 0; h < H; h++) {
        const float *ev = st->ev + (size_t)h * P; /* [P] */
        float *dst = scores + (size_t)h * N;      /* [N] */
        for (int j = 0; j < P; j++) {
            double s = 0.0;
            int a = j - lo, b = j - lo + kernel; /* [a, b) clipped: zero padding */
            if (a < 0) a = 0;
            if (b > P) b = P;
            for (int t = a; t < b; t++) s += ev[t];
            dst[j] = (float)(s / kernel);
        }
        for (int j = P; j < N; j++) dst[j] = FLT_MAX;
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_cake = {
    .name = "cake",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = cake_queries,
    .create = cake_create,
    .score = cake_score,
    .destroy = cake_destroy,
};
