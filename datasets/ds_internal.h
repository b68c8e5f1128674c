/*
 * ds_internal.h -- private helpers shared by the files of kvsieve_datasets
 * (a growable string buffer, string duplication, did-you-mean). Not installed,
 * not part of the public API.
 */
#ifndef KVS_DS_INTERNAL_H
#define KVS_DS_INTERNAL_H

#include <stddef.h>

#include "kvs_datasets.h"

typedef struct {
    char *p;    /* [cap] NUL-terminated when n < cap */
    size_t n;   /* bytes used (without the NUL) */
    size_t cap;
} kvs_ds_buf;

kvs_status kvs_ds_buf_add(kvs_ds_buf *b, const char *s, size_t n, kvs_err *err);
kvs_status kvs_ds_buf_adds(kvs_ds_buf *b, const char *s, kvs_err *err);
kvs_status kvs_ds_buf_addf(kvs_ds_buf *b, kvs_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Hand the bytes over (a NUL-terminated string, "" when empty); the buffer is reset. */
char *kvs_ds_buf_take(kvs_ds_buf *b, kvs_err *err);
void kvs_ds_buf_free(kvs_ds_buf *b);

char *kvs_ds_strdup(const char *s);
/* The candidate closest to name by edit distance (NULL when list is empty). */
const char *kvs_ds_closest(const char *name, const char *const *list, int n);
/* Fill d->hash from its canonical text. */
kvs_status kvs_ds_hash_dataset(kvs_dataset *d, kvs_ds_hash_fn hash, kvs_err *err);
/* Allocate an empty dataset of the given kind/name/version/metric. */
kvs_status kvs_ds_new(const char *kind, const char *name, const char *version, const char *metric,
                      kvs_dataset **out, kvs_err *err);

#endif
