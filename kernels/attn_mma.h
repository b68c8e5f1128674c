/*
 * attn_mma.h -- private to kernels/: the register-tiled (FlashAttention-2
 * style) attention statistics kernels of attn_mma.cu, called by the
 * launchers in attention.cu when the workspace's attention kernel is
 * KVS_GPU_ATTN_MMA and the views qualify (kvs_attn_mma_usable).
 *
 * What it is: plain C declarations (C and nvcc's C++). What it is not: no
 * device code, no public API (kvs_kernels.h documents the switch).
 */
#ifndef KVS_ATTN_MMA_H
#define KVS_ATTN_MMA_H

#include "kvs_kernels_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head dimension of the mma kernels (templates for d <= 64 and
 * d <= 128, zero-padded to 64 / 128). */
#define KVS_ATTN_MMA_MAX_D 128

/* 1 when the mma kernels can run on these views: same dtype F16 or BF16,
 * d % 8 == 0 and 8 <= d <= KVS_ATTN_MMA_MAX_D, data 16-byte aligned and
 * head / token strides multiples of 8 elements (16-byte cp.async rows).
 * Says nothing about the device or the workspace setting. */
int kvs_attn_mma_views_ok(const kvs_view *q, const kvs_view *k);

/* Raises the dynamic shared-memory limit of every mma kernel instance
 * (above the 48 KiB default); once per workspace on sm_80+. 0 or a
 * cudaError_t. */
int kvs_attn_mma_prepare(void);

/* Pass 1 (lse [Hq][Nq], natural log, scale 1/sqrt(d)) with the mma kernel;
 * with few row tiles the keys are split into *nsplit_out parts whose
 * partial (max, sum) pairs go to ws->lsepart [2][nsplit][Hq][Nq]: the
 * caller (attention.cu) then runs kvs_launch_lse_combine. 0 or a
 * cudaError_t. */
int kvs_launch_lse_mma(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k, float *lse,
                       int layer, int *nsplit_out);

/* Pass 2: colpart [Hq][N] (fp64 column sums per query head) with the mma
 * kernel; the caller runs the GQA mean (k_colsum_combine). 0 or a
 * cudaError_t. */
int kvs_launch_colsum_mma(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                          const float *lse, double *colpart);

#ifdef __cplusplus
}
#endif
#endif
