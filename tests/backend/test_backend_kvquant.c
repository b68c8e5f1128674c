/*
 * test_backend_kvquant.c -- the Q8_0 / Q4_0 KV cache (backend/cpu/kvcache.c,
 * backend/model/session.c) on random rows and tiny gemma3 / qwen2 models.
 *
 * Kernels (random shapes, property checks):
 * - quantise then dequantise: every value within its block's bound (Q8_0:
 *   0.6 d, d = amax / 127 rounded to f16; Q4_0: |d|, d = -max / 8);
 * - kvs_dot_cache_heads against an fp64 dot of the fp32 query with the
 *   dequantised rows: within the bound the query's 8-bit quantisation allows
 *   (per block amax_q / 254 times the block's sum |k|; dot_kv.c's fp32 query
 *   is well inside it), never exactly equal on all rows where the CPU takes
 *   the block-scale route (the query really is quantised there);
 * - kvs_axpy_cache_heads against fp64 sums over the dequantised rows (1e-5
 *   of the sum of |terms|); group kernels bit for bit the one-head kernels,
 *   strided rows and a 32-element slice of a row (the split decode path);
 * - kvs_cache_row_size: 34 / 18 bytes per 32 values.
 * Sessions (tiny models, head size 32 and 64, each cache type q8_0, q4_0 and
 * K q8_0 with V q4_0 or f16):
 * - prefill + snapkv + decode: logits within 0.1 (q8_0) / 0.35 (q4_0) of the
 *   largest |logit| of the f32 cache's, not identical;
 * - extend of <= 64 tokens and kvs_batch_decode of 3 sessions bit-identical to
 *   decoding alone; a session copy decodes identically; a copy from an f32
 *   session (rows converted) decodes close to it; kvs_session_fill_random
 *   gives a prefill's stats and decodes;
 * - a plan keeping every token (gather of whole rows) leaves decode bit-
 *   identical; a merging plan (lookm) works on quantised rows;
 * - sliding-window layers trimmed to their window decode bit-identically to
 *   untrimmed ones past the trimmed buffer (whole rows of blocks moved);
 * - stats: bytes per token and layer Hkv x (row bytes of K + of V); cache
 *   views of block types are fp32 copies of the dequantised rows;
 * - composition: SnapKV and AdaKV (ragged heads) at 0.25 then a q8_0 / q4_0
 *   cache: the stats' bytes after are exactly the kept rows times the block
 *   row sizes (floor(0.25 N) per layer and KV head, Hkv x (rk + rv) each);
 * - head size 16 with q8_0 is refused naming head_dim; unknown types refused.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"
#include "tiny_model.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float nrand(void) { /* normal, a few values far from 1 */
    double u = urand() + 1e-12, v = urand();
    float x = (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
    double r = urand();
    return r < 0.02 ? x * 30.0f : r < 0.04 ? x * 1e-3f : x;
}

/* ---- kernels ------------------------------------------------------------------ */

static void check_roundtrip(int ct) {
    enum { N = 32 * 64 };
    float x[N], y[N];
    uint8_t b[N * 2];
    for (int i = 0; i < N; i++) x[i] = nrand();
    for (int i = 0; i < 32; i++) x[i] = 0;          /* an all-zero block */
    for (int i = 32; i < 64; i++) x[i] = i == 40 ? 5.0f : 0.25f; /* one large value */
    kvs_cache_from_f32(ct, x, b, N);
    kvs_cache_to_f32(ct, b, y, N);
    int bad = 0;
    for (int blk = 0; blk < N / 32; blk++) {
        float amax = 0, mx = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[blk * 32 + i]) > amax) amax = fabsf(x[blk * 32 + i]), mx = x[blk * 32 + i];
        const double d = ct == KVS_CACHE_Q8_0 ? kvs_f16_to_f32(kvs_f32_to_f16(amax / 127.0f))
                                              : fabs(kvs_f16_to_f32(kvs_f32_to_f16(mx / -8.0f)));
        const double bound = (ct == KVS_CACHE_Q8_0 ? 0.6 : 1.0) * d + 1e-30;
        for (int i = 0; i < 32; i++) bad += !(fabs(y[blk * 32 + i] - x[blk * 32 + i]) <= bound);
    }
    CHECK_MSG(bad == 0, "%s: %d values outside their block's bound", kvs_cache_type_name(ct), bad);
    for (int i = 0; i < 32; i++) CHECK(y[i] == 0.0f);
    CHECK_EQ_INT((int64_t)kvs_cache_row_size(ct, 64), ct == KVS_CACHE_Q8_0 ? 68 : 36);
}

/* nh heads of size n against nrows rows of stride rs (elements). */
static int run_case(int ct, int nh, int n, int nrows, int rs) {
    const size_t qs = (size_t)n + 3, os = (size_t)nrows + 5, ps = (size_t)nrows + 2, ostr = (size_t)n + 1;
    const size_t rb = kvs_cache_row_size(ct, rs);
    float *q = malloc(sizeof(float) * qs * nh), *rowsf = malloc(sizeof(float) * (size_t)rs * nrows);
    float *deq = malloc(sizeof(float) * (size_t)rs * nrows);
    uint8_t *rows = malloc(rb * (size_t)nrows);
    float *got = calloc(os * nh, sizeof(float)), *one = calloc(os * nh, sizeof(float));
    float *p = malloc(sizeof(float) * ps * nh), *o1 = malloc(sizeof(float) * ostr * nh);
    float *o2 = malloc(sizeof(float) * ostr * nh), *o3 = malloc(sizeof(float) * ostr * nh);
    int fails = 0;
    for (size_t i = 0; i < qs * nh; i++) q[i] = nrand();
    for (size_t i = 0; i < (size_t)rs * nrows; i++) rowsf[i] = nrand();
    kvs_cache_from_f32(ct, rowsf, rows, rs * nrows);
    kvs_cache_to_f32(ct, rows, deq, rs * nrows);
    const float scale = 0.125f;
    kvs_dot_cache_heads(ct, q, qs, nh, rows, (size_t)rs, nrows, n, scale, got, os);
    int exact = 0;
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (size_t)h * qs;
        for (int t = 0; t < nrows; t++) {
            const float *k = deq + (size_t)t * rs;
            double ref = 0, bound = 0;
            for (int b = 0; b < n / 32; b++) {
                double am = 0, sk = 0;
                for (int i = 0; i < 32; i++) {
                    am = fmax(am, fabs(qh[b * 32 + i]));
                    sk += fabs(k[b * 32 + i]);
                    ref += (double)qh[b * 32 + i] * k[b * 32 + i];
                }
                bound += am / 254.0 * sk * 1.001;
            }
            ref *= scale;
            bound = bound * scale + 1e-5 * (fabs(ref) + 1);
            const float g = got[(size_t)h * os + t];
            fails += !(fabs(g - ref) <= bound);
            exact += g == (float)ref;
            one[(size_t)h * os + t] = kvs_dot_cache(ct, qh, rows + (size_t)t * rb, n) * scale;
        }
        fails += memcmp(one + (size_t)h * os, got + (size_t)h * os, sizeof(float) * (size_t)nrows) != 0;
    }
    /* the block-scale route quantises the query: that shows somewhere */
    if (nrows >= 8 && exact == nh * nrows && strstr(kvs_attn_kernels(ct, n), "q8 query")) fails++;
    /* value sums: o1 group kernel, o2 one head at a time, fp64 reference */
    for (size_t i = 0; i < ps * nh; i++) p[i] = (float)urand();
    for (size_t i = 0; i < ostr * nh; i++) o1[i] = o2[i] = o3[i] = nrand();
    kvs_axpy_cache_heads(ct, o1, ostr, nh, p, ps, rows, (size_t)rs, nrows, n);
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < nrows; t++)
            kvs_axpy_cache(ct, o2 + (size_t)h * ostr, p[(size_t)h * ps + t], rows + (size_t)t * rb, n);
    fails += memcmp(o1, o2, sizeof(float) * ostr * nh) != 0;
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < n; i++) {
            double r = o3[(size_t)h * ostr + i], mag = fabs(r);
            for (int t = 0; t < nrows; t++) {
                double term = (double)p[(size_t)h * ps + t] * deq[(size_t)t * rs + i];
                r += term;
                mag += fabs(term);
            }
            fails += !(fabs(o1[(size_t)h * ostr + i] - r) <= 1e-5 * mag + 1e-30);
        }
    /* a 32-element slice at element 32 of each row (the split decode path's share) */
    if (n >= 64) {
        for (size_t i = 0; i < ostr * nh; i++) o1[i] = o2[i] = 0;
        kvs_axpy_cache_heads(ct, o1 + 32, ostr, nh, p, ps, rows + kvs_cache_row_size(ct, 32), (size_t)rs, nrows, 32);
        kvs_axpy_cache_heads(ct, o2, ostr, nh, p, ps, rows, (size_t)rs, nrows, n);
        for (int h = 0; h < nh; h++)
            fails += memcmp(o1 + (size_t)h * ostr + 32, o2 + (size_t)h * ostr + 32, 32 * sizeof(float)) != 0;
    }
    free(q), free(rowsf), free(deq), free(rows), free(got), free(one), free(p), free(o1), free(o2), free(o3);
    return fails;
}

static void check_kernels(void) {
    static const int heads[] = {1, 2, 3, 4, 7, 8, 9, 12};
    static const int sizes[] = {32, 64, 128, 256};
    static const int nrows[] = {1, 5, 31, 32, 33, 100};
    for (int ct = KVS_CACHE_Q8_0; ct <= KVS_CACHE_Q4_0; ct++) {
        check_roundtrip(ct);
        int cases = 0, fails = 0;
        for (int a = 0; a < 8; a++)
            for (int s = 0; s < 4; s++)
                for (int r = 0; r < 6; r++) {
                    fails += run_case(ct, heads[a], sizes[s], nrows[r], sizes[s]);
                    if (r == 4) fails += run_case(ct, heads[a], sizes[s], nrows[r], 2 * sizes[s] + 32);
                    cases++;
                }
        CHECK_MSG(fails == 0, "%s kernels: %d failed checks in %d cases", kvs_cache_type_name(ct), fails, cases);
        printf("%s: %d kernel cases, kernels \"%s\"\n", kvs_cache_type_name(ct), cases, kvs_attn_kernels(ct, 64));
    }
}

/* ---- sessions on tiny models ------------------------------------------------------ */

static double rel_diff(const float *a, const float *b, int n) {
    double mx = 1e-30, d = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (int i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i]));
    return d / mx;
}

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static kvs_status prep(kvs_session *s, const int32_t *toks, int n, const char *method, double ratio, kvs_kv_stats *st,
                       kvs_err *err) {
    kvs_session_reset(s);
    kvs_status rc = kvs_session_prefill(s, toks, n, NULL, NULL, err);
    if (rc || !method) return rc;
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = kvs_method_find(method);
    if (!co.method) return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s", method);
    kvs_params_defaults(co.method, &co.params);
    co.budget.ratio = ratio;
    return kvs_session_compress(s, &co, st, err);
}

/* ctk, ctv: K and V types (ctv as kvs_session_opts.cache_type_v). */
static void run_model(const char *arch, int D, int ctk, int ctv) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default(arch);
    sp.head_dim = D;
    char path[80], what[64];
    const int vt = ctv ? ctv - 1 : ctk;
    snprintf(what, sizeof what, "%s D %d K %s V %s", arch, D, kvs_cache_type_name(ctk), kvs_cache_type_name(vt));
    snprintf(path, sizeof path, "backend_kvquant_%s_%d_%d_%d.gguf", arch, D, ctk, ctv);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab, N = 40, NT = 200;
    int32_t toks[200];
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)(urand() * V) % V;
    float *l32 = malloc((size_t)V * 4), *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    float *lbat = malloc((size_t)3 * V * 4);
    kvs_session *f = NULL, *a = NULL, *b = NULL, *c = NULL, *ss[3] = {0};
    kvs_session_opts so32 = {256, 2, -1, KVS_CACHE_F32, 0}, so = {256, 2, -1, ctk, ctv};
    kvs_batch *bt = NULL;
    CHECK_OK(kvs_session_new(m, &so32, &f, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &a, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &b, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &c, &err), &err);
    for (int i = 0; i < 3; i++) CHECK_OK(kvs_session_new(m, &so, &ss[i], &err), &err);
    CHECK_OK(kvs_batch_new(m, 3, 2, &bt, &err), &err);
    if (!f || !a || !b || !c || !ss[0] || !ss[1] || !ss[2] || !bt || !l32 || !la || !lb || !lbat) goto done;
    const size_t rk = kvs_cache_row_size(ctk, D), rv = kvs_cache_row_size(vt, D);

    /* stats and views of the uncompressed cache */
    CHECK_OK(kvs_session_prefill(a, toks, N, NULL, NULL, &err), &err);
    kvs_kv_stats st;
    kvs_session_kv_stats(a, &st);
    CHECK_EQ_INT(st.bytes_before_total, (int64_t)N * I->n_layers * I->n_kv_heads * (int64_t)(rk + rv));
    {
        kvs_layer *ls = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
        int map[KVS_MAX_LAYERS], nm = 0;
        kvs_cache_view cv;
        CHECK_OK(kvs_session_cache_view(a, 1, &cv, ls, map, &nm, &err), &err);
        if (nm > 0) {
            CHECK_EQ_INT(cv.layers[0].k.dtype, kvs_cache_is_block(ctk) ? KVS_F32 : KVS_F16);
            CHECK_EQ_INT(cv.layers[0].v.dtype, kvs_cache_is_block(vt) ? KVS_F32 : KVS_F16);
            CHECK_OK(kvs_cache_validate(&cv, NULL, &err), &err);
        }
        free(ls);
    }

    /* against f32: prefill, snapkv at 0.5, 6 decodes */
    CHECK_OK(prep(f, toks, N, "snapkv", 0.5, NULL, &err), &err);
    CHECK_OK(prep(a, toks, N, "snapkv", 0.5, &st, &err), &err);
    for (int t = 0; t < 6; t++) {
        CHECK_OK(kvs_session_decode(f, toks[N + t], l32, &err), &err);
        CHECK_OK(kvs_session_decode(a, toks[N + t], la, &err), &err);
    }
    double d = rel_diff(la, l32, V), tol = ctk == KVS_CACHE_Q4_0 || vt == KVS_CACHE_Q4_0 ? 0.35 : 0.1;
    CHECK_MSG(d <= tol && d > 0, "%s: logits differ from f32 by %g (tolerance %g, must not be 0)", what, d, tol);
    {
        int64_t rows = 0;
        for (int l = 0; l < I->n_layers; l++) rows += st.tokens_after[l];
        CHECK_EQ_INT(st.bytes_after_total, rows * I->n_kv_heads * (int64_t)(rk + rv));
    }

    /* a copy from the f32 session converts its rows: close to it, as above */
    CHECK_OK(kvs_session_copy(c, f, &err), &err);
    CHECK_OK(kvs_session_decode(f, 9, l32, &err), &err);
    CHECK_OK(kvs_session_decode(c, 9, lb, &err), &err);
    d = rel_diff(lb, l32, V);
    CHECK_MSG(d <= tol && d > 0, "%s: converted copy differs from f32 by %g (tolerance %g)", what, d, tol);
    /* random rows for benchmarks: the stats of a prefill, decoding works, only on an empty session */
    kvs_session_reset(c);
    CHECK_OK(kvs_session_fill_random(c, N, 3, &err), &err);
    kvs_session_kv_stats(c, &st);
    CHECK_EQ_INT(st.bytes_before_total, (int64_t)N * I->n_layers * I->n_kv_heads * (int64_t)(rk + rv));
    CHECK_OK(kvs_session_decode(c, 5, lb, &err), &err);
    CHECK(isfinite(lb[0]) && isfinite(lb[V - 1]));
    CHECK_FAILS(kvs_session_fill_random(c, N, 3, &err), KVS_ERR_INVALID, &err, "empty");

    /* a copy decodes identically; extend <= 64 tokens == decode one by one */
    CHECK_OK(kvs_session_copy(b, a, &err), &err);
    CHECK_OK(kvs_session_decode(a, 7, la, &err), &err);
    CHECK_OK(kvs_session_decode(b, 7, lb, &err), &err);
    CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: a copy decodes differently", what);
    CHECK_OK(kvs_session_extend(a, toks + 60, 20, la, &err), &err);
    for (int t = 0; t < 20; t++) CHECK_OK(kvs_session_decode(b, toks[60 + t], lb, &err), &err);
    CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: extend of 20 differs from decoding", what);

    /* batch of 3 == each alone */
    {
        static const char *bm[3] = {"streamingllm", NULL, "h2o"};
        int identical = 1;
        int32_t tk[3];
        for (int i = 0; i < 3; i++) {
            CHECK_OK(prep(ss[i], toks, 20 + 7 * i, bm[i], 0.4, NULL, &err), &err);
            tk[i] = toks[100 + i];
        }
        CHECK_OK(kvs_session_copy(b, ss[1], &err), &err);
        for (int step = 0; step < 8; step++) {
            CHECK_OK(kvs_batch_decode(bt, ss, tk, 3, lbat, &err), &err);
            CHECK_OK(kvs_session_decode(b, tk[1], lb, &err), &err);
            identical &= !memcmp(lb, lbat + V, (size_t)V * 4);
            for (int i = 0; i < 3; i++) tk[i] = argmax_f(lbat + (size_t)i * V, V);
        }
        CHECK_MSG(identical, "%s: batch decode differs from decoding alone", what);
    }

    /* a plan keeping every token: gather of whole rows, decode unchanged */
    CHECK_OK(prep(a, toks, N, NULL, 0, NULL, &err), &err);
    CHECK_OK(prep(b, toks, N, "streamingllm", 1.0, &st, &err), &err);
    CHECK_EQ_INT(st.bytes_after_global, st.bytes_before_global);
    {
        int same = 1;
        for (int t = 0; t < 10; t++) {
            CHECK_OK(kvs_session_decode(a, toks[N + t], la, &err), &err);
            CHECK_OK(kvs_session_decode(b, toks[N + t], lb, &err), &err);
            same &= !memcmp(la, lb, (size_t)V * 4);
        }
        CHECK_MSG(same, "%s: keeping every token changed decoding", what);
    }
    /* a merging plan on quantised rows */
    CHECK_OK(prep(c, toks, N, "lookm", 0.5, &st, &err), &err);
    CHECK_OK(kvs_session_decode(c, toks[N], la, &err), &err);
    {
        int finite = 1;
        for (int i = 0; i < V; i++) finite &= isfinite(la[i]) != 0;
        CHECK_MSG(finite, "%s: lookm (merging) gives non-finite logits", what);
    }

    /* sliding-window layers trimmed == untrimmed, past the trimmed buffer */
    if (sp.sliding_window > 0) {
        kvs_compress_opts co;
        memset(&co, 0, sizeof co);
        CHECK_OK(prep(a, toks, 30, NULL, 0, NULL, &err), &err);
        CHECK_OK(kvs_session_copy(b, a, &err), &err);
        CHECK_OK(kvs_session_compress(b, &co, &st, &err), &err);
        CHECK_EQ_INT(st.bytes_after_local, (int64_t)I->n_local_layers * 3 * I->n_kv_heads * (int64_t)(rk + rv));
        int same = 1, tok = toks[30];
        kvs_session *pair[2] = {a, b};
        while (kvs_session_n_past(a) < 180) {
            int32_t tk[2] = {tok, tok};
            CHECK_OK(kvs_batch_decode(bt, pair, tk, 2, lbat, &err), &err);
            same &= !memcmp(lbat, lbat + V, (size_t)V * 4);
            tok = argmax_f(lbat, V);
        }
        CHECK_MSG(same, "%s: decode with trimmed local layers differs", what);
    }
done:
    kvs_batch_free(bt);
    for (int i = 0; i < 3; i++) kvs_session_free(ss[i]);
    kvs_session_free(f), kvs_session_free(a), kvs_session_free(b), kvs_session_free(c);
    free(l32), free(la), free(lb), free(lbat);
    kvs_model_free(m);
    remove(path);
}

/* Eviction then quantisation: the plan keeps floor(0.25 N) rows per layer and
 * KV head (AdaKV: that many per layer on average, ragged over the heads), the
 * kept rows are stored in the session's cache type, and the stats count the
 * bytes of both: the formula's bytes exactly, for each cache type. */
static void check_composition(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2");
    sp.head_dim = 64;
    const char *path = "backend_kvquant_compose.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    enum { N = 128 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(urand() * I->n_vocab) % I->n_vocab;
    int per = 0;
    const kvs_budget b = {0.25, 0};
    CHECK_OK(kvs_budget_per_layer(&b, N, &per, &err), &err);
    CHECK_EQ_INT(per, N / 4);
    static const int types[3] = {KVS_CACHE_F16, KVS_CACHE_Q8_0, KVS_CACHE_Q4_0};
    static const char *const methods[2] = {"snapkv", "adakv"};
    for (int mi = 0; mi < 2; mi++)
        for (int ti = 0; ti < 3; ti++) {
            kvs_session *s = NULL;
            kvs_session_opts so = {N + 8, 2, -1, types[ti], 0};
            CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
            if (!s) continue;
            kvs_kv_stats st;
            memset(&st, 0, sizeof st);
            CHECK_OK(prep(s, toks, N, methods[mi], 0.25, &st, &err), &err);
            /* f16 32 values in 64 bytes, Q8_0 in 34, Q4_0 in 18 */
            const int64_t row = (int64_t)I->head_dim / 32 * (ti == 0 ? 64 : ti == 1 ? 34 : 18);
            const int64_t want = (int64_t)I->n_layers * per * I->n_kv_heads * 2 * row;
            CHECK_MSG(st.bytes_after_total == want, "%s at 0.25, %s cache: %lld bytes after, the formula %lld",
                      methods[mi], kvs_cache_type_name(types[ti]), (long long)st.bytes_after_total,
                      (long long)want);
            CHECK_EQ_INT(st.bytes_before_total, (int64_t)I->n_layers * N * I->n_kv_heads * 2 * row);
            float *lg = malloc((size_t)I->n_vocab * sizeof *lg); /* and it decodes */
            if (lg) CHECK_OK(kvs_session_decode(s, toks[0], lg, &err), &err);
            free(lg);
            kvs_session_free(s);
        }
    kvs_model_free(m);
    remove(path);
}

static void check_refusals(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2"); /* head size 16: not whole blocks */
    const char *path = "backend_kvquant_refuse.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {1};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (m) {
        kvs_session *s = NULL;
        kvs_session_opts so = {32, 1, 0, KVS_CACHE_Q8_0, 0};
        CHECK_FAILS(kvs_session_new(m, &so, &s, &err), KVS_ERR_UNSUPPORTED, &err, "head_dim");
        kvs_session_opts sv = {32, 1, 0, KVS_CACHE_F16, KVS_CACHE_V(KVS_CACHE_Q4_0)};
        CHECK_FAILS(kvs_session_new(m, &sv, &s, &err), KVS_ERR_UNSUPPORTED, &err, "V cache q4_0");
        kvs_session_opts sb = {32, 1, 0, KVS_CACHE_F16, 9};
        CHECK_FAILS(kvs_session_new(m, &sb, &s, &err), KVS_ERR_INVALID, &err, "cache_type_v");
        kvs_session_free(s);
    }
    int t = -1;
    CHECK_OK(kvs_cache_type_parse("q4_0", &t, &err), &err);
    CHECK_EQ_INT(t, KVS_CACHE_Q4_0);
    CHECK_FAILS(kvs_cache_type_parse("q5_0", &t, &err), KVS_ERR_INVALID, &err, "q8_0, q4_0");
    kvs_model_free(m);
    remove(path);
}

int main(void) {
    check_kernels();
    const int types[][2] = {{KVS_CACHE_Q8_0, 0},
                            {KVS_CACHE_Q4_0, 0},
                            {KVS_CACHE_Q8_0, KVS_CACHE_V(KVS_CACHE_Q4_0)},
                            {KVS_CACHE_Q8_0, KVS_CACHE_V(KVS_CACHE_F16)},
                            {KVS_CACHE_F16, KVS_CACHE_V(KVS_CACHE_Q8_0)}};
    for (int i = 0; i < 5; i++) {
        run_model("gemma3", 32, types[i][0], types[i][1]);
        run_model("qwen2", 64, types[i][0], types[i][1]);
    }
    check_composition();
    check_refusals();
    return kvs_test_finish("backend_kvquant");
}
