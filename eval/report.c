/*
 * report.c -- `kvsieve report`: the comparison tables from the results store.
 *
 * What it is: per experiment, its runs and one table per budget (rows: method
 * variants, columns: metrics, mean [95% bootstrap CI], the best compressed
 * value in bold, the difference to `full`), the paired comparisons under task
 * tables, the latency and engine tables, and the decode study; as Markdown or
 * LaTeX, or every (experiment, budget, variant, metric) as a CSV or JSON row.
 * What it is not: it never runs a method (everything comes from the
 * database); the gathering (report_data.c), the order (report_layout.c), the
 * paired comparisons (report_paired.c), the equal-memory table of quantised
 * caches (report_quant.c), the timing tables (report_perf.c),
 * the plots (report_plot.c) and the statistics (stats.c) are files of their own.
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvs_status write_runs(sqlite3 *db, const kvs_report_opts *o, const char *exp, FILE *f,
                             kvs_report_format fmt, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, status, started_at, ended_at, git_rev, config_hash, n_done,"
                           " n_cells FROM runs WHERE experiment = ?1 AND (?2 <= 0 OR id = ?2)"
                           " ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK)
        return kvs_rpt_sql_fail(db, err, "reading runs");
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
    if (r != SQLITE_DONE) return kvs_rpt_sql_fail(db, err, "reading runs");
    fputc('\n', f);
    return KVS_OK;
}

static void write_table(const dataset *d, int e, int b, const layout_t *t, int primary, FILE *f,
                        kvs_report_format fmt) {
    char bt[64];
    kvs_rpt_budget_title(&d->budgets[b], bt, sizeof bt);
    const char *pm = d->metrics.v[primary];
    double *best = malloc(sizeof *best * (size_t)(t->n_metrics + 1));
    if (!best) return;
    for (int j = 0; j < t->n_metrics; j++) best[j] = kvs_rpt_best_value(d, e, b, t, t->metrics[j]);

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
        kvs_rpt_tex_escape(f, d->exps.v[e]);
        fprintf(f, ", budget %s: mean [95\\%% bootstrap CI]}\n\\begin{tabular}{lr", bt);
        for (int j = 0; j < t->n_metrics; j++) fprintf(f, t->metrics[j] == primary ? "rr" : "r");
        fprintf(f, "}\n\\toprule\nmethod & $n$");
        for (int j = 0; j < t->n_metrics; j++) {
            fprintf(f, " & ");
            kvs_rpt_tex_escape(f, d->metrics.v[t->metrics[j]]);
            if (t->metrics[j] == primary) {
                fprintf(f, " & $\\Delta$ ");
                kvs_rpt_tex_escape(f, pm);
            }
        }
        fprintf(f, " \\\\\n\\midrule\n");
    }
    for (int i = 0; i < t->n_labels; i++) {
        int l = t->labels[i];
        int pg = kvs_rpt_cell_group(d, e, b, l, primary);
        int full_label = kvs_rpt_full_for(d, t->labels, t->n_labels, l);
        int full_g = full_label >= 0 ? kvs_rpt_cell_group(d, e, b, full_label, primary) : -1;
        int n = -1;
        for (int j = 0; j < t->n_metrics && n < 0; j++) {
            int gi = kvs_rpt_cell_group(d, e, b, l, t->metrics[j]);
            if (gi >= 0) n = d->g[gi].n;
        }
        if (n < 0) continue; /* this variant has no result at this budget */
        if (fmt == KVS_REPORT_MD)
            fprintf(f, "| %s | %d |", d->labels.v[l], n);
        else {
            kvs_rpt_tex_escape(f, d->labels.v[l]);
            fprintf(f, " & %d", n);
        }
        for (int j = 0; j < t->n_metrics; j++) {
            int m = t->metrics[j];
            int gi = kvs_rpt_cell_group(d, e, b, l, m);
            char a[32], lo[32], hi[32], cell[128];
            if (gi < 0) {
                snprintf(cell, sizeof cell, "-");
            } else {
                kvs_rpt_fmt_num(d->g[gi].mean, a, sizeof a);
                kvs_rpt_fmt_num(d->g[gi].lo, lo, sizeof lo);
                kvs_rpt_fmt_num(d->g[gi].hi, hi, sizeof hi);
                snprintf(cell, sizeof cell, "%s [%s, %s]", a, lo, hi);
            }
            int mark = gi >= 0 && !kvs_rpt_is_full(d, l) && !isnan(best[j]) && d->g[gi].mean == best[j];
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

/* Long format: one row per (experiment, budget, variant, metric). */
static void write_long(const dataset *d, FILE *f, kvs_report_format fmt, int *first) {
    for (int e = 0; e < d->exps.n; e++) {
        layout_t t;
        if (kvs_rpt_layout(d, e, &t, NULL)) return;
        int primary = t.n_metrics ? t.metrics[0] : -1;
        for (int bi = 0; bi < t.n_budgets; bi++) {
            int b = t.budgets[bi];
            for (int i = 0; i < t.n_labels; i++) {
                int l = t.labels[i];
                int full_label = kvs_rpt_full_for(d, t.labels, t.n_labels, l);
                for (int j = 0; j < t.n_metrics; j++) {
                    int m = t.metrics[j];
                    int gi = kvs_rpt_cell_group(d, e, b, l, m);
                    if (gi < 0) continue;
                    const group *g = &d->g[gi];
                    int fg = full_label >= 0 ? kvs_rpt_cell_group(d, e, b, full_label, m) : -1;
                    double delta = fg >= 0 ? g->mean - d->g[fg].mean : NAN;
                    double best = kvs_rpt_best_value(d, e, b, &t, m);
                    int mark = !kvs_rpt_is_full(d, l) && !isnan(best) && g->mean == best;
                    const bkey *bk = &d->budgets[b];
                    if (fmt == KVS_REPORT_CSV) {
                        kvs_rpt_csv_field(f, d->exps.v[e]);
                        fprintf(f, ",%s,%.12g,%lld,", d->kinds.v[d->exp_kind[e]], bk->ratio,
                                (long long)bk->tokens);
                        kvs_rpt_csv_field(f, d->labels.v[l]);
                        fprintf(f, ",%s,%s,%d,%.12g,%.12g,%.12g,", d->methods.v[d->label_method[l]],
                                d->metrics.v[m], g->n, g->mean, g->lo, g->hi);
                        if (isnan(delta))
                            fprintf(f, ",%d,%d\n", mark, m == primary);
                        else
                            fprintf(f, "%.12g,%d,%d\n", delta, mark, m == primary);
                    } else {
                        fprintf(f, "%s\n  {\"experiment\": ", *first ? "" : ",");
                        *first = 0;
                        kvs_rpt_json_str(f, d->exps.v[e]);
                        fprintf(f, ", \"kind\": ");
                        kvs_rpt_json_str(f, d->kinds.v[d->exp_kind[e]]);
                        fprintf(f, ", \"budget_ratio\": ");
                        kvs_rpt_json_num(f, bk->ratio);
                        fprintf(f, ", \"budget_tokens\": %lld, \"variant\": ", (long long)bk->tokens);
                        kvs_rpt_json_str(f, d->labels.v[l]);
                        fprintf(f, ", \"method\": ");
                        kvs_rpt_json_str(f, d->methods.v[d->label_method[l]]);
                        fprintf(f, ", \"metric\": ");
                        kvs_rpt_json_str(f, d->metrics.v[m]);
                        fprintf(f, ", \"n\": %d, \"mean\": ", g->n);
                        kvs_rpt_json_num(f, g->mean);
                        fprintf(f, ", \"ci_lo\": ");
                        kvs_rpt_json_num(f, g->lo);
                        fprintf(f, ", \"ci_hi\": ");
                        kvs_rpt_json_num(f, g->hi);
                        fprintf(f, ", \"delta_vs_full\": ");
                        kvs_rpt_json_num(f, delta);
                        fprintf(f, ", \"best\": %s}", mark ? "true" : "false");
                    }
                }
            }
        }
        kvs_rpt_layout_free(&t);
    }
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
    if ((rc = kvs_rpt_gather(db, o, &d, err))) goto cleanup;
    if ((rc = kvs_rpt_gather_latency(db, o, &lat, &n_lat, err))) goto cleanup;
    if ((rc = kvs_rpt_gather_engine(db, o, &eng, &n_eng, err))) goto cleanup;
    kvs_rpt_compute(&d, o);
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
        kvs_rpt_write_paired_long(&d, f, KVS_REPORT_CSV, B, seed);
    } else if (o->format == KVS_REPORT_JSON) {
        fprintf(f, "{\"bootstrap\": %d, \"seed\": %llu, \"rows\": [", B, (unsigned long long)seed);
        int first = 1;
        write_long(&d, f, KVS_REPORT_JSON, &first);
        fprintf(f, "\n], \"latency\": [");
        for (int i = 0; i < n_lat; i++) {
            fprintf(f, "%s\n  {\"shape\": ", i ? "," : "");
            kvs_rpt_json_str(f, lat[i].shape);
            fprintf(f, ", \"device\": ");
            kvs_rpt_json_str(f, lat[i].device);
            fprintf(f, ", \"dtype\": ");
            kvs_rpt_json_str(f, lat[i].dtype);
            fprintf(f, ", \"variant\": ");
            kvs_rpt_json_str(f, lat[i].label);
            fprintf(f, ", \"n_tokens\": %lld, \"median_ms\": ", (long long)lat[i].n);
            kvs_rpt_json_num(f, lat[i].med);
            fprintf(f, ", \"p10_ms\": ");
            kvs_rpt_json_num(f, lat[i].p10);
            fprintf(f, ", \"p90_ms\": ");
            kvs_rpt_json_num(f, lat[i].p90);
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
        const int np = kvs_rpt_write_paired_long(&d, ms, KVS_REPORT_JSON, B, seed);
        fclose(ms);
        if (np > 0) fprintf(f, ", \"paired\": [%s\n]", pj);
        free(pj);
    } else {
        int md = o->format == KVS_REPORT_MD;
        fprintf(f, md ? "# kvsieve report\n\n" : "%% kvsieve report (needs \\usepackage{booktabs})\n\n");
        for (int e = 0; e < d.exps.n; e++) {
            layout_t t;
            if ((rc = kvs_rpt_layout(&d, e, &t, err))) goto cleanup;
            if (md)
                fprintf(f, "## %s (%s)\n\n", d.exps.v[e], d.kinds.v[d.exp_kind[e]]);
            else {
                fprintf(f, "%% experiment ");
                kvs_rpt_tex_escape(f, d.exps.v[e]);
                fprintf(f, " (%s)\n", d.kinds.v[d.exp_kind[e]]);
            }
            if ((rc = write_runs(db, o, d.exps.v[e], f, o->format, err))) {
                kvs_rpt_layout_free(&t);
                goto cleanup;
            }
            int primary = t.n_metrics ? t.metrics[0] : -1;
            const int task = !strcmp(d.kinds.v[d.exp_kind[e]], "task");
            for (int bi = 0; bi < t.n_budgets && primary >= 0; bi++) {
                write_table(&d, e, t.budgets[bi], &t, primary, f, o->format);
                /* task tables: every variant saw the same samples */
                if (task) kvs_rpt_write_paired(&d, e, t.budgets[bi], &t, primary, f, o->format, B, seed);
            }
            if (task) kvs_rpt_write_equal_bytes(&d, e, &t, primary, f, o->format); /* report_quant.c */
            kvs_rpt_layout_free(&t);
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
        kvs_rpt_write_latency(lat, n_lat, f, o->format);
    }
    kvs_rpt_write_engine(eng, n_eng, f, o->format);
    if ((rc = kvs_report_decode(s, o, f, NULL, err))) goto cleanup; /* eval/report_decode.c */
    if (o->format == KVS_REPORT_JSON) fprintf(f, "}\n");
    if (ferror(f)) rc = kvs_errorf(err, KVS_ERR_IO, "report: write failed");
cleanup:
    kvs_rpt_dataset_free(&d);
    free(lat);
    free(eng);
    return rc;
}
