/*
 * embedded.c -- the embedded backend: `kvsieve serve --port 0` as a child
 * process for the length of a task run (see kvs_client.h).
 *
 * What it is: fork/exec with the child's stdout and stderr in a log file,
 * reading the bound port from the log, waiting for /health, and stopping the
 * child with SIGTERM (SIGKILL after a grace period).
 * What it is not: no model loading here (the child does it), no signal
 * handler of the runner (cli/cmd_run.c owns Ctrl-C).
 */
#include "kvs_client.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct kvs_embedded {
    pid_t pid;
    char url[64];
    char log[512];
};

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The last n bytes of the log, one line per '|' for an error message. */
static void log_tail(const char *path, char *out, size_t n) {
    out[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    long from = sz > (long)n - 1 ? sz - (long)n + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t k = fread(out, 1, n - 1, f);
    out[k] = '\0';
    fclose(f);
    for (size_t i = 0; i < k; i++)
        if (out[i] == '\n' && i + 1 < k) out[i] = '|';
    if (k && out[k - 1] == '\n') out[k - 1] = '\0';
}

/* Port from the "listening on http://HOST:PORT" line, 0 if not yet there. */
static int read_port(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char line[1024];
    int port = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on http://");
        if (!p) continue;
        p = strrchr(p, ':');
        if (p) port = atoi(p + 1);
    }
    fclose(f);
    return port;
}

kvs_status kvs_embedded_start(const kvs_embedded_opts *o, kvs_embedded **out, kvs_err *err) {
    *out = NULL;
    if (!o->bin || !o->model)
        return kvs_errorf(err, KVS_ERR_INVALID, "embedded backend: the kvsieve binary and a model "
                                                "are required");
    kvs_embedded *b = calloc(1, sizeof *b);
    if (!b) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    kvs_status rc = KVS_OK;
    const char *tmp = getenv("TMPDIR");
    snprintf(b->log, sizeof b->log, "%s/kvsieve-serve-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    int fd = mkstemp(b->log);
    if (fd < 0) {
        rc = kvs_errorf(err, KVS_ERR_IO, "embedded backend: cannot create a log file %s: %s", b->log,
                        strerror(errno));
        free(b);
        return rc;
    }
    char threads[16], ctx[16], slots[16], batch[16];
    snprintf(threads, sizeof threads, "%d", o->threads);
    snprintf(ctx, sizeof ctx, "%d", o->ctx);
    snprintf(slots, sizeof slots, "%d", o->slots > 0 ? o->slots : 1);
    const char *argv[24];
    int a = 0;
    argv[a++] = "kvsieve";
    argv[a++] = "serve";
    argv[a++] = "--model";
    argv[a++] = o->model;
    argv[a++] = "--host";
    argv[a++] = "127.0.0.1";
    argv[a++] = "--port";
    argv[a++] = "0";
    argv[a++] = "--slots";
    argv[a++] = slots;
    if (o->threads > 0) argv[a++] = "--threads", argv[a++] = threads;
    if (o->ctx > 0) argv[a++] = "--ctx", argv[a++] = ctx;
    if (o->cache_type_k && o->cache_type_k[0]) argv[a++] = "--cache-type-k", argv[a++] = o->cache_type_k;
    if (o->cache_type_v && o->cache_type_v[0]) argv[a++] = "--cache-type-v", argv[a++] = o->cache_type_v;
    snprintf(batch, sizeof batch, "%d", o->batch);
    if (o->batch > 0) argv[a++] = "--batch", argv[a++] = batch;
    argv[a] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        rc = kvs_errorf(err, KVS_ERR_IO, "embedded backend: fork: %s", strerror(errno));
        close(fd);
        unlink(b->log);
        free(b);
        return rc;
    }
    if (pid == 0) {
        /* child: own process group, dies with the runner, output to the log */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(o->bin, (char *const *)argv);
        dprintf(2, "exec %s: %s\n", o->bin, strerror(errno));
        _exit(127);
    }
    close(fd);
    b->pid = pid;
    double timeout_ms = (o->start_timeout_s > 0 ? o->start_timeout_s : 300) * 1000.0;
    double t0 = kvs_now_ms();
    int port = 0;
    char tail[300];
    while (!port) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            b->pid = 0;
            log_tail(b->log, tail, sizeof tail);
            rc = kvs_errorf(err, KVS_ERR_IO,
                            "embedded backend: `kvsieve serve --model %s` exited (%s %d) before "
                            "listening: %s",
                            o->model, WIFEXITED(st) ? "status" : "signal",
                            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), tail);
            goto fail;
        }
        port = read_port(b->log);
        if (port) break;
        if (kvs_now_ms() - t0 > timeout_ms) {
            log_tail(b->log, tail, sizeof tail);
            rc = kvs_errorf(err, KVS_ERR_IO,
                            "embedded backend: `kvsieve serve --model %s` did not listen within %.0f "
                            "s: %s",
                            o->model, timeout_ms / 1000, tail);
            goto fail;
        }
        sleep_ms(20);
    }
    snprintf(b->url, sizeof b->url, "http://127.0.0.1:%d", port);
    for (;;) {
        long status = 0;
        kvs_err e2 = {0};
        if (kvs_http_get(b->url, "/health", 5, &status, NULL, &e2) == KVS_OK && status == 200) break;
        if (kvs_now_ms() - t0 > timeout_ms) {
            rc = kvs_errorf(err, KVS_ERR_IO, "embedded backend: %s/health did not answer 200 within "
                            "%.0f s (last: HTTP %ld %s)", b->url, timeout_ms / 1000, status, e2.msg);
            goto fail;
        }
        sleep_ms(20);
    }
    *out = b;
    return KVS_OK;
fail:;
    kvs_err ignore = {0};
    kvs_embedded_stop(b, &ignore);
    return rc;
}

const char *kvs_embedded_url(const kvs_embedded *b) { return b->url; }

kvs_status kvs_embedded_stop(kvs_embedded *b, kvs_err *err) {
    if (!b) return KVS_OK;
    kvs_status rc = KVS_OK;
    if (b->pid > 0) {
        kill(b->pid, SIGTERM);
        double t0 = kvs_now_ms();
        int st = 0, killed = 0;
        for (;;) {
            pid_t w = waitpid(b->pid, &st, WNOHANG);
            if (w == b->pid || (w < 0 && errno != EINTR)) break;
            if (!killed && kvs_now_ms() - t0 > 30000) {
                kill(b->pid, SIGKILL);
                killed = 1;
            }
            sleep_ms(10);
        }
        if (killed || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            char tail[300];
            log_tail(b->log, tail, sizeof tail);
            rc = kvs_errorf(err, KVS_ERR_IO, "embedded backend: `kvsieve serve` %s: %s",
                            killed ? "did not stop within 30 s of SIGTERM (killed)"
                                   : "did not exit cleanly", tail);
        }
    }
    if (b->log[0]) unlink(b->log);
    free(b);
    return rc;
}
