/*
 * score_keydiff.c -- scorer `keydiff`: keys unlike the head's mean key are kept.
 *
 * Paper: KeyDiff, arXiv 2504.15364 (kvpress's KeyDiffPress). Formula: per KV
 * head an anchor a = the mean over all N tokens of the L2-normalised keys
 * k_j / ||k_j||; key j scores minus its cosine similarity to the anchor,
 * -cos(k_j, a). Keys that point away from the common direction are
 * distinctive and kept. Reads only K. Cost two passes over K (the anchor,
 * then the cosines): 2 N d, the stated bound; all layers in one parallel
 * run (score_layers) over (layer, KV head) units on the shape's threads,
 * each doing both passes of its head, rows converted to fp32 in tiles of
 * 64, the key norms of pass 1 kept for pass 2 (per-worker scratch
 * allocated once). Norms and dots in fp32 (kvs_part_sumsq / kvs_part_dot's
 * fixed lane order), each tile's anchor sum in fp32 (rows in order), the
 * anchor's running sum over the tiles in double, in tile order: the result
 * does not depend on the thread count.
 * Decisions where sources disagree:
 *   - Anchor: the paper and kvpress average the NORMALISED keys (default,
 *     anchor = normalized); our brief said "the mean key", offered as
 *     anchor = raw. For unit-norm keys both are the same.
 *   - One shot over the whole prompt: the paper evicts block by block while
 *     prefilling (kvpress: BlockPress around KeyDiffPress); here, as every
 *     method in this project, it runs once after prefill.
 *   - A zero key (or zero anchor) has cosine 0 (torch's eps clamps do the
 *     same) and is left out of the normalised mean.
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdlib.h>

enum { KD_TILE = 64 }; /* rows per tile */

typedef struct {
    const kvs_part_ctx *c;
    int raw, T;     /* anchor = raw; workers */
    float *rows;    /* [T][KD_TILE][d] */
    float *ts;      /* [T][d] a tile's fp32 anchor sum */
    float *unit;    /* [T][d] the anchor, normalised */
    double *anchor; /* [T][d] */
    float *norm;    /* [T][N] key norms */
} keydiff_state;

typedef struct {
    keydiff_state *st;
    const kvs_layer *in; /* [n_layers] */
    float *scores;       /* [n_layers][Hkv][N] */
} keydiff_job;

static void keydiff_destroy(void *state) {
    keydiff_state *st = state;
    if (!st) return;
    free(st->rows);
    free(st->ts);
    free(st->unit);
    free(st->anchor);
    free(st->norm);
    free(st);
}

static kvs_status keydiff_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    keydiff_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    const size_t N = (size_t)c->shape.n_tokens, d = (size_t)c->shape.head_dim;
    st->c = c;
    st->raw = kvs_part_param(c->m, c->p, "anchor", 0) != 0;
    st->T = kvs_parallel_threads(c->shape.threads, 64);
    const size_t T = (size_t)st->T;
    st->rows = malloc(sizeof(float) * T * KD_TILE * d);
    st->ts = malloc(sizeof(float) * T * d);
    st->unit = malloc(sizeof(float) * T * d);
    st->anchor = malloc(sizeof(double) * T * d);
    st->norm = malloc(sizeof(float) * T * N);
    if (!st->rows || !st->ts || !st->unit || !st->anchor || !st->norm) {
        keydiff_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    *state = st;
    return KVS_OK;
}

/* ts[t] += s r[t], in blocks of 8 (they vectorise; the same sums). */
static void add_scaled(float *restrict ts, float s, const float *restrict r, int d) {
    int t = 0;
    for (; t + 8 <= d; t += 8)
        for (int k = 0; k < 8; k++) ts[t + k] += s * r[t + k];
    for (; t < d; t++) ts[t] += s * r[t];
}

/* Unit u: (layer, KV head) u / Hkv, u % Hkv, both passes (the second finds
 * the head's keys still in cache). */
static kvs_status keydiff_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    const keydiff_job *j = job;
    keydiff_state *st = j->st;
    const int N = st->c->shape.n_tokens, d = st->c->shape.head_dim, H = st->c->shape.n_kv_heads;
    const kvs_view *k = &j->in[u / H].k;
    const int h = u % H;
    float *rows = st->rows + (size_t)tid * KD_TILE * d, *ts = st->ts + (size_t)tid * d;
    float *unit = st->unit + (size_t)tid * d, *norm = st->norm + (size_t)tid * N;
    float *out = j->scores + (size_t)u * N; /* [N] */
    double *a = st->anchor + (size_t)tid * d;
    for (int t = 0; t < d; t++) a[t] = 0.0;
    for (int n0 = 0; n0 < N; n0 += KD_TILE) { /* pass 1: norms and the anchor sum */
        const int cnt = N - n0 < KD_TILE ? N - n0 : KD_TILE;
        kvs_view_rows_f32(k, h, n0, cnt, rows);
        for (int t = 0; t < d; t++) ts[t] = 0.0f;
        for (int i = 0; i < cnt; i++) {
            const float *r = rows + (size_t)i * d;
            const float nr = sqrtf(kvs_part_sumsq(r, d));
            norm[n0 + i] = nr;
            if (!st->raw && nr == 0.0f) continue;
            add_scaled(ts, st->raw ? 1.0f : 1.0f / nr, r, d);
        }
        for (int t = 0; t < d; t++) a[t] += ts[t]; /* the tile's fp32 sum, into the double anchor */
    }
    double na = 0.0;
    for (int t = 0; t < d; t++) na += a[t] * a[t];
    na = sqrt(na);
    for (int t = 0; t < d; t++) unit[t] = na > 0.0 ? (float)(a[t] / na) : 0.0f;
    for (int n0 = 0; n0 < N; n0 += KD_TILE) { /* pass 2: -cos(k_j, a) */
        const int cnt = N - n0 < KD_TILE ? N - n0 : KD_TILE;
        kvs_view_rows_f32(k, h, n0, cnt, rows);
        for (int i = 0; i < cnt; i++) {
            const float dot = kvs_part_dot(rows + (size_t)i * d, unit, d), nr = norm[n0 + i];
            out[n0 + i] = nr > 0.0f && na > 0.0 ? -dot / nr : 0.0f;
        }
    }
    return KVS_OK;
}

static kvs_status keydiff_layers(void *state, const kvs_layer *in, int n_layers, float *scores,
                                 kvs_err *err) {
    keydiff_state *st = state;
    keydiff_job j = {st, in, scores};
    return kvs_parallel_run(&j, keydiff_unit, n_layers * st->c->shape.n_kv_heads, st->T, "keydiff", err);
}

static kvs_status keydiff_score(void *state, int layer, const kvs_layer *in, float *scores,
                                kvs_err *err) {
    (void)layer;
    return keydiff_layers(state, in, 1, scores, err);
}

const kvs_scorer kvs_scorer_keydiff = {
    .name = "keydiff",
    .needs = 0,
    .queries_wanted = NULL,
    .create = keydiff_create,
    .score = keydiff_score,
    .destroy = keydiff_destroy,
    .score_layers = keydiff_layers,
};
