/*
 * select.c -- deterministic top-k, 1-D pooling along tokens, int32 sort.
 *
 * What it is: the selection helpers every scoring method shares.
 *   top-k: each score becomes a 64-bit key (order-preserving float bits on
 *   top, the complement of the index below), so "larger score first, ties to
 *   the lower index" is plain integer order and all keys are distinct. An
 *   introselect finds the k-th largest key in O(n) average (O(n log n) worst
 *   case), and one scan emits every index whose key is >= it: ascending order
 *   for free, no sort of the result.
 *   pooling: stride 1, window [i - k/2, i - k/2 + k - 1] clipped to [0, n);
 *   max with a vectorised O(n*k) loop for k <= 32 and a monotone deque
 *   above, avg with a running sum (O(n)).
 * What it is not: no device code (kernels/ has the GPU top-k).
 */
#include "kvsieve.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- top-k ------------------------------------------------------------- */

/* Monotone map float -> uint32 (for non-NaN input); -0 and +0 map equal. */
static inline uint32_t float_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline uint64_t topk_key(float s, int32_t i) {
    return ((uint64_t)float_key(s) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)i);
}

static void swap_u64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

static void sift_down_u64(uint64_t *a, size_t start, size_t n) {
    size_t r = start;
    for (;;) {
        size_t c = 2 * r + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[r] >= a[c]) return;
        swap_u64(&a[r], &a[c]);
        r = c;
    }
}

static void heapsort_u64(uint64_t *a, size_t n) {
    if (n < 2) return;
    for (size_t s = n / 2; s-- > 0;) sift_down_u64(a, s, n);
    for (size_t e = n - 1; e > 0; e--) {
        swap_u64(&a[0], &a[e]);
        sift_down_u64(a, 0, e);
    }
}

static void insertion_u64(uint64_t *a, size_t n) {
    for (size_t i = 1; i < n; i++) {
        uint64_t x = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] > x) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Rearrange distinct keys a[0..n) so that a[t] holds the value it would have
 * if a were sorted ascending (everything left of t smaller, right larger). */
static void nth_element_u64(uint64_t *a, size_t n, size_t t) {
    size_t lo = 0, hi = n - 1;
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (hi > lo) {
        if (hi - lo < 16) {
            insertion_u64(a + lo, hi - lo + 1);
            return;
        }
        if (depth-- <= 0) { /* adversarial input: fall back to a sort */
            heapsort_u64(a + lo, hi - lo + 1);
            return;
        }
        size_t mid = lo + (hi - lo) / 2;
        uint64_t x = a[lo], y = a[mid], z = a[hi];
        uint64_t p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        size_t i = lo - 1, j = hi + 1; /* Hoare partition; wraps are undone by ++/-- first */
        for (;;) {
            do i++; while (a[i] < p);
            do j--; while (a[j] > p);
            if (i >= j) break;
            swap_u64(&a[i], &a[j]);
        }
        /* a[lo..j] <= p <= a[j+1..hi], lo <= j < hi */
        if (t <= j) hi = j;
        else lo = j + 1;
    }
}

kvs_status kvs_topk_indices(const float *scores, int n, int k, int32_t *out, kvs_err *err) {
    if (n < 0 || k < 0 || k > n)
        return kvs_errorf(err, KVS_ERR_INVALID, "top-k: k = %d of n = %d (need 0 <= k <= n)", k, n);
    if (n > 0 && !scores) return kvs_errorf(err, KVS_ERR_INVALID, "top-k: NULL scores");
    if (k > 0 && !out) return kvs_errorf(err, KVS_ERR_INVALID, "top-k: NULL output");
    for (int i = 0; i < n; i++)
        if (isnan(scores[i]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "top-k: score of token %d is NaN", i);
    if (k == 0) return KVS_OK;
    if (k == n) {
        for (int i = 0; i < n; i++) out[i] = i;
        return KVS_OK;
    }
    uint64_t *keys = malloc((size_t)n * sizeof *keys); /* [n] */
    if (!keys) return kvs_errorf(err, KVS_ERR_NOMEM, "top-k: out of memory for n = %d keys", n);
    for (int i = 0; i < n; i++) keys[i] = topk_key(scores[i], i);
    size_t t = (size_t)(n - k); /* ascending position of the k-th largest */
    nth_element_u64(keys, (size_t)n, t);
    const uint64_t thr = keys[t];
    free(keys);
    int c = 0;
    for (int i = 0; i < n; i++)
        if (topk_key(scores[i], i) >= thr) out[c++] = i;
    assert(c == k);
    return KVS_OK;
}

/* ---- pooling ------------------------------------------------------------ */

/* Window of out[i]: [i - k/2, i - k/2 + k - 1] clipped to [0, n). */

static void pool_max_direct_range(const float *x, int n, int k, float *out, int i0, int i1) {
    const int pad = k / 2;
    for (int i = i0; i < i1; i++) {
        int lo = i - pad < 0 ? 0 : i - pad;
        int hi = i - pad + k - 1 >= n ? n - 1 : i - pad + k - 1;
        float m = x[lo];
        for (int j = lo + 1; j <= hi; j++)
            if (x[j] > m) m = x[j];
        out[i] = m;
    }
}

static void pool_max_direct(const float *x, int n, int k, float *out) {
    pool_max_direct_range(x, n, k, out, 0, n);
}

void kvs_pool1d_max(const float *x, int n, int k, float *out) {
    assert(k >= 1 && n >= 0);
    assert(n == 0 || (x && out && x != out));
    if (n == 0) return;
    enum { DQ_CAP = 1024, SMALL_K = 32 };
    const int pad = k / 2;
    if (k <= SMALL_K || k > DQ_CAP - 1) {
        /* Small windows (SnapKV's 7): offsets outer, tokens inner, a
         * branch-free max the compiler vectorises; O(n*k) but faster than the
         * deque's unpredictable branches. Edges where the window is clipped go
         * through the direct loop. Absurd windows take the direct loop too. */
        int lo_in = pad, hi_in = n - (k - 1 - pad); /* full windows: i in [lo_in, hi_in) */
        if (k > DQ_CAP - 1 || hi_in <= lo_in) {
            pool_max_direct(x, n, k, out);
            return;
        }
        for (int i = lo_in; i < hi_in; i++) out[i] = x[i - pad];
        for (int t = 1; t < k; t++) {
            const float *xs = x + (lo_in - pad + t); /* xs[j] = x[lo_in + j - pad + t] */
            float *os = out + lo_in;
            for (int j = 0; j < hi_in - lo_in; j++) os[j] = xs[j] > os[j] ? xs[j] : os[j];
        }
        pool_max_direct_range(x, n, k, out, 0, lo_in);
        pool_max_direct_range(x, n, k, out, hi_in, n);
        return;
    }
    /* Monotone deque of indices with decreasing values, ring buffer [DQ_CAP]. */
    int dq[DQ_CAP];
    int head = 0, size = 0;
    int next = 0; /* next element to push */
    for (int i = 0; i < n; i++) {
        int hi = i - pad + k - 1;
        if (hi > n - 1) hi = n - 1;
        int lo = i - pad;
        for (; next <= hi; next++) {
            while (size > 0 && x[dq[(head + size - 1) % DQ_CAP]] <= x[next]) size--;
            dq[(head + size) % DQ_CAP] = next;
            size++;
        }
        while (dq[head] < lo) {
            head = (head + 1) % DQ_CAP;
            size--;
        }
        assert(size > 0);
        out[i] = x[dq[head]];
    }
}

void kvs_pool1d_avg(const float *x, int n, int k, float *out) {
    assert(k >= 1 && n >= 0);
    assert(n == 0 || (x && out && x != out));
    if (n == 0) return;
    /* Running sum of the finite values in the window plus counts of the
     * non-finite ones, so an Inf leaving the window does not leave a NaN. */
    double sum = 0.0;
    int n_pinf = 0, n_ninf = 0, n_nan = 0;
    const int pad = k / 2;
    int next = 0, first = 0; /* window holds [first, next) */
    for (int i = 0; i < n; i++) {
        int hi = i - pad + k - 1;
        if (hi > n - 1) hi = n - 1;
        int lo = i - pad < 0 ? 0 : i - pad;
        for (; next <= hi; next++) {
            float v = x[next];
            if (isnan(v)) n_nan++;
            else if (isinf(v)) (v > 0 ? n_pinf++ : n_ninf++);
            else sum += v;
        }
        for (; first < lo; first++) {
            float v = x[first];
            if (isnan(v)) n_nan--;
            else if (isinf(v)) (v > 0 ? n_pinf-- : n_ninf--);
            else sum -= v;
        }
        int cnt = hi - lo + 1;
        if (n_nan || (n_pinf && n_ninf)) out[i] = NAN;
        else if (n_pinf) out[i] = INFINITY;
        else if (n_ninf) out[i] = -INFINITY;
        else out[i] = (float)(sum / cnt);
    }
}

/* ---- int32 sort ---------------------------------------------------------- */

static void insertion_i32(int32_t *a, int n) {
    for (int i = 1; i < n; i++) {
        int32_t v = a[i];
        int j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

static void sift_down_i32(int32_t *a, int start, int n) {
    int r = start;
    for (;;) {
        int c = 2 * r + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[r] >= a[c]) return;
        int32_t t = a[r];
        a[r] = a[c];
        a[c] = t;
        r = c;
    }
}

static void heapsort_i32(int32_t *a, int n) {
    for (int s = n / 2 - 1; s >= 0; s--) sift_down_i32(a, s, n);
    for (int e = n - 1; e > 0; e--) {
        int32_t t = a[0];
        a[0] = a[e];
        a[e] = t;
        sift_down_i32(a, 0, e);
    }
}

static void introsort_i32(int32_t *a, int n, int depth) {
    while (n > 16) {
        if (depth-- <= 0) {
            heapsort_i32(a, n);
            return;
        }
        int32_t x = a[0], y = a[n / 2], z = a[n - 1];
        int32_t p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int i = -1, j = n;
        for (;;) {
            do i++; while (a[i] < p);
            do j--; while (a[j] > p);
            if (i >= j) break;
            int32_t t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        /* a[0..j] <= p <= a[j+1..n); recurse on the smaller part */
        int nl = j + 1, nr = n - j - 1;
        if (nl < nr) {
            introsort_i32(a, nl, depth);
            a += nl;
            n = nr;
        } else {
            introsort_i32(a + nl, nr, depth);
            n = nl;
        }
    }
    insertion_i32(a, n);
}

void kvs_sort_i32(int32_t *a, int n) {
    assert(n >= 0 && (n == 0 || a));
    if (n < 2) return;
    int depth = 0;
    for (int m = n; m > 1; m >>= 1) depth += 2;
    introsort_i32(a, n, depth);
#ifndef NDEBUG
    for (int i = 1; i < n; i++) assert(a[i - 1] < a[i] && "kvs_sort_i32: duplicate index");
#endif
}
