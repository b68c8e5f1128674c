/*
 * score_random.c -- scorer `random`: independent uniform scores (a control).
 *
 * Not from a paper: the spec's `random` control, as a part, so that keep
 * rules and allocators can be tested and ablated against chance. Formula:
 * token j of (layer l, KV head h) scores u in [0, 1) from the splitmix64
 * stream seeded with seed + (l * Hkv + h + 1) * 0x9E3779B97F4A7C15 (the
 * stream methods/random.c uses), drawn in token order. Top-k of i.i.d.
 * uniform scores is a uniform random subset, but NOT the same subset as the
 * `random` method's partial Fisher-Yates draw: the plans differ.
 * Parameters: seed (absent: 0). Reads no K/V values. Cost N per head.
 */
#include "kvs_parts.h"

#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    uint64_t seed;
} rnd_state;

static kvs_status rnd_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    rnd_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->seed = (uint64_t)kvs_part_param(c->m, c->p, "seed", 0);
    *state = st;
    return KVS_OK;
}

static kvs_status rnd_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    (void)in;
    (void)err;
    rnd_state *st = state;
    const int N = st->c->shape.n_tokens, H = st->c->shape.n_kv_heads;
    for (int h = 0; h < H; h++) {
        uint64_t rng = st->seed + (uint64_t)((int64_t)layer * H + h + 1) * 0x9E3779B97F4A7C15ull;
        for (int j = 0; j < N; j++) scores[(size_t)h * N + j] = (float)kvs_rng_uniform(&rng);
    }
    return KVS_OK;
}

static void rnd_destroy(void *state) { free(state); }

const kvs_scorer kvs_scorer_random = {
    .name = "random",
    .needs = 0,
    .queries_wanted = NULL,
    .create = rnd_create,
    .score = rnd_score,
    .destroy = rnd_destroy,
};
