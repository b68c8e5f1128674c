/*
 * test_budget.c -- kvs_budget_per_layer, kvs_budget_min and kvs_budget_allocate:
 * hand-checked golden cases (each worked out in the comment next to it), error
 * messages, and properties over random weights / L / N checked against an
 * independent continuous water-filling solution found by bisection.
 */
#include "kvsieve.h"
#include "test_util.h"

static kvs_err e_, *e = &e_;

static void check_alloc(const double *w, int L, long long total, int bmin, int bmax, const int *want) {
    int out[16];
    kvs_err_clear(e);
    CHECK_OK(kvs_budget_allocate(w, L, total, bmin, bmax, out, e), e);
    for (int l = 0; l < L; l++) CHECK_MSG(out[l] == want[l], "layer %d: got %d want %d", l, out[l], want[l]);
}

static void test_per_layer(void) {
    int b = 0;
    kvs_budget r02 = {0.2, 0}, r029 = {0.29, 0}, r1 = {1.0, 0}, rtiny = {0.001, 0};
    kvs_budget t5 = {0, 5}, tbig = {0, 5000};
    CHECK_OK(kvs_budget_per_layer(&r02, 10, &b, e), e);
    CHECK_EQ_INT(b, 2);
    CHECK_OK(kvs_budget_per_layer(&r02, 11, &b, e), e);
    CHECK_EQ_INT(b, 2); /* floor(2.2) */
    CHECK_OK(kvs_budget_per_layer(&r029, 100, &b, e), e);
    CHECK_EQ_INT(b, 29); /* 0.29*100 = 28.999999999999996 in doubles */
    CHECK_OK(kvs_budget_per_layer(&r1, 77, &b, e), e);
    CHECK_EQ_INT(b, 77);
    CHECK_OK(kvs_budget_per_layer(&rtiny, 10, &b, e), e);
    CHECK_EQ_INT(b, 1); /* never below 1 */
    CHECK_OK(kvs_budget_per_layer(&t5, 10, &b, e), e);
    CHECK_EQ_INT(b, 5);
    CHECK_OK(kvs_budget_per_layer(&tbig, 100, &b, e), e);
    CHECK_EQ_INT(b, 100); /* never above N */
    kvs_budget none = {0, 0}, both = {0.5, 3}, big = {1.5, 0}, neg = {-0.1, 0}, nan = {NAN, 0}, tneg = {0, -3};
    CHECK_FAILS(kvs_budget_per_layer(&none, 10, &b, e), KVS_ERR_INVALID, e, "neither ratio nor tokens");
    CHECK_FAILS(kvs_budget_per_layer(&both, 10, &b, e), KVS_ERR_INVALID, e, "both ratio");
    CHECK_FAILS(kvs_budget_per_layer(&big, 10, &b, e), KVS_ERR_INVALID, e, "ratio 1.5 is not in (0, 1]");
    CHECK_FAILS(kvs_budget_per_layer(&neg, 10, &b, e), KVS_ERR_INVALID, e, "not in (0, 1]");
    CHECK_FAILS(kvs_budget_per_layer(&nan, 10, &b, e), KVS_ERR_INVALID, e, "NaN");
    CHECK_FAILS(kvs_budget_per_layer(&tneg, 10, &b, e), KVS_ERR_INVALID, e, "tokens = -3");
    CHECK_FAILS(kvs_budget_per_layer(&r02, 0, &b, e), KVS_ERR_INVALID, e, "N = 0");

    CHECK_EQ_INT(kvs_budget_min(1), 1);
    CHECK_EQ_INT(kvs_budget_min(100), 1);
    CHECK_EQ_INT(kvs_budget_min(101), 2);
    CHECK_EQ_INT(kvs_budget_min(300), 3); /* ceil(0.01*300) must not become 4 */
    CHECK_EQ_INT(kvs_budget_min(8192), 82);
}

static void test_golden(void) {
    /* x = 2.5, 2.5, 5 -> floors 2,2,5 (9), one extra: remainder tie -> layer 0 */
    { double w[] = {1, 1, 2}; int want[] = {3, 2, 5}; check_alloc(w, 3, 10, 1, 10, want); }
    /* all-zero weights: 2.5 each -> 2,2,2,2 + two extras to layers 0, 1 */
    { double w[] = {0, 0, 0, 0}; int want[] = {3, 3, 2, 2}; check_alloc(w, 4, 10, 1, 10, want); }
    /* x = 10,1,1 with bmax 6: layer 0 clamps to 6, the 6 left split 3/3 */
    { double w[] = {10, 1, 1}; int want[] = {6, 3, 3}; check_alloc(w, 3, 12, 1, 6, want); }
    /* x = 2,0,0,18, bmin 2: layers 1,2 clamp to 2; 16 over w {1,9}: 1.6 < 2 clamps;
     * layer 3 gets the 14 left */
    { double w[] = {1, 0, 0, 9}; int want[] = {2, 2, 2, 14}; check_alloc(w, 4, 20, 2, 20, want); }
    /* x = 15.5, .155 x3 in [2, 8]: over 7.5 > under 5.5 -> clamp layer 0 to 8 first;
     * then 8 over three equal layers: 2.67 each -> 2,2,2 + extras to layers 1, 2 */
    { double w[] = {100, 1, 1, 1}; int want[] = {8, 3, 3, 2}; check_alloc(w, 4, 16, 2, 8, want); }
    /* x = .7,1.4,2.1,2.8 in [1,7]: layer 0 clamps to 1; 6 over {2,3,4}: 1.33, 2, 2.67
     * -> 1,2,2 + one extra to the largest remainder (layer 3) */
    { double w[] = {1, 2, 3, 4}; int want[] = {1, 1, 2, 3}; check_alloc(w, 4, 7, 1, 7, want); }
    /* plain largest remainder: x = 1.2, 2.4, 3.6, 4.8 (sum 12) -> 1,2,3,4 (10) + 2 extras
     * to remainders .8 (layer 3) and .6 (layer 2) */
    { double w[] = {1, 2, 3, 4}; int want[] = {1, 2, 4, 5}; check_alloc(w, 4, 12, 1, 12, want); }
    /* extremes: total = L*bmin and L*bmax */
    { double w[] = {5, 1, 0}; int want[] = {3, 3, 3}; check_alloc(w, 3, 9, 3, 7, want); }
    { double w[] = {5, 1, 0}; int want[] = {7, 7, 7}; check_alloc(w, 3, 21, 3, 7, want); }
    /* the positive layer saturates: the zero-weight layers share what is left */
    { double w[] = {1, 0, 0}; int want[] = {6, 3, 3}; check_alloc(w, 3, 12, 1, 6, want); }
    /* single layer */
    { double w[] = {0.3}; int want[] = {42}; check_alloc(w, 1, 42, 1, 100, want); }
}

static void test_errors(void) {
    int out[4];
    double w[] = {1, 1, NAN, 1}, wi[] = {1, INFINITY, 1, 1}, wn[] = {1, 1, 1, -2}, ok[] = {1, 1, 1, 1};
    CHECK_FAILS(kvs_budget_allocate(w, 4, 8, 1, 8, out, e), KVS_ERR_NUMERIC, e, "layer 2: weight is NaN");
    CHECK_FAILS(kvs_budget_allocate(wi, 4, 8, 1, 8, out, e), KVS_ERR_NUMERIC, e, "layer 1: weight is Inf");
    CHECK_FAILS(kvs_budget_allocate(wn, 4, 8, 1, 8, out, e), KVS_ERR_INVALID, e, "layer 3: weight -2");
    CHECK_FAILS(kvs_budget_allocate(ok, 4, 33, 1, 8, out, e), KVS_ERR_INVALID, e, "cannot be split");
    CHECK_FAILS(kvs_budget_allocate(ok, 4, 3, 1, 8, out, e), KVS_ERR_INVALID, e, "cannot be split");
    CHECK_FAILS(kvs_budget_allocate(ok, 0, 3, 1, 8, out, e), KVS_ERR_INVALID, e, "L = 0");
    CHECK_FAILS(kvs_budget_allocate(ok, 4, 8, 5, 3, out, e), KVS_ERR_INVALID, e, "bounds");
}

/* Continuous water-filling reference: x_l = clamp(lam * w_l, bmin, bmax), sum = total. */
static void reference(const double *w, int L, double total, int bmin, int bmax, double *x) {
    double ws = 0;
    for (int l = 0; l < L; l++) ws += w[l];
    double wt[64];
    for (int l = 0; l < L; l++) wt[l] = ws == 0 ? 1.0 : w[l];
    /* positive layers all at bmax and still short: they stay there and the
     * zero-weight layers share the rest equally */
    double cap = 0;
    int nz = 0;
    for (int l = 0; l < L; l++) {
        cap += wt[l] > 0 ? bmax : bmin;
        nz += wt[l] == 0;
    }
    if (cap < total && nz > 0) {
        double rest = total;
        for (int l = 0; l < L; l++) rest -= wt[l] > 0 ? bmax : 0;
        for (int l = 0; l < L; l++) x[l] = wt[l] > 0 ? bmax : rest / nz;
        return;
    }
    double lo = 0, hi = 1;
    for (;;) {
        double s = 0;
        for (int l = 0; l < L; l++) s += fmin(fmax(hi * wt[l], bmin), bmax);
        if (s >= total) break;
        hi *= 2;
        if (hi > 1e300) break;
    }
    for (int it = 0; it < 300; it++) {
        double mid = 0.5 * (lo + hi), s = 0;
        for (int l = 0; l < L; l++) s += fmin(fmax(mid * wt[l], bmin), bmax);
        if (s < total) lo = mid;
        else hi = mid;
    }
    for (int l = 0; l < L; l++) x[l] = fmin(fmax(hi * wt[l], bmin), bmax);
}

static void test_properties(void) {
    uint64_t r = 12345;
    int fails = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int L = 1 + (int)(kvs_rng_next(&r) % 64);
        int N = 1 + (int)(kvs_rng_next(&r) % 5000);
        int bmin = kvs_budget_min(N), bmax = N;
        int per = bmin + (int)(kvs_rng_next(&r) % (uint64_t)(N - bmin + 1));
        long long total = (long long)L * per;
        double w[64];
        int kind = trial % 4;
        for (int l = 0; l < L; l++) {
            double u = kvs_rng_uniform(&r);
            if (kind == 0) w[l] = u;
            else if (kind == 1) w[l] = u < 0.3 ? 0.0 : u;              /* some zeros */
            else if (kind == 2) w[l] = exp(20.0 * (u - 0.5));          /* wide range: clamps */
            else w[l] = (double)(kvs_rng_next(&r) % 3);                /* many ties */
        }
        if (trial % 97 == 0)
            for (int l = 0; l < L; l++) w[l] = 0.0;
        int out[64], out2[64];
        kvs_err_clear(e);
        if (kvs_budget_allocate(w, L, total, bmin, bmax, out, e) != KVS_OK) {
            fprintf(stderr, "trial %d: %s\n", trial, e->msg);
            fails++;
            continue;
        }
        kvs_budget_allocate(w, L, total, bmin, bmax, out2, e);
        double x[64];
        reference(w, L, (double)total, bmin, bmax, x);
        long long sum = 0;
        int ok = 1;
        for (int l = 0; l < L; l++) {
            sum += out[l];
            if (out[l] < bmin || out[l] > bmax) ok = 0;
            if (out[l] != out2[l]) ok = 0;                          /* deterministic */
            if (fabs(out[l] - x[l]) >= 1.0 + 1e-6 * x[l]) ok = 0;   /* floor or ceil of the ideal */
            for (int j = 0; j < L; j++)
                if (w[l] > w[j] && out[l] < out[j]) ok = 0;         /* monotone in weight */
            for (int j = l + 1; j < L; j++)
                if (w[l] == w[j] && (out[l] < out[j] || out[l] > out[j] + 1)) ok = 0; /* ties: lower first */
        }
        if (sum != total) ok = 0;
        if (!ok) {
            if (fails < 5) {
                fprintf(stderr, "trial %d L=%d N=%d total=%lld:", trial, L, N, total);
                for (int l = 0; l < L && l < 12; l++) fprintf(stderr, " (%g->%d ~%.2f)", w[l], out[l], x[l]);
                fprintf(stderr, "\n");
            }
            fails++;
        }
    }
    CHECK_EQ_INT(fails, 0);
}

int main(void) {
    test_per_layer();
    test_golden();
    test_errors();
    test_properties();
    return kvs_test_finish("core_budget");
}
