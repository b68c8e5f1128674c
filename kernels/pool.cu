/*
 * pool.cu -- row operations on score rows [rows][N] on the device:
 * 1-D pooling (max / avg, centred window), the per-row post-processing
 * (finiteness flag, 1/(N - j) normalisation, text boost) and sums over
 * heads. CPU reference: core's kvs_pool1d_max / kvs_pool1d_avg (core/select.c)
 * and the score loops of the CPU methods that use these rows.
 *
 * What it is not: no attention, no selection.
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

/* ------------------------------------------------------------------------ */
/* Pooling, score post-processing                                            */
/* ------------------------------------------------------------------------ */

__global__ void k_pool(const float *x, int x_stride, int n, int k, int is_max, float *out,
                       int out_stride, int layer, kvs_gpu_errrec *er) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i >= n) return;
    const float *xr = x + (long long)r * x_stride;
    if (!isfinite(xr[i])) report_err(er, KVS_GERR_SCORE, layer, r, i, -1);
    const int pad = k / 2;
    int lo = i - pad, hi = i - pad + k - 1;
    if (lo < 0) lo = 0;
    if (hi > n - 1) hi = n - 1;
    float res;
    if (is_max) {
        float m = xr[lo];
        for (int j = lo + 1; j <= hi; j++)
            if (xr[j] > m) m = xr[j];
        res = m;
    } else {
        double sum = 0.0;
        for (int j = lo; j <= hi; j++) sum += xr[j];
        res = (float)(sum / (double)(hi - lo + 1));
    }
    out[(long long)r * out_stride + i] = res;
}

/* One block per head: finite check, optional /(N - j), optional text boost. */
__global__ void k_score_post(float *scores, int N, int normalize, int boost,
                             const uint8_t *modality, int layer, kvs_gpu_errrec *er) {
    __shared__ float red[256];
    float *s = scores + (long long)blockIdx.x * N;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        float v = s[j];
        if (!isfinite(v)) report_err(er, KVS_GERR_SCORE, layer, blockIdx.x, j, -1);
        if (normalize) {
            v /= (float)(N - j);
            s[j] = v;
        }
        mx = fmaxf(mx, v);
    }
    if (!boost) return;
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    const float m = red[0];
    for (int j = threadIdx.x; j < N; j += blockDim.x)
        if (!modality || modality[j] == KVS_MOD_TEXT) s[j] += m;
}


__global__ void k_head_sum(const float *dev, int H, int N, float *out) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float a = 0.0f;
    for (int h = 0; h < H; h++) a += dev[(long long)h * N + n];
    out[n] = a;
}

/* Length-1 "FFT" (identity) for N == 1, where no cuFFT plan is made. */

extern "C" int kvs_launch_head_sum(kvs_gpu_workspace *ws, const float *dev, int H, int N,
                                   float *out) {
    k_head_sum<<<(unsigned)((N + 255) / 256), 256, 0, ws->stream>>>(dev, H, N, out);
    return (int)cudaGetLastError();
}


extern "C" int kvs_launch_pool(kvs_gpu_workspace *ws, const float *x, int rows, int x_stride,
                               int n, int k, int is_max, float *out, int out_stride, int layer) {
    if (n <= 0 || rows <= 0) return 0;
    const dim3 g((unsigned)((n + 255) / 256), (unsigned)rows);
    k_pool<<<g, 256, 0, ws->stream>>>(x, x_stride, n, k, is_max, out, out_stride, layer,
                                      ws->errrec);
    return (int)cudaGetLastError();
}


extern "C" int kvs_launch_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N,
                                     int normalize, int boost, const uint8_t *modality_dev,
                                     int layer) {
    k_score_post<<<(unsigned)H, 256, 0, ws->stream>>>(scores, N, normalize, boost, modality_dev,
                                                      layer, ws->errrec);
    return (int)cudaGetLastError();
}


extern "C" kvs_status kvs_gpu_pool1d(kvs_gpu_workspace *ws, const float *x, int rows, int n,
                                     int k, int is_max, float *out, kvs_err *err) {
    if (!ws || !x || !out || rows < 1 || n < 0 || k < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_pool1d: rows=%d n=%d k=%d", rows, n, k);
    return kvs_gpu_cuda_check(kvs_launch_pool(ws, x, rows, n, n, k, is_max, out, n, -1),
                              "kvs_gpu_pool1d", err);
}


extern "C" kvs_status kvs_gpu_head_sum(kvs_gpu_workspace *ws, const float *x, int H, int N,
                                       float *out, kvs_err *err) {
    if (!ws || !x || !out || H < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_head_sum: H=%d N=%d", H, N);
    return kvs_gpu_cuda_check(kvs_launch_head_sum(ws, x, H, N, out), "kvs_gpu_head_sum", err);
}

extern "C" kvs_status kvs_gpu_pool_rows(kvs_gpu_workspace *ws, const float *x, int rows,
                                        int x_stride, int n, int k, int is_max, float *out,
                                        int out_stride, int layer, kvs_err *err) {
    if (!ws || !x || !out || rows < 1 || n < 0 || k < 1 || x_stride < n || out_stride < n)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_pool_rows: rows=%d n=%d k=%d", rows, n,
                          k);
    return kvs_gpu_cuda_check(
        kvs_launch_pool(ws, x, rows, x_stride, n, k, is_max, out, out_stride, layer),
        "kvs_gpu_pool_rows", err);
}

extern "C" kvs_status kvs_gpu_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N,
                                         int normalize, int boost, const uint8_t *modality_dev,
                                         int layer, kvs_err *err) {
    if (!ws || !scores || H < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_score_post: H=%d N=%d", H, N);
    return kvs_gpu_cuda_check(
        kvs_launch_score_post(ws, scores, H, N, normalize, boost, modality_dev, layer),
        "kvs_gpu_score_post", err);
}
