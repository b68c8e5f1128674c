/*
 * counters.c -- the server's shared counters under its mutex: slots (held
 * outside the scheduler by tests), request ids and the metrics notes the
 * scheduler and the endpoints make (/metrics reads them in server.c).
 * What it is not: no endpoint, no scheduling; it calls no other file of the
 * server.
 */
#include "server_internal.h"

#include <assert.h>

/* compress_ms histogram bucket upper bounds; the last bucket is +Inf. */
static const double hist_le[SRV_HIST_BUCKETS - 1] = SRV_HIST_LE;

/* ---- slots and metrics ----------------------------------------------------- */

void srv_slot_acquire(kvs_server *s) {
    pthread_mutex_lock(&s->mu);
    while (s->slots_free == 0) pthread_cond_wait(&s->cv, &s->mu);
    s->slots_free--;
    pthread_mutex_unlock(&s->mu);
}

void srv_slot_release(kvs_server *s) {
    pthread_mutex_lock(&s->mu);
    s->slots_free++;
    assert(s->slots_free <= s->cfg.slots);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_note_prefill(kvs_server *s, int n_prompt, double ms) {
    pthread_mutex_lock(&s->mu);
    s->m.prefills++;
    s->m.prompt_tokens += (uint64_t)n_prompt;
    s->m.prompt_ms += ms;
    pthread_mutex_unlock(&s->mu);
}

void srv_note_predict(kvs_server *s, int n_predicted, double ms) {
    pthread_mutex_lock(&s->mu);
    s->m.predicted_tokens += (uint64_t)n_predicted;
    s->m.predicted_ms += ms;
    pthread_mutex_unlock(&s->mu);
}

void srv_note_compress(kvs_server *s, double ms) {
    int b = 0;
    while (b < SRV_HIST_BUCKETS - 1 && ms > hist_le[b]) b++;
    pthread_mutex_lock(&s->mu);
    s->m.compressions++;
    s->m.compress_bucket[b]++;
    s->m.compress_count++;
    s->m.compress_sum_ms += ms;
    pthread_mutex_unlock(&s->mu);
}

uint64_t srv_next_id(kvs_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    return id;
}
