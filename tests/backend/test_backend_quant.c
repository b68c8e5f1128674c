/*
 * test_backend_quant.c -- tensor types: hand-built blocks with known values
 * (golden), quantise/dequantise round trips within each type's error bound,
 * (Q4_0 included: the KV cache's type), integer dot products (AVX2 and scalar) against dequantise + naive double
 * dot, fp32 dot products for every type, errors for unsupported types, and
 * Q5_0's vectorised dequantisation bit for bit against the format's
 * definition evaluated here in scalar code (random blocks, every bit pattern
 * of the high bits' corners).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n);

static void put_h(uint8_t *p, float f) {
    uint16_t h = kvs_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static void golden(void) {
    kvs_err err = {0};
    float y[256];
    /* Q8_0: x = d * q */
    uint8_t q8[34];
    put_h(q8, 0.5f);
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q8_0, q8, y, 32, &err), &err);
    CHECK_NEAR(y[0], -8.0, 0);
    CHECK_NEAR(y[31], 7.5, 0);
    /* Q4_0: element j < 16 = low nibble of qs[j] - 8, j + 16 the high nibble */
    uint8_t q40[18] = {0};
    put_h(q40, 0.25f);
    q40[2] = 0x3F;  /* element 0: 15 - 8 = 7; element 16: 3 - 8 = -5 */
    q40[17] = 0x80; /* element 15: 0 - 8; element 31: 8 - 8 = 0 */
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q4_0, q40, y, 32, &err), &err);
    CHECK_NEAR(y[0], 0.25 * 7, 0);
    CHECK_NEAR(y[16], 0.25 * -5, 0);
    CHECK_NEAR(y[15], 0.25 * -8, 0);
    CHECK_NEAR(y[31], 0.0, 0);
    CHECK_NEAR(y[1], 0.25 * -8, 0);
    /* Q5_0: element 0 = low nibble of qs[0] | bit 0 of qh << 4, minus 16 */
    uint8_t q5[22] = {0};
    put_h(q5, 0.25f);
    uint32_t qh = 1u; /* element 0 high bit set, element 16 clear */
    memcpy(q5 + 2, &qh, 4);
    q5[6] = (uint8_t)(3 | (15 << 4));
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q5_0, q5, y, 32, &err), &err);
    CHECK_NEAR(y[0], (19 - 16) * 0.25, 0);
    CHECK_NEAR(y[16], (15 - 16) * 0.25, 0);
    CHECK_NEAR(y[1], (0 - 16) * 0.25, 0);
    /* Q4_1: x = d * nibble + m; element 0 low nibble of qs[0], element 16 its high nibble */
    uint8_t q41[20] = {0};
    put_h(q41, 0.5f);
    put_h(q41 + 2, -3.0f);
    q41[4] = (uint8_t)(6 | (15 << 4));
    q41[4 + 15] = (uint8_t)(1 << 4); /* element 31 */
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q4_1, q41, y, 32, &err), &err);
    CHECK_NEAR(y[0], 0.5 * 6 - 3.0, 0);
    CHECK_NEAR(y[16], 0.5 * 15 - 3.0, 0);
    CHECK_NEAR(y[1], -3.0, 0);
    CHECK_NEAR(y[15], -3.0, 0);
    CHECK_NEAR(y[31], 0.5 - 3.0, 0);
    /* Q4_K: sub-block 0 scale 2 min 3; sub-block 5 scale 33 min 17 (6-bit packing) */
    uint8_t q4[144] = {0};
    put_h(q4, 1.0f);
    put_h(q4 + 2, 0.5f);
    uint8_t *sc = q4 + 4;
    sc[0] = 2;
    sc[4] = 3;
    sc[9] = (uint8_t)((33 & 0xF) | ((17 & 0xF) << 4));
    sc[1] |= (uint8_t)((33 >> 4) << 6);
    sc[5] |= (uint8_t)((17 >> 4) << 6);
    q4[16 + 0] = 7;          /* element 0 (low nibble of qs[0]) */
    q4[16 + 64] = 9 << 4;    /* element 160 = sub-block 5, high nibble of qs[64] */
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q4_K, q4, y, 256, &err), &err);
    CHECK_NEAR(y[0], 1.0 * 2 * 7 - 0.5 * 3, 0);
    CHECK_NEAR(y[1], -0.5 * 3, 0);
    CHECK_NEAR(y[160], 33.0 * 9 - 0.5 * 17, 0);
    CHECK_NEAR(y[32], 0.0, 0); /* sub-block 1: scale 0, min 0 */
    /* Q6_K: element 0 = ql[0] low | qh[0] bits 0-1 << 4, minus 32, times d * scales[0] */
    uint8_t q6[210] = {0};
    put_h(q6 + 208, 0.5f);
    int8_t *s6 = (int8_t *)(q6 + 192);
    s6[0] = 3;
    s6[6] = -2;
    q6[0] = 5;
    q6[128] = (uint8_t)(2 | (1 << 6));
    q6[32] = 0xA << 4; /* element 96: n 0, quarter 3, l 0: high nibble of ql[32], qh bits 6-7 */
    CHECK_OK(kvs_dequant_row(KVS_GGML_Q6_K, q6, y, 256, &err), &err);
    CHECK_NEAR(y[0], 0.5 * 3 * (37 - 32), 0);
    CHECK_NEAR(y[96], 0.5 * -2 * ((10 | 16) - 32), 0);
    /* F16 / BF16 */
    uint16_t h[2] = {kvs_f32_to_f16(1.5f), kvs_f32_to_f16(-2.0f)};
    CHECK_OK(kvs_dequant_row(KVS_GGML_F16, h, y, 2, &err), &err);
    CHECK_NEAR(y[0], 1.5, 0);
    CHECK_NEAR(y[1], -2.0, 0);
    uint16_t bf[1] = {kvs_f32_to_bf16(3.0f)};
    CHECK_OK(kvs_dequant_row(KVS_GGML_BF16, bf, y, 1, &err), &err);
    CHECK_NEAR(y[0], 3.0, 0);
}

static void sizes(void) {
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q8_0), 34);
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q5_0), 22);
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q4_1), 20);
    CHECK_EQ_INT(kvs_ggml_row_size(KVS_GGML_Q4_1, 576), 360);
    CHECK(kvs_ggml_type_supported(KVS_GGML_Q4_1));
    CHECK(kvs_ggml_type_supported(KVS_GGML_Q4_0));
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q4_0), 18);
    CHECK(!kvs_ggml_type_supported(KVS_GGML_Q5_1));
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q4_K), 144);
    CHECK_EQ_INT(kvs_ggml_type_size(KVS_GGML_Q6_K), 210);
    CHECK_EQ_INT(kvs_ggml_row_size(KVS_GGML_Q4_K, 512), 288);
    CHECK_EQ_INT(kvs_ggml_blck_size(KVS_GGML_Q5_0), 32);
    CHECK(!strcmp(kvs_ggml_type_name(KVS_GGML_Q6_K), "Q6_K"));
    CHECK(!kvs_ggml_type_supported(KVS_GGML_Q2_K));
    CHECK(kvs_ggml_type_supported(KVS_GGML_BF16));
    kvs_err err = {0};
    float y[256];
    uint8_t blk[84] = {0};
    CHECK_FAILS(kvs_dequant_row(KVS_GGML_Q2_K, blk, y, 256, &err), KVS_ERR_UNSUPPORTED, &err, "Q2_K");
    CHECK_FAILS(kvs_dequant_row(KVS_GGML_Q4_K, blk, y, 100, &err), KVS_ERR_INVALID, &err, "multiple");
    CHECK_FAILS(kvs_quant_row(99, y, blk, 32, &err), KVS_ERR_UNSUPPORTED, &err, "99");
}

/* relative error bound of quantise -> dequantise per type (max |err| / max |x|) */
static double bound(int type) {
    switch (type) {
    case KVS_GGML_F32: return 0;
    case KVS_GGML_F16: return 1e-3;
    case KVS_GGML_BF16: return 8e-3;
    case KVS_GGML_Q8_0: return 1.0 / 127 * 0.51 + 1e-3;
    case KVS_GGML_Q5_0: return 1.0 / 16 + 2e-3; /* the far extreme clamps to 15: error up to d */
    case KVS_GGML_Q4_0: return 1.0 / 8 + 2e-3;  /* d = amax / 8; the far extreme clamps to 7: error up to d */
    case KVS_GGML_Q4_1: return 1.0 / 15 + 3e-3; /* d/2 with d = range/15 <= 2 amax/15, plus f16 rounding */
    case KVS_GGML_Q4_K: return 0.2;
    case KVS_GGML_Q6_K: return 0.05;
    }
    return 0;
}

static void round_trips_and_dots(void) {
    static const int types[] = {KVS_GGML_F32, KVS_GGML_F16,  KVS_GGML_BF16, KVS_GGML_Q8_0, KVS_GGML_Q4_0,
                                KVS_GGML_Q5_0, KVS_GGML_Q4_1, KVS_GGML_Q4_K, KVS_GGML_Q6_K};
    uint64_t rng = 42;
    kvs_err err = {0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti];
        for (int trial = 0; trial < 20; trial++) {
            int n = 256 * (1 + (int)(kvs_rng_next(&rng) % 4));
            float x[1024], y[1024], a[1024];
            uint8_t q[1024 * 4];
            double scale = 0.01 + 10.0 * kvs_rng_uniform(&rng), amax = 0;
            for (int i = 0; i < n; i++) {
                x[i] = (float)(scale * kvs_rng_normal(&rng));
                if (trial % 5 == 4 && i % 7 == 0) x[i] = 0; /* sparse rows */
                amax = fmax(amax, fabs(x[i]));
                a[i] = (float)kvs_rng_normal(&rng);
            }
            CHECK_OK(kvs_quant_row(type, x, q, n, &err), &err);
            CHECK_OK(kvs_dequant_row(type, q, y, n, &err), &err);
            double maxerr = 0;
            for (int i = 0; i < n; i++) maxerr = fmax(maxerr, fabs(y[i] - x[i]));
            CHECK_MSG(maxerr <= bound(type) * amax + 1e-30, "%s: max error %g vs bound %g (amax %g)",
                      kvs_ggml_type_name(type), maxerr, bound(type) * amax, amax);
            /* fp32 dot of the quantised row vs dequantised row . a in double */
            double ref = 0;
            for (int i = 0; i < n; i++) ref += (double)y[i] * a[i];
            double tol = 1e-5 * n * amax * 4;
            CHECK_NEAR(kvs_dot_f32(type, q, a, n), ref, tol);
            if (type == KVS_GGML_F32 || type == KVS_GGML_F16 || type == KVS_GGML_BF16) continue;
            /* integer dot with quantised activations vs dequantised both sides */
            kvs_q8a_block xb[32];
            kvs_q8a_quantize(a, xb, n);
            double ref2 = 0;
            for (int i = 0; i < n; i++) ref2 += (double)y[i] * xb[i / 32].d * xb[i / 32].q[i % 32];
            double tol2 = 1e-5 * (fabs(ref2) + amax * 4 * sqrt((double)n));
            float got = kvs_dot_q8a(type, q, xb, n), got_s = kvs_dot_q8a_scalar(type, q, xb, n);
            CHECK_MSG(fabs(got - ref2) <= tol2, "%s n=%d: dot %g vs reference %g", kvs_ggml_type_name(type), n, got,
                      ref2);
            CHECK_MSG(fabs(got_s - ref2) <= tol2, "%s n=%d: scalar dot %g vs reference %g", kvs_ggml_type_name(type),
                      n, got_s, ref2);
        }
    }
    /* activation quantisation: sums and scale */
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)(i - 20);
    kvs_q8a_block b[2];
    kvs_q8a_quantize(v, b, 64);
    CHECK_NEAR(b[0].d, 20.0 / 127, 1e-7);
    int s0 = 0;
    for (int i = 0; i < 16; i++) s0 += b[0].q[i];
    CHECK_EQ_INT(b[0].sum16[0], s0);
    CHECK_EQ_INT(b[0].q[0], -127);
}

/* kvs_q8a_quantize by its definition, evaluated here in scalar code:
 * d = max |v| / 127, q = lrintf(v / d) (nearest, ties to even), sum16 the
 * sums of q over each half; blocks of zeros, of -0, of exact ties (v = (k +
 * 0.5) d), of wide and tiny ranges, and with a NaN (d ignores it; the other
 * elements are still exact). The AVX2 path must give these bits. */
static void q8a_exact(void) {
    enum { NB = 64 };
    float v[NB * 32];
    kvs_q8a_block b[NB];
    uint64_t rng = 5;
    for (int rep = 0; rep < 50; rep++) {
        for (int k = 0; k < NB; k++) {
            const int kind = (rep * NB + k) % 7;
            const double scale = kind == 3 ? 1e-30 : kind == 4 ? 1e30 : 1.0 + 10.0 * kvs_rng_uniform(&rng);
            for (int i = 0; i < 32; i++) {
                float *x = &v[k * 32 + i];
                const double u = kvs_rng_uniform(&rng);
                *x = (float)((u * 2 - 1) * scale);
                if (kind == 0) *x = 0.0f;
                if (kind == 1) *x = i % 2 ? -0.0f : 0.0f;
                if (kind == 2) *x = (float)((int)(u * 20) - 10) + 0.5f; /* exact halves of d when max is 9.5 */
            }
            if (kind == 2) v[k * 32 + 7] = 127.0f / 2; /* d = 0.5: v / d = 2 v, halves become odd integers */
            if (kind == 5) v[k * 32 + (rep % 32)] = NAN;
        }
        kvs_q8a_quantize(v, b, NB * 32);
        for (int k = 0; k < NB; k++) {
            const float *x = v + k * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            CHECK_MSG(memcmp(&b[k].d, &d, sizeof d) == 0, "q8a rep %d block %d: d %g vs %g", rep, k, b[k].d, d);
            int s[2] = {0, 0}, nan = 0;
            for (int i = 0; i < 32; i++) {
                if (isnan(x[i])) {
                    nan = 1;
                    continue;
                }
                const int q = (int)lrintf(x[i] * id);
                s[i / 16] += q;
                CHECK_MSG(b[k].q[i] == q, "q8a rep %d block %d element %d: %d vs %d", rep, k, i, b[k].q[i], q);
            }
            if (!nan)
                CHECK_MSG(b[k].sum16[0] == s[0] && b[k].sum16[1] == s[1], "q8a rep %d block %d: sums %d %d vs %d %d",
                          rep, k, b[k].sum16[0], b[k].sum16[1], s[0], s[1]);
        }
    }
}

/* Q5_0 by its definition: element j < 16 low nibble of qs[j], j + 16 high;
 * bit j of qh is element j's fifth bit; x = d * (q - 16). */
static void q5_0_exact(void) {
    uint64_t rng = 7;
    uint8_t blk[22 * 8];
    float y[256];
    kvs_err err = {0};
    for (int rep = 0; rep < 200; rep++) {
        for (int b = 0; b < 8; b++) {
            uint8_t *q = blk + 22 * b;
            put_h(q, (float)(kvs_rng_uniform(&rng) * 4 - 2));
            uint32_t qh = rep == 0 ? 0u : rep == 1 ? 0xFFFFFFFFu : (uint32_t)(kvs_rng_uniform(&rng) * 4294967295.0);
            memcpy(q + 2, &qh, 4);
            for (int j = 0; j < 16; j++) q[6 + j] = (uint8_t)(kvs_rng_uniform(&rng) * 256);
        }
        CHECK_OK(kvs_dequant_row(KVS_GGML_Q5_0, blk, y, 256, &err), &err);
        for (int b = 0; b < 8; b++) {
            const uint8_t *q = blk + 22 * b;
            uint16_t h;
            uint32_t qh;
            memcpy(&h, q, 2);
            memcpy(&qh, q + 2, 4);
            const float d = kvs_f16_to_f32(h);
            for (int j = 0; j < 32; j++) {
                const int nib = j < 16 ? (q[6 + j] & 0xF) : (q[6 + j - 16] >> 4);
                const float want = d * (float)((nib | (int)(((qh >> j) & 1u) << 4)) - 16);
                CHECK_MSG(!memcmp(&want, &y[32 * b + j], sizeof want), "Q5_0 block %d element %d: %.9g, want %.9g", b,
                          j, y[32 * b + j], want);
            }
        }
    }
}

int main(void) {
    q5_0_exact();
    q8a_exact();
    golden();
    sizes();
    round_trips_and_dots();
    return kvs_test_finish("backend_quant");
}
