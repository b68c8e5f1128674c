/*
 * kvs_kernels.h -- the CUDA path of kvsieve: device building blocks, the
 * workspace they run in, and the staged steps the methods' GPU drivers
 * (methods/gpu/, kvs_gpu_compress) are made of. This header is the manual
 * of the device side of kernels/ (dct.h is the CPU DCT's, kivi.h the CPU
 * KIVI quantised store's).
 *
 * kernels/ is a folder of leaves: it calls core only and knows no method by
 * name; which method runs which blocks, with which budgets, is decided in
 * methods/gpu/.
 * Files, one building block each (each names its CPU reference):
 * dct_cufft.cu (DCT on cuFFT), fc_gemm.cu (its truncated-basis GEMM route),
 * lowpass_route.cu (the switch between the two), attention.cu and
 * attn_mma.cu (attention statistics), pool.cu (score rows), topk.cu,
 * merge.cu (compaction, merging), gpu_workspace.cu (devices, memory, the
 * workspace), gpu_check.cu (errors, checks, the device error record);
 * gpu_common.cuh holds the inline device helpers they share. Calls go one
 * way, towards gpu_check.cu.
 *
 * What it is:
 *   - The workspace (kvs_gpu_workspace_init) and, for method drivers, its
 *     scratch, the device finiteness checks, segment top-k selection into
 *     host indices, and the host copies a driver needs (section "for
 *     method drivers").
 *   - kvs_gpu_apply_layer: compaction (gather) and cosine-argmax merging of
 *     one layer on the device, the device twin of core's kvs_apply.
 *   - The building blocks, exposed for the parity tests and the latency
 *     benchmark: DCT-II / DCT-III along tokens, fused low-pass + deviation +
 *     per-layer energy (FFT or truncated-basis GEMM route), per-segment
 *     top-k, 1-D pooling, attention row log-sum-exp, column sums,
 *     entropies, cosine-argmax assignment.
 *
 * Algorithms:
 *   - The DCT low-pass deviation, two routes (kvs_gpu_workspace_dct_route);
 *     both give dev [Hkv][N] and the four energies of
 *     kvs_gpu_lowpass_layer, fp32 arithmetic, fp64 energy sums:
 *     FFT route (default): Makhoul's N-point DCT on cuFFT real transforms
 *     (R2C and C2R of length N, batched over every (K|V, head, channel)
 *     column of a layer in column-major [col][N] layout), any N >= 1. The
 *     even/odd reordering is fused into the fp16/bf16/fp32 -> fp32
 *     transpose; the twiddle, the orthonormal scaling, the Parseval
 *     energies (low band and total) and the band split are one kernel on
 *     the half spectrum, which keeps the HIGH band (m >= omega): by
 *     linearity its inverse is the residual x - x_base, so the deviation
 *     kernel reads one C2R output and the base itself is never formed.
 *     Cost per column of N: ~5 N log2 N FLOP (two real FFTs) but
 *     memory-bound: about 34 bytes of device traffic per cache element
 *     (pack, R2C, band split, C2R, deviation), ~285 MB per layer at the
 *     qwen2.5-vl-7b shape, N = 8192 (Hkv 4, d 128), i.e. ~8 GB and ~2 ms for
 *     28 layers at ~4 TB/s. No memory beyond the O(N) per column buffers.
 *     GEMM route (KVS_GPU_DCT_GEMM): with C_w the first omega rows of the
 *     orthonormal DCT-II matrix (omega x N), X_low = C_w x and the residual
 *     x - C_w^T X_low as two cuBLAS GEMMs per layer over all 2 Hkv d columns
 *     at once (cublasGemmEx, fp32 compute, on the workspace stream), the
 *     energies sum X_low^2 and Parseval's sum x^2 (fixed-order, no
 *     atomics), then the FFT route's deviation kernel on the residual
 *     (kernels/fc_gemm.cu). Cost: 4 omega = 4 gamma N FLOP per cache
 *     element (6.6 kFLOP at N = 8192, gamma 0.2, vs ~65 for the FFT; 55
 *     GFLOP per layer, 1.5 TFLOP for 28 layers: ~30 ms at a realistic
 *     ~50 TFLOP/s of fp32 SGEMM on an H200), and the basis C_w, omega x N
 *     fp32 = 4 gamma N^2 bytes, built on the device once per (N, omega)
 *     and cached in the workspace (allocated when first needed, not by
 *     kvs_gpu_workspace_init): 54 MB at N = 8192, gamma 0.2; 3.4 GB at N =
 *     65536; above 4 GiB (KVS_FC_GEMM_BASIS_CAP) or when the device lacks
 *     the free memory it is refused (KVS_ERR_UNSUPPORTED / KVS_ERR_NOMEM,
 *     naming N, omega and the size). It is the one buffer of kernels/
 *     that grows as N^2 (gamma N x N, shared by every head and layer); the
 *     FFT route needs O(N) per column only.
 *     When each wins: the FFT route whenever N is more than a few hundred
 *     (fp32 GEMM time per element ~4 gamma N / 50 TFLOP/s equals the FFT
 *     route's ~34 B / 4 TB/s near N ~ 500); the GEMM route at small N,
 *     where the batched FFTs are launch-bound, and as a cross-check. TF32
 *     tensor cores (KVS_GPU_DCT_GEMM_TF32, opt-in) would move the crossover
 *     to N ~ 4K but round the inputs to 10-bit mantissas: deviations off by
 *     ~1e-3 relative, enough to reorder near ties, so its plans are NOT
 *     guaranteed to equal the CPU's.
 *   - Top-k: one thread block per segment, MSB-first radix select on 64-bit
 *     keys (order-preserving float bits, then the complement of the token
 *     index: ties go to the lower index, all keys distinct), early exit when
 *     the candidate bucket is exactly filled, then an ordered block-scan
 *     compaction, so the output is ascending without a sort.
 *   - Attention statistics: two-pass tiled log-sum-exp (spec/methods.md).
 *     fp16 / bf16 caches on tensor cores (exact 16-bit products, fp32
 *     accumulation; kvs_gpu_workspace_tensor_cores switches it) with one of
 *     two kernels (kvs_gpu_workspace_attn_kernel): register-tiled mma.sync
 *     (default, kernels/attn_mma.cu) or 64 x 64 wmma logit tiles in shared
 *     memory, d in chunks of 64; fp32 caches on CUDA cores (the 64 x 64
 *     tiles). Never an N x N buffer: pass 1 writes
 *     lse [Hq][Nq] (one block per (query head, row tile); when that is too
 *     few blocks, e.g. a 32-query observation window, the keys are split over
 *     blocks and partial max / sum pairs combined, nsplit * Nq <= N);
 *     column sums run one block per (key tile, KV head, query head of the
 *     group) over every row, fp64 accumulators, then the GQA mean in head
 *     order (deterministic, no atomics); entropies run one block per (query
 *     tile, key range) over all heads (Abar needs every head), with additive
 *     per-row partial sums (sum a, sum a log a, restricted) finished per row.
 *   - Merging: evicted keys against unit kept keys in 64 x 64 dot-product
 *     tiles (argmax, ties to the lower kept slot), then an atomic scatter of
 *     K and V into the kept rows and one finishing kernel per formula.
 *
 * Execution model: every call is asynchronous on the workspace's single
 * stream, except the documented synchronous ones (kvs_gpu_sync,
 * kvs_gpu_download, kvs_gpu_topk_segments, kvs_gpu_attn_entropies and the
 * memory helpers). A driver synchronises only where a host decision needs
 * device numbers (per-layer statistics for core's kvs_budget_allocate) and
 * once at the end, when the selected indices come back and the device error
 * record (NaN / Inf found on the device, naming layer, head, token) is
 * read. The workspace is sized once for a maximal shape and never grows,
 * except for the GEMM route's basis (above), allocated when that route
 * first runs a shape.
 *
 * Memory: device views are read in place (any head / token stride, channel
 * stride 1). A device cache view's `modality` pointer is HOST memory ([N]
 * bytes of metadata); the workspace uploads it.
 *
 * What it is not: no CPU fallback (a build without CUDA returns
 * KVS_ERR_UNSUPPORTED "built without CUDA" from every function, a machine
 * without a device returns KVS_ERR_UNSUPPORTED "no CUDA device: <reason>"),
 * no model, no I/O.
 */
#ifndef KVS_KERNELS_H
#define KVS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices -------------------------------------------------------------- */

/* Number of CUDA devices. KVS_ERR_UNSUPPORTED with "built without CUDA" or
 * "no CUDA device: <cudaGetDeviceCount message>" when there is none usable;
 * then *count = 0. */
kvs_status kvs_gpu_device_count(int *count, kvs_err *err);
/* One line about device `dev`: name, compute capability, memory, SMs. */
kvs_status kvs_gpu_device_describe(int dev, char *buf, size_t n, kvs_err *err);

/* ---- device memory helpers (synchronous; for tests, benchmarks, callers
 * without CUDA headers) ----------------------------------------------------- */

kvs_status kvs_gpu_malloc(void **ptr, size_t bytes, kvs_err *err);
void kvs_gpu_free(void *ptr); /* NULL is fine */
kvs_status kvs_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes, kvs_err *err);
kvs_status kvs_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes, kvs_err *err);
/* Fill `bytes` of device memory with the byte pattern 0xFF (a NaN in fp32,
 * fp16 and bf16): the tests poison outputs with it before each run. */
kvs_status kvs_gpu_poison(void *ptr, size_t bytes, kvs_err *err);

/* ---- workspace ------------------------------------------------------------ */

typedef struct kvs_gpu_workspace kvs_gpu_workspace;

/* Sizes every buffer and cuFFT plan once for caches up to `max`: n_layers,
 * n_tokens, n_kv_heads, n_q_heads, head_dim (n_queries and threads are
 * ignored). Creates its own stream on the current device. */
kvs_status kvs_gpu_workspace_init(kvs_gpu_workspace **ws, const kvs_shape *max, kvs_err *err);
void kvs_gpu_workspace_free(kvs_gpu_workspace *ws); /* NULL is fine */
/* The workspace's stream (a cudaStream_t), for callers that time with events. */
void *kvs_gpu_workspace_stream(kvs_gpu_workspace *ws);
/* Wait for the stream; report a CUDA error or a value the device flagged
 * (NaN / Inf), naming what/layer/head/token. */
kvs_status kvs_gpu_sync(kvs_gpu_workspace *ws, kvs_err *err);
/* Tensor cores for the attention logit tiles of fp16 / bf16 caches (wmma
 * 16x16x16, fp32 accumulation; fp32 caches always use CUDA cores): on >= 0
 * sets it (on by default on sm_80+; ignored where unsupported), -1 only
 * queries. Returns the setting now in force. */
int kvs_gpu_workspace_tensor_cores(kvs_gpu_workspace *ws, int on);
/* The tensor-core kernel of the attention statistics passes
 * (kvs_gpu_attn_lse / kvs_gpu_attn_colsum) for fp16 / bf16 caches:
 *   KVS_GPU_ATTN_WMMA (0), "wmma-smem": the 64 x 64 logit tile of the
 *     shared tile_dot, staged through shared memory (the older kernel);
 *   KVS_GPU_ATTN_MMA (1), "mma-reg" (default on sm_80+): FlashAttention-2
 *     style, mma.sync m16n8k16 with register-resident fp32 accumulators,
 *     ldmatrix, cp.async double buffering, exp2 with the scale folded in;
 *     pass 1 runs 128 query rows per block over key tiles of 64 up to the
 *     diagonal, pass 2 holds 128 keys per block and streams every visible
 *     query tile of one query head of the group (fp64 per key across
 *     tiles; the GQA mean then in head order, deterministic).
 * `which` = 0 or 1 sets it, -1 only queries; *in_force (may be NULL)
 * receives the setting. Asking for mma-reg below sm_80 is
 * KVS_ERR_UNSUPPORTED naming the device; another value KVS_ERR_INVALID.
 * Rule for views mma-reg cannot take (documented, not silent: see
 * kvs_gpu_attn_kernel_for): it needs q and k of one 16-bit dtype,
 * d % 8 == 0 and 8 <= d <= 128, 16-byte aligned data, head and token
 * strides multiples of 8 elements; other fp16 / bf16 views run the
 * wmma-smem kernel. The tensor-core switch above comes first: with it off
 * every dtype runs on CUDA cores. The entropy pass always uses wmma-smem. */
enum { KVS_GPU_ATTN_WMMA = 0, KVS_GPU_ATTN_MMA = 1, KVS_GPU_ATTN_CUDA_CORES = 2 };
kvs_status kvs_gpu_workspace_attn_kernel(kvs_gpu_workspace *ws, int which, int *in_force,
                                         kvs_err *err);
/* The kernel kvs_gpu_attn_lse / kvs_gpu_attn_colsum would run now for these
 * views: KVS_GPU_ATTN_MMA, KVS_GPU_ATTN_WMMA or KVS_GPU_ATTN_CUDA_CORES. */
int kvs_gpu_attn_kernel_for(const kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k);
/* The route of the DCT low-pass deviation (kvs_gpu_lowpass_layer; the
 * routes and their costs are under "Algorithms" above):
 *   KVS_GPU_DCT_FFT (0, default): cuFFT, Makhoul's algorithm;
 *   KVS_GPU_DCT_GEMM (1): truncated-basis GEMMs on cuBLAS, fp32 compute
 *     (plans as the CPU's, like the FFT route);
 *   KVS_GPU_DCT_GEMM_TF32 (2): the same on TF32 tensor cores; faster, NOT
 *     plan-exact (deviations ~1e-3 relative), sm_80+ only.
 * `which` = 0, 1 or 2 sets it, -1 only queries; *in_force (may be NULL)
 * receives the setting. Selecting a GEMM route the first time creates the
 * workspace's cuBLAS handle (errors name cuBLAS's status); the basis is
 * built by the first kvs_gpu_lowpass_prepare of each (N, omega). Another value is
 * KVS_ERR_INVALID; TF32 below sm_80 KVS_ERR_UNSUPPORTED. */
enum { KVS_GPU_DCT_FFT = 0, KVS_GPU_DCT_GEMM = 1, KVS_GPU_DCT_GEMM_TF32 = 2 };
kvs_status kvs_gpu_workspace_dct_route(kvs_gpu_workspace *ws, int which, int *in_force,
                                       kvs_err *err);
/* Name of the workspace's device ("NVIDIA H200 (sm_90)"). */
const char *kvs_gpu_workspace_device(const kvs_gpu_workspace *ws);

/* ---- for method drivers (methods/gpu/): staged steps on the workspace ------- */

/* The workspace's device scratch a driver fills per layer and reads back:
 * sized for the workspace's maximal shape (L, Hkv, Hq, N of
 * kvs_gpu_workspace_init). */
typedef struct {
    float *scores;  /* [L][Hkv][N] per-layer scores */
    float *sums;    /* [max(Hkv, L)][N] intermediate rows (column sums, layer sums) */
    float *lse;     /* [Hq][N] */
    double *energy; /* [L][4] */
    double *stats;  /* [L][6] */
} kvs_gpu_scratch;
kvs_gpu_scratch kvs_gpu_workspace_scratch(kvs_gpu_workspace *ws);

/* Before a driver's first step: every layer's K, V (and Q when recorded)
 * are device views the workspace can take, the cache fits the workspace
 * (L, Hkv, Hq), and the device error record is cleared. */
kvs_status kvs_gpu_begin(kvs_gpu_workspace *ws, const kvs_cache_view *c, const kvs_shape *s,
                         kvs_err *err);
/* After a failed call: wait for the stream and clear the error record, so
 * the next call starts clean (its own errors are dropped). */
void kvs_gpu_reset(kvs_gpu_workspace *ws);

/* Flags (for kvs_gpu_sync to report) the first NaN / Inf in K and V of
 * every layer (unless skip_kv) and in the last q_rows query rows (0: none). */
kvs_status kvs_gpu_check_finite(kvs_gpu_workspace *ws, const kvs_cache_view *c, int n_layers,
                                int q_rows, int skip_kv, kvs_err *err);
/* Copies modality (HOST [N], KVS_MOD_* values) to the workspace's device
 * copy; *dev receives it. */
kvs_status kvs_gpu_upload_modality(kvs_gpu_workspace *ws, const uint8_t *modality, int N,
                                   const uint8_t **dev, kvs_err *err);
/* Copies `bytes` of device memory to host memory after the stream's queued
 * work and synchronises (kvs_gpu_sync: device-flagged errors reported). */
kvs_status kvs_gpu_download(kvs_gpu_workspace *ws, void *dst, const void *src, size_t bytes,
                            kvs_err *err);

/* One top-k segment: the output row (at out_off of the indices) is
 * [0, head_cnt) ++ top-k of scores[score_off + j], j in [lo, hi), ascending
 * ++ [tail_start, tail_start + tail_cnt). Requires head_cnt <= lo and
 * hi <= tail_start when both are used. layer / head name errors. */
typedef struct {
    long long score_off;
    long long out_off;
    int lo, hi, k;
    int head_cnt, tail_start, tail_cnt;
    int layer, head;
} kvs_topk_desc;
/* Top-k of nseg segments (desc HOST [nseg], at most L * Hkv of the
 * workspace) over scores (device); the `total` indices come back to idx
 * (HOST), after one sync that also reports what the device flagged. */
kvs_status kvs_gpu_topk_segments(kvs_gpu_workspace *ws, const float *scores,
                                 const kvs_topk_desc *desc, int nseg, int32_t *idx,
                                 long long total, kvs_err *err);

/* Before kvs_gpu_lowpass_layer on a new shape (host side, may allocate):
 * the FFT route's cuFFT plans for (N, ncols) or the GEMM route's basis. */
kvs_status kvs_gpu_lowpass_prepare(kvs_gpu_workspace *ws, int N, int ncols, int omega,
                                   kvs_err *err);
/* out[n] = sum_h x[h][n] (device [H][N] -> [N]). */
kvs_status kvs_gpu_head_sum(kvs_gpu_workspace *ws, const float *x, int H, int N, float *out,
                            kvs_err *err);
/* kvs_gpu_pool1d on the first n entries of rows of stride x_stride into
 * rows of stride out_stride, flagging non-finite inputs for `layer`. */
kvs_status kvs_gpu_pool_rows(kvs_gpu_workspace *ws, const float *x, int rows, int x_stride, int n,
                             int k, int is_max, float *out, int out_stride, int layer,
                             kvs_err *err);
/* kvs_gpu_attn_lse naming `layer` in what the device flags. */
kvs_status kvs_gpu_attn_lse_at(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                               float *lse, int layer, kvs_err *err);
/* On scores [H][N] (device), per row: flags a non-finite score; normalize:
 * entry j divided by N - j (the queries that see key j); boost: the row's
 * maximum added to every text token (modality_dev NULL: every token). */
kvs_status kvs_gpu_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N, int normalize,
                              int boost, const uint8_t *modality_dev, int layer, kvs_err *err);
/* Row entropies of one layer reduced into stats (device [6]) = {plain, e_tv,
 * e_vt, n_tv, n_vt, 0} (kvs_gpu_attn_entropies without the sync). */
kvs_status kvs_gpu_attn_entropy_stats(kvs_gpu_workspace *ws, const kvs_view *q,
                                      const kvs_view *k, const float *lse,
                                      const uint8_t *modality_dev, double *stats, int layer,
                                      kvs_err *err);

/* Compaction (+ merge when plan->merge != NONE) of one layer, the device
 * twin of kvs_apply: k_out, v_out are DEVICE [Hkv][B_l][d] fp32. Async. */
kvs_status kvs_gpu_apply_layer(kvs_gpu_workspace *ws, const kvs_layer *device_layer,
                               const kvs_plan *plan, int layer, float *k_out, float *v_out,
                               kvs_err *err);

/* ---- building blocks (device pointers, async on the workspace stream) ------ */

/* Orthonormal DCT-II / DCT-III of ncols columns of length N, column-major
 * [ncols][N] fp32 (x and X distinct). Uses the workspace's cuFFT plan when
 * (N, ncols) is the workspace's layer shape (N = max n_tokens, ncols =
 * 2 * Hkv * d), else a plan cached in the workspace for this (N, ncols)
 * (made on first use; ncols * N must fit the workspace). */
kvs_status kvs_gpu_dct2(kvs_gpu_workspace *ws, const float *x, float *X, int ncols, int N,
                        kvs_err *err);
kvs_status kvs_gpu_dct3(kvs_gpu_workspace *ws, const float *X, float *x, int ncols, int N,
                        kvs_err *err);

/* The DCT low-pass deviation of one layer (K, V device views [Hkv][N][d]):
 * dev [Hkv][N] = mean_c (K - K_base)^2 + mean_c (V - V_base)^2 with the
 * low-pass keeping omega coefficients; energy[4] (device, fp64) receives
 * {low K, total K, low V, total V} (sum of squared orthonormal DCT-II
 * coefficients of the layer; the GEMM route's total is Parseval's sum of
 * squared inputs). Runs the workspace's route (kvs_gpu_workspace_dct_route);
 * the GEMM route builds its basis here when (N, omega) is new and refuses a
 * basis above KVS_FC_GEMM_BASIS_CAP or beyond free device memory. `layer`
 * only names errors. */
kvs_status kvs_gpu_lowpass_layer(kvs_gpu_workspace *ws, const kvs_layer *device_layer,
                                 int layer, int omega, float *dev, double *energy, kvs_err *err);

/* Top-k of each of S segments scores[s][0..n) (device, row stride n):
 * out[s][0..k) the indices of the k largest, ties to the lower index,
 * ascending. NaN scores are flagged (kvs_gpu_sync reports them). */
kvs_status kvs_gpu_topk(kvs_gpu_workspace *ws, const float *scores, int S, int n, int k,
                        int32_t *out, kvs_err *err);

/* 1-D pooling of rows x[r][0..n) (device), stride 1, window k, centred
 * (padding k/2): is_max ? max ignoring padding : avg over real elements. */
kvs_status kvs_gpu_pool1d(kvs_gpu_workspace *ws, const float *x, int rows, int n, int k,
                          int is_max, float *out, kvs_err *err);

/* Attention statistics of one layer, device views q [Hq][Nq][d] (row i at
 * position N - Nq + i, causal) and k [Hkv][N][d]; outputs device:
 * lse [Hq][Nq]; colsum [Hkv][N] (GQA mean of the column sums). */
kvs_status kvs_gpu_attn_lse(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                            float *lse, kvs_err *err);
kvs_status kvs_gpu_attn_colsum(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                               const float *lse, float *colsum, kvs_err *err);
/* Entropies as kvs_attn_entropies; modality is HOST [N] or NULL. This entry
 * synchronises to return host stats. */
kvs_status kvs_gpu_attn_entropies(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                                  const float *lse, const uint8_t *modality,
                                  kvs_entropy_stats *out, kvs_err *err);

/* Cosine-argmax assignment of one head, as kvs_merge_assign: kept (device,
 * [B], sorted), assign (device, [N]): slot of the most similar kept key for
 * evicted tokens, -1 for kept ones. */
kvs_status kvs_gpu_merge_assign(kvs_gpu_workspace *ws, const kvs_view *k, int head,
                                const int32_t *kept, int B, int32_t *assign, kvs_err *err);

/* Fill `count` elements of dtype t (F32/F16/BF16) at device ptr with
 * deterministic pseudo-random normal(0, scale) values (benchmark inputs). */
kvs_status kvs_gpu_fill_random(kvs_gpu_workspace *ws, void *ptr, kvs_dtype t, size_t count,
                               uint64_t seed, float scale, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVS_KERNELS_H */
