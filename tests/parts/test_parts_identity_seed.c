/*
 * test_parts_identity_seed.c -- flashcache_parts gives plans BIT-IDENTICAL
 * to the monolithic flashcache, and the lookm and meda presets (monolithic
 * files until they were proven identical and removed) to a reference made
 * here from methods/textprior.c's helpers, the steps the monolithic lookm.c
 * and meda.c ran (H2O column sums and MEDA's entropies from one fused pass,
 * the text boost, softmax-of-entropy budgets, recent window + top-k):
 * every index of every (layer, head), the layer budgets (DBA's and MEDA's
 * entropy budgets included) and the plan's merge formula, and kvs_apply's
 * compressed (merged) K and V byte for byte, on random caches (several
 * shapes, GQA groups 1..4, N from 1 to 300; modality absent, all text,
 * text / image mixed, all image, a zero-energy layer) and formats' synthetic
 * caches, at budgets 1, 2, N/4, N/2, N - 1, N and random ones, with the
 * parameters swept (gamma, dba, granularity, keep_sinks, keep_recent;
 * merge, recent_frac) and 1 or 3 threads, all through kvs_compress.
 */
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "m1_util.h"
#include "textprior.h"

#include <math.h>

/* The reference lookm (meda = 0) / meda (meda = 1) plan at budget B. */
static kvs_status ref_plan(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c, int meda,
                           int B, int threads, kvs_plan *out, kvs_err *err) {
    kvs_shape sh;
    kvs_status rc = kvs_cache_validate(c, &sh, err);
    if (rc) return rc;
    sh.threads = threads;
    const int L = sh.n_layers, N = sh.n_tokens;
    const int recent = kvs_param_index(m, "recent_frac");
    static const kvs_merge of[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE, KVS_MERGE_WEIGHTED,
                                    KVS_MERGE_NONE};
    const kvs_merge merge = of[(int)p->v[kvs_param_index(m, "merge")]];
    void *state = NULL;
    if ((rc = kvs_tp_create(m, p, &sh, recent, sizeof(kvs_tp_state), &state, err))) return rc;
    kvs_tp_state *s = state;
    kvs_entropy_stats *ent = calloc((size_t)L, sizeof *ent);
    uint8_t *all_text = calloc((size_t)N, 1);
    for (int l = 0; l < L && !rc; l++)
        rc = kvs_tp_observe(s, l, &c->layers[l], c->modality, 0, 1,
                            meda ? (c->modality ? c->modality : all_text) : NULL,
                            meda ? &ent[l] : NULL, err);
    if (!rc && !meda) rc = kvs_tp_select_uniform(s, B, merge, out, err);
    if (!rc && meda) {
        double *w = malloc(sizeof(double) * (size_t)L), emax = -INFINITY, wsum = 0.0;
        int *bud = malloc(sizeof(int) * (size_t)L), xmodal = 1;
        for (int l = 0; l < L; l++)
            if (ent[l].n_tv + ent[l].n_vt == 0) xmodal = 0;
        for (int l = 0; l < L; l++) {
            w[l] = xmodal ? (ent[l].n_tv > 0 ? ent[l].e_tv : 0.0) + (ent[l].n_vt > 0 ? ent[l].e_vt : 0.0)
                          : ent[l].plain;
            if (w[l] > emax) emax = w[l];
        }
        for (int l = 0; l < L; l++) wsum += (w[l] = exp(w[l] - emax));
        for (int l = 0; l < L; l++) w[l] /= wsum;
        rc = kvs_budget_allocate(w, L, (int64_t)L * B, kvs_budget_min(N) < B ? kvs_budget_min(N) : B,
                                 N, bud, err);
        if (!rc) rc = kvs_tp_fill_plan(m->name, s->scores, L, sh.n_kv_heads, N, bud, s->recent_frac,
                                       merge, out, err);
        free(w);
        free(bud);
    }
    free(ent);
    free(all_text);
    kvs_tp_destroy(s);
    return rc;
}

static int n_ref = 0, n_compared = 0, n_applied = 0;

/* The preset against the reference: plans, merge, applied caches. */
static void compare_ref(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c, int meda,
                        int N, int B, int threads, int apply, const char *what) {
    kvs_err ea = {0}, eb = {0};
    kvs_plan x, y;
    kvs_budget bud = {0, B};
    kvs_status ra = kvs_compress(m, p, c, &bud, threads, &x, &ea);
    kvs_status rb = ref_plan(m, p, c, meda, B, threads, &y, &eb);
    CHECK_MSG(ra == rb, "%s %s vs reference N=%d B=%d: status %d (%s) vs %d (%s)", what, m->name, N,
              B, ra, ea.msg, rb, eb.msg);
    if (!ra && !rb) {
        CHECK_MSG(m1_plans_equal(&x, &y) && x.merge == y.merge,
                  "%s %s vs reference N=%d B=%d threads=%d: plans differ", what, m->name, N, B,
                  threads);
        n_ref++;
        if (apply) {
            kvs_dense_cache dx, dy;
            memset(&dx, 0, sizeof dx);
            memset(&dy, 0, sizeof dy);
            CHECK_OK(kvs_apply(c, &x, &dx, &ea), &ea);
            CHECK_OK(kvs_apply(c, &y, &dy, &eb), &eb);
            int same = dx.n_layers == dy.n_layers;
            for (int l = 0; same && l < dx.n_layers; l++) {
                const size_t n = (size_t)dx.layers[l].n_kv_heads * dx.layers[l].n_tokens * dx.layers[l].head_dim;
                same = !memcmp(dx.layers[l].k, dy.layers[l].k, n * sizeof(float)) &&
                       !memcmp(dx.layers[l].v, dy.layers[l].v, n * sizeof(float));
            }
            CHECK_MSG(same, "%s %s vs reference N=%d B=%d: applied caches differ", what, m->name, N, B);
            n_applied++;
            kvs_dense_cache_free(&dx);
            kvs_dense_cache_free(&dy);
        }
    }
    if (!ra) kvs_plan_free(&x);
    if (!rb) kvs_plan_free(&y);
}


static int dense_equal(const kvs_dense_cache *a, const kvs_dense_cache *b) {
    if (a->n_layers != b->n_layers) return 0;
    for (int l = 0; l < a->n_layers; l++) {
        const kvs_dense_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->n_tokens != y->n_tokens || x->n_kv_heads != y->n_kv_heads || x->head_dim != y->head_dim)
            return 0;
        const size_t n = (size_t)x->n_kv_heads * x->n_tokens * x->head_dim;
        if (memcmp(x->k, y->k, n * sizeof(float)) || memcmp(x->v, y->v, n * sizeof(float))) return 0;
    }
    return 1;
}

static void compare(const kvs_method *a, const kvs_method *b, const kvs_params *pa,
                    const kvs_params *pb, const kvs_cache_view *c, int N, int B, int threads,
                    int apply, const char *what) {
    kvs_err ea = {0}, eb = {0};
    kvs_plan x, y;
    kvs_budget bud = {0, B};
    kvs_status ra = kvs_compress(a, pa, c, &bud, threads, &x, &ea);
    kvs_status rb = kvs_compress(b, pb, c, &bud, threads, &y, &eb);
    CHECK_MSG(ra == rb, "%s %s vs %s N=%d B=%d: status %d (%s) vs %d (%s)", what, a->name, b->name,
              N, B, ra, ea.msg, rb, eb.msg);
    if (!ra && !rb) {
        CHECK_MSG(m1_plans_equal(&x, &y) && x.merge == y.merge,
                  "%s %s vs %s N=%d B=%d threads=%d: plans differ", what, a->name, b->name, N, B,
                  threads);
        n_compared++;
        if (apply) {
            kvs_dense_cache dx, dy;
            memset(&dx, 0, sizeof dx);
            memset(&dy, 0, sizeof dy);
            CHECK_OK(kvs_apply(c, &x, &dx, &ea), &ea);
            CHECK_OK(kvs_apply(c, &y, &dy, &eb), &eb);
            CHECK_MSG(dense_equal(&dx, &dy), "%s %s vs %s N=%d B=%d: applied caches differ", what,
                      a->name, b->name, N, B);
            n_applied++;
            kvs_dense_cache_free(&dx);
            kvs_dense_cache_free(&dy);
        }
    }
    if (!ra) kvs_plan_free(&x);
    if (!rb) kvs_plan_free(&y);
}

static void set2(const kvs_method *a, kvs_params *pa, const kvs_method *b, kvs_params *pb,
                 const char *name, const char *value) {
    m1_set(a, pa, name, value);
    m1_set(b, pb, name, value);
}

static void budgets_for(int N, uint64_t *rng, int *out, int *n) {
    int cand[9] = {1, 2, N / 4, N / 2, N - 1, N, 1 + (int)(kvs_rng_uniform(rng) * N),
                   1 + (int)(kvs_rng_uniform(rng) * N), 5};
    *n = 0;
    for (int i = 0; i < 9; i++)
        if (cand[i] >= 1 && cand[i] <= N) out[(*n)++] = cand[i];
}

static void all_pairs(const kvs_cache_view *c, int N, int Nq, uint64_t *rng, const char *what) {
    char buf[32];
    int bs[9], nb;
    /* flashcache */
    const char *gammas[3] = {"0.2", "0.05", "0.7"};
    for (int v = 0; v < 6; v++) {
        kvs_params pa, pb;
        const kvs_method *A = &kvs_method_flashcache, *Bm = &kvs_preset_flashcache_parts;
        kvs_params_defaults(A, &pa);
        kvs_params_defaults(Bm, &pb);
        set2(A, &pa, Bm, &pb, "gamma", gammas[v % 3]);
        set2(A, &pa, Bm, &pb, "dba", v == 3 ? "false" : "true");
        set2(A, &pa, Bm, &pb, "granularity", v == 4 ? "layer" : "head");
        snprintf(buf, sizeof buf, "%d", v == 1 ? 4 : v == 5 ? 2 : 0);
        set2(A, &pa, Bm, &pb, "keep_sinks", buf);
        snprintf(buf, sizeof buf, "%d", v == 2 ? 8 : v == 5 ? 3 : 0);
        set2(A, &pa, Bm, &pb, "keep_recent", buf);
        budgets_for(N, rng, bs, &nb);
        for (int i = 0; i < nb; i++) compare(A, Bm, &pa, &pb, c, N, bs[i], 1 + 2 * (i & 1), 0, what);
    }
    if (Nq != N) { /* lookm and meda refuse (both the same way) */
        kvs_params pa;
        kvs_params_defaults(&kvs_method_lookm, &pa);
        compare_ref(&kvs_method_lookm, &pa, c, 0, N, 1, 1, 0, what);
        return;
    }
    /* lookm */
    const char *merges[4] = {"pivotal", "average", "weighted", "none"};
    const char *fr[3] = {"0.5", "0.25", "1"};
    for (int meda = 0; meda < 2; meda++)
        for (int v = 0; v < 4; v++) {
            kvs_params pa;
            const kvs_method *A = meda ? &kvs_method_meda : &kvs_method_lookm;
            kvs_params_defaults(A, &pa);
            m1_set(A, &pa, "merge", merges[(v + meda) % 4]);
            m1_set(A, &pa, "recent_frac", fr[v % 3]);
            budgets_for(N, rng, bs, &nb);
            for (int i = 0; i < nb; i++)
                compare_ref(A, &pa, c, meda, N, bs[i], 1 + 2 * (i & 1), i < 3, what);
        }
}

int main(void) {
    uint64_t rng = 4242;
    const int shapes[][5] = {{1, 1, 1, 1, 4},  {2, 1, 1, 5, 4},    {2, 2, 4, 33, 8},
                             {3, 2, 8, 64, 16}, {4, 1, 3, 100, 8}, {2, 4, 8, 300, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mod = 0; mod < 4; mod++) {
            m1_cache c;
            const int *sh = shapes[s];
            m1_cache_init(&c, sh[0], sh[1], sh[2], sh[3], sh[3], sh[4]);
            m1_cache_fill_random(&c, 300 + s * 7 + (uint64_t)mod);
            if (mod) { /* 1: all text, 2: text / image mixed, 3: all image */
                c.modality = calloc((size_t)c.N, 1);
                for (int j = 0; j < c.N; j++)
                    c.modality[j] = mod == 3 ? KVS_MOD_IMAGE
                                    : mod == 2 && (j % 5 == 1 || j % 5 == 2) ? KVS_MOD_IMAGE
                                                                              : KVS_MOD_TEXT;
                c.view.modality = c.modality;
            }
            if (mod == 1 && c.L > 1) { /* a layer of zeros: DBA's zero-energy rule */
                memset(m1_k(&c, 1, 0, 0), 0, sizeof(float) * (size_t)c.Hkv * c.N * c.d);
                memset(m1_v(&c, 1, 0, 0), 0, sizeof(float) * (size_t)c.Hkv * c.N * c.d);
            }
            all_pairs(&c.view, c.N, c.Nq, &rng, "m1");
            m1_cache_free(&c);
        }
    {   /* a window-only query record: flashcache compared, lookm / meda refused alike */
        m1_cache c;
        m1_cache_init(&c, 2, 2, 4, 120, 40, 16);
        m1_cache_fill_random(&c, 7);
        all_pairs(&c.view, c.N, c.Nq, &rng, "m1-window");
        m1_cache_free(&c);
    }
    for (int v = 0; v < 2; v++) { /* formats' synthetic caches (sinks, outliers, RoPE) */
        kvs_err e = {0};
        kvs_synth_config cfg;
        if (v == 0) {
            CHECK_OK(kvs_synth_preset("tiny", &cfg, &e), &e);
        } else {
            kvs_synth_defaults(&cfg);
            cfg.n_layers = 3, cfg.n_q_heads = 8, cfg.n_kv_heads = 2, cfg.head_dim = 32;
        }
        cfg.n_tokens = v ? 257 : 160;
        cfg.n_queries = cfg.n_tokens;
        cfg.seed = 77 + (uint64_t)v;
        kvs_dense_cache dc;
        memset(&dc, 0, sizeof dc);
        CHECK_OK(kvs_synth_generate(&cfg, &dc, NULL, NULL, &e), &e);
        if (!dc.layers) continue;
        kvs_layer *ls = calloc((size_t)dc.n_layers, sizeof *ls);
        kvs_cache_view view;
        CHECK_OK(kvs_dense_cache_view(&dc, &view, ls, &e), &e);
        all_pairs(&view, cfg.n_tokens, cfg.n_queries, &rng, v ? "synth" : "synth-tiny");
        free(ls);
        kvs_dense_cache_free(&dc);
    }
    printf("test_parts_identity_seed: %d flashcache plan pairs, %d lookm / meda plans against the "
           "reference, %d applied, %d checks, %d failures\n",
           n_compared, n_ref, n_applied, kvs_test_checks, kvs_test_failures);
    CHECK(n_compared > 500 && n_ref > 500 && n_applied > 100);
    return kvs_test_failures ? 1 : 0;
}
