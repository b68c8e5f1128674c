/*
 * gpu_check.cu -- errors and checks of the CUDA path: CUDA / cuFFT
 * status -> kvs_err, the device error record (cleared, filled by the
 * finiteness checks and the kernels, reported by kvs_gpu_sync), view checks
 * against a workspace, and the start / reset / download steps a method
 * driver brackets its work with (kvs_kernels.h, "for method drivers").
 *
 * What it is: host code plus one kernel (the finiteness scan). What it is
 * not: no building block (the other .cu files), no workspace allocation
 * (gpu_workspace.cu).
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
/* Generic kernels                                                           */
/* ------------------------------------------------------------------------ */

__global__ void k_check_finite(const void *base, int dt, long long s_head, long long s_tok,
                               int H, int N, int d, int code, int layer, kvs_gpu_errrec *er) {
    const long long total = (long long)H * N * d;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(e % d);
        const long long t = e / d;
        const int n = (int)(t % N), h = (int)(t / N);
        const float v = ldf(base, dt, h * s_head + n * s_tok + c);
        if (!isfinite(v)) report_err(er, code, layer, h, n, c);
    }
}


extern "C" kvs_status kvs_gpu_cuda_check(int cuda_rc, const char *what, kvs_err *err) {
    if (cuda_rc == 0) return KVS_OK;
    return kvs_errorf(err, KVS_ERR_INTERNAL, "%s: CUDA error %d (%s): %s", what, cuda_rc,
                      cudaGetErrorName((cudaError_t)cuda_rc),
                      cudaGetErrorString((cudaError_t)cuda_rc));
}


extern "C" kvs_status kvs_gpu_cufft_check(cufftResult r, const char *what, kvs_err *err) {
    if (r == CUFFT_SUCCESS) return KVS_OK;
    return kvs_errorf(err, r == CUFFT_ALLOC_FAILED ? KVS_ERR_NOMEM : KVS_ERR_INTERNAL,
                      "%s: cuFFT error %d", what, (int)r);
}


static const char *gerr_what(int code) {
    switch (code) {
    case KVS_GERR_K: return "K";
    case KVS_GERR_V: return "V";
    case KVS_GERR_Q: return "Q";
    default: return "?";
    }
}

extern "C" kvs_status kvs_gpu_sync(kvs_gpu_workspace *ws, kvs_err *err) {
    cudaError_t rc = cudaMemcpyAsync(ws->h_err, ws->errrec, sizeof(kvs_gpu_errrec),
                                     cudaMemcpyDeviceToHost, ws->stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(ws->stream);
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, "kvs_gpu_sync", err);
    const kvs_gpu_errrec e = *ws->h_err;
    if (!e.flag) return KVS_OK;
    /* consumed: clear for the next call */
    memset(ws->h_err, 0, sizeof *ws->h_err);
    rc = cudaMemsetAsync(ws->errrec, 0, sizeof(kvs_gpu_errrec), ws->stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(ws->stream);
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, "kvs_gpu_sync: reset", err);
    switch (e.code) {
    case KVS_GERR_K:
    case KVS_GERR_V:
    case KVS_GERR_Q:
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "layer %d: %s head %d token %d channel %d is NaN or Inf (found on the "
                          "device)", e.layer, gerr_what(e.code), e.head, e.token, e.chan);
    case KVS_GERR_DEV:
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "layer %d head %d: DCT low-pass deviation of token %d is not finite "
                          "(values too large for fp32 squares)", e.layer, e.head, e.token);
    case KVS_GERR_LSE:
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "layer %d: log-sum-exp of query head %d row %d is not finite (NaN or Inf "
                          "in q or k?)", e.layer, e.head, e.token);
    case KVS_GERR_SCORE:
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "layer %d: KV head %d: score of token %d is not finite (logit overflow?)",
                          e.layer, e.head, e.token);
    case KVS_GERR_NAN:
        return kvs_errorf(err, KVS_ERR_NUMERIC, "top-k: layer %d head %d: score of token %d is NaN",
                          e.layer, e.head, e.token);
    case KVS_GERR_ASSIGN:
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "merge: head %d token %d: key similarity is NaN (NaN or Inf in K)",
                          e.head, e.token);
    case KVS_GERR_ENTROPY:
        return kvs_errorf(err, KVS_ERR_NUMERIC, "layer %d: entropy is not finite", e.layer);
    default:
        return kvs_errorf(err, KVS_ERR_INTERNAL, "device reported unknown error code %d", e.code);
    }
}

extern "C" kvs_status kvs_gpu_check_view(const kvs_gpu_workspace *ws, const kvs_view *v,
                                         const char *what, kvs_err *err) {
    if (!v->data) return kvs_errorf(err, KVS_ERR_INVALID, "%s has no data", what);
    if (v->device != KVS_CUDA)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s is host memory; the GPU path needs device views (KVS_CUDA)", what);
    if (v->dtype != KVS_F32 && v->dtype != KVS_F16 && v->dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s has dtype %s (need F32, F16 or BF16)", what,
                          kvs_dtype_name(v->dtype));
    if (v->n_tokens > ws->N || v->head_dim > ws->d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s is [%d][%d][%d] but the workspace was sized for N <= %d, d <= %d",
                          what, v->n_heads, v->n_tokens, v->head_dim, ws->N, ws->d);
    return KVS_OK;
}


extern "C" int kvs_launch_reset_err(kvs_gpu_workspace *ws) {
    return (int)cudaMemsetAsync(ws->errrec, 0, sizeof(kvs_gpu_errrec), ws->stream);
}

extern "C" int kvs_launch_check_finite(kvs_gpu_workspace *ws, const kvs_view *v, int code,
                                       int layer) {
    const long long total = (long long)v->n_heads * v->n_tokens * v->head_dim;
    k_check_finite<<<grid_for(total, 256), 256, 0, ws->stream>>>(
        v->data, (int)v->dtype, v->s_head, v->s_tok, v->n_heads, v->n_tokens, v->head_dim, code,
        layer, ws->errrec);
    return (int)cudaGetLastError();
}


/* ---- for method drivers -------------------------------------------------------- */

extern "C" kvs_status kvs_gpu_begin(kvs_gpu_workspace *ws, const kvs_cache_view *c,
                                    const kvs_shape *s, kvs_err *err) {
    if (!ws || !c || !s) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_begin: NULL argument");
    for (int l = 0; l < s->n_layers; l++) {
        const kvs_layer *ly = &c->layers[l];
        char what[48];
        snprintf(what, sizeof what, "layer %d: K", l);
        kvs_status st = kvs_gpu_check_view(ws, &ly->k, what, err);
        if (st) return st;
        snprintf(what, sizeof what, "layer %d: V", l);
        if ((st = kvs_gpu_check_view(ws, &ly->v, what, err))) return st;
        if (ly->q.data && ly->q.n_tokens > 0) {
            snprintf(what, sizeof what, "layer %d: Q", l);
            if ((st = kvs_gpu_check_view(ws, &ly->q, what, err))) return st;
        }
    }
    if (s->n_layers > ws->L || s->n_kv_heads > ws->Hkv ||
        (s->n_queries > 0 && s->n_q_heads > ws->Hq))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "cache L=%d Hkv=%d Hq=%d exceeds the workspace (L <= %d, Hkv <= %d, "
                          "Hq <= %d)",
                          s->n_layers, s->n_kv_heads, s->n_q_heads, ws->L, ws->Hkv, ws->Hq);
    return kvs_gpu_cuda_check(kvs_launch_reset_err(ws), "reset", err);
}

extern "C" void kvs_gpu_reset(kvs_gpu_workspace *ws) {
    if (!ws) return;
    kvs_err tmp;
    kvs_err_clear(&tmp);
    (void)kvs_gpu_sync(ws, &tmp);
}

extern "C" kvs_status kvs_gpu_check_finite(kvs_gpu_workspace *ws, const kvs_cache_view *c,
                                           int n_layers, int q_rows, int skip_kv, kvs_err *err) {
    for (int l = 0; l < n_layers; l++) {
        const kvs_layer *ly = &c->layers[l];
        int rc = 0;
        if (!skip_kv) {
            rc = kvs_launch_check_finite(ws, &ly->k, KVS_GERR_K, l);
            if (!rc) rc = kvs_launch_check_finite(ws, &ly->v, KVS_GERR_V, l);
        }
        if (!rc && q_rows > 0 && ly->q.data && ly->q.n_tokens > 0) {
            kvs_view qv = ly->q; /* [Hq][rows][d]: the last rows; token index = row - (Nq - rows) */
            const int rows = q_rows < qv.n_tokens ? q_rows : qv.n_tokens;
            qv.data = (const char *)qv.data +
                      (size_t)(qv.n_tokens - rows) * (size_t)qv.s_tok * kvs_dtype_size(qv.dtype);
            qv.n_tokens = rows;
            rc = kvs_launch_check_finite(ws, &qv, KVS_GERR_Q, l);
        }
        if (rc) return kvs_gpu_cuda_check(rc, "finiteness check", err);
    }
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_download(kvs_gpu_workspace *ws, void *dst, const void *src,
                                       size_t bytes, kvs_err *err) {
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_download", err);
    return kvs_gpu_sync(ws, err);
}
