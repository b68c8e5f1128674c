/*
 * session.c -- a session's ragged KV cache: lifecycle, element types, copies,
 * views for methods, plans applied (in place, or gathered from another
 * session's prefill into a variant's own session: kvs_session_copy_plan),
 * compression, statistics, and the sliding-window trim.
 *
 * The cache: per layer K and V as [Hkv][cap] rows of D elements in the
 * session's element types (f16 default, bf16, f32, or GGUF's Q8_0 / Q4_0
 * blocks; K and V each their own) and the original position of every row
 * [Hkv][cap]. A block type's row is D / 32 whole blocks, so rows are still
 * per token: copies, trims and plans move whole rows of bytes. After
 * compression each layer has its own length (and capacity: kept + room for
 * the rest of the context), each KV head its own kept
 * positions; RoPE was applied before caching, so kept keys keep their
 * rotation and decoding continues at position n_past. A compressed cache can
 * be compressed again (kvs_session_recompress, chunked compression): the plan
 * then indexes the rows held and the kept rows keep their original positions.
 * What it is not: no arithmetic of the forward pass (forward.c), no sampling
 * (server), no method logic (methods/, core/).
 */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

/* ---- cache types -------------------------------------------------------------- */

const char *kvs_cache_type_name(int t) {
    switch (t) {
    case KVS_CACHE_F16: return "f16";
    case KVS_CACHE_BF16: return "bf16";
    case KVS_CACHE_F32: return "f32";
    case KVS_CACHE_Q8_0: return "q8_0";
    case KVS_CACHE_Q4_0: return "q4_0";
    case KVS_CACHE_KIVI2: return "kivi2";
    case KVS_CACHE_KIVI4: return "kivi4";
    default: return "?";
    }
}

kvs_status kvs_cache_type_parse(const char *s, int *out, kvs_err *err) {
    for (int t = 0; t < KVS_CACHE_N_TYPES; t++)
        if (s && !strcmp(s, kvs_cache_type_name(t))) {
            *out = t;
            return KVS_OK;
        }
    return kvs_errorf(err, KVS_ERR_INVALID, "cache type '%s' is not one of f16, bf16, f32, q8_0, q4_0, kivi2, kivi4",
                      s ? s : "(null)");
}

/* The dtype methods see: block types are dequantised to fp32 for them. */
static kvs_dtype cache_dtype(int ctype) {
    return ctype == KVS_CACHE_F16 ? KVS_F16 : ctype == KVS_CACHE_BF16 ? KVS_BF16 : KVS_F32;
}

/* Views of layer c's K and V for methods ([Hkv][len][D]): the cache itself,
 * or for a block type an fp32 copy (c->kf, c->vf, made again on each call:
 * methods read fp32; decoding never reads these). Heads must not be ragged. */
static kvs_status layer_views(const kvs_session *s, kv_layer *c, kvs_view *kv, kvs_view *vv, kvs_err *err) {
    const int D = s->m->info.head_dim, Hkv = s->m->info.n_kv_heads;
    if (c->kivi)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "cache view: the %s cache is quantised already (by compression or decoding); methods "
                          "plan on the fp16 prefill cache, before it is quantised",
                          kvs_cache_type_name(s->kivi));
    for (int w = 0; w < 2; w++) {
        const int ct = w ? s->ctype_v : s->ctype_k;
        uint8_t *buf = w ? c->v : c->k;
        kvs_view *out = w ? vv : kv;
        if (!kvs_cache_is_block(ct)) {
            *out = (kvs_view){buf, cache_dtype(ct), KVS_HOST, Hkv, c->len, D, (int64_t)c->cap * D, D};
            continue;
        }
        float **f = w ? &c->vf : &c->kf;
        free(*f);
        *f = malloc((size_t)Hkv * c->len * D * sizeof(float) + 1);
        if (!*f) return kvs_errorf(err, KVS_ERR_NOMEM, "cache view: out of memory for an fp32 copy of %s %s",
                                   w ? "V" : "K", kvs_cache_type_name(ct));
        const size_t rsz = w ? s->rsz_v : s->rsz_k;
        for (int g = 0; g < Hkv; g++)
            kvs_cache_to_f32(ct, buf + kvs_kv_off(c, g) * rsz, *f + (size_t)g * c->len * D, c->len * D);
        *out = (kvs_view){*f, KVS_F32, KVS_HOST, Hkv, c->len, D, (int64_t)c->len * D, D};
    }
    return KVS_OK;
}

static void free_views(kv_layer *c) {
    free(c->kf);
    free(c->vf);
    c->kf = c->vf = NULL;
}

/* ---- lifecycle ---------------------------------------------------------------- */

static void kv_layer_free(kv_layer *c) {
    free(c->k);
    free(c->v);
    free(c->pos);
    free(c->q);
    free(c->lag);
    free_views(c);
    kvs_kv_kivi_free(c);
    memset(c, 0, sizeof *c);
}

void kvs_dec_buf_free(dec_buf *b) {
    free(b->x);
    free(b->xn);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->att);
    free(b->g);
    free(b->u);
    free(b->o);
    free(b->xq);
    free(b->cs);
    free(b->sn);
    free(b->pos);
    free(b->lim);
    memset(b, 0, sizeof *b);
}

kvs_status kvs_dec_buf_init(dec_buf *b, const kvs_model_info *MI, int cap, kvs_err *err) {
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff;
    memset(b, 0, sizeof *b);
    int maxv = E > F ? E : F;
    if (Hq * D > maxv) maxv = Hq * D;
    b->cap = cap;
    b->maxv = maxv;
    b->nqb = maxv / 32 + 1;
    size_t c = (size_t)cap;
    b->x = malloc(c * E * 4);
    b->xn = malloc(c * maxv * 4);
    b->q = malloc(c * Hq * D * 4);
    b->k = malloc(c * Hkv * D * 4);
    b->v = malloc(c * Hkv * D * 4);
    b->att = malloc(c * Hq * D * 4);
    b->g = malloc(c * F * 4);
    b->u = malloc(c * F * 4);
    b->o = malloc(c * E * 4);
    b->xq = malloc(c * b->nqb * sizeof *b->xq);
    b->cs = malloc(c * D * 4); /* [2][D/2] per sequence */
    b->sn = malloc(c * D * 4);
    b->pos = malloc(c * sizeof *b->pos);
    b->lim = malloc(c * sizeof *b->lim);
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || !b->att || !b->g || !b->u || !b->o || !b->xq || !b->cs ||
        !b->sn || !b->pos || !b->lim) {
        kvs_dec_buf_free(b);
        return kvs_errorf(err, KVS_ERR_NOMEM, "decode scratch: out of memory for %d sequences", cap);
    }
    return KVS_OK;
}

void kvs_session_free(kvs_session *s) {
    if (!s) return;
    if (s->kv)
        for (int l = 0; l < s->m->info.n_layers; l++) kv_layer_free(&s->kv[l]);
    free(s->kv);
    free(s->modality);
    kvs_pool_free(s->pool);
    free(s->inv_freq_g);
    free(s->inv_freq_l);
    kvs_dec_buf_free(&s->db);
    free(s->scores);
    kvs_attn_stats_free(s);
    kvs_recon_free(s);
    free(s);
}

/* (Re)allocate a layer's buffers with capacity cap (contents undefined);
 * lag [Hkv] (or NULL) packs ragged heads: head g gets cap - lag[g] rows, and
 * the layer keeps a copy of lag; rsz_k, rsz_v: bytes of a K, V row. */
static kvs_status kv_alloc(kv_layer *c, int Hkv, int cap, const int32_t *lag, size_t rsz_k, size_t rsz_v,
                          kvs_err *err) {
    free_views(c);
    free(c->k);
    free(c->v);
    free(c->pos);
    free(c->lag);
    c->lag = NULL;
    size_t rows = (size_t)Hkv * cap;
    for (int g = 0; lag && g < Hkv; g++) rows -= (size_t)lag[g];
    c->k = malloc(rows * rsz_k);
    c->v = malloc(rows * rsz_v);
    c->pos = malloc(rows * sizeof(int32_t));
    if (lag && (c->lag = malloc(sizeof(int32_t) * (size_t)Hkv))) memcpy(c->lag, lag, sizeof(int32_t) * (size_t)Hkv);
    c->cap = cap;
    c->len = 0;
    if (!c->k || !c->v || !c->pos || (lag && !c->lag)) {
        c->cap = 0; /* kvs_session_reset reallocates; prefill reports it */
        return kvs_errorf(err, KVS_ERR_NOMEM, "KV cache: out of memory for %d positions", cap);
    }
    return KVS_OK;
}


kvs_status kvs_session_new(kvs_model *m, const kvs_session_opts *o, kvs_session **out, kvs_err *err) {
    *out = NULL;
    const kvs_model_info *MI = &m->info;
    kvs_session *s = calloc(1, sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "session: out of memory");
    s->m = m;
    s->n_ctx = o && o->n_ctx > 0 ? o->n_ctx : (MI->n_ctx_train < 8192 ? MI->n_ctx_train : 8192);
    s->n_threads = o && o->n_threads > 0 ? o->n_threads : m->n_threads;
    s->record_queries = o ? o->record_queries : 0;
    s->ctype_k = o ? o->cache_type : KVS_CACHE_F16;
    s->ctype_v = o && o->cache_type_v > 0 ? o->cache_type_v - 1 : s->ctype_k;
    s->ubatch = KVS_UBATCH;
    kvs_status st = KVS_OK;
    for (int w = 0; w < 2; w++) {
        const int ct = w ? s->ctype_v : s->ctype_k;
        if (ct < 0 || ct >= KVS_CACHE_N_TYPES) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "session: %s %d is not one of f16 (0), bf16 (1), f32 (2), q8_0 (3), q4_0 (4)",
                            w ? "cache_type_v - 1" : "cache_type", ct);
            goto cleanup;
        }
        if (kvs_cache_is_block(ct) && (MI->head_dim % 32 || MI->head_dim > KVS_CACHE_QMAX)) {
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "session: %s cache %s needs head_dim a multiple of 32 up to %d; %s has %d",
                            w ? "V" : "K", kvs_cache_type_name(ct), KVS_CACHE_QMAX, MI->name, MI->head_dim);
            goto cleanup;
        }
    }
    if (kvs_cache_is_kivi(s->ctype_k) || kvs_cache_is_kivi(s->ctype_v)) {
        /* the prompt's rows are fp16 until the stores are made (kivi_cache.c) */
        if (kvs_cache_is_kivi(s->ctype_k) != kvs_cache_is_kivi(s->ctype_v)) {
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "session: K cache %s with V cache %s: a kivi cache holds K and V in one store per KV head "
                            "(keys per channel, values per token); give both K and V a kivi type",
                            kvs_cache_type_name(s->ctype_k), kvs_cache_type_name(s->ctype_v));
            goto cleanup;
        }
        if ((st = kvs_kivi_session_config(m, s->ctype_k, s->ctype_v, 0, 0, &s->kivi_cfg, err))) goto cleanup;
        s->kivi = s->ctype_k;
        s->ctype_k = s->ctype_v = KVS_CACHE_F16;
    }
    s->rsz_k = kvs_cache_row_size(s->ctype_k, MI->head_dim);
    s->rsz_v = kvs_cache_row_size(s->ctype_v, MI->head_dim);
    if (s->n_ctx > MI->n_ctx_train) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "n_ctx %d exceeds the model's context length %d", s->n_ctx,
                        MI->n_ctx_train);
        goto cleanup;
    }
    if (s->record_queries < -1) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "record_queries %d must be -1, 0 or a count", s->record_queries);
        goto cleanup;
    }
    const int D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, L = MI->n_layers;
    if ((st = kvs_pool_new(s->n_threads, &s->pool, err))) goto cleanup;
    if ((st = kvs_dec_buf_init(&s->db, MI, 1, err))) goto cleanup;
    s->kv = calloc((size_t)L, sizeof *s->kv);
    s->modality = calloc((size_t)s->n_ctx, 1);
    s->inv_freq_g = malloc((size_t)D / 2 * sizeof(float));
    s->inv_freq_l = malloc((size_t)D / 2 * sizeof(float));
    s->scores = malloc((size_t)Hq * s->n_ctx * 4);
    if (!s->kv || !s->modality || !s->inv_freq_g || !s->inv_freq_l || !s->scores) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "session: out of memory");
        goto cleanup;
    }
    /* theta_i(pos) = pos * inv_freq[i]; scaling and frequency factors apply to global layers */
    for (int i = 0; i < D / 2; i++) {
        double g = pow((double)MI->rope_base, -2.0 * i / D) * m->rope_scale;
        if (m->rope_freqs) g /= m->rope_freqs[i];
        s->inv_freq_g[i] = (float)g;
        s->inv_freq_l[i] = (float)pow((double)MI->rope_base_local, -2.0 * i / D);
    }
    /* capacity n_ctx per layer: pages are only committed when written */
    for (int l = 0; l < L; l++)
        if ((st = kv_alloc(&s->kv[l], Hkv, s->n_ctx, NULL, s->rsz_k, s->rsz_v, err))) goto cleanup;
    /* the pool parallelises sgemm calls itself (each thread its own block) */
    openblas_set_num_threads(1);
    *out = s;
    return KVS_OK;
cleanup:
    kvs_session_free(s);
    return st;
}

void kvs_session_reset(kvs_session *s) {
    const kvs_model_info *MI = &s->m->info;
    for (int l = 0; l < MI->n_layers; l++) {
        kv_layer *c = &s->kv[l];
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        const int packed = c->lag != NULL || c->kivi; /* ragged buffers are smaller than Hkv x cap; stores: none */
        free(c->lag);
        c->lag = NULL;
        kvs_kv_kivi_free(c);
        if (c->cap != s->n_ctx || packed) {
            kvs_status st = kv_alloc(c, MI->n_kv_heads, s->n_ctx, NULL, s->rsz_k, s->rsz_v, NULL);
            if (st) c->cap = 0; /* next prefill reports the allocation failure */
        }
        free_views(c);
        c->len = 0;
        c->compressed = 0;
        c->bounded = 0;
    }
    s->n_past = 0;
    s->n_prompt = 0;
    s->rec_end = 0;
    kvs_attn_stats_free(s);
    kvs_recon_free(s);
}

int kvs_session_n_ctx(const kvs_session *s) { return s->n_ctx; }
void kvs_session_set_ubatch(kvs_session *s, int ubatch) { s->ubatch = ubatch > 0 ? ubatch : KVS_UBATCH; }
int kvs_session_n_past(const kvs_session *s) { return s->n_past; }
const kvs_model *kvs_session_model(const kvs_session *s) { return s->m; }

/* ---- sliding-window layers keep their window ------------------------------------ */
/* A local layer's query at position p sees rows with position > p - window.
 * Once a session is past its prefill (kvs_session_compress, or
 * kvs_session_trim_local), a local layer keeps only those rows, in a buffer of
 * window + slack rows (slack = max(window, KVS_EXTEND_COLS)); when decoding
 * fills it, the rows no later query can see are dropped by one memmove per
 * layer, so the memmove is amortised over >= slack tokens and decoding never
 * allocates. Before that the prefill session keeps the whole prompt in every
 * layer (compress_local needs it; cache views require it). */

static int window_cap(const kvs_session *s) {
    int w = s->m->info.sliding_window;
    return w + (w > KVS_EXTEND_COLS ? w : KVS_EXTEND_COLS);
}

/* Rows of layer c that no query at position >= p can see: the minimum over
 * KV heads of the rows with position <= p - window (positions ascend per
 * head, so they are the first rows; every head keeps its visible rows). */
static int kv_droppable(const kvs_session *s, const kv_layer *c, int p) {
    const int Hkv = s->m->info.n_kv_heads, W = s->m->info.sliding_window;
    int drop = c->len;
    for (int g = 0; g < Hkv && drop > 0; g++) drop = kvs_kv_first_visible(kvs_kv_pos(c, g), drop, p, W);
    return drop;
}

/* Drop those rows of bounded layer c (one memmove per buffer). */
static void kv_drop_old(const kvs_session *s, kv_layer *c, int p) {
    const int Hkv = s->m->info.n_kv_heads;
    const int drop = kv_droppable(s, c, p);
    if (drop == 0) return;
    const int keep = c->len - drop;
    for (int g = 0; g < Hkv; g++) {
        memmove(kvs_kv_krow(s, c, g, 0), kvs_kv_krow(s, c, g, drop), (size_t)keep * s->rsz_k);
        memmove(kvs_kv_vrow(s, c, g, 0), kvs_kv_vrow(s, c, g, drop), (size_t)keep * s->rsz_v);
        int32_t *P = kvs_kv_pos(c, g);
        memmove(P, P + drop, (size_t)keep * sizeof *P);
    }
    c->len = keep;
}

/* Make room for `need` rows at positions p, p+1, ... in every bounded layer
 * (drops rows only when the buffer would overflow). */
void kvs_kv_make_room(kvs_session *s, int p, int need) {
    for (int l = 0; l < s->m->info.n_layers; l++) {
        kv_layer *c = &s->kv[l];
        if (c->bounded && c->len + need > c->cap) kv_drop_old(s, c, p);
    }
}

void kvs_kv_drop_bounded(kvs_session *s, int p) {
    for (int l = 0; l < s->m->info.n_layers; l++)
        if (s->kv[l].bounded) kv_drop_old(s, &s->kv[l], p);
}

/* Rows layer c can take from position p on (bounded layers: after dropping);
 * the exact count only when it is below need. */
int kvs_kv_room(const kvs_session *s, const kv_layer *c, int p, int need) {
    int r = c->cap - c->len;
    if (!c->bounded || r >= need) return r;
    return r + kv_droppable(s, c, p);
}

kvs_status kvs_session_trim_local(kvs_session *s, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    if (MI->sliding_window <= 0 || s->n_past == 0) return KVS_OK;
    const int Hkv = MI->n_kv_heads, room = s->n_ctx - s->n_past;
    for (int l = 0; l < MI->n_layers; l++) {
        kv_layer *c = &s->kv[l];
        if (!s->m->layers[l].is_local || c->bounded) continue;
        c->bounded = 1; /* kv_drop_old only works on its rows; the capacity is set below */
        kv_drop_old(s, c, s->n_past);
        int cap = c->len + room < window_cap(s) ? c->len + room : window_cap(s);
        if (cap < c->len + 1 && room > 0) cap = c->len + 1;
        if (cap == c->cap) continue;
        free_views(c);
        kv_layer n = *c;
        n.k = malloc((size_t)Hkv * cap * s->rsz_k);
        n.v = malloc((size_t)Hkv * cap * s->rsz_v);
        n.pos = malloc((size_t)Hkv * cap * sizeof(int32_t));
        n.cap = cap;
        if (!n.k || !n.v || !n.pos) {
            free(n.k);
            free(n.v);
            free(n.pos);
            return kvs_errorf(err, KVS_ERR_NOMEM, "trim: layer %d: out of memory for %d rows", l, cap);
        }
        for (int g = 0; g < Hkv; g++) {
            memcpy(kvs_kv_krow(s, &n, g, 0), kvs_kv_krow(s, c, g, 0), (size_t)c->len * s->rsz_k);
            memcpy(kvs_kv_vrow(s, &n, g, 0), kvs_kv_vrow(s, c, g, 0), (size_t)c->len * s->rsz_v);
            memcpy(kvs_kv_pos(&n, g), kvs_kv_pos(c, g), (size_t)c->len * sizeof(int32_t));
        }
        free(c->k);
        free(c->v);
        free(c->pos);
        if (c->len != s->n_prompt) { /* recorded queries serve compression, which needs the whole prompt */
            free(c->q);
            n.q = NULL;
            n.nq = 0;
        }
        *c = n;
    }
    return KVS_OK;
}

kvs_status kvs_session_fill_random(kvs_session *s, int n, uint64_t seed, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hkv = MI->n_kv_heads;
    if (s->n_past != 0) return kvs_errorf(err, KVS_ERR_INVALID, "fill: the session must be empty (reset it)");
    if (n < 1 || n > s->n_ctx)
        return kvs_errorf(err, KVS_ERR_INVALID, "fill: %d rows outside [1, n_ctx %d]", n, s->n_ctx);
    float *tmp = malloc(sizeof(float) * (size_t)D);
    if (!tmp) return kvs_errorf(err, KVS_ERR_NOMEM, "fill: out of memory");
    for (int l = 0; l < MI->n_layers; l++) {
        kv_layer *c = &s->kv[l];
        if (c->cap < n) {
            free(tmp);
            return kvs_errorf(err, KVS_ERR_NOMEM, "fill: layer %d has room for %d rows", l, c->cap);
        }
        for (int g = 0; g < Hkv; g++)
            for (int r = 0; r < n; r++) {
                for (int i = 0; i < D; i++) tmp[i] = (float)kvs_rng_normal(&seed);
                kvs_cache_from_f32(s->ctype_k, tmp, kvs_kv_krow(s, c, g, r), D);
                for (int i = 0; i < D; i++) tmp[i] = (float)kvs_rng_normal(&seed);
                kvs_cache_from_f32(s->ctype_v, tmp, kvs_kv_vrow(s, c, g, r), D);
                kvs_kv_pos(c, g)[r] = r;
            }
        c->len = n;
    }
    free(tmp);
    memset(s->modality, KVS_MOD_TEXT, (size_t)n);
    s->n_past = s->n_prompt = n;
    return KVS_OK;
}

/* ---- copies, views, compression --------------------------------------------------- */

/* Every row of src's layer a into dst's layer c (its buffers reallocated to
 * a->len + room rows; a trimmed layer: its window's), positions and flags
 * with them, no recorded queries; tmp [D] (NULL where the cache types are
 * the same) converts the rows through fp32. */
static kvs_status copy_layer(kvs_session *dst, kv_layer *c, const kvs_session *src, const kv_layer *a, int room,
                             float *tmp, kvs_err *err) {
    const int D = src->m->info.head_dim, Hkv = src->m->info.n_kv_heads;
    int cap = a->len + room;
    if (a->bounded && cap > window_cap(src)) cap = a->len < window_cap(src) ? window_cap(src) : a->len + 1;
    if (c->cap != cap || a->lag) {
        kvs_status st = kv_alloc(c, Hkv, cap, a->lag, dst->rsz_k, dst->rsz_v, err);
        if (st) return st;
    }
    for (int g = 0; g < Hkv; g++) { /* each head's own rows */
        const size_t rows = (size_t)(a->len - kvs_kv_lag(a, g));
        if (!tmp) {
            memcpy(kvs_kv_krow(dst, c, g, 0), kvs_kv_krow(src, a, g, 0), rows * src->rsz_k);
            memcpy(kvs_kv_vrow(dst, c, g, 0), kvs_kv_vrow(src, a, g, 0), rows * src->rsz_v);
        } else
            for (size_t r = 0; r < rows; r++) {
                kvs_cache_to_f32(src->ctype_k, kvs_kv_krow(src, a, g, (int)r), tmp, D);
                kvs_cache_from_f32(dst->ctype_k, tmp, kvs_kv_krow(dst, c, g, (int)r), D);
                kvs_cache_to_f32(src->ctype_v, kvs_kv_vrow(src, a, g, (int)r), tmp, D);
                kvs_cache_from_f32(dst->ctype_v, tmp, kvs_kv_vrow(dst, c, g, (int)r), D);
            }
        memcpy(kvs_kv_pos(c, g), kvs_kv_pos(a, g), rows * 4);
    }
    c->len = a->len;
    c->compressed = a->compressed;
    c->bounded = a->bounded;
    return KVS_OK;
}

/* The checks of a copy (what names the call in errors); then dst forgets its
 * sequence without kvs_session_reset's reallocation: every layer gets the
 * capacity it needs after. */
static kvs_status copy_begin(kvs_session *dst, const kvs_session *src, const char *what, kvs_err *err) {
    if (dst->m != src->m) return kvs_errorf(err, KVS_ERR_INVALID, "%s: sessions of different models", what);
    if (dst->n_ctx < src->n_past)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: destination context %d < source length %d", what, dst->n_ctx,
                          src->n_past);
    if (kvs_kv_kivi_sealed(src))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: the source's %s cache is quantised already (by compression or decoding); "
                          "copy a KIVI session before that", what, kvs_cache_type_name(src->kivi));
    for (int l = 0; l < src->m->info.n_layers; l++) {
        kv_layer *c = &dst->kv[l];
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        free_views(c);
        c->len = 0;
        c->compressed = c->bounded = 0;
        if (c->lag || c->kivi) c->cap = -1; /* packed (smaller) buffers, or stores: reallocate */
        kvs_kv_kivi_free(c);
        free(c->lag);
        c->lag = NULL;
    }
    dst->n_past = dst->n_prompt = 0;
    kvs_attn_stats_free(dst);
    return KVS_OK;
}

kvs_status kvs_session_copy(kvs_session *dst, const kvs_session *src, kvs_err *err) {
    if (dst == src) return KVS_OK;
    kvs_status st0 = copy_begin(dst, src, "session copy", err);
    if (st0) return st0;
    const kvs_model_info *MI = &src->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads;
    /* other cache types: rows converted through fp32 (bench: one prefill, decode per type) */
    const int conv = dst->ctype_k != src->ctype_k || dst->ctype_v != src->ctype_v;
    float *tmp = conv ? malloc(sizeof(float) * (size_t)D) : NULL;
    if (conv && !tmp) return kvs_errorf(err, KVS_ERR_NOMEM, "session copy: out of memory");
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *a = &src->kv[l];
        kv_layer *c = &dst->kv[l];
        kvs_status st = copy_layer(dst, c, src, a, dst->n_ctx - src->n_past, tmp, err);
        if (!st && a->q) {
            c->q = malloc((size_t)Hq * a->nq * D * 4);
            if (!c->q) st = kvs_errorf(err, KVS_ERR_NOMEM, "session copy: out of memory for queries");
            else {
                memcpy(c->q, a->q, (size_t)Hq * a->nq * D * 4);
                c->nq = a->nq;
            }
        }
        if (st) {
            free(tmp);
            kvs_session_reset(dst);
            return st;
        }
    }
    free(tmp);
    memcpy(dst->modality, src->modality, (size_t)src->n_past);
    dst->n_past = src->n_past;
    dst->n_prompt = src->n_prompt;
    dst->rec_end = src->rec_end;
    kvs_status st = kvs_attn_stats_copy(dst, src, err);
    return st ? st : kvs_recon_copy(dst, src, err);
}

/* The view of kvs_session_cache_view; current = 1: of the rows held now (compressed, extended or
 * decoded; kvs_session_recompress), which every selected layer must hold equally many of, each KV head
 * the same count, none trimmed to its window; 0: of the uncompressed prefill cache only. */
static kvs_status cache_view(const kvs_session *s, int include_local, int current, kvs_cache_view *out,
                             kvs_layer *layers_storage, int *layer_map, int *n_mapped, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads;
    if (s->n_prompt == 0) return kvs_errorf(err, KVS_ERR_INVALID, "cache view: no prefill in this session");
    int n = 0, rows = -1;
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *c = &s->kv[l];
        if (!include_local && s->m->layers[l].is_local) continue;
        if (!current && (c->compressed || c->len != s->n_prompt))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "cache view: layer %d is compressed or was extended by decoding (%d rows, prompt %d)", l,
                              c->len, s->n_prompt);
        if (current && (c->lag || c->bounded || (rows >= 0 && c->len != rows)))
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "recompress: layer %d holds %s (%d rows, the first selected layer %d); compressing "
                              "again needs every selected layer to hold the same rows in every KV head, untrimmed "
                              "(methods with per-layer or per-head budgets cannot be chunked)",
                              l, c->lag ? "per-head counts" : c->bounded ? "only its window" : "another count", c->len,
                              rows);
        rows = c->len;
        kvs_layer *L = &layers_storage[n];
        memset(L, 0, sizeof *L);
        kvs_status st = layer_views(s, &s->kv[l], &L->k, &L->v, err);
        if (st) return st;
        if (c->q) L->q = (kvs_view){c->q, KVS_F32, KVS_HOST, Hq, c->nq, D, (int64_t)c->nq * D, D};
        else L->q = (kvs_view){NULL, KVS_F32, KVS_HOST, Hq, 0, D, 0, D};
        if (!current) kvs_attn_stats_view(s, l, L); /* the prefill's statistics, where it has them */
        if (!current) kvs_recon_view(s, l, L);
        layer_map[n++] = l;
    }
    if (n == 0) return kvs_errorf(err, KVS_ERR_INVALID, "cache view: no layer selected (all layers are local)");
    out->n_layers = n;
    out->layers = layers_storage;
    /* modality is indexed by position: rows of a compressed cache are not positions */
    out->modality = current ? NULL : s->modality;
    *n_mapped = n;
    return KVS_OK;
}

kvs_status kvs_session_cache_view(const kvs_session *s, int include_local, kvs_cache_view *out,
                                  kvs_layer *layers_storage, int *layer_map, int *n_mapped, kvs_err *err) {
    return cache_view(s, include_local, 0, out, layers_storage, layer_map, n_mapped, err);
}

/* Bytes of one position in one layer: K and V of every KV head. */
static int64_t row_bytes(const kvs_session *s) {
    return (int64_t)s->m->info.n_kv_heads * (int64_t)(s->rsz_k + s->rsz_v);
}

void kvs_session_kv_stats(const kvs_session *s, kvs_kv_stats *st) {
    const kvs_model_info *MI = &s->m->info;
    memset(st, 0, sizeof *st);
    st->n_layers = MI->n_layers;
    st->n_prompt = s->n_prompt;
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *c = &s->kv[l];
        st->is_local[l] = s->m->layers[l].is_local;
        st->compressed[l] = c->compressed;
        st->tokens_before[l] = s->n_prompt;
        st->tokens_after[l] = c->len;
        st->bytes_before[l] = (int64_t)s->n_prompt * row_bytes(s);
        st->bytes_after[l] = (int64_t)c->len * row_bytes(s);
        if (s->kivi && !st->is_local[l]) { /* the stores' codes, fp16 scales and zeros and windows (kivi_cache.c) */
            st->bytes_before[l] = kvs_kv_kivi_prompt_bytes(s, s->n_prompt);
            st->bytes_after[l] = kvs_kv_kivi_bytes(s, c);
        }
        if (c->lag) { /* ragged heads: each head's own rows (K and V) */
            int64_t lagged = 0;
            for (int g = 0; g < MI->n_kv_heads; g++) lagged += c->lag[g];
            if (!s->kivi || st->is_local[l]) st->bytes_after[l] -= lagged * (int64_t)(s->rsz_k + s->rsz_v);
            /* the mean per head, exact: the heads' rows sum to Hkv x that */
            st->tokens_after[l] = ((int64_t)MI->n_kv_heads * c->len - lagged) / MI->n_kv_heads;
        }
        if (st->is_local[l]) {
            st->bytes_before_local += st->bytes_before[l];
            st->bytes_after_local += st->bytes_after[l];
        } else {
            st->bytes_before_global += st->bytes_before[l];
            st->bytes_after_global += st->bytes_after[l];
        }
    }
    st->bytes_before_total = st->bytes_before_local + st->bytes_before_global;
    st->bytes_after_total = st->bytes_after_local + st->bytes_after_global;
    snprintf(st->method, sizeof st->method, "full");
}

/* kvs_session_apply_plan; current = 1: the plan indexes the rows held now
 * (kvs_session_recompress). The kept rows are read from src's layers and
 * written to s's: src == s compacts in place; else (kvs_session_copy_plan,
 * current = 0) s holds src's sequence with the plan's layers still to fill,
 * which never hold src's whole cache. Capacities: kept + s->n_ctx - n_past. */
static kvs_status apply_plan(kvs_session *s, const kvs_session *src, const kvs_plan *plan, const int *layer_map,
                             int current, kvs_kv_stats *stats, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hkv = MI->n_kv_heads;
    kvs_status st = kvs_plan_check(plan, err);
    if (st) return st;
    if (plan->n_kv_heads != Hkv || (!current && plan->n_tokens != src->n_prompt) || plan->n_layers < 1 ||
        plan->n_layers > MI->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "apply plan: plan shape (%d layers, %d KV heads, %d tokens) does not fit the cache (%d layers, %d KV heads, %d prompt tokens)",
                          plan->n_layers, plan->n_kv_heads, plan->n_tokens, MI->n_layers, Hkv, src->n_prompt);
    kvs_kv_stats before;
    kvs_session_kv_stats(src, &before);
    kvs_attn_stats_free(s); /* the cache changes below */
    kvs_recon_free(s);
    /* a plan that only keeps rows copies them as they are (bytes of any cache
     * type, block rows whole); one that merges goes through kvs_apply in fp32
     * and back to the cache type (block types quantise the merged rows again) */
    const int merge = plan->merge != KVS_MERGE_NONE || plan->kchan; /* ThinK's zeroed key channels: kvs_apply */
    kvs_layer *views = calloc((size_t)plan->n_layers, sizeof *views);
    /* src's layers as kvs_apply reads them: block types get fp32 copies of their own, freed at the end */
    kv_layer *shadow = merge ? calloc((size_t)plan->n_layers, sizeof *shadow) : NULL;
    kvs_dense_cache dense = {0};
    if (!views || (merge && !shadow)) {
        free(views);
        return kvs_errorf(err, KVS_ERR_NOMEM, "apply plan: out of memory");
    }
    for (int pl = 0; pl < plan->n_layers; pl++) {
        int l = layer_map[pl];
        if (l < 0 || l >= MI->n_layers) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "apply plan: plan layer %d maps to model layer %d (out of range)", pl, l);
            goto cleanup;
        }
        for (int q = 0; q < pl; q++)
            if (layer_map[q] == l) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "apply plan: model layer %d appears twice in the layer map", l);
                goto cleanup;
            }
        const kv_layer *c = &src->kv[l];
        if (c->kivi) {
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "apply plan: layer %d's %s cache is quantised already (by compression or decoding); a "
                            "plan applies to the fp16 prefill cache, before it is quantised",
                            l, kvs_cache_type_name(src->kivi));
            goto cleanup;
        }
        if (!current && (c->compressed || c->len != src->n_prompt)) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "apply plan: layer %d is already compressed or extended by decoding (%d rows, prompt %d)", l,
                            c->len, src->n_prompt);
            goto cleanup;
        }
        if (current && (c->len != plan->n_tokens || c->lag || c->bounded)) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "apply plan: layer %d holds %d rows%s, the plan indexes %d", l, c->len,
                            c->lag ? " with per-head counts" : c->bounded ? " trimmed to its window" : "",
                            plan->n_tokens);
            goto cleanup;
        }
        if (plan->layers[pl].counts && s->m->layers[l].is_local) {
            /* the sliding-window trim drops rows of all heads at once */
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "apply plan: plan of %s keeps different counts per KV head in sliding-window layer %d; "
                            "ragged heads are implemented for global layers only",
                            plan->method, l);
            goto cleanup;
        }
        if (merge) {
            shadow[pl] = *c;
            shadow[pl].kf = shadow[pl].vf = NULL;
            if ((st = layer_views(src, &shadow[pl], &views[pl].k, &views[pl].v, err))) goto cleanup;
        }
        views[pl].q = (kvs_view){NULL, KVS_F32, KVS_HOST, MI->n_heads, 0, D, 0, D};
    }
    kvs_cache_view cv = {plan->n_layers, views, current ? NULL : src->modality};
    if (merge && (st = kvs_apply(&cv, plan, &dense, err))) goto cleanup;
    int room = s->n_ctx - src->n_past;
    for (int pl = 0; pl < plan->n_layers; pl++) {
        int l = layer_map[pl];
        const kv_layer *a = &src->kv[l]; /* the rows kept are read from a, then c's buffers are replaced */
        kv_layer *c = &s->kv[l];
        const kvs_dense_layer *dl = merge ? &dense.layers[pl] : NULL;
        /* len = the longest head; a ragged head g holds len - lag[g] rows */
        int B = 0;
        for (int g = 0; g < Hkv; g++) {
            int Bg;
            kvs_plan_head(plan, pl, g, &Bg);
            B = Bg > B ? Bg : B;
        }
        assert(!dl || (dl->n_kv_heads == Hkv && dl->head_dim == D));
        int cap = B + room;
        int32_t *lag = plan->layers[pl].counts ? malloc(sizeof(int32_t) * (size_t)Hkv) : NULL; /* [Hkv] */
        if (plan->layers[pl].counts && !lag) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "apply plan: layer %d: out of memory", l);
            goto cleanup;
        }
        for (int g = 0; lag && g < Hkv; g++) {
            int Bg;
            kvs_plan_head(plan, pl, g, &Bg);
            lag[g] = B - Bg;
        }
        /* the new buffers: each head its kept rows plus the room to decode
         * (ragged heads packed, kv_alloc), then the kept rows */
        kv_layer n = {0};
        st = kv_alloc(&n, Hkv, cap, lag, s->rsz_k, s->rsz_v, err);
        free(lag);
        if (st) {
            kv_layer_free(&n);
            kvs_err_prefix(err, "apply plan: layer %d", l);
            goto cleanup;
        }
        for (int g = 0; g < Hkv; g++) {
            int Bg;
            const int32_t *row = kvs_plan_head(plan, pl, g, &Bg);
            if (merge) { /* kvs_apply's dense output is fp32: back to the cache types */
                const int64_t off = kvs_dense_head(dl, g, NULL);
                kvs_cache_from_f32(s->ctype_k, dl->k + (size_t)off * D, kvs_kv_krow(s, &n, g, 0), Bg * D);
                kvs_cache_from_f32(s->ctype_v, dl->v + (size_t)off * D, kvs_kv_vrow(s, &n, g, 0), Bg * D);
            } else
                for (int i = 0; i < Bg; i++) {
                    memcpy(kvs_kv_krow(s, &n, g, i), kvs_kv_krow(src, a, g, row[i]), s->rsz_k);
                    memcpy(kvs_kv_vrow(s, &n, g, i), kvs_kv_vrow(src, a, g, row[i]), s->rsz_v);
                }
            /* the kept rows' original positions (a prefill cache: row == position) */
            const int32_t *old_pos = kvs_kv_pos(a, g);
            int32_t *new_pos = kvs_kv_pos(&n, g);
            for (int i = 0; i < Bg; i++) new_pos[i] = old_pos[row[i]];
        }
        free(c->lag);
        free(c->k);
        free(c->v);
        free(c->pos);
        free(c->q);
        free_views(c);
        c->q = NULL;
        c->nq = 0;
        c->lag = n.lag;
        c->k = n.k;
        c->v = n.v;
        c->pos = n.pos;
        c->cap = cap;
        c->len = B;
        c->compressed = 1;
        c->bounded = 0; /* kvs_session_compress trims it again */
    }
    if (stats) {
        kvs_kv_stats after;
        kvs_session_kv_stats(s, &after);
        *stats = after;
        for (int l = 0; l < MI->n_layers; l++) {
            stats->tokens_before[l] = before.tokens_before[l];
            stats->bytes_before[l] = before.bytes_before[l];
        }
        stats->bytes_before_local = before.bytes_before_local;
        stats->bytes_before_global = before.bytes_before_global;
        stats->bytes_before_total = before.bytes_before_total;
        snprintf(stats->method, sizeof stats->method, "%s", plan->method);
        snprintf(stats->note, sizeof stats->note, "%s", plan->note);
    }
cleanup:
    kvs_dense_cache_free(&dense);
    for (int pl = 0; shadow && pl < plan->n_layers; pl++) free_views(&shadow[pl]);
    free(shadow);
    free(views);
    return st;
}

kvs_status kvs_session_apply_plan(kvs_session *s, const kvs_plan *plan, const int *layer_map, kvs_kv_stats *stats,
                                  kvs_err *err) {
    return apply_plan(s, s, plan, layer_map, 0, stats, err);
}

int kvs_method_queries_needed(const kvs_method *m, const kvs_params *p, int N) {
    if (!m) return 0;
    if (m->needs & KVS_NEED_Q_ALL) return N;
    if (m->needs & KVS_NEED_Q_WINDOW) {
        int w = m->queries_wanted ? m->queries_wanted(p, N) : N;
        return w < 1 ? 1 : (w > N ? N : w);
    }
    return 0;
}

kvs_status kvs_session_compress(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats, kvs_err *err) {
    kvs_plan plan;
    int map[KVS_MAX_LAYERS];
    kvs_status st = kvs_session_compress_plan(s, o, stats, &plan, map, err);
    kvs_plan_free(&plan);
    return st;
}

kvs_status kvs_session_plan_many(kvs_session *s, const kvs_compress_opts *o, const kvs_budget *budgets, int n,
                                 kvs_plan *plans, int *map, double *select_ms, kvs_err *err) {
    if (n >= 1) memset(plans, 0, sizeof *plans * (size_t)n);
    if (!o->method || n < 1) return kvs_errorf(err, KVS_ERR_INVALID, "compress: no method or no budget");
    const kvs_model_info *MI = &s->m->info;
    kvs_layer *layers = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
    float *wo_buf = NULL; /* W_o of the mapped layers, for methods that need it */
    int nm = 0;
    kvs_status st;
    if (!layers) return kvs_errorf(err, KVS_ERR_NOMEM, "compress: out of memory");
    kvs_cache_view cv;
    if ((st = kvs_session_cache_view(s, o->compress_local, &cv, layers, map, &nm, err))) goto cleanup;
    if ((o->method->needs & KVS_NEED_RECON) && !kvs_session_has_recon(s)) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "compress: method %s needs the context-reconstruction pass (KVS_NEED_RECON), which this "
                        "session did not run or no longer holds (kvs_session_set_recon before a prefill of tokens; "
                        "extending the prompt, e.g. the server's compress_suffix, drops it)",
                        o->method->name);
        goto cleanup;
    }
    int N = s->n_prompt;
    int want = kvs_method_queries_needed(o->method, &o->params, N);
    if (want > 0) {
        for (int i = 0; i < nm; i++) {
            kvs_layer *L = &layers[i];
            if (!L->q.data || L->q.n_tokens < want) {
                st = kvs_errorf(err, KVS_ERR_INVALID,
                                "compress: method %s needs the queries of the last %d prompt positions but the session recorded %d (set record_queries)",
                                o->method->name, want, L->q.data ? L->q.n_tokens : 0);
                goto cleanup;
            }
            /* the last `want` recorded queries */
            L->q.data = (const float *)L->q.data + (size_t)(L->q.n_tokens - want) * MI->head_dim;
            L->q.n_tokens = want;
        }
    } else
        for (int i = 0; i < nm; i++) layers[i].q = (kvs_view){NULL, KVS_F32, KVS_HOST, MI->n_heads, 0, MI->head_dim, 0, MI->head_dim};
    if ((o->method->needs & KVS_NEED_W_O) && (st = kvs_model_wo_views(s->m, layers, map, nm, &wo_buf, err)))
        goto cleanup;
    st = kvs_compress_many(o->method, &o->params, &cv, budgets, n, o->threads > 0 ? o->threads : s->n_threads, plans,
                           select_ms, err);
cleanup:
    free(wo_buf);
    free(layers);
    return st;
}

/* After a plan was applied (stats filled by it): trim the sliding-window
 * layers, quantise a KIVI cache, and the stats' after fields of what is held
 * then; compress_ms from t0. */
static kvs_status finish_compress(kvs_session *s, kvs_kv_stats *stats, double t0, kvs_err *err) {
    kvs_status st;
    /* past the prefill: sliding-window layers keep only their window */
    if ((st = kvs_session_trim_local(s, err))) return st;
    /* plan first, then quantise: a KIVI cache's kept (or merged) rows into its stores */
    if ((st = kvs_kv_kivi_seal(s, err))) return st;
    kvs_kv_stats now;
    kvs_session_kv_stats(s, &now);
    memcpy(stats->tokens_after, now.tokens_after, sizeof now.tokens_after);
    memcpy(stats->bytes_after, now.bytes_after, sizeof now.bytes_after);
    stats->bytes_after_local = now.bytes_after_local;
    stats->bytes_after_global = now.bytes_after_global;
    stats->bytes_after_total = now.bytes_after_total;
    stats->compress_ms = kvs_now_ms() - t0;
    return KVS_OK;
}

kvs_status kvs_session_compress_with(kvs_session *s, const kvs_plan *plan, const int *map, kvs_kv_stats *stats,
                                     kvs_err *err) {
    double t0 = kvs_now_ms();
    kvs_kv_stats local_stats;
    if (!stats) stats = &local_stats;
    kvs_status st;
    if ((st = kvs_session_apply_plan(s, plan, map, stats, err))) return st;
    return finish_compress(s, stats, t0, err);
}

/* The cache type of K (v = 0) or V (v = 1) as the session was opened with (kivi types included). */
static int kv_type(const kvs_session *s, int v) {
    if (!s->kivi) return v ? s->ctype_v : s->ctype_k;
    return v ? (s->kivi_cfg.v_bits == 2 ? KVS_CACHE_KIVI2 : KVS_CACHE_KIVI4) : s->kivi;
}

kvs_status kvs_session_copy_plan(kvs_session *dst, const kvs_session *src, const kvs_plan *plan, const int *map,
                                 kvs_kv_stats *stats, kvs_err *err) {
    const kvs_model_info *MI = &src->m->info;
    if (dst == src) return kvs_errorf(err, KVS_ERR_INVALID, "copy plan: the destination is the source");
    if (kv_type(dst, 0) != kv_type(src, 0) || kv_type(dst, 1) != kv_type(src, 1))
        return kvs_errorf(err, KVS_ERR_INVALID, "copy plan: cache types differ (K %s, V %s into K %s, V %s)",
                          kvs_cache_type_name(kv_type(src, 0)), kvs_cache_type_name(kv_type(src, 1)),
                          kvs_cache_type_name(kv_type(dst, 0)), kvs_cache_type_name(kv_type(dst, 1)));
    if (src->n_prompt == 0) return kvs_errorf(err, KVS_ERR_INVALID, "copy plan: no prefill in the source session");
    kvs_status st = copy_begin(dst, src, "copy plan", err);
    if (st) return st;
    /* the layers the plan keeps rows of are filled by apply_plan; every other layer is copied whole */
    uint8_t planned[KVS_MAX_LAYERS] = {0};
    for (int pl = 0; plan && pl < plan->n_layers && pl < KVS_MAX_LAYERS; pl++)
        if (map[pl] >= 0 && map[pl] < MI->n_layers) planned[map[pl]] = 1;
    for (int l = 0; l < MI->n_layers && !st; l++)
        if (!planned[l]) st = copy_layer(dst, &dst->kv[l], src, &src->kv[l], dst->n_ctx - src->n_past, NULL, err);
    if (!st) {
        memcpy(dst->modality, src->modality, (size_t)src->n_past);
        dst->n_past = src->n_past;
        dst->n_prompt = src->n_prompt;
        dst->rec_end = 0; /* no recorded queries */
        if (plan) st = apply_plan(dst, src, plan, map, 0, stats, err);
        else if (stats) kvs_session_kv_stats(dst, stats);
    }
    if (st) kvs_session_reset(dst);
    return st;
}

kvs_status kvs_session_compress_from(kvs_session *dst, const kvs_session *src, const kvs_plan *plan, const int *map,
                                     kvs_kv_stats *stats, kvs_err *err) {
    double t0 = kvs_now_ms();
    kvs_kv_stats local_stats;
    if (!stats) stats = &local_stats;
    if (!plan) return kvs_errorf(err, KVS_ERR_INVALID, "compress: no plan");
    kvs_status st = kvs_session_copy_plan(dst, src, plan, map, stats, err);
    if (st == KVS_OK) st = finish_compress(dst, stats, t0, err);
    return st;
}

kvs_status kvs_session_compress_plan(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats,
                                     kvs_plan *out_plan, int *map, kvs_err *err) {
    double t0 = kvs_now_ms();
    memset(out_plan, 0, sizeof *out_plan);
    kvs_kv_stats local_stats;
    if (!stats) stats = &local_stats;
    if (!o->method || !strcmp(o->method->name, "full")) {
        kvs_status st = kvs_session_trim_local(s, err);
        if (st == KVS_OK) st = kvs_kv_kivi_seal(s, err);
        kvs_session_kv_stats(s, stats);
        stats->compress_ms = kvs_now_ms() - t0;
        return st;
    }
    /* view + observe + select + apply + trim, and the reconstruction pass when the method reads it */
    const double recon = o->method->needs & KVS_NEED_RECON ? kvs_session_recon_ms(s) : 0.0;
    kvs_status st = kvs_session_plan_many(s, o, &o->budget, 1, out_plan, map, NULL, err);
    if (st == KVS_OK) st = kvs_session_compress_with(s, out_plan, map, stats, err);
    if (st == KVS_OK) stats->compress_ms = kvs_now_ms() - t0 + recon;
    return st;
}

kvs_status kvs_session_quantize(kvs_session *s, kvs_err *err) { return kvs_kv_kivi_seal(s, err); }

kvs_status kvs_session_set_kivi(kvs_session *s, int group, int residual, kvs_err *err) {
    if (!s->kivi) return kvs_errorf(err, KVS_ERR_INVALID, "kivi parameters: the session's cache is not a kivi type");
    if (s->n_past != 0) return kvs_errorf(err, KVS_ERR_INVALID, "kivi parameters: the session is not empty (reset it)");
    const int ctv = s->kivi_cfg.v_bits == 2 ? KVS_CACHE_KIVI2 : KVS_CACHE_KIVI4;
    kvs_kivi_config cfg;
    kvs_status st = kvs_kivi_session_config(s->m, s->kivi, ctv, group, residual, &cfg, err);
    if (st == KVS_OK) s->kivi_cfg = cfg;
    return st;
}

/* ---- chunked compression: record a window, compress again ------------------------- */

kvs_status kvs_session_record_window(kvs_session *s, int end, int nq, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int Hq = MI->n_heads, D = MI->head_dim;
    if (nq < 0 || (nq > 0 && (end - nq < s->n_past || end > s->n_ctx)))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "record window: %d queries ending at position %d do not lie in [n_past %d, n_ctx %d]", nq, end,
                          s->n_past, s->n_ctx);
    for (int l = 0; l < MI->n_layers; l++) {
        kv_layer *c = &s->kv[l];
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        if (nq > 0) {
            if (!(c->q = calloc((size_t)Hq * nq * D, sizeof(float)))) {
                s->rec_end = 0;
                return kvs_errorf(err, KVS_ERR_NOMEM, "record window: out of memory for %d queries", nq);
            }
            c->nq = nq;
        }
    }
    s->rec_end = nq > 0 ? end : 0;
    return KVS_OK;
}

kvs_status kvs_session_recompress(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats, kvs_err *err) {
    const double t0 = kvs_now_ms();
    const kvs_model_info *MI = &s->m->info;
    kvs_kv_stats local_stats;
    if (!stats) stats = &local_stats;
    if (!o->method || !strcmp(o->method->name, "full")) {
        kvs_session_kv_stats(s, stats);
        stats->compress_ms = kvs_now_ms() - t0;
        return KVS_OK;
    }
    kvs_layer *layers = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
    int map[KVS_MAX_LAYERS], nm = 0;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_status st;
    if (!layers) return kvs_errorf(err, KVS_ERR_NOMEM, "recompress: out of memory");
    kvs_cache_view cv;
    if (o->method->needs & KVS_NEED_RECON) {
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "recompress: method %s needs the context-reconstruction pass over the whole prompt "
                        "(KVS_NEED_RECON); chunked compression cannot give it",
                        o->method->name);
        goto cleanup;
    }
    if ((st = cache_view(s, o->compress_local, 1, &cv, layers, map, &nm, err))) goto cleanup;
    const int N = layers[0].k.n_tokens;
    const int want = kvs_method_queries_needed(o->method, &o->params, N);
    if (want > 0) {
        /* the window armed ends where the cache does, or the prefill's own record */
        if (!(s->rec_end == s->n_past || (s->rec_end == 0 && s->n_past == s->n_prompt)) || !layers[0].q.data) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "recompress: method %s observes queries, but none were recorded up to position %d "
                            "(kvs_session_record_window)",
                            o->method->name, s->n_past);
            goto cleanup;
        }
        for (int i = 0; i < nm; i++) { /* the last min(want, recorded) queries */
            kvs_layer *L = &layers[i];
            const int k = want < L->q.n_tokens ? want : L->q.n_tokens;
            L->q.data = (const float *)L->q.data + (size_t)(L->q.n_tokens - k) * MI->head_dim;
            L->q.n_tokens = k;
        }
    } else
        for (int i = 0; i < nm; i++)
            layers[i].q = (kvs_view){NULL, KVS_F32, KVS_HOST, MI->n_heads, 0, MI->head_dim, 0, MI->head_dim};
    if ((st = kvs_compress_many(o->method, &o->params, &cv, &o->budget, 1, o->threads > 0 ? o->threads : s->n_threads,
                                &plan, NULL, err)))
        goto cleanup;
    if ((st = apply_plan(s, s, &plan, map, 1, stats, err))) goto cleanup;
    s->rec_end = 0;
    stats->compress_ms = kvs_now_ms() - t0;
cleanup:
    kvs_plan_free(&plan);
    free(layers);
    return st;
}
