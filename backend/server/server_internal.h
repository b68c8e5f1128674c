/*
 * server_internal.h -- what server.c and server_gen.c share (private).
 *
 * What it is: the server struct (slots, drain state, metrics under one
 * mutex), request errors that name a JSON field, JSON response helpers and
 * the typed JSON getters used to validate request bodies.
 * What it is not: a public API; nothing outside backend/server includes it.
 */
#ifndef KVS_SERVER_INTERNAL_H
#define KVS_SERVER_INTERNAL_H

#include "kvs_http.h"
#include "kvs_server.h"

#include <cjson/cJSON.h>
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
    EP_OTHER,
    EP_COUNT
};

#define SRV_HIST_BUCKETS 13 /* compress_ms upper bounds, +Inf last */

typedef struct {
    uint64_t requests[EP_COUNT];
    uint64_t errors_4xx[EP_COUNT], errors_5xx[EP_COUNT];
    uint64_t prompt_tokens, predicted_tokens, prefills, compressions, rejected_draining;
    double prompt_ms, predicted_ms;
    uint64_t compress_bucket[SRV_HIST_BUCKETS]; /* per bucket (not cumulative) */
    uint64_t compress_count;
    double compress_sum_ms;
} srv_metrics;

struct kvs_server {
    kvs_model *model;
    const kvs_model_info *info;
    kvs_server_config cfg;
    char host[256];
    char alias[128];
    kvs_http *http;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int slots_free;
    int in_flight;  /* requests inside the handler */
    int waiting;    /* requests waiting for a slot */
    int processing; /* requests holding a slot */
    int draining;
    uint64_t next_id;
    srv_metrics m;
    time_t started_unix;
};

/* A request error: HTTP status, the JSON field concerned ("" if none). */
typedef struct {
    int status;
    char field[192];
    char msg[768];
} srv_error;

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

/* Slots: wait for a free one (counts as waiting meanwhile); release it. */
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

#endif
