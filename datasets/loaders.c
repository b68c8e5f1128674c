/*
 * loaders.c -- kvsieve_datasets: the file loaders (JSONL QA, LongBench-style
 * JSONL, MileBench task JSON) and the kind dispatcher. Every error names
 * "path:line: field" (JSONL) or "path: data[i].field" (MileBench).
 * MileBench images are resolved, read whole, size-checked and hashed at load
 * time (so a missing image fails before any backend starts and changed
 * bytes change the dataset hash), and their {image#k} placeholders become
 * media markers; kvs_sample_read_image reads one again for a request.
 * Not here: the needle generator (needle.c), templates (prompt.c); images
 * are never decoded (the backend's processor does that).
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ds_internal.h"

static kvs_status read_file(const char *path, char **out, size_t *len, kvs_err *err) {
    kvs_status st = KVS_OK;
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_errorf(err, KVS_ERR_IO, "%s: cannot open dataset file", path);
    if (fseek(f, 0, SEEK_END) != 0) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot seek", path);
        goto cleanup;
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: cannot tell its size", path);
        goto cleanup;
    }
    buf = malloc((size_t)n + 1); /* [n+1] */
    if (!buf) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory reading %ld bytes", path, n);
        goto cleanup;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        st = kvs_errorf(err, KVS_ERR_IO, "%s: short read", path);
        goto cleanup;
    }
    buf[n] = '\0';
    *out = buf;
    *len = (size_t)n;
    buf = NULL;
cleanup:
    free(buf);
    fclose(f);
    return st;
}

static void base_name(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

/* Where an error is: "path:line" or "path: data[i]". */
typedef struct {
    const char *path;
    int line;  /* > 0 for JSONL */
    int index; /* >= 0 for MileBench */
} where;

static kvs_status field_err(kvs_err *err, kvs_status code, const where *w, const char *field,
                            const char *what) {
    if (w->line > 0) return kvs_errorf(err, code, "%s:%d: %s: %s", w->path, w->line, field, what);
    return kvs_errorf(err, code, "%s: data[%d].%s: %s", w->path, w->index, field, what);
}

/* A string (numbers are printed as integers or %.17g when id_like). */
static kvs_status get_str(const cJSON *obj, const char *key, const char *field, int required,
                          int id_like, const where *w, char **out, kvs_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    char num[64];
    const char *s = NULL;
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        if (required) return field_err(err, KVS_ERR_FORMAT, w, field, "missing");
        return KVS_OK;
    }
    if (cJSON_IsString(v)) {
        s = v->valuestring;
    } else if (id_like && cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (fabs(d) < 9e15 && d == (double)(long long)d) snprintf(num, sizeof num, "%lld", (long long)d);
        else snprintf(num, sizeof num, "%.17g", d);
        s = num;
    } else {
        return field_err(err, KVS_ERR_FORMAT, w, field,
                         id_like ? "expected a string or a number" : "expected a string");
    }
    *out = kvs_ds_strdup(s);
    if (!*out) return field_err(err, KVS_ERR_NOMEM, w, field, "out of memory");
    return KVS_OK;
}

/* A string or an array of strings (allow_scalar), or an array only. */
static kvs_status get_strv(const cJSON *obj, const char *key, const char *field, int required,
                           int allow_scalar, const where *w, char ***out, int *n, kvs_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    *n = 0;
    if (!v || cJSON_IsNull(v)) {
        if (required) return field_err(err, KVS_ERR_FORMAT, w, field, "missing");
        return KVS_OK;
    }
    int count;
    if (cJSON_IsString(v) && allow_scalar) {
        count = 1;
    } else if (cJSON_IsArray(v)) {
        count = cJSON_GetArraySize(v);
    } else {
        return field_err(err, KVS_ERR_FORMAT, w, field,
                         allow_scalar ? "expected a string or an array of strings"
                                      : "expected an array of strings");
    }
    if (required && count == 0) return field_err(err, KVS_ERR_FORMAT, w, field, "is empty");
    if (count == 0) return KVS_OK;
    char **vec = calloc((size_t)count, sizeof *vec); /* [count] */
    if (!vec) return field_err(err, KVS_ERR_NOMEM, w, field, "out of memory");
    kvs_status st = KVS_OK;
    int i = 0;
    if (cJSON_IsString(v)) {
        vec[0] = kvs_ds_strdup(v->valuestring);
        if (!vec[0]) st = field_err(err, KVS_ERR_NOMEM, w, field, "out of memory");
        i = 1;
    } else {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e)) {
                char msg[64];
                snprintf(msg, sizeof msg, "element %d is not a string", i);
                st = field_err(err, KVS_ERR_FORMAT, w, field, msg);
                break;
            }
            vec[i] = kvs_ds_strdup(e->valuestring);
            if (!vec[i]) {
                st = field_err(err, KVS_ERR_NOMEM, w, field, "out of memory");
                break;
            }
            i++;
        }
    }
    if (st) {
        for (int k = 0; k < count; k++) free(vec[k]);
        free(vec);
        return st;
    }
    assert(i == count);
    *out = vec;
    *n = count;
    return KVS_OK;
}

static kvs_status push_sample(kvs_dataset *d, int *cap, kvs_sample **slot, kvs_err *err) {
    if (d->n_samples == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        kvs_sample *p = realloc(d->samples, (size_t)nc * sizeof *p);
        if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory growing dataset '%s'", d->name);
        d->samples = p;
        *cap = nc;
    }
    *slot = &d->samples[d->n_samples++];
    memset(*slot, 0, sizeof **slot);
    return KVS_OK;
}

typedef enum { FMT_QA = 0, FMT_LONGBENCH = 1 } jsonl_fmt;

static kvs_status load_jsonl(const char *path, jsonl_fmt fmt, kvs_ds_hash_fn hash,
                             kvs_dataset **out, kvs_err *err) {
    char *text = NULL, name[128];
    size_t len = 0;
    kvs_dataset *d = NULL;
    cJSON *obj = NULL;
    int cap = 0;
    kvs_status st;
    *out = NULL;
    if (!hash) return kvs_errorf(err, KVS_ERR_INVALID, "%s: no hash function given", path);
    st = read_file(path, &text, &len, err);
    if (st) return st;
    base_name(path, name, sizeof name);
    st = kvs_ds_new(fmt == FMT_QA ? "jsonl" : "longbench", name,
                    fmt == FMT_QA ? KVS_DS_JSONL_VERSION : KVS_DS_LONGBENCH_VERSION,
                    fmt == FMT_QA ? "contains" : "rouge_l", &d, err);
    if (st) goto cleanup;
    int line = 0;
    for (size_t pos = 0; pos < len;) {
        size_t end = pos;
        while (end < len && text[end] != '\n') end++;
        line++;
        size_t a = pos, b = end;
        pos = end + 1;
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r')) b--;
        if (a == b) continue;
        where w = {path, line, -1};
        const char *parse_end = NULL;
        obj = cJSON_ParseWithLengthOpts(text + a, b - a, &parse_end, 0);
        if (!obj) {
            long col = parse_end ? (long)(parse_end - (text + a)) + 1 : 1;
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s:%d: not valid JSON (near column %ld)", path,
                            line, col);
            goto cleanup;
        }
        if (parse_end && parse_end < text + b) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "%s:%d: unexpected text after the JSON object (column %ld); one object per line",
                            path, line, (long)(parse_end - (text + a)) + 1);
            goto cleanup;
        }
        if (!cJSON_IsObject(obj)) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "%s:%d: expected a JSON object", path, line);
            goto cleanup;
        }
        kvs_sample *s = NULL;
        st = push_sample(d, &cap, &s, err);
        if (st) goto cleanup;
        if (fmt == FMT_QA) {
            st = get_str(obj, "id", "id", 0, 1, &w, &s->id, err);
            if (!st) st = get_str(obj, "context", "context", 1, 0, &w, &s->context, err);
            if (!st) st = get_str(obj, "question", "question", 1, 0, &w, &s->question, err);
            if (!st) st = get_strv(obj, "answers", "answers", 1, 1, &w, &s->answers, &s->n_answers, err);
            if (!st) st = get_strv(obj, "choices", "choices", 0, 0, &w, &s->choices, &s->n_choices, err);
        } else {
            st = get_str(obj, "_id", "_id", 0, 1, &w, &s->id, err);
            if (!st) st = get_str(obj, "context", "context", 1, 0, &w, &s->context, err);
            if (!st) st = get_str(obj, "input", "input", 1, 0, &w, &s->question, err);
            if (!st) st = get_strv(obj, "answers", "answers", 1, 1, &w, &s->answers, &s->n_answers, err);
        }
        if (st) goto cleanup;
        if (!s->id) {
            char num[32];
            snprintf(num, sizeof num, "%d", line);
            s->id = kvs_ds_strdup(num);
            if (!s->id) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "%s:%d: out of memory", path, line);
                goto cleanup;
            }
        }
        cJSON_Delete(obj);
        obj = NULL;
    }
    if (d->n_samples == 0) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: no samples (the file has no JSON lines)", path);
        goto cleanup;
    }
    st = kvs_ds_hash_dataset(d, hash, err);
    if (st) goto cleanup;
    *out = d;
    d = NULL;
cleanup:
    cJSON_Delete(obj);
    kvs_dataset_free(d);
    free(text);
    return st;
}

kvs_status kvs_dataset_load_jsonl(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                  kvs_err *err) {
    return load_jsonl(path, FMT_QA, hash, out, err);
}

kvs_status kvs_dataset_load_longbench(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                      kvs_err *err) {
    return load_jsonl(path, FMT_LONGBENCH, hash, out, err);
}

/* ---- MileBench images -------------------------------------------------------- */

/* An image file read whole: a non-empty regular file of at most
 * KVS_DS_IMAGE_MAX_BYTES. On failure *why says what is wrong (the caller
 * names the file and the sample). */
static kvs_status read_image_file(const char *file, unsigned char **out, size_t *n, char *why,
                                  size_t why_n) {
    *out = NULL;
    *n = 0;
    FILE *f = fopen(file, "rb");
    if (!f) {
        snprintf(why, why_n, "cannot be opened: %s", strerror(errno));
        return KVS_ERR_IO;
    }
    kvs_status st = KVS_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        snprintf(why, why_n, "cannot be examined: %s", strerror(errno));
        st = KVS_ERR_IO;
    } else if (!S_ISREG(sb.st_mode)) {
        snprintf(why, why_n, "is not a regular file");
        st = KVS_ERR_IO;
    } else if ((int64_t)sb.st_size > KVS_DS_IMAGE_MAX_BYTES) {
        snprintf(why, why_n, "is %lld bytes, over the %lld MiB cap on an image file", (long long)sb.st_size,
                 (long long)(KVS_DS_IMAGE_MAX_BYTES >> 20));
        st = KVS_ERR_INVALID;
    } else if (sb.st_size == 0) {
        snprintf(why, why_n, "is empty (0 bytes)");
        st = KVS_ERR_FORMAT;
    } else {
        len = (size_t)sb.st_size;
        buf = malloc(len);
        if (!buf) {
            snprintf(why, why_n, "does not fit in memory (%zu bytes)", len);
            st = KVS_ERR_NOMEM;
        } else if (fread(buf, 1, len, f) != len) {
            snprintf(why, why_n, "could not be read whole: %s", ferror(f) ? strerror(errno) : "it shrank while being read");
            st = KVS_ERR_IO;
        }
    }
    fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    *n = len;
    return KVS_OK;
}

/* Where the relative image paths of the task at task_path point: its
 * folder's images/ when that is a folder (MileBench's layout), else its
 * folder. Caller frees. */
static char *image_base(const char *task_path) {
    const char *slash = strrchr(task_path, '/');
    size_t dn = slash ? (size_t)(slash - task_path) : 1;
    if (slash && dn == 0) dn = 1; /* a task in / */
    char *dir = malloc(dn + 8);   /* + "/images" + NUL */
    if (!dir) return NULL;
    if (slash) memcpy(dir, task_path, dn);
    else dir[0] = '.';
    dir[dn] = '\0';
    size_t at = dn == 1 && dir[0] == '/' ? 0 : dn; /* "/" + "/images" would double the slash */
    memcpy(dir + at, "/images", 8);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) dir[dn] = '\0';
    return dir;
}

/* A MileBench placeholder "{image#k}" or "{table#k}" at p: 1 with *k the
 * 1-based image (-1 when too large to be one) and *len its length; 0 when p
 * does not start one. */
static int placeholder_at(const char *p, long *k, size_t *len) {
    if (p[0] != '{' || (strncmp(p + 1, "image#", 6) != 0 && strncmp(p + 1, "table#", 6) != 0)) return 0;
    const char *q = p + 7;
    long v = 0;
    int over = 0;
    while (*q >= '0' && *q <= '9') {
        if (v > 100000000L) over = 1;
        else v = v * 10 + (*q - '0');
        q++;
    }
    if (q == p + 7 || *q != '}') return 0;
    *k = over ? -1 : v;
    *len = (size_t)(q + 1 - p);
    return 1;
}

/* The media of MileBench sample i (see kvs_dataset_load_milebench):
 * placeholders to markers, unreferenced images first, every image resolved
 * against base, read and hashed. */
static kvs_status milebench_media(const char *path, int i, kvs_sample *s, const char *base,
                                  kvs_ds_hash_fn hash, kvs_err *err) {
    const char *id = s->id;
    /* the marker as text would be paired with an image it does not stand for */
    if (strstr(s->context, KVS_MEDIA_MARKER) || strstr(s->question, KVS_MEDIA_MARKER))
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "%s: data[%d] (sample '%s'): %s contains the media marker '%s' as text; a "
                          "backend would pair it with an image",
                          path, i, id, strstr(s->context, KVS_MEDIA_MARKER) ? "task_instance.context" : "the task_instruction",
                          KVS_MEDIA_MARKER);
    for (int c = 0; c < s->n_choices; c++) {
        long k;
        size_t len;
        const char *p = s->choices[c];
        if (strstr(p, KVS_MEDIA_MARKER))
            return kvs_errorf(err, KVS_ERR_FORMAT,
                              "%s: data[%d] (sample '%s'): task_instance.choice_list[%d] contains the media "
                              "marker '%s' as text",
                              path, i, id, c, KVS_MEDIA_MARKER);
        for (; *p; p++)
            if (placeholder_at(p, &k, &len))
                return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                                  "%s: data[%d] (sample '%s'): task_instance.choice_list[%d] has the image "
                                  "placeholder '%.*s': images are placed in the context only (a choice is "
                                  "rendered after the question, possibly after the compression)",
                                  path, i, id, c, (int)(len > 40 ? 40 : len), p);
    }
    int n_ph = 0;
    for (const char *p = s->context; *p; p++) {
        long k;
        size_t len;
        if (!placeholder_at(p, &k, &len)) continue;
        if (k < 1 || k > s->n_images)
            return kvs_errorf(err, KVS_ERR_FORMAT,
                              "%s: data[%d] (sample '%s'): task_instance.context: placeholder '%.*s' refers to "
                              "image %ld, but task_instance.images_path has %d entr%s (k counts from 1)",
                              path, i, id, (int)(len > 40 ? 40 : len), p, k, s->n_images,
                              s->n_images == 1 ? "y" : "ies");
        n_ph++;
        p += len - 1;
    }
    if (s->n_images == 0) return KVS_OK;
    kvs_status st = KVS_OK;
    kvs_ds_buf b = {0};
    unsigned char *bytes = NULL;
    char *used = calloc((size_t)s->n_images, 1); /* [n_images] referenced by a placeholder */
    s->media = malloc(sizeof *s->media * (size_t)(n_ph + s->n_images));
    s->image_files = calloc((size_t)s->n_images, sizeof *s->image_files);
    s->image_sha256 = calloc((size_t)s->n_images, sizeof *s->image_sha256);
    if (!used || !s->media || !s->image_files || !s->image_sha256) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: data[%d]: out of memory", path, i);
        goto done;
    }
    for (const char *p = s->context; *p; p++) {
        long k;
        size_t len;
        if (placeholder_at(p, &k, &len)) {
            used[k - 1] = 1;
            p += len - 1;
        }
    }
    for (int j = 0; j < s->n_images; j++)
        if (!used[j]) {
            s->media[s->n_media++] = j;
            if ((st = kvs_ds_buf_adds(&b, KVS_MEDIA_MARKER, err))) goto done;
        }
    for (const char *p = s->context; *p;) {
        long k;
        size_t len;
        if (placeholder_at(p, &k, &len)) {
            s->media[s->n_media++] = (int)k - 1;
            st = kvs_ds_buf_adds(&b, KVS_MEDIA_MARKER, err);
            p += len;
        } else {
            const char *q = p + 1;
            while (*q && *q != '{') q++;
            st = kvs_ds_buf_add(&b, p, (size_t)(q - p), err);
            p = q;
        }
        if (st) goto done;
    }
    char *ctx = kvs_ds_buf_take(&b, err);
    if (!ctx) {
        st = err ? err->code : KVS_ERR_NOMEM;
        goto done;
    }
    free(s->context);
    s->context = ctx;
    for (int j = 0; j < s->n_images; j++) {
        const char *img = s->images[j];
        size_t n = img[0] == '/' ? strlen(img) + 1 : strlen(base) + 1 + strlen(img) + 1;
        s->image_files[j] = malloc(n);
        if (!s->image_files[j]) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: data[%d]: out of memory", path, i);
            goto done;
        }
        if (img[0] == '/') snprintf(s->image_files[j], n, "%s", img);
        else snprintf(s->image_files[j], n, "%s/%s", base, img);
        char why[160];
        size_t len = 0;
        if ((st = read_image_file(s->image_files[j], &bytes, &len, why, sizeof why))) {
            kvs_errorf(err, st, "%s: data[%d] (sample '%s'): task_instance.images_path[%d]: image '%s' %s", path,
                       i, id, j, s->image_files[j], why);
            goto done;
        }
        hash(bytes, len, s->image_sha256[j]);
        free(bytes);
        bytes = NULL;
    }
done:
    kvs_ds_buf_free(&b);
    free(bytes);
    free(used);
    return st; /* on failure the dataset (and what was set here) is freed by the caller */
}

kvs_status kvs_sample_read_image(const kvs_dataset *d, const kvs_sample *s, int i,
                                 kvs_ds_hash_fn hash, unsigned char **data, size_t *n,
                                 kvs_err *err) {
    *data = NULL;
    *n = 0;
    const char *dn = d ? d->name : "?", *id = s && s->id ? s->id : "?";
    if (!s || i < 0 || i >= s->n_images || !s->image_files || !s->image_files[i])
        return kvs_errorf(err, KVS_ERR_INVALID, "dataset '%s' sample '%s': no resolved image %d (it has %d)",
                          dn, id, i, s ? s->n_images : 0);
    char why[160];
    kvs_status st = read_image_file(s->image_files[i], data, n, why, sizeof why);
    if (st) return kvs_errorf(err, st, "dataset '%s' sample '%s': image '%s' %s", dn, id, s->image_files[i], why);
    if (hash && s->image_sha256) {
        char h[65];
        hash(*data, *n, h);
        if (strcmp(h, s->image_sha256[i]) != 0) {
            free(*data);
            *data = NULL;
            *n = 0;
            return kvs_errorf(err, KVS_ERR_IO,
                              "dataset '%s' sample '%s': image '%s' changed since the task was loaded "
                              "(sha256 %.12s now, %.12s then): the cells' keys name the old bytes; run "
                              "again to load the task anew",
                              dn, id, s->image_files[i], h, s->image_sha256[i]);
        }
    }
    return KVS_OK;
}

kvs_status kvs_dataset_load_milebench(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                      kvs_err *err) {
    char *text = NULL, name[128], *base = NULL;
    size_t len = 0;
    kvs_dataset *d = NULL;
    cJSON *root = NULL;
    kvs_status st;
    *out = NULL;
    if (!hash) return kvs_errorf(err, KVS_ERR_INVALID, "%s: no hash function given", path);
    st = read_file(path, &text, &len, err);
    if (st) return st;
    base_name(path, name, sizeof name);
    const char *parse_end = NULL;
    root = cJSON_ParseWithLengthOpts(text, len, &parse_end, 0);
    if (!root) {
        int line = 1;
        for (const char *c = text; parse_end && c < parse_end; c++) line += *c == '\n';
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s:%d: not valid JSON", path, line);
        goto cleanup;
    }
    while (parse_end && parse_end < text + len &&
           (*parse_end == ' ' || *parse_end == '\n' || *parse_end == '\r' || *parse_end == '\t'))
        parse_end++;
    if (parse_end && parse_end < text + len) {
        int line = 1;
        for (const char *c = text; c < parse_end; c++) line += *c == '\n';
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s:%d: unexpected text after the JSON document", path, line);
        goto cleanup;
    }
    if (!cJSON_IsObject(root)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: expected a JSON object with meta_data and data", path);
        goto cleanup;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "meta_data");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (!cJSON_IsObject(meta)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: meta_data: missing or not an object", path);
        goto cleanup;
    }
    if (!cJSON_IsArray(data) || cJSON_GetArraySize(data) == 0) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: data: missing, empty or not an array", path);
        goto cleanup;
    }
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(meta, "task_instruction");
    if (instr && !cJSON_IsArray(instr)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: meta_data.task_instruction: expected an array of strings", path);
        goto cleanup;
    }
    const cJSON *qtype = cJSON_GetObjectItemCaseSensitive(meta, "question_type");
    int mc = cJSON_IsString(qtype) && strstr(qtype->valuestring, "choice") != NULL;
    st = kvs_ds_new("milebench", name, KVS_DS_MILEBENCH_VERSION, mc ? "choice" : "rouge_l", &d, err);
    if (st) goto cleanup;
    int n = cJSON_GetArraySize(data);
    d->samples = calloc((size_t)n, sizeof *d->samples); /* [n] */
    if (!d->samples) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for %d samples", path, n);
        goto cleanup;
    }
    base = image_base(path);
    if (!base) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, data) {
        where w = {path, 0, i};
        kvs_sample *s = &d->samples[i];
        d->n_samples = i + 1;
        if (!cJSON_IsObject(e)) {
            st = field_err(err, KVS_ERR_FORMAT, &w, "", "expected an object");
            goto cleanup;
        }
        const cJSON *inst = cJSON_GetObjectItemCaseSensitive(e, "task_instance");
        if (!cJSON_IsObject(inst)) {
            st = field_err(err, KVS_ERR_FORMAT, &w, "task_instance", "missing or not an object");
            goto cleanup;
        }
        st = get_str(e, "sample_id", "sample_id", 1, 1, &w, &s->id, err);
        if (!st) st = get_str(inst, "context", "task_instance.context", 1, 0, &w, &s->context, err);
        if (!st)
            st = get_strv(inst, "images_path", "task_instance.images_path", 0, 0, &w, &s->images,
                          &s->n_images, err);
        if (!st)
            st = get_strv(inst, "choice_list", "task_instance.choice_list", 0, 0, &w, &s->choices,
                          &s->n_choices, err);
        if (!st) st = get_strv(e, "response", "response", 1, 1, &w, &s->answers, &s->n_answers, err);
        if (st) goto cleanup;
        const char *q = "";
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "task_instruction_id");
        if (instr && cJSON_GetArraySize(instr) > 0) {
            int k = 0;
            if (tid && !cJSON_IsNumber(tid)) {
                st = field_err(err, KVS_ERR_FORMAT, &w, "task_instruction_id", "expected a number");
                goto cleanup;
            }
            if (tid) k = tid->valueint;
            const cJSON *t = cJSON_GetArrayItem(instr, k);
            if (k < 0 || !t || !cJSON_IsString(t)) {
                char msg[128];
                snprintf(msg, sizeof msg, "%d does not name a string in meta_data.task_instruction (%d entries)",
                         k, cJSON_GetArraySize(instr));
                st = field_err(err, KVS_ERR_FORMAT, &w, "task_instruction_id", msg);
                goto cleanup;
            }
            q = t->valuestring;
        }
        s->question = kvs_ds_strdup(q);
        if (!s->question) {
            st = field_err(err, KVS_ERR_NOMEM, &w, "question", "out of memory");
            goto cleanup;
        }
        if ((st = milebench_media(path, i, s, base, hash, err))) goto cleanup;
        i++;
    }
    st = kvs_ds_hash_dataset(d, hash, err);
    if (st) goto cleanup;
    *out = d;
    d = NULL;
cleanup:
    free(base);
    cJSON_Delete(root);
    kvs_dataset_free(d);
    free(text);
    return st;
}

kvs_status kvs_dataset_load(const char *kind, const char *path, kvs_ds_hash_fn hash,
                            kvs_dataset **out, kvs_err *err) {
    static const char *const kinds[] = {"jsonl", "longbench", "milebench"};
    if (!kind) return kvs_errorf(err, KVS_ERR_INVALID, "%s: no dataset kind given", path);
    if (!strcmp(kind, "jsonl")) return kvs_dataset_load_jsonl(path, hash, out, err);
    if (!strcmp(kind, "longbench")) return kvs_dataset_load_longbench(path, hash, out, err);
    if (!strcmp(kind, "milebench")) return kvs_dataset_load_milebench(path, hash, out, err);
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "unknown dataset kind '%s' (did you mean '%s'?); kinds: jsonl, longbench, "
                      "milebench (needle datasets are generated, not loaded)",
                      kind, kvs_ds_closest(kind, kinds, 3));
}
