/*
 * fuzz_server.c -- fuzz target for the HTTP server's request bodies
 * (backend/server): the first byte picks the endpoint (/tokenize,
 * /detokenize, /completion, /v1/completions, /v1/chat/completions), the
 * rest is the body. The token endpoints run their handler; the generation
 * endpoints run the parser that turns a body into a request (prompt or
 * messages, sampling, stop, kv_compression with its variants and suffixes,
 * kv_spans), then the error response when it refuses. No socket, no
 * scheduler, no generation: the server struct is filled by hand around the
 * tiny random gemma3 model of tests/backend/tiny_model.c (context 256).
 * Errors are expected; a crash or a sanitizer report is a bug.
 */
#include "fuzz_server_util.h"

static kvs_server *server(void) {
    kvs_server *s = fuzz_tiny_server(256, 64, "fuzz_server");
    return s;
}

static void check_response(const kvs_http_response *rs) {
    if (rs->status < 200 || rs->status > 599 || !rs->body) abort();
    cJSON *j = cJSON_ParseWithLength(rs->body, rs->len);
    if (!j) abort(); /* every response is JSON */
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int eps[5] = {EP_TOKENIZE, EP_DETOKENIZE, EP_COMPLETION, EP_V1_COMPLETIONS, EP_V1_CHAT};
    if (size < 1) return 0;
    kvs_server *s = server();
    int ep = eps[data[0] % 5];
    char *body = fuzz_cstr(data + 1, size - 1);
    kvs_http_request rq = {.method = "POST", .path = "/", .body = body, .body_len = size - 1, .fd = -1};
    kvs_http_response rs;
    memset(&rs, 0, sizeof rs);
    if (ep == EP_TOKENIZE || ep == EP_DETOKENIZE) {
        if (ep == EP_TOKENIZE) srv_handle_tokenize(s, &rq, &rs);
        else srv_handle_detokenize(s, &rq, &rs);
        check_response(&rs);
    } else {
        srv_error e = {0};
        gen_req g;
        memset(&g, 0, sizeof g);
        kvs_stop_init(&g.stop, -1);
        cJSON *root = srv_parse_body(&rq, &e);
        if (root && srv_parse_gen_request(s, ep, root, &g, &e) == 0) {
            if (g.n_prompt < 1 || g.n_prompt > s->cfg.n_ctx) abort();
            for (int i = 0; i < g.n_prompt; i++)
                if (g.prompt[i] < 0 || g.prompt[i] >= s->info->n_vocab) abort();
        } else {
            if (e.status < 400) abort(); /* a refusal always says why */
            srv_error_response(&rs, &e);
            check_response(&rs);
        }
        srv_gen_req_free(&g);
        cJSON_Delete(root);
    }
    free(rs.body);
    free(body);
    return 0;
}
