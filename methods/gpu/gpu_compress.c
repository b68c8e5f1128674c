/*
 * gpu_compress.c -- kvs_gpu_compress (kvs_gpu_methods.h): the GPU entry
 * point of the methods, the device twin of core's kvs_compress.
 *
 * What it is: the checks kvs_compress makes (parameter count, cache shape,
 * the queries a method needs, the budget), the device-side ones of kernels
 * (views, workspace capacity), the dispatch to the method's GPU driver, and
 * the plan contract checked at the end (shape, budget sum, every index).
 * The dispatch table below is keyed by the method's descriptor (what the
 * registry hands out), not by name, and lives beside the drivers rather
 * than in core's kvs_method: core knows nothing of kernels' workspace. A
 * method missing from it has no GPU path: KVS_ERR_UNSUPPORTED "method X:
 * not implemented on GPU", never a silent CPU run.
 * What it is not: no scores or budgets (the drivers), no kernels.
 */
#include "gpu_driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const kvs_method *m;
    kvs_gpu_driver run;
} drivers[] = {
    {&kvs_method_full, kvs_gpu_run_index},    {&kvs_method_random, kvs_gpu_run_index},
    {&kvs_method_streamingllm, kvs_gpu_run_index},
    {&kvs_method_flashcache, kvs_gpu_run_flashcache},
    {&kvs_method_snapkv, kvs_gpu_run_snapkv}, {&kvs_method_h2o, kvs_gpu_run_h2o},
    {&kvs_method_lookm, kvs_gpu_run_lookm},   {&kvs_method_meda, kvs_gpu_run_meda},
};

static kvs_gpu_driver driver_of(const kvs_method *m) {
    for (size_t i = 0; i < sizeof drivers / sizeof drivers[0]; i++)
        if (drivers[i].m == m) return drivers[i].run;
    return NULL;
}

/* Shape, queries and budget, as kvs_compress checks them; the device views
 * and the workspace's capacity (kvs_gpu_begin). */
static kvs_status gpu_prepare(kvs_gpu_ctx *g, const kvs_budget *b, kvs_err *err) {
    const kvs_method *m = g->m;
    if (g->p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "parameter set holds %d values but the method declares %d", g->p->n,
                          m->n_params);
    /* shapes only: device K/V/Q are checked for NaN / Inf on the device
     * (kvs_gpu_check_inputs), which reads the same values kvs_compress scans */
    kvs_status st = kvs_cache_check_shape(g->c, &g->shape, err);
    if (st) return st;
    g->shape.threads = 1;
    if ((m->needs & (KVS_NEED_Q_ALL | KVS_NEED_Q_WINDOW)) && g->shape.n_queries > 0) {
        g->q_rows = m->queries_wanted ? m->queries_wanted(g->p, g->shape.n_tokens)
                                      : g->shape.n_queries;
        if (g->q_rows < 1 || g->q_rows > g->shape.n_queries) g->q_rows = g->shape.n_queries;
    }
    const int N = g->shape.n_tokens;
    if ((st = kvs_gpu_begin(g->ws, g->c, &g->shape, err))) return st;
    if ((m->needs & KVS_NEED_Q_ALL) && g->shape.n_queries != N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s needs the queries of all N=%d prompt positions; the cache "
                          "has Nq=%d",
                          m->name, N, g->shape.n_queries);
    if ((m->needs & KVS_NEED_Q_WINDOW) && g->shape.n_queries < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s needs the queries of the last prompt positions (observation "
                          "window); the cache has Nq=0",
                          m->name);
    return kvs_budget_per_layer(b, N, &g->per_layer, err);
}

/* The contract kvs_compress enforces. */
static kvs_status plan_contract(const kvs_gpu_ctx *g, const kvs_plan *out, kvs_err *err) {
    const int L = g->shape.n_layers, N = g->shape.n_tokens;
    kvs_status st = kvs_plan_check(out, err);
    if (st) return st;
    if (out->n_layers != L || out->n_kv_heads != g->shape.n_kv_heads || out->n_tokens != N)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "plan has shape L=%d Hkv=%d N=%d but the cache has L=%d Hkv=%d N=%d",
                          out->n_layers, out->n_kv_heads, out->n_tokens, L, g->shape.n_kv_heads,
                          N);
    /* a method that keeps everything (KVS_KEEPS_ALL, the `full` control) is
     * exempt from the budget, exactly as in kvs_compress */
    const int64_t want = (int64_t)L * ((g->m->needs & KVS_KEEPS_ALL) ? N : g->per_layer);
    const int64_t got = kvs_plan_total(out);
    if (got != want)
        return kvs_errorf(err, KVS_ERR_INTERNAL,
                          "plan budgets sum to %lld but the budget is %lld (L = %d layers x %d)",
                          (long long)got, (long long)want, L, (int)(want / L));
    return KVS_OK;
}

kvs_status kvs_gpu_compress(const char *method, const kvs_params *p, const kvs_cache_view *c,
                            const kvs_budget *b, kvs_gpu_workspace *ws, kvs_plan *out,
                            kvs_err *err) {
    if (!method || !p || !c || !b || !ws || !out)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_gpu_compress: NULL argument");
    memset(out, 0, sizeof *out);
    const kvs_method *m = NULL;
    if (method[0] == '{') /* a composition's canonical JSON (methods/parts): no driver yet */
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "method %.200s: not implemented on GPU (composed methods); pass host views",
                          method);
    kvs_status st = kvs_method_lookup(method, &m, err);
    if (st) return st;
    kvs_gpu_ctx g;
    memset(&g, 0, sizeof g);
    g.m = m;
    g.p = p;
    g.c = c;
    g.ws = ws;
    const kvs_gpu_driver run = driver_of(m);
    if (!run) { /* refused before any device work */
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "not implemented on GPU (device %s); run it on host memory with "
                        "kvs_compress",
                        kvs_gpu_workspace_device(ws));
        goto cleanup;
    }
    if ((st = gpu_prepare(&g, b, err))) goto cleanup;
    g.desc = calloc((size_t)g.shape.n_layers * (size_t)g.shape.n_kv_heads, sizeof *g.desc);
    if (!g.desc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = run(&g, out, err))) goto cleanup;
    if ((st = plan_contract(&g, out, err))) goto cleanup;
    if (out->method[0] == '\0') snprintf(out->method, sizeof out->method, "%s", m->name);
cleanup:
    free(g.desc);
    if (st) {
        kvs_gpu_reset(ws); /* the stream idle and the error record clear for the next call */
        kvs_plan_free(out);
        kvs_err_prefix(err, "method %s (gpu)", m->name);
    }
    return st;
}
