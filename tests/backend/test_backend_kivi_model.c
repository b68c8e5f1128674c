/*
 * test_backend_kivi_model.c -- greedy decoding with kivi4 and kivi2 KV caches
 * against the f16 cache on a real model (argv[1], default "smollm2-135m";
 * exit 77 = SKIPPED when it is not installed): ten prompts (short facts, a
 * story, a list, code, questions and a 150-token passage with a question), 16
 * greedy tokens each, the full cache and SnapKV at 0.25. G = 32 and R = 32
 * (KIVI's R = 128 would leave these short prompts wholly in the fp16 window).
 *
 * Prints per cache type how many generated tokens differ from f16's at the
 * same position, how many continuations are identical and where the first
 * difference lies on average. Checks only what must hold: every run
 * completes, every logit is finite, and the stats' bytes equal the layout's
 * count (per KV head: codes, fp16 scales and zeros, the fp16 window) for the
 * rows each layer holds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"

static const char *PROMPTS[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "Here is a list of the planets of the solar system: Mercury,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: What is the boiling point of water at sea level in degrees Celsius?\nAnswer:",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Translate to French: Good morning, how are you?\nFrench:",
    "The lighthouse keeper wrote in his log every evening. On the first of March the wind came from the north and "
    "the fishing boats stayed in the harbour. His daughter Mara repaired the nets while the old dog slept by the "
    "stove. The supply ship brought flour, lamp oil, three letters and a crate of oranges from the south. Mara "
    "counted the oranges twice: there were forty-two. In April the storms ended and the keeper painted the tower "
    "white again. Question: how many oranges did the supply ship bring? Answer:",
    "1, 2, 3, 5, 8, 13, 21,",
};
enum { NP = sizeof PROMPTS / sizeof PROMPTS[0], GEN = 16, G = 32, R = 32 };

/* Bytes of one KV head holding T tokens (flushed store), from the layout. */
static int64_t head_bytes(int T, int d, int kb, int vb) {
    const int64_t kq = (int64_t)R * (T / R), vq = T > R ? T - R : 0, groups = (d + G - 1) / G;
    return kq / G * ((d * G * kb + 7) / 8) + kq / G * d * 4 + vq * ((d * vb + 7) / 8) + vq * groups * 4 +
           (T - kq + T - vq) * d * 2;
}

/* Greedy continuation of GEN tokens; method NULL: full cache. Returns 0 on error. */
static int generate(kvs_model *m, int ctype, const char *prompt, const char *method, int32_t *out, int *bad,
                    kvs_err *err) {
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab;
    int32_t *toks = NULL;
    int nt = 0, ok = 0;
    float *lg = malloc((size_t)V * sizeof *lg);
    kvs_session *s = NULL;
    if (!lg || kvs_tokenize(m, prompt, strlen(prompt), 1, 0, &toks, &nt, err) != KVS_OK) goto done;
    kvs_session_opts so = {nt + GEN + 1, 2, method ? -1 : 0, ctype, 0};
    if (kvs_session_new(m, &so, &s, err) != KVS_OK) goto done;
    if (ctype != KVS_CACHE_F16 && kvs_session_set_kivi(s, G, R, err) != KVS_OK) goto done;
    if (kvs_session_prefill(s, toks, nt, NULL, lg, err) != KVS_OK) goto done;
    kvs_kv_stats st;
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = method ? kvs_method_find(method) : NULL;
    if (co.method) kvs_params_defaults(co.method, &co.params);
    co.budget.ratio = 0.25;
    if (kvs_session_compress(s, &co, &st, err) != KVS_OK) goto done;
    if (ctype != KVS_CACHE_F16) {
        const int kb = ctype == KVS_CACHE_KIVI2 ? 2 : 4;
        int64_t want = 0;
        for (int l = 0; l < st.n_layers; l++) /* snapkv keeps equal counts per head */
            want += I->n_kv_heads * head_bytes((int)st.tokens_after[l], I->head_dim, kb, kb);
        CHECK_EQ_INT(st.bytes_after_total, want);
    }
    for (int g = 0; g < GEN; g++) {
        for (int i = 0; i < V; i++) *bad += !isfinite(lg[i]);
        int t = kvs_argmax(lg, V);
        *bad += t < 0 || t >= V;
        out[g] = t < 0 ? 0 : t;
        if (kvs_session_decode(s, out[g], lg, err) != KVS_OK) goto done;
    }
    ok = 1;
done:
    free(toks);
    free(lg);
    kvs_session_free(s);
    return ok;
}

int main(int argc, char **argv) {
    kvs_err err = {0};
    char path[1024];
    const char *name = argc > 1 ? argv[1] : "smollm2-135m";
    if (kvs_model_resolve(name, path, sizeof path, &err) != KVS_OK) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return kvs_test_finish("backend_kivi_model");
    const kvs_model_info *I = kvs_model_get_info(m);
    static const int types[2] = {KVS_CACHE_KIVI4, KVS_CACHE_KIVI2};
    static const char *methods[2] = {NULL, "snapkv"};
    int32_t ref[2][NP][GEN], got[GEN];
    int ok16[2][NP], bad = 0;
    printf("%s (%s, head_dim %d): %d prompts x %d greedy tokens, G %d, R %d; tokens differing from the f16 "
           "cache's\n", I->name, I->arch, I->head_dim, NP, GEN, G, R);
    for (int mi = 0; mi < 2; mi++)
        for (int p = 0; p < NP; p++) {
            ok16[mi][p] = generate(m, KVS_CACHE_F16, PROMPTS[p], methods[mi], ref[mi][p], &bad, &err);
            CHECK_MSG(ok16[mi][p], "prompt %d f16: %s", p, err.msg);
        }
    for (int mi = 0; mi < 2; mi++)
        for (int ti = 0; ti < 2; ti++) {
            int differ = 0, same_runs = 0, first_sum = 0;
            for (int p = 0; p < NP; p++) {
                if (!ok16[mi][p] || !generate(m, types[ti], PROMPTS[p], methods[mi], got, &bad, &err)) {
                    CHECK_MSG(0, "prompt %d %s: %s", p, kvs_cache_type_name(types[ti]), err.msg);
                    continue;
                }
                int d = 0, first = GEN;
                for (int g = 0; g < GEN; g++)
                    if (got[g] != ref[mi][p][g]) {
                        d++;
                        if (first == GEN) first = g;
                    }
                differ += d;
                same_runs += d == 0;
                first_sum += first;
            }
            printf("  %-6s %-5s: %4d of %d tokens differ (%.1f%% agree), %d of %d continuations identical, first "
                   "difference at token %.1f on average\n",
                   methods[mi] ? "snapkv" : "full", kvs_cache_type_name(types[ti]), differ, NP * GEN,
                   100.0 * (1.0 - (double)differ / (NP * GEN)), same_runs, NP, (double)first_sum / NP);
        }
    CHECK_MSG(bad == 0, "%d non-finite logits or out-of-range tokens", bad);
    kvs_model_free(m);
    return kvs_test_finish("backend_kivi_model");
}
