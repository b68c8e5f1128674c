/*
 * test_synth.c -- synthetic caches: presets and config errors, determinism
 * (same seed -> identical bytes, other seed -> different), and the planted
 * structure: energy concentrated in low DCT frequencies (naive DCT-II here),
 * outliers deviating from a smoothed version far more than the median token,
 * sinks drawing attention, probes aimed at outliers, smoother image spans.
 */
#include "kvs_formats.h"
#include "test_util.h"

#include <stdint.h>

static kvs_err *ep(kvs_err *e) { return e; }

static void test_presets(void) {
    kvs_synth_config c;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_preset("qwen2.5-vl-7b", &c, &err), ep(&err));
    CHECK(c.n_layers == 28 && c.n_q_heads == 28 && c.n_kv_heads == 4 && c.head_dim == 128);
    CHECK(strcmp(c.preset, "qwen2.5-vl-7b") == 0);
    CHECK_OK(kvs_synth_preset("llava-1.5-7b", &c, &err), ep(&err));
    CHECK(c.n_layers == 32 && c.n_q_heads == 32 && c.n_kv_heads == 32 && c.head_dim == 128);
    CHECK_OK(kvs_synth_preset("gemma3-270m", &c, &err), ep(&err));
    CHECK(c.n_layers == 18 && c.n_q_heads == 4 && c.n_kv_heads == 1 && c.head_dim == 256);
    CHECK_OK(kvs_synth_preset("tiny", &c, &err), ep(&err));
    CHECK(c.n_layers == 2 && c.n_q_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 16);
    CHECK(c.n_probes == 16 && c.n_sinks == 4 && c.rope_theta == 10000.0 && c.image_frac == 0.0);
    CHECK_FAILS(kvs_synth_preset("qwen", &c, &err), KVS_ERR_NOTFOUND, &err,
                "unknown synth preset 'qwen'; known: qwen2.5-vl-7b, llava-1.5-7b, gemma3-270m, tiny");

    kvs_dense_cache dc;
    kvs_synth_config b;
    kvs_synth_preset("tiny", &b, &err);
    b.n_tokens = 64;
    c = b, c.n_q_heads = 5;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "n_q_heads 5 is not a multiple");
    c = b, c.head_dim = 15;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "head_dim 15 must be even");
    c = b, c.n_queries = 65;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "n_queries 65");
    c = b, c.n_outliers = 61;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "n_outliers 61 does not fit");
    c = b, c.n_tokens = 0;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "n_tokens 0");
    c = b, c.image_frac = 1.5;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "image_frac");
    c = b, c.rope_theta = 0;
    CHECK_FAILS(kvs_synth_generate(&c, &dc, NULL, NULL, &err), KVS_ERR_INVALID, &err, "rope_theta");
    /* smallest cases work: N = 1, N = n_sinks */
    c = b, c.n_tokens = 1, c.n_sinks = 1, c.n_queries = 1;
    kvs_err_clear(&err);
    int32_t *ol = NULL;
    CHECK_OK(kvs_synth_generate(&c, &dc, NULL, &ol, &err), ep(&err));
    kvs_dense_cache_free(&dc);
    free(ol);
    c = b, c.n_tokens = 4, c.image_frac = 1.0;
    CHECK_OK(kvs_synth_generate(&c, &dc, NULL, NULL, &err), ep(&err));
    kvs_dense_cache_free(&dc);
}

static int same_cache(const kvs_dense_cache *a, const kvs_dense_cache *b) {
    if (a->n_layers != b->n_layers || a->n_tokens != b->n_tokens) return 0;
    if ((a->modality == NULL) != (b->modality == NULL)) return 0;
    if (a->modality && memcmp(a->modality, b->modality, (size_t)a->n_tokens)) return 0;
    for (int l = 0; l < a->n_layers; l++) {
        const kvs_dense_layer *x = &a->layers[l], *y = &b->layers[l];
        size_t kv = (size_t)x->n_kv_heads * x->n_tokens * x->head_dim * sizeof(float);
        if (memcmp(x->k, y->k, kv) || memcmp(x->v, y->v, kv)) return 0;
        if (x->n_queries != y->n_queries) return 0;
        if (x->n_queries && memcmp(x->q, y->q, (size_t)x->n_q_heads * x->n_queries * x->head_dim * sizeof(float)))
            return 0;
    }
    return 1;
}

static void free_extras(float **probes, int L, int32_t *outl) {
    if (probes)
        for (int l = 0; l < L; l++) free(probes[l]);
    free(probes);
    free(outl);
}

static void test_determinism(void) {
    kvs_synth_config c;
    kvs_err err;
    kvs_err_clear(&err);
    kvs_synth_preset("tiny", &c, &err);
    c.n_tokens = 300, c.n_queries = 20, c.n_probes = 8, c.image_frac = 0.3, c.seed = 1;
    kvs_dense_cache a, b, d;
    float **pa, **pb, **pd;
    int32_t *oa, *ob, *od;
    CHECK_OK(kvs_synth_generate(&c, &a, &pa, &oa, &err), ep(&err));
    CHECK_OK(kvs_synth_generate(&c, &b, &pb, &ob, &err), ep(&err));
    c.seed = 2;
    CHECK_OK(kvs_synth_generate(&c, &d, &pd, &od, &err), ep(&err));
    CHECK(same_cache(&a, &b));
    CHECK(!same_cache(&a, &d));
    CHECK(memcmp(a.layers[0].k, d.layers[0].k, 64) != 0);
    CHECK(memcmp(oa, ob, 4 * sizeof(int32_t)) == 0);
    int psame = 1;
    for (int l = 0; l < 2; l++) psame &= memcmp(pa[l], pb[l], sizeof(float) * 4 * 8 * 16) == 0;
    CHECK(psame);
    CHECK(memcmp(pa[0], pd[0], sizeof(float) * 4 * 8 * 16) != 0);
    /* the cache is valid for methods */
    kvs_cache_view v;
    kvs_layer ls[2];
    kvs_shape sh;
    CHECK_OK(kvs_dense_cache_view(&a, &v, ls, &err), ep(&err));
    CHECK_OK(kvs_cache_validate(&v, &sh, &err), ep(&err));
    CHECK_EQ_INT(sh.n_queries, 20);
    /* no probes / outliers requested: still the same K, V */
    kvs_dense_cache e;
    c.seed = 1;
    CHECK_OK(kvs_synth_generate(&c, &e, NULL, NULL, &err), ep(&err));
    CHECK(same_cache(&a, &e));
    kvs_dense_cache_free(&a);
    kvs_dense_cache_free(&b);
    kvs_dense_cache_free(&d);
    kvs_dense_cache_free(&e);
    free_extras(pa, 2, oa);
    free_extras(pb, 2, ob);
    free_extras(pd, 2, od);
}

/* Share of the energy of x[0..N) in DCT-II modes m < cut (naive, O(N^2)). */
static double low_share(const double *x, int N, int cut, const double *costab) {
    double lo = 0, all = 0;
    for (int m = 0; m < N; m++) {
        double s = 0;
        int64_t idx = m % (4 * N), step = (2 * (int64_t)m) % (4 * N);
        for (int n = 0; n < N; n++) {
            s += x[n] * costab[idx];
            idx += step;
            if (idx >= 4 * N) idx -= 4 * N;
        }
        double e = (m ? 2.0 : 1.0) / N * s * s; /* orthonormal scaling */
        all += e;
        if (m < cut) lo += e;
    }
    return all > 0 ? lo / all : 1.0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_structure(void) {
    const int N = 512, d = 32, Hkv = 2, Hq = 4, L = 2, M = 8, S = 4, P = 16;
    kvs_synth_config c;
    kvs_synth_defaults(&c);
    c.n_layers = L, c.n_q_heads = Hq, c.n_kv_heads = Hkv, c.head_dim = d, c.n_tokens = N;
    c.n_queries = 16, c.n_probes = P, c.n_outliers = M, c.n_sinks = S, c.image_frac = 0.4, c.seed = 77;
    kvs_dense_cache a;
    float **probes;
    int32_t *outl;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_generate(&c, &a, &probes, &outl, &err), ep(&err));
    if (err.code) return;
    /* outliers: sorted, distinct, after the sinks */
    int ok = 1;
    for (int i = 0; i < M; i++) ok &= outl[i] >= S && outl[i] < N && (i == 0 || outl[i] > outl[i - 1]);
    CHECK(ok);
    uint8_t *excl = calloc(N, 1);
    for (int n = 0; n < S; n++) excl[n] = 1;
    for (int i = 0; i < M; i++) excl[outl[i]] = 1;
    /* modality: round(0.4 N) image tokens in at most 3 spans, none among sinks */
    int nimg = 0, spans = 0;
    for (int n = 0; n < N; n++) {
        nimg += a.modality[n] == 1;
        spans += a.modality[n] == 1 && (n == 0 || a.modality[n - 1] == 0);
    }
    CHECK_EQ_INT(nimg, 205);
    CHECK(spans >= 1 && spans <= 3);
    CHECK(a.modality[0] == 0 && a.modality[S - 1] == 0);

    double *costab = malloc(sizeof(double) * 4 * N), *x = malloc(sizeof(double) * N);
    for (int k = 0; k < 4 * N; k++) costab[k] = cos(3.14159265358979323846 * k / (2.0 * N));
    double dev_med_ratio_min = 1e30;
    double low_k = 0, low_v = 0;
    int cols = 0;
    double noise_img = 0, noise_txt = 0;
    long cnt_img = 0, cnt_txt = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++) {
            double *dev = calloc(N, sizeof(double)), *sorted = malloc(sizeof(double) * N);
            for (int part = 0; part < 2; part++) {
                const float *X = (part ? a.layers[l].v : a.layers[l].k) + (size_t)h * N * d;
                for (int ch = 0; ch < d; ch++) {
                    /* non-outlier energy: excluded tokens linearly interpolated */
                    for (int n = 0; n < N; n++) x[n] = X[(size_t)n * d + ch];
                    for (int n = 0; n < N; n++) {
                        if (!excl[n]) continue;
                        int lft = n - 1, rgt = n + 1;
                        while (lft >= 0 && excl[lft]) lft--;
                        while (rgt < N && excl[rgt]) rgt++;
                        double xl = lft >= 0 ? X[(size_t)lft * d + ch] : X[(size_t)rgt * d + ch];
                        double xr = rgt < N ? X[(size_t)rgt * d + ch] : xl;
                        double t = (lft >= 0 && rgt < N) ? (double)(n - lft) / (rgt - lft) : 0;
                        x[n] = xl + t * (xr - xl);
                    }
                    double s = low_share(x, N, N / 5, costab);
                    if (part) low_v += s;
                    else low_k += s;
                    if (part == 0) cols++;
                    /* deviation from a smoothed version: mean of the 8 neighbours */
                    for (int n = 0; n < N; n++) {
                        double sm = 0;
                        int k = 0;
                        for (int j = n - 4; j <= n + 4; j++)
                            if (j >= 0 && j < N && j != n) sm += X[(size_t)j * d + ch], k++;
                        double r = X[(size_t)n * d + ch] - sm / k;
                        dev[n] += r * r;
                    }
                    /* noise level: squared second differences of V (smooth part cancels) */
                    if (part)
                        for (int n = S + 1; n + 1 < N; n++) {
                            if (excl[n - 1] || excl[n] || excl[n + 1]) continue;
                            if (a.modality[n - 1] != a.modality[n] || a.modality[n] != a.modality[n + 1]) continue;
                            double dd = X[(size_t)(n - 1) * d + ch] - 2 * X[(size_t)n * d + ch] +
                                        X[(size_t)(n + 1) * d + ch];
                            if (a.modality[n]) noise_img += dd * dd, cnt_img++;
                            else noise_txt += dd * dd, cnt_txt++;
                        }
                }
            }
            memcpy(sorted, dev, sizeof(double) * N);
            qsort(sorted, N, sizeof(double), cmp_d);
            double med = sorted[N / 2];
            for (int i = 0; i < M; i++)
                if (dev[outl[i]] / med < dev_med_ratio_min) dev_med_ratio_min = dev[outl[i]] / med;
            free(dev);
            free(sorted);
        }
    low_k /= cols, low_v /= cols;
    printf("low-band (m < N/5) energy share: K %.3f, V %.3f; min outlier/median deviation %.1f; "
           "second-diff noise image %.4f text %.4f\n",
           low_k, low_v, dev_med_ratio_min, noise_img / cnt_img, noise_txt / cnt_txt);
    CHECK(low_k > 0.8);
    CHECK(low_v > 0.8);
    CHECK(dev_med_ratio_min > 10.0);
    CHECK(noise_img / cnt_img < 0.5 * noise_txt / cnt_txt);

    /* attention of the last query row: sinks draw a large share; aimed probes
     * put their largest logit on an outlier */
    double sink_share_min = 1, aim_hits = 0, aim_total = 0, generic_hits = 0, generic_total = 0;
    double *lg = malloc(sizeof(double) * N);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hq; h++) {
            int g = h / (Hq / Hkv);
            const float *K = a.layers[l].k + (size_t)g * N * d;
            const float *q = a.layers[l].q + ((size_t)h * 16 + 15) * d;
            double mx = -1e30, z = 0, zs = 0;
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int ch = 0; ch < d; ch++) s += (double)q[ch] * K[(size_t)n * d + ch];
                lg[n] = s / sqrt((double)d);
                if (lg[n] > mx) mx = lg[n];
            }
            for (int n = 0; n < N; n++) {
                double e = exp(lg[n] - mx);
                z += e;
                if (n < S) zs += e;
            }
            if (zs / z < sink_share_min) sink_share_min = zs / z;
            for (int p = 0; p < P; p++) {
                /* attention share of the outlier tokens for this probe */
                const float *pq = probes[l] + ((size_t)h * P + p) * d;
                double pm = -1e30, pz = 0, po = 0;
                for (int n = 0; n < N; n++) {
                    double s = 0;
                    for (int ch = 0; ch < d; ch++) s += (double)pq[ch] * K[(size_t)n * d + ch];
                    lg[n] = s / sqrt((double)d);
                    if (lg[n] > pm) pm = lg[n];
                }
                for (int n = 0; n < N; n++) pz += exp(lg[n] - pm);
                for (int i = 0; i < M; i++) po += exp(lg[outl[i]] - pm);
                if (p < P / 2) aim_hits += po / pz, aim_total++;
                else generic_hits += po / pz, generic_total++;
            }
        }
    printf("min sink attention share (last query) %.3f; outlier attention share: aimed probes %.3f, generic %.3f\n",
           sink_share_min, aim_hits / aim_total, generic_hits / generic_total);
    CHECK(sink_share_min > 0.2);
    CHECK(aim_hits / aim_total > 0.5);
    CHECK(generic_hits / generic_total < 0.2);
    CHECK(aim_hits / aim_total > 3 * generic_hits / generic_total);
    /* sink keys are large */
    double sink_norm = 0, med_norm;
    {
        double *nr = malloc(sizeof(double) * N);
        const float *K = a.layers[0].k;
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int ch = 0; ch < d; ch++) s += (double)K[(size_t)n * d + ch] * K[(size_t)n * d + ch];
            nr[n] = sqrt(s);
        }
        sink_norm = nr[0];
        qsort(nr, N, sizeof(double), cmp_d);
        med_norm = nr[N / 2];
        free(nr);
    }
    CHECK(sink_norm > 2 * med_norm);
    free(lg);
    free(costab);
    free(x);
    free(excl);
    kvs_dense_cache_free(&a);
    free_extras(probes, L, outl);
}

int main(void) {
    test_presets();
    test_determinism();
    test_structure();
    return kvs_test_finish("formats_synth");
}
