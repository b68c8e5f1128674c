/*
 * report_perf.c -- the report's timing tables: compression latency (kind
 * overhead: N x method, median, p10, p90, from the latency table) and the
 * engine throughput of `kvsieve bench` (engine_bench rows), each read from
 * the store and written in every output format.
 *
 * What it is not: no timing of its own (eval/overhead.c, cli/ bench), no
 * score tables (report.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- latency ------------------------------------------------------------------------ */

kvs_status kvs_rpt_gather_latency(sqlite3 *db, const kvs_report_opts *o, lat_row **rows, int *n,
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
    if ((rc = kvs_rpt_prepare_filtered(db, sql, o, &st, "latency query", err))) return rc;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if ((rc = kvs_rpt_grow((void **)rows, &cap, *n, sizeof **rows, 64, err))) goto cleanup;
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
    if (r != SQLITE_DONE) rc = kvs_rpt_sql_fail(db, err, "reading latency");
cleanup:
    sqlite3_finalize(st);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

void kvs_rpt_write_latency(const lat_row *rows, int n, FILE *f, kvs_report_format fmt) {
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
                int r1 = kvs_rpt_method_rank(m1), r2 = kvs_rpt_method_rank(m2);
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
            kvs_rpt_tex_escape(f, rows[i].shape);
            fprintf(f, ", %s, %s}\n\\begin{tabular}{r", rows[i].device, rows[i].dtype);
            for (int q = 0; q < nm; q++) fputc('r', f);
            fprintf(f, "}\n\\toprule\n$N$");
            for (int q = 0; q < nm; q++) {
                fprintf(f, " & ");
                kvs_rpt_tex_escape(f, meth[q]);
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
                            kvs_rpt_fmt_num(rows[x].med, a, sizeof a);
                            kvs_rpt_fmt_num(rows[x].p10, b, sizeof b);
                            kvs_rpt_fmt_num(rows[x].p90, c, sizeof c);
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

/* The newest engine_bench row per (model file, device, prompt length, decode
 * tokens, threads, build, host CPU), filtered like the rest of the report
 * (experiment: the runs row's). A database from before schema 3 has none. */
kvs_status kvs_rpt_gather_engine(sqlite3 *db, const kvs_report_opts *o, eng_row **rows, int *n,
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
    if ((rc = kvs_rpt_prepare_filtered(db, sql, o, &st, "engine_bench query", err))) return rc;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if ((rc = kvs_rpt_grow((void **)rows, &cap, *n, sizeof **rows, 16, err))) goto cleanup;
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
    if (r != SQLITE_DONE) rc = kvs_rpt_sql_fail(db, err, "reading engine_bench");
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
void kvs_rpt_write_engine(const eng_row *rows, int n, FILE *f, kvs_report_format fmt) {
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
            for (int k = 0; k < 6; k++) kvs_rpt_fmt_num(dv[k], v[k], sizeof v[k]);
            if (fmt == KVS_REPORT_MD) {
                fprintf(f, "| %s | %s | %lld | %lld | %lld | %s | %lld | %s [%s, %s] | %s [%s, %s] | %lld |\n",
                        x->model, x->device, (long long)x->prompt_len, (long long)x->gen,
                        (long long)x->threads, x->build, (long long)x->reps, v[0], v[1], v[2], v[3],
                        v[4], v[5], (long long)x->run);
            } else {
                kvs_rpt_tex_escape(f, x->model);
                fprintf(f, " & %s & %lld & %lld & %lld & ", x->device, (long long)x->prompt_len,
                        (long long)x->gen, (long long)x->threads);
                kvs_rpt_tex_escape(f, x->build);
                fprintf(f, " & %lld & %s [%s, %s] & %s [%s, %s] \\\\\n", (long long)x->reps, v[0],
                        v[1], v[2], v[3], v[4], v[5]);
            }
        } else if (fmt == KVS_REPORT_CSV) {
            kvs_rpt_csv_field(f, x->model);
            fputc(',', f);
            kvs_rpt_csv_field(f, x->device);
            fprintf(f, ",%lld,%lld,%lld,", (long long)x->prompt_len, (long long)x->gen,
                    (long long)x->threads);
            kvs_rpt_csv_field(f, x->build);
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
            kvs_rpt_json_str(f, x->model);
            fprintf(f, ", \"device\": ");
            kvs_rpt_json_str(f, x->device);
            fprintf(f, ", \"prompt_len\": %lld, \"gen_tokens\": %lld, \"threads\": %lld, \"build\": ",
                    (long long)x->prompt_len, (long long)x->gen, (long long)x->threads);
            kvs_rpt_json_str(f, x->build);
            fprintf(f, ", \"repetitions\": %lld", (long long)x->reps);
            static const char *const key[6] = {"prefill_tok_s", "prefill_tok_s_p10", "prefill_tok_s_p90",
                                               "decode_tok_s",  "decode_tok_s_p10",  "decode_tok_s_p90"};
            const double dv[6] = {x->pf, x->pf10, x->pf90, x->dc, x->dc10, x->dc90};
            for (int k = 0; k < 6; k++) {
                fprintf(f, ", \"%s\": ", key[k]);
                kvs_rpt_json_num(f, dv[k]);
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
