/*
 * dump.c -- cache dumps: a safetensors file laid out as in kvs_formats.h.
 *
 * What it is: kvs_dump_open maps a dump and checks it tensor by tensor
 * (names, dtypes, shapes that agree across layers and between k/v/q/probe,
 * modality and outlier lists), then builds a kvs_cache_view whose layers
 * point into the mapping and validates it with kvs_cache_validate (finite
 * values). kvs_dump_write converts a dense fp32 cache to F32/F16/BF16 and
 * writes it atomically (kvs_dump_write_extra also the optional W_o and
 * reconstruction statistic, checked and pointed at by the view like the rest).
 * Layers are discovered by scanning names: the highest layers.{l}.* present
 * fixes L, and every layer below it must have k and v.
 * What it is not: no compression, no scoring. A compressed cache (layers of
 * different lengths) can be written but kvs_dump_open rejects it (its layers
 * do not agree); read such files with kvs_st_open.
 */
#include "kvs_formats.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PART_K, PART_V, PART_Q, PART_PROBE, PART_WO, PART_RECON, N_PARTS };
static const char *const part_names[N_PARTS] = {"k", "v", "q", "probe", "wo", "recon"};

/* "[2,100,64]" */
static void fmt_shape(const kvs_st_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Parse "layers.<l>.<part>"; returns 1 and fills l, part; 0 if the name does
 * not start with "layers."; -1 if it does but is not a known form. */
static int parse_layer_name(const char *name, int *l, int *part) {
    if (strncmp(name, "layers.", 7) != 0) return 0;
    const char *p = name + 7;
    if (*p < '0' || *p > '9') return -1;
    if (*p == '0' && p[1] >= '0' && p[1] <= '9') return -1; /* no leading zeros */
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 100000) return -1;
        p++;
    }
    if (*p != '.') return -1;
    p++;
    for (int i = 0; i < N_PARTS; i++)
        if (strcmp(p, part_names[i]) == 0) {
            *l = (int)v;
            *part = i;
            return 1;
        }
    return -1;
}

static int is_float_dtype(kvs_dtype t) { return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16; }

void kvs_dump_close(kvs_dump *d) {
    if (!d) return;
    free(d->layers);
    free(d->probes);
    kvs_st_close(&d->file);
    memset(d, 0, sizeof *d);
}

kvs_status kvs_dump_open(const char *path, kvs_dump *d, kvs_err *err) {
    assert(path && d);
    memset(d, 0, sizeof *d);
    kvs_status st = kvs_st_open(path, &d->file, err);
    if (st) return st;
    const kvs_st_tensor **tab = NULL; /* [L][N_PARTS] */
    const kvs_st_tensor *mod = NULL, *outl = NULL;
    char s1[128], s2[128];
    int L = 0;
    const kvs_st_file *f = &d->file;

    for (int i = 0; i < f->n_tensors; i++) {
        int l, part, r = parse_layer_name(f->tensors[i].name, &l, &part);
        if (r < 0) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: tensor '%s' is not layers.{l}.k|v|q|probe|wo|recon", path, f->tensors[i].name);
            goto cleanup;
        }
        if (r == 1 && l + 1 > L) L = l + 1;
        if (r == 0 && strcmp(f->tensors[i].name, "modality") != 0 &&
            strcmp(f->tensors[i].name, "outliers") != 0) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: unexpected tensor '%s' (a dump holds layers.{l}.k|v|q|probe|wo|recon, "
                            "modality, outliers)",
                            path, f->tensors[i].name);
            goto cleanup;
        }
    }
    if (L == 0) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: no layers.{l}.k tensors: not a cache dump", path);
        goto cleanup;
    }
    tab = calloc((size_t)L * N_PARTS, sizeof *tab);
    d->layers = calloc((size_t)L, sizeof *d->layers);
    d->probes = calloc((size_t)L, sizeof *d->probes);
    if (!tab || !d->layers || !d->probes) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for %d layers", path, L);
        goto cleanup;
    }
    for (int i = 0; i < f->n_tensors; i++) {
        int l, part;
        if (parse_layer_name(f->tensors[i].name, &l, &part) == 1) tab[l * N_PARTS + part] = &f->tensors[i];
        else if (strcmp(f->tensors[i].name, "modality") == 0) mod = &f->tensors[i];
        else if (strcmp(f->tensors[i].name, "outliers") == 0) outl = &f->tensors[i];
    }
    for (int l = 0; l < L; l++)
        for (int part = PART_K; part <= PART_V; part++)
            if (!tab[l * N_PARTS + part]) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: missing layers.%d.%s (layers 0..%d expected from layers.0..%d present)",
                                path, l, part_names[part], L - 1, L - 1);
                goto cleanup;
            }
    /* Per-part checks: dtype, rank, and agreement with layer 0 / with k. */
    const kvs_st_tensor *k0 = tab[PART_K];
    /* optional parts: present in layer 0 means present in every layer */
    int has[N_PARTS];
    for (int part = 0; part < N_PARTS; part++) has[part] = part <= PART_V || tab[part] != NULL;
    int has_q = has[PART_Q], has_p = has[PART_PROBE];
    for (int l = 0; l < L; l++) {
        for (int part = 0; part < N_PARTS; part++) {
            const kvs_st_tensor *t = tab[l * N_PARTS + part];
            int want = has[part];
            if (!t && want) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: missing layers.%d.%s (layers.0.%s is present, so every layer needs one)",
                                path, l, part_names[part], part_names[part]);
                goto cleanup;
            }
            if (!t) continue;
            if (t && !want) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: layers.%d.%s is present but layers.0.%s is not", path, l,
                                part_names[part], part_names[part]);
                goto cleanup;
            }
            if (part == PART_RECON ? t->dtype != KVS_F32 : !is_float_dtype(t->dtype)) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has dtype %s (%s expected)", path, t->name,
                                kvs_dtype_name(t->dtype), part == PART_RECON ? "F32" : "F32, F16 or BF16");
                goto cleanup;
            }
            const int rank = part == PART_RECON ? 2 : 3;
            if (t->ndim != rank) {
                fmt_shape(t, s1, sizeof s1);
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s (%s expected)", path, t->name, s1,
                                part == PART_RECON ? "2 dims [Hkv, N]"
                                : part == PART_WO  ? "3 dims [Hq, E, d]"
                                                   : "3 dims [H, N, d]");
                goto cleanup;
            }
            for (int k = 0; k < rank; k++)
                if (t->shape[k] > (int64_t)0x7fffffff) {
                    fmt_shape(t, s1, sizeof s1);
                    st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s: too large", path,
                                    t->name, s1);
                    goto cleanup;
                }
        }
        const kvs_st_tensor *k = tab[l * N_PARTS + PART_K], *v = tab[l * N_PARTS + PART_V];
        const kvs_st_tensor *q = tab[l * N_PARTS + PART_Q], *pr = tab[l * N_PARTS + PART_PROBE];
        const kvs_st_tensor *q0 = tab[PART_Q], *p0 = tab[PART_PROBE];
        if (memcmp(v->shape, k->shape, 3 * sizeof(int64_t)) != 0) {
            fmt_shape(v, s1, sizeof s1);
            fmt_shape(k, s2, sizeof s2);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s but %s has %s", path, v->name, s1,
                            k->name, s2);
            goto cleanup;
        }
        if (l > 0 && memcmp(k->shape, k0->shape, 3 * sizeof(int64_t)) != 0) {
            fmt_shape(k, s1, sizeof s1);
            fmt_shape(k0, s2, sizeof s2);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s but %s has %s", path, k->name, s1,
                            k0->name, s2);
            goto cleanup;
        }
        if (k->shape[0] < 1 || k->shape[1] < 1 || k->shape[2] < 1) {
            fmt_shape(k, s1, sizeof s1);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s: every dim must be >= 1", path,
                            k->name, s1);
            goto cleanup;
        }
        if (q) {
            if (q->shape[2] != k->shape[2] || q->shape[1] > k->shape[1] || q->shape[0] < 1 ||
                q->shape[0] % k->shape[0] != 0 || (l > 0 && memcmp(q->shape, q0->shape, 3 * sizeof(int64_t)))) {
                fmt_shape(q, s1, sizeof s1);
                fmt_shape(k, s2, sizeof s2);
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: %s has shape %s but %s has %s (q must be [Hq, Nq, d] with Hq a multiple of Hkv, Nq <= N, equal in every layer)",
                                path, q->name, s1, k->name, s2);
                goto cleanup;
            }
        }
        if (pr) {
            int bad = pr->shape[2] != k->shape[2] || pr->shape[0] < 1 || pr->shape[0] % k->shape[0] != 0 ||
                      (q && pr->shape[0] != q->shape[0]) ||
                      (l > 0 && memcmp(pr->shape, p0->shape, 3 * sizeof(int64_t)));
            if (bad) {
                fmt_shape(pr, s1, sizeof s1);
                fmt_shape(q ? q : k, s2, sizeof s2);
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: %s has shape %s but %s has %s (probe must be [Hq, P, d], equal in every layer)",
                                path, pr->name, s1, q ? q->name : k->name, s2);
                goto cleanup;
            }
        }
        const kvs_st_tensor *wo = tab[l * N_PARTS + PART_WO], *wo0 = tab[PART_WO];
        if (wo) {
            const kvs_st_tensor *qh = q ? q : pr; /* the query heads W_o must match, if any */
            int bad = wo->shape[2] != k->shape[2] || wo->shape[0] < 1 || wo->shape[1] < 1 ||
                      wo->shape[0] % k->shape[0] != 0 || (qh && wo->shape[0] != qh->shape[0]) ||
                      (l > 0 && memcmp(wo->shape, wo0->shape, 3 * sizeof(int64_t)));
            if (bad) {
                /* name the tensor it disagrees with */
                const kvs_st_tensor *o = wo0;
                if (wo->shape[0] < 1 || wo->shape[1] < 1 || wo->shape[2] != k->shape[2] ||
                    wo->shape[0] % k->shape[0] != 0)
                    o = k;
                else if (qh && wo->shape[0] != qh->shape[0])
                    o = qh;
                fmt_shape(wo, s1, sizeof s1);
                fmt_shape(o, s2, sizeof s2);
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: %s has shape %s but %s has %s (wo must be [Hq, E, d]: Hq a multiple of Hkv "
                                "and equal to q's, E >= 1 and equal in every layer, d of k)",
                                path, wo->name, s1, o->name, s2);
                goto cleanup;
            }
        }
        const kvs_st_tensor *rc = tab[l * N_PARTS + PART_RECON];
        if (rc && (rc->shape[0] != k->shape[0] || rc->shape[1] != k->shape[1])) {
            fmt_shape(rc, s1, sizeof s1);
            fmt_shape(k, s2, sizeof s2);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s has shape %s but %s has %s (recon must be [Hkv, N])",
                            path, rc->name, s1, k->name, s2);
            goto cleanup;
        }
        if (rc) { /* a probability per (head, token): finite and in [0, 1] */
            const float *r = rc->data;
            const int64_t n = rc->shape[1];
            for (int64_t x = 0; x < rc->shape[0] * n; x++)
                if (!(r[x] >= 0.0f && r[x] <= 1.0f)) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "%s: %s head %lld token %lld is %g, not a probability in [0, 1]", path,
                                    rc->name, (long long)(x / n), (long long)(x % n), (double)r[x]);
                    goto cleanup;
                }
        }
    }
    int N = (int)k0->shape[1];
    if (mod) {
        if (mod->dtype != KVS_U8 || mod->ndim != 1 || mod->shape[0] != N) {
            fmt_shape(mod, s1, sizeof s1);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: modality is %s %s but must be U8 [%d] (N of %s)",
                            path, kvs_dtype_name(mod->dtype), s1, N, k0->name);
            goto cleanup;
        }
        const uint8_t *m = mod->data;
        for (int n = 0; n < N; n++)
            if (m[n] > KVS_MOD_AUDIO) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: modality[%d] = %d is not a modality (0 text, 1 image, 2 video, 3 audio)",
                                path, n, m[n]);
                goto cleanup;
            }
    }
    if (outl) {
        if (outl->dtype != KVS_I32 || outl->ndim != 1) {
            fmt_shape(outl, s1, sizeof s1);
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: outliers is %s %s but must be I32 [M]", path,
                            kvs_dtype_name(outl->dtype), s1);
            goto cleanup;
        }
        const int32_t *o = outl->data;
        for (int64_t i = 0; i < outl->shape[0]; i++) {
            if (o[i] < 0 || o[i] >= N) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: outliers[%lld] = %d out of range [0, %d)", path,
                                (long long)i, o[i], N);
                goto cleanup;
            }
            if (i > 0 && o[i] <= o[i - 1]) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: outliers[%lld] = %d: list must be sorted ascending and unique", path,
                                (long long)i, o[i]);
                goto cleanup;
            }
        }
        d->outliers = outl->shape[0] ? o : NULL;
        d->n_outliers = (int)outl->shape[0];
    }
    for (int l = 0; l < L; l++) {
        const kvs_st_tensor *k = tab[l * N_PARTS + PART_K], *v = tab[l * N_PARTS + PART_V];
        const kvs_st_tensor *q = tab[l * N_PARTS + PART_Q], *pr = tab[l * N_PARTS + PART_PROBE];
        kvs_layer *ly = &d->layers[l];
        ly->k = kvs_view_make(k->data, k->dtype, (int)k->shape[0], (int)k->shape[1], (int)k->shape[2]);
        ly->v = kvs_view_make(v->data, v->dtype, (int)v->shape[0], (int)v->shape[1], (int)v->shape[2]);
        if (q)
            ly->q = kvs_view_make(q->data, q->dtype, (int)q->shape[0], (int)q->shape[1], (int)q->shape[2]);
        else
            ly->q = kvs_view_make(NULL, KVS_F32, 0, 0, (int)k->shape[2]);
        if (pr) {
            d->probes[l] =
                kvs_view_make(pr->data, pr->dtype, (int)pr->shape[0], (int)pr->shape[1], (int)pr->shape[2]);
            st = kvs_view_check_finite(&d->probes[l], pr->name, err);
            if (st) {
                kvs_err_prefix(err, "%s", path);
                goto cleanup;
            }
        } else
            d->probes[l] = kvs_view_make(NULL, KVS_F32, 0, 0, (int)k->shape[2]);
        const kvs_st_tensor *wo = tab[l * N_PARTS + PART_WO], *rc = tab[l * N_PARTS + PART_RECON];
        if (wo) {
            ly->wo = kvs_view_make(wo->data, wo->dtype, (int)wo->shape[0], (int)wo->shape[1], (int)wo->shape[2]);
            st = kvs_view_check_finite(&ly->wo, wo->name, err);
            if (st) {
                kvs_err_prefix(err, "%s", path);
                goto cleanup;
            }
        }
        ly->attn_recon_max = rc ? (const float *)rc->data : NULL;
    }
    d->view.n_layers = L;
    d->view.layers = d->layers;
    d->view.modality = mod ? (const uint8_t *)mod->data : NULL;
    st = kvs_cache_validate(&d->view, &d->shape, err);
    if (st) {
        kvs_err_prefix(err, "%s", path);
        goto cleanup;
    }
    if (!has_q && d->shape.n_q_heads == 0 && has_p) d->shape.n_q_heads = (int)tab[PART_PROBE]->shape[0];
    d->shape.threads = 1;

cleanup:
    free(tab);
    if (st) kvs_dump_close(d);
    return st;
}

/* fp32 [count] -> dtype into a new buffer (or the source itself for F32). */
static kvs_status convert(const float *src, size_t count, kvs_dtype t, void **owned, const void **out) {
    *owned = NULL;
    if (t == KVS_F32) {
        *out = src;
        return KVS_OK;
    }
    uint16_t *dst = malloc(count ? count * 2 : 1);
    if (!dst) return KVS_ERR_NOMEM;
    for (size_t i = 0; i < count; i++) dst[i] = t == KVS_F16 ? kvs_f32_to_f16(src[i]) : kvs_f32_to_bf16(src[i]);
    *owned = dst;
    *out = dst;
    return KVS_OK;
}

kvs_status kvs_dump_write(const char *path, const kvs_dense_cache *c, kvs_dtype dtype,
                          const float *const *probes, int n_probes, int n_q_heads,
                          const int32_t *outliers, int n_outliers, const char *const *meta_kv,
                          kvs_err *err) {
    return kvs_dump_write_extra(path, c, dtype, probes, n_probes, n_q_heads, outliers, n_outliers, NULL,
                                meta_kv, err);
}

/* The extras' own checks: sizes, one array per layer, recon in [0, 1]. */
static kvs_status check_extra(const char *path, const kvs_dense_cache *c, const kvs_dump_extra *x,
                              kvs_err *err) {
    if (x->wo && (x->wo_heads < 1 || x->wo_rows < 1))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: W_o given with Hq %d, E %d", path, x->wo_heads,
                          x->wo_rows);
    for (int l = 0; l < c->n_layers; l++) {
        const kvs_dense_layer *ly = &c->layers[l];
        if (x->wo && !x->wo[l])
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: wo[%d] is NULL", path, l, l);
        if (x->wo && ly->n_kv_heads >= 1 && x->wo_heads % ly->n_kv_heads != 0)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: W_o Hq %d is not a multiple of Hkv %d", path,
                              l, x->wo_heads, ly->n_kv_heads);
        if (!x->recon) continue;
        if (!x->recon[l]) return kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: recon[%d] is NULL", path, l, l);
        const int64_t n = ly->n_tokens;
        for (int64_t i = 0; i < (int64_t)ly->n_kv_heads * n; i++)
            if (!(x->recon[l][i] >= 0.0f && x->recon[l][i] <= 1.0f))
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: layer %d: recon head %lld token %lld is %g, not a probability in [0, 1]",
                                  path, l, (long long)(i / n), (long long)(i % n), (double)x->recon[l][i]);
    }
    return KVS_OK;
}

kvs_status kvs_dump_write_extra(const char *path, const kvs_dense_cache *c, kvs_dtype dtype,
                                const float *const *probes, int n_probes, int n_q_heads,
                                const int32_t *outliers, int n_outliers, const kvs_dump_extra *extra,
                                const char *const *meta_kv, kvs_err *err) {
    assert(path && c);
    const kvs_dump_extra none = {0};
    const kvs_dump_extra *ex = extra ? extra : &none;
    if (dtype != KVS_F32 && dtype != KVS_F16 && dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: dump dtype must be F32, F16 or BF16, not %s", path,
                          kvs_dtype_name(dtype));
    int L = c->n_layers;
    if (L < 1 || !c->layers) return kvs_errorf(err, KVS_ERR_INVALID, "%s: cache has no layers", path);
    if (probes && (n_probes < 1 || n_q_heads < 1))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: probes given with n_probes %d, n_q_heads %d", path,
                          n_probes, n_q_heads);
    if (n_outliers < 0 || (n_outliers > 0 && !outliers))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: bad outlier list (%d entries)", path, n_outliers);
    kvs_status st = check_extra(path, c, ex, err);
    if (st) return st;
    int maxt = N_PARTS * L + 2;
    kvs_st_tensor *t = calloc((size_t)maxt, sizeof *t);
    void **owned = calloc((size_t)maxt, sizeof *owned);
    char *names = calloc((size_t)maxt, 32);
    int n = 0;
    if (!t || !owned || !names) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    for (int l = 0; l < L; l++) {
        const kvs_dense_layer *ly = &c->layers[l];
        if (ly->n_kv_heads < 1 || ly->n_tokens < 1 || ly->head_dim < 1 || !ly->k || !ly->v) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d is empty (Hkv %d, N %d, d %d)", path, l,
                            ly->n_kv_heads, ly->n_tokens, ly->head_dim);
            goto cleanup;
        }
        if (ly->counts) { /* [Hkv, B_l, d] cannot hold heads of different lengths */
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "%s: layer %d has ragged per-head counts; the dump format is [Hkv, B, d] only",
                            path, l);
            goto cleanup;
        }
        size_t kv = (size_t)ly->n_kv_heads * (size_t)ly->n_tokens * (size_t)ly->head_dim;
        const float *srcs[N_PARTS] = {ly->k, ly->v, ly->q, probes ? probes[l] : NULL,
                                      ex->wo ? ex->wo[l] : NULL, ex->recon ? ex->recon[l] : NULL};
        int64_t shp[N_PARTS][3] = {{ly->n_kv_heads, ly->n_tokens, ly->head_dim},
                                   {ly->n_kv_heads, ly->n_tokens, ly->head_dim},
                                   {ly->n_q_heads, ly->n_queries, ly->head_dim},
                                   {n_q_heads, n_probes, ly->head_dim},
                                   {ex->wo_heads, ex->wo_rows, ly->head_dim},
                                   {ly->n_kv_heads, ly->n_tokens, 0}};
        size_t cnt[N_PARTS] = {kv, kv, (size_t)ly->n_q_heads * (size_t)ly->n_queries * (size_t)ly->head_dim,
                               (size_t)n_q_heads * (size_t)n_probes * (size_t)ly->head_dim,
                               (size_t)ex->wo_heads * (size_t)ex->wo_rows * (size_t)ly->head_dim,
                               (size_t)ly->n_kv_heads * (size_t)ly->n_tokens};
        for (int part = 0; part < N_PARTS; part++) {
            if (part == PART_Q && (!ly->q || ly->n_queries < 1)) continue;
            if (part == PART_PROBE && !probes) continue;
            if (part == PART_WO && !ex->wo) continue;
            if (part == PART_RECON && !ex->recon) continue;
            if (!srcs[part]) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "%s: layer %d: probes[%d] is NULL", path, l, l);
                goto cleanup;
            }
            kvs_st_tensor *x = &t[n];
            x->name = names + 32 * n;
            snprintf(x->name, 32, "layers.%d.%s", l, part_names[part]);
            /* Probes stay fp32: they are few and fidelity scoring wants them exact;
             * recon is a probability list the format keeps F32. */
            x->dtype = part == PART_PROBE || part == PART_RECON ? KVS_F32 : dtype;
            x->ndim = part == PART_RECON ? 2 : 3;
            memcpy(x->shape, shp[part], sizeof shp[part]);
            x->nbytes = cnt[part] * kvs_dtype_size(x->dtype);
            if (convert(srcs[part], cnt[part], x->dtype, &owned[n], &x->data)) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory converting %s", path, x->name);
                goto cleanup;
            }
            n++;
        }
    }
    if (c->modality && c->n_tokens > 0) {
        kvs_st_tensor *x = &t[n];
        x->name = names + 32 * n;
        snprintf(x->name, 32, "modality");
        x->dtype = KVS_U8;
        x->ndim = 1;
        x->shape[0] = c->n_tokens;
        x->nbytes = (size_t)c->n_tokens;
        x->data = c->modality;
        n++;
    }
    if (outliers) {
        kvs_st_tensor *x = &t[n];
        x->name = names + 32 * n;
        snprintf(x->name, 32, "outliers");
        x->dtype = KVS_I32;
        x->ndim = 1;
        x->shape[0] = n_outliers;
        x->nbytes = (size_t)n_outliers * 4;
        x->data = outliers;
        n++;
    }
    assert(n <= maxt);
    st = kvs_st_write(path, t, n, meta_kv, err);

cleanup:
    if (owned)
        for (int i = 0; i < maxt; i++) free(owned[i]);
    free(owned);
    free(t);
    free(names);
    return st;
}
