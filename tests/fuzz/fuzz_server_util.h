/*
 * fuzz_server_util.h -- the server struct the server-side harnesses share:
 * filled by hand (no socket, no scheduler) around the tiny random gemma3
 * model of tests/backend/tiny_model.c, with the context and the largest
 * max_tokens each harness wants. Header-only, like fuzz_util.h.
 */
#ifndef KVS_FUZZ_SERVER_UTIL_H
#define KVS_FUZZ_SERVER_UTIL_H

#include "fuzz_util.h"
#include "server_internal.h"
#include "tiny_model.h"

static inline kvs_server *fuzz_tiny_server(int n_ctx, int n_predict_max, const char *who) {
    static kvs_server s;
    if (s.model) return &s;
    char path[128];
    snprintf(path, sizeof path, "%s/tiny.gguf", fuzz_tmpdir());
    tiny_spec sp = tiny_default("gemma3");
    kvs_err err = {0};
    if (tiny_write(&sp, path, &err) || kvs_model_load(path, NULL, &s.model, &err)) {
        fprintf(stderr, "%s: %s\n", who, err.msg);
        abort();
    }
    remove(path);
    s.info = kvs_model_get_info(s.model);
    kvs_server_config_defaults(&s.cfg);
    s.cfg.n_ctx = n_ctx;
    s.cfg.n_predict_max = n_predict_max;
    snprintf(s.alias, sizeof s.alias, "tiny");
    s.cfg.alias = s.alias;
    s.slots_free = s.cfg.slots;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    return &s;
}

#endif
