/*
 * server.c -- lifecycle, routing, slots, metrics and the small endpoints.
 *
 * What it is: kvs_server_start / stop (drain), the request router, the slot
 * queue, Prometheus /metrics, /health, /v1/models, /tokenize, /detokenize.
 * What it is not: generation and the kv_compression extension (server_gen.c),
 * request errors and JSON helpers (request.c), slots and counters (counters.c),
 * the HTTP transport (http.c), signal handling (cli/cmd_serve.c).
 */
#include "server_internal.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* compress_ms histogram bucket upper bounds; the last bucket is +Inf. */
static const double hist_le[SRV_HIST_BUCKETS - 1] = SRV_HIST_LE;

static const char *const ep_paths[EP_COUNT] = {"/health",     "/v1/models",     "/metrics",
                                               "/tokenize",   "/detokenize",    "/completion",
                                               "/v1/completions", "/v1/chat/completions",
                                               "/kv/dump",    "/tokenizer_info", "other"};
static const char *const ep_methods[EP_COUNT] = {"GET",  "GET",  "GET",  "POST", "POST",
                                                 "POST", "POST", "POST", "POST", "GET", ""};

void kvs_server_config_defaults(kvs_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->slots = 4;
    c->threads = 0;
    c->n_ctx = 0;
    c->max_conn = 512;
    c->max_body = (size_t)64 << 20;
    c->alias = NULL;
    c->queue = 64;
    c->batch = 64;
    c->n_predict_max = 4096;
    c->drain_timeout_s = 10.0;
}

/* ---- small endpoints -------------------------------------------------------- */

static void handle_health(kvs_server *s, kvs_http_response *rs) {
    pthread_mutex_lock(&s->mu);
    int draining = s->draining, free_slots = s->slots_free, waiting = s->waiting;
    pthread_mutex_unlock(&s->mu);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", draining ? "draining" : "ok");
    cJSON_AddNumberToObject(root, "slots_idle", free_slots);
    cJSON_AddNumberToObject(root, "slots_processing", s->cfg.slots - free_slots);
    cJSON_AddNumberToObject(root, "requests_waiting", waiting);
    /* what requests without kv_compression get (null: none) */
    cJSON_AddItemToObject(root, "kv_compression", s->default_kc ? cJSON_Duplicate(s->default_kc, 1) : cJSON_CreateNull());
    srv_json_response(rs, draining ? 503 : 200, root);
}

static void handle_models(kvs_server *s, kvs_http_response *rs) {
    const kvs_model_info *in = s->info;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", s->alias);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started_unix);
    cJSON_AddStringToObject(m, "owned_by", "kvsieve");
    /* per-variant kv_compression fields beyond the basics, so clients know what they may send */
    cJSON *kf = cJSON_AddArrayToObject(m, "kv_compression_fields");
    cJSON_AddItemToArray(kf, cJSON_CreateString("suffix"));
    cJSON_AddItemToArray(kf, cJSON_CreateString("compress_suffix"));
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "arch", in->arch);
    cJSON_AddStringToObject(meta, "name", in->name);
    cJSON_AddStringToObject(meta, "path", in->path);
    cJSON_AddNumberToObject(meta, "n_vocab", in->n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", in->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", s->cfg.n_ctx);
    cJSON_AddNumberToObject(meta, "n_embd", in->n_embd);
    cJSON_AddNumberToObject(meta, "n_layer", in->n_layers);
    cJSON_AddNumberToObject(meta, "n_head", in->n_heads);
    cJSON_AddNumberToObject(meta, "n_head_kv", in->n_kv_heads);
    cJSON_AddNumberToObject(meta, "head_dim", in->head_dim);
    cJSON_AddNumberToObject(meta, "sliding_window", in->sliding_window);
    cJSON_AddNumberToObject(meta, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(meta, "size", (double)in->file_size);
    cJSON_AddNumberToObject(meta, "step_bytes", (double)in->step_bytes); /* ours: weights a decode step reads */
    cJSON_AddStringToObject(meta, "weight_types", in->weight_types);
    cJSON_AddNumberToObject(meta, "slots", s->cfg.slots);
    /* cache_type: the one type of K and V, or "K/V" where they differ */
    const int ctk = s->cfg.cache_type, ctv = s->cfg.cache_type_v ? s->cfg.cache_type_v - 1 : ctk;
    char ct[32];
    snprintf(ct, sizeof ct, ctk == ctv ? "%s" : "%s/%s", kvs_cache_type_name(ctk), kvs_cache_type_name(ctv));
    cJSON_AddStringToObject(meta, "cache_type", ct);
    cJSON_AddStringToObject(meta, "cache_type_k", kvs_cache_type_name(ctk));
    cJSON_AddStringToObject(meta, "cache_type_v", kvs_cache_type_name(ctv));
    cJSON_AddItemToObject(meta, "kv_compression", s->default_kc ? cJSON_Duplicate(s->default_kc, 1) : cJSON_CreateNull());
    srv_json_response(rs, 200, root);
}

void srv_handle_tokenize(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs) {
    srv_error e = {0};
    kvs_err err = {0};
    int32_t *toks = NULL;
    int n = 0;
    char *piece = NULL;
    cJSON *root = srv_parse_body(rq, &e), *out = NULL;
    if (!root) goto fail;
    /* llama-server's {content, add_special=false} or vLLM's {prompt,
     * add_special_tokens=true} (then the answer also has count and max_model_len) */
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const char *text_field = "content";
    int vllm = !content && cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (vllm) {
        content = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        text_field = "prompt";
    }
    if (!content) {
        srv_fail(&e, 400, "content", "content (llama-server) or prompt (vLLM) is required (the text to tokenize)");
        goto fail;
    }
    if (!cJSON_IsString(content)) {
        srv_fail(&e, 400, text_field, "%s must be a string", text_field);
        goto fail;
    }
    int add_special, with_pieces, parse_special;
    if (srv_get_bool(root, vllm ? "add_special_tokens" : "add_special", "", vllm, &add_special, &e) ||
        srv_get_bool(root, "with_pieces", "", 0, &with_pieces, &e) ||
        srv_get_bool(root, "parse_special", "", 1, &parse_special, &e))
        goto fail;
    int add_bos = add_special && kvs_model_special(s->model)->add_bos;
    if (kvs_tokenize(s->model, content->valuestring, strlen(content->valuestring), add_bos,
                     parse_special, &toks, &n, &err) != KVS_OK) {
        srv_fail_kvs(&e, &err, text_field);
        goto fail;
    }
    out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    if (vllm) {
        cJSON_AddNumberToObject(out, "count", n);
        cJSON_AddNumberToObject(out, "max_model_len", s->cfg.n_ctx);
    }
    int cap = 64;
    piece = malloc((size_t)cap + 1);
    if (!piece) {
        srv_fail(&e, 500, "", "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (!with_pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(toks[i]));
            continue;
        }
        int len = kvs_token_to_piece(s->model, toks[i], 1, piece, cap);
        if (len > cap) {
            char *np = realloc(piece, (size_t)len + 1);
            if (!np) {
                srv_fail(&e, 500, "", "out of memory");
                goto fail;
            }
            piece = np;
            cap = len;
            len = kvs_token_to_piece(s->model, toks[i], 1, piece, cap);
        }
        if (len < 0) len = 0;
        piece[len] = '\0';
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", toks[i]);
        if (srv_utf8_valid(piece, (size_t)len) && (size_t)len == strlen(piece)) {
            cJSON_AddStringToObject(t, "piece", piece);
        } else { /* a partial UTF-8 sequence (byte token): its bytes */
            cJSON *b = cJSON_AddArrayToObject(t, "piece");
            for (int j = 0; j < len; j++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)piece[j]));
        }
        cJSON_AddItemToArray(arr, t);
    }
    free(piece);
    free(toks);
    cJSON_Delete(root);
    srv_json_response(rs, 200, out);
    return;
fail:
    free(piece);
    free(toks);
    cJSON_Delete(root);
    cJSON_Delete(out);
    srv_error_response(rs, &e);
}

void srv_handle_detokenize(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs) {
    srv_error e = {0};
    kvs_err err = {0};
    int32_t *toks = NULL;
    char *text = NULL, *clean = NULL;
    cJSON *root = srv_parse_body(rq, &e);
    if (!root) goto fail;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!arr) {
        srv_fail(&e, 400, "tokens", "tokens is required (an array of token ids)");
        goto fail;
    }
    if (!cJSON_IsArray(arr)) {
        srv_fail(&e, 400, "tokens", "tokens must be an array of token ids");
        goto fail;
    }
    int n = cJSON_GetArraySize(arr);
    toks = malloc((size_t)(n > 0 ? n : 1) * sizeof *toks);
    if (!toks) {
        srv_fail(&e, 500, "", "out of memory");
        goto fail;
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char f[64];
        snprintf(f, sizeof f, "tokens[%d]", i);
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble)) {
            srv_fail(&e, 400, f, "%s must be an integer token id", f);
            goto fail;
        }
        if (it->valuedouble < 0 || it->valuedouble >= s->info->n_vocab) {
            srv_fail(&e, 400, f, "%s = %.17g is not a token id (vocabulary has %d)", f, it->valuedouble,
                     s->info->n_vocab);
            goto fail;
        }
        toks[i++] = (int32_t)it->valuedouble;
    }
    if (kvs_detokenize(s->model, toks, n, 0, &text, &err) != KVS_OK) {
        srv_fail_kvs(&e, &err, "tokens");
        goto fail;
    }
    clean = srv_utf8_clean(text, strlen(text));
    if (!clean) {
        srv_fail(&e, 500, "", "out of memory");
        goto fail;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", clean); /* llama-server's name */
    cJSON_AddStringToObject(out, "prompt", clean);  /* vLLM's */
    free(clean);
    free(text);
    free(toks);
    cJSON_Delete(root);
    srv_json_response(rs, 200, out);
    return;
fail:
    free(clean);
    free(text);
    free(toks);
    cJSON_Delete(root);
    srv_error_response(rs, &e);
}

/* A special token's text and id under the names vLLM's /tokenizer_info
 * uses (<name>_token, <name>_token_id; null when the model has none). */
static void add_special(cJSON *o, const kvs_model *m, const char *name, int32_t id) {
    char key[32];
    const char *text = id >= 0 ? kvs_token_text(m, id) : NULL;
    snprintf(key, sizeof key, "%s_token", name);
    if (text) cJSON_AddStringToObject(o, key, text);
    else cJSON_AddNullToObject(o, key);
    snprintf(key, sizeof key, "%s_token_id", name);
    if (text) cJSON_AddNumberToObject(o, key, id);
    else cJSON_AddNullToObject(o, key);
}

/* GET /tokenizer_info, as vLLM answers it and lm-evaluation-harness's remote
 * tokenizer reads it (eos_token, bos_token, pad_token as text; lm-eval
 * finds their ids by tokenizing that text, which /tokenize maps back to the
 * control token). No chat_template: the server applies the family's
 * template itself (/v1/chat/completions). */
static void handle_tokenizer_info(kvs_server *s, kvs_http_response *rs) {
    const kvs_special_tokens *sp = kvs_model_special(s->model);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "tokenizer_class", "gguf");
    add_special(root, s->model, "eos", sp->eos);
    add_special(root, s->model, "bos", sp->bos);
    add_special(root, s->model, "pad", sp->pad);
    add_special(root, s->model, "unk", sp->unk);
    add_special(root, s->model, "eot", sp->eot);
    cJSON_AddBoolToObject(root, "add_bos_token", sp->add_bos && sp->bos >= 0);
    cJSON_AddNumberToObject(root, "vocab_size", s->info->n_vocab);
    cJSON_AddNumberToObject(root, "model_max_length", s->cfg.n_ctx);
    cJSON_AddNumberToObject(root, "max_model_len", s->cfg.n_ctx);
    srv_json_response(rs, 200, root);
}

/* Append printf output to a growing buffer; on allocation failure the buffer
 * is left as is and *ok is cleared. */
typedef struct {
    char *buf;
    size_t len, cap;
    int ok;
} textbuf;

static void tb_printf(textbuf *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void tb_printf(textbuf *t, const char *fmt, ...) {
    if (!t->ok) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->ok = 0;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)n;
        char *nb = realloc(t->buf, cap);
        if (!nb) {
            t->ok = 0;
            return;
        }
        t->buf = nb;
        t->cap = cap;
    }
}

static void handle_metrics(kvs_server *s, kvs_http_response *rs) {
    srv_metrics m;
    int waiting, processing, live;
    pthread_mutex_lock(&s->mu);
    m = s->m;
    waiting = s->waiting;
    processing = s->processing;
    live = s->live_seqs;
    pthread_mutex_unlock(&s->mu);
    textbuf t = {malloc(4096), 0, 4096, 1};
    if (!t.buf) t.ok = 0;
    tb_printf(&t, "# HELP kvsieve_requests_total HTTP requests received, by endpoint.\n"
                  "# TYPE kvsieve_requests_total counter\n");
    for (int i = 0; i < EP_COUNT; i++)
        tb_printf(&t, "kvsieve_requests_total{endpoint=\"%s\"} %llu\n", ep_paths[i],
                  (unsigned long long)m.requests[i]);
    tb_printf(&t, "# HELP kvsieve_request_errors_total Requests answered with an error, by endpoint and class.\n"
                  "# TYPE kvsieve_request_errors_total counter\n");
    for (int i = 0; i < EP_COUNT; i++) {
        tb_printf(&t, "kvsieve_request_errors_total{endpoint=\"%s\",class=\"4xx\"} %llu\n", ep_paths[i],
                  (unsigned long long)m.errors_4xx[i]);
        tb_printf(&t, "kvsieve_request_errors_total{endpoint=\"%s\",class=\"5xx\"} %llu\n", ep_paths[i],
                  (unsigned long long)m.errors_5xx[i]);
    }
    tb_printf(&t,
              "# HELP kvsieve_prefills_total Prompt prefills run (variants of one request share one).\n"
              "# TYPE kvsieve_prefills_total counter\n"
              "kvsieve_prefills_total %llu\n"
              "# HELP kvsieve_compressions_total KV-cache compressions run.\n"
              "# TYPE kvsieve_compressions_total counter\n"
              "kvsieve_compressions_total %llu\n"
              "# HELP kvsieve_prompt_tokens_total Prompt tokens prefilled.\n"
              "# TYPE kvsieve_prompt_tokens_total counter\n"
              "kvsieve_prompt_tokens_total %llu\n"
              "# HELP kvsieve_predicted_tokens_total Tokens generated.\n"
              "# TYPE kvsieve_predicted_tokens_total counter\n"
              "kvsieve_predicted_tokens_total %llu\n"
              "# HELP kvsieve_prompt_ms_total Milliseconds spent in prefill.\n"
              "# TYPE kvsieve_prompt_ms_total counter\n"
              "kvsieve_prompt_ms_total %.3f\n"
              "# HELP kvsieve_predicted_ms_total Milliseconds spent generating.\n"
              "# TYPE kvsieve_predicted_ms_total counter\n"
              "kvsieve_predicted_ms_total %.3f\n"
              "# HELP kvsieve_requests_rejected_draining_total Requests refused while draining.\n"
              "# TYPE kvsieve_requests_rejected_draining_total counter\n"
              "kvsieve_requests_rejected_draining_total %llu\n",
              (unsigned long long)m.prefills, (unsigned long long)m.compressions,
              (unsigned long long)m.prompt_tokens, (unsigned long long)m.predicted_tokens, m.prompt_ms,
              m.predicted_ms, (unsigned long long)m.rejected_draining);
    tb_printf(&t, "# HELP kvsieve_compress_ms Time from end of prefill to start of decode, per compression.\n"
                  "# TYPE kvsieve_compress_ms histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < SRV_HIST_BUCKETS; b++) {
        cum += m.compress_bucket[b];
        if (b < SRV_HIST_BUCKETS - 1)
            tb_printf(&t, "kvsieve_compress_ms_bucket{le=\"%g\"} %llu\n", hist_le[b], (unsigned long long)cum);
        else
            tb_printf(&t, "kvsieve_compress_ms_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    tb_printf(&t, "kvsieve_compress_ms_sum %.6f\nkvsieve_compress_ms_count %llu\n", m.compress_sum_ms,
              (unsigned long long)m.compress_count);
    tb_printf(&t,
              "# HELP kvsieve_slots Configured slots (requests computed at once).\n"
              "# TYPE kvsieve_slots gauge\n"
              "kvsieve_slots %d\n"
              "# HELP kvsieve_requests_processing Requests holding a slot.\n"
              "# TYPE kvsieve_requests_processing gauge\n"
              "kvsieve_requests_processing %d\n"
              "# HELP kvsieve_requests_waiting Requests waiting for a slot (queue depth).\n"
              "# TYPE kvsieve_requests_waiting gauge\n"
              "kvsieve_requests_waiting %d\n"
              "# HELP kvsieve_queue_capacity Requests that may wait beyond the free slots (--queue).\n"
              "# TYPE kvsieve_queue_capacity gauge\n"
              "kvsieve_queue_capacity %d\n"
              "# HELP kvsieve_batch_size Sequences (variants of running requests) in the decode batch now.\n"
              "# TYPE kvsieve_batch_size gauge\n"
              "kvsieve_batch_size %d\n"
              "# HELP kvsieve_batch_capacity Sequences decoded together at most (--batch).\n"
              "# TYPE kvsieve_batch_capacity gauge\n"
              "kvsieve_batch_capacity %d\n"
              "# HELP kvsieve_batch_steps_total Decode steps (one kvs_batch_decode call each).\n"
              "# TYPE kvsieve_batch_steps_total counter\n"
              "kvsieve_batch_steps_total %llu\n"
              "# HELP kvsieve_batch_seq_steps_total Sum of the batch sizes of all steps.\n"
              "# TYPE kvsieve_batch_seq_steps_total counter\n"
              "kvsieve_batch_seq_steps_total %llu\n"
              "# HELP kvsieve_requests_rejected_queue_full_total Requests answered 503 because the queue was full.\n"
              "# TYPE kvsieve_requests_rejected_queue_full_total counter\n"
              "kvsieve_requests_rejected_queue_full_total %llu\n"
              "# HELP kvsieve_requests_cancelled_total Requests cancelled before they completed, by reason.\n"
              "# TYPE kvsieve_requests_cancelled_total counter\n"
              "kvsieve_requests_cancelled_total{reason=\"disconnect\"} %llu\n"
              "kvsieve_requests_cancelled_total{reason=\"shutdown\"} %llu\n",
              s->cfg.slots, processing, waiting, s->cfg.queue, live, s->cfg.batch,
              (unsigned long long)m.batch_steps, (unsigned long long)m.batch_seq_steps,
              (unsigned long long)m.rejected_queue_full,
              (unsigned long long)m.cancelled[SRV_CANCEL_DISCONNECT],
              (unsigned long long)m.cancelled[SRV_CANCEL_SHUTDOWN]);
    if (!t.ok) {
        free(t.buf);
        srv_error e;
        srv_fail(&e, 500, "", "out of memory while formatting metrics");
        srv_error_response(rs, &e);
        return;
    }
    rs->status = 200;
    rs->body = t.buf;
    rs->len = t.len;
    rs->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

/* ---- routing ------------------------------------------------------------------ */

static int route(const char *path) {
    for (int i = 0; i < EP_OTHER; i++)
        if (strcmp(path, ep_paths[i]) == 0) return i;
    if (strcmp(path, "/v1/health") == 0) return EP_HEALTH;
    if (strcmp(path, "/models") == 0) return EP_MODELS;
    if (strcmp(path, "/completions") == 0) return EP_V1_COMPLETIONS;
    if (strcmp(path, "/chat/completions") == 0) return EP_V1_CHAT;
    return EP_OTHER;
}

/* 1 if a equals b, in time that depends on their lengths only (no early exit
 * on the first differing byte, so the key cannot be guessed byte by byte). */
static int same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (nb ? nb : 1)];
    return diff == 0;
}

/* The key the client presented: `Authorization: Bearer KEY` (the scheme in
 * any case), else the X-Api-Key header; NULL if neither. */
static const char *presented_key(const kvs_http_request *rq) {
    const char *a = rq->authorization;
    if (a && a[0]) {
        if (strncasecmp(a, "Bearer ", 7) != 0) return "";
        a += 7;
        while (*a == ' ') a++;
        return a;
    }
    return rq->x_api_key;
}

static void on_request(void *user, const kvs_http_request *rq, kvs_http_response *rs) {
    kvs_server *s = user;
    int ep = route(rq->path);
    srv_error e = {0};
    if (s->api_key && ep != EP_HEALTH) {
        const char *k = presented_key(rq);
        if (!k || !same_secret(k, s->api_key)) {
            srv_fail(&e, 401, "authorization",
                     k ? "invalid API key" : "missing API key (send the header `Authorization: Bearer KEY`)");
            srv_error_response(rs, &e);
            pthread_mutex_lock(&s->mu);
            s->m.requests[ep]++;
            s->m.errors_4xx[ep]++;
            pthread_mutex_unlock(&s->mu);
            return;
        }
    }
    pthread_mutex_lock(&s->mu);
    s->m.requests[ep]++;
    int draining = s->draining;
    if (draining) s->m.rejected_draining++;
    else s->in_flight++;
    pthread_mutex_unlock(&s->mu);
    if (draining) {
        srv_fail(&e, 503, "", "server is shutting down");
        srv_error_response(rs, &e);
        return;
    }
    if (ep == EP_OTHER) {
        srv_fail(&e, 404, "path", "no endpoint %s %s (known: GET /health, GET /v1/models, GET /metrics, "
                 "GET /tokenizer_info, POST /tokenize, /detokenize, /completion, /v1/completions, /v1/chat/completions, /kv/dump)",
                 rq->method, rq->path);
        srv_error_response(rs, &e);
    } else if (strcmp(rq->method, ep_methods[ep]) != 0) {
        srv_fail(&e, 405, "method", "%s takes %s, not %s", ep_paths[ep], ep_methods[ep], rq->method);
        srv_error_response(rs, &e);
    } else {
        switch (ep) {
        case EP_HEALTH: handle_health(s, rs); break;
        case EP_MODELS: handle_models(s, rs); break;
        case EP_METRICS: handle_metrics(s, rs); break;
        case EP_TOKENIZE: srv_handle_tokenize(s, rq, rs); break;
        case EP_TOKENIZER_INFO: handle_tokenizer_info(s, rs); break;
        case EP_DETOKENIZE: srv_handle_detokenize(s, rq, rs); break;
        case EP_KV_DUMP: srv_handle_kv_dump(s, rq, rs); break;
        default: srv_handle_generate(s, ep, rq, rs); break;
        }
    }
    pthread_mutex_lock(&s->mu);
    if (rs->status >= 500) s->m.errors_5xx[ep]++;
    else if (rs->status >= 400) s->m.errors_4xx[ep]++;
    /* status 0: the client hung up (counted as a cancellation) */
    s->in_flight--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- lifecycle ------------------------------------------------------------------ */

kvs_status kvs_server_start(kvs_model *model, const kvs_server_config *cfg, kvs_server **out,
                            kvs_err *err) {
    *out = NULL;
    if (!model) return kvs_errorf(err, KVS_ERR_INVALID, "server: no model");
    if (cfg->slots < 1 || cfg->slots > 256)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: slots must be in [1, 256], got %d", cfg->slots);
    if (cfg->max_conn < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: max_conn must be >= 1, got %d", cfg->max_conn);
    if (cfg->max_body < 1024)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: max_body must be >= 1024 bytes");
    if (cfg->queue < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: queue must be >= 0, got %d", cfg->queue);
    if (cfg->batch < 1 || cfg->batch > 4096)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: batch must be in [1, 4096], got %d", cfg->batch);
    if (strcmp(kvs_cache_type_name(cfg->cache_type), "?") == 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: unknown cache type %d (f16, bf16, f32, q8_0, q4_0)",
                          cfg->cache_type);
    if (cfg->cache_type_v && strcmp(kvs_cache_type_name(cfg->cache_type_v - 1), "?") == 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: unknown V cache type %d (f16, bf16, f32, q8_0, q4_0)",
                          cfg->cache_type_v - 1);
    if (cfg->n_predict_max < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: n_predict_max must be >= 1, got %d", cfg->n_predict_max);
    if (!(cfg->drain_timeout_s >= 0) || cfg->drain_timeout_s > 86400)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: drain timeout must be in [0, 86400] s, got %g",
                          cfg->drain_timeout_s);
    const kvs_model_info *mi = kvs_model_get_info(model);
    if (cfg->n_ctx > mi->n_ctx_train && mi->n_ctx_train > 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "server: ctx %d exceeds the model's context length %d (%s)",
                          cfg->n_ctx, mi->n_ctx_train, mi->name);
    kvs_server *s = calloc(1, sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "server: no memory");
    s->model = model;
    s->info = kvs_model_get_info(model);
    s->cfg = *cfg;
    snprintf(s->host, sizeof s->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
    s->cfg.host = s->host;
    snprintf(s->alias, sizeof s->alias, "%s", cfg->alias && cfg->alias[0] ? cfg->alias : s->info->name);
    s->cfg.alias = s->alias;
    if (cfg->api_key && cfg->api_key[0]) {
        s->api_key = strdup(cfg->api_key);
        if (!s->api_key) {
            free(s);
            return kvs_errorf(err, KVS_ERR_NOMEM, "server: no memory");
        }
    }
    s->cfg.api_key = s->api_key;
    if (s->cfg.n_ctx <= 0) {
        /* the session default, resolved once so /v1/models and the length check agree */
        s->cfg.n_ctx = s->info->n_ctx_train > 0 && s->info->n_ctx_train < 8192 ? s->info->n_ctx_train : 8192;
    }
    if (cfg->kv_compression && cfg->kv_compression[0]) {
        /* the default kv_compression: parsed and checked once, as a request's would be */
        srv_error e = {0};
        gen_req g;
        memset(&g, 0, sizeof g);
        s->default_kc = cJSON_Parse(cfg->kv_compression);
        if (!s->default_kc) srv_fail(&e, 400, "kv_compression", "kv_compression: not valid JSON");
        else srv_parse_kv_compression(s, s->default_kc, &g, &e);
        srv_variants_free(&g);
        if (e.status) {
            cJSON_Delete(s->default_kc);
            free(s->api_key);
            free(s);
            return kvs_errorf(err, KVS_ERR_INVALID, "server: default %s", e.msg);
        }
    }
    s->cfg.kv_compression = NULL; /* the text is the caller's; default_kc holds it */
    s->slots_free = cfg->slots;
    s->started_unix = time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    kvs_status st = srv_sched_start(s, err);
    if (st == KVS_OK) {
        st = kvs_http_start(s->host, cfg->port, cfg->max_conn, cfg->max_body, on_request, s, &s->http, err);
        if (st != KVS_OK) srv_sched_stop(s);
    }
    if (st != KVS_OK) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        cJSON_Delete(s->default_kc);
        free(s->api_key);
        free(s);
        return st;
    }
    *out = s;
    return KVS_OK;
}

int kvs_server_port(const kvs_server *s) { return kvs_http_port(s->http); }

void kvs_server_stop(kvs_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_mutex_unlock(&s->mu);
    kvs_http_quiesce(s->http);
    /* handlers first, then their responses on the wire, both until the drain
     * deadline; then whatever is left is cancelled (503) and we wait for the
     * handlers to return (within a decode step, or a prefill under way) */
    const double deadline = kvs_now_ms() + 1e3 * s->cfg.drain_timeout_s;
    int cancelled = 0;
    pthread_mutex_lock(&s->mu);
    while (s->in_flight > 0) {
        double left = deadline - kvs_now_ms();
        if (left <= 0 && !cancelled) {
            pthread_mutex_unlock(&s->mu);
            srv_sched_cancel_all(s);
            pthread_mutex_lock(&s->mu);
            cancelled = 1;
            continue;
        }
        if (cancelled) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(left * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    /* responses still unsent by then (a client that does not read) are cut */
    double wire = deadline - kvs_now_ms();
    kvs_http_drain(s->http, kvs_now_ms() + (wire > 1000 ? wire : 1000));
    kvs_http_stop(s->http);
    srv_sched_stop(s);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    cJSON_Delete(s->default_kc);
    free(s->api_key);
    free(s);
}
