/*
 * attn_ref.h -- naive double-precision references for the core_attn tests.
 * These materialise the small Nq x N attention matrix ON PURPOSE: they are
 * the slow, obviously-correct side the tiled O(N) library code is checked
 * against. Test code only; never include from the library.
 */
#ifndef KVS_ATTN_REF_H
#define KVS_ATTN_REF_H

#include "kvsieve.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Random normal data, stored as dtype t in *raw and, rounded through t, as
 * fp32 in *val (what the library sees after conversion). Both [n]. */
static inline void ref_fill(uint64_t *rng, kvs_dtype t, size_t n, double scale, void **raw,
                            float **val) {
    *val = malloc(sizeof(float) * (n ? n : 1));
    *raw = malloc((t == KVS_F32 ? 4 : 2) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float x = (float)(scale * kvs_rng_normal(rng));
        if (t == KVS_F32) {
            ((float *)*raw)[i] = x;
        } else if (t == KVS_F16) {
            uint16_t h = kvs_f32_to_f16(x);
            ((uint16_t *)*raw)[i] = h;
            x = kvs_f16_to_f32(h);
        } else {
            uint16_t h = kvs_f32_to_bf16(x);
            ((uint16_t *)*raw)[i] = h;
            x = kvs_bf16_to_f32(h);
        }
        (*val)[i] = x;
    }
}

/* Logits of query head h (group g = h / G), row i, over all keys j < N into
 * s[N] (causal entries j > p_i set to -INFINITY). q [Hq][Nq][d], k [Hkv][N][d]. */
static inline void ref_logits(const float *q, const float *k, int Hq, int Hkv, int Nq, int N, int d,
                              int h, int i, double *s) {
    const int G = Hq / Hkv, g = h / G, p = N - Nq + i;
    const double sc = 1.0 / sqrt((double)d);
    for (int j = 0; j < N; j++) {
        if (j > p) {
            s[j] = -INFINITY;
            continue;
        }
        double acc = 0.0;
        for (int c = 0; c < d; c++)
            acc += (double)q[((size_t)h * Nq + i) * d + c] * (double)k[((size_t)g * N + j) * d + c];
        s[j] = acc * sc;
    }
}

/* Full probabilities A [Hq][Nq][N] (the test-only N x N matrix). */
static inline double *ref_probs(const float *q, const float *k, int Hq, int Hkv, int Nq, int N, int d,
                                double *lse /* [Hq][Nq] or NULL */) {
    double *A = malloc(sizeof(double) * (size_t)Hq * Nq * N + 8);
    double *s = malloc(sizeof(double) * (size_t)N);
    for (int h = 0; h < Hq; h++)
        for (int i = 0; i < Nq; i++) {
            ref_logits(q, k, Hq, Hkv, Nq, N, d, h, i, s);
            double mx = -INFINITY;
            for (int j = 0; j < N; j++) mx = s[j] > mx ? s[j] : mx;
            double sum = 0.0;
            for (int j = 0; j < N; j++) sum += exp(s[j] - mx);
            const double l = mx + log(sum);
            if (lse) lse[(size_t)h * Nq + i] = l;
            for (int j = 0; j < N; j++) A[((size_t)h * Nq + i) * N + j] = exp(s[j] - l);
        }
    free(s);
    return A;
}

/* Entropy of a[0..n) restricted to entries with use[j] != 0, re-normalised.
 * Returns -1 if no entry is eligible. */
static inline double ref_entropy(const double *a, const int *use, int n) {
    double z = 0.0;
    int cnt = 0;
    for (int j = 0; j < n; j++)
        if (use[j]) {
            z += a[j];
            cnt++;
        }
    if (cnt == 0) return -1.0;
    double h = 0.0;
    for (int j = 0; j < n; j++)
        if (use[j] && a[j] > 0.0) h -= (a[j] / z) * log(a[j] / z);
    return h;
}

/* kvs_attn_entropies reference: Abar = mean over all Hq heads; rows at
 * p = N - Nq + i; mod is [N] or NULL. */
static inline kvs_entropy_stats ref_entropy_stats(const float *q, const float *k, int Hq, int Hkv, int Nq, int N,
                                   int d, const uint8_t *mod) {
    double *A = ref_probs(q, k, Hq, Hkv, Nq, N, d, NULL);
    double *ab = malloc(sizeof(double) * (size_t)N);
    int *use = malloc(sizeof(int) * (size_t)N);
    kvs_entropy_stats r = {0};
    for (int i = 0; i < Nq; i++) {
        const int p = N - Nq + i;
        for (int j = 0; j < N; j++) {
            ab[j] = 0.0;
            for (int h = 0; h < Hq; h++) ab[j] += A[((size_t)h * Nq + i) * N + j];
            ab[j] /= Hq;
            use[j] = j <= p;
        }
        r.plain += ref_entropy(ab, use, N);
        if (!mod) continue;
        const int qtext = mod[p] == KVS_MOD_TEXT;
        const int qvis = mod[p] == KVS_MOD_IMAGE || mod[p] == KVS_MOD_VIDEO;
        if (!qtext && !qvis) continue;
        for (int j = 0; j < N; j++) {
            const int kvis = mod[j] == KVS_MOD_IMAGE || mod[j] == KVS_MOD_VIDEO;
            use[j] = j <= p && (qtext ? kvis : mod[j] == KVS_MOD_TEXT);
        }
        const double h = ref_entropy(ab, use, N);
        if (h < 0.0) continue;
        if (qtext) {
            r.e_tv += h;
            r.n_tv++;
        } else {
            r.e_vt += h;
            r.n_vt++;
        }
    }
    r.plain /= Nq;
    if (r.n_tv) r.e_tv /= (double)r.n_tv;
    if (r.n_vt) r.e_vt /= (double)r.n_vt;
    free(A);
    free(ab);
    free(use);
    return r;
}

#endif
