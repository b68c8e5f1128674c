/*
 * test_error_util.c -- kvs_err prefixing / truncation, status names, timer and
 * the splitmix64 generator (known values, ranges, normal moments).
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdint.h>

static void test_errors(void) {
    kvs_err e;
    kvs_err_clear(&e);
    CHECK_EQ_INT(e.code, KVS_OK);
    CHECK(e.msg[0] == '\0');
    CHECK_EQ_INT(kvs_errorf(&e, KVS_ERR_NUMERIC, "NaN in %s", "K"), KVS_ERR_NUMERIC);
    CHECK(strcmp(e.msg, "NaN in K") == 0);
    CHECK_EQ_INT(kvs_err_prefix(&e, "head %d", 1), KVS_ERR_NUMERIC);
    CHECK_EQ_INT(kvs_err_prefix(&e, "layer %d", 3), KVS_ERR_NUMERIC);
    CHECK_MSG(strcmp(e.msg, "layer 3: head 1: NaN in K") == 0, "%s", e.msg);
    /* errorf on a filled err prefixes too, and sets the new code */
    CHECK_EQ_INT(kvs_errorf(&e, KVS_ERR_IO, "file x"), KVS_ERR_IO);
    CHECK_EQ_INT(e.code, KVS_ERR_IO);
    CHECK_MSG(strcmp(e.msg, "file x: layer 3: head 1: NaN in K") == 0, "%s", e.msg);
    /* NULL err: code still returned */
    CHECK_EQ_INT(kvs_errorf(NULL, KVS_ERR_FORMAT, "x"), KVS_ERR_FORMAT);
    kvs_err_clear(NULL);
    /* truncation never overflows and keeps a terminator */
    kvs_err_clear(&e);
    char big[700];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvs_errorf(&e, KVS_ERR_INVALID, "%s", big);
    CHECK_EQ_INT(strlen(e.msg), sizeof e.msg - 1);
    kvs_err_prefix(&e, "%s", big);
    CHECK_EQ_INT(strlen(e.msg), sizeof e.msg - 1);
    kvs_err_clear(&e);
    kvs_errorf(&e, KVS_ERR_INVALID, "inner");
    kvs_err_prefix(&e, "%s", big);
    CHECK_EQ_INT(strlen(e.msg), sizeof e.msg - 1);
    /* status names are distinct and non-empty */
    for (int s = 0; s <= KVS_ERR_INTERNAL; s++) {
        const char *a = kvs_status_name((kvs_status)s);
        CHECK(a && a[0]);
        for (int t = 0; t < s; t++) CHECK(strcmp(a, kvs_status_name((kvs_status)t)) != 0);
    }
    CHECK(strcmp(kvs_status_name(KVS_OK), "ok") == 0);
}

static void test_rng(void) {
    /* splitmix64 reference values for seed 0 (Vigna's published sequence) */
    uint64_t s = 0;
    CHECK(kvs_rng_next(&s) == 0xE220A8397B1DCDAFull);
    CHECK(kvs_rng_next(&s) == 0x6E789E6AA1B965F4ull);
    CHECK(kvs_rng_next(&s) == 0x06C45D188009454Full);
    /* determinism */
    uint64_t a = 42, b = 42;
    for (int i = 0; i < 100; i++) CHECK(kvs_rng_next(&a) == kvs_rng_next(&b));
    /* uniform in [0, 1), mean ~ 0.5; normal mean ~ 0, var ~ 1 */
    uint64_t r = 7;
    double sum = 0, lo = 1, hi = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = kvs_rng_uniform(&r);
        CHECK(u >= 0.0 && u < 1.0);
        sum += u;
        if (u < lo) lo = u;
        if (u > hi) hi = u;
    }
    CHECK_NEAR(sum / n, 0.5, 0.01);
    CHECK(lo < 0.001 && hi > 0.999);
    double m1 = 0, m2 = 0;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        double z = kvs_rng_normal(&r);
        finite &= isfinite(z) ? 1 : 0;
        m1 += z;
        m2 += z * z;
    }
    CHECK(finite);
    m1 /= n;
    m2 = m2 / n - m1 * m1;
    CHECK_NEAR(m1, 0.0, 0.01);
    CHECK_NEAR(m2, 1.0, 0.02);
    uint64_t c = 99, d = 99;
    CHECK(kvs_rng_normal(&c) == kvs_rng_normal(&d));
}

static void test_timer(void) {
    double t0 = kvs_now_ms();
    volatile double x = 0;
    for (int i = 0; i < 1000000; i++) x += i;
    double t1 = kvs_now_ms();
    CHECK(t0 > 0.0);
    CHECK(t1 >= t0);
    CHECK(t1 - t0 < 10000.0);
}

int main(void) {
    test_errors();
    test_rng();
    test_timer();
    return kvs_test_finish("core_error_util");
}
