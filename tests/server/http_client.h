/*
 * http_client.h -- the test-side HTTP client of the server tests
 * (tests/server/test_server_*.c): one libcurl call to the in-process server on
 * 127.0.0.1, the answer kept raw or parsed with cJSON, and cJSON getters; and
 * the tests' fixture (tc_fixture): a temporary folder for the tiny model, the
 * model loaded, the server started on a free loopback port, all freed at once.
 *
 * Thread-safe: each call uses its own curl easy handle and writes only its
 * own reply (tc_server is only read), so test threads may call at once
 * (test_server_load.c, test_server_http.c). The test's main calls
 * tc_fixture_init (curl_global_init) before any call or thread.
 * Not a general client: loopback only, no streaming, no retries, no TLS; not
 * part of the project's libraries (the tests link the .c themselves).
 */
#ifndef KVS_TEST_HTTP_CLIENT_H
#define KVS_TEST_HTTP_CLIENT_H

#include "kvs_server.h"
#include "backend/tiny_model.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* The server a test talks to. */
typedef struct {
    int port;        /* 127.0.0.1:port */
    long timeout_s;  /* whole-call limit (CURLOPT_TIMEOUT); 0: none */
    int log_non_200; /* tc_call also logs answers whose status is not 200 */
} tc_server;

/* One answer. */
typedef struct {
    long status;          /* 0: the connection failed */
    char *body;           /* malloc'd, NUL-terminated ("" when nothing came); NULL only out of memory */
    size_t len;           /* body bytes */
    char retry_after[32]; /* the Retry-After header after its colon (blank and CRLF kept), "" when absent */
} tc_reply;

/* `method path` on s; json (may be NULL) sent as the application/json body;
 * header (may be NULL) one extra request header line ("Name: value").
 * Fills *r; returns r->status. Free with tc_reply_free. */
long tc_request(const tc_server *s, const char *method, const char *path, const char *json, const char *header,
                tc_reply *r);
void tc_reply_free(tc_reply *r);

/* tc_request without a header, the body dropped: the status alone. */
long tc_status(const tc_server *s, const char *method, const char *path, const char *json);

/* tc_request with the body parsed: the JSON (caller deletes; NULL when the body
 * is not JSON, logged to stderr), the status in *status. */
cJSON *tc_call(const tc_server *s, const char *method, const char *path, const char *json, const char *header,
               long *status);

/* Getters tolerant of a missing object or key. */
const cJSON *tc_obj(const cJSON *o, const char *k);
double tc_num(const cJSON *o, const char *k);         /* NAN unless a number */
const char *tc_str(const cJSON *o, const char *k);    /* "" unless a string: safe in strcmp */
const char *tc_str_or_null(const cJSON *o, const char *k); /* NULL unless a string: checks presence */

/* ---- server fixture ----
 * What each test sets stays in the test: the architecture, the config fields
 * it tests (f->cfg), the checks on each step. No checks are counted here (the
 * counters are the test's own): each step returns its status for the test's
 * CHECK_OK. */
typedef struct {
    tiny_spec spec;        /* the tiny model: tiny_default(arch) */
    char dir[64];          /* the temporary folder (mkdtemp) */
    char path[128];        /* dir/tiny.gguf */
    kvs_model *model;      /* tc_fixture_load; NULL before */
    kvs_server_config cfg; /* kvs_server_config_defaults, a free port (0), one worker thread; the test edits it */
    kvs_server *srv;       /* tc_server_start; NULL before and once stopped */
} tc_fixture;

/* Fills f, initialises libcurl (curl_global_init), makes the folder
 * /tmp/<tag>-XXXXXX and writes tiny_default(arch) to f->path. Free f with
 * tc_fixture_free whatever this returns. */
kvs_status tc_fixture_init(tc_fixture *f, const char *tag, const char *arch, kvs_err *err);
/* Loads f->path into f->model (one forward thread). */
kvs_status tc_fixture_load(tc_fixture *f, kvs_err *err);
/* Starts the server on f->model with f->cfg into f->srv and points s at its port. */
kvs_status tc_server_start(tc_fixture *f, tc_server *s, kvs_err *err);
/* kvs_server_stop (NULL-safe); f->srv is NULL after. */
void tc_server_stop(tc_fixture *f);
/* Stops the server, frees the model, removes the model file and the folder,
 * curl_global_cleanup. */
void tc_fixture_free(tc_fixture *f);

#endif
