/*
 * test_util.h -- the few macros every kvsieve test uses. Tests are plain
 * programs: they print what failed (file:line, the expression, the values)
 * and exit non-zero at the end if anything failed. No framework.
 */
#ifndef KVS_TEST_UTIL_H
#define KVS_TEST_UTIL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kvs_test_failures = 0;
static int kvs_test_checks = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        kvs_test_checks++;                                                       \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

#define CHECK_MSG(cond, ...)                                                     \
    do {                                                                         \
        kvs_test_checks++;                                                       \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                       \
    do {                                                                         \
        long long _a = (long long)(a), _b = (long long)(b);                      \
        kvs_test_checks++;                                                       \
        if (_a != _b) {                                                          \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", \
                    __FILE__, __LINE__, #a, _a, #b, _b);                         \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                    \
    do {                                                                         \
        double _a = (double)(a), _b = (double)(b);                               \
        double _s = fabs(_b) > 1.0 ? fabs(_b) : 1.0;                             \
        kvs_test_checks++;                                                       \
        if (!(fabs(_a - _b) <= (tol) * _s)) {                                    \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g (tol %g)\n", \
                    __FILE__, __LINE__, #a, _a, #b, _b, (double)(tol));          \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

/* A kvsieve call must succeed; prints the error message otherwise. */
#define CHECK_OK(call, errp)                                                     \
    do {                                                                         \
        kvs_test_checks++;                                                       \
        const kvs_err *_e = (errp);                                              \
        int _rc = (int)(call);                                                   \
        if (_rc != 0) {                                                          \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call, \
                    _rc, _e ? _e->msg : "");                                     \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

/* A call must fail with `code` and its message must contain `needle`. */
#define CHECK_FAILS(call, code, errp, needle)                                    \
    do {                                                                         \
        kvs_test_checks++;                                                       \
        kvs_err_clear(errp);                                                     \
        int _rc = (int)(call);                                                   \
        if (_rc != (int)(code) || !strstr((errp)->msg, (needle))) {              \
            fprintf(stderr, "%s:%d: expected %s to fail with %d and \"%s\"; got %d: %s\n", \
                    __FILE__, __LINE__, #call, (int)(code), (needle), _rc, (errp)->msg); \
            kvs_test_failures++;                                                 \
        }                                                                        \
    } while (0)

static inline int kvs_test_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, kvs_test_checks, kvs_test_failures);
    return kvs_test_failures ? 1 : 0;
}

#endif
