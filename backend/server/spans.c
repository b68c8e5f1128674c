/*
 * spans.c -- the kv_spans request field and the span_kept output per variant.
 *
 * What it is: parsing kv_spans ([{start, end}] byte offsets into a string
 * prompt), mapping each prompt token to the bytes of the prompt it stands for
 * (its pieces laid end to end over the text: a BOS the tokenizer added and a
 * SentencePiece dummy-prefix space cover no bytes), the tokens of each span
 * (those whose bytes overlap it), and per variant the share of each span's
 * tokens its plan kept, per model layer, averaged over KV heads.
 * What it is not: the compression itself (sched.c runs view + compress +
 * apply when spans are asked, so the plan is at hand) or the JSON output.
 */
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_spans_free(gen_req *g) {
    for (int i = 0; g->spans && i < g->n_spans; i++) free(g->spans[i].in);
    free(g->spans);
    g->spans = NULL;
    g->n_spans = 0;
}

/* Byte range [beg[i], end[i]) of the prompt text for each token; -1 when the
 * pieces do not lay out over the text (then the spans cannot be placed). */
static int align_tokens(const kvs_server *s, const char *text, size_t len, const int32_t *toks, int n, int *beg,
                        int *end, int *bad) {
    char piece[256];
    size_t c = 0;
    const int bos = kvs_model_special(s->model)->bos;
    for (int i = 0; i < n; i++) {
        int k = kvs_token_to_piece(s->model, toks[i], 1, piece, (int)sizeof piece);
        if (k < 0 || k > (int)sizeof piece) {
            *bad = i;
            return -1;
        }
        const char *p = piece;
        if (i == 0 && toks[i] == bos && (c + (size_t)k > len || memcmp(text + c, p, (size_t)k) != 0)) {
            beg[i] = end[i] = 0; /* the BOS the tokenizer added: no bytes */
            continue;
        }
        if (c == 0 && k > 0 && p[0] == ' ' && (len == 0 || text[0] != ' ')) {
            p++; /* the dummy prefix space of SentencePiece */
            k--;
        }
        if (c + (size_t)k > len || memcmp(text + c, p, (size_t)k) != 0) {
            *bad = i;
            return -1;
        }
        beg[i] = (int)c;
        c += (size_t)k;
        end[i] = (int)c;
    }
    if (c != len) {
        *bad = n;
        return -1;
    }
    return 0;
}

int srv_parse_spans(const kvs_server *s, const cJSON *root, const char *text, gen_req *g, srv_error *e) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "kv_spans");
    if (!sp || cJSON_IsNull(sp)) return 0;
    if (!text)
        return srv_fail(e, 400, "kv_spans", "kv_spans needs a string prompt (byte offsets into it); this request's "
                        "%s is not one", g->prompt_field);
    if (!cJSON_IsArray(sp)) return srv_fail(e, 400, "kv_spans", "kv_spans must be an array of {start, end}");
    const int n = cJSON_GetArraySize(sp);
    if (n > 64) return srv_fail(e, 400, "kv_spans", "kv_spans: at most 64 spans, got %d", n);
    if (n == 0) return 0;
    const size_t len = strlen(text);
    g->spans = calloc((size_t)n, sizeof *g->spans);
    int *beg = malloc((size_t)g->n_prompt * sizeof *beg), *end = malloc((size_t)g->n_prompt * sizeof *end);
    int rc = 0;
    if (!g->spans || !beg || !end) {
        rc = srv_fail(e, 500, "", "out of memory");
        goto done;
    }
    g->n_spans = n;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sp) {
        char f[32];
        snprintf(f, sizeof f, "kv_spans[%d]", i);
        if (!cJSON_IsObject(it)) {
            rc = srv_fail(e, 400, f, "%s must be an object {start, end}", f);
            goto done;
        }
        long long a, b;
        if (srv_get_int(it, "start", f, -1, 0, (long long)len, &a, e) ||
            srv_get_int(it, "end", f, -1, 0, (long long)len, &b, e)) {
            rc = -1;
            goto done;
        }
        if (a < 0 || b < 0) {
            char ff[48];
            snprintf(ff, sizeof ff, "%s.%s", f, a < 0 ? "start" : "end");
            rc = srv_fail(e, 400, ff, "%s is required", ff);
            goto done;
        }
        if (b <= a) {
            char ff[48];
            snprintf(ff, sizeof ff, "%s.end", f);
            rc = srv_fail(e, 400, ff, "%s must be greater than start (%lld), got %lld", ff, a, b);
            goto done;
        }
        g->spans[i].start = (int)a;
        g->spans[i].end = (int)b;
        g->spans[i].in = calloc((size_t)g->n_prompt, 1);
        if (!g->spans[i].in) {
            rc = srv_fail(e, 500, "", "out of memory");
            goto done;
        }
        i++;
    }
    int bad = -1;
    if (align_tokens(s, text, len, g->prompt, g->n_prompt, beg, end, &bad)) {
        rc = srv_fail(e, 500, "kv_spans", "kv_spans: the prompt's tokens do not lay out over its bytes (at token %d "
                      "of %d), so the spans cannot be placed", bad, g->n_prompt);
        goto done;
    }
    for (int k = 0; k < n; k++) {
        kv_span *p = &g->spans[k];
        for (int t = 0; t < g->n_prompt; t++)
            if (beg[t] < end[t] && beg[t] < p->end && end[t] > p->start) {
                p->in[t] = 1;
                p->n_tokens++;
            }
    }
done:
    free(beg);
    free(end);
    return rc;
}

int srv_span_kept(const kvs_server *s, const gen_req *g, const kvs_plan *plan, const int *layer_map, gen_out *o) {
    const int L = s->info->n_layers;
    if (g->n_spans == 0) return 0;
    o->span_kept = malloc((size_t)g->n_spans * L * sizeof *o->span_kept);
    if (!o->span_kept) return -1;
    for (int i = 0; i < g->n_spans * L; i++) o->span_kept[i] = 1.0;
    if (!plan) return 0;
    for (int pl = 0; pl < plan->n_layers; pl++) {
        const int l = layer_map[pl], H = plan->n_kv_heads;
        for (int k = 0; k < g->n_spans; k++) {
            const kv_span *p = &g->spans[k];
            if (p->n_tokens == 0) continue;
            long long kept = 0;
            for (int h = 0; h < H; h++) {
                int B;
                const int32_t *row = kvs_plan_head(plan, pl, h, &B); /* ragged plans: each head's count */
                for (int j = 0; j < B; j++) kept += row[j] < g->n_prompt && p->in[row[j]]; /* compress_suffix: rows past the prompt */
            }
            o->span_kept[(size_t)k * L + l] = (double)kept / ((double)H * p->n_tokens);
        }
    }
    return 0;
}
