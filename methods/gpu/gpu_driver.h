/*
 * gpu_driver.h -- private to methods/gpu/: what every GPU driver of a method
 * shares (gpu_driver.c) and the drivers themselves, which gpu_compress.c
 * dispatches to.
 *
 * Why a room (methods/gpu/) and not a foo_gpu.c beside each foo.c: the
 * drivers share one host-side toolkit (parameters read from the method's own
 * declaration, top-k segment descriptors, plan filling) and h2o, lookm and
 * meda share one driver; keeping them together keeps the .c files of methods/ the CPU
 * methods, each driver naming the CPU reference it mirrors. The numbers come
 * from kernels' building blocks (kvs_kernels.h), never from kernels'
 * internals.
 *
 * What it is not: no kernels, no CPU fallback.
 */
#ifndef KVS_GPU_DRIVER_H
#define KVS_GPU_DRIVER_H

#include "kvs_gpu_methods.h"
#include "kvsieve_methods.h"

/* One call of kvs_gpu_compress, as the drivers see it. */
typedef struct {
    const kvs_method *m;
    const kvs_params *p;
    const kvs_cache_view *c;
    kvs_shape shape;
    int per_layer;
    int q_rows; /* query rows the method reads (the last ones), as kvs_compress counts them */
    kvs_gpu_workspace *ws;
    kvs_topk_desc *desc; /* [L * Hkv] the top-k segments, layer-major (host) */
} kvs_gpu_ctx;

/* A method's GPU driver: the plan of kvs_gpu_compress for g (inputs checked
 * for shape; the device error record reset). */
typedef kvs_status (*kvs_gpu_driver)(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err);

/* Parameter `name` of the method, or KVS_ERR_INTERNAL when the method does
 * not declare it (kvs_param_get would assert). */
kvs_status kvs_gpu_param(const kvs_gpu_ctx *g, const char *name, double *out, kvs_err *err);

/* Finite checks of K, V (unless skip_kv) and of the last g->q_rows query
 * rows of each layer, on the device: the values kvs_compress checks. */
kvs_status kvs_gpu_check_inputs(kvs_gpu_ctx *g, int skip_kv, kvs_err *err);

/* Segment (l, h) of g->desc for a layer with budget B: the output row is
 * [0, head) ++ top-k of [lo, hi) ++ [tail_start, tail_start + tail). */
void kvs_gpu_set_desc(kvs_gpu_ctx *g, int l, int h, int B, long long score_off,
                      long long out_off, int head, int lo, int hi, int k, int tail_start,
                      int tail);

/* Top-k of every segment of g->desc over `scores` (device), the indices
 * back, one sync, the plan with these budgets [L] and merge rule. */
kvs_status kvs_gpu_select_fill(kvs_gpu_ctx *g, const float *scores, const int *budgets,
                               kvs_merge merge, kvs_plan *out, kvs_err *err);

/* The drivers. */
kvs_status kvs_gpu_run_index(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err);      /* full, random, streamingllm */
kvs_status kvs_gpu_run_flashcache(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err); /* flashcache.c */
kvs_status kvs_gpu_run_snapkv(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err);     /* snapkv.c */
kvs_status kvs_gpu_run_h2o(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err);   /* h2o.c */
kvs_status kvs_gpu_run_lookm(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err); /* parts/presets.c */
kvs_status kvs_gpu_run_meda(kvs_gpu_ctx *g, kvs_plan *out, kvs_err *err);  /* parts/presets.c */

#endif
