/*
 * keep_sinks.c -- keep rule `sinks`: the first s tokens are always kept.
 *
 * Paper: StreamingLLM (attention sinks), arXiv 2309.17453. Formula: protect
 * the prefix [0, s); if the layer budget B <= s the first B (the
 * composition clamps). Parameter: sinks (int >= 0, absent: 0 = no sinks).
 */
#include "kvs_parts.h"

static int sinks_count(const kvs_part_ctx *c, int N, int B) {
    (void)N;
    (void)B;
    return (int)kvs_part_param(c->m, c->p, "sinks", 0);
}

const kvs_keep_rule kvs_keep_sinks = {.name = "sinks", .side = KVS_KEEP_PREFIX, .count = sinks_count};
