/*
 * streamingllm.c -- StreamingLLM: attention sinks plus a recent window.
 *
 * Spec (methods.md, "StreamingLLM"): keep tokens [0, S) and the last B - S,
 * S = 4 sink tokens; if B <= S keep the first B. Same set for all heads and
 * layers. No scores. No re-rotation: the original re-rotates keys by cache
 * slot, which needs pre-RoPE keys; the option `rerotate` (default off) is
 * declared and asking for it is KVS_ERR_UNSUPPORTED at create().
 *
 * Parameters: sinks (int, default 4, range [0, 2^31 - 1]),
 *             rerotate (bool, default false; true is unsupported).
 * Decisions the spec left open:
 *   - B >= N keeps everything (the common rule), which also covers S >= N.
 *   - sinks = 0 is allowed and keeps only the last B tokens.
 * What it is not: it reads no K/V values (observe only checks the shape).
 */
#include "kvsieve_methods.h"

#include <assert.h>
#include <stdlib.h>

enum { P_SINKS = 0, P_REROTATE = 1 };

static const kvs_param_def sllm_params[] = {
    {"sinks", KVS_PARAM_INT, 4, 0, 2147483647.0, NULL,
     "attention-sink tokens kept at the start of the prompt (S)"},
    {"rerotate", KVS_PARAM_BOOL, 0, 0, 1, NULL,
     "re-rotate kept keys to their cache slot (needs pre-RoPE keys; not supported)"},
};

typedef struct {
    kvs_shape shape;
    int sinks;
} sllm_state;

static kvs_status sllm_create(const kvs_params *p, const kvs_shape *s, void **state,
                              kvs_err *err) {
    assert(p->n == (int)(sizeof sllm_params / sizeof sllm_params[0]));
    if (p->v[P_REROTATE] != 0)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "streamingllm: rerotate=true is not supported: re-rotating keys to "
                          "their cache slot needs pre-RoPE keys, and caches hold post-RoPE keys");
    sllm_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "streamingllm: out of memory");
    st->shape = *s;
    st->sinks = (int)p->v[P_SINKS];
    *state = st;
    return KVS_OK;
}

static kvs_status sllm_observe(void *state, int layer, const kvs_layer *in,
                               const uint8_t *modality, kvs_err *err) {
    sllm_state *st = state;
    if (layer < 0 || layer >= st->shape.n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "streamingllm: layer %d out of range [0, %d)",
                          layer, st->shape.n_layers);
    if (in->k.n_tokens != st->shape.n_tokens || in->k.n_heads != st->shape.n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "streamingllm: layer %d: K is [%d][%d] but the shape says [%d][%d]",
                          layer, in->k.n_heads, in->k.n_tokens, st->shape.n_kv_heads,
                          st->shape.n_tokens);
    return KVS_OK;
}

static kvs_status sllm_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    sllm_state *st = state;
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "streamingllm: per-layer budget %d outside [1, %d]", per_layer, N);
    const int B = per_layer;
    kvs_status rc = KVS_OK;
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "streamingllm: out of memory");
    for (int l = 0; l < L; l++) budgets[l] = B;
    rc = kvs_plan_init(out, "streamingllm", L, H, N, budgets, err);
    if (rc) goto cleanup;
    /* The one index set: [0, S) + [N - (B - S), N), or [0, B) when B <= S. */
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            int32_t *row = out->layers[l].idx + (int64_t)h * B; /* [B] */
            if (B >= N || B <= st->sinks) {
                for (int i = 0; i < B; i++) row[i] = i; /* B == N: everything */
            } else {
                const int S = st->sinks, R = B - S;
                for (int i = 0; i < S; i++) row[i] = i;
                for (int i = 0; i < R; i++) row[S + i] = N - R + i;
                assert(N - R >= S);
            }
        }
cleanup:
    free(budgets);
    return rc;
}

static void sllm_destroy(void *state) { free(state); }

const kvs_method kvs_method_streamingllm = {
    .name = "streamingllm",
    .summary = "StreamingLLM: first `sinks` tokens plus the most recent ones",
    .needs = 0,
    .params = sllm_params,
    .n_params = (int)(sizeof sllm_params / sizeof sllm_params[0]),
    .queries_wanted = NULL,
    .create = sllm_create,
    .observe = sllm_observe,
    .select = sllm_select,
    .destroy = sllm_destroy,
};
