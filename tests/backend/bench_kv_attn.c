/*
 * bench_kv_attn.c -- a benchmark that prints (not a test): decode attention's
 * two cache kernels, the key dots of a GQA group (kvs_dot_cache_heads) and
 * the weighted value sums (kvs_axpy_cache_heads), per KV cache type, on one
 * KV head's rows as a decode step at a long context reads them.
 *
 *   bench_kv_attn [ROWS [HEADS [D [REPS]]]]   default 8192 rows, 7 heads, d 64, 30 reps
 *                                             (Qwen2.5-0.5B's group at 8K tokens)
 *
 * Times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), the minimum over
 * REPS (the machine may be shared: the minimum is the run least disturbed),
 * per type interleaved per repetition; ns per row is for all the heads.
 * What it is not: no model, no threads, no softmax (the engine's forward.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvs_backend.h"
#include "kvs_cpu.h"

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 8192, nh = argc > 2 ? atoi(argv[2]) : 7;
    const int D = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 30;
    static const int types[3] = {KVS_CACHE_F16, KVS_CACHE_Q8_0, KVS_CACHE_Q4_0};
    if (rows < 1 || nh < 1 || D < 32 || D % 32 || D > KVS_CACHE_QMAX || reps < 1) {
        fprintf(stderr, "usage: bench_kv_attn [ROWS [HEADS [D [REPS]]]] (D a multiple of 32, <= %d)\n",
                KVS_CACHE_QMAX);
        return 2;
    }
    float *src = malloc(sizeof(float) * (size_t)rows * D), *q = malloc(sizeof(float) * (size_t)nh * D);
    float *sc = malloc(sizeof(float) * (size_t)nh * rows), *o = malloc(sizeof(float) * (size_t)nh * D);
    void *cache[3];
    if (!src || !q || !sc || !o) return 1;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)rows * D; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    for (int i = 0; i < nh * D; i++) q[i] = src[i] * 3;
    for (int i = 0; i < nh * rows; i++) sc[i] = 1.0f / (float)rows;
    for (int t = 0; t < 3; t++) {
        const size_t rb = kvs_cache_row_size(types[t], D);
        cache[t] = malloc(rb * (size_t)rows);
        if (!cache[t]) return 1;
        for (int r = 0; r < rows; r++)
            kvs_cache_from_f32(types[t], src + (size_t)r * D, (char *)cache[t] + rb * (size_t)r, D);
    }
    double best_k[3], best_v[3];
    for (int t = 0; t < 3; t++) best_k[t] = best_v[t] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int t = 0; t < 3; t++) {
            double t0 = now_ns();
            kvs_dot_cache_heads(types[t], q, (size_t)D, nh, cache[t], (size_t)D, rows, D, 0.125f, sc, (size_t)rows);
            double t1 = now_ns();
            for (int i = 0; i < nh * rows; i++) sc[i] = 1.0f / (float)rows;
            double t2 = now_ns();
            kvs_axpy_cache_heads(types[t], o, (size_t)D, nh, sc, (size_t)rows, cache[t], (size_t)D, rows, D);
            double t3 = now_ns();
            if (t1 - t0 < best_k[t]) best_k[t] = t1 - t0;
            if (t3 - t2 < best_v[t]) best_v[t] = t3 - t2;
        }
    printf("%d rows, %d heads, d %d, min of %d reps (thread CPU time), kernels: %s / %s\n", rows, nh, D, reps,
           kvs_attn_kernels(KVS_CACHE_F16, D), kvs_attn_kernels(KVS_CACHE_Q8_0, D));
    for (int t = 0; t < 3; t++)
        printf("%-5s keys %7.2f ns/row  values %7.2f ns/row  both %7.2f ns/row  (%.3f x f16's time)\n",
               kvs_cache_type_name(types[t]), best_k[t] / rows, best_v[t] / rows, (best_k[t] + best_v[t]) / rows,
               (best_k[t] + best_v[t]) / (best_k[0] + best_v[0]));
    for (int t = 0; t < 3; t++) free(cache[t]);
    free(src), free(q), free(sc), free(o);
    return 0;
}
