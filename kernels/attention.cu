/*
 * attention.cu -- attention statistics of one layer on the device
 * (kvs_kernels.h, "Attention statistics"): two-pass tiled log-sum-exp with
 * split-key partials, column sums with the GQA mean in head order, row
 * entropies (plain and cross-modal), on the 64 x 64 tiles of
 * gpu_common.cuh; the register-tiled mma kernels of attn_mma.cu are called
 * from here when the workspace selects them and the views qualify.
 * CPU reference: core's kvs_attn_lse / kvs_attn_colsum / kvs_attn_entropies
 * (core/attention.c).
 *
 * What it is not: no scores of a method (drivers post-process the sums).
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
#include "attn_mma.h"

/* ------------------------------------------------------------------------ */
/* Attention statistics                                                      */
/* ------------------------------------------------------------------------ */

/* Pass 1: lse [Hq][Nq]. grid (Nq/64, Hq, nsplit), block 16x16. With
 * nsplit > 1 (few query rows, e.g. an observation window) block z covers key tiles
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


extern "C" int kvs_launch_lse(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                              float *lse, int layer) {
    if (kvs_gpu_attn_kernel_for(ws, q, k) == KVS_GPU_ATTN_MMA) {
        int ns = 1;
        int rc = kvs_launch_lse_mma(ws, q, k, lse, layer, &ns);
        if (!rc && ns > 1) {
            const size_t part = (size_t)ns * q->n_heads * q->n_tokens;
            rc = kvs_launch_lse_combine(ws, ws->lsepart, ws->lsepart + part, ns, q->n_heads,
                                        q->n_tokens, lse, layer);
        }
        return rc;
    }
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


extern "C" kvs_status kvs_gpu_attn_lse_at(kvs_gpu_workspace *ws, const kvs_view *q,
                                          const kvs_view *k, float *lse, int layer,
                                          kvs_err *err) {
    kvs_status st = check_qk(ws, q, k, "kvs_gpu_attn_lse", err);
    if (st) return st;
    return kvs_gpu_cuda_check(kvs_launch_lse(ws, q, k, lse, layer), "kvs_gpu_attn_lse", err);
}

extern "C" kvs_status kvs_gpu_attn_entropy_stats(kvs_gpu_workspace *ws, const kvs_view *q,
                                                 const kvs_view *k, const float *lse,
                                                 const uint8_t *modality_dev, double *stats,
                                                 int layer, kvs_err *err) {
    kvs_status st = check_qk(ws, q, k, "kvs_gpu_attn_entropy_stats", err);
    if (st) return st;
    return kvs_gpu_cuda_check(kvs_launch_entropies(ws, q, k, lse, modality_dev, stats, layer),
                              "kvs_gpu_attn_entropy_stats", err);
}
