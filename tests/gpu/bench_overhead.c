/*
 * bench_overhead.c -- GPU latency of each method's compression step vs
 * sequence length (the paper's overhead table), one device, one shape.
 *
 * What it measures, per (method, N): kvs_gpu_compress (scoring, budgets,
 * selection, the plan copied back) and that plus kvs_gpu_apply_layer for
 * every layer (compaction / merging into preallocated fp32 buffers), timed
 * with CUDA events on the workspace stream; 2 warm-up runs, then >= 20
 * repetitions over 2 rotated input sets; median / p10 / p90. Bytes moved is
 * the cache data the method must read at least once (K+V for flashcache /
 * streamingllm / full, K + window Q for snapkv, K + all Q (+V) for the
 * attention methods); GB/s against the device copy bandwidth measured in the
 * same run (cudaMemcpy device to device, read + write). Attention methods
 * also print TFLOP/s for their logit passes (2 Hq N^2/2 d FLOP per pass,
 * 2 passes, 3 for meda).
 * Inputs: deterministic pseudo-random normal K/V/Q (kvs_gpu_fill_random),
 * fp16 by default, modality 10% text, 80% image, 10% text.
 * Cells whose predicted time (from the previous N, scaled by N or N^2)
 * exceeds the per-cell or the global time budget are reported as skipped,
 * never silently dropped. Prints one line per cell as it goes and the table
 * last; --csv writes the rows.
 * What it is not: no CPU timing (the CPU table is eval's overhead study), no
 * database writes (the runner owns the store).
 *
 * usage: bench_overhead [--shape qwen2.5-vl-7b|llava-1.5-7b|gemma3-270m]
 *                       [--n 2048,4096,...] [--methods a,b] [--reps 20]
 *                       [--dtype f16|bf16|f32] [--ratio 0.2] [--budget-s 300]
 *                       [--cell-s 60] [--tc 1|0] [--attn-kernel 1|0] [--extras 1|0]
 *                       [--csv FILE]
 * --shape takes formats/' presets (layers, heads, head size; default
 * qwen2.5-vl-7b). Input sets: two rotated sets where they fit in 80% of the
 * free device memory, else one (said so), else the N is skipped (said so).
 * --tc 0 keeps the attention tiles on CUDA cores (default: tensor cores for
 * fp16 / bf16); --attn-kernel 1|0 picks the tensor-core attention kernel of
 * the table (1 mma-reg, 0 wmma-smem; default: the device default, mma-reg
 * on sm_80+).
 * Before the table: one attention pass pair (lse, colsum) of one layer at
 * N = 8192 with both tensor-core kernels, ms and TFLOP/s (bench_passes;
 * about 2 s, skipped when --budget-s < 30); then FlashCache on the whole
 * model at N = 8192 with each DCT route (fft: ms and GB/s; gemm, gemm-tf32:
 * ms and TFLOP/s; bench_routes; about 1 s, skipped when less than 20 s of
 * the budget is left). --extras 0 leaves both out. The table itself uses the
 * default (fft) route.
 */
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvs_formats.h"
#include "kvs_kernels.h"
#include "kvsieve_methods.h"

enum { MAX_N = 16, MAX_M = 16, MAX_L = 64, SETS = 2, WARMUP = 2 };

typedef struct {
    const char *method;
    int N;
    int status; /* 0 ok, 1 skipped, 2 failed */
    char why[200];
    double med, p10, p90, total_med; /* ms */
    double bytes, flops;
} row;

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double q) {
    const double pos = q * (n - 1);
    const int i = (int)floor(pos);
    const double f = pos - i;
    return i + 1 < n ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[n - 1];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One attention pass pair (lse, then colsum) on one layer at N = 8192, Nq =
 * N, with each tensor-core attention kernel: median of 10 timed runs after
 * 2 warm-ups, per layer and times L (the model), TFLOP/s counting 2 d FLOP
 * per causally visible (query head, query, key) pair per pass. Skipped
 * (said so) when the time budget is below 30 s. 0, or 1 on a setup error. */
static int bench_passes(kvs_dtype dt, int L, int Hq, int Hkv, int d, double budget_s) {
    const int N = 8192, REPS = 10;
    if (budget_s < 30.0) {
        printf("attention passes: skipped (--budget-s %.0f < 30)\n", budget_s);
        return 0;
    }
    kvs_err err;
    kvs_err_clear(&err);
    const size_t es = kvs_dtype_size(dt), nk = (size_t)Hkv * N * d, nq = (size_t)Hq * N * d;
    kvs_shape mx = {1, N, Hkv, Hq, d, 0, 1};
    kvs_gpu_workspace *ws = NULL;
    void *K = NULL, *Q = NULL;
    float *lse = NULL, *cs = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 1;
    if (kvs_gpu_workspace_init(&ws, &mx, &err) != KVS_OK || kvs_gpu_malloc(&K, nk * es, &err) ||
        kvs_gpu_malloc(&Q, nq * es, &err) ||
        kvs_gpu_malloc((void **)&lse, sizeof(float) * Hq * N, &err) ||
        kvs_gpu_malloc((void **)&cs, sizeof(float) * Hkv * N, &err) ||
        kvs_gpu_fill_random(ws, K, dt, nk, 77u, 1.0f, &err) ||
        kvs_gpu_fill_random(ws, Q, dt, nq, 78u, 1.0f, &err) || kvs_gpu_sync(ws, &err)) {
        printf("attention passes: setup failed: %s\n", err.msg);
        goto cleanup;
    }
    cudaStream_t st = (cudaStream_t)kvs_gpu_workspace_stream(ws);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    kvs_view kv = kvs_view_make(K, dt, Hkv, N, d), qv = kvs_view_make(Q, dt, Hq, N, d);
    kv.device = qv.device = KVS_CUDA;
    const double pairs = (double)Hq * N * (N + 1.0) / 2.0, flop = 2.0 * d * pairs;
    kvs_gpu_workspace_tensor_cores(ws, 1);
    for (int kern = KVS_GPU_ATTN_WMMA; kern <= KVS_GPU_ATTN_MMA; kern++) {
        const char *kname = kern == KVS_GPU_ATTN_MMA ? "mma-reg" : "wmma-smem";
        if (kvs_gpu_workspace_attn_kernel(ws, kern, NULL, &err) != KVS_OK) {
            printf("attention passes %-9s: unavailable: %s\n", kname, err.msg);
            continue;
        }
        const int used = kvs_gpu_attn_kernel_for(ws, &qv, &kv);
        double t[2][REPS];
        int bad = 0;
        for (int r = -2; r < REPS && !bad; r++) {
            float ms[2] = {0, 0};
            for (int p = 0; p < 2 && !bad; p++) {
                cudaEventRecord(e0, st);
                bad = p == 0 ? kvs_gpu_attn_lse(ws, &qv, &kv, lse, &err) != KVS_OK
                             : kvs_gpu_attn_colsum(ws, &qv, &kv, lse, cs, &err) != KVS_OK;
                cudaEventRecord(e1, st);
                bad = bad || kvs_gpu_sync(ws, &err) != KVS_OK;
                cudaEventElapsedTime(&ms[p], e0, e1);
            }
            if (r >= 0) {
                t[0][r] = ms[0];
                t[1][r] = ms[1];
            }
        }
        if (bad) {
            printf("attention passes %-9s: failed: %s\n", kname, err.msg);
            goto cleanup;
        }
        qsort(t[0], REPS, sizeof(double), cmp_d);
        qsort(t[1], REPS, sizeof(double), cmp_d);
        const double ml = pct(t[0], REPS, 0.5), mc = pct(t[1], REPS, 0.5);
        printf("attention passes %-9s (ran %s) N=%d Hq=%d Hkv=%d d=%d %s, one layer: lse %.3f ms "
               "(%.0f TFLOP/s), colsum %.3f ms (%.0f TFLOP/s); x%d layers: %.1f ms\n",
               kname, used == KVS_GPU_ATTN_MMA ? "mma-reg" : used == KVS_GPU_ATTN_WMMA ? "wmma-smem" : "cuda-cores",
               N, Hq, Hkv, d, kvs_dtype_name(dt), ml, flop / (ml * 1e-3) / 1e12, mc,
               flop / (mc * 1e-3) / 1e12, L, L * (ml + mc));
    }
    rc = 0;
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    kvs_gpu_free(K);
    kvs_gpu_free(Q);
    kvs_gpu_free(lse);
    kvs_gpu_free(cs);
    kvs_gpu_workspace_free(ws);
    return rc;
}

/* FlashCache (kvs_gpu_compress, default parameters, ratio 0.2) on the whole
 * model at N = 8192 with each DCT route (kvs_gpu_workspace_dct_route): fft,
 * gemm (fp32 cuBLAS) and gemm-tf32 (opt-in, not plan-exact): median of 5
 * timed runs after 1 warm-up (which builds the GEMM basis), CUDA events on
 * the workspace stream. GB/s counts the K+V bytes read once (fft), TFLOP/s
 * the two GEMMs' 4 omega N (2 Hkv d) FLOP per layer (gemm). Skipped (said
 * so) when the time budget is below 20 s or a warm-up run predicts more
 * than 10 s. 0, or 1 on a setup error. */
static int bench_routes(kvs_dtype dt, int L, int Hq, int Hkv, int d, double budget_s) {
    enum { RN = 8192, RL = MAX_L, REPS = 5 };
    if (budget_s < 20.0) {
        printf("flashcache routes: skipped (--budget-s %.0f < 20)\n", budget_s);
        return 0;
    }
    if (L > RL) L = RL;
    kvs_err err;
    kvs_err_clear(&err);
    const int N = RN;
    const size_t es = kvs_dtype_size(dt), nkv = (size_t)Hkv * N * d;
    kvs_shape mx = {L, N, Hkv, Hq, d, 0, 1};
    kvs_gpu_workspace *ws = NULL;
    void *K[RL], *V[RL];
    kvs_layer layers[RL];
    memset(K, 0, sizeof K);
    memset(V, 0, sizeof V);
    memset(layers, 0, sizeof layers);
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 1, ok = kvs_gpu_workspace_init(&ws, &mx, &err) == KVS_OK;
    for (int l = 0; ok && l < L; l++) {
        ok = kvs_gpu_malloc(&K[l], nkv * es, &err) == KVS_OK &&
             kvs_gpu_malloc(&V[l], nkv * es, &err) == KVS_OK &&
             kvs_gpu_fill_random(ws, K[l], dt, nkv, 500u + 2u * l, 1.0f, &err) == KVS_OK &&
             kvs_gpu_fill_random(ws, V[l], dt, nkv, 501u + 2u * l, 1.0f, &err) == KVS_OK;
        layers[l].k = kvs_view_make(K[l], dt, Hkv, N, d);
        layers[l].v = kvs_view_make(V[l], dt, Hkv, N, d);
        layers[l].k.device = layers[l].v.device = KVS_CUDA;
    }
    if (ok) ok = kvs_gpu_sync(ws, &err) == KVS_OK;
    const kvs_method *me = kvs_method_find("flashcache");
    if (!ok || !me) {
        printf("flashcache routes: setup failed: %s\n", me ? err.msg : "no flashcache method");
        goto cleanup;
    }
    cudaStream_t st = (cudaStream_t)kvs_gpu_workspace_stream(ws);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    kvs_cache_view cv = {L, layers, NULL};
    kvs_params p;
    kvs_params_defaults(me, &p);
    const double gamma = kvs_param_get(me, &p, "gamma");
    int omega = (int)lround(gamma * N);
    if (omega < 1) omega = 1;
    const double bytes = 2.0 * L * (double)nkv * es;
    const double flop = 4.0 * L * (double)omega * N * (2.0 * Hkv * d);
    const double gib = 4.0 * omega * (double)N / (1024.0 * 1024.0 * 1024.0);
    const char *names[3] = {"fft", "gemm", "gemm-tf32"};
    kvs_budget b = {0.2, 0};
    for (int route = KVS_GPU_DCT_FFT; route <= KVS_GPU_DCT_GEMM_TF32; route++) {
        if (kvs_gpu_workspace_dct_route(ws, route, NULL, &err) != KVS_OK) {
            printf("flashcache routes %-9s: unavailable: %s\n", names[route], err.msg);
            continue;
        }
        double t[REPS];
        int bad = 0, skipped = 0;
        for (int r = -1; r < REPS && !bad && !skipped; r++) {
            kvs_plan plan;
            float ms = 0;
            cudaEventRecord(e0, st);
            kvs_status s = kvs_gpu_compress("flashcache", &p, &cv, &b, ws, &plan, &err);
            cudaEventRecord(e1, st);
            if (s == KVS_OK) s = kvs_gpu_sync(ws, &err);
            if (s != KVS_OK) {
                bad = 1;
                break;
            }
            kvs_plan_free(&plan);
            cudaEventElapsedTime(&ms, e0, e1);
            if (r < 0 && ms * 1e-3 * REPS > 10.0) {
                printf("flashcache routes %-9s: skipped after warm-up: one run %.1f ms, %d reps > "
                       "10 s\n", names[route], ms, REPS);
                skipped = 1;
            }
            if (r >= 0) t[r] = ms;
        }
        if (bad) {
            printf("flashcache routes %-9s: failed: %s\n", names[route], err.msg);
            continue;
        }
        if (skipped) continue;
        qsort(t, REPS, sizeof(double), cmp_d);
        const double med = pct(t, REPS, 0.5);
        if (route == KVS_GPU_DCT_FFT)
            printf("flashcache routes %-9s N=%d L=%d Hkv=%d d=%d %s gamma %g: %.3f ms (median of %d), "
                   "%.0f GB/s (K+V read once)\n", names[route], N, L, Hkv, d, kvs_dtype_name(dt),
                   gamma, med, REPS, bytes / (med * 1e6));
        else
            printf("flashcache routes %-9s N=%d L=%d Hkv=%d d=%d %s gamma %g: %.3f ms (median of %d), "
                   "%.1f TFLOP/s (2 GEMMs, %.2f TFLOP), basis %.3f GiB%s\n", names[route], N, L, Hkv,
                   d, kvs_dtype_name(dt), gamma, med, REPS, flop / (med * 1e9), flop / 1e12, gib,
                   route == KVS_GPU_DCT_GEMM_TF32 ? ", not plan-exact" : "");
        fflush(stdout);
    }
    rc = 0;
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int l = 0; l < L; l++) {
        kvs_gpu_free(K[l]);
        kvs_gpu_free(V[l]);
    }
    kvs_gpu_workspace_free(ws);
    return rc;
}

static int is_attn(const char *m) { return !strcmp(m, "h2o") || !strcmp(m, "lookm") || !strcmp(m, "meda"); }

int main(int argc, char **argv) {
    int Ns[MAX_N] = {2048, 4096, 8192, 16384, 32768, 65536}, nN = 6;
    const char *methods[MAX_M] = {"flashcache", "snapkv", "streamingllm", "h2o", "lookm", "meda"};
    int nM = 6, reps = 20, tc = 1, attn_kernel = -1, extras = 1; /* -1: the device default */
    const char *shape = "qwen2.5-vl-7b";
    double ratio = 0.2, budget_s = 300.0, cell_s = 60.0;
    kvs_dtype dt = KVS_F16;
    const char *csv = NULL;
    static char mbuf[512], nbuf[256];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_overhead: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--shape")) {
            shape = v;
        } else if (!strcmp(a, "--extras")) {
            extras = atoi(v) != 0;
        } else if (!strcmp(a, "--n")) {
            snprintf(nbuf, sizeof nbuf, "%s", v);
            nN = 0;
            for (char *t = strtok(nbuf, ","); t && nN < MAX_N; t = strtok(NULL, ",")) Ns[nN++] = atoi(t);
        } else if (!strcmp(a, "--methods")) {
            snprintf(mbuf, sizeof mbuf, "%s", v);
            nM = 0;
            for (char *t = strtok(mbuf, ","); t && nM < MAX_M; t = strtok(NULL, ",")) methods[nM++] = t;
        } else if (!strcmp(a, "--reps")) {
            reps = atoi(v);
        } else if (!strcmp(a, "--ratio")) {
            ratio = atof(v);
        } else if (!strcmp(a, "--budget-s")) {
            budget_s = atof(v);
        } else if (!strcmp(a, "--cell-s")) {
            cell_s = atof(v);
        } else if (!strcmp(a, "--tc")) {
            tc = atoi(v) != 0;
        } else if (!strcmp(a, "--attn-kernel")) {
            attn_kernel = atoi(v) != 0;
        } else if (!strcmp(a, "--csv")) {
            csv = v;
        } else if (!strcmp(a, "--dtype")) {
            dt = !strcmp(v, "f32") ? KVS_F32 : !strcmp(v, "bf16") ? KVS_BF16 : KVS_F16;
        } else {
            fprintf(stderr, "bench_overhead: unknown option %s\n", a);
            return 2;
        }
    }
    if (reps < 20) {
        fprintf(stderr, "bench_overhead: --reps must be >= 20 (the protocol)\n");
        return 2;
    }
    const double t_start = now_s();
    kvs_err err;
    kvs_err_clear(&err);
    kvs_synth_config sc;
    if (kvs_synth_preset(shape, &sc, &err) != KVS_OK) {
        fprintf(stderr, "bench_overhead: --shape: %s\n", err.msg);
        return 2;
    }
    if (sc.n_layers > MAX_L) {
        fprintf(stderr, "bench_overhead: --shape %s has %d layers, at most %d here\n", shape, sc.n_layers,
                MAX_L);
        return 2;
    }
    int ndev = 0;
    if (kvs_gpu_device_count(&ndev, &err) != KVS_OK) {
        printf("SKIP: bench_overhead: %s\n", err.msg);
        return 77;
    }
    char desc[512];
    kvs_gpu_device_describe(0, desc, sizeof desc, &err);
    const int L = sc.n_layers, Hq = sc.n_q_heads, Hkv = sc.n_kv_heads, d = sc.head_dim, W = 32;
    const size_t es = kvs_dtype_size(dt);
    printf("bench_overhead: %s\nshape %s (L=%d Hq=%d Hkv=%d d=%d), dtype %s, ratio %g, "
           "reps %d (+%d warm-up), up to %d rotated input sets\n",
           desc, shape, L, Hq, Hkv, d, kvs_dtype_name(dt), ratio, reps, WARMUP, SETS);

    /* device copy bandwidth */
    double copy_gbs = 0.0;
    {
        const size_t cb = (size_t)1 << 31;
        void *a = NULL, *b = NULL;
        if (kvs_gpu_malloc(&a, cb, &err) == KVS_OK && kvs_gpu_malloc(&b, cb, &err) == KVS_OK) {
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            double t[10];
            for (int r = -2; r < 10; r++) {
                cudaEventRecord(e0, 0);
                cudaMemcpyAsync(b, a, cb, cudaMemcpyDeviceToDevice, 0);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r >= 0) t[r] = ms;
            }
            qsort(t, 10, sizeof t[0], cmp_d);
            copy_gbs = 2.0 * (double)cb / (pct(t, 10, 0.5) * 1e-3) / 1e9;
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        kvs_gpu_free(a);
        kvs_gpu_free(b);
        printf("device copy bandwidth (read + write): %.0f GB/s\n", copy_gbs);
    }

    if (extras && bench_passes(dt, L, Hq, Hkv, d, budget_s - (now_s() - t_start)) != 0) return 1;
    if (extras && bench_routes(dt, L, Hq, Hkv, d, budget_s - (now_s() - t_start)) != 0) return 1;

    row rows[MAX_N * MAX_M];
    int nrows = 0;
    double last_ms[MAX_M];
    int last_n[MAX_M];
    for (int m = 0; m < nM; m++) {
        last_ms[m] = 0.0;
        last_n[m] = 0;
    }
    int need_q_all = 0;
    for (int m = 0; m < nM; m++) need_q_all |= is_attn(methods[m]);
    for (int ni = 0; ni < nN; ni++) {
        const int N = Ns[ni];
        const int Nq = need_q_all ? N : W;
        const size_t nkv = (size_t)Hkv * N * d, nq = (size_t)Hq * Nq * d;
        void *K[SETS][MAX_L], *V[SETS][MAX_L], *Q[SETS][MAX_L];
        float *ko[MAX_L], *vo[MAX_L];
        memset(K, 0, sizeof K);
        memset(V, 0, sizeof V);
        memset(Q, 0, sizeof Q);
        memset(ko, 0, sizeof ko);
        memset(vo, 0, sizeof vo);
        kvs_layer layers[SETS][MAX_L];
        kvs_cache_view cv[SETS];
        uint8_t *mod = malloc((size_t)N);
        for (int j = 0; j < N; j++) mod[j] = (j < N / 10 || j >= N - N / 10) ? KVS_MOD_TEXT : KVS_MOD_IMAGE;
        kvs_shape mx = {L, N, Hkv, Hq, d, 0, 1};
        kvs_gpu_workspace *ws = NULL;
        int ok = kvs_gpu_workspace_init(&ws, &mx, &err) == KVS_OK, nsets = 0, fits = 1;
        if (ok) { /* input sets that fit in 80% of the free memory, outputs included */
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            const double set_b = (double)L * (2.0 * nkv + nq) * es, out_b = 2.0 * L * nkv * 4.0;
            nsets = 2 * set_b + out_b <= 0.8 * fr ? 2 : set_b + out_b <= 0.8 * fr ? 1 : 0;
            if (nsets < SETS)
                printf("N=%d: %s (one input set %.1f GB, outputs %.1f GB, %.1f GB free)\n", N,
                       nsets ? "one input set only" : "skipped: does not fit", set_b / 1e9, out_b / 1e9,
                       fr / 1e9);
            ok = fits = nsets > 0;
        }
        for (int s = 0; ok && s < nsets; s++)
            for (int l = 0; ok && l < L; l++) {
                ok = kvs_gpu_malloc(&K[s][l], nkv * es, &err) == KVS_OK &&
                     kvs_gpu_malloc(&V[s][l], nkv * es, &err) == KVS_OK &&
                     kvs_gpu_malloc(&Q[s][l], nq * es, &err) == KVS_OK &&
                     kvs_gpu_fill_random(ws, K[s][l], dt, nkv, 1000u * s + 3u * l + 1u, 1.0f, &err) == KVS_OK &&
                     kvs_gpu_fill_random(ws, V[s][l], dt, nkv, 1000u * s + 3u * l + 2u, 1.0f, &err) == KVS_OK &&
                     kvs_gpu_fill_random(ws, Q[s][l], dt, nq, 1000u * s + 3u * l + 3u, 1.0f, &err) == KVS_OK;
                if (!ok) break;
                layers[s][l].k = kvs_view_make(K[s][l], dt, Hkv, N, d);
                layers[s][l].v = kvs_view_make(V[s][l], dt, Hkv, N, d);
                layers[s][l].q = kvs_view_make(Q[s][l], dt, Hq, Nq, d);
                layers[s][l].k.device = layers[s][l].v.device = layers[s][l].q.device = KVS_CUDA;
                cv[s].n_layers = L;
                cv[s].layers = layers[s];
                cv[s].modality = mod;
            }
        for (int l = 0; ok && l < L; l++)
            ok = kvs_gpu_malloc((void **)&ko[l], nkv * 4, &err) == KVS_OK &&
                 kvs_gpu_malloc((void **)&vo[l], nkv * 4, &err) == KVS_OK;
        if (ok) ok = kvs_gpu_sync(ws, &err) == KVS_OK;
        if (!ok && fits) printf("N=%d: setup failed: %s\n", N, err.msg);
        if (ok) {
            const int on = kvs_gpu_workspace_tensor_cores(ws, tc);
            int kern = -1;
            ok = kvs_gpu_workspace_attn_kernel(ws, attn_kernel, &kern, &err) == KVS_OK;
            if (!ok) printf("N=%d: attention kernel: %s\n", N, err.msg);
            else if (ni == 0)
                printf("attention tiles: %s\n",
                       !on ? "CUDA cores (fp32)"
                           : kern == KVS_GPU_ATTN_MMA ? "tensor cores (mma-reg; wmma-smem where the "
                                                        "views do not qualify)"
                                                      : "tensor cores (wmma-smem)");
        }
        cudaStream_t st = ws ? (cudaStream_t)kvs_gpu_workspace_stream(ws) : 0;
        for (int m = 0; m < nM; m++) {
            row *r = &rows[nrows++];
            memset(r, 0, sizeof *r);
            r->method = methods[m];
            r->N = N;
            const int attn = is_attn(methods[m]);
            const double kvb = 2.0 * L * (double)nkv * es, kb = L * (double)nkv * es;
            r->bytes = !strcmp(methods[m], "snapkv") ? kb + L * (double)Hq * W * d * es
                       : attn ? kb + L * (double)nq * es : kvb;
            r->flops = attn ? (strcmp(methods[m], "meda") ? 2.0 : 3.0) * L * 2.0 * Hq * (double)N * N / 2.0 * d
                            : !strcmp(methods[m], "snapkv") ? 2.0 * L * 2.0 * Hq * (double)W * N * d : 0.0;
            if (!ok) {
                r->status = fits ? 2 : 1;
                snprintf(r->why, sizeof r->why, "%s",
                         fits ? "setup failed" : "skipped: does not fit in device memory");
                continue;
            }
            const kvs_method *me = kvs_method_find(methods[m]);
            if (!me) {
                r->status = 2;
                snprintf(r->why, sizeof r->why, "unknown method");
                continue;
            }
            /* prediction from the previous N: attention ~N^2, others ~N */
            if (last_n[m] > 0) {
                const double f = (double)N / last_n[m];
                const double pred_s = last_ms[m] * (attn ? f * f : f) * (reps + WARMUP) * 2.0 / 1e3;
                const double left = budget_s - (now_s() - t_start);
                if (pred_s > cell_s || pred_s > left) {
                    r->status = 1;
                    snprintf(r->why, sizeof r->why,
                             "skipped: predicted %.0f s for %d runs (cell budget %.0f s, %.0f s left)",
                             pred_s, reps + WARMUP, cell_s, left);
                    last_n[m] = -1; /* larger N: skipped too */
                    continue;
                }
            } else if (last_n[m] < 0) {
                r->status = 1;
                snprintf(r->why, sizeof r->why, "skipped: a smaller N already exceeded the budget");
                continue;
            }
            kvs_params p;
            kvs_params_defaults(me, &p);
            kvs_budget b = {ratio, 0};
            double *ts = malloc(sizeof(double) * reps), *tt = malloc(sizeof(double) * reps);
            cudaEvent_t e0, e1, e2;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventCreate(&e2);
            for (int it = -WARMUP; it < reps && r->status == 0; it++) {
                const kvs_cache_view *c = &cv[(it + WARMUP) % nsets];
                kvs_plan plan;
                cudaEventRecord(e0, st);
                kvs_status s = kvs_gpu_compress(methods[m], &p, c, &b, ws, &plan, &err);
                cudaEventRecord(e1, st);
                for (int l = 0; s == KVS_OK && l < L; l++)
                    s = kvs_gpu_apply_layer(ws, &c->layers[l], &plan, l, ko[l], vo[l], &err);
                cudaEventRecord(e2, st);
                if (s == KVS_OK) s = kvs_gpu_sync(ws, &err);
                if (s != KVS_OK) {
                    r->status = 2;
                    snprintf(r->why, sizeof r->why, "failed: %.180s", err.msg);
                } else if (it == -1) { /* last warm-up: do the repetitions fit? */
                    float a = 0, bb = 0;
                    cudaEventElapsedTime(&a, e0, e1);
                    cudaEventElapsedTime(&bb, e0, e2);
                    const double pred = bb * reps / 1e3, left = budget_s - (now_s() - t_start);
                    if (pred > cell_s || pred > left) {
                        r->status = 1;
                        r->med = a;
                        r->total_med = bb;
                        snprintf(r->why, sizeof r->why,
                                 "skipped after warm-up: one run %.1f ms (select %.1f ms), %d reps "
                                 "> budget (cell %.0f s, %.0f s left)",
                                 bb, a, reps, cell_s, left);
                    }
                } else if (it >= 0) {
                    float a = 0, bb = 0;
                    cudaEventElapsedTime(&a, e0, e1);
                    cudaEventElapsedTime(&bb, e0, e2);
                    ts[it] = a;
                    tt[it] = bb;
                }
                kvs_plan_free(&plan); /* kvs_gpu_compress zeroes it on failure */
            }
            if (r->status == 0) {
                qsort(ts, reps, sizeof ts[0], cmp_d);
                qsort(tt, reps, sizeof tt[0], cmp_d);
                r->med = pct(ts, reps, 0.5);
                r->p10 = pct(ts, reps, 0.1);
                r->p90 = pct(ts, reps, 0.9);
                r->total_med = pct(tt, reps, 0.5);
                last_ms[m] = r->total_med;
                last_n[m] = N;
            } else {
                last_n[m] = -1; /* larger N: skipped as well */
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            cudaEventDestroy(e2);
            free(ts);
            free(tt);
            if (r->status == 0)
                printf("%-12s N=%6d  select %9.3f ms (p10 %.3f, p90 %.3f)  +apply %9.3f ms  %7.1f GB/s  "
                       "%6.2f TFLOP/s\n",
                       r->method, N, r->med, r->p10, r->p90, r->total_med, r->bytes / (r->med * 1e6),
                       r->flops / (r->med * 1e9));
            else
                printf("%-12s N=%6d  %s\n", r->method, N, r->why);
            fflush(stdout);
        }
        for (int s = 0; s < SETS; s++)
            for (int l = 0; l < L; l++) {
                kvs_gpu_free(K[s][l]);
                kvs_gpu_free(V[s][l]);
                kvs_gpu_free(Q[s][l]);
            }
        for (int l = 0; l < L; l++) {
            kvs_gpu_free(ko[l]);
            kvs_gpu_free(vo[l]);
        }
        kvs_gpu_workspace_free(ws);
        free(mod);
    }
    FILE *f = csv ? fopen(csv, "w") : NULL;
    if (f)
        fprintf(f, "device,shape,dtype,method,N,status,select_median_ms,select_p10_ms,select_p90_ms,"
                   "total_median_ms,bytes,gbs,copy_gbs,tflops,reps,note\n");
    printf("\n== GPU compression overhead, %s, %s, ratio %g (ms; select = kvs_gpu_compress, "
           "total = + compaction/merge) ==\n",
           shape, kvs_dtype_name(dt), ratio);
    printf("%-12s %6s %10s %10s %10s %10s %8s %6s %7s\n", "method", "N", "median", "p10", "p90",
           "total", "GB/s", "%copy", "TFLOP/s");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        if (r->status == 0) {
            const double gbs = r->bytes / (r->med * 1e6);
            printf("%-12s %6d %10.3f %10.3f %10.3f %10.3f %8.1f %5.1f%% %7.2f\n", r->method, r->N,
                   r->med, r->p10, r->p90, r->total_med, gbs, copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0,
                   r->flops / (r->med * 1e9));
        } else {
            printf("%-12s %6d %s\n", r->method, r->N, r->why);
        }
        if (f)
            fprintf(f, "\"%s\",%s,%s,%s,%d,%s,%.4f,%.4f,%.4f,%.4f,%.0f,%.1f,%.1f,%.3f,%d,\"%s\"\n",
                    desc, shape, kvs_dtype_name(dt), r->method, r->N,
                    r->status == 0 ? "ok" : r->status == 1 ? "skipped" : "failed", r->med, r->p10, r->p90,
                    r->total_med, r->bytes, r->status == 0 ? r->bytes / (r->med * 1e6) : 0.0, copy_gbs,
                    r->status == 0 ? r->flops / (r->med * 1e9) : 0.0, reps, r->why);
    }
    if (f) fclose(f);
    int failed = 0;
    for (int i = 0; i < nrows; i++) failed |= rows[i].status == 2;
    return failed ? 1 : 0;
}
