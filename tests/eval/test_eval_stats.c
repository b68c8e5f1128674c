/* test_eval_stats.c -- eval/stats.c on hand-checked cases: exact McNemar
 * p-values, Holm-Bonferroni adjustment, the paired bootstrap CI (properties,
 * with a fixed seed), the sign-flip test and the minimum detectable
 * differences. Golden numbers, each from a line of Python:
 *   McNemar b=7, c=1:  2*sum(comb(8,i) for i in range(2))/2**8   = 0.0703125
 *   b=1, c=9:          2*sum(comb(10,i) for i in range(2))/2**10 = 0.021484375
 *   b=8, c=1:          2*sum(comb(9,i) for i in range(2))/2**9   = 0.0390625
 *   b=10, c=30:        2*sum(comb(40,i) for i in range(11))/2**40
 *                                                  = 0.0022214337732293643
 *   z_0.975 + z_0.8 = 1.959963984540054 + 0.8416212335729143 = 2.8015852181129683
 *   MDE binary n=30, p_d=0.3: 2.8015852181129683*sqrt(0.3/30) = 0.28015852181129683
 *   MDE mean n=100, sd=2: 2.8015852181129683*2/10 = 0.5603170436225937
 *   sign-flip, d = 1..10 (all positive): exact p = 2/2**10 = 0.001953125
 */
#include "kvs_eval.h"
#include "test_util.h"

#include <math.h>

static void test_mcnemar(void) {
    CHECK_NEAR(kvs_mcnemar_exact_p(7, 1), 0.0703125, 1e-15);
    CHECK_NEAR(kvs_mcnemar_exact_p(1, 7), 0.0703125, 1e-15); /* symmetric */
    CHECK_NEAR(kvs_mcnemar_exact_p(1, 9), 0.021484375, 1e-15);
    CHECK_NEAR(kvs_mcnemar_exact_p(8, 1), 0.0390625, 1e-15);
    CHECK_NEAR(kvs_mcnemar_exact_p(10, 30), 0.0022214337732293643, 1e-13);
    CHECK_NEAR(kvs_mcnemar_exact_p(0, 2), 0.5, 1e-15);
    CHECK_NEAR(kvs_mcnemar_exact_p(0, 16), 2.0 / 65536.0, 1e-18);
    CHECK(kvs_mcnemar_exact_p(0, 0) == 1.0);  /* no discordant pairs */
    CHECK(kvs_mcnemar_exact_p(3, 3) == 1.0);  /* 2 P[X <= 3] > 1: clamped */
    CHECK(isnan(kvs_mcnemar_exact_p(-1, 3)));
    /* large counts stay finite and in (0, 1] */
    const double p = kvs_mcnemar_exact_p(4000, 4300);
    CHECK(p > 0 && p < 0.05);
}

/* p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005*4 = 0.02, 0.01*3 = 0.03,
 * 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.02, 0.03, 0.06, 0.06. */
static void test_holm(void) {
    const double p[5] = {0.01, 0.04, NAN, 0.03, 0.005};
    double a[5];
    kvs_holm_adjust(p, 5, a);
    CHECK_NEAR(a[0], 0.03, 1e-15);
    CHECK_NEAR(a[1], 0.06, 1e-15);
    CHECK(isnan(a[2]));
    CHECK_NEAR(a[3], 0.06, 1e-15);
    CHECK_NEAR(a[4], 0.02, 1e-15);
    const double q[3] = {0.5, 0.9, 0.7}; /* (3 * 0.5 = 1.5) -> clamped to 1 */
    double b[3];
    kvs_holm_adjust(q, 3, b);
    CHECK(b[0] == 1.0 && b[1] == 1.0 && b[2] == 1.0);
    kvs_holm_adjust(q, 0, b); /* nothing to do */
}

static double normal(uint64_t *s) {
    /* Box-Muller from splitmix-like uniform draws (test data only) */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double u1 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
    z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double u2 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The paired CI is deterministic in its seed, contains the point estimate,
 * shrinks as n grows (~ 1/sqrt(n)), and is narrower than the unpaired
 * spread when the two methods' scores are correlated (the point of
 * pairing). */
static void test_paired_bootstrap(void) {
    enum { NMAX = 400 };
    double x[NMAX], y[NMAX];
    uint64_t s = 11;
    for (int i = 0; i < NMAX; i++) {
        const double common = 3.0 * normal(&s); /* the sample's difficulty */
        x[i] = common + 0.3 + 0.5 * normal(&s);
        y[i] = common + 0.5 * normal(&s);
    }
    double m1, l1, h1, m2, l2, h2;
    kvs_paired_bootstrap_ci(x, y, 25, 1000, 7, &m1, &l1, &h1);
    kvs_paired_bootstrap_ci(x, y, 25, 1000, 7, &m2, &l2, &h2);
    CHECK(m1 == m2 && l1 == l2 && h1 == h2); /* same seed, same CI */
    double diff = 0;
    for (int i = 0; i < 25; i++) diff += x[i] - y[i];
    CHECK_NEAR(m1, diff / 25, 1e-12);
    CHECK_MSG(l1 <= m1 && m1 <= h1, "CI [%g, %g] misses %g", l1, h1, m1);
    kvs_paired_bootstrap_ci(x, y, NMAX, 1000, 7, &m2, &l2, &h2);
    CHECK_MSG(l2 <= m2 && m2 <= h2, "CI [%g, %g] misses %g", l2, h2, m2);
    CHECK_MSG(h2 - l2 < 0.6 * (h1 - l1), "n=400 CI width %g not below 0.6 x n=25's %g", h2 - l2,
              h1 - l1);
    /* the true difference 0.3 lies in the n=400 interval */
    CHECK_MSG(l2 < 0.3 && 0.3 < h2, "n=400 CI [%g, %g] misses 0.3", l2, h2);
    /* unpaired: the separate CIs of x and y are each wider than the paired one */
    double mx, lx, hx;
    kvs_bootstrap_ci(x, NMAX, 1000, 7, &mx, &lx, &hx);
    CHECK_MSG(hx - lx > 2 * (h2 - l2), "paired CI %g not narrower than x's own %g", h2 - l2,
              hx - lx);
    kvs_paired_bootstrap_ci(x, y, 1, 1000, 7, &m2, &l2, &h2); /* one pair: a point */
    CHECK(l2 == m2 && h2 == m2);
}

static void test_signflip(void) {
    double d[10];
    for (int i = 0; i < 10; i++) d[i] = i + 1;
    const double p = kvs_signflip_p(d, 10, 20000, 5);
    /* exact 0.001953125; Monte Carlo with 20000 draws: about 40 +- 13 hits */
    CHECK_MSG(p > 0.0005 && p < 0.005, "sign-flip p %g, exact 0.00195", p);
    CHECK(kvs_signflip_p(d, 10, 20000, 5) == p); /* deterministic */
    double z[4] = {0, 0, 0, 0};
    CHECK(kvs_signflip_p(z, 4, 100, 1) == 1.0);
    double sym[6] = {1, -1, 2, -2, 3, -3}; /* mean 0: every pattern is at least as extreme */
    CHECK(kvs_signflip_p(sym, 6, 1000, 1) == 1.0);
}

static void test_mde(void) {
    CHECK_NEAR(kvs_power_z(0.05, 0.8), 2.8015852181129683, 1e-9);
    CHECK_NEAR(kvs_mde_paired_binary(30, 0.3, 0.05, 0.8), 0.28015852181129683, 1e-9);
    CHECK_NEAR(kvs_mde_paired_mean(100, 2.0, 0.05, 0.8), 0.5603170436225937, 1e-9);
    /* four times the samples: half the MDE */
    CHECK_NEAR(kvs_mde_paired_binary(120, 0.3, 0.05, 0.8), 0.28015852181129683 / 2, 1e-9);
    CHECK(isnan(kvs_mde_paired_binary(30, 0.0, 0.05, 0.8))); /* no discordance: undefined */
    CHECK(isnan(kvs_mde_paired_mean(1, 1.0, 0.05, 0.8)));
    CHECK(isnan(kvs_power_z(0.0, 0.8)));
}

int main(void) {
    test_mcnemar();
    test_holm();
    test_paired_bootstrap();
    test_signflip();
    test_mde();
    return kvs_test_finish("test_eval_stats");
}
