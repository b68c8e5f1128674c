/*
 * test_methods1_props.c -- properties of full, random, streamingllm, snapkv
 * and flashcache over random shapes, budgets and parameters: the driver's
 * checks pass (sorted, unique, in range, equal counts per head), the global
 * budget is exact, runs are deterministic, protected tokens are kept, B = N
 * keeps everything; SnapKV and FlashCache selections agree with naive
 * double-precision references written here (kept scores dominate evicted
 * ones up to rounding); FlashCache's DBA gives the noisier layer more; F16
 * and strided views give the same plan as the fp32 contiguous cache.
 */
#include "dct.h"
#include "m1_util.h"

#include <math.h>

#define PI_D 3.14159265358979323846

static int irand(uint64_t *rng, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(kvs_rng_uniform(rng) * (double)(hi - lo + 1));
}

/* Kept scores must dominate evicted ones: min kept >= max evicted - tol (relative,
 * plus 1e-9 absolute for the fp32 noise floor of O(1) data). The
 * tokens in [lo, hi) are the candidates (others are forced or excluded). */
static void check_dominance(const char *what, const double *ref, const int32_t *row, int B,
                            int lo, int hi, double tol, int l, int h) {
    double min_kept = INFINITY, max_ev = -INFINITY;
    int bi = 0;
    for (int t = lo; t < hi; t++) {
        while (bi < B && row[bi] < t) bi++;
        int kept = bi < B && row[bi] == t;
        if (kept && ref[t] < min_kept) min_kept = ref[t];
        if (!kept && ref[t] > max_ev) max_ev = ref[t];
    }
    if (min_kept == INFINITY || max_ev == -INFINITY) return;
    double scale = fabs(max_ev) > 1e-30 ? fabs(max_ev) : 1.0;
    CHECK_MSG(min_kept >= max_ev - tol * scale - 1e-9,
              "%s layer %d head %d: kept score %.9g < evicted score %.9g", what, l, h, min_kept,
              max_ev);
}

static void common_checks(const kvs_method *m, const kvs_params *p, m1_cache *c, int per_layer,
                          int total_expected, kvs_plan *out) {
    kvs_err e_ = {0}, *e = &e_;
    kvs_budget b = {0, per_layer};
    kvs_plan again;
    CHECK_OK(kvs_compress(m, p, &c->view, &b, 1, out, e), e);
    if (!out->layers) return;
    CHECK_OK(kvs_plan_check(out, e), e);
    CHECK_EQ_INT(kvs_plan_total(out), total_expected);
    CHECK_OK(kvs_compress(m, p, &c->view, &b, 1, &again, e), e);
    if (again.layers) CHECK_MSG(m1_plans_equal(out, &again), "%s: two runs differ", m->name);
    kvs_plan_free(&again);
    if (per_layer == c->N) {
        for (int l = 0; l < c->L; l++)
            for (int h = 0; h < c->Hkv; h++)
                CHECK_MSG(out->layers[l].budget == c->N && m1_kept(out, l, h, c->N - 1) &&
                              m1_kept(out, l, h, 0),
                          "%s: B = N does not keep everything", m->name);
    }
}

/* ---- naive references ------------------------------------------------------ */

/* SnapKV votes for prefix keys, in double: [Hkv][N - w]. */
static void ref_snapkv(m1_cache *c, int l, int w, int kernel, int avg, double *out) {
    const int N = c->N, d = c->d, G = c->Hq / c->Hkv, P = N - w;
    double *v = calloc((size_t)N, sizeof(double)), *s = calloc((size_t)N, sizeof(double));
    for (int g = 0; g < c->Hkv; g++) {
        memset(v, 0, sizeof(double) * (size_t)N);
        for (int hq = g * G; hq < (g + 1) * G; hq++)
            for (int i = 0; i < w; i++) {
                const float *q = m1_q(c, l, hq, c->Nq - w + i);
                int pos = N - w + i;
                double mx = -INFINITY, z = 0;
                for (int j = 0; j <= pos; j++) {
                    double a = 0;
                    for (int t = 0; t < d; t++) a += (double)q[t] * m1_k(c, l, g, j)[t];
                    s[j] = a / sqrt((double)d);
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j <= pos; j++) z += exp(s[j] - mx);
                for (int j = 0; j < P; j++) v[j] += exp(s[j] - mx) / z / G;
            }
        for (int j = 0; j < P; j++) {
            int lo = j - kernel / 2, hi = lo + kernel; /* [lo, hi) */
            double acc = avg ? 0.0 : -INFINITY;
            int cnt = 0;
            for (int t = lo; t < hi; t++) {
                if (t < 0 || t >= P) continue;
                cnt++;
                if (avg) acc += v[t];
                else if (v[t] > acc) acc = v[t];
            }
            out[(int64_t)g * P + j] = avg ? acc / cnt : acc;
        }
    }
    free(v);
    free(s);
}

/* FlashCache Dev [Hkv][N] and R^l of one layer, in double, naive DCT. */
static double ref_flashcache(m1_cache *c, int l, double gamma, double *dev) {
    const int N = c->N, d = c->d;
    int omega = (int)lround(gamma * N);
    if (omega < 1) omega = 1;
    double lo[2] = {0, 0}, tot[2] = {0, 0};
    double *X = malloc(sizeof(double) * (size_t)N), *base = malloc(sizeof(double) * (size_t)N);
    for (int h = 0; h < c->Hkv; h++) {
        for (int n = 0; n < N; n++) dev[(int64_t)h * N + n] = 0;
        for (int t = 0; t < 2; t++)
            for (int ch = 0; ch < d; ch++) {
                for (int m = 0; m < N; m++) {
                    double acc = 0;
                    for (int n = 0; n < N; n++) {
                        float x = t ? m1_v(c, l, h, n)[ch] : m1_k(c, l, h, n)[ch];
                        acc += x * cos(PI_D * (2.0 * n + 1) * m / (2.0 * N));
                    }
                    X[m] = acc * (m ? sqrt(2.0 / N) : sqrt(1.0 / N));
                    tot[t] += X[m] * X[m];
                    if (m < omega) lo[t] += X[m] * X[m];
                }
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int m = 0; m < omega; m++)
                        acc += X[m] * (m ? sqrt(2.0 / N) : sqrt(1.0 / N)) *
                               cos(PI_D * (2.0 * n + 1) * m / (2.0 * N));
                    base[n] = acc;
                    float x = t ? m1_v(c, l, h, n)[ch] : m1_k(c, l, h, n)[ch];
                    dev[(int64_t)h * N + n] += (x - acc) * (x - acc) / d;
                }
            }
    }
    free(X);
    free(base);
    double R = 0;
    for (int t = 0; t < 2; t++)
        if (tot[t] > 0) R += fmax(0.0, 1.0 - lo[t] / tot[t]);
    return R;
}

/* ---- per-method property runs ----------------------------------------------- */

static void props_random_sllm_full(uint64_t *rng, m1_cache *c) {
    kvs_plan plan;
    kvs_params p;
    int B = irand(rng, 1, c->N);
    /* full: always L * N (driver check needs B = N). */
    kvs_params_defaults(&kvs_method_full, &p);
    common_checks(&kvs_method_full, &p, c, c->N, c->L * c->N, &plan);
    kvs_plan_free(&plan);
    /* random */
    kvs_params_defaults(&kvs_method_random, &p);
    p.v[0] = (double)irand(rng, 0, 1000000);
    common_checks(&kvs_method_random, &p, c, B, c->L * B, &plan);
    kvs_plan_free(&plan);
    /* streamingllm: protected sinks and recent window */
    kvs_params_defaults(&kvs_method_streamingllm, &p);
    int S = irand(rng, 0, 8);
    p.v[0] = S;
    common_checks(&kvs_method_streamingllm, &p, c, B, c->L * B, &plan);
    if (plan.layers)
        for (int l = 0; l < c->L; l++)
            for (int h = 0; h < c->Hkv; h++) {
                int ok = 1;
                for (int t = 0; t < (B < S ? B : S); t++) ok &= m1_kept(&plan, l, h, t);
                for (int t = c->N - (B - S); B > S && t < c->N; t++) ok &= m1_kept(&plan, l, h, t);
                CHECK_MSG(ok, "streamingllm N=%d B=%d S=%d: protected token missing", c->N, B, S);
                CHECK_MSG(memcmp(plan.layers[l].idx + (int64_t)h * B, plan.layers[0].idx,
                                 sizeof(int32_t) * (size_t)B) == 0,
                          "streamingllm: layer %d head %d differs from layer 0 head 0", l, h);
            }
    kvs_plan_free(&plan);
}

static void props_snapkv(uint64_t *rng, m1_cache *c) {
    const kvs_method *m = &kvs_method_snapkv;
    kvs_params p;
    kvs_params_defaults(m, &p);
    int w = irand(rng, 1, c->Nq), kernel = irand(rng, 1, 9), avg = irand(rng, 0, 1);
    p.v[0] = w, p.v[1] = kernel, p.v[2] = avg;
    int weff = w < c->N ? w : c->N;
    int B = irand(rng, 1, c->N);
    kvs_plan plan;
    common_checks(m, &p, c, B, c->L * B, &plan);
    if (!plan.layers) return;
    const int P = c->N - weff;
    double *ref = malloc(sizeof(double) * ((size_t)c->Hkv * (size_t)(P > 0 ? P : 1)));
    for (int l = 0; l < c->L; l++) {
        ref_snapkv(c, l, weff, kernel, avg, ref);
        for (int h = 0; h < c->Hkv; h++) {
            const int32_t *row = plan.layers[l].idx + (int64_t)h * B;
            int ok = 1;
            for (int t = c->N - (B < weff ? B : weff); t < c->N; t++) ok &= m1_kept(&plan, l, h, t);
            CHECK_MSG(ok, "snapkv N=%d w=%d B=%d: window token missing", c->N, weff, B);
            if (B > weff) check_dominance("snapkv", ref + (int64_t)h * P, row, B, 0, P, 1e-4, l, h);
        }
    }
    free(ref);
    kvs_plan_free(&plan);
}

static void props_flashcache(uint64_t *rng, m1_cache *c) {
    const kvs_method *m = &kvs_method_flashcache;
    kvs_params p;
    kvs_params_defaults(m, &p);
    double gamma = 0.05 + 0.95 * kvs_rng_uniform(rng);
    int dba = irand(rng, 0, 1), gran = irand(rng, 0, 1);
    int s = irand(rng, 0, 1) ? irand(rng, 0, 4) : 0, r = irand(rng, 0, 1) ? irand(rng, 0, 4) : 0;
    p.v[0] = gamma, p.v[1] = dba, p.v[2] = gran, p.v[3] = s, p.v[4] = r;
    int B = irand(rng, 1, c->N);
    kvs_plan plan;
    common_checks(m, &p, c, B, c->L * B, &plan);
    if (!plan.layers) return;
    double *dev = malloc(sizeof(double) * (size_t)c->Hkv * (size_t)c->N);
    double *sum = malloc(sizeof(double) * (size_t)c->N);
    double *R = malloc(sizeof(double) * (size_t)c->L);
    for (int l = 0; l < c->L; l++) {
        R[l] = ref_flashcache(c, l, gamma, dev);
        const int Bl = plan.layers[l].budget;
        const int se = s < c->N ? s : c->N, re = r < c->N - se ? r : c->N - se;
        for (int n = 0; n < c->N; n++) {
            sum[n] = 0;
            for (int h = 0; h < c->Hkv; h++) sum[n] += dev[(int64_t)h * c->N + n];
        }
        for (int h = 0; h < c->Hkv; h++) {
            const int32_t *row = plan.layers[l].idx + (int64_t)h * Bl;
            if (se + re <= Bl) {
                int ok = 1;
                for (int t = 0; t < se; t++) ok &= m1_kept(&plan, l, h, t);
                for (int t = c->N - re; t < c->N; t++) ok &= m1_kept(&plan, l, h, t);
                CHECK_MSG(ok, "flashcache N=%d B=%d s=%d r=%d: forced token missing", c->N, Bl,
                          s, r);
                check_dominance("flashcache", gran ? sum : dev + (int64_t)h * c->N, row, Bl, se,
                                c->N - re, 1e-3, l, h);
            }
            if (gran)
                CHECK(memcmp(row, plan.layers[l].idx, sizeof(int32_t) * (size_t)Bl) == 0);
        }
    }
    if (dba) { /* budgets as core's allocator gives them for the reference R, +-1 rounding */
        int *ref_b = malloc(sizeof(int) * (size_t)c->L);
        kvs_err e_ = {0}, *e = &e_;
        int bmin = kvs_budget_min(c->N);
        if (bmin > B) bmin = B;
        CHECK_OK(kvs_budget_allocate(R, c->L, (int64_t)c->L * B, bmin, c->N, ref_b, e), e);
        for (int l = 0; l < c->L; l++)
            CHECK_MSG(abs(ref_b[l] - plan.layers[l].budget) <= 1,
                      "flashcache dba layer %d: budget %d, reference %d", l,
                      plan.layers[l].budget, ref_b[l]);
        free(ref_b);
    } else {
        for (int l = 0; l < c->L; l++) CHECK_EQ_INT(plan.layers[l].budget, B);
    }
    free(dev);
    free(sum);
    free(R);
    kvs_plan_free(&plan);
}

/* DBA direction: layer 1 = layer 0 plus strong white noise -> more
 * high-band energy -> a larger budget. */
static void test_dba_direction(void) {
    uint64_t rng = 99;
    m1_cache c;
    m1_cache_init(&c, 2, 2, 2, 256, 0, 8);
    for (int h = 0; h < 2; h++)
        for (int n = 0; n < 256; n++)
            for (int ch = 0; ch < 8; ch++) {
                float sm = (float)sin(0.02 * n + ch);
                m1_k(&c, 0, h, n)[ch] = m1_v(&c, 0, h, n)[ch] = sm;
                m1_k(&c, 1, h, n)[ch] = sm + (float)kvs_rng_normal(&rng);
                m1_v(&c, 1, h, n)[ch] = sm + (float)kvs_rng_normal(&rng);
            }
    kvs_params p;
    kvs_params_defaults(&kvs_method_flashcache, &p);
    kvs_plan plan;
    kvs_err e_ = {0}, *e = &e_;
    kvs_budget b = {0.2, 0};
    CHECK_OK(kvs_compress(&kvs_method_flashcache, &p, &c.view, &b, 1, &plan, e), e);
    if (plan.layers) {
        CHECK_EQ_INT(plan.layers[0].budget + plan.layers[1].budget, 2 * 51);
        CHECK_MSG(plan.layers[1].budget > plan.layers[0].budget, "dba: noisy layer %d <= smooth %d",
                  plan.layers[1].budget, plan.layers[0].budget);
    }
    kvs_plan_free(&plan);
    m1_cache_free(&c);
}

/* F16 and strided views of the same values give the same plans. */
static void test_views(void) {
    uint64_t rng = 5;
    const int L = 2, H = 2, Hq = 4, N = 64, Nq = 8, d = 8;
    m1_cache c;
    m1_cache_init(&c, L, H, Hq, N, Nq, d);
    m1_cache_fill_random(&c, 11);
    (void)rng;
    /* Round everything to f16 precision so both caches hold equal values. */
    size_t kvn = (size_t)L * H * N * d, qn = (size_t)L * Hq * Nq * d;
    uint16_t *k16 = malloc(2 * kvn), *v16 = malloc(2 * kvn), *q16 = malloc(2 * qn);
    float *kt = malloc(4 * kvn), *vt = malloc(4 * kvn); /* [L][N][H][d] token-major */
    for (size_t i = 0; i < kvn; i++) {
        k16[i] = kvs_f32_to_f16(c.k[i]), c.k[i] = kvs_f16_to_f32(k16[i]);
        v16[i] = kvs_f32_to_f16(c.v[i]), c.v[i] = kvs_f16_to_f32(v16[i]);
    }
    for (size_t i = 0; i < qn; i++) q16[i] = kvs_f32_to_f16(c.q[i]), c.q[i] = kvs_f16_to_f32(q16[i]);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int ch = 0; ch < d; ch++) {
                    size_t dst = (((size_t)l * N + n) * H + h) * d + ch;
                    kt[dst] = m1_k(&c, l, h, n)[ch];
                    vt[dst] = m1_v(&c, l, h, n)[ch];
                }
    kvs_layer l16[2], lst[2];
    for (int l = 0; l < L; l++) {
        l16[l].k = kvs_view_make(k16 + (size_t)l * H * N * d, KVS_F16, H, N, d);
        l16[l].v = kvs_view_make(v16 + (size_t)l * H * N * d, KVS_F16, H, N, d);
        l16[l].q = kvs_view_make(q16 + (size_t)l * Hq * Nq * d, KVS_F16, Hq, Nq, d);
        lst[l] = c.layers[l];
        lst[l].k = kvs_view_make(kt + (size_t)l * N * H * d, KVS_F32, H, N, d);
        lst[l].k.s_head = d, lst[l].k.s_tok = (int64_t)H * d;
        lst[l].v = kvs_view_make(vt + (size_t)l * N * H * d, KVS_F32, H, N, d);
        lst[l].v.s_head = d, lst[l].v.s_tok = (int64_t)H * d;
    }
    kvs_cache_view cv16 = {L, l16, NULL}, cvst = {L, lst, NULL};
    const kvs_method *ms[2] = {&kvs_method_flashcache, &kvs_method_snapkv};
    for (int i = 0; i < 2; i++) {
        kvs_params p;
        kvs_params_defaults(ms[i], &p);
        if (i == 1) p.v[0] = 8;
        kvs_budget b = {0.3, 0};
        kvs_plan a, x, y;
        kvs_err e_ = {0}, *e = &e_;
        CHECK_OK(kvs_compress(ms[i], &p, &c.view, &b, 1, &a, e), e);
        CHECK_OK(kvs_compress(ms[i], &p, &cv16, &b, 1, &x, e), e);
        CHECK_OK(kvs_compress(ms[i], &p, &cvst, &b, 1, &y, e), e);
        if (a.layers && x.layers) CHECK_MSG(m1_plans_equal(&a, &x), "%s: F16 plan differs", ms[i]->name);
        if (a.layers && y.layers)
            CHECK_MSG(m1_plans_equal(&a, &y), "%s: strided plan differs", ms[i]->name);
        kvs_plan_free(&a);
        kvs_plan_free(&x);
        kvs_plan_free(&y);
    }
    free(k16);
    free(v16);
    free(q16);
    free(kt);
    free(vt);
    m1_cache_free(&c);
}

/* FlashCache's plan does not depend on the thread count. */
static void test_threads(void) {
    m1_cache c;
    m1_cache_init(&c, 3, 5, 5, 97, 0, 6);
    m1_cache_fill_random(&c, 77);
    kvs_params p;
    kvs_params_defaults(&kvs_method_flashcache, &p);
    kvs_budget b = {0.3, 0};
    kvs_err e_ = {0}, *e = &e_;
    kvs_plan one, many;
    CHECK_OK(kvs_compress(&kvs_method_flashcache, &p, &c.view, &b, 1, &one, e), e);
    for (int t = 2; t <= 8; t += 3) {
        CHECK_OK(kvs_compress(&kvs_method_flashcache, &p, &c.view, &b, t, &many, e), e);
        if (one.layers && many.layers)
            CHECK_MSG(m1_plans_equal(&one, &many), "flashcache: %d threads differ from 1", t);
        kvs_plan_free(&many);
    }
    kvs_plan_free(&one);
    m1_cache_free(&c);
}

int main(void) {
    uint64_t rng = 2024;
    for (int it = 0; it < 60; it++) {
        int L = irand(&rng, 1, 4), H = irand(&rng, 1, 3), G = irand(&rng, 1, 3);
        int N = irand(&rng, 1, it % 3 == 0 ? 8 : 64), d = irand(&rng, 1, 12);
        int Nq = irand(&rng, 1, N);
        m1_cache c;
        m1_cache_init(&c, L, H, H * G, N, Nq, d);
        m1_cache_fill_random(&c, (uint64_t)it + 1);
        if (it % 4 == 1) /* sparse outlier tokens */
            for (int l = 0; l < L; l++)
                for (int h = 0; h < H; h++) m1_k(&c, l, h, irand(&rng, 0, N - 1))[0] += 8.0f;
        props_random_sllm_full(&rng, &c);
        props_snapkv(&rng, &c);
        props_flashcache(&rng, &c);
        m1_cache_free(&c);
    }
    test_dba_direction();
    test_views();
    test_threads();
    return kvs_test_finish("test_methods1_props");
}
