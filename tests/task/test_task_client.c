/*
 * test_task_client.c -- eval/client against in-process fake HTTP servers
 * (libmicrohttpd, a thread per connection): request body shape, answer
 * parsing, 5xx then success (retried, next URL), 4xx (not retried, the
 * server's message surfaced verbatim), a timeout, connection refused
 * (retried, then an error), an answer without `variants` (error, never a
 * silent `full`), the OpenAI api refusing non-full methods, keep-alive
 * (many requests over few connections), cells spread over two servers,
 * kv_spans sent and span_kept parsed (a malformed span_kept is an error, an
 * absent one leaves the output without it), POST /tokenize counts, and
 * images: multimodal_data decoded back to the bytes in marker order, none
 * sent without media, and the refusals before sending (marker count, a
 * marker in the suffix, an empty image, api openai).
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvs_client.h"
#include "task_media_util.h"
#include "test_util.h"

typedef enum { FAKE_OK, FAKE_400, FAKE_SLOW, FAKE_NO_VARIANTS, FAKE_BAD_SPANS, FAKE_NO_SPANS } fake_mode;

typedef struct {
    struct MHD_Daemon *d;
    int port;
    char url[64];
    pthread_mutex_t mu;
    fake_mode mode;
    int fail_first; /* answer 503 to this many requests first */
    int n_requests, n_connections;
    char last_body[8192];
} fake;

typedef struct {
    char *buf;
    size_t n;
} body;

static void on_conn(void *cls, struct MHD_Connection *c, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode code) {
    (void)c;
    (void)socket_ctx;
    fake *f = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        pthread_mutex_lock(&f->mu);
        f->n_connections++;
        pthread_mutex_unlock(&f->mu);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    body *b = *con_cls;
    if (b) {
        free(b->buf);
        free(b);
    }
    *con_cls = NULL;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A kvsieve-shaped answer echoing the request's variants. */
static char *answer_for(const char *req, int with_variants, fake_mode mode) {
    cJSON *in = cJSON_Parse(req);
    const cJSON *spans = cJSON_GetObjectItem(in, "kv_spans");
    const cJSON *vs = cJSON_GetObjectItem(cJSON_GetObjectItem(in, "kv_compression"), "variants");
    cJSON *out = cJSON_CreateObject();
    cJSON *choices = cJSON_AddArrayToObject(out, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddStringToObject(ch, "text", "plain");
    cJSON_AddItemToArray(choices, ch);
    cJSON *u = cJSON_AddObjectToObject(out, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", 7);
    cJSON_AddNumberToObject(u, "completion_tokens", 1);
    if (with_variants) {
        cJSON *arr = cJSON_AddArrayToObject(out, "variants");
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, vs) {
            cJSON *o = cJSON_CreateObject();
            char content[96];
            snprintf(content, sizeof content, "answer %d %s", i,
                     cJSON_GetObjectItem(v, "method")->valuestring);
            cJSON_AddStringToObject(o, "content", content);
            cJSON_AddNumberToObject(o, "tokens_predicted", 3 + i);
            cJSON_AddStringToObject(o, "stop_type", "word");
            cJSON *t = cJSON_AddObjectToObject(o, "timings");
            cJSON_AddNumberToObject(t, "prompt_n", 100);
            cJSON_AddNumberToObject(t, "prompt_ms", 12.5);
            cJSON_AddNumberToObject(t, "predicted_n", 3 + i);
            cJSON_AddNumberToObject(t, "predicted_ms", 30.0);
            cJSON_AddNumberToObject(t, "compress_ms", 1.5 + i);
            cJSON *kv = cJSON_AddObjectToObject(o, "kv");
            cJSON_AddNumberToObject(kv, "bytes_before", 4096);
            cJSON_AddNumberToObject(kv, "bytes_after", 1024 * (i + 1));
            cJSON_AddNumberToObject(kv, "tokens_before", 200);
            cJSON_AddNumberToObject(kv, "tokens_after", 50);
            cJSON_AddStringToObject(kv, "note", "fake");
            if (cJSON_IsArray(spans) && mode != FAKE_NO_SPANS) {
                /* 3 layers: span k of variant i keeps (k + 1) / 4, 1, i / 4 */
                cJSON *sk = cJSON_AddArrayToObject(kv, "span_kept");
                for (int k = 0; k < cJSON_GetArraySize(spans); k++) {
                    cJSON *row = cJSON_CreateArray();
                    cJSON_AddItemToArray(row, cJSON_CreateNumber((k + 1) / 4.0));
                    cJSON_AddItemToArray(row, cJSON_CreateNumber(mode == FAKE_BAD_SPANS ? 1.5 : 1.0));
                    cJSON_AddItemToArray(row, cJSON_CreateNumber(i / 4.0));
                    cJSON_AddItemToArray(sk, row);
                }
            }
            cJSON_AddItemToArray(arr, o);
            i++;
        }
    }
    char *s = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    cJSON_Delete(in);
    return s;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    fake *f = cls;
    body *b = *con_cls;
    if (!b) {
        b = calloc(1, sizeof *b);
        *con_cls = b;
        return MHD_YES;
    }
    if (*upload_size) {
        char *nb = realloc(b->buf, b->n + *upload_size + 1);
        memcpy(nb + b->n, upload, *upload_size);
        b->buf = nb;
        b->n += *upload_size;
        b->buf[b->n] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(method, "POST") && !strcmp(url, "/tokenize")) {
        /* one token per 4 bytes, plus BOS when add_special */
        cJSON *in = cJSON_Parse(b->buf ? b->buf : "");
        const cJSON *ct = cJSON_GetObjectItem(in, "content");
        if (!cJSON_IsString(ct)) {
            cJSON_Delete(in);
            return reply(c, 400, "{\"error\":{\"message\":\"content is required\",\"field\":\"content\"}}");
        }
        size_t n = (strlen(ct->valuestring) + 3) / 4 + (cJSON_IsTrue(cJSON_GetObjectItem(in, "add_special")) ? 1 : 0);
        cJSON *out = cJSON_CreateObject();
        cJSON *tk = cJSON_AddArrayToObject(out, "tokens");
        for (size_t k = 0; k < n; k++) cJSON_AddItemToArray(tk, cJSON_CreateNumber((double)k));
        char *a = cJSON_PrintUnformatted(out);
        enum MHD_Result r = reply(c, 200, a);
        free(a);
        cJSON_Delete(out);
        cJSON_Delete(in);
        return r;
    }
    if (strcmp(method, "POST") != 0 || strcmp(url, "/v1/completions") != 0)
        return reply(c, 404, "{\"error\":{\"message\":\"not found\"}}");
    pthread_mutex_lock(&f->mu);
    f->n_requests++;
    snprintf(f->last_body, sizeof f->last_body, "%s", b->buf ? b->buf : "");
    int fail = f->fail_first > 0;
    if (fail) f->fail_first--;
    fake_mode mode = f->mode;
    pthread_mutex_unlock(&f->mu);
    if (fail) return reply(c, 503, "{\"error\":{\"message\":\"server is draining\"}}");
    if (mode == FAKE_400)
        return reply(c, 400, "{\"error\":{\"message\":\"kv_compression.variants[0].ratio must be "
                             "in (0, 1], got 2\",\"field\":\"kv_compression.variants[0].ratio\","
                             "\"type\":\"invalid_request_error\"}}");
    if (mode == FAKE_SLOW) {
        struct timespec ts = {1, 500000000L};
        nanosleep(&ts, NULL);
    }
    char *a = answer_for(b->buf ? b->buf : "{}", mode != FAKE_NO_VARIANTS, mode);
    enum MHD_Result r = reply(c, 200, a);
    free(a);
    return r;
}

static int fake_start(fake *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL,
                            NULL, on_access, f, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, f,
                            MHD_OPTION_NOTIFY_CONNECTION, on_conn, f, MHD_OPTION_END);
    if (!f->d) return -1;
    f->port = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT)->port;
    snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", f->port);
    return 0;
}

static void fake_stop(fake *f) {
    MHD_stop_daemon(f->d);
    pthread_mutex_destroy(&f->mu);
}

/* A loopback port nobody listens on. */
static int dead_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, (struct sockaddr *)&sa, sizeof sa);
    socklen_t len = sizeof sa;
    getsockname(s, (struct sockaddr *)&sa, &len);
    close(s);
    return ntohs(sa.sin_port);
}

/* ---- collecting results -------------------------------------------------- */

typedef struct {
    int n_done;
    kvs_status status[64];
    char error[64][800];
    int attempts[64], url_index[64], n_outputs[64];
    char content[64][4][64];
    double compress_ms[64][4], prompt_ms[64][4];
    int64_t bytes_after[64][4], predicted_n[64][4], prompt_n[64][4];
    int span_n[64][4], span_layers[64][4];
    double span_kept[64][4][8];
} collected;

static void on_result(void *ctx, void *tag, const kvs_client_result *r) {
    collected *c = ctx;
    int i = (int)(intptr_t)tag;
    c->n_done++;
    c->status[i] = r->status;
    snprintf(c->error[i], sizeof c->error[i], "%s", r->error);
    c->attempts[i] = r->attempts;
    c->url_index[i] = r->url_index;
    c->n_outputs[i] = r->n_outputs;
    for (int k = 0; k < r->n_outputs && k < 4; k++) {
        snprintf(c->content[i][k], sizeof c->content[i][k], "%s", r->outputs[k].content);
        c->compress_ms[i][k] = r->outputs[k].compress_ms;
        c->prompt_ms[i][k] = r->outputs[k].prompt_ms;
        c->bytes_after[i][k] = r->outputs[k].bytes_after;
        c->predicted_n[i][k] = r->outputs[k].predicted_n;
        c->prompt_n[i][k] = r->outputs[k].prompt_n;
        c->span_n[i][k] = r->outputs[k].span_n;
        c->span_layers[i][k] = r->outputs[k].span_layers;
        for (int j = 0; j < r->outputs[k].span_n * r->outputs[k].span_layers && j < 8; j++)
            c->span_kept[i][k][j] = r->outputs[k].span_kept[j];
    }
}

static const kvs_client_variant VARS[3] = {
    {"full", NULL, 1.0, 0, 0},
    {"snapkv", "{\"window\":8}", 0.2, 0, 0},
    {"h2o", NULL, 0, 64, 0},
};

static kvs_client_request make_req(int n_variants, const char *suffix) {
    static const char *const stop[] = {"\n"};
    kvs_client_request r;
    memset(&r, 0, sizeof r);
    r.prompt = "The passkey is 123. What is the passkey?";
    r.suffix = suffix;
    r.max_tokens = 8;
    r.stop = stop;
    r.n_stop = 1;
    r.n_variants = n_variants;
    r.variants = VARS;
    return r;
}

static void run_all(kvs_client *cl, collected *c, double max_ms) {
    kvs_err err = {0};
    double t0 = kvs_now_ms();
    while (kvs_client_pending(cl) > 0 && kvs_now_ms() - t0 < max_ms)
        CHECK_OK(kvs_client_poll(cl, 100, on_result, c, NULL, &err), &err);
}

static kvs_client *client_for(const char *const *urls, int n, double timeout_s, int per_url) {
    kvs_client_opts o;
    kvs_client_opts_defaults(&o);
    o.urls = urls;
    o.n_urls = n;
    o.timeout_s = timeout_s;
    o.connect_timeout_s = 2;
    o.max_attempts = 3;
    o.backoff_ms = 20;
    o.per_url = per_url;
    kvs_client *cl = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_client_new(&o, &cl, &err), &err);
    return cl;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_success_and_body(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 10, 2);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(3, "Question: what?");
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->n_done, 1);
    CHECK_EQ_INT(c->status[0], KVS_OK);
    CHECK_EQ_INT(c->attempts[0], 1);
    CHECK_EQ_INT(c->n_outputs[0], 3);
    CHECK(!strcmp(c->content[0][0], "answer 0 full"));
    CHECK(!strcmp(c->content[0][2], "answer 2 h2o"));
    CHECK_NEAR(c->compress_ms[0][1], 2.5, 1e-12);
    CHECK_NEAR(c->prompt_ms[0][2], 12.5, 1e-12);
    CHECK_EQ_INT(c->bytes_after[0][2], 3072);
    CHECK_EQ_INT(c->predicted_n[0][1], 4);
    CHECK_EQ_INT(c->prompt_n[0][0], 100);
    /* the body: kv_compression.variants with budgets, params and the suffix */
    cJSON *b = cJSON_Parse(f.last_body);
    CHECK(b != NULL);
    const cJSON *vs = cJSON_GetObjectItem(cJSON_GetObjectItem(b, "kv_compression"), "variants");
    CHECK_EQ_INT(cJSON_GetArraySize(vs), 3);
    const cJSON *v0 = cJSON_GetArrayItem(vs, 0), *v1 = cJSON_GetArrayItem(vs, 1),
                *v2 = cJSON_GetArrayItem(vs, 2);
    CHECK(!strcmp(cJSON_GetObjectItem(v0, "method")->valuestring, "full"));
    CHECK(cJSON_GetObjectItem(v0, "ratio") == NULL); /* full: no budget */
    CHECK_NEAR(cJSON_GetObjectItem(v1, "ratio")->valuedouble, 0.2, 1e-12);
    CHECK_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(v1, "params"), "window")->valuedouble, 8, 0);
    CHECK_NEAR(cJSON_GetObjectItem(v2, "tokens")->valuedouble, 64, 0);
    CHECK(!strcmp(cJSON_GetObjectItem(v2, "suffix")->valuestring, "Question: what?"));
    CHECK_NEAR(cJSON_GetObjectItem(b, "temperature")->valuedouble, 0, 0);
    CHECK(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "stop"), 0)->valuestring, "\n"));
    CHECK(cJSON_GetObjectItem(b, "multimodal_data") == NULL); /* no media: no field */
    cJSON_Delete(b);
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

static void test_retry_5xx(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    f.fail_first = 2;
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 10, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(2, NULL);
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_OK);
    CHECK_EQ_INT(c->attempts[0], 3);
    CHECK_EQ_INT(f.n_requests, 3);
    CHECK(!strcmp(c->content[0][1], "answer 1 snapkv"));
    /* more 5xx than attempts: the last server message is surfaced */
    f.fail_first = 10;
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)1, &err), &err);
    run_all(cl, c, 5000);
    CHECK(c->status[1] != KVS_OK);
    CHECK_EQ_INT(c->attempts[1], 3);
    CHECK_MSG(strstr(c->error[1], "HTTP 503") && strstr(c->error[1], "server is draining") &&
                  strstr(c->error[1], "after 3 tries"),
              "%s", c->error[1]);
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

static void test_4xx_not_retried(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    f.mode = FAKE_400;
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 10, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(2, NULL);
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_ERR_INVALID);
    CHECK_EQ_INT(c->attempts[0], 1);
    CHECK_EQ_INT(f.n_requests, 1);
    CHECK_MSG(strstr(c->error[0], "HTTP 400") &&
                  strstr(c->error[0], "kv_compression.variants[0].ratio must be in (0, 1], got 2") &&
                  strstr(c->error[0], "not retried"),
              "%s", c->error[0]);
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

static void test_timeout(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    f.mode = FAKE_SLOW;
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 0.3, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(1, NULL);
    double t0 = kvs_now_ms();
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    double ms = kvs_now_ms() - t0;
    CHECK_EQ_INT(c->status[0], KVS_ERR_IO);
    CHECK_EQ_INT(c->attempts[0], 1);
    CHECK_MSG(strstr(c->error[0], "timed out after 0.3 s") != NULL, "%s", c->error[0]);
    CHECK_MSG(ms < 1400, "took %.0f ms (the server sleeps 1500)", ms);
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

static void test_refused(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", dead_port());
    const char *urls[] = {url};
    kvs_client *cl = client_for(urls, 1, 5, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(1, NULL);
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_ERR_IO);
    CHECK_EQ_INT(c->attempts[0], 3);
    CHECK_MSG(strstr(c->error[0], "failed after 3 tries") && strstr(c->error[0], "is the backend running?"),
              "%s", c->error[0]);
    kvs_client_free(cl);
    free(c);
}

/* a dead URL and a live one: the retry goes to the next URL and succeeds */
static void test_failover_and_spread(void) {
    fake f, g;
    CHECK(fake_start(&f) == 0);
    CHECK(fake_start(&g) == 0);
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", dead_port());
    const char *u1[] = {dead, f.url};
    kvs_client *cl = client_for(u1, 2, 5, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(1, NULL);
    for (int i = 0; i < 4; i++) CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)i, &err), &err);
    run_all(cl, c, 10000);
    CHECK_EQ_INT(c->n_done, 4);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(c->status[i], KVS_OK);
        CHECK_EQ_INT(c->url_index[i], 1);
    }
    kvs_client_free(cl);
    /* two live servers, 24 requests, 2 in flight each: both serve, and
     * keep-alive holds the connection count at the in-flight limit */
    f.n_requests = f.n_connections = 0;
    const char *u2[] = {f.url, g.url};
    cl = client_for(u2, 2, 5, 2);
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 24; i++) CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)i, &err), &err);
    int pending = -1;
    CHECK_OK(kvs_client_poll(cl, 0, on_result, c, &pending, &err), &err);
    run_all(cl, c, 10000);
    CHECK_EQ_INT(c->n_done, 24);
    int ok = 0;
    for (int i = 0; i < 24; i++) ok += c->status[i] == KVS_OK;
    CHECK_EQ_INT(ok, 24);
    CHECK_EQ_INT(f.n_requests + g.n_requests, 24);
    /* Dispatch is least-in-flight, so the split depends on which server answers
     * faster; only the first fill is deterministic: 2 in flight on each. */
    CHECK_MSG(f.n_requests >= 2 && g.n_requests >= 2, "spread %d / %d", f.n_requests, g.n_requests);
    CHECK_MSG(f.n_connections <= 2 && g.n_connections <= 2, "connections %d / %d (keep-alive)",
              f.n_connections, g.n_connections);
    kvs_client_free(cl);
    fake_stop(&f);
    fake_stop(&g);
    free(c);
}

static void test_protocol_errors(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    f.mode = FAKE_NO_VARIANTS;
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 5, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(2, NULL);
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(c->error[0], "ignored kv_compression") && strstr(c->error[0], "only evaluate method 'full'"),
              "%s", c->error[0]);
    kvs_client_free(cl);
    /* api openai: full only, answered from choices[0] */
    kvs_client_opts o;
    kvs_client_opts_defaults(&o);
    o.urls = urls;
    o.n_urls = 1;
    o.api = KVS_API_OPENAI;
    o.model = "some-model";
    CHECK_OK(kvs_client_new(&o, &cl, &err), &err);
    CHECK_FAILS(kvs_client_submit(cl, &r, NULL, &err), KVS_ERR_UNSUPPORTED, &err,
                "backend api 'openai' evaluates only method 'full'");
    kvs_client_request r1 = make_req(1, NULL);
    memset(c, 0, sizeof *c);
    CHECK_OK(kvs_client_submit(cl, &r1, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_OK);
    CHECK(!strcmp(c->content[0][0], "plain"));
    CHECK_EQ_INT(c->prompt_n[0][0], 7);
    cJSON *b = cJSON_Parse(f.last_body);
    CHECK(cJSON_GetObjectItem(b, "kv_compression") == NULL);
    CHECK(!strcmp(cJSON_GetObjectItem(b, "model")->valuestring, "some-model"));
    cJSON_Delete(b);
    kvs_client_request r2 = make_req(1, "suffix");
    CHECK_FAILS(kvs_client_submit(cl, &r2, NULL, &err), KVS_ERR_UNSUPPORTED, &err, "query-agnostic");
    kvs_client_free(cl);
    /* bad options */
    o.n_urls = 0;
    CHECK_FAILS(kvs_client_new(&o, &cl, &err), KVS_ERR_INVALID, &err, "at least one backend URL");
    const char *bad[] = {"localhost:80"};
    o.urls = bad;
    o.n_urls = 1;
    CHECK_FAILS(kvs_client_new(&o, &cl, &err), KVS_ERR_INVALID, &err, "not an http(s):// URL");
    fake_stop(&f);
    free(c);
}

/* kv_spans in the body, span_kept [span][layer] back; malformed: an error;
 * absent: outputs without it. */
static void test_spans(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 10, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    kvs_client_request r = make_req(2, NULL);
    const int64_t sp[4] = {15, 18, 0, 3};
    r.spans = sp;
    r.n_spans = 2;
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_OK);
    cJSON *b = cJSON_Parse(f.last_body);
    const cJSON *ks = cJSON_GetObjectItem(b, "kv_spans");
    CHECK_EQ_INT(cJSON_GetArraySize(ks), 2);
    CHECK_NEAR(cJSON_GetObjectItem(cJSON_GetArrayItem(ks, 0), "start")->valuedouble, 15, 0);
    CHECK_NEAR(cJSON_GetObjectItem(cJSON_GetArrayItem(ks, 0), "end")->valuedouble, 18, 0);
    CHECK_NEAR(cJSON_GetObjectItem(cJSON_GetArrayItem(ks, 1), "end")->valuedouble, 3, 0);
    cJSON_Delete(b);
    CHECK_EQ_INT(c->span_n[0][1], 2);
    CHECK_EQ_INT(c->span_layers[0][1], 3);
    CHECK_NEAR(c->span_kept[0][1][0], 0.25, 0);  /* span 0, layer 0 */
    CHECK_NEAR(c->span_kept[0][1][2], 0.25, 0);  /* span 0, layer 2: variant 1 -> 1/4 */
    CHECK_NEAR(c->span_kept[0][1][3], 0.5, 0);   /* span 1, layer 0 */
    CHECK_NEAR(c->span_kept[0][0][5], 0.0, 0);   /* variant 0, span 1, layer 2 */
    /* malformed (a share of 1.5) */
    f.mode = FAKE_BAD_SPANS;
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)1, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[1], KVS_ERR_FORMAT);
    CHECK(strstr(c->error[1], "span_kept") != NULL);
    /* a server that predates kv_spans */
    f.mode = FAKE_NO_SPANS;
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)2, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[2], KVS_OK);
    CHECK_EQ_INT(c->span_n[2][0], 0);
    /* bad ranges and too many spans are refused before sending */
    const int64_t bad[2] = {10, 5};
    r.spans = bad;
    r.n_spans = 1;
    CHECK_FAILS(kvs_client_submit(cl, &r, NULL, &err), KVS_ERR_INVALID, &err, "kv_spans[0]");
    r.n_spans = 65;
    CHECK_FAILS(kvs_client_submit(cl, &r, NULL, &err), KVS_ERR_INVALID, &err, "at most 64");
    /* POST /tokenize */
    int64_t nt = 0;
    CHECK_OK(kvs_http_count_tokens(f.url, "abcdefghij", 10, 5, &nt, &err), &err);
    CHECK_EQ_INT(nt, 3 + 1);
    CHECK_OK(kvs_http_count_tokens(f.url, "abcdefghij", 4, 5, &nt, &err), &err); /* first 4 bytes */
    CHECK_EQ_INT(nt, 1 + 1);
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", dead_port());
    CHECK_FAILS(kvs_http_count_tokens(dead, "x", 1, 2, &nt, &err), KVS_ERR_IO, &err, "tokenize");
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

/* images: base64 in multimodal_data, in the order of the prompt's markers */
static void test_media(void) {
    fake f;
    CHECK(fake_start(&f) == 0);
    const char *urls[] = {f.url};
    kvs_client *cl = client_for(urls, 1, 10, 1);
    collected *c = calloc(1, sizeof *c);
    kvs_err err = {0};
    /* 10, 11 and 12 bytes: base64 with two, one and no padding characters */
    static const unsigned char a[10] = {0x89, 'P', 'N', 'G', 0, 1, 2, 3, 0xfe, 0xff};
    static const unsigned char b[11] = "hello world";
    static const unsigned char z[12] = {0};
    const kvs_client_media m[4] = {{a, sizeof a}, {b, sizeof b}, {a, sizeof a}, {z, sizeof z}};
    kvs_client_request r = make_req(2, NULL);
    r.prompt = KVS_CLIENT_MEDIA_MARKER "one " KVS_CLIENT_MEDIA_MARKER " two" KVS_CLIENT_MEDIA_MARKER
                                       KVS_CLIENT_MEDIA_MARKER " end";
    r.media = m;
    r.n_media = 4;
    CHECK_OK(kvs_client_submit(cl, &r, (void *)(intptr_t)0, &err), &err);
    run_all(cl, c, 5000);
    CHECK_EQ_INT(c->status[0], KVS_OK);
    cJSON *sent_body = cJSON_Parse(f.last_body);
    const cJSON *md = cJSON_GetObjectItem(sent_body, "multimodal_data");
    CHECK_EQ_INT(cJSON_GetArraySize(md), 4);
    for (int i = 0; i < 4 && i < cJSON_GetArraySize(md); i++) {
        const cJSON *it = cJSON_GetArrayItem(md, i);
        size_t n = 0;
        unsigned char *got = cJSON_IsString(it) ? media_b64_decode(it->valuestring, &n) : NULL;
        CHECK_MSG(got && n == m[i].n && !memcmp(got, m[i].data, n), "multimodal_data[%d] = %s", i,
                  cJSON_IsString(it) ? it->valuestring : "(not a string)");
        free(got);
    }
    CHECK(!strcmp(cJSON_GetObjectItem(sent_body, "prompt")->valuestring, r.prompt));
    cJSON_Delete(sent_body);
    /* refused before sending: counts that differ, a marker in the suffix, an empty image */
    int sent = f.n_requests;
    r.n_media = 3;
    CHECK_FAILS(kvs_client_submit(cl, &r, NULL, &err), KVS_ERR_INVALID, &err,
                "4 '" KVS_CLIENT_MEDIA_MARKER "' markers for 3 images");
    r.n_media = 4;
    r.suffix = "and " KVS_CLIENT_MEDIA_MARKER;
    CHECK_FAILS(kvs_client_submit(cl, &r, NULL, &err), KVS_ERR_INVALID, &err, "suffix");
    r.suffix = NULL;
    const kvs_client_media empty[1] = {{a, 0}};
    kvs_client_request r1 = make_req(1, NULL);
    r1.prompt = "x " KVS_CLIENT_MEDIA_MARKER;
    r1.media = empty;
    r1.n_media = 1;
    CHECK_FAILS(kvs_client_submit(cl, &r1, NULL, &err), KVS_ERR_INVALID, &err, "media[0] has 0 bytes");
    CHECK_EQ_INT(kvs_client_pending(cl), 0);
    CHECK_EQ_INT(f.n_requests, sent);
    kvs_client_free(cl);
    /* a plain OpenAI server gets no images */
    kvs_client_opts o;
    kvs_client_opts_defaults(&o);
    o.urls = urls;
    o.n_urls = 1;
    o.api = KVS_API_OPENAI;
    o.model = "m";
    CHECK_OK(kvs_client_new(&o, &cl, &err), &err);
    r1.media = m;
    CHECK_FAILS(kvs_client_submit(cl, &r1, NULL, &err), KVS_ERR_UNSUPPORTED, &err, "sends text only");
    kvs_client_free(cl);
    fake_stop(&f);
    free(c);
}

int main(void) {
    double t0 = kvs_now_ms();
    test_media();
    test_spans();
    test_success_and_body();
    test_retry_5xx();
    test_4xx_not_retried();
    test_timeout();
    test_refused();
    test_failover_and_spread();
    test_protocol_errors();
    fprintf(stderr, "task_client: %.0f ms\n", kvs_now_ms() - t0);
    return kvs_test_finish("task_client");
}
