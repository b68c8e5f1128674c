/*
 * dct_order.cuh -- private to kernels/ (device code only): the even/odd
 * token reordering of Makhoul's DCT algorithm, shared by the FFT route
 * (dct_cufft.cu: pack, residual, deviation) and the truncated-basis GEMM
 * route (fc_gemm.cu: the basis is built in the same reordered token order,
 * so both routes reuse one pack kernel and one deviation kernel).
 *
 * What it is not: no kernels, no host code; included by .cu files only.
 */
#ifndef KVS_DCT_ORDER_CUH
#define KVS_DCT_ORDER_CUH

/* Reordered position of token n: even tokens first, odd ones mirrored. */
__device__ __forceinline__ int mk_pos(int n, int N) { return (n & 1) ? N - 1 - (n >> 1) : (n >> 1); }
/* Its inverse: the token at reordered position p. */
__device__ __forceinline__ int mk_tok(int p, int N) {
    return p < (N + 1) / 2 ? 2 * p : 2 * (N - 1 - p) + 1;
}

#endif
