/*
 * greedy_model.h -- what the real-model cache-type tests share
 * (test_backend_kvquant_model.c, test_backend_kivi_model.c): ten prompts
 * (short facts, a story, a list, code, questions and a 150-token passage with
 * a question), a greedy continuation under one cache type and one method, and
 * the tally of tokens that differ from a reference continuation.
 * Not a test by itself; no checks live here.
 */
#ifndef KVS_GREEDY_MODEL_H
#define KVS_GREEDY_MODEL_H

#include <stdint.h>

#include "kvs_backend.h"

enum { GM_NP = 10 };
extern const char *const GM_PROMPTS[GM_NP];

typedef struct {
    int ctype;          /* KVS_CACHE_* */
    const char *method; /* NULL: the full cache */
    double ratio;       /* kept ratio when method is set */
    int gen;            /* greedy tokens */
    int kivi_g, kivi_r; /* group and residual window when ctype is a KIVI type */
} gm_run;

/* Loads argv[1] (or def) with 2 threads. Returns NULL and sets *skip when
 * the model is not installed (the test then exits 77), NULL with *skip == 0
 * on a load error (err set). */
kvs_model *gm_model_load(int argc, char **argv, const char *def, int *skip, kvs_err *err);

/* Greedy continuation of r->gen tokens of prompt into out[gen]: prefill,
 * compress (method NULL keeps all), decode. *st gets the compress step's
 * stats; *bad counts non-finite logits and out-of-range tokens. Returns 1,
 * or 0 on an error (err set). */
int gm_generate(kvs_model *m, const gm_run *r, const char *prompt, int32_t *out, kvs_kv_stats *st, int *bad,
                kvs_err *err);

/* Tokens differing from ref over a set of continuations. */
typedef struct {
    int differ, same_runs, first_sum, runs, tokens;
} gm_tally;
void gm_tally_add(gm_tally *t, const int32_t *got, const int32_t *ref, int gen);
/* One line: "  LABEL TYPE: D of N tokens differ (P% agree), ..."; returns the agreeing share. */
double gm_tally_print(const gm_tally *t, const char *label, const char *type);

#endif
