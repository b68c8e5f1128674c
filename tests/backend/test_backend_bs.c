/*
 * test_backend_bs.c -- the block-scale route of the Q8_0 / Q5_0 / Q4_K / Q6_K
 * dots (backend/cpu/dot_bs.c, with its AVX-512 VNNI engine, and dot_amx.c, its
 * AMX-INT8 one). Everywhere: its plain C form kvs_dot_q8a_bs_ref is close to
 * the dequantised double dot (a wrong unpacking fails here), and the route is
 * only offered for Q8_0 / Q5_0 (and Q4_K / Q6_K, n a multiple of 256) rows of
 * n <= 8192. Where the CPU has an engine: the one-row kernel, the one-column
 * kernels (rows in the lanes) and the many-column kernels (columns in the
 * lanes), through kvs_dot_q8a and kvs_dot_q8a_rows as decode calls them, and
 * the VNNI engine called directly (on an AMX machine the other engine), equal
 * the reference bit for bit (the batch == alone guarantee, and the same bits
 * from both engines), for rows of 1 to 256 blocks (odd counts: the AMX
 * kernels take blocks in pairs), 16-row groups with and without tail rows, 1
 * to 40 columns (partial 16-column tiles, more than one tile, strided
 * output) and 70-300 (prefill's chunks of tokens, many passes), Q8_0 weights of -128 against activations of +-127, and rows long
 * enough that the packed activations need more than one pass. Without an
 * engine those comparisons cannot run: the test says so and exits 77
 * (SKIPPED).
 */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

int kvs_dot_bs_engine(void);
int kvs_dot_bs_vnni_available(void);
int kvs_dot_bs_route(int type, int64_t n);
void kvs_dot_q8a_rows_bs_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                              int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
float kvs_dot_q8a_bs_ref(int type, const void *row, const kvs_q8a_block *x, int64_t n);

/* Q8_0 weights of -128 (the quantiser never writes them; the format allows
 * them) in every 5th value of every row. */
static void put_minus128(uint8_t *rows, size_t rb, int nrows, int n) {
    for (int r = 0; r < nrows; r++)
        for (int i = 0; i < n; i += 5) rows[(size_t)r * rb + (size_t)(i / 32) * 34 + 2 + i % 32] = 0x80;
}

int main(void) {
    kvs_err err = {0};
    const int route = kvs_dot_bs_engine() > 0, vnni = kvs_dot_bs_vnni_available();
    const int eng = route || vnni; /* an engine to compare */
    enum { NMAX = 8192, RMAX = 37, CMAX = 300 };
    float *w = malloc(NMAX * sizeof *w), *xs = malloc(NMAX * sizeof *xs), *wd = malloc(NMAX * sizeof *wd);
    uint8_t *rows = malloc((size_t)RMAX * kvs_ggml_row_size(KVS_GGML_Q8_0, NMAX));
    kvs_q8a_block *xq = malloc((size_t)CMAX * (NMAX / 32) * sizeof *xq);
    float *out = malloc((size_t)CMAX * (RMAX + 3) * sizeof *out);
    uint64_t rng = 7;
    if (!w || !xs || !wd || !rows || !xq || !out) return 1;

    CHECK(!kvs_dot_bs_route(KVS_GGML_Q4_K, 640) && !kvs_dot_bs_route(KVS_GGML_Q6_K, 640));
    CHECK(!kvs_dot_bs_route(KVS_GGML_Q4_1, 1024) && !kvs_dot_bs_route(KVS_GGML_Q8_0, 0));
    CHECK_EQ_INT(kvs_dot_bs_route(KVS_GGML_Q4_K, 1024), route);
    CHECK_EQ_INT(kvs_dot_bs_route(KVS_GGML_Q6_K, 2048), route);
    CHECK(!kvs_dot_bs_route(KVS_GGML_Q8_0, NMAX + 32) && !kvs_dot_bs_route(KVS_GGML_Q5_0, 48));
    CHECK_EQ_INT(kvs_dot_bs_route(KVS_GGML_Q8_0, 640), route);

    static const struct { int type, n, nrows, ncols; } cases[] = {
        {KVS_GGML_Q8_0, 32, 16, 1},    {KVS_GGML_Q8_0, 640, 37, 1},   {KVS_GGML_Q8_0, 672, 16, 2},
        {KVS_GGML_Q8_0, 896, 37, 17},  {KVS_GGML_Q8_0, 64, 32, 16},   {KVS_GGML_Q8_0, 640, 16, 40},
        {KVS_GGML_Q8_0, 8192, 17, 33}, {KVS_GGML_Q5_0, 32, 16, 3},    {KVS_GGML_Q5_0, 640, 37, 1},
        {KVS_GGML_Q5_0, 672, 16, 16},  {KVS_GGML_Q5_0, 896, 33, 40},  {KVS_GGML_Q5_0, 8192, 16, 1},
        {KVS_GGML_Q5_0, 8192, 20, 18}, {KVS_GGML_Q8_0, 2048, 5, 7},    {KVS_GGML_Q4_K, 256, 16, 1},
        {KVS_GGML_Q4_K, 768, 37, 1},   {KVS_GGML_Q4_K, 1024, 16, 17}, {KVS_GGML_Q4_K, 2048, 33, 40},
        {KVS_GGML_Q4_K, 8192, 16, 3},  {KVS_GGML_Q4_K, 256, 5, 2},     {KVS_GGML_Q6_K, 256, 16, 1},
        {KVS_GGML_Q6_K, 768, 37, 1},   {KVS_GGML_Q6_K, 1024, 16, 17}, {KVS_GGML_Q6_K, 2048, 33, 40},
        {KVS_GGML_Q6_K, 8192, 16, 3},  {KVS_GGML_Q6_K, 4864, 20, 2},
        /* 2-8 columns over whole groups: the VNNI engine's 256-bit path */
        {KVS_GGML_Q5_0, 896, 33, 8},   {KVS_GGML_Q8_0, 640, 48, 4},   {KVS_GGML_Q4_K, 768, 20, 8},
        {KVS_GGML_Q6_K, 1024, 33, 5},  {KVS_GGML_Q5_0, 4864, 16, 2},
        /* prefill chunks: a chunk's tokens as the columns, many passes of packed activations */
        {KVS_GGML_Q5_0, 896, 18, 300}, {KVS_GGML_Q6_K, 4864, 17, 70}, {KVS_GGML_Q4_K, 1024, 16, 161},
        {KVS_GGML_Q8_0, 576, 16, 129},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int type = cases[k].type, n = cases[k].n, R = cases[k].nrows, C = cases[k].ncols, nb = n / 32;
        const size_t rb = kvs_ggml_row_size(type, n);
        const int os = R + 3;
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < n; i++) w[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1) * (1 + (i + r) % 5);
            CHECK_OK(kvs_quant_row(type, w, rows + (size_t)r * rb, n, &err), &err);
        }
        if (type == KVS_GGML_Q8_0 && k % 2) put_minus128(rows, rb, R, n);
        for (int c = 0; c < C; c++) {
            for (int i = 0; i < n; i++) xs[i] = (float)(kvs_rng_uniform(&rng) * 2 - 1) * (1 + c % 3);
            kvs_q8a_quantize(xs, xq + (size_t)c * nb, n);
        }
        /* the reference against the dequantised rows and the activations' own values */
        for (int r = 0; r < R; r += 7) {
            CHECK_OK(kvs_dequant_row(type, rows + (size_t)r * rb, wd, n, &err), &err);
            const kvs_q8a_block *x = xq + (size_t)(r % C) * nb;
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                double xi = (double)x[i / 32].d * x[i / 32].q[i % 32];
                ref += wd[i] * xi;
                mag += fabs(wd[i] * xi);
            }
            float bs = kvs_dot_q8a_bs_ref(type, rows + (size_t)r * rb, x, n);
            const double tol = (type == KVS_GGML_Q4_K ? 1e-4 : 1e-5) * mag + 1e-6; /* Q4_K: two terms */
            CHECK_MSG(fabs(bs - ref) <= tol, "%s n=%d row %d: reference %.9g vs double %.9g",
                      kvs_ggml_type_name(type), n, r, bs, ref);
        }
        if (route) {
            for (int i = 0; i < C * os; i++) out[i] = -1.0f;
            kvs_dot_q8a_rows(type, rows, rb, R, xq, nb, C, n, out, os);
            for (int c = 0; c < C; c++)
                for (int r = 0; r < R; r++) {
                    const void *row = rows + (size_t)r * rb;
                    const kvs_q8a_block *x = xq + (size_t)c * nb;
                    float ref = kvs_dot_q8a_bs_ref(type, row, x, n), one = kvs_dot_q8a(type, row, x, n);
                    float got = out[(size_t)c * os + r];
                    CHECK_MSG(!memcmp(&got, &ref, sizeof ref), "%s n=%d %d x %d: row %d column %d: %.9g vs %.9g",
                              kvs_ggml_type_name(type), n, R, C, r, c, got, ref);
                    CHECK_MSG(!memcmp(&one, &ref, sizeof ref), "%s n=%d row %d column %d alone: %.9g vs %.9g",
                              kvs_ggml_type_name(type), n, r, c, one, ref);
                }
            for (int c = 0; c < C; c++) /* the output's stride gaps are left alone */
                for (int r = R; r < os; r++) CHECK(out[(size_t)c * os + r] == -1.0f);
        }
        if (!vnni) continue;
        for (int i = 0; i < C * os; i++) out[i] = -1.0f; /* the VNNI engine, whichever the machine picks */
        kvs_dot_q8a_rows_bs_vnni(type, rows, rb, R, xq, nb, C, n, out, os);
        for (int c = 0; c < C; c++)
            for (int r = 0; r < os; r++) {
                float ref = r < R ? kvs_dot_q8a_bs_ref(type, rows + (size_t)r * rb, xq + (size_t)c * nb, n) : -1.0f;
                float got = out[(size_t)c * os + r];
                CHECK_MSG(!memcmp(&got, &ref, sizeof ref), "%s n=%d %d x %d VNNI engine: row %d column %d: %.9g vs %.9g",
                          kvs_ggml_type_name(type), n, R, C, r, c, got, ref);
            }
    }
    /* Extremes through the tiles: every weight -128 or +127, activations +-127, scales 1. */
    if (eng) {
        const int n = 256, nb = n / 32, R = 16, C = 17;
        const size_t rb = 34 * (size_t)nb;
        const uint16_t one = 0x3C00; /* f16 1.0 */
        for (int r = 0; r < R; r++)
            for (int b = 0; b < nb; b++) {
                uint8_t *blk = rows + (size_t)r * rb + (size_t)b * 34;
                memcpy(blk, &one, 2);
                for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)((i + r) % 2 ? -128 : 127);
            }
        for (int c = 0; c < C; c++)
            for (int b = 0; b < nb; b++) {
                kvs_q8a_block *xb = &xq[(size_t)c * nb + b];
                xb->d = 1.0f;
                int s16[2] = {0, 0};
                for (int i = 0; i < 32; i++) {
                    xb->q[i] = (int8_t)((i + c) % 3 ? -127 : 127);
                    s16[i / 16] += xb->q[i];
                }
                xb->sum16[0] = (int16_t)s16[0], xb->sum16[1] = (int16_t)s16[1]; /* the block's contract */
            }
        for (int e = 0; e < 2; e++) {
            if (e == 0 && !route) continue;
            if (e == 1 && !vnni) continue;
            if (e == 0) kvs_dot_q8a_rows(KVS_GGML_Q8_0, rows, rb, R, xq, nb, C, n, out, R);
            else kvs_dot_q8a_rows_bs_vnni(KVS_GGML_Q8_0, rows, rb, R, xq, nb, C, n, out, R);
            for (int c = 0; c < C; c++)
                for (int r = 0; r < R; r++) {
                    float ref = kvs_dot_q8a_bs_ref(KVS_GGML_Q8_0, rows + (size_t)r * rb, xq + (size_t)c * nb, n);
                    CHECK_MSG(out[c * R + r] == ref, "extremes (%s) row %d column %d: %.9g vs %.9g",
                              e ? "VNNI engine" : "route", r, c, out[c * R + r], ref);
                }
        }
    }
    free(w);
    free(xs);
    free(wd);
    free(rows);
    free(xq);
    free(out);
    int rc = kvs_test_finish("backend_bs");
    if (rc == 0 && !eng) {
        printf("SKIPPED: the route's kernels' comparisons: this build or CPU has neither AVX-512 VNNI nor AMX-INT8 "
               "(or KVSIEVE_BS=0); the reference was checked\n");
        return 77;
    }
    return rc;
}
