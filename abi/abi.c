/*
 * abi.c -- the functions of kvsieve_abi.h: library facts, contexts, the fed
 * cache, compression into plan handles, the plan accessors, apply.
 *
 * What it is: a thin translation layer. Compression is core's kvs_compress
 * (host caches) or kernels' kvs_gpu_compress (CUDA caches) on views built
 * from the caller's descriptors; apply is core's kvs_apply_into on one
 * layer (host) or kvs_gpu_apply_layer (CUDA); the plan JSON is formats'
 * kvs_plan_to_json, so `kvsieve compress --plan` and this ABI write the
 * same text for the same plan.
 * What it is not: no method logic, no I/O, no state outside the context
 * and plan objects (no globals, no thread-locals).
 */
#include "abi_internal.h"
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "kvsieve_methods.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVSIEVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#define ABI_CUDA_TEXT "yes"

/* The calling thread's current device, restored after every call that
 * switched it (a caller such as torch keeps its own notion of it). */
static int dev_current(void) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) d = -1;
    return d;
}

static void dev_restore(int prev) {
    if (prev >= 0) cudaSetDevice(prev);
}
#else
#define ABI_CUDA_TEXT "no"
#endif

#define ABI_STR2(x) #x
#define ABI_STR(x) ABI_STR2(x)

_Static_assert(KVS_ABI_OK == (int)KVS_OK && KVS_ABI_ERR_INVALID == (int)KVS_ERR_INVALID &&
                   KVS_ABI_ERR_NOMEM == (int)KVS_ERR_NOMEM &&
                   KVS_ABI_ERR_NUMERIC == (int)KVS_ERR_NUMERIC &&
                   KVS_ABI_ERR_UNSUPPORTED == (int)KVS_ERR_UNSUPPORTED &&
                   KVS_ABI_ERR_NOTFOUND == (int)KVS_ERR_NOTFOUND &&
                   KVS_ABI_ERR_INTERNAL == (int)KVS_ERR_INTERNAL,
               "ABI status codes are kvs_status's numbers");
_Static_assert(KVS_ABI_MERGE_NONE == (int)KVS_MERGE_NONE &&
                   KVS_ABI_MERGE_PIVOTAL == (int)KVS_MERGE_PIVOTAL &&
                   KVS_ABI_MERGE_AVERAGE == (int)KVS_MERGE_AVERAGE &&
                   KVS_ABI_MERGE_WEIGHTED == (int)KVS_MERGE_WEIGHTED,
               "ABI merge codes are kvs_merge's numbers");

/* The sizes of the 1.0 structs: a caller's struct_size may not be smaller. */
enum {
    SPEC_1_0 = sizeof(kvs_abi_method_spec),
    BUDGET_1_0 = sizeof(kvs_abi_budget),
    OPTS_1_0 = sizeof(kvs_abi_ctx_opts),
    STATS_1_0 = sizeof(kvs_abi_stats),
    INFO_1_0 = sizeof(kvs_abi_plan_info)
};

/* ---- library facts --------------------------------------------------------- */

void kvs_abi_version(int32_t *major, int32_t *minor, int32_t *patch) {
    if (major) *major = KVS_ABI_VERSION_MAJOR;
    if (minor) *minor = KVS_ABI_VERSION_MINOR;
    if (patch) *patch = KVS_ABI_VERSION_PATCH;
}

const char *kvs_abi_build_info(void) {
    return ABI_STR(KVS_ABI_VERSION_MAJOR) "." ABI_STR(KVS_ABI_VERSION_MINOR) "." ABI_STR(
        KVS_ABI_VERSION_PATCH) " (kvsieve " KVS_VERSION "; cuda: " ABI_CUDA_TEXT ")";
}

const char *kvs_abi_status_name(kvs_abi_status s) {
    if (s < KVS_ABI_OK || s > KVS_ABI_ERR_INTERNAL) return "unknown";
    return kvs_status_name((kvs_status)s);
}

/* The message of a context-less call into the caller's buffer. */
static kvs_abi_status to_buf(const kvs_err *e, kvs_status st, char *buf, size_t cap) {
    if (buf && cap > 0) {
        const char *m = st == KVS_OK ? "" : e->msg;
        size_t n = strlen(m);
        if (n >= cap) n = cap - 1;
        memcpy(buf, m, n);
        buf[n] = 0;
    }
    return (kvs_abi_status)st;
}

/* Text into a caller buffer with the size-query rule of kvsieve_abi.h. */
static kvs_status text_out(const char *text, char *buf, size_t cap, size_t *len, const char *what,
                           kvs_err *err) {
    const size_t need = strlen(text) + 1;
    if (len) *len = need;
    if (!buf || cap == 0) return KVS_OK;
    if (cap < need)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: buffer of %zu bytes, need %zu", what, cap, need);
    memcpy(buf, text, need);
    return KVS_OK;
}

kvs_abi_status kvs_abi_cuda_devices(int32_t *count, char *errbuf, size_t err_cap) {
    kvs_err e = {0};
    int n = 0;
    kvs_status st = kvs_gpu_device_count(&n, &e);
    if (count) *count = st == KVS_OK ? n : 0;
    return to_buf(&e, st, errbuf, err_cap);
}

static const char *param_type_name(kvs_param_type t) {
    switch (t) {
    case KVS_PARAM_INT: return "int";
    case KVS_PARAM_FLOAT: return "float";
    case KVS_PARAM_BOOL: return "bool";
    case KVS_PARAM_ENUM: return "enum";
    }
    return "?";
}

static cJSON *methods_tree(void) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return NULL;
    for (int i = 0; i < kvs_methods_count(); i++) {
        const kvs_method *m = kvs_method_at(i);
        cJSON *jm = cJSON_CreateObject();
        if (!jm || !cJSON_AddItemToArray(arr, jm)) goto oom;
        cJSON_AddStringToObject(jm, "name", m->name);
        cJSON_AddStringToObject(jm, "summary", m->summary ? m->summary : "");
        cJSON *needs = cJSON_AddArrayToObject(jm, "needs");
        if (!needs) goto oom;
        if (m->needs & KVS_NEED_Q_WINDOW) cJSON_AddItemToArray(needs, cJSON_CreateString("q_window"));
        if (m->needs & KVS_NEED_Q_ALL) cJSON_AddItemToArray(needs, cJSON_CreateString("q_all"));
        if (m->needs & KVS_NEED_MODALITY) cJSON_AddItemToArray(needs, cJSON_CreateString("modality"));
        if (m->needs & KVS_NEED_W_O) cJSON_AddItemToArray(needs, cJSON_CreateString("w_o"));
        if (m->needs & KVS_NEED_RECON) cJSON_AddItemToArray(needs, cJSON_CreateString("recon"));
        cJSON_AddBoolToObject(jm, "keeps_all", (m->needs & KVS_KEEPS_ALL) != 0);
        cJSON *jp = cJSON_AddArrayToObject(jm, "params");
        if (!jp) goto oom;
        for (int j = 0; j < m->n_params; j++) {
            const kvs_param_def *d = &m->params[j];
            char def[64];
            kvs_param_format(d, d->def, def, sizeof def);
            cJSON *o = cJSON_CreateObject();
            if (!o || !cJSON_AddItemToArray(jp, o)) goto oom;
            cJSON_AddStringToObject(o, "name", d->name);
            cJSON_AddStringToObject(o, "type", param_type_name(d->type));
            cJSON_AddStringToObject(o, "default", def);
            if (d->type == KVS_PARAM_INT || d->type == KVS_PARAM_FLOAT) {
                cJSON_AddNumberToObject(o, "min", d->min);
                cJSON_AddNumberToObject(o, "max", d->max);
            } else {
                cJSON_AddNullToObject(o, "min");
                cJSON_AddNullToObject(o, "max");
            }
            if (d->type == KVS_PARAM_ENUM) cJSON_AddStringToObject(o, "choices", d->choices);
            else cJSON_AddNullToObject(o, "choices");
            cJSON_AddStringToObject(o, "help", d->help ? d->help : "");
        }
    }
    return arr;
oom:
    cJSON_Delete(arr);
    return NULL;
}

kvs_abi_status kvs_abi_methods_json(char *buf, size_t cap, size_t *len, char *errbuf, size_t err_cap) {
    kvs_err e = {0};
    kvs_status st = KVS_OK;
    cJSON *tree = methods_tree();
    char *text = tree ? cJSON_PrintUnformatted(tree) : NULL;
    if (!text) st = kvs_errorf(&e, KVS_ERR_NOMEM, "kvs_abi_methods_json: no memory");
    else st = text_out(text, buf, cap, len, "kvs_abi_methods_json", &e);
    cJSON_free(text);
    cJSON_Delete(tree);
    return to_buf(&e, st, errbuf, err_cap);
}

/* The spec's parameters over m's defaults; errors name the parameter. */
static kvs_status spec_params(const kvs_abi_method_spec *s, const kvs_method *m, kvs_params *p, kvs_err *err) {
    kvs_status st;
    kvs_params_defaults(m, p);
    if (s->n_params < 0 || s->n_params > KVS_MAX_PARAMS * 4)
        return kvs_errorf(err, KVS_ERR_INVALID, "method spec: n_params = %d", (int)s->n_params);
    if (s->n_params > 0 && (!s->param_names || !s->param_values))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method spec: n_params = %d but param_names or param_values is NULL",
                          (int)s->n_params);
    for (int i = 0; i < s->n_params; i++) {
        if (!s->param_names[i] || !s->param_values[i])
            return kvs_errorf(err, KVS_ERR_INVALID, "method spec: param_%s[%d] is NULL",
                              s->param_names[i] ? "values" : "names", i);
        if ((st = kvs_params_set(m, p, s->param_names[i], s->param_values[i], err))) return st;
    }
    return KVS_OK;
}

/* A spec to a method and validated parameters; errors name the method and
 * the parameter. The method is a registered name or, when its text starts
 * with '{', a composition (kvs_method_resolve); *owned is then the composed
 * method the caller frees (NULL otherwise, and after an error). */
static kvs_status spec_resolve(const kvs_abi_method_spec *in, const kvs_method **m, kvs_params *p,
                               kvs_composed **owned, kvs_err *err) {
    kvs_abi_method_spec s;
    kvs_status st;
    *owned = NULL;
    if ((st = abi_read_struct(in, sizeof s, SPEC_1_0, &s, "method spec", err))) return st;
    if (!s.method) return kvs_errorf(err, KVS_ERR_INVALID, "method spec: method is NULL");
    if ((st = kvs_method_resolve(s.method, m, owned, err))) return st;
    if ((st = spec_params(&s, *m, p, err))) {
        kvs_composed_free(*owned);
        *owned = NULL;
    }
    return st;
}

kvs_abi_status kvs_abi_queries_wanted(const kvs_abi_method_spec *spec, int64_t n_tokens, int64_t *out,
                                      char *errbuf, size_t err_cap) {
    kvs_err e = {0};
    const kvs_method *m = NULL;
    kvs_composed *owned = NULL;
    kvs_params p;
    kvs_status st = KVS_OK;
    if (out) *out = 0;
    if (!out) st = kvs_errorf(&e, KVS_ERR_INVALID, "kvs_abi_queries_wanted: out is NULL");
    else if (n_tokens < 1 || n_tokens > INT32_MAX)
        st = kvs_errorf(&e, KVS_ERR_INVALID, "kvs_abi_queries_wanted: n_tokens = %lld outside [1, 2^31)",
                        (long long)n_tokens);
    else if ((st = spec_resolve(spec, &m, &p, &owned, &e)) == KVS_OK) {
        const int N = (int)n_tokens;
        int64_t q = 0;
        if (m->needs & KVS_NEED_Q_ALL) q = N;
        else if (m->needs & KVS_NEED_Q_WINDOW) q = m->queries_wanted ? m->queries_wanted(&p, N) : N;
        if (q > N) q = N;
        *out = q;
    }
    kvs_composed_free(owned);
    return to_buf(&e, st, errbuf, err_cap);
}

/* ---- contexts ------------------------------------------------------------------ */

kvs_abi_status kvs_abi_ctx_new(const kvs_abi_ctx_opts *opts, kvs_abi_ctx **out, char *errbuf,
                               size_t err_cap) {
    kvs_err e = {0};
    kvs_status st = KVS_OK;
    kvs_abi_ctx_opts o = {0};
    if (!out) return to_buf(&e, kvs_errorf(&e, KVS_ERR_INVALID, "kvs_abi_ctx_new: out is NULL"), errbuf,
                            err_cap);
    *out = NULL;
    if (opts && (st = abi_read_struct(opts, sizeof o, OPTS_1_0, &o, "ctx opts", &e)))
        return to_buf(&e, st, errbuf, err_cap);
    kvs_abi_ctx *c = calloc(1, sizeof *c);
    if (!c) return to_buf(&e, kvs_errorf(&e, KVS_ERR_NOMEM, "kvs_abi_ctx_new: no memory"), errbuf, err_cap);
    c->threads = o.threads >= 1 ? o.threads : 1;
    c->stats.struct_size = sizeof c->stats;
    *out = c;
    return to_buf(&e, KVS_OK, errbuf, err_cap);
}

static void cache_clear(kvs_abi_ctx *c) {
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < 3; i++) free(c->layers[l].copy[i]);
    free(c->layers);
    free(c->views);
    c->layers = NULL;
    c->views = NULL;
    c->n_layers = 0;
}

void kvs_abi_ctx_free(kvs_abi_ctx *c) {
    if (!c) return;
    cache_clear(c);
    free(c->modality);
    kvs_dense_cache_free(&c->scratch);
#ifdef KVSIEVE_HAVE_CUDA
    if (c->ws) { /* its stream and plans belong to its device */
        const int prev = dev_current();
        cudaSetDevice(c->ws_device);
        kvs_gpu_workspace_free(c->ws);
        dev_restore(prev);
    }
#endif
    free(c);
}

const char *kvs_abi_last_error(const kvs_abi_ctx *c) {
    if (!c) return "no context";
    return c->err.code == KVS_OK ? "" : c->err.msg;
}

/* Every context call starts here: clears the message (kvs_errorf prefixes
 * to a message already there). */
#define CTX_ENTER(c)                                                                               \
    do {                                                                                           \
        if (!(c)) return KVS_ABI_ERR_INVALID;                                                      \
        kvs_err_clear(&(c)->err);                                                                  \
    } while (0)

kvs_abi_status kvs_abi_ctx_stats(kvs_abi_ctx *c, kvs_abi_stats *out) {
    CTX_ENTER(c);
    uint32_t have;
    if (!out) return kvs_errorf(&c->err, KVS_ERR_INVALID, "kvs_abi_ctx_stats: out is NULL");
    memcpy(&have, out, sizeof have);
    if (have < STATS_1_0)
        return kvs_errorf(&c->err, KVS_ERR_INVALID,
                          "kvs_abi_ctx_stats: struct_size %u is smaller than the ABI 1.0 struct (%zu)",
                          (unsigned)have, (size_t)STATS_1_0);
    const size_t n = have < sizeof c->stats ? have : sizeof c->stats;
    memcpy((char *)out + sizeof have, (const char *)&c->stats + sizeof have, n - sizeof have);
    return KVS_ABI_OK;
}

/* ---- the cache --------------------------------------------------------------------- */

kvs_abi_status kvs_abi_cache_begin(kvs_abi_ctx *c, int32_t n_layers) {
    CTX_ENTER(c);
    cache_clear(c);
    c->generation++;
    if (n_layers < 1)
        return kvs_errorf(&c->err, KVS_ERR_INVALID, "kvs_abi_cache_begin: n_layers = %d (need >= 1)",
                          (int)n_layers);
    c->views = calloc((size_t)n_layers, sizeof *c->views);    /* [L] */
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);  /* [L] */
    if (!c->views || !c->layers) {
        cache_clear(c);
        return kvs_errorf(&c->err, KVS_ERR_NOMEM, "kvs_abi_cache_begin: no memory for %d layers",
                          (int)n_layers);
    }
    c->n_layers = n_layers;
    return KVS_ABI_OK;
}

static void layer_forget(kvs_abi_ctx *c, int l) {
    for (int i = 0; i < 3; i++) {
        free(c->layers[l].copy[i]);
        c->layers[l].copy[i] = NULL;
    }
    memset(&c->views[l], 0, sizeof c->views[l]);
    c->layers[l].set = 0;
}

kvs_abi_status kvs_abi_cache_layer(kvs_abi_ctx *c, int32_t layer, const kvs_abi_tensor *k,
                                   const kvs_abi_tensor *v, const kvs_abi_tensor *q) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    if (!c->views)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_abi_cache_layer: no cache (call kvs_abi_cache_begin "
                                                "first)");
    if (layer < 0 || layer >= c->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_abi_cache_layer: layer %d outside [0, %d)",
                          (int)layer, c->n_layers);
    layer_forget(c, layer);
    if (!k || !v)
        return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s is NULL (k and v are required)", (int)layer,
                          k ? "v" : "k");
    const kvs_abi_tensor *t[3] = {k, v, q};
    const char *names[3] = {"k", "v", "q"};
    kvs_view views[3];
    memset(views, 0, sizeof views);
    int dev_index[3] = {0, 0, 0};
    kvs_status st = KVS_OK;
    abi_layer *al = &c->layers[layer];
    for (int i = 0; i < 3; i++) {
        if (!t[i]) continue;
        char what[48];
        snprintf(what, sizeof what, "layer %d: %s", (int)layer, names[i]);
        int64_t bytes = 0;
        if ((st = abi_view_from_tensor(t[i], what, &views[i], &dev_index[i], &al->copy[i], &bytes, err)))
            goto fail;
        c->stats.tensors_fed++;
        if (al->copy[i]) {
            c->stats.tensors_copied++;
            c->stats.bytes_copied += bytes;
        }
    }
    /* The layer's tensors against each other (the cross-layer rules are
     * core's, at compress). */
    const kvs_view *kv = &views[0], *vv = &views[1];
    if (vv->n_heads != kv->n_heads || vv->n_tokens != kv->n_tokens || vv->head_dim != kv->head_dim) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "layer %d: v: shape [%d][%d][%d] differs from k's [%d][%d][%d]",
                        (int)layer, vv->n_heads, vv->n_tokens, vv->head_dim, kv->n_heads, kv->n_tokens,
                        kv->head_dim);
        goto fail;
    }
    for (int i = 1; i < 3; i++) {
        if (!t[i]) continue;
        if (views[i].device != kv->device || dev_index[i] != dev_index[0]) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "layer %d: %s: on %s %d, but k is on %s %d", (int)layer,
                            names[i], views[i].device == KVS_CUDA ? "CUDA device" : "host",
                            dev_index[i], kv->device == KVS_CUDA ? "CUDA device" : "host", dev_index[0]);
            goto fail;
        }
    }
    if (q) {
        const kvs_view *qv = &views[2];
        if (qv->head_dim != kv->head_dim) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "layer %d: q: head_dim %d differs from k's %d", (int)layer,
                            qv->head_dim, kv->head_dim);
            goto fail;
        }
        if (qv->n_heads % kv->n_heads != 0) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "layer %d: q: %d query heads is not a multiple of k's %d KV heads", (int)layer,
                            qv->n_heads, kv->n_heads);
            goto fail;
        }
        if (qv->n_tokens > kv->n_tokens) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "layer %d: q: Nq = %d query rows exceeds N = %d",
                            (int)layer, qv->n_tokens, kv->n_tokens);
            goto fail;
        }
    }
    c->views[layer].k = views[0];
    c->views[layer].v = views[1];
    c->views[layer].q = views[2]; /* data NULL when absent */
    al->device_index = dev_index[0];
    al->set = 1;
    return KVS_ABI_OK;
fail:
    layer_forget(c, layer);
    return st;
}

kvs_abi_status kvs_abi_cache_modality(kvs_abi_ctx *c, const kvs_abi_tensor *m) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    free(c->modality);
    c->modality = NULL;
    c->n_modality = 0;
    if (!m) return KVS_ABI_OK;
    kvs_abi_tensor t;
    kvs_status st;
    if ((st = abi_read_struct(m, sizeof t, sizeof t, &t, "modality", err))) return st;
    if (t.dtype != KVS_ABI_U8)
        return kvs_errorf(err, KVS_ERR_INVALID, "modality: dtype %s (need U8: uint8 or bool)",
                          abi_dtype_name(t.dtype));
    if (t.device != KVS_ABI_HOST)
        return kvs_errorf(err, KVS_ERR_INVALID, "modality: must be host memory (device %d)", (int)t.device);
    if (!(t.ndim == 1 || (t.ndim == 2 && t.shape[0] == 1)))
        return kvs_errorf(err, KVS_ERR_INVALID, "modality: ndim %d (need [N] or [1][N])", (int)t.ndim);
    const int64_t N = t.shape[t.ndim - 1], s = t.strides[t.ndim - 1];
    if (N < 1 || N > INT32_MAX)
        return kvs_errorf(err, KVS_ERR_INVALID, "modality: length %lld", (long long)N);
    if (!t.data) return kvs_errorf(err, KVS_ERR_INVALID, "modality: data is NULL");
    uint8_t *dst = malloc((size_t)N); /* [N] */
    if (!dst) return kvs_errorf(err, KVS_ERR_NOMEM, "modality: no memory for %lld bytes", (long long)N);
    const uint8_t *src = t.data;
    for (int64_t n = 0; n < N; n++) {
        dst[n] = src[n * s];
        if (dst[n] > KVS_MOD_AUDIO) {
            const int bad = dst[n];
            free(dst);
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "modality: value %d at position %lld (need 0 text, 1 image, 2 video, 3 "
                              "audio)",
                              bad, (long long)n);
        }
    }
    c->modality = dst;
    c->n_modality = N;
    return KVS_ABI_OK;
}

/* The fed cache as a core view; every layer set, one device, modality of
 * length N. *device / *device_index receive where it lives. */
static kvs_status cache_view(kvs_abi_ctx *c, kvs_cache_view *view, kvs_shape *shape, int *device,
                             int *device_index, kvs_err *err) {
    if (!c->views)
        return kvs_errorf(err, KVS_ERR_INVALID, "no cache (call kvs_abi_cache_begin and kvs_abi_cache_layer)");
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layers[l].set)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d of %d was not set (kvs_abi_cache_layer)", l,
                              c->n_layers);
        if (c->views[l].k.device != c->views[0].k.device ||
            c->layers[l].device_index != c->layers[0].device_index)
            return kvs_errorf(err, KVS_ERR_INVALID, "layer %d: k: on %s %d, but layer 0 is on %s %d", l,
                              c->views[l].k.device == KVS_CUDA ? "CUDA device" : "host",
                              c->layers[l].device_index,
                              c->views[0].k.device == KVS_CUDA ? "CUDA device" : "host",
                              c->layers[0].device_index);
    }
    /* Before core's shape check, which reads N modality bytes. */
    if (c->modality && c->n_modality != c->views[0].k.n_tokens)
        return kvs_errorf(err, KVS_ERR_INVALID, "modality: length %lld, but the cache has N = %d tokens",
                          (long long)c->n_modality, c->views[0].k.n_tokens);
    view->n_layers = c->n_layers;
    view->layers = c->views;
    view->modality = c->modality;
    kvs_status st = kvs_cache_check_shape(view, shape, err);
    if (st) return st;
    *device = c->views[0].k.device == KVS_CUDA ? KVS_ABI_CUDA : KVS_ABI_HOST;
    *device_index = c->layers[0].device_index;
    return KVS_OK;
}

#ifdef KVSIEVE_HAVE_CUDA
static kvs_status set_device(int dev, kvs_err *err) {
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    return KVS_OK;
}

/* A workspace on device `dev` large enough for `s` (re-made, at the larger
 * of the old and new shapes, when it is not). */
static kvs_status ensure_ws(kvs_abi_ctx *c, const kvs_shape *s, int dev, kvs_err *err) {
    kvs_status st = set_device(dev, err);
    if (st) return st;
    kvs_shape *w = &c->ws_shape;
    if (c->ws && c->ws_device == dev && w->n_layers >= s->n_layers && w->n_tokens >= s->n_tokens &&
        w->n_kv_heads >= s->n_kv_heads && w->n_q_heads >= s->n_q_heads && w->head_dim >= s->head_dim)
        return KVS_OK;
    kvs_shape m = *s;
    if (c->ws && c->ws_device == dev) {
        if (w->n_layers > m.n_layers) m.n_layers = w->n_layers;
        if (w->n_tokens > m.n_tokens) m.n_tokens = w->n_tokens;
        if (w->n_kv_heads > m.n_kv_heads) m.n_kv_heads = w->n_kv_heads;
        if (w->n_q_heads > m.n_q_heads) m.n_q_heads = w->n_q_heads;
        if (w->head_dim > m.head_dim) m.head_dim = w->head_dim;
    }
    if (c->ws) {
        cudaSetDevice(c->ws_device);
        kvs_gpu_workspace_free(c->ws);
        c->ws = NULL;
        if ((st = set_device(dev, err))) return st;
    }
    if ((st = kvs_gpu_workspace_init(&c->ws, &m, err))) return st;
    c->ws_shape = m;
    c->ws_device = dev;
    return KVS_OK;
}
#endif

/* ---- compression --------------------------------------------------------------------- */

kvs_abi_status kvs_abi_compress(kvs_abi_ctx *c, const kvs_abi_method_spec *spec,
                                const kvs_abi_budget *budget, kvs_abi_plan **out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_abi_compress: out is NULL");
    *out = NULL;
    const kvs_method *m = NULL;
    kvs_composed *owned = NULL;
    kvs_params params;
    kvs_abi_budget b;
    kvs_status st;
    if ((st = spec_resolve(spec, &m, &params, &owned, err))) return st;
    kvs_cache_view view;
    kvs_shape shape;
    int device = 0, dev_index = 0;
    kvs_abi_plan *p = NULL;
    if ((st = abi_read_struct(budget, sizeof b, BUDGET_1_0, &b, "budget", err)) ||
        (st = cache_view(c, &view, &shape, &device, &dev_index, err)) ||
        (!(p = calloc(1, sizeof *p)) && (st = kvs_errorf(err, KVS_ERR_NOMEM, "kvs_abi_compress: no memory")))) {
        kvs_composed_free(owned);
        return st;
    }
    const kvs_budget kb = {.ratio = b.ratio, .tokens = b.tokens};
    const double t0 = kvs_now_ms();
    if (device == KVS_ABI_HOST) {
        st = kvs_compress(m, &params, &view, &kb, c->threads, &p->plan, err);
    } else {
#ifdef KVSIEVE_HAVE_CUDA
        const int prev = dev_current();
        st = ensure_ws(c, &shape, dev_index, err);
        if (!st) st = kvs_gpu_compress(m->name, &params, &view, &kb, c->ws, &p->plan, err);
        dev_restore(prev);
#else
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED, "CUDA cache, but libkvsieve was built without CUDA");
#endif
    }
    if (st) {
        free(p);
        kvs_composed_free(owned);
        return st;
    }
    p->compress_ms = kvs_now_ms() - t0;
    p->m = m;
    p->owned = owned;
    p->owner = c;
    p->generation = c->generation;
    p->params = params;
    p->device = device;
    snprintf(p->method, sizeof p->method, "%s", owned ? kvs_composed_label(owned) : m->name);
    c->stats.compress_calls++;
    c->stats.compress_ms += p->compress_ms;
    *out = p;
    return KVS_ABI_OK;
}

void kvs_abi_plan_free(kvs_abi_plan *p) {
    if (!p) return;
    kvs_plan_free(&p->plan);
    kvs_composed_free(p->owned);
    free(p);
}

/* The plan-accessor preamble: the plan exists and belongs to c; layer in
 * range when has_layer. */
static kvs_status plan_check(const kvs_abi_ctx *c, const kvs_abi_plan *p, int has_layer, int layer,
                             kvs_err *err) {
    if (!p) return kvs_errorf(err, KVS_ERR_INVALID, "plan is NULL");
    if (p->owner != c)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan of %s was made by another context", p->method);
    if (has_layer && (layer < 0 || layer >= p->plan.n_layers))
        return kvs_errorf(err, KVS_ERR_INVALID, "plan of %s: layer %d outside [0, %d)", p->method, layer,
                          p->plan.n_layers);
    return KVS_OK;
}

/* Accessors that read the cache: the plan must come from the cache now fed. */
static kvs_status plan_needs_cache(const kvs_abi_ctx *c, const kvs_abi_plan *p, kvs_err *err) {
    if (p->generation != c->generation || !c->views)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "plan of %s was made from an earlier cache (kvs_abi_cache_begin was called "
                          "since); compress again",
                          p->method);
    /* A layer set again since may have another shape: the plan's indices
     * must stay inside the tensors read now. */
    if (c->n_layers != p->plan.n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "plan of %s has %d layers, the cache %d", p->method,
                          p->plan.n_layers, c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layers[l].set)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "plan of %s: layer %d of its cache was unset since (set it again)", p->method, l);
        const kvs_view *k = &c->views[l].k;
        if (k->n_heads != p->plan.n_kv_heads || k->n_tokens != p->plan.n_tokens)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "plan of %s (Hkv = %d, N = %d) does not match layer %d of the cache now "
                              "(Hkv = %d, N = %d)",
                              p->method, p->plan.n_kv_heads, p->plan.n_tokens, l, k->n_heads, k->n_tokens);
    }
    return KVS_OK;
}

kvs_abi_status kvs_abi_plan_get_info(kvs_abi_ctx *c, const kvs_abi_plan *p, kvs_abi_plan_info *out) {
    CTX_ENTER(c);
    kvs_status st = plan_check(c, p, 0, 0, &c->err);
    if (st) return st;
    if (!out) return kvs_errorf(&c->err, KVS_ERR_INVALID, "kvs_abi_plan_get_info: out is NULL");
    uint32_t have;
    memcpy(&have, out, sizeof have);
    if (have < INFO_1_0)
        return kvs_errorf(&c->err, KVS_ERR_INVALID,
                          "kvs_abi_plan_get_info: struct_size %u is smaller than the ABI 1.0 struct (%zu)",
                          (unsigned)have, (size_t)INFO_1_0);
    kvs_abi_plan_info i;
    memset(&i, 0, sizeof i);
    i.struct_size = have;
    i.n_layers = p->plan.n_layers;
    i.n_kv_heads = p->plan.n_kv_heads;
    i.n_tokens = p->plan.n_tokens;
    i.merge = (int32_t)p->plan.merge;
    i.device = p->device;
    i.key_channels = p->plan.kchan ? p->plan.kchan_dim : 0;
    i.total_kept = kvs_plan_total(&p->plan);
    i.compress_ms = p->compress_ms;
    snprintf(i.method, sizeof i.method, "%s", p->method);
    snprintf(i.merge_name, sizeof i.merge_name, "%s", kvs_merge_name(p->plan.merge));
    snprintf(i.note, sizeof i.note, "%s", p->plan.note);
    memcpy(out, &i, have < sizeof i ? have : sizeof i);
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_plan_budgets(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t *out, int64_t cap) {
    CTX_ENTER(c);
    kvs_status st = plan_check(c, p, 0, 0, &c->err);
    if (st) return st;
    if (!out || cap < p->plan.n_layers)
        return kvs_errorf(&c->err, KVS_ERR_INVALID, "kvs_abi_plan_budgets: out holds %lld, need %d",
                          out ? (long long)cap : 0LL, p->plan.n_layers);
    for (int l = 0; l < p->plan.n_layers; l++) out[l] = p->plan.layers[l].budget;
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_plan_indices(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer,
                                    const kvs_abi_tensor *out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    kvs_status st = plan_check(c, p, 1, layer, err);
    if (st) return st;
    if (p->plan.layers[layer].counts)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "layer %d: indices out: the layer's heads keep different counts (ragged plan of %s); "
                          "read kvs_abi_plan_head_counts and kvs_abi_plan_head_indices",
                          (int)layer, p->method);
    const int H = p->plan.n_kv_heads, B = p->plan.layers[layer].budget;
    const int32_t *idx = p->plan.layers[layer].idx; /* [H][B] */
    const int64_t dims[2] = {H, B};
    int64_t s[2];
    char what[48];
    snprintf(what, sizeof what, "layer %d: indices out", (int)layer);
    kvs_abi_tensor ot; /* host or CUDA: the output says which */
    if ((st = abi_read_struct(out, sizeof ot, sizeof ot, &ot, what, err))) return st;
    const int dev = ot.device == KVS_ABI_CUDA ? KVS_ABI_CUDA : KVS_ABI_HOST;
    const int dev_index = dev == KVS_ABI_CUDA ? ot.device_index : 0;
    if ((st = abi_check_out(out, what, (1u << KVS_ABI_I32) | (1u << KVS_ABI_I64), dev, dev_index, 2, dims, s,
                            err)))
        return st;
    const int i64 = ot.dtype == KVS_ABI_I64;
    if (dev == KVS_ABI_HOST) {
        for (int h = 0; h < H; h++)
            for (int b = 0; b < B; b++) {
                const int64_t o = h * s[0] + b * s[1];
                if (i64) ((int64_t *)ot.data)[o] = idx[(size_t)h * B + b];
                else ((int32_t *)ot.data)[o] = idx[(size_t)h * B + b];
            }
        return KVS_ABI_OK;
    }
#ifdef KVSIEVE_HAVE_CUDA
    const size_t n = (size_t)H * B, es = i64 ? 8 : 4;
    void *stage = malloc(n * es); /* [H][B] */
    if (!stage) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for %zu indices", what, n);
    for (size_t i = 0; i < n; i++) {
        if (i64) ((int64_t *)stage)[i] = idx[i];
        else ((int32_t *)stage)[i] = idx[i];
    }
    const int prev = dev_current();
    st = set_device(dev_index, err);
    if (!st) st = kvs_gpu_memcpy_h2d(ot.data, stage, n * es, err);
    dev_restore(prev);
    free(stage);
    if (st) kvs_err_prefix(err, "%s", what);
    return st;
#else
    return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "%s: CUDA tensor, but libkvsieve was built without CUDA", what);
#endif
}

kvs_abi_status kvs_abi_plan_head_counts(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer, int32_t *out,
                                        int64_t cap) {
    CTX_ENTER(c);
    kvs_status st = plan_check(c, p, 1, layer, &c->err);
    if (st) return st;
    const int H = p->plan.n_kv_heads;
    if (!out || cap < H)
        return kvs_errorf(&c->err, KVS_ERR_INVALID, "kvs_abi_plan_head_counts: out holds %lld, need %d",
                          out ? (long long)cap : 0LL, H);
    for (int h = 0; h < H; h++) kvs_plan_head(&p->plan, layer, h, &out[h]);
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_plan_head_indices(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer, int32_t head,
                                         const kvs_abi_tensor *out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    kvs_status st = plan_check(c, p, 1, layer, err);
    if (st) return st;
    if (head < 0 || head >= p->plan.n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "head indices: layer %d: head %d outside [0, %d)", (int)layer,
                          (int)head, p->plan.n_kv_heads);
    int B;
    const int32_t *row = kvs_plan_head(&p->plan, layer, head, &B); /* [B] */
    char what[64];
    snprintf(what, sizeof what, "layer %d: head %d: indices out", (int)layer, (int)head);
    const int64_t dims[1] = {B};
    int64_t s1[1];
    kvs_abi_tensor ot;
    if ((st = abi_read_struct(out, sizeof ot, sizeof ot, &ot, what, err))) return st;
    if ((st = abi_check_out(out, what, (1u << KVS_ABI_I32) | (1u << KVS_ABI_I64), KVS_ABI_HOST, 0, 1, dims, s1,
                            err)))
        return st;
    for (int b = 0; b < B; b++) {
        if (ot.dtype == KVS_ABI_I64) ((int64_t *)ot.data)[b * s1[0]] = row[b];
        else ((int32_t *)ot.data)[b * s1[0]] = row[b];
    }
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_plan_merge_map(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer, int32_t head,
                                      const kvs_abi_tensor *out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    kvs_status st = plan_check(c, p, 1, layer, err);
    if (st) return st;
    if ((st = plan_needs_cache(c, p, err))) return st;
    const int H = p->plan.n_kv_heads, N = p->plan.n_tokens;
    if (head < 0 || head >= H)
        return kvs_errorf(err, KVS_ERR_INVALID, "merge map: layer %d: head %d outside [0, %d)", (int)layer,
                          (int)head, H);
    int B;
    const int32_t *kept = kvs_plan_head(&p->plan, layer, head, &B); /* [B], ragged plans too */
    char what[64];
    snprintf(what, sizeof what, "layer %d: head %d: merge map out", (int)layer, (int)head);
    const int64_t dims[1] = {N};
    int64_t s[1];
    if ((st = abi_check_out(out, what, 1u << KVS_ABI_I32, KVS_ABI_HOST, 0, 1, dims, s, err))) return st;
    int32_t *assign = malloc(sizeof(int32_t) * (size_t)N); /* [N] */
    if (!assign) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory", what);
    const kvs_view *k = &c->views[layer].k;
    if (p->plan.merge == KVS_MERGE_NONE) {
        for (int n = 0; n < N; n++) assign[n] = -2;
        for (int b = 0; b < B; b++) assign[kept[b]] = -1;
    } else if (k->device == KVS_HOST) {
        st = kvs_merge_assign(k, head, kept, B, assign, err);
    } else {
#ifdef KVSIEVE_HAVE_CUDA
        void *dk = NULL, *da = NULL;
        kvs_shape shape;
        kvs_cache_view view;
        int device = 0, dev_index = 0;
        const int prev = dev_current();
        st = cache_view(c, &view, &shape, &device, &dev_index, err);
        if (!st) st = ensure_ws(c, &shape, dev_index, err);
        if (!st) st = kvs_gpu_malloc(&dk, sizeof(int32_t) * (size_t)B, err);
        if (!st) st = kvs_gpu_malloc(&da, sizeof(int32_t) * (size_t)N, err);
        if (!st) st = kvs_gpu_memcpy_h2d(dk, kept, sizeof(int32_t) * (size_t)B, err);
        if (!st) st = kvs_gpu_merge_assign(c->ws, k, head, dk, B, da, err);
        if (!st) st = kvs_gpu_sync(c->ws, err);
        if (!st) st = kvs_gpu_memcpy_d2h(assign, da, sizeof(int32_t) * (size_t)N, err);
        kvs_gpu_free(dk);
        kvs_gpu_free(da);
        dev_restore(prev);
#else
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED, "CUDA cache, but libkvsieve was built without CUDA");
#endif
    }
    if (st) {
        free(assign);
        kvs_err_prefix(err, "%s", what);
        return st;
    }
    for (int n = 0; n < N; n++) ((int32_t *)out->data)[n * s[0]] = assign[n];
    free(assign);
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_plan_json(kvs_abi_ctx *c, const kvs_abi_plan *p, char *buf, size_t cap, size_t *len) {
    CTX_ENTER(c);
    kvs_status st = plan_check(c, p, 0, 0, &c->err);
    if (st) return st;
    char *text = kvs_plan_to_json(&p->plan, p->m, &p->params);
    if (!text) return kvs_errorf(&c->err, KVS_ERR_NOMEM, "kvs_abi_plan_json: no memory");
    st = text_out(text, buf, cap, len, "kvs_abi_plan_json", &c->err);
    free(text);
    return st;
}

/* ---- apply ---------------------------------------------------------------------------- */

/* fp32 rows [H][B][d] into a host output of dtype F32 / F16 / BF16 with
 * element strides s. */
static void write_rows(const float *src, int H, int B, int d, const kvs_abi_tensor *o, const int64_t *s) {
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++) {
            const float *row = src + ((size_t)h * B + b) * d;
            const int64_t base = h * s[0] + b * s[1];
            switch (o->dtype) {
            case KVS_ABI_F32:
                for (int c = 0; c < d; c++) ((float *)o->data)[base + c * s[2]] = row[c];
                break;
            case KVS_ABI_F16:
                for (int c = 0; c < d; c++) ((uint16_t *)o->data)[base + c * s[2]] = kvs_f32_to_f16(row[c]);
                break;
            default:
                for (int c = 0; c < d; c++) ((uint16_t *)o->data)[base + c * s[2]] = kvs_f32_to_bf16(row[c]);
                break;
            }
        }
}

static int same_dtype(const kvs_view *v, const kvs_abi_tensor *o) {
    return (v->dtype == KVS_F32 && o->dtype == KVS_ABI_F32) || (v->dtype == KVS_F16 && o->dtype == KVS_ABI_F16) ||
           (v->dtype == KVS_BF16 && o->dtype == KVS_ABI_BF16);
}

/* Rows idx[h][b] of view v into o ([H][B][d], channel stride 1), same dtype. */
static void copy_rows(const kvs_view *v, const int32_t *idx, int H, int B, const kvs_abi_tensor *o,
                      const int64_t *s) {
    const size_t es = kvs_dtype_size(v->dtype), row = es * (size_t)v->head_dim;
    const unsigned char *src = v->data;
    unsigned char *dst = o->data;
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++)
            memcpy(dst + (h * s[0] + b * s[1]) * (int64_t)es,
                   src + ((int64_t)h * v->s_head + (int64_t)idx[(size_t)h * B + b] * v->s_tok) * (int64_t)es, row);
}

kvs_abi_status kvs_abi_apply(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer, const kvs_abi_tensor *k_out,
                             const kvs_abi_tensor *v_out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    kvs_status st = plan_check(c, p, 1, layer, err);
    if (st) return st;
    if ((st = plan_needs_cache(c, p, err))) return st;
    const kvs_layer *ly = &c->views[layer];
    if (p->plan.layers[layer].counts)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "layer %d: the layer's heads keep different counts (ragged plan of %s): apply head by "
                          "head with kvs_abi_apply_head",
                          (int)layer, p->method);
    const int H = p->plan.n_kv_heads, B = p->plan.layers[layer].budget, d = ly->k.head_dim;
    const int dev = ly->k.device == KVS_CUDA ? KVS_ABI_CUDA : KVS_ABI_HOST;
    const int dev_index = c->layers[layer].device_index;
    const int64_t dims[3] = {H, B, d};
    int64_t sk[3], sv[3];
    const unsigned allowed = dev == KVS_ABI_CUDA
                                 ? 1u << KVS_ABI_F32
                                 : (1u << KVS_ABI_F32) | (1u << KVS_ABI_F16) | (1u << KVS_ABI_BF16);
    char what[48];
    snprintf(what, sizeof what, "layer %d: k_out", (int)layer);
    if ((st = abi_check_out(k_out, what, allowed, dev, dev_index, 3, dims, sk, err))) return st;
    snprintf(what, sizeof what, "layer %d: v_out", (int)layer);
    if ((st = abi_check_out(v_out, what, allowed, dev, dev_index, 3, dims, sv, err))) return st;
    const double t0 = kvs_now_ms();
    const int plain = (p->plan.merge == KVS_MERGE_NONE || B == p->plan.n_tokens) && !p->plan.kchan;
    if (dev == KVS_ABI_HOST && plain && same_dtype(&ly->k, k_out) && same_dtype(&ly->v, v_out) &&
        (d == 1 || (sk[2] == 1 && sv[2] == 1))) {
        /* A plain gather into the input dtype: row copies, the bits
         * kvs_apply's fp32 round trip would give back anyway. */
        const int32_t *idx = p->plan.layers[layer].idx;
        copy_rows(&ly->k, idx, H, B, k_out, sk);
        copy_rows(&ly->v, idx, H, B, v_out, sv);
    } else if (dev == KVS_ABI_HOST) {
        /* One layer of the cache and of the plan: the same per-(layer, head)
         * units kvs_apply runs, into the context's reused fp32 scratch. */
        const kvs_cache_view one = {.n_layers = 1, .layers = (kvs_layer *)ly, .modality = NULL};
        kvs_plan sub = p->plan;
        sub.n_layers = 1;
        sub.layers = &p->plan.layers[layer];
        if (sub.kchan) sub.kchan += (size_t)layer * H * (size_t)sub.kchan_dim; /* key channel masks (ThinK) */
        if ((st = kvs_apply_into(&one, &sub, c->threads, &c->scratch, err))) {
            kvs_err_prefix(err, "layer %d", (int)layer);
            return st;
        }
        write_rows(c->scratch.layers[0].k, H, B, d, k_out, sk);
        write_rows(c->scratch.layers[0].v, H, B, d, v_out, sv);
    } else {
        if (p->plan.kchan)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "layer %d: plan of %s prunes key channels: not implemented on GPU", (int)layer,
                              p->plan.method);
#ifdef KVSIEVE_HAVE_CUDA
        kvs_shape shape;
        kvs_cache_view view;
        int device = 0, di = 0;
        const int prev = dev_current();
        st = cache_view(c, &view, &shape, &device, &di, err);
        if (!st) st = ensure_ws(c, &shape, dev_index, err);
        if (!st) st = kvs_gpu_apply_layer(c->ws, ly, &p->plan, layer, k_out->data, v_out->data, err);
        if (!st) st = kvs_gpu_sync(c->ws, err);
        dev_restore(prev);
        if (st) return st;
#else
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "CUDA cache, but libkvsieve was built without CUDA");
#endif
    }
    c->stats.apply_calls++;
    c->stats.apply_ms += kvs_now_ms() - t0;
    return KVS_ABI_OK;
}

kvs_abi_status kvs_abi_apply_head(kvs_abi_ctx *c, const kvs_abi_plan *p, int32_t layer, int32_t head,
                                  const kvs_abi_tensor *k_out, const kvs_abi_tensor *v_out) {
    CTX_ENTER(c);
    kvs_err *err = &c->err;
    kvs_status st = plan_check(c, p, 1, layer, err);
    if (st) return st;
    if ((st = plan_needs_cache(c, p, err))) return st;
    const kvs_layer *ly = &c->views[layer];
    if (head < 0 || head >= p->plan.n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "apply head: layer %d: head %d outside [0, %d)", (int)layer,
                          (int)head, p->plan.n_kv_heads);
    if (ly->k.device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "apply head: layer %d: CUDA cache; the per-head apply is host only", (int)layer);
    const int d = ly->k.head_dim;
    int B;
    int32_t *row = kvs_plan_head(&p->plan, layer, head, &B); /* [B] */
    const int64_t dims[2] = {B, d};
    int64_t sk2[2], sv2[2];
    const unsigned allowed = (1u << KVS_ABI_F32) | (1u << KVS_ABI_F16) | (1u << KVS_ABI_BF16);
    char what[64];
    snprintf(what, sizeof what, "layer %d: head %d: k_out", (int)layer, (int)head);
    if ((st = abi_check_out(k_out, what, allowed, KVS_ABI_HOST, 0, 2, dims, sk2, err))) return st;
    snprintf(what, sizeof what, "layer %d: head %d: v_out", (int)layer, (int)head);
    if ((st = abi_check_out(v_out, what, allowed, KVS_ABI_HOST, 0, 2, dims, sv2, err))) return st;
    const double t0 = kvs_now_ms();
    /* One head as a one-head cache and plan: kvs_apply's own unit (gather,
     * merge) on exactly the rows this head keeps. */
    const size_t es = kvs_dtype_size(ly->k.dtype);
    kvs_layer one = *ly;
    one.k.data = (const char *)ly->k.data + (size_t)head * (size_t)ly->k.s_head * es;
    one.v.data = (const char *)ly->v.data + (size_t)head * (size_t)ly->v.s_head * kvs_dtype_size(ly->v.dtype);
    one.k.n_heads = one.v.n_heads = 1;
    one.q = (kvs_view){0};
    const kvs_cache_view cv = {.n_layers = 1, .layers = &one, .modality = NULL};
    kvs_plan_layer pl = {.budget = B, .idx = row, .counts = NULL};
    kvs_plan sub = p->plan;
    sub.n_layers = 1;
    sub.n_kv_heads = 1;
    sub.layers = &pl;
    if (sub.kchan) /* this head's key channel mask (ThinK) */
        sub.kchan += ((size_t)layer * p->plan.n_kv_heads + head) * (size_t)sub.kchan_dim;
    if ((st = kvs_apply_into(&cv, &sub, 1, &c->scratch, err))) {
        kvs_err_prefix(err, "layer %d: head %d", (int)layer, (int)head);
        return st;
    }
    const int64_t sk[3] = {0, sk2[0], sk2[1]}, sv[3] = {0, sv2[0], sv2[1]};
    write_rows(c->scratch.layers[0].k, 1, B, d, k_out, sk);
    write_rows(c->scratch.layers[0].v, 1, B, d, v_out, sv);
    c->stats.apply_calls++;
    c->stats.apply_ms += kvs_now_ms() - t0;
    return KVS_ABI_OK;
}
