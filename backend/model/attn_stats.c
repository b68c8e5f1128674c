/*
 * attn_stats.c -- the prompt's attention statistics accumulated during
 * prefill (kvs_session_set_attn_stats): their buffers, the end of the
 * accumulation, copies, and what a cache view hands to the methods
 * (kvs_layer.attn_colsum / attn_ent, core/kvsieve.h states the contract).
 *
 * What it is: forward.c's at_run adds each (query head, query tile)'s
 * normalised probabilities, which prefill computes anyway, to per-thread
 * column sums (reduced at the end of each layer, attn_stats_reduce) and to
 * a per-thread head sum of the tile's rows, whose entropies core's
 * kvs_attn_row_entropy takes once the tile's last head is done. No N x N
 * buffer: [threads][QTILE][N] floats of scratch during prefill, [L][Hkv][N]
 * floats kept. Only a prompt prefilled from position 0 longer than
 * KVS_SHORT_PROMPT (the batched path; chunked by ubatch or not) gets them,
 * only global layers (a sliding window is not the contract's causal
 * attention), and only while the cache is that prefill's: reset, copy (dst),
 * extend, decode and applying a plan drop them. Trimming sliding-window
 * layers keeps them (those layers have none).
 * What it is not: the accumulation itself (forward.c), any method logic.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

void kvs_session_set_attn_stats(kvs_session *s, int on) { s->want_attn_stats = on != 0; }

int kvs_session_has_attn_stats(const kvs_session *s) { return s->as.n > 0 && s->as.n == s->n_prompt; }

static void free_scratch(attn_stats *as) {
    free(as->col);
    free(as->rowh);
    free(as->kind);
    free(as->tcol);
    free(as->asum);
    free(as->tsum);
    as->col = as->rowh = as->tcol = NULL;
    as->kind = NULL;
    as->asum = as->tsum = NULL;
    as->modality = NULL;
    as->active = 0;
}

void kvs_attn_stats_free(kvs_session *s) {
    attn_stats *as = &s->as;
    free_scratch(as);
    free(as->colsum);
    free(as->ent);
    free(as->have);
    memset(as, 0, sizeof *as);
}

/* Layer l's logits follow the contract: a global layer (no window) whose
 * scale is 1/sqrt(d) as core computes it (to a float rounding). */
static int layer_fits(const kvs_session *s, int l) {
    const kvs_model_info *MI = &s->m->info;
    if (s->m->layers[l].is_local && MI->sliding_window > 0) return 0;
    const double want = 1.0 / sqrt((double)MI->head_dim);
    return fabs((double)s->m->attn_scale - want) <= 1e-6 * want;
}

kvs_status kvs_attn_stats_begin(kvs_session *s, int n, const uint8_t *modality, kvs_err *err) {
    kvs_attn_stats_free(s);
    if (!s->want_attn_stats || n <= KVS_SHORT_PROMPT) return KVS_OK;
    const kvs_model_info *MI = &s->m->info;
    const int L = MI->n_layers, Hkv = MI->n_kv_heads, nth = kvs_pool_size(s->pool);
    attn_stats *as = &s->as;
    as->cap = n;
    as->have = calloc((size_t)L, 1);
    as->ent = calloc((size_t)L, sizeof *as->ent);
    as->col = calloc((size_t)L * Hkv * n, sizeof *as->col);
    as->colsum = malloc(sizeof(float) * (size_t)L * Hkv * n);
    as->rowh = malloc(sizeof(double) * (size_t)L * n * 2);
    as->kind = malloc((size_t)L * n);
    as->tcol = calloc((size_t)nth * Hkv * n, sizeof *as->tcol);
    as->asum = malloc(sizeof(float) * (size_t)nth * KVS_QTILE * n);
    as->tsum = malloc(sizeof(float) * (size_t)nth * n);
    if (!as->have || !as->ent || !as->col || !as->colsum || !as->rowh || !as->kind || !as->tcol || !as->asum ||
        !as->tsum) {
        kvs_attn_stats_free(s);
        return kvs_errorf(err, KVS_ERR_NOMEM,
                          "prefill: out of memory for the attention statistics (%d layers x %d tokens, %d threads)", L,
                          n, nth);
    }
    int any = 0;
    for (int l = 0; l < L; l++) {
        as->have[l] = (uint8_t)layer_fits(s, l);
        any |= as->have[l];
    }
    if (!any) {
        kvs_attn_stats_free(s);
        return KVS_OK;
    }
    as->modality = modality;
    as->active = 1;
    return KVS_OK;
}

kvs_status kvs_attn_stats_finish(kvs_session *s, int n, kvs_err *err) {
    attn_stats *as = &s->as;
    if (!as->active) return KVS_OK;
    const kvs_model_info *MI = &s->m->info;
    const int L = MI->n_layers, Hkv = MI->n_kv_heads, G = MI->n_heads / Hkv;
    for (int l = 0; l < L; l++) {
        if (!as->have[l]) continue;
        const double *col = as->col + (size_t)l * Hkv * n; /* [Hkv][n] */
        float *out = as->colsum + (size_t)l * Hkv * n;     /* [Hkv][n] */
        for (size_t x = 0; x < (size_t)Hkv * n; x++) out[x] = (float)(col[x] / G);
        kvs_status st = kvs_attn_entropy_reduce(as->rowh + (size_t)l * n * 2, as->kind + (size_t)l * n, n,
                                                &as->ent[l], err);
        if (st) {
            kvs_attn_stats_free(s);
            return kvs_err_prefix(err, "prefill: attention statistics: layer %d", l);
        }
    }
    free_scratch(as);
    as->n = n;
    return KVS_OK;
}

kvs_status kvs_attn_stats_copy(kvs_session *dst, const kvs_session *src, kvs_err *err) {
    kvs_attn_stats_free(dst);
    if (!kvs_session_has_attn_stats(src)) return KVS_OK;
    const kvs_model_info *MI = &src->m->info;
    const int L = MI->n_layers, Hkv = MI->n_kv_heads, n = src->as.n;
    attn_stats *as = &dst->as;
    as->have = malloc((size_t)L);
    as->ent = malloc(sizeof *as->ent * (size_t)L);
    as->colsum = malloc(sizeof(float) * (size_t)L * Hkv * n);
    if (!as->have || !as->ent || !as->colsum) {
        kvs_attn_stats_free(dst);
        return kvs_errorf(err, KVS_ERR_NOMEM, "session copy: out of memory for the attention statistics");
    }
    memcpy(as->have, src->as.have, (size_t)L);
    memcpy(as->ent, src->as.ent, sizeof *as->ent * (size_t)L);
    memcpy(as->colsum, src->as.colsum, sizeof(float) * (size_t)L * Hkv * n);
    as->cap = as->n = n;
    return KVS_OK;
}

void kvs_attn_stats_view(const kvs_session *s, int l, kvs_layer *out) {
    out->attn_colsum = NULL;
    out->attn_ent = NULL;
    if (!kvs_session_has_attn_stats(s) || !s->as.have[l]) return;
    const kv_layer *c = &s->kv[l];
    if (c->compressed || c->lag || c->len != s->as.n) return; /* not the prefill's cache any more */
    out->attn_colsum = s->as.colsum + (size_t)l * s->m->info.n_kv_heads * s->as.n;
    out->attn_ent = &s->as.ent[l];
}
