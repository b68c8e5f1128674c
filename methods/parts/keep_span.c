/*
 * keep_span.c -- keep rule `span`: a protected span of the prompt (e.g. the
 * question in the query-aware setting, a system prompt, a document title)
 * is always kept, as far as the layer's budget allows.
 *
 * Formula: the span is [a, a + len) with a = span (span < 0 counts from the
 * end: a = N + span), clipped to [0, N). Unlike the prefix / suffix rules it
 * does not take its tokens before the others: the composition forces the
 * span's tokens that lie among the pick rule's candidates [p, N - q) (what
 * sinks and window left) into the pick, by giving them the score +inf in a
 * scratch copy of the layer's scores (compose.c). So with topk every head
 * keeps the span (its first tokens when the pick budget k is smaller than
 * the span), with chunk the chunks that hold it, and a head allocator
 * (adakv) gives every head at least the span. Tokens of the span inside the
 * sinks or window are kept by those rules anyway.
 * Parameters: span (int, absent 0: the first token of the span; negative
 * from the end), span_len (int >= 0, absent 0: no span).
 * Decisions: a span longer than the pick budget keeps its first tokens
 * (lower index first, the ties rule of every top-k here).
 * What it is not: spans from the request. The cache view carries only a
 * modality mask per token (core/kvsieve.h kvs_cache_view), and the server's
 * kv_spans (backend/server/spans.c) are byte offsets reported after the
 * fact (span_kept), not an input of methods; a request's spans would need a
 * per-token protect mask in kvs_cache_view passed through kvs_compress to
 * observe (as modality is), and the server / eval / C ABI / kvsieve-hf to
 * fill it. Until then the span is given by parameters.
 */
#include "kvs_parts.h"

static void span_range(const kvs_part_ctx *c, int N, int *a, int *b) {
    const double s = kvs_part_param(c->m, c->p, "span", 0);
    const double len = kvs_part_param(c->m, c->p, "span_len", 0);
    double lo = s < 0 ? (double)N + s : s, hi = lo + (len > 0 ? len : 0);
    if (lo < 0) lo = 0;
    if (hi > N) hi = N;
    if (lo > hi) lo = hi;
    *a = (int)lo;
    *b = (int)hi;
}

static int span_count(const kvs_part_ctx *c, int N, int B) {
    (void)B;
    int a, b;
    span_range(c, N, &a, &b);
    return b - a;
}

const kvs_keep_rule kvs_keep_span = {
    .name = "span", .side = KVS_KEEP_SPAN, .count = span_count, .span = span_range};
