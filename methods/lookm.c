/*
 * lookm.c -- LOOK-M (text-prior eviction + merging), CPU reference. Follows
 * the spec (shared/spec/methods.md, "LOOK-M").
 *
 * Rules:
 *   - Scores as H2O: per query head the column sum of the causal attention
 *     over ALL N prefill queries, GQA mean over the group, raw sums (core's
 *     two-pass kvs_attn_lse + kvs_attn_colsum, O(N) memory per head).
 *   - Text prior, per KV head: every text token's score gets + max_j s[j]
 *     (the max over all tokens of that head, before boosting), so text
 *     outranks image. Modality absent (NULL) means every token is text, and
 *     then the ranking equals H2O's.
 *   - Per KV head and layer with budget B: keep the recent M = floor(B / 2)
 *     tokens and the top B - M of tokens [0, N - M) by the boosted score (ties:
 *     lower token index). B >= N keeps everything. This is the paper's rule
 *     and hits the budget exactly; every layer keeps B = per_layer.
 *   - Merge (`merge`, default pivotal): written into plan->merge; core's
 *     kvs_apply assigns every evicted token to the kept token of the same
 *     KV head with the most cosine-similar KEY and merges K and V with the
 *     chosen formula (pivotal / average / weighted / none).
 *
 * Decisions the spec left open (named parameters or stated here):
 *   - `text_policy` (enum budget|keep_all, default budget). keep_all (the
 *     released code: keep every text token) may keep more than B tokens per
 *     layer, which breaks the exact-budget plan contract (every layer keeps
 *     exactly its budget, sum = L * per_layer, equal count per head). It is
 *     therefore NOT implemented: create returns KVS_ERR_UNSUPPORTED with that
 *     explanation. (When the text tokens fit in the budget, keep_all and
 *     budget coincide anyway, since boosted text outranks every image token.)
 *   - `recent_frac` (float, default 0.5, range [0, 1]): M = floor(B *
 *     recent_frac); the default is exactly the spec's floor(B / 2).
 *   - Modality values other than text (image, video, audio) get no boost;
 *     a value outside KVS_MOD_* is KVS_ERR_INVALID.
 *   - Missing queries or Nq != N: KVS_ERR_INVALID naming lookm, the layer and
 *     Nq, at create and at observe. Host memory only.
 *   - The boosted score is formed in fp32 (s + max); two text scores closer
 *     than one fp32 ulp of (s + max) may become equal and then the lower
 *     index wins.
 *
 * What this file is not: attention statistics live in core/, merging in
 * core's kvs_apply, shared helpers in textprior.c.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve_methods.h"
#include "textprior.h"

static const kvs_param_def lookm_params[] = {
    {"text_policy", KVS_PARAM_ENUM, 0, 0, 0, "budget|keep_all",
     "budget: text prior within the exact budget (paper); keep_all (released code, may exceed "
     "the budget) is rejected as unsupported"},
    {"merge", KVS_PARAM_ENUM, 0, 0, 0, "pivotal|average|weighted|none",
     "how evicted tokens are merged into their most key-similar kept token at apply"},
    {"recent_frac", KVS_PARAM_FLOAT, 0.5, 0.0, 1.0, NULL,
     "share of the budget kept as the recent window, M = floor(B * recent_frac) (spec: 0.5)"},
};
enum { P_TEXT_POLICY = 0, P_MERGE = 1, P_RECENT_RATIO = 2 };
enum { POLICY_BUDGET = 0, POLICY_KEEP_ALL = 1 };

/* Index in the `merge` choices -> plan merge formula. */
static const kvs_merge lookm_merge_of[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE,
                                            KVS_MERGE_WEIGHTED, KVS_MERGE_NONE};

typedef struct {
    kvs_tp_state tp; /* first member (kvs_tp_create / kvs_tp_destroy); scores are boosted */
    kvs_merge merge;
} lookm_state;

static kvs_status lookm_create(const kvs_params *p, const kvs_shape *shape, void **state,
                               kvs_err *err) {
    *state = NULL;
    /* parameters first, then the policy, then the rest of the shared checks
     * (kvs_tp_create checks the parameters again, which then pass) */
    kvs_status st = kvs_tp_check_params(&kvs_method_lookm, p, err);
    if (st != KVS_OK) return st;
    if ((int)p->v[P_TEXT_POLICY] == POLICY_KEEP_ALL)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "lookm: text_policy=keep_all keeps every text token and may exceed the "
                          "budget, which breaks the exact-budget plan contract (each layer keeps "
                          "exactly its budget); use text_policy=budget");
    st = kvs_tp_create(&kvs_method_lookm, p, shape, P_RECENT_RATIO, sizeof(lookm_state), state,
                       err);
    if (st != KVS_OK) return st;
    lookm_state *s = *state;
    s->merge = lookm_merge_of[(int)p->v[P_MERGE]];
    return KVS_OK;
}

static kvs_status lookm_observe(void *state, int layer, const kvs_layer *in,
                                const uint8_t *modality, kvs_err *err) {
    lookm_state *s = state;
    return kvs_tp_observe(&s->tp, layer, in, modality, 0, 1, NULL, NULL, err);
}

static kvs_status lookm_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    lookm_state *s = state;
    return kvs_tp_select_uniform(&s->tp, per_layer, s->merge, out, err);
}

const kvs_method kvs_method_lookm = {
    .name = "lookm",
    .summary = "LOOK-M: H2O scores with a text prior, recent window, evicted tokens merged",
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .params = lookm_params,
    .n_params = (int)(sizeof lookm_params / sizeof lookm_params[0]),
    .queries_wanted = kvs_tp_queries_all,
    .create = lookm_create,
    .observe = lookm_observe,
    .select = lookm_select,
    .destroy = kvs_tp_destroy,
};
