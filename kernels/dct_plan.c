/*
 * dct_plan.c -- plans of the CPU DCT (dct.h): the route rule, the
 * process-wide FFTW plan cache (direct route per (N, d), Bluestein per M),
 * Bluestein's band split and kernels, and kvs_dct_plan create / destroy.
 *
 * What it is: everything made before a transform runs (dct.c describes the
 * algorithms and the cache). What it is not: no transform (dct_fft.c,
 * dct.c, dct_lowpass.c run them).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "dct_internal.h"

#include <assert.h>
#include <fftw3.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* ---- the plan cache (process-wide; see the top of dct.c) ---------------------- */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static direct_entry *direct_cache;
static chirp_entry *chirp_cache;

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
 * well below N (a narrow low band, K ~ gamma N) two blocks through
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
