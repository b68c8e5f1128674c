/*
 * fc_gemm.cu -- the DCT low-pass deviation's truncated-basis GEMM route on
 * cuBLAS and the route setting (kvs_gpu_workspace_dct_route); the switch
 * between the routes is lowpass_route.cu.
 *
 * The route, for one layer with x [2 H d][N] (every K|V, head, channel
 * column, fp32, in Makhoul's reordered token order: the FFT route's pack
 * kernel is reused as is):
 *   basis  Bw [omega][N]: Bw[m][p] = a_m cos(pi (2 n + 1) m / (2 N)),
 *          n = mk_tok(p) the token at reordered position p; the first omega
 *          rows of the orthonormal DCT-II matrix with their columns
 *          permuted like x, so no un-permuting is needed anywhere. Built on
 *          the device in fp64 (exact argument reduction mod 4N), stored fp32,
 *          once per (N, omega), cached in the workspace.
 *   GEMM 1 X_low [2 H d][omega] = x Bw^T   (cuBLAS: omega x cols = Bw x)
 *   energies {sum X_low^2, sum x^2} for K and V, fp64, deterministic (fixed
 *          grid partials, then one fixed-order reduction; no atomics). The
 *          total is Parseval's sum x^2 rather than the sum of squared
 *          coefficients: equal up to fp32 rounding of the coefficients.
 *   GEMM 2 r = x - X_low Bw               (cuBLAS alpha = -1, beta = 1 on a
 *          copy of x): the residual x - x_base, read by the FFT route's
 *          deviation kernel, so dev [H][N] is computed by the same code.
 * cuBLAS runs on the workspace stream with fp32 compute
 * (CUBLAS_COMPUTE_32F, no TF32) unless KVS_GPU_DCT_GEMM_TF32 was chosen.
 * X_low lives in the workspace's FFT spectrum buffer (omega * cols floats
 * <= cols * (N/2+1) complex), the residual in rout; the only memory of its
 * own is the basis (4 omega N bytes, capped at KVS_FC_GEMM_BASIS_CAP) and
 * 8 KiB of partial sums.
 *
 * cuBLAS is loaded with dlopen when the route is first chosen (libcublas
 * .so.<CUDA major>): the FFT route, the default, then costs no process the
 * ~60 MB of cuBLAS / cuBLASLt pages a link-time dependency maps at start.
 *
 * What it is not: no FFT code (dct_cufft.cu), no method logic, no host
 * synchronisation (kvs_fc_gemm_prepare may allocate,
 * which the CUDA runtime may serialise with the device).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dct_order.cuh"
#include "fc_gemm.h"

#define FC_PARTS 256 /* blocks per energy sum (fixed: the sums are deterministic) */
#define FC_MARGIN ((size_t)64 << 20) /* free device memory left after the basis */

/* The cuBLAS entry points the route calls, from dlopen. */
typedef struct {
    void *lib;
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_name)(cublasStatus_t);
    const char *(*status_string)(cublasStatus_t);
} cublas_api;

struct kvs_fc_gemm {
    cublas_api api;
    cublasHandle_t h; /* on ws->stream */
    float *basis;     /* [omega][N] fp32: the N x omega column-major matrix Bw^T */
    size_t cap;       /* bytes allocated at basis */
    int N, omega;     /* what basis holds now; 0 = nothing */
    double *part;     /* [4][FC_PARTS] partial energies */
};

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

/* basis[m * N + p] = a_m cos(pi (2 mk_tok(p) + 1) m / (2N)), m < omega. */
__global__ void k_fc_basis(float *basis, int N, int omega) {
    const long long total = (long long)omega * N, period = 4LL * N;
    const double a0 = sqrt(1.0 / N), a1 = sqrt(2.0 / N);
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long m = e / N;
        const int p = (int)(e % N);
        const long long n = mk_tok(p, N);
        const long long k = ((2 * n + 1) * m) % period; /* cos has period 4N in k */
        basis[e] = (float)((m == 0 ? a0 : a1) * cospi((double)k / (2.0 * (double)N)));
    }
}

/* Partial sums of squares: y = 0 low K, 1 total K, 2 low V, 3 total V.
 * xl [2][nlo] (K columns first), x [2][ntot]. grid (FC_PARTS, 4), block 256. */
__global__ void __launch_bounds__(256) k_fc_sumsq_part(const float *xl, const float *x,
                                                        long long nlo, long long ntot,
                                                        double *part) {
    __shared__ double sh[256];
    const int y = blockIdx.y;
    const long long n = (y & 1) ? ntot : nlo;
    const float *a = (y & 1) ? x + (y >> 1) * ntot : xl + (y >> 1) * nlo;
    double acc = 0.0;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += (long long)gridDim.x * 256) {
        const double v = (double)a[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[y * FC_PARTS + blockIdx.x] = sh[0];
}

/* energy[y] = sum of the FC_PARTS partials of y, fixed order. grid 4, block FC_PARTS. */
__global__ void __launch_bounds__(FC_PARTS) k_fc_sumsq_final(const double *part, double *energy) {
    __shared__ double sh[FC_PARTS];
    sh[threadIdx.x] = part[blockIdx.x * FC_PARTS + threadIdx.x];
    __syncthreads();
    for (int o = FC_PARTS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) energy[blockIdx.x] = sh[0];
}

/* ------------------------------------------------------------------------ */
/* Host side                                                                 */
/* ------------------------------------------------------------------------ */

static kvs_status cublas_check(const cublas_api *a, cublasStatus_t s, const char *what,
                               kvs_err *err) {
    if (s == CUBLAS_STATUS_SUCCESS) return KVS_OK;
    return kvs_errorf(err, s == CUBLAS_STATUS_ALLOC_FAILED ? KVS_ERR_NOMEM : KVS_ERR_INTERNAL,
                      "%s: cuBLAS error %d (%s): %s", what, (int)s, a->status_name(s),
                      a->status_string(s));
}

#define KVS_STR2(x) #x
#define KVS_STR(x) KVS_STR2(x)
#ifndef KVS_CUDA_MAJOR
#define KVS_CUDA_MAJOR 13
#endif

/* dlopen the cuBLAS of the CUDA major version we were built with. */
static kvs_status cublas_load(cublas_api *a, kvs_err *err) {
    const char *name = "libcublas.so." KVS_STR(KVS_CUDA_MAJOR);
    memset(a, 0, sizeof *a);
    a->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "DCT GEMM route needs %s (the FFT route does not): %s", name, dlerror());
    struct {
        void **slot;
        const char *sym;
    } syms[] = {{(void **)&a->create, "cublasCreate_v2"},
                {(void **)&a->destroy, "cublasDestroy_v2"},
                {(void **)&a->set_stream, "cublasSetStream_v2"},
                {(void **)&a->set_math_mode, "cublasSetMathMode"},
                {(void **)&a->gemm_ex, "cublasGemmEx"},
                {(void **)&a->status_name, "cublasGetStatusName"},
                {(void **)&a->status_string, "cublasGetStatusString"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(a->lib, syms[i].sym);
        if (!*syms[i].slot) {
            kvs_status st = kvs_errorf(err, KVS_ERR_UNSUPPORTED, "DCT GEMM route: %s has no %s",
                                       name, syms[i].sym);
            dlclose(a->lib);
            memset(a, 0, sizeof *a);
            return st;
        }
    }
    return KVS_OK;
}

extern "C" size_t kvs_fc_gemm_basis_bytes(int N, int omega) {
    return sizeof(float) * (size_t)(N > 0 ? N : 0) * (size_t)(omega > 0 ? omega : 0);
}

extern "C" void kvs_fc_gemm_free(kvs_fc_gemm *g) {
    if (!g) return;
    if (g->h) g->api.destroy(g->h);
    if (g->basis) cudaFree(g->basis);
    if (g->part) cudaFree(g->part);
    if (g->api.lib) dlclose(g->api.lib);
    free(g);
}

/* cuBLAS handle on the workspace stream and the partial-sum buffer. */
static kvs_status gemm_create(kvs_gpu_workspace *ws, kvs_err *err) {
    kvs_fc_gemm *g = (kvs_fc_gemm *)calloc(1, sizeof *g);
    if (!g) return kvs_errorf(err, KVS_ERR_NOMEM, "DCT GEMM route: out of host memory");
    kvs_status st = cublas_load(&g->api, err);
    const cublas_api *a = &g->api;
    if (!st) {
        st = cublas_check(a, a->create(&g->h), "DCT GEMM route: cublasCreate", err);
        if (st) g->h = NULL;
    }
    if (!st)
        st = cublas_check(a, a->set_stream(g->h, ws->stream), "DCT GEMM route: cublasSetStream",
                          err);
    /* fp32 GEMMs stay fp32: no tensor-op math unless a call asks for TF32 */
    if (!st)
        st = cublas_check(a, a->set_math_mode(g->h, CUBLAS_DEFAULT_MATH),
                          "DCT GEMM route: cublasSetMathMode", err);
    if (!st) {
        const cudaError_t rc = cudaMalloc((void **)&g->part, sizeof(double) * 4 * FC_PARTS);
        if (rc != cudaSuccess) {
            g->part = NULL;
            st = kvs_errorf(err, KVS_ERR_NOMEM, "DCT GEMM route: cudaMalloc(%zu bytes): %s",
                            sizeof(double) * 4 * FC_PARTS, cudaGetErrorString(rc));
        }
    }
    if (st) {
        (void)cudaGetLastError();
        kvs_fc_gemm_free(g);
        return st;
    }
    ws->fcg = g;
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_workspace_dct_route(kvs_gpu_workspace *ws, int which, int *in_force,
                                                  kvs_err *err) {
    if (!ws) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_workspace_dct_route: no workspace");
    if (in_force) *in_force = ws->dct_route;
    if (which < -1 || which > KVS_GPU_DCT_GEMM_TF32)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_workspace_dct_route: route %d unknown (-1 query, 0 fft, 1 gemm, "
                          "2 gemm-tf32)", which);
    if (which == KVS_GPU_DCT_GEMM_TF32 && ws->cc_major < 8)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_gpu_workspace_dct_route: the gemm-tf32 route needs TF32 tensor "
                          "cores (sm_80 or newer); device %s has none", ws->device_name);
    if (which >= KVS_GPU_DCT_GEMM && !ws->fcg) {
        kvs_status st = gemm_create(ws, err);
        if (st)
            return kvs_err_prefix(err, "kvs_gpu_workspace_dct_route (device %s)",
                                  ws->device_name);
    }
    if (which >= 0) ws->dct_route = which;
    if (in_force) *in_force = ws->dct_route;
    return KVS_OK;
}

extern "C" kvs_status kvs_fc_gemm_prepare(kvs_gpu_workspace *ws, int N, int ncols, int omega,
                                         kvs_err *err) {
    kvs_fc_gemm *g = ws->fcg;
    if (!g)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "DCT GEMM route selected without its cuBLAS handle");
    if (N < 1 || omega < 1 || omega > N || (long long)ncols * N > (long long)ws->ncols * ws->N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "DCT GEMM route: N=%d omega=%d cols=%d do not fit the workspace "
                          "(%d x %d)", N, omega, ncols, ws->ncols, ws->N);
    if (g->N == N && g->omega == omega) return KVS_OK;
    const size_t bytes = kvs_fc_gemm_basis_bytes(N, omega);
    const double gib = (double)bytes / (1024.0 * 1024.0 * 1024.0);
    if (bytes > KVS_FC_GEMM_BASIS_CAP)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "DCT GEMM route: the truncated DCT basis for N=%d, omega=%d "
                          "(omega x N fp32) needs %.2f GiB, above the route's cap of %.0f GiB "
                          "(KVS_FC_GEMM_BASIS_CAP); use the FFT route, which needs no basis",
                          N, omega, gib,
                          (double)KVS_FC_GEMM_BASIS_CAP / (1024.0 * 1024.0 * 1024.0));
    cudaError_t rc;
    if (bytes > g->cap) {
        if (g->basis) cudaFree(g->basis); /* synchronises: queued GEMMs finish first */
        g->basis = NULL;
        g->cap = 0;
        g->N = g->omega = 0;
        size_t free_b = 0, total_b = 0;
        rc = cudaMemGetInfo(&free_b, &total_b);
        if (rc != cudaSuccess)
            return kvs_gpu_cuda_check(rc, "DCT GEMM route: cudaMemGetInfo", err);
        if (bytes + FC_MARGIN > free_b)
            return kvs_errorf(err, KVS_ERR_NOMEM,
                              "DCT GEMM route: the truncated DCT basis for N=%d, omega=%d "
                              "needs %.2f GiB but device %s has %.2f GiB free (of %.2f GiB); use "
                              "the FFT route", N, omega, gib, ws->device_name,
                              (double)free_b / (1024.0 * 1024.0 * 1024.0),
                              (double)total_b / (1024.0 * 1024.0 * 1024.0));
        rc = cudaMalloc((void **)&g->basis, bytes);
        if (rc != cudaSuccess) {
            g->basis = NULL;
            (void)cudaGetLastError();
            return kvs_errorf(err, KVS_ERR_NOMEM,
                              "DCT GEMM route: cudaMalloc of the %.2f GiB basis (N=%d, "
                              "omega=%d): %s", gib, N, omega, cudaGetErrorString(rc));
        }
        g->cap = bytes;
    }
    const long long total = (long long)N * omega;
    long long blocks = (total + 255) / 256;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    k_fc_basis<<<(unsigned)blocks, 256, 0, ws->stream>>>(g->basis, N, omega);
    rc = cudaGetLastError();
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, "DCT GEMM route: basis kernel", err);
    g->N = N;
    g->omega = omega;
    return KVS_OK;
}

extern "C" kvs_status kvs_fc_gemm_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer,
                                       int omega, float *dev, double *energy, kvs_err *err) {
    kvs_fc_gemm *g = ws->fcg;
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    const int ncols = 2 * H * d;
    if (!g || !g->basis || g->N != N || g->omega != omega)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "DCT GEMM route: layer %d: no basis for N=%d omega=%d "
                          "(kvs_fc_gemm_prepare not called)", layer, N, omega);
    /* X_low [ncols][omega] in the spectrum buffer: [ncols][Nh] complex */
    assert((size_t)omega * (size_t)ncols <= 2 * (size_t)ws->ncols * (size_t)ws->Nh);
    float *xl = (float *)ws->spec;
    const cublasComputeType_t ct =
        ws->dct_route == KVS_GPU_DCT_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float one = 1.0f, zero = 0.0f, minus_one = -1.0f;
    char what[96];
    snprintf(what, sizeof what, "DCT GEMM route: layer %d", layer);
    kvs_status st = kvs_gpu_cuda_check(kvs_launch_fc_pack(ws, ly, layer), what, err);
    if (st) return st;
    /* X_low (omega x ncols, ld omega) = Bw (omega x N) * x (N x ncols, ld N);
     * Bw is stored as its transpose (N x omega, ld N), hence OP_T */
    st = cublas_check(&g->api, g->api.gemm_ex(g->h, CUBLAS_OP_T, CUBLAS_OP_N, omega, ncols, N, &one, g->basis,
                                   CUDA_R_32F, N, ws->rin, CUDA_R_32F, N, &zero, xl, CUDA_R_32F,
                                   omega, ct, CUBLAS_GEMM_DEFAULT),
                      what, err);
    if (st) return st;
    k_fc_sumsq_part<<<dim3(FC_PARTS, 4), 256, 0, ws->stream>>>(
        xl, ws->rin, (long long)omega * H * d, (long long)N * H * d, g->part);
    k_fc_sumsq_final<<<4, FC_PARTS, 0, ws->stream>>>(g->part, energy);
    cudaError_t rc = cudaGetLastError();
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(ws->rout, ws->rin, sizeof(float) * (size_t)ncols * (size_t)N,
                             cudaMemcpyDeviceToDevice, ws->stream);
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, what, err);
    /* residual (N x ncols, ld N) = x - Bw^T (N x omega) * X_low (omega x ncols) */
    st = cublas_check(&g->api, g->api.gemm_ex(g->h, CUBLAS_OP_N, CUBLAS_OP_N, N, ncols, omega, &minus_one,
                                   g->basis, CUDA_R_32F, N, xl, CUDA_R_32F, omega, &one, ws->rout,
                                   CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT),
                      what, err);
    if (st) return st;
    return kvs_gpu_cuda_check(kvs_launch_fc_dev(ws, ws->rout, H, N, d, dev, layer), what, err);
}
