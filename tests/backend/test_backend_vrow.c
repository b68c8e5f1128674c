/*
 * test_backend_vrow.c -- the softmax row helpers of the attention passes
 * (backend/simd.c, private): kvs_vmax against the scalar loop it replaced,
 * `if (x[i] > m) m = x[i]` from m = -inf (NaN elements passed over), and
 * kvs_vscale against `x[i] *= a`, on rows of every length 0..70 and one of
 * 40,000, at every offset 0..7 (unaligned loads), with ties, signed zeros,
 * infinities and NaNs. The maximum is compared by value (a +0 / -0 tie may
 * come out with either sign: the row then enters exp(x - max), where both
 * give the same numbers); the scaled rows bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

float kvs_vmax(const float *x, int n);
void kvs_vscale(float *x, int n, float a);

static float scalar_max(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

static int same_value(float a, float b) { return a == b || (isnan(a) && isnan(b)); }

int main(void) {
    enum { BIG = 40000 };
    float *x = malloc((BIG + 8) * sizeof *x), *y = malloc((BIG + 8) * sizeof *y);
    uint64_t rng = 11;
    if (!x || !y) return 1;
    for (int n = 0; n <= 70; n++)
        for (int off = 0; off < 8; off++)
            for (int rep = 0; rep < 12; rep++) {
                float *r = x + off;
                for (int i = 0; i < n; i++) {
                    double u = kvs_rng_uniform(&rng);
                    r[i] = rep % 2 ? (float)(u * 200 - 100) : (float)(int)(u * 6) - 3.0f;
                    if (rep % 6 == 1 && u < 0.3) r[i] = u < 0.15 ? -0.0f : 0.0f;
                    if (rep % 6 == 2 && u < 0.1) r[i] = (float)INFINITY;
                    if (rep % 6 == 3) r[i] = -(float)INFINITY;
                    if (rep % 6 == 4 && u < 0.2) r[i] = NAN;
                    if (rep % 6 == 5) r[i] = NAN; /* all NaN: -inf */
                }
                const float got = kvs_vmax(r, n), want = scalar_max(r, n);
                CHECK_MSG(same_value(got, want), "vmax n=%d off %d rep %d: %g vs %g", n, off, rep, got, want);
                const float a = (float)(kvs_rng_uniform(&rng) * 3.0 - 1.0);
                memcpy(y, x, (size_t)(n + off) * sizeof *y);
                kvs_vscale(r, n, a);
                int bad = -1;
                for (int i = 0; i < n; i++) {
                    const float w = y[off + i] * a;
                    if (memcmp(&w, &r[i], sizeof w) != 0) bad = i;
                }
                CHECK_MSG(bad < 0, "vscale n=%d off %d rep %d: element %d differs", n, off, rep, bad);
            }
    for (int i = 0; i < BIG; i++) x[i] = (float)(kvs_rng_uniform(&rng) * 50 - 25);
    x[BIG - 1] = 31.0f;
    CHECK_MSG(kvs_vmax(x, BIG) == 31.0f, "vmax of %d: last element", BIG);
    x[BIG / 3] = 40.0f;
    x[5] = NAN;
    CHECK_MSG(kvs_vmax(x, BIG) == 40.0f, "vmax of %d: middle element with a NaN", BIG);
    free(x);
    free(y);
    return kvs_test_finish("backend_vrow");
}
