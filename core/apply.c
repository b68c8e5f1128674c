/*
 * apply.c -- turn a plan into a compacted cache: gather the kept rows of
 * every layer and KV head into owned fp32 [Hkv][B_l][d] buffers (ragged
 * plan layers: each head's own count, heads packed, the plan's counts
 * copied to the layer) and, when
 * the plan asks for it, merge every evicted token into its most similar
 * kept token first (LOOK-M / MEDA, spec/methods.md).
 *
 * What it is: kvs_apply / kvs_apply_into (threaded over (layer, KV head)
 * units, re-using the output buffers of an earlier call), kvs_merge_assign (cosine argmax of each evicted key
 * over the kept keys of its head; tiled cblas_sgemm of evicted keys against
 * the unit-normalised kept keys, never an |E| x |C| buffer; ties go to the
 * lower kept slot; a zero key has cosine 0 with everything) and
 * kvs_merge_head (the pivotal / average / weighted formulas, in fp32).
 * A plan with key channel masks (ThinK) gets its pruned K channels zeroed
 * in every kept row, after merging (stored, not packed).
 * Values use the key assignment and the same formula; "weighted" weighs
 * v_e by the key cosine cos(k_e, k_c).
 * What it is not: no selection (methods/), no CUDA path (kernels/), no
 * re-rotation of keys, and queries are not carried over.
 */
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TE = 256,         /* evicted keys per similarity tile */
    TC = 1024,        /* kept keys per similarity tile */
    SLOT_BLOCK = 4096 /* kept slots merged per pass over assign (stack counts) */
};

/* Element (h, n, c) of a host view, as fp32. */
static float view_at(const kvs_view *v, int h, int n, int c) {
    const int64_t o = (int64_t)h * v->s_head + (int64_t)n * v->s_tok + c;
    switch (v->dtype) {
    case KVS_F32: return ((const float *)v->data)[o];
    case KVS_F16: return kvs_f16_to_f32(((const uint16_t *)v->data)[o]);
    case KVS_BF16: return kvs_bf16_to_f32(((const uint16_t *)v->data)[o]);
    default: break;
    }
    assert(0 && "view dtype must be F32, F16 or BF16");
    return 0.0f;
}

static int dtype_ok(kvs_dtype t) { return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16; }

static kvs_status check_host_view(const kvs_view *v, const char *what, kvs_err *err) {
    if (!v->data) return kvs_errorf(err, KVS_ERR_INVALID, "%s has no data", what);
    if (v->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s is device memory; the CPU apply needs host views", what);
    if (!dtype_ok(v->dtype))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s has dtype %s (need F32, F16 or BF16)", what,
                          kvs_dtype_name(v->dtype));
    if (v->n_heads < 1 || v->n_tokens < 1 || v->head_dim < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s has shape [%d][%d][%d]", what, v->n_heads,
                          v->n_tokens, v->head_dim);
    return KVS_OK;
}

/* kept[0..B) sorted ascending, unique, in [0, N). */
static kvs_status check_kept(const int32_t *kept, int B, int N, kvs_err *err) {
    if (!kept) return kvs_errorf(err, KVS_ERR_INVALID, "NULL kept index list");
    if (B < 1 || B > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "kept count B = %d outside [1, N = %d]", B, N);
    for (int b = 0; b < B; b++) {
        if (kept[b] < 0 || kept[b] >= N)
            return kvs_errorf(err, KVS_ERR_INVALID, "kept index %d at slot %d outside [0, %d)",
                              (int)kept[b], b, N);
        if (b > 0 && kept[b] <= kept[b - 1])
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "kept indices not sorted and unique at slot %d (%d after %d)", b,
                              (int)kept[b], (int)kept[b - 1]);
    }
    return KVS_OK;
}

kvs_status kvs_merge_assign(const kvs_view *k, int head, const int32_t *kept, int B,
                            int32_t *assign /* [N] */, kvs_err *err) {
    float *cn = NULL, *et = NULL, *sc = NULL;
    kvs_status st = KVS_OK;
    if (!k || !assign) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_merge_assign: NULL argument");
    st = check_host_view(k, "kvs_merge_assign: k", err);
    if (st) return st;
    if (head < 0 || head >= k->n_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_merge_assign: head %d outside [0, %d)", head,
                          k->n_heads);
    const int N = k->n_tokens, d = k->head_dim;
    st = check_kept(kept, B, N, err);
    if (st) {
        kvs_err_prefix(err, "kvs_merge_assign: head %d", head);
        return st;
    }

    for (int n = 0; n < N; n++) assign[n] = -2; /* -2: evicted, not yet assigned */
    for (int b = 0; b < B; b++) assign[kept[b]] = -1;
    if (B == N) return KVS_OK;

    cn = malloc(sizeof(float) * (size_t)B * (size_t)d); /* [B][d] unit kept keys */
    et = malloc(sizeof(float) * TE * (size_t)d);        /* [TE][d] evicted keys */
    sc = malloc(sizeof(float) * TE * TC);               /* [TE][TC] similarities */
    if (!cn || !et || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "kvs_merge_assign: head %d: no memory (B = %d, d = %d)",
                        head, B, d);
        goto cleanup;
    }
    for (int b = 0; b < B; b++) {
        float *row = cn + (size_t)b * d;
        kvs_view_rows_f32(k, head, kept[b], 1, row);
        double ss = 0.0;
        for (int c = 0; c < d; c++) ss += (double)row[c] * row[c];
        const float inv = ss > 0.0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int c = 0; c < d; c++) row[c] *= inv;
    }
    /* The evicted key's own norm scales its whole row of dot products, so
     * the argmax of k_e . c_hat is the argmax of the cosine. */
    int32_t ev[TE];
    float best[TE];
    int32_t slot[TE];
    int n = 0;
    while (n < N) {
        int ne = 0;
        for (; n < N && ne < TE; n++)
            if (assign[n] == -2) {
                ev[ne] = n;
                kvs_view_rows_f32(k, head, n, 1, et + (size_t)ne * d);
                best[ne] = -INFINITY;
                slot[ne] = -1;
                ne++;
            }
        if (ne == 0) break;
        for (int c0 = 0; c0 < B; c0 += TC) {
            const int cw = B - c0 < TC ? B - c0 : TC;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ne, cw, d, 1.0f, et, d,
                        cn + (size_t)c0 * d, d, 0.0f, sc, TC);
            for (int e = 0; e < ne; e++) {
                const float *row = sc + (size_t)e * TC;
                for (int c = 0; c < cw; c++)
                    if (row[c] > best[e]) { /* strict: ties keep the lower slot */
                        best[e] = row[c];
                        slot[e] = c0 + c;
                    }
            }
        }
        for (int e = 0; e < ne; e++) {
            if (slot[e] < 0) {
                st = kvs_errorf(err, KVS_ERR_NUMERIC,
                                "kvs_merge_assign: head %d token %d: key similarity is NaN (NaN or "
                                "Inf in K)", head, (int)ev[e]);
                goto cleanup;
            }
            assign[ev[e]] = slot[e];
        }
    }
cleanup:
    free(cn);
    free(et);
    free(sc);
    return st;
}

void kvs_merge_head(const kvs_view *k, const kvs_view *v, int head, const int32_t *kept, int B,
                    const int32_t *assign, kvs_merge m, float *kk, float *vv) {
    assert(k && v && kept && assign && kk && vv);
    assert(m >= KVS_MERGE_NONE && m <= KVS_MERGE_WEIGHTED);
    assert(k->n_tokens == v->n_tokens && k->head_dim == v->head_dim);
    assert(head >= 0 && head < k->n_heads && head < v->n_heads);
    assert(B >= 1 && B <= k->n_tokens);
    if (m == KVS_MERGE_NONE) return;
    const int N = k->n_tokens, d = k->head_dim;
    /* kk / vv hold the gathered kept rows; each is accumulated in place to
     * T_c = x_c + sum_e w_e x_e, then finalised with n_c = |S_c|:
     *   average, weighted: T_c / (n+1)
     *   pivotal:  (x_c + sum_e (x_e + x_c)/2) / (n+1) = x_c / 2 + T_c / (2 (n+1))
     * (w_e = cos(k_e, k_c) for weighted, else 1). Counts live on the stack
     * for SLOT_BLOCK slots at a time, so this needs no heap. */
    int32_t cnt[SLOT_BLOCK];
    for (int c0 = 0; c0 < B; c0 += SLOT_BLOCK) {
        const int cw = B - c0 < SLOT_BLOCK ? B - c0 : SLOT_BLOCK;
        memset(cnt, 0, sizeof(int32_t) * (size_t)cw);
        for (int n = 0; n < N; n++) {
            const int a = assign[n];
            if (a < c0 || a >= c0 + cw) continue;
            assert(kept[a] != n);
            cnt[a - c0]++;
            float w = 1.0f;
            if (m == KVS_MERGE_WEIGHTED) {
                double dot = 0.0, ne = 0.0, nc = 0.0;
                for (int c = 0; c < d; c++) {
                    const double xe = view_at(k, head, n, c), xc = view_at(k, head, kept[a], c);
                    dot += xe * xc;
                    ne += xe * xe;
                    nc += xc * xc;
                }
                w = ne > 0.0 && nc > 0.0 ? (float)(dot / sqrt(ne * nc)) : 0.0f;
            }
            float *kr = kk + (size_t)a * d, *vr = vv + (size_t)a * d;
            for (int c = 0; c < d; c++) {
                kr[c] += w * view_at(k, head, n, c);
                vr[c] += w * view_at(v, head, n, c);
            }
        }
        for (int s = 0; s < cw; s++) {
            if (cnt[s] == 0) continue;
            const int a = c0 + s;
            const float inv = 1.0f / (float)(cnt[s] + 1);
            float *kr = kk + (size_t)a * d, *vr = vv + (size_t)a * d;
            if (m == KVS_MERGE_PIVOTAL) {
                for (int c = 0; c < d; c++) {
                    kr[c] = 0.5f * view_at(k, head, kept[a], c) + 0.5f * kr[c] * inv;
                    vr[c] = 0.5f * view_at(v, head, kept[a], c) + 0.5f * vr[c] * inv;
                }
            } else {
                for (int c = 0; c < d; c++) {
                    kr[c] *= inv;
                    vr[c] *= inv;
                }
            }
        }
    }
}

/* One (layer, KV head) unit of kvs_apply_into: gather, then merge. */
typedef struct {
    const kvs_cache_view *in;
    const kvs_plan *plan;
    kvs_dense_cache *out;
    int32_t *assign; /* [threads][N] merge assignment scratch */
    int n_kv_heads;
} apply_job;

static kvs_status apply_unit(void *job, int tid, int u, kvs_err *err) {
    apply_job *j = job;
    const int l = u / j->n_kv_heads, h = u % j->n_kv_heads;
    const kvs_layer *ly = &j->in->layers[l];
    const int N = j->plan->n_tokens, d = ly->k.head_dim;
    int B;
    const int32_t *kept = kvs_plan_head(j->plan, l, h, &B); /* [B]: this head's count (ragged or not) */
    kvs_dense_layer *dl = &j->out->layers[l];
    const int64_t off = kvs_dense_head(dl, h, NULL); /* the same packing as the plan's idx */
    float *kk = dl->k + (size_t)off * d, *vv = dl->v + (size_t)off * d; /* [B][d] */
    kvs_view_gather_f32(&ly->k, h, kept, B, kk);
    kvs_view_gather_f32(&ly->v, h, kept, B, vv);
    if (j->plan->merge != KVS_MERGE_NONE && B < N) {
        int32_t *assign = j->assign + (size_t)tid * N; /* [N] */
        const kvs_status st = kvs_merge_assign(&ly->k, h, kept, B, assign, err);
        if (st) {
            kvs_err_prefix(err, "kvs_apply: layer %d", l);
            return st;
        }
        kvs_merge_head(&ly->k, &ly->v, h, kept, B, assign, j->plan->merge, kk, vv);
    }
    if (j->plan->kchan) { /* pruned key channels (ThinK): zero in every kept row, after merging */
        const uint8_t *m = j->plan->kchan + ((size_t)l * j->n_kv_heads + h) * (size_t)d; /* [d] */
        for (int i = 0; i < B; i++)
            for (int c = 0; c < d; c++)
                if (!m[c]) kk[(size_t)i * d + c] = 0.0f;
    }
    return KVS_OK;
}

/* Makes out hold L layers of [Hkv][B_l][d] fp32 K and V, keeping the buffers
 * of an earlier result that are large enough. */
static kvs_status out_reserve(const kvs_cache_view *in, const kvs_plan *plan, kvs_dense_cache *out,
                              kvs_err *err) {
    const int L = plan->n_layers, Hkv = plan->n_kv_heads, N = plan->n_tokens;
    if (out->layers && out->n_layers != L) kvs_dense_cache_free(out);
    if (!out->layers) {
        out->layers = calloc((size_t)L, sizeof *out->layers); /* [L] */
        if (!out->layers) return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_apply: no memory for %d layers", L);
        out->n_layers = L;
    }
    out->n_tokens = N;
    free(out->modality);
    out->modality = NULL;
    if (in->modality) {
        out->modality = malloc((size_t)N); /* [N] */
        if (!out->modality) return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_apply: no memory for the modality mask");
        memcpy(out->modality, in->modality, (size_t)N);
    }
    for (int l = 0; l < L; l++) {
        const int B = plan->layers[l].budget, d = in->layers[l].k.head_dim;
        kvs_dense_layer *dl = &out->layers[l];
        const int64_t need = (int64_t)Hkv * B * d;
        int64_t have = dl->cap > 0 ? dl->cap : (int64_t)dl->n_kv_heads * dl->n_tokens * dl->head_dim;
        if (!dl->k || !dl->v || have < need) {
            free(dl->k);
            free(dl->v);
            dl->k = malloc(sizeof(float) * (size_t)need); /* [Hkv][B][d] */
            dl->v = malloc(sizeof(float) * (size_t)need); /* [Hkv][B][d] */
            have = need;
            if (!dl->k || !dl->v)
                return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_apply: layer %d: no memory for %d x %d x %d",
                                  l, Hkv, B, d);
        }
        free(dl->counts);
        dl->counts = NULL;
        if (plan->layers[l].counts) {
            dl->counts = malloc(sizeof(int32_t) * (size_t)Hkv); /* [Hkv] */
            if (!dl->counts) return kvs_errorf(err, KVS_ERR_NOMEM, "kvs_apply: layer %d: no memory for counts", l);
            memcpy(dl->counts, plan->layers[l].counts, sizeof(int32_t) * (size_t)Hkv);
        }
        free(dl->q); /* queries are not carried over */
        dl->q = NULL;
        dl->n_q_heads = dl->n_queries = 0;
        dl->cap = have;
        dl->n_tokens = B;
        dl->n_kv_heads = Hkv;
        dl->head_dim = d;
    }
    return KVS_OK;
}

kvs_status kvs_apply_into(const kvs_cache_view *in, const kvs_plan *plan, int threads,
                          kvs_dense_cache *out, kvs_err *err) {
    kvs_status st = KVS_OK;
    apply_job j = {.in = in, .plan = plan, .out = out};
    if (!in || !plan || !out) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_apply: NULL argument");
    st = kvs_plan_check(plan, err);
    if (st) {
        kvs_err_prefix(err, "kvs_apply: plan of %.31s", plan->method);
        goto cleanup;
    }
    if (plan->merge < KVS_MERGE_NONE || plan->merge > KVS_MERGE_WEIGHTED) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "kvs_apply: plan of %s has unknown merge %d",
                        plan->method, (int)plan->merge);
        goto cleanup;
    }
    if (!in->layers || in->n_layers != plan->n_layers) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "kvs_apply: cache has %d layers, plan of %s has %d",
                        in->n_layers, plan->method, plan->n_layers);
        goto cleanup;
    }
    const int L = in->n_layers, N = plan->n_tokens, Hkv = plan->n_kv_heads;
    for (int l = 0; l < L; l++) {
        const kvs_layer *ly = &in->layers[l];
        char what[64];
        snprintf(what, sizeof what, "kvs_apply: layer %d: k", l);
        if ((st = check_host_view(&ly->k, what, err))) goto cleanup;
        snprintf(what, sizeof what, "kvs_apply: layer %d: v", l);
        if ((st = check_host_view(&ly->v, what, err))) goto cleanup;
        if (ly->k.n_heads != Hkv || ly->v.n_heads != Hkv || ly->k.n_tokens != N ||
            ly->v.n_tokens != N || ly->v.head_dim != ly->k.head_dim) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "kvs_apply: layer %d: k [%d][%d][%d] / v [%d][%d][%d] do not match "
                            "the plan (Hkv = %d, N = %d)", l, ly->k.n_heads, ly->k.n_tokens,
                            ly->k.head_dim, ly->v.n_heads, ly->v.n_tokens, ly->v.head_dim, Hkv, N);
            goto cleanup;
        }
        if (plan->kchan && plan->kchan_dim != ly->k.head_dim) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "kvs_apply: layer %d: plan of %s masks %d key channels, the cache has d = %d", l,
                            plan->method, plan->kchan_dim, ly->k.head_dim);
            goto cleanup;
        }
    }
    if ((st = out_reserve(in, plan, out, err))) goto cleanup;

    const int nt = kvs_parallel_threads(threads, L * Hkv);
    if (plan->merge != KVS_MERGE_NONE) {
        j.assign = malloc(sizeof(int32_t) * (size_t)nt * (size_t)N); /* [nt][N] */
        if (!j.assign) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "kvs_apply: no memory for the merge assignment");
            goto cleanup;
        }
    }
    j.n_kv_heads = Hkv;
    st = kvs_parallel_run(&j, apply_unit, L * Hkv, nt, "kvs_apply", err);
cleanup:
    free(j.assign);
    if (st && out) kvs_dense_cache_free(out);
    return st;
}

kvs_status kvs_apply(const kvs_cache_view *in, const kvs_plan *plan, kvs_dense_cache *out,
                     kvs_err *err) {
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_apply: NULL argument");
    memset(out, 0, sizeof *out);
    return kvs_apply_into(in, plan, 1, out, err);
}
