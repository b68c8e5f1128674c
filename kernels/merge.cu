/*
 * merge.cu -- compaction and merging on the device: cosine-argmax
 * assignment of evicted keys to kept ones (64 x 64 dot-product tiles, ties
 * to the lower kept slot), gather of kept rows, scatter-merge of K and V
 * and the finishing kernels (kvs_gpu_merge_assign, kvs_gpu_apply_layer).
 * CPU reference: core's kvs_merge_assign and kvs_apply (core/apply.c).
 *
 * What it is not: no selection (the plan is given).
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

