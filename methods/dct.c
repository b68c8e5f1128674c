/*
 * dct.c -- orthonormal DCT-II / DCT-III of d columns of length N via one real
 * FFT per column (FFTW single precision). See dct.h for definitions, layouts
 * and the thread rules.
 *
 * Makhoul's algorithm (any N >= 1). Let Y[k] = sum_n x[n] cos(pi (2n+1) k /
 * (2N)) be the unnormalised DCT-II, so X[k] = a_k Y[k].
 *   permute: v[p] = x[2p] (p < ceil(N/2)), v[N-1-p] = x[2p+1] (p < floor(N/2))
 *   V = FFT_N(v) (real-to-complex, k = 0..N/2), W = exp(-i pi / (2N)):
 *   Y[k] = Re(W^k V[k]) and, by the conjugate symmetry of V, Y[N-k] =
 *   -Im(W^k V[k]); with c = cos(pi k / 2N), s = sin(pi k / 2N), V = a + ib:
 *   Y[k] = c a + s b, Y[N-k] = s a - c b.
 * Inverse: V[k] = W^-k (Y[k] - i Y[N-k]) (Y[N] = 0) = (c y1 + s y2) +
 *   i (s y1 - c y2), v = IFFT_N(V) = c2r(V) / N, then undo the permutation.
 * The orthonormal factors a_k and the 1/N are folded into the twiddles.
 * kvs_dct_lowpass_sqres (FlashCache) runs the same steps on the same FFTW
 * plans column group by column group, fused with the low-pass, the energy
 * and the residual, without the un-permutation: the residual is summed in
 * permuted order and un-permuted once per head ([N], not [d][N]).
 * Routes (kvs_dct_route_for): the N-point real FFT above is FFTW's own
 * (fast when N = 2^a 3^b 5^c; "direct") or, for any other N, where FFTW falls
 * back to Rader's algorithm and is 10-20x slower, Bluestein's: the N-point
 * DFT as a chirp convolution through an FFT of a smooth length M.
 *   w_j = exp(-i pi j^2 / N) (j^2 taken mod 2N, in double), so
 *   e^{-2 pi i n k / N} = w_n w_k conj(w_{k-n}) and, for k in (-K, K),
 *   Z[k] = w_k sum_n (z_n w_n) conj(w_{k-n}): a linear convolution whose
 *   lags k - n span N + 2K - 2 values, so a cyclic one of length
 *   M >= N + 2K - 2 (M = 2^a, 3 2^a or 5 2^a) is exact.
 * Two real columns ride in one complex sequence z = v0 + i v1 and are split
 * with V0[k] = (Z[k] + conj Z[-k]) / 2, V1[k] = (Z[k] - conj Z[-k]) / (2i);
 * the inverse runs the same convolution on conj(Z) (kernel mirrored:
 * Wi[j] = Wf[-j]), z = conj(w_n c_n). The full spectrum needs K = N/2 + 1,
 * M >= 2N - 1; FlashCache's low-pass needs only k < omega, so a plan made
 * with omega (kvs_dct_plan_create_opts) uses K = min(omega, N/2 + 1) there.
 * Split (band_choose): the sum over n splits into P blocks of L = ceil(N/P)
 * tokens, each a convolution of length M >= L + 2K - 2 with its own kernel
 * (lags shifted by the block's first token); the blocks' spectra are summed
 * before the one inverse FFT (forward), or one FFT feeds P inverse FFTs, one
 * per block of output tokens (inverse). P + 1 FFTs of length M instead of
 * two of the unsplit length: at gamma 0.2, N = 1021 runs 3 FFTs of 1024
 * instead of 2 of 2048 (block CPU time -25..-30% here). Results agree
 * with the direct route to float rounding (tests).
 * Direct route, even N (half_route): the real FFT of v is a complex FFT of
 * z[n] = v[2n] + i v[2n+1] (length N/2; the column is already laid out as
 * those pairs) and an O(N) split into the half spectrum (fwd_fft); the
 * inverse merges the half spectrum into N/2 complex values and runs the
 * backward complex FFT straight into the output column (inv_fft).
 * Plan cache: FFTW plans are made once per process and size (direct: per
 * (N, d); Bluestein: per M) in a list guarded by one mutex, executed only
 * through the new-array interface (thread-safe), and never freed: FFTW's
 * planner is process-global state anyway (not re-entrant, with its own
 * wisdom and twiddle caches), so this is the one justified piece of
 * process-wide state; a kvs_dct_plan only holds its scratch and pointers
 * into the cache. Memory: one entry per distinct (N, d) on the direct route
 * (FFTW twiddles, O(N)) and per M on Bluestein's.
 * Speed: the permutation, twiddle and transpose loops are memory-bound
 * streams; GCC's -O2 cost model leaves them scalar, so this file asks GCC for
 * -O3 (loop vectorisation). Results do not depend on it: no reassociation.
 * What it is not: no planning during execution, no thread pool, no GPU.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "dct.h"

#include <assert.h>
#include <fftw3.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the plan cache (process-wide; see the top) ------------------------------ */

/* Direct route, one (N, d): FFTW's plans for all d columns and for the column
 * groups of kvs_dct_lowpass_sqres (g, ng as in the plan). */
typedef struct direct_entry {
    struct direct_entry *next;
    int n, d, g, ng;
    fftwf_plan r2c, c2r;         /* all d columns: v -> V, V -> v */
    fftwf_plan gr2c[2], gc2r[2]; /* groups: 0 full, 1 narrower last (NULL: not used) */
    /* half_route(N): the "r2c" / "c2r" plans are complex FFTs of length N/2
     * on the columns read as N/2 complex pairs (fwd_fft / inv_fft split and
     * merge the half spectra), and tw [N/4 + 1] holds exp(-2 pi i k / N).
     * NULL otherwise (FFTW's r2c / c2r). */
    fftwf_complex *tw;
} direct_entry;

/* Bluestein route, one M: in-place complex FFTs of one sequence. */
typedef struct chirp_entry {
    struct chirp_entry *next;
    int m;
    fftwf_plan fwd, bwd;
} chirp_entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static direct_entry *direct_cache;
static chirp_entry *chirp_cache;

/* A Bluestein band: outputs k in (-K, K) through FFTs of length m, the N
 * inputs (forward) and outputs (inverse) in P blocks of at most L tokens
 * (see bands_choose). */
typedef struct {
    int K, m, P, L;
    const chirp_entry *fft;
    fftwf_complex *wf; /* [2P][m]: per block the FFT of its forward kernel,
                          times 1/m, then (at wf + (P + blk) m) the mirrored
                          one (wf[P m + q] = wf[-q]) */
} band;

struct kvs_dct_plan {
    int n, d, h;         /* h = N/2 + 1 complex outputs per column */
    int hs;              /* column stride of V / Vg (spectrum_stride) */
    kvs_dct_route route;
    float *v;            /* [d][N] permuted columns (r2c input / c2r output) */
    fftwf_complex *V;    /* [d][h] spectra */
    float *t;            /* [d][N] row-major path: transposed block */
    float *cs, *sn;      /* [h] cos, sin of pi k / (2N) */
    float *col, *acc_p;  /* [2N] column coefficients (chirp_lowpass: two), [N] squared residual
                            (kvs_dct_lowpass_sqres) */
    /* Direct route: the cached plans (not owned). kvs_dct_lowpass_sqres
     * works on groups of g columns (the last one has d - (ng - 1) g) so that
     * a group's spectrum and base stay in L2; only where FFTW planned each
     * column exactly as for all d (see same_columns); otherwise g = d and
     * Vg = V, tg = t. Bluestein: g = d. */
    const direct_entry *de;
    int g, ng;
    fftwf_complex *Vg;   /* [g][h] a group's spectra */
    float *tg;           /* [g][N] its low-pass bases (permuted) */
    float *rows;         /* [DCT_CHUNK][d] fp16 / bf16 rows converted to fp32 */
    /* Bluestein route: the full band (K = h) for the plain transforms and the
     * low-pass band (K = min(omega, h), or the full one) of
     * kvs_dct_lowpass_sqres; one sequence of scratch and the chirp. */
    band full, low;
    int omega;           /* the plan's low-pass cut-off, 0: any */
    fftwf_complex *w;    /* [N + max K] chirp w_j, j >= 0 */
    fftwf_complex *a, *b, *c; /* [max m] each: convolution scratch (FFT in, out, sum) */
};

/* Bytes of one column group's working set (its columns of v, spectrum and
 * base: about 12 g N) that kvs_dct_lowpass_sqres aims to keep in L2. */
enum { DCT_GROUP_BYTES = 192 << 10 };
enum { DCT_CHUNK = 32 }; /* tokens per read of a view (L1-sized) */

/* Is n's largest prime factor at most p (p in 2, 3, 5, 7, 11, 13)? */
static int smooth_upto(int n, int p) {
    static const int q[] = {2, 3, 5, 7, 11, 13};
    for (int i = 0; i < 6 && q[i] <= p; i++)
        while (n > 1 && n % q[i] == 0) n /= q[i];
    return n <= 1;
}

/* Direct when N is 5-smooth, or N is even and N/2 13-smooth (the half
 * route's complex FFT of N/2 through FFTW's 7, 11 and 13 codelets: faster
 * than Bluestein's at 78 of 92 such N in 600..2100 here, median block time
 * 0.8x; odd N through FFTW's r2c measured slower). A fixed rule, never a
 * timing. */
kvs_dct_route kvs_dct_route_for(int N) {
    if (smooth_upto(N, 5)) return KVS_DCT_DIRECT;
    return N % 2 == 0 && smooth_upto(N / 2, 13) ? KVS_DCT_DIRECT : KVS_DCT_BLUESTEIN;
}

/* Does plan a (howmany = na columns) compute every column exactly as plan b
 * (howmany = nb)? True when FFTW's printed plans are equal once the count
 * of b is written as that of a: the same solvers and codelets applied per
 * column, so the same float operations (FFTW is deterministic for a given
 * plan). Any other difference (e.g. a buffered solver for few columns) or
 * an allocation failure answers no, which costs speed only (one group). */
static int same_columns(fftwf_plan a, int na, fftwf_plan b, int nb) {
    char *sa = fftwf_sprint_plan(a), *sb = fftwf_sprint_plan(b);
    int same = 0;
    if (sa && sb) {
        char from[24], to[24];
        snprintf(from, sizeof from, "-x%d", nb);
        snprintf(to, sizeof to, "-x%d", na);
        const size_t lf = strlen(from), lt = strlen(to);
        /* sb with every "-x<nb>" not followed by a digit rewritten. */
        const size_t len = strlen(sb);
        char *w = malloc(len / lf * lt + len + 1), *o = w;
        if (w) {
            for (const char *q = sb; *q;) {
                if (!strncmp(q, from, lf) && !(q[lf] >= '0' && q[lf] <= '9')) {
                    memcpy(o, to, lt);
                    o += lt;
                    q += lf;
                } else {
                    *o++ = *q++;
                }
            }
            *o = 0;
            same = !strcmp(sa, w);
            free(w);
        }
    }
    free(sa);
    free(sb);
    return same;
}

static void direct_entry_free(direct_entry *e) {
    if (!e) return;
    free(e->tw);
    if (e->r2c) fftwf_destroy_plan(e->r2c);
    if (e->c2r) fftwf_destroy_plan(e->c2r);
    for (int i = 0; i < 2; i++) {
        if (e->gr2c[i]) fftwf_destroy_plan(e->gr2c[i]);
        if (e->gc2r[i]) fftwf_destroy_plan(e->gc2r[i]);
    }
    free(e);
}

/* Column stride of the spectra: h = N/2 + 1, rounded up to a multiple of 4
 * complex (32 bytes) for even N on the direct route, so every column of the
 * half-length complex FFT's output is as aligned as the first (FFTW's SIMD
 * codelets for a batch need that: unaligned columns measured 2x slower). */
static int half_route(int N);
static int spectrum_stride(int N, kvs_dct_route route) {
    const int h = N / 2 + 1;
    return route == KVS_DCT_DIRECT && half_route(N) ? (h + 3) / 4 * 4 : h;
}

/* Does the direct route run N's real FFTs as complex FFTs of N/2? For even
 * N: FFTW's ESTIMATE plans of a batched complex FFT of N/2 (plus our O(N)
 * split) measured 5-25% faster per (layer, head) block than its r2c / c2r
 * here (N = 640 .. 4096); N/2 = 768, once 6% slower, is faster since the
 * fused low-pass pass (half_lowpass). A fixed rule, never a timing. */
static int half_route(int N) { return N % 2 == 0; }

/* m complex FFTs of length nh[0], column c at in + c idist, out + c odist
 * (out of place; the input is preserved: the forward reads v, which the
 * residual needs again). */
static fftwf_plan plan_half(int *nh, int m, fftwf_complex *in, int idist, fftwf_complex *out,
                            int odist, int sign) {
    return fftwf_plan_many_dft(1, nh, m, in, NULL, 1, idist, out, NULL, 1, odist, sign,
                               FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
}

/* Plans the direct route for (N, d), on scratch arrays allocated like a
 * plan's (fftwf_malloc: the same alignment, which is all the new-array
 * execute functions require). Chooses the column group: a group starts at
 * v + c0 N with c0 a multiple of g, so g N floats are made a multiple of 64
 * bytes. Called with cache_mu held. */
static kvs_status direct_plan(int N, int d, direct_entry **out, kvs_err *err) {
    kvs_status st = KVS_OK;
    const size_t nd = (size_t)N * (size_t)d;
    direct_entry *e = calloc(1, sizeof *e);
    float *v = fftwf_malloc(sizeof(float) * nd), *t = fftwf_malloc(sizeof(float) * nd);
    const int hs = spectrum_stride(N, KVS_DCT_DIRECT);
    fftwf_complex *V = fftwf_malloc(sizeof(fftwf_complex) * (size_t)hs * (size_t)d);
    if (!e || !v || !t || !V) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
        goto done;
    }
    e->n = N;
    e->d = d;
    int n[1] = {N};
    /* PRESERVE_INPUT is r2c's default anyway; kvs_dct_lowpass_sqres relies on
     * it (v still holds x after the forward FFT). */
    const int H = N / 2, half = half_route(N);
    int nh[1] = {H};
    if (half) {
        e->tw = malloc(sizeof(fftwf_complex) * (size_t)(H / 2 + 1));
        if (!e->tw) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
            goto done;
        }
        for (int k = 0; k <= H / 2; k++) { /* exact at k = 0 and 4k = N */
            const double a = -2.0 * 3.14159265358979323846 * (double)k / (double)N;
            e->tw[k][0] = k == 0 ? 1.0f : 4 * k == N ? 0.0f : (float)cos(a);
            e->tw[k][1] = k == 0 ? 0.0f : 4 * k == N ? -1.0f : (float)sin(a);
        }
    }
    e->r2c = half ? plan_half(nh, d, (fftwf_complex *)v, H, V, hs, FFTW_FORWARD)
                  : fftwf_plan_many_dft_r2c(1, n, d, v, NULL, 1, N, V, NULL, 1, hs,
                                            FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
    e->c2r = half ? plan_half(nh, d, V, hs, (fftwf_complex *)v, H, FFTW_BACKWARD)
                  : fftwf_plan_many_dft_c2r(1, n, d, V, NULL, 1, hs, v, NULL, 1, N, FFTW_ESTIMATE);
    if (!e->r2c || !e->c2r) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL, "dct: FFTW could not plan N=%d d=%d", N, d);
        goto done;
    }
    int g = (int)(DCT_GROUP_BYTES / (12 * (int64_t)N));
    g = g < 8 ? 8 : g - g % 8;
    if ((int64_t)g * N % 16) g = (g + 15) / 16 * 16;
    e->g = d;
    e->ng = 1;
    if (g < d) {
        const int ng = (d + g - 1) / g, last = d - (ng - 1) * g;
        int ok = 1;
        for (int i = 0; i < (last == g ? 1 : 2) && ok; i++) {
            const int m = i ? last : g;
            e->gr2c[i] = half ? plan_half(nh, m, (fftwf_complex *)v, H, V, hs, FFTW_FORWARD)
                              : fftwf_plan_many_dft_r2c(1, n, m, v, NULL, 1, N, V, NULL, 1, hs,
                                                        FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
            e->gc2r[i] = half ? plan_half(nh, m, V, hs, (fftwf_complex *)t, H, FFTW_BACKWARD)
                              : fftwf_plan_many_dft_c2r(1, n, m, V, NULL, 1, hs, t, NULL, 1, N,
                                                        FFTW_ESTIMATE);
            if (!e->gr2c[i] || !e->gc2r[i]) {
                st = kvs_errorf(err, KVS_ERR_INTERNAL,
                                "dct: FFTW could not plan %d columns of N=%d", m, N);
                goto done;
            }
            ok = same_columns(e->gr2c[i], m, e->r2c, d) && same_columns(e->gc2r[i], m, e->c2r, d);
        }
        if (ok) {
            e->g = g;
            e->ng = ng;
        } else { /* FFTW planned a group differently: one group */
            for (int i = 0; i < 2; i++) {
                if (e->gr2c[i]) fftwf_destroy_plan(e->gr2c[i]);
                if (e->gc2r[i]) fftwf_destroy_plan(e->gc2r[i]);
                e->gr2c[i] = e->gc2r[i] = NULL;
            }
        }
    }
    *out = e;
    e = NULL;
done:
    direct_entry_free(e);
    fftwf_free(v);
    fftwf_free(t);
    fftwf_free(V);
    return st;
}

static kvs_status chirp_plan(int m, chirp_entry **out, kvs_err *err) {
    chirp_entry *e = calloc(1, sizeof *e);
    fftwf_complex *a = fftwf_malloc(sizeof(fftwf_complex) * (size_t)m);
    fftwf_complex *b = fftwf_malloc(sizeof(fftwf_complex) * (size_t)m);
    kvs_status st = KVS_OK;
    if (!e || !a || !b) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning an FFT of %d", m);
    } else {
        /* out of place (a -> b, b -> a): FFTW's in-place plans of these
         * sizes add a copy */
        e->m = m;
        e->fwd = fftwf_plan_dft_1d(m, a, b, FFTW_FORWARD, FFTW_ESTIMATE);
        e->bwd = fftwf_plan_dft_1d(m, b, a, FFTW_BACKWARD, FFTW_ESTIMATE);
        if (!e->fwd || !e->bwd)
            st = kvs_errorf(err, KVS_ERR_INTERNAL, "dct: FFTW could not plan an FFT of %d", m);
    }
    if (st && e) {
        if (e->fwd) fftwf_destroy_plan(e->fwd);
        if (e->bwd) fftwf_destroy_plan(e->bwd);
        free(e);
        e = NULL;
    }
    fftwf_free(a);
    fftwf_free(b);
    *out = e;
    return st;
}

/* The cached entry for (N, d) / for m, planned on first use. */
static kvs_status cache_get(int N, int d, int m, const direct_entry **de, const chirp_entry **ce,
                            kvs_err *err) {
    /* FFTW's planner is not re-entrant and other code in the process may
     * plan too: make it thread-safe once (fftw3f_threads), and serialise
     * this cache's planning with its own mutex. */
    static pthread_once_t planner_once = PTHREAD_ONCE_INIT;
    pthread_once(&planner_once, fftwf_make_planner_thread_safe);
    kvs_status st = KVS_OK;
    pthread_mutex_lock(&cache_mu);
    if (de) {
        direct_entry *e = direct_cache;
        while (e && !(e->n == N && e->d == d)) e = e->next;
        if (!e && !(st = direct_plan(N, d, &e, err))) {
            e->next = direct_cache;
            direct_cache = e;
        }
        *de = e;
    } else {
        chirp_entry *e = chirp_cache;
        while (e && e->m != m) e = e->next;
        if (!e && !(st = chirp_plan(m, &e, err))) {
            e->next = chirp_cache;
            chirp_cache = e;
        }
        *ce = e;
    }
    pthread_mutex_unlock(&cache_mu);
    return st;
}

int kvs_dct_plan_cache_entries(void) {
    int n = 0;
    pthread_mutex_lock(&cache_mu);
    for (const direct_entry *e = direct_cache; e; e = e->next) n++;
    for (const chirp_entry *e = chirp_cache; e; e = e->next) n++;
    pthread_mutex_unlock(&cache_mu);
    return n;
}

/* ---- Bluestein's chirp convolution ------------------------------------------ */

/* The smallest 2^a, 3 2^a or 5 2^a >= need (FFTW's fastest complex sizes),
 * except that 768 and 1536 give way to 1024 and 2048: FFTW's ESTIMATE plans
 * for those two run slower than the next power of two (measured here, CPU
 * time of a forward + backward pair: 768 3.2 us vs 1024 2.9; 1536 5.2-7.0 us
 * vs 2048 4.5-6.7; at 3072 and 6144 the 3 2^a plan wins again). Fixed per
 * need, so the numbers never depend on a timing. */
static int smooth_size(int need) {
    int best = 0;
    for (int f = 1; f <= 5; f += 2) { /* 1, 3, 5 */
        int64_t m = f;
        while (m < need) m *= 2;
        if (m <= INT32_MAX && (best == 0 || m < best)) best = (int)m;
    }
    if (best == 768 || best == 1536) best = best / 3 * 4;
    return best;
}

/* Estimated cost of one band through P blocks: P + 1 FFTs of length m (P
 * block FFTs and one to go back, or one and P back), m log2 m each, times
 * 1.5 for the 3 2^a and 5 2^a lengths (FFTW's plans for those measured
 * 1.3-2.3x slower per point here). A formula, never a timing. */
static double band_cost(int P, int m) {
    double c = (double)(P + 1) * m * log2((double)m);
    return (m & (m - 1)) ? 1.5 * c : c;
}

/* How a band of K outputs is split: P blocks of L = ceil(N / P) inputs
 * each need a cyclic convolution of only m >= L + 2K - 2, so when K is
 * well below N (FlashCache's low band, K ~ gamma N) two blocks through
 * FFTs of half the length beat one: e.g. N = 1021, K = 204: one block
 * needs m = 2048 (two FFTs), two blocks m = 1024 (three FFTs). P in 1..4,
 * the cheapest by band_cost (ties: fewer blocks). */
static void band_choose(int N, int K, int *P, int *L, int *m) {
    double best = 0.0;
    for (int q = 1; q <= 4 && q <= N; q++) {
        const int l = (N + q - 1) / q, mm = smooth_size(l + 2 * K - 2);
        if ((N + l - 1) / l != q) continue; /* q blocks of l would leave one empty */
        const double c = band_cost(q, mm);
        if (q == 1 || c < best) {
            best = c;
            *P = q;
            *L = l;
            *m = mm;
        }
    }
}

/* Band (-K, K) of plan p: its split, FFT length, cached FFTs and kernel
 * spectra. Block blk (tokens nb = blk L .. nb + L - 1): kernel
 * b[j mod m] = conj(w_|j - nb|) for lags j in [-(L-1)-(K-1), K-1],
 * wf = FFT_m(b) / m, and its mirror (the inverse's kernel for output block
 * blk: conj(w_|nb + j|)). With P = 1 this is the unsplit kernel. Uses p->w
 * (long enough) and p->b (>= m). */
static kvs_status band_init(kvs_dct_plan *p, int K, band *b, kvs_err *err) {
    const int N = p->n;
    b->K = K;
    band_choose(N, K, &b->P, &b->L, &b->m);
    kvs_status st = cache_get(0, 0, b->m, NULL, &b->fft, err);
    if (st) return st;
    const int m = b->m, P = b->P, L = b->L, neg = L + K - 2; /* lags -neg .. K-1 */
    b->wf = fftwf_malloc(sizeof(fftwf_complex) * 2 * (size_t)P * (size_t)m);
    if (!b->wf) return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d", N);
    for (int blk = 0; blk < P; blk++) {
        const int nb = blk * L;
        fftwf_complex *f = b->wf + (size_t)blk * m, *mir = b->wf + (size_t)(P + blk) * m;
        memset(f, 0, sizeof(fftwf_complex) * (size_t)m);
        for (int j = -neg; j < K; j++) {
            const int q = j - nb < 0 ? nb - j : j - nb; /* <= P L + K - 3 */
            const int at = j < 0 ? m + j : j;
            f[at][0] = p->w[q][0];
            f[at][1] = -p->w[q][1];
        }
        fftwf_execute_dft(b->fft->fwd, f, p->b);
        const float inv = (float)(1.0 / m);
        for (int j = 0; j < m; j++) {
            f[j][0] = p->b[j][0] * inv;
            f[j][1] = p->b[j][1] * inv;
        }
        for (int q = 0; q < m; q++) {
            mir[q][0] = f[q ? m - q : 0][0];
            mir[q][1] = f[q ? m - q : 0][1];
        }
    }
    return KVS_OK;
}

/* F = G * K (first block) or F += G * K (later blocks), m complex. */
static inline void cmul_acc(float *restrict F, const float *restrict G, const float *restrict K,
                            int m, int first) {
    if (first) {
        for (int j = 0; j < m; j++) {
            const float gr = G[2 * j], gi = G[2 * j + 1];
            F[2 * j] = gr * K[2 * j] - gi * K[2 * j + 1];
            F[2 * j + 1] = gr * K[2 * j + 1] + gi * K[2 * j];
        }
    } else {
        for (int j = 0; j < m; j++) {
            const float gr = G[2 * j], gi = G[2 * j + 1];
            F[2 * j] += gr * K[2 * j] - gi * K[2 * j + 1];
            F[2 * j + 1] += gr * K[2 * j + 1] + gi * K[2 * j];
        }
    }
}

/* The forward convolution of one column pair (x1 NULL: a single column):
 * with z = x0 + i x1, leaves in A (p->a) the cyclic convolution whose entry
 * k mod M is Z[k] / w_k for k in (-K, K) (band b): the sum over blocks of
 * FFT(block's z_n w_n) times its kernel, back through one inverse FFT. */
static void chirp_fwd(const kvs_dct_plan *p, const band *b, const float *restrict x0,
                      const float *restrict x1) {
    const int N = p->n, M = b->m, P = b->P, L = b->L;
    float *restrict A = (float *)p->a; /* [M] complex, interleaved */
    float *restrict G = (float *)p->b, *restrict F = (float *)p->c;
    const float *restrict W = (const float *)p->w;
    for (int blk = 0; blk < P; blk++) {
        const int nb = blk * L, lb = N - nb < L ? N - nb : L;
        const float *restrict Wb = W + 2 * (int64_t)nb;
        if (x1) {
            for (int n = 0; n < lb; n++) { /* (x0 + i x1) w_n */
                A[2 * n] = x0[nb + n] * Wb[2 * n] - x1[nb + n] * Wb[2 * n + 1];
                A[2 * n + 1] = x0[nb + n] * Wb[2 * n + 1] + x1[nb + n] * Wb[2 * n];
            }
        } else {
            for (int n = 0; n < lb; n++) {
                A[2 * n] = x0[nb + n] * Wb[2 * n] - 0.0f * Wb[2 * n + 1];
                A[2 * n + 1] = x0[nb + n] * Wb[2 * n + 1] + 0.0f * Wb[2 * n];
            }
        }
        memset(A + 2 * lb, 0, sizeof(float) * 2 * (size_t)(M - lb));
        fftwf_execute_dft(b->fft->fwd, p->a, p->b);
        cmul_acc(F, G, (const float *)(b->wf + (size_t)blk * M), M, blk == 0);
    }
    fftwf_execute_dft(b->fft->bwd, p->c, p->a);
}

/* The inverse convolution of one column pair: A (p->a) holds conj(Z[k]) w_k
 * at k mod M for k in (-K, K) and zeros between; per output block: times
 * its mirrored kernel (FFT(b[-j]) = wf[-q]), back, and z = conj(w_n c_n) =
 * o0 + i o1 for its tokens (o1 NULL: only the real part). */
static void chirp_bwd(const kvs_dct_plan *p, const band *b, float *restrict o0,
                      float *restrict o1) {
    const int N = p->n, M = b->m, P = b->P, L = b->L;
    float *restrict A = (float *)p->a, *restrict G = (float *)p->b, *restrict F = (float *)p->c;
    const float *restrict W = (const float *)p->w;
    fftwf_execute_dft(b->fft->fwd, p->a, p->b);
    for (int blk = 0; blk < P; blk++) {
        const int nb = blk * L, lb = N - nb < L ? N - nb : L;
        cmul_acc(F, G, (const float *)(b->wf + (size_t)(P + blk) * M), M, 1);
        fftwf_execute_dft(b->fft->bwd, p->c, p->a);
        const float *restrict Wb = W + 2 * (int64_t)nb;
        float *restrict q0 = o0 + nb; /* [lb] */
        if (o1) {
            float *restrict q1 = o1 + nb;
            for (int n = 0; n < lb; n++) {
                q0[n] = A[2 * n] * Wb[2 * n] - A[2 * n + 1] * Wb[2 * n + 1];
                q1[n] = -(A[2 * n] * Wb[2 * n + 1] + A[2 * n + 1] * Wb[2 * n]);
            }
        } else {
            for (int n = 0; n < lb; n++) q0[n] = A[2 * n] * Wb[2 * n] - A[2 * n + 1] * Wb[2 * n + 1];
        }
    }
}

/* Z[k] = w_k A[k mod M] for k and -k (w_{-k} = w_k), split into the two
 * columns' spectra: V0 = (Zp + conj Zn) / 2, V1 = (Zp - conj Zn) / (2i). */
static inline void chirp_split(const float *restrict A, int M, const float *restrict W, int k,
                               float v0[2], float v1[2]) {
    const int kn = k ? M - k : 0;
    const float wr = W[2 * k], wi = W[2 * k + 1];
    const float pr = A[2 * k] * wr - A[2 * k + 1] * wi;
    const float pi = A[2 * k] * wi + A[2 * k + 1] * wr;
    const float nr = A[2 * kn] * wr - A[2 * kn + 1] * wi;
    const float ni = A[2 * kn] * wi + A[2 * kn + 1] * wr;
    v0[0] = 0.5f * (pr + nr);
    v0[1] = 0.5f * (pi - ni);
    v1[0] = 0.5f * (pi + ni);
    v1[1] = -0.5f * (pr - nr);
}

/* The inverse's input at k and -k from the two columns' spectra V0[k] = (r0,
 * i0), V1[k] = (r1, i1) (imaginary parts already 0 at k = 0 and Nyquist):
 * A[k] = conj(Z[k]) w_k, A[M-k] = conj(Z[-k]) w_k, Z[k] = V0[k] + i V1[k],
 * Z[-k] = conj V0[k] + i conj V1[k]; at Nyquist only A[k]. */
static inline void chirp_merge(float *restrict A, int M, const float *restrict W, int k, int nyq,
                               float r0, float i0, float r1, float i1) {
    const float wr = W[2 * k], wi = W[2 * k + 1];
    /* Z[k] = (r0 - i1) + i (i0 + r1); Z[-k] = (r0 + i1) + i (r1 - i0) */
    const float zr = r0 - i1, zi = -(i0 + r1); /* conj Z[k] */
    A[2 * k] = zr * wr - zi * wi;
    A[2 * k + 1] = zr * wi + zi * wr;
    if (k) {
        const float yr = r0 + i1, yi = -(r1 - i0); /* conj Z[-k] */
        A[2 * (M - k)] = nyq ? 0.0f : yr * wr - yi * wi;
        A[2 * (M - k) + 1] = nyq ? 0.0f : yr * wi + yi * wr;
    }
}

/* Forward: m columns of v ([m][N], real) to their half spectra V ([m][h]),
 * V[c][k] = sum_n v[c][n] e^{-2 pi i n k / N} for k < min(K, h) (band b);
 * entries k >= K are left as they are. Two columns per convolution. */
static void chirp_r2c(const kvs_dct_plan *p, const band *b, int m, const float *v,
                      fftwf_complex *V) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    const float *A = (const float *)p->a, *W = (const float *)p->w;
    for (int c = 0; c < m; c += 2) {
        const float *x0 = v + (int64_t)c * N; /* [N] */
        chirp_fwd(p, b, x0, c + 1 < m ? x0 + N : NULL);
        fftwf_complex *V0 = V + (int64_t)c * p->hs, *V1 = c + 1 < m ? V0 + p->hs : NULL; /* [h] */
        for (int k = 0; k < K; k++) {
            float v1[2];
            chirp_split(A, M, W, k, V0[k], v1);
            if (V1) V1[k][0] = v1[0], V1[k][1] = v1[1];
        }
    }
}

/* Inverse, as FFTW's c2r (unnormalised; the imaginary parts of V[0] and, N
 * even, V[N/2] ignored): out[c][n] = sum_{k=0}^{N-1} V[c][k] e^{2 pi i k n / N}
 * with V[N-k] = conj V[k], where V[c][k] = 0 for k >= min(K, h) (band b). */
static void chirp_c2r(const kvs_dct_plan *p, const band *b, int m, const fftwf_complex *V,
                      float *out) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    float *A = (float *)p->a;
    const float *W = (const float *)p->w;
    for (int c = 0; c < m; c += 2) {
        const fftwf_complex *V0 = V + (int64_t)c * p->hs, *V1 = c + 1 < m ? V0 + p->hs : NULL;
        memset(A + 2 * K, 0, sizeof(float) * 2 * (size_t)(M - 2 * K + 1));
        for (int k = 0; k < K; k++) {
            const int nyq = !(N & 1) && 2 * k == N; /* V[N/2]: once, real parts */
            chirp_merge(A, M, W, k, nyq, V0[k][0], k && !nyq ? V0[k][1] : 0.0f,
                        V1 ? V1[k][0] : 0.0f, V1 && k && !nyq ? V1[k][1] : 0.0f);
        }
        float *o0 = out + (int64_t)c * N;
        chirp_bwd(p, b, o0, V1 ? o0 + N : NULL);
    }
}

/* ---- plans ------------------------------------------------------------------ */

int kvs_dct_plan_n(const kvs_dct_plan *p) { return p->n; }
int kvs_dct_plan_d(const kvs_dct_plan *p) { return p->d; }
int kvs_dct_plan_group(const kvs_dct_plan *p) { return p->g; }
kvs_dct_route kvs_dct_plan_route(const kvs_dct_plan *p) { return p->route; }
int kvs_dct_plan_fft_size(const kvs_dct_plan *p, int lowpass) {
    if (p->route == KVS_DCT_DIRECT) return p->n;
    return lowpass ? p->low.m : p->full.m;
}
int kvs_dct_plan_fft_blocks(const kvs_dct_plan *p, int lowpass) {
    if (p->route == KVS_DCT_DIRECT) return 1;
    return lowpass ? p->low.P : p->full.P;
}

void kvs_dct_plan_destroy(kvs_dct_plan *p) {
    if (!p) return;
    if (p->Vg != p->V) fftwf_free(p->Vg);
    if (p->tg != p->t) fftwf_free(p->tg);
    if (p->low.wf != p->full.wf) fftwf_free(p->low.wf);
    fftwf_free(p->full.wf);
    fftwf_free(p->w);
    fftwf_free(p->a);
    fftwf_free(p->b);
    fftwf_free(p->c);
    free(p->rows);
    fftwf_free(p->v);
    fftwf_free(p->V);
    fftwf_free(p->t);
    free(p->cs);
    free(p->sn);
    free(p->col);
    free(p->acc_p);
    free(p);
}

kvs_status kvs_dct_plan_create(int N, int d, kvs_dct_plan **out, kvs_err *err) {
    return kvs_dct_plan_create_opts(N, d, 0, KVS_DCT_AUTO, out, err);
}

kvs_status kvs_dct_plan_create_opts(int N, int d, int omega, kvs_dct_route route,
                                    kvs_dct_plan **out, kvs_err *err) {
    kvs_status st = KVS_OK;
    kvs_dct_plan *p = NULL;
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "dct: NULL output");
    *out = NULL;
    if (N < 1 || d < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d must be >= 1", N, d);
    if ((int64_t)N * d > INT32_MAX / 2)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d exceeds 2^30 elements",
                          N, d);
    if (N > (1 << 28))
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: N=%d exceeds 2^28", N);
    if (omega < 0 || omega > N)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: omega=%d outside [0, N=%d]", omega, N);
    if (route != KVS_DCT_AUTO && route != KVS_DCT_DIRECT && route != KVS_DCT_BLUESTEIN)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: unknown route %d", (int)route);
    p = calloc(1, sizeof *p);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
    p->n = N;
    p->d = d;
    p->h = N / 2 + 1;
    p->route = route == KVS_DCT_AUTO ? kvs_dct_route_for(N) : route;
    p->omega = omega;
    const size_t nd = (size_t)N * (size_t)d;
    p->v = fftwf_malloc(sizeof(float) * nd);
    p->t = fftwf_malloc(sizeof(float) * nd);
    p->hs = spectrum_stride(N, p->route);
    p->V = fftwf_malloc(sizeof(fftwf_complex) * (size_t)p->hs * (size_t)d);
    p->cs = malloc(sizeof(float) * (size_t)p->h);
    p->sn = malloc(sizeof(float) * (size_t)p->h);
    p->col = malloc(sizeof(float) * 2 * (size_t)N);
    p->acc_p = malloc(sizeof(float) * (size_t)N);
    p->rows = malloc(sizeof(float) * DCT_CHUNK * (size_t)d);
    if (!p->v || !p->t || !p->V || !p->cs || !p->sn || !p->col || !p->acc_p || !p->rows) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
        goto cleanup;
    }
    for (int k = 0; k < p->h; k++) {
        const double a = 3.14159265358979323846 * (double)k / (2.0 * (double)N);
        p->cs[k] = (float)cos(a);
        p->sn[k] = (float)sin(a);
    }
    if (p->route == KVS_DCT_DIRECT) {
        if ((st = cache_get(N, d, 0, &p->de, NULL, err))) goto cleanup;
        p->g = p->de->g;
        p->ng = p->de->ng;
        if (p->ng > 1) {
            p->Vg = fftwf_malloc(sizeof(fftwf_complex) * (size_t)p->hs * (size_t)p->g);
            p->tg = fftwf_malloc(sizeof(float) * (size_t)N * (size_t)p->g);
            if (!p->Vg || !p->tg) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
                goto cleanup;
            }
        } else {
            p->Vg = p->V;
            p->tg = p->t;
        }
    } else {
        p->g = d;
        p->ng = 1;
        p->Vg = p->V;
        p->tg = p->t;
        const int Kf = p->h, Kl = omega > 0 && omega < p->h ? omega : p->h;
        int mmax = 0, bP, bL, bm;
        band_choose(N, Kf, &bP, &bL, &mmax);
        band_choose(N, Kl, &bP, &bL, &bm);
        if (bm > mmax) mmax = bm;
        /* w_j for j < N + Kf + 4: block kernels reach lag P L + K - 3 with
         * P L <= N + 3 (band_init) */
        const int nw = N + Kf + 4;
        p->w = fftwf_malloc(sizeof(fftwf_complex) * (size_t)nw);
        p->a = fftwf_malloc(sizeof(fftwf_complex) * (size_t)mmax);
        p->b = fftwf_malloc(sizeof(fftwf_complex) * (size_t)mmax);
        p->c = fftwf_malloc(sizeof(fftwf_complex) * (size_t)mmax);
        if (!p->w || !p->a || !p->b || !p->c) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
            goto cleanup;
        }
        for (int j = 0; j < nw; j++) { /* w_j = exp(-i pi j^2 / N), j^2 mod 2N exact */
            const int64_t q = (int64_t)j * j % (2 * (int64_t)N);
            const double ang = 3.14159265358979323846 * (double)q / (double)N;
            p->w[j][0] = (float)cos(ang);
            p->w[j][1] = (float)-sin(ang);
        }
        if ((st = band_init(p, Kf, &p->full, err))) goto cleanup;
        if (Kl == Kf)
            p->low = p->full;
        else if ((st = band_init(p, Kl, &p->low, err)))
            goto cleanup;
    }
    *out = p;
    p = NULL;
cleanup:
    kvs_dct_plan_destroy(p);
    return st;
}

/* The direct route's FFTW plan for m columns (all d, a full group or the
 * narrower last one), forward (v -> V) or inverse (V -> v). */
static fftwf_plan direct_cols_plan(const kvs_dct_plan *p, int m, int inverse) {
    const direct_entry *e = p->de;
    if (m == p->d) return inverse ? e->c2r : e->r2c;
    return inverse ? e->gc2r[m == p->g ? 0 : 1] : e->gr2c[m == p->g ? 0 : 1];
}

/* v ([m][N]) -> V ([m][h]) and back for m columns of the plan: all d, or a
 * column group (direct route: the group plans; m == g or the last group). */
static void fwd_fft(const kvs_dct_plan *p, const band *b, int m, float *v, fftwf_complex *V) {
    if (p->route == KVS_DCT_BLUESTEIN) {
        chirp_r2c(p, b, m, v, V);
        return;
    }
    const direct_entry *e = p->de;
    const fftwf_plan pl = direct_cols_plan(p, m, 0);
    if (!e->tw) {
        fftwf_execute_dft_r2c(pl, v, V);
        return;
    }
    /* N even: Z = FFT_{N/2}(v[2n] + i v[2n+1]) into V, then each column's
     * half spectrum from Z in place: with E / O the FFTs of the even / odd
     * samples, E[k] = (Z[k] + conj Z[H-k]) / 2, O[k] = (Z[k] - conj Z[H-k]) /
     * (2i), V[k] = E[k] + w^k O[k] and V[H-k] = conj(E[k] - w^k O[k]),
     * w = exp(-2 pi i / N), for k = 0 .. H/2 (Z[H] = Z[0]). */
    fftwf_execute_dft(pl, (fftwf_complex *)v, V);
    const int H = p->n / 2;
    const float *restrict tw = (const float *)e->tw;
    for (int c = 0; c < m; c++) {
        float *restrict Z = (float *)(V + (int64_t)c * p->hs); /* [h] complex */
        for (int k = 0; k <= H / 2; k++) {
            const int j = k ? H - k : 0;
            const float zr = Z[2 * k], zi = Z[2 * k + 1], yr = Z[2 * j], yi = Z[2 * j + 1];
            const float er = 0.5f * (zr + yr), ei = 0.5f * (zi - yi);
            const float orr = 0.5f * (zi + yi), oi = -0.5f * (zr - yr);
            const float wr = tw[2 * k], wi = tw[2 * k + 1];
            const float tr = wr * orr - wi * oi, ti = wr * oi + wi * orr;
            Z[2 * k] = er + tr;
            Z[2 * k + 1] = ei + ti;
            Z[2 * (H - k)] = er - tr; /* k = 0: V[H] */
            Z[2 * (H - k) + 1] = ti - ei;
        }
    }
}

/* V is destroyed (FFTW's c2r). */
static void inv_fft(const kvs_dct_plan *p, const band *b, int m, fftwf_complex *V, float *out) {
    if (p->route == KVS_DCT_BLUESTEIN) {
        chirp_c2r(p, b, m, V, out);
        return;
    }
    const direct_entry *e = p->de;
    const fftwf_plan pl = direct_cols_plan(p, m, 1);
    if (!e->tw) {
        fftwf_execute_dft_c2r(pl, V, out);
        return;
    }
    /* N even, as c2r (imaginary parts of V[0], V[H] ignored): in place, for
     * k = 0 .. H/2 with a = V[k], b = V[H-k], E = a + conj b, O = (a - conj b)
     * conj(w^k): Z[k] = E + i O, Z[H-k] = conj E + i conj O; then
     * out[2n] + i out[2n+1] = IFFT_{N/2}(Z)[n] (unnormalised, as c2r). */
    const int H = p->n / 2;
    const float *restrict tw = (const float *)e->tw;
    for (int c = 0; c < m; c++) {
        float *restrict Z = (float *)(V + (int64_t)c * p->hs); /* [h] complex */
        for (int k = 0; k <= H / 2; k++) {
            const int j = H - k;
            const float ar = Z[2 * k], ai = k ? Z[2 * k + 1] : 0.0f;
            const float br = Z[2 * j], bi = k ? Z[2 * j + 1] : 0.0f;
            const float er = ar + br, ei = ai - bi, dr = ar - br, di = ai + bi;
            const float wr = tw[2 * k], wi = tw[2 * k + 1];
            const float orr = dr * wr + di * wi, oi = di * wr - dr * wi;
            Z[2 * k] = er - oi;
            Z[2 * k + 1] = ei + orr;
            if (k) {
                Z[2 * j] = er + oi;
                Z[2 * j + 1] = orr - ei;
            }
        }
    }
    fftwf_execute_dft(pl, V, (fftwf_complex *)out);
}
void kvs_transpose_f32(const float *in, int rows, int cols, float *out) {
    /* Tiles of T x T; the inner loop writes contiguous output. Reads walk a
     * tile's rows, which stay in L1 for the whole tile. */
    enum { T = 16 };
    for (int r0 = 0; r0 < rows; r0 += T) {
        const int r1 = r0 + T < rows ? r0 + T : rows;
        for (int c0 = 0; c0 < cols; c0 += T) {
            const int c1 = c0 + T < cols ? c0 + T : cols;
            for (int c = c0; c < c1; c++) {
                float *o = out + (int64_t)c * rows; /* [rows] */
                for (int r = r0; r < r1; r++) o[r] = in[(int64_t)r * cols + c];
            }
        }
    }
}

kvs_status kvs_dct2_ortho_cols(kvs_dct_plan *p, const float *x, float *X, kvs_err *err) {
    if (!p || !x || !X) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct2_ortho: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    for (int c = 0; c < d; c++) { /* permute into v; x is fully read before X is written */
        const float *xc = x + (int64_t)c * N; /* [N] */
        float *vc = p->v + (int64_t)c * N;     /* [N] */
        for (int q = 0; q < ne; q++) vc[q] = xc[2 * q];
        for (int q = 0; q < no; q++) vc[N - 1 - q] = xc[2 * q + 1];
    }
    fwd_fft(p, &p->full, d, p->v, p->V);
    const float s0 = (float)sqrt(1.0 / N), s1 = (float)sqrt(2.0 / N);
    for (int c = 0; c < d; c++) {
        const fftwf_complex *Vc = p->V + (int64_t)c * p->hs; /* [h] */
        float *Xc = X + (int64_t)c * N;                  /* [N] */
        Xc[0] = s0 * Vc[0][0];
        for (int k = 1; k < h; k++) /* k = 1 .. floor(N/2) */
            Xc[k] = s1 * (p->cs[k] * Vc[k][0] + p->sn[k] * Vc[k][1]);
        for (int k = 1; k < no + (N & 1); k++) /* N - k = N-1 .. floor(N/2)+1 */
            Xc[N - k] = s1 * (p->sn[k] * Vc[k][0] - p->cs[k] * Vc[k][1]);
    }
    return KVS_OK;
}

kvs_status kvs_dct3_ortho_cols(kvs_dct_plan *p, const float *X, float *x, kvs_err *err) {
    if (!p || !X || !x) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct3_ortho: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    /* Y[k] = X[k] / a_k; with the 1/N of the inverse FFT: k = 0 scales by
     * sqrt(N)/N = 1/sqrt(N), k > 0 by sqrt(N/2)/N = 1/sqrt(2N). */
    const float s0 = (float)(1.0 / sqrt((double)N)), s1 = (float)(1.0 / sqrt(2.0 * N));
    for (int c = 0; c < d; c++) {
        const float *Xc = X + (int64_t)c * N; /* [N] */
        fftwf_complex *Vc = p->V + (int64_t)c * p->hs;
        Vc[0][0] = s0 * Xc[0];
        Vc[0][1] = 0.0f;
        for (int k = 1; k < h; k++) {
            const float y1 = s1 * Xc[k], y2 = s1 * Xc[N - k], ck = p->cs[k], sk = p->sn[k];
            Vc[k][0] = ck * y1 + sk * y2;
            Vc[k][1] = sk * y1 - ck * y2;
        }
    }
    inv_fft(p, &p->full, d, p->V, p->v);
    for (int c = 0; c < d; c++) {
        const float *vc = p->v + (int64_t)c * N; /* [N] */
        float *xc = x + (int64_t)c * N;
        for (int q = 0; q < ne; q++) xc[2 * q] = vc[q];
        for (int q = 0; q < no; q++) xc[2 * q + 1] = vc[N - 1 - q];
    }
    return KVS_OK;
}

kvs_status kvs_dct2_ortho(kvs_dct_plan *p, const float *x, float *X, kvs_err *err) {
    if (!p || !x || !X) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct2_ortho: NULL argument");
    kvs_transpose_f32(x, p->n, p->d, p->t); /* [N][d] -> [d][N] */
    kvs_status st = kvs_dct2_ortho_cols(p, p->t, p->t, err);
    if (st) return st;
    kvs_transpose_f32(p->t, p->d, p->n, X); /* [d][N] -> [N][d] */
    return KVS_OK;
}

kvs_status kvs_dct3_ortho(kvs_dct_plan *p, const float *X, float *x, kvs_err *err) {
    if (!p || !X || !x) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct3_ortho: NULL argument");
    kvs_transpose_f32(X, p->n, p->d, p->t);
    kvs_status st = kvs_dct3_ortho_cols(p, p->t, p->t, err);
    if (st) return st;
    kvs_transpose_f32(p->t, p->d, p->n, x);
    return KVS_OK;
}

/* Tokens n0 .. n0+cnt-1 of m columns into vg ([m][N], column c at vg + c N)
 * in Makhoul's order: token n sits at perm(n) (see the top), perm(2q) = q,
 * perm(2q+1) = N-1-q. rows[i * stride + c] is token n0 + i, column c. */
static void load_chunk(float *vg, int N, int m, const float *rows, int64_t stride, int n0,
                       int cnt) {
    const int ie = n0 & 1, io = 1 - ie;               /* first row of an even / odd token */
    const int nE = cnt > ie ? (cnt - ie + 1) / 2 : 0; /* even tokens in the chunk */
    const int nO = cnt > io ? (cnt - io + 1) / 2 : 0; /* odd tokens */
    const int pe = (n0 + ie) / 2, po = N - 1 - (n0 + io) / 2; /* their first slots */
    const int64_t s2 = 2 * stride;
    const float *re = rows + ie * stride, *ro = rows + io * stride;
    for (int c = 0; c < m; c++) {
        float *ve = vg + (int64_t)c * N + pe; /* [nE] ascending */
        float *vo = vg + (int64_t)c * N + po; /* [nO] descending */
        for (int j = 0; j < nE; j++) ve[j] = re[j * s2 + c];
        for (int j = 0; j < nO; j++) vo[-j] = ro[j * s2 + c];
    }
}

/* Head `head` of x, all N tokens and d columns, into v ([d][N], permuted):
 * DCT_CHUNK rows at a time copied (converted) to fp32 by kvs_view_rows_f32,
 * a sequential stream the prefetcher follows (transposing straight from the
 * view measured slower), then transposed from L1 (rows: [DCT_CHUNK][d]). */
static void load_head(const kvs_view *x, int head, int N, int d, float *v, float *rows) {
    for (int n0 = 0; n0 < N; n0 += DCT_CHUNK) {
        const int cnt = N - n0 < DCT_CHUNK ? N - n0 : DCT_CHUNK;
        kvs_view_rows_f32(x, head, n0, cnt, rows);
        load_chunk(v, N, d, rows, d, n0, cnt);
    }
}

/* The DCT-III input of coefficient pair (k, N-k), as kvs_dct3_ortho_cols
 * builds it: x1 = X[k], x2 = X[N-k] (0 where cut off). */
static inline void dct3_pair(fftwf_complex Vk, float x1, float x2, float s1, float ck, float sk) {
    const float y1 = s1 * x1, y2 = s1 * x2;
    Vk[0] = ck * y1 + sk * y2;
    Vk[1] = sk * y1 - ck * y2;
}

/* w[q] += sum over the m columns of (x - base)^2, q < N (permuted order). */
static void residual_acc(const float *v, const float *base, int m, int N, float *restrict w) {
    for (int c = 0; c < m; c++) {
        const float *restrict xc = v + (int64_t)c * N, *restrict bc = base + (int64_t)c * N;
        for (int q = 0; q < N; q++) {
            const float r = xc[q] - bc[q];
            w[q] += r * r;
        }
    }
}

#if defined(__AVX2__)
/* Eight complex values c[k .. k+8) (interleaved at z) as real and imaginary
 * parts in k order, and back. */
static inline void deint8(const float *z, __m256 *re, __m256 *im) {
    const __m256 a = _mm256_loadu_ps(z), b = _mm256_loadu_ps(z + 8);
    /* [r0 r1 r4 r5 | r2 r3 r6 r7] after the shuffle; swap the middle 64-bit chunks */
    *re = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *im = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
static inline void inter8(float *z, __m256 re, __m256 im) {
    re = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(re), 0xD8));
    im = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(im), 0xD8));
    _mm256_storeu_ps(z, _mm256_unpacklo_ps(re, im));
    _mm256_storeu_ps(z + 8, _mm256_unpackhi_ps(re, im));
}

/* half_lowpass's loop for k = 1 .. in blocks of eight while k + 8 <= omega:
 * each lane does exactly the scalar loop's float operations (no FMA, same
 * order). Z[H - k] is read and written in descending k (reversed lanes).
 * Returns the first k it did not do. */
static int half_lowpass8(float *restrict Z, float *restrict Zj, const float *restrict tw,
                         const float *restrict cs, const float *restrict sn, float *restrict X,
                         int omega, float a1f, float b1f) {
    const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 a1 = _mm256_set1_ps(a1f), b1 = _mm256_set1_ps(b1f), zero = _mm256_setzero_ps();
    int k = 1;
    for (; k + 8 <= omega; k += 8) {
        __m256 zr, zi, yr, yi, wr, wi;
        deint8(Z + 2 * k, &zr, &zi);
        deint8(Zj - 2 * (k + 7), &yr, &yi); /* Z[H-k-7 .. H-k]: descending k */
        yr = _mm256_permutevar8x32_ps(yr, rev);
        yi = _mm256_permutevar8x32_ps(yi, rev);
        deint8(tw + 2 * k, &wr, &wi);
        const __m256 c = _mm256_loadu_ps(cs + k), sv = _mm256_loadu_ps(sn + k);
        const __m256 er = _mm256_mul_ps(half, _mm256_add_ps(zr, yr));
        const __m256 ei = _mm256_mul_ps(half, _mm256_sub_ps(zi, yi));
        const __m256 orr = _mm256_mul_ps(half, _mm256_add_ps(zi, yi));
        const __m256 oi = _mm256_mul_ps(mhalf, _mm256_sub_ps(zr, yr));
        const __m256 tr = _mm256_sub_ps(_mm256_mul_ps(wr, orr), _mm256_mul_ps(wi, oi));
        const __m256 ti = _mm256_add_ps(_mm256_mul_ps(wr, oi), _mm256_mul_ps(wi, orr));
        const __m256 vr = _mm256_add_ps(er, tr), vi = _mm256_add_ps(ei, ti);
        const __m256 xk =
            _mm256_mul_ps(a1, _mm256_add_ps(_mm256_mul_ps(c, vr), _mm256_mul_ps(sv, vi)));
        _mm256_storeu_ps(X + k, xk);
        const __m256 y1 = _mm256_mul_ps(b1, xk), y2 = _mm256_mul_ps(b1, zero);
        const __m256 ar = _mm256_add_ps(_mm256_mul_ps(c, y1), _mm256_mul_ps(sv, y2));
        const __m256 ai = _mm256_sub_ps(_mm256_mul_ps(sv, y1), _mm256_mul_ps(c, y2));
        const __m256 mr = _mm256_add_ps(ar, zero), mi = _mm256_sub_ps(ai, zero);
        const __m256 dr = _mm256_sub_ps(ar, zero), di = _mm256_add_ps(ai, zero);
        const __m256 pr = _mm256_add_ps(_mm256_mul_ps(dr, wr), _mm256_mul_ps(di, wi));
        const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(di, wr), _mm256_mul_ps(dr, wi));
        inter8(Z + 2 * k, _mm256_sub_ps(mr, pi), _mm256_add_ps(mi, pr));
        inter8(Zj - 2 * (k + 7), _mm256_permutevar8x32_ps(_mm256_add_ps(mr, pi), rev),
               _mm256_permutevar8x32_ps(_mm256_sub_ps(pr, mi), rev));
    }
    return k;
}
#endif

/* One column of the half route with omega <= H/2 (H = N/2): Z holds the
 * complex FFT of length H of the column's pairs (fwd_fft's input); on return
 * it holds the input of the backward FFT that gives the column's low-pass
 * base (inv_fft's), and the energy of the kept X[k < omega] is added to sum
 * (returned). What fwd_fft's split, the coefficient / low-pass loops of
 * kvs_dct_lowpass_sqres and inv_fft's merge do, in one pass over k < omega,
 * with the same float operations on the same operands: V[k] needs only
 * Z[k] and Z[H-k]; X[m >= omega] is cut, so the low-passed V'[k >= omega]
 * is +0 and the merge of pair (k, H-k) has b = V'[H-k] = +0 (H - k > H/2 >=
 * omega), and both Z'[k] and Z'[H-k] are +0 for omega <= k <= H/2. The +0
 * terms are kept in the expressions (x + 0.0f is not x when x = -0), so the
 * result is bit for bit the unfused one (tests/methods1/test_dct.c). */
static double half_lowpass(const kvs_dct_plan *p, float *restrict Z, int omega, float a0,
                           float a1, float b0, float b1, double sum) {
    const int H = p->n / 2;
    const float *restrict tw = (const float *)p->de->tw;
    const float *restrict cs = p->cs, *restrict sn = p->sn;
    float *restrict X = p->col;
    const float zero = 0.0f; /* V'[H-k], and the cut X[N-k] of dct3_pair */
    /* k = 0 pairs Z[0] with itself (j = 0); V'[0] = (b0 X[0], 0). */
    {
        const float zr = Z[0], zi = Z[1];
        const float er = 0.5f * (zr + zr), orr = 0.5f * (zi + zi), oi = -0.5f * (zr - zr);
        const float tr = tw[0] * orr - tw[1] * oi;
        X[0] = a0 * (er + tr);
        const float ar = b0 * X[0], ai = 0.0f;
        const float mr = ar + zero, mi = ai - zero, dr = ar - zero, di = ai + zero;
        const float pr = dr * tw[0] + di * tw[1], pi = di * tw[0] - dr * tw[1];
        Z[0] = mr - pi;
        Z[1] = mi + pr;
    }
    /* 1 <= k < omega, j = H - k > k: independent iterations, eight at a time
     * in AVX2 (half_lowpass8), the rest here. */
    float *restrict Zj = Z + 2 * H; /* Zj[-2k] = Z[2 (H - k)] */
    int k = 1;
#if defined(__AVX2__)
    k = half_lowpass8(Z, Zj, tw, cs, sn, X, omega, a1, b1);
#endif
    for (; k < omega; k++) {
        const float zr = Z[2 * k], zi = Z[2 * k + 1], yr = Zj[-2 * k], yi = Zj[-2 * k + 1];
        const float er = 0.5f * (zr + yr), ei = 0.5f * (zi - yi);
        const float orr = 0.5f * (zi + yi), oi = -0.5f * (zr - yr);
        const float wr = tw[2 * k], wi = tw[2 * k + 1];
        const float tr = wr * orr - wi * oi, ti = wr * oi + wi * orr;
        const float vr = er + tr, vi = ei + ti; /* V[k] */
        const float xk = a1 * (cs[k] * vr + sn[k] * vi);
        X[k] = xk;
        /* V'[k] = dct3_pair(X[k], 0) */
        const float y1 = b1 * xk, y2 = b1 * zero;
        const float ar = cs[k] * y1 + sn[k] * y2, ai = sn[k] * y1 - cs[k] * y2;
        const float mr = ar + zero, mi = ai - zero, dr = ar - zero, di = ai + zero;
        const float pr = dr * wr + di * wi, pi = di * wr - dr * wi;
        Z[2 * k] = mr - pi;
        Z[2 * k + 1] = mi + pr;
        Zj[-2 * k] = mr + pi;
        Zj[-2 * k + 1] = pr - mi;
    }
    for (int q = 0; q < omega; q++) sum += (double)X[q] * X[q];
    memset(Z + 2 * omega, 0, sizeof(float) * 2 * (size_t)(H - 2 * omega + 1));
    return sum;
}

/* chirp_lowpass at one k of the band (see there): split the convolution's
 * output at k and M - k, the kept coefficients X0[k], X1[k] (k < kl; X1 NULL:
 * one column), and the inverse's input in their place. */
static inline void chirp_lowpass1(float *restrict A, int M, const float *restrict W,
                                  const float *restrict cs, const float *restrict sn,
                                  float *restrict X0, float *restrict X1, int k, int kl, int nyq,
                                  float a0, float a1, float b0, float b1) {
    fftwf_complex v0, v1, y0 = {0.0f, 0.0f}, y1 = {0.0f, 0.0f};
    chirp_split(A, M, W, k, v0, v1);
    if (k == 0) {
        X0[0] = a0 * v0[0];
        y0[0] = b0 * X0[0];
        if (X1) {
            X1[0] = a0 * v1[0];
            y1[0] = b0 * X1[0];
        }
    } else if (k < kl) {
        X0[k] = a1 * (cs[k] * v0[0] + sn[k] * v0[1]);
        dct3_pair(y0, X0[k], 0.0f, b1, cs[k], sn[k]);
        if (X1) {
            X1[k] = a1 * (cs[k] * v1[0] + sn[k] * v1[1]);
            dct3_pair(y1, X1[k], 0.0f, b1, cs[k], sn[k]);
        }
    }
    chirp_merge(A, M, W, k, nyq, y0[0], k && !nyq ? y0[1] : 0.0f, y1[0], k && !nyq ? y1[1] : 0.0f);
}

#if defined(__AVX2__)
/* chirp_lowpass1 for k, k + 1, .. in blocks of eight while k + 8 <= kend
 * (1 <= k; kend excludes Nyquist): each lane does exactly the scalar float
 * operations (no FMA, same order; lanes k >= kl get the scalar's +0 input).
 * A[M - k] is read and written in descending k (reversed lanes); a block's
 * two ranges never meet (K <= M / 2). Returns the first k it did not do. */
static int chirp_lowpass8(float *restrict A, int M, const float *restrict W,
                          const float *restrict cs, const float *restrict sn, float *restrict X0,
                          float *restrict X1, int k, int kend, int kl, float a1f, float b1f) {
    const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 a1 = _mm256_set1_ps(a1f), b1 = _mm256_set1_ps(b1f), sign = _mm256_set1_ps(-0.0f);
    const __m256 y2 = _mm256_mul_ps(b1, _mm256_setzero_ps()); /* dct3_pair's b1 * 0 */
    for (; k + 8 <= kend; k += 8) {
        __m256 ar, ai, br, bi, wr, wi;
        deint8(A + 2 * (int64_t)k, &ar, &ai);
        deint8(A + 2 * (int64_t)(M - k - 7), &br, &bi);
        br = _mm256_permutevar8x32_ps(br, rev);
        bi = _mm256_permutevar8x32_ps(bi, rev);
        deint8(W + 2 * (int64_t)k, &wr, &wi);
        const __m256 pr = _mm256_sub_ps(_mm256_mul_ps(ar, wr), _mm256_mul_ps(ai, wi));
        const __m256 pi = _mm256_add_ps(_mm256_mul_ps(ar, wi), _mm256_mul_ps(ai, wr));
        const __m256 nr = _mm256_sub_ps(_mm256_mul_ps(br, wr), _mm256_mul_ps(bi, wi));
        const __m256 ni = _mm256_add_ps(_mm256_mul_ps(br, wi), _mm256_mul_ps(bi, wr));
        const __m256 c = _mm256_loadu_ps(cs + k), s = _mm256_loadu_ps(sn + k);
        const __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(kl), _mm256_add_epi32(_mm256_set1_epi32(k), lane)));
        __m256 y[2][2]; /* [column][re, im] the DCT-III input */
        for (int t = 0; t < 2; t++) {
            if (t == 1 && !X1) {
                y[1][0] = y[1][1] = _mm256_setzero_ps();
                break;
            }
            const __m256 vr = t ? _mm256_mul_ps(half, _mm256_add_ps(pi, ni))
                                : _mm256_mul_ps(half, _mm256_add_ps(pr, nr));
            const __m256 vi = t ? _mm256_mul_ps(mhalf, _mm256_sub_ps(pr, nr))
                                : _mm256_mul_ps(half, _mm256_sub_ps(pi, ni));
            const __m256 X =
                _mm256_mul_ps(a1, _mm256_add_ps(_mm256_mul_ps(c, vr), _mm256_mul_ps(s, vi)));
            _mm256_storeu_ps((t ? X1 : X0) + k, X); /* lanes >= kl are never read */
            const __m256 y1 = _mm256_mul_ps(b1, X);
            y[t][0] = _mm256_and_ps(keep, _mm256_add_ps(_mm256_mul_ps(c, y1), _mm256_mul_ps(s, y2)));
            y[t][1] = _mm256_and_ps(keep, _mm256_sub_ps(_mm256_mul_ps(s, y1), _mm256_mul_ps(c, y2)));
        }
        const __m256 r0 = y[0][0], i0 = y[0][1], r1 = y[1][0], i1 = y[1][1];
        const __m256 zr = _mm256_sub_ps(r0, i1), zi = _mm256_xor_ps(_mm256_add_ps(i0, r1), sign);
        const __m256 qr = _mm256_add_ps(r0, i1), qi = _mm256_xor_ps(_mm256_sub_ps(r1, i0), sign);
        inter8(A + 2 * (int64_t)k, _mm256_sub_ps(_mm256_mul_ps(zr, wr), _mm256_mul_ps(zi, wi)),
               _mm256_add_ps(_mm256_mul_ps(zr, wi), _mm256_mul_ps(zi, wr)));
        const __m256 hr = _mm256_sub_ps(_mm256_mul_ps(qr, wr), _mm256_mul_ps(qi, wi));
        const __m256 hi = _mm256_add_ps(_mm256_mul_ps(qr, wi), _mm256_mul_ps(qi, wr));
        inter8(A + 2 * (int64_t)(M - k - 7), _mm256_permutevar8x32_ps(hr, rev),
               _mm256_permutevar8x32_ps(hi, rev));
    }
    return k;
}
#endif

/* kvs_dct_lowpass_sqres's spectral steps on Bluestein's route, fused: per
 * column pair, the forward convolution, then for each k of the band (K =
 * min(b->K, h)) the split (chirp_split), X[k] = a_k (c Re + s Im) for k < kl
 * (kl = omega), the low-passed DCT-III input (dct3_pair; 0 for kl <= k < K)
 * and the inverse's input (chirp_merge) in place of the convolution's output
 * (entry k reads and writes only k and M - k; chirp_lowpass1, eight at a
 * time in chirp_lowpass8), then the inverse convolution into the base
 * (p->tg). The same float operations per value as fwd_fft, the per-column
 * loop and inv_fft, so the results are bit for bit theirs; sum gains
 * sum_{j < kl} X[j]^2 column by column, as there. Needs kh > kl and kh >= K:
 * no kept coefficient N - k in the band. X in p->col ([2][N]). */
static double chirp_lowpass(const kvs_dct_plan *p, const band *b, int m, const float *vg, int kl,
                            float a0, float a1, float b0, float b1, double sum) {
    const int N = p->n, h = p->h, M = b->m, K = b->K < h ? b->K : h;
    const int kend = !(N & 1) && N / 2 < K ? N / 2 : K; /* the vector blocks stop short of Nyquist */
    float *A = (float *)p->a;
    const float *W = (const float *)p->w, *cs = p->cs, *sn = p->sn;
    for (int c = 0; c < m; c += 2) {
        const float *x0 = vg + (int64_t)c * N, *x1 = c + 1 < m ? x0 + N : NULL; /* [N] */
        float *X0 = p->col, *X1 = x1 ? p->col + N : NULL;                      /* [kl] each */
        chirp_fwd(p, b, x0, x1);
        chirp_lowpass1(A, M, W, cs, sn, X0, X1, 0, kl, 0, a0, a1, b0, b1);
        int k = 1;
#if defined(__AVX2__)
        k = chirp_lowpass8(A, M, W, cs, sn, X0, X1, k, kend, kl, a1, b1);
#endif
        for (; k < K; k++)
            chirp_lowpass1(A, M, W, cs, sn, X0, X1, k, kl, !(N & 1) && 2 * k == N, a0, a1, b0, b1);
        memset(A + 2 * K, 0, sizeof(float) * 2 * (size_t)(M - 2 * K + 1));
        for (int j = 0; j < kl; j++) sum += (double)X0[j] * X0[j];
        if (x1)
            for (int j = 0; j < kl; j++) sum += (double)X1[j] * X1[j];
        float *o0 = p->tg + (int64_t)c * N;
        chirp_bwd(p, b, o0, x1 ? o0 + N : NULL);
    }
    return sum;
}

kvs_status kvs_dct_lowpass_sqres(kvs_dct_plan *p, const kvs_view *x, int head, int omega,
                                 double *lo, float *acc, kvs_err *err) {
    if (!p || !x || !x->data || !lo || !acc)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_dct_lowpass_sqres: NULL argument");
    const int N = p->n, d = p->d, h = p->h, ne = (N + 1) / 2, no = N / 2;
    if (x->n_tokens != N || x->head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: view has N=%d d=%d, the plan N=%d d=%d",
                          x->n_tokens, x->head_dim, N, d);
    if (head < 0 || head >= x->n_heads)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: head %d outside [0, %d)", head, x->n_heads);
    if (x->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "kvs_dct_lowpass_sqres: view is in device memory");
    if (x->dtype != KVS_F32 && x->dtype != KVS_F16 && x->dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: dtype %d is not a float type", (int)x->dtype);
    if (omega < 1 || omega > N)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kvs_dct_lowpass_sqres: omega=%d outside [1, N=%d]", omega, N);
    /* Scales exactly as kvs_dct2_ortho_cols (a*) and kvs_dct3_ortho_cols (b*). */
    const float a0 = (float)sqrt(1.0 / N), a1 = (float)sqrt(2.0 / N);
    const float b0 = (float)(1.0 / sqrt((double)N)), b1 = (float)(1.0 / sqrt(2.0 * N));
    const int kl = omega < h ? omega : h; /* k < kl: X[k] is kept */
    const int kh = N - omega + 1 > 1 ? N - omega + 1 : 1; /* k >= kh: X[N-k] is kept */
    /* Bluestein: only V[k < kl] is read and written back, so the plan's
     * low band serves when it covers kl (the full band otherwise). */
    const band *bd = kl <= p->low.K ? &p->low : &p->full;
    float *X = p->col;   /* [N] one column's coefficients, entries m < omega valid */
    float *w = p->acc_p; /* [N] squared residual in permuted order */
    memset(w, 0, sizeof(float) * (size_t)N);
    load_head(x, head, N, d, p->v, p->rows);
    /* The fast path needs the half route and every kept k at most H/2 (so
     * no kept pair (k, N-k) and, in the merge, no kept partner H-k). */
    const int fast = p->route == KVS_DCT_DIRECT && p->de->tw && omega <= N / 2 / 2;
    /* Bluestein's band reads only V[k < K] (chirp_c2r): nothing above he */
    const int he = p->route == KVS_DCT_BLUESTEIN && bd->K < h ? bd->K : h;
    /* Bluestein with every kept k below the band's end and no kept partner
     * N - k inside it (omega below about N/2): the split, low-pass and merge
     * run in one pass over the band between the two convolutions, no
     * spectrum written (chirp_lowpass) */
    const int chirp_fused = p->route == KVS_DCT_BLUESTEIN && kl == omega && kh > kl && kh >= he;
    double sum = 0.0;
    for (int gi = 0; gi < p->ng; gi++) {
        const int c0 = gi * p->g, m = d - c0 < p->g ? d - c0 : p->g; /* columns [c0, c0 + m) */
        float *vg = p->v + (int64_t)c0 * N; /* [m][N] */
        if (fast) { /* the spectral steps fused into one pass per column (half_lowpass) */
            fftwf_execute_dft(direct_cols_plan(p, m, 0), (fftwf_complex *)vg, p->Vg);
            for (int c = 0; c < m; c++)
                sum = half_lowpass(p, (float *)(p->Vg + (int64_t)c * p->hs), omega, a0, a1, b0,
                                   b1, sum);
            fftwf_execute_dft(direct_cols_plan(p, m, 1), p->Vg, (fftwf_complex *)p->tg);
            residual_acc(vg, p->tg, m, N, w);
            continue;
        }
        if (chirp_fused) { /* g = d: one group */
            sum = chirp_lowpass(p, bd, m, vg, kl, a0, a1, b0, b1, sum);
            residual_acc(vg, p->tg, m, N, w);
            continue;
        }
        /* vg -> Vg; r2c preserves vg */
        fwd_fft(p, bd, m, vg, p->Vg);
        for (int c = 0; c < m; c++) {
            fftwf_complex *Vc = p->Vg + (int64_t)c * p->hs; /* [h] */
            X[0] = a0 * Vc[0][0];
            for (int k = 1; k < kl; k++) X[k] = a1 * (p->cs[k] * Vc[k][0] + p->sn[k] * Vc[k][1]);
            for (int j = h; j < omega; j++) {
                const int k = N - j; /* 1 <= k < ne */
                X[j] = a1 * (p->sn[k] * Vc[k][0] - p->cs[k] * Vc[k][1]);
            }
            for (int j = 0; j < omega; j++) sum += (double)X[j] * X[j];
            /* The low-passed spectrum, in place. */
            Vc[0][0] = b0 * X[0];
            Vc[0][1] = 0.0f;
            if (kh <= kl) { /* every pair has a kept member */
                for (int k = 1; k < h; k++)
                    dct3_pair(Vc[k], k < omega ? X[k] : 0.0f, N - k < omega ? X[N - k] : 0.0f, b1,
                              p->cs[k], p->sn[k]);
            } else {
                for (int k = 1; k < kl; k++) /* k < kl < kh: X[N-k] is cut */
                    dct3_pair(Vc[k], X[k], 0.0f, b1, p->cs[k], p->sn[k]);
                int kz = kh < h ? kh : h; /* [kl, kz): both cut, b1 * 0 pairs give +0 */
                if (kz > he) kz = he;
                if (kz > kl) memset(Vc + kl, 0, sizeof(fftwf_complex) * (size_t)(kz - kl));
                for (int k = kz; k < he; k++) /* k >= kh > kl: X[k] is cut */
                    dct3_pair(Vc[k], 0.0f, X[N - k], b1, p->cs[k], p->sn[k]);
            }
        }
        /* base (permuted) -> tg; c2r destroys Vg, not vg */
        inv_fft(p, bd, m, p->Vg, p->tg);
        residual_acc(vg, p->tg, m, N, w);
    }
    *lo = sum;
    for (int q = 0; q < ne; q++) acc[2 * q] = w[q];
    for (int q = 0; q < no; q++) acc[2 * q + 1] = w[N - 1 - q];
    return KVS_OK;
}
