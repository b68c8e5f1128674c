/*
 * grid.c -- expand an experiment into cells with exact keys.
 *
 * What it is: the canonical text that defines a cell (everything that can
 * change its result: experiment, kind, dataset and its generator settings,
 * shape, N, seed or sample, method, every parameter value, budget) and its
 * SHA-256, the key that makes resume exact. Execution-only settings
 * (threads, progress) are not part of it -- except for kind overhead, where
 * the thread count, device, dtype, repetitions and input sets change the
 * measured time and so define the cell.
 * The shard partition (kvs_shard_of) lives here too: it is a function of
 * the same keys, so a shard is the same set of cells on every machine.
 * What it is not: no running, no storage.
 */
#include "kvs_eval.h"
#include "kvs_formats.h"
#include "overhead.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void budget_text(const kvs_budget *b, char *out, size_t n) {
    if (b->tokens > 0)
        snprintf(out, n, "tokens:%lld", (long long)b->tokens);
    else
        snprintf(out, n, "ratio:%.17g", b->ratio);
}

static kvs_status finish(kvs_cell *c, int len, kvs_err *err) {
    if (len < 0 || (size_t)len >= sizeof c->def)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "cell definition longer than %zu bytes", sizeof c->def);
    kvs_sha256_hex(c->def, (size_t)len, c->key);
    return KVS_OK;
}

/* Kind overhead: shape, length, dtype, device, threads, variant, budget.
 * The definition names everything that changes a timing: the input sets
 * (seeds), device, dtype, thread count, repetitions and warm-up. */
static kvs_status expand_overhead(const kvs_experiment *e, kvs_cell **cells, int *n_cells,
                                  kvs_err *err) {
    int nd = e->n_dtypes > 0 ? e->n_dtypes : 1, ndev = e->n_devices > 0 ? e->n_devices : 1;
    int nt = e->n_thread_counts > 0 ? e->n_thread_counts : 1;
    int64_t cap = 0;
    for (int v = 0; v < e->n_variants; v++)
        cap += (e->variants[v].method == &kvs_method_full) ? 1 : e->n_budgets;
    cap *= (int64_t)e->n_shapes * e->n_lengths * nd * ndev * nt;
    if (cap > 10000000)
        return kvs_errorf(err, KVS_ERR_INVALID, "experiment '%s': %lld cells; at most 10,000,000",
                          e->name, (long long)cap);
    if (cap == 0) return KVS_OK;
    kvs_cell *out = calloc((size_t)cap, sizeof *out);
    if (!out) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for %lld cells", (long long)cap);
    char seeds[256] = "";
    for (int i = 0; i < e->n_seeds; i++) {
        size_t l = strlen(seeds);
        snprintf(seeds + l, sizeof seeds - l, "%s%lld", i ? "," : "", (long long)e->seeds[i]);
    }
    int64_t k = 0;
    for (int a = 0; a < e->n_shapes; a++)
        for (int b = 0; b < e->n_lengths; b++)
            for (int di = 0; di < nd; di++)
                for (int dv = 0; dv < ndev; dv++)
                    for (int ti = 0; ti < nt; ti++)
                        for (int v = 0; v < e->n_variants; v++) {
                            const kvs_variant *var = &e->variants[v];
                            const kvs_eval_shape *s = &e->shapes[a];
                            int lim = kvs_overhead_limit(e, var->method->name, s->name);
                            if (lim >= 0 && e->lengths[b] > lim) continue;
                            int is_full = var->method == &kvs_method_full;
                            for (int bi = 0; bi < (is_full ? 1 : e->n_budgets); bi++) {
                                kvs_cell *cell = &out[k++];
                                cell->shape = a, cell->length = b, cell->seed = 0;
                                cell->variant = v, cell->budget = is_full ? -1 : bi;
                                cell->dtype = di, cell->device = dv, cell->threads = ti;
                                char bt[64] = "all";
                                if (!is_full) budget_text(&e->budgets[bi], bt, sizeof bt);
                                int len = snprintf(
                                    cell->def, sizeof cell->def,
                                    "kvsieve-cell 1\nexperiment=%s\nkind=overhead\n"
                                    "dataset=synthetic synth=" KVS_SYNTH_VERSION " outliers=%d sinks=%d image_frac=%.17g "
                                    "input_sets=%s\nshape=%s L=%d Hq=%d Hkv=%d d=%d\n"
                                    "n_tokens=%d\ndevice=%s dtype=%s threads=%d repeats=%d "
                                    "warmup=%d\nmethod=%s\nparams=%s\nbudget=%s\n",
                                    e->name, e->outliers, e->sinks, e->image_frac, seeds, s->name,
                                    s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim,
                                    e->lengths[b], e->n_devices > 0 ? e->devices[dv] : e->device,
                                    kvs_dtype_name(e->n_dtypes > 0 ? e->dtypes[di] : e->dtype),
                                    e->n_thread_counts > 0 ? e->thread_counts[ti] : e->threads,
                                    e->repeats, e->warmup, var->method->name, var->params_json, bt);
                                kvs_status rc = finish(cell, len, err);
                                if (rc) {
                                    free(out);
                                    return rc;
                                }
                            }
                        }
    *cells = out;
    *n_cells = (int)k;
    return KVS_OK;
}

int kvs_shard_of(const char *partition_key, int n_shards) {
    if (n_shards <= 1) return 0;
    char hex[65];
    kvs_sha256_hex(partition_key, strlen(partition_key), hex);
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        char c = hex[i];
        h = h << 4 | (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return (int)(h % (uint64_t)n_shards);
}

kvs_status kvs_grid_expand(const kvs_experiment *e, kvs_cell **cells, int *n_cells, kvs_err *err) {
    *cells = NULL;
    *n_cells = 0;
    if (e->kind == KVS_KIND_OVERHEAD) return expand_overhead(e, cells, n_cells, err);
    int64_t per_instance = 0;
    for (int v = 0; v < e->n_variants; v++)
        per_instance += (e->variants[v].method == &kvs_method_full) ? 1 : e->n_budgets;
    int64_t instances;
    if (e->kind == KVS_KIND_TASK)
        instances = (int64_t)e->n_lengths * e->n_depths * e->per_cell;
    else
        instances = (int64_t)e->n_shapes * e->n_lengths * e->n_seeds;
    int64_t total = instances * per_instance;
    if (total > 10000000)
        return kvs_errorf(err, KVS_ERR_INVALID, "experiment '%s': %lld cells; at most 10,000,000",
                          e->name, (long long)total);
    if (total == 0) return KVS_OK;
    kvs_cell *out = calloc((size_t)total, sizeof *out);
    if (!out) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for %lld cells", (long long)total);
    int64_t k = 0;
    int n_a = e->kind == KVS_KIND_TASK ? 1 : e->n_shapes;
    int n_b = e->n_lengths;
    int n_c = e->kind == KVS_KIND_TASK ? e->n_depths * e->per_cell : e->n_seeds;
    for (int a = 0; a < n_a; a++)
        for (int b = 0; b < n_b; b++)
            for (int c = 0; c < n_c; c++)
                for (int v = 0; v < e->n_variants; v++) {
                    const kvs_variant *var = &e->variants[v];
                    int is_full = var->method == &kvs_method_full;
                    for (int bi = 0; bi < (is_full ? 1 : e->n_budgets); bi++) {
                        kvs_cell *cell = &out[k++];
                        cell->shape = a, cell->length = b, cell->seed = c, cell->variant = v;
                        cell->budget = is_full ? -1 : bi;
                        char bt[64] = "all";
                        if (!is_full) budget_text(&e->budgets[bi], bt, sizeof bt);
                        int len;
                        if (e->kind == KVS_KIND_TASK) {
                            int depth = c / e->per_cell, rep = c % e->per_cell;
                            len = snprintf(cell->def, sizeof cell->def,
                                           "kvsieve-cell 1\nexperiment=%s\nkind=task\n"
                                           "dataset=niah seed=%lld\nmodel=%s\nlength=%d\n"
                                           "depth=%.17g\nsample=%d\nmethod=%s\nparams=%s\n"
                                           "budget=%s\n",
                                           e->name, (long long)e->seeds[0], e->model,
                                           e->lengths[b], e->depths[depth], rep,
                                           var->method->name, var->params_json, bt);
                        } else {
                            const kvs_eval_shape *s = &e->shapes[a];
                            char seed[64];
                            snprintf(seed, sizeof seed, "seed=%lld\n", (long long)e->seeds[c]);
                            len = snprintf(cell->def, sizeof cell->def,
                                           "kvsieve-cell 1\nexperiment=%s\nkind=%s\n"
                                           "dataset=synthetic synth=" KVS_SYNTH_VERSION " queries=%d probes=%d outliers=%d "
                                           "sinks=%d image_frac=%.17g\n"
                                           "shape=%s L=%d Hq=%d Hkv=%d d=%d\nn_tokens=%d\n%s"
                                           "method=%s\nparams=%s\nbudget=%s\n",
                                           e->name, kvs_exp_kind_name(e->kind), e->queries,
                                           e->probes, e->outliers, e->sinks, e->image_frac,
                                           s->name, s->n_layers, s->n_q_heads, s->n_kv_heads,
                                           s->head_dim, e->lengths[b], seed, var->method->name,
                                           var->params_json, bt);
                        }
                        kvs_status rc = finish(cell, len, err);
                        if (rc) {
                            free(out);
                            return rc;
                        }
                    }
                }
    *cells = out;
    *n_cells = (int)total;
    return KVS_OK;
}
