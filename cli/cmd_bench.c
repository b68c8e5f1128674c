/*
 * cmd_bench.c -- `kvsieve bench`: prefill and decode tokens/s of a GGUF model
 * at a given prompt length (the engine bars of performance.md section 3).
 * The prompt is real text (a fixed paragraph repeated) tokenised and cut to
 * the requested length; decode is greedy. A short untimed warm-up run first
 * faults in the weight pages. Prints machine, build, model, shapes and
 * repetitions, then one line per repetition and the medians.
 * What it is not: no database rows (the runner stores results), no
 * compression timing (see `kvsieve generate --method`).
 */
#ifdef KVS_HAVE_BACKEND
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "kvs_backend.h"

static const char *PARAGRAPH =
    "The history of the river valley is written in its stones. Farmers came first, cutting terraces into the "
    "hills and planting barley where the soil was deep enough, and for centuries the villages grew slowly "
    "around their wells and markets. Traders followed the river south each autumn, carrying wool, salt and "
    "copper tools, and returned in spring with dyes, spices and news of distant wars. ";

static void usage(FILE *f) {
    fprintf(f, "usage: kvsieve bench --model PATH|default [--prompt-len N] [--gen N] [--threads N] [--reps N]\n"
               "  defaults: --prompt-len 2048 --gen 64 --threads 2 --reps 1\n");
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int kvs_cmd_bench(int argc, char **argv) {
    const char *model_spec = NULL;
    long plen = 2048, gen = 64, threads = 2, reps = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            if (!(model_spec = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1 << 20, &plen)) return 2;
        } else if (!strcmp(a, "--gen")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 1 << 16, &gen)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 256, &threads)) return 2;
        } else if (!strcmp(a, "--reps")) {
            if (!(v = kvs_arg_value(argc, argv, &i)) || kvs_arg_int(a, v, 1, 100, &reps)) return 2;
        } else {
            fprintf(stderr, "kvsieve bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_spec) {
        fprintf(stderr, "kvsieve bench: --model is required\n");
        usage(stderr);
        return 2;
    }
    kvs_err err = {0};
    char path[1024];
    if (kvs_model_resolve(model_spec, path, sizeof path, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve bench: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    char *text = NULL;
    double *pf = NULL, *dc = NULL;
    kvs_model_opts mo = {(int)threads};
    if (kvs_model_load(path, &mo, &m, &err) != KVS_OK) goto fail;
    const kvs_model_info *info = kvs_model_get_info(m);
    /* enough text for plen tokens: a paragraph is ~70 tokens */
    size_t reps_text = (size_t)plen / 40 + 2, pl = strlen(PARAGRAPH);
    text = malloc(reps_text * pl + 1);
    if (!text) goto oom;
    for (size_t i = 0; i < reps_text; i++) memcpy(text + i * pl, PARAGRAPH, pl);
    text[reps_text * pl] = 0;
    int n = 0;
    if (kvs_tokenize(m, text, strlen(text), 1, 0, &toks, &n, &err) != KVS_OK) goto fail;
    if (n < plen) {
        fprintf(stderr, "kvsieve bench: internal: prompt text gave only %d tokens\n", n);
        goto cleanup;
    }
    n = (int)plen;
    kvs_session_opts so = {n + (int)gen + 1, (int)threads, 0};
    if (kvs_session_new(m, &so, &s, &err) != KVS_OK) goto fail;
    logits = malloc((size_t)info->n_vocab * sizeof *logits);
    pf = malloc((size_t)reps * sizeof *pf);
    dc = malloc((size_t)reps * sizeof *dc);
    if (!logits || !pf || !dc) goto oom;
    printf("bench: host cpus %ld, threads %ld, build %s, model %s (%s, %s, %d layers, E %d, %d heads / %d kv, d %d, "
           "vocab %d), prompt %d tokens, decode %ld tokens, %ld repetition(s)\n",
           sysconf(_SC_NPROCESSORS_ONLN), threads,
#ifdef NDEBUG
           "release",
#else
           "debug",
#endif
           info->name, info->arch, info->weight_types, info->n_layers, info->n_embd, info->n_heads, info->n_kv_heads,
           info->head_dim, info->n_vocab, n, gen, reps);
    /* warm-up: touch every weight page of the mapping once (not timed) */
    if (kvs_session_prefill(s, toks, n < 16 ? n : 16, NULL, logits, &err) != KVS_OK ||
        kvs_session_decode(s, argmax(logits, info->n_vocab), logits, &err) != KVS_OK)
        goto fail;
    FILE *lf = fopen("/proc/loadavg", "r");
    double la = 0;
    if (lf) {
        if (fscanf(lf, "%lf", &la) == 1) printf("load average before: %.2f (other processes share the cores)\n", la);
        fclose(lf);
    }
    for (long r = 0; r < reps; r++) {
        kvs_session_reset(s);
        double c0 = cpu_s(), t0 = kvs_now_ms();
        if (kvs_session_prefill(s, toks, n, NULL, logits, &err) != KVS_OK) goto fail;
        double t1 = kvs_now_ms(), c1 = cpu_s();
        int32_t tok = argmax(logits, info->n_vocab);
        for (long g = 0; g < gen; g++) {
            if (kvs_session_decode(s, tok, logits, &err) != KVS_OK) goto fail;
            tok = argmax(logits, info->n_vocab);
        }
        double t2 = kvs_now_ms(), c2 = cpu_s();
        pf[r] = n * 1000.0 / (t1 - t0);
        dc[r] = gen * 1000.0 / (t2 - t1);
        /* CPU seconds used / threads = wall time the run would take with the cores to itself */
        printf("rep %ld: prefill %.1f ms = %.1f tok/s (cpu %.2f s: %.1f tok/s per %ld dedicated cores); decode %ld "
               "tokens %.1f ms = %.2f tok/s (cpu %.2f s: %.1f tok/s)\n",
               r + 1, t1 - t0, pf[r], c1 - c0, n / ((c1 - c0) / threads), threads, gen, t2 - t1, dc[r], c2 - c1,
               gen / ((c2 - c1) / threads));
    }
    qsort(pf, (size_t)reps, sizeof *pf, cmp_d);
    qsort(dc, (size_t)reps, sizeof *dc, cmp_d);
    printf("median: prefill %.1f tok/s, decode %.2f tok/s (bars: prefill >= 400, decode >= 30 on 2 cores)\n",
           pf[reps / 2], dc[reps / 2]);
    rc = 0;
    goto cleanup;
oom:
    fprintf(stderr, "kvsieve bench: out of memory\n");
    goto cleanup;
fail:
    fprintf(stderr, "kvsieve bench: %s\n", err.msg);
cleanup:
    free(pf);
    free(dc);
    free(text);
    free(logits);
    free(toks);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}
#endif
