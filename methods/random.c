/*
 * random.c -- the `random` control: a uniform random subset per KV head.
 *
 * Spec (methods.md, "Controls"): uniform random subset per head with a seed;
 * the floor any method must beat. Every head of a layer keeps B = per_layer
 * tokens (no re-allocation across layers); B >= N keeps everything.
 *
 * Parameters: seed (int, default 0, range [0, 2^31 - 1]).
 * Decisions the spec left open:
 *   - The stream of (layer l, head h) is splitmix64 seeded with
 *     seed + (l * Hkv + h + 1) * 0x9E3779B97F4A7C15, so a head's choice does not
 *     depend on the order heads are visited, on threads, or on other heads.
 *   - The subset is drawn by a partial Fisher-Yates shuffle of 0..N-1 (B draws,
 *     each j = i + floor(u * (N - i)) with u in [0, 1) of 53 bits), then sorted.
 * What it is not: it looks at no K/V values (observe only checks the shape).
 */
#include "kvsieve_methods.h"

#include <assert.h>
#include <stdlib.h>

enum { P_SEED = 0 };

static const kvs_param_def random_params[] = {
    {"seed", KVS_PARAM_INT, 0, 0, 2147483647.0, NULL,
     "seed of the per-(layer, head) random streams; same seed, same subset"},
};

typedef struct {
    kvs_shape shape;
    uint64_t seed;
} random_state;

static kvs_status random_create(const kvs_params *p, const kvs_shape *s, void **state,
                                kvs_err *err) {
    assert(p->n == (int)(sizeof random_params / sizeof random_params[0]));
    random_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "random: out of memory");
    st->shape = *s;
    st->seed = (uint64_t)p->v[P_SEED];
    *state = st;
    return KVS_OK;
}

static kvs_status random_observe(void *state, int layer, const kvs_layer *in,
                                 const uint8_t *modality, kvs_err *err) {
    random_state *st = state;
    if (layer < 0 || layer >= st->shape.n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "random: layer %d out of range [0, %d)", layer,
                          st->shape.n_layers);
    if (in->k.n_tokens != st->shape.n_tokens || in->k.n_heads != st->shape.n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "random: layer %d: K is [%d][%d] but the shape says [%d][%d]", layer,
                          in->k.n_heads, in->k.n_tokens, st->shape.n_kv_heads,
                          st->shape.n_tokens);
    return KVS_OK;
}

static kvs_status random_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    random_state *st = state;
    const int L = st->shape.n_layers, H = st->shape.n_kv_heads, N = st->shape.n_tokens;
    kvs_status rc = KVS_OK;
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "random: per-layer budget %d outside [1, %d]",
                          per_layer, N);
    const int B = per_layer;
    int *budgets = calloc((size_t)(L > 0 ? L : 1), sizeof(int)); /* [L] */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)N); /* [N] */
    if (!budgets || !perm) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "random: out of memory (N=%d)", N);
        goto cleanup;
    }
    for (int l = 0; l < L; l++) budgets[l] = B;
    rc = kvs_plan_init(out, "random", L, H, N, budgets, err);
    if (rc) goto cleanup;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            uint64_t rng = st->seed + (uint64_t)((int64_t)l * H + h + 1) * 0x9E3779B97F4A7C15ull;
            for (int n = 0; n < N; n++) perm[n] = n;
            for (int i = 0; i < B; i++) {
                int j = i + (int)(kvs_rng_uniform(&rng) * (double)(N - i));
                if (j >= N) j = N - 1; /* u < 1 makes this unreachable; kept as a guard */
                int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            int32_t *row = out->layers[l].idx + (int64_t)h * B; /* [B] */
            for (int i = 0; i < B; i++) row[i] = perm[i];
            kvs_sort_i32(row, B);
        }
cleanup:
    free(budgets);
    free(perm);
    return rc;
}

static void random_destroy(void *state) { free(state); }

const kvs_method kvs_method_random = {
    .name = "random",
    .summary = "control: uniform random subset per KV head (seeded)",
    .needs = 0,
    .params = random_params,
    .n_params = (int)(sizeof random_params / sizeof random_params[0]),
    .queries_wanted = NULL,
    .create = random_create,
    .observe = random_observe,
    .select = random_select,
    .destroy = random_destroy,
};
