/*
 * test_backend_attn.c -- decode attention's row kernels (backend/cpu/simd.c,
 * private): the group kernels, which take the query heads of one GQA group
 * over the same f16 / bf16 cache rows, against the one-head kernels
 * (kvs_dot_cache: q . k; kvs_axpy_cache: o += a x) bit for bit, for 1 to 11
 * heads (one pass, several, uneven splits), head sizes with and without
 * 8- and 16-element tails, row counts around the 32-row block, and rows with
 * a stride wider than the head. Values are random normal with some large and
 * tiny ones, so a changed summation order would show (a kernel that summed a
 * row's tail in reverse failed 522 of these checks).
 * Where the CPU has AVX-512F the group kernels run attn512.c for head sizes
 * that are multiples of 32 and simd.c's AVX2 kernels for the rest; ctest
 * runs this test a second time with KVSIEVE_ATTN512=0 (backend_attn_avx2),
 * so both are checked on such a CPU. The kernels taken are printed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

float kvs_dot_cache(int ctype, const float *q, const void *k, int n);
void kvs_axpy_cache(int ctype, float *o, float a, const void *x, int n);
void kvs_dot_cache_heads(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride, int nrows,
                         int n, float scale, float *out, size_t ostride);
void kvs_axpy_cache_heads(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride, const void *x,
                          size_t rstride, int nrows, int n);
void kvs_cache_from_f32(int ctype, const float *src, void *dst, int n);
const char *kvs_attn_kernels(int ctype, int n);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float nrand(void) { /* normal, with a few values far from 1 in magnitude */
    double u = urand() + 1e-12, v = urand();
    float x = (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
    double r = urand();
    return r < 0.02 ? x * 300.0f : r < 0.04 ? x * 1e-3f : x;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* One case: nh heads of head size n against nrows rows of stride rs >= n. */
static void run_case(int ctype, int nh, int n, int nrows, int rs) {
    const size_t qs = (size_t)n + 3, os = (size_t)nrows + 5, ps = (size_t)nrows + 2, ostr = (size_t)n + 1;
    float *q = malloc(sizeof(float) * qs * nh), *rowsf = malloc(sizeof(float) * (size_t)rs * nrows);
    uint16_t *rows = malloc(sizeof(uint16_t) * (size_t)rs * nrows);
    float *ref = calloc((size_t)os * nh, sizeof(float)), *got = calloc((size_t)os * nh, sizeof(float));
    float *p = malloc(sizeof(float) * ps * nh);
    float *oref = malloc(sizeof(float) * ostr * nh), *o0 = malloc(sizeof(float) * ostr * nh);
    float *o1 = malloc(sizeof(float) * ostr * nh);
    for (size_t i = 0; i < qs * nh; i++) q[i] = nrand();
    for (size_t i = 0; i < (size_t)rs * nrows; i++) rowsf[i] = nrand();
    kvs_cache_from_f32(ctype, rowsf, rows, rs * nrows);
    for (size_t i = 0; i < ps * nh; i++) p[i] = (float)urand();
    for (size_t i = 0; i < ostr * nh; i++) o0[i] = nrand();
    const float scale = 0.125f;
    char what[160];
    snprintf(what, sizeof what, "%s nh %d n %d rows %d stride %d", ctype == KVS_CACHE_F16 ? "f16" : "bf16", nh, n,
             nrows, rs);

    /* dots: the reference is the one-head kernel per (head, row) */
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < nrows; t++)
            ref[(size_t)h * os + t] = kvs_dot_cache(ctype, q + (size_t)h * qs, rows + (size_t)t * rs, n) * scale;
    kvs_dot_cache_heads(ctype, q, qs, nh, rows, (size_t)rs, nrows, n, scale, got, os);
    int ok = 1;
    for (int h = 0; h < nh; h++) ok &= same_bits(ref + (size_t)h * os, got + (size_t)h * os, (size_t)nrows);
    CHECK_MSG(ok, "dot: %s: not the one-head kernel's bits", what);

    /* axpys: the reference is the one-head kernel per head over the rows in order */
    memcpy(oref, o0, sizeof(float) * ostr * nh);
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < nrows; t++)
            kvs_axpy_cache(ctype, oref + (size_t)h * ostr, p[(size_t)h * ps + t], rows + (size_t)t * rs, n);
    memcpy(o1, o0, sizeof(float) * ostr * nh);
    kvs_axpy_cache_heads(ctype, o1, ostr, nh, p, ps, rows, (size_t)rs, nrows, n);
    CHECK_MSG(same_bits(oref, o1, ostr * nh), "axpy: %s: not the one-head kernel's bits", what);
    free(q);
    free(rowsf);
    free(rows);
    free(ref);
    free(got);
    free(p);
    free(oref);
    free(o0);
    free(o1);
}

int main(void) {
    static const int heads[] = {1, 2, 3, 4, 5, 7, 8, 9, 11};
    static const int sizes[] = {64, 128, 256, 16, 8, 24, 40, 37, 5, 1};
    static const int nrows[] = {1, 3, 6, 31, 32, 33, 37, 97}; /* last groups of 1-8 rows */
    printf("group kernels: f16 n 64 %s, bf16 n 256 %s, f16 n 40 %s\n", kvs_attn_kernels(KVS_CACHE_F16, 64),
           kvs_attn_kernels(KVS_CACHE_BF16, 256), kvs_attn_kernels(KVS_CACHE_F16, 40));
    for (int c = 0; c < 2; c++) {
        const int ctype = c ? KVS_CACHE_BF16 : KVS_CACHE_F16;
        for (size_t a = 0; a < sizeof heads / sizeof *heads; a++)
            for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++)
                for (size_t r = 0; r < sizeof nrows / sizeof *nrows; r++) {
                    const int n = sizes[b];
                    run_case(ctype, heads[a], n, nrows[r], n);
                    if (nrows[r] == 32) run_case(ctype, heads[a], n, nrows[r], 2 * n + 8); /* strided rows */
                }
    }
    return kvs_test_finish("test_backend_attn");
}
