/*
 * test_backend_quant_cols.c -- the multi-column integer dot products of
 * batched decode (kvs_dot_q8a_cols): for every quantised weight type with an
 * integer kernel (Q8_0, Q5_0, Q4_K, Q6_K, Q4_0), random rows against 1..19 random
 * activation columns give results bit-identical to kvs_dot_q8a column by
 * column (the batch == alone guarantee rests on it), and close to the
 * dequantised double dot (the test can fail: a wrong unpacking is caught by
 * both). Row lengths whose block count is and is not a multiple of 8 (the
 * Q8_0/Q5_0 kernels take 8 blocks or 8 columns per vector), and the
 * multi-row form kvs_dot_q8a_rows (6 rows, strided output) the same way.
 * The x86-64-v3 kernels and the AVX-512 VNNI build of the same kernels
 * (dot_vnni.c) agree bit for bit on all of it, also with Q8_0 weights of
 * -128 against activations of +-127 (the int16 pair sums the AVX2 path
 * forms are closest to saturating there); where the CPU has no VNNI that
 * comparison is skipped and says so.
 */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
int kvs_dot_vnni_available(void);
void kvs_dot_q8a_rows_base(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);

/* The base and the VNNI build on the same rows and columns: bit for bit. */
static void check_builds(int type, const uint8_t *rows, size_t rb, int nrows, const kvs_q8a_block *xq, int64_t xs,
                         int nc, int n, const char *what) {
    enum { MAXV = 19 * 8 };
    float yb[MAXV], yv[MAXV];
    if (!kvs_dot_vnni_available() || nc * nrows > MAXV) return;
    kvs_dot_q8a_rows_base(type, rows, rb, nrows, xq, xs, nc, n, yb, nrows);
    kvs_dot_q8a_rows_vnni(type, rows, rb, nrows, xq, xs, nc, n, yv, nrows);
    for (int i = 0; i < nc * nrows; i++)
        CHECK_MSG(!memcmp(&yb[i], &yv[i], sizeof yb[i]), "%s %s n=%d: row %d column %d: VNNI %.9g vs base %.9g",
                  kvs_ggml_type_name(type), what, n, i % nrows, i / nrows, yv[i], yb[i]);
}

int main(void) {
    kvs_err err = {0};
    static const int types[] = {KVS_GGML_Q8_0, KVS_GGML_Q5_0, KVS_GGML_Q4_K, KVS_GGML_Q6_K, KVS_GGML_Q4_0};
    enum { NMAX = 1024, MAXC = 19, R = 6 };
    float *w = malloc(NMAX * sizeof *w), *xs = malloc((size_t)MAXC * NMAX * sizeof *xs), *wd = malloc(NMAX * sizeof *wd);
    uint8_t *row = malloc(R * kvs_ggml_row_size(KVS_GGML_Q8_0, NMAX) + 64);
    kvs_q8a_block *xq = malloc((size_t)MAXC * (NMAX / 32) * sizeof *xq);
    float y[MAXC], yr[MAXC * (R + 1)];
    uint64_t rng = 42;
    if (!w || !xs || !wd || !row || !xq) return 1;
    for (int ti = 0; ti < 10; ti++) {
        int type = types[ti % 5];
        /* 32 or 3 blocks of 256 (K types), 32 or 21 blocks of 32 */
        const int N = ti < 5 ? NMAX : (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K ? 768 : 672);
        const size_t rb = kvs_ggml_row_size(type, N);
        for (int rep = 0; rep < 8; rep++) {
            for (int i = 0; i < N; i++) w[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1) * (1 + (i % 7));
            for (int i = 0; i < MAXC * N; i++) xs[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1);
            CHECK_OK(kvs_quant_row(type, w, row, N, &err), &err);
            for (int r = 1; r < R; r++) { /* more rows for kvs_dot_q8a_rows: the first one permuted */
                for (int i = 0; i < N; i++) wd[i] = w[(i * 7 + r) % N] * (float)(r + 1);
                CHECK_OK(kvs_quant_row(type, wd, row + (size_t)r * rb, N, &err), &err);
            }
            CHECK_OK(kvs_dequant_row(type, row, wd, N, &err), &err);
            for (int c = 0; c < MAXC; c++) kvs_q8a_quantize(xs + (size_t)c * N, xq + (size_t)c * (N / 32), N);
            static const int ncs[8] = {1, 2, 4, 7, 9, 10, 15, 19}; /* last tiles of 1, 2, 3, 4, 7, 8 columns */
            int nc = ncs[rep];
            kvs_dot_q8a_cols(type, row, xq, N / 32, nc, N, y);
            kvs_dot_q8a_rows(type, row, rb, R, xq, N / 32, nc, N, yr, R + 1);
            check_builds(type, row, rb, R, xq, N / 32, nc, N, "random");
            for (int c = 0; c < nc; c++)
                for (int r = 0; r < R; r++) {
                    float one = kvs_dot_q8a(type, row + (size_t)r * rb, xq + (size_t)c * (N / 32), N);
                    CHECK_MSG(!memcmp(&one, &yr[c * (R + 1) + r], sizeof one),
                              "%s n=%d rows: row %d column %d of %d: %.9g vs alone %.9g", kvs_ggml_type_name(type), N,
                              r, c, nc, yr[c * (R + 1) + r], one);
                }
            for (int c = 0; c < nc; c++) {
                float one = kvs_dot_q8a(type, row, xq + (size_t)c * (N / 32), N);
                CHECK_MSG(!memcmp(&one, &y[c], sizeof one), "%s n=%d column %d of %d: %.9g vs alone %.9g",
                          kvs_ggml_type_name(type), N, c, nc, y[c], one);
                double ref = 0, mag = 0;
                for (int i = 0; i < N; i++) {
                    ref += (double)wd[i] * xs[(size_t)c * N + i];
                    mag += fabs((double)wd[i] * xs[(size_t)c * N + i]);
                }
                CHECK_MSG(fabs(y[c] - ref) <= 2e-2 * mag, "%s column %d: %g vs dequantised %g", kvs_ggml_type_name(type),
                          c, y[c], ref);
            }
        }
    }
    /* Extremes: Q8_0 weights of -128 and +127 against activations of -127 /
     * +127 (hand-made blocks, all scales 1), and Q4_1 / Q4_K rows through the
     * one-column kernels, VNNI build against base. */
    if (kvs_dot_vnni_available()) {
        const int N = 256, nb = N / 32;
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = row + (size_t)b * 34;
            const uint16_t one = 0x3C00; /* f16 1.0 */
            memcpy(blk, &one, 2);
            for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(i % 3 == 0 ? -128 : (i % 3 == 1 ? 127 : -127));
        }
        for (int c = 0; c < 4; c++)
            for (int b = 0; b < nb; b++) {
                kvs_q8a_block *xb = &xq[(size_t)c * nb + b];
                xb->d = 1.0f;
                for (int i = 0; i < 32; i++) xb->q[i] = (int8_t)((i + c) % 2 ? 127 : -127);
                xb->sum16[0] = xb->sum16[1] = 0;
            }
        check_builds(KVS_GGML_Q8_0, row, 34 * (size_t)nb, 1, xq, nb, 4, N, "extremes");
        static const int more[] = {KVS_GGML_Q4_1, KVS_GGML_Q4_K, KVS_GGML_Q5_0, KVS_GGML_Q6_K};
        for (int t = 0; t < 4; t++) {
            for (int i = 0; i < N; i++) w[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1);
            for (int i = 0; i < 4 * N; i++) xs[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1);
            CHECK_OK(kvs_quant_row(more[t], w, row, N, &err), &err);
            for (int c = 0; c < 4; c++) kvs_q8a_quantize(xs + (size_t)c * N, xq + (size_t)c * nb, N);
            check_builds(more[t], row, kvs_ggml_row_size(more[t], N), 1, xq, nb, 4, N, "one row");
        }
        printf("backend_quant_cols: the AVX-512 VNNI kernels equal the base ones bit for bit\n");
    } else {
        printf("backend_quant_cols: SKIP the VNNI comparison: this build or CPU has no AVX-512 VNNI kernels\n");
    }
    free(w);
    free(xs);
    free(wd);
    free(row);
    free(xq);
    return kvs_test_finish("backend_quant_cols");
}
