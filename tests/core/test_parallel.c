/*
 * test_parallel.c -- kvs_parallel_run: every unit runs exactly once on 1-70
 * threads (more threads than units and than the 64-thread cap included),
 * tids stay below kvs_parallel_threads, zero units is a no-op; failing units:
 * the error of the lowest failing unit is returned on any thread count, and
 * every unit below it ran. kvs_thread_pin (Linux): which CPU a worker gets,
 * the caller's CPU skipped, and when it declines (index out of range, fewer
 * CPUs than the group, KVSIEVE_PIN=0); each case in a thread of its own.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getaffinity, CPU_SET */
#endif
#include "kvsieve.h"
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#if defined(__linux__)
#include <sched.h>
#endif

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

#if defined(__linux__)
typedef struct {
    int i, n, avoid; /* kvs_thread_pin's arguments */
    int ret, cpus, cpu; /* its return, then the thread's allowed CPU count and lowest CPU */
} pin_case;

static void *pin_thread(void *a) {
    pin_case *c = a;
    c->ret = kvs_thread_pin(c->i, c->n, c->avoid);
    cpu_set_t s;
    c->cpus = sched_getaffinity(0, sizeof s, &s) == 0 ? CPU_COUNT(&s) : -1;
    c->cpu = -1;
    for (int k = 0; k < CPU_SETSIZE && c->cpu < 0; k++)
        if (CPU_ISSET(k, &s)) c->cpu = k;
    return NULL;
}

static pin_case pin_run(int i, int n, int avoid) {
    pin_case c = {i, n, avoid, -1, -1, -1};
    pthread_t t;
    if (pthread_create(&t, NULL, pin_thread, &c) == 0) pthread_join(t, NULL);
    return c;
}

static void test_pin(void) {
    cpu_set_t s;
    CHECK(sched_getaffinity(0, sizeof s, &s) == 0);
    const int count = CPU_COUNT(&s);
    int first = -1, second = -1;
    for (int k = 0; k < CPU_SETSIZE && second < 0; k++)
        if (CPU_ISSET(k, &s)) {
            if (first < 0) first = k;
            else second = k;
        }
    pin_case c = pin_run(0, 2, -1); /* worker 0 is the caller: never pinned */
    CHECK_EQ_INT(c.ret, 0);
    CHECK_EQ_INT(c.cpus, count);
    c = pin_run(2, 2, -1);
    CHECK_EQ_INT(c.ret, 0);
    c = pin_run(1, count + 1, -1); /* more threads than CPUs */
    CHECK_EQ_INT(c.ret, 0);
    CHECK_EQ_INT(c.cpus, count);
    if (count < 2) {
        printf("core_parallel: SKIP kvs_thread_pin placement (only %d CPU allowed)\n", count);
        return;
    }
    c = pin_run(1, 2, -1); /* the first allowed CPU stays the caller's */
    CHECK_EQ_INT(c.ret, 1);
    CHECK_EQ_INT(c.cpus, 1);
    CHECK_EQ_INT(c.cpu, second);
    c = pin_run(1, 2, second); /* the caller runs on the second: the worker gets the first */
    CHECK_EQ_INT(c.ret, 1);
    CHECK_EQ_INT(c.cpu, first);
    setenv("KVSIEVE_PIN", "0", 1);
    c = pin_run(1, 2, -1);
    CHECK_EQ_INT(c.ret, 0);
    CHECK_EQ_INT(c.cpus, count);
    unsetenv("KVSIEVE_PIN");
}
#endif

int main(void) {
#if defined(__linux__)
    test_pin();
#endif
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
