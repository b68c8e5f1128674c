/*
 * keep_window.c -- keep rule `window`: the last tokens are always kept.
 *
 * Used by SnapKV (the observation window, arXiv 2404.14469), H2O's recent
 * window (arXiv 2306.14048), StreamingLLM's recent tokens (arXiv 2309.17453)
 * and TOVA's newest token. Formula: protect the suffix [N - r, N) with
 * r = max(window, floor(B * recent_frac)) for layer budget B, clamped by the
 * composition to what earlier rules left of B.
 * Parameters: window (int tokens, absent: 0), recent_frac (float in [0, 1],
 * absent: 0).
 * Decisions: the two published forms (a fixed count, SnapKV; a share of the
 * budget, H2O floor(B / 2); StreamingLLM "all the rest" = recent_frac 1)
 * are one rule with two parameters and r the larger of the two, so each
 * preset sets one and leaves the other absent. floor(B * recent_frac) is
 * taken in double, as methods/textprior.c's kvs_tp_recent (B * 0.5 exact).
 */
#include "kvs_parts.h"

#include <math.h>

static int window_count(const kvs_part_ctx *c, int N, int B) {
    (void)N;
    const double w = kvs_part_param(c->m, c->p, "window", 0);
    const double f = floor((double)B * kvs_part_param(c->m, c->p, "recent_frac", 0));
    const double r = w > f ? w : f;
    return r > (double)B ? B : (int)r;
}

const kvs_keep_rule kvs_keep_window = {.name = "window", .side = KVS_KEEP_SUFFIX,
                                       .count = window_count};
