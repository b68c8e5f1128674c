/*
 * fc_gemm.h -- private to kernels/: the truncated-basis GEMM route of the
 * DCT low-pass deviation (fc_gemm.cu). lowpass_route.cu calls it when the
 * workspace's setting (kvs_gpu_workspace_dct_route) is a GEMM route;
 * kvs_kernels.h documents both routes, their costs and when each wins.
 *
 * What it is: plain C declarations (C and nvcc's C++). What it is not: no
 * device code, no public API.
 */
#ifndef KVS_FC_GEMM_H
#define KVS_FC_GEMM_H

#include "kvs_kernels_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest basis the GEMM route allocates: omega x N fp32 (4 omega N bytes;
 * 54 MB at N = 8192, gamma = 0.2; 3.4 GB at N = 65536). A larger one is
 * KVS_ERR_UNSUPPORTED naming the sizes (use the FFT route). */
#define KVS_FC_GEMM_BASIS_CAP ((size_t)4 << 30)

/* Bytes of the basis of (N, omega). */
size_t kvs_fc_gemm_basis_bytes(int N, int omega);

typedef struct kvs_fc_gemm kvs_fc_gemm;
void kvs_fc_gemm_free(kvs_fc_gemm *g); /* NULL is fine; synchronises the device */

/* Before the first kvs_fc_gemm_layer of a shape (host side, may allocate):
 * builds the omega x N basis on the workspace stream (once per (N, omega);
 * the allocation is kept and re-used while it is large enough). Errors name
 * the route and the sizes. */
kvs_status kvs_fc_gemm_prepare(kvs_gpu_workspace *ws, int N, int ncols, int omega, kvs_err *err);

/* The low-pass deviation of one layer on the GEMM route (async): dev [H][N],
 * energy[4] = {low K, total K, low V, total V} (device). The views are
 * checked by the caller; kvs_fc_gemm_prepare ran for this shape. */
kvs_status kvs_fc_gemm_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer, int omega,
                             float *dev, double *energy, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
