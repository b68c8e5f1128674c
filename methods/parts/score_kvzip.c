/*
 * score_kvzip.c -- scorer `kvzip`: KVzip's context-reconstruction scores.
 *
 * Paper: "KVzip: Query-Agnostic KV Cache Compression with Context
 * Reconstruction", arXiv 2505.23416 (official snu-mllab/KVzip; kvpress
 * KVzipPress). Formula: after the prompt is prefilled, the model is fed a
 * reconstruction input ("Repeat the previous context exactly." and the
 * prompt's own tokens, teacher-forced, chunk by chunk) on top of the
 * prompt's cache; token j of KV head g scores the maximum attention it
 * receives from any reconstruction query of its chunk and any query head of
 * g's group. That forward pass is the producer's (the engine's): the
 * scorer reads it from kvs_layer.attn_recon_max (KVS_NEED_RECON) and
 * refuses a view without it, naming the layer.
 * Sinks: the first `sinks` tokens score 1, the highest attention there is
 * (the official code's rule, kvpress's initial value), so a global ranking
 * (allocator `global`) counts them as kept, as the sinks rule keeps them.
 * Cost: one pass over [Hkv][N] per layer (the statistic's pass is the
 * producer's: about one prefill of the prompt's length).
 * What it is not: the reconstruction pass (backend/model/forward.c).
 */
#include "kvs_parts.h"

#include <stdlib.h>
#include <string.h>

static kvs_status kvzip_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    (void)err;
    *state = (void *)c;
    return KVS_OK;
}

static kvs_status kvzip_score(void *state, int layer, const kvs_layer *in, float *scores,
                              kvs_err *err) {
    const kvs_part_ctx *c = state;
    const int H = c->shape.n_kv_heads, N = c->shape.n_tokens;
    if (!in->attn_recon_max)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "scorer kvzip: layer %d: the cache view has no context-reconstruction "
                          "statistic (kvs_layer.attn_recon_max, KVS_NEED_RECON)",
                          layer);
    double sk = kvs_part_param(c->m, c->p, "sinks", 0.0);
    const int sinks = sk < (double)N ? (int)sk : N;
    memcpy(scores, in->attn_recon_max, sizeof(float) * (size_t)H * (size_t)N);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < sinks; j++) scores[(size_t)h * N + j] = 1.0f;
    return KVS_OK;
}

static void kvzip_destroy(void *state) { (void)state; }

const kvs_scorer kvs_scorer_kvzip = {
    .name = "kvzip",
    .needs = KVS_NEED_RECON,
    .queries_wanted = NULL,
    .create = kvzip_create,
    .score = kvzip_score,
    .destroy = kvzip_destroy,
};
