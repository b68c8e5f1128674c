/*
 * test_backend_recon.c -- KVzip's context-reconstruction statistic the
 * engine computes after a prefill (kvs_session_set_recon,
 * kvs_layer.attn_recon_max) against a direct recomputation, on tiny qwen2,
 * llama and gemma3 models (fp32 caches):
 *   - for each chunk [c0, c1) of the prompt, a second session prefills the
 *     prompt followed by that chunk's reconstruction input
 *     (kvs_recon_chunk_tokens) recording every query; from its keys and
 *     queries, in double: each input row's softmax over the keys it sees
 *     (causal; gemma3's local layers within their window), the maximum over
 *     the rows and the query heads of each KV head's group, for the chunk's
 *     keys. The engine's statistic agrees within 2e-5 (absolute: they are
 *     probabilities), one chunk or several, prefill chunked by ubatch or not;
 *   - after the pass the cache holds the prompt again (decoding the same
 *     token gives bit-identical logits to a session without the pass);
 *   - a copy takes the statistic along; extend, decode, compression and
 *     reset drop it; the kvzip preset compresses such a session and counts
 *     the pass in compress_ms; without the pass it is refused by name, and a
 *     context too small for the pass's input fails the prefill by name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"
#include "tiny_model.h"

/* The reference maxima of chunk [c0, c1) into ref [L][Hkv][N] (keys of the
 * chunk only), from a session holding the prompt and the chunk's input
 * prefilled together with all queries recorded. */
static void ref_chunk(kvs_model *m, const int32_t *toks, int N, int c0, int c1, double *ref) {
    kvs_err err = {0};
    const kvs_model_info *I = kvs_model_get_info(m);
    const int cap = c1 - c0 + 256;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)(N + cap));
    kvs_layer *ls = calloc(KVS_MAX_LAYERS, sizeof *ls);
    int ns = 0, map[KVS_MAX_LAYERS], nm = 0;
    kvs_session *s = NULL;
    if (!all || !ls) goto done;
    memcpy(all, toks, sizeof(int32_t) * (size_t)N);
    CHECK_OK(kvs_recon_chunk_tokens(m, toks, c0, c1, all + N, cap, &ns, &err), &err);
    const int T = N + ns;
    kvs_session_opts so = {T, 2, -1, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    if (!s) goto done;
    CHECK_OK(kvs_session_prefill(s, all, T, NULL, NULL, &err), &err);
    kvs_kv_stats ks;
    kvs_session_kv_stats(s, &ks);
    kvs_cache_view cv;
    CHECK_OK(kvs_session_cache_view(s, 1, &cv, ls, map, &nm, &err), &err);
    const int D = I->head_dim, Hq = I->n_heads, Hkv = I->n_kv_heads, G = Hq / Hkv;
    double *p = malloc(sizeof(double) * (size_t)T);
    float *q = malloc(sizeof(float) * (size_t)D), *k = malloc(sizeof(float) * (size_t)T * D);
    for (int i = 0; i < nm && p && q && k; i++) {
        const kvs_layer *L = &cv.layers[i];
        const int l = map[i], window = ks.is_local[l] ? I->sliding_window : 0;
        CHECK_EQ_INT(L->q.n_tokens, T);
        for (int h = 0; h < Hq; h++) {
            const int g = h / G;
            kvs_view_rows_f32(&L->k, g, 0, T, k);
            for (int r = N; r < T; r++) { /* the input's rows */
                kvs_view_rows_f32(&L->q, h, r, 1, q);
                const int j0 = window > 0 && r - window + 1 > 0 ? r - window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int j = j0; j <= r; j++) {
                    double dot = 0;
                    for (int c = 0; c < D; c++) dot += (double)q[c] * k[(size_t)j * D + c];
                    p[j] = dot / sqrt((double)D);
                    mx = fmax(mx, p[j]);
                }
                for (int j = j0; j <= r; j++) sum += (p[j] = exp(p[j] - mx));
                for (int j = c0 > j0 ? c0 : j0; j < c1 && j <= r; j++) {
                    double *x = ref + ((size_t)l * Hkv + g) * N + j;
                    *x = fmax(*x, p[j] / sum);
                }
            }
        }
    }
    free(p);
    free(q);
    free(k);
done:
    kvs_session_free(s);
    free(all);
    free(ls);
}

/* max |engine - reference| over every layer of s's view; *n_have layers had it. */
static double view_err(kvs_session *s, const double *ref, int N, int *n_have) {
    kvs_err err = {0};
    kvs_layer *ls = calloc(KVS_MAX_LAYERS, sizeof *ls);
    int map[KVS_MAX_LAYERS], nm = 0;
    double worst = 0;
    *n_have = 0;
    kvs_cache_view cv;
    if (!ls) return 1;
    CHECK_OK(kvs_session_cache_view(s, 1, &cv, ls, map, &nm, &err), &err);
    for (int i = 0; i < nm; i++) {
        const kvs_layer *L = &cv.layers[i];
        if (!L->attn_recon_max) continue;
        (*n_have)++;
        const int Hkv = L->k.n_heads;
        for (size_t x = 0; x < (size_t)Hkv * N; x++)
            worst = fmax(worst, fabs((double)L->attn_recon_max[x] - ref[(size_t)map[i] * Hkv * N + x]));
    }
    free(ls);
    return worst;
}

static void run_model(kvs_model *m, int N, int chunk, int ubatch, const char *what) {
    kvs_err err = {0};
    const kvs_model_info *I = kvs_model_get_info(m);
    const int L = I->n_layers, Hkv = I->n_kv_heads;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)N);
    double *ref = calloc((size_t)L * Hkv * N, sizeof *ref);
    float *lg = malloc(sizeof(float) * (size_t)I->n_vocab), *lg2 = malloc(sizeof(float) * (size_t)I->n_vocab);
    kvs_session *s = NULL, *bare = NULL, *cp = NULL;
    if (!toks || !ref || !lg || !lg2) goto done;
    uint64_t rng = 29;
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(4 + kvs_rng_next(&rng) % (uint64_t)(I->n_vocab - 4));
    for (int c0 = 0; c0 < N; c0 += chunk) ref_chunk(m, toks, N, c0, c0 + chunk < N ? c0 + chunk : N, ref);
    kvs_session_opts so = {2 * N + 64, 2, 0, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &bare, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &cp, &err), &err);
    if (!s || !bare || !cp) goto done;
    kvs_session_set_ubatch(s, ubatch);
    kvs_session_set_ubatch(bare, ubatch);
    /* off by default */
    CHECK_OK(kvs_session_prefill(bare, toks, N, NULL, lg2, &err), &err);
    CHECK(!kvs_session_has_recon(bare) && kvs_session_recon_ms(bare) == 0.0);
    kvs_session_set_recon(s, chunk);
    CHECK_OK(kvs_session_prefill(s, toks, N, NULL, lg, &err), &err);
    CHECK(kvs_session_has_recon(s) && kvs_session_recon_ms(s) > 0.0);
    CHECK_EQ_INT(kvs_session_n_past(s), N);
    CHECK_MSG(memcmp(lg, lg2, sizeof(float) * (size_t)I->n_vocab) == 0, "%s: prefill logits changed", what);
    int have = 0;
    const double e = view_err(s, ref, N, &have);
    CHECK_EQ_INT(have, L); /* every layer, global or local */
    CHECK_MSG(e < 2e-5, "%s: attn_recon_max differs from the recomputation by %g", what, e);
    /* the maxima are probabilities; in a global layer every key got one (it sees its chunk's rows), in a
     * local one (gemma3's window of 4) only the last keys, which the instruction's first rows still see
     * (the rows repeating a key are further than the window) */
    kvs_kv_stats ks;
    kvs_session_kv_stats(s, &ks);
    int pos = 1;
    for (size_t x = 0; x < (size_t)L * Hkv * N; x++)
        pos &= ks.is_local[x / ((size_t)Hkv * N)] && (int)(x % (size_t)N) < N - I->sliding_window
                   ? ref[x] == 0
                   : ref[x] >= 0 && ref[x] <= 1 && (ks.is_local[x / ((size_t)Hkv * N)] || ref[x] > 0);
    CHECK_MSG(pos, "%s: a reference maximum outside (0, 1] (global layers) or not 0 (local ones)", what);
    /* the cache holds the prompt again: decoding gives what it gives without the pass */
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    CHECK(kvs_session_has_recon(cp) && view_err(cp, ref, N, &have) == e);
    CHECK_OK(kvs_session_decode(cp, toks[3], lg, &err), &err);
    CHECK_OK(kvs_session_decode(bare, toks[3], lg2, &err), &err);
    CHECK_MSG(memcmp(lg, lg2, sizeof(float) * (size_t)I->n_vocab) == 0, "%s: the pass left rows behind", what);
    CHECK(!kvs_session_has_recon(cp)); /* decode drops it */
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    CHECK_OK(kvs_session_extend(cp, toks, 3, lg, &err), &err);
    CHECK(!kvs_session_has_recon(cp));
    /* kvzip compresses it (the pass counted in compress_ms); compression drops the statistic */
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = kvs_method_find("kvzip");
    CHECK(co.method && (co.method->needs & KVS_NEED_RECON));
    if (!co.method) goto done;
    kvs_params_defaults(co.method, &co.params);
    co.budget.ratio = 0.3;
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    kvs_kv_stats st;
    CHECK_OK(kvs_session_compress(cp, &co, &st, &err), &err);
    CHECK(st.compress_ms >= kvs_session_recon_ms(s));
    CHECK(!kvs_session_has_recon(cp));
    CHECK_OK(kvs_session_decode(cp, toks[1], lg, &err), &err);
    /* a session without the pass: refused by name */
    kvs_session_reset(bare);
    CHECK_OK(kvs_session_prefill(bare, toks, N, NULL, NULL, &err), &err);
    CHECK_FAILS(kvs_session_compress(bare, &co, NULL, &err), KVS_ERR_INVALID, &err,
                "kvzip needs the context-reconstruction pass");
    /* reset drops it */
    kvs_session_reset(s);
    CHECK(!kvs_session_has_recon(s));
done:
    kvs_session_free(s);
    kvs_session_free(bare);
    kvs_session_free(cp);
    free(toks);
    free(ref);
    free(lg);
    free(lg2);
}

static void run_arch(const char *arch, int N, int chunk, int ubatch) {
    kvs_err err = {0};
    char what[96];
    snprintf(what, sizeof what, "%s N %d chunk %d ubatch %d", arch, N, chunk, ubatch);
    tiny_spec sp = tiny_default(arch);
    char path[64];
    snprintf(path, sizeof path, "backend_recon_%s.gguf", arch);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (m) run_model(m, N, chunk, ubatch, what);
    kvs_model_free(m);
    remove(path);
}

/* A context with no room for the pass's input fails the prefill by name. */
static void test_no_room(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2");
    CHECK_OK(tiny_write(&sp, "backend_recon_room.gguf", &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load("backend_recon_room.gguf", &mo, &m, &err), &err);
    kvs_session *s = NULL;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = 10 + i;
    kvs_session_opts so = {42, 2, 0, 0, 0};
    if (m) CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    if (s) {
        kvs_session_set_recon(s, -1);
        CHECK_FAILS(kvs_session_prefill(s, toks, 40, NULL, NULL, &err), KVS_ERR_INVALID, &err,
                    "reconstruction pass (KVzip)");
        CHECK(!kvs_session_has_recon(s) && kvs_session_n_past(s) == 0);
    }
    kvs_session_free(s);
    kvs_model_free(m);
    remove("backend_recon_room.gguf");
}

int main(void) {
    run_arch("qwen2", 90, 2048, 2048); /* one chunk */
    run_arch("qwen2", 90, 40, 24);     /* three chunks, each input chunked by ubatch */
    run_arch("llama", 70, 32, 2048);
    run_arch("gemma3", 80, 2048, 2048); /* local layers within their window too */
    run_arch("gemma3", 80, 30, 16);
    test_no_room();
    return kvs_test_finish("backend_recon");
}
