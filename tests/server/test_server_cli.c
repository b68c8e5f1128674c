/*
 * test_server_cli.c -- `kvsieve serve` as a process: start, answer, SIGTERM.
 *
 * Covers: the command line (--model, --port 0 prints the bound port, --ctx,
 * --slots), usage errors (exit 2), a missing model file (exit 1, message
 * names the file), /health over HTTP, and SIGTERM while a request is in
 * flight: the request completes with 200 and the process exits 0 after
 * printing that it drained; SIGTERM under load (more work than
 * --drain-timeout 1 allows): exit 0 within 1 + 30 s, every client answered
 * 200 or 503. argv[1] is the kvsieve binary.
 * --api-key "" (exit 2) and the KVSIEVE_API_KEY environment variable (the
 * banner says a key is required; /health 200, other endpoints 401).
 * Not covered: the HTTP API in depth (test_server_http.c).
 */
#include "kvs_backend.h"
#include "test_util.h"
#include "backend/tiny_model.h"

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_port;

typedef struct {
    char data[16384];
    size_t len;
} body_t;

static size_t sink(char *p, size_t sz, size_t n, void *ud) {
    body_t *b = ud;
    size_t k = sz * n;
    if (b && b->len + k < sizeof b->data) {
        memcpy(b->data + b->len, p, k);
        b->len += k;
        b->data[b->len] = 0;
    }
    return k;
}

static long http_body(const char *path, const char *json, body_t *b) {
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", g_port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (json) curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_cleanup(c);
    return st;
}

static long http(const char *path, const char *json) { return http_body(path, json, NULL); }

/* Completion requests the server has received (from /metrics). */
static int completions_seen(void) {
    static body_t b;
    b.len = 0;
    b.data[0] = 0;
    if (http_body("/metrics", NULL, &b) != 200) return -1;
    const char *key = "kvsieve_requests_total{endpoint=\"/completion\"} ";
    const char *at = strstr(b.data, key);
    return at ? atoi(at + strlen(key)) : -1;
}

/* Run kvsieve with args; stderr goes to a pipe (*err_fd); returns the pid. */
static pid_t spawn(char *const argv[], int *err_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    *err_fd = p[0];
    return pid;
}

/* Read the child's stderr until `needle` appears or EOF; returns the text. */
static char *read_until(int fd, const char *needle, char *buf, size_t cap, size_t *len) {
    while (*len + 1 < cap) {
        buf[*len] = 0;
        char *hit = needle ? strstr(buf, needle) : NULL;
        if (hit) return hit;
        ssize_t k = read(fd, buf + *len, cap - 1 - *len);
        if (k <= 0) break;
        *len += (size_t)k;
    }
    buf[*len] = 0;
    return needle ? strstr(buf, needle) : NULL;
}

static int wait_exit(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

typedef struct {
    long status;
} job_t;

static void *job_run(void *p) {
    job_t *j = p;
    j->status = http("/completion", "{\"prompt\": \"the cat\", \"n_predict\": 60}");
    return NULL;
}

/* A long request: 32 variants x 240 tokens that EOS cannot end. */
static const char LOAD_REQ[] = "{\"prompt\": \"the cat is\", \"n_predict\": 240, \"ignore_eos\": true, "
                               "\"kv_compression\": ["
#define F4 "{\"method\": \"full\"}, {\"method\": \"full\"}, {\"method\": \"full\"}, {\"method\": \"full\"}, "
                               F4 F4 F4 F4 F4 F4 F4
                               "{\"method\": \"full\"}, {\"method\": \"full\"}, {\"method\": \"full\"}, {\"method\": \"full\"}]}";

typedef struct {
    long status;
} load_t;

static void *load_run(void *p) {
    load_t *j = p;
    j->status = http("/completion", LOAD_REQ);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/kvsieve\n", argv[0]);
        return 2;
    }
    char *bin = argv[1];
    kvs_err err_ = {0}, *err = &err_;
    char dir[] = "/tmp/kvs-cli-test-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char model[128];
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    tiny_spec spec = tiny_default("gemma3");
    CHECK_OK(tiny_write(&spec, model, err), err);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char buf[8192];
    size_t len = 0;
    int fd;

    /* usage error: exit 2 */
    char *a1[] = {bin, "serve", "--port", "99999", "--model", model, NULL};
    pid_t pid = spawn(a1, &fd);
    read_until(fd, NULL, buf, sizeof buf, &len);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 2);
    CHECK_MSG(strstr(buf, "--port"), "stderr: %s", buf);

    /* an unknown cache type: exit 2 naming the flag */
    len = 0;
    char *a0[] = {bin, "serve", "--cache-type", "f8", "--model", model, NULL};
    pid = spawn(a0, &fd);
    read_until(fd, NULL, buf, sizeof buf, &len);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 2);
    CHECK_MSG(strstr(buf, "--cache-type") && strstr(buf, "f8"), "stderr: %s", buf);

    /* missing model: exit 1 naming it */
    len = 0;
    char *a2[] = {bin, "serve", "--model", "/nonexistent/m.gguf", NULL};
    pid = spawn(a2, &fd);
    read_until(fd, NULL, buf, sizeof buf, &len);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 1);
    CHECK_MSG(strstr(buf, "/nonexistent/m.gguf"), "stderr: %s", buf);

    /* --api-key "": exit 2; KVSIEVE_API_KEY: the key without the flag (/health open, the rest 401) */
    len = 0;
    char *ak[] = {bin, "serve", "--api-key", "", "--model", model, NULL};
    pid = spawn(ak, &fd);
    read_until(fd, NULL, buf, sizeof buf, &len);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 2);
    CHECK_MSG(strstr(buf, "--api-key"), "stderr: %s", buf);
    len = 0;
    setenv("KVSIEVE_API_KEY", "env-key", 1);
    char *ae[] = {bin, "serve", "--model", model, "--port", "0", "--ctx", "64", "--slots", "1", "--threads", "1", NULL};
    pid = spawn(ae, &fd);
    unsetenv("KVSIEVE_API_KEY");
    char *ate = read_until(fd, "listening on http://127.0.0.1:", buf, sizeof buf, &len);
    CHECK_MSG(ate, "no 'listening' line; stderr: %s", buf);
    if (ate) {
        g_port = atoi(ate + strlen("listening on http://127.0.0.1:"));
        const size_t off = (size_t)(ate - buf);
        while (!strchr(buf + off, '\n') && len + 1 < sizeof buf) { /* the rest of the banner line */
            ssize_t k = read(fd, buf + len, sizeof buf - 1 - len);
            if (k <= 0) break;
            len += (size_t)k;
            buf[len] = 0;
        }
        CHECK_MSG(strstr(buf, "API key required"), "stderr: %s", buf);
        CHECK_EQ_INT(http("/health", NULL), 200);
        CHECK_EQ_INT(http("/v1/models", NULL), 401);
        CHECK_EQ_INT(http("/completion", "{\"prompt\": \"a\", \"n_predict\": 1}"), 401);
    }
    kill(pid, SIGTERM);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 0);

    /* serve, answer, SIGTERM during a request */
    len = 0;
    char *a3[] = {bin, "serve", "--model", model, "--port", "0", "--ctx", "128", "--slots", "1", "--threads", "1", NULL};
    pid = spawn(a3, &fd);
    char *at = read_until(fd, "listening on http://127.0.0.1:", buf, sizeof buf, &len);
    CHECK_MSG(at, "no 'listening' line; stderr: %s", buf);
    if (at) {
        g_port = atoi(at + strlen("listening on http://127.0.0.1:"));
        CHECK(g_port > 0);
        CHECK_EQ_INT(http("/health", NULL), 200);
        job_t j = {0};
        pthread_t th;
        pthread_create(&th, NULL, job_run, &j);
        /* once the server has the request, stop it (the tiny model may
         * finish first; test_server_http holds a slot to test the drain
         * deterministically) */
        for (int i = 0; i < 5000 && completions_seen() < 1; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
        kill(pid, SIGTERM);
        pthread_join(th, NULL);
        CHECK_MSG(j.status == 200, "request during SIGTERM got %ld", j.status);
    } else {
        kill(pid, SIGKILL);
    }
    read_until(fd, "stopped", buf, sizeof buf, &len);
    read_until(fd, NULL, buf, sizeof buf, &len);
    close(fd);
    CHECK_EQ_INT(wait_exit(pid), 0);
    CHECK_MSG(strstr(buf, "SIGTERM received, draining") && strstr(buf, "stopped"), "stderr: %s", buf);

    /* SIGTERM under load: more work than the drain timeout allows; the
     * process exits 0 within the timeout plus a generous margin, and every
     * client gets an answer (200 if it finished, 503 if it was cancelled) */
    len = 0;
    char *a4[] = {bin, "serve", "--model", model, "--port", "0", "--ctx", "256", "--slots", "2", "--threads", "1",
                  "--drain-timeout", "1", "--n-predict-max", "250", NULL};
    pid = spawn(a4, &fd);
    at = read_until(fd, "listening on http://127.0.0.1:", buf, sizeof buf, &len);
    CHECK_MSG(at, "no 'listening' line; stderr: %s", buf);
    if (at) {
        g_port = atoi(at + strlen("listening on http://127.0.0.1:"));
        enum { LJ = 12 };
        load_t lj[LJ];
        pthread_t lth[LJ];
        for (int i = 0; i < LJ; i++) {
            lj[i].status = -1;
            pthread_create(&lth[i], NULL, load_run, &lj[i]);
        }
        for (int i = 0; i < 5000 && completions_seen() < LJ; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kill(pid, SIGTERM);
        int n200 = 0, n503 = 0;
        for (int i = 0; i < LJ; i++) {
            pthread_join(lth[i], NULL);
            n200 += lj[i].status == 200;
            n503 += lj[i].status == 503;
            CHECK_MSG(lj[i].status == 200 || lj[i].status == 503, "client %d under SIGTERM got %ld", i, lj[i].status);
        }
        read_until(fd, "stopped", buf, sizeof buf, &len);
        read_until(fd, NULL, buf, sizeof buf, &len);
        int rc = wait_exit(pid);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK_EQ_INT(rc, 0);
        /* a shutdown deadline is a functional bound, not a speed test: 1 s + 30 s */
        CHECK_MSG(secs < 31.0, "SIGTERM under load: exit after %.1f s (drain timeout 1 s)", secs);
        printf("SIGTERM under load: exit 0 after %.2f s; %d answers 200, %d cancelled (503)\n", secs, n200, n503);
    } else {
        kill(pid, SIGKILL);
        wait_exit(pid);
    }
    close(fd);

    unlink(model);
    rmdir(dir);
    curl_global_cleanup();
    return kvs_test_finish("test_server_cli");
}
