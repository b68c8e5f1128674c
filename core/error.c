/*
 * error.c -- kvs_err handling: formatting, context prefixes, status names.
 *
 * What it is: the single place where kvs_err messages are written. A message
 * grows from the inside out: the deepest function writes "NaN in K", each
 * caller adds context in front ("layer 3: head 1: NaN in K").
 * What it is not: no logging, no global "last error"; the caller owns kvs_err.
 */
#include "kvsieve.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Write "<new>: <old>" (or just "<new>" when err->msg is empty) into err->msg. */
static void prepend(kvs_err *err, const char *fmt, va_list ap) {
    char head[sizeof err->msg]; /* [512] the new text */
    char old[sizeof err->msg];  /* [512] copy of the existing text */
    vsnprintf(head, sizeof head, fmt, ap);
    if (err->msg[0] == '\0') {
        memcpy(err->msg, head, sizeof head);
        return;
    }
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    /* head ": " old, truncated to the buffer */
    const size_t cap = sizeof err->msg - 1;
    size_t n = strlen(head);
    memcpy(err->msg, head, n);
    const char *parts[2] = {": ", old};
    for (int i = 0; i < 2; i++) {
        size_t m = strlen(parts[i]);
        if (m > cap - n) m = cap - n;
        memcpy(err->msg + n, parts[i], m);
        n += m;
    }
    err->msg[n] = '\0';
}

kvs_status kvs_errorf(kvs_err *err, kvs_status code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    prepend(err, fmt, ap);
    va_end(ap);
    err->code = code;
    return code;
}

kvs_status kvs_err_prefix(kvs_err *err, const char *fmt, ...) {
    /* Without an err the caller's status is unknown here; callers keep their
     * own status variable and should not rely on this return value then. */
    if (!err) return KVS_ERR_INTERNAL;
    va_list ap;
    va_start(ap, fmt);
    prepend(err, fmt, ap);
    va_end(ap);
    return err->code;
}

void kvs_err_clear(kvs_err *err) {
    if (!err) return;
    err->code = KVS_OK;
    err->msg[0] = '\0';
}

const char *kvs_status_name(kvs_status s) {
    switch (s) {
    case KVS_OK: return "ok";
    case KVS_ERR_INVALID: return "invalid";
    case KVS_ERR_NOMEM: return "out of memory";
    case KVS_ERR_IO: return "i/o error";
    case KVS_ERR_FORMAT: return "bad format";
    case KVS_ERR_NUMERIC: return "non-finite value";
    case KVS_ERR_UNSUPPORTED: return "unsupported";
    case KVS_ERR_NOTFOUND: return "not found";
    case KVS_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
