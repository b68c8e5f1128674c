/*
 * sched.c -- the scheduler: continuous batching of every live sequence.
 *
 * What it is: one thread that owns the model's compute. Handler threads
 * queue jobs (a generation request, or an exclusive task such as the
 * /kv/dump prefill) and wait for them while poll()ing their client socket;
 * the scheduler loops: admit queued jobs in arrival order while a slot and
 * room in the batch are free (prefill; per variant a session of its kept
 * rows gathered from the prefill; the suffix as one kvs_session_extend
 * chunk; the first token sampled), drop
 * cancelled jobs, then decode one step of every live sequence -- each
 * variant of each running request -- with one kvs_batch_decode call, sample
 * each row, apply the stop rules, and complete the jobs whose sequences have
 * all stopped. A sequence's result does not depend on its batch neighbours
 * (kvs_batch_decode is bit-identical per session to kvs_session_decode).
 * What it is not: request parsing or JSON (server_gen.c), HTTP (http.c).
 *
 * Timing per variant: predicted_ms = its first sampling after admission plus
 * the wall time of every step it took part in (decode of the whole batch and
 * the sampling of all rows); compress_ms (its share of the plan, gathering
 * its kept rows, trim; variants sharing a method and its parameters:
 * plan_groups.c), copy_ms (its session; for full or none also the copy of the
 * prefill), suffix_ms.
 * The step loop allocates nothing (the output text and token arrays grow
 * geometrically, as before).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server_internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

typedef struct {
    kvs_session *ses;
    kvs_sampler smp;
    int smp_ok;
    gen_out *o;
    int32_t pending; /* token to decode in the next step */
    int live;
    int stepped, res; /* took part in the current step; what seq_advance said */
} srv_seq;

struct srv_job {
    /* a generation request, or an exclusive task (fn != NULL) */
    const gen_req *g;
    gen_out *outs;
    int n_outs;
    double prompt_ms;
    srv_exclusive_fn fn;
    void *user;
    srv_error e;       /* failure (status != 0) */
    int rc;            /* 0 ok, -1 failed or cancelled */
    int state;         /* JOB_* (under s->mu) */
    atomic_int cancel; /* 0, or the SRV_CANCEL_* reason asked for */
    int efd;           /* eventfd: written once when the job is done */
    srv_seq *seqs;     /* [n_outs] */
    int n_live;
    srv_job *next;     /* queue link (under s->mu) */
};

struct srv_sched {
    pthread_t th;
    int started, stop;
    kvs_batch *batch;
    int cap;              /* sequences per step at most (cfg.batch) */
    srv_job **run;        /* [slots] running jobs (written by the scheduler thread under s->mu) */
    int n_run;
    kvs_session **ss;     /* [cap] step arrays */
    int32_t *toks;        /* [cap] */
    float *logits;        /* [cap][n_vocab] */
    float *scratch;       /* [n_vocab] admission logits */
    srv_job *admitting;   /* the job being admitted (under s->mu) */
};

/* ---- per-sequence generation ------------------------------------------------- */

static int out_reserve(gen_out *o, size_t extra) {
    if (o->len + extra + 1 <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + extra + 1) cap *= 2;
    char *nb = realloc(o->text, cap);
    if (!nb) return -1;
    o->text = nb;
    o->cap = cap;
    return 0;
}

static int out_push_token(gen_out *o, int32_t t) {
    if (o->n_toks == o->cap_toks) {
        int cap = o->cap_toks ? 2 * o->cap_toks : 64;
        int32_t *nt = realloc(o->toks, (size_t)cap * sizeof *nt);
        if (!nt) return -1;
        o->toks = nt;
        o->cap_toks = cap;
    }
    o->toks[o->n_toks++] = t;
    return 0;
}

/* Sample the next token from logits (overwritten where ignore_eos masks) and
 * apply the stop rules. Returns 1 when the token must be decoded (q->pending),
 * 0 when the sequence stopped (o->stop_type), -1 on error. */
static int seq_advance(kvs_server *s, const gen_req *g, srv_seq *q, float *logits, kvs_err *err) {
    gen_out *o = q->o;
    if (o->n_toks >= g->limit) {
        o->stop_type = "limit";
        return 0;
    }
    if (g->ignore_eos)
        for (int i = 0; i < s->n_eog; i++) logits[s->eog[i]] = -INFINITY;
    int32_t tok;
    if (kvs_sampler_sample(&q->smp, logits, &tok, err) != KVS_OK) return -1;
    if ((!g->ignore_eos && kvs_token_is_eog(s->model, tok)) || kvs_stop_is_token(&g->stop, tok)) {
        o->stop_type = "eos";
        return 0;
    }
    if (out_push_token(o, tok)) {
        kvs_errorf(err, KVS_ERR_NOMEM, "generate: no memory for the output tokens");
        return -1;
    }
    size_t old = o->len;
    int k = kvs_token_to_piece(s->model, tok, 0, o->text + o->len, (int)(o->cap - o->len - 1));
    if (k > (int)(o->cap - o->len - 1)) {
        if (out_reserve(o, (size_t)k)) {
            kvs_errorf(err, KVS_ERR_NOMEM, "generate: no memory for the output text");
            return -1;
        }
        k = kvs_token_to_piece(s->model, tok, 0, o->text + o->len, (int)(o->cap - o->len - 1));
    }
    if (k > 0) o->len += (size_t)k;
    o->text[o->len] = '\0';
    if (out_reserve(o, 64)) {
        kvs_errorf(err, KVS_ERR_NOMEM, "generate: no memory for the output text");
        return -1;
    }
    size_t cut;
    int w = kvs_stop_find_string(&g->stop, o->text, old, o->len, &cut);
    if (w >= 0) {
        o->len = cut;
        o->text[cut] = '\0';
        o->stop_type = "word";
        snprintf(o->stopping_word, sizeof o->stopping_word, "%s", g->stop.strings[w]);
        return 0;
    }
    if (kvs_session_n_past(q->ses) >= kvs_session_n_ctx(q->ses)) {
        o->stop_type = "limit"; /* the context is full */
        return 0;
    }
    /* the last token is not decoded when the next check would stop anyway */
    if (o->n_toks >= g->limit) {
        o->stop_type = "limit";
        return 0;
    }
    q->pending = tok;
    return 1;
}

static void seq_end(kvs_server *s, srv_job *j, srv_seq *q) {
    if (!q->live) return;
    q->live = 0;
    j->n_live--;
    kvs_session_free(q->ses);
    q->ses = NULL;
    if (q->smp_ok) kvs_sampler_free(&q->smp);
    q->smp_ok = 0;
    pthread_mutex_lock(&s->mu);
    s->live_seqs--;
    pthread_mutex_unlock(&s->mu);
}

/* ---- job completion ---------------------------------------------------------- */

static void job_signal(srv_job *j) {
    uint64_t one = 1;
    while (write(j->efd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

/* Variants decoded as an earlier one (same_as) get its output. -1: out of memory. */
static int alias_outputs(srv_job *j) {
    for (int i = 0; i < j->n_outs; i++) {
        gen_out *o = &j->outs[i];
        if (o->same_as < 0) continue;
        const gen_out *p = &j->outs[o->same_as];
        o->text = malloc(p->len + 1);
        o->toks = malloc(sizeof(int32_t) * (size_t)(p->n_toks > 0 ? p->n_toks : 1));
        if (!o->text || !o->toks) return -1;
        memcpy(o->text, p->text ? p->text : "", p->len);
        o->text[p->len] = '\0';
        o->len = p->len;
        o->cap = p->len + 1;
        if (p->n_toks) memcpy(o->toks, p->toks, sizeof(int32_t) * (size_t)p->n_toks);
        o->n_toks = o->cap_toks = p->n_toks;
        o->stop_type = p->stop_type;
        memcpy(o->stopping_word, p->stopping_word, sizeof o->stopping_word);
        o->predicted_ms = p->predicted_ms; /* the decode it shared */
    }
    return 0;
}

/* The job leaves the scheduler: free its sequences, count it, wake its handler. */
static void job_finish(kvs_server *s, srv_job *j, int rc) {
    if (rc == 0 && alias_outputs(j)) rc = srv_fail(&j->e, 500, "", "out of memory copying the shared outputs");
    for (int i = 0; j->seqs && i < j->n_outs; i++) seq_end(s, j, &j->seqs[i]);
    free(j->seqs);
    j->seqs = NULL;
    j->rc = rc;
    pthread_mutex_lock(&s->mu);
    srv_sched *sc = s->sched;
    for (int i = 0; i < sc->n_run; i++)
        if (sc->run[i] == j) {
            sc->run[i] = sc->run[--sc->n_run];
            break;
        }
    if (j->state == JOB_RUNNING) {
        s->processing--;
        s->slots_free++;
    }
    if (sc->admitting == j) sc->admitting = NULL; /* the handler may free j once signalled */
    j->state = JOB_DONE;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    job_signal(j);
}

static void note_cancel(kvs_server *s, int reason) {
    pthread_mutex_lock(&s->mu);
    s->m.cancelled[reason]++;
    pthread_mutex_unlock(&s->mu);
}

static void job_cancelled(kvs_server *s, srv_job *j, int reason) {
    if (reason == SRV_CANCEL_SHUTDOWN) srv_fail(&j->e, 503, "", "request cancelled: the server is shutting down");
    else j->e.status = 0; /* the client is gone: no response */
    job_finish(s, j, -1);
    note_cancel(s, reason); /* counted once the request has left the batch */
}

/* ---- admission ------------------------------------------------------------------ */

/* Queries to record at prefill: the most any variant's method needs (-1 = all). */
static int queries_to_record(const gen_req *g) {
    int rq = 0;
    for (int i = 0; i < g->n_variants; i++) {
        const variant_req *v = &g->variants[i];
        if (!v->method) continue;
        if (v->compress_suffix && v->n_suffix > 0) {
            /* the prompt grows by the suffix before the compression (kvs_session_extend_prompt): the
             * prefill records what the window needs before the suffix, at least one query so that the
             * extension records the suffix's */
            const int n = g->n_prompt + v->n_suffix;
            int need = kvs_method_queries_needed(v->method, &v->params, n);
            if (need >= n) return -1;
            const int before = need - v->n_suffix > 1 ? need - v->n_suffix : 1;
            if (need > 0 && before > rq) rq = before;
            continue;
        }
        int need = kvs_method_queries_needed(v->method, &v->params, g->n_prompt);
        if (need >= g->n_prompt) return -1;
        if (need > rq) rq = need;
    }
    return rq;
}

/* Variants i and j (j < i) end in the same cache before decoding: the same
 * branch, both "full" or byte-identical plans, the same suffix after the
 * compression. Sampling is per request (one seed), so their outputs are the
 * same: i is decoded as j. */
static int same_cache(const gen_req *g, const srv_plans *P, const int *branch, int i, int j) {
    const variant_req *a = &g->variants[i], *b = &g->variants[j];
    if (branch[i] != branch[j] || a->chunk || b->chunk || a->compress_local != b->compress_local) return 0;
    const int full_a = !a->method || !strcmp(a->method->name, "full"), full_b = !b->method || !strcmp(b->method->name, "full");
    if (full_a != full_b || (!full_a && !srv_plans_same(P, i, j))) return 0;
    const int na = a->compress_suffix ? 0 : a->n_suffix, nb = b->compress_suffix ? 0 : b->n_suffix;
    return na == nb && (na == 0 || !memcmp(a->suffix, b->suffix, sizeof(int32_t) * (size_t)na));
}

/* kvs_session_compress, keeping the plan for span_kept. The server test
 * checks that asking for kv_spans changes neither the output nor the kv
 * statistics. */
static kvs_status compress_with_plan(kvs_server *s, kvs_session *ses, const kvs_compress_opts *co, const gen_req *g,
                                     gen_out *o, kvs_err *err) {
    kvs_plan plan;
    int map[KVS_MAX_LAYERS];
    kvs_status st = kvs_session_compress_plan(ses, co, &o->stats, &plan, map, err);
    if (st == KVS_OK && srv_span_kept(s, g, &plan, map, o))
        st = kvs_errorf(err, KVS_ERR_NOMEM, "span_kept: out of memory");
    kvs_plan_free(&plan);
    return st;
}

static int job_cancel_asked(srv_job *j) { return atomic_load(&j->cancel); }

/* The first variant of branch b. */
static int branch_first(const gen_req *g, const int *branch, int b) {
    for (int i = 0; i < g->n_variants; i++)
        if (branch[i] == b) return i;
    return 0;
}

/* A variant's session: the positions it can reach are its branch's prefill,
 * a suffix run after the compression and the tokens it may generate (the
 * last one sampled is not decoded; one spare keeps the session non-empty),
 * so that it holds its kept rows plus that room, not the server's context.
 * Where the context is reached first it stops there, as with --ctx (both
 * stop as "limit"). No recorded queries: it is not planned again. */
static kvs_session_opts variant_opts(const kvs_server *s, const kvs_session_opts *so, const gen_req *g,
                                     const variant_req *v, const kvs_session *branch) {
    kvs_session_opts o = *so;
    const int64_t reach = (int64_t)kvs_session_n_past(branch) + (v->compress_suffix ? 0 : v->n_suffix) +
                          (g->limit > 0 ? g->limit : 0) + 1;
    o.n_ctx = reach < s->cfg.n_ctx ? (int)reach : s->cfg.n_ctx;
    o.record_queries = 0;
    return o;
}

/* What admission holds: the plans, the branch sessions (bses[0] the prefill), the logits. */
static void admit_free(srv_plans *P, kvs_session **bses, int nb, int *branch, float *logits) {
    srv_plans_free(P);
    for (int b = 0; bses && b <= nb; b++) kvs_session_free(bses[b]);
    free(bses);
    free(branch);
    free(logits);
}

static int needs_recon(const variant_req *v) { return v->method && (v->method->needs & KVS_NEED_RECON); }

/* [n_prompt + n_suffix] tokens: the prompt, then v's suffix (NULL when out of memory) */
static int32_t *prompt_and_suffix(const gen_req *g, const variant_req *v) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(g->n_prompt + v->n_suffix));
    if (!t) return NULL;
    memcpy(t, g->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
    memcpy(t + g->n_prompt, v->suffix, sizeof(int32_t) * (size_t)v->n_suffix);
    return t;
}

/* KVzip (KVS_NEED_RECON) in the query-aware setting: its reconstruction pass runs over the prompt it
 * compresses, the context and the question, so its branch is prefilled afresh with the pass (a copy of
 * the prefill extended by the question holds no pass over the question): one prefill and one pass more
 * than a branch of other methods (a request of this one variant prefills only this, in admit).
 * trim: the prefill's sliding-window layers were trimmed, so are these.
 * *ext_ms: the prefill's time without the pass (the pass counts in compress_ms). */
static kvs_status recon_branch(kvs_server *s, const kvs_session_opts *so, const kvs_session *pre, const gen_req *g,
                               const variant_req *v, int trim, kvs_session **out, float *logits, double *ext_ms,
                               kvs_err *err) {
    int32_t *t = prompt_and_suffix(g, v);
    kvs_session *bs = NULL;
    if (!t) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    const double t0 = kvs_now_ms();
    kvs_status st = kvs_session_new(s->model, so, &bs, err);
    if (!st) {
        kvs_session_set_attn_stats(bs, kvs_session_has_attn_stats(pre));
        kvs_session_set_recon(bs, -1);
        st = kvs_session_prefill(bs, t, g->n_prompt + v->n_suffix, NULL, logits, err);
    }
    *ext_ms = kvs_now_ms() - t0 - (st ? 0.0 : kvs_session_recon_ms(bs));
    if (!st && trim) st = kvs_session_trim_local(bs, err);
    free(t);
    if (st) {
        kvs_session_free(bs);
        bs = NULL;
    }
    *out = bs;
    return st;
}

/* Prefill, per variant compress (into a session of its own kept rows) + suffix + first sample; the job joins
 * the batch (or completes when every variant stopped at once). */
static void admit(kvs_server *s, srv_job *j) {
    srv_sched *sc = s->sched;
    const gen_req *g = j->g;
    kvs_err err = {0};
    kvs_session *pre = NULL;
    srv_plans plans;
    memset(&plans, 0, sizeof plans);
    const size_t V = (size_t)s->info->n_vocab;
    const int nv = g->n_variants > 0 ? g->n_variants : 1;
    /* branches: 0 the prefill, k >= 1 a copy of it extended by the k-th distinct compress_suffix */
    int nb = 0, *branch = calloc((size_t)nv, sizeof *branch);
    kvs_session **bses = calloc((size_t)nv + 1, sizeof *bses);
    float *logits0 = malloc(V * (size_t)(nv + 1) * sizeof *logits0); /* [branch][n_vocab] */
    j->seqs = calloc((size_t)j->n_outs, sizeof *j->seqs);
    if (!logits0 || !j->seqs || !branch || !bses) {
        srv_fail(&j->e, 500, "", "out of memory");
        goto fail;
    }
    for (int i = 0; i < j->n_outs; i++) j->outs[i].same_as = -1;
    kvs_session_opts so;
    memset(&so, 0, sizeof so);
    so.n_ctx = s->cfg.n_ctx;
    so.n_threads = s->cfg.threads;
    /* kv_compression.chunk (one variant): the prompt in chunks, compressed after each (chunked.c) */
    const variant_req *chunked = g->n_variants == 1 && g->variants[0].chunk > 0 ? &g->variants[0] : NULL;
    so.record_queries = chunked ? 0 : queries_to_record(g);
    so.cache_type = s->cfg.cache_type;
    so.cache_type_v = s->cfg.cache_type_v;
    if (kvs_session_new(s->model, &so, &pre, &err) != KVS_OK) {
        srv_fail(&j->e, 500, "", "cannot create a session: %s", err.msg);
        goto fail;
    }
    /* h2o, lookm, meda: the prefill accumulates the attention statistics they read (one pass for all) */
    for (int i = 0; i < g->n_variants && !chunked; i++)
        if (kvs_method_reads_attn_stats(g->variants[i].method)) kvs_session_set_attn_stats(pre, 1);
    /* kvzip: the prefill runs the context-reconstruction pass, once for all variants (copies take it
     * along); a query-aware one gets a branch of its own (recon_branch) */
    for (int i = 0; i < g->n_variants && !chunked; i++)
        if (needs_recon(&g->variants[i]) && !(g->variants[i].compress_suffix && g->variants[i].n_suffix))
            kvs_session_set_recon(pre, -1);
    /* a request of one query-aware kvzip variant: its prompt is the context and the question, prefilled
     * once with the pass (timings count the question in prompt_ms) */
    const variant_req *v0 = g->n_variants == 1 ? &g->variants[0] : NULL;
    const int solo_recon = v0 && !chunked && needs_recon(v0) && v0->compress_suffix && v0->n_suffix;
    int32_t *pq = solo_recon ? prompt_and_suffix(g, v0) : NULL;
    if (solo_recon && !pq) {
        srv_fail(&j->e, 500, "", "out of memory");
        goto fail;
    }
    if (solo_recon) kvs_session_set_recon(pre, -1);
    double t0 = kvs_now_ms();
    if (solo_recon) {
        const kvs_status st = kvs_session_prefill(pre, pq, g->n_prompt + v0->n_suffix, NULL, logits0, &err);
        free(pq);
        if (st != KVS_OK) {
            srv_fail_kvs(&j->e, &err, v0->field);
            goto fail;
        }
        j->outs[0].n_extend = v0->n_suffix;
    } else if (chunked) {
        if (srv_chunked_prefill(s, pre, chunked, g->prompt, g->n_prompt, NULL, NULL, logits0, &j->outs[0].chunks,
                                &err) != KVS_OK) {
            srv_fail_kvs(&j->e, &err, chunked->field);
            goto fail;
        }
    } else if (kvs_session_prefill(pre, g->prompt, g->n_prompt, NULL, logits0, &err) != KVS_OK) {
        srv_fail_kvs(&j->e, &err, g->prompt_field);
        goto fail;
    }
    j->prompt_ms = kvs_now_ms() - t0 - kvs_session_recon_ms(pre); /* the pass counts in compress_ms */
    srv_note_prefill(s, g->n_prompt + (solo_recon ? v0->n_suffix : 0), j->prompt_ms);
    /* Sliding-window layers keep only their window once the prompt is in (each variant trims its copy
     * after compressing). When no variant compresses those layers, trim the prefill's cache once
     * instead: the copies are then smaller (Gemma 3: 5 of 6 layers hold 512 rows, not the prompt, and
     * no recorded queries) and no variant pays the trim. Every variant ends in the same state. */
    int trimmed = 0;
    if (j->n_outs > 1) {
        int local = 0;
        for (int i = 0; i < g->n_variants; i++) local |= g->variants[i].compress_local;
        trimmed = !local;
        if (!local && kvs_session_trim_local(pre, &err) != KVS_OK) {
            srv_fail(&j->e, 500, "", "trimming the sliding-window layers failed: %s", err.msg);
            goto fail;
        }
    }
    /* compress_suffix (query-aware): the suffix joins the prompt before the compression. One copy of
     * the prefill per distinct suffix, extended by it (kvs_session_extend_prompt); its variants copy,
     * plan and compress from there. One variant alone extends the prefill itself. */
    bses[0] = pre;
    for (int i = 0; i < g->n_variants; i++) {
        const variant_req *v = &g->variants[i];
        if (!v->compress_suffix || v->n_suffix == 0 || solo_recon) continue;
        for (int k = 0; k < i && !branch[i]; k++)
            if (branch[k] && g->variants[k].n_suffix == v->n_suffix && needs_recon(&g->variants[k]) == needs_recon(v) &&
                !memcmp(g->variants[k].suffix, v->suffix, sizeof(int32_t) * (size_t)v->n_suffix))
                branch[i] = branch[k];
        if (branch[i]) {
            j->outs[i].extend_ms = j->outs[branch_first(g, branch, branch[i])].extend_ms;
            j->outs[i].n_extend = v->n_suffix;
            continue;
        }
        branch[i] = ++nb;
        if (needs_recon(v)) {
            kvs_session *bs = NULL;
            if (recon_branch(s, &so, pre, g, v, trimmed, &bs, logits0 + (size_t)nb * V, &j->outs[i].extend_ms, &err) !=
                KVS_OK) {
                srv_fail_kvs(&j->e, &err, v->field);
                goto fail;
            }
            j->outs[i].n_extend = v->n_suffix;
            bses[nb] = bs;
            continue;
        }
        const double te = kvs_now_ms();
        kvs_session *bs = pre;
        if (j->n_outs > 1 && (kvs_session_new(s->model, &so, &bs, &err) != KVS_OK || kvs_session_copy(bs, pre, &err) != KVS_OK)) {
            srv_fail(&j->e, 500, "", "variant %d: cannot copy the prefill cache: %s", i, err.msg);
            kvs_session_free(bs);
            goto fail;
        }
        if (bs != pre) bses[nb] = bs; /* else bses[0] holds it */
        if (kvs_session_extend_prompt(bs, v->suffix, v->n_suffix, logits0 + (size_t)nb * V, &err) != KVS_OK) {
            srv_fail(&j->e, 500, "", "variant %d: running the suffix before the compression failed: %s", i, err.msg);
            goto fail;
        }
        j->outs[i].extend_ms = kvs_now_ms() - te;
        j->outs[i].n_extend = v->n_suffix;
        if (bs == pre) { /* one variant: it is the prefill */
            memcpy(logits0, logits0 + (size_t)nb * V, V * sizeof *logits0);
            bses[nb] = NULL;
            branch[i] = 0;
            nb = 0;
        }
    }
    /* Variants sharing a method and its parameters observe the cache once (plan_groups.c) */
    for (int b = 0; j->n_outs > 1 && b <= nb; b++) {
        int bad = -1;
        if (srv_plans_make(s, bses[b], g, branch, b, &plans, &bad, &err) != KVS_OK) {
            srv_fail_kvs(&j->e, &err, bad >= 0 ? g->variants[bad].field : "kv_compression");
            goto fail;
        }
    }
    for (int i = 0; i < j->n_outs; i++) {
        int reason = job_cancel_asked(j);
        if (reason) {
            admit_free(&plans, bses, nb, branch, logits0);
            job_cancelled(s, j, reason);
            return;
        }
        const variant_req *v = g->n_variants ? &g->variants[i] : NULL;
        srv_seq *q = &j->seqs[i];
        gen_out *o = &j->outs[i];
        q->o = o;
        const float *blog = logits0 + (size_t)branch[i] * V;
        int same = -1; /* an earlier variant that ends in the same cache: decoded once (same_cache) */
        for (int k = 0; k < i && same < 0 && j->n_outs > 1; k++)
            if (j->outs[k].same_as < 0 && same_cache(g, &plans, branch, i, k)) same = k;
        if (same >= 0) {
            const gen_out *p = &j->outs[same];
            o->same_as = same;
            o->stats = p->stats; /* the same kept rows: the same statistics */
            if (plans.planned && plans.planned[i]) /* its own observation share and select, the apply shared */
                o->stats.compress_ms = p->stats.compress_ms - plans.plan_ms[same] + plans.plan_ms[i];
            o->compress_ms = o->stats.compress_ms;
            if (g->n_spans && srv_span_kept(s, g, plans.planned && plans.planned[i] ? &plans.plans[i] : NULL,
                                            plans.maps + (size_t)i * KVS_MAX_LAYERS, o)) {
                srv_fail(&j->e, 500, "", "out of memory");
                goto fail;
            }
            continue;
        }
        const kvs_plan *plan = plans.planned && plans.planned[i] ? &plans.plans[i] : NULL;
        if (j->n_outs > 1) {
            /* the variant's own session, sized by what it keeps: a planned one gathers its kept rows from
             * the branch's prefill when compressed below, the others copy it (kvs_session_copy_plan) */
            kvs_session_opts vo = variant_opts(s, &so, g, v, bses[branch[i]]);
            double tc = kvs_now_ms();
            if (kvs_session_new(s->model, &vo, &q->ses, &err) != KVS_OK ||
                (!plan && kvs_session_copy_plan(q->ses, bses[branch[i]], NULL, NULL, NULL, &err) != KVS_OK)) {
                srv_fail(&j->e, 500, "", "variant %d: cannot copy the prefill cache: %s", i, err.msg);
                kvs_session_free(q->ses);
                q->ses = NULL;
                goto fail;
            }
            o->copy_ms = kvs_now_ms() - tc;
        } else {
            q->ses = pre;
            pre = NULL;
            bses[0] = NULL;
        }
        q->live = 1;
        j->n_live++;
        pthread_mutex_lock(&s->mu);
        s->live_seqs++;
        pthread_mutex_unlock(&s->mu);
        if (v && v->chunk) { /* compressed chunk by chunk already; the local layers keep their window */
            if (kvs_session_trim_local(q->ses, &err) != KVS_OK) {
                srv_fail(&j->e, 500, "", "trimming the sliding-window layers failed: %s", err.msg);
                goto fail;
            }
            srv_chunk_stats(q->ses, g->n_prompt, &o->stats);
            o->stats.compress_ms = o->compress_ms = o->chunks.compress_ms;
            snprintf(o->stats.method, sizeof o->stats.method, "%s", v->method->name);
            srv_note_compress(s, o->compress_ms);
        } else if (v && v->method && strcmp(v->method->name, "full") != 0) {
            kvs_compress_opts co = srv_variant_compress_opts(s, v);
            kvs_status st;
            if (plan) { /* its plan is ready: its kept rows from the branch's prefill */
                const int *map = plans.maps + (size_t)i * KVS_MAX_LAYERS;
                st = kvs_session_compress_from(q->ses, bses[branch[i]], plan, map, &o->stats, &err);
                if (st == KVS_OK && g->n_spans && srv_span_kept(s, g, plan, map, o))
                    st = kvs_errorf(&err, KVS_ERR_NOMEM, "span_kept: out of memory");
                o->stats.compress_ms += plans.plan_ms[i]; /* + its share of the observation and its select */
            } else
                st = g->n_spans ? compress_with_plan(s, q->ses, &co, g, o, &err)
                                : kvs_session_compress(q->ses, &co, &o->stats, &err);
            if (st != KVS_OK) {
                srv_fail_kvs(&j->e, &err, v->field);
                goto fail;
            }
            o->compress_ms = o->stats.compress_ms;
            srv_note_compress(s, o->compress_ms);
        } else {
            if (v && v->method) { /* full: timed like the other methods (nothing changes) */
                kvs_compress_opts co;
                memset(&co, 0, sizeof co);
                co.method = v->method;
                if (kvs_session_compress(q->ses, &co, &o->stats, &err) != KVS_OK) {
                    srv_fail_kvs(&j->e, &err, v->field);
                    goto fail;
                }
                o->compress_ms = o->stats.compress_ms;
                srv_note_compress(s, o->compress_ms);
            } else { /* no kv_compression: nothing compressed, the local layers keep their window */
                if (kvs_session_trim_local(q->ses, &err) != KVS_OK) {
                    srv_fail(&j->e, 500, "", "trimming the sliding-window layers failed: %s", err.msg);
                    goto fail;
                }
                kvs_session_kv_stats(q->ses, &o->stats);
            }
            if (srv_span_kept(s, g, NULL, NULL, o)) {
                srv_fail(&j->e, 500, "", "out of memory");
                goto fail;
            }
        }
        memcpy(sc->scratch, blog, V * sizeof *logits0);
        if (v && v->n_suffix > 0 && !v->compress_suffix) {
            /* query-agnostic: the suffix (the question) runs as one chunk on
             * the compressed cache; generation starts from its last logits */
            double ts = kvs_now_ms();
            if (kvs_session_extend(q->ses, v->suffix, v->n_suffix, sc->scratch, &err) != KVS_OK) {
                srv_fail(&j->e, 500, "", "variant %d: running the suffix failed: %s", i, err.msg);
                goto fail;
            }
            o->suffix_ms = kvs_now_ms() - ts;
        }
        if (kvs_sampler_init(&q->smp, &g->sp, s->info->n_vocab, &err) != KVS_OK) {
            srv_fail(&j->e, 500, "", "variant %d: %s", i, err.msg);
            goto fail;
        }
        q->smp_ok = 1;
        if (out_reserve(o, 256)) {
            srv_fail(&j->e, 500, "", "out of memory for the output text");
            goto fail;
        }
        o->text[0] = '\0';
        double tg = kvs_now_ms();
        int r = seq_advance(s, g, q, sc->scratch, &err);
        o->predicted_ms += kvs_now_ms() - tg;
        if (r < 0) {
            srv_fail(&j->e, 500, "", "variant %d: generation failed: %s", i, err.msg);
            goto fail;
        }
        if (r == 0) {
            srv_note_predict(s, o->n_toks, o->predicted_ms);
            seq_end(s, j, q);
        }
    }
    admit_free(&plans, bses, nb, branch, logits0);
    if (j->n_live == 0) {
        job_finish(s, j, 0);
        return;
    }
    pthread_mutex_lock(&s->mu);
    sc->run[sc->n_run++] = j;
    pthread_mutex_unlock(&s->mu);
    return;
fail:
    if (bses) bses[0] = pre;
    else kvs_session_free(pre);
    admit_free(&plans, bses, nb, branch, logits0);
    job_finish(s, j, -1);
}

/* ---- the step ---------------------------------------------------------------------- */

static void step(kvs_server *s) {
    srv_sched *sc = s->sched;
    const size_t V = (size_t)s->info->n_vocab;
    int n = 0;
    for (int r = 0; r < sc->n_run; r++) {
        srv_job *j = sc->run[r];
        for (int i = 0; i < j->n_outs; i++) {
            srv_seq *q = &j->seqs[i];
            q->stepped = q->live;
            if (!q->live) continue;
            sc->ss[n] = q->ses;
            sc->toks[n] = q->pending;
            n++;
        }
    }
    if (n == 0) return;
    kvs_err err = {0};
    const double t0 = kvs_now_ms();
    kvs_status st = kvs_batch_decode(sc->batch, sc->ss, sc->toks, n, sc->logits, &err);
    pthread_mutex_lock(&s->mu);
    s->m.batch_steps++;
    s->m.batch_seq_steps += (uint64_t)n;
    pthread_mutex_unlock(&s->mu);
    if (st != KVS_OK) { /* an engine failure: every request of the step fails */
        while (sc->n_run > 0) {
            srv_job *j = sc->run[sc->n_run - 1];
            srv_fail(&j->e, 500, "", "decode step failed: %s", err.msg);
            job_finish(s, j, -1);
        }
        return;
    }
    /* sample every row in the order the batch was built */
    int k = 0;
    for (int r = 0; r < sc->n_run; r++) {
        srv_job *j = sc->run[r];
        for (int i = 0; i < j->n_outs; i++) {
            srv_seq *q = &j->seqs[i];
            if (!q->stepped) continue;
            float *row = sc->logits + (size_t)k++ * V;
            if (j->e.status) continue; /* an earlier variant of this job failed */
            q->res = seq_advance(s, j->g, q, row, &err);
            if (q->res < 0) srv_fail(&j->e, 500, "", "variant %d: generation failed: %s", i, err.msg);
        }
    }
    const double dt = kvs_now_ms() - t0;
    /* stopped sequences leave the batch; finished or failed jobs complete
     * (backwards: job_finish moves the last running job into the hole) */
    for (int r = sc->n_run - 1; r >= 0; r--) {
        srv_job *j = sc->run[r];
        if (j->e.status) {
            job_finish(s, j, -1);
            continue;
        }
        for (int i = 0; i < j->n_outs; i++) {
            srv_seq *q = &j->seqs[i];
            if (!q->stepped) continue;
            q->o->predicted_ms += dt;
            if (q->res == 0) {
                srv_note_predict(s, q->o->n_toks, q->o->predicted_ms);
                seq_end(s, j, q);
            }
        }
        if (j->n_live == 0) job_finish(s, j, 0);
    }
}

/* ---- the scheduler thread ---------------------------------------------------------- */

/* The queue head may start now: a slot is free and its variants fit the batch. */
static int admissible(const kvs_server *s) {
    const srv_job *h = s->q_head;
    if (!h || s->slots_free <= 0 || s->cancel_all) return 0;
    return h->fn || s->live_seqs + h->n_outs <= s->sched->cap;
}

static void *sched_main(void *arg) {
    kvs_server *s = arg;
    srv_sched *sc = s->sched;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!admissible(s) && s->live_seqs == 0 && !(sc->stop && !s->q_head))
            pthread_cond_wait(&s->cv, &s->mu);
        if (admissible(s)) {
            srv_job *j = s->q_head;
            s->q_head = j->next;
            if (!s->q_head) s->q_tail = NULL;
            j->next = NULL;
            s->waiting--;
            s->processing++;
            s->slots_free--;
            j->state = JOB_RUNNING;
            sc->admitting = j;
            pthread_mutex_unlock(&s->mu);
            if (j->fn) {
                int rc = j->fn(s, j->user, &j->e);
                job_finish(s, j, rc);
            } else {
                admit(s, j);
            }
            pthread_mutex_lock(&s->mu);
            sc->admitting = NULL;
            continue; /* admit all that can start before the next step */
        }
        if (s->live_seqs == 0) {
            if (sc->stop && !s->q_head) break;
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        /* cancelled requests leave before the step (so within one step of the ask) */
        for (int r = sc->n_run - 1; r >= 0; r--) {
            srv_job *j = sc->run[r];
            int reason = job_cancel_asked(j);
            if (reason) job_cancelled(s, j, reason);
        }
        step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

kvs_status srv_sched_start(kvs_server *s, kvs_err *err) {
    srv_sched *sc = calloc(1, sizeof *sc);
    if (!sc) return kvs_errorf(err, KVS_ERR_NOMEM, "scheduler: out of memory");
    const size_t V = (size_t)s->info->n_vocab;
    sc->cap = s->cfg.batch;
    sc->run = calloc((size_t)s->cfg.slots, sizeof *sc->run);
    sc->ss = calloc((size_t)sc->cap, sizeof *sc->ss);
    sc->toks = calloc((size_t)sc->cap, sizeof *sc->toks);
    sc->logits = malloc((size_t)sc->cap * V * sizeof *sc->logits);
    sc->scratch = malloc(V * sizeof *sc->scratch);
    s->eog = malloc(V * sizeof *s->eog);
    s->sched = sc;
    if (!sc->run || !sc->ss || !sc->toks || !sc->logits || !sc->scratch || !s->eog) {
        srv_sched_stop(s);
        return kvs_errorf(err, KVS_ERR_NOMEM, "scheduler: out of memory for a batch of %d sequences (%zu logits each)",
                          sc->cap, V);
    }
    s->n_eog = 0;
    for (int t = 0; t < (int)V; t++)
        if (kvs_token_is_eog(s->model, t)) s->eog[s->n_eog++] = t;
    kvs_status st = kvs_batch_new(s->model, sc->cap, s->cfg.threads, &sc->batch, err);
    if (st != KVS_OK) {
        srv_sched_stop(s);
        return st;
    }
    if (pthread_create(&sc->th, NULL, sched_main, s) != 0) {
        srv_sched_stop(s);
        return kvs_errorf(err, KVS_ERR_INTERNAL, "scheduler: cannot start its thread");
    }
    sc->started = 1;
    return KVS_OK;
}

void srv_sched_stop(kvs_server *s) {
    srv_sched *sc = s->sched;
    if (!sc) return;
    if (sc->started) {
        pthread_mutex_lock(&s->mu);
        sc->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(sc->th, NULL);
    }
    kvs_batch_free(sc->batch);
    free(sc->run);
    free(sc->ss);
    free(sc->toks);
    free(sc->logits);
    free(sc->scratch);
    free(sc);
    free(s->eog);
    s->eog = NULL;
    s->sched = NULL;
}

void srv_sched_cancel_all(kvs_server *s) {
    pthread_mutex_lock(&s->mu);
    s->cancel_all = 1;
    while (s->q_head) {
        srv_job *j = s->q_head;
        s->q_head = j->next;
        j->next = NULL;
        s->waiting--;
        j->state = JOB_DONE;
        j->rc = -1;
        srv_fail(&j->e, 503, "", "request cancelled: the server is shutting down");
        s->m.cancelled[SRV_CANCEL_SHUTDOWN]++;
        job_signal(j);
    }
    s->q_tail = NULL;
    srv_sched *sc = s->sched;
    for (int r = 0; r < sc->n_run; r++) atomic_store(&sc->run[r]->cancel, SRV_CANCEL_SHUTDOWN);
    if (sc->admitting) atomic_store(&sc->admitting->cancel, SRV_CANCEL_SHUTDOWN);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- handler side: queue, wait, watch the client ----------------------------------- */

static srv_job *job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->efd = eventfd(0, EFD_CLOEXEC);
    if (j->efd < 0) {
        free(j);
        return NULL;
    }
    atomic_init(&j->cancel, 0);
    return j;
}

static void job_free(srv_job *j) {
    if (!j) return;
    close(j->efd);
    free(j);
}

static int job_submit(kvs_server *s, srv_job *j, srv_error *e) {
    pthread_mutex_lock(&s->mu);
    if (s->cancel_all) {
        s->m.rejected_draining++;
        pthread_mutex_unlock(&s->mu);
        return srv_fail(e, 503, "", "server is shutting down");
    }
    /* the queue holds the requests that wait beyond the free slots */
    if (s->waiting >= s->cfg.queue + (s->slots_free > 0 ? s->slots_free : 0)) {
        s->m.rejected_queue_full++;
        pthread_mutex_unlock(&s->mu);
        srv_fail(e, 503, "", "the queue is full (%d requests waiting); retry later", s->cfg.queue);
        e->retry_after = 1;
        return -1;
    }
    j->state = JOB_QUEUED;
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->waiting++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The client hung up: a queued job leaves the queue at once (returns 1); a
 * running one is flagged for the scheduler (returns 0: keep waiting). */
static int job_abandon(kvs_server *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    if (j->state == JOB_QUEUED) {
        srv_job **pp = &s->q_head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) *pp = j->next;
        if (s->q_tail == j) s->q_tail = prev;
        j->next = NULL;
        s->waiting--;
        j->state = JOB_DONE;
        j->rc = -1;
        j->e.status = 0;
        s->m.cancelled[SRV_CANCEL_DISCONNECT]++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    if (j->state == JOB_RUNNING) atomic_store(&j->cancel, SRV_CANCEL_DISCONNECT);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Wait for the job while watching the client socket for a hang-up. */
static void job_wait(kvs_server *s, srv_job *j, int fd) {
    struct pollfd p[2] = {{j->efd, POLLIN, 0}, {fd, POLLRDHUP, 0}};
    int watch = fd >= 0;
    for (;;) {
        int r = poll(p, watch ? 2 : 1, -1);
        if (r < 0) {
            if (errno != EINTR) watch = 0; /* keep waiting for the job alone */
            continue;
        }
        if (p[0].revents & POLLIN) break;
        if (watch && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
            watch = 0;
            if (job_abandon(s, j)) return;
        }
    }
    pthread_mutex_lock(&s->mu); /* pairs with the scheduler's writes to the job */
    pthread_mutex_unlock(&s->mu);
}

int srv_sched_generate(kvs_server *s, const gen_req *g, gen_out *outs, int n_outs, double *prompt_ms, int fd,
                       srv_error *e) {
    if (n_outs > s->sched->cap)
        return srv_fail(e, 400, "kv_compression", "kv_compression: %d variants, but the server decodes at most %d "
                        "sequences together (--batch)", n_outs, s->sched->cap);
    srv_job *j = job_new();
    if (!j) return srv_fail(e, 500, "", "out of memory (or descriptors) for a job");
    j->g = g;
    j->outs = outs;
    j->n_outs = n_outs;
    if (job_submit(s, j, e)) {
        job_free(j);
        return -1;
    }
    job_wait(s, j, fd);
    int rc = j->rc;
    if (rc) *e = j->e;
    *prompt_ms = j->prompt_ms;
    job_free(j);
    return rc;
}

int srv_sched_exclusive(kvs_server *s, srv_exclusive_fn fn, void *user, int fd, srv_error *e) {
    srv_job *j = job_new();
    if (!j) return srv_fail(e, 500, "", "out of memory (or descriptors) for a job");
    j->fn = fn;
    j->user = user;
    if (job_submit(s, j, e)) {
        job_free(j);
        return -1;
    }
    job_wait(s, j, fd);
    int rc = j->rc;
    if (rc) *e = j->e;
    job_free(j);
    return rc;
}
