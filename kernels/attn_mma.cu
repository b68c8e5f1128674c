/*
 * attn_mma.cu -- the attention statistics of fp16 / bf16 caches on tensor
 * cores with register-resident tiles (FlashAttention-2 style): pass 1, row
 * log-sum-exp; pass 2, column sums of the probabilities. The device twin of
 * core's kvs_attn_lse / kvs_attn_colsum (same conventions, see
 * kvs_kernels.h), selected by kvs_gpu_workspace_attn_kernel.
 *
 * What it is: two kernels templated on the padded head dimension D (64 or
 * 128) and the 16-bit type (fp16 / bf16), built on inline PTX
 * (mma.sync.aligned.m16n8k16 with fp32 accumulators, ldmatrix, cp.async,
 * ex2.approx), and their launchers.
 * What it is not: no fp32 path (attention.cu keeps CUDA cores for fp32
 * caches and the wmma kernels as the alternative), no entropy pass, no
 * method logic.
 *
 * ---- Design -------------------------------------------------------------
 * Both passes are one routine, "A rows held in registers x B rows streamed
 * through shared memory":
 *   pass 1: A = 128 query rows of one query head (4 warps x 32 rows), B =
 *           key tiles of 64 keys, S = Q K^T; online max / sum per row.
 *   pass 2: A = 128 keys of one KV head (4 warps x 32 keys), B = query
 *           tiles of 64 rows of one query head of the group, S^T = K Q^T:
 *           a key is a fragment ROW, so its column sum is a sum along the
 *           fragment row: thread-local over a tile, fp64 across tiles, the
 *           4 threads of a quad combined once at the end (fixed order).
 * CTA: 128 threads. Shared memory (bytes), P = D + 8 halves row pitch
 * (the 16-byte pad makes the 8 row addresses of every ldmatrix phase hit
 * distinct banks: pitch 272 B = 68 words -> banks 4r mod 32, r = 0..7):
 *   A tile [128][P] + two B tiles [2][64][P] (+ pass 2: lse [2][64] fp32)
 *   D = 128: 69 632 (+512); D = 64: 36 864 (+512).
 * Registers per thread (D = 128): A fragments 2 x 8 x 4 = 64, accumulators
 * 2 x 8 x 4 = 64 fp32, plus running max / sum (pass 1) or 16 lse values and
 * 4 fp64 sums (pass 2).
 * Pipeline: cp.async (16 B, zero-fill outside the rows / the d columns)
 * double-buffers the B tiles: the tile t + 1 is in flight while tile t is
 * multiplied. exp is ex2.approx with the scale pre-multiplied by log2(e).
 * Causal masking only where a tile straddles the diagonal (per warp);
 * tiles with no visible pair are skipped (per CTA: the loop bounds; per
 * warp: a uniform branch).
 *
 * ---- Fragment layouts (PTX ISA, mma.m16n8k16, .f16 / .bf16, .f32 acc) ----
 * lane = threadIdx.x % 32, g = lane >> 2 (groupID), c = lane & 3.
 *   A (16 x 16, row-major), 4 .b32 regs, each two 16-bit values (low half =
 *     lower column):  a[0] = A[g][2c, 2c+1]       a[1] = A[g+8][2c, 2c+1]
 *                     a[2] = A[g][2c+8, 2c+9]     a[3] = A[g+8][2c+8, 2c+9]
 *   B (16 x 8, "col" = k fastest per n), 2 regs:
 *                     b[0] = B[k=2c, 2c+1][n=g]   b[1] = B[k=2c+8, 2c+9][n=g]
 *   C/D (16 x 8, fp32), 4 regs: c[0], c[1] = C[g][2c], C[g][2c+1]
 *                               c[2], c[3] = C[g+8][2c], C[g+8][2c+1]
 * ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the 8 row addresses (16 bytes
 * each) of matrix i; register i of thread t receives row t/4, columns
 * 2(t%4), 2(t%4)+1 of matrix i.
 *   A from a row-major tile X[row][dim] (rows r0.., dims k0..): lane l
 *     points at row r0 + (l & 15), dim k0 + (l >> 4) * 8, so matrix 0 =
 *     rows 0-7 / dims 0-7 -> a[0], matrix 1 = rows 8-15 / dims 0-7 -> a[1],
 *     matrix 2 = rows 0-7 / dims 8-15 -> a[2], matrix 3 = rows 8-15 / dims
 *     8-15 -> a[3].
 *   B = Y^T from a row-major tile Y[n][dim] (n = streamed row, dims are k):
 *     B[k][n] = Y[n][k], so an 8 x 8 block of Y (rows n, columns k) loaded
 *     without .trans gives thread t: Y[n0 + t/4][k0 + 2(t%4) + {0,1}] =
 *     B[2c + {0,1}][g], exactly b[0]. Lane l points at n = n0 + (l & 7) +
 *     ((l >> 4) << 3), dim k0 + ((l >> 3) & 1) * 8: matrix 0 -> b[0] and
 *     matrix 1 -> b[1] of the n-tile n0 .. n0+7, matrices 2, 3 -> b[0],
 *     b[1] of the n-tile n0+8 .. n0+15.
 *   Accumulator element acc[m][n][2r + e] of warp w is therefore
 *     A-row  w * 32 + m * 16 + g + 8 r   (r = 0, 1)
 *     B-row  n * 8 + 2 c + e             (n = 0..7, e = 0, 1)
 *   of the CTA's A tile / current B tile.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "attn_mma.h"

#define MMA_THREADS 128
#define MMA_WM 2      /* m16 tiles per warp: 32 A rows */
#define MMA_AROWS 128 /* A rows per CTA (4 warps x 32) */
#define MMA_BROWS 64  /* B rows per streamed tile (8 n8 tiles) */
#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

template <int D> struct mma_cfg {
    static constexpr int P = D + 8;                       /* row pitch, halves */
    static constexpr int A_BYTES = MMA_AROWS * P * 2;     /* [128][P] */
    static constexpr int B_BYTES = MMA_BROWS * P * 2;     /* one [64][P] */
    static constexpr int SMEM_LSE = A_BYTES + 2 * B_BYTES; /* pass 1 */
    static constexpr int SMEM_COL = SMEM_LSE + 2 * MMA_BROWS * 4; /* + lse [2][64] */
};

/* ---- PTX wrappers -------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; bytes = 0 writes zeros and reads nothing. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Wait until at most one committed group is still in flight. */
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                        uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c += A (16x16) * B (16x8), fp32 accumulators. */
template <bool BF>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x on the MUFU unit; 2^-inf = +0. */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- tile movers ---------------------------------------------------------- */

/* Rows [r0, r0 + ROWS) x dims [0, D) of src (row stride s_row elements)
 * into the shared tile at dst ([ROWS][P]), asynchronously; rows >= nrows and
 * dims >= d are zero-filled (d % 8 == 0). Every thread of the CTA. */
template <int D, int ROWS>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint16_t *src,
                                                long long s_row, int r0, int nrows, int d) {
    constexpr int CH = D / 8, P = mma_cfg<D>::P;
    for (int e = threadIdx.x; e < ROWS * CH; e += MMA_THREADS) {
        const int r = e / CH, ch = e - r * CH, gr = r0 + r;
        const bool ok = gr < nrows && ch * 8 < d;
        const uint16_t *p = ok ? src + (long long)gr * s_row + ch * 8 : src;
        cp_async16(dst + (uint32_t)((r * P + ch * 8) * 2), p, ok ? 16 : 0);
    }
}

/* A fragments of warp `warp`: its 32 rows of the [128][P] tile at sA. */
template <int D>
__device__ __forceinline__ void load_afrag(uint32_t (&a)[MMA_WM][D / 16][4], uint32_t sA,
                                           int warp, int lane) {
    constexpr int P = mma_cfg<D>::P;
#pragma unroll
    for (int m = 0; m < MMA_WM; m++)
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const int row = warp * 32 + m * 16 + (lane & 15), col = kk * 16 + (lane >> 4) * 8;
            ldsm_x4(sA + (uint32_t)((row * P + col) * 2), a[m][kk][0], a[m][kk][1], a[m][kk][2],
                    a[m][kk][3]);
        }
}

/* acc[m][n] = (A rows of the warp) x (B tile rows n*8 .. n*8+7)^T over the
 * first ksteps * 16 dims (the rest are zero padding). */
template <int D, bool BF>
__device__ __forceinline__ void mma_tile(float (&acc)[MMA_WM][8][4],
                                         const uint32_t (&a)[MMA_WM][D / 16][4], uint32_t sB,
                                         int lane, int ksteps) {
    constexpr int P = mma_cfg<D>::P;
#pragma unroll
    for (int m = 0; m < MMA_WM; m++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][n][e] = 0.0f;
    const int brow = (lane & 7) + ((lane >> 4) << 3), bcol = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        if (kk >= ksteps) break;
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(sB + (uint32_t)(((np * 16 + brow) * P + kk * 16 + bcol) * 2), b0, b1, b2, b3);
#pragma unroll
            for (int m = 0; m < MMA_WM; m++) {
                mma16816<BF>(acc[m][2 * np], a[m][kk], b0, b1);
                mma16816<BF>(acc[m][2 * np + 1], a[m][kk], b2, b3);
            }
        }
    }
}

/* ---- pass 1: row log-sum-exp ---------------------------------------------- */

/* grid (nsplit, Hq, ceil(Nq / 128)), 128 threads: block (x, y, z) runs key
 * split x of query head y, row tile gridDim.z - 1 - z (the row tile is the
 * slowest grid index, so the longest rows of every head are dispatched
 * first and the short ones fill the tail). nsplit > 1: split x covers key
 * tiles [x * tps, (x + 1) * tps) and writes natural-log partial max / sum
 * to part_m / part_l [nsplit][Hq][Nq]. */
template <int D, bool BF>
__global__ void __launch_bounds__(MMA_THREADS, 2)
    k_lse_mma(const uint16_t *__restrict__ Q, long long q_shead, long long q_stok,
              const uint16_t *__restrict__ K, long long k_shead, long long k_stok, int G, int Nq,
              int N, int d, int off, float sl2, float *lse, int layer, kvs_gpu_errrec *er,
              int tps, float *part_m, float *part_l) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sA = smem_addr(smem), sB = sA + mma_cfg<D>::A_BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int h = blockIdx.y, i0 = (int)(gridDim.z - 1 - blockIdx.z) * MMA_AROWS;
    const int zs = blockIdx.x; /* key split */
    const uint16_t *Qh = Q + (long long)h * q_shead, *Kg = K + (long long)(h / G) * k_shead;
    const int rlast = i0 + MMA_AROWS - 1 < Nq ? i0 + MMA_AROWS - 1 : Nq - 1;
    const int pmax = off + rlast;
    const bool split = gridDim.x > 1;
    const int jbeg = split ? zs * tps * MMA_BROWS : 0;
    int jend = split ? jbeg + tps * MMA_BROWS - 1 : pmax;
    if (jend > pmax) jend = pmax;
    const int ntiles = jend >= jbeg ? (jend - jbeg) / MMA_BROWS + 1 : 0;
    const int ksteps = (d + 15) / 16;
    const int iw = i0 + warp * 32, pw_lo = off + iw, pw_hi = off + iw + 31;
    const bool wlive = iw < Nq;

    float mrow[MMA_WM][2], lrow[MMA_WM][2]; /* log2-domain running max, partial sum */
#pragma unroll
    for (int m = 0; m < MMA_WM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mrow[m][r] = -INFINITY;
            lrow[m][r] = 0.0f;
        }
    uint32_t qa[MMA_WM][D / 16][4];
    if (ntiles > 0) {
        load_rows_async<D, MMA_AROWS>(sA, Qh, q_stok, i0, Nq, d);
        load_rows_async<D, MMA_BROWS>(sB, Kg, k_stok, jbeg, N, d);
    }
    cp_commit();
    for (int t = 0; t < ntiles; t++) {
        const int j0 = jbeg + t * MMA_BROWS;
        if (t + 1 < ntiles)
            load_rows_async<D, MMA_BROWS>(sB + (uint32_t)(((t + 1) & 1) * mma_cfg<D>::B_BYTES), Kg,
                                          k_stok, j0 + MMA_BROWS, N, d);
        cp_commit();
        cp_wait1(); /* the group of tile t (and of the Q tile) has landed */
        __syncthreads();
        if (t == 0) load_afrag<D>(qa, sA, warp, lane);
        if (wlive && j0 <= pw_hi) {
            float acc[MMA_WM][8][4];
            mma_tile<D, BF>(acc, qa, sB + (uint32_t)((t & 1) * mma_cfg<D>::B_BYTES), lane, ksteps);
            const bool diag = j0 + MMA_BROWS - 1 > pw_lo; /* some key after some row */
#pragma unroll
            for (int m = 0; m < MMA_WM; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int p = pw_lo + m * 16 + g + 8 * r; /* position of this row */
                    float tmax = -INFINITY;
#pragma unroll
                    for (int n = 0; n < 8; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float s = acc[m][n][2 * r + e] * sl2;
                            if (diag && j0 + n * 8 + 2 * c + e > p) s = -INFINITY;
                            acc[m][n][2 * r + e] = s;
                            tmax = fmaxf(tmax, s);
                        }
                    /* the row's 64 logits live in the 4 threads of the quad */
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
                    const float mn = fmaxf(mrow[m][r], tmax);
                    const float ms = mn == -INFINITY ? 0.0f : mn;
                    float ts = 0.0f;
#pragma unroll
                    for (int n = 0; n < 8; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) ts += ex2(acc[m][n][2 * r + e] - ms);
                    lrow[m][r] = lrow[m][r] * ex2(mrow[m][r] - ms) + ts;
                    mrow[m][r] = mn;
                }
        }
        __syncthreads(); /* buffer t & 1 is refilled in iteration t + 1 */
    }
#pragma unroll
    for (int m = 0; m < MMA_WM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = lrow[m][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int i = iw + m * 16 + g + 8 * r;
            if (c != 0 || i >= Nq) continue;
            const float M = mrow[m][r];
            if (split) {
                const long long o = ((long long)zs * gridDim.y + h) * Nq + i;
                part_m[o] = M == -INFINITY ? -INFINITY : M * MMA_LN2;
                part_l[o] = l;
                continue;
            }
            const float v = M * MMA_LN2 + logf(l);
            lse[(long long)h * Nq + i] = v;
            if (!isfinite(v) && atomicCAS(&er->flag, 0, 1) == 0) {
                er->code = KVS_GERR_LSE;
                er->layer = layer;
                er->head = h;
                er->token = i;
                er->chan = -1;
            }
        }
}

/* ---- pass 2: column sums --------------------------------------------------- */

/* grid (G, Hkv, ceil(N / 128)), 128 threads: keys [128 z, 128 z + 128) of
 * KV head y against every visible query tile of query head y * G + x;
 * colpart[h][j] = sum_i exp(s_ij * scale - lse_hi) in fp64. The key tile
 * is the slowest grid index: the first tiles see the most rows and are
 * dispatched first. */
template <int D, bool BF>
__global__ void __launch_bounds__(MMA_THREADS, 2)
    k_colsum_mma(const uint16_t *__restrict__ Q, long long q_shead, long long q_stok,
                 const uint16_t *__restrict__ K, long long k_shead, long long k_stok, int G,
                 int Nq, int N, int d, int off, float sl2, const float *__restrict__ lse,
                 double *colpart) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sA = smem_addr(smem), sB = sA + mma_cfg<D>::A_BYTES;
    float *Ls = (float *)(smem + mma_cfg<D>::SMEM_LSE); /* [2][64] lse * log2(e), +inf outside */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int gk = blockIdx.y, h = gk * G + (int)blockIdx.x, j0 = (int)blockIdx.z * MMA_AROWS;
    const uint16_t *Kg = K + (long long)gk * k_shead, *Qh = Q + (long long)h * q_shead;
    const float *lh = lse + (long long)h * Nq;
    int ifirst = j0 - off; /* first row whose position p = off + i reaches key j0 */
    if (ifirst < 0) ifirst = 0;
    ifirst = ifirst / MMA_BROWS * MMA_BROWS;
    const int ntiles = Nq > ifirst ? (Nq - ifirst + MMA_BROWS - 1) / MMA_BROWS : 0;
    const int ksteps = (d + 15) / 16;
    const int jw = j0 + warp * 32; /* first key of this warp */
    const bool wlive = jw < N;

    double cacc[MMA_WM][2];
#pragma unroll
    for (int m = 0; m < MMA_WM; m++) cacc[m][0] = cacc[m][1] = 0.0;
    uint32_t ka[MMA_WM][D / 16][4];
    if (ntiles > 0) {
        load_rows_async<D, MMA_AROWS>(sA, Kg, k_stok, j0, N, d);
        load_rows_async<D, MMA_BROWS>(sB, Qh, q_stok, ifirst, Nq, d);
        if (threadIdx.x < MMA_BROWS) {
            const int i = ifirst + threadIdx.x;
            Ls[threadIdx.x] = i < Nq ? lh[i] * MMA_LOG2E : INFINITY;
        }
    }
    cp_commit();
    for (int t = 0; t < ntiles; t++) {
        const int i0 = ifirst + t * MMA_BROWS, buf = t & 1;
        if (t + 1 < ntiles) {
            load_rows_async<D, MMA_BROWS>(sB + (uint32_t)((buf ^ 1) * mma_cfg<D>::B_BYTES), Qh,
                                          q_stok, i0 + MMA_BROWS, Nq, d);
            if (threadIdx.x < MMA_BROWS) {
                const int i = i0 + MMA_BROWS + threadIdx.x;
                Ls[(buf ^ 1) * MMA_BROWS + threadIdx.x] = i < Nq ? lh[i] * MMA_LOG2E : INFINITY;
            }
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (t == 0) load_afrag<D>(ka, sA, warp, lane);
        /* visible pairs exist iff the last row's position reaches the first key */
        if (wlive && off + i0 + MMA_BROWS - 1 >= jw) {
            float acc[MMA_WM][8][4];
            mma_tile<D, BF>(acc, ka, sB + (uint32_t)(buf * mma_cfg<D>::B_BYTES), lane, ksteps);
            const bool diag = off + i0 < jw + 31; /* some row before some key */
            float lq[8][2];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) lq[n][e] = Ls[buf * MMA_BROWS + n * 8 + 2 * c + e];
#pragma unroll
            for (int m = 0; m < MMA_WM; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int j = jw + m * 16 + g + 8 * r; /* the key of this fragment row */
                    float rs = 0.0f;
#pragma unroll
                    for (int n = 0; n < 8; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float pv = ex2(fmaf(acc[m][n][2 * r + e], sl2, -lq[n][e]));
                            if (diag && j > off + i0 + n * 8 + 2 * c + e) pv = 0.0f;
                            rs += pv;
                        }
                    cacc[m][r] += (double)rs;
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < MMA_WM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            double v = cacc[m][r];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            const int j = jw + m * 16 + g + 8 * r;
            if (c == 0 && j < N) colpart[(long long)h * N + j] = v;
        }
}

/* ---- host side ------------------------------------------------------------- */

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

extern "C" int kvs_attn_mma_views_ok(const kvs_view *q, const kvs_view *k) {
    const int d = k->head_dim;
    return q->dtype == k->dtype && (k->dtype == KVS_F16 || k->dtype == KVS_BF16) &&
           q->head_dim == d && d >= 8 && d % 8 == 0 && d <= KVS_ATTN_MMA_MAX_D &&
           aligned16(q->data) && aligned16(k->data) && q->s_tok % 8 == 0 &&
           q->s_head % 8 == 0 && k->s_tok % 8 == 0 && k->s_head % 8 == 0;
}

template <int D, bool BF> static int set_smem() {
    cudaError_t rc = cudaFuncSetAttribute(k_lse_mma<D, BF>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          mma_cfg<D>::SMEM_LSE);
    if (rc == cudaSuccess)
        rc = cudaFuncSetAttribute(k_colsum_mma<D, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  mma_cfg<D>::SMEM_COL);
    return (int)rc;
}

extern "C" int kvs_attn_mma_prepare(void) {
    int rc = set_smem<64, false>();
    if (!rc) rc = set_smem<64, true>();
    if (!rc) rc = set_smem<128, false>();
    if (!rc) rc = set_smem<128, true>();
    return rc;
}

/* The parameters both passes share. */
typedef struct {
    const uint16_t *q, *k;
    long long q_shead, q_stok, k_shead, k_stok;
    int Hq, Hkv, G, Nq, N, d, off, D, bf;
    float sl2;
} mma_args;

static mma_args args_of(const kvs_view *q, const kvs_view *k) {
    mma_args a;
    a.q = (const uint16_t *)q->data;
    a.k = (const uint16_t *)k->data;
    a.q_shead = q->s_head;
    a.q_stok = q->s_tok;
    a.k_shead = k->s_head;
    a.k_stok = k->s_tok;
    a.Hq = q->n_heads;
    a.Hkv = k->n_heads;
    a.G = a.Hq / a.Hkv;
    a.Nq = q->n_tokens;
    a.N = k->n_tokens;
    a.d = k->head_dim;
    a.off = a.N - a.Nq;
    a.D = a.d <= 64 ? 64 : 128;
    a.bf = k->dtype == KVS_BF16;
    a.sl2 = (float)(1.4426950408889634 / sqrt((double)a.d));
    return a;
}

template <int D, bool BF>
static void launch_lse(const mma_args &a, dim3 grid, cudaStream_t s, float *lse, int layer,
                       kvs_gpu_errrec *er, int tps, float *pm, float *pl) {
    k_lse_mma<D, BF><<<grid, MMA_THREADS, mma_cfg<D>::SMEM_LSE, s>>>(
        a.q, a.q_shead, a.q_stok, a.k, a.k_shead, a.k_stok, a.G, a.Nq, a.N, a.d, a.off, a.sl2,
        lse, layer, er, tps, pm, pl);
}

template <int D, bool BF>
static void launch_col(const mma_args &a, dim3 grid, cudaStream_t s, const float *lse,
                       double *colpart) {
    k_colsum_mma<D, BF><<<grid, MMA_THREADS, mma_cfg<D>::SMEM_COL, s>>>(
        a.q, a.q_shead, a.q_stok, a.k, a.k_shead, a.k_stok, a.G, a.Nq, a.N, a.d, a.off, a.sl2,
        lse, colpart);
}

extern "C" int kvs_launch_lse_mma(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                  float *lse, int layer, int *nsplit_out) {
    const mma_args a = args_of(q, k);
    *nsplit_out = 1;
    if (a.Nq <= 0) return 0;
    /* split the keys when there are too few (head, row tile) blocks to fill
     * the device; partials live in ws->lsepart [2][nsplit][Hq][Nq] with
     * nsplit * Nq <= N (O(N) per head) */
    const int row_tiles = (a.Nq + MMA_AROWS - 1) / MMA_AROWS;
    const int key_tiles = (a.N + MMA_BROWS - 1) / MMA_BROWS;
    const long long blocks = (long long)row_tiles * a.Hq;
    int nsplit = 1;
    if (blocks < 2 * ws->n_sm) {
        nsplit = (int)((4LL * ws->n_sm + blocks - 1) / blocks);
        if (nsplit > key_tiles) nsplit = key_tiles;
        if (nsplit > a.N / a.Nq) nsplit = a.N / a.Nq;
        if (nsplit < 1) nsplit = 1;
    }
    const int tps = (key_tiles + nsplit - 1) / nsplit;
    nsplit = (key_tiles + tps - 1) / tps;
    float *pm = ws->lsepart, *pl = ws->lsepart + (size_t)nsplit * a.Hq * a.Nq;
    const dim3 grid((unsigned)nsplit, (unsigned)a.Hq, (unsigned)row_tiles);
    if (a.D == 64 && !a.bf) launch_lse<64, false>(a, grid, ws->stream, lse, layer, ws->errrec, tps, pm, pl);
    else if (a.D == 64) launch_lse<64, true>(a, grid, ws->stream, lse, layer, ws->errrec, tps, pm, pl);
    else if (!a.bf) launch_lse<128, false>(a, grid, ws->stream, lse, layer, ws->errrec, tps, pm, pl);
    else launch_lse<128, true>(a, grid, ws->stream, lse, layer, ws->errrec, tps, pm, pl);
    *nsplit_out = nsplit; /* the caller combines the partials when nsplit > 1 */
    return (int)cudaGetLastError();
}

extern "C" int kvs_launch_colsum_mma(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                     const float *lse, double *colpart) {
    const mma_args a = args_of(q, k);
    const dim3 grid((unsigned)a.G, (unsigned)a.Hkv,
                    (unsigned)((a.N + MMA_AROWS - 1) / MMA_AROWS));
    if (a.D == 64 && !a.bf) launch_col<64, false>(a, grid, ws->stream, lse, colpart);
    else if (a.D == 64) launch_col<64, true>(a, grid, ws->stream, lse, colpart);
    else if (!a.bf) launch_col<128, false>(a, grid, ws->stream, lse, colpart);
    else launch_col<128, true>(a, grid, ws->stream, lse, colpart);
    return (int)cudaGetLastError();
}
