/*
 * pool.c -- a fixed pthread pool for the forward pass: run one function on
 * all threads and wait (fork-join).
 * Waiting: a decode step is hundreds of jobs of 10-100 us each, so a worker
 * that has finished a job first polls for the next one for a short while
 * (KVS_POOL_SPIN_US) and only then sleeps on a condition variable; the
 * caller waits for the last worker the same way. A wake-up through the
 * kernel costs several microseconds per job on a VM (perf: 7% of a Qwen2.5
 * decode step in the scheduler before this), while the bounded poll keeps
 * the pool from burning cores it does not use (the machine is shared: an
 * unbounded spin, as OpenMP's default, collapses under oversubscription).
 * Placement: each worker pins itself to one CPU (kvs_thread_pin; the
 * caller keeps the first allowed CPU; KVSIEVE_PIN=0 turns it off).
 * What it is not: no task queue, no work stealing.
 */
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_CPU_RELAX() _mm_pause()
#else
#define KVS_CPU_RELAX() ((void)0)
#endif

#include "engine_private.h"

enum { KVS_POOL_SPIN_US = 50 }; /* poll this long before sleeping */

struct kvs_pool {
    int n;
    pthread_t *th;    /* [n-1] workers; the caller is thread 0 */
    pthread_mutex_t mu; /* guards the sleeping paths (gen changes under it too) */
    pthread_cond_t cv_start, cv_done;
    atomic_uint gen;  /* job generation: a new job is gen + 1 */
    atomic_int pending; /* workers still running the current job */
    atomic_int quit;
    kvs_pool_fn fn;   /* written before gen is incremented (release) */
    void *arg;
};

typedef struct {
    kvs_pool *p;
    int ith;
} worker_arg;

/* The two things a thread waits for: a job newer than `seen` (or quit), and
 * every worker done with the current one. */
static int job_ready(kvs_pool *p, unsigned seen) {
    return atomic_load_explicit(&p->gen, memory_order_acquire) != seen || atomic_load(&p->quit);
}
static int job_done(kvs_pool *p, unsigned unused) {
    (void)unused;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

/* Poll ready(p, x) for at most KVS_POOL_SPIN_US (the clock read every 64
 * polls); returns its last value. */
static int poll_for(int (*ready)(kvs_pool *, unsigned), kvs_pool *p, unsigned x) {
    double t0 = 0.0;
    for (int i = 0;; i++) {
        if (ready(p, x)) return 1;
        KVS_CPU_RELAX();
        if ((i & 63) == 63) {
            const double t = kvs_now_ms() * 1e3;
            if (t0 == 0.0) t0 = t;
            else if (t - t0 > KVS_POOL_SPIN_US) return ready(p, x);
        }
    }
}

static void *worker(void *a) {
    worker_arg *wa = a;
    kvs_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    /* worker i on the i-th allowed CPU after the first, which the caller
     * keeps: a worker woken by cv_start is otherwise often placed on the
     * caller's CPU, and the two share it while the other core idles */
    kvs_thread_pin(ith, p->n, -1);
    unsigned seen = 0;
    for (;;) {
        if (!poll_for(job_ready, p, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!job_ready(p, seen)) pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->arg, ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            /* the last one: wake the caller if it went to sleep */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

kvs_status kvs_pool_new(int n_threads, kvs_pool **out, kvs_err *err) {
    if (n_threads < 1) n_threads = 1;
    kvs_pool *p = calloc(1, sizeof *p);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, 0);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) {
        kvs_pool_free(p);
        return kvs_errorf(err, KVS_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            kvs_pool_free(p);
            return kvs_errorf(err, KVS_ERR_NOMEM, "thread pool: out of memory");
        }
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->th[i - 1], NULL, worker, wa) != 0) {
            free(wa);
            p->n = i;
            kvs_pool_free(p);
            return kvs_errorf(err, KVS_ERR_INTERNAL, "thread pool: cannot start thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return KVS_OK;
}

void kvs_pool_free(kvs_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p);
}

int kvs_pool_size(const kvs_pool *p) { return p->n; }

void kvs_pool_run(kvs_pool *p, kvs_pool_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    /* under the mutex, so a worker about to sleep either sees the new gen or
     * is already waiting when the broadcast comes */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    if (!poll_for(job_done, p, 0)) {
        pthread_mutex_lock(&p->mu);
        while (!job_done(p, 0)) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
