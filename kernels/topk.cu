/*
 * topk.cu -- per-segment top-k on the device (kvs_kernels.h: MSB-first
 * radix select on 64-bit keys, ties to the lower index, ascending output
 * without a sort), its launcher, kvs_gpu_topk and the segment form
 * kvs_gpu_topk_segments that method drivers select plans with.
 * CPU reference: core's kvs_topk_indices (core/select.c).
 *
 * What it is not: no scores, no budgets.
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
/* Top-k: one block per segment                                              */
/* ------------------------------------------------------------------------ */

__global__ void __launch_bounds__(TOPK_THREADS)
    k_topk(const float *scores, const kvs_topk_desc *D, int32_t *idx, kvs_gpu_errrec *er) {
    __shared__ unsigned hist[256];
    __shared__ unsigned long long sh_prefix, sh_mask;
    __shared__ int sh_krem, sh_done, sh_nan;
    __shared__ int scan_ws[32];
    const kvs_topk_desc ds = D[blockIdx.x];
    const float *s = scores + ds.score_off;
    int32_t *o = idx + ds.out_off;
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int i = tid; i < ds.head_cnt; i += nt) o[i] = i;
    for (int i = tid; i < ds.tail_cnt; i += nt) o[ds.head_cnt + ds.k + i] = ds.tail_start + i;
    if (ds.k <= 0) return;
    int32_t *os = o + ds.head_cnt;
    const int n = ds.hi - ds.lo;
    if (tid == 0) {
        sh_prefix = 0ull;
        sh_mask = 0ull;
        sh_krem = ds.k;
        sh_done = 0;
        sh_nan = 0;
    }
    __syncthreads();
    for (int j = ds.lo + tid; j < ds.hi; j += nt)
        if (isnan(s[j])) {
            report_err(er, KVS_GERR_NAN, ds.layer, ds.head, j, -1);
            sh_nan = 1;
        }
    __syncthreads();
    if (sh_nan) return;
    if (ds.k >= n) {
        for (int i = tid; i < n; i += nt) os[i] = ds.lo + i;
        return;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt) hist[b] = 0u;
        __syncthreads();
        const unsigned long long prefix = sh_prefix, mask = sh_mask;
        for (int j = ds.lo + tid; j < ds.hi; j += nt) {
            const unsigned long long key = topk_key(s[j], j);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255ull], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int cum = 0, chosen = 0;
            for (int b = 255; b >= 0; b--) {
                if (cum + (int)hist[b] >= sh_krem) {
                    chosen = b;
                    break;
                }
                cum += (int)hist[b];
            }
            sh_krem -= cum;
            sh_prefix = prefix | ((unsigned long long)chosen << shift);
            sh_mask = mask | (255ull << shift);
            sh_done = (int)hist[chosen] == sh_krem;
        }
        __syncthreads();
        if (sh_done) break;
    }
    const unsigned long long prefix = sh_prefix, mask = sh_mask;
    int running = 0;
    for (int base = ds.lo; base < ds.hi; base += nt) {
        const int j = base + tid;
        int sel = 0;
        if (j < ds.hi) sel = (topk_key(s[j], j) & mask) >= prefix;
        int total = 0;
        const int pos = block_excl_scan(sel, &total, scan_ws);
        if (sel) os[running + pos] = j;
        running += total;
    }
}


extern "C" int kvs_launch_topk(kvs_gpu_workspace *ws, const float *scores,
                               const kvs_topk_desc *desc_dev, int nseg, int32_t *idx) {
    if (nseg <= 0) return 0;
    k_topk<<<(unsigned)nseg, TOPK_THREADS, 0, ws->stream>>>(scores, desc_dev, idx, ws->errrec);
    return (int)cudaGetLastError();
}


extern "C" kvs_status kvs_gpu_topk(kvs_gpu_workspace *ws, const float *scores, int S, int n,
                                   int k, int32_t *out, kvs_err *err) {
    if (!ws || S < 1 || n < 1 || k < 0 || k > n || S > ws->L * ws->Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_topk: k=%d of n=%d, S=%d segments (workspace holds %d)", k, n, S,
                          ws ? ws->L * ws->Hkv : 0);
    /* the previous use of the pinned staging must be finished */
    cudaError_t rc = cudaStreamSynchronize(ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_topk", err);
    for (int s = 0; s < S; s++) {
        kvs_topk_desc *D = &ws->h_desc[s];
        memset(D, 0, sizeof *D);
        D->score_off = (long long)s * n;
        D->out_off = (long long)s * k;
        D->lo = 0;
        D->hi = n;
        D->k = k;
        D->tail_start = n;
        D->layer = -1;
        D->head = s;
    }
    rc = cudaMemcpyAsync(ws->desc, ws->h_desc, sizeof(kvs_topk_desc) * (size_t)S,
                         cudaMemcpyHostToDevice, ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_topk", err);
    return kvs_gpu_cuda_check(kvs_launch_topk(ws, scores, ws->desc, S, out), "kvs_gpu_topk", err);
}


extern "C" kvs_status kvs_gpu_topk_segments(kvs_gpu_workspace *ws, const float *scores,
                                            const kvs_topk_desc *desc, int nseg, int32_t *idx,
                                            long long total, kvs_err *err) {
    if (!ws || !scores || !desc || !idx || nseg < 1 || nseg > ws->L * ws->Hkv || total < 0 ||
        total > (long long)ws->L * ws->Hkv * ws->N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_topk_segments: %d segments, %lld indices (workspace: %d, %lld)",
                          nseg, total, ws ? ws->L * ws->Hkv : 0,
                          ws ? (long long)ws->L * ws->Hkv * ws->N : 0LL);
    memcpy(ws->h_desc, desc, sizeof(kvs_topk_desc) * (size_t)nseg);
    int rc = (int)cudaMemcpyAsync(ws->desc, ws->h_desc, sizeof(kvs_topk_desc) * (size_t)nseg,
                                  cudaMemcpyHostToDevice, ws->stream);
    if (!rc) rc = kvs_launch_topk(ws, scores, ws->desc, nseg, ws->idx);
    if (!rc)
        rc = (int)cudaMemcpyAsync(ws->h_idx, ws->idx, sizeof(int32_t) * (size_t)total,
                                  cudaMemcpyDeviceToHost, ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "top-k", err);
    kvs_status st = kvs_gpu_sync(ws, err);
    if (st) return st;
    memcpy(idx, ws->h_idx, sizeof(int32_t) * (size_t)total);
    return KVS_OK;
}
