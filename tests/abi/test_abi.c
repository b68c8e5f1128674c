/*
 * test_abi.c -- the C ABI of libkvsieve.so (abi/kvsieve_abi.h) against the
 * static libraries it wraps: for every registered method, on synthetic
 * caches in F32 / F16 / BF16, in contiguous, transposed and channel-strided
 * layouts, the ABI's plan equals kvs_compress's (budgets, indices, merge,
 * JSON text), apply equals kvs_apply (fp32 bit for bit, and converted to the
 * input dtype), the merge map equals kvs_merge_assign; plus the version,
 * the method listing, the statistics and the error messages (each names the
 * layer / tensor / field).
 * What it is not: no CUDA checks (tests/kernels cover the device path; a
 * build without CUDA is checked to say so).
 */
#include "kvs_formats.h"
#include "kvsieve.h"
#include "kvsieve_abi.h"
#include "kvsieve_methods.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdint.h>

/* An ABI call on ctx must succeed; prints the context's message otherwise. */
#define ABI_OK(ctx, call)                                                                      \
    do {                                                                                       \
        kvs_test_checks++;                                                                     \
        int _rc = (int)(call);                                                                 \
        if (_rc != 0) {                                                                        \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call, _rc,     \
                    kvs_abi_last_error(ctx));                                                  \
            kvs_test_failures++;                                                               \
        }                                                                                      \
    } while (0)

/* An ABI call on ctx must fail with `code` and a message containing needle. */
#define ABI_FAILS(ctx, call, code, needle)                                                     \
    do {                                                                                       \
        kvs_test_checks++;                                                                     \
        int _rc = (int)(call);                                                                 \
        const char *_m = kvs_abi_last_error(ctx);                                              \
        if (_rc != (int)(code) || !strstr(_m, (needle))) {                                     \
            fprintf(stderr, "%s:%d: expected %s to fail with %d and \"%s\"; got %d: %s\n",     \
                    __FILE__, __LINE__, #call, (int)(code), (needle), _rc, _m);                \
            kvs_test_failures++;                                                               \
        }                                                                                      \
    } while (0)

static kvs_err *ep(kvs_err *e) { return e; }

static int n_compared = 0; /* (cache, method, budget) cases where both succeeded */
static int n_ragged = 0;   /* ragged plan layers checked through the per-head accessors */

/* A tensor descriptor of a [H][N][d] block with element strides s. */
static kvs_abi_tensor tensor3(const void *data, int dtype, int64_t H, int64_t N, int64_t d, int64_t s0,
                              int64_t s1, int64_t s2) {
    kvs_abi_tensor t = KVS_ABI_INIT(kvs_abi_tensor);
    t.dtype = dtype;
    t.device = KVS_ABI_HOST;
    t.data = (void *)data;
    t.ndim = 3;
    t.shape[0] = H, t.shape[1] = N, t.shape[2] = d;
    t.strides[0] = s0, t.strides[1] = s1, t.strides[2] = s2;
    return t;
}

static kvs_abi_tensor contig3(const void *data, int dtype, int64_t H, int64_t N, int64_t d) {
    return tensor3(data, dtype, H, N, d, N * d, d, 1);
}

/* ---- one synthetic cache in several dtypes / layouts --------------------- */

enum { LAYOUT_CONTIG, LAYOUT_TOKEN_MAJOR, LAYOUT_CHANNEL_STRIDED, LAYOUT_BATCH4 };

typedef struct {
    kvs_dense_cache dc; /* fp32 source */
    int L, Hkv, Hq, N, Nq, d;
    int dtype;     /* KVS_ABI_* of K/V/Q */
    int layout;
    void **k, **v, **q;   /* [L] storage in dtype and layout */
    kvs_layer *layers;    /* [L] core views on the same storage */
    kvs_cache_view view;
} cache;

static size_t esize(int dt) { return dt == KVS_ABI_F32 ? 4 : 2; }

static void put(void *dst, int dt, size_t i, float x) {
    if (dt == KVS_ABI_F32) ((float *)dst)[i] = x;
    else if (dt == KVS_ABI_F16) ((uint16_t *)dst)[i] = kvs_f32_to_f16(x);
    else ((uint16_t *)dst)[i] = kvs_f32_to_bf16(x);
}

/* Element strides of a [H][N][d] tensor stored in `layout`. */
static void layout_strides(int layout, int64_t H, int64_t N, int64_t d, int64_t s[3]) {
    switch (layout) {
    case LAYOUT_TOKEN_MAJOR: /* storage [N][H][d], as transformers' [B][N][H][d] transposed */
        s[0] = d, s[1] = H * d, s[2] = 1;
        break;
    case LAYOUT_CHANNEL_STRIDED: /* storage [H][d][N]: the channel stride is N */
        s[0] = d * N, s[1] = 1, s[2] = N;
        break;
    default: s[0] = N * d, s[1] = d, s[2] = 1; break;
    }
}

static void *store(const float *src, int dt, int layout, int H, int N, int d) {
    int64_t s[3];
    layout_strides(layout, H, N, d, s);
    void *dst = malloc(esize(dt) * (size_t)H * N * d);
    for (int h = 0; h < H; h++)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < d; c++)
                put(dst, dt, (size_t)(h * s[0] + n * s[1] + c * s[2]), src[((size_t)h * N + n) * d + c]);
    return dst;
}

static kvs_abi_tensor desc(const cache *c, const void *data, int H, int N) {
    int64_t s[3];
    layout_strides(c->layout, H, N, c->d, s);
    kvs_abi_tensor t = tensor3(data, c->dtype, H, N, c->d, s[0], s[1], s[2]);
    if (c->layout == LAYOUT_BATCH4) {
        t.ndim = 4;
        for (int i = 3; i > 0; i--) t.shape[i] = t.shape[i - 1], t.strides[i] = t.strides[i - 1];
        t.shape[0] = 1, t.strides[0] = (int64_t)H * N * c->d;
    }
    return t;
}

static kvs_dtype core_dtype(int dt) { return dt == KVS_ABI_F32 ? KVS_F32 : dt == KVS_ABI_F16 ? KVS_F16 : KVS_BF16; }

static int cache_make(cache *c, int N, int Nq, double image_frac, int dtype, int layout, uint64_t seed) {
    kvs_err err;
    kvs_err_clear(&err);
    memset(c, 0, sizeof *c);
    kvs_synth_config cfg;
    if (kvs_synth_preset("tiny", &cfg, &err)) return 1;
    cfg.n_tokens = N;
    cfg.n_queries = Nq;
    cfg.image_frac = image_frac;
    cfg.seed = seed;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_generate(&cfg, &c->dc, NULL, NULL, &err), ep(&err));
    if (err.code) return 1;
    c->L = c->dc.n_layers;
    c->Hkv = c->dc.layers[0].n_kv_heads;
    c->Hq = c->dc.layers[0].n_q_heads;
    c->N = N;
    c->Nq = c->dc.layers[0].n_queries;
    c->d = c->dc.layers[0].head_dim;
    c->dtype = dtype;
    c->layout = layout;
    c->k = calloc((size_t)c->L, sizeof *c->k);
    c->v = calloc((size_t)c->L, sizeof *c->v);
    c->q = calloc((size_t)c->L, sizeof *c->q);
    c->layers = calloc((size_t)c->L, sizeof *c->layers);
    for (int l = 0; l < c->L; l++) {
        const kvs_dense_layer *dl = &c->dc.layers[l];
        /* Core reads the same values contiguously (layout is the ABI's business). */
        c->k[l] = store(dl->k, dtype, layout, c->Hkv, N, c->d);
        c->v[l] = store(dl->v, dtype, layout, c->Hkv, N, c->d);
        void *kc = store(dl->k, dtype, LAYOUT_CONTIG, c->Hkv, N, c->d);
        void *vc = store(dl->v, dtype, LAYOUT_CONTIG, c->Hkv, N, c->d);
        c->layers[l].k = kvs_view_make(kc, core_dtype(dtype), c->Hkv, N, c->d);
        c->layers[l].v = kvs_view_make(vc, core_dtype(dtype), c->Hkv, N, c->d);
        if (c->Nq > 0) {
            c->q[l] = store(dl->q, dtype, layout, c->Hq, c->Nq, c->d);
            void *qc = store(dl->q, dtype, LAYOUT_CONTIG, c->Hq, c->Nq, c->d);
            c->layers[l].q = kvs_view_make(qc, core_dtype(dtype), c->Hq, c->Nq, c->d);
        }
    }
    c->view.n_layers = c->L;
    c->view.layers = c->layers;
    c->view.modality = c->dc.modality;
    return 0;
}

static void cache_free(cache *c) {
    for (int l = 0; l < c->L; l++) {
        free(c->k[l]);
        free(c->v[l]);
        free(c->q[l]);
        free((void *)c->layers[l].k.data);
        free((void *)c->layers[l].v.data);
        free((void *)c->layers[l].q.data);
    }
    free(c->k);
    free(c->v);
    free(c->q);
    free(c->layers);
    kvs_dense_cache_free(&c->dc);
}

static void feed(kvs_abi_ctx *ctx, const cache *c, int with_q) {
    ABI_OK(ctx, kvs_abi_cache_begin(ctx, c->L));
    for (int l = 0; l < c->L; l++) {
        kvs_abi_tensor k = desc(c, c->k[l], c->Hkv, c->N), v = desc(c, c->v[l], c->Hkv, c->N);
        kvs_abi_tensor q = with_q && c->Nq > 0 ? desc(c, c->q[l], c->Hq, c->Nq) : k;
        ABI_OK(ctx, kvs_abi_cache_layer(ctx, l, &k, &v, with_q && c->Nq > 0 ? &q : NULL));
    }
    if (c->dc.modality) {
        kvs_abi_tensor m = KVS_ABI_INIT(kvs_abi_tensor);
        m.dtype = KVS_ABI_U8;
        m.data = c->dc.modality;
        m.ndim = 1;
        m.shape[0] = c->N;
        m.strides[0] = 1;
        ABI_OK(ctx, kvs_abi_cache_modality(ctx, &m));
    }
}

/* ---- the comparison of one (cache, method, budget) ----------------------- */

static void compare_one(kvs_abi_ctx *ctx, const cache *c, const kvs_method *m, const kvs_budget *kb,
                        const char *pname, const char *pvalue) {
    kvs_err err;
    kvs_err_clear(&err);
    kvs_params params;
    kvs_params_defaults(m, &params);
    if (pname) CHECK_OK(kvs_params_set(m, &params, pname, pvalue, &err), ep(&err));
    kvs_plan ref = {0};
    const kvs_status rst = kvs_compress(m, &params, &c->view, kb, 1, &ref, &err);

    const char *names[1] = {pname}, *values[1] = {pvalue};
    kvs_abi_method_spec spec = KVS_ABI_INIT(kvs_abi_method_spec);
    spec.method = m->name;
    spec.n_params = pname ? 1 : 0;
    spec.param_names = names;
    spec.param_values = values;
    kvs_abi_budget b = KVS_ABI_INIT(kvs_abi_budget);
    b.ratio = kb->ratio;
    b.tokens = kb->tokens;
    kvs_abi_plan *p = NULL;
    const int ast = kvs_abi_compress(ctx, &spec, &b, &p);
    CHECK_MSG(ast == (int)rst, "%s dtype %d layout %d: ABI status %d (%s), core %d (%s)", m->name, c->dtype,
              c->layout, ast, kvs_abi_last_error(ctx), (int)rst, err.msg);
    if (m->needs & KVS_NEED_W_O)
        CHECK_MSG(ast != 0 && strstr(kvs_abi_last_error(ctx), "output projection W_o"),
                  "%s: a context without W_o was not refused by name: %s", m->name, kvs_abi_last_error(ctx));
    if (m->needs & KVS_NEED_RECON) /* kvzip: a context has no reconstruction pass */
        CHECK_MSG(ast != 0 && strstr(kvs_abi_last_error(ctx), "context-reconstruction statistic") &&
                      strstr(kvs_abi_last_error(ctx), m->name),
                  "%s: a context without the reconstruction statistic was not refused by name: %s", m->name,
                  kvs_abi_last_error(ctx));
    if (rst != KVS_OK || ast != 0) {
        /* Same failure, same message (the ABI adds nothing to core's). */
        if (rst != KVS_OK && ast != 0) CHECK_MSG(strcmp(kvs_abi_last_error(ctx), err.msg) == 0, "'%s' vs '%s'",
                                                 kvs_abi_last_error(ctx), err.msg);
        kvs_plan_free(&ref);
        kvs_abi_plan_free(p);
        return;
    }
    n_compared++;
    kvs_abi_plan_info info = KVS_ABI_INIT(kvs_abi_plan_info);
    ABI_OK(ctx, kvs_abi_plan_get_info(ctx, p, &info));
    CHECK_EQ_INT(info.n_layers, ref.n_layers);
    CHECK_EQ_INT(info.n_kv_heads, ref.n_kv_heads);
    CHECK_EQ_INT(info.n_tokens, ref.n_tokens);
    CHECK_EQ_INT(info.merge, ref.merge);
    CHECK_EQ_INT(info.total_kept, kvs_plan_total(&ref));
    CHECK_EQ_INT(info.device, KVS_ABI_HOST);
    CHECK(strcmp(info.method, m->name) == 0);
    CHECK(strcmp(info.merge_name, kvs_merge_name(ref.merge)) == 0);
    CHECK(strcmp(info.note, ref.note) == 0);

    int32_t budgets[64];
    ABI_OK(ctx, kvs_abi_plan_budgets(ctx, p, budgets, 64));
    for (int l = 0; l < ref.n_layers; l++) {
        const int B = ref.layers[l].budget, H = ref.n_kv_heads;
        CHECK_EQ_INT(budgets[l], B);
        /* per-head counts (every plan) and, for a ragged layer, head by head */
        int32_t hc[64];
        ABI_OK(ctx, kvs_abi_plan_head_counts(ctx, p, l, hc, 64));
        for (int h = 0; h < H; h++) {
            int Bh;
            const int32_t *row = kvs_plan_head(&ref, l, h, &Bh);
            CHECK_EQ_INT(hc[h], Bh);
            if (!ref.layers[l].counts) continue;
            int64_t *hi = malloc(sizeof(int64_t) * (size_t)Bh);
            kvs_abi_tensor th = KVS_ABI_INIT(kvs_abi_tensor);
            th.dtype = KVS_ABI_I64, th.data = hi, th.ndim = 1, th.shape[0] = Bh, th.strides[0] = 1;
            ABI_OK(ctx, kvs_abi_plan_head_indices(ctx, p, l, h, &th));
            int same = 1;
            for (int i = 0; i < Bh; i++) same &= hi[i] == row[i];
            CHECK_MSG(same, "%s layer %d head %d: head indices differ", m->name, l, h);
            free(hi);
        }
        if (ref.layers[l].counts) {
            n_ragged++;
            kvs_abi_tensor tr = KVS_ABI_INIT(kvs_abi_tensor);
            int32_t dummy[1];
            tr.dtype = KVS_ABI_I32, tr.data = dummy, tr.ndim = 2, tr.shape[0] = H, tr.shape[1] = B;
            tr.strides[0] = B, tr.strides[1] = 1;
            ABI_FAILS(ctx, kvs_abi_plan_indices(ctx, p, l, &tr), KVS_ABI_ERR_UNSUPPORTED, "kvs_abi_plan_head_indices");
            continue;
        }
        int32_t *i32 = malloc(sizeof(int32_t) * (size_t)H * B);
        int64_t *i64 = malloc(sizeof(int64_t) * (size_t)H * B * 2);
        kvs_abi_tensor t = KVS_ABI_INIT(kvs_abi_tensor);
        t.dtype = KVS_ABI_I32, t.data = i32, t.ndim = 2;
        t.shape[0] = H, t.shape[1] = B, t.strides[0] = B, t.strides[1] = 1;
        ABI_OK(ctx, kvs_abi_plan_indices(ctx, p, l, &t));
        CHECK_MSG(memcmp(i32, ref.layers[l].idx, sizeof(int32_t) * (size_t)H * B) == 0,
                  "%s layer %d: indices differ", m->name, l);
        /* I64, [1][H][B], every other element (strided output) */
        kvs_abi_tensor t64 = KVS_ABI_INIT(kvs_abi_tensor);
        t64.dtype = KVS_ABI_I64, t64.data = i64, t64.ndim = 3;
        t64.shape[0] = 1, t64.shape[1] = H, t64.shape[2] = B;
        t64.strides[0] = 2 * H * B, t64.strides[1] = 2 * B, t64.strides[2] = 2;
        ABI_OK(ctx, kvs_abi_plan_indices(ctx, p, l, &t64));
        int same = 1;
        for (int i = 0; i < H * B; i++) same &= i64[2 * i] == ref.layers[l].idx[i];
        CHECK_MSG(same, "%s layer %d: I64 indices differ", m->name, l);
        free(i32);
        free(i64);
    }
    /* JSON: the same text as kvs_plan_to_json (what `kvsieve compress --plan` writes). */
    size_t len = 0;
    ABI_OK(ctx, kvs_abi_plan_json(ctx, p, NULL, 0, &len));
    char *json = malloc(len);
    ABI_FAILS(ctx, kvs_abi_plan_json(ctx, p, json, len - 1, &len), KVS_ABI_ERR_INVALID, "need");
    ABI_OK(ctx, kvs_abi_plan_json(ctx, p, json, len, &len));
    char *rj = kvs_plan_to_json(&ref, m, &params);
    CHECK_MSG(rj && strcmp(json, rj) == 0, "%s: plan JSON differs", m->name);
    free(rj);
    free(json);

    /* Apply: fp32 equals kvs_apply bit for bit; the input dtype equals its
     * conversion; a [B][H][d] (token-major) strided output equals too. */
    kvs_dense_cache ap = {0};
    CHECK_OK(kvs_apply(&c->view, &ref, &ap, &err), ep(&err));
    for (int l = 0; l < ref.n_layers && ap.layers; l++) {
        const int B = ref.layers[l].budget, H = ref.n_kv_heads, d = c->d;
        const size_t n = (size_t)H * B * d;
        if (ref.layers[l].counts) { /* ragged: kvs_abi_apply refuses, kvs_abi_apply_head per head */
            float *ko = malloc(4 * n), *vo = malloc(4 * n);
            kvs_abi_tensor kt = contig3(ko, KVS_ABI_F32, H, B, d), vt = contig3(vo, KVS_ABI_F32, H, B, d);
            ABI_FAILS(ctx, kvs_abi_apply(ctx, p, l, &kt, &vt), KVS_ABI_ERR_UNSUPPORTED, "kvs_abi_apply_head");
            for (int h = 0; h < H; h++) {
                int Bh;
                const int64_t off = kvs_dense_head(&ap.layers[l], h, &Bh);
                kvs_abi_tensor kh = contig3(ko, KVS_ABI_F32, 1, Bh, d), vh = contig3(vo, KVS_ABI_F32, 1, Bh, d);
                ABI_OK(ctx, kvs_abi_apply_head(ctx, p, l, h, &kh, &vh));
                CHECK_MSG(memcmp(ko, ap.layers[l].k + off * d, 4 * (size_t)Bh * d) == 0 &&
                              memcmp(vo, ap.layers[l].v + off * d, 4 * (size_t)Bh * d) == 0,
                          "%s layer %d head %d: apply_head differs from kvs_apply", m->name, l, h);
                int32_t *map = malloc(sizeof(int32_t) * (size_t)c->N);
                kvs_abi_tensor mt = KVS_ABI_INIT(kvs_abi_tensor);
                mt.dtype = KVS_ABI_I32, mt.data = map, mt.ndim = 1, mt.shape[0] = c->N, mt.strides[0] = 1;
                ABI_OK(ctx, kvs_abi_plan_merge_map(ctx, p, l, h, &mt));
                const int32_t *kept = kvs_plan_head(&ref, l, h, NULL);
                int ok = 1;
                for (int i = 0; i < Bh; i++) ok &= map[kept[i]] == -1;
                CHECK_MSG(ok, "%s layer %d head %d: merge map misses a kept token", m->name, l, h);
                free(map);
            }
            free(ko);
            free(vo);
            continue;
        }
        float *ko = malloc(4 * n), *vo = malloc(4 * n);
        kvs_abi_tensor kt = contig3(ko, KVS_ABI_F32, H, B, d), vt = contig3(vo, KVS_ABI_F32, H, B, d);
        ABI_OK(ctx, kvs_abi_apply(ctx, p, l, &kt, &vt));
        CHECK_MSG(memcmp(ko, ap.layers[l].k, 4 * n) == 0 && memcmp(vo, ap.layers[l].v, 4 * n) == 0,
                  "%s layer %d: apply (F32) differs from kvs_apply", m->name, l);
        if (c->dtype != KVS_ABI_F32) {
            uint16_t *k16 = malloc(2 * n), *v16 = malloc(2 * n);
            kvs_abi_tensor k2 = tensor3(k16, c->dtype, H, B, d, d, (int64_t)H * d, 1);
            kvs_abi_tensor v2 = tensor3(v16, c->dtype, H, B, d, d, (int64_t)H * d, 1);
            ABI_OK(ctx, kvs_abi_apply(ctx, p, l, &k2, &v2));
            int same = 1;
            for (int h = 0; h < H; h++)
                for (int bb = 0; bb < B; bb++)
                    for (int cc = 0; cc < d; cc++) {
                        const size_t src = ((size_t)h * B + bb) * d + cc, dst = ((size_t)bb * H + h) * d + cc;
                        const float kx = ap.layers[l].k[src], vx = ap.layers[l].v[src];
                        const uint16_t ke = c->dtype == KVS_ABI_F16 ? kvs_f32_to_f16(kx) : kvs_f32_to_bf16(kx);
                        const uint16_t ve = c->dtype == KVS_ABI_F16 ? kvs_f32_to_f16(vx) : kvs_f32_to_bf16(vx);
                        same &= k16[dst] == ke && v16[dst] == ve;
                    }
            CHECK_MSG(same, "%s layer %d: apply in dtype %d differs", m->name, l, c->dtype);
            if (ref.merge == KVS_MERGE_NONE) {
                /* A plain gather in the input dtype is exact: the kept rows' bits (key
                 * channels a plan prunes, ThinK's, are zeros). */
                const uint16_t *src = c->layers[l].k.data;
                int exact = 1;
                for (int h = 0; h < H; h++)
                    for (int bb = 0; bb < B; bb++)
                        for (int cc = 0; cc < d; cc++) {
                            const int pruned = ref.kchan && !ref.kchan[((size_t)l * H + h) * d + cc];
                            exact &= k16[((size_t)bb * H + h) * d + cc] ==
                                     (pruned ? 0 : src[((size_t)h * c->N + ref.layers[l].idx[(size_t)h * B + bb]) * d + cc]);
                        }
                CHECK_MSG(exact, "%s layer %d: gather in dtype %d is not exact", m->name, l, c->dtype);
            }
            free(k16);
            free(v16);
        }
        /* The merge map of head 1 against core's assignment. */
        const int head = H > 1 ? 1 : 0;
        int32_t *map = malloc(sizeof(int32_t) * (size_t)c->N), *want = malloc(sizeof(int32_t) * (size_t)c->N);
        kvs_abi_tensor mt = KVS_ABI_INIT(kvs_abi_tensor);
        mt.dtype = KVS_ABI_I32, mt.data = map, mt.ndim = 1, mt.shape[0] = c->N, mt.strides[0] = 1;
        ABI_OK(ctx, kvs_abi_plan_merge_map(ctx, p, l, head, &mt));
        const int32_t *kept = ref.layers[l].idx + (size_t)head * B;
        if (ref.merge == KVS_MERGE_NONE) {
            for (int i = 0; i < c->N; i++) want[i] = -2;
            for (int i = 0; i < B; i++) want[kept[i]] = -1;
        } else {
            CHECK_OK(kvs_merge_assign(&c->layers[l].k, head, kept, B, want, &err), ep(&err));
        }
        CHECK_MSG(memcmp(map, want, sizeof(int32_t) * (size_t)c->N) == 0, "%s layer %d: merge map differs",
                  m->name, l);
        free(map);
        free(want);
        free(ko);
        free(vo);
    }
    kvs_dense_cache_free(&ap);
    kvs_plan_free(&ref);
    kvs_abi_plan_free(p);
}

/* Registered methods that need an input a context cannot hold: each layer's
 * W_o (KVS_NEED_W_O) or the context-reconstruction statistic (KVS_NEED_RECON). */
static int n_need_wo(void) {
    int n = 0;
    for (int i = 0; i < kvs_methods_count(); i++)
        n += (kvs_method_at(i)->needs & (KVS_NEED_W_O | KVS_NEED_RECON)) != 0;
    return n;
}

static void test_plans_equal(void) {
    const int dtypes[3] = {KVS_ABI_F32, KVS_ABI_F16, KVS_ABI_BF16};
    const int layouts[4] = {LAYOUT_CONTIG, LAYOUT_TOKEN_MAJOR, LAYOUT_CHANNEL_STRIDED, LAYOUT_BATCH4};
    for (int di = 0; di < 3; di++)
        for (int li = 0; li < 4; li++) {
            cache c;
            const int N = 80 + 17 * di;
            if (cache_make(&c, N, N, li % 2 ? 0.3 : 0.0, dtypes[di], layouts[li], 11 + (uint64_t)di)) return;
            kvs_abi_ctx_opts o = KVS_ABI_INIT(kvs_abi_ctx_opts);
            o.threads = 1 + li % 3; /* results do not depend on the thread count */
            kvs_abi_ctx *ctx = NULL;
            char e[256];
            CHECK(kvs_abi_ctx_new(&o, &ctx, e, sizeof e) == 0);
            feed(ctx, &c, 1);
            kvs_abi_stats st = KVS_ABI_INIT(kvs_abi_stats);
            ABI_OK(ctx, kvs_abi_ctx_stats(ctx, &st));
            CHECK_EQ_INT(st.tensors_fed, 3 * c.L);
            /* Only the channel-strided layout needs copies (K, V, Q of every layer). */
            const int copies = layouts[li] == LAYOUT_CHANNEL_STRIDED ? 3 * c.L : 0;
            CHECK_EQ_INT(st.tensors_copied, copies);
            const int64_t bytes = (int64_t)c.L * (2 * c.Hkv * c.N + c.Hq * c.Nq) * c.d * (int64_t)esize(c.dtype);
            CHECK_EQ_INT(st.bytes_copied, copies ? bytes : 0);
            for (int mi = 0; mi < kvs_methods_count(); mi++) {
                const kvs_method *m = kvs_method_at(mi);
                const kvs_budget r = {.ratio = 0.25}, t = {.tokens = 17};
                compare_one(ctx, &c, m, &r, NULL, NULL);
                compare_one(ctx, &c, m, &t, NULL, NULL);
            }
            const kvs_budget r = {.ratio = 0.3};
            compare_one(ctx, &c, kvs_method_find("flashcache"), &r, "granularity", "layer");
            compare_one(ctx, &c, kvs_method_find("snapkv"), &r, "window", "8");
            compare_one(ctx, &c, kvs_method_find("lookm"), &r, "merge", "average");
            ABI_OK(ctx, kvs_abi_ctx_stats(ctx, &st));
            CHECK(st.compress_calls >= 2 * (kvs_methods_count() - n_need_wo()));
            CHECK(st.apply_calls > 0);
            kvs_abi_ctx_free(ctx);
            cache_free(&c);
        }
    /* Every case compressed (the caches carry all queries) but the methods
     * that need W_o or the reconstruction pass, which a context has not
     * (refused by core and ABI with one message, compare_one): 3 dtypes x 4 layouts x (2 budgets per
     * method + 3 parameter cases). */
    CHECK(n_need_wo() > 0);
    CHECK_EQ_INT(n_compared, 3 * 4 * (2 * (kvs_methods_count() - n_need_wo()) + 3));
    /* adakv / ada_pyramidkv made ragged layers, read through the per-head accessors */
    CHECK_MSG(n_ragged > 0, "no ragged plan layer was checked");
}

/* ---- version, listing, queries ------------------------------------------- */

static void test_facts(void) {
    int32_t a = -1, b = -1, c = -1;
    kvs_abi_version(&a, &b, &c);
    CHECK(a == KVS_ABI_VERSION_MAJOR && b == KVS_ABI_VERSION_MINOR && c == KVS_ABI_VERSION_PATCH);
    kvs_abi_version(NULL, NULL, NULL);
    CHECK(strncmp(kvs_abi_build_info(), "1.0.0 (kvsieve ", 15) == 0);
    CHECK(strcmp(kvs_abi_status_name(KVS_ABI_ERR_NOTFOUND), kvs_status_name(KVS_ERR_NOTFOUND)) == 0);
    CHECK(strcmp(kvs_abi_status_name(99), "unknown") == 0);

    char e[512];
    size_t len = 0;
    CHECK(kvs_abi_methods_json(NULL, 0, &len, e, sizeof e) == 0 && len > 10);
    char *buf = malloc(len);
    CHECK(kvs_abi_methods_json(buf, len - 1, &len, e, sizeof e) == KVS_ABI_ERR_INVALID && strstr(e, "need"));
    CHECK(kvs_abi_methods_json(buf, len, &len, e, sizeof e) == 0 && e[0] == 0);
    cJSON *j = cJSON_Parse(buf);
    CHECK(cJSON_IsArray(j) && cJSON_GetArraySize(j) == kvs_methods_count());
    for (int i = 0; i < kvs_methods_count() && j; i++) {
        const kvs_method *m = kvs_method_at(i);
        cJSON *o = cJSON_GetArrayItem(j, i);
        CHECK(strcmp(cJSON_GetObjectItem(o, "name")->valuestring, m->name) == 0);
        cJSON *ps = cJSON_GetObjectItem(o, "params");
        CHECK_EQ_INT(cJSON_GetArraySize(ps), m->n_params);
        for (int k = 0; k < m->n_params; k++)
            CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(ps, k), "name")->valuestring, m->params[k].name) == 0);
        CHECK(cJSON_IsBool(cJSON_GetObjectItem(o, "keeps_all")));
    }
    cJSON_Delete(j);
    free(buf);

    kvs_abi_method_spec s = KVS_ABI_INIT(kvs_abi_method_spec);
    int64_t q = -1;
    const char *wn[1] = {"window"}, *wv[1] = {"8"};
    s.method = "snapkv", s.n_params = 1, s.param_names = wn, s.param_values = wv;
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == 0 && q == 8);
    s.n_params = 0, s.method = "h2o";
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == 0 && q == 100);
    s.method = "flashcache";
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == 0 && q == 0);
    s.method = "snapk";
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == KVS_ABI_ERR_NOTFOUND && strstr(e, "did you mean 'snapkv'"));
    s.method = "snapkv", s.n_params = 1, wn[0] = "windw";
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) != 0 && strstr(e, "window"));
    s.struct_size = 4;
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == KVS_ABI_ERR_INVALID && strstr(e, "struct_size 4"));
    /* A tiny error buffer is truncated, never overrun. */
    char tiny[8];
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, tiny, sizeof tiny) != 0 && strlen(tiny) == 7);

    int32_t n = -1;
    const int cuda = kvs_abi_cuda_devices(&n, e, sizeof e);
    if (strstr(kvs_abi_build_info(), "cuda: no")) CHECK(cuda == KVS_ABI_ERR_UNSUPPORTED && n == 0 && strstr(e, "built without CUDA"));
    else CHECK((cuda == 0 && n >= 1) || (cuda == KVS_ABI_ERR_UNSUPPORTED && n == 0));
}

/* ---- errors ----------------------------------------------------------------- */

static void test_errors(void) {
    cache c;
    if (cache_make(&c, 64, 8, 0.25, KVS_ABI_F32, LAYOUT_CONTIG, 5)) return;
    kvs_abi_ctx *ctx = NULL, *other = NULL;
    char e[256];
    CHECK(kvs_abi_ctx_new(NULL, &ctx, e, sizeof e) == 0 && ctx);
    CHECK(kvs_abi_ctx_new(NULL, &other, e, sizeof e) == 0 && other);
    CHECK(strcmp(kvs_abi_last_error(NULL), "no context") == 0);
    kvs_abi_ctx_opts small = {.struct_size = 2};
    kvs_abi_ctx *x = NULL;
    CHECK(kvs_abi_ctx_new(&small, &x, e, sizeof e) == KVS_ABI_ERR_INVALID && !x && strstr(e, "struct_size 2"));

    const int H = c.Hkv, N = c.N, d = c.d;
    kvs_abi_tensor k = contig3(c.k[0], KVS_ABI_F32, H, N, d), v = contig3(c.v[0], KVS_ABI_F32, H, N, d);
    kvs_abi_tensor q = contig3(c.q[0], KVS_ABI_F32, c.Hq, c.Nq, d);
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &v, NULL), KVS_ABI_ERR_INVALID, "kvs_abi_cache_begin first");
    ABI_FAILS(ctx, kvs_abi_cache_begin(ctx, 0), KVS_ABI_ERR_INVALID, "n_layers = 0");
    ABI_OK(ctx, kvs_abi_cache_begin(ctx, 2));
    CHECK(strcmp(kvs_abi_last_error(ctx), "") == 0);
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 2, &k, &v, NULL), KVS_ABI_ERR_INVALID, "layer 2 outside [0, 2)");
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 1, &k, NULL, NULL), KVS_ABI_ERR_INVALID, "layer 1: v is NULL");
    kvs_abi_tensor bad = k;
    bad.dtype = KVS_ABI_I32;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 1, &bad, &v, NULL), KVS_ABI_ERR_INVALID, "layer 1: k: dtype I32 (need F32, F16 or BF16)");
    bad = v, bad.shape[1] = N - 1;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &bad, NULL), KVS_ABI_ERR_INVALID,
              "layer 0: v: shape [2][63][16] differs from k's [2][64][16]");
    bad = k, bad.ndim = 4, bad.shape[3] = d, bad.shape[2] = N, bad.shape[1] = H, bad.shape[0] = 2;
    bad.strides[3] = 1, bad.strides[2] = d, bad.strides[1] = (int64_t)N * d, bad.strides[0] = (int64_t)H * N * d;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &bad, &v, NULL), KVS_ABI_ERR_INVALID, "layer 0: k: shape [2][2][64][16] has batch 2");
    bad = k, bad.ndim = 2;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &bad, &v, NULL), KVS_ABI_ERR_INVALID, "layer 0: k: ndim 2");
    bad = k, bad.struct_size = 8;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &bad, &v, NULL), KVS_ABI_ERR_INVALID, "layer 0: k: struct_size 8");
    bad = k, bad.data = NULL;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &bad, &v, NULL), KVS_ABI_ERR_INVALID, "layer 0: k: data is NULL");
    bad = q, bad.shape[2] = 8;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &v, &bad), KVS_ABI_ERR_INVALID, "layer 0: q: head_dim 8 differs");
    bad = q, bad.shape[0] = 3;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &v, &bad), KVS_ABI_ERR_INVALID, "layer 0: q: 3 query heads");
    kvs_abi_tensor vc = v;
    vc.device = KVS_ABI_CUDA;
    if (strstr(kvs_abi_build_info(), "cuda: no"))
        ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &vc, NULL), KVS_ABI_ERR_UNSUPPORTED,
                  "layer 0: v: CUDA tensor (device 0), but libkvsieve was built without CUDA");
    else
        ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 0, &k, &vc, NULL), KVS_ABI_ERR_INVALID, "layer 0: v: on CUDA device 0, but k is on host");

    /* Compress-time checks: a layer never set, N across layers, modality. */
    kvs_abi_method_spec spec = KVS_ABI_INIT(kvs_abi_method_spec);
    spec.method = "snapkv";
    kvs_abi_budget b = KVS_ABI_INIT(kvs_abi_budget);
    b.ratio = 0.25;
    kvs_abi_plan *p = NULL;
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 0, &k, &v, &q));
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "layer 1 of 2 was not set");
    CHECK(p == NULL);
    kvs_abi_tensor k1 = contig3(c.k[1], KVS_ABI_F32, H, N - 4, d), v1 = contig3(c.v[1], KVS_ABI_F32, H, N - 4, d);
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 1, &k1, &v1, NULL));
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "layer 1");
    k1 = contig3(c.k[1], KVS_ABI_F32, H, N, d), v1 = contig3(c.v[1], KVS_ABI_F32, H, N, d);
    kvs_abi_tensor q1 = contig3(c.q[1], KVS_ABI_F32, c.Hq, c.Nq, d);
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 1, &k1, &v1, &q1));
    kvs_abi_tensor mod = KVS_ABI_INIT(kvs_abi_tensor);
    uint8_t mbuf[64] = {0};
    mod.dtype = KVS_ABI_U8, mod.data = mbuf, mod.ndim = 1, mod.shape[0] = 10, mod.strides[0] = 1;
    ABI_OK(ctx, kvs_abi_cache_modality(ctx, &mod));
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "modality: length 10, but the cache has N = 64");
    mbuf[5] = 7, mod.shape[0] = 64;
    ABI_FAILS(ctx, kvs_abi_cache_modality(ctx, &mod), KVS_ABI_ERR_INVALID, "modality: value 7 at position 5");
    mod.dtype = KVS_ABI_F32;
    ABI_FAILS(ctx, kvs_abi_cache_modality(ctx, &mod), KVS_ABI_ERR_INVALID, "modality: dtype F32");
    ABI_OK(ctx, kvs_abi_cache_modality(ctx, NULL));

    /* Method, parameter, budget and input errors are core's, named. */
    spec.method = "snapk";
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_NOTFOUND, "did you mean 'snapkv'");
    spec.method = "flashcache";
    const char *pn[1] = {"gamma"}, *pv[1] = {"2"};
    spec.n_params = 1, spec.param_names = pn, spec.param_values = pv;
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "gamma");
    spec.n_params = 0;
    b.ratio = 1.5;
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "ratio");
    b.ratio = 0.25, b.tokens = 3;
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "budget");
    b.tokens = 0;
    spec.method = "h2o";
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_INVALID, "needs the queries of all N=64");

    /* A NaN is named by layer, head and token. */
    float *k1data = c.k[1];
    const float saved = k1data[(size_t)1 * N * d + 7 * d + 3];
    k1data[(size_t)1 * N * d + 7 * d + 3] = NAN;
    spec.method = "flashcache";
    ABI_FAILS(ctx, kvs_abi_compress(ctx, &spec, &b, &p), KVS_ABI_ERR_NUMERIC, "layer 1");
    k1data[(size_t)1 * N * d + 7 * d + 3] = saved;

    /* Plans: accessors against the wrong context, outputs of the wrong shape
     * or dtype, a plan of an earlier cache. */
    ABI_OK(ctx, kvs_abi_compress(ctx, &spec, &b, &p));
    CHECK(p != NULL);
    kvs_abi_plan_info info = KVS_ABI_INIT(kvs_abi_plan_info);
    ABI_FAILS(other, kvs_abi_plan_get_info(other, p, &info), KVS_ABI_ERR_INVALID, "made by another context");
    info.struct_size = 16;
    ABI_FAILS(ctx, kvs_abi_plan_get_info(ctx, p, &info), KVS_ABI_ERR_INVALID, "struct_size 16");
    int32_t bud[1];
    ABI_FAILS(ctx, kvs_abi_plan_budgets(ctx, p, bud, 1), KVS_ABI_ERR_INVALID, "out holds 1, need 2");
    int32_t budgets[2];
    ABI_OK(ctx, kvs_abi_plan_budgets(ctx, p, budgets, 2));
    const int B0 = budgets[0];
    float *ko = malloc(sizeof(float) * (size_t)H * N * d), *vo = malloc(sizeof(float) * (size_t)H * N * d);
    kvs_abi_tensor kt = contig3(ko, KVS_ABI_F32, H, B0, d), vt = contig3(vo, KVS_ABI_F32, H, B0, d);
    kvs_abi_tensor wrong = contig3(ko, KVS_ABI_F32, H, B0 + 1, d);
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &wrong, &vt), KVS_ABI_ERR_INVALID,
              "layer 0: k_out: shape [2][");
    wrong = vt, wrong.dtype = KVS_ABI_I32;
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &kt, &wrong), KVS_ABI_ERR_INVALID, "layer 0: v_out: dtype I32 (need F32, F16, BF16)");
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 2, &kt, &vt), KVS_ABI_ERR_INVALID, "layer 2 outside [0, 2)");
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, -1, &kt, &vt), KVS_ABI_ERR_INVALID, "layer -1 outside [0, 2)");
    wrong = kt, wrong.device = KVS_ABI_CUDA;
    if (strstr(kvs_abi_build_info(), "cuda: yes"))
        ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &wrong, &vt), KVS_ABI_ERR_INVALID, "CUDA tensor, but the cache is host memory");
    kvs_abi_tensor it = KVS_ABI_INIT(kvs_abi_tensor);
    it.dtype = KVS_ABI_F32, it.data = ko, it.ndim = 2, it.shape[0] = H, it.shape[1] = B0, it.strides[0] = B0, it.strides[1] = 1;
    ABI_FAILS(ctx, kvs_abi_plan_indices(ctx, p, 0, &it), KVS_ABI_ERR_INVALID, "layer 0: indices out: dtype F32 (need I32, I64)");
    ABI_OK(ctx, kvs_abi_apply(ctx, p, 0, &kt, &vt));
    /* A layer set again with a shorter N: the plan no longer fits it. */
    kvs_abi_tensor ks = contig3(c.k[1], KVS_ABI_F32, H, N - 8, d), vs = contig3(c.v[1], KVS_ABI_F32, H, N - 8, d);
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 1, &ks, &vs, NULL));
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &kt, &vt), KVS_ABI_ERR_INVALID,
              "does not match layer 1 of the cache now (Hkv = 2, N = 56)");
    bad = ks, bad.dtype = KVS_ABI_I64;
    ABI_FAILS(ctx, kvs_abi_cache_layer(ctx, 1, &bad, &vs, NULL), KVS_ABI_ERR_INVALID, "layer 1: k: dtype I64");
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &kt, &vt), KVS_ABI_ERR_INVALID, "layer 1 of its cache was unset");
    ABI_OK(ctx, kvs_abi_cache_begin(ctx, 2));
    ABI_FAILS(ctx, kvs_abi_apply(ctx, p, 0, &kt, &vt), KVS_ABI_ERR_INVALID, "made from an earlier cache");
    /* The plan itself stays readable. */
    ABI_OK(ctx, kvs_abi_plan_get_info(ctx, p, &(kvs_abi_plan_info)KVS_ABI_INIT(kvs_abi_plan_info)));
    kvs_abi_plan_free(p);
    free(ko);
    free(vo);

    /* In-place reading: a [1][N][d] head slice with a junk head stride and
     * torch-like strides of size-1 dims needs no copy. */
    kvs_abi_ctx_free(ctx);
    CHECK(kvs_abi_ctx_new(NULL, &ctx, e, sizeof e) == 0);
    ABI_OK(ctx, kvs_abi_cache_begin(ctx, 1));
    kvs_abi_tensor one = tensor3(c.k[0], KVS_ABI_F32, 1, N, d, 12345, d, 1);
    kvs_abi_tensor onev = tensor3(c.v[0], KVS_ABI_F32, 1, N, d, 0, d, 1);
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 0, &one, &onev, NULL));
    /* An expand()ed tensor (token stride 0) is copied. */
    kvs_abi_tensor ex = tensor3(c.v[0], KVS_ABI_F32, 1, N, d, 0, 0, 1);
    ABI_OK(ctx, kvs_abi_cache_layer(ctx, 0, &one, &ex, NULL));
    kvs_abi_stats st = KVS_ABI_INIT(kvs_abi_stats);
    ABI_OK(ctx, kvs_abi_ctx_stats(ctx, &st));
    CHECK_EQ_INT(st.tensors_fed, 4);
    CHECK_EQ_INT(st.tensors_copied, 1);
    CHECK_EQ_INT(st.bytes_copied, (int64_t)N * d * 4);
    /* A struct smaller than the 1.0 one is refused, naming it; a larger one
     * (a newer caller) gets the 1.0 fields and the rest untouched. */
    kvs_abi_stats small_st = KVS_ABI_INIT(kvs_abi_stats);
    small_st.struct_size = 16;
    ABI_FAILS(ctx, kvs_abi_ctx_stats(ctx, &small_st), KVS_ABI_ERR_INVALID, "kvs_abi_ctx_stats: struct_size 16");
    struct {
        kvs_abi_stats s;
        int64_t later;
    } newer = {.s = {.struct_size = sizeof newer}, .later = -7};
    ABI_OK(ctx, kvs_abi_ctx_stats(ctx, &newer.s));
    CHECK_EQ_INT(newer.s.tensors_fed, 4);
    CHECK_EQ_INT(newer.s.struct_size, sizeof newer);
    CHECK_EQ_INT(newer.later, -7);

    kvs_abi_ctx_free(ctx);
    kvs_abi_ctx_free(other);
    kvs_abi_ctx_free(NULL);
    kvs_abi_plan_free(NULL);
    cache_free(&c);
}

/* ---- compositions ---------------------------------------------------------- */

/* A method given as a composition's JSON text (kvs_method_resolve): the same
 * plan as the preset it spells out (adakv: SnapKV votes, AdaKV heads, window
 * 32; head by head), its JSON written, its own parameters accepted, its errors named. */
static void test_composed(void) {
    cache c;
    if (cache_make(&c, 96, 96, 0.0, KVS_ABI_F32, LAYOUT_CONTIG, 23)) return;
    kvs_abi_ctx *ctx = NULL;
    char e[256];
    CHECK(kvs_abi_ctx_new(NULL, &ctx, e, sizeof e) == 0);
    feed(ctx, &c, 1);
    const char *desc = "{\"score\":\"snapkv\",\"allocate\":\"adakv\",\"keep\":{\"window\":32}}";
    kvs_abi_method_spec s = KVS_ABI_INIT(kvs_abi_method_spec), ps = KVS_ABI_INIT(kvs_abi_method_spec);
    s.method = desc, ps.method = "adakv";
    int64_t q = -1;
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == 0 && q == 32);
    kvs_abi_budget b = KVS_ABI_INIT(kvs_abi_budget);
    b.ratio = 0.25;
    kvs_abi_plan *pc = NULL, *pp = NULL;
    ABI_OK(ctx, kvs_abi_compress(ctx, &s, &b, &pc));
    ABI_OK(ctx, kvs_abi_compress(ctx, &ps, &b, &pp));
    for (int l = 0; pc && pp && l < c.L; l++) {
        int32_t hc[16], hp[16];
        ABI_OK(ctx, kvs_abi_plan_head_counts(ctx, pc, l, hc, c.Hkv));
        ABI_OK(ctx, kvs_abi_plan_head_counts(ctx, pp, l, hp, c.Hkv));
        for (int h = 0; h < c.Hkv; h++) {
            CHECK_EQ_INT(hc[h], hp[h]);
            int32_t ic[96], ip[96];
            kvs_abi_tensor tc = KVS_ABI_INIT(kvs_abi_tensor), tp = KVS_ABI_INIT(kvs_abi_tensor);
            tc.dtype = tp.dtype = KVS_ABI_I32, tc.ndim = tp.ndim = 1;
            tc.shape[0] = tp.shape[0] = hc[h], tc.strides[0] = tp.strides[0] = 1;
            tc.data = ic, tp.data = ip;
            ABI_OK(ctx, kvs_abi_plan_head_indices(ctx, pc, l, h, &tc));
            ABI_OK(ctx, kvs_abi_plan_head_indices(ctx, pp, l, h, &tp));
            CHECK(memcmp(ic, ip, sizeof(int32_t) * (size_t)hc[h]) == 0);
        }
    }
    size_t len = 0;
    ABI_OK(ctx, kvs_abi_plan_json(ctx, pc, NULL, 0, &len));
    CHECK(len > 2);
    kvs_abi_plan_free(pc);
    kvs_abi_plan_free(pp);
    const char *wn[1] = {"window"}, *wv[1] = {"0"};
    s.n_params = 1, s.param_names = wn, s.param_values = wv;
    CHECK(kvs_abi_compress(ctx, &s, &b, &pc) == KVS_ABI_ERR_INVALID && strstr(kvs_abi_last_error(ctx), "window"));
    s.n_params = 0, s.method = "{\"score\":\"snapkvv\"}";
    CHECK(kvs_abi_queries_wanted(&s, 100, &q, e, sizeof e) == KVS_ABI_ERR_NOTFOUND && strstr(e, "did you mean 'snapkv'"));
    kvs_abi_ctx_free(ctx);
    cache_free(&c);
}

int main(void) {
    test_facts();
    test_errors();
    test_plans_equal();
    test_composed();
    return kvs_test_finish("abi");
}
