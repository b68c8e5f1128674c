/*
 * cmd_compress.c -- `kvsieve compress`: dump in -> plan JSON and/or
 * compressed dump out. Prints the per-layer budgets, the time the method
 * took (observe + select, all layers) and the process's peak RSS.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "kvsieve_methods.h"

static void compress_usage(FILE *f) {
    fprintf(f, "usage: kvsieve compress --kv DUMP --method M (--ratio R | --tokens T)\n"
               "         [--param name=value ...] [--plan PLAN.json] [--out COMPRESSED.safetensors]\n"
               "         [--dtype f32|f16|bf16] [--threads N] [--quiet]\n"
               "  The compressed dump holds layers.{l}.k/v as [Hkv, B_l, d] (merged, for merging methods).\n"
               "  M is a method name or a method composed from parts (kvsieve methods lists them):\n"
               "  --method '{\"score\":\"knorm\",\"allocate\":\"pyramid\",\"keep\":{\"sinks\":4}}'\n");
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad) fprintf(stderr, "kvsieve: could not write %s\n", path);
    return bad;
}

int kvs_cmd_compress(int argc, char **argv) {
    const char *kv = NULL, *method = NULL, *plan_path = NULL, *out = NULL;
    const char *params_kv[KVS_MAX_PARAMS * 2];
    int n_params = 0, quiet = 0;
    long threads = 1;
    kvs_budget b = {0};
    kvs_dtype dtype = KVS_F32;
    int dtype_given = 0, ratio_given = 0, tokens_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            compress_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvsieve compress: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--kv")) kv = v;
        else if (!strcmp(a, "--method")) method = v;
        else if (!strcmp(a, "--ratio") || !strcmp(a, "--tokens"))
            bad = kvs_arg_budget(a, v, &b, &ratio_given, &tokens_given);
        else if (!strcmp(a, "--param")) {
            if (n_params >= (int)(sizeof params_kv / sizeof params_kv[0])) {
                fprintf(stderr, "kvsieve compress: too many --param\n");
                return 2;
            }
            params_kv[n_params++] = v;
        } else if (!strcmp(a, "--plan")) plan_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) bad = kvs_arg_int(a, v, 1, 256, &threads);
        else if (!strcmp(a, "--dtype")) bad = kvs_parse_dtype(v, &dtype), dtype_given = 1;
        else {
            fprintf(stderr, "kvsieve compress: unknown option '%s'\n", a);
            compress_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!kv || !method) {
        fprintf(stderr, "kvsieve compress: --kv and --method are required\n");
        compress_usage(stderr);
        return 2;
    }
    if (ratio_given == tokens_given) {
        fprintf(stderr, "kvsieve compress: give exactly one of --ratio (0, 1] or --tokens T >= 1\n");
        return 2;
    }

    kvs_err err = {0};
    const kvs_method *m = NULL;
    kvs_composed *owned = NULL; /* --method '{...}': composed from parts */
    kvs_params params;
    kvs_dump dump = {0};
    kvs_plan plan = {0};
    kvs_dense_cache cc = {0};
    char *json = NULL;
    int rc = 1, opened = 0;
    if (kvs_method_resolve(method, &m, &owned, &err) != KVS_OK) goto fail;
    kvs_params_defaults(m, &params);
    for (int i = 0; i < n_params; i++)
        if (kvs_params_set_kv(m, &params, params_kv[i], &err) != KVS_OK) goto fail;
    if (kvs_dump_open(kv, &dump, &err) != KVS_OK) goto fail;
    opened = 1;
    double t0 = kvs_now_ms();
    if (kvs_compress(m, &params, &dump.view, &b, (int)threads, &plan, &err) != KVS_OK) goto fail;
    double ms = kvs_now_ms() - t0;

    if (!quiet) {
        printf("%s on %s: N %d, %d layers, Hkv %d%s%s\n", m->name, kv, dump.shape.n_tokens, plan.n_layers,
               plan.n_kv_heads, plan.note[0] ? "; note: " : "", plan.note);
        printf("layer budgets (tokens per KV head):");
        for (int l = 0; l < plan.n_layers; l++) printf("%s%d", l ? " " : " ", plan.layers[l].budget);
        printf("\n");
        if (kvs_plan_is_ragged(&plan)) { /* per-head counts: the spread of each layer */
            printf("ragged heads (min..max tokens per KV head):");
            for (int l = 0; l < plan.n_layers; l++) {
                int lo = dump.shape.n_tokens, hi = 0, c;
                for (int h = 0; h < plan.n_kv_heads; h++) {
                    kvs_plan_head(&plan, l, h, &c);
                    lo = c < lo ? c : lo;
                    hi = c > hi ? c : hi;
                }
                printf(" %d..%d", lo, hi);
            }
            printf("\n");
        }
    }
    {
        /* real bytes: kept rows per head x d x element size x 2 (K and V) */
        const kvs_dtype dt = dump.view.layers[0].k.dtype;
        const int d = dump.shape.head_dim;
        const int64_t full = (int64_t)plan.n_layers * plan.n_kv_heads * dump.shape.n_tokens * d *
                             (int64_t)kvs_dtype_size(dt) * 2;
        printf("kept KV bytes %lld of %lld (%s, %s heads)\n",
               (long long)kvs_plan_kv_bytes(&plan, d, kvs_dtype_size(dt)), (long long)full,
               kvs_dtype_name(dt), kvs_plan_is_ragged(&plan) ? "ragged" : "equal");
    }
    printf("kept %lld of %lld tokens (%.2f%%); compress %.1f ms on %ld thread(s); peak RSS %.0f MiB\n",
           (long long)kvs_plan_total(&plan), (long long)plan.n_layers * dump.shape.n_tokens,
           100.0 * (double)kvs_plan_total(&plan) / ((double)plan.n_layers * dump.shape.n_tokens), ms, threads,
           kvs_peak_rss_mib());
    if (plan_path) {
        json = kvs_plan_to_json(&plan, m, &params);
        if (!json) {
            kvs_errorf(&err, KVS_ERR_NOMEM, "out of memory writing the plan");
            goto fail;
        }
        if (write_text(plan_path, json)) goto cleanup;
        printf("plan: %s\n", plan_path);
    }
    if (out) {
        if (!dtype_given) dtype = dump.view.layers[0].k.dtype;
        if (kvs_apply(&dump.view, &plan, &cc, &err) != KVS_OK) goto fail;
        const char *meta[] = {"generator", "kvsieve compress " KVS_VERSION, "method", m->name,
                              "merge", kvs_merge_name(plan.merge), NULL};
        if (kvs_dump_write(out, &cc, dtype, NULL, 0, 0, NULL, 0, meta, &err) != KVS_OK) goto fail;
        printf("compressed dump: %s\n", out);
    }
    rc = 0;
    goto cleanup;
fail:
    fprintf(stderr, "kvsieve compress: %s\n", err.msg);
cleanup:
    free(json);
    kvs_dense_cache_free(&cc);
    kvs_plan_free(&plan);
    if (opened) kvs_dump_close(&dump);
    kvs_composed_free(owned);
    return rc;
}
