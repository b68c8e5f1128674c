/*
 * test_server_settings.c -- both settings of a sample in one request
 * (kv_compression's per-variant compress_suffix) and variants whose caches
 * are identical decoded once (same_as), on tiny random-weight models
 * (tests/backend/tiny_model.c; argv[1] the architecture: llama has only
 * global layers, gemma3 sliding-window ones too), the server in-process on a
 * free loopback port, driven with libcurl.
 *
 * Covers: a request whose variants mix query-agnostic (suffix after the
 * compression) and query-aware (compress_suffix: the suffix prefilled before
 * it) gives, variant by variant, the generated tokens and per-layer kept rows
 * of today's two requests (the query-aware prompt with the suffix in it, the
 * query-agnostic one with the suffix after), for methods that read a window
 * of queries (snapkv), every query (h2o), none (streamingllm, tova's last
 * query) and full; with a suffix of more than 64 tokens (the extension runs
 * through the prefill kernels) bit for bit, with a short one (the decode
 * kernels) the kept rows; timings.prompt_n of a query-aware variant counts
 * the suffix, kv.note says it was tokenized apart from a token-id prompt;
 * same_as: full at several ratios, a repeated method and budget, each with
 * its own kv statistics and the first one's output; refusals (compress_suffix
 * with chunk, not a boolean) naming the field; with ignore_eos every variant
 * of such a request (snapkv, adakv, lookm, h2o, think, kvzip, full) decodes exactly
 * n_predict tokens in its session sized kept + suffix + n_predict, the
 * tokens it decodes requested alone. The engine call underneath
 * (kvs_session_extend_prompt): prefill P, extend the prompt by Q plans byte
 * for byte as one prefill of P + Q (snapkv's window, h2o's every query, tova,
 * streamingllm) and decodes the same greedy tokens, with Q through the
 * prefill kernels (> 64 tokens) and the decode kernels; refused once
 * something was decoded after the prompt.
 * Not covered: the real models (docs/performance.md gives the leaderboard
 * slice measured before and after).
 */
#include "kvs_backend.h"
#include "kvs_server.h"
#include "test_util.h"
#include "backend/tiny_model.h"
#include "server/http_client.h"
#include "server_internal.h"

#include "kvsieve_methods.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <unistd.h>

static tc_server g_srv = {.timeout_s = 120, .log_non_200 = 1}; /* the port set once started */

/* A prompt of n token ids (after BOS 2) as JSON text into buf, no brackets. */
static void ids_text(char *buf, size_t cap, int n, uint64_t seed) {
    uint64_t st = seed;
    size_t at = (size_t)snprintf(buf, cap, "2");
    for (int i = 1; i < n && at < cap; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        at += (size_t)snprintf(buf + at, cap - at, ",%d", 10 + (int)((st >> 33) % 250));
    }
}

static char *print(const cJSON *j) { return j ? cJSON_PrintUnformatted(j) : NULL; }

/* The per-layer tokens_after of a variant's kv as JSON text (malloc'd). */
static char *kept_rows(const cJSON *v) {
    cJSON *a = cJSON_CreateArray();
    const cJSON *l;
    cJSON_ArrayForEach(l, tc_obj(tc_obj(v, "kv"), "layers"))
        cJSON_AddItemToArray(a, cJSON_CreateNumber(tc_num(l, "tokens_after")));
    char *t = print(a);
    cJSON_Delete(a);
    return t;
}

static const char *const VARS[] = {
    "{\"method\": \"full\"}",
    "{\"method\": \"snapkv\", \"ratio\": 0.5, \"params\": {\"window\": 8}}",
    "{\"method\": \"h2o\", \"ratio\": 0.4}",
    "{\"method\": \"tova\", \"ratio\": 0.3}",
    "{\"method\": \"streamingllm\", \"ratio\": 0.3}",
};
enum { NV = (int)(sizeof VARS / sizeof VARS[0]) };

/* Both settings in one request against today's two requests. */
static void test_settings(int n_suffix_words, int exact) {
    char ids[4096], sfx[2048], body[32768], kv[16384];
    ids_text(ids, sizeof ids, 90, 7 + (uint64_t)n_suffix_words);
    size_t at = 0;
    for (int i = 0; i < n_suffix_words; i++) at += (size_t)snprintf(sfx + at, sizeof sfx - at, "%sab", i ? " " : "");
    /* the suffix's tokens, as the server tokenizes a suffix (no BOS) */
    long st;
    snprintf(body, sizeof body, "{\"content\": \"%s\", \"add_special\": false}", sfx);
    cJSON *tk = tc_call(&g_srv, "POST", "/tokenize", body, NULL, &st);
    CHECK(st == 200);
    char *qt = print(tc_obj(tk, "tokens"));
    const int nq = cJSON_GetArraySize(tc_obj(tk, "tokens"));
    CHECK(qt && nq > 0);
    if (!qt || nq <= 0) goto out;
    /* today: the query-aware request (suffix inside the prompt), the query-agnostic one */
    at = (size_t)snprintf(kv, sizeof kv, "[");
    for (int i = 0; i < NV; i++) at += (size_t)snprintf(kv + at, sizeof kv - at, "%s%s", i ? "," : "", VARS[i]);
    snprintf(kv + at, sizeof kv - at, "]");
    snprintf(body, sizeof body, "{\"prompt\": [%s,%.*s], \"max_tokens\": 12, \"kv_compression\": %s}", ids,
             (int)strlen(qt) - 2, qt + 1, kv);
    cJSON *aware = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    at = (size_t)snprintf(kv, sizeof kv, "[");
    for (int i = 0; i < NV; i++)
        at += (size_t)snprintf(kv + at, sizeof kv - at, "%s%.*s, \"suffix\": \"%s\"}", i ? "," : "",
                               (int)strlen(VARS[i]) - 1, VARS[i], sfx);
    snprintf(kv + at, sizeof kv - at, "]");
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"max_tokens\": 12, \"kv_compression\": %s}", ids, kv);
    cJSON *agn = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    /* one request: agnostic variants, then aware ones */
    at = (size_t)snprintf(kv, sizeof kv, "[");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NV; i++)
            at += (size_t)snprintf(kv + at, sizeof kv - at, "%s%.*s, \"suffix\": \"%s\"%s}", k + i ? "," : "",
                                   (int)strlen(VARS[i]) - 1, VARS[i], sfx, k ? ", \"compress_suffix\": true" : "");
    snprintf(kv + at, sizeof kv - at, "]");
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"max_tokens\": 12, \"kv_compression\": %s}", ids, kv);
    cJSON *both = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    const cJSON *vb = tc_obj(both, "variants");
    for (int k = 0; k < 2 && vb; k++)
        for (int i = 0; i < NV; i++) {
            const cJSON *today = cJSON_GetArrayItem(tc_obj(k ? aware : agn, "variants"), i);
            const cJSON *one = cJSON_GetArrayItem(vb, k * NV + i);
            char *ta = print(tc_obj(today, "tokens")), *tb = print(tc_obj(one, "tokens"));
            char *ra = kept_rows(today), *rb = kept_rows(one);
            CHECK_MSG(ra && rb && !strcmp(ra, rb), "%s %s (suffix %d tokens): kept rows %s, today %s", VARS[i],
                      k ? "query-aware" : "query-agnostic", nq, rb, ra);
            if (exact || !k)
                CHECK_MSG(ta && tb && !strcmp(ta, tb), "%s %s (suffix %d tokens): tokens %s, today %s", VARS[i],
                          k ? "query-aware" : "query-agnostic", nq, tb, ta);
            CHECK(tc_num(tc_obj(one, "kv"), "n_prompt") == tc_num(tc_obj(today, "kv"), "n_prompt"));
            CHECK(tc_num(tc_obj(one, "timings"), "prompt_n") == tc_num(tc_obj(today, "timings"), "prompt_n"));
            CHECK(k == 0 || strstr(tc_str(tc_obj(one, "kv"), "note"), "tokenized apart"));
            free(ta);
            free(tb);
            free(ra);
            free(rb);
        }
    /* one variant alone extends the prefill itself: the same as its place in the list */
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"max_tokens\": 12, \"kv_compression\": {\"method\": \"snapkv\", "
             "\"ratio\": 0.5, \"params\": {\"window\": 8}, \"suffix\": \"%s\", \"compress_suffix\": true}}", ids, sfx);
    cJSON *alone = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    const cJSON *c0 = cJSON_GetArrayItem(tc_obj(alone, "choices"), 0);
    CHECK(vb && c0 && !strcmp(tc_str(c0, "text"), tc_str(cJSON_GetArrayItem(vb, NV + 1), "content")));
    CHECK(tc_num(tc_obj(alone, "timings"), "prompt_n") == 90 + nq);
    CHECK(tc_num(tc_obj(alone, "kv"), "tokens_after") ==
          tc_num(tc_obj(cJSON_GetArrayItem(vb, NV + 1), "kv"), "tokens_after"));
    cJSON_Delete(alone);
    cJSON_Delete(aware);
    cJSON_Delete(agn);
    cJSON_Delete(both);
out:
    free(qt);
    cJSON_Delete(tk);
}

/* Identical caches decode once: full at several ratios, a repeated method and budget. */
static void test_same_as(void) {
    char ids[4096], body[8192];
    ids_text(ids, sizeof ids, 70, 99);
    snprintf(body, sizeof body,
             "{\"prompt\": [%s], \"max_tokens\": 10, \"kv_compression\": ["
             "{\"method\": \"full\"}, {\"method\": \"snapkv\", \"ratio\": 0.5, \"name\": \"a\"},"
             "{\"method\": \"full\", \"ratio\": 0.5}, {\"method\": \"snapkv\", \"ratio\": 0.5, \"name\": \"b\"},"
             "{\"method\": \"snapkv\", \"ratio\": 0.25}, {\"method\": \"full\", \"suffix\": \"ab ab\"},"
             "{\"method\": \"full\", \"ratio\": 0.25, \"suffix\": \"ab ab\"}]}",
             ids);
    long st;
    cJSON *r = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    CHECK(st == 200);
    const cJSON *v = tc_obj(r, "variants");
    static const int want[] = {-1, -1, 0, 1, -1, -1, 5};
    for (int i = 0; i < 7 && v; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i), *sa = tc_obj(x, "same_as");
        const int got = cJSON_IsNumber(sa) ? sa->valueint : -1;
        CHECK_MSG(got == want[i] && (got >= 0 || cJSON_IsNull(sa)), "variant %d: same_as %d, want %d", i, got, want[i]);
        if (want[i] < 0) continue;
        const cJSON *p = cJSON_GetArrayItem(v, want[i]);
        char *a = print(tc_obj(x, "tokens")), *b = print(tc_obj(p, "tokens"));
        CHECK(a && b && !strcmp(a, b) && !strcmp(tc_str(x, "content"), tc_str(p, "content")));
        free(a);
        free(b);
        CHECK(tc_num(tc_obj(x, "kv"), "tokens_after") == tc_num(tc_obj(p, "kv"), "tokens_after"));
        CHECK(tc_num(tc_obj(x, "kv"), "compress_ms") >= 0);
    }
    /* what a variant alone decodes: the alias's output is its own */
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"max_tokens\": 10, \"kv_compression\": "
             "{\"method\": \"snapkv\", \"ratio\": 0.5}}", ids);
    cJSON *alone = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    const cJSON *c0 = cJSON_GetArrayItem(tc_obj(alone, "choices"), 0);
    CHECK(v && c0 && !strcmp(tc_str(c0, "text"), tc_str(cJSON_GetArrayItem(v, 3), "content")));
    cJSON_Delete(alone);
    cJSON_Delete(r);
}

/* A variant's session holds its kept rows plus room for its suffix and answer only (sched.c): with
 * ignore_eos every variant of a request, query-agnostic and query-aware, decodes exactly n_predict tokens
 * (stop_type "limit") and each gives what it gives requested alone (one session of the whole context). */
static void test_decode_to_limit(int n_predict) {
    static const char *const M[] = {"full", "snapkv", "adakv", "lookm", "h2o", "think", "kvzip"};
    enum { NM = (int)(sizeof M / sizeof M[0]) };
    char ids[4096], kv[8192], body[16384];
    ids_text(ids, sizeof ids, 80, 5);
    size_t at = (size_t)snprintf(kv, sizeof kv, "[");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NM; i++)
            at += (size_t)snprintf(kv + at, sizeof kv - at,
                                   "%s{\"method\": \"%s\", \"ratio\": 0.4, \"suffix\": \"ab ab ab\"%s}",
                                   k + i ? "," : "", M[i], k ? ", \"compress_suffix\": true" : "");
    snprintf(kv + at, sizeof kv - at, "]");
    snprintf(body, sizeof body, "{\"prompt\": [%s], \"n_predict\": %d, \"ignore_eos\": true, \"kv_compression\": %s}",
             ids, n_predict, kv);
    long st;
    cJSON *r = tc_call(&g_srv, "POST", "/completion", body, NULL, &st);
    CHECK(st == 200);
    const cJSON *v = tc_obj(r, "variants");
    CHECK(cJSON_GetArraySize(v) == 2 * NM);
    for (int k = 0; k < 2 && v; k++)
        for (int i = 0; i < NM; i++) {
            const cJSON *x = cJSON_GetArrayItem(v, k * NM + i);
            /* think keeps snapkv's rows with pruned key channels: a different cache, never an alias of it */
            if (!strcmp(M[i], "think")) CHECK_MSG(cJSON_IsNull(cJSON_GetObjectItem(x, "same_as")), "think aliased");
            CHECK_MSG(cJSON_GetArraySize(tc_obj(x, "tokens")) == n_predict && !strcmp(tc_str(x, "stop_type"), "limit"),
                      "%s%s: %d tokens (%s), want %d", M[i], k ? " query-aware" : "", cJSON_GetArraySize(tc_obj(x, "tokens")),
                      tc_str(x, "stop_type"), n_predict);
            snprintf(body, sizeof body,
                     "{\"prompt\": [%s], \"n_predict\": %d, \"ignore_eos\": true, \"kv_compression\": {\"method\": "
                     "\"%s\", \"ratio\": 0.4, \"suffix\": \"ab ab ab\"%s}}",
                     ids, n_predict, M[i], k ? ", \"compress_suffix\": true" : "");
            cJSON *alone = tc_call(&g_srv, "POST", "/completion", body, NULL, &st);
            CHECK(st == 200);
            char *a = print(tc_obj(x, "tokens")), *b = print(tc_obj(alone, "tokens"));
            CHECK_MSG(a && b && !strcmp(a, b), "%s%s: tokens %s, alone %s", M[i], k ? " query-aware" : "", a, b);
            free(a);
            free(b);
            cJSON_Delete(alone);
        }
    cJSON_Delete(r);
}

/* Byte for byte the same plan (kept rows of every layer and head, merge). */
static int plans_equal(const kvs_plan *a, const kvs_plan *b) {
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads || a->n_tokens != b->n_tokens || a->merge != b->merge)
        return 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv_heads; h++) {
            int na, nb;
            const int32_t *ra = kvs_plan_head(a, l, h, &na), *rb = kvs_plan_head(b, l, h, &nb);
            if (na != nb || memcmp(ra, rb, sizeof(int32_t) * (size_t)na)) return 0;
        }
    return 1;
}

/* The engine side (kvs_session_extend_prompt): a prefill of P then the prompt extended by Q plans as one
 * prefill of P + Q does (window, all-query and query-free methods), the extension's logits and the
 * greedy tokens after are the same, for a Q of `nq` tokens. */
static void test_extend_prompt(kvs_model *m, int np, int nq) {
    kvs_err err = {0};
    int32_t toks[512];
    uint64_t st = 1234 + (uint64_t)nq;
    toks[0] = 2;
    for (int i = 1; i < np + nq; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        toks[i] = 10 + (int)((st >> 33) % 250);
    }
    static const char *const methods[][2] = {{"snapkv", "window=8"}, {"h2o", NULL}, {"tova", NULL}, {"streamingllm", NULL}};
    const int V = kvs_model_get_info(m)->n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    for (int k = 0; k < 4 && la && lb; k++) {
        const kvs_method *me = kvs_method_find(methods[k][0]);
        kvs_compress_opts co;
        memset(&co, 0, sizeof co);
        co.method = me;
        kvs_params_defaults(me, &co.params);
        if (methods[k][1]) CHECK_OK(kvs_params_set_kv(me, &co.params, methods[k][1], &err), &err);
        co.budget.ratio = 0.4;
        const int need = kvs_method_queries_needed(me, &co.params, np + nq);
        kvs_session_opts so;
        memset(&so, 0, sizeof so);
        so.n_ctx = 256;
        so.n_threads = 1;
        kvs_session *a = NULL, *b = NULL;
        so.record_queries = need >= np + nq ? -1 : need;
        CHECK_OK(kvs_session_new(m, &so, &a, &err), &err);
        /* as the server records for compress_suffix: what the window needs before Q, at least one */
        so.record_queries = need >= np + nq ? -1 : need - nq > 1 ? need - nq : 1;
        CHECK_OK(kvs_session_new(m, &so, &b, &err), &err);
        if (!a || !b) break;
        CHECK_OK(kvs_session_prefill(a, toks, np + nq, NULL, la, &err), &err);
        CHECK_OK(kvs_session_prefill(b, toks, np, NULL, NULL, &err), &err);
        CHECK_OK(kvs_session_extend_prompt(b, toks + np, nq, lb, &err), &err);
        CHECK(kvs_session_n_past(b) == np + nq);
        kvs_plan pa, pb;
        int ma[KVS_MAX_LAYERS], mb[KVS_MAX_LAYERS];
        CHECK_OK(kvs_session_plan_many(a, &co, &co.budget, 1, &pa, ma, NULL, &err), &err);
        CHECK_OK(kvs_session_plan_many(b, &co, &co.budget, 1, &pb, mb, NULL, &err), &err);
        CHECK_MSG(plans_equal(&pa, &pb) && !memcmp(ma, mb, sizeof(int) * (size_t)pa.n_layers),
                  "%s, prompt %d + %d: the plan after extend_prompt differs from one prefill's", methods[k][0], np, nq);
        CHECK_OK(kvs_session_compress_with(a, &pa, ma, NULL, &err), &err);
        CHECK_OK(kvs_session_compress_with(b, &pb, mb, NULL, &err), &err);
        /* greedy: 8 tokens each */
        int same = 1;
        for (int t = 0; t < 8; t++) {
            int ia = 0, ib = 0;
            for (int v = 1; v < V; v++) {
                if (la[v] > la[ia]) ia = v;
                if (lb[v] > lb[ib]) ib = v;
            }
            same &= ia == ib;
            CHECK_OK(kvs_session_decode(a, ia, la, &err), &err);
            CHECK_OK(kvs_session_decode(b, ib, lb, &err), &err);
        }
        CHECK_MSG(same, "%s, prompt %d + %d: greedy tokens differ", methods[k][0], np, nq);
        kvs_plan_free(&pa);
        kvs_plan_free(&pb);
        kvs_session_free(a);
        kvs_session_free(b);
    }
    free(la);
    free(lb);
    /* refused on a session holding more than its prompt */
    kvs_session_opts so;
    memset(&so, 0, sizeof so);
    so.n_ctx = 256;
    kvs_session *c = NULL;
    CHECK_OK(kvs_session_new(m, &so, &c, &err), &err);
    if (!c) return;
    CHECK_OK(kvs_session_prefill(c, toks, np, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_decode(c, 11, NULL, &err), &err);
    CHECK_FAILS(kvs_session_extend_prompt(c, toks, 3, NULL, &err), KVS_ERR_INVALID, &err, "nothing after it");
    kvs_session_free(c);
}

static void expect_400(const char *body, const char *field) {
    long st;
    cJSON *r = tc_call(&g_srv, "POST", "/v1/completions", body, NULL, &st);
    const cJSON *e = r ? tc_obj(r, "error") : NULL;
    CHECK_MSG(st == 400 && e && !strcmp(tc_str(e, "field"), field), "%s: status %ld, field %s, want %s", body, st,
              e ? tc_str(e, "field") : "-", field);
    cJSON_Delete(r);
}

/* srv_plans_same on hand-made plans: equal rows alias; ThinK's key-channel masks (present or not, or
 * different) do not: the caches they give differ. */
static void test_plans_same_kchan(void) {
    kvs_err err = {0};
    kvs_plan pl[3];
    int budgets[2] = {2, 2};
    unsigned char planned[3] = {1, 1, 1};
    int maps[3 * KVS_MAX_LAYERS] = {0};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(kvs_plan_init(&pl[i], "t", 2, 2, 5, budgets, &err), &err);
        for (int l = 0; l < 2; l++) {
            static const int32_t rows[4] = {0, 3, 1, 4}; /* [Hkv][budget] */
            for (int k = 0; k < 4; k++) pl[i].layers[l].idx[k] = rows[k];
            maps[i * KVS_MAX_LAYERS + l] = l;
        }
    }
    srv_plans P = {3, pl, maps, NULL, planned};
    CHECK(srv_plans_same(&P, 0, 1));
    CHECK_OK(kvs_plan_kchan_init(&pl[1], 4, &err), &err); /* all channels kept, but masks present */
    CHECK_OK(kvs_plan_kchan_init(&pl[2], 4, &err), &err);
    CHECK(!srv_plans_same(&P, 0, 1));
    CHECK(srv_plans_same(&P, 1, 2));
    pl[2].kchan[5] = 0; /* layer 0, head 1, channel 1 pruned */
    CHECK(!srv_plans_same(&P, 1, 2));
    for (int i = 0; i < 3; i++) kvs_plan_free(&pl[i]);
}

int main(int argc, char **argv) {
    kvs_err err_ = {0}, *err = &err_;
    test_plans_same_kchan();
    const char *arch = argc > 1 ? argv[1] : "llama";
    tc_fixture fx;
    CHECK_OK(tc_fixture_init(&fx, "kvs-server-settings", arch, err), err);
    CHECK_OK(tc_fixture_load(&fx, err), err);
    kvs_model *m = fx.model;
    if (!m) goto done;
    fx.cfg.slots = 2;
    fx.cfg.n_ctx = 256;
    CHECK_OK(tc_server_start(&fx, &g_srv, err), err);
    if (!fx.srv) goto done;
    test_settings(70, 1); /* > 64 tokens: the extension runs through the prefill kernels */
    test_settings(12, 1); /* the decode kernels: here the same tokens too (equal up to rounding in general) */
    test_same_as();
    test_decode_to_limit(40);
    test_extend_prompt(m, 90, 70); /* > 64: the prefill kernels */
    test_extend_prompt(m, 90, 20); /* the decode kernels */
    expect_400("{\"prompt\": [2, 11, 12], \"kv_compression\": {\"method\": \"streamingllm\", \"ratio\": 0.5, "
               "\"chunk\": 2, \"suffix\": \"ab\", \"compress_suffix\": true}}",
               "kv_compression.compress_suffix");
    expect_400("{\"prompt\": [2, 11, 12], \"kv_compression\": [{\"method\": \"full\", \"compress_suffix\": 1}]}",
               "kv_compression[0].compress_suffix");
done:
    tc_fixture_free(&fx);
    return kvs_test_finish("test_server_settings");
}
