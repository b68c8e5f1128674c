/*
 * lowpass_route.cu -- the DCT low-pass deviation of one layer
 * (kvs_gpu_lowpass_prepare, kvs_gpu_lowpass_layer): dev [H][N] = per token
 * the mean squared K and V residual after keeping omega DCT coefficients,
 * and the four low / total energies, on the workspace's route: the FFT
 * route (dct_cufft.cu) or the truncated-basis GEMM route (fc_gemm.cu).
 * CPU reference: kvs_dct_lowpass_sqres (dct.h, dct_lowpass.c).
 *
 * What it is: the switch between the routes and the checks of the public
 * entry. What it is not: no kernels of its own.
 */
#include <stdio.h>

#include "fc_gemm.h"
#include "kvs_kernels_internal.h"

extern "C" kvs_status kvs_gpu_lowpass_prepare(kvs_gpu_workspace *ws, int N, int ncols, int omega,
                                              kvs_err *err) {
    if (!ws) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_lowpass_prepare: no workspace");
    if (ws->dct_route == KVS_GPU_DCT_FFT) return kvs_gpu_ensure_plans(ws, N, ncols, err);
    return kvs_fc_gemm_prepare(ws, N, ncols, omega, err);
}

static kvs_status route_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer, int omega,
                              float *dev, double *energy, kvs_err *err) {
    if (ws->dct_route == KVS_GPU_DCT_FFT) {
        char what[96];
        snprintf(what, sizeof what, "DCT FFT route: layer %d", layer);
        return kvs_gpu_cuda_check(kvs_launch_lowpass_layer(ws, ly, layer, omega, dev, energy),
                                  what, err);
    }
    return kvs_fc_gemm_layer(ws, ly, layer, omega, dev, energy, err);
}

extern "C" kvs_status kvs_gpu_lowpass_layer(kvs_gpu_workspace *ws, const kvs_layer *ly,
                                               int layer, int omega, float *dev, double *energy,
                                               kvs_err *err) {
    kvs_status st = kvs_gpu_check_view(ws, &ly->k, "K", err);
    if (!st) st = kvs_gpu_check_view(ws, &ly->v, "V", err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_lowpass_layer: layer %d", layer);
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    if (ly->v.n_heads != H || ly->v.n_tokens != N || ly->v.head_dim != d || H > ws->Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_lowpass_layer: layer %d: K [%d][%d][%d], V [%d][%d][%d], "
                          "workspace Hkv <= %d", layer, H, N, d, ly->v.n_heads, ly->v.n_tokens,
                          ly->v.head_dim, ws->Hkv);
    if (omega < 1 || omega > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_lowpass_layer: omega=%d outside [1, N=%d]", omega, N);
    st = kvs_gpu_lowpass_prepare(ws, N, 2 * H * d, omega, err);
    if (!st) st = route_layer(ws, ly, layer, omega, dev, energy, err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_lowpass_layer");
    return KVS_OK;
}

