/*
 * report_quant.c -- the report's equal-memory table of a task experiment
 * whose rows hold more than one KV cache type (experiments/quant.lua): each
 * `full` row of a quantised cache type (q8_0, q4_0, ...) beside the evicted
 * rows of the default-type (f16) cache whose measured KV bytes are nearest
 * to it, so that "keep every token at fewer bits" and "keep fewer tokens at
 * 16 bits" are read at (nearly) the same memory.
 *
 * What it is: a pairing by the cells' measured bytes (the mean of the
 * kv_kept_mb column, the server's bytes after eviction and quantisation):
 * per evicted variant the budget nearest in bytes (ratio of the logarithms),
 * shown when the two are within 25% of each other, with the primary
 * metric's means and their difference. What it is not: no statistics of its
 * own (the means are the tables' groups), no other tables (report.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define EQUAL_BYTES_TOL 0.25 /* |evicted / quantised - 1| at most this */

static int metric_index(const dataset *d, const char *name) {
    for (int i = 0; i < d->metrics.n; i++)
        if (!strcmp(d->metrics.v[i], name)) return i;
    return -1;
}

static double group_mean(const dataset *d, int e, int b, int l, int m) {
    const int g = m >= 0 ? kvs_rpt_cell_group(d, e, b, l, m) : -1;
    return g >= 0 ? d->g[g].mean : NAN;
}

static const char *cache_of(const dataset *d, int l) {
    return d->caches.v[d->label_cache[l]];
}

/* Rows of one prompt mode: the same " [mode]" tag, or none on both. */
static int same_tag(const dataset *d, int a, int b) {
    const char *x = strrchr(d->labels.v[a], '['), *y = strrchr(d->labels.v[b], '[');
    return x && y ? !strcmp(x, y) : !x && !y;
}

void kvs_rpt_write_equal_bytes(const dataset *d, int e, const layout_t *t, int primary, FILE *f,
                               kvs_report_format fmt) {
    const int mb = metric_index(d, "kv_kept_mb");
    if (mb < 0 || primary < 0 || t->n_budgets == 0) return;
    const int md = fmt == KVS_REPORT_MD;
    const char *pm = d->metrics.v[primary];
    int n_quant = 0, n_rows = 0;
    for (int i = 0; i < t->n_labels; i++) {
        const int lq = t->labels[i];
        if (!kvs_rpt_is_full(d, lq) || !cache_of(d, lq)[0]) continue;
        const double bq = group_mean(d, e, t->budgets[0], lq, mb), sq = group_mean(d, e, t->budgets[0], lq, primary);
        if (!(bq > 0)) continue;
        n_quant++;
        for (int j = 0; j < t->n_labels; j++) {
            const int le = t->labels[j];
            if (kvs_rpt_is_full(d, le) || cache_of(d, le)[0] || !same_tag(d, lq, le)) continue;
            int best = -1;
            double bbest = NAN;
            for (int k = 0; k < t->n_budgets; k++) {
                const double be = group_mean(d, e, t->budgets[k], le, mb);
                if (!(be > 0)) continue;
                if (best < 0 || fabs(log(be / bq)) < fabs(log(bbest / bq))) best = t->budgets[k], bbest = be;
            }
            if (best < 0 || fabs(bbest / bq - 1) > EQUAL_BYTES_TOL) continue;
            const double se = group_mean(d, e, best, le, primary);
            if (n_rows++ == 0) {
                if (md)
                    fprintf(f, "### equal memory: quantised full cache vs evicted f16 cache\n\n"
                               "| full cache | KV MiB | %s | evicted (f16) | budget | KV MiB | %s | bytes "
                               "ratio | Δ %s (evicted − quantised) |\n|---|---:|---:|---|---:|---:|---:|---:|---:|\n",
                            pm, pm, pm);
                else {
                    fprintf(f, "\\begin{table}[t]\n\\centering\n\\caption{");
                    kvs_rpt_tex_escape(f, d->exps.v[e]);
                    fprintf(f, ": equal memory, quantised full cache vs evicted f16 cache}\n"
                               "\\begin{tabular}{lrrlrrrrr}\n\\toprule\nfull cache & MiB & ");
                    kvs_rpt_tex_escape(f, pm);
                    fprintf(f, " & evicted & budget & MiB & ");
                    kvs_rpt_tex_escape(f, pm);
                    fprintf(f, " & ratio & $\\Delta$ \\\\\n\\midrule\n");
                }
            }
            char bt[64], a[32], b[32];
            kvs_rpt_budget_title(&d->budgets[best], bt, sizeof bt);
            kvs_rpt_fmt_num(sq, a, sizeof a);
            kvs_rpt_fmt_num(se, b, sizeof b);
            if (md) {
                fprintf(f, "| %s | %.3f | %s | %s | %s | %.3f | %s | %.3f |", d->labels.v[lq], bq, a,
                        d->labels.v[le], bt, bbest, b, bbest / bq);
                if (isnan(se) || isnan(sq)) fprintf(f, " - |\n");
                else fprintf(f, " %+.4g |\n", se - sq);
            } else {
                kvs_rpt_tex_escape(f, d->labels.v[lq]);
                fprintf(f, " & %.3f & %s & ", bq, a);
                kvs_rpt_tex_escape(f, d->labels.v[le]);
                fprintf(f, " & %s & %.3f & %s & %.3f & ", bt, bbest, b, bbest / bq);
                if (isnan(se) || isnan(sq)) fprintf(f, "- \\\\\n");
                else fprintf(f, "%+.4g \\\\\n", se - sq);
            }
        }
    }
    if (n_rows > 0 && md)
        fprintf(f, "\nKV MiB: the mean kept cache the server measured (after eviction and in the row's cache "
                   "type); each evicted variant at its budget nearest in bytes to the quantised full cache, "
                   "shown within %.0f%% of it.\n\n", 100 * EQUAL_BYTES_TOL);
    else if (n_rows > 0)
        fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
    else if (n_quant > 0 && md)
        fprintf(f, "Equal memory: no evicted f16 row within %.0f%% of a quantised full cache's bytes.\n\n",
                100 * EQUAL_BYTES_TOL);
}
