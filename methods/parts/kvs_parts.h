/*
 * kvs_parts.h -- methods as compositions of named parts (issue #32, first slice).
 *
 * What it is: the four part interfaces a composed method is made of, the
 * composition that turns them into an ordinary kvs_method (so kvs_compress
 * checks every invariant of its plans), and the presets: a name for a
 * composition with its paper's defaults.
 *
 *   scorer     per layer, per KV head, one fp32 score per token (higher =
 *              keep): snapkv, h2o, tova, knorm, keydiff, random, flashcache,
 *              expected_attention, lagkv, cur, leverage, cake, simlayer,
 *              qfilter, compactor, finch, kvzip
 *   allocator  splits the global budget L * B over layers: uniform, pyramid,
 *              and the data-driven dba, entropy, cake, simlayer, global (they read
 *              per-layer statistics, kvs_layer_stats, gathered during observe)
 *   head allocator (optional) splits a layer's budget over its KV heads by
 *              the layer's scores: adakv (ragged per-head counts)
 *   keep rules protect rules (a prefix or a suffix of the prompt that is
 *              always kept): sinks, window; span (a protected range forced
 *              into the pick); and the pick rule, how the rest of
 *              a head's budget is chosen among the unprotected tokens by
 *              score: topk (token by token), chunk (whole chunks, ChunkKV),
 *              critical (CriticalKV's two stages with ||W_o v||, which it
 *              computes from the layer at observe time: needs W_o)
 *   merge      the plan's merge field: the composition's, or the method's
 *              `merge` parameter when it declares one (lookm, meda)
 *
 * Parameters are namespaced by name, not by prefix: a part reads the
 * parameters it knows from the composed method's one flat table
 * (kvs_part_param), so two parts that mean the same thing share one name
 * (SnapKV's observation window is also the window that is always kept:
 * both read `window`). A part parameter a preset does not declare takes the
 * value the part documents as "absent" (a protect rule then protects
 * nothing). The KVS_PARTS_P_* macros below are the declarations with their
 * ranges; a preset lists the ones its parts read, with its own defaults.
 *
 * Selection of one (layer l, KV head h) with layer budget B_l:
 *   B_l >= N: everything. Otherwise the protect rules, in the composition's
 *   order, each take min(count, what is left of B_l) tokens at their end of
 *   the prompt (sinks [0, p), window [N - q, N)); the pick rule chooses the
 *   remaining B_l - p - q tokens of [p, N - q) by the layer's scores.
 *   Without a head allocator every KV head of a layer keeps the same count
 *   B_l. With one (per-head counts, ragged plans), the protect rules stay
 *   per layer: p and q are computed from B_l as above and every head keeps
 *   the same prefix and suffix; only the pick budget moves between heads:
 *   the head allocator splits Hkv * (B_l - p - q) over the heads by the
 *   layer's [Hkv][N] scores (head h picks k_h of [p, N - q), sum exact), so
 *   head h keeps p + k_h + q tokens and the layer keeps Hkv * B_l rows, as
 *   without it. The pick rule then picks k_h tokens of head h.
 *
 * What it is not: no GPU path (a composed method on a CUDA view fails with
 * KVS_ERR_UNSUPPORTED naming the method and "not implemented on GPU";
 * kvs_gpu_compress (methods/gpu/) refuses it like every method without a GPU
 * driver); merging itself is core's kvs_apply (the plan's merge field).
 */
#ifndef KVS_PARTS_H
#define KVS_PARTS_H

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What every part is told: the composed method (its name for messages, its
 * parameter table), its parameter values, and the cache shape. */
/* Per-layer statistics that data-driven allocators read (filled during
 * observe, by the scorer when it computes them anyway, else by the
 * allocator's own measure). `have` says which groups are set. */
enum {
    KVS_STAT_ENERGY = 1u << 0,  /* DBA: DCT high-band / total energy of K and V */
    KVS_STAT_ENTROPY = 1u << 1, /* MEDA: entropies of the head-averaged attention */
    KVS_STAT_CAKE = 1u << 2,    /* CAKE: dispersion and shift of the window's attention */
    KVS_STAT_LAZY = 1u << 3,    /* SimLayerKV: the last query's mass on sinks + recent */
};
typedef struct {
    unsigned have;        /* KVS_STAT_* set for this layer */
    double e_high[2];     /* [K, V] sum over heads of ||X[m >= omega]||^2 */
    double e_tot[2];      /* [K, V] sum over heads of ||X||^2 */
    kvs_entropy_stats ent;
    double cake_disp;     /* entropy of the window's attention over prefix keys */
    double cake_var;      /* its variance over the window queries, summed */
    double lazy_mass;     /* SimLayerKV: mean over query heads of the last query's
                             attention on the first `sinks` and last `recent` keys */
} kvs_layer_stats;

typedef struct {
    const kvs_method *m;
    const kvs_params *p;
    kvs_shape shape;
    /* Set by the composition (NULL / 0 for a part used alone): the layer
     * being observed's modality (NULL: all text), the statistics [L] the
     * allocator reads (a scorer that computes one of them anyway writes
     * stats[layer] and sets its `have` bit), which groups it reads, and room
     * for a line the plan's note carries. */
    const uint8_t *modality;
    kvs_layer_stats *stats;
    unsigned want_stats;
    char *note; /* [256] or NULL */
    /* The scores of every layer [L][Hkv][N] as the scorer wrote them,
     * complete once the last layer is observed (NULL for a part used
     * alone): what an allocator ranking all layers reads (global). */
    const float *scores;
} kvs_part_ctx;

/* Value of parameter `name` of method m, or `absent` when m does not declare it. */
double kvs_part_param(const kvs_method *m, const kvs_params *p, const char *name, double absent);

/* Row reductions of the linear scorers (part_rows.c): sum of squares and
 * dot product of fp32 rows [d] in fp32, and the sum of squares in double;
 * a fixed lane order (vectorised), the same result on every machine. */
float kvs_part_sumsq(const float *r, int d);
float kvs_part_dot(const float *a, const float *b, int d);
double kvs_part_sumsq_f64(const float *r, int d);

/* ---- scorers --------------------------------------------------------------- */

typedef struct {
    const char *name;
    unsigned needs; /* KVS_NEED_* of the scorer */
    /* Query rows it reads (the last ones); NULL: none. */
    int (*queries_wanted)(const kvs_method *m, const kvs_params *p, int N);
    kvs_status (*create)(const kvs_part_ctx *c, void **state, kvs_err *err);
    /* Scores of one layer (host views, shapes already checked against the
     * shape): scores is [Hkv][N], finite. */
    kvs_status (*score)(void *state, int layer, const kvs_layer *in, float *scores, kvs_err *err);
    void (*destroy)(void *state);
    unsigned props; /* KVS_READS_ATTN_STATS: reads kvs_layer.attn_colsum / attn_ent
                       when present (kvs_method_reads_attn_stats); not a need */
    /* Optional: the scores of every layer at once, in [L] the layers' views,
     * scores [L][Hkv][N]: one parallel run for the whole cache instead of one
     * per layer (a run waits for all its workers; per layer that wait is paid
     * L times). The composition calls it after the last layer is observed
     * (a layer's memory stays valid until select returns); NULL: score per
     * layer. Same scores as `score` layer by layer. */
    kvs_status (*score_layers)(void *state, const kvs_layer *in, int n_layers, float *scores,
                               kvs_err *err);
} kvs_scorer;

extern const kvs_scorer kvs_scorer_snapkv, kvs_scorer_h2o, kvs_scorer_tova, kvs_scorer_knorm,
    kvs_scorer_keydiff, kvs_scorer_random;

/* LOOK-M's text prior (the h2o scorer's text_prior, the lookm scorer; the
 * lookm and meda presets), in place: for each KV head g, every token j with
 * modality[j] == KVS_MOD_TEXT (all tokens when modality is NULL) gets
 * scores[g][j] += max_j' scores[g][j'] (the max over ALL tokens of the head,
 * taken before any boost). */
void kvs_text_boost(float *scores /* [Hkv][N] */, int Hkv, int N, const uint8_t *modality);
/* `lookm` (score_h2o.c): the h2o scorer with text_prior always on. */
extern const kvs_scorer kvs_scorer_lookm;

/* ---- allocators ------------------------------------------------------------ */

typedef struct {
    const char *name;
    /* budgets [L], each in [1, N], summing exactly to L * per_layer. Inputs
     * beyond the shape: per-layer statistics (c->stats, data-driven
     * allocators) or every layer's scores (c->scores, global); per-head
     * counts are a head allocator's (kvs_head_allocator). */
    kvs_status (*allocate)(const kvs_part_ctx *c, int per_layer, int *budgets, kvs_err *err);
    /* Data-driven allocators (0 / NULL otherwise): the KVS_STAT_* groups
     * allocate reads from c->stats, the inputs their measure needs
     * (KVS_NEED_*) and the query rows it reads, and measure, which computes
     * the groups for one layer when the scorer did not. */
    unsigned stats;
    unsigned needs;
    int (*queries_wanted)(const kvs_method *m, const kvs_params *p, int N);
    kvs_status (*measure)(const kvs_part_ctx *c, int layer, const kvs_layer *in,
                          kvs_layer_stats *out, kvs_err *err);
    unsigned props; /* as kvs_scorer's */
} kvs_allocator;

extern const kvs_allocator kvs_alloc_uniform, kvs_alloc_pyramid;
/* global (alloc_global.c): layer budgets from one top-k of the scores over
 * every layer and head (KVzip's non-layerwise budget; reads c->scores). */
extern const kvs_allocator kvs_alloc_global;
/* Data-driven allocators: FlashCache's DBA (alloc_dba.c), MEDA's entropy
 * budgets (alloc_entropy.c), CAKE's layer preferences (alloc_cake.c). */
extern const kvs_allocator kvs_alloc_dba, kvs_alloc_entropy, kvs_alloc_cake;

/* The allocators' rules alone (exposed for tests), budgets [L] summing
 * exactly to L * per_layer, each in [B_min, N] with B_min =
 * min(max(1, ceil(0.01 N)), per_layer):
 * DBA: weights R^l = sum over K, V of e_high / e_tot (a zero-energy block
 * adds 0; *n_zero counts them); entropy: weights softmax_l(E^l); CAKE:
 * the window w is kept in every layer and (per_layer - w) * L is split by
 * P_l = disp_l^(1/tau1) * var_l^(1/tau2). */
kvs_status kvs_dba_budgets(const kvs_layer_stats *st, int L, int N, int per_layer, int *budgets,
                           int *n_zero, kvs_err *err);
kvs_status kvs_entropy_budgets(const double *E, int L, int N, int per_layer, int *budgets,
                               kvs_err *err);
kvs_status kvs_cake_budgets(const double *disp, const double *var, int L, int N, int per_layer,
                            int window, double tau1, double tau2, int *budgets, kvs_err *err);
/* CAKE's statistics of one layer from the last w query rows (in->q holds
 * Nq >= w rows): per query head, A = softmax of each window row over the keys
 * it sees; over the prefix keys j < N - w, disp = -sum A log A and
 * var = sum_j var_i A[i][j] (unbiased over the w rows), both summed over
 * heads (log A, not the official code's log(A + 1e-10): alloc_cake.c).
 * w must be in [2, N - 1]. */
kvs_status kvs_cake_measure(const kvs_layer *in, int window, double *disp, double *var,
                            kvs_err *err);

/* kvs_cake_measure plus, when evict != NULL, CAKE's eviction indicator
 * (score_cake.c) from the same probabilities: evict [Hkv][N - w], for prefix
 * key j the mean over the G query heads of mean_i A[i][j] + gamma *
 * var_i A[i][j] (the w window rows, unbiased variance); on `threads`
 * threads (one unit per query head; results independent of the count). */
kvs_status kvs_cake_measure_ex(const kvs_layer *in, int window, double gamma, double *disp,
                               double *var, float *evict, int threads, kvs_err *err);

/* A head allocator: splits layer `layer`'s pick budget over its KV heads.
 * scores [Hkv][N] are the layer's (finite); every head's candidates are
 * [lo, hi); k (1 <= k <= hi - lo) is the mean per head. counts [Hkv] out,
 * each in [1, hi - lo], summing exactly to Hkv * k. Any scorer composes
 * with it. */
typedef struct {
    const char *name;
    kvs_status (*split)(const kvs_part_ctx *c, int layer, const float *scores, int lo, int hi,
                        int k, int *counts, kvs_err *err);
} kvs_head_allocator;

extern const kvs_head_allocator kvs_heads_adakv;

/* AdaKV's split alone (exposed for tests): see alloc_adakv.c. */
kvs_status kvs_adakv_split(const float *scores, int Hkv, int N, int lo, int hi, int k, double alpha,
                           int *counts, kvs_err *err);

/* The pyramid schedule alone (exposed for tests): budgets [L] from layer 0
 * (bottom, most) to L - 1 (top, least); see alloc_pyramid.c. */
kvs_status kvs_pyramid_budgets(int L, int N, int per_layer, int window, double beta, int *budgets,
                               kvs_err *err);

/* ---- keep rules ------------------------------------------------------------ */

typedef enum { KVS_KEEP_PREFIX = 0, KVS_KEEP_SUFFIX = 1, KVS_KEEP_SPAN = 2 } kvs_keep_side;

/* A protect rule: `count` tokens at one end of the prompt, given the layer
 * budget B (the composition clamps it to what is left of B). A span rule
 * (side KVS_KEEP_SPAN) gives a range [a, b) instead, forced into the pick
 * (keep_span.c); its count is b - a. */
typedef struct {
    const char *name;
    kvs_keep_side side;
    int (*count)(const kvs_part_ctx *c, int N, int B);
    void (*span)(const kvs_part_ctx *c, int N, int *a, int *b); /* KVS_KEEP_SPAN only */
} kvs_keep_rule;

extern const kvs_keep_rule kvs_keep_sinks, kvs_keep_window;
extern const kvs_keep_rule kvs_keep_span; /* keep_span.c: a protected span */

/* Scratch a pick rule may use, allocated once per compression (sizes N). */
typedef struct {
    double key;
    int32_t id;
} kvs_pick_pair;
typedef struct {
    kvs_pick_pair *pairs; /* [N] */
    int32_t *ibuf;        /* [N] */
    uint8_t *mask;        /* [N] */
    const float *aux;     /* [N]: the head's row of the pick rule's observe
                             output, NULL for rules without observe */
} kvs_pick_ws;

/* A pick rule: k tokens of the candidates [lo, hi) (0 < k <= hi - lo) by
 * scores [N]; out [k] ascending, absolute token indices.
 * A rule may read the layer too: observe (optional) writes a per-token
 * input [Hkv][N] (finite) once per layer at observe time, and pick then
 * finds the head's row in ws->aux; needs is what observe reads beyond K
 * and V (KVS_NEED_*, ORed into the composed method's needs). */
typedef struct {
    const char *name;
    kvs_status (*pick)(const kvs_part_ctx *c, const float *scores, int lo, int hi, int k,
                       kvs_pick_ws *ws, int32_t *out, kvs_err *err);
    unsigned needs;
    kvs_status (*observe)(const kvs_part_ctx *c, int layer, const kvs_layer *in, float *aux,
                          kvs_err *err);
} kvs_pick_rule;

extern const kvs_pick_rule kvs_pick_topk, kvs_pick_chunk;
/* critical (pick_critical.c): CriticalKV's two stages; its observe is the
 * projected value norm ||W_o v||_1 (exposed for tests: wnorm [Hkv][N]). */
extern const kvs_pick_rule kvs_pick_critical;
kvs_status kvs_critical_wo_norms(const kvs_layer *in, int threads, float *wnorm, kvs_err *err);

/* ---- channel rules (key channels, ThinK) ------------------------------------ */

/* A channel rule: which key channels each KV head keeps. observe writes the
 * layer's mask [Hkv][d] (1 kept, 0 pruned, at least one kept per head);
 * the composition copies the masks into the plan (kvs_plan.kchan), whose
 * tokens the other parts choose as usual. needs / queries_wanted as a
 * scorer's. */
typedef struct {
    const char *name;
    unsigned needs;
    int (*queries_wanted)(const kvs_method *m, const kvs_params *p, int N);
    kvs_status (*observe)(const kvs_part_ctx *c, int layer, const kvs_layer *in, uint8_t *mask,
                          kvs_err *err);
} kvs_channel_rule;

/* think (chan_think.c): ThinK's query-driven channel scores; the rule
 * alone, exposed for tests: mask [Hkv][d] of layer `in` from its last w
 * query rows, floor(ratio * d) channels pruned per head. */
extern const kvs_channel_rule kvs_chan_think;
kvs_status kvs_think_channels(const kvs_layer *in, int w, double ratio, uint8_t *mask, kvs_err *err);

/* ---- the composition ------------------------------------------------------- */

#define KVS_PARTS_MAX_KEEP 3 /* at most one prefix, one suffix and one span rule */

typedef struct {
    const kvs_scorer *scorer;
    const kvs_allocator *allocator;
    const kvs_head_allocator *heads;               /* NULL: equal counts per head */
    const kvs_keep_rule *keep[KVS_PARTS_MAX_KEEP]; /* priority order; NULL ends */
    const kvs_pick_rule *pick;
    kvs_merge merge; /* the plan's merge (a method's `merge` parameter wins) */
    const kvs_channel_rule *channels; /* NULL: every key channel is kept */
} kvs_composition;

/* The kvs_method entry points of a composition; m is the composed method
 * (the preset) whose name and parameter table the parts read. A preset
 * wraps create / queries_wanted (they take no method argument); observe,
 * select and destroy are shared. */
kvs_status kvs_compose_create(const kvs_composition *comp, const kvs_method *m, const kvs_params *p,
                              const kvs_shape *s, void **state, kvs_err *err);
int kvs_compose_queries_wanted(const kvs_composition *comp, const kvs_method *m,
                               const kvs_params *p, int N);
kvs_status kvs_compose_observe(void *state, int layer, const kvs_layer *in,
                               const uint8_t *modality, kvs_err *err);
kvs_status kvs_compose_select(void *state, int per_layer, kvs_plan *out, kvs_err *err);
void kvs_compose_destroy(void *state);

/* ---- parameter declarations (name, type, default, range, help) ------------ */

#define KVS_PARTS_IMAX 2147483647.0
#define KVS_PARTS_P_WINDOW(def, lo, help) {"window", KVS_PARAM_INT, (def), (lo), KVS_PARTS_IMAX, NULL, help}
#define KVS_PARTS_P_KERNEL(def) \
    {"kernel", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "pooling window k of the SnapKV votes along tokens (stride 1, centred, padding k/2)"}
#define KVS_PARTS_P_POOL(def) \
    {"pool", KVS_PARAM_ENUM, (def), 0, 1, "max|avg", \
     "pooling of the SnapKV votes: max (ignores padding) or avg (divides by real elements)"}
#define KVS_PARTS_P_NORMALIZE(def) \
    {"normalize", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "divide each attention column sum by N - j, the number of queries that see token j"}
#define KVS_PARTS_P_RECENT_FRAC(def) \
    {"recent_frac", KVS_PARAM_FLOAT, (def), 0.0, 1.0, NULL, \
     "share of the layer budget always kept as the recent window, floor(B * recent_frac)"}
#define KVS_PARTS_P_SINKS(def) \
    {"sinks", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "attention-sink tokens always kept at the start of the prompt"}
#define KVS_PARTS_P_BETA(def) \
    {"beta", KVS_PARAM_FLOAT, (def), 1.0, 1e9, NULL, \
     "PyramidKV steepness: the top layer gets 1/beta of the mean non-window budget"}
#define KVS_PARTS_P_CHUNK(def) \
    {"chunk", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "ChunkKV chunk size c: tokens are kept in whole chunks of c, ranked by summed score"}
#define KVS_PARTS_P_ANCHOR(def) \
    {"anchor", KVS_PARAM_ENUM, (def), 0, 1, "normalized|raw", \
     "KeyDiff anchor: mean of the L2-normalised keys (paper, kvpress) or of the raw keys"}
#define KVS_PARTS_P_ALPHA(def) \
    {"alpha", KVS_PARAM_FLOAT, (def), 0.0, 1.0, NULL, \
     "AdaKV safeguard: every head keeps at least floor(alpha * b) of the layer's mean pick budget b"}
#define KVS_PARTS_P_SEED(def) \
    {"seed", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "seed of the per-(layer, head) random score streams"}
#define KVS_PARTS_P_GAMMA(def) \
    {"gamma", KVS_PARAM_FLOAT, (def), 1e-9, 1.0, NULL, \
     "FlashCache low-pass cut-off: omega = max(1, round(gamma * N)) DCT coefficients kept"}
#define KVS_PARTS_P_COVARIANCE(def) \
    {"use_covariance", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "Expected Attention: add the query covariance term k' S k / (2 d) to the logits"}
#define KVS_PARTS_P_VNORM(def) \
    {"use_vnorm", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "Expected Attention: rescale scores by the value norm, (score + epsilon) * ||v||"}
#define KVS_PARTS_P_LAG(def) \
    {"lag", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "LagKV partition size: each partition is scored against the next one"}
#define KVS_PARTS_P_CROSS(def) \
    {"cross_scoring", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "LagKV: score by the statistics themselves, not by the rank within the partition"}
#define KVS_PARTS_P_EPSILON(def) \
    {"epsilon", KVS_PARAM_FLOAT, (def), 0.0, 1e9, NULL, \
     "Expected Attention: added to the expected attention before the value-norm rescaling"}

#define KVS_PARTS_P_FIRST_STAGE(def) \
    {"first_stage_ratio", KVS_PARAM_FLOAT, (def), 0.0, 1.0, NULL, \
     "CriticalKV: share of a head's pick budget chosen by the score alone (stage 1)"}
#define KVS_PARTS_P_CRIT_EPSILON(def) \
    {"critical_epsilon", KVS_PARAM_FLOAT, (def), 0.0, 1e9, NULL, \
     "CriticalKV: stage 2 ranks by (score + critical_epsilon) * ||W_o v||_1"}

#define KVS_PARTS_P_LEVERAGE_TYPE(def) \
    {"leverage_type", KVS_PARAM_ENUM, (def), 0, 3, "kv_product|key|value|kv_avg", \
     "CUR: combine the key and value scores by product, key only, value only or mean"}
#define KVS_PARTS_P_LOCAL_WINDOW(def) \
    {"local_window", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "CUR: squared norms normalised within windows of this many tokens (0: over the head)"}
#define KVS_PARTS_P_SKETCH(def) \
    {"sketch_dimension", KVS_PARAM_INT, (def), 1, 4096, NULL, \
     "leverage: columns of the Gaussian sketch of the centred keys"}
#define KVS_PARTS_P_DBA(def) \
    {"dba", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "FlashCache's dynamic budget allocation: layer budgets by high-band energy share R^l"}
#define KVS_PARTS_P_GRANULARITY(def) \
    {"granularity", KVS_PARAM_ENUM, (def), 0, 1, "head|layer", \
     "FlashCache: select per KV head, or one set per layer from Dev summed over heads"}
#define KVS_PARTS_P_TEXT_PRIOR(def) \
    {"text_prior", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "LOOK-M's text prior: every text token's score += the head's maximum score"}
#define KVS_PARTS_P_TAU1(def) \
    {"tau1", KVS_PARAM_FLOAT, (def), 1e-3, 1e3, NULL, \
     "CAKE: preference P = dispersion^(1/tau1) * shift^(1/tau2)"}
#define KVS_PARTS_P_TAU2(def) \
    {"tau2", KVS_PARAM_FLOAT, (def), 1e-3, 1e3, NULL, \
     "CAKE: preference P = dispersion^(1/tau1) * shift^(1/tau2)"}
#define KVS_PARTS_P_MERGE(def) \
    {"merge", KVS_PARAM_ENUM, (def), 0, 0, "pivotal|average|weighted|none", \
     "how evicted tokens are merged into their most key-similar kept token at apply"}

#define KVS_PARTS_P_SPAN(def) \
    {"span", KVS_PARAM_INT, (def), -KVS_PARTS_IMAX, KVS_PARTS_IMAX, NULL, \
     "first token of the protected span (negative: from the end, -20 = the last 20 tokens)"}
#define KVS_PARTS_P_SPAN_LEN(def) \
    {"span_len", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "length of the protected span in tokens (0: none)"}

#define KVS_PARTS_P_CAKE_GAMMA(def) \
    {"cake_gamma", KVS_PARAM_FLOAT, (def), 0.0, 1e9, NULL, \
     "CAKE: eviction indicator = mean + cake_gamma * variance of the window's attention"}
#define KVS_PARTS_P_CAKE_KERNEL(def) \
    {"kernel", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "CAKE: average pooling of the indicator along tokens, divided by the kernel (zero padding)"}
#define KVS_PARTS_P_RECENT(def) \
    {"recent", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "SimLayerKV: recent tokens a lazy layer keeps (with the sinks); also the measured span"}
#define KVS_PARTS_P_LAZY_THRESHOLD(def) \
    {"lazy_threshold", KVS_PARAM_FLOAT, (def), 0.0, 1.0, NULL, \
     "SimLayerKV: a layer is lazy when the last query's mass on sinks + recent exceeds this"}
#define KVS_PARTS_P_SVD_QUERIES(def) \
    {"svd_queries", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "Q-Filters: the last rows of the prompt's queries whose SVD gives each head's filter"}

#define KVS_PARTS_P_ATTN_CHUNK(def) \
    {"attn_chunk", KVS_PARAM_INT, (def), 1, KVS_PARTS_IMAX, NULL, \
     "Compactor: chunk length of the non-causal attention over the prompt"}
#define KVS_PARTS_P_BLENDING(def) \
    {"blending", KVS_PARAM_FLOAT, (def), 0.0, 1e9, NULL, \
     "Compactor: score = blending * leverage z-score + attention z-score"}
#define KVS_PARTS_P_NORMALIZE_SCORES(def) \
    {"normalize_scores", KVS_PARAM_BOOL, (def), 0, 1, NULL, \
     "Finch: weigh each question row's attention by its position (the keys it sees)"}
#define KVS_PARTS_P_CHUNK_LENGTH(def) \
    {"chunk_length", KVS_PARAM_INT, (def), 0, KVS_PARTS_IMAX, NULL, \
     "segment: the pick budget split over segments of this many tokens by length (0: one)"}
#define KVS_PARTS_P_KEY_CHANNEL_RATIO(def) \
    {"key_channel_ratio", KVS_PARAM_FLOAT, (def), 0.0, 0.99, NULL, \
     "ThinK: share of each KV head's key channels pruned, floor(ratio * d) (zeroed, not freed)"}

/* ---- parts a user may name (part_table.c) ---------------------------------- */

extern const kvs_scorer kvs_scorer_flashcache, kvs_scorer_expected_attention, kvs_scorer_lagkv;
extern const kvs_scorer kvs_scorer_cur, kvs_scorer_leverage;
/* finch (score_finch.c): the question's attention over the context, rows
 * weighted by position; segment (pick_segment.c): the pick budget spread
 * over segments by length, top-k in each. */
extern const kvs_scorer kvs_scorer_finch;
extern const kvs_pick_rule kvs_pick_segment;
/* kvzip (score_kvzip.c): KVzip's context-reconstruction scores, read from
 * kvs_layer.attn_recon_max (KVS_NEED_RECON); the first `sinks` score 1. */
extern const kvs_scorer kvs_scorer_kvzip;
/* The leverage of one head's keys krows [N][d] with a sketch of k columns
 * drawn from stream (score_leverage.c; exposed for tests): out [N]; scratch
 * y [N][k] floats, g and z [k][k] doubles. */
kvs_status kvs_leverage_head(const float *krows, int N, int d, int k, uint64_t stream, float *y,
                             double *g, double *z, double *out, kvs_err *err);

/* ---- CAKE's scorer, SimLayerKV, Q-Filters (score_cake.c, alloc_simlayer.c,
 * score_simlayer.c, score_qfilter.c) ------------------------------------------ */

extern const kvs_scorer kvs_scorer_cake, kvs_scorer_simlayer, kvs_scorer_qfilter;
/* compactor (score_compactor.c): Compactor's leverage + non-causal attention blend */
extern const kvs_scorer kvs_scorer_compactor;
/* allocator `simlayer`: lazy layers (lazy_mass > lazy_threshold) get their
 * StreamingLLM size, the others share the rest (alloc_simlayer.c). */
extern const kvs_allocator kvs_alloc_simlayer;

/* SimLayerKV's measure of one layer: the last prompt query's attention
 * row [Hkv][N] (GQA-group mean, as the tova scorer) in row, scratch lse
 * [Hq], and *mass = the mean over KV heads of the row's sum over
 * j < sinks or j >= N - recent (each key counted once). Needs Nq >= 1. */
kvs_status kvs_simlayer_mass(const kvs_layer *in, int sinks, int recent, int threads, float *lse,
                             float *row, double *mass, kvs_err *err);
/* SimLayerKV's budgets [L] (exposed for tests), summing exactly to
 * L * per_layer: layer l is lazy when mass[l] > threshold; a lazy layer's
 * weight is b_z = min(lazy_size, N, per_layer), a non-lazy one's the equal
 * share of the rest, (L * per_layer - n_lazy * b_z) / (L - n_lazy); one
 * rounding by kvs_budget_allocate (clamped to [B_min, N], water-filled).
 * No lazy layer or all lazy: every layer gets per_layer. *n_lazy out. */
kvs_status kvs_simlayer_budgets(const double *mass, int L, int N, int per_layer, int lazy_size,
                                double threshold, int *budgets, int *n_lazy, kvs_err *err);

/* Q-Filters' filter of one query head (exposed for tests): rows [n][d]
 * (n >= 1) -> v, the first right singular vector of the rows (the top
 * eigenvector of their Gram matrix: dsyrk, LAPACK dsyevr), oriented with its largest-magnitude component positive, then
 * multiplied by -1 when more than half of the rows have <q, v> > 0 (else
 * by +1): filter [d] = -sign * v, the official calibration's rule. All-zero
 * rows give a zero filter. Scratch: work [lwork] from kvs_qfilter_lwork. */
kvs_status kvs_qfilter_head(const float *rows, int n, int d, double *a /* [n][d] */,
                            double *u /* [d][d] */, double *work, int lwork, float *filter,
                            kvs_err *err);
int kvs_qfilter_lwork(int n, int d); /* work's length for n rows of d; < 1 on failure */

typedef enum {
    KVS_PART_SCORER = 0,
    KVS_PART_ALLOCATOR = 1,
    KVS_PART_KEEP = 2,
    KVS_PART_PICK = 3,
    KVS_PART_HEADS = 4, /* head allocators (kvs_head_allocator): ragged per-head counts */
    KVS_PART_CHANNELS = 5, /* channel rules (kvs_channel_rule): key channels kept per head */
} kvs_part_kind;

/* One nameable part: its kind, the part itself (a kvs_scorer, kvs_allocator,
 * kvs_keep_rule or kvs_pick_rule), a line of help and the parameters it
 * reads, with the part's defaults and ranges (a preset may set other
 * defaults). Parameters of the same name in two parts mean the same thing. */
typedef struct {
    kvs_part_kind kind;
    const char *name;
    const void *part;
    const char *summary;
    const kvs_param_def *params;
    int n_params;
} kvs_part_info;

const char *kvs_part_kind_name(kvs_part_kind k); /* "scorer", "allocator", "keep", "pick", "heads",
                                                   "channels" */
/* Every nameable part, grouped by kind; within a kind the order is append
 * only (a composed method's `parts` code is the index within its kind). */
int kvs_parts_count(void);
const kvs_part_info *kvs_part_at(int i);
/* The i-th part of a kind (NULL past the end), the index of a part in its
 * kind (-1 if unknown), and a lookup by name whose error names the kind and
 * suggests a close name ("unknown scorer 'tovaa' (did you mean 'tova'?);
 * known: ..."). */
const kvs_part_info *kvs_part_of_kind(kvs_part_kind kind, int i);
int kvs_part_index(kvs_part_kind kind, const void *part);
kvs_status kvs_part_lookup(kvs_part_kind kind, const char *name, const kvs_part_info **out,
                           kvs_err *err);

/* ---- compositions by the user (compose_dyn.c, compose_json.c) -------------- */

/* The parameter table of a composition: [0] is `parts`, an INT pinned to
 * the composition's code (what lets the method's create, which sees only
 * the parameter values, rebuild the composition), then the parameters of
 * the scorer, the allocator, the keep rules and the pick rule in that
 * order, each name once (a name read by two parts: the first part's
 * default, the intersection of the ranges). owner[i] is the part that
 * declared defs[i] first (NULL for `parts`). */
kvs_status kvs_compose_table(const kvs_composition *comp, kvs_param_def defs[KVS_MAX_PARAMS],
                             const kvs_part_info *owner[KVS_MAX_PARAMS], int *n, kvs_err *err);
/* The entry points every composed method shares (compose_dyn.c): create
 * decodes `parts` (the values' first parameter) back into the composition. */
extern const kvs_method kvs_compose_dyn;

/* A method composed at run time from a description. Its kvs_method's name
 * is the canonical JSON of the composition (its identity: results keys and
 * reports); its parameter defaults are the description's values. */
typedef struct kvs_composed kvs_composed;

/* A description is a JSON object:
 *   {"name": "ada_tova",                  optional label (default: the parts'
 *                                         names joined by '+')
 *    "score": "tova",                     required: a scorer
 *    "allocate": "pyramid",               default "uniform" ("adakv": uniform
 *                                         with "heads": "adakv")
 *    "heads": "adakv",                    a head allocator (ragged counts);
 *                                         default "equal" (absent)
 *    "keep": {"sinks": 4, "window": 8},   protect rules in priority order;
 *                                         a number sets the rule's parameter
 *                                         of its own name, true its default;
 *                                         also a list ["sinks", "window"]
 *    "pick": "chunk",                     default "topk"
 *    "merge": "none",                     none|pivotal|average|weighted, or
 *                                         lookm (= pivotal) / meda (= average)
 *    "params": {"chunk": 16, ...}}        any parameter of the parts above
 * Errors name the field and the part: "score: unknown scorer 'tovaa' (did
 * you mean 'tova'?)", "params.chunk: 0 is out of range [1, ...] (pick
 * chunk)". */
struct cJSON;
kvs_status kvs_composed_from_cjson(const struct cJSON *desc, kvs_composed **out, kvs_err *err);
kvs_status kvs_composed_from_json(const char *text, kvs_composed **out, kvs_err *err);
/* A parameter value given as JSON (bool, number, string) as the text
 * kvs_params_set reads ("true", "0.25", "max"); -1 for other JSON types. */
int kvs_json_param_text(const struct cJSON *v, char *buf, size_t n);
void kvs_composed_free(kvs_composed *c);
const kvs_method *kvs_composed_method(const kvs_composed *c);
const char *kvs_composed_label(const kvs_composed *c);

/* kvs_method_resolve (methods/kvsieve_methods.h): a registered name or a
 * description's text, the front ends' one entry point. */

/* Canonical JSON of composition comp with method m's parameter values p
 * (malloc'd; NULL when out of memory): keys score, allocate, keep, pick,
 * merge, params in that order; keep maps each rule to its parameter of the
 * same name; params holds the rest in table order, `parts` left out. */
char *kvs_composition_json(const kvs_composition *comp, const kvs_method *m, const kvs_params *p);

/* ---- presets ----------------------------------------------------------------- */

extern const kvs_method kvs_preset_knorm, kvs_preset_tova, kvs_preset_keydiff,
    kvs_preset_pyramidkv, kvs_preset_chunkkv, kvs_preset_snapkv_parts, kvs_preset_h2o_parts,
    kvs_preset_streamingllm_parts, kvs_preset_expected_attention, kvs_preset_pyramid_tova,
    kvs_preset_adakv, kvs_preset_ada_pyramidkv, kvs_preset_ada_flashcache;
extern const kvs_method kvs_preset_lagkv;
extern const kvs_method kvs_preset_criticalkv, kvs_preset_criticaladakv;
extern const kvs_method kvs_preset_cur, kvs_preset_leverage;
extern const kvs_method kvs_preset_cake, kvs_preset_simlayerkv, kvs_preset_qfilters;
extern const kvs_method kvs_preset_compactor;
/* Finch (finch scorer + segment pick) and ThinK (SnapKV tokens +
 * think key channels) */
extern const kvs_method kvs_preset_finch, kvs_preset_think;
/* KVzip: kvzip scorer + global allocator + adakv heads (alpha 0) + sinks */
extern const kvs_method kvs_preset_kvzip;
/* FlashCache as a composition (dba allocator; bit-identity proof against
 * methods/flashcache.c in tests/parts; not registered: the monolith's
 * threaded observe stays the fast path). The registered lookm and meda
 * (kvs_method_lookm, kvs_method_meda, methods/kvsieve_methods.h) are
 * presets defined in presets.c: the lookm scorer, uniform or entropy
 * allocator, window rule (recent_frac), topk, their merges. */
extern const kvs_method kvs_preset_flashcache_parts;

/* The presets in table order, and the composition behind one (NULL if m is
 * not a preset). */
int kvs_parts_presets_count(void);
const kvs_method *kvs_parts_preset_at(int i);
const kvs_composition *kvs_parts_composition(const kvs_method *m);

#ifdef __cplusplus
}
#endif
#endif
