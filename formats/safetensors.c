/*
 * safetensors.c -- read (mmap) and write safetensors files.
 *
 * What it is: a strict parser and an atomic writer for the safetensors
 * container (8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
 * data buffer). Tensors of dtype F32, F16, BF16, U8, I32 are supported; the
 * other safetensors dtypes are KVS_ERR_UNSUPPORTED. Every malformed file is a
 * KVS_ERR_FORMAT naming the path and what is wrong; no input can crash it.
 * What it is not: no knowledge of what the tensors mean (dump.c), no dtype
 * conversion.
 *
 * Alignment: when the data of some tensor in the mapping is not aligned to
 * its element size (a foreign writer with an odd header length), the file is
 * read into an anonymous mapping at a shift that aligns the data buffer, so
 * consumers may always load elements directly. Offsets that are themselves
 * not multiples of the element size are KVS_ERR_UNSUPPORTED.
 */
/* MAP_ANONYMOUS (not in POSIX 2008, which the build selects). */
#define _DEFAULT_SOURCE
#include "kvs_formats.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header lengths above this are rejected as absurd (the reference
 * implementation uses the same 100 MB cap). */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Exact integers in a JSON number (double) go up to 2^53. */
#define ST_MAX_EXACT ((double)9007199254740992.0)

static const struct {
    const char *name;
    int supported; /* 1: kvs_dtype below */
    kvs_dtype t;
} st_dtypes[] = {
    {"F32", 1, KVS_F32},  {"F16", 1, KVS_F16},  {"BF16", 1, KVS_BF16}, {"U8", 1, KVS_U8},
    {"I32", 1, KVS_I32},  {"F64", 0, KVS_F32},  {"I64", 0, KVS_F32},   {"U64", 0, KVS_F32},
    {"U32", 0, KVS_F32},  {"I16", 0, KVS_F32},  {"U16", 0, KVS_F32},   {"I8", 0, KVS_F32},
    {"BOOL", 0, KVS_F32}, {"F8_E4M3", 0, KVS_F32}, {"F8_E5M2", 0, KVS_F32},
};

static int dtype_valid(kvs_dtype t) {
    return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16 || t == KVS_U8 || t == KVS_I32;
}

/* ---- reading -------------------------------------------------------------- */

/* A JSON number that is an exact non-negative integer; 0 if not. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > ST_MAX_EXACT || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

typedef struct {
    uint64_t begin, end;
    int idx;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

static int cmp_name_ptr(const void *a, const void *b) {
    const kvs_st_tensor *x = *(const kvs_st_tensor *const *)a, *y = *(const kvs_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Parse one tensor entry; ranges[i] receives its offsets. */
static kvs_status parse_tensor(const char *path, const cJSON *e, uint64_t data_size, kvs_st_tensor *t,
                               st_range *r, kvs_err *err) {
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: header entry '%s' is not an object", path, nm);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!jd) return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': missing field 'dtype'", path, nm);
    if (!js) return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': missing field 'shape'", path, nm);
    if (!jo)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': missing field 'data_offsets'", path, nm);
    if (!cJSON_IsString(jd))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': dtype is not a string", path, nm);
    int found = -1;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, jd->valuestring) == 0) found = (int)i;
    if (found < 0)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", path, nm,
                          jd->valuestring);
    if (!st_dtypes[found].supported)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: tensor '%s': dtype %s is not supported (F32, F16, BF16, U8, I32)", path,
                          nm, jd->valuestring);
    t->dtype = st_dtypes[found].t;

    if (!cJSON_IsArray(js))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': shape is not an array", path, nm);
    int nd = cJSON_GetArraySize(js);
    if (nd > KVS_ST_MAX_DIMS)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': shape has %d dims (at most %d)", path,
                          nm, nd, KVS_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t count = 1;
    int overflow = 0;
    const cJSON *jv;
    int i = 0;
    cJSON_ArrayForEach(jv, js) {
        if (cJSON_IsNumber(jv) && jv->valuedouble < 0)
            return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': shape[%d] = %g is negative", path,
                              nm, i, jv->valuedouble);
        uint64_t dim;
        if (!json_uint(jv, &dim) || dim > (uint64_t)INT64_MAX)
            return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                              path, nm, i);
        t->shape[i] = (int64_t)dim;
        if (dim && count > UINT64_MAX / dim) overflow = 1;
        else count *= dim;
        i++;
    }
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s': data_offsets is not an array of 2 integers",
                          path, nm);
    uint64_t b, en;
    if (!json_uint(cJSON_GetArrayItem(jo, 0), &b) || !json_uint(cJSON_GetArrayItem(jo, 1), &en))
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets are not non-negative integers", path, nm);
    if (b > en)
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets begin %llu > end %llu", path, nm,
                          (unsigned long long)b, (unsigned long long)en);
    if (en > data_size)
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu) out of range: data buffer has %llu bytes",
                          path, nm, (unsigned long long)b, (unsigned long long)en,
                          (unsigned long long)data_size);
    size_t es = kvs_dtype_size(t->dtype);
    if (overflow || count > UINT64_MAX / es || count * es != en - b)
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets span %llu bytes but dtype %s x shape needs %s%llu",
                          path, nm, (unsigned long long)(en - b), jd->valuestring,
                          overflow || count > UINT64_MAX / es ? "more than " : "",
                          overflow || count > UINT64_MAX / es ? (unsigned long long)UINT64_MAX
                                                              : (unsigned long long)(count * es));
    r->begin = b;
    r->end = en;
    t->nbytes = (size_t)(en - b);
    return KVS_OK;
}

void kvs_st_close(kvs_st_file *f) {
    if (!f) return;
    if (f->tensors)
        for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->metadata_json);
    if (f->map && f->map != MAP_FAILED) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

kvs_status kvs_st_open(const char *path, kvs_st_file *f, kvs_err *err) {
    assert(path && f);
    memset(f, 0, sizeof *f);
    kvs_status st = KVS_OK;
    cJSON *root = NULL;
    st_range *ranges = NULL;
    const kvs_st_tensor **byname = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kvs_errorf(err, KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: not a regular file", path);
        goto cleanup;
    }
    size_t fsize = (size_t)sb.st_size;
    if (fsize < 8) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                        path, fsize);
        goto cleanup;
    }
    f->map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        goto cleanup;
    }
    f->map_size = fsize;
    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: header length %llu is absurd (limit %llu bytes)", path,
                        (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
        goto cleanup;
    }
    if (hlen > fsize - 8) {
        st = kvs_errorf(err, KVS_ERR_FORMAT,
                        "%s: header length %llu runs past end of file (%zu bytes after the length)", path,
                        (unsigned long long)hlen, fsize - 8);
        goto cleanup;
    }
    if (hlen == 0) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: header is empty (not JSON)", path);
        goto cleanup;
    }
    const char *hdr = (const char *)p + 8;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= hdr && at <= hdr + hlen) ? (long)(at - hdr) : -1;
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: header is not valid JSON (error near byte %ld)", path,
                        off);
        goto cleanup;
    }
    for (const char *q = end; q && q < hdr + hlen; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: header has non-space bytes after the JSON object",
                            path);
            goto cleanup;
        }
    if (!cJSON_IsObject(root)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: header is JSON but not an object", path);
        goto cleanup;
    }
    uint64_t data_start = 8 + hlen, data_size = fsize - data_start;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!e->string) continue;
        if (strcmp(e->string, "__metadata__") == 0) {
            if (f->metadata_json) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: __metadata__ appears twice", path);
                goto cleanup;
            }
            if (!cJSON_IsObject(e)) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                goto cleanup;
            }
            const cJSON *m;
            cJSON_ArrayForEach(m, e) if (!cJSON_IsString(m)) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", path,
                                m->string ? m->string : "?");
                goto cleanup;
            }
            f->metadata_json = cJSON_PrintUnformatted(e);
            if (!f->metadata_json) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
                goto cleanup;
            }
        } else
            n++;
    }
    f->tensors = calloc((size_t)(n ? n : 1), sizeof *f->tensors);
    ranges = calloc((size_t)(n ? n : 1), sizeof *ranges);
    byname = calloc((size_t)(n ? n : 1), sizeof *byname);
    if (!f->tensors || !ranges || !byname) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for %d tensors", path, n);
        goto cleanup;
    }
    cJSON_ArrayForEach(e, root) {
        if (!e->string || strcmp(e->string, "__metadata__") == 0) continue;
        kvs_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
            goto cleanup;
        }
        f->n_tensors++;
        if (!t->name[0]) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: a tensor has an empty name", path);
            goto cleanup;
        }
        st = parse_tensor(path, e, data_size, t, &ranges[f->n_tensors - 1], err);
        if (st) goto cleanup;
        ranges[f->n_tensors - 1].idx = f->n_tensors - 1;
        byname[f->n_tensors - 1] = t;
    }
    assert(f->n_tensors == n);
    /* Duplicate names. */
    qsort(byname, (size_t)n, sizeof *byname, cmp_name_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path,
                            byname[i]->name);
            goto cleanup;
        }
    /* Overlaps, holes and trailing bytes: sorted by begin, the non-empty
     * tensors must tile [0, data_size) exactly. */
    qsort(ranges, (size_t)n, sizeof *ranges, cmp_range);
    uint64_t pos = 0;
    int prev = -1;
    for (int i = 0; i < n; i++) {
        const st_range *r = &ranges[i];
        if (r->begin == r->end) continue;
        if (r->begin < pos) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", path,
                            f->tensors[ranges[prev].idx].name, (unsigned long long)ranges[prev].begin,
                            (unsigned long long)ranges[prev].end, f->tensors[r->idx].name,
                            (unsigned long long)r->begin, (unsigned long long)r->end);
            goto cleanup;
        }
        if (r->begin > pos) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s: data buffer has a gap of %llu unused bytes at offset %llu (before '%s')",
                            path, (unsigned long long)(r->begin - pos), (unsigned long long)pos,
                            f->tensors[r->idx].name);
            goto cleanup;
        }
        pos = r->end;
        prev = i;
    }
    if (pos != data_size) {
        st = kvs_errorf(err, KVS_ERR_FORMAT,
                        "%s: %llu trailing bytes after the last tensor (data buffer %llu bytes, tensors end at %llu)",
                        path, (unsigned long long)(data_size - pos), (unsigned long long)data_size,
                        (unsigned long long)pos);
        goto cleanup;
    }
    /* Alignment of each tensor's data in memory. */
    int misaligned = 0;
    for (int i = 0; i < n; i++) {
        const st_range *r = &ranges[i];
        const kvs_st_tensor *t = &f->tensors[r->idx];
        size_t es = kvs_dtype_size(t->dtype);
        if (r->begin == r->end) continue; /* empty: nothing to load */
        if (r->begin % es != 0) {
            st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "%s: tensor '%s' starts at offset %llu, not a multiple of its %zu-byte elements",
                            path, t->name, (unsigned long long)r->begin, es);
            goto cleanup;
        }
        if ((data_start + r->begin) % es != 0) misaligned = 1;
    }
    size_t shift = 0;
    if (misaligned) {
        /* Copy into an anonymous mapping where the data buffer starts on an
         * 8-byte boundary (page-aligned base + shift). */
        shift = (size_t)((8 - data_start % 8) % 8);
        size_t nsize = fsize + shift;
        void *nm = mmap(NULL, nsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (nm == MAP_FAILED) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: cannot map %zu bytes to align tensor data", path,
                            nsize);
            goto cleanup;
        }
        memcpy((char *)nm + shift, f->map, fsize);
        munmap(f->map, f->map_size);
        f->map = nm;
        f->map_size = nsize;
    }
    const char *data = (const char *)f->map + shift + data_start;
    for (int i = 0; i < n; i++) f->tensors[ranges[i].idx].data = data + ranges[i].begin;

cleanup:
    if (root) cJSON_Delete(root);
    free(ranges);
    free(byname);
    close(fd);
    if (st != KVS_OK) kvs_st_close(f);
    return st;
}

const kvs_st_tensor *kvs_st_find(const kvs_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *kvs_st_meta(const kvs_st_file *f, const char *key, char *buf, size_t n) {
    if (!f || !f->metadata_json || !key || !buf || n == 0) return NULL;
    cJSON *m = cJSON_Parse(f->metadata_json);
    if (!m) return NULL;
    const char *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    if (cJSON_IsString(v)) {
        snprintf(buf, n, "%s", v->valuestring);
        out = buf;
    }
    cJSON_Delete(m);
    return out;
}

/* ---- writing -------------------------------------------------------------- */

/* Data order: larger elements first (then by name), so every tensor stays
 * aligned to its element size without gaps between tensors. */
static int cmp_write_order(const void *a, const void *b) {
    const kvs_st_tensor *x = *(const kvs_st_tensor *const *)a, *y = *(const kvs_st_tensor *const *)b;
    size_t ex = kvs_dtype_size(x->dtype), ey = kvs_dtype_size(y->dtype);
    if (ex != ey) return ex > ey ? -1 : 1;
    return strcmp(x->name, y->name);
}

kvs_status kvs_st_write(const char *path, const kvs_st_tensor *t, int n, const char *const *meta_kv,
                        kvs_err *err) {
    assert(path);
    kvs_status st = KVS_OK;
    const kvs_st_tensor **order = NULL, **sorted = NULL;
    uint64_t *offs = NULL; /* [n] begin offset, indexed like t */
    cJSON *root = NULL;
    char *json = NULL, *tmp = NULL;
    FILE *fp = NULL;
    if (n < 0 || (n > 0 && !t)) return kvs_errorf(err, KVS_ERR_INVALID, "%s: bad tensor list", path);
    order = calloc((size_t)(n ? n : 1), sizeof *order);
    sorted = calloc((size_t)(n ? n : 1), sizeof *sorted);
    offs = calloc((size_t)(n ? n : 1), sizeof *offs);
    tmp = malloc(strlen(path) + 5);
    if (!order || !sorted || !offs || !tmp) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    sprintf(tmp, "%s.tmp", path);
    for (int i = 0; i < n; i++) {
        const kvs_st_tensor *x = &t[i];
        if (!x->name || !x->name[0] || strcmp(x->name, "__metadata__") == 0) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor %d has an invalid name", path, i);
            goto cleanup;
        }
        if (!dtype_valid(x->dtype)) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor '%s': invalid dtype %d", path, x->name,
                            (int)x->dtype);
            goto cleanup;
        }
        if (x->ndim < 0 || x->ndim > KVS_ST_MAX_DIMS) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor '%s': %d dims (0..%d allowed)", path,
                            x->name, x->ndim, KVS_ST_MAX_DIMS);
            goto cleanup;
        }
        uint64_t count = 1;
        for (int k = 0; k < x->ndim; k++) {
            if (x->shape[k] < 0) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor '%s': shape[%d] = %lld is negative",
                                path, x->name, k, (long long)x->shape[k]);
                goto cleanup;
            }
            count *= (uint64_t)x->shape[k];
        }
        if (count * kvs_dtype_size(x->dtype) != (uint64_t)x->nbytes) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "%s: tensor '%s': nbytes %zu does not match dtype %s x shape (%llu bytes)",
                            path, x->name, x->nbytes, kvs_dtype_name(x->dtype),
                            (unsigned long long)(count * kvs_dtype_size(x->dtype)));
            goto cleanup;
        }
        if (x->nbytes && !x->data) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor '%s' has no data", path, x->name);
            goto cleanup;
        }
        order[i] = sorted[i] = x;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_name_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "%s: tensor name '%s' given twice", path, sorted[i]->name);
            goto cleanup;
        }
    qsort(order, (size_t)n, sizeof *order, cmp_write_order);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        offs[order[i] - t] = pos;
        pos += order[i]->nbytes;
    }

    /* Header: __metadata__ first, then tensors sorted by name. */
    root = cJSON_CreateObject();
    if (!root) goto nomem;
    if (meta_kv && meta_kv[0]) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) goto nomem;
        for (int i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "%s: metadata key '%s' has no value", path,
                                meta_kv[i]);
                goto cleanup;
            }
            if (cJSON_GetObjectItemCaseSensitive(m, meta_kv[i])) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "%s: metadata key '%s' given twice", path, meta_kv[i]);
                goto cleanup;
            }
            if (!cJSON_AddStringToObject(m, meta_kv[i], meta_kv[i + 1])) goto nomem;
        }
    }
    for (int i = 0; i < n; i++) {
        const kvs_st_tensor *x = sorted[i];
        cJSON *o = cJSON_AddObjectToObject(root, x->name);
        if (!o || !cJSON_AddStringToObject(o, "dtype", kvs_dtype_name(x->dtype))) goto nomem;
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        if (!sh) goto nomem;
        for (int k = 0; k < x->ndim; k++) {
            cJSON *v = cJSON_CreateNumber((double)x->shape[k]);
            if (!v) goto nomem;
            cJSON_AddItemToArray(sh, v);
        }
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        if (!of) goto nomem;
        uint64_t b = offs[x - t];
        cJSON *vb = cJSON_CreateNumber((double)b), *ve = cJSON_CreateNumber((double)(b + x->nbytes));
        if (!vb || !ve) {
            cJSON_Delete(vb);
            cJSON_Delete(ve);
            goto nomem;
        }
        cJSON_AddItemToArray(of, vb);
        cJSON_AddItemToArray(of, ve);
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) goto nomem;
    size_t jl = strlen(json);
    size_t hlen = jl + (8 - (8 + jl) % 8) % 8;
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(((uint64_t)hlen >> (8 * i)) & 0xff);

    fp = fopen(tmp, "wb");
    if (!fp) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto cleanup;
    }
    int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(json, 1, jl, fp) == jl;
    for (size_t i = jl; ok && i < hlen; i++) ok = fputc(' ', fp) != EOF;
    for (int i = 0; ok && i < n; i++)
        if (order[i]->nbytes) ok = fwrite(order[i]->data, 1, order[i]->nbytes, fp) == order[i]->nbytes;
    if (ok) ok = fflush(fp) == 0;
    if (ok) ok = fsync(fileno(fp)) == 0;
    int cerr = fclose(fp);
    fp = NULL;
    if (!ok || cerr != 0) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: write to %s failed: %s", path, tmp, strerror(errno));
        remove(tmp);
        goto cleanup;
    }
    if (rename(tmp, path) != 0) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
        remove(tmp);
        goto cleanup;
    }
    goto cleanup;
nomem:
    st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory building the header", path);
cleanup:
    if (fp) {
        fclose(fp);
        remove(tmp);
    }
    cJSON_Delete(root);
    if (json) cJSON_free(json);
    free(order);
    free(sorted);
    free(offs);
    free(tmp);
    return st;
}
