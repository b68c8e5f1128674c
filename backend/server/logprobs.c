/*
 * logprobs.c -- /v1/completions with echo, logprobs and several prompts, in
 * vLLM's shape (what lm-evaluation-harness's local-completions reads).
 *
 * What it is: the request parser (prompts as text, [text], [ids] or [[ids]];
 * logprobs N in [0, 20]; echo; max_tokens, default 16 as OpenAI's), the model
 * work run on the scheduler thread (srv_sched_exclusive, between decode
 * steps): per prompt, prefill the first token and decode the rest one by one
 * so every position's logits come from the engine's decode kernels, the
 * same path as the continuations; then greedy continuation. Log-probabilities
 * are log-softmax of those fp32 logits computed in double
 * (x - max - log(sum exp(x - max))), -inf clamped to -9999.0 as vLLM does;
 * the chosen token's value is computed once and written both in
 * token_logprobs and in its top_logprobs entry, so they are bit-identical.
 * kv_compression (one variant, the request's or the server's default) runs
 * each prompt through srv_chunked_prefill (chunked.c), which takes the same
 * per-position path and compresses after each chunk (without chunk: once,
 * after the prompt).
 * What it is not: sampling (temperature must be 0), stop strings, several
 * kv_compression variants, suffix or streaming with these options (each
 * refused with 400 naming the field); more than 64 prompts or LP_MAX_TOKENS tokens in all (400:
 * the request runs alone while the other requests' decoding waits); the plain single-prompt path (server_gen.c).
 */
#include "server_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LP_MAX_PROMPTS 64
#define LP_MAX_TOP 20
/* tokens (prompts + max_tokens) of one request at most: it runs alone on the
 * scheduler thread, so the other requests' decoding waits for it */
#define LP_MAX_TOKENS 32768
#define LP_FLOOR (-9999.0) /* vLLM's clamp of -inf */

typedef struct {
    int32_t *toks; /* [n_prompt + cap_gen]: the prompt, then what was generated */
    int n_prompt, n_gen;
    double *lp;    /* [n_prompt + cap_gen] log-prob of toks[i] given toks[0..i); lp[0] unused */
    int32_t *top;  /* [n_prompt + cap_gen][n_top] the top tokens at each position */
    double *top_lp;
    int eog;       /* generation ended on an end-of-generation token */
    int skip;      /* 1: BOS was prepended (--prepend-bos); not echoed */
    srv_chunk_log chunks; /* kv_compression: what each compression kept */
} lp_seq;

typedef struct {
    lp_seq *seqs;
    int n_seqs;
    int n_top;     /* logprobs N (-1: none asked) */
    int echo;
    int max_tokens;
    gen_req kc;    /* kv_compression (the request's or the server's default): at most one variant */
    int at;        /* the sequence score_run is on (for the per-position callback) */
    int V;         /* n_vocab */
} lp_req;

static void lp_req_free(lp_req *r) {
    srv_variants_free(&r->kc);
    for (int i = 0; i < r->n_seqs; i++) {
        srv_chunk_log_free(&r->seqs[i].chunks);
        free(r->seqs[i].toks);
        free(r->seqs[i].lp);
        free(r->seqs[i].top);
        free(r->seqs[i].top_lp);
    }
    free(r->seqs);
}

int srv_wants_scoring(const cJSON *root) {
    const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsTrue(echo) || (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp))) return 1;
    /* several prompts, or one as a list of token-id lists of length > 1 */
    return cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 &&
           (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
}

/* One prompt (text or a token-id array) into seq->toks. */
static int parse_one(kvs_server *s, const cJSON *p, const char *field, int add_bos, lp_seq *q, srv_error *e) {
    int32_t *t = NULL;
    int n = 0;
    if (cJSON_IsString(p)) {
        kvs_err err = {0};
        if (kvs_tokenize(s->model, p->valuestring, strlen(p->valuestring), add_bos, 1, &t, &n, &err) != KVS_OK)
            return srv_fail_kvs(e, &err, field);
    } else if (cJSON_IsArray(p)) {
        n = cJSON_GetArraySize(p);
        t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
        if (!t) return srv_fail(e, 500, "", "out of memory");
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, p) {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
                it->valuedouble >= s->info->n_vocab) {
                free(t);
                return srv_fail(e, 400, field, "%s[%d] must be a token id in [0, %d)", field, i, s->info->n_vocab);
            }
            t[i++] = (int32_t)it->valuedouble;
        }
        int added = srv_prepend_bos(s, &t, &n);
        if (added < 0) {
            free(t);
            return srv_fail(e, 500, "", "out of memory");
        }
        q->skip = added;
    } else {
        return srv_fail(e, 400, field, "%s must be a string or an array of token ids", field);
    }
    q->toks = t;
    q->n_prompt = n;
    return 0;
}

static int parse_scoring(kvs_server *s, const cJSON *root, lp_req *r, srv_error *e) {
    /* what this path does not do, refused rather than ignored */
    int stream;
    long long nn;
    double temp;
    if (srv_refuse_unsupported(root, 1, e) || srv_get_bool(root, "stream", "", 0, &stream, e) ||
        srv_get_int(root, "n", "", 1, 1, 1, &nn, e) || srv_get_double(root, "temperature", "", 0, 0, 1e6, &temp, e))
        return -1;
    if (stream) return srv_fail(e, 400, "stream", "stream: streaming responses are not supported");
    if (temp != 0)
        return srv_fail(e, 400, "temperature", "temperature: echo, logprobs and several prompts are served "
                        "greedily; send temperature 0");
    /* one variant; the prompt's log-probs see it only with chunk (positions after a chunk see its compression) */
    if (srv_parse_kv_compression(s, srv_kv_compression(s, root), &r->kc, e)) return -1;
    if (r->kc.n_variants > 1)
        return srv_fail(e, 400, "kv_compression", "kv_compression: one variant with echo, logprobs or several "
                        "prompts, got %d", r->kc.n_variants);
    if (r->kc.n_variants == 1 && r->kc.variants[0].n_suffix > 0)
        return srv_fail(e, 400, "kv_compression.suffix", "kv_compression.suffix is not supported with echo, "
                        "logprobs or several prompts");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (stop && !cJSON_IsNull(stop) && !(cJSON_IsArray(stop) && !stop->child))
        return srv_fail(e, 400, "stop", "stop strings are not supported with echo, logprobs or several prompts");
    int echo;
    if (srv_get_bool(root, "echo", "", 0, &echo, e)) return -1;
    r->echo = echo;
    const cJSON *lpj = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    r->n_top = -1;
    if (lpj && !cJSON_IsNull(lpj) && !cJSON_IsFalse(lpj)) {
        long long k;
        if (cJSON_IsTrue(lpj)) k = 0; /* a bare true (chat style): the chosen token only */
        else if (srv_get_int(root, "logprobs", "", 0, 0, LP_MAX_TOP, &k, e)) return -1;
        r->n_top = (int)k;
    }
    long long mt;
    if (srv_get_int(root, "max_tokens", "", 16, 0, s->cfg.n_predict_max, &mt, e)) return -1;
    r->max_tokens = (int)mt;
    if (!echo && mt == 0)
        return srv_fail(e, 400, "max_tokens", "max_tokens: 0 is only meaningful with echo: true");

    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p)) return srv_fail(e, 400, "prompt", "prompt is required");
    /* a list of prompts (texts or id lists), or one prompt (a text or an id list) */
    int list = cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
    int n = list ? cJSON_GetArraySize(p) : 1;
    if (n < 1) return srv_fail(e, 400, "prompt", "prompt is empty");
    if (n > LP_MAX_PROMPTS)
        return srv_fail(e, 400, "prompt", "prompt: %d prompts, at most %d per request", n, LP_MAX_PROMPTS);
    r->seqs = calloc((size_t)n, sizeof *r->seqs);
    if (!r->seqs) return srv_fail(e, 500, "", "out of memory");
    r->n_seqs = n;
    const int add_bos = kvs_model_special(s->model)->add_bos;
    const int cap_top = r->n_top > 0 ? r->n_top : 1;
    long long total = 0;
    for (int i = 0; i < n; i++) {
        char f[48];
        snprintf(f, sizeof f, list ? "prompt[%d]" : "prompt", i);
        lp_seq *q = &r->seqs[i];
        if (parse_one(s, list ? cJSON_GetArrayItem(p, i) : p, f, add_bos, q, e)) return -1;
        if (q->n_prompt < 1) return srv_fail(e, 400, f, "%s is empty (no tokens)", f);
        if (q->n_prompt + r->max_tokens > s->cfg.n_ctx)
            return srv_fail(e, 400, f, "%s: %d tokens + max_tokens %d exceed the context of %d; it is not truncated",
                            f, q->n_prompt, r->max_tokens, s->cfg.n_ctx);
        total += q->n_prompt + r->max_tokens;
        if (total > LP_MAX_TOKENS)
            return srv_fail(e, 400, "prompt", "prompt: the prompts and max_tokens add up to more than %d tokens "
                            "in one request (they run alone, between the other requests' decode steps); "
                            "split the request", LP_MAX_TOKENS);
        size_t cap = (size_t)q->n_prompt + (size_t)r->max_tokens;
        int32_t *nt = realloc(q->toks, cap * sizeof *nt);
        if (nt) q->toks = nt;
        q->lp = calloc(cap, sizeof *q->lp);
        q->top = calloc(cap * (size_t)cap_top, sizeof *q->top);
        q->top_lp = calloc(cap * (size_t)cap_top, sizeof *q->top_lp);
        if (!nt || !q->lp || !q->top || !q->top_lp) return srv_fail(e, 500, "", "out of memory");
    }
    return 0;
}

static double clamp_lp(double v) { return v < LP_FLOOR ? LP_FLOOR : v; }

/* The log-softmax normaliser of logits[V] in double: max + log(sum exp(x - max)). */
static double log_norm(const float *x, int V) {
    double m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (x[i] > m) m = x[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - m);
    return m + log(sum);
}

/* The k largest logits (ties: the lower id first) into top[k]. */
static void top_k(const float *x, int V, int k, int32_t *top) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == k && !(x[i] > x[top[k - 1]])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && x[i] > x[top[j - 1]]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = i;
    }
}

/* Position i's logits (predicting toks[i]) into the sequence's record. */
static void record(const lp_req *r, lp_seq *q, int i, const float *logits, int V) {
    const double z = log_norm(logits, V);
    q->lp[i] = clamp_lp((double)logits[q->toks[i]] - z);
    if (r->n_top > 0) {
        int32_t *t = q->top + (size_t)i * r->n_top;
        top_k(logits, V, r->n_top, t);
        for (int j = 0; j < r->n_top; j++)
            q->top_lp[(size_t)i * r->n_top + j] = t[j] == q->toks[i] ? q->lp[i] : clamp_lp((double)logits[t[j]] - z);
    }
}

/* srv_chunked_prefill's per-position callback: the logits predicting toks[i]. */
static void record_at(void *user, int i, const float *logits) {
    lp_req *r = user;
    lp_seq *q = &r->seqs[r->at];
    if (r->echo) record(r, q, i, logits, r->V);
}

static int score_run(kvs_server *s, void *user, srv_error *e) {
    lp_req *r = user;
    kvs_err err = {0};
    const int V = s->info->n_vocab;
    kvs_session_opts so;
    memset(&so, 0, sizeof so);
    so.n_ctx = s->cfg.n_ctx;
    so.n_threads = s->cfg.threads;
    so.cache_type = s->cfg.cache_type;
    so.cache_type_v = s->cfg.cache_type_v;
    kvs_session *ses = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits) return srv_fail(e, 500, "", "out of memory");
    if (kvs_session_new(s->model, &so, &ses, &err) != KVS_OK) {
        free(logits);
        return srv_fail(e, 500, "", "cannot create a session: %s", err.msg);
    }
    int rc = 0;
    r->V = V;
    /* a compression other than full: srv_chunked_prefill (chunk 0: one compression after the prompt) */
    const variant_req *v = r->kc.n_variants == 1 && r->kc.variants[0].method &&
                                   strcmp(r->kc.variants[0].method->name, "full") != 0
                               ? &r->kc.variants[0]
                               : NULL;
    for (int k = 0; k < r->n_seqs && !rc; k++) {
        lp_seq *q = &r->seqs[k];
        kvs_session_reset(ses);
        double t0 = kvs_now_ms();
        if (v) { /* compressed after each chunk (or once after the prompt); the same per-position path */
            r->at = k;
            if (srv_chunked_prefill(s, ses, v, q->toks, q->n_prompt, record_at, r, logits, &q->chunks, &err) != KVS_OK) {
                rc = srv_fail_kvs(e, &err, v->field);
                break;
            }
            srv_note_compress(s, q->chunks.compress_ms);
        } else {
            if (kvs_session_prefill(ses, q->toks, 1, NULL, logits, &err) != KVS_OK) {
                rc = srv_fail_kvs(e, &err, "prompt");
                break;
            }
            /* every prompt position through the decode kernels: logits of position i predict token i + 1 */
            for (int i = 1; i < q->n_prompt && !rc; i++) {
                if (r->echo) record(r, q, i, logits, V);
                if (kvs_session_decode(ses, q->toks[i], logits, &err) != KVS_OK) rc = srv_fail_kvs(e, &err, "prompt");
            }
        }
        if (rc) break;
        srv_note_prefill(s, q->n_prompt, kvs_now_ms() - t0);
        t0 = kvs_now_ms();
        for (int g = 0; g < r->max_tokens; g++) {
            const int pos = q->n_prompt + g;
            const int32_t best = kvs_argmax(logits, V);
            if (best < 0) { /* a NaN logit */
                rc = srv_fail(e, 500, "", "the model produced a NaN logit (prompt %d, token %d)", k, g);
                break;
            }
            q->toks[pos] = best;
            record(r, q, pos, logits, V);
            q->n_gen++;
            if (kvs_token_is_eog(s->model, q->toks[pos])) {
                q->eog = 1;
                break;
            }
            if (g + 1 < r->max_tokens && kvs_session_decode(ses, q->toks[pos], logits, &err) != KVS_OK) {
                rc = srv_fail_kvs(e, &err, "max_tokens");
                break;
            }
        }
        srv_note_predict(s, q->n_gen, kvs_now_ms() - t0);
    }
    kvs_session_free(ses);
    free(logits);
    return rc;
}

/* A token's text as a JSON key / list entry (control tokens rendered, invalid
 * UTF-8 replaced by U+FFFD); malloc'd. */
static char *piece_text(const kvs_model *m, int32_t tok) {
    char buf[256];
    int len = kvs_token_to_piece(m, tok, 1, buf, (int)sizeof buf - 1);
    if (len < 0 || len > (int)sizeof buf - 1) len = 0;
    return srv_utf8_clean(buf, (size_t)len);
}

/* A log-prob as JSON text with 17 significant digits: it reads back as the
 * same double (cJSON's own printing may drop the last bit), so the chosen
 * token's value in token_logprobs and top_logprobs, and a client's
 * recomputation, compare exactly. */
static cJSON *lp_number(double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

static size_t utf8_chars(const char *t) {
    size_t n = 0;
    for (; *t; t++) n += ((unsigned char)*t & 0xC0) != 0x80;
    return n;
}

/* One top_logprobs entry: {text: logprob}; a text two tokens share keeps the
 * larger value (a dict cannot hold both; the greedy test must stay honest). */
static void top_put(cJSON *o, const char *key, double v, double *vals, int *n_vals) {
    int at = 0;
    for (cJSON *it = o->child; it; it = it->next, at++)
        if (!strcmp(it->string, key)) {
            if (v > vals[at]) {
                vals[at] = v;
                cJSON_ReplaceItemInObjectCaseSensitive(o, key, lp_number(v));
            }
            return;
        }
    vals[(*n_vals)++] = v;
    cJSON_AddItemToObject(o, key, lp_number(v));
}

static cJSON *choice_json(kvs_server *s, const lp_req *r, const lp_seq *q, int index, srv_error *e) {
    kvs_err err = {0};
    const int first = r->echo ? q->skip : q->n_prompt, end = q->n_prompt + q->n_gen;
    char *text = NULL, *clean = NULL;
    int n_text = end - first - (q->eog ? 1 : 0); /* the end-of-generation token is not text */
    if (kvs_detokenize(s->model, q->toks + first, n_text, 0, &text, &err) != KVS_OK) {
        srv_fail_kvs(e, &err, "prompt");
        return NULL;
    }
    clean = srv_utf8_clean(text, strlen(text));
    free(text);
    if (!clean) {
        srv_fail(e, 500, "", "out of memory");
        return NULL;
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddStringToObject(c, "text", clean);
    free(clean);
    if (r->n_top < 0) {
        cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON *lo = cJSON_AddObjectToObject(c, "logprobs");
        cJSON *toks = cJSON_AddArrayToObject(lo, "tokens");
        cJSON *tlp = cJSON_AddArrayToObject(lo, "token_logprobs");
        cJSON *top = cJSON_AddArrayToObject(lo, "top_logprobs");
        cJSON *off = cJSON_AddArrayToObject(lo, "text_offset");
        size_t at = 0;
        for (int i = first; i < end; i++) {
            char *p = piece_text(s->model, q->toks[i]);
            if (!p) {
                cJSON_Delete(c);
                srv_fail(e, 500, "", "out of memory");
                return NULL;
            }
            cJSON_AddItemToArray(toks, cJSON_CreateString(p));
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
            at += utf8_chars(p);
            if (i == 0) { /* nothing predicts the first prompt token */
                cJSON_AddItemToArray(tlp, cJSON_CreateNull());
                cJSON_AddItemToArray(top, cJSON_CreateNull());
                free(p);
                continue;
            }
            cJSON_AddItemToArray(tlp, lp_number(q->lp[i]));
            cJSON *d = cJSON_CreateObject();
            double vals[LP_MAX_TOP + 1]; /* the values in d, in order (raw items hold text) */
            int n_vals = 0;
            top_put(d, p, q->lp[i], vals, &n_vals);
            free(p);
            for (int j = 0; j < r->n_top; j++) {
                char *tp = piece_text(s->model, q->top[(size_t)i * r->n_top + j]);
                if (tp) top_put(d, tp, q->top_lp[(size_t)i * r->n_top + j], vals, &n_vals);
                free(tp);
            }
            cJSON_AddItemToArray(top, d);
        }
    }
    cJSON_AddStringToObject(c, "finish_reason", q->eog ? "stop" : "length");
    if (r->kc.n_variants == 1) { /* ours: the compression this prompt ran under */
        const variant_req *v = &r->kc.variants[0];
        cJSON *kv = cJSON_AddObjectToObject(c, "kv");
        cJSON_AddStringToObject(kv, "method", v->method ? v->method->name : "none");
        if (v->budget.tokens) cJSON_AddNumberToObject(kv, "tokens", (double)v->budget.tokens);
        else cJSON_AddNumberToObject(kv, "ratio", v->budget.ratio);
        cJSON_AddNumberToObject(kv, "chunk", v->chunk);
        cJSON_AddNumberToObject(kv, "compress_ms", q->chunks.compress_ms);
        cJSON *ch = cJSON_AddArrayToObject(kv, "chunks");
        for (int i = 0; i < q->chunks.n; i++) {
            const int *row = q->chunks.rows + (size_t)i * 3;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "seen", row[0]);
            cJSON_AddNumberToObject(o, "rows_before", row[1]);
            cJSON_AddNumberToObject(o, "rows_after", row[2]);
            cJSON_AddItemToArray(ch, o);
        }
    }
    return c;
}

/* Parse, run (on the scheduler thread, or on this one when rq is NULL), answer. */
static void handle(kvs_server *s, const cJSON *root, const kvs_http_request *rq, kvs_http_response *rs) {
    srv_error e = {0};
    lp_req r;
    memset(&r, 0, sizeof r);
    cJSON *out = NULL;
    if (parse_scoring(s, root, &r, &e)) goto fail;
    if (rq ? srv_sched_exclusive(s, score_run, &r, rq->fd, &e) : score_run(s, &r, &e)) {
        if (e.status == 0) {
            rs->status = 0;
            lp_req_free(&r);
            return;
        }
        goto fail;
    }
    out = cJSON_CreateObject();
    char idbuf[64];
    snprintf(idbuf, sizeof idbuf, "cmpl-%llu", (unsigned long long)srv_next_id(s));
    cJSON_AddStringToObject(out, "id", idbuf);
    cJSON_AddStringToObject(out, "object", "text_completion");
    cJSON_AddNumberToObject(out, "created", (double)time(NULL));
    cJSON_AddStringToObject(out, "model", s->alias);
    cJSON *choices = cJSON_AddArrayToObject(out, "choices");
    long long n_prompt = 0, n_gen = 0;
    for (int i = 0; i < r.n_seqs; i++) {
        cJSON *c = choice_json(s, &r, &r.seqs[i], i, &e);
        if (!c) goto fail;
        cJSON_AddItemToArray(choices, c);
        n_prompt += r.seqs[i].n_prompt - r.seqs[i].skip;
        n_gen += r.seqs[i].n_gen;
    }
    cJSON *u = cJSON_AddObjectToObject(out, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + n_gen));
    cJSON_AddStringToObject(out, "system_fingerprint", "kvsieve-" KVS_VERSION);
    lp_req_free(&r);
    srv_json_response(rs, 200, out);
    return;
fail:
    cJSON_Delete(out);
    lp_req_free(&r);
    srv_error_response(rs, &e);
}

void srv_handle_scoring(kvs_server *s, const cJSON *root, const kvs_http_request *rq, kvs_http_response *rs) {
    handle(s, root, rq, rs);
}

void srv_handle_scoring_inline(kvs_server *s, const cJSON *root, kvs_http_response *rs) {
    handle(s, root, NULL, rs);
}
