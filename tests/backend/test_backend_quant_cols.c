/*
 * test_backend_quant_cols.c -- the multi-column integer dot products of
 * batched decode (kvs_dot_q8a_cols): for every quantised weight type with an
 * integer kernel (Q8_0, Q5_0, Q4_K, Q6_K), random rows against 1..19 random
 * activation columns give results bit-identical to kvs_dot_q8a column by
 * column (the batch == alone guarantee rests on it), and close to the
 * dequantised double dot (the test can fail: a wrong unpacking is caught by
 * both).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);

int main(void) {
    kvs_err err = {0};
    static const int types[] = {KVS_GGML_Q8_0, KVS_GGML_Q5_0, KVS_GGML_Q4_K, KVS_GGML_Q6_K};
    enum { N = 1024, MAXC = 19 };
    float *w = malloc(N * sizeof *w), *xs = malloc((size_t)MAXC * N * sizeof *xs), *wd = malloc(N * sizeof *wd);
    uint8_t *row = malloc(kvs_ggml_row_size(KVS_GGML_Q8_0, N) + 64);
    kvs_q8a_block *xq = malloc((size_t)MAXC * (N / 32) * sizeof *xq);
    float y[MAXC];
    uint64_t rng = 42;
    if (!w || !xs || !wd || !row || !xq) return 1;
    for (int ti = 0; ti < 4; ti++) {
        int type = types[ti];
        for (int rep = 0; rep < 8; rep++) {
            for (int i = 0; i < N; i++) w[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1) * (1 + (i % 7));
            for (int i = 0; i < MAXC * N; i++) xs[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1);
            CHECK_OK(kvs_quant_row(type, w, row, N, &err), &err);
            CHECK_OK(kvs_dequant_row(type, row, wd, N, &err), &err);
            for (int c = 0; c < MAXC; c++) kvs_q8a_quantize(xs + (size_t)c * N, xq + (size_t)c * (N / 32), N);
            int nc = 1 + rep * 18 / 7;
            kvs_dot_q8a_cols(type, row, xq, N / 32, nc, N, y);
            for (int c = 0; c < nc; c++) {
                float one = kvs_dot_q8a(type, row, xq + (size_t)c * (N / 32), N);
                CHECK_MSG(!memcmp(&one, &y[c], sizeof one), "%s column %d of %d: %.9g vs alone %.9g",
                          kvs_ggml_type_name(type), c, nc, y[c], one);
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
