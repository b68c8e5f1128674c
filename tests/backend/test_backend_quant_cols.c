/*
 * test_backend_quant_cols.c -- the multi-column integer dot products of
 * batched decode (kvs_dot_q8a_cols): for every quantised weight type with an
 * integer kernel (Q8_0, Q5_0, Q4_K, Q6_K), random rows against 1..19 random
 * activation columns give results bit-identical to kvs_dot_q8a column by
 * column (the batch == alone guarantee rests on it), and close to the
 * dequantised double dot (the test can fail: a wrong unpacking is caught by
 * both). Row lengths whose block count is and is not a multiple of 8 (the
 * Q8_0/Q5_0 kernels take 8 blocks or 8 columns per vector), and the
 * multi-row form kvs_dot_q8a_rows (6 rows, strided output) the same way.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);

int main(void) {
    kvs_err err = {0};
    static const int types[] = {KVS_GGML_Q8_0, KVS_GGML_Q5_0, KVS_GGML_Q4_K, KVS_GGML_Q6_K};
    enum { NMAX = 1024, MAXC = 19, R = 6 };
    float *w = malloc(NMAX * sizeof *w), *xs = malloc((size_t)MAXC * NMAX * sizeof *xs), *wd = malloc(NMAX * sizeof *wd);
    uint8_t *row = malloc(R * kvs_ggml_row_size(KVS_GGML_Q8_0, NMAX) + 64);
    kvs_q8a_block *xq = malloc((size_t)MAXC * (NMAX / 32) * sizeof *xq);
    float y[MAXC], yr[MAXC * (R + 1)];
    uint64_t rng = 42;
    if (!w || !xs || !wd || !row || !xq) return 1;
    for (int ti = 0; ti < 8; ti++) {
        int type = types[ti % 4];
        /* 32 or 3 blocks of 256 (K types), 32 or 21 blocks of 32 */
        const int N = ti < 4 ? NMAX : (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K ? 768 : 672);
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
    free(w);
    free(xs);
    free(wd);
    free(row);
    free(xq);
    return kvs_test_finish("backend_quant_cols");
}
