/*
 * batch_shim.c -- TEMPORARY SHIM (see batch_shim.h): kvs_batch_decode as a
 * loop over kvs_session_decode, kvs_session_extend as decode token by token.
 * Results equal the contract's (which is bit-identical to kvs_session_decode);
 * speed does not. Delete with batch_shim.h once the engine branch is merged.
 */
#include "batch_shim.h"

#include <stdlib.h>

struct kvs_batch {
    const kvs_model *m;
    int max_seqs;
};

kvs_status kvs_batch_new(kvs_model *m, int max_seqs, int n_threads, kvs_batch **out, kvs_err *err) {
    (void)n_threads;
    *out = NULL;
    if (max_seqs < 1) return kvs_errorf(err, KVS_ERR_INVALID, "batch: max_seqs must be >= 1, got %d", max_seqs);
    kvs_batch *b = calloc(1, sizeof *b);
    if (!b) return kvs_errorf(err, KVS_ERR_NOMEM, "batch: out of memory");
    b->m = m;
    b->max_seqs = max_seqs;
    *out = b;
    return KVS_OK;
}

void kvs_batch_free(kvs_batch *b) { free(b); }

kvs_status kvs_batch_decode(kvs_batch *b, kvs_session *const *ss, const int32_t *tokens, int n,
                            float *logits, kvs_err *err) {
    if (n < 1 || n > b->max_seqs)
        return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: %d sequences, batch holds 1..%d", n, b->max_seqs);
    for (int i = 0; i < n; i++) {
        if (kvs_session_model(ss[i]) != b->m)
            return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: session %d is of another model", i);
        if (kvs_session_n_past(ss[i]) >= kvs_session_n_ctx(ss[i]))
            return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: session %d: context full (%d)", i,
                              kvs_session_n_ctx(ss[i]));
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: session %d repeats %d", i, j);
    }
    const size_t V = (size_t)kvs_model_get_info(b->m)->n_vocab;
    for (int i = 0; i < n; i++) {
        kvs_status st = kvs_session_decode(ss[i], tokens[i], logits ? logits + (size_t)i * V : NULL, err);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

kvs_status kvs_session_extend(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err) {
    if (n < 1) return kvs_errorf(err, KVS_ERR_INVALID, "extend: n must be >= 1, got %d", n);
    if (kvs_session_n_past(s) + n > kvs_session_n_ctx(s))
        return kvs_errorf(err, KVS_ERR_INVALID, "extend: %d tokens at %d exceed the context of %d", n,
                          kvs_session_n_past(s), kvs_session_n_ctx(s));
    for (int i = 0; i < n; i++) {
        kvs_status st = kvs_session_decode(s, tokens[i], i == n - 1 ? logits : NULL, err);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}
