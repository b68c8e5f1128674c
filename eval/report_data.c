/*
 * report_data.c -- the report's data: the scores of the results store
 * gathered into groups (experiment, budget, method variant, metric) and each
 * group's mean and seeded percentile-bootstrap 95% CI.
 *
 * What it is: the SQL that reads cells/results/scores, the interning of
 * names and sample ids, the SQL helpers the other report files share, and
 * the seed of each group's bootstrap (a hash of the group's names, so a
 * report reproduces). What it is not: no ordering of rows or columns
 * (report_layout.c), no writing (report.c, report_paired.c, report_perf.c),
 * no statistics of its own (stats.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <assert.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t kvs_rpt_fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static int intern(names *t, const char *s) {
    for (int i = t->n - 1; i >= 0; i--)
        if (strcmp(t->v[i], s) == 0) return i;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        char **nv = realloc(t->v, sizeof *nv * (size_t)cap);
        if (!nv) return -1;
        t->v = nv, t->cap = cap;
    }
    char *c = strdup(s);
    if (!c) return -1;
    t->v[t->n] = c;
    return t->n++;
}

static void names_free(names *t) {
    for (int i = 0; i < t->n; i++) free(t->v[i]);
    free(t->v);
}

void kvs_rpt_dataset_free(dataset *d) {
    names_free(&d->exps);
    names_free(&d->kinds);
    names_free(&d->labels);
    names_free(&d->methods);
    names_free(&d->metrics);
    names_free(&d->caches);
    free(d->exp_kind);
    free(d->label_method);
    free(d->label_cache);
    free(d->budgets);
    for (int i = 0; i < d->n_groups; i++) {
        free(d->g[i].x);
        free(d->g[i].w);
        free(d->g[i].sid);
    }
    free(d->g);
    names_free(&d->samples.v);
    free(d->samples.slot);
}

/* Index of sample id s (added if new); -1 when out of memory. */
static int sample_index(sample_tab *t, const char *s) {
    if (t->v.n * 2 >= t->cap) { /* keep the load under 1/2: rehash into twice the slots */
        int cap = t->cap ? 2 * t->cap : 1024;
        int *ns = malloc(sizeof *ns * (size_t)cap);
        if (!ns) return -1;
        for (int i = 0; i < cap; i++) ns[i] = -1;
        for (int i = 0; i < t->v.n; i++) {
            uint64_t h = kvs_rpt_fnv1a(t->v.v[i], 0xcbf29ce484222325ULL);
            int k = (int)(h & (uint64_t)(cap - 1));
            while (ns[k] >= 0) k = (k + 1) & (cap - 1);
            ns[k] = i;
        }
        free(t->slot);
        t->slot = ns;
        t->cap = cap;
    }
    uint64_t h = kvs_rpt_fnv1a(s, 0xcbf29ce484222325ULL);
    int k = (int)(h & (uint64_t)(t->cap - 1));
    while (t->slot[k] >= 0) {
        if (strcmp(t->v.v[t->slot[k]], s) == 0) return t->slot[k];
        k = (k + 1) & (t->cap - 1);
    }
    if (t->v.n == t->v.cap) {
        int cap = t->v.cap ? 2 * t->v.cap : 64;
        char **nv = realloc(t->v.v, sizeof *nv * (size_t)cap);
        if (!nv) return -1;
        t->v.v = nv, t->v.cap = cap;
    }
    char *c = strdup(s);
    if (!c) return -1;
    t->v.v[t->v.n] = c;
    t->slot[k] = t->v.n;
    return t->v.n++;
}

static int budget_index(dataset *d, double ratio, int64_t tokens) {
    for (int i = 0; i < d->n_budgets; i++)
        if (d->budgets[i].ratio == ratio && d->budgets[i].tokens == tokens) return i;
    if (d->n_budgets == d->cap_budgets) {
        int cap = d->cap_budgets ? 2 * d->cap_budgets : 16;
        bkey *nb = realloc(d->budgets, sizeof *nb * (size_t)cap);
        if (!nb) return -1;
        d->budgets = nb, d->cap_budgets = cap;
    }
    d->budgets[d->n_budgets] = (bkey){ratio, tokens};
    return d->n_budgets++;
}

kvs_status kvs_rpt_sql_fail(sqlite3 *db, kvs_err *err, const char *what) {
    return kvs_errorf(err, KVS_ERR_IO, "report: %s: %s", what, sqlite3_errmsg(db));
}

/* Prepare a report query whose ?1 is the experiment filter (NULL: all) and ?2
 * the run filter (<= 0: all), and bind both from the options. */
kvs_status kvs_rpt_prepare_filtered(sqlite3 *db, const char *sql, const kvs_report_opts *o,
                                    sqlite3_stmt **st, const char *what, kvs_err *err) {
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) return kvs_rpt_sql_fail(db, err, what);
    if (o->experiment)
        sqlite3_bind_text(*st, 1, o->experiment, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(*st, 1);
    sqlite3_bind_int64(*st, 2, o->run_id);
    return KVS_OK;
}

/* Make room for one more element in a doubling array (first size `first`). */
kvs_status kvs_rpt_grow(void **rows, int *cap, int n, size_t elem, int first, kvs_err *err) {
    if (n < *cap) return KVS_OK;
    int nc = *cap ? 2 * *cap : first;
    void *nr = realloc(*rows, elem * (size_t)nc);
    if (!nr) return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
    *rows = nr;
    *cap = nc;
    return KVS_OK;
}

/* A row's name: the variant's label, with " @T" for a cache of type T other
 * than the default, before a trailing " [mode]" tag (which pairs a row with
 * its `full`): "snapkv @q4_0 [query_agnostic]". */
static void row_label(const char *label, const char *kv, char *out, size_t n) {
    if (!kv[0]) {
        snprintf(out, n, "%s", label);
        return;
    }
    const char *tag = strrchr(label, '[');
    if (tag && tag > label && tag[-1] == ' ' && label[strlen(label) - 1] == ']')
        snprintf(out, n, "%.*s @%s %s", (int)(tag - 1 - label), label, kv, tag);
    else
        snprintf(out, n, "%s @%s", label, kv);
}

kvs_status kvs_rpt_gather(sqlite3 *db, const kvs_report_opts *o, dataset *d, kvs_err *err) {
    kvs_status rc = KVS_OK;
    sqlite3_stmt *st = NULL;
    const char *sql =
        "SELECT c.experiment, c.kind, c.label, c.method, c.budget_ratio, c.budget_tokens, s.metric,"
        " s.value, r.decode_ms, c.sample_id, " KVS_RPT_SQL_KV_CACHE " AS kv FROM cells c"
        " JOIN results r ON r.cell_key = c.key JOIN scores s ON s.cell_key = c.key"
        " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
        " AND s.value IS NOT NULL"
        " ORDER BY c.experiment, c.budget_tokens, c.budget_ratio, c.label, kv, s.metric";
    if ((rc = kvs_rpt_prepare_filtered(db, sql, o, &st, "query", err))) return rc;
    group *cur = NULL;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *exp = (const char *)sqlite3_column_text(st, 0);
        const char *kind = (const char *)sqlite3_column_text(st, 1);
        const char *label0 = (const char *)sqlite3_column_text(st, 2);
        const char *kv = (const char *)sqlite3_column_text(st, 10);
        char label[320];
        row_label(label0 ? label0 : "", kv ? kv : "", label, sizeof label);
        const char *method = (const char *)sqlite3_column_text(st, 3);
        double ratio = sqlite3_column_double(st, 4);
        int64_t tokens = sqlite3_column_int64(st, 5);
        const char *metric = (const char *)sqlite3_column_text(st, 6);
        double value = sqlite3_column_double(st, 7);
        int ne = d->exps.n;
        int e = intern(&d->exps, exp ? exp : "");
        int k = intern(&d->kinds, kind ? kind : "");
        int nl = d->labels.n;
        int l = intern(&d->labels, label);
        int kc = intern(&d->caches, kv ? kv : "");
        int mth = intern(&d->methods, method ? method : "");
        int m = intern(&d->metrics, metric ? metric : "");
        int b = budget_index(d, ratio, tokens);
        const char *sample = (const char *)sqlite3_column_text(st, 9);
        int si = sample_index(&d->samples, sample ? sample : "");
        if (e < 0 || k < 0 || l < 0 || kc < 0 || mth < 0 || m < 0 || b < 0 || si < 0) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
            goto cleanup;
        }
        if (d->exps.n != ne) {
            int *nk = realloc(d->exp_kind, sizeof *nk * (size_t)d->exps.n);
            if (!nk) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                goto cleanup;
            }
            d->exp_kind = nk;
            d->exp_kind[e] = k;
        }
        if (d->labels.n != nl) {
            int *nm = realloc(d->label_method, sizeof *nm * (size_t)d->labels.n);
            if (!nm) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                goto cleanup;
            }
            d->label_method = nm;
            d->label_method[l] = mth;
            int *nc = realloc(d->label_cache, sizeof *nc * (size_t)d->labels.n);
            if (!nc) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                goto cleanup;
            }
            d->label_cache = nc;
            d->label_cache[l] = kc;
        }
        if (!cur || cur->exp != e || cur->budget != b || cur->label != l || cur->metric != m) {
            /* rows arrive sorted by group except metric interleaving: look up */
            cur = NULL;
            for (int i = d->n_groups - 1; i >= 0 && i >= d->n_groups - 64; i--) {
                group *g = &d->g[i];
                if (g->exp == e && g->budget == b && g->label == l && g->metric == m) {
                    cur = g;
                    break;
                }
            }
            if (!cur) {
                if (d->n_groups == d->cap_groups) {
                    int cap = d->cap_groups ? 2 * d->cap_groups : 64;
                    group *ng = realloc(d->g, sizeof *ng * (size_t)cap);
                    if (!ng) {
                        rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                        goto cleanup;
                    }
                    d->g = ng, d->cap_groups = cap;
                }
                cur = &d->g[d->n_groups++];
                memset(cur, 0, sizeof *cur);
                cur->exp = e, cur->budget = b, cur->label = l, cur->metric = m;
            }
        }
        /* decode_tok_s: a mean of per-request rates would favour short
         * answers; weighting by decode time gives total tokens / total time */
        const int weighted = strcmp(metric ? metric : "", "decode_tok_s") == 0;
        const double wv = weighted ? sqlite3_column_double(st, 8) : 1.0;
        if (weighted && !(wv > 0)) continue; /* no decode time recorded: no rate */
        if (cur->n == cur->cap) {
            int cap = cur->cap ? 2 * cur->cap : 8;
            double *nx = realloc(cur->x, sizeof *nx * (size_t)cap);
            if (!nx) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                goto cleanup;
            }
            cur->x = nx;
            int *ni = realloc(cur->sid, sizeof *ni * (size_t)cap);
            if (!ni) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                goto cleanup;
            }
            cur->sid = ni;
            if (weighted || cur->w) {
                double *nw = realloc(cur->w, sizeof *nw * (size_t)cap);
                if (!nw) {
                    rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
                    goto cleanup;
                }
                cur->w = nw;
            }
            cur->cap = cap;
        }
        assert(!cur->w == !weighted); /* one metric per group */
        if (cur->w) cur->w[cur->n] = wv;
        cur->sid[cur->n] = si;
        cur->x[cur->n++] = value;
    }
    if (r != SQLITE_DONE) rc = kvs_rpt_sql_fail(db, err, "reading scores");
cleanup:
    sqlite3_finalize(st);
    return rc;
}

void kvs_rpt_compute(dataset *d, const kvs_report_opts *o) {
    int B = o->bootstrap > 0 ? o->bootstrap : 1000;
    uint64_t seed = o->seed ? o->seed : 20260;
    for (int i = 0; i < d->n_groups; i++) {
        group *g = &d->g[i];
        char bt[64];
        snprintf(bt, sizeof bt, "|%.17g|%lld|", d->budgets[g->budget].ratio,
                 (long long)d->budgets[g->budget].tokens);
        uint64_t h = kvs_rpt_fnv1a(d->exps.v[g->exp], 0xcbf29ce484222325ULL);
        h = kvs_rpt_fnv1a(bt, h);
        h = kvs_rpt_fnv1a(d->labels.v[g->label], h);
        h = kvs_rpt_fnv1a("|", h);
        h = kvs_rpt_fnv1a(d->metrics.v[g->metric], h);
        kvs_bootstrap_ci_weighted(g->x, g->w, g->n, B, seed ^ h, &g->mean, &g->lo, &g->hi);
    }
}
