/*
 * parallel.c -- the one thread pool of core: run independent work units.
 *
 * What it is: kvs_parallel_run hands the units [0, n) of one job to up to
 * `threads` workers (the caller is worker 0) through an atomic counter, so
 * units are started in increasing order and uneven units balance themselves.
 * Attention passes, cache validation and apply all use it. OpenBLAS runs
 * single-threaded for the duration of a run (units call cblas_sgemm from our
 * own threads, and results must not depend on BLAS's thread count); its
 * setting is restored before returning.
 * Placement: worker t pins itself to the t-th allowed CPU other than the
 * caller's (kvs_thread_pin), where there are enough; unpinned, a new thread
 * often started on its creator's CPU and waited there for milliseconds.
 * What it is not: no persistent pool (threads live for one call: a call is
 * milliseconds to seconds of work, the ~20 us thread start is noise), no
 * nesting. Errors: a unit that fails returns its status and message; the
 * run returns those of the failing unit with the LOWEST index (the same for
 * any thread count) and skips the units after it that have not started.
 * Every unit runs, also when a worker could not be started (the others
 * finish its share).
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getcpu, sched_setaffinity, CPU_SET */
#endif
#include "kvsieve.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sched.h>
#endif

enum { MAX_THREADS = 64 };

typedef struct {
    void *job;
    kvs_unit_fn fn;
    int n_units;
    atomic_int next;
    atomic_int bad_unit;  /* lowest failed unit, INT_MAX if none */
    pthread_mutex_t lock; /* guards bad_err */
    kvs_err bad_err;
} pool;

typedef struct {
    pool *p;
    int tid, n, avoid; /* kvs_thread_pin's arguments */
} worker_arg;

static void *worker(void *arg) {
    worker_arg *a = arg;
    pool *p = a->p;
    if (a->tid > 0) kvs_thread_pin(a->tid, a->n, a->avoid);
    for (;;) {
        const int u = atomic_fetch_add(&p->next, 1);
        if (u >= p->n_units || u > atomic_load(&p->bad_unit)) break;
        kvs_err e = {0};
        const kvs_status st = p->fn(p->job, a->tid, u, &e);
        if (st == KVS_OK) continue;
        pthread_mutex_lock(&p->lock);
        if (u < atomic_load(&p->bad_unit)) {
            atomic_store(&p->bad_unit, u);
            p->bad_err = e;
            p->bad_err.code = st;
        }
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

int kvs_thread_pin(int i, int n, int avoid) {
#if defined(__linux__)
    const char *e = getenv("KVSIEVE_PIN");
    if (i < 1 || i >= n || (e && !strcmp(e, "0"))) return 0;
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < n) return 0;
    int skip = avoid, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (skip < 0) skip = c; /* the first allowed CPU stays the caller's */
        if (c == skip) continue;
        if (++seen < i) continue;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        return sched_setaffinity(0, sizeof one, &one) == 0;
    }
    return 0;
#else
    (void)i;
    (void)n;
    (void)avoid;
    return 0;
#endif
}

int kvs_parallel_threads(int threads, int n_units) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (n_units >= 1 && threads > n_units) threads = n_units;
    return threads;
}

kvs_status kvs_parallel_run(void *job, kvs_unit_fn fn, int n_units, int threads, const char *what,
                            kvs_err *err) {
    assert(fn && n_units >= 0);
    pool p = {.job = job, .fn = fn, .n_units = n_units};
    atomic_init(&p.next, 0);
    atomic_init(&p.bad_unit, INT_MAX);
    if (pthread_mutex_init(&p.lock, NULL) != 0)
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: could not create a mutex",
                          what ? what : "kvs_parallel_run");
    threads = kvs_parallel_threads(threads, n_units);
    const int blas = openblas_get_num_threads();
    if (blas != 1) openblas_set_num_threads(1);
    pthread_t tids[MAX_THREADS];
    worker_arg args[MAX_THREADS];
    int started = 0, failed_at = -1;
#if defined(__linux__)
    const int cpu = sched_getcpu();
#else
    const int cpu = -1;
#endif
    for (int t = 1; t < threads; t++) {
        args[t] = (worker_arg){&p, t, threads, cpu};
        if (pthread_create(&tids[t], NULL, worker, &args[t]) != 0) {
            failed_at = t;
            break;
        }
        started = t;
    }
    args[0] = (worker_arg){&p, 0, threads, cpu};
    worker(&args[0]);
    for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
    if (blas != 1) openblas_set_num_threads(blas);
    pthread_mutex_destroy(&p.lock);
    if (atomic_load(&p.bad_unit) != INT_MAX) {
        if (err) *err = p.bad_err;
        return p.bad_err.code;
    }
    if (failed_at >= 0)
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: could not start worker thread %d of %d",
                          what ? what : "kvs_parallel_run", failed_at, threads);
    return KVS_OK;
}
