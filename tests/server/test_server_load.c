/*
 * test_server_load.c -- the scheduler and careless clients, in-process, on
 * the tiny gemma3 test model (tests/backend/tiny_model.c), loopback only.
 *
 * Covers: continuous batching (a request served alone and the same request
 * among others give identical greedy tokens for every variant, suffix
 * variants included; the batch really held several sequences), ignore_eos
 * (a sampled run that ends on EOS runs to n_predict with it, without EOG
 * tokens), n_predict above --n-predict-max refused and no n_predict capped,
 * kv_spans / span_kept (exact shares for StreamingLLM, 1 for full and for
 * uncompressed layers, outputs unchanged by asking, 400 for token prompts),
 * a client that hangs up cancels its request (running: it leaves the batch
 * before finishing; queued: at once), a full queue answers 503 with
 * Retry-After, 1100 idle connections (descriptors above FD_SETSIZE) do not
 * stop the server from answering, a bounded load test (64 clients, a tenth
 * hanging up, some without n_predict: every completed answer equals its
 * serial answer, /metrics counts the cancellations, /health ok afterwards),
 * the drain timeout (queued requests cancelled with 503, stop returns), and
 * the cache type (f16 and bf16 rows half the bytes of f32; /v1/models says which).
 * Not covered: the real model; SIGTERM delivery (test_server_cli.c).
 * No assertion on wall-clock time; every loop is bounded.
 */
#include "kvs_backend.h"
#include "kvs_server.h"
#include "server_internal.h"
#include "test_util.h"
#include "backend/tiny_model.h"
#include "server/http_client.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define N_CTX 256

static tc_server g_srv = {.timeout_s = 120}; /* the port of the server under test */

static void sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL); }

static cJSON *post(const char *json, long *status) {
    return tc_call(&g_srv, "POST", "/completion", json, NULL, status);
}

/* A metric from /metrics: the line that starts with `name` exactly (labels included). */
static double metric(const char *name) {
    tc_reply r;
    long st = tc_request(&g_srv, "GET", "/metrics", NULL, NULL, &r);
    double v = NAN;
    size_t n = strlen(name);
    for (const char *p = st == 200 ? r.body : NULL; p && *p;) {
        if (strncmp(p, name, n) == 0 && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    tc_reply_free(&r);
    return v;
}
#define M_CANCEL_DISC "kvsieve_requests_cancelled_total{reason=\"disconnect\"}"

/* Wait (bounded) until metric(name) >= want; returns the last value. */
static double wait_metric(const char *name, double want, int max_ms) {
    double v = metric(name);
    for (int i = 0; i < max_ms / 2 && !(v >= want); i++) {
        sleep_ms(2);
        v = metric(name);
    }
    return v;
}

/* A raw loopback connection that sends one POST /completion and keeps the
 * socket open (the caller closes it: a client that hangs up). */
static int raw_connect(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_srv.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int raw_post(const char *json) {
    int fd = raw_connect();
    if (fd < 0) return -1;
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     strlen(json));
    if (write(fd, head, (size_t)n) != n || write(fd, json, strlen(json)) != (ssize_t)strlen(json)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int same_tokens(const cJSON *a, const cJSON *b) {
    return a && b && cJSON_Compare(tc_obj(a, "tokens"), tc_obj(b, "tokens"), 1);
}

/* ---- continuous batching ----------------------------------------------------- */

static const char *const PROMPTS[] = {
    "the cat is on the cat a cat is an cat the cat on a cat is the cat an cat on",
    "a cat on the cat is an cat the cat a cat on the is cat",
    "on the cat the cat is a cat an cat on the cat is",
    "the the cat a an on is cat cat the a",
};

static void variants_request(char *req, size_t n, int p, int n_predict) {
    snprintf(req, n,
             "{\"prompt\": \"%s\", \"n_predict\": %d, \"kv_compression\": {\"variants\": ["
             "{\"method\": \"full\"},"
             "{\"method\": \"streamingllm\", \"ratio\": 0.5},"
             "{\"method\": \"snapkv\", \"tokens\": 8},"
             "{\"method\": \"h2o\", \"ratio\": 0.3, \"compress_local\": true},"
             "{\"method\": \"snapkv\", \"ratio\": 0.4, \"suffix\": \" the cat is\"},"
             "{\"method\": \"full\", \"suffix\": \" a cat on\"}]}}",
             PROMPTS[p], n_predict);
}

typedef struct {
    const char *req;
    long status;
    cJSON *r;
} job_t;

static void *job_run(void *p) {
    job_t *j = p;
    j->r = post(j->req, &j->status);
    return NULL;
}

static void test_batch_equality(void) {
    enum { P = 4 };
    char reqs[P][2048];
    cJSON *alone[P];
    long st;
    for (int p = 0; p < P; p++) {
        variants_request(reqs[p], sizeof reqs[p], p, 20 + 5 * p);
        alone[p] = post(reqs[p], &st);
        CHECK_EQ_INT(st, 200);
        CHECK_EQ_INT(cJSON_GetArraySize(tc_obj(alone[p], "variants")), 6);
    }
    /* the same requests all at once, twice over: they share decode steps */
    double steps0 = metric("kvsieve_batch_steps_total"), seqs0 = metric("kvsieve_batch_seq_steps_total");
    enum { J = 2 * P };
    job_t jobs[J];
    pthread_t th[J];
    for (int i = 0; i < J; i++) {
        jobs[i] = (job_t){reqs[i % P], 0, NULL};
        pthread_create(&th[i], NULL, job_run, &jobs[i]);
    }
    for (int i = 0; i < J; i++) pthread_join(th[i], NULL);
    double steps = metric("kvsieve_batch_steps_total") - steps0, seqs = metric("kvsieve_batch_seq_steps_total") - seqs0;
    for (int i = 0; i < J; i++) {
        CHECK_EQ_INT(jobs[i].status, 200);
        const cJSON *va = tc_obj(alone[i % P], "variants"), *vb = tc_obj(jobs[i].r, "variants");
        CHECK_EQ_INT(cJSON_GetArraySize(vb), 6);
        for (int v = 0; v < 6; v++) {
            const cJSON *a = cJSON_GetArrayItem(va, v), *b = cJSON_GetArrayItem(vb, v);
            CHECK_MSG(same_tokens(a, b) && !strcmp(tc_str(a, "content"), tc_str(b, "content")),
                      "request %d variant %d: tokens differ when batched with others", i % P, v);
            CHECK(!strcmp(tc_str(a, "stop_type"), tc_str(b, "stop_type")));
            const cJSON *t = tc_obj(b, "timings");
            CHECK(tc_num(t, "predicted_ms") >= 0 && tc_num(t, "prompt_ms") > 0);
            if (v >= 4) CHECK_MSG(tc_num(t, "suffix_ms") > 0, "variant %d: suffix_ms %g", v, tc_num(t, "suffix_ms"));
        }
        cJSON_Delete(jobs[i].r);
    }
    /* 8 requests x 6 variants through 4 slots: steps held many sequences */
    CHECK_MSG(steps > 0 && seqs / steps > 6.0, "mean batch %g over %g steps: requests were not batched together",
              steps > 0 ? seqs / steps : 0, steps);
    printf("batch equality: %g steps, mean batch %.2f sequences\n", steps, steps > 0 ? seqs / steps : 0);
    for (int p = 0; p < P; p++) cJSON_Delete(alone[p]);
    CHECK(metric("kvsieve_batch_size") == 0);
    CHECK(metric("kvsieve_requests_processing") == 0);
}

/* ---- ignore_eos and n_predict caps ----------------------------------------------- */

static void test_ignore_eos(kvs_model *m) {
    char req[1024];
    long st;
    int found = -1, n_eos = 0;
    /* sampled runs at a high temperature end on EOS now and then: find one */
    for (int seed = 1; seed <= 200 && found < 0; seed++) {
        snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 60, \"temperature\": 3.0, \"seed\": %d}",
                 PROMPTS[1], seed);
        cJSON *r = post(req, &st);
        if (r && !strcmp(tc_str(r, "stop_type"), "eos") && tc_num(r, "tokens_predicted") < 60) {
            found = seed;
            n_eos = (int)tc_num(r, "tokens_predicted");
        }
        cJSON_Delete(r);
    }
    CHECK_MSG(found > 0, "no seed in 1..200 ended on EOS: ignore_eos is not exercised");
    if (found > 0) {
        snprintf(req, sizeof req,
                 "{\"prompt\": \"%s\", \"n_predict\": 60, \"temperature\": 3.0, \"seed\": %d, \"ignore_eos\": true}",
                 PROMPTS[1], found);
        cJSON *r = post(req, &st);
        CHECK_EQ_INT(st, 200);
        CHECK_MSG(r && !strcmp(tc_str(r, "stop_type"), "limit") && tc_num(r, "tokens_predicted") == 60,
                  "ignore_eos: stop %s after %g tokens (without it: eos after %d)", r ? tc_str(r, "stop_type") : "?",
                  r ? tc_num(r, "tokens_predicted") : -1, n_eos);
        const cJSON *t, *arr = r ? tc_obj(r, "tokens") : NULL;
        cJSON_ArrayForEach(t, arr) CHECK(!kvs_token_is_eog(m, (int32_t)t->valuedouble));
        CHECK(r && cJSON_IsTrue(tc_obj(tc_obj(r, "generation_settings"), "ignore_eos")));
        cJSON_Delete(r);
    }
    /* above the cap: refused naming the field; none asked: capped, said so */
    cJSON *r = post("{\"prompt\": \"the cat\", \"n_predict\": 221}", &st);
    CHECK_EQ_INT(st, 400);
    CHECK(r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "n_predict"));
    CHECK(r && strstr(tc_str(tc_obj(r, "error"), "message"), "n-predict-max"));
    cJSON_Delete(r);
    r = post("{\"prompt\": \"the cat\", \"ignore_eos\": true}", &st);
    CHECK_EQ_INT(st, 200);
    CHECK(r && tc_num(r, "tokens_predicted") == 220 && !strcmp(tc_str(r, "stop_type"), "limit"));
    CHECK(r && tc_num(tc_obj(r, "generation_settings"), "n_predict_max") == 220);
    CHECK(r && tc_num(tc_obj(r, "generation_settings"), "n_predict") == -1);
    cJSON_Delete(r);
    r = post("{\"prompt\": \"the cat\", \"ignore_eos\": 1}", &st);
    CHECK_EQ_INT(st, 400);
    CHECK(r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "ignore_eos"));
    cJSON_Delete(r);
}

/* ---- kv_spans --------------------------------------------------------------------- */

static void test_spans(kvs_model *m) {
    const char *prompt = PROMPTS[0];
    kvs_err err_ = {0}, *err = &err_;
    int32_t *toks = NULL;
    int N = 0;
    CHECK_OK(kvs_tokenize(m, prompt, strlen(prompt), kvs_model_special(m)->add_bos, 1, &toks, &N, err), err);
    free(toks);
    /* one token per word after BOS: word w is token w + 1 */
    int ws[64], we[64], nw = 0;
    for (int i = 0; prompt[i] && nw < 64;) {
        while (prompt[i] == ' ') i++;
        ws[nw] = i;
        while (prompt[i] && prompt[i] != ' ') i++;
        we[nw++] = i;
    }
    CHECK_EQ_INT(N, nw + 1);
    const int B = N / 2; /* streamingllm 0.5 keeps 4 sinks and the last B - 4 */
    const int mid = 6;   /* word 6 = token 7: neither a sink nor recent */
    CHECK(mid + 1 >= 4 && mid + 1 < N - (B - 4));
    char req[2048];
    const char *body = "\"kv_compression\": {\"variants\": [{\"method\": \"streamingllm\", \"ratio\": 0.5}, "
                       "{\"method\": \"full\"}, {\"method\": \"snapkv\", \"ratio\": 0.5, \"suffix\": \" the cat\"}]}";
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 6, %s, \"kv_spans\": [{\"start\": 0, \"end\": %zu}, "
             "{\"start\": %d, \"end\": %d}, {\"start\": %d, \"end\": %d}]}",
             prompt, body, strlen(prompt), ws[nw - 1], we[nw - 1], ws[mid], ws[mid] + 1);
    long st;
    cJSON *r = post(req, &st);
    CHECK_EQ_INT(st, 200);
    snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 6, %s}", prompt, body);
    cJSON *plain = post(req, &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *vs = tc_obj(r, "variants"), *vp = tc_obj(plain, "variants");
    for (int v = 0; v < 3; v++) {
        const cJSON *a = cJSON_GetArrayItem(vs, v), *b = cJSON_GetArrayItem(vp, v);
        CHECK_MSG(same_tokens(a, b), "variant %d: asking for kv_spans changed the output", v);
        CHECK(tc_num(tc_obj(a, "kv"), "tokens_after") == tc_num(tc_obj(b, "kv"), "tokens_after"));
        CHECK(!tc_obj(tc_obj(b, "kv"), "span_kept"));
        const cJSON *sk = tc_obj(tc_obj(a, "kv"), "span_kept");
        CHECK_EQ_INT(cJSON_GetArraySize(sk), 3);
        for (int k = 0; k < 3; k++) {
            const cJSON *row = cJSON_GetArrayItem(sk, k);
            CHECK_EQ_INT(cJSON_GetArraySize(row), 6);
            for (int l = 0; l < 6; l++) {
                double x = cJSON_GetArrayItem(row, l) ? cJSON_GetArrayItem(row, l)->valuedouble : NAN;
                int local = (l + 1) % 6 != 0;
                double want = NAN;
                if (v == 1 || local) want = 1.0; /* full, or a layer left uncompressed */
                else if (v == 0) want = k == 0 ? (double)(B - 1) / (N - 1) : k == 1 ? 1.0 : 0.0;
                if (!isnan(want))
                    CHECK_MSG(fabs(x - want) < 1e-12, "variant %d span %d layer %d: span_kept %g, want %g", v, k, l,
                              x, want);
                else
                    CHECK(x >= 0 && x <= 1);
            }
        }
    }
    cJSON_Delete(r);
    cJSON_Delete(plain);
    r = post("{\"prompt\": [2, 270, 271], \"n_predict\": 2, \"kv_spans\": [{\"start\": 0, \"end\": 1}]}", &st);
    CHECK_EQ_INT(st, 400);
    CHECK(r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "kv_spans"));
    cJSON_Delete(r);
    r = post("{\"prompt\": \"the cat\", \"kv_spans\": [{\"start\": 3, \"end\": 2}]}", &st);
    CHECK_EQ_INT(st, 400);
    CHECK(r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "kv_spans[0].end"));
    cJSON_Delete(r);
    r = post("{\"prompt\": \"the cat\", \"kv_spans\": [{\"start\": 0, \"end\": 99}]}", &st);
    CHECK_EQ_INT(st, 400);
    CHECK(r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "kv_spans[0].end"));
    cJSON_Delete(r);
    /* no kv_compression: kv describes the plain cache, every share 1 */
    r = post("{\"prompt\": \"the cat is on\", \"n_predict\": 2, \"kv_spans\": [{\"start\": 4, \"end\": 7}]}", &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *row = cJSON_GetArrayItem(tc_obj(tc_obj(r, "kv"), "span_kept"), 0);
    CHECK_EQ_INT(cJSON_GetArraySize(row), 6);
    for (int l = 0; l < 6; l++) CHECK(cJSON_GetArrayItem(row, l) && cJSON_GetArrayItem(row, l)->valuedouble == 1.0);
    cJSON_Delete(r);
}

/* ---- careless clients --------------------------------------------------------------- */

/* a long request: 32 variants x 200 tokens, never stopped by EOS; each its own suffix, so that no two
 * share a cache (identical ones would decode once: same_as) */
#define VS(a, b) "{\"method\": \"full\", \"suffix\": \" x" #a "\"}, {\"method\": \"full\", \"suffix\": \" x" #b "\"}, "
static const char LONG_REQ[] = "{\"prompt\": \"the cat is on the\", \"n_predict\": 200, \"ignore_eos\": true, "
                               "\"kv_compression\": ["
                               VS(0, 1) VS(2, 3) VS(4, 5) VS(6, 7) VS(8, 9) VS(10, 11) VS(12, 13) VS(14, 15)
                               VS(16, 17) VS(18, 19) VS(20, 21) VS(22, 23) VS(24, 25) VS(26, 27) VS(28, 29)
                               "{\"method\": \"full\", \"suffix\": \" x30\"}, {\"method\": \"full\", \"suffix\": \" x31\"}]}";
#undef VS

static void test_disconnect(kvs_server *srv) {
    /* running: it leaves the batch well before its 200 tokens */
    double c0 = metric(M_CANCEL_DISC), s0 = metric("kvsieve_batch_steps_total");
    int fd = raw_post(LONG_REQ);
    CHECK(fd >= 0);
    double live = wait_metric("kvsieve_batch_size", 32, 20000);
    CHECK_MSG(live == 32, "the long request never ran (batch size %g)", live);
    double s_close = metric("kvsieve_batch_steps_total");
    close(fd);
    double c1 = wait_metric(M_CANCEL_DISC, c0 + 1, 20000);
    CHECK_MSG(c1 == c0 + 1, "hang-up while running: cancellations %g -> %g", c0, c1);
    double live_after = metric("kvsieve_batch_size");
    double s1 = metric("kvsieve_batch_steps_total");
    CHECK_MSG(live_after == 0, "batch still holds %g sequences after the cancel", live_after);
    CHECK_MSG(s1 - s0 < 199, "the cancelled request ran %g steps (of 199)", s1 - s0);
    printf("disconnect: %g steps before the close, %g after it\n", s_close - s0, s1 - s_close);
    /* queued: hold every slot, hang up, the queue empties at once */
    for (int i = 0; i < 4; i++) srv_slot_acquire(srv);
    fd = raw_post("{\"prompt\": \"the cat\", \"n_predict\": 4}");
    double w = wait_metric("kvsieve_requests_waiting", 1, 20000);
    CHECK_MSG(w == 1, "the request did not queue (%g waiting)", w);
    close(fd);
    double c2 = wait_metric(M_CANCEL_DISC, c1 + 1, 20000);
    CHECK_MSG(c2 == c1 + 1, "hang-up while queued: cancellations %g -> %g", c1, c2);
    CHECK(metric("kvsieve_requests_waiting") == 0);
    for (int i = 0; i < 4; i++) srv_slot_release(srv);
    long st;
    cJSON *r = post("{\"prompt\": \"the cat\", \"n_predict\": 4}", &st);
    CHECK_EQ_INT(st, 200);
    cJSON_Delete(r);
}

static void *post_job(void *p) {
    job_t *j = p;
    j->r = post(j->req, &j->status);
    return NULL;
}

/* A server with 1 slot and a queue of 1: the slot held, one request waits, the next gets 503. */
static void test_queue_full(kvs_model *m) {
    kvs_server_config cfg;
    kvs_server_config_defaults(&cfg);
    cfg.port = 0;
    cfg.threads = 1;
    cfg.n_ctx = N_CTX;
    cfg.slots = 1;
    cfg.queue = 1;
    kvs_err err_ = {0}, *err = &err_;
    kvs_server *srv = NULL;
    CHECK_OK(kvs_server_start(m, &cfg, &srv, err), err);
    if (!srv) return;
    int saved = g_srv.port;
    g_srv.port = kvs_server_port(srv);
    srv_slot_acquire(srv);
    job_t j = {"{\"prompt\": \"the cat\", \"n_predict\": 3}", 0, NULL};
    pthread_t th;
    pthread_create(&th, NULL, post_job, &j);
    CHECK(wait_metric("kvsieve_requests_waiting", 1, 20000) == 1);
    tc_reply a;
    long st = tc_request(&g_srv, "POST", "/completion", "{\"prompt\": \"the cat\", \"n_predict\": 3}", NULL, &a);
    CHECK_EQ_INT(st, 503);
    CHECK_MSG(atoi(a.retry_after) >= 1, "Retry-After '%s'", a.retry_after);
    CHECK(strstr(a.body, "queue is full"));
    tc_reply_free(&a);
    CHECK(metric("kvsieve_requests_rejected_queue_full_total") == 1);
    srv_slot_release(srv);
    pthread_join(th, NULL);
    CHECK_EQ_INT(j.status, 200);
    cJSON_Delete(j.r);
    kvs_server_stop(srv);
    g_srv.port = saved;
}

/* 1100 idle connections: the server's descriptors go past FD_SETSIZE (1024). */
static void test_many_connections(void) {
    enum { C = 1100 };
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t need = 2 * C + 256; /* both ends live in this process */
    if (rl.rlim_cur < need && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need)) {
        rl.rlim_cur = need;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < need) {
        printf("many connections: skipped, RLIMIT_NOFILE %llu < %llu\n", (unsigned long long)rl.rlim_cur,
               (unsigned long long)need);
        return;
    }
    static int fds[C];
    int open_n = 0;
    for (int i = 0; i < C; i++) {
        fds[i] = raw_connect();
        if (fds[i] >= 0) open_n++;
    }
    CHECK_EQ_INT(open_n, C);
    sleep_ms(200); /* let the daemon accept them */
    long st;
    cJSON *r = post("{\"prompt\": \"the cat\", \"n_predict\": 5}", &st);
    CHECK_MSG(st == 200, "with %d idle connections a request got %ld", open_n, st);
    cJSON_Delete(r);
    CHECK_EQ_INT(tc_status(&g_srv, "GET", "/health", NULL), 200);
    /* one of the idle connections (a high descriptor on the server) still works */
    const char get[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int last = fds[C - 1];
    char buf[256] = "";
    if (last >= 0 && write(last, get, sizeof get - 1) == (ssize_t)(sizeof get - 1)) {
        ssize_t k = read(last, buf, sizeof buf - 1);
        buf[k > 0 ? k : 0] = 0;
    }
    CHECK_MSG(strstr(buf, "200"), "idle connection %d: '%.60s'", C, buf);
    for (int i = 0; i < C; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* ---- the load test -------------------------------------------------------------------- */

enum { LOAD_CLIENTS = 64, LOAD_KINDS = 8 };
static char g_kind_req[LOAD_KINDS][2048];
static cJSON *g_serial[LOAD_KINDS];

typedef struct {
    int kind, hang_up;
    long status;
    int ok;
} load_t;

static void *load_client(void *p) {
    load_t *c = p;
    if (c->hang_up) {
        int fd = raw_post(LONG_REQ);
        sleep_ms(30 + 7 * c->kind);
        if (fd >= 0) close(fd);
        return NULL;
    }
    cJSON *r = post(g_kind_req[c->kind], &c->status);
    c->ok = c->status == 200 && r && g_serial[c->kind] && same_tokens(r, g_serial[c->kind]);
    const cJSON *va = tc_obj(r, "variants"), *vb = tc_obj(g_serial[c->kind], "variants");
    for (int v = 0; v < cJSON_GetArraySize(vb); v++)
        c->ok &= same_tokens(cJSON_GetArrayItem(va, v), cJSON_GetArrayItem(vb, v));
    cJSON_Delete(r);
    return NULL;
}

static void test_load(void) {
    for (int k = 0; k < LOAD_KINDS; k++) {
        const char *pr = PROMPTS[k % 4];
        switch (k / 4 ? k % 4 : 4) {
        case 0: snprintf(g_kind_req[k], sizeof g_kind_req[k], "{\"prompt\": \"%s\"}", pr); break; /* no n_predict */
        case 1:
            snprintf(g_kind_req[k], sizeof g_kind_req[k], "{\"prompt\": \"%s\", \"ignore_eos\": true}", pr);
            break;
        case 2:
            snprintf(g_kind_req[k], sizeof g_kind_req[k],
                     "{\"prompt\": \"%s\", \"n_predict\": 12, \"temperature\": 1.0, \"seed\": %d}", pr, k);
            break;
        case 3: variants_request(g_kind_req[k], sizeof g_kind_req[k], k % 4, 9); break;
        default:
            snprintf(g_kind_req[k], sizeof g_kind_req[k],
                     "{\"prompt\": \"%s\", \"n_predict\": %d, \"kv_compression\": {\"method\": \"snapkv\", "
                     "\"ratio\": 0.5}}",
                     pr, 5 + 3 * k);
        }
    }
    long st;
    for (int k = 0; k < LOAD_KINDS; k++) {
        g_serial[k] = post(g_kind_req[k], &st);
        CHECK_MSG(st == 200, "serial request %d: %ld", k, st);
    }
    double c0 = metric(M_CANCEL_DISC);
    static load_t cl[LOAD_CLIENTS];
    pthread_t th[LOAD_CLIENTS];
    int n_hang = 0;
    for (int i = 0; i < LOAD_CLIENTS; i++) {
        cl[i] = (load_t){i % LOAD_KINDS, i % 10 == 5, 0, 0};
        n_hang += cl[i].hang_up;
        pthread_create(&th[i], NULL, load_client, &cl[i]);
    }
    for (int i = 0; i < LOAD_CLIENTS; i++) pthread_join(th[i], NULL);
    int completed = 0, equal = 0;
    for (int i = 0; i < LOAD_CLIENTS; i++) {
        if (cl[i].hang_up) continue;
        completed += cl[i].status == 200;
        equal += cl[i].ok;
        CHECK_MSG(cl[i].status == 200 && cl[i].ok, "client %d (kind %d): status %ld, equal to serial %d", i,
                  cl[i].kind, cl[i].status, cl[i].ok);
    }
    double c1 = wait_metric(M_CANCEL_DISC, c0 + n_hang, 30000);
    CHECK_MSG(c1 - c0 == n_hang, "%d clients hung up, %g cancellations counted", n_hang, c1 - c0);
    CHECK(metric("kvsieve_batch_size") == 0);
    tc_reply h;
    CHECK_EQ_INT(tc_request(&g_srv, "GET", "/health", NULL, NULL, &h), 200);
    CHECK(strstr(h.body, "\"ok\""));
    tc_reply_free(&h);
    CHECK(metric("kvsieve_requests_waiting") == 0 && metric("kvsieve_requests_processing") == 0);
    printf("load: %d clients, %d hung up, %d completed, %d equal to their serial answer\n", LOAD_CLIENTS, n_hang,
           completed, equal);
    for (int k = 0; k < LOAD_KINDS; k++) cJSON_Delete(g_serial[k]);
}

/* ---- cache types ----------------------------------------------------------------------- */

/* bytes of the prompt cache of a plain request on a server of cache type t */
static double cache_bytes(kvs_model *m, int t, char *type_name, size_t n) {
    kvs_server_config cfg;
    kvs_server_config_defaults(&cfg);
    cfg.port = 0;
    cfg.threads = 1;
    cfg.n_ctx = N_CTX;
    cfg.cache_type = t;
    kvs_err err_ = {0}, *err = &err_;
    kvs_server *srv = NULL;
    CHECK_OK(kvs_server_start(m, &cfg, &srv, err), err);
    if (!srv) return NAN;
    int saved = g_srv.port;
    g_srv.port = kvs_server_port(srv);
    long st;
    cJSON *r = post("{\"prompt\": \"the cat is on the cat\", \"n_predict\": 3}", &st);
    CHECK_EQ_INT(st, 200);
    double b = r ? tc_num(tc_obj(r, "kv"), "bytes_before") : NAN;
    cJSON_Delete(r);
    cJSON *mj = tc_call(&g_srv, "GET", "/v1/models", NULL, NULL, &st);
    CHECK_EQ_INT(st, 200);
    snprintf(type_name, n, "%s", tc_str(tc_obj(cJSON_GetArrayItem(tc_obj(mj, "data"), 0), "meta"), "cache_type"));
    cJSON_Delete(mj);
    kvs_server_stop(srv);
    g_srv.port = saved;
    return b;
}

static void test_cache_type(kvs_model *m) {
    char n16[16], nb16[16], n32[16];
    double f16 = cache_bytes(m, KVS_CACHE_F16, n16, sizeof n16), bf16 = cache_bytes(m, KVS_CACHE_BF16, nb16, sizeof nb16),
           f32 = cache_bytes(m, KVS_CACHE_F32, n32, sizeof n32);
    CHECK(!strcmp(n16, "f16") && !strcmp(nb16, "bf16") && !strcmp(n32, "f32"));
    CHECK_MSG(f16 > 0 && bf16 == f16 && f32 == 2 * f16, "prompt cache bytes f16 %g, bf16 %g, f32 %g", f16, bf16, f32);
    kvs_server_config cfg;
    kvs_server_config_defaults(&cfg);
    cfg.port = 0;
    cfg.cache_type = 7;
    kvs_err err_ = {0}, *err = &err_;
    kvs_server *srv = NULL;
    CHECK_FAILS(kvs_server_start(m, &cfg, &srv, err), KVS_ERR_INVALID, err, "cache type");
}

/* ---- drain timeout ----------------------------------------------------------------------- */

typedef struct {
    kvs_server *s;
} stop_t;
static void *stop_run(void *p) {
    kvs_server_stop(((stop_t *)p)->s);
    return NULL;
}

/* Every slot held, two requests queued: after drain_timeout_s they are cancelled
 * with 503 and stop returns. */
static void test_drain_timeout(kvs_model *m) {
    kvs_server_config cfg;
    kvs_server_config_defaults(&cfg);
    cfg.port = 0;
    cfg.threads = 1;
    cfg.n_ctx = N_CTX;
    cfg.slots = 2;
    cfg.drain_timeout_s = 0.5;
    kvs_err err_ = {0}, *err = &err_;
    kvs_server *srv = NULL;
    CHECK_OK(kvs_server_start(m, &cfg, &srv, err), err);
    if (!srv) return;
    int saved = g_srv.port;
    g_srv.port = kvs_server_port(srv);
    srv_slot_acquire(srv);
    srv_slot_acquire(srv); /* never released: only the timeout can end these */
    job_t j[2] = {{"{\"prompt\": \"the cat\", \"n_predict\": 3}", 0, NULL},
                  {"{\"prompt\": \"a cat\", \"n_predict\": 3}", 0, NULL}};
    pthread_t th[2], stopper;
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, post_job, &j[i]);
    CHECK(wait_metric("kvsieve_requests_waiting", 2, 20000) == 2);
    stop_t sa = {srv};
    pthread_create(&stopper, NULL, stop_run, &sa);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(j[i].status == 503, "queued request %d at the drain timeout: %ld", i, j[i].status);
        CHECK(j[i].r && strstr(tc_str(tc_obj(j[i].r, "error"), "message"), "shutting down"));
        cJSON_Delete(j[i].r);
    }
    pthread_join(stopper, NULL);
    CHECK_EQ_INT(tc_status(&g_srv, "GET", "/health", NULL), 0);
    g_srv.port = saved;
}

int main(void) {
    kvs_err err_ = {0}, *err = &err_;
    tc_fixture fx;
    CHECK_OK(tc_fixture_init(&fx, "kvs-server-load", "gemma3", err), err);
    CHECK_OK(tc_fixture_load(&fx, err), err);
    kvs_model *m = fx.model;
    if (!m) goto done;
    fx.cfg.n_ctx = N_CTX;
    fx.cfg.slots = 4;
    fx.cfg.queue = 64;
    fx.cfg.n_predict_max = 220;
    fx.cfg.max_conn = 2048;
    fx.cfg.batch = 64;
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (!fx.srv) goto done;
    test_batch_equality();
    test_ignore_eos(m);
    test_spans(m);
    test_disconnect(fx.srv);
    test_queue_full(m);
    test_many_connections();
    test_load();
    tc_server_stop(&fx);
    test_drain_timeout(m);
    test_cache_type(m);
done:
    tc_fixture_free(&fx);
    return kvs_test_finish("test_server_load");
}
