/*
 * bench_attn.c -- micro-benchmark of the two attention passes (kvs_attn_lse
 * + kvs_attn_colsum) and of the fused one-pass kvs_attn_colsum_fused, the
 * dominant cost of H2O / LOOK-M / MEDA on CPU.
 * Not a test: it prints ms and GFLOP/s (logit FLOPs only: 2 d per causal
 * (query, key) pair per query head and pass; one pass for fused) at the gemma3-270m shape
 * (Hq 4, Hkv 1, d 256, Nq = N) for N = 2048 and 8192 on 1 and 2 threads,
 * plus the projection to 18 layers. With --extra it also times
 * kvs_attn_entropies (MEDA's pass, given lse), kvs_attn_stats_fused (lse +
 * colsum + entropies in one pass) and kvs_apply with pivotal merging at
 * rho = 0.2 (one layer, every 5th token kept).
 * Usage: bench_attn [--f16] [--extra] [--reps R] [--n N]...
 */
#include "kvsieve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    kvs_dtype t = KVS_F32;
    int reps = 3, nn = 0, ns[8], extra = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--f16")) t = KVS_F16;
        else if (!strcmp(argv[i], "--extra")) extra = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc && nn < 8) ns[nn++] = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--f16] [--extra] [--reps R] [--n N]...\n", argv[0]);
            return 2;
        }
    }
    if (nn == 0) {
        ns[nn++] = 2048;
        ns[nn++] = 8192;
    }
    if (reps < 1) reps = 1;
    const int Hq = 4, Hkv = 1, d = 256;
    printf("bench_attn: kvs_attn_lse + kvs_attn_colsum, Hq %d Hkv %d d %d Nq = N, dtype %s, "
           "%d reps (median), %ld online CPUs\n", Hq, Hkv, d, kvs_dtype_name(t), reps,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("%6s %7s %10s %10s %10s %10s %9s %14s\n", "N", "threads", "path", "lse_ms", "colsum_ms",
           "total_ms", "GFLOP/s", "18_layers_s");
    for (int ni = 0; ni < nn; ni++) {
        const int N = ns[ni];
        const size_t es = kvs_dtype_size(t);
        void *q = malloc(es * (size_t)Hq * N * d), *k = malloc(es * (size_t)Hkv * N * d);
        float *lse = malloc(sizeof(float) * (size_t)Hq * N), *cs = malloc(sizeof(float) * (size_t)Hkv * N);
        if (!q || !k || !lse || !cs) {
            fprintf(stderr, "bench_attn: out of memory at N = %d\n", N);
            return 1;
        }
        uint64_t rng = 1234;
        for (size_t x = 0; x < (size_t)Hq * N * d; x++) {
            const float f = (float)kvs_rng_normal(&rng);
            if (t == KVS_F32) ((float *)q)[x] = f;
            else ((uint16_t *)q)[x] = kvs_f32_to_f16(f);
        }
        for (size_t x = 0; x < (size_t)Hkv * N * d; x++) {
            const float f = (float)kvs_rng_normal(&rng);
            if (t == KVS_F32) ((float *)k)[x] = f;
            else ((uint16_t *)k)[x] = kvs_f32_to_f16(f);
        }
        kvs_view qv = kvs_view_make(q, t, Hq, N, d), kv = kvs_view_make(k, t, Hkv, N, d);
        const double flops = 2.0 * d * ((double)N * (N + 1) / 2.0) * Hq; /* per pass */
        for (int th = 1; th <= 2; th++) {
            double tl[16], tc[16];
            const int R = reps > 16 ? 16 : reps;
            kvs_err err = {0};
            for (int r = 0; r < R; r++) {
                double t0 = kvs_now_ms();
                if (kvs_attn_lse(&qv, &kv, lse, th, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                double t1 = kvs_now_ms();
                if (kvs_attn_colsum(&qv, &kv, lse, cs, NULL, th, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                double t2 = kvs_now_ms();
                tl[r] = t1 - t0;
                tc[r] = t2 - t1;
            }
            qsort(tl, R, sizeof(double), cmp_d);
            qsort(tc, R, sizeof(double), cmp_d);
            const double ml = tl[R / 2], mc = tc[R / 2], tot = ml + mc;
            printf("%6d %7d %10s %10.1f %10.1f %10.1f %9.1f %14.2f\n", N, th, "two-pass", ml, mc,
                   tot, 2.0 * flops / (tot * 1e6), 18.0 * tot / 1000.0);
            fflush(stdout);
            double tf[16];
            for (int r = 0; r < R; r++) {
                const double t0 = kvs_now_ms();
                if (kvs_attn_colsum_fused(&qv, &kv, lse, cs, NULL, th, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                tf[r] = kvs_now_ms() - t0;
            }
            qsort(tf, R, sizeof(double), cmp_d);
            const double mf = tf[R / 2];
            printf("%6d %7d %10s %10s %10s %10.1f %9.1f %14.2f\n", N, th, "fused", "-", "-", mf,
                   flops / (mf * 1e6), 18.0 * mf / 1000.0);
            fflush(stdout);
        }
        if (extra) {
            kvs_err err = {0};
            kvs_entropy_stats est;
            uint8_t *mod = malloc((size_t)N);
            for (int j = 0; j < N; j++) mod[j] = j >= N / 8 && j < N / 2 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
            for (int th = 1; th <= 2; th++) {
                const double t0 = kvs_now_ms();
                if (kvs_attn_entropies(&qv, &kv, lse, mod, &est, th, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                printf("  entropies N %d threads %d: %.1f ms (plain %.3f E_TV %.3f E_VT %.3f)\n", N,
                       th, kvs_now_ms() - t0, est.plain, est.e_tv, est.e_vt);
                /* MEDA's whole need (lse + colsum + entropies) in one pass */
                const double t1 = kvs_now_ms();
                if (kvs_attn_stats_fused(&qv, &kv, mod, NULL, cs, NULL, &est, th, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                printf("  stats_fused (lse + colsum + entropies) N %d threads %d: %.1f ms (plain %.3f "
                       "E_TV %.3f E_VT %.3f)\n", N, th, kvs_now_ms() - t1, est.plain, est.e_tv,
                       est.e_vt);
            }
            /* apply: V = K is enough for timing */
            kvs_layer ly = {.k = kv, .v = kv, .q = qv};
            kvs_cache_view cv = {.n_layers = 1, .layers = &ly, .modality = mod};
            kvs_plan plan;
            const int B = N / 5;
            if (kvs_plan_init(&plan, "bench", 1, Hkv, N, &B, &err) != KVS_OK) {
                fprintf(stderr, "bench_attn: %s\n", err.msg);
                return 1;
            }
            for (int h = 0; h < Hkv; h++)
                for (int b = 0; b < B; b++) plan.layers[0].idx[h * B + b] = 5 * b;
            for (int m = KVS_MERGE_NONE; m <= KVS_MERGE_WEIGHTED; m++) {
                kvs_dense_cache out;
                plan.merge = (kvs_merge)m;
                const double t0 = kvs_now_ms();
                if (kvs_apply(&cv, &plan, &out, &err) != KVS_OK) {
                    fprintf(stderr, "bench_attn: %s\n", err.msg);
                    return 1;
                }
                printf("  apply N %d B %d merge %s: %.1f ms per layer\n", N, B,
                       kvs_merge_name((kvs_merge)m), kvs_now_ms() - t0);
                kvs_dense_cache_free(&out);
            }
            kvs_plan_free(&plan);
            free(mod);
        }
        free(q);
        free(k);
        free(lse);
        free(cs);
    }
    return 0;
}
