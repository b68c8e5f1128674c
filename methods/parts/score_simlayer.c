/*
 * score_simlayer.c -- scorer `simlayer`: SimLayerKV's per-layer choice as
 * scores. A lazy layer ranks its tokens by recency (StreamingLLM), any
 * other layer by the attention of the last query (TOVA's score).
 *
 * Paper: SimLayerKV, arXiv 2410.13846 (sources and the lazy measure:
 * alloc_simlayer.c). Per layer, kvs_simlayer_mass gives the last prompt
 * query's attention row [Hkv][N] (GQA-group mean) and its mass on the
 * first `sinks` and last `recent` keys; the layer is lazy when the mass
 * exceeds `lazy_threshold`. Scores:
 *   lazy:      s_j = j (newer = higher), so with the `sinks` rule the layer
 *              keeps its sinks and its most recent tokens: StreamingLLM;
 *   non-lazy:  s_j = the attention row (what the measure computed anyway).
 * The allocator `simlayer` reads the same mass (this scorer writes it to
 * the layer statistics, no second pass) and gives lazy layers only their
 * StreamingLLM size.
 * Parameters: sinks (absent 4), recent (absent 1024), lazy_threshold
 * (absent 0.9).
 * Decisions where the sources are silent: the paper and kvpress keep a
 * non-lazy layer whole; under a global budget a non-lazy layer may have to
 * drop tokens, and it drops those the last query attends to least (the
 * measure's own row, so the method stays one attention row per layer).
 * Cost Hq * N * d per layer; memory [Hq] + [Hkv][N].
 */
#include "kvs_parts.h"

#include <stdlib.h>

typedef struct {
    const kvs_part_ctx *c;
    float *lse; /* [Hq] */
} sim_state;

static int sim_queries(const kvs_method *m, const kvs_params *p, int N) {
    (void)m, (void)p, (void)N;
    return 1;
}

static void sim_destroy(void *state) {
    sim_state *st = state;
    if (!st) return;
    free(st->lse);
    free(st);
}

static kvs_status sim_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    sim_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->lse = malloc(sizeof(float) * (size_t)(c->shape.n_q_heads > 0 ? c->shape.n_q_heads : 1));
    if (!st->lse) {
        sim_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

static kvs_status sim_score(void *state, int layer, const kvs_layer *in, float *scores,
                            kvs_err *err) {
    sim_state *st = state;
    const kvs_part_ctx *c = st->c;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads;
    if (in->q.data && in->q.n_heads != c->shape.n_q_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: %d query heads but the shape says %d",
                          c->m->name, layer, in->q.n_heads, c->shape.n_q_heads);
    double mass = 0.0;
    kvs_status rc = kvs_simlayer_mass(in, (int)kvs_part_param(c->m, c->p, "sinks", 4),
                                      (int)kvs_part_param(c->m, c->p, "recent", 1024),
                                      c->shape.threads, st->lse, scores, &mass, err);
    if (rc) return kvs_err_prefix(err, "%s: layer %d", c->m->name, layer);
    if (c->stats && (c->want_stats & KVS_STAT_LAZY)) {
        c->stats[layer].lazy_mass = mass;
        c->stats[layer].have |= KVS_STAT_LAZY;
    }
    if (mass > kvs_part_param(c->m, c->p, "lazy_threshold", 0.9))
        for (int h = 0; h < H; h++)
            for (int j = 0; j < N; j++) scores[(size_t)h * N + j] = (float)j;
    return KVS_OK;
}

const kvs_scorer kvs_scorer_simlayer = {
    .name = "simlayer",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = sim_queries,
    .create = sim_create,
    .score = sim_score,
    .destroy = sim_destroy,
};
