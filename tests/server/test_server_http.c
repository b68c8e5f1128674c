/*
 * test_server_http.c -- the HTTP server started in-process on a free loopback
 * port, driven over HTTP with libcurl, on a tiny random-weight model written by
 * the engine's test helper (tests/backend/tiny_model.c); argv[1] names the
 * architecture (gemma3, llama, qwen2; default gemma3).
 *
 * Covers: /health, /v1/models, /tokenize <-> /detokenize round trip,
 * /completion greedy output equal to an in-process greedy loop on the engine,
 * seeded sampling reproducibility, stop strings, the OpenAI endpoints, the
 * kv_compression extension (one object and variants: one prefill, checked on
 * /metrics; the "full" variant reproduces the plain output; per-layer kv
 * statistics; a method composed from parts, as an object or its JSON
 * text; KVzip's reconstruction pass shared by its variants, refused with
 * chunked compression), /kv/dump read back with kvs_dump_open, bad requests (4xx
 * naming the field; 413 over the body limit), concurrent requests beyond the slots, and the drain on
 * stop (a request in flight completes).
 * Not covered: the real model (integration tests), SIGTERM delivery itself
 * (cli/cmd_serve.c maps it to kvs_server_stop, exercised here).
 */
#include "kvs_backend.h"
#include "kvs_formats.h"
#include "kvs_server.h"
#include "server_internal.h"
#include "test_util.h"
#include "backend/tiny_model.h"
#include "server/http_client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define N_CTX 96

static tc_server g_srv = {.timeout_s = 60}; /* the port set once started */
static tiny_spec g_spec; /* the model under test (argv[1] names its architecture) */

/* gemma3 alternates 5 sliding-window layers with 1 global one */
static int layer_is_local(int l) { return !strcmp(g_spec.arch, "gemma3") && (l + 1) % 6 != 0; }

/* A metric value from /metrics text (the first line starting with name). */
static double metric(const char *name) {
    tc_reply r;
    long st = tc_request(&g_srv, "GET", "/metrics", NULL, NULL, &r);
    double v = NAN;
    if (st == 200) {
        size_t n = strlen(name);
        for (const char *p = r.body; p && *p;) {
            if (strncmp(p, name, n) == 0 && (p[n] == ' ' || p[n] == '{')) {
                const char *sp = strchr(p, ' ');
                if (sp) v = strtod(sp + 1, NULL);
                break;
            }
            p = strchr(p, '\n');
            if (p) p++;
        }
    }
    tc_reply_free(&r);
    return v;
}

/* Expect a 4xx whose error names `field` and whose message contains `words`. */
static void expect_error(const char *path, const char *json, long want_status, const char *field, const char *words) {
    long st;
    cJSON *r = tc_call(&g_srv, "POST", path, json, NULL, &st);
    const cJSON *e = r ? tc_obj(r, "error") : NULL;
    CHECK_MSG(st == want_status, "%s %s: status %ld, want %ld", path, json, st, want_status);
    CHECK_MSG(e && strcmp(tc_str(e, "field"), field) == 0, "%s %s: field '%s', want '%s' (message: %s)", path, json,
              e ? tc_str(e, "field") : "(none)", field, e ? tc_str(e, "message") : "");
    CHECK_MSG(e && strstr(tc_str(e, "message"), words), "%s %s: message '%s' lacks '%s'", path, json,
              e ? tc_str(e, "message") : "", words);
    cJSON_Delete(r);
}

/* KVzip end to end: the prefill runs the reconstruction pass once for all kvzip variants (copies take it
 * along), each variant decodes what it decodes alone (its own pass), its global layers are compressed to the
 * budget and its compress_ms counts the pass; chunked compression cannot give it. */
static void test_kvzip(void) {
    long st;
    const char *prompt = "the cat is on the cat a cat is an cat the cat on a cat is the cat an cat on the "
                         "cat is a cat the cat is on an cat";
    static const char *const kz[3] = {"{\"method\": \"kvzip\", \"ratio\": 0.3}",
                                      "{\"method\": \"kvzip\", \"ratio\": 0.5, \"params\": {\"sinks\": 2}}",
                                      "{\"method\": \"snapkv\", \"ratio\": 0.3}"};
    char req[2048];
    const double pre0 = metric("kvsieve_prefills_total"), comp0 = metric("kvsieve_compressions_total");
    snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 8, \"kv_compression\": {\"variants\": [%s, %s, %s]}}",
             prompt, kz[0], kz[1], kz[2]);
    cJSON *rv = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    CHECK(metric("kvsieve_prefills_total") - pre0 == 1 && metric("kvsieve_compressions_total") - comp0 == 3);
    const cJSON *vv = rv ? tc_obj(rv, "variants") : NULL;
    CHECK_EQ_INT(cJSON_GetArraySize(vv), 3);
    for (int i = 0; i < 3 && cJSON_GetArraySize(vv) == 3; i++) {
        snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 8, \"kv_compression\": %s}", prompt, kz[i]);
        cJSON *alone = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
        CHECK_EQ_INT(st, 200);
        const cJSON *v = cJSON_GetArrayItem(vv, i), *kv = tc_obj(v, "kv");
        CHECK_MSG(alone && cJSON_Compare(tc_obj(v, "tokens"), tc_obj(alone, "tokens"), 1) &&
                      cJSON_GetArraySize(tc_obj(v, "tokens")) == 8,
                  "kvzip variant %d decodes other tokens than alone", i);
        CHECK(kv && strcmp(tc_str(kv, "method"), i < 2 ? "kvzip" : "snapkv") == 0);
        CHECK(kv && tc_num(kv, "compress_ms") > 0);
        const int np = kv ? (int)tc_num(kv, "n_prompt") : 0;
        const double ratio = i == 1 ? 0.5 : 0.3;
        double kept = 0, glob = 0; /* rows of the global layers: per layer Hkv x its budget, summing to the total */
        const cJSON *la = kv ? tc_obj(kv, "layers") : NULL, *lb = alone ? tc_obj(tc_obj(alone, "kv"), "layers") : NULL;
        for (int l = 0; l < cJSON_GetArraySize(la); l++) {
            const cJSON *ly = cJSON_GetArrayItem(la, l);
            CHECK_MSG(lb && tc_num(ly, "tokens_after") == tc_num(cJSON_GetArrayItem(lb, l), "tokens_after"),
                      "kvzip variant %d layer %d: the cache differs from the variant alone", i, l);
            if (layer_is_local(l)) continue;
            CHECK(cJSON_IsTrue(tc_obj(ly, "compressed")));
            kept += tc_num(ly, "tokens_after");
            glob++;
        }
        const int per = (int)(ratio * np);
        CHECK_MSG(kept == glob * per * g_spec.n_kv_heads || (g_spec.n_kv_heads > 1 && kept == glob * per),
                  "kvzip variant %d: %g rows kept in %g global layers, want %d each (x %d heads)", i, kept, glob, per,
                  g_spec.n_kv_heads);
        cJSON_Delete(alone);
    }
    cJSON_Delete(rv);
    /* the pass needs the whole prompt before any compression */
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 4, \"kv_compression\": {\"method\": \"kvzip\", \"ratio\": 0.5, "
             "\"chunk\": 16}}", prompt);
    cJSON *r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    const cJSON *e = r ? tc_obj(r, "error") : NULL;
    CHECK_MSG(st >= 400 && e && strstr(tc_str(e, "message"), "kvzip needs the context-reconstruction pass"),
              "chunked kvzip: status %ld, %s", st, e ? tc_str(e, "message") : "(no error)");
    cJSON_Delete(r);
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 4, \"kv_compression\": {\"method\": \"kvzip\", \"ratio\": 0.5, "
             "\"suffix\": \" the question\", \"compress_suffix\": true}}", prompt);
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    e = r ? tc_obj(r, "error") : NULL;
    /* query-aware: a branch of its own runs the pass over prompt + question (server_settings decodes it);
     * this server's 96 positions leave no room for the pass's instruction, which the error says */
    CHECK_MSG(st == 400 && e && strstr(tc_str(e, "message"), "reconstruction pass (KVzip)") &&
                  strstr(tc_str(e, "message"), "leaves"),
              "kvzip with compress_suffix: status %ld, %s", st, e ? tc_str(e, "message") : "(no error)");
    cJSON_Delete(r);
}

/* The engine's own greedy continuation (the reference for /completion). */
static int engine_greedy(kvs_model *m, const int32_t *prompt, int n, int n_predict, int32_t *out) {
    kvs_err err_ = {0}, *err = &err_;
    kvs_session *s = NULL;
    kvs_session_opts so = {N_CTX, 1, 0, KVS_CACHE_F16, 0};
    const int V = kvs_model_get_info(m)->n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    int k = 0;
    if (kvs_session_new(m, &so, &s, err) || kvs_session_prefill(s, prompt, n, NULL, logits, err)) {
        fprintf(stderr, "engine_greedy: %s\n", err->msg);
        k = -1;
        goto done;
    }
    while (k < n_predict) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        if (kvs_token_is_eog(m, best)) break;
        out[k++] = best;
        if (k == n_predict) break;
        if (kvs_session_decode(s, best, logits, err)) {
            fprintf(stderr, "engine_greedy decode: %s\n", err->msg);
            k = -1;
            break;
        }
    }
done:
    kvs_session_free(s);
    free(logits);
    return k;
}

static int json_tokens(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (n < cap) out[n] = (int32_t)it->valuedouble;
        n++;
    }
    return n;
}

static void test_basic(kvs_model *m) {
    long st;
    cJSON *r = tc_call(&g_srv, "GET", "/health", NULL, NULL, &st);
    CHECK_EQ_INT(st, 200);
    CHECK(r && strcmp(tc_str(r, "status"), "ok") == 0);
    cJSON_Delete(r);

    r = tc_call(&g_srv, "GET", "/v1/models", NULL, NULL, &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *d0 = r ? cJSON_GetArrayItem(tc_obj(r, "data"), 0) : NULL;
    CHECK(d0 && strcmp(tc_str(d0, "id"), kvs_model_get_info(m)->name) == 0);
    CHECK(d0 && tc_num(tc_obj(d0, "meta"), "n_vocab") == kvs_model_get_info(m)->n_vocab);
    CHECK(d0 && strcmp(tc_str(tc_obj(d0, "meta"), "arch"), g_spec.arch) == 0);
    /* the weights a decode step reads (the decode-speed study's W): the engine's count, less than the file */
    CHECK(d0 && tc_num(tc_obj(d0, "meta"), "step_bytes") == (double)kvs_model_get_info(m)->step_bytes);
    CHECK(d0 && tc_num(tc_obj(d0, "meta"), "step_bytes") > 0 &&
          tc_num(tc_obj(d0, "meta"), "step_bytes") < tc_num(tc_obj(d0, "meta"), "size"));
    cJSON_Delete(r);

    /* tokenize: same ids as the engine; detokenize gives the engine's text back */
    kvs_err err_ = {0}, *err = &err_;
    int32_t *ref = NULL;
    int nref = 0;
    CHECK_OK(kvs_tokenize(m, "the cat is on", 13, 0, 1, &ref, &nref, err), err);
    r = tc_call(&g_srv, "POST", "/tokenize", "{\"content\": \"the cat is on\"}", NULL, &st);
    CHECK_EQ_INT(st, 200);
    int32_t toks[64];
    int n = r ? json_tokens(tc_obj(r, "tokens"), toks, 64) : -1;
    CHECK_EQ_INT(n, nref);
    CHECK(n == nref && n > 0 && memcmp(toks, ref, (size_t)n * sizeof *toks) == 0);
    CHECK_MSG(n == 4, "'the cat is on' should be 4 word tokens, got %d", n);
    cJSON_Delete(r);
    char body[512];
    int o = snprintf(body, sizeof body, "{\"tokens\": [");
    for (int i = 0; i < nref; i++) o += snprintf(body + o, sizeof body - (size_t)o, "%s%d", i ? "," : "", ref[i]);
    snprintf(body + o, sizeof body - (size_t)o, "]}");
    r = tc_call(&g_srv, "POST", "/detokenize", body, NULL, &st);
    CHECK_EQ_INT(st, 200);
    char *text = NULL;
    CHECK_OK(kvs_detokenize(m, ref, nref, 0, &text, err), err);
    CHECK_MSG(r && text && strcmp(tc_str(r, "content"), text) == 0, "detokenize '%s' vs engine '%s'",
              r ? tc_str(r, "content") : "", text ? text : "");
    CHECK(r && strstr(tc_str(r, "content"), "the cat is on"));
    free(text);
    cJSON_Delete(r);
    free(ref);

    /* with_pieces and add_special */
    r = tc_call(&g_srv, "POST", "/tokenize", "{\"content\": \"the cat\", \"with_pieces\": true, \"add_special\": true}",
                NULL, &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *arr = r ? tc_obj(r, "tokens") : NULL;
    CHECK_EQ_INT(cJSON_GetArraySize(arr), 3);
    CHECK(tc_num(cJSON_GetArrayItem(arr, 0), "id") == kvs_model_special(m)->bos);
    CHECK(strcmp(tc_str(cJSON_GetArrayItem(arr, 1), "piece"), "the") == 0);
    CHECK(strcmp(tc_str(cJSON_GetArrayItem(arr, 2), "piece"), " cat") == 0);
    cJSON_Delete(r);
}

static void test_completion(kvs_model *m) {
    long st;
    kvs_err err_ = {0}, *err = &err_;
    const char *prompt = "the cat is on the cat a cat is an cat";
    int32_t *ptoks = NULL;
    int np = 0;
    CHECK_OK(kvs_tokenize(m, prompt, strlen(prompt), kvs_model_special(m)->add_bos, 1, &ptoks, &np, err), err);
    int32_t ref[32];
    int nref = engine_greedy(m, ptoks, np, 12, ref);
    CHECK(nref > 0);

    char req[512];
    snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 12}", prompt);
    cJSON *r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    int32_t got[32];
    int ng = r ? json_tokens(tc_obj(r, "tokens"), got, 32) : -1;
    CHECK_MSG(ng == nref && memcmp(got, ref, (size_t)(ng > 0 ? ng : 0) * sizeof *got) == 0,
              "server greedy (%d tokens) differs from the engine's (%d)", ng, nref);
    CHECK(r && tc_num(r, "tokens_predicted") == ng);
    CHECK(r && tc_num(r, "tokens_evaluated") == np);
    CHECK(r && strcmp(tc_str(r, "stop_type"), nref == 12 ? "limit" : "eos") == 0);
    const cJSON *t = r ? tc_obj(r, "timings") : NULL;
    static const char *const names[] = {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                                        "predicted_n", "predicted_ms", "predicted_per_token_ms",
                                        "predicted_per_second"};
    for (int i = 0; i < 8; i++) CHECK_MSG(t && isfinite(tc_num(t, names[i])), "timings.%s missing", names[i]);
    CHECK(t && tc_num(t, "prompt_n") == np && tc_num(t, "predicted_n") == ng);
    CHECK(t && tc_num(t, "prompt_ms") > 0);
    /* the content is the detokenised tokens (cleaned to valid UTF-8) */
    char *text = NULL;
    CHECK_OK(kvs_detokenize(m, got, ng, 0, &text, err), err);
    char *clean = text ? srv_utf8_clean(text, strlen(text)) : NULL;
    CHECK(r && clean && strcmp(tc_str(r, "content"), clean) == 0);
    const cJSON *kv = r ? tc_obj(r, "kv") : NULL;
    CHECK(kv && strcmp(tc_str(kv, "method"), "none") == 0);
    CHECK(kv && tc_num(kv, "bytes_before") > 0);
    CHECK(kv && cJSON_GetArraySize(tc_obj(kv, "layers")) == g_spec.n_layers);
    /* nothing compressed: global layers hold the prompt, sliding-window ones their window */
    for (int l = 0; kv && l < g_spec.n_layers; l++) {
        const cJSON *ly = cJSON_GetArrayItem(tc_obj(kv, "layers"), l);
        double tb = tc_num(ly, "tokens_before"), ta = tc_num(ly, "tokens_after");
        CHECK_EQ_INT((int)tb, np);
        CHECK_MSG(ta == (layer_is_local(l) && np >= g_spec.sliding_window ? g_spec.sliding_window - 1 : np),
                  "plain request layer %d: %g of %d rows held", l, ta, np);
        CHECK(!cJSON_IsTrue(tc_obj(ly, "compressed")));
    }
    free(text);
    free(clean);
    cJSON_Delete(r);

    /* token-id prompt gives the same */
    int o = snprintf(req, sizeof req, "{\"n_predict\": 12, \"prompt\": [");
    for (int i = 0; i < np; i++) o += snprintf(req + o, sizeof req - (size_t)o, "%s%d", i ? "," : "", ptoks[i]);
    snprintf(req + o, sizeof req - (size_t)o, "]}");
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    ng = r ? json_tokens(tc_obj(r, "tokens"), got, 32) : -1;
    CHECK(ng == nref && memcmp(got, ref, (size_t)(ng > 0 ? ng : 0) * sizeof *got) == 0);
    cJSON_Delete(r);

    /* seeded sampling: same seed -> same tokens, and the seed is reported */
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 16, \"temperature\": 1.5, \"top_k\": 40, \"top_p\": 0.95, \"seed\": 77}",
             prompt);
    int32_t a[32], b[32];
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    int na = r ? json_tokens(tc_obj(r, "tokens"), a, 32) : -1;
    CHECK(r && tc_num(tc_obj(r, "generation_settings"), "seed") == 77);
    cJSON_Delete(r);
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    int nb = r ? json_tokens(tc_obj(r, "tokens"), b, 32) : -2;
    cJSON_Delete(r);
    CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0);

    /* stop string: the piece of a printable token of a sampled output (the
     * greedy output of a random model repeats one token); the same seed
     * replays the same tokens up to the stop */
    snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 40, \"temperature\": 1.0, \"seed\": 123}",
             prompt);
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    int32_t full[48];
    int nfull = r ? json_tokens(tc_obj(r, "tokens"), full, 48) : 0;
    cJSON_Delete(r);
    char piece[64], *raw = NULL;
    int stop_at = -1;
    for (int i = 2; i < nfull && i < 48 && stop_at < 0; i++) {
        int k = kvs_token_to_piece(m, full[i], 0, piece, (int)sizeof piece - 1);
        if (k < 1 || k >= (int)sizeof piece - 1) continue;
        piece[k] = 0;
        int ok = 1, visible = 0;
        for (int j = 0; j < k; j++) {
            ok &= piece[j] >= 32 && piece[j] < 127 && piece[j] != '"' && piece[j] != '\\';
            visible |= piece[j] > 32;
        }
        if (ok && visible) stop_at = i;
    }
    CHECK_MSG(stop_at > 0, "no printable token among %d sampled tokens to use as a stop string", nfull);
    if (stop_at > 0) {
        CHECK_OK(kvs_detokenize(m, full, nfull, 0, &raw, err), err);
        const char *hit = raw ? strstr(raw, piece) : NULL;
        CHECK(hit != NULL);
        size_t cut = hit ? (size_t)(hit - raw) : 0;
        char *want = raw ? srv_utf8_clean(raw, cut) : NULL;
        snprintf(req, sizeof req,
                 "{\"prompt\": \"%s\", \"n_predict\": 40, \"temperature\": 1.0, \"seed\": 123, \"stop\": [\"%s\"]}",
                 prompt, piece);
        r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
        CHECK_EQ_INT(st, 200);
        CHECK(r && strcmp(tc_str(r, "stop_type"), "word") == 0);
        CHECK(r && strcmp(tc_str(r, "stopping_word"), piece) == 0);
        CHECK_MSG(r && want && strcmp(tc_str(r, "content"), want) == 0, "stop '%s': content '%s', want '%s'", piece,
                  r ? tc_str(r, "content") : "", want ? want : "");
        CHECK(r && tc_num(r, "tokens_predicted") <= stop_at + 1);
        cJSON_Delete(r);
        free(want);
        free(raw);
    }

    /* OpenAI text completion: same greedy text, usage numbers */
    snprintf(req, sizeof req, "{\"model\": \"x\", \"prompt\": \"%s\", \"max_tokens\": 12}", prompt);
    r = tc_call(&g_srv, "POST", "/v1/completions", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *c0 = r ? cJSON_GetArrayItem(tc_obj(r, "choices"), 0) : NULL;
    CHECK_OK(kvs_detokenize(m, ref, nref, 0, &text, err), err);
    clean = text ? srv_utf8_clean(text, strlen(text)) : NULL;
    CHECK(c0 && clean && strcmp(tc_str(c0, "text"), clean) == 0);
    CHECK(c0 && strcmp(tc_str(c0, "finish_reason"), nref == 12 ? "length" : "stop") == 0);
    CHECK(r && tc_num(tc_obj(r, "usage"), "prompt_tokens") == np &&
          tc_num(tc_obj(r, "usage"), "completion_tokens") == nref);
    CHECK(r && strcmp(tc_str(r, "object"), "text_completion") == 0);
    free(text);
    free(clean);
    cJSON_Delete(r);

    /* chat: the template is applied and the answer comes back as a message */
    r = tc_call(&g_srv, "POST", "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
                "\"content\": [{\"type\": \"text\", \"text\": \"the\"}, {\"type\": \"text\", \"text\": \" cat\"}]}], "
                "\"max_tokens\": 6}",
                NULL, &st);
    CHECK_EQ_INT(st, 200);
    c0 = r ? cJSON_GetArrayItem(tc_obj(r, "choices"), 0) : NULL;
    CHECK(c0 && strcmp(tc_str(tc_obj(c0, "message"), "role"), "assistant") == 0);
    CHECK(r && tc_num(tc_obj(r, "usage"), "completion_tokens") <= 6);
    CHECK(r && strcmp(tc_str(r, "object"), "chat.completion") == 0);
    /* the prompt is the template's: more tokens than the two words */
    CHECK(r && tc_num(tc_obj(r, "usage"), "prompt_tokens") > 4);
    cJSON_Delete(r);
    free(ptoks);
}

static void test_variants(void) {
    long st;
    const char *prompt = "the cat is on the cat a cat is an cat the cat on a cat is the cat an cat on the "
                         "cat is a cat the cat is on an cat";
    char req[2048];
    snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 10}", prompt);
    cJSON *plain = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    double pre0 = metric("kvsieve_prefills_total"), comp0 = metric("kvsieve_compressions_total");
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 10, \"kv_compression\": {\"variants\": ["
             "{\"method\": \"full\"},"
             "{\"method\": \"streamingllm\", \"ratio\": 0.5, \"name\": \"sl\"},"
             "{\"method\": \"snapkv\", \"tokens\": 8},"
             "{\"method\": \"h2o\", \"ratio\": 0.3, \"compress_local\": true}]}}",
             prompt);
    cJSON *r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    double pre1 = metric("kvsieve_prefills_total"), comp1 = metric("kvsieve_compressions_total");
    CHECK_MSG(pre1 - pre0 == 1, "4 variants cost %g prefills, want 1", pre1 - pre0);
    CHECK_MSG(comp1 - comp0 == 4, "4 variants ran %g compressions", comp1 - comp0);
    const cJSON *vs = r ? tc_obj(r, "variants") : NULL;
    CHECK_EQ_INT(cJSON_GetArraySize(vs), 4);
    /* the full variant reproduces the plain request */
    const cJSON *v0 = cJSON_GetArrayItem(vs, 0);
    CHECK(v0 && plain && strcmp(tc_str(v0, "content"), tc_str(plain, "content")) == 0);
    CHECK(v0 && plain &&
          cJSON_Compare(tc_obj(v0, "tokens"), tc_obj(plain, "tokens"), 1));
    CHECK(r && plain && strcmp(tc_str(r, "content"), tc_str(plain, "content")) == 0);
    const int n_prompt = plain ? (int)tc_num(tc_obj(plain, "timings"), "prompt_n") : 0;
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetArrayItem(vs, i);
        const cJSON *kv = tc_obj(v, "kv"), *t = tc_obj(v, "timings");
        CHECK_MSG(kv && t, "variant %d lacks kv or timings", i);
        if (!kv || !t) continue;
        CHECK(tc_num(t, "prompt_n") == n_prompt);
        CHECK(tc_num(kv, "compress_ms") >= 0);
        CHECK(tc_num(kv, "n_prompt") == n_prompt);
        const cJSON *layers = tc_obj(kv, "layers");
        CHECK_EQ_INT(cJSON_GetArraySize(layers), g_spec.n_layers);
        for (int l = 0; l < g_spec.n_layers; l++) {
            const cJSON *ly = cJSON_GetArrayItem(layers, l);
            int local = cJSON_IsTrue(tc_obj(ly, "local"));
            CHECK_EQ_INT(local, layer_is_local(l));
            double tb = tc_num(ly, "tokens_before"), ta = tc_num(ly, "tokens_after");
            double bb = tc_num(ly, "bytes_before"), ba = tc_num(ly, "bytes_after");
            CHECK(tb > 0 && ta <= tb && ba <= bb);
            int expect_compressed = i > 0 && (!local || i == 3);
            CHECK_MSG(cJSON_IsTrue(tc_obj(ly, "compressed")) == expect_compressed, "variant %d layer %d: compressed %d",
                      i, l, cJSON_IsTrue(tc_obj(ly, "compressed")));
            /* sliding-window layers keep at most their window, compressed or not */
            if (local) CHECK_MSG(ta <= g_spec.sliding_window - 1, "variant %d local layer %d holds %g rows", i, l, ta);
            else CHECK_MSG((ta < tb) == expect_compressed, "variant %d layer %d: tokens %g -> %g", i, l, tb, ta);
            if (expect_compressed || local)
                CHECK_MSG(ba < bb, "variant %d layer %d: bytes %g -> %g not freed", i, l, bb, ba);
        }
    }
    const cJSON *v1 = cJSON_GetArrayItem(vs, 1);
    CHECK(strcmp(tc_str(v1, "name"), "sl") == 0);
    CHECK(strcmp(tc_str(tc_obj(v1, "kv"), "method"), "streamingllm") == 0);
    CHECK(tc_num(tc_obj(tc_obj(v1, "kv"), "budget"), "ratio") == 0.5);
    CHECK(tc_obj(tc_obj(v1, "kv"), "params") && cJSON_IsObject(tc_obj(tc_obj(v1, "kv"), "params")));
    /* the global layer of streamingllm at 0.5 keeps floor(0.5 N) per head */
    const cJSON *gl = cJSON_GetArrayItem(tc_obj(tc_obj(v1, "kv"), "layers"), 5);
    CHECK_MSG(tc_num(gl, "tokens_after") == (double)(n_prompt / 2) * g_spec.n_kv_heads ||
                  tc_num(gl, "tokens_after") == (double)(n_prompt / 2),
              "streamingllm 0.5: layer 5 keeps %g of %d", tc_num(gl, "tokens_after"), n_prompt);
    const cJSON *v2 = cJSON_GetArrayItem(vs, 2);
    CHECK(tc_num(tc_obj(tc_obj(v2, "kv"), "budget"), "tokens") == 8);
    cJSON_Delete(r);
    cJSON_Delete(plain);

    /* no variant compresses sliding-window layers: the server trims the prefill's cache once before the
     * copies (sched.c); every variant must still decode what it decodes alone, and report the same cache */
    {
        static const char *const kv1[3] = {"{\"method\": \"full\"}", "{\"method\": \"streamingllm\", \"ratio\": 0.5}",
                                           "{\"method\": \"snapkv\", \"tokens\": 8}"};
        snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 10, \"kv_compression\": {\"variants\": [%s, %s, %s]}}",
                 prompt, kv1[0], kv1[1], kv1[2]);
        cJSON *rv = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
        CHECK_EQ_INT(st, 200);
        const cJSON *vv = rv ? tc_obj(rv, "variants") : NULL;
        CHECK_EQ_INT(cJSON_GetArraySize(vv), 3);
        for (int i = 0; i < 3 && cJSON_GetArraySize(vv) == 3; i++) {
            snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"n_predict\": 10, \"kv_compression\": %s}", prompt, kv1[i]);
            cJSON *alone = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
            CHECK_EQ_INT(st, 200);
            const cJSON *v = cJSON_GetArrayItem(vv, i);
            CHECK_MSG(alone && cJSON_Compare(tc_obj(v, "tokens"), tc_obj(alone, "tokens"), 1),
                      "variant %d (%s) decodes other tokens than alone", i, kv1[i]);
            const cJSON *la = alone ? tc_obj(tc_obj(alone, "kv"), "layers") : NULL,
                        *lv = tc_obj(tc_obj(v, "kv"), "layers");
            CHECK_MSG(cJSON_GetArraySize(la) == g_spec.n_layers && cJSON_GetArraySize(lv) == g_spec.n_layers,
                      "variant %d: kv.layers missing", i);
            for (int l = 0; la && lv && l < g_spec.n_layers; l++)
                CHECK_MSG(tc_num(cJSON_GetArrayItem(la, l), "tokens_after") ==
                                  tc_num(cJSON_GetArrayItem(lv, l), "tokens_after") &&
                              tc_num(cJSON_GetArrayItem(la, l), "tokens_before") ==
                                  tc_num(cJSON_GetArrayItem(lv, l), "tokens_before"),
                          "variant %d layer %d: the cache differs from the variant alone", i, l);
            cJSON_Delete(alone);
        }
        cJSON_Delete(rv);
    }

    /* variants sharing a method and its parameters observe the cache once (plan_groups.c): each must decode
     * what it decodes alone, with the same cache and the same span retention */
    {
        static const char *const kg[6] = {
            "{\"method\": \"h2o\", \"ratio\": 0.75}", "{\"method\": \"snapkv\", \"tokens\": 8}",
            "{\"method\": \"h2o\", \"ratio\": 0.25}", "{\"method\": \"h2o\", \"ratio\": 0.5, \"compress_local\": true}",
            "{\"method\": \"snapkv\", \"ratio\": 0.5}", "{\"method\": \"h2o\", \"tokens\": 5}"};
        snprintf(req, sizeof req,
                 "{\"prompt\": \"%s\", \"n_predict\": 10, \"kv_spans\": [{\"start\": 0, \"end\": 12}], "
                 "\"kv_compression\": {\"variants\": [%s, %s, %s, %s, %s, %s]}}",
                 prompt, kg[0], kg[1], kg[2], kg[3], kg[4], kg[5]);
        cJSON *rv = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
        CHECK_EQ_INT(st, 200);
        const cJSON *vv = rv ? tc_obj(rv, "variants") : NULL;
        CHECK_EQ_INT(cJSON_GetArraySize(vv), 6);
        for (int i = 0; i < 6 && cJSON_GetArraySize(vv) == 6; i++) {
            snprintf(req, sizeof req,
                     "{\"prompt\": \"%s\", \"n_predict\": 10, \"kv_spans\": [{\"start\": 0, \"end\": 12}], "
                     "\"kv_compression\": %s}",
                     prompt, kg[i]);
            cJSON *alone = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
            CHECK_EQ_INT(st, 200);
            const cJSON *v = cJSON_GetArrayItem(vv, i);
            CHECK_MSG(alone && cJSON_Compare(tc_obj(v, "tokens"), tc_obj(alone, "tokens"), 1),
                      "grouped variant %d (%s) decodes other tokens than alone", i, kg[i]);
            const cJSON *ka = alone ? tc_obj(alone, "kv") : NULL, *kv = tc_obj(v, "kv");
            CHECK_MSG(ka && kv && cJSON_Compare(tc_obj(ka, "span_kept"), tc_obj(kv, "span_kept"), 1) &&
                          tc_obj(kv, "span_kept"),
                      "grouped variant %d: span_kept differs from the variant alone", i);
            const cJSON *la = ka ? tc_obj(ka, "layers") : NULL, *lv = kv ? tc_obj(kv, "layers") : NULL;
            CHECK_MSG(cJSON_GetArraySize(la) == g_spec.n_layers && cJSON_GetArraySize(lv) == g_spec.n_layers,
                      "grouped variant %d: kv.layers missing", i);
            for (int l = 0; la && lv && l < g_spec.n_layers; l++) {
                const cJSON *a = cJSON_GetArrayItem(la, l), *b = cJSON_GetArrayItem(lv, l);
                CHECK_MSG(tc_num(a, "tokens_after") == tc_num(b, "tokens_after") &&
                              tc_num(a, "bytes_after") == tc_num(b, "bytes_after") &&
                              cJSON_IsTrue(tc_obj(a, "compressed")) == cJSON_IsTrue(tc_obj(b, "compressed")),
                          "grouped variant %d layer %d: the cache differs from the variant alone", i, l);
            }
            CHECK(kv && tc_num(kv, "compress_ms") >= 0);
            cJSON_Delete(alone);
        }
        cJSON_Delete(rv);
    }

    /* one object: "kv" describes it, no "variants" */
    pre0 = metric("kvsieve_prefills_total");
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 4, \"kv_compression\": {\"method\": \"random\", \"ratio\": 0.25, "
             "\"params\": {\"seed\": 3}}}",
             prompt);
    r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    CHECK(r && !tc_obj(r, "variants"));
    CHECK(r && strcmp(tc_str(tc_obj(r, "kv"), "method"), "random") == 0);
    CHECK(r && tc_num(tc_obj(tc_obj(r, "kv"), "params"), "seed") == 3);
    CHECK(r && tc_num(tc_obj(r, "kv"), "tokens_after") < tc_num(tc_obj(r, "kv"), "tokens_before"));
    CHECK(metric("kvsieve_prefills_total") - pre0 == 1);
    cJSON_Delete(r);
}

/* kv_compression.method composed from parts: an object, or its canonical
 * JSON as a string, both run the composition (kv.method is the canonical
 * JSON); the description of pyramidkv's composition decodes what pyramidkv
 * decodes and keeps the same cache; errors name the field and the part. */
static void test_composed_method(void) {
    long st;
    const char *prompt = "the cat is on the cat a cat is an cat the cat on a cat is the cat an cat on the "
                         "cat is a cat the cat is on an cat";
    const char *desc = "{\"score\": \"snapkv\", \"allocate\": \"pyramid\", \"keep\": {\"window\": 8}}";
    const char *canon = "{\"score\":\"snapkv\",\"allocate\":\"pyramid\",\"keep\":{\"window\":8},"
                        "\"pick\":\"topk\",\"merge\":\"none\",\"params\":{\"kernel\":7,\"pool\":\"max\","
                        "\"beta\":20,\"recent_frac\":0}}";
    char req[2048];
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 8, \"kv_compression\": {\"method\": \"pyramidkv\", "
             "\"ratio\": 0.5}}",
             prompt);
    cJSON *ref = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    snprintf(req, sizeof req,
             "{\"prompt\": \"%s\", \"n_predict\": 8, \"kv_compression\": {\"method\": %s, \"ratio\": 0.5, "
             "\"name\": \"pyr\"}}",
             prompt, desc);
    cJSON *r = tc_call(&g_srv, "POST", "/completion", req, NULL, &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *kv = r ? tc_obj(r, "kv") : NULL;
    CHECK_MSG(kv && strcmp(tc_str(kv, "method"), canon) == 0, "kv.method: %s", kv ? tc_str(kv, "method") : "-");
    CHECK(r && ref && cJSON_Compare(tc_obj(r, "tokens"), tc_obj(ref, "tokens"), 1));
    const cJSON *la = ref ? tc_obj(tc_obj(ref, "kv"), "layers") : NULL, *lb = tc_obj(kv, "layers");
    CHECK_EQ_INT(cJSON_GetArraySize(lb), g_spec.n_layers);
    for (int l = 0; la && lb && l < g_spec.n_layers; l++)
        CHECK_MSG(tc_num(cJSON_GetArrayItem(la, l), "tokens_after") ==
                      tc_num(cJSON_GetArrayItem(lb, l), "tokens_after"),
                  "layer %d: composed pyramidkv keeps another count", l);
    /* the canonical JSON as a string: the same method (what the eval client sends) */
    cJSON *jr = cJSON_CreateObject();
    cJSON_AddStringToObject(jr, "prompt", prompt);
    cJSON_AddNumberToObject(jr, "n_predict", 8);
    cJSON *kc = cJSON_AddObjectToObject(jr, "kv_compression");
    cJSON_AddStringToObject(kc, "method", canon);
    cJSON_AddNumberToObject(kc, "ratio", 0.5);
    char *text = cJSON_PrintUnformatted(jr);
    cJSON *r2 = tc_call(&g_srv, "POST", "/completion", text, NULL, &st);
    CHECK_EQ_INT(st, 200);
    CHECK(r2 && r && cJSON_Compare(tc_obj(r2, "tokens"), tc_obj(r, "tokens"), 1));
    CHECK(r2 && strcmp(tc_str(tc_obj(r2, "kv"), "method"), canon) == 0);
    cJSON_free(text);
    cJSON_Delete(jr);
    cJSON_Delete(r2);
    cJSON_Delete(r);
    cJSON_Delete(ref);
    expect_error("/completion",
                 "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": {\"score\": \"snapk\"}, \"ratio\": 0.5}}",
                 400, "kv_compression.method", "score: unknown scorer 'snapk' (did you mean 'snapkv'?)");
    expect_error("/completion",
                 "{\"prompt\": \"hi\", \"kv_compression\": {\"variants\": [{\"method\": \"full\"}, "
                 "{\"method\": {\"score\": \"knorm\", \"pick\": \"chunk\", \"params\": {\"chunk\": 0}}, "
                 "\"ratio\": 0.5}]}}",
                 400, "kv_compression.variants[1].method", "(read by pick chunk)");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": 3, \"ratio\": 0.5}}",
                 400, "kv_compression.method", "a method name or an object");
}

static void test_dump(void) {
    tc_reply r;
    long st = tc_request(&g_srv, "POST", "/kv/dump",
                         "{\"prompt\": \"the cat is on\", \"queries\": 3, \"dtype\": \"F16\"}", NULL, &r);
    CHECK_EQ_INT(st, 200);
    char path[] = "/tmp/kvs-test-dump-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK((size_t)write(fd, r.body, r.len) == r.len);
        close(fd);
        kvs_dump d;
        kvs_err err_ = {0}, *err = &err_;
        CHECK_OK(kvs_dump_open(path, &d, err), err);
        if (err->code == KVS_OK) {
            CHECK_EQ_INT(d.shape.n_layers, g_spec.n_layers);
            CHECK_EQ_INT(d.shape.n_kv_heads, g_spec.n_kv_heads);
            CHECK_EQ_INT(d.shape.head_dim, g_spec.head_dim);
            CHECK_EQ_INT(d.shape.n_tokens, 5); /* BOS + 4 words */
            CHECK_EQ_INT(d.shape.n_queries, 3);
            CHECK_EQ_INT(d.shape.n_q_heads, g_spec.n_heads);
            CHECK(d.view.layers[0].k.dtype == KVS_F16);
            kvs_dump_close(&d);
        }
        unlink(path);
    }
    tc_reply_free(&r);
}

static void test_bad_requests(void) {
    double e0 = metric("kvsieve_request_errors_total");
    (void)e0;
    expect_error("/completion", "{\"n_predict\": 4}", 400, "prompt", "required");
    expect_error("/completion", "{\"prompt\": 5}", 400, "prompt", "string");
    expect_error("/completion", "{\"prompt\": \"hi\", \"n_predict\": \"ten\"}", 400, "n_predict", "integer");
    expect_error("/completion", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "temperature", "number");
    expect_error("/completion", "{\"prompt\": \"hi\", \"top_p\": 0}", 400, "top_p", "(0, 1]");
    expect_error("/completion", "{\"prompt\": \"hi\", \"stream\": true}", 400, "stream", "not supported");
    expect_error("/completion", "{\"prompt\": \"hi\", \"stop\": [\"ok\", 3]}", 400, "stop[1]", "string");
    expect_error("/completion", "{\"prompt\": \"hi\", \"repeat_penalty\": 1.1}", 400, "repeat_penalty", "not supported");
    /* /v1/completions serves logprobs and echo (logprobs.c, test_server_auth.c); the others refuse them */
    expect_error("/completion", "{\"prompt\": \"hi\", \"logprobs\": 5}", 400, "logprobs", "not supported");
    expect_error("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"echo\": true}", 400, "echo", "not supported");
    expect_error("/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}}",
                 400, "response_format", "text");
    /* images: refused naming the field on every generation endpoint (an
     * empty list asks for none) */
    expect_error("/v1/completions", "{\"prompt\": \"<__media__> hi\", \"multimodal_data\": [\"iVBORw0KGgo=\"]}", 400,
                 "multimodal_data", "text-only");
    expect_error("/completion", "{\"prompt\": \"hi\", \"multimodal_data\": \"iVBORw0KGgo=\"}", 400,
                 "multimodal_data", "text-only");
    expect_error("/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"multimodal_data\": [\"AAAA\"]}",
                 400, "multimodal_data", "text-only");
    {
        long st = 0;
        cJSON *r = tc_call(&g_srv, "POST", "/completion",
                           "{\"prompt\": \"hi\", \"n_predict\": 1, \"multimodal_data\": []}", NULL, &st);
        CHECK_MSG(st == 200, "an empty multimodal_data list: status %ld, want 200", st);
        cJSON_Delete(r);
    }
    expect_error("/completion", "{\"prompt\": [1, 2, 999999]}", 400, "prompt[2]", "token id");
    expect_error("/completion", "{\"prompt\": \"hi\"", 400, "body", "JSON");
    expect_error("/completion", "[1, 2]", 400, "body", "object");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"nosuch\", \"ratio\": 0.5}}",
                 400, "kv_compression.method", "nosuch");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"snapkv\", \"ratio\": 0}}",
                 400, "kv_compression.ratio", "(0, 1]");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"snapkv\"}}", 400,
                 "kv_compression.ratio", "budget");
    expect_error("/completion",
                 "{\"prompt\": \"hi\", \"kv_compression\": {\"variants\": [{\"method\": \"full\"}, "
                 "{\"method\": \"h2o\", \"ratio\": 1.5}]}}",
                 400, "kv_compression.variants[1].ratio", "(0, 1]");
    expect_error("/completion",
                 "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"snapkv\", \"ratio\": 0.5, "
                 "\"params\": {\"windoww\": 4}}}",
                 400, "kv_compression.params.windoww", "windoww");
    expect_error("/completion",
                 "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"snapkv\", \"ratio\": 0.5, \"budget\": 3}}",
                 400, "kv_compression.budget", "unknown field");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": {\"method\": \"snapkv\", \"tokens\": 0}}", 400,
                 "kv_compression.tokens", "[1,");
    expect_error("/completion", "{\"prompt\": \"hi\", \"kv_compression\": 7}", 400, "kv_compression", "object");
    /* a prompt longer than the context: refused, not truncated */
    char req[4096];
    int o = snprintf(req, sizeof req, "{\"prompt\": \"");
    for (int i = 0; i < N_CTX + 10; i++) o += snprintf(req + o, sizeof req - (size_t)o, "the ");
    snprintf(req + o, sizeof req - (size_t)o, "\", \"n_predict\": 2}");
    expect_error("/completion", req, 400, "prompt", "not truncated");
    expect_error("/v1/completions", req, 400, "prompt", "context");
    expect_error("/kv/dump", req, 400, "prompt", "context");
    expect_error("/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", 400, "n", "[1, 1]");
    expect_error("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": -5}", 400, "max_tokens", "[-1,");
    expect_error("/v1/chat/completions", "{\"max_tokens\": 3}", 400, "messages", "required");
    expect_error("/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400,
                 "messages[0].role", "robot");
    expect_error("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content",
                 "required");
    expect_error("/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400,
                 "messages[0].content[0].type", "image_url");
    expect_error("/tokenize", "{}", 400, "content", "required");
    expect_error("/tokenize", "{\"content\": \"x\", \"with_pieces\": 1}", 400, "with_pieces", "true or false");
    expect_error("/detokenize", "{\"tokens\": [1, 999999]}", 400, "tokens[1]", "not a token id");
    expect_error("/detokenize", "{\"tokens\": \"abc\"}", 400, "tokens", "array");
    expect_error("/kv/dump", "{\"prompt\": \"hi\", \"dtype\": \"F64\"}", 400, "dtype", "F64");
    expect_error("/nowhere", "{}", 404, "path", "no endpoint");
    long st;
    cJSON *r = tc_call(&g_srv, "GET", "/completion", NULL, NULL, &st);
    CHECK_EQ_INT(st, 405);
    CHECK(r && strcmp(tc_str(tc_obj(r, "error"), "field"), "method") == 0);
    cJSON_Delete(r);
    double e1 = metric("kvsieve_request_errors_total");
    CHECK(isfinite(e1));
}

/* ---- concurrency and drain ------------------------------------------------ */

typedef struct {
    const char *req;
    long status;
    char *body;
} job_t;

static void *job_run(void *p) {
    job_t *j = p;
    tc_reply r;
    j->status = tc_request(&g_srv, "POST", "/completion", j->req, NULL, &r);
    j->body = r.body;
    return NULL;
}

static void test_queue(void) {
    const char *req = "{\"prompt\": \"the cat is on the\", \"n_predict\": 24}";
    enum { J = 5 };
    job_t jobs[J];
    pthread_t th[J];
    for (int i = 0; i < J; i++) {
        jobs[i] = (job_t){req, 0, NULL};
        pthread_create(&th[i], NULL, job_run, &jobs[i]);
    }
    for (int i = 0; i < J; i++) pthread_join(th[i], NULL);
    cJSON *r0 = cJSON_Parse(jobs[0].body);
    for (int i = 0; i < J; i++) {
        CHECK_EQ_INT(jobs[i].status, 200);
        cJSON *ri = cJSON_Parse(jobs[i].body);
        CHECK_MSG(r0 && ri && cJSON_Compare(tc_obj(r0, "tokens"), tc_obj(ri, "tokens"), 1),
                  "concurrent request %d gave other tokens", i);
        cJSON_Delete(ri);
        free(jobs[i].body);
    }
    cJSON_Delete(r0);
    CHECK(metric("kvsieve_requests_processing") == 0);
    CHECK(metric("kvsieve_requests_waiting") == 0);
}

static void *stop_run(void *p) {
    kvs_server_stop(p);
    return NULL;
}

/* Drain: hold both slots from here so a request is queued, stop the server
 * from another thread, see it refuse new work, then free the slots: the
 * queued request must still complete with 200 before stop returns. */
static void test_drain(kvs_server *srv) {
    srv_slot_acquire(srv);
    srv_slot_acquire(srv);
    job_t j = {"{\"prompt\": \"the cat is on the\", \"n_predict\": 20}", 0, NULL};
    pthread_t th, stopper;
    pthread_create(&th, NULL, job_run, &j);
    int waited = 0;
    for (int i = 0; i < 4000 && metric("kvsieve_requests_waiting") < 1; i++) {
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        waited = i;
    }
    CHECK_MSG(metric("kvsieve_requests_waiting") == 1, "the request did not queue (waited %d ms)", waited);
    pthread_create(&stopper, NULL, stop_run, srv);
    long h = 200;
    for (int i = 0; i < 4000 && h == 200; i++) {
        h = tc_status(&g_srv, "GET", "/health", NULL);
        if (h == 200) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    CHECK_MSG(h == 503 || h == 0, "while draining /health answered %ld", h);
    CHECK_EQ_INT(j.status, 0); /* still queued */
    srv_slot_release(srv);
    srv_slot_release(srv);
    pthread_join(th, NULL);
    pthread_join(stopper, NULL);
    CHECK_MSG(j.status == 200, "request queued during the drain got %ld", j.status);
    cJSON *r = cJSON_Parse(j.body);
    CHECK(r && cJSON_GetArraySize(tc_obj(r, "tokens")) > 0);
    cJSON_Delete(r);
    free(j.body);
    /* after stop nothing listens */
    CHECK_EQ_INT(tc_status(&g_srv, "GET", "/health", NULL), 0);
}

int main(int argc, char **argv) {
    kvs_err err_ = {0}, *err = &err_;
    tc_fixture fx;
    CHECK_OK(tc_fixture_init(&fx, "kvs-server-test", argc > 1 ? argv[1] : "gemma3", err), err);
    g_spec = fx.spec;
    CHECK_OK(tc_fixture_load(&fx, err), err);
    kvs_model *m = fx.model;
    if (!m) goto done;

    /* config errors */
    kvs_server_config *cfg = &fx.cfg;
    cfg->slots = 0;
    CHECK_FAILS(kvs_server_start(m, cfg, &fx.srv, err), KVS_ERR_INVALID, err, "slots");
    cfg->slots = 2;
    cfg->host = "no.such.host.invalid";
    CHECK_FAILS(kvs_server_start(m, cfg, &fx.srv, err), KVS_ERR_INVALID, err, "no.such.host.invalid");

    cfg->host = "127.0.0.1";
    cfg->n_ctx = 100000; /* the tiny model was trained for 256 */
    CHECK_FAILS(kvs_server_start(m, cfg, &fx.srv, err), KVS_ERR_INVALID, err, "context length 256");
    cfg->n_ctx = N_CTX;
    /* a body over the limit: 413 naming "body" */
    cfg->max_body = 2048;
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (fx.srv) {
        char *big = malloc(4096);
        memset(big, ' ', 4095);
        memcpy(big, "{\"prompt\": \"", 12);
        memcpy(big + 4090, "\"}", 2);
        big[4092] = 0;
        expect_error("/completion", big, 413, "body", "larger than 2048");
        free(big);
        tc_server_stop(&fx);
    }
    cfg->max_body = (size_t)1 << 20;
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (!fx.srv) goto done;
    CHECK(g_srv.port > 0);

    test_basic(m);
    test_completion(m);
    test_variants();
    test_kvzip();
    test_composed_method();
    test_dump();
    test_bad_requests();
    test_queue();
    test_drain(fx.srv); /* stops the server */
    fx.srv = NULL;
done:
    tc_fixture_free(&fx);
    printf("architecture %s\n", g_spec.arch);
    return kvs_test_finish("test_server_http");
}
