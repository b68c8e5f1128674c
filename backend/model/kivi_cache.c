/*
 * kivi_cache.c -- the session's KIVI cache types (kivi2, kivi4): one
 * kernels/kivi.h store per (layer, KV head), built from the full-precision
 * prefill cache ("sealing") and then read by decode attention directly.
 *
 * Sliding-window layers (Gemma 3's local layers) are not quantised: they keep
 * their trimmed window of fp16 rows (a store cannot drop its oldest rows, and
 * a window of fp16 rows is smaller than a quantised history of more than
 * about 3.5 windows); the stats count their fp16 bytes.
 * A KIVI session keeps its prompt in fp16 rows while it prefills (KIVI's
 * prefill attends the fp16 prompt; methods plan on the full-precision cache),
 * so the prefill paths are those of an f16 cache. The stores are made once,
 * by compression (after the plan: the kept or merged rows are appended, plan
 * first, then quantise) or by the first decode / extend of a session that was
 * not compressed; each layer's fp16 rows are then freed. From then on every
 * decoded token is appended to its head's store and attention reads the
 * codes with kvs_kivi_scores / kvs_kivi_weighted_sum (one G x d key block
 * and one value row at a time; no dequantised copy of a head), and the
 * store is flushed after the step (KIVI's state between steps: the bytes the
 * stats report).
 * What it is not: no quantisation code (kernels/kivi.c), no forward pass
 * (forward.c), no cache management beyond the stores (session.c).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

kvs_status kvs_kivi_session_config(const kvs_model *m, int ctk, int ctv, int group, int residual,
                                   kvs_kivi_config *out, kvs_err *err) {
    *out = kvs_kivi_config_default(ctk == KVS_CACHE_KIVI2 ? 2 : 4);
    out->v_bits = ctv == KVS_CACHE_KIVI2 ? 2 : 4;
    if (group > 0) out->group = group;
    if (residual > 0) out->residual = residual;
    kvs_status st = kvs_kivi_config_check(out, m->info.head_dim, err);
    if (st) kvs_err_prefix(err, "session: kivi cache (kivi_group %d, kivi_residual %d)", out->group, out->residual);
    return st;
}

void kvs_kv_kivi_free(kv_layer *c) {
    for (int g = 0; c->kivi && g < c->nkivi; g++) kvs_kivi_free(c->kivi[g]);
    free(c->kivi);
    c->kivi = NULL;
    c->nkivi = 0;
}

/* Layer c's stores from its fp16 rows: head g gets its len - lag[g] rows and
 * the capacity cap - lag[g] (the room to decode). On error nothing changes. */
static kvs_status seal_layer(const kvs_session *s, kv_layer *c, int l, kvs_err *err) {
    const int D = s->m->info.head_dim, Hkv = s->m->info.n_kv_heads;
    kvs_kivi_head **hs = calloc((size_t)Hkv, sizeof *hs);
    if (!hs) return kvs_errorf(err, KVS_ERR_NOMEM, "kivi cache: layer %d: out of memory", l);
    kvs_status st = KVS_OK;
    for (int g = 0; g < Hkv && !st; g++) {
        const int rows = c->len - kvs_kv_lag(c, g), cap = c->cap - kvs_kv_lag(c, g);
        st = kvs_kivi_init(&hs[g], &s->kivi_cfg, D, cap > 0 ? cap : 1, err);
        if (st || rows == 0) continue;
        const kvs_view kv = {kvs_kv_krow(s, c, g, 0), KVS_F16, KVS_HOST, 1, rows, D, (int64_t)rows * D, D};
        const kvs_view vv = {kvs_kv_vrow(s, c, g, 0), KVS_F16, KVS_HOST, 1, rows, D, (int64_t)rows * D, D};
        st = kvs_kivi_append(hs[g], &kv, &vv, 0, 0, rows, err);
        kvs_kivi_flush(hs[g]);
    }
    if (st) {
        for (int g = 0; g < Hkv; g++) kvs_kivi_free(hs[g]);
        free(hs);
        kvs_err_prefix(err, "kivi cache: layer %d", l);
        return st;
    }
    c->kivi = hs;
    c->nkivi = Hkv;
    /* the fp16 rows are gone: the stores hold the layer now */
    free(c->k);
    free(c->v);
    free(c->kf);
    free(c->vf);
    c->k = c->v = NULL;
    c->kf = c->vf = NULL;
    return KVS_OK;
}

kvs_status kvs_kv_kivi_seal(kvs_session *s, kvs_err *err) {
    if (!s->kivi) return KVS_OK;
    for (int l = 0; l < s->m->info.n_layers; l++) {
        kv_layer *c = &s->kv[l];
        /* sliding-window layers keep fp16 rows: their trim drops the oldest rows, which
         * a store (key groups aligned from its first token) cannot; and a window of
         * fp16 rows is smaller than a quantised history past ~3.5 windows */
        if (c->kivi || c->cap == 0 || s->m->layers[l].is_local) continue;
        kvs_status st = seal_layer(s, c, l, err);
        if (st) return st;
    }
    return KVS_OK;
}

int kvs_kv_kivi_sealed(const kvs_session *s) {
    for (int l = 0; l < s->m->info.n_layers; l++)
        if (s->kv[l].kivi) return 1;
    return 0;
}

kvs_status kvs_kv_kivi_append(const kvs_session *s, kv_layer *c, int g, const float *k, const float *v,
                              kvs_err *err) {
    const int D = s->m->info.head_dim;
    const kvs_view kv = {k, KVS_F32, KVS_HOST, 1, 1, D, D, D}, vv = {v, KVS_F32, KVS_HOST, 1, 1, D, D, D};
    return kvs_kivi_append(c->kivi[g], &kv, &vv, 0, 0, 1, err);
}

void kvs_kv_kivi_flush(kv_layer *c) {
    for (int g = 0; c->kivi && g < c->nkivi; g++) kvs_kivi_flush(c->kivi[g]);
}

void kvs_kv_kivi_attend(const kvs_session *s, const kv_layer *c, int g, const float *q, int nh, int len, float *sc,
                        float *o) {
    kvs_kivi_head *h = c->kivi[g];
    const int T = kvs_kivi_stats(h).n_tokens;
    assert(T == len); /* the query sees every row its head holds (no sliding window on these sessions) */
    (void)len;
    kvs_status st = kvs_kivi_scores(h, q, nh, sc, NULL); /* sc [nh][T] */
    (void)st; /* T >= 1 (the step's own row) and nh >= 1: cannot fail */
    for (int k = 0; k < nh; k++) {
        float *r = sc + (size_t)k * T;
        kvs_vscale(r, T, s->m->attn_scale);
        const float mx = kvs_vmax(r, T);
        const double sum = kvs_vexp_sub(r, T, mx);
        kvs_vscale(r, T, (float)(1.0 / sum));
    }
    st = kvs_kivi_weighted_sum(h, sc, nh, o, NULL); /* o [nh][D] */
    (void)st;
}

int64_t kvs_kv_kivi_bytes(const kvs_session *s, const kv_layer *c) {
    const int D = s->m->info.head_dim, Hkv = s->m->info.n_kv_heads;
    int64_t b = 0;
    for (int g = 0; g < Hkv; g++)
        b += (int64_t)(c->kivi ? kvs_kivi_stats(c->kivi[g])
                               : kvs_kivi_size(&s->kivi_cfg, D, c->len - kvs_kv_lag(c, g), 1))
                 .total;
    return b;
}

int64_t kvs_kv_kivi_prompt_bytes(const kvs_session *s, int n) {
    return (int64_t)s->m->info.n_kv_heads * (int64_t)kvs_kivi_size(&s->kivi_cfg, s->m->info.head_dim, n, 1).total;
}
