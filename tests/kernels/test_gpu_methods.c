/*
 * test_gpu_methods.c -- kvs_gpu_compress against kvs_compress (the CPU
 * references in methods/) for every method with a GPU path: identical
 * budgets, merge formula, note and index sets (a difference is accepted only
 * at an exact-score tie: all differing tokens' reference scores within 1e-5
 * of the largest score). For lookm / meda the merged caches of
 * kvs_gpu_apply_layer and kvs_apply agree within 1e-3 relative (fp16 too).
 * fp32, fp16, bf16; random shapes and budgets from synthetic caches with a
 * fresh seed; device outputs poisoned. Every case runs with both
 * tensor-core attention kernels (mma-reg, wmma-smem) and on CUDA cores;
 * the flashcache cases also with the truncated-basis GEMM DCT route
 * (kvs_gpu_workspace_dct_route 1; the default FFT route in the loop).
 * Error paths: NaN in K, unknown method, parameters of another method,
 * host memory, missing queries.
 * Without a CUDA device: checks the reported reason and exits 77 (skipped).
 * What it is not: no timing.
 */
#include "kg_util.h"

static const kvs_dtype kDtypes[3] = {KVS_F32, KVS_F16, KVS_BF16};

typedef struct {
    const char *method;
    const char *params[4]; /* "name=value", NULL-terminated */
    double image_frac;
    int window_queries; /* 0: all N queries, else only the last this many */
} mcase;

static const mcase kCases[] = {
    {"full", {NULL}, 0.0, 0}, /* KVS_KEEPS_ALL: any budget, keeps all N */
    {"random", {"seed=17", NULL}, 0.0, 0},
    {"streamingllm", {NULL}, 0.0, 0},
    {"streamingllm", {"sinks=0", NULL}, 0.0, 0},
    {"flashcache", {NULL}, 0.0, 0},
    {"flashcache", {"dba=false", NULL}, 0.0, 0},
    {"flashcache", {"granularity=layer", "gamma=0.1", NULL}, 0.0, 0},
    {"flashcache", {"keep_sinks=4", "keep_recent=8", NULL}, 0.0, 0},
    {"snapkv", {NULL}, 0.0, 40},
    {"snapkv", {"pool=avg", "kernel=4", "window=8", NULL}, 0.0, 40},
    {"h2o", {NULL}, 0.0, 0},
    {"h2o", {"normalize=true", NULL}, 0.0, 0},
    {"lookm", {NULL}, 0.3, 0},
    {"lookm", {"merge=weighted", NULL}, 0.3, 0},
    {"lookm", {"merge=average", NULL}, 0.0, 0},
    {"meda", {NULL}, 0.3, 0},
    {"meda", {"merge=pivotal", "recent_frac=0.75", NULL}, 0.0, 0},
};

/* Reference scores of one layer for the tie judgement: [Hkv][N] (snapkv:
 * the pooled votes in [0, P)). NULL-free: returns 0 on success. */
static int ref_scores(const kvs_method *m, const kvs_params *p, const kg_cache *c, int l, int N,
                      float *sc) {
    const kvs_layer *ly = &c->hl[l];
    const int H = ly->k.n_heads;
    if (!strcmp(m->name, "flashcache")) {
        double e[4];
        int omega = (int)lround(kvs_param_get(m, p, "gamma") * N);
        if (omega < 1) omega = 1;
        if (omega > N) omega = N;
        if (kg_ref_flashcache(ly, omega, sc, e)) return 1;
        if ((int)kvs_param_get(m, p, "granularity") == 1)
            for (int n = 0; n < N; n++) {
                float a = 0.0f;
                for (int h = 0; h < H; h++) a += sc[(size_t)h * N + n];
                for (int h = 0; h < H; h++) sc[(size_t)h * N + n] = a;
            }
        return 0;
    }
    if (!strcmp(m->name, "snapkv")) {
        const int win = (int)kvs_param_get(m, p, "window"), w = win < N ? win : N, P = N - w;
        kvs_view qw = ly->q;
        qw.data = (const char *)ly->q.data +
                  (size_t)(ly->q.n_tokens - w) * (size_t)ly->q.s_tok * kvs_dtype_size(ly->q.dtype);
        qw.n_tokens = w;
        float *cs = malloc(sizeof(float) * (size_t)H * N);
        if (!cs || kg_ref_colsum(&qw, &ly->k, cs)) {
            free(cs);
            return 1;
        }
        const int k = (int)kvs_param_get(m, p, "kernel");
        for (int h = 0; h < H; h++) {
            if ((int)kvs_param_get(m, p, "pool") == 0) kvs_pool1d_max(cs + (size_t)h * N, P, k, sc + (size_t)h * N);
            else kvs_pool1d_avg(cs + (size_t)h * N, P, k, sc + (size_t)h * N);
            for (int j = P; j < N; j++) sc[(size_t)h * N + j] = 0.0f;
        }
        free(cs);
        return 0;
    }
    if (!strcmp(m->name, "h2o") || !strcmp(m->name, "lookm") || !strcmp(m->name, "meda")) {
        if (kg_ref_colsum(&ly->q, &ly->k, sc)) return 1;
        const int norm = !strcmp(m->name, "h2o") && kvs_param_get(m, p, "normalize") != 0.0;
        for (int h = 0; h < H; h++) {
            float *s = sc + (size_t)h * N, mx = -INFINITY;
            for (int j = 0; j < N; j++) {
                if (norm) s[j] /= (float)(N - j);
                if (s[j] > mx) mx = s[j];
            }
            if (strcmp(m->name, "h2o"))
                for (int j = 0; j < N; j++)
                    if (!c->host.modality || c->host.modality[j] == KVS_MOD_TEXT) s[j] += mx;
        }
        return 0;
    }
    return 1; /* full, streamingllm: no scores, plans must be identical */
}

static void compare_plans(const kvs_method *m, const kvs_params *p, const kg_cache *c,
                          const kvs_plan *cpu, const kvs_plan *gpu, const char *what) {
    CHECK_MSG(!strcmp(cpu->method, gpu->method), "%s: method %s vs %s", what, gpu->method, cpu->method);
    CHECK_MSG(cpu->n_layers == gpu->n_layers && cpu->n_kv_heads == gpu->n_kv_heads &&
                  cpu->n_tokens == gpu->n_tokens, "%s: plan shapes differ", what);
    if (cpu->n_layers != gpu->n_layers || cpu->n_kv_heads != gpu->n_kv_heads) return;
    CHECK_MSG(cpu->merge == gpu->merge, "%s: merge %d vs %d", what, gpu->merge, cpu->merge);
    CHECK_MSG(!strcmp(cpu->note, gpu->note), "%s: note '%s' vs '%s'", what, gpu->note, cpu->note);
    const int L = cpu->n_layers, H = cpu->n_kv_heads, N = cpu->n_tokens;
    float *sc = malloc(sizeof(float) * (size_t)H * N);
    int ties = 0;
    for (int l = 0; l < L; l++) {
        const int B = cpu->layers[l].budget;
        CHECK_MSG(B == gpu->layers[l].budget, "%s: layer %d budget gpu %d cpu %d", what, l,
                  gpu->layers[l].budget, B);
        if (B != gpu->layers[l].budget) continue;
        int have = -1;
        for (int h = 0; h < H; h++) {
            const int32_t *a = gpu->layers[l].idx + (size_t)h * B, *b = cpu->layers[l].idx + (size_t)h * B;
            if (!memcmp(a, b, sizeof(int32_t) * (size_t)B)) continue;
            if (have < 0) have = ref_scores(m, p, c, l, N, sc) == 0;
            char w2[320];
            snprintf(w2, sizeof w2, "%s layer %d head %d", what, l, h);
            const int r = kg_cmp_rows(a, b, B, N, have ? sc + (size_t)h * N : NULL, 1e-5, w2);
            CHECK_MSG(r >= 0, "%s: index sets differ beyond ties", w2);
            ties += r == 1;
        }
    }
    if (ties) printf("  %s: %d head(s) differ only at exact-score ties\n", what, ties);
    free(sc);
}

static void compare_apply(kvs_gpu_workspace *ws, const kg_cache *c, const kvs_plan *plan,
                          const char *what) {
    kvs_dense_cache ref;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_apply(&c->host, plan, &ref, &err), &err);
    if (!ref.layers) return;
    const int H = plan->n_kv_heads;
    for (int l = 0; l < plan->n_layers; l++) {
        const int B = plan->layers[l].budget, d = c->hl[l].k.head_dim, N = plan->n_tokens;
        const size_t n = (size_t)H * B * d;
        float *dk = kg_alloc_poisoned(sizeof(float) * n), *dv = kg_alloc_poisoned(sizeof(float) * n);
        float *gk = malloc(sizeof(float) * n), *gv = malloc(sizeof(float) * n);
        unsigned char *skip = calloc((size_t)H * B, 1);
        CHECK_OK(kvs_gpu_apply_layer(ws, &c->dl[l], plan, l, dk, dv, &err), &err);
        CHECK_OK(kvs_gpu_sync(ws, &err), &err);
        CHECK(!kg_download(gk, dk, sizeof(float) * n) && !kg_download(gv, dv, sizeof(float) * n));
        /* slots whose evicted tokens sit at a cosine tie: not comparable */
        if (plan->merge != KVS_MERGE_NONE && B < N) {
            int32_t *ra = malloc(sizeof(int32_t) * (size_t)N), *ga = malloc(sizeof(int32_t) * (size_t)N);
            int32_t *dkept = NULL, *dassign = kg_alloc_poisoned(sizeof(int32_t) * (size_t)N);
            float *rows = malloc(sizeof(float) * (size_t)d * 3);
            for (int h = 0; h < H; h++) {
                const int32_t *kept = plan->layers[l].idx + (size_t)h * B;
                CHECK_OK(kvs_merge_assign(&c->hl[l].k, h, kept, B, ra, &err), &err);
                dkept = kg_upload(kept, sizeof(int32_t) * (size_t)B);
                CHECK_OK(kvs_gpu_merge_assign(ws, &c->dl[l].k, h, dkept, B, dassign, &err), &err);
                CHECK_OK(kvs_gpu_sync(ws, &err), &err);
                CHECK(!kg_download(ga, dassign, sizeof(int32_t) * (size_t)N));
                for (int t = 0; t < N; t++) {
                    if (ra[t] == ga[t]) continue;
                    int tie = 0;
                    if (ra[t] >= 0 && ga[t] >= 0 && ga[t] < B) {
                        kvs_view_rows_f32(&c->hl[l].k, h, t, 1, rows);
                        kvs_view_rows_f32(&c->hl[l].k, h, kept[ra[t]], 1, rows + d);
                        kvs_view_rows_f32(&c->hl[l].k, h, kept[ga[t]], 1, rows + 2 * d);
                        tie = fabs(kg_cos(rows, rows + d, d) - kg_cos(rows, rows + 2 * d, d)) <= 1e-5;
                    }
                    CHECK_MSG(tie, "%s layer %d head %d token %d: assigned to slot %d on gpu, %d on cpu",
                              what, l, h, t, ga[t], ra[t]);
                    if (tie) skip[(size_t)h * B + ra[t]] = skip[(size_t)h * B + ga[t]] = 1;
                }
                kvs_gpu_free(dkept);
            }
            kvs_gpu_free(dassign);
            free(ra);
            free(ga);
            free(rows);
        }
        char w2[320];
        snprintf(w2, sizeof w2, "%s apply layer %d", what, l);
        CHECK_MSG(kg_cmp_merged(gk, gv, ref.layers[l].k, ref.layers[l].v, H, B, d, skip, 1e-3, w2) == 0,
                  "%s", w2);
        kvs_gpu_free(dk);
        kvs_gpu_free(dv);
        free(gk);
        free(gv);
        free(skip);
    }
    kvs_dense_cache_free(&ref);
}

static void run_case(kvs_gpu_workspace *ws, uint64_t *rng, const mcase *mc, kvs_dtype t) {
    const kvs_method *m = kvs_method_find(mc->method);
    CHECK(m != NULL);
    if (!m) return;
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_err err;
    kvs_err_clear(&err);
    for (int i = 0; mc->params[i]; i++) CHECK_OK(kvs_params_set_kv(m, &p, mc->params[i], &err), &err);
    /* random shape */
    const int L = 2 + (int)(kvs_rng_uniform(rng) * 3), Hkv = 1 + (int)(kvs_rng_uniform(rng) * 2);
    const int G = 1 + (int)(kvs_rng_uniform(rng) * 3), d = kvs_rng_uniform(rng) < 0.5 ? 64 : 48;
    const int N = 60 + (int)(kvs_rng_uniform(rng) * 900);
    const int Nq = mc->window_queries ? (mc->window_queries < N ? mc->window_queries : N) : N;
    kvs_budget b = {0, 0};
    if (kvs_rng_uniform(rng) < 0.2) b.tokens = 1 + (int64_t)(kvs_rng_uniform(rng) * N);
    else b.ratio = 0.05 + 0.6 * kvs_rng_uniform(rng);
    char what[200];
    snprintf(what, sizeof what, "%s [%s%s%s] %s L=%d Hq=%d Hkv=%d d=%d N=%d ratio=%g tokens=%lld",
             mc->method, mc->params[0] ? mc->params[0] : "", mc->params[0] && mc->params[1] ? " " : "",
             mc->params[0] && mc->params[1] ? mc->params[1] : "", kvs_dtype_name(t), L, Hkv * G, Hkv,
             d, N, b.ratio, (long long)b.tokens);
    kvs_dense_cache dc;
    if (kg_synth(L, Hkv * G, Hkv, d, N, Nq, mc->image_frac, kvs_rng_next(rng), &dc)) {
        CHECK(0);
        return;
    }
    kg_cache c;
    if (kg_cache_make(&dc, t, &c)) {
        CHECK(0);
        kvs_dense_cache_free(&dc);
        return;
    }
    kvs_plan cpu, gpu;
    kvs_err e1, e2;
    kvs_err_clear(&e1);
    kvs_err_clear(&e2);
    kvs_status s1 = kvs_compress(m, &p, &c.host, &b, 1, &cpu, &e1);
    kvs_status s2 = kvs_gpu_compress(m->name, &p, &c.dev, &b, ws, &gpu, &e2);
    CHECK_MSG(s1 == s2, "%s: cpu rc %d (%s), gpu rc %d (%s)", what, (int)s1, e1.msg, (int)s2, e2.msg);
    if (s1 == KVS_OK && s2 == KVS_OK) {
        compare_plans(m, &p, &c, &cpu, &gpu, what);
        if (cpu.merge != KVS_MERGE_NONE || !strcmp(m->name, "flashcache")) compare_apply(ws, &c, &cpu, what);
    }
    if (s1 == KVS_OK) kvs_plan_free(&cpu);
    if (s2 == KVS_OK) kvs_plan_free(&gpu);
    kg_cache_free(&c);
    kvs_dense_cache_free(&dc);
}

static void test_errors(kvs_gpu_workspace *ws, uint64_t *rng) {
    kvs_dense_cache dc;
    if (kg_synth(2, 4, 2, 32, 100, 100, 0.0, kvs_rng_next(rng), &dc)) {
        CHECK(0);
        return;
    }
    kg_cache c;
    if (kg_cache_make(&dc, KVS_F16, &c)) {
        CHECK(0);
        kvs_dense_cache_free(&dc);
        return;
    }
    kvs_err err;
    kvs_err_clear(&err);
    kvs_plan plan;
    kvs_budget b = {0.3, 0};
    kvs_params p;
    const kvs_method *fc = kvs_method_find("flashcache");
    kvs_params_defaults(fc, &p);
    CHECK_FAILS(kvs_gpu_compress("nope", &p, &c.dev, &b, ws, &plan, &err), KVS_ERR_NOTFOUND, &err,
                "nope");
    /* every registered method without a GPU driver (methods/gpu/gpu_compress.c)
     * is refused by name, never run on the CPU */
    static const char *const with_driver[] = {"full", "random", "streamingllm", "flashcache",
                                              "snapkv", "h2o", "lookm", "meda"};
    int refused = 0;
    for (int i = 0; i < kvs_methods_count(); i++) {
        const kvs_method *m = kvs_method_at(i);
        int has = 0;
        for (size_t j = 0; j < sizeof with_driver / sizeof with_driver[0]; j++)
            if (!strcmp(m->name, with_driver[j])) has = 1;
        if (has) continue;
        kvs_params q;
        kvs_params_defaults(m, &q);
        CHECK_FAILS(kvs_gpu_compress(m->name, &q, &c.dev, &b, ws, &plan, &err),
                    KVS_ERR_UNSUPPORTED, &err, "not implemented on GPU");
        CHECK_MSG(strstr(err.msg, m->name) != NULL, "message does not name %s: %s", m->name,
                  err.msg);
        refused++;
    }
    printf("methods without a GPU driver, refused: %d\n", refused);
    /* a parameter set that does not fit the method */
    kvs_params pr;
    kvs_params_defaults(kvs_method_find("random"), &pr);
    CHECK_FAILS(kvs_gpu_compress("snapkv", &pr, &c.dev, &b, ws, &plan, &err), KVS_ERR_INVALID,
                &err, "parameter set");
    CHECK_FAILS(kvs_gpu_compress("flashcache", &p, &c.host, &b, ws, &plan, &err), KVS_ERR_INVALID,
                &err, "host memory");
    /* NaN in K of layer 1, head 1, token 7 */
    uint16_t nanh = 0x7e00;
    CHECK_OK(kvs_gpu_memcpy_h2d((uint16_t *)c.dk[1] + ((size_t)1 * 100 + 7) * 32 + 3, &nanh, 2, &err),
             &err);
    const char *ms[] = {"flashcache", "h2o", "streamingllm"};
    for (int i = 0; i < 3; i++) {
        kvs_params q;
        kvs_params_defaults(kvs_method_find(ms[i]), &q);
        CHECK_FAILS(kvs_gpu_compress(ms[i], &q, &c.dev, &b, ws, &plan, &err), KVS_ERR_NUMERIC, &err,
                    "layer 1");
    }
    /* the workspace recovers: a clean cache works again */
    uint16_t one = 0x3c00;
    CHECK_OK(kvs_gpu_memcpy_h2d((uint16_t *)c.dk[1] + ((size_t)1 * 100 + 7) * 32 + 3, &one, 2, &err),
             &err);
    kvs_err_clear(&err);
    kvs_status again = kvs_gpu_compress("flashcache", &p, &c.dev, &b, ws, &plan, &err);
    CHECK_MSG(again == KVS_OK, "after a NaN error the workspace must work again: %s", err.msg);
    if (again == KVS_OK) kvs_plan_free(&plan);
    /* snapkv with fewer recorded queries than its window */
    kvs_params ps;
    const kvs_method *sk = kvs_method_find("snapkv");
    kvs_params_defaults(sk, &ps);
    CHECK_OK(kvs_params_set(sk, &ps, "window", "64", &err), &err);
    for (int l = 0; l < 2; l++) c.dl[l].q.n_tokens = 10;
    CHECK_FAILS(kvs_gpu_compress("snapkv", &ps, &c.dev, &b, ws, &plan, &err), KVS_ERR_INVALID, &err,
                "window");
    kg_cache_free(&c);
    kvs_dense_cache_free(&dc);
}

int main(void) {
    int rc = kg_device_or_skip("test_gpu_methods");
    if (rc) return rc;
    uint64_t seed = kg_seed(), rng = seed;
    kvs_shape mx = {4, 1000, 2, 6, 64, 0, 1};
    kvs_gpu_workspace *ws = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_workspace_init(&ws, &mx, &err) != KVS_OK) {
        fprintf(stderr, "workspace: %s\n", err.msg);
        return 1;
    }
    printf("device: %s\n", kvs_gpu_workspace_device(ws));
    /* every case three times: tensor cores with the mma-reg attention
     * kernel (fp16 / bf16; needs sm_80, else reported and skipped), tensor
     * cores with the wmma-smem kernel, CUDA cores only */
    for (int cfg = 0; cfg < 3; cfg++) {
        const int on = kvs_gpu_workspace_tensor_cores(ws, cfg < 2);
        int kern = -1;
        kvs_status ks = kvs_gpu_workspace_attn_kernel(
            ws, cfg == 0 ? KVS_GPU_ATTN_MMA : KVS_GPU_ATTN_WMMA, &kern, &err);
        if (ks != KVS_OK) {
            CHECK_MSG(cfg == 0 && ks == KVS_ERR_UNSUPPORTED && strstr(err.msg, "sm_80"),
                      "attention kernel setting: %s", err.msg);
            printf("mma-reg kernel unavailable: %s\n", err.msg);
            continue;
        }
        const char *kn = !on ? "cuda-cores" : kern == KVS_GPU_ATTN_MMA ? "mma-reg" : "wmma-smem";
        for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++)
            for (int t = 0; t < 3; t++) {
                const int before = kvs_test_failures;
                run_case(ws, &rng, &kCases[i], kDtypes[t]);
                printf("%-14s %-5s tc=%d attn=%-10s %s\n", kCases[i].method,
                       kvs_dtype_name(kDtypes[t]), on, kn,
                       kvs_test_failures == before ? "ok" : "FAILED");
            }
    }
    /* flashcache once more with the truncated-basis GEMM route (cuBLAS,
     * fp32 compute): its plans must equal the CPU's exactly as the FFT
     * route's do above (ties aside) */
    int route = -1;
    kvs_status rs = kvs_gpu_workspace_dct_route(ws, KVS_GPU_DCT_GEMM, &route, &err);
    CHECK_MSG(rs == KVS_OK && route == KVS_GPU_DCT_GEMM, "dct route gemm: rc %d: %s", (int)rs,
              err.msg);
    if (rs == KVS_OK) {
        for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) {
            if (strcmp(kCases[i].method, "flashcache")) continue;
            for (int t = 0; t < 3; t++) {
                const int before = kvs_test_failures;
                run_case(ws, &rng, &kCases[i], kDtypes[t]);
                printf("%-14s %-5s dct=gemm %s%s\n", kCases[i].method, kvs_dtype_name(kDtypes[t]),
                       kCases[i].params[0] ? kCases[i].params[0] : "defaults",
                       kvs_test_failures == before ? " ok" : " FAILED");
            }
        }
        CHECK_OK(kvs_gpu_workspace_dct_route(ws, KVS_GPU_DCT_FFT, &route, &err), &err);
    }
    kvs_gpu_workspace_tensor_cores(ws, 1);
    test_errors(ws, &rng);
    kvs_gpu_workspace_free(ws);
    printf("%d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
