/*
 * test_backend_attn_stats.c -- the attention statistics the engine
 * accumulates during prefill (kvs_session_set_attn_stats) against core's own
 * passes, on tiny qwen2, llama and gemma3 models:
 *   - each global layer's attn_colsum equals kvs_attn_colsum_fused over the
 *     recorded queries within 2e-5 of the column's scale, attn_ent equals
 *     kvs_attn_stats_fused's entropies within 1e-5 relative (plain and
 *     cross-modal, with an image span), prompts chunked by ubatch or not;
 *   - h2o, lookm and meda give the same plans with the statistics as without
 *     (kvs_session_plan_many on a session that has none), and the h2o
 *     scorer's scores through core's kvs_layer_attn_stats agree as above;
 *   - they are off by default, absent for short prompts (decode kernels) and
 *     sliding-window layers, and dropped by decode, extend, compression and
 *     reset; a copy takes them along;
 *   - kvs_method_reads_attn_stats names h2o, lookm, meda and not snapkv.
 * With a registry model name as argv[1] (backend_attn_stats_model_*, labels
 * model;slow; exit 77 when it is not installed) the same on that model with
 * a 300-token prompt.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "test_util.h"
#include "tiny_model.h"

/* max |a - b| / max(1e-3, max |b|) per [H][N] column block */
static double colsum_err(const float *a, const float *b, int H, int n) {
    double worst = 0;
    for (int h = 0; h < H; h++) {
        double mx = 1e-3, d = 0;
        for (int j = 0; j < n; j++) mx = fmax(mx, fabs(b[(size_t)h * n + j]));
        for (int j = 0; j < n; j++) d = fmax(d, fabs((double)a[(size_t)h * n + j] - b[(size_t)h * n + j]));
        worst = fmax(worst, d / mx);
    }
    return worst;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(1e-12, fabs(b)); }

/* Every layer of s's view (an N-token prompt) that carries statistics
 * against core's passes; returns how many layers had them. */
static int check_view(kvs_session *s, int N, const uint8_t *modality, const char *what) {
    kvs_err err = {0};
    kvs_layer *ls = calloc(KVS_MAX_LAYERS, sizeof *ls);
    int map[KVS_MAX_LAYERS], nm = 0, have = 0;
    kvs_cache_view cv;
    if (!ls) return 0;
    CHECK_OK(kvs_session_cache_view(s, 1, &cv, ls, map, &nm, &err), &err);
    for (int i = 0; i < nm; i++) {
        const kvs_layer *L = &cv.layers[i];
        CHECK((L->attn_colsum == NULL) == (L->attn_ent == NULL));
        if (!L->attn_colsum) continue;
        have++;
        const int Hkv = L->k.n_heads;
        float *col = malloc(sizeof(float) * (size_t)Hkv * N);
        kvs_entropy_stats ent;
        uint8_t *all_text = calloc((size_t)N, 1);
        CHECK_OK(kvs_attn_colsum_fused(&L->q, &L->k, NULL, col, NULL, 1, &err), &err);
        CHECK_OK(kvs_attn_stats_fused(&L->q, &L->k, modality ? modality : all_text, NULL, NULL, NULL, &ent, 1, &err),
                 &err);
        const double ce = colsum_err(L->attn_colsum, col, Hkv, N);
        CHECK_MSG(ce < 2e-5, "%s: layer %d: colsum differs by %g", what, map[i], ce);
        CHECK_MSG(rel(L->attn_ent->plain, ent.plain) < 1e-5, "%s: layer %d: plain entropy %.9g vs %.9g", what, map[i],
                  L->attn_ent->plain, ent.plain);
        CHECK_EQ_INT(L->attn_ent->n_tv, ent.n_tv);
        CHECK_EQ_INT(L->attn_ent->n_vt, ent.n_vt);
        if (ent.n_tv) CHECK_MSG(rel(L->attn_ent->e_tv, ent.e_tv) < 1e-5, "%s: layer %d: E_TV", what, map[i]);
        if (ent.n_vt) CHECK_MSG(rel(L->attn_ent->e_vt, ent.e_vt) < 1e-5, "%s: layer %d: E_VT", what, map[i]);
        /* the scorers' entry point: given -> copied, no pass */
        float *sc = malloc(sizeof(float) * (size_t)Hkv * N);
        kvs_entropy_stats e2;
        int given = 0;
        CHECK_OK(kvs_layer_attn_stats(L, modality, sc, &e2, 1, &given, &err), &err);
        CHECK(given == 1 && memcmp(sc, L->attn_colsum, sizeof(float) * (size_t)Hkv * N) == 0);
        /* without them: computed (the same as core's pass) */
        kvs_layer bare = *L;
        bare.attn_colsum = NULL;
        bare.attn_ent = NULL;
        CHECK_OK(kvs_layer_attn_stats(&bare, modality, sc, &e2, 1, &given, &err), &err);
        CHECK(given == 0 && colsum_err(sc, col, Hkv, N) < 1e-5 && rel(e2.plain, ent.plain) < 1e-5);
        free(sc);
        free(col);
        free(all_text);
    }
    free(ls);
    return have;
}

static int same_plan(const kvs_plan *a, const kvs_plan *b) {
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads) return 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv_heads; h++) {
            int ca = 0, cb = 0;
            const int32_t *ra = kvs_plan_head(a, l, h, &ca), *rb = kvs_plan_head(b, l, h, &cb);
            if (ca != cb || memcmp(ra, rb, sizeof(int32_t) * (size_t)ca)) return 0;
        }
    return 1;
}

static void check_plans(kvs_session *with, kvs_session *without, const char *what) {
    kvs_err err = {0};
    const char *names[] = {"h2o", "lookm", "meda"};
    const kvs_budget b[2] = {{0.25, 0}, {0.5, 0}};
    for (int k = 0; k < 3; k++) {
        kvs_compress_opts co;
        memset(&co, 0, sizeof co);
        co.method = kvs_method_find(names[k]);
        CHECK(co.method && kvs_method_reads_attn_stats(co.method));
        if (!co.method) continue;
        kvs_params_defaults(co.method, &co.params);
        co.compress_local = 1;
        kvs_plan p1[2], p2[2];
        int m1[KVS_MAX_LAYERS], m2[KVS_MAX_LAYERS];
        CHECK_OK(kvs_session_plan_many(with, &co, b, 2, p1, m1, NULL, &err), &err);
        CHECK_OK(kvs_session_plan_many(without, &co, b, 2, p2, m2, NULL, &err), &err);
        for (int i = 0; i < 2; i++) {
            CHECK_MSG(same_plan(&p1[i], &p2[i]), "%s: %s budget %g: plans differ", what, names[k], b[i].ratio);
            kvs_plan_free(&p1[i]);
            kvs_plan_free(&p2[i]);
        }
    }
}

/* The checks on model m with an N-token prompt (random tokens; an image
 * span in the middle when with_image), prompt chunked by ubatch. */
static void run_model(kvs_model *m, int N, int ubatch, int with_image, const char *what) {
    kvs_err err = {0};
    const kvs_model_info *I = kvs_model_get_info(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)N);
    uint8_t *mod = malloc((size_t)N);
    if (!toks || !mod) {
        CHECK(0);
        free(toks);
        free(mod);
        return;
    }
    uint64_t rng = 11;
    for (int i = 0; i < N; i++) {
        toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)I->n_vocab);
        mod[i] = with_image && i >= N / 4 && i < N / 2 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    }
    const uint8_t *modality = with_image ? mod : NULL;
    kvs_session_opts so = {N + 8, 2, -1, KVS_CACHE_F32, 0};
    kvs_session *s = NULL, *bare = NULL, *cp = NULL;
    CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &bare, &err), &err);
    CHECK_OK(kvs_session_new(m, &so, &cp, &err), &err);
    if (!s || !bare || !cp) goto done;
    kvs_session_set_ubatch(s, ubatch);
    kvs_session_set_ubatch(bare, ubatch);
    /* off by default */
    CHECK_OK(kvs_session_prefill(bare, toks, N, modality, NULL, &err), &err);
    CHECK(!kvs_session_has_attn_stats(bare));
    CHECK_EQ_INT(check_view(bare, N, modality, what), 0);
    kvs_session_set_attn_stats(s, 1);
    CHECK_OK(kvs_session_prefill(s, toks, N, modality, NULL, &err), &err);
    CHECK(kvs_session_has_attn_stats(s));
    kvs_kv_stats ks;
    kvs_session_kv_stats(s, &ks);
    int want = 0; /* sliding-window layers (gemma3's local ones) have none */
    for (int l = 0; l < I->n_layers; l++) want += !ks.is_local[l];
    CHECK_EQ_INT(check_view(s, N, modality, what), want);
    check_plans(s, bare, what);
    /* a copy takes them along; a copy of a session without them has none */
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    CHECK(kvs_session_has_attn_stats(cp));
    CHECK_EQ_INT(check_view(cp, N, modality, what), want);
    CHECK_OK(kvs_session_copy(cp, bare, &err), &err);
    CHECK(!kvs_session_has_attn_stats(cp));
    /* compression drops them */
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = kvs_method_find("h2o");
    kvs_params_defaults(co.method, &co.params);
    co.budget.ratio = 0.5;
    CHECK_OK(kvs_session_compress(cp, &co, NULL, &err), &err);
    CHECK(!kvs_session_has_attn_stats(cp));
    /* decode and extend drop them (the view is refused then anyway) */
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    float *lg = malloc(sizeof(float) * (size_t)I->n_vocab);
    CHECK_OK(kvs_session_decode(cp, toks[0], lg, &err), &err);
    CHECK(!kvs_session_has_attn_stats(cp));
    CHECK_OK(kvs_session_copy(cp, s, &err), &err);
    CHECK_OK(kvs_session_extend(cp, toks, 3, lg, &err), &err);
    CHECK(!kvs_session_has_attn_stats(cp));
    free(lg);
    /* short prompts (decode kernels) get none; reset drops them */
    kvs_session_reset(s);
    CHECK(!kvs_session_has_attn_stats(s));
    CHECK_OK(kvs_session_prefill(s, toks, 5, NULL, NULL, &err), &err);
    CHECK(!kvs_session_has_attn_stats(s));
done:
    kvs_session_free(s);
    kvs_session_free(bare);
    kvs_session_free(cp);
    free(toks);
    free(mod);
}

static void run_arch(const char *arch, int ubatch, int with_image) {
    kvs_err err = {0};
    char what[64];
    snprintf(what, sizeof what, "%s ubatch %d%s", arch, ubatch, with_image ? " image" : "");
    tiny_spec sp = tiny_default(arch);
    char path[64];
    snprintf(path, sizeof path, "backend_attn_stats_%s.gguf", arch);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (m) run_model(m, 150, ubatch, with_image, what);
    kvs_model_free(m);
    remove(path);
}

int main(int argc, char **argv) {
    if (argc > 1) { /* a real model (registry name): a 300-token prompt, chunked and not */
        kvs_err err = {0};
        char path[1024];
        if (kvs_model_resolve(argv[1], path, sizeof path, &err) != KVS_OK) {
            printf("backend_attn_stats: SKIPPED: model %s is not installed (%s)\n", argv[1], err.msg);
            return 77;
        }
        kvs_model *m = NULL;
        kvs_model_opts mo = {2};
        CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
        if (m) {
            run_model(m, 300, 2048, 0, argv[1]);
            run_model(m, 300, 128, 1, argv[1]);
        }
        kvs_model_free(m);
        return kvs_test_finish("backend_attn_stats (model)");
    }
    CHECK(kvs_method_reads_attn_stats(kvs_method_find("h2o")));
    CHECK(kvs_method_reads_attn_stats(kvs_method_find("lookm")));
    CHECK(kvs_method_reads_attn_stats(kvs_method_find("meda")));
    CHECK(!kvs_method_reads_attn_stats(kvs_method_find("snapkv")));
    CHECK(!kvs_method_reads_attn_stats(kvs_method_find("full")));
    run_arch("qwen2", 2048, 0);
    run_arch("qwen2", 48, 1);
    run_arch("llama", 64, 0);
    run_arch("gemma3", 2048, 1);
    return kvs_test_finish("backend_attn_stats");
}
