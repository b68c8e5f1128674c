/*
 * kvs_gpu_methods.h -- the GPU entry point of the compression methods:
 * kvs_gpu_compress (methods/gpu/), the device twin of core's kvs_compress.
 *
 * What it is: for a cache whose K/V/Q views live in device memory
 * (kvs_view.device == KVS_CUDA), fp32 / fp16 / bf16, fp32 accumulation, the
 * plan the CPU method would make, computed with kernels' building blocks
 * (kvs_kernels.h) on the workspace's stream. Implemented: flashcache,
 * snapkv, h2o, lookm, meda; full, random and streamingllm compute no scores
 * (their plans are index arithmetic, taken from the CPU method itself after
 * a device-side finiteness check). Which method has a driver is the table
 * in gpu_compress.c, keyed by the method's descriptor.
 *
 * What it is not: no CPU fallback. A method without a GPU driver (the
 * presets of methods/parts, any method registered later) is
 * KVS_ERR_UNSUPPORTED "method X: not implemented on GPU (device ...)"; a
 * build without CUDA answers KVS_ERR_UNSUPPORTED "built without CUDA" (from
 * kernels), a machine without a device "no CUDA device".
 */
#ifndef KVS_GPU_METHODS_H
#define KVS_GPU_METHODS_H

#include "kvs_kernels.h"
#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Same contract as kvs_compress (core/kvsieve.h), device views. The plan is
 * host memory, identical to the CPU method's up to exact score ties that
 * fp32 rounding may order differently. Synchronises once at the end. */
kvs_status kvs_gpu_compress(const char *method, const kvs_params *p,
                            const kvs_cache_view *device_view, const kvs_budget *b,
                            kvs_gpu_workspace *ws, kvs_plan *out, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
