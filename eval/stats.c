/*
 * stats.c -- the report's statistics: percentile-bootstrap CIs of a mean
 * (plain and weighted) and, for the method comparisons, exact McNemar
 * p-values, a paired sign-flip permutation test, Holm-Bonferroni
 * adjustment, paired bootstrap CIs and minimum detectable differences.
 *
 * What it is: small, deterministic functions of arrays (declared in
 * kvs_eval.h, "Statistics"); the report files (report_data.c,
 * report_paired.c, report_decode.c) gather and pair the cells and call them;
 * nothing here calls back. What it is not: no SQL, no formatting, no pairing.
 * Randomness is splitmix64 from a caller's seed, so reports reproduce.
 */
#include "kvs_eval.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear-interpolated quantile of sorted v[0..n). */
static double quantile(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return v[n - 1];
    double f = pos - i;
    return v[i] + f * (v[i + 1] - v[i]);
}

void kvs_bootstrap_ci_weighted(const double *x, const double *w, int n, int resamples,
                               uint64_t seed, double *mean, double *lo, double *hi) {
    double s = 0, sw = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w ? w[i] : 1.0;
        s += x[i] * wi;
        sw += wi;
    }
    *mean = n > 0 && sw > 0 ? s / sw : NAN;
    if (n <= 1 || resamples < 2) {
        *lo = *hi = *mean;
        return;
    }
    double *m = malloc(sizeof *m * (size_t)resamples); /* [resamples] resample means */
    if (!m) {
        *lo = *hi = NAN;
        return;
    }
    /* splitmix64 inlined (this loop is the cost of a large report); the
     * index is a multiply-shift of the high 32 bits, unbiased enough for
     * n < 2^32 and free of a division. */
    uint64_t st = seed;
    for (int b = 0; b < resamples; b++) {
        double t = 0, tw = 0;
        for (int i = 0; i < n; i++) {
            uint64_t z = (st += 0x9e3779b97f4a7c15ULL);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            z ^= z >> 31;
            const uint64_t k = ((z >> 32) * (uint64_t)n) >> 32;
            if (w) {
                t += x[k] * w[k];
                tw += w[k];
            } else {
                t += x[k];
            }
        }
        m[b] = w ? (tw > 0 ? t / tw : NAN) : t / n;
    }
    qsort(m, (size_t)resamples, sizeof *m, cmp_double);
    *lo = quantile(m, resamples, 0.025);
    *hi = quantile(m, resamples, 0.975);
    free(m);
}

void kvs_bootstrap_ci(const double *x, int n, int resamples, uint64_t seed, double *mean,
                      double *lo, double *hi) {
    kvs_bootstrap_ci_weighted(x, NULL, n, resamples, seed, mean, lo, hi);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double kvs_mcnemar_exact_p(int64_t b, int64_t c) {
    if (b < 0 || c < 0) return NAN;
    const int64_t n = b + c, k = b < c ? b : c;
    if (n == 0) return 1.0;
    /* P[X <= k], X ~ Binomial(n, 1/2): terms C(n, i) 2^-n in log space
     * (lgamma), summed from the largest (i = k) down so small terms are
     * added to a sum of their own size. */
    const double ln2 = log(2.0), lnf = lgamma((double)n + 1.0);
    double cdf = 0.0;
    for (int64_t i = k; i >= 0; i--) {
        const double t = exp(lnf - lgamma((double)i + 1.0) - lgamma((double)(n - i) + 1.0) -
                             (double)n * ln2);
        cdf += t;
        if (t < 1e-300) break; /* the rest underflow */
    }
    const double p = 2.0 * cdf;
    return p > 1.0 ? 1.0 : p;
}

double kvs_signflip_p(const double *d, int n, int resamples, uint64_t seed) {
    if (n <= 0) return NAN;
    double s = 0.0, scale = 0.0;
    for (int i = 0; i < n; i++) {
        s += d[i];
        scale = fmax(scale, fabs(d[i]));
    }
    if (scale == 0.0) return 1.0;
    if (resamples < 1) return NAN;
    /* |sum| >= observed, with a relative slack so sign patterns that give
     * the same sum in exact arithmetic count (rounding must not make a tie
     * look like an exceedance or not). */
    const double obs = fabs(s) - 1e-12 * scale * n;
    uint64_t st = seed;
    int64_t ge = 0;
    for (int b = 0; b < resamples; b++) {
        double t = 0.0;
        for (int i = 0; i < n; i += 64) {
            uint64_t bits = splitmix(&st);
            for (int j = i; j < n && j < i + 64; j++, bits >>= 1) t += (bits & 1) ? d[j] : -d[j];
        }
        ge += fabs(t) >= obs;
    }
    return (double)(ge + 1) / (double)(resamples + 1);
}

static int cmp_idx_p(const void *a, const void *b, const double *p) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (p[i] != p[j]) return p[i] < p[j] ? -1 : 1;
    return i - j;
}

void kvs_holm_adjust(const double *p, int n, double *adj) {
    int *ord = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    int m = 0;
    for (int i = 0; i < n; i++) {
        adj[i] = NAN;
        if (ord && !isnan(p[i])) ord[m++] = i;
    }
    if (!ord) return; /* out of memory: every adjusted value stays NaN */
    /* insertion sort by p (m is one table's comparisons: small) */
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && cmp_idx_p(&ord[j - 1], &ord[j], p) > 0; j--) {
            const int t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    /* step-down: adj_(i) = max_{j <= i} min(1, (m - j) p_(j)), 0-based j */
    double run = 0.0;
    for (int i = 0; i < m; i++) {
        double a = (double)(m - i) * p[ord[i]];
        if (a > 1.0) a = 1.0;
        if (a > run) run = a;
        adj[ord[i]] = run;
    }
    free(ord);
}

void kvs_paired_bootstrap_ci(const double *x, const double *y, int n, int resamples, uint64_t seed,
                             double *mean, double *lo, double *hi) {
    /* Resampling pairs (i, i) with one index draw per pair is resampling the
     * differences: both methods see the same resampled samples. */
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!d) {
        *mean = *lo = *hi = NAN;
        return;
    }
    for (int i = 0; i < n; i++) d[i] = x[i] - y[i];
    kvs_bootstrap_ci(d, n, resamples, seed, mean, lo, hi);
    free(d);
}

/* Phi(z) = 0.5 erfc(-z / sqrt 2); its inverse by bisection (60 halvings of
 * [-40, 40] reach double precision; only a few calls per table). */
static double probit(double q) {
    double a = -40.0, b = 40.0;
    for (int i = 0; i < 100; i++) {
        const double m = 0.5 * (a + b);
        if (0.5 * erfc(-m / sqrt(2.0)) < q)
            a = m;
        else
            b = m;
    }
    return 0.5 * (a + b);
}

double kvs_power_z(double alpha, double power) {
    if (!(alpha > 0 && alpha < 1) || !(power > 0 && power < 1)) return NAN;
    return probit(1.0 - alpha / 2.0) + probit(power);
}

/* Paired binary outcomes, normal approximation to McNemar's test: with p_d
 * the share of discordant pairs, the estimated difference has variance
 * about p_d / n under no difference (Connor 1987 without its -delta^2 term,
 * which makes this slightly conservative), so a two-sided level-alpha test
 * has the given power against
 *   MDE = (z_{1-alpha/2} + z_{power}) sqrt(p_d / n). */
double kvs_mde_paired_binary(int n, double p_disc, double alpha, double power) {
    if (n <= 0 || !(p_disc > 0 && p_disc <= 1)) return NAN;
    return kvs_power_z(alpha, power) * sqrt(p_disc / n);
}

/* Paired continuous outcomes, the same normal approximation to the paired
 * t-test: MDE = (z_{1-alpha/2} + z_{power}) sd(d) / sqrt(n), sd with n - 1. */
double kvs_mde_paired_mean(int n, double sd_diff, double alpha, double power) {
    if (n <= 1 || !(sd_diff > 0)) return NAN;
    return kvs_power_z(alpha, power) * sd_diff / sqrt((double)n);
}
