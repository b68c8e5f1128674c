/*
 * cmd_run.c -- `kvsieve run FILE.lua`: load a config, run its experiments
 * into the results database, resume where a previous run stopped.
 * Ctrl-C finishes the cell in flight, commits, and prints the command that
 * resumes; a second Ctrl-C kills at once (committed cells are kept).
 * The work itself is eval/ (kvs_run_config); this file parses arguments.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvs_eval.h"

/* The one piece of process state a signal handler may touch. */
static volatile sig_atomic_t run_stop = 0;

static void on_sigint(int sig) {
    (void)sig;
    run_stop = 1;
    static const char msg[] = "\nkvsieve: interrupt: finishing the cell in flight (Ctrl-C again to "
                              "abort now)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
}

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve run FILE.lua [-D key=value ...] [--db PATH] [--dry-run]\n"
            "                            [--threads N] [--limit N] [--shard I/N]\n"
            "                            [--experiment NAME] [--quiet]\n"
            "  -D key=value  override a field of every experiment{} in the file (with --experiment,\n"
            "                of that one only); the value is a Lua expression\n"
            "                (-D budgets={0.1,0.2}, -D dataset.n_tokens=512) or text\n"
            "  --db PATH     results database (default %s; the folder is created)\n"
            "  --dry-run     print the grid and how many cells are already done; run nothing\n"
            "  --threads N   worker threads per method (overrides the config's threads)\n"
            "  --limit N     stop after N new cells (resume later)\n"
            "  --experiment NAME  run only the experiment{} of this name\n"
            "  --shard I/N   run only shard I (0 .. N-1) of every experiment's grid: a fixed\n"
            "                partition by cell key (task: by sample and mode, so one prefill\n"
            "                still serves every variant); N processes with I = 0 .. N-1 cover\n"
            "                the grid once. Union their databases with kvsieve merge\n"
            "  --quiet       no progress output\n",
            KVS_STORE_DEFAULT_PATH);
}

int kvs_cmd_run(int argc, char **argv) {
    const char *file = NULL, *db = KVS_STORE_DEFAULT_PATH;
    const char **over = calloc((size_t)argc + 1, sizeof *over);
    int n_over = 0, dry = 0, quiet = 0, code = 1;
    long threads = 0, limit = 0, shard_i = 0, shard_n = 0;
    const char *shard_arg = NULL, *only = NULL;
    kvs_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kvs_store *st = NULL;
    char *hint = NULL;
    if (!over) {
        fprintf(stderr, "kvsieve run: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            code = 0;
            goto cleanup;
        } else if (!strcmp(a, "-D")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v) goto usage;
            over[n_over++] = v;
        } else if (!strncmp(a, "-D", 2)) {
            over[n_over++] = a + 2;
        } else if (!strcmp(a, "--db")) {
            if (!(db = kvs_arg_value(argc, argv, &i))) goto usage;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--threads")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int("--threads", v, 1, 256, &threads)) goto usage;
        } else if (!strcmp(a, "--limit")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int("--limit", v, 1, 1000000000L, &limit)) goto usage;
        } else if (!strcmp(a, "--experiment")) {
            if (!(only = kvs_arg_value(argc, argv, &i))) goto usage;
        } else if (!strcmp(a, "--shard")) {
            if (!(shard_arg = kvs_arg_value(argc, argv, &i))) goto usage;
            char *slash = strchr(shard_arg, '/'), *end = NULL;
            if (slash) {
                shard_i = strtol(shard_arg, &end, 10);
                if (end != slash || slash == shard_arg) slash = NULL;
            }
            if (slash) {
                shard_n = strtol(slash + 1, &end, 10);
                if (*end || end == slash + 1) slash = NULL;
            }
            if (!slash || shard_n < 1 || shard_n > 1000000 || shard_i < 0 || shard_i >= shard_n) {
                fprintf(stderr, "kvsieve run: --shard %s: expected I/N with 0 <= I < N (e.g. "
                        "--shard 0/4 ... --shard 3/4)\n", shard_arg);
                goto usage;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "kvsieve run: unknown option '%s'\n", a);
            goto usage;
        } else if (!file) {
            file = a;
        } else {
            fprintf(stderr, "kvsieve run: one config file at a time ('%s' and '%s')\n", file, a);
            goto usage;
        }
    }
    if (!file) {
        fprintf(stderr, "kvsieve run: which config? e.g. kvsieve run experiments/fidelity.lua\n");
        goto usage;
    }
    for (int i = 0; i < n_over; i++)
        if (!strchr(over[i], '=') || over[i][0] == '=') {
            fprintf(stderr, "kvsieve run: -D %s: expected key=value\n", over[i]);
            goto usage;
        }
    kvs_err err = {0};
    if (kvs_config_load_only(file, only, over, n_over, &cfg, &err)) {
        fprintf(stderr, "kvsieve run: %s\n", err.msg);
        goto cleanup;
    }
    if (kvs_store_open(db, &st, &err)) {
        fprintf(stderr, "kvsieve run: %s\n", err.msg);
        goto cleanup;
    }
    /* the command that resumes this run */
    size_t hl = strlen(file) + strlen(db) + (shard_arg ? strlen(shard_arg) : 0) +
                (only ? strlen(only) : 0) + 100;
    for (int i = 0; i < n_over; i++) hl += strlen(over[i]) + 8;
    hint = malloc(hl);
    if (!hint) goto cleanup;
    int w = snprintf(hint, hl, "kvsieve run %s", file);
    for (int i = 0; i < n_over; i++) w += snprintf(hint + w, hl - (size_t)w, " -D '%s'", over[i]);
    w += snprintf(hint + w, hl - (size_t)w, " --db %s", db);
    if (shard_arg) w += snprintf(hint + w, hl - (size_t)w, " --shard %s", shard_arg);
    if (only) snprintf(hint + w, hl - (size_t)w, " --experiment %s", only);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = (int)SA_RESETHAND; /* a second Ctrl-C kills */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    o.dry_run = dry;
    o.threads_override = (int)threads;
    o.stop = &run_stop;
    o.progress = quiet && !dry ? NULL : (dry ? stdout : stderr);
    o.progress_tty = !dry && isatty(2);
    o.progress_every_s = 5;
    o.resume_hint = hint;
    o.max_cells = (int)limit;
    o.kvsieve_bin = "/proc/self/exe"; /* the embedded backend is this binary's `serve` */
    o.only_experiment = only;
    o.shard_index = (int)shard_i;
    o.shard_count = (int)shard_n;
    kvs_run_summary sum;
    kvs_status rc = kvs_run_config(st, &cfg, &o, &sum, &err);
    signal(SIGINT, SIG_DFL);
    if (rc) {
        fprintf(stderr, "kvsieve run: %s\n", err.msg);
        if (sum.n_done > 0 || sum.n_already > 0)
            fprintf(stderr, "kvsieve run: %d cells stored this time are kept; resume with: %s\n",
                    sum.n_done, hint);
        if (sum.run_id > 0) kvs_run_account_print(stderr, &sum.acct);
        goto cleanup;
    }
    if (dry) {
        printf("total: %d cells, %d done, %d to run (database %s)\n", sum.n_cells, sum.n_already,
               sum.n_cells - sum.n_already, db);
    } else if (!quiet) {
        fprintf(stderr, "%s: %d new cells, %d already done, %d total; report: kvsieve report --db %s\n",
                sum.interrupted ? "interrupted" : "done", sum.n_done, sum.n_already, sum.n_cells, db);
        /* where the time went (also in each run's row and a board's provenance.json) */
        if (sum.run_id > 0) kvs_run_account_print(stderr, &sum.acct);
    }
    /* a task experiment's head-to-head table (and the decode-speed table of a fixed-length
     * decode study), at the end of a run that finished */
    for (int i = 0; !dry && !sum.interrupted && i < cfg.n_experiments; i++) {
        if (cfg.experiments[i].kind != KVS_KIND_TASK) continue;
        if (only && strcmp(cfg.experiments[i].name, only) != 0) continue;
        kvs_report_opts ro;
        memset(&ro, 0, sizeof ro);
        ro.experiment = cfg.experiments[i].name;
        ro.format = KVS_REPORT_MD;
        fflush(stderr);
        if (kvs_report_write(st, &ro, stdout, &err)) {
            if (err.code == KVS_ERR_NOTFOUND && shard_n > 1) { /* a shard may hold no cells */
                fprintf(stderr, "kvsieve run: shard %s holds no results of '%s' yet\n", shard_arg,
                        ro.experiment);
                continue;
            }
            fprintf(stderr, "kvsieve run: report: %s\n", err.msg);
            goto cleanup;
        }
        /* the decode-speed table of ignore_eos experiments is part of kvs_report_write */
        fflush(stdout);
    }
    code = sum.interrupted ? 130 : 0;
    if (sum.interrupted && limit > 0 && !run_stop) code = 0;
cleanup:
    kvs_store_close(st);
    kvs_config_free(&cfg);
    free(over);
    free(hint);
    return code;
usage:
    run_usage(stderr);
    code = 2;
    goto cleanup;
}
