/*
 * dct_cufft.cu -- the DCT along tokens on cuFFT (Makhoul's
 * algorithm; kvs_kernels.h describes it): the pack / reorder kernels, the
 * twiddles, the fused low-pass band split with its Parseval energies and the
 * squared-residual deviation (the FFT route of kvs_gpu_lowpass_layer), the
 * cuFFT plans, and the standalone kvs_gpu_dct2 / kvs_gpu_dct3.
 * CPU reference: dct.h (dct.c, dct_lowpass.c).
 *
 * What it is not: no route choice (lowpass_route.cu), no GEMM route
 * (fc_gemm.cu, which reuses the pack and deviation launchers here).
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
#include "dct_order.cuh"

/* ------------------------------------------------------------------------ */
/* DCT (Makhoul) and the fused low-pass deviation statistics                 */
/* ------------------------------------------------------------------------ */

/* Reordered token positions: mk_pos / mk_tok (dct_order.cuh). */

/* One head of a view [H][N][d] -> rin columns (t*H + h)*d + c, reordered,
 * fp32; flags non-finite values with `code`. grid (N/32, d/32, H), block 32x8. */
__global__ void k_fc_pack(const void *base, int dt, long long s_head, long long s_tok, int H,
                          int N, int d, int t, float *rin, int code, int layer,
                          kvs_gpu_errrec *er) {
    __shared__ float tile[32][33];
    const int h = blockIdx.z, n0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int i = 0; i < 32; i += 8) {
        const int n = n0 + ty + i, c = c0 + tx;
        float v = 0.0f;
        if (n < N && c < d) {
            v = ldf(base, dt, h * s_head + n * s_tok + c);
            if (!isfinite(v)) report_err(er, code, layer, h, n, c);
        }
        tile[ty + i][tx] = v;
    }
    __syncthreads();
    for (int i = 0; i < 32; i += 8) {
        const int c = c0 + ty + i, n = n0 + tx;
        if (n < N && c < d) {
            const long long col = ((long long)t * H + h) * d + c;
            rin[col * N + mk_pos(n, N)] = tile[tx][ty + i];
        }
    }
}

/* x [ncols][N] -> rin reordered. */
__global__ void k_permute_cols(const float *x, float *rin, int ncols, int N) {
    const long long total = (long long)ncols * N;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long col = e / N;
        const int n = (int)(e % N);
        rin[col * N + mk_pos(n, N)] = x[e];
    }
}

/* rout reordered (already scaled) -> x [ncols][N]. */
__global__ void k_unpermute_cols(const float *rout, float *x, int ncols, int N) {
    const long long total = (long long)ncols * N;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long col = e / N;
        const int n = (int)(e % N);
        x[e] = rout[col * N + mk_pos(n, N)];
    }
}

/* z = exp(-i pi m / 2N) V[m]; Y[m] = Re z, Y[N-m] = -Im z (unnormalised DCT-II). */
__device__ __forceinline__ void mk_twiddle(int m, int N, double *c, double *s) {
    sincospi((double)m / (2.0 * (double)N), s, c);
}

/* Half spectrum -> orthonormal DCT-II coefficients X [ncols][N]. grid (Nh/256, ncols). */
__global__ void k_dct2_out(const cufftComplex *spec, float *X, int N, int Nh) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    const long long col = blockIdx.y;
    if (m >= Nh) return;
    const cufftComplex V = spec[col * Nh + m];
    double c, s;
    mk_twiddle(m, N, &c, &s);
    const double ym = c * V.x + s * V.y, ynm = s * V.x - c * V.y;
    const double a0 = sqrt(1.0 / N), a1 = sqrt(2.0 / N);
    X[col * N + m] = (float)((m == 0 ? a0 : a1) * ym);
    if (m >= 1 && N - m != m) X[col * N + (N - m)] = (float)(a1 * ynm);
}

/* Orthonormal DCT-III input X [ncols][N] -> half spectrum, scaled by 1/N for C2R. */
__global__ void k_dct3_in(const float *X, cufftComplex *spec, int N, int Nh) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    const long long col = blockIdx.y;
    if (m >= Nh) return;
    const double a0 = sqrt(1.0 / N), a1 = sqrt(2.0 / N);
    const double ym = (double)X[col * N + m] / (m == 0 ? a0 : a1);
    const double ynm = m >= 1 ? (double)X[col * N + (N - m)] / a1 : 0.0;
    double c, s;
    mk_twiddle(m, N, &c, &s);
    cufftComplex o;
    o.x = (float)((c * ym + s * ynm) / N);
    o.y = (float)((s * ym - c * ynm) / N);
    spec[col * Nh + m] = o;
}

/* Low-pass spectrum pass, in place on the half spectrum of every column:
 * Parseval energies (low band m < omega and total; columns [0, cols_per_t)
 * are K, the rest V) into energy[0..4), then the spectrum of the HIGH band
 * (m >= omega) of the reordered signal, scaled by 1/N for C2R: its inverse
 * is the residual x - x_base of the low-pass base, without forming the base.
 * grid (Nh/256, ncols), block 256. */
__global__ void k_fc_spectrum(cufftComplex *spec, int N, int Nh, int omega, int cols_per_t,
                              double *energy) {
    __shared__ double sh_lo[256], sh_tot[256];
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    const long long col = blockIdx.y;
    double lo = 0.0, tot = 0.0;
    if (m < Nh) {
        const cufftComplex V = spec[col * Nh + m];
        double c, s;
        mk_twiddle(m, N, &c, &s);
        const double ym = c * V.x + s * V.y, ynm = s * V.x - c * V.y;
        const double w0 = 1.0 / N, w1 = 2.0 / N; /* a_m^2 */
        /* fp32 coefficient values, as the CPU reference squares them */
        const float xm = (float)((m == 0 ? sqrt(w0) : sqrt(w1)) * ym);
        const double em = (double)xm * xm;
        tot += em;
        if (m < omega) lo += em;
        const int has_mirror = m >= 1 && N - m != m;
        if (has_mirror) {
            const float xn = (float)(sqrt(w1) * ynm);
            const double en = (double)xn * xn;
            tot += en;
            if (N - m < omega) lo += en;
        }
        /* keep the HIGH band: its inverse is the residual x - x_base itself
         * (the transform is linear), so the deviation pass reads one buffer */
        const double yl = m >= omega ? ym : 0.0;
        const double ynl = (m >= 1 && N - m >= omega) ? ynm : 0.0;
        cufftComplex o;
        o.x = (float)((c * yl + s * ynl) / N);
        o.y = (float)((s * yl - c * ynl) / N);
        spec[col * Nh + m] = o;
    }
    sh_lo[threadIdx.x] = lo;
    sh_tot[threadIdx.x] = tot;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            sh_lo[threadIdx.x] += sh_lo[threadIdx.x + o];
            sh_tot[threadIdx.x] += sh_tot[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int t = col < cols_per_t ? 0 : 1;
        atomicAdd(&energy[2 * t], sh_lo[0]);
        atomicAdd(&energy[2 * t + 1], sh_tot[0]);
    }
}

/* Deviation per token from the reordered residual columns (x - x_base).
 * grid (N/256, H), block 256. Columns: K head h = h*d + c, V = (H + h)*d + c. */
__global__ void k_fc_dev(const float *resid, int H, int N, int d, float *dev, int layer,
                         kvs_gpu_errrec *er) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (p >= N) return;
    const float inv_d = 1.0f / (float)d;
    float total = 0.0f;
    for (int t = 0; t < 2; t++) {
        float acc = 0.0f;
        for (int c = 0; c < d; c++) {
            const long long col = ((long long)t * H + h) * d + c;
            const float r = resid[col * N + p];
            acc = fmaf(r, r, acc);
        }
        total += acc * inv_d;
    }
    const int n = mk_tok(p, N);
    dev[(long long)h * N + n] = total;
    if (!isfinite(total)) report_err(er, KVS_GERR_DEV, layer, h, n, -1);
}


__global__ void k_n1_r2c(const float *rin, cufftComplex *spec, int ncols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncols) return;
    cufftComplex o;
    o.x = rin[c];
    o.y = 0.0f;
    spec[c] = o;
}
__global__ void k_n1_c2r(const cufftComplex *spec, float *rout, int ncols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < ncols) rout[c] = spec[c].x;
}


/* Forward / inverse real FFT of the workspace's (x_N, x_ncols) columns. */
static int exec_r2c(kvs_gpu_workspace *ws, const float *in, cufftComplex *out) {
    if (ws->x_N == 1) {
        k_n1_r2c<<<(unsigned)((ws->x_ncols + 255) / 256), 256, 0, ws->stream>>>(in, out, ws->x_ncols);
        return (int)cudaGetLastError();
    }
    return cufftExecR2C(ws->r2c, (cufftReal *)in, out) == CUFFT_SUCCESS ? 0 : (int)cudaErrorUnknown;
}
static int exec_c2r(kvs_gpu_workspace *ws, cufftComplex *in, float *out) {
    if (ws->x_N == 1) {
        k_n1_c2r<<<(unsigned)((ws->x_ncols + 255) / 256), 256, 0, ws->stream>>>(in, out, ws->x_ncols);
        return (int)cudaGetLastError();
    }
    return cufftExecC2R(ws->c2r, in, out) == CUFFT_SUCCESS ? 0 : (int)cudaErrorUnknown;
}


/* cuFFT plans for (N, ncols), re-made when the shape changes. */
extern "C" kvs_status kvs_gpu_ensure_plans(kvs_gpu_workspace *ws, int N, int ncols, kvs_err *err) {
    if (ws->x_N == N && ws->x_ncols == ncols && (N == 1 || (ws->have_r2c && ws->have_c2r)))
        return KVS_OK;
    if ((long long)ncols * N > (long long)ws->ncols * ws->N ||
        (long long)ncols * (N / 2 + 1) > (long long)ws->ncols * ws->Nh)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "DCT of %d columns of length %d does not fit the workspace (%d x %d)",
                          ncols, N, ws->ncols, ws->N);
    if (ws->have_r2c) cufftDestroy(ws->r2c);
    if (ws->have_c2r) cufftDestroy(ws->c2r);
    ws->have_r2c = ws->have_c2r = 0;
    ws->x_N = ws->x_ncols = 0;
    if (N == 1) { /* identity transform: no plan (k_n1_*) */
        ws->x_N = N;
        ws->x_ncols = ncols;
        return KVS_OK;
    }
    int n = N;
    kvs_status st = kvs_gpu_cufft_check(cufftPlanMany(&ws->r2c, 1, &n, NULL, 1, N, NULL, 1, N / 2 + 1,
                                              CUFFT_R2C, ncols),
                                "cufftPlanMany R2C", err);
    if (st) return st;
    ws->have_r2c = 1;
    st = kvs_gpu_cufft_check(cufftPlanMany(&ws->c2r, 1, &n, NULL, 1, N / 2 + 1, NULL, 1, N, CUFFT_C2R,
                                   ncols),
                     "cufftPlanMany C2R", err);
    if (st) return st;
    ws->have_c2r = 1;
    st = kvs_gpu_cufft_check(cufftSetStream(ws->r2c, ws->stream), "cufftSetStream", err);
    if (!st) st = kvs_gpu_cufft_check(cufftSetStream(ws->c2r, ws->stream), "cufftSetStream", err);
    if (st) return st;
    ws->x_N = N;
    ws->x_ncols = ncols;
    return KVS_OK;
}


extern "C" int kvs_launch_lowpass_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer,
                                           int omega, float *dev, double *energy) {
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    const int ncols = 2 * H * d, Nh = N / 2 + 1;
    cudaError_t rc = cudaMemsetAsync(energy, 0, 4 * sizeof(double), ws->stream);
    if (rc) return (int)rc;
    if ((rc = (cudaError_t)kvs_launch_fc_pack(ws, ly, layer))) return (int)rc;
    if ((rc = (cudaError_t)exec_r2c(ws, ws->rin, ws->spec))) return (int)rc;
    const dim3 sg((unsigned)((Nh + 255) / 256), (unsigned)ncols);
    k_fc_spectrum<<<sg, 256, 0, ws->stream>>>(ws->spec, N, Nh, omega, H * d, energy);
    if ((rc = cudaGetLastError())) return (int)rc;
    if ((rc = (cudaError_t)exec_c2r(ws, ws->spec, ws->rout))) return (int)rc;
    return kvs_launch_fc_dev(ws, ws->rout, H, N, d, dev, layer);
}

extern "C" int kvs_launch_fc_pack(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer) {
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    const dim3 pb(32, 8), pg((unsigned)((N + 31) / 32), (unsigned)((d + 31) / 32), (unsigned)H);
    k_fc_pack<<<pg, pb, 0, ws->stream>>>(ly->k.data, (int)ly->k.dtype, ly->k.s_head, ly->k.s_tok,
                                         H, N, d, 0, ws->rin, KVS_GERR_K, layer, ws->errrec);
    k_fc_pack<<<pg, pb, 0, ws->stream>>>(ly->v.data, (int)ly->v.dtype, ly->v.s_head, ly->v.s_tok,
                                         H, N, d, 1, ws->rin, KVS_GERR_V, layer, ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_fc_dev(kvs_gpu_workspace *ws, const float *resid, int H, int N, int d,
                                 float *dev, int layer) {
    const dim3 dg((unsigned)((N + 255) / 256), (unsigned)H);
    k_fc_dev<<<dg, 256, 0, ws->stream>>>(resid, H, N, d, dev, layer, ws->errrec);
    return (int)cudaGetLastError();
}


/* ------------------------------------------------------------------------ */
/* Public building blocks                                                    */
/* ------------------------------------------------------------------------ */

extern "C" kvs_status kvs_gpu_dct2(kvs_gpu_workspace *ws, const float *x, float *X, int ncols,
                                   int N, kvs_err *err) {
    if (!ws || !x || !X || ncols < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_dct2: bad arguments (ncols=%d N=%d)",
                          ncols, N);
    kvs_status st = kvs_gpu_ensure_plans(ws, N, ncols, err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_dct2");
    const int Nh = N / 2 + 1;
    k_permute_cols<<<grid_for((long long)ncols * N, 256), 256, 0, ws->stream>>>(x, ws->rin,
                                                                                 ncols, N);
    if (exec_r2c(ws, ws->rin, ws->spec))
        return kvs_errorf(err, KVS_ERR_INTERNAL, "kvs_gpu_dct2: forward FFT failed");
    k_dct2_out<<<dim3((unsigned)((Nh + 255) / 256), (unsigned)ncols), 256, 0, ws->stream>>>(
        ws->spec, X, N, Nh);
    return kvs_gpu_cuda_check(cudaGetLastError(), "kvs_gpu_dct2", err);
}

extern "C" kvs_status kvs_gpu_dct3(kvs_gpu_workspace *ws, const float *X, float *x, int ncols,
                                   int N, kvs_err *err) {
    if (!ws || !x || !X || ncols < 1 || N < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_dct3: bad arguments (ncols=%d N=%d)",
                          ncols, N);
    kvs_status st = kvs_gpu_ensure_plans(ws, N, ncols, err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_dct3");
    const int Nh = N / 2 + 1;
    k_dct3_in<<<dim3((unsigned)((Nh + 255) / 256), (unsigned)ncols), 256, 0, ws->stream>>>(
        X, ws->spec, N, Nh);
    if (exec_c2r(ws, ws->spec, ws->rout))
        return kvs_errorf(err, KVS_ERR_INTERNAL, "kvs_gpu_dct3: inverse FFT failed");
    k_unpermute_cols<<<grid_for((long long)ncols * N, 256), 256, 0, ws->stream>>>(ws->rout, x,
                                                                                   ncols, N);
    return kvs_gpu_cuda_check(cudaGetLastError(), "kvs_gpu_dct3", err);
}

