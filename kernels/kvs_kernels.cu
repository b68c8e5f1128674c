/*
 * kvs_kernels.cu -- the device code of kvsieve: workspace, memory helpers,
 * the building-block kernels and their public / internal launchers (see
 * kvs_kernels.h for the algorithms, kvs_kernels_internal.h for the layout).
 *
 * What it is: one translation unit for everything but the register-tiled
 * attention kernels (attn_mma.cu, templated over d and the 16-bit type): no
 * templates over dtypes here (a uniform runtime switch in ldf()), one tile-dot
 * helper shared by every attention-like kernel (64 x 64 logits per block of
 * 16 x 16 threads, 4 x 4 per thread, d in chunks of 64 through shared
 * memory), fp32 arithmetic with fp64 where sums get long.
 * What it is not: no method logic (gpu_compress.c decides budgets and
 * segments), no host synchronisation except in kvs_gpu_sync and the
 * documented synchronous helpers.
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

#include "attn_mma.h"
#include "dct_order.cuh"
#include "fc_gemm.h"
#include "kvs_kernels_internal.h"

#define TILE 64
#define TPAD 65
#define LDH 72 /* half tiles: row pitch in elements (16-byte multiple) */
#define LDS 68 /* fp32 staging of a wmma result tile: row pitch */
/* Shared bytes of one tile_dot: SIMT: two [64][65] fp32 tiles; tensor
 * cores: two [64][72] 16-bit tiles + a [64][68] fp32 result tile. */
#define TILE_SMEM_SIMT (2 * TILE * TPAD * 4)
#define TILE_SMEM_TC (2 * TILE * LDH * 2 + TILE * LDS * 4)
#define TILE_SMEM (TILE_SMEM_SIMT > TILE_SMEM_TC ? TILE_SMEM_SIMT : TILE_SMEM_TC)
#define TOPK_THREADS 1024

/* ------------------------------------------------------------------------ */
/* Device helpers                                                            */
/* ------------------------------------------------------------------------ */

__device__ __forceinline__ float ldf(const void *base, int dt, long long off) {
    if (dt == KVS_F32) return ((const float *)base)[off];
    const unsigned short u = ((const unsigned short *)base)[off];
    if (dt == KVS_F16) return __half2float(__ushort_as_half(u));
    return __uint_as_float(((unsigned)u) << 16); /* bf16 */
}

__device__ void report_err(kvs_gpu_errrec *e, int code, int layer, int head, int token, int chan) {
    if (atomicCAS(&e->flag, 0, 1) == 0) {
        e->code = code;
        e->layer = layer;
        e->head = head;
        e->token = token;
        e->chan = chan;
    }
}

__device__ __forceinline__ int esize_of(int dt) { return dt == KVS_F32 ? 4 : 2; }

/* Source rows of head h: base advanced by h * s_head elements. */
__device__ __forceinline__ kvs_rows rows_head(kvs_rows r, long long s_head, int h) {
    kvs_rows o = r;
    o.base = (const char *)r.base + (long long)h * s_head * esize_of(r.dt);
    return o;
}

__device__ __forceinline__ float red16_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float red16_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double red16_sumd(double v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Rows [r0, r0 + 64) x dims [d0, d0 + 64) of src into S (zero outside
 * nrows x d). Block of 256 threads (16 x 16). */
__device__ void load_tile(float (*S)[TPAD], kvs_rows src, int r0, int nrows, int d0, int d) {
    const int tid = threadIdx.y * 16 + threadIdx.x;
    for (int e = tid; e < TILE * TILE; e += 256) {
        const int r = e >> 6, c = e & 63, gr = r0 + r, gc = d0 + c;
        float v = 0.0f;
        if (gr < nrows && gc < d) {
            const long long row = src.rowidx ? (long long)src.rowidx[gr] : (long long)gr;
            v = ldf(src.base, src.dt, row * src.s_row + gc);
        }
        S[r][c] = v;
    }
}

/* Rows [r0, r0 + 64) x dims [d0, d0 + 64) of a 16-bit source (fp16 / bf16
 * bits, copied as they are) into S [64][LDH], zero outside nrows x d. */
__device__ void load_tile_h(unsigned short *S, kvs_rows src, int r0, int nrows, int d0, int d) {
    const int tid = threadIdx.y * 16 + threadIdx.x;
    const unsigned short *base = (const unsigned short *)src.base;
    for (int e = tid; e < TILE * TILE; e += 256) {
        const int r = e >> 6, c = e & 63, gr = r0 + r, gc = d0 + c;
        unsigned short v = 0;
        if (gr < nrows && gc < d) {
            const long long row = src.rowidx ? (long long)src.rowidx[gr] : (long long)gr;
            v = base[row * src.s_row + gc];
        }
        S[r * LDH + c] = v;
    }
}

/* Tensor-core product of two 16-bit tiles (T = __half or __nv_bfloat16):
 * warp w computes rows 16 (w / 2) .. + 16, columns 32 (w % 2) .. + 32 of the
 * 64 x 64 tile in fp32, stores them to Sf [64][LDS]. The products of two
 * 16-bit values are exact in fp32; only the summation order differs from
 * the fp32 CUDA-core path. */
template <typename T>
__device__ void tile_dot_tc(kvs_rows A, int a0, int na, kvs_rows B, int b0, int nb, int d,
                            unsigned short *Ah, unsigned short *Bh, float *Sf) {
    using namespace nvcuda;
    const int warp = (threadIdx.y * 16 + threadIdx.x) >> 5;
    const int rb = warp >> 1, cb0 = (warp & 1) * 2;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc[2];
    wmma::fill_fragment(fc[0], 0.0f);
    wmma::fill_fragment(fc[1], 0.0f);
    for (int d0 = 0; d0 < d; d0 += TILE) {
        __syncthreads();
        load_tile_h(Ah, A, a0, na, d0, d);
        load_tile_h(Bh, B, b0, nb, d0, d);
        __syncthreads();
        const int kmax = d - d0 < TILE ? d - d0 : TILE; /* zero-padded to 16 */
        for (int kk = 0; kk < kmax; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, (const T *)(Ah + rb * 16 * LDH + kk), LDH);
            for (int i = 0; i < 2; i++) {
                /* B = K^T: element (k, n) = Bh[n][k], i.e. column-major */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, (const T *)(Bh + (cb0 + i) * 16 * LDH + kk), LDH);
                wmma::mma_sync(fc[i], fa, fb, fc[i]);
            }
        }
    }
    for (int i = 0; i < 2; i++)
        wmma::store_matrix_sync(Sf + rb * 16 * LDS + (cb0 + i) * 16, fc[i], LDS,
                                wmma::mem_row_major);
    __syncthreads();
}

/* acc[a][b] = A[a0 + ty + 16a] . B[b0 + tx + 16b] over d (zero rows outside).
 * tc != 0 and both sources fp16 (or both bf16): tensor cores; else fp32 on
 * CUDA cores. smem is the caller's TILE_SMEM shared bytes (128-aligned). */
__device__ void tile_dot(float acc[4][4], kvs_rows A, int a0, int na, kvs_rows B, int b0, int nb,
                         int d, unsigned char *smem, int tc) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    if (tc && A.dt == B.dt && A.dt != KVS_F32) {
        unsigned short *Ah = (unsigned short *)smem, *Bh = Ah + TILE * LDH;
        float *Sf = (float *)(smem + 2 * TILE * LDH * 2);
        if (A.dt == KVS_F16) tile_dot_tc<__half>(A, a0, na, B, b0, nb, d, Ah, Bh, Sf);
        else tile_dot_tc<__nv_bfloat16>(A, a0, na, B, b0, nb, d, Ah, Bh, Sf);
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) acc[a][b] = Sf[(ty + 16 * a) * LDS + tx + 16 * b];
        __syncthreads();
        return;
    }
    float (*As)[TPAD] = (float (*)[TPAD])smem, (*Bs)[TPAD] = As + TILE;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
    for (int d0 = 0; d0 < d; d0 += TILE) {
        __syncthreads();
        load_tile(As, A, a0, na, d0, d);
        load_tile(Bs, B, b0, nb, d0, d);
        __syncthreads();
        const int kmax = d - d0 < TILE ? d - d0 : TILE;
        for (int kk = 0; kk < kmax; kk++) {
            float qa[4], kb[4];
#pragma unroll
            for (int a = 0; a < 4; a++) qa[a] = As[ty + 16 * a][kk];
#pragma unroll
            for (int b = 0; b < 4; b++) kb[b] = Bs[tx + 16 * b][kk];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] = fmaf(qa[a], kb[b], acc[a][b]);
        }
    }
    __syncthreads();
}

/* Exclusive scan of v over a block of TOPK_THREADS threads; *total gets the
 * sum. ws is shared [32]. */
__device__ int block_excl_scan(int v, int *total, int *ws) {
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int nw = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) ws[wid] = x;
    __syncthreads();
    if (wid == 0) {
        int w = lane < nw ? ws[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nw) ws[lane] = w;
    }
    __syncthreads();
    const int before = wid ? ws[wid - 1] : 0;
    *total = ws[nw - 1];
    __syncthreads();
    return before + x - v;
}

/* Monotone float -> uint32 (non-NaN); -0 and +0 map equal (as core/select.c). */
__device__ __forceinline__ unsigned float_key(float f) {
    if (f == 0.0f) return 0x80000000u; /* the key of +0 */
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long topk_key(float s, int i) {
    return ((unsigned long long)float_key(s) << 32) |
           (unsigned long long)(0xFFFFFFFFu - (unsigned)i);
}

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

__device__ __forceinline__ unsigned long long splitmix(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void k_fill_random(void *ptr, int dt, long long count, unsigned long long seed,
                              float scale) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < count;
         e += (long long)gridDim.x * blockDim.x) {
        const unsigned long long r = splitmix(seed ^ splitmix((unsigned long long)e));
        const float u1 = ((float)(r >> 40) + 1.0f) / 16777217.0f; /* (0, 1] */
        const float u2 = (float)((r >> 16) & 0xFFFFFF) / 16777216.0f;
        const float v = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        if (dt == KVS_F32) ((float *)ptr)[e] = v;
        else if (dt == KVS_F16) ((__half *)ptr)[e] = __float2half_rn(v);
        else ((unsigned short *)ptr)[e] = (unsigned short)(__float_as_uint(v) >> 16);
    }
}

/* ------------------------------------------------------------------------ */
/* DCT (Makhoul) and the fused FlashCache statistics                         */
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

/* FlashCache spectrum pass, in place on the half spectrum of every column:
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

__global__ void k_head_sum(const float *dev, int H, int N, float *out) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float a = 0.0f;
    for (int h = 0; h < H; h++) a += dev[(long long)h * N + n];
    out[n] = a;
}

/* Length-1 "FFT" (identity) for N == 1, where no cuFFT plan is made. */
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

/* ------------------------------------------------------------------------ */
/* Pooling, score post-processing                                            */
/* ------------------------------------------------------------------------ */

__global__ void k_pool(const float *x, int x_stride, int n, int k, int is_max, float *out,
                       int out_stride, int layer, kvs_gpu_errrec *er) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i >= n) return;
    const float *xr = x + (long long)r * x_stride;
    if (!isfinite(xr[i])) report_err(er, KVS_GERR_SCORE, layer, r, i, -1);
    const int pad = k / 2;
    int lo = i - pad, hi = i - pad + k - 1;
    if (lo < 0) lo = 0;
    if (hi > n - 1) hi = n - 1;
    float res;
    if (is_max) {
        float m = xr[lo];
        for (int j = lo + 1; j <= hi; j++)
            if (xr[j] > m) m = xr[j];
        res = m;
    } else {
        double sum = 0.0;
        for (int j = lo; j <= hi; j++) sum += xr[j];
        res = (float)(sum / (double)(hi - lo + 1));
    }
    out[(long long)r * out_stride + i] = res;
}

/* One block per head: finite check, optional /(N - j), optional text boost. */
__global__ void k_score_post(float *scores, int N, int normalize, int boost,
                             const uint8_t *modality, int layer, kvs_gpu_errrec *er) {
    __shared__ float red[256];
    float *s = scores + (long long)blockIdx.x * N;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        float v = s[j];
        if (!isfinite(v)) report_err(er, KVS_GERR_SCORE, layer, blockIdx.x, j, -1);
        if (normalize) {
            v /= (float)(N - j);
            s[j] = v;
        }
        mx = fmaxf(mx, v);
    }
    if (!boost) return;
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    const float m = red[0];
    for (int j = threadIdx.x; j < N; j += blockDim.x)
        if (!modality || modality[j] == KVS_MOD_TEXT) s[j] += m;
}

/* ------------------------------------------------------------------------ */
/* Attention statistics                                                      */
/* ------------------------------------------------------------------------ */

/* Pass 1: lse [Hq][Nq]. grid (Nq/64, Hq, nsplit), block 16x16. With
 * nsplit > 1 (few query rows, e.g. SnapKV's window) block z covers key tiles
 * [z * tps, (z + 1) * tps) and writes its running max / sum to part_m,
 * part_l [nsplit][Hq][Nq]; k_lse_combine finishes. */
__global__ void __launch_bounds__(256)
    k_lse(kvs_rows Q, long long q_shead, kvs_rows K, long long k_shead, int G, int Nq, int N,
          int d, int off, float scale, float *lse, int layer, kvs_gpu_errrec *er, int tps,
          float *part_m, float *part_l, int tc) {
    __shared__ __align__(128) unsigned char tsm[TILE_SMEM];
    const int h = blockIdx.y, g = h / G, i0 = blockIdx.x * TILE;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const kvs_rows Qh = rows_head(Q, q_shead, h), Kg = rows_head(K, k_shead, g);
    float m[4], l[4];
    for (int a = 0; a < 4; a++) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
    }
    const int rlast = (i0 + TILE - 1 < Nq ? i0 + TILE - 1 : Nq - 1);
    const int pmax = off + rlast;
    const int jbeg = gridDim.z > 1 ? (int)blockIdx.z * tps * TILE : 0;
    int jend = gridDim.z > 1 ? jbeg + tps * TILE - 1 : pmax; /* last key of this block */
    if (jend > pmax) jend = pmax;
    for (int j0 = jbeg; j0 <= jend; j0 += TILE) {
        float acc[4][4];
        tile_dot(acc, Qh, i0, Nq, Kg, j0, N, d, tsm, tc);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a, p = off + i;
            float tmax = -INFINITY;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = j0 + tx + 16 * b;
                if (i < Nq && j <= p) tmax = fmaxf(tmax, acc[a][b] * scale);
            }
            tmax = red16_max(tmax);
            const float nm = fmaxf(m[a], tmax);
            float ts = 0.0f;
            if (nm != -INFINITY) {
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int j = j0 + tx + 16 * b;
                    if (i < Nq && j <= p) ts += expf(acc[a][b] * scale - nm);
                }
            }
            ts = red16_sum(ts);
            if (nm != -INFINITY) {
                l[a] = l[a] * expf(m[a] - nm) + ts;
                m[a] = nm;
            }
        }
    }
    if (tx == 0)
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a;
            if (i >= Nq) continue;
            if (gridDim.z > 1) {
                const long long o = ((long long)blockIdx.z * gridDim.y + h) * Nq + i;
                part_m[o] = m[a];
                part_l[o] = l[a];
                continue;
            }
            const float v = m[a] + logf(l[a]);
            lse[(long long)h * Nq + i] = v;
            if (!isfinite(v)) report_err(er, KVS_GERR_LSE, layer, h, i, -1);
        }
}

/* lse[h][i] from nsplit partial (max, sum) pairs. */
__global__ void k_lse_combine(const float *part_m, const float *part_l, int nsplit, int Hq,
                              int Nq, float *lse, int layer, kvs_gpu_errrec *er) {
    const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long n = (long long)Hq * Nq;
    if (e >= n) return;
    float M = -INFINITY;
    for (int z = 0; z < nsplit; z++) M = fmaxf(M, part_m[z * n + e]);
    float sum = 0.0f;
    if (M != -INFINITY)
        for (int z = 0; z < nsplit; z++) {
            const float mz = part_m[z * n + e];
            if (mz != -INFINITY || isnan(part_l[z * n + e])) sum += part_l[z * n + e] * expf(mz - M);
        }
    const float v = M + logf(sum);
    lse[e] = v;
    if (!isfinite(v)) report_err(er, KVS_GERR_LSE, layer, (int)(e / Nq), (int)(e % Nq), -1);
}

/* Pass 2: column sums of query head h = g * G + blockIdx.z over its rows of
 * exp(s - lse), fp64, into colpart [Hq][N]; k_colsum_combine averages the
 * group in head order (deterministic). grid (N/64, Hkv, G), block 16x16. */
__global__ void __launch_bounds__(256)
    k_colsum(kvs_rows Q, long long q_shead, kvs_rows K, long long k_shead, int G, int Nq, int N,
             int d, int off, float scale, const float *lse, double *colpart, int tc) {
    __shared__ __align__(128) unsigned char tsm[TILE_SMEM];
    __shared__ double red[16][TILE];
    const int g = blockIdx.y, j0 = blockIdx.x * TILE;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const kvs_rows Kg = rows_head(K, k_shead, g);
    double cacc[4] = {0.0, 0.0, 0.0, 0.0};
    int ifirst = j0 - off;
    if (ifirst < 0) ifirst = 0;
    ifirst = ifirst / TILE * TILE;
    const int h = g * G + (int)blockIdx.z;
    {
        const kvs_rows Qh = rows_head(Q, q_shead, h);
        for (int i0 = ifirst; i0 < Nq; i0 += TILE) {
            float acc[4][4];
            tile_dot(acc, Qh, i0, Nq, Kg, j0, N, d, tsm, tc);
            float cp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const int i = i0 + ty + 16 * a;
                if (i >= Nq) continue;
                const float lr = lse[(long long)h * Nq + i];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int j = j0 + tx + 16 * b;
                    if (j < N && j <= off + i) cp[b] += expf(acc[a][b] * scale - lr);
                }
            }
#pragma unroll
            for (int b = 0; b < 4; b++) cacc[b] += (double)cp[b];
        }
    }
#pragma unroll
    for (int b = 0; b < 4; b++) red[ty][tx + 16 * b] = cacc[b];
    __syncthreads();
    if (ty == 0)
        for (int b = 0; b < 4; b++) {
            const int col = tx + 16 * b, j = j0 + col;
            double s = 0.0;
            for (int t = 0; t < 16; t++) s += red[t][col];
            if (j < N) colpart[(long long)h * N + j] = s;
        }
}

/* colsum[g][j] = (1/G) sum_{hl < G} colpart[g * G + hl][j]. */
__global__ void k_colsum_combine(const double *colpart, int Hkv, int G, int N, float *colsum) {
    const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (e >= (long long)Hkv * N) return;
    const long long g = e / N, j = e % N;
    double s = 0.0;
    for (int hl = 0; hl < G; hl++) s += colpart[(g * G + hl) * N + j];
    colsum[e] = (float)(s / (double)G);
}

__device__ __forceinline__ int is_visual(uint8_t m) {
    return m == KVS_MOD_IMAGE || m == KVS_MOD_VIDEO;
}

enum { ROW_NONE = 0, ROW_TV = 1, ROW_VT = 2 };

/* Row sums of the head-averaged attention Abar over the key tiles
 * [y * tps, (y + 1) * tps) of block row y: rowpart [nsplit][4][Nq] gets
 * sum a, sum a log a, and the same restricted to the eligible keys; rowkind
 * [Nq] the row's cross-modal kind (block row 0). k_entropy_finish turns the
 * sums into entropies. grid (Nq/64, nsplit), block 16x16. */
__global__ void __launch_bounds__(256)
    k_entropy_rows(kvs_rows Q, long long q_shead, kvs_rows K, long long k_shead, int Hq, int G,
                   int Nq, int N, int d, int off, float scale, const float *lse,
                   const uint8_t *modality, int tps, double *rowpart, signed char *rowkind,
                   int tc) {
    __shared__ __align__(128) unsigned char tsm[TILE_SMEM];
    const int i0 = blockIdx.x * TILE, tx = threadIdx.x, ty = threadIdx.y;
    double zp[4], tp[4], zx[4], txs[4];
    int kind[4];
    for (int a = 0; a < 4; a++) {
        zp[a] = tp[a] = zx[a] = txs[a] = 0.0;
        kind[a] = ROW_NONE;
        const int i = i0 + ty + 16 * a;
        if (modality && i < Nq) {
            const uint8_t qm = modality[off + i];
            if (qm == KVS_MOD_TEXT) kind[a] = ROW_TV;
            else if (is_visual(qm)) kind[a] = ROW_VT;
        }
    }
    const float inv_hq = 1.0f / (float)Hq;
    const int rlast = (i0 + TILE - 1 < Nq ? i0 + TILE - 1 : Nq - 1);
    const int pmax = off + rlast;
    const int jbeg = (int)blockIdx.y * tps * TILE;
    int jend = jbeg + tps * TILE - 1;
    if (jend > pmax) jend = pmax;
    for (int j0 = jbeg; j0 <= jend; j0 += TILE) {
        float ab[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) ab[a][b] = 0.0f;
        for (int h = 0; h < Hq; h++) {
            const kvs_rows Qh = rows_head(Q, q_shead, h), Kg = rows_head(K, k_shead, h / G);
            float acc[4][4];
            tile_dot(acc, Qh, i0, Nq, Kg, j0, N, d, tsm, tc);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const int i = i0 + ty + 16 * a;
                if (i >= Nq) continue;
                const float lr = lse[(long long)h * Nq + i];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int j = j0 + tx + 16 * b;
                    if (j <= off + i) ab[a][b] += expf(acc[a][b] * scale - lr);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a;
            if (i >= Nq) continue;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = j0 + tx + 16 * b;
                if (j > off + i) continue;
                const float av = ab[a][b] * inv_hq;
                const float t = av < 1.0e-37f ? 0.0f : av * logf(av);
                zp[a] += av;
                tp[a] += t;
                if (kind[a] != ROW_NONE) {
                    const uint8_t km = modality[j];
                    const int ok = kind[a] == ROW_TV ? is_visual(km) : km == KVS_MOD_TEXT;
                    if (ok) {
                        zx[a] += av;
                        txs[a] += t;
                    }
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        zp[a] = red16_sumd(zp[a]);
        tp[a] = red16_sumd(tp[a]);
        zx[a] = red16_sumd(zx[a]);
        txs[a] = red16_sumd(txs[a]);
    }
    if (tx == 0)
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a;
            if (i >= Nq) continue;
            double *o = rowpart + (long long)blockIdx.y * 4 * Nq;
            o[i] = zp[a];
            o[Nq + i] = tp[a];
            o[2LL * Nq + i] = zx[a];
            o[3LL * Nq + i] = txs[a];
            if (blockIdx.y == 0) rowkind[i] = (signed char)kind[a];
        }
}

/* Per row: entropy of Abar (log Z - sum a log a / Z) and of its restriction
 * to the eligible keys; a row whose restricted mass is 0 gets no kind. */
__global__ void k_entropy_finish(const double *rowpart, int nsplit, int Nq, signed char *rowkind,
                                 double *rowstat) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Nq) return;
    double zp = 0.0, tp = 0.0, zx = 0.0, tx = 0.0;
    for (int z = 0; z < nsplit; z++) {
        const double *o = rowpart + (long long)z * 4 * Nq;
        zp += o[i];
        tp += o[Nq + i];
        zx += o[2LL * Nq + i];
        tx += o[3LL * Nq + i];
    }
    rowstat[i] = log(zp) - tp / zp;
    int k = rowkind[i];
    if (k != ROW_NONE && !(zx > 0.0)) k = ROW_NONE;
    rowkind[i] = (signed char)k;
    rowstat[Nq + i] = k != ROW_NONE ? log(zx) - tx / zx : 0.0;
}

/* stats [6] = {plain, e_tv, e_vt, n_tv, n_vt, 0}; one block of 256. */
__global__ void k_entropy_reduce(const double *rowstat, const signed char *rowkind, int Nq,
                                 double *stats, int layer, kvs_gpu_errrec *er) {
    __shared__ double sp[256], stv[256], svt[256], ctv[256], cvt[256];
    double a = 0.0, b = 0.0, c = 0.0, ntv = 0.0, nvt = 0.0;
    for (int i = threadIdx.x; i < Nq; i += blockDim.x) {
        a += rowstat[i];
        if (rowkind[i] == ROW_TV) {
            b += rowstat[Nq + i];
            ntv += 1.0;
        } else if (rowkind[i] == ROW_VT) {
            c += rowstat[Nq + i];
            nvt += 1.0;
        }
    }
    const int t = threadIdx.x;
    sp[t] = a;
    stv[t] = b;
    svt[t] = c;
    ctv[t] = ntv;
    cvt[t] = nvt;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (t < o) {
            sp[t] += sp[t + o];
            stv[t] += stv[t + o];
            svt[t] += svt[t + o];
            ctv[t] += ctv[t + o];
            cvt[t] += cvt[t + o];
        }
        __syncthreads();
    }
    if (t == 0) {
        stats[0] = sp[0] / Nq;
        stats[1] = ctv[0] > 0 ? stv[0] / ctv[0] : 0.0;
        stats[2] = cvt[0] > 0 ? svt[0] / cvt[0] : 0.0;
        stats[3] = ctv[0];
        stats[4] = cvt[0];
        stats[5] = 0.0;
        if (!isfinite(stats[0]) || !isfinite(stats[1]) || !isfinite(stats[2]))
            report_err(er, KVS_GERR_ENTROPY, layer, -1, -1, -1);
    }
}

/* ------------------------------------------------------------------------ */
/* Merging                                                                   */
/* ------------------------------------------------------------------------ */

/* assign[n] = -1 for kept tokens, -2 for evicted ones; ev lists evicted
 * tokens in order. */
__global__ void k_mark(const int32_t *kept, int B, int N, int32_t *assign, int32_t *ev) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int lo = 0, hi = B; /* first kept >= n */
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (kept[mid] < n) lo = mid + 1;
        else hi = mid;
    }
    if (lo < B && kept[lo] == n) {
        assign[n] = -1;
    } else {
        assign[n] = -2;
        ev[n - lo] = n;
    }
}

/* unitk [B][d] = kept keys / ||.|| (0 for a zero key). One block (128) per slot. */
__global__ void k_unit(kvs_rows Kh, const int32_t *kept, int d, float *unitk) {
    __shared__ double red[128];
    const int b = blockIdx.x;
    const long long row = kept[b];
    double ss = 0.0;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const double v = ldf(Kh.base, Kh.dt, row * Kh.s_row + c);
        ss += v * v;
    }
    red[threadIdx.x] = ss;
    __syncthreads();
    for (int o = 64; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    const float inv = red[0] > 0.0 ? (float)(1.0 / sqrt(red[0])) : 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        unitk[(long long)b * d + c] = ldf(Kh.base, Kh.dt, row * Kh.s_row + c) * inv;
}

/* argmax over kept slots of k_e . unit(k_c), ties to the lower slot. grid (E/64). */
__global__ void __launch_bounds__(256)
    k_argmax(kvs_rows Kh, const int32_t *ev, int E, const float *unitk, int B, int d,
             int32_t *assign, int head, kvs_gpu_errrec *er) {
    __shared__ __align__(128) unsigned char tsm[TILE_SMEM];
    const int e0 = blockIdx.x * TILE, tx = threadIdx.x, ty = threadIdx.y;
    kvs_rows A = Kh;
    A.rowidx = ev;
    kvs_rows C;
    C.base = unitk;
    C.dt = KVS_F32;
    C.s_row = d;
    C.rowidx = NULL;
    float best[4];
    int slot[4];
    for (int a = 0; a < 4; a++) {
        best[a] = -INFINITY;
        slot[a] = -1;
    }
    for (int c0 = 0; c0 < B; c0 += TILE) {
        float acc[4][4];
        tile_dot(acc, A, e0, E, C, c0, B, d, tsm, 0);
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int sl = c0 + tx + 16 * b;
                if (sl < B && acc[a][b] > best[a]) {
                    best[a] = acc[a][b];
                    slot[a] = sl;
                }
            }
    }
    for (int a = 0; a < 4; a++) {
        float bv = best[a];
        int bs = slot[a];
        for (int o = 8; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int osl = __shfl_xor_sync(0xffffffffu, bs, o);
            if (osl >= 0 && (bs < 0 || ov > bv || (ov == bv && osl < bs))) {
                bv = ov;
                bs = osl;
            }
        }
        const int e = e0 + ty + 16 * a;
        if (tx == 0 && e < E) {
            if (bs < 0) report_err(er, KVS_GERR_ASSIGN, -1, head, ev[e], -1);
            assign[ev[e]] = bs;
        }
    }
}

/* dst [B][d] fp32 = rows kept[b] of src. grid (B), block 128. */
__global__ void k_gather(kvs_rows src, const int32_t *kept, int d, float *dst) {
    const int b = blockIdx.x;
    const long long row = kept[b];
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        dst[(long long)b * d + c] = ldf(src.base, src.dt, row * src.s_row + c);
}

/* Scatter evicted token e (one block each) into its slot's K and V sums. */
__global__ void k_scatter(kvs_rows Kh, kvs_rows Vh, const int32_t *ev, const int32_t *assign,
                          const int32_t *kept, int d, int weighted, float *kk, float *vv,
                          int32_t *cnt) {
    __shared__ double r0[128], r1[128], r2[128];
    const long long n = ev[blockIdx.x];
    const int a = assign[n];
    if (a < 0) return;
    const long long kc = kept[a];
    float w = 1.0f;
    if (weighted) {
        double dot = 0.0, ne = 0.0, nc = 0.0;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            const double xe = ldf(Kh.base, Kh.dt, n * Kh.s_row + c);
            const double xc = ldf(Kh.base, Kh.dt, kc * Kh.s_row + c);
            dot += xe * xc;
            ne += xe * xe;
            nc += xc * xc;
        }
        r0[threadIdx.x] = dot;
        r1[threadIdx.x] = ne;
        r2[threadIdx.x] = nc;
        __syncthreads();
        for (int o = 64; o > 0; o >>= 1) {
            if ((int)threadIdx.x < o) {
                r0[threadIdx.x] += r0[threadIdx.x + o];
                r1[threadIdx.x] += r1[threadIdx.x + o];
                r2[threadIdx.x] += r2[threadIdx.x + o];
            }
            __syncthreads();
        }
        w = r1[0] > 0.0 && r2[0] > 0.0 ? (float)(r0[0] / sqrt(r1[0] * r2[0])) : 0.0f;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        atomicAdd(&kk[(long long)a * d + c], w * ldf(Kh.base, Kh.dt, n * Kh.s_row + c));
        atomicAdd(&vv[(long long)a * d + c], w * ldf(Vh.base, Vh.dt, n * Vh.s_row + c));
    }
    if (threadIdx.x == 0) atomicAdd(&cnt[a], 1);
}

__global__ void k_merge_finish(kvs_rows Kh, kvs_rows Vh, const int32_t *kept, const int32_t *cnt,
                               int d, int pivotal, float *kk, float *vv) {
    const int b = blockIdx.x;
    if (cnt[b] == 0) return;
    const float inv = 1.0f / (float)(cnt[b] + 1);
    const long long row = kept[b];
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float *kr = kk + (long long)b * d + c, *vr = vv + (long long)b * d + c;
        if (pivotal) {
            *kr = 0.5f * ldf(Kh.base, Kh.dt, row * Kh.s_row + c) + 0.5f * *kr * inv;
            *vr = 0.5f * ldf(Vh.base, Vh.dt, row * Vh.s_row + c) + 0.5f * *vr * inv;
        } else {
            *kr *= inv;
            *vr *= inv;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Host side: errors, devices, memory                                        */
/* ------------------------------------------------------------------------ */

extern "C" kvs_status kvs_gpu_cuda_check(int cuda_rc, const char *what, kvs_err *err) {
    if (cuda_rc == 0) return KVS_OK;
    return kvs_errorf(err, KVS_ERR_INTERNAL, "%s: CUDA error %d (%s): %s", what, cuda_rc,
                      cudaGetErrorName((cudaError_t)cuda_rc),
                      cudaGetErrorString((cudaError_t)cuda_rc));
}

static kvs_status cufft_check(cufftResult r, const char *what, kvs_err *err) {
    if (r == CUFFT_SUCCESS) return KVS_OK;
    return kvs_errorf(err, r == CUFFT_ALLOC_FAILED ? KVS_ERR_NOMEM : KVS_ERR_INTERNAL,
                      "%s: cuFFT error %d", what, (int)r);
}

extern "C" kvs_status kvs_gpu_device_count(int *count, kvs_err *err) {
    *count = 0;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount: %s (%s)",
                          cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    if (n == 0)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "no CUDA device: cudaGetDeviceCount returned 0 devices");
    *count = n;
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_device_describe(int dev, char *buf, size_t n, kvs_err *err) {
    cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, dev);
    if (rc != cudaSuccess) return kvs_gpu_cuda_check(rc, "cudaGetDeviceProperties", err);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(buf, n, "device %d: %s, sm_%d%d, %.1f GiB, %d SMs, runtime %d.%d, driver %d.%d", dev,
             p.name, p.major, p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             p.multiProcessorCount, rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10);
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_malloc(void **ptr, size_t bytes, kvs_err *err) {
    *ptr = NULL;
    cudaError_t rc = cudaMalloc(ptr, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        *ptr = NULL;
        return kvs_errorf(err, KVS_ERR_NOMEM, "cudaMalloc(%zu bytes): %s", bytes,
                          cudaGetErrorString(rc));
    }
    return KVS_OK;
}

extern "C" void kvs_gpu_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

extern "C" kvs_status kvs_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return kvs_gpu_cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                              "kvs_gpu_memcpy_h2d", err);
}

extern "C" kvs_status kvs_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes, kvs_err *err) {
    return kvs_gpu_cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
                              "kvs_gpu_memcpy_d2h", err);
}

extern "C" kvs_status kvs_gpu_poison(void *ptr, size_t bytes, kvs_err *err) {
    kvs_status st = kvs_gpu_cuda_check(cudaMemset(ptr, 0xFF, bytes), "kvs_gpu_poison", err);
    if (st) return st;
    return kvs_gpu_cuda_check(cudaDeviceSynchronize(), "kvs_gpu_poison", err);
}

/* ------------------------------------------------------------------------ */
/* Workspace                                                                 */
/* ------------------------------------------------------------------------ */

extern "C" void kvs_gpu_workspace_free(kvs_gpu_workspace *ws) {
    if (!ws) return;
    if (ws->stream) cudaStreamSynchronize(ws->stream);
    if (ws->have_r2c) cufftDestroy(ws->r2c);
    if (ws->have_c2r) cufftDestroy(ws->c2r);
    kvs_fc_gemm_free(ws->fcg);
    void *dev[] = {ws->rin,   ws->rout,   ws->spec,     ws->scores, ws->scratch, ws->lse, ws->lsepart, ws->colpart, ws->rowpart,
                   ws->energy, ws->rowstat, ws->rowkind, ws->stats,  ws->modality, ws->desc,
                   ws->idx,   ws->ev,     ws->assign,   ws->kept,   ws->cnt,     ws->unitk,
                   ws->errrec};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    void *host[] = {ws->h_err,   ws->h_desc,     ws->h_idx, ws->h_stats,
                    ws->h_energy, ws->h_modality, ws->h_kept};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        if (host[i]) cudaFreeHost(host[i]);
    if (ws->stream) cudaStreamDestroy(ws->stream);
    free(ws);
}

extern "C" kvs_status kvs_gpu_workspace_init(kvs_gpu_workspace **out, const kvs_shape *mx,
                                             kvs_err *err) {
    *out = NULL;
    if (!mx || mx->n_layers < 1 || mx->n_tokens < 1 || mx->n_kv_heads < 1 || mx->head_dim < 1 ||
        mx->n_q_heads < 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_workspace_init: bad maximal shape (L, N, Hkv, d must be >= 1)");
    int ndev = 0;
    kvs_status st = kvs_gpu_device_count(&ndev, err);
    if (st) return st;
    kvs_gpu_workspace *ws = (kvs_gpu_workspace *)calloc(1, sizeof *ws);
    if (!ws) return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_gpu_workspace_init: out of memory");
    const size_t L = (size_t)mx->n_layers, N = (size_t)mx->n_tokens, H = (size_t)mx->n_kv_heads;
    const size_t d = (size_t)mx->head_dim;
    const size_t Hq = (size_t)(mx->n_q_heads > 0 ? mx->n_q_heads : mx->n_kv_heads);
    const size_t ncols = 2 * H * d, Nh = N / 2 + 1;
    const size_t nscr = (H > L ? H : L) * N;
    cudaDeviceProp prop;
    cudaError_t rc;
    ws->L = (int)L;
    ws->N = (int)N;
    ws->Hkv = (int)H;
    ws->Hq = (int)Hq;
    ws->d = (int)d;
    ws->ncols = (int)ncols;
    ws->Nh = (int)Nh;
    if ((rc = cudaGetDevice(&ws->device)) != cudaSuccess) goto cuda_fail;
    if ((rc = cudaGetDeviceProperties(&prop, ws->device)) != cudaSuccess) goto cuda_fail;
    snprintf(ws->device_name, sizeof ws->device_name, "%s (sm_%d%d)", prop.name, prop.major,
             prop.minor);
    ws->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    ws->tensor_cores = prop.major >= 8; /* wmma fp16 + bf16 */
    ws->cc_major = prop.major;
    ws->cc_minor = prop.minor;
    ws->attn_kernel = prop.major >= 8 ? KVS_GPU_ATTN_MMA : KVS_GPU_ATTN_WMMA;
    ws->dct_route = KVS_GPU_DCT_FFT; /* the GEMM route is opt-in (kvs_gpu_workspace_dct_route) */
    if (prop.major >= 8 && (rc = (cudaError_t)kvs_attn_mma_prepare()) != cudaSuccess)
        goto cuda_fail;
    if ((rc = cudaStreamCreateWithFlags(&ws->stream, cudaStreamNonBlocking)) != cudaSuccess)
        goto cuda_fail;
#define KVS_DALLOC(field, bytes)                                                        \
    do {                                                                                \
        if ((rc = cudaMalloc((void **)&ws->field, (bytes))) != cudaSuccess) goto cuda_fail; \
    } while (0)
#define KVS_HALLOC(field, bytes)                                                            \
    do {                                                                                    \
        if ((rc = cudaMallocHost((void **)&ws->field, (bytes))) != cudaSuccess) goto cuda_fail; \
    } while (0)
    KVS_DALLOC(rin, sizeof(float) * ncols * N);
    KVS_DALLOC(rout, sizeof(float) * ncols * N);
    KVS_DALLOC(spec, sizeof(cufftComplex) * ncols * Nh);
    KVS_DALLOC(scores, sizeof(float) * L * H * N);
    KVS_DALLOC(scratch, sizeof(float) * nscr);
    KVS_DALLOC(lse, sizeof(float) * Hq * N);
    KVS_DALLOC(lsepart, sizeof(float) * 2 * Hq * N);
    KVS_DALLOC(colpart, sizeof(double) * Hq * N);
    KVS_DALLOC(rowpart, sizeof(double) * 4 * 8 * N);
    KVS_DALLOC(energy, sizeof(double) * L * 4);
    KVS_DALLOC(rowstat, sizeof(double) * 2 * N);
    KVS_DALLOC(rowkind, N);
    KVS_DALLOC(stats, sizeof(double) * L * 6);
    KVS_DALLOC(modality, N);
    KVS_DALLOC(desc, sizeof(kvs_topk_desc) * L * H);
    KVS_DALLOC(idx, sizeof(int32_t) * L * H * N);
    KVS_DALLOC(ev, sizeof(int32_t) * N);
    KVS_DALLOC(assign, sizeof(int32_t) * N);
    KVS_DALLOC(kept, sizeof(int32_t) * H * N);
    KVS_DALLOC(cnt, sizeof(int32_t) * N);
    KVS_DALLOC(unitk, sizeof(float) * N * d);
    KVS_DALLOC(errrec, sizeof(kvs_gpu_errrec));
    KVS_HALLOC(h_err, sizeof(kvs_gpu_errrec));
    KVS_HALLOC(h_desc, sizeof(kvs_topk_desc) * L * H);
    KVS_HALLOC(h_idx, sizeof(int32_t) * L * H * N);
    KVS_HALLOC(h_stats, sizeof(double) * L * 6);
    KVS_HALLOC(h_energy, sizeof(double) * L * 4);
    KVS_HALLOC(h_modality, N);
    KVS_HALLOC(h_kept, sizeof(int32_t) * H * N);
#undef KVS_DALLOC
#undef KVS_HALLOC
    if ((rc = cudaMemsetAsync(ws->errrec, 0, sizeof(kvs_gpu_errrec), ws->stream)) != cudaSuccess)
        goto cuda_fail;
    if ((rc = cudaStreamSynchronize(ws->stream)) != cudaSuccess) goto cuda_fail;
    *out = ws;
    return KVS_OK;
cuda_fail:
    st = kvs_errorf(err, rc == cudaErrorMemoryAllocation ? KVS_ERR_NOMEM : KVS_ERR_INTERNAL,
                    "kvs_gpu_workspace_init (L=%zu N=%zu Hkv=%zu Hq=%zu d=%zu): %s", L, N, H, Hq,
                    d, cudaGetErrorString(rc));
    (void)cudaGetLastError();
    kvs_gpu_workspace_free(ws);
    return st;
}

extern "C" void *kvs_gpu_workspace_stream(kvs_gpu_workspace *ws) { return (void *)ws->stream; }

extern "C" int kvs_gpu_workspace_tensor_cores(kvs_gpu_workspace *ws, int on) {
    if (on >= 0) {
        cudaDeviceProp prop;
        const int ok = cudaGetDeviceProperties(&prop, ws->device) == cudaSuccess && prop.major >= 8;
        ws->tensor_cores = on && ok;
    }
    return ws->tensor_cores;
}

extern "C" kvs_status kvs_gpu_workspace_attn_kernel(kvs_gpu_workspace *ws, int which,
                                                    int *in_force, kvs_err *err) {
    if (!ws)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_workspace_attn_kernel: no workspace");
    if (which != -1 && which != KVS_GPU_ATTN_WMMA && which != KVS_GPU_ATTN_MMA)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_workspace_attn_kernel: kernel %d unknown (-1 query, 0 wmma-smem, "
                          "1 mma-reg)", which);
    if (which == KVS_GPU_ATTN_MMA && ws->cc_major < 8)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_gpu_workspace_attn_kernel: the mma-reg attention kernel needs sm_80 "
                          "or newer (mma.sync bf16, ldmatrix, cp.async); device %s is not",
                          ws->device_name);
    if (which >= 0) ws->attn_kernel = which;
    if (in_force) *in_force = ws->attn_kernel;
    return KVS_OK;
}

extern "C" int kvs_gpu_attn_kernel_for(const kvs_gpu_workspace *ws, const kvs_view *q,
                                       const kvs_view *k) {
    const int sixteen = q->dtype == k->dtype && q->dtype != KVS_F32;
    if (!ws->tensor_cores || !sixteen) return KVS_GPU_ATTN_CUDA_CORES;
    if (ws->attn_kernel == KVS_GPU_ATTN_MMA && kvs_attn_mma_views_ok(q, k)) return KVS_GPU_ATTN_MMA;
    return KVS_GPU_ATTN_WMMA;
}

extern "C" const char *kvs_gpu_workspace_device(const kvs_gpu_workspace *ws) {
    return ws->device_name;
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
                          "flashcache: layer %d head %d: deviation of token %d is not finite "
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

static kvs_rows rows_of(const kvs_view *v) {
    kvs_rows r;
    r.base = v->data;
    r.dt = (int)v->dtype;
    r.s_row = v->s_tok;
    r.rowidx = NULL;
    return r;
}

static kvs_rows rows_of_head(const kvs_view *v, int h) {
    kvs_rows r = rows_of(v);
    r.base = (const char *)v->data + (size_t)h * (size_t)v->s_head * kvs_dtype_size(v->dtype);
    return r;
}

static unsigned grid_for(long long total, int block);

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

static unsigned grid_for(long long total, int block) {
    long long g = (total + block - 1) / block;
    if (g < 1) g = 1;
    if (g > 65535LL * 16) g = 65535LL * 16;
    return (unsigned)g;
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
    kvs_status st = cufft_check(cufftPlanMany(&ws->r2c, 1, &n, NULL, 1, N, NULL, 1, N / 2 + 1,
                                              CUFFT_R2C, ncols),
                                "cufftPlanMany R2C", err);
    if (st) return st;
    ws->have_r2c = 1;
    st = cufft_check(cufftPlanMany(&ws->c2r, 1, &n, NULL, 1, N / 2 + 1, NULL, 1, N, CUFFT_C2R,
                                   ncols),
                     "cufftPlanMany C2R", err);
    if (st) return st;
    ws->have_c2r = 1;
    st = cufft_check(cufftSetStream(ws->r2c, ws->stream), "cufftSetStream", err);
    if (!st) st = cufft_check(cufftSetStream(ws->c2r, ws->stream), "cufftSetStream", err);
    if (st) return st;
    ws->x_N = N;
    ws->x_ncols = ncols;
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Launchers (internal)                                                      */
/* ------------------------------------------------------------------------ */

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

extern "C" int kvs_launch_flashcache_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer,
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

extern "C" int kvs_launch_head_sum(kvs_gpu_workspace *ws, const float *dev, int H, int N,
                                   float *out) {
    k_head_sum<<<(unsigned)((N + 255) / 256), 256, 0, ws->stream>>>(dev, H, N, out);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_topk(kvs_gpu_workspace *ws, const float *scores,
                               const kvs_topk_desc *desc_dev, int nseg, int32_t *idx) {
    if (nseg <= 0) return 0;
    k_topk<<<(unsigned)nseg, TOPK_THREADS, 0, ws->stream>>>(scores, desc_dev, idx, ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_pool(kvs_gpu_workspace *ws, const float *x, int rows, int x_stride,
                               int n, int k, int is_max, float *out, int out_stride, int layer) {
    if (n <= 0 || rows <= 0) return 0;
    const dim3 g((unsigned)((n + 255) / 256), (unsigned)rows);
    k_pool<<<g, 256, 0, ws->stream>>>(x, x_stride, n, k, is_max, out, out_stride, layer,
                                      ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_lse(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                              float *lse, int layer) {
    if (kvs_gpu_attn_kernel_for(ws, q, k) == KVS_GPU_ATTN_MMA)
        return kvs_launch_lse_mma(ws, q, k, lse, layer);
    const int Hq = q->n_heads, Nq = q->n_tokens, N = k->n_tokens, d = k->head_dim;
    if (Nq <= 0) return 0;
    const int G = Hq / k->n_heads;
    const float scale = (float)(1.0 / sqrt((double)d));
    /* split the keys when there are too few (head, row tile) blocks to fill
     * the device; partials live in ws->lsepart [2][nsplit][Hq][Nq] with
     * nsplit * Nq <= N (O(N) per head) */
    const int row_tiles = (Nq + TILE - 1) / TILE, key_tiles = (N + TILE - 1) / TILE;
    const long long blocks = (long long)row_tiles * Hq;
    int nsplit = 1;
    if (blocks < 2 * ws->n_sm) {
        nsplit = (int)((4LL * ws->n_sm + blocks - 1) / blocks);
        if (nsplit > key_tiles) nsplit = key_tiles;
        if (nsplit > N / Nq) nsplit = N / Nq;
        if (nsplit < 1) nsplit = 1;
    }
    const int tps = (key_tiles + nsplit - 1) / nsplit;
    nsplit = (key_tiles + tps - 1) / tps;
    float *pm = ws->lsepart, *pl = ws->lsepart + (size_t)nsplit * Hq * Nq;
    const dim3 g((unsigned)row_tiles, (unsigned)Hq, (unsigned)nsplit), b(16, 16);
    k_lse<<<g, b, 0, ws->stream>>>(rows_of(q), q->s_head, rows_of(k), k->s_head, G, Nq, N, d,
                                   N - Nq, scale, lse, layer, ws->errrec, tps, pm, pl,
                                   ws->tensor_cores);
    int rc = (int)cudaGetLastError();
    if (!rc && nsplit > 1) rc = kvs_launch_lse_combine(ws, pm, pl, nsplit, Hq, Nq, lse, layer);
    return rc;
}

extern "C" int kvs_launch_lse_combine(kvs_gpu_workspace *ws, const float *part_m,
                                      const float *part_l, int nsplit, int Hq, int Nq, float *lse,
                                      int layer) {
    k_lse_combine<<<grid_for((long long)Hq * Nq, 256), 256, 0, ws->stream>>>(
        part_m, part_l, nsplit, Hq, Nq, lse, layer, ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_colsum(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                 const float *lse, float *colsum) {
    const int Hq = q->n_heads, Nq = q->n_tokens, N = k->n_tokens, d = k->head_dim;
    const int Hkv = k->n_heads, G = Hq / Hkv;
    const float scale = (float)(1.0 / sqrt((double)d));
    if (kvs_gpu_attn_kernel_for(ws, q, k) == KVS_GPU_ATTN_MMA) {
        const int rc = kvs_launch_colsum_mma(ws, q, k, lse, ws->colpart);
        if (rc) return rc;
    } else {
        const dim3 g((unsigned)((N + TILE - 1) / TILE), (unsigned)Hkv, (unsigned)G), b(16, 16);
        k_colsum<<<g, b, 0, ws->stream>>>(rows_of(q), q->s_head, rows_of(k), k->s_head, G, Nq,
                                          N, d, N - Nq, scale, lse, ws->colpart,
                                          ws->tensor_cores);
    }
    k_colsum_combine<<<grid_for((long long)Hkv * N, 256), 256, 0, ws->stream>>>(ws->colpart, Hkv,
                                                                               G, N, colsum);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N,
                                     int normalize, int boost, const uint8_t *modality_dev,
                                     int layer) {
    k_score_post<<<(unsigned)H, 256, 0, ws->stream>>>(scores, N, normalize, boost, modality_dev,
                                                      layer, ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_entropies(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                    const float *lse, const uint8_t *modality_dev, double *stats,
                                    int layer) {
    const int Hq = q->n_heads, Nq = q->n_tokens, N = k->n_tokens, d = k->head_dim;
    const int G = Hq / k->n_heads;
    const float scale = (float)(1.0 / sqrt((double)d));
    const dim3 b(16, 16);
    /* split the keys when the query tiles alone do not fill the device;
     * partials [nsplit][4][Nq] fp64 with nsplit * Nq <= 8 N */
    const int row_tiles = (Nq + TILE - 1) / TILE, key_tiles = (N + TILE - 1) / TILE;
    int nsplit = 1;
    if (row_tiles < 2 * ws->n_sm) {
        nsplit = (4 * ws->n_sm + row_tiles - 1) / row_tiles;
        if (nsplit > key_tiles) nsplit = key_tiles;
        if (nsplit > 8 * N / Nq) nsplit = 8 * N / Nq;
        if (nsplit < 1) nsplit = 1;
    }
    const int tps = (key_tiles + nsplit - 1) / nsplit;
    nsplit = (key_tiles + tps - 1) / tps;
    k_entropy_rows<<<dim3((unsigned)row_tiles, (unsigned)nsplit), b, 0, ws->stream>>>(
        rows_of(q), q->s_head, rows_of(k), k->s_head, Hq, G, Nq, N, d, N - Nq, scale, lse,
        modality_dev, tps, ws->rowpart, ws->rowkind, ws->tensor_cores);
    k_entropy_finish<<<(unsigned)((Nq + 255) / 256), 256, 0, ws->stream>>>(
        ws->rowpart, nsplit, Nq, ws->rowkind, ws->rowstat);
    k_entropy_reduce<<<1, 256, 0, ws->stream>>>(ws->rowstat, ws->rowkind, Nq, stats, layer,
                                                ws->errrec);
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

extern "C" kvs_status kvs_gpu_flashcache_layer(kvs_gpu_workspace *ws, const kvs_layer *ly,
                                               int layer, int omega, float *dev, double *energy,
                                               kvs_err *err) {
    kvs_status st = kvs_gpu_check_view(ws, &ly->k, "K", err);
    if (!st) st = kvs_gpu_check_view(ws, &ly->v, "V", err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_flashcache_layer: layer %d", layer);
    const int H = ly->k.n_heads, N = ly->k.n_tokens, d = ly->k.head_dim;
    if (ly->v.n_heads != H || ly->v.n_tokens != N || ly->v.head_dim != d || H > ws->Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_flashcache_layer: layer %d: K [%d][%d][%d], V [%d][%d][%d], "
                          "workspace Hkv <= %d", layer, H, N, d, ly->v.n_heads, ly->v.n_tokens,
                          ly->v.head_dim, ws->Hkv);
    if (omega < 1 || omega > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_flashcache_layer: omega=%d outside [1, N=%d]", omega, N);
    st = kvs_fc_prepare(ws, N, 2 * H * d, omega, err);
    if (!st) st = kvs_fc_layer(ws, ly, layer, omega, dev, energy, err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_flashcache_layer");
    return KVS_OK;
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

extern "C" kvs_status kvs_gpu_pool1d(kvs_gpu_workspace *ws, const float *x, int rows, int n,
                                     int k, int is_max, float *out, kvs_err *err) {
    if (!ws || !x || !out || rows < 1 || n < 0 || k < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_pool1d: rows=%d n=%d k=%d", rows, n, k);
    return kvs_gpu_cuda_check(kvs_launch_pool(ws, x, rows, n, n, k, is_max, out, n, -1),
                              "kvs_gpu_pool1d", err);
}

static kvs_status check_qk(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                           const char *fn, kvs_err *err) {
    kvs_status st = kvs_gpu_check_view(ws, q, "q", err);
    if (!st) st = kvs_gpu_check_view(ws, k, "k", err);
    if (st) return kvs_err_prefix(err, "%s", fn);
    if (q->head_dim != k->head_dim || k->n_heads < 1 || q->n_heads % k->n_heads != 0 ||
        q->n_tokens > k->n_tokens || k->n_tokens < 1 || q->n_heads > ws->Hq ||
        k->n_heads > ws->Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: q [%d][%d][%d] does not fit k [%d][%d][%d] (or the workspace: "
                          "Hq <= %d, Hkv <= %d)", fn, q->n_heads, q->n_tokens, q->head_dim,
                          k->n_heads, k->n_tokens, k->head_dim, ws->Hq, ws->Hkv);
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_attn_lse(kvs_gpu_workspace *ws, const kvs_view *q,
                                       const kvs_view *k, float *lse, kvs_err *err) {
    kvs_status st = check_qk(ws, q, k, "kvs_gpu_attn_lse", err);
    if (st) return st;
    return kvs_gpu_cuda_check(kvs_launch_lse(ws, q, k, lse, -1), "kvs_gpu_attn_lse", err);
}

extern "C" kvs_status kvs_gpu_attn_colsum(kvs_gpu_workspace *ws, const kvs_view *q,
                                          const kvs_view *k, const float *lse, float *colsum,
                                          kvs_err *err) {
    kvs_status st = check_qk(ws, q, k, "kvs_gpu_attn_colsum", err);
    if (st) return st;
    return kvs_gpu_cuda_check(kvs_launch_colsum(ws, q, k, lse, colsum), "kvs_gpu_attn_colsum",
                              err);
}

extern "C" kvs_status kvs_gpu_attn_entropies(kvs_gpu_workspace *ws, const kvs_view *q,
                                             const kvs_view *k, const float *lse,
                                             const uint8_t *modality, kvs_entropy_stats *out,
                                             kvs_err *err) {
    kvs_status st = check_qk(ws, q, k, "kvs_gpu_attn_entropies", err);
    if (st) return st;
    if (q->n_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_attn_entropies: no query rows (Nq = 0): mean entropy undefined");
    cudaError_t rc = cudaStreamSynchronize(ws->stream);
    if (!rc && modality) {
        memcpy(ws->h_modality, modality, (size_t)k->n_tokens);
        rc = cudaMemcpyAsync(ws->modality, ws->h_modality, (size_t)k->n_tokens,
                             cudaMemcpyHostToDevice, ws->stream);
    }
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_attn_entropies", err);
    int lrc = kvs_launch_entropies(ws, q, k, lse, modality ? ws->modality : NULL, ws->stats, -1);
    if (lrc) return kvs_gpu_cuda_check(lrc, "kvs_gpu_attn_entropies", err);
    rc = cudaMemcpyAsync(ws->h_stats, ws->stats, 6 * sizeof(double), cudaMemcpyDeviceToHost,
                         ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_attn_entropies", err);
    st = kvs_gpu_sync(ws, err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_attn_entropies");
    out->plain = ws->h_stats[0];
    out->e_tv = ws->h_stats[1];
    out->e_vt = ws->h_stats[2];
    out->n_tv = (int64_t)ws->h_stats[3];
    out->n_vt = (int64_t)ws->h_stats[4];
    return KVS_OK;
}

/* Assignment of head h with kept (device) already in place; leaves ev and
 * assign filled, returns E. */
static int launch_assign(kvs_gpu_workspace *ws, const kvs_view *k, int head,
                         const int32_t *kept, int B, int32_t *assign) {
    const int N = k->n_tokens, d = k->head_dim, E = N - B;
    k_mark<<<(unsigned)((N + 255) / 256), 256, 0, ws->stream>>>(kept, B, N, assign, ws->ev);
    if (E <= 0) return (int)cudaGetLastError();
    const kvs_rows Kh = rows_of_head(k, head);
    k_unit<<<(unsigned)B, 128, 0, ws->stream>>>(Kh, kept, d, ws->unitk);
    k_argmax<<<(unsigned)((E + TILE - 1) / TILE), dim3(16, 16), 0, ws->stream>>>(
        Kh, ws->ev, E, ws->unitk, B, d, assign, head, ws->errrec);
    return (int)cudaGetLastError();
}

extern "C" kvs_status kvs_gpu_merge_assign(kvs_gpu_workspace *ws, const kvs_view *k, int head,
                                           const int32_t *kept, int B, int32_t *assign,
                                           kvs_err *err) {
    kvs_status st = kvs_gpu_check_view(ws, k, "kvs_gpu_merge_assign: k", err);
    if (st) return st;
    if (head < 0 || head >= k->n_heads || B < 1 || B > k->n_tokens || !kept || !assign)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_merge_assign: head %d of %d, B = %d of N = %d", head,
                          k->n_heads, B, k->n_tokens);
    return kvs_gpu_cuda_check(launch_assign(ws, k, head, kept, B, assign), "kvs_gpu_merge_assign",
                              err);
}

extern "C" kvs_status kvs_gpu_apply_layer(kvs_gpu_workspace *ws, const kvs_layer *ly,
                                          const kvs_plan *plan, int layer, float *k_out,
                                          float *v_out, kvs_err *err) {
    if (!ws || !ly || !plan || !k_out || !v_out)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_apply_layer: NULL argument");
    if (layer < 0 || layer >= plan->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_apply_layer: layer %d outside [0, %d)",
                          layer, plan->n_layers);
    kvs_status st = kvs_gpu_check_view(ws, &ly->k, "k", err);
    if (!st) st = kvs_gpu_check_view(ws, &ly->v, "v", err);
    if (st) return kvs_err_prefix(err, "kvs_gpu_apply_layer: layer %d", layer);
    const int H = plan->n_kv_heads, N = plan->n_tokens, B = plan->layers[layer].budget;
    const int d = ly->k.head_dim;
    if (ly->k.n_heads != H || ly->v.n_heads != H || ly->k.n_tokens != N || ly->v.n_tokens != N ||
        ly->v.head_dim != d || H > ws->Hkv)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_apply_layer: layer %d: k [%d][%d][%d] / v [%d][%d][%d] do not "
                          "match the plan (Hkv = %d, N = %d) or the workspace", layer,
                          ly->k.n_heads, ly->k.n_tokens, d, ly->v.n_heads, ly->v.n_tokens,
                          ly->v.head_dim, H, N);
    if (plan->merge < KVS_MERGE_NONE || plan->merge > KVS_MERGE_WEIGHTED)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_apply_layer: unknown merge %d",
                          (int)plan->merge);
    if (plan->layers[layer].counts)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_gpu_apply_layer: layer %d: ragged per-head counts are not implemented "
                          "on GPU (apply the plan on the host)", layer);
    if (B < 1 || B > N || !plan->layers[layer].idx)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_gpu_apply_layer: layer %d: budget %d outside [1, N = %d]", layer, B,
                          N);
    /* the kernels index K/V rows and the merge scratch by these: a bad plan
     * must be an error here, not an illegal address (a sticky context error) */
    for (int h = 0; h < H; h++) {
        const int32_t *kept = plan->layers[layer].idx + (size_t)h * B; /* [B] */
        for (int b = 0; b < B; b++)
            if (kept[b] < 0 || kept[b] >= N || (b > 0 && kept[b] <= kept[b - 1]))
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "kvs_gpu_apply_layer: layer %d head %d: kept index %d at slot %d "
                                  "is outside [0, %d) or not ascending and unique",
                                  layer, h, (int)kept[b], b, N);
    }
    /* staging buffer reuse: the previous upload must be done */
    cudaError_t rc = cudaStreamSynchronize(ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_apply_layer", err);
    memcpy(ws->h_kept, plan->layers[layer].idx, sizeof(int32_t) * (size_t)H * (size_t)B);
    rc = cudaMemcpyAsync(ws->kept, ws->h_kept, sizeof(int32_t) * (size_t)H * (size_t)B,
                         cudaMemcpyHostToDevice, ws->stream);
    if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_apply_layer", err);
    const int merge = plan->merge != KVS_MERGE_NONE && B < N;
    for (int h = 0; h < H; h++) {
        const int32_t *kept = ws->kept + (size_t)h * B;
        float *kk = k_out + (size_t)h * B * d, *vv = v_out + (size_t)h * B * d;
        const kvs_rows Kh = rows_of_head(&ly->k, h), Vh = rows_of_head(&ly->v, h);
        k_gather<<<(unsigned)B, 128, 0, ws->stream>>>(Kh, kept, d, kk);
        k_gather<<<(unsigned)B, 128, 0, ws->stream>>>(Vh, kept, d, vv);
        if (!merge) continue;
        int lrc = launch_assign(ws, &ly->k, h, kept, B, ws->assign);
        if (lrc) return kvs_gpu_cuda_check(lrc, "kvs_gpu_apply_layer: assign", err);
        rc = cudaMemsetAsync(ws->cnt, 0, sizeof(int32_t) * (size_t)B, ws->stream);
        if (rc) return kvs_gpu_cuda_check(rc, "kvs_gpu_apply_layer", err);
        k_scatter<<<(unsigned)(N - B), 128, 0, ws->stream>>>(
            Kh, Vh, ws->ev, ws->assign, kept, d, plan->merge == KVS_MERGE_WEIGHTED, kk, vv,
            ws->cnt);
        k_merge_finish<<<(unsigned)B, 128, 0, ws->stream>>>(
            Kh, Vh, kept, ws->cnt, d, plan->merge == KVS_MERGE_PIVOTAL, kk, vv);
        if ((rc = cudaGetLastError())) return kvs_gpu_cuda_check(rc, "kvs_gpu_apply_layer", err);
    }
    return KVS_OK;
}

extern "C" kvs_status kvs_gpu_fill_random(kvs_gpu_workspace *ws, void *ptr, kvs_dtype t,
                                          size_t count, uint64_t seed, float scale,
                                          kvs_err *err) {
    if (!ws || !ptr || (t != KVS_F32 && t != KVS_F16 && t != KVS_BF16))
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_fill_random: bad arguments");
    k_fill_random<<<grid_for((long long)count, 256), 256, 0, ws->stream>>>(
        ptr, (int)t, (long long)count, (unsigned long long)seed, scale);
    return kvs_gpu_cuda_check(cudaGetLastError(), "kvs_gpu_fill_random", err);
}
