/*
 * test_backend_argmax.c -- kvs_argmax (backend/cpu/simd.c), the greedy sampler
 * of the server, `kvsieve bench` and `kvsieve generate`: on random rows of
 * every length 0..70 and a vocabulary-sized one, with ties, -0 / +0,
 * infinities and a NaN at every position class, it returns what the scalar
 * loop `if (x[i] > x[best]) best = i` returns (first maximum), and -1 for
 * an empty row or any NaN.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvs_backend.h"
#include "test_util.h"

static int scalar(const float *x, int n) {
    if (n <= 0) return -1;
    int b = 0;
    for (int i = 0; i < n; i++)
        if (isnan(x[i])) return -1;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(void) {
    enum { V = 262144 + 5 };
    float *x = malloc(V * sizeof *x);
    uint64_t rng = 3;
    if (!x) return 1;
    for (int n = 0; n <= 70; n++)
        for (int rep = 0; rep < 40; rep++) {
            for (int i = 0; i < n; i++) {
                double u = kvs_rng_uniform(&rng);
                x[i] = (float)(int)(u * 8) - 4.0f; /* few values: ties */
                if (rep % 5 == 1 && u < 0.2) x[i] = -0.0f;
                if (rep % 5 == 2 && u < 0.1) x[i] = (float)INFINITY;
                if (rep % 5 == 3) x[i] = -(float)INFINITY;
            }
            if (rep % 10 == 4 && n > 0) x[(rep * 7) % n] = NAN;
            if (rep % 10 == 9 && n > 0) x[n - 1] = NAN;
            CHECK_MSG(kvs_argmax(x, n) == scalar(x, n), "n=%d rep %d: %d vs %d", n, rep, kvs_argmax(x, n),
                      scalar(x, n));
        }
    for (int i = 0; i < V; i++) x[i] = (float)(kvs_rng_uniform(&rng) * 20 - 10);
    x[V - 3] = 10.5f;
    x[V / 2] = 10.5f;
    CHECK_EQ_INT(kvs_argmax(x, V), V / 2);
    x[7] = NAN;
    CHECK_EQ_INT(kvs_argmax(x, V), -1);
    free(x);
    return kvs_test_finish("backend_argmax");
}
