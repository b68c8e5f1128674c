/*
 * cmd_demo.c -- `kvsieve demo`: the offline quick start. Synthesises a cache
 * in memory (no files), compresses it with every method and prints the
 * fidelity table. The same numbers come from `synth` + `fidelity`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_formats.h"
#include "kvsieve_methods.h"

static void demo_usage(FILE *f) {
    fprintf(f, "usage: kvsieve demo [--preset gemma3-270m] [--tokens 2048] [--ratio 0.2] [--seed 7]\n"
               "                    [--image-frac 0.5] [--methods all|m1,...] [--param method.name=value]\n"
               "                    [--threads N]\n");
}

int kvs_cmd_demo(int argc, char **argv) {
    const char *preset = "gemma3-270m", *methods = "all";
    const char *pkv[64];
    int n_pkv = 0;
    long n = 2048, seed = 7, threads = 2;
    double ratio = 0.2, image_frac = 0.5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            demo_usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvsieve demo: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--tokens")) bad = kvs_arg_int(a, v, 16, 1 << 20, &n);
        else if (!strcmp(a, "--ratio")) bad = kvs_arg_double(a, v, 1e-9, 1.0, &ratio);
        else if (!strcmp(a, "--seed")) bad = kvs_arg_int(a, v, 0, 0x7fffffffL, &seed);
        else if (!strcmp(a, "--image-frac")) bad = kvs_arg_double(a, v, 0.0, 1.0, &image_frac);
        else if (!strcmp(a, "--methods")) methods = v;
        else if (!strcmp(a, "--param")) {
            if (n_pkv >= 64) return 2;
            pkv[n_pkv++] = v;
        } else if (!strcmp(a, "--threads")) bad = kvs_arg_int(a, v, 1, 256, &threads);
        else {
            fprintf(stderr, "kvsieve demo: unknown option '%s'\n", a);
            demo_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    kvs_cli_variant variants[64];
    int nv = 0;
    if (kvs_cli_parse_variants(methods, pkv, n_pkv, variants, &nv)) return 2;

    kvs_err err = {0};
    kvs_synth_config cfg;
    kvs_synth_defaults(&cfg);
    if (kvs_synth_preset(preset, &cfg, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve demo: %s\n", err.msg);
        kvs_cli_variants_free(variants, nv);
        return 2;
    }
    cfg.n_tokens = (int)n;
    cfg.n_queries = (int)n; /* all: H2O, LOOK-M and MEDA need them */
    cfg.seed = (uint64_t)seed;
    cfg.image_frac = image_frac;

    kvs_dense_cache cache = {0};
    float **pr = NULL;
    int32_t *outl = NULL;
    kvs_layer *layers = NULL;
    kvs_view *probes = NULL;
    int rc = 1;
    double t0 = kvs_now_ms();
    if (kvs_synth_resolve(&cfg, &err) != KVS_OK) goto fail;
    if (kvs_synth_generate(&cfg, &cache, &pr, &outl, &err) != KVS_OK) goto fail;
    layers = calloc((size_t)cfg.n_layers, sizeof *layers);
    probes = calloc((size_t)cfg.n_layers, sizeof *probes);
    if (!layers || !probes) {
        kvs_errorf(&err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kvs_cache_view view;
    if (kvs_dense_cache_view(&cache, &view, layers, &err) != KVS_OK) goto fail;
    for (int l = 0; l < cfg.n_layers; l++)
        probes[l] = kvs_view_make(pr[l], KVS_F32, cfg.n_q_heads, cfg.n_probes, cfg.head_dim);
    int per_layer = 0;
    kvs_budget b = {.ratio = ratio};
    if (kvs_budget_per_layer(&b, cfg.n_tokens, &per_layer, &err) != KVS_OK) goto fail;
    printf("kvsieve demo: synthetic %s cache, %d layers, Hq %d, Hkv %d, d %d, N %d (%.0f%% image tokens),\n"
           "%d planted outlier tokens, %d probe queries per layer, seed %ld (generated in %.0f ms)\n"
           "budget: ratio %.2f = %d tokens per layer; %ld thread(s)\n\n",
           preset, cfg.n_layers, cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_tokens, 100 * image_frac,
           cfg.n_outliers, cfg.n_probes, seed, kvs_now_ms() - t0, ratio, per_layer, threads);
    rc = kvs_cli_fidelity_table(&view, probes, outl, cfg.n_outliers, variants, nv, &b, (int)threads);
    printf("\nLower error is better; `full` is the reference (0 error), `random` the floor to beat.\n");
    goto cleanup;
fail:
    fprintf(stderr, "kvsieve demo: %s\n", err.msg);
cleanup:
    if (pr) {
        for (int l = 0; l < cfg.n_layers; l++) free(pr[l]);
        free(pr);
    }
    free(outl);
    free(layers);
    free(probes);
    kvs_dense_cache_free(&cache);
    kvs_cli_variants_free(variants, nv);
    return rc;
}
