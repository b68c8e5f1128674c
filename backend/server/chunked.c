/*
 * chunked.c -- kv_compression.chunk: chunked prefill compression.
 *
 * What it is: the prompt enters the session C tokens at a time and the cache
 * is compressed after each chunk (the last one included), as StreamingLLM's
 * perplexity runs and kvpress's chunked presses do, so that later positions
 * are computed, and scored, over a cache the method already compressed.
 * Budget: after a chunk ending at position `seen`, every compressed layer
 * keeps srv_chunk_budget(v, seen) rows per KV head (tokens, or floor(ratio *
 * seen)): with a ratio the cache holds the same share of what was seen at
 * every step, and after the last chunk the same count as one compression of
 * the whole prompt, so chunk >= the prompt length is the unchunked request.
 * A compression is skipped when the layers already hold no more rows.
 * Queries: a method that observes queries sees those of the chunk's last
 * positions (what it wants for the rows held, at most the chunk), attending
 * over the rows held (the earlier chunks' kept rows and the chunk).
 * What it is not: the scheduling (sched.c and logprobs.c call it), methods
 * whose budgets differ per layer or per KV head after a compression (the
 * second compression fails with the backend's KVS_ERR_UNSUPPORTED message).
 */
#include "server_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int srv_chunk_budget(const variant_req *v, int seen) {
    long long k = v->budget.tokens > 0 ? v->budget.tokens : (long long)floor(v->budget.ratio * (double)seen);
    if (k > seen) k = seen;
    return k < 1 ? 1 : (int)k;
}

void srv_chunk_log_free(srv_chunk_log *log) {
    free(log->rows);
    memset(log, 0, sizeof *log);
}

static int log_push(srv_chunk_log *log, int seen, int before, int after) {
    if (log->n == log->cap) {
        int cap = log->cap ? 2 * log->cap : 16;
        int *r = realloc(log->rows, (size_t)cap * 3 * sizeof *r);
        if (!r) return -1;
        log->rows = r;
        log->cap = cap;
    }
    int *r = log->rows + (size_t)log->n++ * 3;
    r[0] = seen;
    r[1] = before;
    r[2] = after;
    return 0;
}

/* Rows the first layer the method compresses holds now (every compressed layer holds as many). */
static int rows_held(const kvs_session *ses, int compress_local) {
    kvs_kv_stats st;
    kvs_session_kv_stats(ses, &st);
    for (int l = 0; l < st.n_layers; l++)
        if (compress_local || !st.is_local[l]) return (int)st.tokens_after[l];
    return 0;
}

kvs_status srv_chunked_prefill(const kvs_server *s, kvs_session *ses, const variant_req *v, const int32_t *toks,
                               int n, srv_pos_fn each, void *user, float *logits, srv_chunk_log *log, kvs_err *err) {
    const int C = v->chunk > 0 ? v->chunk : n;
    const int compress = v->method && strcmp(v->method->name, "full") != 0;
    kvs_compress_opts co = srv_variant_compress_opts(s, v); /* its budget is set per chunk below */
    kvs_status st = KVS_OK;
    int held = 0; /* rows the compressed layers hold before the chunk */
    for (int a = 0, b; a < n; a = b) {
        b = n - a < C ? n : a + C;
        /* a last chunk shorter than the queries the method observes joins this one */
        if (compress && b < n && !(v->method->needs & KVS_NEED_Q_ALL) &&
            kvs_method_queries_needed(v->method, &v->params, srv_chunk_budget(v, b) + (n - b)) > n - b)
            b = n;
        if (compress) { /* the queries the method observes: the chunk's last ones */
            int nq = kvs_method_queries_needed(v->method, &v->params, held + (b - a));
            if (nq > b - a && (v->method->needs & KVS_NEED_Q_ALL))
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s.chunk: method %s observes the queries of every position, which no chunk holds "
                                  "after the first; it cannot be chunked", v->field, v->method->name);
            if (nq > b - a)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s.chunk: method %s observes the last %d queries, more than a chunk of %d "
                                  "positions holds; use chunk >= %d", v->field, v->method->name, nq, b - a,
                                  kvs_method_queries_needed(v->method, &v->params, n));
            if ((st = kvs_session_record_window(ses, b, nq, err))) return st;
        }
        if (!each) {
            st = a == 0 ? kvs_session_prefill(ses, toks, b, NULL, logits, err)
                        : kvs_session_extend(ses, toks + a, b - a, logits, err);
        } else {
            for (int i = a; i < b && !st; i++) {
                if (i == 0) {
                    st = kvs_session_prefill(ses, toks, 1, NULL, logits, err);
                } else {
                    each(user, i, logits);
                    st = kvs_session_decode(ses, toks[i], logits, err);
                }
            }
        }
        if (st) return st;
        if (!compress) continue;
        held = rows_held(ses, v->compress_local);
        co.budget.ratio = 0;
        co.budget.tokens = srv_chunk_budget(v, b);
        if (held > co.budget.tokens) {
            kvs_kv_stats cs;
            const int before = held;
            if ((st = kvs_session_recompress(ses, &co, &cs, err))) {
                kvs_err_prefix(err, "%s.chunk: chunk ending at position %d", v->field, b);
                /* a method whose plan cannot be compressed again is the request's choice (400) */
                if (st == KVS_ERR_UNSUPPORTED) st = err->code = KVS_ERR_INVALID;
                return st;
            }
            log->compress_ms += cs.compress_ms;
            held = rows_held(ses, v->compress_local);
            if (log_push(log, b, before, held)) return kvs_errorf(err, KVS_ERR_NOMEM, "chunked prefill: out of memory");
        } else if ((st = kvs_session_record_window(ses, 0, 0, err))) {
            return st;
        }
    }
    return KVS_OK;
}

void srv_chunk_stats(const kvs_session *ses, int n, kvs_kv_stats *st) {
    kvs_session_kv_stats(ses, st);
    st->n_prompt = n;
    st->bytes_before_total = st->bytes_before_global = st->bytes_before_local = 0;
    for (int l = 0; l < st->n_layers; l++) {
        /* a prompt row's bytes, from the layer's uncompressed statistics */
        int64_t row = st->tokens_before[l] > 0 ? st->bytes_before[l] / st->tokens_before[l] : 0;
        st->tokens_before[l] = n;
        st->bytes_before[l] = row * n;
        st->bytes_before_total += row * n;
        if (st->is_local[l]) st->bytes_before_local += row * n;
        else st->bytes_before_global += row * n;
    }
}
