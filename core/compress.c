/*
 * compress.c -- kvs_compress: run one method end to end on one cache view.
 *
 * What it is: the driver every caller uses (CLI, backend, benchmarks):
 * validate the cache, check the method got the inputs it declares it needs,
 * derive the per-layer budget, create / observe each layer / select /
 * destroy, and check the returned plan against the contract (invariants,
 * shape, exact global budget, each layer in [1, N]).
 * What it is not: it does not apply the plan (apply.c) and knows no method.
 */
#include "kvsieve.h"

#include <string.h>

kvs_status kvs_compress(const kvs_method *m, const kvs_params *p, const kvs_cache_view *c,
                        const kvs_budget *b, int threads, kvs_plan *out, kvs_err *err) {
    kvs_status st = KVS_OK;
    void *state = NULL;
    int created = 0, have_plan = 0;

    if (!m || !p || !c || !b || !out)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_compress: NULL argument");
    memset(out, 0, sizeof *out);
    const char *mn = m->name ? m->name : "?";
    if (!m->create || !m->observe || !m->select || !m->destroy)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "method %s: incomplete method table", mn);
    if (p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s: parameter set holds %d values but the method declares %d", mn,
                          p->n, m->n_params);

    kvs_shape shape;
    /* Shapes, then one threaded NaN/Inf pass over K, V and only the query
     * rows the method reads (SnapKV reads the last w of a cache that may
     * hold all N; full / random / StreamingLLM read none). */
    if ((st = kvs_cache_check_shape(c, &shape, err))) goto cleanup;
    int q_rows = 0;
    if ((m->needs & (KVS_NEED_Q_ALL | KVS_NEED_Q_WINDOW)) && shape.n_queries > 0) {
        q_rows = m->queries_wanted ? m->queries_wanted(p, shape.n_tokens) : shape.n_queries;
        if (q_rows < 1 || q_rows > shape.n_queries) q_rows = shape.n_queries;
    }
    if ((st = kvs_cache_check_finite(c, q_rows, threads, err))) goto cleanup;
    shape.threads = threads >= 1 ? threads : 1;
    const int L = shape.n_layers, N = shape.n_tokens;

    if ((m->needs & KVS_NEED_Q_ALL) && shape.n_queries != N) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "method %s needs the queries of all N=%d prompt positions; the cache has Nq=%d",
                        mn, N, shape.n_queries);
        goto cleanup;
    }
    if ((m->needs & KVS_NEED_Q_WINDOW) && shape.n_queries < 1) {
        st = kvs_errorf(err, KVS_ERR_INVALID,
                        "method %s needs the queries of the last prompt positions (observation "
                        "window); the cache has Nq=0",
                        mn);
        goto cleanup;
    }

    int per_layer = 0;
    if ((st = kvs_budget_per_layer(b, N, &per_layer, err))) goto cleanup;

    if ((st = m->create(p, &shape, &state, err))) goto cleanup;
    created = 1;
    for (int l = 0; l < L; l++)
        if ((st = m->observe(state, l, &c->layers[l], c->modality, err))) goto cleanup;
    have_plan = 1; /* select may have allocated part of the plan even on failure */
    if ((st = m->select(state, per_layer, out, err))) goto cleanup;

    if ((st = kvs_plan_check(out, err))) goto cleanup;
    if (out->n_layers != L || out->n_kv_heads != shape.n_kv_heads || out->n_tokens != N) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL,
                        "plan has shape L=%d Hkv=%d N=%d but the cache has L=%d Hkv=%d N=%d",
                        out->n_layers, out->n_kv_heads, out->n_tokens, L, shape.n_kv_heads, N);
        goto cleanup;
    }
    for (int l = 0; l < L; l++) {
        if (out->layers[l].budget < 1 || out->layers[l].budget > N) {
            st = kvs_errorf(err, KVS_ERR_INTERNAL, "plan: layer %d: budget %d is not in [1, N = %d]", l,
                            out->layers[l].budget, N);
            goto cleanup;
        }
    }
    /* A method that keeps everything (the `full` control) is exempt from the
     * budget: its plan must then keep all N tokens of every layer. */
    const int64_t want = (int64_t)L * ((m->needs & KVS_KEEPS_ALL) ? N : per_layer);
    const int64_t got = kvs_plan_total(out);
    if (got != want) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL,
                        "plan budgets sum to %lld but the budget is %lld (L = %d layers x %d)",
                        (long long)got, (long long)want, L, (int)(want / L));
        goto cleanup;
    }
    if (out->method[0] == '\0') {
        size_t len = strlen(mn);
        if (len >= sizeof out->method) len = sizeof out->method - 1;
        memcpy(out->method, mn, len);
        out->method[len] = '\0';
    }

cleanup:
    if (created) m->destroy(state);
    if (st != KVS_OK) {
        if (have_plan) kvs_plan_free(out);
        kvs_err_prefix(err, "method %s", mn);
    }
    return st;
}
