/*
 * pick_topk.c -- pick rule `topk`: the k best-scored candidates, token by token.
 *
 * Formula: among the candidates [lo, hi) the k largest scores, ties to the
 * lower index (core's kvs_topk_indices, O(n) average; its scratch is the
 * only allocation, once per head), returned ascending. This is the rule of
 * SnapKV, H2O, TOVA, Knorm and KeyDiff. No parameters.
 */
#include "kvs_parts.h"

static kvs_status topk_pick(const kvs_part_ctx *c, const float *scores, int lo, int hi, int k,
                            kvs_pick_ws *ws, int32_t *out, kvs_err *err) {
    (void)c;
    (void)ws;
    kvs_status rc = kvs_topk_indices(scores + lo, hi - lo, k, out, err);
    if (rc) return rc;
    if (lo)
        for (int i = 0; i < k; i++) out[i] += lo;
    return KVS_OK;
}

const kvs_pick_rule kvs_pick_topk = {.name = "topk", .pick = topk_pick};
