/*
 * part_table.c -- the parts a user may name in a composed method, with the
 * parameters each reads (kvs_parts.h).
 *
 * What it is: one table of every scorer, allocator, keep rule, pick rule,
 * head allocator and channel rule by kind, each with a line of help and its parameter declarations (the
 * part's own defaults and ranges; a preset may pick other defaults), and the
 * lookups over it (by kind and index, by part, by name with a close-name
 * suggestion).
 * Order: within a kind the table is append only. A composed method stores
 * its composition as the indices of its parts within their kinds (the
 * `parts` code, compose_dyn.c), and that code is part of a results key.
 * What it is not: no composition (compose_dyn.c, compose_json.c), no part
 * code (the part files).
 */
#include "kvs_parts.h"

#include <stdio.h>
#include <string.h>

#define NP(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const kvs_param_def p_snapkv[] = {
    KVS_PARTS_P_WINDOW(32, 1, "observation window w: the last w prompt queries vote"),
    KVS_PARTS_P_KERNEL(7),
    KVS_PARTS_P_POOL(0),
};
static const kvs_param_def p_h2o[] = {KVS_PARTS_P_NORMALIZE(0), KVS_PARTS_P_TEXT_PRIOR(0)};
static const kvs_param_def p_keydiff[] = {KVS_PARTS_P_ANCHOR(0)};
static const kvs_param_def p_random[] = {KVS_PARTS_P_SEED(0)};
static const kvs_param_def p_flashcache[] = {KVS_PARTS_P_GAMMA(0.2), KVS_PARTS_P_GRANULARITY(0)};
static const kvs_param_def p_expected[] = {
    {"sinks", KVS_PARAM_INT, 4, 0, KVS_PARTS_IMAX, NULL,
     "first tokens left out of the query statistics and the softmax, scored as the maximum"},
    KVS_PARTS_P_COVARIANCE(1),
    KVS_PARTS_P_VNORM(1),
    KVS_PARTS_P_EPSILON(0.0),
};
static const kvs_param_def p_lagkv[] = {
    {"sinks", KVS_PARAM_INT, 4, 0, KVS_PARTS_IMAX, NULL,
     "first tokens left out of the partitions, scored 1 (kept first)"},
    KVS_PARTS_P_LAG(128),
    KVS_PARTS_P_CROSS(0),
};
static const kvs_param_def p_cur[] = {
    {"sinks", KVS_PARAM_INT, 4, 0, KVS_PARTS_IMAX, NULL, "first tokens scored 1 (kept first)"},
    KVS_PARTS_P_LEVERAGE_TYPE(0),
    KVS_PARTS_P_LOCAL_WINDOW(16),
};
static const kvs_param_def p_leverage[] = {KVS_PARTS_P_SKETCH(48), KVS_PARTS_P_SEED(0)};
static const kvs_param_def p_pyramid[] = {
    KVS_PARTS_P_BETA(20),
    KVS_PARTS_P_WINDOW(0, 0, "window w kept in every layer, added to each layer's share"),
};
static const kvs_param_def p_sinks[] = {KVS_PARTS_P_SINKS(0)};
static const kvs_param_def p_window[] = {
    KVS_PARTS_P_WINDOW(0, 0, "recent tokens always kept"),
    KVS_PARTS_P_RECENT_FRAC(0.0),
};
static const kvs_param_def p_chunk[] = {KVS_PARTS_P_CHUNK(10)};
static const kvs_param_def p_adakv[] = {KVS_PARTS_P_ALPHA(0.2)};
static const kvs_param_def p_critical[] = {KVS_PARTS_P_FIRST_STAGE(0.5),
                                           KVS_PARTS_P_CRIT_EPSILON(1e-4)};
static const kvs_param_def p_dba[] = {KVS_PARTS_P_GAMMA(0.2), KVS_PARTS_P_DBA(1)};
static const kvs_param_def p_span[] = {KVS_PARTS_P_SPAN(0), KVS_PARTS_P_SPAN_LEN(0)};
static const kvs_param_def p_finch[] = {
    KVS_PARTS_P_WINDOW(32, 1, "the question: its last w prompt tokens, whose queries score the context"),
    KVS_PARTS_P_NORMALIZE_SCORES(1),
};
static const kvs_param_def p_segment[] = {KVS_PARTS_P_CHUNK_LENGTH(0)};
static const kvs_param_def p_think[] = {
    KVS_PARTS_P_KEY_CHANNEL_RATIO(0.5),
    KVS_PARTS_P_WINDOW(32, 1, "observation window w: its queries score the key channels"),
};
static const kvs_param_def p_cake[] = {
    KVS_PARTS_P_WINDOW(32, 0, "observation window w: its attention is measured; kept in every layer"),
    KVS_PARTS_P_TAU1(1.0),
    KVS_PARTS_P_TAU2(1.0),
};

/* CAKE's scorer, SimLayerKV, Q-Filters (score_cake.c, alloc_simlayer.c,
 * score_simlayer.c, score_qfilter.c) */
static const kvs_param_def p_cake_score[] = {
    KVS_PARTS_P_WINDOW(32, 2, "observation window w: the last w prompt queries' attention"),
    KVS_PARTS_P_CAKE_KERNEL(5),
    KVS_PARTS_P_CAKE_GAMMA(200.0),
};
static const kvs_param_def p_simlayer[] = {
    {"sinks", KVS_PARAM_INT, 4, 0, KVS_PARTS_IMAX, NULL,
     "SimLayerKV: first tokens of the measured span (and of a lazy layer's StreamingLLM set)"},
    KVS_PARTS_P_RECENT(1024),
    KVS_PARTS_P_LAZY_THRESHOLD(0.9),
};
static const kvs_param_def p_qfilter[] = {KVS_PARTS_P_SVD_QUERIES(3000)};
static const kvs_param_def p_compactor[] = {
    {"sinks", KVS_PARAM_INT, 8, 0, KVS_PARTS_IMAX, NULL,
     "Compactor: first tokens left out of the statistics, scored as the maximum"},
    KVS_PARTS_P_WINDOW(4, 0, "Compactor: last tokens left out of the statistics, scored as the maximum"),
    KVS_PARTS_P_ATTN_CHUNK(256),
    KVS_PARTS_P_SKETCH(48),
    KVS_PARTS_P_SEED(0),
    KVS_PARTS_P_BLENDING(0.75),
};

#define PART(K, N, P, S, T) {K, N, P, S, T, NP(T)}
#define PART0(K, N, P, S) {K, N, P, S, NULL, 0}

static const kvs_part_info table[] = {
    /* scorers (append only) */
    PART(KVS_PART_SCORER, "snapkv", &kvs_scorer_snapkv,
         "SnapKV votes: attention of the last w queries, pooled along tokens", p_snapkv),
    PART(KVS_PART_SCORER, "h2o", &kvs_scorer_h2o,
         "H2O: accumulated attention of every prompt query", p_h2o),
    PART0(KVS_PART_SCORER, "tova", &kvs_scorer_tova, "TOVA: attention of the last query"),
    PART0(KVS_PART_SCORER, "knorm", &kvs_scorer_knorm, "Knorm: minus the key's L2 norm"),
    PART(KVS_PART_SCORER, "keydiff", &kvs_scorer_keydiff,
         "KeyDiff: minus the key's cosine to the head's mean key", p_keydiff),
    PART(KVS_PART_SCORER, "random", &kvs_scorer_random, "uniform random scores (seeded)",
         p_random),
    PART(KVS_PART_SCORER, "flashcache", &kvs_scorer_flashcache,
         "FlashCache: squared residual of K and V after a DCT low-pass", p_flashcache),
    PART(KVS_PART_SCORER, "expected_attention", &kvs_scorer_expected_attention,
         "Expected Attention: softmax of the expected logits under the queries' mean and "
         "covariance, times ||v||",
         p_expected),
    PART(KVS_PART_SCORER, "lagkv", &kvs_scorer_lagkv,
         "LagKV: spread of each token's min-max normalised K and V against the next partition",
         p_lagkv),
    PART(KVS_PART_SCORER, "cur", &kvs_scorer_cur,
         "CurDKV: product of the locally normalised squared norms of K and V", p_cur),
    PART(KVS_PART_SCORER, "leverage", &kvs_scorer_leverage,
         "leverage of the centred key among the head's keys (Gaussian sketch), z-scored",
         p_leverage),
    /* allocators (append only) */
    PART0(KVS_PART_ALLOCATOR, "uniform", &kvs_alloc_uniform, "every layer gets the same budget"),
    PART(KVS_PART_ALLOCATOR, "pyramid", &kvs_alloc_pyramid,
         "PyramidKV: a linear schedule, most at the bottom layer", p_pyramid),
    /* keep rules (append only) */
    PART(KVS_PART_KEEP, "sinks", &kvs_keep_sinks, "the first `sinks` tokens are kept", p_sinks),
    PART(KVS_PART_KEEP, "window", &kvs_keep_window,
         "the last max(window, floor(B * recent_frac)) tokens are kept", p_window),
    /* pick rules (append only) */
    PART0(KVS_PART_PICK, "topk", &kvs_pick_topk, "the best-scored tokens, one by one"),
    PART(KVS_PART_PICK, "chunk", &kvs_pick_chunk,
         "ChunkKV: whole chunks of `chunk` tokens by summed score", p_chunk),
    PART(KVS_PART_PICK, "critical", &kvs_pick_critical,
         "CriticalKV: a share by score, the rest by (score + eps) * ||W_o v||_1 (needs W_o)",
         p_critical),
    /* head allocators (append only; none: every head keeps the layer's count) */
    PART(KVS_PART_HEADS, "adakv", &kvs_heads_adakv,
         "AdaKV: a floor of alpha * b per head, the rest by one top-k over all heads (ragged)",
         p_adakv),
    /* appended: data-driven allocators (each kind stays append only) */
    PART(KVS_PART_ALLOCATOR, "dba", &kvs_alloc_dba,
         "FlashCache's DBA: layer budgets by the DCT high-band energy share of K and V", p_dba),
    PART0(KVS_PART_ALLOCATOR, "entropy", &kvs_alloc_entropy,
          "MEDA: layer budgets by softmax of the cross-modal attention entropy"),
    PART(KVS_PART_ALLOCATOR, "cake", &kvs_alloc_cake,
         "CAKE: layer budgets by attention dispersion x shift over the window", p_cake),
    PART0(KVS_PART_SCORER, "lookm", &kvs_scorer_lookm,
          "LOOK-M: H2O's accumulated attention with the text prior always on"),
    PART(KVS_PART_KEEP, "span", &kvs_keep_span,
         "a protected span [span, span + span_len) (span < 0: from the end), forced into the pick",
         p_span),
    /* appended: CAKE's scorer, SimLayerKV, Q-Filters */
    PART(KVS_PART_SCORER, "cake", &kvs_scorer_cake,
         "CAKE: mean + cake_gamma * variance of the window's attention, average-pooled",
         p_cake_score),
    PART(KVS_PART_SCORER, "simlayer", &kvs_scorer_simlayer,
         "SimLayerKV: recency in lazy layers, the last query's attention in the others",
         p_simlayer),
    PART(KVS_PART_SCORER, "qfilter", &kvs_scorer_qfilter,
         "Q-Filters: minus the key's projection on the filter from the SVD of the head's queries",
         p_qfilter),
    PART(KVS_PART_ALLOCATOR, "simlayer", &kvs_alloc_simlayer,
         "SimLayerKV: lazy layers get sinks + recent, the other layers share the rest",
         p_simlayer),
    PART(KVS_PART_SCORER, "compactor", &kvs_scorer_compactor,
         "Compactor: blending * leverage z-score + non-causal chunked attention z-score",
         p_compactor),
    /* Finch, ThinK */
    PART(KVS_PART_SCORER, "finch", &kvs_scorer_finch,
         "Finch: attention of the question (last w queries) over the context, rows weighted by "
         "position",
         p_finch),
    PART(KVS_PART_PICK, "segment", &kvs_pick_segment,
         "Finch's chunked selection: the budget split over segments by length, top-k in each",
         p_segment),
    PART(KVS_PART_CHANNELS, "think", &kvs_chan_think,
         "ThinK: per head the key channels with the lowest mean q^2 x mean k^2 pruned (zeroed)",
         p_think),
    /* KVzip */
    PART(KVS_PART_SCORER, "kvzip", &kvs_scorer_kvzip,
         "KVzip: max attention from the engine's context-reconstruction pass (needs it); the "
         "first `sinks` score 1",
         p_sinks),
    PART0(KVS_PART_ALLOCATOR, "global", &kvs_alloc_global,
          "layer budgets from one top-k of the scores over every layer and head (KVzip)"),
};

const char *kvs_part_kind_name(kvs_part_kind k) {
    switch (k) {
    case KVS_PART_SCORER: return "scorer";
    case KVS_PART_ALLOCATOR: return "allocator";
    case KVS_PART_KEEP: return "keep";
    case KVS_PART_PICK: return "pick";
    case KVS_PART_HEADS: return "heads";
    case KVS_PART_CHANNELS: return "channels";
    }
    return "?";
}

int kvs_parts_count(void) { return NP(table); }

const kvs_part_info *kvs_part_at(int i) { return i >= 0 && i < NP(table) ? &table[i] : NULL; }

const kvs_part_info *kvs_part_of_kind(kvs_part_kind kind, int i) {
    for (int j = 0; j < NP(table); j++)
        if (table[j].kind == kind && i-- == 0) return &table[j];
    return NULL;
}

int kvs_part_index(kvs_part_kind kind, const void *part) {
    int i = 0;
    for (int j = 0; j < NP(table); j++) {
        if (table[j].kind != kind) continue;
        if (table[j].part == part) return i;
        i++;
    }
    return -1;
}

kvs_status kvs_part_lookup(kvs_part_kind kind, const char *name, const kvs_part_info **out,
                           kvs_err *err) {
    *out = NULL;
    char known[512] = "";
    const char *best = NULL;
    int bestd = 4;
    for (int j = 0; j < NP(table); j++) {
        if (table[j].kind != kind) continue;
        if (name && strcmp(table[j].name, name) == 0) {
            *out = &table[j];
            return KVS_OK;
        }
        const int d = kvs_edit_distance(name ? name : "", table[j].name);
        if (d < bestd) bestd = d, best = table[j].name;
        if (known[0]) strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, table[j].name, sizeof known - strlen(known) - 1);
    }
    const char *kn = kvs_part_kind_name(kind);
    if (best)
        return kvs_errorf(err, KVS_ERR_NOTFOUND, "unknown %s '%s' (did you mean '%s'?); known: %s",
                          kn, name ? name : "", best, known);
    return kvs_errorf(err, KVS_ERR_NOTFOUND, "unknown %s '%s'; known: %s", kn, name ? name : "",
                      known);
}
