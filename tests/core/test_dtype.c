/*
 * test_dtype.c -- fp16 / bf16 conversions (known bit patterns, exhaustive
 * round trips, round-to-nearest-even checked against the neighbours), dtype
 * names, views, row extraction and the finiteness scan.
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_f16_known(void) {
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},     {1.0f, 0x3c00},          {-2.0f, 0xc000},
        {0.5f, 0x3800},     {65504.0f, 0x7bff},      {65519.99f, 0x7bff},
        {65520.0f, 0x7c00}, {1e10f, 0x7c00},         {-1e10f, 0xfc00},
        {0.1f, 0x2e66},     {0.333333343f, 0x3555},  {6.103515625e-05f, 0x0400}, /* 2^-14 */
        {5.960464477539063e-08f, 0x0001},            /* 2^-24, smallest subnormal */
        {2.98023223876953125e-08f, 0x0000},          /* 2^-25: tie -> even (0) */
        {8.940696716308594e-08f, 0x0002},            /* 1.5 * 2^-24: tie -> even (2) */
        {1.4901161193847656e-07f, 0x0002},           /* 2.5 * 2^-24: tie -> even (2) */
        {1.00048828125f, 0x3c00},                    /* 1 + 2^-11: tie -> even */
        {1.00146484375f, 0x3c02},                    /* 1 + 3*2^-11: tie -> even (up) */
        {6.1035156e-05f * 0.99999f, 0x0400},         /* just below 2^-14 rounds up to normal */
        {1e-30f, 0x0000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = kvs_f32_to_f16(cases[i].f);
        CHECK_MSG(h == cases[i].h, "f32 %.9g -> f16 0x%04x, want 0x%04x", cases[i].f, h, cases[i].h);
    }
    CHECK(kvs_f32_to_f16(-0.0f) == 0x8000);
    CHECK(kvs_f32_to_f16(-1e-30f) == 0x8000);
    CHECK(kvs_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(kvs_f32_to_f16(-INFINITY) == 0xfc00);
    uint16_t hn = kvs_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    /* a NaN whose payload sits only in the low bits must stay NaN, not inf */
    uint16_t hs = kvs_f32_to_f16(u2f(0x7f800001u));
    CHECK((hs & 0x7c00) == 0x7c00 && (hs & 0x3ff) != 0);
    CHECK(kvs_f16_to_f32(0x3c00) == 1.0f);
    CHECK(kvs_f16_to_f32(0xc000) == -2.0f);
    CHECK(kvs_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(kvs_f16_to_f32(0x0001) == 5.960464477539063e-08f);
    CHECK(kvs_f16_to_f32(0x03ff) == 6.097555160522461e-05f);
    CHECK(kvs_f16_to_f32(0x7c00) == INFINITY);
    CHECK(kvs_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(kvs_f16_to_f32(0x7e00)));
    CHECK(f2u(kvs_f16_to_f32(0x8000)) == 0x80000000u);
}

/* |a - x| compared exactly in double (every f16 and f32 is exact there) */
static void test_f16_exhaustive(void) {
    int bad_rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvs_f16_to_f32((uint16_t)h);
        uint16_t back = kvs_f32_to_f16(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            if (!isnan(f) || (back & 0x7c00) != 0x7c00 || !(back & 0x3ff)) bad_rt++;
            if ((h & 0x200) && back != h) bad_rt++; /* quiet NaNs keep their payload */
        } else if (back != h) {
            bad_rt++;
        }
    }
    CHECK_EQ_INT(bad_rt, 0);
    /* RNE against the neighbours, over random finite f32 inside the f16 range */
    uint64_t r = 1;
    int bad = 0;
    for (int i = 0; i < 300000; i++) {
        /* exponents spanning subnormal..max f16 */
        uint32_t e = 100 + (uint32_t)(kvs_rng_next(&r) % 43); /* 2^-27 .. 2^15 */
        uint32_t bits = (e << 23) | (uint32_t)(kvs_rng_next(&r) & 0x7fffff);
        if (i % 7 == 0) bits &= ~0xfffu; /* many exact ties */
        if (i & 1) bits |= 0x80000000u;
        float f = u2f(bits);
        if (fabsf(f) >= 65520.0f) continue;
        uint16_t h = kvs_f32_to_f16(f);
        double x = f, got = kvs_f16_to_f32(h);
        double err0 = fabs(got - x);
        for (int dlt = -1; dlt <= 1; dlt += 2) {
            int m = (int)(h & 0x7fff) + dlt;
            if (m < 0 || m > 0x7bff) continue;
            double nb = kvs_f16_to_f32((uint16_t)((h & 0x8000) | m));
            double e1 = fabs(nb - x);
            if (e1 < err0 || (e1 == err0 && (h & 1))) bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16(void) {
    CHECK(kvs_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(kvs_f32_to_bf16(-2.0f) == 0xc000);
    CHECK(kvs_f32_to_bf16(3.14159265f) == 0x4049);
    CHECK(kvs_f32_to_bf16(u2f(0x3f808000u)) == 0x3f80); /* tie -> even (down) */
    CHECK(kvs_f32_to_bf16(u2f(0x3f818000u)) == 0x3f82); /* tie -> even (up) */
    CHECK(kvs_f32_to_bf16(u2f(0x3f808001u)) == 0x3f81);
    CHECK(kvs_f32_to_bf16(u2f(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to inf */
    CHECK(kvs_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(kvs_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(kvs_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(kvs_f32_to_bf16(u2f(0x00000001u)) == 0x0000); /* tiny subnormal */
    CHECK(kvs_f32_to_bf16(u2f(0x00018000u)) == 0x0002); /* subnormal tie -> even */
    uint16_t n = kvs_f32_to_bf16(u2f(0x7f800001u)); /* NaN with low payload only */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f));
    CHECK(kvs_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(isnan(kvs_bf16_to_f32(0x7fc0)));
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvs_bf16_to_f32((uint16_t)h);
        uint16_t back = kvs_f32_to_bf16(f);
        int is_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (is_nan ? !(isnan(f) && (back & 0x7f80) == 0x7f80 && (back & 0x7f)) : back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* RNE against neighbours for random finite floats */
    uint64_t r = 3;
    int bad2 = 0;
    for (int i = 0; i < 300000; i++) {
        uint32_t bits = (uint32_t)kvs_rng_next(&r);
        if (i % 5 == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* exact ties */
        float f = u2f(bits);
        if (!isfinite(f) || fabsf(f) > 3.38e38f) continue;
        uint16_t h = kvs_f32_to_bf16(f);
        double x = f, e0 = fabs((double)kvs_bf16_to_f32(h) - x);
        for (int dlt = -1; dlt <= 1; dlt += 2) {
            int m = (int)(h & 0x7fff) + dlt;
            if (m < 0 || m > 0x7f7f) continue;
            double e1 = fabs((double)kvs_bf16_to_f32((uint16_t)((h & 0x8000) | m)) - x);
            if (e1 < e0 || (e1 == e0 && (h & 1))) bad2++;
        }
    }
    CHECK_EQ_INT(bad2, 0);
}

static void test_names(void) {
    CHECK(strcmp(kvs_dtype_name(KVS_F32), "F32") == 0);
    CHECK(strcmp(kvs_dtype_name(KVS_F16), "F16") == 0);
    CHECK(strcmp(kvs_dtype_name(KVS_BF16), "BF16") == 0);
    CHECK(strcmp(kvs_dtype_name(KVS_U8), "U8") == 0);
    CHECK(strcmp(kvs_dtype_name(KVS_I32), "I32") == 0);
    CHECK_EQ_INT(kvs_dtype_size(KVS_F32), 4);
    CHECK_EQ_INT(kvs_dtype_size(KVS_F16), 2);
    CHECK_EQ_INT(kvs_dtype_size(KVS_BF16), 2);
    CHECK_EQ_INT(kvs_dtype_size(KVS_U8), 1);
    CHECK_EQ_INT(kvs_dtype_size(KVS_I32), 4);
}

static void test_views(void) {
    enum { H = 2, N = 5, D = 3 };
    float x[H][N][D]; /* [H][N][d] */
    uint16_t xh[H][N][D], xb[H][N][D];
    for (int h = 0; h < H; h++)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < D; c++) {
                x[h][n][c] = (float)(100 * h + 10 * n + c) * 0.25f;
                xh[h][n][c] = kvs_f32_to_f16(x[h][n][c]);
                xb[h][n][c] = kvs_f32_to_bf16(x[h][n][c]);
            }
    kvs_view v = kvs_view_make(x, KVS_F32, H, N, D);
    CHECK(v.data == (const void *)x && v.dtype == KVS_F32 && v.device == KVS_HOST);
    CHECK_EQ_INT(v.s_tok, D);
    CHECK_EQ_INT(v.s_head, N * D);
    float out[N][D];
    kvs_view_rows_f32(&v, 1, 2, 3, &out[0][0]);
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < D; c++) CHECK(out[i][c] == x[1][2 + i][c]);
    kvs_view vh = kvs_view_make(xh, KVS_F16, H, N, D), vb = kvs_view_make(xb, KVS_BF16, H, N, D);
    kvs_view_rows_f32(&vh, 0, 0, N, &out[0][0]);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < D; c++) CHECK(out[i][c] == x[0][i][c]); /* exact in f16 */
    kvs_view_rows_f32(&vb, 1, 1, 2, &out[0][0]);
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < D; c++) CHECK(out[i][c] == kvs_bf16_to_f32(xb[1][1 + i][c]));
    /* strided: interleaved [N][H][d] layout seen as heads */
    float y[N][H][D + 1]; /* padded rows */
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            for (int c = 0; c < D; c++) y[n][h][c] = x[h][n][c];
            y[n][h][D] = NAN; /* padding must never be read */
        }
    kvs_view vs = {y, KVS_F32, KVS_HOST, H, N, D, D + 1, H * (D + 1)};
    kvs_view_rows_f32(&vs, 1, 0, N, &out[0][0]);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < D; c++) CHECK(out[i][c] == x[1][i][c]);
    kvs_err e_, *e = &e_;
    kvs_err_clear(e);
    CHECK_OK(kvs_view_check_finite(&vs, "K", e), e);
    CHECK_OK(kvs_view_check_finite(&v, "K", e), e);
    CHECK_OK(kvs_view_check_finite(&vh, "K", e), e);
    CHECK_OK(kvs_view_check_finite(&vb, "K", e), e);
    y[3][1][2] = INFINITY;
    CHECK_FAILS(kvs_view_check_finite(&vs, "V", e), KVS_ERR_NUMERIC, e, "V head 1 token 3 channel 2 is +Inf");
    x[1][4][0] = NAN;
    CHECK_FAILS(kvs_view_check_finite(&v, "K", e), KVS_ERR_NUMERIC, e, "K head 1 token 4 channel 0 is NaN");
    xh[0][2][1] = 0xfc00;
    CHECK_FAILS(kvs_view_check_finite(&vh, "Q", e), KVS_ERR_NUMERIC, e, "Q head 0 token 2 channel 1 is -Inf");
    xb[1][0][2] = 0x7fc1;
    CHECK_FAILS(kvs_view_check_finite(&vb, "K", e), KVS_ERR_NUMERIC, e, "K head 1 token 0 channel 2 is NaN");
    kvs_view bad = v;
    bad.dtype = KVS_I32;
    CHECK_FAILS(kvs_view_check_finite(&bad, "K", e), KVS_ERR_INVALID, e, "I32");
}

/* kvs_view_rows_f32 (vectorised where the CPU converts fp16 in hardware)
 * must give exactly the scalar conversion for every fp16 bit pattern, NaNs
 * compared as NaN (hardware may quiet a signalling NaN). */
static void test_rows_f16_all_values(void) {
    static uint16_t src[65536];
    static float dst[65536];
    for (uint32_t h = 0; h < 65536; h++) src[h] = (uint16_t)h;
    kvs_view v = kvs_view_make(src, KVS_F16, 1, 65536 / 64, 64); /* [1][1024][64] */
    kvs_view_rows_f32(&v, 0, 0, 1024, dst);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float want = kvs_f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(dst[h]) : f2u(dst[h]) != f2u(want)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

/* kvs_view_gather_f32: rows {0, 1, 3, 4, 5} of head 1 of a [2][6][2] fp16
 * view (element = 100 h + 10 n + c, exact in fp16), in order. */
static void test_gather(void) {
    uint16_t x[2 * 6 * 2];
    for (int h = 0; h < 2; h++)
        for (int n = 0; n < 6; n++)
            for (int c = 0; c < 2; c++) x[(h * 6 + n) * 2 + c] = kvs_f32_to_f16((float)(100 * h + 10 * n + c));
    const kvs_view v = kvs_view_make(x, KVS_F16, 2, 6, 2);
    const int32_t idx[5] = {0, 1, 3, 4, 5};
    float out[5 * 2];
    kvs_view_gather_f32(&v, 1, idx, 5, out);
    for (int i = 0; i < 5; i++)
        for (int c = 0; c < 2; c++) CHECK(out[i * 2 + c] == (float)(100 + 10 * idx[i] + c));
}

int main(void) {
    test_rows_f16_all_values();
    test_f16_known();
    test_f16_exhaustive();
    test_bf16();
    test_names();
    test_views();
    test_gather();
    return kvs_test_finish("core_dtype");
}
