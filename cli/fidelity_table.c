/*
 * fidelity_table.c -- the comparison `kvsieve fidelity` and `kvsieve demo`
 * print: per method, attention-output error of probe queries (full cache vs
 * compressed), planted-outlier retention, tokens kept and compression time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvsieve.h"

/* Why a method cannot run on this cache, or NULL if it can. */
static const char *unmet_need(const kvs_method *m, const kvs_cache_view *c, char *buf, size_t n) {
    const kvs_layer *l0 = &c->layers[0];
    int N = l0->k.n_tokens, nq = l0->q.data ? l0->q.n_tokens : 0;
    if ((m->needs & KVS_NEED_Q_ALL) && nq != N) {
        snprintf(buf, n, "skipped: needs the queries of all %d positions, the cache has %d", N, nq);
        return buf;
    }
    if ((m->needs & KVS_NEED_Q_WINDOW) && nq == 0) {
        snprintf(buf, n, "skipped: needs observation-window queries, the cache has none");
        return buf;
    }
    if ((m->needs & KVS_NEED_W_O) && !l0->wo.data) {
        snprintf(buf, n, "skipped: needs each layer's output projection W_o, the cache has none");
        return buf;
    }
    if ((m->needs & KVS_NEED_RECON) && !l0->attn_recon_max) {
        snprintf(buf, n, "skipped: needs the engine's context-reconstruction pass, the cache has none");
        return buf;
    }
    return NULL;
}

int kvs_cli_fidelity_table(const kvs_cache_view *c, const kvs_view *probes, const int32_t *outliers,
                           int n_outliers, const kvs_cli_variant *v, int n_variants, const kvs_budget *b,
                           int threads) {
    const int L = c->n_layers;
    const kvs_layer *l0 = &c->layers[0];
    const int N = l0->k.n_tokens;
    kvs_view *pv = calloc((size_t)L, sizeof *pv); /* [L] probe views actually used */
    if (!pv) return 1;
    int stand_in = 0;
    for (int l = 0; l < L; l++) {
        if (probes && probes[l].data) {
            pv[l] = probes[l];
        } else if (c->layers[l].q.data) {
            /* No probes: the last (at most 16) recorded prompt queries stand in. */
            kvs_view q = c->layers[l].q;
            int take = q.n_tokens < 16 ? q.n_tokens : 16;
            q.data = (const char *)q.data + (size_t)(q.n_tokens - take) * (size_t)q.s_tok * kvs_dtype_size(q.dtype);
            q.n_tokens = take;
            pv[l] = q;
            stand_in = 1;
        } else {
            fprintf(stderr, "kvsieve: layer %d has neither probe queries nor recorded queries: "
                            "no attention output to compare (synthesise with --probes or --queries)\n", l);
            free(pv);
            return 1;
        }
    }
    printf("| method | params | kept tokens | attn-output rel. error (mean) | (max) | outliers kept | compress ms |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    int failures = 0;
    for (int i = 0; i < n_variants; i++) {
        const kvs_method *m = v[i].method;
        char pbuf[256] = "", why[160];
        for (int j = 0; j < m->n_params; j++) {
            char val[48];
            kvs_param_format(&m->params[j], v[i].params.v[j], val, sizeof val);
            if (v[i].params.v[j] == m->params[j].def) continue; /* show only non-defaults */
            snprintf(pbuf + strlen(pbuf), sizeof pbuf - strlen(pbuf), "%s%s=%s", pbuf[0] ? " " : "",
                     m->params[j].name, val);
        }
        if (unmet_need(m, c, why, sizeof why)) {
            printf("| %s | %s | %s | | | | |\n", m->name, pbuf, why);
            continue;
        }
        kvs_err err = {0};
        kvs_plan plan = {0};
        kvs_dense_cache cc = {0};
        double t0 = kvs_now_ms();
        if (kvs_compress(m, &v[i].params, c, b, threads, &plan, &err) != KVS_OK) {
            printf("| %s | %s | error: %s | | | | |\n", m->name, pbuf, err.msg);
            failures++;
            continue;
        }
        double ms = kvs_now_ms() - t0;
        double mean = 0, mx = 0;
        int ok = kvs_apply(c, &plan, &cc, &err) == KVS_OK;
        for (int l = 0; ok && l < L; l++) {
            double lm = 0, lx = 0;
            ok = kvs_fidelity_layer(&pv[l], &c->layers[l], &cc.layers[l], &lm, &lx, &err) == KVS_OK;
            mean += lm / L;
            if (lx > mx) mx = lx;
        }
        if (!ok) {
            printf("| %s | %s | error: %s | | | | |\n", m->name, pbuf, err.msg);
            failures++;
        } else {
            char ret[48] = "n/a";
            if (outliers && n_outliers > 0)
                snprintf(ret, sizeof ret, "%.1f%%", 100.0 * kvs_plan_retention(&plan, outliers, n_outliers));
            printf("| %s | %s | %lld/%lld (%.1f%%) | %.4f | %.4f | %s | %.1f |\n", m->name, pbuf,
                   (long long)kvs_plan_total(&plan), (long long)L * N,
                   100.0 * (double)kvs_plan_total(&plan) / ((double)L * N), mean, mx, ret, ms);
        }
        kvs_dense_cache_free(&cc);
        kvs_plan_free(&plan);
    }
    if (stand_in)
        printf("\nprobes: the cache has no probe queries; the last <= 16 recorded prompt queries stand in "
               "(they are also what window-based methods observe, which flatters them).\n");
    free(pv);
    return failures ? 1 : 0;
}
