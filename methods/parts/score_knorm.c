/*
 * score_knorm.c -- scorer `knorm`: low-norm keys are kept.
 *
 * Paper: "A Simple and Effective L2 Norm-Based Strategy for KV Cache
 * Compression", arXiv 2406.11430 (kvpress's KnormPress). Formula: key j of
 * a KV head scores minus its L2 norm, -||k_j||_2; the paper observes that
 * keys with a low norm draw high attention. Reads only K: no queries.
 * Cost one pass over K (N * d per head), rows converted to fp32 in tiles of
 * 64 (scratch [64][d] allocated once); squares summed in fp32.
 * Decisions: the score is the norm itself (sqrt taken), not the squared
 * norm, so ties are those of the stated formula. The paper also leaves the
 * first layers uncompressed in some runs; that is an allocator's business
 * (not in this slice), the scorer scores every layer.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

enum { KN_TILE = 64 };

typedef struct {
    const kvs_part_ctx *c;
    float *rows; /* [KN_TILE][d] */
} knorm_state;

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
    st->rows = malloc(sizeof(float) * KN_TILE * (size_t)c->shape.head_dim);
    if (!st->rows) {
        knorm_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

static kvs_status knorm_score(void *state, int layer, const kvs_layer *in, float *scores,
                              kvs_err *err) {
    (void)layer;
    (void)err;
    knorm_state *st = state;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads, d = st->c->shape.head_dim;
    for (int h = 0; h < H; h++)
        for (int n0 = 0; n0 < N; n0 += KN_TILE) {
            const int cnt = N - n0 < KN_TILE ? N - n0 : KN_TILE;
            kvs_view_rows_f32(&in->k, h, n0, cnt, st->rows);
            for (int i = 0; i < cnt; i++) {
                const float *r = st->rows + (size_t)i * d;
                float ss = 0.0f;
                for (int t = 0; t < d; t++) ss += r[t] * r[t];
                scores[(size_t)h * N + n0 + i] = -sqrtf(ss);
            }
        }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_knorm = {
    .name = "knorm",
    .needs = 0,
    .queries_wanted = NULL,
    .create = knorm_create,
    .score = knorm_score,
    .destroy = knorm_destroy,
};
