/*
 * test_parts_props.c -- properties of the parts and presets of methods/parts/:
 *   - every preset runs with its defaults on random caches of several shapes
 *     and budgets through kvs_compress (which checks: kept count exact per
 *     head, sorted, unique, in range, exact global sum), twice (same plan)
 *     and on 1 vs 3 threads (same plan); B = N keeps everything;
 *   - a preset declares the needs of its scorer and pick rule;
 *   - sinks and window tokens are always kept (custom composition: random
 *     scorer + sinks + window, and the presets that use them);
 *   - chunk keeps whole chunks: per head at most one chunk of [p, N - q) is
 *     kept partially (custom composition and the chunkkv preset);
 *   - the pyramid schedule sums exactly to L * B, is non-increasing from
 *     bottom to top, stays in [1, N], and is what pyramidkv's plans use;
 *   - a CUDA view is refused with KVS_ERR_UNSUPPORTED naming the method and
 *     "not implemented on GPU"; out-of-range parameters are refused.
 */
#include "kvs_parts.h"
#include "m1_util.h"

static int irand(uint64_t *rng, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(kvs_rng_uniform(rng) * (double)(hi - lo + 1));
}

/* A test composition: random scores + sinks + window + chunk or topk. */
static const kvs_param_def test_params[] = {
    KVS_PARTS_P_SEED(0),
    KVS_PARTS_P_SINKS(3),
    KVS_PARTS_P_WINDOW(5, 0, "recent tokens always kept"),
    KVS_PARTS_P_RECENT_FRAC(0),
    KVS_PARTS_P_CHUNK(4),
};
static const kvs_composition comp_chunk = {.scorer = &kvs_scorer_random,
                                           .allocator = &kvs_alloc_uniform,
                                           .keep = {&kvs_keep_sinks, &kvs_keep_window},
                                           .pick = &kvs_pick_chunk};
static const kvs_composition comp_topk = {.scorer = &kvs_scorer_random,
                                          .allocator = &kvs_alloc_pyramid,
                                          .keep = {&kvs_keep_window, &kvs_keep_sinks},
                                          .pick = &kvs_pick_topk};
extern const kvs_method m_chunk, m_topk;
static kvs_status c_chunk(const kvs_params *p, const kvs_shape *s, void **st, kvs_err *e) {
    return kvs_compose_create(&comp_chunk, &m_chunk, p, s, st, e);
}
static kvs_status c_topk(const kvs_params *p, const kvs_shape *s, void **st, kvs_err *e) {
    return kvs_compose_create(&comp_topk, &m_topk, p, s, st, e);
}
const kvs_method m_chunk = {.name = "t_chunk", .params = test_params, .n_params = 5,
                            .create = c_chunk, .observe = kvs_compose_observe,
                            .select = kvs_compose_select, .destroy = kvs_compose_destroy};
const kvs_method m_topk = {.name = "t_pyramid", .params = test_params, .n_params = 4,
                           .create = c_topk, .observe = kvs_compose_observe,
                           .select = kvs_compose_select, .destroy = kvs_compose_destroy};

static int run(const kvs_method *m, const kvs_params *p, m1_cache *c, int B, int threads,
               kvs_plan *out) {
    kvs_err e = {0};
    kvs_budget b = {0, B};
    kvs_status rc = kvs_compress(m, p, &c->view, &b, threads, out, &e);
    CHECK_MSG(rc == KVS_OK, "%s N=%d B=%d: %s", m->name, c->N, B, e.msg);
    if (rc) return 0;
    CHECK_EQ_INT(kvs_plan_total(out), (int64_t)c->L * B);
    return 1;
}

/* Protected prefix p / suffix q of a layer budget B (as compose.c). */
static void pq(int N, int B, int sinks, int window, int sinks_first, int *p, int *q) {
    *p = *q = 0;
    if (B >= N) return;
    if (sinks_first) {
        *p = sinks < B ? sinks : B;
        *q = window < B - *p ? window : B - *p;
    } else {
        *q = window < B ? window : B;
        *p = sinks < B - *q ? sinks : B - *q;
    }
}

static void check_protected_frac(const kvs_plan *pl, int N, int sinks, int window0, double frac,
                                 int sinks_first, const char *what) {
    for (int l = 0; l < pl->n_layers; l++) {
        const int B = pl->layers[l].budget;
        const int window = (int)fmax(window0, floor(B * frac));
        int p, q;
        pq(N, B, sinks, window, sinks_first, &p, &q);
        for (int h = 0; h < pl->n_kv_heads; h++) {
            int ok = 1;
            for (int t = 0; t < p; t++) ok &= m1_kept(pl, l, h, t);
            for (int t = N - q; t < N; t++) ok &= m1_kept(pl, l, h, t);
            CHECK_MSG(ok, "%s N=%d B=%d sinks=%d window=%d: a protected token is missing", what, N,
                      B, sinks, window);
        }
    }
}

static void check_protected(const kvs_plan *pl, int N, int sinks, int window, int sinks_first,
                            const char *what) {
    check_protected_frac(pl, N, sinks, window, 0.0, sinks_first, what);
}

/* At most one chunk of [p, N - q) kept partially (chunks of cs from p). */
static void check_chunks(const kvs_plan *pl, int N, int sinks, int window, int cs,
                         const char *what) {
    for (int l = 0; l < pl->n_layers; l++) {
        const int B = pl->layers[l].budget;
        if (B >= N) continue;
        int p, q;
        pq(N, B, sinks, window, 1, &p, &q);
        for (int h = 0; h < pl->n_kv_heads; h++) {
            int partial = 0;
            for (int a = p; a < N - q; a += cs) {
                const int b = a + cs < N - q ? a + cs : N - q;
                int kept = 0;
                for (int t = a; t < b; t++) kept += m1_kept(pl, l, h, t);
                partial += kept > 0 && kept < b - a;
            }
            CHECK_MSG(partial <= 1, "%s N=%d B=%d chunk=%d: %d chunks kept partially", what, N, B,
                      cs, partial);
        }
    }
}

static void test_pyramid_schedule(void) {
    uint64_t rng = 99;
    kvs_err e = {0};
    for (int it = 0; it < 3000; it++) {
        const int L = irand(&rng, 1, 40), N = irand(&rng, 1, 5000), B = irand(&rng, 1, N);
        const int w = irand(&rng, 0, it % 3 ? 64 : N);
        const double beta = 1.0 + kvs_rng_uniform(&rng) * (it % 2 ? 40 : 2);
        int bud[40];
        CHECK_OK(kvs_pyramid_budgets(L, N, B, w, beta, bud, &e), &e);
        int64_t sum = 0;
        int mono = 1, range = 1;
        for (int l = 0; l < L; l++) {
            sum += bud[l];
            range &= bud[l] >= 1 && bud[l] <= N;
            if (l) mono &= bud[l] <= bud[l - 1];
        }
        CHECK_MSG(sum == (int64_t)L * B, "pyramid L=%d N=%d B=%d w=%d beta=%g: sum %lld != %lld",
                  L, N, B, w, beta, (long long)sum, (long long)L * B);
        CHECK_MSG(mono && range, "pyramid L=%d N=%d B=%d w=%d beta=%g: not monotone or out of range",
                  L, N, B, w, beta);
    }
    /* a hand case: L = 3, N = 100, B = 28, w = 8, beta = 20: X = 20,
     * min = 1, max = 39, line 39, 20, 1 -> budgets 47, 28, 9 */
    int bud[3];
    CHECK_OK(kvs_pyramid_budgets(3, 100, 28, 8, 20, bud, &e), &e);
    CHECK(bud[0] == 47 && bud[1] == 28 && bud[2] == 9);
    /* max clamped at N - w: L = 2, N = 40, B = 30, w = 8: X = 22, max = 32 */
    CHECK_OK(kvs_pyramid_budgets(2, 40, 30, 8, 20, bud, &e), &e);
    CHECK(bud[0] == 40 && bud[1] == 20);
}

static void test_presets(uint64_t *rng) {
    for (int i = 0; i < kvs_parts_presets_count(); i++) {
        const kvs_method *m = kvs_parts_preset_at(i);
        const kvs_composition *comp = kvs_parts_composition(m);
        CHECK(comp != NULL);
        if (!comp) continue;
        /* a preset needs what its scorer, allocator and pick rule need (the
         * text prior reads the modality mask, an optional input) */
        const unsigned parts_needs = comp->scorer->needs | comp->allocator->needs | comp->pick->needs |
                                   (comp->channels ? comp->channels->needs : 0u);
        CHECK_MSG((m->needs & ~KVS_NEED_MODALITY) == (parts_needs & ~KVS_NEED_MODALITY),
                  "%s: needs %u but its scorer, allocator and pick rule need %u", m->name, m->needs,
                  parts_needs);
        for (int rep = 0; rep < 6; rep++) {
            m1_cache c;
            const int Hkv = irand(rng, 1, 3), G = irand(rng, 1, 3), N = irand(rng, 1, 200);
            m1_cache_init(&c, irand(rng, 1, 4), Hkv, Hkv * G, N, N, 8 * irand(rng, 1, 3));
            m1_cache_fill_random(&c, 1000 + (uint64_t)rep * 31 + (uint64_t)i);
            if (m->needs & KVS_NEED_W_O) m1_cache_add_wo(&c, irand(rng, 1, 24), 77 + (uint64_t)rep);
            if (m->needs & KVS_NEED_RECON) m1_cache_add_recon(&c, 91 + (uint64_t)rep);
            kvs_params p;
            kvs_params_defaults(m, &p);
            const int B = rep == 0 ? N : irand(rng, 1, N);
            kvs_plan a, b2, t3;
            if (run(m, &p, &c, B, 1, &a)) {
                if (run(m, &p, &c, B, 1, &b2)) {
                    CHECK_MSG(m1_plans_equal(&a, &b2), "%s: two runs differ", m->name);
                    kvs_plan_free(&b2);
                }
                if (run(m, &p, &c, B, 3, &t3)) {
                    CHECK_MSG(m1_plans_equal(&a, &t3), "%s: 1 vs 3 threads differ", m->name);
                    kvs_plan_free(&t3);
                }
                const double w = kvs_part_param(m, &p, "window", 0);
                const double s = kvs_part_param(m, &p, "sinks", 0);
                check_protected(&a, N, (int)s, (int)(w < N ? w : N), 1, m->name);
                if (comp->pick == &kvs_pick_chunk)
                    check_chunks(&a, N, 0, (int)(w < N ? w : N), (int)kvs_part_param(m, &p, "chunk", 10),
                                 m->name);
                if (comp->allocator == &kvs_alloc_pyramid) {
                    int bud[8];
                    kvs_err e = {0};
                    CHECK_OK(kvs_pyramid_budgets(c.L, N, B, (int)(w < N ? w : N),
                                                 kvs_part_param(m, &p, "beta", 20), bud, &e), &e);
                    for (int l = 0; l < c.L; l++) CHECK_EQ_INT(a.layers[l].budget, bud[l]);
                }
                if (B == N)
                    for (int l = 0; l < c.L; l++) CHECK_EQ_INT(a.layers[l].budget, N);
                kvs_plan_free(&a);
            }
            m1_cache_free(&c);
        }
    }
}

static void test_custom(uint64_t *rng) {
    for (int it = 0; it < 200; it++) {
        m1_cache c;
        const int N = irand(rng, 1, 150);
        m1_cache_init(&c, irand(rng, 1, 5), 2, 2, N, 0, 4);
        m1_cache_fill_random(&c, (uint64_t)it);
        const int B = irand(rng, 1, N), sinks = irand(rng, 0, 6), window = irand(rng, 0, 9);
        const int cs = irand(rng, 1, 12);
        char buf[32];
        kvs_params p;
        kvs_plan pl;
        kvs_params_defaults(&m_chunk, &p);
        snprintf(buf, sizeof buf, "%d", it);
        m1_set(&m_chunk, &p, "seed", buf);
        snprintf(buf, sizeof buf, "%d", sinks);
        m1_set(&m_chunk, &p, "sinks", buf);
        snprintf(buf, sizeof buf, "%d", window);
        m1_set(&m_chunk, &p, "window", buf);
        snprintf(buf, sizeof buf, "%d", cs);
        m1_set(&m_chunk, &p, "chunk", buf);
        if (run(&m_chunk, &p, &c, B, 1, &pl)) {
            check_protected(&pl, N, sinks, window, 1, "t_chunk");
            check_chunks(&pl, N, sinks, window, cs, "t_chunk");
            kvs_plan_free(&pl);
        }
        /* pyramid + window before sinks (the window has priority) */
        kvs_params q;
        kvs_params_defaults(&m_topk, &q);
        q.v[1] = sinks, q.v[2] = window, q.v[3] = (it % 4) * 0.25;
        if (run(&m_topk, &q, &c, B, 1, &pl)) {
            check_protected_frac(&pl, N, sinks, window, q.v[3], 0, "t_pyramid");
            kvs_plan_free(&pl);
        }
        m1_cache_free(&c);
    }
}

static void test_refusals(void) {
    m1_cache c;
    m1_cache_init(&c, 2, 1, 2, 16, 16, 4);
    m1_cache_fill_random(&c, 5);
    m1_cache_add_wo(&c, 6, 5); /* host W_o: the presets that need it get past that check */
    m1_cache_add_recon(&c, 5);  /* and the reconstruction statistic (kvzip) */
    kvs_err e = {0};
    kvs_budget b = {0, 8};
    kvs_plan pl;
    for (int i = 0; i < kvs_parts_presets_count(); i++) {
        const kvs_method *m = kvs_parts_preset_at(i);
        kvs_params p;
        kvs_params_defaults(m, &p);
        for (int l = 0; l < c.L; l++) {
            c.layers[l].k.device = KVS_CUDA;
            c.layers[l].v.device = KVS_CUDA;
            c.layers[l].q.device = KVS_CUDA;
        }
        CHECK_FAILS(kvs_compress(m, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_UNSUPPORTED, &e,
                    "not implemented on GPU");
        CHECK_MSG(strstr(e.msg, m->name) != NULL, "message does not name %s: %s", m->name, e.msg);
        for (int l = 0; l < c.L; l++) {
            c.layers[l].k.device = KVS_HOST;
            c.layers[l].v.device = KVS_HOST;
            c.layers[l].q.device = KVS_HOST;
        }
    }
    kvs_params p;
    kvs_params_defaults(&kvs_preset_pyramidkv, &p);
    CHECK_FAILS(kvs_params_set(&kvs_preset_pyramidkv, &p, "beta", "0.5", &e), KVS_ERR_INVALID, &e,
                "beta");
    CHECK_FAILS(kvs_params_set(&kvs_preset_chunkkv, &p, "chunk", "0", &e), KVS_ERR_INVALID, &e,
                "chunk");
    /* a hand-filled out-of-range value is refused at create */
    kvs_params_defaults(&kvs_preset_pyramidkv, &p);
    p.v[kvs_param_index(&kvs_preset_pyramidkv, "beta")] = 0.0;
    CHECK_FAILS(kvs_compress(&kvs_preset_pyramidkv, &p, &c.view, &b, 1, &pl, &e), KVS_ERR_INVALID,
                &e, "beta");
    /* snapkv scorer: too few recorded queries for the window */
    m1_cache w;
    m1_cache_init(&w, 1, 1, 1, 64, 4, 4);
    m1_cache_fill_random(&w, 6);
    kvs_params_defaults(&kvs_preset_chunkkv, &p);
    CHECK_FAILS(kvs_compress(&kvs_preset_chunkkv, &p, &w.view, &b, 1, &pl, &e), KVS_ERR_INVALID, &e,
                "window=8");
    m1_cache_free(&w);
    m1_cache_free(&c);
}

int main(void) {
    uint64_t rng = 2026;
    test_pyramid_schedule();
    test_presets(&rng);
    test_custom(&rng);
    test_refusals();
    printf("test_parts_props: %d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
