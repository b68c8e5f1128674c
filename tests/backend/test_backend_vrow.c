/*
 * test_backend_vrow.c -- the softmax row helpers of the attention passes
 * (backend/cpu/simd.c, private): kvs_vmax against the scalar loop it replaced,
 * `if (x[i] > m) m = x[i]` from m = -inf (NaN elements passed over), and
 * kvs_vscale against `x[i] *= a`, on rows of every length 0..70 and one of
 * 40,000, at every offset 0..7 (unaligned loads), with ties, signed zeros,
 * infinities and NaNs. The maximum is compared by value (a +0 / -0 tie may
 * come out with either sign: the row then enters exp(x - max), where both
 * give the same numbers); the scaled rows bit for bit. kvs_vsilu_mul
 * (the SwiGLU gate, exp in the vector lanes) against silu(g) * u in double
 * precision: within 4e-7 relative (a few float ulps) over g in [-87, 100]
 * at every length 0..40 (vector body and scalar tail); below -87 (silu under
 * 1e-35) only under 1e-30 in magnitude, and g itself at the far positive end.
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
void kvs_vsilu_mul(float *g, const float *u, int n);

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
    double worst = 0;
    int worst_n = 0;
    for (int n = 0; n <= 40; n++)
        for (int rep = 0; rep < 200; rep++) {
            for (int i = 0; i < n; i++) {
                x[i] = (float)(kvs_rng_uniform(&rng) * 200 - 100) * (rep % 4 == 0 ? 0.05f : 1.0f);
                y[i] = (float)(kvs_rng_uniform(&rng) * 4 - 2);
            }
            float g[41], u[41];
            memcpy(g, x, (size_t)n * sizeof *g);
            memcpy(u, y, (size_t)n * sizeof *u);
            kvs_vsilu_mul(g, u, n);
            for (int i = 0; i < n; i++) {
                const double want = (double)x[i] / (1.0 + exp(-(double)x[i])) * (double)y[i];
                /* below -87 silu is under 1e-35: exp256's clamp gives g e^-88, libm's 0 or g e^g */
                const double err = x[i] < -87.0f ? (fabs(g[i]) > 1e-30 ? 1.0 : 0.0)
                                                 : fabs(g[i] - want) / fmax(fabs(want), 1e-30);
                if (err > worst) worst = err, worst_n = n;
            }
        }
    CHECK_MSG(worst < 4e-7, "vsilu_mul: relative error %.3g (n=%d) above 4e-7", worst, worst_n);
    static const float in[16] = {-100, -95, -90, -88, 88, 90, 95, 100, -100, -95, -90, -88, 88, 90, 95, 100};
    float far[16], one[16];
    for (int i = 0; i < 16; i++) far[i] = in[i], one[i] = 1.0f;
    kvs_vsilu_mul(far, one, 16);
    for (int i = 0; i < 16; i++) { /* silu(g) is 0 or g there, to float precision */
        const float g0 = in[i] > 0 ? in[i] : 0.0f;
        CHECK_MSG(fabsf(far[i] - g0) <= 1e-30f + 1e-7f * fabsf(g0), "vsilu_mul far end %d: %g, want %g", i, far[i], g0);
    }
    free(x);
    free(y);
    return kvs_test_finish("backend_vrow");
}
