/*
 * report_layout.c -- the order and the lookups of the report's tables: which
 * budgets make tables, which variants make rows and which metrics make
 * columns of an experiment, in a fixed order (method registry order, the
 * metrics' preferred order, budgets by size); the group of a table cell;
 * the `full` row a variant is compared with; the best value of a column.
 *
 * What it is not: no SQL (report_data.c), no writing (report.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -1: lower is better, +1 higher, 0 not ranked. */
int kvs_rpt_direction(const char *metric) {
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

int kvs_rpt_method_rank(const char *name) {
    for (int i = 0; i < kvs_methods_count(); i++)
        if (strcmp(kvs_method_at(i)->name, name) == 0) return i;
    return 1000;
}

int kvs_rpt_find_group(const dataset *d, int e, int b, int l, int m) {
    for (int i = 0; i < d->n_groups; i++) {
        const group *g = &d->g[i];
        if (g->exp == e && g->budget == b && g->label == l && g->metric == m) return i;
    }
    return -1;
}

int kvs_rpt_is_full(const dataset *d, int label) {
    return strcmp(d->methods.v[d->label_method[label]], "full") == 0;
}

/* The group of label l for metric m at budget b; full rows come from any budget. */
int kvs_rpt_cell_group(const dataset *d, int e, int b, int l, int m) {
    int i = kvs_rpt_find_group(d, e, b, l, m);
    if (i >= 0 || !kvs_rpt_is_full(d, l)) return i;
    for (int bb = 0; bb < d->n_budgets; bb++)
        if ((i = kvs_rpt_find_group(d, e, bb, l, m)) >= 0) return i;
    return -1;
}

/* The `full` row a variant is compared with: the one with the same
 * bracketed tag (task labels carry " [query_agnostic]" for that mode), of
 * the default cache type where there is one, else any full row; -1 when
 * there is none. */
int kvs_rpt_full_for(const dataset *d, const int *labels, int n_labels, int l) {
    const char *tag = strrchr(d->labels.v[l], '[');
    int any = -1, tagged = -1;
    for (int i = 0; i < n_labels; i++) {
        if (!kvs_rpt_is_full(d, labels[i])) continue;
        const char *ft = strrchr(d->labels.v[labels[i]], '[');
        if (tag ? (ft && !strcmp(tag, ft)) : !ft) {
            /* the full cache of the default type: the reference of every cache type's rows */
            if (!d->caches.v[d->label_cache[labels[i]]][0]) return labels[i];
            if (tagged < 0) tagged = labels[i];
        }
        if (any < 0) any = labels[i];
    }
    return tagged >= 0 ? tagged : any;
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

/* A row's label without its " @T" cache tag (report_data.c's row_label). */
static void base_label(const dataset *d, int l, char *out, size_t n) {
    const char *s = d->labels.v[l], *c = d->caches.v[d->label_cache[l]];
    const char *at = c[0] ? strstr(s, " @") : NULL;
    if (at && !strncmp(at + 2, c, strlen(c)))
        snprintf(out, n, "%.*s%s", (int)(at - s), s, at + 2 + strlen(c));
    else
        snprintf(out, n, "%s", s);
}

/* Method order, then the variant (its mode tag), then the cache type: the
 * default (f16) first. */
static int cmp_label(const dataset *d, int x, int y) {
    int rx = kvs_rpt_method_rank(d->methods.v[d->label_method[x]]);
    int ry = kvs_rpt_method_rank(d->methods.v[d->label_method[y]]);
    if (rx != ry) return rx - ry;
    char bx[320], by[320];
    base_label(d, x, bx, sizeof bx);
    base_label(d, y, by, sizeof by);
    int c = strcmp(bx, by);
    if (c) return c;
    return strcmp(d->caches.v[d->label_cache[x]], d->caches.v[d->label_cache[y]]);
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

void kvs_rpt_layout_free(layout_t *t) {
    free(t->labels);
    free(t->metrics);
    free(t->budgets);
    memset(t, 0, sizeof *t);
}

kvs_status kvs_rpt_layout(const dataset *d, int e, layout_t *t, kvs_err *err) {
    memset(t, 0, sizeof *t);
    t->labels = calloc((size_t)d->labels.n + 1, sizeof(int));
    t->metrics = calloc((size_t)d->metrics.n + 1, sizeof(int));
    t->budgets = calloc((size_t)d->n_budgets + 1, sizeof(int));
    char *seen_l = calloc((size_t)d->labels.n + 1, 1), *seen_m = calloc((size_t)d->metrics.n + 1, 1);
    char *seen_b = calloc((size_t)d->n_budgets + 1, 1);
    if (!t->labels || !t->metrics || !t->budgets || !seen_l || !seen_m || !seen_b) {
        free(seen_l), free(seen_m), free(seen_b);
        kvs_rpt_layout_free(t);
        return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
    }
    /* budgets that hold a non-full variant; if none, full's own */
    for (int pass = 0; pass < 2 && t->n_budgets == 0; pass++)
        for (int i = 0; i < d->n_groups; i++) {
            const group *g = &d->g[i];
            if (g->exp != e || (pass == 0 && kvs_rpt_is_full(d, g->label)) || seen_b[g->budget]) continue;
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

void kvs_rpt_budget_title(const bkey *b, char *out, size_t n) {
    if (b->tokens > 0)
        snprintf(out, n, "%lld tokens", (long long)b->tokens);
    else
        snprintf(out, n, "%g", b->ratio);
}

/* Best group index per metric column among non-full rows at budget b (-1 none). */
double kvs_rpt_best_value(const dataset *d, int e, int b, const layout_t *t, int m) {
    int dir = kvs_rpt_direction(d->metrics.v[m]);
    double best = NAN;
    if (dir == 0) return NAN;
    for (int i = 0; i < t->n_labels; i++) {
        int l = t->labels[i];
        if (kvs_rpt_is_full(d, l)) continue;
        int gi = kvs_rpt_find_group(d, e, b, l, m);
        if (gi < 0 || isnan(d->g[gi].mean)) continue;
        double v = d->g[gi].mean;
        if (isnan(best) || (dir < 0 ? v < best : v > best)) best = v;
    }
    return best;
}
