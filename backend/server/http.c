/*
 * http.c -- libmicrohttpd daemon that hands whole requests to one handler.
 *
 * What it is: binding (getaddrinfo on the host, IPv4 or IPv6, port 0 = any
 * free port), body collection with a size limit, one handler call per
 * request, the response with its content type, quiesce and stop.
 * What it is not: no routing, no JSON, no knowledge of the model; the
 * server (server.c) does all of that in its handler.
 */
#include "kvs_http.h"

#include <assert.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct kvs_http {
    struct MHD_Daemon *d;
    kvs_http_handler handler;
    void *user;
    size_t max_body;
    int port;
    int quiesced;
    MHD_socket listen_fd; /* returned by quiesce; closed after stop */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int active; /* requests begun and not yet completed (response sent or connection gone) */
};

/* Per-request state: the body collected so far. */
typedef struct {
    char *buf; /* [cap] */
    size_t len, cap;
    int too_big;
} req_state;

static void req_free(req_state *r) {
    if (!r) return;
    free(r->buf);
    free(r);
}

static enum MHD_Result send_response(struct MHD_Connection *c, int status, char *body, size_t len,
                                     const char *ctype, int retry_after) {
    struct MHD_Response *resp;
    if (body)
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    else
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype ? ctype : "application/json");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static char *dup_text(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    *len = n;
    return d;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
    kvs_http *h = cls;
    req_state *r = *con_cls;
    (void)version;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        pthread_mutex_lock(&h->mu);
        h->active++;
        pthread_mutex_unlock(&h->mu);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_big || r->len + n > h->max_body) {
            r->too_big = 1; /* keep reading, drop the bytes, answer 413 at the end */
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + n + 1) cap *= 2;
            char *nb = realloc(r->buf, cap);
            if (!nb) return MHD_NO;
            r->buf = nb;
            r->cap = cap;
        }
        memcpy(r->buf + r->len, upload_data, n);
        r->len += n;
        return MHD_YES;
    }
    /* the request is complete */
    if (r->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "{\"error\":{\"message\":\"request body larger than %zu bytes\",\"field\":\"body\","
                 "\"type\":\"invalid_request_error\"}}",
                 h->max_body);
        size_t len;
        char *body = dup_text(msg, &len);
        return send_response(conn, 413, body, len, "application/json", 0);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    kvs_http_request req = {method, url, r->buf ? r->buf : "", r->len, ci ? (int)ci->connect_fd : -1,
                            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Api-Key")};
    if (r->buf) r->buf[r->len] = '\0';
    kvs_http_response resp = {500, NULL, 0, "application/json", 0};
    h->handler(h->user, &req, &resp);
    if (resp.status == 0) { /* the client is gone: a short answer nobody reads, then close */
        free(resp.body);
        size_t len;
        char *body = dup_text("{\"error\":{\"message\":\"cancelled: the client closed the connection\","
                              "\"type\":\"unavailable_error\"}}", &len);
        return send_response(conn, 503, body, len, "application/json", 0);
    }
    return send_response(conn, resp.status, resp.body, resp.len, resp.content_type, resp.retry_after);
}

/* Called once the response has been sent (or the connection is gone). */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    kvs_http *h = cls;
    (void)conn;
    (void)toe;
    if (!*con_cls) return;
    req_free(*con_cls);
    *con_cls = NULL;
    pthread_mutex_lock(&h->mu);
    h->active--;
    assert(h->active >= 0);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

kvs_status kvs_http_start(const char *host, int port, int max_conn, size_t max_body,
                          kvs_http_handler handler, void *user, kvs_http **out, kvs_err *err) {
    *out = NULL;
    if (port < 0 || port > 65535)
        return kvs_errorf(err, KVS_ERR_INVALID, "port must be in [0, 65535], got %d", port);
    if (max_conn < 1) return kvs_errorf(err, KVS_ERR_INVALID, "max connections must be >= 1");
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    int gai = getaddrinfo(host, portbuf, &hints, &ai);
    if (gai != 0 || !ai)
        return kvs_errorf(err, KVS_ERR_INVALID, "host '%s': cannot resolve: %s", host ? host : "(null)",
                          gai_strerror(gai));
    kvs_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return kvs_errorf(err, KVS_ERR_NOMEM, "http: no memory");
    }
    h->handler = handler;
    h->user = user;
    h->max_body = max_body;
    h->listen_fd = MHD_INVALID_SOCKET;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    /* poll(), not select(): a descriptor >= FD_SETSIZE must not break the daemon */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_access, h, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                            MHD_OPTION_CONNECTION_TIMEOUT, 600u,
                            /* one thread per connection: 1 MiB stacks keep a thousand idle ones cheap */
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)1 << 20, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return kvs_errorf(err, KVS_ERR_IO, "http: cannot listen on %s:%d (address in use or not allowed)",
                          host, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? (int)info->port : port;
    *out = h;
    return KVS_OK;
}

int kvs_http_port(const kvs_http *h) { return h->port; }

void kvs_http_quiesce(kvs_http *h) {
    if (!h || h->quiesced) return;
    h->quiesced = 1;
    h->listen_fd = MHD_quiesce_daemon(h->d);
    /* MHD stops accepting, but the kernel would still complete handshakes into
     * the backlog and those clients would hang until stop. Shutting the
     * listening socket down (Linux: leaves the LISTEN state, resets the
     * backlog) makes them fail at once; the fd is closed after stop. */
    if (h->listen_fd != MHD_INVALID_SOCKET) shutdown(h->listen_fd, SHUT_RDWR);
}

int kvs_http_drain(kvs_http *h, double deadline_ms) {
    pthread_mutex_lock(&h->mu);
    while (h->active > 0) {
        if (deadline_ms <= 0) {
            pthread_cond_wait(&h->cv, &h->mu);
            continue;
        }
        double left = deadline_ms - kvs_now_ms();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(left * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    int left = h->active;
    pthread_mutex_unlock(&h->mu);
    return left;
}

void kvs_http_stop(kvs_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    if (h->listen_fd != MHD_INVALID_SOCKET) close(h->listen_fd);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
