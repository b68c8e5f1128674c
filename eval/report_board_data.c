/*
 * report_board_data.c -- the shape of a leaderboard (board, report_internal.h):
 * its settings (query_agnostic first), the variants of each, the compressed
 * kept ratios (largest first), full's own budget, the RULER tasks present
 * and the ratio nearest 0.25; the setting and name of a label; a cell's
 * group. Shared by the board's writers (report_board.c, report_prov.c,
 * report_svg.c).
 * What it is not: no gathering (report_data.c), no writing.
 */
#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The setting a label belongs to: the text in its brackets, else query_aware. */
void kvs_rpt_board_setting(const char *label, char *out, size_t n) {
    const char *t = strrchr(label, '[');
    const char *e = t ? strchr(t, ']') : NULL;
    if (t && e)
        snprintf(out, n, "%.*s", (int)(e - t - 1), t + 1);
    else
        snprintf(out, n, "query_aware");
}

/* The label less its bracketed setting. */
void kvs_rpt_board_name(const char *label, char *out, size_t n) {
    const char *t = strrchr(label, '[');
    size_t l = t ? (size_t)(t - label) : strlen(label);
    while (l > 0 && label[l - 1] == ' ') l--;
    snprintf(out, n, "%.*s", (int)l, label);
}

static int find_name(const names *t, const char *s) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->v[i], s)) return i;
    return -1;
}

static int cmp_ratio_desc(const dataset *d, int a, int b) {
    double x = d->budgets[a].ratio, y = d->budgets[b].ratio;
    return (x < y) - (x > y);
}

void kvs_rpt_board_free(board *bd) {
    for (int s = 0; s < 2; s++) free(bd->rows[s]);
    free(bd->tasks);
    free(bd->budgets);
    memset(bd, 0, sizeof *bd);
}

kvs_status kvs_rpt_board_build(const dataset *d, int e, board *bd, kvs_err *err) {
    memset(bd, 0, sizeof *bd);
    bd->d = d;
    bd->e = e;
    bd->full_b = -1;
    bd->m_avg = find_name(&d->metrics, "ruler");
    if (bd->m_avg < 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "report --board: experiment '%s' has no 'ruler' scores (the board is for "
                          "RULER task experiments such as experiments/leaderboard.lua)",
                          d->exps.v[e]);
    layout_t t;
    kvs_status rc = kvs_rpt_layout(d, e, &t, err);
    if (rc) return rc;
    bd->rows[0] = calloc((size_t)t.n_labels + 1, sizeof(int));
    bd->rows[1] = calloc((size_t)t.n_labels + 1, sizeof(int));
    bd->tasks = calloc((size_t)d->metrics.n + 1, sizeof(int));
    bd->budgets = calloc((size_t)d->n_budgets + 1, sizeof(int));
    if (!bd->rows[0] || !bd->rows[1] || !bd->tasks || !bd->budgets) {
        kvs_rpt_layout_free(&t);
        kvs_rpt_board_free(bd);
        return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
    }
    /* settings in a fixed order: query_agnostic (kvpress's) first */
    for (int i = 0; i < t.n_labels; i++) {
        char s[32];
        kvs_rpt_board_setting(d->labels.v[t.labels[i]], s, sizeof s);
        int k = -1;
        for (int j = 0; j < bd->n_set; j++)
            if (!strcmp(bd->set[j], s)) k = j;
        if (k < 0 && bd->n_set < 2) snprintf(bd->set[k = bd->n_set++], sizeof bd->set[0], "%s", s);
        if (k >= 0) bd->rows[k][bd->n_rows[k]++] = t.labels[i];
    }
    if (bd->n_set == 2 && strcmp(bd->set[1], "query_agnostic") == 0) {
        char tmp[32];
        int *tr = bd->rows[0], tn = bd->n_rows[0];
        snprintf(tmp, sizeof tmp, "%s", bd->set[0]);
        snprintf(bd->set[0], sizeof bd->set[0], "%s", bd->set[1]);
        snprintf(bd->set[1], sizeof bd->set[1], "%s", tmp);
        bd->rows[0] = bd->rows[1], bd->n_rows[0] = bd->n_rows[1];
        bd->rows[1] = tr, bd->n_rows[1] = tn;
    }
    /* compressed budgets by ratio, largest first; full's own budget */
    for (int i = 0; i < t.n_budgets; i++) {
        const int b = t.budgets[i];
        int compressed = 0;
        for (int g = 0; g < d->n_groups && !compressed; g++)
            compressed = d->g[g].exp == e && d->g[g].budget == b && !kvs_rpt_is_full(d, d->g[g].label);
        if (compressed) bd->budgets[bd->n_budgets++] = b;
    }
    for (int i = 1; i < bd->n_budgets; i++)
        for (int j = i; j > 0 && cmp_ratio_desc(d, bd->budgets[j - 1], bd->budgets[j]) > 0; j--) {
            int x = bd->budgets[j];
            bd->budgets[j] = bd->budgets[j - 1];
            bd->budgets[j - 1] = x;
        }
    for (int g = 0; g < d->n_groups && bd->full_b < 0; g++)
        if (d->g[g].exp == e && kvs_rpt_is_full(d, d->g[g].label)) bd->full_b = d->g[g].budget;
    /* tasks: the standard ones in RULER's order, then any other task metric
     * (a config's own task) is not known here and stays in scores.csv only */
    for (const char *const *tn = kvs_ruler_task_names(); *tn; tn++) {
        const int m = find_name(&d->metrics, *tn);
        if (m < 0) continue;
        int present = 0;
        for (int g = 0; g < d->n_groups && !present; g++) present = d->g[g].exp == e && d->g[g].metric == m;
        if (present) bd->tasks[bd->n_tasks++] = m;
    }
    /* the budget nearest 0.25 for the per-task table and heat map */
    bd->b_task = -1;
    for (int i = 0; i < bd->n_budgets; i++) {
        const int b = bd->budgets[i];
        if (bd->b_task < 0 || fabs(d->budgets[b].ratio - 0.25) < fabs(d->budgets[bd->b_task].ratio - 0.25))
            bd->b_task = b;
    }
    kvs_rpt_layout_free(&t);
    return KVS_OK;
}

/* Group of (label, budget, metric), full rows from their own budget. */
int kvs_rpt_board_group(const board *bd, int l, int b, int m) {
    return kvs_rpt_cell_group(bd->d, bd->e, b, l, m);
}

