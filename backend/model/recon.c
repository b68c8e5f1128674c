/*
 * recon.c -- the context-reconstruction statistic (KVzip, kvs_layer.
 * attn_recon_max; kvs_session_set_recon): its buffers, the end of the
 * accumulation, copies, what a cache view hands to the methods, and the
 * reconstruction input of each chunk.
 *
 * What it is: forward.c's reconstruction pass (after a prefill asked for it)
 * feeds each chunk's input, kvs_recon_chunk_tokens, on top of the prompt's
 * cache; its attention (at_run) keeps per thread the maximum probability
 * each key of the chunk receives from any query row and query head of the
 * key's group ([threads][L][Hkv][N] floats), reduced here (a maximum: the
 * same whatever the thread order). [L][Hkv][N] floats kept, valid while the
 * cache is that prefill's (reset, copy (dst), extend, decode and applying a
 * plan drop them; a copy takes them along).
 * What it is not: the pass itself (forward.c), any method logic.
 */
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

/* kvpress KVzipPress's instructions without a chat template: the first
 * chunk's, the later chunks' (then the last KVS_RECON_PREV tokens of the
 * chunk before), then a newline, then the chunk itself. */
static const char RECON_FIRST[] = "\n\nRepeat the previous context exactly.";
static const char RECON_NEXT[] = "\n\nRepeat the part of the previous context exactly, starting with";
static const char RECON_END[] = "\n";

void kvs_session_set_recon(kvs_session *s, int chunk) {
    s->recon_chunk = chunk < 0 ? KVS_RECON_CHUNK : chunk;
}

int kvs_session_has_recon(const kvs_session *s) { return s->rc.n > 0 && s->rc.n == s->n_prompt; }

double kvs_session_recon_ms(const kvs_session *s) { return kvs_session_has_recon(s) ? s->rc.ms : 0.0; }

void kvs_recon_free(kvs_session *s) {
    free(s->rc.max);
    free(s->rc.tmax);
    memset(&s->rc, 0, sizeof s->rc);
}

static kvs_status append_text(const kvs_model *m, const char *text, int32_t *out, int cap, int *n, kvs_err *err) {
    int32_t *t = NULL;
    int nt = 0;
    kvs_status st = kvs_tokenize(m, text, strlen(text), 0, 0, &t, &nt, err);
    if (st) return kvs_err_prefix(err, "reconstruction prompt");
    if (*n + nt <= cap) memcpy(out + *n, t, sizeof(int32_t) * (size_t)nt);
    *n += nt;
    free(t);
    return KVS_OK;
}

kvs_status kvs_recon_chunk_tokens(const kvs_model *m, const int32_t *ctx, int c0, int c1, int32_t *out, int cap,
                                  int *n_out, kvs_err *err) {
    *n_out = 0;
    if (!ctx || c0 < 0 || c1 <= c0)
        return kvs_errorf(err, KVS_ERR_INVALID, "reconstruction prompt: bad chunk [%d, %d)", c0, c1);
    int n = 0;
    kvs_status st = append_text(m, c0 == 0 ? RECON_FIRST : RECON_NEXT, out, cap, &n, err);
    if (!st && c0 > 0) {
        const int p = c0 < KVS_RECON_PREV ? c0 : KVS_RECON_PREV;
        if (n + p <= cap) memcpy(out + n, ctx + c0 - p, sizeof(int32_t) * (size_t)p);
        n += p;
    }
    if (!st) st = append_text(m, RECON_END, out, cap, &n, err);
    if (st) return st;
    if (n + (c1 - c0) <= cap) memcpy(out + n, ctx + c0, sizeof(int32_t) * (size_t)(c1 - c0));
    n += c1 - c0;
    *n_out = n;
    return n <= cap ? KVS_OK
                    : kvs_errorf(err, KVS_ERR_INVALID, "reconstruction prompt: %d tokens exceed the buffer of %d", n,
                                 cap);
}

kvs_status kvs_recon_begin(kvs_session *s, int n, kvs_err *err) {
    kvs_recon_free(s);
    const kvs_model_info *MI = &s->m->info;
    const size_t per = (size_t)MI->n_layers * MI->n_kv_heads * n; /* [L][Hkv][n] */
    recon_stats *rc = &s->rc;
    rc->cap = n;
    rc->max = malloc(sizeof(float) * per);
    rc->tmax = calloc((size_t)kvs_pool_size(s->pool) * per, sizeof(float));
    if (!rc->max || !rc->tmax) {
        kvs_recon_free(s);
        return kvs_errorf(err, KVS_ERR_NOMEM,
                          "reconstruction pass: out of memory for the statistic (%d layers x %d tokens, %d threads)",
                          MI->n_layers, n, kvs_pool_size(s->pool));
    }
    rc->active = 1;
    return KVS_OK;
}

void kvs_recon_finish(kvs_session *s, double ms) {
    recon_stats *rc = &s->rc;
    const kvs_model_info *MI = &s->m->info;
    const size_t per = (size_t)MI->n_layers * MI->n_kv_heads * rc->cap;
    memcpy(rc->max, rc->tmax, sizeof(float) * per);
    for (int t = 1; t < kvs_pool_size(s->pool); t++) {
        const float *x = rc->tmax + (size_t)t * per;
        for (size_t i = 0; i < per; i++)
            if (x[i] > rc->max[i]) rc->max[i] = x[i];
    }
    free(rc->tmax);
    rc->tmax = NULL;
    rc->active = 0;
    rc->n = rc->cap;
    rc->ms = ms;
}

kvs_status kvs_recon_copy(kvs_session *dst, const kvs_session *src, kvs_err *err) {
    kvs_recon_free(dst);
    if (!kvs_session_has_recon(src)) return KVS_OK;
    const kvs_model_info *MI = &src->m->info;
    const size_t per = (size_t)MI->n_layers * MI->n_kv_heads * src->rc.n;
    if (!(dst->rc.max = malloc(sizeof(float) * per)))
        return kvs_errorf(err, KVS_ERR_NOMEM, "session copy: out of memory for the reconstruction statistic");
    memcpy(dst->rc.max, src->rc.max, sizeof(float) * per);
    dst->rc.cap = dst->rc.n = src->rc.n;
    dst->rc.ms = src->rc.ms;
    return KVS_OK;
}

void kvs_recon_view(const kvs_session *s, int l, kvs_layer *out) {
    out->attn_recon_max = NULL;
    if (!kvs_session_has_recon(s)) return;
    const kv_layer *c = &s->kv[l];
    if (c->compressed || c->lag || c->bounded || c->len != s->rc.n) return; /* not the prefill's cache any more */
    out->attn_recon_max = s->rc.max + (size_t)l * s->m->info.n_kv_heads * s->rc.n;
}
