/*
 * kvs_http.h -- a thin layer over libmicrohttpd: one handler for whole requests.
 *
 * What it is: start a daemon on host:port (port 0 picks a free port), collect
 * each request's body (up to a limit; larger bodies get 413), call one
 * handler with method, path and body, and send what it returns. Each
 * connection runs in its own thread, so a handler may block (the server
 * queues model work behind its slots; /health stays responsive). Sockets are
 * watched with poll() (MHD_USE_POLL), never select(), so descriptors beyond
 * FD_SETSIZE (1024) work.
 * What it is not: no routing, no JSON, no model. Private to backend/server.
 */
#ifndef KVS_HTTP_H
#define KVS_HTTP_H

#include "kvsieve.h"

#include <stddef.h>

typedef struct {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* "/completion" (no query string) */
    const char *body;   /* NUL-terminated, body_len bytes before the NUL */
    size_t body_len;
    int fd; /* the client's socket (read-only use: poll it to see the client hang up) */
    const char *authorization; /* the Authorization header, or NULL */
    const char *x_api_key;     /* the X-Api-Key header, or NULL */
} kvs_http_request;

typedef struct {
    int status;               /* HTTP status code */
    char *body;               /* malloc'd by the handler; freed by the layer */
    size_t len;
    const char *content_type; /* static string */
    int retry_after;          /* > 0: a Retry-After header (seconds) */
} kvs_http_response;
/* status 0: the client is gone (a short 503 nobody reads is queued, then the
 * connection closes). */

typedef void (*kvs_http_handler)(void *user, const kvs_http_request *req, kvs_http_response *resp);

typedef struct kvs_http kvs_http;

/* host: numeric address or name ("127.0.0.1", "::1", "localhost", "0.0.0.0").
 * max_conn bounds simultaneous connections (each one a thread). */
kvs_status kvs_http_start(const char *host, int port, int max_conn, size_t max_body,
                          kvs_http_handler handler, void *user, kvs_http **out, kvs_err *err);
int kvs_http_port(const kvs_http *h);
/* Stop accepting new connections; requests in flight continue. Idempotent. */
void kvs_http_quiesce(kvs_http *h);
/* Wait until every request begun so far has completed: its response sent
 * (or its connection closed), or until deadline_ms (kvs_now_ms clock; <= 0:
 * no deadline). Returns the requests still active. Call after quiesce. */
int kvs_http_drain(kvs_http *h, double deadline_ms);
/* Stop the daemon (waits for connection threads) and free. NULL is a no-op. */
void kvs_http_stop(kvs_http *h);

#endif
