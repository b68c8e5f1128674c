/*
 * test_backend_kivi.c -- the kivi2 / kivi4 KV cache types of the engine
 * (backend/model/kivi_cache.c over kernels/kivi.h) on tiny qwen2 models
 * (head size 32 with G = 8, R = 16, and head size 40 with G = 16, R = 32: a
 * last value group of 8 channels; a 100-token prompt quantises).
 *
 * - Bytes: after the prefill (sealed by compress "full"), after snapkv at
 *   0.25 and after adakv at 0.25 (ragged: each KV head its own count) the
 *   stats equal L x Hkv (or each head's) byte counts written out here from the
 *   layout (codes, fp16 scales and zeros, fp16 window), against f16's.
 * - Plan first: snapkv and adakv keep the same positions as on an f16 cache.
 * - Sealing = appending the fp16 prefill rows to a store in bulk, in chunks
 *   of 7 and token by token (identical contents and bytes), for a bulk and a
 *   chunked prefill (ubatch 17); those and a token-by-token prefill (a
 *   1-token prompt extended by decode steps) have the same quantised
 *   prefixes and bytes (their rows differ in the last bits: other kernels).
 * - One step of decode attention (kvs_kv_kivi_attend: scores on the codes,
 *   softmax, weighted sum) within 1e-4 relative of fp64 on the dequantised
 *   store, every layer and head.
 * - Decoding: logits finite, close to the f16 cache's but not equal; extend
 *   == decoding the tokens one by one; batch of 2 == each alone; kivi2 K with
 *   kivi4 V runs.
 * - Gemma 3 shape: sliding-window layers keep their trimmed window in fp16
 *   rows (f16 bytes), global layers are quantised (the layout's bytes).
 * - Refusals naming the type and operation: kivi K with f16 V, R not a
 *   multiple of G, views / copies / plans / recompression of a quantised
 *   cache.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "session_internal.h"
#include "test_util.h"
#include "tiny_model.h"

enum { N = 100 };
static int GRP = 8, RES = 16; /* the run's G and R */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Bytes of one head holding T tokens after a flush, from the layout. */
static int64_t head_bytes(int T, int d, int kb, int vb) {
    const int64_t kq = (int64_t)RES * (T / RES), vq = T > RES ? T - RES : 0;
    const int64_t groups = (d + GRP - 1) / GRP;
    return kq / GRP * ((d * GRP * kb + 7) / 8) + kq / GRP * d * 4 + vq * ((d * vb + 7) / 8) + vq * groups * 4 +
           (T - kq + T - vq) * d * 2;
}

static kvs_status compress(kvs_session *s, const char *method, double ratio, kvs_kv_stats *st, kvs_err *err) {
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = method ? kvs_method_find(method) : NULL;
    if (method && !co.method) return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s", method);
    if (co.method) kvs_params_defaults(co.method, &co.params);
    /* adakv: a window below the budget, so the heads' counts differ (ragged) */
    kvs_status r;
    if (method && !strcmp(method, "adakv") && (r = kvs_params_set(co.method, &co.params, "window", "4", err)))
        return r;
    co.budget.ratio = ratio;
    return kvs_session_compress(s, &co, st, err);
}

static double rel_diff(const float *a, const float *b, int n) {
    double mx = 0, ref = 0;
    for (int i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)a[i] - b[i]));
        ref = fmax(ref, fabs((double)b[i]));
    }
    return mx / (ref > 0 ? ref : 1);
}

/* Every store of s: the same contents and stats as one built by appending
 * its layer's fp16 rows `rows` (session r before sealing: [Hkv] rows of
 * head g at kvs_kv_krow) in bulk, in chunks of 7, token by token. */
static void check_seal_is_append(const kvs_session *r, const kvs_session *s, const char *what) {
    const kvs_model_info *I = &s->m->info;
    const int D = I->head_dim;
    float *k1 = malloc(sizeof(float) * 256 * D), *v1 = malloc(sizeof(float) * 256 * D);
    float *k2 = malloc(sizeof(float) * 256 * D), *v2 = malloc(sizeof(float) * 256 * D);
    for (int l = 0; l < I->n_layers && k1 && v1 && k2 && v2; l++)
        for (int g = 0; g < I->n_kv_heads; g++) {
            const kv_layer *c = &r->kv[l];
            const int T = c->len - kvs_kv_lag(c, g);
            const kvs_view kv = {kvs_kv_krow(r, c, g, 0), KVS_F16, KVS_HOST, 1, T, D, (int64_t)T * D, D};
            const kvs_view vv = {kvs_kv_vrow(r, c, g, 0), KVS_F16, KVS_HOST, 1, T, D, (int64_t)T * D, D};
            kvs_kivi_head *h = s->kv[l].kivi[g];
            kvs_kivi_bytes b = kvs_kivi_stats(h);
            CHECK_EQ_INT(b.n_tokens, T);
            kvs_kivi_dequantize(h, k1, v1);
            for (int mode = 0; mode < 3; mode++) {
                kvs_kivi_head *e = NULL;
                kvs_err err = {0};
                CHECK_OK(kvs_kivi_init(&e, &s->kivi_cfg, D, T + 1, &err), &err);
                if (!e) continue;
                const int step = mode == 0 ? T : mode == 1 ? 7 : 1;
                for (int t0 = 0; t0 < T; t0 += step)
                    CHECK_OK(kvs_kivi_append(e, &kv, &vv, 0, t0, T - t0 < step ? T - t0 : step, &err), &err);
                kvs_kivi_flush(e);
                kvs_kivi_bytes be = kvs_kivi_stats(e);
                kvs_kivi_dequantize(e, k2, v2);
                CHECK_MSG(be.k_quantized == b.k_quantized && be.v_quantized == b.v_quantized &&
                              be.total == b.total && !memcmp(k1, k2, sizeof(float) * T * D) &&
                              !memcmp(v1, v2, sizeof(float) * T * D),
                          "%s: layer %d head %d: the store differs from appending its rows (mode %d)", what, l, g,
                          mode);
                kvs_kivi_free(e);
            }
        }
    free(k1);
    free(v1);
    free(k2);
    free(v2);
}

/* One decode step's attention of each store against fp64 on its dequantised rows. */
static void check_attention(const kvs_session *s, const char *what) {
    const kvs_model_info *I = &s->m->info;
    const int D = I->head_dim, G = I->n_heads / I->n_kv_heads;
    float *k = malloc(sizeof(float) * 256 * D), *v = malloc(sizeof(float) * 256 * D);
    float *q = malloc(sizeof(float) * G * D), *o = malloc(sizeof(float) * G * D), *sc = malloc(sizeof(float) * G * 256);
    double *p = malloc(sizeof(double) * 256), worst = 0;
    for (int l = 0; l < I->n_layers && k && v && q && o && sc && p; l++)
        for (int g = 0; g < I->n_kv_heads; g++) {
            const kv_layer *c = &s->kv[l];
            const int T = kvs_kivi_stats(c->kivi[g]).n_tokens;
            for (int i = 0; i < G * D; i++) q[i] = (float)(4 * urand() - 2);
            kvs_kv_kivi_attend(s, c, g, q, G, T, sc, o);
            kvs_kivi_dequantize(c->kivi[g], k, v);
            for (int h = 0; h < G; h++) {
                double mx = -INFINITY, sum = 0, ref[512], rmax = 0, dmax = 0;
                for (int t = 0; t < T; t++) {
                    double dot = 0;
                    for (int i = 0; i < D; i++) dot += (double)q[h * D + i] * k[(size_t)t * D + i];
                    p[t] = dot * s->m->attn_scale;
                    mx = fmax(mx, p[t]);
                }
                for (int t = 0; t < T; t++) sum += p[t] = exp(p[t] - mx);
                for (int i = 0; i < D; i++) {
                    ref[i] = 0;
                    for (int t = 0; t < T; t++) ref[i] += p[t] / sum * v[(size_t)t * D + i];
                    rmax = fmax(rmax, fabs(ref[i]));
                    dmax = fmax(dmax, fabs(ref[i] - o[h * D + i]));
                }
                worst = fmax(worst, dmax / (rmax > 0 ? rmax : 1));
            }
        }
    printf("%s: decode attention vs fp64 on the dequantised stores: max relative error %.2e\n", what, worst);
    CHECK_MSG(worst <= 1e-4, "%s: attention differs from fp64 by %g relative", what, worst);
    free(k);
    free(v);
    free(q);
    free(o);
    free(sc);
    free(p);
}

static void run(int D, int G, int R, int ctk, int ctv) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2");
    sp.head_dim = D;
    GRP = G;
    RES = R;
    char path[80], what[64];
    const int vt = ctv ? ctv - 1 : ctk;
    const int kb = ctk == KVS_CACHE_KIVI2 ? 2 : 4, vb = vt == KVS_CACHE_KIVI2 ? 2 : 4;
    snprintf(what, sizeof what, "qwen2 D %d K %s V %s", D, kvs_cache_type_name(ctk), kvs_cache_type_name(vt));
    snprintf(path, sizeof path, "backend_kivi_%d_%d_%d.gguf", D, ctk, ctv);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab, L = I->n_layers, H = I->n_kv_heads;
    int32_t toks[256];
    for (int i = 0; i < 256; i++) toks[i] = (int32_t)(urand() * V) % V;
    float *l16 = malloc((size_t)V * 4), *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    float *lbat = malloc((size_t)2 * V * 4);
    kvs_session *f = NULL, *a = NULL, *b = NULL, *c = NULL;
    kvs_session_opts so16 = {256, 2, -1, KVS_CACHE_F16, 0}, so = {256, 2, -1, ctk, ctv};
    kvs_batch *bt = NULL;
    CHECK_OK(kvs_session_new(m, &so16, &f, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &a, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &b, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &c, &err), &err);
    CHECK_OK(kvs_batch_new(m, 2, 2, &bt, &err), &err);
    if (!f || !a || !b || !c || !bt || !l16 || !la || !lb || !lbat) goto done;
    CHECK_FAILS(kvs_session_set_kivi(f, GRP, RES, &err), KVS_ERR_INVALID, &err, "not a kivi");
    CHECK_FAILS(kvs_session_set_kivi(a, GRP, GRP + 4, &err), KVS_ERR_INVALID, &err, "multiple");
    CHECK_OK(kvs_session_set_kivi(a, GRP, RES, &err), &err);
    CHECK_OK(kvs_session_set_kivi(b, GRP, RES, &err), &err);
    CHECK_OK(kvs_session_set_kivi(c, GRP, RES, &err), &err);

    /* the prefill: fp16 rows, then sealed by compress "full"; bytes by the layout */
    kvs_kv_stats st, st16;
    CHECK_OK(kvs_session_prefill(f, toks, N, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_prefill(a, toks, N, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_copy(c, a, &err), &err); /* the fp16 rows, to compare the stores with */
    CHECK_OK(compress(a, NULL, 1, &st, &err), &err);
    CHECK_EQ_INT(st.bytes_before_total, (int64_t)L * H * head_bytes(N, D, kb, vb));
    CHECK_EQ_INT(st.bytes_after_total, (int64_t)L * H * head_bytes(N, D, kb, vb));
    kvs_session_kv_stats(f, &st16);
    printf("%s: %d tokens: %lld bytes against f16's %lld\n", what, N, (long long)st.bytes_after_total,
           (long long)st16.bytes_after_total);
    CHECK(st.bytes_after_total < st16.bytes_after_total);
    check_seal_is_append(c, a, what);
    check_attention(a, what);

    /* a prefill in chunks of 17 and one token by token (a 1-token prompt, then
     * extend: decode steps): their stores are their rows appended, with the bulk
     * prefill's quantised prefixes and bytes (a function of the token count;
     * the rows themselves differ in the last bits: other kernels) */
    kvs_session_set_ubatch(b, 17);
    CHECK_OK(kvs_session_prefill(b, toks, N, NULL, NULL, &err), &err);
    kvs_session_reset(c);
    CHECK_OK(kvs_session_copy(c, b, &err), &err);
    CHECK_OK(kvs_session_quantize(b, &err), &err);
    check_seal_is_append(c, b, what);
    kvs_session_reset(c);
    CHECK_OK(kvs_session_prefill(c, toks, 1, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_extend(c, toks + 1, N - 1, NULL, &err), &err);
    for (int l = 0; l < L; l++)
        for (int g = 0; g < H; g++) {
            const kvs_kivi_bytes x = kvs_kivi_stats(a->kv[l].kivi[g]), y = kvs_kivi_stats(b->kv[l].kivi[g]);
            const kvs_kivi_bytes z = kvs_kivi_stats(c->kv[l].kivi[g]);
            CHECK_MSG(x.k_quantized == y.k_quantized && x.v_quantized == y.v_quantized && x.total == y.total &&
                          x.k_quantized == z.k_quantized && x.v_quantized == z.v_quantized && x.total == z.total,
                      "%s: layer %d head %d: bulk, chunked and token-by-token stores differ in layout", what, l, g);
        }
    kvs_session_set_ubatch(b, 0);

    /* quantised caches are not viewed, copied, planned or compressed again */
    {
        kvs_layer *ls = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
        int map[KVS_MAX_LAYERS], nm = 0;
        kvs_cache_view cv;
        CHECK_FAILS(kvs_session_cache_view(a, 1, &cv, ls, map, &nm, &err), KVS_ERR_UNSUPPORTED, &err, "kivi");
        free(ls);
    }
    CHECK_FAILS(kvs_session_copy(c, a, &err), KVS_ERR_UNSUPPORTED, &err, "quantised");
    CHECK_FAILS(compress(a, "snapkv", 0.5, NULL, &err), KVS_ERR_UNSUPPORTED, &err, "kivi");
    {
        kvs_compress_opts co;
        memset(&co, 0, sizeof co);
        co.method = kvs_method_find("streamingllm");
        kvs_params_defaults(co.method, &co.params);
        co.budget.ratio = 0.5;
        CHECK_FAILS(kvs_session_recompress(a, &co, NULL, &err), KVS_ERR_UNSUPPORTED, &err, "kivi");
    }

    /* decoding: close to f16, not equal; extend == decode; batch == alone */
    for (int t = 0; t < 20; t++) {
        CHECK_OK(kvs_session_decode(f, toks[N + t], l16, &err), &err);
        CHECK_OK(kvs_session_decode(a, toks[N + t], la, &err), &err);
    }
    double d = rel_diff(la, l16, V);
    printf("%s: logits after 20 decoded tokens differ from f16's by %.3g of the largest\n", what, d);
    CHECK_MSG(d > 0 && d < 0.5, "%s: logits differ from f16 by %g", what, d);
    check_attention(a, what);
    {
        kvs_kv_stats s2;
        kvs_session_kv_stats(a, &s2);
        CHECK_EQ_INT(s2.bytes_after_total, (int64_t)L * H * head_bytes(N + 20, D, kb, vb));
    }
    kvs_session_reset(b);
    kvs_session_reset(c);
    CHECK_OK(kvs_session_prefill(b, toks, N, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_prefill(c, toks, N, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_extend(b, toks + N, 30, lb, &err), &err);
    for (int t = 0; t < 30; t++) CHECK_OK(kvs_session_decode(c, toks[N + t], la, &err), &err);
    CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: extend of 30 differs from decoding", what);
    {
        kvs_session *two[2] = {b, c};
        int32_t tk[2] = {5, 9};
        CHECK_OK(kvs_batch_decode(bt, two, tk, 2, lbat, &err), &err);
        kvs_session_reset(b);
        CHECK_OK(kvs_session_prefill(b, toks, N, NULL, NULL, &err), &err);
        for (int t = 0; t < 30; t++) CHECK_OK(kvs_session_decode(b, toks[N + t], la, &err), &err);
        CHECK_OK(kvs_session_decode(b, 5, la, &err), &err);
        CHECK_MSG(!memcmp(la, lbat, (size_t)V * 4), "%s: batch decode differs from alone", what);
    }

    /* composition: plan first (the f16 cache's positions), then quantise; bytes per head */
    static const char *meth[3] = {"snapkv", "adakv", "lookm"};
    for (int mi = 0; mi < 3; mi++) {
        kvs_session_reset(a);
        kvs_session_reset(f);
        CHECK_OK(kvs_session_prefill(a, toks, N, NULL, NULL, &err), &err);
        CHECK_OK(kvs_session_prefill(f, toks, N, NULL, NULL, &err), &err);
        CHECK_OK(compress(a, meth[mi], 0.25, &st, &err), &err);
        CHECK_OK(compress(f, meth[mi], 0.25, &st16, &err), &err);
        int64_t want = 0, rows = 0;
        int same_pos = 1;
        for (int l = 0; l < L; l++)
            for (int g = 0; g < H; g++) {
                const kv_layer *ca = &a->kv[l], *cf = &f->kv[l];
                const int T = ca->len - kvs_kv_lag(ca, g);
                want += head_bytes(T, D, kb, vb);
                rows += T;
                same_pos &= T == cf->len - kvs_kv_lag(cf, g) &&
                            !memcmp(kvs_kv_pos(ca, g), kvs_kv_pos(cf, g), sizeof(int32_t) * (size_t)T);
                CHECK_EQ_INT(kvs_kivi_stats(ca->kivi[g]).n_tokens, T);
            }
        CHECK_MSG(same_pos, "%s %s: kept positions differ from the f16 cache's plan", what, meth[mi]);
        if (mi == 1) { /* adakv: heads of different counts somewhere */
            int ragged = 0;
            for (int l = 0; l < L; l++) ragged |= a->kv[l].lag != NULL && a->kv[l].lag[0] != a->kv[l].lag[H - 1];
            CHECK_MSG(ragged, "%s: adakv kept equal counts in every head (the ragged path is not tested)", what);
        }
        CHECK_EQ_INT(st.bytes_after_total, want);
        CHECK_EQ_INT(st.bytes_before_total, (int64_t)L * H * head_bytes(N, D, kb, vb));
        printf("%s %s 0.25: %lld rows, %lld bytes (f16 %lld)\n", what, meth[mi], (long long)rows,
               (long long)st.bytes_after_total, (long long)st16.bytes_after_total);
        for (int t = 0; t < 4; t++) CHECK_OK(kvs_session_decode(a, toks[N + t], la, &err), &err);
        int fin = 1;
        for (int i = 0; i < V; i++) fin &= isfinite(la[i]);
        CHECK_MSG(fin, "%s %s: non-finite logits", what, meth[mi]);
        check_attention(a, what);
    }
done:
    kvs_batch_free(bt);
    kvs_session_free(f);
    kvs_session_free(a);
    kvs_session_free(b);
    kvs_session_free(c);
    free(l16);
    free(la);
    free(lb);
    free(lbat);
    kvs_model_free(m);
    remove(path);
}

static void refusals_and_gemma(void) {
    kvs_err err = {0};
    kvs_model *m = NULL;
    kvs_model_opts mo = {1};
    tiny_spec sp = tiny_default("qwen2");
    CHECK_OK(tiny_write(&sp, "backend_kivi_refuse.gguf", &err), &err);
    CHECK_OK(kvs_model_load("backend_kivi_refuse.gguf", &mo, &m, &err), &err);
    kvs_session *s = NULL;
    kvs_session_opts so = {64, 1, 0, KVS_CACHE_KIVI4, KVS_CACHE_V(KVS_CACHE_F16)};
    CHECK_FAILS(kvs_session_new(m, &so, &s, &err), KVS_ERR_UNSUPPORTED, &err, "kivi4");
    kvs_session_opts so2 = {64, 1, 0, KVS_CACHE_BF16, KVS_CACHE_V(KVS_CACHE_KIVI2)};
    CHECK_FAILS(kvs_session_new(m, &so2, &s, &err), KVS_ERR_UNSUPPORTED, &err, "kivi2");
    int t = -1;
    CHECK_OK(kvs_cache_type_parse("kivi2", &t, &err), &err);
    CHECK_EQ_INT(t, KVS_CACHE_KIVI2);
    CHECK_OK(kvs_cache_type_parse("kivi4", &t, &err), &err);
    CHECK_EQ_INT(t, KVS_CACHE_KIVI4);
    kvs_model_free(m);
    remove("backend_kivi_refuse.gguf");
    m = NULL;
    /* gemma3: sliding-window layers keep their trimmed window in fp16 rows, global layers are quantised */
    tiny_spec sg = tiny_default("gemma3");
    sg.head_dim = 32;
    CHECK_OK(tiny_write(&sg, "backend_kivi_gemma.gguf", &err), &err);
    CHECK_OK(kvs_model_load("backend_kivi_gemma.gguf", &mo, &m, &err), &err);
    if (m) {
        const kvs_model_info *I = kvs_model_get_info(m);
        int32_t toks[N + 8];
        for (int i = 0; i < N + 8; i++) toks[i] = (int32_t)(urand() * I->n_vocab) % I->n_vocab;
        float *lg = malloc(sizeof(float) * (size_t)I->n_vocab);
        kvs_session_opts so3 = {128, 1, -1, KVS_CACHE_KIVI4, 0};
        CHECK_OK(kvs_session_new(m, &so3, &s, &err), &err);
        GRP = 8;
        RES = 16;
        if (s && lg) {
            CHECK_OK(kvs_session_set_kivi(s, GRP, RES, &err), &err);
            CHECK_OK(kvs_session_prefill(s, toks, N, NULL, NULL, &err), &err);
            kvs_kv_stats st;
            CHECK_OK(compress(s, "snapkv", 0.5, &st, &err), &err);
            int locals = 0, globals = 0;
            for (int l = 0; l < I->n_layers; l++) {
                const int64_t T = st.tokens_after[l];
                const int64_t want = st.is_local[l] ? T * I->n_kv_heads * I->head_dim * 4
                                                    : I->n_kv_heads * head_bytes((int)T, I->head_dim, 4, 4);
                CHECK_EQ_INT(st.bytes_after[l], want);
                CHECK_EQ_INT(s->kv[l].kivi != NULL, !st.is_local[l]);
                locals += st.is_local[l];
                globals += !st.is_local[l];
            }
            CHECK(locals > 0 && globals > 0);
            for (int k = 0; k < 8; k++) CHECK_OK(kvs_session_decode(s, toks[N + k], lg, &err), &err);
            CHECK(isfinite(lg[0]) && isfinite(lg[I->n_vocab - 1]));
        }
        free(lg);
        kvs_session_free(s);
    }
    kvs_model_free(m);
    remove("backend_kivi_gemma.gguf");
}

int main(void) {
    refusals_and_gemma();
    run(32, 8, 16, KVS_CACHE_KIVI4, 0);
    run(32, 8, 16, KVS_CACHE_KIVI2, 0);
    run(40, 16, 32, KVS_CACHE_KIVI2, KVS_CACHE_V(KVS_CACHE_KIVI4));
    return kvs_test_finish("backend_kivi");
}
