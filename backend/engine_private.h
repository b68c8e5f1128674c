/*
 * engine_private.h -- declarations shared by the engine's own files (model.c,
 * tokenizer.c, session.c, forward.c, quant.c, dot.c, simd.c, pool.c). Not part of
 * the public API; the HTTP server and the CLI use kvs_backend.h only.
 */
#ifndef KVS_ENGINE_PRIVATE_H
#define KVS_ENGINE_PRIVATE_H

#include <pthread.h>
#include <stdint.h>

#include "kvs_backend.h"

/* ---- dot.c extras ----------------------------------------------------------- */
float kvs_dot_ff(const float *a, const float *b, int64_t n);
float kvs_dot_q8a_scalar(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* y[c] = kvs_dot_q8a(type, row, x + c * xstride, n) for c < ncols, bit for bit,
 * each weight block unpacked once for all columns (quant.c). */
void kvs_dot_q8a_cols(int type, const void *row, const kvs_q8a_block *x, int64_t xstride, int ncols, int64_t n,
                      float *y);
/* The same over nrows rows (row r at rows + r * row_bytes): out[c * ostride + r]
 * = kvs_dot_q8a(type, row r, x + c * xstride, n), bit for bit. The batched
 * matrix-vector product of decode calls it on a thread's range of rows. */
void kvs_dot_q8a_rows(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                      int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
/* Which kernels kvs_dot_q8a / kvs_dot_q8a_rows run: 1 where this build has the
 * AVX-512 VNNI ones (dot_vnni.c) and the CPU has AVX512_VNNI and AVX512VL.
 * The two builds' entry points, for the tests that compare them bit for bit:
 * _base (x86-64-v3 or scalar, always) and _vnni (only when available). */
int kvs_dot_vnni_available(void);
void kvs_dot_q8a_rows_base(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                           int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
float kvs_dot_q8a_vnni(int type, const void *row, const kvs_q8a_block *x, int64_t n);
/* The block-scale route (dot_bs.c) for Q8_0 and Q5_0 rows (Q4_K, Q6_K: n a
 * multiple of 256), n <= 8192: where kvs_dot_bs_route(type, n) is 1,
 * kvs_dot_q8a and kvs_dot_q8a_rows run its kernels for every call on such
 * rows, one column or many, with its own float structure (per block: exact
 * integer dot S, y = fma(dw * dx, S, y); Q4_K then its min term; Q6_K per
 * group of 16), of which kvs_dot_q8a_bs_ref is the plain C form.
 * _engine: 2 AMX-INT8 tiles (dot_amx.c; the CPU has them, the kernel granted
 * tile data, KVSIEVE_AMX is not 0), 1 AVX-512 VNNI (where the CPU has it and
 * not AMX), 0 none (or KVSIEVE_BS=0). The _bs entry points may only be called where the route is
 * 1; _bs_vnni runs the VNNI engine whichever the machine picks, where
 * _vnni_available (tests compare the engines). */
int kvs_dot_bs_engine(void);
int kvs_dot_bs_vnni_available(void);
int kvs_dot_bs_route(int type, int64_t n);
float kvs_dot_q8a_bs(int type, const void *row, const kvs_q8a_block *x, int64_t n);
void kvs_dot_q8a_rows_bs(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                         int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
void kvs_dot_q8a_rows_bs_vnni(int type, const void *rows, size_t row_bytes, int64_t nrows, const kvs_q8a_block *x,
                              int64_t xstride, int ncols, int64_t n, float *out, int64_t ostride);
int kvs_dot_amx_available(void);
float kvs_dot_q8a_bs_ref(int type, const void *row, const kvs_q8a_block *x, int64_t n);

/* ---- simd.c ------------------------------------------------------------------ */
/* x[i] = exp(x[i] - sub); returns the sum. */
double kvs_vexp_sub(float *x, int n, float sub);
void kvs_vgelu_mul(float *g, const float *u, int n); /* g = gelu_tanh(g) * u */
void kvs_vsilu_mul(float *g, const float *u, int n); /* g = silu(g) * u */
void kvs_vaxpy(float *o, float a, const float *x, int n); /* o += a x */
float kvs_vmax(const float *x, int n);                   /* max x[i], NaN skipped; -inf if n = 0 */
void kvs_vscale(float *x, int n, float a);               /* x *= a */
double kvs_sumsq(const float *x, int n);                 /* sum of squares */
/* KV cache rows of element type ctype (kvs_cache_type); n elements. */
size_t kvs_cache_elem_size(int ctype);
void kvs_cache_to_f32(int ctype, const void *src, float *dst, int n);
void kvs_cache_from_f32(int ctype, const float *src, void *dst, int n);
float kvs_dot_cache(int ctype, const float *q, const void *k, int n);       /* q . k */
void kvs_axpy_cache(int ctype, float *o, float a, const void *x, int n);    /* o += a x */
/* nh query heads (head h at q + h * qstride) against nrows rows (row t at k +
 * t * rstride elements): out[h * ostride + t] = kvs_dot_cache(q_h, row t) *
 * scale, bit for bit, each f16/bf16 element converted once per pass of up to
 * 4 heads. */
void kvs_dot_cache_heads(int ctype, const float *q, size_t qstride, int nh, const void *k, size_t rstride, int nrows,
                         int n, float scale, float *out, size_t ostride);
/* o_h += p[h * pstride + t] row t for t = 0 .. nrows - 1, with o_h = o + h *
 * ostride: bit for bit kvs_axpy_cache(o_h, p_h[t], row t) over t in order. */
void kvs_axpy_cache_heads(int ctype, float *o, size_t ostride, int nh, const float *p, size_t pstride, const void *x,
                          size_t rstride, int nrows, int n);
/* The same two on AVX-512F (attn512.c), bit for bit, for f16 (bf = 0) or
 * bf16 (bf = 1) rows and n % 32 == 0; simd.c calls them where
 * kvs_attn512_available() (the CPU has AVX-512F and KVSIEVE_ATTN512 is not
 * 0). Builds without attn512.c: KVS_HAVE_ATTN512 undefined. */
int kvs_attn512_available(void);
/* Decode attention's software prefetch (simd.c, attn512.c): as each 64-byte
 * line of a cache row is read, the line KVS_PREFETCH_AHEAD bytes further on
 * is requested, so the requests are spread over the compute. Rows of one KV
 * head are contiguous, so that is the row 8 KiB ahead; near the end of the
 * cache the address may lie past it, which a prefetch ignores (it is made
 * as an integer, never as an out-of-bounds pointer). Measured on a 2-core
 * Sapphire Rapids VM, one thread, 7 heads of d 64 over rows streamed from
 * 96 MiB: dot + axpy 50 -> 39 ns a row pair (AVX2), 40-44 -> 28-33
 * (AVX-512F), where a burst of prefetches for the block two blocks ahead,
 * what simd.c did before, was no faster than none. (That block prefetch had
 * measured 47.9 -> 52.7 tok/s for Qwen2.5 after 4K tokens on a 2-core Zen 4;
 * the spread prefetch has not been measured on Zen 4 yet.) */
#define KVS_PREFETCH_AHEAD 8192
static inline void kvs_prefetch_ahead(const void *p) {
    __builtin_prefetch((const void *)((uintptr_t)p + KVS_PREFETCH_AHEAD), 0, 3);
}
/* Which kernels kvs_dot_cache_heads / kvs_axpy_cache_heads run for rows of
 * type ctype and size n on this machine: "avx512f", "avx2" or "one head at a
 * time" (f32 rows, builds without F16C). For tests and logs. */
const char *kvs_attn_kernels(int ctype, int n);
void kvs_dot_cache_heads512(int bf, const float *q, size_t qstride, int nh, const uint16_t *k, size_t rstride,
                            int nrows, int n, float scale, float *out, size_t ostride);
void kvs_axpy_cache_heads512(int bf, float *o, size_t ostride, int nh, const float *p, size_t pstride,
                             const uint16_t *x, size_t rstride, int nrows, int n);

/* ---- thread pool (pool.c) ---------------------------------------------------- */
typedef void (*kvs_pool_fn)(void *arg, int ith, int nth);
typedef struct kvs_pool kvs_pool;
kvs_status kvs_pool_new(int n_threads, kvs_pool **out, kvs_err *err);
void kvs_pool_free(kvs_pool *p);
int kvs_pool_size(const kvs_pool *p);
/* Run fn(arg, i, n) on all n threads (the caller is thread 0); returns when
 * every thread has finished. */
void kvs_pool_run(kvs_pool *p, kvs_pool_fn fn, void *arg);

/* ---- model (model.c) ---------------------------------------------------------- */
enum { KVS_ARCH_GEMMA3 = 1, KVS_ARCH_LLAMA = 2, KVS_ARCH_QWEN2 = 3 };

/* A weight matrix [rows][cols] of one GGUF type (rows of ne[0] = cols). */
typedef struct {
    const void *data;
    int type;
    int64_t rows, cols;
    size_t row_bytes;
} kvs_wmat;

typedef struct {
    float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm; /* owned fp32 */
    float *bq, *bk, *bv;                                                          /* qwen2 biases */
    kvs_wmat wq, wk, wv, wo, gate, up, down;
    int is_local;
    float rope_base;
} kvs_layer_w;

typedef struct kvs_tokenizer kvs_tokenizer;

struct kvs_model {
    kvs_gguf g;
    kvs_model_info info;
    int arch;
    int n_threads;
    kvs_wmat tok_embd, output;
    float *output_norm; /* [E] */
    kvs_layer_w *layers; /* [L] */
    float emb_scale;     /* sqrt(E) for gemma, 1 otherwise */
    float attn_scale;    /* 1/sqrt(head_dim) unless the model says otherwise */
    float norm_eps;
    int rope_neox;       /* 1: rotate halves (NEOX), 0: interleaved pairs */
    float rope_scale;    /* linear RoPE scaling: positions times this (global layers) */
    float *rope_freqs;   /* [D/2] frequency divisors (rope_freqs.weight) or NULL */
    kvs_tokenizer *tok;
    kvs_special_tokens special;
};

/* ---- tokenizer (tokenizer.c) --------------------------------------------------- */
kvs_status kvs_tokenizer_load(kvs_model *m, kvs_err *err);
void kvs_tokenizer_free(kvs_tokenizer *t);

#endif
