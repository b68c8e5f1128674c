/*
 * kvs_kernels_internal.h -- private to kernels/: the workspace layout and the
 * kernel launchers the .cu files define and call across files (one way:
 * see each declaration's file). Not installed, not included outside
 * kernels/.
 *
 * What it is: plain C declarations (usable from C and from nvcc's C++).
 * What it is not: no device code, no public API (kvs_kernels.h).
 */
#ifndef KVS_KERNELS_INTERNAL_H
#define KVS_KERNELS_INTERNAL_H

#include <cuda_runtime_api.h>
#include <cufft.h>

#include "kvs_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a device kernel found wrong (first writer wins). */
enum {
    KVS_GERR_NONE = 0,
    KVS_GERR_K = 1,      /* NaN/Inf in K */
    KVS_GERR_V = 2,      /* NaN/Inf in V */
    KVS_GERR_Q = 3,      /* NaN/Inf in Q */
    KVS_GERR_DEV = 4,    /* DCT low-pass deviation not finite */
    KVS_GERR_LSE = 5,    /* log-sum-exp not finite */
    KVS_GERR_SCORE = 6,  /* attention score / vote not finite */
    KVS_GERR_NAN = 7,    /* NaN score given to top-k */
    KVS_GERR_ASSIGN = 8, /* key similarity NaN (merge) */
    KVS_GERR_ENTROPY = 9 /* entropy not finite */
};

typedef struct {
    int flag; /* 0 until the first error */
    int code, layer, head, token, chan;
} kvs_gpu_errrec;

/* (kvs_topk_desc, one top-k segment, is public: kvs_kernels.h.) */

/* A matrix source for the tile kernels: row r, column c lives at
 * base + (rowidx ? rowidx[r] : r) * s_row + c, dtype dt. */
typedef struct {
    const void *base;
    int dt;
    long long s_row;
    const int32_t *rowidx;
} kvs_rows;

struct kvs_gpu_workspace {
    int device;
    int n_sm; /* streaming multiprocessors (launch sizing) */
    int tensor_cores; /* attention tiles of fp16 / bf16 inputs on tensor cores */
    int attn_kernel;  /* KVS_GPU_ATTN_WMMA or KVS_GPU_ATTN_MMA (kvs_gpu_workspace_attn_kernel) */
    int dct_route;    /* KVS_GPU_DCT_* (kvs_gpu_workspace_dct_route): the DCT low-pass route */
    struct kvs_fc_gemm *fcg; /* the GEMM route's cuBLAS handle and cached basis (fc_gemm.cu);
                              * NULL until the route is first selected */
    int cc_major, cc_minor; /* compute capability */
    char device_name[320];
    cudaStream_t stream;
    /* capacity */
    int L, N, Hkv, Hq, d;
    int ncols; /* 2 * Hkv * d: the columns of one layer's K and V */
    int Nh;    /* N / 2 + 1 */
    /* ---- dct_cufft.cu ---- */
/* cuFFT plans for (N, ncols) */
    cufftHandle r2c, c2r;
    int have_r2c, have_c2r;
    /* plans for the standalone DCT entry points, (x_N, x_ncols) */
    cufftHandle xr2c, xc2r;
    int have_x, x_N, x_ncols;
    /* device buffers */
    float *rin;          /* [ncols][N] reordered input columns */
    float *rout;         /* [ncols][N] reordered low-pass base */
    cufftComplex *spec;  /* [ncols][Nh] half spectrum */
    float *scores;       /* [L][Hkv][N] per-method scores / votes / deviations */
    float *scratch;      /* [max(Hkv, L)][N] colsum before pooling, layer sums */
    float *lse;          /* [Hq][N] */
    float *lsepart;      /* [2][Hq][N] split-key partial max / sum of the lse pass */
    double *colpart;     /* [Hq][N] column sums per query head (before the GQA mean) */
    double *rowpart;     /* [8][4][N] split-key partial row sums of the entropy pass */
    double *energy;      /* [L][4] */
    double *rowstat;     /* [2][N] per-row entropies (plain, restricted) */
    signed char *rowkind;/* [N] */
    double *stats;       /* [L][6] entropy statistics per layer */
    uint8_t *modality;   /* [N] */
    kvs_topk_desc *desc; /* [L * Hkv] */
    int32_t *idx;        /* [L][Hkv][N] plan indices */
    int32_t *ev;         /* [N] evicted tokens of one head */
    int32_t *assign;     /* [N] */
    int32_t *kept;       /* [Hkv][N] */
    int32_t *cnt;        /* [N] merge counts */
    float *unitk;        /* [N][d] unit kept keys of one head */
    kvs_gpu_errrec *errrec;
    /* pinned host staging */
    kvs_gpu_errrec *h_err;
    kvs_topk_desc *h_desc; /* [L * Hkv] */
    int32_t *h_idx;        /* [L][Hkv][N] */
    double *h_stats;       /* [L][6] */
    double *h_energy;      /* [L][4] */
    uint8_t *h_modality;   /* [N] */
    int32_t *h_kept;       /* [Hkv][N] */
};

/* ---- gpu_check.cu ---- */
/* CUDA error -> kvs_err, naming what failed. */
kvs_status kvs_gpu_cuda_check(int cuda_rc, const char *what, kvs_err *err);
/* cuFFT status -> kvs_err. */
kvs_status kvs_gpu_cufft_check(cufftResult r, const char *what, kvs_err *err);
/* Checks a device view against the workspace (device memory, dtype, dims). */
kvs_status kvs_gpu_check_view(const kvs_gpu_workspace *ws, const kvs_view *v, const char *what,
                              kvs_err *err);

/* ---- dct_cufft.cu ---- */
/* cuFFT plans for (N, ncols) columns (made once per shape; a cache of another
 * length re-makes them). */
kvs_status kvs_gpu_ensure_plans(kvs_gpu_workspace *ws, int N, int ncols, kvs_err *err);

/* Launchers (async on ws->stream; 0 on success, else a cudaError_t),
 * grouped by the file that defines them. */
/* The FFT route of the low-pass deviation of one layer: dev [Hkv][N],
 * energy [4] (zeroed here). */
int kvs_launch_lowpass_layer(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer, int omega,
                             float *dev, double *energy);
/* The two halves of it that the GEMM route (fc_gemm.cu) shares: K and V of
 * the layer -> ws->rin [2 H d][N] fp32 in Makhoul's reordered token order
 * (dct_order.cuh), flagging NaN / Inf; and dev [H][N] from reordered
 * residual columns resid [2 H d][N] (x - x_base), flagging a non-finite
 * deviation. */
int kvs_launch_fc_pack(kvs_gpu_workspace *ws, const kvs_layer *ly, int layer);
int kvs_launch_fc_dev(kvs_gpu_workspace *ws, const float *resid, int H, int N, int d, float *dev,
                      int layer);
/* ---- gpu_check.cu (launchers) ---- */
int kvs_launch_reset_err(kvs_gpu_workspace *ws);
/* Flags the first non-finite element of view v ([H][N][d]) with `code`. */
int kvs_launch_check_finite(kvs_gpu_workspace *ws, const kvs_view *v, int code, int layer);
/* ---- pool.cu ---- */
/* out[n] = sum_h dev[h][n] ([H][N] -> [N]) */
int kvs_launch_head_sum(kvs_gpu_workspace *ws, const float *dev, int H, int N, float *out);
/* Pools rows of x [rows][N] (first n of each row) into out rows of stride
 * out_stride, flagging non-finite inputs as KVS_GERR_SCORE for `layer`. */
int kvs_launch_pool(kvs_gpu_workspace *ws, const float *x, int rows, int x_stride, int n, int k,
                    int is_max, float *out, int out_stride, int layer);
/* Finite check, optional /(N - j), optional text boost, on scores [H][N]. */
int kvs_launch_score_post(kvs_gpu_workspace *ws, float *scores, int H, int N, int normalize,
                          int boost, const uint8_t *modality_dev, int layer);
/* ---- topk.cu ---- */
int kvs_launch_topk(kvs_gpu_workspace *ws, const float *scores, const kvs_topk_desc *desc_dev,
                    int nseg, int32_t *idx);
/* ---- attention.cu ---- */
int kvs_launch_lse(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k, float *lse,
                   int layer);
/* lse [Hq][Nq] from nsplit split-key partials (max, sum). */
int kvs_launch_lse_combine(kvs_gpu_workspace *ws, const float *part_m, const float *part_l,
                           int nsplit, int Hq, int Nq, float *lse, int layer);
int kvs_launch_colsum(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                      const float *lse, float *colsum);
/* Row entropies + reduction into stats [6] = {plain, e_tv, e_vt, n_tv, n_vt, 0}. */
int kvs_launch_entropies(kvs_gpu_workspace *ws, const kvs_view *q, const kvs_view *k,
                         const float *lse, const uint8_t *modality_dev, double *stats, int layer);

#ifdef __cplusplus
}
#endif
#endif
