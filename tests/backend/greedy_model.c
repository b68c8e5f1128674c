/*
 * greedy_model.c -- the shared prompts, greedy loop and tally of the
 * real-model cache-type tests (greedy_model.h).
 */
#include "greedy_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve_methods.h"

const char *const GM_PROMPTS[GM_NP] = {
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

kvs_model *gm_model_load(int argc, char **argv, const char *def, int *skip, kvs_err *err) {
    char path[1024];
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    *skip = 0;
    if (kvs_model_resolve(argc > 1 ? argv[1] : def, path, sizeof path, err) != KVS_OK) {
        *skip = 1;
        return NULL;
    }
    if (kvs_model_load(path, &mo, &m, err) != KVS_OK) return NULL;
    return m;
}

int gm_generate(kvs_model *m, const gm_run *r, const char *prompt, int32_t *out, kvs_kv_stats *st, int *bad,
                kvs_err *err) {
    const int V = kvs_model_get_info(m)->n_vocab;
    const int kivi = r->ctype == KVS_CACHE_KIVI4 || r->ctype == KVS_CACHE_KIVI2;
    int32_t *toks = NULL;
    int nt = 0, ok = 0;
    float *lg = malloc((size_t)V * sizeof *lg);
    kvs_session *s = NULL;
    if (!lg || kvs_tokenize(m, prompt, strlen(prompt), 1, 0, &toks, &nt, err) != KVS_OK) goto done;
    kvs_session_opts so = {nt + r->gen + 1, 2, r->method ? -1 : 0, r->ctype, 0};
    if (kvs_session_new(m, &so, &s, err) != KVS_OK) goto done;
    if (kivi && kvs_session_set_kivi(s, r->kivi_g, r->kivi_r, err) != KVS_OK) goto done;
    if (kvs_session_prefill(s, toks, nt, NULL, lg, err) != KVS_OK) goto done;
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = r->method ? kvs_method_find(r->method) : NULL;
    if (co.method) kvs_params_defaults(co.method, &co.params);
    co.budget.ratio = r->ratio;
    if (kvs_session_compress(s, &co, st, err) != KVS_OK) goto done;
    for (int g = 0; g < r->gen; g++) {
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

void gm_tally_add(gm_tally *t, const int32_t *got, const int32_t *ref, int gen) {
    int d = 0, first = gen;
    for (int g = 0; g < gen; g++)
        if (got[g] != ref[g]) {
            d++;
            if (first == gen) first = g;
        }
    t->differ += d;
    t->same_runs += d == 0;
    t->first_sum += first;
    t->runs++;
    t->tokens += gen;
}

double gm_tally_print(const gm_tally *t, const char *label, const char *type) {
    const double agree = t->tokens ? 1.0 - (double)t->differ / t->tokens : 0.0;
    printf("  %-6s %-5s: %4d of %d tokens differ (%.1f%% agree), %d of %d continuations identical, first "
           "difference at token %.1f on average\n",
           label, type, t->differ, t->tokens, 100 * agree, t->same_runs, t->runs,
           t->runs ? (double)t->first_sum / t->runs : 0.0);
    return agree;
}
