/*
 * pick_segment.c -- pick rule `segment`: the budget spread over segments of
 * the prompt in proportion to their length, top-k within each (Finch's
 * chunked selection, kvpress FinchPress with chunk_length).
 *
 * Formula: the candidates [lo, hi) (n tokens) are cut into consecutive
 * segments of `chunk_length` tokens from lo (the last one may be shorter);
 * segment s of n_s tokens gets k_s = floor(k n_s / n), and the k - sum k_s
 * tokens left go one each to the segments with the largest remainders
 * (k n_s mod n; ties: lower segment), so k_s <= n_s and the count is exactly
 * k; each segment keeps its k_s best-scored tokens (ties: lower index).
 * chunk_length 0 (absent) is one segment: the topk rule.
 * Decisions where sources disagree: kvpress keeps max(1, int(n_s * (1 -
 * ratio))) per chunk of the whole prompt (its window included), whose sum
 * is not the budget; we split the pick budget exactly over the unprotected
 * tokens (the question is kept by the window rule).
 * Scratch: the composition's workspace; kvs_topk_indices allocates once per
 * segment.
 */
#include "kvs_parts.h"

#include <stdlib.h>

static int rem_cmp(const void *a, const void *b) { /* key descending, id ascending */
    const kvs_pick_pair *x = a, *y = b;
    if (x->key > y->key) return -1;
    if (x->key < y->key) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

static kvs_status segment_pick(const kvs_part_ctx *c, const float *scores, int lo, int hi, int k,
                               kvs_pick_ws *ws, int32_t *out, kvs_err *err) {
    const int n = hi - lo;
    int cs = (int)kvs_part_param(c->m, c->p, "chunk_length", 0);
    if (cs < 1 || cs > n) cs = n;
    const int M = (n + cs - 1) / cs;
    int given = 0;
    for (int s = 0; s < M; s++) { /* ws->ibuf[s] = k_s, ws->pairs[s] = remainder */
        const int ns = (s + 1) * cs < n ? cs : n - s * cs;
        const int64_t num = (int64_t)k * ns;
        ws->ibuf[s] = (int32_t)(num / n);
        ws->pairs[s].key = (double)(num % n);
        ws->pairs[s].id = s;
        given += ws->ibuf[s];
    }
    /* the k - given tokens left: largest remainder first, lower segment on ties */
    qsort(ws->pairs, (size_t)M, sizeof *ws->pairs, rem_cmp);
    if (k - given > M) return kvs_errorf(err, KVS_ERR_INTERNAL, "segment: %d tokens left to give", k - given);
    for (int r = 0; r < k - given; r++) ws->ibuf[ws->pairs[r].id]++;
    int o = 0;
    for (int s = 0; s < M; s++) {
        const int a = lo + s * cs, ns = (s + 1) * cs < n ? cs : n - s * cs, ks = ws->ibuf[s];
        if (ks < 1) continue;
        kvs_status rc = kvs_topk_indices(scores + a, ns, ks, out + o, err);
        if (rc) return rc;
        for (int i = 0; i < ks; i++) out[o + i] += a;
        o += ks;
    }
    if (o != k) return kvs_errorf(err, KVS_ERR_INTERNAL, "segment: picked %d tokens, wanted %d", o, k);
    return KVS_OK;
}

const kvs_pick_rule kvs_pick_segment = {.name = "segment", .pick = segment_pick};
