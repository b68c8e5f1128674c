/*
 * gpu_common.cuh -- private to the .cu files of kernels/: the device helpers the
 * building-block files share (dtype loads, the device error record, warp
 * reductions, the 64 x 64 tile dot products on CUDA cores and wmma tensor
 * cores, the block scan and the top-k keys) and three host helpers (row
 * sources of a view, a grid size).
 *
 * What it is: inline functions and templates only, so each .cu that
 * includes it compiles its own copy (no relocatable device code). What it
 * is not: no kernel, no launcher, nothing called across files.
 */
#ifndef KVS_GPU_COMMON_CUH
#define KVS_GPU_COMMON_CUH

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

__device__ inline void report_err(kvs_gpu_errrec *e, int code, int layer, int head, int token, int chan) {
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
__device__ inline void load_tile(float (*S)[TPAD], kvs_rows src, int r0, int nrows, int d0, int d) {
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
__device__ inline void load_tile_h(unsigned short *S, kvs_rows src, int r0, int nrows, int d0, int d) {
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
__device__ inline void tile_dot_tc(kvs_rows A, int a0, int na, kvs_rows B, int b0, int nb, int d,
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
__device__ inline void tile_dot(float acc[4][4], kvs_rows A, int a0, int na, kvs_rows B, int b0, int nb,
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
__device__ inline int block_excl_scan(int v, int *total, int *ws) {
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


/* ---- host helpers ------------------------------------------------------------ */

inline kvs_rows rows_of(const kvs_view *v) {
    kvs_rows r;
    r.base = v->data;
    r.dt = (int)v->dtype;
    r.s_row = v->s_tok;
    r.rowidx = NULL;
    return r;
}

inline kvs_rows rows_of_head(const kvs_view *v, int h) {
    kvs_rows r = rows_of(v);
    r.base = (const char *)v->data + (size_t)h * (size_t)v->s_head * kvs_dtype_size(v->dtype);
    return r;
}


inline unsigned grid_for(long long total, int block) {
    long long g = (total + block - 1) / block;
    if (g < 1) g = 1;
    if (g > 65535LL * 16) g = 65535LL * 16;
    return (unsigned)g;
}

#endif
