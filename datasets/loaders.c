/*
 * loaders.c -- kvsieve_datasets: the file loaders (JSONL QA, LongBench-style
 * JSONL, MileBench task JSON) and the kind dispatcher. Every error names
 * "path:line: field" (JSONL) or "path: data[i].field" (MileBench).
 * Not here: the needle generator (needle.c), templates (prompt.c). Images
 * are never opened: the loader only records their paths.
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

kvs_status kvs_dataset_load_milebench(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                      kvs_err *err) {
    char *text = NULL, name[128];
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
        i++;
    }
    st = kvs_ds_hash_dataset(d, hash, err);
    if (st) goto cleanup;
    *out = d;
    d = NULL;
cleanup:
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
