/*
 * test_server_auth.c -- the server's OpenAI/vLLM client conventions, on a tiny
 * random-weight model (tests/backend/tiny_model.c), the server started
 * in-process on a free loopback port and driven with libcurl.
 *
 * Covers: the API key (cfg.api_key): 401 with an authentication_error and no
 * work done (no prefill counted) without a key, with a wrong key and with a
 * non-Bearer scheme; 200 with `Authorization: Bearer KEY` and with
 * `X-Api-Key: KEY`; GET /health open. vLLM's tokenizer endpoints as
 * lm-evaluation-harness's remote tokenizer reads them: GET /tokenizer_info
 * (eos/bos/pad tokens and ids, max_model_len), POST /tokenize with
 * {prompt, add_special_tokens} (the eos text encodes to the eos id, as
 * lm-eval derives eos_token_id), POST /detokenize answering both prompt and
 * content, llama-server's shapes unchanged. /v1/completions with echo and
 * logprobs (lm-eval's loglikelihood request: [[ids]], echo, logprobs 1,
 * max_tokens 1): every prompt position's log-prob equals log-softmax (double)
 * of the logits an in-process session of the engine gives on the same path
 * (prefill the first token, decode the rest), bit for bit, and is within 2e-3
 * of the prefill of each prefix; the first token's is null; the chosen token's
 * top_logprobs value is bit-identical to its token_logprobs value; greedy
 * tokens are the argmax; several prompts give one choice per prompt equal to
 * asking for each alone; max_tokens 0 with echo; prepend_bos (ids without
 * BOS scored after it, not echoed); refusals naming the field.
 * Not covered: the generation endpoints in depth (test_server_http.c); the
 * -inf clamp (no finite model gives -inf logits).
 */
#include "kvs_backend.h"
#include "kvs_cpu.h"
#include "kvs_server.h"
#include "test_util.h"
#include "backend/tiny_model.h"
#include "server/http_client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <unistd.h>

static tc_server g_srv = {.timeout_s = 60}; /* the port set once started */

/* kvsieve_prefills_total from /metrics (the key in header). */
static double prefills(const char *header) {
    tc_reply r;
    tc_request(&g_srv, "GET", "/metrics", NULL, header, &r);
    const char *p = strstr(r.body, "\nkvsieve_prefills_total ");
    double v = p ? strtod(p + strlen("\nkvsieve_prefills_total "), NULL) : NAN;
    tc_reply_free(&r);
    return v;
}

static void expect_401(const char *method, const char *path, const char *json, const char *header) {
    long st;
    cJSON *r = tc_call(&g_srv, method, path, json, header, &st);
    const cJSON *e = r ? tc_obj(r, "error") : NULL;
    CHECK_MSG(st == 401, "%s %s with '%s': status %ld, want 401", method, path, header ? header : "(no key)", st);
    CHECK_MSG(e && !strcmp(tc_str(e, "type"), "authentication_error"), "%s %s: error type %s", method, path,
              e && tc_str_or_null(e, "type") ? tc_str_or_null(e, "type") : "(none)");
    CHECK(e && !strcmp(tc_str(e, "field"), "authorization"));
    cJSON_Delete(r);
}

static void test_api_key(void) {
    const char *good = "Authorization: Bearer s3cret-key";
    const char *body = "{\"prompt\": \"hello\", \"n_predict\": 2}";
    double p0 = prefills(good);
    CHECK(p0 == p0);
    expect_401("POST", "/completion", body, NULL);
    expect_401("POST", "/completion", body, "Authorization: Bearer s3cret-kez");
    expect_401("POST", "/completion", body, "Authorization: Bearer s3cret-key2");
    expect_401("POST", "/completion", body, "Authorization: Basic s3cret-key");
    expect_401("POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1}", NULL);
    expect_401("POST", "/tokenize", "{\"content\": \"hi\"}", "X-Api-Key: nope");
    expect_401("GET", "/v1/models", NULL, NULL);
    expect_401("GET", "/metrics", NULL, NULL);
    expect_401("GET", "/tokenizer_info", NULL, NULL);
    /* refused before any work: a body that is not even JSON still gets 401, and nothing was prefilled */
    expect_401("POST", "/completion", "{not json", NULL);
    CHECK_MSG(prefills(good) == p0, "the refused requests prefilled (%g -> %g)", p0, prefills(good));

    long st;
    cJSON *r = tc_call(&g_srv, "GET", "/health", NULL, NULL, &st);
    CHECK_MSG(st == 200 && r && !strcmp(tc_str(r, "status"), "ok"), "/health without key: %ld", st);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/completion", body, good, &st);
    CHECK_MSG(st == 200 && r && tc_str_or_null(r, "content"), "/completion with the key: %ld", st);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/completion", body, "authorization: bearer s3cret-key", &st);
    CHECK_MSG(st == 200, "header and scheme in lower case: %ld", st);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/tokenize", "{\"content\": \"hi\"}", "X-Api-Key: s3cret-key", &st);
    CHECK_MSG(st == 200 && r && tc_obj(r, "tokens"), "X-Api-Key: %ld", st);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "GET", "/v1/models", NULL, good, &st);
    CHECK(st == 200);
    cJSON_Delete(r);
    CHECK_MSG(prefills(good) == p0 + 2, "prefills %g, want %g", prefills(good), p0 + 2);
}

#define KEY "Authorization: Bearer s3cret-key"

/* tokens of a JSON array into out[cap]; returns the count (-1: not ids) */
static int ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *it;
    if (!cJSON_IsArray(arr)) return -1;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || n >= cap) return -1;
        out[n++] = (int32_t)it->valuedouble;
    }
    return n;
}

static void test_tokenizer(const kvs_model *m) {
    kvs_err err = {0};
    const kvs_special_tokens *sp = kvs_model_special(m);
    long st;
    cJSON *info = tc_call(&g_srv, "GET", "/tokenizer_info", NULL, KEY, &st);
    CHECK_MSG(st == 200 && info, "/tokenizer_info: %ld", st);
    if (!info) return;
    CHECK(sp->eos >= 0 && sp->bos >= 0);
    CHECK(tc_num(info, "eos_token_id") == sp->eos && tc_num(info, "bos_token_id") == sp->bos);
    CHECK(tc_str_or_null(info, "eos_token") && !strcmp(tc_str_or_null(info, "eos_token"), kvs_token_text(m, sp->eos)));
    CHECK(tc_str_or_null(info, "bos_token") && !strcmp(tc_str_or_null(info, "bos_token"), kvs_token_text(m, sp->bos)));
    CHECK(sp->pad < 0 ? cJSON_IsNull(tc_obj(info, "pad_token")) : tc_num(info, "pad_token_id") == sp->pad);
    CHECK(tc_num(info, "max_model_len") == 96 && tc_num(info, "model_max_length") == 96);
    CHECK(tc_num(info, "vocab_size") == kvs_model_get_info(m)->n_vocab);

    /* lm-eval's remote tokenizer: eos_token_id = encode(eos_token)[0] */
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"add_special_tokens\": false}",
             tc_str_or_null(info, "eos_token"));
    cJSON *r = tc_call(&g_srv, "POST", "/tokenize", body, KEY, &st);
    int32_t got[128];
    int n = r ? ids(tc_obj(r, "tokens"), got, 128) : -1;
    CHECK_MSG(st == 200 && n == 1 && got[0] == sp->eos, "encode(eos_token): status %ld, %d tokens, first %d", st,
              n, n > 0 ? got[0] : -1);
    CHECK(r && tc_num(r, "count") == n && tc_num(r, "max_model_len") == 96);
    cJSON_Delete(r);

    /* vLLM's shape equals the engine's tokenizer, with and without special tokens */
    const char *text = "Hello world, the quick brown fox.";
    for (int special = 0; special < 2; special++) {
        int32_t *want = NULL;
        int nw = 0;
        CHECK_OK(kvs_tokenize(m, text, strlen(text), special && sp->add_bos, 1, &want, &nw, &err), &err);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\"%s}", text,
                 special ? "" : ", \"add_special_tokens\": false"); /* vLLM's default is true */
        r = tc_call(&g_srv, "POST", "/tokenize", body, KEY, &st);
        n = r ? ids(tc_obj(r, "tokens"), got, 128) : -1;
        CHECK_MSG(st == 200 && n == nw && nw > 0 && !memcmp(got, want, (size_t)nw * sizeof *want),
                  "/tokenize prompt (special %d): %d tokens, want %d", special, n, nw);
        CHECK(r && tc_num(r, "count") == nw);
        cJSON_Delete(r);
        /* llama-server's shape is unchanged: no count, add_special defaults to false */
        snprintf(body, sizeof body, "{\"content\": \"%s\"%s}", text, special ? ", \"add_special\": true" : "");
        r = tc_call(&g_srv, "POST", "/tokenize", body, KEY, &st);
        n = r ? ids(tc_obj(r, "tokens"), got, 128) : -1;
        CHECK(st == 200 && n == nw && !memcmp(got, want, (size_t)nw * sizeof *want));
        CHECK(r && !tc_obj(r, "count"));
        cJSON_Delete(r);
        if (!special) { /* the round trip through /detokenize, both names */
            cJSON *d = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(d, "tokens");
            for (int i = 0; i < nw; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(want[i]));
            char *js = cJSON_PrintUnformatted(d);
            r = tc_call(&g_srv, "POST", "/detokenize", js, KEY, &st);
            CHECK(st == 200 && r && tc_str_or_null(r, "prompt") && !strcmp(tc_str_or_null(r, "prompt"), text));
            CHECK(r && tc_str_or_null(r, "content") && !strcmp(tc_str_or_null(r, "content"), text));
            cJSON_Delete(r);
            free(js);
            cJSON_Delete(d);
        }
        free(want);
    }
    r = tc_call(&g_srv, "POST", "/tokenize", "{\"prompt\": 5}", KEY, &st);
    CHECK(st == 400 && r && !strcmp(tc_str(tc_obj(r, "error"), "field"), "prompt"));
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/tokenize", "{\"prompt\": \"x\", \"add_special_tokens\": 3}", KEY, &st);
    CHECK(st == 400);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/tokenizer_info", "{}", KEY, &st);
    CHECK(st == 405);
    cJSON_Delete(r);
    cJSON_Delete(info);
}

/* log-softmax in double of logits[V] at token t */
static double ref_lp(const float *x, int V, int t) {
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (x[i] > m) m = x[i];
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - m);
    return (double)x[t] - (m + log(sum));
}

static cJSON *complete(const char *json, long *st) { return tc_call(&g_srv, "POST", "/v1/completions", json, KEY, st); }

static void test_logprobs(kvs_model *m) {
    kvs_err err = {0};
    const int V = kvs_model_get_info(m)->n_vocab;
    const char *text = "The quick brown fox jumps over the lazy dog";
    int32_t *P = NULL;
    int n = 0;
    CHECK_OK(kvs_tokenize(m, text, strlen(text), 1, 1, &P, &n, &err), &err);
    if (!P) return;
    CHECK(n > 4 && n < 60);
    /* the reference on the server's path: prefill P[0], then decode one by one */
    float *L = malloc((size_t)(n + 1) * V * sizeof *L); /* row i: logits after P[0..i] */
    kvs_session_opts so = {0};
    so.n_ctx = 96;
    so.n_threads = 1;
    kvs_session *ses = NULL;
    CHECK_OK(kvs_session_new(m, &so, &ses, &err), &err);
    if (!ses || !L) return;
    CHECK_OK(kvs_session_prefill(ses, P, 1, NULL, L, &err), &err);
    for (int i = 1; i < n; i++) CHECK_OK(kvs_session_decode(ses, P[i], L + (size_t)i * V, &err), &err);
    const int32_t gen = kvs_argmax(L + (size_t)(n - 1) * V, V);

    /* lm-eval's loglikelihood request */
    cJSON *req = cJSON_CreateObject();
    cJSON *outer = cJSON_AddArrayToObject(req, "prompt"), *inner = cJSON_CreateArray();
    cJSON_AddItemToArray(outer, inner);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(inner, cJSON_CreateNumber(P[i]));
    cJSON_AddNumberToObject(req, "temperature", 0);
    cJSON_AddNumberToObject(req, "max_tokens", 1);
    cJSON_AddNumberToObject(req, "logprobs", 1);
    cJSON_AddBoolToObject(req, "echo", 1);
    cJSON_AddNumberToObject(req, "seed", 1234);
    cJSON_AddStringToObject(req, "model", "x");
    char *js = cJSON_PrintUnformatted(req);
    long st;
    cJSON *r = complete(js, &st);
    const cJSON *ch = r ? cJSON_GetArrayItem(tc_obj(r, "choices"), 0) : NULL;
    const cJSON *lo = ch ? tc_obj(ch, "logprobs") : NULL;
    CHECK_MSG(st == 200 && lo, "echo + logprobs: status %ld", st);
    if (lo) {
        const cJSON *tl = tc_obj(lo, "token_logprobs"), *tp = tc_obj(lo, "top_logprobs"), *tk = tc_obj(lo, "tokens"),
                    *to = tc_obj(lo, "text_offset");
        CHECK_MSG(cJSON_GetArraySize(tl) == n + 1 && cJSON_GetArraySize(tp) == n + 1 &&
                      cJSON_GetArraySize(tk) == n + 1 && cJSON_GetArraySize(to) == n + 1,
                  "logprobs arrays of %d, want %d", cJSON_GetArraySize(tl), n + 1);
        CHECK(cJSON_IsNull(cJSON_GetArrayItem(tl, 0)) && cJSON_IsNull(cJSON_GetArrayItem(tp, 0)));
        CHECK(tc_num(ch, "index") == 0);
        int exact = 0, near = 0;
        float *pre = malloc((size_t)V * sizeof *pre);
        for (int i = 1; i <= n && pre; i++) {
            const int32_t t = i < n ? P[i] : gen;
            const float *row = L + (size_t)(i - 1) * V;
            const double got = cJSON_GetArrayItem(tl, i)->valuedouble;
            exact += got == ref_lp(row, V, t);
            /* the same prefix through the prefill kernels */
            kvs_session_reset(ses);
            CHECK_OK(kvs_session_prefill(ses, P, i, NULL, pre, &err), &err);
            near += fabs(got - ref_lp(pre, V, t)) < 2e-3;
            /* top_logprobs: the chosen token's value bit-identical; the max is the argmax's */
            const cJSON *d = cJSON_GetArrayItem(tp, i), *it;
            double best = -INFINITY, chosen = NAN;
            cJSON_ArrayForEach(it, d) {
                if (it->valuedouble > best) best = it->valuedouble;
                if (it->valuedouble == got) chosen = got;
            }
            CHECK_MSG(chosen == got, "position %d: token_logprobs %.17g not among top_logprobs", i, got);
            CHECK_MSG(best == ref_lp(row, V, kvs_argmax(row, V)), "position %d: top value %.17g is not the argmax's", i,
                      best);
            if (t == kvs_argmax(row, V)) CHECK_MSG(got == best, "position %d: greedy token not recognised", i);
        }
        free(pre);
        CHECK_MSG(exact == n, "%d of %d log-probs bit-identical to the in-process decode path", exact, n);
        CHECK_MSG(near == n, "%d of %d log-probs within 2e-3 of the prefill of the prefix", near, n);
        CHECK(cJSON_GetArrayItem(to, 0)->valuedouble == 0 && cJSON_GetArrayItem(to, n)->valuedouble > 0);
        const cJSON *u = tc_obj(r, "usage");
        CHECK(tc_num(u, "prompt_tokens") == n && tc_num(u, "completion_tokens") == 1);
        /* --prepend-bos: the same ids without BOS are scored after BOS, which is not echoed */
        cJSON *req2 = cJSON_Duplicate(req, 1);
        cJSON_DeleteItemFromArray(cJSON_GetArrayItem(tc_obj(req2, "prompt"), 0), 0);
        char *js2 = cJSON_PrintUnformatted(req2);
        long st2;
        cJSON *r2 = complete(js2, &st2);
        const cJSON *lo2 = r2 ? tc_obj(cJSON_GetArrayItem(tc_obj(r2, "choices"), 0), "logprobs") : NULL;
        const cJSON *tl2 = tc_obj(lo2, "token_logprobs");
        CHECK_MSG(st2 == 200 && cJSON_GetArraySize(tl2) == n, "without BOS: %ld, %d entries, want %d", st2,
                  cJSON_GetArraySize(tl2), n);
        int same = 0;
        for (int i = 0; i < n && cJSON_GetArraySize(tl2) == n; i++) {
            const cJSON *a = cJSON_GetArrayItem(tl2, i), *b = cJSON_GetArrayItem(tl, i + 1);
            same += cJSON_IsNumber(a) && a->valuedouble == b->valuedouble;
        }
        CHECK_MSG(same == n, "without BOS: %d of %d log-probs equal those after the BOS", same, n);
        CHECK(cJSON_GetArrayItem(tc_obj(lo2, "text_offset"), 0) &&
              cJSON_GetArrayItem(tc_obj(lo2, "text_offset"), 0)->valuedouble == 0);
        cJSON_Delete(r2);
        free(js2);
        cJSON_Delete(req2);
    }
    cJSON_Delete(r);

    /* several prompts (texts): one choice each, equal to asking for each alone */
    const char *two = "{\"prompt\": [\"Hello world\", \"The quick brown\"], \"max_tokens\": 3, \"logprobs\": 2, "
                      "\"temperature\": 0}";
    r = complete(two, &st);
    CHECK_MSG(st == 200 && r && cJSON_GetArraySize(tc_obj(r, "choices")) == 2, "two prompts: %ld", st);
    const char *alone[2] = {"{\"prompt\": \"Hello world\", \"max_tokens\": 3, \"logprobs\": 2}",
                            "{\"prompt\": [\"The quick brown\"], \"max_tokens\": 3, \"logprobs\": 2}"};
    for (int k = 0; k < 2 && r; k++) {
        const cJSON *c = cJSON_GetArrayItem(tc_obj(r, "choices"), k);
        long st1;
        cJSON *r1 = complete(alone[k], &st1);
        const cJSON *c1 = r1 ? cJSON_GetArrayItem(tc_obj(r1, "choices"), 0) : NULL;
        CHECK(c && c1 && tc_num(c, "index") == k);
        char *a = c ? cJSON_PrintUnformatted(tc_obj(c, "logprobs")) : NULL,
             *b = c1 ? cJSON_PrintUnformatted(tc_obj(c1, "logprobs")) : NULL;
        CHECK_MSG(a && b && !strcmp(a, b) && !strcmp(tc_str_or_null(c, "text"), tc_str_or_null(c1, "text")),
                  "prompt %d alone differs", k);
        const cJSON *tl = tc_obj(tc_obj(c, "logprobs"), "token_logprobs");
        CHECK(cJSON_GetArraySize(tl) >= 1 && cJSON_GetArraySize(tl) <= 3 && !cJSON_IsNull(cJSON_GetArrayItem(tl, 0)));
        free(a);
        free(b);
        cJSON_Delete(r1);
    }
    cJSON_Delete(r);

    /* echo with max_tokens 0: the prompt only; no logprobs asked: null */
    r = complete("{\"prompt\": \"Hello world\", \"max_tokens\": 0, \"echo\": true}", &st);
    ch = r ? cJSON_GetArrayItem(tc_obj(r, "choices"), 0) : NULL;
    CHECK_MSG(st == 200 && ch && cJSON_IsNull(tc_obj(ch, "logprobs")) && !strcmp(tc_str(ch, "text"), "Hello world"),
              "echo, max_tokens 0: %ld '%s'", st, tc_str(ch, "text"));
    cJSON_Delete(r);
    /* [[ids]] without echo or logprobs: the plain path */
    cJSON_DeleteItemFromObject(req, "echo");
    cJSON_DeleteItemFromObject(req, "logprobs");
    free(js);
    js = cJSON_PrintUnformatted(req);
    r = complete(js, &st);
    ch = r ? cJSON_GetArrayItem(tc_obj(r, "choices"), 0) : NULL;
    CHECK_MSG(st == 200 && ch && tc_str_or_null(ch, "text"), "[[ids]] plain: %ld", st);
    cJSON_Delete(r);

    static const struct {
        const char *body, *field;
    } bad[] = {
        {"{\"prompt\": \"a\", \"echo\": true, \"temperature\": 0.5}", "temperature"},
        {"{\"prompt\": \"a\", \"logprobs\": 21}", "logprobs"},
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"stop\": [\"x\"]}", "stop"},
        /* kv_compression is taken (test_server_chunk.c), checked as elsewhere; one variant, no suffix */
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"kv_compression\": {\"method\": \"snapkv\"}}", "kv_compression.ratio"},
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"kv_compression\": [{\"method\": \"full\"}, {\"method\": \"full\"}]}",
         "kv_compression"},
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"kv_compression\": {\"method\": \"full\", \"suffix\": \"b\"}}",
         "kv_compression.suffix"},
        {"{\"prompt\": [\"a\", 5], \"logprobs\": 1}", "prompt[1]"},
        {"{\"prompt\": [[1, 2], [99999]], \"logprobs\": 1}", "prompt[1]"},
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"max_tokens\": 200}", "prompt"},
        {"{\"prompt\": \"a\", \"logprobs\": 1, \"max_tokens\": 0}", "max_tokens"},
        {"{\"prompt\": \"a\", \"echo\": true, \"presence_penalty\": 1}", "presence_penalty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = complete(bad[i].body, &st);
        const cJSON *e = r ? tc_obj(r, "error") : NULL;
        CHECK_MSG(st == 400 && e && !strcmp(tc_str(e, "field"), bad[i].field), "%s: status %ld, field %s, want 400 %s",
                  bad[i].body, st, e && tc_str_or_null(e, "field") ? tc_str_or_null(e, "field") : "-", bad[i].field);
        cJSON_Delete(r);
    }
    /* more than 64 prompts */
    char many[1024] = "{\"logprobs\": 0, \"prompt\": [\"a\"";
    for (int i = 1; i < 65; i++) strcat(many, ", \"a\"");
    strcat(many, "]}");
    r = complete(many, &st);
    CHECK_MSG(st == 400 && r && strstr(tc_str(tc_obj(r, "error"), "message"), "at most 64"),
              "65 prompts: %ld", st);
    cJSON_Delete(r);
    free(js);
    cJSON_Delete(req);
    kvs_session_free(ses);
    free(L);
    free(P);
}

int main(void) {
    kvs_err err_ = {0}, *err = &err_;
    tc_fixture fx;
    CHECK_OK(tc_fixture_init(&fx, "kvs-server-auth", "gemma3", err), err);
    CHECK_OK(tc_fixture_load(&fx, err), err);
    kvs_model *m = fx.model;
    if (!m) goto done;
    fx.cfg.slots = 2;
    fx.cfg.n_ctx = 96;
    char key[] = "s3cret-key";
    fx.cfg.api_key = key;
    fx.cfg.prepend_bos = 1;
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (!fx.srv) goto done;
    key[0] = 'X'; /* the server keeps its own copy */
    test_api_key();
    test_tokenizer(m);
    test_logprobs(m);
done:
    tc_fixture_free(&fx);
    return kvs_test_finish("test_server_auth");
}
