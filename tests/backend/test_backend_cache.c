/*
 * test_backend_cache.c -- the ragged KV cache and its compression hooks on a
 * tiny gemma3 model (5 sliding-window layers + 1 global layer, window 4):
 * cache views (global only / all layers, recorded queries), plans applied per
 * layer and per KV head with original positions kept, decode after
 * compression against the float64 reference with the same keys masked, bytes
 * really freed, session copies (one prefill, many compressions), every method
 * of the registry end to end, and the error paths.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"
#include "tiny_model.h"

static double max_rel(const float *a, const double *ref, int n) {
    double mx = 1, d = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (int i = 0; i < n; i++) d = fmax(d, fabs(a[i] - ref[i]));
    return d / mx;
}

int main(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("gemma3");
    const char *path = "backend_cache_tiny.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return kvs_test_finish("backend_cache");
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab, L = I->n_layers, Hkv = I->n_kv_heads, D = I->head_dim, N = 24;
    int32_t toks[25];
    uint64_t rng = 7;
    for (int i = 0; i < 25; i++) toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    float *lg = malloc((size_t)V * 4), *lg2 = malloc((size_t)V * 4);
    double *ref = malloc((size_t)V * 8);
    uint8_t *keep = calloc((size_t)L * Hkv * 25, 1);
    kvs_session *s = NULL, *w = NULL;
    kvs_layer *ls = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
    int map[KVS_MAX_LAYERS], nm = 0;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_session_opts so = {32, 2, -1, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &w, &err), &err);
    if (!s || !w || !lg || !lg2 || !ref || !keep || !ls) goto done;
    CHECK_OK(kvs_session_prefill(s, toks, N, NULL, NULL, &err), &err);

    /* views */
    kvs_cache_view cv;
    CHECK_OK(kvs_session_cache_view(s, 0, &cv, ls, map, &nm, &err), &err);
    CHECK_EQ_INT(nm, 1);
    CHECK_EQ_INT(map[0], 5);
    CHECK_EQ_INT(cv.layers[0].k.n_tokens, N);
    CHECK_EQ_INT(cv.layers[0].q.n_tokens, N); /* record_queries = -1: all */
    CHECK_EQ_INT(cv.layers[0].q.n_heads, I->n_heads);
    CHECK_OK(kvs_session_cache_view(s, 1, &cv, ls, map, &nm, &err), &err);
    CHECK_EQ_INT(nm, L);
    kvs_shape shape;
    CHECK_OK(kvs_cache_validate(&cv, &shape, &err), &err);
    kvs_kv_stats st0;
    kvs_session_kv_stats(s, &st0);
    CHECK_EQ_INT(st0.bytes_before_global, (int64_t)N * Hkv * D * 2 * 4);
    CHECK_EQ_INT(st0.bytes_before_local, 5 * (int64_t)N * Hkv * D * 2 * 4);

    /* a hand-made plan on the global layer: head 0 keeps {0, 3, 10, 23}, head 1 keeps {1, 2, 20, 22} */
    int budget = 4;
    CHECK_OK(kvs_plan_init(&plan, "hand", 1, Hkv, N, &budget, &err), &err);
    int32_t idx[2][4] = {{0, 3, 10, 23}, {1, 2, 20, 22}};
    for (int h = 0; h < Hkv; h++) memcpy(plan.layers[0].idx + h * 4, idx[h], sizeof idx[h]);
    CHECK_OK(kvs_session_copy(w, s, &err), &err);
    kvs_kv_stats st;
    int gmap[1] = {5};
    CHECK_OK(kvs_session_apply_plan(w, &plan, gmap, &st, &err), &err);
    CHECK_EQ_INT(st.tokens_before[5], N);
    CHECK_EQ_INT(st.tokens_after[5], 4);
    CHECK_EQ_INT(st.tokens_after[0], N);
    CHECK_EQ_INT(st.bytes_after_global, 4LL * Hkv * D * 2 * 4);
    CHECK_EQ_INT(st.bytes_after_local, st.bytes_before_local);
    CHECK(st.compressed[5] && !st.compressed[0]);
    /* decode the next token: reference with the same keys masked on layer 5 */
    CHECK_OK(kvs_session_decode(w, toks[N], lg, &err), &err);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < N + 1; j++) keep[((size_t)l * Hkv + h) * (N + 1) + j] = 1;
    for (int h = 0; h < Hkv; h++) {
        uint8_t *k = keep + ((size_t)5 * Hkv + h) * (N + 1);
        memset(k, 0, N);
        for (int i = 0; i < 4; i++) k[idx[h][i]] = 1;
    }
    CHECK_OK(ref_forward(m, toks, N + 1, keep, ref, &err), &err);
    double e = max_rel(lg, ref, V);
    CHECK_MSG(e <= 2e-3, "compressed decode differs from the masked reference by %g", e);
    /* the unmasked reference must differ (the test can fail) */
    double *ref_full = malloc((size_t)V * 8);
    if (ref_full) {
        CHECK_OK(ref_forward(m, toks, N + 1, NULL, ref_full, &err), &err);
        CHECK(max_rel(lg, ref_full, V) > 1e-2);
        free(ref_full);
    }
    /* a ragged plan on the global layer (per-head counts 6 and 2, mean 4):
     * each head stores and attends to only its own rows; the decode equals
     * the reference with the same keys masked per head */
    {
        const int counts[2] = {6, 2};
        const int32_t ridx[2][6] = {{0, 3, 5, 7, 10, 23}, {1, 20}};
        kvs_plan rp;
        CHECK_OK(kvs_plan_init_ragged(&rp, "ragged", 1, Hkv, N, counts, &err), &err);
        for (int h = 0; h < Hkv; h++) {
            int B;
            int32_t *row = kvs_plan_head(&rp, 0, h, &B);
            memcpy(row, ridx[h], sizeof(int32_t) * (size_t)B);
        }
        kvs_session *r = NULL;
        CHECK_OK(kvs_session_new(m, &so, &r, &err), &err);
        CHECK_OK(kvs_session_copy(r, s, &err), &err);
        CHECK_OK(kvs_session_apply_plan(r, &rp, gmap, &st, &err), &err);
        CHECK_EQ_INT(st.bytes_after_global, 8LL * D * 2 * 4); /* 6 + 2 rows, not 2 x 6 */
        CHECK_OK(kvs_session_decode(r, toks[N], lg, &err), &err);
        for (int h = 0; h < Hkv; h++) {
            uint8_t *k = keep + ((size_t)5 * Hkv + h) * (N + 1);
            memset(k, 0, N);
            for (int i = 0; i < counts[h]; i++) k[ridx[h][i]] = 1;
        }
        CHECK_OK(ref_forward(m, toks, N + 1, keep, ref, &err), &err);
        double er = max_rel(lg, ref, V);
        CHECK_MSG(er <= 2e-3, "ragged decode differs from the per-head masked reference by %g", er);
        /* padding the short head to 6 rows would change it: head 1 seeing head 0's set differs */
        for (int i = 0; i < 6; i++) keep[((size_t)5 * Hkv + 1) * (N + 1) + ridx[0][i]] = 1;
        CHECK_OK(ref_forward(m, toks, N + 1, keep, ref, &err), &err);
        CHECK_MSG(max_rel(lg, ref, V) > 1e-3, "the ragged decode does not depend on head 1's own rows");
        /* a copy keeps the ragged heads: the copy decodes the same next token */
        kvs_session *r2 = NULL;
        CHECK_OK(kvs_session_new(m, &so, &r2, &err), &err);
        CHECK_OK(kvs_session_copy(r2, r, &err), &err);
        float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
        CHECK_OK(kvs_session_decode(r, toks[3], la, &err), &err);
        CHECK_OK(kvs_session_decode(r2, toks[3], lb, &err), &err);
        CHECK(la && lb && memcmp(la, lb, sizeof(float) * (size_t)V) == 0);
        free(la);
        free(lb);
        kvs_session_free(r2);
        kvs_session_free(r);
        kvs_plan_free(&rp);
        for (int h = 0; h < Hkv; h++) { /* restore the dense plan's mask */
            uint8_t *k = keep + ((size_t)5 * Hkv + h) * (N + 1);
            memset(k, 0, N);
            for (int i = 0; i < 4; i++) k[idx[h][i]] = 1;
        }
    }
    /* errors on a compressed session */
    CHECK_FAILS(kvs_session_apply_plan(w, &plan, gmap, NULL, &err), KVS_ERR_INVALID, &err, "layer 5");
    CHECK_FAILS(kvs_session_cache_view(w, 0, &cv, ls, map, &nm, &err), KVS_ERR_INVALID, &err, "layer 5");
    int badmap[1] = {99};
    CHECK_FAILS(kvs_session_apply_plan(s, &plan, badmap, NULL, &err), KVS_ERR_INVALID, &err, "model layer 99");
    kvs_plan_free(&plan);

    /* every registered method end to end on a copy of the same prefill */
    for (int i = 0; i < kvs_methods_count(); i++) {
        const kvs_method *meth = kvs_method_at(i);
        kvs_compress_opts co;
        memset(&co, 0, sizeof co);
        co.method = meth;
        kvs_params_defaults(meth, &co.params);
        co.budget.ratio = 0.5;
        co.compress_local = i % 2; /* alternate: global only / all layers */
        CHECK_OK(kvs_session_copy(w, s, &err), &err);
        kvs_err_clear(&err);
        kvs_status rc = kvs_session_compress(w, &co, &st, &err);
        if (meth->needs & KVS_NEED_RECON) {
            /* kvzip: this prefill ran no reconstruction pass (backend_recon compresses one that did) */
            CHECK_MSG(rc == KVS_ERR_INVALID && strstr(err.msg, "needs the context-reconstruction pass") &&
                          strstr(err.msg, meth->name),
                      "method %s without the pass: %s", meth->name, err.msg);
            continue;
        }
        if (rc == KVS_ERR_UNSUPPORTED && strstr(err.msg, "ragged")) {
            /* head-adaptive methods (adakv, criticaladakv) with compress_local:
             * ragged counts on a sliding-window layer are refused by name, never padded */
            CHECK(strstr(meth->name, "ada") && co.compress_local && strstr(err.msg, "sliding-window"));
            continue;
        }
        CHECK_MSG(rc == KVS_OK, "method %s: %s", meth->name, err.msg);
        if (rc) continue;
        CHECK(st.compress_ms >= 0);
        int full = !strcmp(meth->name, "full");
        /* after the plan, sliding-window layers keep only the rows decoding can
         * still see (window 4: positions N-3 .. N-1), whatever the method */
        for (int l = 0; l < L; l++) {
            CHECK_EQ_INT(st.tokens_before[l], N);
            if (l != 5) CHECK_MSG(st.tokens_after[l] <= 3, "method %s: local layer %d holds %lld rows", meth->name, l,
                                  (long long)st.tokens_after[l]);
        }
        if (!co.compress_local) {
            CHECK_EQ_INT(st.tokens_after[0], 3);
            CHECK_EQ_INT(st.tokens_after[5], full ? N : N / 2);
            CHECK_EQ_INT(st.bytes_after_local, 5LL * 3 * Hkv * D * 2 * 4);
        }
        if (!full) CHECK(st.bytes_after_total < st.bytes_before_total);
        CHECK_OK(kvs_session_decode(w, toks[N], lg2, &err), &err);
        int finite = 1;
        for (int v = 0; v < V; v++) finite &= isfinite(lg2[v]) != 0;
        CHECK_MSG(finite, "method %s: non-finite logits after compression", meth->name);
    }
    /* one prefill, two compressions: the copy equals a fresh prefill */
    {
        const kvs_method *sl = kvs_method_find("streamingllm");
        CHECK(sl != NULL);
        if (sl) {
            kvs_compress_opts co;
            memset(&co, 0, sizeof co);
            co.method = sl;
            kvs_params_defaults(sl, &co.params);
            co.budget.tokens = 6;
            CHECK_OK(kvs_session_copy(w, s, &err), &err);
            CHECK_OK(kvs_session_compress(w, &co, &st, &err), &err);
            CHECK_OK(kvs_session_decode(w, toks[N], lg, &err), &err);
            kvs_session_reset(w);
            CHECK_OK(kvs_session_prefill(w, toks, N, NULL, NULL, &err), &err);
            CHECK_OK(kvs_session_compress(w, &co, &st, &err), &err);
            CHECK_OK(kvs_session_decode(w, toks[N], lg2, &err), &err);
            CHECK(!memcmp(lg, lg2, (size_t)V * 4));
            /* streamingllm keeps sinks 0..3 and the last 2: the masked reference agrees */
            for (int h = 0; h < Hkv; h++) {
                uint8_t *k = keep + ((size_t)5 * Hkv + h) * (N + 1);
                memset(k, 0, N);
                for (int j = 0; j < 4; j++) k[j] = 1;
                k[N - 2] = k[N - 1] = 1;
            }
            CHECK_OK(ref_forward(m, toks, N + 1, keep, ref, &err), &err);
            e = max_rel(lg, ref, V);
            CHECK_MSG(e <= 2e-3, "streamingllm decode differs from the masked reference by %g", e);
            /* decode until the context is full, then a clean error */
            while (kvs_session_n_past(w) < kvs_session_n_ctx(w)) CHECK_OK(kvs_session_decode(w, 5, lg, &err), &err);
            CHECK_FAILS(kvs_session_decode(w, 5, lg, &err), KVS_ERR_INVALID, &err, "context is full");
        }
    }
    /* a method that needs queries fails clearly when none were recorded */
    {
        const kvs_method *snap = kvs_method_find("snapkv");
        kvs_session *nq = NULL;
        kvs_session_opts so0 = {32, 1, 0, KVS_CACHE_F32, 0};
        CHECK_OK(kvs_session_new(m, &so0, &nq, &err), &err);
        if (snap && nq) {
            kvs_compress_opts co;
            memset(&co, 0, sizeof co);
            co.method = snap;
            kvs_params_defaults(snap, &co.params);
            co.budget.ratio = 0.5;
            CHECK_OK(kvs_session_prefill(nq, toks, N, NULL, NULL, &err), &err);
            CHECK(kvs_method_queries_needed(snap, &co.params, N) > 0);
            CHECK_FAILS(kvs_session_compress(nq, &co, &st, &err), KVS_ERR_INVALID, &err, "record_queries");
        }
        kvs_session_free(nq);
    }
    /* queries recorded by a short prompt (decode kernels) match those of a longer,
     * batched prompt at the same positions (causal: later tokens do not matter) */
    {
        kvs_session *a = NULL, *b = NULL;
        kvs_session_opts soq = {32, 2, -1, KVS_CACHE_F32, 0};
        CHECK_OK(kvs_session_new(m, &soq, &a, &err), &err);
        CHECK_OK(kvs_session_new(m, &soq, &b, &err), &err);
        kvs_layer *lb = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
        int mb[KVS_MAX_LAYERS], nb = 0;
        kvs_cache_view cb;
        if (a && b && lb) {
            CHECK_OK(kvs_session_prefill(a, toks, 6, NULL, NULL, &err), &err);  /* short path */
            CHECK_OK(kvs_session_prefill(b, toks, 12, NULL, NULL, &err), &err); /* batched */
            CHECK_OK(kvs_session_cache_view(a, 1, &cv, ls, map, &nm, &err), &err);
            CHECK_OK(kvs_session_cache_view(b, 1, &cb, lb, mb, &nb, &err), &err);
            double d = 0, mx = 0;
            for (int l = 0; l < nm && l < nb; l++) {
                CHECK_EQ_INT(cv.layers[l].q.n_tokens, 6);
                const float *qa = cv.layers[l].q.data, *qb = cb.layers[l].q.data;
                for (int h = 0; h < I->n_heads; h++)
                    for (int i = 0; i < 6; i++)
                        for (int c = 0; c < D; c++) {
                            float x = qa[((size_t)h * 6 + i) * D + c], y = qb[((size_t)h * 12 + i) * D + c];
                            d = fmax(d, fabs(x - y));
                            mx = fmax(mx, fabs(y));
                        }
            }
            CHECK_MSG(d <= 5e-2 * mx, "short-path queries differ from batched ones by %g (max %g)", d, mx);
        }
        free(lb);
        kvs_session_free(a);
        kvs_session_free(b);
    }
    /* copy into a session with a smaller context is refused */
    {
        kvs_session *small = NULL;
        kvs_session_opts so2 = {8, 1, 0, KVS_CACHE_F32, 0};
        CHECK_OK(kvs_session_new(m, &so2, &small, &err), &err);
        if (small) CHECK_FAILS(kvs_session_copy(small, s, &err), KVS_ERR_INVALID, &err, "destination context 8");
        kvs_session_free(small);
    }
done:
    kvs_plan_free(&plan);
    free(ls);
    free(lg);
    free(lg2);
    free(ref);
    free(keep);
    kvs_session_free(s);
    kvs_session_free(w);
    kvs_model_free(m);
    remove(path);
    return kvs_test_finish("backend_cache");
}
