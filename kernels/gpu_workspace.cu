/*
 * gpu_workspace.cu -- devices, device memory helpers and the workspace
 * (kvs_kernels.h): sized once for a maximal shape, its stream, its settings
 * (tensor cores, attention kernel, device name), its scratch for method
 * drivers, and the benchmark's random fill.
 *
 * What it is: allocation and settings. What it is not: no building block;
 * the DCT GEMM route's own state is fc_gemm.cu's, the cuFFT plans
 * dct_cufft.cu's (freed here with the workspace).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cufft.h>
#include <mma.h>

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.cuh"
#include "attn_mma.h"
#include "fc_gemm.h"

__device__ __forceinline__ unsigned long long splitmix(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void k_fill_random(void *ptr, int dt, long long count, unsigned long long seed,
                              float scale) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < count;
         e += (long long)gridDim.x * blockDim.x) {
        const unsigned long long r = splitmix(seed ^ splitmix((unsigned long long)e));
        const float u1 = ((float)(r >> 40) + 1.0f) / 16777217.0f; /* (0, 1] */
        const float u2 = (float)((r >> 16) & 0xFFFFFF) / 16777216.0f;
        const float v = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        if (dt == KVS_F32) ((float *)ptr)[e] = v;
        else if (dt == KVS_F16) ((__half *)ptr)[e] = __float2half_rn(v);
        else ((unsigned short *)ptr)[e] = (unsigned short)(__float_as_uint(v) >> 16);
    }
}


extern "C" kvs_status kvs_gpu_device_count(int *count, kvs_err *err) {
    *count = 0;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount: %s (%s)",
                          cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    if (n == 0)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "no CUDA device: cudaGetDeviceCount returned 0 devices");
    *count = n;
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_device_describe(int dev, char *buf, size_t n, kvs_err *err) {
    cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, dev);
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, "cudaGetDeviceProperties", err);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(buf, n, "device %d: %s, sm_%d%d, %.1f GiB, %d SMs, runtime %d.%d, driver %d.%d", dev,
             p.name, p.major, p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             p.multiProcessorCount, rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10);
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_malloc(void **ptr, size_t bytes, kvs_err *err) {
    *ptr = NULL;
    cudaError_t rc = cudaMalloc(ptr, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        *ptr = NULL;
        return kvs_errorf(err, KVS_ERR_NOMEM, "cudaMalloc(%zu bytes): %s", bytes,
                          cudaGetErrorString(rc));
    }
    return KVS_OK;
}

extern "C" void kvs_gpu_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

extern "C" kvs_status kvs_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return kvs_gpu_cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                              "kvs_gpu_memcpy_h2d", err);
}

extern "C" kvs_status kvs_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return kvs_gpu_cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
                              "kvs_gpu_memcpy_d2h", err);
}

extern "C" kvs_status kvs_gpu_poison(void *ptr, size_t bytes, kvs_err *err) {
    kvs_status st = kvs_gpu_cuda_check(cudaMemset(ptr, 0xFF, bytes), "kvs_gpu_poison", err);
    if (st) return st;
    return kvs_gpu_cuda_check(cudaDeviceSynchronize(), "kvs_gpu_poison", err);
}


/* ------------------------------------------------------------------------ */
/* Workspace                                                                 */
/* ------------------------------------------------------------------------ */

extern "C" void kvs_gpu_workspace_free(kvs_gpu_workspace *ws) {
    if (!ws) return;
    if (ws->stream) cudaStreamSynchronize(ws->stream);
    if (ws->have_r2c) cufftDestroy(ws->r2c);
    if (ws->have_c2r) cufftDestroy(ws->c2r);
    kvs_fc_gemm_free(ws->fcg);
    void *dev[] = {ws->rin,   ws->rout,   ws->spec,     ws->scores, ws->scratch, ws->lse, ws->lsepart, ws->colpart, ws->rowpart,
                   ws->energy, ws->rowstat, ws->rowkind, ws->stats,  ws->modality, ws->desc,
                   ws->idx,   ws->ev,     ws->assign,   ws->kept,   ws->cnt,     ws->unitk,
                   ws->errrec};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    void *host[] = {ws->h_err,   ws->h_desc,     ws->h_idx, ws->h_stats,
                    ws->h_energy, ws->h_modality, ws->h_kept};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        if (host[i]) cudaFreeHost(host[i]);
    if (ws->stream) cudaStreamDestroy(ws->stream);
    free(ws);
}

extern "C" kvs_status kvs_gpu_workspace_init(kvs_gpu_workspace **out, const kvs_shape *mx,
                                             kvs_err *err) {
    *out = NULL;
    if (!mx || mx->n_layers < 1 || mx->n_tokens < 1 || mx->n_kv_heads < 1 || mx->head_dim < 1 ||
        mx->n_q_heads < 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_workspace_init: bad maximal shape (L, N, Hkv, d must be >= 1)");
    int ndev = 0;
    kvs_status st = kvs_gpu_device_count(&ndev, err);
    if (st) return st;
    kvs_gpu_workspace *ws = (kvs_gpu_workspace *)calloc(1, sizeof *ws);
    if (!ws) return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_gpu_workspace_init: out of memory");
    const size_t L = (size_t)mx->n_layers, N = (size_t)mx->n_tokens, H = (size_t)mx->n_kv_heads;
    const size_t d = (size_t)mx->head_dim;
    const size_t Hq = (size_t)(mx->n_q_heads > 0 ? mx->n_q_heads : mx->n_kv_heads);
    const size_t ncols = 2 * H * d, Nh = N / 2 + 1;
    const size_t nscr = (H > L ? H : L) * N;
    cudaDeviceProp prop;
    cudaError_t rc;
    ws->L = (int)L;
    ws->N = (int)N;
    ws->Hkv = (int)H;
    ws->Hq = (int)Hq;
    ws->d = (int)d;
    ws->ncols = (int)ncols;
    ws->Nh = (int)Nh;
    if ((rc = cudaGetDevice(&ws->device)) != cudaSuccess) goto cuda_fail;
    if ((rc = cudaGetDeviceProperties(&prop, ws->device)) != cudaSuccess) goto cuda_fail;
    snprintf(ws->device_name, sizeof ws->device_name, "%s (sm_%d%d)", prop.name, prop.major,
             prop.minor);
    ws->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    ws->tensor_cores = prop.major >= 8; /* wmma fp16 + bf16 */
    ws->cc_major = prop.major;
    ws->cc_minor = prop.minor;
    ws->attn_kernel = prop.major >= 8 ? KVS_GPU_ATTN_MMA : KVS_GPU_ATTN_WMMA;
    ws->dct_route = KVS_GPU_DCT_FFT; /* the GEMM route is opt-in (kvs_gpu_workspace_dct_route) */
    if (prop.major >= 8 && (rc = (cudaError_t)kvs_attn_mma_prepare()) != cudaSuccess)
        goto cuda_fail;
    if ((rc = cudaStreamCreateWithFlags(&ws->stream, cudaStreamNonBlocking)) != cudaSuccess)
        goto cuda_fail;
#define KVS_DALLOC(field, bytes)                                                        \
    do {                                                                                \
        if ((rc = cudaMalloc((void **)&ws->field, (bytes))) != cudaSuccess) goto cuda_fail; \
    } while (0)
#define KVS_HALLOC(field, bytes)                                                            \
    do {                                                                                    \
        if ((rc = cudaMallocHost((void **)&ws->field, (bytes))) != cudaSuccess) goto cuda_fail; \
    } while (0)
    KVS_DALLOC(rin, sizeof(float) * ncols * N);
    KVS_DALLOC(rout, sizeof(float) * ncols * N);
    KVS_DALLOC(spec, sizeof(cufftComplex) * ncols * Nh);
    KVS_DALLOC(scores, sizeof(float) * L * H * N);
    KVS_DALLOC(scratch, sizeof(float) * nscr);
    KVS_DALLOC(lse, sizeof(float) * Hq * N);
    KVS_DALLOC(lsepart, sizeof(float) * 2 * Hq * N);
    KVS_DALLOC(colpart, sizeof(double) * Hq * N);
    KVS_DALLOC(rowpart, sizeof(double) * 4 * 8 * N);
    KVS_DALLOC(energy, sizeof(double) * L * 4);
    KVS_DALLOC(rowstat, sizeof(double) * 2 * N);
    KVS_DALLOC(rowkind, N);
    KVS_DALLOC(stats, sizeof(double) * L * 6);
    KVS_DALLOC(modality, N);
    KVS_DALLOC(desc, sizeof(kvs_topk_desc) * L * H);
    KVS_DALLOC(idx, sizeof(int32_t) * L * H * N);
    KVS_DALLOC(ev, sizeof(int32_t) * N);
    KVS_DALLOC(assign, sizeof(int32_t) * N);
    KVS_DALLOC(kept, sizeof(int32_t) * H * N);
    KVS_DALLOC(cnt, sizeof(int32_t) * N);
    KVS_DALLOC(unitk, sizeof(float) * N * d);
    KVS_DALLOC(errrec, sizeof(kvs_gpu_errrec));
    KVS_HALLOC(h_err, sizeof(kvs_gpu_errrec));
    KVS_HALLOC(h_desc, sizeof(kvs_topk_desc) * L * H);
    KVS_HALLOC(h_idx, sizeof(int32_t) * L * H * N);
    KVS_HALLOC(h_stats, sizeof(double) * L * 6);
    KVS_HALLOC(h_energy, sizeof(double) * L * 4);
    KVS_HALLOC(h_modality, N);
    KVS_HALLOC(h_kept, sizeof(int32_t) * H * N);
#undef KVS_DALLOC
#undef KVS_HALLOC
    if ((rc = cudaMemsetAsync(ws->errrec, 0, sizeof(kvs_gpu_errrec), ws->stream)) != cudaSuccess)
        goto cuda_fail;
    if ((rc = cudaStreamSynchronize(ws->stream)) != cudaSuccess) goto cuda_fail;
    *out = ws;
    return KVS_OK;
cuda_fail:
    st = kvs_errorf(err, rc == cudaErrorMemoryAllocation ? KVS_ERR_NOMEM : KVS_ERR_INTERNAL,
                    "kvs_gpu_workspace_init (L=%zu N=%zu Hkv=%zu Hq=%zu d=%zu): %s", L, N, H, Hq,
                    d, cudaGetErrorString(rc));
    (void)cudaGetLastError();
    kvs_gpu_workspace_free(ws);
    return st;
}

extern "C" void *kvs_gpu_workspace_stream(kvs_gpu_workspace *ws) { return (void *)ws->stream; }

extern "C" int kvs_gpu_workspace_tensor_cores(kvs_gpu_workspace *ws, int on) {
    if (on >= 0) {
        cudaDeviceProp prop;
        const int ok = cudaGetDeviceProperties(&prop, ws->device) == cudaSuccess && prop.major >= 8;
        ws->tensor_cores = on && ok;
    }
    return ws->tensor_cores;
}

extern "C" kvs_status kvs_gpu_workspace_attn_kernel(kvs_gpu_workspace *ws, int which,
                                                    int *in_force, kvs_err *err) {
    if (!ws)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_workspace_attn_kernel: no workspace");
    if (which != -1 && which != KVS_GPU_ATTN_WMMA && which != KVS_GPU_ATTN_MMA)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_workspace_attn_kernel: kernel %d unknown (-1 query, 0 wmma-smem, "
                          "1 mma-reg)", which);
    if (which == KVS_GPU_ATTN_MMA && ws->cc_major < 8)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_gpu_workspace_attn_kernel: the mma-reg attention kernel needs sm_80 "
                          "or newer (mma.sync bf16, ldmatrix, cp.async); device %s is not",
                          ws->device_name);
    if (which >= 0) ws->attn_kernel = which;
    if (in_force) *in_force = ws->attn_kernel;
    return KVS_OK;
}

extern "C" int kvs_gpu_attn_kernel_for(const kvs_gpu_workspace *ws, const kvs_view *q,
                                       const kvs_view *k) {
    const int sixteen = q->dtype == k->dtype && q->dtype != KVS_F32;
    if (!ws->tensor_cores || !sixteen) return KVS_GPU_ATTN_CUDA_CORES;
    if (ws->attn_kernel == KVS_GPU_ATTN_MMA && kvs_attn_mma_views_ok(q, k)) return KVS_GPU_ATTN_MMA;
    return KVS_GPU_ATTN_WMMA;
}

extern "C" const char *kvs_gpu_workspace_device(const kvs_gpu_workspace *ws) {
    return ws->device_name;
}


extern "C" kvs_status kvs_gpu_fill_random(kvs_gpu_workspace *ws, void *ptr, kvs_dtype t,
                                          size_t count, uint64_t seed, float scale,
                                          kvs_err *err) {
    if (!ws || !ptr || (t != KVS_F32 && t != KVS_F16 && t != KVS_BF16))
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_fill_random: bad arguments");
    k_fill_random<<<grid_for((long long)count, 256), 256, 0, ws->stream>>>(
        ptr, (int)t, (long long)count, (unsigned long long)seed, scale);
    return kvs_gpu_cuda_check(cudaGetLastError(), "kvs_gpu_fill_random", err);
}

extern "C" kvs_gpu_scratch kvs_gpu_workspace_scratch(kvs_gpu_workspace *ws) {
    kvs_gpu_scratch s;
    s.scores = ws->scores;
    s.sums = ws->scratch;
    s.lse = ws->lse;
    s.energy = ws->energy;
    s.stats = ws->stats;
    return s;
}

extern "C" kvs_status kvs_gpu_upload_modality(kvs_gpu_workspace *ws, const uint8_t *modality,
                                              int N, const uint8_t **dev, kvs_err *err) {
    if (!ws || !modality || !dev || N < 1 || N > ws->N)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_upload_modality: N=%d (workspace N <= %d)",
                          N, ws ? ws->N : 0);
    memcpy(ws->h_modality, modality, (size_t)N);
    cudaError_t rc = cudaMemcpyAsync(ws->modality, ws->h_modality, (size_t)N,
                                     cudaMemcpyHostToDevice, ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "modality upload", err);
    *dev = ws->modality;
    return KVS_OK;
}
