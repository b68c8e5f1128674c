/*
 * cmd_fidelity.c -- `kvsieve fidelity`: a row per method on one cache dump.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "kvsieve_methods.h"

static void fidelity_usage(FILE *f) {
    fprintf(f, "usage: kvsieve fidelity --kv DUMP (--ratio R | --tokens T) [--methods all|m1,m2,...]\n"
               "         [--param method.name=value ...] [--threads N]\n"
               "  A method may be composed from parts: '{\"score\":\"knorm\",\"keep\":{\"sinks\":4}}'.\n"
               "  Relative error of the attention output of the dump's probe queries (layers.{l}.probe),\n"
               "  full cache vs compressed, and how many planted outliers (`outliers`) each method kept.\n");
}

/* Fill variants from "all" or a comma list; params "method.name=value". */
int kvs_cli_parse_variants(const char *list, const char *const *pkv, int n_pkv, kvs_cli_variant *out, int *n_out) {
    kvs_err err = {0};
    int n = 0;
    if (!strcmp(list, "all")) {
        for (int i = 0; i < kvs_methods_count(); i++) out[n++].method = kvs_method_at(i);
    } else {
        char buf[4096];
        if (strlen(list) >= sizeof buf) {
            fprintf(stderr, "kvsieve: --methods: longer than %d characters\n", (int)sizeof buf - 1);
            return 1;
        }
        snprintf(buf, sizeof buf, "%s", list);
        /* split at commas outside {...}: a composed method's JSON has its own */
        char *tok = buf;
        for (int depth = 0, i = 0;; i++) {
            const char ch = buf[i];
            depth += (ch == '{') - (ch == '}');
            if (ch && (ch != ',' || depth > 0)) continue;
            buf[i] = 0;
            if (*tok && n < 64) {
                out[n].owned = NULL;
                if (kvs_method_resolve(tok, &out[n].method, &out[n].owned, &err) != KVS_OK) {
                    fprintf(stderr, "kvsieve: --methods: %s\n", err.msg);
                    kvs_cli_variants_free(out, n);
                    return 1;
                }
                n++;
            }
            if (!ch) break;
            tok = buf + i + 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(list, "all")) out[i].owned = NULL;
    for (int i = 0; i < n; i++) kvs_params_defaults(out[i].method, &out[i].params);
    for (int j = 0; j < n_pkv; j++) {
        const char *dot = strchr(pkv[j], '.');
        char mname[64];
        if (!dot || dot - pkv[j] >= (long)sizeof mname) {
            fprintf(stderr, "kvsieve: --param '%s' must look like method.name=value\n", pkv[j]);
            kvs_cli_variants_free(out, n);
            return 1;
        }
        memcpy(mname, pkv[j], (size_t)(dot - pkv[j]));
        mname[dot - pkv[j]] = 0;
        int found = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(out[i].method->name, mname)) continue;
            found = 1;
            if (kvs_params_set_kv(out[i].method, &out[i].params, dot + 1, &err) != KVS_OK) {
                fprintf(stderr, "kvsieve: --param: %s\n", err.msg);
                kvs_cli_variants_free(out, n);
                return 1;
            }
        }
        if (!found) {
            fprintf(stderr, "kvsieve: --param '%s': method '%s' is not among --methods\n", pkv[j], mname);
            kvs_cli_variants_free(out, n);
            return 1;
        }
    }
    *n_out = n;
    return 0;
}

void kvs_cli_variants_free(kvs_cli_variant *v, int n) {
    for (int i = 0; i < n; i++) {
        kvs_composed_free(v[i].owned);
        v[i].owned = NULL;
    }
}

int kvs_cmd_fidelity(int argc, char **argv) {
    const char *kv = NULL, *methods = "all";
    const char *pkv[64];
    int n_pkv = 0, ratio_given = 0, tokens_given = 0;
    long threads = 1;
    kvs_budget b = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fidelity_usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvsieve fidelity: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--kv")) kv = v;
        else if (!strcmp(a, "--methods")) methods = v;
        else if (!strcmp(a, "--ratio") || !strcmp(a, "--tokens"))
            bad = kvs_arg_budget(a, v, &b, &ratio_given, &tokens_given);
        else if (!strcmp(a, "--param")) {
            if (n_pkv >= 64) return 2;
            pkv[n_pkv++] = v;
        } else if (!strcmp(a, "--threads")) bad = kvs_arg_int(a, v, 1, 256, &threads);
        else {
            fprintf(stderr, "kvsieve fidelity: unknown option '%s'\n", a);
            fidelity_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!kv || ratio_given == tokens_given) {
        fprintf(stderr, "kvsieve fidelity: --kv and exactly one of --ratio / --tokens are required\n");
        fidelity_usage(stderr);
        return 2;
    }
    kvs_cli_variant variants[64];
    int nv = 0;
    if (kvs_cli_parse_variants(methods, pkv, n_pkv, variants, &nv)) return 2;
    kvs_dump dump = {0};
    kvs_err err = {0};
    if (kvs_dump_open(kv, &dump, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve fidelity: %s\n", err.msg);
        kvs_cli_variants_free(variants, nv);
        return 1;
    }
    kvs_budget check = b;
    int per_layer = 0;
    if (kvs_budget_per_layer(&check, dump.shape.n_tokens, &per_layer, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve fidelity: %s\n", err.msg);
        kvs_dump_close(&dump);
        kvs_cli_variants_free(variants, nv);
        return 2;
    }
    printf("%s: %d layers, Hq %d, Hkv %d, d %d, N %d, Nq %d; budget %d tokens per layer\n\n", kv,
           dump.shape.n_layers, dump.shape.n_q_heads, dump.shape.n_kv_heads, dump.shape.head_dim,
           dump.shape.n_tokens, dump.shape.n_queries, per_layer);
    int rc = kvs_cli_fidelity_table(&dump.view, dump.probes, dump.outliers, dump.n_outliers, variants, nv, &b,
                                    (int)threads);
    kvs_dump_close(&dump);
    kvs_cli_variants_free(variants, nv);
    return rc;
}
