/*
 * engine_private.h -- declarations shared by the files of backend/model/
 * (model.c, tokenizer.c, session.c, forward.c, pool.c). Not part of the
 * public API; the HTTP server and the CLI use kvs_backend.h only.
 */
#ifndef KVS_ENGINE_PRIVATE_H
#define KVS_ENGINE_PRIVATE_H

#include <pthread.h>
#include <stdint.h>

#include "kvs_backend.h"

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

/* ---- W_o views for methods that need them (wo_views.c) -------------------------- */
/* layers[i].wo = fp32 W_o of model layer map[i], i < n; *buf owns the floats
 * (free it after the compression). */
kvs_status kvs_model_wo_views(const kvs_model *m, kvs_layer *layers, const int *map, int n, float **buf,
                              kvs_err *err);

/* ---- tokenizer (tokenizer.c) --------------------------------------------------- */
kvs_status kvs_tokenizer_load(kvs_model *m, kvs_err *err);
void kvs_tokenizer_free(kvs_tokenizer *t);

#endif
