/*
 * score_knorm.c -- scorer `knorm`: low-norm keys are kept.
 *
 * Paper: "A Simple and Effective L2 Norm-Based Strategy for KV Cache
 * Compression", arXiv 2406.11430 (kvpress's KnormPress). Formula: key j of
 * a KV head scores minus its L2 norm, -||k_j||_2; the paper observes that
 * keys with a low norm draw high attention. Reads only K: no queries.
 * Cost one pass over K (N * d per head), on the shape's threads, all layers
 * in one parallel run (score_layers): units of 256 rows of one head, converted to fp32 in tiles of 64 (scratch [T][64][d]
 * allocated once); squares summed in fp32 in kvs_part_sumsq's fixed lane
 * order (the result does not depend on the thread count).
 * Decisions: the score is the norm itself (sqrt taken), not the squared
 * norm, so ties are those of the stated formula. The paper also leaves the
 * first layers uncompressed in some runs; that is an allocator's business
 * (not in this slice), the scorer scores every layer.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

enum { KN_TILE = 64, KN_UNIT = 256 }; /* rows per tile, rows per parallel unit */

typedef struct {
    const kvs_part_ctx *c;
    int T;       /* workers */
    float *rows; /* [T][KN_TILE][d] */
} knorm_state;

typedef struct {
    knorm_state *st;
    const kvs_layer *in; /* [n_layers] */
    float *scores;       /* [n_layers][Hkv][N] */
    int per_head;        /* units per head */
} knorm_job;

static void knorm_destroy(void *state) {
    knorm_state *st = state;
    if (!st) return;
    free(st->rows);
    free(st);
}

static kvs_status knorm_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    knorm_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->T = kvs_parallel_threads(c->shape.threads, 64);
    st->rows = malloc(sizeof(float) * (size_t)st->T * KN_TILE * (size_t)c->shape.head_dim);
    if (!st->rows) {
        knorm_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

/* Unit u: rows [n0, n0 + KN_UNIT) of (layer, head) u / per_head. */
static kvs_status knorm_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const knorm_job *j = job;
    const kvs_view *k = &j->in[0].k;
    const int N = k->n_tokens, d = k->head_dim, H = k->n_heads, lh = u / j->per_head;
    const int n0 = (u % j->per_head) * KN_UNIT, n1 = n0 + KN_UNIT < N ? n0 + KN_UNIT : N;
    const int l = lh / H, h = lh % H;
    float *rows = j->st->rows + (size_t)tid * KN_TILE * d, *out = j->scores + (size_t)lh * N;
    for (int t0 = n0; t0 < n1; t0 += KN_TILE) {
        const int cnt = n1 - t0 < KN_TILE ? n1 - t0 : KN_TILE;
        kvs_view_rows_f32(&j->in[l].k, h, t0, cnt, rows);
        for (int i = 0; i < cnt; i++) out[t0 + i] = -sqrtf(kvs_part_sumsq(rows + (size_t)i * d, d));
    }
    return KVS_OK;
}

static kvs_status knorm_layers(void *state, const kvs_layer *in, int n_layers, float *scores,
                               kvs_err *err) {
    knorm_state *st = state;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads;
    knorm_job j = {st, in, scores, (N + KN_UNIT - 1) / KN_UNIT};
    return kvs_parallel_run(&j, knorm_unit, n_layers * H * j.per_head, st->T, "knorm", err);
}

static kvs_status knorm_score(void *state, int layer, const kvs_layer *in, float *scores,
                              kvs_err *err) {
    (void)layer;
    return knorm_layers(state, in, 1, scores, err);
}

const kvs_scorer kvs_scorer_knorm = {
    .name = "knorm",
    .needs = 0,
    .queries_wanted = NULL,
    .create = knorm_create,
    .score = knorm_score,
    .destroy = knorm_destroy,
    .score_layers = knorm_layers,
};
