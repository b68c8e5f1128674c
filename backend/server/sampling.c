/*
 * sampling.c -- next-token sampling and stop rules (see kvs_sampling.h).
 *
 * What it is: argmax, temperature, top-k (a bounded min-heap, O(V log k)),
 * top-p (sorting only the tokens that can be in the nucleus), a seeded draw,
 * and the stop-token / stop-string checks.
 * What it is not: no penalties, no grammar, no model calls. Nothing here
 * allocates after kvs_sampler_init.
 */
#include "kvs_sampling.h"

#include "kvs_backend.h" /* kvs_argmax */

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvs_sampling_defaults(kvs_sampling_params *p) {
    p->temperature = 0.0;
    p->top_k = 0;
    p->top_p = 1.0;
    p->seed = 0;
}

kvs_status kvs_sampling_check(const kvs_sampling_params *p, kvs_err *err) {
    if (!(p->temperature >= 0.0) || !isfinite(p->temperature))
        return kvs_errorf(err, KVS_ERR_INVALID, "temperature must be a finite number >= 0, got %g",
                          p->temperature);
    if (p->top_k < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0 && p->top_p <= 1.0))
        return kvs_errorf(err, KVS_ERR_INVALID, "top_p must be in (0, 1], got %g", p->top_p);
    return KVS_OK;
}

kvs_status kvs_sampler_init(kvs_sampler *s, const kvs_sampling_params *p, int n_vocab,
                            kvs_err *err) {
    memset(s, 0, sizeof *s);
    kvs_status st = kvs_sampling_check(p, err);
    if (st != KVS_OK) return st;
    if (n_vocab < 1) return kvs_errorf(err, KVS_ERR_INVALID, "sampler: n_vocab must be >= 1, got %d", n_vocab);
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    if (!s->cand || !s->prob) {
        kvs_sampler_free(s);
        return kvs_errorf(err, KVS_ERR_NOMEM, "sampler: no memory for %d vocabulary entries", n_vocab);
    }
    return KVS_OK;
}

void kvs_sampler_free(kvs_sampler *s) {
    free(s->cand);
    free(s->prob);
    s->cand = NULL;
    s->prob = NULL;
}

/* a ranks above b: larger value, or equal value and lower id. */
static int ranks_above(double va, int32_t ia, double vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Min-heap (by rank) over parallel arrays id[0..n), val[0..n). */
static void heap_sift_down(int32_t *id, double *val, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_above(val[m], id[m], val[l], id[l])) m = l;
        if (r < n && ranks_above(val[m], id[m], val[r], id[r])) m = r;
        if (m == i) return;
        int32_t ti = id[i];
        id[i] = id[m];
        id[m] = ti;
        double tv = val[i];
        val[i] = val[m];
        val[m] = tv;
        i = m;
    }
}

/* Sort candidates by rank, best first: heap sort on the min-heap, which
 * moves the lowest-ranked to the back at each step. In place, no allocation. */
static void sort_by_rank(int32_t *id, double *val, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) heap_sift_down(id, val, n, i);
    for (int end = n - 1; end > 0; end--) {
        int32_t ti = id[0];
        id[0] = id[end];
        id[end] = ti;
        double tv = val[0];
        val[0] = val[end];
        val[end] = tv;
        heap_sift_down(id, val, end, 0);
    }
}

kvs_status kvs_sampler_sample(kvs_sampler *s, const float *logits, int32_t *token, kvs_err *err) {
    const int V = s->n_vocab;
    assert(s->cand && s->prob);
    const int32_t best = kvs_argmax(logits, V);
    if (best < 0) /* a NaN: name the first one */
        for (int i = 0; i < V; i++)
            if (isnan(logits[i])) return kvs_errorf(err, KVS_ERR_NUMERIC, "sampler: logit of token %d is NaN", i);
    assert(best >= 0);
    const float bestv = logits[best];
    if (s->p.temperature <= 0.0 || s->p.top_k == 1 || V == 1) {
        *token = best;
        return KVS_OK;
    }
    if (isinf(bestv) && bestv > 0) { /* +inf dominates every finite logit */
        *token = best;
        return KVS_OK;
    }
    const double invT = 1.0 / s->p.temperature;
    const double zmax = (double)bestv * invT;
    int32_t *cand = s->cand; /* [n] */
    double *prob = s->prob;  /* [n] */
    int n = 0;

    if (s->p.top_k > 0 && s->p.top_k < V) {
        /* bounded min-heap of the k best scaled logits */
        const int k = s->p.top_k;
        for (int i = 0; i < V; i++) {
            double z = (double)logits[i] * invT;
            if (n < k) {
                cand[n] = i;
                prob[n] = z;
                n++;
                if (n == k)
                    for (int j = k / 2 - 1; j >= 0; j--) heap_sift_down(cand, prob, k, j);
            } else if (ranks_above(z, i, prob[0], cand[0])) {
                cand[0] = i;
                prob[0] = z;
                heap_sift_down(cand, prob, k, 0);
            }
        }
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            prob[j] = exp(prob[j] - zmax);
            sum += prob[j];
        }
        for (int j = 0; j < n; j++) prob[j] /= sum;
    } else {
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)logits[i] * invT - zmax);
        /* Tokens below eps cannot be in the nucleus: their total mass is at
         * most V * eps = 1 - top_p, so the kept ones reach top_p on their own. */
        const double eps = s->p.top_p < 1.0 ? (1.0 - s->p.top_p) / (double)V : 0.0;
        for (int i = 0; i < V; i++) {
            double p = exp((double)logits[i] * invT - zmax) / sum;
            if (p >= eps && p > 0.0) {
                cand[n] = i;
                prob[n] = p;
                n++;
            }
        }
        if (n == 0) { /* every probability underflowed except, at least, the max */
            cand[0] = best;
            prob[0] = 1.0;
            n = 1;
        }
    }

    if (s->p.top_p < 1.0) {
        sort_by_rank(cand, prob, n);
        double cum = 0.0;
        int keep = n;
        for (int j = 0; j < n; j++) {
            cum += prob[j];
            if (cum >= s->p.top_p) {
                keep = j + 1;
                break;
            }
        }
        n = keep;
    }

    double mass = 0.0;
    for (int j = 0; j < n; j++) mass += prob[j];
    double u = kvs_rng_uniform(&s->rng) * mass;
    double acc = 0.0;
    for (int j = 0; j < n; j++) {
        acc += prob[j];
        if (u < acc) {
            *token = cand[j];
            return KVS_OK;
        }
    }
    *token = cand[n - 1]; /* u landed on the rounding edge of the last bucket */
    return KVS_OK;
}

/* ---- stop rules ----------------------------------------------------------- */

void kvs_stop_init(kvs_stop *s, int n_predict) {
    memset(s, 0, sizeof *s);
    s->n_predict = n_predict;
}

void kvs_stop_free(kvs_stop *s) {
    for (int i = 0; i < s->n_strings; i++) free(s->strings[i]);
    s->n_strings = 0;
}

kvs_status kvs_stop_add_token(kvs_stop *s, int32_t tok, kvs_err *err) {
    if (kvs_stop_is_token(s, tok)) return KVS_OK;
    if (s->n_tokens >= KVS_STOP_MAX_TOKENS)
        return kvs_errorf(err, KVS_ERR_INVALID, "stop: more than %d stop tokens", KVS_STOP_MAX_TOKENS);
    s->tokens[s->n_tokens++] = tok;
    return KVS_OK;
}

kvs_status kvs_stop_add_string(kvs_stop *s, const char *str, kvs_err *err) {
    if (!str || !str[0]) return kvs_errorf(err, KVS_ERR_INVALID, "stop: empty stop string");
    if (s->n_strings >= KVS_STOP_MAX_STRINGS)
        return kvs_errorf(err, KVS_ERR_INVALID, "stop: more than %d stop strings", KVS_STOP_MAX_STRINGS);
    size_t n = strlen(str);
    char *c = malloc(n + 1);
    if (!c) return kvs_errorf(err, KVS_ERR_NOMEM, "stop: no memory for a stop string");
    memcpy(c, str, n + 1);
    s->strings[s->n_strings++] = c;
    return KVS_OK;
}

int kvs_stop_is_token(const kvs_stop *s, int32_t tok) {
    for (int i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] == tok) return 1;
    return 0;
}

int kvs_stop_find_string(const kvs_stop *s, const char *text, size_t old_len, size_t len,
                         size_t *cut) {
    assert(old_len <= len);
    int found = -1;
    size_t best = (size_t)-1;
    for (int i = 0; i < s->n_strings; i++) {
        const char *str = s->strings[i];
        size_t m = strlen(str);
        if (m > len) continue;
        /* a new match must end after old_len: start > old_len - m */
        size_t start = old_len >= m ? old_len - m + 1 : 0;
        for (size_t a = start; a + m <= len; a++) {
            if (text[a] == str[0] && memcmp(text + a, str, m) == 0) {
                if (a < best) {
                    best = a;
                    found = i;
                }
                break;
            }
        }
    }
    if (found >= 0) *cut = best;
    return found;
}
