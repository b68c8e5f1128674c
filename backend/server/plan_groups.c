/*
 * plan_groups.c -- one observation per (method, parameters) of a request.
 *
 * What it is: before the variants of a request are compressed, the variants
 * that share a method, its parameter values and compress_local (so the same
 * cache view: the same layers and recorded queries) are grouped, and each
 * group of two or more gets all its plans from one kvs_session_plan_many on
 * the prefill session (one observe, one select per budget). Each plan is byte
 * for byte what the variant's own kvs_session_compress would compute on its
 * copy (the copy holds the same cache; tests/methods1/test_compress_many),
 * so the answers do not change. A variant alone in its group is planned the
 * same way (n = 1), so every plan is known before any is applied and
 * variants whose plans are byte-identical can share one decode
 * (srv_plans_same). A request whose variants prefill different text before
 * the compression (compress_suffix) is planned per branch: the variants of
 * branch b on that branch's session.
 * Timing: a grouped variant's plan_ms is the group's shared time (view +
 * observe, the total less the selects) split evenly over its members, plus
 * its own select; the scheduler adds its own apply + trim (compress_ms).
 * What it is not: applying plans (sched.c, kvs_session_compress_with).
 */
#include "server_internal.h"

#include <stdlib.h>
#include <string.h>

static int same_group(const variant_req *a, const variant_req *b) {
    if (!a->method || !b->method || a->compress_local != b->compress_local) return 0;
    if (a->method != b->method && strcmp(a->method->name, b->method->name) != 0) return 0;
    if (a->params.n != b->params.n) return 0;
    for (int i = 0; i < a->params.n; i++)
        if (a->params.v[i] != b->params.v[i]) return 0;
    return 1;
}

void srv_plans_free(srv_plans *P) {
    for (int i = 0; P->plans && i < P->n; i++) kvs_plan_free(&P->plans[i]);
    free(P->plans);
    free(P->maps);
    free(P->plan_ms);
    free(P->planned);
    memset(P, 0, sizeof *P);
}

int srv_plans_same(const srv_plans *P, int i, int j) {
    if (!P->planned || !P->planned[i] || !P->planned[j]) return 0;
    const kvs_plan *a = &P->plans[i], *b = &P->plans[j];
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads || a->n_tokens != b->n_tokens ||
        a->merge != b->merge || !a->kchan != !b->kchan || a->kchan_dim != b->kchan_dim)
        return 0;
    /* ThinK's key-channel masks change the cache as much as the rows do */
    if (a->kchan && memcmp(a->kchan, b->kchan, (size_t)a->n_layers * (size_t)a->n_kv_heads * (size_t)a->kchan_dim))
        return 0;
    if (memcmp(P->maps + (size_t)i * KVS_MAX_LAYERS, P->maps + (size_t)j * KVS_MAX_LAYERS,
               sizeof(int) * (size_t)a->n_layers))
        return 0;
    for (int l = 0; l < a->n_layers; l++) {
        const kvs_plan_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->budget != y->budget || !x->counts != !y->counts) return 0;
        if (x->counts && memcmp(x->counts, y->counts, sizeof(int32_t) * (size_t)a->n_kv_heads)) return 0;
        for (int h = 0; h < a->n_kv_heads; h++) {
            int nx, ny;
            const int32_t *rx = kvs_plan_head(a, l, h, &nx), *ry = kvs_plan_head(b, l, h, &ny);
            if (nx != ny || memcmp(rx, ry, sizeof(int32_t) * (size_t)nx)) return 0;
        }
    }
    return 1;
}

int srv_plans_make(const kvs_server *s, kvs_session *pre, const gen_req *g, const int *branch, int b, srv_plans *P,
                   int *bad_variant, kvs_err *err) {
    *bad_variant = -1;
    const int nv = g->n_variants;
    if (nv < 2) return KVS_OK;
    if (P->n == 0) {
        P->n = nv;
        P->plans = calloc((size_t)nv, sizeof *P->plans);
        P->maps = calloc((size_t)nv * KVS_MAX_LAYERS, sizeof *P->maps); /* [nv][KVS_MAX_LAYERS] */
        P->plan_ms = calloc((size_t)nv, sizeof *P->plan_ms);
        P->planned = calloc((size_t)nv, 1);
    }
    int *member = malloc(sizeof(int) * (size_t)nv);                 /* the group's variants */
    kvs_budget *budgets = malloc(sizeof(kvs_budget) * (size_t)nv);  /* [members] */
    kvs_plan *plans = calloc((size_t)nv, sizeof *plans);            /* [members] */
    double *sel = malloc(sizeof(double) * (size_t)nv);              /* [members] */
    int map[KVS_MAX_LAYERS];
    kvs_status st = KVS_OK;
    if (!P->plans || !P->maps || !P->plan_ms || !P->planned || !member || !budgets || !plans || !sel) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "compress: out of memory for the plans of %d variants", nv);
        goto cleanup;
    }
    for (int i = 0; i < nv && st == KVS_OK; i++) {
        const variant_req *v = &g->variants[i];
        if (P->planned[i] || branch[i] != b || !v->method || !strcmp(v->method->name, "full")) continue;
        int n = 0;
        for (int k = i; k < nv; k++)
            if (!P->planned[k] && branch[k] == b && same_group(v, &g->variants[k])) {
                member[n] = k;
                budgets[n++] = g->variants[k].budget;
            }
        const kvs_compress_opts co = srv_variant_compress_opts(s, v); /* budgets[] are the group's */
        const double t0 = kvs_now_ms();
        st = kvs_session_plan_many(pre, &co, budgets, n, plans, map, sel, err);
        /* + the prefill's reconstruction pass for a method that reads it (KVzip): shared like the observation */
        const double total = kvs_now_ms() - t0 + (co.method->needs & KVS_NEED_RECON ? kvs_session_recon_ms(pre) : 0.0);
        if (st != KVS_OK) {
            *bad_variant = i;
            break;
        }
        double shared = total;
        for (int m = 0; m < n; m++) shared -= sel[m];
        if (shared < 0) shared = 0;
        for (int m = 0; m < n; m++) {
            const int k = member[m];
            P->plans[k] = plans[m]; /* moved: P owns it now */
            memset(&plans[m], 0, sizeof plans[m]);
            memcpy(P->maps + (size_t)k * KVS_MAX_LAYERS, map, sizeof map);
            P->plan_ms[k] = shared / n + sel[m];
            P->planned[k] = 1;
        }
    }
cleanup:
    free(member);
    free(budgets);
    free(plans);
    free(sel);
    if (st != KVS_OK) srv_plans_free(P);
    return (int)st;
}
