/*
 * cache.c -- validation of a prompt's cache view, and the owned dense cache.
 *
 * What it is: kvs_cache_validate = kvs_cache_check_shape (every shape rule a
 * method may rely on) + kvs_cache_check_finite (the K/V/Q NaN/Inf scan of
 * host views, threaded: it is the one pass over every byte of the cache, the
 * largest cost of the cheap methods), kvs_dense_cache_free and the view on an
 * uncompressed dense cache.
 * What it is not: no loading (formats/), no compaction (apply.c). CUDA views
 * are shape-checked only: their finiteness is the device path's job, since
 * this file never dereferences device memory.
 */
#include "kvsieve.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static int dtype_ok(kvs_dtype t) { return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16; }

/* Shape rules of one view on its own: positive sizes, data, dtype, strides. */
static kvs_status check_view(const kvs_view *v, const char *what, int l, kvs_err *err) {
    if (!v->data) return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has no data", l, what);
    if (!dtype_ok(v->dtype))
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has dtype %s (need F32, F16 or BF16)",
                          l, what, kvs_dtype_name(v->dtype));
    if (v->device != KVS_HOST && v->device != KVS_CUDA)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has unknown device %d", l, what,
                          (int)v->device);
    if (v->n_heads < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has %d heads (need >= 1)", l, what,
                          v->n_heads);
    if (v->n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has N = %d tokens (need >= 1)", l,
                          what, v->n_tokens);
    if (v->head_dim < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has head_dim %d (need >= 1)", l, what,
                          v->head_dim);
    if (v->n_tokens > 1 && v->s_tok < v->head_dim)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "layer %d: %s token stride %lld is smaller than head_dim %d", l, what,
                          (long long)v->s_tok, v->head_dim);
    if (v->n_heads > 1 && v->s_head < v->head_dim)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "layer %d: %s head stride %lld is smaller than head_dim %d", l, what,
                          (long long)v->s_head, v->head_dim);
    if (v->s_tok < 0 || v->s_head < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s has a negative stride", l, what);
    return KVS_OK;
}

kvs_status kvs_cache_check_shape(const kvs_cache_view *c, kvs_shape *shape, kvs_err *err) {
    kvs_status st;
    if (!c) return kvs_errorf(err, KVS_ERR_INVALID, "cache view is NULL");
    if (c->n_layers < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "cache has %d layers (need >= 1)", c->n_layers);
    if (!c->layers) return kvs_errorf(err, KVS_ERR_INVALID, "cache has no layer array");

    kvs_shape s;
    memset(&s, 0, sizeof s);
    s.n_layers = c->n_layers;
    s.threads = 1;
    for (int l = 0; l < c->n_layers; l++) {
        const kvs_layer *ly = &c->layers[l];
        const kvs_view *k = &ly->k, *v = &ly->v, *q = &ly->q;
        if (k->n_tokens == 0)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: N = 0 (empty prompt; nothing to compress)",
                              l);
        if ((st = check_view(k, "K", l, err))) return st;
        if ((st = check_view(v, "V", l, err))) return st;
        if (k->n_heads != v->n_heads)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: K has %d heads but V has %d", l,
                              k->n_heads, v->n_heads);
        if (k->n_tokens != v->n_tokens)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: K has N = %d tokens but V has %d", l,
                              k->n_tokens, v->n_tokens);
        if (k->head_dim != v->head_dim)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: K has head_dim %d but V has %d", l,
                              k->head_dim, v->head_dim);
        if (k->device != v->device)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: K and V are on different devices", l);
        if (l == 0) {
            s.n_tokens = k->n_tokens;
            s.n_kv_heads = k->n_heads;
            s.head_dim = k->head_dim;
        } else {
            if (k->n_tokens != s.n_tokens)
                return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: N = %d but layer 0 has N = %d", l,
                                  k->n_tokens, s.n_tokens);
            if (k->n_heads != s.n_kv_heads)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "layer %d: %d KV heads but layer 0 has %d", l, k->n_heads,
                                  s.n_kv_heads);
            if (k->head_dim != s.head_dim)
                return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: head_dim %d but layer 0 has %d", l,
                                  k->head_dim, s.head_dim);
        }
        /* queries: all layers have them or none does, with one shape */
        const int has_q = q->data != NULL;
        if (l > 0 && has_q != (s.n_queries > 0))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              has_q ? "layer %d has queries but layer 0 has none"
                                    : "layer %d has no queries but layer 0 has them",
                              l);
        if (!has_q) continue;
        if (q->n_tokens < 1)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: Q has Nq = %d rows (need >= 1, or no Q)",
                              l, q->n_tokens);
        if ((st = check_view(q, "Q", l, err))) return st;
        if (q->n_tokens > k->n_tokens)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: Q has Nq = %d rows but N = %d", l,
                              q->n_tokens, k->n_tokens);
        if (q->n_heads % k->n_heads != 0)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "layer %d: Q has %d heads, not a multiple of the %d KV heads", l,
                              q->n_heads, k->n_heads);
        if (q->head_dim != k->head_dim)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: Q has head_dim %d but K has %d", l,
                              q->head_dim, k->head_dim);
        if (q->device != k->device)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: Q and K are on different devices", l);
        if (l == 0) {
            s.n_q_heads = q->n_heads;
            s.n_queries = q->n_tokens;
        } else {
            if (q->n_heads != s.n_q_heads)
                return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: Q has %d heads but layer 0 has %d",
                                  l, q->n_heads, s.n_q_heads);
            if (q->n_tokens != s.n_queries)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "layer %d: Q has Nq = %d rows but layer 0 has %d", l, q->n_tokens,
                                  s.n_queries);
        }
    }
    if (c->modality) {
        for (int n = 0; n < s.n_tokens; n++)
            if (c->modality[n] > KVS_MOD_AUDIO)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "modality[%d] = %d is not a known modality (0 text, 1 image, "
                                  "2 video, 3 audio)",
                                  n, (int)c->modality[n]);
    }
    if (shape) *shape = s;
    return KVS_OK;
}

/* ---- finiteness: one unit per (layer, K|V|Q, head), in that order --------- */

typedef struct {
    const kvs_cache_view *c;
    int q_rows;           /* query rows scanned per layer (the last ones) */
    int hkv, hq; /* hq = 0 when no query rows are scanned */
} finite_job;

/* The whole tensor (0 K, 1 V, 2 Q: its last q_rows rows) of layer l. */
static kvs_view tensor_view(const finite_job *j, int l, int t) {
    const kvs_layer *ly = &j->c->layers[l];
    kvs_view v = t == 0 ? ly->k : t == 1 ? ly->v : ly->q;
    if (t == 2) {
        const int rows = j->q_rows < v.n_tokens ? j->q_rows : v.n_tokens;
        v.data = (const char *)v.data +
                 (size_t)(v.n_tokens - rows) * (size_t)v.s_tok * kvs_dtype_size(v.dtype);
        v.n_tokens = rows;
    }
    return v;
}

static void unit_split(const finite_job *j, int u, int *l, int *t, int *h) {
    const int per = 2 * j->hkv + j->hq, r = u % per;
    *l = u / per;
    *t = r < j->hkv ? 0 : r < 2 * j->hkv ? 1 : 2;
    *h = *t == 2 ? r - 2 * j->hkv : r % j->hkv;
}

static kvs_status finite_unit(void *job, int tid, int u, kvs_err *err) {
    (void)tid;
    const finite_job *j = job;
    int l, t, h;
    unit_split(j, u, &l, &t, &h);
    const kvs_view whole = tensor_view(j, l, t);
    if (whole.device != KVS_HOST) return KVS_OK;
    kvs_view v = whole; /* head h only */
    v.data = (const char *)v.data + (size_t)h * (size_t)v.s_head * kvs_dtype_size(v.dtype);
    v.n_heads = 1;
    if (kvs_view_check_finite(&v, "x", NULL) == KVS_OK) return KVS_OK;
    /* Re-scan the whole tensor for the message: it names the head, token
     * and channel exactly as a serial scan would (earlier heads are clean or
     * failed as lower units, whose error wins). */
    kvs_status st = kvs_view_check_finite(&whole, t == 0 ? "K" : t == 1 ? "V" : "Q", err);
    assert(st != KVS_OK);
    kvs_err_prefix(err, "layer %d", l);
    return st;
}

kvs_status kvs_cache_check_finite(const kvs_cache_view *c, int q_rows, int threads, kvs_err *err) {
    if (!c || c->n_layers < 1 || !c->layers)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_cache_check_finite: no layers (check the shape first)");
    const kvs_layer *l0 = &c->layers[0];
    finite_job j = {.c = c, .q_rows = l0->q.data && q_rows > 0 ? q_rows : 0, .hkv = l0->k.n_heads};
    j.hq = j.q_rows > 0 ? l0->q.n_heads : 0;
    return kvs_parallel_run(&j, finite_unit, c->n_layers * (2 * j.hkv + j.hq), threads,
                            "cache finiteness check", err);
}

kvs_status kvs_cache_validate(const kvs_cache_view *c, kvs_shape *shape, kvs_err *err) {
    kvs_shape s;
    kvs_status st = kvs_cache_check_shape(c, &s, err);
    if (st) return st;
    if ((st = kvs_cache_check_finite(c, s.n_queries, 1, err))) return st;
    if (shape) *shape = s;
    return KVS_OK;
}

void kvs_dense_cache_free(kvs_dense_cache *c) {
    if (!c) return;
    if (c->layers) {
        for (int l = 0; l < c->n_layers; l++) {
            free(c->layers[l].k);
            free(c->layers[l].v);
            free(c->layers[l].q);
            free(c->layers[l].counts);
        }
        free(c->layers);
    }
    free(c->modality);
    memset(c, 0, sizeof *c);
}

kvs_status kvs_dense_cache_view(const kvs_dense_cache *c, kvs_cache_view *out,
                                kvs_layer *layers_storage /* [L] */, kvs_err *err) {
    if (!c || !out || !layers_storage)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dense_cache_view: NULL argument");
    if (c->n_layers < 1 || !c->layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "dense cache has %d layers (need >= 1)", c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        const kvs_dense_layer *d = &c->layers[l];
        if (d->n_tokens != c->n_tokens)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "layer %d: holds %d tokens but the prompt had N = %d (a compressed "
                              "cache has no uncompressed view)",
                              l, d->n_tokens, c->n_tokens);
        if (!d->k || !d->v)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: dense K or V is NULL", l);
        if (d->counts)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: ragged heads have no [H][N][d] view", l);
        kvs_layer *o = &layers_storage[l];
        memset(o, 0, sizeof *o);
        o->k = kvs_view_make(d->k, KVS_F32, d->n_kv_heads, d->n_tokens, d->head_dim);
        o->v = kvs_view_make(d->v, KVS_F32, d->n_kv_heads, d->n_tokens, d->head_dim);
        if (d->q && d->n_queries > 0)
            o->q = kvs_view_make(d->q, KVS_F32, d->n_q_heads, d->n_queries, d->head_dim);
        else
            o->q = kvs_view_make(NULL, KVS_F32, 0, 0, d->head_dim);
    }
    out->n_layers = c->n_layers;
    out->layers = layers_storage;
    out->modality = c->modality;
    return KVS_OK;
}

int64_t kvs_dense_head(const kvs_dense_layer *dl, int h, int *rows) {
    if (!dl->counts) {
        if (rows) *rows = dl->n_tokens;
        return (int64_t)h * dl->n_tokens;
    }
    int64_t off = 0;
    for (int g = 0; g < h; g++) off += dl->counts[g];
    if (rows) *rows = dl->counts[h];
    return off;
}
