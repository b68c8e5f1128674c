/*
 * kivi.h -- KIVI-style asymmetric 2- and 4-bit quantization of one KV head
 * (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
 * Cache", arXiv 2402.02750), CPU. This header is the manual of kivi.c.
 *
 * What it is: a building block of kernels/ (in the library with and without
 * CUDA): a per-head store that holds a growing sequence of key and value rows
 * [T][d] partly as packed integer codes and partly in full precision, and
 * reads them back without a dequantised copy of the whole head (attention
 * scores q . k_t and the weighted sum sum_t w_t v_t). It knows no method and
 * no model; an engine keeps one store per (layer, KV head).
 *
 * The scheme (docs/methods.md, "KIVI", says why each choice was made):
 *   - Keys per channel: a key group is G consecutive tokens x 1 channel.
 *     Values per token: a value group is 1 token x G consecutive channels
 *     (the last group of a row is shorter when G does not divide d).
 *   - Each group has a zero point z and a scale s (min-max, asymmetric):
 *     code = clamp(round((x - z) / s), 0, 2^b - 1), x^ = z + code * s, with
 *     z = mn rounded DOWN to fp16 and s = (mx - z) / (2^b - 1) rounded UP to
 *     fp16 (both stored as fp16), so every element of the group satisfies
 *     |x - x^| <= s / 2 up to float rounding. s = 0 only when every element
 *     equals z exactly; then codes are 0. round() is half-up.
 *   - The window: keys and values each keep their most recent tokens in full
 *     precision (residual_dtype). Keys: when a token arrives and the key
 *     window already holds R tokens, those R tokens are quantised (R / G key
 *     groups per channel, aligned to multiples of R from token 0), then the
 *     token enters the empty window; so after appending, 1..R keys are in the
 *     window. Values: when a token arrives and the value window holds more
 *     than R tokens, the oldest is quantised (per token) first; so after
 *     appending, up to R + 1 values are in the window. This is the official
 *     code's state while a decode step attends (it attends, then quantises);
 *     kvs_kivi_flush performs that end-of-step quantisation (keys: a full
 *     window; values: down to R), i.e. the state KIVI keeps between steps and
 *     after its prefill. The quantised prefixes are kq = R floor((T-1)/R) keys
 *     and vq = max(0, T-R-1) values after appending T tokens, R floor(T/R) and
 *     max(0, T-R) after a flush: a function of T only, so appending in bulk,
 *     in chunks or token by token gives bit-identical stores.
 *   - Packing: codes are a bit stream, code i at bits [b i, b i + b) counted
 *     from the least significant bit of byte (b i) / 8 (b = 2: four codes a
 *     byte; b = 4: two). A quantised key block (G tokens, all d channels) is
 *     ceil(d G b_k / 8) bytes, channel-major (code c G + j is channel c of
 *     the block's token j), followed by d fp16 scales and d fp16 zeros. A
 *     quantised value row is ceil(d b_v / 8) bytes plus ceil(d / G) fp16
 *     scales and zeros.
 *   - Inputs are first stored in residual_dtype (an F32 input and an F16
 *     window: rounded to fp16 once, as KIVI whose inputs are fp16);
 *     quantisation reads them from the window. |x| > 65504 (fp16's largest
 *     value, the range of the stored zero points) and NaN / Inf are refused.
 *
 * Bytes (kvs_kivi_bytes): what the store's data occupies for its T tokens,
 * codes + fp16 scales and zeros + the window rows, exactly as laid out in
 * memory (the store allocates its capacity up front; unused capacity is not
 * counted).
 *
 * Composition with eviction: plan first, then quantise -- append the kept
 * rows (kvs_kivi_append_rows with the plan's ascending indices) of the
 * uncompressed cache to an empty store.
 *
 * What it is not: no GPU code, no threads; a store is used by one thread at a
 * time (kvs_kivi_scores / kvs_kivi_weighted_sum use its scratch tile).
 * Different stores are independent.
 */
#ifndef KVS_KIVI_H
#define KVS_KIVI_H

#include <stddef.h>
#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* KIVI's defaults (the paper's experiments and its LongBench runs). */
#define KVS_KIVI_GROUP 32
#define KVS_KIVI_RESIDUAL 128

typedef struct {
    int k_bits, v_bits;       /* 2 or 4 each */
    int group;                /* G >= 1 */
    int residual;             /* R >= G, a multiple of G */
    kvs_dtype residual_dtype; /* the window: KVS_F16 (default), KVS_BF16 or KVS_F32 */
} kvs_kivi_config;

/* {bits, bits, KVS_KIVI_GROUP, KVS_KIVI_RESIDUAL, KVS_F16} */
kvs_kivi_config kvs_kivi_config_default(int bits);
/* KVS_ERR_INVALID naming the field when cfg cannot hold head_dim channels. */
kvs_status kvs_kivi_config_check(const kvs_kivi_config *cfg, int head_dim, kvs_err *err);

typedef struct kvs_kivi_head kvs_kivi_head;

/* An empty store for up to `capacity` >= 1 tokens of head_dim channels; all
 * memory is allocated here (about capacity * d * (b_k + b_v) / 8 bytes of
 * codes, their fp16 parameters, and 2 R + 1 window rows). */
kvs_status kvs_kivi_init(kvs_kivi_head **out, const kvs_kivi_config *cfg, int head_dim,
                         int capacity, kvs_err *err);
void kvs_kivi_free(kvs_kivi_head *h); /* NULL is fine */
/* Empties the store (T = 0), keeping its memory. */
void kvs_kivi_reset(kvs_kivi_head *h);

/* Appends rows [n0, n0 + count) of head `head` of the host views k and v
 * ([H][N][d], F32 / F16 / BF16, d = head_dim), in order, token by token as
 * described above. Fails, leaving the store unchanged, on a bad view or
 * range, a full store (naming the capacity), or a value NaN / Inf / beyond
 * +-65504 (KVS_ERR_NUMERIC naming K or V, head, token, channel). */
kvs_status kvs_kivi_append(kvs_kivi_head *h, const kvs_view *k, const kvs_view *v, int head,
                           int n0, int count, kvs_err *err);
/* The same for the rows idx[0..n) (strictly ascending, in range): the kept
 * tokens of an eviction plan, which then are tokens 0..n-1 of the store. */
kvs_status kvs_kivi_append_rows(kvs_kivi_head *h, const kvs_view *k, const kvs_view *v,
                                int head, const int32_t *idx, int n, kvs_err *err);
/* KIVI's end-of-step quantisation: a key window of R tokens is quantised, the
 * value window shrinks to R. Appending afterwards gives the same store as
 * appending without it. */
void kvs_kivi_flush(kvs_kivi_head *h);

/* scores [nq][T] = q [nq][d] . k_t for every token t = 0..T-1 (no 1/sqrt(d),
 * no softmax: the caller's), the quantised keys read one G x d block at a
 * time. KVS_ERR_INVALID for nq < 1 or T = 0. */
kvs_status kvs_kivi_scores(kvs_kivi_head *h, const float *q, int nq, float *scores,
                           kvs_err *err);
/* out [nq][d] = sum_t w [nq][T] v_t, the quantised values read row by row. */
kvs_status kvs_kivi_weighted_sum(kvs_kivi_head *h, const float *w, int nq, float *out,
                                 kvs_err *err);
/* The reference: every key and value as the store answers them, k and v
 * [T][d] fp32 (quantised tokens dequantised, window tokens converted). */
void kvs_kivi_dequantize(const kvs_kivi_head *h, float *k, float *v);

/* The quantisation step s of the group holding element (t, c) of K
 * (is_value 0) or V (1); 0 for a token in the window. t < T, c < d. */
float kvs_kivi_step(const kvs_kivi_head *h, int is_value, int t, int c);

typedef struct {
    int n_tokens;            /* T */
    int k_quantized;         /* kq: keys 0..kq-1 are codes, kq..T-1 the window */
    int v_quantized;         /* vq: likewise for values */
    size_t k_codes, k_params; /* packed key codes; their fp16 scales + zeros */
    size_t v_codes, v_params;
    size_t window;           /* (T - kq + T - vq) d rows of residual_dtype */
    size_t total;            /* the sum of the five */
} kvs_kivi_bytes;

/* The store's bytes now. */
kvs_kivi_bytes kvs_kivi_stats(const kvs_kivi_head *h);
/* The bytes a store of this config would hold after appending T tokens
 * (flushed 0) or after appending and kvs_kivi_flush (flushed 1): the
 * prediction an engine reports without building the store. */
kvs_kivi_bytes kvs_kivi_size(const kvs_kivi_config *cfg, int head_dim, int T, int flushed);

#ifdef __cplusplus
}
#endif
#endif /* KVS_KIVI_H */
