/*
 * compress.c -- kvs_compress / kvs_compress_many: run one method end to end
 * on one cache view, for one budget or several.
 *
 * What it is: the driver every caller uses (CLI, backend, benchmarks):
 * validate the cache, check the method got the inputs it declares it needs,
 * derive the per-layer budget, create / observe each layer / select /
 * destroy, and check the returned plan against the contract (invariants,
 * shape, exact global budget, each layer in [1, N]). kvs_compress_many
 * observes once and selects once per budget (the observation does not depend
 * on the budget), unless the method declares KVS_SELECT_ONCE.
 * What it is not: it does not apply the plan (apply.c) and knows no method.
 */
#include "kvsieve.h"

#include <stdlib.h>
#include <string.h>

/* Shapes, finite values and the method's declared needs; *per_layer[i] for
 * each budget. */
static kvs_status check_inputs(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                               const kvs_budget *b, int n, int threads, kvs_shape *shape,
                               int *per_layer, kvs_err *err) {
    const char *mn = m->name ? m->name : "?";
    kvs_status st;
    /* Shapes, then one threaded NaN/Inf pass over K, V and only the query
     * rows the method reads (SnapKV reads the last w of a cache that may
     * hold all N; full / random / StreamingLLM read none). */
    if ((st = kvs_cache_check_shape(c, shape, err))) return st;
    int q_rows = 0;
    if ((m->needs & (KVS_NEED_Q_ALL | KVS_NEED_Q_WINDOW)) && shape->n_queries > 0) {
        q_rows = m->queries_wanted ? m->queries_wanted(p, shape->n_tokens) : shape->n_queries;
        if (q_rows < 1 || q_rows > shape->n_queries) q_rows = shape->n_queries;
    }
    if ((st = kvs_cache_check_finite(c, q_rows, threads, err))) return st;
    shape->threads = threads >= 1 ? threads : 1;
    const int N = shape->n_tokens;
    if ((m->needs & KVS_NEED_Q_ALL) && shape->n_queries != N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s needs the queries of all N=%d prompt positions; the cache has Nq=%d",
                          mn, N, shape->n_queries);
    if ((m->needs & KVS_NEED_Q_WINDOW) && shape->n_queries < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s needs the queries of the last prompt positions (observation "
                          "window); the cache has Nq=0",
                          mn);
    if (m->needs & KVS_NEED_W_O)
        for (int l = 0; l < c->n_layers; l++) {
            const kvs_view *w = &c->layers[l].wo;
            if (!w->data)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "method %s needs each layer's output projection W_o; layer %d "
                                  "of this cache view has none (the embedded engine provides it; "
                                  "cache files without layers.{l}.wo, the C ABI and kvsieve-hf do "
                                  "not)",
                                  mn, l);
            /* Hq: the queries' when the view has them, else any multiple of Hkv */
            const int hq_ok = shape->n_q_heads ? w->n_heads == shape->n_q_heads
                                               : w->n_heads >= shape->n_kv_heads &&
                                                     w->n_heads % shape->n_kv_heads == 0;
            if (!hq_ok || w->head_dim != shape->head_dim ||
                w->n_tokens < 1 || w->device != KVS_HOST)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "method %s: layer %d: W_o view [%d][%d][%d] on %s does not "
                                  "match [Hq][E>=1][d=%d] on the host (Hq = %d, or a multiple of "
                                  "Hkv = %d without queries)",
                                  mn, l, w->n_heads, w->n_tokens, w->head_dim,
                                  w->device == KVS_HOST ? "the host" : "CUDA", shape->head_dim,
                                  shape->n_q_heads, shape->n_kv_heads);
            if ((st = kvs_view_check_finite(w, "W_o", err)))
                return kvs_err_prefix(err, "method %s: layer %d", mn, l);
        }
    if (m->needs & KVS_NEED_RECON)
        for (int l = 0; l < c->n_layers; l++) {
            const float *r = c->layers[l].attn_recon_max;
            if (!r)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "method %s needs the context-reconstruction statistic "
                                  "(kvs_layer.attn_recon_max: an extra forward pass of the model "
                                  "over the prompt); layer %d of this cache view has none (the "
                                  "embedded engine provides it; cache files without "
                                  "layers.{l}.recon, the recorder, the C ABI and kvsieve-hf do not)",
                                  mn, l);
            for (size_t x = 0; x < (size_t)shape->n_kv_heads * N; x++)
                if (!(r[x] >= 0.0f && r[x] <= 1.0f))
                    return kvs_errorf(err, KVS_ERR_NUMERIC,
                                      "method %s: layer %d: attn_recon_max head %d token %d is %g, "
                                      "not a probability in [0, 1]",
                                      mn, l, (int)(x / (size_t)N), (int)(x % (size_t)N), (double)r[x]);
        }
    for (int i = 0; i < n; i++) {
        if ((st = kvs_budget_per_layer(&b[i], N, &per_layer[i], err))) {
            if (n > 1) kvs_err_prefix(err, "budget %d of %d", i, n);
            return st;
        }
    }
    return KVS_OK;
}

/* The returned plan against the contract; names the method on success. */
static kvs_status check_plan(const kvs_method *m, const kvs_shape *shape, int per_layer,
                             kvs_plan *out, kvs_err *err) {
    const char *mn = m->name ? m->name : "?";
    const int L = shape->n_layers, N = shape->n_tokens;
    kvs_status st;
    if ((st = kvs_plan_check(out, err))) return st;
    if (out->n_layers != L || out->n_kv_heads != shape->n_kv_heads || out->n_tokens != N)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "plan has shape L=%d Hkv=%d N=%d but the cache has L=%d Hkv=%d N=%d",
                          out->n_layers, out->n_kv_heads, out->n_tokens, L, shape->n_kv_heads, N);
    for (int l = 0; l < L; l++)
        if (out->layers[l].budget < 1 || out->layers[l].budget > N)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "plan: layer %d: budget %d is not in [1, N = %d]",
                              l, out->layers[l].budget, N);
    /* A method that keeps everything (the `full` control) is exempt from the
     * budget: its plan must then keep all N tokens of every layer. */
    const int64_t want = (int64_t)L * ((m->needs & KVS_KEEPS_ALL) ? N : per_layer);
    const int64_t got = kvs_plan_total(out);
    if (got != want)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "plan budgets sum to %lld but the budget is %lld (L = %d layers x %d)",
                          (long long)got, (long long)want, L, (int)(want / L));
    if (out->method[0] == '\0') {
        size_t len = strlen(mn);
        if (len >= sizeof out->method) len = sizeof out->method - 1;
        memcpy(out->method, mn, len);
        out->method[len] = '\0';
    }
    return KVS_OK;
}

/* create, observe every layer, then select + check once per budget. */
static kvs_status run(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                      const kvs_shape *shape, const int *per_layer, int n, kvs_plan *out,
                      double *select_ms, kvs_err *err) {
    void *state = NULL;
    kvs_status st = m->create(p, shape, &state, err);
    if (st) return st;
    for (int l = 0; l < shape->n_layers && !st; l++)
        st = m->observe(state, l, &c->layers[l], c->modality, err);
    for (int i = 0; i < n && !st; i++) {
        const double t0 = select_ms ? kvs_now_ms() : 0.0;
        /* select may have allocated part of the plan even on failure: the
         * caller frees every plan on error */
        st = m->select(state, per_layer[i], &out[i], err);
        if (!st) st = check_plan(m, shape, per_layer[i], &out[i], err);
        if (st && n > 1) kvs_err_prefix(err, "budget %d of %d", i, n);
        if (select_ms) select_ms[i] = kvs_now_ms() - t0;
    }
    m->destroy(state);
    return st;
}

kvs_status kvs_compress_many(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                             const kvs_budget *b, int n, int threads, kvs_plan *out,
                             double *select_ms, kvs_err *err) {
    if (!m || !p || !c || !b || !out || n < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_compress: NULL argument or no budget (n = %d)", n);
    memset(out, 0, sizeof *out * (size_t)n);
    const char *mn = m->name ? m->name : "?";
    if (!m->create || !m->observe || !m->select || !m->destroy)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "method %s: incomplete method table", mn);
    if (p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s: parameter set holds %d values but the method declares %d", mn,
                          p->n, m->n_params);
    int *per_layer = malloc(sizeof(int) * (size_t)n); /* [n] */
    if (!per_layer) return kvs_errorf(err, KVS_ERR_NOMEM, "method %s: out of memory", mn);
    kvs_shape shape;
    kvs_status st = check_inputs(m, p, c, b, n, threads, &shape, per_layer, err);
    if (!st) {
        if (m->needs & KVS_SELECT_ONCE) /* the method's declared property: one observe per budget */
            for (int i = 0; i < n && !st; i++) {
                const double t0 = kvs_now_ms();
                st = run(m, p, c, &shape, &per_layer[i], 1, &out[i], NULL, err);
                if (st && n > 1) kvs_err_prefix(err, "budget %d of %d", i, n);
                if (select_ms) select_ms[i] = kvs_now_ms() - t0;
            }
        else
            st = run(m, p, c, &shape, per_layer, n, out, select_ms, err);
    }
    free(per_layer);
    if (st != KVS_OK) {
        for (int i = 0; i < n; i++) kvs_plan_free(&out[i]);
        kvs_err_prefix(err, "method %s", mn);
    }
    return st;
}

kvs_status kvs_compress(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                        const kvs_budget *b, int threads, kvs_plan *out, kvs_err *err) {
    if (!m || !p || !c || !b || !out)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_compress: NULL argument");
    return kvs_compress_many(m, p, c, b, 1, threads, out, NULL, err);
}
