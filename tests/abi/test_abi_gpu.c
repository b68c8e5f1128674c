/*
 * test_abi_gpu.c -- the CUDA path of the C ABI (abi/kvsieve_abi.h): a cache
 * of device tensors fed through kvs_abi_cache_layer gives the plan of
 * kernels' kvs_gpu_compress on the same device views, bit for bit (the ABI
 * only forwards: same kernels, deterministic), for every method and dtype;
 * indices copied into CUDA int64 tensors, the device apply and the merge map
 * equal kvs_gpu_apply_layer and kvs_gpu_merge_assign; device outputs that
 * the ABI refuses say why. Device-vs-CPU parity itself is tests/kernels'.
 * Without a device (or CUDA) it checks the absence is reported the
 * documented way and returns 77 (skipped). It has never run on a device
 * in the session that wrote it (no device was lent): its first device run
 * is its first real test.
 */
#include "kg_util.h"
#include "kvsieve_abi.h"

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

static int abi_dtype(kvs_dtype t) { return t == KVS_F32 ? KVS_ABI_F32 : t == KVS_F16 ? KVS_ABI_F16 : KVS_ABI_BF16; }

/* A device [1][H][N][d] contiguous descriptor. */
static kvs_abi_tensor dev4(void *p, int dtype, int64_t H, int64_t N, int64_t d) {
    kvs_abi_tensor t = KVS_ABI_INIT(kvs_abi_tensor);
    t.dtype = dtype, t.device = KVS_ABI_CUDA, t.device_index = 0, t.data = p, t.ndim = 4;
    t.shape[0] = 1, t.shape[1] = H, t.shape[2] = N, t.shape[3] = d;
    t.strides[0] = H * N * d, t.strides[1] = N * d, t.strides[2] = d, t.strides[3] = 1;
    return t;
}

static void run_dtype(const kvs_dense_cache *dc, kvs_dtype t) {
    kg_cache c;
    if (kg_cache_make(dc, t, &c)) {
        kvs_test_failures++;
        return;
    }
    kvs_err err;
    kvs_err_clear(&err);
    kvs_shape shape;
    CHECK_OK(kvs_cache_check_shape(&c.dev, &shape, &err), ep(&err));
    kvs_gpu_workspace *ws = NULL;
    CHECK_OK(kvs_gpu_workspace_init(&ws, &shape, &err), ep(&err));
    kvs_abi_ctx *ctx = NULL;
    char e[256];
    CHECK(kvs_abi_ctx_new(NULL, &ctx, e, sizeof e) == 0);
    if (!ws || !ctx) goto done;
    const int L = shape.n_layers, H = shape.n_kv_heads, N = shape.n_tokens, d = shape.head_dim;
    const int dt = abi_dtype(t);
    ABI_OK(ctx, kvs_abi_cache_begin(ctx, L));
    for (int l = 0; l < L; l++) {
        kvs_abi_tensor k = dev4(c.dk[l], dt, H, N, d), v = dev4(c.dv[l], dt, H, N, d);
        kvs_abi_tensor q = dev4(c.dq[l], dt, shape.n_q_heads, shape.n_queries, d);
        ABI_OK(ctx, kvs_abi_cache_layer(ctx, l, &k, &v, &q));
    }
    if (dc->modality) {
        kvs_abi_tensor m = KVS_ABI_INIT(kvs_abi_tensor);
        m.dtype = KVS_ABI_U8, m.data = dc->modality, m.ndim = 1, m.shape[0] = N, m.strides[0] = 1;
        ABI_OK(ctx, kvs_abi_cache_modality(ctx, &m));
    }
    /* A device tensor the kernels cannot read in place is refused, not copied. */
    {
        kvs_abi_tensor k = dev4(c.dk[0], dt, H, N, d), v = dev4(c.dv[0], dt, H, N, d);
        k.strides[3] = 2, k.shape[3] = d / 2;
        v.shape[3] = d / 2;
        kvs_abi_ctx *x = NULL;
        CHECK(kvs_abi_ctx_new(NULL, &x, e, sizeof e) == 0);
        ABI_OK(x, kvs_abi_cache_begin(x, 1));
        ABI_FAILS(x, kvs_abi_cache_layer(x, 0, &k, &v, NULL), KVS_ABI_ERR_UNSUPPORTED, "cannot be read in place");
        kvs_abi_ctx_free(x);
    }

    for (int mi = 0; mi < kvs_methods_count(); mi++) {
        const kvs_method *m = kvs_method_at(mi);
        kvs_params params;
        kvs_params_defaults(m, &params);
        const kvs_budget kb = {.ratio = 0.25};
        kvs_plan ref = {0};
        kvs_err_clear(&err);
        const kvs_status rst = kvs_gpu_compress(m->name, &params, &c.dev, &kb, ws, &ref, &err);
        kvs_abi_method_spec spec = KVS_ABI_INIT(kvs_abi_method_spec);
        spec.method = m->name;
        kvs_abi_budget b = KVS_ABI_INIT(kvs_abi_budget);
        b.ratio = 0.25;
        kvs_abi_plan *p = NULL;
        const int ast = kvs_abi_compress(ctx, &spec, &b, &p);
        CHECK_MSG(ast == (int)rst && rst == KVS_OK, "%s %s: ABI %d (%s), kernels %d (%s)", m->name,
                  kvs_dtype_name(t), ast, kvs_abi_last_error(ctx), (int)rst, err.msg);
        if (ast || rst) {
            kvs_plan_free(&ref);
            kvs_abi_plan_free(p);
            continue;
        }
        kvs_abi_plan_info info = KVS_ABI_INIT(kvs_abi_plan_info);
        ABI_OK(ctx, kvs_abi_plan_get_info(ctx, p, &info));
        CHECK_EQ_INT(info.device, KVS_ABI_CUDA);
        CHECK_EQ_INT(info.merge, ref.merge);
        size_t len = 0;
        ABI_OK(ctx, kvs_abi_plan_json(ctx, p, NULL, 0, &len));
        char *json = malloc(len);
        ABI_OK(ctx, kvs_abi_plan_json(ctx, p, json, len, &len));
        char *rj = kvs_plan_to_json(&ref, m, &params);
        CHECK_MSG(rj && !strcmp(json, rj), "%s %s: plan differs from kvs_gpu_compress's", m->name, kvs_dtype_name(t));
        free(json);
        free(rj);
        for (int l = 0; l < L; l++) {
            const int B = ref.layers[l].budget;
            const size_t nk = (size_t)H * B * d;
            /* indices into a CUDA int64 [H][B] tensor */
            void *didx = kg_alloc_poisoned(sizeof(int64_t) * (size_t)H * B);
            kvs_abi_tensor it = KVS_ABI_INIT(kvs_abi_tensor);
            it.dtype = KVS_ABI_I64, it.device = KVS_ABI_CUDA, it.data = didx, it.ndim = 2;
            it.shape[0] = H, it.shape[1] = B, it.strides[0] = B, it.strides[1] = 1;
            ABI_OK(ctx, kvs_abi_plan_indices(ctx, p, l, &it));
            int64_t *hidx = malloc(sizeof(int64_t) * (size_t)H * B);
            int same = !kg_download(hidx, didx, sizeof(int64_t) * (size_t)H * B);
            for (int i = 0; same && i < H * B; i++) same = hidx[i] == ref.layers[l].idx[i];
            CHECK_MSG(same, "%s layer %d: CUDA indices differ", m->name, l);
            free(hidx);
            kvs_gpu_free(didx);
            /* device apply against kvs_gpu_apply_layer */
            float *ak = kg_alloc_poisoned(4 * nk), *av = kg_alloc_poisoned(4 * nk);
            float *rk = kg_alloc_poisoned(4 * nk), *rv = kg_alloc_poisoned(4 * nk);
            kvs_abi_tensor kt = dev4(ak, KVS_ABI_F32, H, B, d), vt = dev4(av, KVS_ABI_F32, H, B, d);
            ABI_OK(ctx, kvs_abi_apply(ctx, p, l, &kt, &vt));
            CHECK_OK(kvs_gpu_apply_layer(ws, &c.dl[l], &ref, l, rk, rv, &err), ep(&err));
            CHECK_OK(kvs_gpu_sync(ws, &err), ep(&err));
            float *h[4];
            for (int i = 0; i < 4; i++) h[i] = malloc(4 * nk);
            kg_download(h[0], ak, 4 * nk), kg_download(h[1], av, 4 * nk);
            kg_download(h[2], rk, 4 * nk), kg_download(h[3], rv, 4 * nk);
            if (ref.merge == KVS_MERGE_NONE) {
                CHECK_MSG(!memcmp(h[0], h[2], 4 * nk) && !memcmp(h[1], h[3], 4 * nk), "%s layer %d: apply differs",
                          m->name, l);
            } else { /* the merge scatters with float atomics: order-dependent last bits */
                const double sk = kg_max_abs(h[2], nk), sv = kg_max_abs(h[3], nk);
                CHECK_MSG(kg_max_err(h[0], h[2], nk) <= 1e-5 * (sk > 1 ? sk : 1) &&
                              kg_max_err(h[1], h[3], nk) <= 1e-5 * (sv > 1 ? sv : 1),
                          "%s layer %d: merged apply differs", m->name, l);
            }
            for (int i = 0; i < 4; i++) free(h[i]);
            /* refused outputs: host memory, F16, non-contiguous */
            kvs_abi_tensor bad = kt;
            bad.device = KVS_ABI_HOST;
            ABI_FAILS(ctx, kvs_abi_apply(ctx, p, l, &bad, &vt), KVS_ABI_ERR_INVALID, "host tensor, but the cache is CUDA memory");
            bad = kt, bad.dtype = KVS_ABI_F16;
            ABI_FAILS(ctx, kvs_abi_apply(ctx, p, l, &bad, &vt), KVS_ABI_ERR_INVALID, "dtype F16 (need F32)");
            if (B > 1) {
                bad = kt, bad.strides[1] = (int64_t)B * d + 1;
                ABI_FAILS(ctx, kvs_abi_apply(ctx, p, l, &bad, &vt), KVS_ABI_ERR_UNSUPPORTED, "must be contiguous");
            }
            kvs_gpu_free(ak), kvs_gpu_free(av), kvs_gpu_free(rk), kvs_gpu_free(rv);
            /* merge map of head 0 */
            int32_t *map = malloc(sizeof(int32_t) * (size_t)N), *want = malloc(sizeof(int32_t) * (size_t)N);
            kvs_abi_tensor mt = KVS_ABI_INIT(kvs_abi_tensor);
            mt.dtype = KVS_ABI_I32, mt.data = map, mt.ndim = 1, mt.shape[0] = N, mt.strides[0] = 1;
            ABI_OK(ctx, kvs_abi_plan_merge_map(ctx, p, l, 0, &mt));
            if (ref.merge == KVS_MERGE_NONE) {
                for (int i = 0; i < N; i++) want[i] = -2;
                for (int i = 0; i < B; i++) want[ref.layers[l].idx[i]] = -1;
            } else {
                void *dk = kg_upload(ref.layers[l].idx, sizeof(int32_t) * (size_t)B);
                void *da = kg_alloc_poisoned(sizeof(int32_t) * (size_t)N);
                CHECK_OK(kvs_gpu_merge_assign(ws, &c.dl[l].k, 0, dk, B, da, &err), ep(&err));
                CHECK_OK(kvs_gpu_sync(ws, &err), ep(&err));
                kg_download(want, da, sizeof(int32_t) * (size_t)N);
                kvs_gpu_free(dk), kvs_gpu_free(da);
            }
            CHECK_MSG(!memcmp(map, want, sizeof(int32_t) * (size_t)N), "%s layer %d: merge map differs", m->name, l);
            free(map), free(want);
        }
        kvs_plan_free(&ref);
        kvs_abi_plan_free(p);
    }
done:
    kvs_abi_ctx_free(ctx);
    kvs_gpu_workspace_free(ws);
    kg_cache_free(&c);
}

int main(void) {
    /* Without a device the ABI must say so too. */
    char e[256];
    int32_t n = -1;
    const int have = kvs_abi_cuda_devices(&n, e, sizeof e);
    const int s = kg_device_or_skip("abi_gpu");
    if (s) {
        CHECK(have == KVS_ABI_ERR_UNSUPPORTED && n == 0 &&
              (strstr(e, "built without CUDA") || strstr(e, "no CUDA device")));
        return kvs_test_failures ? 1 : s;
    }
    CHECK(have == 0 && n >= 1);
    kvs_dense_cache dc = {0};
    if (kg_synth(2, 4, 2, 64, 300, 300, 0.3, kg_seed(), &dc)) return 1;
    const kvs_dtype ts[3] = {KVS_F16, KVS_BF16, KVS_F32};
    for (int i = 0; i < 3; i++) run_dtype(&dc, ts[i]);
    kvs_dense_cache_free(&dc);
    return kvs_test_finish("abi_gpu");
}
