/*
 * fidelity.c -- how well a compressed layer reproduces attention outputs.
 *
 * What it is: kvs_fidelity_layer. Probe queries sit after the prompt, so
 * each sees every token (no causal mask): o = softmax(q K^T / sqrt d) V over
 * the full layer and over the compressed dense layer, and the relative L2
 * error ||o_comp - o_full|| / ||o_full|| per (query head, probe), reported
 * as mean and max. Probes are processed in blocks of PB rows; logits and
 * outputs come from cblas_sgemm on fp32 rows, softmax in fp32 with a double
 * normaliser. The full and the compressed side run the very same code, so a
 * plan that keeps everything (no merge) gives exactly 0.
 * What it is not: no decoding, no positions (probes are given post-RoPE),
 * no threads; memory is O(N) per head (one head's K and V in fp32 plus a
 * [PB][N] logit block), never N x N.
 */
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PB = 64 }; /* probe rows per block */

static int dtype_ok(kvs_dtype t) { return t == KVS_F32 || t == KVS_F16 || t == KVS_BF16; }

static kvs_status check_host_view(const kvs_view *v, const char *what, kvs_err *err) {
    if (!v->data) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_fidelity_layer: %s has no data", what);
    if (v->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_fidelity_layer: %s is device memory (host views only)", what);
    if (!dtype_ok(v->dtype))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_fidelity_layer: %s has dtype %s (need F32, F16 or BF16)", what,
                          kvs_dtype_name(v->dtype));
    if (v->n_heads < 1 || v->n_tokens < 1 || v->head_dim < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_fidelity_layer: %s has shape [%d][%d][%d]",
                          what, v->n_heads, v->n_tokens, v->head_dim);
    return KVS_OK;
}

/* out[np][d] = softmax(scale * pr[np][d] k[n][d]^T) v[n][d]; lg is [np][n]
 * scratch. */
static void attend(const float *pr, int np, const float *k, const float *v, int n, int d,
                   float scale, float *lg, float *out) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, np, n, d, scale, pr, d, k, d, 0.0f, lg, n);
    for (int r = 0; r < np; r++) {
        float *row = lg + (size_t)r * n;
        float mx = row[0];
        for (int j = 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++) row[j] *= inv;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, np, d, n, 1.0f, lg, n, v, d, 0.0f, out, d);
}

kvs_status kvs_fidelity_layer(const kvs_view *probes, const kvs_layer *full,
                              const kvs_dense_layer *comp, double *mean_rel_err,
                              double *max_rel_err, kvs_err *err) {
    float *kf = NULL, *vf = NULL, *pr = NULL, *lg = NULL, *of = NULL, *oc = NULL;
    kvs_status st = KVS_OK;
    if (!probes || !full || !comp || !mean_rel_err || !max_rel_err)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_fidelity_layer: NULL argument");
    if ((st = check_host_view(probes, "probes", err))) return st;
    if ((st = check_host_view(&full->k, "full k", err))) return st;
    if ((st = check_host_view(&full->v, "full v", err))) return st;
    const int Hq = probes->n_heads, P = probes->n_tokens, d = probes->head_dim;
    const int Hkv = full->k.n_heads, N = full->k.n_tokens, B = comp->n_tokens;
    if (full->v.n_heads != Hkv || full->v.n_tokens != N || full->k.head_dim != d ||
        full->v.head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_fidelity_layer: full k [%d][%d][%d], v [%d][%d][%d] and probes "
                          "[%d][%d][%d] do not agree", Hkv, N, full->k.head_dim, full->v.n_heads,
                          full->v.n_tokens, full->v.head_dim, Hq, P, d);
    if (Hq % Hkv != 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_fidelity_layer: %d probe heads is not a multiple of Hkv = %d", Hq, Hkv);
    if (!comp->k || !comp->v || comp->n_kv_heads != Hkv || comp->head_dim != d || B < 1 || B > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_fidelity_layer: compressed layer [%d][%d][%d]%s does not fit the full "
                          "layer [%d][%d][%d]", comp->n_kv_heads, B, comp->head_dim,
                          (!comp->k || !comp->v) ? " without k/v data" : "", Hkv, N, d);
    for (int g = 0; comp->counts && g < Hkv; g++)
        if (comp->counts[g] < 1 || comp->counts[g] > N)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "kvs_fidelity_layer: compressed head %d holds %d rows (need [1, N = %d])", g,
                              (int)comp->counts[g], N);
    const int G = Hq / Hkv;
    const float scale = (float)(1.0 / sqrt((double)d));
    const size_t nd = (size_t)N * (size_t)d;
    kf = malloc(sizeof(float) * nd);                 /* [N][d] full K of one head */
    vf = malloc(sizeof(float) * nd);                 /* [N][d] full V of one head */
    pr = malloc(sizeof(float) * PB * (size_t)d);     /* [PB][d] probes */
    lg = malloc(sizeof(float) * PB * (size_t)N);     /* [PB][N] logits, then p */
    of = malloc(sizeof(float) * PB * (size_t)d);     /* [PB][d] full output */
    oc = malloc(sizeof(float) * PB * (size_t)d);     /* [PB][d] compressed output */
    if (!kf || !vf || !pr || !lg || !of || !oc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "kvs_fidelity_layer: no memory (N = %d, d = %d)", N, d);
        goto cleanup;
    }
    double sum = 0.0, mx = 0.0;
    for (int g = 0; g < Hkv; g++) {
        kvs_view_rows_f32(&full->k, g, 0, N, kf);
        kvs_view_rows_f32(&full->v, g, 0, N, vf);
        int Bg;
        const int64_t off = kvs_dense_head(comp, g, &Bg); /* ragged layers: head g's own rows */
        const float *ck = comp->k + (size_t)off * d, *cv = comp->v + (size_t)off * d;
        for (int hl = 0; hl < G; hl++) {
            const int h = g * G + hl;
            for (int p0 = 0; p0 < P; p0 += PB) {
                const int np = P - p0 < PB ? P - p0 : PB;
                kvs_view_rows_f32(probes, h, p0, np, pr);
                attend(pr, np, kf, vf, N, d, scale, lg, of);
                attend(pr, np, ck, cv, Bg, d, scale, lg, oc);
                for (int r = 0; r < np; r++) {
                    double nf = 0.0, ne = 0.0;
                    for (int c = 0; c < d; c++) {
                        const double a = of[(size_t)r * d + c], b = oc[(size_t)r * d + c];
                        nf += a * a;
                        ne += (b - a) * (b - a);
                    }
                    if (!isfinite(nf) || !isfinite(ne)) {
                        st = kvs_errorf(err, KVS_ERR_NUMERIC,
                                        "kvs_fidelity_layer: query head %d probe %d: attention output "
                                        "is not finite (NaN or Inf in probes, K or V)", h, p0 + r);
                        goto cleanup;
                    }
                    if (nf == 0.0) {
                        st = kvs_errorf(err, KVS_ERR_NUMERIC,
                                        "kvs_fidelity_layer: query head %d probe %d: full attention "
                                        "output is zero, relative error undefined", h, p0 + r);
                        goto cleanup;
                    }
                    const double rel = sqrt(ne / nf);
                    sum += rel;
                    if (rel > mx) mx = rel;
                }
            }
        }
    }
    *mean_rel_err = sum / ((double)Hq * (double)P);
    *max_rel_err = mx;
cleanup:
    free(kf);
    free(vf);
    free(pr);
    free(lg);
    free(of);
    free(oc);
    return st;
}
