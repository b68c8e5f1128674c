/*
 * chan_think.c -- channel rule `think`: which key channels each KV head
 * keeps, by query-driven magnitude (ThinK).
 *
 * Paper: ThinK, "Thinner Key Cache by Query-Driven Pruning", arXiv
 * 2407.21018 (ICLR 2025); kvpress ThinKPress (kvpress/presses/
 * think_press.py, read at 19a6374). Composes with any token method: the
 * plan keeps its tokens and carries per-(layer, KV head) key channel masks
 * (kvs_plan.kchan).
 * Formula, for KV head g with the G query heads of its group and the last w
 * query rows: channel c scores
 *   s_g[c] = (1/G sum_{h in g} 1/w sum_i q_h[i][c]^2) * (1/N sum_j k_g[j][c]^2),
 * and the floor(ratio * d) channels with the lowest scores are pruned (ties:
 * the higher channel is pruned first); at least one channel stays (ratio <
 * 1). Parameters (read by name): key_channel_ratio (absent 0: nothing
 * pruned), window (w, absent 32).
 * Cost Hq * w * d + Hkv * N * d; memory [Hq][d] doubles.
 * Decisions where sources disagree or are silent:
 *   - The paper scores ||Q[:, c]|| * ||K[:, c]|| per attention head; squares
 *     of means rank a single head's channels the same. For GQA we follow
 *     kvpress: the query term is averaged over the group before the product.
 *   - The paper keeps the newest (window) keys whole; kvpress prunes every
 *     row; we prune every kept row (kvs_apply), rows appended by decoding
 *     are whole.
 *   - Pruned channels are stored as zeros (kvs_apply, the engine): the
 *     memory is not freed; kvs_plan_kv_bytes counts what a packed store
 *     would take, and the plan's note says so.
 */
#include "kvs_parts.h"

#include <stdlib.h>

static int think_window(const kvs_method *m, const kvs_params *p, int N) {
    int w = (int)kvs_part_param(m, p, "window", 32);
    if (w < 1) w = 1;
    return w < N ? w : N;
}

typedef struct {
    double key;
    int c;
} chan_pair;

static int chan_cmp(const void *a, const void *b) { /* score ascending, channel descending */
    const chan_pair *x = a, *y = b;
    if (x->key < y->key) return -1;
    if (x->key > y->key) return 1;
    return (x->c < y->c) - (x->c > y->c);
}

kvs_status kvs_think_channels(const kvs_layer *in, int w, double ratio, uint8_t *mask,
                              kvs_err *err) {
    const int H = in->k.n_heads, N = in->k.n_tokens, d = in->k.head_dim;
    const int Hq = in->q.n_heads, Nq = in->q.data ? in->q.n_tokens : 0;
    if (w < 1 || Nq < w)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "think: needs the queries of the last %d prompt positions (window=%d) but %d "
                          "were recorded", w, w, Nq);
    if (Hq < H || Hq % H || in->q.head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID, "think: %d query heads of d = %d for %d KV heads of d = %d",
                          Hq, in->q.head_dim, H, d);
    if (!(ratio >= 0.0 && ratio < 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "think: key_channel_ratio %g is not in [0, 1)", ratio);
    const int G = Hq / H, pruned = (int)(ratio * d);
    double *qn = calloc((size_t)d, sizeof(double));    /* [d] */
    float *row = malloc(sizeof(float) * (size_t)d);   /* [d] */
    chan_pair *pr = malloc(sizeof(chan_pair) * (size_t)d); /* [d] */
    kvs_status rc = KVS_OK;
    if (!qn || !row || !pr) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "think: out of memory");
        goto done;
    }
    for (int g = 0; g < H; g++) {
        uint8_t *m = mask + (size_t)g * d; /* [d] */
        for (int c = 0; c < d; c++) qn[c] = 0.0, m[c] = 1;
        for (int h = g * G; h < (g + 1) * G; h++)
            for (int i = Nq - w; i < Nq; i++) {
                kvs_view_rows_f32(&in->q, h, i, 1, row);
                for (int c = 0; c < d; c++) qn[c] += (double)row[c] * row[c];
            }
        for (int c = 0; c < d; c++) pr[c].key = 0.0, pr[c].c = c;
        for (int j = 0; j < N; j++) {
            kvs_view_rows_f32(&in->k, g, j, 1, row);
            for (int c = 0; c < d; c++) pr[c].key += (double)row[c] * row[c];
        }
        for (int c = 0; c < d; c++) pr[c].key = qn[c] / ((double)G * w) * (pr[c].key / N);
        qsort(pr, (size_t)d, sizeof *pr, chan_cmp);
        for (int r = 0; r < pruned; r++) m[pr[r].c] = 0;
    }
done:
    free(qn);
    free(row);
    free(pr);
    return rc;
}

static kvs_status think_observe(const kvs_part_ctx *c, int layer, const kvs_layer *in, uint8_t *mask,
                                kvs_err *err) {
    const double ratio = kvs_part_param(c->m, c->p, "key_channel_ratio", 0.0);
    kvs_status rc = kvs_think_channels(in, think_window(c->m, c->p, c->shape.n_tokens), ratio, mask, err);
    if (rc) kvs_err_prefix(err, "%s: layer %d", c->m->name, layer);
    return rc;
}

const kvs_channel_rule kvs_chan_think = {
    .name = "think",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = think_window,
    .observe = think_observe,
};
