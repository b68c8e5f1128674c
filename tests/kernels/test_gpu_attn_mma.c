/*
 * test_gpu_attn_mma.c -- both tensor-core kernels of the attention
 * statistics (kvs_gpu_workspace_attn_kernel: mma-reg and wmma-smem) against
 * the CPU reference (core's kvs_attn_lse / kvs_attn_colsum) for fp16 and
 * bf16 caches: N = 1, 17, 100, 333, 1000 (no tile multiple), Nq = N and
 * Nq = 32 < N, GQA groups 1 and 7 (2 KV heads), d = 40, 64, 128 (mma-reg,
 * 40 zero-padded to 64) and 136 (beyond mma-reg: the documented rule runs
 * wmma-smem, checked with kvs_gpu_attn_kernel_for), contiguous views, views
 * padded by 8 elements per row (NaN in the padding: a kernel reading it
 * fails) and by 4 (misaligned rows: wmma-smem by the rule). Fresh random
 * inputs (seed printed), outputs poisoned (NaN) before every run.
 * Tolerances: lse absolute 1e-3, colsum |gpu - cpu| <= 1e-3 |cpu| + 1e-6
 * max|cpu|. mma-reg colsum is run twice and must be bit-identical
 * (deterministic, no float atomics). Error paths: an unknown kernel
 * number; the query leaves the setting alone.
 * Without a CUDA device: checks the reported reason, prints SKIP, exits 77.
 * What it is not: no timing (tests/gpu/bench_overhead.c), no entropies
 * (test_gpu_kernels.c), no method plans (test_gpu_methods.c).
 */
#include "kg_util.h"

#include <math.h>

enum { HKV = 2, MAXN = 1000, MAXD = 136, MAXG = 7 };

/* A [H][N][d] view with row pitch d + pad on host and device; padding NaN. */
typedef struct {
    void *h, *d;
    kvs_view hv, dv;
} tview;

static void tview_free(tview *v) {
    free(v->h);
    kvs_gpu_free(v->d);
    memset(v, 0, sizeof *v);
}

static int tview_make(uint64_t *rng, kvs_dtype t, int H, int N, int d, int pad, double sigma,
                      tview *o) {
    memset(o, 0, sizeof *o);
    const int row = d + pad;
    const size_t n = (size_t)H * N * row;
    float *f = malloc(sizeof(float) * (n ? n : 1));
    if (!f) return 1;
    for (size_t i = 0; i < n; i++)
        f[i] = (int)(i % (size_t)row) < d ? (float)(sigma * kvs_rng_normal(rng)) : NAN;
    o->h = kg_convert(f, n, t);
    free(f);
    if (!o->h) return 1;
    o->d = kg_upload(o->h, n * kvs_dtype_size(t));
    if (!o->d) {
        tview_free(o);
        return 1;
    }
    o->hv = kvs_view_make(o->h, t, H, N, d);
    o->hv.s_tok = row;
    o->hv.s_head = (int64_t)N * row;
    o->dv = o->hv;
    o->dv.data = o->d;
    o->dv.device = KVS_CUDA;
    return 0;
}

/* number of j with |g - c| > rtol |c| + atol (NaN counts) */
static size_t colsum_bad(const float *g, const float *c, size_t n, double rtol, double atol,
                         size_t *first) {
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        if (!(fabs((double)g[j] - c[j]) <= rtol * fabs((double)c[j]) + atol)) {
            if (!bad) *first = j;
            bad++;
        }
    return bad;
}

static const char *kname(int k) {
    return k == KVS_GPU_ATTN_MMA ? "mma-reg" : k == KVS_GPU_ATTN_WMMA ? "wmma-smem" : "cuda-cores";
}

/* One shape: CPU reference once, then both kernels. */
static void run_case(kvs_gpu_workspace *ws, uint64_t *rng, kvs_dtype t, int G, int d, int N,
                     int Nq, int pad, double sigma) {
    const int Hq = HKV * G;
    char what[200];
    snprintf(what, sizeof what, "%s G=%d d=%d N=%d Nq=%d pad=%d sigma=%g", kvs_dtype_name(t), G,
             d, N, Nq, pad, sigma);
    tview q, k;
    if (tview_make(rng, t, Hq, Nq, d, pad, sigma, &q) || tview_make(rng, t, HKV, N, d, pad, sigma, &k)) {
        CHECK_MSG(0, "%s: out of memory", what);
        tview_free(&q);
        tview_free(&k);
        return;
    }
    const size_t nl = (size_t)Hq * Nq, nc = (size_t)HKV * N;
    float *lse = malloc(sizeof(float) * nl), *cs = malloc(sizeof(float) * nc);
    float *glse = malloc(sizeof(float) * nl), *gcs = malloc(sizeof(float) * nc);
    float *gcs2 = malloc(sizeof(float) * nc);
    float *dlse = kg_alloc_poisoned(sizeof(float) * nl), *dcs = kg_alloc_poisoned(sizeof(float) * nc);
    kvs_err err;
    kvs_err_clear(&err);
    if (!lse || !cs || !glse || !gcs || !gcs2 || !dlse || !dcs) {
        CHECK_MSG(0, "%s: out of memory", what);
        goto out;
    }
    CHECK_OK(kvs_attn_lse(&q.hv, &k.hv, lse, 8, &err), &err);
    CHECK_OK(kvs_attn_colsum(&q.hv, &k.hv, lse, cs, NULL, 8, &err), &err);
    double cmax = 0.0;
    for (size_t j = 0; j < nc; j++)
        if (fabs(cs[j]) > cmax) cmax = fabs(cs[j]);
    const int mma_ok = d % 8 == 0 && d <= 128 && pad % 8 == 0;
    for (int kern = KVS_GPU_ATTN_MMA; kern >= KVS_GPU_ATTN_WMMA; kern--) {
        int in_force = -1;
        CHECK_OK(kvs_gpu_workspace_attn_kernel(ws, kern, &in_force, &err), &err);
        CHECK_EQ_INT(in_force, kern);
        const int used = kvs_gpu_attn_kernel_for(ws, &q.dv, &k.dv);
        const int want = kern == KVS_GPU_ATTN_MMA && mma_ok ? KVS_GPU_ATTN_MMA : KVS_GPU_ATTN_WMMA;
        CHECK_MSG(used == want, "%s: asked %s, the rule says %s, kvs_gpu_attn_kernel_for says %s",
                  what, kname(kern), kname(want), kname(used));
        CHECK_OK(kvs_gpu_poison(dlse, sizeof(float) * nl, &err), &err);
        CHECK_OK(kvs_gpu_poison(dcs, sizeof(float) * nc, &err), &err);
        CHECK_OK(kvs_gpu_attn_lse(ws, &q.dv, &k.dv, dlse, &err), &err);
        CHECK_OK(kvs_gpu_attn_colsum(ws, &q.dv, &k.dv, dlse, dcs, &err), &err);
        CHECK_OK(kvs_gpu_sync(ws, &err), &err);
        CHECK(!kg_download(glse, dlse, sizeof(float) * nl) &&
              !kg_download(gcs, dcs, sizeof(float) * nc));
        const double el = kg_max_err(glse, lse, nl);
        CHECK_MSG(el <= 1e-3, "%s %s: lse max abs err %g", what, kname(used), el);
        size_t first = 0;
        const size_t bad = colsum_bad(gcs, cs, nc, 1e-3, 1e-6 * cmax, &first);
        CHECK_MSG(bad == 0, "%s %s: %zu colsum values off, first j=%zu: gpu %.9g cpu %.9g", what,
                  kname(used), bad, first, bad ? gcs[first] : 0.0, bad ? cs[first] : 0.0);
        if (used == KVS_GPU_ATTN_MMA) {
            /* determinism: the same result bit for bit on a fresh poisoned buffer */
            CHECK_OK(kvs_gpu_poison(dcs, sizeof(float) * nc, &err), &err);
            CHECK_OK(kvs_gpu_attn_colsum(ws, &q.dv, &k.dv, dlse, dcs, &err), &err);
            CHECK_OK(kvs_gpu_sync(ws, &err), &err);
            CHECK(!kg_download(gcs2, dcs, sizeof(float) * nc));
            CHECK_MSG(!memcmp(gcs, gcs2, sizeof(float) * nc), "%s: mma-reg colsum not reproducible",
                      what);
        }
    }
out:
    kvs_gpu_free(dlse);
    kvs_gpu_free(dcs);
    free(lse);
    free(cs);
    free(glse);
    free(gcs);
    free(gcs2);
    tview_free(&q);
    tview_free(&k);
}

static void test_parity(kvs_gpu_workspace *ws, uint64_t *rng) {
    const kvs_dtype dts[2] = {KVS_F16, KVS_BF16};
    const int Gs[2] = {1, MAXG}, ds[4] = {40, 64, 128, 136}, Ns[5] = {1, 17, 100, 333, MAXN};
    const int pads[3] = {0, 8, 4};
    int ci = 0;
    for (int ti = 0; ti < 2; ti++)
        for (int gi = 0; gi < 2; gi++)
            for (int di = 0; di < 4; di++) {
                const int before = kvs_test_failures;
                for (int ni = 0; ni < 5; ni++)
                    for (int qi = 0; qi < 2; qi++) {
                        const int N = Ns[ni], Nq = qi ? 32 : N;
                        if (qi && Nq >= N) continue;
                        const int pad = pads[ci % 3];
                        const double sigma = ci % 2 ? 2.0 : 1.0; /* logit sd sigma^2 */
                        ci++;
                        run_case(ws, rng, dts[ti], Gs[gi], ds[di], N, Nq, pad, sigma);
                    }
                printf("%-5s G=%d d=%-3d N in {1,17,100,333,1000}, Nq in {N,32}: %s\n",
                       kvs_dtype_name(dts[ti]), Gs[gi], ds[di],
                       kvs_test_failures == before ? "ok" : "FAILED");
            }
}

static void test_setting(kvs_gpu_workspace *ws) {
    kvs_err err;
    int in_force = -1;
    CHECK_OK(kvs_gpu_workspace_attn_kernel(ws, -1, &in_force, &err), &err);
    const int before = in_force;
    CHECK(before == KVS_GPU_ATTN_MMA || before == KVS_GPU_ATTN_WMMA);
    CHECK_FAILS(kvs_gpu_workspace_attn_kernel(ws, 5, &in_force, &err), KVS_ERR_INVALID, &err,
                "unknown");
    CHECK_OK(kvs_gpu_workspace_attn_kernel(ws, -1, &in_force, &err), &err);
    CHECK_EQ_INT(in_force, before);
    /* fp32 caches and the tensor-core switch off: CUDA cores, whatever the setting */
    kvs_view q = kvs_view_make((void *)16, KVS_F32, 2, 8, 64), k = q;
    CHECK_EQ_INT(kvs_gpu_attn_kernel_for(ws, &q, &k), KVS_GPU_ATTN_CUDA_CORES);
    q.dtype = k.dtype = KVS_F16;
    kvs_gpu_workspace_tensor_cores(ws, 0);
    CHECK_EQ_INT(kvs_gpu_attn_kernel_for(ws, &q, &k), KVS_GPU_ATTN_CUDA_CORES);
    kvs_gpu_workspace_tensor_cores(ws, 1);
    printf("default attention kernel on this device: %s\n", kname(before));
}

int main(void) {
    int rc = kg_device_or_skip("test_gpu_attn_mma");
    if (rc) {
        /* without a device the setting must say why too */
        if (rc == KG_SKIP) {
            kvs_err err;
            int in_force = 9;
            kvs_status st = kvs_gpu_workspace_attn_kernel(NULL, -1, &in_force, &err);
            if (st == KVS_OK) {
                fprintf(stderr, "kvs_gpu_workspace_attn_kernel without a workspace succeeded\n");
                return 1;
            }
        }
        return rc;
    }
    uint64_t seed = kg_seed(), rng = seed;
    kvs_shape mx = {1, MAXN, HKV, HKV * MAXG, MAXD, 0, 1};
    kvs_gpu_workspace *ws = NULL;
    kvs_err err;
    kvs_err_clear(&err);
    if (kvs_gpu_workspace_init(&ws, &mx, &err) != KVS_OK) {
        fprintf(stderr, "workspace: %s\n", err.msg);
        return 1;
    }
    printf("device: %s\n", kvs_gpu_workspace_device(ws));
    kvs_gpu_workspace_tensor_cores(ws, 1);
    test_setting(ws);
    test_parity(ws, &rng);
    kvs_gpu_workspace_free(ws);
    printf("%d checks, %d failures\n", kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}
