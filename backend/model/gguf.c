/*
 * gguf.c -- GGUF v2/v3 reader (mmap, bounds-checked) and a small writer.
 *
 * What it is: parsing of the header, the metadata key/value pairs (all value
 * types, arrays included), the tensor infos and the aligned data section;
 * every read is bounds-checked so truncated or corrupt files give an error
 * naming the field. The writer serialises metadata and tensors (version 3,
 * alignment 32) for tests and tools.
 * What it is not: no interpretation of the metadata (model.c, tokenizer.c)
 * and no tensor arithmetic (quant.c).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_backend.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */

typedef struct {
    const uint8_t *p;
    size_t size, off;
    const char *what;
    kvs_err *err;
} rd;

static int rd_need(rd *r, size_t n, const char *field) {
    if (n > r->size - r->off) {
        kvs_errorf(r->err, KVS_ERR_FORMAT,
                   "%s: truncated: %s needs %zu bytes at offset %zu but the file has %zu", r->what,
                   field, n, r->off, r->size);
        return 0;
    }
    return 1;
}

static int rd_u32(rd *r, uint32_t *v, const char *field) {
    if (!rd_need(r, 4, field)) return 0;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return 1;
}

static int rd_u64(rd *r, uint64_t *v, const char *field) {
    if (!rd_need(r, 8, field)) return 0;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return 1;
}

static int rd_str(rd *r, kvs_gguf_str *s, const char *field) {
    uint64_t n;
    if (!rd_u64(r, &n, field)) return 0;
    if (n > r->size - r->off) {
        kvs_errorf(r->err, KVS_ERR_FORMAT,
                   "%s: truncated or corrupt: %s has length %llu but only %zu bytes remain at offset %zu",
                   r->what, field, (unsigned long long)n, r->size - r->off, r->off);
        return 0;
    }
    s->s = (const char *)(r->p + r->off);
    s->len = n;
    r->off += (size_t)n;
    return 1;
}

static size_t vtype_size(int t) {
    switch (t) {
    case KVS_GGUF_U8: case KVS_GGUF_I8: case KVS_GGUF_BOOL: return 1;
    case KVS_GGUF_U16: case KVS_GGUF_I16: return 2;
    case KVS_GGUF_U32: case KVS_GGUF_I32: case KVS_GGUF_F32: return 4;
    case KVS_GGUF_U64: case KVS_GGUF_I64: case KVS_GGUF_F64: return 8;
    default: return 0;
    }
}

static void decode_scalar(int t, const uint8_t *p, kvs_gguf_kv *kv) {
    switch (t) {
    case KVS_GGUF_U8: case KVS_GGUF_BOOL: kv->v.u64 = p[0]; kv->v.i64 = p[0]; kv->v.f64 = p[0]; break;
    case KVS_GGUF_I8: { int8_t x; memcpy(&x, p, 1); kv->v.i64 = x; kv->v.f64 = x; break; }
    case KVS_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; kv->v.i64 = x; kv->v.f64 = x; break; }
    case KVS_GGUF_I16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; kv->v.f64 = x; break; }
    case KVS_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; kv->v.i64 = x; kv->v.f64 = x; break; }
    case KVS_GGUF_I32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; kv->v.f64 = x; break; }
    case KVS_GGUF_F32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case KVS_GGUF_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u64 = x; kv->v.i64 = (int64_t)x; kv->v.f64 = (double)x; break; }
    case KVS_GGUF_I64: { int64_t x; memcpy(&x, p, 8); kv->v.i64 = x; kv->v.f64 = (double)x; break; }
    case KVS_GGUF_F64: { double x; memcpy(&x, p, 8); kv->v.f64 = x; break; }
    default: assert(0);
    }
}

void kvs_gguf_close(kvs_gguf *g) {
    if (!g) return;
    if (g->kv) {
        for (uint64_t i = 0; i < g->n_kv; i++) free((void *)g->kv[i].arr_strs);
        free(g->kv);
    }
    free(g->tensors);
    if (g->owns_map && g->map) munmap((void *)g->map, g->map_size);
    memset(g, 0, sizeof *g);
}

static int str_eq(kvs_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.s, c, n) == 0;
}

kvs_status kvs_gguf_parse(const void *data, size_t size, const char *what, kvs_gguf *g,
                          kvs_err *err) {
    memset(g, 0, sizeof *g);
    rd r = {(const uint8_t *)data, size, 0, what, err};
    char field[200];
    uint32_t magic;
    if (!rd_u32(&r, &magic, "magic")) return KVS_ERR_FORMAT;
    if (magic != GGUF_MAGIC)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: not a GGUF file (magic 0x%08x, expected \"GGUF\")",
                          what, magic);
    if (!rd_u32(&r, &g->version, "version")) return KVS_ERR_FORMAT;
    if (g->version != 2 && g->version != 3)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)",
                          what, g->version);
    if (!rd_u64(&r, &g->n_tensors, "tensor count") || !rd_u64(&r, &g->n_kv, "metadata count"))
        return KVS_ERR_FORMAT;
    /* every kv needs >= 12 bytes, every tensor info >= 24: reject absurd counts early */
    if (g->n_kv > size / 12 || g->n_tensors > size / 24) {
        kvs_status st = kvs_errorf(err, KVS_ERR_FORMAT,
                                   "%s: corrupt header: %llu metadata pairs and %llu tensors cannot fit in %zu bytes",
                                   what, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, size);
        g->n_kv = g->n_tensors = 0;
        return st;
    }
    kvs_status st = KVS_OK;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for %llu metadata pairs", what,
                        (unsigned long long)g->n_kv);
        goto cleanup;
    }
    g->alignment = 32;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kvs_gguf_kv *kv = &g->kv[i];
        snprintf(field, sizeof field, "key of metadata pair %llu", (unsigned long long)i);
        if (!rd_str(&r, &kv->key, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        int klen = kv->key.len > 120 ? 120 : (int)kv->key.len;
        uint32_t t;
        snprintf(field, sizeof field, "type of metadata '%.*s'", klen, kv->key.s);
        if (!rd_u32(&r, &t, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        kv->type = (int)t;
        snprintf(field, sizeof field, "value of metadata '%.*s'", klen, kv->key.s);
        if (t == KVS_GGUF_STRING) {
            if (!rd_str(&r, &kv->str, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        } else if (t == KVS_GGUF_ARRAY) {
            uint32_t at;
            uint64_t an;
            if (!rd_u32(&r, &at, field) || !rd_u64(&r, &an, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
            kv->arr_type = (int)at;
            kv->arr_n = an;
            kv->arr_data = r.p + r.off;
            if (at == KVS_GGUF_STRING) {
                if (an > (r.size - r.off) / 8) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "%s: truncated or corrupt: metadata '%.*s' claims %llu strings", what,
                                    klen, kv->key.s, (unsigned long long)an);
                    goto cleanup;
                }
                kvs_gguf_str *ss = malloc((an ? an : 1) * sizeof *ss);
                if (!ss) { st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", what); goto cleanup; }
                kv->arr_strs = ss;
                for (uint64_t j = 0; j < an; j++) {
                    snprintf(field, sizeof field, "string %llu of metadata '%.*s'",
                             (unsigned long long)j, klen, kv->key.s);
                    if (!rd_str(&r, &ss[j], field)) { st = KVS_ERR_FORMAT; goto cleanup; }
                }
            } else {
                size_t es = vtype_size((int)at);
                if (!es) {
                    st = kvs_errorf(err, at == KVS_GGUF_ARRAY ? KVS_ERR_UNSUPPORTED : KVS_ERR_FORMAT,
                                    "%s: metadata '%.*s': %s array element type %u", what, klen,
                                    kv->key.s, at == KVS_GGUF_ARRAY ? "nested arrays (element type" : "invalid",
                                    at);
                    goto cleanup;
                }
                if (an > (r.size - r.off) / es) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "%s: truncated: metadata '%.*s' array of %llu elements runs past the end of the file",
                                    what, klen, kv->key.s, (unsigned long long)an);
                    goto cleanup;
                }
                r.off += (size_t)(an * es);
            }
        } else {
            size_t es = vtype_size((int)t);
            if (!es) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: metadata '%.*s' has invalid value type %u", what,
                                klen, kv->key.s, t);
                goto cleanup;
            }
            if (!rd_need(&r, es, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
            decode_scalar((int)t, r.p + r.off, kv);
            r.off += es;
        }
        if (str_eq(kv->key, "general.alignment")) {
            if (t != KVS_GGUF_U32 || kv->v.i64 == 0 || (kv->v.i64 & (kv->v.i64 - 1))) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "%s: general.alignment must be a u32 power of two", what);
                goto cleanup;
            }
            g->alignment = (uint32_t)kv->v.i64;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvs_gguf_tensor *t = &g->tensors[i];
        snprintf(field, sizeof field, "name of tensor %llu", (unsigned long long)i);
        if (!rd_str(&r, &t->name, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        int nl = t->name.len > 120 ? 120 : (int)t->name.len;
        uint32_t nd, ty;
        snprintf(field, sizeof field, "info of tensor '%.*s'", nl, t->name.s);
        if (!rd_u32(&r, &nd, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        if (nd < 1 || nd > KVS_GGUF_MAX_DIMS) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%.*s' has %u dimensions (1..%d allowed)", what,
                            nl, t->name.s, nd, KVS_GGUF_MAX_DIMS);
            goto cleanup;
        }
        t->n_dims = (int)nd;
        uint64_t nel = 1;
        for (int d = 0; d < KVS_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            if (!rd_u64(&r, &ne, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
            if (ne == 0 || ne > ((uint64_t)1 << 40) || nel > ((uint64_t)1 << 50) / ne) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%.*s' dimension %u is %llu (corrupt)", what,
                                nl, t->name.s, d, (unsigned long long)ne);
                goto cleanup;
            }
            t->ne[d] = (int64_t)ne;
            nel *= ne;
        }
        if (!rd_u32(&r, &ty, field) || !rd_u64(&r, &t->offset, field)) { st = KVS_ERR_FORMAT; goto cleanup; }
        t->type = (int)ty;
        if (!kvs_ggml_blck_size((int)ty)) {
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED, "%s: tensor '%.*s' has unknown type %u", what, nl,
                            t->name.s, ty);
            goto cleanup;
        }
        if (t->ne[0] % kvs_ggml_blck_size((int)ty)) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: tensor '%.*s': row length %lld is not a multiple of the %s block size %d",
                            what, nl, t->name.s, (long long)t->ne[0], kvs_ggml_type_name((int)ty),
                            kvs_ggml_blck_size((int)ty));
            goto cleanup;
        }
        t->nbytes = kvs_ggml_row_size((int)ty, t->ne[0]) * (size_t)(nel / (uint64_t)t->ne[0]);
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == t->name.len &&
                !memcmp(g->tensors[j].name.s, t->name.s, t->name.len)) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor name '%.*s' appears twice", what, nl,
                                t->name.s);
                goto cleanup;
            }
    }
    size_t data_off = (r.off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && data_off > size) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: truncated: the data section would start at %zu past the end (%zu)",
                        what, data_off, size);
        goto cleanup;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvs_gguf_tensor *t = &g->tensors[i];
        int nl = t->name.len > 120 ? 120 : (int)t->name.len;
        if (t->offset % g->alignment) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%.*s' offset %llu is not aligned to %u", what, nl,
                            t->name.s, (unsigned long long)t->offset, g->alignment);
            goto cleanup;
        }
        if (t->offset > size - data_off || t->nbytes > size - data_off - t->offset) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: truncated: tensor '%.*s' (%zu bytes at data offset %llu) runs past the end of the file (%zu bytes)",
                            what, nl, t->name.s, t->nbytes, (unsigned long long)t->offset, size);
            goto cleanup;
        }
        t->data = r.p + data_off + t->offset;
    }
    g->map = data;
    g->map_size = size;
    return KVS_OK;
cleanup:
    kvs_gguf_close(g);
    return st;
}

kvs_status kvs_gguf_open(const char *path, kvs_gguf *g, kvs_err *err) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kvs_errorf(err, KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kvs_errorf(err, KVS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (sb.st_size < 24) {
        close(fd);
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: truncated: %lld bytes is too short for a GGUF header",
                          path, (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return kvs_errorf(err, KVS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    kvs_status st = kvs_gguf_parse(map, (size_t)sb.st_size, path, g, err);
    if (st != KVS_OK) {
        munmap(map, (size_t)sb.st_size);
        return st;
    }
    g->owns_map = 1;
    return KVS_OK;
}

const kvs_gguf_kv *kvs_gguf_find_kv(const kvs_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const kvs_gguf_tensor *kvs_gguf_find_tensor(const kvs_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_int_type(int t) {
    return t == KVS_GGUF_U8 || t == KVS_GGUF_I8 || t == KVS_GGUF_U16 || t == KVS_GGUF_I16 ||
           t == KVS_GGUF_U32 || t == KVS_GGUF_I32 || t == KVS_GGUF_U64 || t == KVS_GGUF_I64 ||
           t == KVS_GGUF_BOOL;
}

kvs_status kvs_gguf_get_i64(const kvs_gguf *g, const char *key, int64_t *out, kvs_err *err) {
    const kvs_gguf_kv *kv = kvs_gguf_find_kv(g, key);
    if (!kv) return kvs_errorf(err, KVS_ERR_NOTFOUND, "metadata key '%s' is missing", key);
    if (!is_int_type(kv->type))
        return kvs_errorf(err, KVS_ERR_FORMAT, "metadata key '%s' has type %d, expected an integer", key,
                          kv->type);
    if (kv->type == KVS_GGUF_U64 && kv->v.u64 > (uint64_t)INT64_MAX)
        return kvs_errorf(err, KVS_ERR_FORMAT, "metadata key '%s' is out of range", key);
    *out = kv->v.i64;
    return KVS_OK;
}

kvs_status kvs_gguf_get_f64(const kvs_gguf *g, const char *key, double *out, kvs_err *err) {
    const kvs_gguf_kv *kv = kvs_gguf_find_kv(g, key);
    if (!kv) return kvs_errorf(err, KVS_ERR_NOTFOUND, "metadata key '%s' is missing", key);
    if (kv->type != KVS_GGUF_F32 && kv->type != KVS_GGUF_F64 && !is_int_type(kv->type))
        return kvs_errorf(err, KVS_ERR_FORMAT, "metadata key '%s' has type %d, expected a number", key,
                          kv->type);
    *out = kv->v.f64;
    return KVS_OK;
}

kvs_status kvs_gguf_get_str(const kvs_gguf *g, const char *key, char *buf, size_t n, kvs_err *err) {
    const kvs_gguf_kv *kv = kvs_gguf_find_kv(g, key);
    if (!kv) return kvs_errorf(err, KVS_ERR_NOTFOUND, "metadata key '%s' is missing", key);
    if (kv->type != KVS_GGUF_STRING)
        return kvs_errorf(err, KVS_ERR_FORMAT, "metadata key '%s' has type %d, expected a string", key,
                          kv->type);
    if (kv->str.len + 1 > n)
        return kvs_errorf(err, KVS_ERR_FORMAT, "metadata key '%s' is too long (%llu bytes)", key,
                          (unsigned long long)kv->str.len);
    memcpy(buf, kv->str.s, kv->str.len);
    buf[kv->str.len] = 0;
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} wbuf;

typedef struct {
    char *name;
    int type, n_dims;
    int64_t ne[KVS_GGUF_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct kvs_gguf_writer {
    wbuf kv;      /* serialised metadata pairs */
    uint64_t n_kv;
    wtensor *t;   /* [n_t] */
    int n_t, cap_t;
};

static int wb_put(wbuf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) return 0;
        b->p = q;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return 1;
}

static int wb_u32(wbuf *b, uint32_t v) { return wb_put(b, &v, 4); }
static int wb_u64(wbuf *b, uint64_t v) { return wb_put(b, &v, 8); }
static int wb_str(wbuf *b, const char *s) {
    uint64_t n = strlen(s);
    return wb_u64(b, n) && wb_put(b, s, n);
}

kvs_status kvs_gguf_writer_new(kvs_gguf_writer **out, kvs_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    return KVS_OK;
}

void kvs_gguf_writer_free(kvs_gguf_writer *w) {
    if (!w) return;
    free(w->kv.p);
    for (int i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}

static kvs_status w_head(kvs_gguf_writer *w, const char *key, uint32_t type, kvs_err *err) {
    if (!wb_str(&w->kv, key) || !wb_u32(&w->kv, type))
        return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory at key '%s'", key);
    w->n_kv++;
    return KVS_OK;
}

#define W_SCALAR(fn, ctype, vt)                                                         \
    kvs_status fn(kvs_gguf_writer *w, const char *key, ctype v, kvs_err *err) {        \
        kvs_status st = w_head(w, key, vt, err);                                        \
        if (st) return st;                                                              \
        if (!wb_put(&w->kv, &v, sizeof v))                                              \
            return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");        \
        return KVS_OK;                                                                  \
    }
W_SCALAR(kvs_gguf_writer_add_u32, uint32_t, KVS_GGUF_U32)
W_SCALAR(kvs_gguf_writer_add_i32, int32_t, KVS_GGUF_I32)
W_SCALAR(kvs_gguf_writer_add_f32, float, KVS_GGUF_F32)

kvs_status kvs_gguf_writer_add_bool(kvs_gguf_writer *w, const char *key, int v, kvs_err *err) {
    kvs_status st = w_head(w, key, KVS_GGUF_BOOL, err);
    if (st) return st;
    uint8_t b = v ? 1 : 0;
    if (!wb_put(&w->kv, &b, 1)) return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    return KVS_OK;
}

kvs_status kvs_gguf_writer_add_str(kvs_gguf_writer *w, const char *key, const char *v, kvs_err *err) {
    kvs_status st = w_head(w, key, KVS_GGUF_STRING, err);
    if (st) return st;
    if (!wb_str(&w->kv, v)) return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    return KVS_OK;
}

kvs_status kvs_gguf_writer_add_arr_str(kvs_gguf_writer *w, const char *key, const char *const *v,
                                       int n, kvs_err *err) {
    kvs_status st = w_head(w, key, KVS_GGUF_ARRAY, err);
    if (st) return st;
    if (!wb_u32(&w->kv, KVS_GGUF_STRING) || !wb_u64(&w->kv, (uint64_t)n))
        return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    for (int i = 0; i < n; i++)
        if (!wb_str(&w->kv, v[i])) return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    return KVS_OK;
}

static kvs_status w_arr(kvs_gguf_writer *w, const char *key, uint32_t et, const void *v, int n,
                        size_t es, kvs_err *err) {
    kvs_status st = w_head(w, key, KVS_GGUF_ARRAY, err);
    if (st) return st;
    if (!wb_u32(&w->kv, et) || !wb_u64(&w->kv, (uint64_t)n) || !wb_put(&w->kv, v, es * (size_t)n))
        return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
    return KVS_OK;
}

kvs_status kvs_gguf_writer_add_arr_f32(kvs_gguf_writer *w, const char *key, const float *v, int n,
                                       kvs_err *err) {
    return w_arr(w, key, KVS_GGUF_F32, v, n, 4, err);
}

kvs_status kvs_gguf_writer_add_arr_i32(kvs_gguf_writer *w, const char *key, const int32_t *v, int n,
                                       kvs_err *err) {
    return w_arr(w, key, KVS_GGUF_I32, v, n, 4, err);
}

kvs_status kvs_gguf_writer_add_tensor(kvs_gguf_writer *w, const char *name, int type, int n_dims,
                                      const int64_t *ne, const void *data, kvs_err *err) {
    if (n_dims < 1 || n_dims > KVS_GGUF_MAX_DIMS || !kvs_ggml_blck_size(type) ||
        ne[0] % kvs_ggml_blck_size(type))
        return kvs_errorf(err, KVS_ERR_INVALID, "gguf writer: tensor '%s': bad type %d or shape", name, type);
    if (w->n_t == w->cap_t) {
        int c = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *t = realloc(w->t, (size_t)c * sizeof *t);
        if (!t) return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory");
        w->t = t;
        w->cap_t = c;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    size_t rows = 1;
    for (int d = 0; d < KVS_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    for (int d = 1; d < n_dims; d++) rows *= (size_t)ne[d];
    t->nbytes = kvs_ggml_row_size(type, ne[0]) * rows;
    t->name = strdup(name);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
    }
    memcpy(t->data, data, t->nbytes);
    t->type = type;
    t->n_dims = n_dims;
    w->n_t++;
    return KVS_OK;
}

kvs_status kvs_gguf_writer_bytes(kvs_gguf_writer *w, uint8_t **out, size_t *n, kvs_err *err) {
    wbuf b = {0};
    const size_t align = 32;
    int ok = wb_u32(&b, GGUF_MAGIC) && wb_u32(&b, 3) && wb_u64(&b, (uint64_t)w->n_t) &&
             wb_u64(&b, w->n_kv) && wb_put(&b, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int i = 0; ok && i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        ok = wb_str(&b, t->name) && wb_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; ok && d < t->n_dims; d++) ok = wb_u64(&b, (uint64_t)t->ne[d]);
        ok = ok && wb_u32(&b, (uint32_t)t->type) && wb_u64(&b, off);
        off += (t->nbytes + align - 1) / align * align;
    }
    static const uint8_t zeros[32] = {0};
    if (ok && b.n % align) ok = wb_put(&b, zeros, align - b.n % align);
    for (int i = 0; ok && i < w->n_t; i++) {
        ok = wb_put(&b, w->t[i].data, w->t[i].nbytes);
        if (ok && w->t[i].nbytes % align) ok = wb_put(&b, zeros, align - w->t[i].nbytes % align);
    }
    if (!ok) {
        free(b.p);
        return kvs_errorf(err, KVS_ERR_NOMEM, "gguf writer: out of memory while serialising");
    }
    *out = b.p;
    *n = b.n;
    return KVS_OK;
}

kvs_status kvs_gguf_writer_write(kvs_gguf_writer *w, const char *path, kvs_err *err) {
    uint8_t *p = NULL;
    size_t n = 0;
    kvs_status st = kvs_gguf_writer_bytes(w, &p, &n, err);
    if (st) return st;
    FILE *f = fopen(path, "wb");
    if (!f) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto cleanup;
    }
    if (fwrite(p, 1, n, f) != n) st = kvs_errorf(err, KVS_ERR_IO, "%s: write failed", path);
    if (fclose(f) != 0 && !st) st = kvs_errorf(err, KVS_ERR_IO, "%s: close failed", path);
cleanup:
    free(p);
    return st;
}
