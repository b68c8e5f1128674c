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
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvs_dct_plan {
    int n, d, h;         /* h = N/2 + 1 complex outputs per column */
    float *v;            /* [d][N] permuted columns (r2c input / c2r output) */
    fftwf_complex *V;    /* [d][h] spectra */
    float *t;            /* [d][N] row-major path: transposed block */
    float *cs, *sn;      /* [h] cos, sin of pi k / (2N) */
    float *col, *acc_p;  /* [N] each: one column's coefficients, squared residual
                            (kvs_dct_lowpass_sqres) */
    fftwf_plan r2c, c2r; /* all d columns: v -> V, V -> v */
    /* kvs_dct_lowpass_sqres works on groups of g columns (the last one has
     * d - (ng - 1) g) so that a group's spectrum and base stay in L2:
     * gr2c[i] / gc2r[i] (i = 0 full group, 1 last group; NULL when the same
     * plan serves) transform group columns of v into Vg and Vg into tg. Only
     * used where FFTW planned each column exactly as in r2c / c2r (see
     * same_columns); otherwise g = d and Vg = V, tg = t. */
    int g, ng;
    fftwf_complex *Vg;   /* [g][h] a group's spectra */
    float *tg;           /* [g][N] its low-pass bases (permuted) */
    float *rows;         /* [DCT_CHUNK][d] fp16 / bf16 rows converted to fp32 */
    fftwf_plan gr2c[2], gc2r[2];
};

/* Bytes of one column group's working set (its columns of v, spectrum and
 * base: about 12 g N) that kvs_dct_lowpass_sqres aims to keep in L2. */
enum { DCT_GROUP_BYTES = 512 << 10 };
enum { DCT_CHUNK = 32 }; /* tokens per read of a view (L1-sized) */

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

/* Chooses the column group of kvs_dct_lowpass_sqres and plans it (the
 * last group, if narrower, with the first group's buffers). A group starts
 * at v + c0 N with c0 a multiple of g; FFTW's new-array execute needs it as
 * aligned as v, so g N floats are made a multiple of 64 bytes. */
static kvs_status plan_groups(kvs_dct_plan *p, kvs_err *err) {
    const int N = p->n, d = p->d, h = p->h;
    int g = (int)(DCT_GROUP_BYTES / (12 * (int64_t)N));
    g = g < 8 ? 8 : g - g % 8;
    if ((int64_t)g * N % 16) g = (g + 15) / 16 * 16;
    int n[1] = {N};
    p->rows = malloc(sizeof(float) * DCT_CHUNK * (size_t)d);
    if (!p->rows)
        return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
    if (g < d) {
        const int ng = (d + g - 1) / g, last = d - (ng - 1) * g;
        p->Vg = fftwf_malloc(sizeof(fftwf_complex) * (size_t)h * (size_t)g);
        p->tg = fftwf_malloc(sizeof(float) * (size_t)N * (size_t)g);
        if (!p->Vg || !p->tg)
            return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
        int ok = 1;
        for (int i = 0; i < (last == g ? 1 : 2) && ok; i++) {
            const int m = i ? last : g;
            p->gr2c[i] = fftwf_plan_many_dft_r2c(1, n, m, p->v, NULL, 1, N, p->Vg, NULL, 1, h,
                                                 FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
            p->gc2r[i] = fftwf_plan_many_dft_c2r(1, n, m, p->Vg, NULL, 1, h, p->tg, NULL, 1, N,
                                                 FFTW_ESTIMATE);
            if (!p->gr2c[i] || !p->gc2r[i])
                return kvs_errorf(err, KVS_ERR_INTERNAL,
                                  "dct: FFTW could not plan %d columns of N=%d", m, N);
            ok = same_columns(p->gr2c[i], m, p->r2c, d) && same_columns(p->gc2r[i], m, p->c2r, d);
        }
        if (ok) {
            p->g = g;
            p->ng = ng;
            return KVS_OK;
        }
        for (int i = 0; i < 2; i++) { /* FFTW planned a group differently: one group */
            if (p->gr2c[i]) fftwf_destroy_plan(p->gr2c[i]);
            if (p->gc2r[i]) fftwf_destroy_plan(p->gc2r[i]);
            p->gr2c[i] = p->gc2r[i] = NULL;
        }
        fftwf_free(p->Vg);
        fftwf_free(p->tg);
    }
    p->g = d;
    p->ng = 1;
    p->Vg = p->V;
    p->tg = p->t;
    return KVS_OK;
}

int kvs_dct_plan_n(const kvs_dct_plan *p) { return p->n; }
int kvs_dct_plan_d(const kvs_dct_plan *p) { return p->d; }
int kvs_dct_plan_group(const kvs_dct_plan *p) { return p->g; }

void kvs_dct_plan_destroy(kvs_dct_plan *p) {
    if (!p) return;
    if (p->r2c) fftwf_destroy_plan(p->r2c);
    if (p->c2r) fftwf_destroy_plan(p->c2r);
    for (int i = 0; i < 2; i++) {
        if (p->gr2c[i]) fftwf_destroy_plan(p->gr2c[i]);
        if (p->gc2r[i]) fftwf_destroy_plan(p->gc2r[i]);
    }
    if (p->Vg != p->V) fftwf_free(p->Vg);
    if (p->tg != p->t) fftwf_free(p->tg);
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
    kvs_status st = KVS_OK;
    kvs_dct_plan *p = NULL;
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "dct: NULL output");
    *out = NULL;
    if (N < 1 || d < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d must be >= 1", N, d);
    if ((int64_t)N * d > INT32_MAX / 2)
        return kvs_errorf(err, KVS_ERR_INVALID, "dct: plan shape N=%d d=%d exceeds 2^30 elements",
                          N, d);
    p = calloc(1, sizeof *p);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
    p->n = N;
    p->d = d;
    p->h = N / 2 + 1;
    const size_t nd = (size_t)N * (size_t)d;
    p->v = fftwf_malloc(sizeof(float) * nd);
    p->t = fftwf_malloc(sizeof(float) * nd);
    p->V = fftwf_malloc(sizeof(fftwf_complex) * (size_t)p->h * (size_t)d);
    p->cs = malloc(sizeof(float) * (size_t)p->h);
    p->sn = malloc(sizeof(float) * (size_t)p->h);
    p->col = malloc(sizeof(float) * (size_t)N);
    p->acc_p = malloc(sizeof(float) * (size_t)N);
    if (!p->v || !p->t || !p->V || !p->cs || !p->sn || !p->col || !p->acc_p) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "dct: out of memory planning N=%d d=%d", N, d);
        goto cleanup;
    }
    for (int k = 0; k < p->h; k++) {
        const double a = 3.14159265358979323846 * (double)k / (2.0 * (double)N);
        p->cs[k] = (float)cos(a);
        p->sn[k] = (float)sin(a);
    }
    int n[1] = {N};
    /* FFTW's planner is not re-entrant; the server and the runner may compress
     * on several threads at once, so make it thread-safe once per process
     * (fftw3f_threads; the only process-wide state kvsieve touches). */
    static pthread_once_t planner_once = PTHREAD_ONCE_INIT;
    pthread_once(&planner_once, fftwf_make_planner_thread_safe);
    /* PRESERVE_INPUT is r2c's default anyway; kvs_dct_lowpass_sqres relies on
     * it (v still holds x after the forward FFT). */
    p->r2c = fftwf_plan_many_dft_r2c(1, n, d, p->v, NULL, 1, N, p->V, NULL, 1, p->h,
                                     FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
    p->c2r = fftwf_plan_many_dft_c2r(1, n, d, p->V, NULL, 1, p->h, p->v, NULL, 1, N,
                                     FFTW_ESTIMATE);
    if (!p->r2c || !p->c2r) {
        st = kvs_errorf(err, KVS_ERR_INTERNAL, "dct: FFTW could not plan N=%d d=%d", N, d);
        goto cleanup;
    }
    if ((st = plan_groups(p, err))) goto cleanup;
    *out = p;
    p = NULL;
cleanup:
    kvs_dct_plan_destroy(p);
    return st;
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
    fftwf_execute(p->r2c);
    const float s0 = (float)sqrt(1.0 / N), s1 = (float)sqrt(2.0 / N);
    for (int c = 0; c < d; c++) {
        const fftwf_complex *Vc = p->V + (int64_t)c * h; /* [h] */
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
        fftwf_complex *Vc = p->V + (int64_t)c * h;
        Vc[0][0] = s0 * Xc[0];
        Vc[0][1] = 0.0f;
        for (int k = 1; k < h; k++) {
            const float y1 = s1 * Xc[k], y2 = s1 * Xc[N - k], ck = p->cs[k], sk = p->sn[k];
            Vc[k][0] = ck * y1 + sk * y2;
            Vc[k][1] = sk * y1 - ck * y2;
        }
    }
    fftwf_execute(p->c2r);
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
    float *X = p->col;   /* [N] one column's coefficients, entries m < omega valid */
    float *w = p->acc_p; /* [N] squared residual in permuted order */
    memset(w, 0, sizeof(float) * (size_t)N);
    load_head(x, head, N, d, p->v, p->rows);
    double sum = 0.0;
    for (int gi = 0; gi < p->ng; gi++) {
        const int c0 = gi * p->g, m = d - c0 < p->g ? d - c0 : p->g; /* columns [c0, c0 + m) */
        float *vg = p->v + (int64_t)c0 * N; /* [m][N] */
        /* vg -> Vg; r2c preserves vg */
        fftwf_execute_dft_r2c(p->ng == 1 ? p->r2c : p->gr2c[m == p->g ? 0 : 1], vg, p->Vg);
        for (int c = 0; c < m; c++) {
            fftwf_complex *Vc = p->Vg + (int64_t)c * h; /* [h] */
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
                const int kz = kh < h ? kh : h; /* [kl, kz): both cut, b1 * 0 pairs give +0 */
                if (kz > kl) memset(Vc + kl, 0, sizeof(fftwf_complex) * (size_t)(kz - kl));
                for (int k = kz; k < h; k++) /* k >= kh > kl: X[k] is cut */
                    dct3_pair(Vc[k], 0.0f, X[N - k], b1, p->cs[k], p->sn[k]);
            }
        }
        /* base (permuted) -> tg; c2r destroys Vg, not vg */
        fftwf_execute_dft_c2r(p->ng == 1 ? p->c2r : p->gc2r[m == p->g ? 0 : 1], p->Vg, p->tg);
        for (int c = 0; c < m; c++) {
            const float *xc = vg + (int64_t)c * N, *bc = p->tg + (int64_t)c * N; /* [N] */
            for (int q = 0; q < N; q++) {
                const float r = xc[q] - bc[q];
                w[q] += r * r;
            }
        }
    }
    *lo = sum;
    for (int q = 0; q < ne; q++) acc[2 * q] = w[q];
    for (int q = 0; q < no; q++) acc[2 * q + 1] = w[N - 1 - q];
    return KVS_OK;
}
