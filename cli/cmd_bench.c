/*
 * cmd_bench.c -- `kvsieve bench`: prefill and decode tokens/s of a GGUF model
 * at a given prompt length (the engine bars of performance.md section 3).
 * The prompt is real text (a fixed paragraph repeated) tokenised and cut to
 * the requested length; decode is greedy. A short untimed warm-up run first
 * faults in the weight pages. Prints machine, build, model, shapes and
 * repetitions, then one line per repetition and the medians, and stores one
 * engine_bench row (median, p10, p90 over the repetitions; provenance in a
 * runs row of kind "bench") in the results database (--db, default
 * results/kvsieve.db; --no-store skips it). `kvsieve report` shows it.
 * --batch 1,4,16,32: batched decode instead (kvs_batch_decode): the prompt is
 * prefilled once, copied into B sessions (trimmed as the server's variants
 * are), and the B sequences decode `--gen` steps together; prints per B the
 * step time, tokens/s and the ratios to B = 1 (performance.md section 5
 * goals: 16 sequences >= 5x the tokens/s of one, 32 in <= 3x its time).
 * Prints only (no database row).
 * What it is not: no compression timing (see `kvsieve generate --method`).
 */
#ifdef KVS_HAVE_BACKEND
#include <limits.h>
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "kvs_backend.h"
#ifdef KVS_HAVE_EVAL
#include "kvs_eval.h"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define BENCH_SAN "+asan"
#else
#define BENCH_SAN ""
#endif
#ifdef NDEBUG
#define BENCH_BUILD "release" BENCH_SAN
#else
#define BENCH_BUILD "debug" BENCH_SAN
#endif

static const char *PARAGRAPH =
    "The history of the river valley is written in its stones. Farmers came first, cutting terraces into the "
    "hills and planting barley where the soil was deep enough, and for centuries the villages grew slowly "
    "around their wells and markets. Traders followed the river south each autumn, carrying wool, salt and "
    "copper tools, and returned in spring with dyes, spices and news of distant wars. ";

static void usage(FILE *f) {
    fprintf(f, "usage: kvsieve bench --model PATH|default [--prompt-len N] [--gen N] [--threads N] [--reps N]\n"
               "                     [--cache-type f16|bf16|f32|q8_0|q4_0|kivi2|kivi4] [-ctk T] [-ctv T]\n"
               "                     [--batch B1,B2,..] [--cache-types T1,T2,..] [--db PATH | --no-store]\n"
               "                     [--kivi-group G] [--kivi-residual R]   (kivi caches; 32, 128)\n"
               "  --batch LIST  batched decode of B sequences for each B in LIST (prints only)\n"
               "  --cache-types LIST  decode tok/s per KV cache type (f16,q8_0,q4_0) after one prefill in the\n"
               "                first type's cache, interleaved per repetition; one stored row per type\n"
               "  --fill random  with --cache-types: random cache rows instead of the prefill (decode costs\n"
               "                the same; a long context without minutes of prefill); prints only\n"
               "  defaults: --prompt-len 2048 --gen 64 --threads 2 --reps 1 --cache-type f16\n"
               "  --db PATH   results database for the engine_bench row (default results/kvsieve.db)\n"
               "  --no-store  print only; write no row\n");
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

/* Linear-interpolated quantile of sorted v[0..n) (as `kvsieve report` does). */
static double quantile(const double *v, long n, double q) {
    double pos = q * (double)(n - 1);
    long i = (long)pos;
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - (double)i) * (v[i + 1] - v[i]);
}

/* greedy; a NaN logit ends the command (cli/ may exit) */
static int argmax(const float *x, int n) {
    int b = kvs_argmax(x, n);
    if (b < 0) {
        fprintf(stderr, "kvsieve: the model produced a NaN logit\n");
        exit(1);
    }
    return b;
}

#ifdef KVS_HAVE_EVAL
/* The kvsieve source tree the running binary was built in (its folder), for
 * the git revision of the runs row; "" when unknown. */
static void exe_dir(char *out, size_t n) {
    char buf[PATH_MAX];
    out[0] = '\0';
    ssize_t k = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (k <= 0) return;
    buf[k] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf) *slash = '\0';
    snprintf(out, n, "%s", buf);
}

/* The model's weight types for a stored row, without the trailing blanks. */
static void weight_types(const kvs_model_info *info, char *out, size_t n) {
    snprintf(out, n, "%s", info->weight_types);
    for (size_t k = strlen(out); k > 0 && out[k - 1] == ' '; k--) out[k - 1] = '\0';
}

/* Write the engine_bench row with a runs row of kind "bench" around it.
 * Returns 0 or prints an error naming the database and returns 1. */
static int store_row(kvs_store *st, const char *db, const char *cmdline, kvs_engine_bench_row *row) {
    kvs_err err = {0};
    char hash[65], dir[PATH_MAX];
    kvs_sha256_hex(cmdline, strlen(cmdline), hash);
    exe_dir(dir, sizeof dir);
    kvs_run_info info = {"engine-bench", "bench", NULL, cmdline, hash, NULL, dir, 1};
    int64_t run = 0, id = 0;
    if (kvs_store_run_begin(st, &info, &run, &err) != KVS_OK) goto fail;
    if (kvs_store_put_engine_bench(st, run, row, &id, &err) != KVS_OK) {
        kvs_err e2 = {0};
        kvs_store_run_end(st, run, "failed", 0, err.msg, &e2);
        goto fail;
    }
    if (kvs_store_run_end(st, run, "done", 1, NULL, &err) != KVS_OK) goto fail;
    printf("stored: engine_bench row %lld (run %lld) in %s (kvsieve report --db %s)\n", (long long)id,
           (long long)run, db, db);
    return 0;
fail:
    fprintf(stderr, "kvsieve bench: storing the result in %s: %s\n", db, err.msg);
    return 1;
}
#endif

/* Decode speed per KV cache type at one context length: the prompt is
 * prefilled once into s (the first type's cache), then for each repetition
 * and each type in turn (interleaved, so a change of load hits every type
 * alike) copied into a session of that type (rows converted: kvs_session_copy)
 * and gen tokens decoded from the same first token. dec [nt][reps] gets the
 * tok/s, *pf the prefill's. Returns 0 or 1 (error printed). */
static int bench_types(kvs_model *m, kvs_session *s, const int32_t *toks, int n, int gen, int threads, long reps,
                       const int *types, int nt, int fill, const long *kivi, double *dec, double *pf) {
    kvs_err err = {0};
    const int V = kvs_model_get_info(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg); /* [n_vocab] */
    kvs_session **ss = calloc((size_t)nt, sizeof *ss);
    int rc = 1;
    if (!lg || !ss) {
        fprintf(stderr, "kvsieve bench: out of memory\n");
        goto done;
    }
    kvs_session_reset(s);
    double t0 = kvs_now_ms();
    int first = toks[0];
    if (fill) { /* random rows: a decode step costs the same whatever they hold */
        if (kvs_session_fill_random(s, n, 7, &err) != KVS_OK) goto fail;
        *pf = 0;
        printf("cache types: %d cache rows per layer filled with random values (no prefill: --fill random), then "
               "per type and repetition a copy decodes %d tokens\n", n, gen);
    } else {
        if (kvs_session_prefill(s, toks, n, NULL, lg, &err) != KVS_OK) goto fail;
        *pf = n * 1000.0 / (kvs_now_ms() - t0);
        first = argmax(lg, V);
        printf("cache types: prompt %d tokens prefilled once (%s cache, %.1f tok/s), then per type and repetition a "
               "copy decodes %d tokens\n", n, kvs_cache_type_name(types[0]), *pf, gen);
    }
    for (int i = 0; i < nt; i++) {
        kvs_session_opts so = {n + gen + 1, threads, 0, types[i], 0};
        if (kvs_session_new(m, &so, &ss[i], &err) != KVS_OK || kvs_kivi_apply(ss[i], types[i], kivi, &err) != KVS_OK)
            goto fail;
    }
    for (long r = 0; r < reps; r++)
        for (int i = 0; i < nt; i++) {
            if (kvs_session_copy(ss[i], s, &err) != KVS_OK) goto fail;
            if (kvs_session_quantize(ss[i], &err) != KVS_OK) goto fail; /* kivi: the stores, before the clock */
            int tok = first;
            double t1 = kvs_now_ms();
            for (int g = 0; g < gen; g++) {
                if (kvs_session_decode(ss[i], tok, lg, &err) != KVS_OK) goto fail;
                tok = argmax(lg, V);
            }
            dec[(size_t)i * reps + r] = gen * 1000.0 / (kvs_now_ms() - t1);
            kvs_kv_stats st;
            kvs_session_kv_stats(ss[i], &st);
            printf("rep %ld %-5s: decode %d tokens at %d..%d: %.2f tok/s, KV cache %.1f MiB\n", r + 1,
                   kvs_cache_type_name(types[i]), gen, n, n + gen, dec[(size_t)i * reps + r],
                   (double)st.bytes_after_total / 1048576.0);
        }
    for (int i = 0; i < nt; i++) qsort(dec + (size_t)i * reps, (size_t)reps, sizeof *dec, cmp_d);
    for (int i = 0; i < nt; i++) {
        const double med = quantile(dec + (size_t)i * reps, reps, 0.5), base = quantile(dec, reps, 0.5);
        printf("median %-5s: decode %.2f tok/s [p10 %.2f, p90 %.2f], %.3f x %s\n", kvs_cache_type_name(types[i]), med,
               quantile(dec + (size_t)i * reps, reps, 0.1), quantile(dec + (size_t)i * reps, reps, 0.9), med / base,
               kvs_cache_type_name(types[0]));
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvsieve bench: %s\n", err.msg);
done:
    for (int i = 0; ss && i < nt; i++) kvs_session_free(ss[i]);
    free(ss);
    free(lg);
    return rc;
}

/* Batched decode: prefill once into s, then for each B decode gen steps of B
 * copies together. Returns 0 or 1 (error printed). */
static int bench_batch(kvs_model *m, kvs_session *s, const int32_t *toks, int n, int gen, int threads, int cache_type,
                       int cache_type_v, const long *kivi, const int *batches, int nb) {
    kvs_err err = {0};
    const int V = kvs_model_get_info(m)->n_vocab;
    int maxb = 0;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    kvs_session **ss = calloc((size_t)maxb, sizeof *ss);
    int32_t *tk = malloc((size_t)maxb * sizeof *tk);
    float *lg = malloc((size_t)maxb * V * sizeof *lg); /* [maxb][n_vocab] */
    kvs_batch *b = NULL;
    int rc = 1;
    double t1 = 0, c1 = 0;
    if (!ss || !tk || !lg) {
        fprintf(stderr, "kvsieve bench: out of memory for %d sequences\n", maxb);
        goto done;
    }
    kvs_session_reset(s);
    if (kvs_session_prefill(s, toks, n, NULL, lg, &err) != KVS_OK) goto fail;
    int first = argmax(lg, V);
    kvs_session_opts so = {n + gen + 1, 1, 0, cache_type, cache_type_v};
    kvs_compress_opts co;
    memset(&co, 0, sizeof co); /* full: the copies keep every token, local layers their window */
    for (int i = 0; i < maxb; i++)
        if (kvs_session_new(m, &so, &ss[i], &err) != KVS_OK || kvs_kivi_apply(ss[i], cache_type, kivi, &err) != KVS_OK)
            goto fail;
    if (kvs_batch_new(m, maxb, threads, &b, &err) != KVS_OK) goto fail;
    printf("batched decode: prompt %d tokens (full cache, sliding-window layers trimmed), %d steps per size\n", n, gen);
    for (int i = 0; i < nb; i++) {
        int B = batches[i];
        for (int k = 0; k < B; k++) {
            if (kvs_session_copy(ss[k], s, &err) != KVS_OK || kvs_session_compress(ss[k], &co, NULL, &err) != KVS_OK)
                goto fail;
            tk[k] = first;
        }
        double c0 = cpu_s(), t0 = kvs_now_ms();
        for (int g = 0; g < gen; g++) {
            if (kvs_batch_decode(b, ss, tk, B, lg, &err) != KVS_OK) goto fail;
            for (int k = 0; k < B; k++) tk[k] = argmax(lg + (size_t)k * V, V);
        }
        double ms = kvs_now_ms() - t0, cpu = cpu_s() - c0;
        if (i == 0 || t1 == 0) {
            t1 = ms / gen;
            c1 = cpu / gen;
        }
        printf("batch %3d: %.1f ms per step, %.1f tok/s (cpu %.1f ms per step: %.1f tok/s per %d dedicated cores); "
               "vs the first size: %.2fx the step time, %.2fx the tokens/s (cpu: %.2fx, %.2fx)\n",
               B, ms / gen, B * gen * 1000.0 / ms, cpu * 1000.0 / gen, B * gen / (cpu / threads), threads,
               (ms / gen) / t1, (B * gen * 1000.0 / ms) / (batches[0] * 1000.0 / t1), (cpu / gen) / c1,
               (B / (cpu / gen)) / (batches[0] / c1));
    }
    printf("goals (performance.md section 5, against 1 sequence): 16 sequences >= 5x the tokens/s, 32 in <= 3x the "
           "time\nnot stored (--batch prints only)\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvsieve bench: %s\n", err.msg);
done:
    kvs_batch_free(b);
    if (ss)
        for (int i = 0; i < maxb; i++) kvs_session_free(ss[i]);
    free(ss);
    free(tk);
    free(lg);
    return rc;
}

int kvs_cmd_bench(int argc, char **argv) {
    const char *model_spec = NULL, *db = NULL;
    long plen = 2048, gen = 64, threads = 2, reps = 1;
    int no_store = 0, cache_type = KVS_CACHE_F16, cache_type_v = 0, ctr;
    long kivi[2] = {0, 0}; /* --kivi-group, --kivi-residual */
    char ctname[32];
    int batches[16], n_batches = 0, types[8], n_types = 0, fill = 0;
    char types_arg[64] = "";
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
        } else if ((ctr = kvs_arg_kivi(argc, argv, &i, kivi)) >= 0) {
            if (ctr) return 2;
        } else if ((ctr = kvs_arg_cache_type("bench", argc, argv, &i, &cache_type, &cache_type_v)) >= 0) {
            if (ctr) return 2;
        } else if (!strcmp(a, "--batch")) {
            if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                long b = 0;
                if (n_batches == 16) {
                    fprintf(stderr, "kvsieve bench: --batch: at most 16 sizes\n");
                    return 2;
                }
                if (kvs_arg_int(a, tok, 1, 256, &b)) return 2;
                batches[n_batches++] = (int)b;
            }
            if (n_batches == 0) {
                fprintf(stderr, "kvsieve bench: --batch needs a list such as 1,4,16,32\n");
                return 2;
            }
            no_store = 1;
        } else if (!strcmp(a, "--fill")) {
            if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
            if (strcmp(v, "random") != 0) {
                fprintf(stderr, "kvsieve bench: --fill takes 'random', got '%s'\n", v);
                return 2;
            }
            fill = 1;
        } else if (!strcmp(a, "--cache-types")) {
            if (!(v = kvs_arg_value(argc, argv, &i))) return 2;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            snprintf(types_arg, sizeof types_arg, "%s", v);
            n_types = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                kvs_err e = {0};
                if (n_types == 8 || kvs_cache_type_parse(tok, &types[n_types], &e) != KVS_OK) {
                    fprintf(stderr, "kvsieve bench: --cache-types: %s\n", n_types == 8 ? "at most 8 types" : e.msg);
                    return 2;
                }
                n_types++;
            }
            if (n_types == 0) {
                fprintf(stderr, "kvsieve bench: --cache-types needs a list such as f16,q8_0,q4_0\n");
                return 2;
            }
        } else if (!strcmp(a, "--db")) {
            if (!(db = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--no-store")) {
            no_store = 1;
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
    if (db && no_store) {
        fprintf(stderr, "kvsieve bench: --db and --no-store (or --batch, which prints only) exclude each other\n");
        return 2;
    }
#ifndef KVS_HAVE_EVAL
    if (!no_store) {
        fprintf(stderr, "kvsieve bench: this kvsieve is built without eval/ (the results database); "
                        "pass --no-store to only print\n");
        return 2;
    }
#else
    if (!db) db = KVS_STORE_DEFAULT_PATH;
#endif
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
    double *pf = NULL, *dc = NULL, *pfc = NULL, *dcc = NULL;
    char sha[65] = "", cpu[256] = "unknown";
#ifdef KVS_HAVE_EVAL
    kvs_store *st = NULL;
    char cmdline[1600];
    /* open (and migrate) the database before the long part: a bad --db fails at once */
    if (!no_store) {
        if (kvs_store_open(db, &st, &err) != KVS_OK) {
            fprintf(stderr, "kvsieve bench: results database %s: %s\n", db, err.msg);
            return 1;
        }
        if (kvs_sha256_file(path, sha, &err) != KVS_OK) goto fail;
    }
    kvs_store_host_cpu(cpu, sizeof cpu);
#endif
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
    if (n_types > 0) cache_type = types[0], cache_type_v = 0; /* the shared prefill's cache */
    kvs_session_opts so = {n + (int)gen + 1, (int)threads, 0, cache_type, cache_type_v};
    if (kvs_session_new(m, &so, &s, &err) != KVS_OK || kvs_kivi_apply(s, cache_type, kivi, &err) != KVS_OK) goto fail;
    logits = malloc((size_t)info->n_vocab * sizeof *logits); /* [n_vocab] */
    pf = malloc((size_t)reps * sizeof *pf);                   /* [reps] prefill tok/s, wall */
    dc = malloc((size_t)reps * sizeof *dc);                   /* [reps] decode tok/s, wall */
    pfc = malloc((size_t)reps * sizeof *pfc);                 /* [reps] prefill tok/s, cpu time */
    dcc = malloc((size_t)reps * sizeof *dcc);                 /* [reps] decode tok/s, cpu time */
    if (!logits || !pf || !dc || !pfc || !dcc) goto oom;
    printf("bench: host %s, cpus %ld, device cpu, threads %ld, build %s, OpenBLAS core %s, model %s (%s, %s, %d layers, E %d, "
           "%d heads / %d kv, d %d, vocab %d), %s KV cache, prompt %d tokens, decode %ld tokens, %ld repetition(s)\n",
           cpu, sysconf(_SC_NPROCESSORS_ONLN), threads, BENCH_BUILD, openblas_get_corename(), info->name, info->arch,
           info->weight_types, info->n_layers, info->n_embd, info->n_heads, info->n_kv_heads,
           info->head_dim, info->n_vocab, kvs_cache_types_str(cache_type, cache_type_v, ctname), n, gen, reps);
    if (sha[0]) printf("model file %s sha256 %s\n", path, sha);
    /* warm-up: touch every weight page of the mapping once (not timed) */
    if (kvs_session_prefill(s, toks, n < 16 ? n : 16, NULL, logits, &err) != KVS_OK ||
        kvs_session_decode(s, argmax(logits, info->n_vocab), logits, &err) != KVS_OK)
        goto fail;
    FILE *lf = fopen("/proc/loadavg", "r");
    double la = -1;
    if (lf) {
        if (fscanf(lf, "%lf", &la) == 1)
            printf("load average before: %.2f (other processes share the cores)\n", la);
        else
            la = -1;
        fclose(lf);
    }
    if (n_types > 0) {
        double *dec = malloc(sizeof *dec * (size_t)n_types * (size_t)reps), pfr = 0; /* [n_types][reps] */
        if (!dec) goto oom;
        rc = bench_types(m, s, toks, n, (int)gen, (int)threads, reps, types, n_types, fill, kivi, dec, &pfr);
#ifdef KVS_HAVE_EVAL
        for (int i = 0; rc == 0 && i < n_types; i++) {
            if (!st || fill) { /* an engine_bench row needs a prefill rate, which a random fill has not */
                printf("not stored (%s)\n", fill ? "--fill random: no prefill rate for engine_bench" : "--no-store");
                break;
            }
            const double *d = dec + (size_t)i * reps;
            snprintf(cmdline, sizeof cmdline,
                     "kvsieve bench --model %s --prompt-len %ld --gen %ld --threads %ld --reps %ld --cache-types %s%s\n"
                     "row: --cache-type %s (one shared %s in %s)\nmodel_path=%s",
                     model_spec, plen, gen, threads, reps, types_arg, fill ? " --fill random" : "",
                     kvs_cache_type_name(types[i]), fill ? "random fill" : "prefill", kvs_cache_type_name(types[0]),
                     path);
            char quant[sizeof info->weight_types];
            weight_types(info, quant, sizeof quant);
            kvs_engine_bench_row row = {
                .model = info->name, .model_sha256 = sha, .model_path = path, .arch = info->arch,
                .quant_types = quant, .device = "cpu", .prompt_len = n, .gen_tokens = gen,
                .threads = threads, .repetitions = reps, .prefill_tok_s = pfr, .prefill_tok_s_p10 = pfr,
                .prefill_tok_s_p90 = pfr, .decode_tok_s = quantile(d, reps, 0.5),
                .decode_tok_s_p10 = quantile(d, reps, 0.1), .decode_tok_s_p90 = quantile(d, reps, 0.9),
                .prefill_cpu_tok_s = -1, .decode_cpu_tok_s = -1, .load_avg_before = la, .host_cpu = cpu,
                .build_type = BENCH_BUILD};
            if (store_row(st, db, cmdline, &row)) rc = 1;
        }
#else
        printf("not stored (--no-store)\n");
#endif
        free(dec);
        goto cleanup;
    }
    if (n_batches > 0) {
        rc = bench_batch(m, s, toks, n, (int)gen, (int)threads, cache_type, cache_type_v, kivi, batches, n_batches);
        goto cleanup;
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
        pfc[r] = n / ((c1 - c0) / threads);
        dcc[r] = gen / ((c2 - c1) / threads);
        printf("rep %ld: prefill %.1f ms = %.1f tok/s (cpu %.2f s: %.1f tok/s per %ld dedicated cores); decode %ld "
               "tokens %.1f ms = %.2f tok/s (cpu %.2f s: %.1f tok/s)\n",
               r + 1, t1 - t0, pf[r], c1 - c0, pfc[r], threads, gen, t2 - t1, dc[r], c2 - c1, dcc[r]);
    }
    qsort(pf, (size_t)reps, sizeof *pf, cmp_d);
    qsort(dc, (size_t)reps, sizeof *dc, cmp_d);
    qsort(pfc, (size_t)reps, sizeof *pfc, cmp_d);
    qsort(dcc, (size_t)reps, sizeof *dcc, cmp_d);
    double pf_med = quantile(pf, reps, 0.5), dc_med = quantile(dc, reps, 0.5);
    printf("median: prefill %.1f tok/s [p10 %.1f, p90 %.1f], decode %.2f tok/s [p10 %.2f, p90 %.2f] "
           "(bars: prefill >= 400, decode >= 30 on 2 cores)\n",
           pf_med, quantile(pf, reps, 0.1), quantile(pf, reps, 0.9), dc_med, quantile(dc, reps, 0.1),
           quantile(dc, reps, 0.9));
#ifdef KVS_HAVE_EVAL
    if (st) {
        snprintf(cmdline, sizeof cmdline,
                 "kvsieve bench --model %s --prompt-len %ld --gen %ld --threads %ld --reps %ld --cache-type%s %s%s%s\n"
                 "model_path=%s",
                 model_spec, plen, gen, threads, reps, cache_type_v ? "-k" : "", kvs_cache_type_name(cache_type),
                 cache_type_v ? " --cache-type-v " : "", cache_type_v ? kvs_cache_type_name(cache_type_v - 1) : "",
                 path);
        char quant[sizeof info->weight_types];
        weight_types(info, quant, sizeof quant);
        kvs_engine_bench_row row = {
            .model = info->name, .model_sha256 = sha, .model_path = path, .arch = info->arch,
            .quant_types = quant, .device = "cpu", .prompt_len = n, .gen_tokens = gen,
            .threads = threads, .repetitions = reps, .prefill_tok_s = pf_med,
            .prefill_tok_s_p10 = quantile(pf, reps, 0.1), .prefill_tok_s_p90 = quantile(pf, reps, 0.9),
            .decode_tok_s = dc_med, .decode_tok_s_p10 = quantile(dc, reps, 0.1),
            .decode_tok_s_p90 = quantile(dc, reps, 0.9), .prefill_cpu_tok_s = quantile(pfc, reps, 0.5),
            .decode_cpu_tok_s = quantile(dcc, reps, 0.5), .load_avg_before = la, .host_cpu = cpu,
            .build_type = BENCH_BUILD};
        if (store_row(st, db, cmdline, &row)) goto cleanup;
    } else {
        printf("not stored (--no-store)\n");
    }
#else
    printf("not stored (--no-store)\n");
#endif
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
    free(pfc);
    free(dcc);
    free(text);
    free(logits);
    free(toks);
    kvs_session_free(s);
    kvs_model_free(m);
#ifdef KVS_HAVE_EVAL
    kvs_store_close(st);
#endif
    return rc;
}
#endif
