/*
 * kvsieve_abi.h -- the stable C ABI of libkvsieve.so. This header is its
 * manual and the only header a caller needs (no other kvsieve header, no
 * kvsieve struct crosses it).
 *
 * What it is: the compression step of kvsieve behind a small, versioned C
 * interface for callers in other languages and processes (the Python
 * binding in python/kvsieve, a transformers adapter): hand over a prompt's
 * per-layer K / V (and optional query) tensors of host or CUDA memory with
 * whatever strides they have, get a plan (per-layer budgets, per-head kept
 * indices, merge rule), read it out, or let the library apply it (gather +
 * merge into caller-provided output tensors). Every method of the registry
 * is reachable by name, with its parameters as name / value strings.
 * What it is not: no model, no file I/O, no cache ownership (the library
 * borrows the caller's tensors), no CPU fallback for CUDA tensors.
 *
 * ---- Versioning -----------------------------------------------------------
 * kvs_abi_version() gives major.minor.patch of the library at run time;
 * KVS_ABI_VERSION_* are the values this header was written for. The
 * library's SONAME is libkvsieve.so.<major>. Within one major version:
 * functions are only added, enum values only added, and structs only grow
 * at their end. Every struct that crosses the ABI starts with
 * `uint32_t struct_size`, which the caller sets to sizeof(the struct) as it
 * was compiled (KVS_ABI_INIT does it in C, zeroing the rest; in C++
 * value-initialise the struct and set struct_size):
 *   - input structs: the library reads min(struct_size, its own size) bytes;
 *     fields the caller's (older) struct lacks take their zero value, and
 *     every field added later is designed so that zero means "as before".
 *   - output structs: the library writes min(struct_size, its own size)
 *     bytes and leaves struct_size as the caller set it.
 *   A struct_size smaller than the 1.0 struct (input or output) is
 *   KVS_ABI_ERR_INVALID naming the struct.
 *
 * ---- Errors ---------------------------------------------------------------
 * Every fallible call returns a kvs_abi_status (0 = KVS_ABI_OK; the codes
 * are kvsieve's kvs_status numbers). There is no global mutable state and
 * no thread-local: the message of a call that takes a context is stored in
 * that context (kvs_abi_last_error(ctx); "" after a success). The few calls
 * without a context take an explicit caller buffer `char *err, size_t
 * err_cap` (may be NULL / 0; the message is truncated to fit, always
 * NUL-terminated). Messages name the layer, the tensor (k, v, q,
 * modality, k_out, ...), the field (dtype, shape[i], strides[i], device)
 * and the values concerned, e.g.
 *   "layer 3: v: shape [2][63][64] differs from k's [2][64][64]".
 *
 * ---- Threads --------------------------------------------------------------
 * A context (and the plans it made) is used by one thread at a time;
 * distinct contexts are independent and may run concurrently. The work of
 * one call may use kvs_abi_ctx_opts.threads worker threads internally.
 *
 * ---- Tensors --------------------------------------------------------------
 * A kvs_abi_tensor describes memory the caller owns: data points at element
 * [0][0]...[0] (torch's data_ptr(), storage offset included), shape and
 * strides are in ELEMENTS (torch's stride(); numpy's byte strides divided by
 * the item size). Shapes accepted:
 *   K, V   [Hkv][N][d] or [1][Hkv][N][d]     F32 | F16 | BF16
 *   Q      [Hq][Nq][d] or [1][Hq][Nq][d]     F32 | F16 | BF16, optional:
 *          the queries of the LAST Nq prompt positions (row i at position
 *          N - Nq + i), post-RoPE like K; Hq a multiple of Hkv
 *   modality [N] or [1][N]                   U8 (torch.bool or uint8), HOST;
 *          0 text, 1 image, 2 video, 3 audio
 * (transformers' cache tensors [B=1][Hkv][N][d] are passed as they are;
 * a [1][N][Hkv][d] layout is passed as its transposed view, no copy.)
 * K / V / Q are read in place whenever the channel (last) stride is 1 and
 * the head and token strides are at least d (any order of heads and
 * tokens, any padding; the stride of a dimension of size 1 is ignored).
 * Other host tensors (channel stride != 1, a head or token stride below d,
 * zero or negative, e.g. an expand()ed or flipped view) are
 * copied once to a contiguous [H][N][d] buffer of the same dtype owned by
 * the context; kvs_abi_stats counts those copies and their bytes, so an
 * adapter can report them. A CUDA tensor that would need a copy is
 * refused (KVS_ABI_ERR_UNSUPPORTED, naming the stride; pass .contiguous()).
 * Every K, V, Q of one cache must be on the same device (host, or one CUDA
 * device index). Dimensions must fit in int32. CUDA work runs on the
 * tensors' device (the context keeps one workspace there, sized for the
 * largest cache seen, and made again when a larger one comes); the calling
 * thread's current CUDA device is restored before each call returns.
 *
 * ---- Lifetimes ------------------------------------------------------------
 * The context BORROWS the tensors given to kvs_abi_cache_layer: they must
 * stay valid and unchanged until the next kvs_abi_cache_begin, the layer is
 * set again, or the context is freed. A plan owns its indices; it stays
 * readable after the cache changes, but kvs_abi_apply and
 * kvs_abi_plan_merge_map need the cache it was made from (checked: after a
 * kvs_abi_cache_begin, or when a layer set again has another shape, they
 * fail naming the plan; a layer set again with other tensors of the same
 * shape is read as it is now). The modality mask is copied at
 * kvs_abi_cache_modality. Plans must be freed
 * (kvs_abi_plan_free) before or after their context, in any order.
 *
 * ---- A typical adapter ----------------------------------------------------
 *   kvs_abi_ctx_new(&opts, &ctx, err, sizeof err);
 *   kvs_abi_cache_begin(ctx, L);
 *   for l: kvs_abi_cache_layer(ctx, l, &k[l], &v[l], q ? &q[l] : NULL);
 *   kvs_abi_cache_modality(ctx, &mask);                 (optional)
 *   for each variant:
 *     kvs_abi_compress(ctx, &spec, &budget, &plan);
 *     kvs_abi_plan_indices(ctx, plan, l, &idx_out) and gather itself, or
 *     kvs_abi_apply(ctx, plan, l, &k_out, &v_out)    (merging methods)
 *     kvs_abi_plan_free(plan);
 *   kvs_abi_ctx_free(ctx);
 */
#ifndef KVSIEVE_ABI_H
#define KVSIEVE_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVS_ABI_BUILDING) && defined(__GNUC__)
#define KVS_ABI_API __attribute__((visibility("default")))
#else
#define KVS_ABI_API
#endif

#define KVS_ABI_VERSION_MAJOR 1
#define KVS_ABI_VERSION_MINOR 0
#define KVS_ABI_VERSION_PATCH 0

/* An initialiser that zeroes a struct and sets its struct_size:
 *   kvs_abi_tensor t = KVS_ABI_INIT(kvs_abi_tensor); */
#define KVS_ABI_INIT(type) {.struct_size = (uint32_t)sizeof(type)}

/* ---- status codes (the numbers of kvsieve's kvs_status) ------------------- */

typedef int32_t kvs_abi_status;
enum {
    KVS_ABI_OK = 0,
    KVS_ABI_ERR_INVALID = 1,     /* bad argument, dtype, shape, stride, parameter, budget */
    KVS_ABI_ERR_NOMEM = 2,       /* allocation failed */
    KVS_ABI_ERR_IO = 3,          /* (not returned by this ABI today) */
    KVS_ABI_ERR_FORMAT = 4,      /* (not returned by this ABI today) */
    KVS_ABI_ERR_NUMERIC = 5,     /* NaN or Inf in K, V or Q (names layer, head, token) */
    KVS_ABI_ERR_UNSUPPORTED = 6, /* valid request this build or device cannot do
                                    ("built without CUDA", a CUDA tensor needing a copy) */
    KVS_ABI_ERR_NOTFOUND = 7,    /* unknown method or parameter name (with a suggestion) */
    KVS_ABI_ERR_INTERNAL = 8     /* a bug: an invariant did not hold */
};

/* ---- small POD types -------------------------------------------------------- */

enum { KVS_ABI_F32 = 0, KVS_ABI_F16 = 1, KVS_ABI_BF16 = 2, KVS_ABI_U8 = 3, KVS_ABI_I32 = 4,
       KVS_ABI_I64 = 5 };
enum { KVS_ABI_HOST = 0, KVS_ABI_CUDA = 1 };
/* Merge rule of a plan (see kvs_abi_apply): evicted tokens are folded into
 * their most cosine-similar kept key's row, K and V, with this formula. */
enum { KVS_ABI_MERGE_NONE = 0, KVS_ABI_MERGE_PIVOTAL = 1, KVS_ABI_MERGE_AVERAGE = 2,
       KVS_ABI_MERGE_WEIGHTED = 3 };

#define KVS_ABI_MAX_DIMS 8

typedef struct {
    uint32_t struct_size; /* sizeof(kvs_abi_tensor) */
    int32_t dtype;        /* KVS_ABI_F32 ... KVS_ABI_I64 */
    int32_t device;       /* KVS_ABI_HOST or KVS_ABI_CUDA */
    int32_t device_index; /* CUDA device ordinal (0 for host) */
    void *data;           /* element [0]...[0]; const for inputs */
    int32_t ndim;         /* 1 .. KVS_ABI_MAX_DIMS */
    int32_t reserved;     /* 0 */
    int64_t shape[KVS_ABI_MAX_DIMS];
    int64_t strides[KVS_ABI_MAX_DIMS]; /* in elements */
} kvs_abi_tensor;

/* A method and its parameters by name, values as text ("0.2", "true",
 * "max"); parameters not named keep their defaults (kvs_abi_methods_json
 * lists them). */
typedef struct {
    uint32_t struct_size;
    const char *method;              /* "flashcache", "snapkv", ... or a composition's JSON text
                                        ('{"score":"snapkv",...}', docs/methods.md) */
    int32_t n_params;
    const char *const *param_names;  /* [n_params] */
    const char *const *param_values; /* [n_params] */
} kvs_abi_method_spec;

/* Exactly one of ratio (in (0, 1]) or tokens (>= 1) is set, the other 0.
 * Per layer floor(ratio * N) (or tokens) clamped to [1, N] tokens per KV head
 * on average; methods with dynamic budgets re-distribute across layers with
 * the total exact (L times that). */
typedef struct {
    uint32_t struct_size;
    double ratio;
    int64_t tokens;
} kvs_abi_budget;

typedef struct {
    uint32_t struct_size;
    int32_t threads; /* worker threads for compress / apply; < 1 means 1 */
} kvs_abi_ctx_opts;

typedef struct {
    uint32_t struct_size;
    int32_t n_layers, n_kv_heads, n_tokens; /* L, Hkv, N of the cache */
    int32_t merge;                          /* KVS_ABI_MERGE_* */
    int32_t device;                         /* where it was computed: KVS_ABI_HOST / CUDA */
    int32_t key_channels;                   /* d when the plan prunes key channels per head (ThinK;
                                               kvs_abi_apply stores them as zeros: gather through it),
                                               else 0 (was reserved, always 0) */
    int64_t total_kept;                     /* sum over layers of the budgets */
    double compress_ms;                     /* wall time of the compress call */
    char method[32];
    char merge_name[16];                    /* "none", "pivotal", "average", "weighted" */
    char note[256];                         /* the method's remark, e.g. about modality */
} kvs_abi_plan_info;

typedef struct {
    uint32_t struct_size;
    int32_t reserved;
    int64_t tensors_fed;   /* K, V, Q tensors given to kvs_abi_cache_layer so far */
    int64_t tensors_copied; /* of those, copied to a contiguous layout (see Tensors) */
    int64_t bytes_copied;  /* bytes of those copies */
    int64_t compress_calls, apply_calls;
    double compress_ms, apply_ms; /* wall time summed over the calls */
} kvs_abi_stats;

typedef struct kvs_abi_ctx kvs_abi_ctx;
typedef struct kvs_abi_plan kvs_abi_plan;

/* ---- library facts (no context) --------------------------------------------- */

/* Version of the loaded library. Any argument may be NULL. */
KVS_ABI_API void kvs_abi_version(int32_t *major, int32_t *minor, int32_t *patch);
/* "1.0.0 (kvsieve 0.1.0; cuda: yes|no)": a constant string. */
KVS_ABI_API const char *kvs_abi_build_info(void);
/* "ok", "invalid", ... for a status code; "unknown" otherwise. */
KVS_ABI_API const char *kvs_abi_status_name(kvs_abi_status s);
/* Number of usable CUDA devices. KVS_ABI_ERR_UNSUPPORTED "built without
 * CUDA" or "no CUDA device: ..." with *count = 0 when there is none. */
KVS_ABI_API kvs_abi_status kvs_abi_cuda_devices(int32_t *count, char *err, size_t err_cap);

/* Every registered method as a JSON array, in registry order:
 *   [{"name": "snapkv", "summary": "...", "needs": ["q_window"],
 *     "keeps_all": false, "params": [{"name": "window", "type": "int",
 *     "default": "32", "min": 1, "max": 2147483647, "choices": null,
 *     "help": "..."}, ...]}, ...]
 * needs: any of "q_window" (queries of the last w positions), "q_all"
 * (queries of every position), "modality", "w_o" (each layer's output
 * projection: a context has none, so such a method is refused with a
 * message naming W_o), "recon" (KVzip's context-reconstruction statistic,
 * an extra forward pass of the model: a context has none, so such a method
 * is refused with a message naming it). type: int|float|bool|enum
 * (choices "max|avg" for enum; min / max for int and float).
 * Size query: with buf == NULL (or cap == 0) returns KVS_ABI_OK and sets *len
 * to the bytes needed including the NUL; with a buffer smaller than that
 * returns KVS_ABI_ERR_INVALID and sets *len. */
KVS_ABI_API kvs_abi_status kvs_abi_methods_json(char *buf, size_t cap, size_t *len, char *err,
                                                size_t err_cap);
/* How many query rows (the last ones of the prompt) the method reads with
 * these parameters for a prompt of n_tokens: 0 when it reads none (full,
 * random, streamingllm, flashcache), the window for snapkv, n_tokens for
 * h2o / lookm / meda. An adapter records that many queries per layer.
 * Validates the method and parameters (errors as kvs_abi_compress). */
KVS_ABI_API kvs_abi_status kvs_abi_queries_wanted(const kvs_abi_method_spec *spec, int64_t n_tokens,
                                                  int64_t *out, char *err, size_t err_cap);

/* ---- contexts --------------------------------------------------------------- */

/* opts may be NULL (defaults: 1 thread). */
KVS_ABI_API kvs_abi_status kvs_abi_ctx_new(const kvs_abi_ctx_opts *opts, kvs_abi_ctx **out, char *err,
                                           size_t err_cap);
KVS_ABI_API void kvs_abi_ctx_free(kvs_abi_ctx *ctx); /* NULL is fine; borrowed tensors untouched */
/* Message of the last failed call on ctx, "" after a successful one. Valid
 * until the next call on ctx. ctx NULL: a constant "no context". */
KVS_ABI_API const char *kvs_abi_last_error(const kvs_abi_ctx *ctx);
KVS_ABI_API kvs_abi_status kvs_abi_ctx_stats(kvs_abi_ctx *ctx, kvs_abi_stats *out);

/* ---- the cache --------------------------------------------------------------- */

/* Start a new cache of n_layers >= 1 layers: forgets the previous one (and
 * its copies); plans made earlier can no longer be applied. */
KVS_ABI_API kvs_abi_status kvs_abi_cache_begin(kvs_abi_ctx *ctx, int32_t n_layers);
/* Set layer `layer` (0 .. n_layers-1, any order, again to replace): k and v
 * required, q may be NULL. Checks each tensor on its own and against the
 * layer's others (dtype, ndim, batch 1, shape, strides, device); the checks
 * across layers (equal N, Hkv, d, Nq; one device) and the NaN / Inf scan
 * happen at kvs_abi_compress. On error the layer is left unset. */
KVS_ABI_API kvs_abi_status kvs_abi_cache_layer(kvs_abi_ctx *ctx, int32_t layer, const kvs_abi_tensor *k,
                                               const kvs_abi_tensor *v, const kvs_abi_tensor *q);
/* The modality mask [N] (host U8, values 0..3), copied into the context;
 * NULL clears it (all text). Its length is checked against N at compress. */
KVS_ABI_API kvs_abi_status kvs_abi_cache_modality(kvs_abi_ctx *ctx, const kvs_abi_tensor *modality);

/* ---- compression ------------------------------------------------------------- */

/* Run the method on the cache: host caches on the CPU (the same code and
 * plan as `kvsieve compress`), CUDA caches with the CUDA kernels (the same
 * plan up to exact fp32 score ties). Errors: a layer never set, shapes that
 * disagree across layers, a method's missing inputs ("needs the queries of
 * ..."), unknown method / parameter, bad budget, NaN / Inf (naming layer,
 * head, token). *out is NULL on error. */
KVS_ABI_API kvs_abi_status kvs_abi_compress(kvs_abi_ctx *ctx, const kvs_abi_method_spec *spec,
                                            const kvs_abi_budget *budget, kvs_abi_plan **out);
KVS_ABI_API void kvs_abi_plan_free(kvs_abi_plan *plan); /* NULL is fine */

/* The plan accessors take the context the plan was made by (for the error
 * message; another context is KVS_ABI_ERR_INVALID). */
KVS_ABI_API kvs_abi_status kvs_abi_plan_get_info(kvs_abi_ctx *ctx, const kvs_abi_plan *plan,
                                                 kvs_abi_plan_info *out);
/* Per-layer budgets B_l (tokens kept per KV head) into out[0 .. L); cap is
 * the number of int32 out holds (>= L). */
KVS_ABI_API kvs_abi_status kvs_abi_plan_budgets(kvs_abi_ctx *ctx, const kvs_abi_plan *plan, int32_t *out,
                                                int64_t cap);
/* Kept token indices of layer `layer`, every head's row sorted ascending
 * and unique, into `out`: shape [Hkv][B_l] or [1][Hkv][B_l], dtype I32 or
 * I64 (torch's index dtype), host with any strides, or CUDA contiguous
 * (copied host to device, synchronously). */
KVS_ABI_API kvs_abi_status kvs_abi_plan_indices(kvs_abi_ctx *ctx, const kvs_abi_plan *plan,
                                                int32_t layer, const kvs_abi_tensor *out);
/* Ragged plans (head-adaptive methods such as adakv): the KV heads of a
 * layer may keep different counts (their sum is Hkv * B_l, so budgets mean
 * the same as for other plans). kvs_abi_plan_head_counts writes the Hkv
 * counts of layer `layer` into out[0 .. Hkv) (cap >= Hkv; every count is
 * B_l for a dense layer). kvs_abi_plan_indices and kvs_abi_apply refuse a
 * ragged layer (KVS_ABI_ERR_UNSUPPORTED naming these functions); read it
 * head by head: kvs_abi_plan_head_indices writes head `head`'s kept tokens
 * (ascending) into `out` ([count] I32 or I64, host, any stride). */
KVS_ABI_API kvs_abi_status kvs_abi_plan_head_counts(kvs_abi_ctx *ctx, const kvs_abi_plan *plan, int32_t layer,
                                                    int32_t *out, int64_t cap);
KVS_ABI_API kvs_abi_status kvs_abi_plan_head_indices(kvs_abi_ctx *ctx, const kvs_abi_plan *plan,
                                                     int32_t layer, int32_t head, const kvs_abi_tensor *out);
/* The merge map of (layer, head) into `out` ([N] I32, host, any stride):
 * for a kept token -1; for an evicted token the slot in [0, B_l) of the
 * kept token it is merged into (its most cosine-similar kept key, ties to
 * the lower slot) when the plan merges, -2 (dropped) when it does not.
 * Needs the plan's cache (host or CUDA). */
KVS_ABI_API kvs_abi_status kvs_abi_plan_merge_map(kvs_abi_ctx *ctx, const kvs_abi_plan *plan,
                                                  int32_t layer, int32_t head, const kvs_abi_tensor *out);
/* The plan as the JSON `kvsieve compress --plan` writes (same text for the
 * same plan): {"method", "params", "n_tokens", "merge", "layers": [{"budget",
 * "heads": [[...], ...]}, ...]}; a ragged layer adds "counts": [...]. Size query and short buffer as
 * kvs_abi_methods_json. */
KVS_ABI_API kvs_abi_status kvs_abi_plan_json(kvs_abi_ctx *ctx, const kvs_abi_plan *plan, char *buf,
                                             size_t cap, size_t *len);

/* ---- apply ------------------------------------------------------------------ */

/* Compact (and, for a merging plan, merge) layer `layer` of the plan's
 * cache into k_out / v_out, shape [Hkv][B_l][d] or [1][Hkv][B_l][d]: row b
 * of head h is token idx[h][b]'s K / V, merged rows as the plan's formula
 * (the result of kvsieve's kvs_apply, computed in fp32).
 *   host cache: outputs host, dtype F32, F16 or BF16 (usually the input's;
 *     values converted round-to-nearest-even; a plain gather in the input
 *     dtype is therefore exact, and done as row copies when the output's
 *     channel stride is 1), any strides (the outputs must not overlap).
 *   CUDA cache: outputs on the cache's CUDA device, F32, contiguous (the
 *     device kernels write fp32; cast with torch afterwards); synchronous.
 *     In a build without CUDA a CUDA cache cannot be fed (the error says
 *     "built without CUDA"). */
KVS_ABI_API kvs_abi_status kvs_abi_apply(kvs_abi_ctx *ctx, const kvs_abi_plan *plan, int32_t layer,
                                         const kvs_abi_tensor *k_out, const kvs_abi_tensor *v_out);
/* kvs_abi_apply for one KV head of any plan (ragged or not): k_out / v_out
 * [count][d] (or [1][count][d]), host, F32 / F16 / BF16, any strides; rows
 * as kvs_abi_apply's row b of that head. Host caches only. */
KVS_ABI_API kvs_abi_status kvs_abi_apply_head(kvs_abi_ctx *ctx, const kvs_abi_plan *plan, int32_t layer,
                                              int32_t head, const kvs_abi_tensor *k_out,
                                              const kvs_abi_tensor *v_out);

#ifdef __cplusplus
}
#endif
#endif /* KVSIEVE_ABI_H */
