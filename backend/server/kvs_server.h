/*
 * kvs_server.h -- the HTTP server of the inference backend.
 *
 * What it is: a llama-server / OpenAI compatible HTTP API over one loaded
 * kvs_model, with the `kv_compression` extension (one prefill, then per
 * variant: copy the cache, compress it with a method from methods/, decode)
 * and a safetensors dump of the prefill cache. A request the server cannot
 * serve gets a 4xx JSON error {"error": {"message", "field", "type"}} naming
 * the field.
 *
 * Scheduling (continuous batching, sched.c): one scheduler thread owns the
 * model. Up to `slots` requests run at once; every live sequence -- each
 * variant of each running request -- advances one token per step through one
 * kvs_batch_decode call (one pass over the weights). Between steps it admits
 * queued requests in arrival order (prefill; per variant copy + compress;
 * the suffix as one kvs_session_extend chunk) and drops finished sequences.
 * Greedy outputs do not depend on what else is in the batch. A long prefill
 * delays the running requests' next step (no chunked mixing). At most
 * `queue` requests wait; the next one gets 503 with Retry-After: 1.
 * Careless clients: a client that closes its connection cancels its request,
 * queued (at once) or running (before the next decode step); the handler
 * thread poll()s the socket for POLLRDHUP while it waits, so a client that
 * half-closes (shutdown(SHUT_WR)) after sending counts as gone.
 * What it is not: no signal handling (cli/cmd_serve.c owns that and calls
 * kvs_server_stop), no model loading, no streaming (stream: true is refused).
 *
 * Endpoints:
 *   GET  /health        {"status": "ok"|"draining", slots_idle, slots_processing,
 *                        requests_waiting, kv_compression (the default, or null)};
 *                        503 while draining
 *   GET  /v1/models     OpenAI list; data[0].meta has arch, n_vocab, n_ctx, ...
 *   GET  /metrics       Prometheus text: kvsieve_requests_total{endpoint},
 *                       kvsieve_request_errors_total{endpoint,class},
 *                       kvsieve_prefills_total, kvsieve_compressions_total,
 *                       kvsieve_prompt_tokens_total, kvsieve_predicted_tokens_total,
 *                       kvsieve_prompt_ms_total, kvsieve_predicted_ms_total,
 *                       kvsieve_compress_ms (histogram), kvsieve_slots,
 *                       kvsieve_requests_processing, kvsieve_requests_waiting
 *                       (queue depth), kvsieve_queue_capacity,
 *                       kvsieve_requests_cancelled_total{reason=disconnect|shutdown},
 *                       kvsieve_requests_rejected_queue_full_total (503s),
 *                       kvsieve_requests_rejected_draining_total,
 *                       kvsieve_batch_size (sequences in the batch now),
 *                       kvsieve_batch_steps_total, kvsieve_batch_seq_steps_total
 *                       (their sum of batch sizes: the mean batch is the ratio)
 *   GET  /tokenizer_info  vLLM's: {tokenizer_class: "gguf", eos_token, eos_token_id,
 *                        bos_token, bos_token_id, pad_token, pad_token_id, unk_token,
 *                        unk_token_id, eot_token, eot_token_id (null: none), add_bos_token,
 *                        vocab_size, model_max_length, max_model_len (both the context)}
 *   POST /tokenize      llama-server's {content, add_special=false, with_pieces=false,
 *                        parse_special=true} -> {tokens: [id] | [{id, piece}]};
 *                       vLLM's {prompt, add_special_tokens=true} -> {tokens, count,
 *                        max_model_len}; control tokens written in the text are parsed
 *   POST /detokenize    {tokens: [id]} -> {content, prompt} (llama-server's and vLLM's
 *                        names of the same text)
 *   POST /completion    llama-server shape: {prompt: text | [ids], n_predict=-1
 *                        (-1: up to n_predict_max), temperature=0 (greedy), top_k=0,
 *                        top_p=1, seed=-1 (random, reported), stop: text | [text],
 *                        ignore_eos=false (as llama-server: end-of-generation
 *                        tokens are never sampled, so only n_predict, the
 *                        context or a stop string ends it), kv_compression,
 *                        kv_spans}
 *                       -> {content, tokens, stop_type: eos|word|limit,
 *                        stopping_word, tokens_predicted, tokens_evaluated,
 *                        generation_settings, timings {prompt_n, prompt_ms,
 *                        prompt_per_token_ms, prompt_per_second, predicted_n,
 *                        predicted_ms, predicted_per_token_ms,
 *                        predicted_per_second, compress_ms}, kv, [variants]}
 *   POST /v1/completions, /v1/chat/completions: OpenAI shape (max_tokens or
 *                       max_completion_tokens; n must be 1; stream must be
 *                       false), plus timings, kv and [variants]. Chat applies
 *                       the model family's template (kvs_chat_apply); message
 *                       content is text or an array of {type: "text", text}.
 *                       With echo, logprobs or several prompts (logprobs.c), vLLM's
 *                       shape: prompt as text, [text], [ids] or [[ids]] (at most 64,
 *                       32768 tokens with max_tokens; run alone between decode steps),
 *                       one choices[i] with its index per prompt; logprobs N (0..20):
 *                       choices[].logprobs = {tokens, token_logprobs, top_logprobs
 *                       ([{text: logprob}]: the chosen token and the top N),
 *                       text_offset (code points of the token texts before)}, over
 *                       the prompt too with echo (its first token null); max_tokens
 *                       (default 16; 0 with echo: the prompt only). Greedy only
 *                       (temperature 0), no stop strings (400 naming the field);
 *                       one kv_compression variant without suffix, per prompt
 *                       (chunked.c; without chunk: once after the prompt), each
 *                       choice then with kv {method, ratio|tokens, chunk,
 *                       compress_ms, chunks}. Every position's logits come from the
 *                       decode kernels (prefill the first token, decode the rest);
 *                       log-probs are log-softmax in double, printed with 17 digits
 *                       (they read back bit-identical), -inf clamped to -9999.0.
 *   POST /kv/dump       {prompt, queries=0 (-1 all, k last k), dtype=F32|F16|BF16,
 *                        include_local=true} -> safetensors bytes in the
 *                       formats/kvs_formats.h dump layout (metadata: model,
 *                       arch, n_prompt, layer_map)
 *
 * kv_compression: {method, ratio | tokens, params: {name: value},
 *   compress_local=false, name, suffix, compress_suffix=false, chunk} or {variants: [such objects]} or a
 *   bare array of them; absent or null: the server's default (cfg.kv_compression).
 *   chunk C >= 1 (one variant; not with kv_spans): chunked prefill compression
 *   (chunked.c): the prompt enters C tokens at a time, the cache compressed after
 *   each chunk to tokens or floor(ratio * positions seen) rows; kv adds chunk and
 *   chunks [{seen, rows_before, rows_after}]. suffix (text, query-agnostic evaluation): tokenized
 *   without BOS and decoded on the variant's cache after its compression;
 *   run as one kvs_session_extend chunk on the variant's compressed cache;
 *   generation starts from its last position (timings.suffix_ms). One
 *   prefill per request; each variant compresses a copy of the prefill cache.
 *   compress_suffix (query-aware evaluation on the same request; not with
 *   chunk): the suffix runs BEFORE the compression as part of the prompt: one
 *   copy of the prefill per distinct such suffix, extended by it
 *   (kvs_session_extend_prompt: its queries recorded after the prompt's, so
 *   window and all-query methods see prompt + suffix), and its variants
 *   plan, copy and compress from that copy. A string prompt's suffix tokens
 *   are those following the prompt's in the joint tokenization of prompt +
 *   suffix when that starts with the prompt's; else (or token-id prompts)
 *   tokenized apart, said in kv.note. timings.prompt_n / prompt_ms of such a
 *   variant include the suffix; kv.compress_suffix echoes the flag.
 *   same_as (every variant of a list): the index of an earlier variant whose
 *   cache ends identical (same compress_suffix branch, both full or plans
 *   byte for byte equal, same suffix after compression): decoded once, this
 *   variant gets that one's output (tokens, content, stop, predicted_ms)
 *   with its own kv statistics and compress_ms; null when it decoded itself.
 *   GET /v1/models data[0].kv_compression_fields lists "suffix" and
 *   "compress_suffix" (clients check before sending them).
 * kv_spans: [{start, end}] byte offsets [start, end) into a string prompt
 *   (400 naming kv_spans otherwise); each variant's kv then has span_kept
 *   [[s_0 .. s_{L-1}] per span]: per model layer the share of the span's
 *   prompt tokens (tokens whose bytes overlap it) that the plan kept,
 *   averaged over KV heads; 1 for layers not compressed and for full.
 * Timings per variant: predicted_ms is the wall time of the decode steps the
 *   variant took part in (a step decodes every live sequence at once, so
 *   concurrent variants share that time rather than adding to it). "kv" = {method, params (all values), budget, compress_local,
 *   compress_ms (end of prefill -> decode may start: the method's cost),
 *   copy_ms (making this variant's session: for full or no compression a copy of the shared prefill cache,
 *   its sliding-window layers already trimmed when no variant compresses them; a compressed variant gathers
 *   only its kept rows from the prefill, inside compress_ms), n_prompt, tokens_before/after, bytes_before/after (total,
 *   _global, _local), note, layers: [{layer, local, compressed, tokens_before,
 *   tokens_after, bytes_before, bytes_after}]}. Bytes are real (the cache
 *   element type, --cache-type); sliding-window layers keep only their window
 *   once decoding starts, in every variant and in plain requests
 *   (kvs_session_trim_local), so their tokens_after is at most the window.
 * Authentication (cfg.api_key set): a request to any endpoint but /health
 *   without `Authorization: Bearer KEY` (or `X-Api-Key: KEY`) is answered
 *   401 {"error": {type "authentication_error", field "authorization"}}
 *   before its body is parsed or queued (counted in /metrics as a 4xx).
 * Errors: {"error": {"message", "field", "type", "code"}}; 400 bad field,
 *   401 missing or wrong API key, 404 unknown path, 405 wrong method, 413 body too large, 503 draining or
 *   queue full (Retry-After) or cancelled by the shutdown, 500 engine failure. A prompt longer than the context is 400, never
 *   truncated. Options this server does not implement (penalties, min_p,
 *   typical_p, mirostat, n_probs, logprobs and echo (except on /v1/completions),
 *   best_of, grammar,
 *   json_schema, tools, logit_bias, response_format other than text) are
 *   refused with 400 naming them unless given their neutral value; other
 *   unknown top-level fields are ignored, unknown fields inside
 *   kv_compression are refused.
 */
#ifndef KVS_SERVER_H
#define KVS_SERVER_H

#include "kvs_backend.h"
#include "kvsieve.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *host;  /* default "127.0.0.1" */
    int port;          /* 0: any free port (see kvs_server_port) */
    int slots;         /* requests in the decode batch at once (>= 1, default 4); others queue */
    int threads;       /* forward-pass threads (<= 0: the model's) */
    int n_ctx;         /* context per sequence (prompt + generated); <= 0: the session default */
    int max_conn;      /* simultaneous HTTP connections (default 512; polled with poll(), so
                          descriptors above FD_SETSIZE work) */
    size_t max_body;   /* largest request body in bytes (default 64 MiB) */
    const char *alias; /* model id shown by /v1/models (NULL: the model's name) */
    int queue;         /* requests waiting for a slot at most (default 64); one more: 503 */
    int batch;         /* sequences (variants of all running requests) decoded together at
                          most (default 64); a request with more variants, or with more than
                          max(64, batch), is refused (400) */
    int n_predict_max; /* tokens one variant generates at most (default 4096): a request
                          without n_predict stops there (stop_type "limit"); an explicit
                          n_predict above it is refused (400 naming the field) */
    double drain_timeout_s; /* kvs_server_stop waits this long for the requests in flight
                               (default 10), then cancels what is left */
    int cache_type;    /* kvs_cache_type of every session's KV cache: K, and V unless
                          cache_type_v is set (default 0: f16; q8_0 / q4_0: GGUF blocks) */
    int cache_type_v;  /* 0: as cache_type; else KVS_CACHE_V(type of V) (kvs_backend.h) */
    int prepend_bos;   /* 1: a prompt given as token ids that does not start with BOS gets it, for
                          a model whose tokenizer adds BOS (lm-eval's remote tokenizer sends ids
                          without it); echo does not show the added position */
    const char *api_key; /* NULL or "": no authentication; else every endpoint but GET /health
                            (and /v1/health) needs `Authorization: Bearer KEY` (or `X-Api-Key:
                            KEY`, as llama-server also takes); others get 401 before any work */
    const char *kv_compression; /* NULL or "": none; else JSON text of a kv_compression value (the
                                   request field's shape) that requests without kv_compression (absent
                                   or null) get; a request's own overrides it ({"method": "full"}: no
                                   compression). Checked at start (KVS_ERR_INVALID naming the field);
                                   reported by /health and /v1/models (meta.kv_compression) */
} kvs_server_config;

void kvs_server_config_defaults(kvs_server_config *c);

typedef struct kvs_server kvs_server;

/* Start serving `model` (borrowed: it must outlive the server). */
kvs_status kvs_server_start(kvs_model *model, const kvs_server_config *cfg, kvs_server **out,
                            kvs_err *err);
/* The bound port (useful when cfg->port was 0). */
int kvs_server_port(const kvs_server *s);
/* Drain and stop: stop accepting connections, answer 503 to new requests on
 * open connections, wait up to cfg.drain_timeout_s for the requests in
 * flight (queued ones included) to finish, then cancel the rest (they get
 * 503; within one decode step, or after a prefill under way), stop the
 * daemon and free. NULL is a no-op. */
void kvs_server_stop(kvs_server *s);

#ifdef __cplusplus
}
#endif
#endif
