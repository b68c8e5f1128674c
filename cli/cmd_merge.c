/*
 * cmd_merge.c -- `kvsieve merge OUT.db IN.db...`: union results databases
 * (the per-task databases of a sharded run) into OUT, exactly: same cell
 * keys, every run's provenance kept, duplicates recognised, conflicting
 * results listed and refused unless --keep says which to keep.
 * The work itself is eval/store_merge.c (kvs_store_merge); this file parses
 * arguments and prints the summary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_eval.h"

static void merge_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve merge OUT.db IN.db [IN.db ...] [--keep first|last] [--quiet]\n"
            "  Copies every run, cell, result and score of the inputs into OUT (created if\n"
            "  missing; the inputs are only read and must be at this kvsieve's schema version).\n"
            "  Runs get new ids and runs.merged_from = 'IN#ID'; a run already in OUT is not\n"
            "  copied twice, so merging again changes nothing. A cell key held by two databases\n"
            "  is compared on its values (definition, prediction, decoded tokens, KV bytes and\n"
            "  every score except timings: *_ms, *_tok_s): equal values are one result; different\n"
            "  values are a conflict, listed with both values.\n"
            "  --keep first|last  on a conflict keep the result met first (OUT, then the inputs\n"
            "                     in order) or last; without it a conflict merges nothing and\n"
            "                     the exit status is 1\n"
            "  --quiet            no summary line\n");
}

int kvs_cmd_merge(int argc, char **argv) {
    const char *out = NULL;
    const char **in = calloc((size_t)argc + 1, sizeof *in);
    int n_in = 0, quiet = 0, code = 1;
    kvs_merge_keep keep = KVS_MERGE_REFUSE;
    kvs_store *st = NULL;
    if (!in) {
        fprintf(stderr, "kvsieve merge: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            merge_usage(stdout);
            code = 0;
            goto cleanup;
        } else if (!strcmp(a, "--keep")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v) goto usage;
            if (!strcmp(v, "first"))
                keep = KVS_MERGE_KEEP_FIRST;
            else if (!strcmp(v, "last"))
                keep = KVS_MERGE_KEEP_LAST;
            else {
                fprintf(stderr, "kvsieve merge: --keep %s: expected first or last\n", v);
                goto usage;
            }
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (a[0] == '-') {
            fprintf(stderr, "kvsieve merge: unknown option '%s'\n", a);
            goto usage;
        } else if (!out) {
            out = a;
        } else {
            in[n_in++] = a;
        }
    }
    if (!out || n_in == 0) {
        fprintf(stderr, "kvsieve merge: give the output database and at least one input, e.g. "
                        "kvsieve merge results/all.db results/shard-*.db\n");
        goto usage;
    }
    kvs_err err = {0};
    if (kvs_store_open(out, &st, &err)) {
        fprintf(stderr, "kvsieve merge: %s\n", err.msg);
        goto cleanup;
    }
    kvs_merge_summary sum;
    kvs_status rc = kvs_store_merge(st, in, n_in, keep, stderr, &sum, &err);
    if (rc) {
        fprintf(stderr, "kvsieve merge: %s\n", err.msg);
        goto cleanup;
    }
    if (!quiet)
        fprintf(stderr,
                "merged %d database(s) into %s: %lld runs copied (%lld already there), %lld "
                "results copied, %lld identical duplicates left out, %lld conflicts%s, %lld "
                "latency and %lld bench rows\n",
                n_in, out, (long long)sum.runs_copied, (long long)sum.runs_known,
                (long long)sum.cells_copied, (long long)sum.cells_same, (long long)sum.conflicts,
                sum.conflicts ? (keep == KVS_MERGE_KEEP_LAST ? " (the last kept)" : " (the first kept)")
                              : "",
                (long long)sum.latency_copied, (long long)sum.bench_copied);
    code = 0;
cleanup:
    kvs_store_close(st);
    free(in);
    return code;
usage:
    merge_usage(stderr);
    code = 2;
    goto cleanup;
}
