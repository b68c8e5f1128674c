/*
 * ruler.c -- kvsieve_datasets: RULER's synthetic tasks (NIAH, variable
 * tracking, common and frequent words extraction, QA): the task table and
 * its checks, fitting each sample's prompt to a token length with the
 * caller's counter, and the dataset (see the RULER section of
 * kvs_datasets.h for the definitions followed).
 * Not here: the prompt builders (ruler_tasks.c), the data files and the
 * sentence splitter (ruler_data.c), the word lists (ruler_words.c),
 * tokenization (the counter is the caller's:
 * the runner asks the backend), scoring (eval/metrics.c). Deterministic: no
 * clock, no global random state; every draw comes from splitmix64 streams
 * seeded per sample, re-seeded for every haystack size tried, so that the
 * keys, values and answers of a sample do not depend on the fitted size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruler_internal.h"

/* ---- task definitions ------------------------------------------------------------ */

static const char *const std_names[] = {
    "niah_single_1",   "niah_single_2", "niah_single_3",   "niah_multikey_1", "niah_multikey_2",
    "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt",            "cwe",
    "fwe",             "qa_1",          "qa_2",            NULL};
enum { N_STD = 13 };

const char *const *kvs_ruler_task_names(void) { return std_names; }

static void niah_def(kvs_ruler_task *t, const char *hay, const char *k, const char *v, int nk, int nv,
                     int nq) {
    snprintf(t->type_haystack, sizeof t->type_haystack, "%s", hay);
    snprintf(t->type_needle_k, sizeof t->type_needle_k, "%s", k);
    snprintf(t->type_needle_v, sizeof t->type_needle_v, "%s", v);
    t->num_needle_k = nk, t->num_needle_v = nv, t->num_needle_q = nq;
}

kvs_status kvs_ruler_task_defaults(const char *kind, kvs_ruler_task *t, kvs_err *err) {
    memset(t, 0, sizeof *t);
    /* the argument defaults of RULER's generators */
    niah_def(t, "essay", "words", "numbers", 1, 1, 1);
    t->num_chains = 1, t->num_hops = 4;
    t->freq_cw = 30, t->freq_ucw = 3, t->num_cw = 10;
    t->alpha = 2.0, t->coded_wordlen = 6, t->vocab_size = 0;
    snprintf(t->dataset, sizeof t->dataset, "squad");
    static const char *const kinds[] = {"niah", "variable_tracking", "vt", "common_words_extraction",
                                        "cwe", "freq_words_extraction", "fwe", "qa"};
    static const kvs_ruler_kind kv[] = {KVS_RULER_NIAH, KVS_RULER_VT,  KVS_RULER_VT,
                                        KVS_RULER_CWE,  KVS_RULER_CWE, KVS_RULER_FWE,
                                        KVS_RULER_FWE,  KVS_RULER_QA};
    for (int i = 0; i < 8; i++)
        if (kind && !strcmp(kind, kinds[i])) {
            t->kind = kv[i];
            snprintf(t->name, sizeof t->name, "%s", kind);
            return KVS_OK;
        }
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "ruler: unknown task kind '%s' (did you mean '%s'?); kinds: niah, "
                      "variable_tracking, common_words_extraction, freq_words_extraction, qa",
                      kind ? kind : "(null)", kvs_ds_closest(kind ? kind : "", kinds, 8));
}

kvs_status kvs_ruler_task_get(const char *name, kvs_ruler_task *t, kvs_err *err) {
    int i = 0;
    while (i < N_STD && (!name || strcmp(name, std_names[i]) != 0)) i++;
    if (i == N_STD)
        return kvs_errorf(err, KVS_ERR_NOTFOUND,
                          "ruler: unknown task '%s' (did you mean '%s'?); tasks: niah_single_1/2/3, "
                          "niah_multikey_1/2/3, niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1, "
                          "qa_2",
                          name ? name : "(null)", kvs_ds_closest(name ? name : "", std_names, N_STD));
    static const char *const kind_of[N_STD] = {"niah", "niah", "niah", "niah", "niah", "niah", "niah",
                                               "niah", "vt",   "cwe",  "fwe",  "qa",   "qa"};
    kvs_status st = kvs_ruler_task_defaults(kind_of[i], t, err);
    if (st) return st;
    snprintf(t->name, sizeof t->name, "%s", name);
    switch (i) { /* synthetic.yaml */
    case 0: niah_def(t, "repeat", "words", "numbers", 1, 1, 1); break;
    case 1: niah_def(t, "essay", "words", "numbers", 1, 1, 1); break;
    case 2: niah_def(t, "essay", "words", "uuids", 1, 1, 1); break;
    case 3: niah_def(t, "essay", "words", "numbers", 4, 1, 1); break;
    case 4: niah_def(t, "needle", "words", "numbers", 1, 1, 1); break;
    case 5: niah_def(t, "needle", "uuids", "uuids", 1, 1, 1); break;
    case 6: niah_def(t, "essay", "words", "numbers", 1, 4, 1); break;
    case 7: niah_def(t, "essay", "words", "numbers", 1, 1, 4); break;
    case 8: t->num_chains = 1, t->num_hops = 4; break;
    case 9: t->freq_cw = 30, t->freq_ucw = 3, t->num_cw = 10; break;
    case 10: t->alpha = 2.0; break;
    case 11: snprintf(t->dataset, sizeof t->dataset, "squad"); break;
    case 12: snprintf(t->dataset, sizeof t->dataset, "hotpotqa"); break;
    }
    return KVS_OK;
}

int kvs_ruler_task_gen_tokens(const kvs_ruler_task *t) {
    static const int dflt[] = {128, 30, 120, 50, 32}; /* constants.py tokens_to_generate */
    return t->tokens_to_generate > 0 ? t->tokens_to_generate : dflt[t->kind];
}

static int one_of(const char *s, const char *a, const char *b, const char *c) {
    return !strcmp(s, a) || !strcmp(s, b) || (c && !strcmp(s, c));
}

kvs_status kvs_ruler_task_check(const kvs_ruler_task *t, kvs_err *err) {
    const char *n = t->name[0] ? t->name : "?";
    if ((int)t->kind < 0 || t->kind > KVS_RULER_QA)
        return kvs_errorf(err, KVS_ERR_INVALID, "ruler task '%s': bad kind %d", n, (int)t->kind);
    if (t->tokens_to_generate < 0 || t->tokens_to_generate > 65536)
        return kvs_errorf(err, KVS_ERR_INVALID, "ruler task '%s': tokens_to_generate %d out of [0, 65536]",
                          n, t->tokens_to_generate);
    switch (t->kind) {
    case KVS_RULER_NIAH:
        if (!one_of(t->type_haystack, "repeat", "essay", "needle"))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': type_haystack '%s' is not one of repeat, essay, needle",
                              n, t->type_haystack);
        if (!one_of(t->type_needle_k, "numbers", "words", "uuids"))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': type_needle_k '%s' is not one of numbers, words, uuids",
                              n, t->type_needle_k);
        if (!one_of(t->type_needle_v, "numbers", "words", "uuids"))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': type_needle_v '%s' is not one of numbers, words, uuids",
                              n, t->type_needle_v);
        if (t->num_needle_k < 1 || t->num_needle_v < 1 || t->num_needle_q < 1)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': num_needle_k/v/q must be >= 1 (got %d/%d/%d)", n,
                              t->num_needle_k, t->num_needle_v, t->num_needle_q);
        {
            int k = t->num_needle_k > t->num_needle_q ? t->num_needle_k : t->num_needle_q;
            if (k > 100 || t->num_needle_v > 100 || k * t->num_needle_v > 100)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "ruler task '%s': %d keys x %d values = more than 100 needles", n, k,
                                  t->num_needle_v);
            if (!strcmp(t->type_haystack, "essay") && k * t->num_needle_v > 40)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "ruler task '%s': %d needles; an essay haystack has 40 depths", n,
                                  k * t->num_needle_v);
        }
        break;
    case KVS_RULER_VT:
        if (t->num_chains < 1 || t->num_chains > 100 || t->num_hops < 1 || t->num_hops > 100)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': num_chains and num_hops must be in [1, 100]", n);
        break;
    case KVS_RULER_CWE:
        if (t->num_cw < 1 || t->num_cw > 100 || t->freq_cw < 1 || t->freq_ucw < 1 ||
            t->freq_cw > 1000 || t->freq_ucw > t->freq_cw)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': need 1 <= num_cw <= 100 and 1 <= freq_ucw <= freq_cw "
                              "<= 1000", n);
        break;
    case KVS_RULER_FWE:
        if (!(t->alpha > 1.0 && t->alpha <= 10.0) || t->coded_wordlen < 2 || t->coded_wordlen > 32 ||
            t->vocab_size < 0 || t->vocab_size > 1000000 || (t->vocab_size > 0 && t->vocab_size < 5))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': need alpha in (1, 10], coded_wordlen in [2, 32], "
                              "vocab_size 0 (length / 50) or in [5, 1000000]", n);
        break;
    case KVS_RULER_QA:
        if (!one_of(t->dataset, "squad", "hotpotqa", NULL))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler task '%s': dataset '%s' is not one of squad, hotpotqa", n,
                              t->dataset);
        break;
    }
    return KVS_OK;
}

/* ---- fitting to a token length ------------------------------------------------------------ */

static kvs_status measure(gen *g, build_fn f, int64_t h, built *b, int64_t *tokens, kvs_err *err) {
    ruler_built_reset(b);
    kvs_status st = f(g, h, b, err);
    if (st) return st;
    g->tmp.n = 0;
    if ((st = kvs_ds_buf_add(&g->tmp, b->ctx.p ? b->ctx.p : "", b->ctx.n, err)) ||
        (st = kvs_ds_buf_add(&g->tmp, b->q.p ? b->q.p : "", b->q.n, err)))
        return st;
    st = g->o->count(g->o->count_ctx, g->tmp.p, g->tmp.n, tokens, err);
    if (st) return kvs_err_prefix(err, "ruler task '%s': counting tokens", g->t->name);
    return KVS_OK;
}

/* The largest h in [hmin, hmax] whose prompt has at most `target` tokens,
 * built into *best (tokens in *best_tokens). Token counts grow almost
 * linearly in h: secant steps inside a bracket, bisection when they stall. */
static kvs_status fit(gen *g, build_fn f, int64_t target, int64_t hmin, int64_t hmax, int64_t guess,
                      built *best, int64_t *best_tokens, kvs_err *err) {
    built cur = {0};
    int64_t lo = -1, hi = hmax + 1, tlo = 0, thi = 0;
    int64_t h = guess < hmin ? hmin : guess > hmax ? hmax : guess;
    kvs_status st = KVS_OK;
    int stall = 0;
    for (int it = 0; it < 64; it++) {
        int64_t tk = 0;
        if ((st = measure(g, f, h, &cur, &tk, err))) break;
        int64_t old_gap = hi - lo;
        if (tk <= target) {
            lo = h, tlo = tk;
            built tmp = *best;
            *best = cur;
            cur = tmp;
        } else {
            hi = h, thi = tk;
        }
        if (lo >= 0 && (hi - lo <= 1 || lo == hmax)) break;
        if (lo < 0 && h == hmin) break;
        stall = (hi - lo) * 2 > old_gap ? stall + 1 : 0;
        int64_t nh;
        if (lo >= 0 && hi <= hmax) {
            nh = lo + (int64_t)((double)(target - tlo) * (double)(hi - lo) / (double)(thi - tlo > 0 ? thi - tlo : 1));
            if (stall >= 2) nh = lo + (hi - lo) / 2;
        } else if (lo >= 0) {
            nh = (int64_t)((double)lo * (double)target / (double)(tlo > 0 ? tlo : 1)) + 1;
        } else {
            nh = (int64_t)((double)hi * (double)target / (double)(thi > 0 ? thi : 1)) - 1;
        }
        if (lo >= 0 && nh <= lo) nh = lo + 1;
        if (nh >= hi) nh = hi - 1;
        if (nh < hmin) nh = hmin;
        if (nh > hmax) nh = hmax;
        h = nh;
    }
    ruler_built_free(&cur);
    if (st) return st;
    if (lo < 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "ruler task '%s': length %lld tokens is too short: the smallest prompt has "
                          "%lld tokens, more than the %lld left after the %d generated",
                          g->t->name, (long long)g->length, (long long)thi, (long long)target,
                          kvs_ruler_task_gen_tokens(g->t));
    *best_tokens = tlo;
    return KVS_OK;
}

/* ---- the dataset -------------------------------------------------------------------------- */

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static kvs_status make_sample(kvs_sample *sm, const kvs_ruler_task *t, int64_t L, int k, built *b,
                              int64_t tokens, kvs_err *err) {
    char id[96];
    snprintf(id, sizeof id, "%s-L%lld-S%d", t->name, (long long)L, k);
    sm->id = kvs_ds_strdup(id);
    sm->context = kvs_ds_buf_take(&b->ctx, err);
    sm->question = kvs_ds_buf_take(&b->q, err);
    sm->task = kvs_ds_strdup(t->name);
    sm->metric = kvs_ds_strdup(t->kind == KVS_RULER_QA ? "string_match_part" : "string_match_all");
    sm->max_tokens = kvs_ruler_task_gen_tokens(t);
    sm->n_tokens = tokens;
    sm->answers = b->ans.v;
    sm->n_answers = b->ans.n;
    memset(&b->ans, 0, sizeof b->ans);
    if (b->n_spans) {
        sm->spans = b->spans;
        sm->n_spans = b->n_spans;
        b->spans = NULL;
        b->n_spans = b->cap_spans = 0;
    }
    if (!sm->id || !sm->context || !sm->question || !sm->task || !sm->metric)
        return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory for sample %s", id);
    if (sm->n_answers < 1)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "ruler: sample %s has no answer", id);
    return KVS_OK;
}

static void gen_free(gen *g) {
    ruler_strv_free(&g->adjs, 1);
    ruler_strv_free(&g->nouns, 1);
    ruler_strv_free(&g->verbs, 1);
    ruler_strv_free(&g->pool, 0);
    free(g->icl);
    free(g->scratch);
    kvs_ds_buf_free(&g->tmp);
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kvs_status kvs_ruler_generate(const kvs_ruler_opts *o, kvs_ds_hash_fn hash, kvs_dataset **out,
                              kvs_err *err) {
    *out = NULL;
    if (!hash) return kvs_errorf(err, KVS_ERR_INVALID, "ruler: no hash function given");
    if (!o || !o->count) return kvs_errorf(err, KVS_ERR_INVALID, "ruler: no token counter given");
    if (o->n_tasks < 1 || !o->tasks || o->n_lengths < 1 || !o->lengths)
        return kvs_errorf(err, KVS_ERR_INVALID, "ruler: need at least one task and one length");
    if (o->n < 1 || o->n > 100000)
        return kvs_errorf(err, KVS_ERR_INVALID, "ruler: n = %d samples per task and length is outside "
                          "[1, 100000]", o->n);
    kvs_status st = KVS_OK;
    for (int i = 0; i < o->n_tasks; i++) {
        if ((st = kvs_ruler_task_check(&o->tasks[i], err))) return st;
        for (int j = 0; j < i; j++)
            if (!strcmp(o->tasks[i].name, o->tasks[j].name))
                return kvs_errorf(err, KVS_ERR_INVALID, "ruler: task '%s' given twice", o->tasks[i].name);
    }
    for (int i = 0; i < o->n_lengths; i++)
        if (o->lengths[i] < 256 || o->lengths[i] > (1 << 22))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "ruler: lengths[%d] = %lld tokens is outside [256, 4194304]", i,
                              (long long)o->lengths[i]);
    ruler_data data;
    memset(&data, 0, sizeof data);
    data.hash = hash;
    gen g;
    memset(&g, 0, sizeof g);
    kvs_dataset *d = NULL;
    built b = {0};
    int need_data = 0;
    for (int i = 0; i < o->n_tasks; i++)
        need_data |= (o->tasks[i].kind == KVS_RULER_NIAH && !strcmp(o->tasks[i].type_haystack, "essay")) ||
                     o->tasks[i].kind == KVS_RULER_QA;
    if (need_data && (st = kvs_ruler_find_data(o->data_dir, data.dir, sizeof data.dir, err))) return st;
    g.o = o;
    g.data = &data;
    if ((st = ruler_split_words(kvs_ruler_adjectives, &g.adjs, err)) ||
        (st = ruler_split_words(kvs_ruler_nouns, &g.nouns, err)) ||
        (st = ruler_split_words(kvs_ruler_verbs, &g.verbs, err)))
        goto cleanup;
    /* the common-words pool: every word once, sorted */
    {
        ruler_strv *l[3] = {&g.nouns, &g.adjs, &g.verbs};
        for (int a = 0; a < 3 && !st; a++)
            for (int i = 0; i < l[a]->n && !st; i++) st = ruler_strv_push(&g.pool, l[a]->v[i], err);
        if (st) goto cleanup;
        qsort(g.pool.v, (size_t)g.pool.n, sizeof *g.pool.v, cmp_strp);
        int m = 0;
        for (int i = 0; i < g.pool.n; i++)
            if (!m || strcmp(g.pool.v[i], g.pool.v[m - 1])) g.pool.v[m++] = g.pool.v[i];
        g.pool.n = m;
    }
    if ((st = kvs_ds_new("ruler", "ruler", KVS_DS_RULER_VERSION, "ruler", &d, err))) goto cleanup;
    int64_t total = (int64_t)o->n_tasks * o->n_lengths * o->n;
    if (total > 1000000) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "ruler: %lld samples; at most 1,000,000", (long long)total);
        goto cleanup;
    }
    d->samples = calloc((size_t)total, sizeof *d->samples);
    if (!d->samples) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory for %lld samples", (long long)total);
        goto cleanup;
    }
    for (int ti = 0; ti < o->n_tasks; ti++) {
        const kvs_ruler_task *t = &o->tasks[ti];
        g.t = t;
        build_fn f = NULL;
        int64_t hmin = 1, hmax = 1 << 24;
        switch (t->kind) {
        case KVS_RULER_NIAH: {
            f = ruler_build_niah;
            int nk = t->num_needle_k > t->num_needle_q ? t->num_needle_k : t->num_needle_q;
            if (!strcmp(t->type_haystack, "essay")) {
                if ((st = ruler_data_essay(&data, err))) goto cleanup;
                hmax = data.words.n;
            } else {
                hmin = nk * t->num_needle_v;
            }
            break;
        }
        case KVS_RULER_VT: f = ruler_build_vt; break;
        case KVS_RULER_CWE:
            f = ruler_build_cwe;
            hmin = t->num_cw + 1;
            hmax = g.pool.n;
            if (hmin > hmax) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "ruler task '%s': num_cw %d needs more than the %d "
                                "words of the word list", t->name, t->num_cw, g.pool.n);
                goto cleanup;
            }
            break;
        case KVS_RULER_FWE: f = ruler_build_fwe; break;
        case KVS_RULER_QA:
            f = ruler_build_qa;
            if ((st = ruler_data_qa(&data, t->dataset, &g.qa, err))) goto cleanup;
            hmin = 1;
            hmax = g.qa->docs.n;
            break;
        }
        for (int li = 0; li < o->n_lengths; li++) {
            int64_t L = o->lengths[li];
            int64_t target = L - kvs_ruler_task_gen_tokens(t);
            g.length = L;
            free(g.icl);
            g.icl = NULL;
            if (t->kind == KVS_RULER_VT) {
                /* one worked example per (task, length): about 500 tokens with its
                 * 30 generated */
                g.index = -1;
                g.sample_seed = o->seed * 0xD1B54A32D192ED03ull ^ fnv(t->name) ^ (uint64_t)L * 0x94D049BB133111EBull;
                built ib = {0};
                int64_t itk = 0;
                st = fit(&g, ruler_build_vt_icl, 500 - 30, 1, 1 << 20, 20, &ib, &itk, err);
                if (!st) st = kvs_ds_buf_add(&ib.ctx, ib.q.p ? ib.q.p : "", ib.q.n, err);
                if (!st) st = kvs_ds_buf_add(&ib.ctx, "\n\n", 2, err);
                if (!st && !(g.icl = kvs_ds_buf_take(&ib.ctx, err))) st = KVS_ERR_NOMEM;
                ruler_built_free(&ib);
                if (st) goto cleanup;
            }
            for (int k = 0; k < o->n; k++) {
                g.index = k;
                g.sample_seed = (o->seed * 0xD1B54A32D192ED03ull) ^ fnv(t->name) ^
                                ((uint64_t)L * 0x94D049BB133111EBull) ^ ((uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull);
                int64_t guess = t->kind == KVS_RULER_QA ? 8 : target / 8;
                if (t->kind == KVS_RULER_NIAH && strcmp(t->type_haystack, "essay") != 0) guess = target / 24;
                if (t->kind == KVS_RULER_FWE) guess = target / 2;
                int64_t tk = 0;
                ruler_built_reset(&b);
                if ((st = fit(&g, f, target, hmin, hmax, guess, &b, &tk, err))) goto cleanup;
                kvs_sample *sm = &d->samples[d->n_samples++];
                if ((st = make_sample(sm, t, L, k, &b, tk, err))) goto cleanup;
            }
        }
    }
    {
        char hx[65];
        if (data.hashes.n) {
            hash(data.hashes.p, data.hashes.n, hx);
            snprintf(d->version, sizeof d->version, "%s+data:%.12s", KVS_DS_RULER_VERSION, hx);
        } else {
            snprintf(d->version, sizeof d->version, "%s+data:none", KVS_DS_RULER_VERSION);
        }
    }
    if ((st = kvs_ds_hash_dataset(d, hash, err))) goto cleanup;
    *out = d;
    d = NULL;
cleanup:
    ruler_built_free(&b);
    gen_free(&g);
    ruler_data_free(&data);
    kvs_dataset_free(d);
    return st;
}
