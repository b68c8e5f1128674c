/*
 * fuzz_logprobs.c -- fuzz target for the scoring path of /v1/completions
 * (backend/server/logprobs.c: echo, logprobs, several prompts, as
 * lm-evaluation-harness sends them). The input is a request body; it is
 * parsed, run on the tiny random gemma3 model of tests/backend/tiny_model.c
 * (context 64, at most 8 new tokens, so one input costs milliseconds) on
 * this thread without the scheduler, and answered. Checked: every answer is
 * JSON; a 200 has one choice per prompt with its index, and every log-prob
 * in it is a number in [-9999, 0] or the first prompt token's null.
 * What it is not: the socket and scheduler (fuzz_server and the integration
 * tests cover those). Errors are expected; a crash or a sanitizer report is
 * a bug.
 */
#include "fuzz_server_util.h"

static kvs_server *server(void) {
    kvs_server *s = fuzz_tiny_server(64, 8, "fuzz_logprobs");
    s->cfg.threads = 1;
    return s;
}

/* A log-prob field: a number in [-9999, 0], or null where allowed. */
static void check_lp(const cJSON *v, int null_ok) {
    if (cJSON_IsNull(v) && null_ok) return;
    if (!cJSON_IsNumber(v) || !(v->valuedouble <= 0.0 && v->valuedouble >= -9999.0)) abort();
}

static void check_choice(const cJSON *c, int index) {
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(c, "index");
    if (!cJSON_IsNumber(i) || i->valueint != index) abort();
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "text"))) abort();
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
    if (!lp || cJSON_IsNull(lp)) return;
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs");
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(lp, "tokens");
    if (!cJSON_IsArray(tl) || !cJSON_IsArray(toks) || cJSON_GetArraySize(tl) != cJSON_GetArraySize(toks)) abort();
    const cJSON *v;
    int k = 0;
    cJSON_ArrayForEach(v, tl) check_lp(v, k++ == 0);
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    if (top && cJSON_IsArray(top)) {
        const cJSON *o;
        cJSON_ArrayForEach(o, top) {
            if (cJSON_IsNull(o)) continue;
            if (!cJSON_IsObject(o)) abort();
            cJSON_ArrayForEach(v, o) check_lp(v, 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvs_server *s = server();
    char *body = fuzz_cstr(data, size);
    kvs_http_request rq = {.method = "POST", .path = "/v1/completions", .body = body, .body_len = size, .fd = -1};
    srv_error e = {0};
    cJSON *root = srv_parse_body(&rq, &e);
    if (root) {
        kvs_http_response rs;
        memset(&rs, 0, sizeof rs);
        srv_handle_scoring_inline(s, root, &rs);
        if (rs.status < 200 || rs.status > 599 || !rs.body) abort();
        cJSON *j = cJSON_ParseWithLength(rs.body, rs.len);
        if (!j) abort(); /* every answer is JSON */
        if (rs.status == 200) {
            const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
            if (!cJSON_IsArray(ch) || cJSON_GetArraySize(ch) < 1) abort();
            int i = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, ch) check_choice(c, i++);
        }
        cJSON_Delete(j);
        free(rs.body);
        cJSON_Delete(root);
    }
    free(body);
    return 0;
}
