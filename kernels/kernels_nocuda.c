/*
 * kernels_nocuda.c -- kvsieve_kernels for a build without CUDA (no nvcc, or
 * KVSIEVE_CUDA=OFF): the API of kvs_kernels.h, every function answering
 * KVS_ERR_UNSUPPORTED "built without CUDA".
 *
 * What it is: the honest absence of the GPU path, so callers (the CLI's
 * `kvsieve devices`, the benchmarks, the tests) build and say why there is
 * no device. What it is not: a CPU fallback -- nothing here computes; the CPU
 * path is kvs_compress / kvs_apply in core/ and methods/.
 */
#include "kvs_kernels.h"

#include <stdio.h>

static kvs_status no_cuda(kvs_err *err, const char *fn) {
    return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                      "%s: built without CUDA (configure with nvcc present, -DKVSIEVE_CUDA=ON)", fn);
}

kvs_status kvs_gpu_device_count(int *count, kvs_err *err) {
    if (count) *count = 0;
    return no_cuda(err, "kvs_gpu_device_count");
}

kvs_status kvs_gpu_device_describe(int dev, char *buf, size_t n, kvs_err *err) {
    if (buf && n) buf[0] = '\0';
    return no_cuda(err, "kvs_gpu_device_describe");
}

kvs_status kvs_gpu_malloc(void **ptr, size_t bytes, kvs_err *err) {
    if (ptr) *ptr = NULL;
    return no_cuda(err, "kvs_gpu_malloc");
}

void kvs_gpu_free(void *ptr) { (void)ptr; }

kvs_status kvs_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_memcpy_h2d");
}

kvs_status kvs_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_memcpy_d2h");
}

kvs_status kvs_gpu_poison(void *ptr, size_t bytes, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_poison");
}

kvs_status kvs_gpu_workspace_init(kvs_gpu_workspace **ws, const kvs_shape *max, kvs_err *err) {
    if (ws) *ws = NULL;
    return no_cuda(err, "kvs_gpu_workspace_init");
}

void kvs_gpu_workspace_free(kvs_gpu_workspace *ws) { (void)ws; }

void *kvs_gpu_workspace_stream(kvs_gpu_workspace *ws) { return NULL; }

int kvs_gpu_workspace_tensor_cores(kvs_gpu_workspace *ws, int on) { return 0; }

kvs_status kvs_gpu_workspace_attn_kernel(kvs_gpu_workspace *ws, int which, int *in_force,
                                         kvs_err *err) {
    if (in_force) *in_force = KVS_GPU_ATTN_WMMA;
    return no_cuda(err, "kvs_gpu_workspace_attn_kernel");
}

kvs_status kvs_gpu_workspace_dct_route(kvs_gpu_workspace *ws, int which, int *in_force,
                                       kvs_err *err) {
    if (in_force) *in_force = KVS_GPU_DCT_FFT;
    return no_cuda(err, "kvs_gpu_workspace_dct_route");
}

int kvs_gpu_attn_kernel_for(const kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k) {
    return KVS_GPU_ATTN_CUDA_CORES;
}

kvs_status kvs_gpu_sync(kvs_gpu_workspace *ws, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_sync");
}

const char *kvs_gpu_workspace_device(const kvs_gpu_workspace *ws) { return "none (built without CUDA)"; }

kvs_status kvs_gpu_apply_layer(kvs_gpu_workspace *ws, const kvs_layer *device_layer,
                               const kvs_plan *plan, int layer, float *k_out, float *v_out,
                               kvs_err *err) {
    return no_cuda(err, "kvs_gpu_apply_layer");
}

kvs_status kvs_gpu_dct2(kvs_gpu_workspace *ws, const float *x, float *X, int ncols, int N,
                        kvs_err *err) {
    return no_cuda(err, "kvs_gpu_dct2");
}

kvs_status kvs_gpu_dct3(kvs_gpu_workspace *ws, const float *X, float *x, int ncols, int N,
                        kvs_err *err) {
    return no_cuda(err, "kvs_gpu_dct3");
}

kvs_status kvs_gpu_lowpass_layer(kvs_gpu_workspace *ws, const kvs_layer *device_layer,
                                    int layer, int omega, float *dev, double *energy,
                                    kvs_err *err) {
    return no_cuda(err, "kvs_gpu_lowpass_layer");
}

kvs_status kvs_gpu_topk(kvs_gpu_workspace *ws, const float *scores, int S, int n, int k,
                        int32_t *out, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_topk");
}

kvs_status kvs_gpu_pool1d(kvs_gpu_workspace *ws, const float *x, int rows, int n, int k,
                          int is_max, float *out, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_pool1d");
}

kvs_status kvs_gpu_attn_lse(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                            float *lse, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_attn_lse");
}

kvs_status kvs_gpu_attn_colsum(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                               const float *lse, float *colsum, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_attn_colsum");
}

kvs_status kvs_gpu_attn_entropies(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                  const float *lse, const uint8_t *modality,
                                  kvs_entropy_stats *out, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_attn_entropies");
}

kvs_status kvs_gpu_merge_assign(kvs_gpu_workspace *ws, const kvs_view *k, int head,
                                const int32_t *kept, int B, int32_t *assign, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_merge_assign");
}

kvs_status kvs_gpu_fill_random(kvs_gpu_workspace *ws, void *ptr, kvs_dtype t, size_t count,
                               uint64_t seed, float scale, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_fill_random");
}

/* ---- for method drivers ---- */

kvs_gpu_scratch kvs_gpu_workspace_scratch(kvs_gpu_workspace *ws) {
    const kvs_gpu_scratch none = {0};
    return none;
}

kvs_status kvs_gpu_begin(kvs_gpu_workspace *ws, const kvs_cache_view *c, const kvs_shape *s,
                         kvs_err *err) {
    return no_cuda(err, "kvs_gpu_begin");
}

void kvs_gpu_reset(kvs_gpu_workspace *ws) { (void)ws; }

kvs_status kvs_gpu_check_finite(kvs_gpu_workspace *ws, const kvs_cache_view *c, int n_layers,
                                int q_rows, int skip_kv, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_check_finite");
}

kvs_status kvs_gpu_upload_modality(kvs_gpu_workspace *ws, const uint8_t *modality, int N,
                                   const uint8_t **dev, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_upload_modality");
}

kvs_status kvs_gpu_download(kvs_gpu_workspace *ws, void *dst, const void *src, size_t bytes,
                            kvs_err *err) {
    return no_cuda(err, "kvs_gpu_download");
}

kvs_status kvs_gpu_topk_segments(kvs_gpu_workspace *ws, const float *scores,
                                 const kvs_topk_desc *desc, int nseg, int32_t *idx,
                                 long long total, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_topk_segments");
}

kvs_status kvs_gpu_lowpass_prepare(kvs_gpu_workspace *ws, int N, int ncols, int omega,
                                   kvs_err *err) {
    return no_cuda(err, "kvs_gpu_lowpass_prepare");
}

kvs_status kvs_gpu_head_sum(kvs_gpu_workspace *ws, const float *x, int H, int N, float *out,
                            kvs_err *err) {
    return no_cuda(err, "kvs_gpu_head_sum");
}

kvs_status kvs_gpu_pool_rows(kvs_gpu_workspace *ws, const float *x, int rows, int x_stride, int n,
                             int k, int is_max, float *out, int out_stride, int layer,
                             kvs_err *err) {
    return no_cuda(err, "kvs_gpu_pool_rows");
}

kvs_status kvs_gpu_attn_lse_at(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                               float *lse, int layer, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_attn_lse_at");
}

kvs_status kvs_gpu_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N, int normalize,
                              int boost, const uint8_t *modality_dev, int layer, kvs_err *err) {
    return no_cuda(err, "kvs_gpu_score_post");
}

kvs_status kvs_gpu_attn_entropy_stats(kvs_gpu_workspace *ws, const kvs_view *q,
                                      const kvs_view *k, const float *lse,
                                      const uint8_t *modality_dev, double *stats, int layer,
                                      kvs_err *err) {
    return no_cuda(err, "kvs_gpu_attn_entropy_stats");
}
