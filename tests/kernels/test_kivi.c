/*
 * test_kivi.c -- the KIVI store (kernels/kivi.h) on the CPU: hand-checked
 * codes and bytes, round-trip error bounds over random inputs per bit width,
 * the window at its boundaries, bulk == chunked == token-by-token, the gather
 * of kept rows, scores and weighted sums against fp64 references, and the
 * errors. Not a GPU test (no skip).
 *
 * Tolerances: "tight" compares the store's reads with an fp64 computation on
 * its own dequantised data: 1e-5 of sum |q_c k_c| (float accumulation over
 * d <= 128 terms, ~d * 2^-24). "Loose" compares them with the unquantised
 * data: every element is within half its group's step s of its input, so
 * |q . k^ - q . k| <= sum_c |q_c| s(t, c) / 2 -- a bound that holds for any
 * input, plus the same float slack.
 */
#include <stdint.h>

#include "kivi.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float unif(void) { return (float)((rnd() + 0.5) / 4294967296.0); }
static float gauss(void) {
    return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif()));
}

/* Inputs of several kinds: kind 0 normal, 1 normal with per-channel outliers
 * (the key pattern KIVI reports), 2 a large offset with a tiny spread,
 * 3 constant runs, 4 values exactly representable in fp16. */
static void fill(float *x, int T, int d, int kind) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < d; c++) {
            float v = gauss();
            if (kind == 1 && c % 7 == 3) v = v * 20.0f + 50.0f;
            if (kind == 2) v = 1000.0f + 0.01f * v;
            if (kind == 3) v = (float)((t / 5) % 3) - 1.0f;
            if (kind == 4) v = kvs_f16_to_f32(kvs_f32_to_f16(4.0f * v));
            x[(size_t)t * d + c] = v;
        }
}

static kvs_kivi_config cfg_of(int bits, int G, int R, kvs_dtype w) {
    kvs_kivi_config c = kvs_kivi_config_default(bits);
    c.group = G;
    c.residual = R;
    c.residual_dtype = w;
    return c;
}

/* A store holding x (keys) and y (values) [T][d], appended in chunks of
 * `chunk` (0: all at once), flushed at the end when asked. */
static kvs_kivi_head *build(const kvs_kivi_config *c, int d, const float *x, const float *y,
                            int T, int chunk, int flush) {
    kvs_err err = {0};
    kvs_kivi_head *h = NULL;
    CHECK_OK(kvs_kivi_init(&h, c, d, T > 0 ? T : 1, &err), &err);
    if (!h) return NULL;
    kvs_view k = kvs_view_make(x, KVS_F32, 1, T, d), v = kvs_view_make(y, KVS_F32, 1, T, d);
    for (int n0 = 0; n0 < T;) {
        const int m = chunk <= 0 || T - n0 < chunk ? T - n0 : chunk;
        CHECK_OK(kvs_kivi_append(h, &k, &v, 0, n0, m, &err), &err);
        n0 += m;
    }
    if (flush) kvs_kivi_flush(h);
    return h;
}

/* The quantised prefixes the manual promises. */
static int kq_of(int T, int R, int flushed) {
    return T == 0 ? 0 : flushed ? R * (T / R) : R * ((T - 1) / R);
}
static int vq_of(int T, int R, int flushed) {
    const int v = flushed ? T - R : T - R - 1;
    return v > 0 ? v : 0;
}

/* ---- hand-checked cases ---------------------------------------------------- */

static void test_hand(void) {
    /* d = 4, G = 4, R = 4, 2 bits, fp32 window; 5 tokens, flushed: keys 0..3
     * and value 0 quantised. Channel 0 of the keys is 0, 1, 2, 3 (z 0, s 1:
     * exact); channel 1 is 0, 0.5, 1.4, 3 (codes 0, 1 (half up), 1, 3 ->
     * 0, 1, 1, 3). Value 0 is 0, 0.5, 1.4, 3 too (one group of 4 channels).
     * Channel 2 is 0.1 x 4: z = 0.1 rounded down to fp16 = 0.0999755859375,
     * s = the fp16 at or above (0.1 - z) / 3, all codes 0 .. 1. */
    const kvs_kivi_config c = cfg_of(2, 4, 4, KVS_F32);
    float k[5 * 4] = {0, 0, 0.1f, 7, 1, 0.5f, 0.1f, 7, 2, 1.4f, 0.1f, 7, 3, 3, 0.1f, 7, 9, 9, 9, 9};
    float v[5 * 4] = {0, 0.5f, 1.4f, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2};
    kvs_kivi_head *h = build(&c, 4, k, v, 5, 1, 1);
    if (!h) return;
    kvs_kivi_bytes b = kvs_kivi_stats(h);
    CHECK_EQ_INT(b.k_quantized, 4);
    CHECK_EQ_INT(b.v_quantized, 1);
    float kd[20], vd[20];
    kvs_kivi_dequantize(h, kd, vd);
    const float want_k1[4] = {0, 1, 1, 3};
    for (int t = 0; t < 4; t++) {
        CHECK(kd[t * 4 + 0] == (float)t);
        CHECK_MSG(kd[t * 4 + 1] == want_k1[t], "t %d: %g", t, kd[t * 4 + 1]);
        CHECK(kd[t * 4 + 3] == 7.0f); /* a constant, fp16-exact channel: s 0, exact */
        CHECK(kvs_kivi_step(h, 0, t, 3) == 0.0f);
        CHECK(fabsf(kd[t * 4 + 2] - 0.1f) <= kvs_kivi_step(h, 0, t, 2) * 0.5f + 1e-9f);
        CHECK(kvs_kivi_step(h, 0, t, 2) > 0.0f);
        CHECK(vd[t] == want_k1[t]);
    }
    CHECK(kvs_kivi_step(h, 0, 4, 0) == 0.0f); /* token 4: in the window */
    for (int c2 = 0; c2 < 4; c2++) CHECK(kd[16 + c2] == 9.0f);
    for (int t = 1; t < 5; t++)
        for (int c2 = 0; c2 < 4; c2++) CHECK(vd[t * 4 + c2] == v[t * 4 + c2]);
    /* bytes: 1 key block of ceil(4 * 4 * 2 / 8) = 4 bytes + 4 x (2 + 2) fp16;
     * 1 value row of 1 byte + 1 group x 4; window (1 + 4) rows x 4 x 4 bytes */
    CHECK_EQ_INT(b.k_codes, 4);
    CHECK_EQ_INT(b.k_params, 16);
    CHECK_EQ_INT(b.v_codes, 1);
    CHECK_EQ_INT(b.v_params, 4);
    CHECK_EQ_INT(b.window, 80);
    CHECK_EQ_INT(b.total, 105);
    kvs_kivi_free(h);
}

/* Bytes of realistic shapes, worked out by hand (kivi.h's layout). */
static void test_bytes_golden(void) {
    /* d 128, G 32, R 128, fp16 window, T = 300 flushed: kq 256, vq 172.
     * 2 bits: keys 8 blocks x (128 x 32 x 2 / 8 = 1024) = 8192, params
     * 8 x 128 x 4 = 4096; values 172 x 32 = 5504, params 172 x 4 groups x 4 =
     * 2752; window (44 + 128) x 128 x 2 = 44032. Total 64576 (f16: 153600). */
    kvs_kivi_config c = kvs_kivi_config_default(2);
    kvs_kivi_bytes b = kvs_kivi_size(&c, 128, 300, 1);
    CHECK_EQ_INT(b.k_quantized, 256);
    CHECK_EQ_INT(b.v_quantized, 172);
    CHECK_EQ_INT(b.k_codes, 8192);
    CHECK_EQ_INT(b.k_params, 4096);
    CHECK_EQ_INT(b.v_codes, 5504);
    CHECK_EQ_INT(b.v_params, 2752);
    CHECK_EQ_INT(b.window, 44032);
    CHECK_EQ_INT(b.total, 64576);
    /* 4 bits: codes double: 16384 + 4096 + 11008 + 2752 + 44032 */
    c = kvs_kivi_config_default(4);
    CHECK_EQ_INT(kvs_kivi_size(&c, 128, 300, 1).total, 78272);
    /* 2 bits, not flushed: vq 171: 8192 + 4096 + 5472 + 2736 + 173 x 256 */
    c = kvs_kivi_config_default(2);
    CHECK_EQ_INT(kvs_kivi_size(&c, 128, 300, 0).total, 64784);
    /* odd shape: d 5, G 4, R 8, 2 bits, fp32 window, T 9 flushed: kq 8 = 2
     * blocks of ceil(5 x 4 x 2 / 8) = 5 bytes + 2 x 5 x 4; vq 1 row of
     * ceil(10 / 8) = 2 bytes + 2 groups x 4; window (1 + 8) x 5 x 4 = 180 */
    c = cfg_of(2, 4, 8, KVS_F32);
    CHECK_EQ_INT(kvs_kivi_size(&c, 5, 9, 1).total, 10 + 40 + 2 + 8 + 180);
    /* The store counts what it holds: equal to the prediction. */
    for (int T = 1; T <= 40; T += 3)
        for (int fl = 0; fl < 2; fl++) {
            float x[40 * 5], y[40 * 5];
            fill(x, T, 5, 0);
            fill(y, T, 5, 0);
            kvs_kivi_head *h = build(&c, 5, x, y, T, 0, fl);
            if (!h) continue;
            kvs_kivi_bytes s = kvs_kivi_stats(h), p = kvs_kivi_size(&c, 5, T, fl);
            CHECK_MSG(s.total == p.total && s.k_quantized == p.k_quantized &&
                          s.v_quantized == p.v_quantized,
                      "T %d flushed %d: %zu vs %zu", T, fl, s.total, p.total);
            kvs_kivi_free(h);
        }
}

/* ---- round trip: |x - x^| <= s / 2 per element, s not wasteful ----------- */

static int check_roundtrip(const kvs_kivi_head *h, const kvs_kivi_config *c, const float *x,
                           const float *xd, int T, int d, int is_value) {
    const int bits = is_value ? c->v_bits : c->k_bits, G = c->group;
    const float qmax = (float)((1 << bits) - 1);
    const kvs_kivi_bytes b = kvs_kivi_stats(h);
    const int nq = is_value ? b.v_quantized : b.k_quantized;
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < d; ch++) {
            const float in = x[(size_t)t * d + ch], out = xd[(size_t)t * d + ch];
            const float s = kvs_kivi_step(h, is_value, t, ch);
            if (t >= nq) { /* the window: exact (fp32 window or fp16-exact input) */
                if (out != in) bad++;
                continue;
            }
            /* float slack: a few ulps of the magnitudes involved */
            const float slack = 4.0f * 1.2e-7f * (fabsf(in) + fabsf(out) + qmax * s);
            if (!(fabsf(out - in) <= 0.5f * s + slack)) bad++;
            /* the group's range: s may exceed (mx - mn) / qmax only by the
             * fp16 roundings of the zero point (down) and the step (up) */
            float mn = in, mx = in;
            for (int j = 0; j < G; j++) {
                const int tt = is_value ? t : (t / G) * G + j;
                const int cc = is_value ? (ch / G) * G + j : ch;
                if (tt >= T || cc >= d) continue;
                const float e = x[(size_t)tt * d + cc];
                mn = e < mn ? e : mn;
                mx = e > mx ? e : mx;
            }
            const float zulp = fabsf(mn) * (1.0f / 1024.0f) + 6e-8f;
            const float smax = ((mx - mn) + zulp) / qmax * (1.0f + 1.0f / 1024.0f) + 6e-8f;
            if (!(s <= smax)) bad++;
        }
    return bad;
}

static void test_roundtrip_props(void) {
    const int dims[] = {1, 5, 64, 128};
    const int groups[] = {1, 4, 32};
    int cases = 0;
    for (int bits = 2; bits <= 4; bits += 2)
        for (int di = 0; di < 4; di++)
            for (int gi = 0; gi < 3; gi++)
                for (int rep = 0; rep < 4; rep++) {
                    const int d = dims[di], G = groups[gi], R = G * (1 + (int)(rnd() % 4));
                    const int T = 1 + (int)(rnd() % 300), kind = (int)(rnd() % 5);
                    const int fl = (int)(rnd() % 2);
                    /* fp16 window for the fp16-exact inputs, fp32 otherwise */
                    const kvs_dtype w = kind == 4 ? KVS_F16 : KVS_F32;
                    kvs_kivi_config c = cfg_of(bits, G, R, w);
                    c.v_bits = rep % 2 ? 6 - bits : bits; /* mixed K / V widths too */
                    float *x = malloc(sizeof(float) * T * d), *y = malloc(sizeof(float) * T * d);
                    float *xd = malloc(sizeof(float) * T * d), *yd = malloc(sizeof(float) * T * d);
                    fill(x, T, d, kind);
                    fill(y, T, d, kind);
                    kvs_kivi_head *h = build(&c, d, x, y, T, 0, fl);
                    if (h) {
                        kvs_kivi_dequantize(h, xd, yd);
                        const int bk = check_roundtrip(h, &c, x, xd, T, d, 0);
                        const int bv = check_roundtrip(h, &c, y, yd, T, d, 1);
                        CHECK_MSG(bk == 0 && bv == 0,
                                  "bits %d/%d d %d G %d R %d T %d kind %d: %d K, %d V elements "
                                  "out of bounds",
                                  c.k_bits, c.v_bits, d, G, R, T, kind, bk, bv);
                        cases++;
                    }
                    kvs_kivi_free(h);
                    free(x);
                    free(y);
                    free(xd);
                    free(yd);
                }
    printf("round trip: %d random cases\n", cases);
}

/* ---- the window at its boundaries; chunking invariance ------------------- */

static void test_window(void) {
    const int d = 16, G = 32, R = 128; /* KIVI's defaults */
    const int Ts[] = {1, 31, 32, 33, 64, 96, 127, 128, 129, 130, 160, 255, 256, 257, 300};
    const int TMAX = 300;
    float *x = malloc(sizeof(float) * TMAX * d), *y = malloc(sizeof(float) * TMAX * d);
    float *a = malloc(sizeof(float) * TMAX * d * 4);
    fill(x, TMAX, d, 1);
    fill(y, TMAX, d, 0);
    const kvs_kivi_config c = cfg_of(2, G, R, KVS_F32);
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        const int T = Ts[i];
        for (int fl = 0; fl < 2; fl++) {
            kvs_kivi_head *one = build(&c, d, x, y, T, 1, fl);  /* decode, token by token */
            kvs_kivi_head *bulk = build(&c, d, x, y, T, 0, fl); /* prefill */
            kvs_kivi_head *chk = build(&c, d, x, y, T, 1 + (int)(rnd() % 50), fl);
            if (!one || !bulk || !chk) break;
            const kvs_kivi_bytes b = kvs_kivi_stats(one);
            CHECK_MSG(b.k_quantized == kq_of(T, R, fl) && b.v_quantized == vq_of(T, R, fl),
                      "T %d flushed %d: kq %d vq %d", T, fl, b.k_quantized, b.v_quantized);
            /* KIVI's own prefill split after a flush: keys T % R in the
             * window, values min(T, R) */
            if (fl) {
                CHECK_EQ_INT(T - b.k_quantized, T % R);
                CHECK_EQ_INT(T - b.v_quantized, T < R ? T : R);
            }
            float *k1 = a, *v1 = a + (size_t)T * d, *k2 = a + 2 * (size_t)T * d,
                  *v2 = a + 3 * (size_t)T * d;
            kvs_kivi_dequantize(one, k1, v1);
            kvs_kivi_dequantize(bulk, k2, v2);
            CHECK_MSG(!memcmp(k1, k2, sizeof(float) * T * d) &&
                          !memcmp(v1, v2, sizeof(float) * T * d),
                      "T %d: bulk != token by token", T);
            kvs_kivi_dequantize(chk, k2, v2);
            CHECK_MSG(!memcmp(k1, k2, sizeof(float) * T * d) &&
                          !memcmp(v1, v2, sizeof(float) * T * d),
                      "T %d: chunked != token by token", T);
            /* quantised elements move, window elements do not */
            int moved_q = 0, moved_w = 0;
            for (int t = 0; t < T; t++)
                for (int ch = 0; ch < d; ch++) {
                    const size_t e = (size_t)t * d + ch;
                    if (t < b.k_quantized) moved_q += k1[e] != x[e];
                    else moved_w += k1[e] != x[e];
                    if (t >= b.v_quantized) moved_w += v1[e] != y[e];
                }
            CHECK_EQ_INT(moved_w, 0);
            if (b.k_quantized > 0) CHECK_MSG(moved_q > 0, "T %d: quantised keys exact?", T);
            kvs_kivi_free(one);
            kvs_kivi_free(bulk);
            kvs_kivi_free(chk);
        }
    }
    /* A flush in the middle changes nothing later: flush at 128, append to 200 */
    kvs_kivi_head *p = NULL, *q = NULL;
    kvs_err err = {0};
    kvs_view k = kvs_view_make(x, KVS_F32, 1, TMAX, d), v = kvs_view_make(y, KVS_F32, 1, TMAX, d);
    CHECK_OK(kvs_kivi_init(&p, &c, d, TMAX, &err), &err);
    CHECK_OK(kvs_kivi_init(&q, &c, d, TMAX, &err), &err);
    if (p && q) {
        CHECK_OK(kvs_kivi_append(p, &k, &v, 0, 0, 128, &err), &err);
        kvs_kivi_flush(p);
        CHECK_EQ_INT(kvs_kivi_stats(p).k_quantized, 128);
        CHECK_EQ_INT(kvs_kivi_stats(p).v_quantized, 0);
        CHECK_OK(kvs_kivi_append(p, &k, &v, 0, 128, 72, &err), &err);
        CHECK_OK(kvs_kivi_append(q, &k, &v, 0, 0, 200, &err), &err);
        kvs_kivi_dequantize(p, a, a + 200 * d);
        kvs_kivi_dequantize(q, a + 400 * d, a + 600 * d);
        CHECK(!memcmp(a, a + 400 * d, sizeof(float) * 400 * d));
        CHECK_EQ_INT(kvs_kivi_stats(p).total, kvs_kivi_stats(q).total);
        /* reset empties the store; refilling gives the same store */
        kvs_kivi_reset(q);
        CHECK_EQ_INT(kvs_kivi_stats(q).total, 0);
        CHECK_OK(kvs_kivi_append(q, &k, &v, 0, 0, 200, &err), &err);
        kvs_kivi_dequantize(q, a + 400 * d, a + 600 * d);
        CHECK(!memcmp(a, a + 400 * d, sizeof(float) * 400 * d));
    }
    kvs_kivi_free(p);
    kvs_kivi_free(q);
    free(x);
    free(y);
    free(a);
}

/* ---- gather: plan first, then quantise ------------------------------------- */

static void test_gather(void) {
    const int N = 400, d = 64;
    float *x = malloc(sizeof(float) * N * d), *y = malloc(sizeof(float) * N * d);
    float *xk = malloc(sizeof(float) * N * d), *yk = malloc(sizeof(float) * N * d);
    float *a = malloc(sizeof(float) * N * d * 4);
    uint16_t *x16 = malloc(2 * (size_t)N * d), *y16 = malloc(2 * (size_t)N * d);
    fill(x, N, d, 1);
    fill(y, N, d, 0);
    for (int i = 0; i < N * d; i++) {
        x16[i] = kvs_f32_to_f16(x[i]);
        y16[i] = kvs_f32_to_f16(y[i]);
    }
    int32_t idx[400];
    int B = 0;
    for (int t = 0; t < N; t++)
        if (rnd() % 3 != 0 || t >= N - 16) idx[B++] = t;
    /* the compacted copy, from the fp16 cache as an engine holds it */
    for (int b = 0; b < B; b++)
        for (int c2 = 0; c2 < d; c2++) {
            xk[(size_t)b * d + c2] = kvs_f16_to_f32(x16[(size_t)idx[b] * d + c2]);
            yk[(size_t)b * d + c2] = kvs_f16_to_f32(y16[(size_t)idx[b] * d + c2]);
        }
    for (int bits = 2; bits <= 4; bits += 2) {
        const kvs_kivi_config c = kvs_kivi_config_default(bits);
        kvs_err err = {0};
        kvs_kivi_head *g = NULL;
        CHECK_OK(kvs_kivi_init(&g, &c, d, N, &err), &err);
        kvs_kivi_head *ref = build(&c, d, xk, yk, B, 0, 0);
        if (!g || !ref) break;
        /* two heads in the view; head 1 holds the data */
        uint16_t *k2 = calloc(2 * (size_t)N * d, 2), *v2 = calloc(2 * (size_t)N * d, 2);
        memcpy(k2 + (size_t)N * d, x16, 2 * (size_t)N * d);
        memcpy(v2 + (size_t)N * d, y16, 2 * (size_t)N * d);
        kvs_view k = kvs_view_make(k2, KVS_F16, 2, N, d), v = kvs_view_make(v2, KVS_F16, 2, N, d);
        CHECK_OK(kvs_kivi_append_rows(g, &k, &v, 1, idx, B, &err), &err);
        kvs_kivi_dequantize(g, a, a + (size_t)B * d);
        kvs_kivi_dequantize(ref, a + 2 * (size_t)B * d, a + 3 * (size_t)B * d);
        CHECK_MSG(!memcmp(a, a + 2 * (size_t)B * d, sizeof(float) * 2 * B * d),
                  "bits %d: gather != compacted append", bits);
        CHECK_EQ_INT(kvs_kivi_stats(g).total, kvs_kivi_stats(ref).total);
        CHECK_EQ_INT(kvs_kivi_stats(g).n_tokens, B);
        kvs_kivi_free(g);
        kvs_kivi_free(ref);
        free(k2);
        free(v2);
    }
    free(x);
    free(y);
    free(xk);
    free(yk);
    free(a);
    free(x16);
    free(y16);
}

/* ---- scores and weighted sums --------------------------------------------- */

static void test_reads(void) {
    const int d = 128, nq = 3; /* nq: a GQA group of query heads on one KV head */
    const int Ts[] = {1, 100, 128, 129, 300, 517};
    for (int bits = 2; bits <= 4; bits += 2) {
        double es = 0, ms = 0, eo = 0, mo = 0; /* sums of |error| and |exact| */
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            const kvs_kivi_config c = cfg_of(bits, 32, 128, KVS_F32);
            float *x = malloc(sizeof(float) * T * d), *y = malloc(sizeof(float) * T * d);
            float *xd = malloc(sizeof(float) * T * d), *yd = malloc(sizeof(float) * T * d);
            float *q = malloc(sizeof(float) * nq * d), *s = malloc(sizeof(float) * nq * T);
            float *w = malloc(sizeof(float) * nq * T), *o = malloc(sizeof(float) * nq * d);
            fill(x, T, d, 1);
            fill(y, T, d, 0);
            fill(q, nq, d, 0);
            kvs_kivi_head *h = build(&c, d, x, y, T, 0, (int)ti % 2);
            kvs_err err = {0};
            if (h) {
                kvs_kivi_dequantize(h, xd, yd);
                CHECK_OK(kvs_kivi_scores(h, q, nq, s, &err), &err);
                int bad_tight = 0, bad_loose = 0;
                for (int i = 0; i < nq; i++)
                    for (int t = 0; t < T; t++) {
                        double ref = 0, raw = 0, mag = 0, bound = 0;
                        for (int ch = 0; ch < d; ch++) {
                            const double qc = q[i * d + ch];
                            ref += qc * xd[(size_t)t * d + ch];
                            raw += qc * x[(size_t)t * d + ch];
                            mag += fabs(qc * xd[(size_t)t * d + ch]);
                            bound += fabs(qc) * kvs_kivi_step(h, 0, t, ch) * 0.5;
                        }
                        const double got = s[(size_t)i * T + t];
                        bad_tight += !(fabs(got - ref) <= 1e-5 * mag + 1e-30);
                        bad_loose += !(fabs(got - raw) <= bound * (1 + 1e-4) + 1e-5 * mag);
                        es += fabs(got - raw);
                        ms += fabs(raw);
                    }
                CHECK_MSG(bad_tight == 0 && bad_loose == 0,
                          "scores bits %d T %d: %d tight, %d loose failures", bits, T,
                          bad_tight, bad_loose);
                /* softmax-like weights of the scores */
                for (int i = 0; i < nq; i++) {
                    double z = 0;
                    for (int t = 0; t < T; t++) z += exp(s[(size_t)i * T + t] / sqrt(d) - 3.0);
                    for (int t = 0; t < T; t++)
                        w[(size_t)i * T + t] =
                            (float)(exp(s[(size_t)i * T + t] / sqrt(d) - 3.0) / z);
                }
                CHECK_OK(kvs_kivi_weighted_sum(h, w, nq, o, &err), &err);
                bad_tight = bad_loose = 0;
                for (int i = 0; i < nq; i++)
                    for (int ch = 0; ch < d; ch++) {
                        double ref = 0, raw = 0, mag = 0, bound = 0;
                        for (int t = 0; t < T; t++) {
                            const double wt = w[(size_t)i * T + t];
                            ref += wt * yd[(size_t)t * d + ch];
                            raw += wt * y[(size_t)t * d + ch];
                            mag += fabs(wt * yd[(size_t)t * d + ch]);
                            bound += fabs(wt) * kvs_kivi_step(h, 1, t, ch) * 0.5;
                        }
                        const double got = o[(size_t)i * d + ch];
                        /* float accumulation over T terms */
                        bad_tight += !(fabs(got - ref) <= 2e-7 * T * mag + 1e-30);
                        bad_loose += !(fabs(got - raw) <= bound * (1 + 1e-4) + 2e-7 * T * mag);
                        eo += fabs(got - raw);
                        mo += fabs(raw);
                    }
                CHECK_MSG(bad_tight == 0 && bad_loose == 0,
                          "weighted sum bits %d T %d: %d tight, %d loose failures", bits, T,
                          bad_tight, bad_loose);
            }
            kvs_kivi_free(h);
            free(x);
            free(y);
            free(xd);
            free(yd);
            free(q);
            free(s);
            free(w);
            free(o);
        }
        printf("%d bits vs unquantised data: mean |score error| / mean |score| %.4f, "
               "mean |output error| / mean |output| %.4f\n",
               bits, es / ms, eo / mo);
    }
}

/* ---- errors ------------------------------------------------------------------ */

static void test_errors(void) {
    kvs_err err = {0};
    kvs_kivi_head *h = NULL;
    kvs_kivi_config c = kvs_kivi_config_default(3);
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 10, &err), KVS_ERR_INVALID, &err, "k_bits = 3");
    c = kvs_kivi_config_default(2);
    c.v_bits = 8;
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 10, &err), KVS_ERR_INVALID, &err, "v_bits = 8");
    c = cfg_of(2, 32, 100, KVS_F16);
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 10, &err), KVS_ERR_INVALID, &err, "multiple of group");
    c = cfg_of(2, 0, 128, KVS_F16);
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 10, &err), KVS_ERR_INVALID, &err, "group = 0");
    c = cfg_of(2, 4, 8, KVS_U8);
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 10, &err), KVS_ERR_INVALID, &err, "residual_dtype");
    c = cfg_of(2, 4, 8, KVS_F16);
    CHECK_FAILS(kvs_kivi_init(&h, &c, 8, 0, &err), KVS_ERR_INVALID, &err, "capacity");
    CHECK(h == NULL);

    CHECK_OK(kvs_kivi_init(&h, &c, 4, 6, &err), &err);
    if (!h) return;
    float x[8 * 4], y[8 * 4];
    fill(x, 8, 4, 0);
    fill(y, 8, 4, 0);
    kvs_view k = kvs_view_make(x, KVS_F32, 1, 8, 4), v = kvs_view_make(y, KVS_F32, 1, 8, 4);
    float q[4] = {1, 1, 1, 1}, s[8];
    CHECK_FAILS(kvs_kivi_scores(h, q, 1, s, &err), KVS_ERR_INVALID, &err, "empty");
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 0, 0, 7, &err), KVS_ERR_INVALID, &err, "capacity 6");
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 0, 5, 4, &err), KVS_ERR_INVALID, &err, "rows [5, 9)");
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 1, 0, 1, &err), KVS_ERR_INVALID, &err, "head 1");
    const int32_t bad_idx[3] = {0, 2, 2};
    CHECK_FAILS(kvs_kivi_append_rows(h, &k, &v, 0, bad_idx, 3, &err), KVS_ERR_INVALID, &err,
                "ascend");
    y[3 * 4 + 2] = NAN;
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 0, 0, 5, &err), KVS_ERR_NUMERIC, &err,
                "V head 0 token 3 channel 2");
    y[3 * 4 + 2] = 0.0f;
    x[1 * 4 + 0] = 70000.0f;
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 0, 0, 5, &err), KVS_ERR_NUMERIC, &err,
                "K head 0 token 1 channel 0");
    CHECK_EQ_INT(kvs_kivi_stats(h).n_tokens, 0); /* failures change nothing */
    x[1 * 4 + 0] = 0.0f;
    kvs_view kd = k;
    kd.head_dim = 3;
    CHECK_FAILS(kvs_kivi_append(h, &kd, &v, 0, 0, 1, &err), KVS_ERR_INVALID, &err, "head_dim 3");
    kd = k;
    kd.device = KVS_CUDA;
    CHECK_FAILS(kvs_kivi_append(h, &kd, &v, 0, 0, 1, &err), KVS_ERR_UNSUPPORTED, &err,
                "host memory");
    CHECK_OK(kvs_kivi_append(h, &k, &v, 0, 0, 6, &err), &err);
    CHECK_FAILS(kvs_kivi_append(h, &k, &v, 0, 6, 1, &err), KVS_ERR_INVALID, &err, "capacity");
    CHECK_FAILS(kvs_kivi_scores(h, q, 0, s, &err), KVS_ERR_INVALID, &err, "nq = 0");
    kvs_kivi_free(h);
    kvs_kivi_free(NULL);
}

int main(void) {
    test_hand();
    test_bytes_golden();
    test_roundtrip_props();
    test_window();
    test_gather();
    test_reads();
    test_errors();
    return kvs_test_finish("test_kivi");
}
