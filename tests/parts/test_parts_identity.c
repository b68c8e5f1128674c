/*
 * test_parts_identity.c -- snapkv_parts, h2o_parts and streamingllm_parts
 * give plans BIT-IDENTICAL to the monolithic snapkv, h2o and streamingllm:
 * every index of every (layer, head), on the random caches of tests/methods1
 * (m1_util.h: several shapes, GQA groups 1..4, N from 1 to 300) and on
 * formats' synthetic caches (the "tiny" preset and a wider custom shape),
 * at budgets 1, 2, w - 1, w, w + 1, N/4, N/2, N - 1, N and random ones,
 * with parameters swept (window, kernel, pool; normalize, recent_frac;
 * sinks) and 1 or 3 threads, all through kvs_compress.
 */
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "m1_util.h"

static int n_compared = 0;

static void compare(const kvs_method *a, const kvs_method *b, const kvs_params *pa,
                    const kvs_params *pb, const kvs_cache_view *c, int N, int B, int threads,
                    const char *what) {
    kvs_err ea = {0}, eb = {0};
    kvs_plan x, y;
    kvs_budget bud = {0, B};
    kvs_status ra = kvs_compress(a, pa, c, &bud, threads, &x, &ea);
    kvs_status rb = kvs_compress(b, pb, c, &bud, threads, &y, &eb);
    CHECK_MSG(ra == rb, "%s %s vs %s N=%d B=%d: status %d (%s) vs %d (%s)", what, a->name, b->name,
              N, B, ra, ea.msg, rb, eb.msg);
    if (!ra && !rb) {
        int same = m1_plans_equal(&x, &y);
        CHECK_MSG(same, "%s %s vs %s N=%d B=%d threads=%d: plans differ", what, a->name, b->name, N,
                  B, threads);
        n_compared++;
    }
    if (!ra) kvs_plan_free(&x);
    if (!rb) kvs_plan_free(&y);
}

static void set2(const kvs_method *a, kvs_params *pa, const kvs_method *b, kvs_params *pb,
                 const char *name, const char *value) {
    m1_set(a, pa, name, value);
    m1_set(b, pb, name, value);
}

static void budgets_for(int N, int w, uint64_t *rng, int *out, int *n) {
    int cand[12] = {1, 2, w - 1, w, w + 1, N / 4, N / 2, N - 1, N,
                    1 + (int)(kvs_rng_uniform(rng) * N), 1 + (int)(kvs_rng_uniform(rng) * N), 3};
    *n = 0;
    for (int i = 0; i < 12; i++)
        if (cand[i] >= 1 && cand[i] <= N) out[(*n)++] = cand[i];
}

/* All three pairs on one cache view. */
static void all_pairs(const kvs_cache_view *c, int N, int Nq, uint64_t *rng, const char *what) {
    char buf[32];
    int bs[12], nb;
    /* snapkv */
    if (Nq > 0) {
        const int windows[3] = {1, 8, 32};
        for (int wi = 0; wi < 3; wi++) {
            const int w = windows[wi];
            if (w > Nq && w < N) continue; /* snapkv would refuse; tested elsewhere */
            kvs_params pa, pb;
            kvs_params_defaults(&kvs_method_snapkv, &pa);
            kvs_params_defaults(&kvs_preset_snapkv_parts, &pb);
            snprintf(buf, sizeof buf, "%d", w);
            set2(&kvs_method_snapkv, &pa, &kvs_preset_snapkv_parts, &pb, "window", buf);
            snprintf(buf, sizeof buf, "%d", 1 + 2 * wi);
            set2(&kvs_method_snapkv, &pa, &kvs_preset_snapkv_parts, &pb, "kernel", buf);
            set2(&kvs_method_snapkv, &pa, &kvs_preset_snapkv_parts, &pb, "pool",
                 wi == 1 ? "avg" : "max");
            budgets_for(N, w, rng, bs, &nb);
            for (int i = 0; i < nb; i++)
                compare(&kvs_method_snapkv, &kvs_preset_snapkv_parts, &pa, &pb, c, N, bs[i],
                        1 + 2 * (i & 1), what);
        }
    }
    /* h2o (needs all N queries) */
    if (Nq == N) {
        const char *fr[3] = {"0.5", "0.25", "0"};
        for (int v = 0; v < 3; v++) {
            kvs_params pa, pb;
            kvs_params_defaults(&kvs_method_h2o, &pa);
            kvs_params_defaults(&kvs_preset_h2o_parts, &pb);
            set2(&kvs_method_h2o, &pa, &kvs_preset_h2o_parts, &pb, "recent_frac", fr[v]);
            set2(&kvs_method_h2o, &pa, &kvs_preset_h2o_parts, &pb, "normalize",
                 v == 1 ? "true" : "false");
            budgets_for(N, 4, rng, bs, &nb);
            for (int i = 0; i < nb; i++)
                compare(&kvs_method_h2o, &kvs_preset_h2o_parts, &pa, &pb, c, N, bs[i],
                        1 + 2 * (i & 1), what);
        }
    }
    /* streamingllm */
    const int sinks[3] = {0, 4, 7};
    for (int v = 0; v < 3; v++) {
        kvs_params pa, pb;
        kvs_params_defaults(&kvs_method_streamingllm, &pa);
        kvs_params_defaults(&kvs_preset_streamingllm_parts, &pb);
        snprintf(buf, sizeof buf, "%d", sinks[v]);
        set2(&kvs_method_streamingllm, &pa, &kvs_preset_streamingllm_parts, &pb, "sinks", buf);
        budgets_for(N, sinks[v], rng, bs, &nb);
        for (int i = 0; i < nb; i++)
            compare(&kvs_method_streamingllm, &kvs_preset_streamingllm_parts, &pa, &pb, c, N,
                    bs[i], 1, what);
    }
}

int main(void) {
    uint64_t rng = 12345;
    /* tests/methods1's random caches: (L, Hkv, Hq, N, d), all queries. */
    const int shapes[][5] = {{1, 1, 1, 1, 4}, {2, 1, 1, 5, 4},   {2, 2, 4, 33, 8},
                             {3, 2, 8, 64, 16}, {2, 1, 3, 100, 8}, {2, 4, 8, 300, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        m1_cache c;
        const int *sh = shapes[s];
        m1_cache_init(&c, sh[0], sh[1], sh[2], sh[3], sh[3], sh[4]);
        m1_cache_fill_random(&c, 100 + s);
        all_pairs(&c.view, c.N, c.Nq, &rng, "m1");
        m1_cache_free(&c);
    }
    /* A window-only query record (the last 40 positions): snapkv and
     * streamingllm only. */
    {
        m1_cache c;
        m1_cache_init(&c, 2, 2, 4, 120, 40, 16);
        m1_cache_fill_random(&c, 7);
        all_pairs(&c.view, c.N, c.Nq, &rng, "m1-window");
        m1_cache_free(&c);
    }
    /* formats' synthetic caches (sinks, outliers, RoPE). */
    const char *presets[2] = {"tiny", NULL};
    for (int v = 0; v < 2; v++) {
        kvs_err e = {0};
        kvs_synth_config cfg;
        if (presets[v]) {
            CHECK_OK(kvs_synth_preset(presets[v], &cfg, &e), &e);
        } else {
            kvs_synth_defaults(&cfg);
            cfg.n_layers = 3, cfg.n_q_heads = 8, cfg.n_kv_heads = 2, cfg.head_dim = 32;
        }
        cfg.n_tokens = v ? 257 : 160;
        cfg.n_queries = cfg.n_tokens;
        cfg.seed = 42 + (uint64_t)v;
        kvs_dense_cache dc;
        memset(&dc, 0, sizeof dc);
        CHECK_OK(kvs_synth_generate(&cfg, &dc, NULL, NULL, &e), &e);
        if (!dc.layers) continue;
        kvs_layer *ls = calloc((size_t)dc.n_layers, sizeof *ls);
        kvs_cache_view view;
        CHECK_OK(kvs_dense_cache_view(&dc, &view, ls, &e), &e);
        all_pairs(&view, cfg.n_tokens, cfg.n_queries, &rng, presets[v] ? "synth-tiny" : "synth");
        free(ls);
        kvs_dense_cache_free(&dc);
    }
    printf("test_parts_identity: %d plan pairs compared, %d checks, %d failures\n", n_compared,
           kvs_test_checks, kvs_test_failures);
    CHECK(n_compared > 200);
    return kvs_test_failures ? 1 : 0;
}
