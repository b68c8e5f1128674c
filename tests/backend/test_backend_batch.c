/*
 * test_backend_batch.c -- batched decode and chunked extend on tiny gemma3 and
 * qwen2 models (random weights; gemma3: 5 sliding-window layers of window 4 +
 * 1 global layer), for every cache type (f32, f16, bf16):
 * - kvs_session_extend after compression equals decoding the same tokens one
 *   by one (logits within 1e-4 relative, 1e-3 for bf16: the tiny models'
 *   weights are F32, so both paths are fp32 arithmetic in a different order;
 *   greedy continuations identical) for a long suffix (sgemm chunks, several
 *   of them with a small ubatch), bit-identical for suffixes of up to 64
 *   tokens (one pass of the decode kernels);
 * - kvs_batch_decode of k = 1, 3, 8 sessions with different compressed caches
 *   (methods, budgets, prompt lengths, extra decoded tokens) gives logits
 *   bit-identical to decoding each alone, step after step;
 * - the batch's error paths (context full names the index, nothing changes);
 * - sliding-window layers trimmed to their window (kvs_session_compress) give
 *   bit-identical logits to untrimmed ones through long extends and decoding
 *   past the trimmed buffer, and the stats report the bytes really held;
 * - with one KV head (head size 64, and 16), a sequence alone decodes through
 *   the three-phase split attention, bit-identical to the one pass;
 * - f16/bf16 caches: logits close to f32 (5e-3 / 3e-2 relative), KV bytes in the
 *   stats are 2 bytes per element, cache views carry the real dtype.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"
#include "tiny_model.h"

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

/* Prefill toks[0..n), then compress with method (NULL: none) at ratio. */
static kvs_status prep(kvs_session *s, const int32_t *toks, int n, const char *method, double ratio, int local,
                       kvs_err *err) {
    kvs_session_reset(s);
    kvs_status st = kvs_session_prefill(s, toks, n, NULL, NULL, err);
    if (st || !method) return st;
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = kvs_method_find(method);
    if (!co.method) return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s", method);
    kvs_params_defaults(co.method, &co.params);
    /* adakv: a window below the budget, so the heads' counts differ (ragged) */
    if (!strcmp(method, "adakv") && (st = kvs_params_set(co.method, &co.params, "window", "4", err))) return st;
    co.budget.ratio = ratio;
    co.compress_local = local;
    return kvs_session_compress(s, &co, NULL, err);
}

/* kv_head_dim > 0: one KV head of that size (Gemma 3 270M's shape): a
 * sequence alone then has fewer (sequence, KV head) units than the 2 threads
 * and decodes through the engine's three-phase attention (rows, then heads,
 * then elements split over the threads; by heads when the size does not split
 * into 32s), which every comparison below holds to the one-pass path's bits
 * (batches of 3 and 8, and extend, take the one pass). */
static void run_arch(const char *arch, int ctype, int kv_head_dim) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default(arch);
    if (kv_head_dim > 0) {
        sp.n_kv_heads = 1;
        sp.head_dim = kv_head_dim;
    }
    char path[64];
    snprintf(path, sizeof path, "backend_batch_%s_%d_%d.gguf", arch, ctype, kv_head_dim);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const int V = kvs_model_get_info(m)->n_vocab;
    enum { NS = 8, NT = 110 };
    int32_t toks[NT];
    uint64_t rng = 99;
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    kvs_session *a = NULL, *b = NULL, *ss[NS] = {0}, *solo[NS] = {0};
    kvs_batch *bt = NULL;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4), *lbat = malloc((size_t)NS * V * 4);
    kvs_session_opts so = {160, 2, -1, ctype, 0};
    CHECK_OK(kvs_session_new(m, &so, &a, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &b, &err), &err);
    if (!a || !b || !la || !lb || !lbat) goto done;

    /* (1) extend after compression == decode one by one */
    /* adakv: ragged heads (global layers only: ragged sliding-window layers are refused) */
    static const char *methods[] = {NULL, "streamingllm", "snapkv", "h2o", "adakv"};
    for (int mi = 0; mi < 5; mi++) {
        for (int local = 0; local < 2 - (mi == 4); local++) {
            const int N = 30, X = 70; /* X > 64: the sgemm chunk path */
            CHECK_OK(prep(a, toks, N, methods[mi], 0.4, local, &err), &err);
            CHECK_OK(kvs_session_copy(b, a, &err), &err);
            kvs_session_set_ubatch(a, mi == 1 ? 8 : 0); /* several chunks for one method */
            CHECK_OK(kvs_session_extend(a, toks + N, X, la, &err), &err);
            for (int t = 0; t < X; t++) CHECK_OK(kvs_session_decode(b, toks[N + t], lb, &err), &err);
            CHECK_EQ_INT(kvs_session_n_past(a), N + X);
            double d = rel_diff(la, lb, V);
            /* Extend computes K/V through OpenBLAS's sgemm, decode through the engine's
             * dot kernels, so the cached values can round the other way. bf16 keeps 8
             * mantissa bits: one flip moves logits by ~1e-4. f16 keeps 11, but which
             * values flip depends on the sgemm kernel OpenBLAS picks for the CPU: 2.0e-4
             * on AMD EPYC (Haswell kernel), under 1e-4 on Sapphire Rapids. The greedy
             * tokens below must still agree exactly. */
            double tol = ctype == KVS_CACHE_BF16 ? 1e-3 : 5e-4;
            CHECK_MSG(d <= tol, "%s %s method %s local %d: extend differs from decode by %g", arch,
                      kvs_cache_type_name(ctype), methods[mi] ? methods[mi] : "none", local, d);
            /* greedy continuation: identical tokens */
            int same = 1;
            for (int g = 0; g < 6; g++) {
                int ta = argmax_f(la, V), tb = argmax_f(lb, V);
                same &= ta == tb;
                CHECK_OK(kvs_session_decode(a, ta, la, &err), &err);
                CHECK_OK(kvs_session_decode(b, tb, lb, &err), &err);
            }
            CHECK_MSG(same, "%s method %s: greedy tokens after extend differ", arch, methods[mi] ? methods[mi] : "none");
            kvs_session_set_ubatch(a, 0);
            /* shorter extend: the decode kernels, bit-identical (from equal states) */
            CHECK_OK(kvs_session_copy(b, a, &err), &err);
            CHECK_OK(kvs_session_extend(a, toks, 23, la, &err), &err);
            for (int t = 0; t < 23; t++) CHECK_OK(kvs_session_decode(b, toks[t], lb, &err), &err);
            CHECK(!memcmp(la, lb, (size_t)V * 4));
            CHECK_OK(kvs_session_extend(a, toks + 3, 1, la, &err), &err);
            CHECK_OK(kvs_session_decode(b, toks[3], lb, &err), &err);
            CHECK(!memcmp(la, lb, (size_t)V * 4));
        }
    }
    /* extend errors change nothing */
    {
        int np = kvs_session_n_past(a);
        CHECK_FAILS(kvs_session_extend(a, toks, 128, la, &err), KVS_ERR_INVALID, &err, "exceed the context");
        int32_t bad[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, -1};
        CHECK_FAILS(kvs_session_extend(a, bad, 10, la, &err), KVS_ERR_INVALID, &err, "index 9");
        CHECK_EQ_INT(kvs_session_n_past(a), np);
        kvs_session_reset(b);
        CHECK_FAILS(kvs_session_extend(b, toks, 10, la, &err), KVS_ERR_INVALID, &err, "prefill first");
    }

    /* (2) batch decode == each alone, k = 1, 3, 8 */
    CHECK_OK(kvs_batch_new(m, NS, 2, &bt, &err), &err);
    for (int i = 0; i < NS && bt; i++) {
        CHECK_OK(kvs_session_new(m, &so, &ss[i], &err), &err);
        CHECK_OK(kvs_session_new(m, &so, &solo[i], &err), &err);
    }
    static const char *bm[NS] = {"snapkv", NULL, "streamingllm", "h2o", "snapkv", "streamingllm", NULL, "h2o"};
    static const int ks[3] = {1, 3, 8};
    for (int ki = 0; ki < 3 && bt; ki++) {
        int k = ks[ki], ok = 1;
        for (int i = 0; i < k; i++) {
            if (!ss[i] || !solo[i]) {
                ok = 0;
                break;
            }
            int N = 12 + 5 * i;
            CHECK_OK(prep(ss[i], toks, N, bm[i], 0.3 + 0.1 * (i % 4), i % 2, &err), &err);
            /* different n_past beyond the prompt */
            for (int t = 0; t < i % 3; t++) CHECK_OK(kvs_session_decode(ss[i], toks[40 + t], NULL, &err), &err);
            CHECK_OK(kvs_session_copy(solo[i], ss[i], &err), &err);
        }
        if (!ok) break;
        int32_t tk[NS];
        for (int i = 0; i < k; i++) tk[i] = toks[50 + i];
        int identical = 1;
        for (int step = 0; step < 10; step++) {
            CHECK_OK(kvs_batch_decode(bt, ss, tk, k, lbat, &err), &err);
            for (int i = 0; i < k; i++) {
                CHECK_OK(kvs_session_decode(solo[i], tk[i], la, &err), &err);
                identical &= !memcmp(la, lbat + (size_t)i * V, (size_t)V * 4);
                CHECK_EQ_INT(kvs_session_n_past(ss[i]), kvs_session_n_past(solo[i]));
                tk[i] = argmax_f(la, V);
            }
        }
        CHECK_MSG(identical, "%s %s: batch of %d differs from decoding alone", arch, kvs_cache_type_name(ctype), k);
    }
    /* batch errors: the full one is named, nothing changes */
    if (bt && ss[0] && ss[1] && ss[2]) {
        CHECK_OK(prep(ss[2], toks, 12, NULL, 0, 0, &err), &err);
        while (kvs_session_n_past(ss[2]) < kvs_session_n_ctx(ss[2]))
            CHECK_OK(kvs_session_decode(ss[2], 3, NULL, &err), &err);
        int n0 = kvs_session_n_past(ss[0]);
        int32_t tk[3] = {1, 2, 3};
        CHECK_FAILS(kvs_batch_decode(bt, ss, tk, 3, lbat, &err), KVS_ERR_INVALID, &err, "batch index 2");
        CHECK_EQ_INT(kvs_session_n_past(ss[0]), n0);
        kvs_session *dup[2] = {ss[0], ss[0]};
        CHECK_FAILS(kvs_batch_decode(bt, dup, tk, 2, lbat, &err), KVS_ERR_INVALID, &err, "the same");
        CHECK_FAILS(kvs_batch_decode(bt, ss, tk, NS + 1, lbat, &err), KVS_ERR_INVALID, &err, "sequences");
        int32_t badt[1] = {V};
        CHECK_FAILS(kvs_batch_decode(bt, ss, badt, 1, lbat, &err), KVS_ERR_INVALID, &err, "out of range");
        CHECK_EQ_INT(kvs_session_n_past(ss[0]), n0);
    }
    /* (3) trimmed sliding-window layers == untrimmed: a short extend and
     * decoding past the trimmed buffer (window 4 + slack 64 rows: the old rows
     * are dropped twice) bit-identical, then a long extend (chunks split
     * where the trimmed buffer is full: fp32 rounding apart) */
    if (bt && sp.sliding_window > 0) {
        kvs_session *u = NULL, *t = NULL;
        kvs_session_opts so4 = {250, 2, 0, ctype, 0};
        CHECK_OK(kvs_session_new(m, &so4, &u, &err), &err);
        CHECK_OK(kvs_session_new(m, &so4, &t, &err), &err);
        if (u && t) {
            CHECK_OK(prep(u, toks, 30, NULL, 0, 0, &err), &err);
            CHECK_OK(kvs_session_copy(t, u, &err), &err);
            kvs_kv_stats st;
            kvs_compress_opts co;
            memset(&co, 0, sizeof co); /* method NULL: full, trims */
            CHECK_OK(kvs_session_compress(t, &co, &st, &err), &err);
            const kvs_model_info *I = kvs_model_get_info(m);
            int64_t rb = (int64_t)I->n_kv_heads * I->head_dim * 2 * (ctype == KVS_CACHE_F32 ? 4 : 2);
            CHECK_EQ_INT(st.bytes_before_local, 5 * 30 * rb);
            CHECK_EQ_INT(st.bytes_after_local, 5 * 3 * rb);
            CHECK_EQ_INT(st.bytes_after_global, 30 * rb);
            CHECK_OK(kvs_session_extend(u, toks + 10, 20, la, &err), &err);
            CHECK_OK(kvs_session_extend(t, toks + 10, 20, lb, &err), &err);
            CHECK(!memcmp(la, lb, (size_t)V * 4));
            int same = 1, tok = argmax_f(la, V);
            kvs_session *pair[2] = {u, t};
            while (kvs_session_n_past(u) < 180) {
                int32_t tk[2] = {tok, tok};
                CHECK_OK(kvs_batch_decode(bt, pair, tk, 2, lbat, &err), &err);
                same &= !memcmp(lbat, lbat + V, (size_t)V * 4);
                tok = argmax_f(lbat, V);
            }
            CHECK_MSG(same, "%s %s: decode with trimmed local layers differs", arch, kvs_cache_type_name(ctype));
            kvs_session_kv_stats(t, &st);
            CHECK_MSG(st.tokens_after[0] <= 4 + 64, "local layer holds %lld rows", (long long)st.tokens_after[0]);
            CHECK_EQ_INT(st.tokens_after[5], 180);
            CHECK_OK(kvs_session_extend(u, toks + 30, 70, la, &err), &err);
            CHECK_OK(kvs_session_extend(t, toks + 30, 70, lb, &err), &err);
            double d = rel_diff(lb, la, V), tol = ctype == KVS_CACHE_BF16 ? 1e-3 : 1e-4;
            CHECK_MSG(d <= tol, "%s %s: long extend with trimmed local layers differs by %g", arch,
                      kvs_cache_type_name(ctype), d);
            CHECK_EQ_INT(argmax_f(la, V), argmax_f(lb, V));
        }
        kvs_session_free(u);
        kvs_session_free(t);
    }
done:
    for (int i = 0; i < NS; i++) {
        kvs_session_free(ss[i]);
        kvs_session_free(solo[i]);
    }
    kvs_batch_free(bt);
    kvs_session_free(a);
    kvs_session_free(b);
    free(la);
    free(lb);
    free(lbat);
    kvs_model_free(m);
    remove(path);
}

/* f16 / bf16 caches against f32 on the tiny gemma3 model. */
static void run_types(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("gemma3");
    const char *path = "backend_batch_types.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab, N = 40;
    int32_t toks[48];
    uint64_t rng = 5;
    for (int i = 0; i < 48; i++) toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    float *l32 = malloc((size_t)V * 4), *lx = malloc((size_t)V * 4);
    kvs_session *s32 = NULL;
    kvs_session_opts so32 = {64, 2, -1, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so32, &s32, &err), &err);
    kvs_layer *ls = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
    int map[KVS_MAX_LAYERS], nm = 0;
    if (s32 && l32 && lx && ls) {
        CHECK_OK(prep(s32, toks, N, "snapkv", 0.5, 0, &err), &err);
        for (int t = 0; t < 6; t++) CHECK_OK(kvs_session_decode(s32, toks[N + t], l32, &err), &err);
        for (int ct = KVS_CACHE_F16; ct <= KVS_CACHE_BF16; ct++) {
            kvs_session *s = NULL;
            kvs_session_opts so = {64, 2, -1, ct, 0};
            CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
            if (!s) continue;
            CHECK_OK(kvs_session_prefill(s, toks, N, NULL, NULL, &err), &err);
            kvs_cache_view cv;
            CHECK_OK(kvs_session_cache_view(s, 1, &cv, ls, map, &nm, &err), &err);
            CHECK_EQ_INT(cv.layers[0].k.dtype, ct == KVS_CACHE_F16 ? KVS_F16 : KVS_BF16);
            kvs_kv_stats st;
            kvs_session_kv_stats(s, &st);
            CHECK_EQ_INT(st.bytes_before_global, (int64_t)N * I->n_kv_heads * I->head_dim * 2 * 2);
            CHECK_OK(prep(s, toks, N, "snapkv", 0.5, 0, &err), &err);
            for (int t = 0; t < 6; t++) CHECK_OK(kvs_session_decode(s, toks[N + t], lx, &err), &err);
            double d = rel_diff(lx, l32, V);
            double tol = ct == KVS_CACHE_F16 ? 5e-3 : 3e-2;
            CHECK_MSG(d <= tol, "%s cache: logits differ from f32 by %g (tolerance %g)", kvs_cache_type_name(ct), d, tol);
            CHECK_MSG(d > 0, "%s cache: logits identical to f32 (the cache type has no effect?)", kvs_cache_type_name(ct));
            kvs_session_free(s);
        }
    }
    int t = -1;
    CHECK_OK(kvs_cache_type_parse("bf16", &t, &err), &err);
    CHECK_EQ_INT(t, KVS_CACHE_BF16);
    CHECK_FAILS(kvs_cache_type_parse("q8", &t, &err), KVS_ERR_INVALID, &err, "'q8'");
    CHECK(!strcmp(kvs_cache_type_name(KVS_CACHE_F16), "f16"));
    {
        kvs_session *bad = NULL;
        kvs_session_opts sob = {64, 1, 0, 7, 0};
        CHECK_FAILS(kvs_session_new(m, &sob, &bad, &err), KVS_ERR_INVALID, &err, "cache_type 7");
        kvs_session_free(bad);
    }
    free(ls);
    free(l32);
    free(lx);
    kvs_session_free(s32);
    kvs_model_free(m);
    remove(path);
}

int main(void) {
    for (int ct = 0; ct < 3; ct++) {
        run_arch("gemma3", ct, 0);
        run_arch("qwen2", ct, 0);
        run_arch("gemma3", ct, 64);
        run_arch("gemma3", ct, 16);
    }
    run_types();
    return kvs_test_finish("backend_batch");
}
