/*
 * kvsieve.h -- the compression contract. This header is the manual of core/.
 *
 * What core/ is: the data types every KV-compression method speaks (cache views,
 * budgets, parameters, plans), the method contract (observe / select, shared
 * apply), numeric helpers shared by several methods (attention statistics in
 * O(N) memory, top-k, pooling, fp16/bf16 conversion), and timers.
 * What core/ is not: it does no file or network I/O, knows no method by name,
 * and has no model. Files live in formats/, methods in methods/.
 *
 * Conventions (see ../docs/design.md and the spec's methods.md):
 *   - Every fallible function returns kvs_status and, when it fails, writes a
 *     human-readable message into a caller-owned kvs_err (may be NULL). The
 *     message names the layer / head / field concerned.
 *   - Shapes are written [outer][...][inner]; a layer's K and V are
 *     [Hkv][N][d], queries [Hq][Nq][d] (the last Nq prompt positions).
 *   - Token indices are int32; index lists are sorted ascending and unique.
 *   - No global mutable state. Nothing here allocates an N x N buffer.
 */
#ifndef KVSIEVE_H
#define KVSIEVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_VERSION "0.1.0"

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum {
    KVS_OK = 0,
    KVS_ERR_INVALID = 1,     /* bad argument, shape, parameter or budget */
    KVS_ERR_NOMEM = 2,       /* allocation failed */
    KVS_ERR_IO = 3,          /* file could not be read or written */
    KVS_ERR_FORMAT = 4,      /* file is truncated or malformed */
    KVS_ERR_NUMERIC = 5,     /* NaN or Inf in the input */
    KVS_ERR_UNSUPPORTED = 6, /* valid request this build or device cannot do */
    KVS_ERR_NOTFOUND = 7,    /* unknown method, tensor, parameter name */
    KVS_ERR_INTERNAL = 8     /* a bug: an invariant did not hold */
} kvs_status;

typedef struct {
    kvs_status code;
    char msg[512];
} kvs_err;

/* Fill err (if non-NULL) with code and a printf-style message; returns code.
 * If err already holds a message, the new one is prefixed to it, separated by
 * ": ", so callers can add context ("layer 3: head 1: NaN in K"). */
kvs_status kvs_errorf(kvs_err *err, kvs_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Add context in front of an existing message; returns err->code. */
kvs_status kvs_err_prefix(kvs_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void kvs_err_clear(kvs_err *err);
const char *kvs_status_name(kvs_status s);

/* ------------------------------------------------------------------------ */
/* Element types and conversions                                             */
/* ------------------------------------------------------------------------ */

typedef enum { KVS_F32 = 0, KVS_F16 = 1, KVS_BF16 = 2, KVS_U8 = 3, KVS_I32 = 4 } kvs_dtype;

size_t kvs_dtype_size(kvs_dtype t);
const char *kvs_dtype_name(kvs_dtype t); /* "F32", "F16", "BF16", "U8", "I32" */

float kvs_f16_to_f32(uint16_t h);
uint16_t kvs_f32_to_f16(float f);  /* round to nearest even; overflow -> inf */
float kvs_bf16_to_f32(uint16_t h);
uint16_t kvs_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* ------------------------------------------------------------------------ */
/* Views: a read-only window on a [H][N][d] block of host memory             */
/* ------------------------------------------------------------------------ */

typedef enum { KVS_HOST = 0, KVS_CUDA = 1 } kvs_device;

/* Element (h, n, c) lives at data + (h*s_head + n*s_tok + c) * dtype_size.
 * Channel stride is 1. A contiguous [H][N][d] block has s_tok = d,
 * s_head = N*d. Views do not own memory. */
typedef struct {
    const void *data;
    kvs_dtype dtype; /* KVS_F32, KVS_F16 or KVS_BF16 */
    kvs_device device;
    int n_heads;  /* H */
    int n_tokens; /* N */
    int head_dim; /* d */
    int64_t s_head, s_tok; /* strides in elements */
} kvs_view;

/* A contiguous [H][N][d] view. */
kvs_view kvs_view_make(const void *data, kvs_dtype t, int H, int N, int d);

/* Convert rows [n0, n0+count) of head h to fp32: dst is [count][d]. */
void kvs_view_rows_f32(const kvs_view *v, int h, int n0, int count, float *dst);
/* Rows idx[0..n) of head h (ascending) to fp32: dst is [n][d]; runs of
 * consecutive indices are converted in one call. */
void kvs_view_gather_f32(const kvs_view *v, int h, const int32_t *idx, int n, float *dst);

/* Returns KVS_ERR_NUMERIC naming "<what> head h token n channel c" at the first
 * NaN or Inf, else KVS_OK. */
kvs_status kvs_view_check_finite(const kvs_view *v, const char *what, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* One prompt's cache, as methods see it                                     */
/* ------------------------------------------------------------------------ */

enum { KVS_MOD_TEXT = 0, KVS_MOD_IMAGE = 1, KVS_MOD_VIDEO = 2, KVS_MOD_AUDIO = 3 };

/* Entropies of the head-averaged causal attention Abar = mean_h A_h:
 *   plain:   mean over rows of H(Abar[i][:])
 *   xmodal:  E_TV = mean over text-query rows of the entropy of Abar[i][j]
 *            restricted to image keys j <= p_i and re-normalised; E_VT the
 *            same for image-query rows over text keys. Rows with no eligible
 *            key are skipped; *n_tv, *n_vt count the rows used. */
typedef struct {
    double plain;
    double e_tv, e_vt;
    int64_t n_tv, n_vt;
} kvs_entropy_stats;

/* One layer of one prompt. q.data may be NULL (no queries recorded); q holds
 * the queries of the LAST q.n_tokens prompt positions: query row i sits at
 * position N - Nq + i and may attend keys 0 .. N - Nq + i (causal). */
typedef struct {
    kvs_view k; /* [Hkv][N][d], post-RoPE */
    kvs_view v; /* [Hkv][N][d] */
    kvs_view q; /* [Hq][Nq][d], post-RoPE; data NULL when absent */
    /* The layer's output projection W_o as [Hq][E][d]: head i's slice maps
     * its attention output (d) to the hidden state (E rows; n_tokens holds
     * E). Data NULL when absent; only methods that declare KVS_NEED_W_O
     * read it (an HF o_proj.weight [E][Hq*d] is the view s_head = d,
     * s_tok = Hq*d, no copy). */
    kvs_view wo;
    /* Optional attention statistics a producer already has (the engine
     * accumulates them during prefill), NULL when absent; a consumer then
     * computes them itself from q and k (kvs_layer_attn_stats). Contract:
     * the queries are ALL N prompt positions (query i at position i, keys
     * j <= i: causal, no window), logits q_i . k_j / sqrt(d), softmax per
     * query row over its visible keys, i.e. exactly what the functions
     * below compute from Nq = N recorded queries; only the summation order
     * may differ (fp32 rounding). Valid only for the uncompressed prompt
     * cache the view shows: a producer drops them once the cache changes.
     * attn_colsum [Hkv][N]: colsum of kvs_attn_colsum (GQA mean over the G
     * query heads of each KV head of sum_i A_h[i][j]): H2O's score.
     * attn_ent: kvs_attn_entropies over those N queries with the view's
     * modality (all text when the view's modality is NULL). */
    const float *attn_colsum;
    const kvs_entropy_stats *attn_ent;
    /* The context-reconstruction statistic (KVzip, KVS_NEED_RECON), NULL
     * when absent; no consumer can compute it from the view (it needs the
     * model). After the N-token prompt the producer feeds the model a
     * reconstruction input on top of the uncompressed prompt cache: an
     * instruction ("Repeat the previous context exactly.") followed by the
     * prompt's own tokens, teacher-forced, in chunks (each chunk of the
     * prompt repeated after its instruction; the pass's rows are dropped
     * afterwards). attn_recon_max [Hkv][N]: for key j, the maximum over
     * the reconstruction rows of j's chunk and over the G query heads of
     * KV head g of the model's attention probability on j (each row's
     * softmax over every key it sees: the prompt and the pass's rows before
     * it), in [0, 1]. Valid only for the uncompressed prompt cache. */
    const float *attn_recon_max;
} kvs_layer;

/* A whole prompt: L layers with equal N, Hkv, d; optional modality [N]. */
typedef struct {
    int n_layers;
    kvs_layer *layers;       /* [L] */
    const uint8_t *modality; /* [N] KVS_MOD_*, or NULL (all text) */
} kvs_cache_view;

/* Shape facts every method is told at create time. */
typedef struct {
    int n_layers, n_tokens, n_kv_heads, n_q_heads, head_dim;
    int n_queries; /* Nq recorded per layer (0 if none) */
    int threads;   /* execution hint: worker threads a method may use (>= 1) */
} kvs_shape;

/* Checks that all layers agree (N, Hkv, d; Hq multiple of Hkv; Nq <= N),
 * N > 0, and K/V/Q finite. Fills *shape. Messages name the layer. */
kvs_status kvs_cache_validate(const kvs_cache_view *c, kvs_shape *shape, kvs_err *err);
/* The two halves of kvs_cache_validate, for callers that read only part of
 * the values (kvs_compress scans only the query rows the method reads):
 * kvs_cache_check_shape applies every shape rule and reads no K/V/Q value;
 * kvs_cache_check_finite scans every host K and V and the LAST q_rows query
 * rows of each layer (0: none; capped at Nq) for NaN/Inf on `threads`
 * threads. Its error names the first bad value in (layer, K|V|Q, head, token,
 * channel) order, whatever the thread count. CUDA views are skipped (their
 * scan is the device path's job). */
kvs_status kvs_cache_check_shape(const kvs_cache_view *c, kvs_shape *shape, kvs_err *err);
kvs_status kvs_cache_check_finite(const kvs_cache_view *c, int q_rows, int threads, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Owned dense cache (what formats/ loads and apply writes)                  */
/* ------------------------------------------------------------------------ */

/* Owned fp32 storage for one layer; budgets may differ across layers.
 * k, v are [Hkv][n_tokens][d]; q is [Hq][n_queries][d] or NULL. cap is the
 * number of floats allocated in k and in v each (kvs_apply_into reuses
 * buffers that are large enough); 0 means exactly Hkv * n_tokens * d.
 * Ragged layers (the result of a ragged plan): counts [Hkv] is non-NULL,
 * head h holds counts[h] rows and the heads are packed one after the other
 * (head h starts at row sum_{g<h} counts[g]); sum counts = Hkv * n_tokens,
 * so n_tokens is the mean rows per head. kvs_dense_head finds a head. */
typedef struct {
    int n_tokens, n_kv_heads, head_dim;
    float *k, *v;
    int64_t cap;
    int n_q_heads, n_queries;
    float *q;
    int32_t *counts; /* [Hkv] rows per head, or NULL: every head has n_tokens */
} kvs_dense_layer;

/* Row offset of head h in a dense layer (ragged or not) and its row count. */
int64_t kvs_dense_head(const kvs_dense_layer *dl, int h, int *rows);

typedef struct {
    int n_layers;
    kvs_dense_layer *layers; /* [L] */
    int n_tokens;            /* prompt length before compression */
    uint8_t *modality;       /* [n_tokens] or NULL */
} kvs_dense_cache;

void kvs_dense_cache_free(kvs_dense_cache *c);
/* A view on a dense cache with equal N in every layer (i.e. uncompressed). */
kvs_status kvs_dense_cache_view(const kvs_dense_cache *c, kvs_cache_view *out,
                                kvs_layer *layers_storage /* [L] */, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Budgets                                                                   */
/* ------------------------------------------------------------------------ */

/* Exactly one of ratio (in (0, 1]) or tokens (>= 1) is set; the other is 0. */
typedef struct {
    double ratio;
    int64_t tokens;
} kvs_budget;

/* Validates the budget; *per_layer = floor(ratio*N) (or tokens), clamped to
 * [1, N]. Errors: ratio <= 0 or > 1, NaN, tokens < 1, both or none set. */
kvs_status kvs_budget_per_layer(const kvs_budget *b, int N, int *per_layer, kvs_err *err);

/* Default minimum per layer: max(1, ceil(0.01 * N)). */
int kvs_budget_min(int N);

/* Split `total` tokens over L layers proportionally to weights[l] >= 0:
 * largest-remainder rounding (ties to the lower layer index), each layer
 * clamped to [bmin, bmax]; what a clamp frees or costs is re-distributed
 * (water-filling) over the unclamped layers until sum(out) == total exactly.
 * All-zero weights mean equal shares. Requires L*bmin <= total <= L*bmax.
 * out is [L]. */
kvs_status kvs_budget_allocate(const double *weights, int L, int64_t total, int bmin, int bmax,
                               int *out, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Parameters: declared once per method, validated everywhere                */
/* ------------------------------------------------------------------------ */

typedef enum { KVS_PARAM_INT, KVS_PARAM_FLOAT, KVS_PARAM_BOOL, KVS_PARAM_ENUM } kvs_param_type;

#define KVS_MAX_PARAMS 16

typedef struct {
    const char *name;
    kvs_param_type type;
    double def;          /* default; for ENUM the index into choices */
    double min, max;     /* inclusive range for INT / FLOAT */
    const char *choices; /* ENUM only: "max|avg" */
    const char *help;
} kvs_param_def;

/* Values in declaration order; ENUM and BOOL are stored as 0/1/2... */
typedef struct {
    int n;
    double v[KVS_MAX_PARAMS];
} kvs_params;

/* ------------------------------------------------------------------------ */
/* Plans                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum {
    KVS_MERGE_NONE = 0,
    KVS_MERGE_PIVOTAL = 1,  /* k_c <- (k_c + sum_e (k_e + k_c)/2) / (n+1) */
    KVS_MERGE_AVERAGE = 2,  /* k_c <- (k_c + sum_e k_e) / (n+1) */
    KVS_MERGE_WEIGHTED = 3  /* k_c <- (k_c + sum_e cos(k_e,k_c) k_e) / (n+1) */
} kvs_merge;

const char *kvs_merge_name(kvs_merge m); /* "none", "pivotal", ... */

/* Per layer: the layer keeps Hkv * budget (token, head) rows in all.
 * Dense layer (counts NULL): each of the Hkv heads keeps budget tokens; idx
 * is [Hkv][budget]. Ragged layer (counts non-NULL, [Hkv]): head h keeps
 * counts[h] tokens in [1, N], sum_h counts[h] = Hkv * budget (so budget is
 * the mean per head and every budget sum means the same as for dense
 * plans); idx holds the heads' rows one after the other (head h starts at
 * sum_{g<h} counts[g]). Each row is sorted ascending and unique, values in
 * [0, N). A dense plan is a ragged plan with equal counts and costs nothing
 * extra; kvs_plan_head finds a head's row either way. */
typedef struct {
    int budget;
    int32_t *idx;
    int32_t *counts; /* [Hkv] or NULL (dense) */
} kvs_plan_layer;

typedef struct {
    char method[32];
    int n_layers, n_kv_heads, n_tokens;
    kvs_plan_layer *layers; /* [L] */
    kvs_merge merge;        /* evicted tokens merged into kept ones at apply */
    char note[256];         /* free text the method wants reported, e.g.
                               "meda: single modality, plain entropy used" */
    /* Key channels kept per (layer, KV head) (ThinK, methods/parts/
     * chan_think.c): kchan [L][Hkv][kchan_dim], 1 = kept, 0 = pruned; NULL:
     * every channel (kchan_dim 0). kvs_apply zeroes the pruned channels of
     * every kept K row (stored zero, not packed: the memory is not freed);
     * kvs_plan_kv_bytes counts the bytes a packed store would use. */
    int kchan_dim;
    uint8_t *kchan;
} kvs_plan;

/* Allocate a plan with the given per-layer budgets (idx uninitialised). */
kvs_status kvs_plan_init(kvs_plan *p, const char *method, int L, int Hkv, int N,
                         const int *budgets, kvs_err *err);
/* A ragged plan: counts is [L][Hkv] (each in [1, N]; each layer's sum a
 * multiple of Hkv, budget = sum / Hkv). Layers whose counts are all equal
 * are stored dense (counts NULL). idx uninitialised. */
kvs_status kvs_plan_init_ragged(kvs_plan *p, const char *method, int L, int Hkv, int N,
                                const int *counts, kvs_err *err);
void kvs_plan_free(kvs_plan *p);
/* Give the plan key-channel masks of d channels, all kept (kchan [L][Hkv][d]
 * set to 1); the method then clears the pruned ones. */
kvs_status kvs_plan_kchan_init(kvs_plan *p, int d, kvs_err *err);
/* Number of key channels head h of layer l keeps: its mask's ones, or d
 * when the plan has no masks. */
int kvs_plan_kchan_kept(const kvs_plan *p, int l, int h, int d);
/* Checks every invariant: counts, sums, sorted, unique, in range; key
 * channel masks of 0/1 values with at least one kept channel per head. */
kvs_status kvs_plan_check(const kvs_plan *p, kvs_err *err);
int64_t kvs_plan_total(const kvs_plan *p); /* sum of per-layer budgets */
/* Row of KV head h of layer l ([*count] indices, writable by the plan's
 * filler) and its count; O(Hkv) for ragged layers. */
int32_t *kvs_plan_head(const kvs_plan *p, int l, int h, int *count);
int kvs_plan_is_ragged(const kvs_plan *p); /* 1 if any layer has counts */
/* Bytes the kept rows take: sum over (layer, head) of kept rows x
 * (kept key channels + d) x elem_size (K and V; kept key channels = d
 * without channel masks, so 2 d). With masks this is what a packed store
 * would take: kvs_apply and the engine store the pruned channels as zeros. */
int64_t kvs_plan_kv_bytes(const kvs_plan *p, int head_dim, size_t elem_size);

/* ------------------------------------------------------------------------ */
/* The method contract                                                       */
/* ------------------------------------------------------------------------ */

enum {
    KVS_NEED_Q_WINDOW = 1u << 0, /* queries of the last w positions */
    KVS_NEED_Q_ALL = 1u << 1,    /* queries of every prompt position */
    KVS_NEED_MODALITY = 1u << 2, /* uses the modality mask (optional input) */
    KVS_KEEPS_ALL = 1u << 3,     /* property, not a need: the method ignores the
                                    budget and keeps all N tokens (`full`) */
    KVS_SELECT_ONCE = 1u << 4,   /* property: select may consume or change the
                                    state, so it runs once per create/observe;
                                    kvs_compress_many then observes once per
                                    budget (no method of this tree sets it) */
    KVS_NEED_W_O = 1u << 5,      /* each layer's output projection (kvs_layer.wo):
                                    kvs_compress refuses a view without it */
    KVS_READS_ATTN_STATS = 1u << 6, /* property: reads kvs_layer.attn_colsum /
                                    attn_ent when present (else computes them):
                                    a producer that can accumulate them should */
    KVS_NEED_RECON = 1u << 7     /* each layer's context-reconstruction statistic
                                    (kvs_layer.attn_recon_max, KVzip): only a
                                    producer with the model can make it;
                                    kvs_compress refuses a view without it */
};

typedef struct kvs_method kvs_method;

struct kvs_method {
    const char *name;    /* "flashcache" */
    const char *summary; /* one line for `kvsieve methods` */
    unsigned needs;      /* KVS_NEED_* */
    const kvs_param_def *params;
    int n_params;
    /* How many queries the method wants given its parameters (window w for
     * SnapKV, N for H2O...); NULL means none. Used by callers that record. */
    int (*queries_wanted)(const kvs_params *p, int N);

    /* Lifecycle. create sees the shape and validated parameters. */
    kvs_status (*create)(const kvs_params *p, const kvs_shape *s, void **state, kvs_err *err);
    /* Called once per layer, in order. Keep only O(N) per head. The layer's
     * memory stays valid until select returns. */
    kvs_status (*observe)(void *state, int layer, const kvs_layer *in, const uint8_t *modality,
                          kvs_err *err);
    /* After the last layer: allocate budgets (summing exactly to
     * L * per_layer) and fill the plan (kvs_plan_init is the method's job).
     * Repeatable: select must not change the state, so that calls with
     * several budgets after one observation give each the plan a fresh
     * create / observe / select would (kvs_compress_many relies on it),
     * unless the method declares KVS_SELECT_ONCE. */
    kvs_status (*select)(void *state, int per_layer, kvs_plan *out, kvs_err *err);
    void (*destroy)(void *state);
};

/* Parameter helpers. */
void kvs_params_defaults(const kvs_method *m, kvs_params *out);
/* Set by name from text ("0.2", "true", "max"); errors name the method, the
 * parameter, the allowed range or choices, and suggest a close name. */
kvs_status kvs_params_set(const kvs_method *m, kvs_params *p, const char *name, const char *value,
                          kvs_err *err);
/* Parse "name=value". */
kvs_status kvs_params_set_kv(const kvs_method *m, kvs_params *p, const char *kv, kvs_err *err);
int kvs_param_index(const kvs_method *m, const char *name); /* -1 if unknown */
double kvs_param_get(const kvs_method *m, const kvs_params *p, const char *name); /* asserts known */
/* Format a value as text ("0.2", "true", "max") into buf. */
void kvs_param_format(const kvs_param_def *d, double v, char *buf, size_t n);

/* Run a method end to end on a cache view: validate, create, observe every
 * layer, select, check the plan. The plan's sum of budgets is exactly
 * L * per_layer. */
kvs_status kvs_compress(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                        const kvs_budget *b, int threads, kvs_plan *out, kvs_err *err);

/* The same for n budgets b[0..n) at once: validate, create, observe every
 * layer ONCE, then select + check once per budget into out[0..n), destroy.
 * Each out[i] is byte for byte the plan kvs_compress gives for b[i] alone
 * (selects are repeatable, see the contract); what the budgets share (the
 * observation: attention statistics, DCT energies, ...) is computed once.
 * A method with KVS_SELECT_ONCE is run once per budget instead (its
 * declared property, not a failure). select_ms (NULL or [n]): each budget's
 * select + check time (for KVS_SELECT_ONCE its whole run); the shared part
 * is the caller's total less their sum. On error every out[i] is freed
 * and zeroed, and the message names the budget's index when n > 1. */
kvs_status kvs_compress_many(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                             const kvs_budget *b, int n, int threads, kvs_plan *out,
                             double *select_ms, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Apply: compaction and merging                                             */
/* ------------------------------------------------------------------------ */

/* Gather the kept rows of every layer (fp32 out, [Hkv][B_l][d]; a ragged
 * plan layer gives a ragged dense layer, counts copied); when
 * plan->merge != NONE every evicted token of a head is first assigned to the
 * kept token of that head whose KEY has the highest cosine similarity (ties:
 * lower kept index) and K and V are merged with the plan's formula, in fp32.
 * Queries are not carried over. out->n_tokens = N, modality copied. */
kvs_status kvs_apply(const kvs_cache_view *in, const kvs_plan *plan, kvs_dense_cache *out,
                     kvs_err *err);
/* kvs_apply on `threads` threads over (layer, KV head) units, writing into
 * out's buffers where they are large enough: out must be zeroed or hold the
 * result of an earlier kvs_apply / kvs_apply_into (a benchmark or an engine
 * applying plan after plan then pays no page faults for fresh buffers). The
 * result is the same as kvs_apply's whatever the thread count. On error out
 * is freed (zeroed). */
kvs_status kvs_apply_into(const kvs_cache_view *in, const kvs_plan *plan, int threads,
                          kvs_dense_cache *out, kvs_err *err);

/* The assignment alone, for one head: for every token n not in kept[0..B),
 * assign[n] = slot in [0, B) of its most cosine-similar kept key; for kept
 * tokens assign[n] = -1. k is one head of a [N][d] key block as a view head.
 * Tiled; memory O(N + tile). */
kvs_status kvs_merge_assign(const kvs_view *k, int head, const int32_t *kept, int B,
                            int32_t *assign /* [N] */, kvs_err *err);

/* Merge one head in place: kk, vv are [B][d] fp32 kept rows (gathered),
 * assign as above. Applies formula m. */
void kvs_merge_head(const kvs_view *k, const kvs_view *v, int head, const int32_t *kept, int B,
                    const int32_t *assign, kvs_merge m, float *kk, float *vv);

/* ------------------------------------------------------------------------ */
/* Selection helpers                                                         */
/* ------------------------------------------------------------------------ */

/* Indices of the k largest scores[0..n) (ties: lower index first wins), then
 * sorted ascending into out[0..k). NaN scores are an error (caller checks).
 * Allocates n x 8 bytes of scratch (KVS_ERR_NOMEM if that fails). O(n) average. */
kvs_status kvs_topk_indices(const float *scores, int n, int k, int32_t *out, kvs_err *err);

/* 1-D pooling along tokens, stride 1, window k (odd or even), centred with
 * padding k/2: max ignores padding, avg divides by the real element count. */
void kvs_pool1d_max(const float *x, int n, int k, float *out);
void kvs_pool1d_avg(const float *x, int n, int k, float *out);

/* Sort ascending and check uniqueness (int32). */
void kvs_sort_i32(int32_t *a, int n);

/* ------------------------------------------------------------------------ */
/* Attention statistics, O(N) memory (tiled log-sum-exp, two-pass or fused)   */
/* ------------------------------------------------------------------------ */

/* All functions below take one layer: q [Hq][Nq][d] (query row i sits at
 * position p_i = N - Nq + i, causal: keys j <= p_i), k [Hkv][N][d]; query head
 * h uses KV head h / (Hq / Hkv). Logits s_ij = q_i . k_j / sqrt(d), fp32
 * accumulation. threads <= 0 means one thread. */

/* Row log-sum-exp: lse is [Hq][Nq]. */
kvs_status kvs_attn_lse(const kvs_view *q, const kvs_view *k, float *lse, int threads,
                        kvs_err *err);

/* Column sums of the causal attention probabilities, averaged over the G
 * query heads of each KV head: colsum is [Hkv][N],
 * colsum[g][j] = (1/G) sum_{h in group g} sum_i A_h[i][j].
 * lse from kvs_attn_lse. If row_entropy != NULL it receives, per query head,
 * the row entropies H_h[i] = lse - sum_j p_ij s_ij ([Hq][Nq]). */
kvs_status kvs_attn_colsum(const kvs_view *q, const kvs_view *k, const float *lse,
                           float *colsum, float *row_entropy, int threads, kvs_err *err);

/* kvs_attn_lse + kvs_attn_colsum in one pass over the logits (about 1.8x
 * faster): per thread, a block of R stacked query rows (R = 256 rows over
 * the G heads of a KV group, at least one per head: R <= max(256, G))
 * has its logits against all causally visible keys computed once into an
 * R x N buffer, from which the exact row max / log-sum-exp and then the
 * probabilities are taken. Extra memory: threads * R * N * 4 bytes
 * (8 MiB per thread at N = 8192, 32 MiB at N = 32768), plus [Hkv][8][N]
 * doubles; never N x N. lse ([Hq][Nq]) may be NULL (then it is not
 * returned); colsum and row_entropy are as in kvs_attn_colsum. Results are
 * bit-identical for any thread count and equal to the two-pass functions
 * within 1e-5 relative (they may differ in the last bits). The two-pass
 * functions stay the reference and need only O(tile) scratch. */
kvs_status kvs_attn_colsum_fused(const kvs_view *q, const kvs_view *k, float *lse, float *colsum,
                                 float *row_entropy, int threads, kvs_err *err);

/* kvs_attn_colsum_fused with weighted query rows, still one pass: row_w
 * [Nq] (NULL: all 1, then it is kvs_attn_colsum_fused) scales row i's
 * probabilities in the column sums, colsum[g][j] = (1/G) sum_{h in g}
 * sum_i row_w[i] A_h[i][j] (the same weight for every head); lse and
 * row_entropy are unweighted. A non-finite weight is KVS_ERR_INVALID. */
kvs_status kvs_attn_colsum_fused_w(const kvs_view *q, const kvs_view *k, const float *row_w,
                                   float *lse, float *colsum, float *row_entropy, int threads,
                                   kvs_err *err);

/* One row of logits s[0 .. n) to its softmax in place, p_j = exp(s_j -
 * lse) (8-lane exp as the passes above, relative error ~1e-7); returns
 * lse; *plogp = sum_{j < m} p_j log p_j (m <= n: a prefix of the keys, e.g.
 * CAKE's dispersion over the context). Sums in float within 256-key chunks,
 * double across them. n < 1: returns -inf, *plogp = 0. */
float kvs_attn_softmax_row(float *s, int n, int m, double *plogp);

/* Entropies of the head-averaged causal attention (kvs_entropy_stats, above
 * kvs_layer): modality is [N] (query row i has modality modality[p_i]). */
kvs_status kvs_attn_entropies(const kvs_view *q, const kvs_view *k, const float *lse,
                              const uint8_t *modality, kvs_entropy_stats *out, int threads,
                              kvs_err *err);

/* Everything MEDA needs from one pass over the logits: lse (may be NULL),
 * colsum and row_entropy as kvs_attn_colsum_fused (each may be NULL), and
 * the entropies as kvs_attn_entropies (ent required; Nq >= 1). A row block
 * holds tq rows of ALL Hq heads (R = Hq * tq <= max(256, Hq) rows), so the
 * extra memory is threads * R * N * 4 bytes as for kvs_attn_colsum_fused.
 * Bit-identical for any thread count; equal to the two-pass functions
 * within 1e-5 relative. */
kvs_status kvs_attn_stats_fused(const kvs_view *q, const kvs_view *k, const uint8_t *modality,
                                float *lse, float *colsum, float *row_entropy,
                                kvs_entropy_stats *ent, int threads, kvs_err *err);

/* The all-query statistics of one layer as kvs_layer's contract defines them:
 * colsum [Hkv][N] (NULL: not wanted) and ent (NULL: not wanted; modality [N]
 * or NULL = all text) from in->attn_colsum / in->attn_ent where present, the
 * rest from ONE fused pass over in->q (Nq = N required then) and in->k
 * (kvs_attn_colsum_fused, or kvs_attn_stats_fused when ent is computed).
 * *given (may be NULL) receives 1 when no pass was needed. */
kvs_status kvs_layer_attn_stats(const kvs_layer *in, const uint8_t *modality, float *colsum,
                                kvs_entropy_stats *ent, int threads, int *given, kvs_err *err);

/* For a producer that holds one query row's probabilities summed over all
 * Hq query heads (asum[j] = sum_h A_h[i][j], j < nv, the row at position
 * p = nv - 1): h[0] = entropy of the head-averaged row, h[1] = its
 * restricted (cross-modal) entropy, *kind = 0 none, 1 text-to-visual,
 * 2 visual-to-text (modality [>= nv] or NULL = all text), as
 * kvs_attn_entropies defines them. kvs_attn_entropy_reduce takes the rows'
 * h [Nq][2] and kind [Nq] to kvs_entropy_stats (means in row order). */
void kvs_attn_row_entropy(const float *asum, int nv, int Hq, const uint8_t *modality, double h[2],
                          int8_t *kind);
kvs_status kvs_attn_entropy_reduce(const double *h, const int8_t *kind, int Nq,
                                   kvs_entropy_stats *out, kvs_err *err);

/* ------------------------------------------------------------------------ */
/* Fidelity: how well a compressed cache reproduces attention outputs        */
/* ------------------------------------------------------------------------ */

/* For probe queries placed after the prompt (they see every kept token):
 * o_full = softmax(q K^T / sqrt d) V over the full cache, o_comp over the
 * compressed layer. rel_err = ||o_comp - o_full|| / ||o_full||, averaged over
 * (query head, probe). probes is [Hq][P][d] fp32 view; full is the layer's
 * uncompressed K/V; comp a dense compressed layer. */
kvs_status kvs_fidelity_layer(const kvs_view *probes, const kvs_layer *full,
                              const kvs_dense_layer *comp, double *mean_rel_err,
                              double *max_rel_err, kvs_err *err);

/* Fraction of (layer, head, outlier token) triples whose token is kept by the
 * plan. outliers is [M] token indices. */
double kvs_plan_retention(const kvs_plan *p, const int32_t *outliers, int M);

/* ------------------------------------------------------------------------ */
/* Timers and small utilities                                                */
/* ------------------------------------------------------------------------ */

double kvs_now_ms(void);  /* monotonic clock, milliseconds */
uint64_t kvs_rng_next(uint64_t *state); /* splitmix64 */
double kvs_rng_uniform(uint64_t *state); /* [0, 1) */
double kvs_rng_normal(uint64_t *state);  /* standard normal */
/* Case-insensitive Levenshtein distance of two names, for "did you mean"
 * suggestions; names longer than 63 characters count as very far (1000). */
int kvs_edit_distance(const char *a, const char *b);

/* ------------------------------------------------------------------------ */
/* Threads                                                                   */
/* ------------------------------------------------------------------------ */

/* One unit of a parallel job; tid in [0, threads) names the worker (for
 * per-worker scratch), unit in [0, n_units). A failing unit returns its
 * status with its message in *err (a zeroed kvs_err of its own). */
typedef kvs_status (*kvs_unit_fn)(void *job, int tid, int unit, kvs_err *err);
/* Runs fn for every unit on min(threads, n_units, 64) threads, the caller
 * being worker 0; units start in increasing order (an atomic counter), so
 * uneven units balance. Results must not depend on which worker ran a unit.
 * When units fail, returns the status and message of the failing unit with
 * the lowest index, whatever the thread count (units after it that had not
 * started are skipped). Every unit runs even if a worker thread could not be
 * started; that case then returns KVS_ERR_NOMEM naming `what`. */
kvs_status kvs_parallel_run(void *job, kvs_unit_fn fn, int n_units, int threads, const char *what,
                            kvs_err *err);
/* The worker count kvs_parallel_run will use: threads clamped to
 * [1, min(64, n_units)] (n_units < 1: to [1, 64]). Size scratch with it. */
int kvs_parallel_threads(int threads, int n_units);
/* Worker placement, a hint (no result depends on it). Pins the calling
 * thread, worker i (1 <= i < n) of a group of n whose worker 0 is the caller,
 * to one CPU: the i-th of its allowed CPUs in increasing order, skipping
 * `avoid` (the caller's CPU; -1: skip the first allowed CPU, left to the
 * caller). Only on Linux, only when the allowed set has at least n CPUs, and
 * not when the environment has KVSIEVE_PIN=0; returns 1 if pinned. Why: on a
 * small machine the kernel often starts a new thread on its creator's CPU and
 * wakes a sleeping one on its waker's, and the two then share one core for
 * milliseconds while another idles (docs/performance.md, "The engine against
 * llama.cpp": pinned workers).
 * kvs_parallel_run's workers and the backend's pool call it. */
int kvs_thread_pin(int i, int n, int avoid);

#ifdef __cplusplus
}
#endif
#endif /* KVSIEVE_H */
