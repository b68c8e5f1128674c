/*
 * report.c -- comparison tables and plots from the results store.
 *
 * What it is: SQL over cells/results/scores (and latency), aggregated per
 * (experiment, budget, method variant, metric) into mean and a seeded
 * percentile-bootstrap 95% CI, written as Markdown, LaTeX, CSV or JSON;
 * latency tables (N x method: median, p10, p90); the engine throughput
 * table of `kvsieve bench` (engine_bench rows); plots through gnuplot run
 * as a child process. What it is not: it never runs a method; everything
 * comes from the database.
 */
#include "kvs_eval.h"
#include "gnuplot.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- bootstrap --------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear-interpolated quantile of sorted v[0..n). */
static double quantile(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return v[n - 1];
    double f = pos - i;
    return v[i] + f * (v[i + 1] - v[i]);
}

void kvs_bootstrap_ci_weighted(const double *x, const double *w, int n, int resamples,
                               uint64_t seed, double *mean, double *lo, double *hi) {
    double s = 0, sw = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w ? w[i] : 1.0;
        s += x[i] * wi;
        sw += wi;
    }
    *mean = n > 0 && sw > 0 ? s / sw : NAN;
    if (n <= 1 || resamples < 2) {
        *lo = *hi = *mean;
        return;
    }
    double *m = malloc(sizeof *m * (size_t)resamples); /* [resamples] resample means */
    if (!m) {
        *lo = *hi = NAN;
        return;
    }
    /* splitmix64 inlined (this loop is the cost of a large report); the
     * index is a multiply-shift of the high 32 bits, unbiased enough for
     * n < 2^32 and free of a division. */
    uint64_t st = seed;
    for (int b = 0; b < resamples; b++) {
        double t = 0, tw = 0;
        for (int i = 0; i < n; i++) {
            uint64_t z = (st += 0x9e3779b97f4a7c15ULL);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            z ^= z >> 31;
            const uint64_t k = ((z >> 32) * (uint64_t)n) >> 32;
            if (w) {
                t += x[k] * w[k];
                tw += w[k];
            } else {
                t += x[k];
            }
        }
        m[b] = w ? (tw > 0 ? t / tw : NAN) : t / n;
    }
    qsort(m, (size_t)resamples, sizeof *m, cmp_double);
    *lo = quantile(m, resamples, 0.025);
    *hi = quantile(m, resamples, 0.975);
    free(m);
}

void kvs_bootstrap_ci(const double *x, int n, int resamples, uint64_t seed, double *mean,
                      double *lo, double *hi) {
    kvs_bootstrap_ci_weighted(x, NULL, n, resamples, seed, mean, lo, hi);
}

static uint64_t fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* ---- gathering ------------------------------------------------------------------ */

typedef struct {
    int n, cap;
    char **v;
} names;

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

typedef struct {
    int exp, budget, label, metric;
    int n, cap;
    double *x; /* [n] values */
    double *w; /* [n] weights, or NULL (all 1): decode_tok_s is weighted by each
                * request's decode time, so its mean is total tokens / total time */
    int *sid;  /* [n] sample of each value (index into dataset.samples) */
    double mean, lo, hi;
} group;

/* Sample ids (cells.sample_id), interned through an open-addressing hash:
 * the paired comparisons match cells of two variants by sample. */
typedef struct {
    names v;
    int *slot; /* [cap] index into v, -1 empty */
    int cap;
} sample_tab;

typedef struct {
    double ratio;
    int64_t tokens;
} bkey;

typedef struct {
    names exps, kinds, labels, methods, metrics;
    int *exp_kind;     /* [exps.n] */
    int *label_method; /* [labels.n] */
    bkey *budgets;
    int n_budgets, cap_budgets;
    group *g;
    int n_groups, cap_groups;
    sample_tab samples;
} dataset;

static void dataset_free(dataset *d) {
    names_free(&d->exps);
    names_free(&d->kinds);
    names_free(&d->labels);
    names_free(&d->methods);
    names_free(&d->metrics);
    free(d->exp_kind);
    free(d->label_method);
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
            uint64_t h = fnv1a(t->v.v[i], 0xcbf29ce484222325ULL);
            int k = (int)(h & (uint64_t)(cap - 1));
            while (ns[k] >= 0) k = (k + 1) & (cap - 1);
            ns[k] = i;
        }
        free(t->slot);
        t->slot = ns;
        t->cap = cap;
    }
    uint64_t h = fnv1a(s, 0xcbf29ce484222325ULL);
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

static kvs_status sql_fail(sqlite3 *db, kvs_err *err, const char *what) {
    return kvs_errorf(err, KVS_ERR_IO, "report: %s: %s", what, sqlite3_errmsg(db));
}

/* Prepare a report query whose ?1 is the experiment filter (NULL: all) and ?2
 * the run filter (<= 0: all), and bind both from the options. */
static kvs_status prepare_filtered(sqlite3 *db, const char *sql, const kvs_report_opts *o,
                                   sqlite3_stmt **st, const char *what, kvs_err *err) {
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) return sql_fail(db, err, what);
    if (o->experiment)
        sqlite3_bind_text(*st, 1, o->experiment, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(*st, 1);
    sqlite3_bind_int64(*st, 2, o->run_id);
    return KVS_OK;
}

/* Make room for one more element in a doubling array (first size `first`). */
static kvs_status grow(void **rows, int *cap, int n, size_t elem, int first, kvs_err *err) {
    if (n < *cap) return KVS_OK;
    int nc = *cap ? 2 * *cap : first;
    void *nr = realloc(*rows, elem * (size_t)nc);
    if (!nr) return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
    *rows = nr;
    *cap = nc;
    return KVS_OK;
}

static kvs_status gather(sqlite3 *db, const kvs_report_opts *o, dataset *d, kvs_err *err) {
    kvs_status rc = KVS_OK;
    sqlite3_stmt *st = NULL;
    const char *sql =
        "SELECT c.experiment, c.kind, c.label, c.method, c.budget_ratio, c.budget_tokens, s.metric,"
        " s.value, r.decode_ms, c.sample_id FROM cells c JOIN results r ON r.cell_key = c.key"
        " JOIN scores s ON s.cell_key = c.key"
        " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
        " AND s.value IS NOT NULL"
        " ORDER BY c.experiment, c.budget_tokens, c.budget_ratio, c.label, s.metric";
    if ((rc = prepare_filtered(db, sql, o, &st, "query", err))) return rc;
    group *cur = NULL;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *exp = (const char *)sqlite3_column_text(st, 0);
        const char *kind = (const char *)sqlite3_column_text(st, 1);
        const char *label = (const char *)sqlite3_column_text(st, 2);
        const char *method = (const char *)sqlite3_column_text(st, 3);
        double ratio = sqlite3_column_double(st, 4);
        int64_t tokens = sqlite3_column_int64(st, 5);
        const char *metric = (const char *)sqlite3_column_text(st, 6);
        double value = sqlite3_column_double(st, 7);
        int ne = d->exps.n;
        int e = intern(&d->exps, exp ? exp : "");
        int k = intern(&d->kinds, kind ? kind : "");
        int nl = d->labels.n;
        int l = intern(&d->labels, label ? label : "");
        int mth = intern(&d->methods, method ? method : "");
        int m = intern(&d->metrics, metric ? metric : "");
        int b = budget_index(d, ratio, tokens);
        const char *sample = (const char *)sqlite3_column_text(st, 9);
        int si = sample_index(&d->samples, sample ? sample : "");
        if (e < 0 || k < 0 || l < 0 || mth < 0 || m < 0 || b < 0 || si < 0) {
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
    if (r != SQLITE_DONE) rc = sql_fail(db, err, "reading scores");
cleanup:
    sqlite3_finalize(st);
    return rc;
}

static void compute(dataset *d, const kvs_report_opts *o) {
    int B = o->bootstrap > 0 ? o->bootstrap : 1000;
    uint64_t seed = o->seed ? o->seed : 20260;
    for (int i = 0; i < d->n_groups; i++) {
        group *g = &d->g[i];
        char bt[64];
        snprintf(bt, sizeof bt, "|%.17g|%lld|", d->budgets[g->budget].ratio,
                 (long long)d->budgets[g->budget].tokens);
        uint64_t h = fnv1a(d->exps.v[g->exp], 0xcbf29ce484222325ULL);
        h = fnv1a(bt, h);
        h = fnv1a(d->labels.v[g->label], h);
        h = fnv1a("|", h);
        h = fnv1a(d->metrics.v[g->metric], h);
        kvs_bootstrap_ci_weighted(g->x, g->w, g->n, B, seed ^ h, &g->mean, &g->lo, &g->hi);
    }
}

/* ---- table layout ---------------------------------------------------------------- */

/* -1: lower is better, +1 higher, 0 not ranked. */
static int direction(const char *metric) {
    size_t n = strlen(metric);
    if (strcmp(metric, "kept_ratio") == 0 || strcmp(metric, "kv_kept_mb") == 0 ||
        strcmp(metric, "prefill_ms") == 0) /* kv_kept_mb follows the budget; prefill is shared */
        return 0;
    if ((n > 4 && strcmp(metric + n - 4, "_err") == 0) || (n > 3 && strcmp(metric + n - 3, "_ms") == 0))
        return -1;
    return 1;
}

static int metric_rank(const char *m) {
    static const char *const pref[] = {
        "mean_rel_err", "max_rel_err", "retention",  "needle",      "contains",
        "exact_match",  "choice",      "exact",      "f1",          "rouge_l",
        "accuracy",     "ruler",       "string_match_all", "string_match_part",
        "answer_kept",  "kept_ratio",  "kv_kept_mb", "compress_ms", "apply_ms",
        "prefill_ms",   "decode_tok_s"}; /* task: score, then the head-to-head columns */
    for (size_t i = 0; i < sizeof pref / sizeof pref[0]; i++)
        if (strcmp(m, pref[i]) == 0) return (int)i;
    return 100;
}

static int method_rank(const char *name) {
    for (int i = 0; i < kvs_methods_count(); i++)
        if (strcmp(kvs_method_at(i)->name, name) == 0) return i;
    return 1000;
}

typedef struct {
    int *labels, n_labels;   /* ordered rows */
    int *metrics, n_metrics; /* ordered columns */
    int *budgets, n_budgets; /* ordered tables */
} layout_t;

static int find_group(const dataset *d, int e, int b, int l, int m) {
    for (int i = 0; i < d->n_groups; i++) {
        const group *g = &d->g[i];
        if (g->exp == e && g->budget == b && g->label == l && g->metric == m) return i;
    }
    return -1;
}

static int is_full(const dataset *d, int label) {
    return strcmp(d->methods.v[d->label_method[label]], "full") == 0;
}

/* The group of label l for metric m at budget b; full rows come from any budget. */
static int cell_group(const dataset *d, int e, int b, int l, int m) {
    int i = find_group(d, e, b, l, m);
    if (i >= 0 || !is_full(d, l)) return i;
    for (int bb = 0; bb < d->n_budgets; bb++)
        if ((i = find_group(d, e, bb, l, m)) >= 0) return i;
    return -1;
}

/* The `full` row a variant is compared with: the one with the same
 * bracketed tag (task labels carry " [query_agnostic]" for that mode), else
 * any full row; -1 when there is none. */
static int full_for(const dataset *d, const int *labels, int n_labels, int l) {
    const char *tag = strrchr(d->labels.v[l], '[');
    int any = -1;
    for (int i = 0; i < n_labels; i++) {
        if (!is_full(d, labels[i])) continue;
        const char *ft = strrchr(d->labels.v[labels[i]], '[');
        if (tag ? (ft && !strcmp(tag, ft)) : !ft) return labels[i];
        if (any < 0) any = labels[i];
    }
    return any;
}

typedef int (*ctx_cmp)(const dataset *d, int x, int y);

/* Insertion sort with a context (lists here are short: variants, metrics). */
static void sort_ints(int *a, int n, const dataset *d, ctx_cmp cmp) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && cmp(d, a[j - 1], a[j]) > 0; j--) {
            int t = a[j];
            a[j] = a[j - 1];
            a[j - 1] = t;
        }
}

static int cmp_label(const dataset *d, int x, int y) {
    int rx = method_rank(d->methods.v[d->label_method[x]]);
    int ry = method_rank(d->methods.v[d->label_method[y]]);
    if (rx != ry) return rx - ry;
    return strcmp(d->labels.v[x], d->labels.v[y]);
}

static int cmp_metric(const dataset *d, int x, int y) {
    int rx = metric_rank(d->metrics.v[x]), ry = metric_rank(d->metrics.v[y]);
    if (rx != ry) return rx - ry;
    return strcmp(d->metrics.v[x], d->metrics.v[y]);
}

static int cmp_budget(const dataset *d, int a, int b) {
    const bkey *x = &d->budgets[a], *y = &d->budgets[b];
    if ((x->tokens > 0) != (y->tokens > 0)) return (x->tokens > 0) - (y->tokens > 0);
    if (x->tokens != y->tokens) return x->tokens < y->tokens ? -1 : 1;
    return (x->ratio > y->ratio) - (x->ratio < y->ratio);
}

static void layout_free(layout_t *t) {
    free(t->labels);
    free(t->metrics);
    free(t->budgets);
    memset(t, 0, sizeof *t);
}

static kvs_status layout(const dataset *d, int e, layout_t *t, kvs_err *err) {
    memset(t, 0, sizeof *t);
    t->labels = calloc((size_t)d->labels.n + 1, sizeof(int));
    t->metrics = calloc((size_t)d->metrics.n + 1, sizeof(int));
    t->budgets = calloc((size_t)d->n_budgets + 1, sizeof(int));
    char *seen_l = calloc((size_t)d->labels.n + 1, 1), *seen_m = calloc((size_t)d->metrics.n + 1, 1);
    char *seen_b = calloc((size_t)d->n_budgets + 1, 1);
    if (!t->labels || !t->metrics || !t->budgets || !seen_l || !seen_m || !seen_b) {
        free(seen_l), free(seen_m), free(seen_b);
        layout_free(t);
        return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
    }
    /* budgets that hold a non-full variant; if none, full's own */
    for (int pass = 0; pass < 2 && t->n_budgets == 0; pass++)
        for (int i = 0; i < d->n_groups; i++) {
            const group *g = &d->g[i];
            if (g->exp != e || (pass == 0 && is_full(d, g->label)) || seen_b[g->budget]) continue;
            seen_b[g->budget] = 1;
            t->budgets[t->n_budgets++] = g->budget;
        }
    for (int i = 0; i < d->n_groups; i++) {
        const group *g = &d->g[i];
        if (g->exp != e) continue;
        if (!seen_l[g->label]) seen_l[g->label] = 1, t->labels[t->n_labels++] = g->label;
        /* answer_kept_l<L>: one per model layer, too many for a column each; the
         * long formats (CSV, JSON) carry them and answer_kept is their mean */
        if (!strncmp(d->metrics.v[g->metric], "answer_kept_l", 13)) continue;
        if (!seen_m[g->metric]) seen_m[g->metric] = 1, t->metrics[t->n_metrics++] = g->metric;
    }
    sort_ints(t->labels, t->n_labels, d, cmp_label);
    sort_ints(t->metrics, t->n_metrics, d, cmp_metric);
    sort_ints(t->budgets, t->n_budgets, d, cmp_budget);
    free(seen_l), free(seen_m), free(seen_b);
    return KVS_OK;
}

static void budget_title(const bkey *b, char *out, size_t n) {
    if (b->tokens > 0)
        snprintf(out, n, "%lld tokens", (long long)b->tokens);
    else
        snprintf(out, n, "%g", b->ratio);
}

/* Best group index per metric column among non-full rows at budget b (-1 none). */
static double best_value(const dataset *d, int e, int b, const layout_t *t, int m) {
    int dir = direction(d->metrics.v[m]);
    double best = NAN;
    if (dir == 0) return NAN;
    for (int i = 0; i < t->n_labels; i++) {
        int l = t->labels[i];
        if (is_full(d, l)) continue;
        int gi = find_group(d, e, b, l, m);
        if (gi < 0 || isnan(d->g[gi].mean)) continue;
        double v = d->g[gi].mean;
        if (isnan(best) || (dir < 0 ? v < best : v > best)) best = v;
    }
    return best;
}

/* ---- writers ----------------------------------------------------------------------- */

static void fmt_num(double v, char *out, size_t n) {
    if (isnan(v))
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.4g", v);
}

static void tex_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '_' || *s == '%' || *s == '&' || *s == '#' || *s == '$')
            fprintf(f, "\\%c", *s);
        else
            fputc(*s, f);
    }
}

static kvs_status write_runs(sqlite3 *db, const kvs_report_opts *o, const char *exp, FILE *f,
                             kvs_report_format fmt, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, status, started_at, ended_at, git_rev, config_hash, n_done,"
                           " n_cells FROM runs WHERE experiment = ?1 AND (?2 <= 0 OR id = ?2)"
                           " ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK)
        return sql_fail(db, err, "reading runs");
    sqlite3_bind_text(st, 1, exp, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, o->run_id);
    const char *c = fmt == KVS_REPORT_LATEX ? "% " : "";
    fprintf(f, "%sRuns:\n", c);
    if (fmt == KVS_REPORT_MD) fputc('\n', f);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *git = (const char *)sqlite3_column_text(st, 4);
        const char *hash = (const char *)sqlite3_column_text(st, 5);
        const char *ended = (const char *)sqlite3_column_text(st, 3);
        fprintf(f, "%s- run %lld: %s, %s .. %s, %lld/%lld cells, git %.12s, config %.12s\n", c,
                (long long)sqlite3_column_int64(st, 0), sqlite3_column_text(st, 1),
                sqlite3_column_text(st, 2), ended ? ended : "-",
                (long long)sqlite3_column_int64(st, 6), (long long)sqlite3_column_int64(st, 7),
                git ? git : "none", hash ? hash : "-");
    }
    sqlite3_finalize(st);
    if (r != SQLITE_DONE) return sql_fail(db, err, "reading runs");
    fputc('\n', f);
    return KVS_OK;
}

static void write_table(const dataset *d, int e, int b, const layout_t *t, int primary, FILE *f,
                        kvs_report_format fmt) {
    char bt[64];
    budget_title(&d->budgets[b], bt, sizeof bt);
    const char *pm = d->metrics.v[primary];
    double *best = malloc(sizeof *best * (size_t)(t->n_metrics + 1));
    if (!best) return;
    for (int j = 0; j < t->n_metrics; j++) best[j] = best_value(d, e, b, t, t->metrics[j]);

    if (fmt == KVS_REPORT_MD) {
        fprintf(f, "### budget %s\n\n| method | n |", bt);
        for (int j = 0; j < t->n_metrics; j++) {
            fprintf(f, " %s |", d->metrics.v[t->metrics[j]]);
            if (t->metrics[j] == primary) fprintf(f, " Δ %s vs full |", pm);
        }
        fprintf(f, "\n|---|---:|");
        for (int j = 0; j < t->n_metrics; j++) fprintf(f, t->metrics[j] == primary ? "---:|---:|" : "---:|");
        fputc('\n', f);
    } else {
        fprintf(f, "\\begin{table}[t]\n\\centering\n\\caption{");
        tex_escape(f, d->exps.v[e]);
        fprintf(f, ", budget %s: mean [95\\%% bootstrap CI]}\n\\begin{tabular}{lr", bt);
        for (int j = 0; j < t->n_metrics; j++) fprintf(f, t->metrics[j] == primary ? "rr" : "r");
        fprintf(f, "}\n\\toprule\nmethod & $n$");
        for (int j = 0; j < t->n_metrics; j++) {
            fprintf(f, " & ");
            tex_escape(f, d->metrics.v[t->metrics[j]]);
            if (t->metrics[j] == primary) {
                fprintf(f, " & $\\Delta$ ");
                tex_escape(f, pm);
            }
        }
        fprintf(f, " \\\\\n\\midrule\n");
    }
    for (int i = 0; i < t->n_labels; i++) {
        int l = t->labels[i];
        int pg = cell_group(d, e, b, l, primary);
        int full_label = full_for(d, t->labels, t->n_labels, l);
        int full_g = full_label >= 0 ? cell_group(d, e, b, full_label, primary) : -1;
        int n = -1;
        for (int j = 0; j < t->n_metrics && n < 0; j++) {
            int gi = cell_group(d, e, b, l, t->metrics[j]);
            if (gi >= 0) n = d->g[gi].n;
        }
        if (n < 0) continue; /* this variant has no result at this budget */
        if (fmt == KVS_REPORT_MD)
            fprintf(f, "| %s | %d |", d->labels.v[l], n);
        else {
            tex_escape(f, d->labels.v[l]);
            fprintf(f, " & %d", n);
        }
        for (int j = 0; j < t->n_metrics; j++) {
            int m = t->metrics[j];
            int gi = cell_group(d, e, b, l, m);
            char a[32], lo[32], hi[32], cell[128];
            if (gi < 0) {
                snprintf(cell, sizeof cell, "-");
            } else {
                fmt_num(d->g[gi].mean, a, sizeof a);
                fmt_num(d->g[gi].lo, lo, sizeof lo);
                fmt_num(d->g[gi].hi, hi, sizeof hi);
                snprintf(cell, sizeof cell, "%s [%s, %s]", a, lo, hi);
            }
            int mark = gi >= 0 && !is_full(d, l) && !isnan(best[j]) && d->g[gi].mean == best[j];
            if (fmt == KVS_REPORT_MD)
                fprintf(f, mark ? " **%s** |" : " %s |", cell);
            else
                fprintf(f, mark ? " & \\textbf{%s}" : " & %s", cell);
            if (m == primary) {
                char dl[40];
                if (pg >= 0 && full_g >= 0)
                    snprintf(dl, sizeof dl, "%+.4g", d->g[pg].mean - d->g[full_g].mean);
                else
                    snprintf(dl, sizeof dl, "-");
                if (fmt == KVS_REPORT_MD)
                    fprintf(f, " %s |", dl);
                else
                    fprintf(f, " & %s", dl);
            }
        }
        fprintf(f, fmt == KVS_REPORT_MD ? "\n" : " \\\\\n");
    }
    if (fmt == KVS_REPORT_MD)
        fputc('\n', f);
    else
        fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
    free(best);
}

static void csv_field(FILE *f, const char *s) {
    if (strpbrk(s, ",\"\n")) {
        fputc('"', f);
        for (; *s; s++) {
            if (*s == '"') fputc('"', f);
            fputc(*s, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.12g", v);
}

/* ---- paired comparisons ---------------------------------------------------------- */

/* One row of a table's paired comparisons: variant l against o (full, or the
 * best other compressed variant of the same setting at this budget) on the
 * table's primary metric, over the samples both have. */
typedef struct {
    int l, o, vs_full;
    int test;      /* index of the distinct test (l vs o and o vs l are one) */
    int n, binary; /* pairs; 1 when every paired value is 0 or 1 */
    int64_t b, c;  /* binary: pairs with only l right (b), only o right (c) */
    double delta, lo, hi, p, padj, mde, sd;
} cmp_row;

enum { PAIRED_RESAMPLES_MIN = 1000 };
#define PAIRED_ALPHA 0.05
#define PAIRED_POWER 0.8

/* The best compressed variant other than l with l's bracketed tag at budget
 * b on metric m (higher or lower by direction); -1 when none or unranked. */
static int best_other(const dataset *d, int e, int b, const layout_t *t, int m, int l) {
    const int dir = direction(d->metrics.v[m]);
    const char *tag = strrchr(d->labels.v[l], '[');
    int best = -1;
    double bv = NAN;
    if (dir == 0) return -1;
    for (int i = 0; i < t->n_labels; i++) {
        const int o = t->labels[i];
        if (o == l || is_full(d, o)) continue;
        const char *ot = strrchr(d->labels.v[o], '[');
        if (tag ? !(ot && !strcmp(tag, ot)) : ot != NULL) continue;
        const int gi = find_group(d, e, b, o, m);
        if (gi < 0 || isnan(d->g[gi].mean)) continue;
        const double v = d->g[gi].mean;
        if (best < 0 || (dir < 0 ? v < bv : v > bv)) best = o, bv = v;
    }
    return best;
}

/* Pairs of groups ga (x) and gb (y) by sample: x[i], y[i], i < returned n.
 * pos is scratch [samples] filled with -1 and left so. */
static int pair_up(const dataset *d, const group *ga, const group *gb, int *pos, double *x,
                   double *y) {
    int n = 0;
    for (int i = gb->n - 1; i >= 0; i--) pos[gb->sid[i]] = i; /* first occurrence wins */
    for (int i = 0; i < ga->n; i++) {
        const int j = pos[ga->sid[i]];
        if (j < 0) continue;
        x[n] = ga->x[i];
        y[n] = gb->x[j];
        n++;
    }
    for (int i = 0; i < gb->n; i++) pos[gb->sid[i]] = -1;
    (void)d;
    return n;
}

static uint64_t pair_seed(const dataset *d, int e, int b, int l, int o, uint64_t seed) {
    const char *a = d->labels.v[l], *c = d->labels.v[o];
    if (strcmp(a, c) > 0) { /* one seed per unordered pair: mirrored rows agree */
        const char *t = a;
        a = c, c = t;
    }
    char bt[64];
    snprintf(bt, sizeof bt, "|paired|%.17g|%lld|", d->budgets[b].ratio,
             (long long)d->budgets[b].tokens);
    uint64_t h = fnv1a(d->exps.v[e], 0xcbf29ce484222325ULL);
    h = fnv1a(bt, h);
    h = fnv1a(a, h);
    h = fnv1a("|", h);
    h = fnv1a(c, h);
    return seed ^ h;
}

/* The comparisons of one table (experiment e, budget b, metric m): every
 * compressed variant vs its `full` and vs the best other one; p-values
 * Holm-adjusted across the table's distinct tests. *rows is malloc'd
 * (caller frees); returns the count, -1 out of memory. */
static int paired_rows(const dataset *d, int e, int b, const layout_t *t, int m, int B,
                       uint64_t seed, cmp_row **rows) {
    *rows = NULL;
    int n_rows = 0, cap = 2 * t->n_labels + 1, n_tests = 0, maxn = 1;
    cmp_row *r = calloc((size_t)cap, sizeof *r);
    int *pos = malloc(sizeof(int) * (size_t)(d->samples.v.n + 1));
    for (int i = 0; i < d->n_groups; i++) maxn = d->g[i].n > maxn ? d->g[i].n : maxn;
    double *x = malloc(sizeof(double) * (size_t)maxn), *y = malloc(sizeof(double) * (size_t)maxn);
    double *dd = malloc(sizeof(double) * (size_t)maxn);
    double *tp = calloc((size_t)cap, sizeof(double)), *ta = calloc((size_t)cap, sizeof(double));
    if (!r || !pos || !x || !y || !dd || !tp || !ta) {
        free(r), free(pos), free(x), free(y), free(dd), free(tp), free(ta);
        return -1;
    }
    for (int i = 0; i <= d->samples.v.n; i++) pos[i] = -1;
    for (int i = 0; i < t->n_labels; i++) {
        const int l = t->labels[i];
        if (is_full(d, l) || find_group(d, e, b, l, m) < 0) continue;
        const int others[2] = {full_for(d, t->labels, t->n_labels, l),
                               best_other(d, e, b, t, m, l)};
        for (int k = 0; k < 2; k++) {
            const int o = others[k];
            if (o < 0) continue;
            const int ga = find_group(d, e, b, l, m), gb = cell_group(d, e, b, o, m);
            if (gb < 0) continue;
            cmp_row *c = &r[n_rows];
            memset(c, 0, sizeof *c);
            c->l = l, c->o = o, c->vs_full = k == 0;
            c->n = pair_up(d, &d->g[ga], &d->g[gb], pos, x, y);
            if (c->n == 0) continue;
            c->binary = 1;
            double sd = 0, mean = 0;
            for (int j = 0; j < c->n; j++) {
                c->binary &= (x[j] == 0 || x[j] == 1) && (y[j] == 0 || y[j] == 1);
                dd[j] = x[j] - y[j];
                mean += dd[j];
            }
            mean /= c->n;
            for (int j = 0; j < c->n; j++) sd += (dd[j] - mean) * (dd[j] - mean);
            c->sd = c->n > 1 ? sqrt(sd / (c->n - 1)) : NAN;
            const uint64_t ps = pair_seed(d, e, b, l, o, seed);
            kvs_paired_bootstrap_ci(x, y, c->n, B, ps, &c->delta, &c->lo, &c->hi);
            if (c->binary) {
                for (int j = 0; j < c->n; j++) c->b += x[j] > y[j], c->c += x[j] < y[j];
                c->p = kvs_mcnemar_exact_p(c->b, c->c);
                c->mde = kvs_mde_paired_binary(c->n, (double)(c->b + c->c) / c->n, PAIRED_ALPHA,
                                               PAIRED_POWER);
            } else {
                c->p = kvs_signflip_p(dd, c->n, B > PAIRED_RESAMPLES_MIN ? B : PAIRED_RESAMPLES_MIN,
                                      ps ^ 0x5bd1e995ULL);
                c->mde = kvs_mde_paired_mean(c->n, c->sd, PAIRED_ALPHA, PAIRED_POWER);
            }
            /* one test per unordered pair */
            c->test = -1;
            for (int q = 0; q < n_rows && c->test < 0; q++)
                if (r[q].l == o && r[q].o == l) c->test = r[q].test;
            if (c->test < 0) {
                c->test = n_tests;
                tp[n_tests++] = c->p;
            }
            n_rows++;
        }
    }
    kvs_holm_adjust(tp, n_tests, ta);
    for (int i = 0; i < n_rows; i++) r[i].padj = ta[r[i].test];
    free(pos), free(x), free(y), free(dd), free(tp), free(ta);
    *rows = r;
    return n_rows;
}

static int n_tests_of(const cmp_row *r, int n) {
    int t = 0;
    for (int i = 0; i < n; i++) t = r[i].test + 1 > t ? r[i].test + 1 : t;
    return t;
}

/* The table's own detectable difference: at its mean discordance rate
 * (binary) or mean sd of the differences (otherwise), and its fewest pairs. */
static double table_mde(const cmp_row *r, int n, int *binary, double *rate, int *n_min) {
    double s = 0;
    int k = 0, bin = 1;
    *n_min = 0;
    for (int i = 0; i < n; i++) bin &= r[i].binary;
    for (int i = 0; i < n; i++) {
        if (*n_min == 0 || r[i].n < *n_min) *n_min = r[i].n;
        const double v = bin ? (double)(r[i].b + r[i].c) / r[i].n : r[i].sd;
        if (!isnan(v)) s += v, k++;
    }
    *binary = bin;
    *rate = k ? s / k : NAN;
    return bin ? kvs_mde_paired_binary(*n_min, *rate, PAIRED_ALPHA, PAIRED_POWER)
               : kvs_mde_paired_mean(*n_min, *rate, PAIRED_ALPHA, PAIRED_POWER);
}

static void fmt_p(double p, char *out, size_t n) {
    if (isnan(p))
        snprintf(out, n, "-");
    else if (p < 1e-4)
        snprintf(out, n, "%.1e", p);
    else
        snprintf(out, n, "%.4f", p);
}

/* Markdown / LaTeX: the comparisons of one budget's table, under it. */
static void write_paired(const dataset *d, int e, int b, const layout_t *t, int m, FILE *f,
                         kvs_report_format fmt, int B, uint64_t seed) {
    cmp_row *r = NULL;
    const int n = paired_rows(d, e, b, t, m, B, seed, &r);
    if (n <= 0) {
        free(r);
        return;
    }
    const int md = fmt == KVS_REPORT_MD;
    const char *pm = d->metrics.v[m];
    if (md) {
        fprintf(f, "Paired differences in %s (budget ", pm);
        char bt[64];
        budget_title(&d->budgets[b], bt, sizeof bt);
        fprintf(f, "%s):\n\n| method | vs | pairs | Δ [95%% CI] | b / c | p | p Holm | MDE |\n"
                   "|---|---|---:|---:|---:|---:|---:|---:|\n", bt);
    } else {
        fprintf(f, "\\begin{table}[t]\n\\centering\n\\caption{");
        tex_escape(f, d->exps.v[e]);
        char bt[64];
        budget_title(&d->budgets[b], bt, sizeof bt);
        fprintf(f, ", budget %s: paired differences in ", bt);
        tex_escape(f, pm);
        fprintf(f, "}\n\\begin{tabular}{llrrrrrr}\n\\toprule\nmethod & vs & pairs & $\\Delta$ "
                   "[95\\%% CI] & $b/c$ & $p$ & $p_{\\mathrm{Holm}}$ & MDE \\\\\n\\midrule\n");
    }
    for (int i = 0; i < n; i++) {
        const cmp_row *c = &r[i];
        char a[32], lo[32], hi[32], p[32], pa[32], mde[32], bc[48];
        snprintf(a, sizeof a, "%+.4g", c->delta);
        snprintf(lo, sizeof lo, "%+.4g", c->lo);
        snprintf(hi, sizeof hi, "%+.4g", c->hi);
        fmt_p(c->p, p, sizeof p);
        fmt_p(c->padj, pa, sizeof pa);
        fmt_num(c->mde, mde, sizeof mde);
        if (c->binary)
            snprintf(bc, sizeof bc, "%lld / %lld", (long long)c->b, (long long)c->c);
        else
            snprintf(bc, sizeof bc, "-");
        const int sig = !isnan(c->padj) && c->padj <= PAIRED_ALPHA;
        char vs[200];
        snprintf(vs, sizeof vs, "%s%s", c->vs_full ? "" : "best other: ", d->labels.v[c->o]);
        if (md) {
            fprintf(f, "| %s | %s | %d | %s [%s, %s]%s | %s | %s | %s%s | %s |\n", d->labels.v[c->l],
                    vs, c->n, a, lo, hi, sig ? " *" : "", bc, p, pa, sig ? " *" : "", mde);
        } else {
            tex_escape(f, d->labels.v[c->l]);
            fprintf(f, " & ");
            tex_escape(f, vs);
            fprintf(f, " & %d & %s [%s, %s]%s & %s & %s & %s & %s \\\\\n", c->n, a, lo, hi,
                    sig ? "$^*$" : "", bc, p, pa, mde);
        }
    }
    int bin, n_min;
    double rate;
    const double tm = table_mde(r, n, &bin, &rate, &n_min);
    char tms[32], rs[32];
    fmt_num(tm, tms, sizeof tms);
    fmt_num(rate, rs, sizeof rs);
    const int K = n_tests_of(r, n);
    if (md) {
        fprintf(f, "\nΔ = method − vs, the mean over the samples both were run on (paired by "
                   "sample id); 95%% paired percentile-bootstrap CI (%d resamples of the samples, the "
                   "same resample for both; seed %llu; per comparison, not adjusted). ",
                B, (unsigned long long)seed);
        fprintf(f, "p: two-sided exact McNemar test on the discordant pairs (b: only the method "
                   "right, c: only vs right) for 0/1 scores, a paired sign-flip permutation test "
                   "otherwise. *: significant at %.2g after Holm–Bonferroni across this table's %d "
                   "distinct comparisons (p Holm is the adjusted p). ",
                PAIRED_ALPHA, K);
        if (bin)
            fprintf(f, "MDE: the smallest difference detectable with %.0f%% power by a two-sided "
                       "test at α = %.2g, normal approximation to McNemar's test, (z₀.₉₇₅ + z₀.₈) "
                       "√(p_d / n) with p_d = (b + c) / n the observed discordance rate. This "
                       "table at its mean p_d = %s and n = %d: **MDE = %s**.\n\n",
                    100 * PAIRED_POWER, PAIRED_ALPHA, rs, n_min, tms);
        else
            fprintf(f, "MDE: the smallest difference detectable with %.0f%% power by a two-sided "
                       "test at α = %.2g, normal approximation, (z₀.₉₇₅ + z₀.₈) sd(Δ) / √n. This "
                       "table at its mean sd(Δ) = %s and n = %d: **MDE = %s**.\n\n",
                    100 * PAIRED_POWER, PAIRED_ALPHA, rs, n_min, tms);
    } else {
        fprintf(f, "\\bottomrule\n\\end{tabular}\n\\par\\footnotesize $\\Delta$: paired mean "
                   "difference, 95\\%% paired bootstrap CI (%d resamples, seed %llu; not adjusted); "
                   "$p$: %s; "
                   "$^*$: significant at %.2g after Holm--Bonferroni over %d comparisons; MDE at "
                   "%.0f\\%% power, $\\alpha = %.2g$ two-sided, normal approximation: %s. Table: "
                   "MDE %s at %s, $n = %d$.\n\\end{table}\n\n",
                B, (unsigned long long)seed,
                bin ? "exact McNemar" : "paired sign-flip permutation test", PAIRED_ALPHA, K,
                100 * PAIRED_POWER, PAIRED_ALPHA,
                bin ? "$(z_{0.975} + z_{0.8})\\sqrt{p_d / n}$, $p_d = (b + c)/n$"
                    : "$(z_{0.975} + z_{0.8})\\,\\mathrm{sd}(\\Delta)/\\sqrt{n}$",
                tms, bin ? "mean $p_d$" : "mean sd", n_min);
        (void)rs;
    }
    free(r);
}

/* CSV (a block of its own) and JSON ("paired": [...]): every comparison of
 * every task table. Returns the rows written. */
static int write_paired_long(const dataset *d, FILE *f, kvs_report_format fmt, int B,
                             uint64_t seed) {
    int written = 0;
    for (int e = 0; e < d->exps.n; e++) {
        if (strcmp(d->kinds.v[d->exp_kind[e]], "task")) continue;
        layout_t t;
        if (layout(d, e, &t, NULL)) return written;
        const int m = t.n_metrics ? t.metrics[0] : -1;
        for (int bi = 0; bi < t.n_budgets && m >= 0; bi++) {
            const int b = t.budgets[bi];
            cmp_row *r = NULL;
            const int n = paired_rows(d, e, b, &t, m, B, seed, &r);
            int bin = 0, n_min = 0;
            double rate = NAN, tm = n > 0 ? table_mde(r, n, &bin, &rate, &n_min) : NAN;
            for (int i = 0; i < n; i++) {
                const cmp_row *c = &r[i];
                const bkey *bk = &d->budgets[b];
                if (fmt == KVS_REPORT_CSV) {
                    if (written == 0)
                        fprintf(f, "\nexperiment,budget_ratio,budget_tokens,metric,variant,vs,"
                                   "vs_kind,pairs,binary,delta,ci_lo,ci_hi,b,c,p,p_holm,"
                                   "significant,mde,table_mde\n");
                    csv_field(f, d->exps.v[e]);
                    fprintf(f, ",%.12g,%lld,", bk->ratio, (long long)bk->tokens);
                    csv_field(f, d->metrics.v[m]);
                    fputc(',', f);
                    csv_field(f, d->labels.v[c->l]);
                    fputc(',', f);
                    csv_field(f, d->labels.v[c->o]);
                    fprintf(f, ",%s,%d,%d,%.12g,%.12g,%.12g,", c->vs_full ? "full" : "best_other",
                            c->n, c->binary, c->delta, c->lo, c->hi);
                    if (c->binary)
                        fprintf(f, "%lld,%lld,", (long long)c->b, (long long)c->c);
                    else
                        fprintf(f, ",,");
                    fprintf(f, "%.12g,%.12g,%d,", c->p, c->padj, c->padj <= PAIRED_ALPHA);
                    if (!isnan(c->mde)) fprintf(f, "%.12g", c->mde);
                    fputc(',', f);
                    if (!isnan(tm)) fprintf(f, "%.12g", tm);
                    fputc('\n', f);
                } else {
                    fprintf(f, "%s\n  {\"experiment\": ", written ? "," : "");
                    json_str(f, d->exps.v[e]);
                    fprintf(f, ", \"budget_ratio\": ");
                    json_num(f, bk->ratio);
                    fprintf(f, ", \"budget_tokens\": %lld, \"metric\": ", (long long)bk->tokens);
                    json_str(f, d->metrics.v[m]);
                    fprintf(f, ", \"variant\": ");
                    json_str(f, d->labels.v[c->l]);
                    fprintf(f, ", \"vs\": ");
                    json_str(f, d->labels.v[c->o]);
                    fprintf(f, ", \"vs_kind\": \"%s\", \"pairs\": %d, \"binary\": %s, \"delta\": ",
                            c->vs_full ? "full" : "best_other", c->n, c->binary ? "true" : "false");
                    json_num(f, c->delta);
                    fprintf(f, ", \"ci_lo\": ");
                    json_num(f, c->lo);
                    fprintf(f, ", \"ci_hi\": ");
                    json_num(f, c->hi);
                    if (c->binary)
                        fprintf(f, ", \"b\": %lld, \"c\": %lld", (long long)c->b, (long long)c->c);
                    fprintf(f, ", \"p\": ");
                    json_num(f, c->p);
                    fprintf(f, ", \"p_holm\": ");
                    json_num(f, c->padj);
                    fprintf(f, ", \"significant\": %s, \"mde\": ",
                            c->padj <= PAIRED_ALPHA ? "true" : "false");
                    json_num(f, c->mde);
                    fprintf(f, ", \"table_mde\": ");
                    json_num(f, tm);
                    fputc('}', f);
                }
                written++;
            }
            free(r);
        }
        layout_free(&t);
    }
    return written;
}

/* Long format: one row per (experiment, budget, variant, metric). */
static void write_long(const dataset *d, FILE *f, kvs_report_format fmt, int *first) {
    for (int e = 0; e < d->exps.n; e++) {
        layout_t t;
        if (layout(d, e, &t, NULL)) return;
        int primary = t.n_metrics ? t.metrics[0] : -1;
        for (int bi = 0; bi < t.n_budgets; bi++) {
            int b = t.budgets[bi];
            for (int i = 0; i < t.n_labels; i++) {
                int l = t.labels[i];
                int full_label = full_for(d, t.labels, t.n_labels, l);
                for (int j = 0; j < t.n_metrics; j++) {
                    int m = t.metrics[j];
                    int gi = cell_group(d, e, b, l, m);
                    if (gi < 0) continue;
                    const group *g = &d->g[gi];
                    int fg = full_label >= 0 ? cell_group(d, e, b, full_label, m) : -1;
                    double delta = fg >= 0 ? g->mean - d->g[fg].mean : NAN;
                    double best = best_value(d, e, b, &t, m);
                    int mark = !is_full(d, l) && !isnan(best) && g->mean == best;
                    const bkey *bk = &d->budgets[b];
                    if (fmt == KVS_REPORT_CSV) {
                        csv_field(f, d->exps.v[e]);
                        fprintf(f, ",%s,%.12g,%lld,", d->kinds.v[d->exp_kind[e]], bk->ratio,
                                (long long)bk->tokens);
                        csv_field(f, d->labels.v[l]);
                        fprintf(f, ",%s,%s,%d,%.12g,%.12g,%.12g,", d->methods.v[d->label_method[l]],
                                d->metrics.v[m], g->n, g->mean, g->lo, g->hi);
                        if (isnan(delta))
                            fprintf(f, ",%d,%d\n", mark, m == primary);
                        else
                            fprintf(f, "%.12g,%d,%d\n", delta, mark, m == primary);
                    } else {
                        fprintf(f, "%s\n  {\"experiment\": ", *first ? "" : ",");
                        *first = 0;
                        json_str(f, d->exps.v[e]);
                        fprintf(f, ", \"kind\": ");
                        json_str(f, d->kinds.v[d->exp_kind[e]]);
                        fprintf(f, ", \"budget_ratio\": ");
                        json_num(f, bk->ratio);
                        fprintf(f, ", \"budget_tokens\": %lld, \"variant\": ", (long long)bk->tokens);
                        json_str(f, d->labels.v[l]);
                        fprintf(f, ", \"method\": ");
                        json_str(f, d->methods.v[d->label_method[l]]);
                        fprintf(f, ", \"metric\": ");
                        json_str(f, d->metrics.v[m]);
                        fprintf(f, ", \"n\": %d, \"mean\": ", g->n);
                        json_num(f, g->mean);
                        fprintf(f, ", \"ci_lo\": ");
                        json_num(f, g->lo);
                        fprintf(f, ", \"ci_hi\": ");
                        json_num(f, g->hi);
                        fprintf(f, ", \"delta_vs_full\": ");
                        json_num(f, delta);
                        fprintf(f, ", \"best\": %s}", mark ? "true" : "false");
                    }
                }
            }
        }
        layout_free(&t);
    }
}

/* ---- latency ------------------------------------------------------------------------ */

typedef struct {
    char shape[64], device[32], dtype[16], label[160];
    int64_t n;
    double med, p10, p90;
} lat_row;

static kvs_status gather_latency(sqlite3 *db, const kvs_report_opts *o, lat_row **rows, int *n,
                                 kvs_err *err) {
    sqlite3_stmt *st = NULL;
    *rows = NULL;
    *n = 0;
    int cap = 0;
    kvs_status rc = KVS_OK;
    /* the newest row per (shape, device, dtype, variant, N) */
    const char *sql =
        "SELECT l.shape, l.device, l.dtype, coalesce(c.label, l.method), l.n_tokens, l.median_ms,"
        " l.p10_ms, l.p90_ms FROM latency l LEFT JOIN runs ru ON ru.id = l.run_id"
        " LEFT JOIN cells c ON c.key = l.cell_key"
        " WHERE (?1 IS NULL OR ru.experiment = ?1) AND (?2 <= 0 OR l.run_id = ?2)"
        " AND l.id IN (SELECT max(id) FROM latency GROUP BY shape, device, dtype, method, params,"
        " n_tokens) ORDER BY l.shape, l.device, l.dtype, l.n_tokens";
    if ((rc = prepare_filtered(db, sql, o, &st, "latency query", err))) return rc;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if ((rc = grow((void **)rows, &cap, *n, sizeof **rows, 64, err))) goto cleanup;
        lat_row *x = &(*rows)[(*n)++];
        snprintf(x->shape, sizeof x->shape, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(x->device, sizeof x->device, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(x->dtype, sizeof x->dtype, "%s", (const char *)sqlite3_column_text(st, 2));
        snprintf(x->label, sizeof x->label, "%s", (const char *)sqlite3_column_text(st, 3));
        x->n = sqlite3_column_int64(st, 4);
        x->med = sqlite3_column_double(st, 5);
        x->p10 = sqlite3_column_type(st, 6) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 6);
        x->p90 = sqlite3_column_type(st, 7) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 7);
    }
    if (r != SQLITE_DONE) rc = sql_fail(db, err, "reading latency");
cleanup:
    sqlite3_finalize(st);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

static void write_latency(const lat_row *rows, int n, FILE *f, kvs_report_format fmt) {
    int i = 0;
    while (i < n) {
        int j = i;
        while (j < n && strcmp(rows[j].shape, rows[i].shape) == 0 &&
               strcmp(rows[j].device, rows[i].device) == 0 && strcmp(rows[j].dtype, rows[i].dtype) == 0)
            j++;
        /* methods of this block, in registry order then text */
        const char *meth[64];
        int nm = 0;
        for (int k = i; k < j; k++) {
            int seen = 0;
            for (int q = 0; q < nm; q++) seen |= strcmp(meth[q], rows[k].label) == 0;
            if (!seen && nm < 64) meth[nm++] = rows[k].label;
        }
        for (int a = 1; a < nm; a++)
            for (int b = a; b > 0; b--) {
                char m1[64], m2[64];
                sscanf(meth[b - 1], "%63s", m1);
                sscanf(meth[b], "%63s", m2);
                int r1 = method_rank(m1), r2 = method_rank(m2);
                if (r1 < r2 || (r1 == r2 && strcmp(meth[b - 1], meth[b]) <= 0)) break;
                const char *t = meth[b];
                meth[b] = meth[b - 1];
                meth[b - 1] = t;
            }
        if (fmt == KVS_REPORT_MD) {
            fprintf(f, "### latency: %s, %s, %s (ms: median [p10, p90])\n\n| N |", rows[i].shape,
                    rows[i].device, rows[i].dtype);
            for (int q = 0; q < nm; q++) fprintf(f, " %s |", meth[q]);
            fprintf(f, "\n|---:|");
            for (int q = 0; q < nm; q++) fprintf(f, "---:|");
            fputc('\n', f);
        } else if (fmt == KVS_REPORT_LATEX) {
            fprintf(f, "\\begin{table}[t]\n\\centering\n\\caption{Compression latency (ms, median "
                       "[p10, p90]): ");
            tex_escape(f, rows[i].shape);
            fprintf(f, ", %s, %s}\n\\begin{tabular}{r", rows[i].device, rows[i].dtype);
            for (int q = 0; q < nm; q++) fputc('r', f);
            fprintf(f, "}\n\\toprule\n$N$");
            for (int q = 0; q < nm; q++) {
                fprintf(f, " & ");
                tex_escape(f, meth[q]);
            }
            fprintf(f, " \\\\\n\\midrule\n");
        }
        int k = i;
        while (k < j) {
            int64_t N = rows[k].n;
            int end = k;
            while (end < j && rows[end].n == N) end++;
            if (fmt == KVS_REPORT_MD || fmt == KVS_REPORT_LATEX) {
                fprintf(f, fmt == KVS_REPORT_MD ? "| %lld |" : "%lld", (long long)N);
                for (int q = 0; q < nm; q++) {
                    char cell[128] = "-";
                    for (int x = k; x < end; x++)
                        if (strcmp(rows[x].label, meth[q]) == 0) {
                            char a[32], b[32], c[32];
                            fmt_num(rows[x].med, a, sizeof a);
                            fmt_num(rows[x].p10, b, sizeof b);
                            fmt_num(rows[x].p90, c, sizeof c);
                            snprintf(cell, sizeof cell, "%s [%s, %s]", a, b, c);
                        }
                    fprintf(f, fmt == KVS_REPORT_MD ? " %s |" : " & %s", cell);
                }
                fprintf(f, fmt == KVS_REPORT_MD ? "\n" : " \\\\\n");
            }
            k = end;
        }
        if (fmt == KVS_REPORT_MD)
            fputc('\n', f);
        else if (fmt == KVS_REPORT_LATEX)
            fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
        i = j;
    }
}

/* ---- engine throughput (`kvsieve bench`) ----------------------------------------------- */

typedef struct {
    char model[128], build[32], device[16];
    int64_t run, prompt_len, gen, threads, reps;
    double pf, pf10, pf90, dc, dc10, dc90;
} eng_row;

/* The newest engine_bench row per (model file, device, prompt length, decode
 * tokens, threads, build, host CPU), filtered like the rest of the report
 * (experiment: the runs row's). A database from before schema 3 has none. */
static kvs_status gather_engine(sqlite3 *db, const kvs_report_opts *o, eng_row **rows, int *n,
                                kvs_err *err) {
    sqlite3_stmt *st = NULL;
    *rows = NULL;
    *n = 0;
    int cap = 0;
    kvs_status rc = KVS_OK;
    const char *sql =
        "SELECT e.model, e.build_type, e.device, e.run_id, e.prompt_len, e.gen_tokens, e.threads,"
        " e.repetitions, e.prefill_tok_s, e.prefill_tok_s_p10, e.prefill_tok_s_p90, e.decode_tok_s,"
        " e.decode_tok_s_p10, e.decode_tok_s_p90 FROM engine_bench e JOIN runs ru ON ru.id = e.run_id"
        " WHERE (?1 IS NULL OR ru.experiment = ?1) AND (?2 <= 0 OR e.run_id = ?2)"
        " AND e.id IN (SELECT max(id) FROM engine_bench GROUP BY model_sha256, device, prompt_len,"
        " gen_tokens, threads, build_type, host_cpu)"
        " ORDER BY e.model, e.device, e.prompt_len, e.threads, e.build_type, e.gen_tokens, e.id";
    if ((rc = prepare_filtered(db, sql, o, &st, "engine_bench query", err))) return rc;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if ((rc = grow((void **)rows, &cap, *n, sizeof **rows, 16, err))) goto cleanup;
        eng_row *x = &(*rows)[(*n)++];
        snprintf(x->model, sizeof x->model, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(x->build, sizeof x->build, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(x->device, sizeof x->device, "%s", (const char *)sqlite3_column_text(st, 2));
        int64_t *iv[5] = {&x->run, &x->prompt_len, &x->gen, &x->threads, &x->reps};
        for (int k = 0; k < 5; k++) *iv[k] = sqlite3_column_int64(st, 3 + k);
        double *dv[6] = {&x->pf, &x->pf10, &x->pf90, &x->dc, &x->dc10, &x->dc90};
        for (int k = 0; k < 6; k++)
            *dv[k] = sqlite3_column_type(st, 8 + k) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 8 + k);
    }
    if (r != SQLITE_DONE) rc = sql_fail(db, err, "reading engine_bench");
cleanup:
    sqlite3_finalize(st);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

/* The engine throughput section (nothing when there are no rows): a table
 * (md, LaTeX), a second CSV block after a blank line, or the JSON key
 * "engine" (written before the closing brace of the report object). */
static void write_engine(const eng_row *rows, int n, FILE *f, kvs_report_format fmt) {
    if (n == 0) return;
    if (fmt == KVS_REPORT_MD)
        fprintf(f, "## engine throughput\n\n| model | device | prompt | gen | threads | build | reps | "
                   "prefill tok/s median [p10, p90] | decode tok/s median [p10, p90] | run |\n"
                   "|---|---|---:|---:|---:|---|---:|---:|---:|---:|\n");
    else if (fmt == KVS_REPORT_LATEX)
        fprintf(f, "%% engine throughput\n\\begin{table}[t]\n\\centering\n\\caption{Engine throughput "
                   "(tokens/s, median [p10, p90] over repetitions)}\n\\begin{tabular}{llrrrlrrr}\n"
                   "\\toprule\nmodel & device & prompt & gen & threads & build & reps & prefill & "
                   "decode \\\\\n\\midrule\n");
    else if (fmt == KVS_REPORT_CSV)
        fprintf(f, "\nengine_model,device,prompt_len,gen_tokens,threads,build,repetitions,"
                   "prefill_tok_s,prefill_tok_s_p10,prefill_tok_s_p90,decode_tok_s,decode_tok_s_p10,"
                   "decode_tok_s_p90,run_id\n");
    else
        fprintf(f, ", \"engine\": [");
    for (int i = 0; i < n; i++) {
        const eng_row *x = &rows[i];
        if (fmt == KVS_REPORT_MD || fmt == KVS_REPORT_LATEX) {
            char v[6][32];
            const double dv[6] = {x->pf, x->pf10, x->pf90, x->dc, x->dc10, x->dc90};
            for (int k = 0; k < 6; k++) fmt_num(dv[k], v[k], sizeof v[k]);
            if (fmt == KVS_REPORT_MD) {
                fprintf(f, "| %s | %s | %lld | %lld | %lld | %s | %lld | %s [%s, %s] | %s [%s, %s] | %lld |\n",
                        x->model, x->device, (long long)x->prompt_len, (long long)x->gen,
                        (long long)x->threads, x->build, (long long)x->reps, v[0], v[1], v[2], v[3],
                        v[4], v[5], (long long)x->run);
            } else {
                tex_escape(f, x->model);
                fprintf(f, " & %s & %lld & %lld & %lld & ", x->device, (long long)x->prompt_len,
                        (long long)x->gen, (long long)x->threads);
                tex_escape(f, x->build);
                fprintf(f, " & %lld & %s [%s, %s] & %s [%s, %s] \\\\\n", (long long)x->reps, v[0],
                        v[1], v[2], v[3], v[4], v[5]);
            }
        } else if (fmt == KVS_REPORT_CSV) {
            csv_field(f, x->model);
            fputc(',', f);
            csv_field(f, x->device);
            fprintf(f, ",%lld,%lld,%lld,", (long long)x->prompt_len, (long long)x->gen,
                    (long long)x->threads);
            csv_field(f, x->build);
            fprintf(f, ",%lld", (long long)x->reps);
            const double dv[6] = {x->pf, x->pf10, x->pf90, x->dc, x->dc10, x->dc90};
            for (int k = 0; k < 6; k++) {
                if (isnan(dv[k]))
                    fputc(',', f);
                else
                    fprintf(f, ",%.12g", dv[k]);
            }
            fprintf(f, ",%lld\n", (long long)x->run);
        } else {
            fprintf(f, "%s\n  {\"model\": ", i ? "," : "");
            json_str(f, x->model);
            fprintf(f, ", \"device\": ");
            json_str(f, x->device);
            fprintf(f, ", \"prompt_len\": %lld, \"gen_tokens\": %lld, \"threads\": %lld, \"build\": ",
                    (long long)x->prompt_len, (long long)x->gen, (long long)x->threads);
            json_str(f, x->build);
            fprintf(f, ", \"repetitions\": %lld", (long long)x->reps);
            static const char *const key[6] = {"prefill_tok_s", "prefill_tok_s_p10", "prefill_tok_s_p90",
                                               "decode_tok_s",  "decode_tok_s_p10",  "decode_tok_s_p90"};
            const double dv[6] = {x->pf, x->pf10, x->pf90, x->dc, x->dc10, x->dc90};
            for (int k = 0; k < 6; k++) {
                fprintf(f, ", \"%s\": ", key[k]);
                json_num(f, dv[k]);
            }
            fprintf(f, ", \"run_id\": %lld}", (long long)x->run);
        }
    }
    if (fmt == KVS_REPORT_MD)
        fprintf(f, "\nTokens/s are wall-clock; the newest run per model file, device, prompt length, "
                   "decode length, threads, build and host CPU.\n\n");
    else if (fmt == KVS_REPORT_LATEX)
        fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
    else if (fmt == KVS_REPORT_JSON)
        fprintf(f, "\n]");
}

/* ---- entry points ----------------------------------------------------------------------- */

kvs_status kvs_report_write(kvs_store *s, const kvs_report_opts *o, FILE *f, kvs_err *err) {
    sqlite3 *db = kvs_store_db(s);
    dataset d;
    memset(&d, 0, sizeof d);
    lat_row *lat = NULL;
    eng_row *eng = NULL;
    int n_lat = 0, n_eng = 0;
    kvs_status rc;
    if ((rc = gather(db, o, &d, err))) goto cleanup;
    if ((rc = gather_latency(db, o, &lat, &n_lat, err))) goto cleanup;
    if ((rc = gather_engine(db, o, &eng, &n_eng, err))) goto cleanup;
    compute(&d, o);
    if (d.n_groups == 0 && n_lat == 0 && n_eng == 0) {
        if (o->experiment)
            rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "report: no results for experiment '%s'",
                            o->experiment);
        else if (o->run_id > 0)
            rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "report: no results written by run %lld",
                            (long long)o->run_id);
        else
            rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "report: the database holds no results yet");
        goto cleanup;
    }
    int B = o->bootstrap > 0 ? o->bootstrap : 1000;
    uint64_t seed = o->seed ? o->seed : 20260;
    if (o->format == KVS_REPORT_CSV) {
        fprintf(f, "experiment,kind,budget_ratio,budget_tokens,variant,method,metric,n,mean,ci_lo,"
                   "ci_hi,delta_vs_full,best,primary\n");
        int first = 1;
        write_long(&d, f, KVS_REPORT_CSV, &first);
        write_paired_long(&d, f, KVS_REPORT_CSV, B, seed);
    } else if (o->format == KVS_REPORT_JSON) {
        fprintf(f, "{\"bootstrap\": %d, \"seed\": %llu, \"rows\": [", B, (unsigned long long)seed);
        int first = 1;
        write_long(&d, f, KVS_REPORT_JSON, &first);
        fprintf(f, "\n], \"latency\": [");
        for (int i = 0; i < n_lat; i++) {
            fprintf(f, "%s\n  {\"shape\": ", i ? "," : "");
            json_str(f, lat[i].shape);
            fprintf(f, ", \"device\": ");
            json_str(f, lat[i].device);
            fprintf(f, ", \"dtype\": ");
            json_str(f, lat[i].dtype);
            fprintf(f, ", \"variant\": ");
            json_str(f, lat[i].label);
            fprintf(f, ", \"n_tokens\": %lld, \"median_ms\": ", (long long)lat[i].n);
            json_num(f, lat[i].med);
            fprintf(f, ", \"p10_ms\": ");
            json_num(f, lat[i].p10);
            fprintf(f, ", \"p90_ms\": ");
            json_num(f, lat[i].p90);
            fputc('}', f);
        }
        fprintf(f, "\n]"); /* the object closes after the engine key */
        /* "paired" only when a task table has comparisons */
        char *pj = NULL;
        size_t pn = 0;
        FILE *ms = open_memstream(&pj, &pn);
        if (!ms) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
            goto cleanup;
        }
        const int np = write_paired_long(&d, ms, KVS_REPORT_JSON, B, seed);
        fclose(ms);
        if (np > 0) fprintf(f, ", \"paired\": [%s\n]", pj);
        free(pj);
    } else {
        int md = o->format == KVS_REPORT_MD;
        fprintf(f, md ? "# kvsieve report\n\n" : "%% kvsieve report (needs \\usepackage{booktabs})\n\n");
        for (int e = 0; e < d.exps.n; e++) {
            layout_t t;
            if ((rc = layout(&d, e, &t, err))) goto cleanup;
            if (md)
                fprintf(f, "## %s (%s)\n\n", d.exps.v[e], d.kinds.v[d.exp_kind[e]]);
            else {
                fprintf(f, "%% experiment ");
                tex_escape(f, d.exps.v[e]);
                fprintf(f, " (%s)\n", d.kinds.v[d.exp_kind[e]]);
            }
            if ((rc = write_runs(db, o, d.exps.v[e], f, o->format, err))) {
                layout_free(&t);
                goto cleanup;
            }
            int primary = t.n_metrics ? t.metrics[0] : -1;
            const int task = !strcmp(d.kinds.v[d.exp_kind[e]], "task");
            for (int bi = 0; bi < t.n_budgets && primary >= 0; bi++) {
                write_table(&d, e, t.budgets[bi], &t, primary, f, o->format);
                /* task tables: every variant saw the same samples */
                if (task) write_paired(&d, e, t.budgets[bi], &t, primary, f, o->format, B, seed);
            }
            layout_free(&t);
        }
        if (d.n_groups > 0) {
            int rate = 0; /* the decode rate's mean is a ratio of sums: say so */
            for (int i = 0; i < d.metrics.n; i++) rate |= !strcmp(d.metrics.v[i], "decode_tok_s");
            if (rate)
                fprintf(f, md ? "decode_tok_s: total decoded tokens / total decode time over the "
                                "requests (a mean of per-request rates would favour short answers); "
                                "its CI resamples requests. The variants of one request decode in one "
                                "batch (kvsieve serve), so each variant's decode time is the wall time "
                                "of the batched steps it took part in, shared with its neighbours: the "
                                "column is a per-sequence rate, not the server's throughput, and it "
                                "cannot separate methods; experiments/decode.lua measures decode speed "
                                "per method (one variant per request).\n"
                              : "%% decode_tok_s: total tokens / total decode time\n");
            if (md)
                fprintf(f, "Mean [95%% percentile-bootstrap CI, %d resamples, seed %llu]. **Bold**: "
                           "best per column among the compressed variants (lower is better for "
                           "*_err and *_ms, higher for retention and task scores; kept_ratio is "
                           "not ranked). Δ: difference of means to `full`, which keeps every token "
                           "and is shown in every budget's table.\n\n",
                        B, (unsigned long long)seed);
            else
                fprintf(f, "%% mean [95%% percentile-bootstrap CI, %d resamples, seed %llu]; bold: "
                           "best per column; Delta: difference to full\n\n",
                        B, (unsigned long long)seed);
        }
        if (n_lat > 0) fprintf(f, md ? "## compression latency\n\n" : "%% compression latency\n\n");
        write_latency(lat, n_lat, f, o->format);
    }
    write_engine(eng, n_eng, f, o->format);
    if ((rc = kvs_report_decode(s, o, f, NULL, err))) goto cleanup; /* eval/report_decode.c */
    if (o->format == KVS_REPORT_JSON) fprintf(f, "}\n");
    if (ferror(f)) rc = kvs_errorf(err, KVS_ERR_IO, "report: write failed");
cleanup:
    dataset_free(&d);
    free(lat);
    free(eng);
    return rc;
}

/* ---- plots ---------------------------------------------------------------------------- */

static kvs_status run_gnuplot(const char *script, const char *logf, const char *out, kvs_err *err) {
    pid_t pid = fork();
    if (pid < 0) return kvs_errorf(err, KVS_ERR_IO, "plot: fork failed: %s", strerror(errno));
    if (pid == 0) {
        FILE *lf = freopen(logf, "w", stderr);
        (void)lf;
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return kvs_errorf(err, KVS_ERR_IO, "plot: waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[300] = "";
        FILE *lf = fopen(logf, "r");
        if (lf) {
            size_t k = fread(msg, 1, sizeof msg - 1, lf);
            msg[k] = '\0';
            fclose(lf);
        }
        return kvs_errorf(err, KVS_ERR_IO, "plot: gnuplot failed (status %d) writing %s: %s",
                          WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, msg);
    }
    struct stat sb;
    if (stat(out, &sb) != 0 || sb.st_size == 0)
        return kvs_errorf(err, KVS_ERR_IO, "plot: gnuplot wrote no output to %s", out);
    return KVS_OK;
}

static void terminal_line(FILE *g, int png, const char *out) {
    fprintf(g, "set terminal %s size 900,560\nset output ", png ? "png" : "svg");
    kvs_gp_quote(g, out);
    fprintf(g, "\nset grid\nset key outside right\n");
}

/* ---- needle heatmaps ------------------------------------------------------------- */

/* Needle samples are keyed "L<length>-D<depth>-S<index>" (datasets/needle.c:
 * the configured prompt length and needle depth of the grid); 1 when s is. */
static int needle_key(const char *s, double *len, double *depth) {
    long long L;
    int k, used = 0;
    if (sscanf(s, "L%lld-D%lf-S%d%n", &L, depth, &k, &used) != 3 || s[used] != '\0') return 0;
    *len = (double)L;
    return 1;
}

static int find_value(const double *v, int n, double x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

static void sort_values(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

/* The first experiment (of those reported) whose every sample of the
 * primary metric is a needle key: -1 when none. */
static int needle_experiment(const dataset *d, int *primary) {
    for (int e = 0; e < d->exps.n; e++) {
        layout_t t;
        if (layout(d, e, &t, NULL)) return -1;
        const int m = t.n_metrics ? t.metrics[0] : -1;
        layout_free(&t);
        if (m < 0) continue;
        int any = 0, all = 1;
        for (int i = 0; i < d->n_groups && all; i++) {
            const group *g = &d->g[i];
            if (g->exp != e || g->metric != m) continue;
            for (int j = 0; j < g->n && all; j++) {
                double L, D;
                all = needle_key(d->samples.v.v[g->sid[j]], &L, &D);
                any = 1;
            }
        }
        if (any && all) {
            *primary = m;
            return e;
        }
    }
    return -1;
}

/* One panel per variant and budget (`full` once): the mean score per
 * (length, depth) cell, colour-coded, depth 0 at the top, the value printed
 * in the cell. Written to `target` through gnuplot's multiplot. */
static kvs_status plot_heatmap(const dataset *d, int e, int m, int png, const char *data,
                               const char *script, const char *logf, const char *target,
                               kvs_err *err) {
    kvs_status rc = KVS_OK;
    layout_t t;
    if ((rc = layout(d, e, &t, err))) return rc;
    int cap = 0, nL = 0, nD = 0;
    for (int i = 0; i < d->n_groups; i++)
        if (d->g[i].exp == e && d->g[i].metric == m) cap += d->g[i].n;
    double *lens = malloc(sizeof(double) * (size_t)(cap + 1));
    double *deps = malloc(sizeof(double) * (size_t)(cap + 1));
    int *panel_g = malloc(sizeof(int) * (size_t)(t.n_labels * (t.n_budgets + 1) + 1));
    FILE *df = NULL, *g = NULL;
    double *sum = NULL, *cnt = NULL;
    if (!lens || !deps || !panel_g) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "plot: out of memory");
        goto done;
    }
    double vmin = INFINITY, vmax = -INFINITY;
    for (int i = 0; i < d->n_groups; i++) {
        const group *gr = &d->g[i];
        if (gr->exp != e || gr->metric != m) continue;
        for (int j = 0; j < gr->n; j++) {
            double L, D;
            needle_key(d->samples.v.v[gr->sid[j]], &L, &D);
            if (find_value(lens, nL, L) < 0) lens[nL++] = L;
            if (find_value(deps, nD, D) < 0) deps[nD++] = D;
            vmin = fmin(vmin, gr->x[j]);
            vmax = fmax(vmax, gr->x[j]);
        }
    }
    sort_values(lens, nL);
    sort_values(deps, nD);
    /* panels: labels in table order, full once, others per budget */
    int np = 0;
    for (int i = 0; i < t.n_labels; i++) {
        const int l = t.labels[i];
        for (int bi = 0; bi < t.n_budgets; bi++) {
            const int gi = is_full(d, l) ? cell_group(d, e, t.budgets[bi], l, m)
                                         : find_group(d, e, t.budgets[bi], l, m);
            if (gi < 0) continue;
            panel_g[np++] = gi;
            if (is_full(d, l)) break;
        }
    }
    if (np == 0 || nL == 0 || nD == 0) {
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no needle cells to plot");
        goto done;
    }
    sum = calloc((size_t)nL * (size_t)nD, sizeof *sum);
    cnt = calloc((size_t)nL * (size_t)nD, sizeof *cnt);
    df = fopen(data, "w");
    g = fopen(script, "w");
    if (!sum || !cnt || !df || !g) {
        rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write the heatmap's files");
        goto done;
    }
    for (int k = 0; k < np; k++) {
        const group *gr = &d->g[panel_g[k]];
        memset(sum, 0, sizeof *sum * (size_t)nL * (size_t)nD);
        memset(cnt, 0, sizeof *cnt * (size_t)nL * (size_t)nD);
        for (int j = 0; j < gr->n; j++) {
            double L, D;
            needle_key(d->samples.v.v[gr->sid[j]], &L, &D);
            const int c = find_value(deps, nD, D) * nL + find_value(lens, nL, L);
            sum[c] += gr->x[j];
            cnt[c] += 1;
        }
        for (int y = 0; y < nD; y++) {
            for (int x = 0; x < nL; x++) {
                const int c = y * nL + x;
                if (cnt[c] > 0)
                    fprintf(df, "%d %d %.17g\n", x, y, sum[c] / cnt[c]);
                else
                    fprintf(df, "%d %d NaN\n", x, y);
            }
            fputc('\n', df);
        }
        fprintf(df, "\n");
    }
    const int cols = np < 3 ? np : (np <= 4 ? 2 : 3), rows = (np + cols - 1) / cols;
    fprintf(g, "set terminal %s size %d,%d\nset output ", png ? "png" : "svg", 380 * cols,
            300 * rows + 40);
    kvs_gp_quote(g, target);
    char title[300];
    snprintf(title, sizeof title, "%s: %s by needle depth and prompt length (mean per cell)",
             d->exps.v[e], d->metrics.v[m]);
    fprintf(g, "\nset datafile missing 'NaN'\nset multiplot layout %d,%d title ", rows, cols);
    kvs_gp_quote(g, title);
    fprintf(g, " noenhanced\nset palette defined (0 '#d73027', 0.5 '#fee08b', 1 '#1a9850')\n");
    if (vmin >= 0 && vmax <= 1)
        fprintf(g, "set cbrange [0:1]\n");
    fprintf(g, "set xrange [-0.5:%g]\nset yrange [%g:-0.5]\nset xlabel 'prompt length (tokens)'\n"
               "set ylabel 'needle depth'\nset xtics (",
            nL - 0.5, nD - 0.5);
    for (int x = 0; x < nL; x++) fprintf(g, "%s'%.0f' %d", x ? ", " : "", lens[x], x);
    fprintf(g, ")\nset ytics (");
    for (int y = 0; y < nD; y++) fprintf(g, "%s'%g' %d", y ? ", " : "", deps[y], y);
    fprintf(g, ")\nunset key\nset tics scale 0\n");
    for (int k = 0; k < np; k++) {
        const group *gr = &d->g[panel_g[k]];
        char pt[300], bt[64];
        budget_title(&d->budgets[gr->budget], bt, sizeof bt);
        if (is_full(d, gr->label))
            snprintf(pt, sizeof pt, "%s", d->labels.v[gr->label]);
        else
            snprintf(pt, sizeof pt, "%s @ %s", d->labels.v[gr->label], bt);
        fprintf(g, "set title ");
        kvs_gp_quote(g, pt);
        fprintf(g, " noenhanced\nplot ");
        kvs_gp_quote(g, data);
        fprintf(g, " index %d using 1:2:3 with image, '' index %d using 1:2:(sprintf('%%.2f', "
                   "$3)) with labels\n", k, k);
    }
    fprintf(g, "unset multiplot\n");
    fclose(df);
    fclose(g);
    df = g = NULL;
    rc = run_gnuplot(script, logf, target, err);
done:
    if (df) fclose(df);
    if (g) fclose(g);
    free(lens), free(deps), free(panel_g), free(sum), free(cnt);
    layout_free(&t);
    return rc;
}

kvs_status kvs_report_plot(kvs_store *s, const kvs_report_opts *o, const char *path, kvs_err *err) {
    kvs_status rc = KVS_OK;
    size_t pl = strlen(path);
    int png = pl > 4 && strcmp(path + pl - 4, ".png") == 0;
    int svg = pl > 4 && strcmp(path + pl - 4, ".svg") == 0;
    if (!png && !svg)
        return kvs_errorf(err, KVS_ERR_INVALID, "--plot %s: the file must end in .svg or .png", path);
    if (!kvs_gp_on_path("gnuplot"))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "--plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    dataset d;
    memset(&d, 0, sizeof d);
    lat_row *lat = NULL;
    int n_lat = 0;
    char dir[] = "/tmp/kvsieve-plot-XXXXXX";
    char data[64], script[64], logf[64], out2[1100], out3[1100];
    int have_dir = 0, files = 0;
    if ((rc = gather(kvs_store_db(s), o, &d, err))) goto cleanup;
    if ((rc = gather_latency(kvs_store_db(s), o, &lat, &n_lat, err))) goto cleanup;
    compute(&d, o);
    if (d.n_groups == 0 && n_lat == 0) {
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no results to plot");
        goto cleanup;
    }
    if (!mkdtemp(dir)) {
        rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot create a temporary folder: %s", strerror(errno));
        goto cleanup;
    }
    have_dir = 1;
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    snprintf(logf, sizeof logf, "%s/log", dir);
    if (d.n_groups > 0) {
        /* score vs budget: the first experiment's primary metric, ratio budgets */
        layout_t t;
        if ((rc = layout(&d, 0, &t, err))) goto cleanup;
        int primary = t.metrics[0];
        FILE *df = fopen(data, "w"), *g = fopen(script, "w");
        files = 1;
        if (!df || !g) {
            if (df) fclose(df);
            if (g) fclose(g);
            layout_free(&t);
            rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write in %s", dir);
            goto cleanup;
        }
        terminal_line(g, png, path);
        fprintf(g, "set title ");
        char title[200];
        snprintf(title, sizeof title, "%s: %s vs budget (mean, 95%% CI)", d.exps.v[0],
                 d.metrics.v[primary]);
        kvs_gp_quote(g, title);
        fprintf(g, " noenhanced\nset xlabel 'budget (kept ratio)'\nset ylabel ");
        kvs_gp_quote(g, d.metrics.v[primary]);
        fprintf(g, " noenhanced\nplot ");
        int block = 0;
        for (int i = 0; i < t.n_labels; i++) {
            int l = t.labels[i], rows = 0;
            for (int bi = 0; bi < t.n_budgets; bi++) {
                int b = t.budgets[bi];
                if (d.budgets[b].tokens > 0) continue;
                int gi = cell_group(&d, 0, b, l, primary);
                if (gi < 0) continue;
                fprintf(df, "%.17g %.17g %.17g %.17g\n", d.budgets[b].ratio, d.g[gi].mean,
                        d.g[gi].lo, d.g[gi].hi);
                rows++;
            }
            if (!rows) continue;
            fprintf(df, "\n\n");
            fprintf(g, "%s'%s' index %d using 1:2:3:4 with yerrorlines title ", block ? ", " : "",
                    data, block);
            kvs_gp_quote(g, d.labels.v[l]);
            fprintf(g, " noenhanced");
            block++;
        }
        fputc('\n', g);
        fclose(df);
        fclose(g);
        layout_free(&t);
        if (block == 0) {
            rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no ratio budgets to plot");
            goto cleanup;
        }
        if ((rc = run_gnuplot(script, logf, path, err))) goto cleanup;
    }
    if (n_lat > 0) {
        /* overhead vs N, log-log, first shape/device/dtype block */
        const char *target = path;
        if (d.n_groups > 0) {
            snprintf(out2, sizeof out2, "%.*s-overhead%s", (int)(pl - 4), path, path + pl - 4);
            target = out2;
        }
        FILE *df = fopen(data, "w"), *g = fopen(script, "w");
        files = 1;
        if (!df || !g) {
            if (df) fclose(df);
            if (g) fclose(g);
            rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write in %s", dir);
            goto cleanup;
        }
        terminal_line(g, png, target);
        char title[200];
        snprintf(title, sizeof title, "compression overhead: %s, %s, %s", lat[0].shape,
                 lat[0].device, lat[0].dtype);
        fprintf(g, "set title ");
        kvs_gp_quote(g, title);
        fprintf(g, " noenhanced\nset logscale xy\nset xlabel 'N (tokens)'\nset ylabel 'ms "
                   "(median, p10-p90)'\nplot ");
        int block = 0;
        for (int i = 0; i < n_lat; i++) {
            if (strcmp(lat[i].shape, lat[0].shape) || strcmp(lat[i].device, lat[0].device) ||
                strcmp(lat[i].dtype, lat[0].dtype))
                continue;
            int first = 1;
            for (int k = 0; k < i; k++)
                if (!strcmp(lat[k].label, lat[i].label) && !strcmp(lat[k].shape, lat[0].shape) &&
                    !strcmp(lat[k].device, lat[0].device) && !strcmp(lat[k].dtype, lat[0].dtype))
                    first = 0;
            if (!first) continue;
            for (int k = i; k < n_lat; k++)
                if (!strcmp(lat[k].label, lat[i].label) && !strcmp(lat[k].shape, lat[0].shape) &&
                    !strcmp(lat[k].device, lat[0].device) && !strcmp(lat[k].dtype, lat[0].dtype))
                    fprintf(df, "%lld %.17g %.17g %.17g\n", (long long)lat[k].n, lat[k].med,
                            isnan(lat[k].p10) ? lat[k].med : lat[k].p10,
                            isnan(lat[k].p90) ? lat[k].med : lat[k].p90);
            fprintf(df, "\n\n");
            fprintf(g, "%s'%s' index %d using 1:2:3:4 with yerrorlines title ", block ? ", " : "",
                    data, block);
            kvs_gp_quote(g, lat[i].label);
            fprintf(g, " noenhanced");
            block++;
        }
        fputc('\n', g);
        fclose(df);
        fclose(g);
        if ((rc = run_gnuplot(script, logf, target, err))) goto cleanup;
    }
    int hm_metric = -1;
    const int hm_exp = d.n_groups > 0 ? needle_experiment(&d, &hm_metric) : -1;
    if (hm_exp >= 0) {
        /* needle experiments: the depth x length heatmap per variant */
        snprintf(out3, sizeof out3, "%.*s-heatmap%s", (int)(pl - 4), path, path + pl - 4);
        files = 1;
        if ((rc = plot_heatmap(&d, hm_exp, hm_metric, png, data, script, logf, out3, err)))
            goto cleanup;
    }
    if ((rc = kvs_report_decode_plot(s, o, path, NULL, err))) goto cleanup; /* F-<experiment>.svg */
cleanup:
    if (have_dir) {
        if (files) {
            unlink(data);
            unlink(script);
        }
        unlink(logf);
        rmdir(dir);
    }
    dataset_free(&d);
    free(lat);
    return rc;
}
