/*
 * cmd_serve.c -- `kvsieve serve`: load a GGUF model and serve it over HTTP.
 *
 * What it is: argument parsing, model loading, signal handling (SIGTERM and
 * SIGINT are blocked in every thread and awaited with sigwait; then the
 * server drains: requests in flight finish for at most --drain-timeout
 * seconds, new ones get 503, what is left is cancelled) and the exit code. What it is not: the server itself (backend/server/). Built only
 * when the kvsieve_server target exists (cli/CMakeLists.txt).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvs_backend.h"
#include "kvs_server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve serve --model PATH|default [--host 127.0.0.1] [--port 8080]\n"
            "                     [--threads N] [--ctx N] [--slots N] [--alias NAME] [--queue N]\n"
            "                     [--batch N] [--n-predict-max N] [--drain-timeout S] [--max-conn N]\n"
            "                     [--cache-type f16|bf16|f32|q8_0|q4_0|kivi2|kivi4] [-ctk T] [-ctv T] [--api-key KEY]\n"
            "                     [--prepend-bos] [--kv-compression JSON]\n"
            "  --model    a GGUF file, or `default` (Gemma 3 270M Q4_K_M, see the README)\n"
            "  --host     address to bind (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port     TCP port (default 8080; 0 picks a free one and prints it)\n"
            "  --threads  forward-pass threads per request (default: online CPUs)\n"
            "  --ctx      context per request, prompt + generated (default min(trained, 8192));\n"
            "             longer prompts are refused with 400, never truncated\n"
            "  --slots    requests decoded together (continuous batching, default 4); others queue\n"
            "  --alias    model id reported by /v1/models (default: the model's name)\n"
            "  --queue    requests that may wait beyond the free slots (default 64); one more\n"
            "             is answered 503 with Retry-After: 1\n"
            "  --batch    sequences (variants of all running requests) per decode step (default 64)\n"
            "  --n-predict-max  tokens a variant generates at most (default 4096): requests\n"
            "             without n_predict stop there; a larger n_predict is refused (400)\n"
            "  --drain-timeout  seconds SIGTERM waits for requests in flight (default 10);\n"
            "             then the rest is cancelled (503) and the server exits 0\n"
            "  --max-conn simultaneous connections (default 512; polled, so > 1024 works)\n"
            "  --cache-type  KV cache element type: f16 (default), bf16, f32, q8_0, q4_0 (GGUF blocks),\n"
            "                kivi2, kivi4 (KIVI: G 32, R 128; K and V both kivi)\n"
            "  -ctk, -ctv    the K / V cache type alone (--cache-type-k, --cache-type-v)\n"
            "  --api-key  require `Authorization: Bearer KEY` on every endpoint but /health\n"
            "             (401 otherwise); default: the KVSIEVE_API_KEY environment variable\n"
            "  --prepend-bos  token-id prompts without BOS get it (models whose tokenizer adds\n"
            "             BOS; lm-eval's remote tokenizer sends ids without it); not echoed\n"
            "  --kv-compression  the kv_compression requests without one get, as the request\n"
            "             field takes it: '{\"method\":\"snapkv\",\"ratio\":0.25}', with \"chunk\": C for\n"
            "             chunked prefill compression; a request's own overrides it\n"
            "SIGTERM or SIGINT drains (for at most --drain-timeout) and exits.\n");
}

int kvs_cmd_serve(int argc, char **argv) {
    kvs_server_config cfg;
    kvs_server_config_defaults(&cfg);
    int ctr;
    char ctname[32];
    const char *model_spec = NULL;
    long port = cfg.port, threads = sysconf(_SC_NPROCESSORS_ONLN), ctx = 0, slots = cfg.slots, queue = cfg.queue,
         batch = cfg.batch, npmax = cfg.n_predict_max, drain = (long)cfg.drain_timeout_s, max_conn = cfg.max_conn;
    if (threads < 1) threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            if (!(model_spec = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--host")) {
            if (!(cfg.host = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--alias")) {
            if (!(cfg.alias = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 0, 65535, &port)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1L << 24, &ctx)) return 2;
        } else if (!strcmp(a, "--slots")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 256, &slots)) return 2;
        } else if (!strcmp(a, "--queue")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 0, 1L << 20, &queue)) return 2;
        } else if (!strcmp(a, "--batch")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 4096, &batch)) return 2;
        } else if (!strcmp(a, "--n-predict-max")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1L << 24, &npmax)) return 2;
        } else if (!strcmp(a, "--drain-timeout")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 0, 86400, &drain)) return 2;
        } else if ((ctr = kvs_arg_cache_type("serve", argc, argv, &i, &cfg.cache_type, &cfg.cache_type_v)) >= 0) {
            if (ctr) return 2;
        } else if (!strcmp(a, "--prepend-bos")) {
            cfg.prepend_bos = 1;
        } else if (!strcmp(a, "--api-key")) {
            if (!(cfg.api_key = kvs_arg_value(argc, argv, &i))) return 2;
            if (!cfg.api_key[0]) {
                fprintf(stderr, "kvsieve serve: --api-key must not be empty\n");
                return 2;
            }
        } else if (!strcmp(a, "--kv-compression")) {
            if (!(cfg.kv_compression = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-conn")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1L << 20, &max_conn)) return 2;
        } else {
            fprintf(stderr, "kvsieve serve: unknown option '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
    }
    if (!model_spec) {
        fprintf(stderr, "kvsieve serve: --model is required (a GGUF path or `default`)\n");
        serve_usage(stderr);
        return 2;
    }
    if (!cfg.api_key) { /* as llama-server reads LLAMA_API_KEY */
        const char *k = getenv("KVSIEVE_API_KEY");
        if (k && k[0]) cfg.api_key = k;
    }
    cfg.port = (int)port;
    cfg.threads = (int)threads;
    cfg.n_ctx = (int)ctx;
    cfg.slots = (int)slots;
    cfg.queue = (int)queue;
    cfg.batch = (int)batch;
    cfg.n_predict_max = (int)npmax;
    cfg.drain_timeout_s = (double)drain;
    cfg.max_conn = (int)max_conn;

    /* Block the stop signals before any thread starts, so every thread
     * inherits the mask and only sigwait below receives them. */
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGINT);
    if (pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0) {
        fprintf(stderr, "kvsieve serve: cannot block SIGTERM/SIGINT\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up must not kill the server */

    kvs_err err = {0};
    char path[1024];
    kvs_model *model = NULL;
    kvs_server *srv = NULL;
    int rc = 1;
    if (kvs_model_resolve(model_spec, path, sizeof path, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve serve: %s\n", err.msg);
        return 1;
    }
    kvs_model_opts mo = {(int)threads};
    double t0 = kvs_now_ms();
    if (kvs_model_load(path, &mo, &model, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve serve: %s\n", err.msg);
        goto cleanup;
    }
    const kvs_model_info *info = kvs_model_get_info(model);
    fprintf(stderr, "kvsieve serve: loaded %s (%s, %d layers, vocab %d) in %.0f ms\n", info->name, info->arch,
            info->n_layers, info->n_vocab, kvs_now_ms() - t0);
    if (kvs_server_start(model, &cfg, &srv, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve serve: %s\n", err.msg);
        goto cleanup;
    }
    int v6 = strchr(cfg.host, ':') != NULL; /* an IPv6 literal goes in brackets in a URL */
    fprintf(stderr, "kvsieve serve: listening on http://%s%s%s:%d (slots %d, threads %ld, %s KV cache%s)\n",
            v6 ? "[" : "", cfg.host, v6 ? "]" : "", kvs_server_port(srv), cfg.slots, threads,
            kvs_cache_types_str(cfg.cache_type, cfg.cache_type_v, ctname), cfg.api_key ? ", API key required" : "");
    if (cfg.kv_compression) fprintf(stderr, "kvsieve serve: default kv_compression %s\n", cfg.kv_compression);
    fflush(stderr);
    int sig = 0;
    if (sigwait(&stop_set, &sig) != 0) {
        fprintf(stderr, "kvsieve serve: sigwait failed\n");
        goto cleanup;
    }
    fprintf(stderr, "kvsieve serve: %s received, draining (at most %ld s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            drain);
    fflush(stderr);
    kvs_server_stop(srv);
    srv = NULL;
    fprintf(stderr, "kvsieve serve: stopped\n");
    rc = 0;
cleanup:
    kvs_server_stop(srv);
    kvs_model_free(model);
    return rc;
}
