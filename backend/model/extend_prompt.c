/*
 * extend_prompt.c -- kvs_session_extend_prompt: the prompt of a prefill
 * session grows by n tokens before any compression (the server's
 * compress_suffix: a query-aware question prefilled on a copy of a shared
 * context prefill).
 *
 * What it is: the recorded queries of every recording layer grown by the n
 * new rows, kvs_session_extend with the record window set over them, the
 * prompt length moved to n_past, trimmed sliding-window layers dropped to
 * what a trim at the new length keeps. Nothing changes on error.
 * What it is not: the forward pass (forward.c), compression (session.c).
 */
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

kvs_status kvs_session_extend_prompt(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int Hq = MI->n_heads, D = MI->head_dim, L = MI->n_layers;
    if (s->n_prompt == 0 || s->n_past != s->n_prompt || s->rec_end)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "extend prompt: the session must hold a prefill and nothing after it (prompt %d, n_past %d%s)",
                          s->n_prompt, s->n_past, s->rec_end ? ", a record window armed" : "");
    if (n < 1) return kvs_errorf(err, KVS_ERR_INVALID, "extend prompt: %d tokens (need >= 1)", n);
    for (int l = 0; l < L; l++)
        if (s->kv[l].compressed) return kvs_errorf(err, KVS_ERR_INVALID, "extend prompt: layer %d is compressed", l);
    /* every recording layer's queries grow by n rows per head: [n_prompt - nq, n_prompt + n) */
    if (L < 1 || L > KVS_MAX_LAYERS) return kvs_errorf(err, KVS_ERR_INTERNAL, "extend prompt: %d layers", L);
    float **grown = calloc((size_t)L, sizeof *grown);
    if (!grown) return kvs_errorf(err, KVS_ERR_NOMEM, "extend prompt: out of memory");
    int rec = 0;
    for (int l = 0; l < L; l++) {
        const kv_layer *c = &s->kv[l];
        if (!c->q || c->nq <= 0) continue;
        const size_t nq2 = (size_t)c->nq + (size_t)n;
        if (!(grown[l] = calloc((size_t)Hq * nq2 * D, sizeof(float)))) {
            for (int k = 0; k < l; k++) free(grown[k]);
            free(grown);
            return kvs_errorf(err, KVS_ERR_NOMEM, "extend prompt: out of memory for %zu queries", nq2);
        }
        for (int h = 0; h < Hq; h++)
            memcpy(grown[l] + (size_t)h * nq2 * D, c->q + (size_t)h * c->nq * D, (size_t)c->nq * D * sizeof(float));
        rec = 1;
    }
    float **old = malloc((size_t)L * sizeof *old);
    if (!old) {
        for (int l = 0; l < L; l++) free(grown[l]);
        free(grown);
        return kvs_errorf(err, KVS_ERR_NOMEM, "extend prompt: out of memory");
    }
    for (int l = 0; l < L; l++) {
        kv_layer *c = &s->kv[l];
        old[l] = c->q;
        if (grown[l]) {
            c->q = grown[l];
            c->nq += n;
        }
    }
    s->rec_end = rec ? s->n_prompt + n : 0; /* positions [n_prompt + n - nq, n_prompt + n) per layer */
    kvs_status st = kvs_session_extend(s, tokens, n, logits, err);
    s->rec_end = 0;
    for (int l = 0; l < L; l++) {
        kv_layer *c = &s->kv[l];
        if (!grown[l]) continue;
        if (st) { /* extend changed nothing: the old record comes back */
            free(c->q);
            c->q = old[l];
            c->nq -= n;
        } else {
            free(old[l]);
        }
    }
    free(old);
    free(grown);
    if (st) return st;
    s->n_prompt = s->n_past;
    kvs_kv_drop_bounded(s, s->n_past); /* trimmed sliding-window layers: what a trim now would keep */
    return KVS_OK;
}
