/*
 * http_client.h -- the test-side HTTP client of the server tests
 * (tests/server/test_server_*.c): one libcurl call to the in-process server on
 * 127.0.0.1, the answer kept raw or parsed with cJSON, and cJSON getters.
 *
 * Thread-safe: each call uses its own curl easy handle and writes only its
 * own reply (tc_server is only read), so test threads may call at once
 * (test_server_load.c, test_server_http.c). The test's main calls
 * curl_global_init before any call or thread.
 * Not a general client: loopback only, no streaming, no retries, no TLS; not
 * part of the project's libraries (the tests link the .c themselves).
 */
#ifndef KVS_TEST_HTTP_CLIENT_H
#define KVS_TEST_HTTP_CLIENT_H

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

#endif
