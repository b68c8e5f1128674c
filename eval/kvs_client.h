/*
 * kvs_client.h -- the HTTP client of the task runner: completion requests to
 * a kvsieve backend (the `kv_compression` extension with `variants`: one
 * prefill, many compressions per request) or to any OpenAI-compatible server.
 *
 * What it is: libcurl (one multi handle: keep-alive connection reuse, several
 * requests in flight, over one or several backend URLs) and cJSON; per
 * request a connect timeout and a total timeout; retries with exponential
 * backoff on 5xx answers and connection errors (refused, reset, nothing
 * received), never on 4xx: a 4xx answer's error message (the kvsieve server's
 * names the field) is surfaced verbatim. A retry goes to the next URL. A
 * request that times out is not retried (it would be as slow again).
 * What it is not: no prompt building, no scoring, no storage (eval/task.c);
 * no streaming.
 *
 * Protocol: POST {url}/v1/completions {prompt, max_tokens, temperature: 0,
 * stop, ignore_eos (only when set), kv_spans?, multimodal_data?,
 * kv_compression: {variants: [{method, ratio | tokens, params, name,
 * suffix?}]}}; the answer's
 * `variants[i]` give content, timings and `kv` (with span_kept when kv_spans
 * was sent; a malformed span_kept, wrong in shape or outside [0, 1], is an
 * error; a server that leaves it out, one that predates kv_spans, gives
 * outputs without it).
 * api = KVS_API_OPENAI sends no kv_compression (a plain OpenAI server does
 * not know it): only method `full` can be evaluated there, and requests with
 * another method are refused before sending. A server that ignores
 * kv_compression (answers without `variants`) is an error, never a silent
 * `full`. Query-agnostic mode sends the question as a per-variant `suffix`
 * (decoded after the compression); a server without that field answers 400
 * naming it, which is surfaced. A variant with compress_suffix sends
 * "compress_suffix": true: the server prefills the suffix after the prompt
 * and before compressing (query-aware), so one request carries both
 * settings of a sample over one prefill of the context (kvsieve serve lists
 * "compress_suffix" in /v1/models data[0].kv_compression_fields).
 * Images (llama-server's multimodal fields): a request with media sends
 * "multimodal_data": [base64 of each image's file bytes, ...] (standard
 * base64 with padding, OpenSSL's EVP_EncodeBlock) and its prompt carries one
 * KVS_CLIENT_MEDIA_MARKER per image, the i-th marker standing for the i-th
 * image. The counts must match and the suffix must carry none (an image is
 * prefilled, never decoded after a compression); both are checked before
 * sending. Only a multimodal kvsieve-API backend (kvsieve-hf) takes them:
 * `kvsieve serve` answers 400 naming multimodal_data, and api =
 * KVS_API_OPENAI refuses media before sending. A request without media
 * sends no multimodal_data field.
 */
#ifndef KVS_CLIENT_H
#define KVS_CLIENT_H

#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KVS_API_KVSIEVE = 0, KVS_API_OPENAI = 1 } kvs_client_api;

/* llama-server's default media marker: where an image goes in a prompt. */
#define KVS_CLIENT_MEDIA_MARKER "<__media__>"
/* The largest image accepted in a request (the datasets' own cap). */
#define KVS_CLIENT_MEDIA_MAX_BYTES ((size_t)64 << 20)

typedef struct {
    const char *const *urls; /* [n_urls] base URLs "http://host:port" (no trailing path) */
    int n_urls;
    kvs_client_api api;
    const char *model;        /* "model" field sent (OpenAI servers need one); NULL: none */
    int per_url;              /* requests in flight per URL (default 2) */
    double connect_timeout_s; /* default 10 */
    double timeout_s;         /* whole request, default 900 */
    int max_attempts;         /* tries per request, first included (default 5) */
    double backoff_ms;        /* first retry delay, doubled each time, capped at 30 s (default 250) */
} kvs_client_opts;

void kvs_client_opts_defaults(kvs_client_opts *o);

/* One image of a request: its file's bytes, sent as they are (base64). */
typedef struct {
    const unsigned char *data; /* [n] */
    size_t n;                  /* 1 .. KVS_CLIENT_MEDIA_MAX_BYTES */
} kvs_client_media;

/* One compression variant of a request. */
typedef struct {
    const char *method;      /* registry name ("full", "snapkv", ...) */
    const char *params_json; /* JSON object {name: value} or NULL */
    double ratio;            /* budget ratio in (0, 1] when tokens == 0 */
    int64_t tokens;          /* > 0: a token budget */
    int compress_suffix;     /* 1: the request's suffix is prefilled before the compression (query-aware on
                                the query-agnostic prompt: sent as "compress_suffix": true) */
} kvs_client_variant;

typedef struct {
    const char *prompt;      /* text sent as prompt (the compressed part) */
    const char *suffix;      /* NULL, or text decoded after compression (query-agnostic) */
    int max_tokens;          /* tokens to generate */
    int ignore_eos;          /* 1: send "ignore_eos": true (llama-server's field: only
                              * max_tokens ends generation); 0: the field is not sent */
    const char *const *stop; /* [n_stop] stop strings */
    int n_stop;
    int n_variants; /* >= 1 */
    const kvs_client_variant *variants;
    /* kv_spans: [n_spans][2] byte offsets [start, end) into `prompt` (where
     * the answer sits); sent as [{start, end}], and each variant's
     * kv.span_kept comes back in span_kept. n_spans <= 64 (the server's
     * limit); 0: none sent. */
    const int64_t *spans;
    int n_spans;
    /* Images: [n_media] the bytes of the image at each KVS_CLIENT_MEDIA_MARKER
     * of `prompt`, in order (an image sent twice is listed twice; the
     * pointers may repeat). Encoded when the body is built, so the bytes may
     * be freed after kvs_client_submit. 0: no multimodal_data sent. */
    const kvs_client_media *media;
    int n_media;
} kvs_client_request;

typedef struct {
    char *content;             /* malloc'd generated text */
    int64_t prompt_n;          /* prompt tokens (-1 unknown) */
    int64_t predicted_n;       /* generated tokens */
    double prompt_ms;          /* prefill (shared by all variants of the request); NAN unknown */
    double compress_ms;        /* NAN unknown */
    double predicted_ms;       /* decode; NAN unknown */
    double predicted_per_second;
    int64_t bytes_before, bytes_after;   /* KV bytes; -1 unknown */
    int64_t tokens_before, tokens_after; /* summed over layers; -1 unknown */
    char stop_type[16];
    char note[256];
    /* kv.span_kept when the request sent kv_spans and the server answered
     * it: [span_n][span_layers], per span and model layer the share (0..1) of
     * the span's tokens the plan kept; NULL (and 0, 0) otherwise. */
    double *span_kept;
    int span_n, span_layers;
} kvs_client_output;

typedef struct {
    kvs_status status;      /* KVS_OK, or why the request failed */
    char error[768];        /* the message when status != KVS_OK */
    long http_status;       /* last HTTP status (0: no answer) */
    int attempts;           /* tries made */
    int url_index;          /* URL of the last try */
    double elapsed_ms;      /* submit -> finish */
    int n_outputs;          /* = the request's n_variants when status == KVS_OK */
    kvs_client_output *outputs;
} kvs_client_result;

void kvs_client_result_free(kvs_client_result *r);

typedef struct kvs_client kvs_client;

kvs_status kvs_client_new(const kvs_client_opts *o, kvs_client **out, kvs_err *err);
void kvs_client_free(kvs_client *c);

/* Queue a request (the body is built now: r, its strings and its media may
 * be freed after the call). tag is handed back with the result. Refuses
 * (without sending) a non-`full` variant or media with api =
 * KVS_API_OPENAI, and media whose count differs from the prompt's markers. */
kvs_status kvs_client_submit(kvs_client *c, const kvs_client_request *r, void *tag, kvs_err *err);

/* Called once per finished request (success or final failure); the result
 * is owned by the client and valid during the call only. */
typedef void (*kvs_client_done_fn)(void *ctx, void *tag, const kvs_client_result *res);

/* Drive transfers for up to wait_ms (0: no waiting), calling done for each
 * request that finished. *n_pending (may be NULL) receives the requests
 * queued or in flight afterwards. Returns an error only for client-level
 * failures (curl itself), not for failed requests. */
kvs_status kvs_client_poll(kvs_client *c, int wait_ms, kvs_client_done_fn done, void *ctx,
                           int *n_pending, kvs_err *err);
int kvs_client_pending(const kvs_client *c);

/* Blocking GET {url}{path}: HTTP status and body (malloc'd, NUL-terminated;
 * may be NULL). Connection errors are KVS_ERR_IO. */
kvs_status kvs_http_get(const char *url, const char *path, double timeout_s, long *status,
                        char **body, kvs_err *err);

/* Blocking POST {url}/tokenize {"content": text[0..n), "add_special": true}:
 * *n_tokens = the length of the answer's "tokens" (the prompt's token count,
 * BOS included when the model adds one). A 4xx is KVS_ERR_INVALID with the
 * server's message; no answer is KVS_ERR_IO. */
kvs_status kvs_http_count_tokens(const char *url, const char *text, size_t n, double timeout_s,
                                 int64_t *n_tokens, kvs_err *err);

/* ---- the embedded backend (eval/embedded.c) ------------------------------------- */

/* `kvsieve serve` started as a child process on a free loopback port: its
 * output goes to a log file (quoted in errors), the port is read from its
 * "listening on http://127.0.0.1:PORT" line, and /health must answer 200
 * before start returns. The child runs in its own process group (a Ctrl-C in
 * the terminal reaches only the runner, which stops it after the cell in
 * flight) and gets SIGTERM if the runner dies (PR_SET_PDEATHSIG). */
typedef struct {
    const char *bin;   /* the kvsieve binary (e.g. /proc/self/exe of the CLI) */
    const char *model; /* --model: a GGUF path or "default" */
    int threads;       /* --threads (0: its default) */
    int ctx;           /* --ctx (0: its default) */
    int slots;         /* --slots (0: 1) */
    const char *cache_type_k, *cache_type_v; /* --cache-type-k / -v (NULL or "": f16) */
    int batch;         /* --batch: sequences per decode step, also the most variants one
                          request may carry (0: the server's default, 64) */
    double start_timeout_s; /* model load + /health (0: 300) */
} kvs_embedded_opts;

typedef struct kvs_embedded kvs_embedded;

kvs_status kvs_embedded_start(const kvs_embedded_opts *o, kvs_embedded **out, kvs_err *err);
/* "http://127.0.0.1:PORT" */
const char *kvs_embedded_url(const kvs_embedded *b);
/* SIGTERM, wait for the exit (SIGKILL after 30 s), remove the log, free.
 * Returns an error when the child did not exit cleanly. NULL is a no-op. */
kvs_status kvs_embedded_stop(kvs_embedded *b, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
