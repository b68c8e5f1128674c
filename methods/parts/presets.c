/*
 * presets.c -- the preset table: a name for a composition with its paper's
 * defaults. Each preset is an ordinary kvs_method (registered in
 * methods/registry.c) whose parameter table lists the parameters its parts
 * read (kvs_parts.h), with the preset's defaults and the parts' ranges.
 *
 *   snapkv_parts        snapkv scorer, uniform, window rule, topk: the plans
 *                       of methods/snapkv.c bit for bit (tests/parts)
 *   h2o_parts           h2o scorer, uniform, window rule (recent_frac 0.5),
 *                       topk: methods/h2o.c bit for bit
 *   streamingllm_parts  sinks 4 + window (recent_frac 1: the rest of the
 *                       budget): methods/streamingllm.c bit for bit; with
 *                       recent_frac < 1 the middle is filled at random
 *                       (random scorer, seed 0), an ablation. No `rerotate`.
 *   knorm               knorm scorer (arXiv 2406.11430), uniform, topk; sinks
 *                       and window 0 by default (KnormPress keeps none)
 *   tova                tova scorer (arXiv 2401.06104), window 1 (the newest
 *                       token always stays, as in TOVA), topk
 *   keydiff             keydiff scorer (arXiv 2504.15364), anchor normalized,
 *                       sinks / window 0 by default (KeyDiffPress keeps none)
 *   pyramidkv           snapkv scorer + pyramid allocator (arXiv 2406.02069);
 *                       the official code's LongBench defaults: window 8,
 *                       kernel 7, max pooling, beta 20
 *   chunkkv             snapkv scorer + chunk pick rule (arXiv 2502.00299);
 *                       chunk 10 (the paper's default); window 8, kernel 7,
 *                       max pooling are the defaults of the code base it
 *                       extends (KVCache-Factory), not checked against
 *                       ChunkKV's own scripts
 *   expected_attention  expected_attention scorer (arXiv 2510.00636), sinks 4
 *                       (kvpress's n_sink) kept by the sinks rule, topk;
 *                       covariance and value norms on, epsilon 0
 *   pyramid_tova        tova scorer + pyramid allocator: PyramidKV's schedule
 *                       (beta 20) with TOVA's window of 1 as the per-layer
 *                       window w
 *   adakv               snapkv scorer + uniform + adakv head allocator
 *                       (arXiv 2407.11550): SnapKV's defaults (window 32,
 *                       kernel 7, max pooling, so AdaKV and SnapKV at one
 *                       ratio keep the same bytes), alpha 0.2 (kvpress)
 *   ada_flashcache      flashcache scorer (gamma 0.2) + uniform + adakv heads
 *                       (alpha 0.2), no forced tokens (FlashCache's defaults):
 *                       the composition the issue names, not a published one
 *   ada_pyramidkv       pyramidkv's layer schedule and defaults + adakv
 *                       heads (the official code's pyram_mode)
 *   lagkv               lagkv scorer (arXiv 2504.04704) + sinks rule + topk:
 *                       kvpress LagKVPress's defaults (n_sink 4, lag_size
 *                       128, rank scoring); the sinks rule and the scorer
 *                       read the one `sinks`
 *   criticalkv          snapkv scorer + uniform + window + critical pick
 *                       (arXiv 2502.03805): SnapKV's defaults (window 32,
 *                       kernel 7, max), kvpress's first_stage_ratio 0.5 and
 *                       epsilon 1e-4; needs W_o
 *   criticaladakv       the same with the adakv head allocator (alpha 0.2),
 *                       kvpress's CriticalAdaKVPress
 *   cur                 cur scorer (arXiv 2509.15038) + sinks rule + topk:
 *                       kvpress CURPress's defaults (num_sinks 4,
 *                       kv_product, local window 16)
 *   leverage            leverage scorer (arXiv 2507.08143) + topk, no forced
 *                       tokens (LeverageScorePress keeps none); sketch 48
 *   cake                cake scorer + cake allocator + window + topk (arXiv
 *                       2503.12491): the official LongBench defaults, window
 *                       32, kernel 5, cake_gamma 200, tau1 = tau2 = 1
 *   simlayerkv          simlayer scorer + simlayer allocator + sinks + window
 *                       + topk (arXiv 2410.13846): sinks 4, recent 1024,
 *                       lazy_threshold 0.9 (official, Llama-3), window 1
 *   qfilters            qfilter scorer + uniform + window + topk (arXiv
 *                       2503.02812): svd_queries 3000, window 64 (official)
 *   compactor           compactor scorer + sinks + window + topk (arXiv
 *                       2507.08143): kvpress CompactorPress's defaults
 *                       (sinks 8, window 4, chunk 256, sketch 48), blending
 *                       0.75 (the press uses the compression ratio)
 *   flashcache_parts    flashcache scorer + dba + sinks / window + topk with
 *                       FlashCache's parameter names: methods/flashcache.c
 *                       bit for bit (tests/parts); not registered
 *   finch               finch scorer (arXiv 2408.00167) + window (the
 *                       question, 32) + segment pick (chunk_length 0: one
 *                       segment, kvpress's default); normalize_scores on
 *   think               snapkv scorer + window + topk (SnapKV's defaults)
 *                       + think channel rule (arXiv 2407.21018),
 *                       key_channel_ratio 0.5: pruned key channels zeroed
 *   kvzip               kvzip scorer (arXiv 2505.23416; needs the engine's
 *                       reconstruction pass) + global allocator (one
 *                       ranking over layers and heads, kvpress's default)
 *                       + adakv heads with alpha 0 (no safeguard) + sinks 4
 *   lookm, meda         the registered kvs_method_lookm / kvs_method_meda:
 *                       lookm scorer + uniform / entropy + window
 *                       (recent_frac) + topk, merge from `merge`; the
 *                       monolithic files' parameter tables, bit for bit their
 *                       plans (they were removed once proven identical)
 */
#include "kvs_parts.h"
#include "kvsieve_methods.h" /* kvs_method_lookm, kvs_method_meda are defined here */

#include <string.h>

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* One preset: its composition, its create / queries_wanted wrappers (the
 * kvs_method entry points take no method argument) and its kvs_method. */
#define KVS_PRESET(id, NAME, SUMMARY, NEEDS, ...)                                              \
    static const kvs_composition comp_##id = __VA_ARGS__;                                      \
    static kvs_status create_##id(const kvs_params *p, const kvs_shape *s, void **state,      \
                                  kvs_err *err) {                                              \
        return kvs_compose_create(&comp_##id, &kvs_preset_##id, p, s, state, err);             \
    }                                                                                          \
    static int queries_##id(const kvs_params *p, int N) {                                      \
        return kvs_compose_queries_wanted(&comp_##id, &kvs_preset_##id, p, N);                 \
    }                                                                                          \
    const kvs_method kvs_preset_##id = {                                                       \
        .name = NAME,                                                                          \
        .summary = SUMMARY,                                                                    \
        .needs = NEEDS,                                                                        \
        .params = params_##id,                                                                 \
        .n_params = NPARAMS(params_##id),                                                      \
        .queries_wanted = queries_##id,                                                        \
        .create = create_##id,                                                                 \
        .observe = kvs_compose_observe,                                                        \
        .select = kvs_compose_select,                                                          \
        .destroy = kvs_compose_destroy,                                                        \
    };

static const kvs_param_def params_snapkv_parts[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "observation window w: the last w prompt queries vote; the window is "
                       "always kept"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
};
KVS_PRESET(snapkv_parts, "snapkv_parts",
           "SnapKV as parts: snapkv scorer + uniform + window rule + topk (== snapkv)",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_h2o_parts[] = {
    KVS_PARTS_P_NORMALIZE(0),
    KVS_PARTS_P_RECENT_FRAC(0.5),
};
KVS_PRESET(h2o_parts, "h2o_parts",
           "H2O as parts: h2o scorer + uniform + window rule (recent_frac) + topk (== h2o)",
           KVS_NEED_Q_ALL,
           {.scorer = &kvs_scorer_h2o, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_streamingllm_parts[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_RECENT_FRAC(1.0),
};
KVS_PRESET(streamingllm_parts, "streamingllm_parts",
           "StreamingLLM as parts: sinks rule + window rule (the rest) (== streamingllm)", 0,
           {.scorer = &kvs_scorer_random, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_knorm[] = {
    KVS_PARTS_P_SINKS(0),
    KVS_PARTS_P_WINDOW(0, 0, "recent tokens always kept (0: none, as KnormPress)"),
};
KVS_PRESET(knorm, "knorm", "Knorm: keys with the lowest L2 norm are kept (no queries)", 0,
           {.scorer = &kvs_scorer_knorm, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_tova[] = {
    KVS_PARTS_P_WINDOW(1, 0, "recent tokens always kept (1: the newest token, as TOVA)"),
};
KVS_PRESET(tova, "tova", "TOVA: tokens the last query attends to most (GQA group mean)",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_tova, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_keydiff[] = {
    KVS_PARTS_P_ANCHOR(0),
    KVS_PARTS_P_SINKS(0),
    KVS_PARTS_P_WINDOW(0, 0, "recent tokens always kept (0: none, as KeyDiffPress)"),
};
KVS_PRESET(keydiff, "keydiff", "KeyDiff: keys least similar to the head's mean key are kept", 0,
           {.scorer = &kvs_scorer_keydiff, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_pyramidkv[] = {
    KVS_PARTS_P_WINDOW(8, 1,
                       "observation window w (SnapKV votes), always kept in every layer"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_BETA(20),
};
KVS_PRESET(pyramidkv, "pyramidkv",
           "PyramidKV: SnapKV votes + a linear layer schedule (more at the bottom)",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_pyramid,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_chunkkv[] = {
    KVS_PARTS_P_WINDOW(8, 1, "observation window w (SnapKV votes), always kept"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_CHUNK(10),
};
KVS_PRESET(chunkkv, "chunkkv", "ChunkKV: SnapKV votes, tokens kept in whole chunks",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_chunk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_expected_attention[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_COVARIANCE(1),
    KVS_PARTS_P_VNORM(1),
    KVS_PARTS_P_EPSILON(0.0),
};
KVS_PRESET(expected_attention, "expected_attention",
           "Expected Attention: softmax of the expected logits under the queries' mean and "
           "covariance, times ||v||",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_expected_attention, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_pyramid_tova[] = {
    KVS_PARTS_P_WINDOW(1, 0,
                       "recent tokens kept in every layer (1: the newest token, as TOVA)"),
    KVS_PARTS_P_BETA(20),
};
KVS_PRESET(pyramid_tova, "pyramid_tova",
           "PyramidKV's layer schedule over TOVA's last-query attention", KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_tova, .allocator = &kvs_alloc_pyramid,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})
static const kvs_param_def params_adakv[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "observation window w: the last w prompt queries vote; the window is "
                       "always kept by every head"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_ALPHA(0.2),
};
KVS_PRESET(adakv, "adakv",
           "AdaKV: SnapKV votes, one top-k over all heads of a layer (ragged per-head budgets)",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .heads = &kvs_heads_adakv, .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_ada_pyramidkv[] = {
    KVS_PARTS_P_WINDOW(8, 1,
                       "observation window w (SnapKV votes), always kept in every layer and head"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_BETA(20),
    KVS_PARTS_P_ALPHA(0.2),
};
KVS_PRESET(ada_pyramidkv, "ada_pyramidkv",
           "AdaKV on PyramidKV: pyramid layer schedule, then AdaKV's split over heads",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_pyramid,
            .heads = &kvs_heads_adakv, .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_ada_flashcache[] = {
    KVS_PARTS_P_GAMMA(0.2),
    KVS_PARTS_P_ALPHA(0.2),
};
KVS_PRESET(ada_flashcache, "ada_flashcache",
           "Ada-FlashCache: FlashCache's DCT outlier score, AdaKV's split over heads (ragged)", 0,
           {.scorer = &kvs_scorer_flashcache, .allocator = &kvs_alloc_uniform,
            .heads = &kvs_heads_adakv, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_lagkv[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_LAG(128),
    KVS_PARTS_P_CROSS(0),
};
KVS_PRESET(lagkv, "lagkv",
           "LagKV: spread of min-max normalised K and V against the next partition (no "
           "attention)",
           0,
           {.scorer = &kvs_scorer_lagkv, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_criticalkv[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "observation window w: the last w prompt queries vote; the window is "
                       "always kept"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_FIRST_STAGE(0.5),
    KVS_PARTS_P_CRIT_EPSILON(1e-4),
};
KVS_PRESET(criticalkv, "criticalkv",
           "CriticalKV: SnapKV votes, half the picks by vote, the rest by vote x ||W_o v||_1",
           KVS_NEED_Q_WINDOW | KVS_NEED_W_O,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_critical, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_criticaladakv[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "observation window w: the last w prompt queries vote; the window is "
                       "always kept by every head"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_ALPHA(0.2),
    KVS_PARTS_P_FIRST_STAGE(0.5),
    KVS_PARTS_P_CRIT_EPSILON(1e-4),
};
KVS_PRESET(criticaladakv, "criticaladakv",
           "CriticalAdaKV: AdaKV's split over heads, then CriticalKV's two stages per head",
           KVS_NEED_Q_WINDOW | KVS_NEED_W_O,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .heads = &kvs_heads_adakv, .keep = {&kvs_keep_window}, .pick = &kvs_pick_critical,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_cur[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_LEVERAGE_TYPE(0),
    KVS_PARTS_P_LOCAL_WINDOW(16),
};
KVS_PRESET(cur, "cur",
           "CurDKV: keys and values with large locally normalised squared norms (no queries)", 0,
           {.scorer = &kvs_scorer_cur, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_leverage[] = {
    KVS_PARTS_P_SKETCH(48),
    KVS_PARTS_P_SEED(0),
};
KVS_PRESET(leverage, "leverage",
           "LeverageScore: keys with the largest statistical leverage (Gaussian sketch, no queries)",
           0,
           {.scorer = &kvs_scorer_leverage, .allocator = &kvs_alloc_uniform,
            .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})
/* CAKE, SimLayerKV, Q-Filters (docs/methods.md) */
static const kvs_param_def params_cake[] = {
    KVS_PARTS_P_WINDOW(32, 2,
                       "observation window w: its attention is measured; kept in every layer"),
    KVS_PARTS_P_CAKE_KERNEL(5),
    KVS_PARTS_P_CAKE_GAMMA(200.0),
    KVS_PARTS_P_TAU1(1.0),
    KVS_PARTS_P_TAU2(1.0),
};
KVS_PRESET(cake, "cake",
           "CAKE: layer budgets by attention dispersion x shift, keys by mean + gamma * variance",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_cake, .allocator = &kvs_alloc_cake,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_simlayerkv[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_RECENT(1024),
    KVS_PARTS_P_LAZY_THRESHOLD(0.9),
    KVS_PARTS_P_WINDOW(1, 0, "recent tokens kept in every layer (1: the newest token)"),
};
KVS_PRESET(simlayerkv, "simlayerkv",
           "SimLayerKV: lazy layers keep sinks + recent (StreamingLLM), the others the rest",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_simlayer, .allocator = &kvs_alloc_simlayer,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const kvs_param_def params_qfilters[] = {
    KVS_PARTS_P_SVD_QUERIES(3000),
    KVS_PARTS_P_WINDOW(64, 0, "recent tokens always kept (64: the official QFiltersCache example)"),
};
KVS_PRESET(qfilters, "qfilters",
           "Q-Filters: keys projected on the principal direction of the prompt's own queries",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_qfilter, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_compactor[] = {
    KVS_PARTS_P_SINKS(8),
    KVS_PARTS_P_WINDOW(4, 0, "recent tokens always kept (4: the press's sink_size_end)"),
    KVS_PARTS_P_ATTN_CHUNK(256),
    KVS_PARTS_P_SKETCH(48),
    KVS_PARTS_P_SEED(0),
    KVS_PARTS_P_BLENDING(0.75),
};
KVS_PRESET(compactor, "compactor",
           "Compactor: key leverage blended with non-causal chunked attention (all queries)",
           KVS_NEED_Q_ALL,
           {.scorer = &kvs_scorer_compactor, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

/* FlashCache as parts: the public parameter names of methods/flashcache.c
 * (keep_sinks / keep_recent are the sinks / window rules' parameters by
 * part_param.c's aliases). */
static const kvs_param_def params_flashcache_parts[] = {
    KVS_PARTS_P_GAMMA(0.2),
    KVS_PARTS_P_DBA(1),
    KVS_PARTS_P_GRANULARITY(0),
    {"keep_sinks", KVS_PARAM_INT, 0, 0, KVS_PARTS_IMAX, NULL,
     "always keep the first s tokens (ablation; counted in the budget)"},
    {"keep_recent", KVS_PARAM_INT, 0, 0, KVS_PARTS_IMAX, NULL,
     "always keep the last r tokens (ablation; counted in the budget)"},
};
KVS_PRESET(flashcache_parts, "flashcache_parts",
           "FlashCache as parts: flashcache scorer + dba + sinks / window rules + topk "
           "(== flashcache)",
           0,
           {.scorer = &kvs_scorer_flashcache, .allocator = &kvs_alloc_dba,
            .keep = {&kvs_keep_sinks, &kvs_keep_window}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

/* LOOK-M and MEDA (methods.md): registered under their names with the
 * parameter tables they had as monolithic files (same names, order,
 * defaults, help), so their results keys are unchanged. The lookm scorer
 * is h2o with the text prior on; the plan's merge comes from `merge`
 * (compose.c). Their plans were proven bit-identical to the monolithic
 * methods/lookm.c and meda.c before those were removed
 * (tests/parts/test_parts_identity_seed.c now checks them against a
 * reference built from methods/textprior.c's helpers). */
static const kvs_param_def params_lookm[] = {
    {"text_policy", KVS_PARAM_ENUM, 0, 0, 0, "budget|keep_all",
     "budget: text prior within the exact budget (paper); keep_all (released code, may exceed "
     "the budget) is rejected as unsupported"},
    KVS_PARTS_P_MERGE(0),
    {"recent_frac", KVS_PARAM_FLOAT, 0.5, 0.0, 1.0, NULL,
     "share of the budget kept as the recent window, M = floor(B * recent_frac) (spec: 0.5)"},
};
static const kvs_composition comp_lookm = {
    .scorer = &kvs_scorer_lookm, .allocator = &kvs_alloc_uniform, .keep = {&kvs_keep_window},
    .pick = &kvs_pick_topk, .merge = KVS_MERGE_PIVOTAL};
static kvs_status create_lookm(const kvs_params *p, const kvs_shape *s, void **state,
                               kvs_err *err) {
    *state = NULL;
    /* text_policy=keep_all (the released code) may keep more than B tokens */
    if (p->n == NPARAMS(params_lookm) && p->v[0] == 1.0)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "lookm: text_policy=keep_all keeps every text token and may exceed the "
                          "budget, which breaks the exact-budget plan contract (each layer keeps "
                          "exactly its budget); use text_policy=budget");
    return kvs_compose_create(&comp_lookm, &kvs_method_lookm, p, s, state, err);
}
static int queries_lookm(const kvs_params *p, int N) {
    return kvs_compose_queries_wanted(&comp_lookm, &kvs_method_lookm, p, N);
}
const kvs_method kvs_method_lookm = {
    .name = "lookm",
    .summary = "LOOK-M: H2O scores with a text prior, recent window, evicted tokens merged",
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .params = params_lookm,
    .n_params = NPARAMS(params_lookm),
    .queries_wanted = queries_lookm,
    .create = create_lookm,
    .observe = kvs_compose_observe,
    .select = kvs_compose_select,
    .destroy = kvs_compose_destroy,
};

static const kvs_param_def params_meda[] = {
    {"recent_frac", KVS_PARAM_FLOAT, 0.5, 0.0, 1.0, NULL,
     "share of each layer's budget kept as the recent window (released code 0.5, paper 0.75)"},
    KVS_PARTS_P_MERGE(1),
};
static const kvs_composition comp_meda = {
    .scorer = &kvs_scorer_lookm, .allocator = &kvs_alloc_entropy, .keep = {&kvs_keep_window},
    .pick = &kvs_pick_topk, .merge = KVS_MERGE_AVERAGE};
static kvs_status create_meda(const kvs_params *p, const kvs_shape *s, void **state,
                              kvs_err *err) {
    return kvs_compose_create(&comp_meda, &kvs_method_meda, p, s, state, err);
}
static int queries_meda(const kvs_params *p, int N) {
    return kvs_compose_queries_wanted(&comp_meda, &kvs_method_meda, p, N);
}
const kvs_method kvs_method_meda = {
    .name = "meda",
    .summary = "MEDA: cross-modal entropy layer budgets, text-prior selection, average merging",
    .needs = KVS_NEED_Q_ALL | KVS_NEED_MODALITY,
    .params = params_meda,
    .n_params = NPARAMS(params_meda),
    .queries_wanted = queries_meda,
    .create = create_meda,
    .observe = kvs_compose_observe,
    .select = kvs_compose_select,
    .destroy = kvs_compose_destroy,
};

/* ---- Finch, ThinK (docs/methods.md) ---- */
static const kvs_param_def params_finch[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "the question: its last w prompt tokens, whose queries score the context; "
                       "always kept"),
    KVS_PARTS_P_NORMALIZE_SCORES(1),
    KVS_PARTS_P_CHUNK_LENGTH(0),
};
KVS_PRESET(finch, "finch",
           "Finch: the question's attention over the context (rows weighted by position), "
           "question kept",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_finch, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_segment, .merge = KVS_MERGE_NONE})

static const kvs_param_def params_think[] = {
    KVS_PARTS_P_WINDOW(32, 1,
                       "observation window w: its queries vote for tokens (SnapKV) and score key "
                       "channels (ThinK); the window is always kept"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
    KVS_PARTS_P_KEY_CHANNEL_RATIO(0.5),
};
KVS_PRESET(think, "think",
           "ThinK over SnapKV: SnapKV's tokens, half the key channels pruned per head by "
           "|q_c|^2 |k_c|^2 (zeroed)",
           KVS_NEED_Q_WINDOW,
           {.scorer = &kvs_scorer_snapkv, .allocator = &kvs_alloc_uniform,
            .keep = {&kvs_keep_window}, .pick = &kvs_pick_topk, .merge = KVS_MERGE_NONE,
            .channels = &kvs_chan_think})

/* ---- KVzip (docs/methods.md) ---- */
static const kvs_param_def params_kvzip[] = {
    KVS_PARTS_P_SINKS(4),
    KVS_PARTS_P_ALPHA(0.0),
};
KVS_PRESET(kvzip, "kvzip",
           "KVzip: max attention each token receives while the model repeats the context "
           "(an extra pass), one ranking over all layers and heads",
           KVS_NEED_RECON,
           {.scorer = &kvs_scorer_kvzip, .allocator = &kvs_alloc_global,
            .heads = &kvs_heads_adakv, .keep = {&kvs_keep_sinks}, .pick = &kvs_pick_topk,
            .merge = KVS_MERGE_NONE})

static const struct {
    const kvs_method *m;
    const kvs_composition *comp;
} presets[] = {
    {&kvs_preset_knorm, &comp_knorm},
    {&kvs_preset_tova, &comp_tova},
    {&kvs_preset_keydiff, &comp_keydiff},
    {&kvs_preset_pyramidkv, &comp_pyramidkv},
    {&kvs_preset_chunkkv, &comp_chunkkv},
    {&kvs_preset_expected_attention, &comp_expected_attention},
    {&kvs_preset_pyramid_tova, &comp_pyramid_tova},
    {&kvs_preset_adakv, &comp_adakv},
    {&kvs_preset_ada_pyramidkv, &comp_ada_pyramidkv},
    {&kvs_preset_ada_flashcache, &comp_ada_flashcache},
    {&kvs_preset_snapkv_parts, &comp_snapkv_parts},
    {&kvs_preset_h2o_parts, &comp_h2o_parts},
    {&kvs_preset_streamingllm_parts, &comp_streamingllm_parts},
    {&kvs_preset_lagkv, &comp_lagkv},
    {&kvs_preset_criticalkv, &comp_criticalkv},
    {&kvs_preset_criticaladakv, &comp_criticaladakv},
    {&kvs_preset_cur, &comp_cur},
    {&kvs_preset_leverage, &comp_leverage},
    {&kvs_preset_flashcache_parts, &comp_flashcache_parts},
    {&kvs_method_lookm, &comp_lookm},
    {&kvs_method_meda, &comp_meda},
    {&kvs_preset_cake, &comp_cake},
    {&kvs_preset_simlayerkv, &comp_simlayerkv},
    {&kvs_preset_qfilters, &comp_qfilters},
    {&kvs_preset_compactor, &comp_compactor},
    {&kvs_preset_finch, &comp_finch},
    {&kvs_preset_think, &comp_think},
    {&kvs_preset_kvzip, &comp_kvzip},
};

int kvs_parts_presets_count(void) { return (int)(sizeof presets / sizeof presets[0]); }

const kvs_method *kvs_parts_preset_at(int i) {
    return i >= 0 && i < kvs_parts_presets_count() ? presets[i].m : NULL;
}

const kvs_composition *kvs_parts_composition(const kvs_method *m) {
    for (int i = 0; i < kvs_parts_presets_count(); i++)
        if (presets[i].m == m) return presets[i].comp;
    return NULL;
}

