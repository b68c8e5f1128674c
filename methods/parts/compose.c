/*
 * compose.c -- a composition of parts run as one kvs_method.
 *
 * What it is: create (check the parameter values against their declared
 * ranges, the composition's shape rules, create the scorer), observe (host
 * views only, layers in order, shapes; the scorer writes the layer's
 * [Hkv][N] scores, and a pick rule with an observe hook its [Hkv][N]
 * input, e.g. critical's W_o norms), select (the allocator's layer budgets, the head
 * allocator's per-head counts when the composition has one (a ragged plan),
 * then per layer the protect rules' prefix / suffix and the pick rule on
 * what is between; see kvs_parts.h), destroy.
 * Memory: the scores [L][Hkv][N] (O(N) per head, as h2o; twice that with a
 * pick rule's observe output), the observed layers' views when the scorer
 * scores them all at once (score_layers, after the last layer), the scorer's own
 * O(N) scratch and one pick workspace of N entries; nothing per token is
 * allocated in a loop.
 * GPU: a CUDA view is KVS_ERR_UNSUPPORTED "<method>: layer l: not
 * implemented on GPU" here (observe, before any value is read);
 * kvs_gpu_compress (methods/gpu/) refuses composed methods before any device
 * work ("not implemented on GPU"): they have no GPU driver yet.
 * Statistics: per layer a kvs_layer_stats the allocator reads; the scorer
 * fills what it computes anyway, the allocator's measure the rest.
 * Channel rule (ThinK): its [L][Hkv][d] key channel masks, observed with
 * the layers and copied into the plan (kvs_plan.kchan) with a note that the
 * pruned channels are stored as zeros.
 * Span rule: its tokens among the pick candidates score +inf in a scratch
 * copy of the layer's scores (layer_scores), so select stays repeatable.
 * What it is not: no scoring, allocation or picking of its own (the parts).
 */
#include "kvs_parts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kvs_composition *comp;
    kvs_part_ctx ctx;
    kvs_params params; /* a copy: ctx.p points here */
    void *scorer_state;
    int n_observed;
    float *scores; /* [L][Hkv][N] */
    float *aux;    /* [L][Hkv][N] the pick rule's observe output, or NULL */
    kvs_layer_stats *stats; /* [L] what a data-driven allocator reads */
    const kvs_keep_rule *span; /* the span rule, or NULL */
    float *forced;             /* [Hkv][N] a layer's scores with the span at +inf (span only) */
    kvs_layer *views;          /* [L] the observed layers (a scorer with score_layers only) */
    char note[256];         /* the allocator's line for the plan's note */
    kvs_pick_ws ws;
    uint8_t *kchan; /* [L][Hkv][d] the channel rule's masks, or NULL */
} compose_state;

static kvs_status check_values(const kvs_method *m, const kvs_params *p, kvs_err *err) {
    if (p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: expected %d parameter values, got %d", m->name,
                          m->n_params, p->n);
    for (int i = 0; i < m->n_params; i++) {
        const kvs_param_def *d = &m->params[i];
        const double x = p->v[i];
        int ok = !isnan(x);
        if (ok && (d->type == KVS_PARAM_INT || d->type == KVS_PARAM_FLOAT))
            ok = x >= d->min && x <= d->max && (d->type == KVS_PARAM_FLOAT || x == floor(x));
        if (ok && d->type == KVS_PARAM_BOOL) ok = x == 0.0 || x == 1.0;
        if (ok && d->type == KVS_PARAM_ENUM) {
            int n_choices = 1;
            for (const char *c = d->choices; c && *c; c++) n_choices += *c == '|';
            ok = x >= 0 && x < n_choices && x == floor(x);
        }
        if (!ok)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: parameter %s = %g is out of range", m->name,
                              d->name, x);
    }
    return KVS_OK;
}

int kvs_compose_queries_wanted(const kvs_composition *comp, const kvs_method *m,
                               const kvs_params *p, int N) {
    const int a = comp->scorer->queries_wanted ? comp->scorer->queries_wanted(m, p, N) : 0;
    const int b = comp->allocator->queries_wanted ? comp->allocator->queries_wanted(m, p, N) : 0;
    const int c = comp->channels && comp->channels->queries_wanted ? comp->channels->queries_wanted(m, p, N) : 0;
    const int ab = a > b ? a : b;
    return ab > c ? ab : c;
}

/* The plan's merge: the method's `merge` parameter when it declares one
 * (pivotal|average|weighted|none, LOOK-M's and MEDA's choices), else the
 * composition's. */
static kvs_merge plan_merge(const compose_state *st) {
    static const kvs_merge of[4] = {KVS_MERGE_PIVOTAL, KVS_MERGE_AVERAGE, KVS_MERGE_WEIGHTED,
                                    KVS_MERGE_NONE};
    const double x = kvs_part_param(st->ctx.m, st->ctx.p, "merge", -1);
    return x >= 0 && x < 4 ? of[(int)x] : st->comp->merge;
}

void kvs_compose_destroy(void *state) {
    compose_state *st = state;
    if (!st) return;
    if (st->scorer_state) st->comp->scorer->destroy(st->scorer_state);
    free(st->scores);
    free(st->aux);
    free(st->stats);
    free(st->forced);
    free(st->views);
    free(st->ws.pairs);
    free(st->ws.ibuf);
    free(st->ws.mask);
    free(st->kchan);
    free(st);
}

kvs_status kvs_compose_create(const kvs_composition *comp, const kvs_method *m, const kvs_params *p,
                              const kvs_shape *s, void **state, kvs_err *err) {
    *state = NULL;
    kvs_status rc = check_values(m, p, err);
    if (rc) return rc;
    const int L = s->n_layers, N = s->n_tokens, H = s->n_kv_heads, Hq = s->n_q_heads;
    if (L < 1 || N < 1 || H < 1 || (Hq > 0 && (Hq < H || Hq % H != 0)))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: bad shape L=%d N=%d Hkv=%d Hq=%d", m->name, L,
                          N, H, Hq);
    if (!comp->scorer || !comp->allocator || !comp->pick)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "%s: incomplete composition (scorer, allocator and pick rule are "
                          "required)",
                          m->name);
    if (comp->allocator->stats && !comp->allocator->measure)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "%s: allocator %s reads statistics but cannot "
                          "measure them", m->name, comp->allocator->name);
    int sides[3] = {0, 0, 0};
    static const char *const side_name[3] = {"prefix", "suffix", "span"};
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && comp->keep[i]; i++)
        if (sides[comp->keep[i]->side]++)
            return kvs_errorf(err, KVS_ERR_INTERNAL,
                              "%s: composition has two %s keep rules (at most one each)", m->name,
                              side_name[comp->keep[i]->side]);
    compose_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", m->name);
    st->comp = comp;
    st->params = *p;
    st->ctx.m = m;
    st->ctx.p = &st->params;
    st->ctx.shape = *s;
    if (st->ctx.shape.threads < 1) st->ctx.shape.threads = 1;
    st->ctx.want_stats = comp->allocator->stats;
    st->ctx.note = st->note;
    st->scores = malloc(sizeof(float) * (size_t)L * (size_t)H * (size_t)N);
    st->ctx.scores = st->scores;
    st->stats = calloc((size_t)L, sizeof *st->stats);
    st->ctx.stats = st->stats;
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && comp->keep[i]; i++)
        if (comp->keep[i]->side == KVS_KEEP_SPAN) st->span = comp->keep[i];
    if (st->span) st->forced = malloc(sizeof(float) * (size_t)H * (size_t)N);
    if (comp->scorer->score_layers) st->views = malloc(sizeof(kvs_layer) * (size_t)L);
    st->ws.pairs = malloc(sizeof(kvs_pick_pair) * (size_t)N);
    st->ws.ibuf = malloc(sizeof(int32_t) * (size_t)N);
    st->ws.mask = malloc((size_t)N);
    if (comp->pick && comp->pick->observe)
        st->aux = malloc(sizeof(float) * (size_t)L * (size_t)H * (size_t)N);
    if (comp->channels && !(st->kchan = malloc((size_t)L * (size_t)H * (size_t)(s->head_dim > 0 ? s->head_dim : 1)))) {
        kvs_compose_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for key channel masks", m->name);
    }
    if (!st->scores || !st->stats || (st->span && !st->forced) ||
        (comp->scorer->score_layers && !st->views) || !st->ws.pairs || !st->ws.ibuf || !st->ws.mask ||
        (comp->pick && comp->pick->observe && !st->aux)) {
        kvs_compose_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for [L=%d][Hkv=%d][N=%d] scores",
                          m->name, L, H, N);
    }
    rc = comp->scorer->create(&st->ctx, &st->scorer_state, err);
    if (rc) {
        st->scorer_state = NULL;
        kvs_compose_destroy(st);
        return kvs_err_prefix(err, "%s: scorer %s", m->name, comp->scorer->name);
    }
    *state = st;
    return KVS_OK;
}

kvs_status kvs_compose_observe(void *state, int layer, const kvs_layer *in,
                               const uint8_t *modality, kvs_err *err) {
    compose_state *st = state;
    const char *mn = st->ctx.m->name;
    const kvs_shape *s = &st->ctx.shape;
    if (layer != st->n_observed || layer >= s->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: observe(layer %d) out of order: expected layer %d of %d", mn, layer,
                          st->n_observed, s->n_layers);
    if (in->k.device != KVS_HOST || in->v.device != KVS_HOST ||
        (in->q.data && in->q.device != KVS_HOST))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: layer %d: not implemented on GPU (composed methods have no GPU "
                          "path yet); pass host views",
                          mn, layer);
    if (!in->k.data || !in->v.data || in->k.n_tokens != s->n_tokens ||
        in->k.n_heads != s->n_kv_heads || in->k.head_dim != s->head_dim ||
        in->v.n_tokens != s->n_tokens || in->v.n_heads != s->n_kv_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: K [%d][%d][%d] / V [%d][%d] do not match the shape "
                          "[Hkv=%d][N=%d][d=%d]",
                          mn, layer, in->k.n_heads, in->k.n_tokens, in->k.head_dim, in->v.n_heads,
                          in->v.n_tokens, s->n_kv_heads, s->n_tokens, s->head_dim);
    if (modality && (st->ctx.m->needs & KVS_NEED_MODALITY))
        for (int j = 0; j < s->n_tokens; j++)
            if (modality[j] > KVS_MOD_AUDIO)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: layer %d: modality[%d] = %d is not a KVS_MOD_* value "
                                  "(0 text, 1 image, 2 video, 3 audio)",
                                  mn, layer, j, (int)modality[j]);
    float *sc = st->scores + (size_t)layer * (size_t)s->n_kv_heads * (size_t)s->n_tokens;
    kvs_layer_stats *ls = &st->stats[layer];
    memset(ls, 0, sizeof *ls);
    st->ctx.modality = modality;
    kvs_status rc = KVS_OK;
    if (st->views) { /* every layer at once after the last one */
        st->views[layer] = *in;
        if (layer == s->n_layers - 1)
            rc = st->comp->scorer->score_layers(st->scorer_state, st->views, s->n_layers, st->scores, err);
    } else {
        rc = st->comp->scorer->score(st->scorer_state, layer, in, sc, err);
    }
    const unsigned want = st->ctx.want_stats;
    if (!rc && (ls->have & want) != want) {
        rc = st->comp->allocator->measure(&st->ctx, layer, in, ls, err);
        if (rc) kvs_err_prefix(err, "%s: allocator %s: layer %d", mn, st->comp->allocator->name, layer);
        else ls->have |= want;
    }
    st->ctx.modality = NULL;
    if (rc) return rc;
    if (st->aux) {
        float *ax = st->aux + (size_t)layer * (size_t)s->n_kv_heads * (size_t)s->n_tokens;
        rc = st->comp->pick->observe(&st->ctx, layer, in, ax, err);
        if (rc) return kvs_err_prefix(err, "%s: pick %s: layer %d", mn, st->comp->pick->name, layer);
    }
    if (st->kchan) {
        uint8_t *mk = st->kchan + (size_t)layer * (size_t)s->n_kv_heads * (size_t)s->head_dim; /* [Hkv][d] */
        rc = st->comp->channels->observe(&st->ctx, layer, in, mk, err);
        if (rc) return kvs_err_prefix(err, "channels %s", st->comp->channels->name);
    }
    st->n_observed++;
    return KVS_OK;
}

/* Protected prefix p and suffix q of a layer with budget B < N. */
static void protect(const compose_state *st, int N, int B, int *p, int *q) {
    int room = B;
    *p = *q = 0;
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && st->comp->keep[i]; i++) {
        const kvs_keep_rule *r = st->comp->keep[i];
        if (r->side == KVS_KEEP_SPAN) continue; /* forced into the pick: layer_scores */
        int c = r->count(&st->ctx, N, B);
        if (c < 0) c = 0;
        if (c > room) c = room;
        room -= c;
        if (r->side == KVS_KEEP_PREFIX) *p = c;
        else *q = c;
    }
}

/* Layer l's [Hkv][N] scores as the head allocator and the pick rule see
 * them: the stored ones, or with a span rule a copy in which the span's
 * tokens among the candidates [p, N - q) score +inf (so they are picked
 * first; the stored scores stay as observed, select is repeatable). */
static const float *layer_scores(compose_state *st, int l, int p, int q) {
    const int H = st->ctx.shape.n_kv_heads, N = st->ctx.shape.n_tokens;
    const float *sc = st->scores + (size_t)l * H * (size_t)N;
    if (!st->span) return sc;
    int a = 0, b = 0;
    st->span->span(&st->ctx, N, &a, &b);
    if (a < p) a = p;
    if (b > N - q) b = N - q;
    if (a >= b) return sc;
    memcpy(st->forced, sc, sizeof(float) * (size_t)H * (size_t)N);
    for (int h = 0; h < H; h++)
        for (int j = a; j < b; j++) st->forced[(size_t)h * N + j] = INFINITY;
    return st->forced;
}

kvs_status kvs_compose_select(void *state, int per_layer, kvs_plan *out, kvs_err *err) {
    compose_state *st = state;
    const char *mn = st->ctx.m->name;
    const int L = st->ctx.shape.n_layers, H = st->ctx.shape.n_kv_heads, N = st->ctx.shape.n_tokens;
    if (st->n_observed != L)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: select after %d of %d layers were observed",
                          mn, st->n_observed, L);
    if (per_layer < 1 || per_layer > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: per-layer budget %d outside [1, N=%d]", mn,
                          per_layer, N);
    int *budgets = malloc(sizeof(int) * (size_t)L), *counts = NULL;
    if (!budgets) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", mn);
    st->note[0] = '\0';
    kvs_status rc = st->comp->allocator->allocate(&st->ctx, per_layer, budgets, err);
    if (rc) {
        kvs_err_prefix(err, "%s: allocator %s", mn, st->comp->allocator->name);
        goto cleanup;
    }
    if (st->comp->heads) {
        counts = malloc(sizeof(int) * (size_t)L * (size_t)H); /* [L][Hkv] */
        if (!counts) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", mn);
            goto cleanup;
        }
        for (int l = 0; l < L && !rc; l++) {
            const int B = budgets[l];
            int *cl = counts + (size_t)l * H, p = 0, q = 0;
            if (B < N) protect(st, N, B, &p, &q);
            const int k = B - p - q;
            if (B >= N || k < 1) { /* nothing to move between heads */
                for (int h = 0; h < H; h++) cl[h] = B;
                continue;
            }
            const float *sc = layer_scores(st, l, p, q); /* [Hkv][N] */
            rc = st->comp->heads->split(&st->ctx, l, sc, p, N - q, k, cl, err);
            if (rc) {
                kvs_err_prefix(err, "%s: head allocator %s", mn, st->comp->heads->name);
                goto cleanup;
            }
            for (int h = 0; h < H; h++) cl[h] += p + q;
        }
        rc = kvs_plan_init_ragged(out, mn, L, H, N, counts, err);
    } else
        rc = kvs_plan_init(out, mn, L, H, N, budgets, err);
    if (rc) goto cleanup;
    out->merge = plan_merge(st);
    snprintf(out->note, sizeof out->note, "%s", st->note);
    if (st->kchan && !(rc = kvs_plan_kchan_init(out, st->ctx.shape.head_dim, err))) {
        memcpy(out->kchan, st->kchan, (size_t)L * (size_t)H * (size_t)st->ctx.shape.head_dim);
        const size_t n = strlen(out->note);
        snprintf(out->note + n, sizeof out->note - n, "%skey channels %s: pruned ones stored as zeros "
                 "(memory not freed; kv bytes count a packed store)", n ? "; " : "", st->comp->channels->name);
    }
    for (int l = 0; l < L && !rc; l++) {
        const int B = budgets[l];
        int p = 0, q = 0;
        if (B < N) protect(st, N, B, &p, &q);
        const float *lsc = B < N ? layer_scores(st, l, p, q) : NULL; /* [Hkv][N] */
        for (int h = 0; h < H && !rc; h++) {
            int Bh;
            int32_t *row = kvs_plan_head(out, l, h, &Bh); /* [Bh]; Bh == B without a head allocator */
            const int k = Bh - p - q;
            if (B >= N) {
                for (int j = 0; j < N; j++) row[j] = j;
                continue;
            }
            for (int i = 0; i < p; i++) row[i] = i;
            if (k > 0) {
                const float *sc = lsc + (size_t)h * (size_t)N; /* [N] */
                st->ws.aux = st->aux ? st->aux + ((size_t)l * H + h) * (size_t)N : NULL;
                rc = st->comp->pick->pick(&st->ctx, sc, p, N - q, k, &st->ws, row + p, err);
                if (rc) kvs_err_prefix(err, "%s: layer %d: KV head %d", mn, l, h);
            }
            for (int i = 0; i < q; i++) row[p + k + i] = N - q + i;
        }
    }
    if (rc) kvs_plan_free(out);
cleanup:
    free(budgets);
    free(counts);
    return rc;
}
