/*
 * cmd_synth.c -- `kvsieve synth`: write a realistic synthetic cache dump.
 * The structure of the data (smooth low-frequency base, sparse outliers,
 * RoPE keys, sinks, image spans) is described in formats/kvs_formats.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_formats.h"

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve synth --out FILE.safetensors --tokens N\n"
            "         (--preset qwen2.5-vl-7b|llava-1.5-7b|gemma3-270m|tiny |\n"
            "          --layers L --q-heads Hq --kv-heads Hkv --head-dim d)\n"
            "         [--seed S] [--queries all|none|K] [--probes P] [--outliers M] [--sinks S]\n"
            "         [--image-frac F] [--dtype f32|f16|bf16] [--wo E] [--recon]\n"
            "  --queries  query rows to record per layer: all prompt positions (default, what\n"
            "             H2O/LOOK-M/MEDA need), none, or the last K (SnapKV's window)\n"
            "  --wo E     also write each layer's output projection W_o [Hq, E, d] (layers.{l}.wo:\n"
            "             random rows, a different scale per query head; what criticalkv needs)\n"
            "  --recon    also write KVzip's context-reconstruction statistic [Hkv, N] in (0, 1)\n"
            "             (layers.{l}.recon: high on sinks and outliers; what kvzip needs)\n");
}

int kvs_parse_dtype(const char *s, kvs_dtype *out) {
    if (!strcmp(s, "f32") || !strcmp(s, "F32")) *out = KVS_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "F16")) *out = KVS_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "BF16")) *out = KVS_BF16;
    else {
        fprintf(stderr, "kvsieve: --dtype must be f32, f16 or bf16, got '%s'\n", s);
        return 1;
    }
    return 0;
}

int kvs_cmd_synth(int argc, char **argv) {
    kvs_synth_config cfg;
    kvs_synth_defaults(&cfg);
    kvs_err err = {0};
    const char *out = NULL, *queries = "all", *preset = NULL;
    long L = 0, hq = 0, hkv = 0, d = 0, n = 0, seed = 0, probes = -1, outliers = -1, sinks = -1, wo_rows = 0;
    int recon = 0;
    double image_frac = -1;
    kvs_dtype dtype = KVS_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--recon")) { /* a switch: takes no value */
            recon = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !(v = kvs_arg_value(argc, argv, &i))) {
            if (strncmp(a, "--", 2) != 0) fprintf(stderr, "kvsieve synth: unexpected argument '%s'\n", a);
            return 2;
        }
        int bad = 0;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--layers")) bad = kvs_arg_int(a, v, 1, 1024, &L);
        else if (!strcmp(a, "--q-heads")) bad = kvs_arg_int(a, v, 1, 1024, &hq);
        else if (!strcmp(a, "--kv-heads")) bad = kvs_arg_int(a, v, 1, 1024, &hkv);
        else if (!strcmp(a, "--head-dim")) bad = kvs_arg_int(a, v, 1, 4096, &d);
        else if (!strcmp(a, "--tokens")) bad = kvs_arg_int(a, v, 1, 1 << 22, &n);
        else if (!strcmp(a, "--seed")) bad = kvs_arg_int(a, v, 0, 0x7fffffffL, &seed);
        else if (!strcmp(a, "--queries")) queries = v;
        else if (!strcmp(a, "--probes")) bad = kvs_arg_int(a, v, 0, 4096, &probes);
        else if (!strcmp(a, "--outliers")) bad = kvs_arg_int(a, v, 0, 1 << 22, &outliers);
        else if (!strcmp(a, "--sinks")) bad = kvs_arg_int(a, v, 0, 1 << 22, &sinks);
        else if (!strcmp(a, "--image-frac")) bad = kvs_arg_double(a, v, 0.0, 1.0, &image_frac);
        else if (!strcmp(a, "--dtype")) bad = kvs_parse_dtype(v, &dtype);
        else if (!strcmp(a, "--wo")) bad = kvs_arg_int(a, v, 1, 1 << 20, &wo_rows);
        else {
            fprintf(stderr, "kvsieve synth: unknown option '%s'\n", a);
            synth_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!out || !n) {
        fprintf(stderr, "kvsieve synth: --out and --tokens are required\n");
        synth_usage(stderr);
        return 2;
    }
    if (preset) {
        if (kvs_synth_preset(preset, &cfg, &err) != KVS_OK) {
            fprintf(stderr, "kvsieve synth: %s\n", err.msg);
            return 2;
        }
    } else if (L && hq && hkv && d) {
        if (hq % hkv) {
            fprintf(stderr, "kvsieve synth: --q-heads %ld is not a multiple of --kv-heads %ld\n", hq, hkv);
            return 2;
        }
        cfg.n_layers = (int)L, cfg.n_q_heads = (int)hq, cfg.n_kv_heads = (int)hkv, cfg.head_dim = (int)d;
    } else {
        fprintf(stderr, "kvsieve synth: give --preset or all of --layers --q-heads --kv-heads --head-dim\n");
        return 2;
    }
    cfg.n_tokens = (int)n;
    cfg.seed = (uint64_t)seed;
    if (!strcmp(queries, "all")) cfg.n_queries = (int)n;
    else if (!strcmp(queries, "none")) cfg.n_queries = 0;
    else {
        long k = 0;
        if (kvs_arg_int("--queries", queries, 1, n, &k)) return 2;
        cfg.n_queries = (int)k;
    }
    if (probes >= 0) cfg.n_probes = (int)probes;
    if (outliers >= 0) cfg.n_outliers = (int)outliers;
    if (sinks >= 0) cfg.n_sinks = (int)sinks;
    if (image_frac >= 0) cfg.image_frac = image_frac;

    kvs_dense_cache cache = {0};
    float **pr = NULL, **wo = NULL, **recon_arr = NULL;
    int32_t *outl = NULL;
    int rc = 1;
    double t0 = kvs_now_ms();
    if (kvs_synth_resolve(&cfg, &err) != KVS_OK || kvs_synth_generate(&cfg, &cache, &pr, &outl, &err) != KVS_OK ||
        kvs_synth_extra(&cfg, outl, cfg.n_outliers, (int)wo_rows, wo_rows ? &wo : NULL,
                        recon ? &recon_arr : NULL, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve synth: %s\n", err.msg);
        goto cleanup;
    }
    char seedbuf[32], nbuf[32];
    snprintf(seedbuf, sizeof seedbuf, "%lu", (unsigned long)cfg.seed);
    snprintf(nbuf, sizeof nbuf, "%d", cfg.n_tokens);
    const char *meta[] = {"generator", "kvsieve synth " KVS_VERSION, "preset", preset ? preset : "custom",
                          "seed", seedbuf, "n_tokens", nbuf, NULL};
    const kvs_dump_extra extra = {(const float *const *)wo, cfg.n_q_heads, (int)wo_rows,
                                  (const float *const *)recon_arr};
    if (kvs_dump_write_extra(out, &cache, dtype, (const float *const *)pr, cfg.n_probes, cfg.n_q_heads, outl,
                             cfg.n_outliers, &extra, meta, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve synth: %s\n", err.msg);
        goto cleanup;
    }
    char wobuf[32] = "";
    if (wo_rows) snprintf(wobuf, sizeof wobuf, ", W_o E %ld", wo_rows);
    printf("wrote %s: %d layers, Hq %d, Hkv %d, d %d, N %d, Nq %d, %d probes, %d outliers%s%s, %s (%.0f ms)\n", out,
           cfg.n_layers, cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_tokens, cfg.n_queries, cfg.n_probes,
           cfg.n_outliers, wobuf, recon ? ", recon" : "", kvs_dtype_name(dtype), kvs_now_ms() - t0);
    rc = 0;
cleanup:
    float **lists[3] = {pr, wo, recon_arr};
    for (int i = 0; i < 3; i++) {
        if (!lists[i]) continue;
        for (int l = 0; l < cfg.n_layers; l++) free(lists[i][l]);
        free(lists[i]);
    }
    free(outl);
    kvs_dense_cache_free(&cache);
    return rc;
}
