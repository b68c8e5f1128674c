/*
 * test_server_chunk.c -- the server's default kv_compression (cfg.kv_compression,
 * `kvsieve serve --kv-compression`) and chunked prefill compression
 * (kv_compression.chunk), on a tiny random-weight gemma3 model
 * (tests/backend/tiny_model.c: sliding-window and global layers), the server
 * started in-process on a free loopback port and driven with libcurl.
 *
 * Covers: the default reported by /health and /v1/models, applied to
 * requests without kv_compression (generation and echo/logprobs), a
 * request's own overriding it, a bad default refused at start; chunk >= the
 * prompt equals the unchunked request (generated tokens, kv statistics and
 * log-probs bit for bit); the kept counts of every compression (a property
 * over random prompt lengths, chunks and budgets, for a query-agnostic and a
 * query-aware method, against a simulation of the documented rule: after
 * the chunk ending at `seen`, a compressed layer holds min(rows, budget(seen))
 * rows; a last chunk shorter than the method's query window joins the one
 * before); echo log-probs under chunked compression: finite, bit-identical
 * to the full cache's up to the first chunk's end (nothing was compressed
 * yet) and different after it; refusals naming the field (a method that
 * observes every query, chunk with several variants, chunk 0, kv_spans).
 * Not covered: lm-evaluation-harness itself (tests/lmeval on the real model).
 */
#include "kvs_backend.h"
#include "kvs_server.h"
#include "test_util.h"
#include "backend/tiny_model.h"
#include "server/http_client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <unistd.h>

static tc_server g_srv = {.timeout_s = 120, .log_non_200 = 1}; /* the port set once started */

static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static int rnd(int lo, int hi) { /* [lo, hi] */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (int)(g_rng % (uint64_t)(hi - lo + 1));
}

/* A prompt of n token ids (after BOS 2) as JSON text into buf. */
static void ids_json(char *buf, size_t cap, int n, uint64_t seed) {
    uint64_t st = seed;
    size_t at = (size_t)snprintf(buf, cap, "[2");
    for (int i = 1; i < n && at < cap; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        at += (size_t)snprintf(buf + at, cap - at, ",%d", 10 + (int)((st >> 33) % 250));
    }
    snprintf(buf + at, cap - at, "]");
}

static void expect_400(const char *path, const char *body, const char *field, const char *words) {
    long st;
    cJSON *r = tc_call(&g_srv, "POST", path, body, NULL, &st);
    const cJSON *e = r ? tc_obj(r, "error") : NULL;
    CHECK_MSG(st == 400, "%s: status %ld, want 400", body, st);
    CHECK_MSG(e && !strcmp(tc_str(e, "field"), field), "%s: field %s, want %s", body, e ? tc_str(e, "field") : "-",
              field);
    CHECK_MSG(e && strstr(tc_str(e, "message"), words), "%s: message '%s' lacks '%s'", body,
              e ? tc_str(e, "message") : "-", words);
    cJSON_Delete(r);
}

/* The default (streamingllm ratio 0.5) is reported and applied; a request's own overrides it. */
static void test_default(void) {
    long st;
    cJSON *h = tc_call(&g_srv, "GET", "/health", NULL, NULL, &st);
    CHECK(st == 200 && !strcmp(tc_str(tc_obj(h, "kv_compression"), "method"), "streamingllm"));
    cJSON_Delete(h);
    cJSON *m = tc_call(&g_srv, "GET", "/v1/models", NULL, NULL, &st);
    const cJSON *meta = tc_obj(cJSON_GetArrayItem(tc_obj(m, "data"), 0), "meta");
    CHECK(st == 200 && tc_num(tc_obj(meta, "kv_compression"), "ratio") == 0.5);
    cJSON_Delete(m);
    char ids[4096], body[8192];
    ids_json(ids, sizeof ids, 40, 7);
    snprintf(body, sizeof body, "{\"prompt\": %s, \"n_predict\": 4}", ids);
    cJSON *r = tc_call(&g_srv, "POST", "/completion", body, NULL, &st);
    CHECK(st == 200 && !strcmp(tc_str(tc_obj(r, "kv"), "method"), "streamingllm"));
    CHECK(tc_num(tc_obj(r, "kv"), "tokens_after") < tc_num(tc_obj(r, "kv"), "tokens_before"));
    cJSON_Delete(r);
    snprintf(body, sizeof body, "{\"prompt\": %s, \"n_predict\": 4, \"kv_compression\": {\"method\": \"full\"}}", ids);
    r = tc_call(&g_srv, "POST", "/completion", body, NULL, &st);
    CHECK(st == 200 && !strcmp(tc_str(tc_obj(r, "kv"), "method"), "full"));
    const cJSON *l5 = cJSON_GetArrayItem(tc_obj(tc_obj(r, "kv"), "layers"), 5); /* the global layer: all kept */
    CHECK(tc_num(l5, "tokens_after") == 40 && tc_num(l5, "tokens_before") == 40);
    cJSON_Delete(r);
    /* echo/logprobs (lm-eval's loglikelihood) get it too */
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 1}", ids);
    r = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    const cJSON *kv = tc_obj(cJSON_GetArrayItem(tc_obj(r, "choices"), 0), "kv");
    CHECK(st == 200 && !strcmp(tc_str(kv, "method"), "streamingllm"));
    CHECK(cJSON_GetArraySize(tc_obj(kv, "chunks")) == 1); /* one compression after the prompt */
    cJSON_Delete(r);
}

static int same_doubles(const cJSON *a, const cJSON *b) {
    if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b) || cJSON_GetArraySize(a) < 1) return 0;
    for (int i = 0; i < cJSON_GetArraySize(a); i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i), *y = cJSON_GetArrayItem(b, i);
        if (cJSON_IsNull(x) != cJSON_IsNull(y)) return 0;
        if (!cJSON_IsNull(x) && x->valuedouble != y->valuedouble) return 0;
    }
    return 1;
}

/* chunk >= the prompt is the unchunked request. */
static void test_chunk_whole(void) {
    static const char *const methods[] = {"streamingllm", "snapkv"};
    char ids[4096], body[8192];
    for (int k = 0; k < 2; k++) {
        const int n = 50 + 9 * k;
        ids_json(ids, sizeof ids, n, 100 + (uint64_t)k);
        cJSON *res[3][2];
        for (int c = 0; c < 3; c++) {
            char kc[160];
            const int chunk = c == 0 ? 0 : c == 1 ? n : 100000;
            snprintf(kc, sizeof kc, "{\"method\": \"%s\", \"ratio\": 0.3%s%.0d}", methods[k],
                     chunk ? ", \"chunk\": " : "", chunk);
            long st;
            snprintf(body, sizeof body, "{\"prompt\": %s, \"n_predict\": 6, \"kv_compression\": %s}", ids, kc);
            res[c][0] = tc_call(&g_srv, "POST", "/completion", body, NULL, &st);
            CHECK(st == 200);
            snprintf(body, sizeof body,
                     "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 3, \"max_tokens\": 5, \"kv_compression\": %s}",
                     ids, kc);
            res[c][1] = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
            CHECK(st == 200);
        }
        for (int c = 1; c < 3; c++) {
            char *a = cJSON_PrintUnformatted(tc_obj(res[0][0], "tokens")),
                 *b = cJSON_PrintUnformatted(tc_obj(res[c][0], "tokens"));
            CHECK_MSG(a && b && !strcmp(a, b), "%s chunk case %d: tokens %s vs unchunked %s", methods[k], c, b, a);
            free(a);
            free(b);
            CHECK(tc_num(tc_obj(res[c][0], "kv"), "tokens_after") == tc_num(tc_obj(res[0][0], "kv"), "tokens_after"));
            CHECK(tc_num(tc_obj(res[c][0], "kv"), "bytes_after") == tc_num(tc_obj(res[0][0], "kv"), "bytes_after"));
            const cJSON *l0 = tc_obj(cJSON_GetArrayItem(tc_obj(res[0][1], "choices"), 0), "logprobs");
            const cJSON *lc = tc_obj(cJSON_GetArrayItem(tc_obj(res[c][1], "choices"), 0), "logprobs");
            CHECK_MSG(same_doubles(tc_obj(l0, "token_logprobs"), tc_obj(lc, "token_logprobs")),
                      "%s chunk case %d: log-probs differ from the unchunked request", methods[k], c);
        }
        for (int c = 0; c < 3; c++) {
            cJSON_Delete(res[c][0]);
            cJSON_Delete(res[c][1]);
        }
    }
}

/* The documented rule, simulated: the chunk ends and, per compression, seen / rows before / after. */
static int simulate(int n, int C, double ratio, int tokens, int window, int *out /* [k][3] */) {
    int k = 0, held = 0;
    for (int a = 0, b; a < n; a = b) {
        b = n - a < C ? n : a + C;
        int bud_b = tokens ? tokens : (int)floor(ratio * b);
        if (bud_b > b) bud_b = b;
        if (bud_b < 1) bud_b = 1;
        if (window && b < n) {
            int rows = bud_b + (n - b);
            if ((window < rows ? window : rows) > n - b) b = n;
        }
        int bud = tokens ? tokens : (int)floor(ratio * b);
        if (bud > b) bud = b;
        if (bud < 1) bud = 1;
        held += b - a;
        if (held > bud) {
            out[3 * k] = b;
            out[3 * k + 1] = held;
            out[3 * k + 2] = bud;
            k++;
            held = bud;
        }
    }
    return k;
}

static void test_chunk_property(void) {
    char ids[8192], body[16384];
    int want[3 * 256];
    for (int t = 0; t < 16; t++) {
        const int snap = t % 2, n = rnd(20, 180), window = snap ? rnd(2, 8) : 0;
        const int C = rnd(window > 1 ? window : 1, 40);
        const int use_tokens = t % 4 >= 2, tokens = use_tokens ? rnd(1, 24) : 0;
        const double ratio = use_tokens ? 0 : rnd(5, 80) / 100.0;
        char kc[256];
        if (use_tokens)
            snprintf(kc, sizeof kc, "{\"method\": \"%s\", \"tokens\": %d, \"chunk\": %d%s%.0d%s}",
                     snap ? "snapkv" : "streamingllm", tokens, C, snap ? ", \"params\": {\"window\": " : "", window,
                     snap ? "}" : "");
        else
            snprintf(kc, sizeof kc, "{\"method\": \"%s\", \"ratio\": %.2f, \"chunk\": %d%s%.0d%s}",
                     snap ? "snapkv" : "streamingllm", ratio, C, snap ? ", \"params\": {\"window\": " : "", window,
                     snap ? "}" : "");
        ids_json(ids, sizeof ids, n, 1000 + (uint64_t)t);
        /* generation and scoring run the same rule */
        for (int path = 0; path < 2; path++) {
            long st;
            if (path == 0)
                snprintf(body, sizeof body, "{\"prompt\": %s, \"n_predict\": 2, \"kv_compression\": %s}", ids, kc);
            else
                snprintf(body, sizeof body,
                         "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 0, \"max_tokens\": 1, \"kv_compression\": %s}",
                         ids, kc);
            cJSON *r = tc_call(&g_srv, "POST", path == 0 ? "/completion" : "/v1/completions", body, NULL, &st);
            CHECK_MSG(st == 200, "%s", kc);
            const cJSON *kv = path == 0 ? tc_obj(r, "kv") : tc_obj(cJSON_GetArrayItem(tc_obj(r, "choices"), 0), "kv");
            const cJSON *ch = tc_obj(kv, "chunks");
            const int k = simulate(n, C, ratio, tokens, window, want);
            CHECK_MSG(cJSON_GetArraySize(ch) == k, "n %d, %s: %d compressions, the rule says %d", n, kc,
                      cJSON_GetArraySize(ch), k);
            for (int i = 0; i < k && i < cJSON_GetArraySize(ch); i++) {
                const cJSON *c = cJSON_GetArrayItem(ch, i);
                CHECK_MSG(tc_num(c, "seen") == want[3 * i] && tc_num(c, "rows_before") == want[3 * i + 1] &&
                              tc_num(c, "rows_after") == want[3 * i + 2],
                          "n %d, %s, compression %d: seen %g rows %g -> %g, the rule says %d rows %d -> %d", n, kc, i,
                          tc_num(c, "seen"), tc_num(c, "rows_before"), tc_num(c, "rows_after"), want[3 * i],
                          want[3 * i + 1], want[3 * i + 2]);
            }
            if (path == 0) { /* the global layer (5) holds what the last compression kept, of n before */
                const cJSON *l5 = cJSON_GetArrayItem(tc_obj(kv, "layers"), 5);
                CHECK(tc_num(l5, "tokens_before") == n);
                CHECK(k == 0 || tc_num(l5, "tokens_after") == want[3 * (k - 1) + 2]);
            }
            cJSON_Delete(r);
        }
    }
}

/* Echo log-probs under chunked compression: finite; equal to the full cache's through the first chunk. */
static void test_chunk_logprobs(void) {
    char ids[4096], body[8192];
    const int n = 90, C = 16;
    ids_json(ids, sizeof ids, n, 4242);
    long st;
    snprintf(body, sizeof body,
             "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 1, \"kv_compression\": "
             "{\"method\": \"full\"}}", ids);
    cJSON *full = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    snprintf(body, sizeof body,
             "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 1, \"kv_compression\": "
             "{\"method\": \"streamingllm\", \"ratio\": 0.25, \"chunk\": %d, \"params\": {\"sinks\": 2}}}", ids, C);
    cJSON *chk = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    const cJSON *a = tc_obj(tc_obj(cJSON_GetArrayItem(tc_obj(full, "choices"), 0), "logprobs"), "token_logprobs");
    const cJSON *b = tc_obj(tc_obj(cJSON_GetArrayItem(tc_obj(chk, "choices"), 0), "logprobs"), "token_logprobs");
    CHECK_EQ_INT(cJSON_GetArraySize(a), n + 1);
    CHECK_EQ_INT(cJSON_GetArraySize(b), n + 1);
    int differ = 0, finite = 1, same_first = 1;
    for (int i = 1; i < n && i < cJSON_GetArraySize(b); i++) {
        double x = cJSON_GetArrayItem(a, i)->valuedouble, y = cJSON_GetArrayItem(b, i)->valuedouble;
        finite &= isfinite(y) && y <= 0;
        if (i <= C) same_first &= x == y; /* positions 1..C: nothing compressed yet */
        else differ += x != y;
    }
    CHECK(finite);
    CHECK(same_first);
    CHECK_MSG(differ > (n - C) / 2, "only %d of %d positions after the first chunk differ from the full cache", differ,
              n - C);
    cJSON_Delete(full);
    cJSON_Delete(chk);
}

static void test_refusals(void) {
    char ids[2048], body[4096];
    ids_json(ids, sizeof ids, 60, 5);
    snprintf(body, sizeof body, "{\"prompt\": %s, \"n_predict\": 2, \"kv_compression\": {\"method\": \"h2o\", "
             "\"ratio\": 0.3, \"chunk\": 16}}", ids);
    expect_400("/completion", body, "kv_compression", "cannot be chunked");
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 1, "
             "\"kv_compression\": {\"method\": \"snapkv\", \"ratio\": 0.3, \"chunk\": 8}}", ids);
    expect_400("/v1/completions", body, "kv_compression", "use chunk >= 32");
    snprintf(body, sizeof body, "{\"prompt\": %s, \"kv_compression\": {\"variants\": [{\"method\": \"streamingllm\", "
             "\"ratio\": 0.3, \"chunk\": 16}]}}", ids);
    expect_400("/completion", body, "kv_compression.variants[0]", "one variant per request");
    snprintf(body, sizeof body, "{\"prompt\": %s, \"kv_compression\": {\"method\": \"streamingllm\", "
             "\"ratio\": 0.3, \"chunk\": 0}}", ids);
    expect_400("/completion", body, "kv_compression.chunk", "chunk");
    expect_400("/completion", "{\"prompt\": \"the cat is\", \"kv_spans\": [{\"start\": 0, \"end\": 3}], "
               "\"kv_compression\": {\"method\": \"streamingllm\", \"ratio\": 0.5, \"chunk\": 2}}",
               "kv_spans", "chunk");
}

int main(void) {
    kvs_err err_ = {0}, *err = &err_;
    tc_fixture fx;
    CHECK_OK(tc_fixture_init(&fx, "kvs-server-chunk", "gemma3", err), err);
    CHECK_OK(tc_fixture_load(&fx, err), err);
    kvs_model *m = fx.model;
    if (!m) goto done;
    fx.cfg.slots = 2;
    fx.cfg.n_ctx = 256;
    /* a bad default is refused at start, naming the field */
    fx.cfg.kv_compression = "{\"method\": \"streamingllm\", \"ratio\": 0.5, \"chunk\": -1}";
    CHECK_FAILS(kvs_server_start(m, &fx.cfg, &fx.srv, err), KVS_ERR_INVALID, err, "kv_compression.chunk");
    fx.cfg.kv_compression = "{\"method\": \"nosuch\", \"ratio\": 0.5}";
    CHECK_FAILS(kvs_server_start(m, &fx.cfg, &fx.srv, err), KVS_ERR_INVALID, err, "kv_compression.method");
    fx.cfg.kv_compression = "{\"method\": \"streamingllm\"";
    CHECK_FAILS(kvs_server_start(m, &fx.cfg, &fx.srv, err), KVS_ERR_INVALID, err, "not valid JSON");
    fx.cfg.kv_compression = "{\"method\": \"streamingllm\", \"ratio\": 0.5}";
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (!fx.srv) goto done;
    test_default();
    test_chunk_whole();
    test_chunk_property();
    test_chunk_logprobs();
    test_refusals();
done:
    tc_fixture_free(&fx);
    return kvs_test_finish("test_server_chunk");
}
