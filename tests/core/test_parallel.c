/*
 * test_parallel.c -- kvs_parallel_run: every unit runs exactly once on 1-70
 * threads (more threads than units and than the 64-thread cap included),
 * tids stay below kvs_parallel_threads, zero units is a no-op; failing units:
 * the error of the lowest failing unit is returned on any thread count, and
 * every unit below it ran.
 */
#include "kvsieve.h"
#include "test_util.h"

#include <stdatomic.h>

typedef struct {
    atomic_int *hits; /* [n] */
    atomic_int max_tid;
    int fail_a, fail_b; /* units that fail (-1: none) */
} job;

static kvs_status unit(void *p, int tid, int u, kvs_err *err) {
    job *j = p;
    atomic_fetch_add(&j->hits[u], 1);
    int cur = atomic_load(&j->max_tid);
    while (tid > cur && !atomic_compare_exchange_weak(&j->max_tid, &cur, tid)) {
    }
    if (u == j->fail_a || u == j->fail_b)
        return kvs_errorf(err, u == j->fail_a ? KVS_ERR_NUMERIC : KVS_ERR_IO, "unit %d failed", u);
    return KVS_OK;
}

int main(void) {
    kvs_err e_ = {0}, *e = &e_;
    const int ns[] = {0, 1, 3, 64, 1000};
    const int ts[] = {-1, 1, 2, 3, 7, 64, 70};
    static atomic_int hits[1000];
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ts / sizeof ts[0]; b++) {
            const int n = ns[a], t = ts[b];
            for (int u = 0; u < 1000; u++) atomic_init(&hits[u], 0);
            job j = {.hits = hits, .fail_a = -1, .fail_b = -1};
            atomic_init(&j.max_tid, -1);
            CHECK_OK(kvs_parallel_run(&j, unit, n, t, "test", e), e);
            for (int u = 0; u < 1000; u++) CHECK_EQ_INT(atomic_load(&hits[u]), u < n ? 1 : 0);
            const int nt = kvs_parallel_threads(t, n);
            CHECK(nt >= 1 && nt <= 64 && (n < 1 || nt <= n));
            CHECK(atomic_load(&j.max_tid) < nt);
        }
    /* units 700 and 300 fail: unit 300's error wins, units 0..299 all ran */
    for (int t = 1; t <= 8; t++) {
        for (int u = 0; u < 1000; u++) atomic_init(&hits[u], 0);
        job j = {.hits = hits, .fail_a = 300, .fail_b = 700};
        atomic_init(&j.max_tid, -1);
        CHECK_FAILS(kvs_parallel_run(&j, unit, 1000, t, "test", e), KVS_ERR_NUMERIC, e,
                    "unit 300 failed");
        for (int u = 0; u <= 300; u++) CHECK_EQ_INT(atomic_load(&hits[u]), 1);
        for (int u = 301; u < 1000; u++) CHECK(atomic_load(&hits[u]) <= 1);
    }
    CHECK_EQ_INT(kvs_parallel_threads(0, 10), 1);
    CHECK_EQ_INT(kvs_parallel_threads(8, 3), 3);
    CHECK_EQ_INT(kvs_parallel_threads(100, 0), 64);
    return kvs_test_finish("core_parallel");
}
