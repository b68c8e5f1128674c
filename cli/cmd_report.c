/*
 * cmd_report.c -- `kvsieve report`: tables and plots from the results
 * database (SQL over the store; nothing is re-run). The work is eval/report.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_eval.h"

static void report_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve report [--db PATH] [--experiment NAME | --run ID]\n"
            "                      [--format md|latex|csv|json] [--out FILE] [--plot FILE.svg|.png]\n"
            "                      [--bootstrap B] [--seed S]\n"
            "       kvsieve report --experiment NAME --board DIR [--note FILE] [--db PATH]\n"
            "  tables: method x metric per budget, mean [95%% bootstrap CI], delta vs full, best\n"
            "  marked; task tables add paired differences (vs full, vs the best other variant:\n"
            "  paired bootstrap CI, exact McNemar p, Holm-Bonferroni marks, detectable difference);\n"
            "  latency tables (N x method, median [p10, p90]) when latency rows exist.\n"
            "  --plot  score vs budget (and overhead vs N, log-log, when latency rows exist) via\n"
            "          gnuplot; needle experiments also get FILE-heatmap.svg (depth x length per\n"
            "          variant)\n"
            "  --board DIR  the leaderboard of one RULER experiment (experiments/leaderboard.lua)\n"
            "          into DIR: scores.csv, summary.md, leaderboard.svg, tasks.svg,\n"
            "          provenance.json; --note FILE puts FILE's text under summary.md's title\n");
}

/* The whole of a small text file (--note), or NULL. */
static char *read_note(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *t = NULL;
    size_t n = 0, cap = 0;
    int c;
    while ((c = fgetc(f)) != EOF && n < (1u << 16)) {
        if (n + 2 > cap) {
            char *nt = realloc(t, cap = cap ? 2 * cap : 1024);
            if (!nt) break;
            t = nt;
        }
        t[n++] = (char)c;
    }
    fclose(f);
    if (t) {
        while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == ' ')) n--;
        t[n] = '\0';
    }
    return t ? t : calloc(1, 1);
}

int kvs_cmd_report(int argc, char **argv) {
    const char *db = KVS_STORE_DEFAULT_PATH, *out = NULL, *plot = NULL, *board = NULL, *note = NULL;
    kvs_report_opts o;
    memset(&o, 0, sizeof o);
    o.format = KVS_REPORT_MD;
    o.bootstrap = 1000;
    o.seed = 20260;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            report_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--db")) {
            if (!(db = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--experiment")) {
            if (!(o.experiment = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--run")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int("--run", v, 1, 1L << 62, &x))
                return 2;
            o.run_id = x;
        } else if (!strcmp(a, "--format")) {
            if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "md")) o.format = KVS_REPORT_MD;
            else if (!strcmp(v, "latex")) o.format = KVS_REPORT_LATEX;
            else if (!strcmp(v, "csv")) o.format = KVS_REPORT_CSV;
            else if (!strcmp(v, "json")) o.format = KVS_REPORT_JSON;
            else {
                fprintf(stderr, "kvsieve report: --format must be md, latex, csv or json, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--out")) {
            if (!(out = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--board")) {
            if (!(board = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--note")) {
            if (!(note = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--plot")) {
            if (!(plot = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--bootstrap")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) ||
                kvs_arg_int("--bootstrap", v, 2, 1000000, &x))
                return 2;
            o.bootstrap = (int)x;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int("--seed", v, 1, 1L << 62, &x))
                return 2;
            o.seed = (uint64_t)x;
        } else {
            fprintf(stderr, "kvsieve report: unknown argument '%s'\n", a);
            report_usage(stderr);
            return 2;
        }
    }
    if (o.experiment && o.run_id > 0) {
        fprintf(stderr, "kvsieve report: give --experiment or --run, not both\n");
        return 2;
    }
    if (board && (out || plot || o.format != KVS_REPORT_MD)) {
        fprintf(stderr, "kvsieve report: --board writes its own files; drop --out, --plot and --format\n");
        return 2;
    }
    if (note && !board) {
        fprintf(stderr, "kvsieve report: --note goes with --board\n");
        return 2;
    }
    FILE *probe = fopen(db, "rb");
    if (!probe) {
        fprintf(stderr, "kvsieve report: no database at %s (run an experiment first, or --db PATH)\n", db);
        return 1;
    }
    fclose(probe);
    kvs_err err = {0};
    kvs_store *st = NULL;
    int code = 1;
    FILE *f = NULL;
    if (kvs_store_open(db, &st, &err)) {
        fprintf(stderr, "kvsieve report: %s\n", err.msg);
        goto cleanup;
    }
    if (board) {
        char *text = NULL;
        if (note && !(text = read_note(note))) {
            fprintf(stderr, "kvsieve report: cannot read --note %s\n", note);
            goto cleanup;
        }
        kvs_status rc = kvs_report_board(st, &o, board, text, &err);
        free(text);
        if (rc) {
            fprintf(stderr, "kvsieve report: %s\n", err.msg);
            goto cleanup;
        }
        fprintf(stderr, "kvsieve report: wrote %s/{scores.csv,summary.md,leaderboard.svg,tasks.svg,"
                "provenance.json}\n", board);
        code = 0;
        goto cleanup;
    }
    f = out ? fopen(out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "kvsieve report: cannot write %s\n", out);
        goto cleanup;
    }
    if (kvs_report_write(st, &o, f, &err)) {
        fprintf(stderr, "kvsieve report: %s\n", err.msg);
        goto cleanup;
    }
    if (plot) {
        if (kvs_report_plot(st, &o, plot, &err)) {
            fprintf(stderr, "kvsieve report: %s\n", err.msg);
            goto cleanup;
        }
        fprintf(stderr, "kvsieve report: wrote %s\n", plot);
    }
    code = 0;
cleanup:
    if (f && f != stdout && fclose(f) != 0) {
        fprintf(stderr, "kvsieve report: cannot write %s\n", out);
        code = 1;
    }
    kvs_store_close(st);
    return code;
}
