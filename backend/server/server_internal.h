/*
 * server_internal.h -- what the files of backend/server/ share (private).
 *
 * What it is: the server struct (slots, queue, drain state, metrics under one
 * mutex), the parsed generation request and its per-variant output, the
 * scheduler's entry points, request errors that name a JSON field, JSON
 * response helpers and the typed JSON getters used to validate request bodies.
 * What it is not: a public API; nothing outside backend/server includes it.
 */
#ifndef KVS_SERVER_INTERNAL_H
#define KVS_SERVER_INTERNAL_H

#include "kvs_http.h"
#include "kvs_server.h"

#include <cjson/cJSON.h>
#include "kvs_sampling.h"
#include "kvsieve_methods.h"

#include <pthread.h>
#include <stdint.h>
#include <time.h>

enum {
    EP_HEALTH,
    EP_MODELS,
    EP_METRICS,
    EP_TOKENIZE,
    EP_DETOKENIZE,
    EP_COMPLETION,
    EP_V1_COMPLETIONS,
    EP_V1_CHAT,
    EP_KV_DUMP,
    EP_TOKENIZER_INFO,
    EP_OTHER,
    EP_COUNT
};

#define SRV_HIST_BUCKETS 13 /* compress_ms upper bounds, +Inf last */
/* The upper bounds of its first SRV_HIST_BUCKETS - 1 buckets, ms (counters.c
 * counts, server.c prints). */
#define SRV_HIST_LE {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000}

enum { SRV_CANCEL_DISCONNECT = 1, SRV_CANCEL_SHUTDOWN = 2, SRV_CANCEL_REASONS = 3 };

typedef struct {
    uint64_t requests[EP_COUNT];
    uint64_t errors_4xx[EP_COUNT], errors_5xx[EP_COUNT];
    uint64_t prompt_tokens, predicted_tokens, prefills, compressions, rejected_draining;
    uint64_t rejected_queue_full;               /* 503 + Retry-After: the queue was full */
    uint64_t cancelled[SRV_CANCEL_REASONS];     /* by reason (index 0 unused) */
    uint64_t batch_steps, batch_seq_steps;      /* decode steps; sum of their batch sizes */
    double prompt_ms, predicted_ms;
    uint64_t compress_bucket[SRV_HIST_BUCKETS]; /* per bucket (not cumulative) */
    uint64_t compress_count;
    double compress_sum_ms;
} srv_metrics;

/* A request error: HTTP status, the JSON field concerned ("" if none). */
typedef struct {
    int status;
    int retry_after; /* > 0: sent as Retry-After (seconds) */
    char field[192];
    char msg[768];
} srv_error;

typedef struct srv_job srv_job;
typedef struct srv_sched srv_sched;

struct kvs_server {
    kvs_model *model;
    const kvs_model_info *info;
    kvs_server_config cfg;
    char host[256];
    char alias[128];
    char *api_key; /* malloc'd copy of cfg.api_key, or NULL: no authentication */
    cJSON *default_kc; /* cfg.kv_compression parsed: what requests without kv_compression get, or NULL */
    kvs_http *http;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every change of the fields below */
    int slots_free;
    int in_flight;  /* requests inside the handler */
    int waiting;    /* requests in the queue */
    int processing; /* requests admitted by the scheduler (holding a slot) */
    int draining;
    int cancel_all; /* the drain timed out: everything left is cancelled */
    int live_seqs;  /* sequences in the decode batch */
    srv_job *q_head, *q_tail; /* FIFO of queued jobs (under mu) */
    srv_sched *sched;         /* the scheduler thread's state (sched.c) */
    int32_t *eog;             /* [n_eog] end-of-generation token ids (ignore_eos masks them) */
    int n_eog;
    uint64_t next_id;
    srv_metrics m;
    time_t started_unix;
};

/* ---- generation requests (parsed in server_gen.c, run in sched.c) ---------- */

typedef struct {
    char name[64];            /* label echoed back ("" if none) */
    char field[64];           /* "kv_compression" or "kv_compression.variants[i]" */
    const kvs_method *method; /* NULL: no compression */
    kvs_params params;
    kvs_budget budget;
    int compress_local;
    int chunk;       /* > 0: chunked prefill compression (chunked.c), 0: one compression after the prompt */
    int32_t *suffix; /* [n_suffix] malloc'd: appended after the compression (query-agnostic), or before it
                        with compress_suffix (query-aware) */
    int n_suffix;
    char *suffix_text;   /* the suffix as sent (malloc'd), or NULL */
    int compress_suffix; /* 1: the suffix joins the prompt before the compression (srv_join_suffixes) */
    int suffix_apart;    /* compress_suffix: tokenized apart from the prompt (the joint tokens do not start
                            with the prompt's); said in kv.note */
    struct kvs_composed *owned; /* method composed from parts (server_method.c), or NULL */
} variant_req;

/* kv_compression's `method` of object o (a name, or a composition as an
 * object or its JSON text) into v->method / v->owned; -1 with a message in
 * msg naming "<field>.method" otherwise (server_method.c). */
int srv_parse_method(const cJSON *o, const char *field, variant_req *v, char *msg, size_t n);

typedef struct {
    int start, end; /* byte offsets [start, end) into the prompt string */
    int n_tokens;   /* prompt tokens whose bytes overlap it */
    uint8_t *in;    /* [n_prompt] 1 for those tokens, malloc'd */
} kv_span;

typedef struct {
    int32_t *prompt; /* [n_prompt] malloc'd */
    int n_prompt;
    const char *prompt_field; /* "prompt" or "messages" */
    kvs_sampling_params sp;
    int n_predict;  /* as asked; -1: until a stop or the context is full */
    int limit;      /* tokens generated at most: n_predict, or --n-predict-max when none was asked */
    int ignore_eos; /* end-of-generation tokens are never sampled */
    kvs_stop stop;
    int n_variants; /* 0: no kv_compression */
    int several;    /* the request used a list of variants */
    variant_req *variants;
    kv_span *spans; /* [n_spans] kv_spans */
    int n_spans;
} gen_req;

/* What a chunked prefill did (chunked.c): per compression, the positions
 * seen, the rows a compressed layer held before and after. */
typedef struct {
    int n, cap;
    int *rows; /* [cap][3] seen, before, after */
    double compress_ms; /* all compressions together */
} srv_chunk_log;

typedef struct {
    char *text; /* [cap] */
    size_t len, cap;
    int32_t *toks; /* [cap_toks] */
    int n_toks, cap_toks;
    const char *stop_type; /* "eos", "word", "limit" */
    char stopping_word[128];
    double predicted_ms; /* wall time of the decode steps this variant took part in */
    kvs_kv_stats stats;
    double compress_ms;
    double copy_ms;   /* making this variant's session (full / none: copying the prefill cache); not in compress_ms */
    double suffix_ms; /* running the variant's suffix after the compression */
    double extend_ms; /* compress_suffix: running the suffix before the compression (shared by the variants
                         with the same suffix; reported in timings.prompt_ms) */
    int n_extend;     /* compress_suffix: the suffix's tokens (in timings.prompt_n) */
    int same_as;      /* -1, or the variant whose cache (plan, suffix) this one shares: decoded once, the
                         output is that variant's (sched.c) */
    double *span_kept; /* [n_spans][n_layers] share of each span's tokens kept, or NULL */
    srv_chunk_log chunks; /* kv_compression.chunk: what each compression kept */
} gen_out;

/* ---- chunked prefill compression (chunked.c) ---------------------------------- */

/* The prompt toks[n] into the empty session ses (record_queries 0) in chunks
 * of v->chunk tokens, the cache compressed after each chunk (the last one
 * included) by kvs_session_recompress to chunk_budget(v, positions seen),
 * the method observing the queries of the chunk's last positions (at most
 * the chunk). each == NULL: chunks run as kvs_session_prefill /
 * kvs_session_extend (logits: the last position's); else every position
 * through the decode kernels and each(user, i, logits) gets the logits
 * predicting toks[i] (i >= 1) before it is decoded; logits then predict the
 * token after the prompt. The local layers are not trimmed. A kvs_status;
 * log (zeroed by the caller) grows, free it with srv_chunk_log_free. */
typedef void (*srv_pos_fn)(void *user, int i, const float *logits);
kvs_status srv_chunked_prefill(const kvs_server *s, kvs_session *ses, const variant_req *v, const int32_t *toks,
                               int n, srv_pos_fn each, void *user, float *logits, srv_chunk_log *log, kvs_err *err);
/* The rows a compression after `seen` positions keeps: budget.tokens, or
 * floor(ratio * seen), at least 1. */
int srv_chunk_budget(const variant_req *v, int seen);
void srv_chunk_log_free(srv_chunk_log *log);
/* Statistics of ses after a chunked prefill of n tokens: tokens_before = n in
 * every layer, bytes_before scaled to them. */
void srv_chunk_stats(const kvs_session *ses, int n, kvs_kv_stats *st);

/* ---- the scheduler (sched.c) ------------------------------------------------ */

/* Start / stop the scheduler thread (stop: after every job has completed). */
kvs_status srv_sched_start(kvs_server *s, kvs_err *err);
void srv_sched_stop(kvs_server *s);
/* Run a generation request through the batch: queue it (503 with Retry-After
 * when the queue is full, 503 when shutting down), wait for it while
 * watching the client socket fd (< 0: not watched); a client that hangs up
 * cancels the request. Returns 0 and fills outs[n_outs] / *prompt_ms, or -1
 * with e set; e->status == 0 with -1 means the client is gone (no response). */
int srv_sched_generate(kvs_server *s, const gen_req *g, gen_out *outs, int n_outs, double *prompt_ms, int fd,
                       srv_error *e);
/* Run fn(s, user, e) on the scheduler thread between decode steps, after
 * waiting in the same queue (the /kv/dump prefill). Same return convention. */
typedef int (*srv_exclusive_fn)(kvs_server *s, void *user, srv_error *e);
int srv_sched_exclusive(kvs_server *s, srv_exclusive_fn fn, void *user, int fd, srv_error *e);
/* The drain timed out: cancel every queued and running job (reason shutdown). */
void srv_sched_cancel_all(kvs_server *s);

/* Per-variant generation state shared by the scheduler and the span code. */
void gen_out_free(gen_out *o);
/* kv_spans (spans.c): parse the field against the prompt text and its tokens;
 * span_kept of a variant from the plan its compression applied (NULL plan:
 * nothing compressed, every share 1). */
int srv_parse_spans(const kvs_server *s, const cJSON *root, const char *text, gen_req *g, srv_error *e);
void srv_spans_free(gen_req *g);
int srv_span_kept(const kvs_server *s, const gen_req *g, const kvs_plan *plan, const int *layer_map, gen_out *o);

/* Plans computed ahead for the variants that share a method, its parameters
 * and compress_local (plan_groups.c): planned[i] says variant i's plan is
 * plans[i] (layer map maps[i * KVS_MAX_LAYERS ..]) and took plan_ms[i] (its
 * share of the group's one observation plus its own select). */
typedef struct {
    int n;
    kvs_plan *plans;         /* [n] */
    int *maps;               /* [n][KVS_MAX_LAYERS] */
    double *plan_ms;         /* [n] */
    unsigned char *planned;  /* [n] */
} srv_plans;
/* Group the variants of branch b (branch[i] == b: 0 the prefill, k > 0 the
 * k-th compress_suffix text prefilled after it) and compute every group's
 * plans on that branch's session pre (one kvs_session_plan_many per group,
 * a lone variant included; "full" is not planned). P starts zeroed and is
 * filled branch by branch. A kvs_status; on error *bad_variant is the
 * group's first variant and P is freed. */
int srv_plans_make(const kvs_server *s, kvs_session *pre, const gen_req *g, const int *branch, int b, srv_plans *P,
                   int *bad_variant, kvs_err *err);
/* 1 when variants i and j were both planned and their plans are byte for byte
 * the same (kept rows of every layer and head, merge, layer map): applied to
 * the same cache they give the same cache. */
int srv_plans_same(const srv_plans *P, int i, int j);
void srv_plans_free(srv_plans *P);


int srv_fail(srv_error *e, int status, const char *field, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* An engine error: 400 for KVS_ERR_INVALID / NOTFOUND (with field), else 500. */
int srv_fail_kvs(srv_error *e, const kvs_err *err, const char *field);

/* Fill resp from a cJSON tree (deleted) or an error. */
void srv_json_response(kvs_http_response *resp, int status, cJSON *root);
void srv_error_response(kvs_http_response *resp, const srv_error *e);

/* Typed getters. Absent or null: *out = def, return 0. Wrong type or out of
 * range: srv_fail naming prefix+name, return -1. */
int srv_get_int(const cJSON *obj, const char *name, const char *prefix, long long def, long long lo,
                long long hi, long long *out, srv_error *e);
int srv_get_double(const cJSON *obj, const char *name, const char *prefix, double def, double lo,
                   double hi, double *out, srv_error *e);
int srv_get_bool(const cJSON *obj, const char *name, const char *prefix, int def, int *out,
                 srv_error *e);
/* Returns the string (borrowed) or def; NULL on error (and def NULL + absent
 * returns NULL with no error: check e->status). */
const char *srv_get_string(const cJSON *obj, const char *name, const char *prefix, const char *def,
                           srv_error *e);

/* Parse a body as a JSON object (400 field "body" when it is not one). */
cJSON *srv_parse_body(const kvs_http_request *rq, srv_error *e);

/* Copy text, replacing invalid or truncated UTF-8 sequences by U+FFFD.
 * Returns malloc'd NUL-terminated text or NULL (no memory). */
char *srv_utf8_clean(const char *text, size_t len);
/* 1 if text[0..len) is valid UTF-8. */
int srv_utf8_valid(const char *text, size_t len);

/* Reserve a slot outside the scheduler (tests hold slots to make requests
 * queue); release it. */
void srv_slot_acquire(kvs_server *s);
void srv_slot_release(kvs_server *s);
/* Metrics updates (take the mutex). */
void srv_note_prefill(kvs_server *s, int n_prompt, double ms);
void srv_note_predict(kvs_server *s, int n_predicted, double ms);
void srv_note_compress(kvs_server *s, double ms);
uint64_t srv_next_id(kvs_server *s);

/* Endpoints in server_gen.c. */
void srv_handle_generate(kvs_server *s, int ep, const kvs_http_request *rq, kvs_http_response *rs);
void srv_handle_kv_dump(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs);
/* --prepend-bos: a token-id prompt of a model whose tokenizer adds BOS gets
 * BOS in front when it does not start with it (request.c). Returns 1 when
 * prepended, 0 when not, -1 out of memory. */
int srv_prepend_bos(const kvs_server *s, int32_t **toks, int *n);
/* Options this server does not implement, refused with 400 unless neutral
 * (scoring: echo and logprobs are allowed). */
int srv_refuse_unsupported(const cJSON *root, int scoring, srv_error *e);
/* /v1/completions with echo, logprobs or several prompts (logprobs.c):
 * srv_wants_scoring says whether root asks for it. */
int srv_wants_scoring(const cJSON *root);
void srv_handle_scoring(kvs_server *s, const cJSON *root, const kvs_http_request *rq, kvs_http_response *rs);
/* The same without the scheduler: the model runs on the calling thread, which
 * must be the only one using s (the fuzz harness; no server running). */
void srv_handle_scoring_inline(kvs_server *s, const cJSON *root, kvs_http_response *rs);
/* Parse a generation body into g (free with srv_gen_req_free) and the token
 * endpoints (server.c): no socket or scheduler needed, so tests/fuzz calls them. */
int srv_parse_gen_request(kvs_server *s, int ep, const cJSON *root, gen_req *g, srv_error *e);
/* The request's kv_compression, or the server's default when it has none
 * (absent or null); NULL: no compression (kv_request.c). */
const cJSON *srv_kv_compression(const kvs_server *s, const cJSON *root);
/* Parse a kv_compression value kc into g's variants (kv_request.c); free
 * them with srv_variants_free (srv_gen_req_free does). */
int srv_parse_kv_compression(const kvs_server *s, const cJSON *kc, gen_req *g, srv_error *e);
/* The compression options of variant v on this server (method, params,
 * budget, compress_local, the server's threads); kv_request.c. */
kvs_compress_opts srv_variant_compress_opts(const kvs_server *s, const variant_req *v);
void srv_variants_free(gen_req *g);
/* compress_suffix variants of a request whose prompt is the string text
 * (NULL: token ids): their suffix tokens become those that follow the
 * prompt's in the joint tokenization of text + suffix (what one prompt of
 * both would be), when the joint tokens start with the prompt's; else they
 * stay tokenized apart (suffix_apart). kv_request.c. */
int srv_join_suffixes(const kvs_server *s, const char *text, gen_req *g, srv_error *e);
void srv_gen_req_free(gen_req *g);
void srv_handle_tokenize(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs);
void srv_handle_detokenize(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs);

#endif
