/*
 * pool.c -- a fixed pthread pool for the forward pass: run one function on
 * all threads and wait (fork-join). Workers sleep on a condition variable
 * between jobs (the machine is shared; no spinning).
 * What it is not: no task queue, no work stealing.
 */
#include <stdlib.h>

#include "engine_private.h"

struct kvs_pool {
    int n;
    pthread_t *th;    /* [n-1] workers; the caller is thread 0 */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned gen;     /* job generation */
    int pending;      /* workers still running the current job */
    int quit;
    kvs_pool_fn fn;
    void *arg;
};

typedef struct {
    kvs_pool *p;
    int ith;
} worker_arg;

static void *worker(void *a) {
    worker_arg *wa = a;
    kvs_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        kvs_pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->quit = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
