/*
 * util.c -- kvsieve_datasets: the growable string buffer, strdup, the
 * did-you-mean helper, dataset allocation/free, the canonical text and its
 * hash, and kvs_sample_has_images / kvs_sample_require_text.
 * Not here: parsing (loaders.c), generation (needle.c), templates (prompt.c).
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_internal.h"

static kvs_status buf_reserve(kvs_ds_buf *b, size_t extra, kvs_err *err) {
    if (b->n + extra + 1 <= b->cap) return KVS_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory growing a text buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return KVS_OK;
}

kvs_status kvs_ds_buf_add(kvs_ds_buf *b, const char *s, size_t n, kvs_err *err) {
    kvs_status st = buf_reserve(b, n, err);
    if (st) return st;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return KVS_OK;
}

kvs_status kvs_ds_buf_adds(kvs_ds_buf *b, const char *s, kvs_err *err) {
    return kvs_ds_buf_add(b, s, strlen(s), err);
}

kvs_status kvs_ds_buf_addf(kvs_ds_buf *b, kvs_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return kvs_errorf(err, KVS_ERR_INTERNAL, "bad format '%s'", fmt);
    kvs_status st = buf_reserve(b, (size_t)n, err);
    if (st) return st;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return KVS_OK;
}

char *kvs_ds_buf_take(kvs_ds_buf *b, kvs_err *err) {
    if (!b->p && buf_reserve(b, 0, err)) return NULL;
    char *p = b->p;
    p[b->n] = '\0';
    b->p = NULL;
    b->n = b->cap = 0;
    return p;
}

void kvs_ds_buf_free(kvs_ds_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

char *kvs_ds_strdup(const char *s) {
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

const char *kvs_ds_closest(const char *name, const char *const *list, int n) {
    const char *best = NULL;
    int bd = 1 << 30;
    for (int i = 0; i < n; i++) {
        int d = kvs_edit_distance(name, list[i]);
        if (d < bd) {
            bd = d;
            best = list[i];
        }
    }
    return best;
}

static void free_strv(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void kvs_dataset_free(kvs_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n_samples; i++) {
        kvs_sample *s = &d->samples[i];
        free(s->id);
        free(s->context);
        free(s->question);
        free_strv(s->answers, s->n_answers);
        free_strv(s->choices, s->n_choices);
        free_strv(s->images, s->n_images);
        free_strv(s->image_files, s->n_images);
        free(s->image_sha256);
        free(s->media);
        free(s->needle.kind);
        free(s->needle.value);
        free(s->spans);
        free(s->task);
        free(s->metric);
    }
    free(d->samples);
    free(d);
}

kvs_status kvs_ds_new(const char *kind, const char *name, const char *version, const char *metric,
                      kvs_dataset **out, kvs_err *err) {
    kvs_dataset *d = calloc(1, sizeof *d);
    if (!d) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory allocating dataset '%s'", name);
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    snprintf(d->name, sizeof d->name, "%s", name);
    snprintf(d->version, sizeof d->version, "%s", version);
    snprintf(d->metric, sizeof d->metric, "%s", metric);
    *out = d;
    return KVS_OK;
}

static kvs_status canon_field(kvs_ds_buf *b, const char *field, const char *v, kvs_err *err) {
    const char *s = v ? v : "";
    kvs_status st = kvs_ds_buf_addf(b, err, "%s=%zu:", field, strlen(s));
    if (!st) st = kvs_ds_buf_adds(b, s, err);
    if (!st) st = kvs_ds_buf_add(b, "\n", 1, err);
    return st;
}

static kvs_status canon_list(kvs_ds_buf *b, const char *field, char *const *v, int n,
                             kvs_err *err) {
    kvs_status st = kvs_ds_buf_addf(b, err, "%s#=%d\n", field, n);
    for (int i = 0; !st && i < n; i++) st = canon_field(b, field, v[i], err);
    return st;
}

kvs_status kvs_dataset_canonical(const kvs_dataset *d, char **out, size_t *len, kvs_err *err) {
    kvs_ds_buf b = {0};
    kvs_status st = KVS_OK;
    *out = NULL;
    for (int i = 0; !st && i < d->n_samples; i++) {
        const kvs_sample *s = &d->samples[i];
        st = canon_field(&b, "id", s->id, err);
        if (!st) st = canon_field(&b, "context", s->context, err);
        if (!st) st = canon_field(&b, "question", s->question, err);
        if (!st) st = canon_list(&b, "answer", s->answers, s->n_answers, err);
        if (!st) st = canon_list(&b, "choice", s->choices, s->n_choices, err);
        if (!st) st = canon_list(&b, "image", s->images, s->n_images, err);
        /* image bytes and where each is sent: only for samples with images,
         * so text datasets keep their hashes */
        if (!st && s->n_images > 0 && s->image_sha256) {
            st = kvs_ds_buf_addf(&b, err, "image_sha256#=%d\n", s->n_images);
            for (int k = 0; !st && k < s->n_images; k++)
                st = canon_field(&b, "image_sha256", s->image_sha256[k], err);
            if (!st) st = kvs_ds_buf_addf(&b, err, "media#=%d\n", s->n_media);
            for (int k = 0; !st && k < s->n_media; k++) st = kvs_ds_buf_addf(&b, err, "media=%d\n", s->media[k]);
        }
        if (!st && s->has_needle)
            st = kvs_ds_buf_addf(&b, err, "needle=%s|%s|%.6f|%lld|%lld\n", s->needle.kind,
                                 s->needle.value, s->needle.depth, (long long)s->needle.offset,
                                 (long long)s->needle.length);
        /* generated samples without a needle record (RULER): task, metric,
         * tokens to generate, measured tokens and the answer spans (a
         * needle's span follows from needle.offset and the context) */
        if (!st && s->task)
            st = kvs_ds_buf_addf(&b, err, "task=%s|%s|%d|%lld\n", s->task, s->metric ? s->metric : "",
                                 s->max_tokens, (long long)s->n_tokens);
        if (!st && !s->has_needle && s->n_spans > 0) {
            st = kvs_ds_buf_addf(&b, err, "spans#=%d\n", s->n_spans);
            for (int k = 0; !st && k < s->n_spans; k++)
                st = kvs_ds_buf_addf(&b, err, "span=%lld|%lld\n", (long long)s->spans[k].start,
                                     (long long)s->spans[k].end);
        }
    }
    if (st) goto cleanup;
    *len = b.n;
    *out = kvs_ds_buf_take(&b, err);
    if (!*out) st = err ? err->code : KVS_ERR_NOMEM;
cleanup:
    kvs_ds_buf_free(&b);
    return st;
}

kvs_status kvs_ds_hash_dataset(kvs_dataset *d, kvs_ds_hash_fn hash, kvs_err *err) {
    char *text = NULL;
    size_t n = 0;
    kvs_status st = kvs_dataset_canonical(d, &text, &n, err);
    if (st) return kvs_err_prefix(err, "dataset '%s': canonical text", d->name);
    hash(text, n, d->hash);
    free(text);
    assert(strlen(d->hash) == 64);
    return KVS_OK;
}

int kvs_sample_has_images(const kvs_sample *s) { return s && s->n_images > 0; }

kvs_status kvs_sample_require_text(const kvs_dataset *d, const kvs_sample *s, kvs_err *err) {
    if (!kvs_sample_has_images(s)) return KVS_OK;
    return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                      "dataset '%s' sample '%s' has %d image%s, but this backend is text-only: "
                      "image samples need a multimodal backend",
                      d ? d->name : "?", s->id ? s->id : "?", s->n_images,
                      s->n_images == 1 ? "" : "s");
}
