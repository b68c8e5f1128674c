/*
 * bench_compress_lengths.c -- FlashCache's and SnapKV's compress time at
 * prompt lengths that factor well and badly (prime N), at the Gemma 3 270M
 * shape (`kvsieve synth --preset gemma3-270m`: 18 layers, 4 query / 1 KV
 * head, d 256), fp16 K/V as the engine's cache keeps them, 64 recorded
 * queries (SnapKV's window is 32).
 * What it is: a benchmark that prints a table (not a test; it asserts
 * nothing about time). Per N: FlashCache's first compress in this process
 * (its DCT plans come from kernels/dct_plan.c's plan cache, so the first call at a
 * new length pays FFTW's planning once) and the median and minimum of R
 * warm runs of each method, interleaved, through kvs_compress (create,
 * observe, select: what a server request pays), the DCT route and FFT
 * length FlashCache used, and FlashCache's transform of one (layer, K, head)
 * block (kvs_dct_lowpass_sqres, one thread, median) on that route and on the
 * direct FFTW route every N took before the routes existed. CPU ms: the
 * process CPU time of a compress (all threads), steadier than wall time on
 * a shared machine.
 * Usage: bench_compress_lengths [threads=2] [reps=7] [N ...]
 * KVS_BENCH_LAYERS=n: keep only n layers (the quick start compresses Gemma
 * 3's 3 global layers per request; 18 is the whole model).
 */
#include "dct.h"
#include "kvs_formats.h"
#include "kvsieve_methods.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* Wall ms of one kvs_compress; *cpu gets the process CPU ms it used (all
 * threads: on a loaded machine CPU time moves less than wall time). */
static double run(const kvs_method *m, const kvs_cache_view *cv, int threads, double *cpu) {
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_budget b = {0.2, 0};
    kvs_err e = {0};
    kvs_plan plan;
    const double c0 = cpu_ms(), t0 = kvs_now_ms();
    kvs_status st = kvs_compress(m, &p, cv, &b, threads, &plan, &e);
    const double t = kvs_now_ms() - t0;
    if (cpu) *cpu = cpu_ms() - c0;
    if (st) {
        fprintf(stderr, "%s: %s\n", m->name, e.msg);
        exit(1);
    }
    kvs_plan_free(&plan);
    return t;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 7;
    static const int def[] = {1021, 1024, 1031, 1536, 2003, 2048, 4099, 4096};
    int nN = argc > 3 ? argc - 3 : (int)(sizeof def / sizeof def[0]);
    if (threads < 1 || reps < 1) return 2;
    double load = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load) != 1) load = -1;
        fclose(la);
    }
    printf("gemma3-270m shape, fp16 K/V, ratio 0.2, %d thread(s), %d warm runs per method; "
           "1-minute load average before: %.2f\n",
           threads, reps, load);
    printf("| N | route | FFT length x blocks | flashcache first ms | flashcache ms median [min] | "
           "snapkv ms median [min] | flashcache / snapkv | CPU ms flashcache / snapkv | "
           "block ms: route [direct] |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < nN; i++) {
        const int N = argc > 3 ? atoi(argv[3 + i]) : def[i];
        kvs_synth_config cfg;
        kvs_err e = {0};
        if (kvs_synth_preset("gemma3-270m", &cfg, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        cfg.n_tokens = N;
        cfg.n_queries = 64 < N ? 64 : N;
        cfg.n_probes = 0;
        cfg.seed = 7;
        const char *nl = getenv("KVS_BENCH_LAYERS");
        if (nl && atoi(nl) > 0) cfg.n_layers = atoi(nl);
        kvs_dense_cache dc;
        if (kvs_synth_generate(&cfg, &dc, NULL, NULL, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        const int L = dc.n_layers;
        kvs_layer *layers = calloc((size_t)L, sizeof *layers);
        uint16_t **h16 = calloc((size_t)L * 2, sizeof *h16);
        for (int l = 0; l < L; l++) {
            const kvs_dense_layer *dl = &dc.layers[l];
            const size_t n = (size_t)dl->n_kv_heads * N * dl->head_dim;
            for (int t = 0; t < 2; t++) {
                const float *src = t ? dl->v : dl->k;
                uint16_t *h = h16[2 * l + t] = malloc(sizeof(uint16_t) * n);
                for (size_t j = 0; j < n; j++) h[j] = kvs_f32_to_f16(src[j]);
            }
            layers[l].k = kvs_view_make(h16[2 * l], KVS_F16, dl->n_kv_heads, N, dl->head_dim);
            layers[l].v = kvs_view_make(h16[2 * l + 1], KVS_F16, dl->n_kv_heads, N, dl->head_dim);
            layers[l].q = kvs_view_make(dl->q, KVS_F32, dl->n_q_heads, dl->n_queries, dl->head_dim);
        }
        kvs_cache_view cv = {L, layers, NULL};
        const double first = run(&kvs_method_flashcache, &cv, threads, NULL);
        double *tf = malloc(sizeof(double) * reps), *ts = malloc(sizeof(double) * reps);
        double *cf = malloc(sizeof(double) * reps), *cs = malloc(sizeof(double) * reps);
        for (int r = 0; r < reps; r++) {
            tf[r] = run(&kvs_method_flashcache, &cv, threads, &cf[r]);
            ts[r] = run(&kvs_method_snapkv, &cv, threads, &cs[r]);
        }
        qsort(tf, (size_t)reps, sizeof *tf, cmp_d);
        qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
        qsort(cf, (size_t)reps, sizeof *cf, cmp_d);
        qsort(cs, (size_t)reps, sizeof *cs, cmp_d);
        kvs_dct_plan *dp = NULL;
        const int omega = (int)(0.2 * N + 0.5) < 1 ? 1 : (int)(0.2 * N + 0.5);
        if (kvs_dct_plan_create_opts(N, dc.layers[0].head_dim, omega, KVS_DCT_AUTO, &dp, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        double blk[2];
        for (int r = 0; r < 2; r++) { /* 0: the plan's route, 1: direct */
            kvs_dct_plan *bp = NULL;
            if (kvs_dct_plan_create_opts(N, dc.layers[0].head_dim, omega,
                                         r ? KVS_DCT_DIRECT : KVS_DCT_AUTO, &bp, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            float *acc = malloc(sizeof(float) * (size_t)N);
            double lo, *tb = malloc(sizeof(double) * reps);
            for (int q = 0; q < reps; q++) {
                const double t0 = kvs_now_ms();
                kvs_dct_lowpass_sqres(bp, &layers[0].k, 0, omega, &lo, acc, &e);
                tb[q] = kvs_now_ms() - t0;
            }
            qsort(tb, (size_t)reps, sizeof *tb, cmp_d);
            blk[r] = tb[reps / 2];
            free(acc), free(tb);
            kvs_dct_plan_destroy(bp);
        }
        printf("| %d | %s | %d x %d | %.1f | %.1f [%.1f] | %.1f [%.1f] | %.2f | %.1f / %.1f = %.2f | "
               "%.2f [%.2f] |\n",
               N, kvs_dct_plan_route(dp) == KVS_DCT_DIRECT ? "direct" : "bluestein",
               kvs_dct_plan_fft_size(dp, 1), kvs_dct_plan_fft_blocks(dp, 1), first, tf[reps / 2],
               tf[0], ts[reps / 2], ts[0], tf[reps / 2] / ts[reps / 2], cf[reps / 2], cs[reps / 2],
               cf[reps / 2] / cs[reps / 2], blk[0], blk[1]);
        fflush(stdout);
        kvs_dct_plan_destroy(dp);
        free(tf), free(ts), free(cf), free(cs);
        for (int j = 0; j < 2 * L; j++) free(h16[j]);
        free(h16), free(layers);
        kvs_dense_cache_free(&dc);
    }
    return 0;
}
